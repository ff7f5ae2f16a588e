//! Regression tests for what upstream csi-sanity and hostile requests found
//! (issue 10): each test is named after the finding. Everything here mounts:
//! root only. Each checks the answer's code and that nothing else on the node
//! changed.

use std::fs;
use std::path::Path;

use localvol::csi;
use sanity_tests::*;
use tonic::Code;

/// The (dev, root) pairs mounted at `path`, for before/after comparisons.
fn stack(path: &Path) -> Vec<(String, std::path::PathBuf)> {
    mounts_at(path)
        .into_iter()
        .map(|m| (m.dev, m.root))
        .collect()
}

fn publish_mode(
    id: &str,
    staging: &Path,
    target: &Path,
    mode: AccessMode,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_capability: Some(mount_cap(mode)),
        ..publish_req(id, staging, target, false)
    }
}

/// A volume staged at `staging` and published at `target`, with a file in it.
async fn published(d: &Driver, name: &str) -> (String, std::path::PathBuf, std::path::PathBuf) {
    let v = d.create(name, 16 * MI).await;
    let (staging, target) = (d.staging_path(name), d.target_path(name));
    d.stage(&v.volume_id, &staging).await;
    d.publish(&v.volume_id, &staging, &target, false).await;
    write_file(&target, "data", name.as_bytes()).unwrap();
    (v.volume_id, staging, target)
}

/// csi-sanity "should fail when volume with single node single writer access
/// mode is already mounted at a different target path": FAILED_PRECONDITION,
/// and the second target is neither mounted nor created. The first target may
/// be published again (idempotent), and other modes still allow two targets.
#[tokio::test]
async fn single_node_single_writer_is_published_at_one_target_only() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("snsw", 0).await;
    let id = v.volume_id.as_str();
    let staging = d.staging_path("snsw");
    let (first, second) = (d.target_path("first"), d.target_path("second"));
    d.stage(id, &staging).await;
    let snsw = AccessMode::SingleNodeSingleWriter;
    ok(
        "publish SNSW at the first target",
        d.node()
            .node_publish_volume(publish_mode(id, &staging, &first, snsw))
            .await,
    );
    ok(
        "the same publish again",
        d.node()
            .node_publish_volume(publish_mode(id, &staging, &first, snsw))
            .await,
    );
    let s = assert_code(
        "publish SNSW at a second target",
        d.node()
            .node_publish_volume(publish_mode(id, &staging, &second, snsw))
            .await,
        Code::FailedPrecondition,
    );
    assert!(s.message().contains("first"), "{s:?}");
    assert!(!second.exists(), "the refused target was created");
    assert_eq!(stack(&first).len(), 1);

    // SINGLE_NODE_MULTI_WRITER (and SINGLE_NODE_WRITER) share the volume.
    ok(
        "publish SNMW at a second target",
        d.node()
            .node_publish_volume(publish_mode(
                id,
                &staging,
                &second,
                AccessMode::SingleNodeMultiWriter,
            ))
            .await,
    );
    d.unpublish(id, &second).await;
    d.unpublish(id, &first).await;
    // Once unpublished, a single writer may publish elsewhere.
    ok(
        "publish SNSW at the second target now",
        d.node()
            .node_publish_volume(publish_mode(id, &staging, &second, snsw))
            .await,
    );
    d.unpublish(id, &second).await;
    d.unstage(id, &staging).await;
    assert!(d.mounts_below_dir().is_empty());
}

/// csi-sanity "NodeGetVolumeStats/NodeExpandVolume should fail when volume is
/// not found" and "... does not exist on the specified path": a well-formed
/// unknown id, or a known volume at a relative path, is NOT_FOUND; a malformed
/// id stays INVALID_ARGUMENT.
#[tokio::test]
async fn stats_and_expand_of_unknown_volume_or_foreign_path_are_not_found() {
    require_root();
    let d = Driver::start_default().await;
    let (id, staging, target) = published(&d, "found").await;
    let unknown = "default.0123456789abcdef0123456789abcdef";
    let expand = |id: &str, path: &str| csi::NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        capacity_range: Some(range(32 * MI, 0)),
        ..Default::default()
    };
    let outside = [
        "some/path".to_owned(),
        "/etc".to_owned(),
        path_str(&d.kubelet_dir()),
    ];
    for (vol, path) in [
        (unknown, "some/path".to_owned()),
        (unknown, path_str(&target)),
    ]
    .into_iter()
    .chain(outside.iter().map(|p| (id.as_str(), p.clone())))
    {
        let what = format!("{vol} at {path}");
        let r = d
            .node()
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: vol.into(),
                volume_path: path.clone(),
                ..Default::default()
            })
            .await;
        assert_code(&format!("stats {what}"), r, Code::NotFound);
        let r = d.node().node_expand_volume(expand(vol, &path)).await;
        assert_code(&format!("expand {what}"), r, Code::NotFound);
    }
    for bad_id in ["", "../x", "a/b"] {
        let r = d
            .node()
            .node_get_volume_stats(stats_req(bad_id, Path::new("some/path")))
            .await;
        assert_code(&format!("stats id {bad_id:?}"), r, Code::InvalidArgument);
        let r = d
            .node()
            .node_expand_volume(expand(bad_id, "some/path"))
            .await;
        assert_code(&format!("expand id {bad_id:?}"), r, Code::InvalidArgument);
    }
    assert_eq!(d.list_all().await[0].capacity_bytes, 16 * MI, "resized");
    d.unpublish(&id, &target).await;
    d.unstage(&id, &staging).await;
}

/// A path component longer than NAME_MAX (255 bytes) is INVALID_ARGUMENT on
/// every node RPC that takes a path (before: INTERNAL "File name too long").
#[tokio::test]
async fn path_component_over_255_bytes_is_invalid_argument() {
    require_root();
    let d = Driver::start_default().await;
    let (id, staging, target) = published(&d, "long").await;
    let long = d.kubelet_dir().join("pods").join("x".repeat(256));
    let ia = Code::InvalidArgument;
    let mut n = d.node();
    let r = n.node_stage_volume(stage_req(&id, &long)).await;
    assert_code("stage", r, ia);
    let r = n
        .node_publish_volume(publish_req(&id, &staging, &long, false))
        .await;
    assert_code("publish target", r, ia);
    let r = n
        .node_publish_volume(publish_req(&id, &long, &target, false))
        .await;
    assert_code("publish staging", r, ia);
    let r = n.node_unpublish_volume(unpublish_req(&id, &long)).await;
    assert_code("unpublish", r, ia);
    let r = n.node_unstage_volume(unstage_req(&id, &long)).await;
    assert_code("unstage", r, ia);
    let r = n.node_get_volume_stats(stats_req(&id, &long)).await;
    assert_code("stats", r, ia);
    // 255 bytes is a legal name: publishing there works.
    let longest = d.kubelet_dir().join("pods").join("y".repeat(255));
    d.publish(&id, &staging, &longest, false).await;
    d.unpublish(&id, &longest).await;
    assert_eq!(stack(&target).len(), 1);
    d.unpublish(&id, &target).await;
    d.unstage(&id, &staging).await;
}

/// NodePublishVolume whose target is the volume's own staging path (or inside
/// it, or its parent) is refused: before, it answered OK without mounting,
/// and a later unpublish of that path took the staging mount away from under
/// the pod's target.
#[tokio::test]
async fn publish_onto_the_staging_path_is_refused() {
    require_root();
    let d = Driver::start_default().await;
    let (id, staging, target) = published(&d, "self").await;
    let before = (stack(&staging), stack(&target));
    for bad in [
        staging.clone(),
        staging.join("inner"),
        staging.parent().unwrap().to_path_buf(),
    ] {
        let r = d
            .node()
            .node_publish_volume(publish_req(&id, &staging, &bad, false))
            .await;
        assert_code(&format!("publish at {bad:?}"), r, Code::InvalidArgument);
        assert_eq!((stack(&staging), stack(&target)), before, "{bad:?}");
    }
    assert!(!staging.join("inner").exists());
    assert_eq!(fs::read(target.join("data")).unwrap(), b"self");
    d.unpublish(&id, &target).await;
    d.unstage(&id, &staging).await;
}

/// NodeGetVolumeStats of a path that holds another volume: NOT_FOUND (before:
/// OK with an abnormal condition, and this volume's figures).
/// NodeExpandVolume likewise: refused, and nothing is resized (before: OK, and
/// the named volume grew).
#[tokio::test]
async fn stats_and_expand_at_another_volumes_target_are_refused() {
    require_root();
    let d = Driver::start_default().await;
    let (a, sa, ta) = published(&d, "a").await;
    let (b, sb, tb) = published(&d, "b").await;
    let r = d.node().node_get_volume_stats(stats_req(&a, &tb)).await;
    assert_code("stats of a at b's target", r, Code::NotFound);
    let r = d.node().node_get_volume_stats(stats_req(&a, &sb)).await;
    assert_code("stats of a at b's staging path", r, Code::NotFound);
    let r = d
        .node()
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: a.clone(),
            volume_path: path_str(&tb),
            capacity_range: Some(range(64 * MI, 0)),
            ..Default::default()
        })
        .await;
    assert_code("expand a at b's target", r, Code::NotFound);
    // A plain directory: not a mount of the volume, nothing to grow through.
    let plain = d.kubelet_dir().join("pods").join("plain");
    fs::create_dir_all(&plain).unwrap();
    let r = d
        .node()
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: a.clone(),
            volume_path: path_str(&plain),
            capacity_range: Some(range(64 * MI, 0)),
            ..Default::default()
        })
        .await;
    assert_code("expand a at a plain dir", r, Code::FailedPrecondition);
    for v in d.list_all().await {
        assert_eq!(v.capacity_bytes, 16 * MI, "{} was resized", v.volume_id);
    }
    // Its own target still works.
    let r = ok(
        "stats of a at its target",
        d.node().node_get_volume_stats(stats_req(&a, &ta)).await,
    );
    assert!(!r.volume_condition.unwrap().abnormal);
    for (id, s, t) in [(&a, &sa, &ta), (&b, &sb, &tb)] {
        d.unpublish(id, t).await;
        d.unstage(id, s).await;
    }
}

/// NodeUnstageVolume whose staging path is really a pod's target of the
/// volume is refused and the pod's mount stays; so is unstaging the real
/// staging path while a pod still uses it. After unpublish, unstage works.
#[tokio::test]
async fn unstage_never_takes_a_mount_a_pod_uses() {
    require_root();
    let d = Driver::start_default().await;
    let (id, staging, target) = published(&d, "pod").await;
    let before = (stack(&staging), stack(&target));
    for (what, path) in [("the target", &target), ("the staging path", &staging)] {
        let s = assert_code(
            &format!("unstage {what} while published"),
            d.node().node_unstage_volume(unstage_req(&id, path)).await,
            Code::FailedPrecondition,
        );
        assert!(s.message().contains("unpublish"), "{s:?}");
        assert_eq!((stack(&staging), stack(&target)), before, "{what}");
    }
    assert_eq!(fs::read(target.join("data")).unwrap(), b"pod");
    d.unpublish(&id, &target).await;
    d.unstage(&id, &staging).await;
    assert!(d.mounts_below_dir().is_empty());
}
