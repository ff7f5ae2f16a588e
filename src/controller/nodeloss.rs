//! What the node-loss controller decides, without any API calls: which nodes
//! have been gone for longer than the grace period, which of this driver's
//! PVs are pinned to them, and the patch that takes the provisioner's
//! finalizer off such a PV.
//!
//! A node counts as gone only when its Node object does not exist (a NotReady
//! node still exists and is never acted on). The time a node was first seen
//! missing lives in memory: after a restart the grace period starts again,
//! which only ever delays an action.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use json_patch::jsonptr::PointerBuf;
use json_patch::{Patch, PatchOperation, RemoveOperation, TestOperation};
use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::Value;

use crate::k8s::pinned_node;

/// Opt-in annotation on a PVC (or its StorageClass): delete the claim too
/// when its node is lost, so a StatefulSet pod can be rescheduled elsewhere.
pub const ANN_DELETE_ON_NODE_LOSS: &str = "localvol.csi.dev/delete-on-node-loss";

/// The finalizer external-provisioner (v5, HonorPVReclaimPolicy) puts on
/// every Delete-policy PV it provisions. Only the provisioner of the PV's own
/// node takes it off (after DeleteVolume), so once that node is lost nothing
/// else would, and the deleted PV would stay Terminating forever.
pub const PROVISIONER_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// The API server's finalizer on a PV whose claim is still bound.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// How long a Terminating PV that only `kubernetes.io/pv-protection` holds
/// is left alone after a look, first and at most (doubling in between):
/// nothing changes for it until its claim goes.
pub const HELD_FIRST: Duration = Duration::from_secs(60);
pub const HELD_MAX: Duration = Duration::from_secs(16 * 60);

/// The lost nodes' Terminating PVs that only pv-protection holds, and when
/// each is looked at again.
#[derive(Debug, Default)]
pub struct HeldPvs(BTreeMap<String, (Instant, Duration)>);

/// What to do with a PV of a lost node this pass.
#[derive(Debug, PartialEq, Eq)]
pub enum HeldCheck {
    /// Not held by pv-protection alone: act on it.
    Act,
    /// Held, seen for the first time: act once, and say so.
    FirstSeen,
    /// Held, and its back-off has not run out: leave it.
    Wait,
}

impl HeldPvs {
    pub fn check(&mut self, pv: &PersistentVolume, now: Instant) -> HeldCheck {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let fins = pv.metadata.finalizers.as_deref().unwrap_or_default();
        let held = pv.metadata.deletion_timestamp.is_some()
            && fins.iter().any(|f| f == PV_PROTECTION)
            && !fins.iter().any(|f| f == PROVISIONER_FINALIZER);
        if !held {
            self.0.remove(&name);
            return HeldCheck::Act;
        }
        match self.0.get_mut(&name) {
            None => {
                self.0.insert(name, (now + HELD_FIRST, HELD_FIRST));
                HeldCheck::FirstSeen
            }
            Some((next, _)) if now < *next => HeldCheck::Wait,
            Some((next, wait)) => {
                *wait = (*wait * 2).min(HELD_MAX);
                *next = now + *wait;
                HeldCheck::Act
            }
        }
    }
}

/// The JSON patch that takes [`PROVISIONER_FINALIZER`] off `pv` as read:
/// `test` that the object is still this one (its uid) and the finalizer still
/// at the index it was read at, then `remove` that index. If the object or
/// its finalizer list changed since, the API server refuses the whole patch
/// (422) instead of removing someone else's finalizer. None when `pv` does
/// not carry the finalizer.
pub fn finalizer_removal(pv: &PersistentVolume) -> Option<Patch> {
    let i = pv
        .metadata
        .finalizers
        .as_ref()?
        .iter()
        .position(|f| f == PROVISIONER_FINALIZER)?;
    let at = PointerBuf::from_tokens(["metadata", "finalizers", &i.to_string()]);
    let mut ops = Vec::new();
    if let Some(uid) = &pv.metadata.uid {
        ops.push(PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "uid"]),
            value: Value::String(uid.clone()),
        }));
    }
    ops.push(PatchOperation::Test(TestOperation {
        path: at.clone(),
        value: Value::String(PROVISIONER_FINALIZER.to_owned()),
    }));
    ops.push(PatchOperation::Remove(RemoveOperation { path: at }));
    Some(Patch(ops))
}

/// Tracks how long nodes have been missing.
#[derive(Debug, Default)]
pub struct MissingNodes {
    since: BTreeMap<String, Instant>,
}

impl MissingNodes {
    /// Updates the record from the nodes that exist now and the nodes PVs are
    /// pinned to; returns the nodes missing for at least `grace`.
    pub fn update(
        &mut self,
        now: Instant,
        existing: &BTreeSet<String>,
        pinned: &BTreeSet<String>,
        grace: Duration,
    ) -> BTreeSet<String> {
        self.since
            .retain(|n, _| !existing.contains(n) && pinned.contains(n));
        for n in pinned {
            if !existing.contains(n) {
                self.since.entry(n.clone()).or_insert(now);
            }
        }
        self.since
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) >= grace)
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// PVs of `driver` pinned to one of the `lost` nodes, sorted by name.
pub fn lost_pvs<'a>(
    pvs: &'a [std::sync::Arc<PersistentVolume>],
    driver: &str,
    lost: &BTreeSet<String>,
) -> Vec<&'a PersistentVolume> {
    let mut out: Vec<&PersistentVolume> = pvs
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| pinned_node(p, driver).is_some_and(|n| lost.contains(n)))
        .collect();
    out.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    out
}

/// Whether annotations opt in to deleting the claim on node loss.
pub fn opted_in(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations
        .and_then(|a| a.get(ANN_DELETE_ON_NODE_LOSS))
        .is_some_and(|v| v == "true")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TOPOLOGY_KEY;
    use serde_json::json;
    use std::sync::Arc;

    pub(crate) fn pv(name: &str, driver: &str, node: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}")},
            "spec": {
                "csi": {"driver": driver, "volumeHandle": "default.0123"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": TOPOLOGY_KEY, "operator": "In", "values": [node]}
                ]}]}},
                "claimRef": {"namespace": "app", "name": format!("claim-{name}")},
            }
        }))
        .unwrap()
    }

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn nodes_are_lost_only_after_the_grace_period() {
        let grace = Duration::from_secs(300);
        let t0 = Instant::now();
        let mut m = MissingNodes::default();
        let pinned = set(&["n1", "n2"]);
        // n2 exists (Ready or not, it exists): never lost.
        assert!(m.update(t0, &set(&["n2"]), &pinned, grace).is_empty());
        assert!(m
            .update(t0 + Duration::from_secs(299), &set(&["n2"]), &pinned, grace)
            .is_empty());
        assert_eq!(
            m.update(t0 + grace, &set(&["n2"]), &pinned, grace),
            set(&["n1"])
        );
        // n1 comes back: forgotten; missing again starts a new grace period.
        assert!(m
            .update(t0 + grace * 2, &set(&["n1", "n2"]), &pinned, grace)
            .is_empty());
        assert!(m
            .update(t0 + grace * 3, &set(&["n2"]), &pinned, grace)
            .is_empty());
        assert_eq!(
            m.update(t0 + grace * 4, &set(&["n2"]), &pinned, grace),
            set(&["n1"])
        );
    }

    #[test]
    fn finalizer_removal_tests_then_removes_only_the_provisioners() {
        let d = "localvol.csi.dev";
        assert!(finalizer_removal(&pv("a", d, "n1")).is_none());
        let mut p = pv("a", d, "n1");
        p.metadata.finalizers = Some(vec![
            "kubernetes.io/pv-protection".into(),
            PROVISIONER_FINALIZER.into(),
        ]);
        let patch = finalizer_removal(&p).unwrap();
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/uid", "value": "uid-a"},
                {"op": "test", "path": "/metadata/finalizers/1", "value": PROVISIONER_FINALIZER},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ])
        );
        // Applied to the PV as read: only that finalizer goes.
        let mut doc = serde_json::to_value(&p).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(
            doc["metadata"]["finalizers"],
            json!(["kubernetes.io/pv-protection"])
        );
        // The list changed since it was read, or the name is another PV now:
        // the patch fails as a whole and removes nothing.
        for (path, value) in [
            (
                "/metadata/finalizers",
                json!([PROVISIONER_FINALIZER, "x/y"]),
            ),
            ("/metadata/uid", json!("uid-new")),
        ] {
            let mut doc = serde_json::to_value(&p).unwrap();
            *doc.pointer_mut(path).unwrap() = value;
            let before = doc.clone();
            assert!(json_patch::patch(&mut doc, &patch).is_err(), "{path}");
            assert_eq!(doc, before, "{path}");
        }
    }

    #[test]
    fn lost_pvs_are_ours_on_lost_nodes() {
        let d = "localvol.csi.dev";
        let pvs = vec![
            Arc::new(pv("a", d, "n1")),
            Arc::new(pv("b", d, "n2")),
            Arc::new(pv("c", "other.csi.dev", "n1")),
        ];
        let names: Vec<_> = lost_pvs(&pvs, d, &set(&["n1"]))
            .into_iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a"]);
        assert!(opted_in(Some(&BTreeMap::from([(
            ANN_DELETE_ON_NODE_LOSS.to_owned(),
            "true".to_owned()
        )]))));
        assert!(!opted_in(Some(&BTreeMap::from([(
            ANN_DELETE_ON_NODE_LOSS.to_owned(),
            "yes".to_owned()
        )]))));
        assert!(!opted_in(None));
    }
}
