//! The one place where errors become gRPC statuses.
//!
//! Every layer below `service/` returns an enum that says what failed; this
//! module decides, variant by variant, which CSI code each failure gets. The
//! message keeps the whole source chain: it is what an operator reads in
//! `kubectl describe`.

use tonic::{Code, Status};

use crate::blockdev::UnknownFs;
use crate::command::CommandError;
use crate::crypt::{CryptError, KeyError};
use crate::discovery::StaticError;
use crate::driver::DriverError;
use crate::error::IoError;
use crate::fsutil::{FsError, PathError};
use crate::ids::InvalidName;
use crate::iolimit::CgroupError;
use crate::k8s::room::RoomError;
use crate::locks::Busy;
use crate::lvm::LvmError;
use crate::mount::MountError;
use crate::nodeops::pipeline::StepError;
use crate::nodeops::NodeError;
use crate::ops::{OpError, Refusal};
use crate::pool::PoolError;
use crate::quota::QuotaError;

/// A status with `code` whose message is `e` and all its sources.
pub fn status(code: Code, e: &dyn std::error::Error) -> Status {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let s_str = s.to_string();
        if !msg.contains(&s_str) {
            msg.push_str(": ");
            msg.push_str(&s_str);
        }
        src = s.source();
    }
    Status::new(code, msg)
}

pub fn io_code(e: &IoError) -> Code {
    if e.is_out_of_space() {
        Code::ResourceExhausted
    } else {
        Code::Internal
    }
}

pub fn command_code(e: &CommandError) -> Code {
    if e.is_timeout() {
        Code::DeadlineExceeded
    } else {
        Code::Internal
    }
}

pub fn fs_code(e: &FsError) -> Code {
    match e {
        FsError::Io(e) => io_code(e),
        FsError::NotADirectory { .. } | FsError::MountPointInside { .. } => {
            Code::FailedPrecondition
        }
        FsError::NoParent { .. } | FsError::NoFreeName { .. } => Code::Internal,
    }
}

pub fn path_code(e: &PathError) -> Code {
    match e {
        PathError::Io(e) => io_code(e),
        PathError::Required { .. }
        | PathError::TooLong { .. }
        | PathError::ComponentTooLong { .. }
        | PathError::DotSegment { .. }
        | PathError::Elsewhere(_)
        | PathError::Symlink { .. } => Code::InvalidArgument,
    }
}

pub fn mount_code(e: &MountError) -> Code {
    match e {
        MountError::Io(e) => io_code(e),
        MountError::DeviceMissing { .. } => Code::NotFound,
        MountError::NotABlockDevice { .. } => Code::FailedPrecondition,
        MountError::MountInfo(_) | MountError::Unlocated { .. } => Code::Internal,
    }
}

pub fn quota_code(e: &QuotaError) -> Code {
    match e {
        QuotaError::Io(e) => io_code(e),
        QuotaError::NotEnforced(_) => Code::FailedPrecondition,
    }
}

pub fn lvm_code(e: &LvmError) -> Code {
    match e {
        LvmError::NotFound(_) => Code::NotFound,
        LvmError::InsufficientSpace(_) => Code::ResourceExhausted,
        LvmError::AlreadyExists(_) => Code::AlreadyExists,
        LvmError::Parse(_) => Code::Internal,
        LvmError::Command(c) => command_code(c),
    }
}

pub fn node_code(e: &NodeError) -> Code {
    match e {
        NodeError::Io(e) => io_code(e),
        NodeError::Mount(e) => mount_code(e),
        NodeError::VolumeDirMissing { .. } => Code::NotFound,
        NodeError::Occupied { .. } => Code::AlreadyExists,
        NodeError::NotADirectory { .. }
        | NodeError::NotAFile { .. }
        | NodeError::ParentMissing { .. }
        | NodeError::ForeignMount { .. }
        | NodeError::PublishedElsewhere { .. }
        | NodeError::StillPublished { .. }
        | NodeError::NotStaged { .. } => Code::FailedPrecondition,
        NodeError::TooManyStacked { .. } => Code::Internal,
    }
}

/// A node pipeline's own refusals are about what the volume holds or where
/// it is; the rest keep their layer's code.
pub fn step_code(e: &StepError) -> Code {
    match e {
        StepError::Node(e) => node_code(e),
        StepError::Pool(e) => pool_code(e),
        StepError::Crypt(e) => crypt_code(e),
        StepError::Command(e) => command_code(e),
        StepError::Path(e) => path_code(e),
        StepError::Io(e) => io_code(e),
        StepError::KeyRequired { .. } | StepError::StagingRequired => Code::InvalidArgument,
        StepError::NotAtPath(_) => Code::NotFound,
        StepError::Unmountable { .. }
        | StepError::OtherFilesystem { .. }
        | StepError::UnrecordedLuks { .. }
        | StepError::ForeignContent { .. }
        | StepError::EncryptedNotStaged { .. }
        | StepError::NotMounted { .. }
        | StepError::NotMountedHere { .. } => Code::FailedPrecondition,
    }
}

pub fn pool_code(e: &PoolError) -> Code {
    use PoolError as P;
    match e {
        P::UnknownPool { .. } | P::UnsupportedParameter(_) => Code::InvalidArgument,
        P::Unavailable { .. } | P::NotStarted { .. } => Code::Unavailable,
        P::Mismatch { .. } | P::NotOurs { .. } => Code::AlreadyExists,
        P::VolumeNotFound(_) | P::SnapshotNotFound(_) | P::SourceNotFound(_) => Code::NotFound,
        // Growth that does not fit is infeasible, not a transient shortage:
        // external-resizer and kubelet then let the user lower the request
        // (RecoverVolumeExpansionFailure), which a retry at the same size
        // would never satisfy.
        P::TooLarge { .. } | P::SizeRefused(_) | P::NoRoomToGrow { .. } => Code::OutOfRange,
        P::NoSpace { .. } | P::NoProjectId { .. } => Code::ResourceExhausted,
        P::Misconfigured { .. }
        | P::InUse { .. }
        | P::ForeignLv { .. }
        | P::SnapshotInvalid(_)
        | P::Static { .. } => Code::FailedPrecondition,
        P::CopyStillRunning(_) => Code::Aborted,
        P::Inconsistent(_) | P::Record(_) => Code::Internal,
        P::Io(e) => io_code(e),
        P::Fs(e) => fs_code(e),
        P::Mount(e) => mount_code(e),
        P::Quota(e) => quota_code(e),
        P::Lvm(e) => lvm_code(e),
        P::Command(e) => command_code(e),
        P::Crypt(e) => crypt_code(e),
    }
}

pub fn static_code(e: &StaticError) -> Code {
    match e {
        StaticError::InUse { .. } => Code::FailedPrecondition,
        StaticError::Vanished(_) => Code::NotFound,
        StaticError::BadMarker { .. } | StaticError::Config(_) | StaticError::Json(_) => {
            Code::Internal
        }
        StaticError::Io(e) => io_code(e),
        StaticError::Fs(e) => fs_code(e),
        StaticError::Mount(e) => mount_code(e),
        StaticError::Command(e) => command_code(e),
    }
}

pub fn driver_code(e: &DriverError) -> Code {
    match e {
        DriverError::VolumeNotFound { .. } => Code::NotFound,
        DriverError::RelativeKubeletDir(_) | DriverError::Name(_) => Code::InvalidArgument,
        DriverError::Busy(_) => Code::Aborted,
        DriverError::Pool(e) => pool_code(e),
        DriverError::Static(e) => static_code(e),
        DriverError::Io(e) => io_code(e),
        DriverError::NameTaken { .. } => Code::AlreadyExists,
        DriverError::SourceInOtherPool { .. } => Code::InvalidArgument,
        DriverError::SourceNotFound { .. } => Code::NotFound,
        DriverError::OtherStorage { .. } => Code::FailedPrecondition,
        DriverError::PoolUnusable { new, .. } => unusable_code(*new),
    }
}

/// A pool that cannot serve now: its RPCs are retried (UNAVAILABLE) until
/// its storage is back. A new volume asked of it is RESOURCE_EXHAUSTED,
/// as for a full pool: external-provisioner then hands a claim that waited
/// for its first consumer back to the scheduler, which picks another node
/// (the pool offers no capacity meanwhile).
pub fn unusable_code(new: bool) -> Code {
    if new {
        Code::ResourceExhausted
    } else {
        Code::Unavailable
    }
}

/// Growth that does not fit is OUT_OF_RANGE, which external-resizer and
/// kubelet treat as infeasible (the user may lower the request); an API
/// server that did not answer is UNAVAILABLE, retried.
pub fn room_code(e: &RoomError) -> Code {
    match e {
        RoomError::NoRoom { .. } => Code::OutOfRange,
        RoomError::Api { .. } => Code::Unavailable,
    }
}

/// A key that does not open the volume is an invalid argument: the secret
/// is a field of the request, and the CO must fix it before retrying (the
/// spec's meaning of INVALID_ARGUMENT). The volume's own state (holding
/// something that is not LUKS, a mapping in use) is FAILED_PRECONDITION.
pub fn crypt_code(e: &CryptError) -> Code {
    match e {
        CryptError::WrongKey { .. } => Code::InvalidArgument,
        CryptError::NotLuks { .. }
        | CryptError::NameTaken { .. }
        | CryptError::InUse { .. }
        | CryptError::Busy { .. } => Code::FailedPrecondition,
        // Another operation on the device is still running.
        CryptError::DeviceBusy { .. } => Code::Aborted,
        CryptError::Io(e) => io_code(e),
        CryptError::Mount(e) => mount_code(e),
        CryptError::Command(e) => command_code(e),
    }
}

/// A pod whose cgroup cannot take the limits is a state of the node
/// (retried by kubelet and the resizer once it is fixed).
pub fn cgroup_code(e: &CgroupError) -> Code {
    match e {
        CgroupError::NotV2 { .. }
        | CgroupError::NoPodCgroup { .. }
        | CgroupError::NoIoController { .. } => Code::FailedPrecondition,
        CgroupError::Io(e) => io_code(e),
        CgroupError::Mount(e) => mount_code(e),
    }
}

pub fn refusal_code(e: &Refusal) -> Code {
    match e {
        Refusal::Missing { .. } | Refusal::NotOurs { .. } => Code::NotFound,
        Refusal::NoSnapshots | Refusal::Unsupported(_) | Refusal::NotNeeded(_) => {
            Code::Unimplemented
        }
        Refusal::NotInTopology { .. } => Code::ResourceExhausted,
        Refusal::BadToken { .. } => Code::Aborted,
        Refusal::Opening => Code::Unavailable,
        Refusal::Shrink { .. }
        | Refusal::NoRoomToGrow { .. }
        | Refusal::TooSmallForFilesystem { .. }
        | Refusal::PastTheEnd { .. } => Code::OutOfRange,
        Refusal::NoBlockMap { .. } => Code::FailedPrecondition,
        Refusal::Unfit(_) => Code::InvalidArgument,
    }
}

/// An operation's error: the status of the error it carries, chosen above.
impl From<OpError> for Status {
    fn from(e: OpError) -> Self {
        match e {
            OpError::Refused(e) => e.into(),
            OpError::Driver(e) => e.into(),
            OpError::Pool(e) => e.into(),
            OpError::Step(e) => e.into(),
            OpError::Node(e) => e.into(),
            OpError::Path(e) => e.into(),
            OpError::Io(e) => e.into(),
            OpError::Crypt(e) => e.into(),
            OpError::Cgroup(e) => e.into(),
            OpError::Room(e) => (*e).into(),
            OpError::Static(e) => e.into(),
            OpError::Busy(e) => e.into(),
            OpError::Name(e) => e.into(),
            OpError::UnknownFs(e) => e.into(),
        }
    }
}

/// Implements `From<$t> for Status` through a code function.
macro_rules! to_status {
    ($($t:ty => $code:expr;)*) => {$(
        impl From<$t> for Status {
            fn from(e: $t) -> Self {
                let code: Code = $code(&e);
                status(code, &e)
            }
        }
    )*};
}

to_status! {
    IoError => io_code;
    CommandError => command_code;
    FsError => fs_code;
    PathError => path_code;
    MountError => mount_code;
    QuotaError => quota_code;
    LvmError => lvm_code;
    NodeError => node_code;
    StepError => step_code;
    Refusal => refusal_code;
    PoolError => pool_code;
    StaticError => static_code;
    DriverError => driver_code;
    RoomError => room_code;
    CryptError => crypt_code;
    CgroupError => cgroup_code;
    KeyError => |_: &KeyError| Code::InvalidArgument;
    UnknownFs => |_: &UnknownFs| Code::InvalidArgument;
    InvalidName => |_: &InvalidName| Code::InvalidArgument;
    Busy => |_: &Busy| Code::Aborted;
}
