//! Identity service: GetPluginInfo, GetPluginCapabilities, Probe.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use localvol::csi;
use localvol::csi::plugin_capability::{self, service, volume_expansion};
use sanity_tests::*;

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

async fn probe(d: &Driver) -> Option<bool> {
    ok("Probe", d.identity().probe(csi::ProbeRequest {}).await).ready
}

#[tokio::test]
async fn probe_not_ready_while_the_pool_dir_is_gone() {
    let d = Driver::start_default().await;
    let vol = d.create("keep-me", 0).await;
    let volumes = d.volumes_dir();
    let aside = volumes.with_file_name("volumes.aside");

    // Renamed behind the driver's back.
    fs::rename(&volumes, &aside).unwrap();
    assert_eq!(probe(&d).await, Some(false), "volumes dir renamed away");
    fs::rename(&aside, &volumes).unwrap();
    assert_eq!(probe(&d).await, Some(true), "volumes dir restored");

    // Replaced by a regular file.
    fs::rename(&volumes, &aside).unwrap();
    fs::write(&volumes, b"not a dir").unwrap();
    assert_eq!(probe(&d).await, Some(false), "volumes is a file");
    fs::remove_file(&volumes).unwrap();
    fs::rename(&aside, &volumes).unwrap();
    assert_eq!(probe(&d).await, Some(true), "volumes dir restored again");

    // The volume survived all of that.
    let listed = d.list_all().await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].volume_id, vol.volume_id);
    assert!(d.volume_data_dir(&vol.volume_id).is_dir());
}

#[tokio::test]
async fn probe_checks_every_pool() {
    let d = Driver::start(DriverOpts {
        pools: vec![PoolOpts::new("one"), PoolOpts::new("two")],
        ..DriverOpts::default()
    })
    .await;
    assert_eq!(probe(&d).await, Some(true));
    let second = d.pool_dir("two").join("volumes");
    let aside = second.with_file_name("volumes.aside");
    fs::rename(&second, &aside).unwrap();
    assert_eq!(probe(&d).await, Some(false), "second pool's dir is gone");
    fs::rename(&aside, &second).unwrap();
    assert_eq!(probe(&d).await, Some(true));
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
