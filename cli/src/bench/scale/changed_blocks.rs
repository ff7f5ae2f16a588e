//! `changed-blocks`: what changed-block tracking saves a backup. Each
//! round, through standard CSI RPCs only:
//!
//! 1. a raw block volume of `--size` in `--pool` is created, staged and
//!    published (as kubelet does: a staging dir, a target file), written
//!    whole with a deterministic pattern (so every block holds real,
//!    allocated data) and fsynced; snapshot A is taken;
//! 2. `--changed-percent` of it is overwritten in `--chunk`s at distinct,
//!    chunk-aligned offsets picked at random from the round's seed, fsynced;
//!    snapshot B is taken;
//! 3. B is restored into a new block volume (CreateVolume with B as its
//!    content source), staged and published;
//! 4. arm "full": the whole restored device is read sequentially, and
//!    checksummed; arm "delta": GetMetadataDelta(A, B) is read to its end,
//!    then only its runs (joined where adjacent) are read from the restored
//!    device, and checksummed. Both read with `O_DIRECT` (no page cache),
//!    1 MiB at a time; which arm goes first alternates with the round.
//!
//! A chunk written in step 2 that the runs do not cover whole fails the run
//! (exit status 1), and so does a written chunk whose bytes on the
//! restored device are not the ones written. The runs may name more than
//! was written: whole blocks of the pool (its chunk size), where a written
//! chunk is smaller or straddles two. `granularity` is the largest length
//! every run's offset and length are multiples of: the pool's block, or a
//! multiple of it.
//!
//! Everything a round made (two volumes, two snapshots) is unpublished,
//! unstaged and deleted at the end of the round, also after an error (best
//! effort, each problem printed). The driver must serve a thin LVM pool
//! (`--pool`), and the bench needs root (it opens the published device).
//! The seed is printed on stderr first; `--seed` repeats a run's picks.

use super::blockio::{self, ReadOutcome};
use super::*;

#[derive(Args, Debug)]
pub struct ChangedBlocksArgs {
    /// The driver's socket: unix:///path/csi.sock or tcp://host:port.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        default_value = "unix:///run/localvol/csi.sock"
    )]
    pub endpoint: Endpoint,
    /// The driver's pool (a thin LVM pool), passed as CreateVolume's `pool` parameter.
    #[arg(long)]
    pub pool: String,
    /// Another CreateVolume parameter (repeatable).
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
    pub params: Vec<(String, String)>,
    /// Required capacity of the volume.
    #[arg(long, default_value = "1Gi", value_parser = parse_size_arg)]
    pub size: i64,
    /// Share of the volume overwritten between the two snapshots, in percent.
    #[arg(long, default_value_t = 1.0, value_parser = parse_percent)]
    pub changed_percent: f64,
    /// Size of each overwritten piece (a multiple of 4Ki).
    #[arg(long, default_value = "64Ki", value_parser = parse_size_arg)]
    pub chunk: i64,
    /// How many times the whole measurement is repeated; the report gives the median.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: u64,
    /// Seed of the offsets picked (round r uses seed + r). Default: from the clock.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where the run directory (staging and target paths) is made. Default: the temp dir.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Prefix of the volume and snapshot names.
    #[arg(long, default_value = "bench")]
    pub name_prefix: String,
    /// Per-RPC timeout in seconds (a metadata answer: read to its end).
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// A percentage above 0 and at most 100.
fn parse_percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 100.0 => Ok(p),
        _ => Err(format!(
            "{s:?}: expected a percentage, above 0 and at most 100"
        )),
    }
}

impl ChangedBlocksArgs {
    /// The scenarios' common settings: raw block volumes in `--pool`.
    fn common(&self) -> Common {
        let mut params = self.params.clone();
        params.push(("pool".to_owned(), self.pool.clone()));
        Common {
            endpoint: self.endpoint.clone(),
            work_dir: self.work_dir.clone(),
            size: self.size,
            params,
            fs_type: String::new(),
            rounds: self.rounds,
            server_pid: None,
            name_prefix: self.name_prefix.clone(),
            timeout: self.timeout,
            json: self.json,
            driver: Vec::new(),
            block: true,
        }
    }
}

/// What a round made, for its cleanup.
#[derive(Default)]
struct Made {
    source: Option<Vol>,
    restored: Option<Vol>,
    snapshots: Vec<String>,
}

/// One round's settings.
struct Round {
    index: u64,
    seed: u64,
    percent: f64,
    chunk: u64,
}

pub(super) async fn changed_blocks(a: &ChangedBlocksArgs) -> Outcome {
    let chunk = u64::try_from(a.chunk).unwrap_or(0);
    if chunk == 0 || chunk % blockio::ALIGN as u64 != 0 || a.chunk > a.size {
        return Err(format!(
            "--chunk must be a multiple of 4Ki, at most --size (got {})",
            a.chunk
        ));
    }
    client::param_map(Some(&a.pool), &a.params)?;
    let seed = a.seed.unwrap_or_else(clock_seed);
    eprintln!("localvol bench changed-blocks: seed {seed}");
    let common = a.common();
    let rounds = a.rounds;
    let percent = a.changed_percent;
    with_target(&common, |ctx, prefix, left, _t| async move {
        drop(left);
        let mut per_round = Vec::new();
        for index in 0..rounds {
            let r = Round {
                index,
                seed: seed.wrapping_add(index),
                percent,
                chunk,
            };
            let mut made = Made::default();
            let res = round(&ctx, &format!("{prefix}-r{index}"), &r, &mut made).await;
            let cleaned = cleanup(&ctx, made).await;
            match (res, cleaned) {
                (Ok(v), Ok(())) => per_round.push(v),
                (Err(e), Ok(())) => return Err(format!("round {index}: {e}")),
                (Ok(_), Err(c)) => return Err(format!("round {index}: cleanup: {c}")),
                (Err(e), Err(c)) => return Err(format!("round {index}: {e}\ncleanup: {c}")),
            }
        }
        Ok(report(&ctx, seed, percent, chunk, per_round))
    })
    .await
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A blocking I/O step on a thread of its own.
async fn io<T: Send + 'static>(
    what: String,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("{what}: {e}"))?
        .map_err(|e| format!("{what}: {e}"))
}

/// Opens a published device for O_DIRECT I/O.
fn open_dev(v: &Vol, write: bool) -> Result<std::fs::File, String> {
    blockio::open(&v.target, write, true)
        .map_err(|e| format!("opening the published device {:?}: {e}", v.target))
}

/// One round: the source volume, its two snapshots, the restore, both arms.
async fn round(ctx: &Ctx, p: &str, r: &Round, made: &mut Made) -> Result<Value, String> {
    let src = made.source.insert(ctx.create(format!("{p}-src")).await?.0);
    ctx.stage(src).await?;
    ctx.publish(src).await?;
    let f = open_dev(src, true)?;
    let size = io("sizing the device".into(), {
        let f = f.try_clone().map_err(|e| e.to_string())?;
        move || blockio::size_of(&f)
    })
    .await?;
    let base = blockio::splitmix(r.seed);
    let fill = io("writing the whole volume".into(), {
        let f = f.try_clone().map_err(|e| e.to_string())?;
        move || blockio::write_ranges(&f, &[(0, size)], base)
    })
    .await?;
    let src_id = src.id.clone();
    let snap_a = snapshot(ctx, &format!("{p}-a"), &src_id, made).await?;
    let count = blockio::chunk_count(size, r.chunk, r.percent);
    let chunks = blockio::pick_chunks(size, r.chunk, count, r.seed);
    let written: Vec<(u64, u64)> = chunks.iter().map(|&o| (o, r.chunk)).collect();
    let changed = blockio::splitmix(base);
    io("overwriting the chunks".into(), {
        let written = written.clone();
        move || blockio::write_ranges(&f, &written, changed)
    })
    .await?;
    let snap_b = snapshot(ctx, &format!("{p}-b"), &src_id, made).await?;
    let source = client::SourceArgs {
        from_snapshot: Some(snap_b.clone()),
        from_volume: None,
    }
    .to_csi();
    let restored = made
        .restored
        .insert(ctx.create_from(format!("{p}-restored"), source).await?.0);
    ctx.stage(restored).await?;
    ctx.publish(restored).await?;
    let dev = open_dev(restored, false)?;
    let arms = Arms {
        dev,
        base: snap_a,
        target: snap_b,
        written,
        changed,
    };
    let mut j = arms.measure(ctx, r.index % 2 == 1).await?;
    j["round"] = json!(r.index);
    j["seed"] = json!(r.seed);
    j["capacity_bytes"] = json!(size);
    j["fill_ms"] = json!(ms(fill));
    Ok(j)
}

/// CreateSnapshot of `source`; the snapshot is added to what the round made.
async fn snapshot(ctx: &Ctx, name: &str, source: &str, made: &mut Made) -> Result<String, String> {
    let mut ctl = ctx.clients.controller.clone();
    let req = csi::CreateSnapshotRequest {
        source_volume_id: source.to_owned(),
        name: name.to_owned(),
        secrets: HashMap::new(),
        parameters: HashMap::new(),
    };
    let r = client::call(ctx.clients.timeout, req, |r| ctl.create_snapshot(r))
        .await
        .map_err(|s| rpc_err(&format!("CreateSnapshot {name}"), s))?;
    let s = r
        .snapshot
        .ok_or_else(|| "CreateSnapshot answered without a snapshot".to_owned())?;
    made.snapshots.push(s.snapshot_id.clone());
    if !s.ready_to_use {
        return Err(format!("snapshot {} is not ready to use", s.snapshot_id));
    }
    Ok(s.snapshot_id)
}

/// The two ways of reading what changed from the restored device.
struct Arms {
    dev: std::fs::File,
    base: String,
    target: String,
    /// The chunks overwritten between the snapshots.
    written: Vec<(u64, u64)>,
    /// Their pattern's stream.
    changed: u64,
}

impl Arms {
    /// Both arms (the delta arm first with `delta_first`) and the checks.
    async fn measure(self, ctx: &Ctx, delta_first: bool) -> Result<Value, String> {
        let (full, delta) = if delta_first {
            let d = self.delta(ctx).await?;
            (self.full().await?, d)
        } else {
            let f = self.full().await?;
            (f, self.delta(ctx).await?)
        };
        let (runs, rpc, read) = delta;
        self.check(&runs).await?;
        let total = rpc + read.took;
        let written: u64 = self.written.iter().map(|(_, l)| l).sum();
        Ok(json!({
            "chunks_written": self.written.len(),
            "bytes_written": written,
            "runs": runs.runs.len(),
            "bytes_named": runs.bytes(),
            "named_over_written": runs.bytes() as f64 / written.max(1) as f64,
            "block_metadata_type": client::kind_name(runs.kind),
            "granularity_bytes": runs.granularity(),
            "delta_rpc_ms": ms(rpc),
            "delta_read_ms": ms(read.took),
            "delta_read_bytes": read.bytes,
            "delta_total_ms": ms(total),
            "delta_checksum": format!("{:016x}", read.checksum.0),
            "full_read_ms": ms(full.took),
            "full_read_bytes": full.bytes,
            "full_checksum": format!("{:016x}", full.checksum.0),
            "full_over_delta": ms(full.took) / ms(total).max(1e-6),
        }))
    }

    /// The whole device, in order.
    async fn full(&self) -> Result<ReadOutcome, String> {
        let f = self.dev.try_clone().map_err(|e| e.to_string())?;
        io("reading the whole restored device".into(), move || {
            let size = blockio::size_of(&f)?;
            blockio::read_ranges(&f, &[(0, size)])
        })
        .await
    }

    /// GetMetadataDelta read whole (timed), then its runs read (timed).
    async fn delta(&self, ctx: &Ctx) -> Result<(client::BlockRuns, Duration, ReadOutcome), String> {
        let start = Instant::now();
        let runs = client::delta(
            &ctx.clients,
            &self.base,
            &self.target,
            client::PagingArgs::default(),
        )
        .await
        .map_err(|s| rpc_err("GetMetadataDelta", s))?;
        let rpc = start.elapsed();
        let (f, merged) = (
            self.dev.try_clone().map_err(|e| e.to_string())?,
            runs.merged(),
        );
        let read = io("reading the delta's runs".into(), move || {
            blockio::read_ranges(&f, &merged)
        })
        .await?;
        Ok((runs, rpc, read))
    }

    /// Every chunk written is covered by the runs, and holds on the
    /// restored device what was written.
    async fn check(&self, runs: &client::BlockRuns) -> Result<(), String> {
        let chunk = self.written.first().map_or(0, |(_, l)| *l);
        let offsets: Vec<u64> = self.written.iter().map(|(o, _)| *o).collect();
        let missed = blockio::uncovered(&runs.merged(), &offsets, chunk);
        if let Some(first) = missed.first() {
            return Err(format!(
                "GetMetadataDelta missed {} of the {} chunks written (of {chunk} bytes), the first at offset {first}: a backup from it would lose data",
                missed.len(),
                offsets.len()
            ));
        }
        let (f, written, stream) = (
            self.dev.try_clone().map_err(|e| e.to_string())?,
            self.written.clone(),
            self.changed,
        );
        let bad = io("checking the restored chunks".into(), move || {
            blockio::first_mismatch(&f, &written, stream)
        })
        .await?;
        match bad {
            Some(o) => Err(format!(
                "the volume restored from the second snapshot does not hold the chunk written at offset {o}"
            )),
            None => Ok(()),
        }
    }
}

/// Unpublishes, unstages and deletes what a round made: the restored
/// volume, the snapshots (newest first), then their source. Every step is
/// tried; problems are printed, the first is returned.
async fn cleanup(ctx: &Ctx, made: Made) -> Result<(), String> {
    let mut errors = Vec::new();
    if let Some(v) = made.restored {
        errors.extend(ctx.remove(v).await.err());
    }
    for id in made.snapshots.iter().rev() {
        let mut ctl = ctx.clients.controller.clone();
        let req = csi::DeleteSnapshotRequest {
            snapshot_id: id.clone(),
            secrets: HashMap::new(),
        };
        let r = client::call(ctx.clients.timeout, req, |r| ctl.delete_snapshot(r)).await;
        errors.extend(r.err().map(|s| rpc_err(&format!("DeleteSnapshot {id}"), s)));
    }
    if let Some(v) = made.source {
        errors.extend(ctx.remove(v).await.err());
    }
    for e in &errors {
        eprintln!("localvol bench: cleanup: {e}");
    }
    errors.into_iter().next().map_or(Ok(()), Err)
}

/// The figures reported per round and as their median.
const FIGURES: [&str; 11] = [
    "chunks_written",
    "bytes_written",
    "runs",
    "bytes_named",
    "named_over_written",
    "delta_rpc_ms",
    "delta_read_ms",
    "delta_total_ms",
    "full_read_ms",
    "full_over_delta",
    "fill_ms",
];

/// The rounds' table (one row each, then their medians) and JSON object.
fn report(ctx: &Ctx, seed: u64, percent: f64, chunk: u64, rounds: Vec<Value>) -> (Value, String) {
    let mut j = json!({
        "mode": "changed-blocks",
        "size_bytes": ctx.size,
        "parameters": ctx.parameters.iter().collect::<std::collections::BTreeMap<_, _>>(),
        "changed_percent": percent,
        "chunk_bytes": chunk,
        "seed": seed,
        "direct_io": true,
    });
    for k in FIGURES {
        j[k] = json!(median_of(&rounds, k));
    }
    let first = rounds.first().cloned().unwrap_or(Value::Null);
    for k in ["capacity_bytes", "block_metadata_type", "granularity_bytes"] {
        j[k] = first[k].clone();
    }
    let row = |label: String, r: &Value| {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        vec![
            label,
            format!("{:.0}", f("chunks_written")),
            human(f("bytes_written") as u64),
            format!("{:.0}", f("runs")),
            human(f("bytes_named") as u64),
            f3(f("delta_rpc_ms")),
            f3(f("delta_read_ms")),
            f3(f("delta_total_ms")),
            f3(f("full_read_ms")),
            format!("{:.2}", f("full_over_delta")),
        ]
    };
    let mut rows: Vec<Vec<String>> = rounds
        .iter()
        .map(|r| row(r["round"].to_string(), r))
        .collect();
    rows.push(row("median".to_owned(), &j));
    let granularity = j["granularity_bytes"]
        .as_u64()
        .map_or("-".to_owned(), human);
    let mut h = format!(
        "localvol bench changed-blocks: {} raw block volume, {percent}% overwritten in {} chunks, seed {seed}, O_DIRECT reads\n",
        human(ctx.size as u64),
        human(chunk),
    );
    let _ = writeln!(
        h,
        "answers: {}, granularity {granularity} (the runs' common block)",
        j["block_metadata_type"].as_str().unwrap_or("-"),
    );
    h.push_str(&table(
        &[
            "round",
            "chunks",
            "written",
            "runs",
            "named",
            "delta rpc ms",
            "delta read ms",
            "delta ms",
            "full read ms",
            "full/delta",
        ],
        rows,
    ));
    j["rounds"] = json!(rounds);
    (j, h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_are_above_zero_and_at_most_100() {
        assert_eq!(parse_percent("1").unwrap(), 1.0);
        assert_eq!(parse_percent("0.5").unwrap(), 0.5);
        assert_eq!(parse_percent("100").unwrap(), 100.0);
        for bad in ["0", "-1", "100.1", "lots", "NaN"] {
            assert!(parse_percent(bad).is_err(), "{bad}");
        }
    }
}
