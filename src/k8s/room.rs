//! Room to grow a volume that lives on another node, as the cluster knows it.
//!
//! external-resizer runs once per cluster and calls the driver on its own
//! node. A volume on another node is grown there, in NodeExpandVolume; if
//! ControllerExpandVolume accepted any size blindly, the PV would grow first
//! and a node without room would then fail NodeExpandVolume forever. So before
//! the PV grows, the cluster is asked: the volume's PV says which node holds
//! it (its node affinity), its StorageClass and its current size; the
//! CSIStorageCapacity object that node's external-provisioner publishes for
//! that class says how much the node had free when it last looked. Growth
//! beyond that is refused. Where the cluster cannot tell (no PV, capacity
//! tracking off), the owning node still checks in NodeExpandVolume.

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, ListParams};
use kube::Client;

use crate::ids::TOPOLOGY_KEY;
use crate::size::{human, parse_size};

/// Where a volume lives, from its PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub pv: String,
    pub node: String,
    pub class: String,
    pub size_bytes: u64,
}

/// What the cluster says about growing a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The volume is already at least that large: nothing to fit.
    NoGrowth,
    /// The growth fits in what the node last published.
    Fits {
        placement: Placement,
        available: u64,
    },
    /// The cluster cannot tell (why); the node decides in NodeExpandVolume.
    Unknown(String),
}

/// Why growth was refused or could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum RoomError {
    #[error(
        "volume {volume} (PV {pv}) on node {node} needs {} more, but the node has {} free for \
         StorageClass {class} (CSIStorageCapacity {object}); ask for at most {}",
        human(*growth), human(*available), human(size_bytes + available)
    )]
    NoRoom {
        volume: String,
        pv: String,
        node: String,
        class: String,
        size_bytes: u64,
        growth: u64,
        available: u64,
        object: String,
    },
    #[error("listing {what} to check the owning node's free space: {source}")]
    Api {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// The cluster's view of free space, for one driver.
pub struct Room {
    client: Client,
    driver: String,
}

impl Room {
    /// CSIStorageCapacity objects are read from the client's default
    /// namespace: the pod's own, where its external-provisioner writes them.
    pub fn new(client: Client, driver: &str) -> Self {
        Self {
            client,
            driver: driver.to_owned(),
        }
    }

    /// May volume `volume_id` grow to `new_size` bytes on its node?
    pub async fn check(&self, volume_id: &str, new_size: u64) -> Result<Verdict, RoomError> {
        let pv_api: Api<PersistentVolume> = Api::all(self.client.clone());
        // resourceVersion 0: the API server's cache is recent enough here.
        let pvs = pv_api
            .list(&ListParams::default().match_any())
            .await
            .map_err(|source| RoomError::Api {
                what: "PersistentVolumes",
                source,
            })?;
        let Some(at) = pvs
            .iter()
            .find_map(|pv| placement(pv, &self.driver, volume_id))
        else {
            return Ok(Verdict::Unknown(format!(
                "no PV of {} with volume handle {volume_id}, pinned to one node, with a class and a size",
                self.driver
            )));
        };
        let growth = new_size.saturating_sub(at.size_bytes);
        if growth == 0 {
            return Ok(Verdict::NoGrowth);
        }
        let cap_api: Api<CSIStorageCapacity> = Api::default_namespaced(self.client.clone());
        let caps = cap_api
            .list(&ListParams::default().match_any())
            .await
            .map_err(|source| RoomError::Api {
                what: "CSIStorageCapacities",
                source,
            })?;
        let Some((object, available)) = published(caps.iter(), &at.node, &at.class) else {
            return Ok(Verdict::Unknown(format!(
                "no CSIStorageCapacity with a capacity for node {} and StorageClass {} (is capacity tracking on?)",
                at.node, at.class
            )));
        };
        if growth > available {
            return Err(RoomError::NoRoom {
                volume: volume_id.to_owned(),
                pv: at.pv,
                node: at.node,
                class: at.class,
                size_bytes: at.size_bytes,
                growth,
                available,
                object,
            });
        }
        Ok(Verdict::Fits {
            placement: at,
            available,
        })
    }
}

/// Where `pv` says volume `volume_id` of `driver` lives; None when `pv` is
/// another volume's, or lacks one node, a class or a readable size.
pub fn placement(pv: &PersistentVolume, driver: &str, volume_id: &str) -> Option<Placement> {
    let spec = pv.spec.as_ref()?;
    if spec.csi.as_ref()?.volume_handle != volume_id {
        return None;
    }
    let node = super::pinned_node(pv, driver)?;
    let size = spec.capacity.as_ref()?.get("storage")?;
    Some(Placement {
        pv: pv.metadata.name.clone()?,
        node: node.to_owned(),
        class: spec.storage_class_name.clone().filter(|c| !c.is_empty())?,
        size_bytes: parse_size(&size.0).ok()?,
    })
}

/// The free bytes published for `node` and `class`, with the object's
/// name. Of several such objects (one left from an earlier owner, say) the
/// smallest counts; an object without a readable capacity counts as none.
pub fn published<'a>(
    caps: impl Iterator<Item = &'a CSIStorageCapacity>,
    node: &str,
    class: &str,
) -> Option<(String, u64)> {
    caps.filter(|c| c.storage_class_name == class)
        .filter(|c| {
            c.node_topology
                .as_ref()
                .and_then(|t| t.match_labels.as_ref())
                .and_then(|l| l.get(TOPOLOGY_KEY))
                .is_some_and(|n| n == node)
        })
        .filter_map(|c| {
            let bytes = parse_size(&c.capacity.as_ref()?.0).ok()?;
            Some((c.metadata.name.clone().unwrap_or_default(), bytes))
        })
        .min_by_key(|(_, bytes)| *bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::fake::{Fake, Role, PVS};
    use serde_json::{json, Value};

    const DRIVER: &str = "localvol.csi.dev";
    const CAPS: &str = "/apis/storage.k8s.io/v1/namespaces/kube-system/csistoragecapacities";

    fn pv(name: &str, handle: &str, node: &str, size: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": size},
                "storageClassName": "fast",
                "csi": {"driver": DRIVER, "volumeHandle": handle},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": TOPOLOGY_KEY, "operator": "In", "values": [node]}
                ]}]}},
            }
        })
    }

    fn cap(name: &str, node: &str, class: &str, capacity: &str) -> Value {
        json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
            "metadata": {"name": name, "namespace": "kube-system"},
            "storageClassName": class,
            "nodeTopology": {"matchLabels": {TOPOLOGY_KEY: node}},
            "capacity": capacity,
        })
    }

    /// A cluster with volume `thick.v1` (1Gi) on n1, and capacities.
    fn cluster(caps: &[(&str, &str, &str, &str)]) -> Fake {
        let f = Fake::start(Role::Expansion);
        f.put_pv(pv("pv-1", "thick.v1", "n1", "1Gi"));
        f.put_pv(pv("pv-2", "thick.v2", "n2", "1Gi"));
        for (name, node, class, capacity) in caps {
            f.put(&format!("{CAPS}/{name}"), cap(name, node, class, capacity));
        }
        f
    }

    #[tokio::test]
    async fn growth_that_fits_the_owning_nodes_capacity_is_accepted() {
        let f = cluster(&[("c1", "n1", "fast", "3Gi"), ("c2", "n2", "fast", "0")]);
        let room = Room::new(f.client.clone(), DRIVER);
        let v = room.check("thick.v1", 4 << 30).await.unwrap();
        let Verdict::Fits {
            placement,
            available,
        } = v
        else {
            panic!("expected Fits, got {v:?}");
        };
        assert_eq!(available, 3 << 30);
        assert_eq!(placement.node, "n1");
        assert_eq!(placement.size_bytes, 1 << 30);
        assert_eq!(
            f.log(),
            vec![format!("LIST {PVS}"), format!("LIST {CAPS}")],
            "one list of PVs, one of this namespace's capacities, nothing written"
        );
    }

    #[tokio::test]
    async fn growth_beyond_the_owning_nodes_capacity_is_refused_with_the_numbers() {
        // n1 has 512Mi free for "fast" (the smaller of two objects); plenty
        // for another class and on another node does not count.
        let f = cluster(&[
            ("c1", "n1", "fast", "1Gi"),
            ("c1-old", "n1", "fast", "512Mi"),
            ("c2", "n1", "slow", "100Gi"),
            ("c3", "n2", "fast", "100Gi"),
        ]);
        let room = Room::new(f.client.clone(), DRIVER);
        let e = room.check("thick.v1", 2 << 30).await.unwrap_err();
        let RoomError::NoRoom {
            growth,
            available,
            object,
            ..
        } = &e
        else {
            panic!("expected NoRoom, got {e:?}");
        };
        assert_eq!((*growth, *available), (1 << 30, 512 << 20));
        assert_eq!(object, "c1-old");
        let msg = e.to_string();
        for part in [
            "pv-1",
            "node n1",
            "1Gi more",
            "512Mi free",
            "fast",
            "at most 1.5Gi",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg:?}");
        }
        // Exactly the free space fits.
        let v = room
            .check("thick.v1", (1 << 30) + (512 << 20))
            .await
            .unwrap();
        assert!(matches!(v, Verdict::Fits { .. }), "{v:?}");
    }

    #[tokio::test]
    async fn no_growth_needs_no_capacity() {
        let f = cluster(&[]);
        let room = Room::new(f.client.clone(), DRIVER);
        assert_eq!(
            room.check("thick.v1", 1 << 30).await.unwrap(),
            Verdict::NoGrowth
        );
        assert_eq!(f.log(), vec![format!("LIST {PVS}")]);
    }

    #[tokio::test]
    async fn what_the_cluster_cannot_tell_is_unknown_not_refused() {
        // No capacity object for the node and class: tracking is off.
        let f = cluster(&[("c2", "n2", "fast", "0")]);
        let room = Room::new(f.client.clone(), DRIVER);
        let v = room.check("thick.v1", 2 << 30).await.unwrap();
        assert!(
            matches!(&v, Verdict::Unknown(why) if why.contains("node n1")),
            "{v:?}"
        );
        // No PV names the volume (or it is another driver's).
        let v = room.check("thick.nope", 2 << 30).await.unwrap();
        assert!(
            matches!(&v, Verdict::Unknown(why) if why.contains("thick.nope")),
            "{v:?}"
        );
        let mut other = pv("pv-3", "thick.v3", "n1", "1Gi");
        other["spec"]["csi"]["driver"] = json!("other.csi.dev");
        f.put_pv(other);
        let v = room.check("thick.v3", 2 << 30).await.unwrap();
        assert!(matches!(v, Verdict::Unknown(_)), "{v:?}");
    }

    #[test]
    fn placement_needs_the_handle_one_node_a_class_and_a_size() {
        let read = |v: Value| serde_json::from_value::<PersistentVolume>(v).unwrap();
        let p = read(pv("pv-1", "thick.v1", "n1", "1536Mi"));
        assert_eq!(
            placement(&p, DRIVER, "thick.v1"),
            Some(Placement {
                pv: "pv-1".into(),
                node: "n1".into(),
                class: "fast".into(),
                size_bytes: 1536 << 20,
            })
        );
        assert_eq!(placement(&p, DRIVER, "thick.v2"), None);
        assert_eq!(placement(&p, "other.csi.dev", "thick.v1"), None);
        let mut no_class = pv("pv-1", "thick.v1", "n1", "1Gi");
        no_class["spec"]["storageClassName"] = json!("");
        assert_eq!(placement(&read(no_class), DRIVER, "thick.v1"), None);
        let bad_size = pv("pv-1", "thick.v1", "n1", "1e3x");
        assert_eq!(placement(&read(bad_size), DRIVER, "thick.v1"), None);
    }
}
