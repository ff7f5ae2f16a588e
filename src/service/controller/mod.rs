//! CSI Controller service. With external-provisioner in `--node-deployment`
//! mode it runs on every node and only creates volumes for its own node.
//! Each handler decodes its request, calls its operation (`ops`) and
//! encodes the answer.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{decode_capabilities, decode_params, rpc, to_i64, Driver, Result};
use crate::csi;
use crate::csi::controller_service_capability::{rpc::Type as RpcType, Rpc, Type as CapType};
use crate::ids::{check_text, VolumeId, VolumeName, STORAGE_ID_KEY};
use crate::ops::{self, Cluster, Refusal, VolumeEntry};

mod decode;
pub(super) use decode::decode_snapshot_params;
use decode::*;

pub struct ControllerService {
    driver: Arc<Driver>,
    /// What the cluster knows of other nodes' free space (expansion).
    cluster: Cluster,
}

impl ControllerService {
    pub fn new(driver: Arc<Driver>) -> Self {
        Self {
            driver,
            cluster: Cluster::default(),
        }
    }

    /// A service that asks `client` (a test's fake API server) about other
    /// nodes' free space.
    #[cfg(test)]
    pub fn with_cluster(driver: Arc<Driver>, client: kube::Client) -> Self {
        let cluster = Cluster::with(client, &driver.name);
        Self { driver, cluster }
    }

    /// The volume as CSI has it; its context names the storage it lives on
    /// ([`STORAGE_ID_KEY`]), which the PV keeps in its volume attributes.
    fn to_csi(&self, v: &VolumeEntry) -> csi::Volume {
        let storage = v
            .storage
            .as_ref()
            .map(|s| (STORAGE_ID_KEY.to_owned(), s.to_string()));
        csi::Volume {
            capacity_bytes: to_i64(v.volume.size_bytes),
            volume_id: v.volume.id.to_string(),
            volume_context: storage.into_iter().collect(),
            content_source: None,
            accessible_topology: vec![super::topology(&self.driver.node_id)],
        }
    }
}

/// The nodes a request's topology names, requisite first.
fn decode_topology(req: Option<&csi::TopologyRequirement>) -> Vec<Option<String>> {
    let Some(t) = req else { return vec![] };
    t.requisite
        .iter()
        .chain(&t.preferred)
        .map(super::node_of)
        .collect()
}

/// A CreateVolumeRequest decoded (also `localvol config check`'s, for a
/// StorageClass: `super::classes`).
pub(super) fn decode_new_volume(req: &csi::CreateVolumeRequest) -> Result<ops::NewVolume> {
    Ok(ops::NewVolume {
        name: VolumeName::parse(&req.name)?,
        caps: decode_capabilities(&req.volume_capabilities)?,
        range: super::decode_range(req.capacity_range.as_ref())?,
        params: decode_params(&req.parameters)?,
        content: decode_content_source(req.volume_content_source.as_ref())?,
        io_limits: decode_io_change(&req.mutable_parameters)?.apply_to(Default::default()),
        topology: decode_topology(req.accessibility_requirements.as_ref()),
    })
}

/// A list request's page: a negative `max_entries` is INVALID_ARGUMENT.
fn list_page(token: &str, max_entries: i32) -> Result<ops::ListPage> {
    Ok(ops::ListPage {
        token: token.to_owned(),
        max: decode_max_entries(max_entries)?,
    })
}

#[tonic::async_trait]
impl csi::controller_server::Controller for ControllerService {
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("CreateVolume", &req.name, async {
            let new = decode_new_volume(&req)?;
            let made = ops::create_volume(&self.driver, new).await?;
            let mut volume = self.to_csi(&made.entry);
            volume.content_source = req.volume_content_source.clone();
            volume.volume_context.extend(made.format);
            Ok(csi::CreateVolumeResponse {
                volume: Some(volume),
            })
        })
        .await
    }

    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("DeleteVolume", &req.volume_id, async {
            let id = VolumeId::parse("volume_id", &req.volume_id)?;
            ops::delete_volume(&self.driver, id).await?;
            Ok(csi::DeleteVolumeResponse {})
        })
        .await
    }

    async fn controller_publish_volume(
        &self,
        _req: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        rpc("ControllerPublishVolume", "", async {
            Err(Refusal::NotNeeded("ControllerPublishVolume").into())
        })
        .await
    }

    async fn controller_unpublish_volume(
        &self,
        _req: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        rpc("ControllerUnpublishVolume", "", async {
            Err(Refusal::NotNeeded("ControllerUnpublishVolume").into())
        })
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let req = req.into_inner();
        rpc("ValidateVolumeCapabilities", &req.volume_id, async {
            check_text("volume_id", &req.volume_id)?;
            if req.volume_capabilities.is_empty() {
                return Err(Status::invalid_argument("volume_capabilities is required"));
            }
            // Decoded one by one: an unsupported capability is an answer,
            // not an error.
            let caps = (req.volume_capabilities.iter())
                .map(|c| super::decode_capability(c).map_err(|e| e.to_string()))
                .collect();
            let params = decode_params(&req.parameters).err().map(|e| e.to_string());
            let unsupported = ops::validate(&self.driver, &req.volume_id, caps, params).await?;
            Ok(match unsupported {
                Some(message) => csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message,
                },
                None => csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                        volume_context: req.volume_context,
                        volume_capabilities: req.volume_capabilities,
                        parameters: req.parameters,
                        mutable_parameters: req.mutable_parameters,
                    }),
                    message: String::new(),
                },
            })
        })
        .await
    }

    async fn list_volumes(
        &self,
        req: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        let req = req.into_inner();
        rpc("ListVolumes", "", async {
            let page = list_page(&req.starting_token, req.max_entries)?;
            let page = ops::list_volumes(&self.driver, page).await?;
            Ok(csi::ListVolumesResponse {
                entries: (page.entries.iter())
                    .map(|v| csi::list_volumes_response::Entry {
                        volume: Some(self.to_csi(v)),
                        status: None,
                    })
                    .collect(),
                next_token: page.next_token,
            })
        })
        .await
    }

    async fn get_capacity(
        &self,
        req: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        let req = req.into_inner();
        rpc("GetCapacity", "", async {
            let access = (req.volume_capabilities.iter())
                .map(|c| Ok(super::decode_capability(c)?.access_type))
                .collect::<Result<_>>()?;
            let query = ops::CapacityQuery {
                pool: decode_params(&req.parameters)?.pool,
                access,
                node: req.accessible_topology.as_ref().map(super::node_of),
            };
            let (available, max) = ops::capacity(&self.driver, query).await?;
            Ok(csi::GetCapacityResponse {
                available_capacity: to_i64(available),
                maximum_volume_size: Some(to_i64(max)),
                minimum_volume_size: None,
            })
        })
        .await
    }

    async fn controller_get_capabilities(
        &self,
        _req: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        let cap = |t: RpcType| csi::ControllerServiceCapability {
            r#type: Some(CapType::Rpc(Rpc { r#type: t as i32 })),
        };
        rpc("ControllerGetCapabilities", "", async {
            // EXPAND_VOLUME: a central (leader-elected) external-resizer calls
            // ControllerExpandVolume on whichever node it runs on; see
            // `ops::expand_volume` for how a volume elsewhere is answered.
            let mut capabilities = vec![
                cap(RpcType::CreateDeleteVolume),
                cap(RpcType::ListVolumes),
                cap(RpcType::GetCapacity),
                cap(RpcType::SingleNodeMultiWriter),
                cap(RpcType::ExpandVolume),
                cap(RpcType::ModifyVolume),
            ];
            // Only pools that can snapshot make the driver advertise it.
            if ops::offers_snapshots(&self.driver) {
                capabilities.extend([
                    cap(RpcType::CreateDeleteSnapshot),
                    cap(RpcType::ListSnapshots),
                    cap(RpcType::CloneVolume),
                ]);
            }
            Ok(csi::ControllerGetCapabilitiesResponse { capabilities })
        })
        .await
    }

    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let req = req.into_inner();
        rpc("CreateSnapshot", &req.source_volume_id, async {
            ops::snapshots_offered(&self.driver)?;
            let new = ops::NewSnapshot {
                name: VolumeName::parse(&req.name)?,
                cow_size: decode_snapshot_params(&req.parameters)?,
                source: VolumeId::parse("source_volume_id", &req.source_volume_id)?,
            };
            let snap = ops::create_snapshot(&self.driver, new).await?;
            Ok(csi::CreateSnapshotResponse {
                snapshot: Some(snapshot_to_csi(&snap)),
            })
        })
        .await
    }

    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let req = req.into_inner();
        rpc("DeleteSnapshot", &req.snapshot_id, async {
            ops::snapshots_offered(&self.driver)?;
            let id = VolumeId::parse("snapshot_id", &req.snapshot_id)?;
            ops::delete_snapshot(&self.driver, id).await?;
            Ok(csi::DeleteSnapshotResponse {})
        })
        .await
    }

    async fn list_snapshots(
        &self,
        req: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        let req = req.into_inner();
        rpc("ListSnapshots", &req.snapshot_id, async {
            ops::snapshots_offered(&self.driver)?;
            let page = list_page(&req.starting_token, req.max_entries)?;
            let filter = decode_snapshot_filter(&req.snapshot_id, &req.source_volume_id)?;
            let page = ops::list_snapshots(&self.driver, filter, page).await?;
            Ok(csi::ListSnapshotsResponse {
                entries: (page.entries.iter())
                    .map(|s| csi::list_snapshots_response::Entry {
                        snapshot: Some(snapshot_to_csi(s)),
                    })
                    .collect(),
                next_token: page.next_token,
            })
        })
        .await
    }

    async fn controller_expand_volume(
        &self,
        req: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("ControllerExpandVolume", &req.volume_id, async {
            check_text("volume_id", &req.volume_id)?;
            let range = super::decode_range(req.capacity_range.as_ref())?;
            if range.required == 0 && range.limit == 0 {
                return Err(Status::invalid_argument("capacity_range is required"));
            }
            let expand = ops::Expand {
                volume_id: req.volume_id.clone(),
                range,
            };
            let r = ops::expand_volume(&self.driver, &self.cluster, expand).await?;
            Ok(csi::ControllerExpandVolumeResponse {
                capacity_bytes: to_i64(r.size_bytes),
                node_expansion_required: r.node_expansion_required,
            })
        })
        .await
    }

    async fn controller_get_volume(
        &self,
        _req: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        rpc("ControllerGetVolume", "", async {
            Err(Refusal::Unsupported("ControllerGetVolume").into())
        })
        .await
    }

    /// IO limits are the only mutable parameters (`ops::modify_volume`).
    async fn controller_modify_volume(
        &self,
        req: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("ControllerModifyVolume", &req.volume_id, async {
            check_text("volume_id", &req.volume_id)?;
            let modify = ops::Modify {
                volume_id: req.volume_id.clone(),
                change: decode_io_change(&req.mutable_parameters)?,
            };
            ops::modify_volume(&self.driver, &self.cluster, modify).await?;
            Ok(csi::ControllerModifyVolumeResponse {})
        })
        .await
    }
}

#[cfg(test)]
mod tests;
