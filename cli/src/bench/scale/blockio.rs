//! `changed-blocks`' I/O on a published raw block device: a deterministic
//! pattern written whole, chunks overwritten at seeded random offsets,
//! byte ranges read back with `O_DIRECT` (no page cache: every arm reads
//! the device) and checksummed, and the check that a metadata answer names
//! every chunk written.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// Alignment of the I/O buffers (and so of every `O_DIRECT` transfer's
/// memory); offsets and lengths must be multiples of the device's logical
/// block (512 or 4096 bytes).
pub const ALIGN: usize = 4096;
/// Largest single read or write.
const IO_SIZE: usize = 1 << 20;

/// A zeroed buffer of `len` bytes whose start is `ALIGN`-aligned.
pub struct AlignedBuf {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let v = vec![0u8; len + ALIGN];
        let off = v.as_ptr().align_offset(ALIGN);
        AlignedBuf { v, off, len }
    }

    pub fn get(&mut self, n: usize) -> &mut [u8] {
        &mut self.v[self.off..self.off + n.min(self.len)]
    }
}

/// splitmix64: one step of a small, fast, seedable generator.
pub fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with stream `stream`'s bytes for device offset `at` (a
/// multiple of 8): the same offset always gets the same bytes, so a
/// range can be made again to check it.
pub fn pattern(buf: &mut [u8], stream: u64, at: u64) {
    for (i, w) in buf.chunks_mut(8).enumerate() {
        let word = splitmix(stream ^ (at / 8 + i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        w.copy_from_slice(&word.to_le_bytes()[..w.len()]);
    }
}

/// A running checksum of bytes read (order matters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checksum(pub u64);

impl Checksum {
    pub fn update(&mut self, data: &[u8]) {
        let mut h = self.0;
        let mut words = data.chunks_exact(8);
        for w in &mut words {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            h = (h.rotate_left(5) ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        for &b in words.remainder() {
            h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        self.0 = h;
    }
}

/// Opens the device for `O_DIRECT` I/O (`direct`), or through the page
/// cache (tests on files of filesystems without `O_DIRECT`).
pub fn open(path: &Path, write: bool, direct: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(write);
    if direct {
        o.custom_flags(nix::fcntl::OFlag::O_DIRECT.bits());
    }
    o.open(path)
}

/// The device's size in bytes (its end, as a block device has no length
/// in its metadata).
pub fn size_of(f: &File) -> io::Result<u64> {
    use std::io::Seek;
    let mut f = f;
    f.seek(io::SeekFrom::End(0))
}

/// The pieces of at most [`IO_SIZE`] bytes that cover each `(offset,
/// length)` range, in order: `(range's offset, piece's offset, piece's
/// length)`.
fn pieces(ranges: &[(u64, u64)]) -> impl Iterator<Item = (u64, u64, usize)> + '_ {
    ranges.iter().flat_map(|&(o, l)| {
        (o..o + l)
            .step_by(IO_SIZE)
            .map(move |at| (o, at, (o + l - at).min(IO_SIZE as u64) as usize))
    })
}

/// Writes stream `stream`'s pattern over each `(offset, length)` range,
/// then fsyncs; returns the time taken.
pub fn write_ranges(f: &File, ranges: &[(u64, u64)], stream: u64) -> io::Result<Duration> {
    let start = Instant::now();
    let mut buf = AlignedBuf::new(IO_SIZE);
    for (_, at, n) in pieces(ranges) {
        let b = buf.get(n);
        pattern(b, stream, at);
        f.write_all_at(b, at)?;
    }
    f.sync_all()?;
    Ok(start.elapsed())
}

/// What reading some ranges took and found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOutcome {
    pub took: Duration,
    pub bytes: u64,
    pub checksum: Checksum,
}

/// Reads the ranges in order and checksums them.
pub fn read_ranges(f: &File, ranges: &[(u64, u64)]) -> io::Result<ReadOutcome> {
    let start = Instant::now();
    let mut buf = AlignedBuf::new(IO_SIZE);
    let (mut sum, mut bytes) = (Checksum::default(), 0);
    for (_, at, n) in pieces(ranges) {
        let b = buf.get(n);
        f.read_exact_at(b, at)?;
        sum.update(b);
        bytes += n as u64;
    }
    Ok(ReadOutcome {
        took: start.elapsed(),
        bytes,
        checksum: sum,
    })
}

/// The first range whose bytes are not stream `stream`'s pattern, if any.
pub fn first_mismatch(f: &File, ranges: &[(u64, u64)], stream: u64) -> io::Result<Option<u64>> {
    let mut buf = AlignedBuf::new(IO_SIZE);
    let mut want = vec![0u8; IO_SIZE];
    for (o, at, n) in pieces(ranges) {
        let b = buf.get(n);
        f.read_exact_at(b, at)?;
        pattern(&mut want[..n], stream, at);
        if b != &want[..n] {
            return Ok(Some(o));
        }
    }
    Ok(None)
}

/// `count` distinct chunk offsets (multiples of `chunk`, whole chunks
/// within `size`) picked at random from `seed`, in ascending order.
pub fn pick_chunks(size: u64, chunk: u64, count: u64, seed: u64) -> Vec<u64> {
    let total = size / chunk;
    let count = count.min(total) as usize;
    let mut all: Vec<u64> = (0..total).collect();
    let mut state = seed;
    // A partial Fisher-Yates shuffle: the first `count` are the pick.
    for i in 0..count {
        state = splitmix(state);
        let j = i + (state % (total - i as u64)) as usize;
        all.swap(i, j);
    }
    let mut out: Vec<u64> = all[..count].iter().map(|c| c * chunk).collect();
    out.sort_unstable();
    out
}

/// How many chunks a percentage of `size` is (at least one, when the
/// percentage is above 0).
pub fn chunk_count(size: u64, chunk: u64, percent: f64) -> u64 {
    let bytes = size as f64 * percent / 100.0;
    ((bytes / chunk as f64).ceil() as u64).max(u64::from(percent > 0.0))
}

/// The chunks `[o, o + chunk)` (offsets ascending) that sorted, disjoint
/// `runs` do not cover entirely.
pub fn uncovered(runs: &[(u64, u64)], chunks: &[u64], chunk: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut i = 0;
    for &c in chunks {
        // Skip the runs that end at or before the chunk's start.
        while i < runs.len() && runs[i].0 + runs[i].1 <= c {
            i += 1;
        }
        let covered = runs
            .get(i)
            .is_some_and(|&(o, l)| o <= c && c + chunk <= o + l);
        if !covered {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned() {
        for len in [1, 4096, 1 << 20] {
            let mut b = AlignedBuf::new(len);
            let s = b.get(len);
            assert_eq!(s.as_ptr() as usize % ALIGN, 0);
            assert_eq!(s.len(), len);
        }
    }

    #[test]
    fn the_pattern_is_a_function_of_stream_and_offset() {
        let mut whole = vec![0u8; 4096];
        pattern(&mut whole, 7, 8192);
        let mut tail = vec![0u8; 1024];
        pattern(&mut tail, 7, 8192 + 3072);
        assert_eq!(&whole[3072..], &tail[..]);
        let mut other = vec![0u8; 4096];
        pattern(&mut other, 8, 8192);
        assert_ne!(whole, other);
    }

    #[test]
    fn checksums_see_order_and_content() {
        let sum = |parts: &[&[u8]]| {
            let mut c = Checksum::default();
            for p in parts {
                c.update(p);
            }
            c
        };
        assert_eq!(
            sum(&[b"abcdefgh", b"ijklmnop"]),
            sum(&[b"abcdefghijklmnop"])
        );
        assert_ne!(
            sum(&[b"abcdefgh", b"ijklmnop"]),
            sum(&[b"ijklmnop", b"abcdefgh"])
        );
        assert_ne!(sum(&[b"abc"]), sum(&[b"abd"]));
    }

    #[test]
    fn picks_are_distinct_aligned_sorted_and_seeded() {
        let p = pick_chunks(1 << 20, 4096, 40, 1);
        assert_eq!(p.len(), 40);
        assert!(p.windows(2).all(|w| w[0] < w[1]));
        assert!(p.iter().all(|o| o % 4096 == 0 && o + 4096 <= 1 << 20));
        assert_eq!(p, pick_chunks(1 << 20, 4096, 40, 1));
        assert_ne!(p, pick_chunks(1 << 20, 4096, 40, 2));
        // More than there are: all of them.
        assert_eq!(pick_chunks(16384, 4096, 9, 3), [0, 4096, 8192, 12288]);
        assert_eq!(chunk_count(1 << 30, 65536, 1.0), 164);
        assert_eq!(chunk_count(1 << 30, 65536, 100.0), 16384);
        assert_eq!(chunk_count(1 << 20, 65536, 0.0001), 1);
        assert_eq!(chunk_count(1 << 20, 65536, 0.0), 0);
    }

    #[test]
    fn uncovered_names_the_chunks_no_run_holds_whole() {
        let runs = [(0, 8192), (65536, 65536), (200_000, 4096)];
        // 202_000: its start is in the last run, its end past it.
        let chunks = [0, 4096, 8192, 65536, 126_976, 131_072, 200_000, 202_000];
        assert_eq!(uncovered(&runs, &chunks, 4096), [8192, 131_072, 202_000]);
        assert_eq!(uncovered(&[], &[0], 1), [0]);
        assert!(uncovered(&[(0, 1 << 20)], &[0, 4096, 1_044_480], 4096).is_empty());
    }

    /// Write, read back and check on a file (with O_DIRECT where the
    /// filesystem has it).
    #[test]
    fn ranges_written_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        std::fs::write(&path, vec![0u8; 3 << 20]).unwrap();
        let f = open(&path, true, true)
            .or_else(|_| open(&path, true, false))
            .unwrap();
        assert_eq!(size_of(&f).unwrap(), 3 << 20);
        write_ranges(&f, &[(0, 3 << 20)], 1).unwrap();
        write_ranges(&f, &[(1 << 20, 8192), (2 << 20, 4096)], 2).unwrap();
        assert_eq!(first_mismatch(&f, &[(0, 1 << 20)], 1).unwrap(), None);
        assert_eq!(
            first_mismatch(&f, &[(1 << 20, 8192), (2 << 20, 4096)], 2).unwrap(),
            None
        );
        assert_eq!(
            first_mismatch(&f, &[(0, 4096), (1 << 20, 4096)], 1).unwrap(),
            Some(1 << 20)
        );
        let whole = read_ranges(&f, &[(0, 3 << 20)]).unwrap();
        assert_eq!(whole.bytes, 3 << 20);
        let split = read_ranges(&f, &[(0, 1 << 20), (1 << 20, 2 << 20)]).unwrap();
        assert_eq!(whole.checksum, split.checksum);
        let part = read_ranges(&f, &[(1 << 20, 8192)]).unwrap();
        assert_eq!(part.bytes, 8192);
        assert_ne!(part.checksum, whole.checksum);
    }
}
