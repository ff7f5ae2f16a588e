//! Lifecycles through a CSI driver's socket (and the transport floor,
//! `--floor-rpc`): the workers, each lifecycle's RPCs (requests from
//! `crate::requests`), timed, and the best-effort undo of a failed one.

use super::*;

/// What a driver lifecycle needs that is the same for all of them.
pub(super) struct CsiCtx {
    pub(super) clients: Clients,
    pub(super) stage_unstage: bool,
    pub(super) capability: csi::VolumeCapability,
    pub(super) parameters: HashMap<String, String>,
    /// NodeStageVolume secrets (`--stage-secret-file`).
    pub(super) stage_secrets: HashMap<String, String>,
    pub(super) size: i64,
    pub(super) prefix: String,
    /// `--floor-rpc`: GetPluginInfo calls instead of the lifecycle's RPCs.
    pub(super) probe_only: bool,
}

/// What one lifecycle has asked the driver to do so far, for cleanup.
#[derive(Default)]
pub(super) struct Progress {
    pub(super) volume_id: Option<String>,
    pub(super) volume_context: HashMap<String, String>,
    pub(super) staging_dir: bool,
    pub(super) staged: bool,
    pub(super) published: bool,
}

pub(super) fn rpc_error(step: usize, s: tonic::Status) -> String {
    let hint = if s.code() == tonic::Code::InvalidArgument && matches!(step, STAGE | PUBLISH) {
        " (hint: is --work-dir below the driver's kubelet directory?)"
    } else {
        ""
    };
    format!(
        "{}: {}: {}{hint}",
        RPC_STEPS[step],
        code_name(s.code()),
        s.message()
    )
}

/// CSI mode (and `--floor-rpc`): runs the lifecycles against the driver's
/// socket on `--concurrency` workers and reports their latencies.
pub(super) async fn run_csi(
    args: &BenchArgs,
    dirs: &RunDir,
    run_id: &str,
    abort: Arc<AtomicBool>,
) -> Result<Report, String> {
    let channel = client::connect(&args.endpoint)
        .await
        .map_err(|e| e.to_string())?;
    let clients = Clients::new(channel, Duration::from_secs(args.timeout.max(1)));
    let server_pid = prepare_server_pid(args).await?;
    let stage_unstage = has_stage_unstage(&clients).await?;
    let capability = client::CapabilityArgs {
        fs: Some(args.fs_type.clone()),
        ..Default::default()
    }
    .to_csi();
    let ctx = Arc::new(CsiCtx {
        clients,
        stage_unstage,
        capability,
        parameters: client::param_map(None, &args.params)?,
        stage_secrets: client::read_secret_files(&args.stage_secret_files)?,
        size: args.size,
        prefix: format!("{}-{run_id}", args.name_prefix),
        probe_only: args.floor_rpc,
    });
    let n = usize::try_from(args.volumes).map_err(|e| e.to_string())?;
    let (staging, targets) = (dirs.staging.clone(), dirs.targets.clone());
    let (samples, errors, wall) = run_workers(args.concurrency, n, abort, move |i, mut samples| {
        let ctx = ctx.clone();
        let (staging, target) = (staging.join(i.to_string()), targets.join(i.to_string()));
        async move {
            let res = if ctx.probe_only {
                probe_lifecycle(&ctx, &mut samples).await
            } else {
                csi_lifecycle(&ctx, i, &staging, &target, &mut samples).await
            };
            let res = res.map_err(|e| format!("lifecycle {i} ({}-{i}): {e}", ctx.prefix));
            (samples, res)
        }
    })
    .await;
    if let Some(e) = first_error(&errors) {
        return Err(e);
    }
    csi_report(args, &samples, wall, stage_unstage, server_pid)
}

/// `--server-pid`: resolves `auto` to the socket's peer, checks that the
/// pid's peak RSS can be read, and resets it when `--reset-peak-rss` asks.
pub(super) async fn prepare_server_pid(args: &BenchArgs) -> Result<Option<u32>, String> {
    let server_pid = match args.server_pid {
        None => None,
        Some(ServerPid::Pid(p)) => Some(p),
        Some(ServerPid::Auto) => Some(socket_peer_pid(&args.endpoint).await?),
    };
    if let Some(pid) = server_pid {
        read_peak_rss(pid)?;
        if args.reset_peak_rss {
            reset_peak_rss(pid)?;
        }
    }
    Ok(server_pid)
}

/// Whether the driver's NodeGetCapabilities lists STAGE_UNSTAGE_VOLUME.
pub(super) async fn has_stage_unstage(clients: &Clients) -> Result<bool, String> {
    let mut node = clients.node.clone();
    let caps = client::call(clients.timeout, csi::NodeGetCapabilitiesRequest {}, |r| {
        node.node_get_capabilities(r)
    })
    .await
    .map_err(|s| {
        format!(
            "NodeGetCapabilities: {}: {}",
            code_name(s.code()),
            s.message()
        )
    })?;
    Ok(client::node_cap_names(&caps)
        .iter()
        .any(|c| c == "STAGE_UNSTAGE_VOLUME"))
}

/// The CSI-mode report: latencies, the run's settings, and the server's peak
/// RSS when `--server-pid` was given.
pub(super) fn csi_report(
    args: &BenchArgs,
    samples: &Samples,
    wall: Duration,
    stage_unstage: bool,
    server_pid: Option<u32>,
) -> Result<Report, String> {
    let (mode, steps) = match args.floor_rpc {
        true => ("rpc-floor", &PROBE_STEPS),
        false => ("csi", &RPC_STEPS),
    };
    let mut report = Report::new(mode, steps, samples, wall)
        .ok_or_else(|| "no lifecycle completed".to_owned())?;
    report.endpoint = Some(args.endpoint.to_string());
    report.volumes = args.volumes;
    report.concurrency = args.concurrency;
    report.stage_unstage = stage_unstage;
    if let Some(pid) = server_pid {
        report.server_peak_rss = Some((pid, read_peak_rss(pid)?));
    }
    Ok(report)
}

/// Runs `n` lifecycles on `concurrency` tokio workers that take indexes from
/// one counter until all are taken or `abort` is set (Ctrl-C, or a lifecycle
/// that failed: its worker sets it). `lifecycle(i, samples)` runs lifecycle
/// `i`, recording into its worker's samples, which it hands back. Returns all
/// samples, the failed lifecycles' errors and the wall time.
pub(super) async fn run_workers<F, Fut>(
    concurrency: u64,
    n: usize,
    abort: Arc<AtomicBool>,
    lifecycle: F,
) -> (Samples, Vec<String>, Duration)
where
    F: Fn(usize, Samples) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (Samples, Result<(), String>)> + Send + 'static,
{
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (next, abort, lifecycle) = (next.clone(), abort.clone(), lifecycle.clone());
        workers.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            while !abort.load(Ordering::SeqCst) {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    break;
                }
                let (s, res) = lifecycle(i, samples).await;
                samples = s;
                if let Err(e) = res {
                    abort.store(true, Ordering::SeqCst);
                    return (samples, Err(e));
                }
            }
            (samples, Ok(()))
        }));
    }
    let (samples, errors) = join_workers(workers).await;
    (samples, errors, start.elapsed())
}

pub(super) async fn join_workers(
    workers: Vec<tokio::task::JoinHandle<(Samples, Result<(), String>)>>,
) -> (Samples, Vec<String>) {
    let mut all = Samples::default();
    let mut errors = Vec::new();
    for w in workers {
        match w.await {
            Ok((s, r)) => {
                all.merge(s);
                if let Err(e) = r {
                    errors.push(e);
                }
            }
            Err(e) => errors.push(format!("worker failed: {e}")),
        }
    }
    (all, errors)
}

pub(super) fn first_error(errors: &[String]) -> Option<String> {
    let first = errors.first()?;
    Some(match errors.len() {
        1 => first.clone(),
        n => format!("{first} (and {} more failed lifecycles)", n - 1),
    })
}

/// A transport-floor lifecycle: six GetPluginInfo round trips, nothing else.
pub(super) async fn probe_lifecycle(ctx: &CsiCtx, samples: &mut Samples) -> Result<(), String> {
    let lifecycle = Instant::now();
    for step in samples.steps.iter_mut() {
        let mut identity = ctx.clients.identity.clone();
        let start = Instant::now();
        client::call(ctx.clients.timeout, csi::GetPluginInfoRequest {}, |r| {
            identity.get_plugin_info(r)
        })
        .await
        .map_err(|s| format!("GetPluginInfo: {}: {}", code_name(s.code()), s.message()))?;
        step.push(start.elapsed());
    }
    samples.lifecycles.push(lifecycle.elapsed());
    Ok(())
}

/// One driver lifecycle; on error, undoes what it did (best effort).
pub(super) async fn csi_lifecycle(
    ctx: &CsiCtx,
    i: usize,
    staging: &Path,
    target: &Path,
    samples: &mut Samples,
) -> Result<(), String> {
    let mut p = Progress::default();
    let res = csi_steps(ctx, i, staging, target, samples, &mut p).await;
    if res.is_err() {
        csi_cleanup(ctx, staging, target, &p).await;
    }
    res
}

/// The lifecycle's steps in order (stage and unstage only for drivers with
/// STAGE_UNSTAGE_VOLUME), recording each step's latency and, in `p`, what
/// there is to undo if a later step fails.
pub(super) async fn csi_steps(
    ctx: &CsiCtx,
    i: usize,
    staging: &Path,
    target: &Path,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<(), String> {
    let staging_s = path_str(staging)?;
    let target_s = path_str(target)?;
    let lifecycle = Instant::now();
    let id = csi_create(ctx, i, samples, p).await?;
    if ctx.stage_unstage {
        csi_stage(ctx, &id, staging, &staging_s, samples, p).await?;
    }
    csi_publish(ctx, &id, &staging_s, &target_s, samples, p).await?;
    csi_unpublish(ctx, &id, target, target_s, samples, p).await?;
    if ctx.stage_unstage {
        csi_unstage(ctx, &id, staging, staging_s, samples, p).await?;
    }
    csi_delete(ctx, id, samples, p).await?;
    samples.lifecycles.push(lifecycle.elapsed());
    Ok(())
}

/// Awaits one lifecycle RPC and records its latency under `step`; an error
/// is worded by `rpc_error`.
pub(super) async fn timed<R>(
    samples: &mut Samples,
    step: usize,
    rpc: impl std::future::Future<Output = Result<R, tonic::Status>>,
) -> Result<R, String> {
    let start = Instant::now();
    let r = rpc.await.map_err(|s| rpc_error(step, s))?;
    samples.steps[step].push(start.elapsed());
    Ok(r)
}

/// CreateVolume for lifecycle `i`; returns the new volume's id.
pub(super) async fn csi_create(
    ctx: &CsiCtx,
    i: usize,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<String, String> {
    let mut ctl = ctx.clients.controller.clone();
    let req = requests::create(
        &format!("{}-{i}", ctx.prefix),
        Some((ctx.size, 0)),
        &ctx.capability,
        ctx.parameters.clone(),
        None,
    );
    let call = client::call(ctx.clients.timeout, req, |r| ctl.create_volume(r));
    let r = timed(samples, CREATE, call).await?;
    let vol = r
        .volume
        .ok_or_else(|| "CreateVolume answered without a volume".to_owned())?;
    p.volume_id = Some(vol.volume_id.clone());
    p.volume_context = vol.volume_context;
    Ok(vol.volume_id)
}

/// Creates the staging directory (as kubelet does), then NodeStageVolume.
pub(super) async fn csi_stage(
    ctx: &CsiCtx,
    id: &str,
    staging: &Path,
    staging_s: &str,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<(), String> {
    let mut node = ctx.clients.node.clone();
    // kubelet creates the staging directory before NodeStageVolume. These
    // mkdir/rmdir calls block the worker for a few microseconds.
    std::fs::create_dir(staging).map_err(|e| format!("creating {staging:?}: {e}"))?;
    p.staging_dir = true;
    p.staged = true;
    let v = NodeVolume {
        id,
        capability: &ctx.capability,
        context: &p.volume_context,
    };
    let req = requests::stage(v, staging_s, ctx.stage_secrets.clone());
    let call = client::call(ctx.clients.timeout, req, |r| node.node_stage_volume(r));
    timed(samples, STAGE, call).await?;
    Ok(())
}

/// NodePublishVolume at `target_s` (from the staging path when staged).
pub(super) async fn csi_publish(
    ctx: &CsiCtx,
    id: &str,
    staging_s: &str,
    target_s: &str,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<(), String> {
    let mut node = ctx.clients.node.clone();
    p.published = true;
    let v = NodeVolume {
        id,
        capability: &ctx.capability,
        context: &p.volume_context,
    };
    let staging = ctx.stage_unstage.then_some(staging_s);
    let req = requests::publish(v, staging, target_s, false);
    let call = client::call(ctx.clients.timeout, req, |r| node.node_publish_volume(r));
    timed(samples, PUBLISH, call).await?;
    Ok(())
}

/// NodeUnpublishVolume, then removes the target directory.
pub(super) async fn csi_unpublish(
    ctx: &CsiCtx,
    id: &str,
    target: &Path,
    target_s: String,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<(), String> {
    let mut node = ctx.clients.node.clone();
    let req = requests::unpublish(id, &target_s);
    let call = client::call(ctx.clients.timeout, req, |r| node.node_unpublish_volume(r));
    timed(samples, UNPUBLISH, call).await?;
    p.published = false;
    // The driver should have removed the target; kubelet removes it otherwise.
    rmdir(target).map_err(|e| format!("removing {target:?} after NodeUnpublishVolume: {e}"))
}

/// NodeUnstageVolume, then removes the staging directory.
pub(super) async fn csi_unstage(
    ctx: &CsiCtx,
    id: &str,
    staging: &Path,
    staging_s: String,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<(), String> {
    let mut node = ctx.clients.node.clone();
    let req = requests::unstage(id, &staging_s);
    let call = client::call(ctx.clients.timeout, req, |r| node.node_unstage_volume(r));
    timed(samples, UNSTAGE, call).await?;
    p.staged = false;
    rmdir(staging).map_err(|e| format!("removing {staging:?} after NodeUnstageVolume: {e}"))?;
    p.staging_dir = false;
    Ok(())
}

/// DeleteVolume; the lifecycle then has nothing left to undo.
pub(super) async fn csi_delete(
    ctx: &CsiCtx,
    id: String,
    samples: &mut Samples,
    p: &mut Progress,
) -> Result<(), String> {
    let mut ctl = ctx.clients.controller.clone();
    let req = requests::delete(&id);
    let call = client::call(ctx.clients.timeout, req, |r| ctl.delete_volume(r));
    timed(samples, DELETE, call).await?;
    p.volume_id = None;
    Ok(())
}

/// Best-effort undo of a failed lifecycle; problems are printed, not returned.
pub(super) async fn csi_cleanup(ctx: &CsiCtx, staging: &Path, target: &Path, p: &Progress) {
    let t = ctx.clients.timeout;
    let (mut ctl, mut node) = (ctx.clients.controller.clone(), ctx.clients.node.clone());
    let Some(id) = &p.volume_id else { return };
    let warn = |what: &str, e: String| eprintln!("localvol bench: cleanup of {id}: {what}: {e}");
    if p.published {
        let req = requests::unpublish(id, &target.to_string_lossy());
        if let Err(s) = client::call(t, req, |r| node.node_unpublish_volume(r)).await {
            warn(
                "NodeUnpublishVolume",
                format!("{}: {}", code_name(s.code()), s.message()),
            );
        }
        if let Err(e) = rmdir(target) {
            warn("removing the target", e.to_string());
        }
    }
    if p.staged {
        let req = requests::unstage(id, &staging.to_string_lossy());
        if let Err(s) = client::call(t, req, |r| node.node_unstage_volume(r)).await {
            warn(
                "NodeUnstageVolume",
                format!("{}: {}", code_name(s.code()), s.message()),
            );
        }
    }
    if p.staging_dir {
        if let Err(e) = rmdir(staging) {
            warn("removing the staging dir", e.to_string());
        }
    }
    let req = requests::delete(id);
    if let Err(s) = client::call(t, req, |r| ctl.delete_volume(r)).await {
        warn(
            "DeleteVolume",
            format!("{}: {}", code_name(s.code()), s.message()),
        );
    }
}
