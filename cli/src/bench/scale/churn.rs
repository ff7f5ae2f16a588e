//! `churn`: CreateVolume and DeleteVolume rates and ListVolumes passes
//! with thousands of volumes.

use super::*;

/// How long `churn` waits after its list passes before it reads the
/// driver's settled RSS (the driver trims its heap 200 ms after a large
/// answer; see `localvol::memory`, not used here so any driver compares).
const SETTLE: Duration = Duration::from_secs(1);

/// One full ListVolumes pass: total time, each page's time, entries listed.
pub(super) async fn list_pass(
    clients: &Clients,
    page: i32,
) -> Result<(Duration, Vec<Duration>, usize), String> {
    let mut ctl = clients.controller.clone();
    let (mut token, mut pages, mut count) = (String::new(), Vec::new(), 0);
    let start = Instant::now();
    loop {
        let req = csi::ListVolumesRequest {
            max_entries: page,
            starting_token: token,
        };
        let t = Instant::now();
        let r = client::call(clients.timeout, req, |r| ctl.list_volumes(r))
            .await
            .map_err(|s| rpc_err("ListVolumes", s))?;
        pages.push(t.elapsed());
        count += r.entries.len();
        if r.next_token.is_empty() {
            break;
        }
        token = r.next_token;
        if pages.len() > 1_000_000 {
            return Err("ListVolumes keeps handing out tokens".into());
        }
    }
    Ok((start.elapsed(), pages, count))
}

pub(super) async fn churn(a: &ChurnArgs) -> Outcome {
    let (n, c, page, passes, rounds) =
        (a.volumes, a.concurrency, a.page, a.passes, a.common.rounds);
    with_target(&a.common, |ctx, prefix, left, target| async move {
        let mut per_round = Vec::new();
        for round in 0..rounds {
            let (ctx2, p) = (ctx.clone(), format!("{prefix}-r{round}"));
            let start = Instant::now();
            let (made, err) = parallel(n as usize, c, move |i| {
                let (ctx, name) = (ctx2.clone(), format!("{p}-{i}"));
                async move { Ok(ctx.create(name).await?.0) }
            })
            .await;
            let create_s = start.elapsed();
            left.lock().expect("volumes").extend(made.iter().cloned());
            if let Some(e) = err {
                return Err(e);
            }
            let (mut paged, mut unpaged, mut page_times, mut listed) = (vec![], vec![], vec![], 0);
            for _ in 0..passes {
                let (t, pages, count) = list_pass(&ctx.clients, page).await?;
                paged.push(ms(t));
                page_times.extend(pages);
                listed = count;
                let (t, _, _) = list_pass(&ctx.clients, 0).await?;
                unpaged.push(ms(t));
            }
            // Right after the last (unpaged) pass, then settled: a second
            // later, once the driver has handed the answer's memory back.
            let rss_after_list = target.rss()?;
            tokio::time::sleep(SETTLE).await;
            let rss = target.rss()?;
            let ids: Arc<Vec<String>> = Arc::new(made.iter().map(|v| v.id.clone()).collect());
            let (ctx2, ids2) = (ctx.clone(), ids.clone());
            let start = Instant::now();
            let (_, err) = parallel(ids.len(), c, move |i| {
                let (ctx, ids) = (ctx2.clone(), ids2.clone());
                async move { ctx.delete(&ids[i]).await }
            })
            .await;
            let delete_s = start.elapsed();
            if let Some(e) = err {
                return Err(e);
            }
            left.lock().expect("volumes").clear();
            let pt = Summary::of(&page_times).ok_or("no pages")?;
            let mut sorted = page_times.clone();
            sorted.sort_unstable();
            per_round.push(json!({
                "round": round,
                "create_per_sec": n as f64 / create_s.as_secs_f64().max(1e-9),
                "delete_per_sec": n as f64 / delete_s.as_secs_f64().max(1e-9),
                "list_paged_ms": median(&paged),
                "list_unpaged_ms": median(&unpaged),
                "listed": listed,
                "pages_per_pass": page_times.len() as u64 / passes,
                "page_p50_ms": ms(pt.p50),
                "page_max_ms": ms(percentile(&sorted, 100)),
                "rss_bytes": rss.map(|r| r.0),
                "rss_after_list_bytes": rss_after_list.map(|r| r.0),
                "peak_rss_bytes": rss.map(|r| r.1),
            }));
        }
        Ok(churn_report(per_round, n, c, page, passes, rounds))
    })
    .await
}

/// `churn`'s answer: the medians over the rounds.
fn churn_report(
    per_round: Vec<Value>,
    n: u64,
    c: u64,
    page: i32,
    passes: u64,
    rounds: u64,
) -> (Value, String) {
    let keys = [
        "create_per_sec",
        "delete_per_sec",
        "list_paged_ms",
        "list_unpaged_ms",
        "page_p50_ms",
        "page_max_ms",
        "rss_bytes",
        "rss_after_list_bytes",
        "peak_rss_bytes",
    ];
    let mut j = json!({"mode": "churn", "volumes": n, "concurrency": c, "page": page,
        "passes": passes, "listed": per_round[0]["listed"], "rounds": per_round});
    for k in keys {
        j[k] = json!(median_of(&per_round, k));
    }
    let g = |k: &str| j[k].as_f64().unwrap_or(0.0);
    let rss = |k: &str| match j["rounds"][0][k].is_null() {
        true => "-".to_owned(),
        false => human(g(k) as u64),
    };
    let h = format!(
        "localvol bench churn: {n} volumes, {c} client threads, pages of {page}, median of {rounds} rounds\n{}",
        table(
            &["creates/s", "deletes/s", "list paged ms", "list unpaged ms", "page p50 ms", "page max ms", "RSS after the lists", "RSS settled", "peak RSS"],
            vec![vec![
                format!("{:.0}", g("create_per_sec")),
                format!("{:.0}", g("delete_per_sec")),
                f3(g("list_paged_ms")),
                f3(g("list_unpaged_ms")),
                f3(g("page_p50_ms")),
                f3(g("page_max_ms")),
                rss("rss_after_list_bytes"),
                rss("rss_bytes"),
                rss("peak_rss_bytes"),
            ]],
        )
    );
    (j, h)
}
