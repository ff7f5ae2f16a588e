//! CSI Node service: stage, publish, stats and expansion on this node. Each
//! handler decodes its request, calls its operation (`ops`) and encodes
//! the answer.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::gate::Opened;
use super::{decode_capability, rpc, to_i64, Capability, Driver, Result};
use crate::blockdev::FsType;
use crate::crypt::{Key, KEY_FIELD};
use crate::csi;
use crate::csi::node_service_capability::{rpc::Type as RpcType, Rpc, Type as CapType};
use crate::fsutil::{PathPlace, RequestPath};
use crate::ids::{check_text, ParsedId, VolumeId, VolumeName};
use crate::ops;
use crate::pool::AccessType;

pub struct NodeService {
    opened: Opened,
    /// NodeGetInfo's answer, which needs no pool (`service/gate.rs`).
    info: csi::NodeGetInfoResponse,
}

impl NodeService {
    /// NodeGetInfo answers at once; the rest is UNAVAILABLE until `opened`
    /// is set (`service/gate.rs`).
    pub fn opening(info: csi::NodeGetInfoResponse, opened: Opened) -> Self {
        Self { opened, info }
    }

    /// The driver, once its pools are open.
    fn driver(&self) -> Result<&Arc<Driver>> {
        self.opened.get()
    }

    /// Decodes a staging or target path: the checks that need no
    /// filesystem (INVALID_ARGUMENT when it is outside kubelet's
    /// directory); the operation that uses it walks it for symlinks.
    fn request_path(&self, what: &'static str, p: &str) -> Result<RequestPath> {
        Ok(RequestPath::parse(what, &self.driver()?.kubelet_dir, p)?)
    }

    /// The `volume_path` of NodeGetVolumeStats / NodeExpandVolume, decoded:
    /// malformed text is INVALID_ARGUMENT, a well-formed path where no volume
    /// can be is answered later, once the volume is known to exist.
    fn lookup_path(&self, p: &str) -> Result<PathPlace> {
        Ok(RequestPath::place(
            "volume_path",
            &self.driver()?.kubelet_dir,
            p,
        )?)
    }

    fn decode_stage(&self, req: &csi::NodeStageVolumeRequest) -> Result<ops::Stage> {
        check_text("volume_id", &req.volume_id)?;
        let staging = self.request_path("staging_target_path", &req.staging_target_path)?;
        let cap = node_capability(req.volume_capability.as_ref())?;
        let fs_type = match cap.fs_type.as_str() {
            "" => None,
            t => Some(FsType::parse(t)?),
        };
        Ok(ops::Stage {
            volume_id: req.volume_id.clone(),
            staging,
            // Decoded now, required once the volume is known to be
            // encrypted (other volumes ignore it).
            key: req.secrets.get(KEY_FIELD).map(|v| Key::new(v.as_bytes())),
            storage: super::decode_storage_id(&req.volume_context)?,
            format: super::decode_format_context(&req.volume_context)?,
            cap,
            fs_type,
        })
    }

    fn decode_publish(&self, req: &csi::NodePublishVolumeRequest) -> Result<ops::Publish> {
        let target = self.request_path("target_path", &req.target_path)?;
        let cap = node_capability(req.volume_capability.as_ref())?;
        let storage = super::decode_storage_id(&req.volume_context)?;
        // Raw block volumes are published from the device and need no
        // staging path; any given is still checked.
        let staging = match req.staging_target_path.as_str() {
            "" => None,
            s => Some(self.request_path("staging_target_path", s)?),
        };
        if staging.as_ref().is_some_and(|s| s.overlaps(&target)) {
            return Err(Status::invalid_argument(format!(
                "target_path {:?} is, or overlaps, the staging path {:?}: a pod's mount must be its own",
                req.target_path, req.staging_target_path
            )));
        }
        Ok(ops::Publish {
            volume_id: req.volume_id.clone(),
            target,
            staging,
            cap,
            read_only: req.readonly,
            storage,
        })
    }

    /// A NodePublishVolume of a CSI ephemeral inline volume: read-write
    /// mount access, named by kubelet's handle (never one of our ids).
    fn decode_ephemeral(&self, req: &csi::NodePublishVolumeRequest) -> Result<ops::NewEphemeral> {
        let target = self.request_path("target_path", &req.target_path)?;
        let cap = node_capability(req.volume_capability.as_ref())?;
        let attrs = super::decode_ephemeral(&req.volume_context)?;
        if req.readonly || cap.mode.read_only() {
            return Err(Status::invalid_argument(
                "ephemeral volumes are empty scratch space: read-only makes no sense",
            ));
        }
        if cap.access_type == AccessType::Block {
            return Err(Status::invalid_argument(
                "ephemeral volumes are directories: use a filesystem (mount) capability",
            ));
        }
        let name = VolumeName::parse(&req.volume_id)?;
        if !matches!(
            VolumeId::parse("volume_id", &req.volume_id)?,
            ParsedId::Foreign(_)
        ) {
            return Err(Status::invalid_argument(format!(
                "volume_id {:?} has the form of a persistent volume's id; kubelet names ephemeral volumes itself",
                req.volume_id
            )));
        }
        Ok(ops::NewEphemeral {
            name,
            target,
            cap,
            params: attrs.params,
            size: attrs.size,
        })
    }

    fn decode_unpublish(&self, req: &csi::NodeUnpublishVolumeRequest) -> Result<ops::Unpublish> {
        check_text("volume_id", &req.volume_id)?;
        let target = self.request_path("target_path", &req.target_path)?;
        if target.is_kubelet_staging() {
            return Err(Status::invalid_argument(format!(
                "target_path {:?} is where kubelet stages volumes, not a pod's target: \
                 NodeUnpublishVolume never unmounts a staging path (NodeUnstageVolume does)",
                req.target_path
            )));
        }
        Ok(ops::Unpublish {
            volume_id: req.volume_id.clone(),
            target,
        })
    }

    fn decode_expand(&self, req: &csi::NodeExpandVolumeRequest) -> Result<ops::NodeExpand> {
        check_text("volume_id", &req.volume_id)?;
        let place = self.lookup_path(&req.volume_path)?;
        let staging = match req.staging_target_path.as_str() {
            "" => None,
            s => Some(self.request_path("staging_target_path", s)?),
        };
        Ok(ops::NodeExpand {
            volume_id: req.volume_id.clone(),
            place,
            staging,
            range: super::decode_range(req.capacity_range.as_ref())?,
            cap: match req.volume_capability.as_ref() {
                Some(c) => Some(decode_capability(c)?),
                None => None,
            },
        })
    }
}

/// Decodes the capability a node call was given (required).
fn node_capability(c: Option<&csi::VolumeCapability>) -> Result<Capability> {
    decode_capability(c.ok_or_else(|| Status::invalid_argument("volume_capability is required"))?)
}

#[tonic::async_trait]
impl csi::node_server::Node for NodeService {
    async fn node_stage_volume(
        &self,
        req: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("NodeStageVolume", &req.volume_id, async {
            let stage = self.decode_stage(&req)?;
            ops::stage(self.driver()?, stage).await?;
            Ok(csi::NodeStageVolumeResponse {})
        })
        .await
    }

    async fn node_unstage_volume(
        &self,
        req: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("NodeUnstageVolume", &req.volume_id, async {
            check_text("volume_id", &req.volume_id)?;
            let unstage = ops::Unstage {
                volume_id: req.volume_id.clone(),
                staging: self.request_path("staging_target_path", &req.staging_target_path)?,
            };
            ops::unstage(self.driver()?, unstage).await?;
            Ok(csi::NodeUnstageVolumeResponse {})
        })
        .await
    }

    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("NodePublishVolume", &req.volume_id, async {
            check_text("volume_id", &req.volume_id)?;
            if super::is_ephemeral(&req.volume_context) {
                let new = self.decode_ephemeral(&req)?;
                ops::publish_ephemeral(self.driver()?, new).await?;
            } else {
                let publish = self.decode_publish(&req)?;
                ops::publish(self.driver()?, publish).await?;
            }
            Ok(csi::NodePublishVolumeResponse {})
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("NodeUnpublishVolume", &req.volume_id, async {
            let unpublish = self.decode_unpublish(&req)?;
            ops::unpublish(self.driver()?, unpublish).await?;
            Ok(csi::NodeUnpublishVolumeResponse {})
        })
        .await
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let req = req.into_inner();
        rpc("NodeGetVolumeStats", &req.volume_id, async {
            check_text("volume_id", &req.volume_id)?;
            let place = self.lookup_path(&req.volume_path)?;
            let stats = ops::stats(self.driver()?, &req.volume_id, place).await?;
            Ok(stats_to_csi(stats))
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        req: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("NodeExpandVolume", &req.volume_id, async {
            let expand = self.decode_expand(&req)?;
            let size = ops::expand_on_node(self.driver()?, expand).await?;
            Ok(csi::NodeExpandVolumeResponse {
                capacity_bytes: to_i64(size),
            })
        })
        .await
    }

    async fn node_get_capabilities(
        &self,
        _req: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        let cap = |t: RpcType| csi::NodeServiceCapability {
            r#type: Some(CapType::Rpc(Rpc { r#type: t as i32 })),
        };
        rpc("NodeGetCapabilities", "", async {
            Ok(csi::NodeGetCapabilitiesResponse {
                capabilities: vec![
                    cap(RpcType::StageUnstageVolume),
                    cap(RpcType::GetVolumeStats),
                    cap(RpcType::VolumeCondition),
                    cap(RpcType::SingleNodeMultiWriter),
                    cap(RpcType::ExpandVolume),
                ],
            })
        })
        .await
    }

    async fn node_get_info(
        &self,
        _req: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        rpc("NodeGetInfo", "", async { Ok(self.info.clone()) }).await
    }
}

/// What NodeGetInfo answers for `node_id`.
pub fn node_info(node_id: &str, max_volumes_per_node: i64) -> csi::NodeGetInfoResponse {
    csi::NodeGetInfoResponse {
        node_id: node_id.to_owned(),
        max_volumes_per_node,
        accessible_topology: Some(super::topology(node_id)),
    }
}

/// NodeGetVolumeStats' answer: bytes, inodes where known, the condition.
fn stats_to_csi(s: ops::Stats) -> csi::NodeGetVolumeStatsResponse {
    use csi::volume_usage::Unit;
    let entry = |(available, total, used): (u64, u64, u64), unit: Unit| csi::VolumeUsage {
        available: to_i64(available),
        total: to_i64(total),
        used: to_i64(used),
        unit: unit as i32,
    };
    let mut usage = vec![entry(s.bytes, Unit::Bytes)];
    usage.extend(s.inodes.map(|i| entry(i, Unit::Inodes)));
    csi::NodeGetVolumeStatsResponse {
        usage,
        volume_condition: Some(csi::VolumeCondition {
            abnormal: s.condition.is_some(),
            message: s.condition.unwrap_or_else(|| "volume is healthy".into()),
        }),
    }
}
