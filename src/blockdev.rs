//! Block devices on the node: what is on them, making and growing filesystems.
//!
//! The rule that protects data: a device gets a new filesystem only when
//! low-level probing (`blkid -p`) finds no signature at all on it — no
//! filesystem, no partition table, no RAID or LVM label — or when it is a
//! volume the driver made and never finished formatting, which holds no data
//! (`format_whole`). External programs run through [`crate::command::Cmd`].

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::command::{Cmd, CommandError};
use crate::error::{IoContext, IoError};

mod format;
pub(crate) mod raw;

pub use format::{FormatError, FormatOptions, FORMAT_PREFIX};

/// A filesystem name the driver does not make.
#[derive(Debug, thiserror::Error)]
#[error("filesystem {0:?} is not supported (ext4 or xfs)")]
pub struct UnknownFs(pub String);

/// Filesystems the driver creates and grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsType {
    Ext4,
    Xfs,
}

impl FsType {
    pub fn parse(s: &str) -> Result<Self, UnknownFs> {
        match s {
            "ext4" => Ok(FsType::Ext4),
            "xfs" => Ok(FsType::Xfs),
            other => Err(UnknownFs(crate::ids::truncate(other))),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
        }
    }
    /// The smallest device this filesystem can be made on: mkfs.xfs refuses
    /// a data section under 300 MiB ("Filesystem must be larger than 300MB",
    /// xfsprogs >= 5.19); mkfs.ext4 makes a working filesystem on a few MiB.
    pub fn min_device_bytes(self) -> u64 {
        match self {
            FsType::Ext4 => 0,
            FsType::Xfs => 300 << 20,
        }
    }
    /// Mount options the driver always adds: XFS refuses to mount a second
    /// filesystem with the same UUID (a snapshot beside its origin) without `nouuid`.
    pub fn default_mount_data(self) -> &'static str {
        match self {
            FsType::Ext4 => "",
            FsType::Xfs => "nouuid",
        }
    }
}

/// What low-level probing found on a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Content {
    /// No signature at all: safe to format.
    Empty,
    /// A filesystem of this type (`TYPE=` from blkid).
    Filesystem(String),
    /// A LUKS volume (`TYPE=crypto_LUKS`): an encrypted volume's backing device.
    Luks,
    /// Something else: a partition table, a RAID/LVM member, ...
    Other(String),
}

/// Parses `blkid -p -o export` output.
pub(crate) fn parse_blkid_export(out: &str) -> Content {
    let get = |key: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
            .map(str::to_owned)
    };
    let usage = get("USAGE");
    match (get("TYPE"), get("PTTYPE")) {
        (Some(t), _) if t == "crypto_LUKS" => Content::Luks,
        (Some(t), _) if usage.as_deref().is_none_or(|u| u == "filesystem") => {
            Content::Filesystem(t)
        }
        (Some(t), _) => Content::Other(format!("{t} ({})", usage.unwrap_or_default())),
        (None, Some(pt)) => Content::Other(format!("partition table {pt}")),
        (None, None) => Content::Other(out.trim().replace('\n', " ")),
    }
}

/// Probes a device's content. blkid exits 2 when it finds nothing.
pub(crate) async fn probe(dev: &Path) -> Result<Content, CommandError> {
    Ok(probe_labelled(dev).await?.0)
}

/// Like [`probe`], with the filesystem's label (`LABEL=`), if it has one.
pub(crate) async fn probe_labelled(dev: &Path) -> Result<(Content, Option<String>), CommandError> {
    let res = Cmd::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(dev)
        .run()
        .await;
    match res {
        Ok(out) => Ok((parse_blkid_export(&out.stdout), blkid_label(&out.stdout))),
        Err(CommandError::Failed { code: Some(2), .. }) => Ok((Content::Empty, None)),
        Err(e) => Err(e),
    }
}

/// `LABEL=` of `blkid -p -o export` output.
pub(crate) fn blkid_label(out: &str) -> Option<String> {
    out.lines()
        .find_map(|l| l.strip_prefix("LABEL="))
        .map(str::to_owned)
}

/// The label of the XFS filesystem the driver makes on a dir pool's disk
/// (`device:`): what tells it, at the next start, that the filesystem there
/// is its own and may be mounted.
/// (XFS labels hold at most 12 bytes.)
pub(crate) const POOL_FS_LABEL: &str = "localvol-dir";

/// `mkfs.xfs` of a dir pool's blank disk, labelled [`POOL_FS_LABEL`]. The
/// caller probed the disk blank first; mkfs.xfs itself refuses a device
/// with a signature (no `-f`).
pub(crate) fn mkfs_pool_command(dev: &Path) -> Cmd {
    Cmd::new("mkfs.xfs")
        .args(["-q", "-L", POOL_FS_LABEL])
        .arg(dev)
        .timeout(std::time::Duration::from_secs(600))
}

/// Creates a filesystem of type `fs` (with the class's `opts`) on `dev`
/// if, and only if, probing finds the device blank; otherwise returns what
/// is there, untouched. Existing data is never overwritten, and the one
/// probe serves both the decision and the caller's view of the content.
pub(crate) async fn format_if_blank(
    dev: &Path,
    fs: FsType,
    opts: &FormatOptions,
) -> Result<Content, CommandError> {
    match probe(dev).await? {
        Content::Empty => {
            mkfs_command(dev, fs, opts).await?.run().await?;
            Ok(Content::Empty)
        }
        other => Ok(other),
    }
}

/// Creates a filesystem of type `fs` on `dev`, which the caller knows holds
/// no data: at most what a cut-short format of its own left (an `mkfs`
/// killed mid-run writes a superblock that probes as a filesystem but does
/// not mount, or mounts half-made). Signatures found are erased first, so
/// nothing of the old attempt can be probed afterwards. Returns what was
/// found before.
pub(crate) async fn format_whole(
    dev: &Path,
    fs: FsType,
    opts: &FormatOptions,
) -> Result<Content, CommandError> {
    // Nearly always the device is as lvcreate (or the wiper) left it:
    // zeroes where any signature of a format of the driver's would be.
    // Then mkfs runs without a blkid first. Should mkfs still refuse (it
    // exits with an error of its own), the probe, the erase and mkfs
    // follow; an mkfs killed or timed out is the RPC's error, as before.
    let d = dev.to_path_buf();
    match crate::error::blocking(move || starts_with_zeroes(&d)).await {
        Ok(true) => match mkfs_command(dev, fs, opts).await?.run().await {
            Ok(_) => return Ok(Content::Empty),
            Err(e @ CommandError::Failed { code: Some(_), .. }) => {
                tracing::debug!(device = ?dev, error = %e, "mkfs of a device that starts blank refused; probing it")
            }
            Err(e) => return Err(e),
        },
        Ok(false) => {}
        Err(e) => {
            tracing::debug!(device = ?dev, error = %e, "reading the device's start failed; probing it")
        }
    }
    let found = probe(dev).await?;
    if found != Content::Empty {
        raw::erase_signatures(dev).await?;
    }
    mkfs_command(dev, fs, opts).await?.run().await?;
    Ok(found)
}

/// How much of a device's start [`format_whole`] reads: the primary
/// superblocks of ext4 (at 1 KiB) and XFS (at 0), the signatures a
/// cut-short mkfs of the driver's leaves, lie within it.
const FORMAT_PROBE_BYTES: u64 = 64 << 10;

/// Whether the first [`FORMAT_PROBE_BYTES`] of `dev` (all of it, if it is
/// smaller) read as zeroes. Blocking.
fn starts_with_zeroes(dev: &Path) -> Result<bool, IoError> {
    use std::io::Read;
    let f = File::open(dev).ctx(|| format!("opening {dev:?}"))?;
    let mut start = Vec::with_capacity(FORMAT_PROBE_BYTES as usize);
    f.take(FORMAT_PROBE_BYTES)
        .read_to_end(&mut start)
        .ctx(|| format!("reading the start of {dev:?}"))?;
    Ok(start.iter().all(|&b| b == 0))
}

/// Whether the installed mkfs.xfs knows `-i nrext64` (xfsprogs 5.19+):
/// asked once (`mkfs.xfs -V`), then remembered. An answer it cannot read
/// counts as not knowing it (the option is then not passed by default).
async fn xfs_knows_nrext64() -> Result<bool, CommandError> {
    static KNOWS: tokio::sync::OnceCell<bool> = tokio::sync::OnceCell::const_new();
    KNOWS
        .get_or_try_init(|| async {
            let out = Cmd::new("mkfs.xfs").arg("-V").run().await?;
            let knows = format::version_knows_nrext64(&out.stdout);
            if knows.is_none() {
                tracing::warn!(version = %out.stdout.trim(), "cannot read mkfs.xfs's version; not passing -i nrext64=0 by default");
            }
            Ok(knows.unwrap_or(false))
        })
        .await
        .copied()
}

/// The mkfs invocation [`format_if_blank`] runs, without the probe: the
/// driver's fixed options, then the class's (`opts`, and XFS's defaults:
/// [`FormatOptions::mkfs_args`]). Public for `localvol bench --floor-lvm`
/// (the `cli/` crate), which times exactly this, so the floor formats like
/// the driver.
pub async fn mkfs_command(
    dev: &Path,
    fs: FsType,
    opts: &FormatOptions,
) -> Result<Cmd, CommandError> {
    let cmd = match fs {
        // No root-reserved blocks: the whole volume belongs to its pod.
        FsType::Ext4 => Cmd::new("mkfs.ext4")
            .args(["-q", "-m", "0"])
            .args(opts.mkfs_args(fs, false)),
        // mkfs.xfs itself refuses devices with a signature (no -f).
        FsType::Xfs => Cmd::new("mkfs.xfs")
            .arg("-q")
            .args(opts.mkfs_args(fs, xfs_knows_nrext64().await?)),
    };
    Ok(cmd.arg(dev).timeout(std::time::Duration::from_secs(600)))
}

/// Grows a mounted filesystem to fill its (already larger) device.
pub(crate) async fn grow_fs(
    dev: &Path,
    mount_point: &Path,
    fs: FsType,
) -> Result<(), CommandError> {
    let cmd = match fs {
        FsType::Ext4 => Cmd::new("resize2fs").arg(dev),
        FsType::Xfs => Cmd::new("xfs_growfs").arg(mount_point),
    };
    cmd.timeout(std::time::Duration::from_secs(600))
        .run()
        .await?;
    Ok(())
}

nix::ioctl_read!(blkgetsize64, 0x12, 114, u64);

/// Size of a block device in bytes (blocking).
pub(crate) fn device_size(dev: &Path) -> Result<u64, IoError> {
    let f = File::open(dev).ctx(|| format!("opening {dev:?}"))?;
    let mut size = 0u64;
    // SAFETY: BLKGETSIZE64 writes one u64 to the pointer.
    unsafe { blkgetsize64(f.as_raw_fd(), &mut size) }.ctx(|| format!("BLKGETSIZE64 {dev:?}"))?;
    Ok(size)
}

nix::ioctl_write_ptr_bad!(blkzeroout, nix::request_code_none!(0x12, 127), [u64; 2]);

/// A block device opened for writing with `O_EXCL`: the kernel refuses it
/// while a filesystem on it is mounted or another exclusive holder (a device
/// mapper target, another `O_EXCL` opener) has it, and nobody can mount or
/// claim it while this is held. [`ExclusiveDevice::zero`] makes ranges of it
/// read as zeroes. Blocking: use it inside [`crate::error::blocking`].
pub(crate) struct ExclusiveDevice {
    file: File,
    path: std::path::PathBuf,
    size: u64,
    /// Cleared when the device turned out to have no deallocating
    /// write-zeroes: every later range goes straight to `BLKZEROOUT`.
    deallocate: bool,
}

impl ExclusiveDevice {
    /// Opens `dev`; EBUSY (mounted or claimed) comes back as an `IoError` of
    /// kind `ResourceBusy`.
    pub fn open(dev: &Path) -> Result<Self, IoError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_EXCL | libc::O_CLOEXEC)
            .open(dev)
            .ctx(|| format!("opening {dev:?} exclusively"))?;
        let mut size = 0u64;
        // SAFETY: BLKGETSIZE64 writes one u64 to the pointer.
        unsafe { blkgetsize64(file.as_raw_fd(), &mut size) }
            .ctx(|| format!("BLKGETSIZE64 {dev:?}"))?;
        Ok(Self {
            file,
            path: dev.to_owned(),
            size,
            deallocate: true,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Makes `len` bytes from `offset` read as zeroes. First
    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)`, which on a block device is the
    /// kernel's write-zeroes that may deallocate (NVMe Write Zeroes with
    /// DEAC, SCSI WRITE SAME with UNMAP, a hole in a loop device's file):
    /// zeroes are guaranteed, and it never falls back to writing them. Where
    /// the device has no such command (EOPNOTSUPP), `BLKZEROOUT`, which uses
    /// a non-deallocating write-zeroes or writes zero pages itself. A plain
    /// discard is never used: most devices do not promise zeroes after one.
    pub fn zero(&mut self, offset: u64, len: u64) -> Result<(), IoError> {
        let end = offset.saturating_add(len).min(self.size);
        if end <= offset {
            return Ok(());
        }
        let len = end - offset;
        if self.deallocate {
            let punched = nix::fcntl::fallocate(
                &self.file,
                nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                    | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            );
            match punched {
                Ok(()) => return Ok(()),
                Err(nix::errno::Errno::EOPNOTSUPP) => self.deallocate = false,
                Err(e) => {
                    return Err(e)
                        .ctx(|| format!("zeroing {len} bytes at {offset} of {:?}", self.path))
                }
            }
        }
        let range = [offset, len];
        // SAFETY: BLKZEROOUT reads two u64 (start, length) from the pointer.
        unsafe { blkzeroout(self.file.as_raw_fd(), &range) }
            .ctx(|| format!("BLKZEROOUT {len} bytes at {offset} of {:?}", self.path))?;
        Ok(())
    }

    /// Flushes the device's write cache.
    pub fn sync(&self) -> Result<(), IoError> {
        self.file
            .sync_all()
            .ctx(|| format!("flushing {:?}", self.path))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::process::Command;

    /// The command the driver runs for an XFS volume of a class without
    /// options, with this machine's mkfs.xfs: `-i nrext64=0` exactly when
    /// its version knows the option.
    #[tokio::test]
    async fn default_xfs_command_keeps_nrext64_off_where_mkfs_knows_it() {
        let Ok(out) = Command::new("mkfs.xfs").arg("-V").output() else {
            eprintln!("SKIPPED: no mkfs.xfs on this machine");
            return;
        };
        let knows = format::version_knows_nrext64(&String::from_utf8_lossy(&out.stdout))
            .expect("mkfs.xfs -V gives a version");
        let cmd = mkfs_command(
            Path::new("/dev/null"),
            FsType::Xfs,
            &FormatOptions::default(),
        )
        .await
        .unwrap();
        let argv: Vec<_> = cmd
            .argv()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let want: Vec<&str> = match knows {
            true => vec!["-q", "-i", "nrext64=0", "/dev/null"],
            false => vec!["-q", "/dev/null"],
        };
        assert_eq!(argv, want);
    }

    /// `format_whole` skips blkid on a device whose first
    /// [`FORMAT_PROBE_BYTES`] read as zeroes: the signatures mkfs.ext4 and
    /// mkfs.xfs write must lie within them (checked with this machine's
    /// tools, on files; skipped without them). (LUKS2 is formatted on the LV
    /// by `crypt`, not here; running cryptsetup would also leave a
    /// /dev/mapper/control node on a host without device-mapper.)
    #[test]
    fn signatures_of_the_formats_made_lie_in_the_probed_start() {
        let dir = tempfile::tempdir().unwrap();
        let blank = |name: &str, len: u64| {
            let path = dir.path().join(name);
            File::create(&path).unwrap().set_len(len).unwrap();
            path
        };
        let fresh = blank("fresh", 400 << 20);
        assert!(starts_with_zeroes(&fresh).unwrap());
        // Only the start counts: a byte past it is left to blkid's absence.
        let late = blank("late", 1 << 20);
        std::fs::write(
            &late,
            [&vec![0u8; FORMAT_PROBE_BYTES as usize][..], b"x"].concat(),
        )
        .unwrap();
        assert!(starts_with_zeroes(&late).unwrap());
        let short = blank("short", 512);
        assert!(starts_with_zeroes(&short).unwrap());
        let made: [(&str, &[&str], u64); 2] = [
            ("mkfs.ext4", &["-q", "-F", "-m", "0"], 16 << 20),
            ("mkfs.xfs", &["-q"], 400 << 20),
        ];
        for (program, args, len) in made {
            let dev = blank(program, len);
            match Command::new(program).args(args).arg(&dev).output() {
                Err(e) => eprintln!("SKIPPED {program}: cannot run it: {e}"),
                Ok(out) if !out.status.success() => eprintln!(
                    "SKIPPED {program}: it failed here: {}",
                    String::from_utf8_lossy(&out.stderr)
                ),
                Ok(_) => assert!(
                    !starts_with_zeroes(&dev).unwrap(),
                    "{program} wrote nothing in the first {FORMAT_PROBE_BYTES} bytes"
                ),
            }
        }
    }

    #[test]
    fn parses_blkid_output() {
        assert_eq!(
            parse_blkid_export(
                "DEVNAME=/dev/loop0\nUUID=1\nBLOCK_SIZE=4096\nTYPE=ext4\nUSAGE=filesystem\n"
            ),
            Content::Filesystem("ext4".into())
        );
        assert_eq!(
            parse_blkid_export(
                "DEVNAME=/dev/loop0\nUUID=x\nVERSION=LVM2 001\nTYPE=LVM2_member\nUSAGE=raid\n"
            ),
            Content::Other("LVM2_member (raid)".into())
        );
        assert_eq!(
            parse_blkid_export(
                "DEVNAME=/dev/loop1\nVERSION=2\nUUID=6dc9\nTYPE=crypto_LUKS\nUSAGE=crypto\n"
            ),
            Content::Luks
        );
        assert_eq!(
            parse_blkid_export("DEVNAME=/dev/loop0\nPTUUID=a\nPTTYPE=gpt\n"),
            Content::Other("partition table gpt".into())
        );
        assert_eq!(
            blkid_label("DEVNAME=/dev/loop0\nLABEL=localvol-dir\nUUID=1\nTYPE=xfs\n").as_deref(),
            Some("localvol-dir")
        );
        assert_eq!(blkid_label("DEVNAME=/dev/loop0\nTYPE=xfs\n"), None);
    }

    /// A loop device over a sparse file, detached on drop (needs root).
    pub(crate) struct Loop {
        pub(crate) dev: std::path::PathBuf,
        _dir: tempfile::TempDir,
    }
    impl Loop {
        pub(crate) fn new(size: u64) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let img = dir.path().join("img");
            File::create(&img).unwrap().set_len(size).unwrap();
            let out = Command::new("losetup")
                .args(["--find", "--show"])
                .arg(&img)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "losetup: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Loop {
                dev: String::from_utf8(out.stdout).unwrap().trim().into(),
                _dir: dir,
            }
        }
    }
    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
        }
    }

    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = crate::mount::unmount(&self.0);
        }
    }

    fn has_cap_sys_resource() -> bool {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .unwrap()
            .trim();
        u64::from_str_radix(eff, 16).unwrap() & (1 << 24) != 0
    }

    /// Real devices: needs root and loop devices (CI has both).
    #[tokio::test]
    async fn formats_only_empty_devices_and_grows_online() {
        for fs in [FsType::Ext4, FsType::Xfs] {
            let lo = Loop::new(400 << 20);
            assert_eq!(device_size(&lo.dev).unwrap(), 400 << 20);
            assert_eq!(probe(&lo.dev).await.unwrap(), Content::Empty);
            // Blank: formatted, and the answer says it was blank.
            assert_eq!(
                format_if_blank(&lo.dev, fs, &FormatOptions::default())
                    .await
                    .unwrap(),
                Content::Empty
            );
            let formatted = Content::Filesystem(fs.as_str().into());
            assert_eq!(probe(&lo.dev).await.unwrap(), formatted);
            let uuid = || {
                let out = std::process::Command::new("blkid")
                    .args(["-p", "-s", "UUID", "-o", "value"])
                    .arg(&lo.dev)
                    .output()
                    .unwrap();
                String::from_utf8(out.stdout).unwrap()
            };
            let before = uuid();
            assert!(!before.trim().is_empty());
            // Not blank any more: never formatted again, whatever type is asked.
            for again in [FsType::Ext4, FsType::Xfs] {
                assert_eq!(
                    format_if_blank(&lo.dev, again, &FormatOptions::default())
                        .await
                        .unwrap(),
                    formatted
                );
                assert_eq!(uuid(), before, "{fs:?} was reformatted as {again:?}");
            }
            // Grow: enlarge the backing file, refresh the loop size, grow online.
            // ext4's online resize needs CAP_SYS_RESOURCE, which some sandboxes
            // drop even for root; the VM tests run it with full root.
            if fs == FsType::Ext4 && !has_cap_sys_resource() {
                crate::testing::skip("ext4 online grow", "no CAP_SYS_RESOURCE here");
                continue;
            }
            let mnt = tempfile::tempdir().unwrap();
            crate::mount::mount_device(
                &lo.dev,
                mnt.path(),
                fs.as_str(),
                sys_mount::MountFlags::empty(),
                fs.default_mount_data(),
            )
            .unwrap();
            // Unmounted even when an assertion below fails.
            let _mounted = Unmount(mnt.path().to_path_buf());
            let before = crate::fsutil::fs_stats(mnt.path()).unwrap().total_bytes;
            let img = lo._dir.path().join("img");
            File::options()
                .write(true)
                .open(&img)
                .unwrap()
                .set_len(800 << 20)
                .unwrap();
            assert!(Command::new("losetup")
                .arg("-c")
                .arg(&lo.dev)
                .status()
                .unwrap()
                .success());
            grow_fs(&lo.dev, mnt.path(), fs).await.unwrap();
            let after = crate::fsutil::fs_stats(mnt.path()).unwrap().total_bytes;
            assert!(after > before + (300 << 20), "{fs:?}: {before} -> {after}");
        }
    }
}
