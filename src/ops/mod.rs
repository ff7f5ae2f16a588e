//! The operations layer: one function per CSI RPC, between the services
//! (which decode requests into the typed values here and encode answers) and
//! the driver, the pools and the node pipeline. Each operation runs one
//! fixed sequence: the volume's lock (taken here, before the lookup: [`lock`],
//! [`lock_new`]), the lookup, the usable and storage checks, the pool or the
//! node pipeline, then the side effects (IO limits, the condition metric).
//! No proto or gRPC type reaches this module: an operation fails with an
//! [`OpError`], whose code `service/status.rs` chooses.

use crate::crypt::CryptError;
use crate::discovery::StaticError;
use crate::driver::{Driver, DriverError, Kind};
use crate::error::IoError;
use crate::fsutil::PathError;
use crate::ids::{InvalidName, StorageId, VolumeId, VolumeName};
use crate::iolimit::CgroupError;
use crate::k8s::room::RoomError;
use crate::locks::{Busy, VolumeGuard};
use crate::nodeops::pipeline::StepError;
use crate::nodeops::NodeError;
use crate::pool::{AccessMode, AccessType, Encryption, PoolError, Volume};

mod change;
mod checks;
mod controller;
mod ephemeral;
mod metadata;
mod node;
#[cfg(test)]
mod tests;

pub use change::{expand_volume, modify_volume, Cluster, Expand, Modify};
pub use controller::{
    capacity, create_snapshot, create_volume, delete_snapshot, delete_volume, list_snapshots,
    list_volumes, offers_snapshots, plan_volume, snapshots_offered, validate, CapacityQuery,
    ListPage, NewSnapshot, NewVolume, SnapshotFilter,
};
pub use ephemeral::{publish_ephemeral, NewEphemeral};
pub use metadata::{metadata_allocated, metadata_delta, Allocated, BlockPages, Delta, Paging};
pub use node::{
    expand_on_node, publish, stage, stats, unpublish, unstage, NodeExpand, Publish, Stage, Stats,
    Unpublish, Unstage,
};

/// Why an operation did not happen: a refusal of its own, or the error of
/// the layer that failed, kept whole (`service/status.rs` maps each).
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error(transparent)]
    Step(#[from] StepError),
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error(transparent)]
    Path(#[from] PathError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Crypt(#[from] CryptError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Boxed: the largest by far, and only ControllerExpandVolume's.
    #[error(transparent)]
    Room(Box<RoomError>),
    #[error(transparent)]
    Static(#[from] StaticError),
    #[error(transparent)]
    Busy(#[from] Busy),
    #[error(transparent)]
    Name(#[from] InvalidName),
    #[error(transparent)]
    UnknownFs(#[from] crate::blockdev::UnknownFs),
}

impl From<RoomError> for OpError {
    fn from(e: RoomError) -> Self {
        OpError::Room(Box::new(e))
    }
}

pub type Result<T, E = OpError> = std::result::Result<T, E>;

/// What an operation (or a service, decoding) refuses by itself: each
/// refusal's code is chosen in `service/status.rs` like every layer's
/// error's.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// An id this node has nothing for (not this driver's format, or a
    /// volume gone).
    #[error("{kind} {id:?} does not exist")]
    Missing { kind: &'static str, id: String },
    #[error("volume {id:?} is not a localvol volume")]
    NotOurs { id: String },
    #[error("no pool of this node supports snapshots")]
    NoSnapshots,
    #[error("{0} is not supported")]
    Unsupported(&'static str),
    #[error("{0} is not needed by local volumes")]
    NotNeeded(&'static str),
    /// The spec's code for a node that is not in the requested topology.
    #[error("node {node} is not in the requested topology; volumes of this driver can only be created on the node that serves the request")]
    NotInTopology { node: String },
    /// A list's starting token that names no entry (the spec's ABORTED).
    #[error("starting_token {token:?} is not valid (no such {what})")]
    BadToken { token: String, what: &'static str },
    #[error("volume {id} is {size} bytes; shrinking is not supported")]
    Shrink { id: String, size: u64 },
    #[error("volume {id} needs {growth} more, but pool {pool} has {available} free; ask for at most {most}")]
    NoRoomToGrow {
        id: String,
        growth: String,
        pool: String,
        available: String,
        most: String,
    },
    /// The driver serves while its pools open (`service/gate.rs`); retried.
    #[error("the driver is still opening its pools; retry")]
    Opening,
    /// A limit below the smallest device the filesystem can be made on.
    #[error(
        "a {fs} volume needs at least {min} (mkfs.{fs} refuses less){luks}; limit_bytes is {limit}"
    )]
    TooSmallForFilesystem {
        fs: &'static str,
        min: String,
        luks: &'static str,
        limit: String,
    },
    /// A block-map request's starting offset at or past the volume's end
    /// (the spec's OUT_OF_RANGE).
    #[error("starting_offset {start} is not below the volume's size ({capacity} bytes)")]
    PastTheEnd { start: u64, capacity: u64 },
    /// A snapshot whose pool keeps no block map of it: thick LVM (a
    /// copy-on-write store maps only what changed in its origin since, not
    /// what the volume holds) or dir pools. Only thin LVM pools' snapshots
    /// have one.
    #[error(
        "snapshots of pool {pool} ({backend}) have no block map: changed-block tracking \
         (SnapshotMetadata) needs a snapshot in a thin LVM pool; back this one up whole"
    )]
    NoBlockMap { pool: String, backend: &'static str },
    /// A well-formed request that does not fit what it names: the pool
    /// (a parameter it does not take, an access type it lacks) or the
    /// volume (another access type, no key for an encrypted one). An
    /// argument the caller must change, like a malformed one.
    #[error("{0}")]
    Unfit(String),
}

/// StorageClass parameter: encryption at rest (`luks2`; LVM pools).
pub const PARAM_ENCRYPTION: &str = "encryption";

/// [`Refusal::Unfit`] as an error.
fn unfit<T>(msg: String) -> Result<T> {
    Err(Refusal::Unfit(msg).into())
}

/// A decoded `VolumeCapability`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    pub access_type: AccessType,
    pub fs_type: String,
    pub mount_flags: Vec<String>,
    pub mode: AccessMode,
}

/// StorageClass parameters of CreateVolume and GetCapacity (and of an
/// ephemeral inline volume's attributes), decoded.
#[derive(Debug, Default)]
pub struct PoolParams {
    pub pool: Option<crate::ids::PoolName>,
    pub inode_limit: Option<u64>,
    pub encryption: Option<Encryption>,
    /// How a new filesystem is made (`format.*`): checked against the
    /// pool and the filesystem by CreateVolume, carried in the volume
    /// context to NodeStageVolume.
    pub format: crate::blockdev::FormatOptions,
    /// Everything understood that the record keeps.
    pub kept: std::collections::BTreeMap<String, String>,
}

/// A volume as the answers show it: with the storage identity of its pool
/// (the volume context's `storageIdentity`), when the pool has one.
#[derive(Debug)]
pub struct VolumeEntry {
    pub volume: Volume,
    pub storage: Option<StorageId>,
}

impl VolumeEntry {
    fn of(d: &Driver, volume: Volume) -> Self {
        let storage = (d.pools.get(volume.pool()))
            .and_then(|p| p.storage_id())
            .cloned();
        VolumeEntry { volume, storage }
    }
}

/// One page of a list: its entries and the token of the next page (empty:
/// the last).
#[derive(Debug)]
pub struct Page<T> {
    pub entries: Vec<T>,
    pub next_token: String,
}

/// One page of a list sorted by id, at most `max` long, from the entry whose
/// id is `token` (empty: the first). The next page's token is the id of the
/// entry after it; an unknown token is [`Refusal::BadToken`] (the spec's
/// ABORTED). A large page has the heap trimmed soon after the answer.
pub fn page<T, I: PartialEq<str> + std::fmt::Display + ?Sized>(
    mut sorted: Vec<T>,
    id: impl Fn(&T) -> &I,
    token: &str,
    max: usize,
    what: &'static str,
) -> Result<Page<T>> {
    let start = match token {
        "" => 0,
        t => sorted
            .iter()
            .position(|e| *id(e) == *t)
            .ok_or_else(|| Refusal::BadToken {
                token: crate::ids::truncate(t).to_owned(),
                what,
            })?,
    };
    let end = start.saturating_add(max).min(sorted.len());
    let next_token = sorted
        .get(end)
        .map(|e| id(e).to_string())
        .unwrap_or_default();
    sorted.truncate(end);
    sorted.drain(..start);
    if sorted.len() >= crate::memory::LARGE_ANSWER {
        crate::memory::release_soon();
    }
    Ok(Page {
        entries: sorted,
        next_token,
    })
}

/// The lock of the existing volume (or snapshot) a request's id names,
/// taken before anything is looked up: ABORTED while another operation on
/// it runs. Every RPC that changes a volume takes its lock here or in
/// [`lock_new`], nowhere else; the key comes from the id alone
/// ([`Driver::lock_key`]), so the same volume is one key whatever the RPC.
pub fn lock(d: &Driver, kind: Kind, what: &str, raw: &str) -> Result<VolumeGuard> {
    let key = d.lock_key(what, raw)?;
    Ok(d.locks.try_lock(&key, &format!("{kind} {raw}"))?)
}

/// The locks of a new volume or snapshot named `name` (its key, the name's
/// hash, is the same in every pool), with its source's when it is made
/// from one: the source must not change or vanish while it is copied.
fn lock_new(
    d: &Driver,
    kind: Kind,
    name: &VolumeName,
    key: &str,
    source: Option<&VolumeId>,
) -> Result<crate::driver::LockPair> {
    let what = format!("{kind} {:?}", name.as_str());
    Ok(d.lock_with_source(key, &what, source)?)
}
