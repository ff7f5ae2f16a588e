//! Identity service: GetPluginInfo, GetPluginCapabilities, Probe.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use localvol::csi;
use localvol::csi::plugin_capability::{self, service, volume_expansion};
use sanity_tests::*;
use tonic::Code;

#[tokio::test]
async fn plugin_info_reports_name_and_crate_version() {
    let d = Driver::start_default().await;
    let r = ok(
        "GetPluginInfo",
        d.identity()
            .get_plugin_info(csi::GetPluginInfoRequest {})
            .await,
    );
    assert_eq!(r.name, "localvol.csi.dev");
    assert_eq!(r.vendor_version, crate_version());
    assert!(!r.vendor_version.is_empty());
}

#[tokio::test]
async fn plugin_info_honours_driver_name_flag() {
    let d = Driver::start(DriverOpts {
        driver_name: Some("other.example.com".into()),
        ..DriverOpts::default()
    })
    .await;
    let r = ok(
        "GetPluginInfo",
        d.identity()
            .get_plugin_info(csi::GetPluginInfoRequest {})
            .await,
    );
    assert_eq!(r.name, "other.example.com");
}

#[tokio::test]
async fn plugin_capabilities() {
    let d = Driver::start_default().await;
    let r = ok(
        "GetPluginCapabilities",
        d.identity()
            .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
            .await,
    );
    let mut services = Vec::new();
    let mut expansion = Vec::new();
    for c in &r.capabilities {
        match &c.r#type {
            Some(plugin_capability::Type::Service(s)) => services.push(s.r#type),
            Some(plugin_capability::Type::VolumeExpansion(e)) => expansion.push(e.r#type),
            None => panic!("capability without a type: {c:?}"),
        }
    }
    services.sort();
    assert_eq!(
        services,
        [
            service::Type::ControllerService as i32,
            service::Type::VolumeAccessibilityConstraints as i32
        ],
        "{r:?}"
    );
    assert_eq!(expansion, [volume_expansion::Type::Online as i32], "{r:?}");
}

#[tokio::test]
async fn probe_is_ready() {
    let d = Driver::start_default().await;
    for _ in 0..3 {
        let r = ok("Probe", d.identity().probe(csi::ProbeRequest {}).await);
        assert_eq!(r.ready, Some(true));
    }
}

#[tokio::test]
async fn serve_refuses_a_bad_config() {
    let mut d = Driver::new(DriverOpts {
        pools: vec![PoolOpts::new("twin"), PoolOpts::new("twin")],
        ..DriverOpts::default()
    });
    let err = d.try_start_again().await.unwrap_err();
    assert!(err.contains("exited"), "{err}");
    assert!(err.contains("listed twice"), "{err}");
}

#[tokio::test]
async fn serve_never_replaces_a_file_that_is_not_a_socket() {
    let mut d = Driver::new(DriverOpts::default());
    fs::write(d.socket_path(), b"important").unwrap();
    let err = d.try_start_again().await.unwrap_err();
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(fs::read(d.socket_path()).unwrap(), b"important");
}

#[tokio::test]
async fn serve_refuses_a_bad_node_id() {
    for bad in ["with space", "tab\there"] {
        let mut d = Driver::new(DriverOpts {
            node_id: bad.into(),
            ..DriverOpts::default()
        });
        let err = d.try_start_again().await.unwrap_err();
        assert!(err.contains("exited"), "{bad:?}: {err}");
    }
}

#[tokio::test]
async fn socket_permissions() {
    let d = Driver::start_default().await;
    let md = fs::symlink_metadata(d.socket_path()).unwrap();
    assert_eq!(
        md.permissions().mode() & 0o777,
        0o600,
        "default socket mode"
    );

    let d = Driver::start(DriverOpts {
        socket_group: Some("root".into()),
        ..DriverOpts::default()
    })
    .await;
    let md = fs::symlink_metadata(d.socket_path()).unwrap();
    assert_eq!(
        md.permissions().mode() & 0o777,
        0o660,
        "socket mode with a group"
    );
    assert_eq!(md.gid(), 0);

    let mut d = Driver::new(DriverOpts {
        socket_group: Some("no-such-group-localvol".into()),
        ..DriverOpts::default()
    });
    let err = d.try_start_again().await.unwrap_err();
    assert!(err.contains("does not exist"), "{err}");
}

/// A pool whose `device:` cannot be taken (here not a block device at all)
/// does not start, and does not take the plugin down: Probe stays ready,
/// the pool offers no capacity, a new volume in it is RESOURCE_EXHAUSTED
/// naming it and why, and the other pool keeps serving (CreateVolume's name
/// check across pools included). The refused pool's directory stays empty:
/// nothing was mounted.
#[tokio::test]
async fn a_pool_whose_disk_is_refused_is_unusable_while_the_others_serve() {
    let mut d = Driver::new(DriverOpts::default());
    let path = d.dir().join("on-disk");
    d.opts_mut().extra_config = format!(
        "  - name: on-disk\n    type: dir\n    path: {}\n    device: /dev/null\n",
        path.display()
    );
    d.start_again().await;
    let probe = must("Probe", d.identity().probe(csi::ProbeRequest {}).await).into_inner();
    assert_eq!(probe.ready, Some(true));
    assert_eq!(d.capacity(Some("on-disk")).await.available_capacity, 0);
    let mut req = create_req("beside-a-refused-pool");
    req.parameters = params(&[("pool", "default")]);
    must(
        "create on the serving pool",
        d.controller().create_volume(req).await,
    );
    let mut req = create_req("on-the-refused-pool");
    req.parameters = params(&[("pool", "on-disk")]);
    let s = must_fail(
        "create on the refused pool",
        d.controller().create_volume(req).await,
        Code::ResourceExhausted,
    );
    assert!(
        s.message().contains("pool on-disk is unusable")
            && s.message().contains("\"/dev/null\" is not a block device"),
        "{s:?}"
    );
    assert_eq!(fs::read_dir(&path).unwrap().count(), 0);
    assert!(mount_at(&path).is_none());
}

/// SNAPSHOT_METADATA_SERVICE is advertised, and the service answers, only
/// with a thin LVM pool in the config (opened or not: here its VG does not
/// exist, so it waits unopened and its calls are UNAVAILABLE). Without one
/// the calls are UNIMPLEMENTED; a dir pool's id is FAILED_PRECONDITION.
#[tokio::test]
async fn snapshot_metadata_is_served_with_a_thin_pool_only() {
    use csi::snapshot_metadata_client::SnapshotMetadataClient;
    let key = "0123456789abcdef0123456789abcdef";
    let req = |id: &str, offset: i64| csi::GetMetadataAllocatedRequest {
        snapshot_id: id.to_owned(),
        starting_offset: offset,
        ..Default::default()
    };
    let offered = |r: &csi::GetPluginCapabilitiesResponse| {
        r.capabilities.iter().any(|c| {
            matches!(&c.r#type, Some(plugin_capability::Type::Service(s))
                if s.r#type == service::Type::SnapshotMetadataService as i32)
        })
    };

    let d = Driver::start_default().await;
    let caps = ok(
        "GetPluginCapabilities",
        d.identity()
            .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
            .await,
    );
    assert!(!offered(&caps), "{caps:?}");
    let mut c = SnapshotMetadataClient::new(d.endpoint.connect().await.unwrap());
    let e = c
        .get_metadata_allocated(req(&format!("default.{key}"), 0))
        .await;
    must_fail("without a thin pool", e, Code::Unimplemented);

    let mut opts = DriverOpts::default();
    opts.lvm_pools
        .push(LvmPoolOpts::new("thin", "localvol-sanity-no-such-vg").thin_pool("tp"));
    let d = Driver::start(opts).await;
    let caps = ok(
        "GetPluginCapabilities",
        d.identity()
            .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
            .await,
    );
    assert!(offered(&caps), "{caps:?}");
    let mut c = SnapshotMetadataClient::new(d.endpoint.connect().await.unwrap());
    let e = c
        .get_metadata_allocated(req(&format!("thin.{key}"), 0))
        .await;
    must_fail("a thin pool not opened", e, Code::Unavailable);
    let e = c
        .get_metadata_allocated(req(&format!("default.{key}"), 0))
        .await;
    let s = must_fail("a dir pool's snapshot", e, Code::FailedPrecondition);
    assert!(s.message().contains("thin LVM"), "{}", s.message());
    let e = c.get_metadata_allocated(req("not-ours", 0)).await;
    must_fail("an id of no pool", e, Code::NotFound);
    let e = c
        .get_metadata_allocated(req(&format!("thin.{key}"), -1))
        .await;
    must_fail("a negative offset", e, Code::InvalidArgument);
    let e = c
        .get_metadata_delta(csi::GetMetadataDeltaRequest {
            base_snapshot_id: String::new(),
            target_snapshot_id: format!("thin.{key}"),
            ..Default::default()
        })
        .await;
    must_fail("a delta without its base", e, Code::InvalidArgument);
}
