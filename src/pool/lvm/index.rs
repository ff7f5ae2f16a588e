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
//! stale entry cannot lead them astray.
//!
//! Entries are only ever positive (a volume that is not in the index is
//! looked up). A read that raced with one of the driver's own changes is
//! dropped instead of stored (the `epoch` counts changes): it may predate
//! them.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::lvm::LvInfo;

#[derive(Default)]
pub(super) struct LvIndex {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    lvs: HashMap<String, LvInfo>,
    /// Bumped by every change the driver makes itself.
    epoch: u64,
}

/// Whether an LV belongs in the index (the pool's volumes, not snapshots,
/// thin pools or LVs being wiped).
fn indexed(name: &str) -> bool {
    name.starts_with("lv-")
}

impl LvIndex {
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
    /// it does not mirror: the next lookup reads lvm).
    pub fn forget(&self, name: &str) {
        let mut i = self.inner();
        i.epoch += 1;
        i.lvs.remove(name);
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
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner().lvs.len()
    }
}
