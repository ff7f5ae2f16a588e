//! CSI Node service: stage, publish, stats and expansion on this node.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{decode_capability, rpc, to_i64, Capability, Driver, Result};
use crate::blockdev::{self, Content, FsType};
use crate::crypt::{self, Key, KEY_FIELD};
use crate::csi;
use crate::csi::node_service_capability::{rpc::Type as RpcType, Rpc, Type as CapType};
use crate::error::blocking;
use crate::fsutil::{self, PathPlace, RequestPath};
use crate::ids::{check_text, truncate, VolumeName};
use crate::mount::parse_bind_flag;
use crate::nodeops::{self, MountAt, NodeError};
use crate::pool::{
    AccessMode, AccessType, CapacityRange, CreateRequest, Pool, Source, Volume, EPHEMERAL_KEY,
    EPHEMERAL_TARGET_KEY,
};
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
        blocking(move || Ok(rp.resolve()?)).await
    }

    /// The checks of [`NodeService::path`] that need no filesystem; the caller
    /// resolves it in the blocking call that uses it (one handoff, not two).
    fn request_path(&self, what: &'static str, p: &str) -> Result<RequestPath> {
        Ok(RequestPath::parse(what, &self.driver.kubelet_dir, p)?)
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
        let Some(found) = self.driver.device_of("volume_id", volume_id)? else {
            return Ok(false);
        };
        let _guard = self.driver.lock_volume(&found.id)?;
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
    /// found: the answers here are NOT_FOUND (the volume is not at that path),
    /// which must not mask an invalid argument or an unknown volume. One
    /// blocking call resolves the path, checks it exists, looks at what is
    /// mounted there and, with `stats`, takes the filesystem's figures there.
    ///
    /// NOT_FOUND: the path cannot hold a volume of this driver (relative, or
    /// outside the kubelet dir), does not exist, or holds another mount.
    /// Otherwise the path, `Err(why)` when the volume is not mounted there
    /// (a plain directory, or the volume cannot be located), and the figures.
    async fn volume_path(
        &self,
        place: PathPlace,
        pool: &Arc<dyn Pool>,
        vol: &Volume,
        stats: bool,
    ) -> Result<VolumeAtPath> {
        let rp = match place {
            PathPlace::Below(rp) => rp,
            PathPlace::Elsewhere(why) => {
                return Err(Status::not_found(format!(
                    "volume {} is not at that path: {why}",
                    vol.id
                )))
            }
        };
        let (src, access, id) = (pool.source(vol)?, vol.access_type, vol.id.clone());
        blocking(move || -> Result<_> {
            let path = rp.resolve()?;
            let mounted = match nodeops::volume_at(&path, &src, access)? {
                MountAt::Missing => {
                    return Err(Status::not_found(format!(
                        "volume_path {path:?} does not exist"
                    )))
                }
                MountAt::Volume => Ok(()),
                MountAt::Unlocated(why) => Err(why),
                MountAt::Nothing => Err(format!("{path:?} is not a mount of this volume")),
                MountAt::Stale => Err(format!(
                    "{path:?} is not a mount of this volume: it binds the volume's device node as it was before the device was recreated"
                )),
                MountAt::Other => {
                    return Err(Status::not_found(format!(
                        "volume {id} is not at {path:?}: another mount is there"
                    )))
                }
            };
            let stats = match stats {
                true => Some(fsutil::fs_stats(&path)?),
                false => None,
            };
            Ok(VolumeAtPath {
                path,
                mounted,
                stats,
            })
        })
        .await
    }

    /// The `volume_path` of NodeGetVolumeStats / NodeExpandVolume, decoded:
    /// malformed text is INVALID_ARGUMENT, a well-formed path where no volume
    /// can be is answered later, once the volume is known to exist.
    fn lookup_path(&self, p: &str) -> Result<PathPlace> {
        Ok(RequestPath::place(
            "volume_path",
            &self.driver.kubelet_dir,
            p,
        )?)
    }
}

/// What [`NodeService::volume_path`] found.
struct VolumeAtPath {
    path: PathBuf,
    /// `Err(why)`: the volume is not mounted at the path.
    mounted: std::result::Result<(), String>,
    /// statvfs at the path, when asked for.
    stats: Option<fsutil::FsStats>,
}

impl NodeService {
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
        let pool_name = attrs
            .params
            .pool
            .clone()
            .unwrap_or_else(|| self.driver.pools.default_pool().clone());
        let pool = self.driver.pools.require(&pool_name)?.clone();
        if pool.backend() != "dir" {
            return Err(Status::invalid_argument(format!(
                "ephemeral volumes come from dir pools; pool {pool_name} is {}",
                pool.backend()
            )));
        }
        let src_flags = mount_options(&cap, &Source::Directory(PathBuf::new()))?.flags;
        let target = blocking(move || -> Result<_> { Ok(target.resolve()?) }).await?;
        let id = crate::ids::VolumeId::new(pool_name, &name);
        let _guard = self.driver.lock_volume(&id)?;
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

/// Picks the filesystem for a device volume and creates it if the device is
/// blank. Existing data is never reformatted: a filesystem already there is
/// used as it is, and a request for another type is refused.
async fn prepare_filesystem(
    dev: &std::path::Path,
    cap: &Capability,
    default: Option<FsType>,
    unformatted: bool,
) -> Result<FsType> {
    let requested = match cap.fs_type.as_str() {
        "" => None,
        t => Some(FsType::parse(t)?),
    };
    let fs_if_blank = requested.or(default).unwrap_or(FsType::Ext4);
    if unformatted {
        // The pool says the driver never finished a filesystem here: what is
        // on the device can only be a format of its own cut short.
        let found = blockdev::format_whole(dev, fs_if_blank).await?;
        if found != Content::Empty {
            tracing::warn!(
                device = ?dev,
                ?found,
                "replaced what a cut-short format left on a volume that was never formatted"
            );
        }
        return Ok(fs_if_blank);
    }
    match blockdev::format_if_blank(dev, fs_if_blank).await? {
        Content::Empty => Ok(fs_if_blank),
        Content::Filesystem(t) => {
            let found = FsType::parse(&t).map_err(|_| {
                Status::failed_precondition(format!(
                    "{dev:?} holds a {t} filesystem, which this driver does not mount"
                ))
            })?;
            if requested.is_some_and(|r| r != found) {
                return Err(Status::failed_precondition(format!(
                    "{dev:?} already holds {t}; the request asks for {}: not reformatting",
                    cap.fs_type
                )));
            }
            Ok(found)
        }
        Content::Luks => Err(Status::failed_precondition(format!(
            "{dev:?} holds a LUKS (encrypted) volume, but the volume is not recorded as encrypted; not formatting or mounting it"
        ))),
        Content::Other(what) => Err(Status::failed_precondition(format!(
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
            let cap = node_capability(req.volume_capability.as_ref())?;
            // Decoded now, required below once the volume is known to be
            // encrypted (other volumes ignore it).
            let key = req.secrets.get(KEY_FIELD).map(|v| Key::new(v.as_bytes()));
            let storage = super::decode_storage_id(&req.volume_context)?;
            let (id, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            super::check_storage(&id, pool.as_ref(), storage.as_ref())?;
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
            let src = pool.source(&vol)?;
            let opts = mount_options(&cap, &src)?;
            let _guard = self.driver.lock_volume(&id)?;
            if vol.inactive {
                pool.activate(&vol).await?;
            }
            if let (Some(enc), Some(key)) = (&enc, &key) {
                // LUKS2 on the LV if it is blank, then open (or reuse) the
                // mapping: `src` is the mapping from here on.
                crypt::ensure_open(&enc.backing, &enc.mapping, key).await?;
            }
            drop(key);
            match (src, vol.access_type) {
                (Source::Directory(dir), _) if !pool.stages_directories() => {
                    // Published straight from the source: checked, not mounted.
                    blocking(move || -> Result<()> {
                        staging.resolve()?;
                        Ok(nodeops::check_dir(&dir)?)
                    })
                    .await?;
                }
                (Source::Directory(dir), _) => {
                    blocking(move || -> Result<()> {
                        Ok(nodeops::stage_dir(&dir, &staging.resolve()?)?)
                    })
                    .await?;
                }
                // Raw block volumes are published straight from the device;
                // the staging path is only checked.
                (Source::Device(_), AccessType::Block) => {
                    blocking(move || staging.resolve()).await?;
                }
                (Source::Device(dev), AccessType::Mount) => {
                    let d = dev.clone();
                    let (staging, staged) = blocking(move || -> Result<_> {
                        let staging = staging.resolve()?;
                        let want = nodeops::device_fs_location(&d)?;
                        let staged = nodeops::staged_fs_type(&staging, &want)?;
                        Ok((staging, staged))
                    })
                    .await?;
                    if let Some(fs) = staged {
                        // A retry after the grow below failed: grow it now.
                        if vol.grow_filesystem {
                            if let Some(enc) = &enc {
                                crypt::resize(&enc.mapping).await?;
                            }
                            blockdev::grow_fs(&dev, &staging, FsType::parse(&fs)?).await?;
                            pool.filesystem_grown(&vol).await?;
                        }
                        return Ok(csi::NodeStageVolumeResponse {});
                    }
                    let fs =
                        prepare_filesystem(&dev, &cap, pool.default_fs_type(), vol.unformatted)
                            .await?;
                    if vol.unformatted {
                        // Before the mount: no data is ever written to a
                        // volume the next stage would format whole.
                        pool.filesystem_made(&vol).await?;
                    }
                    let mut data = opts.data;
                    if !fs.default_mount_data().is_empty() {
                        data.push(fs.default_mount_data().to_owned());
                    }
                    let data = data.join(",");
                    let (d, st) = (dev.clone(), staging.clone());
                    blocking(move || -> Result<_> {
                        Ok(nodeops::stage_device(
                            &d,
                            &st,
                            fs.as_str(),
                            opts.flags,
                            &data,
                        )?)
                    })
                    .await?;
                    // Restored or cloned into a larger volume: the filesystem
                    // still has its source's size until it is grown.
                    if vol.grow_filesystem {
                        if let Some(enc) = &enc {
                            crypt::resize(&enc.mapping).await?;
                        }
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
                .by_device(&req.volume_id, &staging, nodeops::unstage_device, true)
                .await?
            {
                return Ok(csi::NodeUnstageVolumeResponse {});
            }
            let (id, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            let _guard = self.driver.lock_volume(&id)?;
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
            let (id, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            super::check_storage(&id, pool.as_ref(), storage.as_ref())?;
            check_access_type(&cap, &vol)?;
            let src = pool.source(&vol)?;
            let opts = mount_options(&cap, &src)?;
            if let Some(enc) = pool.encrypted(&vol)? {
                // Its source is the mapping NodeStage opens (with the key).
                let name = enc.mapping.clone();
                if blocking(move || Ok::<_, Status>(crypt::mapped_device(&name)?)).await?.is_none() {
                    return Err(Status::failed_precondition(format!(
                        "volume {id} is encrypted and not staged (mapping {} is not open); call NodeStageVolume first",
                        enc.mapping
                    )));
                }
            }
            let read_only = req.readonly || cap.mode.read_only();
            let single_writer = cap.mode == AccessMode::SingleNodeSingleWriter;
            if let (Source::Device(dev), AccessType::Block) = (&src, vol.access_type) {
                let dev = dev.clone();
                let _guard = self.driver.lock_volume(&id)?;
                if vol.inactive {
                    pool.activate(&vol).await?;
                }
                blocking(move || -> Result<_> {
                    let (scope, target) = target.resolve_in()?;
                    Ok(nodeops::publish_block(&dev, &scope, &target, read_only, single_writer)?)
                })
                .await?;
                return Ok(csi::NodePublishVolumeResponse {});
            }
            if let (Source::Directory(dir), false) = (&src, pool.stages_directories()) {
                let dir = dir.clone();
                let _guard = self.driver.lock_volume(&id)?;
                blocking(move || -> Result<_> {
                    let (scope, target) = target.resolve_in()?;
                    Ok(nodeops::publish_unstaged(
                        &scope,
                        &dir,
                        &target,
                        read_only,
                        opts.flags,
                        single_writer,
                    )?)
                })
                .await?;
                return Ok(csi::NodePublishVolumeResponse {});
            }
            let staging = staging.ok_or_else(|| {
                Status::invalid_argument("staging_target_path is required")
            })?;
            let _guard = self.driver.lock_volume(&id)?;
            let access = vol.access_type;
            blocking(move || -> Result<_> {
                let (staging, (scope, target)) = (staging.resolve()?, target.resolve_in()?);
                Ok(nodeops::publish(
                    &scope,
                    &staging,
                    &target,
                    &src,
                    access,
                    read_only,
                    opts.flags,
                    single_writer,
                )?)
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
                .by_device(&req.volume_id, &target, nodeops::unpublish_device, false)
                .await?
            {
                return Ok(csi::NodeUnpublishVolumeResponse {});
            }
            if let Some((id, pool, vol)) = self.driver.find_ephemeral(&req.volume_id).await? {
                // Unmount first, then remove the volume (its pool refuses
                // while it is still mounted anywhere).
                let _guard = self.driver.lock_volume(&id)?;
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
                return Ok(csi::NodeUnpublishVolumeResponse {});
            }
            let found = self.driver.find("volume_id", &req.volume_id).await?;
            let Some((id, pool, vol)) = found else {
                // Nothing left to attribute the target to. An empty target is
                // idempotently gone; a mounted one is not ours to touch.
                let removed = blocking(move || -> Result<bool> {
                    Ok(nodeops::remove_unmounted_target(&target.resolve()?)?)
                })
                .await?;
                if !removed {
                    return Err(Status::not_found(format!(
                        "volume {:?} does not exist",
                        req.volume_id
                    )));
                }
                return Ok(csi::NodeUnpublishVolumeResponse {});
            };
            let _guard = self.driver.lock_volume(&id)?;
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
            let (_, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            let block = vol.access_type == AccessType::Block;
            let at = self.volume_path(place, &pool, &vol, !block).await?;
            let usage = pool.usage(&vol).await?;
            let condition = pool.condition(&vol).await?.or(at.mounted.err());
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
            let range = super::controller::decode_range(req.capacity_range.as_ref())?;
            let cap = match req.volume_capability.as_ref() {
                Some(c) => Some(decode_capability(c)?),
                None => None,
            };
            let (id, pool, vol) = self.driver.require("volume_id", &req.volume_id).await?;
            if let Some(cap) = &cap {
                check_access_type(cap, &vol)?;
            }
            // Only a path that holds this volume: never resize a volume on
            // the word of a path that is another volume's (or nothing).
            let VolumeAtPath { path, mounted, .. } =
                self.volume_path(place, &pool, &vol, false).await?;
            if let Err(why) = mounted {
                return Err(Status::failed_precondition(format!(
                    "not expanding volume {id}: {why}; publish or stage it first"
                )));
            }
            let _guard = self.driver.lock_volume(&id)?;
            // The volume lives here, so the node applies the size: this is what
            // makes a central resizer work, whose ControllerExpandVolume may run
            // on another node.
            let size = if range.required > vol.size_bytes || pool.expands_on_node() {
                pool.expand(&id, range).await?.size_bytes
            } else {
                vol.size_bytes
            };
            // Encrypted: the open mapping grows to the LV, then what is on it.
            if let Some(enc) = pool.encrypted(&vol)? {
                crypt::resize(&enc.mapping).await?;
            }
            // Device volumes with a filesystem: grow it online to the new size.
            if let (Source::Device(dev), AccessType::Mount) = (pool.source(&vol)?, vol.access_type)
            {
                let mount_point = staging.unwrap_or(path);
                let mp = mount_point.clone();
                let fs = blocking(move || nodeops::fs_type_at(&mp))
                    .await?
                    .ok_or_else(|| {
                        Status::failed_precondition(format!(
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
                accessible_topology: Some(super::topology(&self.driver)),
            })
        })
        .await
    }
}
