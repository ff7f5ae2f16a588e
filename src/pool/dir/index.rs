//! A dir pool's in-memory index of its records and the space and project ids
//! they and creates in flight hold.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use super::super::Volume;
use super::record::Entry;
use super::{project_candidates, PROJECT_TRIES};
use crate::ids::{PoolName, VolumeId, VolumeKey};

pub(super) struct State {
    pub(super) volumes: Index,
    /// Space (and a project id) promised to creates and expansions that are
    /// still writing.
    pub(super) reserved: HashMap<VolumeKey, (u64, Option<u32>)>,
    /// Ids found carrying usage that no record explains: never picked.
    pub(super) foreign_projects: HashSet<u32>,
    /// Retired record files in the spare directory, free for reuse.
    pub(super) spares: Vec<PathBuf>,
}

/// The records, as loaded at start and changed only after a record write
/// succeeded (under the volume's lock): by key, so in id order, which is what
/// ListVolumes pages through; with the figures a create needs (space
/// promised, project ids taken) kept as volumes come and go instead of
/// summed over every volume on each request.
///
/// Each record is kept without what its key and the pool already say (its
/// id and pool name), and its key inline: a node may hold 10,000 volumes,
/// and every byte per volume is 10 kB of the driver's memory. [`Volume`]s
/// are made from it when asked for (`record.rs`).
pub(super) struct Index {
    pub(super) pool: PoolName,
    pub(super) by_key: BTreeMap<KeyBytes, Entry>,
    pub(super) allocated: u64,
    /// How many records name each project id.
    pub(super) projects: HashMap<u32, u32>,
}

/// A key's 32 hex digits: orders exactly as the key's text (and the id's,
/// within a pool).
pub(super) type KeyBytes = [u8; 32];

pub(super) fn key_bytes(key: &VolumeKey) -> KeyBytes {
    let mut k = [0u8; 32];
    k.copy_from_slice(key.as_str().as_bytes());
    k
}

/// The key whose digits `k` holds (every key of the index came from one,
/// [`key_bytes`]).
fn key_of(k: &KeyBytes) -> VolumeKey {
    std::str::from_utf8(k)
        .ok()
        .and_then(VolumeKey::parse)
        .expect("the index's keys are volume keys")
}

impl Index {
    pub(super) fn new(pool: PoolName) -> Index {
        Index {
            pool,
            by_key: BTreeMap::new(),
            allocated: 0,
            projects: HashMap::new(),
        }
    }

    /// The volume a record describes: its id is `<pool>.<key>`.
    pub(super) fn volume(&self, key: &KeyBytes, e: &Entry) -> Volume {
        e.volume(VolumeId {
            pool: self.pool.clone(),
            key: key_of(key),
        })
    }

    pub(super) fn get(&self, key: &VolumeKey) -> Option<Volume> {
        let k = key_bytes(key);
        self.by_key.get(&k).map(|e| self.volume(&k, e))
    }

    /// The record of `key`, as the index holds it.
    pub(super) fn entry(&self, key: &VolumeKey) -> Option<&Entry> {
        self.by_key.get(&key_bytes(key))
    }

    pub(super) fn len(&self) -> usize {
        self.by_key.len()
    }

    pub(super) fn volumes(&self) -> impl Iterator<Item = Volume> + '_ {
        self.by_key.iter().map(|(k, e)| self.volume(k, e))
    }

    /// (project, size) of every volume with a project id.
    pub(super) fn projects(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.by_key
            .values()
            .filter_map(|e| e.project_id.map(|p| (p, e.size_bytes)))
    }

    pub(super) fn insert(&mut self, key: &VolumeKey, e: Entry) {
        self.account(&e, true);
        if let Some(old) = self.by_key.insert(key_bytes(key), e) {
            self.account(&old, false);
        }
    }

    pub(super) fn remove(&mut self, key: &VolumeKey) {
        if let Some(old) = self.by_key.remove(&key_bytes(key)) {
            self.account(&old, false);
        }
    }

    pub(super) fn account(&mut self, e: &Entry, add: bool) {
        if add {
            self.allocated = self.allocated.saturating_add(e.size_bytes);
        } else {
            self.allocated = self.allocated.saturating_sub(e.size_bytes);
        }
        if let Some(p) = e.project_id {
            let n = self.projects.entry(p).or_default();
            *n = if add { *n + 1 } else { n.saturating_sub(1) };
            if *n == 0 {
                self.projects.remove(&p);
            }
        }
    }

    /// Volumes whose id (`<pool>.<key>`, so key order) is `from` or after it,
    /// in id order, at most `max`.
    pub(super) fn page(&self, from: &str, max: usize) -> Vec<Volume> {
        use std::ops::Bound;
        let prefix = format!("{}.", self.pool);
        let range = if from <= prefix.as_str() {
            self.by_key.range::<KeyBytes, _>(..)
        } else if let Some(rest) = from.strip_prefix(prefix.as_str()) {
            // Keys are 32 bytes, none of them 0: `rest` padded with zeros is
            // the least key at or after it; a longer `rest` is after the key
            // its first 32 bytes make.
            let mut k = [0u8; 32];
            let n = rest.len().min(32);
            k[..n].copy_from_slice(&rest.as_bytes()[..n]);
            match rest.len() > 32 {
                true => self.by_key.range((Bound::Excluded(k), Bound::Unbounded)),
                false => self.by_key.range(k..),
            }
        } else {
            // After `<pool>.` and not starting with it: after every id here.
            return Vec::new();
        };
        range.take(max).map(|(k, e)| self.volume(k, e)).collect()
    }
}

impl State {
    pub(super) fn new(volumes: Index) -> State {
        State {
            volumes,
            reserved: HashMap::new(),
            foreign_projects: HashSet::new(),
            spares: Vec::new(),
        }
    }

    pub(super) fn allocated(&self) -> u64 {
        self.volumes.allocated + self.reserved.values().map(|r| r.0).sum::<u64>()
    }

    pub(super) fn project_in_use(&self, id: u32) -> bool {
        self.foreign_projects.contains(&id)
            || self.volumes.projects.contains_key(&id)
            || self.reserved.values().any(|r| r.1 == Some(id))
    }

    /// The first free id of the volume's own sequence.
    pub(super) fn pick_project(&self, key: &VolumeKey) -> Option<u32> {
        project_candidates(key)
            .take(PROJECT_TRIES * 4)
            .find(|id| !self.project_in_use(*id))
    }

    /// (project, size) of every volume whose unused quota must stay free.
    pub(super) fn projects(&self) -> Vec<(u32, u64)> {
        self.volumes.projects().collect()
    }
}
