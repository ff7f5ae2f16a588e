//! Capacity: what a volume may take from the VG or thin pool, in whole
//! extents, and what GetCapacity offers.

use super::LvmPool;
use crate::lvm;
use crate::pool::CapacityRange;
use crate::pool::{PoolError, Result};

/// A thin pool fuller than this makes its volumes' condition abnormal.
pub(super) const THIN_FULL_PERCENT: f64 = 90.0;

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
        Ok(lvm::vg(&self.vg).await?.extent_size.max(512))
    }

    /// (largest volume this pool could ever hold, largest creatable now).
    pub(super) async fn limits(&self) -> Result<(u64, u64)> {
        self.limits_in(&lvm::vg(&self.vg).await?).await
    }

    /// [`LvmPool::limits`] with the VG's report already at hand.
    pub(super) async fn limits_in(&self, vg: &lvm::VgInfo) -> Result<(u64, u64)> {
        match &self.thin {
            None => {
                let ever = ((vg.size.saturating_sub(self.reserve)) as f64 / self.overhead) as u64;
                let now = ((vg.free.saturating_sub(self.reserve)) as f64 / self.overhead) as u64;
                Ok((
                    round_down(ever, vg.extent_size),
                    round_down(now, vg.extent_size),
                ))
            }
            Some(thin) => {
                let lvs = lvm::lvs(&self.vg).await?;
                let pool = lvs
                    .iter()
                    .find(|l| &l.name == thin && l.is_thin_pool())
                    .ok_or_else(|| {
                        self.unavailable(format!("thin pool {}/{thin} is missing", self.vg))
                    })?;
                let virtual_total = ((pool.size as f64) * self.ratio) as u64;
                let promised: u64 = lvs
                    .iter()
                    .filter(|l| l.is_thin_volume() && &l.pool_lv == thin)
                    .map(|l| l.size)
                    .sum();
                let ever = virtual_total.saturating_sub(self.reserve);
                let now = ever.saturating_sub(promised);
                Ok((
                    round_down(ever, vg.extent_size),
                    round_down(now, vg.extent_size),
                ))
            }
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
