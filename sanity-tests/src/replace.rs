//! Node replaced vs node lost against the real binary:
//! a driver restarted on its existing storage, with `orphans: {mode:
//! reclaim}` and a lost record naming some of its volumes, keeps those and
//! reclaims only the others. The API server is the tests' fake
//! (`localvol::fake_api`) served over HTTP, which the driver reaches through
//! `--kube-api`. Used by `tests/host/node_replace.rs` (a dir pool, on the host)
//! and `tests/vm/vm_lvm.rs` (a thick LVM pool on an existing VG).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use localvol::fake_api::{serve_http, FakeApi};
use serde_json::{json, Value};

use crate::{Driver, DriverOpts};

/// The namespace the driver reads lost records from (`--namespace`).
pub const NAMESPACE: &str = "kube-system";

/// The volume attribute that names a volume's storage.
pub const STORAGE_KEY: &str = "storageIdentity";

/// The fake API server on a local port; stops on drop.
pub struct Api {
    pub state: Arc<Mutex<FakeApi>>,
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Api {
    pub async fn start() -> Api {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(FakeApi::default()));
        let task = serve_http(listener, state.clone());
        Api { state, url, task }
    }

    pub fn put(&self, path: &str, v: Value) {
        self.state.lock().unwrap().objects.insert(path.into(), v);
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(path).cloned()
    }

    /// Every request so far (not taken).
    pub fn log(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The ConfigMap path of `node`'s lost record.
pub fn record_path(node: &str) -> String {
    format!("/api/v1/namespaces/{NAMESPACE}/configmaps/localvol-lost.{node}")
}

/// A lost record as the node-loss controller writes it (docs/operations.md,
/// "Node replaced or node lost"): one `<handle> <storage identity>` a line.
pub fn lost_record(node: &str, volumes: &[(&str, &str)]) -> Value {
    let lines: String = volumes.iter().map(|(h, s)| format!("{h} {s}\n")).collect();
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("localvol-lost.{node}"), "namespace": NAMESPACE},
        "data": {"node": node, "driver": "localvol.csi.dev", "volumes": lines},
    })
}

/// What [`kept_after_node_loss`] found, for checks of the caller's own.
pub struct Outcome {
    /// The pool's storage identity (from CreateVolume's volume context).
    pub storage: String,
    pub kept: Vec<String>,
}

/// The scenario on the driver's default pool (which `opts` sets up):
/// volumes `lost-a` and `lost-b` (their PVs deleted by the node-loss
/// controller, so listed in the lost record) and `plain` (an ordinary
/// orphan); the driver restarts with orphan reclaim and the API. `plain` is
/// reclaimed (reclaim does run), the other two stay, each with an Event,
/// and the CSINode gets the pool's identity.
pub async fn kept_after_node_loss(opts: DriverOpts, pool: &str) -> Outcome {
    let mut d = Driver::start(opts).await;
    let (ids, storage) = create_volumes(&d).await;
    let node = d.opts_mut().node_id.clone();
    let status = d.stop().await;
    assert!(status.success(), "{status}");

    let api = Api::start().await;
    api.put(
        &record_path(&node),
        lost_record(&node, &[(&ids[0], &storage), (&ids[1], &storage)]),
    );
    let csinode = format!("/apis/storage.k8s.io/v1/csinodes/{node}");
    api.put(
        &csinode,
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
               "metadata": {"name": node}, "spec": {"drivers": []}}),
    );
    {
        let o = d.opts_mut();
        o.extra_config
            .push_str("orphans: {mode: reclaim, graceSeconds: 0}\n");
        o.args.extend([
            "--kube-api".to_owned(),
            api.url.clone(),
            "--namespace".to_owned(),
            NAMESPACE.to_owned(),
        ]);
    }
    d.start_again_retrying().await;

    wait_for_orphan_pass(&d, &api, &csinode, &ids[2]).await;
    check_after_orphan_pass(&d, &api, &csinode, &ids[..2], pool, &storage).await;
    let status = d.stop().await;
    assert!(status.success(), "{status}");
    Outcome {
        storage,
        kept: ids[..2].to_vec(),
    }
}

/// Creates `pvc-lost-a`, `pvc-lost-b` and `pvc-plain` on the default pool;
/// returns their ids (in that order) and the pool's storage identity, which
/// all three must carry.
async fn create_volumes(d: &Driver) -> (Vec<String>, String) {
    let mut ids = Vec::new();
    let mut storage = None;
    for name in ["pvc-lost-a", "pvc-lost-b", "pvc-plain"] {
        let v = d.create(name, 16 << 20).await;
        let s = v
            .volume_context
            .get(STORAGE_KEY)
            .unwrap_or_else(|| panic!("CreateVolume's volume_context has no {STORAGE_KEY}: {v:?}"))
            .clone();
        assert!(storage.is_none() || storage.as_ref() == Some(&s), "{s}");
        storage = Some(s);
        ids.push(v.volume_id);
    }
    (ids, storage.unwrap())
}

/// Waits (up to 120 s) for the first orphan pass, which runs once the PV
/// cache is filled: two OrphanKeptAfterNodeLoss Events, `plain` (the
/// ordinary orphan) reclaimed, and the CSINode annotated.
async fn wait_for_orphan_pass(d: &Driver, api: &Api, csinode: &str, plain: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let log = api.log();
        let events = log
            .iter()
            .filter(|l| *l == "EVENT OrphanKeptAfterNodeLoss")
            .count();
        let listed: Vec<String> = d.list_ids().await;
        let annotated = api
            .get(csinode)
            .is_some_and(|c| !c["metadata"]["annotations"]["localvol.csi.dev/storage"].is_null());
        if events >= 2 && !listed.iter().any(|id| id == plain) && annotated {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no orphan pass seen: events {events}, listed {listed:?}, CSINode annotated {annotated}; API log {log:?}; driver log:\n{}",
            d.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// After the orphan pass: the volumes of the lost record are still there,
/// the node did not write the record, the CSINode names `pool`'s storage
/// identity, and the driver logged the kept orphans.
async fn check_after_orphan_pass(
    d: &Driver,
    api: &Api,
    csinode: &str,
    kept: &[String],
    pool: &str,
    storage: &str,
) {
    let listed: Vec<String> = d.list_ids().await;
    for kept in kept {
        assert!(listed.contains(kept), "{kept} was reclaimed: {listed:?}");
    }
    let log = api.log();
    assert!(
        !log.iter()
            .any(|l| l.contains("/configmaps") && !l.starts_with("GET")),
        "the node wrote to the lost record: {log:?}"
    );
    let c = api.get(csinode).unwrap();
    let published: Value = serde_json::from_str(
        c["metadata"]["annotations"]["localvol.csi.dev/storage"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(published, json!({pool: storage}));
    let text = d.log_tail(400);
    assert!(text.contains("orphan kept"), "{text}");
}
