//! Whether an LVM pool can serve: its volume group exists (and its thin pool
//! is one, and zeroes the blocks it provisions), as `vgs`/`lvs` report it
//! right now.
//!
//! The pool monitor, `/readyz` and every metrics scrape ask: running lvm for
//! each would queue reports behind a long `lvcreate` holding the VG lock. So
//! the answer is kept for [`HEALTH_TTL`]; an older one is refreshed by a
//! check in a task of its own while callers get the last answer (only the
//! first caller of all waits for one).
//!
//! Slow is not broken: a check whose lvm timed out ([`Checked::TimedOut`])
//! says nothing about the pool, so the last answer stands and the timeout is
//! counted. [`DEGRADED_AFTER`] of them in a row make the pool degraded
//! (`/readyz`, `localvol_pool_degraded`), which refuses nothing: only a
//! definite answer (the VG or thin pool missing, lvm failing) makes a pool
//! unusable.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::command::CommandError;
use crate::lvm::{LvInfo, LvmError, VgInfo};
use crate::pool::{Health, SlowChecks, Unusable};

/// How long a health answer is reused.
pub const HEALTH_TTL: Duration = Duration::from_secs(5);
/// Timed-out checks in a row that make a pool degraded.
pub const DEGRADED_AFTER: u32 = 3;

/// What one health check found: an answer, or none because lvm did not
/// finish in time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    Known(Health),
    TimedOut(String),
}

fn timed_out(e: &LvmError) -> bool {
    matches!(e, LvmError::Command(CommandError::Timeout { .. }))
}

/// The pool's health from its VG report and, for a thin pool, the report of
/// that LV (`None`: no such LV). A report that failed for another reason than
/// "not found" is [`Unusable::CheckFailed`]: lvm cannot say that the pool
/// works.
pub fn judge(
    vg: &str,
    vg_report: Result<VgInfo, LvmError>,
    thin: Option<(&str, Result<Option<LvInfo>, LvmError>)>,
) -> Checked {
    for e in [
        vg_report.as_ref().err(),
        thin.as_ref().and_then(|(_, r)| r.as_ref().err()),
    ] {
        if let Some(e) = e.filter(|e| timed_out(e)) {
            return Checked::TimedOut(e.to_string());
        }
    }
    Checked::Known(judge_answers(vg, vg_report, thin))
}

fn judge_answers(
    vg: &str,
    vg_report: Result<VgInfo, LvmError>,
    thin: Option<(&str, Result<Option<LvInfo>, LvmError>)>,
) -> Health {
    match vg_report {
        Ok(_) => {}
        Err(LvmError::NotFound(_)) => {
            return Health::Unusable(Unusable::VolumeGroupMissing { vg: vg.to_owned() })
        }
        Err(e) => return Health::Unusable(Unusable::CheckFailed(e.to_string())),
    }
    let Some((thin, report)) = thin else {
        return Health::Ready;
    };
    let names = || (vg.to_owned(), thin.to_owned());
    match report {
        Ok(Some(lv)) if lv.is_thin_pool() && !lv.zeroes_new_blocks() => {
            let (vg, thin) = names();
            Health::Unusable(Unusable::ThinPoolNotZeroing { vg, thin })
        }
        Ok(Some(lv)) if lv.is_thin_pool() => Health::Ready,
        Ok(Some(_)) => {
            let (vg, thin) = names();
            Health::Unusable(Unusable::NotAThinPool { vg, thin })
        }
        Ok(None) | Err(LvmError::NotFound(_)) => {
            let (vg, thin) = names();
            Health::Unusable(Unusable::ThinPoolMissing { vg, thin })
        }
        Err(e) => Health::Unusable(Unusable::CheckFailed(e.to_string())),
    }
}

/// The last health answer and when it was found, whether a check runs, and
/// how many checks timed out.
#[derive(Default)]
pub struct HealthCache {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The pool's name, for the log.
    pool: String,
    last: Mutex<Option<(Instant, Health)>>,
    running: AtomicBool,
    done: Notify,
    /// Timed-out checks since the last answer.
    in_a_row: AtomicU32,
    /// Timed-out checks since start.
    total: AtomicU64,
}

impl HealthCache {
    /// A cache for pool `pool` whose last answer is `health` (the check that
    /// opened it).
    pub fn new(pool: &str, health: Health) -> Self {
        HealthCache {
            inner: Arc::new(Inner {
                pool: pool.to_owned(),
                last: Mutex::new(Some((Instant::now(), health))),
                ..Inner::default()
            }),
        }
    }

    /// The cached answer while it is younger than `ttl`. Older: a check
    /// starts (one at a time) in a task of its own, and the caller gets the
    /// last answer at once; only a caller with no answer at all waits for
    /// it. The check runs to its end even when every caller has gone: the
    /// e2e cluster showed why. Under a burst of 50 thin creates a `vgs`
    /// waited seconds for the VG lock; the Probe that had started it was
    /// cancelled after the liveness sidecar's one second, which dropped
    /// the check, so every later Probe started and lost another, and kubelet
    /// restarted the node plugin mid-burst. A check that timed out keeps the
    /// last answer (and is counted); with no answer yet, it is
    /// [`Unusable::CheckFailed`]: nothing says the pool works.
    pub async fn get<F, Fut>(&self, ttl: Duration, check: F) -> Health
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Checked> + Send + 'static,
    {
        let last = self.inner.last.lock().unwrap().clone();
        if let Some((at, h)) = &last {
            if at.elapsed() < ttl {
                return h.clone();
            }
        }
        if !self.inner.running.swap(true, Ordering::AcqRel) {
            let inner = self.inner.clone();
            let fut = check();
            tokio::spawn(async move {
                let checked = fut.await;
                inner.record(checked);
                inner.running.store(false, Ordering::Release);
                inner.done.notify_waiters();
            });
        }
        if let Some((_, h)) = last {
            return h;
        }
        loop {
            // Registered before looking, so a check ending in between wakes it.
            let ended = self.inner.done.notified();
            if let Some((_, h)) = self.inner.last.lock().unwrap().clone() {
                return h;
            }
            ended.await;
        }
    }

    /// The timed-out checks: in a row now, and since start.
    pub fn slow(&self) -> SlowChecks {
        SlowChecks {
            in_a_row: self.inner.in_a_row.load(Ordering::Relaxed),
            total: self.inner.total.load(Ordering::Relaxed),
        }
    }
}

impl Inner {
    fn record(&self, checked: Checked) {
        let pool = &self.pool;
        let mut last = self.last.lock().unwrap();
        let health = match checked {
            Checked::Known(h) => {
                let was = self.in_a_row.swap(0, Ordering::Relaxed);
                if was >= DEGRADED_AFTER {
                    tracing::info!(%pool, timeouts = was, "pool health check answered again: no longer degraded");
                }
                h
            }
            Checked::TimedOut(why) => {
                let n = self.in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
                self.total.fetch_add(1, Ordering::Relaxed);
                match &*last {
                    Some((_, h)) => {
                        tracing::warn!(%pool, timeouts_in_a_row = n, error = %why,
                            kept = %health_text(h),
                            "pool health check timed out: lvm is slow; the last answer stands");
                        if n == DEGRADED_AFTER {
                            tracing::warn!(%pool, "pool degraded: {n} health checks in a row timed out; its RPCs are still served");
                        }
                        h.clone()
                    }
                    None => Health::Unusable(Unusable::CheckFailed(why)),
                }
            }
        };
        *last = Some((Instant::now(), health));
    }
}

fn health_text(h: &Health) -> String {
    match h {
        Health::Ready => "ready".into(),
        Health::Unusable(u) => format!("unusable: {u}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::CommandError;
    use crate::lvm::{parse_lvs, parse_vgs};

    const VGS: &str = include_str!("../../../tests/fixtures/lvm/vgs-thick.json");
    const LVS_THIN: &str = include_str!("../../../tests/fixtures/lvm/lvs-thin.json");

    fn vg() -> Result<VgInfo, LvmError> {
        Ok(parse_vgs(VGS).unwrap().remove(0))
    }

    fn lv(name: &str) -> Result<Option<LvInfo>, LvmError> {
        Ok(parse_lvs(LVS_THIN)
            .unwrap()
            .into_iter()
            .find(|l| l.name == name))
    }

    fn failed(stderr: &str) -> LvmError {
        crate::lvm::classify(CommandError::Failed {
            program: "lvm".into(),
            code: Some(5),
            stdout: String::new(),
            stderr: stderr.into(),
        })
    }

    fn known(h: Health) -> Checked {
        Checked::Known(h)
    }

    #[test]
    fn a_present_vg_is_ready() {
        assert_eq!(judge("fxvg", vg(), None), known(Health::Ready));
    }

    #[test]
    fn a_missing_vg_is_unusable() {
        // What vgs says for a VG that is not there (lvm 2.03).
        let err = failed("  Volume group \"gone\" not found\n  Cannot process volume group gone\n");
        assert_eq!(
            judge("gone", Err(err), None),
            known(Health::Unusable(Unusable::VolumeGroupMissing {
                vg: "gone".into()
            }))
        );
    }

    fn timeout() -> LvmError {
        LvmError::Command(CommandError::Timeout {
            program: "lvm".into(),
            after: Duration::from_secs(60),
        })
    }

    #[test]
    fn an_lvm_that_fails_is_not_called_healthy() {
        assert!(matches!(
            judge("fxvg", Err(failed("  Internal error: something odd")), None),
            Checked::Known(Health::Unusable(Unusable::CheckFailed(_)))
        ));
    }

    #[test]
    fn an_lvm_that_timed_out_gave_no_answer() {
        assert!(matches!(
            judge("fxvg", Err(timeout()), None),
            Checked::TimedOut(m) if m.contains("did not finish within 60s")
        ));
        assert!(matches!(
            judge("fxvg", vg(), Some(("thin", Err(timeout())))),
            Checked::TimedOut(_)
        ));
    }

    #[test]
    fn thin_pools_must_exist_and_be_thin_pools() {
        let lvs = parse_lvs(LVS_THIN).unwrap();
        let pool = lvs.iter().find(|l| l.is_thin_pool()).unwrap().name.clone();
        let other = lvs.iter().find(|l| !l.is_thin_pool()).unwrap().name.clone();
        assert_eq!(
            judge("fxvg", vg(), Some((&pool, lv(&pool)))),
            known(Health::Ready)
        );
        assert_eq!(
            judge("fxvg", vg(), Some((&other, lv(&other)))),
            known(Health::Unusable(Unusable::NotAThinPool {
                vg: "fxvg".into(),
                thin: other.clone()
            }))
        );
        assert_eq!(
            judge("fxvg", vg(), Some(("nope", Ok(None)))),
            known(Health::Unusable(Unusable::ThinPoolMissing {
                vg: "fxvg".into(),
                thin: "nope".into()
            }))
        );
        // A thin pool that does not zero new blocks (`-Zn`: the 8th
        // lv_attr character is `-` instead of `z`) is refused.
        let mut unzeroed = lv(&pool).unwrap().unwrap();
        unzeroed.attr = "twi-aot---".into();
        assert_eq!(
            judge("fxvg", vg(), Some((&pool, Ok(Some(unzeroed))))),
            known(Health::Unusable(Unusable::ThinPoolNotZeroing {
                vg: "fxvg".into(),
                thin: pool.clone()
            }))
        );
        // The VG is judged first.
        assert!(matches!(
            judge(
                "fxvg",
                Err(failed("Volume group \"fxvg\" not found")),
                Some((&pool, lv(&pool)))
            ),
            Checked::Known(Health::Unusable(Unusable::VolumeGroupMissing { .. }))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_reused_for_the_ttl_then_refreshed_behind_the_callers() {
        let cache = HealthCache::default();
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let check = |h: Health| {
            runs.fetch_add(1, Ordering::SeqCst);
            async move { Checked::Known(h) }
        };
        // No answer yet: the first caller waits for the check.
        assert_eq!(
            cache.get(HEALTH_TTL, || check(Health::Ready)).await,
            Health::Ready
        );
        let gone = Health::Unusable(Unusable::VolumeGroupMissing { vg: "v".into() });
        // Within the TTL: the cached answer, no second run.
        tokio::time::advance(HEALTH_TTL - Duration::from_millis(1)).await;
        assert_eq!(
            cache.get(HEALTH_TTL, || check(gone.clone())).await,
            Health::Ready
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // After it: the last answer at once, a check started behind it ...
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            cache.get(HEALTH_TTL, || check(gone.clone())).await,
            Health::Ready
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // ... whose answer the next caller gets.
        tokio::task::yield_now().await;
        assert_eq!(cache.get(HEALTH_TTL, || check(Health::Ready)).await, gone);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_check_blocks_nobody_and_outlives_a_cancelled_caller() {
        let cache = HealthCache::default();
        assert_eq!(
            cache
                .get(HEALTH_TTL, || async { known(Health::Ready) })
                .await,
            Health::Ready
        );
        tokio::time::advance(HEALTH_TTL).await;
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        // A caller that gives up after a second (the liveness sidecar's
        // Probe timeout) still gets an answer in time: the last one.
        let h = tokio::time::timeout(
            Duration::from_secs(1),
            cache.get(HEALTH_TTL, || async move {
                wait.await.unwrap();
                known(Health::Unusable(Unusable::CheckFailed("late".into())))
            }),
        )
        .await
        .expect("a caller waited for a running check");
        assert_eq!(h, Health::Ready);
        // While it runs, no second check starts.
        let h = cache
            .get(HEALTH_TTL, || async { panic!("a second check ran") })
            .await;
        assert_eq!(h, Health::Ready);
        // The check finishes on its own; its answer is kept.
        release.send(()).unwrap();
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert!(matches!(
            cache
                .get(HEALTH_TTL, || async {
                    panic!("the fresh answer was not kept")
                })
                .await,
            Health::Unusable(Unusable::CheckFailed(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_callers_all_wait_for_one_check() {
        let cache = Arc::new(HealthCache::default());
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let first = {
            let cache = cache.clone();
            tokio::spawn(async move {
                cache
                    .get(HEALTH_TTL, || async move {
                        wait.await.unwrap();
                        known(Health::Ready)
                    })
                    .await
            })
        };
        tokio::task::yield_now().await;
        let second = {
            let cache = cache.clone();
            tokio::spawn(async move {
                cache
                    .get(HEALTH_TTL, || async { panic!("a second check ran") })
                    .await
            })
        };
        tokio::task::yield_now().await;
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap(), Health::Ready);
        assert_eq!(second.await.unwrap(), Health::Ready);
    }

    /// Runs one check through the cache past its TTL and lets it finish.
    async fn one_check(cache: &HealthCache, checked: Checked) -> Health {
        tokio::time::advance(HEALTH_TTL).await;
        cache.get(HEALTH_TTL, || async move { checked }).await;
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        cache
            .get(HEALTH_TTL, || async {
                panic!("checked again within the TTL")
            })
            .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_out_check_keeps_the_last_answer_and_is_counted() {
        let cache = HealthCache::new("p", Health::Ready);
        let slow = || Checked::TimedOut("lvm did not finish within 60s and was killed".into());
        for n in 1..=DEGRADED_AFTER + 1 {
            assert_eq!(one_check(&cache, slow()).await, Health::Ready);
            assert_eq!(
                cache.slow(),
                SlowChecks {
                    in_a_row: n,
                    total: u64::from(n)
                }
            );
        }
        // An answer ends the run of timeouts; the total stays.
        let gone = Health::Unusable(Unusable::VolumeGroupMissing { vg: "v".into() });
        assert_eq!(one_check(&cache, known(gone.clone())).await, gone);
        assert_eq!(cache.slow().in_a_row, 0);
        assert_eq!(cache.slow().total, u64::from(DEGRADED_AFTER + 1));
        // A known unusable pool stays unusable through timeouts too: slow
        // says nothing either way.
        assert_eq!(one_check(&cache, slow()).await, gone);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_out_first_check_is_no_proof_of_health() {
        let cache = HealthCache::default();
        let h = cache
            .get(HEALTH_TTL, || async { Checked::TimedOut("slow".into()) })
            .await;
        assert_eq!(h, Health::Unusable(Unusable::CheckFailed("slow".into())));
    }
}
