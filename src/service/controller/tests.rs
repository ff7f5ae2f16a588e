//! The Controller service's expansion and modification of volumes, on
//! this node and on others (a fake API server for the cluster).

use super::*;
use crate::config::Config;
use crate::csi::controller_server::Controller;
use crate::driver::Identity;
use crate::ids::{PoolName, TOPOLOGY_KEY};
use crate::k8s::fake::{Fake, Role};
use serde_json::json;
use tonic::Code;

const GI: i64 = 1 << 30;

const CAPS: &str = "/apis/storage.k8s.io/v1/namespaces/kube-system/csistoragecapacities";

/// A service on node n0 (one dir pool in `dir`) whose cluster holds
/// volume `id` (1Gi, class "fast") on node n1, which has published
/// `free` for that class.
async fn on_n0(dir: &std::path::Path, fake: &Fake, id: &str, free: &str) -> ControllerService {
    let who = Identity {
        driver_name: "localvol.csi.dev".into(),
        node_id: "n0".into(),
        kubelet_dir: dir.join("kubelet"),
    };
    let driver = Driver::open(&who, &Config::embedded(dir)).await.unwrap();
    fake.put_pv(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-1"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "storageClassName": "fast",
            "csi": {"driver": "localvol.csi.dev", "volumeHandle": id},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": TOPOLOGY_KEY, "operator": "In", "values": ["n1"]}
            ]}]}},
        }
    }));
    fake.put(
        &format!("{CAPS}/cap-n1-fast"),
        json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
            "metadata": {"name": "cap-n1-fast", "namespace": "kube-system"},
            "storageClassName": "fast",
            "nodeTopology": {"matchLabels": {TOPOLOGY_KEY: "n1"}},
            "capacity": free,
        }),
    );
    ControllerService::with_cluster(driver, fake.client.clone())
}

fn expand(id: &str, required: i64) -> Request<csi::ControllerExpandVolumeRequest> {
    Request::new(csi::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        ..Default::default()
    })
}

/// The id volume `name` has in pool "thick" (of some other node).
fn thick_id(name: &str) -> String {
    let name = VolumeName::parse(name).unwrap();
    VolumeId::new(PoolName::parse("thick").unwrap(), &name).to_string()
}

#[tokio::test]
async fn expansion_on_another_node_must_fit_its_published_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(Role::Expansion);
    let id = thick_id("pvc-1");
    let svc = on_n0(dir.path(), &fake, &id, "512Mi").await;

    // Growth beyond n1's 512Mi: refused before the PV can grow.
    let e = svc
        .controller_expand_volume(expand(&id, 2 * GI))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    for part in ["node n1", "1Gi more", "512Mi free", "at most 1.5Gi"] {
        assert!(
            e.message().contains(part),
            "{part:?} missing: {}",
            e.message()
        );
    }
    // Growth within it: accepted, for n1 to apply.
    let r = svc
        .controller_expand_volume(expand(&id, GI + GI / 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, GI + GI / 2);
    assert!(r.node_expansion_required);
    // Only reads: nothing in the cluster was written.
    let log = fake.log();
    assert!(log.iter().all(|l| l.starts_with("LIST ")), "{log:?}");
    assert_eq!(log.len(), 4, "{log:?}");
}

#[tokio::test]
async fn expansion_the_cluster_cannot_check_is_left_to_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(Role::Expansion);
    let id = thick_id("pvc-2");
    // The cluster's PV names another volume: no capacity to check against.
    let svc = on_n0(dir.path(), &fake, "thick.other", "0").await;
    let r = svc
        .controller_expand_volume(expand(&id, 2 * GI))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 2 * GI);
    assert!(r.node_expansion_required);
    // An id not in our format is no volume of ours, cluster or not.
    let e = svc
        .controller_expand_volume(expand("not-ours", GI))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
}

#[tokio::test]
async fn an_api_server_that_fails_makes_the_resizer_retry() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(Role::Expansion);
    let id = thick_id("pvc-3");
    let svc = on_n0(dir.path(), &fake, &id, "512Mi").await;
    drop(fake); // the server task stops: every request fails
    let e = svc
        .controller_expand_volume(expand(&id, 2 * GI))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
}

fn modify(id: &str, kv: &[(&str, &str)]) -> Request<csi::ControllerModifyVolumeRequest> {
    Request::new(csi::ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    })
}

#[tokio::test]
async fn modify_volume_is_advertised_and_validated_before_anything_else() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(Role::Expansion);
    let id = thick_id("pvc-4");
    let svc = on_n0(dir.path(), &fake, &id, "512Mi").await;
    let caps = svc
        .controller_get_capabilities(Request::new(Default::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(
        caps.capabilities.iter().any(|c| matches!(
            c.r#type,
            Some(CapType::Rpc(Rpc { r#type: t })) if t == RpcType::ModifyVolume as i32
        )),
        "{caps:?}"
    );
    for (kv, want) in [
        (vec![("iops", "5")], "unknown mutable parameter"),
        (vec![("readIOPS", "0")], "must be positive"),
        (vec![("writeBytesPerSecond", "fast")], "writeBytesPerSecond"),
    ] {
        let e = svc
            .controller_modify_volume(modify(&id, &kv))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{kv:?}: {e:?}");
        assert!(e.message().contains(want), "{kv:?}: {}", e.message());
    }
    // A volume of another node, in a pool this node does not have:
    // accepted, for its node to apply (the PV's new class).
    svc.controller_modify_volume(modify(&id, &[("readIOPS", "100")]))
        .await
        .unwrap();
    // Not this driver's id at all.
    let e = svc
        .controller_modify_volume(modify("not-ours", &[("readIOPS", "100")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    // Nothing was written to the cluster.
    assert!(fake
        .log()
        .iter()
        .all(|l| !l.starts_with("PUT") && !l.starts_with("PATCH")));
}

#[tokio::test]
async fn dir_volumes_take_no_io_limits() {
    let dir = tempfile::tempdir().unwrap();
    let who = Identity {
        driver_name: "localvol.csi.dev".into(),
        node_id: "n0".into(),
        kubelet_dir: dir.path().join("kubelet"),
    };
    let driver = Driver::open(&who, &Config::embedded(dir.path()))
        .await
        .unwrap();
    let svc = ControllerService::new(driver);
    let create = |kv: &[(&str, &str)]| csi::CreateVolumeRequest {
        name: "pvc-limits".into(),
        volume_capabilities: vec![csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
            access_mode: Some(csi::volume_capability::AccessMode { mode: 1 }),
        }],
        mutable_parameters: kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let e = svc
        .create_volume(Request::new(create(&[("writeIOPS", "50")])))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("apply to LVM volumes"),
        "{}",
        e.message()
    );
    assert!(
        !dir.path().join("pool").join("volumes").exists()
            || std::fs::read_dir(dir.path().join("pool").join("volumes"))
                .unwrap()
                .next()
                .is_none(),
        "a refused create left something behind"
    );
    // No limit asked: a dir volume like any other.
    let v = svc
        .create_volume(Request::new(create(&[("writeIOPS", "max")])))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let e = svc
        .controller_modify_volume(modify(&v.volume_id, &[("readBytesPerSecond", "1Mi")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    // Without a cluster, a volume this node does not have is nowhere.
    let e = svc
        .controller_modify_volume(modify(
            "default.aaaaaaaaaaaaaaaaaaaaaaaaaa",
            &[("readIOPS", "1")],
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(e.code(), Code::NotFound | Code::InvalidArgument),
        "{e:?}"
    );
}
