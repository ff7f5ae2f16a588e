//! `localvol config`: the driver's rules asked without running it. `check`
//! reads config files as `serve --config` does, and classes as CreateVolume
//! and CreateSnapshot decode them (`localvol::class_check`); `programs`
//! names what the image must hold. None needs root, a pool or a cluster.

use std::path::{Path, PathBuf};

use localvol::class_check::{ClassCheck, ClassKind, Report};
use localvol::config::Config;

#[derive(clap::Subcommand)]
pub enum ConfigCommand {
    /// Read each config FILE as `serve --config FILE` does, before it opens
    /// any pool; with --storage-class or --snapshot-class, check the classes
    /// of --driver-name in those files as CreateVolume and CreateSnapshot
    /// decode them, on the pools of the one config FILE (none: serve's
    /// default pool under --data-dir). Exit 1 if anything is refused.
    Check {
        #[arg(value_name = "FILE", required_unless_present_any = ["storage_class", "snapshot_class"])]
        files: Vec<PathBuf>,
        /// YAML documents whose StorageClasses of --driver-name are checked
        /// (other documents are skipped; a Secret an encrypted class names is read).
        #[arg(long, value_name = "FILE")]
        storage_class: Vec<PathBuf>,
        /// YAML documents whose VolumeSnapshotClasses of --driver-name are checked.
        #[arg(long, value_name = "FILE")]
        snapshot_class: Vec<PathBuf>,
        /// The provisioner (a VolumeSnapshotClass's driver) of the classes checked.
        #[arg(long, default_value = crate::DEFAULT_DRIVER_NAME)]
        driver_name: String,
        /// Without a config FILE: the folder of serve's default pool.
        #[arg(long, default_value = "/var/lib/localvol")]
        data_dir: PathBuf,
    },
    /// Print the programs the driver runs, one per line: what its image must hold.
    Programs,
}

pub fn main(cmd: ConfigCommand) -> Result<(), String> {
    match cmd {
        ConfigCommand::Check {
            files,
            storage_class,
            snapshot_class,
            driver_name,
            data_dir,
        } => {
            let classes = [
                (ClassKind::Storage, storage_class),
                (ClassKind::Snapshot, snapshot_class),
            ];
            if classes.iter().all(|(_, f)| f.is_empty()) {
                return check_configs(&files);
            }
            let config = match files.as_slice() {
                [] => Config::embedded(&data_dir),
                [one] => Config::load(one).map_err(|e| e.to_string())?,
                _ => return Err("classes are checked on the pools of one config file".into()),
            };
            let check = ClassCheck::new(&driver_name, &config);
            let (mut seen, mut refused) = (0, 0);
            for (kind, files) in &classes {
                for f in files {
                    let (lines, report) = check_classes(&check, *kind, f, &driver_name)?;
                    lines.iter().for_each(|l| println!("{l}"));
                    seen += report.classes.len();
                    refused += report.refused();
                }
            }
            match refused {
                0 => Ok(()),
                n => Err(format!("{n} of {seen} classes refused")),
            }
        }
        ConfigCommand::Programs => {
            for p in localvol::command::PROGRAMS {
                println!("{p}");
            }
            Ok(())
        }
    }
}

/// `config check FILE...`: each config, one line each.
fn check_configs(files: &[PathBuf]) -> Result<(), String> {
    let mut refused = 0;
    for f in files {
        match localvol::config::check_file(f) {
            Ok(summary) => println!("{}: ok, {summary}", f.display()),
            Err(e) => {
                eprintln!("localvol: {e}");
                refused += 1;
            }
        }
    }
    match refused {
        0 => Ok(()),
        n => Err(format!("{n} of {} config files refused", files.len())),
    }
}

/// The lines that tell what the classes of `kind` in `path` are: one per
/// class that passed, one per problem of a class that did not, one for
/// what was not checked.
fn check_classes(
    check: &ClassCheck,
    kind: ClassKind,
    path: &Path,
    driver: &str,
) -> Result<(Vec<String>, Report), String> {
    let file = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {file}: {e}"))?;
    let report = check
        .check(&text, kind)
        .map_err(|e| format!("{file}: {e}"))?;
    let mut lines = Vec::new();
    for v in &report.classes {
        match v.problems.as_slice() {
            [] => lines.push(format!("{file}: {}: ok, {}", v.class, v.summary)),
            problems => {
                for p in problems {
                    lines.push(format!("{file}: {}: refused: {p}", v.class));
                }
            }
        }
    }
    if report.classes.is_empty() {
        lines.push(format!("{file}: no {} of {driver}", kind.as_str()));
    }
    let mut skipped = Vec::new();
    if !report.other_drivers.is_empty() {
        skipped.push(format!(
            "{}es of other drivers: {}",
            kind.as_str(),
            report.other_drivers.join(", ")
        ));
    }
    if report.other_kinds > 0 {
        skipped.push(format!("{} other documents", report.other_kinds));
    }
    if !skipped.is_empty() {
        lines.push(format!("{file}: not checked: {}", skipped.join("; ")));
    }
    Ok((lines, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "pools:\n- {name: fast, type: dir, path: /var/lib/localvol/fast}\n\
                          - {name: thin, type: lvm, volumeGroup: vg, thinPool: tp, defaultFsType: xfs}\n";

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn classes_are_told_one_line_each_problem_and_what_was_skipped() {
        let d = tempfile::tempdir().unwrap();
        let config = Config::load(&write(d.path(), "config.yaml", CONFIG)).unwrap();
        let check = ClassCheck::new("localvol.csi.dev", &config);
        let sc = write(
            d.path(),
            "sc.yaml",
            "kind: StorageClass\nmetadata: {name: good}\nprovisioner: localvol.csi.dev\n\
             parameters: {pool: thin, format.xfs.reflink: \"false\"}\n---\n\
             kind: StorageClass\nmetadata: {name: bad}\nprovisioner: localvol.csi.dev\n\
             parameters: {pool: thin, format.xfs.crc: \"false\", inodeLimit: \"10\"}\n---\n\
             kind: StorageClass\nmetadata: {name: local}\nprovisioner: kubernetes.io/no-provisioner\n\
             ---\nkind: ConfigMap\nmetadata: {name: x}\n",
        );
        let (lines, report) =
            check_classes(&check, ClassKind::Storage, &sc, "localvol.csi.dev").unwrap();
        assert_eq!(report.refused(), 1);
        let f = sc.display();
        assert_eq!(
            lines[0],
            format!(
                "{f}: StorageClass good: ok, pool thin (lvm-thin), mount, xfs with format.xfs.reflink=false"
            )
        );
        assert!(lines[1].starts_with(&format!("{f}: StorageClass bad: refused: format.xfs.crc: ")));
        assert!(lines[2].starts_with(&format!("{f}: StorageClass bad: refused: inodeLimit: ")));
        assert_eq!(
            lines[3],
            format!(
                "{f}: not checked: StorageClasses of other drivers: local \
                 (kubernetes.io/no-provisioner); 1 other documents"
            )
        );
        assert_eq!(lines.len(), 4);
        let (lines, _) =
            check_classes(&check, ClassKind::Snapshot, &sc, "localvol.csi.dev").unwrap();
        assert_eq!(
            lines,
            [
                format!("{f}: no VolumeSnapshotClass of localvol.csi.dev"),
                format!("{f}: not checked: 4 other documents")
            ]
        );
    }

    #[test]
    fn the_exit_status_says_whether_a_class_was_refused() {
        let d = tempfile::tempdir().unwrap();
        let config = write(d.path(), "config.yaml", CONFIG);
        let class = |name: &str, params: &str| {
            write(
                d.path(),
                name,
                &format!(
                    "kind: StorageClass\nmetadata: {{name: c}}\nprovisioner: localvol.csi.dev\n\
                     parameters: {params}\n"
                ),
            )
        };
        let run = |files: Vec<PathBuf>, sc: PathBuf| {
            main(ConfigCommand::Check {
                files,
                storage_class: vec![sc],
                snapshot_class: vec![],
                driver_name: "localvol.csi.dev".into(),
                data_dir: "/var/lib/localvol".into(),
            })
        };
        assert_eq!(
            run(vec![config.clone()], class("a", "{pool: fast}")),
            Ok(())
        );
        assert_eq!(
            run(vec![config.clone()], class("b", "{pool: slow}")),
            Err("1 of 1 classes refused".into())
        );
        // No config file: serve's own default pool, a dir pool.
        assert_eq!(run(vec![], class("c", "{pool: default}")), Ok(()));
        assert_eq!(
            run(vec![config.clone(), config], class("d", "{}")),
            Err("classes are checked on the pools of one config file".into())
        );
    }
}
