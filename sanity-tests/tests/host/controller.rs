//! Controller service: CreateVolume, DeleteVolume, ValidateVolumeCapabilities,
//! ListVolumes, GetCapacity, ControllerExpandVolume, ControllerGetCapabilities
//! and the RPCs the driver does not implement.

use std::collections::{BTreeSet, HashMap};
use std::fs;

use localvol::csi;
use localvol::csi::controller_service_capability::rpc::Type as Rpc;
use sanity_tests::*;
use tonic::Code;

async fn create(d: &Driver, req: csi::CreateVolumeRequest) -> Result<csi::Volume, tonic::Status> {
    d.controller().create_volume(req).await.map(|r| {
        r.into_inner()
            .volume
            .expect("CreateVolume returned no volume")
    })
}

fn sized(name: &str, required: i64, limit: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        capacity_range: Some(range(required, limit)),
        ..create_req(name)
    }
}

/// Free bytes for unprivileged users on the filesystem holding `p`.
fn fs_available(p: &std::path::Path) -> i64 {
    let s = nix::sys::statvfs::statvfs(p).unwrap();
    (s.blocks_available() as u64 * s.fragment_size() as u64) as i64
}

// --- CreateVolume ---------------------------------------------------------------

#[tokio::test]
async fn create_honours_capacity_range() {
    let d = Driver::start_default().await;
    for (name, required, limit) in [
        ("req-aligned", 10 * MI, 0),
        ("req-unaligned", 10 * MI + 1, 0),
        ("req-small", 1, 0),
        ("req-and-limit", 5 * MI, 6 * MI),
        ("req-eq-limit-unaligned", 5 * MI + 1, 5 * MI + 1),
        ("req-eq-limit", 3 * MI, 3 * MI),
    ] {
        let v = create(&d, sized(name, required, limit))
            .await
            .unwrap_or_else(|s| panic!("{name}: {s:?}"));
        assert!(v.capacity_bytes >= required, "{name}: {v:?}");
        if limit > 0 {
            assert!(v.capacity_bytes <= limit, "{name}: {v:?}");
        }
        assert!(!v.volume_id.is_empty());
        assert!(
            d.volume_data_dir(&v.volume_id).is_dir(),
            "{name}: no data dir"
        );
    }
    assert_eq!(d.list_all().await.len(), 6);
}

#[tokio::test]
async fn create_without_range_gets_the_default_size() {
    let d = Driver::start(DriverOpts {
        pools: vec![
            PoolOpts::new("small").default_size("32Mi"),
            PoolOpts::new("plain"),
        ],
        ..DriverOpts::default()
    })
    .await;
    let v = create(&d, create_req("a")).await.unwrap();
    assert_eq!(v.capacity_bytes, 32 * MI, "pool defaultSize");
    // A range with both bounds 0 is "no range".
    let v = create(&d, sized("zero", 0, 0)).await.unwrap();
    assert_eq!(v.capacity_bytes, 32 * MI, "zero range");
    let mut req = create_req("b");
    req.parameters = params(&[("pool", "plain")]);
    let v = create(&d, req).await.unwrap();
    assert_eq!(v.capacity_bytes, GI, "built-in default size is 1Gi");
    assert!(v.volume_id.starts_with("plain."), "{v:?}");
}

#[tokio::test]
async fn create_with_only_a_limit() {
    let d = Driver::start(DriverOpts::with_pool(
        PoolOpts::new("p").default_size("32Mi"),
    ))
    .await;
    let v = create(&d, sized("below-default", 0, 8 * MI)).await.unwrap();
    assert!(v.capacity_bytes > 0 && v.capacity_bytes <= 8 * MI, "{v:?}");
    let v = create(&d, sized("above-default", 0, 100 * MI))
        .await
        .unwrap();
    assert!(
        v.capacity_bytes > 0 && v.capacity_bytes <= 100 * MI,
        "{v:?}"
    );
    let v = create(&d, sized("odd-limit", 0, 5 * MI + 3)).await.unwrap();
    assert!(
        v.capacity_bytes > 0 && v.capacity_bytes <= 5 * MI + 3,
        "{v:?}"
    );
}

#[tokio::test]
async fn create_is_idempotent() {
    let d = Driver::start_default().await;
    let first = create(&d, sized("same", 10 * MI, 0)).await.unwrap();
    let dirs = d.volume_dirs("default");
    for req in [
        sized("same", 10 * MI, 0),
        sized("same", 10 * MI, 20 * MI),
        sized("same", 0, 10 * MI),
        create_req("same"),
    ] {
        let again = create(&d, req.clone())
            .await
            .unwrap_or_else(|s| panic!("{req:?}: {s:?}"));
        assert_eq!(again.volume_id, first.volume_id);
        assert_eq!(again.capacity_bytes, first.capacity_bytes);
        assert_eq!(again.accessible_topology, first.accessible_topology);
    }
    assert_eq!(d.volume_dirs("default"), dirs);
    assert_eq!(d.list_all().await.len(), 1);
}

#[tokio::test]
async fn create_same_name_with_other_properties_is_already_exists() {
    let d = Driver::start_default().await;
    let mut req = sized("same", 10 * MI, 0);
    req.parameters = params(&[("csi.storage.k8s.io/pvc/name", "claim-1")]);
    let v = create(&d, req.clone()).await.unwrap();

    let bigger = csi::CreateVolumeRequest {
        capacity_range: Some(range(20 * MI, 0)),
        ..req.clone()
    };
    let smaller_limit = csi::CreateVolumeRequest {
        capacity_range: Some(range(0, 5 * MI)),
        ..req.clone()
    };
    let other_params = csi::CreateVolumeRequest {
        parameters: params(&[("csi.storage.k8s.io/pvc/name", "claim-2")]),
        ..req.clone()
    };
    for (what, r) in [
        ("larger size", bigger),
        ("lower limit", smaller_limit),
        ("other parameters", other_params),
    ] {
        assert_code(
            what,
            d.controller().create_volume(r).await,
            Code::AlreadyExists,
        );
    }
    // The original is untouched.
    let listed = d.list_all().await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].volume_id, v.volume_id);
    assert_eq!(listed[0].capacity_bytes, 10 * MI);
}

#[tokio::test]
async fn create_same_name_in_another_pool_is_already_exists() {
    let d = Driver::start(DriverOpts {
        pools: vec![PoolOpts::new("one"), PoolOpts::new("two")],
        ..DriverOpts::default()
    })
    .await;
    let mut req = sized("shared", MI, 0);
    req.parameters = params(&[("pool", "one")]);
    let v = create(&d, req.clone()).await.unwrap();
    assert!(v.volume_id.starts_with("one."), "{v:?}");
    req.parameters = params(&[("pool", "two")]);
    assert_code(
        "same name, pool two",
        d.controller().create_volume(req.clone()).await,
        Code::AlreadyExists,
    );
    // The original request again: idempotent.
    req.parameters = params(&[("pool", "one")]);
    let again = create(&d, req).await.unwrap();
    assert_eq!(again.volume_id, v.volume_id);
    assert!(d.volume_dirs("two").is_empty());
    assert_eq!(d.volume_dirs("one").len(), 1);
}

#[tokio::test]
async fn create_in_a_named_pool_and_the_default_pool() {
    let d = Driver::start(DriverOpts {
        pools: vec![PoolOpts::new("one"), PoolOpts::new("two")],
        default_pool: Some("two".into()),
        ..DriverOpts::default()
    })
    .await;
    let v = create(&d, sized("dflt", MI, 0)).await.unwrap();
    assert!(v.volume_id.starts_with("two."), "defaultPool: {v:?}");
    let mut req = sized("named", MI, 0);
    req.parameters = params(&[("pool", "one")]);
    let v = create(&d, req).await.unwrap();
    assert!(v.volume_id.starts_with("one."), "{v:?}");
    assert_eq!(d.volume_dirs("one").len(), 1);
    assert_eq!(d.volume_dirs("two").len(), 1);
}

#[tokio::test]
async fn create_reports_this_nodes_topology() {
    let d = Driver::start(DriverOpts {
        node_id: "node-topo-7".into(),
        ..DriverOpts::default()
    })
    .await;
    let v = create(&d, create_req("t")).await.unwrap();
    assert_eq!(v.accessible_topology, vec![topology("node-topo-7")]);
    let listed = d.list_all().await;
    assert_eq!(listed[0].accessible_topology, vec![topology("node-topo-7")]);
}

#[tokio::test]
async fn create_checks_topology_requirements() {
    let d = Driver::start_default().await;
    let this = topology(NODE_ID);
    let other = topology("some-other-node");
    let zone = csi::Topology {
        segments: HashMap::from([("topology.kubernetes.io/zone".to_owned(), "z1".to_owned())]),
    };
    let req = |name: &str, requisite: Vec<csi::Topology>, preferred: Vec<csi::Topology>| {
        csi::CreateVolumeRequest {
            accessibility_requirements: Some(csi::TopologyRequirement {
                requisite,
                preferred,
            }),
            ..create_req(name)
        }
    };
    for (what, r) in [
        ("requisite other", req("r1", vec![other.clone()], vec![])),
        ("preferred other", req("r2", vec![], vec![other.clone()])),
        (
            "both other",
            req("r3", vec![other.clone()], vec![other.clone()]),
        ),
        ("other key", req("r4", vec![zone.clone()], vec![])),
    ] {
        assert_code(
            what,
            d.controller().create_volume(r).await,
            Code::ResourceExhausted,
        );
    }
    assert!(d.list_all().await.is_empty());
    assert!(d.volume_dirs("default").is_empty());

    for (what, r) in [
        ("requisite this", req("o1", vec![this.clone()], vec![])),
        ("preferred this", req("o2", vec![], vec![this.clone()])),
        (
            "requisite other+this, preferred this",
            req("o3", vec![other.clone(), this.clone()], vec![this.clone()]),
        ),
        ("empty requirement", req("o4", vec![], vec![])),
    ] {
        let v = create(&d, r)
            .await
            .unwrap_or_else(|s| panic!("{what}: {s:?}"));
        assert_eq!(v.accessible_topology, vec![this.clone()], "{what}");
    }
}

/// Every request is INVALID_ARGUMENT, and none leaves a volume behind.
#[tokio::test]
async fn create_rejects_unsupported_requests() {
    let d = Driver::start_default().await;
    let cases = unsupported_capabilities()
        .into_iter()
        .chain(unsupported_parameters_and_sources());
    for (what, r) in cases {
        assert_code(
            what,
            d.controller().create_volume(r).await,
            Code::InvalidArgument,
        );
    }
    assert!(d.list_all().await.is_empty());
    assert!(d.volume_dirs("default").is_empty());
}

/// The volume "x" with these capabilities.
fn with_caps(caps: Vec<csi::VolumeCapability>) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        volume_capabilities: caps,
        ..create_req("x")
    }
}

/// CreateVolume requests with capabilities the driver refuses: block (on this
/// dir pool), none, or a multi-node access mode (alone or among others).
fn unsupported_capabilities() -> Vec<(&'static str, csi::CreateVolumeRequest)> {
    use AccessMode as M;
    let mut cases = vec![
        (
            "block on a dir pool",
            with_caps(vec![block_cap(M::SingleNodeWriter)]),
        ),
        (
            "mixed block and mount",
            with_caps(vec![
                mount_cap(M::SingleNodeWriter),
                block_cap(M::SingleNodeWriter),
            ]),
        ),
        ("no capabilities", with_caps(vec![])),
    ];
    for m in [
        M::MultiNodeReaderOnly,
        M::MultiNodeSingleWriter,
        M::MultiNodeMultiWriter,
    ] {
        cases.push(("multi-node mode", with_caps(vec![mount_cap(m)])));
        cases.push((
            "multi-node mode among others",
            with_caps(vec![mount_cap(M::SingleNodeWriter), mount_cap(m)]),
        ));
    }
    cases
}

/// CreateVolume requests with an unknown parameter or pool, an invalid pool
/// name, format options (a dir pool makes no filesystem; a bad value), a
/// content source (snapshot or volume: none on a dir pool), mutable
/// parameters, or no name.
fn unsupported_parameters_and_sources() -> Vec<(&'static str, csi::CreateVolumeRequest)> {
    let mut cases = vec![
        (
            "unknown parameter",
            csi::CreateVolumeRequest {
                parameters: params(&[("colour", "blue")]),
                ..create_req("x")
            },
        ),
        (
            "unknown pool",
            csi::CreateVolumeRequest {
                parameters: params(&[("pool", "nope")]),
                ..create_req("x")
            },
        ),
        (
            "invalid pool name",
            csi::CreateVolumeRequest {
                parameters: params(&[("pool", "Not_A_Pool")]),
                ..create_req("x")
            },
        ),
        (
            "format options on a dir pool",
            csi::CreateVolumeRequest {
                parameters: params(&[("format.xfs.nrext64", "false")]),
                ..create_req("x")
            },
        ),
        (
            "a bad format value",
            csi::CreateVolumeRequest {
                parameters: params(&[("format.xfs.nrext64", "no")]),
                ..create_req("x")
            },
        ),
        (
            "an unknown format option",
            csi::CreateVolumeRequest {
                parameters: params(&[("format.xfs.crc", "false")]),
                ..create_req("x")
            },
        ),
    ];
    for source in [
        csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource {
            snapshot_id: "snap-1".into(),
        }),
        csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource {
            volume_id: "default.0123456789abcdef0123456789abcdef".into(),
        }),
    ] {
        cases.push((
            "volume_content_source",
            csi::CreateVolumeRequest {
                volume_content_source: Some(csi::VolumeContentSource {
                    r#type: Some(source),
                }),
                ..create_req("x")
            },
        ));
    }
    cases.push((
        "mutable_parameters",
        csi::CreateVolumeRequest {
            mutable_parameters: params(&[("iops", "100")]),
            ..create_req("x")
        },
    ));
    cases.push(("empty name", create_req("")));
    cases
}

#[tokio::test]
async fn create_accepts_every_single_node_mode_and_kubernetes_parameters() {
    let d = Driver::start_default().await;
    use AccessMode as M;
    for (i, m) in [
        M::SingleNodeWriter,
        M::SingleNodeReaderOnly,
        M::SingleNodeSingleWriter,
        M::SingleNodeMultiWriter,
    ]
    .into_iter()
    .enumerate()
    {
        let req = csi::CreateVolumeRequest {
            volume_capabilities: vec![mount_cap(m)],
            parameters: params(&[
                ("csi.storage.k8s.io/pvc/name", "claim"),
                ("csi.storage.k8s.io/pvc/namespace", "default"),
                ("csi.storage.k8s.io/pv/name", "pv-1"),
            ]),
            ..create_req(&format!("mode-{i}"))
        };
        create(&d, req)
            .await
            .unwrap_or_else(|s| panic!("{m:?}: {s:?}"));
    }
    assert_eq!(d.list_all().await.len(), 4);
}

// --- DeleteVolume ------------------------------------------------------------------

#[tokio::test]
async fn delete_is_idempotent_and_removes_the_data() {
    let d = Driver::start_default().await;
    let v = d.create("gone", 0).await;
    let data = d.volume_data_dir(&v.volume_id);
    fs::create_dir(data.join("sub")).unwrap();
    fs::write(data.join("sub/file"), b"data").unwrap();
    d.delete(&v.volume_id).await;
    assert!(!data.exists(), "data dir still there");
    assert!(
        fs::read_dir(d.volumes_dir()).unwrap().next().is_none(),
        "pool not empty after delete"
    );
    d.delete(&v.volume_id).await;
    assert!(d.list_all().await.is_empty());

    // Ids that never existed.
    for id in [
        "default.0123456789abcdef0123456789abcdef",
        "nopool.0123456789abcdef0123456789abcdef",
        "not-a-localvol-id",
        "pool.NOTHEX",
    ] {
        d.delete(id).await;
    }
    // A fresh create with the same name works again.
    let again = d.create("gone", 0).await;
    assert_eq!(again.volume_id, v.volume_id);
    assert!(data.is_dir());
}

#[tokio::test]
async fn delete_keeps_other_volumes() {
    let d = Driver::start_default().await;
    let a = d.create("a", 0).await;
    let b = d.create("b", 0).await;
    fs::write(d.volume_data_dir(&b.volume_id).join("f"), b"b's data").unwrap();
    d.delete(&a.volume_id).await;
    let listed: Vec<_> = d.list_ids().await;
    assert_eq!(listed, std::slice::from_ref(&b.volume_id));
    assert_eq!(
        fs::read(d.volume_data_dir(&b.volume_id).join("f")).unwrap(),
        b"b's data"
    );
}

#[tokio::test]
async fn delete_while_staged_or_published_is_failed_precondition() {
    require_root();
    let d = Driver::start_default().await;
    let v = d.create("busy", 0).await;
    let id = v.volume_id.as_str();
    let data = d.volume_data_dir(id);
    fs::write(data.join("keep"), b"precious").unwrap();
    let staging = d.staging_path("busy");
    d.stage(id, &staging).await;

    let del = || async {
        d.controller()
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.to_owned(),
                ..Default::default()
            })
            .await
    };
    assert_code("delete while staged", del().await, Code::FailedPrecondition);
    assert_eq!(fs::read(data.join("keep")).unwrap(), b"precious");
    assert_eq!(fs::read(staging.join("keep")).unwrap(), b"precious");
    assert_eq!(d.list_all().await.len(), 1);

    // Published, and the staging mount gone (the target still holds the
    // volume). NodeUnstageVolume refuses to do this while published, so the
    // staging mount goes behind the driver's back.
    let target = d.target_path("busy");
    d.publish(id, &staging, &target, false).await;
    assert_code(
        "unstage while published",
        d.node()
            .node_unstage_volume(unstage_req(id, &staging))
            .await,
        Code::FailedPrecondition,
    );
    nix::mount::umount(&staging).unwrap();
    assert!(mount_at(&target).is_some());
    assert_code(
        "delete while published",
        del().await,
        Code::FailedPrecondition,
    );
    assert_eq!(fs::read(target.join("keep")).unwrap(), b"precious");

    d.unpublish(id, &target).await;
    d.delete(id).await;
    assert!(!data.exists());
}

#[tokio::test]
async fn delete_never_reaches_outside_the_volume() {
    require_root();
    let d = Driver::start_default().await;
    let sentinel = Sentinel::new();
    let v = d.create("escape", 0).await;
    let data = d.volume_data_dir(&v.volume_id);

    // Symlinks out of the volume are removed, never followed.
    std::os::unix::fs::symlink(sentinel.path(), data.join("link-dir")).unwrap();
    std::os::unix::fs::symlink(sentinel.path().join("precious"), data.join("link-file")).unwrap();
    fs::create_dir_all(data.join("deep/er")).unwrap();
    std::os::unix::fs::symlink(sentinel.path().join("x"), data.join("deep/er/link")).unwrap();

    // Something mounted inside the volume (by whoever) is never deleted through.
    fs::create_dir(data.join("mnt")).unwrap();
    nix::mount::mount(
        Some(sentinel.path()),
        &data.join("mnt"),
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    assert_code(
        "delete with a mount inside",
        d.controller()
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: v.volume_id.clone(),
                ..Default::default()
            })
            .await,
        Code::FailedPrecondition,
    );
    sentinel.check("delete with a mount inside");
    nix::mount::umount2(&data.join("mnt"), nix::mount::MntFlags::empty()).unwrap();

    d.delete(&v.volume_id).await;
    assert!(!data.exists());
    sentinel.check("delete with symlinks out");
}

// --- ValidateVolumeCapabilities ------------------------------------------------------

#[tokio::test]
async fn validate_volume_capabilities() {
    let d = Driver::start_default().await;
    let v = d.create("v", 0).await;
    let validate = |id: &str, caps: Vec<csi::VolumeCapability>| {
        let mut c = d.controller();
        let req = csi::ValidateVolumeCapabilitiesRequest {
            volume_id: id.to_owned(),
            volume_capabilities: caps,
            volume_context: HashMap::from([("k".to_owned(), "v".to_owned())]),
            ..Default::default()
        };
        async move { c.validate_volume_capabilities(req).await }
    };
    use AccessMode as M;
    for caps in [
        vec![mount_cap(M::SingleNodeWriter)],
        vec![mount_cap(M::SingleNodeReaderOnly)],
        vec![mount_cap(M::SingleNodeSingleWriter)],
        vec![mount_cap(M::SingleNodeMultiWriter)],
        vec![
            mount_cap(M::SingleNodeWriter),
            mount_cap(M::SingleNodeReaderOnly),
        ],
        vec![mount_cap_flags(M::SingleNodeWriter, &["noexec", "nosuid"])],
    ] {
        let r = ok("validate", validate(&v.volume_id, caps.clone()).await);
        let confirmed = r
            .confirmed
            .unwrap_or_else(|| panic!("{caps:?} not confirmed: {}", r.message));
        assert_eq!(confirmed.volume_capabilities, caps);
    }
    for (what, caps) in [
        ("block", vec![block_cap(M::SingleNodeWriter)]),
        ("multi-node", vec![mount_cap(M::MultiNodeMultiWriter)]),
        (
            "mount + block",
            vec![
                mount_cap(M::SingleNodeWriter),
                block_cap(M::SingleNodeWriter),
            ],
        ),
        ("unknown mode", vec![mount_cap_raw_mode(42)]),
    ] {
        let r = ok(what, validate(&v.volume_id, caps).await);
        assert!(r.confirmed.is_none(), "{what}: confirmed {r:?}");
        assert!(!r.message.is_empty(), "{what}: no message");
    }
    let writer = || vec![mount_cap(M::SingleNodeWriter)];
    for (what, id, caps, code) in [
        (
            "unknown well-formed id",
            "default.0123456789abcdef0123456789abcdef",
            writer(),
            Code::NotFound,
        ),
        ("foreign id", "no-such-volume", writer(), Code::NotFound),
        ("empty id", "", writer(), Code::InvalidArgument),
        (
            "empty capabilities",
            v.volume_id.as_str(),
            vec![],
            Code::InvalidArgument,
        ),
    ] {
        assert_code(what, validate(id, caps).await, code);
    }
}

// --- ListVolumes -------------------------------------------------------------------

#[tokio::test]
async fn list_volumes_pages() {
    let d = Driver::start_default().await;
    let mut created = BTreeSet::new();
    for i in 0..7 {
        created.insert(d.create(&format!("vol-{i}"), (i + 1) * MI).await.volume_id);
    }
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    let mut token = String::new();
    loop {
        let r = ok("ListVolumes", d.list_page(3, &token).await);
        sizes.push(r.entries.len());
        for e in &r.entries {
            let v = e.volume.as_ref().expect("entry without a volume");
            assert!(v.capacity_bytes > 0);
            assert_eq!(v.accessible_topology, vec![topology(NODE_ID)]);
            seen.push(v.volume_id.clone());
        }
        if r.next_token.is_empty() {
            break;
        }
        token = r.next_token;
        assert!(sizes.len() < 10, "paging does not end");
    }
    assert_eq!(sizes, [3, 3, 1]);
    assert_eq!(seen.len(), 7, "an id was listed twice: {seen:?}");
    assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), created);

    // No limit, or a limit above the count: everything, no token.
    for max in [0, 7, 100] {
        let r = ok("ListVolumes", d.list_page(max, "").await);
        assert_eq!(r.entries.len(), 7, "max_entries {max}");
        assert!(r.next_token.is_empty(), "max_entries {max}");
    }
    // Sizes are what CreateVolume asked for.
    let mut listed: Vec<i64> = d
        .list_all()
        .await
        .iter()
        .map(|v| v.capacity_bytes)
        .collect();
    listed.sort();
    assert_eq!(listed, (1..=7).map(|i| i * MI).collect::<Vec<_>>());
}

/// An answer holds at most 1,000 entries, whatever `max_entries` asks (0
/// included): a node with many volumes never builds one huge answer, and
/// `next_token` leads on to the rest (the spec lets a plugin answer fewer).
#[tokio::test]
async fn list_volumes_answers_are_capped_and_lead_on() {
    const CAP: usize = 1000;
    let d = Driver::start_default().await;
    let mut created = BTreeSet::new();
    for i in 0..CAP + 3 {
        created.insert(d.create(&format!("many-{i}"), MI).await.volume_id);
    }
    for max in [0, CAP as i32 + 1, i32::MAX] {
        let r = ok("ListVolumes", d.list_page(max, "").await);
        assert_eq!(r.entries.len(), CAP, "max_entries {max}");
        assert!(!r.next_token.is_empty(), "max_entries {max}: no next_token");
        let rest = ok("ListVolumes", d.list_page(max, &r.next_token).await);
        assert_eq!(rest.entries.len(), 3, "max_entries {max}");
        assert!(rest.next_token.is_empty(), "max_entries {max}");
    }
    let listed: BTreeSet<String> = d
        .list_all()
        .await
        .into_iter()
        .map(|v| v.volume_id)
        .collect();
    assert_eq!(listed, created);
}

/// Pages are cut from the volumes of every pool in id order. `p1-x.` sorts
/// before `p1.` (`-` before `.`), so the pools' ids do not simply follow
/// their names; each page must still continue exactly where its token says,
/// at every page size, and a volume deleted between pages is not listed.
#[tokio::test]
async fn list_volumes_pages_across_pools() {
    let d = Driver::start(DriverOpts {
        pools: vec![
            PoolOpts::new("p1"),
            PoolOpts::new("p1-x"),
            PoolOpts::new("p0"),
        ],
        ..DriverOpts::default()
    })
    .await;
    let mut all = BTreeSet::new();
    for (i, pool) in ["p1", "p1-x", "p0"].iter().cycle().take(11).enumerate() {
        let mut req = create_req(&format!("multi-{i}"));
        req.parameters = params(&[("pool", pool)]);
        let v = ok("CreateVolume", d.controller().create_volume(req).await);
        all.insert(v.volume.unwrap().volume_id);
    }
    let sorted: Vec<String> = all.iter().cloned().collect();
    for max in 1..=12 {
        let (mut seen, mut token) = (Vec::new(), String::new());
        loop {
            let r = ok("ListVolumes", d.list_page(max, &token).await);
            assert!(r.entries.len() <= max as usize);
            seen.extend(
                r.entries
                    .iter()
                    .map(|e| e.volume.as_ref().unwrap().volume_id.clone()),
            );
            if r.next_token.is_empty() {
                break;
            }
            token = r.next_token;
        }
        assert_eq!(seen, sorted, "max_entries {max}");
    }
    // A token names the next page's first volume; deleting the volume before
    // it does not disturb the page, deleting the token's own is ABORTED.
    let r = ok("ListVolumes", d.list_page(4, "").await);
    let token = r.next_token.clone();
    assert_eq!(token, sorted[4]);
    ok(
        "DeleteVolume",
        d.controller().delete_volume(delete_req(&sorted[3])).await,
    );
    let r = ok("ListVolumes", d.list_page(4, &token).await);
    let page: Vec<_> = r
        .entries
        .iter()
        .map(|e| e.volume.as_ref().unwrap().volume_id.clone())
        .collect();
    assert_eq!(page, sorted[4..8]);
    ok(
        "DeleteVolume",
        d.controller().delete_volume(delete_req(&token)).await,
    );
    assert_code("deleted token", d.list_page(4, &token).await, Code::Aborted);
}

#[tokio::test]
async fn list_volumes_bad_requests() {
    let d = Driver::start_default().await;
    let r = ok(
        "ListVolumes (empty)",
        d.controller()
            .list_volumes(csi::ListVolumesRequest::default())
            .await,
    );
    assert!(r.entries.is_empty() && r.next_token.is_empty());
    d.create("a", 0).await;
    for token in ["bogus", "default.0123456789abcdef0123456789abcdef", "../x"] {
        assert_code(token, d.list_page(1, token).await, Code::Aborted);
    }
    for max in [-1, i32::MIN] {
        assert_code(
            "negative max_entries",
            d.list_page(max, "").await,
            Code::InvalidArgument,
        );
    }
}

// --- GetCapacity -------------------------------------------------------------------

#[tokio::test]
async fn get_capacity_honours_the_pool_capacity() {
    let d = Driver::start(DriverOpts::with_pool(
        PoolOpts::new("capped").capacity("64Mi"),
    ))
    .await;
    let plenty = fs_available(d.dir()) > 4 * GI;
    let before = d.capacity(None).await;
    assert!(before.available_capacity <= 64 * MI, "{before:?}");
    assert!(before.available_capacity > 0, "{before:?}");
    let max = before.maximum_volume_size.expect("maximum_volume_size");
    assert!(max > 0 && max <= 64 * MI, "{before:?}");
    if plenty {
        assert_eq!(before.available_capacity, 64 * MI);
    }
    d.create("a", 16 * MI).await;
    let after = d.capacity(Some("capped")).await;
    assert!(after.available_capacity <= 48 * MI, "{after:?}");
    assert!(after.maximum_volume_size.unwrap() <= 48 * MI, "{after:?}");
    if plenty {
        assert_eq!(after.available_capacity, 48 * MI);
    }
    d.create("b", 48 * MI).await;
    let full = d.capacity(None).await;
    assert_eq!(full.available_capacity, 0, "{full:?}");
    assert_code(
        "create in a full pool",
        d.controller().create_volume(sized("c", MI, 0)).await,
        Code::ResourceExhausted,
    );
}

#[tokio::test]
async fn get_capacity_honours_the_reserve() {
    let d = Driver::start(DriverOpts {
        pools: vec![
            PoolOpts::new("capped").capacity("64Mi").reserve("16Mi"),
            PoolOpts::new("open"),
            PoolOpts::new("reserved").reserve("1Gi"),
        ],
        ..DriverOpts::default()
    })
    .await;
    let capped = d.capacity(Some("capped")).await;
    assert!(capped.available_capacity <= 48 * MI, "{capped:?}");
    if fs_available(d.dir()) > 4 * GI {
        assert_eq!(capped.available_capacity, 48 * MI);
        // Same filesystem: the reserved pool offers 1Gi less than the open one.
        let open = d.capacity(Some("open")).await.available_capacity;
        let reserved = d.capacity(Some("reserved")).await.available_capacity;
        let diff = open - reserved;
        assert!(
            (diff - GI).abs() < 64 * MI,
            "open {open}, reserved {reserved}: the reserve is not honoured"
        );
    }
    assert_code(
        "more than capacity minus reserve",
        d.controller()
            .create_volume(csi::CreateVolumeRequest {
                parameters: params(&[("pool", "capped")]),
                ..sized("big", 50 * MI, 0)
            })
            .await,
        Code::OutOfRange,
    );
}

#[tokio::test]
async fn get_capacity_for_other_topology_or_block_is_zero() {
    let d = Driver::start(DriverOpts::with_pool(PoolOpts::new("p").capacity("64Mi"))).await;
    let get = |caps: Vec<csi::VolumeCapability>, topo: Option<csi::Topology>| {
        let mut c = d.controller();
        async move {
            c.get_capacity(csi::GetCapacityRequest {
                volume_capabilities: caps,
                parameters: HashMap::new(),
                accessible_topology: topo,
            })
            .await
        }
    };
    use AccessMode as M;
    let r = ok(
        "this node",
        get(
            vec![mount_cap(M::SingleNodeWriter)],
            Some(topology(NODE_ID)),
        )
        .await,
    );
    assert!(r.available_capacity > 0, "{r:?}");
    let r = ok("no caps, no topology", get(vec![], None).await);
    assert!(r.available_capacity > 0, "{r:?}");
    let r = ok(
        "other node",
        get(
            vec![mount_cap(M::SingleNodeWriter)],
            Some(topology("elsewhere")),
        )
        .await,
    );
    assert_eq!(r.available_capacity, 0, "{r:?}");
    let r = ok(
        "block",
        get(vec![block_cap(M::SingleNodeWriter)], None).await,
    );
    assert_eq!(r.available_capacity, 0, "{r:?}");
    assert_code(
        "multi-node caps",
        get(vec![mount_cap(M::MultiNodeMultiWriter)], None).await,
        Code::InvalidArgument,
    );
    for (what, p) in [
        ("unknown pool", params(&[("pool", "nope")])),
        ("unknown parameter", params(&[("colour", "blue")])),
    ] {
        assert_code(
            what,
            d.controller()
                .get_capacity(csi::GetCapacityRequest {
                    volume_capabilities: vec![],
                    parameters: p,
                    accessible_topology: None,
                })
                .await,
            Code::InvalidArgument,
        );
    }
}

// --- ControllerExpandVolume ----------------------------------------------------------

fn expand_req(id: &str, required: i64, limit: i64) -> csi::ControllerExpandVolumeRequest {
    csi::ControllerExpandVolumeRequest {
        volume_id: id.to_owned(),
        capacity_range: Some(range(required, limit)),
        volume_capability: Some(mount_cap(AccessMode::SingleNodeWriter)),
        ..Default::default()
    }
}

async fn expand(
    d: &Driver,
    req: csi::ControllerExpandVolumeRequest,
) -> Result<tonic::Response<csi::ControllerExpandVolumeResponse>, tonic::Status> {
    d.controller().controller_expand_volume(req).await
}

/// ControllerExpandVolume on a 64 MiB pool, step by step: each step checks
/// one behaviour on the 10 MiB volume "grow" and what the previous ones left.
#[tokio::test]
async fn controller_expand_volume() {
    let d = Driver::start(DriverOpts::with_pool(PoolOpts::new("p").capacity("64Mi"))).await;
    let v = d.create("grow", 10 * MI).await;
    let id = v.volume_id.as_str();
    let grown = expand_grows_the_volume_and_the_pool_follows(&d, id).await;
    expand_to_a_range_already_satisfied_changes_nothing(&d, id, grown).await;
    expand_that_shrinks_or_outgrows_the_pool_is_out_of_range(&d, id).await;
    d.create("other", 40 * MI).await;
    expand_beyond_the_free_space_is_out_of_range_then_recovers_lower(&d, id).await;
    expand_of_another_nodes_id_is_left_to_node_expansion(&d).await;
    assert_eq!(d.list_all().await.len(), 2, "nothing was created");
    expand_checks_its_request(&d, id).await;
}

/// 10 MiB to (at least) 20 MiB, no node expansion needed; ListVolumes and
/// GetCapacity follow. Returns the new size.
async fn expand_grows_the_volume_and_the_pool_follows(d: &Driver, id: &str) -> i64 {
    let r = ok("grow", expand(d, expand_req(id, 20 * MI, 0)).await);
    assert!(r.capacity_bytes >= 20 * MI, "{r:?}");
    assert!(!r.node_expansion_required, "{r:?}");
    let listed = d.list_all().await;
    assert_eq!(listed[0].capacity_bytes, r.capacity_bytes);
    assert_eq!(
        d.capacity(None).await.available_capacity,
        64 * MI - r.capacity_bytes,
        "the pool's accounting follows the expansion"
    );
    r.capacity_bytes
}

/// Repeats and ranges the volume already satisfies answer its size.
async fn expand_to_a_range_already_satisfied_changes_nothing(d: &Driver, id: &str, size: i64) {
    for (req, lim) in [(20 * MI, 0), (20 * MI, 30 * MI), (5 * MI, 0)] {
        let again = ok("expand again", expand(d, expand_req(id, req, lim)).await);
        assert_eq!(again.capacity_bytes, size, "({req}, {lim})");
    }
}

/// Shrinking (a limit below the current size), or growing beyond what the
/// pool can ever hold, is OUT_OF_RANGE.
async fn expand_that_shrinks_or_outgrows_the_pool_is_out_of_range(d: &Driver, id: &str) {
    for (what, req) in [
        ("shrink", expand_req(id, 5 * MI, 5 * MI)),
        ("shrink (limit only)", expand_req(id, 0, 5 * MI)),
        ("grow beyond the pool", expand_req(id, 100 * MI, 0)),
    ] {
        assert_code(what, expand(d, req).await, Code::OutOfRange);
    }
}

/// Growing beyond what the pool has free (40 MiB of it taken by "other") is
/// OUT_OF_RANGE (the spec's code for a range the plugin cannot satisfy,
/// which Kubernetes treats as infeasible, so that the user may lower the
/// request: RecoverVolumeExpansionFailure), and the volume keeps its 20 MiB;
/// the message says how far it can grow. A lower request that fits (24 MiB:
/// 4 MiB are free) then succeeds, again on a repeat.
async fn expand_beyond_the_free_space_is_out_of_range_then_recovers_lower(d: &Driver, id: &str) {
    let size_of = |listed: Vec<csi::Volume>| {
        listed
            .iter()
            .find(|x| x.volume_id == id)
            .unwrap()
            .capacity_bytes
    };
    let e = assert_code(
        "grow beyond the free space",
        expand(d, expand_req(id, 30 * MI, 0)).await,
        Code::OutOfRange,
    );
    assert!(
        e.message()
            .contains(&format!("ask for at most {} bytes", 24 * MI)),
        "{}",
        e.message()
    );
    assert_eq!(size_of(d.list_all().await), 20 * MI);
    for round in ["lower", "lower again"] {
        let r = ok(round, expand(d, expand_req(id, 24 * MI, 0)).await);
        assert_eq!(r.capacity_bytes, 24 * MI, "{round}");
        assert_eq!(size_of(d.list_all().await), 24 * MI, "{round}");
    }
}

/// An id in localvol's format that is not here may live on another node
/// (the resizer calls the driver on its own node): the answer leaves the
/// size to NodeExpandVolume on the volume's node.
async fn expand_of_another_nodes_id_is_left_to_node_expansion(d: &Driver) {
    for elsewhere in [
        "p.0123456789abcdef0123456789abcdef",
        "nope.0123456789abcdef0123456789abcdef",
    ] {
        let r = ok(
            elsewhere,
            expand(d, expand_req(elsewhere, 20 * MI, 0)).await,
        );
        assert!(r.node_expansion_required, "{elsewhere}: {r:?}");
        assert_eq!(r.capacity_bytes, 20 * MI, "{elsewhere}: {r:?}");
        let limit_only = ok(
            elsewhere,
            expand(d, expand_req(elsewhere, 0, 30 * MI)).await,
        );
        assert_eq!(
            limit_only.capacity_bytes,
            30 * MI,
            "{elsewhere}: {limit_only:?}"
        );
    }
}

/// A string that is not a localvol id names no volume anywhere (NOT_FOUND);
/// a missing or inverted range, a negative size or no id is INVALID_ARGUMENT.
async fn expand_checks_its_request(d: &Driver, id: &str) {
    let ia = Code::InvalidArgument;
    for (what, req, code) in [
        ("foreign", expand_req("foreign", 20 * MI, 0), Code::NotFound),
        (
            "no capacity range",
            csi::ControllerExpandVolumeRequest {
                capacity_range: None,
                ..expand_req(id, 0, 0)
            },
            ia,
        ),
        ("required > limit", expand_req(id, 30 * MI, 25 * MI), ia),
        ("negative", expand_req(id, -1, 0), ia),
        ("empty id", expand_req("", 20 * MI, 0), ia),
    ] {
        assert_code(what, expand(d, req).await, code);
    }
}

#[tokio::test]
async fn expanded_size_survives_a_restart() {
    let mut d = Driver::start_default().await;
    let v = d.create("grow", 10 * MI).await;
    ok(
        "grow",
        d.controller()
            .controller_expand_volume(expand_req(&v.volume_id, 30 * MI, 0))
            .await,
    );
    d.restart().await;
    assert_eq!(d.list_all().await[0].capacity_bytes, 30 * MI);
}

// --- Capabilities and unimplemented RPCs ----------------------------------------------

#[tokio::test]
async fn controller_get_capabilities() {
    let d = Driver::start_default().await;
    let r = ok(
        "ControllerGetCapabilities",
        d.controller()
            .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await,
    );
    let mut got = controller_caps(&r);
    got.sort();
    let mut want = vec![
        Rpc::CreateDeleteVolume as i32,
        Rpc::ListVolumes as i32,
        Rpc::GetCapacity as i32,
        Rpc::SingleNodeMultiWriter as i32,
        Rpc::ExpandVolume as i32,
        // Always advertised, like EXPAND_VOLUME: the central external-resizer
        // may run on a node with dir pools only and still has to modify the
        // LVM volumes of other nodes.
        Rpc::ModifyVolume as i32,
    ];
    want.sort();
    assert_eq!(got, want, "{r:?}");
    // Not advertised (snapshots only with a pool that can take them), and
    // not implemented either (checked below).
    for absent in [
        Rpc::PublishUnpublishVolume,
        Rpc::CreateDeleteSnapshot,
        Rpc::ListSnapshots,
        Rpc::CloneVolume,
        Rpc::GetVolume,
    ] {
        assert!(!got.contains(&(absent as i32)), "{absent:?} advertised");
    }
}

#[tokio::test]
async fn unimplemented_rpcs() {
    let d = Driver::start_default().await;
    let v = d.create("v", 0).await;
    let id = v.volume_id.clone();
    let mut c = d.controller();
    let u = Code::Unimplemented;
    assert_code(
        "ControllerPublishVolume",
        c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: NODE_ID.into(),
            volume_capability: Some(mount_cap(AccessMode::SingleNodeWriter)),
            ..Default::default()
        })
        .await,
        u,
    );
    assert_code(
        "ControllerUnpublishVolume",
        c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: id.clone(),
            node_id: NODE_ID.into(),
            ..Default::default()
        })
        .await,
        u,
    );
    assert_code(
        "CreateSnapshot",
        c.create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: id.clone(),
            name: "snap".into(),
            ..Default::default()
        })
        .await,
        u,
    );
    assert_code(
        "DeleteSnapshot",
        c.delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: "snap".into(),
            ..Default::default()
        })
        .await,
        u,
    );
    assert_code(
        "ListSnapshots",
        c.list_snapshots(csi::ListSnapshotsRequest::default()).await,
        u,
    );
    assert_code(
        "ControllerGetVolume",
        c.controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: id.clone(),
        })
        .await,
        u,
    );
    // The group controller service is not served at all.
    let ch = d.endpoint.connect().await.unwrap();
    let mut g = csi::group_controller_client::GroupControllerClient::new(ch);
    assert_code(
        "GroupControllerGetCapabilities",
        g.group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {})
            .await,
        u,
    );
    // None of that touched the volume.
    assert_eq!(d.list_all().await.len(), 1);
}

/// ControllerModifyVolume on a node with a dir pool and no cluster: no
/// parameters is a no-op for a volume that exists; IO limits are refused
/// (a dir volume is not a block device `io.max` can name) before anything
/// is recorded; a volume nobody has is NOT_FOUND.
#[tokio::test]
async fn modify_volume_on_a_dir_pool() {
    let d = Driver::start_default().await;
    let v = d.create("v", 0).await;
    let mut c = d.controller();
    let modify = |id: &str, kv: &[(&str, &str)]| csi::ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: params(kv),
        ..Default::default()
    };
    c.controller_modify_volume(modify(&v.volume_id, &[]))
        .await
        .expect("ControllerModifyVolume without parameters");
    let e = assert_code(
        "IO limits on a dir volume",
        c.controller_modify_volume(modify(&v.volume_id, &[("readIOPS", "100")]))
            .await,
        Code::InvalidArgument,
    );
    assert!(e.message().contains("readIOPS"), "{e:?}");
    assert_code(
        "unknown parameter",
        c.controller_modify_volume(modify(&v.volume_id, &[("iops", "1")]))
            .await,
        Code::InvalidArgument,
    );
    for (what, id) in [
        ("missing volume", "default.0123456789abcdef0123456789abcdef"),
        ("foreign id", "no-such-volume"),
    ] {
        assert_code(
            what,
            c.controller_modify_volume(modify(id, &[])).await,
            Code::NotFound,
        );
    }
    assert_code(
        "empty id",
        c.controller_modify_volume(modify("", &[])).await,
        Code::InvalidArgument,
    );
}
