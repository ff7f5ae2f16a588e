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

use crate::client::{self, code_name, parse_param, parse_size_arg, path_str, Clients};
use crate::requests::{self, NodeVolume};
use localvol::csi;
use localvol::endpoint::Endpoint;
use localvol::size::human;

mod floor;
mod lifecycle;
mod report;

use floor::*;
use lifecycle::*;
pub use report::*;

mod lvm_floor;
pub use lvm_floor::FloorLvm;
mod scale;

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
