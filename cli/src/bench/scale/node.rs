//! `node-scale` and `stats`: node operations and NodeGetVolumeStats with
//! many volumes published.

use super::*;

pub(super) async fn node_scale(a: &NodeScaleArgs) -> Outcome {
    let mut levels = a.published.clone();
    if levels.is_empty() || levels.windows(2).any(|w| w[0] >= w[1]) {
        return Err("--published must list increasing numbers".into());
    }
    levels.dedup();
    let (samples, fill_c, rounds) = (a.samples, a.fill_concurrency, a.common.rounds);
    with_target(&a.common, |ctx, prefix, left, _t| async move {
        // per level: each round's figures
        let mut per_level: Vec<Vec<Value>> = vec![Vec::new(); levels.len()];
        for round in 0..rounds {
            let mut kept = Vec::new();
            let res = async {
                for (li, &level) in levels.iter().enumerate() {
                    let p = format!("{prefix}-r{round}");
                    fill(&ctx, &p, &mut kept, level as usize, fill_c).await?;
                    per_level[li].push(sample_level(&ctx, &p, level, samples, round).await?);
                }
                Ok::<_, String>(())
            }
            .await;
            let removed = remove_all(&ctx, std::mem::take(&mut kept), fill_c).await;
            if let Err(e) = res {
                // Whatever remove_all could not remove is reported with it.
                return Err(match removed {
                    Ok(()) => e,
                    Err(r) => format!("{e}\ncleanup: {r}"),
                });
            }
            removed?;
        }
        drop(left);
        Ok(node_scale_report(
            &levels,
            &per_level,
            samples,
            rounds,
            ctx.stage_unstage,
        ))
    })
    .await
}

/// One round at one level: `samples` fresh volumes staged, published,
/// unpublished and unstaged, with `level` others mounted.
async fn sample_level(
    ctx: &Ctx,
    p: &str,
    level: u64,
    samples: u64,
    round: u64,
) -> Result<Value, String> {
    let lines = mount_lines();
    let (mut st, mut pb, mut sp, mut un) = (vec![], vec![], vec![], vec![]);
    for s in 0..samples {
        let (mut v, _) = ctx.create(format!("{p}-l{level}-s{s}")).await?;
        let r = async {
            let a = ctx.stage(&mut v).await?;
            let b = ctx.publish(&mut v).await?;
            let c = ctx.unpublish(&mut v).await?;
            let d = ctx.unstage(&mut v).await?;
            Ok::<_, String>((a, b, c, d))
        }
        .await;
        let (a, b, c, d) = match r {
            Ok(t) => t,
            Err(e) => {
                ctx.undo(v).await;
                return Err(e);
            }
        };
        ctx.delete(&v.id).await?;
        st.push(a);
        pb.push(b);
        sp.push(a + b);
        un.push(c + d);
    }
    let s = |v: &[Duration]| Summary::of(v).expect("samples");
    let (sps, uns) = (s(&sp), s(&un));
    Ok(json!({
        "round": round,
        "mount_lines": lines,
        "stage_publish_p50_ms": ms(sps.p50),
        "stage_publish_p99_ms": ms(sps.p99),
        "stage_p50_ms": ms(s(&st).p50),
        "publish_p50_ms": ms(s(&pb).p50),
        "unpublish_unstage_p50_ms": ms(uns.p50),
        "unpublish_unstage_p99_ms": ms(uns.p99),
    }))
}

/// `node-scale`'s answer: each level's medians over the rounds.
fn node_scale_report(
    levels: &[u64],
    per_level: &[Vec<Value>],
    samples: u64,
    rounds: u64,
    stage_unstage: bool,
) -> (Value, String) {
    let keys = [
        "mount_lines",
        "stage_publish_p50_ms",
        "stage_publish_p99_ms",
        "stage_p50_ms",
        "publish_p50_ms",
        "unpublish_unstage_p50_ms",
        "unpublish_unstage_p99_ms",
    ];
    let mut out = Vec::new();
    for (li, level) in levels.iter().enumerate() {
        let mut o = json!({"published": level, "rounds": per_level[li]});
        for k in keys {
            o[k] = json!(median_of(&per_level[li], k));
        }
        out.push(o);
    }
    let base = out[0]["stage_publish_p50_ms"].as_f64().unwrap_or(0.0);
    let last = out[out.len() - 1]["stage_publish_p50_ms"]
        .as_f64()
        .unwrap_or(0.0);
    let growth = if base > 0.0 { last / base } else { 0.0 };
    let j = json!({"mode": "node-scale", "samples": samples, "rounds": rounds,
        "stage_unstage": stage_unstage, "levels": out, "stage_publish_growth": growth});
    let rows = out
        .iter()
        .map(|o| {
            vec![
                o["published"].to_string(),
                format!("{:.0}", o["mount_lines"].as_f64().unwrap_or(0.0)),
                f3(o["stage_p50_ms"].as_f64().unwrap_or(0.0)),
                f3(o["publish_p50_ms"].as_f64().unwrap_or(0.0)),
                f3(o["stage_publish_p50_ms"].as_f64().unwrap_or(0.0)),
                f3(o["stage_publish_p99_ms"].as_f64().unwrap_or(0.0)),
                f3(o["unpublish_unstage_p50_ms"].as_f64().unwrap_or(0.0)),
            ]
        })
        .collect();
    let mut h = format!(
        "localvol bench node-scale: {samples} fresh volumes per level, median of {rounds} rounds\n"
    );
    h.push_str(&table(
        &[
            "published",
            "mount lines",
            "stage p50",
            "publish p50",
            "stage+publish p50",
            "p99",
            "unpublish+unstage p50",
        ],
        rows,
    ));
    let _ = writeln!(
        h,
        "stage+publish p50 growth, first to last level: {growth:.2}x"
    );
    (j, h)
}

pub(super) async fn stats(a: &StatsArgs) -> Outcome {
    let (n, calls, c, rounds) = (a.published, a.calls, a.concurrency, a.common.rounds);
    with_target(&a.common, |ctx, prefix, left, _t| async move {
        let mut kept = Vec::new();
        let res = fill(&ctx, &prefix, &mut kept, n as usize, 4).await;
        left.lock().expect("volumes").extend(kept.iter().cloned());
        res?;
        let kept = Arc::new(kept);
        let mut per_round = Vec::new();
        for round in 0..rounds {
            let (ctx2, kept2) = (ctx.clone(), kept.clone());
            let (times, err) = parallel(calls as usize, c, move |i| {
                let (ctx, kept) = (ctx2.clone(), kept2.clone());
                async move {
                    let v = &kept[i % kept.len()];
                    let mut node = ctx.clients.node.clone();
                    let req = csi::NodeGetVolumeStatsRequest {
                        volume_id: v.id.clone(),
                        volume_path: path_str(&v.target)?,
                        staging_target_path: String::new(),
                    };
                    let start = Instant::now();
                    let r = client::call(ctx.clients.timeout, req, |r| node.node_get_volume_stats(r))
                        .await
                        .map_err(|s| rpc_err("NodeGetVolumeStats", s))?;
                    let took = start.elapsed();
                    if let Some(cond) = r.volume_condition.filter(|c| c.abnormal) {
                        return Err(format!("volume {} reported abnormal: {}", v.id, cond.message));
                    }
                    Ok(took)
                }
            })
            .await;
            if let Some(e) = err {
                return Err(e);
            }
            let s = Summary::of(&times).ok_or("no calls")?;
            let mut r = summary_json(&s);
            r["round"] = json!(round);
            per_round.push(r);
        }
        let j = json!({"mode": "stats", "published": n, "calls": calls, "concurrency": c,
            "mount_lines": mount_lines(),
            "p50_ms": median_of(&per_round, "p50_ms"), "p90_ms": median_of(&per_round, "p90_ms"),
            "p99_ms": median_of(&per_round, "p99_ms"), "rounds": per_round});
        let h = format!(
            "localvol bench stats: {calls} NodeGetVolumeStats calls over {n} published volumes, concurrency {c}, median of {rounds} rounds\n{}",
            table(
                &["p50 ms", "p90 ms", "p99 ms"],
                vec![vec![f3(j["p50_ms"].as_f64().unwrap_or(0.0)), f3(j["p90_ms"].as_f64().unwrap_or(0.0)), f3(j["p99_ms"].as_f64().unwrap_or(0.0))]],
            )
        );
        Ok((j, h))
    })
    .await
}
