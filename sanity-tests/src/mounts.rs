//! The mount table, read from /proc/self/mountinfo independently of the
//! driver, and snapshots of it to diff against.

use std::fs;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One line of /proc/self/mountinfo (parsed here, independently of the driver).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountLine {
    /// Mount ids are reused as soon as a mount goes away: compare with
    /// [`MountLine::same_mount`], not by id alone.
    pub id: u64,
    pub parent_id: u64,
    /// `major:minor`.
    pub dev: String,
    /// Path of the mount's source inside its filesystem.
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options (`rw,nosuid,noexec,relatime`).
    pub options: Vec<String>,
}

impl MountLine {
    /// Whether two lines (of two reads of the table) are the same mount.
    pub fn same_mount(&self, other: &MountLine) -> bool {
        self.id == other.id
            && self.parent_id == other.parent_id
            && self.dev == other.dev
            && self.root == other.root
            && self.mount_point == other.mount_point
    }

    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
    pub fn has_option(&self, o: &str) -> bool {
        self.options.iter().any(|x| x == o)
    }
}

pub(crate) fn unescape_mountinfo(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// The filesystem (`major:minor`) holding `path` and the path inside it.
pub fn locate(path: &Path) -> Option<(String, PathBuf)> {
    let m = mounts()
        .into_iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())?;
    let rest = path.strip_prefix(&m.mount_point).ok()?;
    Some((m.dev.clone(), m.root.join(rest)))
}

/// The current mount table, in mountinfo order.
pub fn mounts() -> Vec<MountLine> {
    let text = fs::read_to_string("/proc/self/mountinfo").expect("reading /proc/self/mountinfo");
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            if f.len() < 6 {
                return None;
            }
            Some(MountLine {
                id: f[0].parse().ok()?,
                parent_id: f[1].parse().ok()?,
                dev: f[2].to_owned(),
                root: unescape_mountinfo(f[3]),
                mount_point: unescape_mountinfo(f[4]),
                options: f[5].split(',').map(str::to_owned).collect(),
            })
        })
        .collect()
}

/// The mounts stacked at exactly `path`, bottom first.
pub fn mounts_at(path: &Path) -> Vec<MountLine> {
    mounts()
        .into_iter()
        .filter(|m| m.mount_point == path)
        .collect()
}

/// The top mount at `path`, if any.
pub fn mount_at(path: &Path) -> Option<MountLine> {
    mounts_at(path).pop()
}

/// A mount-table snapshot to diff against later.
///
/// Other tests (and other programs on the machine) mount things concurrently in
/// the same mount namespace, so only mounts that concern the given roots
/// count: mounted below one of them, or mounting something from inside one of
/// them (a bind of a volume, wherever it lands, has its source in the pool).
pub struct MountSnapshot {
    before: Vec<MountLine>,
}

impl MountSnapshot {
    pub fn take() -> Self {
        Self { before: mounts() }
    }

    /// Mounts that appeared since the snapshot and concern one of `roots`.
    pub fn new_mounts(&self, roots: &[&Path]) -> Vec<MountLine> {
        let sources: Vec<(String, PathBuf)> = roots.iter().filter_map(|r| locate(r)).collect();
        mounts()
            .into_iter()
            .filter(|m| !self.before.iter().any(|b| b.same_mount(m)))
            .filter(|m| {
                roots.iter().any(|r| m.mount_point.starts_with(r))
                    || sources
                        .iter()
                        .any(|(dev, root)| m.dev == *dev && m.root.starts_with(root))
            })
            .collect()
    }

    #[track_caller]
    pub fn assert_no_new_mounts(&self, roots: &[&Path], what: &str) {
        let new = self.new_mounts(roots);
        assert!(new.is_empty(), "{what}: new mounts appeared: {new:#?}");
    }
}
