//! `localvol bench` end to end: the real bench binary against the real driver
//! (lifecycles, the transport floor and the node-scale scenarios, including
//! those that start the driver themselves), and the syscall floor. Checks that the
//! report counts what ran and that nothing is left behind; timings themselves
//! are not asserted (they belong in the issue notes, not in tests).

use std::path::Path;
use std::process::Command;

use sanity_tests::*;
use serde_json::Value;

/// The node-scale scenarios report (and these tests compare) the length of
/// the mount table, which is the whole host's and which every test here
/// changes as it stages and publishes: the tests take turns. Run in
/// parallel, a level with more volumes published could read fewer mount
/// lines than the level before it (seen once in CI).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let _turn = ONE_AT_A_TIME.lock().await;
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
    let _turn = ONE_AT_A_TIME.lock().await;
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

/// Runs `localvol bench <args>` (a scenario) and returns its JSON report.
fn scenario(args: &[&str]) -> Value {
    scenario_logged(args, None)
}

/// [`scenario`], showing the log of a driver the bench started if it fails.
fn scenario_logged(args: &[&str], driver_log: Option<&Path>) -> Value {
    // `--json` right after the scenario's name: whatever follows `--` is the
    // driver's command line.
    let out = Command::new(localvol_bin())
        .arg("bench")
        .args(&args[..1])
        .arg("--json")
        .args(&args[1..])
        .env_remove("CSI_ENDPOINT")
        .output()
        .expect("running localvol bench");
    assert!(
        out.status.success(),
        "localvol bench {args:?}: {}\n{}\ndriver log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        driver_log
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .unwrap_or_default()
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bench output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

async fn assert_nothing_left(d: &Driver) {
    assert!(d.list_all().await.is_empty(), "volumes left behind");
    assert!(d.mounts_below_dir().is_empty(), "mounts left behind");
}

/// The node-scale scenarios against a running driver: each reports what it
/// measured, and unpublishes, unstages and deletes everything it made.
#[tokio::test]
async fn scenarios_report_and_leave_nothing() {
    require_root();
    let _turn = ONE_AT_A_TIME.lock().await;
    let d = Driver::start_default().await;
    let endpoint = d.endpoint.to_string();
    let work = d.kubelet_dir().join("bench");
    std::fs::create_dir(&work).unwrap();
    let work_s = work.to_str().unwrap();
    let common = [
        "--endpoint",
        &endpoint,
        "--work-dir",
        work_s,
        "--rounds",
        "1",
    ];

    let args = [
        &["node-scale"][..],
        &common,
        &["--published", "1,3", "--samples", "2"],
    ]
    .concat();
    let r = scenario(&args);
    assert_eq!(r["mode"], "node-scale");
    let levels = r["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2, "{r}");
    assert_eq!(levels[1]["published"], 3);
    assert!(
        levels[1]["mount_lines"].as_f64().unwrap() > levels[0]["mount_lines"].as_f64().unwrap()
    );
    assert!(
        levels[0]["stage_publish_p50_ms"].as_f64().unwrap() > 0.0,
        "{r}"
    );
    assert_nothing_left(&d).await;

    let args = [
        &["stats"][..],
        &common,
        &["--published", "2", "--calls", "10"],
    ]
    .concat();
    let r = scenario(&args);
    assert_eq!(r["mode"], "stats");
    assert_eq!(r["rounds"][0]["count"], 10);
    assert_nothing_left(&d).await;

    let args = [
        &["churn"][..],
        &common,
        &[
            "--volumes",
            "20",
            "--concurrency",
            "4",
            "--page",
            "7",
            "--passes",
            "1",
            "--server-pid",
            "auto",
        ],
    ]
    .concat();
    let r = scenario(&args);
    assert_eq!(r["mode"], "churn");
    let round = &r["rounds"][0];
    assert_eq!(round["listed"], 20, "{r}");
    assert_eq!(round["pages_per_pass"], 3, "{r}");
    assert!(round["rss_bytes"].as_u64().unwrap() > 1 << 20, "{r}");
    assert!(
        round["rss_after_list_bytes"].as_u64().unwrap() > 1 << 20,
        "{r}"
    );
    assert_nothing_left(&d).await;
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "run dirs left"
    );
}

/// `restart` and `sweep` start the driver themselves (the command after
/// `--`), stop it at the end, and delete what they made.
#[tokio::test]
async fn scenarios_start_their_own_driver() {
    require_root();
    let _turn = ONE_AT_A_TIME.lock().await;
    let t = tempfile::tempdir().unwrap();
    let (pool, kubelet) = (t.path().join("pool"), t.path().join("kubelet"));
    std::fs::create_dir_all(kubelet.join("bench")).unwrap();
    let config = t.path().join("pools.yaml");
    std::fs::write(
        &config,
        format!(
            "pools:\n  - name: default\n    type: dir\n    path: {}\n",
            pool.display()
        ),
    )
    .unwrap();
    let endpoint = format!("unix://{}", t.path().join("csi.sock").display());
    let bin = localvol_bin();
    let driver = [
        "--",
        bin.to_str().unwrap(),
        "serve",
        "--endpoint",
        &endpoint,
        "--config",
        config.to_str().unwrap(),
        "--kubelet-dir",
        kubelet.to_str().unwrap(),
        "--node-id",
        "bench-node",
    ];
    let work = kubelet.join("bench");
    let common = [
        "--endpoint",
        &endpoint,
        "--work-dir",
        work.to_str().unwrap(),
    ];

    let args = [
        &["restart"][..],
        &common,
        &["--volumes", "30", "--rounds", "2"],
        &driver,
    ]
    .concat();
    let log = work.join("driver.log");
    let r = scenario_logged(&args, Some(&log));
    assert_eq!(r["mode"], "restart");
    let rounds = r["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2, "{r}");
    for round in rounds {
        assert_eq!(round["listed"], 30, "{r}");
        assert!(round["serving_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(round["rss_bytes"].as_u64().unwrap() > 1 << 20, "{r}");
    }

    let args = [
        &["sweep"][..],
        &common,
        &["--concurrency", "1,2", "--volumes", "4", "--rounds", "1"],
        &driver,
    ]
    .concat();
    let r = scenario_logged(&args, Some(&log));
    assert_eq!(r["mode"], "sweep");
    let levels = r["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2, "{r}");
    for l in levels {
        assert!(l["lifecycles_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            l["peak_rss_bytes"].as_f64().unwrap() > f64::from(1 << 20),
            "{r}"
        );
    }
    // Every volume was deleted through the last driver; nothing is mounted.
    let records = std::fs::read_dir(pool.join("volumes")).unwrap().count();
    assert_eq!(records, 0, "volumes left in the pool");
    assert!(mounts()
        .iter()
        .all(|m| !m.mount_point.starts_with(t.path())));
    assert_eq!(
        std::fs::read_dir(&work)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_dir())
            .count(),
        0,
        "run dirs left"
    );
}
