//! What a volume's delete refuses: an LV in use (mounted, open, its
//! mapping in use, its device node bound) or one that COW snapshots still
//! depend on.

use std::path::PathBuf;

use super::super::{PoolError, Result};
use super::*;
use crate::ids::VolumeId;

impl LvmPool {
    /// InUse while the volume's LV is open (mounted, or its mapping in use)
    /// or its device node is bound (a published raw block volume). A
    /// mapping a killed driver left open, with nothing using it, is closed.
    /// Returns the LV as it is now.
    pub(super) async fn refuse_if_in_use(&self, id: &VolumeId, mut lv: LvInfo) -> Result<LvInfo> {
        if lv.open && encryption_of(&lv).is_some() {
            // Its mapping holds the LV open. One left open by a driver that
            // was killed (nothing mounted, no node bound, no process) is
            // closed; one in use stays, and so does the volume.
            let name = crypt::mapping_name(&id.to_string());
            let n = name.clone();
            let mapped = crate::error::blocking(move || crypt::mapped_device(&n)).await?;
            if mapped.is_some() {
                crypt::close(&name).await.map_err(|e| PoolError::InUse {
                    volume: id.to_string(),
                    why: format!("is open as {name}: {e}; unpublish and unstage it first"),
                })?;
                tracing::info!(volume = %id, mapping = name, "closed a mapping left open");
                lv = self.lookup(&id.key).await?.unwrap_or(lv);
            }
        }
        if lv.open {
            return Err(PoolError::InUse {
                volume: id.to_string(),
                why: format!(
                    "({}) is in use (mounted or open); unpublish and unstage it first",
                    lv.path
                ),
            });
        }
        // A published raw block volume is a bind of its device node, which
        // does not open the device: look for it in the mount table.
        let dev = PathBuf::from(format!("/dev/{}", self.lv_path(&lv.name)));
        let bound = crate::error::blocking(move || {
            let table = crate::mount::MountTable::read()?;
            match crate::mount::locate_device_node(&table, &dev) {
                Ok(loc) => Ok(table.mounts_of(&loc).next().map(|m| m.mount_point.clone())),
                // Not active: no device node to bind.
                Err(crate::mount::MountError::DeviceMissing { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await?;
        if let Some(at) = bound {
            return Err(PoolError::InUse {
                volume: id.to_string(),
                why: format!("is published at {at:?}; unpublish it first"),
            });
        }
        Ok(lv)
    }

    /// InUse while COW snapshots of a thick volume (in `all`, the VG's LVs)
    /// depend on it; snapshots deleted moments ago and not yet split by the
    /// wiper are split here.
    pub(super) async fn refuse_if_snapshotted(
        &self,
        id: &VolumeId,
        lv: &LvInfo,
        all: &[LvInfo],
    ) -> Result<()> {
        let (wiping, dependants): (Vec<&LvInfo>, Vec<&LvInfo>) = all
            .iter()
            .filter(|l| l.is_cow_snapshot() && l.origin == lv.name)
            .partition(|l| wipe::is_wiping(l));
        let dependants: Vec<String> = dependants.iter().map(|l| l.name.clone()).collect();
        if dependants.is_empty() {
            for w in wiping {
                // A snapshot deleted moments ago stays a COW snapshot of
                // this origin until the wiper splits it (csi-sanity deletes
                // a snapshot, then its origin, at once): split it here; the
                // wiper zeroes it as a plain LV. It may have split it itself
                // meanwhile.
                let path = self.lv_path(&w.name);
                if let Err(e) = lvm::split_snapshot(&path).await {
                    let now = lvm::lv(&self.vg, &w.name).await?;
                    if now.is_some_and(|l| l.is_cow_snapshot()) {
                        return Err(e.into());
                    }
                }
            }
        }
        if !dependants.is_empty() {
            return Err(PoolError::InUse {
                volume: id.to_string(),
                why: format!(
                    "still has snapshots ({}); delete them first",
                    dependants.join(", ")
                ),
            });
        }
        Ok(())
    }
}
