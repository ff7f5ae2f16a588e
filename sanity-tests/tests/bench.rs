//! `localvol bench` end to end: the real bench binary against the real driver
//! (lifecycles and the transport floor), and the syscall floor. Checks that the
//! report counts what ran and that nothing is left behind; timings themselves
//! are not asserted (they belong in the issue notes, not in tests).

use std::path::Path;
use std::process::Command;

use sanity_tests::*;
use serde_json::Value;

/// Runs `localvol bench --json` with `args` and returns the report.
fn bench(endpoint: &str, work_dir: &Path, args: &[&str]) -> Value {
    let out = Command::new(localvol_bin())
        .args(["bench", "--endpoint", endpoint, "--json", "--work-dir"])
        .arg(work_dir)
        .args(args)
        .env_remove("CSI_ENDPOINT")
        .output()
        .expect("running localvol bench");
    assert!(
        out.status.success(),
        "localvol bench {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bench output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn rpc_keys(report: &Value) -> Vec<String> {
    let mut keys: Vec<String> = report["rpc"]
        .as_object()
        .expect("rpc object")
        .keys()
        .cloned()
        .collect();
    keys.sort();
    keys
}

#[track_caller]
fn assert_counts(report: &Value, n: u64) {
    assert_eq!(report["lifecycle"]["count"], n, "{report}");
    for (step, s) in report["rpc"].as_object().unwrap() {
        assert_eq!(s["count"], n, "{step}: {report}");
        let (p50, p99) = (s["p50_ms"].as_f64().unwrap(), s["p99_ms"].as_f64().unwrap());
        assert!(p50 > 0.0 && p50 <= p99, "{step}: {report}");
    }
    assert!(report["lifecycles_per_sec"].as_f64().unwrap() > 0.0);
}

#[tokio::test]
async fn bench_drives_lifecycles_and_leaves_nothing() {
    require_root();
    let d = Driver::start_default().await;
    let endpoint = d.endpoint.to_string();
    let work = d.kubelet_dir().join("bench");
    std::fs::create_dir(&work).unwrap();

    let r = bench(
        &endpoint,
        &work,
        &[
            "--volumes",
            "12",
            "--concurrency",
            "3",
            "--server-pid",
            "auto",
        ],
    );
    assert_eq!(r["mode"], "csi");
    assert_eq!(r["stage_unstage"], true);
    assert_counts(&r, 12);
    assert_eq!(
        rpc_keys(&r),
        [
            "CreateVolume",
            "DeleteVolume",
            "NodePublishVolume",
            "NodeStageVolume",
            "NodeUnpublishVolume",
            "NodeUnstageVolume"
        ]
    );
    // The driver's own peak RSS, found from the socket's peer.
    assert!(
        r["server_peak_rss_bytes"].as_u64().unwrap() > 1 << 20,
        "{r}"
    );
    // Every lifecycle deleted its volume and unmounted everything.
    assert!(d.list_all().await.is_empty());
    assert!(d.mounts_below_dir().is_empty());
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "run dir left");

    let r = bench(&endpoint, &work, &["--volumes", "5", "--floor-rpc"]);
    assert_eq!(r["mode"], "rpc-floor");
    assert_counts(&r, 5);
    assert_eq!(
        rpc_keys(&r),
        [
            "GetPluginInfo(Create)",
            "GetPluginInfo(Delete)",
            "GetPluginInfo(Publish)",
            "GetPluginInfo(Stage)",
            "GetPluginInfo(Unpublish)",
            "GetPluginInfo(Unstage)"
        ]
    );
    assert!(d.list_all().await.is_empty());

    let r = bench(&endpoint, &work, &["--volumes", "5", "--floor"]);
    assert_eq!(r["mode"], "floor");
    assert_counts(&r, 5);
    assert!(d.mounts_below_dir().is_empty());
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "run dir left");
}

#[tokio::test]
async fn a_failing_driver_stops_the_bench_with_its_error() {
    require_root();
    // A 4Mi pool: the second 3Mi volume does not fit.
    let d = Driver::start(DriverOpts::with_pool(PoolOpts::new("p").capacity("4Mi"))).await;
    let out = Command::new(localvol_bin())
        .args(["bench", "--endpoint", &d.endpoint.to_string(), "--work-dir"])
        .arg(d.kubelet_dir())
        .args(["--volumes", "4", "--concurrency", "2", "--size", "3Mi"])
        .env_remove("CSI_ENDPOINT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("RESOURCE_EXHAUSTED"), "{err}");
    // The failed lifecycle undid what it did; the other finished its own.
    assert!(d.list_all().await.is_empty(), "volumes left behind");
    assert!(d.mounts_below_dir().is_empty());
}
