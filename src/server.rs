//! Builds the driver from its options and serves the three CSI services. Used by
//! `localvol serve` and by tests alike.

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_stream::StreamExt;
use tonic::transport::Server;

use crate::config::Config;
use crate::csi::{
    controller_server::ControllerServer, identity_server::IdentityServer, node_server::NodeServer,
    snapshot_metadata_server::SnapshotMetadataServer,
};
use crate::driver::{check_identity, Driver, DriverError, Identity};
use crate::endpoint::Endpoint;
use crate::error::{IoContext, IoError};
use crate::liveness::Liveness;
use crate::service::gate::{Gate, Opened};

/// Why the driver did not start, or its server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error("{0:?} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("socket group {0} does not exist")]
    NoSuchGroup(String),
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error(transparent)]
    Io(#[from] IoError),
}

type Result<T, E = ServeError> = std::result::Result<T, E>;
use crate::service::controller::ControllerService;
use crate::service::identity::IdentityService;
use crate::service::metadata::SnapshotMetadataService;
use crate::service::node::{node_info, NodeService};
use crate::task::AbortOnDrop;

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub endpoint: Endpoint,
    pub node_id: String,
    pub driver_name: String,
    pub config: Config,
    pub kubelet_dir: PathBuf,
    /// Group that may use the socket (mode 0660); without it the socket is 0600.
    pub socket_group: Option<String>,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (off when None).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Where to serve the liveness verdict, `/healthz` (`liveness.rs`; off
    /// when None), and how long without an answer counts as dead.
    pub liveness_addr: Option<std::net::SocketAddr>,
    pub liveness_deadline: std::time::Duration,
    /// The driver's namespace (its pod's): where the node-loss controller's
    /// lost records are read.
    pub namespace: String,
    /// An API server URL used instead of the in-cluster config, without
    /// credentials (tests and debugging only; `--kube-api`).
    pub kube_api: Option<String>,
    /// How often the pool monitor looks at the pools (and retries the
    /// ones that have not opened): `--pool-check-interval`.
    pub pool_check_interval: std::time::Duration,
    /// How long a /metrics scrape waits for the pools' figures:
    /// `--metrics-wait`.
    pub metrics_wait: std::time::Duration,
}

/// How big the serving runtime is: async workers, blocking threads and glibc
/// malloc arenas. Each `None` takes the default for the cores this process
/// may use ([`std::thread::available_parallelism`], which honours a cgroup
/// CPU limit); `localvol serve --workers/--blocking-threads/--malloc-arenas`
/// (env `LOCALVOL_WORKERS`, `LOCALVOL_BLOCKING_THREADS`,
/// `LOCALVOL_MALLOC_ARENAS`) set them. How the defaults were chosen:
/// docs/configuration.md, "Runtime sizing".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeSizing {
    pub workers: Option<usize>,
    pub blocking_threads: Option<usize>,
    pub malloc_arenas: Option<usize>,
}

/// Cores per malloc arena by default (at least one arena).
pub const CORES_PER_ARENA: usize = 4;
/// Blocking threads per core, at most by default: they make the syscalls
/// (mounts, which the kernel serialises per mount namespace anyway, and
/// fsyncs, which wait on the disk). Without a limit every concurrent request
/// gets a thread of its own, each with its stack and heap. Measured on 16
/// cores at 64 concurrent lifecycles (docs/configuration.md, "Runtime
/// sizing"): 32 threads ran as many lifecycles/s as 64 with 1.9 MiB less
/// peak RSS; 16 threads ran a third fewer.
pub const BLOCKING_PER_CORE: usize = 2;
/// Blocking threads, at least by default, whatever the core count: a syscall
/// on a hung device (a mount, an fsync) holds its thread until the device
/// answers, and requests for other volumes must still find threads
/// meanwhile. Idle threads exit after tokio's keep-alive (10 s), so the floor
/// costs nothing when the driver is quiet.
pub const MIN_BLOCKING: usize = 32;

impl RuntimeSizing {
    /// The sizes for `cores` usable cores: every unset one at its default.
    ///
    /// - workers: one per core (tokio's own default). They decode and encode
    ///   every RPC (HTTP/2, HPACK, protobuf) and hand the work to blocking
    ///   threads; an idle worker costs one parked thread (a few KiB
    ///   resident), and fewer workers than cores capped a 16-core node at
    ///   half its lifecycles/s.
    /// - blocking threads: [`BLOCKING_PER_CORE`] per core, at least
    ///   [`MIN_BLOCKING`].
    /// - malloc arenas: one per [`CORES_PER_ARENA`] cores, at least one.
    ///   glibc's own default is 8 per core, so that every blocking thread
    ///   ends up with a heap of its own that keeps freed memory around; one
    ///   arena for all makes threads on different cores queue on its lock
    ///   whenever their thread cache misses (measured: a third of a 16-core
    ///   node's lifecycles/s at C=64). Each arena keeps its own free memory:
    ///   on 2 cores a second arena measured 2-3 MiB more RSS while 10,000
    ///   volumes were created, listed and deleted, so 2 cores keep one and
    ///   16 get four.
    pub fn resolve(self, cores: usize) -> Resolved {
        let cores = cores.max(1);
        Resolved {
            workers: self.workers.unwrap_or(cores).max(1),
            blocking_threads: self
                .blocking_threads
                .unwrap_or((cores * BLOCKING_PER_CORE).max(MIN_BLOCKING))
                .max(1),
            malloc_arenas: self.malloc_arenas.unwrap_or(cores / CORES_PER_ARENA).max(1),
        }
    }
}

/// [`RuntimeSizing`] with every size decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub workers: usize,
    pub blocking_threads: usize,
    pub malloc_arenas: usize,
}

/// The runtime `localvol serve` runs on: a node daemon that mostly waits on
/// the kernel, whose memory is counted on every node, sized by `sizing` (see
/// [`RuntimeSizing::resolve`]). An operator's `MALLOC_ARENA_MAX` in the
/// environment wins over the arena count (glibc reads it itself). Call it
/// before any thread is started.
pub fn runtime(sizing: RuntimeSizing) -> std::io::Result<(tokio::runtime::Runtime, Resolved)> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let r = sizing.resolve(cores);
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let arenas = i32::try_from(r.malloc_arenas).unwrap_or(i32::MAX);
        // SAFETY: mallopt only sets a malloc parameter; no thread runs yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(r.workers)
        .max_blocking_threads(r.blocking_threads)
        .build()?;
    Ok((rt, r))
}

/// Opens the pools and assembles the shared driver state.
pub async fn build_driver(opts: &ServeOptions) -> Result<Arc<Driver>> {
    Ok(Driver::open(&opts.identity(), &opts.config).await?)
}

impl ServeOptions {
    fn identity(&self) -> Identity {
        Identity {
            driver_name: self.driver_name.clone(),
            node_id: self.node_id.clone(),
            kubelet_dir: self.kubelet_dir.clone(),
        }
    }
}

/// Serves until `shutdown` resolves, then removes the socket.
///
/// The socket is bound first and the pools opened behind it (`service/gate.rs`):
/// Identity and NodeGetInfo answer at once, Probe says not ready and the
/// rest is UNAVAILABLE until they are open. A pool set that fails to open
/// ends the server with that error, as before.
pub async fn serve(opts: ServeOptions, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
    let open = build_driver(&opts);
    serve_opening(&opts, open, shutdown).await
}

/// [`serve`] with the open given (tests hold it back to see the server
/// while its pools open).
pub async fn serve_opening(
    opts: &ServeOptions,
    open: impl Future<Output = Result<Arc<Driver>>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    check_identity(&opts.identity())?;
    let opened = Opened::default();
    let controller = Gate::default();
    let router = Server::builder()
        .add_service(IdentityServer::new(IdentityService::opening(
            opts.driver_name.clone(),
            opened.clone(),
            opts.config.keeps_block_maps(),
        )))
        .add_service(controller.clone())
        .add_service(NodeServer::new(NodeService::opening(
            node_info(&opts.node_id, opts.config.max_volumes_per_node),
            opened.clone(),
        )))
        .add_service(SnapshotMetadataServer::new(
            SnapshotMetadataService::opening(opened.clone()),
        ));
    let started = async {
        let driver = open.await?;
        let tasks = start_driver(opts, &driver).await?;
        controller.open(ControllerServer::new(ControllerService::new(
            driver.clone(),
        )));
        opened.set(driver);
        tracing::info!("pools open: serving every CSI call");
        Ok::<_, ServeError>(tasks)
    };
    match &opts.endpoint {
        Endpoint::Unix(path) => {
            let listener = bind_unix(path, opts.socket_group.as_deref())?;
            let ours = socket_identity(path);
            let shutdown = unlink_on(shutdown, path, ours);
            let _liveness = start_liveness(opts)?;
            tracing::info!(endpoint = %opts.endpoint, node = %opts.node_id, "serving CSI; opening the pools");
            // Clients that send the socket path as :authority (grpc C-core,
            // grpc-java, grpcurl, csc) need it rewritten: src/authority.rs.
            let incoming = UnixListenerStream::new(listener)
                .map(|conn| conn.map(crate::authority::AuthorityFix::new));
            let serving = router.serve_with_incoming_shutdown(incoming, shutdown);
            let res = serve_while(serving, started).await;
            remove_socket_if(path, ours);
            res
        }
        Endpoint::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .ctx(|| format!("binding {addr}"))?;
            let _liveness = start_liveness(opts)?;
            tracing::info!(endpoint = %opts.endpoint, node = %opts.node_id, "serving CSI (tcp, for debugging); opening the pools");
            let incoming = TcpListenerStream::new(listener);
            serve_while(
                router.serve_with_incoming_shutdown(incoming, shutdown),
                started,
            )
            .await
        }
    }
}

/// Serves while the pools open, then on with what opening them started (the
/// background tasks live as long as the server); a failed open ends it.
async fn serve_while(
    serving: impl Future<Output = std::result::Result<(), tonic::transport::Error>>,
    started: impl Future<Output = Result<Vec<AbortOnDrop>>>,
) -> Result<()> {
    tokio::pin!(serving);
    let _tasks = tokio::select! {
        res = &mut serving => return Ok(res?),
        tasks = started => tasks?,
    };
    Ok(serving.await?)
}

/// What runs beside the CSI services once the pools are open; stopped when
/// what it returns is dropped.
async fn start_driver(opts: &ServeOptions, driver: &Arc<Driver>) -> Result<Vec<AbortOnDrop>> {
    // Ephemeral inline volumes whose pods went while the driver was down
    // (before any Node call can see the driver).
    let swept = driver.sweep_ephemeral().await;
    if !swept.is_empty() {
        tracing::info!(
            count = swept.len(),
            "removed ephemeral volumes of gone pods"
        );
    }
    let mut tasks = vec![];
    if let Some(addr) = opts.metrics_addr {
        tasks.push(AbortOnDrop(tokio::spawn(
            crate::metrics::bind(addr, driver.clone(), opts.metrics_wait).await?,
        )));
    }
    // Static discovery's PV loop (needs the cluster; the node RPCs do not).
    if let Some(statics) = driver.statics.clone() {
        tasks.push(AbortOnDrop(tokio::spawn(run_discovery(
            driver.clone(),
            statics,
        ))));
    }
    if let Some(cfg) = opts.config.orphans.clone() {
        tasks.push(AbortOnDrop(tokio::spawn(run_orphans(
            driver.clone(),
            cfg,
            opts.namespace.clone(),
            opts.kube_api.clone(),
        ))));
    }
    tasks.push(AbortOnDrop(tokio::spawn(publish_storage(
        driver.clone(),
        opts.kube_api.clone(),
    ))));
    tasks.extend(run_attributes(driver, opts));
    tasks.push(AbortOnDrop(tokio::spawn(run_monitor(
        driver.clone(),
        opts.kube_api.clone(),
        opts.pool_check_interval,
    ))));
    Ok(tasks)
}

/// Starts the liveness endpoint (`--liveness-addr`; `liveness.rs`) once the
/// socket is bound, its heartbeat ticking on this runtime; both stop when
/// what it returns is dropped.
fn start_liveness(opts: &ServeOptions) -> Result<Option<(Liveness, AbortOnDrop)>> {
    let Some(addr) = opts.liveness_addr else {
        return Ok(None);
    };
    let l = Liveness::start(addr, opts.endpoint.clone(), opts.liveness_deadline)?;
    let beat = AbortOnDrop(tokio::spawn(l.heartbeat()));
    Ok(Some((l, beat)))
}

/// How often discovery rescans the disks and the PV cache (it also runs
/// whenever the cache changes).
const DISCOVERY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs static discovery against the cluster; while there is no in-cluster
/// config (`make run`, tests) it logs and retries, and the driver serves on.
async fn run_discovery(driver: Arc<Driver>, statics: Arc<crate::discovery::node::StaticPool>) {
    use crate::discovery::k8s::Discoverer;
    use crate::k8s::in_cluster_client;
    loop {
        match in_cluster_client().await {
            Ok(client) => {
                tracing::info!("static discovery: watching this node's PVs");
                let d = Discoverer::new(client, &driver.name, &driver.node_id, statics)
                    .with_volume_locks(driver.locks.clone());
                Arc::new(d).run(DISCOVERY_INTERVAL).await;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "static discovery: no cluster; PVs are not managed (retrying)");
                tokio::time::sleep(DISCOVERY_INTERVAL).await;
            }
        }
    }
}

/// The client of the node plugin's cluster tasks: the in-cluster config,
/// or the explicit `--kube-api` URL.
async fn cluster_client(kube_api: Option<&str>) -> std::result::Result<kube::Client, String> {
    match kube_api {
        None => crate::k8s::in_cluster_client().await,
        Some(url) => {
            let uri: http::Uri = url
                .parse()
                .map_err(|e| format!("--kube-api {url:?}: {e}"))?;
            kube::Client::try_from(kube::Config::new(uri))
                .map_err(|e| format!("kubernetes client: {e}"))
        }
    }
}

/// Publishes the pools' storage identities on this node's CSINode (the
/// annotation `<driver>/storage`, see `k8s::lost`), once per start; retried
/// until the CSINode exists (kubelet creates it) and a cluster answers.
async fn publish_storage(driver: Arc<Driver>, kube_api: Option<String>) {
    let ids: std::collections::BTreeMap<String, crate::ids::StorageId> = driver
        .pools
        .iter()
        .filter_map(|p| Some((p.name().to_string(), p.storage_id()?.clone())))
        .collect();
    for (pool, id) in &ids {
        tracing::info!(%pool, storage = %id, "pool storage identity");
    }
    let mut warned = false;
    loop {
        let res = match cluster_client(kube_api.as_deref()).await {
            Ok(client) => {
                crate::k8s::lost::annotate_csinode(&client, &driver.name, &driver.node_id, &ids)
                    .await
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e),
        };
        match res {
            Ok(()) => {
                tracing::info!(node = %driver.node_id, annotation = %crate::k8s::lost::storage_annotation(&driver.name),
                    "storage identities published on the CSINode");
                return;
            }
            Err(e) if !warned => {
                tracing::info!(error = %e, "storage identities not published on the CSINode yet (retrying)");
                warned = true;
            }
            Err(e) => tracing::debug!(error = %e, "storage identities not published yet"),
        }
        tokio::time::sleep(STORAGE_RETRY).await;
    }
}

/// Runs the pool monitor (`monitor.rs`) for as long as the driver serves:
/// Events once a cluster answers, and the storage identities published
/// again whenever a pool opens late.
async fn run_monitor(driver: Arc<Driver>, kube_api: Option<String>, every: std::time::Duration) {
    let mut monitor = crate::monitor::Monitor::new(driver.clone());
    // Replaced (the earlier one stopped) when another pool opens; stopped
    // with the monitor.
    let mut _late: Option<AbortOnDrop> = None;
    loop {
        if !monitor.has_cluster() {
            if let Ok(client) = cluster_client(kube_api.as_deref()).await {
                monitor.set_cluster(client);
            }
        }
        if !monitor.pass().await.is_empty() {
            _late = Some(AbortOnDrop(tokio::spawn(publish_storage(
                driver.clone(),
                kube_api.clone(),
            ))));
        }
        tokio::time::sleep(every).await;
    }
}

/// How often [`publish_storage`] retries.
const STORAGE_RETRY: std::time::Duration = std::time::Duration::from_secs(20);

/// Applies the VolumeAttributesClasses this node's PVs are moved to
/// (`attributes.rs`: IO limits of LVM volumes; dir pools take none), once
/// there is a cluster; not started without an LVM pool.
fn run_attributes(driver: &Arc<Driver>, opts: &ServeOptions) -> Option<AbortOnDrop> {
    let lvm = opts
        .config
        .pools
        .iter()
        .any(|p| matches!(p, crate::config::PoolConfig::Lvm(_)));
    lvm.then(|| {
        AbortOnDrop(tokio::spawn(watch_attributes(
            driver.clone(),
            opts.kube_api.clone(),
        )))
    })
}

async fn watch_attributes(driver: Arc<Driver>, kube_api: Option<String>) {
    loop {
        match cluster_client(kube_api.as_deref()).await {
            Ok(client) => return crate::attributes::run(driver, client).await,
            Err(e) => {
                tracing::debug!(error = %e, "volume attributes: no cluster (retrying)");
                tokio::time::sleep(DISCOVERY_INTERVAL).await;
            }
        }
    }
}

/// Reports (or reclaims) volumes no PV refers to, once there is a cluster.
async fn run_orphans(
    driver: Arc<Driver>,
    cfg: crate::orphans::OrphansConfig,
    namespace: String,
    kube_api: Option<String>,
) {
    loop {
        match cluster_client(kube_api.as_deref()).await {
            Ok(client) => {
                let o = crate::orphans::Orphans::new(driver, cfg)
                    .with_cluster(client.clone(), &namespace);
                Arc::new(o).run(client, DISCOVERY_INTERVAL * 5).await;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "orphans: no cluster; not checking (retrying)");
                tokio::time::sleep(DISCOVERY_INTERVAL).await;
            }
        }
    }
}

/// `shutdown`, then the socket's name removed: as the drain begins, so that
/// no client (a sidecar of the next pod, kubelet) connects to a server that
/// no longer accepts; and only while it is still this server's (`ours`): the
/// next plugin may have bound its own there already.
async fn unlink_on(shutdown: impl Future<Output = ()>, path: &Path, ours: Option<(u64, u64)>) {
    shutdown.await;
    remove_socket_if(path, ours);
}

/// The (device, inode) of the socket at `path`, if one is there.
fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    let md = std::fs::symlink_metadata(path).ok()?;
    md.file_type().is_socket().then(|| (md.dev(), md.ino()))
}

/// Removes the socket at `path` if it is still the one `ours` identifies. A
/// plugin that is being replaced drains while its successor starts; the
/// successor replaces the socket, and removing that one unconditionally cut
/// kubelet and the new pod's sidecars off the new plugin ("no such file or
/// directory", sidecars exiting on "Lost connection to CSI driver").
fn remove_socket_if(path: &Path, ours: Option<(u64, u64)>) {
    let now = socket_identity(path);
    if now.is_none() {
        // Removed already (as the drain began), or never bound.
        return;
    }
    if now == ours {
        if let Err(e) = std::fs::remove_file(path) {
            tracing::warn!(error = %e, ?path, "removing the CSI socket");
        }
    } else {
        tracing::info!(
            ?path,
            "the CSI socket is not this server's any more; left in place"
        );
    }
}

/// Binds the CSI socket: a stale socket is replaced, any other file is not; the
/// socket never exists with looser permissions than 0600 (0660 with a group).
fn bind_unix(path: &Path, group: Option<&str>) -> Result<tokio::net::UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => {
            std::fs::remove_file(path).ctx(|| format!("removing stale socket {path:?}"))?;
        }
        Ok(_) => return Err(ServeError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(IoError::new(format!("inspecting {path:?}"), e).into()),
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).ctx(|| format!("creating {parent:?}"))?;
    }
    let gid = group
        .map(|g| {
            nix::unistd::Group::from_name(g)
                .ctx(|| format!("looking up group {g}"))?
                .map(|g| g.gid)
                .ok_or_else(|| ServeError::NoSuchGroup(g.to_owned()))
        })
        .transpose()?;
    // umask is process-wide, so the window is kept to the bind call itself.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = tokio::net::UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound.ctx(|| format!("binding {path:?}"))?;
    if let Some(gid) = gid {
        nix::unistd::chown(path, None, Some(gid)).ctx(|| format!("chown {path:?}"))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .ctx(|| format!("chmod {path:?}"))?;
    }
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(dir: &Path) -> ServeOptions {
        ServeOptions {
            endpoint: Endpoint::Unix(dir.join("csi.sock")),
            node_id: "node-a".into(),
            driver_name: "localvol.csi.dev".into(),
            config: Config::embedded(&dir.join("pools")),
            kubelet_dir: dir.join("kubelet"),
            socket_group: None,
            metrics_addr: None,
            liveness_addr: None,
            liveness_deadline: std::time::Duration::from_secs(60),
            namespace: "localvol".into(),
            kube_api: None,
            pool_check_interval: std::time::Duration::from_secs(3600),
            metrics_wait: std::time::Duration::from_secs(5),
        }
    }

    /// The socket answers while the pools open (a node whose lvm is slow
    /// takes minutes): Identity and NodeGetInfo at once, Probe "not ready"
    /// (what the sidecars wait on), the rest UNAVAILABLE; then everything.
    #[tokio::test]
    async fn the_socket_answers_while_the_pools_open() {
        use crate::csi::node_client::NodeClient;
        use crate::csi::{controller_client::ControllerClient, identity_client::IdentityClient};
        let dir = tempfile::tempdir().unwrap();
        let opts = options(dir.path());
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let open = {
            let opts = opts.clone();
            async move {
                let _ = wait.await;
                build_driver(&opts).await
            }
        };
        let server = {
            let opts = opts.clone();
            tokio::spawn(async move {
                serve_opening(&opts, open, async {
                    let _ = stopped.await;
                })
                .await
            })
        };
        let channel = loop {
            match opts.endpoint.connect().await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        };
        let mut identity = IdentityClient::new(channel.clone());
        let mut node = NodeClient::new(channel.clone());
        let mut controller = ControllerClient::new(channel);
        let info = identity
            .get_plugin_info(crate::csi::GetPluginInfoRequest {})
            .await
            .unwrap();
        assert_eq!(info.into_inner().name, "localvol.csi.dev");
        let probe = identity
            .probe(crate::csi::ProbeRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(probe.ready, Some(false));
        let ni = node
            .node_get_info(crate::csi::NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ni.node_id, "node-a");
        let caps = controller
            .controller_get_capabilities(crate::csi::ControllerGetCapabilitiesRequest {})
            .await
            .unwrap_err();
        assert_eq!(caps.code(), tonic::Code::Unavailable, "{caps:?}");
        let stats = node
            .node_get_volume_stats(crate::csi::NodeGetVolumeStatsRequest {
                volume_id: "x".into(),
                volume_path: dir.path().join("kubelet/x").to_string_lossy().into_owned(),
                staging_target_path: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(stats.code(), tonic::Code::Unavailable, "{stats:?}");
        go.send(()).unwrap();
        let ready = loop {
            let p = identity
                .probe(crate::csi::ProbeRequest {})
                .await
                .unwrap()
                .into_inner();
            if p.ready == Some(true) {
                break p;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        assert_eq!(ready.ready, Some(true));
        let caps = controller
            .controller_get_capabilities(crate::csi::ControllerGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(!caps.capabilities.is_empty());
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
        assert!(!dir.path().join("csi.sock").exists());
    }

    /// A pool set that cannot open ends the server with its error, and the
    /// socket it bound goes with it.
    #[tokio::test]
    async fn a_failed_open_ends_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options(dir.path());
        let open = async {
            Err(ServeError::NoSuchGroup(
                "stands in for a failed open".into(),
            ))
        };
        let res = serve_opening(&opts, open, std::future::pending()).await;
        assert!(matches!(res, Err(ServeError::NoSuchGroup(_))), "{res:?}");
        assert!(!dir.path().join("csi.sock").exists());
    }

    #[tokio::test]
    async fn a_socket_is_removed_only_while_it_is_still_this_servers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let first = bind_unix(&path, None).unwrap();
        let ours = socket_identity(&path);
        assert!(ours.is_some());
        // The successor binds over it (as bind_unix replaces a stale socket).
        let second = bind_unix(&path, None).unwrap();
        remove_socket_if(&path, ours);
        assert!(path.exists(), "the successor's socket was removed");
        let theirs = socket_identity(&path);
        assert_ne!(theirs, ours);
        remove_socket_if(&path, theirs);
        assert!(!path.exists(), "its own socket was left behind");
        // Gone already, or never bound: nothing to do.
        remove_socket_if(&path, theirs);
        remove_socket_if(&path, None);
        drop((first, second));
    }

    #[test]
    fn runtime_sizes_default_to_the_cores_and_an_operator_sets_each() {
        let r = RuntimeSizing::default().resolve(2);
        assert_eq!((r.workers, r.blocking_threads, r.malloc_arenas), (2, 32, 1));
        let r = RuntimeSizing::default().resolve(16);
        assert_eq!(
            (r.workers, r.blocking_threads, r.malloc_arenas),
            (16, 32, 4)
        );
        let r = RuntimeSizing::default().resolve(64);
        assert_eq!(
            (r.workers, r.blocking_threads, r.malloc_arenas),
            (64, 128, 16)
        );
        let set = RuntimeSizing {
            workers: Some(4),
            blocking_threads: Some(8),
            malloc_arenas: Some(1),
        };
        let r = set.resolve(16);
        assert_eq!((r.workers, r.blocking_threads, r.malloc_arenas), (4, 8, 1));
        let r = RuntimeSizing::default().resolve(0);
        assert_eq!((r.workers, r.malloc_arenas), (1, 1));
    }
}
