//! LVM pools: each volume is a logical volume `lv-<key>` in the pool's volume
//! group, thick or thin (from the pool's thin pool).
//!
//! `lvs` is the ground truth; the driver keeps no record of its own. Every LV it
//! creates carries tags: `localvol` (ours), `localvol.pool=<pool>` (several pools
//! may share a VG), `localvol.name=<CSI name, tag-encoded>` and
//! `localvol.access=mount|block`. A create that finds its LV already there
//! (a retry, or a crash mid-create) recognises it by those tags instead of
//! making a second one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt, Shared};

use async_trait::async_trait;

use super::{
    AccessType, Capacity, CapacityRange, ContentSource, CreateRequest, Expanded, Pool, Snapshot,
    SnapshotRequest, Source, Usage, Volume,
};
use crate::blockdev::FsType;
use crate::config::{LvmPoolConfig, DEFAULT_VOLUME_SIZE};
use crate::error::{Error, Result};
use crate::ids::{PoolName, VolumeId, VolumeKey};
use crate::lvm::{self, LvInfo, LvmError};

const TAG_OWNER: &str = "localvol";
const TAG_POOL: &str = "localvol.pool";
const TAG_NAME: &str = "localvol.name";
const TAG_ACCESS: &str = "localvol.access";
/// `volume` or `snapshot` (LVs without it are volumes).
const TAG_KIND: &str = "localvol.kind";
/// Snapshots: id of the volume they copy. Volumes: the snapshot or volume they
/// were created from.
const TAG_SOURCE: &str = "localvol.source";
/// Snapshots: size of the source volume when taken.
const TAG_SIZE: &str = "localvol.size";
/// A thick volume whose copy from its source has not finished: it stays
/// invisible until a (retried) create completes the copy.
const TAG_RESTORING: &str = "localvol.restoring";
/// The volume's filesystem is smaller than the LV (restored into a larger one).
const TAG_GROW: &str = "localvol.grow";
/// A volume whose `lvcreate` has not been seen to finish: it stays invisible
/// until a (retried) create completes it (see [`LvmPool::finish_create`]).
const TAG_CREATING: &str = "localvol.creating";
/// A thin pool fuller than this makes its volumes' condition abnormal.
const THIN_FULL_PERCENT: f64 = 90.0;

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
    /// Block copies of thick restores and clones in flight, by target LV. They
    /// run in tasks of their own: a CreateVolume cancelled by its caller's
    /// timeout does not kill the copy, and the retried call joins it.
    copies: Arc<Mutex<HashMap<String, SharedCopy>>>,
    /// Held from the capacity check through `lvcreate`/`lvextend`, so
    /// concurrent creates cannot together overfill the pool. LVM serialises
    /// changes to a VG with its own lock anyway, so this costs no parallelism.
    alloc: tokio::sync::Mutex<()>,
}

type SharedCopy = Shared<BoxFuture<'static, std::result::Result<(), String>>>;

/// Copies a source LV's data into a restoring LV, then clears its
/// `restoring` tag: only a complete copy becomes a visible volume.
async fn copy_and_mark(vg: String, from: String, to: String, bytes: u64) -> Result<()> {
    // `dd of=` creates a plain file where no device node is (an inactive
    // LV): the copy must land on the LV or fail.
    let target = PathBuf::from(format!("/dev/{vg}/{to}"));
    let is_dev = crate::error::blocking(move || {
        use std::os::unix::fs::FileTypeExt;
        Ok(std::fs::metadata(&target).is_ok_and(|m| m.file_type().is_block_device()))
    })
    .await?;
    if !is_dev {
        return Err(Error::Internal(format!(
            "/dev/{vg}/{to} is not a block device (LV not active?)"
        )));
    }
    crate::command::Cmd::new("dd")
        .arg(format!("if=/dev/{vg}/{from}"))
        .arg(format!("of=/dev/{vg}/{to}"))
        .args([
            "bs=4M",
            "iflag=count_bytes",
            "oflag=direct",
            "conv=fsync,notrunc",
            "status=none",
        ])
        .arg(format!("count={bytes}"))
        .timeout(std::time::Duration::from_secs(24 * 3600))
        .run()
        .await?;
    lvm::delete_tag(&format!("{vg}/{to}"), TAG_RESTORING).await?;
    Ok(())
}

fn lv_name(key: &VolumeKey) -> String {
    format!("lv-{key}")
}

fn snap_lv_name(key: &VolumeKey) -> String {
    format!("sn-{key}")
}

impl LvmPool {
    pub async fn open(cfg: LvmPoolConfig) -> Result<Self> {
        let pool = LvmPool {
            default_fs: FsType::parse(&cfg.default_fs_type)?,
            name: cfg.name,
            vg: cfg.volume_group,
            thin: cfg.thin_pool,
            ratio: cfg.overprovision_ratio.unwrap_or(1.0),
            reserve: cfg.reserve.0,
            options: cfg.lvcreate_options,
            overhead: cfg.capacity_overhead.unwrap_or(1.0),
            default_size: cfg.default_size.map_or(DEFAULT_VOLUME_SIZE, |d| d.0),
            alloc: tokio::sync::Mutex::new(()),
            copies: Arc::default(),
        };
        pool.check()
            .await
            .map_err(|e| Error::FailedPrecondition(format!("pool {}: {e}", pool.name)))?;
        tracing::info!(pool = %pool.name, vg = pool.vg, thin = ?pool.thin, "lvm pool opened");
        Ok(pool)
    }

    fn is_ours(&self, lv: &LvInfo) -> bool {
        lv.has_tag(TAG_OWNER) && lv.tag_value(TAG_POOL) == Some(self.name.as_str())
    }

    /// The volume an LV of this pool represents (None for other LVs).
    fn to_volume(&self, lv: &LvInfo) -> Option<Volume> {
        if !self.is_ours(lv) || lv.has_tag(TAG_RESTORING) || lv.has_tag(TAG_CREATING) {
            return None;
        }
        let key = VolumeKey::parse(lv.name.strip_prefix("lv-")?)?;
        let name = lvm::decode_tag_value(lv.tag_value(TAG_NAME)?)?;
        let access_type = match lv.tag_value(TAG_ACCESS)? {
            "block" => AccessType::Block,
            _ => AccessType::Mount,
        };
        Some(Volume {
            version: 1,
            id: VolumeId {
                pool: self.name.clone(),
                key,
            }
            .to_string(),
            name,
            pool: self.name.to_string(),
            size_bytes: lv.size,
            access_type,
            created_unix: 0,
            parameters: Default::default(),
            project_id: None,
            inode_limit: None,
            grow_filesystem: lv.has_tag(TAG_GROW),
            inactive: !lv.is_active(),
        })
    }

    /// The snapshot an LV of this pool represents (None for other LVs).
    fn to_snapshot(&self, lv: &LvInfo) -> Option<Snapshot> {
        if !self.is_ours(lv) || lv.tag_value(TAG_KIND) != Some("snapshot") {
            return None;
        }
        let key = VolumeKey::parse(lv.name.strip_prefix("sn-")?)?;
        Some(Snapshot {
            id: VolumeId {
                pool: self.name.clone(),
                key,
            }
            .to_string(),
            name: lvm::decode_tag_value(lv.tag_value(TAG_NAME)?)?,
            source_volume_id: lv.tag_value(TAG_SOURCE)?.to_owned(),
            size_bytes: lv.tag_value(TAG_SIZE)?.parse().ok()?,
            created_unix: lv.created_unix,
            ready: !is_invalid_cow(lv),
        })
    }

    fn tags(&self, kind: &str, name: &str, access: AccessType) -> Vec<String> {
        let access = match access {
            AccessType::Block => "block",
            AccessType::Mount => "mount",
        };
        vec![
            TAG_OWNER.to_owned(),
            format!("{TAG_POOL}={}", self.name),
            format!("{TAG_KIND}={kind}"),
            format!("{TAG_NAME}={}", lvm::encode_tag_value(name)),
            format!("{TAG_ACCESS}={access}"),
        ]
    }

    fn lv_path(&self, lv: &str) -> String {
        format!("{}/{lv}", self.vg)
    }

    /// The LV holding a content source, and the size of the data it holds.
    async fn source_lv(&self, src: &ContentSource) -> Result<(LvInfo, u64)> {
        match src {
            ContentSource::Snapshot(id) => {
                let lv = lvm::lv(&self.vg, &snap_lv_name(&id.key)).await?;
                let snap = lv.as_ref().and_then(|l| self.to_snapshot(l));
                match (lv, snap) {
                    // A COW snapshot whose area overflowed: dm-snapshot
                    // dropped it, its reads fail.
                    (Some(_), Some(snap)) if !snap.ready => {
                        Err(Error::FailedPrecondition(format!(
                            "snapshot {id} is invalid: its copy-on-write space (snapshotSize) \
                             filled up; it cannot be restored"
                        )))
                    }
                    (Some(lv), Some(snap)) => Ok((lv, snap.size_bytes)),
                    _ => Err(Error::NotFound(format!("snapshot {id} does not exist"))),
                }
            }
            ContentSource::Volume(id) => {
                let lv = self.lookup(&id.key).await?;
                match lv.filter(|l| self.to_volume(l).is_some()) {
                    Some(lv) => {
                        let size = lv.size;
                        Ok((lv, size))
                    }
                    None => Err(Error::NotFound(format!(
                        "source volume {id} does not exist"
                    ))),
                }
            }
        }
    }

    /// Runs, or joins, the copy into a restoring LV, and waits for it.
    async fn finish_copy(&self, from: String, to: String, bytes: u64) -> Result<()> {
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
        copy.await
            .map_err(|e| Error::Internal(format!("copying into {}: {e}", self.lv_path(&to))))
    }

    /// Creates a volume from a snapshot or another volume. Thin pools: a thin
    /// snapshot of the source (instant, shares blocks), tagged `creating`
    /// until it is active and at its full size. Thick pools: a new LV and a
    /// block copy of the source into it, tagged `restoring` until the copy is
    /// complete. Either tag keeps the LV invisible (never listed, staged or
    /// returned), so a create cut short by a crash is finished by the retried
    /// create, or, when its source is gone by then, removed.
    async fn create_from(&self, req: &CreateRequest, src: &ContentSource) -> Result<Volume> {
        let src_id = match src {
            ContentSource::Snapshot(id) | ContentSource::Volume(id) => id.to_string(),
        };
        let mut lv = self.lookup(&req.id.key).await?;
        if let Some(lv) = &lv {
            self.check_restore_of(lv, req, &src_id)?;
            if !is_unfinished(lv) {
                // Complete: a retry answers without needing the source (it
                // may have been deleted since).
                return self.restored_volume(lv, req);
            }
        }
        let (src_lv, src_size) = match self.source_lv(src).await {
            Ok(found) => found,
            Err(e @ (Error::NotFound(_) | Error::FailedPrecondition(_))) => {
                if let Some(lv) = &lv {
                    // Half made, and its source is gone or unreadable:
                    // nothing can finish it, and nobody was ever given it.
                    self.remove_unfinished(lv).await?;
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if req.range.limit > 0 && req.range.limit < src_size {
            return Err(Error::OutOfRange(format!(
                "limit_bytes {} is smaller than the source ({src_size} bytes)",
                req.range.limit
            )));
        }
        if req.range.required > 0 && req.range.required < src_size {
            return Err(Error::OutOfRange(format!(
                "required_bytes {} is smaller than the source ({src_size} bytes)",
                req.range.required
            )));
        }
        let size = if req.range.required == 0 {
            src_size
        } else {
            self.size_for(req.range).await?
        };
        let name = lv_name(&req.id.key);
        if lv.is_none() {
            let _alloc = self.alloc.lock().await;
            let (ever, now) = self.limits().await?;
            self.check_room(size, ever, now, &format!("volume {}", req.name.as_str()))?;
            match lvm::change(self.create_from_args(req, &src_id, &src_lv, src_size, size)).await {
                // AlreadyExists: an lvcreate of a create cut short got there
                // first (it may still be running): finished below.
                Ok(()) | Err(LvmError::AlreadyExists(_)) => {}
                Err(e) => return Err(e.into()),
            }
            let made = self.lookup(&req.id.key).await?.ok_or_else(|| {
                Error::Internal(format!("LV {} missing after lvcreate", self.lv_path(&name)))
            })?;
            self.check_restore_of(&made, req, &src_id)?;
            lv = Some(made);
        }
        let mut lv = lv.expect("looked up or created above");
        if !is_unfinished(&lv) {
            return self.restored_volume(&lv, req);
        }
        if !lv.is_active() {
            self.activate_lv(&lv.name).await?;
        }
        if lv.has_tag(TAG_RESTORING) {
            let ours = self
                .copies
                .lock()
                .expect("copies lock poisoned")
                .contains_key(&name);
            let target = format!("of=/dev/{}", self.lv_path(&name));
            let running = !ours && {
                let t = target.clone();
                crate::error::blocking(move || Ok(copy_running(Path::new("/proc"), &t))).await?
            };
            if !ours && (lv.open || running) {
                // A hidden LV is opened by nothing but a copy, and not by
                // one of this process: a copy a killed driver left running
                // (`running` also sees one that has not opened it yet).
                // A second writer could end after this one and overwrite
                // what the volume's user wrote meanwhile: wait for it.
                return Err(Error::Aborted(format!(
                    "LV {} is still open by a copy from before a restart; retry when it has ended",
                    self.lv_path(&name)
                )));
            }
            if !src_lv.is_active() {
                self.activate_lv(&src_lv.name).await?;
            }
            // Copy the whole source, so a larger target keeps the source's
            // filesystem intact (it is grown at stage). The copy clears the
            // `restoring` tag when it is complete.
            self.finish_copy(src_lv.name.clone(), name.clone(), src_size)
                .await?;
        }
        if lv.has_tag(TAG_CREATING) {
            if lv.size < size {
                // Thin: the snapshot has its source's size.
                self.grow_lv(&lv, size, &format!("volume {}", req.name.as_str()))
                    .await?;
            }
            lvm::delete_tag(&self.lv_path(&name), TAG_CREATING).await?;
        }
        lv = self
            .lookup(&req.id.key)
            .await?
            .ok_or_else(|| Error::Internal(format!("LV {} vanished", self.lv_path(&name))))?;
        if is_unfinished(&lv) {
            return Err(Error::Internal(format!(
                "LV {} is still marked unfinished after its create completed",
                self.lv_path(&name)
            )));
        }
        self.restored_volume(&lv, req)
    }

    /// `lvcreate` arguments for a volume made from `src_lv`: a thin snapshot
    /// (thin pools) or a new LV for a block copy (thick pools), each tagged
    /// as unfinished.
    fn create_from_args(
        &self,
        req: &CreateRequest,
        src_id: &str,
        src_lv: &LvInfo,
        src_size: u64,
        size: u64,
    ) -> Vec<String> {
        let mut tags = self.tags("volume", req.name.as_str(), req.access_type);
        tags.push(format!("{TAG_SOURCE}={src_id}"));
        if size > src_size {
            tags.push(TAG_GROW.to_owned());
        }
        let mut args: Vec<String> = vec!["lvcreate".into(), "--yes".into()];
        args.extend([
            "--activate".into(),
            "y".into(),
            "--name".into(),
            lv_name(&req.id.key),
        ]);
        match &self.thin {
            Some(_) => {
                // A thin snapshot of the source, activated normally.
                tags.push(TAG_CREATING.to_owned());
                args.extend([
                    "--snapshot".into(),
                    "--setactivationskip".into(),
                    "n".into(),
                ]);
                for t in tags {
                    args.extend(["--addtag".into(), t]);
                }
                args.push(self.lv_path(&src_lv.name));
            }
            None => {
                tags.push(TAG_RESTORING.to_owned());
                args.extend([
                    "--wipesignatures".into(),
                    "y".into(),
                    "--zero".into(),
                    "y".into(),
                ]);
                args.extend(["--size".into(), format!("{size}b")]);
                for t in tags {
                    args.extend(["--addtag".into(), t]);
                }
                args.extend(self.options.iter().cloned());
                args.push(self.vg.clone());
            }
        }
        args
    }

    /// Whether an existing LV is (or is becoming) the volume this create
    /// asks for: this pool's, for this name, from this source.
    fn check_restore_of(&self, lv: &LvInfo, req: &CreateRequest, src_id: &str) -> Result<()> {
        if !self.is_ours(lv) || lv.tag_value(TAG_KIND) == Some("snapshot") {
            return Err(Error::AlreadyExists(format!(
                "LV {} exists and is not this driver's",
                self.lv_path(&lv.name)
            )));
        }
        let name = lv.tag_value(TAG_NAME).and_then(lvm::decode_tag_value);
        if name.as_deref() != Some(req.name.as_str()) {
            return Err(Error::AlreadyExists(format!(
                "LV {} belongs to another name that hashes to the same id",
                self.lv_path(&lv.name)
            )));
        }
        if lv.tag_value(TAG_SOURCE) != Some(src_id) {
            return Err(Error::AlreadyExists(format!(
                "volume {:?} already exists with other content",
                req.name.as_str()
            )));
        }
        Ok(())
    }

    /// The volume a complete restore or clone is, if it answers `req`.
    fn restored_volume(&self, lv: &LvInfo, req: &CreateRequest) -> Result<Volume> {
        let vol = self.to_volume(lv).ok_or_else(|| {
            Error::AlreadyExists(format!(
                "LV {} exists and is not this driver's",
                self.lv_path(&lv.name)
            ))
        })?;
        super::matches_request(vol, req, false)
    }

    /// Extends `lv` to `size` bytes if the pool has room for the difference
    /// (checked and done under the allocation lock).
    async fn grow_lv(&self, lv: &LvInfo, size: u64, what: &str) -> Result<()> {
        let _alloc = self.alloc.lock().await;
        let (ever, now) = self.limits().await?;
        self.check_room(size, ever, now.saturating_add(lv.size), what)?;
        lvm::change(vec![
            "lvextend".into(),
            "--size".into(),
            format!("{size}b"),
            self.lv_path(&lv.name),
        ])
        .await?;
        Ok(())
    }

    /// Activates one of the pool's LVs by name.
    async fn activate_lv(&self, lv: &str) -> Result<()> {
        lvm::activate(&self.lv_path(lv)).await?;
        Ok(())
    }

    /// Removes a restore or clone that was cut short and cannot be finished.
    async fn remove_unfinished(&self, lv: &LvInfo) -> Result<()> {
        debug_assert!(is_unfinished(lv));
        tracing::warn!(
            lv = self.lv_path(&lv.name),
            "removing an unfinished restore or clone: its source is gone or invalid"
        );
        match lvm::change(vec![
            "lvremove".into(),
            "--yes".into(),
            self.lv_path(&lv.name),
        ])
        .await
        {
            Ok(()) | Err(LvmError::NotFound(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn lookup(&self, key: &VolumeKey) -> Result<Option<LvInfo>> {
        Ok(lvm::lv(&self.vg, &lv_name(key)).await?)
    }

    /// Extent size of the VG: LV sizes are whole extents.
    async fn extent(&self) -> Result<u64> {
        Ok(lvm::vg(&self.vg).await?.extent_size.max(512))
    }

    /// (largest volume this pool could ever hold, largest creatable now).
    async fn limits(&self) -> Result<(u64, u64)> {
        self.limits_in(&lvm::vg(&self.vg).await?).await
    }

    /// [`LvmPool::limits`] with the VG's report already at hand.
    async fn limits_in(&self, vg: &lvm::VgInfo) -> Result<(u64, u64)> {
        match &self.thin {
            None => {
                let ever = ((vg.size.saturating_sub(self.reserve)) as f64 / self.overhead) as u64;
                let now = ((vg.free.saturating_sub(self.reserve)) as f64 / self.overhead) as u64;
                Ok((
                    round_down(ever, vg.extent_size),
                    round_down(now, vg.extent_size),
                ))
            }
            Some(thin) => {
                let lvs = lvm::lvs(&self.vg).await?;
                let pool = lvs
                    .iter()
                    .find(|l| &l.name == thin && l.is_thin_pool())
                    .ok_or_else(|| {
                        Error::Unavailable(format!("thin pool {}/{thin} is missing", self.vg))
                    })?;
                let virtual_total = ((pool.size as f64) * self.ratio) as u64;
                let promised: u64 = lvs
                    .iter()
                    .filter(|l| l.is_thin_volume() && &l.pool_lv == thin)
                    .map(|l| l.size)
                    .sum();
                let ever = virtual_total.saturating_sub(self.reserve);
                let now = ever.saturating_sub(promised);
                Ok((
                    round_down(ever, vg.extent_size),
                    round_down(now, vg.extent_size),
                ))
            }
        }
    }

    /// The size for a request, in whole extents, within the range.
    async fn size_for(&self, range: CapacityRange) -> Result<u64> {
        size_in_extents(range, self.default_size, self.extent().await?)
    }

    fn check_room(&self, size: u64, ever: u64, now: u64, what: &str) -> Result<()> {
        if size > ever {
            return Err(Error::OutOfRange(format!(
                "{what}: {size} bytes is more than pool {} can ever hold ({ever} bytes)",
                self.name
            )));
        }
        if size > now {
            return Err(Error::ResourceExhausted(format!(
                "{what}: pool {} has room for {now} bytes, {size} requested",
                self.name
            )));
        }
        Ok(())
    }

    /// Completes a volume whose `lvcreate` may have been cut short: killed
    /// with the driver (a pod's cgroup kill, the OOM killer, a power cut)
    /// after committing the LV but before activating or wiping it. Activates
    /// it and, when `wipe`, removes every signature and zeroes its start (what
    /// `lvcreate --wipesignatures y --zero y` does after activation), then
    /// drops the `creating` tag: a crash never hands out an inactive LV or a
    /// deleted volume's filesystem. Nothing can have been written to the LV:
    /// its create has not answered yet.
    async fn finish_create(&self, lv: &LvInfo, wipe: bool) -> Result<()> {
        let path = self.lv_path(&lv.name);
        if !lv.is_active() {
            self.activate_lv(&lv.name).await?;
        }
        if wipe && self.thin.is_none() {
            let dev = format!("/dev/{path}");
            crate::command::Cmd::new("wipefs")
                .args(["--all", "--force", "--quiet"])
                .arg(&dev)
                .run()
                .await?;
            crate::command::Cmd::new("dd")
                .args(["if=/dev/zero", "bs=4096", "count=1", "oflag=direct"])
                .args(["conv=fsync,notrunc", "status=none"])
                .arg(format!("of={dev}"))
                .run()
                .await?;
        }
        lvm::delete_tag(&path, TAG_CREATING).await?;
        Ok(())
    }

    fn create_args(&self, req: &CreateRequest, size: u64) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "lvcreate".into(),
            "--yes".into(),
            "--activate".into(),
            "y".into(),
        ];
        a.extend(["--name".into(), lv_name(&req.id.key)]);
        let mut tags = self.tags("volume", req.name.as_str(), req.access_type);
        tags.push(TAG_CREATING.to_owned());
        for tag in tags {
            a.extend(["--addtag".into(), tag]);
        }
        match &self.thin {
            Some(thin) => {
                a.extend([
                    "--virtualsize".into(),
                    format!("{size}b"),
                    "--thin".into(),
                    format!("{}/{thin}", self.vg),
                ]);
            }
            None => {
                // Wipe old signatures and zero the start: a new LV must never show
                // a filesystem left on its extents by a deleted volume.
                a.extend([
                    "--wipesignatures".into(),
                    "y".into(),
                    "--zero".into(),
                    "y".into(),
                ]);
                a.extend(["--size".into(), format!("{size}b")]);
                a.extend(self.options.iter().cloned());
                a.push(self.vg.clone());
            }
        }
        a
    }
}

fn volume_key(vol: &Volume) -> Result<VolumeKey> {
    vol.id
        .rsplit_once('.')
        .and_then(|(_, k)| VolumeKey::parse(k))
        .ok_or_else(|| Error::Internal(format!("malformed volume id {:?}", vol.id)))
}

/// A volume whose create has not completed (see [`TAG_CREATING`],
/// [`TAG_RESTORING`]).
fn is_unfinished(lv: &LvInfo) -> bool {
    lv.has_tag(TAG_CREATING) || lv.has_tag(TAG_RESTORING)
}

/// The size of a volume for `range`, in whole extents of `extent` bytes:
/// `required` rounded up, or (only a limit) the default or the most whole
/// extents under the limit; OUT_OF_RANGE when no whole-extent size fits.
fn size_in_extents(range: CapacityRange, default: u64, extent: u64) -> Result<u64> {
    let want = match (range.required, range.limit) {
        (0, 0) => default,
        (0, limit) => default.min(round_down(limit, extent)).max(1),
        (req, _) => req,
    };
    let size = want.div_ceil(extent).saturating_mul(extent);
    if range.limit > 0 && size > range.limit {
        return Err(Error::OutOfRange(format!(
            "no whole number of extents ({extent} bytes each) fits between required_bytes {} and limit_bytes {}",
            range.required, range.limit
        )));
    }
    Ok(size)
}

/// Whether a `dd` with the argument `target` (`of=/dev/VG/LV`) runs, as seen
/// in `proc`'s `<pid>/cmdline` files: a copy a killed driver left behind.
fn copy_running(proc: &Path, target: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return false;
    };
    entries.flatten().any(|e| {
        let is_pid = e
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        is_pid
            && std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                let mut args = c.split(|&b| b == 0);
                let is_dd = args
                    .next()
                    .is_some_and(|a0| a0 == b"dd" || a0.ends_with(b"/dd"));
                is_dd && args.any(|a| a == target.as_bytes())
            })
    })
}

/// A COW snapshot whose area overflowed: dm-snapshot dropped it, and its
/// reads fail (`I` in the state column of lv_attr).
fn is_invalid_cow(lv: &LvInfo) -> bool {
    lv.is_cow_snapshot() && lv.attr.chars().nth(4) == Some('I')
}

fn round_down(v: u64, unit: u64) -> u64 {
    v.checked_div(unit).map_or(v, |n| n * unit)
}

#[async_trait]
impl Pool for LvmPool {
    fn name(&self) -> &PoolName {
        &self.name
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

    fn default_fs_type(&self) -> Option<FsType> {
        Some(self.default_fs)
    }

    async fn check(&self) -> Result<()> {
        lvm::vg(&self.vg).await.map_err(|e| match e {
            LvmError::NotFound(_) => {
                Error::Unavailable(format!("volume group {} not found", self.vg))
            }
            other => other.into(),
        })?;
        if let Some(thin) = &self.thin {
            match lvm::lv(&self.vg, thin).await? {
                Some(lv) if lv.is_thin_pool() => {}
                Some(_) => {
                    return Err(Error::Unavailable(format!(
                        "{}/{thin} is not a thin pool",
                        self.vg
                    )))
                }
                None => {
                    return Err(Error::Unavailable(format!(
                        "thin pool {}/{thin} not found",
                        self.vg
                    )))
                }
            }
        }
        Ok(())
    }

    async fn create(&self, req: &CreateRequest) -> Result<Volume> {
        if req.inode_limit.is_some() {
            return Err(Error::InvalidArgument(format!(
                "inodeLimit applies to dir pools; pool {} is LVM",
                self.name
            )));
        }
        if let Some(src) = &req.source {
            return self.create_from(req, src).await;
        }
        let encoded_name = lvm::encode_tag_value(req.name.as_str());
        if let Some(mut lv) = self.lookup(&req.id.key).await? {
            if self.is_ours(&lv) && lv.tag_value(TAG_SOURCE).is_some() {
                // A restore or clone (complete or not) is not the empty
                // volume this request asks for.
                return Err(Error::AlreadyExists(format!(
                    "volume {:?} already exists, made from {}; this request has no content source",
                    req.name.as_str(),
                    lv.tag_value(TAG_SOURCE).unwrap_or_default()
                )));
            }
            if self.is_ours(&lv)
                && lv.has_tag(TAG_CREATING)
                && lv.tag_value(TAG_NAME) == Some(encoded_name.as_str())
            {
                // An earlier create of this volume was cut short: finish it.
                self.finish_create(&lv, true).await?;
                lv.tags.retain(|t| t != TAG_CREATING);
            }
            return match self.to_volume(&lv) {
                Some(v) => super::matches_request(v, req, false),
                None => Err(Error::AlreadyExists(format!(
                    "LV {}/{} exists and is not this driver's",
                    self.vg, lv.name
                ))),
            };
        }
        let _alloc = self.alloc.lock().await;
        // One vgs for both the extent size and the room (each lvm run costs
        // a process start and a device scan).
        let vg = lvm::vg(&self.vg).await?;
        let size = size_in_extents(req.range, self.default_size, vg.extent_size.max(512))?;
        let (ever, now) = self.limits_in(&vg).await?;
        self.check_room(size, ever, now, &format!("volume {}", req.name.as_str()))?;
        let finished = match lvm::change(self.create_args(req, size)).await {
            Ok(()) => true,
            // A create cut short earlier (or still finishing) made it: check it below.
            Err(LvmError::AlreadyExists(_)) => false,
            Err(e) => return Err(e.into()),
        };
        let mut lv = self.lookup(&req.id.key).await?.ok_or_else(|| {
            Error::Internal(format!(
                "lvcreate succeeded but {}/{} is missing",
                self.vg,
                lv_name(&req.id.key)
            ))
        })?;
        if self.is_ours(&lv)
            && lv.has_tag(TAG_CREATING)
            && lv.tag_value(TAG_NAME) == Some(encoded_name.as_str())
        {
            // After our lvcreate (it activated and wiped the LV) only the tag
            // goes; an LV another, cut-short lvcreate made is finished in full.
            self.finish_create(&lv, !finished).await?;
            lv.tags.retain(|t| t != TAG_CREATING);
        }
        let vol = self.to_volume(&lv).ok_or_else(|| {
            Error::AlreadyExists(format!(
                "LV {}/{} exists and is not this driver's",
                self.vg, lv.name
            ))
        })?;
        super::matches_request(vol, req, false)
    }

    async fn delete(&self, id: &VolumeId) -> Result<()> {
        // Thick pools must look for COW snapshots of the volume, so one
        // `lvs VG` serves both the lookup and that check; thin snapshots do
        // not depend on their origin, so thin pools look up the LV alone.
        let all = match self.thin {
            None => Some(lvm::lvs(&self.vg).await?),
            Some(_) => None,
        };
        let name = lv_name(&id.key);
        let found = match &all {
            Some(all) => all.iter().find(|l| l.name == name).cloned(),
            None => self.lookup(&id.key).await?,
        };
        let Some(lv) = found else {
            return Ok(());
        };
        if !self.is_ours(&lv) {
            return Err(Error::FailedPrecondition(format!(
                "LV {}/{} does not carry this pool's tags; not removing it",
                self.vg, lv.name
            )));
        }
        if lv.open {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} ({}) is in use (mounted or open); unpublish and unstage it first",
                lv.path
            )));
        }
        // A published raw block volume is a bind of its device node, which
        // does not open the device: look for it in the mount table.
        let dev = PathBuf::from(format!("/dev/{}", self.lv_path(&lv.name)));
        let bound = crate::error::blocking(move || {
            let table = crate::mount::MountTable::read()?;
            match crate::mount::locate_device_node(&table, &dev) {
                Ok(loc) => Ok(table.mounts_of(&loc).next().map(|m| m.mount_point.clone())),
                // Not active: no device node to bind.
                Err(Error::NotFound(_)) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await?;
        if let Some(at) = bound {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is published at {at:?}; unpublish it first"
            )));
        }
        let dependants: Vec<String> = all
            .iter()
            .flatten()
            .filter(|l| l.is_cow_snapshot() && l.origin == lv.name)
            .map(|l| l.name.clone())
            .collect();
        if !dependants.is_empty() {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} still has snapshots ({}); delete them first",
                dependants.join(", ")
            )));
        }
        match lvm::change(vec![
            "lvremove".into(),
            "--yes".into(),
            format!("{}/{}", self.vg, lv.name),
        ])
        .await
        {
            Ok(()) | Err(LvmError::NotFound(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn expand(&self, id: &VolumeId, range: CapacityRange) -> Result<Expanded> {
        let lv = self
            .lookup(&id.key)
            .await?
            .ok_or_else(|| Error::NotFound(format!("volume {id} does not exist")))?;
        let size = self.size_for(range).await?;
        if size < lv.size {
            if range.admits(lv.size) {
                return Ok(Expanded {
                    size_bytes: lv.size,
                    node_expansion_required: true,
                });
            }
            return Err(Error::OutOfRange(format!(
                "volume {id} is {} bytes; shrinking is not supported",
                lv.size
            )));
        }
        if size > lv.size {
            self.grow_lv(&lv, size, &format!("expanding {id}")).await?;
        }
        Ok(Expanded {
            size_bytes: size,
            node_expansion_required: true,
        })
    }

    async fn get(&self, id: &VolumeId) -> Result<Option<Volume>> {
        Ok(self
            .lookup(&id.key)
            .await?
            .and_then(|lv| self.to_volume(&lv)))
    }

    async fn list(&self) -> Result<Vec<Volume>> {
        Ok(lvm::lvs(&self.vg)
            .await?
            .iter()
            .filter_map(|lv| self.to_volume(lv))
            .collect())
    }

    async fn capacity(&self) -> Result<Capacity> {
        let (_, now) = self.limits().await?;
        Ok(Capacity {
            available_bytes: now,
            maximum_volume_size: now,
        })
    }

    fn source(&self, vol: &Volume) -> Result<Source> {
        let key = vol
            .id
            .rsplit_once('.')
            .and_then(|(_, k)| VolumeKey::parse(k))
            .ok_or_else(|| Error::Internal(format!("malformed volume id {:?}", vol.id)))?;
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

    fn supports_snapshots(&self) -> bool {
        true
    }

    fn device_of(&self, id: &VolumeId) -> Option<PathBuf> {
        Some(PathBuf::from(format!(
            "/dev/{}",
            self.lv_path(&lv_name(&id.key))
        )))
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
        Ok(())
    }

    async fn create_snapshot(&self, req: &SnapshotRequest) -> Result<Snapshot> {
        let name = snap_lv_name(&req.id.key);
        if let Some(lv) = lvm::lv(&self.vg, &name).await? {
            let snap = self.to_snapshot(&lv).ok_or_else(|| {
                Error::AlreadyExists(format!(
                    "LV {} exists and is not this driver's",
                    self.lv_path(&name)
                ))
            })?;
            if snap.name != req.name.as_str() || snap.source_volume_id != req.source.to_string() {
                return Err(Error::AlreadyExists(format!(
                    "snapshot {:?} already exists for another source volume ({})",
                    req.name.as_str(),
                    snap.source_volume_id
                )));
            }
            return Ok(snap);
        }
        let src = self
            .lookup(&req.source.key)
            .await?
            .filter(|l| self.to_volume(l).is_some())
            .ok_or_else(|| {
                Error::NotFound(format!("source volume {} does not exist", req.source))
            })?;
        let access = self
            .to_volume(&src)
            .map_or(AccessType::Mount, |v| v.access_type);
        let mut tags = self.tags("snapshot", req.name.as_str(), access);
        tags.push(format!("{TAG_SOURCE}={}", req.source));
        tags.push(format!("{TAG_SIZE}={}", src.size));
        let mut args: Vec<String> = vec![
            "lvcreate".into(),
            "--yes".into(),
            "--snapshot".into(),
            "--name".into(),
            name.clone(),
        ];
        let _alloc = self.alloc.lock().await;
        if self.thin.is_none() {
            // A COW snapshot needs space for the changes made to its origin.
            let cow = req.cow_size.unwrap_or(src.size);
            let (ever, now) = self.limits().await?;
            self.check_room(cow, ever, now, &format!("snapshot {}", req.name.as_str()))?;
            args.extend(["--size".into(), format!("{cow}b")]);
        }
        for t in tags {
            args.extend(["--addtag".into(), t]);
        }
        args.push(self.lv_path(&src.name));
        match lvm::change(args).await {
            Ok(()) | Err(LvmError::AlreadyExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let lv = lvm::lv(&self.vg, &name).await?.ok_or_else(|| {
            Error::Internal(format!(
                "snapshot LV {} missing after lvcreate",
                self.lv_path(&name)
            ))
        })?;
        self.to_snapshot(&lv).ok_or_else(|| {
            Error::Internal(format!(
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
            return Err(Error::FailedPrecondition(format!(
                "LV {} does not carry this pool's snapshot tags; not removing it",
                self.lv_path(&name)
            )));
        }
        match lvm::change(vec!["lvremove".into(), "--yes".into(), self.lv_path(&name)]).await {
            Ok(()) | Err(LvmError::NotFound(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
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

    async fn condition(&self, vol: &Volume) -> Result<Option<String>> {
        let Some((_, key)) = vol.id.rsplit_once('.') else {
            return Ok(None);
        };
        let Some(key) = VolumeKey::parse(key) else {
            return Ok(None);
        };
        let Some(lv) = self.lookup(&key).await? else {
            return Ok(Some(format!("LV {}/{} is missing", self.vg, lv_name(&key))));
        };
        if !lv.is_active() {
            return Ok(Some(format!("LV {}/{} is not active", self.vg, lv.name)));
        }
        if let Some(thin) = &self.thin {
            if let Some(pool) = lvm::lv(&self.vg, thin).await? {
                if pool.data_percent.unwrap_or(0.0) >= THIN_FULL_PERCENT
                    || pool.metadata_percent.unwrap_or(0.0) >= THIN_FULL_PERCENT
                {
                    return Ok(Some(format!(
                        "thin pool {}/{thin} is nearly full (data {:.1}%, metadata {:.1}%)",
                        self.vg,
                        pool.data_percent.unwrap_or(0.0),
                        pool.metadata_percent.unwrap_or(0.0)
                    )));
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::VolumeName;

    const MI: u64 = 1 << 20;
    /// Recorded in the VM: a thin pool, a thin LV and a thin snapshot of it.
    const LVS_THIN: &str = include_str!("../../tests/fixtures/lvm/lvs-thin.json");
    const KEY: &str = "0123456789abcdef0123456789abcdef";

    /// A pool over the fixture's VG, opened without running lvm.
    fn pool(name: &str, thin: Option<&str>) -> LvmPool {
        LvmPool {
            name: PoolName::parse(name).unwrap(),
            vg: "fxvg".into(),
            thin: thin.map(str::to_owned),
            ratio: 1.0,
            reserve: 0,
            options: vec!["--type".into(), "raid1".into()],
            overhead: 1.0,
            default_fs: FsType::Ext4,
            default_size: 64 * MI,
            copies: Arc::default(),
            alloc: tokio::sync::Mutex::new(()),
        }
    }

    /// The fixture's LV `name`, with `tags` instead of its own.
    fn lv(name: &str, tags: &[&str]) -> LvInfo {
        let mut lv = lvm::parse_lvs(LVS_THIN)
            .unwrap()
            .into_iter()
            .find(|l| l.name == name)
            .unwrap();
        lv.tags = tags.iter().map(|t| t.to_string()).collect();
        lv
    }

    fn request(name: &str, access: AccessType) -> CreateRequest {
        let name = VolumeName::parse(name).unwrap();
        CreateRequest {
            id: VolumeId::new(PoolName::parse("thin").unwrap(), &name),
            name,
            range: CapacityRange::default(),
            access_type: access,
            inode_limit: None,
            parameters: Default::default(),
            source: None,
        }
    }

    #[test]
    fn an_lv_is_a_volume_only_when_its_tags_say_so() {
        let p = pool("thin", Some("tp"));
        let lv_name = format!("lv-{KEY}");
        let mine = [
            "localvol",
            "localvol.pool=thin",
            "localvol.name=pvc-1",
            "localvol.access=mount",
        ];
        let v = p.to_volume(&lv(&lv_name, &mine)).expect("our volume");
        assert_eq!(v.id, format!("thin.{KEY}"));
        assert_eq!((v.name.as_str(), v.pool.as_str()), ("pvc-1", "thin"));
        assert_eq!((v.size_bytes, v.access_type), (64 * MI, AccessType::Mount));
        assert!(!v.inactive && !v.grow_filesystem);

        let block = [
            "localvol",
            "localvol.pool=thin",
            "localvol.name=b",
            "localvol.access=block",
            "localvol.grow",
        ];
        let v = p.to_volume(&lv(&lv_name, &block)).unwrap();
        assert_eq!(v.access_type, AccessType::Block);
        assert!(v.grow_filesystem);

        // The recorded snapshot is inactive: a volume tagged like it says so.
        let v = p.to_volume(&lv(&format!("sn-{KEY}"), &mine));
        assert!(v.is_none(), "sn- names are snapshots, never volumes");

        for (why, tags) in [
            (
                "another pool's",
                &[
                    "localvol",
                    "localvol.pool=other",
                    "localvol.name=x",
                    "localvol.access=mount",
                ][..],
            ),
            (
                "not localvol's",
                &[
                    "localvol.pool=thin",
                    "localvol.name=x",
                    "localvol.access=mount",
                ],
            ),
            (
                "being restored",
                &[
                    "localvol",
                    "localvol.pool=thin",
                    "localvol.name=x",
                    "localvol.access=mount",
                    "localvol.restoring",
                ],
            ),
            (
                "being created",
                &[
                    "localvol",
                    "localvol.pool=thin",
                    "localvol.name=x",
                    "localvol.access=mount",
                    "localvol.creating",
                ],
            ),
            (
                "without a name",
                &["localvol", "localvol.pool=thin", "localvol.access=mount"],
            ),
            (
                "without an access type",
                &["localvol", "localvol.pool=thin", "localvol.name=x"],
            ),
        ] {
            assert!(p.to_volume(&lv(&lv_name, tags)).is_none(), "{why}");
        }
    }

    #[test]
    fn an_lv_is_a_snapshot_only_when_its_tags_say_so() {
        let p = pool("thin", Some("tp"));
        let name = format!("sn-{KEY}");
        let source = format!("thin.{}", "f".repeat(32));
        let size = format!("localvol.size={}", 64 * MI);
        let src_tag = format!("localvol.source={source}");
        let tags = [
            "localvol",
            "localvol.pool=thin",
            "localvol.kind=snapshot",
            "localvol.name=snap-1",
            src_tag.as_str(),
            size.as_str(),
        ];
        let s = p.to_snapshot(&lv(&name, &tags)).expect("our snapshot");
        assert_eq!(s.id, format!("thin.{KEY}"));
        assert_eq!(
            (s.name.as_str(), s.source_volume_id.as_str()),
            ("snap-1", source.as_str())
        );
        assert_eq!(s.size_bytes, 64 * MI);
        assert!(s.ready, "a thin snapshot is never an invalid COW");
        assert!(s.created_unix > 0);
        // Missing what a snapshot must record, or not a snapshot at all.
        for drop in [
            "localvol.kind=snapshot",
            src_tag.as_str(),
            size.as_str(),
            "localvol.name=snap-1",
            "localvol.pool=thin",
        ] {
            let fewer: Vec<&str> = tags.iter().copied().filter(|t| *t != drop).collect();
            assert!(
                p.to_snapshot(&lv(&name, &fewer)).is_none(),
                "without {drop}"
            );
        }
        assert!(
            p.to_snapshot(&lv(&format!("lv-{KEY}"), &tags)).is_none(),
            "lv- name"
        );
    }

    #[test]
    fn a_restore_retry_finds_only_its_own_lv() {
        let p = pool("thin", Some("tp"));
        let req = request("pvc-1", AccessType::Mount);
        let src = format!("thin.{}", "f".repeat(32));
        let src_tag = format!("localvol.source={src}");
        let name = format!("lv-{KEY}");
        let ours = [
            "localvol",
            "localvol.pool=thin",
            "localvol.kind=volume",
            "localvol.name=pvc-1",
            "localvol.access=mount",
            src_tag.as_str(),
        ];
        p.check_restore_of(&lv(&name, &ours), &req, &src).unwrap();
        let other_src = format!("localvol.source=thin.{}", "e".repeat(32));
        for (why, tags) in [
            (
                "another pool's",
                vec![
                    "localvol",
                    "localvol.pool=other",
                    "localvol.name=pvc-1",
                    src_tag.as_str(),
                ],
            ),
            (
                "a snapshot",
                vec![
                    "localvol",
                    "localvol.pool=thin",
                    "localvol.kind=snapshot",
                    "localvol.name=pvc-1",
                    src_tag.as_str(),
                ],
            ),
            (
                "another name's",
                vec![
                    "localvol",
                    "localvol.pool=thin",
                    "localvol.name=pvc-2",
                    src_tag.as_str(),
                ],
            ),
            (
                "from another source",
                vec![
                    "localvol",
                    "localvol.pool=thin",
                    "localvol.name=pvc-1",
                    other_src.as_str(),
                ],
            ),
            (
                "a plain volume",
                vec!["localvol", "localvol.pool=thin", "localvol.name=pvc-1"],
            ),
        ] {
            let e = p
                .check_restore_of(&lv(&name, &tags), &req, &src)
                .unwrap_err();
            assert!(matches!(e, Error::AlreadyExists(_)), "{why}: {e:?}");
        }
    }

    #[test]
    fn create_args_carry_every_tag_and_the_pool_kind() {
        let req = request("pvc-1", AccessType::Block);
        let tags_of = |a: &[String]| -> Vec<String> {
            a.windows(2)
                .filter(|w| w[0] == "--addtag")
                .map(|w| w[1].clone())
                .collect()
        };
        let want = [
            "localvol",
            "localvol.pool=thin",
            "localvol.kind=volume",
            "localvol.name=pvc-1",
            "localvol.access=block",
            "localvol.creating",
        ];
        let thin = pool("thin", Some("tp")).create_args(&req, 64 * MI);
        assert_eq!(tags_of(&thin), want);
        assert_eq!(&thin[..4], ["lvcreate", "--yes", "--activate", "y"]);
        let at = thin.iter().position(|a| a == "--virtualsize").unwrap();
        assert_eq!(
            thin[at + 1..at + 4],
            [format!("{}b", 64 * MI), "--thin".into(), "fxvg/tp".into()]
        );
        assert!(
            !thin.contains(&"--wipesignatures".to_owned()),
            "thin LVs are zeroed by the pool"
        );

        let thick = pool("thin", None).create_args(&req, 64 * MI);
        assert_eq!(tags_of(&thick), want);
        let at = thick.iter().position(|a| a == "--size").unwrap();
        assert_eq!(thick[at + 1], format!("{}b", 64 * MI));
        assert!(thick.windows(2).any(|w| w == ["--wipesignatures", "y"]));
        assert!(
            thick.windows(2).any(|w| w == ["--type", "raid1"]),
            "the pool's lvcreateOptions"
        );
        assert_eq!(thick.last().unwrap(), "fxvg");
    }

    fn sized(required: u64, limit: u64) -> Result<u64> {
        size_in_extents(CapacityRange { required, limit }, 1024 * MI, 4 * MI)
    }

    #[test]
    fn a_leftover_copy_is_found_by_its_target() {
        let proc = tempfile::tempdir().unwrap();
        let pid = |n: &str, cmdline: &[u8]| {
            std::fs::create_dir(proc.path().join(n)).unwrap();
            std::fs::write(proc.path().join(n).join("cmdline"), cmdline).unwrap();
        };
        pid("self", b"dd\0of=/dev/vg/lv-a\0");
        pid(
            "12",
            b"/usr/bin/dd\0if=/dev/vg/sn-b\0of=/dev/vg/lv-b\0bs=4M\0",
        );
        pid("13", b"cat\0of=/dev/vg/lv-c\0");
        pid("14", b"");
        let t = proc.path();
        assert!(copy_running(t, "of=/dev/vg/lv-b"));
        assert!(!copy_running(t, "of=/dev/vg/lv-a"), "not a pid dir");
        assert!(!copy_running(t, "of=/dev/vg/lv-c"), "not dd");
        assert!(!copy_running(t, "of=/dev/vg/lv-bb"));
        assert!(!copy_running(&t.join("missing"), "of=/dev/vg/lv-b"));
    }

    #[test]
    fn sizes_are_whole_extents_within_the_range() {
        assert_eq!(sized(0, 0).unwrap(), 1024 * MI, "default");
        assert_eq!(sized(1, 0).unwrap(), 4 * MI, "rounded up");
        assert_eq!(sized(10 * MI, 0).unwrap(), 12 * MI);
        assert_eq!(sized(10 * MI, 12 * MI).unwrap(), 12 * MI);
        // Only a limit, below the default and not a whole extent: the most
        // whole extents under it, not a refusal.
        assert_eq!(sized(0, 10 * MI + 1).unwrap(), 8 * MI);
        assert_eq!(
            sized(0, 2048 * MI).unwrap(),
            1024 * MI,
            "default under the limit"
        );
        for (required, limit) in [(10 * MI, 11 * MI), (0, 3 * MI), (1, 1)] {
            let e = sized(required, limit).unwrap_err();
            assert!(
                matches!(e, Error::OutOfRange(_)),
                "({required}, {limit}): {e:?}"
            );
        }
    }
}
