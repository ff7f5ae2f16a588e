//! The Controller service's operations: volumes and snapshots made, deleted
//! and listed, capabilities validated, capacity.

use std::future::Future;
use std::sync::Arc;

use super::checks::{
    access_type_of, chosen_fs, content_source, fit_filesystem, format_context, refuse_io_limits,
};
use super::{lock, lock_new, page, unfit, Capability, Page, PoolParams, Refusal, Result};
use super::{OpError, VolumeEntry};
use crate::blockdev::FsType;
use crate::driver::{Driver, Kind};
use crate::ids::{truncate, ParsedId, PoolName, VolumeId, VolumeName};
use crate::iolimit::IoLimits;
use crate::pool::{
    AccessType, CapacityRange, ContentSource, CreateRequest, Pool, PoolError, Snapshot,
    SnapshotRequest,
};

/// A decoded CreateVolumeRequest.
#[derive(Debug)]
pub struct NewVolume {
    pub name: VolumeName,
    /// At least one.
    pub caps: Vec<Capability>,
    pub range: CapacityRange,
    pub params: PoolParams,
    /// What the volume is made from: which kind, and its id.
    pub content: Option<(&'static str, ParsedId)>,
    pub io_limits: IoLimits,
    /// The nodes the request's topology names (requisite, then preferred;
    /// None: a segment without this driver's key). Empty: anywhere.
    pub topology: Vec<Option<String>>,
}

/// A volume made (or found made by an identical request).
#[derive(Debug)]
pub struct Created {
    pub entry: VolumeEntry,
    /// The class's format options, for the volume context.
    pub format: Vec<(String, String)>,
}

/// What CreateVolume decided before it locks or makes anything.
pub struct Planned {
    pool: Arc<dyn Pool>,
    create: CreateRequest,
    /// The class's format options, for the volume context.
    format: Vec<(String, String)>,
    /// The filesystem the volume is made with (None: a block volume, or a
    /// pool that makes none).
    fs: Option<FsType>,
}

impl Planned {
    /// The pool, its backend and what the volume gets, in words: `pool
    /// fast (lvm-thin), mount, xfs with format.xfs.reflink=false`.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "pool {} ({}), {:?}",
            self.pool.name(),
            self.pool.backend(),
            self.create.access_type
        )
        .to_lowercase();
        if let Some(fs) = self.fs {
            out += &format!(", {}", fs.as_str());
        }
        if !self.format.is_empty() {
            let opts: Vec<String> = self
                .format
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            out += &format!(" with {}", opts.join(" "));
        }
        if self.create.encryption.is_some() {
            out += ", encrypted";
        }
        out
    }
}

/// CreateVolume's checks, in its order, with nothing locked, looked up or
/// made: the pool (named, the source's, or the default), the request
/// checked against it (parameters, IO limits, access type, format options,
/// the filesystem's smallest size) and the topology. `localvol config check
/// --storage-class` runs it on pools that are not opened.
pub fn plan_volume(d: &Driver, req: NewVolume) -> Result<Planned> {
    let NewVolume {
        name,
        caps,
        range,
        params,
        content,
        io_limits,
        topology,
    } = req;
    let source_id = match &content {
        Some((kind, ParsedId::Volume(src))) => Some((*kind, src)),
        _ => None,
    };
    let pool = d.pool_for_new(params.pool.as_ref(), source_id)?;
    if params.encryption.is_some() && !pool.encrypts() {
        return unfit(format!(
            "{} applies to LVM pools; pool {} is {}",
            super::PARAM_ENCRYPTION,
            pool.name(),
            pool.backend()
        ));
    }
    if let Some(why) = params.inode_limit.and_then(|_| pool.inode_limit_refused()) {
        return unfit(why);
    }
    refuse_io_limits(pool.as_ref(), &io_limits)?;
    let access_type = access_type_of(&caps, pool.as_ref())?;
    let format = format_context(&params.format, &caps, access_type, pool.as_ref())?;
    let encrypted = params.encryption.is_some();
    let range = fit_filesystem(
        range,
        &caps,
        access_type,
        pool.default_fs_type(),
        encrypted,
        content.is_some(),
    )?;
    let fs = match pool.default_fs_type() {
        Some(default) if access_type == AccessType::Mount => Some(chosen_fs(&caps, default)?),
        _ => None,
    };
    check_topology(d, &topology)?;
    let source = content_source(pool.as_ref(), content)?;
    let create = CreateRequest {
        source,
        id: VolumeId::new(pool.name().clone(), &name),
        name,
        range,
        access_type,
        inode_limit: params.inode_limit,
        parameters: params.kept,
        encryption: params.encryption,
        io_limits,
    };
    Ok(Planned {
        pool,
        create,
        format,
        fs,
    })
}

/// CreateVolume: [`plan_volume`], then [`create_named`].
pub async fn create_volume(d: &Driver, req: NewVolume) -> Result<Created> {
    let Planned {
        pool,
        create,
        format,
        ..
    } = plan_volume(d, req)?;
    let key = create.id.key.as_str().to_owned();
    let src = match &create.source {
        Some(ContentSource::Snapshot(s) | ContentSource::Volume(s)) => Some(s.clone()),
        None => None,
    };
    let vol = create_named(
        d,
        &pool,
        Kind::Volume,
        &create.name,
        &key,
        src.as_ref(),
        || pool.create(&create),
    )
    .await?;
    Ok(Created {
        entry: VolumeEntry::of(d, vol),
        format,
    })
}

/// The one sequence that makes a named volume or snapshot in `pool`: its
/// locks (and its source's), the check that no other pool has the name,
/// then `make`.
async fn create_named<T, F, Fut>(
    d: &Driver,
    pool: &Arc<dyn Pool>,
    kind: Kind,
    name: &VolumeName,
    key: &str,
    source: Option<&VolumeId>,
    make: F,
) -> Result<T>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, PoolError>>,
{
    let _locks = lock_new(d, kind, name, key, source)?;
    d.refuse_name_elsewhere(pool.name(), name, kind).await?;
    Ok(make().await?)
}

/// A node creates a volume only when the request's topology includes it.
fn check_topology(d: &Driver, nodes: &[Option<String>]) -> Result<()> {
    if nodes.is_empty() || nodes.iter().any(|n| n.as_ref() == Some(&d.node_id)) {
        return Ok(());
    }
    Err(Refusal::NotInTopology {
        node: d.node_id.clone(),
    }
    .into())
}

/// UNIMPLEMENTED (the refusal [`Refusal::NoSnapshots`]) when no pool of
/// this node takes snapshots; the capability is then not advertised either.
pub fn snapshots_offered(d: &Driver) -> Result<()> {
    match offers_snapshots(d) {
        true => Ok(()),
        false => Err(Refusal::NoSnapshots.into()),
    }
}

/// Whether some pool of this node takes snapshots.
pub fn offers_snapshots(d: &Driver) -> bool {
    d.pools.any_snapshots()
}

/// A decoded CreateSnapshotRequest.
#[derive(Debug)]
pub struct NewSnapshot {
    pub name: VolumeName,
    /// The `source_volume_id`.
    pub source: ParsedId,
    /// Space for a thick snapshot's changes (`snapshotSize`).
    pub cow_size: Option<u64>,
}

/// CreateSnapshot: the source volume's pool, which must take snapshots,
/// then [`create_named`].
pub async fn create_snapshot(d: &Driver, req: NewSnapshot) -> Result<Snapshot> {
    let source = match req.source {
        ParsedId::Volume(id) => id,
        ParsedId::Foreign(raw) => {
            return Err(Refusal::Missing {
                kind: "source volume",
                id: truncate(&raw).to_owned(),
            }
            .into())
        }
    };
    let pool = d.pool_of_source(&source)?;
    d.require_usable(pool.name())?;
    let Some(snapshots) = pool.snapshots() else {
        return unfit(format!(
            "pool {} ({}) does not support snapshots",
            pool.name(),
            pool.backend()
        ));
    };
    let name = req.name;
    let id = VolumeId {
        pool: source.pool.clone(),
        key: name.snapshot_key(),
    };
    let key = id.key.as_str().to_owned();
    let snap = SnapshotRequest {
        id,
        name: name.clone(),
        source: source.clone(),
        cow_size: req.cow_size,
    };
    create_named(d, &pool, Kind::Snapshot, &name, &key, Some(&source), || {
        snapshots.create_snapshot(&snap)
    })
    .await
}

/// DeleteVolume: an id that cannot be this node's, or a volume already
/// gone, is deleted.
pub async fn delete_volume(d: &Driver, id: ParsedId) -> Result<()> {
    let ParsedId::Volume(id) = id else {
        return Ok(());
    };
    let _guard = lock(d, Kind::Volume, "volume_id", &id.to_string())?;
    let Some(pool) = d.pools.get(&id.pool) else {
        return Ok(());
    };
    d.require_usable(&id.pool)?;
    Ok(pool.delete(&id).await?)
}

/// DeleteSnapshot: a pool this node lacks, or one without snapshots, holds
/// no such snapshot: deleting it is done.
pub async fn delete_snapshot(d: &Driver, id: ParsedId) -> Result<()> {
    let ParsedId::Volume(id) = id else {
        return Ok(());
    };
    let _guard = lock(d, Kind::Snapshot, "snapshot_id", &id.to_string())?;
    let pool = d.pools.get(&id.pool);
    let Some(snapshots) = pool.and_then(|p| p.snapshots()) else {
        return Ok(());
    };
    d.require_usable(&id.pool)?;
    Ok(snapshots.delete_snapshot(&id).await?)
}

/// ValidateVolumeCapabilities of the volume `raw`, given its capabilities
/// decoded one by one (an undecodable one is an answer, not an error) and
/// the parameters' decoding error, if any. `Some(message)`: not confirmed.
pub async fn validate(
    d: &Driver,
    raw: &str,
    caps: Vec<Result<Capability, String>>,
    params: Option<String>,
) -> Result<Option<String>> {
    let (_, pool, vol) = d.require("volume_id", raw).await?;
    let mut unsupported = None;
    for cap in caps {
        match cap {
            Ok(cap) if cap.access_type == vol.access_type && pool.supports(cap.access_type) => {}
            Ok(cap) => {
                unsupported = Some(format!(
                    "volume is {:?}, capability asks for {:?}",
                    vol.access_type, cap.access_type
                ))
            }
            Err(e) => unsupported = Some(e),
        }
    }
    Ok(params.or(unsupported))
}

/// A decoded list request's page: where it starts, how long it may be.
#[derive(Debug)]
pub struct ListPage {
    pub token: String,
    pub max: usize,
}

/// ListVolumes: one more than a page from each pool, from the token on
/// (pools that share a volume group read it with one `lvs`); the first
/// page of them all is the answer ([`page`]).
pub async fn list_volumes(d: &Driver, req: ListPage) -> Result<Page<VolumeEntry>> {
    let token = req.token.as_str();
    let mut all = Vec::new();
    crate::lvm::one_lvs_per_vg(async {
        for pool in d.pools.iter() {
            let listed = pool.list_page(token, req.max.saturating_add(1)).await;
            let listed = d
                .pools
                .unless_unusable(pool.name(), "ListVolumes", listed)?;
            all.extend(listed.into_iter().flatten());
        }
        Ok::<_, OpError>(())
    })
    .await?;
    all.sort_by(|a, b| a.id.cmp(&b.id));
    let page = page(all, |v| &v.id, token, req.max, "volume")?;
    Ok(Page {
        entries: (page.entries.into_iter())
            .map(|v| VolumeEntry::of(d, v))
            .collect(),
        next_token: page.next_token,
    })
}

/// What a ListSnapshots request selects.
#[derive(Debug, Default)]
pub struct SnapshotFilter {
    /// One snapshot by id (None: all).
    pub snapshot: Option<ParsedId>,
    /// Only the snapshots of this volume (None: all).
    pub source_volume: Option<String>,
}

/// ListSnapshots: those selected, one page of them in id order.
pub async fn list_snapshots(
    d: &Driver,
    filter: SnapshotFilter,
    req: ListPage,
) -> Result<Page<Snapshot>> {
    let mut all = Vec::new();
    match filter.snapshot {
        // One snapshot by id; an id that cannot exist lists nothing.
        Some(ParsedId::Volume(id)) => {
            let pool = d.pools.get(&id.pool);
            if let Some(snapshots) = pool.and_then(|p| p.snapshots()) {
                all.extend(snapshots.get_snapshot(&id).await?);
            }
        }
        Some(ParsedId::Foreign(_)) => {}
        None => {
            for pool in d.pools.iter() {
                let Some(snapshots) = pool.snapshots() else {
                    continue;
                };
                let listed = snapshots.list_snapshots().await;
                let listed = d
                    .pools
                    .unless_unusable(pool.name(), "ListSnapshots", listed)?;
                all.extend(listed.into_iter().flatten());
            }
        }
    }
    if let Some(source) = &filter.source_volume {
        all.retain(|s| &s.source_volume_id == source);
    }
    all.sort_by(|a, b| a.id.cmp(&b.id));
    page(all, |s| s.id.as_str(), &req.token, req.max, "snapshot")
}

/// A decoded GetCapacityRequest.
#[derive(Debug)]
pub struct CapacityQuery {
    pub pool: Option<PoolName>,
    pub access: Vec<AccessType>,
    /// The node the request's topology names (Some(None): a segment
    /// without this driver's key); None: no topology given.
    pub node: Option<Option<String>>,
}

/// GetCapacity: `(available, maximum volume size)`, both 0 where this
/// node offers nothing: another node's topology, an access type the pool
/// lacks, or a pool that cannot serve now (the scheduler then places new
/// claims on other nodes until it is back).
pub async fn capacity(d: &Driver, q: CapacityQuery) -> Result<(u64, u64)> {
    let pool = d
        .pools
        .require(q.pool.as_ref().unwrap_or(d.pools.default_pool()))?;
    let elsewhere = q
        .node
        .as_ref()
        .is_some_and(|n| n.as_ref() != Some(&d.node_id));
    let unsupported = q.access.iter().any(|a| !pool.supports(*a));
    let unusable = d.pools.unusable(pool.name()).is_some();
    if elsewhere || unsupported || unusable {
        return Ok((0, 0));
    }
    let cap = pool.capacity().await?;
    Ok((cap.available_bytes, cap.maximum_volume_size))
}
