//! Whether an LVM pool can serve: its volume group exists (and its thin pool
//! is one, and zeroes the blocks it provisions), as `vgs`/`lvs` report it
//! right now.
//!
//! Probe, `/readyz` and every metrics scrape ask, and the liveness-probe
//! sidecar gives a Probe one second by default: running lvm for each would
//! queue reports behind a long `lvcreate` holding the VG lock. So the answer
//! is kept for [`HEALTH_TTL`]; an older one is refreshed by a check in a
//! task of its own while callers get the last answer (only the first caller
//! of all waits for one).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lvm::{LvInfo, LvmError, VgInfo};
use crate::pool::{Health, Unusable};

/// How long a health answer is reused.
pub const HEALTH_TTL: Duration = Duration::from_secs(5);

/// The pool's health from its VG report and, for a thin pool, the report of
/// that LV (`None`: no such LV). A report that failed for another reason than
/// "not found" is [`Unusable::CheckFailed`]: lvm cannot say that the pool
/// works.
pub fn judge(
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

/// The last health answer and when it was found, and whether a check runs.
#[derive(Default)]
pub struct HealthCache {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    last: Mutex<Option<(Instant, Health)>>,
    running: AtomicBool,
    done: Notify,
}

impl HealthCache {
    /// The cached answer while it is younger than `ttl`. Older: a check
    /// starts (one at a time) in a task of its own, and the caller gets the
    /// last answer at once; only a caller with no answer at all waits for
    /// it. The check runs to its end even when every caller has gone: the
    /// e2e cluster showed why. Under a burst of 50 thin creates a `vgs`
    /// waited seconds for the VG lock; the Probe that had started it was
    /// cancelled after the liveness sidecar's one second, which dropped
    /// the check, so every later Probe started and lost another, and kubelet
    /// restarted the node plugin mid-burst.
    pub async fn get<F, Fut>(&self, ttl: Duration, check: F) -> Health
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Health> + Send + 'static,
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
                let h = fut.await;
                *inner.last.lock().unwrap() = Some((Instant::now(), h));
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

    #[test]
    fn a_present_vg_is_ready() {
        assert_eq!(judge("fxvg", vg(), None), Health::Ready);
    }

    #[test]
    fn a_missing_vg_is_unusable() {
        // What vgs says for a VG that is not there (lvm 2.03).
        let err = failed("  Volume group \"gone\" not found\n  Cannot process volume group gone\n");
        assert_eq!(
            judge("gone", Err(err), None),
            Health::Unusable(Unusable::VolumeGroupMissing { vg: "gone".into() })
        );
    }

    #[test]
    fn an_lvm_that_cannot_answer_is_not_called_healthy() {
        let err = LvmError::Command(CommandError::Timeout {
            program: "lvm".into(),
            after: Duration::from_secs(60),
        });
        assert!(matches!(
            judge("fxvg", Err(err), None),
            Health::Unusable(Unusable::CheckFailed(_))
        ));
    }

    #[test]
    fn thin_pools_must_exist_and_be_thin_pools() {
        let lvs = parse_lvs(LVS_THIN).unwrap();
        let pool = lvs.iter().find(|l| l.is_thin_pool()).unwrap().name.clone();
        let other = lvs.iter().find(|l| !l.is_thin_pool()).unwrap().name.clone();
        assert_eq!(judge("fxvg", vg(), Some((&pool, lv(&pool)))), Health::Ready);
        assert_eq!(
            judge("fxvg", vg(), Some((&other, lv(&other)))),
            Health::Unusable(Unusable::NotAThinPool {
                vg: "fxvg".into(),
                thin: other.clone()
            })
        );
        assert_eq!(
            judge("fxvg", vg(), Some(("nope", Ok(None)))),
            Health::Unusable(Unusable::ThinPoolMissing {
                vg: "fxvg".into(),
                thin: "nope".into()
            })
        );
        // A thin pool that does not zero new blocks (`-Zn`: the 8th
        // lv_attr character is `-` instead of `z`) is refused.
        let mut unzeroed = lv(&pool).unwrap().unwrap();
        unzeroed.attr = "twi-aot---".into();
        assert_eq!(
            judge("fxvg", vg(), Some((&pool, Ok(Some(unzeroed))))),
            Health::Unusable(Unusable::ThinPoolNotZeroing {
                vg: "fxvg".into(),
                thin: pool.clone()
            })
        );
        // The VG is judged first.
        assert!(matches!(
            judge(
                "fxvg",
                Err(failed("Volume group \"fxvg\" not found")),
                Some((&pool, lv(&pool)))
            ),
            Health::Unusable(Unusable::VolumeGroupMissing { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_reused_for_the_ttl_then_refreshed_behind_the_callers() {
        let cache = HealthCache::default();
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let check = |h: Health| {
            runs.fetch_add(1, Ordering::SeqCst);
            async move { h }
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
            cache.get(HEALTH_TTL, || async { Health::Ready }).await,
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
                Health::Unusable(Unusable::CheckFailed("late".into()))
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
                        Health::Ready
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
}
