//! Node service: NodeGetInfo, NodeGetCapabilities, stage/publish and their
//! inverses, NodeGetVolumeStats, NodeExpandVolume. Everything that mounts needs
//! root.

use std::fs;
use std::path::Path;

use localvol::csi;
use localvol::csi::node_service_capability::rpc::Type as Rpc;
use localvol::csi::volume_usage::Unit;
use sanity_tests::*;
use tonic::Code;

/// Asserts that `path` is a (single) bind mount of the volume's data dir.
#[track_caller]
fn assert_mount_of(d: &Driver, volume_id: &str, path: &Path) -> MountLine {
    let stack = mounts_at(path);
    assert_eq!(
        stack.len(),
        1,
        "{path:?}: expected one mount, got {stack:#?}"
    );
    let (dev, root) = locate(&d.volume_data_dir(volume_id)).expect("locating the data dir");
    let m = stack.into_iter().next().unwrap();
    assert_eq!(
        (m.dev.as_str(), m.root.as_path()),
        (dev.as_str(), root.as_path()),
        "{path:?} mounts something else"
    );
    m
}

#[track_caller]
fn assert_not_mounted(path: &Path) {
    let stack = mounts_at(path);
    assert!(stack.is_empty(), "{path:?} is still mounted: {stack:#?}");
}

fn erofs(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(nix::errno::Errno::EROFS as i32)
}

// --- info and capabilities -------------------------------------------------------------

#[tokio::test]
async fn node_get_info() {
    let d = Driver::start(DriverOpts {
        node_id: "worker-17".into(),
        max_volumes_per_node: 17,
        ..DriverOpts::default()
    })
    .await;
    let r = ok(
        "NodeGetInfo",
        d.node().node_get_info(csi::NodeGetInfoRequest {}).await,
    );
    assert_eq!(r.node_id, "worker-17");
    assert_eq!(r.max_volumes_per_node, 17);
    assert_eq!(r.accessible_topology, Some(topology("worker-17")));

    let d = Driver::start_default().await;
    let r = ok(
        "NodeGetInfo",
        d.node().node_get_info(csi::NodeGetInfoRequest {}).await,
    );
    assert_eq!(r.node_id, NODE_ID);
    assert_eq!(r.max_volumes_per_node, 0, "no limit configured");
    // The topology a volume gets is the node's.
    let v = d.create("v", 0).await;
    assert_eq!(
        Some(v.accessible_topology[0].clone()),
        r.accessible_topology
    );
}

#[tokio::test]
async fn node_get_capabilities() {
    let d = Driver::start_default().await;
    let r = ok(
        "NodeGetCapabilities",
        d.node()
            .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
            .await,
    );
    let mut got = node_caps(&r);
    got.sort();
    let mut want = vec![
        Rpc::StageUnstageVolume as i32,
        Rpc::GetVolumeStats as i32,
        Rpc::VolumeCondition as i32,
        Rpc::SingleNodeMultiWriter as i32,
        Rpc::ExpandVolume as i32,
    ];
    want.sort();
    assert_eq!(got, want, "{r:?}");
}

// --- stage / publish ----------------------------------------------------------------

#[tokio::test]
async fn stage_publish_unpublish_unstage_are_idempotent() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("idem", 0).await;
    let id = v.volume_id.as_str();
    let staging = d.staging_path("idem");
    let target = d.target_path("idem");

    for _ in 0..2 {
        d.stage(id, &staging).await;
        assert_mount_of(&d, id, &staging);
    }
    for _ in 0..2 {
        d.publish(id, &staging, &target, false).await;
        let m = assert_mount_of(&d, id, &target);
        assert!(!m.read_only(), "{m:?}");
    }
    write_file(&target, "hello", b"through the target").unwrap();
    assert_eq!(
        fs::read(d.volume_data_dir(id).join("hello")).unwrap(),
        b"through the target"
    );
    for _ in 0..2 {
        d.unpublish(id, &target).await;
        assert_not_mounted(&target);
        assert!(!target.exists(), "target dir not removed");
        assert_mount_of(&d, id, &staging);
    }
    for _ in 0..2 {
        d.unstage(id, &staging).await;
        assert_not_mounted(&staging);
    }
    assert!(
        d.mounts_below_dir().is_empty(),
        "{:#?}",
        d.mounts_below_dir()
    );
    assert_eq!(
        fs::read(d.volume_data_dir(id).join("hello")).unwrap(),
        b"through the target"
    );
}

#[tokio::test]
async fn publish_read_only() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("ro", 0).await;
    let id = v.volume_id.as_str();
    fs::write(d.volume_data_dir(id).join("existing"), b"old").unwrap();
    let staging = d.staging_path("ro");
    let ro = d.target_path("ro-pod");
    let rw = d.target_path("rw-pod");
    d.stage(id, &staging).await;
    d.publish(id, &staging, &ro, true).await;
    d.publish(id, &staging, &ro, true).await;
    d.publish(id, &staging, &rw, false).await;

    let m = assert_mount_of(&d, id, &ro);
    assert!(m.read_only(), "{m:?}");
    let e = fs::write(ro.join("new"), b"x").unwrap_err();
    assert!(erofs(&e), "write through a read-only target: {e}");
    let e = fs::remove_file(ro.join("existing")).unwrap_err();
    assert!(erofs(&e), "unlink through a read-only target: {e}");
    assert_eq!(fs::read(ro.join("existing")).unwrap(), b"old");

    // The read-write target of the same volume still writes; the ro one sees it.
    write_file(&rw, "new", b"from rw").unwrap();
    assert_eq!(fs::read(ro.join("new")).unwrap(), b"from rw");
    // The staging mount itself stays read-write.
    assert!(!mount_at(&staging).unwrap().read_only());

    d.unpublish(id, &ro).await;
    d.unpublish(id, &rw).await;
    d.unstage(id, &staging).await;
    assert!(d.mounts_below_dir().is_empty());
}

#[tokio::test]
async fn reader_only_access_mode_implies_read_only() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("reader", 0).await;
    let id = v.volume_id.as_str();
    let staging = d.staging_path("reader");
    let target = d.target_path("reader");
    let cap = mount_cap(AccessMode::SingleNodeReaderOnly);
    ok(
        "stage",
        d.node()
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_capability: Some(cap.clone()),
                ..stage_req(id, &staging)
            })
            .await,
    );
    ok(
        "publish",
        d.node()
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_capability: Some(cap),
                ..publish_req(id, &staging, &target, false)
            })
            .await,
    );
    assert!(assert_mount_of(&d, id, &target).read_only());
    let e = fs::write(target.join("x"), b"x").unwrap_err();
    assert!(erofs(&e), "{e}");
    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
}

#[tokio::test]
async fn publish_with_mount_flags() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("flags", 0).await;
    let id = v.volume_id.as_str();
    let staging = d.staging_path("flags");
    let target = d.target_path("flags");
    let flagged = mount_cap_flags(AccessMode::SingleNodeWriter, &["noexec", "nosuid", "nodev"]);
    ok(
        "stage with flags",
        d.node()
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_capability: Some(flagged.clone()),
                ..stage_req(id, &staging)
            })
            .await,
    );
    let publish = csi::NodePublishVolumeRequest {
        volume_capability: Some(flagged.clone()),
        ..publish_req(id, &staging, &target, false)
    };
    ok(
        "publish with flags",
        d.node().node_publish_volume(publish.clone()).await,
    );
    ok(
        "publish with flags again",
        d.node().node_publish_volume(publish).await,
    );
    let m = assert_mount_of(&d, id, &target);
    for f in ["noexec", "nosuid", "nodev"] {
        assert!(m.has_option(f), "{f} missing: {m:?}");
    }
    assert!(!m.read_only());
    write_file(&target, "f", b"x").unwrap();

    // `ro` as a mount flag is a read-only mount too.
    let ro_target = d.target_path("flags-ro");
    ok(
        "publish with ro flag",
        d.node()
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_capability: Some(mount_cap_flags(
                    AccessMode::SingleNodeWriter,
                    &["ro", "noatime"],
                )),
                ..publish_req(id, &staging, &ro_target, false)
            })
            .await,
    );
    let m = assert_mount_of(&d, id, &ro_target);
    assert!(m.read_only() && m.has_option("noatime"), "{m:?}");

    // Flags a bind mount cannot honour are refused, and nothing is mounted.
    let bad_target = d.target_path("flags-bad");
    for bad in ["bogus", "exec", "remount", "bind", "size=1G", "ro,exec"] {
        assert_code(
            bad,
            d.node()
                .node_publish_volume(csi::NodePublishVolumeRequest {
                    volume_capability: Some(mount_cap_flags(AccessMode::SingleNodeWriter, &[bad])),
                    ..publish_req(id, &staging, &bad_target, false)
                })
                .await,
            Code::InvalidArgument,
        );
        assert_not_mounted(&bad_target);
    }
    d.unpublish(id, &target).await;
    d.unpublish(id, &ro_target).await;
    d.unstage(id, &staging).await;
    assert!(d.mounts_below_dir().is_empty());
}

#[tokio::test]
async fn publish_conflicts_are_already_exists() {
    require_root();
    let d = Driver::start_default().await;
    let a = d.create("a", 0).await;
    let b = d.create("b", 0).await;
    let (sa, sb) = (d.staging_path("a"), d.staging_path("b"));
    let target = d.target_path("pod");
    d.stage(&a.volume_id, &sa).await;
    d.stage(&b.volume_id, &sb).await;
    d.publish(&a.volume_id, &sa, &target, false).await;

    assert_code(
        "same target, read-only this time",
        d.node()
            .node_publish_volume(publish_req(&a.volume_id, &sa, &target, true))
            .await,
        Code::AlreadyExists,
    );
    assert_code(
        "same target, another volume",
        d.node()
            .node_publish_volume(publish_req(&b.volume_id, &sb, &target, false))
            .await,
        Code::AlreadyExists,
    );
    let m = assert_mount_of(&d, &a.volume_id, &target);
    assert!(!m.read_only(), "the existing mount changed: {m:?}");

    // Staging another volume where one is staged.
    assert_code(
        "stage b where a is staged",
        d.node()
            .node_stage_volume(stage_req(&b.volume_id, &sa))
            .await,
        Code::AlreadyExists,
    );
    assert_mount_of(&d, &a.volume_id, &sa);

    d.unpublish(&a.volume_id, &target).await;
    d.unstage(&a.volume_id, &sa).await;
    d.unstage(&b.volume_id, &sb).await;
    assert!(d.mounts_below_dir().is_empty());
}

#[tokio::test]
async fn publish_with_another_volumes_staging_path_is_refused() {
    require_root();
    let d = Driver::start_default().await;
    let a = d.create("a", 0).await;
    let b = d.create("b", 0).await;
    fs::write(d.volume_data_dir(&a.volume_id).join("secret"), b"a's data").unwrap();
    let sa = d.staging_path("a");
    d.stage(&a.volume_id, &sa).await;
    let target = d.target_path("b-pod");
    // Volume b is not staged at sa: publishing it from there would hand a's
    // data to b's pod.
    assert_code(
        "publish b from a's staging path",
        d.node()
            .node_publish_volume(publish_req(&b.volume_id, &sa, &target, false))
            .await,
        Code::FailedPrecondition,
    );
    assert_not_mounted(&target);
    assert!(!target.join("secret").exists());
    d.unstage(&a.volume_id, &sa).await;
}

#[tokio::test]
async fn publish_before_stage_is_failed_precondition() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("unstaged", 0).await;
    let staging = d.staging_path("unstaged");
    let target = d.target_path("unstaged");
    assert_code(
        "publish, staging path missing",
        d.node()
            .node_publish_volume(publish_req(&v.volume_id, &staging, &target, false))
            .await,
        Code::FailedPrecondition,
    );
    // A staging dir that exists but holds no mount.
    fs::create_dir(&staging).unwrap();
    assert_code(
        "publish, staging path not mounted",
        d.node()
            .node_publish_volume(publish_req(&v.volume_id, &staging, &target, false))
            .await,
        Code::FailedPrecondition,
    );
    assert_not_mounted(&target);
    assert!(d.mounts_below_dir().is_empty());
}

#[tokio::test]
async fn unpublish_removes_the_target_and_tolerates_a_missing_one() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("v", 0).await;
    let id = v.volume_id.as_str();
    let staging = d.staging_path("v");
    let target = d.target_path("v");
    d.stage(id, &staging).await;
    d.publish(id, &staging, &target, false).await;
    d.unpublish(id, &target).await;
    assert!(!target.exists());
    assert!(
        target.parent().unwrap().is_dir(),
        "the parent belongs to kubelet"
    );

    // Never existed / already gone / an empty dir nobody mounted.
    d.unpublish(id, &d.target_path("never")).await;
    d.unpublish(id, &target).await;
    let empty = d.target_path("empty");
    fs::create_dir(&empty).unwrap();
    d.unpublish(id, &empty).await;
    assert!(!empty.exists());
    // A volume that does not exist (any more) and a target that is gone.
    d.unpublish("default.0123456789abcdef0123456789abcdef", &target)
        .await;
    d.unstage(id, &staging).await;
}

#[tokio::test]
async fn unpublish_and_unstage_leave_other_volumes_mounts_alone() {
    require_root();
    let d = Driver::start_default().await;
    let a = d.create("a", 0).await;
    let b = d.create("b", 0).await;
    let sa = d.staging_path("a");
    let target = d.target_path("a");
    d.stage(&a.volume_id, &sa).await;
    d.publish(&a.volume_id, &sa, &target, false).await;

    assert_code(
        "unpublish with an unknown volume id",
        d.node()
            .node_unpublish_volume(unpublish_req(
                "default.0123456789abcdef0123456789abcdef",
                &target,
            ))
            .await,
        Code::NotFound,
    );
    assert_code(
        "unpublish with another volume's id",
        d.node()
            .node_unpublish_volume(unpublish_req(&b.volume_id, &target))
            .await,
        Code::FailedPrecondition,
    );
    assert_mount_of(&d, &a.volume_id, &target);
    assert_code(
        "unstage with another volume's id",
        d.node()
            .node_unstage_volume(unstage_req(&b.volume_id, &sa))
            .await,
        Code::FailedPrecondition,
    );
    assert_mount_of(&d, &a.volume_id, &sa);
    assert_code(
        "unstage an unknown volume",
        d.node()
            .node_unstage_volume(unstage_req("default.0123456789abcdef0123456789abcdef", &sa))
            .await,
        Code::NotFound,
    );
    assert_mount_of(&d, &a.volume_id, &sa);

    d.unpublish(&a.volume_id, &target).await;
    d.unstage(&a.volume_id, &sa).await;
    assert!(d.mounts_below_dir().is_empty());
}

#[tokio::test]
async fn stage_and_publish_check_the_volume_and_capability() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("v", 0).await;
    let id = v.volume_id.as_str();
    let staging = d.staging_path("v");
    let target = d.target_path("v");
    let with_cap = |cap| csi::NodeStageVolumeRequest {
        volume_capability: Some(cap),
        ..stage_req(id, &staging)
    };
    for (what, req, code) in [
        (
            "stage unknown",
            stage_req("default.0123456789abcdef0123456789abcdef", &staging),
            Code::NotFound,
        ),
        (
            "stage unknown (not a localvol id)",
            stage_req("foreign-id", &staging),
            Code::NotFound,
        ),
        (
            "stage as block",
            with_cap(block_cap(AccessMode::SingleNodeWriter)),
            Code::InvalidArgument,
        ),
        (
            "stage with a multi-node mode",
            with_cap(mount_cap(AccessMode::MultiNodeMultiWriter)),
            Code::InvalidArgument,
        ),
    ] {
        assert_code(what, d.node().node_stage_volume(req).await, code);
    }
    assert_not_mounted(&staging);
    // The staging path's parent must exist (kubelet creates it).
    let orphan = d.kubelet_dir().join("no-such-parent").join("staging");
    assert_code(
        "stage below a missing parent",
        d.node().node_stage_volume(stage_req(id, &orphan)).await,
        Code::FailedPrecondition,
    );
    assert!(!orphan.parent().unwrap().exists());

    d.stage(id, &staging).await;
    assert_code(
        "publish unknown",
        d.node()
            .node_publish_volume(publish_req(
                "default.0123456789abcdef0123456789abcdef",
                &staging,
                &target,
                false,
            ))
            .await,
        Code::NotFound,
    );
    assert_code(
        "publish as block",
        d.node()
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_capability: Some(block_cap(AccessMode::SingleNodeWriter)),
                ..publish_req(id, &staging, &target, false)
            })
            .await,
        Code::InvalidArgument,
    );
    assert_not_mounted(&target);
    d.unstage(id, &staging).await;
    assert!(d.mounts_below_dir().is_empty());
}

#[tokio::test]
async fn two_pods_share_one_staged_volume() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("shared", 0).await;
    let id = v.volume_id.as_str();
    let staging = d.staging_path("shared");
    let (t1, t2) = (d.target_path("pod-1"), d.target_path("pod-2"));
    d.stage(id, &staging).await;
    d.publish(id, &staging, &t1, false).await;
    d.publish(id, &staging, &t2, false).await;
    write_file(&t1, "from-1", b"one").unwrap();
    write_file(&t2, "from-2", b"two").unwrap();
    assert_eq!(fs::read(t2.join("from-1")).unwrap(), b"one");
    assert_eq!(fs::read(t1.join("from-2")).unwrap(), b"two");
    d.unpublish(id, &t1).await;
    assert_eq!(fs::read(t2.join("from-1")).unwrap(), b"one");
    d.unpublish(id, &t2).await;
    d.unstage(id, &staging).await;
    assert!(d.mounts_below_dir().is_empty());
}

// --- stats and expansion --------------------------------------------------------------

fn usage(r: &csi::NodeGetVolumeStatsResponse, unit: Unit) -> csi::VolumeUsage {
    *r.usage
        .iter()
        .find(|u| u.unit == unit as i32)
        .unwrap_or_else(|| panic!("no {unit:?} usage in {r:?}"))
}

#[tokio::test]
async fn node_get_volume_stats() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("stats", 0).await;
    let id = v.volume_id.as_str();
    let staging = d.staging_path("stats");
    let target = d.target_path("stats");
    d.stage(id, &staging).await;
    d.publish(id, &staging, &target, false).await;
    write_file(&target, "data", &vec![7u8; 256 * 1024]).unwrap();

    let stats = |path: &Path| {
        let mut n = d.node();
        let req = stats_req(id, path);
        async move { n.node_get_volume_stats(req).await }
    };
    for path in [&target, &staging] {
        let r = ok("NodeGetVolumeStats", stats(path).await);
        for unit in [Unit::Bytes, Unit::Inodes] {
            let u = usage(&r, unit);
            assert!(u.total > 0, "{unit:?}: {u:?}");
            assert!(u.used >= 0 && u.available >= 0, "{unit:?}: {u:?}");
            assert!(
                u.used <= u.total && u.available <= u.total,
                "{unit:?}: {u:?}"
            );
        }
        assert!(usage(&r, Unit::Inodes).used >= 1);
        let c = r.volume_condition.expect("volume_condition");
        assert!(!c.abnormal, "{c:?}");
    }

    // The volume directory disappears behind the driver's back.
    let data = d.volume_data_dir(id);
    let aside = data.with_extension("aside");
    fs::rename(&data, &aside).unwrap();
    let r = ok("stats, data dir renamed", stats(&target).await);
    let c = r.volume_condition.expect("volume_condition");
    assert!(c.abnormal, "{c:?}");
    assert!(!c.message.is_empty());
    fs::rename(&aside, &data).unwrap();
    let r = ok("stats, data dir restored", stats(&target).await);
    assert!(!r.volume_condition.unwrap().abnormal);

    // A path that exists but is not this volume's mount.
    let plain = d.kubelet_dir().join("pods").join("not-a-mount");
    fs::create_dir_all(&plain).unwrap();
    let r = ok("stats of a plain dir", stats(&plain).await);
    assert!(
        r.volume_condition.unwrap().abnormal,
        "a plain dir is not the volume"
    );

    assert_code(
        "missing volume_path",
        stats(&d.kubelet_dir().join("pods/nope/mount")).await,
        Code::NotFound,
    );
    for unknown in ["default.0123456789abcdef0123456789abcdef", "foreign"] {
        assert_code(
            unknown,
            d.node()
                .node_get_volume_stats(stats_req(unknown, &target))
                .await,
            Code::NotFound,
        );
    }
    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
}

/// NodeGetVolumeStats tells a healthy volume without reading the mount table;
/// what others change behind the driver's back must still show: a target
/// unmounted by hand is abnormal, mounted again by hand healthy, another
/// volume mounted over it NOT_FOUND.
#[tokio::test]
async fn volume_stats_notice_mounts_changed_behind_the_drivers_back() {
    require_root();
    let d = Driver::start_default().await;
    let (v, w) = (d.create("behind-a", 0).await, d.create("behind-b", 0).await);
    let id = v.volume_id.as_str();
    let (staging, target) = (d.staging_path("behind-a"), d.target_path("behind-a"));
    d.stage(id, &staging).await;
    d.publish(id, &staging, &target, false).await;
    let condition = |r: csi::NodeGetVolumeStatsResponse| r.volume_condition.expect("condition");
    let stats = || {
        let mut n = d.node();
        let req = stats_req(id, &target);
        async move { n.node_get_volume_stats(req).await }
    };
    assert!(!condition(ok("published", stats().await)).abnormal);

    let bind = |src: &Path, at: &Path| {
        use nix::mount::{mount, MsFlags};
        mount(Some(src), at, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap()
    };
    localvol::mount::unmount(&target).unwrap();
    let c = condition(ok("target unmounted by hand", stats().await));
    assert!(c.abnormal && c.message.contains("not a mount"), "{c:?}");

    bind(&staging, &target);
    assert!(!condition(ok("mounted again by hand", stats().await)).abnormal);

    let other = d.volume_data_dir(&w.volume_id);
    bind(&other, &target);
    assert_code("another volume on top", stats().await, Code::NotFound);
    localvol::mount::unmount(&target).unwrap();
    assert!(!condition(ok("the other volume gone", stats().await)).abnormal);

    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
}

#[tokio::test]
async fn node_expand_volume() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("grow", 10 * MI).await;
    let id = v.volume_id.as_str();
    let staging = d.staging_path("grow");
    let target = d.target_path("grow");
    d.stage(id, &staging).await;
    d.publish(id, &staging, &target, false).await;
    let grown = ok(
        "ControllerExpandVolume",
        d.controller()
            .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: id.into(),
                capacity_range: Some(range(20 * MI, 0)),
                ..Default::default()
            })
            .await,
    );
    let req =
        |id: &str, path: &Path, cap: Option<csi::VolumeCapability>| csi::NodeExpandVolumeRequest {
            volume_id: id.into(),
            volume_path: path_str(path),
            capacity_range: Some(range(20 * MI, 0)),
            staging_target_path: path_str(&staging),
            volume_capability: cap,
            ..Default::default()
        };
    for cap in [None, Some(mount_cap(AccessMode::SingleNodeWriter))] {
        let r = ok(
            "NodeExpandVolume",
            d.node().node_expand_volume(req(id, &target, cap)).await,
        );
        assert!(
            r.capacity_bytes == 0 || r.capacity_bytes >= grown.capacity_bytes,
            "{r:?}"
        );
    }
    // A resizer elsewhere grew nothing yet: the node applies a larger size
    // itself (pool accounting included).
    let mut bigger = req(id, &target, None);
    bigger.capacity_range = Some(range(30 * MI, 0));
    let r = ok(
        "NodeExpandVolume to 30Mi",
        d.node().node_expand_volume(bigger.clone()).await,
    );
    assert!(r.capacity_bytes >= 30 * MI, "{r:?}");
    assert_eq!(d.list_all().await[0].capacity_bytes, r.capacity_bytes);
    let r2 = ok("again", d.node().node_expand_volume(bigger.clone()).await);
    assert_eq!(r2.capacity_bytes, r.capacity_bytes);
    bigger.capacity_range = Some(range(-1, 0));
    assert_code(
        "negative",
        d.node().node_expand_volume(bigger.clone()).await,
        Code::InvalidArgument,
    );
    // Still usable.
    write_file(&target, "after-expand", b"x").unwrap();
    for (what, r, code) in [
        (
            "unknown volume",
            req("default.0123456789abcdef0123456789abcdef", &target, None),
            Code::NotFound,
        ),
        (
            "missing volume_path",
            req(id, &d.kubelet_dir().join("pods/nope/mount"), None),
            Code::NotFound,
        ),
        (
            "block capability",
            req(id, &target, Some(block_cap(AccessMode::SingleNodeWriter))),
            Code::InvalidArgument,
        ),
    ] {
        assert_code(what, d.node().node_expand_volume(r).await, code);
    }
    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
}

// --- unusual but legitimate paths -----------------------------------------------------

#[tokio::test]
async fn paths_with_special_characters() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("odd", 0).await;
    let id = v.volume_id.as_str();
    // mountinfo escapes space, tab, newline and backslash as octal.
    let name = "sp ace\ttab\nnl\\bs-ünï#";
    let staging = d.staging_path(name);
    let target = d.target_path(name);
    for _ in 0..2 {
        d.stage(id, &staging).await;
        assert_mount_of(&d, id, &staging);
    }
    for _ in 0..2 {
        d.publish(id, &staging, &target, false).await;
        assert_mount_of(&d, id, &target);
    }
    write_file(&target, "f", b"odd").unwrap();
    let r = ok(
        "stats",
        d.node().node_get_volume_stats(stats_req(id, &target)).await,
    );
    assert!(!r.volume_condition.unwrap().abnormal);
    for _ in 0..2 {
        d.unpublish(id, &target).await;
        assert_not_mounted(&target);
        assert!(!target.exists());
    }
    for _ in 0..2 {
        d.unstage(id, &staging).await;
        assert_not_mounted(&staging);
    }
    d.delete(id).await;
    assert!(d.mounts_below_dir().is_empty());
}

#[tokio::test]
async fn kubelet_dir_behind_a_symlink() {
    require_root();
    let d = Driver::start(DriverOpts {
        kubelet_dir_is_symlink: true,
        ..DriverOpts::default()
    })
    .await;
    let v = d.create("linked", 0).await;
    let id = v.volume_id.as_str();
    // kubelet passes paths below the symlink; the mount table shows real paths.
    let staging = d.staging_path("linked");
    let target = d.target_path("linked");
    let real = |p: &Path| {
        let rel = p.strip_prefix(d.kubelet_dir()).unwrap();
        d.dir().join("kubelet-real").join(rel)
    };
    for _ in 0..2 {
        d.stage(id, &staging).await;
        assert_mount_of(&d, id, &real(&staging));
    }
    for _ in 0..2 {
        d.publish(id, &staging, &target, false).await;
        assert_mount_of(&d, id, &real(&target));
    }
    write_file(&target, "f", b"through the link").unwrap();
    let r = ok(
        "stats",
        d.node().node_get_volume_stats(stats_req(id, &target)).await,
    );
    assert!(!r.volume_condition.as_ref().unwrap().abnormal, "{r:?}");
    assert_code(
        "publish read-only over it",
        d.node()
            .node_publish_volume(publish_req(id, &staging, &target, true))
            .await,
        Code::AlreadyExists,
    );
    for _ in 0..2 {
        d.unpublish(id, &target).await;
        assert_not_mounted(&real(&target));
        assert!(!target.exists());
    }
    for _ in 0..2 {
        d.unstage(id, &staging).await;
        assert_not_mounted(&real(&staging));
    }
    assert!(
        d.mounts_below_dir().is_empty(),
        "{:#?}",
        d.mounts_below_dir()
    );
    d.delete(id).await;
}

/// A NodeUnpublishVolume aimed at the volume's own staging path, laid out as
/// kubelet lays it, is refused and unmounts nothing: the pod that uses the
/// volume keeps its data (it came from a hostile request).
#[tokio::test]
async fn unpublish_at_a_kubelet_staging_path_is_refused() {
    let d = Driver::start_default().await;
    let vol = d.create("staged-in-kubelets-layout", 0).await;
    let id = vol.volume_id.as_str();
    let staging = d
        .kubelet_dir()
        .join("plugins/kubernetes.io/csi/localvol.csi.dev/0f1e2d3c4b5a/globalmount");
    fs::create_dir_all(staging.parent().unwrap()).unwrap();
    let target = d.target_path("pod-of-staged");
    d.stage(id, &staging).await;
    d.publish(id, &staging, &target, false).await;
    fs::write(target.join("data"), b"kept").unwrap();

    let s = must_fail(
        "NodeUnpublishVolume at the staging path",
        d.node()
            .node_unpublish_volume(unpublish_req(id, &staging))
            .await,
        Code::InvalidArgument,
    );
    assert!(
        s.message().contains("where kubelet stages volumes"),
        "{s:?}"
    );
    let mounted: Vec<_> = d
        .mounts_below_dir()
        .into_iter()
        .map(|m| m.mount_point)
        .collect();
    assert!(
        mounted.contains(&staging),
        "staging still mounted: {mounted:?}"
    );
    assert_eq!(fs::read(staging.join("data")).unwrap(), b"kept");
    assert_eq!(fs::read(target.join("data")).unwrap(), b"kept");

    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
    d.delete(id).await;
}
