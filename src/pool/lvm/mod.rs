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
//! - this file: the pool, its [`Pool`] implementation and the create path;
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
//! - `tests`: all of the above on recorded `lvs` JSON, without root or the VM.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{
    AccessType, Capacity, CapacityRange, CreateRequest, Encrypted, Expanded, Health, NodeSide,
    Pool, PoolError, Result, Snapshot, SnapshotRequest, Snapshots, Source, ThinUsage, Usage,
    Volume, Wipes,
};
use crate::blockdev::FsType;
use crate::config::{LvmPoolConfig, DEFAULT_THIN_FULL_PERCENT, DEFAULT_VOLUME_SIZE};
use crate::crypt;
use crate::ids::{PoolName, StorageId, VolumeId, VolumeKey};
use crate::lvm::{self, LvInfo, LvmError, NewLv};

mod args;
mod capacity;
mod health;
mod index;
mod restore;
mod tags;
mod wipe;

use capacity::*;
use health::{HealthCache, HEALTH_TTL};
use index::LvIndex;
use restore::*;
use tags::*;
use wipe::{wipe_lv_name, Wiper};

pub struct LvmPool {
    name: PoolName,
    vg: String,
    thin: Option<String>,
    ratio: f64,
    reserve: u64,
    options: Vec<String>,
    overhead: f64,
    default_fs: FsType,
    default_size: u64,
    /// Thin pools: Data% or Metadata% at or above this makes every volume's
    /// condition abnormal (config `thinFullPercent`).
    full_percent: f64,
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
    /// Thick pools: zeroes deleted LVs before they go (see `wipe.rs`).
    /// Thin pools need none: the thin pool zeroes every block it
    /// provisions (checked in `health.rs`).
    wiper: Option<Wiper>,
    /// `lvm:<VG UUID>`, read once the VG was found at open.
    storage: Option<StorageId>,
    /// The pool's volumes as lvm last reported them (see `index.rs`).
    index: LvIndex,
    /// The VG's extent size as lvm last reported it (set at start; a VG's
    /// extent size is fixed in practice, and every `vgs` refreshes it).
    extent: std::sync::atomic::AtomicU64,
}

impl LvmPool {
    pub async fn open(cfg: LvmPoolConfig) -> Result<Self> {
        let cfg_rate = cfg.wipe_rate_limit;
        let thin = cfg.thin_pool_name().map(str::to_owned);
        let index = LvIndex::new(thin.as_deref());
        let mut pool = LvmPool {
            default_fs: FsType::parse(&cfg.default_fs_type).map_err(|e| {
                PoolError::Misconfigured {
                    pool: cfg.name.to_string(),
                    why: e.to_string(),
                }
            })?,
            name: cfg.name,
            vg: cfg.volume_group,
            thin,
            ratio: cfg.overprovision_ratio.unwrap_or(1.0),
            reserve: cfg.reserve.0,
            options: cfg.lvcreate_options,
            overhead: cfg.capacity_overhead.unwrap_or(1.0),
            default_size: cfg.default_size.map_or(DEFAULT_VOLUME_SIZE, |d| d.0),
            full_percent: cfg.thin_full_percent.unwrap_or(DEFAULT_THIN_FULL_PERCENT),
            alloc: tokio::sync::Mutex::new(()),
            copies: Arc::default(),
            health: HealthCache::default(),
            wiper: None,
            storage: None,
            index,
            extent: std::sync::atomic::AtomicU64::new(0),
        };
        if let Health::Unusable(why) = Self::check(pool.vg.clone(), pool.thin.clone()).await {
            return Err(PoolError::Misconfigured {
                pool: pool.name.to_string(),
                why: why.to_string(),
            });
        }
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
        if pool.thin.is_none() {
            let rate = cfg_rate.map(|r| r.0);
            pool.wiper = Some(Wiper::start(&pool.vg, &pool.name, rate));
        }
        tracing::info!(pool = %pool.name, vg = pool.vg, thin = ?pool.thin, "lvm pool opened");
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
    async fn check(vg_name: String, thin: Option<String>) -> Health {
        let vg = lvm::vg(&vg_name).await;
        let thin = match (&thin, &vg) {
            (Some(thin), Ok(_)) => Some((thin.as_str(), lvm::lv(&vg_name, thin).await)),
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

    /// Activates one of the pool's LVs by name.
    async fn activate_lv(&self, lv: &str) -> Result<()> {
        lvm::activate(&self.lv_path(lv)).await?;
        self.index.forget(lv);
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

    /// The LV a successful `lvcreate` of [`LvmPool::create_args`] made, as
    /// `lvs` would report it: what the driver asked for is what lvm did
    /// (the size is whole extents already), so it is not read back.
    fn just_created(&self, req: &CreateRequest, size: u64) -> LvInfo {
        let name = lv_name(&req.id.key);
        LvInfo {
            path: format!("/dev/{}/{name}", self.vg),
            name,
            vg: self.vg.clone(),
            size,
            tags: self.create_tags(req),
            // lv_attr: a thin or linear volume, writeable, inherited
            // allocation, active; thin volumes zero what they provision.
            attr: match self.thin {
                Some(_) => "Vwi-a-tz--".to_owned(),
                None => "-wi-a-----".to_owned(),
            },
            pool_lv: self.thin.clone().unwrap_or_default(),
            origin: String::new(),
            data_percent: None,
            metadata_percent: None,
            open: false,
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// Thin pools' common delete in one lvm run: `lvremove` of the volume's
    /// LV with lvm itself checking that it is this pool's (its tags, when it
    /// runs; lvm refuses an open LV). A raw block volume's device node
    /// bound somewhere does not open it, so the mount table is read first.
    /// `false`: nothing was removed (gone already, not this pool's, open or
    /// bound): the checked path decides what to answer.
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
        self.index.leaving(&name);
        let res = lvm::remove_selected(&self.lv_path(&name), &select).await;
        match &res {
            Ok(true) => self.index.removed(&name),
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
        let Some(wiper) = &self.wiper else {
            return Ok(lvm::remove(&self.lv_path(&lv.name)).await?);
        };
        let to = wipe_lv_name(&lv.name);
        lvm::rename(&self.vg, &lv.name, &to).await?;
        tracing::info!(
            lv = self.lv_path(&lv.name),
            wiping_as = to,
            "deleted; its blocks are zeroed before they return to the volume group"
        );
        wiper.wake();
        Ok(())
    }

    /// The volume's LV as lvm reports it now (the index learns it too).
    async fn lookup(&self, key: &VolumeKey) -> Result<Option<LvInfo>> {
        let name = lv_name(key);
        let epoch = self.index.epoch();
        let lv = lvm::lv(&self.vg, &name).await?;
        self.index.store(epoch, &name, lv.as_ref());
        Ok(lv)
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
    /// sizes promised from the index. None (ask `lvs`): a thick pool, the
    /// promises not known, `name` among them already, or the pool's target
    /// not active.
    async fn thin_room_without_lvs(&self, name: &str) -> Option<(u64, u64)> {
        let thin = self.thin.clone()?;
        let promised = self.index.promised_without(name)?;
        let vg = self.vg.clone();
        let (size, st) = crate::error::blocking(move || {
            crate::dm::thin_pool(&vg, &thin)
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
            self.ratio,
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
        if !lv.is_active() {
            self.activate_lv(&lv.name).await?;
        }
        if wipe && self.thin.is_none() {
            let dev = std::path::PathBuf::from(format!("/dev/{path}"));
            crate::blockdev::raw::erase_signatures(&dev).await?;
            crate::blockdev::raw::zero_start(&dev).await?;
        }
        if lv.has_tag(TAG_CREATING) {
            lvm::delete_tag(&path, TAG_CREATING).await?;
        }
        Ok(())
    }
}

/// A volume's condition from device-mapper alone: `Some(None)` healthy (its
/// mapping is there, and a thin volume's pool serves below `full` percent),
/// `Some(Some(why))` abnormal, `None` when it cannot tell (no mapping, or not
/// one lvm made: the LV is inactive or gone, which lvs tells apart).
fn dm_condition(vg: &str, lv: &str, thin: Option<&str>, full: f64) -> Option<Option<String>> {
    let st = crate::dm::status(&crate::dm::lv_name(vg, lv)).ok()??;
    if !st.is_lvm() {
        return None;
    }
    if st.targets.iter().any(|t| t.status == "Fail") {
        return Some(Some(format!("LV {vg}/{lv} has failed (device-mapper)")));
    }
    let Some(thin) = thin else {
        return Some(None);
    };
    let (_, pool) = crate::dm::thin_pool(vg, thin).ok()??;
    if pool.data_percent >= full || pool.metadata_percent >= full {
        return Some(Some(format!(
            "thin pool {vg}/{thin} is nearly full (data {:.1}%, metadata {:.1}%; threshold {full}%)",
            pool.data_percent, pool.metadata_percent
        )));
    }
    if !pool.serving() {
        return Some(Some(format!(
            "thin pool {vg}/{thin} is {}{} (device-mapper)",
            pool.mode,
            if pool.needs_check {
                ", needs_check"
            } else {
                ""
            }
        )));
    }
    Some(None)
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

#[async_trait]
impl Pool for LvmPool {
    fn name(&self) -> &PoolName {
        &self.name
    }

    fn storage_id(&self) -> Option<&StorageId> {
        self.storage.as_ref()
    }

    fn backend(&self) -> &'static str {
        if self.thin.is_some() {
            "lvm-thin"
        } else {
            "lvm"
        }
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

    async fn health(&self) -> Health {
        let (vg, thin) = (self.vg.clone(), self.thin.clone());
        self.health
            .get(HEALTH_TTL, move || Self::check(vg, thin))
            .await
    }

    async fn create(&self, req: &CreateRequest) -> Result<Volume> {
        if req.inode_limit.is_some() {
            return Err(PoolError::UnsupportedParameter(format!(
                "inodeLimit applies to dir pools; pool {} is LVM",
                self.name
            )));
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
        // Thin pools (the overprovision ratio is ours to keep) and pools with
        // a reserve or an overhead check the room first, from one `lvs` of
        // the VG that also says whether the LV exists. A thick pool without
        // either leaves the check to lvcreate, which refuses what does not
        // fit (classified below), and learns of an LV the index misses from
        // lvcreate's "already exists".
        //
        // A thin pool whose index knows the sizes its thin LVs promise
        // checks the room without lvm: the thin pool's size and usage from
        // its device-mapper status, the promises from the index (see
        // `index.rs`); an LV of that name already promised (a retry the
        // index missed) takes the `lvs` path.
        let checked = self.thin.is_some() || self.reserve > 0 || self.overhead != 1.0;
        let quick = match checked {
            true => self.thin_room_without_lvs(&name).await,
            false => None,
        };
        let size = if let Some((ever, now)) = quick {
            let size = size_in_extents(req.range, self.default_size, self.cached_extent())?;
            self.check_room(size, ever, now, &what)?;
            size
        } else if checked {
            let epoch = self.index.epoch();
            let (all, vg) = lvm::lvs_and_vg(&self.vg).await?;
            self.index.replace(epoch, &all);
            self.set_extent(&vg);
            if let Some(lv) = all.iter().find(|l| l.name == name).cloned() {
                if let Some(vol) = self.existing(req, lv).await? {
                    return Ok(vol);
                }
            }
            let size = size_in_extents(req.range, self.default_size, vg.extent_size.max(512))?;
            let (ever, now) = self.limits_with(&vg, &all)?;
            self.check_room(size, ever, now, &what)?;
            size
        } else {
            size_in_extents(req.range, self.default_size, self.cached_extent())?
        };
        match lvm::change(self.create_args(req, size)).await {
            Ok(()) => {}
            Err(LvmError::AlreadyExists(_)) => {
                // A create cut short earlier (or still finishing) made it.
                if let Some(lv) = self.lookup(&req.id.key).await? {
                    if let Some(vol) = self.existing(req, lv).await? {
                        return Ok(vol);
                    }
                }
                // It could not be finished and was removed: make it now.
                lvm::change(self.create_args(req, size)).await?;
            }
            Err(LvmError::InsufficientSpace(why)) if !checked => {
                // Answer as the check would have: too large for the pool
                // ever, or not now.
                let vg = lvm::vg(&self.vg).await?;
                self.set_extent(&vg);
                let (ever, now) = self.limits_in(&vg).await?;
                self.check_room(size, ever, now, &what)?;
                return Err(LvmError::InsufficientSpace(why).into());
            }
            Err(e) => return Err(e.into()),
        }
        let mut lv = if self.options.is_empty() {
            // Exactly what this lvcreate made (lvcreateOptions such as
            // stripes may round the size: those are read back).
            self.just_created(req, size)
        } else {
            self.lookup(&req.id.key).await?.ok_or_else(|| {
                PoolError::Inconsistent(format!(
                    "lvcreate succeeded but {}/{name} is missing",
                    self.vg
                ))
            })?
        };
        if lv.has_tag(TAG_CREATING) {
            // A raw block volume: lvcreate activated and wiped it; only the
            // tag goes. (Mount volumes carry `unformatted` instead, which
            // NodeStage removes; see `create_tags`.)
            self.finish_create(&lv, false).await?;
            lv.tags.retain(|t| t != TAG_CREATING);
        }
        if lv.is_active() {
            self.index.put(lv.clone());
            self.index.promise(&lv.name, lv.size);
        } else {
            self.index.forget(&lv.name);
        }
        let vol = self.to_volume(&lv).ok_or_else(|| self.not_ours(&lv.name))?;
        super::matches_request(vol, req, false)
    }

    async fn delete(&self, id: &VolumeId) -> Result<()> {
        if self.thin.is_some() && self.remove_if_ours(id).await? {
            return Ok(());
        }
        // Thick pools must look for COW snapshots of the volume, so one
        // `lvs VG` serves both the lookup and that check; thin snapshots do
        // not depend on their origin, so thin pools look up the LV alone.
        let all = match self.thin {
            None => Some(self.all_lvs().await?),
            Some(_) => None,
        };
        let name = lv_name(&id.key);
        let found = match &all {
            Some(all) => all.iter().find(|l| l.name == name).cloned(),
            None => self.lookup(&id.key).await?,
        };
        let Some(lv) = found else {
            // Deleted already. A thick delete whose rename committed while
            // its caller saw an error (a killed `lvrename`) left a `wp-` LV
            // no wake announced: wake the wiper for it.
            if let (Some(wiper), Some(all)) = (&self.wiper, &all) {
                let prefix = format!("wp-{}-", id.key);
                if all.iter().any(|l| l.name.starts_with(&prefix)) {
                    wiper.wake();
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
        let mut lv = lv;
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
        let (wiping, dependants): (Vec<&LvInfo>, Vec<&LvInfo>) = all
            .iter()
            .flatten()
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
        self.retire(&lv).await
    }

    async fn expand(&self, id: &VolumeId, range: CapacityRange) -> Result<Expanded> {
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
            self.grow_lv(&lv, size, &format!("expanding {id}")).await?;
            self.index.forget(&lv.name);
        }
        Ok(Expanded {
            size_bytes: size,
            node_expansion_required: true,
        })
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
        let now = self.offered().await?;
        Ok(Capacity {
            available_bytes: now,
            maximum_volume_size: now,
        })
    }

    async fn wipes(&self) -> Result<Option<Wipes>> {
        match &self.wiper {
            None => Ok(None),
            Some(w) => Ok(Some(w.wipes(&lvm::lvs(&self.vg).await?))),
        }
    }

    fn snapshots(&self) -> Option<&dyn Snapshots> {
        Some(self)
    }

    async fn thin_usage(&self) -> Result<Option<ThinUsage>> {
        let Some(thin) = &self.thin else {
            return Ok(None);
        };
        Ok(lvm::lv(&self.vg, thin).await?.map(|pool| ThinUsage {
            data_percent: pool.data_percent.unwrap_or(0.0),
            metadata_percent: pool.metadata_percent.unwrap_or(0.0),
        }))
    }
}

#[async_trait]
impl NodeSide for LvmPool {
    fn default_fs_type(&self) -> Option<FsType> {
        Some(self.default_fs)
    }

    fn source(&self, vol: &Volume) -> Result<Source> {
        let key = vol
            .id
            .rsplit_once('.')
            .and_then(|(_, k)| VolumeKey::parse(k))
            .ok_or_else(|| PoolError::Inconsistent(format!("malformed volume id {:?}", vol.id)))?;
        if vol.encryption.is_some() {
            // What is mounted, bound and grown is the opened mapping.
            return Ok(Source::Device(crypt::mapping_path(&crypt::mapping_name(
                &vol.id,
            ))));
        }
        Ok(Source::Device(PathBuf::from(format!(
            "/dev/{}/{}",
            self.vg,
            lv_name(&key)
        ))))
    }

    async fn usage(&self, vol: &Volume) -> Result<Option<Usage>> {
        if vol.access_type != AccessType::Block {
            return Ok(None);
        }
        Ok(Some(Usage {
            total_bytes: vol.size_bytes,
            ..Usage::default()
        }))
    }

    fn device_of(&self, id: &VolumeId) -> Option<PathBuf> {
        Some(PathBuf::from(format!(
            "/dev/{}",
            self.lv_path(&lv_name(&id.key))
        )))
    }

    fn mapping_of(&self, id: &VolumeId) -> Option<String> {
        Some(crypt::mapping_name(&id.to_string()))
    }

    fn encrypted(&self, vol: &Volume) -> Result<Option<Encrypted>> {
        if vol.encryption.is_none() {
            return Ok(None);
        }
        let key = volume_key(vol)?;
        Ok(Some(Encrypted {
            backing: PathBuf::from(format!("/dev/{}", self.lv_path(&lv_name(&key)))),
            mapping: crypt::mapping_name(&vol.id),
        }))
    }

    async fn activate(&self, vol: &Volume) -> Result<()> {
        let key = volume_key(vol)?;
        self.activate_lv(&lv_name(&key)).await?;
        tracing::info!(volume = %vol.id, "activated the volume's LV");
        Ok(())
    }

    async fn filesystem_grown(&self, vol: &Volume) -> Result<()> {
        let key = volume_key(vol)?;
        lvm::delete_tag(&self.lv_path(&lv_name(&key)), TAG_GROW).await?;
        self.index.forget(&lv_name(&key));
        Ok(())
    }

    async fn filesystem_made(&self, vol: &Volume) -> Result<()> {
        let name = lv_name(&volume_key(vol)?);
        let done = lvm::delete_tag(&self.lv_path(&name), TAG_UNFORMATTED).await;
        // NodeStage erases a volume the index says is `unformatted`, so the
        // entry must never keep a tag lvm no longer has: mirror the change,
        // or (lvchange failed, and may have committed) forget the entry.
        match (&done, self.index.get(&name)) {
            (Ok(()), Some(mut lv)) => {
                lv.tags.retain(|t| t != TAG_UNFORMATTED);
                self.index.put(lv);
            }
            _ => self.index.forget(&name),
        }
        done?;
        Ok(())
    }

    async fn condition(&self, vol: &Volume) -> Result<Option<String>> {
        let Some((_, key)) = vol.id.rsplit_once('.') else {
            return Ok(None);
        };
        let Some(key) = VolumeKey::parse(key) else {
            return Ok(None);
        };
        // The condition is the LV's state now, never the index's: first as
        // device-mapper has it (no process: kubelet asks about every volume
        // every minute); lvs only when that cannot tell (no mapping).
        let (vg, name, thin) = (self.vg.clone(), lv_name(&key), self.thin.clone());
        let full = self.full_percent;
        let from_dm = crate::error::blocking(move || {
            Ok::<_, crate::error::IoError>(dm_condition(&vg, &name, thin.as_deref(), full))
        })
        .await;
        if let Ok(Some(answer)) = from_dm {
            return Ok(answer);
        }
        let Some(lv) = self.lookup(&key).await? else {
            return Ok(Some(format!("LV {}/{} is missing", self.vg, lv_name(&key))));
        };
        if !lv.is_active() {
            return Ok(Some(format!("LV {}/{} is not active", self.vg, lv.name)));
        }
        if let Some(thin) = &self.thin {
            if let Some(pool) = lvm::lv(&self.vg, thin).await? {
                if pool.data_percent.unwrap_or(0.0) >= self.full_percent
                    || pool.metadata_percent.unwrap_or(0.0) >= self.full_percent
                {
                    return Ok(Some(format!(
                        "thin pool {}/{thin} is nearly full (data {:.1}%, metadata {:.1}%; threshold {}%)",
                        self.vg,
                        pool.data_percent.unwrap_or(0.0),
                        pool.metadata_percent.unwrap_or(0.0),
                        self.full_percent
                    )));
                }
            }
        }
        Ok(None)
    }
}

#[async_trait]
impl Snapshots for LvmPool {
    async fn create_snapshot(&self, req: &SnapshotRequest) -> Result<Snapshot> {
        let name = snap_lv_name(&req.id.key);
        if let Some(lv) = lvm::lv(&self.vg, &name).await? {
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
        if self.thin.is_none() {
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
        match lvm::change(args).await {
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

    async fn delete_snapshot(&self, id: &VolumeId) -> Result<()> {
        let name = snap_lv_name(&id.key);
        let Some(lv) = lvm::lv(&self.vg, &name).await? else {
            return Ok(());
        };
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

#[cfg(test)]
mod tests;
