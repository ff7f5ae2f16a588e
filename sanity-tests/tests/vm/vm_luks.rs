//! Encryption at rest (StorageClass `encryption: luks2`) in a real kernel,
//! through the real driver over CSI.
//!
//! Like `vm_lvm.rs`: the LVM scenarios are `#[ignore]`d on the host (no
//! device-mapper) and run by `make test-vm` in the qemu guest, each against a
//! thick and a thin pool ([`LvmFx`]). Ground truth comes from the kernel and
//! LVM, never through the driver: `blkid -p` on the LV, `/dev/mapper`, sysfs
//! holders, and `grep` over the LV's raw bytes for what was written in plain
//! text through the volume (with the same search over the opened mapping as
//! the control that it would be found).

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use localvol::csi;
use sanity_tests::LvmFx as Fx;
use sanity_tests::LvmKind as Kind;
use sanity_tests::*;
use tonic::{Code, Status};

/// The node-stage secret field that holds the key (docs/configuration.md,
/// "Encryption at rest").
const KEY_FIELD: &str = "encryptionKey";
const KEY: &str = "vm-test key: 5f0c2d8e9a7b4c13";
const WRONG_KEY: &str = "not the key";
/// Written in plain text through the volume; must never be on the LV.
const MARKER: &str = "LOCALVOL-PLAINTEXT-MARKER-7c1e";
/// LUKS2's default header (data offset): the mapping is this much smaller.
const LUKS2_HEADER: i64 = 16 * MI;

thick_and_thin!(
    encrypted_filesystem_lifecycle,
    encrypted_raw_block,
    encrypted_snapshot_restore_and_clone,
    killed_between_luks_format_and_mkfs,
    a_luks_format_cut_short_is_redone_while_never_written,
);

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn secrets(key: &str) -> std::collections::HashMap<String, String> {
    params(&[(KEY_FIELD, key)])
}

fn mapping(volume_id: &str) -> PathBuf {
    PathBuf::from(format!("/dev/mapper/localvol-{volume_id}"))
}

fn lv_dev(fx: &Fx, volume_id: &str) -> PathBuf {
    PathBuf::from(format!("/dev/{}/{}", fx.vg.vg, lv_name(volume_id)))
}

fn cap(fs: &str) -> csi::VolumeCapability {
    if fs == "block" {
        return block_cap(AccessMode::SingleNodeWriter);
    }
    mount_cap(AccessMode::SingleNodeWriter)
}

fn encrypted_req(name: &str, bytes: i64, fs: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(range(bytes, 0)),
        volume_capabilities: vec![cap(fs)],
        parameters: params(&[("encryption", "luks2")]),
        ..Default::default()
    }
}

async fn stage(
    fx: &Fx,
    id: &str,
    tag: &str,
    fs: &str,
    key: Option<&str>,
) -> Result<tonic::Response<csi::NodeStageVolumeResponse>, Status> {
    let mut req = stage_req(id, &fx.d.staging_path(tag));
    req.volume_capability = Some(cap(fs));
    if let Some(k) = key {
        req.secrets = secrets(k);
    }
    fx.d.node().node_stage_volume(req).await
}

async fn publish(fx: &Fx, id: &str, tag: &str, fs: &str) -> PathBuf {
    let target = fx.d.target_path(tag);
    let mut req = publish_req(id, &fx.d.staging_path(tag), &target, false);
    req.volume_capability = Some(cap(fs));
    ok(
        &format!("publish {tag}"),
        fx.d.node().node_publish_volume(req).await,
    );
    target
}

/// Stages with the key and publishes; the target path.
async fn mount(fx: &Fx, id: &str, tag: &str, fs: &str) -> PathBuf {
    ok(
        &format!("stage {tag}"),
        stage(fx, id, tag, fs, Some(KEY)).await,
    );
    publish(fx, id, tag, fs).await
}

/// What `blkid -p` says the device holds (its TYPE), "" for nothing.
fn blkid_type(dev: &Path) -> String {
    let out = Command::new("blkid")
        .args(["-p", "-s", "TYPE", "-o", "value"])
        .arg(dev)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Whether `needle` occurs anywhere in the device's bytes (grep reads it).
fn device_contains(dev: &Path, needle: &str) -> bool {
    drop_caches();
    let st = Command::new("grep")
        .args(["-q", "-a", "-F", needle])
        .arg(dev)
        .status()
        .unwrap();
    match st.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!("grep over {dev:?} failed: {st}"),
    }
}

/// The plaintext is readable through the open mapping and absent from the
/// LV: the control shows the search would find it.
#[track_caller]
fn assert_ciphertext_only(fx: &Fx, id: &str) {
    let lv = lv_dev(fx, id);
    assert!(
        device_contains(&mapping(id), MARKER),
        "control: the marker is not readable through the mapping"
    );
    assert!(
        !device_contains(&lv, MARKER),
        "plain text written through the encrypted volume is on the LV {lv:?}"
    );
    assert_eq!(blkid_type(&lv), "crypto_LUKS", "the LV of {id}");
}

/// A file of the marker repeated (1 MiB), synced.
fn write_marker_file(dir: &Path) {
    let body = MARKER.repeat((MI as usize) / MARKER.len());
    let mut f = fs::File::create(dir.join("plain.txt")).unwrap();
    f.write_all(body.as_bytes()).unwrap();
    f.sync_all().unwrap();
}

#[track_caller]
fn assert_marker_file(dir: &Path, what: &str) {
    drop_caches();
    let body = fs::read_to_string(dir.join("plain.txt"))
        .unwrap_or_else(|e| panic!("{what}: reading plain.txt in {dir:?}: {e}"));
    assert_eq!(body, MARKER.repeat((MI as usize) / MARKER.len()), "{what}");
}

/// The first `len` bytes of a device (its LUKS header), to show nothing
/// changed.
fn head(dev: &Path, len: usize) -> Vec<u8> {
    use std::io::Read;
    let mut buf = vec![0; len];
    drop_caches();
    fs::File::open(dev).unwrap().read_exact(&mut buf).unwrap();
    buf
}

/// How many device-mapper devices sit on the LV (sysfs holders): an open
/// encrypted volume has exactly one, never two.
fn holders(dev: &Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let rdev = fs::metadata(dev).unwrap().rdev();
    let (major, minor) = (nix::libc::major(rdev), nix::libc::minor(rdev));
    fs::read_dir(format!("/sys/dev/block/{major}:{minor}/holders"))
        .unwrap()
        .count()
}

fn total_bytes(path: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(path).unwrap();
    s.blocks() as u64 * s.fragment_size() as u64
}

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

/// Create, stage without and with the key, write, check the LV holds only
/// ciphertext, expand online, unstage (the mapping goes), restart the
/// driver, a wrong key changes nothing, the right key reads the data back.
async fn encrypted_filesystem_lifecycle(kind: Kind) {
    let mut fx = Fx::new(kind).await;
    let v = must(
        "create",
        fx.create(encrypted_req("enc-fs", 64 * MI, "")).await,
    );
    let id = v.volume_id.clone();
    let lv = lv_dev(&fx, &id);
    assert!(
        fx.lv(&id)
            .unwrap()
            .tags
            .contains(&"localvol.encryption=luks2".to_owned()),
        "{:?}",
        fx.lv(&id)
    );
    // A repeat without the parameter is another volume: ALREADY_EXISTS.
    let mut plain = encrypted_req("enc-fs", 64 * MI, "");
    plain.parameters.clear();
    must_fail(
        "create without encryption",
        fx.create(plain).await,
        Code::AlreadyExists,
    );

    // No key, an empty key: INVALID_ARGUMENT, and nothing was written.
    let s = assert_code(
        "stage without key",
        stage(&fx, &id, "a", "", None).await,
        Code::InvalidArgument,
    );
    assert!(s.message().contains(KEY_FIELD), "{}", s.message());
    assert_code(
        "stage with an empty key",
        stage(&fx, &id, "a", "", Some("")).await,
        Code::InvalidArgument,
    );
    assert_eq!(blkid_type(&lv), "", "the LV was written without a key");
    assert!(!mapping(&id).exists());

    let target = mount(&fx, &id, "a", "").await;
    assert_eq!(holders(&lv), 1);
    // The filesystem is on the mapping: the LV minus the LUKS2 header.
    let size = total_bytes(&target);
    assert!(size <= (64 * MI - LUKS2_HEADER) as u64, "{size}");
    // Staging again (kubelet retries) reuses the open mapping.
    ok("stage again", stage(&fx, &id, "a", "", Some(KEY)).await);
    assert_eq!(holders(&lv), 1, "a second mapping of the LV");
    write_marker_file(&target);
    assert_ciphertext_only(&fx, &id);

    // Online expansion: LV, mapping, filesystem.
    let r = ok(
        "expand",
        fx.d.node()
            .node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: id.clone(),
                volume_path: path_str(&target),
                capacity_range: Some(range(128 * MI, 0)),
                volume_capability: Some(cap("")),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(r.capacity_bytes, 128 * MI);
    let grown = total_bytes(&target);
    assert!(grown > size + (48 * MI) as u64, "{size} -> {grown}");
    assert_marker_file(&target, "after expansion");

    fx.unmount(&id, "a").await;
    assert!(!mapping(&id).exists(), "unstage left the mapping open");
    fx.unmount(&id, "a").await; // idempotent

    // The driver restarts; a wrong key is refused and changes nothing.
    fx.d.restart().await;
    let header = head(&lv, LUKS2_HEADER as usize);
    let s = assert_code(
        "stage with a wrong key",
        stage(&fx, &id, "b", "", Some(WRONG_KEY)).await,
        Code::InvalidArgument,
    );
    assert!(!s.message().contains(WRONG_KEY), "{}", s.message());
    assert!(!mapping(&id).exists());
    assert!(
        head(&lv, LUKS2_HEADER as usize) == header,
        "a wrong key changed the LUKS header"
    );
    let target = mount(&fx, &id, "b", "").await;
    assert_marker_file(&target, "after a driver restart");
    assert!(total_bytes(&target) > size + (48 * MI) as u64);
    fx.unmount(&id, "b").await;
    must("delete", fx.delete_volume(&id).await);
    fx.assert_lv_gone(&id);
    // The key never reached the log.
    let log = fs::read_to_string(fx.d.log_path()).unwrap();
    assert!(
        !log.contains(KEY) && !log.contains(WRONG_KEY),
        "a key is in the driver's log"
    );
}

/// A raw block volume: the mapping is the device the pod gets.
async fn encrypted_raw_block(kind: Kind) {
    let fx = Fx::new(kind).await;
    let v = must(
        "create",
        fx.create(encrypted_req("enc-blk", 64 * MI, "block")).await,
    );
    let id = v.volume_id;
    // Not staged: its mapping is not open (kubelet stages first).
    let mut req = publish_req(&id, &fx.d.staging_path("a"), &fx.d.target_path("a"), false);
    req.volume_capability = Some(cap("block"));
    assert_code(
        "publish before stage",
        fx.d.node().node_publish_volume(req).await,
        Code::FailedPrecondition,
    );
    let target = mount(&fx, &id, "a", "block").await;
    {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_SYNC)
            .open(&target)
            .unwrap();
        f.write_all(MARKER.repeat(1000).as_bytes()).unwrap();
        f.sync_all().unwrap();
    }
    assert_ciphertext_only(&fx, &id);
    // While the pod still has the device, the mapping stays open.
    let s = assert_code(
        "unstage while published",
        fx.d.node()
            .node_unstage_volume(unstage_req(&id, &fx.d.staging_path("a")))
            .await,
        Code::FailedPrecondition,
    );
    assert!(mapping(&id).exists(), "{}", s.message());
    fx.unmount(&id, "a").await;
    assert!(!mapping(&id).exists());
    must("delete", fx.delete_volume(&id).await);
    fx.assert_lv_gone(&id);
}

/// Snapshots of an encrypted volume, and restores and clones of it, stay
/// encrypted and open with the same key; a restore into a plain class is
/// refused.
async fn encrypted_snapshot_restore_and_clone(kind: Kind) {
    let fx = Fx::new(kind).await;
    let v = must(
        "create",
        fx.create(encrypted_req("enc-src", 64 * MI, "")).await,
    );
    let src = v.volume_id;
    let target = mount(&fx, &src, "src", "").await;
    write_marker_file(&target);
    fx.unmount(&src, "src").await;

    let mut req = csi::CreateSnapshotRequest {
        name: "enc-snap".into(),
        source_volume_id: src.clone(),
        ..Default::default()
    };
    if kind == Kind::Thick {
        req.parameters = params(&[("snapshotSize", "32Mi")]);
    }
    let snap = ok("snapshot", fx.d.controller().create_snapshot(req).await)
        .snapshot
        .unwrap();

    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let from = |name: &str, t: Type, encrypted: bool| {
        let mut r = encrypted_req(name, 64 * MI, "");
        r.volume_content_source = Some(csi::VolumeContentSource { r#type: Some(t) });
        if !encrypted {
            r.parameters.clear();
        }
        r
    };
    let by_snap = || {
        Type::Snapshot(SnapshotSource {
            snapshot_id: snap.snapshot_id.clone(),
        })
    };
    let s = must_fail(
        "plain restore of an encrypted snapshot",
        fx.create(from("plain-restore", by_snap(), false)).await,
        Code::InvalidArgument,
    );
    assert!(s.message().contains("encrypt"), "{}", s.message());
    assert!(fx.lv(&fx.volume_id("plain-restore")).is_none());

    let restored = must(
        "restore",
        fx.create(from("enc-restore", by_snap(), true)).await,
    );
    let clone = must(
        "clone",
        fx.create(from(
            "enc-clone",
            Type::Volume(VolumeSource {
                volume_id: src.clone(),
            }),
            true,
        ))
        .await,
    );
    for (v, tag) in [(&restored, "r"), (&clone, "c")] {
        let id = &v.volume_id;
        assert_eq!(blkid_type(&lv_dev(&fx, id)), "crypto_LUKS", "{tag}");
        assert_code(
            &format!("{tag}: wrong key"),
            stage(&fx, id, tag, "", Some(WRONG_KEY)).await,
            Code::InvalidArgument,
        );
        let t = mount(&fx, id, tag, "").await;
        assert_marker_file(&t, tag);
        assert_ciphertext_only(&fx, id);
        fx.unmount(id, tag).await;
        must("delete", fx.delete_volume(id).await);
    }
    ok(
        "delete snapshot",
        fx.d.controller()
            .delete_snapshot(csi::DeleteSnapshotRequest {
                snapshot_id: snap.snapshot_id.clone(),
                ..Default::default()
            })
            .await,
    );
    must("delete", fx.delete_volume(&src).await);
}

/// The driver is killed (SIGKILL) after `luksFormat` and `open`, while
/// `mkfs` runs (a stand-in `mkfs.ext4` first in its PATH that never ends).
/// The mapping it left open is reused by the retried stage (never a second
/// one), which makes the filesystem and mounts it; delete closes a mapping
/// left open and unused.
async fn killed_between_luks_format_and_mkfs(kind: Kind) {
    let mut fx = Fx::new(kind).await;
    let v = must(
        "create",
        fx.create(encrypted_req("enc-kill", 64 * MI, "")).await,
    );
    let id = v.volume_id;
    let lv = lv_dev(&fx, &id);

    let shim = tempfile::tempdir().unwrap();
    let started = shim.path().join("mkfs-started");
    let script = format!(
        "#!/bin/sh\necho $$ > {0}.tmp && mv {0}.tmp {0}\nexec sleep 600\n",
        started.display()
    );
    write_program(shim.path(), "mkfs.ext4", &script);
    fx.d.stop().await;
    fx.d.opts_mut().env = vec![path_first(shim.path())];
    fx.d.start_again_retrying().await;

    let node = fx.d.node();
    let mut req = stage_req(&id, &fx.d.staging_path("a"));
    req.secrets = secrets(KEY);
    let pending = tokio::spawn(async move {
        let mut node = node;
        node.node_stage_volume(req).await
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    while !started.exists() {
        assert!(
            Instant::now() < deadline,
            "mkfs never started; log:\n{}",
            fx.d.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fx.d.kill9();
    let _ = pending.await;
    let shim_pid: i32 = fs::read_to_string(&started)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    signal_pid(shim_pid, nix::sys::signal::Signal::SIGKILL);

    // What the killed driver left: a LUKS2 LV, its mapping open, no filesystem.
    assert_eq!(blkid_type(&lv), "crypto_LUKS");
    assert!(mapping(&id).exists(), "the killed driver's mapping is gone");
    assert_eq!(
        blkid_type(&mapping(&id)),
        "",
        "the mapping has a filesystem"
    );

    fx.d.opts_mut().env.clear();
    fx.d.start_again_retrying().await;
    let target = mount(&fx, &id, "a", "").await;
    assert_eq!(holders(&lv), 1, "the retried stage opened a second mapping");
    assert_eq!(blkid_type(&mapping(&id)), "ext4");
    write_marker_file(&target);
    assert_ciphertext_only(&fx, &id);
    fx.d.unpublish(&id, &target).await;

    // Killed again, now with the mapping mounted: kubelet's unstage retry
    // unmounts it and closes the mapping.
    fx.d.kill9();
    fx.d.start_again_retrying().await;
    fx.d.unstage(&id, &fx.d.staging_path("a")).await;
    assert!(!mapping(&id).exists());

    // A mapping left open and unused (staged, then the driver killed and
    // the staging mount gone with the node's restart of kubelet) does not
    // block delete: it is closed first.
    ok("stage", stage(&fx, &id, "b", "", Some(KEY)).await);
    let staging = fx.d.staging_path("b");
    assert!(Command::new("umount")
        .arg(&staging)
        .status()
        .unwrap()
        .success());
    assert!(mapping(&id).exists());
    must("delete", fx.delete_volume(&id).await);
    assert!(!mapping(&id).exists());
    fx.assert_lv_gone(&id);
}

/// A `luksFormat` cut short can leave a LUKS2 header whose key slots were
/// never written: `blkid` says crypto_LUKS, and no key opens it. Made here
/// by hand, with the key, then the key-slot area (after the two 16 KiB
/// header copies) zeroed. While the LV is still marked unformatted (nothing
/// was ever written through it), NodeStage formats it again and the volume
/// works; once it has been formatted, the same damage is refused, never
/// formatted over.
async fn a_luks_format_cut_short_is_redone_while_never_written(kind: Kind) {
    let fx = Fx::new(kind).await;
    let v = must(
        "create",
        fx.create(encrypted_req("enc-cut", 64 * MI, "")).await,
    );
    let id = v.volume_id;
    let lv = lv_dev(&fx, &id);
    luks_format_then_cut_key_slots(&lv);
    assert_eq!(blkid_type(&lv), "crypto_LUKS");

    let target = mount(&fx, &id, "a", "").await;
    assert_eq!(blkid_type(&mapping(&id)), "ext4");
    write_marker_file(&target);
    assert_ciphertext_only(&fx, &id);
    fx.d.unpublish(&id, &target).await;
    fx.d.unstage(&id, &fx.d.staging_path("a")).await;

    // Formatted now: the same damage is not this driver's to repair.
    luks_format_then_cut_key_slots(&lv);
    // No key opens it: the key's error, not a new format.
    assert_code(
        "stage of a formatted volume whose key slots are gone",
        stage(&fx, &id, "b", "", Some(KEY)).await,
        Code::InvalidArgument,
    );
    assert!(!mapping(&id).exists());
    must("delete", fx.delete_volume(&id).await);
    fx.assert_lv_gone(&id);
}

/// `luksFormat` of `dev` with [`KEY`], then its key slots zeroed: the
/// header a cut-short format can leave.
fn luks_format_then_cut_key_slots(dev: &Path) {
    let mut format = Command::new("cryptsetup")
        .args(["luksFormat", "--type", "luks2", "--batch-mode"])
        .args(["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"])
        .args(["--key-file", "-"])
        .arg(dev)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    format
        .stdin
        .take()
        .unwrap()
        .write_all(KEY.as_bytes())
        .unwrap();
    assert!(
        format.wait().unwrap().success(),
        "cryptsetup luksFormat by hand"
    );
    let zeroed = Command::new("dd")
        .args(["if=/dev/zero", "bs=32K", "seek=1", "count=511"])
        .args(["conv=fsync,notrunc", "status=none"])
        .arg(format!("of={}", dev.display()))
        .status()
        .unwrap();
    assert!(zeroed.success(), "dd over the key slots");
}

/// Regression (found by vm_faults' encrypted kill campaign): a driver killed
/// while `cryptsetup open` ran left a device-mapper device of the mapping's
/// name that the driver did not recognise as open (no `/dev/mapper` node, or
/// no table yet), and every retried NodeStage failed with "Device ... already
/// exists". The retried stage now closes such a half-made mapping and opens
/// it again. Both half states, a node whose device is gone and a node whose
/// number another volume's mapping now has, are made here by hand, on a
/// thick pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn a_mapping_half_made_by_a_killed_open_is_replaced() {
    let fx = Fx::new(Kind::Thick).await;
    let v = must(
        "create",
        fx.create(encrypted_req("enc-half", 64 * MI, "")).await,
    );
    let id = v.volume_id;
    let lv = lv_dev(&fx, &id);
    let name = format!("localvol-{id}");
    // First stage: luksFormat, open, mkfs; some data; then closed again.
    let target = mount(&fx, &id, "a", "").await;
    write_marker_file(&target);
    fx.d.unpublish(&id, &target).await;
    fx.d.unstage(&id, &fx.d.staging_path("a")).await;
    assert!(!mapping(&id).exists());

    // 1. A device of that name with no table (created, not yet loaded).
    let made = Command::new("dmsetup")
        .args(["create", &name, "--notable"])
        .status()
        .unwrap();
    assert!(made.success(), "dmsetup create --notable");
    let target = mount(&fx, &id, "b", "").await;
    assert_marker_file(&target, "re-opened over a mapping with no table");
    assert_eq!(holders(&lv), 1, "one mapping over the LV");
    fx.d.unpublish(&id, &target).await;
    fx.d.unstage(&id, &fx.d.staging_path("b")).await;
    assert!(!mapping(&id).exists());

    // 2. A complete mapping whose /dev/mapper node was never made.
    let mut open = Command::new("cryptsetup")
        .args(["open", "--type", "luks2", "--key-file", "-"])
        .arg(&lv)
        .arg(&name)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        open.stdin
            .take()
            .unwrap()
            .write_all(KEY.as_bytes())
            .unwrap();
    }
    assert!(open.wait().unwrap().success(), "cryptsetup open by hand");
    fs::remove_file(mapping(&id)).unwrap();
    let target = mount(&fx, &id, "c", "").await;
    assert_marker_file(&target, "re-opened over a mapping with no node");
    assert_eq!(holders(&lv), 1, "one mapping over the LV");
    fx.d.unpublish(&id, &target).await;
    fx.d.unstage(&id, &fx.d.staging_path("c")).await;
    assert!(!mapping(&id).exists());

    // 3. A /dev/mapper node left behind by a device that is gone (a
    // `dmsetup remove` that outlived a killed driver, with no udev to remove
    // the node; CI saw the retried stage fail INTERNAL reading sysfs): here
    // a node of a device number no device has.
    let made = Command::new("mknod")
        .arg(mapping(&id))
        .args(["b", "254", "250"])
        .status()
        .unwrap();
    assert!(made.success(), "mknod of a stale mapping node");
    let target = mount(&fx, &id, "d", "").await;
    assert_marker_file(&target, "opened over a stale mapping node");
    assert_eq!(holders(&lv), 1, "one mapping over the LV");
    fx.d.unpublish(&id, &target).await;
    fx.d.unstage(&id, &fx.d.staging_path("d")).await;
    assert!(!mapping(&id).exists());

    // 4. A stale node whose device number now belongs to ANOTHER volume's
    // open mapping (CI's encrypted kill campaign: the retried stage read
    // the node, found the other volume's LV below it and failed
    // FAILED_PRECONDITION "maps device 254:2, not the volume's"; mounting
    // that node would have handed this pod the other volume's data). The
    // mapping is found by name in the kernel, and the node made again.
    let other = must(
        "create other",
        fx.create(encrypted_req("enc-half-other", 64 * MI, ""))
            .await,
    )
    .volume_id;
    let other_target = mount(&fx, &other, "o", "").await;
    fs::write(other_target.join("other"), b"the other volume").unwrap();
    let other_rdev = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(mapping(&other)).unwrap().rdev()
    };
    let (major, minor) = (nix::libc::major(other_rdev), nix::libc::minor(other_rdev));
    let made = Command::new("mknod")
        .arg(mapping(&id))
        .args(["b", &major.to_string(), &minor.to_string()])
        .status()
        .unwrap();
    assert!(made.success(), "mknod of a node naming the other mapping");
    let target = mount(&fx, &id, "e", "").await;
    assert_marker_file(
        &target,
        "opened over a node naming another volume's mapping",
    );
    assert!(
        !target.join("other").exists(),
        "the stage mounted the other volume's mapping through the stale node"
    );
    assert_eq!(holders(&lv), 1, "one mapping over the LV");
    assert_ne!(
        {
            use std::os::unix::fs::MetadataExt;
            fs::metadata(mapping(&id)).unwrap().rdev()
        },
        other_rdev,
        "the stale node was left naming the other volume's mapping"
    );
    fx.d.unpublish(&id, &target).await;
    fx.d.unstage(&id, &fx.d.staging_path("e")).await;
    assert!(!mapping(&id).exists());
    assert_eq!(
        fs::read(other_target.join("other")).unwrap(),
        b"the other volume",
        "the other volume's mount was disturbed"
    );
    fx.d.unpublish(&other, &other_target).await;
    fx.d.unstage(&other, &fx.d.staging_path("o")).await;
    must("delete other", fx.delete_volume(&other).await);
    must("delete", fx.delete_volume(&id).await);
    fx.assert_lv_gone(&id);
}

/// Regression (the encrypted kill campaign of vm_faults saw it once: a
/// NodeStage retried right after a kill got cryptsetup's exit code 5 and
/// answered INTERNAL): a volume whose LV another process holds open
/// exclusively (there: the killed driver's own cryptsetup, still running)
/// is ABORTED, so kubelet retries; nothing is written; once the holder is
/// gone the retried stage formats, opens and mounts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn stage_while_another_process_holds_the_device_is_aborted() {
    use std::os::unix::fs::OpenOptionsExt;
    let fx = Fx::new(Kind::Thick).await;
    let v = must(
        "create",
        fx.create(encrypted_req("enc-held", 64 * MI, "")).await,
    );
    let id = v.volume_id;
    let lv = lv_dev(&fx, &id);
    let held = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_EXCL)
        .open(&lv)
        .unwrap();
    let s = stage(&fx, &id, "a", "", Some(KEY))
        .await
        .expect_err("NodeStage succeeded while another process held the LV exclusively");
    assert_eq!(s.code(), Code::Aborted, "{s:?}");
    assert_eq!(blkid_type(&lv), "", "something was written to the held LV");
    assert!(!mapping(&id).exists());
    drop(held);
    let target = mount(&fx, &id, "a", "").await;
    write_marker_file(&target);
    fx.d.unpublish(&id, &target).await;
    fx.d.unstage(&id, &fx.d.staging_path("a")).await;
    must("delete", fx.delete_volume(&id).await);
    fx.assert_lv_gone(&id);
}

// ---------------------------------------------------------------------------
// Without device-mapper
// ---------------------------------------------------------------------------

/// Directory pools do not encrypt: INVALID_ARGUMENT, nothing made; an
/// unknown encryption is INVALID_ARGUMENT before any pool is asked.
#[tokio::test]
async fn encryption_is_refused_where_it_cannot_be_done() {
    let d = Driver::start_default().await;
    for (value, what) in [("luks2", "a dir pool"), ("luks1", "an unknown value")] {
        let req = csi::CreateVolumeRequest {
            name: format!("enc-{value}"),
            volume_capabilities: vec![mount_cap(AccessMode::SingleNodeWriter)],
            parameters: params(&[("encryption", value)]),
            ..Default::default()
        };
        let s = assert_code(
            what,
            d.controller().create_volume(req).await,
            Code::InvalidArgument,
        );
        assert!(
            s.message().contains("encryption"),
            "{what}: {}",
            s.message()
        );
    }
    assert!(d.list_all().await.is_empty());
}
