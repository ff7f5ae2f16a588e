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
//! | `probe`     | `{"ready": bool\|null}` (with `--wait SECS`: once ready, or exit 1 after SECS) |
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
//! | `metadata allocated\|delta` | `{"block_metadata_type", "volume_capacity_bytes", "runs": [{"byte_offset", "size_bytes"}], "run_count", "bytes", "granularity_bytes": n\|null, "messages"}` |
//!
//! `metadata` reads the SnapshotMetadata service's whole stream; as text it
//! prints one run a line, `OFFSET LENGTH` in bytes as the driver sent them
//! (`--merged`: sorted, adjacent ones joined), then one summary line that
//! starts with `#`. `run_count` and `bytes` count the runs as sent;
//! `granularity_bytes` is the largest length all their offsets and lengths
//! are multiples of (the run ending the volume's length aside).
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

use crate::requests::{self, NodeVolume};
use localvol::csi;
use localvol::csi::controller_client::ControllerClient;
use localvol::csi::identity_client::IdentityClient;
use localvol::csi::node_client::NodeClient;
use localvol::csi::snapshot_metadata_client::SnapshotMetadataClient;
use localvol::csi::volume_capability::access_mode::Mode;
use localvol::endpoint::Endpoint;
use localvol::size::{human, parse_size};

mod args;
mod commands;
mod info;
mod metadata;
mod output;

pub use args::*;
use commands::*;
pub use info::*;
pub use metadata::*;
pub use output::*;

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
    Probe {
        /// Wait up to SECS for a ready answer: retry while the socket is
        /// absent or refuses, the driver answers UNAVAILABLE, or Probe says
        /// not ready (the pools still open); any other error ends it.
        #[arg(long, value_name = "SECS")]
        wait: Option<u64>,
    },
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
    /// SnapshotMetadata (changed-block tracking): the allocated or changed
    /// byte ranges of snapshots, one run a line.
    #[command(subcommand)]
    Metadata(MetadataCommand),
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
    pub metadata: SnapshotMetadataClient<Channel>,
    pub timeout: Duration,
}

impl Clients {
    pub fn new(channel: Channel, timeout: Duration) -> Self {
        Clients {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel.clone()),
            metadata: SnapshotMetadataClient::new(channel),
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
    let timeout = Duration::from_secs(args.timeout.max(1));
    let res = async {
        if let ClientCommand::Probe { wait: Some(secs) } = args.command {
            return wait_ready(&args.endpoint, Duration::from_secs(secs), timeout).await;
        }
        let channel = connect(&args.endpoint).await?;
        let clients = Clients::new(channel, timeout);
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
        ClientCommand::Probe { .. } => cmd_probe(c).await,
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
        ClientCommand::List {
            max_entries,
            starting_token,
            all,
        } => list(c, *max_entries, starting_token, *all).await,
        ClientCommand::Metadata(m) => cmd_metadata(c, m).await,
        node => run_node(c, node).await,
    }
}

/// The node commands of [`run`].
async fn run_node(c: &Clients, cmd: &ClientCommand) -> Result<Output, ClientError> {
    match cmd {
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
        _ => unreachable!("run answers the identity and controller commands"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// A driver on an embedded dir pool below `dir`, serving `endpoint`.
    fn serve_options(endpoint: &Endpoint, dir: &std::path::Path) -> localvol::server::ServeOptions {
        localvol::server::ServeOptions {
            endpoint: endpoint.clone(),
            node_id: "node-a".into(),
            driver_name: "localvol.csi.dev".into(),
            config: localvol::config::Config::embedded(&dir.join("pools")),
            kubelet_dir: dir.join("kubelet"),
            socket_group: None,
            metrics_addr: None,
            liveness_addr: None,
            liveness_deadline: Duration::from_secs(60),
            namespace: "localvol".into(),
            kube_api: None,
            pool_check_interval: Duration::from_secs(3600),
            metrics_wait: Duration::from_secs(5),
        }
    }
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

    /// `probe --wait` sees a starting driver through: no socket yet, then
    /// "not ready" while the pools open, then ready; and gives up with the
    /// last reason when nothing answers.
    #[tokio::test]
    async fn probe_wait_returns_once_the_pools_are_open() {
        use localvol::server::{build_driver, serve_opening};
        let dir = tempfile::tempdir().unwrap();
        let endpoint = Endpoint::Unix(dir.path().join("csi.sock"));
        let t = Duration::from_secs(5);
        let e = wait_ready(&endpoint, Duration::from_millis(300), t)
            .await
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with("not ready after 0 s: cannot connect"),
            "{e}"
        );

        let opts = serve_options(&endpoint, dir.path());
        let (go, opening) = tokio::sync::oneshot::channel::<()>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let waiter = {
            let endpoint = endpoint.clone();
            tokio::spawn(async move { wait_ready(&endpoint, Duration::from_secs(60), t).await })
        };
        let server = tokio::spawn(async move {
            let open = async {
                let _ = opening.await;
                build_driver(&opts).await
            };
            serve_opening(&opts, open, async {
                let _ = stopped.await;
            })
            .await
        });
        // The socket is up and answers "not ready": the waiter keeps waiting.
        let c = Clients::new(connect_soon(&endpoint).await, t);
        assert_eq!(cmd_probe(&c).await.unwrap().json, json!({"ready": false}));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished());
        go.send(()).unwrap();
        let out = waiter.await.unwrap().unwrap();
        assert_eq!(out.json, json!({"ready": true}));
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    async fn connect_soon(endpoint: &Endpoint) -> Channel {
        for _ in 0..500 {
            if let Ok(c) = connect(endpoint).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{endpoint} never accepted a connection");
    }

    #[test]
    fn metadata_flags() {
        let a = parse(&[
            "metadata",
            "delta",
            "p.a",
            "p.b",
            "--starting-offset",
            "1Mi",
            "--max-results",
            "5",
        ])
        .unwrap();
        let ClientCommand::Metadata(MetadataCommand::Delta {
            base_snapshot_id,
            target_snapshot_id,
            paging,
        }) = a.command
        else {
            panic!("not metadata delta");
        };
        assert_eq!(
            (base_snapshot_id.as_str(), target_snapshot_id.as_str()),
            ("p.a", "p.b")
        );
        assert_eq!((paging.starting_offset, paging.max_results), (1 << 20, 5));
        let a = parse(&["metadata", "allocated", "p.a", "--json"]).unwrap();
        let ClientCommand::Metadata(MetadataCommand::Allocated { paging, .. }) = a.command else {
            panic!("not metadata allocated");
        };
        assert_eq!(
            (paging.starting_offset, paging.max_results, a.json),
            (0, 0, true)
        );
        assert!(parse(&["metadata", "allocated", "p.a", "--max-results", "-1"]).is_err());
        assert!(
            parse(&["metadata", "delta", "p.a"]).is_err(),
            "delta needs two snapshots"
        );
    }

    /// A driver without a thin pool answers UNIMPLEMENTED: the command's
    /// error is that status, worded as the other commands' errors.
    #[tokio::test]
    async fn metadata_errors_are_the_drivers_status() {
        use localvol::server::serve;
        let dir = tempfile::tempdir().unwrap();
        let endpoint = Endpoint::Unix(dir.path().join("csi.sock"));
        let opts = serve_options(&endpoint, dir.path());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            serve(opts, async {
                let _ = stopped.await;
            })
            .await
        });
        let t = Duration::from_secs(5);
        wait_ready(&endpoint, Duration::from_secs(60), t)
            .await
            .unwrap();
        let c = Clients::new(connect_soon(&endpoint).await, t);
        let cmd = ClientCommand::Metadata(MetadataCommand::Allocated {
            snapshot_id: "default.0123".into(),
            paging: PagingArgs::default(),
        });
        let e = run(&c, &cmd).await.err().expect("an error");
        assert!(e.to_string().starts_with("UNIMPLEMENTED: "), "{e}");
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
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
