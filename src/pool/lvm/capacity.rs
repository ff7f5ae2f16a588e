//! Capacity: what a volume may take from the VG or thin pool, in whole
//! extents, and what GetCapacity offers.

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
