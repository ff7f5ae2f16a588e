//! Per-volume operation locks. A second operation on a volume that is busy is
//! answered ABORTED at once (the CSI spec's "operation pending" code) instead of
//! queueing; operations on different volumes never wait on each other.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Another operation on the same volume or snapshot is running.
#[derive(Debug, thiserror::Error)]
#[error("an operation on {what} is already in progress")]
pub struct Busy {
    pub what: String,
}

/// Shards of the busy set: operations on different volumes take different
/// mutexes, so concurrent requests do not queue on one lock.
const SHARDS: usize = 64;

type Shards = Arc<[Mutex<HashSet<String>>]>;

#[derive(Clone)]
pub struct VolumeLocks {
    // Each held only for a set insert or removal, never across I/O or an await.
    busy: Shards,
}

impl Default for VolumeLocks {
    fn default() -> Self {
        VolumeLocks {
            busy: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

/// Releases the volume when dropped.
pub struct VolumeGuard {
    busy: Shards,
    shard: usize,
    key: String,
}

/// The shard of a key (FNV-1a of its bytes).
fn shard_of(key: &str) -> usize {
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (h % SHARDS as u64) as usize
}

impl VolumeLocks {
    pub fn try_lock(&self, key: &str, what: &str) -> Result<VolumeGuard, Busy> {
        let shard = shard_of(key);
        let mut busy = self.busy[shard].lock().expect("lock poisoned");
        if !busy.insert(key.to_owned()) {
            return Err(Busy {
                what: what.to_owned(),
            });
        }
        Ok(VolumeGuard {
            busy: self.busy.clone(),
            shard,
            key: key.to_owned(),
        })
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        if let Ok(mut busy) = self.busy[self.shard].lock() {
            busy.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_aborted_until_release() {
        let locks = VolumeLocks::default();
        let g = locks.try_lock("a", "volume a").unwrap();
        assert!(matches!(locks.try_lock("a", "volume a"), Err(Busy { .. })));
        let _other = locks.try_lock("b", "volume b").unwrap();
        drop(g);
        locks.try_lock("a", "volume a").unwrap();
    }

    #[test]
    fn released_keys_leave_nothing_behind() {
        let locks = VolumeLocks::default();
        let guards: Vec<_> = (0..1000)
            .map(|i| locks.try_lock(&format!("k{i}"), "v").unwrap())
            .collect();
        let held = |l: &VolumeLocks| {
            l.busy
                .iter()
                .map(|s| s.lock().unwrap().len())
                .sum::<usize>()
        };
        assert_eq!(held(&locks), 1000);
        assert!(
            locks.busy.iter().all(|s| !s.lock().unwrap().is_empty()),
            "keys spread over every shard"
        );
        drop(guards);
        assert_eq!(held(&locks), 0);
    }
}
