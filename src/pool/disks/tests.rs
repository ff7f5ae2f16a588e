//! The decisions of `disks.rs` from probed facts alone.

use super::*;

fn disk(path: &str, found: Found) -> Disk {
    Disk {
        path: path.into(),
        dev: path.into(),
        found,
    }
}

fn blank(path: &str) -> Disk {
    disk(path, Found::Content(Content::Empty, None))
}

fn fs(t: &str, label: Option<&str>) -> Found {
    Found::Content(Content::Filesystem(t.into()), label.map(str::to_owned))
}

/// The refused device and the message, or a panic naming the plan.
fn refused_lvm(plan: LvmPlan) -> (PathBuf, String) {
    match plan {
        LvmPlan::Refuse(Unusable::DeviceRefused { device, what }) => (device, what),
        other => panic!("expected a refused device, got {other:?}"),
    }
}

#[test]
fn blank_disks_make_a_new_volume_group() {
    let plan = plan_lvm("fast", false, &[blank("/dev/a"), blank("/dev/b")]);
    assert_eq!(
        plan,
        LvmPlan::Create(vec!["/dev/a".into(), "/dev/b".into()])
    );
}

#[test]
fn an_existing_volume_group_with_every_disk_is_adopted_as_is() {
    let disks = [
        disk("/dev/a", Found::PvOf("fast".into())),
        disk("/dev/b", Found::PvOf("fast".into())),
    ];
    assert_eq!(plan_lvm("fast", true, &disks), LvmPlan::Adopt);
    // A VG made by hand on other disks, listed with none: adopted too.
    assert_eq!(plan_lvm("fast", true, &[]), LvmPlan::Adopt);
}

#[test]
fn new_blank_disks_extend_the_volume_group() {
    let disks = [disk("/dev/a", Found::PvOf("fast".into())), blank("/dev/c")];
    assert_eq!(
        plan_lvm("fast", true, &disks),
        LvmPlan::Extend(vec!["/dev/c".into()])
    );
}

#[test]
fn the_same_disk_under_two_names_counts_once() {
    let mut by_id = blank("/dev/disk/by-id/x");
    by_id.dev = "/dev/sdb".into();
    let mut by_path = blank("/dev/disk/by-path/y");
    by_path.dev = "/dev/sdb".into();
    assert_eq!(
        plan_lvm("fast", false, &[by_id, by_path]),
        LvmPlan::Create(vec!["/dev/sdb".into()])
    );
}

#[test]
fn any_disk_with_a_signature_or_in_use_refuses_the_whole_pool() {
    let cases = [
        (
            fs("ext4", Some("data")),
            "holds a ext4 filesystem labelled \"data\"",
        ),
        (
            Found::Content(Content::Other("partition table gpt".into()), None),
            "holds partition table gpt",
        ),
        (Found::Content(Content::Luks, None), "LUKS"),
        (
            Found::PvOf("other".into()),
            "physical volume of another volume group, other",
        ),
        (Found::PvOf(String::new()), "in no volume group"),
        (
            Found::InUse("is mounted at /mnt".into()),
            "is mounted at /mnt",
        ),
        (Found::InUse("is held by dm-3".into()), "is held by dm-3"),
        (Found::NotABlockDevice, "not a block device"),
    ];
    for (found, want) in cases {
        for exists in [false, true] {
            // The bad disk comes after a good one: nothing is created or
            // extended, whatever the order.
            let good = if exists {
                disk("/dev/a", Found::PvOf("fast".into()))
            } else {
                blank("/dev/a")
            };
            let plan = plan_lvm(
                "fast",
                exists,
                &[good, blank("/dev/n"), disk("/dev/bad", found.clone())],
            );
            let (device, what) = refused_lvm(plan);
            assert_eq!(device, PathBuf::from("/dev/bad"));
            assert!(what.contains(want), "{found:?}: {what}");
        }
    }
}

#[test]
fn a_missing_disk_refuses_only_a_volume_group_still_to_be_made() {
    let (device, what) = refused_lvm(plan_lvm(
        "fast",
        false,
        &[blank("/dev/a"), disk("/dev/gone", Found::Missing)],
    ));
    assert_eq!(device, PathBuf::from("/dev/gone"));
    assert!(what.contains("does not exist"));
    let disks = [
        disk("/dev/a", Found::PvOf("fast".into())),
        disk("/dev/gone", Found::Missing),
    ];
    assert_eq!(plan_lvm("fast", true, &disks), LvmPlan::Adopt);
    // A glob that matched nothing and no VG: nothing to make it on.
    match plan_lvm("fast", false, &[]) {
        LvmPlan::Refuse(Unusable::DisksFailed(m)) => assert!(m.contains("no listed device"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn refusal_messages_name_the_device_and_what_is_on_it() {
    let why = refused_lvm(plan_lvm(
        "fast",
        false,
        &[disk("/dev/disk/by-id/nvme-x", fs("xfs", None))],
    ));
    let msg = Unusable::DeviceRefused {
        device: why.0,
        what: why.1,
    }
    .to_string();
    assert!(msg.contains("/dev/disk/by-id/nvme-x"), "{msg}");
    assert!(msg.contains("holds a xfs filesystem"), "{msg}");
    assert!(msg.contains("not started"), "{msg}");
}

fn dir_disk(found: Found, mounted_at_path: bool, path_entries: usize) -> DirDisk {
    DirDisk {
        disk: disk("/dev/d", found),
        mounted_at_path,
        path_entries,
    }
}

#[test]
fn dir_pools_format_only_blank_disks_and_mount_only_their_own_xfs() {
    let ours = || fs("xfs", Some(POOL_FS_LABEL));
    assert_eq!(
        plan_dir(&dir_disk(Found::Content(Content::Empty, None), false, 0)),
        DirPlan::FormatAndMount
    );
    assert_eq!(plan_dir(&dir_disk(ours(), false, 0)), DirPlan::Mount);
    assert_eq!(plan_dir(&dir_disk(ours(), true, 0)), DirPlan::Ready);
    for (found, at_path, want) in [
        (fs("xfs", None), false, "holds a xfs filesystem"),
        (fs("xfs", Some("backup")), false, "labelled \"backup\""),
        (fs("ext4", Some(POOL_FS_LABEL)), false, "ext4"),
        (
            fs("ext4", None),
            true,
            "is mounted at the pool's path but holds a ext4",
        ),
        (Found::InUse("is mounted at /srv".into()), false, "/srv"),
        (Found::PvOf("vg0".into()), false, "physical volume"),
        (Found::Missing, false, "does not exist"),
        (Found::NotABlockDevice, false, "not a block device"),
        (
            Found::Content(Content::Other("partition table dos".into()), None),
            false,
            "partition table dos",
        ),
    ] {
        match plan_dir(&dir_disk(found.clone(), at_path, 0)) {
            DirPlan::Refuse(Unusable::DeviceRefused { device, what }) => {
                assert_eq!(device, PathBuf::from("/dev/d"));
                assert!(what.contains(want), "{found:?}: {what}");
            }
            other => panic!("{found:?}: {other:?}"),
        }
    }
}

#[test]
fn dir_pools_never_mount_over_files() {
    for found in [
        Found::Content(Content::Empty, None),
        fs("xfs", Some(POOL_FS_LABEL)),
    ] {
        match plan_dir(&dir_disk(found, false, 3)) {
            DirPlan::Refuse(Unusable::DisksFailed(m)) => assert!(m.contains("3 entries"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn globs_are_told_from_paths() {
    assert!(is_glob("/dev/disk/by-id/nvme-*"));
    assert!(is_glob("/dev/sd[bc]"));
    assert!(is_glob("/dev/vd?"));
    assert!(!is_glob("/dev/disk/by-path/pci-0000:00:1f.2-ata-1"));
}

#[test]
fn describes_what_blkid_found() {
    assert_eq!(describe(&Content::Empty, None), "is blank");
    assert!(describe(&Content::Other("LVM2_member (raid)".into()), None)
        .contains("LVM physical volume"));
}
