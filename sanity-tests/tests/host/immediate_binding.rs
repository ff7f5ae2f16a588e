//! StorageClasses with `volumeBindingMode: Immediate` under node-deployment
//! provisioners (issue 14, item 5). The external-provisioner (README,
//! "Deployment on each node") lets every node's instance try to claim such a
//! PVC: after a random delay each asks its own driver's GetCapacity (the
//! class's parameters, its own node's topology) whether the requested size
//! fits, and only then writes its node name into the PVC's
//! `volume.kubernetes.io/selected-node` annotation; one write wins, the
//! others conflict. The winner then calls CreateVolume; RESOURCE_EXHAUSTED
//! makes it remove the annotation so the claim is tried again. These tests
//! check the driver's side of that contract on the real binary: what
//! GetCapacity answers for the check the provisioner makes, and what
//! CreateVolume answers on the winning node with and without room.

use localvol::csi;
use sanity_tests::*;
use tonic::Code;

/// The parameters the provisioner sends with --extra-create-metadata: the
/// class's own plus the claim's and the PV's names.
fn class_params() -> std::collections::HashMap<String, String> {
    params(&[
        ("pool", "default"),
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("csi.storage.k8s.io/pvc/namespace", "default"),
        ("csi.storage.k8s.io/pv/name", "pvc-5e0d3c1a"),
    ])
}

async fn capacity_for(d: &Driver, node: &str) -> i64 {
    ok(
        "GetCapacity",
        d.controller()
            .get_capacity(csi::GetCapacityRequest {
                volume_capabilities: vec![mount_cap(AccessMode::SingleNodeWriter)],
                parameters: class_params(),
                accessible_topology: Some(topology(node)),
            })
            .await,
    )
    .available_capacity
}

/// CreateVolume as the winning node's provisioner sends it (strict topology:
/// requisite and preferred are the selected node).
fn claim(name: &str, bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        capacity_range: Some(range(bytes, 0)),
        parameters: class_params(),
        accessibility_requirements: Some(csi::TopologyRequirement {
            requisite: vec![topology(NODE_ID)],
            preferred: vec![topology(NODE_ID)],
        }),
        ..create_req(name)
    }
}

#[tokio::test]
async fn the_node_with_room_claims_and_provisions_the_node_without_declines() {
    let d = Driver::start(DriverOpts::with_pool(
        PoolOpts::new("default").capacity("64Mi"),
    ))
    .await;
    // The provisioner's check: available_capacity (not maximum_volume_size)
    // against the claim's request, for its own node.
    let room = capacity_for(&d, NODE_ID).await;
    assert!((16 * MI..=64 * MI).contains(&room), "{room}");
    // Another node's topology is never this driver's room.
    assert_eq!(capacity_for(&d, "some-other-node").await, 0);

    // A claim that fits: this node claims it, CreateVolume succeeds and pins
    // the volume to this node.
    let v = ok(
        "CreateVolume",
        d.controller().create_volume(claim("fits", 16 * MI)).await,
    )
    .volume
    .unwrap();
    assert_eq!(v.accessible_topology, vec![topology(NODE_ID)]);
    let left = capacity_for(&d, NODE_ID).await;
    assert_eq!(
        left,
        room - 16 * MI,
        "GetCapacity follows what was provisioned"
    );

    // A claim larger than what is left: the check says no (this node does
    // not claim it), and if it were claimed anyway (a race between check and
    // create) CreateVolume answers RESOURCE_EXHAUSTED, on which the
    // provisioner drops the selected-node annotation for another node.
    let big = left + MI;
    assert!(big > capacity_for(&d, NODE_ID).await);
    let e = must_fail(
        "CreateVolume beyond the room",
        d.controller().create_volume(claim("too-big", big)).await,
        Code::ResourceExhausted,
    );
    assert!(!e.message().is_empty());
    // Nothing was made for it.
    let listed = ok(
        "ListVolumes",
        d.controller()
            .list_volumes(csi::ListVolumesRequest::default())
            .await,
    );
    assert_eq!(listed.entries.len(), 1, "{listed:?}");
}
