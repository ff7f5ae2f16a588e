//! `localvol config check --storage-class FILE` and `--snapshot-class
//! FILE`: the classes in FILE decoded as this driver decodes what the
//! sidecars send it for them, with no copy of a rule. A StorageClass of
//! this driver becomes the CreateVolumeRequest external-provisioner makes
//! of it for a Filesystem claim (`csi.storage.k8s.io/fstype` as the
//! capability's fsType, `mountOptions` as its mount flags, the other
//! parameters as they are), which goes through CreateVolume's own decoding
//! and its checks against the pool ([`crate::ops::plan_volume`]) on the
//! config's pools, none opened ([`Driver::unopened`]): the pool a class
//! names must be configured, and a pool kind's rules apply (format options
//! of its filesystem, encryption and IO limits on LVM, inode limits on dir
//! pools with quotas). An encrypted class must name its node-stage Secret,
//! where NodeStageVolume reads the key; when FILE holds that Secret, it
//! must have the key's field. A VolumeSnapshotClass of this driver goes
//! through CreateSnapshot's parameter decoding, and some configured pool
//! must take snapshots.
//!
//! Documents of other kinds, and classes of other provisioners or
//! drivers, are not checked: they are listed as skipped.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use serde_norway::Value;

use super::controller::{decode_new_volume, decode_snapshot_params};
use crate::config::Config;
use crate::crypt::KEY_FIELD;
use crate::csi;
use crate::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use crate::driver::Driver;
use crate::ids::truncate;
use crate::ops::{self, PARAM_ENCRYPTION};
use crate::size::human;

/// The class parameter external-provisioner turns into the capability's fsType.
const PARAM_FSTYPE: &str = "csi.storage.k8s.io/fstype";
/// The class parameters naming the Secret kubelet passes to NodeStageVolume.
const NODE_STAGE_SECRET_NAME: &str = "csi.storage.k8s.io/node-stage-secret-name";
const NODE_STAGE_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/node-stage-secret-namespace";
/// The name a checked class's volume is given (any valid name would do).
const CHECK_NAME: &str = "pvc-00000000-0000-0000-0000-000000000000";

/// Which classes a file is read for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassKind {
    /// `StorageClass` whose `provisioner` is the driver's name.
    Storage,
    /// `VolumeSnapshotClass` whose `driver` is the driver's name.
    Snapshot,
}

impl ClassKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ClassKind::Storage => "StorageClass",
            ClassKind::Snapshot => "VolumeSnapshotClass",
        }
    }
}

/// One class of this driver and what its check found.
#[derive(Debug)]
pub struct Verdict {
    /// `StorageClass fast`.
    pub class: String,
    /// What CreateVolume or CreateSnapshot would refuse, one entry per
    /// parameter where the refusal is the parameter's own. Empty: none.
    pub problems: Vec<String>,
    /// What a volume of the class is, in words (checked classes only).
    pub summary: String,
}

/// What a file held.
#[derive(Debug, Default)]
pub struct Report {
    /// The classes of this driver, in file order.
    pub classes: Vec<Verdict>,
    /// Classes of the kind asked for but of another provisioner or driver
    /// (`local (kubernetes.io/no-provisioner)`).
    pub other_drivers: Vec<String>,
    /// How many documents were of other kinds.
    pub other_kinds: usize,
}

impl Report {
    pub fn refused(&self) -> usize {
        self.classes
            .iter()
            .filter(|v| !v.problems.is_empty())
            .count()
    }
}

/// The fields of a document that the checks read (Kubernetes' own names).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Doc {
    kind: String,
    metadata: Meta,
    provisioner: String,
    driver: String,
    parameters: BTreeMap<String, Value>,
    mount_options: Vec<String>,
    data: BTreeMap<String, Value>,
    string_data: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Meta {
    name: String,
    namespace: String,
}

/// The checks, on the pools of one config.
pub struct ClassCheck {
    driver: Driver,
}

impl ClassCheck {
    /// Checks for the classes of driver `name` (a StorageClass's
    /// `provisioner`), on the pools of `config`, none opened.
    pub fn new(name: &str, config: &Config) -> Self {
        ClassCheck {
            driver: Driver::unopened(name, config),
        }
    }

    /// The classes of `kind` in `text` (one or more YAML documents).
    pub fn check(&self, text: &str, kind: ClassKind) -> Result<Report, String> {
        let docs = parse(text)?;
        let mut report = Report::default();
        for doc in &docs {
            if doc.kind != kind.as_str() {
                report.other_kinds += 1;
                continue;
            }
            let driver = match kind {
                ClassKind::Storage => &doc.provisioner,
                ClassKind::Snapshot => &doc.driver,
            };
            if *driver != self.driver.name {
                (report.other_drivers).push(format!("{} ({driver})", doc.metadata.name));
                continue;
            }
            let class = format!("{} {}", kind.as_str(), doc.metadata.name);
            let (problems, summary) = match kind {
                ClassKind::Storage => self.storage_class(doc, &docs),
                ClassKind::Snapshot => self.snapshot_class(doc),
            };
            report.classes.push(Verdict {
                class,
                problems,
                summary,
            });
        }
        Ok(report)
    }

    /// A StorageClass: its problems, or what its volumes are.
    fn storage_class(&self, doc: &Doc, docs: &[Doc]) -> (Vec<String>, String) {
        let (mut params, mut problems) = strings(&doc.parameters);
        let fs_type = params.remove(PARAM_FSTYPE).unwrap_or_default();
        let request = |params: HashMap<String, String>| csi::CreateVolumeRequest {
            name: CHECK_NAME.to_owned(),
            volume_capabilities: vec![csi::VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume {
                    fs_type: fs_type.clone(),
                    mount_flags: doc.mount_options.clone(),
                    volume_mount_group: String::new(),
                })),
                access_mode: Some(AccessMode {
                    mode: Mode::SingleNodeWriter.into(),
                }),
            }],
            parameters: params,
            ..Default::default()
        };
        let mut summary = String::new();
        match self.create_volume(request(params.clone())) {
            Ok(s) => summary = s,
            Err(whole) => {
                // Each parameter on its own (with the pool it names): the
                // refusals that are a parameter's own, all of them.
                let (named, rest): (HashMap<_, _>, HashMap<_, _>) = (params.clone())
                    .into_iter()
                    .partition(|(k, _)| k == super::PARAM_POOL);
                let before = problems.len();
                if let Err(e) = self.create_volume(request(named.clone())) {
                    problems.push(e);
                } else {
                    for (k, v) in rest {
                        let mut one = named.clone();
                        one.insert(k.clone(), v);
                        if let Err(e) = self.create_volume(request(one)) {
                            problems.push(format!("{k}: {e}"));
                        }
                    }
                }
                if problems.len() == before {
                    problems.push(whole); // a refusal of parameters together
                }
            }
        }
        problems.sort();
        problems.extend(encryption_secret(&params, docs));
        (problems, summary)
    }

    /// CreateVolume's decoding and checks, short of the lock: what the
    /// volume is, or why it is refused.
    fn create_volume(&self, req: csi::CreateVolumeRequest) -> Result<String, String> {
        let new = decode_new_volume(&req).map_err(|s| s.message().to_owned())?;
        ops::plan_volume(&self.driver, new)
            .map(|plan| plan.describe())
            .map_err(|e| e.to_string())
    }

    /// A VolumeSnapshotClass: CreateSnapshot's parameter decoding, one
    /// parameter at a time, and a pool that takes snapshots.
    fn snapshot_class(&self, doc: &Doc) -> (Vec<String>, String) {
        let (params, mut problems) = strings(&doc.parameters);
        for (k, v) in &params {
            let one = HashMap::from([(k.clone(), v.clone())]);
            if let Err(e) = decode_snapshot_params(&one) {
                problems.push(format!("{k}: {}", e.message()));
            }
        }
        if let Err(e) = ops::snapshots_offered(&self.driver) {
            problems.push(e.to_string());
        }
        problems.sort();
        let summary = match decode_snapshot_params(&params) {
            Ok(Some(cow)) => format!("snapshotSize {}", human(cow)),
            _ => "no snapshotSize".to_owned(),
        };
        (problems, summary)
    }
}

/// The documents of `text`, skipping empty ones.
fn parse(text: &str) -> Result<Vec<Doc>, String> {
    let mut out = Vec::new();
    for (i, d) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(d).map_err(|e| format!("document {}: {e}", i + 1))?;
        if value.is_null() {
            continue;
        }
        let doc = Doc::deserialize(value).map_err(|e| {
            format!(
                "document {}: not a Kubernetes object of a known shape: {e}",
                i + 1
            )
        })?;
        out.push(doc);
    }
    Ok(out)
}

/// The parameters as the strings Kubernetes keeps, and a problem for
/// each value that is not one (the API server refuses such a class).
fn strings(params: &BTreeMap<String, Value>) -> (HashMap<String, String>, Vec<String>) {
    let mut out = HashMap::new();
    let mut problems = Vec::new();
    for (k, v) in params {
        match v {
            Value::String(s) => {
                out.insert(k.clone(), s.clone());
            }
            other => problems.push(format!(
                "{k}: the value must be a string (quote it): {}",
                truncate(&serde_norway::to_string(other).unwrap_or_default())
            )),
        }
    }
    (out, problems)
}

/// An encrypted class names the Secret NodeStageVolume reads the key
/// from; one in the same file must hold the key's field.
fn encryption_secret(params: &HashMap<String, String>, docs: &[Doc]) -> Vec<String> {
    if !params.contains_key(PARAM_ENCRYPTION) {
        return vec![];
    }
    let (Some(name), Some(namespace)) = (
        params.get(NODE_STAGE_SECRET_NAME),
        params.get(NODE_STAGE_SECRET_NAMESPACE),
    ) else {
        return vec![format!(
            "{PARAM_ENCRYPTION}: {NODE_STAGE_SECRET_NAME} and {NODE_STAGE_SECRET_NAMESPACE} \
             must name the Secret with the key ({KEY_FIELD}), which NodeStageVolume reads"
        )];
    };
    let lacks_key = |d: &Doc| {
        d.kind == "Secret"
            && d.metadata.name == *name
            && d.metadata.namespace == *namespace
            && !d.data.contains_key(KEY_FIELD)
            && !d.string_data.contains_key(KEY_FIELD)
    };
    match docs.iter().any(lacks_key) {
        true => vec![format!(
            "{PARAM_ENCRYPTION}: Secret {namespace}/{name} has no {KEY_FIELD}"
        )],
        false => vec![],
    }
}

#[cfg(test)]
mod tests;
