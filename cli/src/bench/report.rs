//! What a bench run reports: samples per step, nearest-rank percentiles,
//! the report as JSON or a table, and the driver's peak RSS.

use super::*;

/// Latency samples of one worker or of the whole run.
#[derive(Default, Debug)]
pub struct Samples {
    pub(super) steps: [Vec<Duration>; 6],
    pub(super) lifecycles: Vec<Duration>,
}

impl Samples {
    pub(super) fn merge(&mut self, other: Samples) {
        for (a, b) in self.steps.iter_mut().zip(other.steps) {
            a.extend(b);
        }
        self.lifecycles.extend(other.lifecycles);
    }
}

/// Nearest-rank percentile `p` (0 < p <= 100) of sorted samples.
pub fn percentile(sorted: &[Duration], p: usize) -> Duration {
    assert!(!sorted.is_empty(), "percentile of no samples");
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

/// count, p50, p90, p99 and mean of some samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub mean: Duration,
}

impl Summary {
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_unstable();
        let total: Duration = s.iter().sum();
        Some(Summary {
            count: s.len(),
            p50: percentile(&s, 50),
            p90: percentile(&s, 90),
            p99: percentile(&s, 99),
            mean: total / u32::try_from(s.len()).unwrap_or(u32::MAX),
        })
    }

    pub(super) fn json(&self) -> Value {
        json!({
            "count": self.count,
            "p50_ms": ms(self.p50),
            "p90_ms": ms(self.p90),
            "p99_ms": ms(self.p99),
            "mean_ms": ms(self.mean),
        })
    }
}

/// The result of one bench run.
#[derive(Debug)]
pub struct Report {
    pub mode: &'static str,
    pub endpoint: Option<String>,
    pub volumes: u64,
    pub concurrency: u64,
    pub stage_unstage: bool,
    pub wall: Duration,
    /// Per step: name and summary (steps without samples are left out).
    pub steps: Vec<(&'static str, Summary)>,
    pub lifecycle: Summary,
    pub server_peak_rss: Option<(u32, u64)>,
    /// LVM floor runs: where and what.
    pub lvm: Option<lvm_floor::LvmFloorInfo>,
}

impl Report {
    pub(super) fn new(
        mode: &'static str,
        names: &[&'static str; 6],
        samples: &Samples,
        wall: Duration,
    ) -> Option<Report> {
        let steps = names
            .iter()
            .zip(&samples.steps)
            .filter_map(|(n, s)| Summary::of(s).map(|sum| (*n, sum)))
            .collect();
        Some(Report {
            mode,
            endpoint: None,
            volumes: 0,
            concurrency: 0,
            stage_unstage: true,
            wall,
            steps,
            lifecycle: Summary::of(&samples.lifecycles)?,
            server_peak_rss: None,
            lvm: None,
        })
    }

    pub fn lifecycles_per_sec(&self) -> f64 {
        self.lifecycle.count as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    pub fn to_json(&self) -> Value {
        let rpc: Map<String, Value> = self
            .steps
            .iter()
            .map(|(n, s)| ((*n).to_owned(), s.json()))
            .collect();
        let mut j = json!({
            "mode": self.mode,
            "endpoint": self.endpoint,
            "volumes": self.volumes,
            "concurrency": self.concurrency,
            "stage_unstage": self.stage_unstage,
            "wall_seconds": self.wall.as_secs_f64(),
            "lifecycles_per_sec": self.lifecycles_per_sec(),
            "rpc": rpc,
            "lifecycle": self.lifecycle.json(),
            "lifecycle_p99_ms": ms(self.lifecycle.p99),
            "server_peak_rss_bytes": self.server_peak_rss.map(|(_, b)| b),
        });
        if let Some(l) = &self.lvm {
            j["lvm"] = l.json();
        }
        j
    }

    pub fn to_human(&self) -> String {
        let mut out = String::new();
        let what = match (&self.endpoint, &self.lvm) {
            (Some(e), _) if self.mode == "rpc-floor" => {
                format!("of GetPluginInfo calls only through {e} (transport floor)")
            }
            (Some(e), _) => format!("through {e}"),
            (None, Some(l)) => format!(
                "with bare lvcreate, mkfs.{} and mounts in {} (LVM floor)",
                l.fs.as_str(),
                l.target
            ),
            (None, None) => "with raw syscalls (floor)".to_owned(),
        };
        let _ = writeln!(
            out,
            "localvol bench: {} lifecycles {what}, concurrency {}{}",
            self.lifecycle.count,
            self.concurrency,
            if self.stage_unstage {
                ""
            } else {
                " (driver has no stage/unstage)"
            }
        );
        let _ = writeln!(out, "wall time    {:.3} s", self.wall.as_secs_f64());
        let _ = writeln!(
            out,
            "throughput   {:.1} lifecycles/s",
            self.lifecycles_per_sec()
        );
        let mut table = vec![["step", "count", "p50 ms", "p90 ms", "p99 ms", "mean ms"]
            .map(String::from)
            .to_vec()];
        let row = |name: &str, s: &Summary| {
            vec![
                name.to_owned(),
                s.count.to_string(),
                format!("{:.3}", ms(s.p50)),
                format!("{:.3}", ms(s.p90)),
                format!("{:.3}", ms(s.p99)),
                format!("{:.3}", ms(s.mean)),
            ]
        };
        for (n, s) in &self.steps {
            table.push(row(n, s));
        }
        table.push(row("lifecycle", &self.lifecycle));
        out.push_str(&client::columns(&table));
        if let Some((pid, b)) = self.server_peak_rss {
            let _ = writeln!(
                out,
                "server peak RSS  {} ({b} bytes, VmHWM of pid {pid})",
                human(b)
            );
        }
        out
    }
}

/// Peak RSS in bytes from the text of `/proc/PID/status` (`VmHWM:  1234 kB`).
pub fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut parts = line["VmHWM:".len()..].split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => n.checked_mul(1024),
        _ => None,
    }
}

/// Reads a process's peak RSS (bytes).
pub fn read_peak_rss(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    parse_vm_hwm(&text).ok_or_else(|| format!("{path} has no VmHWM line"))
}

/// Resets a process's peak RSS to its current RSS.
pub(super) fn reset_peak_rss(pid: u32) -> Result<(), String> {
    let path = format!("/proc/{pid}/clear_refs");
    std::fs::write(&path, "5").map_err(|e| format!("resetting the peak RSS ({path}): {e}"))
}

/// The pid of the process serving a unix socket (the one that created the
/// listening socket), from `SO_PEERCRED`.
pub(super) async fn socket_peer_pid(endpoint: &Endpoint) -> Result<u32, String> {
    let Endpoint::Unix(path) = endpoint else {
        return Err("--server-pid auto needs a unix:// endpoint; pass the pid".to_owned());
    };
    let s = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| format!("connecting to {path:?}: {e}"))?;
    let cred = s
        .peer_cred()
        .map_err(|e| format!("SO_PEERCRED on {path:?}: {e}"))?;
    match cred.pid() {
        Some(p) if p > 0 => Ok(p as u32),
        _ => Err(format!(
            "the pid behind {path:?} is not visible here (another pid namespace?); pass --server-pid PID"
        )),
    }
}
