//! CSI Node service: stage, publish, stats and expansion on this node.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::gate::Opened;
use super::status::Refusal;
use super::{decode_capability, rpc, to_i64, Capability, Driver, Result};
use crate::blockdev::FsType;
use crate::crypt::{self, Key, KEY_FIELD};
use crate::csi;
use crate::csi::node_service_capability::{rpc::Type as RpcType, Rpc, Type as CapType};
use crate::error::blocking;
use crate::fsutil::{PathPlace, RequestPath};
use crate::ids::{check_text, truncate, VolumeName};
use crate::mount::parse_bind_flag;
use crate::nodeops::pipeline::{self, MountOptions, VolumeAtPath};
use crate::nodeops::{self, NodeError};
use crate::pool::{
    AccessType, CapacityRange, CreateRequest, Pool, Source, Volume, EPHEMERAL_KEY,
    EPHEMERAL_TARGET_KEY,
};

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

    /// Decodes a staging or target path (INVALID_ARGUMENT when it is outside
    /// kubelet's directory or passes through a symlink).
    async fn path(&self, what: &'static str, p: &str) -> Result<PathBuf> {
        let rp = self.request_path(what, p)?;
        blocking(move || Ok(rp.resolve()?)).await
    }

    /// The checks of [`NodeService::path`] that need no filesystem; the caller
    /// resolves it in the blocking call that uses it (one handoff, not two).
    fn request_path(&self, what: &'static str, p: &str) -> Result<RequestPath> {
        Ok(RequestPath::parse(what, &self.driver()?.kubelet_dir, p)?)
    }

    /// Like [`NodeService::path`], and NOT_FOUND when nothing is there.
    /// Unstage or unpublish (`op`) by the volume's device alone, under its
    /// lock, when its pool names the device from the id (LVM: no `lvs`).
    /// `Ok(false)`, having done nothing: the device is not there (or the pool
    /// cannot name it), so the caller looks the volume up.
    ///
    /// An encrypted volume whose mapping is open is mounted and bound from
    /// the mapping, so `op` gets the mapping's device; with `close`
    /// (unstage), the mapping is closed after `op` (refused while it is
    /// still mounted or bound anywhere: FAILED_PRECONDITION).
    async fn by_device(
        &self,
        volume_id: &str,
        path: &RequestPath,
        op: fn(&Path, &Path, &Path) -> Result<bool, NodeError>,
        close: bool,
    ) -> Result<bool> {
        let Some(found) = self.driver()?.device_of("volume_id", volume_id)? else {
            return Ok(false);
        };
        let _guard = self.driver()?.lock_volume(&found.id)?;
        let (path, dev, mapping) = (path.clone(), found.dev, found.mapping.clone());
        let (done, mapped) = blocking(move || -> Result<_> {
            let (scope, path) = path.resolve_in()?;
            let mapped = mapping
                .map(|m| crypt::mapping_path(&m))
                .filter(|m| crate::mount::block_device(m).is_ok());
            let dev = mapped.clone().unwrap_or(dev);
            Ok((op(&scope, &path, &dev)?, mapped.is_some()))
        })
        .await?;
        if let (true, true, true, Some(name)) = (done, mapped, close, &found.mapping) {
            crypt::close(name).await?;
        }
        Ok(done)
    }

    /// Where a NodeGetVolumeStats or NodeExpandVolume request says the volume
    /// is. Call it after every other argument is decoded and the volume was
    /// found: the answers here are NOT_FOUND (the volume is not at that path:
    /// relative, outside the kubelet dir, missing, or another mount), which
    /// must not mask an invalid argument or an unknown volume.
    async fn volume_path(
        &self,
        place: PathPlace,
        pool: &Arc<dyn Pool>,
        vol: &Volume,
        stats: bool,
    ) -> Result<VolumeAtPath> {
        Ok(pipeline::volume_at_path(place, pool.source(vol)?, vol, stats).await?)
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
}

impl NodeService {
    /// NodeUnpublishVolume of an ephemeral inline volume: unmounted first,
    /// then removed (its pool refuses while it is still mounted anywhere).
    /// A volume's IO limits for the pod it was just published to (kubelet
    /// made the pod's cgroup before it mounts volumes). A volume without
    /// limits has `max` written, lifting what an earlier publish in the
    /// same pod set, best effort. A target outside kubelet's layout names
    /// no pod: nothing to limit.
    async fn limit_pod(
        &self,
        src: Source,
        vol: &Volume,
        pod: Option<crate::iolimit::PodUid>,
    ) -> Result<()> {
        let Some(pod) = pod else {
            if !vol.io_limits.is_unlimited() {
                tracing::warn!(volume = %vol.id, limits = %vol.io_limits,
                    "target is not a pod's (kubelet's layout): no cgroup to put the IO limits on");
            }
            return Ok(());
        };
        let r = nodeops::enforce_io_limits(
            self.driver()?.cgroup_paths(),
            src,
            &vol.io_limits,
            Some(pod),
        )
        .await;
        match r {
            Err(e) if vol.io_limits.is_unlimited() => {
                tracing::debug!(volume = %vol.id, error = %e, "no IO limits to lift");
                Ok(())
            }
            r => r.map(drop).map_err(Into::into),
        }
    }

    async fn unpublish_ephemeral(
        &self,
        (id, pool, vol): (crate::ids::VolumeId, Arc<dyn Pool>, Volume),
        target: RequestPath,
    ) -> Result<()> {
        let _guard = self.driver()?.lock_volume(&id)?;
        let src = pool.source(&vol)?;
        blocking(move || -> Result<_> {
            Ok(nodeops::unpublish(
                &target.resolve()?,
                Some((&src, AccessType::Mount)),
            )?)
        })
        .await?;
        pool.delete(&id).await?;
        tracing::info!(volume = %id, name = %vol.name, "ephemeral volume removed");
        Ok(())
    }

    /// NodePublishVolume of a CSI ephemeral inline volume: creates a dir
    /// volume named by kubelet's volume handle (pool and size from the
    /// volume attributes; quota-enforced where the pool enforces quotas),
    /// recording the target, and binds it there. A repeat finds the volume
    /// and the bind already there.
    async fn publish_ephemeral(
        &self,
        req: &csi::NodePublishVolumeRequest,
        target: RequestPath,
        cap: Capability,
    ) -> Result<csi::NodePublishVolumeResponse> {
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
            crate::ids::VolumeId::parse("volume_id", &req.volume_id)?,
            crate::ids::ParsedId::Foreign(_)
        ) {
            return Err(Status::invalid_argument(format!(
                "volume_id {:?} has the form of a persistent volume's id; kubelet names ephemeral volumes itself",
                req.volume_id
            )));
        }
        let driver = self.driver()?;
        let pool_name = attrs
            .params
            .pool
            .clone()
            .unwrap_or_else(|| driver.pools.default_pool().clone());
        let pool = driver.pools.require(&pool_name)?.clone();
        if pool.backend() != "dir" {
            return Err(Status::invalid_argument(format!(
                "ephemeral volumes come from dir pools; pool {pool_name} is {}",
                pool.backend()
            )));
        }
        let src_flags = mount_options(&cap, &Source::Directory(PathBuf::new()))?.flags;
        let target = blocking(move || -> Result<_> { Ok(target.resolve()?) }).await?;
        let id = crate::ids::VolumeId::new(pool_name, &name);
        let _guard = self.driver()?.lock_volume(&id)?;
        let mut parameters = attrs.params.kept;
        parameters.insert(EPHEMERAL_KEY.to_owned(), "true".to_owned());
        parameters.insert(
            EPHEMERAL_TARGET_KEY.to_owned(),
            target.to_string_lossy().into_owned(),
        );
        let vol = pool
            .create(&CreateRequest {
                source: None,
                id,
                name,
                range: CapacityRange {
                    required: attrs.size,
                    limit: 0,
                },
                access_type: AccessType::Mount,
                inode_limit: attrs.params.inode_limit,
                parameters,
                encryption: None,
                io_limits: Default::default(),
            })
            .await?;
        let Source::Directory(dir) = pool.source(&vol)? else {
            return Err(crate::pool::PoolError::Inconsistent(format!(
                "dir pool {} named a device for {}",
                pool.name(),
                vol.id
            ))
            .into());
        };
        blocking(move || -> Result<_> { Ok(nodeops::publish_dir(&dir, &target, src_flags)?) })
            .await?;
        Ok(csi::NodePublishVolumeResponse {})
    }
}

/// Decodes the capability a node call was given (required).
fn node_capability(c: Option<&csi::VolumeCapability>) -> Result<Capability> {
    decode_capability(c.ok_or_else(|| Status::invalid_argument("volume_capability is required"))?)
}

/// The capability's access type must be the volume's.
fn check_access_type(cap: &Capability, vol: &Volume) -> Result<()> {
    if cap.access_type != vol.access_type {
        return Err(Status::invalid_argument(format!(
            "volume {} is a {:?} volume; the capability asks for {:?}",
            vol.id, vol.access_type, cap.access_type
        )));
    }
    Ok(())
}

/// Mount flags split into per-mount flags and filesystem options. Directory
/// volumes take per-mount flags only (they are bind mounts).
fn mount_options(cap: &Capability, src: &Source) -> Result<MountOptions> {
    let mut out = MountOptions::default();
    for f in &cap.mount_flags {
        if let Some(flag) = parse_bind_flag(f) {
            out.flags |= flag;
            continue;
        }
        match src {
            Source::Directory(_) => {
                return Err(Status::invalid_argument(format!(
                    "mount flag {:?} is not supported for directory volumes (use ro, nosuid, nodev, noexec, noatime, nodiratime, relatime, strictatime)",
                    truncate(f)
                )))
            }
            Source::Device(_) => {
                if !f.chars().all(|c| c.is_ascii_alphanumeric() || "_.=:/+-".contains(c)) {
                    return Err(Status::invalid_argument(format!("invalid mount option {:?}", truncate(f))));
                }
                out.data.push(f.clone());
            }
        }
    }
    Ok(out)
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
            let cap = node_capability(req.volume_capability.as_ref())?;
            // Decoded now, required below once the volume is known to be
            // encrypted (other volumes ignore it).
            let key = req.secrets.get(KEY_FIELD).map(|v| Key::new(v.as_bytes()));
            let storage = super::decode_storage_id(&req.volume_context)?;
            let format = super::decode_format_context(&req.volume_context)?;
            let (id, pool, vol) = self.driver()?.require("volume_id", &req.volume_id).await?;
            self.driver()?.require_usable(&id.pool)?;
            self.driver()?
                .check_storage(&id, pool.as_ref(), storage.as_ref())?;
            check_access_type(&cap, &vol)?;
            let enc = pool.encrypted(&vol)?;
            let key = match (&enc, key) {
                (None, _) => None,
                (Some(_), Some(Ok(key))) => Some(key),
                (Some(_), Some(Err(e))) => {
                    return Err(Status::invalid_argument(format!(
                        "volume {id} is encrypted; the node-stage secret's {KEY_FIELD}: {e}"
                    )))
                }
                (Some(_), None) => {
                    return Err(Status::invalid_argument(format!(
                        "volume {id} is encrypted and the node-stage secrets have no {KEY_FIELD} \
                         (StorageClass csi.storage.k8s.io/node-stage-secret-name and -namespace \
                         must name a Secret with that field)"
                    )))
                }
            };
            let opts = mount_options(&cap, &pool.source(&vol)?)?;
            let fs_type = match cap.fs_type.as_str() {
                "" => None,
                t => Some(FsType::parse(t)?),
            };
            // Only a volume that gets a filesystem here is formatted with
            // the class's options, which must be that filesystem's; a raw
            // block volume's are not carried.
            let format = match fs_type.or(pool.default_fs_type()) {
                Some(fs) if cap.access_type == AccessType::Mount => {
                    super::check_format_for(&format, fs)?;
                    format
                }
                _ => Default::default(),
            };
            let _guard = self.driver()?.lock_volume(&id)?;
            let stage = pipeline::Stage {
                staging,
                fs_type,
                format,
                mount: opts,
                key,
            };
            pipeline::stage(pool.as_ref(), &vol, stage).await?;
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
            crate::metrics::forget_volume_condition(&req.volume_id);
            let staging = self.request_path("staging_target_path", &req.staging_target_path)?;
            if self
                .by_device(&req.volume_id, &staging, nodeops::unstage_device, true)
                .await?
            {
                return Ok(csi::NodeUnstageVolumeResponse {});
            }
            let found = self.driver()?.require("volume_id", &req.volume_id).await;
            let (id, pool, vol) = match found {
                Err(e) if e.pool_not_open() => {
                    // Its pool could not be opened, so the volume cannot be
                    // looked up; its mount is released all the same (an
                    // unmount loses nothing), so that its pods can go.
                    tracing::warn!(volume = %truncate(&req.volume_id), error = %e,
                        "unstaging a volume of a pool that is not open");
                    blocking(move || -> Result<_> {
                        let (scope, staging) = staging.resolve_in()?;
                        Ok(nodeops::unstage(&scope, &staging, None)?)
                    })
                    .await?;
                    return Ok(csi::NodeUnstageVolumeResponse {});
                }
                found => found?,
            };
            let _guard = self.driver()?.lock_volume(&id)?;
            let src = pool.source(&vol).ok();
            blocking(move || -> Result<_> {
                let (scope, staging) = staging.resolve_in()?;
                Ok(nodeops::unstage(&scope, &staging, src.as_ref())?)
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
            let cap = node_capability(req.volume_capability.as_ref())?;
            if super::is_ephemeral(&req.volume_context) {
                return self.publish_ephemeral(&req, target, cap).await;
            }
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
            let (id, pool, vol) = self.driver()?.require("volume_id", &req.volume_id).await?;
            self.driver()?.require_usable(&id.pool)?;
            self.driver()?
                .check_storage(&id, pool.as_ref(), storage.as_ref())?;
            check_access_type(&cap, &vol)?;
            let opts = mount_options(&cap, &pool.source(&vol)?)?;
            let _guard = self.driver()?.lock_volume(&id)?;
            let publish = pipeline::Publish {
                target,
                staging,
                read_only: req.readonly,
                mode: cap.mode,
                mount: opts,
            };
            let pod = publish.target.pod();
            let src = pool.source(&vol)?;
            pipeline::publish(pool.as_ref(), &vol, publish).await?;
            if pool.limits_io() {
                self.limit_pod(src, &vol, pod).await?;
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
            check_text("volume_id", &req.volume_id)?;
            let target = self.request_path("target_path", &req.target_path)?;
            if target.is_kubelet_staging() {
                return Err(Status::invalid_argument(format!(
                    "target_path {:?} is where kubelet stages volumes, not a pod's target: \
                     NodeUnpublishVolume never unmounts a staging path (NodeUnstageVolume does)",
                    req.target_path
                )));
            }
            // kubelet stops asking about its condition: the gauge would go
            // stale (another pod's mount answers again at its next stats).
            crate::metrics::forget_volume_condition(&req.volume_id);
            if self
                .by_device(&req.volume_id, &target, nodeops::unpublish_device, false)
                .await?
            {
                return Ok(csi::NodeUnpublishVolumeResponse {});
            }
            if let Some(found) = self.driver()?.find_ephemeral(&req.volume_id).await? {
                self.unpublish_ephemeral(found, target).await?;
                return Ok(csi::NodeUnpublishVolumeResponse {});
            }
            let found = match self.driver()?.find("volume_id", &req.volume_id).await {
                Err(e) if e.pool_not_open() => {
                    // As in NodeUnstageVolume: the pod's mount goes, so
                    // that the pod can, while the pool is not open.
                    tracing::warn!(volume = %truncate(&req.volume_id), error = %e,
                        "unpublishing a volume of a pool that is not open");
                    blocking(move || -> Result<_> {
                        Ok(nodeops::unpublish(&target.resolve()?, None)?)
                    })
                    .await?;
                    return Ok(csi::NodeUnpublishVolumeResponse {});
                }
                found => found?,
            };
            let Some((id, pool, vol)) = found else {
                // Nothing left to attribute the target to. An empty target is
                // idempotently gone; a mounted one is not ours to touch.
                let removed = blocking(move || -> Result<bool> {
                    Ok(nodeops::remove_unmounted_target(&target.resolve()?)?)
                })
                .await?;
                return match removed {
                    true => Ok(csi::NodeUnpublishVolumeResponse {}),
                    false => Err(Refusal::Missing {
                        kind: "volume",
                        id: truncate(&req.volume_id).to_owned(),
                    }
                    .into()),
                };
            };
            let _guard = self.driver()?.lock_volume(&id)?;
            let (src, access) = (pool.source(&vol).ok(), vol.access_type);
            blocking(move || -> Result<_> {
                Ok(nodeops::unpublish(
                    &target.resolve()?,
                    src.as_ref().map(|s| (s, access)),
                )?)
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
            let place = self.lookup_path(&req.volume_path)?;
            let (id, pool, vol) = self.driver()?.require("volume_id", &req.volume_id).await?;
            if let Some(why) = self.driver()?.pools.unusable(&id.pool) {
                // An answer, not an error: kubelet shows the condition on
                // the pod's PVC (and the health monitor reports it).
                let r = unusable_stats(&id.pool, &why, vol.size_bytes);
                let why = r.volume_condition.as_ref().map(|c| c.message.as_str());
                note_condition(id.pool.as_str(), vol.id.as_str(), why);
                return Ok(r);
            }
            let block = vol.access_type == AccessType::Block;
            let at = self.volume_path(place, &pool, &vol, !block).await?;
            let usage = pool.usage(&vol).await?;
            let condition = pool.condition(&vol).await?.or(at.mounted.err());
            note_condition(pool.name().as_str(), &vol.id, condition.as_deref());
            let stats = at.stats;
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
            let place = self.lookup_path(&req.volume_path)?;
            let staging = match req.staging_target_path.as_str() {
                "" => None,
                s => Some(self.path("staging_target_path", s).await?),
            };
            let range = super::decode_range(req.capacity_range.as_ref())?;
            let cap = match req.volume_capability.as_ref() {
                Some(c) => Some(decode_capability(c)?),
                None => None,
            };
            let (id, pool, vol) = self.driver()?.require("volume_id", &req.volume_id).await?;
            self.driver()?.require_usable(&id.pool)?;
            if let Some(cap) = &cap {
                check_access_type(cap, &vol)?;
            }
            // Only a path that holds this volume: never resize a volume on
            // the word of a path that is another volume's (or nothing).
            let at = self.volume_path(place, &pool, &vol, false).await?;
            let _guard = self.driver()?.lock_volume(&id)?;
            let expand = pipeline::Expand {
                id,
                range,
                at,
                staging,
            };
            let size = pipeline::expand(pool.as_ref(), &vol, expand).await?;
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

/// NodeGetVolumeStats of a volume whose pool cannot serve now: its size,
/// and an abnormal condition that says why.
fn unusable_stats(
    pool: &crate::ids::PoolName,
    why: &crate::pool::Unusable,
    size: u64,
) -> csi::NodeGetVolumeStatsResponse {
    csi::NodeGetVolumeStatsResponse {
        usage: vec![csi::VolumeUsage {
            available: 0,
            total: to_i64(size),
            used: 0,
            unit: csi::volume_usage::Unit::Bytes as i32,
        }],
        volume_condition: Some(csi::VolumeCondition {
            abnormal: true,
            message: format!("pool {pool} is unusable: {why}"),
        }),
    }
}

/// Records what NodeGetVolumeStats found of a volume's condition (the gauge
/// `localvol_volume_condition_abnormal`), and logs when it changes: the
/// message goes only to kubelet otherwise, and the alert on the gauge sends
/// the operator to the log.
fn note_condition(pool: &str, volume: &str, abnormal: Option<&str>) {
    let before = crate::metrics::set_volume_condition(pool, volume, abnormal.is_some());
    match (abnormal, before) {
        (Some(why), None | Some(false)) => {
            tracing::warn!(volume, condition = why, "volume condition abnormal")
        }
        (None, Some(true)) => tracing::info!(volume, "volume condition healthy again"),
        _ => {}
    }
}
