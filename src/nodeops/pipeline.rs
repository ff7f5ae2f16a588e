//! What NodeStage, NodePublish and NodeExpand do to a volume, in order, below
//! the gRPC layer: `service/node.rs` decodes a request into the arguments
//! here and encodes the answer; this module takes the steps.
//!
//! Stage: make the volume usable on the node (activate an inactive LV, open
//! an encrypted one's mapping), then by its kind: a static directory is only
//! checked, a directory is bound at the staging path, a raw block volume
//! needs nothing staged, and a filesystem volume is formatted when (and only
//! when) the pool says it never was or the device is blank, mounted, and
//! grown when its pool asks for it. [`stage_steps`] and
//! [`filesystem_steps`] decide the order from facts alone; the executors
//! here run it. Publish binds what stage made (or, for raw block and static
//! volumes, the source itself). Expand grows the pool's volume where the
//! node holds it, then the mapping and the filesystem on it: the one grow
//! sequence, [`grow`], is shared with stage.
//!
//! Locks are the caller's: every function here runs under the volume's lock.

use std::path::{Path, PathBuf};

use sys_mount::MountFlags;

use super::{MountAt, NodeError};
use crate::blockdev::{self, Content, FormatOptions, FsType};
use crate::command::CommandError;
use crate::crypt::{self, CryptError, Key};
use crate::error::{blocking, IoError};
use crate::fsutil::{self, PathError, PathPlace, RequestPath};
use crate::ids::VolumeId;
use crate::pool::{
    AccessMode, AccessType, CapacityRange, Encrypted, NodeSide, Pool, PoolError, Source, Volume,
};

/// Why a node pipeline stopped. Each layer's error is kept as it is; the
/// variants of its own are about what the volume holds.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error(transparent)]
    Crypt(#[from] CryptError),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    Path(#[from] PathError),
    #[error(transparent)]
    Io(#[from] IoError),
    /// An encrypted volume reached the pipeline without its key (the
    /// service checks the secret first; this is the pipeline's own guard).
    #[error("volume {id} is encrypted and no key was given")]
    KeyRequired { id: String },
    #[error("{dev:?} holds a {found} filesystem, which this driver does not mount")]
    Unmountable { dev: PathBuf, found: String },
    #[error("{dev:?} already holds {found}; the request asks for {requested}: not reformatting")]
    OtherFilesystem {
        dev: PathBuf,
        found: String,
        requested: &'static str,
    },
    #[error("{dev:?} holds a LUKS (encrypted) volume, but the volume is not recorded as encrypted; not formatting or mounting it")]
    UnrecordedLuks { dev: PathBuf },
    #[error("{dev:?} holds {what}; not formatting or mounting it")]
    ForeignContent { dev: PathBuf, what: String },
    #[error("volume {id} is encrypted and not staged (mapping {mapping} is not open); call NodeStageVolume first")]
    EncryptedNotStaged { id: String, mapping: String },
    #[error("{path:?} is not mounted; stage the volume first")]
    NotMounted { path: PathBuf },
    #[error("staging_target_path is required")]
    StagingRequired,
    #[error("not expanding volume {id}: {why}; publish or stage it first")]
    NotMountedHere { id: String, why: String },
    /// The path a request names exists and holds something that is not the
    /// volume, or does not exist.
    #[error("{0}")]
    NotAtPath(String),
}

type Result<T, E = StepError> = std::result::Result<T, E>;

/// Mount flags split into per-mount flags and filesystem options (decoded
/// and checked by the service).
#[derive(Debug)]
pub struct MountOptions {
    pub flags: MountFlags,
    pub data: Vec<String>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            flags: MountFlags::empty(),
            data: Vec::new(),
        }
    }
}

/// A decoded NodeStageVolume.
pub struct Stage {
    pub staging: RequestPath,
    /// The filesystem the capability names (None: the pool's default).
    pub fs_type: Option<FsType>,
    /// The class's format options (the volume context's `format.*`),
    /// checked against the filesystem already.
    pub format: FormatOptions,
    pub mount: MountOptions,
    /// The node-stage secret's key; required for an encrypted volume.
    pub key: Option<Key>,
}

/// What NodeStage does with the volume once it is usable on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Activate,
    OpenEncryption,
    /// A static volume's directory: checked, never bound (NodePublish binds
    /// the source itself).
    CheckDirectory,
    BindDirectory,
    /// Raw block: only the staging path is checked.
    CheckStagingPath,
    /// A filesystem volume: [`filesystem_steps`] once the staging path
    /// has been looked at.
    Filesystem,
}

/// The steps of NodeStage for a volume, from facts alone: `activate` as
/// [`needs_activation`] found it.
pub fn stage_steps(
    vol: &Volume,
    src: &Source,
    encrypted: bool,
    stages_dirs: bool,
    activate: bool,
) -> Vec<Step> {
    let mut steps = Vec::new();
    if activate {
        steps.push(Step::Activate);
    }
    if encrypted {
        steps.push(Step::OpenEncryption);
    }
    steps.push(match (src, vol.access_type) {
        (Source::Directory(_), _) if !stages_dirs => Step::CheckDirectory,
        (Source::Directory(_), _) => Step::BindDirectory,
        (Source::Device(_), AccessType::Block) => Step::CheckStagingPath,
        (Source::Device(_), AccessType::Mount) => Step::Filesystem,
    });
    steps
}

/// A filesystem volume's part of NodeStage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsStep {
    /// Make the filesystem: over the whole device when the pool says the
    /// driver never finished one there, else only on a blank device.
    Format {
        whole: bool,
    },
    /// Tell the pool the filesystem exists, before anything is written to it.
    MarkFormatted,
    Mount,
    /// Resize the mapping (encrypted), grow the filesystem, tell the pool.
    Grow,
}

/// The filesystem steps: `staged` when the staging path already holds the
/// volume's filesystem (a retry), `unformatted` and `grow` as the pool
/// recorded them.
pub fn filesystem_steps(staged: bool, unformatted: bool, grow: bool) -> Vec<FsStep> {
    let mut steps = Vec::new();
    if !staged {
        steps.push(FsStep::Format { whole: unformatted });
        if unformatted {
            steps.push(FsStep::MarkFormatted);
        }
        steps.push(FsStep::Mount);
    }
    if grow {
        steps.push(FsStep::Grow);
    }
    steps
}

/// Whether the pool must make `vol` usable on the node first: it says the
/// volume is inactive, or the device the volume lives on (an encrypted
/// one's backing device) has no node, as an lvm killed between resuming
/// the device and making its nodes leaves it.
async fn needs_activation(vol: &Volume, src: &Source, enc: Option<&Encrypted>) -> Result<bool> {
    if vol.inactive {
        return Ok(true);
    }
    let dev = match (enc, src) {
        (Some(enc), _) => enc.backing.clone(),
        (None, Source::Device(dev)) => dev.clone(),
        (None, Source::Directory(_)) => return Ok(false),
    };
    blocking(move || Ok::<_, StepError>(!dev.exists())).await
}

/// NodeStageVolume's steps for `vol` of `pool`.
pub async fn stage<P: NodeSide + ?Sized>(pool: &P, vol: &Volume, req: Stage) -> Result<()> {
    let enc = pool.encrypted(vol)?;
    let src = pool.source(vol)?;
    let Stage {
        staging,
        fs_type,
        format,
        mount,
        key,
    } = req;
    if enc.is_some() && key.is_none() {
        // Refused before anything is touched, activation included.
        return Err(StepError::KeyRequired {
            id: vol.id.to_string(),
        });
    }
    let activate = needs_activation(vol, &src, enc.as_ref()).await?;
    for step in stage_steps(
        vol,
        &src,
        enc.is_some(),
        pool.stages_directories(),
        activate,
    ) {
        match step {
            Step::Activate => pool.activate(vol).await?,
            Step::OpenEncryption => {
                let (Some(enc), Some(key)) = (&enc, &key) else {
                    return Err(StepError::KeyRequired {
                        id: vol.id.to_string(),
                    });
                };
                // LUKS2 on the LV if it is blank (or, never written, holds
                // what a cut-short luksFormat left), then open (or reuse)
                // the mapping: the source is the mapping from here on.
                crypt::ensure_open(&enc.backing, &enc.mapping, key, vol.unformatted).await?;
            }
            Step::CheckDirectory => {
                let dir = source_path(&src);
                let staging = staging.clone();
                blocking(move || -> Result<()> {
                    staging.resolve()?;
                    Ok(super::check_dir(&dir)?)
                })
                .await?;
            }
            Step::BindDirectory => {
                let (dir, staging) = (source_path(&src), staging.clone());
                blocking(move || -> Result<()> {
                    Ok(super::stage_dir(&dir, &staging.resolve()?)?)
                })
                .await?;
            }
            Step::CheckStagingPath => {
                let staging = staging.clone();
                blocking(move || Ok::<_, StepError>(staging.resolve()?)).await?;
            }
            Step::Filesystem => {
                let Source::Device(dev) = &src else {
                    unreachable!("stage_steps: Filesystem is for device sources");
                };
                drop(key);
                let fs = FsChoice {
                    requested: fs_type,
                    default: pool.default_fs_type(),
                    format,
                };
                return stage_filesystem(pool, vol, enc.as_ref(), dev, &staging, fs, mount).await;
            }
        }
    }
    Ok(())
}

/// Where the source is: the volume's directory or its device node (the
/// step that asks knows which kind it has).
fn source_path(src: &Source) -> PathBuf {
    match src {
        Source::Directory(d) => d.clone(),
        Source::Device(d) => d.clone(),
    }
}

/// The filesystem a request asks for and the pool's default.
#[derive(Clone, Copy)]
struct FsChoice {
    requested: Option<FsType>,
    default: Option<FsType>,
    /// How a blank device is formatted.
    format: FormatOptions,
}

async fn stage_filesystem<P: NodeSide + ?Sized>(
    pool: &P,
    vol: &Volume,
    enc: Option<&Encrypted>,
    dev: &Path,
    staging: &RequestPath,
    choice: FsChoice,
    mount: MountOptions,
) -> Result<()> {
    let (d, st) = (dev.to_path_buf(), staging.clone());
    let (staging, staged) = blocking(move || -> Result<_> {
        let staging = st.resolve()?;
        let want = super::device_fs_location(&d)?;
        let staged = super::staged_fs_type(&staging, &want)?;
        Ok((staging, staged))
    })
    .await?;
    // What Format makes; a staged filesystem's type is read only if it is
    // grown (a retry that has nothing left to do answers OK as it is).
    let mut fs = None;
    let steps = filesystem_steps(staged.is_some(), vol.unformatted, vol.grow_filesystem);
    let mut mount = Some(mount);
    for step in steps {
        match step {
            FsStep::Format { whole } => {
                fs = Some(prepare_filesystem(dev, choice, whole).await?);
            }
            FsStep::MarkFormatted => pool.filesystem_made(vol).await?,
            FsStep::Mount => {
                let fs = fs.expect("filesystem_steps: Format comes before Mount");
                let MountOptions { flags, mut data } = mount.take().unwrap_or_default();
                if !fs.default_mount_data().is_empty() {
                    data.push(fs.default_mount_data().to_owned());
                }
                let data = data.join(",");
                let (d, st) = (dev.to_path_buf(), staging.clone());
                blocking(move || -> Result<_> {
                    Ok(super::stage_device(&d, &st, fs.as_str(), flags, &data)?)
                })
                .await?;
            }
            FsStep::Grow => {
                // Restored or cloned into a larger volume, or a retry after
                // a grow failed: the filesystem still has its source's size.
                let fs = match (fs, &staged) {
                    (Some(fs), _) => fs,
                    (None, Some(t)) => parse_found(dev, t)?,
                    (None, None) => unreachable!("filesystem_steps: Format comes before Grow"),
                };
                grow(pool, vol, enc, Some((dev, &staging, fs))).await?;
            }
        }
    }
    Ok(())
}

/// A filesystem type found on a device or at a mount point.
fn parse_found(dev: &Path, found: &str) -> Result<FsType> {
    FsType::parse(found).map_err(|_| StepError::Unmountable {
        dev: dev.into(),
        found: found.into(),
    })
}

/// Picks the filesystem for a device volume and creates it if the device is
/// blank (or, `whole`, over whatever a cut-short format of the driver's own
/// left). Existing data is never reformatted: a filesystem already there is
/// used as it is, and a request for another type is refused.
async fn prepare_filesystem(dev: &Path, choice: FsChoice, whole: bool) -> Result<FsType> {
    let fs_if_blank = choice.requested.or(choice.default).unwrap_or(FsType::Ext4);
    if whole {
        // The pool says the driver never finished a filesystem here: what is
        // on the device can only be a format of its own cut short.
        let found = blockdev::format_whole(dev, fs_if_blank, &choice.format).await?;
        if found != Content::Empty {
            tracing::warn!(
                device = ?dev,
                ?found,
                "replaced what a cut-short format left on a volume that was never formatted"
            );
        }
        return Ok(fs_if_blank);
    }
    match blockdev::format_if_blank(dev, fs_if_blank, &choice.format).await? {
        Content::Empty => Ok(fs_if_blank),
        Content::Filesystem(t) => {
            let found = parse_found(dev, &t)?;
            match choice.requested {
                Some(r) if r != found => Err(StepError::OtherFilesystem {
                    dev: dev.into(),
                    found: t,
                    requested: r.as_str(),
                }),
                _ => Ok(found),
            }
        }
        Content::Luks => Err(StepError::UnrecordedLuks { dev: dev.into() }),
        Content::Other(what) => Err(StepError::ForeignContent {
            dev: dev.into(),
            what,
        }),
    }
}

/// The one grow sequence: an encrypted volume's mapping grows to its LV,
/// then the filesystem on it (`fs`: the device, where it is mounted, its
/// type) grows online; a volume whose pool asked for the grow is told it
/// happened.
async fn grow<P: NodeSide + ?Sized>(
    pool: &P,
    vol: &Volume,
    enc: Option<&Encrypted>,
    fs: Option<(&Path, &Path, FsType)>,
) -> Result<()> {
    if let Some(enc) = enc {
        crypt::resize(&enc.mapping).await?;
    }
    if let Some((dev, mount_point, fs)) = fs {
        blockdev::grow_fs(dev, mount_point, fs).await?;
        if vol.grow_filesystem {
            pool.filesystem_grown(vol).await?;
        }
    }
    Ok(())
}

/// A decoded NodePublishVolume (not an inline volume's).
pub struct Publish {
    pub target: RequestPath,
    pub staging: Option<RequestPath>,
    pub read_only: bool,
    pub mode: AccessMode,
    pub mount: MountOptions,
}

/// How NodePublish reaches the volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublishFrom {
    /// Raw block: the device node, bound onto a file.
    Device,
    /// A static volume: its directory, never staged.
    Source,
    /// What NodeStage mounted at the staging path.
    Staging,
}

pub fn publish_from(src: &Source, access: AccessType, stages_dirs: bool) -> PublishFrom {
    match (src, access) {
        (Source::Device(_), AccessType::Block) => PublishFrom::Device,
        (Source::Directory(_), _) if !stages_dirs => PublishFrom::Source,
        _ => PublishFrom::Staging,
    }
}

/// NodePublishVolume's steps for `vol` of `pool`.
pub async fn publish<P: NodeSide + ?Sized>(pool: &P, vol: &Volume, req: Publish) -> Result<()> {
    let src = pool.source(vol)?;
    if let Some(enc) = pool.encrypted(vol)? {
        // Its source is the mapping NodeStage opens (with the key).
        let name = enc.mapping.clone();
        if blocking(move || Ok::<_, StepError>(crypt::mapped_device(&name)?))
            .await?
            .is_none()
        {
            return Err(StepError::EncryptedNotStaged {
                id: vol.id.to_string(),
                mapping: enc.mapping,
            });
        }
    }
    let read_only = req.read_only || req.mode.read_only();
    let single_writer = req.mode == AccessMode::SingleNodeSingleWriter;
    let flags = req.mount.flags;
    let access = vol.access_type;
    match publish_from(&src, access, pool.stages_directories()) {
        PublishFrom::Device => {
            if needs_activation(vol, &src, None).await? {
                pool.activate(vol).await?;
            }
            let (dev, target) = (source_path(&src), req.target);
            blocking(move || -> Result<_> {
                let (scope, target) = target.resolve_in()?;
                Ok(super::publish_block(
                    &dev,
                    &scope,
                    &target,
                    read_only,
                    single_writer,
                )?)
            })
            .await
        }
        PublishFrom::Source => {
            let (dir, target) = (source_path(&src), req.target);
            blocking(move || -> Result<_> {
                let (scope, target) = target.resolve_in()?;
                Ok(super::publish_unstaged(
                    &scope,
                    &dir,
                    &target,
                    read_only,
                    flags,
                    single_writer,
                )?)
            })
            .await
        }
        PublishFrom::Staging => {
            let staging = req.staging.ok_or(StepError::StagingRequired)?;
            let target = req.target;
            blocking(move || -> Result<_> {
                let (staging, (scope, target)) = (staging.resolve()?, target.resolve_in()?);
                Ok(super::publish(
                    &scope,
                    &staging,
                    &target,
                    &src,
                    access,
                    read_only,
                    flags,
                    single_writer,
                )?)
            })
            .await
        }
    }
}

/// Where a NodeGetVolumeStats or NodeExpandVolume path holds the volume.
pub struct VolumeAtPath {
    pub path: PathBuf,
    /// `Err(why)`: the volume is not mounted at the path.
    pub mounted: std::result::Result<(), String>,
    /// statvfs at the path, when asked for.
    pub stats: Option<fsutil::FsStats>,
}

/// What the path a request names holds, seen from the volume, in one
/// blocking call: `NotAtPath` when the path cannot hold a volume of this
/// driver (relative, outside the kubelet dir), is missing, or holds another
/// mount (NOT_FOUND), otherwise whether the volume is mounted there and,
/// with `stats`, the filesystem's figures there. `id` is the volume as the
/// request names it (a static volume's handle).
pub async fn volume_at_path(
    place: PathPlace,
    src: Source,
    vol: &Volume,
    id: &str,
    stats: bool,
) -> Result<VolumeAtPath> {
    let access = vol.access_type;
    let id = id.to_owned();
    let path = match place {
        PathPlace::Below(rp) => rp,
        PathPlace::Elsewhere(why) => {
            return Err(StepError::NotAtPath(format!(
                "volume {id} is not at that path: {why}"
            )))
        }
    };
    blocking(move || -> Result<_> {
        let path = path.resolve()?;
        let mounted = match super::volume_at(&path, &src, access)? {
            MountAt::Missing => {
                return Err(StepError::NotAtPath(format!(
                    "volume_path {path:?} does not exist"
                )))
            }
            MountAt::Volume => Ok(()),
            MountAt::Unlocated(why) => Err(why),
            MountAt::Nothing => Err(format!("{path:?} is not a mount of this volume")),
            MountAt::Stale => Err(format!(
                "{path:?} is not a mount of this volume: it binds the volume's device node as it was before the device was recreated"
            )),
            MountAt::Other => {
                return Err(StepError::NotAtPath(format!(
                    "volume {id} is not at {path:?}: another mount is there"
                )))
            }
        };
        let stats = match stats {
            true => Some(fsutil::fs_stats(&path)?),
            false => None,
        };
        Ok(VolumeAtPath {
            path,
            mounted,
            stats,
        })
    })
    .await
}

/// A decoded NodeExpandVolume, its path already found to hold the volume.
pub struct Expand {
    pub id: VolumeId,
    pub range: CapacityRange,
    /// Where the volume is: the request's volume path.
    pub at: VolumeAtPath,
    /// The staging path, when the request gave one (a filesystem is grown
    /// where it is mounted).
    pub staging: Option<PathBuf>,
}

/// NodeExpandVolume's steps: the pool grows the volume when the node holds
/// it (a central resizer's ControllerExpandVolume may have run elsewhere),
/// then [`grow`]. Any size at least the current one is OK; nothing shrinks.
/// Returns the volume's size.
pub async fn expand<P: Pool + ?Sized>(pool: &P, vol: &Volume, req: Expand) -> Result<u64> {
    let Expand {
        id,
        range,
        at,
        staging,
    } = req;
    if let Err(why) = at.mounted {
        return Err(StepError::NotMountedHere {
            id: id.to_string(),
            why,
        });
    }
    let size = if range.required > vol.size_bytes || pool.expands_on_node() {
        pool.expand(&id, range).await?.size_bytes
    } else {
        vol.size_bytes
    };
    let enc = pool.encrypted(vol)?;
    let fs = match (pool.source(vol)?, vol.access_type) {
        (Source::Device(dev), AccessType::Mount) => {
            let mount_point = staging.unwrap_or(at.path);
            let mp = mount_point.clone();
            let fs =
                blocking(move || super::fs_type_at(&mp))
                    .await?
                    .ok_or(StepError::NotMounted {
                        path: mount_point.clone(),
                    })?;
            let fs = parse_found(&mount_point, &fs)?;
            Some((dev, mount_point, fs))
        }
        _ => None,
    };
    let fs = fs.as_ref().map(|(d, m, t)| (d.as_path(), m.as_path(), *t));
    grow(pool, vol, enc.as_ref(), fs).await?;
    Ok(size)
}

#[cfg(test)]
mod tests;
