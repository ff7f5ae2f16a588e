//! Where a [`Driver`] keeps things (its temp dir, pools, kubelet dir, log)
//! and what is mounted there.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::Driver;
use crate::{locate, mounts, DriverOpts, MountLine};

impl Driver {
    pub fn dir(&self) -> &Path {
        &self.root
    }
    /// The options the next start writes the config from (see
    /// [`Driver::start_again`]).
    pub fn opts_mut(&mut self) -> &mut DriverOpts {
        &mut self.opts
    }
    pub fn socket_path(&self) -> PathBuf {
        self.root.join("csi.sock")
    }
    pub fn config_path(&self) -> PathBuf {
        self.root.join("config.yaml")
    }
    pub fn log_path(&self) -> PathBuf {
        self.root.join("driver.log")
    }
    pub fn kubelet_dir(&self) -> PathBuf {
        self.root.join("kubelet")
    }
    pub(super) fn pool_dir_at(&self, i: usize) -> PathBuf {
        if i == 0 {
            self.root.join("pool")
        } else {
            self.root.join(format!("pool-{}", self.opts.pools[i].name))
        }
    }
    /// The directory of the pool named `name`.
    pub fn pool_dir(&self, name: &str) -> PathBuf {
        let i = self
            .opts
            .pools
            .iter()
            .position(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pool {name} in this driver's config"));
        self.pool_dir_at(i)
    }
    /// `<first pool>/volumes`, where the dir pool keeps volumes and records.
    pub fn volumes_dir(&self) -> PathBuf {
        self.pool_dir_at(0).join("volumes")
    }
    /// The data directory of a volume of a dir pool (`<pool>/volumes/<key>`).
    pub fn volume_data_dir(&self, volume_id: &str) -> PathBuf {
        let (pool, key) = volume_id
            .rsplit_once('.')
            .unwrap_or_else(|| panic!("{volume_id:?} is not a localvol volume id"));
        self.pool_dir(pool).join("volumes").join(key)
    }
    /// Names of the volume data directories in a pool (records excluded).
    pub fn volume_dirs(&self, pool: &str) -> Vec<String> {
        let mut out: Vec<String> = fs::read_dir(self.pool_dir(pool).join("volumes"))
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_dir())
            .map(|e| e.file_name().into_string().unwrap())
            .collect();
        out.sort();
        out
    }
    /// A staging path below the kubelet dir; its parent exists, it does not.
    pub fn staging_path(&self, name: &str) -> PathBuf {
        self.kubelet_dir().join("staging").join(name)
    }
    /// A target path `<kubelet>/pods/<name>/mount`; its parent is created.
    pub fn target_path(&self, name: &str) -> PathBuf {
        let parent = self.kubelet_dir().join("pods").join(name);
        fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    }

    /// The last `n` lines of the driver's log.
    pub fn log_tail(&self, n: usize) -> String {
        let Ok(mut f) = fs::File::open(self.log_path()) else {
            return "(no log)".into();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Mounts (from /proc/self/mountinfo) whose mount point lies in this
    /// driver's temp dir.
    pub fn mounts_below_dir(&self) -> Vec<MountLine> {
        mounts()
            .into_iter()
            .filter(|m| m.mount_point.starts_with(&self.root))
            .collect()
    }

    /// Unmounts everything below the temp dir, and any bind of something inside
    /// it mounted elsewhere; deepest first. Returns what could not be unmounted.
    pub(super) fn unmount_leftovers(&self) -> Vec<MountLine> {
        // Where the temp dir is inside its filesystem: a bind of anything below
        // that, wherever it is mounted, is ours too.
        let here = locate(&self.root);
        let ours = |m: &MountLine| {
            m.mount_point.starts_with(&self.root)
                || here
                    .as_ref()
                    .is_some_and(|(dev, root)| m.dev == *dev && m.root.starts_with(root))
        };
        for _ in 0..256 {
            // Deepest mount point first (umount takes the top of a stack).
            let Some(m) = mounts()
                .into_iter()
                .filter(&ours)
                .max_by_key(|m| m.mount_point.components().count())
            else {
                return Vec::new();
            };
            use nix::mount::{umount2, MntFlags};
            if umount2(&m.mount_point, MntFlags::empty()).is_err() {
                let _ = umount2(&m.mount_point, MntFlags::MNT_DETACH);
            }
        }
        mounts().into_iter().filter(&ours).collect()
    }
}
