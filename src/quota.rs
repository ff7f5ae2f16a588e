//! Project quotas: the way a directory volume's size is enforced.
//!
//! Each volume directory gets its own project id, set with `FS_IOC_FSSETXATTR`
//! together with the inherit flag (so everything created below it is charged to
//! the project), and a hard block limit (and optionally an inode limit) set with
//! `quotactl_fd(2)` on the pool's filesystem. Works on XFS mounted with
//! `prjquota` and ext4 with the `project` feature mounted with `prjquota`.
//!
//! No table of ids is kept here: the pool records which id each volume uses,
//! and the filesystem's own quota state is asked for usage. All calls block.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::error::{IoContext, IoError};

/// What went wrong with project quotas.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// The filesystem does not enforce project quotas (the operator-facing why).
    #[error("{0}")]
    NotEnforced(String),
    #[error(transparent)]
    Io(#[from] IoError),
}

type Result<T, E = QuotaError> = std::result::Result<T, E>;
use crate::mount::MountTable;

/// The project quota type (linux/quota.h `PRJQUOTA`).
const PRJQUOTA: libc::c_int = 2;
/// Units of `dqb_bhardlimit` (linux/quota.h `QIF_DQBLKSIZE`).
const QUOTA_BLOCK: u64 = 1024;
/// Inherit the project id in new files and directories (`FS_XFLAG_PROJINHERIT`).
const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;

/// `struct fsxattr` from linux/fs.h.
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct FsXattr {
    pub xflags: u32,
    pub extsize: u32,
    pub nextents: u32,
    pub projid: u32,
    pub cowextsize: u32,
    pub pad: [u8; 8],
}

nix::ioctl_read!(fs_ioc_fsgetxattr, b'X', 31, FsXattr);
nix::ioctl_write_ptr!(fs_ioc_fssetxattr, b'X', 32, FsXattr);

const fn qcmd(cmd: libc::c_int, kind: libc::c_int) -> libc::c_int {
    (cmd << 8) | (kind & 0xff)
}

/// `quotactl_fd(fd, cmd, id, addr)`: quota control by a descriptor of any file
/// on the filesystem (Linux 5.14+), so no block device path is needed.
fn quotactl_fd(
    fd: &File,
    cmd: libc::c_int,
    id: u32,
    addr: *mut libc::c_void,
) -> std::io::Result<()> {
    // SAFETY: the descriptor is valid for the call, and `addr` points to a
    // structure of the type the command expects (checked by each caller).
    let r = unsafe {
        libc::syscall(
            libc::SYS_quotactl_fd,
            fd.as_raw_fd(),
            qcmd(cmd, PRJQUOTA),
            id,
            addr,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Why a filesystem cannot enforce project quotas, in words an operator can act on.
pub fn unsupported_reason(path: &Path) -> Option<String> {
    let fs_type = MountTable::read()
        .ok()
        .and_then(|t| t.containing(path).map(|m| m.fs_type.clone()));
    let dir = match File::open(path) {
        Ok(f) => f,
        Err(e) => return Some(format!("cannot open {path:?}: {e}")),
    };
    let mut info = std::mem::MaybeUninit::<[u64; 8]>::zeroed();
    let checked = quotactl_fd(&dir, libc::Q_GETINFO, 0, info.as_mut_ptr().cast())
        .and_then(|()| limits_enforced(&dir));
    match checked {
        Ok(true) => None,
        // Usage is tracked but limits are not enforced: ext4 with the quota
        // feature mounted without prjquota, or XFS mounted with pqnoenforce.
        Ok(false) => Some(format!(
            "the {}filesystem holding {path:?} tracks project quotas but does not enforce them: mount it with -o prjquota",
            fs_type.map(|t| t + " ").unwrap_or_default()
        )),
        Err(e) => Some(match fs_type.as_deref() {
            Some("xfs") => format!(
                "the XFS filesystem holding {path:?} does not have project quotas on ({e}): mount it with -o prjquota"
            ),
            Some("ext4") => format!(
                "the ext4 filesystem holding {path:?} does not have project quotas on ({e}): it needs the 'project' and 'quota' features (mkfs.ext4 -O project,quota, or tune2fs -O project,quota while unmounted) and the prjquota mount option"
            ),
            Some(other) => format!("{other} (holding {path:?}) does not support project quotas ({e}); use XFS or ext4"),
            None => format!("project quotas are not available for {path:?}: {e}"),
        }),
    }
}

/// `Q_XGETQSTAT` (linux/dqblk_xfs.h `XQM_CMD(5)`): the quota state, answered by
/// XFS and by the generic quota layer (ext4) alike.
const Q_XGETQSTAT: libc::c_int = ((b'X' as libc::c_int) << 8) | 5;
/// `fs_quota_stat.qs_flags` bit: project quota limits are enforced.
const FS_QUOTA_PDQ_ENFD: u16 = 1 << 5;

/// Whether the filesystem enforces project quota limits, not only tracks usage.
fn limits_enforced(dir: &File) -> std::io::Result<bool> {
    // `struct fs_quota_stat` is 80 bytes; `qs_flags` is the u16 at offset 2.
    let mut stat = [0u8; 128];
    quotactl_fd(dir, Q_XGETQSTAT, 0, stat.as_mut_ptr().cast())?;
    let flags = u16::from_ne_bytes([stat[2], stat[3]]);
    Ok(flags & FS_QUOTA_PDQ_ENFD != 0)
}

/// Current limits and usage of one project.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProjectQuota {
    pub block_limit_bytes: u64,
    pub used_bytes: u64,
    pub inode_limit: u64,
    pub used_inodes: u64,
}

/// Quota operations on one filesystem, through a descriptor of a directory on it.
pub struct Quotas {
    dir: File,
}

impl Quotas {
    /// Opens the filesystem holding `path`; fails with the operator-facing reason
    /// when project quotas are not enforced there.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(why) = unsupported_reason(path) {
            return Err(QuotaError::NotEnforced(why));
        }
        Ok(Quotas {
            dir: File::open(path).ctx(|| format!("opening {path:?}"))?,
        })
    }

    /// Reads a project's limits and usage.
    pub fn get(&self, project: u32) -> Result<ProjectQuota> {
        let mut q = zeroed_dqblk();
        match quotactl_fd(
            &self.dir,
            libc::Q_GETQUOTA,
            project,
            (&mut q as *mut libc::dqblk).cast(),
        ) {
            Ok(()) => {}
            // XFS answers ENOENT for an id with no limits and no usage (it has
            // no dquot): a never-used or released id. ext4 reports zeros.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(ProjectQuota::default()),
            Err(e) => return Err(e).ctx(|| format!("reading quota of project {project}"))?,
        }
        Ok(ProjectQuota {
            block_limit_bytes: q.dqb_bhardlimit.saturating_mul(QUOTA_BLOCK),
            used_bytes: q.dqb_curspace,
            inode_limit: q.dqb_ihardlimit,
            used_inodes: q.dqb_curinodes,
        })
    }

    /// Sets a project's hard limits (0 = unlimited). Soft limits equal the hard
    /// ones so no grace period ever lets a volume exceed its size.
    pub fn set_limits(&self, project: u32, bytes: u64, inodes: u64) -> Result<(), IoError> {
        let blocks = bytes.div_ceil(QUOTA_BLOCK);
        let mut q = zeroed_dqblk();
        q.dqb_bhardlimit = blocks;
        q.dqb_bsoftlimit = blocks;
        q.dqb_ihardlimit = inodes;
        q.dqb_isoftlimit = inodes;
        q.dqb_valid = libc::QIF_LIMITS;
        quotactl_fd(
            &self.dir,
            libc::Q_SETQUOTA,
            project,
            (&mut q as *mut libc::dqblk).cast(),
        )
        .ctx(|| format!("setting quota of project {project}"))
    }
}

fn zeroed_dqblk() -> libc::dqblk {
    // SAFETY: dqblk is plain integers; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Reads a directory's project id and whether it has the inherit flag.
pub fn project_of(dir: &Path) -> Result<(u32, bool), IoError> {
    let f = File::open(dir).ctx(|| format!("opening {dir:?}"))?;
    let mut x = FsXattr::default();
    // SAFETY: `x` is a valid fsxattr for the kernel to fill.
    unsafe { fs_ioc_fsgetxattr(f.as_raw_fd(), &mut x) }
        .ctx(|| format!("FS_IOC_FSGETXATTR {dir:?}"))?;
    Ok((x.projid, x.xflags & FS_XFLAG_PROJINHERIT != 0))
}

/// Assigns `project` to an (empty, new) directory with the inherit flag.
pub fn set_project(dir: &Path, project: u32) -> Result<(), IoError> {
    let f = File::open(dir).ctx(|| format!("opening {dir:?}"))?;
    let mut x = FsXattr::default();
    // SAFETY: `x` is a valid fsxattr for the kernel to fill, then to read.
    unsafe { fs_ioc_fsgetxattr(f.as_raw_fd(), &mut x) }
        .ctx(|| format!("FS_IOC_FSGETXATTR {dir:?}"))?;
    x.projid = project;
    x.xflags |= FS_XFLAG_PROJINHERIT;
    unsafe { fs_ioc_fssetxattr(f.as_raw_fd(), &x) }.ctx(|| format!("FS_IOC_FSSETXATTR {dir:?}"))?;
    Ok(())
}
