//! The PersistentVolume of a discovered entry, and how the node recognises its
//! own static PVs.
//!
//! A static PV carries the driver and the static handle in its CSI source, the
//! node affinity `topology.localvol.csi.dev/node In [node]`, the class's
//! StorageClass, reclaim policy `Delete`, and labels and annotations naming the
//! node and class that created it. Its `pv.kubernetes.io/provisioned-by` names
//! `<driver>/static`, never the driver itself, so the external-provisioner
//! (which deletes the PVs of its own provisioner name through DeleteVolume) never
//! touches it: released static PVs are cleaned and deleted by the node's deleter.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolume, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::scan::{Discovered, EntryKind};
use super::{hex_digest, DiscoveryClass, StaticHandle};
use crate::ids::TOPOLOGY_KEY;

/// Label on every static PV (the cache's selector with [`LABEL_NODE`]).
pub const LABEL_STATIC: &str = "localvol.csi.dev/static";
/// Label: the node that created the PV ([`node_label_value`]).
pub const LABEL_NODE: &str = "localvol.csi.dev/node";
/// Label: the key of the discovery class.
pub const LABEL_CLASS: &str = "localvol.csi.dev/discovery-class";
/// Annotation: the full node name.
pub const ANN_NODE: &str = "localvol.csi.dev/node";
/// Annotation: the StorageClass of the discovery class.
pub const ANN_CLASS: &str = "localvol.csi.dev/discovery-storage-class";
/// Annotation: the discovered path on the node.
pub const ANN_PATH: &str = "localvol.csi.dev/path";
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// The `localvol.csi.dev/node` label value of a node: its name when that is a
/// valid label value (at most 63 characters), else `h-` and a hash of it.
pub fn node_label_value(node: &str) -> String {
    let ok = node.len() <= 63
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && node
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && node
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    if ok {
        node.to_owned()
    } else {
        format!("h-{}", hex_digest(node.as_bytes(), 16))
    }
}

/// The label selector of this node's static PVs.
pub fn selector(node: &str) -> String {
    format!(
        "{LABEL_STATIC}=true,{LABEL_NODE}={}",
        node_label_value(node)
    )
}

/// Name of the PV of a handle on a node: PV names are cluster-wide, handles
/// are per node.
pub fn pv_name(node: &str, handle: &StaticHandle) -> String {
    format!(
        "localvol-static-{}",
        hex_digest(format!("{node}\0{handle}").as_bytes(), 12)
    )
}

/// The value of `pv.kubernetes.io/provisioned-by` on static PVs.
pub fn provisioned_by(driver: &str) -> String {
    format!("{driver}/static")
}

/// Builds the PV of a discovered entry.
pub fn build(driver: &str, node: &str, class: &DiscoveryClass, d: &Discovered) -> PersistentVolume {
    let mut labels: BTreeMap<String, String> = class.labels.clone();
    labels.insert(LABEL_STATIC.into(), "true".into());
    labels.insert(LABEL_NODE.into(), node_label_value(node));
    labels.insert(LABEL_CLASS.into(), class.key());
    let annotations = BTreeMap::from([
        (ANN_NODE.to_owned(), node.to_owned()),
        (ANN_CLASS.to_owned(), class.storage_class.clone()),
        (ANN_PATH.to_owned(), d.path.to_string_lossy().into_owned()),
        (ANN_PROVISIONED_BY.to_owned(), provisioned_by(driver)),
    ]);
    let fs_type = match d.kind {
        EntryKind::Mount { .. } => class.fs_type.clone(),
        EntryKind::Device { .. } => None,
    };
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(pv_name(node, &d.handle)),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(class.access_modes.clone()),
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity(d.capacity_bytes.to_string()),
            )])),
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.to_owned(),
                volume_handle: d.handle.to_string(),
                fs_type,
                ..Default::default()
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: TOPOLOGY_KEY.to_owned(),
                            operator: "In".to_owned(),
                            values: Some(vec![node.to_owned()]),
                        }]),
                        ..Default::default()
                    }],
                }),
            }),
            persistent_volume_reclaim_policy: Some("Delete".to_owned()),
            storage_class_name: Some(class.storage_class.clone()),
            volume_mode: Some(class.volume_mode.as_str().to_owned()),
            ..Default::default()
        }),
        status: None,
    }
}

/// The static handle of a PV when it is one of this node's static PVs of this
/// driver; None for anything else (other nodes, other drivers, dynamic PVs,
/// PVs someone else labelled).
pub fn ours(pv: &PersistentVolume, driver: &str, node: &str) -> Option<StaticHandle> {
    let labels = pv.metadata.labels.as_ref()?;
    let anns = pv.metadata.annotations.as_ref()?;
    if labels.get(LABEL_STATIC).map(String::as_str) != Some("true")
        || anns.get(ANN_NODE).map(String::as_str) != Some(node)
        || anns.get(ANN_PROVISIONED_BY) != Some(&provisioned_by(driver))
    {
        return None;
    }
    let csi = pv.spec.as_ref()?.csi.as_ref()?;
    if csi.driver != driver {
        return None;
    }
    let h = StaticHandle::parse(&csi.volume_handle)?;
    (pv.metadata.name.as_deref() == Some(pv_name(node, &h).as_str())).then_some(h)
}

/// The PV's phase (`Pending`, `Available`, `Bound`, `Released`, `Failed`).
pub fn phase(pv: &PersistentVolume) -> Option<&str> {
    pv.status.as_ref()?.phase.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::scan::tests::class;
    use crate::discovery::{CleanupMethod, VolumeMode};
    use serde_json::json;
    use std::path::Path;

    pub(crate) fn discovered(class_: &DiscoveryClass, name: &str, kind: EntryKind) -> Discovered {
        Discovered {
            class: 0,
            name: name.into(),
            path: class_.host_dir.join(name),
            handle: StaticHandle::new(class_, name.as_ref()),
            capacity_bytes: 10 << 30,
            kind,
        }
    }

    #[test]
    fn builds_exactly_the_expected_pv() {
        let mut c = class(
            Path::new("/mnt/disks"),
            VolumeMode::Filesystem,
            CleanupMethod::DeleteContents,
        );
        c.storage_class = "local-ssd".into();
        c.fs_type = Some("xfs".into());
        c.labels = BTreeMap::from([("tier".into(), "fast".into())]);
        let d = discovered(
            &c,
            "ssd1",
            EntryKind::Mount {
                fs_type: "xfs".into(),
            },
        );
        let pv = build("localvol.csi.dev", "worker-1", &c, &d);
        let handle = d.handle.to_string();
        let name = pv_name("worker-1", &d.handle);
        assert!(
            name.starts_with("localvol-static-") && name.len() == 40,
            "{name}"
        );
        assert_eq!(
            serde_json::to_value(&pv).unwrap(),
            json!({
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {
                    "name": name,
                    "labels": {
                        "localvol.csi.dev/discovery-class": c.key(),
                        "localvol.csi.dev/node": "worker-1",
                        "localvol.csi.dev/static": "true",
                        "tier": "fast",
                    },
                    "annotations": {
                        "localvol.csi.dev/discovery-storage-class": "local-ssd",
                        "localvol.csi.dev/node": "worker-1",
                        "localvol.csi.dev/path": "/mnt/disks/ssd1",
                        "pv.kubernetes.io/provisioned-by": "localvol.csi.dev/static",
                    },
                },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "capacity": {"storage": "10737418240"},
                    "csi": {
                        "driver": "localvol.csi.dev",
                        "volumeHandle": handle,
                        "fsType": "xfs",
                    },
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{
                        "matchExpressions": [{
                            "key": "topology.localvol.csi.dev/node",
                            "operator": "In",
                            "values": ["worker-1"],
                        }],
                    }]}},
                    "persistentVolumeReclaimPolicy": "Delete",
                    "storageClassName": "local-ssd",
                    "volumeMode": "Filesystem",
                },
            })
        );
        assert_eq!(
            ours(&pv, "localvol.csi.dev", "worker-1"),
            Some(d.handle.clone())
        );
        assert_eq!(ours(&pv, "localvol.csi.dev", "worker-2"), None);
        assert_eq!(ours(&pv, "other.csi.dev", "worker-1"), None);
    }

    #[test]
    fn block_pvs_have_no_fs_type() {
        let c = class(
            Path::new("/dev/disks"),
            VolumeMode::Block,
            CleanupMethod::Zero,
        );
        let d = discovered(
            &c,
            "nvme1",
            EntryKind::Device {
                device: "/dev/nvme1n1".into(),
            },
        );
        let v = serde_json::to_value(build("localvol.csi.dev", "n", &c, &d)).unwrap();
        assert_eq!(v["spec"]["volumeMode"], "Block");
        assert_eq!(
            v["spec"]["csi"],
            json!({"driver": "localvol.csi.dev", "volumeHandle": d.handle.to_string()})
        );
    }

    #[test]
    fn node_label_values_are_valid() {
        assert_eq!(node_label_value("worker-1"), "worker-1");
        let long = "a".repeat(64);
        let v = node_label_value(&long);
        assert!(v.starts_with("h-") && v.len() == 34, "{v}");
        assert_ne!(node_label_value("node.example.com."), "node.example.com.");
        assert_eq!(
            selector("worker-1"),
            "localvol.csi.dev/static=true,localvol.csi.dev/node=worker-1"
        );
        // PV names are DNS subdomains, distinct per node.
        let c = class(Path::new("/d"), VolumeMode::Block, CleanupMethod::Zero);
        let h = StaticHandle::new(&c, "x".as_ref());
        assert_ne!(pv_name("a", &h), pv_name("b", &h));
        assert!(crate::discovery::is_dns_subdomain(&pv_name("a", &h)));
    }
}
