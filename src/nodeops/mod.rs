//! Node-side mount logic: stage, publish and their inverses, decided from the
//! live mount table so every step is idempotent. No proto types here. The
//! mount steps block: callers run them through [`crate::error::blocking`];
//! [`enforce_io_limits`] and the pipeline (`pipeline.rs`) are async and hand
//! their blocking parts to it themselves.
//!
//! Directory volumes: stage = bind the volume directory onto the staging path;
//! publish = bind the staging path onto the target (then remount for `ro` and
//! other flags, which the kernel ignores on the first bind).
//!
//! Device volumes with a filesystem: stage = mount the device on the staging
//! path (the caller formats it first if, and only if, it is blank); publish as
//! above. Raw block volumes: nothing to stage; publish = bind the device node
//! onto a file at the target path.
//!
//! Every mount is recognised by its [`Location`] (device and in-filesystem
//! path), so a step is OK when already done with the same volume and refused
//! when something else is there.
//!
//! Each decision is taken from live kernel state, and nothing is kept from one
//! call to the next. Reading the whole mount table costs in proportion to
//! every mount on the node (secrets, tokens and volumes of every pod), so the
//! common cases are first answered by `statx` of the paths involved
//! ([`mount::probe`]): "nothing is mounted at this path" is exact from one
//! call, and so is "the mount at this path is this directory volume" (the
//! mount's root is the volume directory's inode). Whenever the probes do not
//! settle a step (something else is mounted there, a device volume's
//! filesystem, a SINGLE_NODE_SINGLE_WRITER check that needs every mount of
//! the volume, an old kernel), the step reads the mount table once, at that
//! point, and takes all of its remaining decisions from that one reading:
//! where the volume is, what is at the staging path, what is at the target,
//! and which stacked mounts an unmount removes.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::error::IoError;
use crate::mount::{self, MountError, Probe};

mod mounts;
pub mod pipeline;

pub use mounts::*;

/// Why a node step (stage, publish, their inverses) did not happen.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("volume directory {path:?} is missing")]
    VolumeDirMissing { path: PathBuf },
    #[error("{path:?} exists and is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("target path {path:?} exists and is not a regular file")]
    NotAFile { path: PathBuf },
    #[error("the parent directory of {path:?} does not exist")]
    ParentMissing { path: PathBuf },
    /// The staging or target path already holds something this request would
    /// have to replace: another volume, or this one mounted another way.
    #[error("{path:?} already has another mount ({found})")]
    Occupied { path: PathBuf, found: String },
    /// An unmount found a mount that is not this volume's; it stays.
    #[error("{path:?} has a mount that is not this volume ({found}); not unmounting it")]
    ForeignMount { path: PathBuf, found: String },
    #[error("{path:?} still mounted after {MAX_STACKED} unmounts")]
    TooManyStacked { path: PathBuf },
    /// SINGLE_NODE_SINGLE_WRITER: the volume is already published elsewhere.
    #[error("the volume is still published at {at:?}")]
    PublishedElsewhere { at: PathBuf },
    /// Unstage while a pod still uses the staging mount (or `path` is a target).
    #[error("not unstaging {path:?}: the volume is still published at {at:?}; unpublish it first")]
    StillPublished { path: PathBuf, at: PathBuf },
    #[error("volume is not staged at {staging:?}{}; call NodeStageVolume first", .found.as_ref().map(|f| format!(" (it holds another mount, {f})")).unwrap_or_default())]
    NotStaged {
        staging: PathBuf,
        found: Option<String>,
    },
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Io(#[from] IoError),
}

type Result<T, E = NodeError> = std::result::Result<T, E>;

/// How a mount shows in messages: its device and root.
fn describe(m: &mount::MountEntry) -> String {
    format!("{}:{:?}", m.dev, m.root)
}

/// How many stacked mounts an unmount loop removes before it gives up.
const MAX_STACKED: usize = 16;

/// What one `statx` shows at a path.
enum Seen {
    Missing,
    /// The path exists and nothing is mounted at it.
    Unmounted(Probe),
    /// Something is mounted at it; the probe describes the top mount's root.
    Mounted(Probe),
    /// The kernel does not report mount roots: read the table.
    Unknown,
}

fn look(path: &Path) -> Result<Seen> {
    match mount::probe(path) {
        Ok(None) => Ok(Seen::Missing),
        Ok(Some(p)) if p.mount_root => Ok(Seen::Mounted(p)),
        Ok(Some(p)) => Ok(Seen::Unmounted(p)),
        Err(e) if e.kind() == ErrorKind::Unsupported => Ok(Seen::Unknown),
        Err(e) => Err(e.into()),
    }
}

/// Whether nothing is mounted at `path` (a missing path holds nothing);
/// None when only the table can say.
fn nothing_at(path: &Path) -> Result<Option<bool>> {
    Ok(match look(path)? {
        Seen::Missing | Seen::Unmounted(_) => Some(true),
        Seen::Mounted(_) => Some(false),
        Seen::Unknown => None,
    })
}

/// A directory volume's probe: the errors of [`locate_dir`] for a missing
/// directory or another kind of file, None when only the table can say.
fn probe_dir(src: &Path) -> Result<Option<Probe>> {
    match look(src)? {
        Seen::Missing => Err(NodeError::VolumeDirMissing { path: src.into() }),
        Seen::Mounted(p) | Seen::Unmounted(p) if !p.is_dir => {
            Err(NodeError::NotADirectory { path: src.into() })
        }
        Seen::Mounted(p) | Seen::Unmounted(p) => Ok(Some(p)),
        Seen::Unknown => Ok(None),
    }
}

/// Puts a volume's IO limits in place on this node (see `iolimit.rs`): in
/// the cgroup of pod `only` (NodePublishVolume), or of every pod that has
/// the volume published (a modify). A volume without a device of its own
/// has none to limit. On a cgroup v1 node the limits cannot be enforced:
/// a warning, not an error (the pod runs, without them).
pub async fn enforce_io_limits(
    (cgroup_root, kubelet_dir): (&Path, &Path),
    src: crate::pool::Source,
    limits: &crate::iolimit::IoLimits,
    only: Option<crate::iolimit::PodUid>,
) -> Result<usize, crate::iolimit::CgroupError> {
    use crate::iolimit::{self, CgroupError};
    let crate::pool::Source::Device(dev) = src else {
        return Ok(0);
    };
    let (root, kubelet, limits) = (cgroup_root.to_owned(), kubelet_dir.to_owned(), *limits);
    let r = crate::error::blocking(move || {
        iolimit::enforce(&root, &kubelet, &dev, &limits, only.as_ref())
    })
    .await;
    match r {
        Ok(pods) => Ok(pods.len()),
        Err(CgroupError::NotV2 { root }) => {
            if !limits.is_unlimited() {
                tracing::warn!(cgroup_root = %root.display(), %limits,
                    "IO limits not enforced: the node is not on cgroup v2 (io.max)");
            }
            Ok(0)
        }
        Err(e) => Err(e),
    }
}
