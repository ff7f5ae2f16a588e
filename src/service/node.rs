//! CSI Node service: stage, publish, stats and expansion on this node.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{decode_capability, rpc, to_i64, Capability, Driver};
use crate::blockdev::{self, Content, FsType};
use crate::csi;
use crate::csi::node_service_capability::{rpc::Type as RpcType, Rpc, Type as CapType};
use crate::error::{blocking, Error, Result};
use crate::fsutil::{self, RequestPath};
use crate::ids::{check_text, truncate};
use crate::mount::{parse_bind_flag, Location};
use crate::nodeops;
use crate::pool::{AccessType, Pool, Source, Volume};
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
        let rp = self.request_path(what, p)?;
        blocking(move || rp.resolve()).await
    }

    /// The checks of [`NodeService::path`] that need no filesystem; the caller
    /// resolves it in the blocking call that uses it (one handoff, not two).
    fn request_path(&self, what: &'static str, p: &str) -> Result<RequestPath> {
        RequestPath::parse(what, &self.driver.kubelet_dir, p)
    }

    /// Like [`NodeService::path`], and NOT_FOUND when nothing is there.
    /// Unstage or unpublish (`op`) by the volume's device alone, under its
    /// lock, when its pool names the device from the id (LVM: no `lvs`).
    /// `Ok(false)`, having done nothing: the device is not there (or the pool
    /// cannot name it), so the caller looks the volume up.
    async fn by_device(
        &self,
        volume_id: &str,
        path: &RequestPath,
        op: fn(&Path, &Path) -> Result<bool>,
    ) -> Result<bool> {
        let Some((id, dev)) = self.driver.device_of("volume_id", volume_id)? else {
            return Ok(false);
        };
        let _guard = self.driver.lock_volume(&id)?;
        let path = path.clone();
        blocking(move || op(&path.resolve()?, &dev)).await
    }

    /// Call it after every other argument is decoded: a missing path is
    /// NOT_FOUND, which must not mask an invalid one.
    async fn existing_path(&self, what: &'static str, rp: RequestPath) -> Result<PathBuf> {
        blocking(move || {
            let path = rp.resolve()?;
            match std::fs::symlink_metadata(&path) {
                Ok(_) => Ok(path),
                Err(_) => Err(Error::NotFound(format!("{what} {path:?} does not exist"))),
            }
        })
        .await
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

/// Mount flags split into per-mount flags and filesystem options. Directory
/// volumes take per-mount flags only (they are bind mounts).
struct MountOptions {
    flags: MountFlags,
    data: Vec<String>,
}

fn mount_options(cap: &Capability, src: &Source) -> Result<MountOptions> {
    let mut out = MountOptions {
        flags: MountFlags::empty(),
        data: Vec::new(),
    };
    for f in &cap.mount_flags {
        if let Some(flag) = parse_bind_flag(f) {
            out.flags |= flag;
            continue;
        }
        match src {
            Source::Directory(_) => {
                return Err(Error::InvalidArgument(format!(
                    "mount flag {:?} is not supported for directory volumes (use ro, nosuid, nodev, noexec, noatime, nodiratime, relatime, strictatime)",
                    truncate(f)
                )))
            }
            Source::Device(_) => {
                if !f.chars().all(|c| c.is_ascii_alphanumeric() || "_.=:/+-".contains(c)) {
                    return Err(Error::InvalidArgument(format!("invalid mount option {:?}", truncate(f))));
                }
                out.data.push(f.clone());
            }
        }
    }
    Ok(out)
}

/// Where this volume's data is and how its mounts show in the mount table.
async fn locate(pool: &Arc<dyn Pool>, vol: &Volume) -> Result<(Source, Location)> {
    let src = pool.source(vol)?;
    let (s, access) = (src.clone(), vol.access_type);
    let loc = blocking(move || nodeops::volume_location(&s, access)).await?;
    Ok((src, loc))
}

/// Picks the filesystem for a device volume and creates it if the device is
/// blank. Existing data is never reformatted: a filesystem already there is
/// used as it is, and a request for another type is refused.
async fn prepare_filesystem(
    dev: &std::path::Path,
    cap: &Capability,
    default: Option<FsType>,
) -> Result<FsType> {
    let requested = match cap.fs_type.as_str() {
        "" => None,
        t => Some(FsType::parse(t)?),
    };
    let fs_if_blank = requested.or(default).unwrap_or(FsType::Ext4);
    match blockdev::format_if_blank(dev, fs_if_blank).await? {
        Content::Empty => Ok(fs_if_blank),
        Content::Filesystem(t) => {
            let found = FsType::parse(&t).map_err(|_| {
                Error::FailedPrecondition(format!(
                    "{dev:?} holds a {t} filesystem, which this driver does not mount"
                ))
            })?;
            if requested.is_some_and(|r| r != found) {
                return Err(Error::FailedPrecondition(format!(
                    "{dev:?} already holds {t}; the request asks for {}: not reformatting",
                    cap.fs_type
                )));
            }
            Ok(found)
        }
        Content::Other(what) => Err(Error::FailedPrecondition(format!(
            "{dev:?} holds {what}; not formatting or mounting it"
        ))),
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
            let staging = self.request_path("staging_target_path", &req.staging_target_path)?;
            if req.volume_capability.is_none() {
                return Err(Error::InvalidArgument(
                    "volume_capability is required".into(),
                ));
            }
            let (id, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            let cap = node_capability(req.volume_capability.as_ref(), &vol)?;
            let src = pool.source(&vol)?;
            let opts = mount_options(&cap, &src)?;
            let _guard = self.driver.lock_volume(&id)?;
            if vol.inactive {
                pool.activate(&vol).await?;
            }
            match (src, vol.access_type) {
                (Source::Directory(dir), _) => {
                    blocking(move || nodeops::stage_dir(&dir, &staging.resolve()?)).await?;
                }
                // Raw block volumes are published straight from the device;
                // the staging path is only checked.
                (Source::Device(_), AccessType::Block) => {
                    blocking(move || staging.resolve()).await?;
                }
                (Source::Device(dev), AccessType::Mount) => {
                    let d = dev.clone();
                    let (staging, staged) = blocking(move || {
                        let staging = staging.resolve()?;
                        let want = nodeops::volume_location(&Source::Device(d), AccessType::Mount)?;
                        let staged = match nodeops::is_staged(&staging, &want)? {
                            true => nodeops::fs_type_at(&staging)?,
                            false => None,
                        };
                        Ok((staging, staged))
                    })
                    .await?;
                    if let Some(fs) = staged {
                        // A retry after the grow below failed: grow it now.
                        if vol.grow_filesystem {
                            blockdev::grow_fs(&dev, &staging, FsType::parse(&fs)?).await?;
                            pool.filesystem_grown(&vol).await?;
                        }
                        return Ok(csi::NodeStageVolumeResponse {});
                    }
                    let fs = prepare_filesystem(&dev, &cap, pool.default_fs_type()).await?;
                    let mut data = opts.data;
                    if !fs.default_mount_data().is_empty() {
                        data.push(fs.default_mount_data().to_owned());
                    }
                    let data = data.join(",");
                    let (d, st) = (dev.clone(), staging.clone());
                    blocking(move || {
                        nodeops::stage_device(&d, &st, fs.as_str(), opts.flags, &data)
                    })
                    .await?;
                    // Restored or cloned into a larger volume: the filesystem
                    // still has its source's size until it is grown.
                    if vol.grow_filesystem {
                        blockdev::grow_fs(&dev, &staging, fs).await?;
                        pool.filesystem_grown(&vol).await?;
                    }
                }
            }
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
            let staging = self.request_path("staging_target_path", &req.staging_target_path)?;
            if self
                .by_device(&req.volume_id, &staging, nodeops::unstage_device)
                .await?
            {
                return Ok(csi::NodeUnstageVolumeResponse {});
            }
            let (id, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            let _guard = self.driver.lock_volume(&id)?;
            let (src, access) = (pool.source(&vol).ok(), vol.access_type);
            blocking(move || {
                nodeops::unstage(&staging.resolve()?, src.as_ref().map(|s| (s, access)))
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
            let target = self.request_path("target_path", &req.target_path)?;
            if req.volume_capability.is_none() {
                return Err(Error::InvalidArgument(
                    "volume_capability is required".into(),
                ));
            }
            let (id, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            let cap = node_capability(req.volume_capability.as_ref(), &vol)?;
            let src = pool.source(&vol)?;
            let opts = mount_options(&cap, &src)?;
            let read_only = req.readonly || cap.mode.read_only();
            if let (Source::Device(dev), AccessType::Block) = (&src, vol.access_type) {
                let dev = dev.clone();
                let _guard = self.driver.lock_volume(&id)?;
                if vol.inactive {
                    pool.activate(&vol).await?;
                }
                blocking(move || nodeops::publish_block(&dev, &target.resolve()?, read_only))
                    .await?;
                return Ok(csi::NodePublishVolumeResponse {});
            }
            let staging = self.request_path("staging_target_path", &req.staging_target_path)?;
            let _guard = self.driver.lock_volume(&id)?;
            let access = vol.access_type;
            blocking(move || {
                let (staging, target) = (staging.resolve()?, target.resolve()?);
                nodeops::publish(&staging, &target, &src, access, read_only, opts.flags)
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
            let target = self.request_path("target_path", &req.target_path)?;
            if self
                .by_device(&req.volume_id, &target, nodeops::unpublish_device)
                .await?
            {
                return Ok(csi::NodeUnpublishVolumeResponse {});
            }
            let found = self.driver.find("volume_id", &req.volume_id).await?;
            let Some((id, pool, vol)) = found else {
                let target = blocking(move || target.resolve()).await?;
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
            let _guard = self.driver.lock_volume(&id)?;
            let (src, access) = (pool.source(&vol).ok(), vol.access_type);
            blocking(move || {
                nodeops::unpublish(&target.resolve()?, src.as_ref().map(|s| (s, access)))
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
            let path = self.request_path("volume_path", &req.volume_path)?;
            let (_, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            let path = self.existing_path("volume_path", path).await?;
            let usage = pool.usage(&vol).await?;
            let mut condition = pool.condition(&vol).await?;
            if condition.is_none() {
                condition = match locate(&pool, &vol).await {
                    Err(e) => Some(e.to_string()),
                    Ok((_, loc)) => {
                        let p = path.clone();
                        let mounted = blocking(move || nodeops::is_mount_of(&p, &loc)).await?;
                        (!mounted).then(|| format!("{path:?} is not a mount of this volume"))
                    }
                };
            }
            let block = vol.access_type == AccessType::Block;
            let stats = if block {
                None
            } else {
                let p = path.clone();
                Some(blocking(move || fsutil::fs_stats(&p)).await?)
            };
            let entry = |(available, total, used): (u64, u64, u64),
                         unit: csi::volume_usage::Unit| {
                csi::VolumeUsage {
                    available: to_i64(available),
                    total: to_i64(total),
                    used: to_i64(used),
                    unit: unit as i32,
                }
            };
            let usage = match (usage, stats) {
                (Some(u), _) if block => {
                    vec![entry((0, u.total_bytes, 0), csi::volume_usage::Unit::Bytes)]
                }
                (Some(u), _) => vec![
                    entry(
                        (u.available_bytes, u.total_bytes, u.used_bytes),
                        csi::volume_usage::Unit::Bytes,
                    ),
                    entry(
                        (u.free_inodes, u.total_inodes, u.used_inodes),
                        csi::volume_usage::Unit::Inodes,
                    ),
                ],
                (None, Some(s)) => vec![
                    entry(
                        (s.available_bytes, s.total_bytes, s.used_bytes),
                        csi::volume_usage::Unit::Bytes,
                    ),
                    entry(
                        (s.free_inodes, s.total_inodes, s.used_inodes),
                        csi::volume_usage::Unit::Inodes,
                    ),
                ],
                (None, None) => vec![entry(
                    (0, vol.size_bytes, 0),
                    csi::volume_usage::Unit::Bytes,
                )],
            };
            Ok(csi::NodeGetVolumeStatsResponse {
                usage,
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
            let path = self.request_path("volume_path", &req.volume_path)?;
            let staging = match req.staging_target_path.as_str() {
                "" => None,
                s => Some(self.path("staging_target_path", s).await?),
            };
            let range = super::controller::decode_range(req.capacity_range.as_ref())?;
            let (id, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            if let Some(c) = req.volume_capability.as_ref() {
                node_capability(Some(c), &vol)?;
            }
            let path = self.existing_path("volume_path", path).await?;
            let _guard = self.driver.lock_volume(&id)?;
            // The volume lives here, so the node applies the size: this is what
            // makes a central resizer work, whose ControllerExpandVolume may run
            // on another node.
            let size = if range.required > vol.size_bytes || pool.expands_on_node() {
                pool.expand(&id, range).await?.size_bytes
            } else {
                vol.size_bytes
            };
            // Device volumes with a filesystem: grow it online to the new size.
            if let (Source::Device(dev), AccessType::Mount) = (pool.source(&vol)?, vol.access_type)
            {
                let mount_point = staging.unwrap_or(path);
                let mp = mount_point.clone();
                let fs = blocking(move || nodeops::fs_type_at(&mp))
                    .await?
                    .ok_or_else(|| {
                        Error::FailedPrecondition(format!(
                            "{mount_point:?} is not mounted; stage the volume first"
                        ))
                    })?;
                blockdev::grow_fs(&dev, &mount_point, FsType::parse(&fs)?).await?;
            }
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
