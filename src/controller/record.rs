//! Writes the lost record (`k8s::lost`) of a node whose PVs the controller
//! is about to delete: the controller's only write outside PVs, PVCs and
//! CSIStorageCapacities, in its own namespace.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::json;

use crate::ids::StorageId;
use crate::k8s::lost::{record_name, LostRecord, RECORD_LABEL};

/// Adds `volumes` to `node`'s lost record (creating it), before their PVs
/// are deleted; true when it wrote something. Nothing is ever removed from a
/// record. A conflict (someone changed it meanwhile) is an error: the caller
/// deletes nothing this pass.
pub async fn record(
    client: &Client,
    namespace: &str,
    driver: &str,
    node: &str,
    volumes: &[(String, Option<StorageId>)],
) -> Result<bool, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let name = record_name(node);
    let existing = api.get_opt(&name).await?;
    let mut rec = existing
        .as_ref()
        .map(LostRecord::from_configmap)
        .unwrap_or_default();
    rec.node = node.to_owned();
    let before = rec.volumes.len();
    for (h, id) in volumes {
        // A handle already recorded keeps what was first recorded.
        rec.volumes.entry(h.clone()).or_insert_with(|| id.clone());
    }
    match existing {
        Some(_) if rec.volumes.len() == before => Ok(false),
        Some(mut cm) => {
            cm.data = Some(rec.data(driver));
            api.replace(&name, &PostParams::default(), &cm).await?;
            Ok(true)
        }
        None => {
            let cm: ConfigMap = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {RECORD_LABEL: "true"}},
                "data": rec.data(driver),
            }))
            .expect("a ConfigMap");
            api.create(&PostParams::default(), &cm).await?;
            Ok(true)
        }
    }
}
