//! Pools made from raw disks: an LVM pool's `devices:` and a dir pool's
//! `device:`.
//!
//! Before a pool opens, [`prepare_lvm`] / [`prepare_dir`] look at each disk
//! (resolved device node, `pvs`, sysfs holders and partitions,
//! `/proc/self/mountinfo`, an `O_EXCL` open, `blkid -p`), and a pure
//! function ([`plan_lvm`], [`plan_dir`]) decides from those facts alone
//! what to do: nothing (the VG or the mount is already there: a restart
//! changes nothing), create the VG, extend it with new blank disks, format
//! and mount, or refuse. A disk that carries any signature or that anything
//! uses is never touched: the pool is refused, with the disk and what is on
//! it in the message, and becomes a [`super::refused::RefusedPool`] while the
//! other pools serve. The node's own state is the only record: the VG and
//! its PVs (lvm), the filesystem label [`POOL_FS_LABEL`] and the mount table.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::blockdev::{self, Content, ExclusiveDevice, POOL_FS_LABEL};
use crate::config::{DirPoolConfig, LvmPoolConfig, ThinSize};
use crate::error::{blocking, IoContext, IoError};
use crate::lvm::{self, PvInfo, ThinPoolSize};
use crate::mount::{self, MountTable};

use super::{PoolError, Unusable};

fn disks_failed(e: impl std::fmt::Display) -> Unusable {
    Unusable::DisksFailed(e.to_string())
}

/// What probing found on one disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// The path does not exist.
    Missing,
    /// The path is not a block device.
    NotABlockDevice,
    /// A physical volume of this VG (empty: a PV in no VG).
    PvOf(String),
    /// Something uses it (mounted, held by a device-mapper or md device,
    /// partitioned, opened exclusively): why.
    InUse(String),
    /// What `blkid -p` found on it, and the filesystem label.
    Content(Content, Option<String>),
}

/// One listed disk and what is on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    /// As the config lists it, or as its glob matched it.
    pub path: PathBuf,
    /// The device node it resolves to (`/dev/sdb`); the path itself when
    /// it could not be resolved.
    pub dev: PathBuf,
    pub found: Found,
}

/// What to do with an LVM pool's disks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LvmPlan {
    /// The VG exists and no listed disk is new: nothing to change.
    Adopt,
    /// `vgcreate` on these blank disks.
    Create(Vec<PathBuf>),
    /// `vgextend` the existing VG with these blank disks.
    Extend(Vec<PathBuf>),
    Refuse(Unusable),
}

/// Words for what `blkid -p` found, for a refusal's message.
pub fn describe(content: &Content, label: Option<&str>) -> String {
    let label = label
        .map(|l| format!(" labelled {l:?}"))
        .unwrap_or_default();
    match content {
        Content::Empty => "is blank".into(),
        Content::Filesystem(t) => format!("holds a {t} filesystem{label}"),
        Content::Luks => "holds a LUKS encrypted volume".into(),
        Content::Other(o) if o.starts_with("LVM2_member") => {
            "is an LVM physical volume (lvm does not list it: filtered out?)".into()
        }
        Content::Other(o) => format!("holds {o}"),
    }
}

fn refuse(d: &Disk, what: String) -> Unusable {
    Unusable::DeviceRefused {
        device: d.path.clone(),
        what,
    }
}

/// Decides what an LVM pool's start does with its disks, from what was
/// found on them (`vg_exists`: `vgs` knows the pool's VG). Any listed disk
/// that is neither the VG's PV nor blank and unused refuses the whole pool;
/// a listed path that does not exist refuses it only when the VG must be
/// created (an existing VG lost a disk: lvm reports that itself). The same
/// device listed twice (by-id and by-path) counts once.
pub fn plan_lvm(vg: &str, vg_exists: bool, disks: &[Disk]) -> LvmPlan {
    let mut blank: Vec<&Disk> = Vec::new();
    for d in disks {
        match &d.found {
            Found::Missing if vg_exists => {}
            Found::Missing => return LvmPlan::Refuse(refuse(d, "does not exist".into())),
            Found::NotABlockDevice => {
                return LvmPlan::Refuse(refuse(d, "is not a block device".into()))
            }
            Found::PvOf(other) if other == vg => {}
            Found::PvOf(other) if other.is_empty() => {
                return LvmPlan::Refuse(refuse(
                    d,
                    "is an LVM physical volume in no volume group (pvremove it if it is \
                     a leftover)"
                        .into(),
                ))
            }
            Found::PvOf(other) => {
                return LvmPlan::Refuse(refuse(
                    d,
                    format!("is a physical volume of another volume group, {other}"),
                ))
            }
            Found::InUse(why) => return LvmPlan::Refuse(refuse(d, why.clone())),
            Found::Content(Content::Empty, _) => {
                if !blank.iter().any(|b| b.dev == d.dev) {
                    blank.push(d);
                }
            }
            Found::Content(c, label) => {
                return LvmPlan::Refuse(refuse(d, describe(c, label.as_deref())))
            }
        }
    }
    let blank: Vec<PathBuf> = blank.into_iter().map(|d| d.dev.clone()).collect();
    match (vg_exists, blank.is_empty()) {
        (true, true) => LvmPlan::Adopt,
        (true, false) => LvmPlan::Extend(blank),
        (false, false) => LvmPlan::Create(blank),
        (false, true) => LvmPlan::Refuse(Unusable::DisksFailed(format!(
            "volume group {vg} does not exist and no listed device was found to create it on"
        ))),
    }
}

/// What to do with a dir pool's disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirPlan {
    /// The driver's filesystem is mounted at the pool's path already.
    Ready,
    /// The driver's filesystem is there: mount it.
    Mount,
    /// Blank and unused: make the XFS, then mount it.
    FormatAndMount,
    Refuse(Unusable),
}

/// Facts about a dir pool's disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirDisk {
    pub disk: Disk,
    /// Its filesystem is mounted at the pool's path.
    pub mounted_at_path: bool,
    /// Entries already in the pool's directory (a mount would hide them).
    pub path_entries: usize,
}

/// Decides what a dir pool's start does with its `device:`: only the XFS
/// the driver made (label [`POOL_FS_LABEL`]) is mounted, only a blank,
/// unused disk is formatted, and never over a directory that holds files.
pub fn plan_dir(d: &DirDisk) -> DirPlan {
    let ours = |c: &Content, l: &Option<String>| {
        *c == Content::Filesystem("xfs".into()) && l.as_deref() == Some(POOL_FS_LABEL)
    };
    let disk = &d.disk;
    let plan = match &disk.found {
        Found::Content(c, l) if d.mounted_at_path && ours(c, l) => return DirPlan::Ready,
        Found::Content(c, l) if d.mounted_at_path => {
            return DirPlan::Refuse(refuse(
                disk,
                format!(
                    "is mounted at the pool's path but {} (not the XFS the driver makes)",
                    describe(c, l.as_deref())
                ),
            ))
        }
        Found::Missing => return DirPlan::Refuse(refuse(disk, "does not exist".into())),
        Found::NotABlockDevice => {
            return DirPlan::Refuse(refuse(disk, "is not a block device".into()))
        }
        Found::PvOf(vg) => {
            return DirPlan::Refuse(refuse(
                disk,
                format!("is an LVM physical volume (volume group {vg:?})"),
            ))
        }
        Found::InUse(why) => return DirPlan::Refuse(refuse(disk, why.clone())),
        Found::Content(Content::Empty, _) => DirPlan::FormatAndMount,
        Found::Content(c, l) if ours(c, l) => DirPlan::Mount,
        Found::Content(c, l) => return DirPlan::Refuse(refuse(disk, describe(c, l.as_deref()))),
    };
    if d.path_entries > 0 {
        return DirPlan::Refuse(Unusable::DisksFailed(format!(
            "the pool's directory holds {} entries that mounting {:?} over it would hide",
            d.path_entries, disk.path
        )));
    }
    plan
}

/// Whether a `devices:` entry is a glob (`*`, `?` or `[`).
pub fn is_glob(p: &str) -> bool {
    p.contains(['*', '?', '['])
}

/// The listed paths: literal entries as they are, globs expanded (sorted,
/// each match once). Blocking.
fn expand(patterns: &[String]) -> Result<Vec<PathBuf>, Unusable> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in patterns {
        if !is_glob(p) {
            out.push(PathBuf::from(p));
            continue;
        }
        let paths = glob::glob(p).map_err(|e| Unusable::DisksFailed(format!("{p:?}: {e}")))?;
        let mut matched: Vec<PathBuf> = paths
            .collect::<Result<_, _>>()
            .map_err(|e| Unusable::DisksFailed(format!("expanding {p:?}: {e}")))?;
        matched.sort();
        out.extend(matched);
    }
    out.dedup();
    Ok(out)
}

/// `major:minor` as mountinfo and sysfs write it.
fn dev_numbers(rdev: u64) -> String {
    format!("{}:{}", libc::major(rdev), libc::minor(rdev))
}

/// Why the device `rdev` at `dev` counts as in use, if it does (blocking):
/// a holder in sysfs (device-mapper, md, bcache), a partition, a mount of
/// it anywhere, or an exclusive opener (the kernel's EBUSY on `O_EXCL`).
fn in_use(dev: &Path, rdev: u64, table: &MountTable) -> Result<Option<String>, IoError> {
    let nums = dev_numbers(rdev);
    let sys = PathBuf::from(format!("/sys/dev/block/{nums}"));
    let names = |dir: &Path| -> Result<Vec<String>, IoError> {
        match fs::read_dir(dir) {
            Ok(rd) => Ok(rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(IoError::new(format!("reading {dir:?}"), e)),
        }
    };
    let holders = names(&sys.join("holders"))?;
    if !holders.is_empty() {
        return Ok(Some(format!("is held by {}", holders.join(", "))));
    }
    let partitions: Vec<String> = names(&sys)?
        .into_iter()
        .filter(|n| sys.join(n).join("partition").exists())
        .collect();
    if !partitions.is_empty() {
        return Ok(Some(format!("has partitions ({})", partitions.join(", "))));
    }
    let mounted: Vec<String> = table
        .entries()
        .filter(|e| e.dev == nums)
        .map(|e| e.mount_point.display().to_string())
        .collect();
    if !mounted.is_empty() {
        return Ok(Some(format!("is mounted at {}", mounted.join(", "))));
    }
    match ExclusiveDevice::open(dev) {
        Ok(_) => Ok(None),
        Err(e) if e.kind() == ErrorKind::ResourceBusy => {
            Ok(Some("is open exclusively by another program".into()))
        }
        Err(e) => Err(e),
    }
}

/// Resolves each path to its device node and device number (blocking).
fn resolve(path: &Path) -> Result<Result<(PathBuf, u64), Found>, IoError> {
    let real = match fs::canonicalize(path) {
        Ok(r) => r,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Err(Found::Missing)),
        Err(e) => return Err(IoError::new(format!("resolving {path:?}"), e)),
    };
    let md = fs::metadata(&real).ctx(|| format!("inspecting {real:?}"))?;
    if !md.file_type().is_block_device() {
        return Ok(Err(Found::NotABlockDevice));
    }
    Ok(Ok((real, md.rdev())))
}

/// What is on each of `paths` (`pvs`: lvm's PVs, matched by device number).
async fn probe_disks(paths: Vec<PathBuf>, pvs: Vec<PvInfo>) -> Result<Vec<Disk>, Unusable> {
    // Facts that need no program: the device node, whose PV it is, its use.
    let pre: Vec<(PathBuf, PathBuf, Option<Found>)> = blocking(move || {
        let pv_of: Vec<(u64, String)> = pvs
            .into_iter()
            .filter_map(|pv| match resolve(Path::new(&pv.name)) {
                Ok(Ok((_, rdev))) => Some((rdev, pv.vg)),
                _ => None,
            })
            .collect();
        let table = MountTable::read()?;
        let mut out = Vec::new();
        for path in paths {
            let (dev, rdev) = match resolve(&path)? {
                Ok(r) => r,
                Err(found) => {
                    out.push((path.clone(), path, Some(found)));
                    continue;
                }
            };
            let found = if let Some((_, vg)) = pv_of.iter().find(|(r, _)| *r == rdev) {
                Some(Found::PvOf(vg.clone()))
            } else {
                in_use(&dev, rdev, &table)?.map(Found::InUse)
            };
            out.push((path, dev, found));
        }
        Ok::<_, PoolError>(out)
    })
    .await
    .map_err(disks_failed)?;
    let mut disks = Vec::with_capacity(pre.len());
    for (path, dev, found) in pre {
        let found = match found {
            Some(f) => f,
            None => {
                let (c, label) = blockdev::probe_labelled(&dev)
                    .await
                    .map_err(|e| Unusable::DisksFailed(format!("probing {path:?}: {e}")))?;
                Found::Content(c, label)
            }
        };
        disks.push(Disk { path, dev, found });
    }
    Ok(disks)
}

/// Makes an LVM pool's VG (and thin pool) from its `devices:` when they are
/// not there yet, and adds listed disks that are new; nothing for a pool
/// without `devices`. `Err`: the pool must not start, and why.
pub async fn prepare_lvm(cfg: &LvmPoolConfig) -> Result<(), Unusable> {
    if cfg.devices.is_empty() {
        return Ok(());
    }
    let vg = cfg.volume_group.as_str();
    let patterns = cfg.devices.clone();
    let paths = blocking(move || Ok::<_, IoError>(expand(&patterns)))
        .await
        .map_err(disks_failed)??;
    let exists = lvm::vg_exists(vg).await.map_err(disks_failed)?;
    let pvs = lvm::pvs().await.map_err(disks_failed)?;
    let disks = probe_disks(paths, pvs).await?;
    for d in disks.iter().filter(|d| d.found == Found::Missing) {
        tracing::warn!(pool = %cfg.name, device = ?d.path, "listed device does not exist");
    }
    match plan_lvm(vg, exists, &disks) {
        LvmPlan::Adopt => {
            tracing::info!(pool = %cfg.name, vg, "volume group found with every listed disk in it")
        }
        LvmPlan::Create(devs) => {
            tracing::info!(pool = %cfg.name, vg, devices = ?devs, "creating the volume group on blank disks");
            lvm::vgcreate(vg, &devs).await.map_err(disks_failed)?;
        }
        LvmPlan::Extend(devs) => {
            tracing::info!(pool = %cfg.name, vg, devices = ?devs, "adding new blank disks to the volume group");
            lvm::vgextend(vg, &devs).await.map_err(disks_failed)?;
        }
        LvmPlan::Refuse(why) => return Err(why),
    }
    let Some(thin) = &cfg.thin_pool else {
        return Ok(());
    };
    let Some(size) = thin.size() else {
        return Ok(());
    };
    if lvm::lv(vg, thin.name())
        .await
        .map_err(disks_failed)?
        .is_none()
    {
        let size = match size {
            ThinSize::PercentOfVg(p) => ThinPoolSize::PercentOfVg(p),
            ThinSize::Bytes(b) => ThinPoolSize::Bytes(b),
        };
        tracing::info!(pool = %cfg.name, vg, thin = thin.name(), ?size, "creating the thin pool");
        lvm::change(lvm::thin_pool_args(vg, thin.name(), size))
            .await
            .map_err(disks_failed)?;
    }
    Ok(())
}

/// Formats a dir pool's blank `device:` (XFS, label [`POOL_FS_LABEL`]) and
/// mounts it at the pool's path with `prjquota`, or mounts the XFS the driver
/// made there before; nothing when it is mounted there already or the pool
/// names no device. `Err`: the pool must not start, and why.
/// For a dir pool that must sit on a mount point (`requireMountPoint`):
/// refuses while its path is not one, before anything is made there.
pub async fn check_mount_point(cfg: &DirPoolConfig) -> Result<(), Unusable> {
    if !cfg.requires_mount_point() {
        return Ok(());
    }
    let path = cfg.path.clone();
    let mounted = blocking(move || {
        let root = match fs::canonicalize(&path) {
            Ok(r) => r,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
            Err(e) => {
                return Err(PoolError::from(IoError::new(
                    format!("resolving {path:?}"),
                    e,
                )))
            }
        };
        Ok(MountTable::read()?.at(&root).is_some())
    })
    .await
    .map_err(disks_failed)?;
    if mounted {
        Ok(())
    } else {
        Err(Unusable::NotAMountPoint {
            path: cfg.path.clone(),
        })
    }
}

pub async fn prepare_dir(cfg: &DirPoolConfig) -> Result<(), Unusable> {
    let Some(device) = cfg.device.clone() else {
        return Ok(());
    };
    let path = cfg.path.clone();
    let dev_path = device.clone();
    // The device node, its use (None: unused, blkid tells the rest) and
    // whether its filesystem is mounted at the pool's path.
    let (dev, found, mounted_at_path, path_entries) = blocking(move || {
        fs::create_dir_all(&path).ctx(|| format!("creating {path:?}"))?;
        let root = fs::canonicalize(&path).ctx(|| format!("resolving {path:?}"))?;
        let (dev, rdev) = match resolve(&dev_path)? {
            Ok(r) => r,
            Err(found) => return Ok((dev_path, Some(found), false, 0)),
        };
        let table = MountTable::read()?;
        let at_path = table.at(&root).is_some_and(|e| e.dev == dev_numbers(rdev));
        if at_path {
            return Ok((dev, None, true, 0));
        }
        let entries = fs::read_dir(&root)
            .ctx(|| format!("reading {root:?}"))?
            .count();
        let found = in_use(&dev, rdev, &table)?.map(Found::InUse);
        Ok::<_, PoolError>((dev, found, false, entries))
    })
    .await
    .map_err(disks_failed)?;
    let found = match found {
        Some(f) => f,
        None => {
            let (c, label) = blockdev::probe_labelled(&dev)
                .await
                .map_err(|e| disks_failed(format!("probing {device:?}: {e}")))?;
            Found::Content(c, label)
        }
    };
    let disk = Disk {
        path: device.clone(),
        dev,
        found,
    };
    let facts = DirDisk {
        disk,
        mounted_at_path,
        path_entries,
    };
    let plan = plan_dir(&facts);
    let dev = facts.disk.dev.clone();
    match plan {
        DirPlan::Ready => {
            tracing::info!(pool = %cfg.name, ?device, path = ?cfg.path, "the pool's filesystem is mounted already");
            return Ok(());
        }
        DirPlan::Refuse(why) => return Err(why),
        DirPlan::FormatAndMount => {
            tracing::info!(pool = %cfg.name, ?device, "making an XFS filesystem on the blank disk");
            blockdev::mkfs_pool_command(&dev)
                .run()
                .await
                .map_err(|e| Unusable::DisksFailed(format!("mkfs.xfs {device:?}: {e}")))?;
        }
        DirPlan::Mount => {}
    }
    let path = cfg.path.clone();
    blocking(move || {
        mount::mount_device(
            &dev,
            &path,
            "xfs",
            sys_mount::MountFlags::empty(),
            "prjquota",
        )
    })
    .await
    .map_err(disks_failed)?;
    tracing::info!(pool = %cfg.name, ?device, path = ?cfg.path, "the pool's filesystem is mounted (prjquota)");
    Ok(())
}

#[cfg(test)]
mod tests;
