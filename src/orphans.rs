//! Orphans: volumes of this node's pools that no PersistentVolume refers to.
//!
//! Each pass compares the pools' volumes with the volume handles of this
//! driver's PVs (a reflector cache of PVs; read access only). A volume that
//! stays unreferenced for the grace period is reported (a warning log); with
//! `orphans: {mode: reclaim}` it is then deleted through its pool, under the
//! node's volume lock, which refuses volumes that are mounted anywhere. A
//! volume just created whose PV the provisioner has not written yet is covered
//! by the grace period; the first-seen times live in memory, so a restart only
//! delays a report.
//!
//! An orphan whose PV the node-loss controller deleted while this node was
//! gone, and whose storage is still this pool's (the node came back with its
//! disks: `k8s::lost`), is kept whatever the mode: reported (a warning, the
//! `orphan_volumes_kept_after_node_loss` gauge, an Event on the Node) and
//! never reclaimed. While the node's lost record cannot be read, nothing is
//! reclaimed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use tokio::sync::Mutex;

use crate::driver::Driver;
use crate::driver::DriverError;
use crate::ids::{ParsedId, StorageId, VolumeId};
use crate::k8s::lost::{self, LostRecord};
use crate::pool::PoolError;
use crate::task::AbortOnDrop;

pub use crate::config::{OrphanMode, OrphansConfig};

/// Tracks since when volumes have been unreferenced.
#[derive(Debug, Default)]
pub struct Tracker {
    since: BTreeMap<String, Instant>,
}

impl Tracker {
    /// Returns the volumes unreferenced for at least `grace`.
    pub fn update(
        &mut self,
        now: Instant,
        volumes: &BTreeSet<String>,
        referenced: &BTreeSet<String>,
        grace: Duration,
    ) -> Vec<String> {
        self.since
            .retain(|v, _| volumes.contains(v) && !referenced.contains(v));
        for v in volumes.difference(referenced) {
            self.since.entry(v.clone()).or_insert(now);
        }
        self.since
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) >= grace)
            .map(|(v, _)| v.clone())
            .collect()
    }
}

/// What one pass found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OrphanReport {
    pub orphans: Vec<String>,
    /// Orphans kept because the node-loss controller deleted their PVs and
    /// their storage is this node's (never reclaimed).
    pub kept: Vec<String>,
    pub reclaimed: Vec<String>,
}

/// Where the node's lost record is read, and Events are sent.
struct Cluster {
    client: Client,
    /// The namespace of the lost records (the driver's).
    namespace: String,
    recorder: Recorder,
}

/// What this pass knows of the node's lost record.
enum Lost {
    None,
    Record(LostRecord),
    /// It could not be read: nothing is reclaimed.
    Unreadable,
}

pub struct Orphans {
    driver: Arc<Driver>,
    cfg: OrphansConfig,
    tracker: Mutex<Tracker>,
    cluster: Option<Cluster>,
    /// Kept orphans an Event was sent for (once per volume and process).
    announced: Mutex<BTreeSet<String>>,
}

impl Orphans {
    pub fn new(driver: Arc<Driver>, cfg: OrphansConfig) -> Self {
        Orphans {
            driver,
            cfg,
            tracker: Mutex::default(),
            cluster: None,
            announced: Mutex::default(),
        }
    }

    /// Reads the node's lost record from `namespace` at every pass, and
    /// records Events, through `client`.
    pub fn with_cluster(mut self, client: Client, namespace: &str) -> Self {
        let reporter = Reporter {
            controller: "localvol-node".into(),
            instance: Some(self.driver.node_id.clone()),
        };
        self.cluster = Some(Cluster {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            namespace: namespace.to_owned(),
        });
        self
    }

    async fn lost(&self) -> Lost {
        let Some(c) = &self.cluster else {
            return Lost::None;
        };
        match lost::read(&c.client, &c.namespace, &self.driver.node_id).await {
            Ok(Some(r)) => Lost::Record(r),
            Ok(None) => Lost::None,
            Err(e) => {
                tracing::warn!(error = %e, record = %lost::record_name(&self.driver.node_id),
                    "orphans: cannot read this node's lost record; reclaiming nothing this pass");
                Lost::Unreadable
            }
        }
    }

    /// An Event on this node's Node object about a kept orphan (once).
    async fn announce(&self, id: &str, node_lost: &LostRecord) {
        let Some(c) = &self.cluster else { return };
        if !self.announced.lock().await.insert(id.to_owned()) {
            return;
        }
        let node = &self.driver.node_id;
        let note = format!(
            "volume {id} lost its PV when node {} was declared lost, but its storage is still here: kept, never reclaimed; re-adopt it with a static PV or delete it by hand (record {}/{})",
            node_lost.node,
            c.namespace,
            lost::record_name(node)
        );
        crate::k8s::publish_node_event(
            &c.recorder,
            node,
            EventType::Warning,
            "OrphanKeptAfterNodeLoss",
            "Keep",
            note,
        )
        .await;
    }

    /// One pass at `now` against a cache of PVs.
    pub async fn pass(
        &self,
        now: Instant,
        pvs: &Store<PersistentVolume>,
    ) -> Result<OrphanReport, PoolError> {
        let referenced: BTreeSet<String> = pvs
            .state()
            .iter()
            .filter_map(|p| p.spec.as_ref()?.csi.as_ref())
            .filter(|c| c.driver == self.driver.name)
            .map(|c| c.volume_handle.clone())
            .collect();
        // Ephemeral inline volumes have no PV: they go with their pod
        // (swept here when its target path is gone), never as orphans.
        self.driver.sweep_ephemeral().await;
        let mut volumes = BTreeSet::new();
        let mut storage: BTreeMap<String, Option<StorageId>> = BTreeMap::new();
        for pool in self.driver.pools.iter() {
            // A pool that cannot serve is passed over: its volumes are
            // neither reported nor reclaimed until it is back.
            let listed = pool.list().await;
            let pools = &self.driver.pools;
            for v in pools
                .unless_unusable(pool.name(), "orphans", listed)?
                .into_iter()
                .flatten()
            {
                if v.ephemeral_target().is_none() {
                    let id = v.id.to_string();
                    storage.insert(id.clone(), pool.storage_id().cloned());
                    volumes.insert(id);
                }
            }
        }
        let lost = self.lost().await;
        let orphans = self.tracker.lock().await.update(
            now,
            &volumes,
            &referenced,
            Duration::from_secs(self.cfg.grace_seconds),
        );
        let mut report = OrphanReport::default();
        for id in orphans {
            report.orphans.push(id.clone());
            if let Lost::Record(rec) = &lost {
                let here = storage.get(&id).cloned().flatten();
                if rec.keeps(&id, here.as_ref()) {
                    tracing::warn!(volume = %id, storage = ?here.as_ref().map(|s| s.to_string()),
                        "orphan kept: the node-loss controller deleted its PV, and its storage is still this node's; never reclaimed (re-adopt it with a static PV, see docs/operations.md)");
                    self.announce(&id, rec).await;
                    report.kept.push(id);
                    continue;
                }
            }
            tracing::warn!(volume = %id, mode = ?self.cfg.mode, "orphan: no PersistentVolume refers to this volume");
            if self.cfg.mode == OrphanMode::Reclaim && matches!(lost, Lost::Unreadable) {
                continue;
            }
            if self.cfg.mode == OrphanMode::Reclaim {
                match self.reclaim(&id).await {
                    Ok(()) => {
                        tracing::info!(volume = %id, "orphan reclaimed");
                        report.reclaimed.push(id);
                    }
                    Err(e) => tracing::warn!(volume = %id, error = %e, "orphan not reclaimed"),
                }
            }
        }
        crate::metrics::set_orphans(report.orphans.len(), report.kept.len());
        Ok(report)
    }

    async fn reclaim(&self, raw: &str) -> Result<(), DriverError> {
        let ParsedId::Volume(id) = VolumeId::parse("volume id", raw)? else {
            return Ok(());
        };
        let Some(pool) = self.driver.pools.get(&id.pool).cloned() else {
            return Ok(());
        };
        let _guard = self
            .driver
            .locks
            .try_lock(id.key.as_str(), &format!("volume {id}"))?;
        Ok(pool.delete(&id).await?)
    }

    /// Runs until dropped: a cache of all PVs (filtered to this driver), a
    /// pass every `interval` once the cache is filled.
    pub async fn run(self: Arc<Self>, client: Client, interval: Duration) {
        let (reader, writer) = reflector::store::<PersistentVolume>();
        let stream = watcher(
            Api::<PersistentVolume>::all(client),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(writer);
        let cache = tokio::spawn(async move {
            let mut s = std::pin::pin!(stream);
            while let Some(e) = s.next().await {
                if let Err(e) = e {
                    tracing::warn!(error = %e, "PV watch (orphans) failed; retrying");
                }
            }
        });
        let _cache = AbortOnDrop(cache);
        if reader.wait_until_ready().await.is_err() {
            return;
        }
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            if let Err(e) = self.pass(Instant::now(), &reader).await {
                tracing::warn!(error = %e, "orphan pass failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::PoolName;
    use serde_json::json;

    async fn driver(dir: &std::path::Path) -> Arc<Driver> {
        Driver::open_embedded(dir, "n1").await
    }

    async fn create(d: &Driver, name: &str) -> String {
        d.create_embedded(name).await
    }

    fn store(handles: &[(&str, &str)]) -> Store<PersistentVolume> {
        let (reader, mut writer) = reflector::store::<PersistentVolume>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for (i, (driver, handle)) in handles.iter().enumerate() {
            let pv: PersistentVolume = serde_json::from_value(json!({
                "metadata": {"name": format!("pv-{i}")},
                "spec": {"csi": {"driver": driver, "volumeHandle": handle}},
            }))
            .unwrap();
            writer.apply_watcher_event(&watcher::Event::InitApply(pv));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        reader
    }

    /// `run` caches the PVs (list and watch) and then passes, reading the
    /// node's lost record: the orphan pass's calls (discovery role).
    #[tokio::test]
    async fn run_watches_the_pvs_and_reads_the_lost_record() {
        use crate::k8s::fake::{Fake, Role, NAMESPACE, PVS};
        let tmp = tempfile::tempdir().unwrap();
        let fake = Fake::start(Role::Discovery);
        let cfg: OrphansConfig = serde_norway::from_str("{}").unwrap();
        let o = Orphans::new(driver(tmp.path()).await, cfg)
            .with_cluster(fake.client.clone(), NAMESPACE);
        let task = tokio::spawn(Arc::new(o).run(fake.client.clone(), Duration::from_secs(60)));
        let record = format!("GET /api/v1/namespaces/{NAMESPACE}/configmaps/localvol-lost.n1");
        let log = fake.wait_for(&record).await;
        task.abort();
        assert_eq!(log, [format!("LIST {PVS}"), record]);
    }

    #[test]
    fn config_defaults_and_validation() {
        let c: OrphansConfig = serde_norway::from_str("{}").unwrap();
        assert_eq!(c.mode, OrphanMode::Report);
        assert_eq!(c.grace_seconds, 3600);
        let c: OrphansConfig = serde_norway::from_str("{mode: reclaim, graceSeconds: 60}").unwrap();
        assert_eq!(c.mode, OrphanMode::Reclaim);
        assert!(serde_norway::from_str::<OrphansConfig>("{mode: delete}").is_err());
        let cfg = crate::config::Config::from_yaml(
            "pools: [{name: a, type: dir, path: /x}]\norphans: {mode: reclaim}\n",
        )
        .unwrap();
        assert_eq!(cfg.orphans.unwrap().mode, OrphanMode::Reclaim);
        let cfg =
            crate::config::Config::from_yaml("pools: [{name: a, type: dir, path: /x}]\n").unwrap();
        assert_eq!(cfg.orphans, None);
    }

    #[tokio::test]
    async fn orphans_are_reported_after_grace_and_reclaimed_only_when_asked() {
        let tmp = tempfile::tempdir().unwrap();
        let d = driver(tmp.path()).await;
        let kept = create(&d, "pvc-kept").await;
        let orphan = create(&d, "pvc-orphan").await;
        // A PV of another driver with the same handle does not count.
        let pvs = store(&[("localvol.csi.dev", &kept), ("other.csi.dev", &orphan)]);
        let grace = Duration::from_secs(60);
        let t0 = Instant::now();

        let report = Orphans::new(
            d.clone(),
            OrphansConfig {
                mode: OrphanMode::Report,
                grace_seconds: 60,
            },
        );
        assert_eq!(
            report.pass(t0, &pvs).await.unwrap(),
            OrphanReport::default()
        );
        let r = report.pass(t0 + grace, &pvs).await.unwrap();
        assert_eq!(r.orphans, std::slice::from_ref(&orphan));
        assert!(r.reclaimed.is_empty());
        let pool = d.pools.get(&PoolName::parse("default").unwrap()).unwrap();
        assert_eq!(pool.list().await.unwrap().len(), 2, "report never deletes");

        let reclaim = Orphans::new(
            d.clone(),
            OrphansConfig {
                mode: OrphanMode::Reclaim,
                grace_seconds: 60,
            },
        );
        assert_eq!(
            reclaim.pass(t0, &pvs).await.unwrap(),
            OrphanReport::default()
        );
        // The PV shows up before the grace period ends: not an orphan.
        let late = store(&[("localvol.csi.dev", &kept), ("localvol.csi.dev", &orphan)]);
        assert_eq!(
            reclaim.pass(t0 + grace, &late).await.unwrap(),
            OrphanReport::default()
        );
        // Gone again, for a whole grace period: reclaimed.
        assert_eq!(
            reclaim.pass(t0 + grace * 2, &pvs).await.unwrap(),
            OrphanReport::default()
        );
        let r = reclaim.pass(t0 + grace * 3, &pvs).await.unwrap();
        assert_eq!(r.reclaimed, std::slice::from_ref(&orphan));
        let left: Vec<_> = pool
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|v| v.id.to_string())
            .collect();
        assert_eq!(left, [kept]);
    }
}
