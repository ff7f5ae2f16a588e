//! Mount state and mount syscalls. The kernel's `/proc/self/mountinfo` is the only
//! record of what is mounted: nothing here caches it.
//!
//! A bind mount shows in mountinfo as the device (`major:minor`) plus the path of
//! its source *inside that filesystem* (the `root` field), so "is this directory
//! mounted somewhere" and "is this mount a bind of that directory" are both
//! answered by comparing `(device, root)` pairs ([`Location`]).

use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use procfs_core::process::{MountInfo, MountInfos};
use procfs_core::FromRead;
use sys_mount::{Mount, MountFlags, UnmountFlags};

use crate::error::{Error, IoContext, Result};

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
        let f = std::fs::File::open("/proc/self/mountinfo")
            .ctx(|| "opening /proc/self/mountinfo".into())?;
        let infos = MountInfos::from_read(f)
            .map_err(|e| Error::Internal(format!("parsing /proc/self/mountinfo: {e}")))?;
        Ok(Self::from_infos(infos.0))
    }

    pub fn parse(text: &str) -> Result<Self> {
        let infos = MountInfos::from_read(text.as_bytes())
            .map_err(|e| Error::Internal(format!("parsing mountinfo: {e}")))?;
        Ok(Self::from_infos(infos.0))
    }

    fn from_infos(infos: Vec<MountInfo>) -> Self {
        let entries = infos
            .into_iter()
            .map(|m| MountEntry {
                read_only: m.mount_options.contains_key("ro"),
                mount_point: unescape(m.mount_point.as_os_str().as_bytes()),
                dev: m.majmin,
                root: unescape(m.root.as_bytes()),
                fs_type: m.fs_type,
                source: m.mount_source,
            })
            .collect();
        MountTable { entries }
    }

    /// The mount visible at exactly `path` (the top one when mounts are stacked).
    pub fn at(&self, path: &Path) -> Option<&MountEntry> {
        self.entries.iter().rev().find(|e| e.mount_point == path)
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

/// Decodes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`,
/// `\134`), which the parser leaves in place.
fn unescape(raw: &[u8]) -> PathBuf {
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
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Per-mount flags a request may ask for on a bind mount.
pub fn parse_bind_flag(opt: &str) -> Option<MountFlags> {
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

/// Bind-mounts `src` onto `target` (blocking). Flags other than BIND are applied
/// by a second remount: the kernel ignores them on the first bind.
pub fn bind(src: &Path, target: &Path, flags: MountFlags) -> Result<()> {
    Mount::builder()
        .fstype("none")
        .flags(MountFlags::BIND)
        .mount(src, target)
        .ctx(|| format!("bind-mounting {src:?} on {target:?}"))?;
    if !flags.is_empty() {
        let res = Mount::builder()
            .fstype("none")
            .flags(MountFlags::BIND | MountFlags::REMOUNT | flags)
            .mount(target, target)
            .ctx(|| format!("remounting {target:?} with {flags:?}"));
        if let Err(e) = res {
            // Never leave a mount with weaker flags than asked for.
            let _ = unmount(target);
            return Err(e);
        }
    }
    Ok(())
}

/// Mounts a block device with an explicit filesystem type (blocking).
pub fn mount_device(
    dev: &Path,
    target: &Path,
    fs_type: &str,
    flags: MountFlags,
    data: &str,
) -> Result<()> {
    let mut b = Mount::builder().fstype(fs_type).flags(flags);
    if !data.is_empty() {
        b = b.data(data);
    }
    b.mount(dev, target)
        .ctx(|| format!("mounting {dev:?} ({fs_type}) on {target:?}"))?;
    Ok(())
}

/// Unmounts the top mount at `target` (blocking).
pub fn unmount(target: &Path) -> Result<()> {
    sys_mount::unmount(target, UnmountFlags::empty()).ctx(|| format!("unmounting {target:?}"))
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
    fn reads_the_real_table() {
        let t = MountTable::read().unwrap();
        assert!(t.at(Path::new("/proc")).is_some());
        assert!(t.count_at(Path::new("/")) >= 1);
    }
}
