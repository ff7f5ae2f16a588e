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

#[derive(Clone, Default)]
pub struct VolumeLocks {
    // Held only for a set insert or removal, never across I/O or an await.
    busy: Arc<Mutex<HashSet<String>>>,
}

/// Releases the volume when dropped.
pub struct VolumeGuard {
    busy: Arc<Mutex<HashSet<String>>>,
    key: String,
}

impl VolumeLocks {
    pub fn try_lock(&self, key: &str, what: &str) -> Result<VolumeGuard, Busy> {
        let mut busy = self.busy.lock().expect("lock poisoned");
        if !busy.insert(key.to_owned()) {
            return Err(Busy {
                what: what.to_owned(),
            });
        }
        Ok(VolumeGuard {
            busy: self.busy.clone(),
            key: key.to_owned(),
        })
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        if let Ok(mut busy) = self.busy.lock() {
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
}
