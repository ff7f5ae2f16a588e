//! CSI Identity service.

use tonic::{Request, Response, Status};

use super::gate::Opened;
use super::rpc;
use crate::csi;
use crate::csi::plugin_capability::{self, service, volume_expansion};

pub struct IdentityService {
    name: String,
    version: String,
    opened: Opened,
    /// Advertise SNAPSHOT_METADATA_SERVICE: a configured pool keeps block
    /// maps of its snapshots (a thin LVM pool, open or not yet: the
    /// config's `keeps_block_maps`), so the answer does not change when
    /// the pools open.
    snapshot_metadata: bool,
}

impl IdentityService {
    /// Probe says not ready until `opened` is set (`service/gate.rs`).
    pub fn opening(name: String, opened: Opened, snapshot_metadata: bool) -> Self {
        Self {
            name,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            opened,
            snapshot_metadata,
        }
    }
}

#[tonic::async_trait]
impl csi::identity_server::Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _req: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        rpc("GetPluginInfo", "", async {
            Ok(csi::GetPluginInfoResponse {
                name: self.name.clone(),
                vendor_version: self.version.clone(),
                manifest: Default::default(),
            })
        })
        .await
    }

    async fn get_plugin_capabilities(
        &self,
        _req: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        let svc = |t: service::Type| csi::PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service { r#type: t as i32 },
            )),
        };
        rpc("GetPluginCapabilities", "", async {
            let mut capabilities = vec![
                svc(service::Type::ControllerService),
                svc(service::Type::VolumeAccessibilityConstraints),
                csi::PluginCapability {
                    r#type: Some(plugin_capability::Type::VolumeExpansion(
                        plugin_capability::VolumeExpansion {
                            r#type: volume_expansion::Type::Online as i32,
                        },
                    )),
                },
            ];
            if self.snapshot_metadata {
                capabilities.push(svc(service::Type::SnapshotMetadataService));
            }
            Ok(csi::GetPluginCapabilitiesResponse { capabilities })
        })
        .await
    }

    async fn probe(
        &self,
        _req: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        // Ready whenever the driver answers, once its pools are open. A
        // pool that cannot serve is not a reason to restart the plugin (a
        // restart brings no disk back, and every other pool's volumes would
        // lose their plugin meanwhile): it offers no capacity and refuses
        // its own RPCs instead (`monitor.rs`). While the pools open, "not
        // ready" is what the sidecars' start waits on (`service/gate.rs`).
        let ready = self.opened.is_open();
        rpc("Probe", "", async {
            Ok(csi::ProbeResponse { ready: Some(ready) })
        })
        .await
    }
}
