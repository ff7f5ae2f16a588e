//! CSI SnapshotMetadata service (changed-block tracking), served on the
//! node plugin's socket beside Identity, Controller and Node: each handler
//! decodes its request, calls its operation (`ops/metadata.rs`) and encodes
//! the pages it reads as the answer's stream. A client that goes away
//! drops the stream, and with it what the operation holds (the metadata
//! tool, the pool's metadata snapshot).

use std::pin::Pin;

use futures::Stream;
use tonic::{Request, Response, Status};

use super::gate::Opened;
use super::{rpc, to_i64, Result};
use crate::csi;
use crate::ids::VolumeId;
use crate::ops::{self, BlockPages, Paging};
use crate::pool::Extent;

pub struct SnapshotMetadataService {
    opened: Opened,
}

impl SnapshotMetadataService {
    /// UNAVAILABLE until `opened` is set (`service/gate.rs`).
    pub fn opening(opened: Opened) -> Self {
        Self { opened }
    }
}

/// An answer's stream of messages.
pub type Pages<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// `starting_offset` and `max_results`: negative is INVALID_ARGUMENT.
fn decode_paging(starting_offset: i64, max_results: i32) -> Result<Paging> {
    let start = super::bytes("starting_offset", starting_offset)?;
    let max = u32::try_from(max_results).map_err(|_| {
        Status::invalid_argument(format!(
            "max_results must not be negative (got {max_results})"
        ))
    })?;
    Ok(Paging::new(start, max))
}

fn encode(page: Vec<Extent>) -> Vec<csi::BlockMetadata> {
    page.into_iter()
        .map(|e| csi::BlockMetadata {
            byte_offset: to_i64(e.offset),
            size_bytes: to_i64(e.length),
        })
        .collect()
}

/// The pages as a stream of messages made by `message` (from the
/// capacity and the page's tuples); an error mid-stream ends it with its
/// status.
fn stream<T: Send + 'static>(
    method: &'static str,
    pages: BlockPages,
    message: fn(i64, Vec<csi::BlockMetadata>) -> T,
) -> Pages<T> {
    let capacity = to_i64(pages.capacity);
    Box::pin(futures::stream::unfold(
        Some(pages),
        move |state| async move {
            let mut pages = state?;
            match pages.next_page().await {
                Ok(Some(page)) => Some((Ok(message(capacity, encode(page))), Some(pages))),
                Ok(None) => None,
                Err(e) => {
                    let status: Status = e.into();
                    tracing::info!(method, error = status.message(), "stream ended by an error");
                    Some((Err(status), None))
                }
            }
        },
    ))
}

const VARIABLE: i32 = csi::BlockMetadataType::VariableLength as i32;

#[tonic::async_trait]
impl csi::snapshot_metadata_server::SnapshotMetadata for SnapshotMetadataService {
    type GetMetadataAllocatedStream = Pages<csi::GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Pages<csi::GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        req: Request<csi::GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let req = req.into_inner();
        rpc("GetMetadataAllocated", &req.snapshot_id, async {
            let d = self.opened.get()?;
            let q = ops::Allocated {
                snapshot: VolumeId::parse("snapshot_id", &req.snapshot_id)?,
                paging: decode_paging(req.starting_offset, req.max_results)?,
            };
            let pages = ops::metadata_allocated(d, q).await?;
            Ok(stream("GetMetadataAllocated", pages, |capacity, tuples| {
                csi::GetMetadataAllocatedResponse {
                    block_metadata_type: VARIABLE,
                    volume_capacity_bytes: capacity,
                    block_metadata: tuples,
                }
            }))
        })
        .await
    }

    async fn get_metadata_delta(
        &self,
        req: Request<csi::GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let req = req.into_inner();
        rpc("GetMetadataDelta", &req.target_snapshot_id, async {
            let d = self.opened.get()?;
            let q = ops::Delta {
                base: VolumeId::parse("base_snapshot_id", &req.base_snapshot_id)?,
                target: VolumeId::parse("target_snapshot_id", &req.target_snapshot_id)?,
                paging: decode_paging(req.starting_offset, req.max_results)?,
            };
            let pages = ops::metadata_delta(d, q).await?;
            Ok(stream("GetMetadataDelta", pages, |capacity, tuples| {
                csi::GetMetadataDeltaResponse {
                    block_metadata_type: VARIABLE,
                    volume_capacity_bytes: capacity,
                    block_metadata: tuples,
                }
            }))
        })
        .await
    }
}
