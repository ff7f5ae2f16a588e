//! An LVM pool's snapshots: COW snapshots of thick volumes (sized by the
//! class's `snapshotSize`), thin snapshots of thin ones; their LVs' tags are
//! the only record.

use async_trait::async_trait;

use super::super::{Result, Snapshot, SnapshotRequest, Snapshots};
use super::provisioning::Provisioning;
use super::*;
use crate::ids::VolumeId;

impl LvmPool {
    /// Removes what a cut-short `lvcreate -s` left (see
    /// [`LvmPool::is_half_made_snapshot`]): a plain LV of fresh extents that
    /// no one ever wrote, so it goes without a wipe.
    async fn discard_half_made(&self, lv: &LvInfo) -> Result<()> {
        tracing::warn!(
            lv = self.lv_path(&lv.name),
            "removing a plain LV a cut-short lvcreate -s left in a snapshot's place"
        );
        self.index.forget(&lv.name);
        lvm::remove(&self.lv_path(&lv.name)).await?;
        Ok(())
    }
}

impl LvmPool {
    async fn take_snapshot(&self, req: &SnapshotRequest) -> Result<Snapshot> {
        let name = snap_lv_name(&req.id.key);
        let mut found = lvm::lv(&self.vg, &name).await?;
        if let Some(lv) = found.take_if(|lv| self.is_half_made_snapshot(lv)) {
            self.discard_half_made(&lv).await?;
        }
        if let Some(lv) = found {
            let snap = self.to_snapshot(&lv).ok_or_else(|| self.not_ours(&name))?;
            if snap.name != req.name.as_str() || snap.source_volume_id != req.source.to_string() {
                return Err(PoolError::Mismatch {
                    name: req.name.as_str().to_owned(),
                    why: format!(
                        "it is a snapshot of another source volume ({})",
                        snap.source_volume_id
                    ),
                });
            }
            return Ok(snap);
        }
        let src = self
            .lookup(&req.source.key)
            .await?
            .filter(|l| self.to_volume(l).is_some())
            .ok_or_else(|| PoolError::SourceNotFound(req.source.to_string()))?;
        let access = self
            .to_volume(&src)
            .map_or(AccessType::Mount, |v| v.access_type);
        let mut tags = self.tags("snapshot", req.name.as_str(), access);
        tags.extend(encryption_tag(encryption_of(&src)));
        tags.push(format!("{TAG_SOURCE}={}", req.source));
        tags.push(format!("{TAG_SIZE}={}", src.size));
        let _alloc = self.alloc.lock().await;
        let mut cow_size = None;
        if let Provisioning::Thick(_) = self.provisioning {
            // A COW snapshot needs space for the changes made to its origin.
            let cow = req.cow_size.unwrap_or(src.size);
            let (ever, now) = self.limits().await?;
            self.check_room(cow, ever, now, &format!("snapshot {}", req.name.as_str()))?;
            cow_size = Some(cow);
        }
        let what = NewLv::Snapshot {
            origin: &src.name,
            cow_size,
        };
        let args = lvm::lvcreate_args(&self.vg, &name, &tags, what);
        self.index.unknown_promises();
        match self.lvcreate(args).await {
            Ok(()) | Err(LvmError::AlreadyExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let lv = lvm::lv(&self.vg, &name).await?.ok_or_else(|| {
            PoolError::Inconsistent(format!(
                "snapshot LV {} missing after lvcreate",
                self.lv_path(&name)
            ))
        })?;
        self.to_snapshot(&lv).ok_or_else(|| {
            PoolError::Inconsistent(format!(
                "snapshot LV {} has unexpected tags",
                self.lv_path(&name)
            ))
        })
    }

    async fn remove_snapshot(&self, id: &VolumeId) -> Result<()> {
        let name = snap_lv_name(&id.key);
        let Some(lv) = lvm::lv(&self.vg, &name).await? else {
            return Ok(());
        };
        if self.is_half_made_snapshot(&lv) {
            self.discard_half_made(&lv).await?;
            return Ok(());
        }
        if self.to_snapshot(&lv).is_none() {
            return Err(PoolError::ForeignLv {
                path: self.lv_path(&name),
                kind: "snapshot",
            });
        }
        if lv.open {
            // A thick restore or clone copying from it (lvremove would
            // refuse too; a renamed snapshot would be split under the copy).
            return Err(PoolError::InUse {
                volume: id.to_string(),
                why: format!("(snapshot LV {}) is open; retry later", lv.path),
            });
        }
        self.retire(&lv).await
    }
}

#[async_trait]
impl Snapshots for LvmPool {
    /// A thick snapshot takes the VG's extents: GetCapacity's kept answer
    /// is forgotten after it (and after a delete).
    async fn create_snapshot(&self, req: &SnapshotRequest) -> Result<Snapshot> {
        self.offer.after(self.take_snapshot(req)).await
    }

    async fn delete_snapshot(&self, id: &VolumeId) -> Result<()> {
        self.offer.after(self.remove_snapshot(id)).await
    }

    async fn get_snapshot(&self, id: &VolumeId) -> Result<Option<Snapshot>> {
        Ok(lvm::lv(&self.vg, &snap_lv_name(&id.key))
            .await?
            .and_then(|lv| self.to_snapshot(&lv)))
    }

    async fn list_snapshots(&self) -> Result<Vec<Snapshot>> {
        Ok(lvm::lvs(&self.vg)
            .await?
            .iter()
            .filter_map(|lv| self.to_snapshot(lv))
            .collect())
    }
}
