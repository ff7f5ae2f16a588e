//! The argument vectors of lvm's commands: the one `lvcreate` builder
//! ([`lvcreate_args`], for the pools' volumes, restores, clones and
//! snapshots, and the benchmark's bare floor), thin pools from raw disks
//! ([`thin_pool_args`]), and the settings every command gets
//! ([`command_args`]).

/// Settings every lvm command of the driver gets on its command line
/// (`--config`, which takes precedence over lvm.conf). `monitoring = 0`:
/// activating or creating an LV must not start a `dmeventd` inside the
/// driver's container (it would die with the container, or fight the host's
/// over its FIFOs in the shared `/run`); the host's own lvm monitors what
/// it activates. The image cannot carry this in an lvm.conf of its own: the
/// container sees the host's `/etc/lvm`.
pub const LVM_CONFIG: &str = "activation { monitoring = 0 }";

/// The arguments of `lvm`: the subcommand first, then [`LVM_CONFIG`], then
/// the command's own arguments.
pub fn command_args(args: Vec<String>) -> Vec<String> {
    let mut it = args.into_iter();
    let mut out: Vec<String> = it.next().into_iter().collect();
    out.extend(["--config".to_owned(), LVM_CONFIG.to_owned()]);
    out.extend(it);
    out
}

/// How big a new thin pool is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThinPoolSize {
    /// This percentage of the VG (`--extents N%VG`).
    PercentOfVg(u8),
    Bytes(u64),
}

/// `lvcreate` arguments of a thin pool that zeroes the blocks it provisions
/// (`--zero y`, which the pools' health check requires).
pub fn thin_pool_args(vg: &str, name: &str, size: ThinPoolSize) -> Vec<String> {
    let mut a: Vec<String> = ["lvcreate", "--yes", "--type", "thin-pool", "--zero", "y"]
        .map(String::from)
        .to_vec();
    match size {
        ThinPoolSize::PercentOfVg(p) => a.extend(["--extents".into(), format!("{p}%VG")]),
        ThinPoolSize::Bytes(b) => a.extend(["--size".into(), format!("{b}b")]),
    }
    a.extend(["--name".into(), name.into(), vg.into()]);
    a
}

/// What a new LV is, for [`lvcreate_args`].
#[derive(Clone, Copy, Debug)]
pub enum NewLv<'a> {
    /// A thin LV of `size` bytes in the thin pool `pool` of the VG.
    Thin { pool: &'a str, size: u64 },
    /// A thick LV of `size` bytes whose old signatures are wiped and whose
    /// start is zeroed (a deleted volume's filesystem must never show
    /// through), with the pool's extra `lvcreate` options (e.g. raid1).
    Thick { size: u64, options: &'a [String] },
    /// A thin snapshot of `origin` (an LV name in the VG) that is a volume:
    /// activated like any volume.
    ThinVolumeOf { origin: &'a str },
    /// A snapshot of `origin`: copy-on-write with room for `cow_size` bytes
    /// of changes (thick), or thin (None; its activation is skipped, as
    /// lvm does by default).
    Snapshot {
        origin: &'a str,
        cow_size: Option<u64>,
    },
}

/// The one place `lvcreate` arguments are built (for [`change`]): the
/// driver's volumes, restores, clones and snapshots, and the benchmark's
/// bare floor. `tags` are added with `--addtag`.
pub fn lvcreate_args(vg: &str, name: &str, tags: &[String], what: NewLv) -> Vec<String> {
    let mut a: Vec<String> = vec!["lvcreate".into(), "--yes".into()];
    if !matches!(what, NewLv::Snapshot { .. }) {
        a.extend(["--activate".into(), "y".into()]);
    }
    a.extend(["--name".into(), name.into()]);
    for t in tags {
        a.extend(["--addtag".into(), t.clone()]);
    }
    match what {
        NewLv::Thin { pool, size } => a.extend([
            "--virtualsize".into(),
            format!("{size}b"),
            "--thin".into(),
            format!("{vg}/{pool}"),
        ]),
        NewLv::Thick { size, options } => {
            a.extend(["--wipesignatures", "y", "--zero", "y"].map(String::from));
            a.extend(["--size".into(), format!("{size}b")]);
            a.extend(options.iter().cloned());
            a.push(vg.into());
        }
        NewLv::ThinVolumeOf { origin } => {
            a.extend(["--snapshot", "--setactivationskip", "n"].map(String::from));
            a.push(format!("{vg}/{origin}"));
        }
        NewLv::Snapshot { origin, cow_size } => {
            a.push("--snapshot".into());
            if let Some(cow) = cow_size {
                a.extend(["--size".into(), format!("{cow}b")]);
            }
            a.push(format!("{vg}/{origin}"));
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lvm::report::VG_FIELDS;
    use crate::lvm::run::report_args;

    #[test]
    fn every_lvm_command_turns_dmeventd_monitoring_off() {
        let create = lvcreate_args(
            "vg",
            "lv-a",
            &[],
            NewLv::Thin {
                pool: "tp",
                size: 1 << 20,
            },
        );
        for args in [
            create,
            report_args("vgs", VG_FIELDS),
            vec![
                "lvchange".into(),
                "--activate".into(),
                "y".into(),
                "vg/lv".into(),
            ],
        ] {
            let sub = args[0].clone();
            let full = command_args(args.clone());
            assert_eq!(full[0], sub, "{full:?}");
            assert_eq!(
                full[1..3],
                ["--config", "activation { monitoring = 0 }"],
                "{full:?}"
            );
            assert_eq!(full[3..], args[1..], "{full:?}");
        }
    }

    #[test]
    fn lvcreate_args_for_snapshots_and_restores() {
        let tags = ["localvol".to_owned()];
        let cow = lvcreate_args(
            "vg",
            "sn-a",
            &tags,
            NewLv::Snapshot {
                origin: "lv-a",
                cow_size: Some(4096),
            },
        );
        assert_eq!(
            cow,
            [
                "lvcreate",
                "--yes",
                "--name",
                "sn-a",
                "--addtag",
                "localvol",
                "--snapshot",
                "--size",
                "4096b",
                "vg/lv-a"
            ]
        );
        let thin = lvcreate_args(
            "vg",
            "sn-a",
            &[],
            NewLv::Snapshot {
                origin: "lv-a",
                cow_size: None,
            },
        );
        assert_eq!(
            thin,
            [
                "lvcreate",
                "--yes",
                "--name",
                "sn-a",
                "--snapshot",
                "vg/lv-a"
            ]
        );
        let restore = lvcreate_args("vg", "lv-b", &[], NewLv::ThinVolumeOf { origin: "sn-a" });
        assert_eq!(
            restore,
            [
                "lvcreate",
                "--yes",
                "--activate",
                "y",
                "--name",
                "lv-b",
                "--snapshot",
                "--setactivationskip",
                "n",
                "vg/sn-a"
            ]
        );
    }

    #[test]
    fn thin_pool_args_zero_new_blocks() {
        assert_eq!(
            thin_pool_args("fast", "tp", ThinPoolSize::PercentOfVg(90)),
            [
                "lvcreate",
                "--yes",
                "--type",
                "thin-pool",
                "--zero",
                "y",
                "--extents",
                "90%VG",
                "--name",
                "tp",
                "fast"
            ]
        );
        assert_eq!(
            thin_pool_args("v", "t", ThinPoolSize::Bytes(1 << 30))[6..8],
            ["--size", "1073741824b"]
        );
    }
}
