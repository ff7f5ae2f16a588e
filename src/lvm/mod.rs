//! The one module that runs the `lvm` binary.
//!
//! Every call goes through [`crate::command::Cmd`] (so `LC_ALL=C`, a timeout and
//! kill-on-drop: a cancelled RPC never leaves an `lvcreate` running) and asks
//! for JSON reports in bytes (`--reportformat json --units b --nosuffix`).
//! Failures are classified from lvm's stderr into [`LvmError`] kinds, which
//! the pool layer wraps (and `service/status.rs` answers NOT_FOUND,
//! RESOURCE_EXHAUSTED, ALREADY_EXISTS for).
//!
//! - `run`: the runner and the classification of lvm's failures;
//! - `report`: lvm's JSON reports parsed, and tag encoding;
//! - `args`: the arguments of lvm's commands (`lvcreate` and thin pools);
//! - `thin`: a thin pool's block maps from its metadata snapshot
//!   (`dmsetup message`, `thin_dump`, `thin_delta`);
//! - here: the async API the pools call (`vg`, `lvs`, `lv`, `extend`,
//!   `remove`, `rename`, `activate`, ...).

use std::future::Future;

mod args;
mod report;
mod run;
mod thin;

// Public for `localvol bench --floor-lvm` (the `cli/` crate), which times
// the bare LVM sequence with the driver's own `lvcreate` builder and runner:
// `lvcreate_args`, `NewLv`, `change` and `LvmError`. The rest is the
// driver's.
pub use args::{lvcreate_args, NewLv};
pub use run::{set_timeout, LvmError, LVM_TIMEOUT_FLOOR, SLOWDOWN as LVM_TIMEOUT_FACTOR};

pub(crate) use args::{thin_pool_args, ThinPoolSize};
pub(crate) use report::{
    decode_tag_value, encode_tag_value, parse_lvs, parse_lvs_and_vg, parse_pvs, parse_vgs, LvInfo,
    PvInfo, VgInfo,
};
#[cfg(test)]
pub(crate) use run::classify;
pub(crate) use run::{active_component, refused_as_held};
pub(crate) use thin::{
    delete_device as delete_thin_device, orphan_device as orphan_thin_device,
    release_metadata_snap, reserve_metadata_snap, BlockRuns, Run,
};

use report::{LV_FIELDS, VG_FIELDS};
use run::{report_args, run};

/// One volume group.
pub(crate) async fn vg(vg: &str) -> Result<VgInfo, LvmError> {
    let mut args = report_args("vgs", VG_FIELDS);
    args.push(vg.to_owned());
    parse_vgs(&run(args).await?)?
        .into_iter()
        .next()
        .ok_or_else(|| LvmError::NotFound(format!("volume group {vg}")))
}

/// Whether a volume group exists (`vgs` of it answers; "not found" is no).
pub(crate) async fn vg_exists(name: &str) -> Result<bool, LvmError> {
    match vg(name).await {
        Ok(_) => Ok(true),
        Err(LvmError::NotFound(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Every physical volume lvm sees on the node, in a VG or not.
pub(crate) async fn pvs() -> Result<Vec<PvInfo>, LvmError> {
    parse_pvs(&run(report_args("pvs", "pv_name,vg_name")).await?)
}

/// Creates volume group `vg` on blank `devices` (lvm makes them PVs).
/// Never `--yes`: should a signature have appeared on one since the caller
/// probed it, lvm's question goes unanswered and it refuses instead of
/// wiping it.
pub(crate) async fn vgcreate(vg: &str, devices: &[std::path::PathBuf]) -> Result<(), LvmError> {
    let mut a = vec!["vgcreate".to_owned(), vg.to_owned()];
    a.extend(devices.iter().map(|d| d.to_string_lossy().into_owned()));
    change(a).await
}

/// Adds blank `devices` to volume group `vg` (as [`vgcreate`]: no `--yes`).
pub(crate) async fn vgextend(vg: &str, devices: &[std::path::PathBuf]) -> Result<(), LvmError> {
    let mut a = vec!["vgextend".to_owned(), vg.to_owned()];
    a.extend(devices.iter().map(|d| d.to_string_lossy().into_owned()));
    change(a).await
}

tokio::task_local! {
    /// The `lvs` answers of one [`one_lvs_per_vg`] scope, by VG.
    static VG_READS: std::cell::RefCell<std::collections::HashMap<String, Vec<LvInfo>>>;
}

/// Runs `f` with [`lvs_once`] answering each VG from one `lvs`: pools that
/// share a VG (a thick and a thin pool on one disk) list it once per
/// ListVolumes. Only for reads that change nothing between them.
pub(crate) async fn one_lvs_per_vg<F: Future>(f: F) -> F::Output {
    VG_READS
        .scope(std::cell::RefCell::new(Default::default()), f)
        .await
}

/// [`lvs`], answered from the enclosing [`one_lvs_per_vg`] scope when the
/// VG was read there already.
pub(crate) async fn lvs_once(vg: &str) -> Result<Vec<LvInfo>, LvmError> {
    if let Ok(Some(all)) = VG_READS.try_with(|m| m.borrow().get(vg).cloned()) {
        return Ok(all);
    }
    let all = lvs(vg).await?;
    let _ = VG_READS.try_with(|m| m.borrow_mut().insert(vg.to_owned(), all.clone()));
    Ok(all)
}

/// All logical volumes of a volume group.
pub(crate) async fn lvs(vg: &str) -> Result<Vec<LvInfo>, LvmError> {
    let mut args = report_args("lvs", LV_FIELDS);
    args.push(vg.to_owned());
    parse_lvs(&run(args).await?)
}

/// All logical volumes of a volume group and, in the same run, the group
/// itself (`lvs` reports VG fields on each row; a VG without LVs has no row,
/// and then `vgs` answers: a second run).
pub(crate) async fn lvs_and_vg(vg: &str) -> Result<(Vec<LvInfo>, VgInfo), LvmError> {
    let fields = format!("{LV_FIELDS},{}", VG_FIELDS.trim_start_matches("vg_name,"));
    let mut args = report_args("lvs", &fields);
    args.push(vg.to_owned());
    match parse_lvs_and_vg(&run(args).await?)? {
        (lvs, Some(info)) => Ok((lvs, info)),
        (lvs, None) => Ok((lvs, self::vg(vg).await?)),
    }
}

/// One logical volume, or None when it does not exist.
pub(crate) async fn lv(vg: &str, name: &str) -> Result<Option<LvInfo>, LvmError> {
    let mut args = report_args("lvs", LV_FIELDS);
    args.push(format!("{vg}/{name}"));
    match run(args).await {
        Ok(out) => Ok(parse_lvs(&out)?.into_iter().next()),
        Err(LvmError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Runs an lvm command that changes something (`lvcreate`, `lvextend`, ...).
pub async fn change(args: Vec<String>) -> Result<(), LvmError> {
    run(args).await.map(|_| ())
}

/// Grows `VG/LV` to `size` bytes.
pub(crate) async fn extend(lv_path: &str, size: u64) -> Result<(), LvmError> {
    change(vec![
        "lvextend".into(),
        "--size".into(),
        format!("{size}b"),
        lv_path.into(),
    ])
    .await
}

/// Removes `VG/LV`; one that is already gone is fine (idempotent deletes).
pub(crate) async fn remove(lv_path: &str) -> Result<(), LvmError> {
    match change(vec!["lvremove".into(), "--yes".into(), lv_path.into()]).await {
        Ok(()) | Err(LvmError::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes `lv_path` only if lvm's own selection `select` (`lvmreport(7)`)
/// matches it when the command runs, so a check and the removal are one run
/// and nothing can change between them. `Ok(true)`: removed; `Ok(false)`:
/// not removed (missing, or not selected; lvm's message is not what it
/// always was, which is also `false`): the caller looks and decides.
pub(crate) async fn remove_selected(lv_path: &str, select: &str) -> Result<bool, LvmError> {
    let args = ["lvremove", "--yes", "--select", select, lv_path];
    match run(args.iter().map(|s| s.to_string()).collect()).await {
        Ok(out) => Ok(out.contains("successfully removed")),
        Err(LvmError::NotFound(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Adds `tag` to `lv_path` only if lvm's own selection `select` matches it
/// when the command runs (like [`remove_selected`]: the check and the change
/// are one run). `Ok(true)`: tagged (also when it carried the tag already);
/// `Ok(false)`: missing or not selected: the caller looks and decides.
pub(crate) async fn add_tag_selected(
    lv_path: &str,
    select: &str,
    tag: &str,
) -> Result<bool, LvmError> {
    let args = [
        "lvchange", "--yes", "--select", select, "--addtag", tag, lv_path,
    ];
    match run(args.iter().map(|s| s.to_string()).collect()).await {
        Ok(out) => Ok(out.contains(&format!("Logical volume {lv_path} changed"))),
        Err(LvmError::NotFound(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Renames `VG/from` to `VG/to`: one metadata commit, so an LV is found
/// under exactly one of the two names whenever a crash comes.
pub(crate) async fn rename(vg: &str, from: &str, to: &str) -> Result<(), LvmError> {
    change(vec![
        "lvrename".into(),
        "--yes".into(),
        vg.to_owned(),
        from.to_owned(),
        to.to_owned(),
    ])
    .await
}

/// Turns the copy-on-write snapshot `VG/LV` into a plain LV holding its
/// exception store (`lvconvert --splitsnapshot`), so its blocks can be
/// zeroed through its own device before they return to the VG.
pub(crate) async fn split_snapshot(lv_path: &str) -> Result<(), LvmError> {
    change(vec![
        "lvconvert".into(),
        "--yes".into(),
        "--splitsnapshot".into(),
        lv_path.to_owned(),
    ])
    .await
}

/// Activates `VG/LV`, also when it carries the activation-skip flag (thin
/// snapshots do by default): whoever asks needs its device node.
pub(crate) async fn activate(lv_path: &str) -> Result<(), LvmError> {
    change(vec![
        "lvchange".into(),
        "--activate".into(),
        "y".into(),
        "--ignoreactivationskip".into(),
        lv_path.to_owned(),
    ])
    .await
}

/// Makes the `/dev` nodes of `VG/LV` that are missing (`vgmknodes`): an
/// lvm killed between resuming a device and making its nodes, on a node
/// without udev, leaves the LV active with neither `/dev/VG/LV` nor
/// `/dev/mapper/VG-LV`, and activating it again does not make them.
pub(crate) async fn make_nodes(lv_path: &str) -> Result<(), LvmError> {
    change(vec!["vgmknodes".into(), lv_path.to_owned()]).await
}

/// Reloads the device of the active `VG/LV` from the VG's metadata
/// (`lvchange --refresh`): it also gives the device the LV's name, when an
/// lvrename killed mid-run left the old one, and makes its nodes.
pub(crate) async fn refresh(lv_path: &str) -> Result<(), LvmError> {
    change(vec![
        "lvchange".into(),
        "--refresh".into(),
        lv_path.to_owned(),
    ])
    .await
}

/// Deactivates `VG/LV` (one not active is fine).
pub(crate) async fn deactivate(lv_path: &str) -> Result<(), LvmError> {
    change(vec![
        "lvchange".into(),
        "--activate".into(),
        "n".into(),
        lv_path.to_owned(),
    ])
    .await
}

/// Replaces tags of `VG/LV` in one run: removes `old`, adds `new`.
pub(crate) async fn replace_tags(
    lv_path: &str,
    old: &[String],
    new: Option<String>,
) -> Result<(), LvmError> {
    let mut args = vec!["lvchange".to_owned()];
    for t in old {
        args.extend(["--deltag".to_owned(), t.clone()]);
    }
    if let Some(t) = new {
        args.extend(["--addtag".to_owned(), t]);
    }
    args.push(lv_path.to_owned());
    change(args).await
}

/// Removes a tag from `VG/LV`.
pub(crate) async fn delete_tag(lv_path: &str, tag: &str) -> Result<(), LvmError> {
    change(vec![
        "lvchange".into(),
        "--deltag".into(),
        tag.to_owned(),
        lv_path.to_owned(),
    ])
    .await
}
