//! CSI Controller service. With external-provisioner in `--node-deployment`
//! mode it runs on every node and only creates volumes for its own node.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{bytes, decode_capabilities, decode_params, rpc, to_i64, Capability, Driver, Result};
use crate::csi;
use crate::csi::controller_service_capability::{rpc::Type as RpcType, Rpc, Type as CapType};

use crate::ids::{truncate, ParsedId, PoolName, VolumeId, VolumeName};
use crate::pool::{
    AccessType, CapacityRange, ContentSource, CreateRequest, Pool, Snapshot, SnapshotRequest,
    Volume,
};

pub struct ControllerService {
    driver: Arc<Driver>,
}

impl ControllerService {
    /// The pool a new volume goes to: the one its parameters name, else its
    /// content source's (a volume is made from content in its own pool
    /// only), else the default pool. A source in a pool this node lacks
    /// names nothing that exists here: NOT_FOUND.
    fn pool_for(
        &self,
        named: Option<&PoolName>,
        content: Option<&(&'static str, ParsedId)>,
    ) -> Result<Arc<dyn Pool>> {
        let d = &self.driver;
        let source = match content {
            Some((kind, ParsedId::Volume(src))) => Some((*kind, src)),
            _ => None,
        };
        if let (Some((_, src)), Some(p)) = (source, named) {
            if src.pool != *p {
                return Err(Status::invalid_argument(format!(
                    "the content source is in pool {}; a volume can only be made from content in its own pool, not {p}",
                    src.pool
                )));
            }
        }
        let pool_name = named
            .cloned()
            .or_else(|| source.map(|(_, src)| src.pool.clone()))
            .unwrap_or_else(|| d.pools.default_pool().clone());
        if let (Some((kind, src)), None, None) = (source, d.pools.get(&pool_name), named) {
            return Err(Status::not_found(format!("{kind} {src} does not exist")));
        }
        Ok(d.pools.require(&pool_name)?.clone())
    }

    /// ALREADY_EXISTS when the name is a volume in another pool of this node
    /// (a name is one volume, whatever the pool).
    async fn refuse_name_in_other_pools(&self, pool: &dyn Pool, name: &VolumeName) -> Result<()> {
        for other in self.driver.pools.iter().filter(|p| p.name() != pool.name()) {
            let other_id = VolumeId::new(other.name().clone(), name);
            if other.get(&other_id).await?.is_some() {
                return Err(Status::already_exists(format!(
                    "volume {:?} already exists in pool {}",
                    name.as_str(),
                    other.name()
                )));
            }
        }
        Ok(())
    }

    /// UNIMPLEMENTED when no pool of this node takes snapshots (the
    /// capability is then not advertised either).
    fn snapshots_offered(&self) -> Result<()> {
        match self.driver.pools.any_snapshots() {
            true => Ok(()),
            false => Err(Status::unimplemented(
                "no pool of this node supports snapshots",
            )),
        }
    }

    pub fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }

    fn to_csi(&self, v: &Volume) -> csi::Volume {
        csi::Volume {
            capacity_bytes: to_i64(v.size_bytes),
            volume_id: v.id.clone(),
            volume_context: HashMap::new(),
            content_source: None,
            accessible_topology: vec![super::topology(&self.driver)],
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
        Err(Status::resource_exhausted(format!(
            "node {} is not in the requested topology; volumes of this driver can only be created on the node that serves the request",
            self.driver.node_id
        )))
    }
}

/// `max_entries` of a list request: negative is INVALID_ARGUMENT, 0 no limit.
fn decode_max_entries(v: i32) -> Result<usize> {
    match v {
        0 => Ok(usize::MAX),
        n if n > 0 => Ok(n as usize),
        n => Err(Status::invalid_argument(format!(
            "max_entries must not be negative (got {n})"
        ))),
    }
}

/// One page of a list sorted by id: `(start, end, next_token)`. The token is
/// the id of the first entry of the next page; an unknown token is ABORTED
/// (the spec's code).
fn page<T>(
    sorted: &[T],
    id: impl Fn(&T) -> &String,
    token: &str,
    max: usize,
    what: &str,
) -> Result<(usize, usize, String)> {
    let start = if token.is_empty() {
        0
    } else {
        sorted.iter().position(|e| id(e) == token).ok_or_else(|| {
            Status::aborted(format!(
                "starting_token {:?} is not valid (no such {what})",
                truncate(token)
            ))
        })?
    };
    let end = start.saturating_add(max).min(sorted.len());
    let next = sorted.get(end).map(|e| id(e).clone()).unwrap_or_default();
    Ok((start, end, next))
}

/// StorageClass-like parameter of a VolumeSnapshotClass: space reserved for a
/// thick (copy-on-write) snapshot's changes.
pub const PARAM_SNAPSHOT_SIZE: &str = "snapshotSize";

fn decode_snapshot_params(params: &HashMap<String, String>) -> Result<Option<u64>> {
    let mut cow = None;
    for (k, v) in params {
        if k == PARAM_SNAPSHOT_SIZE {
            let n = crate::size::parse_size(v).map_err(Status::invalid_argument)?;
            if n == 0 {
                return Err(Status::invalid_argument(format!(
                    "{PARAM_SNAPSHOT_SIZE} must be positive"
                )));
            }
            cow = Some(n);
        } else if !k.starts_with(super::K8S_PARAM_PREFIX) {
            return Err(Status::invalid_argument(format!(
                "unknown snapshot parameter {:?} (known: {PARAM_SNAPSHOT_SIZE})",
                truncate(k)
            )));
        }
    }
    Ok(cow)
}

/// The content a new volume is made from, for `pool`: INVALID_ARGUMENT when
/// the pool takes no snapshots, NOT_FOUND for an id that is not this
/// driver's.
fn content_source(
    pool: &dyn Pool,
    content: Option<(&'static str, ParsedId)>,
) -> Result<Option<ContentSource>> {
    match content {
        None => Ok(None),
        Some(_) if pool.snapshots().is_none() => Err(Status::invalid_argument(format!(
            "pool {} ({}) cannot create volumes from snapshots or other volumes",
            pool.name(),
            pool.backend()
        ))),
        Some((kind, ParsedId::Foreign(raw))) => Err(Status::not_found(format!(
            "{kind} {:?} does not exist",
            truncate(&raw)
        ))),
        Some(("snapshot", ParsedId::Volume(src))) => Ok(Some(ContentSource::Snapshot(src))),
        Some((_, ParsedId::Volume(src))) => Ok(Some(ContentSource::Volume(src))),
    }
}

/// The request's content source: which kind, and its id.
fn decode_content_source(
    src: Option<&csi::VolumeContentSource>,
) -> Result<Option<(&'static str, ParsedId)>> {
    use csi::volume_content_source::Type;
    let Some(src) = src else { return Ok(None) };
    match &src.r#type {
        None => Err(Status::invalid_argument(
            "volume_content_source names neither a snapshot nor a volume",
        )),
        Some(Type::Snapshot(s)) => Ok(Some((
            "snapshot",
            VolumeId::parse("snapshot_id", &s.snapshot_id)?,
        ))),
        Some(Type::Volume(v)) => Ok(Some((
            "volume",
            VolumeId::parse("volume_id", &v.volume_id)?,
        ))),
    }
}

fn snapshot_to_csi(s: &Snapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: to_i64(s.size_bytes),
        snapshot_id: s.id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: to_i64(s.created_unix),
            nanos: 0,
        }),
        ready_to_use: s.ready,
        group_snapshot_id: String::new(),
    }
}

pub(crate) fn decode_range(r: Option<&csi::CapacityRange>) -> Result<CapacityRange> {
    let Some(r) = r else {
        return Ok(CapacityRange::default());
    };
    let range = CapacityRange {
        required: bytes("capacity_range.required_bytes", r.required_bytes)?,
        limit: bytes("capacity_range.limit_bytes", r.limit_bytes)?,
    };
    if range.limit > 0 && range.required > range.limit {
        return Err(Status::invalid_argument(format!(
            "capacity_range: required_bytes {} is larger than limit_bytes {}",
            range.required, range.limit
        )));
    }
    Ok(range)
}

/// One access type for the whole request, supported by the pool.
fn access_type_of(caps: &[Capability], pool: &dyn Pool) -> Result<AccessType> {
    let t = caps[0].access_type;
    if caps.iter().any(|c| c.access_type != t) {
        return Err(Status::invalid_argument(
            "volume_capabilities mix block and mount access",
        ));
    }
    if !pool.supports(t) {
        return Err(Status::invalid_argument(format!(
            "pool {} ({}) does not support {t:?} access",
            pool.name(),
            pool.backend()
        )));
    }
    Ok(t)
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
            let range = decode_range(req.capacity_range.as_ref())?;
            let params = decode_params(&req.parameters)?;
            let content = decode_content_source(req.volume_content_source.as_ref())?;
            if !req.mutable_parameters.is_empty() {
                return Err(Status::invalid_argument(
                    "mutable_parameters are not supported",
                ));
            }
            let d = &self.driver;
            let pool = self.pool_for(params.pool.as_ref(), content.as_ref())?;
            let access_type = access_type_of(&caps, pool.as_ref())?;
            self.check_topology(req.accessibility_requirements.as_ref())?;
            let source = content_source(pool.as_ref(), content)?;
            let pool_name = pool.name().clone();

            let id = VolumeId::new(pool_name, &name);
            // The lock key is the name's hash, the same in every pool.
            let _guard = d
                .locks
                .try_lock(id.key.as_str(), &format!("volume {:?}", name.as_str()))?;
            // The source must not change or vanish while it is copied.
            let _source_guard = match &source {
                Some(ContentSource::Snapshot(s) | ContentSource::Volume(s)) => {
                    Some(d.locks.try_lock(s.key.as_str(), &format!("source {s}"))?)
                }
                None => None,
            };
            self.refuse_name_in_other_pools(pool.as_ref(), &name)
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
                })
                .await?;
            let mut volume = self.to_csi(&vol);
            volume.content_source = req.volume_content_source.clone();
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
            Err(Status::unimplemented(
                "ControllerPublishVolume is not needed by local volumes",
            ))
        })
        .await
    }

    async fn controller_unpublish_volume(
        &self,
        _req: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        rpc("ControllerUnpublishVolume", "", async {
            Err(Status::unimplemented(
                "ControllerUnpublishVolume is not needed by local volumes",
            ))
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
            let mut all = Vec::new();
            for pool in self.driver.pools.iter() {
                all.extend(pool.list().await?);
            }
            all.sort_by(|a, b| a.id.cmp(&b.id));
            let (start, end, next_token) =
                page(&all, |v| &v.id, &req.starting_token, max, "volume")?;
            Ok(csi::ListVolumesResponse {
                entries: all[start..end]
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
            if elsewhere || unsupported {
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
                    return Err(Status::not_found(format!(
                        "source volume {:?} does not exist",
                        truncate(&raw)
                    )))
                }
            };
            let d = &self.driver;
            let pool = d
                .pools
                .get(&source.pool)
                .ok_or_else(|| Status::not_found(format!("source volume {source} does not exist")))?
                .clone();
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
            let _guard = d
                .locks
                .try_lock(id.key.as_str(), &format!("snapshot {:?}", name.as_str()))?;
            let _source_guard = d
                .locks
                .try_lock(source.key.as_str(), &format!("volume {source}"))?;
            for other in d.pools.iter().filter(|p| p.name() != pool.name()) {
                let other_id = VolumeId {
                    pool: other.name().clone(),
                    key: id.key.clone(),
                };
                let Some(theirs) = other.snapshots() else {
                    continue;
                };
                if theirs.get_snapshot(&other_id).await?.is_some() {
                    return Err(Status::already_exists(format!(
                        "snapshot {:?} already exists in pool {}",
                        name.as_str(),
                        other.name()
                    )));
                }
            }
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
                for snapshots in self.driver.pools.iter().filter_map(|p| p.snapshots()) {
                    all.extend(snapshots.list_snapshots().await?);
                }
            }
            if !req.source_volume_id.is_empty() {
                crate::ids::check_text("source_volume_id", &req.source_volume_id)?;
                all.retain(|s| s.source_volume_id == req.source_volume_id);
            }
            all.sort_by(|a, b| a.id.cmp(&b.id));
            let (start, end, next_token) =
                page(&all, |s| &s.id, &req.starting_token, max, "snapshot")?;
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
            let range = decode_range(req.capacity_range.as_ref())?;
            if range.required == 0 && range.limit == 0 {
                return Err(Status::invalid_argument("capacity_range is required"));
            }
            let Some((id, pool, vol)) = self.driver.find("volume_id", &req.volume_id).await? else {
                // Volumes live on their node, and the resizer calls the driver
                // on its own node. An id in our format may name a volume on
                // another node: NodeExpandVolume applies the size there (and
                // refuses it if that node lacks room). Anything else is not ours.
                if !matches!(
                    VolumeId::parse("volume_id", &req.volume_id)?,
                    ParsedId::Volume(_)
                ) {
                    return Err(Status::not_found(format!(
                        "volume {:?} is not a localvol volume",
                        truncate(&req.volume_id)
                    )));
                }
                tracing::info!(
                    volume = %req.volume_id,
                    "volume is not on this node; its node applies the size in NodeExpandVolume"
                );
                let size = if range.required > 0 {
                    range.required
                } else {
                    range.limit
                };
                return Ok(csi::ControllerExpandVolumeResponse {
                    capacity_bytes: to_i64(size),
                    node_expansion_required: true,
                });
            };
            let _guard = self.driver.lock_volume(&id)?;
            let r = if pool.expands_on_node() {
                // The node that holds the device extends it in NodeExpandVolume;
                // here only the request is checked.
                if range.required < vol.size_bytes && !range.admits(vol.size_bytes) {
                    return Err(Status::out_of_range(format!(
                        "volume {id} is {} bytes; shrinking is not supported",
                        vol.size_bytes
                    )));
                }
                crate::pool::Expanded {
                    size_bytes: range.required.max(vol.size_bytes),
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
            Err(Status::unimplemented(
                "ControllerGetVolume is not supported",
            ))
        })
        .await
    }

    async fn controller_modify_volume(
        &self,
        _req: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        rpc("ControllerModifyVolume", "", async {
            Err(Status::unimplemented(
                "ControllerModifyVolume is not supported",
            ))
        })
        .await
    }
}
