//! Directory pools: a volume is a directory under `<path>/volumes/`, its record
//! a JSON file beside it (`<key>/` and `<key>.json`).
//!
//! With project quotas (see `quota.rs`) each volume directory gets its own
//! project id, recorded in its record, and a hard limit equal to its size. Ids
//! are picked from a deterministic sequence per volume, skipping ids that other
//! records use or that already carry usage on the filesystem; delete releases
//! the id by clearing its limits.
//!
//! The records on disk are the truth. The in-memory index is rebuilt from them
//! at start and changed only after the matching record write has succeeded.
//! Creation writes the directory first and the record last, so the record is the
//! commit point: a directory without a record is an interrupted create, which a
//! retried create completes and a delete removes.
//!
//! Delete removes the data first and the record last. The record is not
//! unlinked but renamed into `<path>/deleted/` (and the rename made durable):
//! unlinking a synced file frees its block, which on a filesystem mounted
//! `discard` is a synchronous discard that costs milliseconds and stalls other
//! fsyncs. A later create rewrites such a retired file in place as its temp
//! file ([`fsutil::write_atomic_reusing`]), so steady create/delete churn
//! allocates and frees no blocks at all. `deleted/` is never read for records:
//! a file there is not a volume. Start-up removes the retired records a
//! previous run left in it, and retired files beyond [`MAX_SPARES`] are
//! unlinked in the background. A crash between the data removal and the
//! durable rename leaves a record without data, which a retried delete
//! finishes, as before.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{
    AccessType, Backend, Capacity, CapacityRange, CreateRequest, Expanded, Health, NodeSide, Pool,
    PoolError, Result, Source, Unusable, Usage, Volume,
};
use crate::config::{DirPoolConfig, QuotaMode, DEFAULT_VOLUME_SIZE};
use crate::error::{blocking, IoContext};
use crate::fsutil::{self, FsStats};
use crate::ids::{PoolName, StorageId, VolumeId, VolumeKey};
use crate::mount::MountTable;
use crate::quota::Quotas;

mod index;
mod record;
mod records;

use index::State;
use record::Entry;
#[cfg(test)]
use records::POOL_ID_FILE;
use records::{
    apply_recorded_limits, load_records, now_unix, open_spare_dir, prepare_dir, storage_id,
    Prepared,
};

/// Why a dir pool that enforces no quotas (`why`) refuses an inode limit.
pub(super) fn no_inode_limit(pool: &PoolName, why: &str) -> String {
    format!("pool {pool} does not enforce quotas ({why}); inodeLimit cannot be honoured")
}
/// Volume sizes are rounded up to whole 4 KiB blocks.
const BLOCK: u64 = 4096;
/// Project ids localvol picks from: high enough to stay clear of ids an
/// administrator assigns by hand.
const PROJECT_MIN: u32 = 1_000_000;
const PROJECT_SPAN: u32 = 1 << 30;
/// How many ids a create tries before it gives up.
const PROJECT_TRIES: usize = 64;
/// Where retired records go, beside `volumes/`.
const SPARE_DIR: &str = "deleted";
/// Retired records kept for reuse; more are unlinked.
const MAX_SPARES: usize = 64;

pub struct DirPool {
    name: PoolName,
    root: PathBuf,
    volumes_dir: PathBuf,
    reserve: u64,
    cap: Option<u64>,
    default_size: u64,
    /// Set when the filesystem enforces project quotas and the config allows it.
    quotas: Option<Arc<Quotas>>,
    /// Why sizes are not enforced (quota: auto on a filesystem without quotas).
    unenforced_reason: Option<String>,
    state: Arc<Mutex<State>>,
    /// (device, inode) of `volumes/` when the pool opened it: the health
    /// check tells the directory the records came from from another one at
    /// the same path (the pool's filesystem unmounted, the tree replaced).
    volumes_identity: (u64, u64),
    /// What this pool's storage is (`dir:<id>` from [`records::POOL_ID_FILE`]).
    storage: StorageId,
    /// `<path>/deleted`, when it is on the same filesystem as `volumes/`;
    /// without it records are unlinked.
    spare_dir: Option<PathBuf>,
}

/// The health of a dir pool whose `volumes/` directory was `opened` (device,
/// inode) at start: still there, a directory, the same one, writable, and
/// its filesystem answers statvfs.
fn dir_health(dir: &Path, opened: (u64, u64)) -> Health {
    let unusable = |u| Health::Unusable(u);
    let md = match fs::metadata(dir) {
        Ok(md) => md,
        Err(e) => {
            return unusable(Unusable::Unreadable {
                path: dir.to_owned(),
                why: e.to_string(),
            })
        }
    };
    if !md.is_dir() {
        return unusable(Unusable::NotADirectory {
            path: dir.to_owned(),
        });
    }
    if (md.dev(), md.ino()) != opened {
        return unusable(Unusable::Replaced {
            path: dir.to_owned(),
        });
    }
    if let Err(e) = nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK) {
        return unusable(Unusable::NotWritable {
            path: dir.to_owned(),
            why: e.desc().to_owned(),
        });
    }
    match fsutil::fs_stats(dir) {
        Ok(_) => Health::Ready,
        Err(e) => unusable(Unusable::CheckFailed(e.to_string())),
    }
}

/// The volume's deterministic sequence of candidate project ids.
fn project_candidates(key: &VolumeKey) -> impl Iterator<Item = u32> {
    let start = u32::from_str_radix(&key.as_str()[..8], 16).unwrap_or(0) % PROJECT_SPAN;
    (0..PROJECT_SPAN).map(move |i| PROJECT_MIN + (start + i) % PROJECT_SPAN)
}

/// Filesystem figures plus the space promised to volumes but not yet used.
struct Space {
    fs: FsStats,
    unused_quota: u64,
}

impl DirPool {
    pub async fn open(cfg: DirPoolConfig) -> Result<Self> {
        let DirPoolConfig {
            name,
            path,
            reserve,
            capacity,
            default_size,
            quota,
            // Mounted at `path` by `disks::prepare_dir` before this runs.
            device: _,
            // Checked before this runs (`disks::check_mount_point`).
            require_mount_point: _,
        } = cfg;
        let pool_name = name.clone();
        let (root, volumes, quotas, unenforced_reason, spare_dir, ident, storage) =
            blocking(move || {
                fs::create_dir_all(&path).ctx(|| format!("pool {pool_name}: creating {path:?}"))?;
                let root = fs::canonicalize(&path)
                    .ctx(|| format!("pool {pool_name}: resolving {path:?}"))?;
                let storage = storage_id(&pool_name, &root)?;
                let volumes_dir = root.join("volumes");
                fsutil::ensure_dir(&volumes_dir, 0o700)?;
                let md = fs::metadata(&volumes_dir)
                    .ctx(|| format!("pool {pool_name}: reading {volumes_dir:?}"))?;
                let identity = (md.dev(), md.ino());
                let volumes = load_records(&pool_name, &volumes_dir)?;
                let spare_dir = open_spare_dir(&pool_name, &root.join(SPARE_DIR), &volumes_dir)?;
                let (quotas, reason) = match quota {
                    QuotaMode::Off => (None, Some("quota: off".to_owned())),
                    QuotaMode::Auto | QuotaMode::Required => match Quotas::open(&volumes_dir) {
                        Ok(q) => (Some(Arc::new(q)), None),
                        Err(e) if quota == QuotaMode::Required => {
                            return Err(PoolError::Misconfigured {
                                pool: pool_name.to_string(),
                                why: format!("quota: required, but {e}"),
                            })
                        }
                        Err(e) => (None, Some(e.to_string())),
                    },
                };
                if let Some(q) = &quotas {
                    apply_recorded_limits(&pool_name, q, &volumes)?;
                }
                Ok((root, volumes, quotas, reason, spare_dir, identity, storage))
            })
            .await?;
        match &unenforced_reason {
            None => tracing::info!(pool = %name, root = ?root, volumes = volumes.len(),
                "dir pool loaded; sizes enforced by project quotas"),
            Some(why) => tracing::warn!(pool = %name, root = ?root, volumes = volumes.len(),
                reason = %why, "dir pool loaded; volume sizes are NOT enforced"),
        }
        Ok(DirPool {
            name,
            volumes_dir: root.join("volumes"),
            root,
            reserve: reserve.0,
            cap: capacity.map(|c| c.0),
            default_size: default_size.map_or(DEFAULT_VOLUME_SIZE, |d| d.0),
            quotas,
            unenforced_reason,
            state: Arc::new(Mutex::new(State::new(volumes))),
            volumes_identity: ident,
            spare_dir,
            storage,
        })
    }

    /// Why sizes are not enforced, or None when project quotas enforce them.
    #[cfg(test)]
    fn unenforced_reason(&self) -> Option<&str> {
        self.unenforced_reason.as_deref()
    }

    fn data_dir(&self, key: &VolumeKey) -> PathBuf {
        self.volumes_dir.join(key.as_str())
    }

    fn record_path(&self, key: &VolumeKey) -> PathBuf {
        self.volumes_dir.join(format!("{key}.json"))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("pool state lock poisoned")
    }

    /// The most this pool could ever hold, and what is free for new volumes now:
    /// the smaller of "configured size minus what volumes were promised" and
    /// "free space minus the unused part of every quota", both less the reserve.
    fn limits(&self, space: &Space, allocated: u64) -> (u64, u64) {
        let fs = &space.fs;
        let total = self
            .cap
            .map_or(fs.total_bytes, |c| c.min(fs.total_bytes))
            .saturating_sub(self.reserve);
        let by_allocation = total.saturating_sub(allocated);
        let by_free_space = fs
            .available_bytes
            .saturating_sub(self.reserve)
            .saturating_sub(space.unused_quota);
        (total, by_allocation.min(by_free_space))
    }

    async fn space(&self) -> Result<Space> {
        let root = self.root.clone();
        let quotas = self.quotas.clone();
        let projects = if quotas.is_some() {
            self.state().projects()
        } else {
            Vec::new()
        };
        blocking(move || {
            let fs = fsutil::fs_stats(&root)?;
            let mut unused_quota = 0u64;
            if let Some(q) = quotas {
                for (project, size) in projects {
                    let used = q.get(project)?.used_bytes;
                    unused_quota = unused_quota.saturating_add(size.saturating_sub(used));
                }
            }
            Ok(Space { fs, unused_quota })
        })
        .await
    }

    /// Picks the size for a request: the required size (or the pool's default)
    /// rounded up to whole blocks, never above the limit.
    fn size_for(&self, range: CapacityRange) -> Result<u64> {
        let want = if range.required > 0 {
            range.required
        } else if range.limit > 0 {
            self.default_size.min(range.limit)
        } else {
            self.default_size
        };
        let rounded = want.div_ceil(BLOCK).saturating_mul(BLOCK);
        Ok(if range.limit > 0 && rounded > range.limit {
            want
        } else {
            rounded
        })
    }

    /// Promises `bytes` to `key` if the pool has them; the caller must release
    /// the reservation.
    fn reserve_space(
        &self,
        key: &VolumeKey,
        bytes: u64,
        space: &Space,
        what: &str,
    ) -> Result<Option<u32>> {
        let mut st = self.state();
        let (total, free) = self.limits(space, st.allocated());
        if bytes > total {
            return Err(PoolError::TooLarge {
                what: what.to_owned(),
                bytes,
                pool: self.name.clone(),
                total,
            });
        }
        if bytes > free {
            return Err(PoolError::NoSpace {
                what: what.to_owned(),
                bytes,
                pool: self.name.clone(),
                free,
            });
        }
        let project = match &self.quotas {
            Some(_) => Some(st.pick_project(key).ok_or_else(|| PoolError::NoProjectId {
                what: what.to_owned(),
            })?),
            None => None,
        };
        st.reserved.insert(key.clone(), (bytes, project));
        Ok(project)
    }
}

#[async_trait]
impl Pool for DirPool {
    fn name(&self) -> &PoolName {
        &self.name
    }

    fn backend(&self) -> Backend {
        Backend::Dir
    }

    fn storage_id(&self) -> Option<&StorageId> {
        Some(&self.storage)
    }

    fn supports(&self, access: AccessType) -> bool {
        access == AccessType::Mount
    }

    fn inode_limit_refused(&self) -> Option<String> {
        self.quotas.is_none().then(|| {
            no_inode_limit(
                &self.name,
                self.unenforced_reason
                    .as_deref()
                    .unwrap_or("no quota support"),
            )
        })
    }

    async fn health(&self) -> Health {
        let dir = self.volumes_dir.clone();
        let opened = self.volumes_identity;
        blocking(move || Ok::<_, PoolError>(dir_health(&dir, opened)))
            .await
            .unwrap_or_else(|e| Health::Unusable(Unusable::CheckFailed(e.to_string())))
    }

    async fn create(&self, req: &CreateRequest) -> Result<Volume> {
        if req.encryption.is_some() {
            return Err(PoolError::UnsupportedParameter(format!(
                "encryption applies to LVM pools; pool {} is a directory pool",
                self.name
            )));
        }
        let key = req.id.key.clone();
        let existing = self.state().volumes.get(&key);
        if let Some(existing) = existing {
            return super::matches_request(existing, req, true);
        }
        if let Some(why) = req.inode_limit.and_then(|_| self.inode_limit_refused()) {
            return Err(PoolError::UnsupportedParameter(why));
        }
        let size = self.size_for(req.range)?;
        let what = format!("volume {}", req.name.as_str());
        let data = self.data_dir(&key);
        let record = self.record_path(&key);
        for _ in 0..PROJECT_TRIES {
            let space = self.space().await?;
            let candidate = self.reserve_space(&key, size, &space, &what)?;
            let entry = Entry::new(req, size, candidate, now_unix());
            let (d, q, state) = (data.clone(), self.quotas.clone(), self.state.clone());
            let (record, rec) = (record.clone(), entry.record(&req.id));
            let inodes = req.inode_limit.unwrap_or(0);
            // The directory (and its quota) first, the record last: one trip
            // to the blocking pool for both.
            let prepared = blocking(move || {
                let prepared = prepare_dir(&d, q.as_deref(), candidate, size, inodes)?;
                if let Prepared::Done = prepared {
                    let json = serde_json::to_vec_pretty(&rec)?;
                    let spare = state.lock().expect("pool state lock poisoned").spares.pop();
                    match spare {
                        Some(spare) => fsutil::write_atomic_reusing(&record, &json, &spare)?,
                        None => fsutil::write_atomic(&record, &json)?,
                    }
                }
                Ok(prepared)
            })
            .await;
            match prepared {
                Ok(Prepared::Done) => {
                    let vol = entry.volume(req.id.clone());
                    let mut st = self.state();
                    st.reserved.remove(&key);
                    st.volumes.insert(&key, entry);
                    return Ok(vol);
                }
                Ok(Prepared::ProjectBusy(p)) => {
                    tracing::warn!(pool = %self.name, project = p, "project id already in use on the filesystem; skipping it");
                    let mut st = self.state();
                    st.reserved.remove(&key);
                    st.foreign_projects.insert(p);
                }
                Err(e) => {
                    self.state().reserved.remove(&key);
                    return Err(e);
                }
            }
        }
        self.state().reserved.remove(&key);
        Err(PoolError::NoProjectId { what })
    }

    async fn delete(&self, id: &VolumeId) -> Result<()> {
        let key = id.key.clone();
        let (data, record) = (self.data_dir(&key), self.record_path(&key));
        let what = id.to_string();
        let project = self.state().volumes.get(&key).and_then(|v| v.project_id);
        let quotas = self.quotas.clone();
        let spare_dir = self.spare_dir.clone();
        let retired = blocking(move || {
            let table = MountTable::read()?;
            if let Some(loc) = table.locate(&data) {
                if let Some(m) = table.mounts_of(&loc).next() {
                    return Err(PoolError::InUse {
                        volume: what,
                        why: format!(
                            "is still mounted at {:?}; unpublish and unstage it first",
                            m.mount_point
                        ),
                    });
                }
            }
            if let Some(m) = table.mounts_below(&data).next() {
                return Err(PoolError::InUse {
                    volume: what,
                    why: format!("has a mount inside it at {:?}; not deleting", m.mount_point),
                });
            }
            fsutil::remove_tree(&data)?;
            // Release the id: no limits and (the tree is gone) no usage.
            if let (Some(q), Some(p)) = (&quotas, project) {
                q.set_limits(p, 0, 0)?;
            }
            // The record goes last, durably: retired (renamed away), or removed.
            Ok(match spare_dir {
                Some(to) => fsutil::retire_file(&record, &to)?,
                None => fsutil::remove_file_durable(&record).map(|()| None)?,
            })
        })
        .await?;
        let excess = {
            let mut st = self.state();
            st.volumes.remove(&key);
            match retired {
                Some(file) if st.spares.len() < MAX_SPARES => {
                    st.spares.push(file);
                    None
                }
                other => other,
            }
        };
        if let Some(file) = excess {
            // Off the RPC's path; a leftover is removed at the next start.
            tokio::spawn(blocking(move || {
                let _ = fs::remove_file(file);
                Ok::<_, PoolError>(())
            }));
        }
        Ok(())
    }

    async fn expand(&self, id: &VolumeId, range: CapacityRange) -> Result<Expanded> {
        let key = id.key.clone();
        let current = (self.state().volumes.entry(&key).cloned())
            .ok_or_else(|| PoolError::VolumeNotFound(id.to_string()))?;
        let new_size = self.size_for(CapacityRange {
            required: range.required,
            limit: range.limit,
        })?;
        if new_size < current.size_bytes {
            if range.admits(current.size_bytes) {
                return Ok(Expanded {
                    size_bytes: current.size_bytes,
                    node_expansion_required: false,
                });
            }
            return Err(PoolError::SizeRefused(format!(
                "volume {id} is {} bytes; shrinking to {new_size} is not supported",
                current.size_bytes
            )));
        }
        if new_size == current.size_bytes {
            return Ok(Expanded {
                size_bytes: new_size,
                node_expansion_required: false,
            });
        }
        let space = self.space().await?;
        {
            // Growth is checked like a new volume of the difference; the volume
            // keeps its project id.
            let mut st = self.state();
            let (total, free) = self.limits(&space, st.allocated());
            let delta = new_size - current.size_bytes;
            if new_size > total {
                return Err(PoolError::TooLarge {
                    what: format!("expanding {id}"),
                    bytes: new_size,
                    pool: self.name.clone(),
                    total,
                });
            }
            if delta > free {
                return Err(PoolError::NoRoomToGrow {
                    id: id.to_string(),
                    size: current.size_bytes,
                    bytes: new_size,
                    growth: delta,
                    pool: self.name.clone(),
                    free,
                    most: current.size_bytes + free,
                });
            }
            st.reserved.insert(key.clone(), (delta, None));
        }
        let mut grown = current;
        grown.size_bytes = new_size;
        let (record, rec, quotas) = (
            self.record_path(&key),
            grown.record(id),
            self.quotas.clone(),
        );
        let res = blocking(move || {
            // Raise the limit first: a crash before the record write leaves a
            // limit that the next start lowers back to the recorded size.
            if let (Some(q), Some(p)) = (&quotas, rec.project_id) {
                q.set_limits(p, rec.size_bytes, rec.inode_limit.unwrap_or(0))?;
            }
            let json = serde_json::to_vec_pretty(&rec)?;
            Ok::<_, PoolError>(fsutil::write_atomic(&record, &json)?)
        })
        .await;
        let mut st = self.state();
        st.reserved.remove(&key);
        res?;
        st.volumes.insert(&key, grown);
        Ok(Expanded {
            size_bytes: new_size,
            node_expansion_required: false,
        })
    }

    async fn get(&self, id: &VolumeId) -> Result<Option<Volume>> {
        Ok(self.state().volumes.get(&id.key))
    }

    async fn list(&self) -> Result<Vec<Volume>> {
        Ok(self.state().volumes.volumes().collect())
    }

    async fn list_page(&self, from: &str, max: usize) -> Result<Vec<Volume>> {
        Ok(self.state().volumes.page(from, max))
    }

    async fn capacity(&self) -> Result<Capacity> {
        let space = self.space().await?;
        let (_, free) = self.limits(&space, self.state().allocated());
        Ok(Capacity {
            available_bytes: free,
            maximum_volume_size: free,
        })
    }
}

#[async_trait]
impl NodeSide for DirPool {
    fn source(&self, vol: &Volume) -> Result<Source> {
        Ok(Source::Directory(self.data_dir(&vol.id.key)))
    }

    async fn usage(&self, vol: &Volume) -> Result<Option<Usage>> {
        let (Some(q), Some(p)) = (self.quotas.clone(), vol.project_id) else {
            return Ok(None);
        };
        let (size, inode_limit, root) = (vol.size_bytes, vol.inode_limit, self.root.clone());
        blocking(move || {
            let pq = q.get(p)?;
            let total_inodes = match inode_limit {
                Some(n) => n,
                None => fsutil::fs_stats(&root)?.total_inodes,
            };
            Ok(Some(Usage {
                total_bytes: size,
                used_bytes: pq.used_bytes,
                available_bytes: size.saturating_sub(pq.used_bytes),
                total_inodes,
                used_inodes: pq.used_inodes,
                free_inodes: total_inodes.saturating_sub(pq.used_inodes),
            }))
        })
        .await
    }
}

#[cfg(test)]
mod tests;
