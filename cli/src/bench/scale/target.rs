//! The driver under test: already serving at `--endpoint`, or started by
//! the bench (waited for until Probe answers ready, stopped at the end), and
//! its resident set.

use super::*;

/// The driver under test: connected clients, its pid when known, and the
/// process when the bench started it.
pub(super) struct Target {
    pub(super) clients: Clients,
    pub(super) pid: Option<u32>,
    pub(super) running: Option<Running>,
    pub(super) stage_unstage: bool,
    /// How long the started driver took from exec to its first ready Probe.
    pub(super) serving: Option<Duration>,
}

impl Target {
    /// Starts the driver when `--` gave one, else connects to `--endpoint`.
    pub(super) async fn open(c: &Common, log_dir: &Path) -> Result<Target, String> {
        let timeout = Duration::from_secs(c.timeout.max(1));
        let (clients, pid, running, serving) = if c.driver.is_empty() {
            let channel = client::connect(&c.endpoint)
                .await
                .map_err(|e| e.to_string())?;
            let pid = match c.server_pid {
                None => None,
                Some(ServerPid::Pid(p)) => Some(p),
                Some(ServerPid::Auto) => Some(crate::bench::socket_peer_pid(&c.endpoint).await?),
            };
            (Clients::new(channel, timeout), pid, None, None)
        } else {
            let (running, clients, serving) = start_driver(c, log_dir, timeout).await?;
            (clients, running.pid(), Some(running), Some(serving))
        };
        let stage_unstage = crate::bench::has_stage_unstage(&clients).await?;
        Ok(Target {
            clients,
            pid,
            running,
            stage_unstage,
            serving,
        })
    }

    /// Stops a driver the bench started.
    pub(super) async fn close(self) -> Result<(), String> {
        if let Some(r) = self.running {
            r.stop(Duration::from_secs(30))
                .await
                .map_err(|e| format!("stopping the driver: {e}"))?;
        }
        Ok(())
    }

    /// The driver's (current RSS, peak RSS), when its pid is known.
    pub(super) fn rss(&self) -> Result<Option<(u64, u64)>, String> {
        match self.pid {
            None => Ok(None),
            Some(p) => Ok(Some((status_bytes(p, "VmRSS:")?, read_peak_rss(p)?))),
        }
    }
}

/// Starts `c.driver` and waits until it answers Probe with ready (not false).
/// Returns the process, clients on a fresh connection, and the time from
/// the start to that answer.
pub(super) async fn start_driver(
    c: &Common,
    log_dir: &Path,
    timeout: Duration,
) -> Result<(Running, Clients, Duration), String> {
    let (program, args) = c
        .driver
        .split_first()
        .ok_or_else(|| "no driver command after --".to_owned())?;
    if let Endpoint::Unix(sock) = &c.endpoint {
        // A socket left by an earlier run would answer "connection refused"
        // until the driver replaces it: not a reason to wait less.
        let _ = std::fs::remove_file(sock);
    }
    let log = log_dir.join("driver.log");
    let start = Instant::now();
    let mut running = Cmd::new(program)
        .args(args)
        .start(Some(&log))
        .map_err(|e| format!("starting the driver: {e}"))?;
    loop {
        if let Some(status) = running.exited() {
            return Err(format!(
                "the driver exited ({status}) before serving; see {log:?}"
            ));
        }
        if let Ok(channel) = c.endpoint.connect().await {
            let clients = Clients::new(channel, timeout);
            let mut identity = clients.identity.clone();
            let probe = client::call(timeout, csi::ProbeRequest {}, |r| identity.probe(r)).await;
            if probe.is_ok_and(|p| p.ready != Some(false)) {
                return Ok((running, clients, start.elapsed()));
            }
        }
        if start.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "the driver did not serve at {} within 120 s; see {log:?}",
                c.endpoint
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
