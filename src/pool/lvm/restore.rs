//! Restores and clones: a new LV from a snapshot or a volume. Thin pools
//! take a thin snapshot; thick pools copy blocks with `dd` in a task of its
//! own (it survives a cancelled RPC), tagged `restoring` until complete, and
//! a retry after a crash joins, finishes or removes it.

use std::path::{Path, PathBuf};

use futures::future::{BoxFuture, FutureExt, Shared};

use super::tags::*;
use super::LvmPool;
use crate::lvm::{self, LvInfo, LvmError};
use crate::pool::{ContentSource, CreateRequest, Volume};
use crate::pool::{PoolError, Result};

pub(super) type SharedCopy = Shared<BoxFuture<'static, std::result::Result<(), String>>>;

/// Copies a source LV's data into a restoring LV, then clears its
/// `restoring` tag: only a complete copy becomes a visible volume.
pub(super) async fn copy_and_mark(vg: String, from: String, to: String, bytes: u64) -> Result<()> {
    // `dd of=` creates a plain file where no device node is (an inactive
    // LV): the copy must land on the LV or fail.
    let target = PathBuf::from(format!("/dev/{vg}/{to}"));
    let is_dev = crate::error::blocking(move || {
        use std::os::unix::fs::FileTypeExt;
        Ok::<_, PoolError>(
            std::fs::metadata(&target).is_ok_and(|m| m.file_type().is_block_device()),
        )
    })
    .await?;
    if !is_dev {
        return Err(PoolError::Inconsistent(format!(
            "/dev/{vg}/{to} is not a block device (LV not active?)"
        )));
    }
    let (from, to_dev) = (format!("/dev/{vg}/{from}"), format!("/dev/{vg}/{to}"));
    crate::blockdev::raw::copy(Path::new(&from), Path::new(&to_dev), bytes).await?;
    lvm::delete_tag(&format!("{vg}/{to}"), TAG_RESTORING).await?;
    Ok(())
}

fn describe_encryption(e: Option<crate::pool::Encryption>) -> String {
    match e {
        Some(e) => format!("encrypted ({})", e.as_str()),
        None => "not encrypted".to_owned(),
    }
}

/// A restore or clone being made: the request, its source and the size.
#[derive(Clone, Copy)]
pub(super) struct Restore<'a> {
    pub req: &'a CreateRequest,
    /// The content source's id (`<pool>.<key>`), recorded in a tag.
    pub src_id: &'a str,
    pub src_lv: &'a LvInfo,
    /// Bytes of data the source holds (all of it is copied).
    pub src_size: u64,
    /// Size of the new volume (at least `src_size`).
    pub size: u64,
}

impl LvmPool {
    /// The LV holding a content source, and the size of the data it holds.
    pub(super) async fn source_lv(&self, src: &ContentSource) -> Result<(LvInfo, u64)> {
        match src {
            ContentSource::Snapshot(id) => {
                let lv = lvm::lv(&self.vg, &snap_lv_name(&id.key)).await?;
                let snap = lv.as_ref().and_then(|l| self.to_snapshot(l));
                match (lv, snap) {
                    // A COW snapshot whose area overflowed: dm-snapshot
                    // dropped it, its reads fail.
                    (Some(_), Some(snap)) if !snap.ready => {
                        Err(PoolError::SnapshotInvalid(id.to_string()))
                    }
                    (Some(lv), Some(snap)) => Ok((lv, snap.size_bytes)),
                    _ => Err(PoolError::SnapshotNotFound(id.to_string())),
                }
            }
            ContentSource::Volume(id) => {
                let lv = self.lookup(&id.key).await?;
                match lv.filter(|l| self.to_volume(l).is_some()) {
                    Some(lv) => {
                        let size = lv.size;
                        Ok((lv, size))
                    }
                    None => Err(PoolError::SourceNotFound(id.to_string())),
                }
            }
        }
    }

    /// Runs, or joins, the copy into a restoring LV, and waits for it.
    pub(super) async fn finish_copy(&self, from: String, to: String, bytes: u64) -> Result<()> {
        let copy = {
            let mut copies = self.copies.lock().expect("copies lock poisoned");
            copies
                .entry(to.clone())
                .or_insert_with(|| {
                    let (vg, all, key) = (self.vg.clone(), self.copies.clone(), to.clone());
                    let task = tokio::spawn(async move {
                        let res = copy_and_mark(vg, from, key.clone(), bytes)
                            .await
                            .map_err(|e| e.to_string());
                        all.lock().expect("copies lock poisoned").remove(&key);
                        res
                    });
                    async move { task.await.map_err(|e| format!("copy task failed: {e}"))? }
                        .boxed()
                        .shared()
                })
                .clone()
        };
        copy.await.map_err(|e| {
            PoolError::Inconsistent(format!("copying into {}: {e}", self.lv_path(&to)))
        })
    }

    /// Creates a volume from a snapshot or another volume. Thin pools: a thin
    /// snapshot of the source (instant, shares blocks), tagged `creating`
    /// until it is active and at its full size. Thick pools: a new LV and a
    /// block copy of the source into it, tagged `restoring` until the copy is
    /// complete. Either tag keeps the LV invisible (never listed, staged or
    /// returned), so a create cut short by a crash is finished by the retried
    /// create, or, when its source is gone by then, removed.
    pub(super) async fn create_from(
        &self,
        req: &CreateRequest,
        src: &ContentSource,
    ) -> Result<Volume> {
        let src_id = match src {
            ContentSource::Snapshot(id) | ContentSource::Volume(id) => id.to_string(),
        };
        let lv = self.lookup(&req.id.key).await?;
        if let Some(lv) = &lv {
            self.check_restore_of(lv, req, &src_id)?;
            if !is_unfinished(lv) {
                // Complete: a retry answers without needing the source (it
                // may have been deleted since).
                return self.restored_volume(lv, req);
            }
        }
        let (src_lv, src_size) = match self.source_lv(src).await {
            Ok((lv, _)) if encryption_of(&lv) != req.encryption => {
                // The copy is the source's bytes: ciphertext stays ciphertext,
                // plain data stays plain. Nothing is made.
                return Err(PoolError::UnsupportedParameter(format!(
                    "the content source {src_id} is {}; a volume made from it must be too \
                     (StorageClass parameter encryption{})",
                    describe_encryption(encryption_of(&lv)),
                    match encryption_of(&lv) {
                        Some(e) => format!(": {}, and the same key", e.as_str()),
                        None => " unset".to_owned(),
                    }
                )));
            }
            Ok(found) => found,
            Err(
                e @ (PoolError::SnapshotNotFound(_)
                | PoolError::SourceNotFound(_)
                | PoolError::SnapshotInvalid(_)),
            ) => {
                if let Some(lv) = &lv {
                    // Half made, and its source is gone or unreadable:
                    // nothing can finish it, and nobody was ever given it.
                    self.remove_unfinished(lv).await?;
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let size = self.restore_size(req, src_size).await?;
        let name = lv_name(&req.id.key);
        let plan = Restore {
            req,
            src_id: &src_id,
            src_lv: &src_lv,
            src_size,
            size,
        };
        let lv = match lv {
            Some(lv) => lv,
            None => self.start_restore(&plan).await?,
        };
        if !is_unfinished(&lv) {
            return self.restored_volume(&lv, req);
        }
        self.finish_restore(&lv, &plan).await?;
        let lv = self.lookup(&req.id.key).await?.ok_or_else(|| {
            PoolError::Inconsistent(format!("LV {} vanished", self.lv_path(&name)))
        })?;
        if is_unfinished(&lv) {
            return Err(PoolError::Inconsistent(format!(
                "LV {} is still marked unfinished after its create completed",
                self.lv_path(&name)
            )));
        }
        self.restored_volume(&lv, req)
    }

    /// The size of a restore or clone: what the request asks for, never less
    /// than its source holds (OUT_OF_RANGE), the source's size by default.
    async fn restore_size(&self, req: &CreateRequest, src_size: u64) -> Result<u64> {
        if req.range.limit > 0 && req.range.limit < src_size {
            return Err(PoolError::SizeRefused(format!(
                "limit_bytes {} is smaller than the source ({src_size} bytes)",
                req.range.limit
            )));
        }
        if req.range.required > 0 && req.range.required < src_size {
            return Err(PoolError::SizeRefused(format!(
                "required_bytes {} is smaller than the source ({src_size} bytes)",
                req.range.required
            )));
        }
        if req.range.required == 0 {
            Ok(src_size)
        } else {
            self.size_for(req.range).await
        }
    }

    /// Makes the LV of a restore or clone, hidden (tagged unfinished), after
    /// checking there is room for it; one a create cut short already made
    /// is taken as it is.
    async fn start_restore(&self, plan: &Restore<'_>) -> Result<LvInfo> {
        let Restore { req, size, .. } = *plan;
        let name = lv_name(&req.id.key);
        let _alloc = self.alloc.lock().await;
        let (ever, now) = self.limits().await?;
        self.check_room(size, ever, now, &format!("volume {}", req.name.as_str()))?;
        self.index.unknown_promises();
        match self.lvcreate(self.create_from_args(plan)).await {
            // AlreadyExists: an lvcreate of a create cut short got there
            // first (it may still be running): finished below.
            Ok(()) | Err(LvmError::AlreadyExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let made = self.lookup(&req.id.key).await?.ok_or_else(|| {
            PoolError::Inconsistent(format!("LV {} missing after lvcreate", self.lv_path(&name)))
        })?;
        self.check_restore_of(&made, req, plan.src_id)?;
        Ok(made)
    }

    /// Finishes an unfinished restore or clone: activates it, copies the
    /// source into it (thick: unless a copy from before a restart still
    /// runs, ABORTED) or grows the thin snapshot to its size, then clears
    /// the unfinished tag.
    async fn finish_restore(&self, lv: &LvInfo, plan: &Restore<'_>) -> Result<()> {
        let Restore {
            req,
            src_lv,
            src_size,
            size,
            ..
        } = *plan;
        let name = lv_name(&req.id.key);
        self.make_usable(lv).await?;
        if lv.has_tag(TAG_RESTORING) {
            let ours = self
                .copies
                .lock()
                .expect("copies lock poisoned")
                .contains_key(&name);
            let target = PathBuf::from(format!("/dev/{}", self.lv_path(&name)));
            let running = !ours && {
                crate::error::blocking(move || {
                    Ok::<_, PoolError>(crate::blockdev::raw::copy_running(
                        Path::new("/proc"),
                        &target,
                    ))
                })
                .await?
            };
            if !ours && (lv.open || running) {
                // A hidden LV is opened by nothing but a copy, and not by
                // one of this process: a copy a killed driver left running
                // (`running` also sees one that has not opened it yet).
                // A second writer could end after this one and overwrite
                // what the volume's user wrote meanwhile: wait for it.
                return Err(PoolError::CopyStillRunning(self.lv_path(&name)));
            }
            self.make_usable(src_lv).await?;
            // Copy the whole source, so a larger target keeps the source's
            // filesystem intact (it is grown at stage). The copy clears the
            // `restoring` tag when it is complete.
            self.finish_copy(src_lv.name.clone(), name.clone(), src_size)
                .await?;
        }
        if lv.has_tag(TAG_CREATING) {
            if lv.size < size {
                // Thin: the snapshot has its source's size.
                self.grow_lv(lv, size, &format!("volume {}", req.name.as_str()))
                    .await?;
            }
            lvm::delete_tag(&self.lv_path(&name), TAG_CREATING).await?;
        }
        Ok(())
    }
}
