//! Hostile and malformed input. Every case asserts the exact gRPC code, that a
//! sentinel directory outside the driver's roots did not change, that no mount
//! appeared, and that the driver's own valid mounts were left alone.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use localvol::csi;
use sanity_tests::*;
use tonic::{Code, Response, Status};

/// A driver with one staged and published volume, a sentinel directory outside
/// every root, and symlinks inside the kubelet dir that point at the sentinel.
struct Fixture {
    d: Driver,
    sentinel: Sentinel,
    vol: String,
    staging: PathBuf,
    target: PathBuf,
    mounts: MountSnapshot,
    volume_dirs: Vec<String>,
    etc_x_existed: bool,
}

impl Fixture {
    async fn new() -> Self {
        require_root();
        let d = Driver::start(DriverOpts::with_pool(
            PoolOpts::new("default")
                .capacity("64Mi")
                .default_size("16Mi"),
        ))
        .await;
        let sentinel = Sentinel::new();
        let vol = d.create("victim", 8 * MI).await.volume_id;
        fs::write(d.volume_data_dir(&vol).join("data"), b"volume data").unwrap();
        let staging = d.staging_path("victim");
        let target = d.target_path("victim");
        d.stage(&vol, &staging).await;
        d.publish(&vol, &staging, &target, false).await;

        let k = d.kubelet_dir();
        symlink(sentinel.path(), k.join("pods/evil")).unwrap();
        symlink(sentinel.path().join("precious"), k.join("pods/evil-file")).unwrap();
        symlink(sentinel.path(), k.join("staging/evil")).unwrap();
        fs::create_dir_all(k.join("pods/p")).unwrap();
        symlink(sentinel.path(), k.join("pods/p/volumes")).unwrap();
        symlink("../../..", k.join("pods/up")).unwrap();
        // What a pod could plant inside its own volume.
        symlink(sentinel.path(), target.join("planted")).unwrap();
        // A sibling whose name starts with the kubelet dir's name.
        fs::create_dir_all(d.dir().join("kubelet-evil")).unwrap();

        let volume_dirs = d.volume_dirs("default");
        Fixture {
            mounts: MountSnapshot::take(),
            etc_x_existed: Path::new("/etc/x").exists(),
            d,
            sentinel,
            vol,
            staging,
            target,
            volume_dirs,
        }
    }

    /// Asserts the code and that nothing changed.
    #[track_caller]
    fn expect<T: std::fmt::Debug>(&self, what: &str, res: Result<Response<T>, Status>, want: Code) {
        assert_code(what, res, want);
        self.unchanged(what);
    }

    #[track_caller]
    fn unchanged(&self, what: &str) {
        self.sentinel.check(what);
        self.mounts
            .assert_no_new_mounts(&[self.d.dir(), self.sentinel.path()], what);
        assert_eq!(
            mounts_at(&self.staging).len(),
            1,
            "{what}: staging mount changed"
        );
        assert_eq!(
            mounts_at(&self.target).len(),
            1,
            "{what}: target mount changed"
        );
        assert_eq!(
            fs::read(self.target.join("data")).unwrap(),
            b"volume data",
            "{what}: volume data changed"
        );
        assert_eq!(
            self.d.volume_dirs("default"),
            self.volume_dirs,
            "{what}: volume directories changed"
        );
        if !self.etc_x_existed {
            assert!(!Path::new("/etc/x").exists(), "{what}: /etc/x appeared");
        }
        assert!(
            !self.d.dir().join("kubelet-evil/x").exists(),
            "{what}: something was created next to the kubelet dir"
        );
    }

    /// Paths no node RPC may accept, with a description.
    fn bad_paths(&self) -> Vec<(String, String)> {
        let k = path_str(&self.d.kubelet_dir());
        let s = path_str(self.sentinel.path());
        let key = self.vol.rsplit_once('.').unwrap().1.to_owned();
        vec![
            ("empty".into(), String::new()),
            ("relative".into(), "relative/path".into()),
            ("outside: /etc/x".into(), "/etc/x".into()),
            ("outside: /".into(), "/".into()),
            ("outside: the sentinel".into(), format!("{s}/x")),
            ("the kubelet dir itself".into(), k.clone()),
            (
                "the kubelet dir with a trailing slash".into(),
                format!("{k}/"),
            ),
            (
                "a sibling sharing the kubelet dir's prefix".into(),
                format!("{k}-evil/x"),
            ),
            (
                "'..' into the pool".into(),
                format!("{k}/../pool/volumes/{key}"),
            ),
            (
                "'..' out to the sentinel".into(),
                format!("{k}/pods/../../../../..{s}/x"),
            ),
            (
                "'..' that stays inside".into(),
                format!("{k}/pods/../pods/x"),
            ),
            ("trailing '..'".into(), format!("{k}/pods/..")),
            ("'.' component".into(), format!("{k}/./pods/x")),
            (
                "symlink dir to the sentinel".into(),
                format!("{k}/pods/evil/mount"),
            ),
            (
                "symlink dir to an existing sentinel dir".into(),
                format!("{k}/pods/evil/x"),
            ),
            ("symlink itself".into(), format!("{k}/pods/evil")),
            (
                "symlink to a sentinel file".into(),
                format!("{k}/pods/evil-file"),
            ),
            (
                "symlink deeper in the path".into(),
                format!("{k}/pods/p/volumes/mount"),
            ),
            ("relative symlink upwards".into(), format!("{k}/pods/up/x")),
            (
                "symlink planted inside a published volume".into(),
                format!("{}/planted/mount", path_str(&self.target)),
            ),
            ("staging symlink".into(), format!("{k}/staging/evil")),
            ("NUL byte".into(), format!("{k}/pods/a\0b/mount")),
            ("NUL at the end".into(), format!("{k}/pods/x\0")),
            (
                "10 KB".into(),
                format!("{k}/pods/{}", "a".repeat(10 * 1024)),
            ),
        ]
    }
}

/// Whether a bad path is well formed but not below the kubelet dir `k`
/// (relative, or elsewhere): no volume of the driver can be there.
fn elsewhere(k: &str, p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 4096
        && !p.contains('\0')
        && !p.split('/').any(|s| s == "." || s == ".." || s.len() > 255)
        && !p
            .strip_prefix(k)
            .is_some_and(|rest| rest.len() > 1 && rest.starts_with('/'))
}

/// Ids that are never a volume and must never reach a path.
fn bad_ids() -> Vec<(&'static str, String)> {
    vec![
        ("empty", String::new()),
        ("../x", "../x".into()),
        ("a/b", "a/b".into()),
        ("..", "..".into()),
        ("../../etc/passwd", "../../etc/passwd".into()),
        (
            "pool/../key",
            "default/../0123456789abcdef0123456789abcdef".into(),
        ),
        ("pool...", "default...".into()),
        ("absolute", "/etc/passwd".into()),
        (
            "NUL",
            "default.0123456789abcdef\u{0}0123456789abcdef".into(),
        ),
        ("newline", "default.0123\n".into()),
        ("tab", "a\tb".into()),
        ("10 KB", "a".repeat(10 * 1024)),
        ("129 bytes", "a".repeat(129)),
    ]
}

// --- paths -------------------------------------------------------------------------

#[tokio::test]
async fn node_rpcs_refuse_paths_outside_the_kubelet_dir() {
    let f = Fixture::new().await;
    let (vol, staging, target) = (f.vol.clone(), f.staging.clone(), f.target.clone());
    let good_target = path_str(&f.d.target_path("fresh"));
    let mut n = f.d.node();
    for (what, p) in f.bad_paths() {
        let what = format!("{what} ({})", p.chars().take(80).collect::<String>());
        let r = n
            .node_stage_volume(csi::NodeStageVolumeRequest {
                staging_target_path: p.clone(),
                ..stage_req(&vol, &staging)
            })
            .await;
        f.expect(&format!("NodeStageVolume {what}"), r, Code::InvalidArgument);

        let r = n
            .node_publish_volume(csi::NodePublishVolumeRequest {
                target_path: p.clone(),
                ..publish_req(&vol, &staging, &target, false)
            })
            .await;
        f.expect(
            &format!("NodePublishVolume target {what}"),
            r,
            Code::InvalidArgument,
        );

        let mut req = publish_req(&vol, &staging, Path::new(&good_target), false);
        req.staging_target_path = p.clone();
        let r = n.node_publish_volume(req).await;
        f.expect(
            &format!("NodePublishVolume staging {what}"),
            r,
            Code::InvalidArgument,
        );

        let r = n
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: vol.clone(),
                target_path: p.clone(),
            })
            .await;
        f.expect(
            &format!("NodeUnpublishVolume {what}"),
            r,
            Code::InvalidArgument,
        );

        let r = n
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: vol.clone(),
                staging_target_path: p.clone(),
            })
            .await;
        f.expect(
            &format!("NodeUnstageVolume {what}"),
            r,
            Code::InvalidArgument,
        );

        // Stats and expansion only look the volume up at their path: one
        // that is well formed but outside the kubelet dir cannot hold it.
        let lookup = match elsewhere(&path_str(&f.d.kubelet_dir()), &p) {
            true => Code::NotFound,
            false => Code::InvalidArgument,
        };
        let r = n
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: vol.clone(),
                volume_path: p.clone(),
                staging_target_path: String::new(),
            })
            .await;
        f.expect(&format!("NodeGetVolumeStats {what}"), r, lookup);

        let r = n
            .node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: vol.clone(),
                volume_path: p.clone(),
                ..Default::default()
            })
            .await;
        f.expect(&format!("NodeExpandVolume {what}"), r, lookup);
    }
    assert!(!Path::new(&good_target).exists());
    // The fixture's volume still works end to end.
    f.d.unpublish(&vol, &target).await;
    f.d.unstage(&vol, &staging).await;
}

// --- ids and names --------------------------------------------------------------------

#[tokio::test]
async fn every_rpc_refuses_dangerous_volume_ids() {
    let f = Fixture::new().await;
    let (staging, target) = (f.staging.clone(), f.target.clone());
    let other_target = f.d.target_path("other");
    let mut c = f.d.controller();
    let mut n = f.d.node();
    let ia = Code::InvalidArgument;
    for (what, id) in bad_ids() {
        let r = c
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await;
        f.expect(&format!("DeleteVolume {what}"), r, ia);
        let r = c
            .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
                volume_id: id.clone(),
                volume_capabilities: vec![mount_cap(AccessMode::SingleNodeWriter)],
                ..Default::default()
            })
            .await;
        f.expect(&format!("ValidateVolumeCapabilities {what}"), r, ia);
        let r = c
            .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: id.clone(),
                capacity_range: Some(range(10 * MI, 0)),
                ..Default::default()
            })
            .await;
        f.expect(&format!("ControllerExpandVolume {what}"), r, ia);
        let r = n
            .node_stage_volume(stage_req(&id, &f.d.staging_path("other")))
            .await;
        f.expect(&format!("NodeStageVolume {what}"), r, ia);
        let r = n.node_unstage_volume(unstage_req(&id, &staging)).await;
        f.expect(&format!("NodeUnstageVolume {what}"), r, ia);
        let r = n
            .node_publish_volume(publish_req(&id, &staging, &other_target, false))
            .await;
        f.expect(&format!("NodePublishVolume {what}"), r, ia);
        let r = n.node_unpublish_volume(unpublish_req(&id, &target)).await;
        f.expect(&format!("NodeUnpublishVolume {what}"), r, ia);
        let r = n.node_get_volume_stats(stats_req(&id, &target)).await;
        f.expect(&format!("NodeGetVolumeStats {what}"), r, ia);
        let r = n
            .node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: id.clone(),
                volume_path: path_str(&target),
                ..Default::default()
            })
            .await;
        f.expect(&format!("NodeExpandVolume {what}"), r, ia);
        // A path that does not exist is NOT_FOUND, but a bad id comes first.
        let r = n.node_get_volume_stats(stats_req(&id, &other_target)).await;
        f.expect(&format!("NodeGetVolumeStats {what}, missing path"), r, ia);
        let r = n
            .node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: id.clone(),
                volume_path: path_str(&other_target),
                ..Default::default()
            })
            .await;
        f.expect(&format!("NodeExpandVolume {what}, missing path"), r, ia);
        assert!(
            !f.d.staging_path("other").exists(),
            "{what}: staging dir created"
        );
        assert!(!other_target.exists(), "{what}: target dir created");
    }
    f.d.unpublish(&f.vol, &target).await;
    f.d.unstage(&f.vol, &staging).await;
}

#[tokio::test]
async fn create_volume_names() {
    let f = Fixture::new().await;
    let mut c = f.d.controller();
    // Invalid names.
    for (what, name) in [
        ("empty", String::new()),
        ("NUL", "a\0b".into()),
        ("newline", "a\nb".into()),
        ("DEL", "a\u{7f}b".into()),
        ("10 KB", "n".repeat(10 * 1024)),
        ("129 bytes", "n".repeat(129)),
    ] {
        let r = c.create_volume(create_req(&name)).await;
        f.expect(
            &format!("CreateVolume name {what}"),
            r,
            Code::InvalidArgument,
        );
    }
    // Names are only hashed: anything printable is a fine name and stays inside
    // the pool.
    let before = f.d.volume_dirs("default").len();
    let mut ids = Vec::new();
    for name in [
        "../x",
        "a/b",
        "../../../etc/passwd",
        "/absolute",
        ".",
        "with spaces and ünïcödé",
        &"m".repeat(128),
    ] {
        let v = f.d.create(name, MI).await;
        assert!(
            f.d.volume_data_dir(&v.volume_id)
                .starts_with(f.d.volumes_dir()),
            "{name}: {v:?}"
        );
        let key = v.volume_id.rsplit_once('.').unwrap().1;
        assert!(key.bytes().all(|b| b.is_ascii_hexdigit()), "{name}: {v:?}");
        ids.push(v.volume_id);
        f.sentinel.check(name);
        f.mounts
            .assert_no_new_mounts(&[f.d.dir(), f.sentinel.path()], name);
    }
    assert_eq!(f.d.volume_dirs("default").len(), before + ids.len());
    for id in ids {
        f.d.delete(&id).await;
    }
    f.unchanged("after deleting the odd names");
    f.d.unpublish(&f.vol, &f.target).await;
    f.d.unstage(&f.vol, &f.staging).await;
}

// --- sizes ---------------------------------------------------------------------------

#[tokio::test]
async fn create_volume_sizes() {
    let mut f = Fixture::new().await; // 64Mi pool, 8Mi used by the fixture's volume
    let mut c = f.d.controller();
    let sized = |name: &str, required: i64, limit: i64| csi::CreateVolumeRequest {
        capacity_range: Some(range(required, limit)),
        ..create_req(name)
    };
    for (what, req, want) in [
        (
            "negative required",
            sized("s1", -1, 0),
            Code::InvalidArgument,
        ),
        ("negative limit", sized("s2", 0, -1), Code::InvalidArgument),
        (
            "i64::MIN",
            sized("s3", i64::MIN, i64::MIN),
            Code::InvalidArgument,
        ),
        (
            "required > limit",
            sized("s4", 20 * MI, 10 * MI),
            Code::InvalidArgument,
        ),
        (
            "more than the pool holds",
            sized("s5", 100 * MI, 0),
            Code::OutOfRange,
        ),
        ("i64::MAX", sized("s6", i64::MAX, 0), Code::OutOfRange),
        (
            "i64::MAX both",
            sized("s7", i64::MAX, i64::MAX),
            Code::OutOfRange,
        ),
        (
            "more than is free",
            sized("s8", 60 * MI, 0),
            Code::ResourceExhausted,
        ),
    ] {
        let r = c.create_volume(req).await;
        f.expect(&format!("CreateVolume {what}"), r, want);
    }
    // Zero: no range at all, so the default size.
    let v = ok("zero range", c.create_volume(sized("zero", 0, 0)).await)
        .volume
        .unwrap();
    assert_eq!(v.capacity_bytes, 16 * MI);
    f.volume_dirs = f.d.volume_dirs("default");
    // The pool is at 24Mi of 64Mi now; 41Mi no longer fits.
    let r = c.create_volume(sized("s9", 41 * MI, 0)).await;
    f.expect(
        "CreateVolume 41Mi into 40Mi free",
        r,
        Code::ResourceExhausted,
    );
    let v = ok(
        "exactly what is free",
        c.create_volume(sized("fill", 40 * MI, 0)).await,
    )
    .volume
    .unwrap();
    assert_eq!(v.capacity_bytes, 40 * MI);
    f.volume_dirs = f.d.volume_dirs("default");
    let r = c.create_volume(sized("s10", 1, 0)).await;
    f.expect("CreateVolume into a full pool", r, Code::ResourceExhausted);
    assert_eq!(f.d.capacity(None).await.available_capacity, 0);
    f.d.unpublish(&f.vol, &f.target).await;
    f.d.unstage(&f.vol, &f.staging).await;
}

// --- capabilities and parameters -----------------------------------------------------

fn bad_capabilities() -> Vec<(&'static str, Option<csi::VolumeCapability>)> {
    let mut no_mode = mount_cap(AccessMode::SingleNodeWriter);
    no_mode.access_mode = None;
    let mut no_type = mount_cap(AccessMode::SingleNodeWriter);
    no_type.access_type = None;
    let fs_type = |t: &str| {
        let mut c = mount_cap(AccessMode::SingleNodeWriter);
        if let Some(csi::volume_capability::AccessType::Mount(m)) = c.access_type.as_mut() {
            m.fs_type = t.to_owned();
        }
        Some(c)
    };
    let flag = |f: &str| Some(mount_cap_flags(AccessMode::SingleNodeWriter, &[f]));
    let long_flag = "x".repeat(300);
    vec![
        ("missing capability", None),
        ("mode 42", Some(mount_cap_raw_mode(42))),
        ("mode 8", Some(mount_cap_raw_mode(8))),
        ("mode UNKNOWN", Some(mount_cap_raw_mode(0))),
        ("mode -1", Some(mount_cap_raw_mode(-1))),
        (
            "mode MULTI_NODE_MULTI_WRITER",
            Some(mount_cap(AccessMode::MultiNodeMultiWriter)),
        ),
        ("no access mode", Some(no_mode)),
        ("no access type", Some(no_type)),
        ("fs_type nfs", fs_type("nfs")),
        ("fs_type ../x", fs_type("../x")),
        ("fs_type NUL", fs_type("ext4\0")),
        ("empty mount flag", flag("")),
        ("mount flag with a comma", flag("ro,exec")),
        ("mount flag with NUL", flag("noexec\0")),
        ("300-byte mount flag", flag(&long_flag)),
    ]
}

#[tokio::test]
async fn capabilities_are_checked_everywhere() {
    let f = Fixture::new().await;
    let mut c = f.d.controller();
    let mut n = f.d.node();
    let ia = Code::InvalidArgument;
    let other_staging = f.d.staging_path("other");
    let other_target = f.d.target_path("other");
    for (what, cap) in bad_capabilities() {
        let r = c
            .create_volume(csi::CreateVolumeRequest {
                volume_capabilities: cap.clone().into_iter().collect(),
                ..create_req("caps")
            })
            .await;
        f.expect(&format!("CreateVolume {what}"), r, ia);
        if let Some(cap) = cap.clone() {
            let r = c
                .get_capacity(csi::GetCapacityRequest {
                    volume_capabilities: vec![cap],
                    ..Default::default()
                })
                .await;
            f.expect(&format!("GetCapacity {what}"), r, ia);
        }
        let r = n
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_capability: cap.clone(),
                ..stage_req(&f.vol, &other_staging)
            })
            .await;
        f.expect(&format!("NodeStageVolume {what}"), r, ia);
        let r = n
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_capability: cap.clone(),
                ..publish_req(&f.vol, &f.staging, &other_target, false)
            })
            .await;
        f.expect(&format!("NodePublishVolume {what}"), r, ia);
        assert!(!other_target.exists(), "{what}: target created");
    }
    f.d.unpublish(&f.vol, &f.target).await;
    f.d.unstage(&f.vol, &f.staging).await;
}

#[tokio::test]
async fn parameters_are_checked() {
    let f = Fixture::new().await;
    let mut c = f.d.controller();
    let long = "v".repeat(2000);
    let cases = [
        ("unknown key", params(&[("colour", "blue")])),
        ("empty key", params(&[("", "x")])),
        ("unknown pool", params(&[("pool", "nope")])),
        ("pool ../x", params(&[("pool", "../x")])),
        ("pool with a slash", params(&[("pool", "default/x")])),
        ("empty pool", params(&[("pool", "")])),
        ("empty k8s key", params(&[("csi.storage.k8s.io/", "x")])),
        (
            "k8s value with NUL",
            params(&[("csi.storage.k8s.io/pvc/name", "a\0b")]),
        ),
        (
            "2000-byte k8s value",
            params(&[("csi.storage.k8s.io/pvc/name", long.as_str())]),
        ),
        ("huge key", params(&[(&"k".repeat(10 * 1024), "v")])),
    ];
    for (what, p) in cases {
        let r = c
            .create_volume(csi::CreateVolumeRequest {
                parameters: p.clone(),
                ..create_req("params")
            })
            .await;
        f.expect(&format!("CreateVolume {what}"), r, Code::InvalidArgument);
        let r = c
            .get_capacity(csi::GetCapacityRequest {
                parameters: p,
                ..Default::default()
            })
            .await;
        f.expect(&format!("GetCapacity {what}"), r, Code::InvalidArgument);
    }
    f.d.unpublish(&f.vol, &f.target).await;
    f.d.unstage(&f.vol, &f.staging).await;
}

#[tokio::test]
async fn list_volumes_tokens_are_not_paths() {
    let f = Fixture::new().await;
    for (what, token) in bad_ids().into_iter().filter(|(_, t)| !t.is_empty()) {
        let r = f.d.list_page(1, &token).await;
        f.expect(&format!("ListVolumes token {what}"), r, Code::Aborted);
    }
    f.d.unpublish(&f.vol, &f.target).await;
    f.d.unstage(&f.vol, &f.staging).await;
}
