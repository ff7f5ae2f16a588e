//! LVM pools: each volume is a logical volume `lv-<key>` in the pool's volume
//! group, thick or thin (from the pool's thin pool).
//!
//! `lvs` is the ground truth; the driver keeps no record of its own. Every LV it
//! creates carries tags: `localvol` (ours), `localvol.pool=<pool>` (several pools
//! may share a VG), `localvol.kind=volume|snapshot`, `localvol.name=<CSI name,
//! tag-encoded>`, `localvol.access=mount|block` and, for volumes encrypted at
//! rest, `localvol.encryption=luks2`. A create that finds its LV
//! already there (a retry, or a crash mid-create) recognises it by those tags
//! instead of making a second one.
//!
//! - this file: the pool and its [`Pool`] implementation;
//! - `provisioning`: thick and thin, the pool's two strategies
//!   ([`Provisioning`]), each with the rules that hold for it alone;
//! - `create`: a new, empty volume's size, room and `lvcreate`;
//! - `delete`: what a delete refuses (in use, snapshots depend on it);
//! - `node`: its [`super::NodeSide`] (source, activation, usage, condition
//!   from device-mapper);
//! - `snapshots`: its [`Snapshots`] (COW and thin snapshots);
//! - `tags`: the tag schema (which LVs are which of this pool's volumes and
//!   snapshots);
//! - `args`: `lvcreate` arguments (through `lvm::lvcreate_args`);
//! - `capacity`: sizes in whole extents and what the pool can still offer;
//! - `index`: the pool's volumes as lvm last reported them, so NodeStage and
//!   NodePublish need no `lvs` (never trusted for anything destructive);
//! - `restore`: restores and clones (thin snapshots, or block copies that
//!   survive a cancelled RPC and a crash);
//! - `wipe`: thick pools zero deleted volumes and snapshots in the
//!   background before their extents return to the VG;
//! - `blockmap`: thin pools' block maps of their snapshots
//!   (SnapshotMetadata), and the pool's one metadata snapshot they are
//!   read from;
//! - `tests`: all of the above on recorded `lvs` JSON, without root or the VM.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{
    AccessType, Backend, BlockMaps, Capacity, CapacityRange, CreateRequest, Expanded, Health,
    IoLimits, Pool, PoolError, Result, SlowChecks, Snapshots, ThinUsage, Volume, Wipes,
};
use crate::blockdev::FsType;
use crate::config::{LvmPoolConfig, DEFAULT_VOLUME_SIZE};
use crate::crypt;
use crate::ids::{PoolName, StorageId, VolumeId, VolumeKey};
use crate::lvm::{self, LvInfo, LvmError, NewLv};

mod args;
mod blockmap;
mod capacity;
mod create;
mod delete;
mod health;
mod index;
mod locks;
mod node;
mod provisioning;
mod restore;
mod snapshots;
mod tags;
mod wipe;

use capacity::*;
use create::Sizing;
use health::{Checked, HealthCache, DEGRADED_AFTER, HEALTH_TTL};
use index::LvIndex;
use provisioning::{Provisioning, Thick, Thin, ThinPoolName};
use restore::*;
use tags::*;
use wipe::{wipe_lv_name, Wiper};

pub struct LvmPool {
    name: PoolName,
    vg: String,
    /// Thick or thin, and what is that strategy's alone.
    provisioning: Provisioning,
    reserve: u64,
    default_fs: FsType,
    default_size: u64,
    /// Block copies of thick restores and clones in flight, by target LV. They
    /// run in tasks of their own: a CreateVolume cancelled by its caller's
    /// timeout does not kill the copy, and the retried call joins it.
    copies: Arc<Mutex<HashMap<String, SharedCopy>>>,
    /// Held from the capacity check through `lvcreate`/`lvextend`, so
    /// concurrent creates cannot together overfill the pool. LVM serialises
    /// changes to a VG with its own lock anyway, so this costs no parallelism.
    alloc: tokio::sync::Mutex<()>,
    /// The last health answer (see `health.rs`).
    health: HealthCache,
    /// `lvm:<VG UUID>`, read once the VG was found at open.
    storage: Option<StorageId>,
    /// The pool's volumes as lvm last reported them (see `index.rs`).
    index: LvIndex,
    /// The VG's extent size as lvm last reported it (set at start; a VG's
    /// extent size is fixed in practice, and every `vgs` refreshes it).
    extent: std::sync::atomic::AtomicU64,
    /// GetCapacity's last answer (see `capacity.rs`).
    offer: Arc<OfferCache>,
}

impl LvmPool {
    pub async fn open(cfg: LvmPoolConfig) -> Result<Self> {
        let cfg_rate = cfg.wipe_rate_limit;
        let provisioning = Provisioning::of(&cfg);
        let index = LvIndex::new(provisioning.thin_pool());
        let mut pool = LvmPool {
            default_fs: FsType::parse(&cfg.default_fs_type).map_err(|e| {
                PoolError::Misconfigured {
                    pool: cfg.name.to_string(),
                    why: e.to_string(),
                }
            })?,
            name: cfg.name,
            vg: cfg.volume_group,
            provisioning,
            reserve: cfg.reserve.0,
            default_size: cfg.default_size.map_or(DEFAULT_VOLUME_SIZE, |d| d.0),
            alloc: tokio::sync::Mutex::new(()),
            copies: Arc::default(),
            health: HealthCache::default(),
            storage: None,
            index,
            extent: std::sync::atomic::AtomicU64::new(0),
            offer: Arc::default(),
        };
        match Self::check(pool.vg.clone(), pool.provisioning.thin_pool().cloned()).await {
            Checked::Known(Health::Ready) => {}
            Checked::Known(Health::Unusable(why)) => {
                return Err(PoolError::Misconfigured {
                    pool: pool.name.to_string(),
                    why: why.to_string(),
                })
            }
            // Opened by a later try (the pool monitor's).
            Checked::TimedOut(why) => {
                return Err(PoolError::Misconfigured {
                    pool: pool.name.to_string(),
                    why: format!("its health check gave no answer: {why}"),
                })
            }
        }
        pool.health = HealthCache::new(pool.name.as_str(), Health::Ready);
        // One `lvs` fills the index and gives the extent size and the VG's
        // UUID (the pool's storage identity).
        let uuid = pool
            .refresh_index()
            .await
            .map_err(|e| PoolError::Misconfigured {
                pool: pool.name.to_string(),
                why: format!("reading volume group {}: {e}", pool.vg),
            })?
            .uuid;
        pool.storage = Some(StorageId::parse(&format!("lvm:{uuid}")).map_err(|e| {
            PoolError::Misconfigured {
                pool: pool.name.to_string(),
                why: format!("volume group {}: {e}", pool.vg),
            }
        })?);
        match &mut pool.provisioning {
            Provisioning::Thick(thick) => {
                let rate = cfg_rate.map(|r| r.0);
                thick.wiper = Some(Wiper::start(&pool.vg, &pool.name, rate, pool.offer.clone()));
            }
            Provisioning::Thin(thin) => {
                blockmap::release_left_held(&pool.vg, thin, &pool.name).await
            }
        }
        let thin = pool.provisioning.thin_pool().map(ThinPoolName::as_str);
        tracing::info!(pool = %pool.name, vg = pool.vg, thin = ?thin, "lvm pool opened");
        Ok(pool)
    }

    fn unavailable(&self, why: String) -> PoolError {
        PoolError::Unavailable {
            pool: self.name.to_string(),
            why,
        }
    }

    /// Asks lvm now (no cache): the VG, and the thin pool if there is one.
    /// It owns what it needs, so that it can run in a task of its own (the
    /// health cache's refresh, which no caller may cancel).
    async fn check(vg_name: String, thin: Option<ThinPoolName>) -> Checked {
        let vg = lvm::vg(&vg_name).await;
        let thin = match (&thin, &vg) {
            (Some(thin), Ok(_)) => Some((thin.as_str(), lvm::lv(&vg_name, thin.as_str()).await)),
            (Some(thin), Err(_)) => Some((thin.as_str(), Ok(None))),
            (None, _) => None,
        };
        health::judge(&vg_name, vg, thin)
    }

    fn lv_path(&self, lv: &str) -> String {
        format!("{}/{lv}", self.vg)
    }

    /// Extends `lv` to `size` bytes if the pool has room for the difference
    /// (checked and done under the allocation lock).
    async fn grow_lv(&self, lv: &LvInfo, size: u64, what: &str) -> Result<()> {
        let _alloc = self.alloc.lock().await;
        let (ever, now) = self.limits().await?;
        self.check_room(size, ever, now.saturating_add(lv.size), what)?;
        self.index.unknown_promises();
        lvm::extend(&self.lv_path(&lv.name), size).await?;
        Ok(())
    }

    /// A CreateVolume whose LV exists already (a retry, or a create cut
    /// short): the LV is the volume asked for, or the request mismatches.
    /// `None`: an LV a cut-short create left could not be finished and was
    /// removed; the caller creates it again.
    async fn existing(&self, req: &CreateRequest, mut lv: LvInfo) -> Result<Option<Volume>> {
        let encoded_name = lvm::encode_tag_value(req.name.as_str());
        if self.is_ours(&lv) && lv.tag_value(TAG_SOURCE).is_some() {
            // A restore or clone (complete or not) is not the empty
            // volume this request asks for.
            return Err(PoolError::Mismatch {
                name: req.name.as_str().to_owned(),
                why: format!(
                    "it was made from {}; this request has no content source",
                    lv.tag_value(TAG_SOURCE).unwrap_or_default()
                ),
            });
        }
        if self.is_ours(&lv)
            && lv.tag_value(TAG_NAME) == Some(encoded_name.as_str())
            && cut_short(&lv)
        {
            // An earlier create of this volume was cut short: finish it, or
            // (when it cannot be finished) make it again.
            let finished = self.finish_or_discard(&lv).await?;
            self.index.forget(&lv.name);
            if !finished {
                return Ok(None);
            }
            lv.tags.retain(|t| t != TAG_CREATING);
        }
        match self.to_volume(&lv) {
            Some(v) => super::matches_request(v, req, false).map(Some),
            None => Err(self.not_ours(&lv.name)),
        }
    }

    /// The common delete in one lvm run, lvm itself checking when it runs
    /// that the LV is this pool's (its tags) and not open. Thin pools:
    /// `lvremove`. Thick pools: an `lvchange` tagging it deleted
    /// ([`TAG_DELETED`]) that also selects only an LV no COW snapshot
    /// depends on; the wiper renames, zeroes and removes it. A raw block
    /// volume's device node bound somewhere does not open it, so the mount
    /// table is read first. `false`: nothing was done (gone already, not
    /// this pool's, open, bound, not active, or an origin): the checked path
    /// decides what to answer.
    async fn remove_if_ours(&self, id: &VolumeId) -> Result<bool> {
        let name = lv_name(&id.key);
        let dev = PathBuf::from(format!("/dev/{}", self.lv_path(&name)));
        let bound = crate::error::blocking(move || {
            let table = crate::mount::MountTable::read()?;
            match crate::mount::locate_device_node(&table, &dev) {
                Ok(loc) => Ok(table.mounts_of(&loc).next().is_some()),
                Err(crate::mount::MountError::DeviceMissing { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await?;
        if bound {
            return Ok(false);
        }
        let select = format!(
            "lv_tags={{{TAG_OWNER}}} && lv_tags={{{TAG_POOL}={}}}",
            self.name
        );
        match &self.provisioning {
            Provisioning::Thick(thick) => self.tag_deleted(thick, &name, &select).await,
            Provisioning::Thin(_) => self.remove_selected(&name, &select).await,
        }
    }

    /// [`LvmPool::remove_if_ours`] of a thick pool: the `lvchange` that tags
    /// the LV deleted for the wiper, selecting only one no COW snapshot
    /// depends on.
    async fn tag_deleted(&self, thick: &Thick, name: &str, select: &str) -> Result<bool> {
        // `lv_device_open` is "unknown" for an inactive LV, which then
        // takes the checked path (it is activated there for the wipe).
        let select = format!("{select} && lv_device_open=0 && !(lv_role={{origin}})");
        self.index.forget(name);
        let tagged = match lvm::add_tag_selected(&self.lv_path(name), &select, TAG_DELETED).await {
            Ok(tagged) => tagged,
            Err(e) if lvm::refused_as_held(&e) => false,
            Err(e) => return Err(e.into()),
        };
        if tagged {
            tracing::info!(
                lv = self.lv_path(name),
                "deleted; its blocks are zeroed before they return to the volume group"
            );
            thick.wake_wiper();
        }
        Ok(tagged)
    }

    /// [`LvmPool::remove_if_ours`] of a thin pool: `lvremove` of the
    /// selected LV.
    async fn remove_selected(&self, name: &str, select: &str) -> Result<bool> {
        self.index.leaving(name);
        let res = lvm::remove_selected(&self.lv_path(name), select).await;
        match &res {
            Ok(true) => self.index.removed(name),
            _ => self.index.unknown_promises(),
        }
        match res {
            Ok(removed) => Ok(removed),
            // lvm refused an LV that is open or held by another device (an
            // encrypted volume's mapping): the checked path says why, or
            // closes a mapping a killed driver left open (vm_luks).
            Err(e) if lvm::refused_as_held(&e) => Ok(false),
            // Anything else (lvremove killed, timed out) fails this delete
            // as it is; a retry finds out what is left.
            Err(e) => Err(e.into()),
        }
    }

    /// Removes a restore or clone that was cut short and cannot be finished.
    async fn remove_unfinished(&self, lv: &LvInfo) -> Result<()> {
        debug_assert!(is_unfinished(lv));
        tracing::warn!(
            lv = self.lv_path(&lv.name),
            "removing an unfinished restore or clone: its source is gone or invalid"
        );
        self.retire(lv).await
    }

    /// Takes a deleted LV out of the pool: thin pools remove it; thick
    /// pools rename it for the wiper (`wipe.rs`), which zeroes and then
    /// removes it. Either way its name is free when this returns.
    async fn retire(&self, lv: &LvInfo) -> Result<()> {
        // Forgotten first: a failed removal leaves the LV to the next lookup.
        self.index.forget(&lv.name);
        let Provisioning::Thick(thick) = &self.provisioning else {
            return Ok(lvm::remove(&self.lv_path(&lv.name)).await?);
        };
        let to = wipe_lv_name(&lv.name);
        lvm::rename(&self.vg, &lv.name, &to).await?;
        tracing::info!(
            lv = self.lv_path(&lv.name),
            wiping_as = to,
            "deleted; its blocks are zeroed before they return to the volume group"
        );
        thick.wake_wiper();
        Ok(())
    }

    /// The volume's LV as lvm reports it now (the index learns it too).
    /// A deleted one the wiper has not renamed yet ([`TAG_DELETED`]) is
    /// gone: it is renamed for the wiper here, so its name is free for a
    /// create of the same name, and None is answered.
    async fn lookup(&self, key: &VolumeKey) -> Result<Option<LvInfo>> {
        let name = lv_name(key);
        let epoch = self.index.epoch();
        let lv = lvm::lv(&self.vg, &name).await?;
        let lv = match lv {
            Some(lv) if self.is_deleted(&lv) => {
                self.hand_to_wiper(&lv).await?;
                None
            }
            lv => lv,
        };
        self.index.store(epoch, &name, lv.as_ref());
        Ok(lv)
    }

    /// [`LvmPool::retire`]s a deleted LV (tagged [`TAG_DELETED`]) now
    /// rather than when the wiper gets to it. The wiper may have renamed it
    /// meanwhile, which is as good.
    async fn hand_to_wiper(&self, lv: &LvInfo) -> Result<()> {
        if let Err(e) = self.retire(lv).await {
            let now = lvm::lv(&self.vg, &lv.name).await?;
            if now.is_some_and(|l| l.has_tag(TAG_DELETED)) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The volume's LV for lookups that decide nothing destructive: from the
    /// index when it has the pool's finished, active volume there and its
    /// device node exists (a removed or deactivated LV has none), otherwise
    /// as lvm reports it now.
    async fn lookup_indexed(&self, key: &VolumeKey) -> Result<Option<LvInfo>> {
        if let Some(lv) = self.index.get(&lv_name(key)) {
            if lv.is_active() && self.to_volume(&lv).is_some() {
                let dev = PathBuf::from(format!("/dev/{}", self.lv_path(&lv.name)));
                let there = crate::error::blocking(move || {
                    Ok::<_, crate::error::IoError>(dev.symlink_metadata().is_ok())
                })
                .await?;
                if there {
                    return Ok(Some(lv));
                }
            }
        }
        self.lookup(key).await
    }

    /// A thin pool's (largest volume ever, largest creatable now) without
    /// running lvm: its data size and Data% from the `thin-pool` target, the
    /// sizes promised from the index. None (ask `lvs`): the promises not
    /// known, `name` among them already, or the pool's target not active.
    async fn thin_room_without_lvs(&self, thin: &Thin, name: &str) -> Option<(u64, u64)> {
        let promised = self.index.promised_without(name)?;
        let (vg, pool) = (self.vg.clone(), thin.pool.clone());
        let (size, st) = crate::error::blocking(move || {
            crate::dm::thin_pool(&vg, pool.as_str())
                .map_err(|e| crate::error::IoError::new("reading the thin pool's status", e))
        })
        .await
        .ok()??;
        if !st.serving() {
            return None;
        }
        let offer = ThinOffer::new(
            size,
            Some(st.data_percent),
            thin.ratio,
            self.reserve,
            promised,
            self.cached_extent(),
        );
        Some((offer.ever, offer.by_promise))
    }

    /// Every LV of the VG as lvm reports it now (the index is replaced by it).
    async fn all_lvs(&self) -> Result<Vec<LvInfo>> {
        let epoch = self.index.epoch();
        let all = lvm::lvs(&self.vg).await?;
        self.index.replace(epoch, &all);
        Ok(all)
    }

    /// Fills the index and the extent size from one `lvs` (at start), and
    /// returns the VG as it reported it.
    async fn refresh_index(&self) -> Result<lvm::VgInfo> {
        let epoch = self.index.epoch();
        let (all, vg) = lvm::lvs_and_vg(&self.vg).await?;
        self.index.replace(epoch, &all);
        self.set_extent(&vg);
        Ok(vg)
    }

    fn set_extent(&self, vg: &lvm::VgInfo) {
        self.extent.store(
            vg.extent_size.max(512),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    fn cached_extent(&self) -> u64 {
        self.extent
            .load(std::sync::atomic::Ordering::Relaxed)
            .max(512)
    }

    /// [`LvmPool::finish_create`] for the LV an earlier, cut-short create
    /// left; when it cannot be finished, removes it (its create never
    /// answered, or it was never staged: nothing was ever written to it) and
    /// says so (false). Found by vm_faults: a thin `lvcreate` killed between
    /// the VG metadata commit and the thin pool's own record of the device
    /// leaves an LV that never activates ("reload ioctl ... No data
    /// available").
    async fn finish_or_discard(&self, lv: &LvInfo) -> Result<bool> {
        let Err(e) = self.finish_create(lv, lv.has_tag(TAG_CREATING)).await else {
            return Ok(true);
        };
        tracing::warn!(
            lv = self.lv_path(&lv.name),
            error = %e,
            "an LV left by a cut-short lvcreate cannot be finished; removing it to create it again"
        );
        self.index.forget(&lv.name);
        lvm::remove(&self.lv_path(&lv.name)).await?;
        Ok(false)
    }

    /// Completes a volume whose `lvcreate` may have been cut short: killed
    /// with the driver (a pod's cgroup kill, the OOM killer, a power cut)
    /// after committing the LV but before activating or wiping it. Activates
    /// it and, when `wipe`, removes every signature and zeroes its start (what
    /// `lvcreate --wipesignatures y --zero y` does after activation), then
    /// drops the `creating` tag if it has one: a crash never hands out an
    /// inactive LV or a deleted volume's filesystem. Nothing can have been
    /// written to the LV: its create has not answered yet, or (a volume
    /// still `unformatted`) it was never mounted, and NodeStage erases it
    /// whole before its first mkfs.
    async fn finish_create(&self, lv: &LvInfo, wipe: bool) -> Result<()> {
        let path = self.lv_path(&lv.name);
        self.make_usable(lv).await?;
        if let (true, Provisioning::Thick(thick)) = (wipe, &self.provisioning) {
            thick
                .wipe_new(&PathBuf::from(format!("/dev/{path}")))
                .await?;
        }
        if lv.has_tag(TAG_CREATING) {
            lvm::delete_tag(&path, TAG_CREATING).await?;
        }
        Ok(())
    }
}

/// Whether an LV is what a cut-short `lvcreate` of a new, empty volume
/// left: a raw block volume's LV still tagged `creating`, or a mount
/// volume's LV that is still `unformatted` (never staged, so never written)
/// and not active. `lvcreate` commits the LV before it activates it, and a
/// thin one can be left unable to activate at all (see
/// [`LvmPool::finish_or_discard`]).
fn cut_short(lv: &LvInfo) -> bool {
    lv.has_tag(TAG_CREATING) || (lv.has_tag(TAG_UNFORMATTED) && !lv.is_active())
}

/// The bodies of [`Pool::create`], [`Pool::delete`] and [`Pool::expand`], which
/// forget GetCapacity's kept answer after each.
impl LvmPool {
    async fn create_volume(&self, req: &CreateRequest) -> Result<Volume> {
        if let Some(why) = req.inode_limit.and_then(|_| self.inode_limit_refused()) {
            return Err(PoolError::UnsupportedParameter(why));
        }
        if let Some(src) = &req.source {
            return self.create_from(req, src).await;
        }
        let name = lv_name(&req.id.key);
        if self.index.get(&name).is_some() {
            // Known: most likely a retry. What lvm says decides.
            if let Some(lv) = self.lookup(&req.id.key).await? {
                if let Some(vol) = self.existing(req, lv).await? {
                    return Ok(vol);
                }
            }
        }
        let _alloc = self.alloc.lock().await;
        let what = format!("volume {}", req.name.as_str());
        let (size, checked) = match self.size_new(req, &name, &what).await? {
            Sizing::Existing(vol) => return Ok(*vol),
            Sizing::New { size, checked } => (size, checked),
        };
        if let Some(vol) = self.lvcreate_new(req, size, checked, &what).await? {
            return Ok(vol);
        }
        self.created(req, size).await
    }

    async fn delete_volume(&self, id: &VolumeId) -> Result<()> {
        if self.remove_if_ours(id).await? {
            return Ok(());
        }
        // Thick pools must look for COW snapshots of the volume, so one
        // `lvs VG` serves both the lookup and that check; thin snapshots do
        // not depend on their origin, so thin pools look up the LV alone
        // (and have no other LVs to check: `all` stays empty).
        let name = lv_name(&id.key);
        let (found, all) = match &self.provisioning {
            Provisioning::Thick(_) => {
                let all = self.all_lvs().await?;
                (all.iter().find(|l| l.name == name).cloned(), all)
            }
            Provisioning::Thin(_) => (self.lookup(&id.key).await?, Vec::new()),
        };
        let found = found.filter(|lv| !self.is_deleted(lv));
        let Some(lv) = found else {
            // Deleted already. A thick delete whose tag or rename committed
            // while its caller saw an error (a killed `lvchange` or
            // `lvrename`) left an LV no wake announced: wake the wiper for it.
            if let Provisioning::Thick(thick) = &self.provisioning {
                let prefix = format!("wp-{}-", id.key);
                if all
                    .iter()
                    .any(|l| l.name.starts_with(&prefix) || l.name == name)
                {
                    thick.wake_wiper();
                }
            }
            return Ok(());
        };
        if !self.is_ours(&lv) {
            return Err(PoolError::ForeignLv {
                path: self.lv_path(&lv.name),
                kind: "volume",
            });
        }
        let lv = self.refuse_if_in_use(id, lv).await?;
        self.refuse_if_snapshotted(id, &lv, &all).await?;
        self.retire(&lv).await
    }

    async fn expand_volume(&self, id: &VolumeId, range: CapacityRange) -> Result<Expanded> {
        let lv = self
            .lookup(&id.key)
            .await?
            .ok_or_else(|| PoolError::VolumeNotFound(id.to_string()))?;
        let size = self.size_for(range).await?;
        if size < lv.size {
            if range.admits(lv.size) {
                return Ok(Expanded {
                    size_bytes: lv.size,
                    node_expansion_required: true,
                });
            }
            return Err(PoolError::SizeRefused(format!(
                "volume {id} is {} bytes; shrinking is not supported",
                lv.size
            )));
        }
        if size > lv.size {
            // The LV is unchanged when the growth does not fit; a lower
            // request that fits succeeds later (expansion-failure recovery).
            match self.grow_lv(&lv, size, &format!("expanding {id}")).await {
                Ok(()) => {}
                // grow_lv compares the whole new size with what the LV may
                // become (its size plus the room left).
                Err(PoolError::NoSpace { free, pool, .. }) => {
                    return Err(PoolError::NoRoomToGrow {
                        id: id.to_string(),
                        size: lv.size,
                        bytes: size,
                        growth: size - lv.size,
                        pool,
                        free: free.saturating_sub(lv.size),
                        most: free,
                    })
                }
                Err(e) => return Err(e),
            }
            self.index.forget(&lv.name);
        }
        Ok(Expanded {
            size_bytes: size,
            node_expansion_required: true,
        })
    }
}

#[async_trait]
impl Pool for LvmPool {
    fn name(&self) -> &PoolName {
        &self.name
    }

    fn storage_id(&self) -> Option<&StorageId> {
        self.storage.as_ref()
    }

    fn backend(&self) -> Backend {
        self.provisioning.backend()
    }

    fn supports(&self, _access: AccessType) -> bool {
        true
    }

    fn expands_on_node(&self) -> bool {
        true
    }

    fn encrypts(&self) -> bool {
        true
    }

    fn limits_io(&self) -> bool {
        true
    }

    /// One `lvchange` swaps the old tag for the new (none left: no limits);
    /// nothing runs when the LV already says so.
    async fn set_io_limits(&self, id: &VolumeId, limits: IoLimits) -> Result<()> {
        let lv = self
            .lookup(&id.key)
            .await?
            .filter(|lv| self.to_volume(lv).is_some())
            .ok_or_else(|| PoolError::VolumeNotFound(id.to_string()))?;
        if io_limits_of(&lv) == limits && lv.tag_value(TAG_IO).is_some() != limits.is_unlimited() {
            return Ok(());
        }
        let prefix = format!("{TAG_IO}=");
        let old: Vec<String> = lv
            .tags
            .iter()
            .filter(|t| t.starts_with(&prefix))
            .cloned()
            .collect();
        let r = lvm::replace_tags(&self.lv_path(&lv.name), &old, io_tag(&limits)).await;
        self.index.forget(&lv.name);
        Ok(r?)
    }

    async fn health(&self) -> Health {
        let (vg, thin) = (self.vg.clone(), self.provisioning.thin_pool().cloned());
        self.health
            .get(HEALTH_TTL, move || Self::check(vg, thin))
            .await
    }

    fn slow_checks(&self) -> SlowChecks {
        self.health.slow()
    }

    fn degraded(&self) -> Option<String> {
        let n = self.health.slow().in_a_row;
        (n >= DEGRADED_AFTER).then(|| {
            format!(
                "its last {n} health checks timed out (lvm is slow: a busy node or disk); \
                 its volumes' RPCs are still served"
            )
        })
    }

    async fn create(&self, req: &CreateRequest) -> Result<Volume> {
        self.offer.after(self.create_volume(req)).await
    }

    async fn delete(&self, id: &VolumeId) -> Result<()> {
        self.offer.after(self.delete_volume(id)).await
    }

    async fn expand(&self, id: &VolumeId, range: CapacityRange) -> Result<Expanded> {
        self.offer.after(self.expand_volume(id, range)).await
    }

    async fn get(&self, id: &VolumeId) -> Result<Option<Volume>> {
        Ok(self
            .lookup_indexed(&id.key)
            .await?
            .and_then(|lv| self.to_volume(&lv)))
    }
    async fn list(&self) -> Result<Vec<Volume>> {
        // Within ListVolumes, pools sharing this VG read it once.
        let epoch = self.index.epoch();
        let all = lvm::lvs_once(&self.vg).await?;
        self.index.replace(epoch, &all);
        Ok(all.iter().filter_map(|lv| self.to_volume(lv)).collect())
    }

    async fn capacity(&self) -> Result<Capacity> {
        let now = self.offered_recently().await?;
        Ok(Capacity {
            available_bytes: now,
            maximum_volume_size: now,
        })
    }

    async fn wipes(&self) -> Result<Option<Wipes>> {
        match &self.provisioning {
            Provisioning::Thick(Thick { wiper: Some(w), .. }) => {
                Ok(Some(w.wipes(&lvm::lvs(&self.vg).await?)))
            }
            // A thin pool zeroes as it provisions: nothing to wipe.
            _ => Ok(None),
        }
    }

    fn snapshots(&self) -> Option<&dyn Snapshots> {
        Some(self)
    }

    /// Thin pools only: a thick snapshot (dm-snapshot's copy-on-write
    /// store) keeps no map of which blocks its origin holds.
    fn block_maps(&self) -> Option<&dyn BlockMaps> {
        match self.provisioning {
            Provisioning::Thin(_) => Some(self as &dyn BlockMaps),
            Provisioning::Thick(_) => None,
        }
    }

    async fn thin_usage(&self) -> Result<Option<ThinUsage>> {
        match &self.provisioning {
            Provisioning::Thin(thin) => thin.usage(&self.vg).await,
            Provisioning::Thick(_) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests;
