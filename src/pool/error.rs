//! What can go wrong in a pool. Each variant names the failure; `service/`
//! decides the gRPC code.

use crate::command::CommandError;
use crate::error::IoError;
use crate::fsutil::FsError;
use crate::ids::PoolName;
use crate::lvm::LvmError;
use crate::mount::MountError;
use crate::quota::QuotaError;

pub type Result<T, E = PoolError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A request names a pool this node does not have.
    #[error("pool {pool} does not exist on this node (pools: {known})")]
    UnknownPool { pool: PoolName, known: String },
    /// The pool's storage is not usable now (its folder, volume group or thin
    /// pool is missing or wrong).
    #[error("pool {pool}: {why}")]
    Unavailable { pool: String, why: String },
    /// The pool did not start: its disks were refused (`disks.rs`). It
    /// holds no volume the driver can reach now.
    #[error("pool {pool} was not started: {why}")]
    NotStarted { pool: String, why: String },
    /// The pool cannot be opened as configured (found at start).
    #[error("pool {pool}: {why}")]
    Misconfigured { pool: String, why: String },
    /// A parameter this pool cannot honour (inodeLimit without quotas).
    #[error("{0}")]
    UnsupportedParameter(String),
    /// An idempotent repeat whose request differs from what exists.
    #[error("volume {name:?} already exists and does not match the request: {why}")]
    Mismatch { name: String, why: String },
    /// The name is taken by something this pool did not make.
    #[error("{what} exists and is not this driver's")]
    NotOurs { what: String },
    #[error("volume {0} does not exist")]
    VolumeNotFound(String),
    #[error("snapshot {0} does not exist")]
    SnapshotNotFound(String),
    #[error("source volume {0} does not exist")]
    SourceNotFound(String),
    /// More than the pool could ever hold.
    #[error("{what}: {bytes} bytes is more than pool {pool} can ever hold ({total} bytes)")]
    TooLarge {
        what: String,
        bytes: u64,
        pool: PoolName,
        total: u64,
    },
    /// More than the pool has free now.
    #[error("{what}: pool {pool} has room for {free} bytes, {bytes} requested")]
    NoSpace {
        what: String,
        bytes: u64,
        pool: PoolName,
        free: u64,
    },
    /// An expansion whose growth does not fit the pool's free space now:
    /// the request may be lowered (Kubernetes' expansion-failure recovery)
    /// to at most `most` bytes.
    #[error("volume {id} is {size} bytes; growing it to {bytes} bytes needs {growth} more, but pool {pool} has room for {free}; ask for at most {most} bytes")]
    NoRoomToGrow {
        id: String,
        size: u64,
        bytes: u64,
        growth: u64,
        pool: PoolName,
        free: u64,
        most: u64,
    },
    #[error("{what}: no free project quota id found")]
    NoProjectId { what: String },
    /// A size the pool cannot make: a shrink, no whole extent in the range,
    /// a restore smaller than its source.
    #[error("{0}")]
    SizeRefused(String),
    /// The volume is mounted, published, open or has snapshots: not removed.
    #[error("volume {volume} {why}")]
    InUse { volume: String, why: String },
    /// An LV without this pool's tags, which it never removes.
    #[error("LV {path} does not carry this pool's {kind} tags; not removing it")]
    ForeignLv { path: String, kind: &'static str },
    /// A COW snapshot whose space overflowed: its data is gone.
    #[error(
        "snapshot {0} is invalid: its copy-on-write space (snapshotSize) filled up; \
         it cannot be restored"
    )]
    SnapshotInvalid(String),
    /// A copy from before a restart still writes into the volume.
    #[error("LV {0} is still open by a copy from before a restart; retry when it has ended")]
    CopyStillRunning(String),
    /// An operation static (discovered) volumes do not have.
    #[error("static volumes are discovered on the node; {what} is not supported")]
    Static { what: &'static str },
    /// What the pool found on the node contradicts itself (a bug, or
    /// something changed behind the driver's back).
    #[error("{0}")]
    Inconsistent(String),
    #[error("volume record: {0}")]
    Record(#[from] serde_json::Error),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Quota(#[from] QuotaError),
    #[error(transparent)]
    Lvm(#[from] LvmError),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    Crypt(#[from] crate::crypt::CryptError),
}
