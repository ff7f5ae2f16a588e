//! The stand-in for a pool that has not opened (its disks refused by
//! `disks.rs`, its volume group missing, its mount point not mounted):
//! it reports why as its health, and every call on it fails with that
//! reason until the pool opens (`set.rs`). Nothing is answered as if the
//! pool were empty: a DeleteVolume must not succeed for a volume that may
//! be on the disks. It offers what its backend offers (snapshots,
//! encryption, node-side expansion, access types, IO limits, the default
//! filesystem), so that the driver's capabilities do not change when the
//! pool opens later, and so that a request is checked against it as its
//! opened pool would check it (`Pools::unopened`: `localvol config check
//! --storage-class`). The tests hold each answer to the opened pool's.

use std::sync::Mutex;

use async_trait::async_trait;

use super::{
    AccessType, Backend, BlockMaps, Capacity, CapacityRange, CreateRequest, Expanded, Extents,
    Health, MappedSnapshot, NodeSide, Pool, PoolError, Result, Snapshot, SnapshotRequest,
    Snapshots, Source, Unusable, Volume,
};
use crate::blockdev::FsType;
use crate::config::{PoolConfig, QuotaMode};
use crate::ids::{PoolName, VolumeId};

pub struct RefusedPool {
    name: PoolName,
    backend: Backend,
    /// An LVM pool's `defaultFsType`.
    default_fs: Option<FsType>,
    /// A dir pool with `quota: off` (its volumes take no inode limit).
    quota_off: bool,
    why: Mutex<Unusable>,
}

impl RefusedPool {
    pub fn new(cfg: &PoolConfig, why: Unusable) -> Self {
        let (backend, default_fs, quota_off) = match cfg {
            PoolConfig::Dir(d) => (Backend::Dir, None, d.quota == QuotaMode::Off),
            PoolConfig::Lvm(l) => (
                match l.thin_pool {
                    Some(_) => Backend::LvmThin,
                    None => Backend::Lvm,
                },
                // The config refuses any other name (`LvmPoolConfig::validate`).
                FsType::parse(&l.default_fs_type).ok(),
                false,
            ),
        };
        RefusedPool {
            name: cfg.name().clone(),
            backend,
            default_fs,
            quota_off,
            why: Mutex::new(why),
        }
    }

    /// The latest reason the pool did not open.
    pub fn set_why(&self, why: Unusable) {
        *self.why.lock().unwrap() = why;
    }

    fn why(&self) -> Unusable {
        self.why.lock().unwrap().clone()
    }

    fn err(&self) -> PoolError {
        PoolError::NotStarted {
            pool: self.name.to_string(),
            why: self.why().to_string(),
        }
    }

    fn lvm(&self) -> bool {
        matches!(self.backend, Backend::Lvm | Backend::LvmThin)
    }
}

#[async_trait]
impl NodeSide for RefusedPool {
    fn source(&self, _vol: &Volume) -> Result<Source> {
        Err(self.err())
    }
    fn default_fs_type(&self) -> Option<FsType> {
        self.default_fs
    }
}

#[async_trait]
impl Pool for RefusedPool {
    fn name(&self) -> &PoolName {
        &self.name
    }
    fn backend(&self) -> Backend {
        self.backend
    }
    /// Not opened: its storage is not known (and not announced).
    fn storage_id(&self) -> Option<&crate::ids::StorageId> {
        None
    }
    fn supports(&self, access: AccessType) -> bool {
        self.lvm() || access == AccessType::Mount
    }
    fn expands_on_node(&self) -> bool {
        self.lvm()
    }
    fn encrypts(&self) -> bool {
        self.lvm()
    }
    fn limits_io(&self) -> bool {
        self.lvm()
    }
    /// A dir pool with `quota: auto` or `required` may take inode limits:
    /// whether its filesystem enforces quotas is known once it opens.
    fn inode_limit_refused(&self) -> Option<String> {
        match self.backend {
            Backend::Dir if self.quota_off => {
                Some(super::dir::no_inode_limit(&self.name, "quota: off"))
            }
            Backend::Dir => None,
            _ => Some(super::not_a_dir_pool(&self.name, self.backend)),
        }
    }
    fn snapshots(&self) -> Option<&dyn Snapshots> {
        self.lvm().then_some(self as &dyn Snapshots)
    }
    fn block_maps(&self) -> Option<&dyn BlockMaps> {
        (self.backend == Backend::LvmThin).then_some(self as &dyn BlockMaps)
    }
    async fn health(&self) -> Health {
        Health::Unusable(self.why())
    }
    async fn create(&self, _req: &CreateRequest) -> Result<Volume> {
        Err(self.err())
    }
    async fn delete(&self, _id: &VolumeId) -> Result<()> {
        Err(self.err())
    }
    async fn expand(&self, _id: &VolumeId, _range: CapacityRange) -> Result<Expanded> {
        Err(self.err())
    }
    async fn get(&self, _id: &VolumeId) -> Result<Option<Volume>> {
        Err(self.err())
    }
    async fn list(&self) -> Result<Vec<Volume>> {
        Err(self.err())
    }
    async fn capacity(&self) -> Result<Capacity> {
        Err(self.err())
    }
}

#[async_trait]
impl Snapshots for RefusedPool {
    async fn create_snapshot(&self, _req: &SnapshotRequest) -> Result<Snapshot> {
        Err(self.err())
    }
    async fn delete_snapshot(&self, _id: &VolumeId) -> Result<()> {
        Err(self.err())
    }
    async fn get_snapshot(&self, _id: &VolumeId) -> Result<Option<Snapshot>> {
        Err(self.err())
    }
    async fn list_snapshots(&self) -> Result<Vec<Snapshot>> {
        Err(self.err())
    }
}

#[async_trait]
impl BlockMaps for RefusedPool {
    async fn mapped_snapshot(&self, _id: &VolumeId) -> Result<MappedSnapshot> {
        Err(self.err())
    }
    async fn allocated(&self, _snap: &MappedSnapshot) -> Result<Box<dyn Extents>> {
        Err(self.err())
    }
    async fn changed(
        &self,
        _base: &MappedSnapshot,
        _target: &MappedSnapshot,
    ) -> Result<Box<dyn Extents>> {
        Err(self.err())
    }
}

/// The answers a request is checked against, of a pool's stand-in and of
/// the pool opened from the same config, side by side (`inode`: whether
/// the opened pool's inode-limit answer is known from its config alone).
#[cfg(test)]
pub(super) fn assert_answers_as_opened(cfg: &PoolConfig, opened: &dyn Pool, inode: bool) {
    let refused = RefusedPool::new(cfg, Unusable::NotOpened);
    let answers = |p: &dyn Pool| {
        (
            p.backend(),
            [AccessType::Mount, AccessType::Block].map(|a| p.supports(a)),
            (p.expands_on_node(), p.encrypts(), p.limits_io()),
            p.default_fs_type(),
            p.snapshots().is_some(),
            inode.then(|| p.inode_limit_refused()),
        )
    };
    assert_eq!(answers(&refused), answers(opened), "pool {}", cfg.name());
}
