//! Self-tests of the harness: the checks the suite relies on must be able to
//! fail, and a driver's cleanup must leave nothing behind.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::mounts::unescape_mountinfo;
use crate::*;

#[test]
fn mountinfo_escapes_are_decoded() {
    assert_eq!(
        unescape_mountinfo(r"/mnt/with\040space\011tab\134back"),
        PathBuf::from("/mnt/with space\ttab\\back")
    );
    assert_eq!(
        unescape_mountinfo(r"/plain\04"),
        PathBuf::from(r"/plain\04")
    );
}

#[test]
fn the_mount_table_is_read() {
    let all = mounts();
    assert!(all.iter().any(|m| m.mount_point == Path::new("/")));
    assert!(locate(Path::new("/etc")).is_some());
}

#[test]
fn crate_version_matches_the_binary() {
    let v = crate_version();
    assert!(!v.is_empty());
    let out = Command::new(localvol_bin())
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.trim().ends_with(&v), "{text:?} vs {v}");
}

#[test]
fn sentinel_notices_changes() {
    for change in [
        |p: &Path| fs::write(p.join("precious"), b"changed").unwrap(),
        |p: &Path| fs::write(p.join("new"), b"").unwrap(),
        |p: &Path| fs::remove_dir(p.join("empty")).unwrap(),
        |p: &Path| fs::set_permissions(p.join("x"), fs::Permissions::from_mode(0o700)).unwrap(),
    ] {
        let s = Sentinel::new();
        s.check("untouched");
        change(s.path());
        let r = catch_unwind(AssertUnwindSafe(|| s.check("changed")));
        assert!(r.is_err(), "a change went unnoticed");
    }
}

#[tokio::test]
async fn mount_snapshot_and_driver_cleanup() {
    require_root();
    use nix::mount::{mount, MsFlags};
    let d = Driver::start_default().await;
    let s = Sentinel::new();
    let snap = MountSnapshot::take();
    let roots = [d.dir(), s.path()];
    assert!(snap.new_mounts(&roots).is_empty());

    // A bind of the sentinel into the driver's dir, and of the driver's pool
    // to the sentinel: both count, and both are cleaned up by Drop.
    let into = d.kubelet_dir().join("pods");
    let out = s.path().join("mount");
    let bind = |src: &Path, dst: &Path| {
        mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap()
    };
    bind(&s.path().join("x"), &into);
    bind(&d.volumes_dir(), &out);
    bind(&d.volumes_dir(), &out); // stacked
    let new = snap.new_mounts(&roots);
    assert_eq!(new.len(), 3, "{new:#?}");
    // Neither root is affected by a mount elsewhere.
    assert!(snap
        .new_mounts(&[Path::new("/nonexistent-root")])
        .is_empty());

    let dir = d.dir().to_path_buf();
    drop(d);
    assert!(!dir.exists(), "temp dir left behind");
    assert!(mounts_at(&into).is_empty());
    assert!(
        mounts_at(&out).is_empty(),
        "bind of the pool elsewhere left behind"
    );
    // The sentinel's content survived the driver's cleanup.
    assert_eq!(fs::read(s.path().join("x/inner")).unwrap(), b"inner data");
}
