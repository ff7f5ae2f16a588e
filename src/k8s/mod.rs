//! The Kubernetes side shared by static discovery, orphan reports and the
//! node-loss controller: the in-cluster client and Events. (`discovery/` and
//! `controller/` hold what each does with them.)

#[cfg(test)]
pub mod fake;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource};

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
