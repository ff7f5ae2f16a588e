//! A pool that did not start because its disks were refused
//! (`disks.rs`): it reports why as its health, and every call on it fails
//! with that reason. Nothing is answered as if the pool were empty: a
//! DeleteVolume must not succeed for a volume that may be on the disks.

use async_trait::async_trait;

use super::{
    AccessType, Capacity, CapacityRange, CreateRequest, Expanded, Health, NodeSide, Pool,
    PoolError, Result, Source, Unusable, Volume,
};
use crate::config::PoolConfig;
use crate::ids::{PoolName, VolumeId};

pub struct RefusedPool {
    name: PoolName,
    backend: &'static str,
    why: Unusable,
}

impl RefusedPool {
    pub fn new(cfg: &PoolConfig, why: Unusable) -> Self {
        let backend = match cfg {
            PoolConfig::Dir(_) => "dir",
            PoolConfig::Lvm(_) => "lvm",
        };
        RefusedPool {
            name: cfg.name().clone(),
            backend,
            why,
        }
    }

    fn err(&self) -> PoolError {
        PoolError::NotStarted {
            pool: self.name.to_string(),
            why: self.why.to_string(),
        }
    }
}

#[async_trait]
impl NodeSide for RefusedPool {
    fn source(&self, _vol: &Volume) -> Result<Source> {
        Err(self.err())
    }
}

#[async_trait]
impl Pool for RefusedPool {
    fn name(&self) -> &PoolName {
        &self.name
    }
    fn backend(&self) -> &'static str {
        self.backend
    }
    /// Not opened: its storage is not known (and not announced).
    fn storage_id(&self) -> Option<&crate::ids::StorageId> {
        None
    }
    fn supports(&self, _access: AccessType) -> bool {
        true
    }
    async fn health(&self) -> Health {
        Health::Unusable(self.why.clone())
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
