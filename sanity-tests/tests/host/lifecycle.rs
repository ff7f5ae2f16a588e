//! Whole volume lifecycles with real data, across driver restarts and crashes.

use std::fs;
use std::path::Path;

use localvol::csi;
use sanity_tests::*;
use tonic::Code;

#[track_caller]
fn assert_single_mount(path: &Path) {
    let n = mounts_at(path).len();
    assert_eq!(n, 1, "{path:?} has {n} mounts");
}

#[tokio::test]
async fn full_lifecycle_with_data() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("life", 10 * MI).await;
    let id = v.volume_id.as_str();
    let data = d.volume_data_dir(id);
    let staging = d.staging_path("life");
    let target = d.target_path("life");

    d.stage(id, &staging).await;
    d.publish(id, &staging, &target, false).await;
    write_file(&target, "file.txt", b"first write").unwrap();
    fs::create_dir(target.join("sub")).unwrap();
    write_file(&target.join("sub"), "nested", &vec![42u8; 100_000]).unwrap();

    // Unpublish / re-publish.
    d.unpublish(id, &target).await;
    assert!(!target.exists());
    let target = d.target_path("life-2");
    d.publish(id, &staging, &target, false).await;
    assert_file(&target, "file.txt", b"first write");
    assert_file(&target.join("sub"), "nested", &vec![42u8; 100_000]);

    // Unstage / re-stage (to another staging path, as after a node reboot).
    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
    assert!(d.mounts_below_dir().is_empty());
    assert_file(&data, "file.txt", b"first write");
    let staging = d.staging_path("life-again");
    d.stage(id, &staging).await;
    d.publish(id, &staging, &target, false).await;
    assert_file(&target, "file.txt", b"first write");
    write_file(&target, "second.txt", b"second write").unwrap();

    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
    assert_file(&data, "second.txt", b"second write");
    d.delete(id).await;
    assert!(!data.exists(), "delete left the data dir");
    assert!(d.list_all().await.is_empty());
    assert!(d.volume_dirs("default").is_empty());
    d.delete(id).await;
    assert!(d.mounts_below_dir().is_empty());
}

#[tokio::test]
async fn state_survives_restarts_between_steps() {
    require_root();
    let mut d = Driver::start_default().await;
    let a = d.create("a", 10 * MI).await;
    let b = d.create("b", 20 * MI).await;
    let id = a.volume_id.clone();
    let staging = d.staging_path("a");
    let target = d.target_path("a");
    let cap_before = d.capacity(None).await.available_capacity;

    d.stage(&id, &staging).await;
    d.restart().await;

    // Still listed, same ids and sizes; create is still idempotent.
    let mut listed: Vec<(String, i64)> = d
        .list_all()
        .await
        .into_iter()
        .map(|v| (v.volume_id, v.capacity_bytes))
        .collect();
    listed.sort();
    let mut want = vec![
        (a.volume_id.clone(), 10 * MI),
        (b.volume_id.clone(), 20 * MI),
    ];
    want.sort();
    assert_eq!(listed, want);
    assert_eq!(d.create("a", 10 * MI).await.volume_id, id);
    assert_code(
        "create a with another size after a restart",
        d.controller()
            .create_volume(csi::CreateVolumeRequest {
                capacity_range: Some(range(30 * MI, 0)),
                ..create_req("a")
            })
            .await,
        Code::AlreadyExists,
    );
    let cap_after = d.capacity(None).await.available_capacity;
    assert!(
        (cap_before - cap_after).abs() < 64 * MI,
        "accounting changed across restart: {cap_before} -> {cap_after}"
    );

    // Still staged: staging again is a no-op, publishing works.
    d.stage(&id, &staging).await;
    assert_single_mount(&staging);
    d.publish(&id, &staging, &target, false).await;
    write_file(&target, "persist", b"written before restart").unwrap();
    d.restart().await;

    // Still published.
    d.publish(&id, &staging, &target, false).await;
    assert_single_mount(&target);
    assert_file(&target, "persist", b"written before restart");
    let stats = ok(
        "NodeGetVolumeStats after restart",
        d.node()
            .node_get_volume_stats(stats_req(&id, &target))
            .await,
    );
    assert!(!stats.volume_condition.unwrap().abnormal);
    assert_code(
        "delete while published, after a restart",
        d.controller()
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await,
        Code::FailedPrecondition,
    );

    d.unpublish(&id, &target).await;
    d.restart().await;
    d.unpublish(&id, &target).await;
    d.unstage(&id, &staging).await;
    d.restart().await;
    d.unstage(&id, &staging).await;
    assert!(d.mounts_below_dir().is_empty());
    let data = d.volume_data_dir(&id);
    assert_file(&data, "persist", b"written before restart");
    d.delete(&id).await;
    d.restart().await;
    let left: Vec<String> = d.list_ids().await;
    assert_eq!(left, std::slice::from_ref(&b.volume_id));
    assert!(!data.exists());
}

#[tokio::test]
async fn state_survives_a_crash() {
    require_root();
    let mut d = Driver::start_default().await;
    let v = d.create("crash", 0).await;
    let id = v.volume_id.clone();
    let staging = d.staging_path("crash");
    let target = d.target_path("crash");
    d.stage(&id, &staging).await;
    d.publish(&id, &staging, &target, false).await;
    write_file(&target, "f", b"before the crash").unwrap();

    d.kill9();
    assert!(d.socket_path().exists(), "SIGKILL cannot remove the socket");
    // The mounts outlive the driver: they belong to the kernel.
    assert_single_mount(&staging);
    assert_single_mount(&target);
    assert_file(&target, "f", b"before the crash");
    d.start_again().await; // replaces the stale socket

    assert_eq!(d.list_all().await.len(), 1);
    d.stage(&id, &staging).await;
    d.publish(&id, &staging, &target, false).await;
    assert_single_mount(&staging);
    assert_single_mount(&target);
    d.unpublish(&id, &target).await;
    d.kill9();
    d.start_again().await;
    d.unstage(&id, &staging).await;
    assert!(d.mounts_below_dir().is_empty());
    d.delete(&id).await;
    assert!(d.list_all().await.is_empty());

    // A graceful stop removes the socket.
    d.stop().await;
    assert!(!d.socket_path().exists(), "socket left after SIGTERM");
}

#[tokio::test]
async fn restart_cleans_up_interrupted_writes() {
    let mut d = Driver::start_default().await;
    let v = d.create("done", 0).await;
    d.stop().await;

    // A create that crashed after making its directory but before its record,
    // and a record write that crashed before its rename.
    let key = localvol::ids::VolumeName::parse("interrupted")
        .unwrap()
        .key();
    let volumes = d.volumes_dir();
    fs::create_dir(volumes.join(key.as_str())).unwrap();
    let tmp = volumes.join(format!(".{}.json.tmp.999.0", key.as_str()));
    fs::write(&tmp, b"{ half a rec").unwrap();
    d.start_again().await;

    assert!(!tmp.exists(), "temp record not cleaned up at start");
    let ids: Vec<String> = d.list_ids().await;
    assert_eq!(
        ids,
        std::slice::from_ref(&v.volume_id),
        "a directory without a record is no volume"
    );

    // Retrying the create completes it; deleting it removes the directory.
    let again = d.create("interrupted", 0).await;
    assert!(again.volume_id.ends_with(key.as_str()));
    assert_eq!(d.list_all().await.len(), 2);
    d.delete(&again.volume_id).await;
    assert!(!volumes.join(key.as_str()).exists());
    assert_eq!(d.volume_dirs("default").len(), 1);
}

#[tokio::test]
async fn delete_of_an_interrupted_create_removes_its_directory() {
    let d = Driver::start_default().await;
    let key = localvol::ids::VolumeName::parse("half").unwrap().key();
    let dir = d.volumes_dir().join(key.as_str());
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("junk"), b"x").unwrap();
    d.delete(&format!("default.{}", key.as_str())).await;
    assert!(!dir.exists());
}

#[tokio::test]
async fn a_pool_shrunk_below_its_volumes_reports_zero_not_negative() {
    let mut d = Driver::start(DriverOpts::with_pool(PoolOpts::new("p").capacity("64Mi"))).await;
    let v = d.create("big", 40 * MI).await;
    d.stop().await;
    d.opts.pools[0].capacity = Some("32Mi".into());
    d.start_again().await;
    let cap = d.capacity(None).await;
    assert_eq!(cap.available_capacity, 0, "{cap:?}");
    assert!(cap.maximum_volume_size.unwrap_or(0) >= 0, "{cap:?}");
    let listed = d.list_all().await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].volume_id, v.volume_id);
    assert_eq!(listed[0].capacity_bytes, 40 * MI);
    assert_code(
        "create in an overfull pool",
        d.controller()
            .create_volume(csi::CreateVolumeRequest {
                capacity_range: Some(range(MI, 0)),
                ..create_req("more")
            })
            .await,
        Code::ResourceExhausted,
    );
    // Idempotent repeat of the existing volume still answers.
    assert_eq!(d.create("big", 40 * MI).await.volume_id, v.volume_id);
    d.delete(&v.volume_id).await;
    assert_eq!(d.capacity(None).await.available_capacity, 32 * MI);
}
