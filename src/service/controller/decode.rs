//! What the Controller service's handlers decode from requests and encode
//! into answers: pages of lists, snapshot parameters, content sources, the
//! size a filesystem needs, the access type.

use std::collections::HashMap;

use tonic::Status;

use super::super::status::Refusal;
use super::super::{to_i64, Capability, Result};
use crate::blockdev::{FormatOptions, FsType, FORMAT_PREFIX};
use crate::csi;
use crate::ids::{truncate, ParsedId, VolumeId};
use crate::iolimit::{IoChange, IoLimits};
use crate::pool::{AccessType, CapacityRange, ContentSource, Pool, Snapshot};
use crate::size::human;

/// The most entries one ListVolumes or ListSnapshots answer holds, whatever
/// `max_entries` asks. The spec lets a plugin answer fewer than asked (a
/// request without `max_entries` puts no restriction on the answer) as long
/// as `next_token` leads on. So a node with tens of thousands of volumes
/// never builds an answer of many MB (its peak RSS stays near its steady
/// one), and no answer nears the 4 MiB a gRPC client accepts by default.
pub(super) const MAX_PAGE: usize = 1000;

/// `max_entries` of a list request: negative is INVALID_ARGUMENT; 0 (no
/// limit) and anything above [`MAX_PAGE`] is a page of [`MAX_PAGE`].
pub(super) fn decode_max_entries(v: i32) -> Result<usize> {
    match v {
        0 => Ok(MAX_PAGE),
        n if n > 0 => Ok((n as usize).min(MAX_PAGE)),
        n => Err(Status::invalid_argument(format!(
            "max_entries must not be negative (got {n})"
        ))),
    }
}

/// A starting token that names no entry: ABORTED (the spec's code).
pub(super) fn bad_token(token: &str, what: &'static str) -> Status {
    Refusal::BadToken {
        token: truncate(token).to_owned(),
        what,
    }
    .into()
}

/// One page of a list sorted by id: `(start, end, next_token)`. The token is
/// the id of the first entry of the next page; an unknown token is ABORTED
/// (the spec's code).
pub(super) fn page<T>(
    sorted: &[T],
    id: impl Fn(&T) -> &String,
    token: &str,
    max: usize,
    what: &'static str,
) -> Result<(usize, usize, String)> {
    let start = if token.is_empty() {
        0
    } else {
        sorted
            .iter()
            .position(|e| id(e) == token)
            .ok_or_else(|| bad_token(token, what))?
    };
    let end = start.saturating_add(max).min(sorted.len());
    let next = sorted.get(end).map(|e| id(e).clone()).unwrap_or_default();
    Ok((start, end, next))
}

/// Mutable parameters (CreateVolume's and ControllerModifyVolume's): the
/// IO limits they change.
pub(super) fn decode_io_change(params: &HashMap<String, String>) -> Result<IoChange> {
    IoChange::parse(params).map_err(Status::invalid_argument)
}

/// INVALID_ARGUMENT for limits on a volume of a pool that cannot enforce
/// them ([`Pool::limits_io`]).
pub(super) fn refuse_io_limits(pool: &dyn Pool, limits: &IoLimits) -> Result<()> {
    if limits.is_unlimited() || pool.limits_io() {
        return Ok(());
    }
    Err(Status::invalid_argument(format!(
        "IO limits ({limits}) apply to LVM volumes; pool {} is {}: its volumes share one \
         filesystem's device, so a limit could only throttle all of a pod's I/O on that disk",
        pool.name(),
        pool.backend()
    )))
}

/// StorageClass-like parameter of a VolumeSnapshotClass: space reserved for a
/// thick (copy-on-write) snapshot's changes.
pub const PARAM_SNAPSHOT_SIZE: &str = "snapshotSize";

pub(super) fn decode_snapshot_params(params: &HashMap<String, String>) -> Result<Option<u64>> {
    let mut cow = None;
    for (k, v) in params {
        if k == PARAM_SNAPSHOT_SIZE {
            let n = crate::size::parse_size(v).map_err(Status::invalid_argument)?;
            if n == 0 {
                return Err(Status::invalid_argument(format!(
                    "{PARAM_SNAPSHOT_SIZE} must be positive"
                )));
            }
            cow = Some(n);
        } else if !k.starts_with(super::super::K8S_PARAM_PREFIX) {
            return Err(Status::invalid_argument(format!(
                "unknown snapshot parameter {:?} (known: {PARAM_SNAPSHOT_SIZE})",
                truncate(k)
            )));
        }
    }
    Ok(cow)
}

/// The content a new volume is made from, for `pool`: INVALID_ARGUMENT when
/// the pool takes no snapshots, NOT_FOUND for an id that is not this
/// driver's.
pub(super) fn content_source(
    pool: &dyn Pool,
    content: Option<(&'static str, ParsedId)>,
) -> Result<Option<ContentSource>> {
    match content {
        None => Ok(None),
        Some(_) if pool.snapshots().is_none() => Err(Status::invalid_argument(format!(
            "pool {} ({}) cannot create volumes from snapshots or other volumes",
            pool.name(),
            pool.backend()
        ))),
        Some((kind, ParsedId::Foreign(raw))) => Err(Refusal::Missing {
            kind,
            id: truncate(&raw).to_owned(),
        }
        .into()),
        Some(("snapshot", ParsedId::Volume(src))) => Ok(Some(ContentSource::Snapshot(src))),
        Some((_, ParsedId::Volume(src))) => Ok(Some(ContentSource::Volume(src))),
    }
}

/// The request's content source: which kind, and its id.
pub(super) fn decode_content_source(
    src: Option<&csi::VolumeContentSource>,
) -> Result<Option<(&'static str, ParsedId)>> {
    use csi::volume_content_source::Type;
    let Some(src) = src else { return Ok(None) };
    match &src.r#type {
        None => Err(Status::invalid_argument(
            "volume_content_source names neither a snapshot nor a volume",
        )),
        Some(Type::Snapshot(s)) => Ok(Some((
            "snapshot",
            VolumeId::parse("snapshot_id", &s.snapshot_id)?,
        ))),
        Some(Type::Volume(v)) => Ok(Some((
            "volume",
            VolumeId::parse("volume_id", &v.volume_id)?,
        ))),
    }
}

pub(super) fn snapshot_to_csi(s: &Snapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: to_i64(s.size_bytes),
        snapshot_id: s.id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: to_i64(s.created_unix),
            nanos: 0,
        }),
        ready_to_use: s.ready,
        group_snapshot_id: String::new(),
    }
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
    let fs = match caps[0].fs_type.as_str() {
        "" => default,
        t => FsType::parse(t)?,
    };
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
        return Err(Status::invalid_argument(format!(
            "{FORMAT_PREFIX}* parameters apply to pools that format their volumes (LVM); pool {} is {}",
            pool.name(),
            pool.backend()
        )));
    };
    if access != AccessType::Mount {
        return Ok(vec![]);
    }
    let fs = match caps[0].fs_type.as_str() {
        "" => default,
        t => FsType::parse(t)?,
    };
    opts.check_for(fs)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(opts.to_context())
}

/// One access type for the whole request, supported by the pool.
pub(super) fn access_type_of(caps: &[Capability], pool: &dyn Pool) -> Result<AccessType> {
    let t = caps[0].access_type;
    if caps.iter().any(|c| c.access_type != t) {
        return Err(Status::invalid_argument(
            "volume_capabilities mix block and mount access",
        ));
    }
    if !pool.supports(t) {
        return Err(Status::invalid_argument(format!(
            "pool {} ({}) does not support {t:?} access",
            pool.name(),
            pool.backend()
        )));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    const GI: i64 = 1 << 30;

    #[test]
    fn list_pages_are_capped() {
        assert_eq!(decode_max_entries(0).unwrap(), MAX_PAGE);
        assert_eq!(decode_max_entries(3).unwrap(), 3);
        assert_eq!(decode_max_entries(MAX_PAGE as i32).unwrap(), MAX_PAGE);
        assert_eq!(decode_max_entries(i32::MAX).unwrap(), MAX_PAGE);
        let e = decode_max_entries(-1).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        // A capped page still hands out the token of what follows.
        let ids: Vec<String> = (0..MAX_PAGE + 5).map(|i| format!("v{i:05}")).collect();
        let (start, end, next) = page(&ids, |s| s, "", MAX_PAGE, "volume").unwrap();
        assert_eq!((start, end), (0, MAX_PAGE));
        assert_eq!(next, ids[MAX_PAGE]);
    }

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
        // A limit that cannot hold the filesystem: OUT_OF_RANGE, saying why.
        let e = fit(r(64 * MI, 100 * MI), "xfs", AccessType::Mount, xfs, false).unwrap_err();
        assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
        assert!(e.message().contains("300Mi"), "{}", e.message());
        // A limit that can: raised, the limit kept.
        assert_eq!(
            fit(r(64 * MI, GI as u64), "xfs", AccessType::Mount, xfs, false).unwrap(),
            r(300 * MI, GI as u64)
        );
        // An unknown filesystem is refused at the boundary.
        let e = fit(r(64 * MI, 0), "ntfs", AccessType::Mount, xfs, false).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        // From a snapshot or a clone nothing is formatted: the range stays
        // (0 = the source's size), an unknown filesystem is still refused.
        let src = |range, fs: &str| {
            fit_filesystem(range, &[cap(fs)], AccessType::Mount, xfs, false, true)
        };
        assert_eq!(src(r(0, 0), "xfs").unwrap(), r(0, 0));
        assert_eq!(src(r(64 * MI, 0), "").unwrap(), r(64 * MI, 0));
        let e = src(r(0, 0), "ntfs").unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    }
}
