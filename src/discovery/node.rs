//! The node's view of static volumes: a read-only [`Pool`] that the node
//! service finds through [`crate::driver::Driver::find`], so NodeStage,
//! NodePublish, their inverses and NodeGetVolumeStats take the normal path.
//!
//! Filesystem entries are directory sources (the discovered mount point is
//! bind-mounted); Block entries are device sources (the device is bound onto
//! the target file). Nothing is cached: every lookup rescans the class's
//! directory and reads the mount table, and a volume whose cleanup is pending
//! is not found (it is never handed to a pod half-wiped). Create, delete and
//! expand are refused: static volumes are discovered and cleaned, not made.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;

use super::cleanup::Cleaner;
use super::scan::{self, Discovered, EntryKind};
use super::StaticError;
use super::{DiscoveryConfig, StaticHandle};
use crate::error::blocking;
use crate::ids::{PoolName, VolumeId, VolumeKey, VolumeName};
use crate::pool::{
    AccessType, Capacity, CapacityRange, CreateRequest, Expanded, Health, NodeSide, Pool, Source,
    Volume,
};
use crate::pool::{PoolError, Result};

/// Pool name static volumes report (never registered in [`crate::pool::Pools`]).
pub const STATIC_POOL: &str = "static";
/// Record parameters that carry the discovered entry.
pub const PARAM_PATH: &str = "localvol.csi.dev/static-path";
pub const PARAM_STORAGE_CLASS: &str = "localvol.csi.dev/static-storage-class";

pub struct StaticPool {
    name: PoolName,
    cfg: DiscoveryConfig,
    cleaner: Cleaner,
}

impl StaticPool {
    /// Opens the cleanup state under `state_dir` (blocking).
    pub fn open(cfg: DiscoveryConfig, state_dir: &std::path::Path) -> Result<Self, StaticError> {
        Ok(StaticPool {
            name: PoolName::parse(STATIC_POOL).expect("the static pool's name is valid"),
            cfg,
            cleaner: Cleaner::new(state_dir)?,
        })
    }

    pub fn config(&self) -> &DiscoveryConfig {
        &self.cfg
    }

    pub fn cleaner(&self) -> &Cleaner {
        &self.cleaner
    }

    /// The volume a request's id names, when it is a static handle of a
    /// currently discovered entry with no cleanup pending.
    pub async fn find(
        self: &Arc<Self>,
        raw: &str,
    ) -> Result<Option<(VolumeId, Arc<dyn Pool>, Volume)>, StaticError> {
        let Some(handle) = StaticHandle::parse(raw) else {
            return Ok(None);
        };
        let me = self.clone();
        let h = handle.clone();
        let found = blocking(move || {
            if me.cleaner.is_pending(&h) {
                return Ok(None);
            }
            scan::find(&me.cfg, &h)
        })
        .await?;
        let Some(d) = found else {
            return Ok(None);
        };
        let key = VolumeKey::parse(&handle.entry_key)
            .ok_or_else(|| StaticError::Config(format!("bad entry key in {handle}")))?;
        let id = VolumeId {
            pool: self.name.clone(),
            key,
        };
        let vol = self.record(&d, id.clone());
        Ok(Some((id, self.clone() as Arc<dyn Pool>, vol)))
    }

    /// The volume of a discovered entry whose id is `id`. Its name is the
    /// entry's, or (an entry name that is no CSI name: over 128 bytes, or
    /// with control characters) its handle; nothing reads a static
    /// volume's name.
    fn record(&self, d: &Discovered, id: VolumeId) -> Volume {
        let class = &self.cfg.classes[d.class];
        let name = VolumeName::parse(&d.name)
            .or_else(|_| VolumeName::parse(&d.handle.to_string()))
            .expect("a static handle is a valid volume name");
        Volume {
            id,
            name,
            size_bytes: d.capacity_bytes,
            access_type: match d.kind {
                EntryKind::Mount { .. } => AccessType::Mount,
                EntryKind::Device { .. } => AccessType::Block,
            },
            created_unix: 0,
            parameters: BTreeMap::from([
                (
                    PARAM_PATH.to_owned(),
                    d.source_path().to_string_lossy().into_owned(),
                ),
                (PARAM_STORAGE_CLASS.to_owned(), class.storage_class.clone()),
            ]),
            project_id: None,
            inode_limit: None,
            grow_filesystem: false,
            unformatted: false,
            inactive: false,
            io_limits: Default::default(),
            encryption: None,
        }
    }

    fn refuse<T>(&self, what: &'static str) -> Result<T> {
        Err(PoolError::Static { what })
    }
}

#[async_trait]
impl Pool for StaticPool {
    fn name(&self) -> &PoolName {
        &self.name
    }
    fn backend(&self) -> crate::pool::Backend {
        crate::pool::Backend::Static
    }
    fn storage_id(&self) -> Option<&crate::ids::StorageId> {
        None
    }
    fn supports(&self, _access: AccessType) -> bool {
        false
    }
    async fn health(&self) -> Health {
        Health::Ready
    }
    async fn create(&self, _req: &CreateRequest) -> Result<Volume> {
        self.refuse("creating one")
    }
    async fn delete(&self, _id: &VolumeId) -> Result<()> {
        self.refuse("deleting one (the deleter cleans released PVs)")
    }
    async fn expand(&self, _id: &VolumeId, _range: CapacityRange) -> Result<Expanded> {
        self.refuse("expansion")
    }
    async fn get(&self, _id: &VolumeId) -> Result<Option<Volume>> {
        // Static volumes are found by handle (`find`), not by pool id.
        Ok(None)
    }
    async fn list(&self) -> Result<Vec<Volume>> {
        Ok(Vec::new())
    }
    async fn capacity(&self) -> Result<Capacity> {
        Ok(Capacity::default())
    }
}

#[async_trait]
impl NodeSide for StaticPool {
    fn stages_directories(&self) -> bool {
        false
    }
    fn source(&self, vol: &Volume) -> Result<Source> {
        let path = vol
            .parameters
            .get(PARAM_PATH)
            .map(PathBuf::from)
            .ok_or_else(|| {
                PoolError::Inconsistent(format!("static volume {} has no path", vol.id))
            })?;
        Ok(match vol.access_type {
            AccessType::Mount => Source::Directory(path),
            AccessType::Block => Source::Device(path),
        })
    }
}
