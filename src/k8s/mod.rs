//! The Kubernetes side shared by static discovery, orphan reports, the
//! node-loss controller and ControllerExpandVolume: the in-cluster client,
//! Events, the node a PV is pinned to, and what the cluster knows of a node's
//! free space ([`room`]). (`discovery/` and `controller/` hold what each does
//! with them.)

#[cfg(any(test, feature = "fake-api"))]
pub mod fake;
pub mod lost;
pub mod room;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource};

use crate::ids::TOPOLOGY_KEY;

/// The client `localvol serve` uses: in-cluster config only, so a developer's
/// kubeconfig never makes a test driver create PVs in some cluster.
pub async fn in_cluster_client() -> Result<Client, String> {
    let cfg = kube::Config::incluster().map_err(|e| format!("no in-cluster config: {e}"))?;
    Client::try_from(cfg).map_err(|e| format!("kubernetes client: {e}"))
}

/// Records an Event about a PV; a failure to record is logged, never fatal.
pub async fn publish_event(
    recorder: &Recorder,
    pv: &PersistentVolume,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &pv.object_ref(&())).await {
        tracing::warn!(error = %e, reason, "could not record an event");
    }
}

/// Records an Event about this node's Node object; a failure to record is
/// logged, never fatal.
pub async fn publish_node_event(
    recorder: &Recorder,
    node: &str,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    let node_ref = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_owned()),
        ..Default::default()
    };
    if let Err(e) = recorder.publish(&ev, &node_ref).await {
        tracing::warn!(error = %e, reason, "could not record an event");
    }
}

/// The node a PV of `driver` is pinned to by its node affinity on the
/// topology key (`In` exactly one node); None for anything else.
pub fn pinned_node<'a>(pv: &'a PersistentVolume, driver: &str) -> Option<&'a str> {
    let spec = pv.spec.as_ref()?;
    if spec.csi.as_ref()?.driver != driver {
        return None;
    }
    let terms = &spec
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    let [term] = terms.as_slice() else {
        return None;
    };
    let exprs = term.match_expressions.as_ref()?;
    let mut nodes = exprs.iter().filter(|e| e.key == TOPOLOGY_KEY);
    let e = nodes.next()?;
    if nodes.next().is_some() || e.operator != "In" {
        return None;
    }
    match e.values.as_deref()? {
        [n] => Some(n.as_str()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSelectorRequirement;
    use serde_json::json;

    fn pv(name: &str, driver: &str, node: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "csi": {"driver": driver, "volumeHandle": "default.0123"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": TOPOLOGY_KEY, "operator": "In", "values": [node]}
                ]}]}},
            }
        }))
        .unwrap()
    }

    #[test]
    fn pinned_node_needs_our_driver_and_one_node() {
        let d = "localvol.csi.dev";
        assert_eq!(pinned_node(&pv("a", d, "n1"), d), Some("n1"));
        assert_eq!(pinned_node(&pv("a", "other.csi.dev", "n1"), d), None);
        // The PV's one node-affinity expression, changed in place.
        let with_expr = |change: fn(&mut NodeSelectorRequirement)| {
            let mut p = pv("a", d, "n1");
            let affinity = p.spec.as_mut().unwrap().node_affinity.as_mut().unwrap();
            let term = &mut affinity.required.as_mut().unwrap().node_selector_terms[0];
            change(&mut term.match_expressions.as_mut().unwrap()[0]);
            p
        };
        let two = with_expr(|e| e.values = Some(vec!["n1".into(), "n2".into()]));
        assert_eq!(pinned_node(&two, d), None);
        let notin = with_expr(|e| e.operator = "NotIn".into());
        assert_eq!(pinned_node(&notin, d), None);
    }
}
