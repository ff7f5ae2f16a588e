//! CSI ephemeral inline volumes on a dir pool (issue 14, item 4): kubelet's
//! NodePublishVolume with `csi.storage.k8s.io/ephemeral: "true"` creates a
//! sized dir volume and binds it at the pod's target; NodeUnpublishVolume
//! unmounts it and removes it; a volume whose pod went while the driver was
//! down (its target path gone) is removed when the driver starts. Mounts
//! need root. The size limit itself (quotas) is tested in the VM
//! (`vm_quota.rs`, `ephemeral_volume_write_past_the_size_fails`).

use std::fs;
use std::path::Path;

use localvol::csi;
use sanity_tests::*;
use tonic::Code;

/// The volume records of the default pool (`<key>.json`), parsed.
fn records(d: &Driver) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for e in fs::read_dir(d.volumes_dir()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            out.push(serde_json::from_slice(&fs::read(&p).unwrap()).unwrap());
        }
    }
    out
}

#[track_caller]
fn assert_no_volumes(d: &Driver) {
    assert!(
        d.volume_dirs("default").is_empty(),
        "{:?}",
        d.volume_dirs("default")
    );
    assert!(records(d).is_empty(), "{:?}", records(d));
}

async fn publish(d: &Driver, req: csi::NodePublishVolumeRequest) -> Result<(), tonic::Status> {
    d.node().node_publish_volume(req).await.map(|_| ())
}

async fn unpublish(d: &Driver, id: &str, target: &Path) -> Result<(), tonic::Status> {
    d.node()
        .node_unpublish_volume(unpublish_req(id, target))
        .await
        .map(|_| ())
}

async fn listed(d: &Driver) -> Vec<csi::Volume> {
    ok(
        "ListVolumes",
        d.controller()
            .list_volumes(csi::ListVolumesRequest::default())
            .await,
    )
    .entries
    .into_iter()
    .filter_map(|e| e.volume)
    .collect()
}

#[tokio::test]
async fn publish_creates_a_sized_volume_and_unpublish_removes_it() {
    require_root();
    let d = Driver::start(DriverOpts::default()).await;
    let id = ephemeral_handle(1);
    let target = d.target_path("scratch");
    let req = ephemeral_publish_req(&id, &target, &[("size", "12Mi"), ("pool", "default")]);
    must("publish", publish(&d, req.clone()).await);

    // One volume of exactly that size, named by the handle, bound at the target.
    let vols = listed(&d).await;
    assert_eq!(vols.len(), 1, "{vols:?}");
    assert_eq!(vols[0].capacity_bytes, 12 * MI);
    let vid = vols[0].volume_id.clone();
    assert!(vid.starts_with("default."), "{vid}");
    let (dev, root) = locate(&d.volume_data_dir(&vid)).unwrap();
    let stack = mounts_at(&target);
    assert_eq!(stack.len(), 1, "{stack:?}");
    assert_eq!(
        (stack[0].dev.as_str(), stack[0].root.as_path()),
        (dev.as_str(), root.as_path())
    );
    let rec = &records(&d)[0];
    assert_eq!(rec["name"], id.as_str());
    assert_eq!(rec["parameters"]["csi.storage.k8s.io/ephemeral"], "true");
    assert_eq!(rec["parameters"]["size"], (12 * MI).to_string());
    assert_eq!(
        rec["parameters"]["csi.storage.k8s.io/pod.name"],
        "scratch-pod"
    );
    assert_eq!(
        rec["parameters"]["localvol.csi.dev/ephemeral-target"],
        target.to_str().unwrap()
    );
    write_file(&target, "f", b"scratch").unwrap();
    assert_eq!(
        fs::read(d.volume_data_dir(&vid).join("f")).unwrap(),
        b"scratch"
    );

    // kubelet asks for the stats of inline volumes by their handle too.
    let stats = ok(
        "NodeGetVolumeStats",
        d.node()
            .node_get_volume_stats(stats_req(&id, &target))
            .await,
    );
    let c = stats.volume_condition.expect("volume_condition");
    assert!(!c.abnormal, "{}", c.message);
    assert!(!stats.usage.is_empty());

    // Repeated: the same volume, still one bind.
    must("publish again", publish(&d, req.clone()).await);
    assert_eq!(mounts_at(&target).len(), 1);
    assert_eq!(listed(&d).await.len(), 1);

    // The same handle at another target, or with another size: not this volume.
    let other = d.target_path("elsewhere");
    let moved = ephemeral_publish_req(&id, &other, &[("size", "12Mi")]);
    must_fail(
        "same handle, other target",
        publish(&d, moved).await,
        Code::AlreadyExists,
    );
    let bigger = ephemeral_publish_req(&id, &target, &[("size", "24Mi")]);
    must_fail(
        "same handle, other size",
        publish(&d, bigger).await,
        Code::AlreadyExists,
    );
    assert!(!other.exists());

    // Unpublish: unmounted, target removed, volume and record gone; twice.
    must("unpublish", unpublish(&d, &id, &target).await);
    assert!(mounts_at(&target).is_empty());
    assert!(!target.exists());
    assert_no_volumes(&d);
    must("unpublish again", unpublish(&d, &id, &target).await);
    assert!(listed(&d).await.is_empty());
}

#[tokio::test]
async fn bad_attributes_are_invalid_argument_and_touch_nothing() {
    require_root();
    let d = Driver::start(DriverOpts::default()).await;
    let target = d.target_path("bad");
    let id = ephemeral_handle(2);
    let cases: Vec<(&str, csi::NodePublishVolumeRequest)> = vec![
        ("no size", ephemeral_publish_req(&id, &target, &[])),
        (
            "size 0",
            ephemeral_publish_req(&id, &target, &[("size", "0")]),
        ),
        (
            "size ten",
            ephemeral_publish_req(&id, &target, &[("size", "ten")]),
        ),
        (
            "negative size",
            ephemeral_publish_req(&id, &target, &[("size", "-1Mi")]),
        ),
        (
            "unknown attribute",
            ephemeral_publish_req(&id, &target, &[("size", "1Mi"), ("color", "red")]),
        ),
        (
            "unknown pool",
            ephemeral_publish_req(&id, &target, &[("size", "1Mi"), ("pool", "nope")]),
        ),
        (
            "malformed pool",
            ephemeral_publish_req(&id, &target, &[("size", "1Mi"), ("pool", "../x")]),
        ),
        (
            "bad inodeLimit",
            ephemeral_publish_req(&id, &target, &[("size", "1Mi"), ("inodeLimit", "-3")]),
        ),
        (
            "format options (a directory has no filesystem of its own)",
            ephemeral_publish_req(
                &id,
                &target,
                &[("size", "1Mi"), ("format.xfs.nrext64", "false")],
            ),
        ),
        ("read-only", {
            let mut r = ephemeral_publish_req(&id, &target, &[("size", "1Mi")]);
            r.readonly = true;
            r
        }),
        ("block", {
            let mut r = ephemeral_publish_req(&id, &target, &[("size", "1Mi")]);
            r.volume_capability = Some(block_cap(AccessMode::SingleNodeWriter));
            r
        }),
        (
            "a persistent volume's id",
            ephemeral_publish_req(
                "default.0123456789abcdef0123456789abcdef",
                &target,
                &[("size", "1Mi")],
            ),
        ),
        ("target outside kubelet dir", {
            let mut r = ephemeral_publish_req(&id, &target, &[("size", "1Mi")]);
            r.target_path = d.dir().join("outside").to_str().unwrap().to_owned();
            r
        }),
    ];
    for (what, req) in cases {
        let s = must_fail(what, publish(&d, req).await, Code::InvalidArgument);
        assert!(!s.message().is_empty(), "{what}");
    }
    assert!(!target.exists(), "a refused publish made the target");
    assert!(!d.dir().join("outside").exists());
    assert_no_volumes(&d);
}

#[tokio::test]
async fn volumes_of_pods_gone_while_down_are_removed_at_start() {
    require_root();
    let mut d = Driver::start(DriverOpts::default()).await;
    let (gone, kept) = (ephemeral_handle(3), ephemeral_handle(4));
    let (t_gone, t_kept) = (d.target_path("gone"), d.target_path("kept"));
    for (id, t) in [(&gone, &t_gone), (&kept, &t_kept)] {
        must(
            "publish",
            publish(&d, ephemeral_publish_req(id, t, &[("size", "4Mi")])).await,
        );
    }
    assert_eq!(listed(&d).await.len(), 2);

    // The driver dies; kubelet tears the first pod down without it (unmount,
    // then the pod's directory goes).
    d.kill9();
    run_cmd("umount", &[t_gone.to_str().unwrap()]);
    fs::remove_dir(&t_gone).unwrap();
    fs::remove_dir(t_gone.parent().unwrap()).unwrap();
    d.start_again().await;

    // Only the gone pod's volume went; the other is intact and still bound.
    let vols = listed(&d).await;
    assert_eq!(vols.len(), 1, "{vols:?}");
    assert_eq!(records(&d)[0]["name"], kept.as_str());
    assert_eq!(mounts_at(&t_kept).len(), 1);
    assert!(
        d.log_tail(200).contains("ephemeral volume removed"),
        "{}",
        d.log_tail(40)
    );

    // A restart with every pod alive removes nothing.
    d.restart().await;
    assert_eq!(listed(&d).await.len(), 1);
    must("unpublish", unpublish(&d, &kept, &t_kept).await);
    assert_no_volumes(&d);
}
