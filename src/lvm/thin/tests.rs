//! The block-map reader on recorded output, and on the real
//! thin-provisioning-tools run on metadata files (`thin_restore` makes a
//! pool's metadata from XML without device-mapper; a metadata snapshot is
//! added to the file the way the kernel's `reserve_metadata_snap` makes one).

use std::io::Cursor;
use std::path::{Path, PathBuf};

use super::*;

async fn read_all(xml: &str, query: Query) -> Result<(u64, Vec<Run>), LvmError> {
    let program = match query {
        Query::Mapped(_) => "thin_dump",
        Query::Changed(..) => "thin_delta",
    };
    let mut runs = BlockRuns::start(Cursor::new(xml.as_bytes().to_vec()), query, program).await?;
    let mut all = Vec::new();
    while let Some(r) = runs.next().await? {
        all.push(r);
    }
    Ok((runs.block_sectors, all))
}

fn run(begin: u64, length: u64) -> Run {
    Run { begin, length }
}

/// Recorded from thin_dump 0.9.0 (`thin_dump --dev-id 2 meta.bin`).
const DUMP: &str = r#"<superblock uuid="" time="1" transaction="2" flags="0" version="2" data_block_size="128" nr_data_blocks="1000">
  <device dev_id="2" mapped_blocks="6" transaction="1" creation_time="1" snap_time="1">
    <range_mapping origin_begin="0" data_begin="0" length="2" time="0"/>
    <single_mapping origin_block="2" data_block="7" time="1"/>
    <single_mapping origin_block="3" data_block="3" time="0"/>
    <single_mapping origin_block="10" data_block="4" time="0"/>
    <single_mapping origin_block="20" data_block="8" time="1"/>
  </device>
</superblock>
"#;

/// Recorded from thin_delta 0.9.0 (`thin_delta --snap1 1 --snap2 2`).
const DELTA: &str = r#"<superblock uuid="" time="1" transaction="2" data_block_size="128" nr_data_blocks="1000">
  <diff left="1" right="2">
    <same begin="0" length="2"/>
    <different begin="2" length="1"/>
    <same begin="3" length="1"/>
    <same begin="10" length="1"/>
    <left_only begin="12" length="1"/>
    <right_only begin="20" length="1"/>
  </diff>
</superblock>
"#;

#[tokio::test]
async fn a_dump_reads_as_merged_runs_of_blocks() {
    let (sectors, runs) = read_all(DUMP, Query::Mapped(2)).await.unwrap();
    assert_eq!(sectors, 128);
    // 0-1 (a range), 2 and 3 (singles) are one run; data_begin is not ours.
    assert_eq!(runs, [run(0, 4), run(10, 1), run(20, 1)]);
}

#[tokio::test]
async fn a_delta_names_different_left_only_and_right_only() {
    let (_, runs) = read_all(DELTA, Query::Changed(1, 2)).await.unwrap();
    assert_eq!(runs, [run(2, 1), run(12, 1), run(20, 1)]);
    // Adjacent changes of different kinds are one run; `same` splits.
    let xml = r#"<superblock data_block_size="8">
  <diff left="3" right="4">
    <different begin="0" length="2"/>
    <right_only begin="2" length="3"/>
    <left_only begin="5" length="1"/>
    <same begin="6" length="1"/>
    <different begin="7" length="1"/>
  </diff>
</superblock>"#;
    let (sectors, runs) = read_all(xml, Query::Changed(3, 4)).await.unwrap();
    assert_eq!(sectors, 8);
    assert_eq!(runs, [run(0, 6), run(7, 1)]);
}

#[tokio::test]
async fn a_verbose_delta_is_read_too() {
    // Recorded from `thin_delta --verbose` 0.9.0.
    let xml = r#"<superblock uuid="" time="1" transaction="2" data_block_size="128" nr_data_blocks="1000">
  <diff left="1" right="2">
    <same>
      <range begin="0" data_begin="0" length="2"/>
    </same>
    <different>
      <range begin="2" left_data_begin="2" right_data_begin="7" length="1"/>
    </different>
    <same>
      <range begin="3" data_begin="3" length="1"/>
      <range begin="10" data_begin="4" length="1"/>
    </same>
    <left_only>
      <range begin="12" data_begin="5" length="1"/>
    </left_only>
    <right_only>
      <range begin="20" data_begin="8" length="1"/>
    </right_only>
  </diff>
</superblock>
"#;
    let (_, runs) = read_all(xml, Query::Changed(1, 2)).await.unwrap();
    assert_eq!(runs, [run(2, 1), run(12, 1), run(20, 1)]);
}

#[tokio::test]
async fn output_that_does_not_answer_the_question_is_an_error() {
    let parse = |r: Result<(u64, Vec<Run>), LvmError>| match r {
        Err(LvmError::Parse(m)) => m,
        other => panic!("expected a parse error, got {other:?}"),
    };
    // thin_dump 0.9.0 answers an unknown --dev-id with an empty superblock
    // and exit 0.
    let empty = r#"<superblock uuid="" time="1" transaction="2" flags="0" version="2" data_block_size="128" nr_data_blocks="0">
</superblock>
"#;
    let m = parse(read_all(empty, Query::Mapped(7)).await);
    assert!(
        m.contains("thin device 7 is not in the metadata snapshot"),
        "{m}"
    );
    let m = parse(read_all(DUMP, Query::Mapped(1)).await);
    assert!(m.contains("device 2 where 1 was asked for"), "{m}");
    let m = parse(read_all(DELTA, Query::Changed(2, 1)).await);
    assert!(m.contains("diff of 1 and 2"), "{m}");
    // Blocks out of order would make the answer's tuples go backwards.
    let back = r#"<superblock data_block_size="128"><device dev_id="1">
<single_mapping origin_block="5"/><single_mapping origin_block="3"/></device></superblock>"#;
    let m = parse(read_all(back, Query::Mapped(1)).await);
    assert!(m.contains("out of order"), "{m}");
    // An element this reader does not know is never skipped.
    let shared = r#"<superblock data_block_size="128"><device dev_id="1">
<ref name="17"/></device></superblock>"#;
    let m = parse(read_all(shared, Query::Mapped(1)).await);
    assert!(m.contains("unexpected element <ref>"), "{m}");
    let m = parse(read_all("", Query::Mapped(1)).await);
    assert!(m.contains("no superblock"), "{m}");
    let m = parse(read_all(r#"<superblock data_block_size="x">"#, Query::Mapped(1)).await);
    assert!(m.contains("is not a number"), "{m}");
    let m = parse(read_all(r#"<superblock data_block_size="0">"#, Query::Mapped(1)).await);
    assert!(m.contains("data_block_size is 0"), "{m}");
    // Cut short (a tool that died mid-output is caught by its exit; bytes
    // without an exit are caught by the XML).
    let cut = &DUMP[..DUMP.find("<single_mapping origin_block=\"10\"").unwrap() + 20];
    assert!(read_all(cut, Query::Mapped(2)).await.is_err());
}

// ---------------------------------------------------------------------------
// The real tools, on metadata files.
// ---------------------------------------------------------------------------

/// The tools this host has, or None (said loudly: the test did not run).
fn tools(test: &str) -> bool {
    for t in ["thin_restore", "thin_dump", "thin_delta"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(t).exists()))
            .unwrap_or(false)
            || Path::new("/usr/sbin").join(t).exists();
        if !found {
            crate::testing::skip(
                test,
                &format!("{t} is not installed (thin-provisioning-tools)"),
            );
            return false;
        }
    }
    true
}

/// The XML of a pool with two devices: 1 the origin, 2 its snapshot, with
/// blocks changed, added and discarded since.
const POOL: &str = r#"<superblock uuid="" time="1" transaction="2" flags="0" version="2" data_block_size="128" nr_data_blocks="4096">
  <device dev_id="1" mapped_blocks="7" transaction="0" creation_time="0" snap_time="1">
    <range_mapping origin_begin="0" data_begin="0" length="4" time="0"/>
    <single_mapping origin_block="10" data_block="4" time="0"/>
    <single_mapping origin_block="12" data_block="5" time="1"/>
    <single_mapping origin_block="4095" data_block="6" time="1"/>
  </device>
  <device dev_id="2" mapped_blocks="6" transaction="1" creation_time="1" snap_time="1">
    <range_mapping origin_begin="0" data_begin="0" length="2" time="0"/>
    <single_mapping origin_block="2" data_block="7" time="1"/>
    <single_mapping origin_block="3" data_block="3" time="0"/>
    <single_mapping origin_block="10" data_block="4" time="0"/>
    <range_mapping origin_begin="20" data_begin="8" length="3" time="1"/>
  </device>
</superblock>
"#;

/// A metadata file restored from `xml`.
async fn restored(dir: &Path, xml: &str) -> PathBuf {
    let x = dir.join("pool.xml");
    std::fs::write(&x, xml).unwrap();
    let meta = dir.join("meta.bin");
    std::fs::File::create(&meta)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    Cmd::new("thin_restore")
        .arg("-i")
        .arg(&x)
        .arg("-o")
        .arg(&meta)
        .run()
        .await
        .unwrap();
    meta
}

/// CRC-32C (Castagnoli), as the thin pool's metadata checksums use it,
/// without the final inversion.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82F6_3B78 & (crc & 1).wrapping_neg());
        }
    }
    crc
}

const BLOCK: usize = 4096;

/// Sets a superblock's own location and its checksum (dm-thin's
/// `sb_validator`: crc32c of everything after the checksum, xor 160774).
fn seal(sb: &mut [u8], at: u64) {
    sb[8..16].copy_from_slice(&at.to_le_bytes());
    let c = crc32c(&sb[4..]) ^ 160_774;
    sb[0..4].copy_from_slice(&c.to_le_bytes());
}

/// Adds a metadata snapshot to a metadata file as the kernel's
/// `reserve_metadata_snap` does: a copy of the superblock (its space maps
/// wiped) in a free block, which the superblock's `held_root` names. The
/// copy goes in the file's last block, which `thin_restore` leaves free.
fn reserve_in_file(meta: &Path) {
    let mut data = std::fs::read(meta).unwrap();
    let last = data.len() / BLOCK - 1;
    let mut copy = data[..BLOCK].to_vec();
    assert_eq!(u64::from_le_bytes(copy[56..64].try_into().unwrap()), 0);
    copy[64..320].fill(0);
    seal(&mut copy, last as u64);
    data[last * BLOCK..(last + 1) * BLOCK].copy_from_slice(&copy);
    data[56..64].copy_from_slice(&(last as u64).to_le_bytes());
    seal(&mut data[..BLOCK], 0);
    std::fs::write(meta, data).unwrap();
}

async fn collect(mut runs: BlockRuns) -> Result<Vec<Run>, LvmError> {
    // (BlockRuns::mapped and ::changed read up to the superblock first.)
    let mut all = Vec::new();
    while let Some(r) = runs.next().await? {
        all.push(r);
    }
    Ok(all)
}

#[tokio::test]
async fn the_real_tools_read_a_metadata_snapshot_in_a_file() {
    if !tools("the_real_tools_read_a_metadata_snapshot_in_a_file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let meta = restored(dir.path(), POOL).await;
    // Without a metadata snapshot, `--metadata-snap` fails (the tools read
    // the snapshot, never the live metadata).
    // The failure shows as the output ends, before the superblock.
    match BlockRuns::mapped(&meta, 1).await.map(|_| ()) {
        Err(LvmError::Command(e)) => {
            assert!(e.to_string().contains("no current metadata snap"), "{e}")
        }
        other => panic!("expected the tool's failure, got {other:?}"),
    }
    reserve_in_file(&meta);
    let runs = BlockRuns::mapped(&meta, 1).await.unwrap();
    assert_eq!(runs.block_bytes(), 64 << 10);
    assert_eq!(
        collect(runs).await.unwrap(),
        [run(0, 4), run(10, 1), run(12, 1), run(4095, 1)]
    );
    let runs = BlockRuns::mapped(&meta, 2).await.unwrap();
    assert_eq!(
        collect(runs).await.unwrap(),
        [run(0, 4), run(10, 1), run(20, 3)]
    );
    // Changed: 2 (different), 12 (left_only: discarded), 20-22
    // (right_only), 4095 (left_only).
    let runs = BlockRuns::changed(&meta, 1, 2).await.unwrap();
    assert_eq!(
        collect(runs).await.unwrap(),
        [run(2, 1), run(12, 1), run(20, 3), run(4095, 1)]
    );
    // The same device against itself: nothing changed.
    let runs = BlockRuns::changed(&meta, 2, 2).await.unwrap();
    assert_eq!(collect(runs).await.unwrap(), []);
    // A device the metadata does not have.
    let e = collect(BlockRuns::mapped(&meta, 9).await.unwrap()).await;
    assert!(matches!(e, Err(LvmError::Parse(_))), "{e:?}");
    let e = match BlockRuns::changed(&meta, 1, 9).await {
        Ok(runs) => collect(runs).await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(matches!(e, Err(LvmError::Command(_))), "{e:?}");
}

#[tokio::test]
async fn a_large_map_streams_through_the_real_tools() {
    if !tools("a_large_map_streams_through_the_real_tools") {
        return;
    }
    // 20,000 single mappings, every other block: 20,000 runs.
    let mut xml = String::from(
        r#"<superblock uuid="" time="0" transaction="1" flags="0" version="2" data_block_size="128" nr_data_blocks="65536">
  <device dev_id="5" mapped_blocks="20000" transaction="0" creation_time="0" snap_time="0">
"#,
    );
    for i in 0..20_000u64 {
        xml.push_str(&format!(
            "    <single_mapping origin_block=\"{}\" data_block=\"{i}\" time=\"0\"/>\n",
            i * 2
        ));
    }
    xml.push_str("  </device>\n</superblock>\n");
    let dir = tempfile::tempdir().unwrap();
    let meta = restored(dir.path(), &xml).await;
    reserve_in_file(&meta);
    let mut runs = BlockRuns::mapped(&meta, 5).await.unwrap();
    let mut n = 0u64;
    while let Some(r) = runs.next().await.unwrap() {
        assert_eq!(r, run(n * 2, 1));
        n += 1;
    }
    assert_eq!(n, 20_000);
}

/// lvm 2.03's words (Debian 12, recorded in the VM after an lvcreate of a
/// thin snapshot was killed mid-run) name the device to delete; any other
/// failure names none.
#[test]
fn finds_the_orphan_device_an_lvcreate_met() {
    let failed = |stderr: &str| LvmError::Command(crate::lvm::run::failed(stderr));
    let met = "  device-mapper: message ioctl on  (254:2) failed: File exists\n  \
        Failed to process message \"create_snap 8 6\".\n  \
        Thin pool lvt142n16-tp-tpool (254:2) already contain thin device with device_id 8.\n  \
        Manual intervention may be required to remove device dev_id=8 in thin pool metadata.\n";
    assert_eq!(orphan_device(&failed(met)), Some(8));
    assert_eq!(
        orphan_device(&failed(
            "  Thin pool vg-tp-tpool (254:2) already contain thin device with device_id 12345."
        )),
        Some(12345)
    );
    assert_eq!(
        orphan_device(&failed("  Volume group \"vg\" has insufficient free space")),
        None
    );
    assert_eq!(
        orphan_device(&failed("  already contain thin device with device_id x")),
        None
    );
    assert_eq!(orphan_device(&LvmError::AlreadyExists("lv-a".into())), None);
}
