//! Fault injection (issue 15), dir pool on the host: C workers run whole
//! volume lifecycles (CreateVolume → NodeStage → NodePublish → write a file
//! through the target → NodeUnpublish → NodeUnstage → DeleteVolume, about a
//! quarter of the volumes kept) while a killer SIGKILLs the driver at random
//! moments and restarts it on the same socket at once. Workers retry each step
//! with the same request on UNAVAILABLE / ABORTED / DEADLINE_EXCEEDED and on
//! connection errors, as kubelet and the sidecars do; any other error is a
//! failure. Afterwards nothing may be leaked and nothing lost.
//!
//! Knobs (environment):
//!   FAULT_SEED          replay a run (the seed is printed at the start)
//!   FAULT_KILLS         kills at least (default 200)
//!   FAULT_CONCURRENCY   workers (default 4)
//!   FAULT_MINUTES       also keep killing until this many minutes passed (soak)
//!   FAULT_MAX_KEPT      keep at most this many volumes (default 1000): a
//!                       soak's pool must not fill up
//!   FAULT_KILL_WINDOW_MS  a kill lands 0..this ms after the driver is ready
//!                       (default 120)
//!
//! `make soak` runs this with larger counts.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use localvol::csi;
use localvol::endpoint::Endpoint;
use sanity_tests::*;
use tonic::{Code, Response, Status};

/// One RPC attempt longer than this counts as DEADLINE_EXCEEDED and is retried.
const RPC_TIMEOUT: Duration = Duration::from_secs(20);
/// One step that keeps failing with retryable errors this long is a failure.
const STEP_DEADLINE: Duration = Duration::from_secs(120);

/// splitmix64: small, seedable, good enough to pick moments and bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// FNV-1a, 64 bits: the recorded checksum of a written file.
fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?} is not a number: {e}")),
        Err(_) => default,
    }
}

/// What a sidecar retries with the same request: the driver was gone, busy
/// with the same volume, or too slow; or the connection broke under the call.
fn retryable(s: &Status) -> bool {
    match s.code() {
        Code::Unavailable | Code::Aborted | Code::DeadlineExceeded => true,
        // A connection reset mid-call surfaces from the client's transport,
        // not from the driver.
        Code::Unknown | Code::Internal | Code::Cancelled => {
            let m = s.message();
            m.contains("transport error")
                || m.contains("h2 protocol error")
                || m.contains("connection")
                || m.contains("broken pipe")
                || m.contains("operation was canceled")
        }
        _ => false,
    }
}

/// umount(2) is EBUSY while anything on the machine briefly holds the mount
/// (see `retry_busy` in the harness): tolerated a few times, and counted.
fn transiently_busy(s: &Status) -> bool {
    s.code() == Code::Internal && s.message().contains("busy")
}

/// What the workers and the killer share.
#[derive(Default)]
struct Counters {
    /// The killer is done: finish the current lifecycle and stop.
    done: AtomicBool,
    /// Someone failed: everyone stops.
    failed: AtomicBool,
    lifecycles: AtomicU64,
    kept: AtomicU64,
    /// Calls sent and not yet answered, now.
    in_flight: AtomicU64,
    retries: AtomicU64,
    busy: AtomicU64,
}

/// A worker's connection to whichever driver process is running now.
struct Client {
    endpoint: Endpoint,
    csi: Option<Csi>,
    counters: Arc<Counters>,
    worker: usize,
}

impl Client {
    /// Calls `f` until it succeeds or fails with a non-retryable error (the
    /// step's failure, with the request's description).
    async fn call<T, F, Fut>(&mut self, what: &str, mut f: F) -> Result<T, String>
    where
        F: FnMut(Csi) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        let start = Instant::now();
        let mut busy = 0;
        loop {
            if start.elapsed() > STEP_DEADLINE {
                return Err(format!(
                    "worker {}: {what}: still retrying after {STEP_DEADLINE:?}",
                    self.worker
                ));
            }
            let csi = match &self.csi {
                Some(c) => c.clone(),
                None => {
                    match tokio::time::timeout(Duration::from_secs(2), Csi::connect(&self.endpoint))
                        .await
                    {
                        Ok(Ok(c)) => {
                            self.csi = Some(c.clone());
                            c
                        }
                        _ => {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    }
                }
            };
            self.counters.in_flight.fetch_add(1, Ordering::SeqCst);
            let res = match tokio::time::timeout(RPC_TIMEOUT, f(csi)).await {
                Ok(r) => r,
                Err(_) => Err(Status::deadline_exceeded("client-side timeout")),
            };
            self.counters.in_flight.fetch_sub(1, Ordering::SeqCst);
            match res {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) if retryable(&s) => {
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    // A fresh connection: the old one may point at a dead process.
                    self.csi = None;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(s) if transiently_busy(&s) && busy < 10 => {
                    busy += 1;
                    self.counters.busy.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(s) => {
                    return Err(format!(
                        "worker {}: {what}: {:?}: {}",
                        self.worker,
                        s.code(),
                        s.message()
                    ))
                }
            }
        }
    }
}

/// A volume that must survive: its id, name and the file written into it.
#[derive(Clone, Debug)]
struct Kept {
    id: String,
    data: Vec<u8>,
    sum: u64,
}

const FILE: &str = "payload.bin";

struct Layout {
    kubelet: PathBuf,
}

impl Layout {
    fn staging(&self, name: &str) -> PathBuf {
        self.kubelet.join("staging").join(name)
    }
    fn target(&self, name: &str) -> PathBuf {
        let parent = self.kubelet.join("pods").join(name);
        fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    }
}

fn small_create_req(name: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        capacity_range: Some(range(MI, 0)),
        ..create_req(name)
    }
}

/// One full lifecycle of a new volume `name`; returns it when it is kept.
async fn lifecycle(
    c: &mut Client,
    layout: &Layout,
    rng: &mut Rng,
    name: &str,
    keep: bool,
) -> Result<Option<Kept>, String> {
    let req = small_create_req(name);
    let vol = c
        .call(&format!("CreateVolume {name}"), |mut csi| {
            let req = req.clone();
            async move { csi.controller.create_volume(req).await }
        })
        .await?
        .volume
        .ok_or_else(|| format!("CreateVolume {name}: no volume in the answer"))?;
    let id = vol.volume_id;

    let staging = layout.staging(name);
    let req = stage_req(&id, &staging);
    c.call(&format!("NodeStageVolume {id}"), |mut csi| {
        let req = req.clone();
        async move { csi.node.node_stage_volume(req).await }
    })
    .await?;

    let target = layout.target(name);
    let req = publish_req(&id, &staging, &target, false);
    c.call(&format!("NodePublishVolume {id}"), |mut csi| {
        let req = req.clone();
        async move { csi.node.node_publish_volume(req).await }
    })
    .await?;

    // Written through the target: it must be the volume's mount, not the
    // kubelet dir's own filesystem.
    if mount_at(&target).is_none() {
        return Err(format!(
            "{id}: NodePublishVolume succeeded but {target:?} is not a mount point"
        ));
    }
    let len = 1 + rng.below(64 * 1024) as usize;
    let data = rng.bytes(len);
    write_file(&target, FILE, &data).map_err(|e| format!("{id}: writing {target:?}: {e}"))?;
    let sum = checksum(&data);

    let req = unpublish_req(&id, &target);
    c.call(&format!("NodeUnpublishVolume {id}"), |mut csi| {
        let req = req.clone();
        async move { csi.node.node_unpublish_volume(req).await }
    })
    .await?;
    let req = unstage_req(&id, &staging);
    c.call(&format!("NodeUnstageVolume {id}"), |mut csi| {
        let req = req.clone();
        async move { csi.node.node_unstage_volume(req).await }
    })
    .await?;

    if keep {
        return Ok(Some(Kept { id, data, sum }));
    }
    let req = delete_req(&id);
    c.call(&format!("DeleteVolume {id}"), |mut csi| {
        let req = req.clone();
        async move { csi.controller.delete_volume(req).await }
    })
    .await?;
    Ok(None)
}

/// Runs lifecycles until `done`; returns the kept volumes (or the first failure).
async fn worker(
    w: usize,
    seed: u64,
    endpoint: Endpoint,
    layout: Arc<Layout>,
    counters: Arc<Counters>,
    max_kept: u64,
) -> Result<Vec<Kept>, String> {
    let mut rng = Rng(seed);
    let mut c = Client {
        endpoint,
        csi: None,
        counters: counters.clone(),
        worker: w,
    };
    let mut kept = Vec::new();
    let mut n = 0;
    while !counters.done.load(Ordering::SeqCst) && !counters.failed.load(Ordering::SeqCst) {
        let name = format!("fi-w{w}-{n}");
        n += 1;
        let keep = rng.below(4) == 0
            && counters
                .kept
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| {
                    (k < max_kept).then_some(k + 1)
                })
                .is_ok();
        match lifecycle(&mut c, &layout, &mut rng, &name, keep).await {
            Ok(k) => {
                counters.lifecycles.fetch_add(1, Ordering::Relaxed);
                kept.extend(k);
            }
            Err(e) => {
                counters.failed.store(true, Ordering::SeqCst);
                return Err(e);
            }
        }
    }
    Ok(kept)
}

/// Every entry of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {dir:?}: {e}"))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// `<key>.json.<pid>.<n>`: a record a delete renamed into the pool's
/// `deleted/` (kept for reuse by later creates; a start removes them all).
fn is_retired_record(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match name.split_once(".json.") {
        Some((key, rest)) => {
            key.len() == 32
                && key.bytes().all(|b| b.is_ascii_hexdigit())
                && rest
                    .split_once('.')
                    .is_some_and(|(p, n)| digits(p) && digits(n))
        }
        None => false,
    }
}

/// The pool holds exactly these volumes: `<key>/` and `<key>.json` each, and
/// nothing else (no temp file, no half-made leftover). Its `deleted/` holds
/// nothing, or (`retired_ok`: the driver deleted volumes since it started)
/// only retired records.
fn assert_pool_holds(d: &Driver, ids: &BTreeSet<String>, retired_ok: bool, when: &str) {
    let mut want: Vec<String> = Vec::new();
    for id in ids {
        let key = id.rsplit_once('.').expect("a localvol volume id").1;
        want.push(key.to_owned());
        want.push(format!("{key}.json"));
    }
    want.sort();
    let got = entries(&d.volumes_dir());
    assert_eq!(got, want, "{when}: the pool's volumes dir");
    for id in ids {
        assert!(
            d.volume_data_dir(id).is_dir(),
            "{when}: {id}'s data dir is not a directory"
        );
    }
    // Beside volumes/, only the pool's own dir for deleted volumes, and that
    // one empty.
    let pool = d.pool_dir("default");
    let top = entries(&pool);
    for e in &top {
        assert!(
            e == "volumes" || e == "deleted",
            "{when}: stray entry {e:?} in the pool dir {pool:?} ({top:?})"
        );
    }
    if pool.join("deleted").exists() {
        let left = entries(&pool.join("deleted"));
        if retired_ok {
            let stray: Vec<&String> = left.iter().filter(|n| !is_retired_record(n)).collect();
            assert!(
                stray.is_empty(),
                "{when}: stray files in the pool's deleted/: {stray:?}"
            );
        } else {
            assert!(
                left.is_empty(),
                "{when}: left in the pool's deleted/: {left:?}"
            );
        }
    }
}

fn assert_no_panic(d: &Driver) {
    let log = fs::read_to_string(d.log_path()).unwrap_or_default();
    let panics: Vec<&str> = log.lines().filter(|l| l.contains("panicked")).collect();
    assert!(
        panics.is_empty(),
        "the driver panicked ({} lines):\n{}",
        panics.len(),
        panics.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dir_pool_survives_random_kills_mid_lifecycle() {
    require_root();
    let seed = match std::env::var("FAULT_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("FAULT_SEED={s:?}: {e}")),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            t.as_nanos() as u64 ^ u64::from(std::process::id())
        }
    };
    let kills = env_u64("FAULT_KILLS", 200);
    let concurrency = env_u64("FAULT_CONCURRENCY", 4).max(1) as usize;
    let minutes = env_u64("FAULT_MINUTES", 0);
    let window_ms = env_u64("FAULT_KILL_WINDOW_MS", 120).max(1);
    let max_kept = env_u64("FAULT_MAX_KEPT", 1000);
    eprintln!(
        "fault_injection: seed {seed} (replay with FAULT_SEED={seed}), kills >= {kills}, \
         concurrency {concurrency}, minutes >= {minutes}, kill window {window_ms} ms"
    );
    let started = Instant::now();

    let mut d = Driver::start(DriverOpts::with_pool(
        PoolOpts::new("default").default_size("1Mi"),
    ))
    .await;
    let layout = Arc::new(Layout {
        kubelet: d.kubelet_dir(),
    });
    let counters = Arc::new(Counters::default());
    let mut seeds = Rng(seed);
    let mut killer_rng = Rng(seeds.next());

    let workers: Vec<_> = (0..concurrency)
        .map(|w| {
            tokio::spawn(worker(
                w,
                seeds.next(),
                d.endpoint.clone(),
                layout.clone(),
                counters.clone(),
                max_kept,
            ))
        })
        .collect();

    // The killer: SIGKILL at a random moment shortly after the driver is
    // ready (so kills land inside RPCs, not in long idle gaps), then restart at
    // once on the same socket.
    let mut done_kills = 0u64;
    let mut mid_call = 0u64;
    while !counters.failed.load(Ordering::SeqCst)
        && (done_kills < kills || started.elapsed() < Duration::from_secs(minutes * 60))
    {
        tokio::time::sleep(Duration::from_millis(killer_rng.below(window_ms))).await;
        if counters.in_flight.load(Ordering::SeqCst) > 0 {
            mid_call += 1;
        }
        d.kill9();
        done_kills += 1;
        if let Err(e) = d.try_start_again().await {
            counters.failed.store(true, Ordering::SeqCst);
            counters.done.store(true, Ordering::SeqCst);
            panic!("seed {seed}: the driver did not come back after kill {done_kills}: {e}");
        }
    }
    let kill_phase = started.elapsed();
    counters.done.store(true, Ordering::SeqCst);

    let mut kept: BTreeMap<String, Kept> = BTreeMap::new();
    let mut errors = Vec::new();
    for w in workers {
        match w.await.expect("worker task") {
            Ok(k) => kept.extend(k.into_iter().map(|k| (k.id.clone(), k))),
            Err(e) => errors.push(e),
        }
    }
    let lifecycles = counters.lifecycles.load(Ordering::Relaxed);
    let retries = counters.retries.load(Ordering::Relaxed);
    let busy = counters.busy.load(Ordering::Relaxed);
    eprintln!(
        "fault_injection: seed {seed}: {done_kills} kills in {kill_phase:.1?} ({mid_call} with \
         a call in flight), {lifecycles} lifecycles, {} kept, {retries} retried calls, {busy} transiently busy unmounts",
        kept.len()
    );
    assert!(
        errors.is_empty(),
        "seed {seed} (replay with FAULT_SEED={seed}): {} worker(s) failed:\n{}\ndriver log:\n{}",
        errors.len(),
        errors.join("\n"),
        d.log_tail(80)
    );
    assert!(done_kills >= kills, "only {done_kills} of {kills} kills");
    assert!(
        lifecycles >= concurrency as u64,
        "seed {seed}: only {lifecycles} lifecycles completed under the kills"
    );

    // One last kill and restart, with no call in flight: what follows reads
    // the state a fresh process loads from disk.
    d.kill9();
    d.start_again().await;

    // ListVolumes equals the kept set.
    let listed: BTreeSet<String> = d
        .list_all()
        .await
        .into_iter()
        .map(|v| v.volume_id)
        .collect();
    let want: BTreeSet<String> = kept.keys().cloned().collect();
    assert_eq!(
        listed, want,
        "seed {seed}: ListVolumes against the kept set"
    );
    // No mount left under the kubelet dir (nor anywhere below the driver's dir).
    let left = d.mounts_below_dir();
    assert!(left.is_empty(), "seed {seed}: mounts left: {left:#?}");
    assert_pool_holds(&d, &want, false, &format!("seed {seed}, after the kills"));

    // Every kept volume, re-staged and re-published, has its file.
    for (i, (id, k)) in kept.iter().enumerate() {
        let staging = d.staging_path(&format!("verify-{i}"));
        let target = d.target_path(&format!("verify-{i}"));
        d.stage(id, &staging).await;
        d.publish(id, &staging, &target, false).await;
        let got = fs::read(target.join(FILE))
            .unwrap_or_else(|e| panic!("seed {seed}: {id}: reading its file: {e}"));
        assert_eq!(
            checksum(&got),
            k.sum,
            "seed {seed}: {id}: checksum of its file ({} bytes, wrote {})",
            got.len(),
            k.data.len()
        );
        assert_eq!(got, k.data, "seed {seed}: {id}: its file's content");
        d.unpublish(id, &target).await;
        d.unstage(id, &staging).await;
        d.delete(id).await;
    }
    assert!(
        d.list_all().await.is_empty(),
        "seed {seed}: volumes listed after deleting all"
    );
    assert!(
        d.mounts_below_dir().is_empty(),
        "seed {seed}: mounts left at the end"
    );
    assert_pool_holds(
        &d,
        &BTreeSet::new(),
        true,
        &format!("seed {seed}, at the end"),
    );
    // A clean restart clears the retired records: the pool is empty.
    d.restart().await;
    assert!(
        d.list_all().await.is_empty(),
        "seed {seed}: volumes listed after a restart"
    );
    assert_pool_holds(
        &d,
        &BTreeSet::new(),
        false,
        &format!("seed {seed}, restarted at the end"),
    );
    let status = d.stop().await;
    assert!(status.success(), "seed {seed}: exit on SIGTERM: {status}");
    assert_no_panic(&d);
    eprintln!(
        "fault_injection: seed {seed}: {} kept volumes verified and deleted; {:.1?} in all",
        kept.len(),
        started.elapsed()
    );
}
