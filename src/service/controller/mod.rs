//! CSI Controller service. With external-provisioner in `--node-deployment`
//! mode it runs on every node and only creates volumes for its own node.

use std::sync::Arc;

use tokio::sync::OnceCell;
use tonic::{Request, Response, Status};

use super::{decode_capabilities, decode_params, rpc, to_i64, Capability, Driver, Result};
use crate::csi;
use crate::csi::controller_service_capability::{rpc::Type as RpcType, Rpc, Type as CapType};

use super::status::Refusal;
use crate::driver::Kind;
use crate::ids::{truncate, ParsedId, PoolName, VolumeId, VolumeName, STORAGE_ID_KEY};
use crate::k8s::room::{Room, Verdict};
use crate::pool::{CapacityRange, ContentSource, CreateRequest, SnapshotRequest, Volume};
use crate::size::human;

mod decode;
use decode::*;

pub struct ControllerService {
    driver: Arc<Driver>,
    /// What the cluster knows of other nodes' free space (expansion).
    room: OnceCell<Option<Room>>,
}

impl ControllerService {
    /// UNIMPLEMENTED when no pool of this node takes snapshots (the
    /// capability is then not advertised either).
    fn snapshots_offered(&self) -> Result<()> {
        match self.driver.pools.any_snapshots() {
            true => Ok(()),
            false => Err(Refusal::NoSnapshots.into()),
        }
    }

    pub fn new(driver: Arc<Driver>) -> Self {
        Self {
            driver,
            room: OnceCell::new(),
        }
    }

    /// A service that asks `client` (a test's fake API server) about other
    /// nodes' free space.
    #[cfg(test)]
    pub fn with_cluster(driver: Arc<Driver>, client: kube::Client) -> Self {
        let room = Room::new(client, &driver.name);
        Self {
            driver,
            room: OnceCell::new_with(Some(Some(room))),
        }
    }

    /// The cluster's view of free space; None outside a cluster (looked up
    /// once: the in-cluster config does not come and go).
    async fn room(&self) -> Option<&Room> {
        self.room
            .get_or_init(|| async {
                match crate::k8s::in_cluster_client().await {
                    Ok(client) => Some(Room::new(client, &self.driver.name)),
                    Err(e) => {
                        tracing::info!(error = %e, "no cluster: expansion of volumes on other nodes is checked by their node only");
                        None
                    }
                }
            })
            .await
            .as_ref()
    }

    /// ControllerExpandVolume of a volume this node does not hold. Volumes
    /// live on their node, and the resizer calls the driver on its own node;
    /// an id in our format may name a volume on another node, which applies
    /// the size in NodeExpandVolume. Before the PV grows, the cluster's
    /// CSIStorageCapacity for that node and class must have room for the
    /// growth (`k8s::room`). Anything not in our format is not ours.
    async fn expand_elsewhere(
        &self,
        volume_id: &str,
        range: CapacityRange,
    ) -> Result<csi::ControllerExpandVolumeResponse> {
        if !matches!(
            VolumeId::parse("volume_id", volume_id)?,
            ParsedId::Volume(_)
        ) {
            return Err(Refusal::NotOurs {
                id: truncate(volume_id).to_owned(),
            }
            .into());
        }
        let size = if range.required > 0 {
            range.required
        } else {
            range.limit
        };
        match self.room().await {
            None => {}
            Some(room) => match room.check(volume_id, size).await? {
                Verdict::NoGrowth => {}
                Verdict::Fits {
                    placement,
                    available,
                } => tracing::info!(
                    volume = %volume_id, node = %placement.node, growth = size - placement.size_bytes,
                    available, "the owning node has room; it applies the size in NodeExpandVolume"
                ),
                Verdict::Unknown(why) => tracing::warn!(
                    volume = %volume_id, %why,
                    "cannot check the owning node's room; it checks in NodeExpandVolume"
                ),
            },
        }
        Ok(csi::ControllerExpandVolumeResponse {
            capacity_bytes: to_i64(size),
            node_expansion_required: true,
        })
    }

    /// ControllerModifyVolume of a volume this node does not hold: accepted
    /// (the owning node applies the class it is moved to) when it is this
    /// driver's and its pool, as this node has it configured, takes limits.
    /// Without a cluster there is no other node: NOT_FOUND.
    async fn modify_elsewhere(
        &self,
        volume_id: &str,
        change: &crate::iolimit::IoChange,
    ) -> Result<csi::ControllerModifyVolumeResponse> {
        let ParsedId::Volume(id) = VolumeId::parse("volume_id", volume_id)? else {
            return Err(Refusal::NotOurs {
                id: truncate(volume_id).to_owned(),
            }
            .into());
        };
        if self.room().await.is_none() {
            return Err(Refusal::Missing {
                kind: "volume",
                id: truncate(volume_id).to_owned(),
            }
            .into());
        }
        if let Some(pool) = self.driver.pools.get(&id.pool) {
            refuse_io_limits(pool.as_ref(), &change.apply_to(Default::default()))?;
        }
        tracing::info!(volume = %volume_id, "not on this node: its node applies the new attributes when its PV names their class");
        Ok(csi::ControllerModifyVolumeResponse {})
    }

    /// The volume as CSI has it; its context names the storage it lives on
    /// ([`STORAGE_ID_KEY`]), which the PV keeps in its volume attributes.
    fn to_csi(&self, v: &Volume) -> csi::Volume {
        let storage = PoolName::parse(&v.pool)
            .ok()
            .and_then(|p| self.driver.pools.get(&p))
            .and_then(|p| p.storage_id())
            .map(|s| (STORAGE_ID_KEY.to_owned(), s.to_string()));
        csi::Volume {
            capacity_bytes: to_i64(v.size_bytes),
            volume_id: v.id.clone(),
            volume_context: storage.into_iter().collect(),
            content_source: None,
            accessible_topology: vec![super::topology(&self.driver.node_id)],
        }
    }

    /// A node creates a volume only when the request's topology includes it.
    fn check_topology(&self, req: Option<&csi::TopologyRequirement>) -> Result<()> {
        let Some(t) = req else { return Ok(()) };
        if t.requisite.is_empty() && t.preferred.is_empty() {
            return Ok(());
        }
        if t.requisite
            .iter()
            .chain(&t.preferred)
            .any(|seg| super::is_this_node(&self.driver, seg))
        {
            return Ok(());
        }
        Err(Refusal::NotInTopology {
            node: self.driver.node_id.clone(),
        }
        .into())
    }
}

#[tonic::async_trait]
impl csi::controller_server::Controller for ControllerService {
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("CreateVolume", &req.name, async {
            let name = VolumeName::parse(&req.name)?;
            let caps = decode_capabilities(&req.volume_capabilities)?;
            let range = super::decode_range(req.capacity_range.as_ref())?;
            let params = decode_params(&req.parameters)?;
            let content = decode_content_source(req.volume_content_source.as_ref())?;
            let io_limits = decode_io_change(&req.mutable_parameters)?.apply_to(Default::default());
            let d = &self.driver;
            let source_id = match &content {
                Some((kind, ParsedId::Volume(src))) => Some((*kind, src)),
                _ => None,
            };
            let pool = d.pool_for_new(params.pool.as_ref(), source_id)?;
            if params.encryption.is_some() && !pool.encrypts() {
                return Err(Status::invalid_argument(format!(
                    "{} applies to LVM pools; pool {} is {}",
                    super::PARAM_ENCRYPTION,
                    pool.name(),
                    pool.backend()
                )));
            }
            refuse_io_limits(pool.as_ref(), &io_limits)?;
            let access_type = access_type_of(&caps, pool.as_ref())?;
            let format = format_context(&params.format, &caps, access_type, pool.as_ref())?;
            let range = fit_filesystem(
                range,
                &caps,
                access_type,
                pool.default_fs_type(),
                params.encryption.is_some(),
                content.is_some(),
            )?;
            self.check_topology(req.accessibility_requirements.as_ref())?;
            let source = content_source(pool.as_ref(), content)?;
            let pool_name = pool.name().clone();

            let id = VolumeId::new(pool_name, &name);
            let source_id = match &source {
                Some(ContentSource::Snapshot(s) | ContentSource::Volume(s)) => Some(s),
                None => None,
            };
            let _locks = d.lock_with_source(
                id.key.as_str(),
                &format!("volume {:?}", name.as_str()),
                source_id,
            )?;
            d.refuse_name_elsewhere(pool.name(), &name, Kind::Volume)
                .await?;
            let vol = pool
                .create(&CreateRequest {
                    source,
                    id,
                    name,
                    range,
                    access_type,
                    inode_limit: params.inode_limit,
                    parameters: params.kept,
                    encryption: params.encryption,
                    io_limits,
                })
                .await?;
            let mut volume = self.to_csi(&vol);
            volume.content_source = req.volume_content_source.clone();
            volume.volume_context.extend(format);
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
            let ParsedId::Volume(id) = VolumeId::parse("volume_id", &req.volume_id)? else {
                return Ok(csi::DeleteVolumeResponse {});
            };
            let Some(pool) = self.driver.pools.get(&id.pool) else {
                return Ok(csi::DeleteVolumeResponse {});
            };
            self.driver.require_usable(&id.pool)?;
            let _guard = self.driver.lock_volume(&id)?;
            pool.delete(&id).await?;
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
            crate::ids::check_text("volume_id", &req.volume_id)?;
            if req.volume_capabilities.is_empty() {
                return Err(Status::invalid_argument("volume_capabilities is required"));
            }
            let (_, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            // Decode one by one: an unsupported capability is an answer, not an error.
            let mut unsupported = None;
            for c in &req.volume_capabilities {
                match super::decode_capability(c) {
                    Ok(cap)
                        if cap.access_type == vol.access_type && pool.supports(cap.access_type) => {
                    }
                    Ok(cap) => {
                        unsupported = Some(format!(
                            "volume is {:?}, capability asks for {:?}",
                            vol.access_type, cap.access_type
                        ))
                    }
                    Err(e) => unsupported = Some(e.to_string()),
                }
            }
            if let Err(e) = decode_params(&req.parameters) {
                unsupported = Some(e.to_string());
            }
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
            let max = decode_max_entries(req.max_entries)?;
            let token = req.starting_token.as_str();
            // One more than a page from each pool, from the token on: the
            // first max + 1 of them all are this page and the next token.
            // Pools that share a volume group read it with one `lvs`.
            let mut all = Vec::new();
            crate::lvm::one_lvs_per_vg(async {
                for pool in self.driver.pools.iter() {
                    let page = pool.list_page(token, max.saturating_add(1)).await;
                    let pools = &self.driver.pools;
                    all.extend(
                        pools
                            .unless_unusable(pool.name(), "ListVolumes", page)?
                            .into_iter()
                            .flatten(),
                    );
                }
                Ok::<_, Status>(())
            })
            .await?;
            all.sort_by(|a, b| a.id.cmp(&b.id));
            if !token.is_empty() && all.first().is_none_or(|v| v.id != token) {
                return Err(bad_token(token, "volume"));
            }
            let end = max.min(all.len());
            let next_token = all.get(end).map(|v| v.id.clone()).unwrap_or_default();
            if end >= crate::memory::LARGE_ANSWER {
                crate::memory::release_soon();
            }
            Ok(csi::ListVolumesResponse {
                entries: all[..end]
                    .iter()
                    .map(|v| csi::list_volumes_response::Entry {
                        volume: Some(self.to_csi(v)),
                        status: None,
                    })
                    .collect(),
                next_token,
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
            let caps: Vec<Capability> = req
                .volume_capabilities
                .iter()
                .map(super::decode_capability)
                .collect::<Result<_>>()?;
            let params = decode_params(&req.parameters)?;
            let d = &self.driver;
            let pool = d
                .pools
                .require(params.pool.as_ref().unwrap_or(d.pools.default_pool()))?;
            let elsewhere = req
                .accessible_topology
                .as_ref()
                .is_some_and(|t| !super::is_this_node(d, t));
            let unsupported = caps.iter().any(|c| !pool.supports(c.access_type));
            // A pool that cannot serve offers nothing: the scheduler then
            // places new claims on other nodes until it is back.
            let unusable = d.pools.unusable(pool.name()).is_some();
            if elsewhere || unsupported || unusable {
                return Ok(csi::GetCapacityResponse {
                    available_capacity: 0,
                    maximum_volume_size: Some(0),
                    minimum_volume_size: None,
                });
            }
            let cap = pool.capacity().await?;
            Ok(csi::GetCapacityResponse {
                available_capacity: to_i64(cap.available_bytes),
                maximum_volume_size: Some(to_i64(cap.maximum_volume_size)),
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
            // controller_expand_volume for how a volume elsewhere is answered.
            let mut capabilities = vec![
                cap(RpcType::CreateDeleteVolume),
                cap(RpcType::ListVolumes),
                cap(RpcType::GetCapacity),
                cap(RpcType::SingleNodeMultiWriter),
                cap(RpcType::ExpandVolume),
                cap(RpcType::ModifyVolume),
            ];
            // Only pools that can snapshot make the driver advertise it.
            if self.driver.pools.any_snapshots() {
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
            self.snapshots_offered()?;
            let name = VolumeName::parse(&req.name)?;
            let cow_size = decode_snapshot_params(&req.parameters)?;
            let source = match VolumeId::parse("source_volume_id", &req.source_volume_id)? {
                ParsedId::Volume(id) => id,
                ParsedId::Foreign(raw) => {
                    return Err(Refusal::Missing {
                        kind: "source volume",
                        id: truncate(&raw).to_owned(),
                    }
                    .into())
                }
            };
            let d = &self.driver;
            let pool = d.pool_of_source(&source)?;
            d.require_usable(pool.name())?;
            let Some(snapshots) = pool.snapshots() else {
                return Err(Status::invalid_argument(format!(
                    "pool {} ({}) does not support snapshots",
                    pool.name(),
                    pool.backend()
                )));
            };
            let id = VolumeId {
                pool: source.pool.clone(),
                key: name.snapshot_key(),
            };
            let _locks = d.lock_with_source(
                id.key.as_str(),
                &format!("snapshot {:?}", name.as_str()),
                Some(&source),
            )?;
            d.refuse_name_elsewhere(pool.name(), &name, Kind::Snapshot)
                .await?;
            let snap = snapshots
                .create_snapshot(&SnapshotRequest {
                    id,
                    name,
                    source,
                    cow_size,
                })
                .await?;
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
            self.snapshots_offered()?;
            let ParsedId::Volume(id) = VolumeId::parse("snapshot_id", &req.snapshot_id)? else {
                return Ok(csi::DeleteSnapshotResponse {});
            };
            // A pool this node lacks, or one without snapshots, holds no
            // such snapshot: deleting it is done.
            let pool = self.driver.pools.get(&id.pool);
            let Some(snapshots) = pool.and_then(|p| p.snapshots()) else {
                return Ok(csi::DeleteSnapshotResponse {});
            };
            self.driver.require_usable(&id.pool)?;
            let _guard = self.driver.lock_snapshot(&id)?;
            snapshots.delete_snapshot(&id).await?;
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
            self.snapshots_offered()?;
            let max = decode_max_entries(req.max_entries)?;
            let mut all = Vec::new();
            if !req.snapshot_id.is_empty() {
                // One snapshot by id; an id that cannot exist lists nothing.
                if let ParsedId::Volume(id) = VolumeId::parse("snapshot_id", &req.snapshot_id)? {
                    let pool = self.driver.pools.get(&id.pool);
                    if let Some(snapshots) = pool.and_then(|p| p.snapshots()) {
                        all.extend(snapshots.get_snapshot(&id).await?);
                    }
                }
            } else {
                for pool in self.driver.pools.iter() {
                    let Some(snapshots) = pool.snapshots() else {
                        continue;
                    };
                    let listed = snapshots.list_snapshots().await;
                    let pools = &self.driver.pools;
                    all.extend(
                        pools
                            .unless_unusable(pool.name(), "ListSnapshots", listed)?
                            .into_iter()
                            .flatten(),
                    );
                }
            }
            if !req.source_volume_id.is_empty() {
                crate::ids::check_text("source_volume_id", &req.source_volume_id)?;
                all.retain(|s| s.source_volume_id == req.source_volume_id);
            }
            all.sort_by(|a, b| a.id.cmp(&b.id));
            let (start, end, next_token) =
                page(&all, |s| &s.id, &req.starting_token, max, "snapshot")?;
            if end - start >= crate::memory::LARGE_ANSWER {
                crate::memory::release_soon();
            }
            Ok(csi::ListSnapshotsResponse {
                entries: all[start..end]
                    .iter()
                    .map(|s| csi::list_snapshots_response::Entry {
                        snapshot: Some(snapshot_to_csi(s)),
                    })
                    .collect(),
                next_token,
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
            crate::ids::check_text("volume_id", &req.volume_id)?;
            let range = super::decode_range(req.capacity_range.as_ref())?;
            if range.required == 0 && range.limit == 0 {
                return Err(Status::invalid_argument("capacity_range is required"));
            }
            let Some((id, pool, vol)) = self.driver.find("volume_id", &req.volume_id).await? else {
                return self.expand_elsewhere(&req.volume_id, range).await;
            };
            self.driver.require_usable(&id.pool)?;
            let _guard = self.driver.lock_volume(&id)?;
            let r = if pool.expands_on_node() {
                // The node that holds the device extends it in NodeExpandVolume;
                // here the request is checked against the pool's free space,
                // so the PV never grows beyond what NodeExpandVolume can do.
                let size = range.required.max(vol.size_bytes);
                if range.required < vol.size_bytes && !range.admits(vol.size_bytes) {
                    return Err(Refusal::Shrink {
                        id: id.to_string(),
                        size: vol.size_bytes,
                    }
                    .into());
                }
                let growth = size - vol.size_bytes;
                let available = pool.capacity().await?.available_bytes;
                if growth > available {
                    return Err(Refusal::NoRoomToGrow {
                        id: id.to_string(),
                        growth: human(growth),
                        pool: pool.name().to_string(),
                        available: human(available),
                        most: human(vol.size_bytes + available),
                    }
                    .into());
                }
                crate::pool::Expanded {
                    size_bytes: size,
                    node_expansion_required: true,
                }
            } else {
                pool.expand(&id, range).await?
            };
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

    /// IO limits are the only mutable parameters. The node that holds the
    /// volume records them (an LV tag) and writes them into the `io.max` of
    /// the pods that have it published, at once. external-resizer calls the
    /// driver on its own node, though: for a volume of another node the
    /// request is checked and accepted, external-resizer then points the
    /// PV at the new VolumeAttributesClass, and the owning node, which
    /// watches its PVs, applies that class's parameters (`k8s/attributes.rs`).
    async fn controller_modify_volume(
        &self,
        req: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("ControllerModifyVolume", &req.volume_id, async {
            crate::ids::check_text("volume_id", &req.volume_id)?;
            // No parameters (proto3 cannot tell an empty map from a missing
            // one): nothing to change, for a volume that must still exist.
            let change = decode_io_change(&req.mutable_parameters)?;
            let Some((id, pool, vol)) = self.driver.find("volume_id", &req.volume_id).await? else {
                return self.modify_elsewhere(&req.volume_id, &change).await;
            };
            self.driver.require_usable(&id.pool)?;
            let limits = change.apply_to(vol.io_limits);
            refuse_io_limits(pool.as_ref(), &limits)?;
            if !pool.limits_io() {
                // Nothing asked that such a pool could record.
                return Ok(csi::ControllerModifyVolumeResponse {});
            }
            let _guard = self.driver.lock_volume(&id)?;
            pool.set_io_limits(&id, limits).await?;
            crate::nodeops::enforce_io_limits(
                self.driver.cgroup_paths(),
                pool.source(&vol)?,
                &limits,
                None,
            )
            .await?;
            Ok(csi::ControllerModifyVolumeResponse {})
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::csi::controller_server::Controller;
    use crate::driver::Identity;
    use crate::ids::TOPOLOGY_KEY;
    use crate::k8s::fake::Fake;
    use serde_json::json;
    use tonic::Code;

    const GI: i64 = 1 << 30;

    const CAPS: &str = "/apis/storage.k8s.io/v1/namespaces/default/csistoragecapacities";

    /// A service on node n0 (one dir pool in `dir`) whose cluster holds
    /// volume `id` (1Gi, class "fast") on node n1, which has published
    /// `free` for that class.
    async fn on_n0(dir: &std::path::Path, fake: &Fake, id: &str, free: &str) -> ControllerService {
        let who = Identity {
            driver_name: "localvol.csi.dev".into(),
            node_id: "n0".into(),
            kubelet_dir: dir.join("kubelet"),
        };
        let driver = Driver::open(&who, &Config::embedded(dir)).await.unwrap();
        fake.put_pv(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-1"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "storageClassName": "fast",
                "csi": {"driver": "localvol.csi.dev", "volumeHandle": id},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": TOPOLOGY_KEY, "operator": "In", "values": ["n1"]}
                ]}]}},
            }
        }));
        fake.put(
            &format!("{CAPS}/cap-n1-fast"),
            json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
                "metadata": {"name": "cap-n1-fast", "namespace": "default"},
                "storageClassName": "fast",
                "nodeTopology": {"matchLabels": {TOPOLOGY_KEY: "n1"}},
                "capacity": free,
            }),
        );
        ControllerService::with_cluster(driver, fake.client.clone())
    }

    fn expand(id: &str, required: i64) -> Request<csi::ControllerExpandVolumeRequest> {
        Request::new(csi::ControllerExpandVolumeRequest {
            volume_id: id.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: required,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
    }

    /// The id volume `name` has in pool "thick" (of some other node).
    fn thick_id(name: &str) -> String {
        let name = VolumeName::parse(name).unwrap();
        VolumeId::new(PoolName::parse("thick").unwrap(), &name).to_string()
    }

    #[tokio::test]
    async fn expansion_on_another_node_must_fit_its_published_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake::start();
        let id = thick_id("pvc-1");
        let svc = on_n0(dir.path(), &fake, &id, "512Mi").await;

        // Growth beyond n1's 512Mi: refused before the PV can grow.
        let e = svc
            .controller_expand_volume(expand(&id, 2 * GI))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
        for part in ["node n1", "1Gi more", "512Mi free", "at most 1.5Gi"] {
            assert!(
                e.message().contains(part),
                "{part:?} missing: {}",
                e.message()
            );
        }
        // Growth within it: accepted, for n1 to apply.
        let r = svc
            .controller_expand_volume(expand(&id, GI + GI / 2))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.capacity_bytes, GI + GI / 2);
        assert!(r.node_expansion_required);
        // Only reads: nothing in the cluster was written.
        let log = fake.log();
        assert!(log.iter().all(|l| l.starts_with("LIST ")), "{log:?}");
        assert_eq!(log.len(), 4, "{log:?}");
    }

    #[tokio::test]
    async fn expansion_the_cluster_cannot_check_is_left_to_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake::start();
        let id = thick_id("pvc-2");
        // The cluster's PV names another volume: no capacity to check against.
        let svc = on_n0(dir.path(), &fake, "thick.other", "0").await;
        let r = svc
            .controller_expand_volume(expand(&id, 2 * GI))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.capacity_bytes, 2 * GI);
        assert!(r.node_expansion_required);
        // An id not in our format is no volume of ours, cluster or not.
        let e = svc
            .controller_expand_volume(expand("not-ours", GI))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
    }

    #[tokio::test]
    async fn an_api_server_that_fails_makes_the_resizer_retry() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake::start();
        let id = thick_id("pvc-3");
        let svc = on_n0(dir.path(), &fake, &id, "512Mi").await;
        drop(fake); // the server task stops: every request fails
        let e = svc
            .controller_expand_volume(expand(&id, 2 * GI))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    }

    fn modify(id: &str, kv: &[(&str, &str)]) -> Request<csi::ControllerModifyVolumeRequest> {
        Request::new(csi::ControllerModifyVolumeRequest {
            volume_id: id.into(),
            mutable_parameters: kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn modify_volume_is_advertised_and_validated_before_anything_else() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake::start();
        let id = thick_id("pvc-4");
        let svc = on_n0(dir.path(), &fake, &id, "512Mi").await;
        let caps = svc
            .controller_get_capabilities(Request::new(Default::default()))
            .await
            .unwrap()
            .into_inner();
        assert!(
            caps.capabilities.iter().any(|c| matches!(
                c.r#type,
                Some(CapType::Rpc(Rpc { r#type: t })) if t == RpcType::ModifyVolume as i32
            )),
            "{caps:?}"
        );
        for (kv, want) in [
            (vec![("iops", "5")], "unknown mutable parameter"),
            (vec![("readIOPS", "0")], "must be positive"),
            (vec![("writeBytesPerSecond", "fast")], "writeBytesPerSecond"),
        ] {
            let e = svc
                .controller_modify_volume(modify(&id, &kv))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{kv:?}: {e:?}");
            assert!(e.message().contains(want), "{kv:?}: {}", e.message());
        }
        // A volume of another node, in a pool this node does not have:
        // accepted, for its node to apply (the PV's new class).
        svc.controller_modify_volume(modify(&id, &[("readIOPS", "100")]))
            .await
            .unwrap();
        // Not this driver's id at all.
        let e = svc
            .controller_modify_volume(modify("not-ours", &[("readIOPS", "100")]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        // Nothing was written to the cluster.
        assert!(fake
            .log()
            .iter()
            .all(|l| !l.starts_with("PUT") && !l.starts_with("PATCH")));
    }

    #[tokio::test]
    async fn dir_volumes_take_no_io_limits() {
        let dir = tempfile::tempdir().unwrap();
        let who = Identity {
            driver_name: "localvol.csi.dev".into(),
            node_id: "n0".into(),
            kubelet_dir: dir.path().join("kubelet"),
        };
        let driver = Driver::open(&who, &Config::embedded(dir.path()))
            .await
            .unwrap();
        let svc = ControllerService::new(driver);
        let create = |kv: &[(&str, &str)]| csi::CreateVolumeRequest {
            name: "pvc-limits".into(),
            volume_capabilities: vec![csi::VolumeCapability {
                access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
                access_mode: Some(csi::volume_capability::AccessMode { mode: 1 }),
            }],
            mutable_parameters: kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        let e = svc
            .create_volume(Request::new(create(&[("writeIOPS", "50")])))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains("apply to LVM volumes"),
            "{}",
            e.message()
        );
        assert!(
            !dir.path().join("pool").join("volumes").exists()
                || std::fs::read_dir(dir.path().join("pool").join("volumes"))
                    .unwrap()
                    .next()
                    .is_none(),
            "a refused create left something behind"
        );
        // No limit asked: a dir volume like any other.
        let v = svc
            .create_volume(Request::new(create(&[("writeIOPS", "max")])))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let e = svc
            .controller_modify_volume(modify(&v.volume_id, &[("readBytesPerSecond", "1Mi")]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        // Without a cluster, a volume this node does not have is nowhere.
        let e = svc
            .controller_modify_volume(modify(
                "default.aaaaaaaaaaaaaaaaaaaaaaaaaa",
                &[("readIOPS", "1")],
            ))
            .await
            .unwrap_err();
        assert!(
            matches!(e.code(), Code::NotFound | Code::InvalidArgument),
            "{e:?}"
        );
    }
}
