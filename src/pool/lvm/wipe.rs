//! Thick pools zero what a deleted volume or snapshot held before its
//! extents go back to the volume group, so a new LV never reads another
//! volume's data, whatever its mode (raw block included).
//!
//! Deleting a volume tags its LV `localvol.deleted` (one `lvchange` whose
//! selection has lvm check ownership, open state and snapshots in the same
//! run; see `LvmPool::remove_if_ours`), or, on the checked path and for
//! snapshots, renames it to `wp-<key>-<stamp>`; either is one lvm metadata
//! commit, and the delete returns. From then on its id names nothing (a
//! repeated delete succeeds; a create of the same name renames a tagged LV
//! first, then makes a new one), no listing shows it, and its extents stay
//! allocated, so GetCapacity does not offer them. The tag or the name is
//! the whole record. One [`Wiper`] task per thick pool finds every such LV
//! of the pool (when the pool opens, after each delete, and every [`RETRY`]
//! while some are left), renames a tagged one to `wp-…` (freeing its name),
//! splits a copy-on-write snapshot from its origin, zeroes the LV through
//! its own device ([`ExclusiveDevice::zero`]), and removes it. A wipe cut
//! short by a crash leaves the LV behind, and the next driver zeroes it
//! again from the start.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

use super::capacity::OfferCache;
use super::tags::{TAG_DELETED, TAG_OWNER, TAG_POOL};
use crate::blockdev::ExclusiveDevice;
use crate::ids::PoolName;
use crate::lvm::{self, LvInfo};
use crate::pool::{PoolError, Result, Wipes};
use crate::task::AbortOnDrop;

/// Prefix of an LV being wiped.
pub(super) const WIPE_PREFIX: &str = "wp-";

/// Bytes zeroed per call: progress is counted, and a stopping driver
/// waits for at most one, between them.
const CHUNK: u64 = 64 << 20;

/// How soon a pass runs again while LVs are left that could not be wiped
/// (open, or lvm failed).
const RETRY: Duration = Duration::from_secs(30);

/// The name an LV (`lv-<key>` or `sn-<key>`) gets when it is deleted: the
/// key, for whoever reads `lvs`, and a stamp that keeps it unique when a
/// volume of the same name is created and deleted again before the first
/// wipe ends.
pub(super) fn wipe_lv_name(lv: &str) -> String {
    let key = lv.split_once('-').map_or(lv, |(_, k)| k);
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{WIPE_PREFIX}{key}-{stamp:x}")
}

/// An LV waiting to be wiped (of some pool: check the tags too).
pub(super) fn is_wiping(lv: &LvInfo) -> bool {
    lv.name.starts_with(WIPE_PREFIX)
}

/// State the pool and its wiper task share.
struct Shared {
    vg: String,
    pool: PoolName,
    /// The pool's GetCapacity answer, forgotten when a wiped LV goes.
    offer: Arc<OfferCache>,
    wake: Notify,
    /// Set when the pool goes: the zeroing loop stops between chunks.
    stop: AtomicBool,
    wiped_bytes: AtomicU64,
    wipe_nanos: AtomicU64,
    /// `wipeRateLimit`: at most this many bytes a second.
    rate: Option<u64>,
}

/// A thick pool's background wiper; dropping it stops the task.
pub(super) struct Wiper {
    shared: Arc<Shared>,
    _task: AbortOnDrop,
}

impl Drop for Wiper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

impl Wiper {
    /// Starts the task; its first pass resumes whatever a previous driver
    /// left.
    pub fn start(vg: &str, pool: &PoolName, rate: Option<u64>, offer: Arc<OfferCache>) -> Self {
        let shared = Arc::new(Shared {
            vg: vg.to_owned(),
            pool: pool.clone(),
            offer,
            wake: Notify::new(),
            stop: AtomicBool::new(false),
            wiped_bytes: AtomicU64::new(0),
            wipe_nanos: AtomicU64::new(0),
            rate,
        });
        let task = tokio::spawn(crate::runs::attributed("wipe", shared.clone().run()));
        Wiper {
            shared,
            _task: AbortOnDrop(task),
        }
    }

    /// A volume was just marked: look for work now.
    pub fn wake(&self) {
        self.shared.wake.notify_one();
    }

    /// What waits (from `lvs`, the pool's `wp-` LVs) and what was done.
    pub fn wipes(&self, lvs: &[LvInfo]) -> Wipes {
        Wipes {
            pending_bytes: lvs
                .iter()
                .filter(|l| self.shared.is_pools(l))
                .map(|l| l.size)
                .sum(),
            wiped_bytes: self.shared.wiped_bytes.load(Ordering::Relaxed),
            seconds: self.shared.wipe_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

impl Shared {
    /// A `wp-` LV of this pool, or one of its volumes tagged deleted.
    fn is_pools(&self, lv: &LvInfo) -> bool {
        (is_wiping(lv) || lv.has_tag(TAG_DELETED))
            && lv.has_tag(TAG_OWNER)
            && lv.tag_value(TAG_POOL) == Some(self.pool.as_str())
    }

    async fn run(self: Arc<Self>) {
        loop {
            let left = self.pass().await;
            if left {
                let _ = tokio::time::timeout(RETRY, self.wake.notified()).await;
            } else {
                self.wake.notified().await;
            }
        }
    }

    /// Wipes every `wp-` LV of the pool; whether some are left.
    async fn pass(self: &Arc<Self>) -> bool {
        let lvs = match lvm::lvs(&self.vg).await {
            Ok(lvs) => lvs,
            Err(e) => {
                tracing::warn!(vg = self.vg, error = %e, "cannot list LVs to wipe; retrying");
                return true;
            }
        };
        let mut left = false;
        for lv in lvs.iter().filter(|l| self.is_pools(l)) {
            let path = format!("{}/{}", self.vg, lv.name);
            let started = Instant::now();
            tracing::info!(lv = path, bytes = lv.size, "wiping a deleted volume");
            match self.wipe(lv).await {
                Ok(true) => {
                    let secs = started.elapsed().as_secs_f64();
                    tracing::info!(
                        lv = path,
                        bytes = lv.size,
                        seconds = secs,
                        mib_per_second = lv.size as f64 / (1 << 20) as f64 / secs.max(1e-9),
                        "wiped and removed"
                    );
                }
                Ok(false) => return true,
                Err(e) => {
                    tracing::warn!(lv = path, error = %e, "wipe failed; it will be retried");
                    left = true;
                }
            }
        }
        left
    }

    /// Zeroes one `wp-` LV and removes it (a volume tagged deleted is
    /// renamed to `wp-…` first); false when the pool is stopping.
    async fn wipe(self: &Arc<Self>, lv: &LvInfo) -> Result<bool> {
        let mut lv = lv.clone();
        if !is_wiping(&lv) {
            // Its name is freed first: a create of the same name must not
            // wait for the zeroing. (A lookup of that name may have renamed
            // it meanwhile: then lvrename fails, and the next pass finds
            // the `wp-` LV.)
            let to = wipe_lv_name(&lv.name);
            lvm::rename(&self.vg, &lv.name, &to).await?;
            lv.path = format!("/dev/{}/{to}", self.vg);
            lv.name = to;
        }
        let path = format!("{}/{}", self.vg, lv.name);
        if lv.is_cow_snapshot() {
            if lv.open {
                return Err(in_use(&path));
            }
            // Its exception store holds the origin's old blocks: as a
            // plain LV it can be zeroed like any other.
            lvm::split_snapshot(&path).await?;
            lv = lvm::lv(&self.vg, &lv.name)
                .await?
                .ok_or_else(|| PoolError::Inconsistent(format!("LV {path} vanished")))?;
        }
        if !lv.is_active() {
            lvm::activate(&path).await?;
        } else if lv.open {
            // Deletes refuse open LVs, so this is a holder that came after
            // (or a process of a killed driver): leave it be, look again.
            return Err(in_use(&path));
        }
        // An lvrename or activation killed mid-run can leave it without
        // its nodes; the zeroing opens the node.
        super::node::ensure_nodes(&path).await?;
        if !self
            .clone()
            .zero(PathBuf::from(format!("/dev/{path}")))
            .await?
        {
            return Ok(false);
        }
        lvm::remove(&path).await?;
        // Its extents are the VG's again: GetCapacity looks again.
        self.offer.changed();
        Ok(true)
    }

    /// Zeroes the whole device of an active LV, chunk by chunk, counting
    /// progress; false when the pool stopped it. The device is opened
    /// `O_EXCL`: EBUSY while a filesystem on it is mounted.
    async fn zero(self: Arc<Self>, dev: PathBuf) -> Result<bool> {
        // Dropped with this future (the task aborted, the runtime shutting
        // down): the blocking loop, which nothing can abort, stops at the
        // next chunk instead of zeroing the rest of the LV.
        let cancel = CancelOnDrop(Arc::new(AtomicBool::new(false)));
        let cancelled = cancel.0.clone();
        let stopped =
            move |me: &Shared| me.stop.load(Ordering::Relaxed) || cancelled.load(Ordering::Relaxed);
        crate::error::blocking(move || {
            let mut d = ExclusiveDevice::open(&dev)?;
            // Rate-limited: about four chunks a second, each followed by a
            // pause that keeps the average under the limit.
            let chunk = self.rate.map_or(CHUNK, |r| (r / 4).clamp(1 << 20, CHUNK));
            let began = Instant::now();
            let mut offset = 0;
            while offset < d.size() {
                let started = Instant::now();
                let n = chunk.min(d.size() - offset);
                d.zero(offset, n)?;
                if offset + n == d.size() {
                    d.sync()?;
                }
                offset += n;
                if let Some(rate) = self.rate {
                    let due = began + Duration::from_secs_f64(offset as f64 / rate as f64);
                    while let Some(left) = due.checked_duration_since(Instant::now()) {
                        if stopped(&self) {
                            break;
                        }
                        std::thread::sleep(left.min(Duration::from_millis(100)));
                    }
                }
                self.wiped_bytes.fetch_add(n, Ordering::Relaxed);
                self.wipe_nanos
                    .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                if stopped(&self) && offset < d.size() {
                    return Ok(false);
                }
            }
            Ok::<_, PoolError>(true)
        })
        .await
    }
}

/// Sets its flag when dropped.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn in_use(path: &str) -> PoolError {
    PoolError::Inconsistent(format!(
        "LV {path} is open; it is wiped once nothing holds it"
    ))
}
