//! The mount-state steps: each one idempotent, decided from probes of the
//! paths involved and, when they do not settle it, one reading of the mount
//! table (see the module above).

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sys_mount::MountFlags;

use super::{describe, look, nothing_at, probe_dir, NodeError, Result, Seen, MAX_STACKED};
use crate::error::{IoContext, IoError};
use crate::mount::{self, Location, MountError, MountTable};
use crate::pool::{AccessType, Source};

/// Where a directory volume lives in the mount table.
pub fn locate_dir(table: &MountTable, src: &Path) -> Result<Location> {
    let md = fs::symlink_metadata(src).map_err(|e| match e.kind() {
        ErrorKind::NotFound => NodeError::VolumeDirMissing { path: src.into() },
        _ => IoError::new(format!("inspecting {src:?}"), e).into(),
    })?;
    if !md.is_dir() {
        return Err(NodeError::NotADirectory { path: src.into() });
    }
    Ok(table
        .locate(src)
        .ok_or(MountError::Unlocated { path: src.into() })?)
}

/// What a mount of this volume looks like in the mount table: for a directory,
/// the directory's location; for a device's filesystem, the device's
/// `major:minor` and `/`; for a raw block volume, the device node's location.
pub fn locate_volume(table: &MountTable, src: &Source, access: AccessType) -> Result<Location> {
    match (src, access) {
        (Source::Directory(p), _) => locate_dir(table, p),
        (Source::Device(dev), AccessType::Mount) => device_fs_location(dev),
        (Source::Device(dev), AccessType::Block) => Ok(mount::locate_device_node(table, dev)?),
    }
}

/// What a mount of a device's filesystem shows in the mount table: the
/// device's `major:minor` and `/` (no table needed).
pub fn device_fs_location(dev: &Path) -> Result<Location> {
    let (_, md) = mount::block_device(dev)?;
    let rdev = md.rdev();
    Ok(Location {
        dev: format!("{}:{}", libc::major(rdev), libc::minor(rdev)),
        root: PathBuf::from("/"),
    })
}

/// The filesystem type at `staging` when it already holds the device's
/// filesystem (`want`), None when nothing is mounted there. Something else
/// there is ALREADY_EXISTS.
pub fn staged_fs_type(staging: &Path, want: &Location) -> Result<Option<String>> {
    if nothing_at(staging)? == Some(true) {
        return Ok(None);
    }
    let table = MountTable::read()?;
    Ok(match staged_in(&table, staging, want)? {
        true => table.at(staging).map(|m| m.fs_type.clone()),
        false => None,
    })
}

/// Whether `staging` holds the device's filesystem, in a table the caller has read.
fn staged_in(table: &MountTable, staging: &Path, want: &Location) -> Result<bool> {
    match table.at(staging) {
        None => Ok(false),
        Some(m) if m.location() == *want => Ok(true),
        Some(m) => Err(NodeError::Occupied {
            path: staging.into(),
            found: describe(m),
        }),
    }
}

/// Mounts a device's filesystem on `staging` (the caller made sure it has
/// one). Already mounted there: OK.
pub fn stage_device(
    dev: &Path,
    staging: &Path,
    fs_type: &str,
    flags: MountFlags,
    data: &str,
) -> Result<()> {
    let want = device_fs_location(dev)?;
    ensure_mount_dir(staging)?;
    if nothing_at(staging)? != Some(true) && staged_in(&MountTable::read()?, staging, &want)? {
        return Ok(());
    }
    Ok(mount::mount_device(dev, staging, fs_type, flags, data)?)
}

/// The filesystem type of the mount at `path`, if any.
pub fn fs_type_at(path: &Path) -> Result<Option<String>> {
    Ok(MountTable::read()?.at(path).map(|m| m.fs_type.clone()))
}

/// Binds a raw block device onto a file at `target` (created empty if missing,
/// as the spec asks of the plugin). Already bound from this device: OK.
/// With `single_writer` (SINGLE_NODE_SINGLE_WRITER), a volume already
/// published at another target is FAILED_PRECONDITION.
/// `scope`: the kubelet dir, where other pods' mounts would be.
pub fn publish_block(
    dev: &Path,
    scope: &Path,
    target: &Path,
    read_only: bool,
    single_writer: bool,
) -> Result<()> {
    let (real, _) = mount::block_device(dev)?;
    // Nothing at the target and no other publication to look for: nothing
    // to compare, no table.
    if single_writer || nothing_at(target)? != Some(true) {
        let table = MountTable::read()?;
        let want = table
            .locate(&real)
            .ok_or(MountError::Unlocated { path: real.clone() })?;
        // Already bound: the target now shows the device node, not a file.
        if let Some(m) = table.at(target) {
            if m.location() == want && m.read_only == read_only {
                return Ok(());
            }
            return Err(NodeError::Occupied {
                path: target.into(),
                found: format!("{}, read-only {}", describe(m), m.read_only),
            });
        }
        if single_writer {
            refuse_other_mounts(&table, scope, &want, &[target])?;
        }
    }
    match fs::symlink_metadata(target) {
        Ok(md) if md.is_file() => {}
        Ok(_) => {
            return Err(NodeError::NotAFile {
                path: target.into(),
            })
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(target)
                .map_err(|e| match e.kind() {
                    ErrorKind::NotFound => NodeError::ParentMissing {
                        path: target.into(),
                    },
                    _ => IoError::new(format!("creating {target:?}"), e).into(),
                })?;
        }
        Err(e) => return Err(IoError::new(format!("inspecting {target:?}"), e).into()),
    }
    let flags = if read_only {
        MountFlags::RDONLY
    } else {
        MountFlags::empty()
    };
    if let Err(e) = mount::bind(&real, target, flags) {
        let _ = fs::remove_file(target);
        return Err(e.into());
    }
    Ok(())
}

/// Creates the directory a mount goes on; its parent must exist.
fn ensure_mount_dir(path: &Path) -> Result<()> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            let md = fs::symlink_metadata(path).ctx(|| format!("inspecting {path:?}"))?;
            if md.is_dir() {
                Ok(())
            } else {
                Err(NodeError::NotADirectory { path: path.into() })
            }
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            Err(NodeError::ParentMissing { path: path.into() })
        }
        Err(e) => Err(IoError::new(format!("creating {path:?}"), e).into()),
    }
}

/// Binds a directory volume onto `staging`. Already staged from the same
/// directory: OK. Something else mounted there: ALREADY_EXISTS.
pub fn stage_dir(src: &Path, staging: &Path) -> Result<()> {
    if let Some(vol) = probe_dir(src)? {
        ensure_mount_dir(staging)?;
        match look(staging)? {
            Seen::Unmounted(_) => return Ok(mount::bind(src, staging, MountFlags::empty())?),
            Seen::Mounted(p) if p.same_inode(&vol) => return Ok(()),
            // Something else is there: the table describes it.
            _ => {}
        }
    }
    let table = MountTable::read()?;
    let want = locate_dir(&table, src)?;
    ensure_mount_dir(staging)?;
    if let Some(m) = table.at(staging) {
        if m.location() == want {
            return Ok(());
        }
        return Err(NodeError::Occupied {
            path: staging.into(),
            found: describe(m),
        });
    }
    Ok(mount::bind(src, staging, MountFlags::empty())?)
}

/// Binds a directory volume straight onto a pod's `target`, with per-mount
/// `flags` (ephemeral inline volumes: kubelet stages nothing). Already bound
/// from the same directory: OK. Something else mounted there: ALREADY_EXISTS.
pub fn publish_dir(src: &Path, target: &Path, flags: MountFlags) -> Result<()> {
    let table = MountTable::read()?;
    let want = locate_dir(&table, src)?;
    if let Some(m) = table.at(target) {
        if m.location() == want {
            return Ok(());
        }
        return Err(NodeError::Occupied {
            path: target.into(),
            found: describe(m),
        });
    }
    ensure_mount_dir(target)?;
    if let Err(e) = mount::bind(src, target, flags) {
        let _ = fs::remove_dir(target);
        return Err(e.into());
    }
    Ok(())
}

/// The directory of a volume that is published without staging is there
/// (NodeStage of such a volume: nothing to mount, only this to check).
pub fn check_dir(src: &Path) -> Result<()> {
    let table = MountTable::read()?;
    locate_dir(&table, src).map(|_| ())
}

/// Publishes a directory volume that is never staged (see
/// `NodeSide::stages_directories`): binds `src` itself onto `target`.
/// Already bound there: OK. SINGLE_NODE_SINGLE_WRITER: refused while the
/// volume is mounted at another pod's target.
pub fn publish_unstaged(
    scope: &Path,
    src: &Path,
    target: &Path,
    read_only: bool,
    flags: MountFlags,
    single_writer: bool,
) -> Result<()> {
    let flags = if read_only {
        flags | MountFlags::RDONLY
    } else {
        flags
    };
    if single_writer {
        let table = MountTable::read()?;
        let volume = locate_dir(&table, src)?;
        refuse_other_mounts(&table, scope, &volume, &[src, target])?;
    }
    publish_dir(src, target, flags)
}

/// Which mounts at a path an unstage or unpublish may remove.
enum Ours {
    /// No volume to compare with (the caller knows of none): any mount.
    Anything,
    /// Mounts of these locations, or of their `//deleted` forms.
    At(Vec<Location>),
    /// A volume whose device node is gone (an inactive or removed LV): only
    /// binds of a device node that was deleted can be left of it.
    DeletedDeviceNode,
}

impl Ours {
    fn of(table: &MountTable, volume: Option<(&Source, AccessType)>) -> Ours {
        let Some((src, access)) = volume else {
            return Ours::Anything;
        };
        if let Ok(loc) = locate_volume(table, src, access) {
            return Ours::At(vec![loc]);
        }
        match src {
            // The directory is gone: its binds show where it was, which its
            // parent (the pool's folder) still tells. A parent that cannot
            // be located either: nothing can be proven ours.
            Source::Directory(dir) => Ours::At(former_location(table, dir).into_iter().collect()),
            Source::Device(_) => Ours::DeletedDeviceNode,
        }
    }

    fn location(&self) -> Option<&Location> {
        match self {
            Ours::At(locs) => locs.first(),
            _ => None,
        }
    }

    fn admits(&self, m: &mount::MountEntry) -> bool {
        let found = m.location();
        match self {
            Ours::Anything => true,
            Ours::At(exp) => exp
                .iter()
                .any(|e| found == *e || is_deleted_copy(&found, e)),
            Ours::DeletedDeviceNode => {
                use std::os::unix::ffi::OsStrExt;
                m.fs_type == "devtmpfs" && m.root.as_os_str().as_bytes().ends_with(b"//deleted")
            }
        }
    }
}

/// Where a directory that no longer exists was, from its parent's location.
fn former_location(table: &MountTable, dir: &Path) -> Option<Location> {
    let parent = table.locate(dir.parent()?)?;
    Some(Location {
        dev: parent.dev,
        root: parent.root.join(dir.file_name()?),
    })
}

/// Unmounts whatever this volume mounted at `path` (all stacked copies, top
/// first). A mount of something else is left alone and reported. `table` is
/// this call's reading: it lists every mount stacked at `path`, so each layer
/// is checked against it before it is unmounted and nothing needs reading
/// again after the unmounts.
fn unmount_all(table: &MountTable, path: &Path, ours: &Ours) -> Result<()> {
    for m in table.stack_at(path).take(MAX_STACKED) {
        if !ours.admits(m) {
            return Err(NodeError::ForeignMount {
                path: path.into(),
                found: describe(m),
            });
        }
        mount::unmount(path)?;
    }
    if table.count_at(path) > MAX_STACKED {
        return Err(NodeError::TooManyStacked { path: path.into() });
    }
    Ok(())
}

/// Whether a mount is of `exp` as it was before being deleted and recreated:
/// a raw block volume's bind of its device node after the LV was deactivated
/// and activated again shows the node's path with `//deleted` appended. It
/// is still this volume's publication, and unpublish must be able to remove it.
fn is_deleted_copy(found: &Location, exp: &Location) -> bool {
    use std::os::unix::ffi::OsStrExt;
    found.dev == exp.dev
        && found.root.as_os_str().as_bytes()
            == [exp.root.as_os_str().as_bytes(), b"//deleted"].concat()
}

/// [`NodeError::PublishedElsewhere`] when the volume (`loc`, exactly: mounts of its
/// subdirectories, like kubelet's subPath binds, are other things) is mounted
/// anywhere below `scope` (the kubelet dir: where the CO's staging and target
/// paths are) but at `except`. Mounts elsewhere, like a discovered disk's own
/// mount point, are not a pod's.
fn refuse_other_mounts(
    table: &MountTable,
    scope: &Path,
    loc: &Location,
    except: &[&Path],
) -> Result<()> {
    let other = table.mounts_of(loc).find(|m| {
        m.root == loc.root
            && m.mount_point.starts_with(scope)
            && !except.contains(&m.mount_point.as_path())
    });
    match other {
        None => Ok(()),
        Some(m) => Err(NodeError::PublishedElsewhere {
            at: m.mount_point.clone(),
        }),
    }
}

/// Unmounts a volume's staging mount at `path` (whose directory belongs to
/// the CO and stays). Only the volume's staged form is removed (any mount
/// when it is None; see [`Ours`] when it cannot be located): a directory's
/// bind or a device's filesystem; raw block volumes have nothing at their
/// staging path.
/// `scope`: the kubelet dir, where a pod's mounts of the volume would be.
pub fn unstage(scope: &Path, path: &Path, volume: Option<&Source>) -> Result<()> {
    if nothing_at(path)? == Some(true) {
        return Ok(());
    }
    let table = MountTable::read()?;
    let ours = Ours::of(&table, volume.map(|s| (s, AccessType::Mount)));
    if let Some(loc) = ours.location() {
        refuse_unstage_while_published(&table, scope, path, loc)?;
    }
    unmount_all(&table, path, &ours)
}

/// A staging mount goes only after every publication of it: while the volume
/// is also mounted elsewhere, `path` is either a staging path whose pods still
/// use it, or a pod's target passed off as a staging path. Either way the
/// mount stays (FAILED_PRECONDITION). Nothing mounted at `path`: nothing to
/// refuse.
fn refuse_unstage_while_published(
    table: &MountTable,
    scope: &Path,
    path: &Path,
    loc: &Location,
) -> Result<()> {
    if table.at(path).is_none_or(|m| m.location() != *loc) {
        return Ok(());
    }
    refuse_other_mounts(table, scope, loc, &[path]).map_err(|e| match e {
        NodeError::PublishedElsewhere { at } => NodeError::StillPublished {
            path: path.into(),
            at,
        },
        e => e,
    })
}

/// Where a device volume's mounts can be, known only by its device path:
/// its filesystem (mount access) or a bind of its node (block access).
/// None when `dev` is no block device (an inactive or missing LV): then the
/// caller must look the volume up to know what to expect.
fn device_locations(table: &MountTable, dev: &Path) -> Option<Vec<Location>> {
    let src = Source::Device(dev.to_path_buf());
    let fs = locate_volume(table, &src, AccessType::Mount).ok()?;
    let mut all = vec![fs];
    all.extend(locate_volume(table, &src, AccessType::Block).ok());
    Some(all)
}

/// [`unstage`] of a device volume by its device path alone (no lookup of its
/// access type). `Ok(false)`, having done nothing, when the device is not
/// there.
/// A staging path only ever holds the device's filesystem (raw block volumes
/// are not mounted at staging), so a bind of the device node there is a pod's
/// target and stays.
pub fn unstage_device(scope: &Path, path: &Path, dev: &Path) -> Result<bool> {
    if nothing_at(path)? == Some(true) {
        return Ok(mount::block_device(dev).is_ok());
    }
    let table = MountTable::read()?;
    let Some(expected) = device_locations(&table, dev) else {
        return Ok(false);
    };
    let fs = &expected[..1];
    refuse_unstage_while_published(&table, scope, path, &fs[0])?;
    unmount_all(&table, path, &Ours::At(fs.to_vec()))?;
    Ok(true)
}

/// [`unpublish`] of a device volume by its device path alone, like
/// [`unstage_device`].
/// (`_scope` is unused: any number of pods may go.)
pub fn unpublish_device(_scope: &Path, target: &Path, dev: &Path) -> Result<bool> {
    if nothing_at(target)? == Some(true) {
        if mount::block_device(dev).is_err() {
            return Ok(false);
        }
        remove_target(target)?;
        return Ok(true);
    }
    let table = MountTable::read()?;
    let Some(expected) = device_locations(&table, dev) else {
        return Ok(false);
    };
    unmount_all(&table, target, &Ours::At(expected))?;
    remove_target(target)?;
    Ok(true)
}

/// Binds the staged volume (`src`, located in the mount table) onto `target`,
/// read-only if asked, with extra per-mount flags. Not staged there (nothing, or
/// another volume, at `staging`): FAILED_PRECONDITION. Already published the same
/// way: OK; published with another source or another read-only setting:
/// ALREADY_EXISTS. With `single_writer` (SINGLE_NODE_SINGLE_WRITER), a volume
/// already published at another target below `scope` (the kubelet dir) is
/// FAILED_PRECONDITION.
#[allow(clippy::too_many_arguments)]
pub fn publish(
    scope: &Path,
    staging: &Path,
    target: &Path,
    src: &Source,
    access: AccessType,
    read_only: bool,
    flags: MountFlags,
    single_writer: bool,
) -> Result<()> {
    let want_ro = read_only || flags.contains(MountFlags::RDONLY);
    let flags = if want_ro {
        flags | MountFlags::RDONLY
    } else {
        flags
    };
    if let (Source::Directory(dir), false) = (src, single_writer) {
        if publish_dir_probed(dir, staging, target, flags)? {
            return Ok(());
        }
    }
    let table = MountTable::read()?;
    // The staging path must hold this volume, not whatever is there.
    let volume = &locate_volume(&table, src, access)?;
    let staged = table
        .at(staging)
        .ok_or_else(|| NodeError::NotStaged {
            staging: staging.into(),
            found: None,
        })?
        .location();
    if staged != *volume {
        return Err(NodeError::NotStaged {
            staging: staging.into(),
            found: Some(format!("{}:{:?}", staged.dev, staged.root)),
        });
    }
    if let Some(m) = table.at(target) {
        if m.location() == staged && m.read_only == want_ro {
            return Ok(());
        }
        return Err(NodeError::Occupied {
            path: target.into(),
            found: format!(
                "{} read-only: {}; the request asks for read-only: {want_ro}",
                if m.location() == staged {
                    "this volume,"
                } else {
                    "something else,"
                },
                m.read_only
            ),
        });
    }
    if single_writer {
        refuse_other_mounts(&table, scope, volume, &[staging, target])?;
    }
    bind_target(staging, target, flags)
}

/// Creates the target directory and binds the staging path onto it; a
/// failed bind takes the new directory away again.
fn bind_target(staging: &Path, target: &Path, flags: MountFlags) -> Result<()> {
    ensure_mount_dir(target)?;
    if let Err(e) = mount::bind(staging, target, flags) {
        let _ = fs::remove_dir(target);
        return Err(e.into());
    }
    Ok(())
}

/// [`publish`] of a directory volume decided by probes alone: done (`true`)
/// when the staging path holds the volume directory and nothing is mounted
/// at the target yet, the common case. `false`, having done nothing, for
/// anything else (not staged, something at the target, an old kernel): the
/// caller decides from the table.
fn publish_dir_probed(
    dir: &Path,
    staging: &Path,
    target: &Path,
    flags: MountFlags,
) -> Result<bool> {
    let Some(vol) = probe_dir(dir)? else {
        return Ok(false);
    };
    if !matches!(look(staging)?, Seen::Mounted(p) if p.same_inode(&vol)) {
        return Ok(false);
    }
    if nothing_at(target)? != Some(true) {
        return Ok(false);
    }
    bind_target(staging, target, flags)?;
    Ok(true)
}

/// [`unpublish`] of a directory volume by probes alone: unmounts while the
/// top mount at `target` is the volume directory, and answers `true` once
/// nothing is mounted there. `false` when something else is on top (another
/// volume, a copy of a directory since removed) or the volume directory is
/// not there: the caller decides the rest from the table.
fn unpublish_dir_probed(target: &Path, dir: &Path) -> Result<bool> {
    let vol = match look(dir)? {
        Seen::Mounted(p) | Seen::Unmounted(p) if p.is_dir => p,
        _ => return Ok(false),
    };
    for _ in 0..MAX_STACKED {
        match look(target)? {
            Seen::Missing | Seen::Unmounted(_) => return Ok(true),
            Seen::Mounted(p) if p.same_inode(&vol) => mount::unmount(target)?,
            Seen::Mounted(_) | Seen::Unknown => return Ok(false),
        }
    }
    match nothing_at(target)? {
        Some(true) => Ok(true),
        _ => Err(NodeError::TooManyStacked {
            path: target.into(),
        }),
    }
}

/// Unmounts `target` and removes it without recursion; a target that is already
/// gone is fine. Only mounts of `volume` are removed (any mount when it is
/// None; see [`Ours`] when it cannot be located).
pub fn unpublish(target: &Path, volume: Option<(&Source, AccessType)>) -> Result<()> {
    if let Some((Source::Directory(dir), _)) = volume {
        if unpublish_dir_probed(target, dir)? {
            return remove_target(target);
        }
    }
    let table = MountTable::read()?;
    unmount_all(&table, target, &Ours::of(&table, volume))?;
    remove_target(target)
}

/// For a target whose volume is unknown: removes it (never recursively)
/// when nothing is mounted there, and answers whether it did; a mount there
/// is left alone, since nothing says whose it is.
pub fn remove_unmounted_target(target: &Path) -> Result<bool> {
    let empty = match nothing_at(target)? {
        Some(e) => e,
        None => MountTable::read()?.at(target).is_none(),
    };
    if !empty {
        return Ok(false);
    }
    remove_target(target)?;
    Ok(true)
}

/// Removes an unmounted target path, never recursively.
fn remove_target(target: &Path) -> Result<()> {
    // A directory (mount volumes) or a file (raw block volumes): rmdir first,
    // which never removes anything but an empty directory.
    match fs::remove_dir(target) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            Ok(fs::remove_file(target).ctx(|| format!("removing {target:?}"))?)
        }
        Err(e) => Err(IoError::new(format!("removing {target:?}"), e).into()),
    }
}

/// What is mounted at a path a request says holds a volume.
#[derive(Debug, PartialEq, Eq)]
pub enum MountAt {
    /// The path does not exist.
    Missing,
    /// The volume itself.
    Volume,
    /// Nothing: the path is a plain file or directory.
    Nothing,
    /// A bind of the volume's device node as it was before the device was
    /// removed and made again (a deactivated and reactivated LV): the pod
    /// holds a stale node, not the live volume.
    Stale,
    /// Something else, e.g. another volume: the volume is not at this path.
    Other,
    /// The volume itself cannot be located (its directory or device is
    /// gone): why.
    Unlocated(String),
}

/// What is mounted at `path`, seen from the volume (`src`, `access`). A
/// healthy directory volume, and any path with nothing mounted, are told by
/// probes alone; the rest reads the mount table once.
pub fn volume_at(path: &Path, src: &Source, access: AccessType) -> Result<MountAt> {
    let at = look(path)?;
    if let Seen::Missing = at {
        return Ok(MountAt::Missing);
    }
    let vol = match src {
        Source::Directory(dir) => match probe_dir(dir) {
            Ok(p) => p,
            Err(e) => return Ok(MountAt::Unlocated(e.to_string())),
        },
        Source::Device(dev) => match mount::block_device(dev) {
            Ok(_) => None,
            Err(e) => return Ok(MountAt::Unlocated(NodeError::from(e).to_string())),
        },
    };
    match (at, vol) {
        (Seen::Unmounted(_), _) => return Ok(MountAt::Nothing),
        (Seen::Mounted(p), Some(v)) if p.same_inode(&v) => return Ok(MountAt::Volume),
        _ => {}
    }
    let table = MountTable::read()?;
    let loc = match locate_volume(&table, src, access) {
        Ok(loc) => loc,
        Err(e) => return Ok(MountAt::Unlocated(e.to_string())),
    };
    Ok(match table.at(path) {
        None => MountAt::Nothing,
        Some(m) if m.location() == loc => MountAt::Volume,
        Some(m) if is_deleted_copy(&m.location(), &loc) => MountAt::Stale,
        Some(_) => MountAt::Other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockdev::{self, tests::Loop, FsType};

    /// A directory volume whose directory was removed behind the driver's
    /// back: unpublish still recognises its (now `//deleted`) bind by where
    /// the directory was, and still refuses a mount of anything else at a
    /// target. Real mounts: needs root.
    #[test]
    fn unpublish_of_a_vanished_directory_takes_only_its_own_binds() {
        let d = tempfile::tempdir().unwrap();
        let (pool, other) = (d.path().join("volumes"), d.path().join("other"));
        let vol = pool.join("v1");
        let (mine, foreign) = (d.path().join("t1"), d.path().join("t2"));
        for p in [&pool, &vol, &other, &mine, &foreign] {
            fs::create_dir_all(p).unwrap();
        }
        mount::bind(&vol, &mine, MountFlags::empty()).unwrap();
        mount::bind(&other, &foreign, MountFlags::empty()).unwrap();
        fs::remove_dir(&vol).unwrap();
        let volume = Source::Directory(vol.clone());
        let mounted = |p: &Path| MountTable::read().unwrap().at(p).is_some();

        let e = unpublish(&foreign, Some((&volume, AccessType::Mount))).unwrap_err();
        assert!(matches!(e, NodeError::ForeignMount { .. }), "{e:?}");
        assert!(mounted(&foreign));

        unpublish(&mine, Some((&volume, AccessType::Mount))).unwrap();
        assert!(!mounted(&mine) && !mine.exists());
        mount::unmount(&foreign).unwrap();
    }

    /// What [`volume_at`] answered before probes: everything from one reading
    /// of the mount table.
    fn volume_at_by_table(path: &Path, src: &Source, access: AccessType) -> MountAt {
        if fs::symlink_metadata(path).is_err() {
            return MountAt::Missing;
        }
        let table = MountTable::read().unwrap();
        let loc = match locate_volume(&table, src, access) {
            Ok(loc) => loc,
            Err(e) => return MountAt::Unlocated(e.to_string()),
        };
        match table.at(path) {
            None => MountAt::Nothing,
            Some(m) if m.location() == loc => MountAt::Volume,
            Some(m) if is_deleted_copy(&m.location(), &loc) => MountAt::Stale,
            Some(_) => MountAt::Other,
        }
    }

    /// The probes' answer for a directory volume is the table's in every
    /// state a path can be in, including what others change behind the
    /// driver's back. Real mounts: needs root.
    #[test]
    fn volume_at_answers_as_the_mount_table_does() {
        let d = tempfile::tempdir().unwrap();
        let (vol, other) = (d.path().join("pool/v1"), d.path().join("pool/v2"));
        let (target, plain) = (d.path().join("target"), d.path().join("plain"));
        for p in [&vol, &other, &target, &plain] {
            fs::create_dir_all(p).unwrap();
        }
        let src = Source::Directory(vol.clone());
        let same = |path: &Path, want: MountAt| {
            let fast = volume_at(path, &src, AccessType::Mount).unwrap();
            assert_eq!(
                fast,
                volume_at_by_table(path, &src, AccessType::Mount),
                "{path:?}"
            );
            assert_eq!(fast, want, "{path:?}");
        };
        same(&d.path().join("missing"), MountAt::Missing);
        same(&plain, MountAt::Nothing);
        mount::bind(&vol, &target, MountFlags::empty()).unwrap();
        same(&target, MountAt::Volume);
        // Unmounted behind the driver's back: a plain directory again.
        mount::unmount(&target).unwrap();
        same(&target, MountAt::Nothing);
        // Another volume on top of this one's mount: only the top counts.
        mount::bind(&vol, &target, MountFlags::empty()).unwrap();
        mount::bind(&other, &target, MountFlags::empty()).unwrap();
        same(&target, MountAt::Other);
        mount::unmount(&target).unwrap();
        same(&target, MountAt::Volume);
        // The volume directory removed, then made again: the mount holds the
        // old directory, which is not the volume any more.
        fs::rename(&vol, d.path().join("aside")).unwrap();
        assert!(matches!(
            volume_at(&target, &src, AccessType::Mount).unwrap(),
            MountAt::Unlocated(_)
        ));
        same(
            &target,
            volume_at_by_table(&target, &src, AccessType::Mount),
        );
        fs::create_dir(&vol).unwrap();
        same(&target, MountAt::Other);
        mount::unmount(&target).unwrap();
    }

    /// Publish and unpublish by probes leave exactly what the table-based
    /// steps would: the bind, then nothing; a foreign mount on top of the
    /// target stops the unpublish. Real mounts: needs root.
    #[test]
    fn probed_publish_and_unpublish_touch_only_the_volume() {
        let d = tempfile::tempdir().unwrap();
        let (vol, other) = (d.path().join("pool/v1"), d.path().join("pool/v2"));
        let (staging, target) = (d.path().join("staging"), d.path().join("target"));
        for p in [&vol, &other, &staging] {
            fs::create_dir_all(p).unwrap();
        }
        let src = Source::Directory(vol.clone());
        let scope = d.path();
        let none = MountFlags::empty();
        let publish = |single_writer| {
            super::publish(
                scope,
                &staging,
                &target,
                &src,
                AccessType::Mount,
                false,
                none,
                single_writer,
            )
        };
        // Not staged: refused, nothing made.
        assert!(matches!(publish(false), Err(NodeError::NotStaged { .. })));
        assert!(!target.exists());
        stage_dir(&vol, &staging).unwrap();
        stage_dir(&vol, &staging).unwrap();
        let table = MountTable::read().unwrap();
        assert_eq!(table.count_at(&staging), 1, "staged once");
        publish(false).unwrap();
        publish(false).unwrap();
        publish(true).unwrap();
        let table = MountTable::read().unwrap();
        assert_eq!(table.count_at(&target), 1, "published once");
        assert_eq!(
            table.at(&target).unwrap().location(),
            locate_dir(&table, &vol).unwrap()
        );
        // Something else mounted over the target: unpublish leaves it.
        mount::bind(&other, &target, none).unwrap();
        let e = unpublish(&target, Some((&src, AccessType::Mount))).unwrap_err();
        assert!(matches!(e, NodeError::ForeignMount { .. }), "{e:?}");
        assert_eq!(MountTable::read().unwrap().count_at(&target), 2);
        mount::unmount(&target).unwrap();
        unpublish(&target, Some((&src, AccessType::Mount))).unwrap();
        unpublish(&target, Some((&src, AccessType::Mount))).unwrap();
        assert!(!target.exists());
        unstage(scope, &staging, Some(&src)).unwrap();
        unstage(scope, &staging, Some(&src)).unwrap();
        assert!(MountTable::read().unwrap().at(&staging).is_none());
    }

    /// Unstage/unpublish by device path alone: both forms of a volume's
    /// mounts go, a missing device does nothing (the caller looks it up), and
    /// another volume's mount is never touched. Real mounts: needs root.
    #[tokio::test]
    async fn unmounts_by_device_only_what_is_the_devices() {
        let (lo, other) = (Loop::new(64 << 20), Loop::new(64 << 20));
        for l in [&lo, &other] {
            blockdev::format_if_blank(&l.dev, FsType::Ext4, &Default::default())
                .await
                .unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let (staging, target, block) = (
            dir.path().join("staging"),
            dir.path().join("target"),
            dir.path().join("block"),
        );
        fs::create_dir(&staging).unwrap();
        let none = MountFlags::empty();
        stage_device(&lo.dev, &staging, "ext4", none, "").unwrap();
        let scope = dir.path();
        publish(
            scope,
            &staging,
            &target,
            &Source::Device(lo.dev.clone()),
            AccessType::Mount,
            false,
            none,
            false,
        )
        .unwrap();
        publish_block(&lo.dev, scope, &block, false, false).unwrap();
        let mounted = |p: &Path| MountTable::read().unwrap().at(p).is_some();
        assert!(mounted(&staging) && mounted(&target) && mounted(&block));

        // Another device's name: its mounts are not these. Nothing changes.
        for p in [&target, &block] {
            let e = unpublish_device(scope, p, &other.dev).unwrap_err();
            assert!(matches!(e, NodeError::ForeignMount { .. }), "{e:?}");
            assert!(mounted(p));
        }
        assert!(matches!(
            unstage_device(scope, &staging, &other.dev),
            Err(NodeError::ForeignMount { .. })
        ));
        // No such device: nothing is done, the caller must look it up.
        let missing = dir.path().join("no-such-device");
        assert!(!unpublish_device(scope, &target, &missing).unwrap());
        assert!(!unstage_device(scope, &staging, &missing).unwrap());
        assert!(mounted(&target) && mounted(&staging));

        // The right device: a filesystem bind and a node bind both go, and
        // the target paths with them; repeats are OK.
        for _ in 0..2 {
            assert!(unpublish_device(scope, &target, &lo.dev).unwrap());
            assert!(unpublish_device(scope, &block, &lo.dev).unwrap());
        }
        assert!(!target.exists() && !block.exists());
        assert!(unstage_device(scope, &staging, &lo.dev).unwrap());
        assert!(!mounted(&staging) && staging.exists());
    }
}
