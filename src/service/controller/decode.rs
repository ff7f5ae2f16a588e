//! What the Controller service's handlers decode from requests and encode
//! into answers: pages of lists, mutable and snapshot parameters, content
//! sources, snapshots.

use std::collections::HashMap;

use tonic::Status;

use super::super::{to_i64, Result};
use crate::csi;
use crate::ids::{truncate, ParsedId, VolumeId};
use crate::iolimit::IoChange;
use crate::ops::SnapshotFilter;
use crate::pool::Snapshot;

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

/// Mutable parameters (CreateVolume's and ControllerModifyVolume's): the
/// IO limits they change.
pub(super) fn decode_io_change(params: &HashMap<String, String>) -> Result<IoChange> {
    IoChange::parse(params).map_err(Status::invalid_argument)
}

/// StorageClass-like parameter of a VolumeSnapshotClass: space reserved for a
/// thick (copy-on-write) snapshot's changes.
pub const PARAM_SNAPSHOT_SIZE: &str = "snapshotSize";

pub(in crate::service) fn decode_snapshot_params(
    params: &HashMap<String, String>,
) -> Result<Option<u64>> {
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

/// What a ListSnapshots request selects: one snapshot by id, the snapshots
/// of one volume (both may be empty: all).
pub(super) fn decode_snapshot_filter(
    snapshot_id: &str,
    source_volume_id: &str,
) -> Result<SnapshotFilter> {
    let snapshot = match snapshot_id {
        "" => None,
        id => Some(VolumeId::parse("snapshot_id", id)?),
    };
    let source_volume = match source_volume_id {
        "" => None,
        id => {
            crate::ids::check_text("source_volume_id", id)?;
            Some(id.to_owned())
        }
    };
    Ok(SnapshotFilter {
        snapshot,
        source_volume,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

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
        let page = crate::ops::page(ids.clone(), |s| s, "", MAX_PAGE, "volume").unwrap();
        assert_eq!(page.entries.len(), MAX_PAGE);
        assert_eq!(page.next_token, ids[MAX_PAGE]);
    }
}
