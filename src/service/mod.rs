//! The CSI services. These modules are the only code that sees proto types:
//! each handler decodes its request into the typed values of the operations
//! layer (`ops`; bad input becomes INVALID_ARGUMENT before anything on disk
//! is touched), calls the one operation of its RPC and encodes the answer.
//! Every other code is chosen in `status.rs`, from the layer's error enum or
//! a [`crate::ops::Refusal`].

use std::collections::HashMap;
use std::future::Future;
use std::time::Instant;

use tonic::{Code, Response, Status};

use crate::csi;
use crate::csi::volume_capability::access_mode::Mode;
pub use crate::driver::{Driver, TOPOLOGY_KEY};

/// What every handler and decoder here returns: the code is chosen here.
pub type Result<T, E = Status> = std::result::Result<T, E>;
use crate::blockdev::{FormatOptions, FORMAT_PREFIX};
use crate::ids::{truncate, PoolName, StorageId, STORAGE_ID_KEY};
pub use crate::ops::{Capability, PoolParams, PARAM_ENCRYPTION};
use crate::pool::{AccessMode, AccessType, Encryption};

pub mod classes;
pub mod controller;
pub mod gate;
pub mod identity;
pub mod metadata;
pub mod node;
pub mod status;

/// StorageClass parameter that picks a pool.
pub const PARAM_POOL: &str = "pool";
/// StorageClass parameter: inode (file count) limit of each volume.
pub const PARAM_INODE_LIMIT: &str = "inodeLimit";
/// Prefix of the parameters Kubernetes' sidecars add (`--extra-create-metadata`).
pub const K8S_PARAM_PREFIX: &str = "csi.storage.k8s.io/";

/// This node's topology segment, as every volume and NodeGetInfo carry it.
pub fn topology(node_id: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([(TOPOLOGY_KEY.to_owned(), node_id.to_owned())]),
    }
}

/// The node a topology segment from a request names (None: the segment
/// has no key of this driver's).
pub fn node_of(t: &csi::Topology) -> Option<String> {
    t.segments.get(TOPOLOGY_KEY).cloned()
}

pub fn decode_capability(c: &csi::VolumeCapability) -> Result<Capability> {
    use csi::volume_capability::AccessType as At;
    let (access_type, fs_type, mount_flags) = match &c.access_type {
        Some(At::Mount(m)) => (AccessType::Mount, m.fs_type.clone(), m.mount_flags.clone()),
        Some(At::Block(_)) => (AccessType::Block, String::new(), Vec::new()),
        None => {
            return Err(Status::invalid_argument(
                "volume capability has no access type (mount or block)",
            ))
        }
    };
    let raw_mode = c
        .access_mode
        .as_ref()
        .map(|m| m.mode)
        .ok_or_else(|| Status::invalid_argument("volume capability has no access mode"))?;
    let mode = match Mode::try_from(raw_mode) {
        Ok(Mode::SingleNodeWriter) => AccessMode::SingleNodeWriter,
        Ok(Mode::SingleNodeReaderOnly) => AccessMode::SingleNodeReaderOnly,
        Ok(Mode::SingleNodeSingleWriter) => AccessMode::SingleNodeSingleWriter,
        Ok(Mode::SingleNodeMultiWriter) => AccessMode::SingleNodeMultiWriter,
        Ok(
            m @ (Mode::MultiNodeReaderOnly
            | Mode::MultiNodeSingleWriter
            | Mode::MultiNodeMultiWriter),
        ) => {
            return Err(Status::invalid_argument(format!(
                "access mode {} is not supported: localvol volumes live on one node",
                m.as_str_name()
            )))
        }
        Ok(Mode::Unknown) | Err(_) => {
            return Err(Status::invalid_argument(format!(
                "unknown access mode {raw_mode}"
            )))
        }
    };
    for f in &mount_flags {
        if f.is_empty() || f.len() > 256 || f.contains(|ch: char| ch.is_control() || ch == ',') {
            return Err(Status::invalid_argument(format!(
                "invalid mount flag {:?}",
                truncate(f)
            )));
        }
    }
    if !matches!(fs_type.as_str(), "" | "ext4" | "xfs") {
        return Err(Status::invalid_argument(format!(
            "fs_type {:?} is not supported (ext4 or xfs)",
            truncate(&fs_type)
        )));
    }
    Ok(Capability {
        access_type,
        fs_type,
        mount_flags,
        mode,
    })
}

/// Decodes a non-empty capability list.
pub fn decode_capabilities(caps: &[csi::VolumeCapability]) -> Result<Vec<Capability>> {
    if caps.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities is required"));
    }
    caps.iter().map(decode_capability).collect()
}

pub fn decode_params(params: &HashMap<String, String>) -> Result<PoolParams> {
    let mut out = PoolParams::default();
    for (k, v) in params {
        if k == PARAM_POOL {
            out.pool = Some(PoolName::parse(v)?);
            out.kept.insert(k.clone(), v.clone());
        } else if k == PARAM_INODE_LIMIT {
            let n: u64 = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "{PARAM_INODE_LIMIT} must be a positive integer (got {:?})",
                    truncate(v)
                ))
            })?;
            out.inode_limit = Some(n);
            out.kept.insert(k.clone(), v.clone());
        } else if k == PARAM_ENCRYPTION {
            out.encryption = Some(Encryption::parse(v).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "{PARAM_ENCRYPTION} must be luks2 (got {:?})",
                    truncate(v)
                ))
            })?);
        } else if FormatOptions::is_format_key(k) {
            out.format
                .set(k, v)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
        } else if let Some(rest) = k.strip_prefix(K8S_PARAM_PREFIX) {
            crate::ids::check_text("parameter name", rest)?;
            if v.len() > 1024 || v.contains(char::is_control) {
                return Err(Status::invalid_argument(format!(
                    "parameter {k} has an invalid value"
                )));
            }
            out.kept.insert(k.clone(), v.clone());
        } else {
            return Err(Status::invalid_argument(format!(
                "unknown parameter {:?} (known: {PARAM_POOL}, {PARAM_INODE_LIMIT}, {PARAM_ENCRYPTION}, {FORMAT_PREFIX}*, {K8S_PARAM_PREFIX}*)",
                truncate(k)
            )));
        }
    }
    Ok(out)
}

/// Volume attribute of an ephemeral inline volume that gives its size.
pub const ATTR_SIZE: &str = "size";

/// The volume attributes of a CSI ephemeral inline volume, decoded: the
/// StorageClass parameters (`pool`, `inodeLimit`, `csi.storage.k8s.io/*`,
/// which include kubelet's pod information) plus `size` (required).
#[derive(Debug)]
pub struct EphemeralAttrs {
    pub params: PoolParams,
    pub size: u64,
}

/// Whether a NodePublishVolume's volume context marks an ephemeral inline
/// volume (kubelet sets the key with the CSIDriver's `podInfoOnMount`).
pub fn is_ephemeral(ctx: &HashMap<String, String>) -> bool {
    ctx.get(crate::pool::EPHEMERAL_KEY).map(String::as_str) == Some("true")
}

pub fn decode_ephemeral(ctx: &HashMap<String, String>) -> Result<EphemeralAttrs> {
    let mut rest = ctx.clone();
    let size = match rest.remove(ATTR_SIZE) {
        None => {
            return Err(Status::invalid_argument(format!(
                "ephemeral volume: the volume attribute {ATTR_SIZE:?} is required (e.g. \"1Gi\")"
            )))
        }
        Some(v) => crate::size::parse_size(&v)
            .ok()
            .filter(|n| *n > 0 && *n <= i64::MAX as u64)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "ephemeral volume: {ATTR_SIZE} must be a positive size such as 1Gi (got {:?})",
                    truncate(&v)
                ))
            })?,
    };
    let mut params = decode_params(&rest).map_err(|s| {
        Status::invalid_argument(format!("ephemeral volume attributes: {}", s.message()))
    })?;
    if !params.format.is_empty() {
        return Err(Status::invalid_argument(format!(
            "ephemeral volume attributes: {FORMAT_PREFIX}* do not apply (an ephemeral volume is a directory)"
        )));
    }
    params.kept.insert(ATTR_SIZE.to_owned(), size.to_string());
    Ok(EphemeralAttrs { params, size })
}

fn bad_format_context(e: crate::blockdev::FormatError) -> Status {
    Status::invalid_argument(format!("volume attributes: {e}"))
}

/// The format options of a volume's context (`format.*`, as CreateVolume
/// put them there), decoded again: malformed, or options of both
/// filesystems, is INVALID_ARGUMENT.
pub fn decode_format_context(ctx: &HashMap<String, String>) -> Result<FormatOptions> {
    let opts = FormatOptions::from_params(ctx).map_err(bad_format_context)?;
    opts.filesystem().map_err(bad_format_context)?;
    Ok(opts)
}

/// The storage identity a volume's context names ([`STORAGE_ID_KEY`]: the
/// PV's volume attributes, set from CreateVolume's answer or by an operator
/// re-adopting a volume), if any; malformed is INVALID_ARGUMENT.
pub fn decode_storage_id(ctx: &HashMap<String, String>) -> Result<Option<StorageId>> {
    ctx.get(STORAGE_ID_KEY)
        .map(|v| {
            StorageId::parse(v).map_err(|e| {
                Status::invalid_argument(format!("volume attribute {STORAGE_ID_KEY}: {e}"))
            })
        })
        .transpose()
}

/// A request's capacity range (absent: no constraint); a negative byte
/// count, or required above the limit, is INVALID_ARGUMENT.
pub fn decode_range(r: Option<&csi::CapacityRange>) -> Result<crate::pool::CapacityRange> {
    let Some(r) = r else {
        return Ok(crate::pool::CapacityRange::default());
    };
    let range = crate::pool::CapacityRange {
        required: bytes("capacity_range.required_bytes", r.required_bytes)?,
        limit: bytes("capacity_range.limit_bytes", r.limit_bytes)?,
    };
    if range.limit > 0 && range.required > range.limit {
        return Err(Status::invalid_argument(format!(
            "capacity_range: required_bytes {} is larger than limit_bytes {}",
            range.required, range.limit
        )));
    }
    Ok(range)
}

/// Converts a CSI byte count (int64) to u64; negative is INVALID_ARGUMENT.
pub fn bytes(what: &str, v: i64) -> Result<u64> {
    u64::try_from(v)
        .map_err(|_| Status::invalid_argument(format!("{what} must not be negative (got {v})")))
}

pub fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Runs one RPC body: times it, converts the error in the one place that does,
/// and logs the call once (Probe at debug level).
pub async fn rpc<T, F>(method: &'static str, volume: &str, f: F) -> Result<Response<T>, Status>
where
    F: Future<Output = Result<T>>,
{
    let start = Instant::now();
    let res = crate::runs::attributed(method, f).await.map(Response::new);
    let code = match &res {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    };
    crate::metrics::record_rpc(method, &format!("{code:?}"), start.elapsed().as_secs_f64());
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    // Field values are evaluated only when the event is enabled: with the
    // level off, a call costs no formatting and no allocation.
    match (&res, method) {
        (Ok(_), "Probe") => tracing::debug!(method, duration_ms = ms, code = ?code, "rpc"),
        (Ok(_), _) => {
            tracing::info!(method, volume = truncate(volume).as_str(), duration_ms = ms, code = ?code, "rpc")
        }
        (Err(s), _) => {
            tracing::info!(method, volume = truncate(volume).as_str(), duration_ms = ms, code = ?code, error = s.message(), "rpc")
        }
    }
    res
}
