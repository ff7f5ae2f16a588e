//! `localvol bench <scenario>`: how a driver behaves at node scale, one
//! scenario per subcommand, each printing one table (or one JSON object with
//! `--json`). Like the lifecycle bench they use only standard CSI RPCs, so any
//! driver can be measured; stage and unstage are skipped for a driver without
//! STAGE_UNSTAGE_VOLUME.
//!
//! | scenario | what it measures |
//! |---|---|
//! | `node-scale --published 10,200,500` | NodeStage+NodePublish (and NodeUnpublish+NodeUnstage) of a fresh volume while that many other volumes stay staged and published (each adds two mounts to the node's mount table) |
//! | `stats --published 200` | NodeGetVolumeStats latency with that many volumes published, round robin over them; every answer must say the volume is healthy |
//! | `churn --volumes 10000 --concurrency 8 --page 500` | CreateVolume and DeleteVolume rates; full ListVolumes passes, paged and unpaged, with all volumes there (per-page times show whether a page costs O(page) or O(all)); the driver's RSS with all volumes there |
//! | `restart --volumes 10000 -- DRIVER ARGS...` | time from starting the driver to its first ready Probe, with that many volumes in its pools, and its RSS once it has listed them |
//! | `sweep --concurrency 4,16` | whole lifecycles (as `localvol bench`) at each concurrency: lifecycles/s, lifecycle p99, the driver's peak RSS |
//! | `changed-blocks --pool P --size 1Gi` | a backup's read of a restored snapshot: the whole device against GetMetadataDelta's runs only (see [`changed_blocks`]) |
//!
//! Every scenario repeats its measurement `--rounds` times and reports the
//! median of the rounds (each round's own figures are in the JSON).
//!
//! The driver under test is either already serving at `--endpoint`, or, when a
//! command follows `--`, started by the bench (`restart` needs one): it is
//! started before the scenario, waited for until Probe answers ready, and
//! stopped (SIGTERM) at the end; its output goes to `driver.log` in the work
//! dir, which is kept. `sweep` starts a fresh driver for every run, so each
//! peak RSS is that run's own. The driver's RSS comes from that child, or from
//! `--server-pid` (a pid, or `auto`; see `localvol bench --help`).
//!
//! Volumes are named `<prefix>-<run id>-...`; staging and target paths are
//! made in a new run directory in `--work-dir` (which must be below the
//! driver's kubelet dir). Everything the scenario made is unpublished,
//! unstaged and deleted at the end, also after an error (best effort, and
//! reported).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::{percentile, read_peak_rss, run_id, RunDir, ServerPid, Summary};
use crate::client::{self, code_name, parse_param, parse_size_arg, path_str, Clients};
use crate::requests::{self, NodeVolume};
use localvol::command::{Cmd, Running};
use localvol::csi;
use localvol::endpoint::Endpoint;
use localvol::size::human;

mod blockio;
mod changed_blocks;
mod churn;
mod node;
mod restart;
mod target;
mod volumes;

pub use changed_blocks::ChangedBlocksArgs;
use changed_blocks::*;
use churn::*;
use node::*;
use restart::*;
use target::*;
use volumes::*;

#[derive(Subcommand, Debug)]
pub enum Scenario {
    /// NodeStage+NodePublish latency while more and more volumes stay published.
    NodeScale(NodeScaleArgs),
    /// NodeGetVolumeStats latency with many volumes published.
    Stats(StatsArgs),
    /// CreateVolume/DeleteVolume rates and full ListVolumes passes with many volumes.
    Churn(ChurnArgs),
    /// Time from starting the driver to serving, with many volumes (needs `-- DRIVER ARGS`).
    Restart(RestartArgs),
    /// Lifecycles/s and the driver's peak RSS at several concurrencies.
    Sweep(SweepArgs),
    /// A backup's read of a restored snapshot: all of it, or only the runs
    /// GetMetadataDelta names (thin LVM pools; needs root).
    ChangedBlocks(ChangedBlocksArgs),
}

/// What every scenario takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// The driver's socket: unix:///path/csi.sock or tcp://host:port.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        default_value = "unix:///run/localvol/csi.sock"
    )]
    pub endpoint: Endpoint,
    /// Where the run directory (staging and target paths) is made. Default: the temp dir.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Required capacity of each volume.
    #[arg(long, default_value = "1Mi", value_parser = parse_size_arg)]
    pub size: i64,
    /// CreateVolume parameter (repeatable).
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
    pub params: Vec<(String, String)>,
    /// fs_type of the mount capability.
    #[arg(long, default_value = "")]
    pub fs_type: String,
    /// How many times the measurement is repeated; the report gives the median.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: u64,
    /// The driver's pid (or `auto`) for its RSS, when the bench does not start it.
    #[arg(long, value_name = "PID|auto")]
    pub server_pid: Option<ServerPid>,
    /// Prefix of the volume names.
    #[arg(long, default_value = "bench")]
    pub name_prefix: String,
    /// Per-RPC timeout in seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Start this driver (program and arguments, after `--`) for the run; it
    /// must listen at --endpoint.
    #[arg(last = true, value_name = "DRIVER")]
    pub driver: Vec<String>,
    /// Raw block volumes instead of mounted ones (not a flag: set by the
    /// scenarios that need it).
    #[arg(skip)]
    pub block: bool,
}

#[derive(Args, Debug)]
pub struct NodeScaleArgs {
    #[command(flatten)]
    pub common: Common,
    /// Numbers of volumes kept published, in increasing order.
    #[arg(long, value_delimiter = ',', default_value = "10,200,500")]
    pub published: Vec<u64>,
    /// Fresh volumes staged and published (one at a time) at each level.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    pub samples: u64,
    /// How many of the kept volumes are set up at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub fill_concurrency: u64,
}

#[derive(Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub common: Common,
    /// Volumes published (and asked about, round robin).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub published: u64,
    /// NodeGetVolumeStats calls per round.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub calls: u64,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub concurrency: u64,
}

#[derive(Args, Debug)]
pub struct ChurnArgs {
    #[command(flatten)]
    pub common: Common,
    /// Volumes created (then listed, then deleted) per round.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub volumes: u64,
    /// Client threads creating and deleting.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub concurrency: u64,
    /// max_entries of the paged ListVolumes passes.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i32).range(1..))]
    pub page: i32,
    /// Full ListVolumes passes (paged, then unpaged) per round.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub passes: u64,
}

#[derive(Args, Debug)]
pub struct RestartArgs {
    #[command(flatten)]
    pub common: Common,
    /// Volumes in the driver's pools while it restarts (created first, deleted at the end).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(0..))]
    pub volumes: u64,
    /// Client threads creating and deleting them.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub concurrency: u64,
}

#[derive(Args, Debug)]
pub struct SweepArgs {
    #[command(flatten)]
    pub common: Common,
    /// Concurrencies to run, in order within each round.
    #[arg(long, value_delimiter = ',', default_value = "4,16")]
    pub concurrency: Vec<u64>,
    /// Lifecycles per run.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub volumes: u64,
}

/// `localvol bench <scenario>`: runs it and prints the report.
pub async fn main(s: Scenario) -> ExitCode {
    let (json, res) = match &s {
        Scenario::NodeScale(a) => (a.common.json, node_scale(a).await),
        Scenario::Stats(a) => (a.common.json, stats(a).await),
        Scenario::Churn(a) => (a.common.json, churn(a).await),
        Scenario::Restart(a) => (a.common.json, restart(a).await),
        Scenario::Sweep(a) => (a.common.json, sweep(a).await),
        Scenario::ChangedBlocks(a) => (a.json, changed_blocks(a).await),
    };
    match res {
        Ok((j, human)) => {
            if json {
                println!("{j}");
            } else {
                print!("{human}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("localvol bench: {e}");
            ExitCode::from(1)
        }
    }
}

type Outcome = Result<(Value, String), String>;

fn ms(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

/// The median of some figures (the lower middle one of an even count).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s.get(s.len().saturating_sub(1) / 2).copied().unwrap_or(0.0)
}

/// Median over rounds of one figure of each round's JSON.
fn median_of(rounds: &[Value], key: &str) -> f64 {
    let v: Vec<f64> = rounds.iter().filter_map(|r| r[key].as_f64()).collect();
    median(&v)
}

fn summary_json(s: &Summary) -> Value {
    json!({"count": s.count, "p50_ms": ms(s.p50), "p90_ms": ms(s.p90), "p99_ms": ms(s.p99), "mean_ms": ms(s.mean)})
}

/// A kB figure of `/proc/PID/status` (`VmRSS:`, `VmHWM:`), in bytes.
fn status_bytes(pid: u32, field: &str) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| format!("{path} has no {field} line"))
}

/// Lines of this process's mount table (the bench and a driver on the host
/// share the mount namespace).
fn mount_lines() -> usize {
    std::fs::read("/proc/self/mountinfo")
        .map(|b| b.iter().filter(|&&c| c == b'\n').count())
        .unwrap_or(0)
}

/// Sets a scenario up (run dir, driver, context), runs it, and tears down
/// what `body` left in its `Vec<Vol>` (also on error).
async fn with_target<F, Fut>(c: &Common, body: F) -> Outcome
where
    F: FnOnce(Arc<Ctx>, String, Arc<Mutex<Vec<Vol>>>, Arc<Target>) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let base = match &c.work_dir {
        Some(d) => std::path::absolute(d).map_err(|e| format!("work dir {d:?}: {e}"))?,
        None => std::env::temp_dir(),
    };
    let run = run_id();
    let dirs = RunDir::create(&base, &run, false)?;
    let target = match Target::open(c, &base).await {
        Ok(t) => Arc::new(t),
        Err(e) => {
            let _ = dirs.remove();
            return Err(e);
        }
    };
    let ctx = Arc::new(Ctx::new(c, &target, &dirs)?);
    let left: Arc<Mutex<Vec<Vol>>> = Arc::default();
    let prefix = format!("{}-{run}", c.name_prefix);
    let res = body(ctx.clone(), prefix, left.clone(), target.clone()).await;
    let left = std::mem::take(&mut *left.lock().expect("volumes"));
    let cleaned = remove_all(&ctx, left, 4).await;
    drop(ctx);
    let closed = match Arc::try_unwrap(target) {
        Ok(t) => t.close().await,
        Err(_) => Err("the driver handle is still in use".to_owned()),
    };
    let removed = dirs.remove();
    let res = res?;
    cleaned?;
    closed?;
    removed?;
    Ok(res)
}

/// Table helper: header and rows of strings.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut t = vec![header.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()];
    t.extend(rows);
    client::columns(&t)
}

fn f3(x: f64) -> String {
    format!("{x:.3}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_takes_the_lower_middle() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(median(&[]), 0.0);
        let rounds = [
            json!({"x": 5.0}),
            json!({"x": 1.0}),
            json!({"x": null}),
            json!({"x": 3.0}),
        ];
        assert_eq!(median_of(&rounds, "x"), 3.0);
    }

    #[tokio::test]
    async fn parallel_keeps_index_order_and_stops_at_the_first_error() {
        let (v, err) = parallel(10, 3, |i| async move { Ok::<_, String>(i * 2) }).await;
        assert_eq!(v, (0..10).map(|i| i * 2).collect::<Vec<_>>());
        assert!(err.is_none());
        let (v, err) = parallel(100, 1, |i| async move {
            if i == 5 {
                Err("five".to_owned())
            } else {
                Ok(i)
            }
        })
        .await;
        assert_eq!(v, vec![0, 1, 2, 3, 4]);
        assert_eq!(err.as_deref(), Some("five"));
    }

    #[test]
    fn status_figures_are_read_in_bytes() {
        let me = std::process::id();
        assert!(status_bytes(me, "VmRSS:").unwrap() > 0);
        assert!(status_bytes(me, "NoSuch:").is_err());
    }
}
