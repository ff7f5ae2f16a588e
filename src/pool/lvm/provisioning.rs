//! Thick and thin: the two ways an LVM pool provisions its volumes, as two
//! types behind the one [`super::LvmPool`]. A rule that holds for one of them
//! only is a method of its type ([`Thick`], [`Thin`]) or takes it as an
//! argument, so it runs only where a `match` on [`Provisioning`] found that
//! variant: block maps, thin usage and room, the thin pool's locks, repairs
//! and metadata snapshot need a [`Thin`]; the wiper, `lvcreateOptions`, the
//! capacity overhead and copy-on-write snapshots' room need a [`Thick`].

use std::fmt;
use std::path::Path;

use crate::config::{LvmPoolConfig, DEFAULT_THIN_FULL_PERCENT};
use crate::lvm::NewLv;
use crate::pool::{Backend, Result, ThinUsage};

use super::capacity::round_down;
use super::wipe::Wiper;

/// The name of a thin pool LV in the pool's VG (`thinPool`, checked by the
/// config as an LVM name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ThinPoolName(String);

impl ThinPoolName {
    pub fn new(name: &str) -> Self {
        ThinPoolName(name.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ThinPoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How the pool's LVs get their blocks.
pub(super) enum Provisioning {
    /// Linear (or `lvcreateOptions`-shaped) LVs of the VG's free extents.
    Thick(Thick),
    /// Thin LVs of one thin pool.
    Thin(Thin),
}

/// A thick pool's own settings and its wiper.
pub(super) struct Thick {
    /// `lvcreateOptions`, added to every `lvcreate` of a volume.
    pub options: Vec<String>,
    /// `capacityOverhead`: VG bytes each volume byte takes.
    pub overhead: f64,
    /// Zeroes deleted LVs before they go (see `wipe.rs`): started once the
    /// pool has opened (None before, and in unit tests).
    pub wiper: Option<Wiper>,
}

/// A thin pool's own settings. A thin pool needs no wiper: it zeroes every
/// block it provisions (checked in `health.rs`).
#[derive(Clone, Debug)]
pub(super) struct Thin {
    pub pool: ThinPoolName,
    /// `overprovisionRatio`: how many times its size the thin pool may
    /// promise.
    pub ratio: f64,
    /// `thinFullPercent`: Data% or Metadata% at or above this makes every
    /// volume's condition abnormal.
    pub full_percent: f64,
}

impl Provisioning {
    /// The strategy a pool's config asks for. The config refuses the
    /// settings of one for the other (`LvmPoolConfig::validate`), except
    /// `capacityOverhead`, which a thin pool takes and does not use.
    pub fn of(cfg: &LvmPoolConfig) -> Self {
        match cfg.thin_pool_name() {
            Some(pool) => Provisioning::Thin(Thin {
                pool: ThinPoolName::new(pool),
                ratio: cfg.overprovision_ratio.unwrap_or(1.0),
                full_percent: cfg.thin_full_percent.unwrap_or(DEFAULT_THIN_FULL_PERCENT),
            }),
            None => Provisioning::Thick(Thick {
                options: cfg.lvcreate_options.clone(),
                overhead: cfg.capacity_overhead.unwrap_or(1.0),
                wiper: None,
            }),
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Provisioning::Thick(_) => Backend::Lvm,
            Provisioning::Thin(_) => Backend::LvmThin,
        }
    }

    /// The thin pool, for a thin pool's rules.
    pub fn thin(&self) -> Option<&Thin> {
        match self {
            Provisioning::Thin(t) => Some(t),
            Provisioning::Thick(_) => None,
        }
    }

    /// The thin pool's LV, which the health check and the index watch
    /// besides the VG (None: a thick pool's VG is all there is).
    pub fn thin_pool(&self) -> Option<&ThinPoolName> {
        self.thin().map(|t| &t.pool)
    }

    /// A new LV of `size` bytes, as this pool makes them.
    pub fn new_lv(&self, size: u64) -> NewLv<'_> {
        match self {
            Provisioning::Thin(t) => NewLv::Thin {
                pool: t.pool.as_str(),
                size,
            },
            Provisioning::Thick(t) => NewLv::Thick {
                size,
                options: &t.options,
            },
        }
    }

    /// Whether a new volume's room is checked before its `lvcreate` (see
    /// `LvmPool::size_new`): always in a thin pool (the overprovision ratio
    /// is the driver's to keep); in a thick one only with a reserve or an
    /// overhead, which lvm does not know of.
    pub fn checks_room_first(&self, reserve: u64) -> bool {
        match self {
            Provisioning::Thin(_) => true,
            Provisioning::Thick(t) => reserve > 0 || t.overhead != 1.0,
        }
    }

    /// Whether `lvcreate` may have shaped a new LV otherwise than asked
    /// (`lvcreateOptions` such as stripes round its size): it is read back.
    pub fn shapes_otherwise(&self) -> bool {
        matches!(self, Provisioning::Thick(t) if !t.options.is_empty())
    }

    /// A just created volume's `lv_attr` and `pool_lv`, as `lvs` would
    /// report them: a thin or linear volume, writeable, inherited
    /// allocation, active; thin volumes zero what they provision.
    pub fn created_shape(&self) -> (&'static str, String) {
        match self {
            Provisioning::Thin(t) => ("Vwi-a-tz--", t.pool.to_string()),
            Provisioning::Thick(_) => ("-wi-a-----", String::new()),
        }
    }
}

impl Thick {
    /// (largest volume ever, largest now) from the VG's size and free
    /// space, less the reserve, over the overhead, in whole extents.
    pub fn limits(&self, vg: &crate::lvm::VgInfo, reserve: u64) -> (u64, u64) {
        let ever = ((vg.size.saturating_sub(reserve)) as f64 / self.overhead) as u64;
        let now = ((vg.free.saturating_sub(reserve)) as f64 / self.overhead) as u64;
        (
            round_down(ever, vg.extent_size),
            round_down(now, vg.extent_size),
        )
    }

    /// What `lvcreate --wipesignatures y --zero y` does once it has
    /// activated a new LV, for one a killed `lvcreate` left unwiped: its
    /// extents may hold a deleted volume's data (a thin pool's new blocks
    /// read as zeros).
    pub async fn wipe_new(&self, dev: &Path) -> Result<()> {
        crate::blockdev::raw::erase_signatures(dev).await?;
        crate::blockdev::raw::zero_start(dev).await?;
        Ok(())
    }

    /// A deleted volume is there to wipe: look for work now.
    pub fn wake_wiper(&self) {
        if let Some(w) = &self.wiper {
            w.wake();
        }
    }
}

impl Thin {
    /// Data% and Metadata% of the thin pool (None: lvm reports no such LV).
    pub async fn usage(&self, vg: &str) -> Result<Option<ThinUsage>> {
        Ok(crate::lvm::lv(vg, self.pool.as_str())
            .await?
            .map(|pool| ThinUsage {
                data_percent: pool.data_percent.unwrap_or(0.0),
                metadata_percent: pool.metadata_percent.unwrap_or(0.0),
            }))
    }
}
