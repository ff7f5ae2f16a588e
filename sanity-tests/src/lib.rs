//! Shared harness for localvol's CSI conformance suite: the fixtures every module of
//! its two test binaries uses (`tests/host/main.rs`, `tests/vm/main.rs`).
//!
//! Every test starts the real `localvol serve` binary on a unix socket in a
//! fresh temp dir (with its own pool, kubelet dir and config) and talks to it
//! through the generated CSI client. [`Driver`]'s `Drop` kills the process and
//! unmounts everything it left below its temp dir before removing the dir, so a
//! failing test never leaves mounts behind.
//!
//! The binary is `$LOCALVOL_BIN`, else `<target>/debug/localvol` (`<target>` is
//! `$CARGO_TARGET_DIR` or the workspace's `target/`): build it first with
//! `cargo build --bin localvol`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use localvol::csi;
use localvol::csi::controller_client::ControllerClient;
use localvol::csi::identity_client::IdentityClient;
use localvol::csi::node_client::NodeClient;
use localvol::csi::volume_capability::access_mode::Mode;
use localvol::endpoint::Endpoint;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

pub use localvol::csi::volume_capability::access_mode::Mode as AccessMode;

pub mod faults;
mod lvm_fx;
pub mod replace;
pub use lvm_fx::LvmFx;

/// The topology key every localvol volume and node carries.
pub const TOPOLOGY_KEY: &str = "topology.localvol.csi.dev/node";
/// The node id drivers get unless a test picks another.
pub const NODE_ID: &str = "sanity-node-1";
/// Prefix of every driver temp dir (`grep localvol-sanity /proc/self/mountinfo`
/// finds leftovers).
pub const DIR_PREFIX: &str = "localvol-sanity-";

pub const KI: i64 = 1 << 10;
pub const MI: i64 = 1 << 20;
pub const GI: i64 = 1 << 30;

/// How long a driver gets to answer Probe with ready=true after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a SIGTERMed driver gets to exit.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------
// Locating the binary
// ---------------------------------------------------------------------------

/// The workspace root (the parent of this crate).
pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sanity-tests lives inside the workspace")
        .to_path_buf()
}

/// Path of the `localvol` binary under test; panics with instructions when it
/// is missing.
pub fn localvol_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LOCALVOL_BIN") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "LOCALVOL_BIN={} does not exist or is not a file",
            p.display()
        );
        return p;
    }
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) if Path::new(&t).is_absolute() => PathBuf::from(t),
        Some(t) => workspace_dir().join(t),
        None => workspace_dir().join("target"),
    };
    let p = target.join("debug").join("localvol");
    assert!(
        p.is_file(),
        "the localvol binary is missing at {}: run `cargo build --bin localvol` first \
         (or point LOCALVOL_BIN at a built binary)",
        p.display()
    );
    p
}

/// The version in the workspace's root Cargo.toml `[package]` section: what
/// GetPluginInfo must report.
pub fn crate_version() -> String {
    let text = fs::read_to_string(workspace_dir().join("Cargo.toml")).expect("reading Cargo.toml");
    let mut in_package = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
            continue;
        }
        if in_package {
            if let Some(rest) = line.strip_prefix("version") {
                let v = rest.trim_start().trim_start_matches('=').trim();
                return v.trim_matches('"').to_owned();
            }
        }
    }
    panic!("no version in the [package] section of the workspace Cargo.toml");
}

// ---------------------------------------------------------------------------
// Root
// ---------------------------------------------------------------------------

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Tests that mount call this first: without root they fail loudly instead of
/// passing without having checked anything.
pub fn require_root() {
    assert!(
        is_root(),
        "this test mounts and needs root (CI runs the suite as root); \
         run it with sudo or in the project's VM"
    );
}

// ---------------------------------------------------------------------------
// Driver options and config
// ---------------------------------------------------------------------------

/// One `type: dir` pool of the driver's config.
#[derive(Clone, Debug)]
pub struct PoolOpts {
    pub name: String,
    /// `reserve:` (a Kubernetes quantity such as `16Mi`).
    pub reserve: Option<String>,
    /// `capacity:`.
    pub capacity: Option<String>,
    /// `defaultSize:`.
    pub default_size: Option<String>,
    /// `quota:` (`required`, `auto` or `off`).
    pub quota: Option<String>,
}

impl PoolOpts {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            reserve: None,
            capacity: None,
            default_size: None,
            quota: None,
        }
    }
    pub fn capacity(mut self, q: &str) -> Self {
        self.capacity = Some(q.to_owned());
        self
    }
    pub fn reserve(mut self, q: &str) -> Self {
        self.reserve = Some(q.to_owned());
        self
    }
    pub fn default_size(mut self, q: &str) -> Self {
        self.default_size = Some(q.to_owned());
        self
    }
    pub fn quota(mut self, mode: &str) -> Self {
        self.quota = Some(mode.to_owned());
        self
    }
}

#[derive(Clone, Debug)]
pub struct DriverOpts {
    pub node_id: String,
    /// `--driver-name`; the binary's default when unset.
    pub driver_name: Option<String>,
    /// The first pool lives in `<dir>/pool`, the others in `<dir>/pool-<name>`.
    pub pools: Vec<PoolOpts>,
    pub default_pool: Option<String>,
    pub max_volumes_per_node: i64,
    /// Make `<dir>/kubelet` a symlink to `<dir>/kubelet-real` (some nodes have
    /// kubelet's root dir on another disk behind a symlink).
    pub kubelet_dir_is_symlink: bool,
    /// `--socket-group`.
    pub socket_group: Option<String>,
    /// `type: lvm` pools, written after the dir pools (so they are the default
    /// pool when `pools` is empty).
    pub lvm_pools: Vec<LvmPoolOpts>,
    /// YAML appended to the generated config as it is (e.g. a `discovery:`
    /// section: `tests/host/static_volumes.rs`).
    pub extra_config: String,
    /// `--metrics-addr` (e.g. `127.0.0.1:PORT`; see [`free_port`]).
    pub metrics_addr: Option<String>,
    /// Extra environment of the driver process (e.g. a `PATH` that puts
    /// fault-injecting wrappers of `lvm` or `mkfs` first: `tests/vm/vm_faults.rs`).
    pub env: Vec<(String, String)>,
    /// Extra `localvol serve` arguments (e.g. `--kube-api URL`:
    /// [`replace`]).
    pub args: Vec<String>,
}

impl Default for DriverOpts {
    fn default() -> Self {
        Self {
            node_id: NODE_ID.to_owned(),
            driver_name: None,
            // A small default size keeps tests that create many volumes cheap.
            pools: vec![PoolOpts::new("default").default_size("16Mi")],
            default_pool: None,
            max_volumes_per_node: 0,
            kubelet_dir_is_symlink: false,
            socket_group: None,
            lvm_pools: Vec::new(),
            extra_config: String::new(),
            metrics_addr: None,
            env: Vec::new(),
            args: Vec::new(),
        }
    }
}

impl DriverOpts {
    /// One pool named `name` with the given settings.
    pub fn with_pool(pool: PoolOpts) -> Self {
        Self {
            pools: vec![pool],
            ..Self::default()
        }
    }

    /// Only these LVM pools (no dir pool); the first is the default pool.
    pub fn with_lvm_pools(pools: Vec<LvmPoolOpts>) -> Self {
        Self {
            pools: Vec::new(),
            lvm_pools: pools,
            ..Self::default()
        }
    }
}

/// One `type: lvm` pool of the driver's config (VM tests: `tests/vm/vm_lvm.rs`).
#[derive(Clone, Debug)]
pub struct LvmPoolOpts {
    pub name: String,
    pub volume_group: String,
    pub thin_pool: Option<String>,
    pub overprovision_ratio: Option<f64>,
    /// `reserve:` (a quantity such as `64Mi`).
    pub reserve: Option<String>,
    /// `defaultFsType:` (`ext4` or `xfs`).
    pub default_fs_type: Option<String>,
    pub default_size: Option<String>,
    /// `thinFullPercent:`.
    pub thin_full_percent: Option<f64>,
    /// `wipeRateLimit:` (bytes per second, a quantity such as `16Mi`).
    pub wipe_rate_limit: Option<String>,
}

impl LvmPoolOpts {
    pub fn new(name: &str, volume_group: &str) -> Self {
        Self {
            name: name.to_owned(),
            volume_group: volume_group.to_owned(),
            thin_pool: None,
            overprovision_ratio: None,
            reserve: None,
            default_fs_type: None,
            default_size: None,
            thin_full_percent: None,
            wipe_rate_limit: None,
        }
    }
    pub fn thin_full_percent(mut self, p: f64) -> Self {
        self.thin_full_percent = Some(p);
        self
    }
    pub fn wipe_rate_limit(mut self, q: &str) -> Self {
        self.wipe_rate_limit = Some(q.to_owned());
        self
    }
    pub fn thin_pool(mut self, lv: &str) -> Self {
        self.thin_pool = Some(lv.to_owned());
        self
    }
    pub fn overprovision_ratio(mut self, r: f64) -> Self {
        self.overprovision_ratio = Some(r);
        self
    }
    pub fn reserve(mut self, q: &str) -> Self {
        self.reserve = Some(q.to_owned());
        self
    }
    pub fn default_fs_type(mut self, fs: &str) -> Self {
        self.default_fs_type = Some(fs.to_owned());
        self
    }
    pub fn default_size(mut self, q: &str) -> Self {
        self.default_size = Some(q.to_owned());
        self
    }

    fn yaml(&self) -> String {
        let mut y = format!(
            "  - name: {}\n    type: lvm\n    volumeGroup: {}\n",
            yaml_str(&self.name),
            yaml_str(&self.volume_group)
        );
        if let Some(r) = self.overprovision_ratio {
            y.push_str(&format!("    overprovisionRatio: {r}\n"));
        }
        if let Some(p) = self.thin_full_percent {
            y.push_str(&format!("    thinFullPercent: {p}\n"));
        }
        for (k, v) in [
            ("thinPool", &self.thin_pool),
            ("reserve", &self.reserve),
            ("defaultFsType", &self.default_fs_type),
            ("defaultSize", &self.default_size),
            ("wipeRateLimit", &self.wipe_rate_limit),
        ] {
            if let Some(v) = v {
                y.push_str(&format!("    {k}: {}\n", yaml_str(v)));
            }
        }
        y
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (for `--metrics-addr`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding 127.0.0.1:0")
        .port()
}

/// GET `path` from `127.0.0.1:port` (plain HTTP/1.0): the status line and body.
pub fn http_get(port: u16, path: &str) -> std::io::Result<(String, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    Ok((status, body.to_owned()))
}

/// The value of one sample line (`name{labels} value`) of a /metrics body.
pub fn metric_value(body: &str, name_and_labels: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        l.strip_prefix(name_and_labels)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

fn yaml_str(s: &str) -> String {
    // JSON strings are valid YAML double-quoted scalars.
    serde_json::to_string(s).expect("string to JSON")
}

// ---------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------

/// The three CSI clients on one channel.
#[derive(Clone)]
pub struct Csi {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
}

impl Csi {
    pub async fn connect(endpoint: &Endpoint) -> Result<Self, tonic::transport::Error> {
        let ch = endpoint.connect().await?;
        Ok(Self {
            identity: IdentityClient::new(ch.clone()),
            controller: ControllerClient::new(ch.clone()),
            node: NodeClient::new(ch),
        })
    }
}

// ---------------------------------------------------------------------------
// The driver process
// ---------------------------------------------------------------------------

/// A running `localvol serve` with its own temp dir:
///
/// ```text
/// <dir>/config.yaml   <dir>/csi.sock   <dir>/driver.log
/// <dir>/pool/         (first pool)     <dir>/pool-<name>/ (further pools)
/// <dir>/kubelet/      (--kubelet-dir; staging/ and pods/ are pre-created)
/// ```
pub struct Driver {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    pub opts: DriverOpts,
    pub endpoint: Endpoint,
    child: Option<Child>,
    csi: Option<Csi>,
}

impl Driver {
    /// A driver with the default options (one 16Mi-default-size pool).
    pub async fn start_default() -> Self {
        Self::start(DriverOpts::default()).await
    }

    /// Starts a driver and waits until Probe answers ready=true.
    pub async fn start(opts: DriverOpts) -> Self {
        let mut d = Self::new(opts);
        d.start_again().await;
        d
    }

    /// Prepares the temp dir and config without starting the process (see
    /// [`Driver::start_again`] and [`Driver::try_start_again`]).
    pub fn new(opts: DriverOpts) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .expect("creating the driver's temp dir");
        // The mount table shows resolved paths: so do the driver's dirs.
        let root = fs::canonicalize(dir.path()).expect("resolving the temp dir");
        let kubelet = if opts.kubelet_dir_is_symlink {
            std::os::unix::fs::symlink("kubelet-real", root.join("kubelet")).unwrap();
            root.join("kubelet-real")
        } else {
            root.join("kubelet")
        };
        fs::create_dir_all(kubelet.join("staging")).unwrap();
        fs::create_dir_all(kubelet.join("pods")).unwrap();
        let d = Driver {
            dir: Some(dir),
            endpoint: Endpoint::Unix(root.join("csi.sock")),
            root,
            opts,
            child: None,
            csi: None,
        };
        d.write_config();
        d
    }

    fn write_config(&self) {
        let mut y = String::new();
        if let Some(p) = &self.opts.default_pool {
            y.push_str(&format!("defaultPool: {}\n", yaml_str(p)));
        }
        y.push_str(&format!(
            "maxVolumesPerNode: {}\npools:\n",
            self.opts.max_volumes_per_node
        ));
        for (i, p) in self.opts.pools.iter().enumerate() {
            y.push_str(&format!(
                "  - name: {}\n    type: dir\n    path: {}\n",
                yaml_str(&p.name),
                yaml_str(self.pool_dir_at(i).to_str().unwrap())
            ));
            for (k, v) in [
                ("reserve", &p.reserve),
                ("capacity", &p.capacity),
                ("defaultSize", &p.default_size),
                ("quota", &p.quota),
            ] {
                if let Some(v) = v {
                    y.push_str(&format!("    {k}: {}\n", yaml_str(v)));
                }
            }
        }
        for p in &self.opts.lvm_pools {
            y.push_str(&p.yaml());
        }
        y.push_str(&self.opts.extra_config);
        fs::write(self.config_path(), y).expect("writing the driver config");
    }

    fn spawn(&mut self, bin: &Path) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("opening the driver log");
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--endpoint")
            .arg(self.endpoint.to_string())
            .arg("--config")
            .arg(self.config_path())
            .arg("--kubelet-dir")
            .arg(self.kubelet_dir())
            .arg("--node-id")
            .arg(&self.opts.node_id);
        if let Some(n) = &self.opts.driver_name {
            cmd.arg("--driver-name").arg(n);
        }
        if let Some(g) = &self.opts.socket_group {
            cmd.arg("--socket-group").arg(g);
        }
        if let Some(a) = &self.opts.metrics_addr {
            cmd.arg("--metrics-addr").arg(a);
        }
        cmd.args(&self.opts.args);
        // Plain text in the log file.
        cmd.env("NO_COLOR", "1");
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        for (k, v) in &self.opts.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // Never outlive the test process, even when it is killed.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        self.child = Some(child);
    }

    /// Waits for Probe to answer ready=true. Err (with the log tail) when the
    /// process exits first or the timeout passes.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::from("socket not there yet");
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!(
                        "localvol serve exited during start-up ({status}); log:\n{}",
                        self.log_tail(60)
                    ));
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "localvol serve did not become ready within {READY_TIMEOUT:?} ({last}); log:\n{}",
                    self.log_tail(60)
                ));
            }
            if self.socket_path().exists() {
                match tokio::time::timeout(Duration::from_secs(2), Csi::connect(&self.endpoint))
                    .await
                {
                    Ok(Ok(mut csi)) => {
                        match tokio::time::timeout(
                            Duration::from_secs(2),
                            csi.identity.probe(csi::ProbeRequest {}),
                        )
                        .await
                        {
                            Ok(Ok(r)) if r.get_ref().ready == Some(true) => {
                                self.csi = Some(csi);
                                return Ok(());
                            }
                            Ok(Ok(r)) => last = format!("Probe answered {:?}", r.get_ref()),
                            Ok(Err(s)) => last = format!("Probe failed: {s}"),
                            Err(_) => last = "Probe timed out".into(),
                        }
                    }
                    Ok(Err(e)) => last = format!("connect failed: {e}"),
                    Err(_) => last = "connect timed out".into(),
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends SIGTERM and waits for the process to exit; returns its status.
    pub async fn stop(&mut self) -> ExitStatus {
        self.csi = None;
        let mut child = self.child.take().expect("driver is not running");
        signal(&child, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().expect("waiting for the driver") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "localvol serve did not exit within {STOP_TIMEOUT:?} of SIGTERM; log:\n{}",
                    self.log_tail(60)
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Kills the process with SIGKILL (no chance to clean up) and reaps it.
    pub fn kill9(&mut self) {
        self.csi = None;
        let mut child = self.child.take().expect("driver is not running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts the binary (again) with the same dirs, rewriting the config from
    /// `self.opts`; panics with the log tail when it does not become ready.
    pub async fn start_again(&mut self) {
        if let Err(e) = self.try_start_again().await {
            panic!("{e}");
        }
    }

    /// Like [`Driver::start_again`], but a driver that exits or never becomes
    /// ready is an `Err` with its log tail (the process is killed then).
    pub async fn try_start_again(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "driver is still running");
        self.write_config();
        self.spawn(&localvol_bin());
        let res = self.wait_ready().await;
        if res.is_err() {
            if let Some(mut child) = self.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        res
    }

    /// Starts the binary (again) like [`Driver::start_again`], but waits only
    /// until Probe answers at all: `Ok` when it is ready, the Probe's error
    /// when the driver serves but is not healthy (a pool that cannot serve).
    /// Either way the driver keeps running. Panics with the log tail when it
    /// exits or never answers.
    pub async fn start_answering(&mut self) -> Result<(), Status> {
        assert!(self.child.is_none(), "driver is still running");
        self.write_config();
        self.spawn(&localvol_bin());
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    panic!(
                        "localvol serve exited during start-up ({status}); log:\n{}",
                        self.log_tail(60)
                    );
                }
            }
            assert!(
                Instant::now() < deadline,
                "localvol serve did not answer Probe within {READY_TIMEOUT:?}; log:\n{}",
                self.log_tail(60)
            );
            if self.socket_path().exists() {
                if let Ok(Ok(mut csi)) =
                    tokio::time::timeout(Duration::from_secs(2), Csi::connect(&self.endpoint)).await
                {
                    let probe = tokio::time::timeout(
                        Duration::from_secs(5),
                        csi.identity.probe(csi::ProbeRequest {}),
                    )
                    .await;
                    match probe {
                        Ok(Ok(r)) if r.get_ref().ready == Some(true) => {
                            self.csi = Some(csi);
                            return Ok(());
                        }
                        Ok(Err(s)) if s.code() != tonic::Code::Unavailable => {
                            self.csi = Some(csi);
                            return Err(s);
                        }
                        _ => {}
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// [`Driver::try_start_again`] up to three times, panicking with the last
    /// error. For LVM pools readiness runs lvm, and the harness gives each
    /// Probe 2 s, which a loaded VM (TCG) can miss.
    pub async fn start_again_retrying(&mut self) {
        let mut why = String::new();
        for attempt in 1..=3 {
            match self.try_start_again().await {
                Ok(()) => return,
                Err(e) => {
                    eprintln!("driver start attempt {attempt} failed: {e}");
                    why = e;
                }
            }
        }
        panic!("the driver did not start: {why}");
    }

    /// SIGTERM, check the exit was clean, start again.
    pub async fn restart(&mut self) {
        let status = self.stop().await;
        assert!(
            status.success(),
            "localvol serve exited with {status} on SIGTERM; log:\n{}",
            self.log_tail(60)
        );
        self.start_again().await;
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Clients connected to the running driver.
    pub fn csi(&self) -> Csi {
        self.csi.clone().expect("driver is not running")
    }
    pub fn identity(&self) -> IdentityClient<Channel> {
        self.csi().identity
    }
    pub fn controller(&self) -> ControllerClient<Channel> {
        self.csi().controller
    }
    pub fn node(&self) -> NodeClient<Channel> {
        self.csi().node
    }

    // --- paths -------------------------------------------------------------

    pub fn dir(&self) -> &Path {
        &self.root
    }
    /// The options the next start writes the config from (see
    /// [`Driver::start_again`]).
    pub fn opts_mut(&mut self) -> &mut DriverOpts {
        &mut self.opts
    }
    pub fn socket_path(&self) -> PathBuf {
        self.root.join("csi.sock")
    }
    pub fn config_path(&self) -> PathBuf {
        self.root.join("config.yaml")
    }
    pub fn log_path(&self) -> PathBuf {
        self.root.join("driver.log")
    }
    pub fn kubelet_dir(&self) -> PathBuf {
        self.root.join("kubelet")
    }
    fn pool_dir_at(&self, i: usize) -> PathBuf {
        if i == 0 {
            self.root.join("pool")
        } else {
            self.root.join(format!("pool-{}", self.opts.pools[i].name))
        }
    }
    /// The directory of the pool named `name`.
    pub fn pool_dir(&self, name: &str) -> PathBuf {
        let i = self
            .opts
            .pools
            .iter()
            .position(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pool {name} in this driver's config"));
        self.pool_dir_at(i)
    }
    /// `<first pool>/volumes`, where the dir pool keeps volumes and records.
    pub fn volumes_dir(&self) -> PathBuf {
        self.pool_dir_at(0).join("volumes")
    }
    /// The data directory of a volume of a dir pool (`<pool>/volumes/<key>`).
    pub fn volume_data_dir(&self, volume_id: &str) -> PathBuf {
        let (pool, key) = volume_id
            .rsplit_once('.')
            .unwrap_or_else(|| panic!("{volume_id:?} is not a localvol volume id"));
        self.pool_dir(pool).join("volumes").join(key)
    }
    /// Names of the volume data directories in a pool (records excluded).
    pub fn volume_dirs(&self, pool: &str) -> Vec<String> {
        let mut out: Vec<String> = fs::read_dir(self.pool_dir(pool).join("volumes"))
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_dir())
            .map(|e| e.file_name().into_string().unwrap())
            .collect();
        out.sort();
        out
    }
    /// A staging path below the kubelet dir; its parent exists, it does not.
    pub fn staging_path(&self, name: &str) -> PathBuf {
        self.kubelet_dir().join("staging").join(name)
    }
    /// A target path `<kubelet>/pods/<name>/mount`; its parent is created.
    pub fn target_path(&self, name: &str) -> PathBuf {
        let parent = self.kubelet_dir().join("pods").join(name);
        fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    }

    /// The last `n` lines of the driver's log.
    pub fn log_tail(&self, n: usize) -> String {
        let Ok(mut f) = fs::File::open(self.log_path()) else {
            return "(no log)".into();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    // --- convenience calls (panic on error) ---------------------------------

    /// Creates a mount volume of `bytes` (0: no capacity range) and returns it.
    pub async fn create(&self, name: &str, bytes: i64) -> csi::Volume {
        let mut req = create_req(name);
        if bytes > 0 {
            req.capacity_range = Some(range(bytes, 0));
        }
        self.controller()
            .create_volume(req)
            .await
            .unwrap_or_else(|s| panic!("CreateVolume {name}: {s:?}"))
            .into_inner()
            .volume
            .expect("CreateVolume returned no volume")
    }

    pub async fn stage(&self, volume_id: &str, staging: &Path) {
        self.node()
            .node_stage_volume(stage_req(volume_id, staging))
            .await
            .unwrap_or_else(|s| panic!("NodeStageVolume {volume_id}: {s:?}"));
    }

    /// NodeUnstageVolume (retried while the mount is transiently busy, as
    /// kubelet would: see [`retry_busy`]).
    pub async fn unstage(&self, volume_id: &str, staging: &Path) {
        let req = unstage_req(volume_id, staging);
        retry_busy(|| {
            let (mut n, req) = (self.node(), req.clone());
            async move { n.node_unstage_volume(req).await }
        })
        .await
        .unwrap_or_else(|s| panic!("NodeUnstageVolume {volume_id}: {s:?}"));
    }

    pub async fn publish(&self, volume_id: &str, staging: &Path, target: &Path, readonly: bool) {
        self.node()
            .node_publish_volume(publish_req(volume_id, staging, target, readonly))
            .await
            .unwrap_or_else(|s| panic!("NodePublishVolume {volume_id}: {s:?}"));
    }

    /// NodeUnpublishVolume (retried while the mount is transiently busy).
    pub async fn unpublish(&self, volume_id: &str, target: &Path) {
        let req = unpublish_req(volume_id, target);
        retry_busy(|| {
            let (mut n, req) = (self.node(), req.clone());
            async move { n.node_unpublish_volume(req).await }
        })
        .await
        .unwrap_or_else(|s| panic!("NodeUnpublishVolume {volume_id}: {s:?}"));
    }

    pub async fn delete(&self, volume_id: &str) {
        self.controller()
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: volume_id.to_owned(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("DeleteVolume {volume_id}: {s:?}"));
    }

    /// Every volume ListVolumes reports (following next_token).
    /// The ids of every volume ListVolumes returns, in its order.
    pub async fn list_ids(&self) -> Vec<String> {
        self.list_all()
            .await
            .into_iter()
            .map(|v| v.volume_id)
            .collect()
    }

    pub async fn list_all(&self) -> Vec<csi::Volume> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let r = self
                .controller()
                .list_volumes(csi::ListVolumesRequest {
                    max_entries: 0,
                    starting_token: token,
                })
                .await
                .unwrap_or_else(|s| panic!("ListVolumes: {s:?}"))
                .into_inner();
            out.extend(r.entries.into_iter().filter_map(|e| e.volume));
            if r.next_token.is_empty() {
                return out;
            }
            token = r.next_token;
        }
    }

    /// GetCapacity of a pool (None: the default pool) for mount access.
    pub async fn capacity(&self, pool: Option<&str>) -> csi::GetCapacityResponse {
        let mut parameters = HashMap::new();
        if let Some(p) = pool {
            parameters.insert("pool".to_owned(), p.to_owned());
        }
        self.controller()
            .get_capacity(csi::GetCapacityRequest {
                volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
                parameters,
                accessible_topology: None,
            })
            .await
            .unwrap_or_else(|s| panic!("GetCapacity: {s:?}"))
            .into_inner()
    }

    /// Mounts (from /proc/self/mountinfo) whose mount point lies in this
    /// driver's temp dir.
    pub fn mounts_below_dir(&self) -> Vec<MountLine> {
        mounts()
            .into_iter()
            .filter(|m| m.mount_point.starts_with(&self.root))
            .collect()
    }

    /// Unmounts everything below the temp dir, and any bind of something inside
    /// it mounted elsewhere; deepest first. Returns what could not be unmounted.
    fn unmount_leftovers(&self) -> Vec<MountLine> {
        // Where the temp dir is inside its filesystem: a bind of anything below
        // that, wherever it is mounted, is ours too.
        let here = locate(&self.root);
        let ours = |m: &MountLine| {
            m.mount_point.starts_with(&self.root)
                || here
                    .as_ref()
                    .is_some_and(|(dev, root)| m.dev == *dev && m.root.starts_with(root))
        };
        for _ in 0..256 {
            // Deepest mount point first (umount takes the top of a stack).
            let Some(m) = mounts()
                .into_iter()
                .filter(&ours)
                .max_by_key(|m| m.mount_point.components().count())
            else {
                return Vec::new();
            };
            use nix::mount::{umount2, MntFlags};
            if umount2(&m.mount_point, MntFlags::empty()).is_err() {
                let _ = umount2(&m.mount_point, MntFlags::MNT_DETACH);
            }
        }
        mounts().into_iter().filter(&ours).collect()
    }
}

/// Runs an unmounting call again (a few times, briefly) while it fails with
/// EBUSY. umount(2) is EBUSY while anything holds a reference into the mount,
/// even for an instant: another program on the machine walking every mount
/// (df, a monitoring agent) is enough. kubelet retries such failures; so do the
/// tests, and the error stands if the mount stays busy.
pub async fn retry_busy<T, F, Fut>(mut call: F) -> Result<Response<T>, Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Response<T>, Status>>,
{
    let mut tries = 0;
    loop {
        match call().await {
            Err(s) if s.code() == Code::Internal && s.message().contains("busy") && tries < 10 => {
                tries += 1;
                eprintln!("retrying after a transiently busy mount: {}", s.message());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    signal_pid(child.id() as i32, sig);
}

/// Sends `sig` to `pid`, ignoring a process that is already gone.
pub fn signal_pid(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.csi = None;
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- driver log ({}) ----\n{}\n---- end of driver log ----",
                self.log_path().display(),
                self.log_tail(80)
            );
        }
        let left = self.unmount_leftovers();
        if !left.is_empty() {
            // Never let TempDir's recursive removal walk through a mount.
            let kept = self.dir.take().map(|d| d.keep());
            eprintln!(
                "WARNING: could not unmount {:?}; leaving {:?} in place",
                left.iter().map(|m| &m.mount_point).collect::<Vec<_>>(),
                kept
            );
        }
        // TempDir's drop removes the directory.
    }
}

// ---------------------------------------------------------------------------
// Request builders
// ---------------------------------------------------------------------------

pub fn mount_cap(mode: Mode) -> csi::VolumeCapability {
    mount_cap_flags(mode, &[])
}

pub fn mount_cap_flags(mode: Mode, flags: &[&str]) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: String::new(),
                mount_flags: flags.iter().map(|s| s.to_string()).collect(),
                volume_mount_group: String::new(),
            },
        )),
    }
}

/// A raw block capability, single-node writer: what the LVM tests mostly ask for.
pub fn blk() -> csi::VolumeCapability {
    block_cap(Mode::SingleNodeWriter)
}

pub fn block_cap(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
    }
}

/// A mount capability with a raw (possibly invalid) access mode number.
pub fn mount_cap_raw_mode(mode: i32) -> csi::VolumeCapability {
    let mut c = mount_cap(Mode::SingleNodeWriter);
    c.access_mode = Some(csi::volume_capability::AccessMode { mode });
    c
}

pub fn range(required: i64, limit: i64) -> csi::CapacityRange {
    csi::CapacityRange {
        required_bytes: required,
        limit_bytes: limit,
    }
}

/// A topology segment naming `node`.
pub fn topology(node: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([(TOPOLOGY_KEY.to_owned(), node.to_owned())]),
    }
}

pub fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// CreateVolume for a SINGLE_NODE_WRITER mount volume without a capacity range.
pub fn create_req(name: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.to_owned(),
        volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
        ..Default::default()
    }
}

pub fn delete_req(volume_id: &str) -> csi::DeleteVolumeRequest {
    csi::DeleteVolumeRequest {
        volume_id: volume_id.to_owned(),
        ..Default::default()
    }
}

pub fn stage_req(volume_id: &str, staging: &Path) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume_id.to_owned(),
        staging_target_path: path_str(staging),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

pub fn unstage_req(volume_id: &str, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: volume_id.to_owned(),
        staging_target_path: path_str(staging),
    }
}

pub fn publish_req(
    volume_id: &str,
    staging: &Path,
    target: &Path,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        staging_target_path: path_str(staging),
        target_path: path_str(target),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        readonly,
        ..Default::default()
    }
}

/// NodePublishVolume of a CSI ephemeral inline volume as kubelet sends it
/// (CSIDriver `podInfoOnMount: true`): no staging path, the pod's
/// information and `csi.storage.k8s.io/ephemeral: "true"` in the volume
/// context beside the pod's `volumeAttributes` (`attrs`).
pub fn ephemeral_publish_req(
    volume_id: &str,
    target: &Path,
    attrs: &[(&str, &str)],
) -> csi::NodePublishVolumeRequest {
    let mut ctx = params(&[
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("csi.storage.k8s.io/pod.name", "scratch-pod"),
        ("csi.storage.k8s.io/pod.namespace", "default"),
        (
            "csi.storage.k8s.io/pod.uid",
            "0b4c5c4e-8f4f-4d0e-9d52-3a3c1c8f0001",
        ),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
    ]);
    ctx.extend(params(attrs));
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: path_str(target),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        volume_context: ctx,
        ..Default::default()
    }
}

/// A volume handle of the form kubelet gives ephemeral inline volumes
/// (`csi-` and 64 hex digits of a hash of the pod and the volume's name).
pub fn ephemeral_handle(n: u8) -> String {
    format!("csi-{}", format!("{n:02x}").repeat(32))
}

pub fn unpublish_req(volume_id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: path_str(target),
    }
}

pub fn stats_req(volume_id: &str, path: &Path) -> csi::NodeGetVolumeStatsRequest {
    csi::NodeGetVolumeStatsRequest {
        volume_id: volume_id.to_owned(),
        volume_path: path_str(path),
        staging_target_path: String::new(),
    }
}

pub fn path_str(p: &Path) -> String {
    p.to_str().expect("test paths are UTF-8").to_owned()
}

// ---------------------------------------------------------------------------
// Assertions
// ---------------------------------------------------------------------------

/// Asserts that an RPC failed with `want`; returns the status.
#[track_caller]
pub fn assert_code<T: Debug>(what: &str, res: Result<Response<T>, Status>, want: Code) -> Status {
    must_fail(what, res.map(Response::into_inner), want)
}

/// Like [`assert_code`], for a result already out of its `Response`.
#[track_caller]
pub fn must_fail<T: Debug>(what: &str, res: Result<T, Status>, want: Code) -> Status {
    match res {
        Ok(v) => panic!("{what}: expected {want:?}, got OK: {v:?}"),
        Err(s) => {
            assert_eq!(
                s.code(),
                want,
                "{what}: expected {want:?}, got {:?}: {}",
                s.code(),
                s.message()
            );
            s
        }
    }
}

/// Unwraps an RPC result with a readable panic.
#[track_caller]
pub fn ok<T>(what: &str, res: Result<Response<T>, Status>) -> T {
    must(what, res.map(Response::into_inner))
}

/// The file `name` in `dir` holds exactly `want` (a mismatch shows both when
/// they are short, else their lengths: a device's worth of bytes is no message).
#[track_caller]
pub fn assert_file(dir: &Path, name: &str, want: &[u8]) {
    let got = fs::read(dir.join(name)).unwrap_or_else(|e| panic!("reading {name} in {dir:?}: {e}"));
    if got != want {
        if got.len().max(want.len()) <= 64 {
            panic!(
                "{name} in {dir:?}: {:?}, expected {:?}",
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(want)
            );
        }
        panic!(
            "{name} in {dir:?}: content differs ({} bytes, expected {})",
            got.len(),
            want.len()
        );
    }
}

/// Like [`ok`], for a result already out of its `Response`.
#[track_caller]
pub fn must<T>(what: &str, res: Result<T, Status>) -> T {
    res.unwrap_or_else(|s| panic!("{what}: expected OK, got {:?}: {}", s.code(), s.message()))
}

// ---------------------------------------------------------------------------
// The mount table
// ---------------------------------------------------------------------------

/// One line of /proc/self/mountinfo (parsed here, independently of the driver).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountLine {
    /// Mount ids are reused as soon as a mount goes away: compare with
    /// [`MountLine::same_mount`], not by id alone.
    pub id: u64,
    pub parent_id: u64,
    /// `major:minor`.
    pub dev: String,
    /// Path of the mount's source inside its filesystem.
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options (`rw,nosuid,noexec,relatime`).
    pub options: Vec<String>,
}

impl MountLine {
    /// Whether two lines (of two reads of the table) are the same mount.
    pub fn same_mount(&self, other: &MountLine) -> bool {
        self.id == other.id
            && self.parent_id == other.parent_id
            && self.dev == other.dev
            && self.root == other.root
            && self.mount_point == other.mount_point
    }

    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
    pub fn has_option(&self, o: &str) -> bool {
        self.options.iter().any(|x| x == o)
    }
}

fn unescape_mountinfo(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// The filesystem (`major:minor`) holding `path` and the path inside it.
pub fn locate(path: &Path) -> Option<(String, PathBuf)> {
    let m = mounts()
        .into_iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())?;
    let rest = path.strip_prefix(&m.mount_point).ok()?;
    Some((m.dev.clone(), m.root.join(rest)))
}

/// The current mount table, in mountinfo order.
pub fn mounts() -> Vec<MountLine> {
    let text = fs::read_to_string("/proc/self/mountinfo").expect("reading /proc/self/mountinfo");
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            if f.len() < 6 {
                return None;
            }
            Some(MountLine {
                id: f[0].parse().ok()?,
                parent_id: f[1].parse().ok()?,
                dev: f[2].to_owned(),
                root: unescape_mountinfo(f[3]),
                mount_point: unescape_mountinfo(f[4]),
                options: f[5].split(',').map(str::to_owned).collect(),
            })
        })
        .collect()
}

/// The mounts stacked at exactly `path`, bottom first.
pub fn mounts_at(path: &Path) -> Vec<MountLine> {
    mounts()
        .into_iter()
        .filter(|m| m.mount_point == path)
        .collect()
}

/// The top mount at `path`, if any.
pub fn mount_at(path: &Path) -> Option<MountLine> {
    mounts_at(path).pop()
}

/// A mount-table snapshot to diff against later.
///
/// Other tests (and other programs on the machine) mount things concurrently in
/// the same mount namespace, so only mounts that concern the given roots
/// count: mounted below one of them, or mounting something from inside one of
/// them (a bind of a volume, wherever it lands, has its source in the pool).
pub struct MountSnapshot {
    before: Vec<MountLine>,
}

impl MountSnapshot {
    pub fn take() -> Self {
        Self { before: mounts() }
    }

    /// Mounts that appeared since the snapshot and concern one of `roots`.
    pub fn new_mounts(&self, roots: &[&Path]) -> Vec<MountLine> {
        let sources: Vec<(String, PathBuf)> = roots.iter().filter_map(|r| locate(r)).collect();
        mounts()
            .into_iter()
            .filter(|m| !self.before.iter().any(|b| b.same_mount(m)))
            .filter(|m| {
                roots.iter().any(|r| m.mount_point.starts_with(r))
                    || sources
                        .iter()
                        .any(|(dev, root)| m.dev == *dev && m.root.starts_with(root))
            })
            .collect()
    }

    #[track_caller]
    pub fn assert_no_new_mounts(&self, roots: &[&Path], what: &str) {
        let new = self.new_mounts(roots);
        assert!(new.is_empty(), "{what}: new mounts appeared: {new:#?}");
    }
}

// ---------------------------------------------------------------------------
// Sentinels: directories outside the driver's roots that must never change
// ---------------------------------------------------------------------------

/// What a tree looks like: every entry (not following symlinks) with its type,
/// permissions and content (files) or target (symlinks).
pub type TreeSnapshot = BTreeMap<PathBuf, String>;

pub fn snapshot_tree(root: &Path) -> TreeSnapshot {
    fn walk(root: &Path, p: &Path, out: &mut TreeSnapshot) {
        let md = match fs::symlink_metadata(p) {
            Ok(md) => md,
            Err(e) => {
                out.insert(
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    format!("error {e}"),
                );
                return;
            }
        };
        let rel = p.strip_prefix(root).unwrap().to_path_buf();
        let mode = md.permissions().mode();
        let ft = md.file_type();
        let desc = if ft.is_symlink() {
            format!("symlink {:o} -> {:?}", mode, fs::read_link(p).unwrap())
        } else if ft.is_file() {
            format!("file {:o} {:?}", mode, fs::read(p).unwrap())
        } else if ft.is_dir() {
            format!("dir {:o}", mode)
        } else {
            format!("other {:o}", mode)
        };
        out.insert(rel, desc);
        if ft.is_dir() {
            let mut entries: Vec<_> = fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            entries.sort();
            for e in entries {
                walk(root, &e, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// A directory outside every driver root, filled with a few files, that bad
/// requests aim at. `check()` asserts nothing in it changed.
pub struct Sentinel {
    dir: tempfile::TempDir,
    before: TreeSnapshot,
}

impl Sentinel {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("localvol-sentinel-")
            .tempdir()
            .unwrap();
        let p = dir.path();
        fs::write(p.join("precious"), b"do not touch").unwrap();
        fs::create_dir(p.join("x")).unwrap();
        fs::write(p.join("x/inner"), b"inner data").unwrap();
        fs::create_dir(p.join("mount")).unwrap();
        fs::create_dir(p.join("empty")).unwrap();
        let before = snapshot_tree(p);
        Self { dir, before }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    #[track_caller]
    pub fn check(&self, what: &str) {
        let now = snapshot_tree(self.dir.path());
        assert_eq!(
            now, self.before,
            "{what}: the sentinel dir outside the driver changed"
        );
    }
}

impl Default for Sentinel {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        // A test that failed may have left a mount in the sentinel.
        for _ in 0..16 {
            let Some(m) = mounts()
                .into_iter()
                .filter(|m| m.mount_point.starts_with(self.dir.path()))
                .max_by_key(|m| m.mount_point.components().count())
            else {
                break;
            };
            let _ = nix::mount::umount2(&m.mount_point, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

// ---------------------------------------------------------------------------
// Capability lists
// ---------------------------------------------------------------------------

pub fn controller_caps(r: &csi::ControllerGetCapabilitiesResponse) -> Vec<i32> {
    use csi::controller_service_capability::Type;
    r.capabilities
        .iter()
        .filter_map(|c| c.r#type.map(|Type::Rpc(rpc)| rpc.r#type))
        .collect()
}

pub fn node_caps(r: &csi::NodeGetCapabilitiesResponse) -> Vec<i32> {
    use csi::node_service_capability::Type;
    r.capabilities
        .iter()
        .filter_map(|c| c.r#type.map(|Type::Rpc(rpc)| rpc.r#type))
        .collect()
}

/// Writes a file through `dir` and syncs it.
/// statvfs: the total bytes of the filesystem at `path`.
pub fn fs_total(path: &Path) -> i64 {
    let s = nix::sys::statvfs::statvfs(path).unwrap_or_else(|e| panic!("statvfs {path:?}: {e}"));
    (s.blocks() * s.fragment_size()) as i64
}

/// Writes dirty pages back, then drops the page cache, so the next read of
/// a device or file comes from the device itself (root; the VM tests).
pub fn drop_caches() {
    nix::unistd::sync();
    fs::write("/proc/sys/vm/drop_caches", "3").expect("writing /proc/sys/vm/drop_caches");
}

pub fn write_file(dir: &Path, name: &str, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = fs::File::create(dir.join(name))?;
    f.write_all(data)?;
    f.sync_all()
}

// ---------------------------------------------------------------------------
// Loop devices and filesystems on them (VM tests: quotas, LVM)
// ---------------------------------------------------------------------------

/// Runs an external program; panics with its output when it fails.
#[track_caller]
pub fn run_cmd(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e} (is it installed?)"));
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Creates (or truncates) `path` as a sparse file of `bytes` bytes.
pub fn sparse_file(path: &Path, bytes: u64) {
    let f = fs::File::create(path).unwrap_or_else(|e| panic!("creating {path:?}: {e}"));
    f.set_len(bytes)
        .unwrap_or_else(|e| panic!("sizing {path:?}: {e}"));
}

/// A loop device over a sparse image file. Drop detaches it (the kernel
/// detaches it once unused if it is still mounted then).
pub struct LoopDevice {
    pub image: PathBuf,
    pub path: PathBuf,
}

impl LoopDevice {
    /// Creates a sparse `bytes`-byte image at `image` and attaches it.
    pub fn create(image: &Path, bytes: u64) -> Self {
        sparse_file(image, bytes);
        Self::attach(image)
    }

    /// Attaches an existing image file.
    pub fn attach(image: &Path) -> Self {
        let out = run_cmd("losetup", &["--find", "--show", &path_str(image)]);
        let path = PathBuf::from(out.trim());
        assert!(
            out.starts_with("/dev/loop"),
            "losetup printed {out:?} for {image:?}"
        );
        Self {
            image: image.to_path_buf(),
            path,
        }
    }

    /// `major:minor`, as /proc/self/mountinfo shows it.
    pub fn dev(&self) -> String {
        use std::os::unix::fs::MetadataExt;
        let rdev = fs::metadata(&self.path).unwrap().rdev();
        format!(
            "{}:{}",
            nix::sys::stat::major(rdev),
            nix::sys::stat::minor(rdev)
        )
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup")
            .arg("-d")
            .arg(&self.path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Filesystems the tests make on loop devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsKind {
    Xfs,
    Ext4,
}

impl FsKind {
    pub const ALL: [FsKind; 2] = [FsKind::Xfs, FsKind::Ext4];

    pub fn name(self) -> &'static str {
        match self {
            FsKind::Xfs => "xfs",
            FsKind::Ext4 => "ext4",
        }
    }

    /// The mkfs command line that prepares an image for project quotas (ext4:
    /// the `project` and `quota` features, 256-byte inodes to hold the id;
    /// XFS needs nothing at mkfs time).
    fn mkfs(self, image: &Path) -> (&'static str, Vec<String>) {
        let image = path_str(image);
        match self {
            FsKind::Xfs => ("mkfs.xfs", vec!["-q".into(), "-f".into(), image]),
            FsKind::Ext4 => (
                "mkfs.ext4",
                ["-q", "-F", "-b", "4096", "-I", "256", "-O", "project,quota"]
                    .iter()
                    .map(|s| s.to_string())
                    .chain([image])
                    .collect(),
            ),
        }
    }
}

impl std::fmt::Display for FsKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A fresh filesystem on a loop device over a sparse image, mounted at
/// `mount_point`. Drop unmounts it (lazily when busy) and detaches the device.
///
/// Mounted below a [`Driver`]'s dir, declare it after the driver in a struct
/// (fields drop in order): the driver's cleanup then unmounts it and removes
/// the image with its temp dir.
pub struct LoopFs {
    pub kind: FsKind,
    pub mount_point: PathBuf,
    pub device: LoopDevice,
}

impl LoopFs {
    /// Formats a `bytes`-byte image at `image` (XFS needs at least 300 MiB)
    /// and mounts it at `mount_point` (created if missing) with `options`
    /// (`-o`, comma-separated; empty for none).
    pub fn create(
        kind: FsKind,
        image: &Path,
        bytes: u64,
        mount_point: &Path,
        options: &str,
    ) -> Self {
        sparse_file(image, bytes);
        let (mkfs, args) = kind.mkfs(image);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_cmd(mkfs, &args);
        let device = LoopDevice::attach(image);
        fs::create_dir_all(mount_point).unwrap();
        let dev = path_str(&device.path);
        let mp = path_str(mount_point);
        let mut args = vec!["-t", kind.name()];
        if !options.is_empty() {
            args.extend(["-o", options]);
        }
        args.extend([dev.as_str(), mp.as_str()]);
        run_cmd("mount", &args);
        Self {
            kind,
            mount_point: mount_point.to_path_buf(),
            device,
        }
    }

    /// Mounts of this filesystem (the mount itself and any bind of it).
    pub fn mounts(&self) -> Vec<MountLine> {
        let dev = self.device.dev();
        mounts().into_iter().filter(|m| m.dev == dev).collect()
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        use nix::mount::{umount2, MntFlags};
        for _ in 0..64 {
            let Some(m) = self
                .mounts()
                .into_iter()
                .max_by_key(|m| m.mount_point.components().count())
            else {
                break;
            };
            if umount2(&m.mount_point, MntFlags::empty()).is_err() {
                let _ = umount2(&m.mount_point, MntFlags::MNT_DETACH);
            }
        }
        // `device` drops next and detaches the loop device.
    }
}

// ---------------------------------------------------------------------------
// LVM volume groups on loop devices (VM tests: tests/vm/vm_lvm.rs)
// ---------------------------------------------------------------------------

/// Whether device-mapper works here: in the project's VM, not on hosts whose
/// kernel lacks it.
pub fn has_device_mapper() -> bool {
    Path::new("/dev/mapper/control").exists()
        && Command::new("dmsetup")
            .arg("version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// One logical volume as `lvs` reports it (parsed here, independently of the
/// driver's own parser).
#[derive(Clone, Debug, PartialEq)]
pub struct LvRow {
    pub name: String,
    pub size: i64,
    pub tags: Vec<String>,
    pub attr: String,
    pub pool_lv: String,
    pub origin: String,
    pub data_percent: Option<f64>,
    /// `lv_device_open`: something holds the device open.
    pub open: bool,
}

impl LvRow {
    pub fn is_active(&self) -> bool {
        self.attr.chars().nth(4) == Some('a')
    }
}

/// A volume group on a loop device over a sparse image in its own temp dir
/// (tmpfs in the VM), with an optional thin pool `tp`. Drop unmounts whatever
/// is mounted from its LVs, removes the VG, the PV and the loop device, so a
/// failed test leaves nothing behind. Declare it before the [`Driver`] (locals
/// drop in reverse order), or after it in a struct.
pub struct LoopVg {
    pub vg: String,
    pub thin_pool: Option<String>,
    device: Option<LoopDevice>,
    _dir: tempfile::TempDir,
}

impl LoopVg {
    /// A VG of `bytes` (sparse), with a thin pool of `thin_pool_bytes` if given.
    pub fn create(bytes: u64, thin_pool_bytes: Option<u64>) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        assert!(
            has_device_mapper(),
            "no device-mapper in this kernel: LVM tests run in the VM (make test-vm)"
        );
        let dir = tempfile::Builder::new()
            .prefix("localvol-vg-")
            .tempdir()
            .unwrap();
        let device = LoopDevice::create(&dir.path().join("pv.img"), bytes);
        let mut me = Self {
            vg: format!(
                "lvt{}n{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
            thin_pool: None,
            device: Some(device),
            _dir: dir,
        };
        // vgcreate makes the PV too (one lvm call: they are slow in the VM).
        run_cmd("lvm", &["vgcreate", "-qq", &me.vg, &me.pv()]);
        if let Some(b) = thin_pool_bytes {
            let tp = format!("{}/tp", me.vg);
            run_cmd(
                "lvm",
                &["lvcreate", "-qq", "-y", "-T", "-L", &format!("{b}b"), &tp],
            );
            me.thin_pool = Some("tp".into());
        }
        me
    }

    /// The loop device under the VG.
    pub fn pv(&self) -> String {
        path_str(&self.device.as_ref().expect("loop device").path)
    }

    /// `/dev/<vg>/<lv>`.
    pub fn dev_path(&self, lv: &str) -> PathBuf {
        PathBuf::from(format!("/dev/{}/{lv}", self.vg))
    }

    /// Every LV of the VG (`lvs` without `-a`: no hidden LVs).
    pub fn lvs(&self) -> Vec<LvRow> {
        let out = run_cmd(
            "lvm",
            &[
                "lvs",
                "--reportformat",
                "json",
                "--units",
                "b",
                "--nosuffix",
                "-o",
                "lv_name,lv_size,lv_tags,lv_attr,pool_lv,origin,data_percent,lv_device_open",
                &self.vg,
            ],
        );
        let v: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("lvs printed no JSON ({e}): {out}"));
        let s = |l: &serde_json::Value, k: &str| l[k].as_str().unwrap_or_default().to_owned();
        v["report"][0]["lv"]
            .as_array()
            .map(|a| a.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|l| LvRow {
                name: s(l, "lv_name"),
                size: s(l, "lv_size").parse().expect("lv_size in bytes"),
                tags: s(l, "lv_tags")
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned)
                    .collect(),
                attr: s(l, "lv_attr"),
                pool_lv: s(l, "pool_lv"),
                origin: s(l, "origin"),
                data_percent: s(l, "data_percent").parse().ok(),
                open: s(l, "lv_device_open") == "open",
            })
            .collect()
    }

    pub fn lv(&self, name: &str) -> Option<LvRow> {
        self.lvs().into_iter().find(|l| l.name == name)
    }

    /// (`vg_size`, `vg_free`, `vg_extent_size`) in bytes.
    pub fn vg_sizes(&self) -> (i64, i64, i64) {
        let out = run_cmd(
            "lvm",
            &[
                "vgs",
                "--noheadings",
                "--units",
                "b",
                "--nosuffix",
                "--separator",
                ":",
                "-o",
                "vg_size,vg_free,vg_extent_size",
                &self.vg,
            ],
        );
        let n: Vec<i64> = out
            .trim()
            .split(':')
            .map(|x| x.trim().parse().expect("vgs number"))
            .collect();
        (n[0], n[1], n[2])
    }
}

/// Runs a command, true when it succeeded; output discarded (cleanup steps
/// whose failure the caller handles or may ignore).
pub fn quiet(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Drop for LoopVg {
    fn drop(&mut self) {
        // Unmount whatever a failed test left mounted from this VG's LVs: the
        // dm devices named `<vg>-...` (this VG's name has no '-').
        let prefix = format!("{}-", self.vg);
        if let Ok(dir) = fs::read_dir("/sys/block") {
            let devs: Vec<String> = dir
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    fs::read_to_string(p.join("dm/name")).is_ok_and(|n| n.starts_with(&prefix))
                })
                .filter_map(|p| Some(fs::read_to_string(p.join("dev")).ok()?.trim().to_owned()))
                .collect();
            for _ in 0..64 {
                let Some(m) = mounts()
                    .into_iter()
                    .filter(|m| devs.contains(&m.dev))
                    .max_by_key(|m| m.mount_point.components().count())
                else {
                    break;
                };
                use nix::mount::{umount2, MntFlags};
                if umount2(&m.mount_point, MntFlags::empty()).is_err() {
                    let _ = umount2(&m.mount_point, MntFlags::MNT_DETACH);
                }
            }
        }
        // Deactivating is enough: the metadata goes with the image file, and
        // it is cheaper than vgremove (each lvm call is slow in the VM).
        if !quiet("lvm", &["vgchange", "-qq", "-an", &self.vg]) {
            eprintln!(
                "WARNING: vgchange -an {} failed; removing its dm devices",
                self.vg
            );
            // dm names are `<vg>-<lv>` (this VG's name has no '-').
            let prefix = format!("{}-", self.vg);
            if let Ok(out) = Command::new("dmsetup")
                .args(["ls"])
                .stderr(Stdio::null())
                .output()
            {
                for name in String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter_map(|l| l.split_whitespace().next())
                    .filter(|n| n.starts_with(&prefix))
                {
                    let _ = Command::new("dmsetup")
                        .args(["remove", "--force", name])
                        .stdin(Stdio::null())
                        .status();
                }
            }
            quiet("lvm", &["vgchange", "-qq", "-an", &self.vg]);
        }
        // The loop device detaches when `device` drops, and the image goes
        // with the temp dir.
        self.device.take();
    }
}

// ---------------------------------------------------------------------------
// LVM scenarios run against a thick and a thin pool (tests/vm/vm_lvm.rs,
// tests/vm/vm_snapshots.rs)
// ---------------------------------------------------------------------------

/// A filesystem size mkfs.xfs accepts: it refuses those below 300 MiB.
pub const XFS_SIZE: i64 = 320 * MI;

/// The two kinds of LVM pool every VM scenario runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LvmKind {
    Thick,
    Thin,
}

/// `thick_and_thin!(a, b)` defines `mod thick_and_thin` with one test per
/// scenario (`async fn(LvmKind)` beside the invocation), each running it
/// against a thick and a thin pool at once: lvm commands are slow under TCG
/// and the VM has two vCPUs. The tests are ignored on the host; `make test-vm`
/// runs them in the VM.
#[macro_export]
macro_rules! thick_and_thin {
    ($($scenario:ident),* $(,)?) => {
        mod thick_and_thin {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs device-mapper: run by make test-vm in the VM"]
                async fn $scenario() {
                    $crate::on_thick_and_thin(
                        concat!(module_path!(), "::", stringify!($scenario)),
                        super::$scenario,
                    )
                    .await
                }
            )*
        }
    };
}

/// Runs `scenario` for both kinds concurrently; fails (naming the kind and
/// its panic) when either failed. Prints how long each took (shown with
/// `--nocapture`; the total VM time is budgeted).
pub async fn on_thick_and_thin<F, Fut>(name: &str, scenario: F)
where
    F: Fn(LvmKind) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let runs: Vec<_> = [LvmKind::Thick, LvmKind::Thin]
        .into_iter()
        .map(|kind| {
            let (label, run) = (format!("{name}::{kind:?}"), scenario(kind));
            let task = tokio::spawn(async move {
                let start = Instant::now();
                run.await;
                eprintln!("{label} took {:.1?}", start.elapsed());
            });
            (kind, task)
        })
        .collect();
    let mut failed = Vec::new();
    for (kind, task) in runs {
        if let Err(e) = task.await {
            let why = match e.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into()),
                Err(e) => e.to_string(),
            };
            failed.push(format!("{kind:?}: {why}"));
        }
    }
    assert!(failed.is_empty(), "{name} failed:\n{}", failed.join("\n"));
}

/// The LV of a localvol volume id (`<pool>.<key>` → `lv-<key>`).
pub fn lv_name(volume_id: &str) -> String {
    let (_, key) = volume_id
        .rsplit_once('.')
        .unwrap_or_else(|| panic!("{volume_id:?} is not a localvol volume id"));
    format!("lv-{key}")
}

/// Every process's pid and argv, from /proc (those that end meanwhile are
/// skipped).
pub fn processes() -> Vec<(i32, Vec<String>)> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmdline = fs::read(e.path().join("cmdline")).ok()?;
            let argv = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, argv))
        })
        .collect()
}

/// Whether process `pid` is gone (or a zombie).
pub fn exited(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

// ---------------------------------------------------------------------------
// Self-tests of the harness: the checks above must be able to fail.
// ---------------------------------------------------------------------------

/// Writes `data` at `offset` of a device (or file) and syncs it.
pub fn write_at(dev: &Path, offset: u64, data: &[u8]) {
    use std::io::Write as _;
    let mut f = fs::OpenOptions::new().write(true).open(dev).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

/// `len` bytes at `offset` of a device (or file).
pub fn read_at(dev: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = fs::File::open(dev).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact(&mut b).unwrap();
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(
            unescape_mountinfo(r"/mnt/with\040space\011tab\134back"),
            PathBuf::from("/mnt/with space\ttab\\back")
        );
        assert_eq!(
            unescape_mountinfo(r"/plain\04"),
            PathBuf::from(r"/plain\04")
        );
    }

    #[test]
    fn the_mount_table_is_read() {
        let all = mounts();
        assert!(all.iter().any(|m| m.mount_point == Path::new("/")));
        assert!(locate(Path::new("/etc")).is_some());
    }

    #[test]
    fn crate_version_matches_the_binary() {
        let v = crate_version();
        assert!(!v.is_empty());
        let out = Command::new(localvol_bin())
            .arg("--version")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.trim().ends_with(&v), "{text:?} vs {v}");
    }

    #[test]
    fn sentinel_notices_changes() {
        for change in [
            |p: &Path| fs::write(p.join("precious"), b"changed").unwrap(),
            |p: &Path| fs::write(p.join("new"), b"").unwrap(),
            |p: &Path| fs::remove_dir(p.join("empty")).unwrap(),
            |p: &Path| fs::set_permissions(p.join("x"), fs::Permissions::from_mode(0o700)).unwrap(),
        ] {
            let s = Sentinel::new();
            s.check("untouched");
            change(s.path());
            let r = catch_unwind(AssertUnwindSafe(|| s.check("changed")));
            assert!(r.is_err(), "a change went unnoticed");
        }
    }

    #[tokio::test]
    async fn mount_snapshot_and_driver_cleanup() {
        require_root();
        use nix::mount::{mount, MsFlags};
        let d = Driver::start_default().await;
        let s = Sentinel::new();
        let snap = MountSnapshot::take();
        let roots = [d.dir(), s.path()];
        assert!(snap.new_mounts(&roots).is_empty());

        // A bind of the sentinel into the driver's dir, and of the driver's pool
        // to the sentinel: both count, and both are cleaned up by Drop.
        let into = d.kubelet_dir().join("pods");
        let out = s.path().join("mount");
        let bind = |src: &Path, dst: &Path| {
            mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap()
        };
        bind(&s.path().join("x"), &into);
        bind(&d.volumes_dir(), &out);
        bind(&d.volumes_dir(), &out); // stacked
        let new = snap.new_mounts(&roots);
        assert_eq!(new.len(), 3, "{new:#?}");
        // Neither root is affected by a mount elsewhere.
        assert!(snap
            .new_mounts(&[Path::new("/nonexistent-root")])
            .is_empty());

        let dir = d.dir().to_path_buf();
        drop(d);
        assert!(!dir.exists(), "temp dir left behind");
        assert!(mounts_at(&into).is_empty());
        assert!(
            mounts_at(&out).is_empty(),
            "bind of the pool elsewhere left behind"
        );
        // The sentinel's content survived the driver's cleanup.
        assert_eq!(fs::read(s.path().join("x/inner")).unwrap(), b"inner data");
    }
}
