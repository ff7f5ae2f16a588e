//! `restart` and `sweep`: a driver started afresh, timed to its first
//! ready Probe with many volumes; lifecycles at each concurrency.

use super::*;

pub(super) async fn restart(a: &RestartArgs) -> Outcome {
    let c = &a.common;
    if c.driver.is_empty() {
        return Err("restart starts the driver itself: give its command after --".into());
    }
    let (n, conc, rounds) = (a.volumes, a.concurrency, c.rounds);
    let base = match &c.work_dir {
        Some(d) => std::path::absolute(d).map_err(|e| format!("work dir {d:?}: {e}"))?,
        None => std::env::temp_dir(),
    };
    let run = run_id();
    let dirs = RunDir::create(&base, &run, false)?;
    let prefix = format!("{}-{run}", c.name_prefix);
    let res = restart_rounds(c, &base, &dirs, &prefix, n, conc, rounds).await;
    let removed = dirs.remove();
    let res = res?;
    removed?;
    Ok(res)
}

pub(super) async fn restart_rounds(
    c: &Common,
    base: &Path,
    dirs: &RunDir,
    prefix: &str,
    n: u64,
    conc: u64,
    rounds: u64,
) -> Outcome {
    let (t, ids, mut res) = populate(c, base, dirs, prefix, n, conc).await?;
    let mut per_round = Vec::new();
    let mut t = Some(t);
    for round in 0..rounds {
        if res.is_err() {
            break;
        }
        if let Some(old) = t.take() {
            old.close().await?;
        }
        let fresh = match Target::open(c, base).await {
            Ok(f) => f,
            Err(e) => {
                res = Err(e);
                break;
            }
        };
        let serving = fresh.serving.unwrap_or_default();
        let loaded = fresh.rss()?;
        let listed = match list_pass(&fresh.clients, 500).await {
            Ok((_, _, count)) => count,
            Err(e) => {
                res = Err(e);
                t = Some(fresh);
                break;
            }
        };
        if (listed as u64) < n {
            res = Err(format!(
                "the restarted driver lists {listed} volumes, fewer than the {n} made"
            ));
        }
        let rss = fresh.rss()?;
        per_round.push(json!({
            "round": round,
            "serving_ms": ms(serving),
            "listed": listed,
            "rss_serving_bytes": loaded.map(|r| r.0),
            "rss_bytes": rss.map(|r| r.0),
            "peak_rss_bytes": rss.map(|r| r.1),
        }));
        t = Some(fresh);
    }
    // Remove what was made, through the last driver.
    let t = match t {
        Some(t) => t,
        None => Target::open(c, base).await?,
    };
    let ctx = Arc::new(Ctx::new(c, &t, dirs)?);
    let (ctx2, ids2) = (ctx.clone(), ids.clone());
    let (_, err) = parallel(ids.len(), conc, move |i| {
        let (ctx, ids) = (ctx2.clone(), ids2.clone());
        async move { ctx.delete(&ids[i]).await }
    })
    .await;
    drop(ctx);
    let closed = t.close().await;
    res?;
    if let Some(e) = err {
        return Err(e);
    }
    closed?;
    Ok(restart_report(per_round, n, rounds))
}

/// Creates `n` volumes through a driver started for it: the driver, the
/// ids made, and whether all were.
async fn populate(
    c: &Common,
    base: &Path,
    dirs: &RunDir,
    prefix: &str,
    n: u64,
    conc: u64,
) -> Result<(Target, Arc<Vec<String>>, Result<(), String>), String> {
    let t = Target::open(c, base).await?;
    let ctx = Arc::new(Ctx::new(c, &t, dirs)?);
    let (ctx2, p) = (ctx.clone(), prefix.to_owned());
    let (made, err) = parallel(n as usize, conc, move |i| {
        let (ctx, name) = (ctx2.clone(), format!("{p}-{i}"));
        async move { Ok(ctx.create(name).await?.0.id) }
    })
    .await;
    let res = match err {
        Some(e) => Err(e),
        None => Ok(()),
    };
    Ok((t, Arc::new(made), res))
}

/// `restart`'s answer: the medians over the restarts.
fn restart_report(per_round: Vec<Value>, n: u64, rounds: u64) -> (Value, String) {
    let mut j = json!({"mode": "restart", "volumes": n, "rounds": per_round});
    for k in [
        "serving_ms",
        "rss_serving_bytes",
        "rss_bytes",
        "peak_rss_bytes",
    ] {
        j[k] = json!(median_of(&per_round, k));
    }
    let g = |k: &str| j[k].as_f64().unwrap_or(0.0);
    let h = format!(
        "localvol bench restart: {n} volumes, median of {rounds} restarts\n{}",
        table(
            &[
                "start to serving ms",
                "RSS serving",
                "RSS after listing",
                "peak RSS"
            ],
            vec![vec![
                f3(g("serving_ms")),
                human(g("rss_serving_bytes") as u64),
                human(g("rss_bytes") as u64),
                human(g("peak_rss_bytes") as u64),
            ]],
        )
    );
    (j, h)
}

pub(super) async fn sweep(a: &SweepArgs) -> Outcome {
    let c = &a.common;
    if a.concurrency.is_empty() {
        return Err("--concurrency needs at least one value".into());
    }
    let base = match &c.work_dir {
        Some(d) => std::path::absolute(d).map_err(|e| format!("work dir {d:?}: {e}"))?,
        None => std::env::temp_dir(),
    };
    let mut per_level: Vec<Vec<Value>> = vec![Vec::new(); a.concurrency.len()];
    for round in 0..c.rounds {
        for (li, &conc) in a.concurrency.iter().enumerate() {
            let r = sweep_run(a, &base, conc).await?;
            per_level[li].push(json!({
                "round": round,
                "lifecycles_per_sec": r.lifecycles_per_sec(),
                "lifecycle_p50_ms": ms(r.lifecycle.p50),
                "lifecycle_p99_ms": ms(r.lifecycle.p99),
                "peak_rss_bytes": r.server_peak_rss.map(|(_, b)| b),
            }));
        }
    }
    Ok(sweep_report(a, &per_level))
}

/// One `sweep` run: whole lifecycles at concurrency `conc`, through a
/// driver started afresh when the bench starts it.
async fn sweep_run(a: &SweepArgs, base: &Path, conc: u64) -> Result<crate::bench::Report, String> {
    let c = &a.common;
    let t = Target::open(c, base).await?;
    let server_pid = match (&t.running, t.pid) {
        (Some(_), Some(p)) => Some(ServerPid::Pid(p)),
        _ => c.server_pid,
    };
    let args = crate::bench::BenchArgs {
        scenario: None,
        endpoint: c.endpoint.clone(),
        volumes: a.volumes,
        concurrency: conc,
        size: c.size,
        params: c.params.clone(),
        fs_type: c.fs_type.clone(),
        work_dir: Some(base.to_path_buf()),
        server_pid,
        // A driver the bench did not start: its peak since the last run is reset.
        reset_peak_rss: t.running.is_none() && server_pid.is_some(),
        name_prefix: format!("{}-c{conc}", c.name_prefix),
        timeout: c.timeout,
        json: true,
        floor: false,
        floor_lvm: None,
        floor_rpc: false,
        stage_secret_files: Vec::new(),
    };
    let report = crate::bench::run(&args).await;
    t.close().await?;
    report
}

/// `sweep`'s answer: each concurrency's medians over the rounds.
fn sweep_report(a: &SweepArgs, per_level: &[Vec<Value>]) -> (Value, String) {
    let c = &a.common;
    let mut levels = Vec::new();
    for (li, conc) in a.concurrency.iter().enumerate() {
        let mut o = json!({"concurrency": conc, "rounds": per_level[li]});
        for k in [
            "lifecycles_per_sec",
            "lifecycle_p50_ms",
            "lifecycle_p99_ms",
            "peak_rss_bytes",
        ] {
            o[k] = json!(median_of(&per_level[li], k));
        }
        levels.push(o);
    }
    let rows = levels
        .iter()
        .map(|o| {
            let g = |k: &str| o[k].as_f64().unwrap_or(0.0);
            vec![
                o["concurrency"].to_string(),
                format!("{:.1}", g("lifecycles_per_sec")),
                f3(g("lifecycle_p50_ms")),
                f3(g("lifecycle_p99_ms")),
                match o["rounds"][0]["peak_rss_bytes"].is_null() {
                    true => "-".to_owned(),
                    false => human(g("peak_rss_bytes") as u64),
                },
            ]
        })
        .collect();
    let j = json!({"mode": "sweep", "volumes": a.volumes, "rounds": c.rounds, "levels": levels});
    let h = format!(
        "localvol bench sweep: {} lifecycles per run, median of {} rounds\n{}",
        a.volumes,
        c.rounds,
        table(
            &[
                "concurrency",
                "lifecycles/s",
                "lifecycle p50 ms",
                "p99 ms",
                "driver peak RSS"
            ],
            rows
        )
    );
    (j, h)
}
