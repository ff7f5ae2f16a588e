//! The SnapshotMetadata service's operations: the allocated blocks of a
//! snapshot (GetMetadataAllocated) and the blocks that differ between two
//! snapshots of one volume (GetMetadataDelta), as streams of pages.
//!
//! Answers are `VARIABLE_LENGTH`: each tuple is a run of consecutive
//! blocks of the pool (its chunk size), merged, so a volume of terabytes
//! written end to end is one tuple, not millions. Every tuple starts and
//! ends on a block boundary of the snapshot's device, except where the
//! volume ends (or, for an encrypted volume, where its LUKS header ends:
//! offsets are the opened LUKS device's, which is what a restored volume's
//! reader sees). Tuples are in ascending order, disjoint and never
//! adjacent, and a call from `starting_offset` (rounded down to a block
//! boundary, as the spec allows) gives exactly the tuples an uncut call
//! gives from there, so a stream cut off is resumed from the end of the
//! last tuple received.

use super::{lock, Refusal, Result};
use crate::driver::{Driver, Kind};
use crate::ids::{truncate, ParsedId, VolumeId};
use crate::locks::VolumeGuard;
use crate::pool::{BlockMaps, Extent, Extents, MappedSnapshot, Window};

/// Tuples a message when the request leaves it to the plugin
/// (`max_results` 0): about 22 KiB of protobuf.
pub const DEFAULT_PAGE: usize = 1024;
/// The most tuples a message, whatever was asked: the spec lets the plugin
/// send fewer, and this keeps a message far below gRPC's 4 MiB default.
pub const MAX_PAGE: usize = 65_536;

/// Where an answer starts and how long its pages are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Paging {
    /// `starting_offset`, in bytes of the volume.
    pub start: u64,
    /// Tuples a message, at least 1.
    pub max: usize,
}

impl Paging {
    /// From a request's `max_results` (0: [`DEFAULT_PAGE`]; at most
    /// [`MAX_PAGE`]).
    pub fn new(start: u64, max_results: u32) -> Self {
        let max = match max_results {
            0 => DEFAULT_PAGE,
            n => (n as usize).min(MAX_PAGE),
        };
        Paging { start, max }
    }
}

/// A decoded GetMetadataAllocatedRequest.
#[derive(Debug)]
pub struct Allocated {
    pub snapshot: ParsedId,
    pub paging: Paging,
}

/// A decoded GetMetadataDeltaRequest.
#[derive(Debug)]
pub struct Delta {
    pub base: ParsedId,
    pub target: ParsedId,
    pub paging: Paging,
}

/// An answer being read: its pages, as the caller asks for them. Dropped
/// before its end (the client went away), it gives back what it holds: the
/// tool is killed and the pool's metadata snapshot released.
pub struct BlockPages {
    /// The volume's size as its readers see it (`volume_capacity_bytes`).
    pub capacity: u64,
    extents: Box<dyn Extents>,
    window: Window,
    from: u64,
    max: usize,
    sent: bool,
    done: bool,
}

impl std::fmt::Debug for BlockPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockPages")
            .field("capacity", &self.capacity)
            .field("window", &self.window)
            .field("from", &self.from)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl BlockPages {
    fn new(extents: Box<dyn Extents>, window: Window, start: u64, max: usize) -> Self {
        let from = aligned_start(start, window, extents.block_size());
        BlockPages {
            capacity: window.capacity,
            extents,
            window,
            from,
            max: max.max(1),
            sent: false,
            done: false,
        }
    }

    /// The next page: at most `max` tuples, in the volume's bytes (None:
    /// the answer is complete). An answer with no tuple at all is one
    /// empty page, so that the capacity reaches the client.
    pub async fn next_page(&mut self) -> Result<Option<Vec<Extent>>> {
        let mut page = Vec::new();
        while !self.done && page.len() < self.max {
            match self.extents.next().await? {
                Some(e) => page.extend(visible(e, self.window, self.from)),
                None => self.done = true,
            }
        }
        if page.is_empty() && self.sent {
            return Ok(None);
        }
        self.sent = true;
        Ok(Some(page))
    }
}

/// Where an answer from `start` (bytes of the volume) begins: rounded down
/// to a block boundary of the device below.
pub fn aligned_start(start: u64, window: Window, block: u64) -> u64 {
    if block == 0 {
        return start;
    }
    let on_device = window.skip.saturating_add(start);
    start.saturating_sub(on_device % block)
}

/// The part of extent `e` (bytes of the snapshot's device) that the
/// volume's readers see from `from` on, in the volume's bytes.
pub fn visible(e: Extent, window: Window, from: u64) -> Option<Extent> {
    let lo = e.offset.max(window.skip.saturating_add(from));
    let hi = e.end().min(window.skip.saturating_add(window.capacity));
    (lo < hi).then(|| Extent {
        offset: lo - window.skip,
        length: hi - lo,
    })
}

/// A starting offset past the volume's end is the spec's OUT_OF_RANGE.
fn check_start(start: u64, window: Window) -> Result<()> {
    if start >= window.capacity {
        return Err(Refusal::PastTheEnd {
            start,
            capacity: window.capacity,
        }
        .into());
    }
    Ok(())
}

/// Whether some pool of this node keeps block maps of its snapshots (the
/// driver advertises SNAPSHOT_METADATA_SERVICE then).
pub(super) fn offers_block_maps(d: &Driver) -> bool {
    d.pools.iter().any(|p| p.block_maps().is_some())
}

/// The snapshot an id names: NOT_FOUND for an id that cannot be one here.
fn snapshot_id(id: ParsedId, field: &'static str) -> Result<VolumeId> {
    match id {
        ParsedId::Volume(id) => Ok(id),
        ParsedId::Foreign(raw) => Err(Refusal::Missing {
            kind: field,
            id: truncate(&raw).to_owned(),
        }
        .into()),
    }
}

/// The block maps of `id`'s pool: NOT_FOUND without the pool,
/// UNAVAILABLE while it cannot serve, FAILED_PRECONDITION for a snapshot
/// whose pool keeps no block map (thick, dir).
async fn maps_of<'d>(d: &'d Driver, id: &VolumeId) -> Result<&'d dyn BlockMaps> {
    let Some(pool) = d.pools.get(&id.pool) else {
        return Err(Refusal::Missing {
            kind: "snapshot",
            id: id.to_string(),
        }
        .into());
    };
    d.require_usable(&id.pool)?;
    if let Some(maps) = pool.block_maps() {
        return Ok(maps);
    }
    // A pool that takes snapshots but keeps no map of them (thick): said
    // of one that exists. One that takes none (dir) can hold none.
    if let Some(s) = pool.snapshots() {
        if s.get_snapshot(id).await?.is_none() {
            return Err(Refusal::Missing {
                kind: "snapshot",
                id: id.to_string(),
            }
            .into());
        }
    }
    Err(Refusal::NoBlockMap {
        pool: pool.name().to_string(),
        backend: pool.backend().as_str(),
    }
    .into())
}

/// The service is answered only where a pool keeps block maps.
fn offered(d: &Driver) -> Result<()> {
    match offers_block_maps(d) {
        true => Ok(()),
        false => Err(Refusal::Unsupported("SnapshotMetadata without a thin LVM pool").into()),
    }
}

/// GetMetadataAllocated: the snapshot's lock while it is looked up and
/// its pool's metadata snapshot taken; the pages are read after.
pub async fn metadata_allocated(d: &Driver, req: Allocated) -> Result<BlockPages> {
    offered(d)?;
    let id = snapshot_id(req.snapshot, "snapshot")?;
    let _guard = lock(d, Kind::Snapshot, "snapshot_id", &id.to_string())?;
    let maps = maps_of(d, &id).await?;
    let snap = maps.mapped_snapshot(&id).await?;
    check_start(req.paging.start, snap.window)?;
    let extents = maps.allocated(&snap).await?;
    Ok(BlockPages::new(
        extents,
        snap.window,
        req.paging.start,
        req.paging.max,
    ))
}

/// The locks of a delta's two snapshots (one when they are the same).
fn lock_both(d: &Driver, base: &VolumeId, target: &VolumeId) -> Result<Vec<VolumeGuard>> {
    let mut guards = vec![lock(
        d,
        Kind::Snapshot,
        "base_snapshot_id",
        &base.to_string(),
    )?];
    if target != base {
        guards.push(lock(
            d,
            Kind::Snapshot,
            "target_snapshot_id",
            &target.to_string(),
        )?);
    }
    Ok(guards)
}

/// Two snapshots of one volume (INVALID_ARGUMENT otherwise). The volume
/// may have grown between them; its LUKS header, if any, is the same.
fn same_volume(base: &MappedSnapshot, target: &MappedSnapshot) -> Result<()> {
    if base.source_volume != target.source_volume {
        return Err(Refusal::Unfit(format!(
            "snapshot {} is of volume {} and snapshot {} of volume {}: a delta is between snapshots of one volume",
            base.id, base.source_volume, target.id, target.source_volume
        ))
        .into());
    }
    if base.window.skip != target.window.skip {
        return Err(Refusal::Unfit(format!(
            "snapshots {} and {} of volume {} have LUKS headers of different sizes",
            base.id, target.id, base.source_volume
        ))
        .into());
    }
    Ok(())
}

/// GetMetadataDelta: both snapshots locked and looked up, both of one
/// volume, then the pool's metadata snapshot taken; the capacity is the
/// target's.
pub async fn metadata_delta(d: &Driver, req: Delta) -> Result<BlockPages> {
    offered(d)?;
    let base = snapshot_id(req.base, "base snapshot")?;
    let target = snapshot_id(req.target, "target snapshot")?;
    let _guards = lock_both(d, &base, &target)?;
    let maps = maps_of(d, &target).await?;
    let t = maps.mapped_snapshot(&target).await?;
    if base.pool != target.pool {
        // Another pool's snapshot is another volume's (a volume's
        // snapshots are in its pool), if it exists at all.
        maps_of(d, &base).await?.mapped_snapshot(&base).await?;
        return Err(Refusal::Unfit(format!(
            "snapshots {base} and {target} are in different pools: a delta is between snapshots of one volume"
        ))
        .into());
    }
    let b = maps.mapped_snapshot(&base).await?;
    same_volume(&b, &t)?;
    check_start(req.paging.start, t.window)?;
    let extents = maps.changed(&b, &t).await?;
    Ok(BlockPages::new(
        extents,
        t.window,
        req.paging.start,
        req.paging.max,
    ))
}

#[cfg(test)]
mod tests;
