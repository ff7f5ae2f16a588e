//! The pool monitor. Every `--pool-check-interval` (10 s) it tries again to open the pools
//! that have not opened, looks at each pool's health and records it
//! ([`crate::pool::Pools::record`]), which the RPCs read: an unusable
//! pool offers no capacity and refuses its volumes' RPCs with the reason,
//! while the other pools serve on. Each change is logged and, with a
//! cluster, recorded as an Event on this node's Node object
//! (`PoolUnusable`, `PoolUsable`); `localvol_pool_ready` shows it too.

use std::sync::Arc;

use kube::runtime::events::{EventType, Recorder, Reporter};

use crate::driver::Driver;
use crate::ids::PoolName;
use crate::pool::{Change, Health};

pub struct Monitor {
    driver: Arc<Driver>,
    recorder: Option<Recorder>,
    /// Whether a pass ran: the first announces the pools that were
    /// unusable from the start.
    looked: bool,
}

impl Monitor {
    pub fn new(driver: Arc<Driver>) -> Self {
        Monitor {
            driver,
            recorder: None,
            looked: false,
        }
    }

    /// Records Events through `client` from now on.
    pub fn set_cluster(&mut self, client: kube::Client) {
        let reporter = Reporter {
            controller: "localvol-node".into(),
            instance: Some(self.driver.node_id.clone()),
        };
        self.recorder = Some(Recorder::new(client, reporter));
    }

    pub fn has_cluster(&self) -> bool {
        self.recorder.is_some()
    }

    /// One look at every pool; the pools that opened during it.
    pub async fn pass(&mut self) -> Vec<PoolName> {
        let pools = &self.driver.pools;
        let opened = pools.reopen().await;
        let mut changes = Vec::new();
        for pool in pools.iter() {
            let health = pool.health().await;
            let change = match (pools.record(pool.name(), &health), health) {
                (Some(c), _) => Some(c),
                (None, Health::Unusable(why)) if !self.looked => Some(Change::Unusable(why)),
                _ => None,
            };
            if let Some(c) = change {
                changes.push((pool.name().clone(), c));
            }
        }
        self.looked = true;
        for (pool, change) in changes {
            self.announce(&pool, change).await;
        }
        opened
    }

    async fn announce(&self, pool: &PoolName, change: Change) {
        let (type_, reason, action, note) = match change {
            Change::Unusable(why) => {
                tracing::error!(%pool, reason = %why,
                    "pool unusable: it offers no capacity and its volumes' RPCs are refused until it is back; the other pools serve on");
                let note = format!("pool {pool} is unusable: {why}");
                (EventType::Warning, "PoolUnusable", "Check", note)
            }
            Change::Usable => {
                tracing::info!(%pool, "pool usable again");
                let note = format!("pool {pool} is usable again");
                (EventType::Normal, "PoolUsable", "Check", note)
            }
        };
        if let Some(r) = &self.recorder {
            let node = &self.driver.node_id;
            crate::k8s::publish_node_event(r, node, type_, reason, action, note).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::fake::{Fake, Role};
    use crate::pool::Unusable;

    /// A pool's changes become Events on the node's Node object; the same
    /// change again is the same Event repeated (kube-runtime's Recorder
    /// patches its series), all on the storage role's client.
    #[tokio::test]
    async fn pool_changes_are_events_and_repeats_patch_them() {
        let tmp = tempfile::tempdir().unwrap();
        let driver = Driver::open_embedded(tmp.path(), "n1").await;
        let fake = Fake::start(Role::Storage);
        let mut m = Monitor::new(driver);
        m.set_cluster(fake.client.clone());
        let pool = PoolName::parse("default").unwrap();
        let gone = || Change::Unusable(Unusable::CheckFailed("gone".into()));
        m.announce(&pool, gone()).await;
        m.announce(&pool, gone()).await;
        m.announce(&pool, Change::Usable).await;
        assert_eq!(
            fake.log(),
            [
                "EVENT PoolUnusable",
                "EVENT PoolUnusable",
                "EVENT PoolUsable"
            ]
        );
        assert_eq!(
            fake.needs(),
            [
                "storage ClusterRole events.k8s.io events create",
                "storage ClusterRole events.k8s.io events patch"
            ]
        );
    }
}
