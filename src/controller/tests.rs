//! Node-loss controller and leader election against a fake API server
//! (`tower_test::mock::pair` → `kube::Client::new`), by named scenario with
//! timeouts.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde_json::{json, Value};

use super::lease::Elector;
use super::nodeloss::{ANN_DELETE_ON_NODE_LOSS, PROVISIONER_FINALIZER};
use super::{NodeLoss, PassReport};
use crate::ids::TOPOLOGY_KEY;
use crate::k8s::fake::{Fake, Role, PVS, PV_PROTECTION};

const DRIVER: &str = "localvol.csi.dev";
/// The controller's namespace (lost records live there).
const NS: &str = "kube-system";

/// Awaits a lease call with the scenario timeout.
async fn t(f: impl std::future::Future<Output = Result<bool, kube::Error>>) -> bool {
    tokio::time::timeout(TIMEOUT, f)
        .await
        .expect("lease call timed out")
        .unwrap()
}
const TIMEOUT: Duration = Duration::from_secs(20);
const GRACE: Duration = Duration::from_secs(300);

/// A scenario's fake API server (see `crate::k8s::fake`).
struct Scenario(Fake);

impl Scenario {
    fn new(name: &str) -> Self {
        eprintln!("scenario: {name}");
        Scenario(Fake::start(Role::Controller))
    }
}

impl std::ops::Deref for Scenario {
    type Target = Fake;
    fn deref(&self) -> &Fake {
        &self.0
    }
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

fn pv(name: &str, driver: &str, node: &str, claim: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": {
            "csi": {"driver": driver, "volumeHandle": format!("default.{}", "0".repeat(32))},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": TOPOLOGY_KEY, "operator": "In", "values": [node]}
            ]}]}},
            "claimRef": {"namespace": "app", "name": claim, "uid": format!("uid-{claim}")},
            "storageClassName": "local",
        },
        "status": {"phase": "Bound"},
    })
}

/// `pv` as external-provisioner v5 leaves a Delete-policy PV it provisioned.
fn pv_with_finalizer(name: &str, driver: &str, node: &str, claim: &str) -> Value {
    let mut v = pv(name, driver, node, claim);
    v["metadata"]["finalizers"] = json!([PROVISIONER_FINALIZER]);
    v["spec"]["persistentVolumeReclaimPolicy"] = json!("Delete");
    v
}

fn pvc(name: &str, volume: &str, sc: &str, opted_in: bool) -> Value {
    let mut anns = json!({});
    if opted_in {
        anns[ANN_DELETE_ON_NODE_LOSS] = json!("true");
    }
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "app", "uid": format!("uid-{name}"), "annotations": anns},
        "spec": {"volumeName": volume, "storageClassName": sc},
    })
}

fn node(name: &str, ready: bool) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    }))
    .unwrap()
}

fn pvs_of(v: &[Value]) -> Vec<PersistentVolume> {
    v.iter()
        .map(|p| serde_json::from_value(p.clone()).unwrap())
        .collect()
}

const PVCS: &str = "/api/v1/namespaces/app/persistentvolumeclaims";
/// ConfigMaps of the controller's namespace (the lost records).
const CMS: &str = "/api/v1/namespaces/kube-system/configmaps";

/// The cluster of the deleted-node scenario: pv-a and pv-b on the deleted
/// node "gone" (claim-a opted in, claim-b not), pv-c on the NotReady node
/// (claim-c opted in), pv-d of another driver on "gone"; the StorageClass
/// "local" (not opted in) and a CSIStorageCapacity per node. Returns the PVs.
fn put_deleted_node_cluster(s: &Scenario) -> Vec<Value> {
    let all = vec![
        pv("pv-a", DRIVER, "gone", "claim-a"),
        pv("pv-b", DRIVER, "gone", "claim-b"),
        pv("pv-c", DRIVER, "notready", "claim-c"),
        pv("pv-d", "other.csi.dev", "gone", "claim-d"),
    ];
    for p in &all {
        s.put_pv(p.clone());
    }
    for (claim, volume, opted_in) in [
        ("claim-a", "pv-a", true),
        ("claim-b", "pv-b", false),
        ("claim-c", "pv-c", true),
    ] {
        s.put(
            &format!("{PVCS}/{claim}"),
            pvc(claim, volume, "local", opted_in),
        );
    }
    s.put(
        "/apis/storage.k8s.io/v1/storageclasses/local",
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
               "metadata": {"name": "local"}, "provisioner": DRIVER}),
    );
    // Not in the controller's namespace: it deletes them wherever it finds
    // them (its ClusterRole, not its Role).
    for n in ["gone", "notready"] {
        s.put(
            &format!(
                "/apis/storage.k8s.io/v1/namespaces/provisioners/csistoragecapacities/cap-{n}"
            ),
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
                   "metadata": {"name": format!("cap-{n}"), "namespace": "provisioners"},
                   "storageClassName": "local",
                   "nodeTopology": {"matchLabels": {TOPOLOGY_KEY: n}}}),
        );
    }
    all
}

#[tokio::test]
async fn scenario_deleted_node_pvs_go_after_grace_and_claims_only_when_opted_in() {
    let s = Scenario::new("node deleted: PVs after the grace period, PVCs only when opted in");
    let all = put_deleted_node_cluster(&s);
    let nl = NodeLoss::new(s.client.clone(), DRIVER, "ctrl-0", NS, GRACE);
    let nodes = store(vec![node("notready", false)]);
    let pvs = store(pvs_of(&all));
    let t0 = Instant::now();
    let pass = |t: Instant| {
        let (nl, nodes, pvs) = (&nl, &nodes, &pvs);
        async move {
            tokio::time::timeout(TIMEOUT, nl.pass(t, nodes, pvs))
                .await
                .expect("pass timed out")
                .unwrap()
        }
    };

    // Within the grace period: nothing happens, not even a read.
    assert_eq!(pass(t0).await, PassReport::default());
    assert_eq!(pass(t0 + GRACE / 2).await, PassReport::default());
    assert_eq!(s.log(), Vec::<String>::new());

    let r = pass(t0 + GRACE).await;
    assert_eq!(r.deleted_pvs, ["pv-a", "pv-b"]);
    assert_eq!(r.deleted_pvcs, ["app/claim-a"]);
    assert_eq!(r.deleted_capacities, ["provisioners/cap-gone"]);
    assert_eq!(r.recorded_nodes, ["gone"]);
    assert_eq!(
        s.log(),
        [
            // The lost record first: nothing is deleted without it.
            format!("GET {CMS}/localvol-lost.gone"),
            format!("POST {CMS}"),
            format!("GET {PVCS}/claim-a"),
            format!("DELETE {PVCS}/claim-a"),
            "EVENT NodeLostClaimDeleted".into(),
            "EVENT NodeLost".into(),
            format!("DELETE {PVS}/pv-a"),
            format!("GET {PVCS}/claim-b"),
            "GET /apis/storage.k8s.io/v1/storageclasses/local".into(),
            "EVENT NodeLost".into(),
            format!("DELETE {PVS}/pv-b"),
            "LIST /apis/storage.k8s.io/v1/csistoragecapacities".into(),
            "DELETE /apis/storage.k8s.io/v1/namespaces/provisioners/csistoragecapacities/cap-gone"
                .into(),
        ]
    );
    assert_only_the_deleted_nodes_pvs_and_opted_in_claim_went(&s);
}

/// After the deleted-node scenario's pass: the NotReady node's PV and claim,
/// the other driver's PV, the claim that did not opt in, and the NotReady
/// node's capacity all remain; the deleted node's PVs and the claim that
/// opted in are gone.
#[track_caller]
fn assert_only_the_deleted_nodes_pvs_and_opted_in_claim_went(s: &Scenario) {
    for p in [
        format!("{PVS}/pv-c"),
        format!("{PVS}/pv-d"),
        format!("{PVCS}/claim-b"),
        format!("{PVCS}/claim-c"),
        "/apis/storage.k8s.io/v1/namespaces/provisioners/csistoragecapacities/cap-notready".into(),
    ] {
        assert!(s.has(&p), "{p} was deleted");
    }
    for p in [
        format!("{PVS}/pv-a"),
        format!("{PVS}/pv-b"),
        format!("{PVCS}/claim-a"),
    ] {
        assert!(!s.has(&p), "{p} is still there");
    }
}

#[tokio::test]
async fn scenario_storage_class_opt_in_and_returning_nodes() {
    let s = Scenario::new("StorageClass opt-in; a node that comes back is left alone");
    let all = vec![pv("pv-a", DRIVER, "n1", "claim-a")];
    s.put(&format!("{PVS}/pv-a"), all[0].clone());
    s.put(
        &format!("{PVCS}/claim-a"),
        pvc("claim-a", "pv-a", "opted", false),
    );
    s.put(
        "/apis/storage.k8s.io/v1/storageclasses/opted",
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": DRIVER,
               "metadata": {"name": "opted", "annotations": {ANN_DELETE_ON_NODE_LOSS: "true"}}}),
    );
    let nl = NodeLoss::new(s.client.clone(), DRIVER, "ctrl-0", NS, GRACE);
    let pvs = store(pvs_of(&all));
    let t0 = Instant::now();
    // Missing, then back before the grace period ran out, then missing again.
    let none = store::<Node>(vec![]);
    let back = store(vec![node("n1", true)]);
    for (t, nodes) in [(t0, &none), (t0 + GRACE / 2, &back), (t0 + GRACE, &none)] {
        let r = tokio::time::timeout(TIMEOUT, nl.pass(t, nodes, &pvs))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r, PassReport::default());
    }
    assert_eq!(s.log(), Vec::<String>::new());
    let r = tokio::time::timeout(TIMEOUT, nl.pass(t0 + GRACE * 2, &none, &pvs))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.deleted_pvs, ["pv-a"]);
    assert_eq!(r.deleted_pvcs, ["app/claim-a"]);
    assert!(!s.has(&format!("{PVCS}/claim-a")));
}

/// Stores `pvs` in the fake and runs one pass at the end of the grace period
/// with only `nodes` existing (`none` when all their nodes are gone).
async fn pass_after_grace(s: &Scenario, nodes: Vec<Node>, pvs: &[Value]) -> PassReport {
    for p in pvs {
        s.put_pv(p.clone());
    }
    let nl = NodeLoss::new(s.client.clone(), DRIVER, "ctrl-0", NS, GRACE);
    let (nodes, pvs) = (store(nodes), store(pvs_of(pvs)));
    let t0 = Instant::now();
    for t in [t0, t0 + GRACE] {
        let r = tokio::time::timeout(TIMEOUT, nl.pass(t, &nodes, &pvs))
            .await
            .expect("pass timed out")
            .unwrap();
        if t == t0 {
            assert_eq!(r, PassReport::default());
        } else {
            return r;
        }
    }
    unreachable!()
}

/// The PV's finalizers in the fake, and whether it is marked for deletion.
fn finalizers_of(s: &Scenario, name: &str) -> (Value, bool) {
    let api = s.api.lock().unwrap();
    let pv = api.pv(name).unwrap_or_else(|| panic!("{name} is gone"));
    (
        pv["metadata"]["finalizers"].clone(),
        !pv["metadata"]["deletionTimestamp"].is_null(),
    )
}

#[tokio::test]
async fn scenario_lost_node_pv_with_provisioner_finalizer_is_deleted() {
    let s = Scenario::new("a lost node's PV with the provisioner finalizer really goes");
    let lost = pv_with_finalizer("pv-a", DRIVER, "gone", "claim-a");
    let r = pass_after_grace(&s, vec![], std::slice::from_ref(&lost)).await;
    // The DELETE alone leaves it Terminating; taking the finalizer off ends it.
    assert!(
        !s.has(&format!("{PVS}/pv-a")),
        "pv-a is still there: {:?}",
        finalizers_of(&s, "pv-a")
    );
    assert_eq!(r.deleted_pvs, ["pv-a"]);
    assert_eq!(r.released_finalizers, ["pv-a"]);
    assert_eq!(
        s.log(),
        [
            format!("GET {CMS}/localvol-lost.gone"),
            format!("POST {CMS}"),
            format!("GET {PVCS}/claim-a"),
            "EVENT NodeLost".into(),
            format!("DELETE {PVS}/pv-a"),
            format!("PATCH {PVS}/pv-a"),
            "LIST /apis/storage.k8s.io/v1/csistoragecapacities".into(),
        ]
    );

    // A later pass still sees it in its (stale) cache: a 404, no error.
    let nl = NodeLoss::new(s.client.clone(), DRIVER, "ctrl-0", NS, Duration::ZERO);
    let r = tokio::time::timeout(
        TIMEOUT,
        nl.pass(Instant::now(), &store(vec![]), &store(pvs_of(&[lost]))),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(r.released_finalizers, Vec::<String>::new());
    assert!(!s.log().iter().any(|l| l.starts_with("PATCH")));
}

#[tokio::test]
async fn scenario_a_pv_held_by_pv_protection_is_deleted_once() {
    let s = Scenario::new(
        "a lost node's PV whose claim is still bound stays Terminating; later passes leave it",
    );
    // As the API server keeps it: pv-protection (added at creation) holds
    // a Bound PV; its claim exists and has not opted in.
    let mut lost = pv_with_finalizer("pv-b", DRIVER, "gone", "claim-b");
    lost["metadata"]["finalizers"] = json!([PROVISIONER_FINALIZER, PV_PROTECTION]);
    s.put(
        &format!("{PVCS}/claim-b"),
        pvc("claim-b", "pv-b", "local", false),
    );
    let r = pass_after_grace(&s, vec![], std::slice::from_ref(&lost)).await;
    assert_eq!(r.deleted_pvs, ["pv-b"]);
    assert_eq!(r.released_finalizers, ["pv-b"]);
    let (finalizers, terminating) = finalizers_of(&s, "pv-b");
    assert!(terminating, "{finalizers}");
    assert_eq!(finalizers, json!([PV_PROTECTION]));

    // The next passes see it Terminating: no second DELETE, no second Event.
    let held = s.api.lock().unwrap().pv("pv-b").unwrap().clone();
    s.log(); // what the first pass did (the fake's log drains when read)
    let nl = NodeLoss::new(s.client.clone(), DRIVER, "ctrl-0", NS, Duration::ZERO);
    for _ in 0..2 {
        let r = tokio::time::timeout(
            TIMEOUT,
            nl.pass(
                Instant::now(),
                &store(vec![]),
                &store(pvs_of(std::slice::from_ref(&held))),
            ),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(r.deleted_pvs, Vec::<String>::new());
        assert_eq!(r.released_finalizers, Vec::<String>::new());
    }
    let later = &s.log();
    assert!(
        !later
            .iter()
            .any(|l| l.starts_with("DELETE") || l == "EVENT NodeLost"),
        "{later:?}"
    );
    // Only the first of those passes asked the API anything about it; the
    // second was within its back-off.
    let claim_gets = |log: &[String]| log.iter().filter(|l| l.contains("claim-b")).count();
    assert_eq!(claim_gets(later), 1, "{later:?}");
    assert!(finalizers_of(&s, "pv-b").1, "still held by pv-protection");
}

#[tokio::test]
async fn a_pv_held_by_pv_protection_is_looked_at_with_back_off() {
    use super::nodeloss::{HeldCheck, HeldPvs, HELD_FIRST, HELD_MAX};
    let mut pv = pv_with_finalizer("pv-h", DRIVER, "gone", "claim-h");
    pv["metadata"]["finalizers"] = json!([PV_PROTECTION]);
    pv["metadata"]["deletionTimestamp"] = json!("2026-11-26T00:00:00Z");
    let held: PersistentVolume = serde_json::from_value(pv.clone()).unwrap();
    let mut h = HeldPvs::default();
    let t0 = Instant::now();
    assert_eq!(h.check(&held, t0), HeldCheck::FirstSeen);
    assert_eq!(h.check(&held, t0 + HELD_FIRST / 2), HeldCheck::Wait);
    assert_eq!(h.check(&held, t0 + HELD_FIRST), HeldCheck::Act);
    // The wait doubles, up to its cap.
    assert_eq!(h.check(&held, t0 + HELD_FIRST * 2), HeldCheck::Wait);
    assert_eq!(h.check(&held, t0 + HELD_FIRST * 3), HeldCheck::Act);
    let mut t = t0 + HELD_FIRST * 3;
    for _ in 0..10 {
        t += HELD_MAX;
        assert_eq!(h.check(&held, t), HeldCheck::Act);
    }
    // Still carrying the provisioner's finalizer, or not deleted yet: acted on.
    pv["metadata"]["finalizers"] = json!([PROVISIONER_FINALIZER, PV_PROTECTION]);
    let ours: PersistentVolume = serde_json::from_value(pv).unwrap();
    assert_eq!(h.check(&ours, t), HeldCheck::Act);
    assert_eq!(
        h.check(&held, t),
        HeldCheck::FirstSeen,
        "forgotten once it was not held"
    );
}

#[tokio::test]
async fn scenario_finalizer_moved_before_the_patch_is_retried_next_pass() {
    let s = Scenario::new("the finalizer list changed under the patch: 422, then the next pass");
    // Someone adds a finalizer in front of ours between our DELETE and PATCH.
    s.api.lock().unwrap().before_next_patch = Some(Box::new(|pv: &mut Value| {
        pv["metadata"]["finalizers"] = json!(["example.com/hold", PROVISIONER_FINALIZER]);
    }));
    let lost = pv_with_finalizer("pv-a", DRIVER, "gone", "claim-a");
    let r = pass_after_grace(&s, vec![], std::slice::from_ref(&lost)).await;
    // The test op failed: nothing removed, no error, the PV as the writer left it.
    assert_eq!(r.deleted_pvs, ["pv-a"]);
    assert_eq!(r.released_finalizers, Vec::<String>::new());
    assert_eq!(
        finalizers_of(&s, "pv-a"),
        (json!(["example.com/hold", PROVISIONER_FINALIZER]), true)
    );
    // The next pass (its cache still has the PV as first read) deletes again
    // and patches what that DELETE returned: only our finalizer goes.
    let nl = NodeLoss::new(s.client.clone(), DRIVER, "ctrl-0", NS, Duration::ZERO);
    let r = tokio::time::timeout(
        TIMEOUT,
        nl.pass(Instant::now(), &store(vec![]), &store(pvs_of(&[lost]))),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(r.released_finalizers, ["pv-a"]);
    assert_eq!(
        finalizers_of(&s, "pv-a"),
        (json!(["example.com/hold"]), true)
    );
}

#[tokio::test]
async fn scenario_live_node_pv_keeps_provisioner_finalizer() {
    let s = Scenario::new("a PV of a node that exists (NotReady) keeps its finalizer");
    let r = pass_after_grace(
        &s,
        vec![node("notready", false)],
        &[
            pv_with_finalizer("pv-lost", DRIVER, "gone", "claim-a"),
            pv_with_finalizer("pv-live", DRIVER, "notready", "claim-b"),
        ],
    )
    .await;
    // The lost node's PV went (the pass did act) ...
    assert_eq!(r.released_finalizers, ["pv-lost"]);
    assert!(!s.has(&format!("{PVS}/pv-lost")));
    // ... and the live node's PV was not touched.
    assert_eq!(
        finalizers_of(&s, "pv-live"),
        (json!([PROVISIONER_FINALIZER]), false)
    );
    assert!(!s.log().iter().any(|l| l.ends_with("/pv-live")));
}

#[tokio::test]
async fn scenario_other_drivers_pv_on_lost_node_keeps_provisioner_finalizer() {
    let s = Scenario::new("another driver's PV on the lost node keeps its finalizer");
    let r = pass_after_grace(
        &s,
        vec![],
        &[
            pv_with_finalizer("pv-ours", DRIVER, "gone", "claim-a"),
            pv_with_finalizer("pv-theirs", "other.csi.dev", "gone", "claim-b"),
        ],
    )
    .await;
    assert_eq!(r.released_finalizers, ["pv-ours"]);
    assert!(!s.has(&format!("{PVS}/pv-ours")));
    assert_eq!(
        finalizers_of(&s, "pv-theirs"),
        (json!([PROVISIONER_FINALIZER]), false)
    );
    assert!(!s.log().iter().any(|l| l.ends_with("/pv-theirs")));
}

#[tokio::test]
async fn scenario_leader_election() {
    let s = Scenario::new("leader election on a Lease");
    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/localvol";
    let a = Elector::new(
        s.client.clone(),
        "kube-system",
        "localvol",
        "a",
        Duration::from_secs(15),
    );
    let b = Elector::new(
        s.client.clone(),
        "kube-system",
        "localvol",
        "b",
        Duration::from_secs(15),
    );
    assert!(t(a.try_acquire_or_renew()).await, "a creates the lease");
    assert!(!t(b.try_acquire_or_renew()).await, "b follows");
    assert!(t(a.try_acquire_or_renew()).await, "a renews");
    assert_eq!(
        s.log(),
        [
            format!("GET {LEASE}"),
            "POST /apis/coordination.k8s.io/v1/namespaces/kube-system/leases".into(),
            format!("GET {LEASE}"),
            format!("GET {LEASE}"),
            format!("PUT {LEASE}"),
        ]
    );
    let holder = |s: &Scenario| {
        s.api.lock().unwrap().objects[LEASE]["spec"]["holderIdentity"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(holder(&s), "a");
    // a stops renewing: once expired, b takes over (one transition).
    {
        let mut api = s.api.lock().unwrap();
        let l = api.objects.get_mut(LEASE).unwrap();
        l["spec"]["renewTime"] = json!("2020-01-01T00:00:00.000000Z");
    }
    assert!(
        t(b.try_acquire_or_renew()).await,
        "b takes the expired lease"
    );
    assert_eq!(holder(&s), "b");
    assert_eq!(
        s.api.lock().unwrap().objects[LEASE]["spec"]["leaseTransitions"],
        json!(1)
    );
    assert!(!t(a.try_acquire_or_renew()).await, "a now follows");
}

#[tokio::test]
async fn scenario_run_leads_then_acts_on_lost_nodes() {
    let s = Scenario::new("run: caches, lease, then node-loss passes");
    s.put(
        "/api/v1/nodes/here",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "here"}}),
    );
    s.put(
        &format!("{PVS}/pv-gone"),
        pv("pv-gone", DRIVER, "gone", "claim-x"),
    );
    s.put(
        &format!("{PVS}/pv-here"),
        pv("pv-here", DRIVER, "here", "claim-y"),
    );
    let opts = super::ControllerOptions {
        driver_name: DRIVER.into(),
        identity: "ctrl-0".into(),
        lease_namespace: "kube-system".into(),
        lease_name: "localvol-controller".into(),
        lease_duration: Duration::from_secs(3),
        grace: Duration::ZERO,
        interval: Duration::from_millis(50),
    };
    let task = tokio::spawn(super::run(s.client.clone(), opts));
    let start = Instant::now();
    while s.has(&format!("{PVS}/pv-gone")) {
        assert!(start.elapsed() < TIMEOUT, "PV not deleted: {:?}", s.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
    assert!(
        s.has(&format!("{PVS}/pv-here")),
        "the existing node's PV stays"
    );
    let log = s.log();
    let at = |needle: &str| {
        log.iter()
            .position(|l| l == needle)
            .unwrap_or_else(|| panic!("{needle} not in {log:?}"))
    };
    // The lease was taken before anything was deleted.
    assert!(
        at("POST /apis/coordination.k8s.io/v1/namespaces/kube-system/leases")
            < at(&format!("DELETE {PVS}/pv-gone"))
    );
    assert!(at("LIST /api/v1/nodes") < at(&format!("DELETE {PVS}/pv-gone")));
}

/// A PV the cache has under an older uid (deleted and made again under the
/// same name meanwhile) is not deleted (409) and is tried again next pass,
/// where its NodeLost Event repeats (kube-runtime patches the series); a
/// PV of the same lost node seen later extends the node's lost record.
#[tokio::test]
async fn scenario_a_conflicting_delete_is_retried_and_the_record_extended() {
    let s = Scenario::new("a conflicting delete is retried; the record grows");
    let stale = pv("pv-a", DRIVER, "gone", "claim-a");
    let mut current = stale.clone();
    current["metadata"]["uid"] = json!("uid-again");
    s.put_pv(current);
    let nl = NodeLoss::new(s.client.clone(), DRIVER, "ctrl-0", NS, GRACE);
    let nodes = store::<Node>(vec![]);
    let mut cache = vec![stale];
    let t0 = Instant::now();
    for (i, t) in [t0, t0 + GRACE, t0 + GRACE * 2, t0 + GRACE * 3]
        .into_iter()
        .enumerate()
    {
        if i == 3 {
            let mut b = pv("pv-b", DRIVER, "gone", "claim-b");
            b["spec"]["csi"]["volumeHandle"] = json!(format!("default.{}", "1".repeat(32)));
            cache.push(b);
            s.put_pv(cache[1].clone());
        }
        let pvs = store(pvs_of(&cache));
        tokio::time::timeout(TIMEOUT, nl.pass(t, &nodes, &pvs))
            .await
            .expect("pass timed out")
            .unwrap();
    }
    let log = s.log();
    let count = |l: &str| log.iter().filter(|x| *x == l).count();
    assert_eq!(count("EVENT NodeLost"), 4, "{log:?}");
    assert_eq!(count(&format!("DELETE {PVS}/pv-a")), 3, "{log:?}");
    assert_eq!(count(&format!("POST {CMS}")), 1, "{log:?}");
    assert_eq!(
        count(&format!("PUT {CMS}/localvol-lost.gone")),
        1,
        "{log:?}"
    );
    assert!(s.has(&format!("{PVS}/pv-a")), "not the PV the cache had");
    assert!(!s.has(&format!("{PVS}/pv-b")));
    let needs = s.needs();
    assert!(needs.contains(&"controller ClusterRole events.k8s.io events patch".to_owned()));
    assert!(needs.contains(&"controller Role core configmaps update".to_owned()));
}
