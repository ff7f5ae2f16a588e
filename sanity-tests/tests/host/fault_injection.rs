//! Fault injection (issue 15), dir pool on the host: C workers run whole
//! volume lifecycles (CreateVolume → NodeStage → NodePublish → write a file
//! through the target → NodeUnpublish → NodeUnstage → DeleteVolume, about a
//! quarter of the volumes kept) while a killer SIGKILLs the driver at random
//! moments and restarts it on the same socket at once. Workers retry each step
//! with the same request on UNAVAILABLE / ABORTED / DEADLINE_EXCEEDED and on
//! connection errors, as kubelet and the sidecars do; any other error is a
//! failure. Afterwards nothing may be leaked and nothing lost. The workers
//! and the killer are `sanity_tests::faults`, shared with `vm_faults.rs`.
//!
//! Knobs (environment):
//!   FAULT_SEED          replay a run (the seed is printed at the start)
//!   FAULT_KILLS         kills at least (default 200)
//!   FAULT_CONCURRENCY   workers (default 4)
//!   FAULT_MINUTES       also keep killing until this many minutes passed (soak)
//!   FAULT_MAX_KEPT      keep at most this many volumes (default 1000): a
//!                       soak's pool must not fill up
//!   FAULT_KILL_WINDOW_MS  a kill lands 0..this ms after the driver is ready
//!                       (default 120; one kill in four: 0..8 times this)
//!
//! `make soak` runs this with larger counts.

use std::collections::BTreeSet;

use sanity_tests::faults::{self, entries, Knobs, Plan};
use sanity_tests::*;

/// `<key>.json.<pid>.<n>`: a record a delete renamed into the pool's
/// `deleted/` (kept for reuse by later creates; a start removes them all).
fn is_retired_record(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match name.split_once(".json.") {
        Some((key, rest)) => {
            key.len() == 32
                && key.bytes().all(|b| b.is_ascii_hexdigit())
                && rest
                    .split_once('.')
                    .is_some_and(|(p, n)| digits(p) && digits(n))
        }
        None => false,
    }
}

/// The pool holds exactly these volumes: `<key>/` and `<key>.json` each, and
/// nothing else (no temp file, no half-made leftover). Its `deleted/` holds
/// nothing, or (`retired_ok`: the driver deleted volumes since it started)
/// only retired records.
fn assert_pool_holds(d: &Driver, ids: &BTreeSet<String>, retired_ok: bool, when: &str) {
    let mut want: Vec<String> = Vec::new();
    for id in ids {
        let key = id.rsplit_once('.').expect("a localvol volume id").1;
        want.push(key.to_owned());
        want.push(format!("{key}.json"));
    }
    want.sort();
    let got = entries(&d.volumes_dir());
    assert_eq!(got, want, "{when}: the pool's volumes dir");
    for id in ids {
        assert!(
            d.volume_data_dir(id).is_dir(),
            "{when}: {id}'s data dir is not a directory"
        );
    }
    // Beside volumes/, only the pool's own dir for deleted volumes, and that
    // one empty, and the pool's id file (no temp file of it: a kill while
    // it was first written leaves one, which the next start removes).
    let pool = d.pool_dir("default");
    let top = entries(&pool);
    for e in &top {
        assert!(
            e == "volumes" || e == "deleted" || e == ".localvol-pool-id",
            "{when}: stray entry {e:?} in the pool dir {pool:?} ({top:?})"
        );
    }
    if pool.join("deleted").exists() {
        let left = entries(&pool.join("deleted"));
        if retired_ok {
            let stray: Vec<&String> = left.iter().filter(|n| !is_retired_record(n)).collect();
            assert!(
                stray.is_empty(),
                "{when}: stray files in the pool's deleted/: {stray:?}"
            );
        } else {
            assert!(
                left.is_empty(),
                "{when}: left in the pool's deleted/: {left:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dir_pool_survives_random_kills_mid_lifecycle() {
    require_root();
    let knobs = Knobs::from_env(200, 4, 120, 1000);
    let seed = knobs.seed;
    eprintln!(
        "fault_injection: seed {seed} (replay with FAULT_SEED={seed}), kills >= {}, \
         concurrency {}, minutes >= {}, kill window {} ms",
        knobs.kills, knobs.concurrency, knobs.minutes, knobs.window_ms
    );
    let started = std::time::Instant::now();

    let mut d = Driver::start(DriverOpts {
        own_process_group: true,
        ..DriverOpts::with_pool(PoolOpts::new("default").default_size("1Mi"))
    })
    .await;
    let plan = Plan::plain(MI);
    let out = faults::kill_campaign("fault_injection", &mut d, plan.clone(), &knobs).await;
    let kept = out.kept;

    // One last kill and restart, with no call in flight: what follows reads
    // the state a fresh process loads from disk.
    d.kill9();
    d.start_again().await;

    // ListVolumes equals the kept set.
    let listed: BTreeSet<String> = d.list_ids().await.into_iter().collect();
    let want: BTreeSet<String> = kept.keys().cloned().collect();
    assert_eq!(
        listed, want,
        "seed {seed}: ListVolumes against the kept set"
    );
    // No mount left under the kubelet dir (nor anywhere below the driver's dir).
    let left = d.mounts_below_dir();
    assert!(left.is_empty(), "seed {seed}: mounts left: {left:#?}");
    assert_pool_holds(&d, &want, false, &format!("seed {seed}, after the kills"));

    // Every kept volume, re-staged and re-published, has its file.
    faults::verify_and_delete_kept(&format!("seed {seed}"), &d, &plan, &kept).await;
    assert!(
        d.list_all().await.is_empty(),
        "seed {seed}: volumes listed after deleting all"
    );
    assert!(
        d.mounts_below_dir().is_empty(),
        "seed {seed}: mounts left at the end"
    );
    assert_pool_holds(
        &d,
        &BTreeSet::new(),
        true,
        &format!("seed {seed}, at the end"),
    );
    // A clean restart clears the retired records: the pool is empty.
    d.restart().await;
    assert!(
        d.list_all().await.is_empty(),
        "seed {seed}: volumes listed after a restart"
    );
    assert_pool_holds(
        &d,
        &BTreeSet::new(),
        false,
        &format!("seed {seed}, restarted at the end"),
    );
    let status = d.stop().await;
    assert!(status.success(), "seed {seed}: exit on SIGTERM: {status}");
    faults::assert_no_panic(&d);
    eprintln!(
        "fault_injection: seed {seed}: {} kept volumes verified and deleted; {:.1?} in all",
        kept.len(),
        started.elapsed()
    );
}
