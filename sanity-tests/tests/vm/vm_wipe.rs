//! Deleted data never resurfaces (thick LVM pools), in a real kernel.
//!
//! A thick pool's DeleteVolume tags the LV `localvol.deleted` and returns;
//! the driver renames it to `wp-...`, zeroes it in the background and only
//! then removes it, so the
//! extents a new LV gets read as zeroes. Each test writes a known pattern
//! (no zero byte in it) where a deleted volume was, then makes new raw block
//! volumes until they hold the very extents the deleted one had (checked
//! with `lvs -o seg_pe_ranges`), and reads every byte of them. Also: a thick
//! restore larger than its snapshot, a deleted copy-on-write snapshot, a
//! wipe cut short by `kill -9` and resumed, and thin pools that do not zero
//! new blocks refused. `#[ignore]`d outside the VM (`make test-vm`).

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

use localvol::csi;
use sanity_tests::LvmFx as Fx;
use sanity_tests::LvmKind as Kind;
use sanity_tests::*;
use tonic::Code;

fn block_req(name: &str, bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(range(bytes, 0)),
        volume_capabilities: vec![blk()],
        ..Default::default()
    }
}

/// `len` bytes of a pattern with no zero byte, different per `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i.wrapping_mul(31) + seed as usize) % 255 + 1) as u8)
        .collect()
}

/// The first non-zero byte of `len` bytes from `offset` of `dev`, read in
/// 1 MiB pieces: (its offset, the byte).
fn first_nonzero(dev: &Path, offset: u64, len: u64) -> Option<(u64, u8)> {
    let mut f = fs::File::open(dev).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0u8; MI as usize];
    let mut at = offset;
    while at < offset + len {
        let n = buf.len().min((offset + len - at) as usize);
        f.read_exact(&mut buf[..n]).unwrap();
        if let Some(i) = buf[..n].iter().position(|&b| b != 0) {
            return Some((at + i as u64, buf[i]));
        }
        at += n as u64;
    }
    None
}

/// The physical extents an LV occupies (`seg_pe_ranges`: `PV:first-last`
/// per segment), as (PV, extent) pairs.
fn extents(vg: &str, lv: &str) -> BTreeSet<(String, u64)> {
    let out = run_cmd(
        "lvm",
        &[
            "lvs",
            "--noheadings",
            "-o",
            "seg_pe_ranges",
            &format!("{vg}/{lv}"),
        ],
    );
    let mut set = BTreeSet::new();
    for range in out.split_whitespace() {
        let (pv, span) = range
            .rsplit_once(':')
            .unwrap_or_else(|| panic!("seg_pe_ranges {range:?}"));
        let (a, b) = span.split_once('-').unwrap_or((span, span));
        let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
        set.extend((a..=b).map(|e| (pv.to_owned(), e)));
    }
    assert!(!set.is_empty(), "no extents for {vg}/{lv}: {out:?}");
    set
}

/// Writes `data` through the volume published as a raw block device (the
/// path a pod uses), then unpublishes and unstages it.
async fn write_through_target(f: &Fx, id: &str, tag: &str, data: &[u8]) {
    let d = &f.d;
    let staging = d.staging_path(tag);
    let target = d.target_path(tag);
    let mut stage = stage_req(id, &staging);
    stage.volume_capability = Some(blk());
    must("stage", d.node().node_stage_volume(stage).await);
    let mut publish = publish_req(id, &staging, &target, false);
    publish.volume_capability = Some(blk());
    must("publish", d.node().node_publish_volume(publish).await);
    write_at(&target, 0, data);
    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
}

/// Creates raw block volumes of `extents` extents (`<prefix>-N`) until they
/// hold every one of `wanted` (panics when the pool fills first), and checks
/// every byte of each reads zero. Returns their ids. (LVM puts a new LV in
/// the first free area it fits in whole: size them to fit the gap.)
async fn reuse_and_read(
    f: &Fx,
    prefix: &str,
    wanted: &BTreeSet<(String, u64)>,
    extents_each: i64,
) -> Vec<String> {
    let mut held = BTreeSet::new();
    let mut ids = Vec::new();
    while !wanted.is_subset(&held) {
        let name = format!("{prefix}-{}", ids.len());
        let v = match f.create(block_req(&name, extents_each * Fx::EXTENT)).await {
            Ok(v) => v,
            Err(s) => panic!(
                "{name}: {s:?}; the pool filled before new volumes held the deleted extents \
                 (held {held:?}, wanted {wanted:?})"
            ),
        };
        let lv = lv_name(&v.volume_id);
        held.extend(extents(&f.vg.vg, &lv));
        ids.push(v.volume_id);
    }
    drop_caches();
    for id in &ids {
        let dev = f.vg.dev_path(&lv_name(id));
        if let Some((at, b)) = first_nonzero(&dev, 0, (extents_each * Fx::EXTENT) as u64) {
            panic!("{id} reads {b:#04x} at byte {at}: a deleted volume's data resurfaced");
        }
    }
    ids
}

async fn delete_all(f: &Fx, ids: &[String]) {
    for id in ids {
        f.d.delete(id).await;
    }
    f.wait_for_wipes().await;
}

/// A thick pool on a small VG (79 extents of 4 MiB, 63 offered), so new
/// volumes soon land on the extents deleted ones had.
async fn small_thick(change: impl FnOnce(LvmPoolOpts) -> LvmPoolOpts) -> Fx {
    Fx::start(Kind::Thick, 320 << 20, 0, change).await
}

// ---------------------------------------------------------------------------
// 1. A raw block volume's data, after DeleteVolume
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn deleted_block_data_never_resurfaces() {
    require_root();
    let f = small_thick(|o| o).await;
    let d = &f.d;
    let size = 16 * Fx::EXTENT;
    let v = must("create", f.create(block_req("tenant-a", size)).await);
    let id = v.volume_id.clone();
    let dev = f.vg.dev_path(&lv_name(&id));
    let data = pattern(7, size as usize);
    write_through_target(&f, &id, "tenant-a", &data).await;
    drop_caches();
    assert!(
        read_at(&dev, (size - MI) as u64, MI as usize) == data[(size - MI) as usize..],
        "the pattern did not reach the LV"
    );
    let old = extents(&f.vg.vg, &lv_name(&id));

    d.delete(&id).await;
    // Gone for CSI at once, whether or not the wipe has ended (its LV
    // tagged deleted, or renamed by the wiper already).
    f.assert_lv_gone(&id);
    assert!(d.list_all().await.iter().all(|v| v.volume_id != id));
    d.delete(&id).await;
    f.wait_for_wipes().await;

    let ids = reuse_and_read(&f, "tenant-b", &old, 4).await;
    delete_all(&f, &ids).await;
    assert_eq!(f.lv_names(), Vec::<String>::new(), "LVs left behind");
}

// ---------------------------------------------------------------------------
// 2. A thick restore larger than its snapshot; a deleted COW snapshot
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn restore_beyond_its_snapshot_and_deleted_snapshots_read_zeroes() {
    require_root();
    let f = small_thick(|o| o).await;
    let d = &f.d;

    // A tenant's data on the first 12 extents, deleted.
    let dirty = must(
        "create",
        f.create(block_req("dirty", 12 * Fx::EXTENT)).await,
    );
    let dirty_dev = f.vg.dev_path(&lv_name(&dirty.volume_id));
    write_at(&dirty_dev, 0, &pattern(11, (12 * Fx::EXTENT) as usize));
    let dirty_extents = extents(&f.vg.vg, &lv_name(&dirty.volume_id));
    d.delete(&dirty.volume_id).await;
    f.wait_for_wipes().await;

    // A 2-extent source with a snapshot; then half of it is overwritten, so
    // the snapshot's copy-on-write area holds the source's old data.
    let src = must("create", f.create(block_req("src", 2 * Fx::EXTENT)).await);
    let src_dev = f.vg.dev_path(&lv_name(&src.volume_id));
    let before = pattern(23, (2 * Fx::EXTENT) as usize);
    write_at(&src_dev, 0, &before);
    let snap = must(
        "snapshot",
        d.controller()
            .create_snapshot(csi::CreateSnapshotRequest {
                name: "src-snap".into(),
                source_volume_id: src.volume_id.clone(),
                parameters: params(&[("snapshotSize", "8Mi")]),
                ..Default::default()
            })
            .await,
    )
    .into_inner()
    .snapshot
    .unwrap();
    write_at(&src_dev, 0, &pattern(31, Fx::EXTENT as usize));
    let snap_lv = format!("sn-{}", snap.snapshot_id.rsplit_once('.').unwrap().1);
    let cow_extents = extents(&f.vg.vg, &snap_lv);

    // Restored into 10 extents: the snapshot's 2, then 8 that must read
    // zero, on extents the deleted volume had.
    use csi::volume_content_source::{SnapshotSource, Type};
    let mut req = block_req("restored", 10 * Fx::EXTENT);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: snap.snapshot_id.clone(),
        })),
    });
    let restored = must("restore", f.create(req).await);
    let r_lv = lv_name(&restored.volume_id);
    let r_dev = f.vg.dev_path(&r_lv);
    let reused: Vec<_> = extents(&f.vg.vg, &r_lv)
        .intersection(&dirty_extents)
        .cloned()
        .collect();
    assert!(
        reused.len() >= 4,
        "the restore got too few of the deleted volume's extents to show anything: {reused:?}"
    );
    drop_caches();
    assert!(
        read_at(&r_dev, 0, before.len()) == before,
        "the restore does not hold the snapshot's data"
    );
    if let Some((at, b)) = first_nonzero(&r_dev, (2 * Fx::EXTENT) as u64, (8 * Fx::EXTENT) as u64) {
        panic!("the restore reads {b:#04x} at byte {at}, beyond its snapshot's data");
    }

    // The snapshot deleted: its copy-on-write extents are wiped too.
    must(
        "delete snapshot",
        d.controller()
            .delete_snapshot(csi::DeleteSnapshotRequest {
                snapshot_id: snap.snapshot_id.clone(),
                ..Default::default()
            })
            .await,
    );
    assert!(
        f.vg.lv(&snap_lv).is_none(),
        "the snapshot's LV kept its name"
    );
    f.wait_for_wipes().await;
    let ids = reuse_and_read(&f, "after-snap", &cow_extents, 1).await;

    delete_all(&f, &ids).await;
    for id in [&restored.volume_id, &src.volume_id] {
        d.delete(id).await;
    }
    f.wait_for_wipes().await;
    assert_eq!(f.lv_names(), Vec::<String>::new(), "LVs left behind");
}

// ---------------------------------------------------------------------------
// 3. kill -9 in the middle of a wipe
// ---------------------------------------------------------------------------

/// Throttled to 1 MiB/s (`wipeRateLimit`), a 32 MiB wipe lasts about 32 s:
/// long enough to look at it and kill the driver in the middle, even on a
/// loaded host. The next driver runs unthrottled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn a_wipe_cut_short_by_kill_9_resumes_after_restart() {
    require_root();
    let mut f = small_thick(|o| o.wipe_rate_limit("1Mi")).await;
    let size = 8 * Fx::EXTENT;
    let v = must("create", f.create(block_req("victim", size)).await);
    let id = v.volume_id.clone();
    let lv = lv_name(&id);
    write_at(&f.vg.dev_path(&lv), 0, &pattern(5, size as usize));
    let old = extents(&f.vg.vg, &lv);
    let before = f.d.capacity(None).await.available_capacity;

    f.d.delete(&id).await;
    // The delete tagged it; the wiper renames it as it starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    let wiping = loop {
        let wiping = f.wiping_lvs();
        if wiping.iter().all(|l| l.name.starts_with("wp-")) {
            break wiping;
        }
        assert!(
            Instant::now() < deadline,
            "the wiper did not rename {wiping:?}; log:\n{}",
            f.d.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(wiping.len(), 1, "one LV being wiped: {wiping:?}");
    let wp = wiping[0].name.clone();
    assert!(wp.starts_with(&format!("wp-{}", &lv[3..])), "{wp}");
    assert_eq!(wiping[0].size, size);

    // While it is wiped: not listed, its space not offered, its id free.
    assert!(f.d.list_all().await.iter().all(|v| v.volume_id != id));
    let during = f.d.capacity(None).await.available_capacity;
    f.d.delete(&id).await;
    let again = must("create again", f.create(block_req("victim", size)).await);
    assert_eq!(again.volume_id, id, "ids come from names");
    assert!(
        f.vg.lv(&wp).is_some(),
        "the wipe ended before the checks; they prove nothing"
    );
    assert_eq!(
        during, before,
        "GetCapacity offered space still being wiped"
    );
    assert!(
        extents(&f.vg.vg, &lv).is_disjoint(&old),
        "the new volume got extents still being wiped"
    );
    f.d.delete(&id).await;

    // Mid-wipe: its start zeroed, its end still the pattern.
    let wp_dev = f.vg.dev_path(&wp);
    let tail = (size - MI) as u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        drop_caches();
        assert!(
            f.vg.lv(&wp).is_some(),
            "the wipe ended before it was caught in the middle"
        );
        let head_zero = first_nonzero(&wp_dev, 0, MI as u64).is_none();
        if head_zero {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the wipe did not start; log:\n{}",
            f.d.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    f.d.kill9();
    drop_caches();
    assert!(f.vg.lv(&wp).is_some(), "the wipe finished before the kill");
    assert!(
        first_nonzero(&wp_dev, tail, MI as u64).is_some(),
        "the wipe finished before the kill"
    );

    // The next driver finishes it (and the second delete's), unthrottled.
    f.d.opts_mut().lvm_pools[0].wipe_rate_limit = None;
    f.d.start_again_retrying().await;
    f.wait_for_wipes().await;
    assert!(f.d.list_all().await.is_empty());
    let ids = reuse_and_read(&f, "next-tenant", &old, 4).await;
    delete_all(&f, &ids).await;
    assert_eq!(f.lv_names(), Vec::<String>::new(), "LVs left behind");
}

// ---------------------------------------------------------------------------
// 4. A deleted volume the wiper has not renamed yet
// ---------------------------------------------------------------------------

/// DeleteVolume's one `lvchange` tags the LV `localvol.deleted`; the wiper
/// renames it to `wp-…` when it gets to it. In between (made here by hand,
/// with the wiper asleep) the volume is gone for every RPC: not listed, a
/// repeated delete succeeds, NodeStage is NOT_FOUND, and a create of the
/// same name hands the old LV to the wiper and makes a new one; the old
/// LVs' extents read zeroes when new volumes get them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn a_deleted_volume_not_yet_renamed_is_gone() {
    require_root();
    let f = small_thick(|o| o).await;
    let size = 8 * Fx::EXTENT;
    let old_ids: Vec<String> = {
        let mut ids = Vec::new();
        for name in ["tagged", "staged"] {
            let v = must("create", f.create(block_req(name, size)).await);
            write_at(
                &f.vg.dev_path(&lv_name(&v.volume_id)),
                0,
                &pattern(7, size as usize),
            );
            ids.push(v.volume_id);
        }
        ids
    };
    let mut old = BTreeSet::new();
    for id in &old_ids {
        let lv = lv_name(id);
        old.extend(extents(&f.vg.vg, &lv));
        run_cmd(
            "lvm",
            &[
                "lvchange",
                "-qq",
                "--addtag",
                TAG_DELETED,
                &format!("{}/{lv}", f.vg.vg),
            ],
        );
    }
    let (tagged, staged) = (&old_ids[0], &old_ids[1]);
    let still = |id: &str| {
        f.vg.lv(&lv_name(id))
            .is_some_and(|l| l.tags.iter().any(|t| t == TAG_DELETED))
    };
    assert!(
        still(tagged) && still(staged),
        "the wiper renamed a tagged LV nobody announced; the window is not tested"
    );
    let listed: Vec<String> = f.d.list_ids().await;
    assert!(listed.is_empty(), "tagged deleted, yet listed: {listed:?}");
    let staging = f.d.staging_path("staged");
    let r =
        f.d.node()
            .node_stage_volume(stage_req(staged, &staging))
            .await;
    must_fail("NodeStage of a deleted volume", r, Code::NotFound);
    assert!(
        still(tagged),
        "the wiper renamed the other tagged LV already; the create is not tested"
    );
    f.d.delete(tagged).await;
    let again = must("create again", f.create(block_req("tagged", size)).await);
    assert_eq!(&again.volume_id, tagged, "ids come from names");
    let lv = f.vg.lv(&lv_name(tagged)).expect("the new volume's LV");
    assert!(
        !lv.tags.iter().any(|t| t == TAG_DELETED),
        "the create answered the deleted LV: {lv:?}"
    );
    f.d.delete(tagged).await;
    f.wait_for_wipes().await;
    assert!(f.d.list_all().await.is_empty());
    let ids = reuse_and_read(&f, "next-tenant", &old, 4).await;
    delete_all(&f, &ids).await;
    assert_eq!(f.lv_names(), Vec::<String>::new(), "LVs left behind");
}

// ---------------------------------------------------------------------------
// 5. Thin pools must zero the blocks they provision
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn a_thin_pool_that_does_not_zero_is_refused() {
    require_root();
    let vg = LoopVg::create(Fx::VG_BYTES, Some(256 << 20));
    run_cmd(
        "lvm",
        &["lvchange", "-qq", "--zero", "n", &format!("{}/tp", vg.vg)],
    );
    let opts = LvmPoolOpts::new("thin", &vg.vg)
        .thin_pool("tp")
        .reserve("64Mi");
    // The driver serves; the pool does not open, and says why.
    let d = Driver::start(DriverOpts::with_lvm_pools(vec![opts])).await;
    let new_vol = || {
        let mut req = create_req("after-zero-on");
        req.capacity_range = Some(range(16 * MI, 0));
        let mut c = d.controller();
        async move { c.create_volume(req).await }
    };
    let s = must_fail(
        "a volume in a thin pool that does not zero",
        new_vol().await,
        Code::ResourceExhausted,
    );
    assert!(
        s.message()
            .contains("does not zero newly provisioned blocks")
            && s.message().contains("--zero y"),
        "{s:?}"
    );
    assert_eq!(d.capacity(None).await.available_capacity, 0);
    // Zeroing on: the pool opens without a restart.
    run_cmd(
        "lvm",
        &["lvchange", "-qq", "--zero", "y", &format!("{}/tp", vg.vg)],
    );
    let start = Instant::now();
    loop {
        match new_vol().await {
            Ok(_) => break,
            Err(s) if start.elapsed() < Duration::from_secs(60) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => panic!("the pool did not open within 60 s of zeroing on: {s:?}"),
        }
    }
}

// ---------------------------------------------------------------------------
// 6. A deleted volume an lvrename killed mid-run left without its device
// ---------------------------------------------------------------------------

/// The wiper renames a deleted LV to `wp-…` before it zeroes it; an
/// lvrename killed mid-run (a container's death kills it with the driver)
/// can leave the new name without `/dev` nodes, or the device still under
/// its old name (the kill campaign met the first: "opening /dev/VG/wp-…:
/// No such file or directory", retried forever). Both made by hand with the
/// driver down; started again, the driver zeroes and removes both, and its
/// log says it made the missing nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn a_wipe_whose_lvrename_was_cut_short_finishes() {
    require_root();
    let mut f = small_thick(|o| o).await;
    let size = 8 * Fx::EXTENT;
    let mut ids = Vec::new();
    for name in ["no-nodes", "old-name"] {
        let v = must("create", f.create(block_req(name, size)).await);
        let dev = f.vg.dev_path(&lv_name(&v.volume_id));
        write_at(&dev, 0, &pattern(9, size as usize));
        ids.push(v.volume_id);
    }
    f.d.kill9();
    let vg = f.vg.vg.clone();
    let dm = |lv: &str| f.vg.dm_name(lv);
    for (i, id) in ids.iter().enumerate() {
        let old = lv_name(id);
        let new = format!("wp-{}-{i:x}", old.trim_start_matches("lv-"));
        let lv = format!("{vg}/{old}");
        run_cmd("lvm", &["lvchange", "-qq", "--addtag", TAG_DELETED, &lv]);
        run_cmd("lvm", &["lvrename", "-qq", &vg, &old, &new]);
        if i == 1 {
            // Metadata committed, the device not renamed yet.
            run_cmd("dmsetup", &["rename", &dm(&new), &dm(&old)]);
        }
        for p in [
            f.vg.dev_path(&new),
            format!("/dev/mapper/{}", dm(&new)).into(),
        ] {
            let _ = fs::remove_file(&p);
        }
        assert!(
            !f.vg.dev_path(&new).exists(),
            "made by hand: no node for {new}"
        );
    }
    f.d.start_again_retrying().await;
    f.wait_for_wipes().await;
    let left = f.lv_names();
    assert!(left.is_empty(), "LVs left after the wipes: {left:?}");
    let log = fs::read_to_string(f.d.log_path()).unwrap();
    assert!(
        log.matches("an active LV has no device node").count() >= 2,
        "the driver's log should say it made the missing nodes of both"
    );
    let names = run_cmd("dmsetup", &["ls"]);
    assert!(
        !names.contains(&dm("lv-")) && !names.contains(&dm("wp-")),
        "device-mapper devices left: {names}"
    );
}
