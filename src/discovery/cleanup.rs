//! Wiping a released static volume before it is offered again.
//!
//! - `delete-contents`: [`fsutil::clear_dir`] on the mount point: never follows a
//!   symlink, never crosses into another filesystem, keeps the mount point.
//! - `blkdiscard`, `zero` (`dd` from `/dev/zero`), `shred`: on the device, run
//!   by `blockdev/raw.rs`.
//! - `command`: the configured program with the path as its last argument
//!   (no shell).
//!
//! Cleanup is refused while the volume is in use: a Filesystem entry that is no
//! longer a mount point (clearing it would clear the parent filesystem), that is
//! mounted anywhere besides its discovery path, or has a mount inside; a device
//! with a mounted filesystem, a bind mount, or another exclusive opener.
//!
//! A marker `<stateDir>/cleanup/<handle>.json` is written (atomically) before the
//! wipe starts and removed after it succeeded, so a cleanup interrupted by a
//! crash is found at start ([`Cleaner::pending`]) and redone, and discovery
//! never offers a half-wiped volume.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::scan::{self, Discovered, EntryKind};
use super::StaticError;
use super::{CleanupMethod, DiscoveryConfig, StaticHandle};
use crate::command::Cmd;
use crate::error::{blocking, IoContext, IoError};

type Result<T, E = StaticError> = std::result::Result<T, E>;
use crate::fsutil;
use crate::mount::MountTable;

/// Longest a wipe may run.
const WIPE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The record of a cleanup in progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    pub handle: String,
    pub path: PathBuf,
    pub method: CleanupMethod,
    pub started_unix: u64,
}

/// Runs cleanups and keeps their markers under `<stateDir>/cleanup`.
#[derive(Clone, Debug)]
pub struct Cleaner {
    dir: PathBuf,
}

impl Cleaner {
    /// Creates `<state_dir>/cleanup` (0700) when missing (blocking).
    pub fn new(state_dir: &Path) -> Result<Self> {
        fsutil::ensure_dir(state_dir, 0o700)?;
        let dir = state_dir.join("cleanup");
        fsutil::ensure_dir(&dir, 0o700)?;
        Ok(Cleaner { dir })
    }

    fn marker_path(&self, h: &StaticHandle) -> PathBuf {
        self.dir.join(format!("{h}.json"))
    }

    /// Whether a cleanup of this volume was started and has not finished.
    pub fn is_pending(&self, h: &StaticHandle) -> bool {
        self.marker_path(h).exists()
    }

    /// Cleanups that were started and have not finished (blocking). Files that
    /// are not markers are ignored; an unreadable marker is an error (its volume
    /// must not be offered while nobody knows whether it was wiped).
    pub fn pending(&self) -> Result<Vec<Marker>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir).ctx(|| format!("reading {:?}", self.dir))? {
            let e = e.ctx(|| format!("reading {:?}", self.dir))?;
            let name = e.file_name();
            let Some(h) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(StaticHandle::parse)
            else {
                continue;
            };
            let text = std::fs::read(e.path()).ctx(|| format!("reading {:?}", e.path()))?;
            let m: Marker =
                serde_json::from_slice(&text).map_err(|err| StaticError::BadMarker {
                    path: e.path(),
                    why: err.to_string(),
                })?;
            if m.handle != h.to_string() {
                return Err(StaticError::BadMarker {
                    path: e.path(),
                    why: format!("it names {}", m.handle),
                });
            }
            out.push(m);
        }
        out.sort_by(|a, b| a.handle.cmp(&b.handle));
        Ok(out)
    }

    /// Wipes a discovered volume. Refused (FAILED_PRECONDITION) while it is in
    /// use; the marker stays on failure so the volume is not offered again
    /// until a cleanup succeeds. Idempotent: cleaning a clean volume is fine.
    pub async fn cleanup(&self, cfg: &DiscoveryConfig, vol: &Discovered) -> Result<()> {
        let class = cfg
            .classes
            .get(vol.class)
            .ok_or_else(|| StaticError::Config(format!("no discovery class {}", vol.class)))?
            .clone();
        let method = class.cleanup.method;
        let v = vol.clone();
        blocking(move || check_not_in_use(&v, &MountTable::read()?)).await?;
        let marker = Marker {
            handle: vol.handle.to_string(),
            path: vol.source_path().to_path_buf(),
            method,
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        let json = serde_json::to_vec_pretty(&marker)?;
        let mpath = self.marker_path(&vol.handle);
        blocking(move || Ok::<_, StaticError>(fsutil::write_atomic(&mpath, &json)?)).await?;
        tracing::info!(handle = %vol.handle, path = ?vol.path, ?method, "cleanup started");
        run_method(method, class.cleanup.command.as_deref(), vol).await?;
        let mpath = self.marker_path(&vol.handle);
        blocking(move || Ok::<_, StaticError>(fsutil::remove_file_durable(&mpath)?)).await?;
        tracing::info!(handle = %vol.handle, path = ?vol.path, "cleanup finished");
        Ok(())
    }

    /// Redoes every pending cleanup whose entry is still there. Returns the
    /// handles with their outcome; a marker whose entry vanished is kept (the
    /// entry may come back) and reported as NOT_FOUND. The caller decides, per
    /// handle, whether redoing is allowed (never for a Bound PV): `allow`.
    pub async fn redo_pending(
        &self,
        cfg: &DiscoveryConfig,
        allow: impl Fn(&StaticHandle) -> bool,
    ) -> Result<Vec<(StaticHandle, Result<()>)>> {
        let me = self.clone();
        let markers = blocking(move || me.pending()).await?;
        let mut out = Vec::new();
        for m in markers {
            let Some(h) = StaticHandle::parse(&m.handle) else {
                continue;
            };
            if !allow(&h) {
                continue;
            }
            let c = cfg.clone();
            let h2 = h.clone();
            let res = match blocking(move || scan::find(&c, &h2)).await {
                Ok(Some(vol)) => self.cleanup(cfg, &vol).await,
                Ok(None) => Err(StaticError::Vanished(h.to_string())),
                Err(e) => Err(e),
            };
            out.push((h, res));
        }
        Ok(out)
    }
}

/// Refuses (FAILED_PRECONDITION) when the volume is in use (blocking).
pub fn check_not_in_use(vol: &Discovered, table: &MountTable) -> Result<()> {
    let busy = |why: String| {
        Err(StaticError::InUse {
            handle: vol.handle.to_string(),
            why,
        })
    };
    match &vol.kind {
        EntryKind::Mount { .. } => {
            let Some(m) = table.at(&vol.path) else {
                return busy(format!(
                    "{:?} is no longer a mount point; not cleaning it",
                    vol.path
                ));
            };
            let loc = m.location();
            if let Some(other) = table.mounts_of(&loc).find(|o| o.mount_point != vol.path) {
                return busy(format!(
                    "{:?} is also mounted at {:?}; not cleaning it",
                    vol.path, other.mount_point
                ));
            }
            if let Some(inner) = table
                .mounts_below(&vol.path)
                .find(|o| o.mount_point != vol.path)
            {
                return busy(format!(
                    "{:?} has a mount inside at {:?}; not cleaning it",
                    vol.path, inner.mount_point
                ));
            }
        }
        EntryKind::Device { device } => {
            use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
            let md = std::fs::metadata(device).ctx(|| format!("inspecting {device:?}"))?;
            if !md.file_type().is_block_device() {
                return busy(format!("{device:?} is not a block device"));
            }
            let majmin = format!("{}:{}", libc::major(md.rdev()), libc::minor(md.rdev()));
            let fs_loc = crate::mount::Location {
                dev: majmin,
                root: PathBuf::from("/"),
            };
            if let Some(m) = table.mounts_of(&fs_loc).next() {
                return busy(format!(
                    "{device:?} holds a filesystem mounted at {:?}",
                    m.mount_point
                ));
            }
            if let Some(loc) = table.locate(device) {
                if let Some(m) = table.mounts_of(&loc).find(|o| o.mount_point != *device) {
                    return busy(format!("{device:?} is bind-mounted at {:?}", m.mount_point));
                }
            }
            // The kernel's own answer: exclusive open fails while a filesystem,
            // device-mapper or another exclusive user holds the device.
            match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_EXCL)
                .open(device)
            {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    return busy(format!("{device:?} is in use (busy)"));
                }
                Err(e) => return Err(IoError::new(format!("opening {device:?}"), e).into()),
            }
        }
    }
    Ok(())
}

async fn run_method(
    method: CleanupMethod,
    command: Option<&[String]>,
    vol: &Discovered,
) -> Result<()> {
    let target = vol.source_path().to_path_buf();
    match (method, &vol.kind) {
        (CleanupMethod::DeleteContents, EntryKind::Mount { .. }) => {
            blocking(move || Ok(fsutil::clear_dir(&target)?)).await
        }
        (CleanupMethod::Blkdiscard, EntryKind::Device { .. }) => {
            crate::blockdev::raw::discard(&target, WIPE_TIMEOUT).await?;
            Ok(())
        }
        (CleanupMethod::Zero, EntryKind::Device { .. }) => {
            let size = vol.capacity_bytes;
            crate::blockdev::raw::zero(&target, size, WIPE_TIMEOUT).await?;
            Ok(())
        }
        (CleanupMethod::Shred, EntryKind::Device { .. }) => {
            crate::blockdev::raw::shred(&target, WIPE_TIMEOUT).await?;
            Ok(())
        }
        (CleanupMethod::Command, _) => {
            let Some([prog, args @ ..]) = command else {
                return Err(StaticError::Config(
                    "cleanup command is not configured".into(),
                ));
            };
            Cmd::new(prog)
                .args(args)
                .arg(target.as_os_str())
                .timeout(WIPE_TIMEOUT)
                .run()
                .await?;
            Ok(())
        }
        (m, k) => Err(StaticError::Config(format!(
            "cleanup {m:?} does not apply to {k:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::scan::tests::{class, run, Loop, TestMount};
    use crate::discovery::{scan, VolumeMode};
    use std::fs;
    use std::os::unix::fs::symlink;

    struct Env {
        tmp: tempfile::TempDir,
        disks: PathBuf,
        cleaner: Cleaner,
    }

    fn env() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let disks = tmp.path().join("disks");
        fs::create_dir(&disks).unwrap();
        let cleaner = Cleaner::new(&tmp.path().join("state")).unwrap();
        Env {
            tmp,
            disks,
            cleaner,
        }
    }

    /// A config with one class and a state dir that is never used here.
    fn one_class(c: crate::discovery::DiscoveryClass) -> DiscoveryConfig {
        DiscoveryConfig {
            classes: vec![c],
            state_dir: "/nonexistent".into(),
        }
    }

    fn only(cfg: &DiscoveryConfig) -> Discovered {
        let r = scan::scan_all(cfg).unwrap();
        assert_eq!(r.found.len(), 1, "{r:?}");
        r.found.into_iter().next().unwrap()
    }

    fn fill(dir: &Path, outside: &Path) {
        fs::create_dir_all(dir.join("a/b/c")).unwrap();
        fs::write(dir.join("a/b/c/f"), b"data").unwrap();
        fs::write(dir.join(".hidden"), b"data").unwrap();
        symlink(outside, dir.join("trap-dir")).unwrap();
        symlink(outside.join("precious"), dir.join("a/trap-file")).unwrap();
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn delete_contents_keeps_mount_point_and_does_not_follow_symlinks() {
        for fs_type in ["tmpfs", "ext4", "xfs"] {
            let e = env();
            let outside = e.tmp.path().join("outside");
            fs::create_dir(&outside).unwrap();
            fs::write(outside.join("precious"), b"keep").unwrap();
            let vol = e.disks.join("vol");
            let (_loop, _m) = match fs_type {
                "tmpfs" => (None, TestMount::tmpfs(&vol, "8m")),
                f => {
                    let l = Loop::new(e.tmp.path(), "img", 320 << 20).mkfs(f);
                    let m = TestMount::device(&l.0, &vol, f);
                    (Some(l), m)
                }
            };
            fill(&vol, &outside);
            let cfg = one_class(class(
                &e.disks,
                VolumeMode::Filesystem,
                CleanupMethod::DeleteContents,
            ));
            let d = only(&cfg);
            e.cleaner.cleanup(&cfg, &d).await.unwrap();
            assert_eq!(entries(&vol), Vec::<String>::new(), "{fs_type}");
            assert!(
                MountTable::read().unwrap().at(&d.path).is_some(),
                "{fs_type}"
            );
            assert_eq!(fs::read(outside.join("precious")).unwrap(), b"keep");
            assert!(!e.cleaner.is_pending(&d.handle));
            assert!(e.cleaner.pending().unwrap().is_empty());
            // Again: nothing to do, still fine.
            e.cleaner.cleanup(&cfg, &d).await.unwrap();
        }
    }

    #[tokio::test]
    async fn refuses_while_in_use() {
        let e = env();
        let vol = e.disks.join("vol");
        let _m = TestMount::tmpfs(&vol, "8m");
        fs::create_dir(vol.join("sub")).unwrap();
        fs::write(vol.join("keep"), b"x").unwrap();
        let cfg = one_class(class(
            &e.disks,
            VolumeMode::Filesystem,
            CleanupMethod::DeleteContents,
        ));
        let d = only(&cfg);

        // A mount inside the volume: not crossed, nothing removed.
        let other = e.tmp.path().join("other");
        let _o = TestMount::tmpfs(&other, "1m");
        fs::write(other.join("inner"), b"keep").unwrap();
        let inner = TestMount::bind(&other, &vol.join("sub"));
        let err = e.cleaner.cleanup(&cfg, &d).await.unwrap_err();
        assert!(err.to_string().contains("mount inside"), "{err}");
        assert!(matches!(err, StaticError::InUse { .. }));
        assert_eq!(entries(&vol), ["keep", "sub"]);
        assert_eq!(fs::read(other.join("inner")).unwrap(), b"keep");
        drop(inner);
        // Refused before any marker was written: a Bound volume never gets one.
        assert!(!e.cleaner.is_pending(&d.handle));

        // Mounted elsewhere too (e.g. published to a pod).
        let pod = e.tmp.path().join("pod");
        fs::create_dir(&pod).unwrap();
        let published = TestMount::bind(&vol, &pod);
        let err = e.cleaner.cleanup(&cfg, &d).await.unwrap_err();
        assert!(err.to_string().contains("also mounted at"), "{err}");
        assert_eq!(entries(&vol), ["keep", "sub"]);
        drop(published);

        // No longer a mount point: clearing would clear the parent filesystem.
        drop(_m);
        let err = e.cleaner.cleanup(&cfg, &d).await.unwrap_err();
        assert!(err.to_string().contains("no longer a mount point"), "{err}");
    }

    fn read_dev(dev: &Path, n: usize) -> Vec<u8> {
        use std::io::Read;
        let mut buf = vec![0; n];
        fs::File::open(dev).unwrap().read_exact(&mut buf).unwrap();
        buf
    }

    fn scribble(dev: &Path) {
        use std::io::Write;
        let mut f = fs::OpenOptions::new().write(true).open(dev).unwrap();
        f.write_all(&[0xab; 1 << 20]).unwrap();
        f.sync_all().unwrap();
    }

    #[tokio::test]
    async fn block_methods_wipe_the_device() {
        for method in [
            CleanupMethod::Zero,
            CleanupMethod::Blkdiscard,
            CleanupMethod::Shred,
        ] {
            let e = env();
            let l = Loop::new(e.tmp.path(), "img", 4 << 20);
            symlink(&l.0, e.disks.join("disk")).unwrap();
            scribble(&l.0);
            assert_eq!(read_dev(&l.0, 16), [0xab; 16]);
            let cfg = one_class(class(&e.disks, VolumeMode::Block, method));
            let d = only(&cfg);
            e.cleaner.cleanup(&cfg, &d).await.unwrap();
            assert!(
                read_dev(&l.0, 4 << 20).iter().all(|&b| b == 0),
                "{method:?} left data"
            );
            assert!(!e.cleaner.is_pending(&d.handle));
        }
    }

    #[tokio::test]
    async fn block_cleanup_refused_while_mounted() {
        let e = env();
        let l = Loop::new(e.tmp.path(), "img", 64 << 20).mkfs("ext4");
        symlink(&l.0, e.disks.join("disk")).unwrap();
        let cfg = one_class(class(&e.disks, VolumeMode::Block, CleanupMethod::Zero));
        let d = only(&cfg);
        let m = TestMount::device(&l.0, &e.tmp.path().join("mnt"), "ext4");
        let err = e.cleaner.cleanup(&cfg, &d).await.unwrap_err();
        assert!(err.to_string().contains("mounted at"), "{err}");
        drop(m);
        // Raw-block publish: the device node bound onto a file.
        let target = e.tmp.path().join("target");
        fs::write(&target, b"").unwrap();
        let b = TestMount::bind(&l.0, &target);
        let err = e.cleaner.cleanup(&cfg, &d).await.unwrap_err();
        assert!(err.to_string().contains("bind-mounted at"), "{err}");
        drop(b);
        // The filesystem signature is still there: nothing was wiped.
        assert!(run("blkid", &["-p", l.0.to_str().unwrap()]).contains("ext4"));
        e.cleaner.cleanup(&cfg, &d).await.unwrap();
    }

    #[tokio::test]
    async fn command_gets_the_path_last_and_an_interrupted_cleanup_is_redone() {
        let e = env();
        let vol = e.disks.join("vol");
        let _m = TestMount::tmpfs(&vol, "8m");
        let mut c = class(&e.disks, VolumeMode::Filesystem, CleanupMethod::Command);
        c.cleanup.command = Some(vec!["false".into()]);
        let failing = one_class(c.clone());
        let d = only(&failing);
        // A failing wipe leaves the marker: the volume stays "dirty".
        e.cleaner.cleanup(&failing, &d).await.unwrap_err();
        assert!(e.cleaner.is_pending(&d.handle));
        let pending = e.cleaner.pending().unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].handle, d.handle.to_string());
        assert_eq!(pending[0].path, d.path);

        // After a "restart" with a working command, the pending cleanup is
        // redone, with the path as the last argument and no shell involved.
        c.cleanup.command = Some(vec![
            "cp".into(),
            "--".into(),
            "/proc/self/mountinfo".into(),
        ]);
        let working = one_class(c);
        let cleaner = Cleaner::new(&e.tmp.path().join("state")).unwrap();
        // Not allowed (e.g. the PV is Bound): not touched.
        let done = cleaner.redo_pending(&working, |_| false).await.unwrap();
        assert!(done.is_empty());
        assert!(cleaner.is_pending(&d.handle));
        let done = cleaner.redo_pending(&working, |_| true).await.unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].0, d.handle);
        done[0].1.as_ref().unwrap();
        assert_eq!(entries(&vol), ["mountinfo"]);
        assert!(cleaner.pending().unwrap().is_empty());
    }
}
