//! `info`, `list` and `stats`: what the driver says about itself, its
//! volumes and one volume's usage, gathered and shaped for printing.

use super::*;

/// What `info` learns from the driver's identity, node and controller services.
pub(super) struct DriverInfo {
    pub(super) plugin: csi::GetPluginInfoResponse,
    pub(super) plugin_caps: Vec<String>,
    /// `None`: the driver does not serve NodeGetInfo.
    pub(super) node_info: Option<csi::NodeGetInfoResponse>,
    /// `None`: no controller service, or ControllerGetCapabilities unimplemented.
    pub(super) controller_caps: Option<Vec<String>>,
    /// `None`: the driver does not serve NodeGetCapabilities.
    pub(super) node_caps: Option<Vec<String>>,
}

/// `info`: asks every service what it is and can do, then prints it.
pub(super) async fn info(c: &Clients) -> Result<Output, ClientError> {
    let info = fetch_info(c).await?;
    Ok(Output {
        json: info_json(&info),
        human: rows(&info_rows(&info)),
    })
}

/// The RPCs behind `info`, in this order: GetPluginInfo,
/// GetPluginCapabilities, NodeGetInfo, NodeGetCapabilities, and
/// ControllerGetCapabilities only when the plugin has a controller service.
pub(super) async fn fetch_info(c: &Clients) -> Result<DriverInfo, ClientError> {
    let t = c.timeout;
    let mut id = c.identity.clone();
    let plugin = call(t, csi::GetPluginInfoRequest {}, |r| id.get_plugin_info(r))
        .await
        .map_err(ClientError::Rpc)?;
    let pcaps = call(t, csi::GetPluginCapabilitiesRequest {}, |r| {
        id.get_plugin_capabilities(r)
    })
    .await
    .map_err(ClientError::Rpc)?;
    let (plugin_caps, has_controller) = plugin_cap_names(&pcaps);

    let mut node = c.node.clone();
    let node_info = optional(call(t, csi::NodeGetInfoRequest {}, |r| node.node_get_info(r)).await)?;
    let node_caps = optional(
        call(t, csi::NodeGetCapabilitiesRequest {}, |r| {
            node.node_get_capabilities(r)
        })
        .await,
    )?
    .map(|r| node_cap_names(&r));
    let controller_caps = if has_controller {
        let mut ctl = c.controller.clone();
        optional(
            call(t, csi::ControllerGetCapabilitiesRequest {}, |r| {
                ctl.controller_get_capabilities(r)
            })
            .await,
        )?
        .map(|r| controller_cap_names(&r))
    } else {
        None
    };
    Ok(DriverInfo {
        plugin,
        plugin_caps,
        node_info,
        controller_caps,
        node_caps,
    })
}

/// The capability names a driver's GetPluginCapabilities lists, and whether
/// one of them is CONTROLLER_SERVICE.
pub(super) fn plugin_cap_names(r: &csi::GetPluginCapabilitiesResponse) -> (Vec<String>, bool) {
    use csi::plugin_capability::{service, volume_expansion, Type as PType};
    let mut has_controller = false;
    let names = r
        .capabilities
        .iter()
        .map(|cap| match &cap.r#type {
            Some(PType::Service(s)) => {
                let name = enum_name(s.r#type, |v| {
                    service::Type::try_from(v).ok().map(|t| t.as_str_name())
                });
                has_controller |= name == "CONTROLLER_SERVICE";
                name
            }
            Some(PType::VolumeExpansion(e)) => format!(
                "VOLUME_EXPANSION_{}",
                enum_name(e.r#type, |v| {
                    volume_expansion::Type::try_from(v)
                        .ok()
                        .map(|t| t.as_str_name())
                })
            ),
            None => "UNKNOWN".to_owned(),
        })
        .collect();
    (names, has_controller)
}

/// `info`'s text form, one labelled row per fact.
pub(super) fn info_rows(info: &DriverInfo) -> Vec<(&'static str, String)> {
    let plugin = &info.plugin;
    let mut lines = vec![
        ("driver", plugin.name.clone()),
        ("version", plugin.vendor_version.clone()),
    ];
    if !plugin.manifest.is_empty() {
        lines.push(("manifest", segments_h(&plugin.manifest)));
    }
    lines.push(("plugin capabilities", list_h(&info.plugin_caps)));
    match &info.node_info {
        Some(n) => {
            lines.push(("node id", n.node_id.clone()));
            lines.push((
                "max volumes per node",
                if n.max_volumes_per_node == 0 {
                    "unlimited".to_owned()
                } else {
                    n.max_volumes_per_node.to_string()
                },
            ));
            if let Some(topo) = &n.accessible_topology {
                lines.push(("node topology", segments_h(&topo.segments)));
            }
        }
        None => lines.push(("node", "not served (UNIMPLEMENTED)".to_owned())),
    }
    lines.push((
        "controller capabilities",
        info.controller_caps
            .as_deref()
            .map_or_else(|| "no controller service".to_owned(), list_h),
    ));
    lines.push((
        "node capabilities",
        info.node_caps
            .as_deref()
            .map_or_else(|| "no node service".to_owned(), list_h),
    ));
    lines
}

/// `info`'s JSON form (fields as in the module docs).
pub(super) fn info_json(info: &DriverInfo) -> Value {
    let node_json = info.node_info.as_ref().map(|n| {
        json!({
            "node_id": n.node_id,
            "max_volumes_per_node": n.max_volumes_per_node,
            "accessible_topology": n.accessible_topology.as_ref().map(|t| segments_json(&t.segments)),
        })
    });
    json!({
        "name": info.plugin.name,
        "vendor_version": info.plugin.vendor_version,
        "manifest": segments_json(&info.plugin.manifest),
        "plugin_capabilities": info.plugin_caps,
        "node": node_json,
        "controller_capabilities": info.controller_caps,
        "node_capabilities": info.node_caps,
    })
}

/// UNIMPLEMENTED means "this driver does not serve that": `None`, not an error.
pub(super) fn optional<T>(r: Result<T, Status>) -> Result<Option<T>, ClientError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(s) if s.code() == Code::Unimplemented => Ok(None),
        Err(s) => Err(ClientError::Rpc(s)),
    }
}

/// The RPC names a driver's NodeGetCapabilities lists.
pub fn node_cap_names(r: &csi::NodeGetCapabilitiesResponse) -> Vec<String> {
    use csi::node_service_capability::{rpc::Type, Type as T};
    r.capabilities
        .iter()
        .map(|c| match &c.r#type {
            Some(T::Rpc(rpc)) => enum_name(rpc.r#type, |v| {
                Type::try_from(v).ok().map(|t| t.as_str_name())
            }),
            None => "UNKNOWN".to_owned(),
        })
        .collect()
}

/// The RPC names a driver's ControllerGetCapabilities lists.
pub fn controller_cap_names(r: &csi::ControllerGetCapabilitiesResponse) -> Vec<String> {
    use csi::controller_service_capability::{rpc::Type, Type as T};
    r.capabilities
        .iter()
        .map(|c| match &c.r#type {
            Some(T::Rpc(rpc)) => enum_name(rpc.r#type, |v| {
                Type::try_from(v).ok().map(|t| t.as_str_name())
            }),
            None => "UNKNOWN".to_owned(),
        })
        .collect()
}

/// A proto enum's name, or `UNKNOWN(n)` for a value this client does not know.
pub(super) fn enum_name(v: i32, name: impl FnOnce(i32) -> Option<&'static str>) -> String {
    name(v).map_or_else(|| format!("UNKNOWN({v})"), str::to_owned)
}

pub(super) async fn list(
    c: &Clients,
    max_entries: i32,
    starting_token: &str,
    all: bool,
) -> Result<Output, ClientError> {
    let mut ctl = c.controller.clone();
    let mut token = starting_token.to_owned();
    let mut seen = HashSet::new();
    let mut entries = Vec::new();
    let next = loop {
        let req = csi::ListVolumesRequest {
            max_entries,
            starting_token: token.clone(),
        };
        let r = call(c.timeout, req, |r| ctl.list_volumes(r))
            .await
            .map_err(ClientError::Rpc)?;
        entries.extend(r.entries);
        if !all || r.next_token.is_empty() {
            break r.next_token;
        }
        if !seen.insert(r.next_token.clone()) {
            return Err(ClientError::Rpc(Status::internal(format!(
                "the driver returned next_token {:?} twice; stopping",
                r.next_token
            ))));
        }
        token = r.next_token;
    };
    let json_entries: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = e.volume.as_ref().map_or_else(|| json!({}), volume_json);
            v["published_node_ids"] = json!(e.status.as_ref().map(|s| &s.published_node_ids));
            if let Some(cond) = e.status.as_ref().and_then(|s| s.volume_condition.as_ref()) {
                v["volume_condition"] =
                    json!({ "abnormal": cond.abnormal, "message": cond.message });
            }
            v
        })
        .collect();
    let mut table = vec![vec![
        "VOLUME_ID".to_owned(),
        "CAPACITY".to_owned(),
        "TOPOLOGY".to_owned(),
        "PUBLISHED_ON".to_owned(),
    ]];
    for e in &entries {
        let Some(v) = &e.volume else { continue };
        table.push(vec![
            v.volume_id.clone(),
            bytes_h(v.capacity_bytes),
            topologies_h(&v.accessible_topology),
            e.status
                .as_ref()
                .map_or_else(|| "-".to_owned(), |s| list_h(&s.published_node_ids)),
        ]);
    }
    let mut human = columns(&table);
    human.push_str(&format!("{} volume(s)\n", entries.len()));
    if !next.is_empty() {
        human.push_str(&format!("next token: {next}\n"));
    }
    Ok(Output {
        json: json!({ "entries": json_entries, "next_token": next }),
        human,
    })
}

pub(super) fn stats_output(
    volume_id: &str,
    path: &str,
    r: &csi::NodeGetVolumeStatsResponse,
) -> Output {
    use csi::volume_usage::Unit;
    let mut lines = vec![
        ("volume_id", volume_id.to_owned()),
        ("path", path.to_owned()),
    ];
    let mut usage = Vec::new();
    for u in &r.usage {
        let unit = Unit::try_from(u.unit).unwrap_or(Unit::Unknown);
        let fmt = |n: i64| match unit {
            Unit::Bytes => bytes_h(n),
            _ => n.to_string(),
        };
        let label = match unit {
            Unit::Bytes => "bytes",
            Unit::Inodes => "inodes",
            Unit::Unknown => "unknown unit",
        };
        lines.push((
            label,
            format!(
                "{} used of {}, {} available",
                fmt(u.used),
                fmt(u.total),
                fmt(u.available)
            ),
        ));
        usage.push(json!({
            "unit": enum_name(u.unit, |v| Unit::try_from(v).ok().map(|t| t.as_str_name())),
            "available": u.available,
            "total": u.total,
            "used": u.used,
        }));
    }
    if let Some(c) = &r.volume_condition {
        lines.push((
            "condition",
            if c.abnormal {
                format!("ABNORMAL: {}", c.message)
            } else {
                format!("ok ({})", c.message)
            },
        ));
    }
    Output {
        json: json!({
            "volume_id": volume_id,
            "volume_path": path,
            "usage": usage,
            "volume_condition": r.volume_condition.as_ref().map(|c| json!({"abnormal": c.abnormal, "message": c.message})),
        }),
        human: rows(&lines),
    }
}
