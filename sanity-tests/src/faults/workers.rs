//! The workers of a fault-injection run: each runs volume lifecycles, one
//! after another, until the killer is done (see the parent module's doc).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use localvol::csi;
use localvol::endpoint::Endpoint;

use super::{
    checksum, plan_stage_req, sized_create_req, Client, Counters, Kept, Knobs, Layout, Plan, Rng,
    FILE,
};
use crate::{delete_req, mount_at, publish_req, unpublish_req, unstage_req, write_file};

/// One full lifecycle of a new volume `name`; returns what is kept: the
/// volume, and its copy when the plan makes one.
pub async fn lifecycle(
    c: &mut Client,
    layout: &Layout,
    plan: &Plan,
    rng: &mut Rng,
    name: &str,
    keep: bool,
) -> Result<Vec<Kept>, String> {
    let req = sized_create_req(name, plan);
    let vol = c
        .call(&format!("CreateVolume {name}"), |mut csi| {
            let req = req.clone();
            async move { csi.controller.create_volume(req).await }
        })
        .await?
        .volume
        .ok_or_else(|| format!("CreateVolume {name}: no volume in the answer"))?;
    let id = vol.volume_id;

    let data = write_through_target(c, layout, plan, rng, name, &id).await?;

    if keep {
        return keep_with_copy(c, plan, rng, name, id, data).await;
    }
    let req = delete_req(&id);
    c.call(&format!("DeleteVolume {id}"), |mut csi| {
        let req = req.clone();
        async move { csi.controller.delete_volume(req).await }
    })
    .await?;
    Ok(Vec::new())
}

/// The middle of a lifecycle: stages and publishes volume `id`, writes
/// [`FILE`] of random bytes through the target, then unpublishes and
/// unstages it; returns what it wrote.
async fn write_through_target(
    c: &mut Client,
    layout: &Layout,
    plan: &Plan,
    rng: &mut Rng,
    name: &str,
    id: &str,
) -> Result<Vec<u8>, String> {
    let staging = layout.staging(name);
    let req = plan_stage_req(plan, id, &staging);
    c.call(&format!("NodeStageVolume {id}"), |mut csi| {
        let req = req.clone();
        async move { csi.node.node_stage_volume(req).await }
    })
    .await?;

    let target = layout.target(name);
    let req = publish_req(id, &staging, &target, false);
    c.call(&format!("NodePublishVolume {id}"), |mut csi| {
        let req = req.clone();
        async move { csi.node.node_publish_volume(req).await }
    })
    .await?;

    // Written through the target: it must be the volume's mount, not the
    // kubelet dir's own filesystem.
    if mount_at(&target).is_none() {
        return Err(format!(
            "{id}: NodePublishVolume succeeded but {target:?} is not a mount point"
        ));
    }
    let len = 1 + rng.below(64 * 1024) as usize;
    let data = rng.bytes(len);
    write_file(&target, FILE, &data).map_err(|e| format!("{id}: writing {target:?}: {e}"))?;

    let req = unpublish_req(id, &target);
    c.call(&format!("NodeUnpublishVolume {id}"), |mut csi| {
        let req = req.clone();
        async move { csi.node.node_unpublish_volume(req).await }
    })
    .await?;
    let req = unstage_req(id, &staging);
    c.call(&format!("NodeUnstageVolume {id}"), |mut csi| {
        let req = req.clone();
        async move { csi.node.node_unstage_volume(req).await }
    })
    .await?;
    Ok(data)
}

/// The end of a lifecycle that keeps volume `id` holding `data`: it, and
/// the copy of it the plan may make ([`copy_of`]).
async fn keep_with_copy(
    c: &mut Client,
    plan: &Plan,
    rng: &mut Rng,
    name: &str,
    id: String,
    data: Vec<u8>,
) -> Result<Vec<Kept>, String> {
    let sum = checksum(&data);
    let mut kept = vec![Kept {
        id: id.clone(),
        data: data.clone(),
        sum,
    }];
    if plan.copies {
        let copy = copy_of(c, plan, rng, name, &id).await?;
        c.counters.copies.fetch_add(1, Ordering::Relaxed);
        kept.push(Kept {
            id: copy,
            data,
            sum,
        });
    }
    Ok(kept)
}

/// A restore of a fresh snapshot of `id` (the snapshot deleted afterwards)
/// or a clone of `id`, at random; returns the new volume's id.
async fn copy_of(
    c: &mut Client,
    plan: &Plan,
    rng: &mut Rng,
    name: &str,
    id: &str,
) -> Result<String, String> {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let restore = rng.below(2) == 0;
    let mut snapshot_id = None;
    let source = if restore {
        let req = csi::CreateSnapshotRequest {
            name: format!("{name}-snap"),
            source_volume_id: id.to_owned(),
            parameters: plan.snapshot_params.iter().cloned().collect(),
            ..Default::default()
        };
        let snap = c
            .call(&format!("CreateSnapshot of {id}"), |mut csi| {
                let req = req.clone();
                async move { csi.controller.create_snapshot(req).await }
            })
            .await?
            .snapshot
            .ok_or_else(|| format!("CreateSnapshot of {id}: no snapshot in the answer"))?;
        snapshot_id = Some(snap.snapshot_id.clone());
        Type::Snapshot(SnapshotSource {
            snapshot_id: snap.snapshot_id,
        })
    } else {
        Type::Volume(VolumeSource {
            volume_id: id.to_owned(),
        })
    };
    let copy_name = format!("{name}-{}", if restore { "restore" } else { "clone" });
    let req = csi::CreateVolumeRequest {
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(source),
        }),
        ..sized_create_req(&copy_name, plan)
    };
    let vol = c
        .call(&format!("CreateVolume {copy_name} from {id}"), |mut csi| {
            let req = req.clone();
            async move { csi.controller.create_volume(req).await }
        })
        .await?
        .volume
        .ok_or_else(|| format!("CreateVolume {copy_name}: no volume in the answer"))?;
    if let Some(sid) = snapshot_id {
        let req = csi::DeleteSnapshotRequest {
            snapshot_id: sid.clone(),
            ..Default::default()
        };
        c.call(&format!("DeleteSnapshot {sid}"), |mut csi| {
            let req = req.clone();
            async move { csi.controller.delete_snapshot(req).await }
        })
        .await?;
    }
    Ok(vol.volume_id)
}

/// Runs lifecycles until `done`; returns the kept volumes (or the first failure).
pub async fn worker(
    w: usize,
    seed: u64,
    endpoint: Endpoint,
    layout: Arc<Layout>,
    plan: Plan,
    counters: Arc<Counters>,
    knobs: Knobs,
) -> Result<Vec<Kept>, String> {
    let mut rng = Rng(seed);
    let mut c = Client {
        endpoint,
        csi: None,
        counters: counters.clone(),
        worker: w,
        rpc_timeout: knobs.rpc_timeout,
        step_deadline: knobs.step_deadline,
    };
    let mut kept = Vec::new();
    let mut n = 0;
    while !counters.done.load(Ordering::SeqCst) && !counters.failed.load(Ordering::SeqCst) {
        let name = format!("fi-w{w}-{n}");
        n += 1;
        let keep = rng.below(4) == 0
            && counters
                .kept
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| {
                    (k < knobs.max_kept).then_some(k + 1)
                })
                .is_ok();
        match lifecycle(&mut c, &layout, &plan, &mut rng, &name, keep).await {
            Ok(k) => {
                counters.lifecycles.fetch_add(1, Ordering::Relaxed);
                kept.extend(k);
            }
            Err(e) => {
                counters.failed.store(true, Ordering::SeqCst);
                return Err(e);
            }
        }
    }
    Ok(kept)
}
