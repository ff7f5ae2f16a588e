//! Mount state and mount syscalls. The kernel's `/proc/self/mountinfo` is the only
//! record of what is mounted: nothing here caches it.
//!
//! A bind mount shows in mountinfo as the device (`major:minor`) plus the path of
//! its source *inside that filesystem* (the `root` field), so "is this directory
//! mounted somewhere" and "is this mount a bind of that directory" are both
//! answered by comparing `(device, root)` pairs ([`Location`]).
//!
//! Reading the table is on every node RPC's path, so the parser is a single pass
//! over the bytes that keeps only the fields the driver uses. Callers read the
//! table once per decision and pass the [`MountTable`] along instead of reading
//! it again.

use std::ffi::OsString;
use std::fs;
use std::io::{ErrorKind, Read};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use sys_mount::{Mount, MountFlags, UnmountFlags};

use crate::error::{IoContext, IoError};

/// What went wrong reading the mount table or looking at a device.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error(transparent)]
    Io(#[from] IoError),
    /// The kernel's mount table could not be parsed (a bug or a new format).
    #[error("parsing mountinfo: {0}")]
    MountInfo(String),
    #[error("device {dev:?} is missing")]
    DeviceMissing { dev: PathBuf },
    #[error("{dev:?} is not a block device")]
    NotABlockDevice { dev: PathBuf },
    /// No mount in the table holds a path that exists (a bug or a race).
    #[error("no mount holds {path:?}")]
    Unlocated { path: PathBuf },
}

type Result<T, E = MountError> = std::result::Result<T, E>;

/// One line of mountinfo, reduced to what the driver uses.
#[derive(Clone, Debug)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    /// `major:minor` of the filesystem.
    pub dev: String,
    /// Path of the mount's source inside its filesystem.
    pub root: PathBuf,
    pub fs_type: String,
    pub source: Option<String>,
    pub read_only: bool,
}

/// Where a directory lives: its filesystem and its path inside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub dev: String,
    pub root: PathBuf,
}

impl MountEntry {
    pub fn location(&self) -> Location {
        Location {
            dev: self.dev.clone(),
            root: self.root.clone(),
        }
    }
}

/// A snapshot of the mount table.
#[derive(Clone, Debug)]
pub struct MountTable {
    entries: Vec<MountEntry>,
}

impl MountTable {
    /// Reads `/proc/self/mountinfo` (blocking).
    pub fn read() -> Result<Self> {
        let mut f = std::fs::File::open("/proc/self/mountinfo")
            .ctx(|| "opening /proc/self/mountinfo".into())?;
        // Plain reads into one buffer (read_to_end would first stat and seek
        // the file for a size, which procfs does not have); the kernel hands
        // out about a page per read.
        let mut buf = vec![0u8; READ_CHUNK];
        let mut len = 0;
        loop {
            if buf.len() - len < READ_CHUNK / 4 {
                buf.resize(buf.len() * 2, 0);
            }
            match f.read(&mut buf[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(IoError::new("reading /proc/self/mountinfo", e).into()),
            }
        }
        Self::parse_bytes(&buf[..len]).map_err(MountError::MountInfo)
    }

    pub fn parse(text: &str) -> Result<Self> {
        Self::parse_bytes(text.as_bytes()).map_err(MountError::MountInfo)
    }

    /// Parses mountinfo (proc(5)):
    /// `id parent major:minor root mount-point options [optional...] - fstype source super-options`.
    /// Paths are octal-unescaped; anything malformed is an error naming the line.
    fn parse_bytes(text: &[u8]) -> std::result::Result<Self, String> {
        let mut entries = Vec::with_capacity(64);
        for (n, line) in text.split(|&b| b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            entries.push(parse_line(line).ok_or_else(|| {
                format!(
                    "line {}: malformed: {:?}",
                    n + 1,
                    String::from_utf8_lossy(&line[..line.len().min(200)])
                )
            })?);
        }
        Ok(MountTable { entries })
    }

    /// Every mount, in mountinfo order.
    pub fn entries(&self) -> impl Iterator<Item = &MountEntry> + '_ {
        self.entries.iter()
    }

    /// The mount visible at exactly `path` (the top one when mounts are stacked).
    pub fn at(&self, path: &Path) -> Option<&MountEntry> {
        self.entries.iter().rev().find(|e| e.mount_point == path)
    }

    /// The mounts stacked at exactly `path`, top (visible) first.
    pub fn stack_at<'a>(&'a self, path: &'a Path) -> impl Iterator<Item = &'a MountEntry> + 'a {
        self.entries
            .iter()
            .rev()
            .filter(move |e| e.mount_point == path)
    }

    /// How many mounts are stacked at exactly `path`.
    pub fn count_at(&self, path: &Path) -> usize {
        self.entries
            .iter()
            .filter(|e| e.mount_point == path)
            .count()
    }

    /// The mount that holds an (absolute, canonical) path: the deepest mount
    /// point above it, the top one when several are stacked.
    pub fn containing(&self, path: &Path) -> Option<&MountEntry> {
        // max_by_key keeps the last of equal keys: the top of a stack.
        self.entries
            .iter()
            .filter(|e| path.starts_with(&e.mount_point))
            .max_by_key(|e| e.mount_point.as_os_str().len())
    }

    /// The filesystem and in-filesystem path of an (absolute, canonical) path.
    pub fn locate(&self, path: &Path) -> Option<Location> {
        let m = self.containing(path)?;
        let rest = path.strip_prefix(&m.mount_point).ok()?;
        let root = if rest.as_os_str().is_empty() {
            m.root.clone()
        } else {
            m.root.join(rest)
        };
        Some(Location {
            dev: m.dev.clone(),
            root,
        })
    }

    /// Mounts whose source is `loc` or lies inside it.
    pub fn mounts_of<'a>(&'a self, loc: &'a Location) -> impl Iterator<Item = &'a MountEntry> + 'a {
        self.entries
            .iter()
            .filter(move |e| e.dev == loc.dev && e.root.starts_with(&loc.root))
    }

    /// Mount points at or below `path`.
    pub fn mounts_below<'a>(&'a self, path: &'a Path) -> impl Iterator<Item = &'a MountEntry> + 'a {
        self.entries
            .iter()
            .filter(move |e| e.mount_point.starts_with(path))
    }
}

/// Initial buffer for the table (grown as needed).
const READ_CHUNK: usize = 16 * 1024;

/// One mountinfo line, or None when a field is missing.
fn parse_line(line: &[u8]) -> Option<MountEntry> {
    let mut fields = line.split(|&b| b == b' ');
    let _id = fields.next().filter(|f| is_number(f))?;
    let _parent = fields.next().filter(|f| is_number(f))?;
    let dev = fields.next().filter(|f| is_majmin(f))?;
    let root = fields.next().filter(|f| !f.is_empty())?;
    let mount_point = fields.next().filter(|f| !f.is_empty())?;
    let options = fields.next()?;
    // Optional fields (`shared:1 master:2 ...`) end at a lone `-`.
    for f in fields.by_ref() {
        if f == b"-" {
            break;
        }
    }
    let fs_type = fields.next()?;
    let source = fields.next()?;
    // Super options must be there too: a line cut short is not trusted.
    let _super_options = fields.next()?;
    Some(MountEntry {
        mount_point: unescape(mount_point),
        dev: ascii(dev),
        root: unescape(root),
        fs_type: String::from_utf8_lossy(fs_type).into_owned(),
        source: match source {
            b"" | b"none" => None,
            s => Some(unescape(s).to_string_lossy().into_owned()),
        },
        read_only: options.split(|&b| b == b',').any(|o| o == b"ro"),
    })
}

fn is_number(f: &[u8]) -> bool {
    !f.is_empty() && f.iter().all(u8::is_ascii_digit)
}

fn is_majmin(f: &[u8]) -> bool {
    match f.iter().position(|&b| b == b':') {
        Some(i) => is_number(&f[..i]) && is_number(&f[i + 1..]),
        None => false,
    }
}

/// `major:minor` is checked to be digits, so this never loses anything.
fn ascii(f: &[u8]) -> String {
    String::from_utf8_lossy(f).into_owned()
}

/// Decodes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`,
/// `\134`). A backslash not followed by three octal digits stays as it is.
fn unescape(raw: &[u8]) -> PathBuf {
    if !raw.contains(&b'\\') {
        return PathBuf::from(OsString::from_vec(raw.to_vec()));
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\'
            && i + 4 <= raw.len()
            && raw[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = raw[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            if let Ok(b) = u8::try_from(v) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    PathBuf::from(OsString::from_vec(out))
}

/// What a path resolves to, from one `statx` and without the mount table:
/// the filesystem (`dev`) and inode it lands on, and whether that inode is
/// the root of a mount, i.e. whether something is mounted at the path.
///
/// Two paths with the same `(dev, ino)` are the same inode; for directories
/// (which have one name) the same directory. A bind mount of a directory has
/// that directory as its root, so "is `staging` a bind of the volume
/// directory" is `probe(staging).mount_root && probe(staging).same_inode(probe(dir))`,
/// exactly what comparing their [`Location`]s in the table answers. A
/// directory removed while a mount still holds it keeps its inode number
/// until the mount goes, so a live directory never shares a number with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub dev: (u32, u32),
    pub ino: u64,
    /// Something is mounted at the path (the top of its stack is what `dev`
    /// and `ino` describe).
    pub mount_root: bool,
    pub is_dir: bool,
}

impl Probe {
    pub fn same_inode(&self, other: &Probe) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }
}

/// `statx(path, AT_SYMLINK_NOFOLLOW)` (blocking). `Ok(None)` when the path does
/// not exist, an error with kind `Unsupported` when the kernel does not say
/// whether a path is a mount root (`STATX_ATTR_MOUNT_ROOT`, Linux 5.8): then
/// the caller reads the table instead.
pub fn probe(path: &Path) -> Result<Option<Probe>, IoError> {
    let c = c_path(path, &|| format!("statx {path:?}"))?;
    // SAFETY: statx writes at most one `struct statx` into the zeroed buffer,
    // which lives for the call; the path is a valid NUL-terminated string.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_SYNC_AS_STAT,
            libc::STATX_TYPE | libc::STATX_INO,
            &mut stx,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if matches!(e.kind(), ErrorKind::NotFound) {
            return Ok(None);
        }
        return Err(IoError::new(format!("statx {path:?}"), e));
    }
    let root_bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    if stx.stx_attributes_mask & root_bit == 0 || stx.stx_mask & libc::STATX_INO == 0 {
        return Err(IoError::new(
            format!("statx {path:?}: the kernel does not report mount roots"),
            std::io::Error::from(ErrorKind::Unsupported),
        ));
    }
    Ok(Some(Probe {
        dev: (stx.stx_dev_major, stx.stx_dev_minor),
        ino: stx.stx_ino,
        mount_root: stx.stx_attributes & root_bit != 0,
        is_dir: u32::from(stx.stx_mode) & libc::S_IFMT == libc::S_IFDIR,
    }))
}

/// Per-mount flags a request may ask for on a bind mount.
pub(crate) fn parse_bind_flag(opt: &str) -> Option<MountFlags> {
    Some(match opt {
        "ro" => MountFlags::RDONLY,
        "rw" | "defaults" => MountFlags::empty(),
        "nosuid" => MountFlags::NOSUID,
        "nodev" => MountFlags::NODEV,
        "noexec" => MountFlags::NOEXEC,
        "noatime" => MountFlags::NOATIME,
        "nodiratime" => MountFlags::NODIRATIME,
        "relatime" => MountFlags::RELATIME,
        "strictatime" => MountFlags::STRICTATIME,
        _ => return None,
    })
}

/// Bind-mounts `src` onto `target` (blocking) with the per-mount `flags`.
///
/// The flags are set on the new mount *before* it is attached: a mount made
/// below a shared mount (kubelet's directories reach the plugin with
/// Bidirectional propagation) is copied into the host's namespace the moment
/// it is attached, and a remount afterwards changes only the plugin's copy.
/// So a bind and a remount would leave the pod with none of the flags, not
/// even `ro`. Kernels without the new mount API (before 5.12) get the bind
/// and the remount, which is right only where nothing propagates.
/// `bind`, [`mount_device`] and [`unmount`] are public for `localvol bench`'s
/// floors (the `cli/` crate), which mount exactly as the driver does.
pub fn bind(src: &Path, target: &Path, flags: MountFlags) -> Result<(), IoError> {
    if flags.is_empty() {
        return plain_bind(src, target);
    }
    match attach_bind(src, target, flags) {
        Err(e) if e.source.raw_os_error() == Some(libc::ENOSYS) => {
            bind_then_remount(src, target, flags)
        }
        other => other,
    }
}

fn plain_bind(src: &Path, target: &Path) -> Result<(), IoError> {
    Mount::builder()
        .fstype("none")
        .flags(MountFlags::BIND)
        .mount(src, target)
        .ctx(|| format!("bind-mounting {src:?} on {target:?}"))?;
    Ok(())
}

fn bind_then_remount(src: &Path, target: &Path, flags: MountFlags) -> Result<(), IoError> {
    plain_bind(src, target)?;
    let res = Mount::builder()
        .fstype("none")
        .flags(MountFlags::BIND | MountFlags::REMOUNT | flags)
        .mount(target, target)
        .ctx(|| format!("remounting {target:?} with {flags:?}"));
    if res.is_err() {
        // Never leave a mount with weaker flags than asked for.
        let _ = unmount(target);
    }
    res.map(drop)
}

/// The `mount_setattr` attributes for bind flags ([`parse_bind_flag`]'s).
fn mount_attr(flags: MountFlags) -> libc::mount_attr {
    let mut set = 0;
    let pairs = [
        (MountFlags::RDONLY, libc::MOUNT_ATTR_RDONLY),
        (MountFlags::NOSUID, libc::MOUNT_ATTR_NOSUID),
        (MountFlags::NODEV, libc::MOUNT_ATTR_NODEV),
        (MountFlags::NOEXEC, libc::MOUNT_ATTR_NOEXEC),
        (MountFlags::NODIRATIME, libc::MOUNT_ATTR_NODIRATIME),
    ];
    for (flag, attr) in pairs {
        if flags.contains(flag) {
            set |= attr;
        }
    }
    // The access-time mode is one field: setting it means clearing it first.
    let atime = if flags.contains(MountFlags::NOATIME) {
        Some(libc::MOUNT_ATTR_NOATIME)
    } else if flags.contains(MountFlags::STRICTATIME) {
        Some(libc::MOUNT_ATTR_STRICTATIME)
    } else if flags.contains(MountFlags::RELATIME) {
        Some(libc::MOUNT_ATTR_RELATIME)
    } else {
        None
    };
    let clr = match atime {
        Some(a) => {
            set |= a;
            libc::MOUNT_ATTR__ATIME
        }
        None => 0,
    };
    libc::mount_attr {
        attr_set: set,
        attr_clr: clr,
        propagation: 0,
        userns_fd: 0,
    }
}

/// `open_tree(OPEN_TREE_CLONE)` of `src`, `mount_setattr` on the detached
/// copy, then `move_mount` onto `target`. Until the move nothing is attached,
/// so nothing can propagate without the flags; a failure leaves nothing.
fn attach_bind(src: &Path, target: &Path, flags: MountFlags) -> Result<(), IoError> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let ctx = || format!("bind-mounting {src:?} on {target:?} with {flags:?}");
    let (csrc, ctarget) = (c_path(src, &ctx)?, c_path(target, &ctx)?);
    let last = || IoError::new(ctx(), std::io::Error::last_os_error());
    // SAFETY: the paths are valid NUL-terminated strings; open_tree returns a
    // new file descriptor (or -1), which is owned from here on.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            csrc.as_ptr(),
            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(last());
    }
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let attr = mount_attr(flags);
    let empty = c"";
    // SAFETY: `attr` is a `struct mount_attr` of the size passed, alive for
    // the call; `tree` is an open mount fd.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if r != 0 {
        return Err(last());
    }
    // SAFETY: as above; the target path is not followed if it is a symlink.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            ctarget.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(last());
    }
    Ok(())
}

fn c_path(p: &Path, ctx: &dyn Fn() -> String) -> Result<std::ffi::CString, IoError> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| IoError::new(ctx(), std::io::Error::from(ErrorKind::InvalidInput)))
}

/// Mounts a block device with an explicit filesystem type (blocking).
pub fn mount_device(
    dev: &Path,
    target: &Path,
    fs_type: &str,
    flags: MountFlags,
    data: &str,
) -> Result<(), IoError> {
    let mut b = Mount::builder().fstype(fs_type).flags(flags);
    if !data.is_empty() {
        b = b.data(data);
    }
    b.mount(dev, target)
        .ctx(|| format!("mounting {dev:?} ({fs_type}) on {target:?}"))?;
    Ok(())
}

/// Unmounts the top mount at `target` (blocking).
pub fn unmount(target: &Path) -> Result<(), IoError> {
    sys_mount::unmount(target, UnmountFlags::empty()).ctx(|| format!("unmounting {target:?}"))
}

/// The device node behind a device path (following `/dev/<vg>/<lv>` symlinks),
/// checked to be a block device.
pub(crate) fn block_device(dev: &Path) -> Result<(PathBuf, fs::Metadata)> {
    let real = fs::canonicalize(dev).map_err(|e| match e.kind() {
        ErrorKind::NotFound => MountError::DeviceMissing { dev: dev.into() },
        _ => IoError::new(format!("resolving {dev:?}"), e).into(),
    })?;
    let md = fs::metadata(&real).ctx(|| format!("inspecting {real:?}"))?;
    if !md.file_type().is_block_device() {
        return Err(MountError::NotABlockDevice { dev: dev.into() });
    }
    Ok((real, md))
}

/// Where a device node itself (not its filesystem) shows in `table`: what a
/// bind of the node, such as a raw block volume's publication, looks like.
pub(crate) fn locate_device_node(table: &MountTable, dev: &Path) -> Result<Location> {
    let (real, _) = block_device(dev)?;
    table
        .locate(&real)
        .ok_or(MountError::Unlocated { path: real })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 253:0 / / rw,relatime - ext4 /dev/vda rw
40 27 253:0 /srv/pool/volumes/abc /var/lib/kubelet/st rw,relatime - ext4 /dev/vda rw
41 27 253:0 /srv/pool/volumes/abc /var/lib/kubelet/pods/p1/mount ro,relatime - ext4 /dev/vda rw
42 27 0:50 / /srv/pool rw - tmpfs tmpfs rw
43 27 0:50 /volumes/def /mnt/with\\040space rw - tmpfs tmpfs rw
44 27 0:51 / /srv/pool rw - tmpfs tmpfs rw
";

    #[test]
    fn finds_bind_mounts_of_a_directory() {
        let t = MountTable::parse(SAMPLE).unwrap();
        let loc = Location {
            dev: "253:0".into(),
            root: "/srv/pool/volumes/abc".into(),
        };
        let points: Vec<_> = t.mounts_of(&loc).map(|e| e.mount_point.clone()).collect();
        assert_eq!(
            points,
            [
                PathBuf::from("/var/lib/kubelet/st"),
                PathBuf::from("/var/lib/kubelet/pods/p1/mount")
            ]
        );
        assert!(
            t.at(Path::new("/var/lib/kubelet/pods/p1/mount"))
                .unwrap()
                .read_only
        );
        assert!(!t.at(Path::new("/var/lib/kubelet/st")).unwrap().read_only);
    }

    #[test]
    fn locate_uses_the_deepest_and_topmost_mount() {
        let t = MountTable::parse(SAMPLE).unwrap();
        // /srv/pool has two tmpfs stacked over the root filesystem's /srv/pool:
        // the one mounted last (0:51) is what the path resolves to.
        let loc = t.locate(Path::new("/srv/pool/volumes/def")).unwrap();
        assert_eq!(
            loc,
            Location {
                dev: "0:51".into(),
                root: "/volumes/def".into()
            }
        );
        assert_eq!(t.count_at(Path::new("/srv/pool")), 2);
        let stack: Vec<_> = t
            .stack_at(Path::new("/srv/pool"))
            .map(|m| m.dev.as_str())
            .collect();
        assert_eq!(stack, ["0:51", "0:50"], "top first");
        assert_eq!(t.at(Path::new("/srv/pool")).unwrap().dev, "0:51");
        let on_root = t.locate(Path::new("/etc")).unwrap();
        assert_eq!(
            on_root,
            Location {
                dev: "253:0".into(),
                root: "/etc".into()
            }
        );
    }

    #[test]
    fn unescapes_octal_in_paths() {
        let t = MountTable::parse(SAMPLE).unwrap();
        let loc = Location {
            dev: "0:50".into(),
            root: "/volumes/def".into(),
        };
        let m = t.mounts_of(&loc).next().unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(unescape(br"a\134b\011c\9"), PathBuf::from("a\\b\tc\\9"));
    }

    #[test]
    fn optional_fields_and_the_separator() {
        // Propagation fields between the options and ` - `, any number of them;
        // per-mount `ro` is what counts, not the super options.
        let t = MountTable::parse(
            "\
1 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw
2 1 8:1 /a /x ro,nosuid shared:7 master:2 propagate_from:3 unbindable - ext4 /dev/sda1 rw,errors=remount-ro
3 1 8:1 /b /y rw - xfs none ro
4 1 0:40 / /z rw,relatime master:9 - fuse.sshfs  rw
",
        )
        .unwrap();
        let x = t.at(Path::new("/x")).unwrap();
        assert_eq!(x.dev, "8:1");
        assert_eq!(x.root, PathBuf::from("/a"));
        assert_eq!(x.fs_type, "ext4");
        assert_eq!(x.source.as_deref(), Some("/dev/sda1"));
        assert!(x.read_only);
        let y = t.at(Path::new("/y")).unwrap();
        assert!(!y.read_only, "super option ro is not the mount's flag");
        assert_eq!(y.fs_type, "xfs");
        assert_eq!(y.source, None, "'none' is no source");
        let z = t.at(Path::new("/z")).unwrap();
        assert_eq!(z.fs_type, "fuse.sshfs");
        assert_eq!(z.source, None, "an empty source is no source");
        assert_eq!(t.count_at(Path::new("/")), 1);
    }

    #[test]
    fn escapes_in_every_path_field() {
        let t = MountTable::parse(
            "7 1 0:50 /vol\\040a\\011b\\134c /mnt/a\\040b\\012c ro - tmpfs my\\040src rw\n",
        )
        .unwrap();
        let m = t.at(Path::new("/mnt/a b\nc")).unwrap();
        assert_eq!(m.root, PathBuf::from("/vol a\tb\\c"));
        assert_eq!(m.source.as_deref(), Some("my src"));
        assert!(m.read_only);
        // Non-UTF-8 bytes survive as bytes.
        let raw = b"8 1 0:50 / /mnt/\\377x rw - tmpfs t rw\n";
        let t = MountTable::parse_bytes(raw).unwrap();
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(
            t.entries[0].mount_point.as_os_str().as_bytes(),
            b"/mnt/\xffx"
        );
    }

    #[test]
    fn malformed_lines_are_errors() {
        for bad in [
            "22 27 0:21 / /proc rw,relatime proc proc rw\n", // no separator
            "22 27 0:21 / /proc rw,relatime -\n",            // nothing after it
            "22 27 0:21 / /proc rw - proc proc\n",           // no super options
            "22 27 021 / /proc rw - proc proc rw\n",         // bad major:minor
            "x 27 0:21 / /proc rw - proc proc rw\n",         // bad id
            "22 27 0:21 /\n",
        ] {
            let r = MountTable::parse(bad);
            assert!(matches!(r, Err(MountError::MountInfo(_))), "{bad:?}: {r:?}");
        }
        // Blank lines and a missing final newline are fine.
        let t = MountTable::parse("\n22 27 0:21 / /proc rw - proc proc rw").unwrap();
        assert_eq!(t.entries.len(), 1);
    }

    /// A bind shows as a mount root with the source directory's inode; a
    /// plain directory is no mount root; a missing path is None. Real
    /// mounts: needs root.
    #[test]
    fn probe_tells_mount_roots_and_their_inodes() {
        let d = tempfile::tempdir().unwrap();
        let (src, other, at) = (
            d.path().join("src"),
            d.path().join("other"),
            d.path().join("at"),
        );
        for p in [&src, &other, &at] {
            fs::create_dir(p).unwrap();
        }
        assert_eq!(probe(&d.path().join("missing")).unwrap(), None);
        let plain = probe(&at).unwrap().unwrap();
        assert!(!plain.mount_root && plain.is_dir);
        let s = probe(&src).unwrap().unwrap();
        assert!(!s.same_inode(&plain));
        bind(&src, &at, MountFlags::empty()).unwrap();
        let m = probe(&at).unwrap().unwrap();
        assert!(m.mount_root && m.same_inode(&s), "{m:?} {s:?}");
        assert!(!m.same_inode(&probe(&other).unwrap().unwrap()));
        // The table agrees: the mount at `at` is `src`'s location.
        let t = MountTable::read().unwrap();
        assert_eq!(t.at(&at).unwrap().location(), t.locate(&src).unwrap());
        unmount(&at).unwrap();
        assert!(!probe(&at).unwrap().unwrap().mount_root);
        let f = d.path().join("file");
        fs::write(&f, b"x").unwrap();
        assert!(!probe(&f).unwrap().unwrap().is_dir);
    }

    /// Unmounts what a test mounted, last first, even when it fails.
    struct Mounted(Vec<PathBuf>);

    impl Drop for Mounted {
        fn drop(&mut self) {
            for p in self.0.iter().rev() {
                let _ = sys_mount::unmount(p, UnmountFlags::DETACH);
            }
        }
    }

    fn flags_at(p: &Path) -> nix::sys::statvfs::FsFlags {
        nix::sys::statvfs::statvfs(p).unwrap().flags()
    }

    /// Below a shared mount (kubelet's directories in the plugin, with
    /// Bidirectional propagation) a bind is copied to the peers the moment it
    /// is attached; the flags must be on every copy, as a pod mounts the
    /// host's. The fallback's bind and remount reaches only its own copy.
    /// Real mounts: needs root.
    #[test]
    fn bind_flags_reach_the_propagated_copies() {
        use nix::sys::statvfs::FsFlags;
        let d = tempfile::tempdir().unwrap();
        let (shared, peer, src) = (
            d.path().join("shared"),
            d.path().join("peer"),
            d.path().join("src"),
        );
        for p in [&shared, &peer, &src] {
            fs::create_dir(p).unwrap();
        }
        let mut m = Mounted(vec![]);
        mount_device(
            Path::new("tmpfs"),
            &shared,
            "tmpfs",
            MountFlags::empty(),
            "",
        )
        .unwrap();
        m.0.push(shared.clone());
        nix::mount::mount(
            None::<&str>,
            &shared,
            None::<&str>,
            nix::mount::MsFlags::MS_SHARED,
            None::<&str>,
        )
        .unwrap();
        bind(&shared, &peer, MountFlags::empty()).unwrap();
        m.0.push(peer.clone());
        let (t, u) = (shared.join("t"), shared.join("u"));
        fs::create_dir(&t).unwrap();
        fs::create_dir(&u).unwrap();
        let flags = MountFlags::RDONLY
            | MountFlags::NOSUID
            | MountFlags::NODEV
            | MountFlags::NOEXEC
            | MountFlags::NOATIME;
        let want = FsFlags::ST_RDONLY
            | FsFlags::ST_NOSUID
            | FsFlags::ST_NODEV
            | FsFlags::ST_NOEXEC
            | FsFlags::ST_NOATIME;
        bind(&src, &t, flags).unwrap();
        m.0.extend([t.clone(), peer.join("t")]);
        for at in [&t, &peer.join("t")] {
            assert!(flags_at(at).contains(want), "{at:?}: {:?}", flags_at(at));
        }
        // The fallback for kernels before 5.12: right where nothing propagates.
        bind_then_remount(&src, &u, flags).unwrap();
        m.0.extend([u.clone(), peer.join("u")]);
        assert!(flags_at(&u).contains(want), "{:?}", flags_at(&u));
        assert!(
            !flags_at(&peer.join("u")).intersects(want),
            "{:?}",
            flags_at(&peer.join("u"))
        );
        // The access-time mode is replaced, not added to.
        let s = shared.join("s");
        fs::create_dir(&s).unwrap();
        bind(&t, &s, MountFlags::STRICTATIME).unwrap();
        m.0.push(s.clone());
        assert!(
            !flags_at(&s).contains(FsFlags::ST_NOATIME),
            "{:?}",
            flags_at(&s)
        );
    }

    #[test]
    fn reads_the_real_table() {
        let t = MountTable::read().unwrap();
        assert!(t.at(Path::new("/proc")).is_some());
        assert!(t.count_at(Path::new("/")) >= 1);
    }
}
