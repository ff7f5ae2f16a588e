//! The machinery of the fault-injection suites, shared by
//! `tests/host/fault_injection.rs` (dir pool, on the host) and `tests/vm/vm_faults.rs`
//! (thick and thin LVM pools, in the VM): C workers run whole volume
//! lifecycles (CreateVolume → NodeStage → NodePublish → write a file through
//! the target → NodeUnpublish → NodeUnstage → DeleteVolume, about a quarter of
//! the volumes kept; on LVM pools a kept volume also gets a restore from a
//! snapshot or a clone) while a killer SIGKILLs the driver at random moments
//! and restarts it on the same socket at once. Workers retry each step with
//! the same request on UNAVAILABLE / ABORTED / DEADLINE_EXCEEDED and on
//! connection errors, as kubelet and the sidecars do; any other error is a
//! failure. What each backend must hold afterwards is checked by its test.
//!
//! Knobs (environment), read by [`Knobs::from_env`]:
//!   FAULT_SEED          replay a run (the seed is printed at the start)
//!   FAULT_KILLS         kills at least
//!   FAULT_CONCURRENCY   workers
//!   FAULT_MINUTES       also keep killing until this many minutes passed (soak)
//!   FAULT_MAX_KEPT      keep at most this many volumes: a soak's pool must
//!                       not fill up
//!   FAULT_KILL_WINDOW_MS  a kill lands 0..this ms after the driver is ready
//!                       (one in four: 0..8 times this)

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use localvol::csi;
use localvol::endpoint::Endpoint;
use tonic::{Code, Response, Status};

use crate::{create_req, params, range, stage_req, Csi, Driver, Programs};

mod workers;
pub use workers::{lifecycle, worker};

/// splitmix64: small, seedable, good enough to pick moments and bytes.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// FNV-1a, 64 bits: the recorded checksum of a written file.
pub fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

pub fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?} is not a number: {e}")),
        Err(_) => default,
    }
}

/// `FAULT_SEED`, else one from the clock and the pid.
pub fn seed_from_env() -> u64 {
    match std::env::var("FAULT_SEED") {
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
    }
}

/// What a sidecar retries with the same request: the driver was gone, busy
/// with the same volume, or too slow; or the connection broke under the call.
pub fn retryable(s: &Status) -> bool {
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
pub fn transiently_busy(s: &Status) -> bool {
    s.code() == Code::Internal && s.message().contains("busy")
}

/// The counts and timings of one run: defaults per backend, overridden by
/// the `FAULT_*` variables (see the module's doc).
#[derive(Clone, Debug)]
pub struct Knobs {
    pub seed: u64,
    pub kills: u64,
    pub concurrency: usize,
    pub minutes: u64,
    pub window_ms: u64,
    pub max_kept: u64,
    /// One RPC attempt longer than this counts as DEADLINE_EXCEEDED and is
    /// retried.
    pub rpc_timeout: Duration,
    /// One step that keeps failing with retryable errors this long is a
    /// failure.
    pub step_deadline: Duration,
    /// What becomes of the programs the driver runs when it is killed:
    /// `FAULT_KILL_PROGRAMS=1`, they die with it, as a container's death
    /// kills them, cutting lvm short mid-run; `=0`, they finish before the
    /// driver starts again. Unset (None), each kill picks one of the two
    /// from the seed, so a campaign meets both (docs/testing.md).
    pub programs: Option<Programs>,
}

impl Knobs {
    /// The environment's values over these defaults.
    pub fn from_env(kills: u64, concurrency: u64, window_ms: u64, max_kept: u64) -> Self {
        Knobs {
            seed: seed_from_env(),
            kills: env_u64("FAULT_KILLS", kills),
            concurrency: env_u64("FAULT_CONCURRENCY", concurrency).max(1) as usize,
            minutes: env_u64("FAULT_MINUTES", 0),
            window_ms: env_u64("FAULT_KILL_WINDOW_MS", window_ms).max(1),
            max_kept: env_u64("FAULT_MAX_KEPT", max_kept),
            rpc_timeout: Duration::from_secs(20),
            step_deadline: Duration::from_secs(120),
            programs: match std::env::var("FAULT_KILL_PROGRAMS").as_deref() {
                Ok("1") => Some(Programs::Kill),
                Ok("0") => Some(Programs::Finish),
                _ => None,
            },
        }
    }
}

/// What the workers and the killer share.
#[derive(Default)]
pub struct Counters {
    /// The killer is done: finish the current lifecycle and stop.
    pub done: AtomicBool,
    /// Someone failed: everyone stops.
    pub failed: AtomicBool,
    pub lifecycles: AtomicU64,
    pub kept: AtomicU64,
    /// Calls sent and not yet answered, now.
    pub in_flight: AtomicU64,
    pub retries: AtomicU64,
    pub busy: AtomicU64,
    /// Restores and clones made (LVM lifecycles).
    pub copies: AtomicU64,
}

/// A worker's connection to whichever driver process is running now.
pub struct Client {
    pub endpoint: Endpoint,
    pub csi: Option<Csi>,
    pub counters: Arc<Counters>,
    pub worker: usize,
    pub rpc_timeout: Duration,
    pub step_deadline: Duration,
}

impl Client {
    /// Calls `f` until it succeeds or fails with a non-retryable error (the
    /// step's failure, with the request's description).
    pub async fn call<T, F, Fut>(&mut self, what: &str, mut f: F) -> Result<T, String>
    where
        F: FnMut(Csi) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        let start = Instant::now();
        let mut busy = 0;
        loop {
            if start.elapsed() > self.step_deadline {
                return Err(format!(
                    "worker {}: {what}: still retrying after {:?}",
                    self.worker, self.step_deadline
                ));
            }
            let Some(csi) = self.connection().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            self.counters.in_flight.fetch_add(1, Ordering::SeqCst);
            let res = match tokio::time::timeout(self.rpc_timeout, f(csi)).await {
                Ok(r) => r,
                Err(_) => Err(Status::deadline_exceeded("client-side timeout")),
            };
            self.counters.in_flight.fetch_sub(1, Ordering::SeqCst);
            match res {
                Ok(r) => {
                    if start.elapsed() > Duration::from_secs(60) {
                        eprintln!(
                            "worker {}: {what} took {:.1?} ({} retried calls so far)",
                            self.worker,
                            start.elapsed(),
                            self.counters.retries.load(Ordering::Relaxed)
                        );
                    }
                    return Ok(r.into_inner());
                }
                Err(s) if retryable(&s) => {
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    if start.elapsed() > Duration::from_secs(60) {
                        self.note_still_retrying(what, start, &s);
                    }
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

    /// The connection to send on: the one in use, else a fresh one (None
    /// while no driver answers on the socket).
    async fn connection(&mut self) -> Option<Csi> {
        if let Some(c) = &self.csi {
            return Some(c.clone());
        }
        match tokio::time::timeout(Duration::from_secs(2), Csi::connect(&self.endpoint)).await {
            Ok(Ok(c)) => {
                self.csi = Some(c.clone());
                Some(c)
            }
            _ => None,
        }
    }

    /// Says (stderr and the progress log) that step `what`, begun at
    /// `start`, is still being retried after `s`.
    fn note_still_retrying(&self, what: &str, start: Instant, s: &Status) {
        let line = format!(
            "worker {}: {what}: still retrying after {:.1?}: {:?}: {}",
            self.worker,
            start.elapsed(),
            s.code(),
            s.message()
        );
        eprintln!("{line}");
        progress_note(&line);
    }
}

/// A volume that must survive: its id and the file written into it.
#[derive(Clone, Debug)]
pub struct Kept {
    pub id: String,
    pub data: Vec<u8>,
    pub sum: u64,
}

/// The file each lifecycle writes through its target.
pub const FILE: &str = "payload.bin";

/// Where the workers stage and publish (below the driver's kubelet dir).
pub struct Layout {
    pub kubelet: PathBuf,
}

impl Layout {
    pub fn staging(&self, name: &str) -> PathBuf {
        self.kubelet.join("staging").join(name)
    }
    pub fn target(&self, name: &str) -> PathBuf {
        let parent = self.kubelet.join("pods").join(name);
        fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    }
}

/// What a lifecycle does beyond the common steps.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The volumes' size.
    pub bytes: i64,
    /// Kept volumes also get a copy: a restore from a snapshot (taken,
    /// restored, then deleted) or a clone, picked at random; the copy is
    /// kept too and must hold the same file. LVM pools only.
    pub copies: bool,
    /// CreateSnapshot parameters (a thick pool's `snapshotSize`).
    pub snapshot_params: Vec<(String, String)>,
    /// CreateVolume parameters of every volume and copy (e.g.
    /// `encryption: luks2`).
    pub volume_params: Vec<(String, String)>,
    /// NodeStageVolume secrets (an encrypted volume's `encryptionKey`).
    pub stage_secrets: Vec<(String, String)>,
}

impl Plan {
    /// 1 MiB volumes, no copies: the dir pool.
    pub fn plain(bytes: i64) -> Self {
        Plan {
            bytes,
            copies: false,
            snapshot_params: Vec::new(),
            volume_params: Vec::new(),
            stage_secrets: Vec::new(),
        }
    }
}

/// CreateVolume of a SINGLE_NODE_WRITER mount volume of the plan's size
/// and parameters.
fn sized_create_req(name: &str, plan: &Plan) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        capacity_range: Some(range(plan.bytes, 0)),
        parameters: plan.volume_params.iter().cloned().collect(),
        ..create_req(name)
    }
}

/// NodeStageVolume of `id` with the plan's secrets.
fn plan_stage_req(plan: &Plan, id: &str, staging: &Path) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        secrets: plan.stage_secrets.iter().cloned().collect(),
        ..stage_req(id, staging)
    }
}

/// What one kill campaign did.
pub struct Outcome {
    pub kills: u64,
    /// Kills that landed while a call was in flight.
    pub mid_call: u64,
    pub lifecycles: u64,
    pub copies: u64,
    pub retries: u64,
    pub busy: u64,
    pub kill_phase: Duration,
    /// The surviving volumes, by id.
    pub kept: BTreeMap<String, Kept>,
}

/// Runs `knobs.concurrency` workers through lifecycles of `plan` against the
/// running driver `d` while killing it (SIGKILL at a random moment 0..window
/// after it is ready, restarted at once on the same socket) until
/// `knobs.kills` kills were done and `knobs.minutes` passed; then lets the
/// workers finish their lifecycles. Panics (with the seed, the workers'
/// errors and the log tail) when a worker failed or the driver did not come
/// back. `label` names the run in its messages.
pub async fn kill_campaign(label: &str, d: &mut Driver, plan: Plan, knobs: &Knobs) -> Outcome {
    let seed = knobs.seed;
    let started = Instant::now();
    let layout = Arc::new(Layout {
        kubelet: d.kubelet_dir(),
    });
    let counters = Arc::new(Counters::default());
    let mut seeds = Rng(seed);
    let killer_rng = Rng(seeds.next_u64());
    let workers: Vec<_> = (0..knobs.concurrency)
        .map(|w| {
            tokio::spawn(worker(
                w,
                seeds.next_u64(),
                d.endpoint.clone(),
                layout.clone(),
                plan.clone(),
                counters.clone(),
                knobs.clone(),
            ))
        })
        .collect();

    let killed = killer(label, d, knobs, &counters, killer_rng, started).await;
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
    if let Some(e) = killed.start_failure {
        panic!("{e}");
    }
    let out = Outcome {
        kills: killed.kills,
        mid_call: killed.mid_call,
        lifecycles: counters.lifecycles.load(Ordering::Relaxed),
        copies: counters.copies.load(Ordering::Relaxed),
        retries: counters.retries.load(Ordering::Relaxed),
        busy: counters.busy.load(Ordering::Relaxed),
        kill_phase,
        kept,
    };
    report_campaign(label, d, knobs, &out, &errors);
    out
}

/// What the killer did: its kills, those that landed mid-call, and the
/// failure that stopped it early (a driver that did not come back).
struct Killed {
    kills: u64,
    mid_call: u64,
    start_failure: Option<String>,
}

/// The killer of [`kill_campaign`]: SIGKILL at a random moment shortly
/// after the driver is ready (so kills land inside RPCs, not in long idle
/// gaps), then restart at once on the same socket; until enough kills were
/// done and enough time passed, or someone failed.
async fn killer(
    label: &str,
    d: &mut Driver,
    knobs: &Knobs,
    counters: &Counters,
    mut rng: Rng,
    started: Instant,
) -> Killed {
    let seed = knobs.seed;
    let mut kills = 0u64;
    let mut mid_call = 0u64;
    while !counters.failed.load(Ordering::SeqCst)
        && (kills < knobs.kills || started.elapsed() < Duration::from_secs(knobs.minutes * 60))
    {
        // Mostly soon after the start (kills land in the first steps of
        // calls), one in four up to 8 windows later: a step longer than one
        // window (a block copy in a slow VM) must get its chance to finish,
        // as it does between a real driver's rare crashes.
        let window = if rng.below(4) == 0 {
            knobs.window_ms * 8
        } else {
            knobs.window_ms
        };
        tokio::time::sleep(Duration::from_millis(rng.below(window))).await;
        if counters.in_flight.load(Ordering::SeqCst) > 0 {
            mid_call += 1;
        }
        // It waits for the process and its programs: off the runtime's
        // threads.
        let programs = knobs.programs.unwrap_or(if rng.below(2) == 0 {
            Programs::Kill
        } else {
            Programs::Finish
        });
        let running = tokio::task::block_in_place(|| d.kill9_then(programs));
        kills += 1;
        if !running.is_empty() {
            // Shown with a failure: what each kill cut short.
            eprintln!(
                "{label}: kill {kills} met {} ({programs:?})",
                running.join(" ")
            );
        }
        if kills.is_multiple_of(5) {
            let line = format!(
                "{label}: {kills} kills, {} lifecycles, {:.0?}",
                counters.lifecycles.load(Ordering::Relaxed),
                started.elapsed()
            );
            eprintln!("{line}");
            progress_note(&line);
        }
        if let Err(e) = start_after_kill(d).await {
            counters.failed.store(true, Ordering::SeqCst);
            return Killed {
                kills,
                mid_call,
                start_failure: Some(format!(
                    "{label}: seed {seed}: the driver did not come back after kill {kills}: {e}"
                )),
            };
        }
    }
    Killed {
        kills,
        mid_call,
        start_failure: None,
    }
}

/// Starts the killed driver again. A start that misses its readiness
/// deadline (a loaded VM) is tried again, as kubelet restarts a crashed
/// container; three in a row fail.
async fn start_after_kill(d: &mut Driver) -> Result<(), String> {
    let mut last = Ok(());
    for _ in 0..3 {
        last = d.try_start_again().await;
        if last.is_ok() {
            break;
        }
    }
    last
}

/// Prints what a campaign did and panics (with the seed, the workers'
/// errors and the log tail) when a worker failed or it fell short.
fn report_campaign(label: &str, d: &Driver, knobs: &Knobs, out: &Outcome, errors: &[String]) {
    let seed = knobs.seed;
    eprintln!(
        "{label}: seed {seed}: {} kills in {:.1?} ({} with a call in flight), {} lifecycles, \
         {} restores/clones, {} kept, {} retried calls, {} transiently busy unmounts",
        out.kills,
        out.kill_phase,
        out.mid_call,
        out.lifecycles,
        out.copies,
        out.kept.len(),
        out.retries,
        out.busy
    );
    assert!(
        errors.is_empty(),
        "{label}: seed {seed} (replay with FAULT_SEED={seed}): {} worker(s) failed:\n{}\n\
         driver log:\n{}",
        errors.len(),
        errors.join("\n"),
        d.log_tail(80)
    );
    assert!(
        out.kills >= knobs.kills,
        "{label}: only {} of {} kills",
        out.kills,
        knobs.kills
    );
    assert!(
        out.lifecycles >= knobs.concurrency as u64,
        "{label}: seed {seed}: only {} lifecycles completed under the kills",
        out.lifecycles
    );
}

/// Appends a line to `$FAULT_DIAG_DIR/progress.log` when that is set (a
/// dir the VM shares with the host: the guest's console can lag minutes).
pub fn progress_note(line: &str) {
    use std::io::Write;
    if let Ok(dir) = std::env::var("FAULT_DIAG_DIR") {
        if let Ok(mut f) = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(Path::new(&dir).join("progress.log"))
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Re-stages (with the plan's secrets) and re-publishes every kept volume,
/// checks its file against the recorded checksum, then unpublishes, unstages
/// and deletes it.
pub async fn verify_and_delete_kept(
    label: &str,
    d: &Driver,
    plan: &Plan,
    kept: &BTreeMap<String, Kept>,
) {
    for (i, (id, k)) in kept.iter().enumerate() {
        let staging = d.staging_path(&format!("verify-{i}"));
        let target = d.target_path(&format!("verify-{i}"));
        d.node()
            .node_stage_volume(plan_stage_req(plan, id, &staging))
            .await
            .unwrap_or_else(|s| panic!("{label}: NodeStageVolume {id}: {s:?}"));
        d.publish(id, &staging, &target, false).await;
        let got =
            fs::read(target.join(FILE)).unwrap_or_else(|e| panic!("{label}: {id}: its file: {e}"));
        assert_eq!(
            checksum(&got),
            k.sum,
            "{label}: {id}: checksum of its file ({} bytes, wrote {})",
            got.len(),
            k.data.len()
        );
        assert_eq!(got, k.data, "{label}: {id}: its file's content");
        d.unpublish(id, &target).await;
        d.unstage(id, &staging).await;
        d.delete(id).await;
    }
}

/// No line of the driver's log says it panicked.
pub fn assert_no_panic(d: &Driver) {
    let log = fs::read_to_string(d.log_path()).unwrap_or_default();
    let panics: Vec<&str> = log.lines().filter(|l| l.contains("panicked")).collect();
    assert!(
        panics.is_empty(),
        "the driver panicked ({} lines):\n{}",
        panics.len(),
        panics.join("\n")
    );
}

/// Every entry of `dir`, sorted.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {dir:?}: {e}"))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// `params` for a thick pool's snapshots (`snapshotSize`).
pub fn snapshot_size(cow: &str) -> Vec<(String, String)> {
    params(&[("snapshotSize", cow)]).into_iter().collect()
}
