//! Node-side mount logic: stage, publish and their inverses, decided from the
//! live mount table so every step is idempotent. No proto types here; all
//! functions block and run through [`crate::error::blocking`].
//!
//! Directory volumes: stage = bind the volume directory onto the staging path;
//! publish = bind the staging path onto the target (then remount for `ro` and
//! other flags, which the kernel ignores on the first bind).

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use sys_mount::MountFlags;

use crate::error::{Error, IoContext, Result};
use crate::mount::{self, Location, MountTable};

/// How many stacked mounts an unmount loop removes before it gives up.
const MAX_STACKED: usize = 16;

/// Where a directory volume lives in the mount table.
pub fn locate_dir(src: &Path) -> Result<Location> {
    let md = fs::symlink_metadata(src).map_err(|e| match e.kind() {
        ErrorKind::NotFound => Error::NotFound(format!("volume directory {src:?} is missing")),
        _ => Error::io(format!("inspecting {src:?}"), e),
    })?;
    if !md.is_dir() {
        return Err(Error::FailedPrecondition(format!(
            "volume path {src:?} is not a directory"
        )));
    }
    MountTable::read()?
        .locate(src)
        .ok_or_else(|| Error::Internal(format!("no mount holds {src:?}")))
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
                Err(Error::FailedPrecondition(format!(
                    "{path:?} exists and is not a directory"
                )))
            }
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Err(Error::FailedPrecondition(format!(
            "the parent directory of {path:?} does not exist"
        ))),
        Err(e) => Err(Error::io(format!("creating {path:?}"), e)),
    }
}

/// Binds a directory volume onto `staging`. Already staged from the same
/// directory: OK. Something else mounted there: ALREADY_EXISTS.
pub fn stage_dir(src: &Path, staging: &Path) -> Result<()> {
    let want = locate_dir(src)?;
    ensure_mount_dir(staging)?;
    if let Some(m) = MountTable::read()?.at(staging) {
        if m.location() == want {
            return Ok(());
        }
        return Err(Error::AlreadyExists(format!(
            "staging path {staging:?} already has another mount ({}:{:?})",
            m.dev, m.root
        )));
    }
    mount::bind(src, staging, MountFlags::empty())
}

/// Unmounts whatever this volume mounted at `path` (all stacked copies). A mount
/// of something else is left alone and reported.
fn unmount_all(path: &Path, expected: Option<&Location>) -> Result<()> {
    for _ in 0..MAX_STACKED {
        let table = MountTable::read()?;
        let Some(m) = table.at(path) else {
            return Ok(());
        };
        if let Some(exp) = expected {
            if m.location() != *exp {
                return Err(Error::FailedPrecondition(format!(
                    "{path:?} has a mount that is not this volume ({}:{:?}); not unmounting it",
                    m.dev, m.root
                )));
            }
        }
        mount::unmount(path)?;
    }
    Err(Error::Internal(format!(
        "{path:?} still mounted after {MAX_STACKED} unmounts"
    )))
}

/// Unmounts the staging path. The directory itself belongs to the CO and stays.
pub fn unstage(staging: &Path, expected: Option<&Location>) -> Result<()> {
    unmount_all(staging, expected)
}

/// Binds the staged volume (at `volume` in the mount table) onto `target`,
/// read-only if asked, with extra per-mount flags. Not staged there (nothing, or
/// another volume, at `staging`): FAILED_PRECONDITION. Already published the same
/// way: OK; published with another source or another read-only setting:
/// ALREADY_EXISTS.
pub fn publish(
    staging: &Path,
    target: &Path,
    volume: &Location,
    read_only: bool,
    flags: MountFlags,
) -> Result<()> {
    let table = MountTable::read()?;
    let staged = table
        .at(staging)
        .ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "volume is not staged at {staging:?}; call NodeStageVolume first"
            ))
        })?
        .location();
    if staged != *volume {
        return Err(Error::FailedPrecondition(format!(
            "{staging:?} holds another mount ({}:{:?}), not this volume; call NodeStageVolume first",
            staged.dev, staged.root
        )));
    }
    let want_ro = read_only || flags.contains(MountFlags::RDONLY);
    ensure_mount_dir(target)?;
    if let Some(m) = table.at(target) {
        if m.location() == staged && m.read_only == want_ro {
            return Ok(());
        }
        return Err(Error::AlreadyExists(format!(
            "target path {target:?} is already mounted {} (read-only: {}); the request asks for read-only: {want_ro}",
            if m.location() == staged { "from this volume" } else { "from something else" },
            m.read_only
        )));
    }
    let flags = if want_ro {
        flags | MountFlags::RDONLY
    } else {
        flags
    };
    if let Err(e) = mount::bind(staging, target, flags) {
        let _ = fs::remove_dir(target);
        return Err(e);
    }
    Ok(())
}

/// Unmounts `target` and removes it without recursion; a target that is already
/// gone is fine.
pub fn unpublish(target: &Path, expected: Option<&Location>) -> Result<()> {
    unmount_all(target, expected)?;
    match fs::symlink_metadata(target) {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("inspecting {target:?}"), e)),
        Ok(md) if md.is_dir() => fs::remove_dir(target).ctx(|| format!("removing {target:?}")),
        Ok(_) => fs::remove_file(target).ctx(|| format!("removing {target:?}")),
    }
}

/// Whether `path` is a mount of the volume at `loc`.
pub fn is_mount_of(path: &Path, loc: &Location) -> Result<bool> {
    Ok(MountTable::read()?
        .at(path)
        .is_some_and(|m| m.location() == *loc))
}
