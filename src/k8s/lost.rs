//! Node replaced vs node lost: a node whose disks were replaced keeps its
//! name but not its volumes.
//!
//! Every pool has a storage identity ([`StorageId`]: a VG's UUID, a dir
//! pool's id file), which each volume's PV carries in its volume attributes
//! and each node plugin publishes on its CSINode ([`storage_annotation`]).
//!
//! When the node-loss controller deletes the PVs of a node gone past its
//! grace period, it first writes down what it deletes: the *lost record*, a
//! ConfigMap per node in the controller's namespace ([`record_name`]) that
//! lists each deleted PV's volume handle and storage identity. It is written
//! before the first DELETE (a failed write deletes nothing), only ever
//! grows, and is removed by an operator, never by the driver.
//!
//! A node that comes back with the same storage finds those volumes without
//! PVs. The orphan pass reads its node's record and keeps every orphan the
//! record lists whose identity is the pool's own (or unknown: a PV from
//! before identities): reported, never reclaimed, whatever `orphans.mode`
//! says. A node back with other disks has other identities, so the record
//! matches nothing and orphans are handled as before.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::json;

use crate::ids::StorageId;

/// Prefix of a lost record's ConfigMap name: `<prefix><node>`.
pub const RECORD_PREFIX: &str = "localvol-lost.";

/// Label every lost record carries (value: the driver name is not a valid
/// label value when long, so `"true"`).
pub const RECORD_LABEL: &str = "localvol.csi.dev/lost-node-record";

/// The ConfigMap that holds `node`'s lost record. Node names are DNS
/// subdomains, so the prefixed name is one too as long as it fits in 253
/// bytes; a longer one is named by a hash of the node name instead.
pub fn record_name(node: &str) -> String {
    let name = format!("{RECORD_PREFIX}{node}");
    if name.len() <= 253 {
        return name;
    }
    use sha2::{Digest, Sha256};
    let h = Sha256::digest(node.as_bytes());
    let hex: String = h[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{RECORD_PREFIX}{hex}")
}

/// The annotation on a node's CSINode that lists its pools' storage
/// identities (a JSON object: pool name → identity).
pub fn storage_annotation(driver: &str) -> String {
    format!("{driver}/storage")
}

/// What the controller deleted for one node: volume handle → the storage
/// identity its PV named (None: the PV named none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LostRecord {
    pub node: String,
    pub volumes: BTreeMap<String, Option<StorageId>>,
}

impl LostRecord {
    /// From the ConfigMap's `volumes`: one `<handle> <identity or ->` a line.
    /// A line whose identity does not parse keeps its handle with an
    /// unknown identity (kept, never reclaimed: the safe reading).
    pub fn from_configmap(cm: &ConfigMap) -> LostRecord {
        let data = cm.data.clone().unwrap_or_default();
        let mut volumes = BTreeMap::new();
        for line in data
            .get("volumes")
            .map(String::as_str)
            .unwrap_or("")
            .lines()
        {
            let mut f = line.split_whitespace();
            let Some(handle) = f.next() else { continue };
            let id = f.next().and_then(|s| StorageId::parse(s).ok());
            volumes.insert(handle.to_owned(), id);
        }
        LostRecord {
            node: data.get("node").cloned().unwrap_or_default(),
            volumes,
        }
    }

    /// The ConfigMap's data for this record.
    pub fn data(&self, driver: &str) -> BTreeMap<String, String> {
        let mut volumes = String::new();
        let mut storage = BTreeSet::new();
        for (h, id) in &self.volumes {
            let id = id.as_ref().map_or("-", |i| i.as_str());
            volumes.push_str(&format!("{h} {id}\n"));
            storage.insert(id.to_owned());
        }
        storage.remove("-");
        BTreeMap::from([
            ("node".to_owned(), self.node.clone()),
            ("driver".to_owned(), driver.to_owned()),
            (
                "storage".to_owned(),
                storage.into_iter().map(|s| s + "\n").collect(),
            ),
            ("volumes".to_owned(), volumes),
        ])
    }

    /// Whether the volume `handle`, found without a PV in a pool whose
    /// storage is `pool`, is one the controller deleted the PV of on node
    /// loss and whose storage this still is (or may be).
    pub fn keeps(&self, handle: &str, pool: Option<&StorageId>) -> bool {
        match (self.volumes.get(handle), pool) {
            (None, _) => false,
            (Some(Some(was)), Some(now)) => was == now,
            // Unknown on either side: the safe answer.
            (Some(_), _) => true,
        }
    }
}

/// Reads `node`'s lost record from `namespace` (None: there is none).
pub async fn read(
    client: &Client,
    namespace: &str,
    node: &str,
) -> Result<Option<LostRecord>, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    Ok(api
        .get_opt(&record_name(node))
        .await?
        .map(|cm| LostRecord::from_configmap(&cm)))
}

/// Sets this node's storage identities on its CSINode (a merge patch of
/// one annotation). A CSINode that does not exist yet (kubelet creates it)
/// is NotFound: the caller retries.
pub async fn annotate_csinode(
    client: &Client,
    driver: &str,
    node: &str,
    ids: &BTreeMap<String, StorageId>,
) -> Result<(), kube::Error> {
    let api: Api<CSINode> = Api::all(client.clone());
    let value: BTreeMap<&str, &str> = ids.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let patch = json!({"metadata": {"annotations": {
        storage_annotation(driver): serde_json::to_string(&value).expect("a JSON object"),
    }}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> StorageId {
        StorageId::parse(s).unwrap()
    }

    #[test]
    fn record_names_fit_and_records_round_trip() {
        assert_eq!(record_name("n1"), "localvol-lost.n1");
        let long = "a".repeat(250);
        let n = record_name(&long);
        assert!(n.len() <= 253 && n.starts_with(RECORD_PREFIX), "{n}");
        let rec = LostRecord {
            node: "n1".into(),
            volumes: BTreeMap::from([
                ("fast.00".to_owned(), Some(id("lvm:abc-1"))),
                ("old.01".to_owned(), None),
            ]),
        };
        let cm = ConfigMap {
            data: Some(rec.data("localvol.csi.dev")),
            ..Default::default()
        };
        assert_eq!(cm.data.as_ref().unwrap()["storage"], "lvm:abc-1\n");
        assert_eq!(LostRecord::from_configmap(&cm), rec);
    }

    #[test]
    fn kept_when_listed_and_the_storage_is_the_same_or_unknown() {
        let rec = LostRecord {
            node: "n1".into(),
            volumes: BTreeMap::from([
                ("fast.00".to_owned(), Some(id("lvm:abc"))),
                ("old.01".to_owned(), None),
            ]),
        };
        assert!(rec.keeps("fast.00", Some(&id("lvm:abc"))));
        assert!(!rec.keeps("fast.00", Some(&id("lvm:new"))), "other disks");
        assert!(!rec.keeps("fast.02", Some(&id("lvm:abc"))), "not recorded");
        assert!(rec.keeps("old.01", Some(&id("lvm:new"))), "unknown: kept");
        assert!(rec.keeps("fast.00", None));
    }
}
