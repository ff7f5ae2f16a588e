//! Block-map answers: the range logic (windows, starting offsets, pages,
//! resuming a cut stream) on made-up maps, and the refusals through the
//! operations on a driver whose thin pool cannot open here (no VG: its
//! calls are refused, its capability stays).

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use super::*;
use crate::config::{Config, PoolConfig};
use crate::driver::Identity;
use crate::ops::OpError;
use crate::pool::PoolError;

const KI: u64 = 1 << 10;
const MI: u64 = 1 << 20;

/// A block map from a list, as a pool would read it.
struct Listed {
    block: u64,
    left: std::collections::VecDeque<Extent>,
    /// Set when the map was read to its end (what a pool releases then).
    ended: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl Extents for Listed {
    fn block_size(&self) -> u64 {
        self.block
    }
    async fn next(&mut self) -> crate::pool::Result<Option<Extent>> {
        let e = self.left.pop_front();
        if e.is_none() {
            self.ended.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(e)
    }
}

fn ext(offset: u64, length: u64) -> Extent {
    Extent { offset, length }
}

fn listed(block: u64, all: &[Extent]) -> Box<dyn Extents> {
    Box::new(Listed {
        block,
        left: all.iter().copied().collect(),
        ended: Arc::default(),
    })
}

const PLAIN: Window = Window {
    skip: 0,
    capacity: 10 * MI,
};

/// Every page of an answer, and the tuples in order.
async fn read(mut pages: BlockPages) -> (Vec<usize>, Vec<Extent>) {
    let (mut sizes, mut all) = (Vec::new(), Vec::new());
    while let Some(p) = pages.next_page().await.unwrap() {
        sizes.push(p.len());
        all.extend(p);
    }
    (sizes, all)
}

/// A map of 64 KiB blocks: runs at 0 (3 blocks), 1 MiB (1), 2 MiB (16),
/// and one that the volume's end cuts.
fn map() -> Vec<Extent> {
    vec![
        ext(0, 192 * KI),
        ext(MI, 64 * KI),
        ext(2 * MI, MI),
        ext(10 * MI - 64 * KI, 128 * KI),
    ]
}

#[tokio::test]
async fn pages_hold_at_most_max_tuples_in_ascending_order() {
    let pages = BlockPages::new(listed(64 * KI, &map()), PLAIN, 0, 3);
    assert_eq!(pages.capacity, 10 * MI);
    let (sizes, all) = read(pages).await;
    assert_eq!(sizes, [3, 1]);
    // The last run stops at the volume's end.
    let mut want = map();
    want[3].length = 64 * KI;
    assert_eq!(all, want);
    for w in all.windows(2) {
        assert!(
            w[0].end() < w[1].offset,
            "strictly increasing, apart: {w:?}"
        );
    }
}

#[tokio::test]
async fn an_empty_answer_is_one_empty_page() {
    let pages = BlockPages::new(listed(64 * KI, &[]), PLAIN, 0, 10);
    let (sizes, all) = read(pages).await;
    assert_eq!(sizes, [0], "one message, so the client learns the capacity");
    assert!(all.is_empty());
    // From past every extent: the same.
    let pages = BlockPages::new(listed(64 * KI, &map()[..2]), PLAIN, 5 * MI, 10);
    assert_eq!(read(pages).await.0, [0]);
}

#[tokio::test]
async fn a_cut_stream_resumes_at_the_end_of_its_last_tuple() {
    let whole = read(BlockPages::new(listed(64 * KI, &map()), PLAIN, 0, 1000))
        .await
        .1;
    for (i, last) in whole.iter().enumerate() {
        // The client got tuples up to `last` and resumes at its end.
        let resumed = read(BlockPages::new(
            listed(64 * KI, &map()),
            PLAIN,
            last.end(),
            2,
        ))
        .await
        .1;
        assert_eq!(resumed, whole[i + 1..], "resumed after tuple {i}");
    }
    // From inside a run: the run's rest, from the block boundary at or
    // before the offset (the spec lets the plugin round down).
    let mid = read(BlockPages::new(
        listed(64 * KI, &map()),
        PLAIN,
        2 * MI + 100 * KI,
        1000,
    ))
    .await
    .1;
    assert_eq!(mid[0], ext(2 * MI + 64 * KI, MI - 64 * KI));
    assert_eq!(mid[1..], whole[3..]);
}

#[tokio::test]
async fn the_map_is_read_to_its_end_before_the_last_page() {
    let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let extents = Box::new(Listed {
        block: 64 * KI,
        left: map().into(),
        ended: ended.clone(),
    });
    let mut pages = BlockPages::new(extents, PLAIN, 0, 4);
    let p = pages.next_page().await.unwrap().unwrap();
    assert_eq!(p.len(), 4);
    assert!(!ended.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(pages.next_page().await.unwrap(), None);
    assert!(ended.load(std::sync::atomic::Ordering::SeqCst));
}

#[test]
fn an_encrypted_volume_is_answered_in_its_luks_devices_offsets() {
    // A 16 MiB LUKS2 header: what its readers see starts after it.
    let luks = Window {
        skip: 16 * MI,
        capacity: 48 * MI,
    };
    // Inside the header only: dropped.
    assert_eq!(visible(ext(0, MI), luks, 0), None);
    assert_eq!(visible(ext(15 * MI, MI), luks, 0), None);
    // Across its end: clipped to where the data starts.
    assert_eq!(visible(ext(15 * MI, 2 * MI), luks, 0), Some(ext(0, MI)));
    assert_eq!(visible(ext(20 * MI, MI), luks, 0), Some(ext(4 * MI, MI)));
    // Past the device's end: clipped, or dropped.
    assert_eq!(
        visible(ext(63 * MI, 4 * MI), luks, 0),
        Some(ext(47 * MI, MI))
    );
    assert_eq!(visible(ext(64 * MI, MI), luks, 0), None);
    // From an offset of the LUKS device.
    assert_eq!(
        visible(ext(20 * MI, 2 * MI), luks, 21 * MI - 16 * MI),
        Some(ext(5 * MI, MI))
    );
    // Rounding down to the blocks of the device below: a header that is
    // not a whole number of blocks shifts their boundaries.
    assert_eq!(aligned_start(5 * MI + 1, luks, 64 * KI), 5 * MI);
    let odd = Window {
        skip: 4 * KI,
        capacity: MI,
    };
    assert_eq!(aligned_start(64 * KI, odd, 64 * KI), 60 * KI);
    assert_eq!(aligned_start(KI, odd, 64 * KI), 0);
    assert_eq!(aligned_start(7, PLAIN, 0), 7);
}

#[tokio::test]
async fn an_encrypted_answer_pages_and_resumes_like_a_plain_one() {
    let luks = Window {
        skip: 16 * MI,
        capacity: 48 * MI,
    };
    let device = [
        ext(0, 16 * MI),
        ext(16 * MI, 128 * KI),
        ext(30 * MI, 2 * MI),
        ext(60 * MI, 8 * MI),
    ];
    let (_, all) = read(BlockPages::new(listed(64 * KI, &device), luks, 0, 2)).await;
    assert_eq!(
        all,
        [ext(0, 128 * KI), ext(14 * MI, 2 * MI), ext(44 * MI, 4 * MI)]
    );
    let (_, rest) = read(BlockPages::new(
        listed(64 * KI, &device),
        luks,
        all[0].end(),
        2,
    ))
    .await;
    assert_eq!(rest, all[1..]);
}

#[test]
fn max_results_zero_is_the_plugins_choice_and_large_ones_are_capped() {
    assert_eq!(Paging::new(0, 0).max, DEFAULT_PAGE);
    assert_eq!(Paging::new(0, 7).max, 7);
    assert_eq!(Paging::new(0, u32::MAX).max, MAX_PAGE);
}

#[test]
fn a_delta_is_between_snapshots_of_one_volume() {
    let snap = |id: &str, vol: &str, skip: u64| MappedSnapshot {
        id: match VolumeId::parse("id", id).unwrap() {
            ParsedId::Volume(v) => v,
            ParsedId::Foreign(_) => unreachable!(),
        },
        source_volume: vol.to_owned(),
        window: Window {
            skip,
            capacity: 64 * MI,
        },
        device: 1,
    };
    let a = snap("thin.0123456789abcdef0123456789abcdef", "thin.aa", 0);
    let b = snap("thin.fedcba9876543210fedcba9876543210", "thin.aa", 0);
    same_volume(&a, &b).unwrap();
    let mut grown = b.clone();
    grown.window.capacity *= 2;
    same_volume(&a, &grown).unwrap();
    let other = snap("thin.fedcba9876543210fedcba9876543210", "thin.bb", 0);
    let e = same_volume(&a, &other).unwrap_err();
    assert!(
        matches!(&e, OpError::Refused(Refusal::Unfit(m)) if m.contains("snapshots of one volume")),
        "{e:?}"
    );
    let header = snap("thin.fedcba9876543210fedcba9876543210", "thin.aa", 16 * MI);
    assert!(same_volume(&a, &header).is_err());
}

// ---------------------------------------------------------------------------
// Through the operations.
// ---------------------------------------------------------------------------

/// A driver with the dir pool "default" and, when `lvm`, the LVM pools
/// "thin" (thin pool `tp`) and "thick" in a VG this host does not have: they
/// do not open, and keep their place (and capabilities) as refused pools.
async fn driver(dir: &Path, lvm: bool) -> Arc<Driver> {
    std::fs::create_dir_all(dir.join("kubelet")).unwrap();
    let who = Identity {
        driver_name: "localvol.csi.dev".into(),
        node_id: "n0".into(),
        kubelet_dir: dir.join("kubelet"),
    };
    let mut cfg = Config::embedded(dir);
    if lvm {
        let yaml = r#"
pools:
  - name: thin
    type: lvm
    volumeGroup: localvol-no-such-vg
    thinPool: tp
  - name: thick
    type: lvm
    volumeGroup: localvol-no-such-vg
"#;
        let extra = Config::from_yaml(yaml).unwrap();
        assert!(extra.keeps_block_maps());
        cfg.pools.extend(extra.pools);
    }
    assert_eq!(cfg.keeps_block_maps(), lvm);
    assert!(cfg.pools.iter().any(|p| matches!(p, PoolConfig::Dir(_))));
    Driver::open(&who, &cfg).await.unwrap()
}

fn id(raw: &str) -> ParsedId {
    VolumeId::parse("snapshot_id", raw).unwrap()
}

fn allocated(raw: &str) -> Allocated {
    Allocated {
        snapshot: id(raw),
        paging: Paging::new(0, 0),
    }
}

const KEY: &str = "0123456789abcdef0123456789abcdef";

#[tokio::test]
async fn without_a_thin_pool_the_service_is_not_offered() {
    let dir = tempfile::tempdir().unwrap();
    let d = driver(dir.path(), false).await;
    assert!(!offers_block_maps(&d));
    let e = metadata_allocated(&d, allocated(&format!("default.{KEY}")))
        .await
        .unwrap_err();
    assert!(
        matches!(e, OpError::Refused(Refusal::Unsupported(_))),
        "{e:?}"
    );
}

#[tokio::test]
async fn snapshots_without_a_block_map_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let d = driver(dir.path(), true).await;
    assert!(
        offers_block_maps(&d),
        "the thin pool offers them, open or not"
    );
    // An id that cannot be a snapshot here, or a pool this node lacks.
    for raw in ["not-ours", &format!("nosuchpool.{KEY}")] {
        let e = metadata_allocated(&d, allocated(raw)).await.unwrap_err();
        assert!(
            matches!(e, OpError::Refused(Refusal::Missing { .. })),
            "{raw}: {e:?}"
        );
    }
    // A dir pool keeps no block map (and takes no snapshot).
    let e = metadata_allocated(&d, allocated(&format!("default.{KEY}")))
        .await
        .unwrap_err();
    match &e {
        OpError::Refused(r @ Refusal::NoBlockMap { .. }) => {
            let m = r.to_string();
            assert!(
                m.contains("pool default (dir)") && m.contains("thin LVM"),
                "{m}"
            );
        }
        other => panic!("expected NoBlockMap, got {other:?}"),
    }
    // The LVM pools did not open: unavailable, for now.
    for pool in ["thin", "thick"] {
        let e = metadata_allocated(&d, allocated(&format!("{pool}.{KEY}")))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                OpError::Driver(crate::driver::DriverError::PoolUnusable { .. })
                    | OpError::Pool(PoolError::NotStarted { .. })
            ),
            "{pool}: {e:?}"
        );
    }
    // A delta names both snapshots the same way.
    let delta = |base: &str, target: &str| Delta {
        base: id(base),
        target: id(target),
        paging: Paging::new(0, 0),
    };
    let e = metadata_delta(&d, delta("not-ours", &format!("default.{KEY}")))
        .await
        .unwrap_err();
    assert!(
        matches!(e, OpError::Refused(Refusal::Missing { .. })),
        "{e:?}"
    );
    let e = metadata_delta(
        &d,
        delta(&format!("default.{KEY}"), &format!("default.{KEY}")),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(e, OpError::Refused(Refusal::NoBlockMap { .. })),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_snapshot_busy_with_another_operation_is_refused_before_the_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let d = driver(dir.path(), true).await;
    let raw = format!("thin.{KEY}");
    let _held = lock(&d, Kind::Snapshot, "snapshot_id", &raw).unwrap();
    let e = metadata_allocated(&d, allocated(&raw)).await.unwrap_err();
    assert!(matches!(e, OpError::Busy(_)), "{e:?}");
    let e = metadata_delta(
        &d,
        Delta {
            base: id(&format!("thin.{}", "f".repeat(32))),
            target: id(&raw),
            paging: Paging::new(0, 0),
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(e, OpError::Busy(_)), "{e:?}");
}

#[test]
fn a_start_at_or_past_the_end_is_out_of_range() {
    check_start(10 * MI - 1, PLAIN).unwrap();
    for start in [10 * MI, u64::MAX] {
        let e = check_start(start, PLAIN).unwrap_err();
        assert!(
            matches!(e, OpError::Refused(Refusal::PastTheEnd { .. })),
            "{e:?}"
        );
    }
}
