//! Finds the volumes of a discovery class: the first-level entries of its
//! `hostDir` whose name matches the class's pattern. Filesystem classes take
//! only real mount points (read from the live mount table); Block classes take
//! block devices and symlinks that resolve to block devices. Anything else is
//! skipped with a reason, never turned into a volume.
//!
//! All functions block: call them through [`crate::error::blocking`].

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use super::StaticError;
use super::{DiscoveryClass, DiscoveryConfig, StaticHandle, VolumeMode};
use crate::error::{IoContext, IoError};

type Result<T, E = StaticError> = std::result::Result<T, E>;
use crate::mount::MountTable;

/// What a discovered entry holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A mounted filesystem; the entry path is its mount point.
    Mount { fs_type: String },
    /// A block device: the resolved device node.
    Device { device: PathBuf },
}

/// One volume found under a class's directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovered {
    /// Index of the class in the config.
    pub class: usize,
    /// The entry's name in `hostDir`.
    pub name: String,
    /// `hostDir/name` (with `hostDir` resolved).
    pub path: PathBuf,
    pub handle: StaticHandle,
    pub capacity_bytes: u64,
    pub kind: EntryKind,
}

impl Discovered {
    /// What to bind-mount for this volume: the mount point or the device node.
    pub fn source_path(&self) -> &Path {
        match &self.kind {
            EntryKind::Mount { .. } => &self.path,
            EntryKind::Device { device } => device,
        }
    }
}

/// An entry that matched the pattern but cannot be a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub class: usize,
    pub path: PathBuf,
    pub reason: String,
}

#[derive(Clone, Debug, Default)]
pub struct ScanResult {
    pub found: Vec<Discovered>,
    pub skipped: Vec<Skipped>,
}

/// Scans every class of the config against one reading of the mount table.
pub fn scan_all(cfg: &DiscoveryConfig) -> Result<ScanResult> {
    let table = MountTable::read()?;
    let mut out = ScanResult::default();
    for i in 0..cfg.classes.len() {
        let r = scan_class(cfg, i, &table)?;
        out.found.extend(r.found);
        out.skipped.extend(r.skipped);
    }
    Ok(out)
}

/// Scans one class. A missing `hostDir` is a skip (the operator may not have
/// created it yet), not an error.
pub fn scan_class(cfg: &DiscoveryConfig, class: usize, table: &MountTable) -> Result<ScanResult> {
    let c = &cfg.classes[class];
    let mut out = ScanResult::default();
    let dir = match fs::canonicalize(&c.host_dir) {
        Ok(d) => d,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            out.skipped.push(Skipped {
                class,
                path: c.host_dir.clone(),
                reason: "hostDir does not exist".into(),
            });
            return Ok(out);
        }
        Err(e) => return Err(IoError::new(format!("resolving {:?}", c.host_dir), e).into()),
    };
    let pattern = c.pattern();
    let mut names: Vec<_> = fs::read_dir(&dir)
        .ctx(|| format!("reading {dir:?}"))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()
        .ctx(|| format!("reading {dir:?}"))?;
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let Some(name) = name.to_str().map(str::to_owned) else {
            out.skipped.push(Skipped {
                class,
                path,
                reason: "name is not UTF-8".into(),
            });
            continue;
        };
        if name.starts_with('.') || !pattern.matches(&name) {
            continue;
        }
        match inspect(c, &path, table) {
            Ok((kind, capacity_bytes)) => out.found.push(Discovered {
                class,
                handle: StaticHandle::new(c, name.as_ref()),
                name,
                path,
                capacity_bytes,
                kind,
            }),
            Err(reason) => out.skipped.push(Skipped {
                class,
                path,
                reason,
            }),
        }
    }
    Ok(out)
}

/// What an entry holds and its size, or why it is not a volume.
fn inspect(
    c: &DiscoveryClass,
    path: &Path,
    table: &MountTable,
) -> std::result::Result<(EntryKind, u64), String> {
    let md = fs::symlink_metadata(path).map_err(|e| format!("cannot inspect: {e}"))?;
    match c.volume_mode {
        VolumeMode::Filesystem => {
            if !md.is_dir() {
                return Err("not a directory (Filesystem entries are mount points)".into());
            }
            let Some(m) = table.at(path) else {
                return Err("not a mount point".into());
            };
            let st = crate::fsutil::fs_stats(path).map_err(|e| e.to_string())?;
            Ok((
                EntryKind::Mount {
                    fs_type: m.fs_type.clone(),
                },
                st.total_bytes,
            ))
        }
        VolumeMode::Block => {
            let device = if md.file_type().is_block_device() {
                path.to_path_buf()
            } else if md.file_type().is_symlink() {
                let real =
                    fs::canonicalize(path).map_err(|e| format!("cannot resolve symlink: {e}"))?;
                let rmd =
                    fs::metadata(&real).map_err(|e| format!("cannot inspect {real:?}: {e}"))?;
                if !rmd.file_type().is_block_device() {
                    return Err(format!("symlink to {real:?}, which is not a block device"));
                }
                real
            } else {
                return Err("not a block device".into());
            };
            let size = crate::blockdev::device_size(&device).map_err(|e| e.to_string())?;
            Ok((EntryKind::Device { device }, size))
        }
    }
}

/// Finds the entry a handle names, from a fresh scan of its class (the node's
/// path for NodeStage/NodePublish). None when no class or entry matches.
pub fn find(cfg: &DiscoveryConfig, handle: &StaticHandle) -> Result<Option<Discovered>> {
    let Some(class) = cfg.classes.iter().position(|c| c.key() == handle.class_key) else {
        return Ok(None);
    };
    let table = MountTable::read()?;
    Ok(scan_class(cfg, class, &table)?
        .found
        .into_iter()
        .find(|d| d.handle == *handle))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::discovery::{CleanupConfig, CleanupMethod};
    use std::process::Command;

    pub(crate) fn class(dir: &Path, mode: VolumeMode, method: CleanupMethod) -> DiscoveryClass {
        DiscoveryClass {
            storage_class: "local".into(),
            host_dir: dir.to_path_buf(),
            volume_mode: mode,
            fs_type: None,
            name_pattern: "*".into(),
            access_modes: vec!["ReadWriteOnce".into()],
            cleanup: CleanupConfig {
                method,
                command: None,
            },
            labels: Default::default(),
        }
    }

    pub(crate) fn run(prog: &str, args: &[&str]) -> String {
        let out = Command::new(prog).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{prog} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// A mount made by a test, unmounted (lazily) on drop.
    pub(crate) struct TestMount(pub PathBuf);
    impl TestMount {
        pub(crate) fn tmpfs(at: &Path, size: &str) -> Self {
            fs::create_dir_all(at).unwrap();
            crate::mount::mount_device(
                Path::new("tmpfs"),
                at,
                "tmpfs",
                sys_mount::MountFlags::empty(),
                &format!("size={size}"),
            )
            .unwrap();
            TestMount(at.to_path_buf())
        }
        pub(crate) fn device(dev: &Path, at: &Path, fs_type: &str) -> Self {
            fs::create_dir_all(at).unwrap();
            crate::mount::mount_device(dev, at, fs_type, sys_mount::MountFlags::empty(), "")
                .unwrap();
            TestMount(at.to_path_buf())
        }
        pub(crate) fn bind(src: &Path, at: &Path) -> Self {
            crate::mount::bind(src, at, sys_mount::MountFlags::empty()).unwrap();
            TestMount(at.to_path_buf())
        }
    }
    impl Drop for TestMount {
        fn drop(&mut self) {
            let _ = sys_mount::unmount(&self.0, sys_mount::UnmountFlags::DETACH);
        }
    }

    /// A loop device over a sparse file in `dir`, detached on drop.
    pub(crate) struct Loop(pub PathBuf);
    impl Loop {
        pub(crate) fn new(dir: &Path, name: &str, size: u64) -> Self {
            let img = dir.join(name);
            fs::File::create(&img).unwrap().set_len(size).unwrap();
            let out = run("losetup", &["--find", "--show", img.to_str().unwrap()]);
            Loop(PathBuf::from(out.trim()))
        }
        pub(crate) fn mkfs(self, fs_type: &str) -> Self {
            let dev = self.0.to_str().unwrap();
            match fs_type {
                "xfs" => run("mkfs.xfs", &["-q", "-f", dev]),
                _ => run("mkfs.ext4", &["-q", "-F", dev]),
            };
            self
        }
    }
    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
        }
    }

    fn cfg(c: DiscoveryClass) -> DiscoveryConfig {
        let cfg = DiscoveryConfig {
            classes: vec![c],
            state_dir: "/nonexistent".into(),
        };
        cfg.validate().unwrap();
        cfg
    }

    #[test]
    fn filesystem_mode_finds_real_mount_points_only() {
        let tmp = tempfile::tempdir().unwrap();
        let disks = tmp.path().join("disks");
        fs::create_dir(&disks).unwrap();
        let _t = TestMount::tmpfs(&disks.join("a-tmpfs"), "16m");
        let ext4 = Loop::new(tmp.path(), "ext4.img", 64 << 20).mkfs("ext4");
        let _e = TestMount::device(&ext4.0, &disks.join("b-ext4"), "ext4");
        let xfs = Loop::new(tmp.path(), "xfs.img", 320 << 20).mkfs("xfs");
        let _x = TestMount::device(&xfs.0, &disks.join("c-xfs"), "xfs");
        fs::create_dir(disks.join("d-plain")).unwrap();
        fs::write(disks.join("e-file"), b"x").unwrap();
        std::os::unix::fs::symlink(disks.join("a-tmpfs"), disks.join("f-link")).unwrap();
        fs::create_dir(disks.join("other")).unwrap();

        let mut c = class(
            &disks,
            VolumeMode::Filesystem,
            CleanupMethod::DeleteContents,
        );
        c.name_pattern = "?-*".into();
        let cfg = cfg(c);
        let r = scan_all(&cfg).unwrap();
        let found: Vec<_> = r
            .found
            .iter()
            .map(|d| (d.name.as_str(), d.kind.clone()))
            .collect();
        let kind = |f: &str| EntryKind::Mount { fs_type: f.into() };
        assert_eq!(
            found,
            [
                ("a-tmpfs", kind("tmpfs")),
                ("b-ext4", kind("ext4")),
                ("c-xfs", kind("xfs"))
            ]
        );
        assert_eq!(r.found[0].capacity_bytes, 16 << 20);
        assert!(
            r.found[1].capacity_bytes > 40 << 20 && r.found[1].capacity_bytes <= 64 << 20,
            "{}",
            r.found[1].capacity_bytes
        );
        assert!(r.found[2].capacity_bytes > 200 << 20);
        let skipped: Vec<_> = r
            .skipped
            .iter()
            .map(|s| {
                (
                    s.path.file_name().unwrap().to_str().unwrap(),
                    s.reason.as_str(),
                )
            })
            .collect();
        assert_eq!(
            skipped,
            [
                ("d-plain", "not a mount point"),
                (
                    "e-file",
                    "not a directory (Filesystem entries are mount points)"
                ),
                (
                    "f-link",
                    "not a directory (Filesystem entries are mount points)"
                ),
            ]
        );
        // The handle leads back to the entry; a handle of a plain dir does not.
        let b = &r.found[1];
        assert_eq!(find(&cfg, &b.handle).unwrap().as_ref(), Some(b));
        let plain = StaticHandle::new(&cfg.classes[0], "d-plain".as_ref());
        assert_eq!(find(&cfg, &plain).unwrap(), None);
        // Scans are deterministic.
        assert_eq!(scan_all(&cfg).unwrap().found, r.found);
    }

    #[test]
    fn missing_host_dir_is_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = cfg(class(
            &tmp.path().join("nope"),
            VolumeMode::Filesystem,
            CleanupMethod::DeleteContents,
        ));
        let r = scan_all(&cfg).unwrap();
        assert!(r.found.is_empty());
        assert_eq!(r.skipped[0].reason, "hostDir does not exist");
    }

    #[test]
    fn block_mode_finds_devices_and_symlinks_to_devices() {
        let tmp = tempfile::tempdir().unwrap();
        let disks = tmp.path().join("disks");
        fs::create_dir(&disks).unwrap();
        let l1 = Loop::new(tmp.path(), "1.img", 8 << 20);
        let l2 = Loop::new(tmp.path(), "2.img", 12 << 20);
        std::os::unix::fs::symlink(&l1.0, disks.join("disk1")).unwrap();
        // A device node made in the directory itself.
        use std::os::unix::fs::MetadataExt;
        let rdev = fs::metadata(&l2.0).unwrap().rdev();
        nix::sys::stat::mknod(
            &disks.join("disk2"),
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            rdev,
        )
        .unwrap();
        fs::write(disks.join("disk3"), b"not a device").unwrap();
        std::os::unix::fs::symlink(disks.join("disk3"), disks.join("disk4")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", disks.join("disk5")).unwrap();

        let cfg = cfg(class(&disks, VolumeMode::Block, CleanupMethod::Zero));
        let r = scan_all(&cfg).unwrap();
        let found: Vec<_> = r
            .found
            .iter()
            .map(|d| (d.name.as_str(), d.kind.clone(), d.capacity_bytes))
            .collect();
        assert_eq!(
            found,
            [
                (
                    "disk1",
                    EntryKind::Device {
                        device: l1.0.clone()
                    },
                    8 << 20
                ),
                (
                    "disk2",
                    EntryKind::Device {
                        device: fs::canonicalize(&disks).unwrap().join("disk2")
                    },
                    12 << 20
                ),
            ]
        );
        let skipped: Vec<_> = r
            .skipped
            .iter()
            .map(|s| s.path.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(skipped, ["disk3", "disk4", "disk5"]);
    }
}
