//! The driver process: [`Driver`] starts `localvol serve` in a temp dir of its
//! own, waits for it, stops, kills and restarts it, and cleans up on drop.
//! Its paths and log are in `paths.rs`, its convenience calls in `calls.rs`.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use localvol::csi;
use localvol::csi::controller_client::ControllerClient;
use localvol::csi::identity_client::IdentityClient;
use localvol::csi::node_client::NodeClient;
use localvol::endpoint::Endpoint;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use crate::opts::yaml_str;
use crate::{localvol_bin, signal_pid, DriverOpts, DIR_PREFIX};

mod calls;
mod paths;

/// How long a driver gets to answer Probe with ready=true after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a SIGTERMed driver gets to exit.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long [`Driver::kill9_then`] waits for the killed driver's programs
/// to end (an lvm run may take minutes in a loaded VM).
const PROGRAMS_WAIT: Duration = Duration::from_secs(600);

/// What becomes of the programs a killed driver was running
/// ([`Driver::kill9_then`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Programs {
    /// They run to their end (lvm, cryptsetup, mkfs complete what they
    /// began), before the driver starts again.
    Finish,
    /// They die with the driver, as the processes of a container die with
    /// its first process.
    Kill,
}

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
            if let Some(on) = &p.require_mount_point {
                y.push_str(&format!("    requireMountPoint: {on}\n"));
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
        // Pools looked at often, so that tests see a change within a
        // fraction of a second (a test's own env may say otherwise).
        cmd.env("LOCALVOL_POOL_CHECK_INTERVAL", "0.1");
        // A scrape shows what the pools are now, however slow lvm is in a
        // busy VM: tests compare the gauges with what they just did.
        cmd.env("LOCALVOL_METRICS_WAIT", "600");
        for (k, v) in &self.opts.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if self.opts.own_process_group {
            // With every program it runs: see [`Driver::kill9_then`].
            cmd.process_group(0);
        }
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

    /// Kills the driver alone with SIGKILL (no chance to clean up) and reaps
    /// it. The programs it runs are left to run on (see [`Driver::kill9_then`]).
    pub fn kill9(&mut self) {
        self.csi = None;
        let mut child = self.child.take().expect("driver is not running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the driver with SIGKILL, then waits until no program it ran
    /// runs any more, letting them finish ([`Programs::Finish`]) or killing
    /// them ([`Programs::Kill`]), so that none can change the node under the
    /// driver started next. Returns the programs that ran at the kill
    /// (`name[pid]`).
    pub fn kill9_then(&mut self, programs: Programs) -> Vec<String> {
        assert!(
            self.opts.own_process_group,
            "kill9_then needs DriverOpts::own_process_group (the driver's programs are found by \
             its process group)"
        );
        self.csi = None;
        let mut child = self.child.take().expect("driver is not running");
        let pgid = child.id() as i32;
        let group = nix::unistd::Pid::from_raw(pgid);
        let kill = nix::sys::signal::Signal::SIGKILL;
        let running: Vec<String> = crate::group_members(pgid)
            .into_iter()
            .filter(|(pid, _)| *pid != pgid)
            .map(|(pid, comm)| format!("{comm}[{pid}]"))
            .collect();
        match programs {
            Programs::Kill => {
                let _ = nix::sys::signal::killpg(group, kill);
            }
            Programs::Finish => {
                let _ = child.kill();
            }
        }
        let _ = child.wait();
        let deadline = Instant::now() + PROGRAMS_WAIT;
        loop {
            let left = crate::group_members(pgid);
            if left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the killed driver's programs still run after {PROGRAMS_WAIT:?}: {left:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        running
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

impl Drop for Driver {
    fn drop(&mut self) {
        self.csi = None;
        if let Some(mut child) = self.child.take() {
            // Its programs too (a failed test may leave one stalled).
            let kill = match self.opts.own_process_group {
                true => nix::sys::signal::killpg,
                false => nix::sys::signal::kill,
            };
            let _ = kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- driver log ({}) ----\n{}\n---- end of driver log ----",
                self.log_path().display(),
                self.log_tail(80)
            );
            // The whole log, where it outlives the test's temp dir (the VM's
            // /tmp goes with the guest): `FAULT_DIAG_DIR`.
            if let Some(dir) = std::env::var_os("FAULT_DIAG_DIR") {
                let to = Path::new(&dir).join(format!(
                    "driver-{}-{}.log",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis())
                ));
                match fs::copy(self.log_path(), &to) {
                    Ok(_) => eprintln!("the whole driver log: {}", to.display()),
                    Err(e) => eprintln!("could not copy the driver log to {}: {e}", to.display()),
                }
            }
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
