//! The driver's shared state: its identity, its pools, the per-volume locks
//! and the statically discovered volumes, and the rules that span pools: a
//! name is one volume or snapshot whatever the pool, the pool a new volume
//! goes to, a volume's storage identity, and the lock pair of something made
//! from a source. It sits below the operations layer (`ops`, one function
//! per RPC) and is also used by metrics, static discovery and orphan
//! reports; it knows nothing of gRPC.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Config;
use crate::discovery::node::StaticPool;
use crate::discovery::StaticError;
use crate::error::blocking;
use crate::ids::{
    check_node_id, truncate, InvalidName, ParsedId, PoolName, StorageId, VolumeId, VolumeName,
};
use crate::locks::{Busy, VolumeGuard, VolumeLocks};
use crate::pool::{Backend, Pool, PoolError, Pools, Unusable, Volume};

/// What went wrong opening the driver, finding a volume or taking its lock.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("volume {id:?} does not exist on node {node}")]
    VolumeNotFound { id: String, node: String },
    #[error("kubelet dir {0:?} must be absolute")]
    RelativeKubeletDir(PathBuf),
    #[error(transparent)]
    Name(#[from] InvalidName),
    #[error(transparent)]
    Busy(#[from] Busy),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error(transparent)]
    Static(#[from] StaticError),
    #[error(transparent)]
    Io(#[from] crate::error::IoError),
    /// A name is one volume (or one snapshot) on a node, whatever the pool.
    #[error("{kind} {name:?} already exists in pool {pool}")]
    NameTaken {
        kind: Kind,
        name: String,
        pool: PoolName,
    },
    /// A volume is made from content in its own pool only.
    #[error("the content source is in pool {source_pool}; a volume can only be made from content in its own pool, not {named}")]
    SourceInOtherPool {
        source_pool: PoolName,
        named: PoolName,
    },
    /// A content source (or a snapshot's source volume) in a pool this node
    /// lacks, or not in this driver's id format: nothing here.
    #[error("{kind} {id} does not exist")]
    SourceNotFound { kind: &'static str, id: String },
    /// The volume's context names other storage than the pool it was found
    /// in: it is not this volume (the node's disks were replaced, or an id
    /// matched by chance).
    #[error("volume {id} was created on storage {want}; pool {pool} of this node is {have} (the node's disks were replaced?)")]
    OtherStorage {
        id: String,
        want: StorageId,
        pool: PoolName,
        have: StorageId,
    },
    /// The pool cannot serve now (the pool monitor's last look): its
    /// storage is gone, replaced, or not there yet. `new`: a new volume
    /// was asked of it (RESOURCE_EXHAUSTED, so that the scheduler can
    /// pick another node).
    #[error("pool {pool} is unusable: {why}; its volumes are served again once its storage is back (the other pools serve on)")]
    PoolUnusable {
        pool: PoolName,
        why: Unusable,
        new: bool,
    },
}

impl DriverError {
    /// Whether this is the refusal of a pool that has not opened (its
    /// storage was not there): nothing of it can be looked up.
    pub fn pool_not_open(&self) -> bool {
        matches!(self, DriverError::Pool(PoolError::NotStarted { .. }))
    }
}

/// What a name names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Volume,
    Snapshot,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Volume => "volume",
            Kind::Snapshot => "snapshot",
        })
    }
}

/// The locks of an operation that makes something from a source: its own
/// and the source's, held together.
pub struct LockPair {
    _own: VolumeGuard,
    _source: Option<VolumeGuard>,
}

type Result<T, E = DriverError> = std::result::Result<T, E>;

pub use crate::ids::TOPOLOGY_KEY;

/// Who the driver is and where it may mount: the settings [`Driver::open`]
/// takes besides the config.
#[derive(Clone, Debug)]
pub struct Identity {
    pub driver_name: String,
    pub node_id: String,
    /// Staging and target paths must lie below this directory (absolute).
    pub kubelet_dir: PathBuf,
}

/// State shared by the three services.
pub struct Driver {
    pub name: String,
    pub node_id: String,
    pub pools: Pools,
    /// Per-volume operation locks, shared with static discovery's cleanup.
    pub locks: Arc<VolumeLocks>,
    /// Staging and target paths must lie below this directory.
    pub kubelet_dir: PathBuf,
    /// Statically discovered volumes (config `discovery:`), found by handle.
    pub statics: Option<Arc<StaticPool>>,
    /// The node's cgroup v2 root (config `cgroupRoot`), for IO limits.
    pub cgroup_root: PathBuf,
}

/// What `serve` checks of its identity before it binds the socket.
pub fn check_identity(who: &Identity) -> Result<()> {
    check_node_id(&who.node_id)?;
    if !who.kubelet_dir.is_absolute() {
        return Err(DriverError::RelativeKubeletDir(who.kubelet_dir.clone()));
    }
    Ok(())
}

impl Driver {
    /// For tests: the driver `localvol.csi.dev` on `node`, with the
    /// embedded default (one dir pool) below `dir` and kubelet's directory
    /// at `dir/kubelet`.
    #[cfg(test)]
    pub async fn open_embedded(dir: &Path, node: &str) -> Arc<Driver> {
        let who = Identity {
            driver_name: "localvol.csi.dev".into(),
            node_id: node.into(),
            kubelet_dir: dir.join("kubelet"),
        };
        Driver::open(&who, &Config::embedded(dir)).await.unwrap()
    }

    /// For tests: a 1 MiB mount volume `name` in the embedded default's
    /// pool (`default`), made through the pool as CreateVolume would; its id.
    #[cfg(test)]
    pub async fn create_embedded(&self, name: &str) -> String {
        use crate::ids::{PoolName, VolumeId, VolumeName};
        use crate::pool::{AccessType, CapacityRange, CreateRequest};
        let pool = PoolName::parse("default").unwrap();
        let name = VolumeName::parse(name).unwrap();
        let req = CreateRequest {
            source: None,
            id: VolumeId::new(pool.clone(), &name),
            name,
            range: CapacityRange {
                required: 1 << 20,
                limit: 0,
            },
            access_type: AccessType::Mount,
            inode_limit: None,
            parameters: Default::default(),
            encryption: None,
            io_limits: Default::default(),
        };
        let pool = self.pools.get(&pool).unwrap();
        pool.create(&req).await.unwrap().id.to_string()
    }

    /// Opens the pools (and the static volumes) of `config`.
    pub async fn open(who: &Identity, config: &Config) -> Result<Arc<Driver>> {
        check_identity(who)?;
        let pools = Pools::open(config).await;
        let statics = match config.discovery.clone() {
            Some(d) => Some(Arc::new(
                blocking(move || {
                    let state = d.state_dir.clone();
                    Ok::<_, DriverError>(StaticPool::open(d, &state)?)
                })
                .await?,
            )),
            None => None,
        };
        Ok(Arc::new(Driver {
            name: who.driver_name.clone(),
            node_id: who.node_id.clone(),
            pools,
            locks: Arc::default(),
            kubelet_dir: who.kubelet_dir.clone(),
            statics,
            cgroup_root: config.cgroup_root.clone(),
        }))
    }

    /// The driver `name` of `config` with no pool opened (each is its
    /// stand-in, [`Pools::unopened`]) and no static volume read: what a
    /// request is checked against before anything is looked up. It reads
    /// and changes nothing on the node, and needs no privilege (`localvol
    /// config check --storage-class`).
    pub fn unopened(name: &str, config: &Config) -> Driver {
        Driver {
            name: name.to_owned(),
            node_id: String::new(),
            pools: Pools::unopened(config),
            locks: Arc::default(),
            kubelet_dir: PathBuf::from("/"),
            statics: None,
            cgroup_root: config.cgroup_root.clone(),
        }
    }

    /// Where IO limits are written: the cgroup v2 root, and the kubelet
    /// directory whose targets name the pods.
    pub fn cgroup_paths(&self) -> (&Path, &Path) {
        (&self.cgroup_root, &self.kubelet_dir)
    }

    /// The pools that cannot serve now, and why (the pool monitor's last
    /// look), in config order.
    pub fn unusable_pools(&self) -> Vec<(PoolName, Unusable)> {
        self.pools
            .iter()
            .filter_map(|p| Some((p.name().clone(), self.pools.unusable(p.name())?)))
            .collect()
    }

    /// Refuses an operation on a volume of a pool that cannot serve now.
    pub fn require_usable(&self, pool: &PoolName) -> Result<()> {
        self.refuse_unusable(pool, false)
    }

    /// [`DriverError::PoolUnusable`] while the pool cannot serve; `new`:
    /// the refused operation makes a new volume.
    fn refuse_unusable(&self, pool: &PoolName, new: bool) -> Result<()> {
        match self.pools.unusable(pool) {
            None => Ok(()),
            Some(why) => Err(DriverError::PoolUnusable {
                pool: pool.clone(),
                why,
                new,
            }),
        }
    }

    /// Finds a volume by a request's id (or an ephemeral inline volume by
    /// kubelet's handle). `Ok(None)` when it does not exist (including ids
    /// that are not ours at all).
    pub async fn find(
        &self,
        what: &str,
        raw: &str,
    ) -> Result<Option<(VolumeId, Arc<dyn Pool>, Volume)>> {
        if let Some(statics) = &self.statics {
            crate::ids::check_text(what, raw)?;
            if let Some(found) = statics.find(raw).await? {
                return Ok(Some(found));
            }
        }
        let ParsedId::Volume(id) = VolumeId::parse(what, raw)? else {
            // kubelet's handle of an ephemeral inline volume (stats, expand).
            return self.find_ephemeral(raw).await;
        };
        let Some(pool) = self.pools.get(&id.pool) else {
            return Ok(None);
        };
        let pool = pool.clone();
        Ok(pool.get(&id).await?.map(|v| (id, pool, v)))
    }

    /// The ephemeral inline volume kubelet calls `raw` (its volume handle,
    /// which names the volume: each dir pool is asked for that name's key).
    /// `Ok(None)`: no such ephemeral volume (ids in our own format are never
    /// ephemeral).
    pub async fn find_ephemeral(
        &self,
        raw: &str,
    ) -> Result<Option<(VolumeId, Arc<dyn Pool>, Volume)>> {
        if !matches!(VolumeId::parse("volume_id", raw)?, ParsedId::Foreign(_)) {
            return Ok(None);
        }
        let name = VolumeName::parse(raw)?;
        for pool in self.pools.iter().filter(|p| p.backend() == Backend::Dir) {
            let id = VolumeId::new(pool.name().clone(), &name);
            let found = match pool.get(&id).await {
                // A pool that did not start (its disk refused) holds no
                // inline volume: ask the others.
                Err(PoolError::NotStarted { .. }) => continue,
                other => other?,
            };
            if let Some(v) = found {
                if v.ephemeral_target().is_some() && v.name == name {
                    return Ok(Some((id, pool.clone(), v)));
                }
            }
        }
        Ok(None)
    }

    /// Removes the ephemeral inline volumes whose pod is gone: those whose
    /// recorded target path no longer exists (kubelet removed the pod's
    /// directory while the driver was down, or a crash came between its
    /// unmount and the delete). Run at start and by each orphan pass. A
    /// volume still mounted anywhere is refused by its pool and kept; a busy
    /// one is left to the next sweep. Returns the ids removed.
    pub async fn sweep_ephemeral(&self) -> Vec<VolumeId> {
        let mut removed = Vec::new();
        for pool in self.pools.iter().filter(|p| p.backend() == Backend::Dir) {
            let vols = match pool.list().await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(pool = %pool.name(), error = %e, "ephemeral sweep: cannot list");
                    continue;
                }
            };
            for v in vols {
                let Some(target) = v.ephemeral_target() else {
                    continue;
                };
                let t = target.clone();
                let gone = blocking(move || {
                    Ok::<_, DriverError>(matches!(
                        std::fs::symlink_metadata(&t),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound
                    ))
                })
                .await
                .unwrap_or(false);
                if !gone {
                    continue;
                }
                let Ok(_guard) = self.lock_volume(&v.id) else {
                    continue;
                };
                match pool.delete(&v.id).await {
                    Ok(()) => {
                        tracing::info!(volume = %v.id, name = %v.name, ?target, "ephemeral volume removed: its pod's target path is gone");
                        removed.push(v.id);
                    }
                    Err(e) => {
                        tracing::warn!(volume = %v.id, error = %e, "ephemeral volume of a gone pod not removed")
                    }
                }
            }
        }
        removed
    }

    /// The lock key of the volume a request's id names, from the id alone
    /// (no lookup): a static volume's entry key (as static discovery's
    /// cleanup locks it), else the name's hash (`VolumeName::key`) that a
    /// `<pool>.<key>` id carries and an ephemeral volume's handle gives.
    pub fn lock_key(&self, what: &str, raw: &str) -> Result<String, InvalidName> {
        let parsed = VolumeId::parse(what, raw)?;
        if self.statics.is_some() {
            if let Some(h) = crate::discovery::StaticHandle::parse(raw) {
                return Ok(h.entry_key);
            }
        }
        Ok(match parsed {
            ParsedId::Volume(id) => id.key.as_str().to_owned(),
            ParsedId::Foreign(raw) => VolumeName::parse(&raw)?.key().as_str().to_owned(),
        })
    }

    /// Takes the volume's operation lock (ABORTED while another operation on
    /// it runs); released when the guard drops.
    pub fn lock_volume(&self, id: &VolumeId) -> Result<VolumeGuard, Busy> {
        self.locks
            .try_lock(id.key.as_str(), &format!("volume {id}"))
    }

    /// The locks of something made from `source` (a new volume from a
    /// snapshot or a clone, a snapshot of a volume): `what` names the new
    /// one in a Busy message. The source must not change or vanish while it
    /// is copied. The new one's lock key is its name's hash, the same in
    /// every pool.
    pub fn lock_with_source(
        &self,
        key: &str,
        what: &str,
        source: Option<&VolumeId>,
    ) -> Result<LockPair, Busy> {
        let own = self.locks.try_lock(key, what)?;
        let source = match source {
            Some(s) => Some(
                self.locks
                    .try_lock(s.key.as_str(), &format!("source {s}"))?,
            ),
            None => None,
        };
        Ok(LockPair {
            _own: own,
            _source: source,
        })
    }

    /// NameTaken when `key` (a volume's or a snapshot's, from its name) is
    /// taken in a pool of this node other than `pool`: a name is one volume
    /// or one snapshot, whatever the pool. A pool whose disks were refused
    /// at start cannot be asked; the others go on serving (CO names are
    /// unique anyway).
    pub async fn refuse_name_elsewhere(
        &self,
        pool: &PoolName,
        name: &VolumeName,
        kind: Kind,
    ) -> Result<()> {
        let key = match kind {
            Kind::Volume => VolumeId::new(pool.clone(), name).key,
            Kind::Snapshot => name.snapshot_key(),
        };
        for other in self.pools.iter().filter(|p| p.name() != pool) {
            let other_id = VolumeId {
                pool: other.name().clone(),
                key: key.clone(),
            };
            let found = match kind {
                Kind::Volume => other.get(&other_id).await.map(|v| v.is_some()),
                Kind::Snapshot => match other.snapshots() {
                    Some(s) => s.get_snapshot(&other_id).await.map(|s| s.is_some()),
                    None => Ok(false),
                },
            };
            // A pool that did not open, or cannot serve now, cannot be
            // asked; the others go on serving (CO names are unique anyway).
            let found = self
                .pools
                .unless_unusable(other.name(), "name check", found)?
                .unwrap_or(false);
            if found {
                return Err(DriverError::NameTaken {
                    kind,
                    name: name.as_str().to_owned(),
                    pool: other.name().clone(),
                });
            }
        }
        Ok(())
    }

    /// The pool a new volume goes to: the one its parameters name, else its
    /// content source's (`source`: made from content in its own pool only),
    /// else the default pool. A source in a pool this node lacks names
    /// nothing that exists here.
    pub fn pool_for_new(
        &self,
        named: Option<&PoolName>,
        source: Option<(&'static str, &VolumeId)>,
    ) -> Result<Arc<dyn Pool>> {
        if let (Some((_, src)), Some(p)) = (source, named) {
            if src.pool != *p {
                return Err(DriverError::SourceInOtherPool {
                    source_pool: src.pool.clone(),
                    named: p.clone(),
                });
            }
        }
        let pool_name = named
            .cloned()
            .or_else(|| source.map(|(_, src)| src.pool.clone()))
            .unwrap_or_else(|| self.pools.default_pool().clone());
        if let (Some((kind, src)), None, None) = (source, self.pools.get(&pool_name), named) {
            return Err(DriverError::SourceNotFound {
                kind,
                id: src.to_string(),
            });
        }
        let pool = self.pools.require(&pool_name)?.clone();
        self.refuse_unusable(&pool_name, true)?;
        Ok(pool)
    }

    /// The pool of a snapshot's source volume.
    pub fn pool_of_source(&self, source: &VolumeId) -> Result<Arc<dyn Pool>> {
        self.pools
            .get(&source.pool)
            .cloned()
            .ok_or_else(|| DriverError::SourceNotFound {
                kind: "source volume",
                id: source.to_string(),
            })
    }

    /// OtherStorage when the storage a request's volume context names
    /// (`want`) is not the storage of the pool the volume was found in.
    pub fn check_storage(
        &self,
        id: &VolumeId,
        pool: &dyn Pool,
        want: Option<&StorageId>,
    ) -> Result<()> {
        match (want, pool.storage_id()) {
            (Some(want), Some(have)) if want != have => Err(DriverError::OtherStorage {
                id: id.to_string(),
                want: want.clone(),
                pool: pool.name().clone(),
                have: have.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// For unstage and unpublish: the id, device and (pools that encrypt)
    /// mapping name of a volume whose pool
    /// names its device from the id alone (LVM), saving a lookup (an `lvs`
    /// run). `Ok(None)`: use [`Driver::find`]. Bad ids are INVALID_ARGUMENT.
    pub fn device_of(&self, what: &str, raw: &str) -> Result<Option<DeviceOf>, InvalidName> {
        let ParsedId::Volume(id) = VolumeId::parse(what, raw)? else {
            return Ok(None);
        };
        let Some(pool) = self.pools.get(&id.pool) else {
            return Ok(None);
        };
        let mapping = pool.mapping_of(&id);
        Ok(pool.device_of(&id).map(|dev| DeviceOf { id, dev, mapping }))
    }

    /// Like [`Driver::find`], NOT_FOUND when missing.
    pub async fn require(
        &self,
        what: &str,
        raw: &str,
    ) -> Result<(VolumeId, Arc<dyn Pool>, Volume)> {
        self.find(what, raw)
            .await?
            .ok_or_else(|| DriverError::VolumeNotFound {
                id: truncate(raw),
                node: self.node_id.clone(),
            })
    }
}

/// A volume's devices as its pool names them from its id alone.
pub struct DeviceOf {
    pub id: VolumeId,
    /// Its own device (an LV).
    pub dev: PathBuf,
    /// The device-mapper name it has when it is encrypted and open.
    pub mapping: Option<String>,
}

impl crate::metrics::Source for Driver {
    fn pools(&self) -> &Pools {
        &self.pools
    }

    fn unusable_pools(&self) -> Vec<String> {
        Driver::unusable_pools(self)
            .into_iter()
            .map(|(pool, why)| format!("pool {pool}: {why}"))
            .collect()
    }
}
