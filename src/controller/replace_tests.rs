//! Node replaced vs node lost, end to end against the
//! fake API server: the node-loss controller deletes a lost node's PVs and
//! writes its lost record; the node's driver (a dir pool in a temp dir)
//! then comes back, with the same storage or other storage, and its orphan
//! pass decides what to keep and what to reclaim.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde_json::{json, Value};

use super::NodeLoss;
use crate::driver::Driver;
use crate::ids::{PoolName, STORAGE_ID_KEY, TOPOLOGY_KEY};
use crate::k8s::fake::{Fake, Role};
use crate::orphans::{OrphanMode, Orphans, OrphansConfig};

const DRIVER: &str = "localvol.csi.dev";
const NS: &str = "kube-system";
const NODE: &str = "n1";
const GRACE: Duration = Duration::from_secs(300);
const TIMEOUT: Duration = Duration::from_secs(20);
const RECORD: &str = "/api/v1/namespaces/kube-system/configmaps/localvol-lost.n1";

/// The node's driver on the dir pool under `dir` (opened again = the node
/// plugin restarted on the same storage).
async fn node_driver(dir: &Path) -> Arc<Driver> {
    Driver::open_embedded(dir, NODE).await
}

fn pool() -> PoolName {
    PoolName::parse("default").unwrap()
}

async fn create(d: &Driver, name: &str) -> String {
    d.create_embedded(name).await
}

fn storage_of(d: &Driver) -> String {
    d.pools
        .get(&pool())
        .unwrap()
        .storage_id()
        .unwrap()
        .to_string()
}

async fn volumes(d: &Driver) -> Vec<String> {
    let mut v: Vec<String> = d
        .pools
        .get(&pool())
        .unwrap()
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.id.to_string())
        .collect();
    v.sort();
    v
}

/// A PV as external-provisioner writes it from CreateVolume's answer:
/// pinned to NODE, the volume context (the storage identity) as its
/// attributes.
fn pv(name: &str, handle: &str, storage: Option<&str>) -> Value {
    let mut csi = json!({"driver": DRIVER, "volumeHandle": handle});
    if let Some(s) = storage {
        csi["volumeAttributes"] = json!({STORAGE_ID_KEY: s});
    }
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": {
            "csi": csi,
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": TOPOLOGY_KEY, "operator": "In", "values": [NODE]}
            ]}]}},
        },
        "status": {"phase": "Bound"},
    })
}

fn store<K>(objects: Vec<K>) -> Store<K>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, mut writer) = reflector::store::<K>();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    reader
}

/// The PVs the fake holds now, as a node's PV cache would see them.
fn pv_cache(s: &Fake) -> Store<PersistentVolume> {
    let pvs = s.api.lock().unwrap().pvs();
    store(
        pvs.into_values()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect(),
    )
}

/// NODE is deleted and stays gone past the grace period: the controller's
/// two passes (the first only notes it missing).
async fn lose_node(s: &Fake) -> super::PassReport {
    let nl = NodeLoss::new(s.client.clone(), DRIVER, "ctrl-0", NS, GRACE);
    let nodes = store::<Node>(vec![]);
    let pvs = pv_cache(s);
    let t0 = Instant::now();
    for t in [t0, t0 + GRACE] {
        let r = tokio::time::timeout(TIMEOUT, nl.pass(t, &nodes, &pvs))
            .await
            .expect("pass timed out")
            .unwrap();
        if t > t0 {
            return r;
        }
    }
    unreachable!()
}

/// One orphan pass of the node's driver (grace 0: every orphan counts now).
async fn orphan_pass(s: &Fake, d: &Arc<Driver>, mode: OrphanMode) -> crate::orphans::OrphanReport {
    let o = Orphans::new(
        d.clone(),
        OrphansConfig {
            mode,
            grace_seconds: 0,
        },
    )
    .with_cluster(s.client_as(Role::Discovery), NS);
    tokio::time::timeout(TIMEOUT, o.pass(Instant::now(), &pv_cache(s)))
        .await
        .expect("orphan pass timed out")
        .unwrap()
}

fn events(log: &[String], reason: &str) -> usize {
    log.iter()
        .filter(|l| *l == &format!("EVENT {reason}"))
        .count()
}

/// A node with two volumes (PVs a and b) is lost; returns the driver and
/// the two handles.
async fn lost_node_with_two_volumes(s: &Fake, dir: &Path) -> (Arc<Driver>, String, String) {
    let d = node_driver(dir).await;
    let (a, b) = (create(&d, "pvc-a").await, create(&d, "pvc-b").await);
    let storage = storage_of(&d);
    s.put_pv(pv("pv-a", &a, Some(&storage)));
    s.put_pv(pv("pv-b", &b, Some(&storage)));
    let r = lose_node(s).await;
    assert_eq!(r.deleted_pvs, ["pv-a", "pv-b"]);
    assert_eq!(r.recorded_nodes, [NODE]);
    assert!(s.api.lock().unwrap().pvs().is_empty());
    // The record lists both, with the storage they were on.
    let rec = s.api.lock().unwrap().objects[RECORD].clone();
    let mut want = [format!("{a} {storage}"), format!("{b} {storage}")];
    want.sort();
    assert_eq!(
        rec["data"]["volumes"],
        json!(format!("{}\n", want.join("\n")))
    );
    assert_eq!(rec["data"]["storage"], json!(format!("{storage}\n")));
    assert_eq!(rec["data"]["node"], json!(NODE));
    s.log();
    (d, a, b)
}

#[tokio::test]
async fn scenario_node_back_with_same_storage_keeps_its_volumes_even_in_reclaim_mode() {
    let s = Fake::start(Role::Controller);
    let tmp = tempfile::tempdir().unwrap();
    let (before, a, b) = lost_node_with_two_volumes(&s, tmp.path()).await;
    let storage = storage_of(&before);
    drop(before);
    // The node is reinstalled with its disks: the driver starts again on the
    // same pool, which has the same identity.
    let d = node_driver(tmp.path()).await;
    assert_eq!(
        storage_of(&d),
        storage,
        "the pool id file survives a restart"
    );
    // An ordinary orphan too (its PV never came): reclaim still applies to it.
    let c = create(&d, "pvc-c").await;

    let r = orphan_pass(&s, &d, OrphanMode::Reclaim).await;
    let mut all = vec![a.clone(), b.clone(), c.clone()];
    all.sort();
    assert_eq!(r.orphans, all);
    let mut kept = vec![a.clone(), b.clone()];
    kept.sort();
    assert_eq!(r.kept, kept);
    assert_eq!(r.reclaimed, std::slice::from_ref(&c));
    assert_eq!(
        volumes(&d).await,
        kept,
        "the lost node's volumes are intact"
    );
    let log = s.log();
    assert_eq!(events(&log, "OrphanKeptAfterNodeLoss"), 2, "{log:?}");
    assert!(log.contains(&format!("GET {RECORD}")), "{log:?}");
    assert!(
        !log.iter()
            .any(|l| l.starts_with("PUT") || l.starts_with("POST")),
        "the node never writes the record: {log:?}"
    );

    // Report mode: the same verdict, nothing deleted.
    let r = orphan_pass(&s, &d, OrphanMode::Report).await;
    assert_eq!(r.kept, kept);
    assert!(r.reclaimed.is_empty());
    assert_eq!(volumes(&d).await, kept);
}

#[tokio::test]
async fn scenario_node_back_with_other_storage_reclaims_as_before() {
    let s = Fake::start(Role::Controller);
    let old = tempfile::tempdir().unwrap();
    let (before, a, _b) = lost_node_with_two_volumes(&s, old.path()).await;
    let old_storage = storage_of(&before);
    drop(before);
    // The node comes back with a new disk: a new pool, a new identity. A
    // volume there that happens to have a recorded handle (same PVC name)
    // is not the one the record lists.
    let new = tempfile::tempdir().unwrap();
    let d = node_driver(new.path()).await;
    assert_ne!(storage_of(&d), old_storage);
    let a2 = create(&d, "pvc-a").await;
    assert_eq!(a2, a, "same name, same handle");
    let r = orphan_pass(&s, &d, OrphanMode::Reclaim).await;
    assert_eq!(r.orphans, std::slice::from_ref(&a));
    assert!(r.kept.is_empty());
    assert_eq!(r.reclaimed, [a]);
    assert!(volumes(&d).await.is_empty());
    assert_eq!(events(&s.log(), "OrphanKeptAfterNodeLoss"), 0);
}

#[tokio::test]
async fn scenario_pvs_still_present_or_readopted_are_not_orphans() {
    let s = Fake::start(Role::Controller);
    let tmp = tempfile::tempdir().unwrap();
    let d = node_driver(tmp.path()).await;
    let a = create(&d, "pvc-a").await;
    let storage = storage_of(&d);
    s.put_pv(pv("pv-a", &a, Some(&storage)));
    // The node came back before the grace period ended: the controller did
    // nothing, no record; the PV keeps working, the volume is no orphan.
    let nl = NodeLoss::new(s.client.clone(), DRIVER, "ctrl-0", NS, GRACE);
    let t0 = Instant::now();
    let pvs = pv_cache(&s);
    let r = nl.pass(t0, &store::<Node>(vec![]), &pvs).await.unwrap();
    assert_eq!(r, super::PassReport::default());
    let back = store(vec![serde_json::from_value::<Node>(
        json!({"metadata": {"name": NODE}}),
    )
    .unwrap()]);
    let r = nl.pass(t0 + GRACE, &back, &pvs).await.unwrap();
    assert_eq!(r, super::PassReport::default());
    assert!(!s.has(RECORD));
    let r = orphan_pass(&s, &d, OrphanMode::Reclaim).await;
    assert_eq!(r, crate::orphans::OrphanReport::default());

    // Now lost for real, then re-adopted: the operator writes a static PV
    // with the same handle and storage identity. That volume is referenced
    // again; the other recorded one stays kept.
    let b = create(&d, "pvc-b").await;
    s.put_pv(pv("pv-b", &b, Some(&storage)));
    let r = lose_node(&s).await;
    assert_eq!(r.deleted_pvs, ["pv-a", "pv-b"]);
    s.put_pv(pv("readopted-a", &a, Some(&storage)));
    let r = orphan_pass(&s, &d, OrphanMode::Reclaim).await;
    assert_eq!(r.orphans, std::slice::from_ref(&b));
    assert_eq!(r.kept, std::slice::from_ref(&b));
    assert!(r.reclaimed.is_empty());
    let mut both = vec![a, b];
    both.sort();
    assert_eq!(volumes(&d).await, both);
}

#[tokio::test]
async fn scenario_unreadable_record_reclaims_nothing_and_unwritable_record_deletes_nothing() {
    let s = Fake::start(Role::Controller);
    let tmp = tempfile::tempdir().unwrap();
    let d = node_driver(tmp.path()).await;
    let a = create(&d, "pvc-a").await;
    s.put_pv(pv("pv-a", &a, Some(&storage_of(&d))));
    // A record the client cannot decode (its data is not a string map).
    s.put(
        RECORD,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "localvol-lost.n1", "namespace": NS}, "data": 5}),
    );
    // The controller cannot extend it: the lost node's PV stays.
    let r = lose_node(&s).await;
    assert!(r.deleted_pvs.is_empty(), "{r:?}");
    assert!(s.has("/api/v1/persistentvolumes/pv-a"));
    assert!(!s.log().iter().any(|l| l.starts_with("DELETE")));
    // Without a PV it is an orphan, but while the record cannot be read
    // nothing is reclaimed.
    s.api.lock().unwrap().clear_pvs();
    let r = orphan_pass(&s, &d, OrphanMode::Reclaim).await;
    assert_eq!(r.orphans, std::slice::from_ref(&a));
    assert!(r.reclaimed.is_empty());
    assert_eq!(volumes(&d).await, [a]);
}

#[tokio::test]
async fn scenario_pvs_without_a_storage_identity_are_kept_on_any_storage() {
    // PVs provisioned before volumes carried their storage identity: the
    // record cannot tell, so such volumes are kept (the safe side).
    let s = Fake::start(Role::Controller);
    let tmp = tempfile::tempdir().unwrap();
    let d = node_driver(tmp.path()).await;
    let a = create(&d, "pvc-a").await;
    s.put_pv(pv("pv-a", &a, None));
    let r = lose_node(&s).await;
    assert_eq!(r.deleted_pvs, ["pv-a"]);
    assert_eq!(
        s.api.lock().unwrap().objects[RECORD]["data"]["volumes"],
        json!(format!("{a} -\n"))
    );
    let r = orphan_pass(&s, &d, OrphanMode::Reclaim).await;
    assert_eq!(r.kept, std::slice::from_ref(&a));
    assert_eq!(volumes(&d).await, [a]);
}

#[tokio::test]
async fn scenario_node_publishes_its_storage_on_its_csinode() {
    let s = Fake::start(Role::Controller);
    let tmp = tempfile::tempdir().unwrap();
    let d = node_driver(tmp.path()).await;
    const CSINODE: &str = "/apis/storage.k8s.io/v1/csinodes/n1";
    let storage = s.client_as(Role::Storage);
    let ids = std::collections::BTreeMap::from([(
        "default".to_owned(),
        d.pools.get(&pool()).unwrap().storage_id().unwrap().clone(),
    )]);
    // kubelet has not created it yet: NotFound, retried by the caller.
    let e = crate::k8s::lost::annotate_csinode(&storage, DRIVER, NODE, &ids).await;
    assert!(
        matches!(e, Err(kube::Error::Api(ref st)) if st.code == 404),
        "{e:?}"
    );
    s.put(
        CSINODE,
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
               "metadata": {"name": NODE, "annotations": {"other": "kept"}},
               "spec": {"drivers": []}}),
    );
    crate::k8s::lost::annotate_csinode(&storage, DRIVER, NODE, &ids)
        .await
        .unwrap();
    let anns = s.api.lock().unwrap().objects[CSINODE]["metadata"]["annotations"].clone();
    assert_eq!(anns["other"], json!("kept"));
    let published: Value =
        serde_json::from_str(anns["localvol.csi.dev/storage"].as_str().unwrap()).unwrap();
    assert_eq!(published, json!({"default": storage_of(&d)}));
}
