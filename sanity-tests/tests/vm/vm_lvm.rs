//! LVM pools in a real kernel.
//!
//! The machines' own kernel has no device-mapper, so every test here is
//! `#[ignore]`d by a plain `cargo test`: `make test-vm` runs them inside the
//! qemu guest (vm/README.md) with `--include-ignored --test-threads=1`. Each test makes
//! its own volume group on a loop device over a sparse file on the guest's
//! tmpfs ([`LoopVg`], removed on drop even when the test fails), starts the
//! real `localvol serve` on one LVM pool ([`LvmFx`], the fixture
//! `vm_snapshots.rs` uses too), and runs against a thick pool and a thin pool
//! (one test per scenario, `thick_and_thin::<scenario>`).
//!
//! Ground truth is checked with LVM's own tools (`lvs`, `vgs`, `blkid`), never
//! through the driver.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use localvol::csi;
use sanity_tests::LvmFx as Fx;
use sanity_tests::LvmKind as Kind;
use sanity_tests::*;
use tonic::{Code, Response, Status};

const GIB: u64 = 1 << 30;
/// Every pool keeps this much back.
const RESERVE: i64 = Fx::RESERVE;
/// Thin pools offer twice their size.
const THIN_RATIO: f64 = Fx::THIN_RATIO;

thick_and_thin!(
    conformance,
    lifecycle_with_data,
    never_reformats,
    expansion_while_published,
    block_mode,
    crash_mid_create,
    pool_full,
    expansion_beyond_free_space,
    expansion_recovers_at_a_lower_size,
    format_options,
    delete_while_in_use,
);

// ---------------------------------------------------------------------------
// Fixture (LvmFx, and what only these tests ask of it)
// ---------------------------------------------------------------------------

/// LVM's own numbers and names for a volume of the fixture's pool, to check
/// the driver against.
trait GroundTruth {
    /// What GetCapacity must say, from LVM's own numbers: thick, VG free minus
    /// the reserve; thin, [`thin_offer`]; in whole extents.
    fn expected_capacity(&self) -> i64;
    /// What creates may still take: thick, the same; thin, pool size × ratio
    /// minus every thin LV's size minus the reserve (creates may
    /// overprovision beyond the unwritten data space GetCapacity offers).
    fn promise_room(&self) -> i64;
    /// The largest volume the pool could ever hold.
    fn ever(&self) -> i64;
    /// LVM's default extent size (checked in `empty_pool_offers_lvm_free_space`).
    fn extent(&self) -> i64;
    #[track_caller]
    fn lv_size(&self, volume_id: &str) -> i64;
    fn dev(&self, volume_id: &str) -> PathBuf;
    /// The LVs tagged with this CSI name.
    fn lvs_named(&self, name: &str) -> Vec<LvRow>;
    /// The exact tags the driver puts on a volume's LV.
    fn expected_tags(&self, name: &str, access: &str) -> Vec<String>;
    async fn validate(
        &self,
        volume_id: &str,
        caps: Vec<csi::VolumeCapability>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status>;
}

impl GroundTruth for Fx {
    fn expected_capacity(&self) -> i64 {
        let (_, free, extent) = self.vg.vg_sizes();
        match self.kind {
            Kind::Thick => (free - RESERVE).max(0) / extent * extent,
            Kind::Thin => thin_offer(&self.vg, THIN_RATIO, RESERVE, extent).0,
        }
    }

    fn promise_room(&self) -> i64 {
        let (_, _, extent) = self.vg.vg_sizes();
        match self.kind {
            Kind::Thick => self.expected_capacity(),
            Kind::Thin => thin_offer(&self.vg, THIN_RATIO, RESERVE, extent).1,
        }
    }

    fn ever(&self) -> i64 {
        let (size, _, extent) = self.vg.vg_sizes();
        let raw = match self.kind {
            Kind::Thick => size - RESERVE,
            Kind::Thin => {
                let tp = self.vg.lv("tp").expect("thin pool tp");
                (tp.size as f64 * THIN_RATIO) as i64 - RESERVE
            }
        };
        raw / extent * extent
    }

    fn extent(&self) -> i64 {
        Fx::EXTENT
    }

    #[track_caller]
    fn lv_size(&self, volume_id: &str) -> i64 {
        self.lv(volume_id)
            .unwrap_or_else(|| panic!("no LV for {volume_id}"))
            .size
    }

    fn dev(&self, volume_id: &str) -> PathBuf {
        self.vg.dev_path(&lv_name(volume_id))
    }

    fn lvs_named(&self, name: &str) -> Vec<LvRow> {
        let tag = format!("localvol.name={name}");
        self.vg
            .lvs()
            .into_iter()
            .filter(|l| l.tags.contains(&tag))
            .collect()
    }

    fn expected_tags(&self, name: &str, access: &str) -> Vec<String> {
        let mut t = vec![
            "localvol".to_owned(),
            "localvol.kind=volume".to_owned(),
            format!("localvol.access={access}"),
            format!("localvol.name={name}"),
            format!("localvol.pool={}", self.pool),
        ];
        // A new volume of mount access until its first NodeStage made the
        // filesystem (the tag goes before the first mount).
        if access == "mount" {
            t.push("localvol.unformatted".to_owned());
        }
        t.sort();
        t
    }

    async fn validate(
        &self,
        volume_id: &str,
        caps: Vec<csi::VolumeCapability>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        self.d
            .controller()
            .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
                volume_id: volume_id.to_owned(),
                volume_capabilities: caps,
                ..Default::default()
            })
            .await
    }
}

/// A thin pool's offer from `lvs` figures of `tp` (its size and Data%) and
/// its thin LVs: (what GetCapacity offers, what creates may still promise).
/// Offered: the smaller of size × ratio − reserve − promised and
/// size − size × Data% − reserve, each in whole extents (docs/configuration.md,
/// "LVM volumes").
fn thin_offer(vg: &LoopVg, ratio: f64, reserve: i64, extent: i64) -> (i64, i64) {
    let lvs = vg.lvs();
    let tp = lvs.iter().find(|l| l.name == "tp").expect("thin pool tp");
    let promised: i64 = lvs
        .iter()
        .filter(|l| l.attr.starts_with('V') && l.pool_lv == "tp")
        .map(|l| l.size)
        .sum();
    let round = |v: i64| v.max(0) / extent * extent;
    let by_promise = round((tp.size as f64 * ratio) as i64 - reserve - promised);
    let used = (tp.size as f64 * tp.data_percent.unwrap_or(0.0) / 100.0) as i64;
    let by_data = round(tp.size - used - reserve);
    (by_promise.min(by_data), by_promise)
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// A mount capability asking for a filesystem type ("" for the pool's default).
fn fs_cap(fs: &str) -> csi::VolumeCapability {
    let mut c = mount_cap(AccessMode::SingleNodeWriter);
    if let Some(csi::volume_capability::AccessType::Mount(m)) = c.access_type.as_mut() {
        m.fs_type = fs.to_owned();
    }
    c
}

fn sized(
    name: &str,
    required: i64,
    limit: i64,
    cap: csi::VolumeCapability,
) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(range(required, limit)),
        volume_capabilities: vec![cap],
        ..Default::default()
    }
}

async fn stage_cap(
    d: &Driver,
    id: &str,
    staging: &Path,
    cap: csi::VolumeCapability,
) -> Result<csi::NodeStageVolumeResponse, Status> {
    let mut req = stage_req(id, staging);
    req.volume_capability = Some(cap);
    d.node()
        .node_stage_volume(req)
        .await
        .map(|r| r.into_inner())
}

async fn publish_cap(
    d: &Driver,
    id: &str,
    staging: &Path,
    target: &Path,
    cap: csi::VolumeCapability,
) -> Result<csi::NodePublishVolumeResponse, Status> {
    let mut req = publish_req(id, staging, target, false);
    req.volume_capability = Some(cap);
    d.node()
        .node_publish_volume(req)
        .await
        .map(|r| r.into_inner())
}

/// `blkid -p` of one tag (TYPE, UUID); None when the device holds no signature.
fn blkid(dev: &Path, tag: &str) -> Option<String> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", tag])
        .arg(dev)
        .output()
        .expect("running blkid");
    match out.status.code() {
        Some(0) => Some(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
        Some(2) => None,
        _ => panic!(
            "blkid {dev:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// The filesystem type of the top mount at `path` (mountinfo's field after " - ").
fn fs_type_at(path: &Path) -> Option<String> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path_str(path);
    text.lines()
        .rev()
        .filter(|l| l.split(' ').nth(4) == Some(p.as_str()))
        .find_map(|l| l.split(" - ").nth(1)?.split(' ').next().map(str::to_owned))
}

/// `blockdev --getsize64` (opening a bound target file opens the device).
fn device_size(path: &Path) -> i64 {
    run_cmd("blockdev", &["--getsize64", &path_str(path)])
        .trim()
        .parse()
        .unwrap()
}

fn lvchange(vg: &LoopVg, volume_id: &str, flag: &str) {
    run_cmd(
        "lvm",
        &[
            "lvchange",
            "-qq",
            flag,
            &format!("{}/{}", vg.vg, lv_name(volume_id)),
        ],
    );
}

fn condition(r: &csi::NodeGetVolumeStatsResponse) -> (bool, String) {
    let c = r.volume_condition.as_ref().expect("volume_condition");
    (c.abnormal, c.message.clone())
}

// ---------------------------------------------------------------------------
// 1. Conformance subset
// ---------------------------------------------------------------------------

/// One pool through the conformance steps below, in order: each step checks
/// one behaviour and hands the next what it needs. They share one VG (a VG
/// per step would cost VM time); the thick-only steps do not depend on the
/// kind of pool and run while the thin pool's steps run beside them.
async fn conformance(kind: Kind) {
    require_root();
    let f = Fx::new(kind).await;
    let empty = empty_pool_offers_lvm_free_space(&f).await;
    let vols = creates_are_whole_extents_within_the_range(&f).await;
    repeated_creates_return_the_same_volume(&f, &vols, &empty).await;
    let foreign = other_lvs_of_the_vg_are_not_this_pools(&f, &vols).await;
    let b1 = validate_accepts_block_and_checks_the_access_type(&f, &vols.c1).await;
    if kind == Kind::Thick {
        ids_are_checked_before_lvm(&f).await;
        stats_of_a_published_filesystem(&f, &vols.c1).await;
    }
    block_volume_condition_follows_the_lv(&f, &b1).await;
    if kind == Kind::Thick {
        stats_of_a_deactivated_filesystem_volume(&f, &vols.c1).await;
    }
    deletes_are_idempotent_and_give_everything_back(&f, &vols, &b1, &foreign, &empty).await;
}

/// What the empty pool had: the last step must find it again.
struct Empty {
    lvs: Vec<String>,
    capacity: i64,
    /// What creates may promise ([`GroundTruth::promise_room`]).
    promise_room: i64,
}

/// The mount volumes the conformance steps create: c1 (10 MiB asked, 12 MiB
/// made), c3 and c4 (8 MiB).
struct Created {
    c1: csi::Volume,
    c3: csi::Volume,
    c4: csi::Volume,
}

/// GetCapacity of the empty pool is LVM's free space minus the reserve, in
/// LVM's default extents.
async fn empty_pool_offers_lvm_free_space(f: &Fx) -> Empty {
    let extent = f.vg.vg_sizes().2;
    assert_eq!(extent, Fx::EXTENT, "LVM's default extent size");
    let lvs = f.lv_names();
    let cap0 = f.d.capacity(None).await;
    assert_eq!(
        cap0.available_capacity,
        f.expected_capacity(),
        "GetCapacity, empty pool"
    );
    assert_eq!(cap0.maximum_volume_size, Some(cap0.available_capacity));
    assert!(cap0.available_capacity > GIB as i64 / 2, "{cap0:?}");
    Empty {
        lvs,
        capacity: cap0.available_capacity,
        promise_room: f.promise_room(),
    }
}

/// Sizes are whole extents, within the capacity range; a new LV is tagged,
/// active, of the pool's kind and blank.
async fn creates_are_whole_extents_within_the_range(f: &Fx) -> Created {
    let c1 = must(
        "create c1",
        f.create(sized("c1", 10 * MI, 0, fs_cap(""))).await,
    );
    assert_eq!(c1.capacity_bytes, 12 * MI, "10 MiB rounds up to 3 extents");
    assert!(
        c1.volume_id.starts_with(&format!("{}.", f.pool)),
        "{}",
        c1.volume_id
    );
    assert_eq!(c1.accessible_topology, vec![topology(NODE_ID)]);
    let lv = f.lv(&c1.volume_id).expect("the LV of c1");
    assert_eq!(lv.size, 12 * MI);
    assert_eq!(sorted(lv.tags.clone()), f.expected_tags("c1", "mount"));
    assert!(lv.is_active(), "{lv:?}");
    match f.kind {
        Kind::Thick => assert!(lv.attr.starts_with('-'), "a plain LV: {lv:?}"),
        Kind::Thin => {
            assert!(lv.attr.starts_with('V'), "a thin LV: {lv:?}");
            assert_eq!(lv.pool_lv, "tp");
        }
    }
    assert_eq!(
        blkid(&f.dev(&c1.volume_id), "TYPE"),
        None,
        "a new LV is blank"
    );
    must_fail(
        "5Mi..6Mi cannot be met in 4 MiB extents",
        f.create(sized("c2", 5 * MI, 6 * MI, fs_cap(""))).await,
        Code::OutOfRange,
    );
    let c3 = must(
        "create c3",
        f.create(sized("c3", 8 * MI, 8 * MI, fs_cap(""))).await,
    );
    assert_eq!(c3.capacity_bytes, 8 * MI);
    let c4 = must(
        "limit only",
        f.create(sized("c4", 0, 8 * MI, fs_cap(""))).await,
    );
    assert_eq!(
        c4.capacity_bytes,
        8 * MI,
        "default size capped by limit_bytes"
    );
    Created { c1, c3, c4 }
}

/// Repeats: same request → same volume; a mismatch → ALREADY_EXISTS. None of
/// them makes an LV, and the capacity drops by exactly what was created.
async fn repeated_creates_return_the_same_volume(f: &Fx, vols: &Created, empty: &Empty) {
    let c1 = &vols.c1;
    for r in [range(10 * MI, 0), range(12 * MI, 12 * MI), range(0, 0)] {
        let again = must(
            &format!("repeat c1 {r:?}"),
            f.create(csi::CreateVolumeRequest {
                capacity_range: Some(r),
                ..sized("c1", 0, 0, fs_cap(""))
            })
            .await,
        );
        assert_eq!(again.volume_id, c1.volume_id);
        assert_eq!(again.capacity_bytes, 12 * MI);
    }
    for (what, req) in [
        ("bigger", sized("c1", 20 * MI, 0, fs_cap(""))),
        ("limit below", sized("c1", 4 * MI, 8 * MI, fs_cap(""))),
        ("block", sized("c1", 10 * MI, 0, blk())),
    ] {
        must_fail(
            &format!("c1 {what}"),
            f.create(req).await,
            Code::AlreadyExists,
        );
    }
    let mut want = empty.lvs.clone();
    want.extend([
        lv_name(&c1.volume_id),
        lv_name(&vols.c3.volume_id),
        lv_name(&vols.c4.volume_id),
    ]);
    assert_eq!(
        f.lv_names(),
        sorted(want.clone()),
        "nothing else was created"
    );
    // What was promised is gone from the promise room; a thin pool's offer,
    // capped by its unwritten data space, does not drop (nothing was written).
    let cap1 = f.d.capacity(None).await.available_capacity;
    assert_eq!(f.promise_room(), empty.promise_room - 28 * MI);
    match f.kind {
        Kind::Thick => assert_eq!(cap1, empty.capacity - 28 * MI),
        Kind::Thin => assert_eq!(cap1, empty.capacity),
    }
    assert_eq!(cap1, f.expected_capacity());
}

/// `lvcreate` by hand: a 4 MiB LV `name` in this pool's VG (thin: in its thin
/// pool) with these tags.
fn lvcreate_beside(f: &Fx, name: &str, tags: &[&str]) {
    let (size_arg, target) = match f.kind {
        Kind::Thick => ("-L", f.vg.vg.clone()),
        Kind::Thin => ("-V", format!("{}/tp", f.vg.vg)),
    };
    let mut args = vec!["lvcreate", "-qq", "-y", size_arg, "4m", "-n", name];
    for t in tags {
        args.extend(["--addtag", *t]);
    }
    if f.kind == Kind::Thin {
        args.push("-T");
    }
    args.push(&target);
    run_cmd("lvm", &args);
}

/// ListVolumes lists this pool's volumes only, not other LVs of the VG (an
/// untagged one, another pool's); their space counts against the capacity;
/// another pool's LV is not found by Validate and never removed by Delete.
/// Returns the names of the LVs made by hand.
async fn other_lvs_of_the_vg_are_not_this_pools(f: &Fx, vols: &Created) -> [String; 2] {
    let d = &f.d;
    let foreign_key = "0".repeat(32);
    let foreign_lv = format!("lv-{foreign_key}");
    lvcreate_beside(f, "foreign", &[]);
    lvcreate_beside(
        f,
        &foreign_lv,
        &[
            "localvol",
            "localvol.pool=other",
            "localvol.name=x",
            "localvol.access=mount",
        ],
    );
    let mut listed: Vec<(String, i64)> = d
        .list_all()
        .await
        .into_iter()
        .map(|v| (v.volume_id, v.capacity_bytes))
        .collect();
    listed.sort();
    let mut want_list = vec![
        (vols.c1.volume_id.clone(), 12 * MI),
        (vols.c3.volume_id.clone(), 8 * MI),
        (vols.c4.volume_id.clone(), 8 * MI),
    ];
    want_list.sort();
    assert_eq!(listed, want_list);
    // Made beside the driver: GetCapacity keeps an answer up to 2 s
    // (pool/lvm/capacity.rs, OFFER_TTL), so the LVs show within that.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut cap = d.capacity(None).await.available_capacity;
    while cap != f.expected_capacity() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cap = d.capacity(None).await.available_capacity;
    }
    assert_eq!(
        cap,
        f.expected_capacity(),
        "other LVs use the pool too (within the 2 s an answer is kept)"
    );
    // Another pool's LV in this VG is not this pool's volume and is never removed.
    let foreign_id = format!("{}.{foreign_key}", f.pool);
    let r = f.validate(&foreign_id, vec![fs_cap("")]).await;
    assert_code("Validate of another pool's LV", r, Code::NotFound);
    let r = f.delete_volume(&foreign_id).await;
    must_fail("Delete of another pool's LV", r, Code::FailedPrecondition);
    assert!(
        f.vg.lv(&foreign_lv).is_some(),
        "another pool's LV was removed"
    );
    ["foreign".to_owned(), foreign_lv]
}

/// ValidateVolumeCapabilities: block is fine on LVM, but only for a block
/// volume; a mount volume takes any filesystem type. Creates and returns b1,
/// a 4 MiB block volume.
async fn validate_accepts_block_and_checks_the_access_type(
    f: &Fx,
    c1: &csi::Volume,
) -> csi::Volume {
    let b1 = must("create b1", f.create(sized("b1", 4 * MI, 0, blk())).await);
    assert_eq!(b1.capacity_bytes, 4 * MI);
    assert_eq!(
        sorted(f.lv(&b1.volume_id).unwrap().tags),
        f.expected_tags("b1", "block")
    );
    for (id, caps, valid) in [
        (&b1.volume_id, vec![blk()], true),
        (&b1.volume_id, vec![fs_cap("")], false),
        (&c1.volume_id, vec![fs_cap("xfs")], true),
        (
            &c1.volume_id,
            vec![fs_cap("ext4"), mount_cap(AccessMode::SingleNodeReaderOnly)],
            true,
        ),
        (&c1.volume_id, vec![blk()], false),
    ] {
        let r = ok(
            "ValidateVolumeCapabilities",
            f.validate(id, caps.clone()).await,
        );
        assert_eq!(r.confirmed.is_some(), valid, "{id} {caps:?}: {r:?}");
        assert_eq!(r.message.is_empty(), valid, "{r:?}");
    }
    b1
}

/// Ids are validated before anything reaches LVM: malformed ones are
/// INVALID_ARGUMENT everywhere, well-formed ones of volumes that do not exist
/// name nothing; the VG and the paths stay as they were. This does not depend
/// on the kind of pool: checked on the thick one only (lvm is slow in the VM).
async fn ids_are_checked_before_lvm(f: &Fx) {
    let (staging, target) = (f.d.staging_path("c1"), f.d.target_path("c1"));
    let lvs_before = f.lv_names();
    malformed_ids_are_invalid_argument(f, &staging, &target).await;
    unknown_ids_are_not_found_here(f, &staging).await;
    assert_eq!(f.lv_names(), lvs_before, "a bad id changed the VG");
    assert!(!staging.exists() && !target.exists());
}

const HEX_KEY: &str = "0123456789abcdef0123456789abcdef";

async fn malformed_ids_are_invalid_argument(f: &Fx, staging: &Path, target: &Path) {
    let (mut c, mut n, pool) = (f.d.controller(), f.d.node(), f.pool);
    for bad in [
        "../x".to_owned(),
        "a/b".to_owned(),
        format!("{pool}/../{HEX_KEY}"),
        format!("{pool}.{HEX_KEY}\0"),
        format!("{pool}..{HEX_KEY}"),
        "a".repeat(129),
    ] {
        let ia = Code::InvalidArgument;
        let r = f.delete_volume(&bad).await;
        must_fail(&format!("Delete {bad:?}"), r, ia);
        let r = f.validate(&bad, vec![fs_cap("")]).await;
        assert_code(&format!("Validate {bad:?}"), r, ia);
        let r = c.controller_expand_volume(expand_64mi(&bad)).await;
        assert_code(&format!("ControllerExpand {bad:?}"), r, ia);
        let r = n.node_stage_volume(stage_req(&bad, staging)).await;
        assert_code(&format!("Stage {bad:?}"), r, ia);
        let r = n.node_get_volume_stats(stats_req(&bad, staging)).await;
        assert_code(&format!("Stats {bad:?}"), r, ia);
        let r = n
            .node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: bad.clone(),
                volume_path: path_str(target),
                capacity_range: Some(range(64 * MI, 0)),
                ..Default::default()
            })
            .await;
        assert_code(&format!("NodeExpand {bad:?}"), r, ia);
    }
}

/// ControllerExpandVolume to at least 64 MiB.
fn expand_64mi(volume_id: &str) -> csi::ControllerExpandVolumeRequest {
    csi::ControllerExpandVolumeRequest {
        volume_id: volume_id.to_owned(),
        capacity_range: Some(range(64 * MI, 0)),
        ..Default::default()
    }
}

/// Well-formed ids of volumes that do not exist: Delete succeeds, Stage is
/// NOT_FOUND; ControllerExpand leaves the size to the volume's node, unless
/// the key could never name a volume.
async fn unknown_ids_are_not_found_here(f: &Fx, staging: &Path) {
    let (mut c, mut n, pool) = (f.d.controller(), f.d.node(), f.pool);
    for unknown in [
        format!("{pool}.{}", "f".repeat(32)),
        format!("nopool.{HEX_KEY}"),
        format!("{pool}.$(reboot) lv-x;rm -rf"),
    ] {
        let r = f.delete_volume(&unknown).await;
        must(&format!("Delete {unknown:?}"), r);
        let r = n.node_stage_volume(stage_req(&unknown, staging)).await;
        assert_code(&format!("Stage {unknown:?}"), r, Code::NotFound);
        let r = c.controller_expand_volume(expand_64mi(&unknown)).await;
        if unknown.contains('$') {
            assert_code(&format!("ControllerExpand {unknown:?}"), r, Code::NotFound);
        } else {
            // Well-formed: possibly a volume on another node, so the size is
            // left to NodeExpandVolume there (and nothing happens here).
            let r = ok(&format!("ControllerExpand {unknown:?}"), r);
            assert!(r.node_expansion_required, "{unknown:?}: {r:?}");
        }
    }
}

/// NodeGetVolumeStats of a staged and published filesystem volume: bytes and
/// inodes, healthy (thick only: the filesystem part does not depend on the
/// kind of LV). Leaves c1 published.
async fn stats_of_a_published_filesystem(f: &Fx, c1: &csi::Volume) {
    let d = &f.d;
    let (staging, target) = (d.staging_path("c1"), d.target_path("c1"));
    d.stage(&c1.volume_id, &staging).await;
    d.publish(&c1.volume_id, &staging, &target, false).await;
    let s = ok(
        "stats c1",
        d.node()
            .node_get_volume_stats(stats_req(&c1.volume_id, &target))
            .await,
    );
    let bytes = s
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .unwrap();
    let inodes = s
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Inodes as i32)
        .unwrap();
    assert!(bytes.total > 8 * MI && bytes.total <= 12 * MI, "{s:?}");
    assert!(
        bytes.used <= bytes.total && bytes.available <= bytes.total,
        "{s:?}"
    );
    assert!(inodes.total > 0 && inodes.used > 0, "{s:?}");
    assert_eq!(condition(&s), (false, "volume is healthy".into()));
}

/// A published raw block volume: its stats are the device's size; its
/// condition is abnormal while the LV is deactivated behind the driver's
/// back, and after a reactivation until it is published again (publishing
/// activates an inactive LV). Leaves b1 published.
async fn block_volume_condition_follows_the_lv(f: &Fx, b1: &csi::Volume) {
    let d = &f.d;
    let (bstaging, btarget) = (d.staging_path("b1"), d.target_path("b1"));
    let publish_b1 = || publish_cap(d, &b1.volume_id, &bstaging, &btarget, blk());
    must("publish b1", publish_b1().await);
    let stats_b1 = || {
        let req = stats_req(&b1.volume_id, &btarget);
        let mut n = d.node();
        async move { ok("stats b1", n.node_get_volume_stats(req).await) }
    };
    let s = stats_b1().await;
    assert_eq!(s.usage.len(), 1, "{s:?}");
    assert_eq!(s.usage[0].total, 4 * MI);
    assert_eq!(s.usage[0].unit, csi::volume_usage::Unit::Bytes as i32);
    assert!(!condition(&s).0, "{s:?}");
    // Deactivated behind the driver's back: abnormal. Reactivated, the LV has
    // a new device node and the pod's bind still shows the old one: abnormal
    // until kubelet publishes it again.
    lvchange(&f.vg, &b1.volume_id, "-an");
    let (abnormal, msg) = condition(&stats_b1().await);
    assert!(abnormal && msg.contains("not active"), "{msg}");
    lvchange(&f.vg, &b1.volume_id, "-ay");
    let (abnormal, msg) = condition(&stats_b1().await);
    assert!(
        abnormal && msg.contains("not a mount of this volume"),
        "{msg}"
    );
    d.unpublish(&b1.volume_id, &btarget).await;
    // Publishing a raw block volume activates an inactive LV.
    lvchange(&f.vg, &b1.volume_id, "-an");
    must("publish b1 again", publish_b1().await);
    let (abnormal, msg) = condition(&stats_b1().await);
    assert!(!abnormal, "{msg}");
}

/// The stats of a filesystem volume whose LV is inactive are abnormal (thick
/// only). A filesystem volume cannot be deactivated while mounted: c1 is
/// unpublished and unstaged first.
async fn stats_of_a_deactivated_filesystem_volume(f: &Fx, c1: &csi::Volume) {
    let d = &f.d;
    let (staging, target) = (d.staging_path("c1"), d.target_path("c1"));
    d.unpublish(&c1.volume_id, &target).await;
    d.unstage(&c1.volume_id, &staging).await;
    lvchange(&f.vg, &c1.volume_id, "-an");
    fs::create_dir(&staging).ok();
    let s = ok(
        "stats of a deactivated c1",
        d.node()
            .node_get_volume_stats(stats_req(&c1.volume_id, &staging))
            .await,
    );
    let (abnormal, msg) = condition(&s);
    assert!(abnormal && msg.contains("not active"), "{msg}");
    lvchange(&f.vg, &c1.volume_id, "-ay");
}

/// Delete: the LV goes; a repeat is OK. With the hand-made LVs removed too,
/// the VG and the capacity are the empty pool's again.
async fn deletes_are_idempotent_and_give_everything_back(
    f: &Fx,
    vols: &Created,
    b1: &csi::Volume,
    foreign: &[String],
    empty: &Empty,
) {
    let d = &f.d;
    d.unpublish(&b1.volume_id, &d.target_path("b1")).await;
    for v in [&vols.c1, &vols.c3, &vols.c4, b1] {
        d.delete(&v.volume_id).await;
        d.delete(&v.volume_id).await;
    }
    assert!(d.list_all().await.is_empty());
    for lv in foreign {
        run_cmd(
            "lvm",
            &["lvremove", "-qq", "-y", &format!("{}/{lv}", f.vg.vg)],
        );
    }
    // Thick pools: deleted LVs are zeroed in the background first.
    f.wait_for_wipes().await;
    assert_eq!(f.lv_names(), empty.lvs);
    assert_eq!(d.capacity(None).await.available_capacity, empty.capacity);
}

// ---------------------------------------------------------------------------
// 2. Lifecycle with real data, across restarts
// ---------------------------------------------------------------------------

/// One volume through stage, publish, restage elsewhere, a clean restart, a
/// crash and a start with its LV inactive, its data checked after each step;
/// then deleted (twice), giving the pool its capacity back.
async fn lifecycle_with_data(kind: Kind) {
    require_root();
    // Thick: ext4 (the default default); thin: xfs as the pool's
    // defaultFsType, asked for at 64Mi: mkfs.xfs refuses < 300 MiB, so the
    // driver makes it 300Mi (found by the e2e cluster: a 64Mi XFS claim was
    // created and then failed NodeStage forever).
    let (fs, size) = match kind {
        Kind::Thick => ("ext4", 32 * MI),
        Kind::Thin => ("xfs", 64 * MI),
    };
    let mut f = Fx::with(kind, |o| match kind {
        Kind::Thick => o,
        Kind::Thin => o.default_fs_type("xfs"),
    })
    .await;
    let cap0 = f.d.capacity(None).await.available_capacity;
    if fs == "xfs" {
        let e = f
            .create(sized("life-small", 64 * MI, 100 * MI, fs_cap("")))
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Code::OutOfRange,
            "a limit below XFS's minimum: {e:?}"
        );
        assert!(f.lvs_named("life-small").is_empty(), "nothing made");
    }
    let v = f.d.create("life", size).await;
    let id = v.volume_id.clone();
    let want = if fs == "xfs" { 300 * MI } else { size };
    assert_eq!((v.capacity_bytes, f.lv_size(&id)), (want, want));
    let dev = f.dev(&id);
    assert_eq!(blkid(&dev, "TYPE"), None);

    let uuid = first_stage_formats_and_publish_writes(&f, &id, fs).await;
    let (staging, target) = restage_elsewhere_keeps_the_data(&f, &id, &uuid).await;
    published_data_survives_a_clean_restart(&mut f, &id, &staging, &target).await;
    staged_data_survives_a_crash(&mut f, &id, &uuid).await;
    stage_activates_an_inactive_lv(&mut f, &id, &uuid).await;

    f.d.delete(&id).await;
    f.assert_lv_gone(&id);
    f.d.delete(&id).await;
    // A thick pool's LV keeps its name (tagged deleted) until the wiper
    // renames it; once the wipes end, its device node must be gone.
    f.wait_for_wipes().await;
    assert!(!dev.exists(), "{dev:?} left behind");
    assert_eq!(f.d.capacity(None).await.available_capacity, cap0);
}

/// The first stage (at "life") makes the filesystem `fs`; publish, write a
/// file and a nested one; the mounted LV is open. Returns the filesystem's
/// UUID.
async fn first_stage_formats_and_publish_writes(f: &Fx, id: &str, fs: &str) -> String {
    let dev = f.dev(id);
    let staging = f.d.staging_path("life");
    let target = f.d.target_path("life");
    f.d.stage(id, &staging).await;
    assert_eq!(
        blkid(&dev, "TYPE").as_deref(),
        Some(fs),
        "stage made the filesystem"
    );
    assert_eq!(fs_type_at(&staging).as_deref(), Some(fs));
    let uuid = blkid(&dev, "UUID").expect("filesystem UUID");
    f.d.publish(id, &staging, &target, false).await;
    write_file(&target, "file.txt", b"first write").unwrap();
    fs::create_dir(target.join("sub")).unwrap();
    write_file(&target.join("sub"), "nested", &vec![42u8; 100_000]).unwrap();
    assert!(f.lv(id).unwrap().open, "a mounted LV is open");
    uuid
}

/// Unpublish, unstage (the LV is no longer open), restage at "life-2" (not
/// reformatted), republish: the data is there. Returns the new staging and
/// target paths, left published.
async fn restage_elsewhere_keeps_the_data(f: &Fx, id: &str, uuid: &str) -> (PathBuf, PathBuf) {
    let dev = f.dev(id);
    let (first_staging, first_target) = (f.d.staging_path("life"), f.d.target_path("life"));
    f.d.unpublish(id, &first_target).await;
    assert!(!first_target.exists());
    f.d.unstage(id, &first_staging).await;
    assert!(f.d.mounts_below_dir().is_empty());
    assert!(!f.lv(id).unwrap().open);
    let staging = f.d.staging_path("life-2");
    let target = f.d.target_path("life-2");
    f.d.stage(id, &staging).await;
    assert_eq!(
        blkid(&dev, "UUID").as_deref(),
        Some(uuid),
        "restage reformatted"
    );
    f.d.publish(id, &staging, &target, false).await;
    assert_file(&target, "file.txt", b"first write");
    assert_file(&target.join("sub"), "nested", &vec![42u8; 100_000]);
    (staging, target)
}

/// A clean restart while published: the data stays writable and publish is
/// idempotent after it. Unpublishes and unstages at the end.
async fn published_data_survives_a_clean_restart(
    f: &mut Fx,
    id: &str,
    staging: &Path,
    target: &Path,
) {
    let status = f.d.stop().await;
    assert!(status.success(), "SIGTERM: {status}");
    f.d.start_again_retrying().await;
    assert_file(target, "file.txt", b"first write");
    write_file(target, "second.txt", b"after restart").unwrap();
    f.d.publish(id, staging, target, false).await; // idempotent after a restart
    f.d.unpublish(id, target).await;
    f.d.unstage(id, staging).await;
}

/// A crash (SIGKILL) while staged at "life-3": stage is idempotent after it,
/// with both files and the same filesystem. Unstages at the end.
async fn staged_data_survives_a_crash(f: &mut Fx, id: &str, uuid: &str) {
    let staging = f.d.staging_path("life-3");
    f.d.stage(id, &staging).await;
    f.d.kill9();
    f.d.start_again_retrying().await;
    f.d.stage(id, &staging).await; // idempotent after a crash
    assert_file(&staging, "file.txt", b"first write");
    assert_file(&staging, "second.txt", b"after restart");
    assert_eq!(blkid(&f.dev(id), "UUID").as_deref(), Some(uuid));
    f.d.unstage(id, &staging).await;
    assert!(f.d.mounts_below_dir().is_empty());
}

/// The LV inactive when the driver starts (a boot without VG
/// auto-activation): staging activates it, the data is there. Unstages at
/// the end.
async fn stage_activates_an_inactive_lv(f: &mut Fx, id: &str, uuid: &str) {
    let dev = f.dev(id);
    f.d.stop().await;
    lvchange(&f.vg, id, "-an");
    assert!(!dev.exists(), "an inactive LV has no device node");
    f.d.start_again_retrying().await;
    let staging = f.d.staging_path("life-4");
    f.d.stage(id, &staging).await;
    let attr = f.lv(id).unwrap().attr;
    assert_eq!(
        attr.chars().nth(4),
        Some('a'),
        "not active after stage: {attr}"
    );
    assert_file(&staging, "file.txt", b"first write");
    assert_eq!(blkid(&dev, "UUID").as_deref(), Some(uuid));
    f.d.unstage(id, &staging).await;
}

// ---------------------------------------------------------------------------
// 3. Never reformat
// ---------------------------------------------------------------------------

async fn never_reformats(kind: Kind) {
    require_root();
    // The pool's default is ext4. Thick: make xfs (asked for in the
    // capability), then ask for ext4; thin: make ext4, then ask for xfs.
    let (have, other, size) = match kind {
        Kind::Thick => ("xfs", "ext4", XFS_SIZE),
        Kind::Thin => ("ext4", "xfs", 64 * MI),
    };
    let f = Fx::new(kind).await;
    let d = &f.d;
    let v = must(
        "create",
        f.create(sized("keep", size, 0, fs_cap(have))).await,
    );
    let id = v.volume_id.as_str();
    let dev = f.dev(id);
    let staging = d.staging_path("keep");

    must("stage", stage_cap(d, id, &staging, fs_cap(have)).await);
    assert_eq!(blkid(&dev, "TYPE").as_deref(), Some(have));
    let uuid = blkid(&dev, "UUID").unwrap();
    write_file(&staging, "precious", b"never lose me").unwrap();
    d.unstage(id, &staging).await;

    for (what, cap) in [("same type", fs_cap(have)), ("no type", fs_cap(""))] {
        must(what, stage_cap(d, id, &staging, cap).await);
        assert_eq!(fs_type_at(&staging).as_deref(), Some(have), "{what}");
        assert_file(&staging, "precious", b"never lose me");
        d.unstage(id, &staging).await;
    }
    let s = must_fail(
        "restage asking for the other type",
        stage_cap(d, id, &staging, fs_cap(other)).await,
        Code::FailedPrecondition,
    );
    assert!(s.message().contains("not reformatting"), "{}", s.message());
    assert!(
        mounts_at(&staging).is_empty(),
        "a refused stage left a mount"
    );
    assert_eq!(blkid(&dev, "TYPE").as_deref(), Some(have));
    assert_eq!(blkid(&dev, "UUID").as_deref(), Some(uuid.as_str()));
    must_fail(
        "publish after a refused stage",
        publish_cap(d, id, &staging, &d.target_path("keep"), fs_cap(have)).await,
        Code::FailedPrecondition,
    );

    must(
        "stage again",
        stage_cap(d, id, &staging, fs_cap(have)).await,
    );
    assert_file(&staging, "precious", b"never lose me");
    d.unstage(id, &staging).await;
    d.delete(id).await;
    f.assert_lv_gone(id);
}

// ---------------------------------------------------------------------------
// 4. Expansion while published
// ---------------------------------------------------------------------------

async fn expansion_while_published(kind: Kind) {
    require_root();
    let f = Fx::new(kind).await;
    // ext4 on the thick pool, xfs on the thin one (growing the filesystem
    // does not depend on the kind of LV; the time in the VM does).
    let fs = match kind {
        Kind::Thick => "ext4",
        Kind::Thin => "xfs",
    };
    published_filesystem_grows(&f, fs).await;
    published_block_device_grows(&f).await;
}

/// ControllerExpandVolume of a published volume says the node must expand
/// it, and leaves the LV to the node.
async fn controller_expand_leaves_the_lv(
    f: &Fx,
    id: &str,
    size: i64,
    grown: i64,
    cap: csi::VolumeCapability,
    what: &str,
) {
    let r = ok(
        what,
        f.d.controller()
            .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: id.to_owned(),
                capacity_range: Some(range(grown, 0)),
                volume_capability: Some(cap),
                ..Default::default()
            })
            .await,
    );
    assert!(r.node_expansion_required, "{r:?}");
    assert_eq!(r.capacity_bytes, grown);
    assert_eq!(
        f.lv_size(id),
        size,
        "the controller must leave the LV to the node"
    );
}

/// ControllerExpandVolume checks the growth against the pool's free space
/// before the PV can grow: more than is free is OUT_OF_RANGE (naming the
/// largest size that fits), with the LV untouched; exactly what is free is
/// accepted and left to NodeExpandVolume, which then really has the room.
async fn expansion_beyond_free_space(kind: Kind) {
    require_root();
    let f = Fx::new(kind).await;
    let d = &f.d;
    let size = 64 * MI;
    let v = must(
        "create",
        f.create(sized("tight", size, 0, fs_cap(""))).await,
    );
    let id = v.volume_id.as_str();
    let free = d.capacity(None).await.available_capacity;
    assert_eq!(free, f.expected_capacity());
    let expand = |grown: i64| {
        let mut c = d.controller();
        let req = csi::ControllerExpandVolumeRequest {
            volume_id: id.to_owned(),
            capacity_range: Some(range(grown, 0)),
            ..Default::default()
        };
        async move { c.controller_expand_volume(req).await }
    };
    let too_much = expand(size + free + f.extent()).await;
    let e = too_much.expect_err("growth beyond the free space was accepted");
    assert_eq!(e.code(), Code::OutOfRange, "{}", e.message());
    assert!(e.message().contains("ask for at most"), "{}", e.message());
    assert_eq!(f.lv_size(id), size, "a refused expansion changed the LV");
    let r = ok("exactly the free space", expand(size + free).await);
    assert!(r.node_expansion_required, "{r:?}");
    assert_eq!(r.capacity_bytes, size + free);
    assert_eq!(
        f.lv_size(id),
        size,
        "the controller must leave the LV to the node"
    );
    d.delete(id).await;
}

/// Kubernetes' expansion-failure recovery (RecoverVolumeExpansionFailure):
/// growth that does not fit is OUT_OF_RANGE with nothing changed, in
/// ControllerExpandVolume and in NodeExpandVolume (which another node's
/// resizer may have let through on a stale CSIStorageCapacity); the user
/// then lowers the request, and the lower size that fits succeeds, also on a
/// repeat. A request below the current size answers OK with the current
/// size (the spec: a volume already at least as large is success), a limit
/// below it is OUT_OF_RANGE; nothing ever shrinks.
async fn expansion_recovers_at_a_lower_size(kind: Kind) {
    require_root();
    let f = Fx::new(kind).await;
    let d = &f.d;
    let size = 64 * MI;
    let lower = size + 64 * MI;
    let v = must(
        "create",
        f.create(sized("recover", size, 0, fs_cap("ext4"))).await,
    );
    let id = v.volume_id.as_str();
    // A filler takes half the room, so that growth beyond the rest fits what
    // the pool could ever hold and is refused for want of free space.
    let filler = must("filler", f.create(sized("filler", GI, 0, blk())).await);
    let (staging, target) = (d.staging_path("recover"), d.target_path("recover"));
    must("stage", stage_cap(d, id, &staging, fs_cap("ext4")).await);
    must(
        "publish",
        publish_cap(d, id, &staging, &target, fs_cap("ext4")).await,
    );
    write_file(&target, "data", b"still here").unwrap();
    let fs_before = fs_total(&target);
    let controller = |required: i64, limit: i64| {
        let mut c = d.controller();
        let req = csi::ControllerExpandVolumeRequest {
            volume_id: id.to_owned(),
            capacity_range: Some(range(required, limit)),
            volume_capability: Some(fs_cap("ext4")),
            ..Default::default()
        };
        async move { c.controller_expand_volume(req).await }
    };
    let node = |required: i64, limit: i64| {
        let mut n = d.node();
        let req = csi::NodeExpandVolumeRequest {
            volume_id: id.to_owned(),
            volume_path: path_str(&target),
            staging_target_path: path_str(&staging),
            capacity_range: Some(range(required, limit)),
            volume_capability: Some(fs_cap("ext4")),
            ..Default::default()
        };
        async move { n.node_expand_volume(req).await }
    };

    // ControllerExpandVolume: too large refused, the LV unchanged; lower OK.
    let free = d.capacity(None).await.available_capacity;
    let e = assert_code(
        "ControllerExpandVolume beyond the free space",
        controller(size + free + f.extent(), 0).await,
        Code::OutOfRange,
    );
    assert!(e.message().contains("ask for at most"), "{}", e.message());
    assert_eq!(f.lv_size(id), size, "a refused expansion changed the LV");
    let r = ok("ControllerExpandVolume lower", controller(lower, 0).await);
    assert_eq!((r.capacity_bytes, r.node_expansion_required), (lower, true));

    // NodeExpandVolume of growth the pool has no room for: OUT_OF_RANGE
    // (kubelet: infeasible), the LV and the filesystem unchanged.
    let room = f.promise_room();
    let too_large = size + room + f.extent();
    assert!(
        too_large <= f.ever(),
        "the filler must leave the request below what the pool could ever hold"
    );
    let e = assert_code(
        "NodeExpandVolume beyond the room",
        node(too_large, 0).await,
        Code::OutOfRange,
    );
    let most = format!("ask for at most {} bytes", size + room);
    assert!(
        e.message().contains(&most),
        "{most:?} not in {}",
        e.message()
    );
    assert_eq!(
        f.lv_size(id),
        size,
        "a refused NodeExpandVolume changed the LV"
    );
    assert_eq!(
        fs_total(&target),
        fs_before,
        "a refused NodeExpandVolume grew the filesystem"
    );

    // The lowered request fits: done, and again on a repeat.
    for round in ["lower", "lower again"] {
        let r = ok(&format!("NodeExpandVolume {round}"), node(lower, 0).await);
        assert_eq!(r.capacity_bytes, lower, "{round}");
        assert_eq!(f.lv_size(id), lower, "{round}");
        assert!(
            fs_total(&target) >= fs_before + 48 * MI,
            "{round}: the filesystem did not grow"
        );
    }
    let fs_grown = fs_total(&target);

    // Below the current size: OK with the current size, nothing shrinks;
    // a limit below it cannot be met without shrinking: OUT_OF_RANGE.
    let r = ok("ControllerExpandVolume below", controller(size, 0).await);
    assert_eq!(r.capacity_bytes, lower);
    let r = ok("NodeExpandVolume below", node(size, 0).await);
    assert_eq!(r.capacity_bytes, lower);
    assert_code(
        "ControllerExpandVolume limit below",
        controller(size, size).await,
        Code::OutOfRange,
    );
    assert_code(
        "NodeExpandVolume limit below",
        node(size, size).await,
        Code::OutOfRange,
    );
    assert_eq!(
        f.lv_size(id),
        lower,
        "a request below the current size changed the LV"
    );
    assert_eq!(
        fs_total(&target),
        fs_grown,
        "a request below the current size changed the filesystem"
    );
    assert_file(&target, "data", b"still here");

    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
    d.delete(id).await;
    d.delete(&filler.volume_id).await;
}

/// The StorageClass's `format.*` parameters reach mkfs: by default an XFS
/// volume has `nrext64=0` (mountable by kernels before 5.19, whatever the
/// image's mkfs.xfs defaults to); a class may turn it on and reflink off
/// (checked with `xfs_info`), or turn ext4's metadata_csum off (checked with
/// `dumpe2fs`). Options of another filesystem, a bad value, or a volume
/// context tampered with before NodeStage are INVALID_ARGUMENT, nothing
/// formatted; a raw block volume of such a class is created, the options
/// not carried.
async fn format_options(kind: Kind) {
    require_root();
    let f = Fx::new(kind).await;
    let d = &f.d;
    let with = |name: &str, size: i64, cap: csi::VolumeCapability, params: &[(&str, &str)]| {
        let mut req = sized(name, size, 0, cap);
        req.parameters = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        req
    };
    let stage_ctx = |v: &csi::Volume, fs: &str| {
        let mut req = stage_req(
            &v.volume_id,
            &d.staging_path(&v.volume_id.replace('.', "-")),
        );
        req.volume_capability = Some(fs_cap(fs));
        req.volume_context = v.volume_context.clone();
        req
    };
    let staged_fs = |v: &csi::Volume, fs: &str, tool: &str| {
        let dev = f.dev(&v.volume_id);
        let out = match tool {
            "xfs_db" => Command::new("xfs_db")
                .args(["-r", "-c", "info"])
                .arg(&dev)
                .output(),
            _ => Command::new("dumpe2fs").arg("-h").arg(&dev).output(),
        }
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
        assert!(out.status.success(), "{tool} {fs}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut cases = vec![];
    for (name, fs, params, want, unwanted) in [
        (
            "fmt-default",
            "xfs",
            vec![],
            vec!["nrext64=0"],
            vec!["nrext64=1"],
        ),
        (
            "fmt-xfs",
            "xfs",
            vec![
                ("format.xfs.nrext64", "true"),
                ("format.xfs.reflink", "false"),
            ],
            vec!["nrext64=1", "reflink=0"],
            vec!["nrext64=0", "reflink=1"],
        ),
        (
            "fmt-ext4",
            "ext4",
            vec![("format.ext4.features", "^metadata_csum")],
            vec!["extent"],
            vec!["metadata_csum"],
        ),
    ] {
        let size = if fs == "xfs" { XFS_SIZE } else { 64 * MI };
        let v = must(name, f.create(with(name, size, fs_cap(fs), &params)).await);
        for (k, val) in &params {
            assert_eq!(
                v.volume_context.get(*k).map(String::as_str),
                Some(*val),
                "{name}: {:?}",
                v.volume_context
            );
        }
        must(
            &format!("stage {name}"),
            d.node()
                .node_stage_volume(stage_ctx(&v, fs))
                .await
                .map(Response::into_inner),
        );
        let info = staged_fs(&v, fs, if fs == "xfs" { "xfs_db" } else { "dumpe2fs" });
        let features = match fs {
            "xfs" => info.clone(),
            _ => info
                .lines()
                .find(|l| l.starts_with("Filesystem features:"))
                .unwrap_or_else(|| panic!("{name}: no features in {info}"))
                .to_owned(),
        };
        let words: Vec<&str> = features
            .split(|c: char| c.is_whitespace() || c == ',')
            .collect();
        for w in want {
            assert!(words.contains(&w), "{name}: {w} not in {features}");
        }
        for w in unwanted {
            assert!(!words.contains(&w), "{name}: {w} in {features}");
        }
        cases.push((v, fs));
    }

    let ia = Code::InvalidArgument;
    for (what, fs, params) in [
        (
            "xfs options on ext4",
            "ext4",
            vec![("format.xfs.nrext64", "false")],
        ),
        (
            "ext4 options on xfs",
            "xfs",
            vec![("format.ext4.features", "^orphan_file")],
        ),
        ("a bad value", "xfs", vec![("format.xfs.nrext64", "0")]),
        (
            "an unknown option",
            "xfs",
            vec![("format.xfs.crc", "false")],
        ),
        (
            "a feature not allowed",
            "ext4",
            vec![("format.ext4.features", "^has_journal")],
        ),
    ] {
        let size = if fs == "xfs" { XFS_SIZE } else { 64 * MI };
        assert_code(
            what,
            d.controller()
                .create_volume(with("fmt-bad", size, fs_cap(fs), &params))
                .await,
            ia,
        );
        assert!(f.lvs_named("fmt-bad").is_empty(), "{what}: an LV was made");
    }
    // A block claim of a class with format options: nothing to format, the
    // options are not carried.
    let b = must(
        "block with options",
        f.create(with(
            "fmt-blk",
            16 * MI,
            blk(),
            &[("format.xfs.nrext64", "false")],
        ))
        .await,
    );
    assert!(
        !b.volume_context.keys().any(|k| k.starts_with("format.")),
        "{:?}",
        b.volume_context
    );
    d.delete(&b.volume_id).await;

    // NodeStage decodes the context again: a bad value or options of
    // another filesystem are refused before anything is formatted.
    let fresh = must(
        "fresh",
        f.create(with("fmt-fresh", XFS_SIZE, fs_cap("xfs"), &[]))
            .await,
    );
    for (what, fs, k, v) in [
        ("bad value", "xfs", "format.xfs.nrext64", "yes"),
        ("other filesystem", "xfs", "format.ext4.features", "64bit"),
        ("unknown", "xfs", "format.xfs.rmapbt", "true"),
    ] {
        let mut req = stage_ctx(&fresh, fs);
        req.volume_context.insert(k.to_owned(), v.to_owned());
        assert_code(
            &format!("NodeStage {what}"),
            d.node().node_stage_volume(req).await,
            ia,
        );
        assert_eq!(
            blkid(&f.dev(&fresh.volume_id), "TYPE"),
            None,
            "NodeStage {what} formatted the device"
        );
    }
    d.delete(&fresh.volume_id).await;

    for (v, _) in cases {
        d.unstage(
            &v.volume_id,
            &d.staging_path(&v.volume_id.replace('.', "-")),
        )
        .await;
        d.delete(&v.volume_id).await;
    }
}

/// A staged and published filesystem grows by 64 MiB: the controller leaves
/// it to NodeExpandVolume, which extends the LV and grows the filesystem
/// (again on a repeat); the data stays.
async fn published_filesystem_grows(f: &Fx, fs: &str) {
    let d = &f.d;
    let size = if fs == "xfs" { XFS_SIZE } else { 64 * MI };
    let grown = size + 64 * MI;
    let name = format!("grow-{fs}");
    let v = must("create", f.create(sized(&name, size, 0, fs_cap(fs))).await);
    let id = v.volume_id.as_str();
    let staging = d.staging_path(&name);
    let target = d.target_path(&name);
    must("stage", stage_cap(d, id, &staging, fs_cap(fs)).await);
    must(
        "publish",
        publish_cap(d, id, &staging, &target, fs_cap(fs)).await,
    );
    write_file(&target, "data", b"still here").unwrap();
    let before = fs_total(&target);
    controller_expand_leaves_the_lv(f, id, size, grown, fs_cap(fs), "ControllerExpandVolume").await;

    let req = csi::NodeExpandVolumeRequest {
        volume_id: id.to_owned(),
        volume_path: path_str(&target),
        staging_target_path: path_str(&staging),
        capacity_range: Some(range(grown, 0)),
        volume_capability: Some(fs_cap(fs)),
        ..Default::default()
    };
    for round in ["first", "repeat"] {
        let r = ok(
            &format!("NodeExpandVolume {fs} {round}"),
            d.node().node_expand_volume(req.clone()).await,
        );
        assert_eq!(r.capacity_bytes, grown);
        assert_eq!(f.lv_size(id), grown, "{fs} {round}");
        let after = fs_total(&target);
        assert!(
            after >= before + 48 * MI,
            "{fs} {round}: the filesystem did not grow ({before} -> {after})"
        );
    }
    assert_file(&target, "data", b"still here");
    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
    d.delete(id).await;
}

/// A published raw block volume: NodeExpandVolume grows the device behind
/// the pod's target; more than the pool can ever hold is OUT_OF_RANGE and
/// leaves the LV as it was.
async fn published_block_device_grows(f: &Fx) {
    let d = &f.d;
    let v = must(
        "create block",
        f.create(sized("grow-blk", 16 * MI, 0, blk())).await,
    );
    let id = v.volume_id.as_str();
    let target = d.target_path("grow-blk");
    must(
        "publish block",
        publish_cap(d, id, &d.staging_path("grow-blk"), &target, blk()).await,
    );
    controller_expand_leaves_the_lv(
        f,
        id,
        16 * MI,
        32 * MI,
        blk(),
        "ControllerExpandVolume block",
    )
    .await;
    let expand = |required: i64| csi::NodeExpandVolumeRequest {
        volume_id: id.to_owned(),
        volume_path: path_str(&target),
        capacity_range: Some(range(required, 0)),
        volume_capability: Some(blk()),
        ..Default::default()
    };
    let mut n = d.node();
    let r = ok(
        "NodeExpandVolume block",
        n.node_expand_volume(expand(32 * MI)).await,
    );
    assert_eq!(r.capacity_bytes, 32 * MI);
    assert_eq!(f.lv_size(id), 32 * MI);
    assert_eq!(
        device_size(&target),
        32 * MI,
        "the published device did not grow"
    );
    // More than the pool can ever hold: OUT_OF_RANGE, the LV unchanged.
    let r = n.node_expand_volume(expand(f.ever() + f.extent())).await;
    assert_code("NodeExpandVolume beyond the pool", r, Code::OutOfRange);
    assert_eq!(f.lv_size(id), 32 * MI);
    d.unpublish(id, &target).await;
    d.delete(id).await;
}

// ---------------------------------------------------------------------------
// 5. Raw block volumes
// ---------------------------------------------------------------------------

async fn block_mode(kind: Kind) {
    require_root();
    let f = Fx::new(kind).await;
    let d = &f.d;
    let v = must("create", f.create(sized("blk", 16 * MI, 0, blk())).await);
    let id = v.volume_id.as_str();
    let dev = f.dev(id);
    assert_eq!(
        sorted(f.lv(id).unwrap().tags),
        f.expected_tags("blk", "block")
    );

    // kubelet stages block volumes too: a no-op here.
    let staging = d.staging_path("blk");
    must("stage block", stage_cap(d, id, &staging, blk()).await);
    assert!(
        mounts_at(&staging).is_empty(),
        "stage of a block volume mounted something"
    );
    assert_eq!(
        blkid(&dev, "TYPE"),
        None,
        "stage of a block volume made a filesystem"
    );

    let target = d.target_path("blk");
    for round in ["publish", "repeat"] {
        must(round, publish_cap(d, id, &staging, &target, blk()).await);
    }
    assert_eq!(mounts_at(&target).len(), 1, "one bind at the target");
    let md = fs::metadata(&target).unwrap();
    assert!(
        md.file_type().is_block_device(),
        "the target is not the device"
    );
    assert_eq!(
        md.rdev(),
        fs::metadata(&dev).unwrap().rdev(),
        "bound from another device"
    );

    // Plain (buffered) writes through the target reach the LV.
    let pattern: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i * 7 + 3) as u8).collect();
    let offset = 3 * MI as u64 + 512;
    {
        let mut w = fs::OpenOptions::new().write(true).open(&target).unwrap();
        w.seek(SeekFrom::Start(offset)).unwrap();
        w.write_all(&pattern).unwrap();
        w.sync_all().unwrap();
    }
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let mut back = vec![0u8; pattern.len()];
    {
        let mut r = fs::File::open(&dev).unwrap();
        r.seek(SeekFrom::Start(offset)).unwrap();
        r.read_exact(&mut back).unwrap();
    }
    assert!(
        back == pattern,
        "the LV does not hold what was written through the target"
    );

    d.unpublish(id, &target).await;
    assert!(!target.exists(), "unpublish left the target file");
    assert!(mounts_at(&target).is_empty());
    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
    d.delete(id).await;
    f.assert_lv_gone(id);
}

// ---------------------------------------------------------------------------
// 6. Crash in the middle of CreateVolume
// ---------------------------------------------------------------------------

/// An `lvm lvcreate` whose arguments carry this pool's and CSI name's tags:
/// (pid, LV name).
fn find_lvcreate(pool: &str, csi_name: &str) -> Option<(i32, String)> {
    let tag = format!("localvol.name={csi_name}");
    let pool_tag = format!("localvol.pool={pool}");
    let (pid, argv) = processes().into_iter().find(|(_, argv)| {
        argv.get(1).map(String::as_str) == Some("lvcreate")
            && argv.contains(&tag)
            && argv.contains(&pool_tag)
    })?;
    let lv = argv
        .iter()
        .position(|a| a == "--name")
        .and_then(|i| argv.get(i + 1))
        .cloned()
        .unwrap_or_default();
    Some((pid, lv))
}

fn sigkill(pid: i32) {
    signal_pid(pid, nix::sys::signal::Signal::SIGKILL);
}

/// Sends CreateVolume, then kills the driver while `lvcreate` runs: with
/// `with_lvm` (what a pod's cgroup kill or the OOM killer does) `lvcreate`
/// dies too, as soon as its new LV's device appears (activated, not yet
/// wiped); without, only the driver dies, as soon as `lvcreate` shows up.
/// Returns a description of what was hit.
async fn kill_during_create(f: &mut Fx, req: &csi::CreateVolumeRequest, with_lvm: bool) -> String {
    let mut c = f.d.controller();
    let r = req.clone();
    let call = tokio::spawn(async move { c.create_volume(r).await });
    let deadline = Instant::now() + Duration::from_secs(30);
    let found = loop {
        if let Some(p) = find_lvcreate(f.pool, &req.name) {
            break Some(p);
        }
        if call.is_finished() || Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let Some((pid, lv)) = found else {
        f.d.kill9();
        let _ = call.await;
        return "lvcreate never seen (the create finished first)".into();
    };
    let what = if with_lvm {
        let node = f.vg.dev_path(&lv);
        loop {
            if node.exists() || exited(pid) || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let hit = node.exists() && !exited(pid);
        sigkill(pid);
        f.d.kill9();
        if hit {
            "killed driver + lvcreate right after the LV was activated".to_owned()
        } else {
            "killed driver + lvcreate (the activation window was missed)".to_owned()
        }
    } else {
        f.d.kill9();
        "killed the driver while lvcreate ran".to_owned()
    };
    let _ = call.await;
    while !exited(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(exited(pid), "lvcreate {pid} still running");
    let state = match f.vg.lv(&lv) {
        None => "no LV".to_owned(),
        Some(l) => format!(
            "LV attr {} tags {:?} content {:?}",
            l.attr,
            l.tags,
            if l.is_active() {
                blkid(&f.vg.dev_path(&lv), "TYPE")
            } else {
                None
            }
        ),
    };
    format!("{what}; left: {state}")
}

async fn crash_mid_create(kind: Kind) {
    require_root();
    let mut f = Fx::new(kind).await;
    let size = 64 * MI;

    // A deleted volume's filesystem and data on the extents the next LV gets.
    let old = f.d.create("old", size).await;
    let staging = f.d.staging_path("old");
    f.d.stage(&old.volume_id, &staging).await;
    write_file(&staging, "secret", b"the previous tenant's data").unwrap();
    f.d.unstage(&old.volume_id, &staging).await;
    f.d.delete(&old.volume_id).await;

    for (name, with_lvm) in [("crash-a", true), ("crash-b", false)] {
        let req = sized(name, size, 0, fs_cap(""));
        let what = kill_during_create(&mut f, &req, with_lvm).await;
        eprintln!("crash_mid_create {kind:?} {name}: {what}");
        f.d.start_again_retrying().await;
        let v = must(
            &format!("{name}: CreateVolume retried after a crash ({what})"),
            f.create(req.clone()).await,
        );
        assert_eq!(v.capacity_bytes, size);
        let lvs = f.lvs_named(name);
        assert_eq!(lvs.len(), 1, "{name}: exactly one LV: {lvs:?}");
        assert_eq!(lvs[0].name, lv_name(&v.volume_id));
        assert_eq!(
            sorted(lvs[0].tags.clone()),
            f.expected_tags(name, "mount"),
            "{what}"
        );
        assert!(lvs[0].is_active(), "{name}: the LV is not active ({what})");
        assert_eq!(
            blkid(&f.dev(&v.volume_id), "TYPE"),
            None,
            "{name}: the new volume is not blank ({what})"
        );
        let again = must("a second retry", f.create(req).await);
        assert_eq!(again.volume_id, v.volume_id);

        if with_lvm {
            // Usable, and empty.
            let staging = f.d.staging_path(name);
            f.d.stage(&v.volume_id, &staging).await;
            assert!(
                !staging.join("secret").exists(),
                "{name}: a deleted volume's data shows in a new one ({what})"
            );
            f.d.unstage(&v.volume_id, &staging).await;
        }
        f.d.delete(&v.volume_id).await;
        f.assert_lv_gone(&v.volume_id);
    }
}

// ---------------------------------------------------------------------------
// 7. A full pool
// ---------------------------------------------------------------------------

async fn pool_full(kind: Kind) {
    require_root();
    let f = Fx::new(kind).await;
    let d = &f.d;
    let extent = f.extent();
    let cap = d.capacity(None).await.available_capacity;
    assert_eq!(cap, f.expected_capacity());
    let base = f.lv_names();

    // More than the pool can ever hold.
    for size in [f.ever() + extent, 1 << 40] {
        must_fail(
            &format!("{size} bytes"),
            f.create(sized("huge", size, 0, fs_cap(""))).await,
            Code::OutOfRange,
        );
    }
    assert_eq!(f.lv_names(), base, "a refused create left an LV");

    // Fill the pool exactly, each create taking what GetCapacity offers
    // (thick: once; thin: until the promises reach size × ratio, the offer
    // being capped by the unwritten data space); one extent more does not fit.
    let mut fills = Vec::new();
    let mut offer = cap;
    while offer > 0 {
        let name = format!("fill-{}", fills.len());
        let fill = must("fill", f.create(sized(&name, offer, 0, fs_cap(""))).await);
        assert_eq!(fill.capacity_bytes, offer);
        fills.push(fill.volume_id);
        offer = d.capacity(None).await.available_capacity;
        assert_eq!(offer, f.expected_capacity());
        assert!(fills.len() <= 3, "GetCapacity never reached 0: {offer}");
    }
    assert_eq!(f.promise_room(), 0);
    let names = f.lv_names();
    must_fail(
        "one extent more",
        f.create(sized("more", extent, 0, fs_cap(""))).await,
        Code::ResourceExhausted,
    );
    assert_eq!(f.lv_names(), names, "a refused create left an LV");
    if kind == Kind::Thick {
        let (_, free, _) = f.vg.vg_sizes();
        assert!(free >= RESERVE, "the reserve was handed out: {free} free");
    }
    for id in &fills {
        d.delete(id).await;
    }
    f.wait_for_wipes().await;
    assert_eq!(d.capacity(None).await.available_capacity, cap);

    // Concurrent creates never overcommit: 6 at once, room for 3.
    let room = f.promise_room();
    let size = (room * 2 / 7 + extent - 1) / extent * extent;
    let fit = (room / size) as usize;
    assert_eq!(fit, 3);
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let mut c = d.controller();
            let req = sized(&format!("c-{i}"), size, 0, fs_cap(""));
            tokio::spawn(async move { c.create_volume(req).await })
        })
        .collect();
    let mut created = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(_) => created += 1,
            Err(s) => assert_eq!(s.code(), Code::ResourceExhausted, "{}", s.message()),
        }
    }
    assert_eq!(created, fit, "{created} of 6 creates succeeded; {fit} fit");
    let ours: Vec<LvRow> =
        f.vg.lvs()
            .into_iter()
            .filter(|l| l.tags.iter().any(|t| t == "localvol"))
            .collect();
    assert_eq!(ours.len(), fit, "{ours:?}");
    let promised: i64 = ours.iter().map(|l| l.size).sum();
    assert!(promised <= room, "overcommitted: {promised} > {room}");
    assert_eq!(f.promise_room(), room - promised);
    assert_eq!(
        d.capacity(None).await.available_capacity,
        f.expected_capacity()
    );
    if kind == Kind::Thick {
        let (_, free, _) = f.vg.vg_sizes();
        assert!(free >= RESERVE, "the reserve was handed out: {free} free");
    }
}

// ---------------------------------------------------------------------------
// 8. Delete while in use
// ---------------------------------------------------------------------------

async fn delete_while_in_use(kind: Kind) {
    require_root();
    let f = Fx::new(kind).await;
    let d = &f.d;
    let mut c = d.controller();
    let del = |id: &str| csi::DeleteVolumeRequest {
        volume_id: id.to_owned(),
        ..Default::default()
    };

    let v = d.create("busy", 16 * MI).await;
    let id = v.volume_id.as_str();
    let staging = d.staging_path("busy");
    let target = d.target_path("busy");
    d.stage(id, &staging).await;
    write_file(&staging, "data", b"in use").unwrap();
    let r = c.delete_volume(del(id)).await;
    assert_code("Delete while staged", r, Code::FailedPrecondition);
    assert!(f.lv(id).is_some(), "the LV of a staged volume was removed");
    d.publish(id, &staging, &target, false).await;
    let r = c.delete_volume(del(id)).await;
    assert_code("Delete while published", r, Code::FailedPrecondition);
    assert_file(&target, "data", b"in use");
    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
    d.delete(id).await;
    f.assert_lv_gone(id);

    // A raw block volume: bound at a target, or held open by a process.
    let v = must(
        "create block",
        f.create(sized("busy-blk", 16 * MI, 0, blk())).await,
    );
    let id = v.volume_id.as_str();
    let target = d.target_path("busy-blk");
    must(
        "publish block",
        publish_cap(d, id, &d.staging_path("busy-blk"), &target, blk()).await,
    );
    let r = c.delete_volume(del(id)).await;
    assert_code(
        "Delete of a published block volume",
        r,
        Code::FailedPrecondition,
    );
    assert!(
        f.lv(id).is_some(),
        "the LV of a published block volume was removed"
    );
    d.unpublish(id, &target).await;
    let held = fs::File::open(f.dev(id)).unwrap();
    let r = c.delete_volume(del(id)).await;
    assert_code(
        "Delete of an open block volume",
        r,
        Code::FailedPrecondition,
    );
    assert!(f.lv(id).is_some());
    drop(held);
    d.delete(id).await;
    f.assert_lv_gone(id);
}

// ---------------------------------------------------------------------------
// Honest thin capacity (issue 14, item 3)
// ---------------------------------------------------------------------------

/// A thin pool filled to ~85% by writes into a thin volume: GetCapacity
/// drops from what may still be promised to the unwritten data space less
/// the reserve (the exact formula, from `lvs` figures taken after the
/// writes); `/metrics` shows lvm's own Data% and Metadata%; the volume's
/// condition turns abnormal at the pool's `thinFullPercent` (80 here), not
/// before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn thin_capacity_follows_the_data_written() {
    require_root();
    const TP: u64 = 128 << 20;
    const RES: i64 = 8 * MI;
    const RATIO: f64 = 2.0;
    let vg = LoopVg::create(512 << 20, Some(TP));
    let pool = LvmPoolOpts::new("thin", &vg.vg)
        .thin_pool("tp")
        .overprovision_ratio(RATIO)
        .reserve("8Mi")
        .thin_full_percent(80.0);
    let port = free_port();
    let opts = DriverOpts {
        metrics_addr: Some(format!("127.0.0.1:{port}")),
        ..DriverOpts::with_lvm_pools(vec![pool])
    };
    let f = Fx::serve(Kind::Thin, "thin", vg, opts).await;
    let d = &f.d;
    let (_, _, extent) = f.vg.vg_sizes();

    // Empty: the data space less the reserve is the smaller term.
    let cap0 = d.capacity(None).await.available_capacity;
    let (offer0, promise0) = thin_offer(&f.vg, RATIO, RES, extent);
    assert_eq!(cap0, offer0);
    assert_eq!(cap0, (TP as i64 - RES) / extent * extent);
    assert!(promise0 > cap0, "{promise0} {cap0}");

    // One thin volume of the pool's whole size, published raw, 85% written.
    let v = must("create", f.create(sized("big", TP as i64, 0, blk())).await);
    let id = v.volume_id.as_str();
    let (staging, target) = (d.staging_path("big"), d.target_path("big"));
    must(
        "publish",
        publish_cap(d, id, &staging, &target, blk()).await,
    );
    let stats = || {
        let req = stats_req(id, &target);
        let mut n = d.node();
        async move { ok("stats", n.node_get_volume_stats(req).await) }
    };
    let (abnormal, msg) = condition(&stats().await);
    assert!(!abnormal, "empty pool: {msg}");
    let mib = (TP * 85 / 100) >> 20;
    run_cmd(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={}", f.dev(id).display()),
            "bs=1M",
            &format!("count={mib}"),
            "oflag=direct",
            "conv=fsync,notrunc",
            "status=none",
        ],
    );
    let tp = f.vg.lv("tp").expect("thin pool tp");
    let data = tp.data_percent.expect("the thin pool's Data%");
    assert!((80.0..90.0).contains(&data), "Data% {data} after {mib} MiB");

    // GetCapacity: exactly the formula on lvs's figures, now the data term.
    let cap1 = d.capacity(None).await.available_capacity;
    let (offer1, promise1) = thin_offer(&f.vg, RATIO, RES, extent);
    assert_eq!(cap1, offer1, "GetCapacity at Data% {data}");
    let by_data = (TP as i64 - (TP as f64 * data / 100.0) as i64 - RES) / extent * extent;
    assert_eq!(cap1, by_data);
    assert!(cap1 < cap0 && cap1 < promise1, "{cap1} {cap0} {promise1}");
    println!("thin pool at Data% {data}: GetCapacity {cap0} -> {cap1} (promise room {promise1})");

    // The gauges are lvm's own figures.
    let (status, body) = http_get(port, "/metrics").expect("GET /metrics");
    assert!(status.contains("200"), "{status}");
    let labels = r#"{pool="thin",backend="lvm-thin"}"#;
    let metadata = metadata_percent(&f.vg);
    assert_eq!(
        metric_value(&body, &format!("localvol_pool_thin_data_percent{labels}")),
        Some(data),
        "{body}"
    );
    assert_eq!(
        metric_value(
            &body,
            &format!("localvol_pool_thin_metadata_percent{labels}")
        ),
        Some(metadata),
        "{body}"
    );
    assert_eq!(
        metric_value(&body, &format!("localvol_pool_free_bytes{labels}")),
        Some(cap1 as f64)
    );

    // Past the configured threshold: abnormal, naming it. (The health
    // answer the condition does not use is cached; lvs is asked anew.)
    let (abnormal, msg) = condition(&stats().await);
    assert!(
        abnormal && msg.contains("nearly full") && msg.contains("threshold 80%"),
        "{msg}"
    );
    d.unpublish(id, &target).await;
    d.delete(id).await;
    assert_eq!(d.capacity(None).await.available_capacity, cap0);
}

/// The thin pool `tp`'s Metadata% as lvs prints it.
fn metadata_percent(vg: &LoopVg) -> f64 {
    let out = run_cmd(
        "lvm",
        &[
            "lvs",
            "--noheadings",
            "-o",
            "metadata_percent",
            &format!("{}/tp", vg.vg),
        ],
    );
    out.trim().parse().expect("metadata_percent")
}

// ---------------------------------------------------------------------------
// Node replaced vs node lost (issue 14, item 2)
// ---------------------------------------------------------------------------

/// A driver restarted on an existing VG, with `orphans: {mode: reclaim}` and
/// a lost record naming two of its volumes (their PVs deleted by the
/// node-loss controller), keeps those two and reclaims only the ordinary
/// orphan (`sanity_tests::replace`). The storage identity is the VG's UUID
/// as LVM reports it. Thick pool only: the decision does not depend on the
/// kind, and VM time is budgeted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn restarted_on_its_vg_keeps_volumes_a_lost_record_names() {
    let started = Instant::now();
    let vg = LoopVg::create(512 << 20, None);
    let opts = DriverOpts::with_lvm_pools(vec![LvmPoolOpts::new("thick", &vg.vg).reserve("64Mi")]);
    let out = sanity_tests::replace::kept_after_node_loss(opts, "thick").await;
    let uuid = Command::new("vgs")
        .args(["--noheadings", "-o", "vg_uuid", &vg.vg])
        .output()
        .unwrap();
    assert!(uuid.status.success(), "{uuid:?}");
    let uuid = String::from_utf8(uuid.stdout).unwrap();
    assert_eq!(out.storage, format!("lvm:{}", uuid.trim()));
    for id in &out.kept {
        assert!(vg.lv(&lv_name(id)).is_some(), "the LV of {id} is gone");
    }
    eprintln!(
        "restarted_on_its_vg_keeps_volumes_a_lost_record_names: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// An LVM pool whose volume group is not there when the driver starts (its
/// disk not attached yet, say) does not take the plugin down: the driver
/// serves, the dir pool beside it runs a lifecycle, the LVM pool offers no
/// capacity and refuses a new volume with RESOURCE_EXHAUSTED naming the VG.
/// Once the VG appears the pool opens without a restart and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn a_volume_group_missing_at_start_opens_when_it_appears() {
    require_root();
    let vg = LoopVg::create(256 << 20, None);
    let away = format!("{}away", vg.vg);
    run_cmd("lvm", &["vgrename", "-qq", &vg.vg, &away]);
    // Back under its own name when the test ends, so that LoopVg removes it.
    struct Back<'a>(&'a str, &'a str);
    impl Drop for Back<'_> {
        fn drop(&mut self) {
            let _ = Command::new("lvm")
                .args(["vgrename", "-qq", self.0, self.1])
                .status();
        }
    }
    let mut back = Some(Back(&away, &vg.vg));
    let d = Driver::start(DriverOpts {
        lvm_pools: vec![LvmPoolOpts::new("late", &vg.vg)],
        ..DriverOpts::default()
    })
    .await;
    let new_in_late = |name: &str| {
        let mut req = create_req(name);
        req.parameters = params(&[("pool", "late")]);
        req.capacity_range = Some(range(16 * MI, 0));
        let mut c = d.controller();
        async move { c.create_volume(req).await }
    };

    let s = must_fail(
        "a volume in a pool whose VG is missing",
        new_in_late("too-early").await,
        Code::ResourceExhausted,
    );
    assert!(
        s.message().contains("pool late is unusable") && s.message().contains(&vg.vg),
        "{s:?}"
    );
    assert_eq!(d.capacity(Some("late")).await.available_capacity, 0);
    let probe = must("Probe", d.identity().probe(csi::ProbeRequest {}).await);
    assert_eq!(probe.into_inner().ready, Some(true));
    let on_dir = d.create("on-the-dir-pool", 0).await;
    d.delete(&on_dir.volume_id).await;

    drop(back.take());
    let start = Instant::now();
    let vol = loop {
        match new_in_late("after-the-vg-came").await {
            Ok(r) => break r.into_inner().volume.expect("a volume"),
            Err(s) if start.elapsed() < Duration::from_secs(60) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => panic!(
                "the pool did not open within 60 s of its VG: {s:?}\n{}",
                d.log_tail(30)
            ),
        }
    };
    assert!(d.capacity(Some("late")).await.available_capacity > 0);
    assert!(
        vg.lvs()
            .iter()
            .any(|lv| vol.volume_id.ends_with(&lv.name[3..])),
        "the volume is an LV of {}: {:?}",
        vg.vg,
        vg.lvs()
    );
    d.delete(&vol.volume_id).await;
    assert!(
        d.log_tail(200).contains("pool opened"),
        "{}",
        d.log_tail(30)
    );
}
