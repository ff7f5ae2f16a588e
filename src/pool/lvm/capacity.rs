//! Capacity: what a volume may take from the VG or thin pool, in whole
//! extents, and what GetCapacity offers.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::provisioning::{Provisioning, Thin};
use super::LvmPool;
use crate::lvm;
use crate::pool::CapacityRange;
use crate::pool::{PoolError, Result};

/// What a thin pool offers, from `lvs` figures of the thin pool LV (its size
/// and `data_percent`) and the sizes promised to its thin volumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ThinOffer {
    /// size × ratio − reserve: the most ever promised (in whole extents).
    pub ever: u64,
    /// `ever` − promised: what may still be promised (in whole extents).
    pub by_promise: u64,
    /// The pool's unwritten data space − reserve (in whole extents).
    pub by_data: u64,
}

impl ThinOffer {
    /// From the thin pool's size, its Data% (None: lvm reports none, e.g.
    /// inactive: counted as 0), the overprovision ratio, the reserve, the
    /// sizes promised and the VG's extent size.
    pub fn new(
        size: u64,
        data_percent: Option<f64>,
        ratio: f64,
        reserve: u64,
        promised: u64,
        extent: u64,
    ) -> Self {
        let ever = ((size as f64) * ratio) as u64;
        let ever = ever.saturating_sub(reserve);
        let used = (size as f64 * data_percent.unwrap_or(0.0).clamp(0.0, 100.0) / 100.0) as u64;
        let by_data = size.saturating_sub(used).saturating_sub(reserve);
        ThinOffer {
            ever: round_down(ever, extent),
            by_promise: round_down(ever.saturating_sub(promised), extent),
            by_data: round_down(by_data, extent),
        }
    }

    /// What GetCapacity offers: the smaller of the two.
    pub fn offered(&self) -> u64 {
        self.by_promise.min(self.by_data)
    }
}

/// The size of a volume for `range`, in whole extents of `extent` bytes:
/// `required` rounded up, or (only a limit) the default or the most whole
/// extents under the limit; OUT_OF_RANGE when no whole-extent size fits.
pub(super) fn size_in_extents(range: CapacityRange, default: u64, extent: u64) -> Result<u64> {
    let want = match (range.required, range.limit) {
        (0, 0) => default,
        (0, limit) => default.min(round_down(limit, extent)).max(1),
        (req, _) => req,
    };
    let size = want.div_ceil(extent).saturating_mul(extent);
    if range.limit > 0 && size > range.limit {
        return Err(PoolError::SizeRefused(format!(
            "no whole number of extents ({extent} bytes each) fits between required_bytes {} and limit_bytes {}",
            range.required, range.limit
        )));
    }
    Ok(size)
}

pub(super) fn round_down(v: u64, unit: u64) -> u64 {
    v.checked_div(unit).map_or(v, |n| n * unit)
}

/// How long GetCapacity's answer is kept: the external-provisioner asks once
/// per StorageClass, one after another on one thread, every minute and at
/// every new class, and each answer is a `vgs` (and for a thin pool an `lvs`)
/// that takes a second or more on a busy node. On the e2e node (2026-11-29)
/// Kubernetes' own capacity spec waited over its one minute for a new class's
/// CSIStorageCapacity behind that queue. A create, delete or expansion in this
/// pool forgets the answer at once; a change made beside it (another pool on
/// the same VG, the wiper giving back a deleted LV's extents) shows within
/// this long.
pub(super) const OFFER_TTL: Duration = Duration::from_secs(2);

/// The last answer of [`LvmPool::offered`] and when it was found; one lookup
/// at a time (callers meanwhile wait for its answer).
#[derive(Default)]
pub(super) struct OfferCache {
    /// Bumped by every change of the pool's volumes: an answer found while a
    /// change ran is not kept.
    changes: AtomicU64,
    last: tokio::sync::Mutex<Option<(Instant, u64, u64)>>,
}

impl OfferCache {
    /// The pool's volumes changed: the next answer is looked up.
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// Runs `change` to its end (whatever it returns), then forgets the
    /// answer: every create, delete, expansion and snapshot of the pool.
    pub async fn after<T>(&self, change: impl Future<Output = T>) -> T {
        let done = change.await;
        self.changed();
        done
    }

    /// The kept answer while it is younger than `ttl` and no change came
    /// since it was looked up; else `lookup`'s, kept.
    pub async fn get<F, Fut>(&self, ttl: Duration, lookup: F) -> Result<u64>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<u64>>,
    {
        let mut last = self.last.lock().await;
        let changes = self.changes.load(Ordering::Acquire);
        if let Some((at, seen, offered)) = *last {
            if seen == changes && at.elapsed() < ttl {
                return Ok(offered);
            }
        }
        let offered = lookup().await?;
        *last = Some((Instant::now(), changes, offered));
        Ok(offered)
    }
}

impl LvmPool {
    /// Extent size of the VG: LV sizes are whole extents.
    pub(super) async fn extent(&self) -> Result<u64> {
        let vg = lvm::vg(&self.vg).await?;
        self.set_extent(&vg);
        Ok(vg.extent_size.max(512))
    }

    /// (largest volume this pool could ever hold, largest creatable now).
    /// For a thin pool "now" is what may still be promised: creates and
    /// expansions may overprovision up to the ratio; what GetCapacity offers
    /// is [`LvmPool::offered`].
    pub(super) async fn limits(&self) -> Result<(u64, u64)> {
        self.limits_in(&lvm::vg(&self.vg).await?).await
    }

    /// [`LvmPool::limits`] with the VG's report already at hand.
    pub(super) async fn limits_in(&self, vg: &lvm::VgInfo) -> Result<(u64, u64)> {
        match &self.provisioning {
            Provisioning::Thick(thick) => Ok(thick.limits(vg, self.reserve)),
            Provisioning::Thin(thin) => {
                let offer = self.thin_offer(thin, vg).await?;
                Ok((offer.ever, offer.by_promise))
            }
        }
    }

    /// [`LvmPool::limits`] from a report of the VG and all its LVs.
    pub(super) fn limits_with(&self, vg: &lvm::VgInfo, lvs: &[lvm::LvInfo]) -> Result<(u64, u64)> {
        match &self.provisioning {
            Provisioning::Thick(thick) => Ok(thick.limits(vg, self.reserve)),
            Provisioning::Thin(thin) => {
                let offer = self.thin_offer_with(thin, vg, lvs)?;
                Ok((offer.ever, offer.by_promise))
            }
        }
    }

    /// The thin pool's figures.
    pub(super) async fn thin_offer(&self, thin: &Thin, vg: &lvm::VgInfo) -> Result<ThinOffer> {
        self.thin_offer_with(thin, vg, &lvm::lvs(&self.vg).await?)
    }

    /// [`LvmPool::thin_offer`] from `lvs` of the VG at hand.
    pub(super) fn thin_offer_with(
        &self,
        thin: &Thin,
        vg: &lvm::VgInfo,
        lvs: &[lvm::LvInfo],
    ) -> Result<ThinOffer> {
        let thin_pool = thin.pool.as_str();
        let pool = lvs
            .iter()
            .find(|l| l.name == thin_pool && l.is_thin_pool())
            .ok_or_else(|| {
                self.unavailable(format!("thin pool {}/{thin_pool} is missing", self.vg))
            })?;
        let promised: u64 = lvs
            .iter()
            .filter(|l| l.is_thin_volume() && l.pool_lv == thin_pool)
            .map(|l| l.size)
            .sum();
        Ok(ThinOffer::new(
            pool.size,
            pool.data_percent,
            thin.ratio,
            self.reserve,
            promised,
            vg.extent_size,
        ))
    }

    /// What GetCapacity offers now: thick, what [`LvmPool::limits`] says;
    /// thin, the smaller of what may still be promised and the pool's
    /// unwritten data space (both less the reserve), so a pool whose data
    /// is nearly full is not offered to the scheduler on the strength of
    /// its overprovision ratio.
    pub(super) async fn offered(&self) -> Result<u64> {
        let vg = lvm::vg(&self.vg).await?;
        match &self.provisioning {
            Provisioning::Thick(_) => Ok(self.limits_in(&vg).await?.1),
            Provisioning::Thin(thin) => Ok(self.thin_offer(thin, &vg).await?.offered()),
        }
    }

    /// [`LvmPool::offered`], as GetCapacity asks it: kept for
    /// [`OFFER_TTL`] unless this pool's volumes change.
    pub(super) async fn offered_recently(&self) -> Result<u64> {
        self.offer.get(OFFER_TTL, || self.offered()).await
    }

    /// The size for a request, in whole extents, within the range.
    pub(super) async fn size_for(&self, range: CapacityRange) -> Result<u64> {
        size_in_extents(range, self.default_size, self.extent().await?)
    }

    pub(super) fn check_room(&self, size: u64, ever: u64, now: u64, what: &str) -> Result<()> {
        if size > ever {
            return Err(PoolError::TooLarge {
                what: what.to_owned(),
                bytes: size,
                pool: self.name.clone(),
                total: ever,
            });
        }
        if size > now {
            return Err(PoolError::NoSpace {
                what: what.to_owned(),
                bytes: size,
                pool: self.name.clone(),
                free: now,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    /// A lookup that counts its runs and answers `offered`.
    fn lookup(runs: &Arc<AtomicU32>, offered: u64) -> impl Future<Output = Result<u64>> {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(offered)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_answer_is_kept_for_the_ttl_and_forgotten_at_a_change() {
        let cache = OfferCache::default();
        let runs = Arc::new(AtomicU32::new(0));
        assert_eq!(
            cache.get(OFFER_TTL, || lookup(&runs, 10)).await.unwrap(),
            10
        );
        tokio::time::advance(OFFER_TTL - Duration::from_millis(1)).await;
        assert_eq!(
            cache.get(OFFER_TTL, || lookup(&runs, 20)).await.unwrap(),
            10
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "kept within the ttl");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            cache.get(OFFER_TTL, || lookup(&runs, 20)).await.unwrap(),
            20
        );
        cache.changed();
        assert_eq!(
            cache.get(OFFER_TTL, || lookup(&runs, 30)).await.unwrap(),
            30
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "looked up again after the ttl and the change"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_found_while_a_change_ran_is_not_kept_and_errors_are_not_kept() {
        let cache = OfferCache::default();
        let runs = Arc::new(AtomicU32::new(0));
        let during = cache
            .get(OFFER_TTL, || {
                cache.changed(); // a create finishing while lvm answered
                lookup(&runs, 10)
            })
            .await;
        assert_eq!(during.unwrap(), 10);
        assert_eq!(
            cache.get(OFFER_TTL, || lookup(&runs, 20)).await.unwrap(),
            20
        );
        cache.changed();
        let failed = cache
            .get(OFFER_TTL, || async {
                Err(PoolError::VolumeNotFound("x".into()))
            })
            .await;
        assert!(failed.is_err());
        assert_eq!(
            cache.get(OFFER_TTL, || lookup(&runs, 30)).await.unwrap(),
            30
        );
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn callers_at_once_share_one_lookup() {
        let cache = Arc::new(OfferCache::default());
        let runs = Arc::new(AtomicU32::new(0));
        let slow = |runs: Arc<AtomicU32>| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok(7)
        };
        let callers: Vec<_> = (0..5)
            .map(|_| {
                let (cache, runs) = (cache.clone(), runs.clone());
                tokio::spawn(async move { cache.get(OFFER_TTL, || slow(runs)).await.unwrap() })
            })
            .collect();
        for c in callers {
            assert_eq!(c.await.unwrap(), 7);
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "one lvm run for five callers"
        );
    }
}
