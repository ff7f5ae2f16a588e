//! `localvol bench --floor-lvm VG[/THINPOOL]`: the bare LVM sequence a driver
//! serving device volumes cannot beat, timed under the CSI step names.
//!
//! One lifecycle, per step:
//!
//! | step | work |
//! |---|---|
//! | Create | `lvcreate` (thick: `--size`, wiping signatures and zeroing the start as the driver does; thin: `--virtualsize` in the thin pool) |
//! | Stage | `mkfs` with the driver's options ([`localvol::blockdev::mkfs_command`]), mount the LV on the staging dir |
//! | Publish | `mkdir` the target, bind the staging dir onto it |
//! | Unpublish | `umount` the target, `rmdir` it |
//! | Unstage | `umount` the staging dir |
//! | Delete | `lvremove --yes` |
//!
//! The staging dir is made before Stage and removed after Unstage outside the
//! step timings, as the CSI mode does (kubelet's work there). No probing, no
//! `lvs`, no tags: only what any driver has to do. LVs are named
//! `<prefix>-<run id>-<index>`; a failed lifecycle undoes its own steps and
//! removes only the LV it created (one whose lvcreate failed is removed only
//! when lvm did not say the name was taken).

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use sys_mount::MountFlags;

use super::{
    first_error, rmdir, run_workers, BenchArgs, Report, RunDir, Samples, CREATE, DELETE, PUBLISH,
    STAGE, UNPUBLISH, UNSTAGE,
};
use localvol::blockdev::{self, FsType};
use localvol::lvm::{self, LvmError, NewLv};

/// Step names of an LVM floor lifecycle, matching the CSI steps one to one.
pub const LVM_FLOOR_STEPS: [&str; 6] = [
    "Create(lvcreate)",
    "Stage(mkfs+mount)",
    "Publish(mkdir+bind)",
    "Unpublish(umount+rmdir)",
    "Unstage(umount)",
    "Delete(lvremove)",
];

/// `--floor-lvm VG[/THINPOOL]`: where the floor's LVs are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FloorLvm {
    pub vg: String,
    pub thin_pool: Option<String>,
}

impl FromStr for FloorLvm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (vg, thin) = match s.split_once('/') {
            Some((vg, tp)) => (vg, Some(tp)),
            None => (s, None),
        };
        check_lvm_name("volume group", vg)?;
        if let Some(tp) = thin {
            check_lvm_name("thin pool", tp)?;
        }
        Ok(FloorLvm {
            vg: vg.to_owned(),
            thin_pool: thin.map(str::to_owned),
        })
    }
}

impl std::fmt::Display for FloorLvm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.thin_pool {
            Some(tp) => write!(f, "{}/{tp}", self.vg),
            None => f.write_str(&self.vg),
        }
    }
}

/// A VG, LV or name part lvm accepts ([`localvol::config::is_lvm_name`]).
pub fn check_lvm_name(what: &str, s: &str) -> Result<(), String> {
    if localvol::config::is_lvm_name(s) {
        Ok(())
    } else {
        Err(format!(
            "{what} {s:?} is not an LVM name (A-Z a-z 0-9 + _ . -, not starting with -)"
        ))
    }
}

/// The LV of lifecycle `i`: `<prefix>-<run id>-<i>`, unique to this run.
pub fn lv_name(prefix: &str, run_id: &str, i: usize) -> String {
    format!("{prefix}-{run_id}-{i}")
}

/// What the report says about an LVM floor run.
#[derive(Clone, Debug, PartialEq)]
pub struct LvmFloorInfo {
    pub target: FloorLvm,
    pub fs: FsType,
    pub size: u64,
}

impl LvmFloorInfo {
    pub fn json(&self) -> Value {
        json!({
            "volume_group": self.target.vg,
            "thin_pool": self.target.thin_pool,
            "fs_type": self.fs.as_str(),
            "size_bytes": self.size,
        })
    }
}

/// The floor's filesystem: `--fs-type`, ext4 when empty.
pub fn floor_fs(fs_type: &str) -> Result<FsType, String> {
    match fs_type {
        "" => Ok(FsType::Ext4),
        t => FsType::parse(t).map_err(|e| e.to_string()),
    }
}

/// The `lvcreate` arguments (after `lvm`) of one floor LV: the driver's
/// (`localvol::lvm::lvcreate_args`, the one builder) without its tags or
/// lvcreate options.
pub fn lvcreate_args(target: &FloorLvm, name: &str, size: u64) -> Vec<String> {
    let what = match &target.thin_pool {
        Some(pool) => NewLv::Thin { pool, size },
        None => NewLv::Thick { size, options: &[] },
    };
    localvol::lvm::lvcreate_args(&target.vg, name, &[], what)
}

struct Ctx {
    info: LvmFloorInfo,
    prefix: String,
    run_id: String,
}

impl Ctx {
    fn lv(&self, i: usize) -> String {
        lv_name(&self.prefix, &self.run_id, i)
    }
}

/// Runs the LVM floor: `--concurrency` workers, `--volumes` lifecycles.
pub async fn run(
    args: &BenchArgs,
    target: &FloorLvm,
    dirs: &RunDir,
    run_id: &str,
    abort: Arc<AtomicBool>,
) -> Result<Report, String> {
    check_lvm_name("--name-prefix", &args.name_prefix)?;
    let size = u64::try_from(args.size).map_err(|_| "--size must be positive".to_owned())?;
    let ctx = Arc::new(Ctx {
        info: LvmFloorInfo {
            target: target.clone(),
            fs: floor_fs(&args.fs_type)?,
            size,
        },
        prefix: args.name_prefix.clone(),
        run_id: run_id.to_owned(),
    });
    let n = usize::try_from(args.volumes).map_err(|e| e.to_string())?;
    let (staging, targets) = (dirs.staging.clone(), dirs.targets.clone());
    let c = ctx.clone();
    let (samples, errors, wall) = run_workers(args.concurrency, n, abort, move |i, mut samples| {
        let ctx = c.clone();
        let paths = Paths {
            dev: PathBuf::from(format!("/dev/{}/{}", ctx.info.target.vg, ctx.lv(i))),
            staging: staging.join(i.to_string()),
            target: targets.join(i.to_string()),
        };
        async move {
            let res = lifecycle(&ctx, i, &paths, &mut samples).await;
            let res = res.map_err(|e| format!("lifecycle {i} ({}): {e}", ctx.lv(i)));
            (samples, res)
        }
    })
    .await;
    if let Some(e) = first_error(&errors) {
        return Err(e);
    }
    let mut report = Report::new("floor-lvm", &LVM_FLOOR_STEPS, &samples, wall)
        .ok_or_else(|| "no lifecycle completed".to_owned())?;
    report.volumes = args.volumes;
    report.concurrency = args.concurrency;
    report.lvm = Some(ctx.info.clone());
    Ok(report)
}

struct Paths {
    dev: PathBuf,
    staging: PathBuf,
    target: PathBuf,
}

/// What a lifecycle has made so far, for cleanup.
#[derive(Default)]
struct Progress {
    lv: bool,
    staging_dir: bool,
    staged: bool,
    target_dir: bool,
    published: bool,
}

async fn lifecycle(ctx: &Ctx, i: usize, p: &Paths, samples: &mut Samples) -> Result<(), String> {
    let mut done = Progress::default();
    let res = steps(ctx, i, p, samples, &mut done).await;
    if res.is_err() {
        cleanup(ctx, i, p, &done).await;
    }
    res
}

/// A blocking syscall step off the executor.
async fn sys<F>(f: F) -> Result<(), String>
where
    F: FnOnce() -> Result<(), localvol::error::IoError> + Send + 'static,
{
    localvol::error::blocking(f)
        .await
        .map_err(|e| e.to_string())
}

fn timed(samples: &mut Samples, step: usize, start: Instant) {
    samples.steps[step].push(start.elapsed());
}

/// The floor lifecycle's steps in order, timing each under its CSI step name
/// and recording in `done` what there is to undo if a later step fails.
async fn steps(
    ctx: &Ctx,
    i: usize,
    p: &Paths,
    samples: &mut Samples,
    done: &mut Progress,
) -> Result<(), String> {
    let info = &ctx.info;
    let lv = ctx.lv(i);
    let lifecycle = Instant::now();

    let start = Instant::now();
    let created = lvm::change(lvcreate_args(&info.target, &lv, info.size)).await;
    // A failed lvcreate may still have made the LV (killed after it wrote the
    // metadata); it is ours unless lvm said the name was taken.
    done.lv = !matches!(created, Err(LvmError::AlreadyExists(_)));
    created.map_err(|e| format!("lvcreate: {e}"))?;
    timed(samples, CREATE, start);

    std::fs::create_dir(&p.staging).map_err(|e| format!("creating {:?}: {e}", p.staging))?;
    done.staging_dir = true;

    let start = Instant::now();
    stage(p, info.fs, done).await?;
    timed(samples, STAGE, start);

    let start = Instant::now();
    publish(p, done).await?;
    timed(samples, PUBLISH, start);

    let start = Instant::now();
    unpublish(p, done).await?;
    timed(samples, UNPUBLISH, start);

    let start = Instant::now();
    let staging = p.staging.clone();
    sys(move || localvol::mount::unmount(&staging)).await?;
    done.staged = false;
    timed(samples, UNSTAGE, start);
    rmdir(&p.staging).map_err(|e| format!("removing {:?}: {e}", p.staging))?;
    done.staging_dir = false;

    let start = Instant::now();
    lvm::change(lvremove_args(&info.target.vg, &lv))
        .await
        .map_err(|e| format!("lvremove: {e}"))?;
    done.lv = false;
    timed(samples, DELETE, start);

    samples.lifecycles.push(lifecycle.elapsed());
    Ok(())
}

/// The Stage step's work: mkfs on the LV, then mount it on the staging dir.
async fn stage(p: &Paths, fs: FsType, done: &mut Progress) -> Result<(), String> {
    blockdev::mkfs_command(&p.dev, fs, &Default::default())
        .await
        .map_err(|e| e.to_string())?
        .run()
        .await
        .map_err(|e| e.to_string())?;
    let (dev, staging) = (p.dev.clone(), p.staging.clone());
    sys(move || {
        localvol::mount::mount_device(
            &dev,
            &staging,
            fs.as_str(),
            MountFlags::empty(),
            fs.default_mount_data(),
        )
    })
    .await?;
    done.staged = true;
    Ok(())
}

/// The Publish step's work: mkdir the target, bind the staging dir onto it.
async fn publish(p: &Paths, done: &mut Progress) -> Result<(), String> {
    let target = p.target.clone();
    sys(move || {
        std::fs::create_dir(&target)
            .map_err(|e| localvol::error::IoError::new(format!("mkdir {target:?}"), e))
    })
    .await?;
    done.target_dir = true;
    let (staging, target) = (p.staging.clone(), p.target.clone());
    sys(move || localvol::mount::bind(&staging, &target, MountFlags::empty())).await?;
    done.published = true;
    Ok(())
}

/// The Unpublish step's work: unmount the target, rmdir it.
async fn unpublish(p: &Paths, done: &mut Progress) -> Result<(), String> {
    let target = p.target.clone();
    sys(move || localvol::mount::unmount(&target)).await?;
    done.published = false;
    let target = p.target.clone();
    sys(move || {
        std::fs::remove_dir(&target)
            .map_err(|e| localvol::error::IoError::new(format!("rmdir {target:?}"), e))
    })
    .await?;
    done.target_dir = false;
    Ok(())
}

fn lvremove_args(vg: &str, lv: &str) -> Vec<String> {
    vec!["lvremove".into(), "--yes".into(), format!("{vg}/{lv}")]
}

/// Best-effort undo of a failed lifecycle, innermost first; problems are
/// printed. Only this lifecycle's own LV is ever removed.
async fn cleanup(ctx: &Ctx, i: usize, p: &Paths, done: &Progress) {
    let lv = ctx.lv(i);
    let warn = |what: &str, e: String| eprintln!("localvol bench: cleanup of {lv}: {what}: {e}");
    if done.published {
        let t = p.target.clone();
        if let Err(e) = sys(move || localvol::mount::unmount(&t)).await {
            warn("unmounting the target", e);
        }
    }
    if done.target_dir {
        if let Err(e) = rmdir(&p.target) {
            warn("removing the target", e.to_string());
        }
    }
    if done.staged {
        let s = p.staging.clone();
        if let Err(e) = sys(move || localvol::mount::unmount(&s)).await {
            warn("unmounting the staging dir", e);
        }
    }
    if done.staging_dir {
        if let Err(e) = rmdir(&p.staging) {
            warn("removing the staging dir", e.to_string());
        }
    }
    if done.lv {
        match lvm::change(lvremove_args(&ctx.info.target.vg, &lv)).await {
            Ok(()) | Err(LvmError::NotFound(_)) => {}
            Err(e) => warn("lvremove", e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn floor_lvm_flag() {
        assert_eq!(
            "vg0".parse::<FloorLvm>(),
            Ok(FloorLvm {
                vg: "vg0".into(),
                thin_pool: None
            })
        );
        let t: FloorLvm = "vg0/tp".parse().unwrap();
        assert_eq!(t.thin_pool.as_deref(), Some("tp"));
        assert_eq!(t.to_string(), "vg0/tp");
        for bad in [
            "", "/tp", "vg/", "-vg", "vg/-tp", "vg/a/b", "v g", "..", "vg/tp;rm",
        ] {
            assert!(bad.parse::<FloorLvm>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn command_line() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
                .map(|c| c.bench)
        };
        let a = parse(&[
            "--floor-lvm",
            "vg0/tp",
            "--fs-type",
            "xfs",
            "--size",
            "320Mi",
        ])
        .unwrap();
        assert_eq!(a.floor_lvm, Some("vg0/tp".parse().unwrap()));
        assert_eq!((a.fs_type.as_str(), a.size), ("xfs", 320 << 20));
        assert!(!a.floor);
        for bad in [
            &["--floor-lvm", "vg0", "--floor"][..],
            &["--floor-lvm", "vg0", "--server-pid", "1"],
            &["--floor-lvm", "vg0", "--param", "a=b"],
            &["--floor-lvm", "vg 0"],
            &["--floor-lvm=-vg"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lv_names_are_per_run_and_index() {
        assert_eq!(lv_name("bench", "1a2b", 7), "bench-1a2b-7");
        assert_ne!(lv_name("bench", "1a2b", 7), lv_name("bench", "1a2c", 7));
        assert!(check_lvm_name("prefix", "bench").is_ok());
        assert!(check_lvm_name("prefix", "-x").is_err());
        assert!(check_lvm_name("prefix", "a/b").is_err());
    }

    #[test]
    fn lvcreate_args_thick_and_thin() {
        let thick: FloorLvm = "vg".parse().unwrap();
        assert_eq!(
            lvcreate_args(&thick, "lv", 1 << 20).join(" "),
            "lvcreate --yes --activate y --name lv --wipesignatures y --zero y --size 1048576b vg"
        );
        let thin: FloorLvm = "vg/tp".parse().unwrap();
        assert_eq!(
            lvcreate_args(&thin, "lv", 1 << 20).join(" "),
            "lvcreate --yes --activate y --name lv --virtualsize 1048576b --thin vg/tp"
        );
        assert_eq!(lvremove_args("vg", "lv"), ["lvremove", "--yes", "vg/lv"]);
    }

    #[test]
    fn fs_type_defaults_to_ext4() {
        assert_eq!(floor_fs(""), Ok(FsType::Ext4));
        assert_eq!(floor_fs("xfs"), Ok(FsType::Xfs));
        assert!(floor_fs("btrfs").is_err());
    }

    #[test]
    fn report_shape_matches_the_csi_rows() {
        let mut samples = Samples::default();
        for step in samples.steps.iter_mut() {
            step.push(Duration::from_millis(2));
        }
        samples.lifecycles.push(Duration::from_millis(12));
        let mut r = Report::new(
            "floor-lvm",
            &LVM_FLOOR_STEPS,
            &samples,
            Duration::from_secs(1),
        )
        .unwrap();
        r.lvm = Some(LvmFloorInfo {
            target: "vg/tp".parse().unwrap(),
            fs: FsType::Xfs,
            size: 64 << 20,
        });
        let j = r.to_json();
        assert_eq!(j["mode"], json!("floor-lvm"));
        assert_eq!(j["rpc"].as_object().unwrap().len(), 6);
        assert_eq!(j["rpc"]["Stage(mkfs+mount)"]["count"], json!(1));
        assert_eq!(j["lvm"]["thin_pool"], json!("tp"));
        assert_eq!(j["lvm"]["fs_type"], json!("xfs"));
        assert_eq!(j["endpoint"], Value::Null);
        let h = r.to_human();
        assert!(h.contains("vg/tp") && h.contains("Delete(lvremove)"), "{h}");
        // Each floor step starts with the CSI step's short name.
        for (floor, rpc) in LVM_FLOOR_STEPS.iter().zip(crate::bench::RPC_STEPS) {
            let short = floor.split('(').next().unwrap();
            assert!(rpc.contains(short), "{floor} vs {rpc}");
        }
    }
}
