//! Concurrent calls: one name created by many callers at once, a pool filled
//! past its capacity from many callers, and concurrent node operations on one
//! volume. The answers may only be OK or ABORTED (the CSI spec's "operation
//! pending"), never a corrupted state.

use std::collections::BTreeSet;
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::join_all;
use localvol::csi;
use sanity_tests::*;
use tonic::Code;

/// Several connections, so calls really run in parallel in the driver.
async fn clients(d: &Driver, n: usize) -> Vec<Csi> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(Csi::connect(&d.endpoint).await.expect("connecting"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundred_concurrent_creates_of_one_name() {
    let d = Driver::start_default().await;
    let cs = clients(&d, 8).await;
    let calls = (0..100).map(|i| {
        let mut c = cs[i % cs.len()].controller.clone();
        tokio::spawn(async move {
            c.create_volume(csi::CreateVolumeRequest {
                capacity_range: Some(range(4 * MI, 0)),
                ..create_req("the-one")
            })
            .await
        })
    });
    let results = join_all(calls).await;
    let mut ids = BTreeSet::new();
    let (mut oks, mut aborted) = (0, 0);
    for r in results {
        match r.unwrap() {
            Ok(resp) => {
                let v = resp.into_inner().volume.unwrap();
                assert_eq!(v.capacity_bytes, 4 * MI);
                ids.insert(v.volume_id);
                oks += 1;
            }
            Err(s) if s.code() == Code::Aborted => aborted += 1,
            Err(s) => panic!("unexpected answer {:?}: {}", s.code(), s.message()),
        }
    }
    assert!(oks >= 1, "no call succeeded ({aborted} aborted)");
    assert_eq!(ids.len(), 1, "several ids for one name: {ids:?}");
    let listed = d.list_all().await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(&listed[0].volume_id, ids.iter().next().unwrap());
    assert_eq!(d.volume_dirs("default").len(), 1);
    // Exactly the volume's directory and record: no temp files left over.
    let entries: Vec<_> = fs::read_dir(d.volumes_dir()).unwrap().collect();
    assert_eq!(entries.len(), 2, "{entries:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_never_overcommit_a_pool() {
    let d = Driver::start(DriverOpts::with_pool(
        PoolOpts::new("small").capacity("64Mi"),
    ))
    .await;
    let cs = clients(&d, 5).await;

    // Watch GetCapacity while the creates run.
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        let mut c = cs[0].controller.clone();
        tokio::spawn(async move {
            let mut seen = 0;
            while !done.load(Ordering::Relaxed) || seen == 0 {
                let r = c
                    .get_capacity(csi::GetCapacityRequest::default())
                    .await
                    .expect("GetCapacity")
                    .into_inner();
                assert!(
                    (0..=64 * MI).contains(&r.available_capacity),
                    "GetCapacity out of bounds: {r:?}"
                );
                seen += 1;
            }
            seen
        })
    };
    let calls = (0..20).map(|i| {
        let mut c = cs[i % cs.len()].controller.clone();
        tokio::spawn(async move {
            c.create_volume(csi::CreateVolumeRequest {
                capacity_range: Some(range(10 * MI, 0)),
                ..create_req(&format!("fill-{i}"))
            })
            .await
        })
    });
    let results = join_all(calls).await;
    done.store(true, Ordering::Relaxed);
    assert!(watcher.await.unwrap() > 0);

    let mut total = 0;
    let mut oks = 0;
    for r in results {
        match r.unwrap() {
            Ok(resp) => {
                total += resp.into_inner().volume.unwrap().capacity_bytes;
                oks += 1;
            }
            Err(s) if s.code() == Code::ResourceExhausted => {}
            Err(s) => panic!("unexpected answer {:?}: {}", s.code(), s.message()),
        }
    }
    assert!(
        total <= 64 * MI,
        "overcommitted: {oks} volumes, {total} bytes"
    );
    assert!(oks >= 1, "nothing fit");
    let listed = d.list_all().await;
    assert_eq!(listed.len(), oks);
    assert_eq!(listed.iter().map(|v| v.capacity_bytes).sum::<i64>(), total);
    assert_eq!(d.volume_dirs("small").len(), oks);
    let cap = d.capacity(None).await;
    assert!(
        cap.available_capacity >= 0 && cap.available_capacity <= 64 * MI - total,
        "{cap:?}"
    );
    assert!(
        cap.available_capacity < 10 * MI,
        "a create was refused although it fit: {cap:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_of_distinct_names_all_succeed() {
    let d = Driver::start_default().await;
    let cs = clients(&d, 4).await;
    let calls = (0..30).map(|i| {
        let mut c = cs[i % cs.len()].controller.clone();
        tokio::spawn(async move { c.create_volume(create_req(&format!("distinct-{i}"))).await })
    });
    for r in join_all(calls).await {
        ok("CreateVolume", r.unwrap());
    }
    assert_eq!(d.list_all().await.len(), 30);
    assert_eq!(d.volume_dirs("default").len(), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_node_operations_on_one_volume() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("busy", 0).await;
    let id = v.volume_id.clone();
    let staging = d.staging_path("busy");
    let target = d.target_path("busy");
    let cs = clients(&d, 4).await;

    #[track_caller]
    fn ok_or_aborted<T>(
        what: &str,
        results: Vec<Result<tonic::Response<T>, tonic::Status>>,
    ) -> usize {
        let mut oks = 0;
        for r in results {
            match r {
                Ok(_) => oks += 1,
                Err(s) if s.code() == Code::Aborted => {}
                Err(s) => panic!("{what}: unexpected answer {:?}: {}", s.code(), s.message()),
            }
        }
        assert!(oks >= 1, "{what}: no call succeeded");
        oks
    }

    // Runs `$n` copies of `$body` at once, each with its own client `$c` and
    // clones of the volume id and paths.
    macro_rules! fan_out {
        ($n:expr, |$c:ident, $id:ident, $s:ident, $t:ident| $body:expr) => {{
            let calls = (0..$n).map(|i| {
                let mut $c = cs[i % cs.len()].node.clone();
                let ($id, $s, $t) = (id.clone(), staging.clone(), target.clone());
                tokio::spawn(async move {
                    let _ = (&$id, &$s, &$t);
                    $body.await
                })
            });
            join_all(calls)
                .await
                .into_iter()
                .map(|r| r.unwrap())
                .collect::<Vec<_>>()
        }};
    }

    let r = fan_out!(20, |c, id, s, t| c.node_stage_volume(stage_req(&id, &s)));
    ok_or_aborted("NodeStageVolume", r);
    assert_eq!(mounts_at(&staging).len(), 1, "staged more than once");

    let r = fan_out!(20, |c, id, s, t| c
        .node_publish_volume(publish_req(&id, &s, &t, false)));
    ok_or_aborted("NodePublishVolume", r);
    assert_eq!(mounts_at(&target).len(), 1, "published more than once");
    write_file(&target, "f", b"x").unwrap();

    // Stats run alongside and never fail.
    let r = fan_out!(10, |c, id, s, t| c
        .node_get_volume_stats(stats_req(&id, &t)));
    for x in r {
        ok("NodeGetVolumeStats", x);
    }

    let r = fan_out!(20, |c, id, s, t| c
        .node_unpublish_volume(unpublish_req(&id, &t)));
    ok_or_aborted("NodeUnpublishVolume", r);
    d.unpublish(&id, &target).await;
    assert!(mounts_at(&target).is_empty());
    assert!(!target.exists());

    let r = fan_out!(20, |c, id, s, t| c
        .node_unstage_volume(unstage_req(&id, &s)));
    ok_or_aborted("NodeUnstageVolume", r);
    d.unstage(&id, &staging).await;
    assert!(
        d.mounts_below_dir().is_empty(),
        "{:#?}",
        d.mounts_below_dir()
    );
    assert_eq!(fs::read(d.volume_data_dir(&id).join("f")).unwrap(), b"x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_create_and_delete_of_one_name_stay_consistent() {
    let d = Driver::start_default().await;
    let cs = clients(&d, 4).await;
    let id = localvol::ids::VolumeName::parse("flip").unwrap().key();
    let vol_id = format!("default.{}", id.as_str());
    let calls = (0..60).map(|i| {
        let mut c = cs[i % cs.len()].controller.clone();
        let vol_id = vol_id.clone();
        tokio::spawn(async move {
            if i % 2 == 0 {
                c.create_volume(create_req("flip")).await.map(|_| ())
            } else {
                c.delete_volume(csi::DeleteVolumeRequest {
                    volume_id: vol_id,
                    ..Default::default()
                })
                .await
                .map(|_| ())
            }
        })
    });
    for r in join_all(calls).await {
        match r.unwrap() {
            Ok(()) => {}
            Err(s) if s.code() == Code::Aborted => {}
            Err(s) => panic!("unexpected answer {:?}: {}", s.code(), s.message()),
        }
    }
    // Either the volume exists completely (listed, directory, record) or not at all.
    let listed = d.list_all().await;
    let data = d.volume_data_dir(&vol_id);
    let record = d.volumes_dir().join(format!("{}.json", id.as_str()));
    if listed.is_empty() {
        assert!(!record.exists(), "record of an unlisted volume");
    } else {
        assert_eq!(listed[0].volume_id, vol_id);
        assert!(data.is_dir() && record.is_file());
    }
    d.delete(&vol_id).await;
    assert!(d.list_all().await.is_empty());
    assert!(fs::read_dir(d.volumes_dir()).unwrap().next().is_none());
}
