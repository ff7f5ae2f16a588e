//! The owning node's half of ControllerModifyVolume.
//!
//! external-resizer runs once per cluster and calls the driver on its own
//! node; a volume of another node is only checked there
//! (`service/controller`). Once the call succeeds, external-resizer points
//! the PV at the new VolumeAttributesClass (`spec.volumeAttributesClassName`).
//! Every node watches the PVs and, for those pinned to it, applies the
//! class's parameters to its volume as ControllerModifyVolume would: the
//! limits are recorded on the volume and written for the pods that have it
//! published. The watch's first listing after a start applies every class
//! again, so the node converges after a restart of either side (also when
//! it stopped between recording limits and writing them). Needs: list and
//! watch PersistentVolumes, get VolumeAttributesClasses.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};

use crate::driver::Driver;
use crate::iolimit::IoChange;

/// How long a class's parameters are taken as read (they are immutable;
/// a class deleted and made again under the same name is seen after this).
const CLASS_TTL: Duration = Duration::from_secs(60);
/// How soon a PV whose class could not be applied is tried again.
const RETRY: Duration = Duration::from_secs(15);

/// A PV of this node that names a class: its volume handle and the class.
fn wanted<'a>(pv: &'a PersistentVolume, driver: &Driver) -> Option<(&'a str, &'a str)> {
    if crate::k8s::pinned_node(pv, &driver.name)? != driver.node_id {
        return None;
    }
    let spec = pv.spec.as_ref()?;
    Some((
        spec.csi.as_ref()?.volume_handle.as_str(),
        spec.volume_attributes_class_name.as_deref()?,
    ))
}

struct Classes {
    api: Api<VolumeAttributesClass>,
    cache: HashMap<String, (Instant, HashMap<String, String>)>,
}

impl Classes {
    /// The parameters of class `name` (None: there is no such class, or it
    /// is another driver's).
    async fn parameters(
        &mut self,
        name: &str,
        driver: &str,
    ) -> Result<Option<HashMap<String, String>>, kube::Error> {
        if let Some((at, p)) = self.cache.get(name) {
            if at.elapsed() < CLASS_TTL {
                return Ok(Some(p.clone()));
            }
        }
        let Some(class) = self.api.get_opt(name).await? else {
            return Ok(None);
        };
        if class.driver_name != driver {
            return Ok(None);
        }
        let p: HashMap<String, String> = class.parameters.unwrap_or_default().into_iter().collect();
        self.cache
            .insert(name.to_owned(), (Instant::now(), p.clone()));
        Ok(Some(p))
    }
}

/// Applies the class PV `pv` names to its volume on this node. `Err`: try
/// again later.
async fn converge(
    driver: &Driver,
    classes: &mut Classes,
    pv: &PersistentVolume,
    initial: bool,
) -> Result<(), String> {
    let Some((handle, class)) = wanted(pv, driver) else {
        return Ok(());
    };
    let params = match classes.parameters(class, &driver.name).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            tracing::warn!(pv = ?pv.metadata.name, %class,
                "the PV's VolumeAttributesClass does not exist or is another driver's; not applied");
            return Ok(());
        }
        Err(e) => return Err(format!("reading VolumeAttributesClass {class}: {e}")),
    };
    let change = match IoChange::parse(&params) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%class, error = %e, "VolumeAttributesClass not applied");
            return Ok(());
        }
    };
    let found = driver
        .find("volume handle", handle)
        .await
        .map_err(|e| e.to_string())?;
    let Some((id, pool, vol)) = found else {
        return Ok(());
    };
    if !pool.limits_io() {
        return Ok(());
    }
    let limits = change.apply_to(vol.io_limits);
    // Unchanged: nothing to do, except after a start, when the limits are
    // written again (a stop between the tag and io.max).
    if limits == vol.io_limits && (!initial || limits.is_unlimited()) {
        return Ok(());
    }
    let _guard = driver.lock_volume(&id).map_err(|e| e.to_string())?;
    if limits != vol.io_limits {
        pool.set_io_limits(&id, limits)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(volume = %id, %class, %limits, "IO limits of the PV's VolumeAttributesClass recorded");
    }
    let src = pool.source(&vol).map_err(|e| e.to_string())?;
    crate::nodeops::enforce_io_limits(driver.cgroup_paths(), src, &limits, None)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Runs until dropped.
pub async fn run(driver: Arc<Driver>, client: Client) {
    let mut classes = Classes {
        api: Api::all(client.clone()),
        cache: HashMap::new(),
    };
    let stream = watcher(
        Api::<PersistentVolume>::all(client),
        watcher::Config::default(),
    )
    .default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut retry: HashMap<String, PersistentVolume> = HashMap::new();
    let mut tick = tokio::time::interval(RETRY);
    loop {
        tokio::select! {
            ev = stream.next() => {
                let (pv, initial) = match ev {
                    None => return,
                    Some(Ok(Event::Apply(pv))) => (pv, false),
                    Some(Ok(Event::InitApply(pv))) => (pv, true),
                    Some(Ok(Event::Delete(pv))) => {
                        retry.remove(pv.metadata.name.as_deref().unwrap_or_default());
                        continue;
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "PV watch (volume attributes) failed; retrying");
                        continue;
                    }
                };
                let name = pv.metadata.name.clone().unwrap_or_default();
                match converge(&driver, &mut classes, &pv, initial).await {
                    Ok(()) => { retry.remove(&name); }
                    Err(e) => {
                        tracing::warn!(pv = %name, error = %e, "volume attributes not applied yet; retrying");
                        retry.insert(name, pv);
                    }
                }
            }
            _ = tick.tick() => {
                for (name, pv) in std::mem::take(&mut retry) {
                    if let Err(e) = converge(&driver, &mut classes, &pv, true).await {
                        tracing::debug!(pv = %name, error = %e, "volume attributes still not applied");
                        retry.insert(name, pv);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TOPOLOGY_KEY;
    use crate::k8s::fake::{Fake, Role, PVS};
    use serde_json::json;

    /// The node lists and watches the PVs, and reads the class its own PV
    /// names: the attributes role's calls.
    #[tokio::test]
    async fn a_pv_of_this_node_has_its_class_read() {
        let tmp = tempfile::tempdir().unwrap();
        let driver = Driver::open_embedded(tmp.path(), "n1").await;
        let fake = Fake::start(Role::Attributes);
        fake.put_pv(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-a"},
            "spec": {
                "csi": {"driver": "localvol.csi.dev", "volumeHandle": "default.x"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": TOPOLOGY_KEY, "operator": "In", "values": ["n1"]}
                ]}]}},
                "volumeAttributesClassName": "gold",
            },
        }));
        let task = tokio::spawn(run(driver, fake.client.clone()));
        let log = fake
            .wait_for("GET /apis/storage.k8s.io/v1/volumeattributesclasses/gold")
            .await;
        task.abort();
        assert_eq!(log[0], format!("LIST {PVS}"));
    }
}
