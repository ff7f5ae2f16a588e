//! One function per `localvol client` command: the request built (through
//! `crate::requests` for a volume's lifecycle), one call, the answer as an
//! [`Output`].

use super::*;

/// `probe`: asks the driver whether it is ready.
pub(super) async fn cmd_probe(c: &Clients) -> Result<Output, ClientError> {
    let mut id = c.identity.clone();
    let r = call(c.timeout, csi::ProbeRequest {}, |r| id.probe(r))
        .await
        .map_err(ClientError::Rpc)?;
    let ready = match r.ready {
        Some(true) => "yes",
        Some(false) => "no",
        None => "yes (not reported)",
    };
    Ok(Output {
        json: json!({ "ready": r.ready }),
        human: rows(&[("ready", ready.to_owned())]),
    })
}

/// `probe --wait SECS`: probes until the driver says it is ready, retrying
/// what a driver that is starting answers (no socket yet, UNAVAILABLE, not
/// ready) every 100 ms; after `wait` the last reason is the error.
pub(super) async fn wait_ready(
    endpoint: &Endpoint,
    wait: Duration,
    timeout: Duration,
) -> Result<Output, ClientError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let why = match connect(endpoint).await {
            Err(e) => e.to_string(),
            Ok(channel) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let c = Clients::new(channel, timeout.min(left).max(Duration::from_millis(100)));
                match cmd_probe(&c).await {
                    Ok(out) if out.json["ready"] != json!(false) => return Ok(out),
                    Ok(_) => "the driver is not ready".to_owned(),
                    Err(ClientError::Rpc(s)) if retryable(s.code()) => {
                        ClientError::Rpc(s).to_string()
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(ClientError::Connect(format!(
                "not ready after {} s: {why}",
                wait.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a starting driver answers before it is ready.
fn retryable(code: Code) -> bool {
    matches!(code, Code::Unavailable | Code::DeadlineExceeded)
}

/// `capacity`: GetCapacity for the given parameters.
pub(super) async fn cmd_capacity(
    c: &Clients,
    pool: Option<&str>,
    params: &[(String, String)],
) -> Result<Output, ClientError> {
    let parameters = param_map(pool, params).map_err(ClientError::Usage)?;
    let mut ctl = c.controller.clone();
    let req = csi::GetCapacityRequest {
        volume_capabilities: Vec::new(),
        parameters,
        accessible_topology: None,
    };
    let r = call(c.timeout, req, |r| ctl.get_capacity(r))
        .await
        .map_err(ClientError::Rpc)?;
    let mut lines = vec![("available", bytes_h(r.available_capacity))];
    if let Some(m) = r.maximum_volume_size {
        lines.push(("maximum volume size", bytes_h(m)));
    }
    if let Some(m) = r.minimum_volume_size {
        lines.push(("minimum volume size", bytes_h(m)));
    }
    Ok(Output {
        json: json!({
            "available_capacity": r.available_capacity,
            "maximum_volume_size": r.maximum_volume_size,
            "minimum_volume_size": r.minimum_volume_size,
        }),
        human: rows(&lines),
    })
}

/// `create`: CreateVolume; prints the volume the driver made. `range` is
/// `--size` and `--limit`.
pub(super) async fn cmd_create(
    c: &Clients,
    name: &str,
    (size, limit): (Option<i64>, Option<i64>),
    pool: Option<&str>,
    cap: &CapabilityArgs,
    params: &[(String, String)],
    source: &SourceArgs,
) -> Result<Output, ClientError> {
    let parameters = param_map(pool, params).map_err(ClientError::Usage)?;
    let range =
        (size.is_some() || limit.is_some()).then(|| (size.unwrap_or(0), limit.unwrap_or(0)));
    let req = requests::create(name, range, &cap.to_csi(), parameters, source.to_csi());
    let mut ctl = c.controller.clone();
    let r = call(c.timeout, req, |r| ctl.create_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    let vol = r.volume.ok_or_else(|| {
        ClientError::Rpc(Status::internal("CreateVolume answered without a volume"))
    })?;
    Ok(Output {
        json: volume_json(&vol),
        human: rows(&volume_rows(&vol)),
    })
}

/// `delete`: DeleteVolume.
pub(super) async fn cmd_delete(c: &Clients, volume_id: &str) -> Result<Output, ClientError> {
    let mut ctl = c.controller.clone();
    let req = requests::delete(volume_id);
    call(c.timeout, req, |r| ctl.delete_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(Output {
        json: json!({ "volume_id": volume_id, "deleted": true }),
        human: rows(&[("deleted", volume_id.to_owned())]),
    })
}

/// `snapshot`: CreateSnapshot; prints the snapshot the driver made.
pub(super) async fn cmd_snapshot(
    c: &Clients,
    name: &str,
    source: &str,
    params: &[(String, String)],
) -> Result<Output, ClientError> {
    let parameters = param_map(None, params).map_err(ClientError::Usage)?;
    let req = csi::CreateSnapshotRequest {
        source_volume_id: source.to_owned(),
        name: name.to_owned(),
        secrets: HashMap::new(),
        parameters,
    };
    let mut ctl = c.controller.clone();
    let r = call(c.timeout, req, |r| ctl.create_snapshot(r))
        .await
        .map_err(ClientError::Rpc)?;
    let snap = r.snapshot.ok_or_else(|| {
        ClientError::Rpc(Status::internal(
            "CreateSnapshot answered without a snapshot",
        ))
    })?;
    Ok(snapshot_output(&snap))
}

/// A snapshot as the documented JSON object and its text rows.
pub(super) fn snapshot_output(s: &csi::Snapshot) -> Output {
    let created = s.creation_time.as_ref().map(|t| t.seconds);
    let mut lines = vec![
        ("snapshot_id", s.snapshot_id.clone()),
        ("source volume", s.source_volume_id.clone()),
        ("size", bytes_h(s.size_bytes)),
        (
            "ready",
            if s.ready_to_use { "yes" } else { "no" }.to_owned(),
        ),
    ];
    if let Some(secs) = created {
        lines.push(("created", format!("{secs} (seconds since the epoch)")));
    }
    Output {
        json: json!({
            "snapshot_id": s.snapshot_id,
            "source_volume_id": s.source_volume_id,
            "size_bytes": s.size_bytes,
            "ready_to_use": s.ready_to_use,
            "creation_time": created,
        }),
        human: rows(&lines),
    }
}

/// `delete-snapshot`: DeleteSnapshot.
pub(super) async fn cmd_delete_snapshot(
    c: &Clients,
    snapshot_id: &str,
) -> Result<Output, ClientError> {
    let mut ctl = c.controller.clone();
    let req = csi::DeleteSnapshotRequest {
        snapshot_id: snapshot_id.to_owned(),
        secrets: HashMap::new(),
    };
    call(c.timeout, req, |r| ctl.delete_snapshot(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(Output {
        json: json!({ "snapshot_id": snapshot_id, "deleted": true }),
        human: rows(&[("deleted", snapshot_id.to_owned())]),
    })
}

/// The `expand` flags that decide and shape its NodeExpandVolume step.
pub(super) struct NodeExpandStep<'a> {
    /// `--volume-path`: without it there is no node step.
    pub(super) volume_path: Option<&'a str>,
    /// `--staging-path`.
    pub(super) staging_path: Option<&'a str>,
    /// `--node`: call NodeExpandVolume even when the controller does not ask.
    pub(super) always: bool,
}

/// `expand`: ControllerExpandVolume, then the node step when the driver asks
/// for it (or `--node`) and a volume path is given.
pub(super) async fn cmd_expand(
    c: &Clients,
    volume_id: &str,
    size: i64,
    limit: Option<i64>,
    cap: &CapabilityArgs,
    node_step: NodeExpandStep<'_>,
) -> Result<Output, ClientError> {
    let range = csi::CapacityRange {
        required_bytes: size,
        limit_bytes: limit.unwrap_or(0),
    };
    let capability = cap.given().then(|| cap.to_csi());
    let mut ctl = c.controller.clone();
    let req = csi::ControllerExpandVolumeRequest {
        volume_id: volume_id.to_owned(),
        capacity_range: Some(range),
        secrets: HashMap::new(),
        volume_capability: capability.clone(),
    };
    let r = call(c.timeout, req, |r| ctl.controller_expand_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    let mut node_capacity = None;
    let mut lines = vec![
        ("volume_id", volume_id.to_owned()),
        ("capacity", bytes_h(r.capacity_bytes)),
    ];
    match node_step.volume_path {
        Some(path) if r.node_expansion_required || node_step.always => {
            let req = csi::NodeExpandVolumeRequest {
                volume_id: volume_id.to_owned(),
                volume_path: path.to_owned(),
                capacity_range: Some(range),
                staging_target_path: node_step.staging_path.unwrap_or_default().to_owned(),
                volume_capability: capability,
                secrets: HashMap::new(),
            };
            let bytes = node_expand(c, req).await?;
            node_capacity = Some(bytes);
            lines.push(("node expansion", format!("done at {path}")));
            if bytes != 0 {
                lines.push(("node capacity", bytes_h(bytes)));
            }
        }
        _ if r.node_expansion_required => lines.push((
            "node expansion",
            "required: run again with --volume-path to call NodeExpandVolume".to_owned(),
        )),
        _ => lines.push(("node expansion", "not required".to_owned())),
    }
    Ok(Output {
        json: json!({
            "volume_id": volume_id,
            "capacity_bytes": r.capacity_bytes,
            "node_expansion_required": r.node_expansion_required,
            "node_expanded": node_capacity.is_some(),
            "node_capacity_bytes": node_capacity,
        }),
        human: rows(&lines),
    })
}

/// NodeExpandVolume; returns the capacity the node reports (0: not reported).
pub(super) async fn node_expand(
    c: &Clients,
    req: csi::NodeExpandVolumeRequest,
) -> Result<i64, ClientError> {
    let mut n = c.node.clone();
    let r = call(c.timeout, req, |r| n.node_expand_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(r.capacity_bytes)
}

/// `stage`: NodeStageVolume.
pub(super) async fn cmd_stage(
    c: &Clients,
    volume_id: &str,
    staging_path: &str,
    cap: &CapabilityArgs,
    context: &[(String, String)],
    secret_files: &[(String, String)],
) -> Result<Output, ClientError> {
    let volume_context = param_map(None, context).map_err(ClientError::Usage)?;
    let secrets = read_secret_files(secret_files).map_err(ClientError::Usage)?;
    let mut n = c.node.clone();
    let capability = cap.to_csi();
    let v = NodeVolume {
        id: volume_id,
        capability: &capability,
        context: &volume_context,
    };
    let req = requests::stage(v, staging_path, secrets);
    call(c.timeout, req, |r| n.node_stage_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(Output {
        json: json!({ "volume_id": volume_id, "staging_target_path": staging_path, "staged": true }),
        human: rows(&[
            ("staged", volume_id.to_owned()),
            ("at", staging_path.to_owned()),
        ]),
    })
}

/// `unstage`: NodeUnstageVolume.
pub(super) async fn cmd_unstage(
    c: &Clients,
    volume_id: &str,
    staging_path: &str,
) -> Result<Output, ClientError> {
    let mut n = c.node.clone();
    let req = requests::unstage(volume_id, staging_path);
    call(c.timeout, req, |r| n.node_unstage_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(Output {
        json: json!({ "volume_id": volume_id, "staging_target_path": staging_path, "unstaged": true }),
        human: rows(&[
            ("unstaged", volume_id.to_owned()),
            ("from", staging_path.to_owned()),
        ]),
    })
}

/// `publish`: NodePublishVolume.
pub(super) async fn cmd_publish(
    c: &Clients,
    volume_id: &str,
    target_path: &str,
    staging_path: Option<&str>,
    readonly: bool,
    cap: &CapabilityArgs,
    context: &[(String, String)],
) -> Result<Output, ClientError> {
    let volume_context = param_map(None, context).map_err(ClientError::Usage)?;
    let mut n = c.node.clone();
    let capability = cap.to_csi();
    let v = NodeVolume {
        id: volume_id,
        capability: &capability,
        context: &volume_context,
    };
    let req = requests::publish(v, staging_path, target_path, readonly);
    call(c.timeout, req, |r| n.node_publish_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    let at = if readonly {
        format!("{target_path} (read-only)")
    } else {
        target_path.to_owned()
    };
    Ok(Output {
        json: json!({ "volume_id": volume_id, "target_path": target_path, "published": true }),
        human: rows(&[("published", volume_id.to_owned()), ("at", at)]),
    })
}

/// `unpublish`: NodeUnpublishVolume.
pub(super) async fn cmd_unpublish(
    c: &Clients,
    volume_id: &str,
    target_path: &str,
) -> Result<Output, ClientError> {
    let mut n = c.node.clone();
    let req = requests::unpublish(volume_id, target_path);
    call(c.timeout, req, |r| n.node_unpublish_volume(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(Output {
        json: json!({ "volume_id": volume_id, "target_path": target_path, "unpublished": true }),
        human: rows(&[
            ("unpublished", volume_id.to_owned()),
            ("from", target_path.to_owned()),
        ]),
    })
}

/// `stats`: NodeGetVolumeStats.
pub(super) async fn cmd_stats(
    c: &Clients,
    volume_id: &str,
    volume_path: &str,
    staging_path: Option<&str>,
) -> Result<Output, ClientError> {
    let mut n = c.node.clone();
    let req = csi::NodeGetVolumeStatsRequest {
        volume_id: volume_id.to_owned(),
        volume_path: volume_path.to_owned(),
        staging_target_path: staging_path.unwrap_or_default().to_owned(),
    };
    let r = call(c.timeout, req, |r| n.node_get_volume_stats(r))
        .await
        .map_err(ClientError::Rpc)?;
    Ok(stats_output(volume_id, volume_path, &r))
}
