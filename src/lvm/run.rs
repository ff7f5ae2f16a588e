//! Running `lvm` and reading its failures: every run goes through [`run`]
//! (so through [`crate::command::Cmd`]: `LC_ALL=C`, a timeout, kill-on-drop),
//! is counted for /metrics ([`crate::runs`]), and a failure is sorted into
//! an [`LvmError`] kind by what lvm's stderr says.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::args::command_args;
use crate::command::{Cmd, CommandError};

/// The least time one lvm run is given by default (`localvol serve
/// --lvm-timeout`). Metadata operations take well under a second on a quiet
/// node; the limit only catches a hung device.
pub const LVM_TIMEOUT_FLOOR: Duration = Duration::from_secs(60);
/// The floor in force, in ms ([`set_timeout_floor`]).
static FLOOR_MS: AtomicU64 = AtomicU64::new(60_000);
/// The most: past it a run is taken for hung however slow the node is.
const LVM_TIMEOUT_CEILING: Duration = Duration::from_secs(600);
/// A run gets this many times the node's typical run before it is killed,
/// by default (`localvol serve --lvm-timeout-factor`).
pub const SLOWDOWN: u64 = 40;
/// The factor in force ([`set_timeout`]).
static FACTOR: AtomicU64 = AtomicU64::new(SLOWDOWN);
/// A run slower than this is logged.
const SLOW_RUN: Duration = Duration::from_secs(10);

/// The typical lvm run on this node, in ms: a moving average (1/8 weight
/// to each new run) of how long runs took, a killed one counted at its
/// limit. On a loaded node lvm waits for the CPU, the disks and the VG lock
/// held by the runs queued before it; a fixed limit then kills runs that
/// would have finished (and a killed health check used to make a pool
/// unusable), so the limit follows the node.
static TYPICAL_MS: AtomicU64 = AtomicU64::new(0);

/// The time limit for a run when the typical one takes `typical_ms`:
/// `factor` times that, at least `floor`.
fn limit_for(typical_ms: u64, floor: Duration, factor: u64) -> Duration {
    let floor = floor.min(LVM_TIMEOUT_CEILING);
    Duration::from_millis(typical_ms.saturating_mul(factor)).clamp(floor, LVM_TIMEOUT_CEILING)
}

/// Sets the least time an lvm run gets and how many typical runs it gets
/// (`localvol serve --lvm-timeout`, `--lvm-timeout-factor`; the limit is at
/// most the ceiling, 10 minutes).
pub fn set_timeout(floor: Duration, factor: u64) {
    let ms = u64::try_from(floor.as_millis()).unwrap_or(u64::MAX);
    FLOOR_MS.store(ms, Ordering::Relaxed);
    FACTOR.store(factor.max(1), Ordering::Relaxed);
}

/// The typical run after one that took `ms`.
fn next_typical(typical_ms: u64, ms: u64) -> u64 {
    if ms >= typical_ms {
        typical_ms + (ms - typical_ms) / 8
    } else {
        typical_ms - (typical_ms - ms) / 8
    }
}

/// The time limit of the next lvm run on this node.
pub fn current_limit() -> Duration {
    let floor = Duration::from_millis(FLOOR_MS.load(Ordering::Relaxed));
    let factor = FACTOR.load(Ordering::Relaxed);
    limit_for(TYPICAL_MS.load(Ordering::Relaxed), floor, factor)
}

fn record_run(took: Duration) {
    let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
    let _ = TYPICAL_MS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
        Some(next_typical(t, ms))
    });
}

#[derive(Debug, thiserror::Error)]
pub enum LvmError {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("not enough space: {0}")]
    InsufficientSpace(String),
    #[error("already exists: {0}")]
    AlreadyExists(String),
    #[error("unexpected lvm output: {0}")]
    Parse(String),
    #[error(transparent)]
    Command(CommandError),
}

/// Sorts an lvm failure by what its stderr says.
pub fn classify(err: CommandError) -> LvmError {
    let stderr = err.stderr();
    let line = stderr
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("WARNING"))
        .unwrap_or("")
        .to_owned();
    let lower = stderr.to_ascii_lowercase();
    if lower.contains("insufficient free space")
        || lower.contains("insufficient suitable allocatable extents")
        || lower.contains("insufficient free extents")
        || lower.contains("not enough free space")
    {
        LvmError::InsufficientSpace(line)
    } else if lower.contains("already exists") {
        LvmError::AlreadyExists(line)
    } else if lower.contains("not found") || lower.contains("failed to find") {
        LvmError::NotFound(line)
    } else {
        LvmError::Command(err)
    }
}

/// Whether lvm refused to remove an LV because something holds it: mounted
/// or open ("... in use", "Can't remove open logical volume"), or the
/// backing of another dm device such as a dm-crypt mapping ("... is used by
/// another device").
pub fn refused_as_held(e: &LvmError) -> bool {
    let LvmError::Command(c) = e else {
        return false;
    };
    let err = c.stderr();
    ["in use", "used by another device", "open logical volume"]
        .iter()
        .any(|m| err.contains(m))
}

/// An LV named by its VG and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Component {
    pub vg: String,
    pub lv: String,
}

/// The LV whose activation on its own made lvm refuse to activate another:
/// "Activation of logical volume VG/POOL is prohibited while logical volume
/// VG/POOL_tmeta is active." (lvm 2.03: a thin pool's component, active
/// alone, as an lvm killed mid-activation leaves it).
pub fn active_component(e: &LvmError) -> Option<Component> {
    let LvmError::Command(c) = e else {
        return None;
    };
    let stderr = c.stderr();
    let (_, after) = stderr.split_once("is prohibited while logical volume ")?;
    let (path, _) = after.split_once(" is active")?;
    let (vg, lv) = path.split_once('/')?;
    let ok = |s: &str| !s.is_empty() && !s.contains(char::is_whitespace);
    (ok(vg) && ok(lv)).then(|| Component {
        vg: vg.to_owned(),
        lv: lv.to_owned(),
    })
}

/// The subcommands whose runs `/metrics` counts by name; others count as
/// `other`.
const COUNTED: [&str; 9] = [
    "lvs",
    "vgs",
    "lvcreate",
    "lvchange",
    "lvextend",
    "lvremove",
    "lvrename",
    "lvconvert",
    "fullreport",
];

/// `sub` as [`crate::runs`] counts it.
fn counted_as(sub: &str) -> &'static str {
    COUNTED.into_iter().find(|k| *k == sub).unwrap_or("other")
}

pub(super) async fn run(args: Vec<String>) -> Result<String, LvmError> {
    let sub = counted_as(args.first().map_or("", String::as_str));
    crate::runs::count_lvm_run(sub);
    let limit = current_limit();
    let started = Instant::now();
    let res = Cmd::new("lvm")
        .args(command_args(args))
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .timeout(limit)
        .run()
        .await;
    let took = match &res {
        Err(CommandError::Timeout { after, .. }) => *after,
        _ => started.elapsed(),
    };
    record_run(took);
    crate::runs::record_lvm_duration(sub, took);
    if took >= SLOW_RUN {
        tracing::warn!(
            command = sub,
            seconds = took.as_secs_f64(),
            limit_s = limit.as_secs(),
            next_limit_s = current_limit().as_secs(),
            "slow lvm run"
        );
    }
    res.map(|o| o.stdout).map_err(classify)
}

pub(super) fn report_args(cmd: &str, fields: &str) -> Vec<String> {
    [
        cmd,
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        fields,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// An lvm run that failed with exit code 5 and `stderr` (tests).
#[cfg(test)]
pub(crate) fn failed(stderr: &str) -> CommandError {
    CommandError::Failed {
        program: "lvm".into(),
        code: Some(5),
        stdout: String::new(),
        stderr: stderr.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_follows_the_typical_run_within_its_bounds() {
        const F: Duration = LVM_TIMEOUT_FLOOR;
        const X: u64 = SLOWDOWN;
        // A quiet node: well under a second a run, the floor.
        assert_eq!(limit_for(0, F, X), LVM_TIMEOUT_FLOOR);
        assert_eq!(limit_for(300, F, X), LVM_TIMEOUT_FLOOR);
        // 40 times the typical run once that is above the floor.
        assert_eq!(limit_for(5_000, F, X), Duration::from_secs(200));
        assert_eq!(limit_for(u64::MAX, F, X), LVM_TIMEOUT_CEILING);
        // One run killed at the floor on a quiet node: the next runs get
        // minutes, so lvm that got slow (75 s a run) finishes.
        let t = next_typical(300, 60_000);
        assert!(
            limit_for(t, F, X) > Duration::from_secs(75),
            "{:?}",
            limit_for(t, F, X)
        );
        // ... and once lvm is fast again the limit comes back down.
        let mut t = next_typical(t, 75_000);
        assert_eq!(limit_for(t, F, X), LVM_TIMEOUT_CEILING);
        for _ in 0..40 {
            t = next_typical(t, 300);
        }
        assert_eq!(limit_for(t, F, X), LVM_TIMEOUT_FLOOR);
        // An operator's floor counts, up to the ceiling.
        assert_eq!(
            limit_for(300, Duration::from_secs(3), X),
            Duration::from_secs(12)
        );
        assert_eq!(
            limit_for(0, Duration::from_secs(3), X),
            Duration::from_secs(3)
        );
        assert_eq!(
            limit_for(0, Duration::from_secs(3600), X),
            LVM_TIMEOUT_CEILING
        );
        // And an operator's factor.
        assert_eq!(
            limit_for(1_300, Duration::from_secs(2), 4),
            Duration::from_millis(5_200)
        );
    }

    #[test]
    fn runs_count_under_their_subcommand_or_other() {
        assert_eq!(counted_as("lvs"), "lvs");
        assert_eq!(counted_as("lvcreate"), "lvcreate");
        assert_eq!(counted_as("no-such-subcommand"), "other");
        assert_eq!(counted_as(""), "other");
    }

    #[test]
    fn removals_refused_because_the_lv_is_held_are_told_apart() {
        let failed = |stderr: &str| {
            LvmError::Command(CommandError::Failed {
                program: "lvm".into(),
                code: Some(5),
                stdout: String::new(),
                stderr: stderr.into(),
            })
        };
        for held in [
            "  Logical volume vg/lv-1 is used by another device.",
            "  Logical volume vg/lv-1 contains a filesystem in use.",
            "  Can't remove open logical volume \"lv-1\".",
        ] {
            assert!(refused_as_held(&failed(held)), "{held}");
        }
        assert!(!refused_as_held(&failed("  Volume group \"vg\" not found")));
        assert!(!refused_as_held(&LvmError::NotFound("vg/lv-1".into())));
    }

    #[test]
    fn names_the_component_that_blocks_an_activation() {
        // lvm 2.03 (Debian 12) in the VM, after an lvm killed mid-activation.
        let e = LvmError::Command(failed(
            "  Activation of logical volume lvt3991n2/tp is prohibited while logical volume \
             lvt3991n2/tp_tmeta is active.",
        ));
        assert_eq!(
            active_component(&e),
            Some(Component {
                vg: "lvt3991n2".into(),
                lv: "tp_tmeta".into()
            })
        );
        for other in [
            "  Volume group \"vg\" not found",
            "  Activation of logical volume vg/tp is prohibited while logical volume  is active.",
        ] {
            assert_eq!(
                active_component(&LvmError::Command(failed(other))),
                None,
                "{other}"
            );
        }
        assert_eq!(active_component(&LvmError::NotFound("vg/tp".into())), None);
    }

    use super::failed;

    #[test]
    fn classifies_recorded_failures() {
        // Messages recorded from lvm 2.03 on Debian 12.
        let cases = [
            (
                "  Volume group \"fxvg\" has insufficient free space (239 extents): 1280 required.",
                "space",
            ),
            (
                "  Logical Volume \"lv-a\" already exists in volume group \"fxvg\"",
                "exists",
            ),
            (
                "  Failed to find logical volume \"fxvg/nothere\"",
                "missing",
            ),
            (
                "  Volume group \"nosuchvg\" not found\n  Cannot process volume group nosuchvg",
                "missing",
            ),
            (
                "  Can't create thin-pool without using device-mapper kernel driver.",
                "other",
            ),
        ];
        for (stderr, want) in cases {
            let got = match classify(failed(stderr)) {
                LvmError::InsufficientSpace(_) => "space",
                LvmError::AlreadyExists(_) => "exists",
                LvmError::NotFound(_) => "missing",
                _ => "other",
            };
            assert_eq!(got, want, "{stderr}");
        }
        let e = classify(failed(
            "  Volume group \"v\" has insufficient free space (1 extents): 2 required.",
        ));
        assert!(matches!(e, LvmError::InsufficientSpace(_)));
    }
}
