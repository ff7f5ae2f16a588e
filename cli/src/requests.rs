//! The CSI requests of a volume's lifecycle, built in one place for
//! `localvol client` and every `localvol bench` mode: what a field holds
//! when the command line does not say (no publish context, no secrets but
//! the stage secrets, a staging path only for a driver that stages) is
//! decided here once.

use std::collections::HashMap;

use localvol::csi;

/// What a volume's node requests share: its id, the capability it is used
/// with and the context CreateVolume answered (or the operator gave).
#[derive(Clone, Copy)]
pub struct NodeVolume<'a> {
    pub id: &'a str,
    pub capability: &'a csi::VolumeCapability,
    pub context: &'a HashMap<String, String>,
}

/// CreateVolume of `name`: `range` is (required, limit) bytes, None for no
/// capacity range at all.
pub fn create(
    name: &str,
    range: Option<(i64, i64)>,
    capability: &csi::VolumeCapability,
    parameters: HashMap<String, String>,
    source: Option<csi::VolumeContentSource>,
) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: range.map(|(required_bytes, limit_bytes)| csi::CapacityRange {
            required_bytes,
            limit_bytes,
        }),
        volume_capabilities: vec![capability.clone()],
        parameters,
        volume_content_source: source,
        ..Default::default()
    }
}

/// NodeStageVolume at `staging`, with the stage secrets.
pub fn stage(
    v: NodeVolume,
    staging: &str,
    secrets: HashMap<String, String>,
) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: v.id.to_owned(),
        publish_context: HashMap::new(),
        staging_target_path: staging.to_owned(),
        volume_capability: Some(v.capability.clone()),
        secrets,
        volume_context: v.context.clone(),
    }
}

/// NodePublishVolume at `target`, from `staging` when the volume was staged.
pub fn publish(
    v: NodeVolume,
    staging: Option<&str>,
    target: &str,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: v.id.to_owned(),
        publish_context: HashMap::new(),
        staging_target_path: staging.unwrap_or_default().to_owned(),
        target_path: target.to_owned(),
        volume_capability: Some(v.capability.clone()),
        readonly,
        secrets: HashMap::new(),
        volume_context: v.context.clone(),
    }
}

/// NodeUnpublishVolume of `target`.
pub fn unpublish(volume_id: &str, target: &str) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: target.to_owned(),
    }
}

/// NodeUnstageVolume of `staging`.
pub fn unstage(volume_id: &str, staging: &str) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: volume_id.to_owned(),
        staging_target_path: staging.to_owned(),
    }
}

/// DeleteVolume, without secrets.
pub fn delete(volume_id: &str) -> csi::DeleteVolumeRequest {
    csi::DeleteVolumeRequest {
        volume_id: volume_id.to_owned(),
        secrets: HashMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_requests_carry_the_volume_and_nothing_else() {
        let cap = csi::VolumeCapability::default();
        let context = HashMap::from([("k".to_owned(), "v".to_owned())]);
        let v = NodeVolume {
            id: "vol-1",
            capability: &cap,
            context: &context,
        };
        let secrets = HashMap::from([("key".to_owned(), "s".to_owned())]);
        let s = stage(v, "/st", secrets.clone());
        assert_eq!(
            (s.volume_id.as_str(), s.staging_target_path.as_str()),
            ("vol-1", "/st")
        );
        assert_eq!((s.secrets, s.volume_context), (secrets, context.clone()));
        assert!(s.publish_context.is_empty());
        let p = publish(v, None, "/t", true);
        assert_eq!(p.staging_target_path, "");
        assert!(p.readonly && p.secrets.is_empty());
        assert_eq!(p.volume_context, context);
        assert_eq!(
            publish(v, Some("/st"), "/t", false).staging_target_path,
            "/st"
        );
        let c = create("n", None, &cap, HashMap::new(), None);
        assert!(c.capacity_range.is_none());
        let c = create("n", Some((5, 0)), &cap, HashMap::new(), None);
        assert_eq!(c.capacity_range.map(|r| r.required_bytes), Some(5));
    }
}
