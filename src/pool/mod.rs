//! Storage pools: where volumes come from. The services see only the [`Pool`]
//! trait; each backend (`dir`, later `lvm`) keeps its own ground truth on the node
//! and never sees a proto type.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::blockdev::FsType;
pub use crate::crypt::Encryption;
use crate::ids::{PoolName, StorageId, VolumeId, VolumeName};
pub use crate::iolimit::IoLimits;

pub mod dir;
pub mod disks;
mod error;
pub mod lvm;
mod refused;
mod set;

pub use error::{PoolError, Result};
pub use set::{Change, Pools};

/// How a volume is consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessType {
    /// A mounted filesystem.
    Mount,
    /// A raw block device.
    Block,
}

/// The access modes a node-local volume can offer (all single-node).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
// The CSI spec's names for the single-node modes.
#[allow(clippy::enum_variant_names)]
pub enum AccessMode {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
}

impl AccessMode {
    pub fn read_only(self) -> bool {
        matches!(self, AccessMode::SingleNodeReaderOnly)
    }
}

/// Requested size bounds; 0 means "not set".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CapacityRange {
    pub required: u64,
    pub limit: u64,
}

impl CapacityRange {
    pub fn admits(&self, size: u64) -> bool {
        size >= self.required && (self.limit == 0 || size <= self.limit)
    }
}

/// Where a new volume's initial content comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContentSource {
    Snapshot(VolumeId),
    Volume(VolumeId),
}

/// Everything a backend needs to create a volume, already validated.
#[derive(Clone, Debug)]
pub struct CreateRequest {
    /// Content to start from (same pool); None for an empty volume.
    pub source: Option<ContentSource>,
    pub id: VolumeId,
    pub name: VolumeName,
    pub range: CapacityRange,
    pub access_type: AccessType,
    /// Hard limit on files and directories (quota-enforced pools only).
    pub inode_limit: Option<u64>,
    /// StorageClass parameters the driver understood (kept in the record).
    pub parameters: BTreeMap<String, String>,
    /// Encrypt the volume at rest (StorageClass `encryption`; LVM pools).
    pub encryption: Option<Encryption>,
    /// IO limits from the mutable parameters (pools that [`Pool::limits_io`]).
    pub io_limits: IoLimits,
}

/// A volume as the services see it, whatever its pool. Dir pools keep it
/// as their record (`dir/record.rs`, the JSON on disk); LVM pools build it
/// from the LV's size, attributes and tags (fields they do not record, such
/// as `created_unix` and `parameters`, stay at their defaults); static
/// volumes build it from the discovered entry. `inactive` is never stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    /// `<pool>.<key>`: its pool is `id.pool`. A static volume's is its
    /// entry key in the static pool (its handle is the request's id).
    pub id: VolumeId,
    pub name: VolumeName,
    pub size_bytes: u64,
    pub access_type: AccessType,
    pub created_unix: u64,
    pub parameters: BTreeMap<String, String>,
    /// Project quota id enforcing the size (dir pools with quotas).
    pub project_id: Option<u32>,
    /// Inode hard limit, when one was asked for.
    pub inode_limit: Option<u64>,
    /// The filesystem is smaller than the device (a restore or clone into a
    /// larger volume): the node grows it when it next stages the volume.
    pub grow_filesystem: bool,
    /// The driver has not yet made this volume's filesystem (a new, empty
    /// LVM volume of mount access): whatever the node finds on the device is
    /// a cut-short format of its own (an `mkfs` or driver killed mid-run),
    /// never data, so NodeStage formats it whole. Cleared, through
    /// [`NodeSide::filesystem_made`], before the first mount.
    pub unformatted: bool,
    /// The device exists but is not active on this node (an LV after a boot
    /// without VG auto-activation): the node activates it before use.
    pub inactive: bool,
    /// Encrypted at rest: the node opens it with the stage secret's key.
    pub encryption: Option<Encryption>,
    /// IO limits the node puts on every pod that has it published
    /// (cgroup v2 `io.max`; LVM pools record them in a tag).
    pub io_limits: IoLimits,
}

/// The volume-context key kubelet sets to "true" on NodePublishVolume of a
/// CSI ephemeral inline volume (with the CSIDriver's `podInfoOnMount`); the
/// driver keeps it in the volume's record too.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";
/// Record parameter of an ephemeral volume: the pod's target path it was
/// published at. Gone target, gone pod: the volume is removed.
pub const EPHEMERAL_TARGET_KEY: &str = "localvol.csi.dev/ephemeral-target";

impl Volume {
    pub fn pool(&self) -> &PoolName {
        &self.id.pool
    }

    /// The target path of an ephemeral inline volume (None: a persistent one).
    pub fn ephemeral_target(&self) -> Option<PathBuf> {
        if self.parameters.get(EPHEMERAL_KEY).map(String::as_str) != Some("true") {
            return None;
        }
        self.parameters.get(EPHEMERAL_TARGET_KEY).map(PathBuf::from)
    }
}

/// A point-in-time copy of a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    /// Size of the source volume when the snapshot was taken.
    pub size_bytes: u64,
    pub created_unix: u64,
    /// False when the snapshot can no longer be restored (a thick snapshot
    /// whose copy-on-write space filled up).
    pub ready: bool,
}

/// A validated CreateSnapshot.
#[derive(Clone, Debug)]
pub struct SnapshotRequest {
    pub id: VolumeId,
    pub name: VolumeName,
    pub source: VolumeId,
    /// Space for a thick (copy-on-write) snapshot's changes; None: the source's size.
    pub cow_size: Option<u64>,
}

/// What a pool can hand out right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    /// Bytes still available for new volumes.
    pub available_bytes: u64,
    /// The largest single volume that can be created now.
    pub maximum_volume_size: u64,
}

/// How full a thin pool is, as lvm reports it (`data_percent`,
/// `metadata_percent`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ThinUsage {
    pub data_percent: f64,
    pub metadata_percent: f64,
}

/// Deleted volumes whose blocks are being zeroed before they return to the
/// pool (thick LVM pools), for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Wipes {
    /// Bytes of deleted volumes and snapshots still waiting to be zeroed
    /// (read from the node at each call).
    pub pending_bytes: u64,
    /// Bytes zeroed since the driver started.
    pub wiped_bytes: u64,
    /// Seconds spent zeroing them.
    pub seconds: f64,
}

/// Result of an expansion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expanded {
    pub size_bytes: u64,
    pub node_expansion_required: bool,
}

/// Where a volume's data is on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A directory to bind-mount.
    Directory(PathBuf),
    /// A block device: formatted and mounted, or handed over raw.
    Device(PathBuf),
}

/// An encrypted volume on the node: the device holding the LUKS volume and
/// the name of its opened mapping (whose path is the volume's source).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encrypted {
    pub backing: PathBuf,
    pub mapping: String,
}

/// Usage of one volume when the backend knows it better than statvfs does:
/// the same figures.
pub type Usage = crate::fsutil::FsStats;

/// An existing volume answers a repeated CreateVolume only when the request
/// describes it (same name, a size in range, the same access type and
/// encryption, and, for a
/// pool that records them (`compare_parameters`), the same parameters and
/// inode limit); anything else is ALREADY_EXISTS.
pub fn matches_request(
    existing: Volume,
    req: &CreateRequest,
    compare_parameters: bool,
) -> Result<Volume> {
    let mismatch = if existing.name != req.name {
        Some("another name hashes to the same id".to_owned())
    } else if !req.range.admits(existing.size_bytes) {
        Some(format!("it has {} bytes", existing.size_bytes))
    } else if existing.access_type != req.access_type {
        Some(format!("it is a {:?} volume", existing.access_type))
    } else if existing.encryption != req.encryption {
        Some(match existing.encryption {
            Some(e) => format!("it is encrypted ({})", e.as_str()),
            None => "it is not encrypted".to_owned(),
        })
    } else if compare_parameters
        && (existing.parameters != req.parameters || existing.inode_limit != req.inode_limit)
    {
        Some("it was created with other parameters".to_owned())
    } else {
        None
    };
    match mismatch {
        None => Ok(existing),
        Some(why) => Err(PoolError::Mismatch {
            name: req.name.as_str().to_owned(),
            why,
        }),
    }
}

/// Whether a pool can serve, as its backend finds it on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Ready,
    Unusable(Unusable),
}

impl Health {
    pub fn is_ready(&self) -> bool {
        matches!(self, Health::Ready)
    }
}

/// Health checks that timed out (lvm too slow to answer): they keep the
/// last answer, so they are counted apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlowChecks {
    /// Since the last check that answered.
    pub in_a_row: u32,
    /// Since start.
    pub total: u64,
}

/// Why a pool cannot serve: its storage is gone, is not what the pool
/// opened, or was not there to open. The pool's RPCs are refused with the
/// reason and it offers no capacity until the storage is back; the
/// other pools serve on (the pool monitor, `monitor.rs`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// The directory cannot be looked at (removed, renamed away, EIO...).
    #[error("{path:?} cannot be read: {why}")]
    Unreadable { path: PathBuf, why: String },
    #[error("{path:?} is not a directory")]
    NotADirectory { path: PathBuf },
    /// A directory is there, but not the one the pool opened: the pool's
    /// filesystem was unmounted (the path now shows the directory below the
    /// mount point), or the directory was removed and made again. The
    /// volumes the pool knows are not in it.
    #[error(
        "{path:?} is no longer the directory the pool opened (was its filesystem \
         unmounted, or the directory removed and made again?)"
    )]
    Replaced { path: PathBuf },
    #[error("{path:?} is not writable: {why}")]
    NotWritable { path: PathBuf, why: String },
    #[error("volume group {vg} not found")]
    VolumeGroupMissing { vg: String },
    #[error("thin pool {vg}/{thin} not found")]
    ThinPoolMissing { vg: String, thin: String },
    #[error("{vg}/{thin} is not a thin pool")]
    NotAThinPool { vg: String, thin: String },
    /// A thin pool made with `-Zn` (or changed to `--zero n`) hands a new
    /// thin volume blocks a deleted one wrote, unzeroed: another tenant's
    /// data. The driver refuses to serve from it.
    #[error(
        "thin pool {vg}/{thin} does not zero newly provisioned blocks (created with -Zn?): \
         a new volume could read a deleted volume's data; turn zeroing on with \
         `lvchange --zero y {vg}/{thin}`"
    )]
    ThinPoolNotZeroing { vg: String, thin: String },
    /// A disk the pool lists (`devices:`, `device:`) holds something or is
    /// in use: the driver does not touch it, and the pool does not start.
    #[error(
        "device {device:?} {what}; the pool was not started (the driver only takes \
         blank disks that nothing uses: clear it yourself, or take it out of the pool's list)"
    )]
    DeviceRefused { device: PathBuf, what: String },
    /// Preparing the pool's disks failed (a probe, `vgcreate`, `mkfs`, the
    /// mount), or they cannot make the pool.
    #[error("preparing the pool's disks failed: {0}")]
    DisksFailed(String),
    /// The pool has not been opened yet (the first attempt runs at start).
    #[error("not opened yet")]
    NotOpened,
    /// Opening the pool failed: its volume group is not there, its
    /// directory cannot be made, its quotas are required but missing...
    #[error("it could not be opened: {0}")]
    OpenFailed(String),
    /// The dir pool's path must be a mount point (`requireMountPoint`,
    /// on for a pool with `device:`) and is not: its disk is not mounted
    /// (yet). Nothing is written below it meanwhile, so nothing is hidden
    /// when the disk is mounted.
    #[error(
        "{path:?} is not a mount point (requireMountPoint): its disk is not mounted; \
         nothing is written there until it is"
    )]
    NotAMountPoint { path: PathBuf },
    /// The check itself failed (an lvm report that timed out or failed).
    #[error("the health check failed: {0}")]
    CheckFailed(String),
}

/// What kind of storage a pool is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// A directory pool (`pool/dir/`).
    Dir,
    /// A thick LVM pool.
    Lvm,
    /// A thin LVM pool.
    LvmThin,
    /// Static discovery's disks and mount points (`discovery/node.rs`).
    Static,
}

impl Backend {
    /// Its name in logs, messages and the metrics' `backend` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Dir => "dir",
            Backend::Lvm => "lvm",
            Backend::LvmThin => "lvm-thin",
            Backend::Static => "static",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a pool of `backend` (not a dir pool) refuses an inode limit.
fn not_a_dir_pool(pool: &PoolName, backend: Backend) -> String {
    format!("inodeLimit applies to dir pools; pool {pool} is {backend}")
}

/// What the node side needs of a volume's pool: where its data is, how to
/// make it usable here, and its health and usage for NodeGetVolumeStats.
/// Every pool is one ([`Pool`] requires it); the defaults are what a pool
/// without devices does (nothing to activate, no backend figures).
#[async_trait]
pub trait NodeSide: Send + Sync {
    /// Where the data of a volume of this pool lives on the node.
    fn source(&self, vol: &Volume) -> Result<Source>;
    /// Filesystem for a mount volume whose capability names none.
    fn default_fs_type(&self) -> Option<FsType> {
        None
    }
    /// Whether NodeStage binds a directory volume at the staging path
    /// (NodePublish then binds the staging path). Static volumes are not
    /// staged: their source is a mount point the operator made, so a bind of
    /// it at the staging path is a second mount of the same filesystem root,
    /// and kubelet refuses to unstage a device path that is "still mounted by
    /// other references" (the operator's own mount): the volume would never
    /// be unstaged, hence never cleaned. NodePublish binds the source itself.
    fn stages_directories(&self) -> bool {
        true
    }
    /// The device a volume of this pool is on, from its id alone, for node
    /// calls that need nothing else (unstage, unpublish: the mount table
    /// tells the rest). None: look the volume up.
    fn device_of(&self, _id: &VolumeId) -> Option<PathBuf> {
        None
    }
    /// The device-mapper name an encrypted volume with this id is opened as,
    /// for a pool that encrypts: node calls by id alone use the mapping
    /// instead of [`NodeSide::device_of`] when it is open.
    fn mapping_of(&self, _id: &VolumeId) -> Option<String> {
        None
    }
    /// An encrypted volume's backing device and mapping name (None: not
    /// encrypted). [`NodeSide::source`] of such a volume is the mapping.
    fn encrypted(&self, _vol: &Volume) -> Result<Option<Encrypted>> {
        Ok(None)
    }
    /// Makes a volume whose `inactive` was set usable on this node.
    async fn activate(&self, _vol: &Volume) -> Result<()> {
        Ok(())
    }
    /// Called by the node after growing the filesystem of a volume whose
    /// `grow_filesystem` was set.
    async fn filesystem_grown(&self, _vol: &Volume) -> Result<()> {
        Ok(())
    }
    /// Called by the node once it has made the filesystem of a volume whose
    /// `unformatted` was set, before it mounts it.
    async fn filesystem_made(&self, _vol: &Volume) -> Result<()> {
        Ok(())
    }
    /// The volume's own usage figures, when the backend enforces a size.
    async fn usage(&self, _vol: &Volume) -> Result<Option<Usage>> {
        Ok(None)
    }
    /// Why the volume is unhealthy, as far as the backend can tell.
    async fn condition(&self, _vol: &Volume) -> Result<Option<String>> {
        Ok(None)
    }
}

/// A pool's volumes as the controller side sees them: create, delete,
/// expand, list, capacity, and snapshots where it takes them.
#[async_trait]
pub trait Pool: NodeSide {
    fn name(&self) -> &PoolName;
    /// What kind of storage the pool is (logs, metrics' `backend` label,
    /// and the rules that apply to one kind only).
    fn backend(&self) -> Backend;
    /// What the pool's storage is (a VG's UUID, a dir pool's id file), read
    /// when it was opened; None for what has no such identity (static
    /// discovery's disks).
    fn storage_id(&self) -> Option<&StorageId>;
    fn supports(&self, access: AccessType) -> bool;
    /// Whether expansion happens in NodeExpandVolume (the node holds the
    /// device) rather than in ControllerExpandVolume.
    fn expands_on_node(&self) -> bool {
        false
    }
    /// Whether volumes can be encrypted at rest (StorageClass `encryption`).
    fn encrypts(&self) -> bool {
        false
    }
    /// Whether volumes can carry IO limits: each has a device of its own
    /// that the pod's I/O reaches (LVM pools). A dir volume's I/O reaches
    /// the filesystem's device, shared with every volume of the pool and
    /// with whatever else the pod does there: a limit would be the pod's
    /// and the disk's, not the volume's, so dir pools refuse them.
    fn limits_io(&self) -> bool {
        false
    }
    /// Why a volume of this pool cannot have an inode limit (StorageClass
    /// `inodeLimit`); None: it can. Only a dir pool whose filesystem
    /// enforces project quotas counts a volume's files.
    fn inode_limit_refused(&self) -> Option<String> {
        Some(not_a_dir_pool(self.name(), self.backend()))
    }
    /// Records new IO limits of a volume (a pool that [`Pool::limits_io`];
    /// the node puts them in place).
    async fn set_io_limits(&self, _id: &VolumeId, _limits: IoLimits) -> Result<()> {
        Err(PoolError::UnsupportedParameter(format!(
            "pool {} ({}) does not take IO limits",
            self.name(),
            self.backend()
        )))
    }
    /// Whether the pool can serve now, from what is on the node (Probe,
    /// `/readyz` and the `pool_ready` gauge ask it; cheap enough for each).
    async fn health(&self) -> Health;
    /// The health checks that timed out (a pool whose checks cannot time
    /// out has none).
    fn slow_checks(&self) -> SlowChecks {
        SlowChecks::default()
    }
    /// Why the pool is degraded: its last health checks all timed out. It
    /// still serves; `/readyz` and `localvol_pool_degraded` say so.
    fn degraded(&self) -> Option<String> {
        None
    }
    /// Creates the volume, or returns it when an identical request already did.
    /// ALREADY_EXISTS when a volume with this id exists but does not match.
    async fn create(&self, req: &CreateRequest) -> Result<Volume>;
    /// Deletes the volume; a volume that does not exist is not an error.
    async fn delete(&self, id: &VolumeId) -> Result<()>;
    async fn expand(&self, id: &VolumeId, range: CapacityRange) -> Result<Expanded>;
    async fn get(&self, id: &VolumeId) -> Result<Option<Volume>>;
    async fn list(&self) -> Result<Vec<Volume>>;
    /// The volumes whose id is `from` or sorts after it, in id order, at
    /// most `max`: one page of ListVolumes. The default lists everything; a
    /// pool that keeps its volumes in id order answers in O(page).
    async fn list_page(&self, from: &str, max: usize) -> Result<Vec<Volume>> {
        let mut all: Vec<Volume> = self
            .list()
            .await?
            .into_iter()
            .filter(|v| v.id.cmp_text(from).is_ge())
            .collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all.truncate(max);
        Ok(all)
    }
    async fn capacity(&self) -> Result<Capacity>;
    /// What waits to be wiped and what was wiped, for a pool that zeroes
    /// deleted volumes in the background (None: it does not).
    async fn wipes(&self) -> Result<Option<Wipes>> {
        Ok(None)
    }
    /// Snapshots, restores and clones, for a pool that takes them (None:
    /// the pool offers none; callers answer for that themselves).
    fn snapshots(&self) -> Option<&dyn Snapshots> {
        None
    }
    /// Data% and Metadata% of the pool's thin pool (None: not a thin pool).
    async fn thin_usage(&self) -> Result<Option<ThinUsage>> {
        Ok(None)
    }
    /// Block maps of its snapshots (SnapshotMetadata), for a pool that
    /// keeps them (None: its snapshots have none, thick copy-on-write or
    /// directory copies; callers answer for that themselves).
    fn block_maps(&self) -> Option<&dyn BlockMaps> {
        None
    }
}

/// The part of a snapshot's device that is the volume as its readers see
/// it: `capacity` bytes from byte `skip` (an encrypted volume's LUKS header
/// comes first: its readers see the opened mapping, which starts after
/// it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub skip: u64,
    pub capacity: u64,
}

/// A snapshot whose blocks its pool maps, as a block-map request names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedSnapshot {
    pub id: VolumeId,
    /// The id of the volume it is a snapshot of.
    pub source_volume: String,
    pub window: Window,
    /// The pool's own name for the snapshot's block map (a dm-thin
    /// device id).
    pub device: u64,
}

/// Bytes of a device: `length` from `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub length: u64,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.length)
    }
}

/// A block map being read: extents of a snapshot's device (from its
/// start, not its [`Window`]), ascending and disjoint, as the reader asks
/// for them. What it holds (a pool's metadata snapshot, a running tool) is
/// given back when the last extent was read, or when it is dropped.
#[async_trait]
pub trait Extents: Send {
    /// The pool's block: every extent starts and ends on one.
    fn block_size(&self) -> u64;
    /// The next extent (None: the map is complete).
    async fn next(&mut self) -> Result<Option<Extent>>;
}

/// What a pool that keeps block maps of its snapshots offers
/// (SnapshotMetadata's GetMetadataAllocated and GetMetadataDelta).
#[async_trait]
pub trait BlockMaps: Send + Sync {
    /// The snapshot `id` as its block map knows it (SnapshotNotFound when
    /// there is none).
    async fn mapped_snapshot(&self, id: &VolumeId) -> Result<MappedSnapshot>;
    /// The extents of `snap`'s device that hold data.
    async fn allocated(&self, snap: &MappedSnapshot) -> Result<Box<dyn Extents>>;
    /// The extents of `target`'s device that differ from `base`'s (data
    /// written, or discarded, since `base`).
    async fn changed(
        &self,
        base: &MappedSnapshot,
        target: &MappedSnapshot,
    ) -> Result<Box<dyn Extents>>;
}

/// What a pool that takes snapshots offers (and creates volumes from
/// snapshots or other volumes through [`Pool::create`]). No defaults: a pool
/// either implements all of it or returns None from [`Pool::snapshots`].
#[async_trait]
pub trait Snapshots: Send + Sync {
    /// Takes a snapshot, or returns it when an identical request already did.
    async fn create_snapshot(&self, req: &SnapshotRequest) -> Result<Snapshot>;
    /// Deletes a snapshot; one that does not exist is not an error.
    async fn delete_snapshot(&self, id: &VolumeId) -> Result<()>;
    async fn get_snapshot(&self, id: &VolumeId) -> Result<Option<Snapshot>>;
    async fn list_snapshots(&self) -> Result<Vec<Snapshot>>;
}
