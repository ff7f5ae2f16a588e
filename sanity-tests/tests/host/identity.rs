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

/// Probe's answer: `Ok(ready)`, or the error code and message.
async fn probe(d: &Driver) -> Result<Option<bool>, (Code, String)> {
    match d.identity().probe(csi::ProbeRequest {}).await {
        Ok(r) => Ok(r.into_inner().ready),
        Err(s) => Err((s.code(), s.message().to_owned())),
    }
}

/// Probe says the plugin is not healthy (the CSI spec's "Plugin not
/// healthy": FAILED_PRECONDITION; `ready: false` is for a plugin that is
/// still initializing) and names the pool and `why`.
#[track_caller]
fn assert_unhealthy(got: Result<Option<bool>, (Code, String)>, pool: &str, why: &str) {
    match got {
        Err((Code::FailedPrecondition, msg)) => assert!(
            msg.contains(&format!("pool {pool}: ")) && msg.contains(why),
            "message {msg:?} should name pool {pool} and say {why:?}"
        ),
        other => panic!("expected FAILED_PRECONDITION for pool {pool} ({why}), got {other:?}"),
    }
}

const READY: Result<Option<bool>, (Code, String)> = Ok(Some(true));

#[tokio::test]
async fn probe_unhealthy_while_the_pool_dir_is_gone() {
    let d = Driver::start_default().await;
    let vol = d.create("keep-me", 0).await;
    let volumes = d.volumes_dir();
    let aside = volumes.with_file_name("volumes.aside");

    // Renamed behind the driver's back.
    fs::rename(&volumes, &aside).unwrap();
    assert_unhealthy(probe(&d).await, "default", "cannot be read");
    fs::rename(&aside, &volumes).unwrap();
    assert_eq!(probe(&d).await, READY, "volumes dir restored");

    // Replaced by a regular file.
    fs::rename(&volumes, &aside).unwrap();
    fs::write(&volumes, b"not a dir").unwrap();
    assert_unhealthy(probe(&d).await, "default", "is not a directory");
    fs::remove_file(&volumes).unwrap();
    fs::rename(&aside, &volumes).unwrap();
    assert_eq!(probe(&d).await, READY, "volumes dir restored again");

    // The volume survived all of that.
    let listed = d.list_all().await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].volume_id, vol.volume_id);
    assert!(d.volume_data_dir(&vol.volume_id).is_dir());
}

#[tokio::test]
async fn probe_unhealthy_when_the_pool_root_is_replaced() {
    let d = Driver::start_default().await;
    let vol = d.create("keep-me", 0).await;
    let root = d.pool_dir("default");
    let aside = root.with_file_name("pool.aside");

    // The pool's root renamed away: nothing at the path.
    fs::rename(&root, &aside).unwrap();
    assert_unhealthy(probe(&d).await, "default", "cannot be read");
    // A new, empty tree at the same path (what a pool whose disk is gone
    // shows): a directory, writable, but not the one holding the records.
    fs::create_dir_all(root.join("volumes")).unwrap();
    assert_unhealthy(
        probe(&d).await,
        "default",
        "no longer the directory the pool opened",
    );
    // The real one back.
    fs::remove_dir_all(&root).unwrap();
    fs::rename(&aside, &root).unwrap();
    assert_eq!(probe(&d).await, READY, "pool root restored");
    assert_eq!(d.list_all().await[0].volume_id, vol.volume_id);
}

#[tokio::test]
async fn probe_unhealthy_when_the_pool_filesystem_is_unmounted() {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    require_root();
    let mut d = Driver::new(DriverOpts::default());
    let root = d.volumes_dir().parent().unwrap().to_owned();
    let disk = d.dir().join("disk");
    // Below the mount point, a `volumes/` of its own (as an earlier start
    // without the disk mounted would have left): unmounted, the path still
    // shows a writable pool directory.
    fs::create_dir_all(root.join("volumes")).unwrap();
    fs::create_dir_all(&disk).unwrap();
    let bind = |what: &str| {
        mount(
            Some(&disk),
            &root,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap_or_else(|e| panic!("{what}: bind-mounting {disk:?} at {root:?}: {e}"))
    };
    bind("first mount");
    d.start_again().await;
    let vol = d.create("on-the-disk", 0).await;
    assert_eq!(probe(&d).await, READY);

    umount2(&root, MntFlags::MNT_DETACH).unwrap();
    assert_unhealthy(
        probe(&d).await,
        "default",
        "no longer the directory the pool opened",
    );
    bind("mount again");
    assert_eq!(probe(&d).await, READY, "the pool's filesystem is back");
    assert_eq!(d.list_all().await[0].volume_id, vol.volume_id);
}

#[tokio::test]
async fn probe_checks_every_pool() {
    let d = Driver::start(DriverOpts {
        pools: vec![PoolOpts::new("one"), PoolOpts::new("two")],
        ..DriverOpts::default()
    })
    .await;
    assert_eq!(probe(&d).await, READY);
    let second = d.pool_dir("two").join("volumes");
    let aside = second.with_file_name("volumes.aside");
    fs::rename(&second, &aside).unwrap();
    assert_unhealthy(probe(&d).await, "two", "cannot be read");
    fs::rename(&aside, &second).unwrap();
    assert_eq!(probe(&d).await, READY);
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
/// does not start: Probe names it and why, calls on it are UNAVAILABLE, and
/// the other pool keeps serving (CreateVolume's name check across pools
/// included). The refused pool's directory stays empty: nothing was mounted.
#[tokio::test]
async fn a_pool_whose_disk_is_refused_fails_probe_while_the_others_serve() {
    let mut d = Driver::new(DriverOpts::default());
    let path = d.dir().join("on-disk");
    d.opts_mut().extra_config = format!(
        "  - name: on-disk\n    type: dir\n    path: {}\n    device: /dev/null\n",
        path.display()
    );
    let refused = d
        .start_answering()
        .await
        .expect_err("a pool on /dev/null must not be ready");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("pool on-disk")
            && refused
                .message()
                .contains("\"/dev/null\" is not a block device"),
        "{refused:?}"
    );
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
        Code::Unavailable,
    );
    assert!(s.message().contains("not a block device"), "{s:?}");
    assert_eq!(fs::read_dir(&path).unwrap().count(), 0);
    assert!(mount_at(&path).is_none());
}
