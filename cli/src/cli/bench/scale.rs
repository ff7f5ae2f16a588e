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
use crate::cli::client::{self, code_name, parse_param, parse_size_arg, path_str, Clients};
use localvol::command::{Cmd, Running};
use localvol::csi;
use localvol::endpoint::Endpoint;
use localvol::size::human;

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

/// The driver under test: connected clients, its pid when known, and the
/// process when the bench started it.
struct Target {
    clients: Clients,
    pid: Option<u32>,
    running: Option<Running>,
    stage_unstage: bool,
    /// How long the started driver took from exec to its first ready Probe.
    serving: Option<Duration>,
}

impl Target {
    /// Starts the driver when `--` gave one, else connects to `--endpoint`.
    async fn open(c: &Common, log_dir: &Path) -> Result<Target, String> {
        let timeout = Duration::from_secs(c.timeout.max(1));
        let (clients, pid, running, serving) = if c.driver.is_empty() {
            let channel = client::connect(&c.endpoint)
                .await
                .map_err(|e| e.to_string())?;
            let pid = match c.server_pid {
                None => None,
                Some(ServerPid::Pid(p)) => Some(p),
                Some(ServerPid::Auto) => Some(super::socket_peer_pid(&c.endpoint).await?),
            };
            (Clients::new(channel, timeout), pid, None, None)
        } else {
            let (running, clients, serving) = start_driver(c, log_dir, timeout).await?;
            (clients, running.pid(), Some(running), Some(serving))
        };
        let stage_unstage = super::has_stage_unstage(&clients).await?;
        Ok(Target {
            clients,
            pid,
            running,
            stage_unstage,
            serving,
        })
    }

    /// Stops a driver the bench started.
    async fn close(self) -> Result<(), String> {
        if let Some(r) = self.running {
            r.stop(Duration::from_secs(30))
                .await
                .map_err(|e| format!("stopping the driver: {e}"))?;
        }
        Ok(())
    }

    /// The driver's (current RSS, peak RSS), when its pid is known.
    fn rss(&self) -> Result<Option<(u64, u64)>, String> {
        match self.pid {
            None => Ok(None),
            Some(p) => Ok(Some((status_bytes(p, "VmRSS:")?, read_peak_rss(p)?))),
        }
    }
}

/// Starts `c.driver` and waits until it answers Probe with ready (not false).
/// Returns the process, clients on a fresh connection, and the time from
/// the start to that answer.
async fn start_driver(
    c: &Common,
    log_dir: &Path,
    timeout: Duration,
) -> Result<(Running, Clients, Duration), String> {
    let (program, args) = c
        .driver
        .split_first()
        .ok_or_else(|| "no driver command after --".to_owned())?;
    if let Endpoint::Unix(sock) = &c.endpoint {
        // A socket left by an earlier run would answer "connection refused"
        // until the driver replaces it: not a reason to wait less.
        let _ = std::fs::remove_file(sock);
    }
    let log = log_dir.join("driver.log");
    let start = Instant::now();
    let mut running = Cmd::new(program)
        .args(args)
        .start(Some(&log))
        .map_err(|e| format!("starting the driver: {e}"))?;
    loop {
        if let Some(status) = running.exited() {
            return Err(format!(
                "the driver exited ({status}) before serving; see {log:?}"
            ));
        }
        if let Ok(channel) = c.endpoint.connect().await {
            let clients = Clients::new(channel, timeout);
            let mut identity = clients.identity.clone();
            let probe = client::call(timeout, csi::ProbeRequest {}, |r| identity.probe(r)).await;
            if probe.is_ok_and(|p| p.ready != Some(false)) {
                return Ok((running, clients, start.elapsed()));
            }
        }
        if start.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "the driver did not serve at {} within 120 s; see {log:?}",
                c.endpoint
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// What creating and mounting a scenario's volumes needs.
struct Ctx {
    clients: Clients,
    capability: csi::VolumeCapability,
    parameters: HashMap<String, String>,
    size: i64,
    stage_unstage: bool,
    staging: PathBuf,
    targets: PathBuf,
}

/// One volume a scenario made, and how far it got.
#[derive(Clone, Debug, Default)]
struct Vol {
    id: String,
    staging: PathBuf,
    target: PathBuf,
    staged: bool,
    published: bool,
}

fn rpc_err(what: &str, s: tonic::Status) -> String {
    format!("{what}: {}: {}", code_name(s.code()), s.message())
}

impl Ctx {
    fn new(c: &Common, t: &Target, dirs: &RunDir) -> Result<Ctx, String> {
        Ok(Ctx {
            clients: t.clients.clone(),
            capability: client::CapabilityArgs {
                fs: Some(c.fs_type.clone()),
                ..Default::default()
            }
            .to_csi(),
            parameters: client::param_map(None, &c.params)?,
            size: c.size,
            stage_unstage: t.stage_unstage,
            staging: dirs.staging.clone(),
            targets: dirs.targets.clone(),
        })
    }

    async fn create(&self, name: String) -> Result<(Vol, Duration), String> {
        let mut ctl = self.clients.controller.clone();
        let req = csi::CreateVolumeRequest {
            name: name.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: self.size,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![self.capability.clone()],
            parameters: self.parameters.clone(),
            ..Default::default()
        };
        let start = Instant::now();
        let r = client::call(self.clients.timeout, req, |r| ctl.create_volume(r))
            .await
            .map_err(|s| rpc_err(&format!("CreateVolume {name}"), s))?;
        let took = start.elapsed();
        let id = r
            .volume
            .ok_or_else(|| "CreateVolume answered without a volume".to_owned())?
            .volume_id;
        Ok((
            Vol {
                id,
                staging: self.staging.join(&name),
                target: self.targets.join(&name),
                ..Vol::default()
            },
            took,
        ))
    }

    /// mkdir of the staging path (as kubelet does), then NodeStageVolume (timed).
    async fn stage(&self, v: &mut Vol) -> Result<Duration, String> {
        if !self.stage_unstage {
            return Ok(Duration::ZERO);
        }
        std::fs::create_dir(&v.staging).map_err(|e| format!("creating {:?}: {e}", v.staging))?;
        v.staged = true;
        let mut node = self.clients.node.clone();
        let req = csi::NodeStageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: path_str(&v.staging)?,
            volume_capability: Some(self.capability.clone()),
            ..Default::default()
        };
        let start = Instant::now();
        client::call(self.clients.timeout, req, |r| node.node_stage_volume(r))
            .await
            .map_err(|s| rpc_err("NodeStageVolume", s))?;
        Ok(start.elapsed())
    }

    async fn publish(&self, v: &mut Vol) -> Result<Duration, String> {
        let mut node = self.clients.node.clone();
        v.published = true;
        let req = csi::NodePublishVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: if self.stage_unstage {
                path_str(&v.staging)?
            } else {
                String::new()
            },
            target_path: path_str(&v.target)?,
            volume_capability: Some(self.capability.clone()),
            ..Default::default()
        };
        let start = Instant::now();
        client::call(self.clients.timeout, req, |r| node.node_publish_volume(r))
            .await
            .map_err(|s| rpc_err("NodePublishVolume", s))?;
        Ok(start.elapsed())
    }

    /// NodeUnpublishVolume (timed), then rmdir of the target if the driver left it.
    async fn unpublish(&self, v: &mut Vol) -> Result<Duration, String> {
        let mut node = self.clients.node.clone();
        let req = csi::NodeUnpublishVolumeRequest {
            volume_id: v.id.clone(),
            target_path: path_str(&v.target)?,
        };
        let start = Instant::now();
        client::call(self.clients.timeout, req, |r| node.node_unpublish_volume(r))
            .await
            .map_err(|s| rpc_err("NodeUnpublishVolume", s))?;
        let took = start.elapsed();
        v.published = false;
        super::rmdir(&v.target).map_err(|e| format!("removing {:?}: {e}", v.target))?;
        Ok(took)
    }

    /// NodeUnstageVolume (timed), then rmdir of the staging path.
    async fn unstage(&self, v: &mut Vol) -> Result<Duration, String> {
        if !v.staged {
            return Ok(Duration::ZERO);
        }
        let mut node = self.clients.node.clone();
        let req = csi::NodeUnstageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: path_str(&v.staging)?,
        };
        let start = Instant::now();
        client::call(self.clients.timeout, req, |r| node.node_unstage_volume(r))
            .await
            .map_err(|s| rpc_err("NodeUnstageVolume", s))?;
        let took = start.elapsed();
        super::rmdir(&v.staging).map_err(|e| format!("removing {:?}: {e}", v.staging))?;
        v.staged = false;
        Ok(took)
    }

    async fn delete(&self, id: &str) -> Result<Duration, String> {
        let mut ctl = self.clients.controller.clone();
        let req = csi::DeleteVolumeRequest {
            volume_id: id.to_owned(),
            secrets: HashMap::new(),
        };
        let start = Instant::now();
        client::call(self.clients.timeout, req, |r| ctl.delete_volume(r))
            .await
            .map_err(|s| rpc_err(&format!("DeleteVolume {id}"), s))?;
        Ok(start.elapsed())
    }

    /// Create, stage and publish.
    async fn mounted(&self, name: String) -> Result<Vol, String> {
        let (mut v, _) = self.create(name).await?;
        let res = async {
            self.stage(&mut v).await?;
            self.publish(&mut v).await
        }
        .await;
        match res {
            Ok(_) => Ok(v),
            Err(e) => {
                self.undo(v).await;
                Err(e)
            }
        }
    }

    /// Unpublish, unstage and delete, as far as `v` got.
    async fn remove(&self, mut v: Vol) -> Result<(), String> {
        if v.published {
            self.unpublish(&mut v).await?;
        }
        self.unstage(&mut v).await?;
        self.delete(&v.id).await?;
        Ok(())
    }

    /// [`Ctx::remove`] after a failure: problems are printed, not returned.
    async fn undo(&self, v: Vol) {
        let id = v.id.clone();
        if let Err(e) = self.remove(v).await {
            eprintln!("localvol bench: cleanup of {id}: {e}");
        }
    }
}

/// Runs `f(0..n)` on `c` tasks that take indexes from one counter; the first
/// error stops new work (running calls finish) and is returned with what the
/// others produced. Results come back in index order.
async fn parallel<T, F, Fut>(n: usize, c: u64, f: F) -> (Vec<T>, Option<String>)
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<T, String>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let out: Arc<Mutex<Vec<(usize, T)>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..c.min(n as u64).max(1) {
        let (next, stop, out, f) = (next.clone(), stop.clone(), out.clone(), f.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    break;
                }
                match f(i).await {
                    Ok(t) => out.lock().expect("results").push((i, t)),
                    Err(e) => {
                        stop.store(true, Ordering::SeqCst);
                        return Some(e);
                    }
                }
            }
            None
        }));
    }
    let mut err = None;
    for t in tasks {
        match t.await {
            Ok(Some(e)) => err = err.or(Some(e)),
            Ok(None) => {}
            Err(e) => err = err.or(Some(format!("worker failed: {e}"))),
        }
    }
    let mut results = std::mem::take(&mut *out.lock().expect("results"));
    results.sort_by_key(|(i, _)| *i);
    (results.into_iter().map(|(_, t)| t).collect(), err)
}

/// Removes `vols` on `c` tasks; the first problem is returned after all were tried.
async fn remove_all(ctx: &Arc<Ctx>, vols: Vec<Vol>, c: u64) -> Result<(), String> {
    let vols = Arc::new(vols);
    let ctx2 = ctx.clone();
    let v2 = vols.clone();
    let (_, err) = parallel(vols.len(), c, move |i| {
        let (ctx, vols) = (ctx2.clone(), v2.clone());
        async move { ctx.remove(vols[i].clone()).await }
    })
    .await;
    err.map_or(Ok(()), Err)
}

/// Publishes `vols.len()..n` more volumes named `<prefix>-f<i>` on `c` tasks.
async fn fill(
    ctx: &Arc<Ctx>,
    prefix: &str,
    vols: &mut Vec<Vol>,
    n: usize,
    c: u64,
) -> Result<(), String> {
    let from = vols.len();
    if n <= from {
        return Ok(());
    }
    let (ctx2, prefix) = (ctx.clone(), prefix.to_owned());
    let (made, err) = parallel(n - from, c, move |i| {
        let (ctx, name) = (ctx2.clone(), format!("{prefix}-f{}", from + i));
        async move { ctx.mounted(name).await }
    })
    .await;
    vols.extend(made);
    err.map_or(Ok(()), Err)
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

async fn node_scale(a: &NodeScaleArgs) -> Outcome {
    let mut levels = a.published.clone();
    if levels.is_empty() || levels.windows(2).any(|w| w[0] >= w[1]) {
        return Err("--published must list increasing numbers".into());
    }
    levels.dedup();
    let (samples, fill_c, rounds) = (a.samples, a.fill_concurrency, a.common.rounds);
    with_target(&a.common, |ctx, prefix, left, _t| async move {
        // per level: each round's figures
        let mut per_level: Vec<Vec<Value>> = vec![Vec::new(); levels.len()];
        for round in 0..rounds {
            let mut kept = Vec::new();
            let res = async {
                for (li, &level) in levels.iter().enumerate() {
                    let p = format!("{prefix}-r{round}");
                    fill(&ctx, &p, &mut kept, level as usize, fill_c).await?;
                    let lines = mount_lines();
                    let (mut st, mut pb, mut sp, mut un) = (vec![], vec![], vec![], vec![]);
                    for s in 0..samples {
                        let (mut v, _) = ctx.create(format!("{p}-l{level}-s{s}")).await?;
                        let r = async {
                            let a = ctx.stage(&mut v).await?;
                            let b = ctx.publish(&mut v).await?;
                            let c = ctx.unpublish(&mut v).await?;
                            let d = ctx.unstage(&mut v).await?;
                            Ok::<_, String>((a, b, c, d))
                        }
                        .await;
                        let (a, b, c, d) = match r {
                            Ok(t) => t,
                            Err(e) => {
                                ctx.undo(v).await;
                                return Err(e);
                            }
                        };
                        ctx.delete(&v.id).await?;
                        st.push(a);
                        pb.push(b);
                        sp.push(a + b);
                        un.push(c + d);
                    }
                    let s = |v: &[Duration]| Summary::of(v).expect("samples");
                    let (sps, uns) = (s(&sp), s(&un));
                    per_level[li].push(json!({
                        "round": round,
                        "mount_lines": lines,
                        "stage_publish_p50_ms": ms(sps.p50),
                        "stage_publish_p99_ms": ms(sps.p99),
                        "stage_p50_ms": ms(s(&st).p50),
                        "publish_p50_ms": ms(s(&pb).p50),
                        "unpublish_unstage_p50_ms": ms(uns.p50),
                        "unpublish_unstage_p99_ms": ms(uns.p99),
                    }));
                }
                Ok::<_, String>(())
            }
            .await;
            let removed = remove_all(&ctx, std::mem::take(&mut kept), fill_c).await;
            if let Err(e) = res {
                // Whatever remove_all could not remove is reported with it.
                return Err(match removed {
                    Ok(()) => e,
                    Err(r) => format!("{e}\ncleanup: {r}"),
                });
            }
            removed?;
        }
        drop(left);
        let keys = [
            "mount_lines",
            "stage_publish_p50_ms",
            "stage_publish_p99_ms",
            "stage_p50_ms",
            "publish_p50_ms",
            "unpublish_unstage_p50_ms",
            "unpublish_unstage_p99_ms",
        ];
        let mut out = Vec::new();
        for (li, level) in levels.iter().enumerate() {
            let mut o = json!({"published": level, "rounds": per_level[li]});
            for k in keys {
                o[k] = json!(median_of(&per_level[li], k));
            }
            out.push(o);
        }
        let base = out[0]["stage_publish_p50_ms"].as_f64().unwrap_or(0.0);
        let last = out[out.len() - 1]["stage_publish_p50_ms"].as_f64().unwrap_or(0.0);
        let growth = if base > 0.0 { last / base } else { 0.0 };
        let j = json!({"mode": "node-scale", "samples": samples, "rounds": rounds,
            "stage_unstage": ctx.stage_unstage, "levels": out, "stage_publish_growth": growth});
        let rows = out
            .iter()
            .map(|o| {
                vec![
                    o["published"].to_string(),
                    format!("{:.0}", o["mount_lines"].as_f64().unwrap_or(0.0)),
                    f3(o["stage_p50_ms"].as_f64().unwrap_or(0.0)),
                    f3(o["publish_p50_ms"].as_f64().unwrap_or(0.0)),
                    f3(o["stage_publish_p50_ms"].as_f64().unwrap_or(0.0)),
                    f3(o["stage_publish_p99_ms"].as_f64().unwrap_or(0.0)),
                    f3(o["unpublish_unstage_p50_ms"].as_f64().unwrap_or(0.0)),
                ]
            })
            .collect();
        let mut h = format!(
            "localvol bench node-scale: {samples} fresh volumes per level, median of {rounds} rounds\n"
        );
        h.push_str(&table(
            &["published", "mount lines", "stage p50", "publish p50", "stage+publish p50", "p99", "unpublish+unstage p50"],
            rows,
        ));
        let _ = writeln!(h, "stage+publish p50 growth, first to last level: {growth:.2}x");
        Ok((j, h))
    })
    .await
}

async fn stats(a: &StatsArgs) -> Outcome {
    let (n, calls, c, rounds) = (a.published, a.calls, a.concurrency, a.common.rounds);
    with_target(&a.common, |ctx, prefix, left, _t| async move {
        let mut kept = Vec::new();
        let res = fill(&ctx, &prefix, &mut kept, n as usize, 4).await;
        left.lock().expect("volumes").extend(kept.iter().cloned());
        res?;
        let kept = Arc::new(kept);
        let mut per_round = Vec::new();
        for round in 0..rounds {
            let (ctx2, kept2) = (ctx.clone(), kept.clone());
            let (times, err) = parallel(calls as usize, c, move |i| {
                let (ctx, kept) = (ctx2.clone(), kept2.clone());
                async move {
                    let v = &kept[i % kept.len()];
                    let mut node = ctx.clients.node.clone();
                    let req = csi::NodeGetVolumeStatsRequest {
                        volume_id: v.id.clone(),
                        volume_path: path_str(&v.target)?,
                        staging_target_path: String::new(),
                    };
                    let start = Instant::now();
                    let r = client::call(ctx.clients.timeout, req, |r| node.node_get_volume_stats(r))
                        .await
                        .map_err(|s| rpc_err("NodeGetVolumeStats", s))?;
                    let took = start.elapsed();
                    if let Some(cond) = r.volume_condition.filter(|c| c.abnormal) {
                        return Err(format!("volume {} reported abnormal: {}", v.id, cond.message));
                    }
                    Ok(took)
                }
            })
            .await;
            if let Some(e) = err {
                return Err(e);
            }
            let s = Summary::of(&times).ok_or("no calls")?;
            let mut r = summary_json(&s);
            r["round"] = json!(round);
            per_round.push(r);
        }
        let j = json!({"mode": "stats", "published": n, "calls": calls, "concurrency": c,
            "mount_lines": mount_lines(),
            "p50_ms": median_of(&per_round, "p50_ms"), "p90_ms": median_of(&per_round, "p90_ms"),
            "p99_ms": median_of(&per_round, "p99_ms"), "rounds": per_round});
        let h = format!(
            "localvol bench stats: {calls} NodeGetVolumeStats calls over {n} published volumes, concurrency {c}, median of {rounds} rounds\n{}",
            table(
                &["p50 ms", "p90 ms", "p99 ms"],
                vec![vec![f3(j["p50_ms"].as_f64().unwrap_or(0.0)), f3(j["p90_ms"].as_f64().unwrap_or(0.0)), f3(j["p99_ms"].as_f64().unwrap_or(0.0))]],
            )
        );
        Ok((j, h))
    })
    .await
}

/// One full ListVolumes pass: total time, each page's time, entries listed.
async fn list_pass(
    clients: &Clients,
    page: i32,
) -> Result<(Duration, Vec<Duration>, usize), String> {
    let mut ctl = clients.controller.clone();
    let (mut token, mut pages, mut count) = (String::new(), Vec::new(), 0);
    let start = Instant::now();
    loop {
        let req = csi::ListVolumesRequest {
            max_entries: page,
            starting_token: token,
        };
        let t = Instant::now();
        let r = client::call(clients.timeout, req, |r| ctl.list_volumes(r))
            .await
            .map_err(|s| rpc_err("ListVolumes", s))?;
        pages.push(t.elapsed());
        count += r.entries.len();
        if r.next_token.is_empty() {
            break;
        }
        token = r.next_token;
        if pages.len() > 1_000_000 {
            return Err("ListVolumes keeps handing out tokens".into());
        }
    }
    Ok((start.elapsed(), pages, count))
}

/// How long `churn` waits after its list passes before it reads the
/// driver's settled RSS (the driver trims its heap 200 ms after a large
/// answer; see `localvol::memory`, not used here so any driver compares).
const SETTLE: Duration = Duration::from_secs(1);

async fn churn(a: &ChurnArgs) -> Outcome {
    let (n, c, page, passes, rounds) =
        (a.volumes, a.concurrency, a.page, a.passes, a.common.rounds);
    with_target(&a.common, |ctx, prefix, left, target| async move {
        let mut per_round = Vec::new();
        for round in 0..rounds {
            let (ctx2, p) = (ctx.clone(), format!("{prefix}-r{round}"));
            let start = Instant::now();
            let (made, err) = parallel(n as usize, c, move |i| {
                let (ctx, name) = (ctx2.clone(), format!("{p}-{i}"));
                async move { Ok(ctx.create(name).await?.0) }
            })
            .await;
            let create_s = start.elapsed();
            left.lock().expect("volumes").extend(made.iter().cloned());
            if let Some(e) = err {
                return Err(e);
            }
            let (mut paged, mut unpaged, mut page_times, mut listed) = (vec![], vec![], vec![], 0);
            for _ in 0..passes {
                let (t, pages, count) = list_pass(&ctx.clients, page).await?;
                paged.push(ms(t));
                page_times.extend(pages);
                listed = count;
                let (t, _, _) = list_pass(&ctx.clients, 0).await?;
                unpaged.push(ms(t));
            }
            // Right after the last (unpaged) pass, then settled: a second
            // later, once the driver has handed the answer's memory back.
            let rss_after_list = target.rss()?;
            tokio::time::sleep(SETTLE).await;
            let rss = target.rss()?;
            let ids: Arc<Vec<String>> = Arc::new(made.iter().map(|v| v.id.clone()).collect());
            let (ctx2, ids2) = (ctx.clone(), ids.clone());
            let start = Instant::now();
            let (_, err) = parallel(ids.len(), c, move |i| {
                let (ctx, ids) = (ctx2.clone(), ids2.clone());
                async move { ctx.delete(&ids[i]).await }
            })
            .await;
            let delete_s = start.elapsed();
            if let Some(e) = err {
                return Err(e);
            }
            left.lock().expect("volumes").clear();
            let pt = Summary::of(&page_times).ok_or("no pages")?;
            let mut sorted = page_times.clone();
            sorted.sort_unstable();
            per_round.push(json!({
                "round": round,
                "create_per_sec": n as f64 / create_s.as_secs_f64().max(1e-9),
                "delete_per_sec": n as f64 / delete_s.as_secs_f64().max(1e-9),
                "list_paged_ms": median(&paged),
                "list_unpaged_ms": median(&unpaged),
                "listed": listed,
                "pages_per_pass": page_times.len() as u64 / passes,
                "page_p50_ms": ms(pt.p50),
                "page_max_ms": ms(percentile(&sorted, 100)),
                "rss_bytes": rss.map(|r| r.0),
                "rss_after_list_bytes": rss_after_list.map(|r| r.0),
                "peak_rss_bytes": rss.map(|r| r.1),
            }));
        }
        let keys = [
            "create_per_sec",
            "delete_per_sec",
            "list_paged_ms",
            "list_unpaged_ms",
            "page_p50_ms",
            "page_max_ms",
            "rss_bytes",
            "rss_after_list_bytes",
            "peak_rss_bytes",
        ];
        let mut j = json!({"mode": "churn", "volumes": n, "concurrency": c, "page": page,
            "passes": passes, "listed": per_round[0]["listed"], "rounds": per_round});
        for k in keys {
            j[k] = json!(median_of(&per_round, k));
        }
        let g = |k: &str| j[k].as_f64().unwrap_or(0.0);
        let rss = |k: &str| match j["rounds"][0][k].is_null() {
            true => "-".to_owned(),
            false => human(g(k) as u64),
        };
        let h = format!(
            "localvol bench churn: {n} volumes, {c} client threads, pages of {page}, median of {rounds} rounds\n{}",
            table(
                &["creates/s", "deletes/s", "list paged ms", "list unpaged ms", "page p50 ms", "page max ms", "RSS after the lists", "RSS settled", "peak RSS"],
                vec![vec![
                    format!("{:.0}", g("create_per_sec")),
                    format!("{:.0}", g("delete_per_sec")),
                    f3(g("list_paged_ms")),
                    f3(g("list_unpaged_ms")),
                    f3(g("page_p50_ms")),
                    f3(g("page_max_ms")),
                    rss("rss_after_list_bytes"),
                    rss("rss_bytes"),
                    rss("peak_rss_bytes"),
                ]],
            )
        );
        Ok((j, h))
    })
    .await
}

async fn restart(a: &RestartArgs) -> Outcome {
    let c = &a.common;
    if c.driver.is_empty() {
        return Err("restart starts the driver itself: give its command after --".into());
    }
    let (n, conc, rounds) = (a.volumes, a.concurrency, c.rounds);
    let base = match &c.work_dir {
        Some(d) => std::path::absolute(d).map_err(|e| format!("work dir {d:?}: {e}"))?,
        None => std::env::temp_dir(),
    };
    let run = run_id();
    let dirs = RunDir::create(&base, &run, false)?;
    let prefix = format!("{}-{run}", c.name_prefix);
    let res = restart_rounds(c, &base, &dirs, &prefix, n, conc, rounds).await;
    let removed = dirs.remove();
    let res = res?;
    removed?;
    Ok(res)
}

async fn restart_rounds(
    c: &Common,
    base: &Path,
    dirs: &RunDir,
    prefix: &str,
    n: u64,
    conc: u64,
    rounds: u64,
) -> Outcome {
    // Populate.
    let t = Target::open(c, base).await?;
    let ctx = Arc::new(Ctx::new(c, &t, dirs)?);
    let (ctx2, p) = (ctx.clone(), prefix.to_owned());
    let (made, err) = parallel(n as usize, conc, move |i| {
        let (ctx, name) = (ctx2.clone(), format!("{p}-{i}"));
        async move { Ok(ctx.create(name).await?.0.id) }
    })
    .await;
    let ids = Arc::new(made);
    let mut res = match err {
        Some(e) => Err(e),
        None => Ok(()),
    };
    let mut per_round = Vec::new();
    let mut t = Some(t);
    for round in 0..rounds {
        if res.is_err() {
            break;
        }
        if let Some(old) = t.take() {
            old.close().await?;
        }
        let fresh = match Target::open(c, base).await {
            Ok(f) => f,
            Err(e) => {
                res = Err(e);
                break;
            }
        };
        let serving = fresh.serving.unwrap_or_default();
        let loaded = fresh.rss()?;
        let listed = match list_pass(&fresh.clients, 500).await {
            Ok((_, _, count)) => count,
            Err(e) => {
                res = Err(e);
                t = Some(fresh);
                break;
            }
        };
        if (listed as u64) < n {
            res = Err(format!(
                "the restarted driver lists {listed} volumes, fewer than the {n} made"
            ));
        }
        let rss = fresh.rss()?;
        per_round.push(json!({
            "round": round,
            "serving_ms": ms(serving),
            "listed": listed,
            "rss_serving_bytes": loaded.map(|r| r.0),
            "rss_bytes": rss.map(|r| r.0),
            "peak_rss_bytes": rss.map(|r| r.1),
        }));
        t = Some(fresh);
    }
    // Remove what was made, through the last driver.
    let t = match t {
        Some(t) => t,
        None => Target::open(c, base).await?,
    };
    let ctx = Arc::new(Ctx::new(c, &t, dirs)?);
    let (ctx2, ids2) = (ctx.clone(), ids.clone());
    let (_, err) = parallel(ids.len(), conc, move |i| {
        let (ctx, ids) = (ctx2.clone(), ids2.clone());
        async move { ctx.delete(&ids[i]).await }
    })
    .await;
    drop(ctx);
    let closed = t.close().await;
    res?;
    if let Some(e) = err {
        return Err(e);
    }
    closed?;
    let mut j = json!({"mode": "restart", "volumes": n, "rounds": per_round});
    for k in [
        "serving_ms",
        "rss_serving_bytes",
        "rss_bytes",
        "peak_rss_bytes",
    ] {
        j[k] = json!(median_of(&per_round, k));
    }
    let g = |k: &str| j[k].as_f64().unwrap_or(0.0);
    let h = format!(
        "localvol bench restart: {n} volumes, median of {rounds} restarts\n{}",
        table(
            &[
                "start to serving ms",
                "RSS serving",
                "RSS after listing",
                "peak RSS"
            ],
            vec![vec![
                f3(g("serving_ms")),
                human(g("rss_serving_bytes") as u64),
                human(g("rss_bytes") as u64),
                human(g("peak_rss_bytes") as u64),
            ]],
        )
    );
    Ok((j, h))
}

async fn sweep(a: &SweepArgs) -> Outcome {
    let c = &a.common;
    if a.concurrency.is_empty() {
        return Err("--concurrency needs at least one value".into());
    }
    let base = match &c.work_dir {
        Some(d) => std::path::absolute(d).map_err(|e| format!("work dir {d:?}: {e}"))?,
        None => std::env::temp_dir(),
    };
    let mut per_level: Vec<Vec<Value>> = vec![Vec::new(); a.concurrency.len()];
    for round in 0..c.rounds {
        for (li, &conc) in a.concurrency.iter().enumerate() {
            let t = Target::open(c, &base).await?;
            let server_pid = match (&t.running, t.pid) {
                (Some(_), Some(p)) => Some(ServerPid::Pid(p)),
                _ => c.server_pid,
            };
            let args = super::BenchArgs {
                scenario: None,
                endpoint: c.endpoint.clone(),
                volumes: a.volumes,
                concurrency: conc,
                size: c.size,
                params: c.params.clone(),
                fs_type: c.fs_type.clone(),
                work_dir: Some(base.clone()),
                server_pid,
                // A driver the bench did not start: its peak since the last run is reset.
                reset_peak_rss: t.running.is_none() && server_pid.is_some(),
                name_prefix: format!("{}-c{conc}", c.name_prefix),
                timeout: c.timeout,
                json: true,
                floor: false,
                floor_lvm: None,
                floor_rpc: false,
                stage_secret_files: Vec::new(),
            };
            let report = super::run(&args).await;
            t.close().await?;
            let r = report?;
            per_level[li].push(json!({
                "round": round,
                "lifecycles_per_sec": r.lifecycles_per_sec(),
                "lifecycle_p50_ms": ms(r.lifecycle.p50),
                "lifecycle_p99_ms": ms(r.lifecycle.p99),
                "peak_rss_bytes": r.server_peak_rss.map(|(_, b)| b),
            }));
        }
    }
    let mut levels = Vec::new();
    for (li, conc) in a.concurrency.iter().enumerate() {
        let mut o = json!({"concurrency": conc, "rounds": per_level[li]});
        for k in [
            "lifecycles_per_sec",
            "lifecycle_p50_ms",
            "lifecycle_p99_ms",
            "peak_rss_bytes",
        ] {
            o[k] = json!(median_of(&per_level[li], k));
        }
        levels.push(o);
    }
    let rows = levels
        .iter()
        .map(|o| {
            let g = |k: &str| o[k].as_f64().unwrap_or(0.0);
            vec![
                o["concurrency"].to_string(),
                format!("{:.1}", g("lifecycles_per_sec")),
                f3(g("lifecycle_p50_ms")),
                f3(g("lifecycle_p99_ms")),
                match o["rounds"][0]["peak_rss_bytes"].is_null() {
                    true => "-".to_owned(),
                    false => human(g("peak_rss_bytes") as u64),
                },
            ]
        })
        .collect();
    let j = json!({"mode": "sweep", "volumes": a.volumes, "rounds": c.rounds, "levels": levels});
    let h = format!(
        "localvol bench sweep: {} lifecycles per run, median of {} rounds\n{}",
        a.volumes,
        c.rounds,
        table(
            &[
                "concurrency",
                "lifecycles/s",
                "lifecycle p50 ms",
                "p99 ms",
                "driver peak RSS"
            ],
            rows
        )
    );
    Ok((j, h))
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
