//! CSI Node service: stage, publish, stats and expansion on this node.

use std::path::PathBuf;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{decode_capability, rpc, to_i64, Capability, Driver};
use crate::csi;
use crate::csi::node_service_capability::{rpc::Type as RpcType, Rpc, Type as CapType};
use crate::error::{blocking, Error, Result};
use crate::fsutil;
use crate::ids::check_text;
use crate::mount::parse_bind_flag;
use crate::nodeops;
use crate::pool::{Source, Volume};
use sys_mount::MountFlags;

pub struct NodeService {
    driver: Arc<Driver>,
}

impl NodeService {
    pub fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }

    /// Decodes a staging or target path (INVALID_ARGUMENT when it is outside
    /// kubelet's directory or passes through a symlink).
    async fn path(&self, what: &'static str, p: &str) -> Result<PathBuf> {
        let (root, p) = (self.driver.kubelet_dir.clone(), p.to_owned());
        blocking(move || fsutil::check_request_path(what, &root, &p)).await
    }
}

/// The capability a node call was given, checked against the volume.
fn node_capability(c: Option<&csi::VolumeCapability>, vol: &Volume) -> Result<Capability> {
    let cap = decode_capability(
        c.ok_or_else(|| Error::InvalidArgument("volume_capability is required".into()))?,
    )?;
    if cap.access_type != vol.access_type {
        return Err(Error::InvalidArgument(format!(
            "volume {} is a {:?} volume; the capability asks for {:?}",
            vol.id, vol.access_type, cap.access_type
        )));
    }
    Ok(cap)
}

/// Mount flags a directory volume accepts: per-mount flags only.
fn bind_flags(cap: &Capability) -> Result<MountFlags> {
    let mut flags = MountFlags::empty();
    for f in &cap.mount_flags {
        flags |= parse_bind_flag(f).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "mount flag {f:?} is not supported for directory volumes (use ro, nosuid, nodev, noexec, noatime, nodiratime, relatime, strictatime)"
            ))
        })?;
    }
    Ok(flags)
}

fn dir_of(src: Source) -> PathBuf {
    match src {
        Source::Directory(p) | Source::Device(p) => p,
    }
}

#[tonic::async_trait]
impl csi::node_server::Node for NodeService {
    async fn node_stage_volume(
        &self,
        req: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("NodeStageVolume", &req.volume_id, async {
            check_text("volume_id", &req.volume_id)?;
            let staging = self
                .path("staging_target_path", &req.staging_target_path)
                .await?;
            if req.volume_capability.is_none() {
                return Err(Error::InvalidArgument(
                    "volume_capability is required".into(),
                ));
            }
            let (id, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            let cap = node_capability(req.volume_capability.as_ref(), &vol)?;
            bind_flags(&cap)?;
            let _guard = self
                .driver
                .locks
                .try_lock(id.key.as_str(), &format!("volume {id}"))?;
            let src = dir_of(pool.source(&vol)?);
            blocking(move || nodeops::stage_dir(&src, &staging)).await?;
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
            let staging = self
                .path("staging_target_path", &req.staging_target_path)
                .await?;
            let (id, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            let _guard = self
                .driver
                .locks
                .try_lock(id.key.as_str(), &format!("volume {id}"))?;
            let src = dir_of(pool.source(&vol)?);
            blocking(move || {
                let loc = nodeops::locate_dir(&src).ok();
                nodeops::unstage(&staging, loc.as_ref())
            })
            .await?;
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
            let target = self.path("target_path", &req.target_path).await?;
            if req.volume_capability.is_none() {
                return Err(Error::InvalidArgument(
                    "volume_capability is required".into(),
                ));
            }
            let staging = self
                .path("staging_target_path", &req.staging_target_path)
                .await?;
            let (id, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            let cap = node_capability(req.volume_capability.as_ref(), &vol)?;
            let flags = bind_flags(&cap)?;
            let read_only = req.readonly || cap.mode.read_only();
            let _guard = self
                .driver
                .locks
                .try_lock(id.key.as_str(), &format!("volume {id}"))?;
            let src = dir_of(pool.source(&vol)?);
            blocking(move || {
                // The staging path must hold this volume, not whatever is there.
                let want = nodeops::locate_dir(&src)?;
                nodeops::publish(&staging, &target, &want, read_only, flags)
            })
            .await?;
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
            check_text("volume_id", &req.volume_id)?;
            let target = self.path("target_path", &req.target_path).await?;
            let found = self.driver.find("volume_id", &req.volume_id).await?;
            let Some((id, pool, vol)) = found else {
                // Nothing left to attribute the target to. An empty target is
                // idempotently gone; a mounted one is not ours to touch.
                let t = target.clone();
                let mounted =
                    blocking(move || Ok(crate::mount::MountTable::read()?.at(&t).is_some()))
                        .await?;
                if mounted {
                    return Err(Error::NotFound(format!(
                        "volume {:?} does not exist",
                        req.volume_id
                    )));
                }
                blocking(move || nodeops::unpublish(&target, None)).await?;
                return Ok(csi::NodeUnpublishVolumeResponse {});
            };
            let _guard = self
                .driver
                .locks
                .try_lock(id.key.as_str(), &format!("volume {id}"))?;
            let src = dir_of(pool.source(&vol)?);
            blocking(move || {
                let loc = nodeops::locate_dir(&src).ok();
                nodeops::unpublish(&target, loc.as_ref())
            })
            .await?;
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
            let path = self.path("volume_path", &req.volume_path).await?;
            let (_, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            let src = dir_of(pool.source(&vol)?);
            let usage = pool.usage(&vol).await?;
            let p = path.clone();
            let (stats, condition) = blocking(move || {
                if std::fs::symlink_metadata(&p).is_err() {
                    return Err(Error::NotFound(format!("volume_path {p:?} does not exist")));
                }
                let condition = match nodeops::locate_dir(&src) {
                    Err(e) => Some(e.to_string()),
                    Ok(loc) if !nodeops::is_mount_of(&p, &loc)? => Some(format!(
                        "{p:?} is not a mount of the volume directory {src:?}"
                    )),
                    Ok(_) => None,
                };
                Ok((fsutil::fs_stats(&p)?, condition))
            })
            .await?;
            let (bytes, inodes) = match usage {
                Some(u) => (
                    (u.available_bytes, u.total_bytes, u.used_bytes),
                    (u.free_inodes, u.total_inodes, u.used_inodes),
                ),
                None => (
                    (stats.available_bytes, stats.total_bytes, stats.used_bytes),
                    (stats.free_inodes, stats.total_inodes, stats.used_inodes),
                ),
            };
            let usage = |(available, total, used): (u64, u64, u64),
                         unit: csi::volume_usage::Unit| csi::VolumeUsage {
                available: to_i64(available),
                total: to_i64(total),
                used: to_i64(used),
                unit: unit as i32,
            };
            Ok(csi::NodeGetVolumeStatsResponse {
                usage: vec![
                    usage(bytes, csi::volume_usage::Unit::Bytes),
                    usage(inodes, csi::volume_usage::Unit::Inodes),
                ],
                volume_condition: Some(csi::VolumeCondition {
                    abnormal: condition.is_some(),
                    message: condition.unwrap_or_else(|| "volume is healthy".into()),
                }),
            })
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        req: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let req = req.into_inner();
        rpc("NodeExpandVolume", &req.volume_id, async {
            check_text("volume_id", &req.volume_id)?;
            let path = self.path("volume_path", &req.volume_path).await?;
            let range = super::controller::decode_range(req.capacity_range.as_ref())?;
            let (id, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            if let Some(c) = req.volume_capability.as_ref() {
                node_capability(Some(c), &vol)?;
            }
            blocking(move || {
                std::fs::symlink_metadata(&path)
                    .map(|_| ())
                    .map_err(|_| Error::NotFound(format!("volume_path {path:?} does not exist")))
            })
            .await?;
            // The volume lives here, so the node applies the size: this is what
            // makes a central resizer work, whose ControllerExpandVolume may run
            // on another node. Already that size (the usual case after a local
            // ControllerExpandVolume): nothing to do.
            let size = if range.required > vol.size_bytes {
                let _guard = self
                    .driver
                    .locks
                    .try_lock(id.key.as_str(), &format!("volume {id}"))?;
                pool.expand(&id, range).await?.size_bytes
            } else {
                vol.size_bytes
            };
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
        rpc("NodeGetInfo", "", async {
            Ok(csi::NodeGetInfoResponse {
                node_id: self.driver.node_id.clone(),
                max_volumes_per_node: self.driver.max_volumes_per_node,
                accessible_topology: Some(self.driver.topology()),
            })
        })
        .await
    }
}
