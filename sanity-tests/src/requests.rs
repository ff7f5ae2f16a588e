//! Builders of CSI requests and capabilities as the tests mostly send them,
//! and the capability lists of the Get*Capabilities answers.

use std::collections::HashMap;
use std::path::Path;

use localvol::csi;
use localvol::csi::volume_capability::access_mode::Mode;

use crate::TOPOLOGY_KEY;

pub fn mount_cap(mode: Mode) -> csi::VolumeCapability {
    mount_cap_flags(mode, &[])
}

pub fn mount_cap_flags(mode: Mode, flags: &[&str]) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: String::new(),
                mount_flags: flags.iter().map(|s| s.to_string()).collect(),
                volume_mount_group: String::new(),
            },
        )),
    }
}

/// A raw block capability, single-node writer: what the LVM tests mostly ask for.
pub fn blk() -> csi::VolumeCapability {
    block_cap(Mode::SingleNodeWriter)
}

pub fn block_cap(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
    }
}

/// A mount capability with a raw (possibly invalid) access mode number.
pub fn mount_cap_raw_mode(mode: i32) -> csi::VolumeCapability {
    let mut c = mount_cap(Mode::SingleNodeWriter);
    c.access_mode = Some(csi::volume_capability::AccessMode { mode });
    c
}

pub fn range(required: i64, limit: i64) -> csi::CapacityRange {
    csi::CapacityRange {
        required_bytes: required,
        limit_bytes: limit,
    }
}

/// A topology segment naming `node`.
pub fn topology(node: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([(TOPOLOGY_KEY.to_owned(), node.to_owned())]),
    }
}

pub fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// CreateVolume for a SINGLE_NODE_WRITER mount volume without a capacity range.
pub fn create_req(name: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.to_owned(),
        volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
        ..Default::default()
    }
}

pub fn delete_req(volume_id: &str) -> csi::DeleteVolumeRequest {
    csi::DeleteVolumeRequest {
        volume_id: volume_id.to_owned(),
        ..Default::default()
    }
}

pub fn stage_req(volume_id: &str, staging: &Path) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume_id.to_owned(),
        staging_target_path: path_str(staging),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

pub fn unstage_req(volume_id: &str, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: volume_id.to_owned(),
        staging_target_path: path_str(staging),
    }
}

pub fn publish_req(
    volume_id: &str,
    staging: &Path,
    target: &Path,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        staging_target_path: path_str(staging),
        target_path: path_str(target),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        readonly,
        ..Default::default()
    }
}

/// NodePublishVolume of a CSI ephemeral inline volume as kubelet sends it
/// (CSIDriver `podInfoOnMount: true`): no staging path, the pod's
/// information and `csi.storage.k8s.io/ephemeral: "true"` in the volume
/// context beside the pod's `volumeAttributes` (`attrs`).
pub fn ephemeral_publish_req(
    volume_id: &str,
    target: &Path,
    attrs: &[(&str, &str)],
) -> csi::NodePublishVolumeRequest {
    let mut ctx = params(&[
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("csi.storage.k8s.io/pod.name", "scratch-pod"),
        ("csi.storage.k8s.io/pod.namespace", "default"),
        (
            "csi.storage.k8s.io/pod.uid",
            "0b4c5c4e-8f4f-4d0e-9d52-3a3c1c8f0001",
        ),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
    ]);
    ctx.extend(params(attrs));
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: path_str(target),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        volume_context: ctx,
        ..Default::default()
    }
}

/// A volume handle of the form kubelet gives ephemeral inline volumes
/// (`csi-` and 64 hex digits of a hash of the pod and the volume's name).
pub fn ephemeral_handle(n: u8) -> String {
    format!("csi-{}", format!("{n:02x}").repeat(32))
}

pub fn unpublish_req(volume_id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: path_str(target),
    }
}

pub fn stats_req(volume_id: &str, path: &Path) -> csi::NodeGetVolumeStatsRequest {
    csi::NodeGetVolumeStatsRequest {
        volume_id: volume_id.to_owned(),
        volume_path: path_str(path),
        staging_target_path: String::new(),
    }
}

pub fn path_str(p: &Path) -> String {
    p.to_str().expect("test paths are UTF-8").to_owned()
}

pub fn controller_caps(r: &csi::ControllerGetCapabilitiesResponse) -> Vec<i32> {
    use csi::controller_service_capability::Type;
    r.capabilities
        .iter()
        .filter_map(|c| c.r#type.map(|Type::Rpc(rpc)| rpc.r#type))
        .collect()
}

pub fn node_caps(r: &csi::NodeGetCapabilitiesResponse) -> Vec<i32> {
    use csi::node_service_capability::Type;
    r.capabilities
        .iter()
        .filter_map(|c| c.r#type.map(|Type::Rpc(rpc)| rpc.r#type))
        .collect()
}
