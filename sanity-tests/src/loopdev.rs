//! Loop devices and filesystems on them (VM tests: quotas, raw disks, LVM).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{mounts, path_str, run_cmd, MountLine};

/// Creates (or truncates) `path` as a sparse file of `bytes` bytes.
pub fn sparse_file(path: &Path, bytes: u64) {
    let f = fs::File::create(path).unwrap_or_else(|e| panic!("creating {path:?}: {e}"));
    f.set_len(bytes)
        .unwrap_or_else(|e| panic!("sizing {path:?}: {e}"));
}

/// A loop device over a sparse image file. Drop detaches it (the kernel
/// detaches it once unused if it is still mounted then).
pub struct LoopDevice {
    pub image: PathBuf,
    pub path: PathBuf,
}

impl LoopDevice {
    /// Creates a sparse `bytes`-byte image at `image` and attaches it.
    pub fn create(image: &Path, bytes: u64) -> Self {
        sparse_file(image, bytes);
        Self::attach(image)
    }

    /// Attaches an existing image file.
    pub fn attach(image: &Path) -> Self {
        let out = run_cmd("losetup", &["--find", "--show", &path_str(image)]);
        let path = PathBuf::from(out.trim());
        assert!(
            out.starts_with("/dev/loop"),
            "losetup printed {out:?} for {image:?}"
        );
        Self {
            image: image.to_path_buf(),
            path,
        }
    }

    /// `major:minor`, as /proc/self/mountinfo shows it.
    pub fn dev(&self) -> String {
        use std::os::unix::fs::MetadataExt;
        let rdev = fs::metadata(&self.path).unwrap().rdev();
        format!(
            "{}:{}",
            nix::sys::stat::major(rdev),
            nix::sys::stat::minor(rdev)
        )
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup")
            .arg("-d")
            .arg(&self.path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Filesystems the tests make on loop devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsKind {
    Xfs,
    Ext4,
}

impl FsKind {
    pub const ALL: [FsKind; 2] = [FsKind::Xfs, FsKind::Ext4];

    pub fn name(self) -> &'static str {
        match self {
            FsKind::Xfs => "xfs",
            FsKind::Ext4 => "ext4",
        }
    }

    /// The mkfs command line that prepares an image for project quotas (ext4:
    /// the `project` and `quota` features, 256-byte inodes to hold the id;
    /// XFS needs nothing at mkfs time).
    fn mkfs(self, image: &Path) -> (&'static str, Vec<String>) {
        let image = path_str(image);
        match self {
            FsKind::Xfs => ("mkfs.xfs", vec!["-q".into(), "-f".into(), image]),
            FsKind::Ext4 => (
                "mkfs.ext4",
                ["-q", "-F", "-b", "4096", "-I", "256", "-O", "project,quota"]
                    .iter()
                    .map(|s| s.to_string())
                    .chain([image])
                    .collect(),
            ),
        }
    }
}

impl std::fmt::Display for FsKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A fresh filesystem on a loop device over a sparse image, mounted at
/// `mount_point`. Drop unmounts it (lazily when busy) and detaches the device.
///
/// Mounted below a [`Driver`](crate::Driver)'s dir, declare it after the driver in a struct
/// (fields drop in order): the driver's cleanup then unmounts it and removes
/// the image with its temp dir.
pub struct LoopFs {
    pub kind: FsKind,
    pub mount_point: PathBuf,
    pub device: LoopDevice,
}

impl LoopFs {
    /// Formats a `bytes`-byte image at `image` (XFS needs at least 300 MiB)
    /// and mounts it at `mount_point` (created if missing) with `options`
    /// (`-o`, comma-separated; empty for none).
    pub fn create(
        kind: FsKind,
        image: &Path,
        bytes: u64,
        mount_point: &Path,
        options: &str,
    ) -> Self {
        sparse_file(image, bytes);
        let (mkfs, args) = kind.mkfs(image);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_cmd(mkfs, &args);
        let device = LoopDevice::attach(image);
        fs::create_dir_all(mount_point).unwrap();
        let dev = path_str(&device.path);
        let mp = path_str(mount_point);
        let mut args = vec!["-t", kind.name()];
        if !options.is_empty() {
            args.extend(["-o", options]);
        }
        args.extend([dev.as_str(), mp.as_str()]);
        run_cmd("mount", &args);
        Self {
            kind,
            mount_point: mount_point.to_path_buf(),
            device,
        }
    }

    /// Mounts of this filesystem (the mount itself and any bind of it).
    pub fn mounts(&self) -> Vec<MountLine> {
        let dev = self.device.dev();
        mounts().into_iter().filter(|m| m.dev == dev).collect()
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        use nix::mount::{umount2, MntFlags};
        for _ in 0..64 {
            let Some(m) = self
                .mounts()
                .into_iter()
                .max_by_key(|m| m.mount_point.components().count())
            else {
                break;
            };
            if umount2(&m.mount_point, MntFlags::empty()).is_err() {
                let _ = umount2(&m.mount_point, MntFlags::MNT_DETACH);
            }
        }
        // `device` drops next and detaches the loop device.
    }
}
