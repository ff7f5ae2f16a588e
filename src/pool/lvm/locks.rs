//! Process-wide locks keyed by thin pool (`vg/thin`): two configured pools
//! may share one thin pool, so a lock of the thin pool cannot live in either
//! `LvmPool`. Each use has its own set ([`ThinPoolLocks`]); unlike the
//! volume locks (`crate::locks`), a caller waits for its turn.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// One waiting lock per thin pool, made on first use.
pub(super) struct ThinPoolLocks(Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl ThinPoolLocks {
    pub(super) const fn new() -> Self {
        ThinPoolLocks(Mutex::new(BTreeMap::new()))
    }

    /// The lock of thin pool `vg/thin`.
    pub(super) fn of(&self, vg: &str, thin: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.entry(format!("{vg}/{thin}")).or_default().clone()
    }
}
