//! `localvol client`: a command-line CSI client for any driver's socket, for
//! operators and for trying a driver by hand. It speaks only the CSI spec: nothing
//! here knows about localvol's pools or ids.
//!
//! ```text
//! localvol client [--endpoint unix:///run/localvol/csi.sock] [--json] [--timeout SECS] <command>
//! ```
//!
//! The endpoint defaults to `$CSI_ENDPOINT`, else `unix:///run/localvol/csi.sock`.
//! A gRPC error prints `localvol client: <CODE>: <message>` (CODE as in the gRPC
//! spec, e.g. `NOT_FOUND`) on stderr and exits with status 1; a connection
//! failure also exits with 1; bad usage exits with 2 (clap).
//!
//! # JSON output (`--json`)
//!
//! Each command prints exactly one JSON object on one line. Topologies are
//! objects of their segments (`{"topology.example/node": "n1"}`); a volume's
//! `accessible_topology` is a list of them (CSI allows several). Enum values use
//! the proto names (`"STAGE_UNSTAGE_VOLUME"`, `"BYTES"`). Byte counts are numbers.
//!
//! | command     | object |
//! |-------------|--------|
//! | `probe`     | `{"ready": bool\|null}` |
//! | `info`      | `{"name", "vendor_version", "manifest": {..}, "plugin_capabilities": [..], "node": {"node_id", "max_volumes_per_node", "accessible_topology": {..}\|null}\|null, "controller_capabilities": [..]\|null, "node_capabilities": [..]\|null}` |
//! | `capacity`  | `{"available_capacity", "maximum_volume_size": n\|null, "minimum_volume_size": n\|null}` |
//! | `create`    | a volume: `{"volume_id", "capacity_bytes", "volume_context": {..}, "accessible_topology": [{..}]}` |
//! | `delete`    | `{"volume_id", "deleted": true}` |
//! | `snapshot`  | `{"snapshot_id", "source_volume_id", "size_bytes", "ready_to_use", "creation_time": seconds\|null}` |
//! | `delete-snapshot` | `{"snapshot_id", "deleted": true}` |
//! | `expand`    | `{"volume_id", "capacity_bytes", "node_expansion_required", "node_expanded", "node_capacity_bytes": n\|null}` |
//! | `stage`     | `{"volume_id", "staging_target_path", "staged": true}` |
//! | `unstage`   | `{"volume_id", "staging_target_path", "unstaged": true}` |
//! | `publish`   | `{"volume_id", "target_path", "published": true}` |
//! | `unpublish` | `{"volume_id", "target_path", "unpublished": true}` |
//! | `stats`     | `{"volume_id", "volume_path", "usage": [{"unit", "available", "total", "used"}], "volume_condition": {"abnormal", "message"}\|null}` |
//! | `list`      | `{"entries": [volume + "published_node_ids": [..]\|null], "next_token"}` |
//!
//! In `info`, `node`, `node_capabilities` and `controller_capabilities` are null
//! when the driver does not serve that part (UNIMPLEMENTED, or no
//! CONTROLLER_SERVICE plugin capability).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use localvol::csi;
use localvol::csi::controller_client::ControllerClient;
use localvol::csi::identity_client::IdentityClient;
use localvol::csi::node_client::NodeClient;
use localvol::csi::volume_capability::access_mode::Mode;
use localvol::endpoint::Endpoint;
use localvol::size::{human, parse_size};

#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The driver's socket: unix:///path/csi.sock or tcp://host:port.
    #[arg(
        long,
        global = true,
        env = "CSI_ENDPOINT",
        default_value = "unix:///run/localvol/csi.sock"
    )]
    pub endpoint: Endpoint,
    /// Print one JSON object instead of aligned text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Give up on an RPC after this many seconds (DEADLINE_EXCEEDED).
    #[arg(long, global = true, default_value_t = 120)]
    pub timeout: u64,
    #[command(subcommand)]
    pub command: ClientCommand,
}

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Probe: is the driver ready?
    Probe,
    /// Plugin info and capabilities, node info, controller and node capabilities.
    Info,
    /// GetCapacity.
    Capacity {
        /// Shorthand for --param pool=P.
        #[arg(long)]
        pool: Option<String>,
        /// StorageClass-style parameter (repeatable).
        #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
        params: Vec<(String, String)>,
    },
    /// CreateVolume.
    Create {
        /// The volume's name (what a CO derives from the PVC).
        name: String,
        /// Required capacity (10Mi, 1Gi, 500M, bytes). Omit to let the driver pick.
        #[arg(long, value_parser = parse_size_arg)]
        size: Option<i64>,
        /// Largest acceptable capacity.
        #[arg(long, value_parser = parse_size_arg)]
        limit: Option<i64>,
        /// Shorthand for --param pool=P.
        #[arg(long)]
        pool: Option<String>,
        #[command(flatten)]
        cap: CapabilityArgs,
        /// StorageClass-style parameter (repeatable).
        #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
        params: Vec<(String, String)>,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// DeleteVolume.
    Delete { volume_id: String },
    /// CreateSnapshot of a volume.
    Snapshot {
        /// The snapshot's name (what a CO derives from the VolumeSnapshot).
        name: String,
        /// The volume to take it of.
        #[arg(long, value_name = "VOLUME_ID")]
        source: String,
        /// VolumeSnapshotClass-style parameter (repeatable).
        #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
        params: Vec<(String, String)>,
    },
    /// DeleteSnapshot.
    DeleteSnapshot { snapshot_id: String },
    /// ControllerExpandVolume, then NodeExpandVolume when the driver asks for it
    /// and --volume-path is given.
    Expand {
        volume_id: String,
        /// The new required capacity.
        #[arg(long, value_parser = parse_size_arg)]
        size: i64,
        /// Largest acceptable capacity.
        #[arg(long, value_parser = parse_size_arg)]
        limit: Option<i64>,
        /// Where the volume is published (for NodeExpandVolume).
        #[arg(long)]
        volume_path: Option<String>,
        /// Where the volume is staged (for NodeExpandVolume).
        #[arg(long)]
        staging_path: Option<String>,
        /// Call NodeExpandVolume even when the controller does not require it.
        #[arg(long, requires = "volume_path")]
        node: bool,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// NodeStageVolume (the staging directory's parent must exist).
    Stage {
        volume_id: String,
        #[arg(long)]
        staging_path: String,
        #[command(flatten)]
        cap: CapabilityArgs,
        /// volume_context entry from CreateVolume (repeatable).
        #[arg(long = "context", value_name = "KEY=VALUE", value_parser = parse_param)]
        context: Vec<(String, String)>,
        /// Secret whose value is FILE's content (repeatable; e.g.
        /// `encryptionKey=key.txt` for an encrypted volume). From a file, so
        /// a key never shows in a command line.
        #[arg(long = "secret-file", value_name = "KEY=FILE", value_parser = parse_param)]
        secret_files: Vec<(String, String)>,
    },
    /// NodeUnstageVolume.
    Unstage {
        volume_id: String,
        #[arg(long)]
        staging_path: String,
    },
    /// NodePublishVolume (the target's parent must exist).
    Publish {
        volume_id: String,
        #[arg(long)]
        target_path: String,
        /// Where the volume was staged (drivers with STAGE_UNSTAGE_VOLUME).
        #[arg(long)]
        staging_path: Option<String>,
        /// Publish read-only.
        #[arg(long)]
        readonly: bool,
        #[command(flatten)]
        cap: CapabilityArgs,
        /// volume_context entry from CreateVolume (repeatable).
        #[arg(long = "context", value_name = "KEY=VALUE", value_parser = parse_param)]
        context: Vec<(String, String)>,
    },
    /// NodeUnpublishVolume.
    Unpublish {
        volume_id: String,
        #[arg(long)]
        target_path: String,
    },
    /// NodeGetVolumeStats.
    Stats {
        volume_id: String,
        /// Where the volume is published (or staged).
        #[arg(long)]
        volume_path: String,
        #[arg(long)]
        staging_path: Option<String>,
    },
    /// ListVolumes.
    List {
        /// Page size (0: the driver decides).
        #[arg(long, default_value_t = 0)]
        max_entries: i32,
        /// Continue from a previous page's next_token.
        #[arg(long, default_value = "")]
        starting_token: String,
        /// Follow next_token until the last page.
        #[arg(long)]
        all: bool,
    },
}

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

/// Why a client command failed.
#[derive(Debug)]
pub enum ClientError {
    /// The driver answered with an error.
    Rpc(Status),
    /// No connection to the endpoint.
    Connect(String),
    /// A request could not be built from the flags.
    Usage(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Rpc(s) => write!(f, "{}: {}", code_name(s.code()), s.message()),
            ClientError::Connect(m) | ClientError::Usage(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ClientError {}

/// An error and all its sources, joined with `: ` (tonic's transport errors say
/// little at the top level).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        src = s.source();
    }
    msg
}

/// Connects to a CSI endpoint, with the error worded for a command line.
pub async fn connect(endpoint: &Endpoint) -> Result<Channel, ClientError> {
    endpoint.connect().await.map_err(|e| {
        ClientError::Connect(format!("cannot connect to {endpoint}: {}", error_chain(&e)))
    })
}

/// Runs one RPC with a deadline: the `grpc-timeout` header tells the driver, the
/// local timer makes sure the client stops waiting either way.
pub async fn call<T, R, F, Fut>(timeout: Duration, msg: T, f: F) -> Result<R, Status>
where
    F: FnOnce(Request<T>) -> Fut,
    Fut: Future<Output = Result<Response<R>, Status>>,
{
    let mut req = Request::new(msg);
    req.set_timeout(timeout);
    match tokio::time::timeout(timeout, f(req)).await {
        Ok(res) => res.map(Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no answer within {} s",
            timeout.as_secs_f64()
        ))),
    }
}

/// The three service clients over one connection.
#[derive(Clone)]
pub struct Clients {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
    pub timeout: Duration,
}

impl Clients {
    pub fn new(channel: Channel, timeout: Duration) -> Self {
        Clients {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
            timeout,
        }
    }
}

/// A command's result, ready for either output form.
pub struct Output {
    pub json: Value,
    pub human: String,
}

/// `localvol client`: runs the command and prints its result; the exit code
/// is 0 on success and 1 on any error.
pub async fn main(args: ClientArgs) -> ExitCode {
    let res = async {
        let channel = connect(&args.endpoint).await?;
        let clients = Clients::new(channel, Duration::from_secs(args.timeout.max(1)));
        run(&clients, &args.command).await
    }
    .await;
    match res {
        Ok(out) => {
            if args.json {
                println!("{}", out.json);
            } else {
                print!("{}", out.human);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("localvol client: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs one client command against connected clients: picks the subcommand's
/// function.
pub async fn run(c: &Clients, cmd: &ClientCommand) -> Result<Output, ClientError> {
    match cmd {
        ClientCommand::Probe => cmd_probe(c).await,
        ClientCommand::Info => info(c).await,
        ClientCommand::Capacity { pool, params } => cmd_capacity(c, pool.as_deref(), params).await,
        ClientCommand::Create {
            name,
            size,
            limit,
            pool,
            cap,
            params,
            source,
        } => {
            let range = (*size, *limit);
            cmd_create(c, name, range, pool.as_deref(), cap, params, source).await
        }
        ClientCommand::Delete { volume_id } => cmd_delete(c, volume_id).await,
        ClientCommand::Snapshot {
            name,
            source,
            params,
        } => cmd_snapshot(c, name, source, params).await,
        ClientCommand::DeleteSnapshot { snapshot_id } => cmd_delete_snapshot(c, snapshot_id).await,
        ClientCommand::Expand {
            volume_id,
            size,
            limit,
            volume_path,
            staging_path,
            node,
            cap,
        } => {
            let node_step = NodeExpandStep {
                volume_path: volume_path.as_deref(),
                staging_path: staging_path.as_deref(),
                always: *node,
            };
            cmd_expand(c, volume_id, *size, *limit, cap, node_step).await
        }
        ClientCommand::Stage {
            volume_id,
            staging_path,
            cap,
            context,
            secret_files,
        } => cmd_stage(c, volume_id, staging_path, cap, context, secret_files).await,
        ClientCommand::Unstage {
            volume_id,
            staging_path,
        } => cmd_unstage(c, volume_id, staging_path).await,
        ClientCommand::Publish {
            volume_id,
            target_path,
            staging_path,
            readonly,
            cap,
            context,
        } => {
            let staging_path = staging_path.as_deref();
            cmd_publish(
                c,
                volume_id,
                target_path,
                staging_path,
                *readonly,
                cap,
                context,
            )
            .await
        }
        ClientCommand::Unpublish {
            volume_id,
            target_path,
        } => cmd_unpublish(c, volume_id, target_path).await,
        ClientCommand::Stats {
            volume_id,
            volume_path,
            staging_path,
        } => cmd_stats(c, volume_id, volume_path, staging_path.as_deref()).await,
        ClientCommand::List {
            max_entries,
            starting_token,
            all,
        } => list(c, *max_entries, starting_token, *all).await,
    }
}

/// `probe`: asks the driver whether it is ready.
async fn cmd_probe(c: &Clients) -> Result<Output, ClientError> {
    let mut id = c.identity.clone();
    let r = call(c.timeout, csi::ProbeRequest {}, |r| id.probe(r))
        .await
        .map_err(ClientError::Rpc)?;
    let ready = match r.ready {
        Some(true) => "yes",
        Some(false) => "no",
        None => "yes (not reported)",
    };
    Ok(Output {
        json: json!({ "ready": r.ready }),
        human: rows(&[("ready", ready.to_owned())]),
    })
}

/// `capacity`: GetCapacity for the given parameters.
async fn cmd_capacity(
    c: &Clients,
    pool: Option<&str>,
    params: &[(String, String)],
) -> Result<Output, ClientError> {
    let parameters = param_map(pool, params).map_err(ClientError::Usage)?;
    let mut ctl = c.controller.clone();
    let req = csi::GetCapacityRequest {
        volume_capabilities: Vec::new(),
        parameters,
        accessible_topology: None,
    };
    let r = call(c.timeout, req, |r| ctl.get_capacity(r))
        .await
        .map_err(ClientError::Rpc)?;
    let mut lines = vec![("available", bytes_h(r.available_capacity))];
    if let Some(m) = r.maximum_volume_size {
        lines.push(("maximum volume size", bytes_h(m)));
    }
    if let Some(m) = r.minimum_volume_size {
        lines.push(("minimum volume size", bytes_h(m)));
    }
    Ok(Output {
        json: json!({
            "available_capacity": r.available_capacity,
            "maximum_volume_size": r.maximum_volume_size,
            "minimum_volume_size": r.minimum_volume_size,
        }),
        human: rows(&lines),
    })
}

/// `create`: CreateVolume; prints the volume the driver made. `range` is
/// `--size` and `--limit`.
async fn cmd_create(
    c: &Clients,
    name: &str,
    (size, limit): (Option<i64>, Option<i64>),
    pool: Option<&str>,
    cap: &CapabilityArgs,
    params: &[(String, String)],
    source: &SourceArgs,
) -> Result<Output, ClientError> {
    let parameters = param_map(pool, params).map_err(ClientError::Usage)?;
    let capacity_range = (size.is_some() || limit.is_some()).then(|| csi::CapacityRange {
        required_bytes: size.unwrap_or(0),
        limit_bytes: limit.unwrap_or(0),
    });
    let req = csi::CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range,
        volume_capabilities: vec![cap.to_csi()],
        parameters,
        volume_content_source: source.to_csi(),
        ..Default::default()
    };
    let mut ctl = c.controller.clone();
    let r = call(c.timeout, req, |r| ctl.create_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    let vol = r.volume.ok_or_else(|| {
        ClientError::Rpc(Status::internal("CreateVolume answered without a volume"))
    })?;
    Ok(Output {
        json: volume_json(&vol),
        human: rows(&volume_rows(&vol)),
    })
}

/// `delete`: DeleteVolume.
async fn cmd_delete(c: &Clients, volume_id: &str) -> Result<Output, ClientError> {
    let mut ctl = c.controller.clone();
    let req = csi::DeleteVolumeRequest {
        volume_id: volume_id.to_owned(),
        secrets: HashMap::new(),
    };
    call(c.timeout, req, |r| ctl.delete_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(Output {
        json: json!({ "volume_id": volume_id, "deleted": true }),
        human: rows(&[("deleted", volume_id.to_owned())]),
    })
}

/// `snapshot`: CreateSnapshot; prints the snapshot the driver made.
async fn cmd_snapshot(
    c: &Clients,
    name: &str,
    source: &str,
    params: &[(String, String)],
) -> Result<Output, ClientError> {
    let parameters = param_map(None, params).map_err(ClientError::Usage)?;
    let req = csi::CreateSnapshotRequest {
        source_volume_id: source.to_owned(),
        name: name.to_owned(),
        secrets: HashMap::new(),
        parameters,
    };
    let mut ctl = c.controller.clone();
    let r = call(c.timeout, req, |r| ctl.create_snapshot(r))
        .await
        .map_err(ClientError::Rpc)?;
    let snap = r.snapshot.ok_or_else(|| {
        ClientError::Rpc(Status::internal(
            "CreateSnapshot answered without a snapshot",
        ))
    })?;
    Ok(snapshot_output(&snap))
}

/// A snapshot as the documented JSON object and its text rows.
fn snapshot_output(s: &csi::Snapshot) -> Output {
    let created = s.creation_time.as_ref().map(|t| t.seconds);
    let mut lines = vec![
        ("snapshot_id", s.snapshot_id.clone()),
        ("source volume", s.source_volume_id.clone()),
        ("size", bytes_h(s.size_bytes)),
        (
            "ready",
            if s.ready_to_use { "yes" } else { "no" }.to_owned(),
        ),
    ];
    if let Some(secs) = created {
        lines.push(("created", format!("{secs} (seconds since the epoch)")));
    }
    Output {
        json: json!({
            "snapshot_id": s.snapshot_id,
            "source_volume_id": s.source_volume_id,
            "size_bytes": s.size_bytes,
            "ready_to_use": s.ready_to_use,
            "creation_time": created,
        }),
        human: rows(&lines),
    }
}

/// `delete-snapshot`: DeleteSnapshot.
async fn cmd_delete_snapshot(c: &Clients, snapshot_id: &str) -> Result<Output, ClientError> {
    let mut ctl = c.controller.clone();
    let req = csi::DeleteSnapshotRequest {
        snapshot_id: snapshot_id.to_owned(),
        secrets: HashMap::new(),
    };
    call(c.timeout, req, |r| ctl.delete_snapshot(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(Output {
        json: json!({ "snapshot_id": snapshot_id, "deleted": true }),
        human: rows(&[("deleted", snapshot_id.to_owned())]),
    })
}

/// The `expand` flags that decide and shape its NodeExpandVolume step.
struct NodeExpandStep<'a> {
    /// `--volume-path`: without it there is no node step.
    volume_path: Option<&'a str>,
    /// `--staging-path`.
    staging_path: Option<&'a str>,
    /// `--node`: call NodeExpandVolume even when the controller does not ask.
    always: bool,
}

/// `expand`: ControllerExpandVolume, then the node step when the driver asks
/// for it (or `--node`) and a volume path is given.
async fn cmd_expand(
    c: &Clients,
    volume_id: &str,
    size: i64,
    limit: Option<i64>,
    cap: &CapabilityArgs,
    node_step: NodeExpandStep<'_>,
) -> Result<Output, ClientError> {
    let range = csi::CapacityRange {
        required_bytes: size,
        limit_bytes: limit.unwrap_or(0),
    };
    let capability = cap.given().then(|| cap.to_csi());
    let mut ctl = c.controller.clone();
    let req = csi::ControllerExpandVolumeRequest {
        volume_id: volume_id.to_owned(),
        capacity_range: Some(range),
        secrets: HashMap::new(),
        volume_capability: capability.clone(),
    };
    let r = call(c.timeout, req, |r| ctl.controller_expand_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    let mut node_capacity = None;
    let mut lines = vec![
        ("volume_id", volume_id.to_owned()),
        ("capacity", bytes_h(r.capacity_bytes)),
    ];
    match node_step.volume_path {
        Some(path) if r.node_expansion_required || node_step.always => {
            let req = csi::NodeExpandVolumeRequest {
                volume_id: volume_id.to_owned(),
                volume_path: path.to_owned(),
                capacity_range: Some(range),
                staging_target_path: node_step.staging_path.unwrap_or_default().to_owned(),
                volume_capability: capability,
                secrets: HashMap::new(),
            };
            let bytes = node_expand(c, req).await?;
            node_capacity = Some(bytes);
            lines.push(("node expansion", format!("done at {path}")));
            if bytes != 0 {
                lines.push(("node capacity", bytes_h(bytes)));
            }
        }
        _ if r.node_expansion_required => lines.push((
            "node expansion",
            "required: run again with --volume-path to call NodeExpandVolume".to_owned(),
        )),
        _ => lines.push(("node expansion", "not required".to_owned())),
    }
    Ok(Output {
        json: json!({
            "volume_id": volume_id,
            "capacity_bytes": r.capacity_bytes,
            "node_expansion_required": r.node_expansion_required,
            "node_expanded": node_capacity.is_some(),
            "node_capacity_bytes": node_capacity,
        }),
        human: rows(&lines),
    })
}

/// NodeExpandVolume; returns the capacity the node reports (0: not reported).
async fn node_expand(c: &Clients, req: csi::NodeExpandVolumeRequest) -> Result<i64, ClientError> {
    let mut n = c.node.clone();
    let r = call(c.timeout, req, |r| n.node_expand_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(r.capacity_bytes)
}

/// `stage`: NodeStageVolume.
async fn cmd_stage(
    c: &Clients,
    volume_id: &str,
    staging_path: &str,
    cap: &CapabilityArgs,
    context: &[(String, String)],
    secret_files: &[(String, String)],
) -> Result<Output, ClientError> {
    let volume_context = param_map(None, context).map_err(ClientError::Usage)?;
    let secrets = read_secret_files(secret_files).map_err(ClientError::Usage)?;
    let mut n = c.node.clone();
    let req = csi::NodeStageVolumeRequest {
        volume_id: volume_id.to_owned(),
        publish_context: HashMap::new(),
        staging_target_path: staging_path.to_owned(),
        volume_capability: Some(cap.to_csi()),
        secrets,
        volume_context,
    };
    call(c.timeout, req, |r| n.node_stage_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(Output {
        json: json!({ "volume_id": volume_id, "staging_target_path": staging_path, "staged": true }),
        human: rows(&[
            ("staged", volume_id.to_owned()),
            ("at", staging_path.to_owned()),
        ]),
    })
}

/// `unstage`: NodeUnstageVolume.
async fn cmd_unstage(
    c: &Clients,
    volume_id: &str,
    staging_path: &str,
) -> Result<Output, ClientError> {
    let mut n = c.node.clone();
    let req = csi::NodeUnstageVolumeRequest {
        volume_id: volume_id.to_owned(),
        staging_target_path: staging_path.to_owned(),
    };
    call(c.timeout, req, |r| n.node_unstage_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(Output {
        json: json!({ "volume_id": volume_id, "staging_target_path": staging_path, "unstaged": true }),
        human: rows(&[
            ("unstaged", volume_id.to_owned()),
            ("from", staging_path.to_owned()),
        ]),
    })
}

/// `publish`: NodePublishVolume.
async fn cmd_publish(
    c: &Clients,
    volume_id: &str,
    target_path: &str,
    staging_path: Option<&str>,
    readonly: bool,
    cap: &CapabilityArgs,
    context: &[(String, String)],
) -> Result<Output, ClientError> {
    let volume_context = param_map(None, context).map_err(ClientError::Usage)?;
    let mut n = c.node.clone();
    let req = csi::NodePublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        publish_context: HashMap::new(),
        staging_target_path: staging_path.unwrap_or_default().to_owned(),
        target_path: target_path.to_owned(),
        volume_capability: Some(cap.to_csi()),
        readonly,
        secrets: HashMap::new(),
        volume_context,
    };
    call(c.timeout, req, |r| n.node_publish_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    let at = if readonly {
        format!("{target_path} (read-only)")
    } else {
        target_path.to_owned()
    };
    Ok(Output {
        json: json!({ "volume_id": volume_id, "target_path": target_path, "published": true }),
        human: rows(&[("published", volume_id.to_owned()), ("at", at)]),
    })
}

/// `unpublish`: NodeUnpublishVolume.
async fn cmd_unpublish(
    c: &Clients,
    volume_id: &str,
    target_path: &str,
) -> Result<Output, ClientError> {
    let mut n = c.node.clone();
    let req = csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: target_path.to_owned(),
    };
    call(c.timeout, req, |r| n.node_unpublish_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(Output {
        json: json!({ "volume_id": volume_id, "target_path": target_path, "unpublished": true }),
        human: rows(&[
            ("unpublished", volume_id.to_owned()),
            ("from", target_path.to_owned()),
        ]),
    })
}

/// `stats`: NodeGetVolumeStats.
async fn cmd_stats(
    c: &Clients,
    volume_id: &str,
    volume_path: &str,
    staging_path: Option<&str>,
) -> Result<Output, ClientError> {
    let mut n = c.node.clone();
    let req = csi::NodeGetVolumeStatsRequest {
        volume_id: volume_id.to_owned(),
        volume_path: volume_path.to_owned(),
        staging_target_path: staging_path.unwrap_or_default().to_owned(),
    };
    let r = call(c.timeout, req, |r| n.node_get_volume_stats(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(stats_output(volume_id, volume_path, &r))
}

/// What `info` learns from the driver's identity, node and controller services.
struct DriverInfo {
    plugin: csi::GetPluginInfoResponse,
    plugin_caps: Vec<String>,
    /// `None`: the driver does not serve NodeGetInfo.
    node_info: Option<csi::NodeGetInfoResponse>,
    /// `None`: no controller service, or ControllerGetCapabilities unimplemented.
    controller_caps: Option<Vec<String>>,
    /// `None`: the driver does not serve NodeGetCapabilities.
    node_caps: Option<Vec<String>>,
}

/// `info`: asks every service what it is and can do, then prints it.
async fn info(c: &Clients) -> Result<Output, ClientError> {
    let info = fetch_info(c).await?;
    Ok(Output {
        json: info_json(&info),
        human: rows(&info_rows(&info)),
    })
}

/// The RPCs behind `info`, in this order: GetPluginInfo,
/// GetPluginCapabilities, NodeGetInfo, NodeGetCapabilities, and
/// ControllerGetCapabilities only when the plugin has a controller service.
async fn fetch_info(c: &Clients) -> Result<DriverInfo, ClientError> {
    let t = c.timeout;
    let mut id = c.identity.clone();
    let plugin = call(t, csi::GetPluginInfoRequest {}, |r| id.get_plugin_info(r))
        .await
        .map_err(ClientError::Rpc)?;
    let pcaps = call(t, csi::GetPluginCapabilitiesRequest {}, |r| {
        id.get_plugin_capabilities(r)
    })
    .await
    .map_err(ClientError::Rpc)?;
    let (plugin_caps, has_controller) = plugin_cap_names(&pcaps);

    let mut node = c.node.clone();
    let node_info = optional(call(t, csi::NodeGetInfoRequest {}, |r| node.node_get_info(r)).await)?;
    let node_caps = optional(
        call(t, csi::NodeGetCapabilitiesRequest {}, |r| {
            node.node_get_capabilities(r)
        })
        .await,
    )?
    .map(|r| node_cap_names(&r));
    let controller_caps = if has_controller {
        let mut ctl = c.controller.clone();
        optional(
            call(t, csi::ControllerGetCapabilitiesRequest {}, |r| {
                ctl.controller_get_capabilities(r)
            })
            .await,
        )?
        .map(|r| controller_cap_names(&r))
    } else {
        None
    };
    Ok(DriverInfo {
        plugin,
        plugin_caps,
        node_info,
        controller_caps,
        node_caps,
    })
}

/// The capability names a driver's GetPluginCapabilities lists, and whether
/// one of them is CONTROLLER_SERVICE.
fn plugin_cap_names(r: &csi::GetPluginCapabilitiesResponse) -> (Vec<String>, bool) {
    use csi::plugin_capability::{service, volume_expansion, Type as PType};
    let mut has_controller = false;
    let names = r
        .capabilities
        .iter()
        .map(|cap| match &cap.r#type {
            Some(PType::Service(s)) => {
                let name = enum_name(s.r#type, |v| {
                    service::Type::try_from(v).ok().map(|t| t.as_str_name())
                });
                has_controller |= name == "CONTROLLER_SERVICE";
                name
            }
            Some(PType::VolumeExpansion(e)) => format!(
                "VOLUME_EXPANSION_{}",
                enum_name(e.r#type, |v| {
                    volume_expansion::Type::try_from(v)
                        .ok()
                        .map(|t| t.as_str_name())
                })
            ),
            None => "UNKNOWN".to_owned(),
        })
        .collect();
    (names, has_controller)
}

/// `info`'s text form, one labelled row per fact.
fn info_rows(info: &DriverInfo) -> Vec<(&'static str, String)> {
    let plugin = &info.plugin;
    let mut lines = vec![
        ("driver", plugin.name.clone()),
        ("version", plugin.vendor_version.clone()),
    ];
    if !plugin.manifest.is_empty() {
        lines.push(("manifest", segments_h(&plugin.manifest)));
    }
    lines.push(("plugin capabilities", list_h(&info.plugin_caps)));
    match &info.node_info {
        Some(n) => {
            lines.push(("node id", n.node_id.clone()));
            lines.push((
                "max volumes per node",
                if n.max_volumes_per_node == 0 {
                    "unlimited".to_owned()
                } else {
                    n.max_volumes_per_node.to_string()
                },
            ));
            if let Some(topo) = &n.accessible_topology {
                lines.push(("node topology", segments_h(&topo.segments)));
            }
        }
        None => lines.push(("node", "not served (UNIMPLEMENTED)".to_owned())),
    }
    lines.push((
        "controller capabilities",
        info.controller_caps
            .as_deref()
            .map_or_else(|| "no controller service".to_owned(), list_h),
    ));
    lines.push((
        "node capabilities",
        info.node_caps
            .as_deref()
            .map_or_else(|| "no node service".to_owned(), list_h),
    ));
    lines
}

/// `info`'s JSON form (fields as in the module docs).
fn info_json(info: &DriverInfo) -> Value {
    let node_json = info.node_info.as_ref().map(|n| {
        json!({
            "node_id": n.node_id,
            "max_volumes_per_node": n.max_volumes_per_node,
            "accessible_topology": n.accessible_topology.as_ref().map(|t| segments_json(&t.segments)),
        })
    });
    json!({
        "name": info.plugin.name,
        "vendor_version": info.plugin.vendor_version,
        "manifest": segments_json(&info.plugin.manifest),
        "plugin_capabilities": info.plugin_caps,
        "node": node_json,
        "controller_capabilities": info.controller_caps,
        "node_capabilities": info.node_caps,
    })
}

/// UNIMPLEMENTED means "this driver does not serve that": `None`, not an error.
fn optional<T>(r: Result<T, Status>) -> Result<Option<T>, ClientError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(s) if s.code() == Code::Unimplemented => Ok(None),
        Err(s) => Err(ClientError::Rpc(s)),
    }
}

/// The RPC names a driver's NodeGetCapabilities lists.
pub fn node_cap_names(r: &csi::NodeGetCapabilitiesResponse) -> Vec<String> {
    use csi::node_service_capability::{rpc::Type, Type as T};
    r.capabilities
        .iter()
        .map(|c| match &c.r#type {
            Some(T::Rpc(rpc)) => enum_name(rpc.r#type, |v| {
                Type::try_from(v).ok().map(|t| t.as_str_name())
            }),
            None => "UNKNOWN".to_owned(),
        })
        .collect()
}

/// The RPC names a driver's ControllerGetCapabilities lists.
pub fn controller_cap_names(r: &csi::ControllerGetCapabilitiesResponse) -> Vec<String> {
    use csi::controller_service_capability::{rpc::Type, Type as T};
    r.capabilities
        .iter()
        .map(|c| match &c.r#type {
            Some(T::Rpc(rpc)) => enum_name(rpc.r#type, |v| {
                Type::try_from(v).ok().map(|t| t.as_str_name())
            }),
            None => "UNKNOWN".to_owned(),
        })
        .collect()
}

/// A proto enum's name, or `UNKNOWN(n)` for a value this client does not know.
fn enum_name(v: i32, name: impl FnOnce(i32) -> Option<&'static str>) -> String {
    name(v).map_or_else(|| format!("UNKNOWN({v})"), str::to_owned)
}

async fn list(
    c: &Clients,
    max_entries: i32,
    starting_token: &str,
    all: bool,
) -> Result<Output, ClientError> {
    let mut ctl = c.controller.clone();
    let mut token = starting_token.to_owned();
    let mut seen = HashSet::new();
    let mut entries = Vec::new();
    let next = loop {
        let req = csi::ListVolumesRequest {
            max_entries,
            starting_token: token.clone(),
        };
        let r = call(c.timeout, req, |r| ctl.list_volumes(r))
            .await
            .map_err(ClientError::Rpc)?;
        entries.extend(r.entries);
        if !all || r.next_token.is_empty() {
            break r.next_token;
        }
        if !seen.insert(r.next_token.clone()) {
            return Err(ClientError::Rpc(Status::internal(format!(
                "the driver returned next_token {:?} twice; stopping",
                r.next_token
            ))));
        }
        token = r.next_token;
    };
    let json_entries: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = e.volume.as_ref().map_or_else(|| json!({}), volume_json);
            v["published_node_ids"] = json!(e.status.as_ref().map(|s| &s.published_node_ids));
            if let Some(cond) = e.status.as_ref().and_then(|s| s.volume_condition.as_ref()) {
                v["volume_condition"] =
                    json!({ "abnormal": cond.abnormal, "message": cond.message });
            }
            v
        })
        .collect();
    let mut table = vec![vec![
        "VOLUME_ID".to_owned(),
        "CAPACITY".to_owned(),
        "TOPOLOGY".to_owned(),
        "PUBLISHED_ON".to_owned(),
    ]];
    for e in &entries {
        let Some(v) = &e.volume else { continue };
        table.push(vec![
            v.volume_id.clone(),
            bytes_h(v.capacity_bytes),
            topologies_h(&v.accessible_topology),
            e.status
                .as_ref()
                .map_or_else(|| "-".to_owned(), |s| list_h(&s.published_node_ids)),
        ]);
    }
    let mut human = columns(&table);
    human.push_str(&format!("{} volume(s)\n", entries.len()));
    if !next.is_empty() {
        human.push_str(&format!("next token: {next}\n"));
    }
    Ok(Output {
        json: json!({ "entries": json_entries, "next_token": next }),
        human,
    })
}

fn stats_output(volume_id: &str, path: &str, r: &csi::NodeGetVolumeStatsResponse) -> Output {
    use csi::volume_usage::Unit;
    let mut lines = vec![
        ("volume_id", volume_id.to_owned()),
        ("path", path.to_owned()),
    ];
    let mut usage = Vec::new();
    for u in &r.usage {
        let unit = Unit::try_from(u.unit).unwrap_or(Unit::Unknown);
        let fmt = |n: i64| match unit {
            Unit::Bytes => bytes_h(n),
            _ => n.to_string(),
        };
        let label = match unit {
            Unit::Bytes => "bytes",
            Unit::Inodes => "inodes",
            Unit::Unknown => "unknown unit",
        };
        lines.push((
            label,
            format!(
                "{} used of {}, {} available",
                fmt(u.used),
                fmt(u.total),
                fmt(u.available)
            ),
        ));
        usage.push(json!({
            "unit": enum_name(u.unit, |v| Unit::try_from(v).ok().map(|t| t.as_str_name())),
            "available": u.available,
            "total": u.total,
            "used": u.used,
        }));
    }
    if let Some(c) = &r.volume_condition {
        lines.push((
            "condition",
            if c.abnormal {
                format!("ABNORMAL: {}", c.message)
            } else {
                format!("ok ({})", c.message)
            },
        ));
    }
    Output {
        json: json!({
            "volume_id": volume_id,
            "volume_path": path,
            "usage": usage,
            "volume_condition": r.volume_condition.as_ref().map(|c| json!({"abnormal": c.abnormal, "message": c.message})),
        }),
        human: rows(&lines),
    }
}

/// A volume as the documented JSON object.
pub fn volume_json(v: &csi::Volume) -> Value {
    json!({
        "volume_id": v.volume_id,
        "capacity_bytes": v.capacity_bytes,
        "volume_context": segments_json(&v.volume_context),
        "accessible_topology": v.accessible_topology.iter().map(|t| segments_json(&t.segments)).collect::<Vec<_>>(),
    })
}

fn volume_rows(v: &csi::Volume) -> Vec<(&'static str, String)> {
    let mut lines = vec![
        ("volume_id", v.volume_id.clone()),
        ("capacity", bytes_h(v.capacity_bytes)),
    ];
    if !v.accessible_topology.is_empty() {
        lines.push(("topology", topologies_h(&v.accessible_topology)));
    }
    if !v.volume_context.is_empty() {
        lines.push(("context", segments_h(&v.volume_context)));
    }
    lines
}

/// A string map as a JSON object with sorted keys.
fn segments_json(m: &HashMap<String, String>) -> Value {
    json!(m.iter().collect::<BTreeMap<_, _>>())
}

fn segments_h(m: &HashMap<String, String>) -> String {
    let sorted: BTreeMap<_, _> = m.iter().collect();
    sorted
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn topologies_h(t: &[csi::Topology]) -> String {
    if t.is_empty() {
        return "-".to_owned();
    }
    t.iter()
        .map(|t| segments_h(&t.segments))
        .collect::<Vec<_>>()
        .join(" ")
}

fn list_h(items: &[String]) -> String {
    if items.is_empty() {
        "-".to_owned()
    } else {
        items.join(", ")
    }
}

/// A CSI byte count for humans (`10Mi`); negative counts are shown as they are.
pub fn bytes_h(n: i64) -> String {
    u64::try_from(n).map_or_else(|_| n.to_string(), human)
}

/// `label  value` lines with the values aligned.
pub fn rows(lines: &[(&str, String)]) -> String {
    let width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    lines
        .iter()
        .map(|(l, v)| format!("{l:<width$}  {v}\n"))
        .collect()
}

/// A table with left-aligned columns separated by two spaces.
pub fn columns(table: &[Vec<String>]) -> String {
    let ncols = table.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..ncols)
        .map(|i| {
            table
                .iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in table {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(cell);
                let pad = widths[i] - cell.chars().count() + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
    out
}

/// A path flag as the CSI string; non-UTF-8 paths are refused.
pub fn path_str(p: &std::path::Path) -> Result<String, String> {
    p.to_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("path {p:?} is not UTF-8; CSI paths are strings"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ClientArgs,
    }

    fn parse(argv: &[&str]) -> Result<ClientArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("client").chain(argv.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn params_split_at_the_first_equals() {
        assert_eq!(
            parse_param("pool=fast").unwrap(),
            ("pool".into(), "fast".into())
        );
        assert_eq!(parse_param("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert_eq!(
            parse_param("empty=").unwrap(),
            ("empty".into(), String::new())
        );
        for bad in ["novalue", "=v", ""] {
            assert!(parse_param(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pool_is_shorthand_and_conflicts_are_errors() {
        let m = param_map(Some("fast"), &[("x".into(), "1".into())]).unwrap();
        assert_eq!(m.get("pool").map(String::as_str), Some("fast"));
        assert_eq!(m.get("x").map(String::as_str), Some("1"));
        // The same value twice is fine; two values for one key are not.
        assert!(param_map(Some("a"), &[("pool".into(), "a".into())]).is_ok());
        assert!(param_map(Some("a"), &[("pool".into(), "b".into())]).is_err());
        assert!(param_map(None, &[("k".into(), "1".into()), ("k".into(), "2".into())]).is_err());
    }

    #[test]
    fn sizes_fit_csi_int64() {
        assert_eq!(parse_size_arg("10Mi").unwrap(), 10 << 20);
        assert_eq!(parse_size_arg("1Gi").unwrap(), 1 << 30);
        assert_eq!(parse_size_arg("4096").unwrap(), 4096);
        assert!(parse_size_arg("9000Pi").is_err(), "beyond i64");
        assert!(parse_size_arg("ten").is_err());
    }

    #[test]
    fn modes_map_to_the_proto() {
        let cases = [
            ("single-node-writer", Mode::SingleNodeWriter),
            ("single-node-reader-only", Mode::SingleNodeReaderOnly),
            ("single-node-single-writer", Mode::SingleNodeSingleWriter),
            ("single-node-multi-writer", Mode::SingleNodeMultiWriter),
            ("multi-node-multi-writer", Mode::MultiNodeMultiWriter),
        ];
        for (flag, mode) in cases {
            assert_eq!(AccessModeArg::from_str(flag, false).unwrap().to_csi(), mode);
        }
        assert!(AccessModeArg::from_str("rwx", false).is_err());
    }

    #[test]
    fn create_flags_build_the_request_parts() {
        let a = parse(&[
            "create",
            "v1",
            "--size",
            "10Mi",
            "--fs",
            "xfs",
            "--mode",
            "single-node-reader-only",
            "--mount-flag",
            "noexec",
            "--pool",
            "fast",
            "--param",
            "csi.storage.k8s.io/pvc/name=data",
        ])
        .unwrap();
        let ClientCommand::Create {
            name,
            size,
            limit,
            pool,
            cap,
            params,
            source,
        } = a.command
        else {
            panic!("not create");
        };
        assert!(source.to_csi().is_none(), "no source: an empty volume");
        assert_eq!((name.as_str(), size, limit), ("v1", Some(10 << 20), None));
        let m = param_map(pool.as_deref(), &params).unwrap();
        assert_eq!(m.len(), 2);
        let c = cap.to_csi();
        assert_eq!(
            c.access_mode.unwrap().mode,
            Mode::SingleNodeReaderOnly as i32
        );
        match c.access_type {
            Some(csi::volume_capability::AccessType::Mount(m)) => {
                assert_eq!(m.fs_type, "xfs");
                assert_eq!(m.mount_flags, ["noexec"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn block_access_and_defaults() {
        let a = parse(&["stage", "id", "--staging-path", "/s", "--block"]).unwrap();
        let ClientCommand::Stage { cap, .. } = a.command else {
            panic!()
        };
        let c = cap.to_csi();
        assert!(matches!(
            c.access_type,
            Some(csi::volume_capability::AccessType::Block(_))
        ));
        assert_eq!(c.access_mode.unwrap().mode, Mode::SingleNodeWriter as i32);
        // Block access takes neither a filesystem nor mount flags.
        assert!(parse(&[
            "stage",
            "id",
            "--staging-path",
            "/s",
            "--block",
            "--fs",
            "ext4"
        ])
        .is_err());
        // Expand sends a capability only when one was asked for.
        let a = parse(&["expand", "id", "--size", "1Gi"]).unwrap();
        let ClientCommand::Expand { cap, .. } = a.command else {
            panic!()
        };
        assert!(!cap.given());
    }

    #[test]
    fn snapshot_flags_and_content_sources() {
        use csi::volume_content_source::Type;
        let a = parse(&[
            "snapshot",
            "s1",
            "--source",
            "thick.v1",
            "--param",
            "snapshotSize=16Mi",
        ])
        .unwrap();
        let ClientCommand::Snapshot {
            name,
            source,
            params,
        } = a.command
        else {
            panic!("not snapshot");
        };
        assert_eq!((name.as_str(), source.as_str()), ("s1", "thick.v1"));
        assert_eq!(params, [("snapshotSize".to_owned(), "16Mi".to_owned())]);
        assert!(parse(&["snapshot", "s1"]).is_err(), "--source is required");

        let a = parse(&["delete-snapshot", "thick.s1"]).unwrap();
        assert!(
            matches!(a.command, ClientCommand::DeleteSnapshot { snapshot_id } if snapshot_id == "thick.s1")
        );

        let source = |argv: &[&str]| {
            let ClientCommand::Create { source, .. } = parse(argv).unwrap().command else {
                panic!("not create");
            };
            source.to_csi().and_then(|s| s.r#type)
        };
        match source(&["create", "r", "--from-snapshot", "thick.s1"]) {
            Some(Type::Snapshot(s)) => assert_eq!(s.snapshot_id, "thick.s1"),
            other => panic!("{other:?}"),
        }
        match source(&["create", "c", "--from-volume", "thick.v1"]) {
            Some(Type::Volume(v)) => assert_eq!(v.volume_id, "thick.v1"),
            other => panic!("{other:?}"),
        }
        assert!(
            parse(&["create", "x", "--from-snapshot", "a", "--from-volume", "b"]).is_err(),
            "one content source at most"
        );
    }

    #[test]
    fn snapshot_json_has_the_documented_shape() {
        let s = csi::Snapshot {
            size_bytes: 4096,
            snapshot_id: "p.s".into(),
            source_volume_id: "p.v".into(),
            creation_time: Some(prost_types::Timestamp {
                seconds: 7,
                nanos: 5,
            }),
            ready_to_use: true,
            group_snapshot_id: String::new(),
        };
        assert_eq!(
            snapshot_output(&s).json,
            json!({"snapshot_id": "p.s", "source_volume_id": "p.v", "size_bytes": 4096,
                   "ready_to_use": true, "creation_time": 7})
        );
        let s = csi::Snapshot {
            creation_time: None,
            ..s
        };
        assert_eq!(snapshot_output(&s).json["creation_time"], Value::Null);
    }

    #[test]
    fn global_flags_go_anywhere_and_errors_use_grpc_names() {
        let a = parse(&["probe", "--json", "--endpoint", "tcp://127.0.0.1:9"]).unwrap();
        assert!(a.json);
        assert_eq!(a.endpoint, Endpoint::Tcp("127.0.0.1:9".parse().unwrap()));
        assert!(parse(&["create", "v", "--size", "lots"]).is_err());
        assert!(parse(&["create", "v", "--param", "nokey"]).is_err());
        let e = ClientError::Rpc(Status::not_found("volume x does not exist"));
        assert_eq!(e.to_string(), "NOT_FOUND: volume x does not exist");
        assert_eq!(code_name(Code::FailedPrecondition), "FAILED_PRECONDITION");
    }

    #[test]
    fn human_output_is_aligned() {
        let s = rows(&[("a", "1".into()), ("long label", "2".into())]);
        assert_eq!(s, "a           1\nlong label  2\n");
        let t = columns(&[
            vec!["ID".into(), "SIZE".into()],
            vec!["abcdef".into(), "1Mi".into()],
        ]);
        assert_eq!(t, "ID      SIZE\nabcdef  1Mi\n");
        assert_eq!(bytes_h(10 << 20), "10Mi");
        assert_eq!(bytes_h(-1), "-1");
    }

    #[test]
    fn volume_json_has_the_documented_shape() {
        let v = csi::Volume {
            capacity_bytes: 4096,
            volume_id: "p.k".into(),
            volume_context: HashMap::new(),
            content_source: None,
            accessible_topology: vec![csi::Topology {
                segments: HashMap::from([("zone".to_owned(), "n1".to_owned())]),
            }],
        };
        assert_eq!(
            volume_json(&v),
            json!({"volume_id": "p.k", "capacity_bytes": 4096, "volume_context": {},
                   "accessible_topology": [{"zone": "n1"}]})
        );
    }
}
