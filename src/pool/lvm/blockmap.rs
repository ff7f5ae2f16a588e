//! Block maps of a thin pool's snapshots (SnapshotMetadata), read from the
//! pool's own metadata (`lvm/thin.rs`): what a snapshot's thin device maps,
//! and what differs between two, without reading their data.
//!
//! The tools read the pool's *metadata snapshot*, of which a pool holds at
//! most one. Here is who holds it:
//!
//! - one call at a time per thin pool ([`METADATA_LOCKS`], process-wide, by VG
//!   and thin pool: two configured pools over one thin pool share it);
//!   other calls wait for it, or go when their caller gives up;
//! - before reserving, a metadata snapshot the kernel says is held (its
//!   `thin-pool` status) is released: under the lock nothing of this
//!   process holds one, so it was left by a driver killed mid-call (or
//!   taken by hand); the pool's opening releases one too, so a killed
//!   driver's is gone by its next start;
//! - [`HeldMetadata`] releases it when the map was read to its end (and
//!   the tool exited), and when it is dropped otherwise (an error, the
//!   client gone): a drop cannot wait, so it spawns the release, which
//!   keeps the pool's lock until it is done. Never longer than one call.

use std::path::PathBuf;

use async_trait::async_trait;
use tokio::sync::OwnedMutexGuard;

use super::locks::ThinPoolLocks;
use super::provisioning::{Thin, ThinPoolName};
use super::*;
use crate::lvm::{BlockRuns, Run};
use crate::pool::{BlockMaps, Extent, Extents, MappedSnapshot, Window};

/// The lock of each thin pool's metadata snapshot.
static METADATA_LOCKS: ThinPoolLocks = ThinPoolLocks::new();

/// The thin pool's target as the kernel has it now (None: not active).
pub(super) async fn target(
    vg: &str,
    thin: &ThinPoolName,
) -> Result<Option<crate::dm::ThinPoolTarget>> {
    let (vg, thin) = (vg.to_owned(), thin.clone());
    Ok(crate::error::blocking(move || {
        crate::dm::thin_pool_target(&vg, thin.as_str())
            .map_err(|e| crate::error::IoError::new("reading the thin pool's status", e))
    })
    .await?)
}

/// A thin pool's metadata snapshot, reserved. Released by
/// [`HeldMetadata::release`], or when dropped (see the module's text).
pub(super) struct HeldMetadata {
    vg: String,
    thin: ThinPoolName,
    /// The mapping of the pool's `thin-pool` target.
    mapping: String,
    /// The snapshot's block, as the pool's status named it once reserved.
    root: Option<u64>,
    /// The pool's metadata device, which the tools read.
    tmeta: PathBuf,
    /// The pool's lock, held as long as the snapshot is.
    lock: Option<OwnedMutexGuard<()>>,
}

impl HeldMetadata {
    /// Waits for the pool's lock, releases a stale metadata snapshot and
    /// reserves one. An inactive pool is activated first (its snapshots'
    /// maps are in its metadata whether they are active or not).
    pub(super) async fn reserve(vg: &str, thin: &ThinPoolName) -> Result<Self> {
        let lock = METADATA_LOCKS.of(vg, thin.as_str()).lock_owned().await;
        let t = match target(vg, thin).await? {
            Some(t) => t,
            None => {
                lvm::activate(&format!("{vg}/{thin}")).await?;
                target(vg, thin).await?.ok_or_else(|| {
                    PoolError::Inconsistent(format!(
                        "thin pool {vg}/{thin} has no thin-pool mapping after activation"
                    ))
                })?
            }
        };
        if let Some(root) = t.status.held_root {
            tracing::warn!(
                thin_pool = format!("{vg}/{thin}"),
                root,
                "releasing a metadata snapshot left held (a driver killed mid-call, or taken by hand)"
            );
            lvm::release_metadata_snap(&t.mapping).await?;
        }
        let tmeta_name = crate::dm::lv_name(vg, &format!("{thin}_tmeta"));
        let tmeta = PathBuf::from("/dev/mapper").join(&tmeta_name);
        lvm::reserve_metadata_snap(&t.mapping).await?;
        let mut held = HeldMetadata {
            vg: vg.to_owned(),
            thin: thin.clone(),
            mapping: t.mapping,
            root: None,
            tmeta,
            lock: Some(lock),
        };
        held.root = held.now_held().await?;
        if held.root.is_none() {
            return Err(PoolError::Inconsistent(format!(
                "thin pool {vg}/{thin}: its status names no metadata snapshot just after one was reserved"
            )));
        }
        Ok(held)
    }

    /// The metadata snapshot the pool's status names now.
    async fn now_held(&self) -> Result<Option<u64>> {
        Ok(target(&self.vg, &self.thin)
            .await?
            .and_then(|t| t.status.held_root))
    }

    /// Releases it now (the normal end of a read), once the pool's status
    /// shows that it is still the one reserved: another process that
    /// released it meanwhile (a successor driver's start, by hand) may have
    /// let the pool reuse its blocks under the tool, so the answer is then
    /// an error, never a map read from reused blocks.
    async fn release(mut self) -> Result<()> {
        let still = self.now_held().await;
        let lock = self.lock.take();
        let res = match still {
            Ok(now) if now.is_some() && now == self.root => {
                lvm::release_metadata_snap(&self.mapping)
                    .await
                    .map_err(Into::into)
            }
            // Not ours any more: left to whoever holds it now.
            Ok(now) => Err(PoolError::Inconsistent(format!(
                "the metadata snapshot of thin pool {}/{} was released or replaced by another \
                 process while it was read (block {:?}, now {now:?}); ask again from the start",
                self.vg, self.thin, self.root
            ))),
            Err(e) => {
                let _ = lvm::release_metadata_snap(&self.mapping).await;
                Err(e)
            }
        };
        drop(lock);
        res
    }
}

impl Drop for HeldMetadata {
    fn drop(&mut self) {
        let Some(lock) = self.lock.take() else {
            return;
        };
        let (vg, thin, mapping, root) = (
            self.vg.clone(),
            self.thin.clone(),
            self.mapping.clone(),
            self.root,
        );
        let release = async move {
            // Only its own: none held is done, another block is another
            // process's (its own block unknown, or the status unreadable:
            // released, as its own most likely).
            let now = target(&vg, &thin)
                .await
                .map(|t| t.and_then(|t| t.status.held_root));
            let theirs = match now {
                Ok(None) => true,
                Ok(Some(n)) => root.is_some_and(|r| r != n),
                Err(_) => false,
            };
            if theirs {
                drop(lock);
                return;
            }
            if let Err(e) = lvm::release_metadata_snap(&mapping).await {
                tracing::warn!(mapping, error = %e, "releasing the thin pool's metadata snapshot failed; the next call or start releases it");
            }
            drop(lock);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(release);
            }
            // No runtime (a process ending): the next start releases it.
            Err(_) => tracing::warn!(
                mapping = self.mapping,
                "a metadata snapshot is left held; the next start releases it"
            ),
        }
    }
}

/// Releases a metadata snapshot a killed driver left held on the thin
/// pool of `pool`, at its opening (an inactive pool holds none). A failure
/// is logged: the next block-map call tries again.
pub(super) async fn release_left_held(vg: &str, thin: &Thin, pool: &PoolName) {
    let thin = &thin.pool;
    let _lock = METADATA_LOCKS.of(vg, thin.as_str()).lock_owned().await;
    let res = async {
        if let Some(t) = target(vg, thin).await? {
            if let Some(root) = t.status.held_root {
                tracing::warn!(
                    thin_pool = format!("{vg}/{thin}"),
                    root,
                    "releasing a metadata snapshot left held by an earlier run"
                );
                lvm::release_metadata_snap(&t.mapping).await?;
            }
        }
        Ok::<_, PoolError>(())
    };
    if let Err(e) = res.await {
        tracing::warn!(pool = %pool, error = %e, "a held metadata snapshot could not be released; the next block-map call tries again");
    }
}

/// The runs of a thin device's block map as byte extents, and the
/// metadata snapshot they are read from. Fields drop in order: the tool
/// first (killed), then the snapshot (released).
struct ThinExtents {
    runs: Option<BlockRuns>,
    held: Option<HeldMetadata>,
    block: u64,
}

#[async_trait]
impl Extents for ThinExtents {
    fn block_size(&self) -> u64 {
        self.block
    }

    async fn next(&mut self) -> Result<Option<Extent>> {
        let Some(runs) = self.runs.as_mut() else {
            return Ok(None);
        };
        match runs.next().await? {
            Some(Run { begin, length }) => Ok(Some(Extent {
                offset: begin.saturating_mul(self.block),
                length: length.saturating_mul(self.block),
            })),
            None => {
                self.runs = None;
                if let Some(held) = self.held.take() {
                    held.release().await?;
                }
                Ok(None)
            }
        }
    }
}

impl LvmPool {
    /// The thin pool, or the refusal of a thick pool's block maps (which
    /// [`Pool::block_maps`] never hands out).
    fn thin_only(&self) -> Result<&Thin> {
        self.provisioning
            .thin()
            .ok_or_else(|| PoolError::Inconsistent(format!("pool {} has no thin pool", self.name)))
    }

    /// The window of an encrypted snapshot: what follows its LUKS header
    /// (read from the snapshot's own device, activated for it).
    async fn luks_window(&self, lv: &LvInfo) -> Result<Window> {
        if !lv.is_active() {
            self.activate_lv(&lv.name).await?;
        }
        let dev = PathBuf::from(format!("/dev/{}", self.lv_path(&lv.name)));
        let offset = crate::error::blocking(move || crate::crypt::luks2_data_offset(&dev)).await?;
        Ok(Window {
            skip: offset.min(lv.size),
            capacity: lv.size.saturating_sub(offset),
        })
    }

    async fn start(
        &self,
        read: impl std::future::Future<Output = std::result::Result<BlockRuns, LvmError>>,
        held: HeldMetadata,
    ) -> Result<Box<dyn Extents>> {
        let runs = read.await?;
        let block = runs.block_bytes();
        Ok(Box::new(ThinExtents {
            runs: Some(runs),
            held: Some(held),
            block,
        }))
    }
}

#[async_trait]
impl BlockMaps for LvmPool {
    async fn mapped_snapshot(&self, id: &VolumeId) -> Result<MappedSnapshot> {
        let thin = &self.thin_only()?.pool;
        let name = snap_lv_name(&id.key);
        let lv = lvm::lv(&self.vg, &name)
            .await?
            .ok_or_else(|| PoolError::SnapshotNotFound(id.to_string()))?;
        let snap = self
            .to_snapshot(&lv)
            .ok_or_else(|| PoolError::SnapshotNotFound(id.to_string()))?;
        if !lv.is_thin_volume() || lv.pool_lv != thin.as_str() {
            return Err(PoolError::Inconsistent(format!(
                "snapshot LV {} is not a thin volume of {}/{thin}",
                self.lv_path(&lv.name),
                self.vg
            )));
        }
        let device = lv.thin_id.ok_or_else(|| {
            PoolError::Inconsistent(format!("lvm reports no thin_id for {}", lv.path))
        })?;
        let window = match encryption_of(&lv) {
            None => Window {
                skip: 0,
                capacity: lv.size,
            },
            Some(_) => self.luks_window(&lv).await?,
        };
        Ok(MappedSnapshot {
            id: id.clone(),
            source_volume: snap.source_volume_id,
            window,
            device,
        })
    }

    async fn allocated(&self, snap: &MappedSnapshot) -> Result<Box<dyn Extents>> {
        let held = HeldMetadata::reserve(&self.vg, &self.thin_only()?.pool).await?;
        let tmeta = held.tmeta.clone();
        let read = BlockRuns::mapped(&tmeta, snap.device);
        self.start(read, held).await
    }

    async fn changed(
        &self,
        base: &MappedSnapshot,
        target: &MappedSnapshot,
    ) -> Result<Box<dyn Extents>> {
        let held = HeldMetadata::reserve(&self.vg, &self.thin_only()?.pool).await?;
        let tmeta = held.tmeta.clone();
        let read = BlockRuns::changed(&tmeta, base.device, target.device);
        self.start(read, held).await
    }
}
