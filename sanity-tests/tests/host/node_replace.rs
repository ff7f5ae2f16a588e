//! Node replaced vs node lost (issue 14, item 2) on a dir pool, on the host:
//! volumes carry their pool's storage identity; a driver restarted on the
//! same pool with orphan reclaim keeps the volumes a lost record names
//! (`sanity_tests::replace`); a volume re-adopted by a static PV (its
//! volumeHandle the existing id, its volumeAttributes the storage identity)
//! stages and publishes with its data, and a PV naming other storage is
//! refused. The same with a thick LVM pool runs in the VM (`vm_lvm.rs`).

use std::fs;

use localvol::csi;
use sanity_tests::replace::{kept_after_node_loss, STORAGE_KEY};
use sanity_tests::*;
use tonic::Code;

#[tokio::test]
async fn dir_pool_volumes_named_by_a_lost_record_survive_orphan_reclaim() {
    let opts = DriverOpts::default();
    let out = kept_after_node_loss(opts, "default").await;
    assert!(out.storage.starts_with("dir:"), "{}", out.storage);
    assert_eq!(out.kept.len(), 2);
}

/// A static PV as docs/operations.md's re-adoption steps write it, as kubelet
/// passes it: the volume context is the PV's volumeAttributes.
fn with_storage<T>(
    mut req: T,
    storage: &str,
    ctx: fn(&mut T) -> &mut std::collections::HashMap<String, String>,
) -> T {
    ctx(&mut req).insert(STORAGE_KEY.to_owned(), storage.to_owned());
    req
}

#[tokio::test]
async fn readopted_volume_stages_and_publishes_with_its_data() {
    require_root();
    let mut d = Driver::start_default().await;
    let v = d.create("pvc-readopt", 16 << 20).await;
    let storage = v.volume_context[STORAGE_KEY].clone();
    // The identity is the pool's id file, written once.
    let file = fs::read_to_string(d.pool_dir("default").join(".localvol-pool-id")).unwrap();
    assert_eq!(storage, format!("dir:{}", file.trim()));
    d.stage(&v.volume_id, &d.staging_path("s1")).await;
    let t1 = d.target_path("t1");
    d.publish(&v.volume_id, &d.staging_path("s1"), &t1, false)
        .await;
    fs::write(t1.join("data"), b"survives").unwrap();
    d.unpublish(&v.volume_id, &t1).await;
    d.unstage(&v.volume_id, &d.staging_path("s1")).await;

    // The node is replaced with its disk; the old PV is gone. A restarted
    // driver has the same identity.
    d.restart().await;
    let again = d.create("pvc-other", 16 << 20).await;
    assert_eq!(again.volume_context[STORAGE_KEY], storage);

    // Another storage's identity, or a malformed one: refused, nothing mounted.
    let staging = d.staging_path("s2");
    let wrong = format!("dir:{}", "f".repeat(32));
    let st = assert_code(
        "NodeStage naming other storage",
        d.node()
            .node_stage_volume(with_storage(
                stage_req(&v.volume_id, &staging),
                &wrong,
                |r| &mut r.volume_context,
            ))
            .await,
        Code::FailedPrecondition,
    );
    assert!(st.message().contains(&storage), "{}", st.message());
    assert_code(
        "NodeStage with a malformed identity",
        d.node()
            .node_stage_volume(with_storage(
                stage_req(&v.volume_id, &staging),
                "dir:../x",
                |r| &mut r.volume_context,
            ))
            .await,
        Code::InvalidArgument,
    );
    assert!(
        d.mounts_below_dir().is_empty(),
        "{:?}",
        d.mounts_below_dir()
    );

    // The re-adopting static PV: the same handle and identity.
    ok(
        "NodeStage of the re-adopted volume",
        d.node()
            .node_stage_volume(with_storage(
                stage_req(&v.volume_id, &staging),
                &storage,
                |r| &mut r.volume_context,
            ))
            .await,
    );
    let t2 = d.target_path("t2");
    let wrong_pub = with_storage(
        publish_req(&v.volume_id, &staging, &t2, false),
        &wrong,
        |r: &mut csi::NodePublishVolumeRequest| &mut r.volume_context,
    );
    assert_code(
        "NodePublish naming other storage",
        d.node().node_publish_volume(wrong_pub).await,
        Code::FailedPrecondition,
    );
    ok(
        "NodePublish of the re-adopted volume",
        d.node()
            .node_publish_volume(with_storage(
                publish_req(&v.volume_id, &staging, &t2, false),
                &storage,
                |r| &mut r.volume_context,
            ))
            .await,
    );
    assert_eq!(fs::read(t2.join("data")).unwrap(), b"survives");
    d.unpublish(&v.volume_id, &t2).await;
    d.unstage(&v.volume_id, &staging).await;
    d.stop().await;
}
