//! A pool that cannot serve (its directory gone or replaced, its
//! filesystem unmounted, its mount point not mounted yet) never takes the
//! plugin down: Probe stays ready, the pool offers no capacity, its RPCs
//! are refused with its name and the reason, the other pools serve on, and
//! it serves again once its storage is back, without a restart. The driver
//! looks at its pools every 0.1 s here (`LOCALVOL_POOL_CHECK_INTERVAL`).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use localvol::csi;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use sanity_tests::*;
use tonic::Code;

/// How long a change may take to be seen (the driver looks every 0.1 s).
const SEEN_WITHIN: Duration = Duration::from_secs(10);

/// A volume id of `pool` that names no volume: `existing`'s key with its
/// last digit changed.
fn absent_id(existing: &str, pool: &str) -> String {
    let (_, key) = existing.split_once('.').expect("a pool.key volume id");
    let (head, last) = key.split_at(key.len() - 1);
    let other = if last == "0" { "1" } else { "0" };
    format!("{pool}.{head}{other}")
}

/// DeleteVolume of a volume that is not there: OK while its pool serves,
/// UNAVAILABLE naming the pool and why while it cannot. No side effect
/// either way.
async fn pool_answer(d: &Driver, id: &str) -> Result<(), (Code, String)> {
    let req = csi::DeleteVolumeRequest {
        volume_id: id.to_owned(),
        ..Default::default()
    };
    match d.controller().delete_volume(req).await {
        Ok(_) => Ok(()),
        Err(s) => Err((s.code(), s.message().to_owned())),
    }
}

/// Waits until `pool` (asked through `id`, a volume id in it) is refused
/// as unusable for `why`, and checks what the rest of the driver says
/// meanwhile: Probe ready, the pool's capacity 0.
async fn wait_unusable(d: &Driver, pool: &str, id: &str, why: &str) {
    let start = Instant::now();
    loop {
        let got = pool_answer(d, id).await;
        match &got {
            Err((Code::Unavailable, msg))
                if msg.contains(&format!("pool {pool} is unusable")) && msg.contains(why) =>
            {
                break
            }
            _ if start.elapsed() > SEEN_WITHIN => panic!(
                "pool {pool} should be refused as unusable ({why:?}) within {SEEN_WITHIN:?}; \
                 DeleteVolume of {id} answered {got:?}\n{}",
                d.log_tail(20)
            ),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let probe = must("Probe", d.identity().probe(csi::ProbeRequest {}).await);
    assert_eq!(
        probe.into_inner().ready,
        Some(true),
        "Probe while pool {pool} is unusable"
    );
    let cap = d.capacity(Some(pool)).await;
    assert_eq!(
        cap.available_capacity, 0,
        "an unusable pool offers nothing: {cap:?}"
    );
}

/// Waits until `pool` serves again.
async fn wait_usable(d: &Driver, pool: &str, id: &str) {
    let start = Instant::now();
    loop {
        let got = pool_answer(d, id).await;
        if got.is_ok() {
            return;
        }
        assert!(
            start.elapsed() < SEEN_WITHIN,
            "pool {pool} should serve again within {SEEN_WITHIN:?}; DeleteVolume of {id} answered {got:?}\n{}",
            d.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates a volume in `pool`.
async fn create_in(d: &Driver, name: &str, pool: &str) -> Result<csi::Volume, tonic::Status> {
    let mut req = create_req(name);
    req.parameters = params(&[("pool", pool)]);
    d.controller()
        .create_volume(req)
        .await
        .map(|r| r.into_inner().volume.expect("a volume"))
}

/// A whole lifecycle in `pool`: create, stage, publish, write, unpublish,
/// unstage, delete.
async fn lifecycle(d: &Driver, name: &str, pool: &str) {
    let vol = create_in(d, name, pool)
        .await
        .unwrap_or_else(|s| panic!("CreateVolume {name} in {pool}: {s:?}"));
    let (staging, target) = (d.staging_path(name), d.target_path(name));
    d.stage(&vol.volume_id, &staging).await;
    d.publish(&vol.volume_id, &staging, &target, false).await;
    fs::write(target.join("f"), b"data").unwrap();
    d.unpublish(&vol.volume_id, &target).await;
    d.unstage(&vol.volume_id, &staging).await;
    d.delete(&vol.volume_id).await;
}

#[tokio::test]
async fn an_unusable_pool_leaves_the_others_serving() {
    let port = free_port();
    let d = Driver::start(DriverOpts {
        pools: vec![PoolOpts::new("one"), PoolOpts::new("two")],
        metrics_addr: Some(format!("127.0.0.1:{port}")),
        ..DriverOpts::default()
    })
    .await;
    let kept = d.create("kept-in-one", 0).await;
    let in_two = create_in(&d, "kept-in-two", "two").await.unwrap();
    let probe_id = absent_id(&kept.volume_id, "two");
    let second = d.pool_dir("two").join("volumes");
    let aside = second.with_file_name("volumes.aside");

    fs::rename(&second, &aside).unwrap();
    wait_unusable(&d, "two", &probe_id, "cannot be read").await;
    assert!(d.capacity(Some("one")).await.available_capacity > 0);
    // A new volume there is RESOURCE_EXHAUSTED (the scheduler then tries
    // another node), its own volume's RPCs UNAVAILABLE (retried).
    let s = create_in(&d, "new-in-two", "two").await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert!(s.message().contains("pool two is unusable"), "{s:?}");
    let s = d
        .controller()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: in_two.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    // The other pool: a whole lifecycle, and the list still has every
    // volume it can see.
    lifecycle(&d, "while-two-is-down", "one").await;
    assert!(d.list_ids().await.contains(&kept.volume_id));
    // Shown to an operator: /readyz still ready, naming the pool; the gauge 0.
    let (status, body) = http_get(port, "/readyz").unwrap();
    assert!(status.contains("200"), "{status} {body}");
    assert!(body.contains("unusable: pool two:"), "{body}");
    let (_, metrics) = http_get(port, "/metrics").unwrap();
    assert_eq!(
        metric_value(
            &metrics,
            "localvol_pool_ready{pool=\"two\",backend=\"dir\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        metric_value(
            &metrics,
            "localvol_pool_ready{pool=\"one\",backend=\"dir\"}"
        ),
        Some(1.0)
    );

    fs::rename(&aside, &second).unwrap();
    wait_usable(&d, "two", &probe_id).await;
    assert!(d.capacity(Some("two")).await.available_capacity > 0);
    let ids = d.list_ids().await;
    assert!(ids.contains(&in_two.volume_id), "{ids:?}");
    lifecycle(&d, "after-two-is-back", "two").await;
    assert!(
        d.log_tail(200).contains("pool usable again"),
        "{}",
        d.log_tail(40)
    );
}

#[tokio::test]
async fn a_pool_whose_dir_is_gone_is_unusable_until_it_is_back() {
    let d = Driver::start_default().await;
    let vol = d.create("keep-me", 0).await;
    let id = absent_id(&vol.volume_id, "default");
    let volumes = d.volumes_dir();
    let aside = volumes.with_file_name("volumes.aside");

    // Renamed behind the driver's back.
    fs::rename(&volumes, &aside).unwrap();
    wait_unusable(&d, "default", &id, "cannot be read").await;
    fs::rename(&aside, &volumes).unwrap();
    wait_usable(&d, "default", &id).await;

    // Replaced by a regular file.
    fs::rename(&volumes, &aside).unwrap();
    fs::write(&volumes, b"not a dir").unwrap();
    wait_unusable(&d, "default", &id, "is not a directory").await;
    fs::remove_file(&volumes).unwrap();
    fs::rename(&aside, &volumes).unwrap();
    wait_usable(&d, "default", &id).await;

    // The volume survived all of that.
    let listed = d.list_all().await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].volume_id, vol.volume_id);
    assert!(d.volume_data_dir(&vol.volume_id).is_dir());
}

#[tokio::test]
async fn a_pool_whose_root_is_replaced_is_unusable_until_it_is_back() {
    let d = Driver::start_default().await;
    let vol = d.create("keep-me", 0).await;
    let id = absent_id(&vol.volume_id, "default");
    let root = d.pool_dir("default");
    let aside = root.with_file_name("pool.aside");

    // The pool's root renamed away: nothing at the path.
    fs::rename(&root, &aside).unwrap();
    wait_unusable(&d, "default", &id, "cannot be read").await;
    // A new, empty tree at the same path (what a pool whose disk is gone
    // shows): a directory, writable, but not the one holding the records.
    fs::create_dir_all(root.join("volumes")).unwrap();
    wait_unusable(
        &d,
        "default",
        &id,
        "no longer the directory the pool opened",
    )
    .await;
    // Nothing was written to the impostor.
    assert_eq!(fs::read_dir(root.join("volumes")).unwrap().count(), 0);
    // The real one back.
    fs::remove_dir_all(&root).unwrap();
    fs::rename(&aside, &root).unwrap();
    wait_usable(&d, "default", &id).await;
    assert_eq!(d.list_all().await[0].volume_id, vol.volume_id);
}

/// Unmounts a bind mount when dropped (a failed assertion leaves none).
struct Bound(PathBuf);

impl Bound {
    fn new(from: &Path, at: &Path) -> Bound {
        mount(Some(from), at, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .unwrap_or_else(|e| panic!("bind-mounting {from:?} at {at:?}: {e}"));
        Bound(at.to_owned())
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        let _ = umount2(&self.0, MntFlags::MNT_DETACH);
    }
}

#[tokio::test]
async fn a_pool_whose_filesystem_is_unmounted_is_unusable_until_it_is_back() {
    require_root();
    let mut d = Driver::new(DriverOpts::default());
    let root = d.volumes_dir().parent().unwrap().to_owned();
    let disk = d.dir().join("disk");
    // Below the mount point, a `volumes/` of its own (as an earlier start
    // without the disk mounted would have left): unmounted, the path still
    // shows a writable pool directory.
    fs::create_dir_all(root.join("volumes")).unwrap();
    fs::create_dir_all(&disk).unwrap();
    let first = Bound::new(&disk, &root);
    d.start_again().await;
    let vol = d.create("on-the-disk", 0).await;
    let id = absent_id(&vol.volume_id, "default");
    wait_usable(&d, "default", &id).await;

    drop(first);
    wait_unusable(
        &d,
        "default",
        &id,
        "no longer the directory the pool opened",
    )
    .await;
    let _again = Bound::new(&disk, &root);
    wait_usable(&d, "default", &id).await;
    assert_eq!(d.list_all().await[0].volume_id, vol.volume_id);
}

/// The boot-order case: a dir pool on a disk the node mounts (fstab,
/// systemd) with `requireMountPoint: true`, started before the disk is
/// mounted. The pool waits, unusable, and writes nothing to the directory
/// underneath (where the disk would hide it); the other pool serves; once
/// the disk is mounted the pool opens without a restart, on the disk.
#[tokio::test]
async fn a_pool_that_must_be_a_mount_point_waits_for_its_disk() {
    require_root();
    let mut d = Driver::new(DriverOpts {
        pools: vec![
            PoolOpts::new("default"),
            PoolOpts::new("disk").require_mount_point(true),
        ],
        ..DriverOpts::default()
    });
    let at = d.pool_dir("disk");
    fs::create_dir_all(&at).unwrap();
    d.start_again().await;
    let kept = d.create("on-the-root-disk", 0).await;
    let id = absent_id(&kept.volume_id, "disk");
    wait_unusable(&d, "disk", &id, "is not a mount point").await;
    let s = create_in(&d, "too-early", "disk").await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    lifecycle(&d, "meanwhile", "default").await;
    assert_eq!(
        fs::read_dir(&at).unwrap().count(),
        0,
        "nothing may be written below an unmounted pool's mount point"
    );

    let disk = d.dir().join("the-disk");
    fs::create_dir_all(&disk).unwrap();
    let _mounted = Bound::new(&disk, &at);
    wait_usable(&d, "disk", &id).await;
    let vol = create_in(&d, "on-the-disk", "disk").await.unwrap();
    let (_, key) = vol.volume_id.split_once('.').unwrap();
    assert!(
        disk.join("volumes").join(key).exists(),
        "the volume is on the mounted disk: {:?}",
        fs::read_dir(disk.join("volumes")).map(|r| r.count())
    );
    d.delete(&vol.volume_id).await;
}
