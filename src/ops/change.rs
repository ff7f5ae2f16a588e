//! ControllerExpandVolume and ControllerModifyVolume: a volume of this node
//! is changed here; one of another node is checked against what the
//! cluster knows of it, and its own node applies the change.

use tokio::sync::OnceCell;

use super::checks::refuse_io_limits;
use super::{lock, Refusal, Result};
use crate::driver::{Driver, Kind};
use crate::ids::{truncate, ParsedId, VolumeId};
use crate::iolimit::IoChange;
use crate::k8s::room::{Room, Verdict};
use crate::pool::{CapacityRange, Expanded};
use crate::size::human;

/// What the cluster knows of other nodes' free space (expansion), asked
/// for once: the in-cluster config does not come and go.
#[derive(Default)]
pub struct Cluster {
    room: OnceCell<Option<Room>>,
}

impl Cluster {
    /// A cluster reached through `client` (a test's fake API server).
    #[cfg(test)]
    pub fn with(client: kube::Client, driver_name: &str) -> Self {
        Cluster {
            room: OnceCell::new_with(Some(Some(Room::new(client, driver_name)))),
        }
    }

    /// The cluster's view of free space; None outside a cluster.
    async fn room(&self, driver_name: &str) -> Option<&Room> {
        self.room
            .get_or_init(|| async {
                match crate::k8s::in_cluster_client().await {
                    Ok(client) => Some(Room::new(client, driver_name)),
                    Err(e) => {
                        tracing::info!(error = %e, "no cluster: expansion of volumes on other nodes is checked by their node only");
                        None
                    }
                }
            })
            .await
            .as_ref()
    }
}

/// A decoded ControllerExpandVolumeRequest.
#[derive(Debug)]
pub struct Expand {
    pub volume_id: String,
    /// Not empty (required or limit set).
    pub range: CapacityRange,
}

/// ControllerExpandVolume. A pool whose node grows its volumes
/// (`expands_on_node`) only checks the growth against its free space, so
/// the PV never grows beyond what NodeExpandVolume can do; the others grow
/// the volume here.
pub async fn expand_volume(d: &Driver, cluster: &Cluster, req: Expand) -> Result<Expanded> {
    let (raw, range) = (req.volume_id.as_str(), req.range);
    let _guard = lock(d, Kind::Volume, "volume_id", raw)?;
    let Some((id, pool, vol)) = d.find("volume_id", raw).await? else {
        return expand_elsewhere(d, cluster, raw, range).await;
    };
    d.require_usable(&id.pool)?;
    if !pool.expands_on_node() {
        return Ok(pool.expand(&id, range).await?);
    }
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
    Ok(Expanded {
        size_bytes: size,
        node_expansion_required: true,
    })
}

/// ControllerExpandVolume of a volume this node does not hold. Volumes
/// live on their node, and the resizer calls the driver on its own node;
/// an id in our format may name a volume on another node, which applies
/// the size in NodeExpandVolume. Before the PV grows, the cluster's
/// CSIStorageCapacity for that node and class must have room for the
/// growth (`k8s::room`). Anything not in our format is not ours.
async fn expand_elsewhere(
    d: &Driver,
    cluster: &Cluster,
    volume_id: &str,
    range: CapacityRange,
) -> Result<Expanded> {
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
    match cluster.room(&d.name).await {
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
    Ok(Expanded {
        size_bytes: size,
        node_expansion_required: true,
    })
}

/// A decoded ControllerModifyVolumeRequest.
#[derive(Debug)]
pub struct Modify {
    pub volume_id: String,
    /// No parameters (proto3 cannot tell an empty map from a missing one):
    /// nothing to change, for a volume that must still exist.
    pub change: IoChange,
}

/// ControllerModifyVolume: IO limits are the only mutable parameters. The
/// node that holds the volume records them (an LV tag) and writes them
/// into the `io.max` of the pods that have it published, at once. A volume
/// of another node is checked and accepted ([`modify_elsewhere`]).
pub async fn modify_volume(d: &Driver, cluster: &Cluster, req: Modify) -> Result<()> {
    let (raw, change) = (req.volume_id.as_str(), req.change);
    let _guard = lock(d, Kind::Volume, "volume_id", raw)?;
    let Some((id, pool, vol)) = d.find("volume_id", raw).await? else {
        return modify_elsewhere(d, cluster, raw, &change).await;
    };
    d.require_usable(&id.pool)?;
    let limits = change.apply_to(vol.io_limits);
    refuse_io_limits(pool.as_ref(), &limits)?;
    if !pool.limits_io() {
        // Nothing asked that such a pool could record.
        return Ok(());
    }
    pool.set_io_limits(&id, limits).await?;
    crate::nodeops::enforce_io_limits(d.cgroup_paths(), pool.source(&vol)?, &limits, None).await?;
    Ok(())
}

/// ControllerModifyVolume of a volume this node does not hold: accepted
/// when it is this driver's and its pool, as this node has it configured,
/// takes limits. external-resizer then points the PV at the new
/// VolumeAttributesClass, and the owning node, which watches its PVs,
/// applies that class's parameters (`attributes.rs`). Without a cluster
/// there is no other node: [`Refusal::Missing`].
async fn modify_elsewhere(
    d: &Driver,
    cluster: &Cluster,
    volume_id: &str,
    change: &IoChange,
) -> Result<()> {
    let ParsedId::Volume(id) = VolumeId::parse("volume_id", volume_id)? else {
        return Err(Refusal::NotOurs {
            id: truncate(volume_id).to_owned(),
        }
        .into());
    };
    if cluster.room(&d.name).await.is_none() {
        return Err(Refusal::Missing {
            kind: "volume",
            id: truncate(volume_id).to_owned(),
        }
        .into());
    }
    if let Some(pool) = d.pools.get(&id.pool) {
        refuse_io_limits(pool.as_ref(), &change.apply_to(Default::default()))?;
    }
    tracing::info!(volume = %volume_id, "not on this node: its node applies the new attributes when its PV names their class");
    Ok(())
}
