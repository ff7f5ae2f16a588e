//! The checks of a request that need what it names: the pool a new volume
//! goes to (its access types, IO limits, filesystems, snapshots) or the
//! volume a node call is about (its access type, its source's mount
//! options). Their refusals are [`Refusal::Unfit`] (the caller must change
//! the request) or the refusals of the size rules.

use super::{unfit, Capability, Refusal, Result};
use crate::blockdev::{FormatOptions, FsType, FORMAT_PREFIX};
use crate::ids::{truncate, ParsedId};
use crate::iolimit::IoLimits;
use crate::mount::parse_bind_flag;
use crate::nodeops::pipeline::MountOptions;
use crate::pool::{AccessType, CapacityRange, ContentSource, Pool, Source, Volume};
use crate::size::human;

/// [`Refusal::Unfit`] for limits on a volume of a pool that cannot enforce
/// them ([`Pool::limits_io`]).
pub(super) fn refuse_io_limits(pool: &dyn Pool, limits: &IoLimits) -> Result<()> {
    if limits.is_unlimited() || pool.limits_io() {
        return Ok(());
    }
    unfit(format!(
        "IO limits ({limits}) apply to LVM volumes; pool {} is {}: its volumes share one \
         filesystem's device, so a limit could only throttle all of a pod's I/O on that disk",
        pool.name(),
        pool.backend()
    ))
}

/// The content a new volume is made from, for `pool`: unfit when the pool
/// takes no snapshots, [`Refusal::Missing`] for an id that is not this
/// driver's.
pub(super) fn content_source(
    pool: &dyn Pool,
    content: Option<(&'static str, ParsedId)>,
) -> Result<Option<ContentSource>> {
    match content {
        None => Ok(None),
        Some(_) if pool.snapshots().is_none() => unfit(format!(
            "pool {} ({}) cannot create volumes from snapshots or other volumes",
            pool.name(),
            pool.backend()
        )),
        Some((kind, ParsedId::Foreign(raw))) => Err(Refusal::Missing {
            kind,
            id: truncate(&raw).to_owned(),
        }
        .into()),
        Some(("snapshot", ParsedId::Volume(src))) => Ok(Some(ContentSource::Snapshot(src))),
        Some((_, ParsedId::Volume(src))) => Ok(Some(ContentSource::Volume(src))),
    }
}

/// The filesystem of a new mount volume of a pool that makes them: the
/// capability's fsType, else the pool's `default`.
pub(super) fn chosen_fs(caps: &[Capability], default: FsType) -> Result<FsType> {
    Ok(match caps[0].fs_type.as_str() {
        "" => default,
        t => FsType::parse(t)?,
    })
}

/// Raises the smallest size a mount volume of a formatting pool may have to
/// what its filesystem can be made on (and, encrypted, the LUKS header
/// beside it), within the request's limit. Without this a 64Mi XFS claim
/// is created and then fails NodeStage forever: mkfs.xfs refuses < 300 MiB.
/// A larger volume than asked is within the spec (required is a minimum);
/// a limit below the minimum is OUT_OF_RANGE before anything is made.
/// A volume made from a snapshot or a clone is never formatted: it carries
/// its source's filesystem and is sized from the source, so only the
/// filesystem's name is checked.
pub(super) fn fit_filesystem(
    range: CapacityRange,
    caps: &[Capability],
    access: AccessType,
    pool_fs: Option<FsType>,
    encrypted: bool,
    from_source: bool,
) -> Result<CapacityRange> {
    let Some(default) = pool_fs else {
        return Ok(range); // the pool makes no filesystems (dir pools)
    };
    if access != AccessType::Mount {
        return Ok(range);
    }
    let fs = chosen_fs(caps, default)?;
    let mut min = fs.min_device_bytes();
    if min == 0 || from_source {
        return Ok(range);
    }
    if encrypted {
        min += crate::crypt::LUKS2_HEADER_BYTES;
    }
    if range.required >= min {
        return Ok(range);
    }
    if range.limit > 0 && range.limit < min {
        return Err(Refusal::TooSmallForFilesystem {
            fs: fs.as_str(),
            min: human(min),
            luks: if encrypted {
                ", the LUKS2 header included"
            } else {
                ""
            },
            limit: human(range.limit),
        }
        .into());
    }
    Ok(CapacityRange {
        required: min,
        ..range
    })
}

/// The class's format options for a new volume of `pool`, as volume-context
/// entries for NodeStageVolume: INVALID_ARGUMENT when the pool makes no
/// filesystems (dir pools) or the options are for another filesystem than
/// the volume's (the capability's fsType, else the pool's default). A raw
/// block volume has no filesystem: the options do not apply and are not
/// carried, so that one class may serve block and filesystem claims.
pub(super) fn format_context(
    opts: &FormatOptions,
    caps: &[Capability],
    access: AccessType,
    pool: &dyn Pool,
) -> Result<Vec<(String, String)>> {
    if opts.is_empty() {
        return Ok(vec![]);
    }
    let Some(default) = pool.default_fs_type() else {
        return unfit(format!(
            "{FORMAT_PREFIX}* parameters apply to pools that format their volumes (LVM); pool {} is {}",
            pool.name(),
            pool.backend()
        ));
    };
    if access != AccessType::Mount {
        return Ok(vec![]);
    }
    let fs = chosen_fs(caps, default)?;
    opts.check_for(fs)
        .map_err(|e| Refusal::Unfit(e.to_string()))?;
    Ok(opts.to_context())
}

/// One access type for the whole request, supported by the pool.
pub(super) fn access_type_of(caps: &[Capability], pool: &dyn Pool) -> Result<AccessType> {
    let t = caps[0].access_type;
    if caps.iter().any(|c| c.access_type != t) {
        return unfit("volume_capabilities mix block and mount access".to_owned());
    }
    if !pool.supports(t) {
        return unfit(format!(
            "pool {} ({}) does not support {t:?} access",
            pool.name(),
            pool.backend()
        ));
    }
    Ok(t)
}

/// The capability's access type must be the volume's (`id`: as the
/// request names it, a static volume's handle).
pub(super) fn check_access_type(cap: &Capability, vol: &Volume, id: &str) -> Result<()> {
    if cap.access_type != vol.access_type {
        return unfit(format!(
            "volume {id} is a {:?} volume; the capability asks for {:?}",
            vol.access_type, cap.access_type
        ));
    }
    Ok(())
}

/// Mount flags split into per-mount flags and filesystem options. Directory
/// volumes take per-mount flags only (they are bind mounts).
pub(super) fn mount_options(cap: &Capability, src: &Source) -> Result<MountOptions> {
    let mut out = MountOptions::default();
    for f in &cap.mount_flags {
        if let Some(flag) = parse_bind_flag(f) {
            out.flags |= flag;
            continue;
        }
        match src {
            Source::Directory(_) => {
                return unfit(format!(
                    "mount flag {:?} is not supported for directory volumes (use ro, nosuid, nodev, noexec, noatime, nodiratime, relatime, strictatime)",
                    truncate(f)
                ))
            }
            Source::Device(_) => {
                if !f.chars().all(|c| c.is_ascii_alphanumeric() || "_.=:/+-".contains(c)) {
                    return unfit(format!("invalid mount option {:?}", truncate(f)));
                }
                out.data.push(f.clone());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{OpError, Refusal as R};

    const GI: i64 = 1 << 30;

    #[test]
    fn filesystem_minimums_raise_required_within_the_limit() {
        const MI: u64 = 1 << 20;
        let cap = |fs: &str| Capability {
            access_type: AccessType::Mount,
            fs_type: fs.into(),
            mount_flags: vec![],
            mode: crate::pool::AccessMode::SingleNodeWriter,
        };
        let r = |required, limit| CapacityRange { required, limit };
        let fit = |range, fs: &str, access, pool_fs, enc| {
            fit_filesystem(range, &[cap(fs)], access, pool_fs, enc, false)
        };
        let xfs = Some(FsType::Xfs);
        let ext4 = Some(FsType::Ext4);
        // 64Mi XFS, named by the class or by the pool's default: 300Mi.
        assert_eq!(
            fit(r(64 * MI, 0), "xfs", AccessType::Mount, ext4, false).unwrap(),
            r(300 * MI, 0)
        );
        assert_eq!(
            fit(r(64 * MI, 0), "", AccessType::Mount, xfs, false).unwrap(),
            r(300 * MI, 0)
        );
        // No range at all: the minimum too (not the pool's smaller default).
        assert_eq!(
            fit(r(0, 0), "", AccessType::Mount, xfs, false).unwrap(),
            r(300 * MI, 0)
        );
        // Encrypted: the LUKS2 header on top.
        assert_eq!(
            fit(r(64 * MI, 0), "xfs", AccessType::Mount, xfs, true).unwrap(),
            r(316 * MI, 0)
        );
        // Larger than the minimum, ext4, block and dir pools: unchanged.
        for (range, fs, access, pool_fs) in [
            (r(400 * MI, 0), "xfs", AccessType::Mount, xfs),
            (r(8 * MI, 0), "ext4", AccessType::Mount, xfs),
            (r(8 * MI, 0), "", AccessType::Mount, ext4),
            (r(8 * MI, 0), "", AccessType::Block, xfs),
            (r(8 * MI, 0), "xfs", AccessType::Mount, None),
        ] {
            assert_eq!(
                fit(range, fs, access, pool_fs, false).unwrap(),
                range,
                "{fs:?} {access:?}"
            );
        }
        // A limit that cannot hold the filesystem: refused, saying why.
        let e = fit(r(64 * MI, 100 * MI), "xfs", AccessType::Mount, xfs, false).unwrap_err();
        assert!(
            matches!(e, OpError::Refused(R::TooSmallForFilesystem { .. })),
            "{e:?}"
        );
        assert!(e.to_string().contains("300Mi"), "{e}");
        // A limit that can: raised, the limit kept.
        assert_eq!(
            fit(r(64 * MI, GI as u64), "xfs", AccessType::Mount, xfs, false).unwrap(),
            r(300 * MI, GI as u64)
        );
        // An unknown filesystem is refused at the boundary.
        let e = fit(r(64 * MI, 0), "ntfs", AccessType::Mount, xfs, false).unwrap_err();
        assert!(matches!(e, OpError::UnknownFs(_)), "{e:?}");
        // From a snapshot or a clone nothing is formatted: the range stays
        // (0 = the source's size), an unknown filesystem is still refused.
        let src = |range, fs: &str| {
            fit_filesystem(range, &[cap(fs)], AccessType::Mount, xfs, false, true)
        };
        assert_eq!(src(r(0, 0), "xfs").unwrap(), r(0, 0));
        assert_eq!(src(r(64 * MI, 0), "").unwrap(), r(64 * MI, 0));
        let e = src(r(0, 0), "ntfs").unwrap_err();
        assert!(matches!(e, OpError::UnknownFs(_)), "{e:?}");
    }
}
