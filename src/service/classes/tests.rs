//! The class checks on a config of every pool kind: classes CreateVolume
//! takes pass, and each parameter it would refuse is named.

use super::*;

const DRIVER: &str = "localvol.csi.dev";
const CONFIG: &str = "\
pools:
- {name: fast, type: dir, path: /var/lib/localvol/fast}
- {name: plain, type: dir, path: /var/lib/localvol/plain, quota: \"off\"}
- {name: thick, type: lvm, volumeGroup: vg}
- {name: thin, type: lvm, volumeGroup: vg, thinPool: tp, defaultFsType: xfs}
";

fn check_with(config: &str, text: &str, kind: ClassKind) -> Report {
    let config = Config::from_yaml(config).unwrap();
    ClassCheck::new(DRIVER, &config).check(text, kind).unwrap()
}

/// A StorageClass of this driver with `params` (a YAML flow mapping).
fn class(name: &str, params: &str) -> String {
    format!("kind: StorageClass\nmetadata: {{name: {name}}}\nprovisioner: {DRIVER}\nparameters: {params}\n")
}

/// The one class of `text` and its problems.
fn problems(text: &str) -> Vec<String> {
    let report = check_with(CONFIG, text, ClassKind::Storage);
    assert_eq!(report.classes.len(), 1, "{report:?}");
    report.classes.into_iter().next().unwrap().problems
}

const SECRET: &str = "csi.storage.k8s.io/node-stage-secret-name: key, \
                      csi.storage.k8s.io/node-stage-secret-namespace: ns";

#[test]
fn classes_create_volume_takes_pass() {
    let good = [
        ("{}", "pool fast (dir), mount"),
        ("{pool: fast, inodeLimit: \"10000\"}", "pool fast (dir), mount"),
        ("{pool: plain, csi.storage.k8s.io/fstype: xfs}", "pool plain (dir), mount"),
        ("{pool: thick}", "pool thick (lvm), mount, ext4"),
        (
            "{pool: thick, format.ext4.features: \"^orphan_file,64bit\"}",
            // The driver's own rendering: what the volume context carries.
            "pool thick (lvm), mount, ext4 with format.ext4.features=64bit,^orphan_file",
        ),
        (
            "{pool: thick, csi.storage.k8s.io/fstype: xfs, format.xfs.reflink: \"false\"}",
            "pool thick (lvm), mount, xfs with format.xfs.reflink=false",
        ),
        (
            "{pool: thin, format.xfs.nrext64: \"true\", format.xfs.bigtime: \"false\"}",
            "pool thin (lvm-thin), mount, xfs with format.xfs.nrext64=true format.xfs.bigtime=false",
        ),
        (
            &format!("{{pool: thin, encryption: luks2, {SECRET}}}"),
            "pool thin (lvm-thin), mount, xfs, encrypted",
        ),
    ];
    for (params, summary) in good {
        let report = check_with(CONFIG, &class("c", params), ClassKind::Storage);
        let v = &report.classes[0];
        assert_eq!(v.problems, Vec::<String>::new(), "{params}");
        assert_eq!(v.summary, summary, "{params}");
        assert_eq!(report.refused(), 0);
    }
    // Mount options the capability takes, as external-provisioner passes them.
    let text = class("m", "{pool: thick}") + "mountOptions: [noatime, discard]\n";
    assert_eq!(problems(&text), Vec::<String>::new());
}

#[test]
fn each_parameter_create_volume_refuses_is_named() {
    let enc = |pool: &str, how: &str| format!("{{pool: {pool}, encryption: {how}, {SECRET}}}");
    // (parameters, what the one problem starts with, what it says)
    let bad = [
        ("{colour: blue}", "colour: ", "unknown parameter"),
        ("{pool: slow}", "", "slow"),
        ("{pool: -x}", "", "pool"),
        ("{inodeLimit: \"0\"}", "inodeLimit: ", "positive integer"),
        (
            "{pool: thick, inodeLimit: \"10\"}",
            "inodeLimit: ",
            "applies to dir pools",
        ),
        (
            "{pool: plain, inodeLimit: \"10\"}",
            "inodeLimit: ",
            "quota: off",
        ),
        (&enc("thick", "luks1"), "encryption: ", "must be luks2"),
        (
            &enc("fast", "luks2"),
            "encryption: ",
            "applies to LVM pools",
        ),
        (
            "{pool: fast, format.xfs.reflink: \"false\"}",
            "format.xfs.reflink: ",
            "apply to pools that format",
        ),
        (
            "{pool: thin, format.xfs.nrext64: \"yes\"}",
            "format.xfs.nrext64: ",
            "\"true\" or \"false\"",
        ),
        (
            "{pool: thin, format.xfs.crc: \"false\"}",
            "format.xfs.crc: ",
            "unknown format parameter",
        ),
        (
            "{pool: thick, format.xfs.reflink: \"false\"}",
            "format.xfs.reflink: ",
            "ext4",
        ),
        (
            "{pool: thick, format.ext4.features: has_journal}",
            "format.ext4.features: ",
            "is not a feature",
        ),
        (
            "{pool: thick, format.ext4.features: \"64bit,^64bit\"}",
            "format.ext4.features: ",
            "named twice",
        ),
        (
            "{pool: thick, csi.storage.k8s.io/fstype: btrfs}",
            "",
            "btrfs",
        ),
        (
            "{pool: fast, inodeLimit: 10}",
            "inodeLimit: ",
            "must be a string",
        ),
    ];
    for (params, starts, says) in bad {
        let found = problems(&class("c", params));
        assert_eq!(found.len(), 1, "{params}: {found:?}");
        assert!(
            found[0].starts_with(starts) && found[0].contains(says),
            "{params}: {found:?}"
        );
    }
    let text = class("m", "{pool: fast}") + "mountOptions: [\"ro,exec\"]\n";
    let found = problems(&text);
    assert!(
        found.len() == 1 && found[0].contains("invalid mount flag"),
        "{found:?}"
    );
}

#[test]
fn every_bad_parameter_of_a_class_is_named_not_only_the_first() {
    let found = problems(&class(
        "c",
        "{pool: thick, colour: blue, inodeLimit: \"10\", format.xfs.crc: \"1\", format.ext4.features: \"64bit\"}",
    ));
    let named: Vec<&str> = found.iter().map(|p| p.split(':').next().unwrap()).collect();
    assert_eq!(
        named,
        ["colour", "format.xfs.crc", "inodeLimit"],
        "{found:?}"
    );
}

#[test]
fn an_encrypted_class_names_the_secret_that_holds_the_key() {
    let found = problems(&class("c", "{pool: thick, encryption: luks2}"));
    assert!(
        found.len() == 1
            && found[0].contains("node-stage-secret-name")
            && found[0].contains(KEY_FIELD),
        "{found:?}"
    );
    let with = |data: &str| {
        class(
            "c",
            &format!("{{pool: thick, encryption: luks2, {SECRET}}}"),
        ) + &format!("---\nkind: Secret\nmetadata: {{name: key, namespace: ns}}\n{data}\n")
    };
    assert_eq!(
        problems(&with("stringData: {encryptionKey: x}")),
        Vec::<String>::new()
    );
    assert_eq!(
        problems(&with("data: {encryptionKey: eA==}")),
        Vec::<String>::new()
    );
    let found = problems(&with("stringData: {key: x}"));
    assert!(
        found.len() == 1 && found[0].contains("Secret ns/key has no encryptionKey"),
        "{found:?}"
    );
}

#[test]
fn snapshot_classes_are_decoded_as_create_snapshot_does() {
    let vsc = |params: &str| {
        format!("kind: VolumeSnapshotClass\nmetadata: {{name: s}}\ndriver: {DRIVER}\nparameters: {params}\n")
    };
    let report = check_with(CONFIG, &vsc("{snapshotSize: 1Gi}"), ClassKind::Snapshot);
    assert_eq!(report.classes[0].problems, Vec::<String>::new());
    assert_eq!(report.classes[0].summary, "snapshotSize 1Gi");
    let report = check_with(
        CONFIG,
        &vsc("{snapshotSize: \"0\", size: 1Gi}"),
        ClassKind::Snapshot,
    );
    let found = &report.classes[0].problems;
    assert!(
        found.len() == 2
            && found[0].starts_with("size: unknown snapshot parameter")
            && found[1].starts_with("snapshotSize: ")
            && found[1].contains("positive"),
        "{found:?}"
    );
    // No pool of the config takes snapshots.
    let dir_only = "pools: [{name: fast, type: dir, path: /var/lib/localvol/fast}]\n";
    let report = check_with(dir_only, &vsc("{}"), ClassKind::Snapshot);
    assert!(
        report.classes[0].problems[0].contains("supports snapshots"),
        "{report:?}"
    );
}

#[test]
fn other_documents_are_skipped_and_counted() {
    let text = format!(
        "---\n# a comment only\n---\n{}---\nkind: StorageClass\nmetadata: {{name: local}}\n\
         provisioner: kubernetes.io/no-provisioner\n---\nkind: ConfigMap\nmetadata: {{name: c}}\n\
         data: {{config.yaml: x}}\n",
        class("mine", "{pool: fast}")
    );
    let report = check_with(CONFIG, &text, ClassKind::Storage);
    assert_eq!(report.classes.len(), 1);
    assert_eq!(report.classes[0].class, "StorageClass mine");
    assert_eq!(
        report.other_drivers,
        ["local (kubernetes.io/no-provisioner)"]
    );
    assert_eq!(report.other_kinds, 1);
    let snapshots = check_with(CONFIG, &text, ClassKind::Snapshot);
    assert!(snapshots.classes.is_empty() && snapshots.other_drivers.is_empty());
    assert_eq!(snapshots.other_kinds, 3);
    // Not YAML, or not an object: the file is refused whole.
    let config = Config::from_yaml(CONFIG).unwrap();
    let check = ClassCheck::new(DRIVER, &config);
    for text in [
        "kind: [",
        "- a list\n",
        "kind: StorageClass\nparameters: [a]\n",
    ] {
        assert!(check.check(text, ClassKind::Storage).is_err(), "{text}");
    }
}
