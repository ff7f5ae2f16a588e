//! Whether the driver is alive, for kubelet's liveness probe
//! (`--liveness-addr`, `GET /healthz`): 200 while it is, 500 once it is not.
//!
//! Alive is not fast. A restart helps only a driver that cannot recover by
//! itself, and on a loaded node (a noisy neighbour, a backup window, a TCG
//! test node) a restart adds load: pools re-opened, lvm re-run, NodeStage
//! and NodePublish cut half-way. So the answer never depends on how long an
//! RPC, lvm, a filesystem or a pool takes, only on three facts:
//!
//! - the CSI socket accepts connections: a missing socket or a refused
//!   connect is definite (nobody can reach the driver; a restart binds a new
//!   one);
//! - the serving runtime runs: a task on it ticks every second, and no tick
//!   for the deadline means every worker is stuck;
//! - a CSI Probe through that socket, sent by this module every 10 s (a
//!   sixth of the deadline when that is less), was answered within the
//!   deadline. A Probe that takes
//!   20 s is slow and counts as answered when it is.
//!
//! The endpoint and the self-Probe run on a thread of their own with its own
//! single-threaded runtime, so a busy serving runtime delays neither the
//! probe's answer nor the judgement. Readiness (`/readyz` on the metrics
//! port, on the serving runtime) may be slow on a busy driver; it only takes
//! the pod out of the metrics Service.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::StatusCode;

use crate::endpoint::Endpoint;
use crate::error::{IoContext, IoError};

/// How long without an answer counts as dead, unless `--liveness-deadline`
/// says otherwise.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);
/// How often the driver sends itself a Probe (at most; a slow one is
/// awaited first): a sixth of the deadline, between 1 and 10 s.
fn probe_every(deadline: Duration) -> Duration {
    (deadline / 6).clamp(Duration::from_secs(1), Duration::from_secs(10))
}
/// How often the serving runtime ticks.
const TICK_EVERY: Duration = Duration::from_secs(1);

/// What the liveness endpoint answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Alive(String),
    Dead(String),
}

/// The facts the verdict is drawn from, in milliseconds since the state was
/// made (the socket was bound then).
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub now_ms: u64,
    /// The serving runtime's last tick.
    pub tick_ms: u64,
    /// The last self-Probe answered.
    pub answered_ms: u64,
    /// Why the last attempt could not even connect (None: it could).
    pub refused: Option<String>,
}

/// The verdict from `facts`: dead when the socket refuses, or when the
/// runtime or the Probe has been silent for longer than `deadline`.
pub fn judge(facts: &Facts, deadline: Duration) -> Verdict {
    let limit = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX);
    let silent = |since: u64| facts.now_ms.saturating_sub(since);
    if let Some(why) = &facts.refused {
        return Verdict::Dead(format!("the CSI socket cannot be reached: {why}"));
    }
    if silent(facts.tick_ms) > limit {
        return Verdict::Dead(format!(
            "the serving runtime has not run for {} s (its workers are stuck)",
            silent(facts.tick_ms) / 1000
        ));
    }
    if silent(facts.answered_ms) > limit {
        return Verdict::Dead(format!(
            "no CSI Probe through the socket was answered for {} s",
            silent(facts.answered_ms) / 1000
        ));
    }
    Verdict::Alive(format!(
        "ok: last Probe answered {} s ago\n",
        silent(facts.answered_ms) / 1000
    ))
}

struct State {
    epoch: Instant,
    tick_ms: AtomicU64,
    answered_ms: AtomicU64,
    refused: Mutex<Option<String>>,
}

impl State {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn facts(&self) -> Facts {
        Facts {
            now_ms: self.now_ms(),
            tick_ms: self.tick_ms.load(Ordering::Relaxed),
            answered_ms: self.answered_ms.load(Ordering::Relaxed),
            refused: self.refused.lock().unwrap().clone(),
        }
    }
}

/// The running liveness endpoint; dropping it stops its thread.
pub struct Liveness {
    state: Arc<State>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// How one self-Probe went.
enum Attempt {
    Answered,
    /// Nothing could connect: the socket is gone or refuses.
    Refused(String),
    /// No answer within the deadline (or the backlog is full): slow, which
    /// the verdict judges by how long it lasts.
    Unanswered,
}

impl Liveness {
    /// Binds `addr` now (a bad address fails start-up) and starts the
    /// endpoint and the self-Probe of `endpoint` on a thread of their own.
    /// Call it once the CSI socket is bound.
    pub fn start(
        addr: SocketAddr,
        endpoint: Endpoint,
        deadline: Duration,
    ) -> Result<Self, IoError> {
        let listener =
            std::net::TcpListener::bind(addr).ctx(|| format!("binding liveness address {addr}"))?;
        listener
            .set_nonblocking(true)
            .ctx(|| format!("liveness address {addr}"))?;
        let state = Arc::new(State {
            epoch: Instant::now(),
            tick_ms: AtomicU64::new(0),
            answered_ms: AtomicU64::new(0),
            refused: Mutex::new(None),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = state.clone();
        std::thread::Builder::new()
            .name("liveness".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "liveness: no runtime; /healthz is not served");
                        return;
                    }
                };
                rt.block_on(run(shared, listener, endpoint, deadline, stopped));
            })
            .ctx(|| "starting the liveness thread".to_owned())?;
        tracing::info!(%addr, deadline_s = deadline.as_secs(), "serving liveness on /healthz");
        Ok(Liveness { state, _stop: stop })
    }

    /// Ticks for as long as it is polled: spawn it on the serving runtime.
    pub fn heartbeat(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let state = self.state.clone();
        async move {
            loop {
                state.tick_ms.store(state.now_ms(), Ordering::Relaxed);
                tokio::time::sleep(TICK_EVERY).await;
            }
        }
    }
}

async fn run(
    state: Arc<State>,
    listener: std::net::TcpListener,
    endpoint: Endpoint,
    deadline: Duration,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "liveness: /healthz is not served");
            return;
        }
    };
    let answering = state.clone();
    let answer = move |path: String| {
        let state = answering.clone();
        async move {
            if path != "/healthz" {
                return (StatusCode::NOT_FOUND, "text/plain", "not found\n".into());
            }
            match judge(&state.facts(), deadline) {
                Verdict::Alive(text) => (StatusCode::OK, "text/plain", text),
                Verdict::Dead(why) => {
                    tracing::warn!(reason = %why, "liveness: dead (kubelet restarts the driver after its failureThreshold)");
                    (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain",
                        format!("{why}\n"),
                    )
                }
            }
        }
    };
    tokio::select! {
        _ = crate::metrics::serve_get(listener, "liveness", answer) => {}
        _ = self_probe(state, endpoint, deadline) => {}
        _ = stopped => {}
    }
}

/// Sends the driver a Probe through its own socket every
/// [`probe_every`], one at a time, and records how it went.
async fn self_probe(state: Arc<State>, endpoint: Endpoint, deadline: Duration) {
    loop {
        let started = Instant::now();
        let attempt = probe_once(&endpoint, deadline).await;
        state.record(attempt, started.elapsed());
        tokio::time::sleep(probe_every(deadline).saturating_sub(started.elapsed())).await;
    }
}

impl State {
    fn record(&self, attempt: Attempt, took: Duration) {
        let mut refused = self.refused.lock().unwrap();
        match attempt {
            Attempt::Answered => {
                self.answered_ms.store(self.now_ms(), Ordering::Relaxed);
                if refused.take().is_some() {
                    tracing::info!("liveness: the CSI socket accepts again");
                }
                tracing::debug!(ms = took.as_millis() as u64, "liveness: Probe answered");
            }
            Attempt::Refused(why) => {
                if refused.as_deref() != Some(why.as_str()) {
                    tracing::warn!(reason = %why, "liveness: the CSI socket cannot be reached");
                }
                *refused = Some(why);
            }
            Attempt::Unanswered => {
                refused.take();
                tracing::info!(
                    waited_s = took.as_secs(),
                    "liveness: Probe not answered yet (slow is alive; silent for the deadline is dead)"
                );
            }
        }
    }
}

async fn probe_once(endpoint: &Endpoint, deadline: Duration) -> Attempt {
    if let Endpoint::Unix(path) = endpoint {
        // The kernel accepts into the listener's backlog whatever the
        // runtime is doing: a refusal here is the socket, not a busy driver.
        match tokio::net::UnixStream::connect(path).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Attempt::Unanswered,
            Err(e) => return Attempt::Refused(format!("{}: {e}", path.display())),
        }
    }
    match tokio::time::timeout(deadline, endpoint.probe()).await {
        Ok(Ok(())) => Attempt::Answered,
        Ok(Err(e)) => Attempt::Refused(e.to_string()),
        Err(_) => Attempt::Unanswered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(60);

    fn facts(now: u64, tick: u64, answered: u64) -> Facts {
        Facts {
            now_ms: now * 1000,
            tick_ms: tick * 1000,
            answered_ms: answered * 1000,
            refused: None,
        }
    }

    fn dead(f: &Facts) -> String {
        match judge(f, DEADLINE) {
            Verdict::Dead(why) => why,
            Verdict::Alive(t) => panic!("alive ({t}) with {f:?}"),
        }
    }

    #[test]
    fn slow_is_alive_up_to_the_deadline() {
        // Just started: nothing answered yet, within the deadline.
        assert!(matches!(
            judge(&facts(5, 5, 0), DEADLINE),
            Verdict::Alive(_)
        ));
        // A Probe in flight for 59 s on a busy node, the runtime ticking.
        assert!(matches!(
            judge(&facts(100, 100, 41), DEADLINE),
            Verdict::Alive(_)
        ));
        // The runtime late by 59 s.
        assert!(matches!(
            judge(&facts(100, 41, 100), DEADLINE),
            Verdict::Alive(_)
        ));
    }

    #[test]
    fn silence_past_the_deadline_is_dead() {
        assert!(dead(&facts(100, 100, 39)).contains("no CSI Probe"));
        assert!(dead(&facts(100, 39, 100)).contains("runtime has not run for 61 s"));
    }

    #[test]
    fn a_refused_socket_is_dead_at_once() {
        let mut f = facts(10, 10, 10);
        f.refused = Some("/csi/csi.sock: No such file or directory".into());
        assert!(dead(&f).contains("No such file"));
    }
}
