//! Careful filesystem primitives: atomic record writes, tree removal that never
//! follows a symlink or crosses into another filesystem, request-path checks, and
//! filesystem statistics. All functions here block: call them through
//! [`crate::error::blocking`].

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::dir::Dir;
use nix::fcntl::{openat, renameat, renameat2, OFlag, RenameFlags, AT_FDCWD};
use nix::sys::stat::{fstat, fstatat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::error::{IoContext, IoError};
use crate::ids::truncate;

/// What went wrong in a filesystem primitive.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error(transparent)]
    Io(#[from] IoError),
    /// Something other than a directory sits where one must be.
    #[error("{path:?} exists and is not a directory")]
    NotADirectory { path: PathBuf },
    /// A tree to remove holds a mount point: never removed through.
    #[error("{path:?} is on another filesystem (a mount point); refusing to remove it")]
    MountPointInside { path: PathBuf },
    /// A path the driver built has no parent folder (a bug).
    #[error("{path:?} has no parent")]
    NoParent { path: PathBuf },
    /// Sixteen unique names were all taken (a bug or a hostile folder).
    #[error("no free name in {dir:?} to retire {path:?}")]
    NoFreeName { dir: PathBuf, path: PathBuf },
}

/// Why a path from a request was refused. Every one is bad input, except
/// [`PathError::Io`] (the walk itself failed).
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("{what} is required")]
    Required { what: &'static str },
    #[error("{what} {path:?} is too long or contains NUL")]
    TooLong { what: &'static str, path: String },
    #[error("{what} {path:?} has a component of {len} bytes (at most {MAX_NAME_LEN})")]
    ComponentTooLong {
        what: &'static str,
        path: String,
        len: usize,
    },
    #[error("{what} {path:?} contains '.' or '..'")]
    DotSegment { what: &'static str, path: String },
    /// Relative, or absolute but not below the kubelet directory.
    #[error("{0}")]
    Elsewhere(String),
    #[error("{what} {path:?} goes through the symlink {link:?}; symlinks are not followed")]
    Symlink {
        what: &'static str,
        path: PathBuf,
        link: PathBuf,
    },
    #[error(transparent)]
    Io(#[from] IoError),
}

type Result<T, E = FsError> = std::result::Result<T, E>;

/// Longest path accepted from a request.
pub const MAX_PATH_LEN: usize = 4096;
/// Longest path component (NAME_MAX): a longer one can never exist.
pub const MAX_NAME_LEN: usize = 255;

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Replaces `path` with `data` so that a crash leaves either the old or the new
/// content: write a temp file beside it, fsync it, rename over, fsync the folder.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    with_synced_temp(path, data, |dir, tmp| {
        fs::rename(tmp, path).ctx(|| format!("renaming {tmp:?} to {path:?}"))?;
        sync_dir(dir)
    })
}

/// Writes `data` to a new 0600 temp file beside `path` and fsyncs it, then
/// runs `publish(folder, temp)` (which puts it in place); the temp file is
/// removed if anything fails.
fn with_synced_temp(
    path: &Path,
    data: &[u8],
    publish: impl FnOnce(&Path, &Path) -> Result<()>,
) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| FsError::NoParent { path: path.into() })?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("record");
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.tmp.{}.{n}", std::process::id()));
    let res = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .ctx(|| format!("creating {tmp:?}"))?;
        f.write_all(data).ctx(|| format!("writing {tmp:?}"))?;
        f.sync_all().ctx(|| format!("syncing {tmp:?}"))?;
        publish(dir, &tmp)
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// The content of `path`, written first as `data` if the file does not
/// exist: a temp file beside it, fsynced, hard-linked to `path` (which fails
/// if `path` appeared meanwhile: that content wins), the folder fsynced. So
/// the file is created once and never replaced; a crash leaves it whole or
/// absent. `path` itself is read without following a symlink.
pub fn create_once(path: &Path, data: &[u8]) -> Result<Vec<u8>> {
    let read = |p: &Path| -> std::io::Result<Vec<u8>> {
        let mut f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(p)?;
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut out)?;
        Ok(out)
    };
    match read(path) {
        Ok(v) => return Ok(v),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(IoError::new(format!("reading {path:?}"), e).into()),
    }
    with_synced_temp(path, data, |dir, tmp| {
        match fs::hard_link(tmp, path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(IoError::new(format!("linking {tmp:?} to {path:?}"), e).into()),
        }
        fs::remove_file(tmp).ctx(|| format!("removing {tmp:?}"))?;
        sync_dir(dir)
    })?;
    Ok(read(path).ctx(|| format!("reading {path:?}"))?)
}

/// Like [`write_atomic`], but the temp file is `spare`: a file retired by
/// [`retire_file`] on the same filesystem that nothing else uses. It is
/// rewritten in place (its blocks are reused: none is allocated, none freed),
/// cut to the new length, synced, renamed over `path`, and the folder synced:
/// the same guarantees as [`write_atomic`]. Reuse is only a shortcut: a spare
/// that is not a plain 0600 file with one link is left alone, and when
/// anything fails before the rename the spare is removed; either way a new
/// temp file does the job.
pub fn write_atomic_reusing(path: &Path, data: &[u8], spare: &Path) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| FsError::NoParent { path: path.into() })?;
    let f = match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(spare)
    {
        Ok(f) => f,
        Err(_) => return write_atomic(path, data),
    };
    let old_len = match f.metadata() {
        Ok(md) if md.is_file() && md.nlink() == 1 && md.mode() & 0o7777 == 0o600 => md.len(),
        _ => return write_atomic(path, data),
    };
    let renamed = (|| {
        f.write_all_at(data, 0)?;
        if old_len > data.len() as u64 {
            f.set_len(data.len() as u64)?;
        }
        f.sync_all()?;
        fs::rename(spare, path)
    })();
    if renamed.is_err() {
        let _ = fs::remove_file(spare);
        return write_atomic(path, data);
    }
    sync_dir(dir)
}

/// Moves the file at `path` into `to_dir` (same filesystem) under a new unique
/// name and makes its absence from its own folder durable (rename, then fsync
/// of that folder). Returns where it went, or None when there was no file.
///
/// This is a removal that frees nothing: unlinking a synced file frees its
/// blocks, which costs milliseconds on a filesystem mounted `discard` (the
/// discard is synchronous) and stalls the device for everyone's fsyncs. The
/// retired file can then serve [`write_atomic_reusing`].
pub fn retire_file(path: &Path, to_dir: &Path) -> Result<Option<PathBuf>> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    for _ in 0..16 {
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let to = to_dir.join(format!("{name}.{}.{n}", std::process::id()));
        match renameat2(AT_FDCWD, path, AT_FDCWD, &to, RenameFlags::RENAME_NOREPLACE) {
            Ok(()) => {
                sync_dir(dir)?;
                return Ok(Some(to));
            }
            Err(nix::errno::Errno::ENOENT) if fs::symlink_metadata(path).is_err() => {
                return Ok(None)
            }
            // A leftover of an earlier process with the same pid: next name.
            Err(nix::errno::Errno::EEXIST) => continue,
            // A filesystem without RENAME_NOREPLACE, or `to_dir` not reachable
            // by a rename: remove the file the plain way.
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::EXDEV) => {
                return remove_file_durable(path).map(|()| None)
            }
            Err(e) => {
                return Err(IoError::new(format!("renaming {path:?} to {to:?}"), e.into()).into())
            }
        }
    }
    Err(FsError::NoFreeName {
        dir: to_dir.into(),
        path: path.into(),
    })
}

/// Makes a rename, creation or removal inside `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    Ok(fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx(|| format!("syncing directory {dir:?}"))?)
}

/// Removes a file and makes the removal durable; a missing file is fine.
pub fn remove_file_durable(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => sync_dir(path.parent().unwrap_or(Path::new("/"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(IoError::new(format!("removing {path:?}"), e).into()),
    }
}

/// Creates `path` as a directory with exactly `mode` (umask does not apply);
/// an existing directory is fine, anything else at the path is an error.
pub fn ensure_dir(path: &Path, mode: u32) -> Result<()> {
    match fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let md = fs::symlink_metadata(path).ctx(|| format!("inspecting {path:?}"))?;
            if !md.is_dir() {
                return Err(FsError::NotADirectory { path: path.into() });
            }
            return Ok(());
        }
        Err(e) => return Err(IoError::new(format!("creating directory {path:?}"), e).into()),
    }
    Ok(fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .ctx(|| format!("chmod {path:?}"))?)
}

/// Depth after which [`clear_dir`] flattens a tree instead of descending, so a
/// deeply nested tree needs neither deep recursion nor many open descriptors.
const MAX_DEPTH: usize = 32;

fn open_dir_at(parent: impl AsFd, name: &Path) -> Result<OwnedFd> {
    Ok(openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ctx(|| format!("opening directory {name:?}"))?)
}

/// Removes everything inside `dir` but not `dir` itself. Never follows a symlink
/// (symlinks are unlinked, not resolved), and refuses to descend into a
/// directory on another filesystem (a mount point inside the tree).
pub fn clear_dir(dir: &Path) -> Result<()> {
    let top = open_dir_at(AT_FDCWD, dir)?;
    let dev = fstat(&top).ctx(|| format!("stat {dir:?}"))?.st_dev;
    // Flattening moves deep directories up into `top`; repeat until a pass finds
    // `top` empty.
    while !clear_fd(&top, &top, dev, 0).map_err(|e| annotate(e, dir))? {}
    Ok(())
}

/// Removes `dir` and everything in it, with the guarantees of [`clear_dir`].
pub fn remove_tree(dir: &Path) -> Result<()> {
    // An empty directory (or none) needs no walk: rmdir removes nothing else,
    // never follows a symlink and refuses a mount point. Anything else takes
    // the careful path below.
    match fs::remove_dir(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(_) => {}
    }
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(IoError::new(format!("inspecting {dir:?}"), e).into()),
        Ok(md) if !md.is_dir() => return Err(FsError::NotADirectory { path: dir.into() }),
        Ok(_) => {}
    }
    clear_dir(dir)?;
    Ok(fs::remove_dir(dir).ctx(|| format!("removing directory {dir:?}"))?)
}

fn annotate(e: FsError, dir: &Path) -> FsError {
    match e {
        FsError::Io(IoError { context, source }) => {
            FsError::Io(IoError::new(format!("clearing {dir:?}: {context}"), source))
        }
        FsError::MountPointInside { path } => FsError::MountPointInside {
            path: dir.join(path),
        },
        other => other,
    }
}

/// One pass over `fd`; returns whether the directory was empty.
fn clear_fd(fd: &OwnedFd, top: &OwnedFd, dev: libc::dev_t, depth: usize) -> Result<bool> {
    let mut names = Vec::new();
    {
        let dup = fd.try_clone().ctx(|| "dup directory fd".into())?;
        let mut d = Dir::from_fd(dup).ctx(|| "reading directory".into())?;
        // Each pass reads from the start.
        for entry in d.iter() {
            let entry = entry.ctx(|| "reading directory entry".into())?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(PathBuf::from(std::ffi::OsStr::from_bytes(name)));
            }
        }
    }
    if names.is_empty() {
        return Ok(true);
    }
    for name in names {
        let st = match fstatat(fd, name.as_path(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(e) => return Err(IoError::new(format!("stat {name:?}"), e.into()).into()),
        };
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
            if st.st_dev != dev {
                return Err(FsError::MountPointInside { path: name });
            }
            if depth >= MAX_DEPTH {
                let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
                let flat = PathBuf::from(format!(".localvol-flatten.{}.{n}", std::process::id()));
                renameat(fd, name.as_path(), top, flat.as_path())
                    .ctx(|| format!("flattening {name:?}"))?;
                continue;
            }
            let child = open_dir_at(fd, &name)?;
            if fstat(&child).ctx(|| format!("stat {name:?}"))?.st_dev != dev {
                return Err(FsError::MountPointInside { path: name });
            }
            while !clear_fd(&child, top, dev, depth + 1)? {}
            unlinkat(fd, name.as_path(), UnlinkatFlags::RemoveDir)
                .ctx(|| format!("rmdir {name:?}"))?;
        } else {
            match unlinkat(fd, name.as_path(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
                Err(e) => return Err(IoError::new(format!("unlink {name:?}"), e.into()).into()),
            }
        }
    }
    Ok(false)
}

/// Decodes a path from a request that must lie under `root` (kubelet's
/// directory): absolute, no `.`/`..`, no NUL, and no symlink anywhere below
/// `root`, so a mount can never land outside it. Components that do not exist
/// yet are fine. (`root` itself may be a symlink: that is the operator's choice.)
#[cfg(test)]
fn check_request_path(what: &'static str, root: &Path, p: &str) -> Result<PathBuf, PathError> {
    RequestPath::parse(what, root, p)?.resolve()
}

/// A request's path that passed the checks that need no filesystem access
/// ([`RequestPath::parse`]); [`RequestPath::resolve`] does the rest, inside the
/// blocking call that then uses the path, so a handler pays one thread handoff
/// for both.
#[derive(Clone, Debug)]
pub struct RequestPath {
    what: &'static str,
    root: PathBuf,
    /// Below `root`, not empty, no `.`/`..` segments.
    rest: PathBuf,
}

/// Where a request's path points, once its text is known to be well formed.
pub enum PathPlace {
    /// Below the kubelet directory: a place the driver may mount on.
    Below(RequestPath),
    /// Relative, or absolute but outside the kubelet directory: no volume of
    /// this driver can be mounted there.
    Elsewhere(String),
}

impl RequestPath {
    /// Everything but the filesystem walk: empty, too long (the whole path or
    /// one component), NUL, relative, `.`/`..`, or not below `root` are
    /// INVALID_ARGUMENT here.
    pub fn parse(what: &'static str, root: &Path, p: &str) -> Result<RequestPath, PathError> {
        match Self::place(what, root, p)? {
            PathPlace::Below(rp) => Ok(rp),
            PathPlace::Elsewhere(why) => Err(PathError::Elsewhere(why)),
        }
    }

    /// For a path that only names where to look for a volume
    /// (NodeGetVolumeStats, NodeExpandVolume): malformed text is
    /// INVALID_ARGUMENT; a well-formed path that cannot hold a volume of this
    /// driver is told apart, for the caller to answer NOT_FOUND once it knows
    /// the volume exists.
    pub fn place(what: &'static str, root: &Path, p: &str) -> Result<PathPlace, PathError> {
        if p.is_empty() {
            return Err(PathError::Required { what });
        }
        if p.len() > MAX_PATH_LEN || p.contains('\0') {
            return Err(PathError::TooLong {
                what,
                path: truncate(p),
            });
        }
        if let Some(seg) = p.split('/').find(|seg| seg.len() > MAX_NAME_LEN) {
            return Err(PathError::ComponentTooLong {
                what,
                path: truncate(p),
                len: seg.len(),
            });
        }
        // Path::components() drops inner `.`, so look at the raw segments.
        if p.split('/').any(|seg| seg == "." || seg == "..") {
            return Err(PathError::DotSegment {
                what,
                path: p.to_owned(),
            });
        }
        let path = Path::new(p);
        if !path.is_absolute() {
            return Ok(PathPlace::Elsewhere(format!(
                "{what} {p:?} is not absolute"
            )));
        }
        match path.strip_prefix(root) {
            Ok(rest) if !rest.as_os_str().is_empty() => Ok(PathPlace::Below(RequestPath {
                what,
                root: root.to_path_buf(),
                rest: rest.to_path_buf(),
            })),
            _ => Ok(PathPlace::Elsewhere(format!(
                "{what} {p:?} is not below the kubelet directory {root:?}"
            ))),
        }
    }

    /// Whether the two paths are the same, or one lies inside the other
    /// (compared as given, before any filesystem walk: both are below the
    /// same root and free of `.`, `..` and, once resolved, symlinks).
    pub fn overlaps(&self, other: &RequestPath) -> bool {
        self.root == other.root
            && (self.rest.starts_with(&other.rest) || other.rest.starts_with(&self.rest))
    }

    /// Whether the path is where kubelet stages volumes (below the kubelet
    /// directory `plugins/kubernetes.io/csi/.../globalmount`, and
    /// `.../csi/volumeDevices/staging/<pv>` for raw block volumes): kubelet
    /// never publishes a pod's volume there, so a NodeUnpublishVolume aimed at
    /// it would take a staging mount from under the pods that use it.
    pub fn is_kubelet_staging(&self) -> bool {
        let c: Vec<&std::ffi::OsStr> = self.rest.iter().collect();
        let csi = c.len() >= 5 && c[..3] == ["plugins", "kubernetes.io", "csi"];
        csi && (c[c.len() - 1] == "globalmount"
            || (c.len() == 6 && c[3] == "volumeDevices" && c[4] == "staging"))
    }

    /// The pod a target in kubelet's layout belongs to (None for any other
    /// path): see [`crate::iolimit::pod_of_target`].
    pub fn pod(&self) -> Option<crate::iolimit::PodUid> {
        crate::iolimit::pod_of_target(&self.rest)
    }

    /// The filesystem part (blocking): refuses a symlink anywhere below the
    /// root and returns the path under the root's resolved location.
    pub fn resolve(&self) -> Result<PathBuf, PathError> {
        self.resolve_in().map(|(_, path)| path)
    }

    /// [`RequestPath::resolve`], with the root's resolved location too: the
    /// scope in which the CO's own mounts (staging and target paths) live.
    pub fn resolve_in(&self) -> Result<(PathBuf, PathBuf), PathError> {
        let (what, root) = (self.what, &self.root);
        let mut cur = root.clone();
        for comp in self.rest.components() {
            cur.push(comp);
            match fs::symlink_metadata(&cur) {
                Ok(md) if md.file_type().is_symlink() => {
                    return Err(PathError::Symlink {
                        what,
                        path: root.join(&self.rest),
                        link: cur,
                    })
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) => return Err(IoError::new(format!("inspecting {cur:?}"), e).into()),
            }
        }
        // The mount table records resolved paths: below a symlinked root, the
        // unresolved path would never be found mounted (so staging or
        // publishing twice would stack mounts, and unmounting would find
        // nothing).
        let real_root =
            fs::canonicalize(root).ctx(|| format!("resolving the kubelet directory {root:?}"))?;
        let path = real_root.join(&self.rest);
        Ok((real_root, path))
    }
}

/// Space and inode figures of the filesystem holding a path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStats {
    pub total_bytes: u64,
    /// Free for unprivileged users (what a pod can use).
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
    pub used_inodes: u64,
}

pub fn fs_stats(path: &Path) -> Result<FsStats, IoError> {
    let s = nix::sys::statvfs::statvfs(path).ctx(|| format!("statvfs {path:?}"))?;
    let frag = s.fragment_size() as u64;
    let total = s.blocks() as u64 * frag;
    let free = s.blocks_free() as u64 * frag;
    Ok(FsStats {
        total_bytes: total,
        available_bytes: s.blocks_available() as u64 * frag,
        used_bytes: total.saturating_sub(free),
        total_inodes: s.files() as u64,
        free_inodes: s.files_free() as u64,
        used_inodes: (s.files() as u64).saturating_sub(s.files_free() as u64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn kubelet_staging_paths_are_told_from_targets() {
        let root = Path::new("/var/lib/kubelet");
        let p = |rest: &str| {
            RequestPath::parse("target_path", root, &format!("{}/{rest}", root.display())).unwrap()
        };
        for staging in [
            "plugins/kubernetes.io/csi/localvol.csi.dev/0123abcd/globalmount",
            "plugins/kubernetes.io/csi/pv/pvc-1/globalmount",
            "plugins/kubernetes.io/csi/volumeDevices/staging/pvc-1",
        ] {
            assert!(p(staging).is_kubelet_staging(), "{staging}");
        }
        for target in [
            "pods/uid/volumes/kubernetes.io~csi/pvc-1/mount",
            "plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/uid",
            "plugins/kubernetes.io/csi/globalmount",
            "staging/globalmount",
            "plugins/kubernetes.io/csi/volumeDevices/staging/pvc-1/more",
        ] {
            assert!(!p(target).is_kubelet_staging(), "{target}");
        }
    }

    #[test]
    fn create_once_writes_once_and_never_replaces() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("id");
        assert_eq!(create_once(&p, b"first").unwrap(), b"first");
        assert_eq!(create_once(&p, b"second").unwrap(), b"first");
        assert_eq!(fs::read(&p).unwrap(), b"first");
        // No temp file left behind.
        assert_eq!(fs::read_dir(t.path()).unwrap().count(), 1);
        // A symlink where the file should be is not followed.
        let l = t.path().join("link");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        assert!(create_once(&l, b"x").is_err());
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("rec.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn retired_files_are_rewritten_in_place() {
        let d = tempfile::tempdir().unwrap();
        let (vols, spare) = (d.path().join("volumes"), d.path().join("deleted"));
        fs::create_dir(&vols).unwrap();
        fs::create_dir(&spare).unwrap();
        let rec = vols.join("k.json");
        assert_eq!(retire_file(&rec, &spare).unwrap(), None, "no file");
        write_atomic(&rec, &[b'x'; 9000]).unwrap();
        let ino = fs::metadata(&rec).unwrap().ino();
        let retired = retire_file(&rec, &spare).unwrap().unwrap();
        assert!(!rec.exists());
        assert_eq!(retired.parent(), Some(spare.as_path()));
        // Rewritten shorter: the same inode, exactly the new bytes.
        let other = vols.join("other.json");
        write_atomic_reusing(&other, b"new", &retired).unwrap();
        assert_eq!(fs::read(&other).unwrap(), b"new");
        assert_eq!(fs::metadata(&other).unwrap().ino(), ino);
        assert!(!retired.exists());
        assert_eq!(fs::read_dir(&spare).unwrap().count(), 0);
        // Two retirements of the same name never collide.
        write_atomic(&rec, b"1").unwrap();
        let a = retire_file(&rec, &spare).unwrap().unwrap();
        write_atomic(&rec, b"2").unwrap();
        let b = retire_file(&rec, &spare).unwrap().unwrap();
        assert_ne!(a, b);
        assert_eq!(fs::read(&a).unwrap(), b"1");
        assert_eq!(fs::read(&b).unwrap(), b"2");
    }

    #[test]
    fn a_spare_that_cannot_be_renamed_falls_back_to_a_new_file() {
        let d = tempfile::tempdir().unwrap();
        let Ok(other_fs) = tempfile::tempdir_in("/dev/shm") else {
            crate::testing::skip("spare on another filesystem", "no /dev/shm here");
            return;
        };
        if fs::metadata(other_fs.path()).unwrap().dev() == fs::metadata(d.path()).unwrap().dev() {
            crate::testing::skip(
                "spare on another filesystem",
                "/dev/shm is on the temp dir's filesystem",
            );
            return;
        }
        let spare = other_fs.path().join("spare");
        write_atomic(&spare, b"old").unwrap();
        let rec = d.path().join("r.json");
        write_atomic_reusing(&rec, b"new", &spare).unwrap();
        assert_eq!(fs::read(&rec).unwrap(), b"new");
        assert!(!spare.exists(), "the unusable spare is removed");
        let left: Vec<_> = fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temp file left: {left:?}");
    }

    #[test]
    fn a_spare_that_is_not_a_private_file_is_not_written() {
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("precious");
        fs::write(&outside, b"keep").unwrap();
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o600)).unwrap();
        let link = d.path().join("link");
        symlink(&outside, &link).unwrap();
        let linked = d.path().join("linked");
        fs::hard_link(&outside, &linked).unwrap();
        let rec = d.path().join("r.json");
        for bad in [&link, &linked, &d.path().join("missing")] {
            write_atomic_reusing(&rec, b"data", bad).unwrap();
            assert_eq!(fs::read(&rec).unwrap(), b"data");
        }
        assert_eq!(fs::read(&outside).unwrap(), b"keep");
        assert!(link.is_symlink() && linked.exists());
    }

    #[test]
    fn remove_tree_does_not_follow_symlinks_out() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("precious"), b"keep").unwrap();
        fs::create_dir(outside.path().join("sub")).unwrap();
        fs::write(outside.path().join("sub/also"), b"keep").unwrap();

        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        fs::create_dir_all(vol.join("a/b")).unwrap();
        fs::write(vol.join("a/b/f"), b"x").unwrap();
        symlink(outside.path(), vol.join("link-dir")).unwrap();
        symlink(outside.path().join("precious"), vol.join("a/link-file")).unwrap();
        symlink("/nonexistent", vol.join("dangling")).unwrap();

        remove_tree(&vol).unwrap();
        assert!(!vol.exists());
        assert_eq!(fs::read(outside.path().join("precious")).unwrap(), b"keep");
        assert_eq!(fs::read(outside.path().join("sub/also")).unwrap(), b"keep");
    }

    #[test]
    fn clear_dir_handles_deep_trees_and_keeps_the_top() {
        let d = tempfile::tempdir().unwrap();
        let top = d.path().join("top");
        let mut p = top.clone();
        for i in 0..200 {
            p.push(format!("d{i}"));
        }
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join("leaf"), b"x").unwrap();
        clear_dir(&top).unwrap();
        assert!(top.is_dir());
        assert_eq!(fs::read_dir(&top).unwrap().count(), 0);
    }

    #[test]
    fn remove_tree_of_missing_dir_is_ok() {
        let d = tempfile::tempdir().unwrap();
        remove_tree(&d.path().join("nope")).unwrap();
    }

    #[test]
    fn request_paths_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let outside = tempfile::tempdir().unwrap();
        symlink(outside.path(), root.join("evil")).unwrap();
        fs::create_dir(root.join("pods")).unwrap();
        let ok = format!("{}/pods/x/mount", root.display());
        assert_eq!(
            check_request_path("target path", root, &ok).unwrap(),
            PathBuf::from(&ok)
        );
        for bad in [
            String::new(),
            "relative/path".into(),
            "/etc/passwd".into(),
            format!("{}/pods/../../etc", root.display()),
            format!("{}/./pods", root.display()),
            format!("{}/evil/mount", root.display()),
            format!("{}/evil", root.display()),
            format!("{}/pods/a\0b", root.display()),
            root.display().to_string(),
            format!("{}/{}", root.display(), "x".repeat(5000)),
            // One component over NAME_MAX (the kernel would say ENAMETOOLONG).
            format!("{}/pods/{}/mount", root.display(), "x".repeat(256)),
        ] {
            let r = check_request_path("target path", root, &bad);
            assert!(
                matches!(r, Err(ref e) if !matches!(e, PathError::Io(_))),
                "{bad:?}: {r:?}"
            );
        }
        let longest = format!("{}/pods/{}", root.display(), "x".repeat(255));
        check_request_path("target path", root, &longest).unwrap();
    }

    /// A path that only says where to look: malformed text is still
    /// INVALID_ARGUMENT, a well-formed path outside the root is `Elsewhere`.
    #[test]
    fn lookup_paths_tell_malformed_from_elsewhere() {
        let root = Path::new("/var/lib/kubelet");
        for elsewhere in ["some/path", "/etc/passwd", "/var/lib/kubelet"] {
            let r = RequestPath::place("volume_path", root, elsewhere);
            assert!(matches!(r, Ok(PathPlace::Elsewhere(_))), "{elsewhere:?}");
        }
        let long = format!("/var/lib/kubelet/{}", "y".repeat(256));
        for bad in ["", "/var/lib/kubelet/../x", "some/../path", "a\0b", &long] {
            let r = RequestPath::place("volume_path", root, bad);
            assert!(
                matches!(r, Err(ref e) if !matches!(e, PathError::Io(_))),
                "{bad:?}"
            );
        }
        let below = RequestPath::place("volume_path", root, "/var/lib/kubelet/pods/a/mount");
        assert!(matches!(below, Ok(PathPlace::Below(_))));
    }

    #[test]
    fn overlapping_request_paths() {
        let root = Path::new("/k");
        let p = |s: &str| RequestPath::parse("p", root, s).unwrap();
        assert!(p("/k/a/b").overlaps(&p("/k/a/b")));
        assert!(p("/k/a/b").overlaps(&p("/k/a/b/c")));
        assert!(p("/k/a/b/c").overlaps(&p("/k/a/b")));
        assert!(!p("/k/a/b").overlaps(&p("/k/a/bc")));
        assert!(!p("/k/a/stage").overlaps(&p("/k/a/target")));
    }
}
