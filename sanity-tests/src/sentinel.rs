//! Sentinels: directories outside the driver's roots that must never change.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::mounts;

/// What a tree looks like: every entry (not following symlinks) with its type,
/// permissions and content (files) or target (symlinks).
pub type TreeSnapshot = BTreeMap<PathBuf, String>;

pub fn snapshot_tree(root: &Path) -> TreeSnapshot {
    fn walk(root: &Path, p: &Path, out: &mut TreeSnapshot) {
        let md = match fs::symlink_metadata(p) {
            Ok(md) => md,
            Err(e) => {
                out.insert(
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    format!("error {e}"),
                );
                return;
            }
        };
        let rel = p.strip_prefix(root).unwrap().to_path_buf();
        let mode = md.permissions().mode();
        let ft = md.file_type();
        let desc = if ft.is_symlink() {
            format!("symlink {:o} -> {:?}", mode, fs::read_link(p).unwrap())
        } else if ft.is_file() {
            format!("file {:o} {:?}", mode, fs::read(p).unwrap())
        } else if ft.is_dir() {
            format!("dir {:o}", mode)
        } else {
            format!("other {:o}", mode)
        };
        out.insert(rel, desc);
        if ft.is_dir() {
            let mut entries: Vec<_> = fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            entries.sort();
            for e in entries {
                walk(root, &e, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// A directory outside every driver root, filled with a few files, that bad
/// requests aim at. `check()` asserts nothing in it changed.
pub struct Sentinel {
    dir: tempfile::TempDir,
    before: TreeSnapshot,
}

impl Sentinel {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("localvol-sentinel-")
            .tempdir()
            .unwrap();
        let p = dir.path();
        fs::write(p.join("precious"), b"do not touch").unwrap();
        fs::create_dir(p.join("x")).unwrap();
        fs::write(p.join("x/inner"), b"inner data").unwrap();
        fs::create_dir(p.join("mount")).unwrap();
        fs::create_dir(p.join("empty")).unwrap();
        let before = snapshot_tree(p);
        Self { dir, before }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    #[track_caller]
    pub fn check(&self, what: &str) {
        let now = snapshot_tree(self.dir.path());
        assert_eq!(
            now, self.before,
            "{what}: the sentinel dir outside the driver changed"
        );
    }
}

impl Default for Sentinel {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        // A test that failed may have left a mount in the sentinel.
        for _ in 0..16 {
            let Some(m) = mounts()
                .into_iter()
                .filter(|m| m.mount_point.starts_with(self.dir.path()))
                .max_by_key(|m| m.mount_point.components().count())
            else {
                break;
            };
            let _ = nix::mount::umount2(&m.mount_point, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}
