//! Pools made from raw disks (issue 14, item 1), on loop devices in the VM.
//!
//! An LVM pool lists its disks (`devices:`, here a glob over symlinks in a
//! directory of `/dev` the test makes, as `/dev/disk/by-id/...` would be);
//! a dir pool names one (`device:`). Checked with LVM's and the kernel's
//! own views (`vgs`, `pvs`, `lvs`, `blkid -p`, mountinfo, whole-device
//! checksums), never through the driver:
//! - blank disks: the VG and its thin pool are made and volumes can be
//!   created; a restart changes nothing in lvm (the VG's seqno and the
//!   `pvs`/`lvs` reports are the same); a disk added to the list is added to
//!   the VG at the next start;
//! - a disk with a filesystem, or one another program holds open, refuses
//!   that pool (unusable: a new volume in it is refused naming the disk and
//!   what is on it; Probe stays ready), every byte of the
//!   disks stays as it was, and the other pool serves;
//! - a dir pool's blank disk gets XFS mounted with `prjquota` and a
//!   volume's size is enforced; a restart mounts nothing twice, and after an
//!   unmount the driver's own XFS is mounted again with the volume in it.
//!
//! Needs device-mapper: `#[ignore]`d by a plain `cargo test`, run by
//! `make test-vm` in the VM.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sanity_tests::*;
use tonic::Code;

const DISK: u64 = 96 << 20;
/// mkfs.xfs refuses filesystems under 300 MiB (sparse on the guest's tmpfs).
const XFS_DISK: u64 = 320 << 20;

/// Loop devices over sparse images, each with a symlink in a directory of
/// `/dev` of its own (what the pools list), and the VG the driver may make
/// on them. Drop removes the VG, the PVs' labels, the links and the loops,
/// even when the test fails. Declare it before the [`Driver`].
struct Disks {
    vg: String,
    links: PathBuf,
    loops: Vec<LoopDevice>,
    dir: tempfile::TempDir,
}

impl Disks {
    fn new() -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        assert!(
            has_device_mapper(),
            "no device-mapper in this kernel: run by make test-vm in the VM"
        );
        let n = N.fetch_add(1, Ordering::Relaxed);
        let links = PathBuf::from(format!("/dev/localvol-rd-{}-{n}", std::process::id()));
        fs::create_dir_all(&links).unwrap();
        Disks {
            vg: format!("rd{}n{n}", std::process::id()),
            links,
            loops: Vec::new(),
            dir: tempfile::Builder::new()
                .prefix("localvol-rd-")
                .tempdir()
                .unwrap(),
        }
    }

    /// A new blank disk of `bytes`, linked as `<links>/<name>`; its loop device.
    fn add(&mut self, name: &str, bytes: u64) -> PathBuf {
        let lo = LoopDevice::create(&self.dir.path().join(format!("{name}.img")), bytes);
        std::os::unix::fs::symlink(&lo.path, self.links.join(name)).unwrap();
        let path = lo.path.clone();
        self.loops.push(lo);
        path
    }

    fn link(&self, name: &str) -> PathBuf {
        self.links.join(name)
    }

    /// The PVs of the VG (their loop devices), sorted.
    fn pvs(&self) -> Vec<String> {
        let out = run_cmd("lvm", &["pvs", "--noheadings", "-o", "pv_name,vg_name"]);
        let mut v: Vec<String> = out
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (pv, vg) = (f.next()?, f.next()?);
                (vg == self.vg).then(|| pv.to_owned())
            })
            .collect();
        v.sort();
        v
    }

    /// What lvm says about the VG: its seqno (bumped by every metadata
    /// change), size and PV count, its PVs and its LVs with their attributes.
    fn lvm_state(&self) -> String {
        let vgs = run_cmd(
            "lvm",
            &[
                "vgs",
                "--noheadings",
                "--units",
                "b",
                "-o",
                "vg_seqno,vg_size,vg_free,pv_count,lv_count",
                &self.vg,
            ],
        );
        let pvs = run_cmd(
            "lvm",
            &[
                "pvs",
                "--noheadings",
                "--units",
                "b",
                "-o",
                "pv_name,vg_name,pv_size,pv_free",
            ],
        );
        let lvs = run_cmd(
            "lvm",
            &[
                "lvs",
                "-a",
                "--noheadings",
                "--units",
                "b",
                "-o",
                "lv_name,lv_attr,lv_size,lv_tags",
                &self.vg,
            ],
        );
        format!("{vgs}{pvs}{lvs}")
    }

    fn vg_seqno(&self) -> u64 {
        run_cmd("lvm", &["vgs", "--noheadings", "-o", "vg_seqno", &self.vg])
            .trim()
            .parse()
            .unwrap()
    }

    fn vg_exists(&self) -> bool {
        quiet("lvm", &["vgs", &self.vg])
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        quiet("lvm", &["vgremove", "-ff", "-y", &self.vg]);
        for lo in &self.loops {
            quiet("lvm", &["pvremove", "-ff", "-y", &path_str(&lo.path)]);
        }
        let _ = fs::remove_dir_all(&self.links);
        // The loops detach as `loops` drops.
    }
}

/// sha256 of the whole device.
fn checksum(dev: &Path) -> String {
    run_cmd("sha256sum", &[&path_str(dev)])
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// Whether `blkid -p` finds any signature on the device (exit 2: none).
fn blank(dev: &Path) -> bool {
    let st = Command::new("blkid")
        .args(["-p", &path_str(dev)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    st.code() == Some(2)
}

fn lvm_pool_yaml(vg: &str, devices: &str, thin: &str) -> String {
    format!(
        "  - name: fast\n    type: lvm\n    volumeGroup: {vg}\n    devices: [{devices}]\n{thin}    reserve: 8Mi\n"
    )
}

fn lvm_opts(yaml: String) -> DriverOpts {
    DriverOpts {
        pools: Vec::new(),
        extra_config: yaml,
        ..DriverOpts::default()
    }
}

/// SIGTERM, then start again (with retries: readiness runs lvm, slow under TCG).
async fn restart(d: &mut Driver) {
    let st = d.stop().await;
    assert!(st.success(), "localvol serve exited with {st}");
    d.start_again_retrying().await;
}

/// The refusal of a new volume in pool `fast`, whose disks were refused:
/// RESOURCE_EXHAUSTED naming the pool (the driver serves on).
async fn refusal(d: &Driver) -> tonic::Status {
    let s = must_fail(
        "create on the refused pool",
        d.controller()
            .create_volume(create_in("rd-refused", "fast", MI))
            .await,
        Code::ResourceExhausted,
    );
    assert!(s.message().contains("pool fast is unusable"), "{s:?}");
    s
}

fn create_in(name: &str, pool: &str, bytes: i64) -> localvol::csi::CreateVolumeRequest {
    let mut r = create_req(name);
    r.capacity_range = Some(range(bytes, 0));
    r.parameters = params(&[("pool", pool)]);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn blank_disks_make_the_pool_restarts_change_nothing_and_new_disks_extend_it() {
    let mut disks = Disks::new();
    let a = disks.add("a", DISK);
    let b = disks.add("b", DISK);
    let glob = format!("'{}/*'", disks.links.display());
    let yaml = lvm_pool_yaml(
        &disks.vg,
        &glob,
        "    thinPool: {name: tp, size: 80%}\n    overprovisionRatio: 2\n",
    );
    let mut d = Driver::new(lvm_opts(yaml));
    d.start_again_retrying().await;

    // The VG on both disks, and a thin pool that zeroes new blocks.
    let mut want = vec![path_str(&a), path_str(&b)];
    want.sort();
    assert_eq!(disks.pvs(), want);
    let attr = run_cmd(
        "lvm",
        &[
            "lvs",
            "--noheadings",
            "-o",
            "lv_attr",
            &format!("{}/tp", disks.vg),
        ],
    );
    let attr = attr.trim();
    assert!(attr.starts_with('t'), "tp is not a thin pool: {attr}");
    assert_eq!(
        attr.chars().nth(7),
        Some('z'),
        "tp must zero new blocks: {attr}"
    );

    // Volumes can be created.
    let vol = must(
        "create",
        d.controller()
            .create_volume(create_in("rd-1", "fast", 16 * MI))
            .await,
    )
    .into_inner()
    .volume
    .unwrap();
    let lv = lv_name(&vol.volume_id);
    assert!(disks.lvm_state().contains(&lv), "{lv} not in lvs");

    // A restart is a no-op for lvm.
    let before = disks.lvm_state();
    restart(&mut d).await;
    assert_eq!(
        disks.lvm_state(),
        before,
        "a restart changed lvm's metadata"
    );

    // A disk added to the list (the glob matches a third link) joins the VG.
    let seqno = disks.vg_seqno();
    let c = disks.add("c", DISK);
    restart(&mut d).await;
    want.push(path_str(&c));
    want.sort();
    assert_eq!(disks.pvs(), want, "the new disk was not added");
    assert!(disks.vg_seqno() > seqno);
    let vols = must(
        "list",
        d.controller()
            .list_volumes(localvol::csi::ListVolumesRequest::default())
            .await,
    )
    .into_inner();
    assert!(
        vols.entries
            .iter()
            .any(|e| e.volume.as_ref().unwrap().volume_id == vol.volume_id),
        "the volume is gone after the VG grew"
    );

    // And a restart after that changes nothing either.
    let before = disks.lvm_state();
    restart(&mut d).await;
    assert_eq!(
        disks.lvm_state(),
        before,
        "a restart changed lvm's metadata"
    );
    must(
        "delete",
        d.controller()
            .delete_volume(delete_req(&vol.volume_id))
            .await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn a_disk_in_use_or_holding_data_refuses_its_pool_untouched_while_others_serve() {
    let mut disks = Disks::new();
    let blank_dev = disks.add("blank", 64 << 20);
    let ext4 = disks.add("ext4", 64 << 20);
    run_cmd("mkfs.ext4", &["-q", "-L", "precious", &path_str(&ext4)]);
    let sums = (checksum(&blank_dev), checksum(&ext4));

    let devices = format!(
        "'{}', '{}'",
        disks.link("blank").display(),
        disks.link("ext4").display()
    );
    // A dir pool ("plain", first) beside the LVM pool made of the disks.
    let mut d = Driver::new(DriverOpts {
        pools: vec![PoolOpts::new("plain")],
        extra_config: lvm_pool_yaml(&disks.vg, &devices, ""),
        ..DriverOpts::default()
    });
    d.start_again().await;
    let refused = refusal(&d).await;
    let msg = refused.message();
    assert!(msg.contains("pool fast"), "{msg}");
    assert!(msg.contains(&path_str(&disks.link("ext4"))), "{msg}");
    assert!(msg.contains("ext4 filesystem"), "{msg}");

    // Nothing was written to either disk; no VG was made.
    assert_eq!(
        (checksum(&blank_dev), checksum(&ext4)),
        sums,
        "a refused disk was changed"
    );
    assert!(blank(&blank_dev), "the blank disk got a signature");
    assert!(
        !disks.vg_exists(),
        "a VG was made on a refused pool's disks"
    );

    // The other pool serves (the refused one said why above).
    must(
        "create on the dir pool",
        d.controller()
            .create_volume(create_in("rd-2", "plain", MI))
            .await,
    );
    assert_eq!(d.capacity(Some("fast")).await.available_capacity, 0);

    // A blank disk another program holds open (O_EXCL) is refused too.
    d.stop().await;
    d.opts_mut().extra_config = lvm_pool_yaml(
        &disks.vg,
        &format!("'{}'", disks.link("blank").display()),
        "",
    );
    let held = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_EXCL)
        .open(&blank_dev)
        .unwrap();
    d.start_again().await;
    let refused = refusal(&d).await;
    assert!(
        refused.message().contains("open exclusively"),
        "{refused:?}"
    );
    assert_eq!(checksum(&blank_dev), sums.0, "a held disk was changed");
    assert!(!disks.vg_exists());

    // Released, the same blank disk makes the pool.
    drop(held);
    d.stop().await;
    d.start_again_retrying().await;
    assert_eq!(disks.pvs(), [path_str(&blank_dev)]);
    assert_eq!(
        checksum(&ext4),
        sums.1,
        "the unlisted ext4 disk was changed"
    );
}

/// The filesystem type and super options of the mount at `path`.
fn super_options(path: &Path) -> (String, Vec<String>) {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = text
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap()))
        .unwrap_or_else(|| panic!("nothing mounted at {path:?}"));
    let after = line.split(" - ").nth(1).unwrap();
    let f: Vec<&str> = after.split(' ').collect();
    (
        f[0].to_owned(),
        f[2].split(',').map(str::to_owned).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs project quotas on XFS: run by make test-vm in the VM"]
async fn a_dir_pool_on_a_blank_disk_gets_xfs_with_project_quotas() {
    let mut disks = Disks::new();
    let dev = disks.add("x", XFS_DISK);
    let mut d = Driver::new(lvm_opts(String::new()));
    let path = d.dir().join("scratch");
    d.opts_mut().extra_config = format!(
        "  - name: scratch\n    type: dir\n    path: {}\n    device: {}\n    quota: required\n",
        path.display(),
        disks.link("x").display()
    );
    d.start_again().await;

    let (fs_type, opts) = super_options(&path);
    assert_eq!(fs_type, "xfs");
    assert!(
        opts.iter().any(|o| o == "prjquota" || o == "pquota"),
        "{opts:?}"
    );
    let label = run_cmd(
        "blkid",
        &["-p", "-s", "LABEL", "-o", "value", &path_str(&dev)],
    );
    assert_eq!(label.trim(), "localvol-dir");

    // A 16 MiB volume holds no more than 16 MiB.
    let vol = must(
        "create",
        d.controller()
            .create_volume(create_in("rd-4", "scratch", 16 * MI))
            .await,
    )
    .into_inner()
    .volume
    .unwrap();
    let vdirs: Vec<PathBuf> = fs::read_dir(path.join("volumes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(vdirs.len(), 1, "{vdirs:?}");
    let mut f = fs::File::create(vdirs[0].join("fill")).unwrap();
    let chunk = vec![0xa5u8; 1 << 20];
    let mut written = 0u64;
    let err = loop {
        match f.write_all(&chunk).and_then(|_| f.sync_data()) {
            Ok(()) => written += chunk.len() as u64,
            Err(e) => break e,
        }
        assert!(
            written <= 32 << 20,
            "wrote {written} bytes into a 16 MiB volume"
        );
    };
    assert_eq!(err.raw_os_error(), Some(nix::libc::ENOSPC), "{err}");
    assert!(written <= 16 << 20, "{written}");
    drop(f);

    // A restart mounts nothing twice.
    restart(&mut d).await;
    assert_eq!(mounts_at(&path).len(), 1, "{:?}", mounts_at(&path));

    // Unmounted behind its back, the driver mounts its own XFS again, and
    // the volume is there.
    d.stop().await;
    run_cmd("umount", &[&path_str(&path)]);
    d.start_again().await;
    assert_eq!(super_options(&path).0, "xfs");
    let vols = must(
        "list",
        d.controller()
            .list_volumes(localvol::csi::ListVolumesRequest::default())
            .await,
    )
    .into_inner();
    assert_eq!(vols.entries.len(), 1);
    assert_eq!(
        vols.entries[0].volume.as_ref().unwrap().volume_id,
        vol.volume_id
    );
    must(
        "delete",
        d.controller()
            .delete_volume(delete_req(&vol.volume_id))
            .await,
    );
}
