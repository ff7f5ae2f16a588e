//! `localvol bench`: drives whole volume lifecycles through any CSI driver's
//! socket and reports throughput and per-RPC latency percentiles, or, with
//! `--floor`, does the same filesystem work with raw syscalls as the physical
//! floor a driver is compared against.
//!
//! One lifecycle: CreateVolume → NodeStageVolume → NodePublishVolume →
//! NodeUnpublishVolume → NodeUnstageVolume → DeleteVolume, with only standard
//! RPCs and the parameters given on the command line. Stage and unstage are
//! skipped when NodeGetCapabilities lacks STAGE_UNSTAGE_VOLUME (publish then
//! gets no staging path). ControllerPublishVolume is not called: drivers that
//! need it are not supported. Each lifecycle uses the volume name
//! `<prefix>-<run id>-<index>`, the staging path `<run dir>/staging/<index>`
//! (created before NodeStageVolume, removed after NodeUnstageVolume, as kubelet
//! does) and the target path `<run dir>/targets/<index>` (only its parent
//! exists before NodePublishVolume). `<run dir>` is a new
//! `localvol-bench-<run id>` directory in `--work-dir` (default: the system's
//! temp dir); drivers that check paths (localvol checks `--kubelet-dir`) must
//! accept it, so start the driver with `--kubelet-dir` at or above the work dir.
//!
//! `--concurrency C` workers take lifecycle indexes from one counter until
//! `--volumes N` have been taken. Any RPC error stops the bench: the failing
//! lifecycle undoes what it did (best effort), the others finish theirs, and the
//! error is reported with exit status 1. Ctrl-C stops it the same way.
//!
//! Percentiles are nearest-rank over the sorted samples. Lifecycle latency is
//! from the start of CreateVolume to the end of DeleteVolume, including the
//! bench's own mkdir/rmdir of the staging path.
//!
//! # Server peak RSS
//!
//! `--server-pid PID` reports the driver's `VmHWM` (the kernel's record of its
//! peak resident set) from `/proc/PID/status` at the end. The peak covers the
//! process's whole life, so start a fresh driver, or pass `--reset-peak-rss`,
//! which resets it at the start (writes `5` to `/proc/PID/clear_refs`; needs the
//! same user or root). `--server-pid auto` finds the pid from the unix socket
//! itself (`SO_PEERCRED`, the process that created the listening socket): it only
//! works for a unix endpoint whose driver runs in the same pid namespace. By
//! hand: `pgrep -f 'localvol serve'`, `ss -xlp | grep csi.sock`, or
//! `fuser /path/csi.sock`; for a driver in a pod,
//! `crictl inspect --output go-template --template '{{.info.pid}}' <container>`
//! from the node.
//!
//! # JSON output (`--json`)
//!
//! One object: `{"mode": "csi"|"floor", "endpoint": str|null, "volumes": N,
//! "concurrency": C, "stage_unstage": bool, "wall_seconds": f64,
//! "lifecycles_per_sec": f64, "rpc": {"CreateVolume": {"count", "p50_ms",
//! "p90_ms", "p99_ms", "mean_ms"}, ...}, "lifecycle": {same shape},
//! "lifecycle_p99_ms": f64, "server_peak_rss_bytes": u64|null}`. In floor mode
//! the `rpc` keys are the syscall steps (`"Create(mkdir)"`, `"Stage(mkdir+bind)"`, ...).
//!
//! # Transport floor (`--floor-rpc`)
//!
//! The same workers and connection, but every step of a lifecycle is an
//! Identity `GetPluginInfo` call (every driver has it and it does no I/O,
//! where Probe may check storage): what six gRPC round trips cost with this
//! client and that driver, with no storage work at all. A driver's lifecycle
//! cannot be faster than this. Mode `"rpc-floor"`, `rpc` keys
//! `"GetPluginInfo(Create)"`, ...
//! (always six, even for a driver without stage/unstage).
//!
//! # LVM floor (`--floor-lvm VG[/THINPOOL]`)
//!
//! The bare sequence a driver of LVM volumes cannot beat: `lvcreate`, `mkfs`
//! and mount, bind, unmounts, `lvremove`, with no gRPC (needs root and the
//! VG; see [`lvm_floor`]). `--size` and `--fs-type` (default ext4) apply; mode
//! `"floor-lvm"`, `rpc` keys `"Create(lvcreate)"`, `"Stage(mkfs+mount)"`, ...,
//! and an extra `"lvm": {"volume_group", "thin_pool", "fs_type", "size_bytes"}`.
//! Like `--floor`, it ignores `--endpoint` (so a `CSI_ENDPOINT` in the
//! environment does not get in the way).
//!
//! # Scenarios at node scale (`localvol bench <scenario>`)
//!
//! `node-scale`, `stats`, `churn`, `restart` and `sweep` measure what a busy
//! node sees: node operations with hundreds of mounts, stats calls, create,
//! delete and list rates with thousands of volumes, restart time, and
//! throughput and memory across concurrencies. See [`scale`].

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use serde_json::{json, Map, Value};
use sys_mount::MountFlags;

mod lvm_floor;
pub use lvm_floor::FloorLvm;
mod scale;

use crate::cli::client::{self, code_name, parse_param, parse_size_arg, path_str, Clients};
use localvol::csi;
use localvol::endpoint::Endpoint;
use localvol::size::human;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// A scenario at node scale instead of plain lifecycles.
    #[command(subcommand)]
    pub scenario: Option<Box<scale::Scenario>>,
    /// The driver's socket: unix:///path/csi.sock or tcp://host:port.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        default_value = "unix:///run/localvol/csi.sock"
    )]
    pub endpoint: Endpoint,
    /// How many lifecycles to run.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub volumes: u64,
    /// How many lifecycles run at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub concurrency: u64,
    /// Required capacity of each volume.
    #[arg(long, default_value = "1Mi", value_parser = parse_size_arg)]
    pub size: i64,
    /// CreateVolume parameter (repeatable).
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
    pub params: Vec<(String, String)>,
    /// NodeStageVolume secret whose value is read from FILE (repeatable;
    /// e.g. `encryptionKey=key.bin` with `--param encryption=luks2`). From a
    /// file, so a key never shows in the command line.
    #[arg(long = "stage-secret-file", value_name = "KEY=FILE", value_parser = parse_param)]
    pub stage_secret_files: Vec<(String, String)>,
    /// fs_type of the mount capability.
    #[arg(long, default_value = "")]
    pub fs_type: String,
    /// Where the run directory (staging and target paths) is made. Default: the temp dir.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// The driver's pid (or `auto`, from the unix socket's peer) for its peak RSS.
    #[arg(long, value_name = "PID|auto", conflicts_with = "floor")]
    pub server_pid: Option<ServerPid>,
    /// Reset the driver's peak RSS at the start (needs --server-pid).
    #[arg(long, requires = "server_pid")]
    pub reset_peak_rss: bool,
    /// Prefix of the volume names.
    #[arg(long, default_value = "bench")]
    pub name_prefix: String,
    /// Per-RPC timeout in seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Measure the physical floor: the same mkdir/bind/umount/rmdir work with raw
    /// syscalls, no gRPC (needs root).
    #[arg(long)]
    pub floor: bool,
    /// Measure the LVM floor: bare lvcreate (thick in VG, or thin in VG/THINPOOL),
    /// mkfs (--fs-type, default ext4), mount, bind, umounts, lvremove (needs root).
    #[arg(
        long,
        value_name = "VG[/THINPOOL]",
        conflicts_with_all = ["floor", "server_pid", "params"]
    )]
    pub floor_lvm: Option<FloorLvm>,
    /// Measure the transport floor of the driver at --endpoint: every step of a
    /// lifecycle is an Identity GetPluginInfo call (every driver has it; no I/O)
    /// over the same connection and concurrency, so the report shows what gRPC
    /// alone costs six round trips.
    #[arg(long, conflicts_with_all = ["floor", "floor_lvm", "params"])]
    pub floor_rpc: bool,
}

/// `--server-pid`: a pid, or `auto` (the unix socket's peer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerPid {
    Pid(u32),
    Auto,
}

impl FromStr for ServerPid {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(ServerPid::Auto);
        }
        match s.parse::<u32>() {
            Ok(p) if p > 0 => Ok(ServerPid::Pid(p)),
            _ => Err(format!("{s:?} is not a pid or \"auto\"")),
        }
    }
}

/// Step names of a driver lifecycle, in order.
const RPC_STEPS: [&str; 6] = [
    "CreateVolume",
    "NodeStageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeUnstageVolume",
    "DeleteVolume",
];
/// Step names of a floor lifecycle, matching [`RPC_STEPS`] one to one.
const FLOOR_STEPS: [&str; 6] = [
    "Create(mkdir)",
    "Stage(mkdir+bind)",
    "Publish(mkdir+bind)",
    "Unpublish(umount+rmdir)",
    "Unstage(umount+rmdir)",
    "Delete(rmdir)",
];
/// Step names of a transport-floor lifecycle: one GetPluginInfo per driver step.
const PROBE_STEPS: [&str; 6] = [
    "GetPluginInfo(Create)",
    "GetPluginInfo(Stage)",
    "GetPluginInfo(Publish)",
    "GetPluginInfo(Unpublish)",
    "GetPluginInfo(Unstage)",
    "GetPluginInfo(Delete)",
];
const CREATE: usize = 0;
const STAGE: usize = 1;
const PUBLISH: usize = 2;
const UNPUBLISH: usize = 3;
const UNSTAGE: usize = 4;
const DELETE: usize = 5;

/// Latency samples of one worker or of the whole run.
#[derive(Default, Debug)]
pub struct Samples {
    steps: [Vec<Duration>; 6],
    lifecycles: Vec<Duration>,
}

impl Samples {
    fn merge(&mut self, other: Samples) {
        for (a, b) in self.steps.iter_mut().zip(other.steps) {
            a.extend(b);
        }
        self.lifecycles.extend(other.lifecycles);
    }
}

/// Nearest-rank percentile `p` (0 < p <= 100) of sorted samples.
pub fn percentile(sorted: &[Duration], p: usize) -> Duration {
    assert!(!sorted.is_empty(), "percentile of no samples");
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

/// count, p50, p90, p99 and mean of some samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub mean: Duration,
}

impl Summary {
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_unstable();
        let total: Duration = s.iter().sum();
        Some(Summary {
            count: s.len(),
            p50: percentile(&s, 50),
            p90: percentile(&s, 90),
            p99: percentile(&s, 99),
            mean: total / u32::try_from(s.len()).unwrap_or(u32::MAX),
        })
    }

    fn json(&self) -> Value {
        json!({
            "count": self.count,
            "p50_ms": ms(self.p50),
            "p90_ms": ms(self.p90),
            "p99_ms": ms(self.p99),
            "mean_ms": ms(self.mean),
        })
    }
}

/// The result of one bench run.
#[derive(Debug)]
pub struct Report {
    pub mode: &'static str,
    pub endpoint: Option<String>,
    pub volumes: u64,
    pub concurrency: u64,
    pub stage_unstage: bool,
    pub wall: Duration,
    /// Per step: name and summary (steps without samples are left out).
    pub steps: Vec<(&'static str, Summary)>,
    pub lifecycle: Summary,
    pub server_peak_rss: Option<(u32, u64)>,
    /// LVM floor runs: where and what.
    pub lvm: Option<lvm_floor::LvmFloorInfo>,
}

impl Report {
    fn new(
        mode: &'static str,
        names: &[&'static str; 6],
        samples: &Samples,
        wall: Duration,
    ) -> Option<Report> {
        let steps = names
            .iter()
            .zip(&samples.steps)
            .filter_map(|(n, s)| Summary::of(s).map(|sum| (*n, sum)))
            .collect();
        Some(Report {
            mode,
            endpoint: None,
            volumes: 0,
            concurrency: 0,
            stage_unstage: true,
            wall,
            steps,
            lifecycle: Summary::of(&samples.lifecycles)?,
            server_peak_rss: None,
            lvm: None,
        })
    }

    pub fn lifecycles_per_sec(&self) -> f64 {
        self.lifecycle.count as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    pub fn to_json(&self) -> Value {
        let rpc: Map<String, Value> = self
            .steps
            .iter()
            .map(|(n, s)| ((*n).to_owned(), s.json()))
            .collect();
        let mut j = json!({
            "mode": self.mode,
            "endpoint": self.endpoint,
            "volumes": self.volumes,
            "concurrency": self.concurrency,
            "stage_unstage": self.stage_unstage,
            "wall_seconds": self.wall.as_secs_f64(),
            "lifecycles_per_sec": self.lifecycles_per_sec(),
            "rpc": rpc,
            "lifecycle": self.lifecycle.json(),
            "lifecycle_p99_ms": ms(self.lifecycle.p99),
            "server_peak_rss_bytes": self.server_peak_rss.map(|(_, b)| b),
        });
        if let Some(l) = &self.lvm {
            j["lvm"] = l.json();
        }
        j
    }

    pub fn to_human(&self) -> String {
        let mut out = String::new();
        let what = match (&self.endpoint, &self.lvm) {
            (Some(e), _) if self.mode == "rpc-floor" => {
                format!("of GetPluginInfo calls only through {e} (transport floor)")
            }
            (Some(e), _) => format!("through {e}"),
            (None, Some(l)) => format!(
                "with bare lvcreate, mkfs.{} and mounts in {} (LVM floor)",
                l.fs.as_str(),
                l.target
            ),
            (None, None) => "with raw syscalls (floor)".to_owned(),
        };
        let _ = writeln!(
            out,
            "localvol bench: {} lifecycles {what}, concurrency {}{}",
            self.lifecycle.count,
            self.concurrency,
            if self.stage_unstage {
                ""
            } else {
                " (driver has no stage/unstage)"
            }
        );
        let _ = writeln!(out, "wall time    {:.3} s", self.wall.as_secs_f64());
        let _ = writeln!(
            out,
            "throughput   {:.1} lifecycles/s",
            self.lifecycles_per_sec()
        );
        let mut table = vec![["step", "count", "p50 ms", "p90 ms", "p99 ms", "mean ms"]
            .map(String::from)
            .to_vec()];
        let row = |name: &str, s: &Summary| {
            vec![
                name.to_owned(),
                s.count.to_string(),
                format!("{:.3}", ms(s.p50)),
                format!("{:.3}", ms(s.p90)),
                format!("{:.3}", ms(s.p99)),
                format!("{:.3}", ms(s.mean)),
            ]
        };
        for (n, s) in &self.steps {
            table.push(row(n, s));
        }
        table.push(row("lifecycle", &self.lifecycle));
        out.push_str(&client::columns(&table));
        if let Some((pid, b)) = self.server_peak_rss {
            let _ = writeln!(
                out,
                "server peak RSS  {} ({b} bytes, VmHWM of pid {pid})",
                human(b)
            );
        }
        out
    }
}

/// Peak RSS in bytes from the text of `/proc/PID/status` (`VmHWM:  1234 kB`).
pub fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut parts = line["VmHWM:".len()..].split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => n.checked_mul(1024),
        _ => None,
    }
}

/// Reads a process's peak RSS (bytes).
pub fn read_peak_rss(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    parse_vm_hwm(&text).ok_or_else(|| format!("{path} has no VmHWM line"))
}

/// Resets a process's peak RSS to its current RSS.
fn reset_peak_rss(pid: u32) -> Result<(), String> {
    let path = format!("/proc/{pid}/clear_refs");
    std::fs::write(&path, "5").map_err(|e| format!("resetting the peak RSS ({path}): {e}"))
}

/// The pid of the process serving a unix socket (the one that created the
/// listening socket), from `SO_PEERCRED`.
async fn socket_peer_pid(endpoint: &Endpoint) -> Result<u32, String> {
    let Endpoint::Unix(path) = endpoint else {
        return Err("--server-pid auto needs a unix:// endpoint; pass the pid".to_owned());
    };
    let s = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| format!("connecting to {path:?}: {e}"))?;
    let cred = s
        .peer_cred()
        .map_err(|e| format!("SO_PEERCRED on {path:?}: {e}"))?;
    match cred.pid() {
        Some(p) if p > 0 => Ok(p as u32),
        _ => Err(format!(
            "the pid behind {path:?} is not visible here (another pid namespace?); pass --server-pid PID"
        )),
    }
}

/// `localvol bench`: runs and prints the report; exit status 1 on any error.
pub async fn main(args: BenchArgs) -> ExitCode {
    if let Some(s) = args.scenario {
        return scale::main(*s).await;
    }
    match run(&args).await {
        Ok(report) => {
            if args.json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_human());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("localvol bench: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs the bench as the arguments say.
pub async fn run(args: &BenchArgs) -> Result<Report, String> {
    let abort = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (abort, interrupted) = (abort.clone(), interrupted.clone());
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("localvol bench: interrupted; finishing the running lifecycles (Ctrl-C again to quit now)");
                interrupted.store(true, Ordering::SeqCst);
                abort.store(true, Ordering::SeqCst);
                if tokio::signal::ctrl_c().await.is_ok() {
                    std::process::exit(130);
                }
            }
        })
    };
    let res = run_inner(args, abort).await;
    watcher.abort();
    if interrupted.load(Ordering::SeqCst) {
        return Err(match res {
            Err(e) => format!("interrupted; {e}"),
            Ok(_) => "interrupted".to_owned(),
        });
    }
    res
}

async fn run_inner(args: &BenchArgs, abort: Arc<AtomicBool>) -> Result<Report, String> {
    let base = match &args.work_dir {
        Some(d) => std::path::absolute(d).map_err(|e| format!("work dir {d:?}: {e}"))?,
        None => std::env::temp_dir(),
    };
    let run_id = run_id();
    let run_dir = RunDir::create(&base, &run_id, args.floor)?;
    let res = if let Some(target) = &args.floor_lvm {
        lvm_floor::run(args, target, &run_dir, &run_id, abort).await
    } else if args.floor {
        run_floor(args, &run_dir, abort).await
    } else {
        run_csi(args, &run_dir, &run_id, abort).await
    };
    let left = run_dir.remove();
    match (res, left) {
        (Ok(r), Ok(())) => Ok(r),
        (Ok(_), Err(e)) => Err(e),
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(left)) => Err(format!("{e}\n{left}")),
    }
}

/// A short id that tells this run's volumes and directories apart.
fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{:08x}{:x}",
        (nanos & 0xffff_ffff) as u32,
        std::process::id()
    )
}

/// The run's directory and the shared parents of its per-lifecycle paths.
struct RunDir {
    root: PathBuf,
    staging: PathBuf,
    targets: PathBuf,
    /// Floor mode only: the stand-in volume directories.
    volumes: Option<PathBuf>,
}

impl RunDir {
    fn create(base: &Path, run_id: &str, floor: bool) -> Result<RunDir, String> {
        std::fs::create_dir_all(base)
            .map_err(|e| format!("creating the work dir {base:?}: {e}"))?;
        let root = base.join(format!("localvol-bench-{run_id}"));
        let d = RunDir {
            staging: root.join("staging"),
            targets: root.join("targets"),
            volumes: floor.then(|| root.join("volumes")),
            root,
        };
        let mut dirs = vec![&d.root, &d.staging, &d.targets];
        dirs.extend(d.volumes.as_ref());
        for dir in dirs {
            std::fs::create_dir(dir).map_err(|e| format!("creating {dir:?}: {e}"))?;
        }
        Ok(d)
    }

    /// Removes the run's directories, never recursively: anything left inside
    /// (a failed cleanup) stays and is reported.
    fn remove(&self) -> Result<(), String> {
        let mut dirs = vec![&self.staging, &self.targets];
        dirs.extend(self.volumes.as_ref());
        dirs.push(&self.root);
        for dir in dirs {
            if let Err(e) = std::fs::remove_dir(dir) {
                return Err(format!(
                    "could not remove {dir:?} ({e}); check `grep {} /proc/self/mountinfo` and remove it by hand",
                    self.root.display()
                ));
            }
        }
        Ok(())
    }
}

/// Removes a directory; one that is already gone is fine.
fn rmdir(p: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir(p) {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// What a driver lifecycle needs that is the same for all of them.
struct CsiCtx {
    clients: Clients,
    stage_unstage: bool,
    capability: csi::VolumeCapability,
    parameters: HashMap<String, String>,
    /// NodeStageVolume secrets (`--stage-secret-file`).
    stage_secrets: HashMap<String, String>,
    size: i64,
    prefix: String,
    /// `--floor-rpc`: GetPluginInfo calls instead of the lifecycle's RPCs.
    probe_only: bool,
}

/// What one lifecycle has asked the driver to do so far, for cleanup.
#[derive(Default)]
struct Progress {
    volume_id: Option<String>,
    volume_context: HashMap<String, String>,
    staging_dir: bool,
    staged: bool,
    published: bool,
}

fn rpc_error(step: usize, s: tonic::Status) -> String {
    let hint = if s.code() == tonic::Code::InvalidArgument && matches!(step, STAGE | PUBLISH) {
        " (hint: is --work-dir below the driver's kubelet directory?)"
    } else {
        ""
    };
    format!(
        "{}: {}: {}{hint}",
        RPC_STEPS[step],
        code_name(s.code()),
        s.message()
    )
}

/// CSI mode (and `--floor-rpc`): runs the lifecycles against the driver's
/// socket on `--concurrency` workers and reports their latencies.
async fn run_csi(
    args: &BenchArgs,
    dirs: &RunDir,
    run_id: &str,
    abort: Arc<AtomicBool>,
) -> Result<Report, String> {
    let channel = client::connect(&args.endpoint)
        .await
        .map_err(|e| e.to_string())?;
    let clients = Clients::new(channel, Duration::from_secs(args.timeout.max(1)));
    let server_pid = prepare_server_pid(args).await?;
    let stage_unstage = has_stage_unstage(&clients).await?;
    let capability = client::CapabilityArgs {
        fs: Some(args.fs_type.clone()),
        ..Default::default()
    }
    .to_csi();
    let ctx = Arc::new(CsiCtx {
        clients,
        stage_unstage,
        capability,
        parameters: client::param_map(None, &args.params)?,
        stage_secrets: client::read_secret_files(&args.stage_secret_files)?,
        size: args.size,
        prefix: format!("{}-{run_id}", args.name_prefix),
        probe_only: args.floor_rpc,
    });
    let n = usize::try_from(args.volumes).map_err(|e| e.to_string())?;
    let (staging, targets) = (dirs.staging.clone(), dirs.targets.clone());
    let (samples, errors, wall) = run_workers(args.concurrency, n, abort, move |i, mut samples| {
        let ctx = ctx.clone();
        let (staging, target) = (staging.join(i.to_string()), targets.join(i.to_string()));
        async move {
            let res = if ctx.probe_only {
                probe_lifecycle(&ctx, &mut samples).await
            } else {
                csi_lifecycle(&ctx, i, &staging, &target, &mut samples).await
            };
            let res = res.map_err(|e| format!("lifecycle {i} ({}-{i}): {e}", ctx.prefix));
            (samples, res)
        }
    })
    .await;
    if let Some(e) = first_error(&errors) {
        return Err(e);
    }
    csi_report(args, &samples, wall, stage_unstage, server_pid)
}

/// `--server-pid`: resolves `auto` to the socket's peer, checks that the
/// pid's peak RSS can be read, and resets it when `--reset-peak-rss` asks.
async fn prepare_server_pid(args: &BenchArgs) -> Result<Option<u32>, String> {
    let server_pid = match args.server_pid {
        None => None,
        Some(ServerPid::Pid(p)) => Some(p),
        Some(ServerPid::Auto) => Some(socket_peer_pid(&args.endpoint).await?),
    };
    if let Some(pid) = server_pid {
        read_peak_rss(pid)?;
        if args.reset_peak_rss {
            reset_peak_rss(pid)?;
        }
    }
    Ok(server_pid)
}

/// Whether the driver's NodeGetCapabilities lists STAGE_UNSTAGE_VOLUME.
async fn has_stage_unstage(clients: &Clients) -> Result<bool, String> {
    let mut node = clients.node.clone();
    let caps = client::call(clients.timeout, csi::NodeGetCapabilitiesRequest {}, |r| {
        node.node_get_capabilities(r)
    })
    .await
    .map_err(|s| {
        format!(
            "NodeGetCapabilities: {}: {}",
            code_name(s.code()),
            s.message()
        )
    })?;
    Ok(client::node_cap_names(&caps)
        .iter()
        .any(|c| c == "STAGE_UNSTAGE_VOLUME"))
}

/// The CSI-mode report: latencies, the run's settings, and the server's peak
/// RSS when `--server-pid` was given.
fn csi_report(
    args: &BenchArgs,
    samples: &Samples,
    wall: Duration,
    stage_unstage: bool,
    server_pid: Option<u32>,
) -> Result<Report, String> {
    let (mode, steps) = match args.floor_rpc {
        true => ("rpc-floor", &PROBE_STEPS),
        false => ("csi", &RPC_STEPS),
    };
    let mut report = Report::new(mode, steps, samples, wall)
        .ok_or_else(|| "no lifecycle completed".to_owned())?;
    report.endpoint = Some(args.endpoint.to_string());
    report.volumes = args.volumes;
    report.concurrency = args.concurrency;
    report.stage_unstage = stage_unstage;
    if let Some(pid) = server_pid {
        report.server_peak_rss = Some((pid, read_peak_rss(pid)?));
    }
    Ok(report)
}

/// Runs `n` lifecycles on `concurrency` tokio workers that take indexes from
/// one counter until all are taken or `abort` is set (Ctrl-C, or a lifecycle
/// that failed: its worker sets it). `lifecycle(i, samples)` runs lifecycle
/// `i`, recording into its worker's samples, which it hands back. Returns all
/// samples, the failed lifecycles' errors and the wall time.
async fn run_workers<F, Fut>(
    concurrency: u64,
    n: usize,
    abort: Arc<AtomicBool>,
    lifecycle: F,
) -> (Samples, Vec<String>, Duration)
where
    F: Fn(usize, Samples) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (Samples, Result<(), String>)> + Send + 'static,
{
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (next, abort, lifecycle) = (next.clone(), abort.clone(), lifecycle.clone());
        workers.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            while !abort.load(Ordering::SeqCst) {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    break;
                }
                let (s, res) = lifecycle(i, samples).await;
                samples = s;
                if let Err(e) = res {
                    abort.store(true, Ordering::SeqCst);
                    return (samples, Err(e));
                }
            }
            (samples, Ok(()))
        }));
    }
    let (samples, errors) = join_workers(workers).await;
    (samples, errors, start.elapsed())
}

async fn join_workers(
    workers: Vec<tokio::task::JoinHandle<(Samples, Result<(), String>)>>,
) -> (Samples, Vec<String>) {
    let mut all = Samples::default();
    let mut errors = Vec::new();
    for w in workers {
        match w.await {
            Ok((s, r)) => {
                all.merge(s);
                if let Err(e) = r {
                    errors.push(e);
                }
            }
            Err(e) => errors.push(format!("worker failed: {e}")),
        }
    }
    (all, errors)
}

fn first_error(errors: &[String]) -> Option<String> {
    let first = errors.first()?;
    Some(match errors.len() {
        1 => first.clone(),
        n => format!("{first} (and {} more failed lifecycles)", n - 1),
    })
}

/// A transport-floor lifecycle: six GetPluginInfo round trips, nothing else.
async fn probe_lifecycle(ctx: &CsiCtx, samples: &mut Samples) -> Result<(), String> {
    let lifecycle = Instant::now();
    for step in samples.steps.iter_mut() {
        let mut identity = ctx.clients.identity.clone();
        let start = Instant::now();
        client::call(ctx.clients.timeout, csi::GetPluginInfoRequest {}, |r| {
            identity.get_plugin_info(r)
        })
        .await
        .map_err(|s| format!("GetPluginInfo: {}: {}", code_name(s.code()), s.message()))?;
        step.push(start.elapsed());
    }
    samples.lifecycles.push(lifecycle.elapsed());
    Ok(())
}

/// One driver lifecycle; on error, undoes what it did (best effort).
async fn csi_lifecycle(
    ctx: &CsiCtx,
    i: usize,
    staging: &Path,
    target: &Path,
    samples: &mut Samples,
) -> Result<(), String> {
    let mut p = Progress::default();
    let res = csi_steps(ctx, i, staging, target, samples, &mut p).await;
    if res.is_err() {
        csi_cleanup(ctx, staging, target, &p).await;
    }
    res
}

/// The lifecycle's steps in order (stage and unstage only for drivers with
/// STAGE_UNSTAGE_VOLUME), recording each step's latency and, in `p`, what
/// there is to undo if a later step fails.
async fn csi_steps(
    ctx: &CsiCtx,
    i: usize,
    staging: &Path,
    target: &Path,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<(), String> {
    let staging_s = path_str(staging)?;
    let target_s = path_str(target)?;
    let lifecycle = Instant::now();
    let id = csi_create(ctx, i, samples, p).await?;
    if ctx.stage_unstage {
        csi_stage(ctx, &id, staging, &staging_s, samples, p).await?;
    }
    csi_publish(ctx, &id, &staging_s, &target_s, samples, p).await?;
    csi_unpublish(ctx, &id, target, target_s, samples, p).await?;
    if ctx.stage_unstage {
        csi_unstage(ctx, &id, staging, staging_s, samples, p).await?;
    }
    csi_delete(ctx, id, samples, p).await?;
    samples.lifecycles.push(lifecycle.elapsed());
    Ok(())
}

/// Awaits one lifecycle RPC and records its latency under `step`; an error
/// is worded by `rpc_error`.
async fn timed<R>(
    samples: &mut Samples,
    step: usize,
    rpc: impl std::future::Future<Output = Result<R, tonic::Status>>,
) -> Result<R, String> {
    let start = Instant::now();
    let r = rpc.await.map_err(|s| rpc_error(step, s))?;
    samples.steps[step].push(start.elapsed());
    Ok(r)
}

/// CreateVolume for lifecycle `i`; returns the new volume's id.
async fn csi_create(
    ctx: &CsiCtx,
    i: usize,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<String, String> {
    let mut ctl = ctx.clients.controller.clone();
    let req = csi::CreateVolumeRequest {
        name: format!("{}-{i}", ctx.prefix),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: ctx.size,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![ctx.capability.clone()],
        parameters: ctx.parameters.clone(),
        ..Default::default()
    };
    let call = client::call(ctx.clients.timeout, req, |r| ctl.create_volume(r));
    let r = timed(samples, CREATE, call).await?;
    let vol = r
        .volume
        .ok_or_else(|| "CreateVolume answered without a volume".to_owned())?;
    p.volume_id = Some(vol.volume_id.clone());
    p.volume_context = vol.volume_context;
    Ok(vol.volume_id)
}

/// Creates the staging directory (as kubelet does), then NodeStageVolume.
async fn csi_stage(
    ctx: &CsiCtx,
    id: &str,
    staging: &Path,
    staging_s: &str,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<(), String> {
    let mut node = ctx.clients.node.clone();
    // kubelet creates the staging directory before NodeStageVolume. These
    // mkdir/rmdir calls block the worker for a few microseconds.
    std::fs::create_dir(staging).map_err(|e| format!("creating {staging:?}: {e}"))?;
    p.staging_dir = true;
    p.staged = true;
    let req = csi::NodeStageVolumeRequest {
        volume_id: id.to_owned(),
        publish_context: HashMap::new(),
        staging_target_path: staging_s.to_owned(),
        volume_capability: Some(ctx.capability.clone()),
        secrets: ctx.stage_secrets.clone(),
        volume_context: p.volume_context.clone(),
    };
    let call = client::call(ctx.clients.timeout, req, |r| node.node_stage_volume(r));
    timed(samples, STAGE, call).await?;
    Ok(())
}

/// NodePublishVolume at `target_s` (from the staging path when staged).
async fn csi_publish(
    ctx: &CsiCtx,
    id: &str,
    staging_s: &str,
    target_s: &str,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<(), String> {
    let mut node = ctx.clients.node.clone();
    p.published = true;
    let req = csi::NodePublishVolumeRequest {
        volume_id: id.to_owned(),
        publish_context: HashMap::new(),
        staging_target_path: if ctx.stage_unstage {
            staging_s.to_owned()
        } else {
            String::new()
        },
        target_path: target_s.to_owned(),
        volume_capability: Some(ctx.capability.clone()),
        readonly: false,
        secrets: HashMap::new(),
        volume_context: p.volume_context.clone(),
    };
    let call = client::call(ctx.clients.timeout, req, |r| node.node_publish_volume(r));
    timed(samples, PUBLISH, call).await?;
    Ok(())
}

/// NodeUnpublishVolume, then removes the target directory.
async fn csi_unpublish(
    ctx: &CsiCtx,
    id: &str,
    target: &Path,
    target_s: String,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<(), String> {
    let mut node = ctx.clients.node.clone();
    let req = csi::NodeUnpublishVolumeRequest {
        volume_id: id.to_owned(),
        target_path: target_s,
    };
    let call = client::call(ctx.clients.timeout, req, |r| node.node_unpublish_volume(r));
    timed(samples, UNPUBLISH, call).await?;
    p.published = false;
    // The driver should have removed the target; kubelet removes it otherwise.
    rmdir(target).map_err(|e| format!("removing {target:?} after NodeUnpublishVolume: {e}"))
}

/// NodeUnstageVolume, then removes the staging directory.
async fn csi_unstage(
    ctx: &CsiCtx,
    id: &str,
    staging: &Path,
    staging_s: String,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<(), String> {
    let mut node = ctx.clients.node.clone();
    let req = csi::NodeUnstageVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: staging_s,
    };
    let call = client::call(ctx.clients.timeout, req, |r| node.node_unstage_volume(r));
    timed(samples, UNSTAGE, call).await?;
    p.staged = false;
    rmdir(staging).map_err(|e| format!("removing {staging:?} after NodeUnstageVolume: {e}"))?;
    p.staging_dir = false;
    Ok(())
}

/// DeleteVolume; the lifecycle then has nothing left to undo.
async fn csi_delete(
    ctx: &CsiCtx,
    id: String,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<(), String> {
    let mut ctl = ctx.clients.controller.clone();
    let req = csi::DeleteVolumeRequest {
        volume_id: id,
        secrets: HashMap::new(),
    };
    let call = client::call(ctx.clients.timeout, req, |r| ctl.delete_volume(r));
    timed(samples, DELETE, call).await?;
    p.volume_id = None;
    Ok(())
}

/// Best-effort undo of a failed lifecycle; problems are printed, not returned.
async fn csi_cleanup(ctx: &CsiCtx, staging: &Path, target: &Path, p: &Progress) {
    let t = ctx.clients.timeout;
    let (mut ctl, mut node) = (ctx.clients.controller.clone(), ctx.clients.node.clone());
    let Some(id) = &p.volume_id else { return };
    let warn = |what: &str, e: String| eprintln!("localvol bench: cleanup of {id}: {what}: {e}");
    if p.published {
        let req = csi::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.to_string_lossy().into_owned(),
        };
        if let Err(s) = client::call(t, req, |r| node.node_unpublish_volume(r)).await {
            warn(
                "NodeUnpublishVolume",
                format!("{}: {}", code_name(s.code()), s.message()),
            );
        }
        if let Err(e) = rmdir(target) {
            warn("removing the target", e.to_string());
        }
    }
    if p.staged {
        let req = csi::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_string_lossy().into_owned(),
        };
        if let Err(s) = client::call(t, req, |r| node.node_unstage_volume(r)).await {
            warn(
                "NodeUnstageVolume",
                format!("{}: {}", code_name(s.code()), s.message()),
            );
        }
    }
    if p.staging_dir {
        if let Err(e) = rmdir(staging) {
            warn("removing the staging dir", e.to_string());
        }
    }
    let req = csi::DeleteVolumeRequest {
        volume_id: id.clone(),
        secrets: HashMap::new(),
    };
    if let Err(s) = client::call(t, req, |r| ctl.delete_volume(r)).await {
        warn(
            "DeleteVolume",
            format!("{}: {}", code_name(s.code()), s.message()),
        );
    }
}

async fn run_floor(
    args: &BenchArgs,
    dirs: &RunDir,
    abort: Arc<AtomicBool>,
) -> Result<Report, String> {
    let volumes = dirs
        .volumes
        .clone()
        .ok_or_else(|| "floor mode without a volumes dir".to_owned())?;
    let (staging, targets) = (dirs.staging.clone(), dirs.targets.clone());
    let n = usize::try_from(args.volumes).map_err(|e| e.to_string())?;
    let c = args.concurrency;
    let (samples, errors, wall) = tokio::task::spawn_blocking(move || {
        let next = AtomicUsize::new(0);
        let start = Instant::now();
        let results: Vec<(Samples, Result<(), String>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..c)
                .map(|_| {
                    let (next, abort) = (&next, &abort);
                    let (volumes, staging, targets) = (&volumes, &staging, &targets);
                    scope.spawn(move || {
                        let mut samples = Samples::default();
                        while !abort.load(Ordering::SeqCst) {
                            let i = next.fetch_add(1, Ordering::SeqCst);
                            if i >= n {
                                break;
                            }
                            let name = i.to_string();
                            let paths = FloorPaths {
                                volume: volumes.join(&name),
                                staging: staging.join(&name),
                                target: targets.join(&name),
                            };
                            if let Err(e) = floor_lifecycle(&paths, &mut samples) {
                                abort.store(true, Ordering::SeqCst);
                                return (samples, Err(format!("lifecycle {i}: {e}")));
                            }
                        }
                        (samples, Ok(()))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| (Samples::default(), Err("worker panicked".to_owned())))
                })
                .collect()
        });
        let wall = start.elapsed();
        let mut all = Samples::default();
        let mut errors = Vec::new();
        for (s, r) in results {
            all.merge(s);
            if let Err(e) = r {
                errors.push(e);
            }
        }
        (all, errors, wall)
    })
    .await
    .map_err(|e| format!("floor workers: {e}"))?;
    if let Some(e) = first_error(&errors) {
        return Err(e);
    }
    let mut report = Report::new("floor", &FLOOR_STEPS, &samples, wall)
        .ok_or_else(|| "no lifecycle completed".to_owned())?;
    report.volumes = args.volumes;
    report.concurrency = args.concurrency;
    Ok(report)
}

struct FloorPaths {
    volume: PathBuf,
    staging: PathBuf,
    target: PathBuf,
}

/// What a floor lifecycle has made so far, for cleanup.
#[derive(Default)]
struct FloorProgress {
    volume: bool,
    staging: bool,
    staged: bool,
    target: bool,
    published: bool,
}

fn floor_lifecycle(p: &FloorPaths, samples: &mut Samples) -> Result<(), String> {
    let mut done = FloorProgress::default();
    let res = floor_steps(p, samples, &mut done);
    if res.is_err() {
        // Best effort, innermost first.
        if done.published {
            let _ = localvol::mount::unmount(&p.target);
        }
        if done.target {
            let _ = rmdir(&p.target);
        }
        if done.staged {
            let _ = localvol::mount::unmount(&p.staging);
        }
        if done.staging {
            let _ = rmdir(&p.staging);
        }
        if done.volume {
            let _ = rmdir(&p.volume);
        }
    }
    res
}

fn floor_steps(
    p: &FloorPaths,
    samples: &mut Samples,
    done: &mut FloorProgress,
) -> Result<(), String> {
    let mkdir = |d: &Path| std::fs::create_dir(d).map_err(|e| format!("mkdir {d:?}: {e}"));
    let rm = |d: &Path| std::fs::remove_dir(d).map_err(|e| format!("rmdir {d:?}: {e}"));
    let bind = |s: &Path, t: &Path| {
        localvol::mount::bind(s, t, MountFlags::empty()).map_err(|e| e.to_string())
    };
    let umount = |t: &Path| localvol::mount::unmount(t).map_err(|e| e.to_string());
    let lifecycle = Instant::now();

    let start = Instant::now();
    mkdir(&p.volume)?;
    done.volume = true;
    samples.steps[CREATE].push(start.elapsed());

    let start = Instant::now();
    mkdir(&p.staging)?;
    done.staging = true;
    bind(&p.volume, &p.staging)?;
    done.staged = true;
    samples.steps[STAGE].push(start.elapsed());

    let start = Instant::now();
    mkdir(&p.target)?;
    done.target = true;
    bind(&p.staging, &p.target)?;
    done.published = true;
    samples.steps[PUBLISH].push(start.elapsed());

    let start = Instant::now();
    umount(&p.target)?;
    done.published = false;
    rm(&p.target)?;
    done.target = false;
    samples.steps[UNPUBLISH].push(start.elapsed());

    let start = Instant::now();
    umount(&p.staging)?;
    done.staged = false;
    rm(&p.staging)?;
    done.staging = false;
    samples.steps[UNSTAGE].push(start.elapsed());

    let start = Instant::now();
    rm(&p.volume)?;
    done.volume = false;
    samples.steps[DELETE].push(start.elapsed());

    samples.lifecycles.push(lifecycle.elapsed());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn nearest_rank_percentiles() {
        let s: Vec<Duration> = (1..=100).map(d).collect();
        assert_eq!(percentile(&s, 50), d(50));
        assert_eq!(percentile(&s, 90), d(90));
        assert_eq!(percentile(&s, 99), d(99));
        assert_eq!(percentile(&s, 100), d(100));
        // Ten samples: p99 is the largest, p50 the fifth, p90 the ninth.
        let s: Vec<Duration> = (1..=10).map(d).collect();
        assert_eq!(percentile(&s, 99), d(10));
        assert_eq!(percentile(&s, 50), d(5));
        assert_eq!(percentile(&s, 90), d(9));
        assert_eq!(percentile(&[d(7)], 1), d(7));
    }

    #[test]
    fn summary_sorts_first() {
        let s = Summary::of(&[d(30), d(10), d(20)]).unwrap();
        assert_eq!((s.count, s.p50, s.p99, s.mean), (3, d(20), d(30), d(20)));
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn vm_hwm_is_read_in_bytes() {
        let text = "Name:\tlocalvol\nVmPeak:\t  100 kB\nVmHWM:\t    2048 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_vm_hwm(text), Some(2048 * 1024));
        assert_eq!(parse_vm_hwm("VmRSS:\t1 kB\n"), None);
        assert_eq!(parse_vm_hwm("VmHWM:\tlots kB\n"), None);
        // Our own process has touched memory, so its peak is not zero.
        let own = read_peak_rss(std::process::id()).unwrap();
        assert!(own > 0);
    }

    #[test]
    fn server_pid_flag() {
        assert_eq!("auto".parse::<ServerPid>(), Ok(ServerPid::Auto));
        assert_eq!("1234".parse::<ServerPid>(), Ok(ServerPid::Pid(1234)));
        for bad in ["0", "-1", "self", ""] {
            assert!(bad.parse::<ServerPid>().is_err(), "{bad}");
        }
    }

    #[test]
    fn report_json_has_the_documented_shape() {
        let mut samples = Samples::default();
        for (i, step) in samples.steps.iter_mut().enumerate() {
            step.push(d(i as u64 + 1));
        }
        samples.lifecycles.push(d(21));
        samples.lifecycles.push(d(23));
        let mut r = Report::new("csi", &RPC_STEPS, &samples, Duration::from_secs(2)).unwrap();
        r.server_peak_rss = Some((1, 4096));
        let j = r.to_json();
        assert_eq!(j["lifecycles_per_sec"], json!(1.0));
        assert_eq!(j["rpc"]["NodePublishVolume"]["p99_ms"], json!(3.0));
        assert_eq!(j["rpc"].as_object().unwrap().len(), 6);
        assert_eq!(j["lifecycle_p99_ms"], json!(23.0));
        assert_eq!(j["server_peak_rss_bytes"], json!(4096));
        assert!(r.to_human().contains("NodeUnstageVolume"));
        // A driver without stage/unstage: those steps are left out.
        samples.steps[STAGE].clear();
        samples.steps[UNSTAGE].clear();
        let r = Report::new("csi", &RPC_STEPS, &samples, Duration::from_secs(1)).unwrap();
        let j = r.to_json();
        assert!(j["rpc"].get("NodeStageVolume").is_none());
        assert_eq!(j["server_peak_rss_bytes"], Value::Null);
    }

    #[test]
    fn run_dir_is_created_and_removed_without_recursion() {
        let base = tempfile::tempdir().unwrap();
        let rd = RunDir::create(base.path(), "t1", true).unwrap();
        assert!(rd.staging.is_dir() && rd.targets.is_dir());
        assert!(rd.volumes.as_ref().unwrap().is_dir());
        // Something left inside is reported, not deleted.
        std::fs::create_dir(rd.staging.join("leftover")).unwrap();
        assert!(rd.remove().is_err());
        assert!(rd.staging.join("leftover").is_dir());
        std::fs::remove_dir(rd.staging.join("leftover")).unwrap();
        // remove() stopped at staging; a second call removes the rest.
        rd.remove().unwrap();
        assert!(!rd.root.exists());
    }
}
