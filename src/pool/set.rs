//! The node's pools, by name. A pool whose storage is not there when the
//! driver starts (its volume group missing, a disk refused, a dir pool's
//! mount point not mounted yet) does not stop the others: a stand-in
//! ([`RefusedPool`]) answers for it with the reason until a later
//! [`Pools::reopen`] opens it. Whether each pool is usable now is what the
//! pool monitor saw last ([`Pools::record`]); the RPCs read it with one
//! atomic load ([`Pools::unusable`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::refused::RefusedPool;
use super::{dir, disks, lvm, Health, Pool, PoolError, Result, Unusable};
use crate::config::{Config, PoolConfig};
use crate::ids::PoolName;

/// The pools of this node, by name.
pub struct Pools {
    slots: HashMap<PoolName, Slot>,
    order: Vec<PoolName>,
    default: PoolName,
}

/// One configured pool: opened, or waiting to be.
struct Slot {
    config: PoolConfig,
    /// Set once, when the pool opens; never replaced.
    opened: OnceLock<Arc<dyn Pool>>,
    /// What answers while the pool is not open, and why it is not.
    waiting: Arc<RefusedPool>,
    waiting_dyn: Arc<dyn Pool>,
    /// False while the pool cannot serve (the last look), with the reason.
    usable: AtomicBool,
    why: Mutex<Option<Unusable>>,
}

impl Slot {
    /// A pool not opened (yet), not looked at: its stand-in answers.
    fn new(pc: &PoolConfig) -> Self {
        let waiting = Arc::new(RefusedPool::new(pc, Unusable::NotOpened));
        Slot {
            config: pc.clone(),
            opened: OnceLock::new(),
            waiting_dyn: waiting.clone(),
            waiting,
            usable: AtomicBool::new(true),
            why: Mutex::new(None),
        }
    }

    fn current(&self) -> &Arc<dyn Pool> {
        self.opened.get().unwrap_or(&self.waiting_dyn)
    }
}

/// A pool's usability changed (what the monitor logs and announces).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// It could not serve, and now it can.
    Usable,
    /// It could serve (or had not been looked at), and now it cannot; or
    /// it still cannot, for another reason.
    Unusable(Unusable),
}

/// Opens one pool: its disks first (a dir pool's mount point checked),
/// then the backend. The reason when it cannot open.
async fn open_one(pc: &PoolConfig) -> std::result::Result<Arc<dyn Pool>, Unusable> {
    let failed = |e: PoolError| Unusable::OpenFailed(e.to_string());
    match pc {
        PoolConfig::Dir(d) => {
            disks::prepare_dir(d).await?;
            disks::check_mount_point(d).await?;
            Ok(Arc::new(
                dir::DirPool::open(d.clone()).await.map_err(failed)?,
            ))
        }
        PoolConfig::Lvm(l) => {
            disks::prepare_lvm(l).await?;
            Ok(Arc::new(
                lvm::LvmPool::open(l.clone()).await.map_err(failed)?,
            ))
        }
    }
}

impl Pools {
    /// The pools of `cfg` without opening any: each is its stand-in
    /// ([`RefusedPool`]), which answers what its backend offers (the
    /// checks of a new volume's request) and refuses every call, and none
    /// has been looked at. Nothing on the node is read or touched: `localvol
    /// config check` checks classes against them.
    pub fn unopened(cfg: &Config) -> Self {
        Pools {
            slots: (cfg.pools.iter())
                .map(|pc| (pc.name().clone(), Slot::new(pc)))
                .collect(),
            order: cfg.pools.iter().map(|p| p.name().clone()).collect(),
            default: cfg.default_pool().clone(),
        }
    }

    /// Opens every configured pool. One that cannot open is logged and
    /// waits, unusable, for [`Pools::reopen`]; the others serve.
    pub async fn open(cfg: &Config) -> Self {
        let mut slots = HashMap::new();
        let mut order = Vec::new();
        for pc in &cfg.pools {
            let slot = Slot::new(pc);
            match open_one(pc).await {
                Ok(pool) => {
                    tracing::info!(pool = %pc.name(), backend = pool.backend().as_str(), "pool opened");
                    let _ = slot.opened.set(pool);
                }
                Err(why) => {
                    tracing::error!(pool = %pc.name(), reason = %why,
                        "pool not opened: unusable until its storage is there (retried)");
                    slot.waiting.set_why(why.clone());
                    slot.usable.store(false, Ordering::Relaxed);
                    *slot.why.lock().unwrap() = Some(why);
                }
            }
            order.push(pc.name().clone());
            slots.insert(pc.name().clone(), slot);
        }
        Pools {
            slots,
            order,
            default: cfg.default_pool().clone(),
        }
    }

    /// Tries again to open each pool that is not open; the names of those
    /// that opened now. Only the pool monitor calls it (one at a time).
    pub async fn reopen(&self) -> Vec<PoolName> {
        let mut opened = Vec::new();
        for name in &self.order {
            let slot = &self.slots[name];
            if slot.opened.get().is_some() {
                continue;
            }
            match open_one(&slot.config).await {
                Ok(pool) => {
                    tracing::info!(pool = %name, backend = pool.backend().as_str(), "pool opened");
                    if slot.opened.set(pool).is_ok() {
                        opened.push(name.clone());
                    }
                }
                Err(why) => slot.waiting.set_why(why),
            }
        }
        opened
    }

    /// Records what a look at the pool found; the change, if any.
    pub fn record(&self, name: &PoolName, health: &Health) -> Option<Change> {
        let slot = self.slots.get(name)?;
        let mut why = slot.why.lock().unwrap();
        let now = match health {
            Health::Ready => None,
            Health::Unusable(u) => Some(u.clone()),
        };
        if *why == now {
            return None;
        }
        let was_usable = why.is_none();
        *why = now.clone();
        slot.usable.store(now.is_none(), Ordering::Relaxed);
        match now {
            None if !was_usable => Some(Change::Usable),
            None => None,
            Some(u) => Some(Change::Unusable(u)),
        }
    }

    /// Why the pool cannot serve, as last seen; None while it can (or
    /// for a pool that does not exist).
    pub fn unusable(&self, name: &PoolName) -> Option<Unusable> {
        let slot = self.slots.get(name)?;
        if slot.usable.load(Ordering::Relaxed) {
            return None;
        }
        slot.why.lock().unwrap().clone()
    }

    /// What a lookup (`what`) of a pool's volumes or snapshots gave, with a
    /// failure of a pool that cannot serve now passed over (None, logged):
    /// its volumes are left out, not reported gone, and the callers' other
    /// pools serve on. Any other error stays an error.
    pub fn unless_unusable<T>(
        &self,
        pool: &PoolName,
        what: &str,
        res: Result<T>,
    ) -> Result<Option<T>> {
        match res {
            Err(e) if self.unusable(pool).is_some() => {
                tracing::warn!(%pool, error = %e, what, "an unusable pool is left out");
                Ok(None)
            }
            r => r.map(Some),
        }
    }

    pub fn get(&self, name: &PoolName) -> Option<&Arc<dyn Pool>> {
        self.slots.get(name).map(Slot::current)
    }

    /// The pool named by a request, or NOT_FOUND-style INVALID_ARGUMENT.
    pub fn require(&self, name: &PoolName) -> Result<&Arc<dyn Pool>> {
        self.get(name).ok_or_else(|| PoolError::UnknownPool {
            pool: name.clone(),
            known: self.names(),
        })
    }

    pub fn default_pool(&self) -> &PoolName {
        &self.default
    }

    /// Whether any pool takes snapshots (the driver advertises them then;
    /// an LVM pool does, open or not).
    pub fn any_snapshots(&self) -> bool {
        self.iter().any(|p| p.snapshots().is_some())
    }

    /// Pools in config order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Pool>> {
        self.order.iter().map(|n| self.slots[n].current())
    }

    fn names(&self) -> String {
        self.order
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
