//! What node RPCs know of the pool's volumes without running `lvs`.
//!
//! The LVs and their tags stay the only record: this index is a cache of
//! `lvs` answers for the pool's `lv-` LVs, filled at start, replaced by every
//! full `lvs` of the VG (ListVolumes, /metrics), updated by the driver's own
//! creates and deletes, and re-read on a miss. Only lookups that decide
//! nothing destructive answer from it (`Pool::get`: NodeStage, NodePublish,
//! Validate: [`super::LvmPool::lookup_indexed`]), and only when the
//! entry is one of the pool's finished, active volumes whose device node is
//! there; anything else is a miss and asks lvm. Creates, deletes, expansions
//! and snapshots read lvm (or act through a `--select` that lvm checks), so a
//! stale entry cannot lead them astray; the one exception, a thin create's
//! room check, is below.
//!
//! Entries are only ever positive (a volume that is not in the index is
//! looked up).
//!
//! For a thin pool it also keeps the sizes of every thin LV of the thin pool
//! (the driver's and any other: `promised`), which a thin CreateVolume's
//! overprovision check adds up instead of running `lvs`. That check refuses
//! or admits a create and destroys nothing; the total is replaced by every
//! full `lvs`, kept by the driver's own creates and thin deletes, and
//! dropped (the next create reads `lvs`) by every other change the driver
//! makes (expansions, snapshots, restores, a failed removal). A read that raced with one of the driver's own changes is
//! dropped instead of stored (the `epoch` counts changes): it may predate
//! them.

use std::collections::HashMap;
use std::sync::Mutex;

use super::provisioning::ThinPoolName;
use crate::lvm::LvInfo;

#[derive(Default)]
pub(super) struct LvIndex {
    inner: Mutex<Inner>,
    /// The thin pool whose thin LVs `promised` counts (None: thick).
    thin: Option<String>,
}

#[derive(Default)]
struct Inner {
    lvs: HashMap<String, LvInfo>,
    /// Bumped by every change the driver makes itself.
    epoch: u64,
    /// Thin pools: the size of each thin LV of the thin pool, by name
    /// (None: not known since a change the driver did not mirror).
    promised: Option<HashMap<String, u64>>,
}

/// Whether an LV belongs in the index (the pool's volumes, not snapshots,
/// thin pools or LVs being wiped).
fn indexed(name: &str) -> bool {
    name.starts_with("lv-")
}

impl LvIndex {
    /// The index of a pool, thin when `thin` names its thin pool.
    pub fn new(thin: Option<&ThinPoolName>) -> Self {
        LvIndex {
            inner: Mutex::default(),
            thin: thin.map(|t| t.as_str().to_owned()),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The epoch to pass to [`LvIndex::store`] / [`LvIndex::replace`] for a
    /// read that starts now.
    pub fn epoch(&self) -> u64 {
        self.inner().epoch
    }

    pub fn get(&self, name: &str) -> Option<LvInfo> {
        self.inner().lvs.get(name).cloned()
    }

    /// What the driver itself just made or changed.
    pub fn put(&self, lv: LvInfo) {
        let mut i = self.inner();
        i.epoch += 1;
        if indexed(&lv.name) {
            i.lvs.insert(lv.name.clone(), lv);
        }
    }

    /// What the driver itself just removed or renamed (or changed in a way
    /// it does not mirror: the next lookup reads lvm, and the next thin
    /// create `lvs`).
    pub fn forget(&self, name: &str) {
        let mut i = self.inner();
        i.epoch += 1;
        i.lvs.remove(name);
        i.promised = None;
    }

    /// A change to the thin pool's LVs that is not mirrored (a snapshot, a
    /// restore): the next thin create reads `lvs`.
    pub fn unknown_promises(&self) {
        let mut i = self.inner();
        i.epoch += 1;
        i.promised = None;
    }

    /// A thin volume the driver just created, of `size` bytes.
    pub fn promise(&self, name: &str, size: u64) {
        if let Some(p) = self.inner().promised.as_mut() {
            p.insert(name.to_owned(), size);
        }
    }

    /// A volume the driver is about to remove: out of the entries (the
    /// total keeps it until [`LvIndex::removed`] or
    /// [`LvIndex::unknown_promises`] says how the removal went).
    pub fn leaving(&self, name: &str) {
        let mut i = self.inner();
        i.epoch += 1;
        i.lvs.remove(name);
    }

    /// A thin LV the driver just removed: out of the total.
    pub fn removed(&self, name: &str) {
        let mut i = self.inner();
        i.epoch += 1;
        if let Some(p) = i.promised.as_mut() {
            p.remove(name);
        }
    }

    /// The sizes promised by the thin pool's LVs, added up (None: not known,
    /// or `name` is one of them).
    pub fn promised_without(&self, name: &str) -> Option<u64> {
        let i = self.inner();
        let p = i.promised.as_ref()?;
        match p.contains_key(name) {
            true => None,
            false => Some(p.values().sum()),
        }
    }

    /// One LV as an lvm read begun at `epoch` found it (`None`: missing).
    pub fn store(&self, epoch: u64, name: &str, lv: Option<&LvInfo>) {
        let mut i = self.inner();
        if i.epoch != epoch {
            return;
        }
        match lv {
            Some(lv) if indexed(name) => {
                i.lvs.insert(name.to_owned(), lv.clone());
            }
            _ => {
                i.lvs.remove(name);
            }
        }
    }

    /// Every LV of the VG, as a full `lvs` begun at `epoch` found them.
    pub fn replace(&self, epoch: u64, all: &[LvInfo]) {
        let mut i = self.inner();
        if i.epoch != epoch {
            return;
        }
        i.lvs = all
            .iter()
            .filter(|l| indexed(&l.name))
            .map(|l| (l.name.clone(), l.clone()))
            .collect();
        i.promised = self.thin.as_ref().map(|thin| {
            all.iter()
                .filter(|l| l.is_thin_volume() && &l.pool_lv == thin)
                .map(|l| (l.name.clone(), l.size))
                .collect()
        });
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner().lvs.len()
    }
}
