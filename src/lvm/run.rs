//! Running `lvm` and reading its failures: every run goes through [`run`]
//! (so through [`crate::command::Cmd`]: `LC_ALL=C`, a timeout, kill-on-drop),
//! is counted for /metrics ([`crate::runs`]), and a failure is sorted into
//! an [`LvmError`] kind by what lvm's stderr says.

use std::time::Duration;

use super::args::command_args;
use crate::command::{Cmd, CommandError};

/// Limit for one lvm call. Metadata operations take well under a second; the
/// limit only catches a hung device.
const LVM_TIMEOUT: Duration = Duration::from_secs(60);

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
    crate::runs::count_lvm_run(counted_as(args.first().map_or("", String::as_str)));
    Cmd::new("lvm")
        .args(command_args(args))
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .timeout(LVM_TIMEOUT)
        .run()
        .await
        .map(|o| o.stdout)
        .map_err(classify)
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

#[cfg(test)]
mod tests {
    use super::*;

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

    fn failed(stderr: &str) -> CommandError {
        CommandError::Failed {
            program: "lvm".into(),
            code: Some(5),
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }

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
