//! The create path of a new, empty volume: its size and room, the
//! `lvcreate`, and the volume it made.

use super::super::{CreateRequest, PoolError, Result, Volume};
use super::locks::ThinPoolLocks;
use super::provisioning::{Provisioning, Thin};
use super::*;

/// One lock per thin pool for its creates and their repairs
/// ([`LvmPool::lvcreate`]). It costs nothing: lvm holds the VG's lock for
/// each create anyway.
static THIN_CREATES: ThinPoolLocks = ThinPoolLocks::new();

impl LvmPool {
    /// Runs an `lvcreate` (`args`) in this pool. In a thin pool it runs
    /// under the pool's create lock ([`THIN_CREATES`]), repairing each state
    /// an lvm killed mid-run (the driver's container killed with it) leaves
    /// that fails every later create ([`Thin::repair_component`],
    /// [`Thin::repair_orphan`]) and trying again, twice at most.
    pub(super) async fn lvcreate(&self, args: Vec<String>) -> std::result::Result<(), LvmError> {
        let Provisioning::Thin(thin) = &self.provisioning else {
            return lvm::change(args).await;
        };
        let lock = THIN_CREATES.of(&self.vg, thin.pool.as_str());
        let _creates = lock.lock().await;
        let mut result = lvm::change(args.clone()).await;
        for _ in 0..2 {
            match &result {
                Err(e)
                    if thin.repair_component(&self.vg, e).await?
                        || thin.repair_orphan(&self.vg, e).await? =>
                {
                    result = lvm::change(args.clone()).await;
                }
                _ => break,
            }
        }
        result
    }

    /// [`Thin::repair_component`] in a thin pool; a thick pool has no
    /// components to repair (`false`).
    pub(super) async fn repair_component(
        &self,
        e: &LvmError,
    ) -> std::result::Result<bool, LvmError> {
        match &self.provisioning {
            Provisioning::Thin(thin) => thin.repair_component(&self.vg, e).await,
            Provisioning::Thick(_) => Ok(false),
        }
    }

    /// The size of a new volume, its room checked where the pool checks
    /// (`checked`), or the volume when the `lvs` the check ran finds it
    /// already made (a retry the index missed).
    pub(super) async fn size_new(
        &self,
        req: &CreateRequest,
        name: &str,
        what: &str,
    ) -> Result<Sizing> {
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
        let checked = self.provisioning.checks_room_first(self.reserve);
        let quick = match &self.provisioning {
            Provisioning::Thin(thin) => self.thin_room_without_lvs(thin, name).await,
            Provisioning::Thick(_) => None,
        };
        let size = if let Some((ever, now)) = quick {
            let size = size_in_extents(req.range, self.default_size, self.cached_extent())?;
            self.check_room(size, ever, now, what)?;
            size
        } else if checked {
            let epoch = self.index.epoch();
            let (all, vg) = lvm::lvs_and_vg(&self.vg).await?;
            self.index.replace(epoch, &all);
            self.set_extent(&vg);
            if let Some(lv) = all.iter().find(|l| l.name == name).cloned() {
                if self.is_deleted(&lv) {
                    // Deleted, not yet renamed by the wiper: free the name.
                    self.hand_to_wiper(&lv).await?;
                } else if let Some(vol) = self.existing(req, lv).await? {
                    return Ok(Sizing::Existing(Box::new(vol)));
                }
            }
            let size = size_in_extents(req.range, self.default_size, vg.extent_size.max(512))?;
            let (ever, now) = self.limits_with(&vg, &all)?;
            self.check_room(size, ever, now, what)?;
            size
        } else {
            size_in_extents(req.range, self.default_size, self.cached_extent())?
        };
        Ok(Sizing::New { size, checked })
    }

    /// Runs the `lvcreate` of a new volume. Some(volume): an earlier create
    /// cut short (or still finishing) had made it. Not enough space where
    /// the room was not checked first is answered as the check would have.
    pub(super) async fn lvcreate_new(
        &self,
        req: &CreateRequest,
        size: u64,
        checked: bool,
        what: &str,
    ) -> Result<Option<Volume>> {
        match self.lvcreate(self.create_args(req, size)).await {
            Ok(()) => {}
            Err(LvmError::AlreadyExists(_)) => {
                // A create cut short earlier (or still finishing) made it.
                if let Some(lv) = self.lookup(&req.id.key).await? {
                    if let Some(vol) = self.existing(req, lv).await? {
                        return Ok(Some(vol));
                    }
                }
                // It could not be finished and was removed, or it was a
                // deleted volume, now renamed for the wiper: make it now.
                self.lvcreate(self.create_args(req, size)).await?;
            }
            Err(LvmError::InsufficientSpace(why)) if !checked => {
                // Answer as the check would have: too large for the pool
                // ever, or not now.
                let vg = lvm::vg(&self.vg).await?;
                self.set_extent(&vg);
                let (ever, now) = self.limits_in(&vg).await?;
                self.check_room(size, ever, now, what)?;
                return Err(LvmError::InsufficientSpace(why).into());
            }
            Err(e) => return Err(e.into()),
        }
        Ok(None)
    }

    /// The volume an `lvcreate` just made, finished (a raw block volume's
    /// `creating` tag removed) and in the index.
    pub(super) async fn created(&self, req: &CreateRequest, size: u64) -> Result<Volume> {
        let name = lv_name(&req.id.key);
        let mut lv = if !self.provisioning.shapes_otherwise() {
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
        super::super::matches_request(vol, req, false)
    }
}

/// What sizing a new volume found.
pub(super) enum Sizing {
    /// The volume exists already (the request's repeat).
    Existing(Box<Volume>),
    New {
        size: u64,
        checked: bool,
    },
}

impl LvmPool {
    /// The LV a successful `lvcreate` of [`LvmPool::create_args`] made, as
    /// `lvs` would report it: what the driver asked for is what lvm did
    /// (the size is whole extents already), so it is not read back.
    pub(super) fn just_created(&self, req: &CreateRequest, size: u64) -> LvInfo {
        let name = lv_name(&req.id.key);
        let (attr, pool_lv) = self.provisioning.created_shape();
        LvInfo {
            path: format!("/dev/{}/{name}", self.vg),
            name,
            vg: self.vg.clone(),
            size,
            tags: self.create_tags(req),
            attr: attr.to_owned(),
            pool_lv,
            origin: String::new(),
            data_percent: None,
            metadata_percent: None,
            open: false,
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            // Not known until lvs reports it; nothing reads it from here.
            thin_id: None,
        }
    }
}

impl Thin {
    /// A component of this thin pool active on its own, which `e` (an lvm
    /// failure) names ([`lvm::active_component`]), deactivated; `true`: run
    /// it again. lvm activates `<thin>_tmeta` and `<thin>_tdata` before the
    /// pool; killed between (the driver's container killed with it), it
    /// leaves them active and the pool not, and then refuses to activate the
    /// pool. While the pool is not active, nothing else uses them.
    pub(super) async fn repair_component(
        &self,
        vg: &str,
        e: &LvmError,
    ) -> std::result::Result<bool, LvmError> {
        let Some(component) = lvm::active_component(e) else {
            return Ok(false);
        };
        let thin = self.pool.as_str();
        let ours = [format!("{thin}_tmeta"), format!("{thin}_tdata")];
        if component.vg != vg || !ours.contains(&component.lv) {
            return Ok(false);
        }
        tracing::warn!(vg = %vg, thin, component = %component.lv,
            "deactivating a thin pool's component left active on its own (an lvm killed \
             mid-activation left it), then trying again");
        for lv in ours {
            lvm::deactivate(&format!("{vg}/{lv}")).await?;
        }
        Ok(true)
    }

    /// A thin device no LV has, which `e` (an lvm failure) names
    /// ([`lvm::orphan_thin_device`]), deleted; `true`: run it again. lvm
    /// sends the kernel `create_snap N O` before it commits the VG's
    /// metadata; killed between, it leaves device N, on which every later
    /// snapshot fails. It is deleted only when no LV of the VG has its id
    /// (nothing can be lost: no LV maps it). The caller holds the pool's
    /// create lock ([`LvmPool::lvcreate`]), so no create of this driver can
    /// make a device of that id meanwhile, and none of anyone's can while it
    /// is there.
    async fn repair_orphan(&self, vg: &str, e: &LvmError) -> std::result::Result<bool, LvmError> {
        let Some(id) = lvm::orphan_thin_device(e) else {
            return Ok(false);
        };
        let thin = self.pool.as_str();
        let lvs = lvm::lvs(vg).await?;
        if let Some(lv) = lvs.iter().find(|l| l.thin_id == Some(id)) {
            tracing::error!(vg = %vg, thin, device_id = id, lv = %lv.name,
                "lvcreate met a thin device id that an LV has: not touched");
            return Ok(false);
        }
        // Not readable, or not active: nothing to repair here.
        let Some(target) = super::blockmap::target(vg, &self.pool).await.ok().flatten() else {
            return Ok(false);
        };
        tracing::warn!(vg = %vg, thin, device_id = id,
            "deleting a thin device no LV has (an lvcreate killed mid-run left it), then creating again");
        lvm::delete_thin_device(&target.mapping, id).await?;
        Ok(true)
    }
}
