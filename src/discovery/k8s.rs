//! The Kubernetes side of static discovery, run by `localvol serve` on every
//! node when `discovery:` is configured:
//!
//! - a PV cache: a kube-runtime reflector over this node's static PVs (label
//!   selector [`pv::selector`]), with the default backoff; passes read it and
//!   never list the API in a loop;
//! - [`Discoverer::pass`], run at start, periodically and whenever the cache
//!   changes: cleans and deletes this node's `Released` static PVs (the deleter),
//!   redoes cleanups a crash interrupted, and creates a PV for every discovered
//!   entry that has none (the next pass after a delete recreates it);
//! - Events on the PV for discovery and cleanup started / finished / failed.
//!
//! Only PVs this node created for this driver are touched ([`pv::ours`]), a PV
//! is cleaned only while the API says it is `Released` (read fresh, not from
//! the cache), and the delete is conditional on the PV's uid.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;

use super::node::StaticPool;
use super::pv;
use super::scan::{self, Discovered};
use super::StaticHandle;
use crate::error::blocking;
use crate::task::AbortOnDrop;

/// Failures of a discovery pass; per-volume failures become Events instead.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Static(#[from] super::StaticError),
}

/// What one pass did (for logs and tests).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub created: Vec<String>,
    pub cleaned: Vec<String>,
    pub deleted: Vec<String>,
    pub failed: Vec<String>,
}

pub struct Discoverer {
    api: Api<PersistentVolume>,
    recorder: Recorder,
    driver: String,
    node: String,
    statics: Arc<StaticPool>,
    /// Skipped entries already warned about (warned once, not every pass).
    warned: Mutex<BTreeSet<String>>,
    /// The node service's volume locks: a cleanup holds the volume's lock, so
    /// a NodeStage/NodePublish of it cannot start while it is being wiped.
    locks: Option<Arc<crate::locks::VolumeLocks>>,
}

impl Discoverer {
    pub fn new(client: Client, driver: &str, node: &str, statics: Arc<StaticPool>) -> Self {
        let reporter = Reporter {
            controller: "localvol".into(),
            instance: Some(node.to_owned()),
        };
        Discoverer {
            api: Api::all(client.clone()),
            recorder: Recorder::new(client, reporter),
            driver: driver.to_owned(),
            node: node.to_owned(),
            statics,
            warned: Mutex::default(),
            locks: None,
        }
    }

    /// Shares the node service's volume locks (see the `locks` field).
    pub fn with_volume_locks(mut self, locks: Arc<crate::locks::VolumeLocks>) -> Self {
        self.locks = Some(locks);
        self
    }

    async fn event(&self, pv: &PersistentVolume, type_: EventType, reason: &str, note: String) {
        crate::k8s::publish_event(&self.recorder, pv, type_, reason, note).await;
    }

    /// One pass over the cache (this node's static PVs) and the disks.
    pub async fn pass(
        &self,
        store: &Store<PersistentVolume>,
    ) -> Result<PassReport, DiscoveryError> {
        let mut report = PassReport::default();
        let mine: BTreeMap<StaticHandle, Arc<PersistentVolume>> = store
            .state()
            .into_iter()
            .filter_map(|p| pv::ours(&p, &self.driver, &self.node).map(|h| (h, p)))
            .collect();

        // The deleter: Released PVs are cleaned, then deleted.
        for (h, p) in &mine {
            if pv::phase(p) == Some("Released") {
                self.release(h, p, &mut report).await?;
            }
        }

        // Cleanups a crash interrupted, of entries that have no PV now (those
        // with a Released PV were just redone above; a Bound one never is).
        let cfg = self.statics.config().clone();
        let redone = self
            .statics
            .cleaner()
            .redo_pending(&cfg, |h| !mine.contains_key(h))
            .await?;
        for (h, res) in redone {
            match res {
                Ok(()) => report.cleaned.push(h.to_string()),
                Err(e) => {
                    tracing::warn!(handle = %h, error = %e, "pending cleanup failed");
                    report.failed.push(h.to_string());
                }
            }
        }

        // Discovery: a PV for every entry that has none.
        let c = cfg.clone();
        let found = blocking(move || scan::scan_all(&c)).await?;
        {
            let mut warned = self.warned.lock().expect("warned lock");
            for s in &found.skipped {
                let key = format!("{}: {}", s.path.display(), s.reason);
                if warned.insert(key) {
                    tracing::warn!(path = ?s.path, reason = %s.reason, "discovery: entry skipped, not a volume");
                }
            }
        }
        let cleaner = self.statics.cleaner().clone();
        let pending: BTreeSet<String> = blocking(move || cleaner.pending())
            .await?
            .into_iter()
            .map(|m| m.handle)
            .collect();
        for d in &found.found {
            if mine.contains_key(&d.handle) || pending.contains(&d.handle.to_string()) {
                continue;
            }
            if let Some(name) = self.create(d).await? {
                report.created.push(name);
            }
        }
        Ok(report)
    }

    /// Creates the PV of a discovered entry; None when it already exists.
    async fn create(&self, d: &Discovered) -> Result<Option<String>, DiscoveryError> {
        let class = &self.statics.config().classes[d.class];
        let want = pv::build(&self.driver, &self.node, class, d);
        let name = want.metadata.name.clone().unwrap_or_default();
        match self.api.create(&PostParams::default(), &want).await {
            Ok(created) => {
                tracing::info!(pv = %name, path = ?d.path, handle = %d.handle, "discovery: PV created");
                crate::metrics::record_discovered();
                self.event(
                    &created,
                    EventType::Normal,
                    "Discovered",
                    format!(
                        "{} on node {} ({} bytes)",
                        d.path.display(),
                        self.node,
                        d.capacity_bytes
                    ),
                )
                .await;
                Ok(Some(name))
            }
            // The cache has not seen it yet.
            Err(kube::Error::Api(s)) if s.is_already_exists() || s.is_conflict() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The deleter for one Released PV: check it fresh, clean, delete.
    async fn release(
        &self,
        h: &StaticHandle,
        cached: &PersistentVolume,
        report: &mut PassReport,
    ) -> Result<(), DiscoveryError> {
        let name = cached.metadata.name.clone().unwrap_or_default();
        let Some(fresh) = self.still_released(h, cached, &name).await? else {
            return Ok(());
        };
        // Busy (a node RPC on this volume is running): next pass.
        let _guard = match &self.locks {
            Some(locks) => match locks.try_lock(&h.entry_key, &format!("static volume {h}")) {
                Ok(g) => Some(g),
                Err(_) => return Ok(()),
            },
            None => None,
        };
        if self.clean(h, &fresh, &name, report).await? {
            self.delete_cleaned(&fresh, name, report).await?;
        }
        Ok(())
    }

    /// The PV as the API has it now, when it is still this entry's and
    /// Released (the cache may be behind).
    async fn still_released(
        &self,
        h: &StaticHandle,
        cached: &PersistentVolume,
        name: &str,
    ) -> Result<Option<PersistentVolume>, DiscoveryError> {
        let Some(fresh) = self.api.get_opt(name).await? else {
            return Ok(None);
        };
        let same = pv::ours(&fresh, &self.driver, &self.node).as_ref() == Some(h)
            && pv::phase(&fresh) == Some("Released")
            && fresh.metadata.uid == cached.metadata.uid;
        Ok(same.then_some(fresh))
    }

    /// Wipes the entry behind a released PV, with an Event for each step.
    /// Whether it is clean now; failures are recorded in `report`.
    async fn clean(
        &self,
        h: &StaticHandle,
        fresh: &PersistentVolume,
        name: &str,
        report: &mut PassReport,
    ) -> Result<bool, DiscoveryError> {
        let cfg = self.statics.config().clone();
        let hh = h.clone();
        let entry = blocking(move || scan::find(&cfg, &hh)).await?;
        let Some(entry) = entry else {
            let why = format!("volume {h} is not discovered on node {} now", self.node);
            self.event(fresh, EventType::Warning, "CleanupFailed", why)
                .await;
            report.failed.push(name.to_owned());
            return Ok(false);
        };
        let path = entry.path.display().to_string();
        let msg = format!("cleaning {path} on node {}", self.node);
        self.event(fresh, EventType::Normal, "CleanupStarted", msg)
            .await;
        let started = std::time::Instant::now();
        let cleaned = self
            .statics
            .cleaner()
            .cleanup(self.statics.config(), &entry)
            .await;
        crate::metrics::record_cleanup(cleaned.is_ok(), started.elapsed().as_secs_f64());
        if let Err(e) = cleaned {
            tracing::warn!(pv = %name, error = %e, "cleanup failed");
            self.event(fresh, EventType::Warning, "CleanupFailed", e.to_string())
                .await;
            report.failed.push(name.to_owned());
            return Ok(false);
        }
        let msg = format!("{path} is clean; deleting the PV");
        self.event(fresh, EventType::Normal, "CleanupFinished", msg)
            .await;
        report.cleaned.push(name.to_owned());
        Ok(true)
    }

    /// Deletes a cleaned PV, only if it is still the same object.
    async fn delete_cleaned(
        &self,
        fresh: &PersistentVolume,
        name: String,
        report: &mut PassReport,
    ) -> Result<(), DiscoveryError> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: fresh.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.api.delete(&name, &dp).await {
            Ok(_) => {
                tracing::info!(pv = %name, "released static PV cleaned and deleted");
                report.deleted.push(name);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Runs until the task is dropped: the cache in its own task, a pass at
    /// start (once the cache is filled), every `interval`, and after changes.
    pub async fn run(self: Arc<Self>, interval: Duration) {
        let (reader, writer) = reflector::store();
        let wc = watcher::Config::default().labels(&pv::selector(&self.node));
        let changed = Arc::new(tokio::sync::Notify::new());
        let notify = changed.clone();
        let stream = watcher(self.api.clone(), wc)
            .default_backoff()
            .reflect(writer);
        let cache = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(_) => notify.notify_one(),
                    Err(e) => tracing::warn!(error = %e, "PV watch failed; retrying"),
                }
            }
        });
        let _cache = AbortOnDrop(cache);
        if reader.wait_until_ready().await.is_err() {
            return;
        }
        let mut tick = tokio::time::interval(interval);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = changed.notified() => {}
            }
            match self.pass(&reader).await {
                Ok(r) if r != PassReport::default() => {
                    tracing::info!(report = ?r, "discovery pass")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "discovery pass failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::scan::tests::{class, TestMount};
    use crate::discovery::{CleanupMethod, DiscoveryConfig, VolumeMode};
    use crate::k8s::fake::{Fake, Role};
    use serde_json::json;
    use std::fs;
    use std::path::PathBuf;

    const DRIVER: &str = "localvol.csi.dev";
    const NODE: &str = "worker-1";
    const TIMEOUT: Duration = Duration::from_secs(20);

    /// The node's disks (one tmpfs volume `vol` and a plain dir) and a
    /// Discoverer talking to a fake API server.
    struct Scenario {
        _mount: TestMount,
        vol: PathBuf,
        discoverer: Discoverer,
        fake: Fake,
        _tmp: tempfile::TempDir,
    }

    impl Scenario {
        /// Leaves the marker a cleanup interrupted by a crash leaves (as
        /// the cleaner writes it before wiping).
        fn interrupted_cleanup(&self) {
            let h = self.entry().handle;
            fs::write(
                self._tmp
                    .path()
                    .join("state/cleanup")
                    .join(format!("{h}.json")),
                serde_json::to_vec(&super::super::cleanup::Marker {
                    handle: h.to_string(),
                    path: self.vol.clone(),
                    method: CleanupMethod::DeleteContents,
                    started_unix: 1,
                })
                .unwrap(),
            )
            .unwrap();
        }

        fn new(name: &str) -> Self {
            eprintln!("scenario: {name}");
            let tmp = tempfile::tempdir().unwrap();
            let disks = tmp.path().join("disks");
            fs::create_dir_all(disks.join("plain")).unwrap();
            let vol = disks.join("vol");
            let mount = TestMount::tmpfs(&vol, "4m");
            fs::write(vol.join("data"), b"old tenant").unwrap();
            let mut c = class(
                &disks,
                VolumeMode::Filesystem,
                CleanupMethod::DeleteContents,
            );
            c.storage_class = "local-fs".into();
            let cfg = DiscoveryConfig {
                classes: vec![c],
                state_dir: tmp.path().join("state"),
            };
            let statics = Arc::new(StaticPool::open(cfg.clone(), &cfg.state_dir).unwrap());
            let fake = Fake::start(Role::Discovery);
            let discoverer = Discoverer::new(fake.client.clone(), DRIVER, NODE, statics);
            Scenario {
                _mount: mount,
                vol,
                discoverer,
                fake,
                _tmp: tmp,
            }
        }

        fn entry(&self) -> Discovered {
            let r = scan::scan_all(self.discoverer.statics.config()).unwrap();
            assert_eq!(r.found.len(), 1, "{r:?}");
            r.found.into_iter().next().unwrap()
        }

        /// The PV this node would create for its volume, as the API has it.
        fn our_pv(&self, phase: &str) -> PersistentVolume {
            let d = self.entry();
            let mut pv = pv::build(
                DRIVER,
                NODE,
                &self.discoverer.statics.config().classes[0],
                &d,
            );
            let name = pv.metadata.name.clone().unwrap();
            pv.metadata.uid = Some(format!("uid-{name}"));
            pv.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
                phase: Some(phase.into()),
                ..Default::default()
            });
            pv
        }

        fn put(&self, pv: &PersistentVolume) {
            self.fake.put_pv(serde_json::to_value(pv).unwrap());
        }

        async fn pass(&self, cached: &[PersistentVolume]) -> PassReport {
            let (reader, mut writer) = reflector::store::<PersistentVolume>();
            writer.apply_watcher_event(&watcher::Event::Init);
            for p in cached {
                writer.apply_watcher_event(&watcher::Event::InitApply(p.clone()));
            }
            writer.apply_watcher_event(&watcher::Event::InitDone);
            tokio::time::timeout(TIMEOUT, self.discoverer.pass(&reader))
                .await
                .expect("pass timed out")
                .unwrap()
        }

        fn log(&self) -> Vec<String> {
            self.fake.log()
        }

        fn data_survives(&self) -> bool {
            fs::read(self.vol.join("data")).is_ok_and(|d| d == b"old tenant")
        }
    }

    fn name_of(pv: &PersistentVolume) -> String {
        pv.metadata.name.clone().unwrap()
    }

    #[tokio::test]
    async fn scenario_discovery_creates_exactly_the_expected_pv() {
        let s = Scenario::new("discovery creates exactly the expected PV");
        let d = s.entry();
        let r = s.pass(&[]).await;
        let name = pv::pv_name(NODE, &d.handle);
        assert_eq!(r.created, std::slice::from_ref(&name));
        assert_eq!(
            s.log(),
            ["POST /api/v1/persistentvolumes", "EVENT Discovered"]
        );
        let mut got = s.fake.api.lock().unwrap().pv(&name).unwrap().clone();
        // What the API server adds: uid, resourceVersion, status and the
        // pv-protection finalizer; the driver sends no finalizer of its own.
        assert_eq!(
            got["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("finalizers"),
            Some(json!([crate::k8s::fake::PV_PROTECTION]))
        );
        got["metadata"].as_object_mut().unwrap().remove("uid");
        got["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        got.as_object_mut().unwrap().remove("status");
        assert_eq!(
            got,
            json!({
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {
                    "name": name,
                    "labels": {
                        "localvol.csi.dev/discovery-class": s.discoverer.statics.config().classes[0].key(),
                        "localvol.csi.dev/node": NODE,
                        "localvol.csi.dev/static": "true",
                    },
                    "annotations": {
                        "localvol.csi.dev/discovery-storage-class": "local-fs",
                        "localvol.csi.dev/node": NODE,
                        "localvol.csi.dev/path": d.path.to_str().unwrap(),
                        "pv.kubernetes.io/provisioned-by": "localvol.csi.dev/static",
                    },
                },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "capacity": {"storage": (4u64 << 20).to_string()},
                    "csi": {"driver": DRIVER, "volumeHandle": d.handle.to_string()},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{
                        "key": "topology.localvol.csi.dev/node", "operator": "In", "values": [NODE],
                    }]}]}},
                    "persistentVolumeReclaimPolicy": "Delete",
                    "storageClassName": "local-fs",
                    "volumeMode": "Filesystem",
                },
            })
        );
        // Once the cache has it: nothing more to do, no API calls.
        let r = s.pass(&[s.our_pv("Available")]).await;
        assert_eq!(r, PassReport::default());
        assert_eq!(s.log(), Vec::<String>::new());
        // A cache that lags behind: the create answers AlreadyExists, no event.
        let r = s.pass(&[]).await;
        assert_eq!(r, PassReport::default());
        assert_eq!(s.log(), ["POST /api/v1/persistentvolumes"]);
        assert!(s.data_survives());
    }

    #[tokio::test]
    async fn scenario_released_pv_is_cleaned_then_deleted_then_offered_again() {
        let s = Scenario::new("Released -> cleanup -> delete -> recreate");
        let pv = s.our_pv("Released");
        s.put(&pv);
        let name = name_of(&pv);
        let r = s.pass(std::slice::from_ref(&pv)).await;
        assert_eq!(r.cleaned, std::slice::from_ref(&name));
        assert_eq!(r.deleted, std::slice::from_ref(&name));
        assert_eq!(
            s.log(),
            [
                format!("GET /api/v1/persistentvolumes/{name}"),
                "EVENT CleanupStarted".into(),
                "EVENT CleanupFinished".into(),
                format!("DELETE /api/v1/persistentvolumes/{name}"),
            ]
        );
        assert!(!s.data_survives());
        assert_eq!(fs::read_dir(&s.vol).unwrap().count(), 0);
        assert!(
            crate::mount::MountTable::read()
                .unwrap()
                .at(&s.vol)
                .is_some(),
            "mount point kept"
        );
        assert!(s.fake.api.lock().unwrap().pvs().is_empty());
        // The next pass (the cache saw the delete) offers it again.
        let r = s.pass(&[]).await;
        assert_eq!(r.created, [name]);
        assert!(s.discoverer.statics.cleaner().pending().unwrap().is_empty());
    }

    #[tokio::test]
    async fn scenario_bound_pv_is_never_cleaned() {
        let s = Scenario::new("Bound never cleaned");
        let bound = s.our_pv("Bound");
        s.put(&bound);
        let r = s.pass(std::slice::from_ref(&bound)).await;
        assert_eq!(r, PassReport::default());
        assert_eq!(s.log(), Vec::<String>::new());
        assert!(s.data_survives());
        // A stale cache says Released, the API says Bound: still not cleaned.
        let r = s.pass(&[s.our_pv("Released")]).await;
        assert_eq!(r, PassReport::default());
        assert_eq!(
            s.log(),
            [format!("GET /api/v1/persistentvolumes/{}", name_of(&bound))]
        );
        assert!(s.data_survives());
        // A cleanup a crash interrupted is not redone while a PV is Bound.
        let m = s.discoverer.statics.cleaner().clone();
        let h = s.entry().handle;
        s.interrupted_cleanup();
        assert!(m.is_pending(&h));
        let r = s.pass(&[bound]).await;
        assert_eq!(r, PassReport::default());
        assert!(s.data_survives());
        // Without a PV (deleted by hand) it is redone, and only then offered.
        s.fake.api.lock().unwrap().clear_pvs();
        let r = s.pass(&[]).await;
        assert_eq!(r.cleaned, [h.to_string()]);
        assert_eq!(r.created.len(), 1);
        assert!(!s.data_survives());
    }

    #[tokio::test]
    async fn scenario_other_nodes_and_drivers_pvs_are_never_touched() {
        let s = Scenario::new("other nodes' and drivers' PVs never touched");
        let d = s.entry();
        let class = &s.discoverer.statics.config().classes[0];
        let released = |mut pv: PersistentVolume| {
            pv.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
                phase: Some("Released".into()),
                ..Default::default()
            });
            pv
        };
        // The same disk path and handle, but created by another node.
        let other_node = released(pv::build(DRIVER, "worker-2", class, &d));
        // Another driver's PV that happens to carry our labels and node.
        let mut other_driver = released(pv::build(DRIVER, NODE, class, &d));
        other_driver
            .spec
            .as_mut()
            .unwrap()
            .csi
            .as_mut()
            .unwrap()
            .driver = "other.csi.dev".into();
        other_driver.metadata.name = Some("other-driver".into());
        // A PV whose node annotation was edited to another node.
        let mut edited = released(pv::build(DRIVER, NODE, class, &d));
        edited
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(pv::ANN_NODE.into(), "worker-3".into());
        edited.metadata.name = Some("edited".into());
        // A dynamic localvol PV.
        let mut dynamic = released(pv::build(DRIVER, NODE, class, &d));
        dynamic
            .spec
            .as_mut()
            .unwrap()
            .csi
            .as_mut()
            .unwrap()
            .volume_handle = format!("default.{}", "a".repeat(32));
        dynamic.metadata.name = Some("dynamic".into());
        for p in [&other_node, &other_driver, &edited, &dynamic] {
            s.put(p);
        }
        let before = s.fake.api.lock().unwrap().pvs();
        let r = s.pass(&[other_node, other_driver, edited, dynamic]).await;
        // Only our own entry gets its PV; nothing else is read, cleaned or deleted.
        assert_eq!(r.created, [pv::pv_name(NODE, &d.handle)]);
        assert_eq!(r.cleaned, Vec::<String>::new());
        assert_eq!(r.deleted, Vec::<String>::new());
        assert_eq!(
            s.log(),
            ["POST /api/v1/persistentvolumes", "EVENT Discovered"]
        );
        let after = s.fake.api.lock().unwrap().pvs();
        for (k, v) in before {
            assert_eq!(after.get(&k), Some(&v), "{k} changed");
        }
        assert!(s.data_survives());
    }

    #[tokio::test]
    async fn scenario_volume_busy_on_the_node_is_not_cleaned() {
        let mut s = Scenario::new("a node RPC holds the volume: cleanup waits");
        let tmp = tempfile::tempdir().unwrap();
        let driver = crate::driver::Driver::open(
            &crate::driver::Identity {
                driver_name: DRIVER.into(),
                node_id: NODE.into(),
                kubelet_dir: tmp.path().join("kubelet"),
            },
            &crate::config::Config::embedded(tmp.path()),
        )
        .await
        .unwrap();
        s.discoverer.locks = Some(driver.locks.clone());
        let pv = s.our_pv("Released");
        s.put(&pv);
        let guard = driver
            .locks
            .try_lock(&s.entry().handle.entry_key, "NodeStageVolume")
            .unwrap();
        let r = s.pass(std::slice::from_ref(&pv)).await;
        assert_eq!(r, PassReport::default());
        assert_eq!(
            s.log(),
            [format!("GET /api/v1/persistentvolumes/{}", name_of(&pv))]
        );
        assert!(s.data_survives());
        drop(guard);
        let r = s.pass(std::slice::from_ref(&pv)).await;
        assert_eq!(r.deleted, [name_of(&pv)]);
        assert!(!s.data_survives());
    }

    #[tokio::test]
    async fn scenario_run_watches_our_pvs_and_discovers_at_start() {
        let s = Scenario::new("run: cache with our label selector, pass at start");
        let d = s.entry();
        let Scenario { discoverer, .. } = &s;
        let discoverer = Arc::new(Discoverer {
            api: discoverer.api.clone(),
            recorder: Recorder::new(
                discoverer.api.clone().into_client(),
                Reporter {
                    controller: "localvol".into(),
                    instance: None,
                },
            ),
            driver: DRIVER.into(),
            node: NODE.into(),
            statics: discoverer.statics.clone(),
            warned: Mutex::default(),
            locks: None,
        });
        let task = AbortOnDrop(tokio::spawn(discoverer.run(Duration::from_secs(3600))));
        let name = pv::pv_name(NODE, &d.handle);
        let start = std::time::Instant::now();
        while s.fake.api.lock().unwrap().pv(&name).is_none() {
            assert!(start.elapsed() < TIMEOUT, "no PV created: {:?}", s.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(task);
        let log = s.log();
        assert_eq!(
            log[0],
            "LIST /api/v1/persistentvolumes ?localvol.csi.dev/static=true,localvol.csi.dev/node=worker-1"
        );
        assert!(
            log.contains(&"POST /api/v1/persistentvolumes".to_owned()),
            "{log:?}"
        );
        assert!(s.data_survives());
    }

    #[tokio::test]
    async fn scenario_pending_cleanup_blocks_discovery_until_it_succeeds() {
        let s = Scenario::new("an interrupted cleanup that cannot be redone: no PV");
        let h = s.entry().handle;
        s.interrupted_cleanup();
        // In use (mounted elsewhere): the redo is refused, and no PV offers
        // the half-wiped volume.
        let other = s._tmp.path().join("elsewhere");
        fs::create_dir(&other).unwrap();
        let busy = TestMount::bind(&s.vol, &other);
        let r = s.pass(&[]).await;
        assert_eq!(r.failed, [h.to_string()]);
        assert!(r.created.is_empty());
        assert_eq!(s.log(), Vec::<String>::new());
        assert!(s.data_survives());
        drop(busy);
        let r = s.pass(&[]).await;
        assert_eq!(r.cleaned, [h.to_string()]);
        assert_eq!(r.created.len(), 1);
    }

    #[tokio::test]
    async fn scenario_failed_cleanup_keeps_the_pv_and_records_it() {
        let s = Scenario::new("cleanup fails: PV kept, Warning event");
        let pv = s.our_pv("Released");
        s.put(&pv);
        // Published to a pod somewhere: cleanup is refused.
        let pod = s._tmp.path().join("pod");
        fs::create_dir(&pod).unwrap();
        let published = TestMount::bind(&s.vol, &pod);
        let r = s.pass(std::slice::from_ref(&pv)).await;
        assert_eq!(r.failed, [name_of(&pv)]);
        assert_eq!(
            s.log(),
            [
                format!("GET /api/v1/persistentvolumes/{}", name_of(&pv)),
                "EVENT CleanupStarted".into(),
                "EVENT CleanupFailed".into(),
            ]
        );
        assert!(s.data_survives());
        assert!(s.fake.api.lock().unwrap().pv(&name_of(&pv)).is_some());
        drop(published);
        let r = s.pass(std::slice::from_ref(&pv)).await;
        assert_eq!(r.deleted, [name_of(&pv)]);
    }
}
