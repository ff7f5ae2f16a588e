//! Counters that layers below the metrics write and `metrics` reads: lvm
//! runs, counted per caller and subcommand for `/metrics`
//! (`localvol_lvm_runs_total`), and the longest run per subcommand
//! (`localvol_lvm_run_seconds_max`). A leaf module of its own, so that `lvm`'s
//! runner can count into it while `metrics` (which reads the pools, which
//! call `lvm`) renders it, without an import cycle.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

tokio::task_local! {
    /// What the running task works for (an RPC's method, `wipe`, `metrics`,
    /// ...), set by [`attributed`]: each lvm run is counted under it.
    static CALLER: &'static str;
}

/// lvm runs so far, by (caller, subcommand): process starts are what an LVM
/// volume's lifecycle costs, so they are counted, not estimated
/// (`localvol_lvm_runs_total` on /metrics, read by `vm/bench-lvm`).
static RUNS: Mutex<BTreeMap<(&'static str, &'static str), u64>> = Mutex::new(BTreeMap::new());

/// Runs `f` with its lvm runs counted under `caller` (runs outside any such
/// scope count under `other`). Tasks that `f` spawns are not covered.
pub async fn attributed<F: Future>(caller: &'static str, f: F) -> F::Output {
    CALLER.scope(caller, f).await
}

/// Every (caller, subcommand, runs) counted so far (`metrics` reads them).
pub fn lvm_runs() -> Vec<(&'static str, &'static str, u64)> {
    let runs = RUNS.lock().unwrap_or_else(|e| e.into_inner());
    runs.iter().map(|(&(c, s), &n)| (c, s, n)).collect()
}

/// Counts one lvm run of subcommand `sub` (`lvm`'s runner names it: one of
/// a few, or `other`) under the running task's caller.
pub fn count_lvm_run(sub: &'static str) {
    let caller = CALLER.try_with(|c| *c).unwrap_or("other");
    let mut runs = RUNS.lock().unwrap_or_else(|e| e.into_inner());
    *runs.entry((caller, sub)).or_default() += 1;
}

/// The longest lvm run so far, in ms, by subcommand: what lvm costs at
/// worst on this node (a busy node's lvm waits for CPU, disks and the VG
/// lock), which the run limits follow (`localvol_lvm_run_seconds_max`).
static SLOWEST_MS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

/// Records that one run of subcommand `sub` took `took` (a killed run: its
/// limit).
pub fn record_lvm_duration(sub: &'static str, took: Duration) {
    let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
    let mut slowest = SLOWEST_MS.lock().unwrap_or_else(|e| e.into_inner());
    let m = slowest.entry(sub).or_default();
    *m = (*m).max(ms);
}

/// Every (subcommand, seconds of its longest run so far).
pub fn slowest_lvm_runs() -> Vec<(&'static str, f64)> {
    let slowest = SLOWEST_MS.lock().unwrap_or_else(|e| e.into_inner());
    slowest
        .iter()
        .map(|(&s, &ms)| (s, ms as f64 / 1000.0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_are_counted_by_caller_and_subcommand() {
        let counted = |caller, sub| {
            lvm_runs()
                .into_iter()
                .find(|&(c, s, _)| c == caller && s == sub)
                .map_or(0, |r| r.2)
        };
        attributed("test-caller", async {
            count_lvm_run("lvs");
            count_lvm_run("lvs");
            count_lvm_run("other");
        })
        .await;
        count_lvm_run("vgs");
        assert_eq!(counted("test-caller", "lvs"), 2);
        assert_eq!(counted("test-caller", "other"), 1);
        assert_eq!(
            counted("test-caller", "vgs"),
            0,
            "counted outside the scope"
        );
    }

    #[test]
    fn the_longest_run_per_subcommand_is_kept() {
        let slowest = |sub| {
            slowest_lvm_runs()
                .into_iter()
                .find(|&(s, _)| s == sub)
                .map(|r| r.1)
        };
        record_lvm_duration("test-slow", Duration::from_millis(1500));
        record_lvm_duration("test-slow", Duration::from_millis(200));
        assert_eq!(slowest("test-slow"), Some(1.5));
        record_lvm_duration("test-slow", Duration::from_secs(75));
        assert_eq!(slowest("test-slow"), Some(75.0));
        assert_eq!(slowest("test-never-run"), None);
    }
}
