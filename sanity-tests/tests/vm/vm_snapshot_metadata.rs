//! Changed-block tracking (CSI SnapshotMetadata) of thin LVM snapshots in a
//! real kernel, through the real driver over CSI: a raw block volume gets a
//! known pattern, is snapshotted, gets known chunks changed (overwritten,
//! added, discarded) and is snapshotted again; GetMetadataAllocated must
//! name exactly the written ranges and GetMetadataDelta exactly the changed
//! ones. Streams cut off are resumed from `starting_offset`; a driver killed
//! mid-stream leaves the thin pool's one metadata snapshot held, and its
//! next start releases it. After every test the pool holds no metadata
//! snapshot (its `thin-pool` status, read with `dmsetup status`).
//!
//! Every test is `#[ignore]`d on the host (no device-mapper) and run by
//! `make test-vm VM_TESTS=vm_snapshot_metadata` in the qemu guest.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use localvol::csi;
use localvol::csi::snapshot_metadata_client::SnapshotMetadataClient;
use sanity_tests::LvmFx as Fx;
use sanity_tests::LvmKind as Kind;
use sanity_tests::*;
use tonic::transport::Channel;
use tonic::{Code, Status};

const KEY: &str = "0123456789abcdef0123456789abcdef";
const U: u64 = MI as u64;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

async fn client(f: &Fx) -> SnapshotMetadataClient<Channel> {
    SnapshotMetadataClient::new(f.d.endpoint.connect().await.expect("connecting"))
}

/// A client whose HTTP/2 windows are 1 KiB: a stream it stops reading
/// stops the driver after a few messages (with the usual windows of
/// megabytes the driver would send a whole small map and finish).
async fn slow_client(f: &Fx) -> SnapshotMetadataClient<Channel> {
    let path = f.d.socket_path();
    let ch = tonic::transport::Endpoint::try_from("http://[::1]:50051")
        .unwrap()
        .initial_stream_window_size(1024)
        .initial_connection_window_size(1024)
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .expect("connecting");
    SnapshotMetadataClient::new(ch)
}

fn block() -> csi::VolumeCapability {
    block_cap(AccessMode::SingleNodeWriter)
}

/// A thin raw block volume of `bytes`, encrypted or not, staged (with the
/// key when encrypted) and published: its id and the published device.
async fn block_volume(f: &Fx, name: &str, bytes: i64, encrypted: bool) -> (String, PathBuf) {
    let mut req = csi::CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(range(bytes, 0)),
        volume_capabilities: vec![block()],
        ..Default::default()
    };
    if encrypted {
        req.parameters = params(&[("encryption", "luks2")]);
    }
    let vol = must("create", f.create(req).await);
    let staging = f.d.staging_path(name);
    let mut stage = stage_req(&vol.volume_id, &staging);
    stage.volume_capability = Some(block());
    if encrypted {
        stage.secrets = params(&[("encryptionKey", KEY)]);
    }
    ok("stage", f.d.node().node_stage_volume(stage).await);
    let target = f.d.target_path(name);
    let mut publish = publish_req(&vol.volume_id, &staging, &target, false);
    publish.volume_capability = Some(block());
    ok("publish", f.d.node().node_publish_volume(publish).await);
    (vol.volume_id, target)
}

async fn snapshot(f: &Fx, name: &str, source: &str) -> String {
    let r = ok(
        "snapshot",
        f.d.controller()
            .create_snapshot(csi::CreateSnapshotRequest {
                name: name.to_owned(),
                source_volume_id: source.to_owned(),
                ..Default::default()
            })
            .await,
    );
    r.snapshot.expect("a snapshot").snapshot_id
}

/// Deterministic bytes, different per seed.
fn pattern(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len as usize + 8);
    while (out.len() as u64) < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len as usize);
    out
}

/// Writes each `(offset, length)` range with fresh bytes, and syncs.
fn write_ranges(dev: &Path, ranges: &[(u64, u64)], seed: u64) {
    for (i, (off, len)) in ranges.iter().enumerate() {
        write_at(dev, *off, &pattern(seed + i as u64, *len));
    }
}

/// Adjacent ranges merged: the form the answers come in (variable-length
/// runs of whole chunks).
fn merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (o, l) in ranges {
        match out.last_mut() {
            Some((po, pl)) if *po + *pl == o => *pl += l,
            _ => out.push((o, l)),
        }
    }
    out
}

/// One answer read whole: its capacity, its tuples, how many messages.
struct Answer {
    capacity: i64,
    tuples: Vec<(u64, u64)>,
    messages: usize,
}

/// Reads a stream of block-metadata messages to its end (or `limit`
/// messages, then drops it: a client that goes away), checking that every
/// message says VARIABLE_LENGTH and the same capacity, and that the
/// tuples go strictly up.
async fn read_stream<T>(
    mut s: tonic::Streaming<T>,
    limit: Option<usize>,
    parts: impl Fn(&T) -> (i32, i64, Vec<(u64, u64)>),
) -> Result<Answer, Status> {
    let mut a = Answer {
        capacity: -1,
        tuples: Vec::new(),
        messages: 0,
    };
    while let Some(m) = s.message().await? {
        let (ty, cap, tuples) = parts(&m);
        assert_eq!(ty, csi::BlockMetadataType::VariableLength as i32);
        assert!(
            a.capacity == -1 || a.capacity == cap,
            "capacity changed mid-stream"
        );
        a.capacity = cap;
        for t in tuples {
            if let Some((o, l)) = a.tuples.last() {
                assert!(
                    t.0 > o + l,
                    "tuples not strictly increasing and apart: {o}+{l} then {t:?}"
                );
            }
            assert!(t.1 > 0, "an empty tuple: {t:?}");
            a.tuples.push(t);
        }
        a.messages += 1;
        if limit.is_some_and(|n| a.messages >= n) {
            break;
        }
    }
    Ok(a)
}

fn tuples(b: &[csi::BlockMetadata]) -> Vec<(u64, u64)> {
    b.iter()
        .map(|t| (t.byte_offset as u64, t.size_bytes as u64))
        .collect()
}

async fn allocated(
    c: &mut SnapshotMetadataClient<Channel>,
    snap: &str,
    start: u64,
    max: i32,
    limit: Option<usize>,
) -> Result<Answer, Status> {
    let s = c
        .get_metadata_allocated(csi::GetMetadataAllocatedRequest {
            snapshot_id: snap.to_owned(),
            starting_offset: start as i64,
            max_results: max,
            ..Default::default()
        })
        .await?
        .into_inner();
    read_stream(s, limit, |m: &csi::GetMetadataAllocatedResponse| {
        (
            m.block_metadata_type,
            m.volume_capacity_bytes,
            tuples(&m.block_metadata),
        )
    })
    .await
}

async fn delta(
    c: &mut SnapshotMetadataClient<Channel>,
    base: &str,
    target: &str,
    start: u64,
    max: i32,
) -> Result<Answer, Status> {
    let s = c
        .get_metadata_delta(csi::GetMetadataDeltaRequest {
            base_snapshot_id: base.to_owned(),
            target_snapshot_id: target.to_owned(),
            starting_offset: start as i64,
            max_results: max,
            ..Default::default()
        })
        .await?
        .into_inner();
    read_stream(s, None, |m: &csi::GetMetadataDeltaResponse| {
        (
            m.block_metadata_type,
            m.volume_capacity_bytes,
            tuples(&m.block_metadata),
        )
    })
    .await
}

/// The thin pool's `thin-pool` status fields (`dmsetup status` of
/// `<vg>-tp-tpool`, or `<vg>-tp` while no thin volume is active; None: the
/// pool is not active).
fn pool_status(f: &Fx) -> Option<Vec<String>> {
    for name in [format!("{}-tp-tpool", f.vg.vg), format!("{}-tp", f.vg.vg)] {
        let out = std::process::Command::new("dmsetup")
            .args(["status", &name])
            .output()
            .expect("running dmsetup");
        let line = String::from_utf8_lossy(&out.stdout).into_owned();
        if let Some(rest) = line.split_once(" thin-pool ") {
            return Some(rest.1.split_whitespace().map(str::to_owned).collect());
        }
    }
    None
}

/// The metadata snapshot the pool holds (its block), if any (an inactive
/// pool holds none).
fn held_metadata_snapshot(f: &Fx) -> Option<String> {
    let st = pool_status(f)?;
    (st[3] != "-").then(|| st[3].clone())
}

/// The pool holds no metadata snapshot (within a few seconds: a stream a
/// client dropped is released by a task of the driver's).
async fn assert_none_held(f: &Fx) {
    let start = Instant::now();
    while let Some(root) = held_metadata_snapshot(f) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the thin pool still holds a metadata snapshot (block {root})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The thin pool's chunk size, in bytes.
fn chunk_size(f: &Fx) -> u64 {
    run_cmd(
        "lvm",
        &[
            "lvs",
            "--noheadings",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            "chunk_size",
            &format!("{}/tp", f.vg.vg),
        ],
    )
    .trim()
    .parse()
    .expect("a chunk size")
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/// The pattern of [`maps_name_exactly_the_written_and_the_changed_chunks`]:
/// the start, 5 MiB, 20-22 MiB and the last MiB of a 64 MiB volume.
const SIZE: u64 = 64 * U;
const WRITTEN: [(u64, u64); 4] = [(0, U), (5 * U, U), (20 * U, 2 * U), (SIZE - U, U)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn maps_name_exactly_the_written_and_the_changed_chunks() {
    let f = Fx::new(Kind::Thin).await;
    let caps = ok(
        "GetPluginCapabilities",
        f.d.identity()
            .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
            .await,
    );
    let service = csi::plugin_capability::service::Type::SnapshotMetadataService as i32;
    assert!(
        caps.capabilities.iter().any(|c| matches!(
            &c.r#type,
            Some(csi::plugin_capability::Type::Service(s)) if s.r#type == service
        )),
        "a thin pool advertises SNAPSHOT_METADATA_SERVICE: {caps:?}"
    );
    let chunk = chunk_size(&f);
    assert!(
        U.is_multiple_of(chunk),
        "the pattern is in whole chunks of {chunk}"
    );
    let (vol, dev) = block_volume(&f, "cbt", SIZE as i64, false).await;
    write_ranges(&dev, &WRITTEN, 1);
    let s1 = snapshot(&f, "cbt-1", &vol).await;
    // Changed: 5 MiB overwritten, 20 MiB discarded (left only in s1),
    // 40 MiB written anew.
    write_ranges(&dev, &[(5 * U, U), (40 * U, U)], 100);
    run_cmd(
        "blkdiscard",
        &[
            "-o",
            &(20 * U).to_string(),
            "-l",
            &U.to_string(),
            dev.to_str().unwrap(),
        ],
    );
    let s2 = snapshot(&f, "cbt-2", &vol).await;
    let mut c = client(&f).await;

    let a1 = must("allocated s1", allocated(&mut c, &s1, 0, 0, None).await);
    assert_eq!(a1.capacity, SIZE as i64);
    assert_eq!(a1.tuples, merged(WRITTEN.to_vec()), "allocated of s1");
    assert_none_held(&f).await;

    let a2 = must("allocated s2", allocated(&mut c, &s2, 0, 0, None).await);
    let want2 = merged(vec![
        (0, U),
        (5 * U, U),
        (21 * U, U),
        (40 * U, U),
        (SIZE - U, U),
    ]);
    assert_eq!(a2.tuples, want2, "allocated of s2");

    let d = must("delta s1 s2", delta(&mut c, &s1, &s2, 0, 0).await);
    assert_eq!(d.capacity, SIZE as i64);
    assert_eq!(d.tuples, [(5 * U, U), (20 * U, U), (40 * U, U)], "delta");
    // A snapshot against itself: nothing changed (one empty message).
    let same = must("delta s2 s2", delta(&mut c, &s2, &s2, 0, 0).await);
    assert!(same.tuples.is_empty());
    assert_eq!(same.messages, 1);
    // From an offset: what the whole answer has from there.
    let from = must("delta from 6 MiB", delta(&mut c, &s1, &s2, 6 * U, 1).await);
    assert_eq!(from.tuples, [(20 * U, U), (40 * U, U)]);
    assert_eq!(from.messages, 2, "max_results 1: one tuple a message");
    assert_none_held(&f).await;

    // Cut off after two messages of one tuple, then resumed from the end
    // of the last tuple received: together, the whole answer.
    let cut = must("allocated cut", allocated(&mut c, &s2, 0, 1, Some(2)).await);
    assert_eq!(cut.tuples, want2[..2]);
    let (o, l) = cut.tuples[1];
    let rest = must(
        "allocated resumed",
        allocated(&mut c, &s2, o + l, 1, None).await,
    );
    assert_eq!([cut.tuples, rest.tuples].concat(), want2);
    assert_none_held(&f).await;

    // Past the end, unknown snapshots, snapshots of two volumes.
    let e = allocated(&mut c, &s1, SIZE, 0, None).await;
    must_fail(
        "starting_offset at the end",
        e.map(|_| ()),
        Code::OutOfRange,
    );
    let e = delta(&mut c, &s1, &s2, SIZE + 1, 0).await;
    must_fail("delta past the end", e.map(|_| ()), Code::OutOfRange);
    let gone = format!("thin.{}", "f".repeat(32));
    let e = allocated(&mut c, &gone, 0, 0, None).await;
    must_fail("an unknown snapshot", e.map(|_| ()), Code::NotFound);
    let e = delta(&mut c, &s1, &gone, 0, 0).await;
    must_fail("an unknown target", e.map(|_| ()), Code::NotFound);
    let e = allocated(&mut c, "", 0, 0, None).await;
    must_fail("no snapshot id", e.map(|_| ()), Code::InvalidArgument);
    let e = allocated(&mut c, &s1, 0, -1, None).await;
    must_fail("negative max_results", e.map(|_| ()), Code::InvalidArgument);
    let (other, odev) = block_volume(&f, "other", 16 * MI, false).await;
    write_ranges(&odev, &[(0, U)], 7);
    let so = snapshot(&f, "other-1", &other).await;
    let e = delta(&mut c, &s1, &so, 0, 0).await;
    let s = must_fail(
        "snapshots of two volumes",
        e.map(|_| ()),
        Code::InvalidArgument,
    );
    assert!(s.message().contains("one volume"), "{}", s.message());
    assert_none_held(&f).await;
}

/// Encrypted thin volumes are answered in the offsets of the opened LUKS
/// device (what a restored volume's reader sees): the header's blocks are
/// not named, and every offset is less the header's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn encrypted_thin_snapshots_are_mapped_in_the_luks_devices_offsets() {
    let f = Fx::new(Kind::Thin).await;
    let (vol, dev) = block_volume(&f, "secret", SIZE as i64, true).await;
    let capacity = {
        let r = std::fs::File::open(&dev).and_then(|f| {
            use std::io::Seek;
            let mut f = f;
            f.seek(std::io::SeekFrom::End(0))
        });
        r.expect("the LUKS device's size")
    };
    let written = [(0, U), (3 * U, 2 * U), (capacity - U, U)];
    write_ranges(&dev, &written, 11);
    let s1 = snapshot(&f, "secret-1", &vol).await;
    write_ranges(&dev, &[(3 * U, U), (10 * U, U)], 50);
    let s2 = snapshot(&f, "secret-2", &vol).await;
    let mut c = client(&f).await;
    let a = must("allocated", allocated(&mut c, &s1, 0, 0, None).await);
    assert_eq!(a.capacity as u64, capacity, "the LUKS device's size");
    assert_eq!(a.tuples, merged(written.to_vec()));
    let d = must("delta", delta(&mut c, &s1, &s2, 0, 0).await);
    assert_eq!(d.tuples, [(3 * U, U), (10 * U, U)]);
    assert_none_held(&f).await;
}

/// A thick pool's snapshot has no block map: FAILED_PRECONDITION, said
/// clearly; the node still serves the thin pool beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn thick_snapshots_have_no_block_map() {
    let f = Fx::start_with(
        Kind::Thin,
        Fx::VG_BYTES,
        Fx::THIN_BYTES,
        |o| o,
        |mut d| {
            let vg = d.lvm_pools[0].volume_group.clone();
            d.lvm_pools
                .push(LvmPoolOpts::new("thick", &vg).reserve("64Mi"));
            d
        },
    )
    .await;
    let vol = must(
        "create thick",
        f.create(csi::CreateVolumeRequest {
            name: "thick-vol".into(),
            capacity_range: Some(range(16 * MI, 0)),
            volume_capabilities: vec![block()],
            parameters: params(&[("pool", "thick")]),
            ..Default::default()
        })
        .await,
    );
    let snap = ok(
        "thick snapshot",
        f.d.controller()
            .create_snapshot(csi::CreateSnapshotRequest {
                name: "thick-snap".into(),
                source_volume_id: vol.volume_id.clone(),
                parameters: params(&[("snapshotSize", "8Mi")]),
                ..Default::default()
            })
            .await,
    )
    .snapshot
    .unwrap()
    .snapshot_id;
    let mut c = client(&f).await;
    let e = allocated(&mut c, &snap, 0, 0, None).await;
    let s = must_fail("a thick snapshot", e.map(|_| ()), Code::FailedPrecondition);
    assert!(s.message().contains("thin LVM"), "{}", s.message());
    let e = delta(&mut c, &snap, &snap, 0, 0).await;
    must_fail("a thick delta", e.map(|_| ()), Code::FailedPrecondition);
    let gone = format!("thick.{}", "f".repeat(32));
    let e = allocated(&mut c, &gone, 0, 0, None).await;
    must_fail("an unknown thick snapshot", e.map(|_| ()), Code::NotFound);
    assert_none_held(&f).await;
}

/// A metadata snapshot left held (a driver killed mid-call, or one taken
/// by hand) is released by the next call, and by the next start; a driver
/// killed while it streams a map leaves one held, which its next start
/// releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs device-mapper: run by make test-vm in the VM"]
async fn a_metadata_snapshot_left_held_is_released() {
    let mut f = Fx::new(Kind::Thin).await;
    // 4096 chunks apart from one another: 4096 tuples, one a message, far
    // more than a 1 KiB window and the driver's send buffer (32 KiB of
    // messages) hold: the driver is still streaming (and holding the
    // metadata snapshot) when it is killed.
    let chunk = chunk_size(&f);
    let n = 4096u64;
    let size = (n * 2 * chunk).div_ceil(4 * U) * 4 * U;
    let (vol, dev) = block_volume(&f, "many", size as i64, false).await;
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut d = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
        let b = pattern(3, 4096);
        for i in 0..n {
            d.seek(SeekFrom::Start(i * 2 * chunk)).unwrap();
            d.write_all(&b).unwrap();
        }
        d.sync_all().unwrap();
    }
    let snap = snapshot(&f, "many-1", &vol).await;
    let tpool = format!("{}-tp-tpool", f.vg.vg);

    // Taken by hand: the next call releases it and answers.
    run_cmd(
        "dmsetup",
        &["message", &tpool, "0", "reserve_metadata_snap"],
    );
    assert!(held_metadata_snapshot(&f).is_some());
    let mut c = client(&f).await;
    let all = must("allocated", allocated(&mut c, &snap, 0, 0, None).await);
    assert_eq!(all.tuples.len() as u64, n);
    assert_eq!(all.tuples[1], (2 * chunk, chunk));
    assert_none_held(&f).await;

    // Killed mid-stream: held until the next start. The stream is kept
    // open, unread past its first message, while the driver is killed.
    let mut slow = slow_client(&f).await;
    let mut s = slow
        .get_metadata_allocated(csi::GetMetadataAllocatedRequest {
            snapshot_id: snap.clone(),
            max_results: 1,
            ..Default::default()
        })
        .await
        .expect("a stream")
        .into_inner();
    let m = s.message().await.expect("a message").expect("one message");
    assert_eq!(tuples(&m.block_metadata), [(0, chunk)]);
    assert!(
        held_metadata_snapshot(&f).is_some(),
        "the driver holds the metadata snapshot while it streams"
    );
    f.d.kill9();
    drop(s);
    assert!(
        held_metadata_snapshot(&f).is_some(),
        "left held by the killed driver"
    );
    f.d.start_again_retrying().await;
    assert_none_held(&f).await;

    // And the map is whole again after it.
    let mut c = client(&f).await;
    let rest = must(
        "resumed after the restart",
        allocated(&mut c, &snap, chunk, 0, None).await,
    );
    assert_eq!(rest.tuples.len() as u64, n - 1);
    assert_none_held(&f).await;
}
