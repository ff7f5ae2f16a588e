//! LVM pools: each volume is a logical volume `lv-<key>` in the pool's volume
//! group, thick or thin (from the pool's thin pool).
//!
//! `lvs` is the ground truth; the driver keeps no record of its own. Every LV it
//! creates carries tags: `localvol` (ours), `localvol.pool=<pool>` (several pools
//! may share a VG), `localvol.name=<CSI name, tag-encoded>` and
//! `localvol.access=mount|block`. A create that finds its LV already there
//! (a retry, or a crash mid-create) recognises it by those tags instead of
//! making a second one.

use std::path::PathBuf;

use async_trait::async_trait;

use super::{
    AccessType, Capacity, CapacityRange, CreateRequest, Expanded, Pool, Source, Usage, Volume,
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
    /// Held from the capacity check through `lvcreate`/`lvextend`, so
    /// concurrent creates cannot together overfill the pool. LVM serialises
    /// changes to a VG with its own lock anyway, so this costs no parallelism.
    alloc: tokio::sync::Mutex<()>,
}

fn lv_name(key: &VolumeKey) -> String {
    format!("lv-{key}")
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
        };
        pool.check()
            .await
            .map_err(|e| Error::FailedPrecondition(format!("pool {}: {e}", pool.name)))?;
        tracing::info!(pool = %pool.name, vg = pool.vg, thin = ?pool.thin, "lvm pool opened");
        Ok(pool)
    }

    pub fn default_fs(&self) -> FsType {
        self.default_fs
    }

    fn is_ours(&self, lv: &LvInfo) -> bool {
        lv.has_tag(TAG_OWNER) && lv.tag_value(TAG_POOL) == Some(self.name.as_str())
    }

    /// The volume an LV of this pool represents (None for other LVs).
    fn to_volume(&self, lv: &LvInfo) -> Option<Volume> {
        if !self.is_ours(lv) {
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
        })
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
        let vg = lvm::vg(&self.vg).await?;
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
        let want = match (range.required, range.limit) {
            (0, 0) => self.default_size,
            (0, limit) => self.default_size.min(limit),
            (req, _) => req,
        };
        let extent = self.extent().await?;
        let size = want.div_ceil(extent).saturating_mul(extent);
        if range.limit > 0 && size > range.limit {
            return Err(Error::OutOfRange(format!(
                "{want} bytes rounds up to {size} bytes (extent size {extent}), above limit_bytes {}",
                range.limit
            )));
        }
        Ok(size)
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

    fn create_args(&self, req: &CreateRequest, size: u64) -> Vec<String> {
        let access = match req.access_type {
            AccessType::Block => "block",
            AccessType::Mount => "mount",
        };
        let mut a: Vec<String> = vec![
            "lvcreate".into(),
            "--yes".into(),
            "--activate".into(),
            "y".into(),
        ];
        a.extend(["--name".into(), lv_name(&req.id.key)]);
        for tag in [
            TAG_OWNER.to_owned(),
            format!("{TAG_POOL}={}", self.name),
            format!("{TAG_NAME}={}", lvm::encode_tag_value(req.name.as_str())),
            format!("{TAG_ACCESS}={access}"),
        ] {
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

fn round_down(v: u64, unit: u64) -> u64 {
    v.checked_div(unit).map_or(v, |n| n * unit)
}

/// An existing volume answers a repeated create only if it matches it.
fn matches_request(vol: Volume, req: &CreateRequest) -> Result<Volume> {
    let why = if vol.name != req.name.as_str() {
        Some("another name hashes to the same id".to_owned())
    } else if !req.range.admits(vol.size_bytes) {
        Some(format!("it has {} bytes", vol.size_bytes))
    } else if vol.access_type != req.access_type {
        Some(format!("it is a {:?} volume", vol.access_type))
    } else {
        None
    };
    match why {
        None => Ok(vol),
        Some(why) => Err(Error::AlreadyExists(format!(
            "volume {:?} already exists and does not match the request: {why}",
            req.name.as_str()
        ))),
    }
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
        if let Some(lv) = self.lookup(&req.id.key).await? {
            return match self.to_volume(&lv) {
                Some(v) => matches_request(v, req),
                None => Err(Error::AlreadyExists(format!(
                    "LV {}/{} exists and is not this driver's",
                    self.vg, lv.name
                ))),
            };
        }
        let size = self.size_for(req.range).await?;
        let _alloc = self.alloc.lock().await;
        let (ever, now) = self.limits().await?;
        self.check_room(size, ever, now, &format!("volume {}", req.name.as_str()))?;
        match lvm::change(self.create_args(req, size)).await {
            Ok(()) => {}
            // A create cut short earlier (or still finishing) made it: check it below.
            Err(LvmError::AlreadyExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let lv = self.lookup(&req.id.key).await?.ok_or_else(|| {
            Error::Internal(format!(
                "lvcreate succeeded but {}/{} is missing",
                self.vg,
                lv_name(&req.id.key)
            ))
        })?;
        let vol = self.to_volume(&lv).ok_or_else(|| {
            Error::AlreadyExists(format!(
                "LV {}/{} exists and is not this driver's",
                self.vg, lv.name
            ))
        })?;
        matches_request(vol, req)
    }

    async fn delete(&self, id: &VolumeId) -> Result<()> {
        let Some(lv) = self.lookup(&id.key).await? else {
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
        let dependants: Vec<String> = lvm::lvs(&self.vg)
            .await?
            .into_iter()
            .filter(|l| l.is_cow_snapshot() && l.origin == lv.name)
            .map(|l| l.name)
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
            let _alloc = self.alloc.lock().await;
            let (ever, now) = self.limits().await?;
            self.check_room(
                size,
                ever,
                now.saturating_add(lv.size),
                &format!("expanding {id}"),
            )?;
            lvm::change(vec![
                "lvextend".into(),
                "--size".into(),
                format!("{size}b"),
                format!("{}/{}", self.vg, lv.name),
            ])
            .await?;
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
