//! Prometheus metrics and the health endpoints, served on `--metrics-addr`:
//! `/metrics` (text exposition), `/healthz` (the process serves) and `/readyz`
//! (the driver serves; it lists the pools that cannot).
//!
//! RPC figures are recorded by `service::rpc`; pool and volume figures are read
//! from the pools at scrape time, so they cannot drift from the node's state.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};

use crate::error::{IoContext, IoError};
use crate::pool::Pools;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    method: &'static str,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
    backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LvmRunLabels {
    /// The RPC method, or `wipe`, `metrics`, `start`, `other`.
    caller: &'static str,
    /// The lvm subcommand (`lvs`, `lvcreate`, ...).
    command: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    /// The lvm subcommand (`lvs`, `lvcreate`, ...).
    command: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VolumeLabels {
    pool: String,
    volume: String,
}

pub struct Metrics {
    registry: Registry,
    rpc_total: Family<RpcLabels, Counter>,
    rpc_seconds: Family<MethodLabels, Histogram>,
    pool_capacity: Family<PoolLabels, Gauge>,
    pool_allocated: Family<PoolLabels, Gauge>,
    pool_free: Family<PoolLabels, Gauge>,
    pool_volumes: Family<PoolLabels, Gauge>,
    pool_ready: Family<PoolLabels, Gauge>,
    pool_degraded: Family<PoolLabels, Gauge>,
    pool_check_timeouts: Family<PoolLabels, Counter>,
    thin_data: Family<PoolLabels, Gauge<f64, AtomicU64>>,
    thin_metadata: Family<PoolLabels, Gauge<f64, AtomicU64>>,
    volume_used: Family<VolumeLabels, Gauge>,
    volume_limit: Family<VolumeLabels, Gauge>,
    volume_abnormal: Family<VolumeLabels, Gauge>,
    /// What NodeGetVolumeStats last answered about each volume's condition
    /// (abnormal or not), from which each scrape sets `volume_abnormal` for
    /// the volumes its pool still lists: a deleted volume leaves no series.
    conditions: Mutex<HashMap<VolumeLabels, bool>>,
    discovered: Counter,
    cleanups: Family<ResultLabels, Counter>,
    cleanup_seconds: Histogram,
    orphans: Gauge,
    orphans_kept: Gauge,
    wipe_pending: Family<PoolLabels, Gauge>,
    wiped_bytes: Family<PoolLabels, Counter>,
    wipe_seconds: Family<PoolLabels, Counter<f64, AtomicU64>>,
    lvm_runs: Family<LvmRunLabels, Counter>,
    lvm_slowest: Family<CommandLabels, Gauge<f64, AtomicU64>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// Registers `metric` under `name` and returns it (a handle on the same
/// values).
fn registered<M: Metric + Clone>(r: &mut Registry, name: &str, help: &str, metric: M) -> M {
    r.register(name, help, metric.clone());
    metric
}

/// Per-pool gauges, in the order `Metrics::new` takes them.
const POOL_GAUGES: [(&str, &str); 6] = [
    ("pool_capacity_bytes", "Allocated plus free bytes of a pool"),
    (
        "pool_allocated_bytes",
        "Bytes promised to the pool's volumes",
    ),
    (
        "pool_free_bytes",
        "Bytes a new volume can get now (GetCapacity)",
    ),
    ("pool_volumes", "Volumes in the pool"),
    ("pool_ready", "1 when the pool can serve; 0 while it is unusable (its volumes' RPCs are refused, it offers no capacity; the log and the Node's Events say why)"),
    ("pool_degraded", "1 while the pool's last health checks all timed out (lvm slow): it still serves, its last known health stands"),
];

/// Per-thin-pool gauges (LVM pools with a thin pool), as lvm reports them.
const THIN_GAUGES: [(&str, &str); 2] = [
    (
        "pool_thin_data_percent",
        "Data% of an LVM pool's thin pool (lvs data_percent)",
    ),
    (
        "pool_thin_metadata_percent",
        "Metadata% of an LVM pool's thin pool (lvs metadata_percent)",
    ),
];

/// Per-volume gauges, in `Metrics::new`'s order: quota-enforced volumes'
/// usage, and the condition of the volumes kubelet asks about.
const VOLUME_GAUGES: [(&str, &str); 3] = [
    (
        "volume_quota_used_bytes",
        "Bytes used by a quota-enforced volume",
    ),
    (
        "volume_quota_limit_bytes",
        "Enforced size of a quota-enforced volume",
    ),
    (
        "volume_condition_abnormal",
        "1 when NodeGetVolumeStats last found the volume's condition abnormal, 0 when healthy (published volumes: kubelet asks about those)",
    ),
];

const ORPHAN_GAUGES: [(&str, &str); 2] = [
    (
        "orphan_volumes",
        "Volumes of this node that no PersistentVolume refers to",
    ),
    (
        "orphan_volumes_kept_after_node_loss",
        "Orphans whose PV the node-loss controller deleted while their storage survived: never reclaimed",
    ),
];

type WipeFamilies = (
    Family<PoolLabels, Gauge>,
    Family<PoolLabels, Counter>,
    Family<PoolLabels, Counter<f64>>,
);

/// The background wipe's figures, by pool: bytes waiting, bytes zeroed,
/// seconds spent.
fn wipe_families(r: &mut Registry) -> WipeFamilies {
    (
        registered(
            r,
            "wipe_pending_bytes",
            "Bytes of deleted volumes waiting to be zeroed before they return to the pool",
            Family::default(),
        ),
        registered(
            r,
            "wiped_bytes",
            "Bytes of deleted volumes zeroed (rate over wipe_seconds: wipe throughput)",
            Family::default(),
        ),
        registered(
            r,
            "wipe_seconds",
            "Time spent zeroing deleted volumes",
            Family::default(),
        ),
    )
}

impl Metrics {
    fn new() -> Self {
        let r = &mut Registry::with_prefix("localvol");
        // 100 µs to ~26 s.
        let rpc_histogram = || Histogram::new(exponential_buckets(0.0001, 2.0, 19));
        let [pool_capacity, pool_allocated, pool_free, pool_volumes, pool_ready, pool_degraded] =
            POOL_GAUGES.map(|(name, help)| registered(r, name, help, Family::default()));
        let [thin_data, thin_metadata] =
            THIN_GAUGES.map(|(name, help)| registered(r, name, help, Family::default()));
        let [volume_used, volume_limit, volume_abnormal] =
            VOLUME_GAUGES.map(|(name, help)| registered(r, name, help, Family::default()));
        let [orphans, orphans_kept] =
            ORPHAN_GAUGES.map(|(name, help)| registered(r, name, help, Gauge::default()));
        let (wipe_pending, wiped_bytes, wipe_seconds) = wipe_families(r);
        let (lvm_runs, lvm_slowest) = lvm_families(r);
        Metrics {
            rpc_total: registered(
                r,
                "rpc_requests",
                "CSI calls served, by method and gRPC code",
                Family::default(),
            ),
            rpc_seconds: registered(
                r,
                "rpc_duration_seconds",
                "Time to serve a CSI call",
                Family::new_with_constructor(rpc_histogram),
            ),
            pool_capacity,
            pool_allocated,
            pool_free,
            pool_volumes,
            pool_ready,
            pool_degraded,
            pool_check_timeouts: registered(
                r,
                "pool_health_check_timeouts",
                "Pool health checks that timed out (lvm too slow to answer); each keeps the last known health",
                Family::default(),
            ),
            thin_data,
            thin_metadata,
            volume_used,
            volume_limit,
            volume_abnormal,
            conditions: Mutex::default(),
            discovered: registered(
                r,
                "discovered_volumes",
                "PersistentVolumes created by static discovery",
                Counter::default(),
            ),
            cleanups: registered(
                r,
                "cleanups",
                "Cleanups of released static volumes, by result",
                Family::default(),
            ),
            cleanup_seconds: registered(
                r,
                "cleanup_duration_seconds",
                "Time to clean a released static volume",
                Histogram::new(exponential_buckets(0.01, 4.0, 12)),
            ),
            orphans,
            orphans_kept,
            wipe_pending,
            wiped_bytes,
            wipe_seconds,
            lvm_runs,
            lvm_slowest,
            registry: std::mem::take(r),
        }
    }
}

/// The lvm runs' counters and their longest run per subcommand.
type LvmFamilies = (
    Family<LvmRunLabels, Counter>,
    Family<CommandLabels, Gauge<f64, AtomicU64>>,
);

fn lvm_families(r: &mut Registry) -> LvmFamilies {
    (
        registered(
            r,
            "lvm_runs",
            "lvm processes run, by what they were run for (RPC method or background task) and subcommand",
            Family::default(),
        ),
        registered(
            r,
            "lvm_run_seconds_max",
            "The longest lvm run since the plugin started, by subcommand (a killed run counts at its time limit)",
            Family::default(),
        ),
    )
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

fn metrics() -> &'static Metrics {
    METRICS.get_or_init(Metrics::new)
}

/// Records one served RPC.
/// `code`: the gRPC status code's name (`Ok`, `NotFound`, ...).
pub fn record_rpc(method: &'static str, code: &str, seconds: f64) {
    let m = metrics();
    let code = code.to_owned();
    m.rpc_total.get_or_create(&RpcLabels { method, code }).inc();
    m.rpc_seconds
        .get_or_create(&MethodLabels { method })
        .observe(seconds);
}

/// A PV created by static discovery.
pub fn record_discovered() {
    metrics().discovered.inc();
}

/// One cleanup of a released static volume.
pub fn record_cleanup(ok: bool, seconds: f64) {
    let m = metrics();
    m.cleanups
        .get_or_create(&ResultLabels {
            result: if ok { "success" } else { "failure" },
        })
        .inc();
    m.cleanup_seconds.observe(seconds);
}

/// Orphans found by the last pass, and how many of them are kept because
/// the node-loss controller deleted their PVs (see `k8s::lost`).
pub fn set_orphans(n: usize, kept: usize) {
    metrics().orphans.set(gauge_value(n as u64));
    metrics().orphans_kept.set(gauge_value(kept as u64));
}

/// A pool's wipe figures: the pending gauge, and the counters brought up to
/// the pool's own totals (they only grow).
fn record_wipes(m: &Metrics, labels: &PoolLabels, w: crate::pool::Wipes) {
    m.wipe_pending
        .get_or_create(labels)
        .set(gauge_value(w.pending_bytes));
    let bytes = m.wiped_bytes.get_or_create(labels);
    bytes.inc_by(w.wiped_bytes.saturating_sub(bytes.get()));
    let secs = m.wipe_seconds.get_or_create(labels);
    let more = w.seconds - secs.get();
    if more > 0.0 {
        secs.inc_by(more);
    }
}

/// The lvm run counters brought up to `runs::lvm_runs()` (they only grow).
fn record_lvm_runs(m: &Metrics) {
    for (caller, command, n) in crate::runs::lvm_runs() {
        let c = m.lvm_runs.get_or_create(&LvmRunLabels { caller, command });
        c.inc_by(n.saturating_sub(c.get()));
    }
    for (command, secs) in crate::runs::slowest_lvm_runs() {
        m.lvm_slowest
            .get_or_create(&CommandLabels { command })
            .set(secs);
    }
}

/// The volume condition NodeGetVolumeStats reported (abnormal or not),
/// shown as `localvol_volume_condition_abnormal` while the volume exists.
/// Returns the one reported before, if any.
pub fn set_volume_condition(pool: &str, volume: &str, abnormal: bool) -> Option<bool> {
    let key = VolumeLabels {
        pool: pool.to_owned(),
        volume: volume.to_owned(),
    };
    conditions(metrics()).insert(key, abnormal)
}

/// Forgets a volume's condition: it is unpublished (or unstaged) here, so
/// kubelet stops asking and the last answer would go stale.
pub fn forget_volume_condition(volume: &str) {
    conditions(metrics()).retain(|k, _| k.volume != volume);
}

fn conditions(m: &Metrics) -> std::sync::MutexGuard<'_, HashMap<VolumeLabels, bool>> {
    m.conditions.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sets `volume_abnormal` for `pool`'s volumes whose condition is known,
/// and forgets the conditions of its volumes that are gone.
fn record_conditions<'a>(m: &Metrics, pool: &str, listed: impl IntoIterator<Item = &'a str>) {
    let listed: std::collections::HashSet<&str> = listed.into_iter().collect();
    let mut known = conditions(m);
    known.retain(|k, _| k.pool != pool || listed.contains(k.volume.as_str()));
    for (k, abnormal) in known.iter().filter(|(k, _)| k.pool == pool) {
        m.volume_abnormal.get_or_create(k).set(i64::from(*abnormal));
    }
}

fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// What the endpoint serves from: the pools and which of them cannot serve.
/// The driver implements it; metrics know nothing else of it.
pub trait Source: Send + Sync + 'static {
    fn pools(&self) -> &Pools;
    /// One line per pool that cannot serve now (`/readyz` lists them).
    fn unusable_pools(&self) -> Vec<String>;
    /// One line per pool that serves but is degraded (`/readyz` lists them).
    fn degraded_pools(&self) -> Vec<String> {
        self.pools()
            .iter()
            .filter_map(|p| Some(format!("pool {}: {}", p.name(), p.degraded()?)))
            .collect()
    }
}

/// Held by the one refresh of the pools' figures in progress: scrapes that
/// come meanwhile wait for it (up to `--metrics-wait`) instead of starting
/// more lvm runs.
static REFRESH: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Refreshes the pool and volume gauges from the pools (in a task of its
/// own, so that a scrape that stops waiting does not cut it short), waits
/// for that up to `wait` (`--metrics-wait`, 5 s), then encodes everything
/// as it stands. The figures come from lvm and the filesystems, which a
/// loaded node makes slow (lvm runs of over a minute, measured by the e2e
/// load story): a scrape that waited for them went unanswered for 6
/// minutes, and Prometheus gives up after 10 s, so the gauges went missing
/// exactly when the node was busy.
pub async fn render<D: Source>(driver: Arc<D>, wait: Duration) -> String {
    let waited = match REFRESH.try_lock() {
        Ok(guard) => {
            let refresh = tokio::spawn(crate::runs::attributed("metrics", async move {
                let _one = guard;
                refresh_pools(driver.pools()).await;
            }));
            tokio::time::timeout(wait, refresh).await.is_ok()
        }
        Err(_) => tokio::time::timeout(wait, REFRESH.lock()).await.is_ok(),
    };
    if !waited {
        tracing::debug!("metrics: the pools' figures are still being read; last ones served");
    }
    let m = metrics();
    record_lvm_runs(m);
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &m.registry) {
        tracing::error!(error = %e, "encoding metrics");
    }
    out
}

async fn refresh_pools(pools: &Pools) {
    let m = metrics();
    // Per-volume series are gathered first and swapped in at the end, with
    // no await in between: a scrape during a refresh sees the last whole set.
    let mut listed: Vec<(String, Vec<String>)> = Vec::new();
    let mut usage: Vec<(VolumeLabels, u64, u64)> = Vec::new();
    for pool in pools.iter() {
        let labels = PoolLabels {
            pool: pool.name().to_string(),
            backend: pool.backend().as_str(),
        };
        let ready = pool.health().await.is_ready();
        m.pool_ready.get_or_create(&labels).set(i64::from(ready));
        let degraded = pool.degraded().is_some();
        m.pool_degraded
            .get_or_create(&labels)
            .set(i64::from(degraded));
        {
            // The family's guard is not Send: dropped before the next await.
            let timeouts = m.pool_check_timeouts.get_or_create(&labels);
            let counted = timeouts.get();
            timeouts.inc_by(pool.slow_checks().total.saturating_sub(counted));
        }
        if let Ok(Some(t)) = pool.thin_usage().await {
            m.thin_data.get_or_create(&labels).set(t.data_percent);
            m.thin_metadata
                .get_or_create(&labels)
                .set(t.metadata_percent);
        }
        if let Ok(Some(w)) = pool.wipes().await {
            record_wipes(m, &labels, w);
        }
        let (Ok(cap), Ok(vols)) = (pool.capacity().await, pool.list().await) else {
            continue;
        };
        let allocated: u64 = vols.iter().map(|v| v.size_bytes).sum();
        m.pool_allocated
            .get_or_create(&labels)
            .set(gauge_value(allocated));
        m.pool_free
            .get_or_create(&labels)
            .set(gauge_value(cap.available_bytes));
        m.pool_capacity
            .get_or_create(&labels)
            .set(gauge_value(allocated.saturating_add(cap.available_bytes)));
        m.pool_volumes
            .get_or_create(&labels)
            .set(gauge_value(vols.len() as u64));
        listed.push((
            labels.pool.clone(),
            vols.iter().map(|v| v.id.to_string()).collect(),
        ));
        for v in vols.iter().filter(|v| v.project_id.is_some()) {
            if let Ok(Some(u)) = pool.usage(v).await {
                let vl = VolumeLabels {
                    pool: labels.pool.clone(),
                    volume: v.id.to_string(),
                };
                usage.push((vl, u.used_bytes, u.total_bytes));
            }
        }
    }
    m.volume_used.clear();
    m.volume_limit.clear();
    m.volume_abnormal.clear();
    for (pool, ids) in &listed {
        record_conditions(m, pool, ids.iter().map(String::as_str));
    }
    for (vl, used, total) in usage {
        m.volume_used.get_or_create(&vl).set(gauge_value(used));
        m.volume_limit.get_or_create(&vl).set(gauge_value(total));
    }
}

/// An answer of [`serve_get`]'s: status, content type, body.
pub(crate) type Reply = (StatusCode, &'static str, String);

async fn handle<D: Source>(driver: Arc<D>, path: &str, wait: Duration) -> Reply {
    match path {
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            render(driver, wait).await,
        ),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".into()),
        // Ready while the driver serves: a pool that cannot serve is
        // listed (and is 0 in localvol_pool_ready), not a reason to take
        // the plugin out of service.
        "/readyz" => {
            let mut text = "ready\n".to_owned();
            for line in driver.unusable_pools() {
                text.push_str(&format!("unusable: {line}\n"));
            }
            for line in driver.degraded_pools() {
                text.push_str(&format!("degraded: {line}\n"));
            }
            (StatusCode::OK, "text/plain", text)
        }
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// Binds the metrics address (so a bad address fails start-up) and returns the
/// server task.
pub async fn bind<D: Source>(
    addr: SocketAddr,
    driver: Arc<D>,
    wait: Duration,
) -> Result<impl std::future::Future<Output = ()>, IoError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .ctx(|| format!("binding metrics address {addr}"))?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    Ok(serve_get(listener, "metrics", move |path| {
        let driver = driver.clone();
        async move { handle(driver, &path, wait).await }
    }))
}

/// A plain HTTP/1.1 server of GET requests on `listener`, each answered by
/// `answer` from its path; any other method is refused. Runs on the runtime
/// that polls it (the liveness endpoint's is a thread of its own).
pub(crate) async fn serve_get<F, Fut>(
    listener: tokio::net::TcpListener,
    what: &'static str,
    answer: F,
) where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Reply> + Send + 'static,
{
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, what, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let answer = answer.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let answer = answer.clone();
                async move {
                    let (status, ctype, body) = if req.method() == hyper::Method::GET {
                        answer(req.uri().path().to_owned()).await
                    } else {
                        (
                            StatusCode::METHOD_NOT_ALLOWED,
                            "text/plain",
                            "GET only\n".into(),
                        )
                    };
                    let reply = Response::builder()
                        .status(status)
                        .header("content-type", ctype)
                        .body(Full::new(Bytes::from(body)))
                        .expect("static response parts");
                    Ok::<_, Infallible>(reply)
                }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, what, "http connection");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_metrics_follow_naming_conventions() {
        // The registry is process-wide and other tests serve real RPCs: use a
        // method name no RPC has.
        record_rpc("TestOnlyMethod", "Ok", 0.002);
        record_rpc("TestOnlyMethod", "AlreadyExists", 0.001);
        let pool = PoolLabels {
            pool: "test-only".into(),
            backend: "dir",
        };
        metrics().pool_free.get_or_create(&pool).set(4096);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &metrics().registry).unwrap();
        for want in [
            r#"localvol_rpc_requests_total{method="TestOnlyMethod",code="Ok"} 1"#,
            r#"localvol_rpc_requests_total{method="TestOnlyMethod",code="AlreadyExists"} 1"#,
            r#"localvol_rpc_duration_seconds_count{method="TestOnlyMethod"} 2"#,
            "# TYPE localvol_pool_free_bytes gauge",
            "# TYPE localvol_cleanup_duration_seconds histogram",
            "# TYPE localvol_orphan_volumes gauge",
            r#"localvol_pool_free_bytes{pool="test-only",backend="dir"} 4096"#,
        ] {
            assert!(out.contains(want), "{want} missing from:\n{out}");
        }
        // Every metric is registered, with its type (families show once
        // they have a member).
        let m = metrics();
        for f in [
            &m.pool_capacity,
            &m.pool_allocated,
            &m.pool_volumes,
            &m.pool_ready,
        ] {
            f.get_or_create(&pool).set(1);
        }
        let vol = VolumeLabels {
            pool: "test-only".into(),
            volume: "test-only.0".into(),
        };
        for f in [&m.volume_used, &m.volume_limit] {
            f.get_or_create(&vol).set(1);
        }
        for f in [&m.thin_data, &m.thin_metadata] {
            f.get_or_create(&pool).set(42.5);
        }
        m.cleanups
            .get_or_create(&ResultLabels {
                result: "test-only",
            })
            .inc();
        let wiping = PoolLabels {
            pool: "test-only-wipes".into(),
            backend: "lvm",
        };
        for (wiped, seconds) in [(1 << 20, 0.5), (3 << 20, 1.5)] {
            let w = crate::pool::Wipes {
                pending_bytes: 4096,
                wiped_bytes: wiped,
                seconds,
            };
            record_wipes(m, &wiping, w);
        }
        m.lvm_runs
            .get_or_create(&LvmRunLabels {
                caller: "test-only",
                command: "lvs",
            })
            .inc();
        crate::runs::record_lvm_duration("test-only", std::time::Duration::from_millis(2500));
        record_lvm_runs(m);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &m.registry).unwrap();
        for want in [
            r#"localvol_wipe_pending_bytes{pool="test-only-wipes",backend="lvm"} 4096"#,
            r#"localvol_wiped_bytes_total{pool="test-only-wipes",backend="lvm"} 3145728"#,
            r#"localvol_wipe_seconds_total{pool="test-only-wipes",backend="lvm"} 1.5"#,
            r#"localvol_lvm_runs_total{caller="test-only",command="lvs"} 1"#,
            r#"localvol_lvm_run_seconds_max{command="test-only"} 2.5"#,
        ] {
            assert!(out.contains(want), "{want} missing from:\n{out}");
        }
        for want in [
            "localvol_wipe_pending_bytes gauge",
            "localvol_wiped_bytes counter",
            "localvol_wipe_seconds counter",
            "localvol_rpc_requests counter",
            "localvol_rpc_duration_seconds histogram",
            "localvol_pool_capacity_bytes gauge",
            "localvol_pool_allocated_bytes gauge",
            "localvol_pool_free_bytes gauge",
            "localvol_pool_volumes gauge",
            "localvol_pool_ready gauge",
            "localvol_volume_quota_used_bytes gauge",
            "localvol_pool_thin_data_percent gauge",
            "localvol_pool_thin_metadata_percent gauge",
            "localvol_volume_quota_limit_bytes gauge",
            "localvol_discovered_volumes counter",
            "localvol_cleanups counter",
            "localvol_cleanup_duration_seconds histogram",
            "localvol_orphan_volumes gauge",
            "localvol_lvm_runs counter",
            "localvol_lvm_run_seconds_max gauge",
        ] {
            let want = format!("# TYPE {want}");
            assert!(out.contains(&want), "{want} missing from:\n{out}");
        }
    }

    fn encoded() -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &metrics().registry).unwrap();
        out
    }

    #[test]
    fn volume_condition_shows_while_the_volume_is_listed_and_published() {
        let (pool, sick, well) = ("test-only-cond", "test-only-cond.1", "test-only-cond.2");
        let line = |v: &str, x: u8| {
            format!(r#"localvol_volume_condition_abnormal{{pool="{pool}",volume="{v}"}} {x}"#)
        };
        assert_eq!(set_volume_condition(pool, sick, true), None);
        set_volume_condition(pool, well, false);
        // Not a series before a scrape's listing of the pool sets it.
        record_conditions(metrics(), pool, [sick, well]);
        let out = encoded();
        assert!(out.contains(&line(sick, 1)), "{out}");
        assert!(out.contains(&line(well, 0)), "{out}");
        assert!(out.contains("# TYPE localvol_volume_condition_abnormal gauge"));
        // The healthy volume is deleted (no longer listed), the sick one
        // turns healthy at its next NodeGetVolumeStats.
        assert_eq!(set_volume_condition(pool, sick, false), Some(true));
        metrics().volume_abnormal.clear();
        record_conditions(metrics(), pool, [sick]);
        let out = encoded();
        assert!(out.contains(&line(sick, 0)), "{out}");
        assert!(!out.contains(&format!(r#"volume="{well}""#)), "{out}");
        // Unpublished: kubelet stops asking, and the series goes.
        forget_volume_condition(sick);
        metrics().volume_abnormal.clear();
        record_conditions(metrics(), pool, [sick]);
        let out = encoded();
        assert!(!out.contains(&format!(r#"volume="{sick}""#)), "{out}");
        // A deleted volume's entry is gone even if it comes back listed.
        record_conditions(metrics(), pool, [sick, well]);
        assert!(!encoded().contains(&format!(r#"pool="{pool}""#)));
    }

    /// deploy/prometheus/lvm-sample.prom stands for an LVM pool's scrape in
    /// the alert tests (deploy/tools/alert_tests.py scrapes a driver on a
    /// dir pool, which never exports these): each of its lines must be what
    /// this encoder prints.
    #[test]
    fn lvm_sample_for_the_alert_tests_is_what_the_driver_prints() {
        let sample = include_str!("../deploy/prometheus/lvm-sample.prom");
        let m = metrics();
        let thin = PoolLabels {
            pool: "thin".into(),
            backend: "lvm-thin",
        };
        m.thin_data.get_or_create(&thin).set(42.5);
        m.thin_metadata.get_or_create(&thin).set(7.25);
        let thick = PoolLabels {
            pool: "thick".into(),
            backend: "lvm",
        };
        m.wipe_pending.get_or_create(&thick).set(0);
        let out = encoded();
        let lines: Vec<&str> = sample
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert_eq!(lines.len(), 3, "{sample}");
        for want in lines {
            assert!(
                out.lines().any(|l| l == want),
                "{want} missing from:\n{out}"
            );
        }
    }
}
