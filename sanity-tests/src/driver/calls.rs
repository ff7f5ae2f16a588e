//! A [`Driver`]'s convenience calls: one CSI call each, panicking on an error.

use std::collections::HashMap;
use std::path::Path;

use localvol::csi;
use localvol::csi::volume_capability::access_mode::Mode;

use super::{retry_busy, Driver};
use crate::{create_req, mount_cap, publish_req, range, stage_req, unpublish_req, unstage_req};

impl Driver {
    /// Creates a mount volume of `bytes` (0: no capacity range) and returns it.
    pub async fn create(&self, name: &str, bytes: i64) -> csi::Volume {
        let mut req = create_req(name);
        if bytes > 0 {
            req.capacity_range = Some(range(bytes, 0));
        }
        self.controller()
            .create_volume(req)
            .await
            .unwrap_or_else(|s| panic!("CreateVolume {name}: {s:?}"))
            .into_inner()
            .volume
            .expect("CreateVolume returned no volume")
    }

    pub async fn stage(&self, volume_id: &str, staging: &Path) {
        self.node()
            .node_stage_volume(stage_req(volume_id, staging))
            .await
            .unwrap_or_else(|s| panic!("NodeStageVolume {volume_id}: {s:?}"));
    }

    /// NodeUnstageVolume (retried while the mount is transiently busy, as
    /// kubelet would: see [`retry_busy`]).
    pub async fn unstage(&self, volume_id: &str, staging: &Path) {
        let req = unstage_req(volume_id, staging);
        retry_busy(|| {
            let (mut n, req) = (self.node(), req.clone());
            async move { n.node_unstage_volume(req).await }
        })
        .await
        .unwrap_or_else(|s| panic!("NodeUnstageVolume {volume_id}: {s:?}"));
    }

    pub async fn publish(&self, volume_id: &str, staging: &Path, target: &Path, readonly: bool) {
        self.node()
            .node_publish_volume(publish_req(volume_id, staging, target, readonly))
            .await
            .unwrap_or_else(|s| panic!("NodePublishVolume {volume_id}: {s:?}"));
    }

    /// NodeUnpublishVolume (retried while the mount is transiently busy).
    pub async fn unpublish(&self, volume_id: &str, target: &Path) {
        let req = unpublish_req(volume_id, target);
        retry_busy(|| {
            let (mut n, req) = (self.node(), req.clone());
            async move { n.node_unpublish_volume(req).await }
        })
        .await
        .unwrap_or_else(|s| panic!("NodeUnpublishVolume {volume_id}: {s:?}"));
    }

    pub async fn delete(&self, volume_id: &str) {
        self.controller()
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: volume_id.to_owned(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("DeleteVolume {volume_id}: {s:?}"));
    }

    /// The ids of every volume ListVolumes returns, in its order.
    pub async fn list_ids(&self) -> Vec<String> {
        self.list_all()
            .await
            .into_iter()
            .map(|v| v.volume_id)
            .collect()
    }

    /// One ListVolumes call: a page of at most `max_entries` from `token`.
    pub async fn list_page(
        &self,
        max_entries: i32,
        token: &str,
    ) -> Result<tonic::Response<csi::ListVolumesResponse>, tonic::Status> {
        self.controller()
            .list_volumes(csi::ListVolumesRequest {
                max_entries,
                starting_token: token.to_owned(),
            })
            .await
    }

    /// Every volume ListVolumes reports (following next_token).
    pub async fn list_all(&self) -> Vec<csi::Volume> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let r = self
                .list_page(0, &token)
                .await
                .unwrap_or_else(|s| panic!("ListVolumes: {s:?}"))
                .into_inner();
            out.extend(r.entries.into_iter().filter_map(|e| e.volume));
            if r.next_token.is_empty() {
                return out;
            }
            token = r.next_token;
        }
    }

    /// GetCapacity of a pool (None: the default pool) for mount access.
    pub async fn capacity(&self, pool: Option<&str>) -> csi::GetCapacityResponse {
        let mut parameters = HashMap::new();
        if let Some(p) = pool {
            parameters.insert("pool".to_owned(), p.to_owned());
        }
        self.controller()
            .get_capacity(csi::GetCapacityRequest {
                volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
                parameters,
                accessible_topology: None,
            })
            .await
            .unwrap_or_else(|s| panic!("GetCapacity: {s:?}"))
            .into_inner()
    }
}
