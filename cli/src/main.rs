//! `localvol`: the CSI driver, a CSI client and a benchmark, as subcommands.
//!
//! This crate is the one binary: `serve` and `controller` run the driver
//! library (`localvol`); `client` (one RPC at a time, for operators) and
//! `bench` (lifecycle benchmarks against any CSI driver's socket) live here
//! only. They use the library as any client would (endpoints, sizes, the
//! proto bindings, and the LVM and mount helpers of the bench's bare floor);
//! the library knows nothing of them.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use localvol::config::Config;
use localvol::endpoint::Endpoint;
use localvol::server::{self, ServeOptions};

/// The CSI driver name `serve` registers and `controller` manages by default.
const DEFAULT_DRIVER_NAME: &str = "localvol.csi.dev";

mod bench;
mod client;
mod config;
mod requests;

#[derive(Parser)]
#[command(
    name = "localvol",
    version = localvol::VERSION,
    about = "Kubernetes CSI driver for node-local storage"
)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// `init_logging` reads it; said in --help, where deploy/validate looks for the env names.
const LOG_ENV_HELP: &str = "Environment: RUST_LOG, the log filter (default: info).";

#[derive(Subcommand)]
enum Command {
    /// Run the CSI driver (Identity, Controller and Node services).
    #[command(after_help = LOG_ENV_HELP)]
    Serve(ServeArgs),
    /// A CSI client for any driver's socket (probe, create, stage, publish, ...).
    Client(client::ClientArgs),
    /// Benchmark whole volume lifecycles through any CSI driver, or the syscall floor.
    Bench(bench::BenchArgs),
    /// Cluster-wide node-loss controller (a Deployment, leader-elected on a Lease).
    #[command(after_help = LOG_ENV_HELP)]
    Controller(ControllerArgs),
    /// Check driver config files and classes with the driver's own rules.
    #[command(subcommand)]
    Config(config::ConfigCommand),
}

#[derive(clap::Args)]
struct ControllerArgs {
    /// CSI driver name whose PVs are managed.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// This replica's identity in the Lease. Default: the hostname (pod name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    lease_namespace: String,
    #[arg(long, default_value = "localvol-controller")]
    lease_name: String,
    /// Seconds a Lease stays valid without renewal.
    #[arg(long, default_value_t = 15)]
    lease_duration: u64,
    /// Seconds a Node must stay deleted before its PVs (and opted-in PVCs) are deleted.
    #[arg(long, default_value_t = 300)]
    node_loss_grace: u64,
    /// Seconds between passes while leading.
    #[arg(long, default_value_t = 30)]
    interval: u64,
}

async fn controller(args: ControllerArgs) -> Result<(), String> {
    use std::time::Duration;
    if args.lease_duration < 3 {
        return Err("--lease-duration must be at least 3 seconds".into());
    }
    let identity = match args.identity {
        Some(i) => i,
        None => nix::unistd::gethostname()
            .map_err(|e| format!("reading hostname: {e}"))?
            .to_string_lossy()
            .into_owned(),
    };
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("kubernetes client: {e}"))?;
    localvol::controller::run(
        client,
        localvol::controller::ControllerOptions {
            driver_name: args.driver_name,
            identity,
            lease_namespace: args.lease_namespace,
            lease_name: args.lease_name,
            lease_duration: Duration::from_secs(args.lease_duration),
            grace: Duration::from_secs(args.node_loss_grace),
            interval: Duration::from_secs(args.interval.max(1)),
        },
    )
    .await
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Where to listen: unix:///path/csi.sock, or tcp://host:port for debugging.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        default_value = "unix:///run/localvol/csi.sock"
    )]
    endpoint: Endpoint,
    /// This node's id (the topology value volumes are pinned to). Default: hostname.
    #[arg(long, env = "NODE_NAME")]
    node_id: Option<String>,
    /// YAML config listing the pools. Without it: one directory pool under --data-dir.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Folder for the embedded default pool (used only without --config).
    #[arg(long, default_value = "/var/lib/localvol")]
    data_dir: PathBuf,
    /// CSI driver name.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// kubelet's root directory; staging and target paths must lie below it.
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,
    /// Group allowed to use the socket (mode 0660 instead of 0600).
    #[arg(long)]
    socket_group: Option<String>,
    /// Serve Prometheus /metrics, /healthz and /readyz here (e.g. :9808).
    #[arg(long, value_parser = parse_metrics_addr)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Serve the liveness verdict, GET /healthz, here (e.g. :9809), from a
    /// thread of its own: 500 only when the driver is dead (its socket gone or
    /// refusing, its runtime stuck, or no Probe through the socket answered
    /// for --liveness-deadline); a slow driver is alive. Off when unset.
    #[arg(long, value_parser = parse_metrics_addr)]
    liveness_addr: Option<std::net::SocketAddr>,
    /// Seconds without an answer (runtime tick, Probe) that count as dead.
    #[arg(long, default_value_t = localvol::liveness::DEFAULT_DEADLINE.as_secs_f64(), value_parser = parse_interval)]
    liveness_deadline: f64,
    /// Seconds an lvm run gets at least before it is taken for hung and
    /// killed. On a slow node a run gets more: --lvm-timeout-factor times
    /// the node's typical run (a moving average), at most 600 s.
    #[arg(long, env = "LOCALVOL_LVM_TIMEOUT", default_value_t = localvol::lvm::LVM_TIMEOUT_FLOOR.as_secs_f64(), value_parser = parse_interval)]
    lvm_timeout: f64,
    /// How many typical lvm runs of this node one run gets before it is killed.
    #[arg(long, env = "LOCALVOL_LVM_TIMEOUT_FACTOR", default_value_t = localvol::lvm::LVM_TIMEOUT_FACTOR,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    lvm_timeout_factor: u64,
    /// The driver's namespace, where the node-loss controller's lost records are read.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    namespace: String,
    /// Talk to this API server (http://host:port, no credentials) instead of the
    /// in-cluster one: tests and debugging only.
    #[arg(long, hide = true)]
    kube_api: Option<String>,
    /// Async workers (they decode and encode the RPCs). Default: one per usable core.
    #[arg(long, env = "LOCALVOL_WORKERS", value_parser = clap::value_parser!(u16).range(1..))]
    workers: Option<u16>,
    /// Blocking threads at most (they make the syscalls). Default: 2 per core, at least 32.
    #[arg(long, env = "LOCALVOL_BLOCKING_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    blocking_threads: Option<u16>,
    /// glibc malloc arenas at most (MALLOC_ARENA_MAX, when set, wins). Default: one per 4 usable cores, at least 1.
    #[arg(long, env = "LOCALVOL_MALLOC_ARENAS", value_parser = clap::value_parser!(u16).range(1..))]
    malloc_arenas: Option<u16>,
    /// Seconds between looks at the pools' health: an unusable pool is
    /// found (capacity 0, its RPCs refused, an Event), a recovered one
    /// serves again, and a pool that did not open is tried again.
    #[arg(long, env = "LOCALVOL_POOL_CHECK_INTERVAL", default_value_t = 10.0, value_parser = parse_interval)]
    pool_check_interval: f64,
    /// Seconds a /metrics scrape waits for the pools' figures (read from lvm
    /// and the filesystems) before it serves the last ones.
    #[arg(long, env = "LOCALVOL_METRICS_WAIT", default_value_t = 5.0, value_parser = parse_interval)]
    metrics_wait: f64,
}

/// A positive number of seconds, at most a day.
fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!(
            "{s:?}: expected seconds, more than 0 and at most 86400"
        )),
    }
}

impl ServeArgs {
    fn sizing(&self) -> server::RuntimeSizing {
        server::RuntimeSizing {
            workers: self.workers.map(usize::from),
            blocking_threads: self.blocking_threads.map(usize::from),
            malloc_arenas: self.malloc_arenas.map(usize::from),
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    localvol::lvm::set_timeout(
        std::time::Duration::from_secs_f64(args.lvm_timeout),
        args.lvm_timeout_factor,
    );
    let config = match &args.config {
        Some(p) => Config::load(p).map_err(|e| e.to_string())?,
        None => Config::embedded(&args.data_dir),
    };
    let node_id = match args.node_id {
        Some(n) => n,
        None => nix::unistd::gethostname()
            .map_err(|e| format!("reading hostname: {e}"))?
            .to_string_lossy()
            .into_owned(),
    };
    let opts = ServeOptions {
        endpoint: args.endpoint,
        node_id,
        driver_name: args.driver_name,
        config,
        kubelet_dir: args.kubelet_dir,
        socket_group: args.socket_group,
        metrics_addr: args.metrics_addr,
        liveness_addr: args.liveness_addr,
        liveness_deadline: std::time::Duration::from_secs_f64(args.liveness_deadline),
        namespace: args.namespace,
        kube_api: args.kube_api,
        pool_check_interval: std::time::Duration::from_secs_f64(args.pool_check_interval),
        metrics_wait: std::time::Duration::from_secs_f64(args.metrics_wait),
    };
    server::serve(opts, shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}

/// Parses `--metrics-addr` values such as `:9808` or `127.0.0.1:9808`.
fn parse_metrics_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    full.parse().map_err(|e| format!("address {s:?}: {e}"))
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // The driver runs on its own sized runtime; the clients on tokio's default.
    let rt = match &cli.command {
        Command::Serve(a) => server::runtime(a.sizing()).map(|(rt, r)| {
            tracing::info!(
                workers = r.workers,
                blocking_threads = r.blocking_threads,
                malloc_arenas = r.malloc_arenas,
                "runtime"
            );
            rt
        }),
        _ => tokio::runtime::Runtime::new(),
    };
    match rt {
        Ok(rt) => rt.block_on(run(cli)),
        Err(e) => {
            eprintln!("localvol: starting the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    let res = match cli.command {
        Command::Serve(a) => serve(a).await,
        Command::Client(a) => return client::main(a).await,
        Command::Bench(a) => return bench::main(a).await,
        Command::Controller(a) => controller(a).await,
        Command::Config(c) => config::main(c),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("localvol: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_metrics_addresses() {
        assert_eq!(
            parse_metrics_addr(":9808").unwrap(),
            "0.0.0.0:9808".parse().unwrap()
        );
        assert_eq!(
            parse_metrics_addr("127.0.0.1:1").unwrap(),
            "127.0.0.1:1".parse().unwrap()
        );
        assert!(parse_metrics_addr("nope").is_err());
    }
}
