//! The client's own flags: capabilities, content sources, `KEY=VALUE`
//! parameters, sizes and secrets from files; and the gRPC code names its
//! errors print.

use super::*;

/// `create`'s content source: a restore of a snapshot or a clone of a volume.
#[derive(Args, Debug, Default, Clone)]
pub struct SourceArgs {
    /// Restore this snapshot into the new volume.
    #[arg(long, value_name = "SNAPSHOT_ID", conflicts_with = "from_volume")]
    pub from_snapshot: Option<String>,
    /// Clone this volume into the new volume.
    #[arg(long, value_name = "VOLUME_ID")]
    pub from_volume: Option<String>,
}

impl SourceArgs {
    /// The request's `volume_content_source`; `None` for an empty volume.
    pub fn to_csi(&self) -> Option<csi::VolumeContentSource> {
        use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
        let source = match (&self.from_snapshot, &self.from_volume) {
            (Some(id), _) => Type::Snapshot(SnapshotSource {
                snapshot_id: id.clone(),
            }),
            (None, Some(id)) => Type::Volume(VolumeSource {
                volume_id: id.clone(),
            }),
            (None, None) => return None,
        };
        Some(csi::VolumeContentSource {
            r#type: Some(source),
        })
    }
}

/// The volume capability flags shared by create, expand, stage and publish.
#[derive(Args, Debug, Default, Clone)]
pub struct CapabilityArgs {
    /// Filesystem type for mount access (e.g. ext4, xfs; empty: the driver's default).
    #[arg(long)]
    pub fs: Option<String>,
    /// Block access instead of mount access.
    #[arg(long, conflicts_with_all = ["fs", "mount_flags"])]
    pub block: bool,
    /// Access mode [default: single-node-writer].
    #[arg(long, value_enum)]
    pub mode: Option<AccessModeArg>,
    /// Mount flag (repeatable), e.g. ro, noexec.
    #[arg(long = "mount-flag", value_name = "FLAG")]
    pub mount_flags: Vec<String>,
}

impl CapabilityArgs {
    /// Whether any capability flag was given (expand sends one only then).
    pub fn given(&self) -> bool {
        self.fs.is_some() || self.block || self.mode.is_some() || !self.mount_flags.is_empty()
    }

    pub fn to_csi(&self) -> csi::VolumeCapability {
        use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
        let access_type = if self.block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: self.fs.clone().unwrap_or_default(),
                mount_flags: self.mount_flags.clone(),
                volume_mount_group: String::new(),
            })
        };
        csi::VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(AccessMode {
                mode: self
                    .mode
                    .unwrap_or(AccessModeArg::SingleNodeWriter)
                    .to_csi() as i32,
            }),
        }
    }
}

/// CSI access modes as flag values.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessModeArg {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
    MultiNodeReaderOnly,
    MultiNodeSingleWriter,
    MultiNodeMultiWriter,
}

impl AccessModeArg {
    pub fn to_csi(self) -> Mode {
        match self {
            AccessModeArg::SingleNodeWriter => Mode::SingleNodeWriter,
            AccessModeArg::SingleNodeReaderOnly => Mode::SingleNodeReaderOnly,
            AccessModeArg::SingleNodeSingleWriter => Mode::SingleNodeSingleWriter,
            AccessModeArg::SingleNodeMultiWriter => Mode::SingleNodeMultiWriter,
            AccessModeArg::MultiNodeReaderOnly => Mode::MultiNodeReaderOnly,
            AccessModeArg::MultiNodeSingleWriter => Mode::MultiNodeSingleWriter,
            AccessModeArg::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
        }
    }
}

/// Parses `KEY=VALUE` (the value may contain `=` and may be empty).
pub fn parse_param(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// `--secret-file KEY=FILE` values: each file's content (UTF-8, as CSI
/// secrets are strings), exactly.
pub fn read_secret_files(files: &[(String, String)]) -> Result<HashMap<String, String>, String> {
    files
        .iter()
        .map(|(k, f)| {
            let v = std::fs::read_to_string(f).map_err(|e| format!("reading {f:?}: {e}"))?;
            Ok((k.clone(), v))
        })
        .collect()
}

/// Parses a size flag (`10Mi`, `1Gi`, `1048576`) into CSI's int64 byte count.
pub fn parse_size_arg(s: &str) -> Result<i64, String> {
    let n = parse_size(s)?;
    i64::try_from(n).map_err(|_| format!("size {s:?} is larger than CSI's int64 byte count"))
}

/// Builds a parameter map from `--pool` and repeated `--param`s. A key given
/// twice with different values is an error, not a silent override.
pub fn param_map(
    pool: Option<&str>,
    params: &[(String, String)],
) -> Result<HashMap<String, String>, String> {
    let mut out: HashMap<String, String> = HashMap::new();
    let pool = pool.map(|p| ("pool".to_owned(), p.to_owned()));
    for (k, v) in params.iter().chain(pool.as_ref()) {
        match out.get(k) {
            Some(old) if old != v => {
                return Err(format!("parameter {k:?} given twice ({old:?} and {v:?})"))
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(out)
}

/// The gRPC spec's name of a status code (`NOT_FOUND`).
pub fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A path flag as the CSI string; non-UTF-8 paths are refused.
pub fn path_str(p: &std::path::Path) -> Result<String, String> {
    p.to_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("path {p:?} is not UTF-8; CSI paths are strings"))
}
