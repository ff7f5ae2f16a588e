//! The one fake Kubernetes API server of the tests (discovery, orphans, the
//! node-loss controller): `tower_test::mock::pair` behind a real
//! `kube::Client`, serving objects by API path from memory and logging every
//! request, so a scenario asserts on exactly what was called.
//!
//! What it does: lists (`LIST <path>`, with ` ?<labelSelector>` when the
//! query has one) of a cluster-scoped collection, or of one or all
//! namespaces' CSIStorageCapacities; watches that end at once (the watcher re-watches
//! with its backoff; not logged); GET, POST (uid and resourceVersion set; a
//! new PV gets phase Pending), PUT (resourceVersion must match), DELETE (a uid
//! precondition must match) and JSON-patch PATCH (RFC 6902, `test` included;
//! a failed operation is 422 Invalid, as the API server answers) of single
//! objects, and JSON merge patches (RFC 7386) of existing ones; Events
//! (logged as `EVENT <reason>`). Finalizers hold as in the API
//! server: DELETE of an object that has some only sets its
//! `deletionTimestamp`, and the object goes when a PATCH takes the last one
//! off. A created PV gets `kubernetes.io/pv-protection`, as the API server
//! adds it, which holds only a Bound PV (its controller frees others at
//! once). Anything else is logged as `UNEXPECTED` and answered 500.
//!
//! In the unit tests each client of it is a component's, under that
//! component's RBAC role: every request is noted as the permission it needs
//! (`needs.rs`), and a test fails on one `deploy/rbac-needs.txt` lacks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::client::Body;
#[cfg(test)]
use kube::Client;
use serde_json::{json, Value};

#[cfg(test)]
mod needs;
#[cfg(test)]
pub use needs::{Role, NAMESPACE};

/// Where PersistentVolumes live in the API.
pub const PVS: &str = "/api/v1/persistentvolumes";

/// A change made to a stored object by someone else.
pub type Writer = Box<dyn FnOnce(&mut Value) + Send>;

/// Objects by API path, and the request log.
#[derive(Default)]
pub struct FakeApi {
    pub objects: BTreeMap<String, Value>,
    pub log: Vec<String>,
    /// Runs once on the stored object just before the next PATCH applies: a
    /// concurrent writer that got there first.
    pub before_next_patch: Option<Writer>,
    rv: u64,
}

impl FakeApi {
    /// The PV named `name`, if any.
    pub fn pv(&self, name: &str) -> Option<&Value> {
        self.objects.get(&format!("{PVS}/{name}"))
    }

    /// All PVs, by name.
    pub fn pvs(&self) -> BTreeMap<String, Value> {
        let prefix = format!("{PVS}/");
        self.objects
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_owned(), v.clone())))
            .collect()
    }

    /// Removes every PV.
    pub fn clear_pvs(&mut self) {
        let prefix = format!("{PVS}/");
        self.objects.retain(|k, _| !k.starts_with(&prefix));
    }
}

/// The fake served over plain HTTP/1.1 on `listener`, for a driver process
/// started with `--kube-api http://<addr>` (the VM tests); runs until the
/// returned task is aborted.
#[cfg(feature = "fake-api")]
pub fn serve_http(
    listener: tokio::net::TcpListener,
    api: Arc<Mutex<FakeApi>>,
) -> tokio::task::JoinHandle<()> {
    use http_body_util::BodyExt;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let api = api.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let api = api.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let bytes = body.collect().await?.to_bytes();
                        let req = Request::from_parts(parts, Body::from(bytes.to_vec()));
                        Ok::<_, hyper::Error>(handle(&api, req).await)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}

/// A running fake and a client of it; the server tasks stop on drop, when
/// the RBAC its clients needed is checked (`needs.rs`).
#[cfg(test)]
pub struct Fake {
    /// A client of the role the fake was started with.
    pub client: Client,
    pub api: Arc<Mutex<FakeApi>>,
    needs: Arc<Mutex<needs::Needs>>,
    servers: Mutex<Vec<tokio::task::AbortHandle>>,
}

#[cfg(test)]
impl Fake {
    /// A fake whose `client` makes the calls of `role`'s component.
    pub fn start(role: Role) -> Fake {
        let (api, needs, servers) = (Arc::default(), Arc::default(), Mutex::default());
        let client = serve(&api, &needs, &servers, role);
        Fake {
            client,
            api,
            needs,
            servers,
        }
    }

    /// Another client of the same fake, for a component of another role
    /// (a scenario that runs several).
    pub fn client_as(&self, role: Role) -> Client {
        serve(&self.api, &self.needs, &self.servers, role)
    }

    /// Stores an object at an API path.
    pub fn put(&self, path: &str, v: Value) {
        self.api.lock().unwrap().objects.insert(path.into(), v);
    }

    /// Stores a PV under its name.
    pub fn put_pv(&self, pv: Value) {
        let name = pv["metadata"]["name"].as_str().unwrap().to_owned();
        self.put(&format!("{PVS}/{name}"), pv);
    }

    pub fn has(&self, path: &str) -> bool {
        self.api.lock().unwrap().objects.contains_key(path)
    }

    /// The requests since the last call.
    pub fn log(&self) -> Vec<String> {
        std::mem::take(&mut self.api.lock().unwrap().log)
    }

    /// The RBAC needs of every request so far (`needs.rs`).
    pub fn needs(&self) -> Vec<String> {
        self.needs.lock().unwrap().seen().cloned().collect()
    }

    /// Waits until a request logged so far is `entry` (a component running
    /// in the background got there), and returns the log.
    pub async fn wait_for(&self, entry: &str) -> Vec<String> {
        let start = std::time::Instant::now();
        loop {
            let log = self.api.lock().unwrap().log.clone();
            if log.iter().any(|l| l == entry) {
                return self.log();
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(20),
                "{entry} not in {log:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

/// A client whose requests `api` answers, each noted as a need of `role`
/// first (one the fake cannot name is answered 500); defaulting to the
/// driver's namespace ([`NAMESPACE`]) as in-cluster clients do.
#[cfg(test)]
fn serve(
    api: &Arc<Mutex<FakeApi>>,
    needs: &Arc<Mutex<needs::Needs>>,
    servers: &Mutex<Vec<tokio::task::AbortHandle>>,
    role: Role,
) -> Client {
    let (svc, mut h) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (api, needs) = (api.clone(), needs.clone());
    let server = tokio::spawn(async move {
        while let Some((req, send)) = h.next_request().await {
            let known = needs.lock().unwrap().note(role, req.method(), req.uri());
            send.send_response(if known {
                handle(&api, req).await
            } else {
                respond(500, &status(500, "InternalError"))
            });
        }
    });
    servers.lock().unwrap().push(server.abort_handle());
    Client::new(svc, NAMESPACE)
}

#[cfg(test)]
impl Drop for Fake {
    fn drop(&mut self) {
        for s in self.servers.lock().unwrap().drain(..) {
            s.abort();
        }
        if !std::thread::panicking() {
            self.needs.lock().unwrap().finish();
        }
    }
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": reason, "reason": reason, "code": code})
}

fn respond(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .body(Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

/// The finalizer the API server's admission (StorageObjectInUseProtection)
/// puts on every new PV; kube-controller-manager's pv-protection controller
/// takes it off a PV marked for deletion once no claim is bound to it.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// Whether a finalizer still holds `o` once marked for deletion. The
/// pv-protection finalizer holds a PV only while it is Bound: otherwise its
/// controller removes it within moments, modelled here as at once.
fn has_finalizers(o: &Value) -> bool {
    let bound = o["status"]["phase"] == "Bound";
    o["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f != PV_PROTECTION || bound))
}

/// The decoded `labelSelector` of a query string (enough percent-decoding for
/// selectors: `=`, `,` and `/`).
fn selector_of(query: &str) -> Option<String> {
    let raw = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("labelSelector="))?;
    Some(
        raw.replace("%3D", "=")
            .replace("%2C", ",")
            .replace("%2F", "/"),
    )
}

/// The objects a list of `path` returns, if `path` is a collection.
fn list(api: &FakeApi, path: &str) -> Option<Vec<Value>> {
    let prefix = match path {
        "/api/v1/nodes" | PVS => format!("{path}/"),
        // One namespace's capacities.
        p if p.starts_with("/apis/storage.k8s.io/v1/namespaces/")
            && p.ends_with("/csistoragecapacities") =>
        {
            format!("{path}/")
        }
        // All namespaces' capacities.
        "/apis/storage.k8s.io/v1/csistoragecapacities" => {
            return Some(
                api.objects
                    .iter()
                    .filter(|(k, _)| k.contains("/csistoragecapacities/"))
                    .map(|(_, v)| v.clone())
                    .collect(),
            )
        }
        _ => return None,
    };
    Some(
        api.objects
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, v)| v.clone())
            .collect(),
    )
}

/// One request to the fake, read whole.
struct Call {
    method: String,
    path: String,
    query: String,
    content_type: String,
    /// The JSON body; `Null` when there is none.
    body: Value,
}

impl Call {
    async fn read(req: Request<Body>) -> Call {
        let method = req.method().to_string();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or("").to_owned();
        let content_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let body = req.into_body().collect_bytes().await.unwrap();
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).unwrap()
        };
        Call {
            method,
            path,
            query,
            content_type,
            body,
        }
    }
}

async fn handle(api: &Mutex<FakeApi>, req: Request<Body>) -> Response<Body> {
    let Call {
        method,
        path,
        query,
        content_type,
        body,
    } = Call::read(req).await;
    let mut api = api.lock().unwrap();
    if path.starts_with("/apis/events.k8s.io/v1/namespaces/") {
        let reason = body["reason"].as_str().unwrap_or("?").to_owned();
        api.log.push(format!("EVENT {reason}"));
        return respond(201, &body);
    }
    if method == "GET" {
        if let Some(items) = list(&api, &path) {
            return api.list_or_watch(&path, &query, items);
        }
    }
    api.log.push(format!("{method} {path}"));
    match method.as_str() {
        "GET" => match api.objects.get(&path) {
            Some(o) => respond(200, o),
            None => respond(404, &status(404, "NotFound")),
        },
        "DELETE" => api.delete(path, &body),
        "PATCH" if content_type == "application/json-patch+json" => api.json_patch(path, body),
        "PATCH" if content_type == "application/merge-patch+json" => api.merge_patch(path, body),
        "POST" => api.create(&path, body),
        "PUT" => api.update(path, body),
        _ => {
            api.log.push(format!("UNEXPECTED {method} {path}"));
            respond(500, &status(500, "InternalError"))
        }
    }
}

/// The API's verbs on single objects (and lists), one each: `handle` has
/// logged the request.
impl FakeApi {
    /// Gives `o` the next resourceVersion.
    fn bump_rv(&mut self, o: &mut Value) {
        self.rv += 1;
        o["metadata"]["resourceVersion"] = json!(self.rv.to_string());
    }

    /// A list of a collection (logged), or a watch of it that ends at once
    /// (not logged).
    fn list_or_watch(&mut self, path: &str, query: &str, items: Vec<Value>) -> Response<Body> {
        if query.contains("watch=true") {
            return Response::builder().status(200).body(Body::empty()).unwrap();
        }
        let entry = match selector_of(query) {
            Some(sel) => format!("LIST {path} ?{sel}"),
            None => format!("LIST {path}"),
        };
        self.log.push(entry);
        respond(
            200,
            &json!({"kind": "List", "apiVersion": "v1",
                    "metadata": {"resourceVersion": "1"}, "items": items}),
        )
    }

    /// DELETE, with its uid precondition; an object with finalizers is only
    /// marked for deletion.
    fn delete(&mut self, path: String, body: &Value) -> Response<Body> {
        let Some(o) = self.objects.get(&path).cloned() else {
            return respond(404, &status(404, "NotFound"));
        };
        let want = &body["preconditions"]["uid"];
        if !want.is_null() && *want != o["metadata"]["uid"] {
            return respond(409, &status(409, "Conflict"));
        }
        if has_finalizers(&o) {
            // Held: marked for deletion (once), kept.
            let mut o = o;
            if o["metadata"]["deletionTimestamp"].is_null() {
                o["metadata"]["deletionTimestamp"] = json!("2020-01-01T00:00:00Z");
                self.bump_rv(&mut o);
                self.objects.insert(path, o.clone());
            }
            return respond(200, &o);
        }
        self.objects.remove(&path);
        respond(200, &o)
    }

    /// A JSON patch (after `before_next_patch`); an object marked for
    /// deletion goes when it takes the last finalizer off.
    fn json_patch(&mut self, path: String, body: Value) -> Response<Body> {
        let writer = self.before_next_patch.take();
        let Some(old) = self.objects.get_mut(&path) else {
            return respond(404, &status(404, "NotFound"));
        };
        if let Some(w) = writer {
            w(old);
        }
        let mut o = old.clone();
        let applied = serde_json::from_value::<json_patch::Patch>(body)
            .map_err(|e| e.to_string())
            .and_then(|p| json_patch::patch(&mut o, &p).map_err(|e| e.to_string()));
        if let Err(e) = applied {
            let mut st = status(422, "Invalid");
            st["message"] = json!(e);
            return respond(422, &st);
        }
        self.bump_rv(&mut o);
        if !o["metadata"]["deletionTimestamp"].is_null() && !has_finalizers(&o) {
            self.objects.remove(&path);
        } else {
            self.objects.insert(path, o.clone());
        }
        respond(200, &o)
    }

    /// A JSON merge patch (RFC 7386) of an existing object.
    fn merge_patch(&mut self, path: String, body: Value) -> Response<Body> {
        let Some(old) = self.objects.get(&path) else {
            return respond(404, &status(404, "NotFound"));
        };
        let mut o = old.clone();
        json_patch::merge(&mut o, &body);
        self.bump_rv(&mut o);
        self.objects.insert(path, o.clone());
        respond(200, &o)
    }

    /// POST to a collection: uid (unless given) and resourceVersion set; a
    /// new PV is Pending.
    fn create(&mut self, path: &str, body: Value) -> Response<Body> {
        let name = body["metadata"]["name"].as_str().unwrap().to_owned();
        let key = format!("{path}/{name}");
        if self.objects.contains_key(&key) {
            return respond(409, &status(409, "AlreadyExists"));
        }
        let mut o = body;
        self.bump_rv(&mut o);
        if o["metadata"]["uid"].is_null() {
            o["metadata"]["uid"] = json!(format!("uid-{name}"));
        }
        if path == PVS {
            if o["status"].is_null() {
                o["status"] = json!({"phase": "Pending"});
            }
            // As the API server's admission does (checked on the e2e cluster).
            let f = &mut o["metadata"]["finalizers"];
            if f.is_null() {
                *f = json!([]);
            }
            let list = f.as_array_mut().expect("finalizers is a list");
            if !list.iter().any(|f| f == PV_PROTECTION) {
                list.push(json!(PV_PROTECTION));
            }
        }
        self.objects.insert(key, o.clone());
        respond(201, &o)
    }

    /// PUT: the resourceVersion must be the stored one.
    fn update(&mut self, path: String, body: Value) -> Response<Body> {
        let Some(old) = self.objects.get(&path) else {
            return respond(404, &status(404, "NotFound"));
        };
        if body["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
            return respond(409, &status(409, "Conflict"));
        }
        let mut o = body;
        self.bump_rv(&mut o);
        self.objects.insert(path, o.clone());
        respond(200, &o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolume;
    use kube::api::{Api, DeleteParams, PostParams};

    fn pv(name: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": "/nonexistent"}}
        }))
        .unwrap()
    }

    /// As the e2e cluster's API server answered: a created PV carries
    /// kubernetes.io/pv-protection; deleting one that is not Bound removes
    /// it (the pv-protection controller frees it), a Bound one stays
    /// marked for deletion while the finalizer holds.
    #[tokio::test]
    async fn created_pvs_carry_pv_protection_which_holds_only_bound_ones() {
        let fake = Fake::start(Role::Discovery);
        let api: Api<PersistentVolume> = Api::all(fake.client.clone());
        for name in ["free", "bound"] {
            let made = api.create(&PostParams::default(), &pv(name)).await.unwrap();
            assert_eq!(
                made.metadata.finalizers,
                Some(vec![PV_PROTECTION.to_owned()])
            );
        }
        fake.api
            .lock()
            .unwrap()
            .objects
            .get_mut(&format!("{PVS}/bound"))
            .unwrap()["status"]["phase"] = json!("Bound");
        for name in ["free", "bound"] {
            api.delete(name, &DeleteParams::default()).await.unwrap();
        }
        assert!(!fake.has(&format!("{PVS}/free")));
        let held = fake.api.lock().unwrap().pv("bound").cloned().unwrap();
        assert!(!held["metadata"]["deletionTimestamp"].is_null(), "{held}");
    }
}
