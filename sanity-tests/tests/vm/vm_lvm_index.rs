//! The LVM pools' in-memory index (`src/pool/lvm/index.rs`) in a real kernel:
//! what a lifecycle costs in `lvm` runs, counted by the driver itself
//! (`localvol_lvm_runs_total` on /metrics), and that the LVs stay the ground
//! truth when an operator changes them behind the driver's back.
//!
//! `#[ignore]`d by a plain `cargo test`: `make test-vm` runs them in the VM.
//! The pools here keep no reserve, so a thick pool's create leaves the room
//! check to lvcreate (the path `localvol bench` takes on a default config).

use localvol::csi;
use sanity_tests::LvmFx as Fx;
use sanity_tests::LvmKind as Kind;
use sanity_tests::*;
use tonic::Code;

thick_and_thin!(
    a_lifecycle_runs_lvm_three_times,
    an_lv_removed_behind_the_drivers_back_is_noticed,
    an_lv_retagged_behind_the_drivers_back_is_noticed,
);

/// A pool of `kind` without a reserve, its /metrics on a port of its own.
async fn fixture(kind: Kind) -> (Fx, u16) {
    let port = free_port();
    let f = Fx::start_with(
        kind,
        Fx::VG_BYTES,
        Fx::THIN_BYTES,
        |mut o| {
            o.reserve = None;
            o
        },
        |d| DriverOpts {
            metrics_addr: Some(format!("127.0.0.1:{port}")),
            ..d
        },
    )
    .await;
    (f, port)
}

/// An 8 MiB mount volume (the VG holds a few beside each other).
fn small(name: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        capacity_range: Some(range(8 * MI, 0)),
        ..create_req(name)
    }
}

/// lvm runs so far, by RPC method (`caller`), from the driver's /metrics.
fn lvm_runs(port: u16) -> std::collections::BTreeMap<String, f64> {
    let (status, body) = http_get(port, "/metrics").expect("GET /metrics");
    assert!(status.contains("200"), "{status}");
    let mut by = std::collections::BTreeMap::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("localvol_lvm_runs_total{caller=\"") else {
            continue;
        };
        let (caller, rest) = rest.split_once('"').expect("a caller label");
        let value: f64 = rest
            .rsplit_once(' ')
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        *by.entry(caller.to_owned()).or_default() += value;
    }
    by
}

/// lvm runs by `rpc` since `seen`, which becomes now.
fn runs_since(seen: &mut std::collections::BTreeMap<String, f64>, port: u16, rpc: &str) -> f64 {
    let now = lvm_runs(port);
    let n = now.get(rpc).copied().unwrap_or(0.0) - seen.get(rpc).copied().unwrap_or(0.0);
    *seen = now;
    n
}

/// Create, stage, publish (with data), stats, unpublish, unstage, stage and
/// publish again (the data is there), delete: the lvm runs counted by the
/// driver per RPC. Create: lvcreate alone (a thin pool checks its room from
/// the thin pool's device-mapper status and the index's promises). The first
/// NodeStage: the removal of the `unformatted` tag after mkfs. Every other
/// node RPC, NodeGetVolumeStats included: none (the index, the device node
/// and device-mapper answer; the second stage must not take the volume for
/// an unformatted one). Delete: one run checked by lvm's own selection:
/// thick, the lvchange tagging the LV deleted for the wiper; thin, the
/// lvremove. So three in all, thick and thin.
async fn a_lifecycle_runs_lvm_three_times(kind: Kind) {
    require_root();
    let (f, port) = fixture(kind).await;
    let d = &f.d;
    let (staging, target) = (d.staging_path("count"), d.target_path("count"));
    let mut per_rpc = Vec::new();
    let mut seen = lvm_runs(port);
    let mut count = |rpc: &'static str, per_rpc: &mut Vec<(&str, f64)>| {
        per_rpc.push((rpc, runs_since(&mut seen, port, rpc)));
    };
    let vol = must("create", f.create(small("count")).await);
    let id = vol.volume_id.as_str();
    count("CreateVolume", &mut per_rpc);
    d.stage(id, &staging).await;
    count("NodeStageVolume", &mut per_rpc);
    d.publish(id, &staging, &target, false).await;
    count("NodePublishVolume", &mut per_rpc);
    write_file(&target, "data", b"index").unwrap();
    let s = ok(
        "stats",
        d.node().node_get_volume_stats(stats_req(id, &target)).await,
    );
    let healthy = s.volume_condition.as_ref().is_some_and(|c| !c.abnormal);
    assert!(healthy, "{kind:?}: {s:?}");
    count("NodeGetVolumeStats", &mut per_rpc);
    d.unpublish(id, &target).await;
    count("NodeUnpublishVolume", &mut per_rpc);
    d.unstage(id, &staging).await;
    count("NodeUnstageVolume", &mut per_rpc);
    d.stage(id, &staging).await;
    count("NodeStageVolume", &mut per_rpc);
    d.publish(id, &staging, &target, false).await;
    count("NodePublishVolume", &mut per_rpc);
    assert_eq!(
        std::fs::read(target.join("data")).ok().as_deref(),
        Some(&b"index"[..]),
        "{kind:?}: the second stage lost the data"
    );
    d.unpublish(id, &target).await;
    d.unstage(id, &staging).await;
    count("NodeUnstageVolume", &mut per_rpc);
    d.delete(id).await;
    count("DeleteVolume", &mut per_rpc);
    f.wait_for_wipes().await;
    f.assert_lv_gone(id);
    println!("{kind:?}: lvm runs per RPC of one lifecycle: {per_rpc:?}");
    assert_eq!(per_rpc[1].1, 1.0, "{kind:?}: first stage: {per_rpc:?}");
    for (rpc, n) in per_rpc[2..per_rpc.len() - 1].iter() {
        assert_eq!(*n, 0.0, "{kind:?}: {rpc} ran lvm: {per_rpc:?}");
    }
    let total: f64 = per_rpc.iter().map(|(_, n)| n).sum();
    assert!(total <= 3.0, "{kind:?}: {total} lvm runs: {per_rpc:?}");
    assert_eq!(
        per_rpc[per_rpc.len() - 1].1,
        1.0,
        "{kind:?}: delete: {per_rpc:?}"
    );
    assert_eq!(per_rpc[0].1, 1.0, "{kind:?}: create: {per_rpc:?}");
    assert!(
        per_rpc[0].1 >= 1.0 && per_rpc[per_rpc.len() - 1].1 >= 1.0,
        "{kind:?}: no lvcreate or removal counted: {per_rpc:?}"
    );
}

/// An LV an operator removes (here: while the driver's index holds it) is
/// NOT_FOUND for NodeStage (its device node is gone, so the index is not
/// believed), no longer listed, and deleting it is an idempotent success.
/// One an operator deactivates is activated again by NodeStage.
async fn an_lv_removed_behind_the_drivers_back_is_noticed(kind: Kind) {
    require_root();
    let (f, _) = fixture(kind).await;
    let d = &f.d;
    let gone = must("create", f.create(small("gone")).await);
    let kept = must("create", f.create(small("kept")).await);
    run_cmd(
        "lvm",
        &[
            "lvremove",
            "-qq",
            "-y",
            &format!("{}/{}", f.vg.vg, lv_name(&gone.volume_id)),
        ],
    );
    let staging = d.staging_path("gone");
    let r = d
        .node()
        .node_stage_volume(stage_req(&gone.volume_id, &staging))
        .await;
    must_fail("NodeStage of a removed LV", r, Code::NotFound);
    let listed: Vec<String> = d.list_ids().await;
    assert_eq!(listed, [kept.volume_id.as_str()], "{kind:?}");
    d.delete(&gone.volume_id).await;

    // Deactivated by hand: the device node is gone, lvm is asked, the LV
    // is activated and staged.
    run_cmd(
        "lvm",
        &[
            "lvchange",
            "-qq",
            "-an",
            &format!("{}/{}", f.vg.vg, lv_name(&kept.volume_id)),
        ],
    );
    let staging = d.staging_path("kept");
    d.stage(&kept.volume_id, &staging).await;
    assert!(f.lv(&kept.volume_id).expect("kept's LV").is_active());
    d.unstage(&kept.volume_id, &staging).await;
    d.delete(&kept.volume_id).await;
    f.wait_for_wipes().await;
}

/// An operator retags LVs the index holds. Delete does not trust the index:
/// an LV whose `localvol` tag was removed is refused (and kept). A renamed
/// volume (`localvol.name=` changed) is not answered to a CreateVolume of
/// its old name (ALREADY_EXISTS: its id is taken by another name's volume);
/// ListVolumes lists the renamed LV and not the disowned one, and once
/// listed (the index re-read) the disowned LV is NOT_FOUND for NodeStage.
async fn an_lv_retagged_behind_the_drivers_back_is_noticed(kind: Kind) {
    require_root();
    let (f, _) = fixture(kind).await;
    let d = &f.d;
    let disowned = must("create", f.create(small("disowned")).await);
    let renamed = must("create", f.create(small("renamed")).await);
    let lv_of = |v: &csi::Volume| format!("{}/{}", f.vg.vg, lv_name(&v.volume_id));
    run_cmd(
        "lvm",
        &["lvchange", "-qq", "--deltag", "localvol", &lv_of(&disowned)],
    );
    let r = f.delete_volume(&disowned.volume_id).await;
    must_fail("Delete of a disowned LV", r, Code::FailedPrecondition);
    assert!(
        f.lv(&disowned.volume_id).is_some(),
        "a disowned LV was removed"
    );

    run_cmd(
        "lvm",
        &[
            "lvchange",
            "-qq",
            "--deltag",
            "localvol.name=renamed",
            "--addtag",
            "localvol.name=other-name",
            &lv_of(&renamed),
        ],
    );
    // The old name hashes to the renamed LV's id: that LV now says it is
    // another name's volume.
    let r = f.create(small("renamed")).await;
    must_fail(
        "CreateVolume of a renamed volume's old name",
        r,
        Code::AlreadyExists,
    );
    let listed = d.list_all().await;
    let ids: Vec<&str> = listed.iter().map(|v| v.volume_id.as_str()).collect();
    assert_eq!(ids, [renamed.volume_id.as_str()], "{kind:?}: {listed:?}");
    let staging = d.staging_path("disowned");
    let r = d
        .node()
        .node_stage_volume(stage_req(&disowned.volume_id, &staging))
        .await;
    must_fail("NodeStage of a disowned LV", r, Code::NotFound);
    // Cleanup: the disowned LV is the operator's to remove.
    run_cmd("lvm", &["lvremove", "-qq", "-y", &lv_of(&disowned)]);
    d.delete(&renamed.volume_id).await;
    f.wait_for_wipes().await;
}
