//! The Node service's operations: stage, publish and their inverses, stats
//! and expansion, over the node pipeline (`nodeops::pipeline`).

use std::path::Path;

use super::checks::{check_access_type, mount_options};
use super::{ephemeral, lock, unfit, Capability, Result};
use crate::blockdev::{FormatOptions, FsType};
use crate::crypt::{self, Key, KeyError, KEY_FIELD};
use crate::driver::{Driver, Kind};
use crate::error::blocking;
use crate::fsutil::{PathPlace, RequestPath};
use crate::ids::{truncate, StorageId};
use crate::locks::VolumeGuard;
use crate::nodeops::pipeline;
use crate::nodeops::{self, NodeError};
use crate::pool::{AccessType, CapacityRange, Source, Volume};

/// A decoded NodeStageVolumeRequest.
#[derive(Debug)]
pub struct Stage {
    pub volume_id: String,
    pub staging: RequestPath,
    pub cap: Capability,
    /// The node-stage secret's key, decoded; required once the volume is
    /// known to be encrypted (other volumes ignore it).
    pub key: Option<Result<Key, KeyError>>,
    /// The storage the volume context names.
    pub storage: Option<StorageId>,
    /// The volume context's format options.
    pub format: FormatOptions,
    /// The filesystem the capability names (None: the pool's default).
    pub fs_type: Option<FsType>,
}

/// NodeStageVolume: the volume made usable here and, with a filesystem,
/// mounted at the staging path (`pipeline::stage`).
pub async fn stage(d: &Driver, req: Stage) -> Result<()> {
    let Stage {
        volume_id,
        staging,
        cap,
        key,
        storage,
        format,
        fs_type,
    } = req;
    let _guard = lock(d, Kind::Volume, "volume_id", &volume_id)?;
    let (id, pool, vol) = d.require("volume_id", &volume_id).await?;
    d.require_usable(&id.pool)?;
    d.check_storage(&id, pool.as_ref(), storage.as_ref())?;
    check_access_type(&cap, &vol, &volume_id)?;
    let key = match (pool.encrypted(&vol)?, key) {
        (None, _) => None,
        (Some(_), Some(Ok(key))) => Some(key),
        (Some(_), Some(Err(e))) => {
            return unfit(format!(
                "volume {id} is encrypted; the node-stage secret's {KEY_FIELD}: {e}"
            ))
        }
        (Some(_), None) => {
            return unfit(format!(
                "volume {id} is encrypted and the node-stage secrets have no {KEY_FIELD} \
                 (StorageClass csi.storage.k8s.io/node-stage-secret-name and -namespace \
                 must name a Secret with that field)"
            ))
        }
    };
    let mount = mount_options(&cap, &pool.source(&vol)?)?;
    // Only a volume that gets a filesystem here is formatted with the
    // class's options, which must be that filesystem's; a raw block
    // volume's are not carried.
    let format = match fs_type.or(pool.default_fs_type()) {
        Some(fs) if cap.access_type == AccessType::Mount => {
            format
                .check_for(fs)
                .map_err(|e| super::Refusal::Unfit(format!("volume attributes: {e}")))?;
            format
        }
        _ => Default::default(),
    };
    let stage = pipeline::Stage {
        staging,
        fs_type,
        format,
        mount,
        key,
    };
    Ok(pipeline::stage(pool.as_ref(), &vol, stage).await?)
}

/// A decoded NodeUnstageVolumeRequest.
#[derive(Debug)]
pub struct Unstage {
    pub volume_id: String,
    pub staging: RequestPath,
}

/// NodeUnstageVolume: by the device alone where the pool names it from the
/// id, else after a lookup. A volume of a pool that could not be opened
/// cannot be looked up; its mount is released all the same (an unmount
/// loses nothing), so that its pods can go.
pub async fn unstage(d: &Driver, req: Unstage) -> Result<()> {
    let (raw, staging) = (req.volume_id.as_str(), req.staging);
    let (_guard, done) = release(d, raw, &staging, nodeops::unstage_device, true).await?;
    if done {
        return Ok(());
    }
    let src = match d.require("volume_id", raw).await {
        Err(e) if e.pool_not_open() => {
            tracing::warn!(volume = %truncate(raw), error = %e,
                "unstaging a volume of a pool that is not open");
            None
        }
        found => {
            let (_, pool, vol) = found?;
            Some(pool.source(&vol).ok())
        }
    };
    blocking(move || -> Result<_> {
        let (scope, staging) = staging.resolve_in()?;
        Ok(nodeops::unstage(&scope, &staging, src.flatten().as_ref())?)
    })
    .await
}

/// How unstage and unpublish begin: kubelet stops asking about the
/// volume's condition (its gauge would go stale; another pod's mount
/// answers again at its next stats), the volume's lock is taken, then `op`
/// by the device alone ([`by_device`]). `true`: that was all.
async fn release(
    d: &Driver,
    raw: &str,
    path: &RequestPath,
    op: fn(&Path, &Path, &Path) -> Result<bool, NodeError>,
    close: bool,
) -> Result<(VolumeGuard, bool)> {
    crate::metrics::forget_volume_condition(raw);
    let guard = lock(d, Kind::Volume, "volume_id", raw)?;
    let done = by_device(d, raw, path, op, close).await?;
    Ok((guard, done))
}

/// Unstage or unpublish (`op`) by the volume's device alone, when its pool
/// names the device from the id (LVM: no `lvs`). `Ok(false)`, having done
/// nothing: the device is not there (or the pool cannot name it), so the
/// caller looks the volume up. The caller holds the volume's lock.
///
/// An encrypted volume whose mapping is open is mounted and bound from the
/// mapping, so `op` gets the mapping's device; with `close` (unstage), the
/// mapping is closed after `op` (refused while it is still mounted or
/// bound anywhere).
async fn by_device(
    d: &Driver,
    volume_id: &str,
    path: &RequestPath,
    op: fn(&Path, &Path, &Path) -> Result<bool, NodeError>,
    close: bool,
) -> Result<bool> {
    let Some(found) = d.device_of("volume_id", volume_id)? else {
        return Ok(false);
    };
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

/// A decoded NodePublishVolumeRequest (of a volume that is not an
/// ephemeral inline one).
#[derive(Debug)]
pub struct Publish {
    pub volume_id: String,
    pub target: RequestPath,
    /// Raw block volumes are published from the device and need none.
    pub staging: Option<RequestPath>,
    pub cap: Capability,
    pub read_only: bool,
    /// The storage the volume context names.
    pub storage: Option<StorageId>,
}

/// NodePublishVolume: `pipeline::publish`, then the volume's IO limits in
/// the pod's cgroup (pools that take limits).
pub async fn publish(d: &Driver, req: Publish) -> Result<()> {
    let _guard = lock(d, Kind::Volume, "volume_id", &req.volume_id)?;
    let (id, pool, vol) = d.require("volume_id", &req.volume_id).await?;
    d.require_usable(&id.pool)?;
    d.check_storage(&id, pool.as_ref(), req.storage.as_ref())?;
    check_access_type(&req.cap, &vol, &req.volume_id)?;
    let src = pool.source(&vol)?;
    let publish = pipeline::Publish {
        mount: mount_options(&req.cap, &src)?,
        target: req.target,
        staging: req.staging,
        read_only: req.read_only,
        mode: req.cap.mode,
    };
    let pod = publish.target.pod();
    pipeline::publish(pool.as_ref(), &vol, publish).await?;
    if pool.limits_io() {
        limit_pod(d, src, &vol, pod).await?;
    }
    Ok(())
}

/// A volume's IO limits for the pod it was just published to (kubelet made
/// the pod's cgroup before it mounts volumes). A volume without limits has
/// `max` written, lifting what an earlier publish in the same pod set, best
/// effort. A target outside kubelet's layout names no pod: nothing to limit.
async fn limit_pod(
    d: &Driver,
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
    let r = nodeops::enforce_io_limits(d.cgroup_paths(), src, &vol.io_limits, Some(pod)).await;
    match r {
        Err(e) if vol.io_limits.is_unlimited() => {
            tracing::debug!(volume = %vol.id, error = %e, "no IO limits to lift");
            Ok(())
        }
        r => r.map(drop).map_err(Into::into),
    }
}

/// A decoded NodeUnpublishVolumeRequest.
#[derive(Debug)]
pub struct Unpublish {
    pub volume_id: String,
    pub target: RequestPath,
}

/// NodeUnpublishVolume: by the device alone where the pool names it, an
/// ephemeral inline volume unmounted and removed, else after a lookup. A
/// volume of a pool that is not open has its pod's mount go all the same;
/// a volume that is gone, only an empty target.
pub async fn unpublish(d: &Driver, req: Unpublish) -> Result<()> {
    let (raw, target) = (req.volume_id.as_str(), req.target);
    let (_guard, done) = release(d, raw, &target, nodeops::unpublish_device, false).await?;
    if done {
        return Ok(());
    }
    if let Some(found) = d.find_ephemeral(raw).await? {
        return ephemeral::unpublish(found, target).await;
    }
    let found = match d.find("volume_id", raw).await {
        Err(e) if e.pool_not_open() => {
            tracing::warn!(volume = %truncate(raw), error = %e,
                "unpublishing a volume of a pool that is not open");
            return blocking(move || -> Result<_> {
                Ok(nodeops::unpublish(&target.resolve()?, None)?)
            })
            .await;
        }
        found => found?,
    };
    let Some((_, pool, vol)) = found else {
        // Nothing left to attribute the target to. An empty target is
        // idempotently gone; a mounted one is not ours to touch.
        let removed = blocking(move || -> Result<bool> {
            Ok(nodeops::remove_unmounted_target(&target.resolve()?)?)
        })
        .await?;
        return match removed {
            true => Ok(()),
            false => Err(super::Refusal::Missing {
                kind: "volume",
                id: truncate(raw).to_owned(),
            }
            .into()),
        };
    };
    let (src, access) = (pool.source(&vol).ok(), vol.access_type);
    blocking(move || -> Result<_> {
        let target = target.resolve()?;
        Ok(nodeops::unpublish(
            &target,
            src.as_ref().map(|s| (s, access)),
        )?)
    })
    .await
}

/// What NodeGetVolumeStats reports: `(available, total, used)` in bytes,
/// and in inodes where the volume has a filesystem the driver can read,
/// and why the volume is abnormal (None: healthy).
#[derive(Debug, PartialEq, Eq)]
pub struct Stats {
    pub bytes: (u64, u64, u64),
    pub inodes: Option<(u64, u64, u64)>,
    pub condition: Option<String>,
}

/// NodeGetVolumeStats, which only reads: no lock, so kubelet's periodic
/// calls never make a stage or publish wait. `place` is checked once the
/// volume is known to exist: a path where it is not is NOT_FOUND then,
/// never masking an unknown volume. Each answer's condition is recorded
/// (the gauge `localvol_volume_condition_abnormal`).
pub async fn stats(d: &Driver, volume_id: &str, place: PathPlace) -> Result<Stats> {
    let (id, pool, vol) = d.require("volume_id", volume_id).await?;
    if let Some(why) = d.pools.unusable(&id.pool) {
        // An answer, not an error: kubelet shows the condition on the
        // pod's PVC (and the health monitor reports it).
        let why = format!("pool {} is unusable: {why}", id.pool);
        note_condition(id.pool.as_str(), volume_id, Some(&why));
        return Ok(Stats {
            bytes: (0, vol.size_bytes, 0),
            inodes: None,
            condition: Some(why),
        });
    }
    let block = vol.access_type == AccessType::Block;
    let at = pipeline::volume_at_path(place, pool.source(&vol)?, &vol, volume_id, !block).await?;
    let usage = pool.usage(&vol).await?;
    let condition = pool.condition(&vol).await?.or(at.mounted.err());
    note_condition(pool.name().as_str(), volume_id, condition.as_deref());
    let (bytes, inodes) = match (usage, at.stats) {
        (Some(u), _) if block => ((0, u.total_bytes, 0), None),
        (Some(u), _) => (
            (u.available_bytes, u.total_bytes, u.used_bytes),
            Some((u.free_inodes, u.total_inodes, u.used_inodes)),
        ),
        (None, Some(s)) => (
            (s.available_bytes, s.total_bytes, s.used_bytes),
            Some((s.free_inodes, s.total_inodes, s.used_inodes)),
        ),
        (None, None) => ((0, vol.size_bytes, 0), None),
    };
    Ok(Stats {
        bytes,
        inodes,
        condition,
    })
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

/// A decoded NodeExpandVolumeRequest.
pub struct NodeExpand {
    pub volume_id: String,
    /// Where the request says the volume is.
    pub place: PathPlace,
    pub staging: Option<RequestPath>,
    pub range: CapacityRange,
    pub cap: Option<Capability>,
}

/// NodeExpandVolume: only a path that holds this volume is grown (never a
/// volume on the word of a path that is another volume's, or nothing);
/// `pipeline::expand`. Returns the volume's size.
pub async fn expand_on_node(d: &Driver, req: NodeExpand) -> Result<u64> {
    let _guard = lock(d, Kind::Volume, "volume_id", &req.volume_id)?;
    let staging = match req.staging {
        Some(s) => Some(blocking(move || Ok::<_, super::OpError>(s.resolve()?)).await?),
        None => None,
    };
    let (id, pool, vol) = d.require("volume_id", &req.volume_id).await?;
    d.require_usable(&id.pool)?;
    if let Some(cap) = &req.cap {
        check_access_type(cap, &vol, &req.volume_id)?;
    }
    let at = pipeline::volume_at_path(req.place, pool.source(&vol)?, &vol, &req.volume_id, false)
        .await?;
    let expand = pipeline::Expand {
        id,
        range: req.range,
        at,
        staging,
    };
    Ok(pipeline::expand(pool.as_ref(), &vol, expand).await?)
}
