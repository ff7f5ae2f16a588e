//! `localvol controller`: the cluster-wide node-loss controller, a
//! Deployment with leader election on a coordination Lease.
//!
//! When a Node object is deleted and stays gone for the grace period, the PVs
//! this driver pinned to it (static and dynamic) are deleted, and the PVCs
//! bound to them too when the PVC or its StorageClass carries the annotation
//! [`nodeloss::ANN_DELETE_ON_NODE_LOSS`]`: "true"`, so StatefulSet pods can be
//! rescheduled elsewhere. CSIStorageCapacity objects of the lost node are
//! removed. A node that merely is NotReady still exists and is never acted on.
//! Every action is logged and recorded as an Event on the PV.
//!
//! A deleted PV that still carries external-provisioner's finalizer
//! ([`nodeloss::PROVISIONER_FINALIZER`]) would stay Terminating forever: only
//! the provisioner of the lost node would have taken it off. So the controller
//! takes it off those PVs, and only those (this driver's, on a lost node),
//! with a test-and-remove JSON patch; a patch refused because the PV changed
//! meanwhile is retried on the next pass, from what the API then returns.
//!
//! Nodes and PVs come from kube-runtime reflectors (with backoff); a pass
//! reads the caches, and talks to the API only to act.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::sync::Mutex;

use crate::ids::{StorageId, STORAGE_ID_KEY, TOPOLOGY_KEY};
use crate::k8s::lost;

pub mod lease;
pub mod nodeloss;
mod record;

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub deleted_pvs: Vec<String>,
    /// PVs whose provisioner finalizer was taken off.
    pub released_finalizers: Vec<String>,
    pub deleted_pvcs: Vec<String>,
    pub deleted_capacities: Vec<String>,
    /// Nodes whose lost record (`k8s::lost`) this pass added volumes to.
    pub recorded_nodes: Vec<String>,
}

pub struct NodeLoss {
    client: Client,
    driver: String,
    /// Where the lost records live (the controller's namespace).
    namespace: String,
    grace: Duration,
    recorder: Recorder,
    missing: Mutex<nodeloss::MissingNodes>,
    held: Mutex<nodeloss::HeldPvs>,
}

impl NodeLoss {
    pub fn new(
        client: Client,
        driver: &str,
        identity: &str,
        namespace: &str,
        grace: Duration,
    ) -> Self {
        let reporter = Reporter {
            controller: "localvol-controller".into(),
            instance: Some(identity.to_owned()),
        };
        NodeLoss {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            driver: driver.to_owned(),
            namespace: namespace.to_owned(),
            grace,
            missing: Mutex::default(),
            held: Mutex::default(),
        }
    }

    async fn event(&self, pv: &PersistentVolume, type_: EventType, reason: &str, note: String) {
        crate::k8s::publish_event(&self.recorder, pv, type_, reason, note).await;
    }

    /// One pass at `now` over the caches of Nodes and PVs.
    pub async fn pass(
        &self,
        now: Instant,
        nodes: &Store<Node>,
        pvs: &Store<PersistentVolume>,
    ) -> Result<PassReport, ControllerError> {
        let mut report = PassReport::default();
        let existing: BTreeSet<String> = nodes
            .state()
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        let all_pvs = pvs.state();
        let pinned: BTreeSet<String> = all_pvs
            .iter()
            .filter_map(|p| crate::k8s::pinned_node(p, &self.driver).map(str::to_owned))
            .collect();
        let lost = self
            .missing
            .lock()
            .await
            .update(now, &existing, &pinned, self.grace);
        let doomed = nodeloss::lost_pvs(&all_pvs, &self.driver, &lost);
        let recorded = self.record_lost(&doomed, &mut report).await;
        for pv in doomed {
            if !crate::k8s::pinned_node(pv, &self.driver).is_some_and(|n| recorded.contains(n)) {
                continue;
            }
            match self.held.lock().await.check(pv, now) {
                nodeloss::HeldCheck::Wait => continue,
                nodeloss::HeldCheck::FirstSeen => tracing::info!(
                    pv = pv.metadata.name.as_deref().unwrap_or_default(),
                    "node lost: PV Terminating, held by kubernetes.io/pv-protection while its claim \
                     is bound; left alone (looked at again with back-off) until the claim goes"
                ),
                nodeloss::HeldCheck::Act => {}
            }
            self.delete_lost_pv(pv, &mut report).await?;
        }
        if !lost.is_empty() {
            self.delete_capacities(&lost, &mut report).await?;
        }
        Ok(report)
    }

    /// Writes each lost node's record (`k8s::lost`) of the PVs about to be
    /// deleted, before any is; returns the nodes whose record holds them
    /// all. A node whose record could not be written keeps its PVs this
    /// pass (logged): a returning node must never find volumes whose PV was
    /// deleted without a record of it.
    async fn record_lost(
        &self,
        doomed: &[&PersistentVolume],
        report: &mut PassReport,
    ) -> BTreeSet<String> {
        let mut by_node: BTreeMap<&str, Vec<(String, Option<StorageId>)>> = BTreeMap::new();
        for pv in doomed {
            let (Some(node), Some(csi)) = (
                crate::k8s::pinned_node(pv, &self.driver),
                pv.spec.as_ref().and_then(|s| s.csi.as_ref()),
            ) else {
                continue;
            };
            let id = csi
                .volume_attributes
                .as_ref()
                .and_then(|a| a.get(STORAGE_ID_KEY))
                .and_then(|s| StorageId::parse(s).ok());
            by_node
                .entry(node)
                .or_default()
                .push((csi.volume_handle.clone(), id));
        }
        let mut ok = BTreeSet::new();
        for (node, volumes) in by_node {
            match record::record(&self.client, &self.namespace, &self.driver, node, &volumes).await
            {
                Ok(changed) => {
                    if changed {
                        tracing::info!(%node, volumes = volumes.len(),
                            record = %format!("{}/{}", self.namespace, lost::record_name(node)),
                            "node lost: volumes recorded before their PVs are deleted");
                        report.recorded_nodes.push(node.to_owned());
                    }
                    ok.insert(node.to_owned());
                }
                Err(e) => tracing::warn!(%node, error = %e,
                    "node lost: could not write its lost record; its PVs are kept this pass"),
            }
        }
        ok
    }

    async fn delete_lost_pv(
        &self,
        pv: &PersistentVolume,
        report: &mut PassReport,
    ) -> Result<(), ControllerError> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let node = crate::k8s::pinned_node(pv, &self.driver).unwrap_or_default();
        self.delete_claim_if_opted_in(pv, &name, node, report)
            .await?;
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        if pv.metadata.deletion_timestamp.is_some() {
            // Deleted on an earlier pass and still held: by
            // `kubernetes.io/pv-protection` while its claim is bound, or by
            // the provisioner's finalizer, which is ours to take off. A
            // second DELETE changes nothing and would repeat the Event.
            return self.release_finalizer(&api, pv, node, report).await;
        }
        self.event(
            pv,
            EventType::Warning,
            "NodeLost",
            format!(
                "node {node} was deleted more than {}s ago; deleting the PV (recorded in ConfigMap {}/{})",
                self.grace.as_secs(),
                self.namespace,
                lost::record_name(node)
            ),
        )
        .await;
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: pv.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &dp).await {
            Ok(res) => {
                tracing::info!(pv = %name, %node, "node lost: PV deleted");
                report.deleted_pvs.push(name);
                // The PV as the API server has it now: still there (Terminating)
                // while finalizers hold it, else gone (a Status).
                match res.left() {
                    Some(current) => self.release_finalizer(&api, &current, node, report).await,
                    None => Ok(()),
                }
            }
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the claim bound to a lost node's PV `name` when it (or its
    /// StorageClass) opted in to deletion on node loss.
    async fn delete_claim_if_opted_in(
        &self,
        pv: &PersistentVolume,
        name: &str,
        node: &str,
        report: &mut PassReport,
    ) -> Result<(), ControllerError> {
        let Some(c) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
            return Ok(());
        };
        let (Some(ns), Some(cn)) = (&c.namespace, &c.name) else {
            return Ok(());
        };
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        let Some(pvc) = pvcs.get_opt(cn).await? else {
            return Ok(());
        };
        // Only the claim bound to this very PV.
        let bound_here = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(name)
            && (c.uid.is_none() || pvc.metadata.uid == c.uid);
        if !bound_here || !self.claim_opted_in(&pvc).await? {
            return Ok(());
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: pvc.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match pvcs.delete(cn, &dp).await {
            Ok(_) => {
                tracing::info!(pvc = %format!("{ns}/{cn}"), %node, "node lost: PVC deleted");
                self.event(
                    pv,
                    EventType::Normal,
                    "NodeLostClaimDeleted",
                    format!("node {node} is gone; deleted claim {ns}/{cn}"),
                )
                .await;
                report.deleted_pvcs.push(format!("{ns}/{cn}"));
            }
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Takes external-provisioner's finalizer off a lost node's PV (see
    /// [`nodeloss::finalizer_removal`]). A PV gone (404), changed (409) or
    /// whose finalizers moved (422, the patch's `test` failed) is left to the
    /// next pass, which deletes it again and patches what that returns.
    async fn release_finalizer(
        &self,
        api: &Api<PersistentVolume>,
        pv: &PersistentVolume,
        node: &str,
        report: &mut PassReport,
    ) -> Result<(), ControllerError> {
        let Some(patch) = nodeloss::finalizer_removal(pv) else {
            return Ok(());
        };
        let name = pv.metadata.name.clone().unwrap_or_default();
        let patch: Patch<()> = Patch::Json(patch);
        match api.patch(&name, &PatchParams::default(), &patch).await {
            Ok(_) => {
                tracing::info!(pv = %name, %node, finalizer = nodeloss::PROVISIONER_FINALIZER,
                    "node lost: provisioner finalizer removed");
                report.released_finalizers.push(name);
                Ok(())
            }
            Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => {
                tracing::info!(pv = %name, %node, reason = %s.message,
                    "node lost: PV changed before its finalizer was removed; retrying next pass");
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The PVC's annotation, else its StorageClass's.
    async fn claim_opted_in(&self, pvc: &PersistentVolumeClaim) -> Result<bool, ControllerError> {
        if nodeloss::opted_in(pvc.metadata.annotations.as_ref()) {
            return Ok(true);
        }
        let Some(sc) = pvc
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref())
        else {
            return Ok(false);
        };
        let scs: Api<StorageClass> = Api::all(self.client.clone());
        Ok(scs
            .get_opt(sc)
            .await?
            .is_some_and(|s| nodeloss::opted_in(s.metadata.annotations.as_ref())))
    }

    /// CSIStorageCapacity objects of this driver's topology for lost nodes.
    async fn delete_capacities(
        &self,
        lost: &BTreeSet<String>,
        report: &mut PassReport,
    ) -> Result<(), ControllerError> {
        let all: Api<CSIStorageCapacity> = Api::all(self.client.clone());
        for c in all.list(&ListParams::default()).await? {
            let node = c
                .node_topology
                .as_ref()
                .and_then(|t| t.match_labels.as_ref())
                .and_then(|l| l.get(TOPOLOGY_KEY));
            let (Some(node), Some(ns), Some(name)) =
                (node, &c.metadata.namespace, &c.metadata.name)
            else {
                continue;
            };
            if !lost.contains(node) {
                continue;
            }
            let api: Api<CSIStorageCapacity> = Api::namespaced(self.client.clone(), ns);
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::info!(capacity = %format!("{ns}/{name}"), %node, "node lost: CSIStorageCapacity deleted");
                    report.deleted_capacities.push(format!("{ns}/{name}"));
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// Options of `localvol controller`.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    pub driver_name: String,
    /// This replica's identity in the Lease (the pod name).
    pub identity: String,
    pub lease_namespace: String,
    pub lease_name: String,
    pub lease_duration: Duration,
    /// How long a Node must stay deleted before its PVs are deleted.
    pub grace: Duration,
    /// How often a pass runs while leading.
    pub interval: Duration,
}

/// Runs the controller until the process ends.
pub async fn run(client: Client, opts: ControllerOptions) -> Result<(), String> {
    let (nodes, nw) = reflector::store::<Node>();
    let (pvs, pw) = reflector::store::<PersistentVolume>();
    let node_stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(nw);
    let pv_stream = watcher(
        Api::<PersistentVolume>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(pw);
    tokio::spawn(async move {
        let mut s = std::pin::pin!(node_stream);
        while let Some(e) = s.next().await {
            if let Err(e) = e {
                tracing::warn!(error = %e, "Node watch failed; retrying");
            }
        }
    });
    tokio::spawn(async move {
        let mut s = std::pin::pin!(pv_stream);
        while let Some(e) = s.next().await {
            if let Err(e) = e {
                tracing::warn!(error = %e, "PV watch failed; retrying");
            }
        }
    });
    let elector = lease::Elector::new(
        client.clone(),
        &opts.lease_namespace,
        &opts.lease_name,
        &opts.identity,
        opts.lease_duration,
    );
    let nl = Arc::new(NodeLoss::new(
        client,
        &opts.driver_name,
        &opts.identity,
        &opts.lease_namespace,
        opts.grace,
    ));
    nodes
        .wait_until_ready()
        .await
        .map_err(|e| format!("node cache: {e}"))?;
    pvs.wait_until_ready()
        .await
        .map_err(|e| format!("PV cache: {e}"))?;
    let mut tick = tokio::time::interval(opts.interval.min(opts.lease_duration / 3));
    let mut leading = false;
    loop {
        tick.tick().await;
        let now_leading = match elector.try_acquire_or_renew().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "lease");
                false
            }
        };
        if now_leading != leading {
            tracing::info!(leading = now_leading, identity = %opts.identity, "leadership changed");
            leading = now_leading;
        }
        if leading {
            match nl.pass(Instant::now(), &nodes, &pvs).await {
                Ok(r) if r != PassReport::default() => {
                    tracing::info!(report = ?r, "node-loss pass")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "node-loss pass failed"),
            }
        }
    }
}

#[cfg(test)]
mod replace_tests;
#[cfg(test)]
mod tests;
