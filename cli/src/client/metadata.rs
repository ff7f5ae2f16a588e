//! `metadata allocated` and `metadata delta`: the SnapshotMetadata
//! service's two streaming calls, read to their end, and their runs printed
//! one a line. The reading ([`allocated`], [`delta`], [`BlockRuns`]) is
//! shared with `localvol bench changed-blocks`.

use super::*;

/// `metadata`'s two calls.
#[derive(Subcommand, Debug)]
pub enum MetadataCommand {
    /// GetMetadataAllocated: the byte ranges of a snapshot that hold data.
    Allocated {
        snapshot_id: String,
        #[command(flatten)]
        paging: PagingArgs,
    },
    /// GetMetadataDelta: the byte ranges that differ between two snapshots
    /// of one volume.
    Delta {
        base_snapshot_id: String,
        target_snapshot_id: String,
        #[command(flatten)]
        paging: PagingArgs,
    },
}

/// Where an answer starts and how many runs a message carries.
#[derive(Args, Debug, Default, Clone, Copy)]
pub struct PagingArgs {
    /// First byte asked about (the driver may round it down to its block).
    #[arg(long, default_value = "0", value_parser = parse_size_arg)]
    pub starting_offset: i64,
    /// Runs per message (0: the driver chooses).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    pub max_results: i32,
    /// Print the runs sorted, adjacent ones joined (a FIXED_LENGTH answer's
    /// blocks become extents); the summary still counts what was sent.
    #[arg(long)]
    pub merged: bool,
}

/// A whole answer: every message's runs in the order they came, and what
/// the messages said of the volume.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlockRuns {
    /// `BlockMetadataType` as sent (the same in every message).
    pub kind: i32,
    /// `volume_capacity_bytes` (the same in every message).
    pub capacity: i64,
    /// `(byte_offset, size_bytes)` of each run.
    pub runs: Vec<(u64, u64)>,
    pub messages: usize,
}

impl BlockRuns {
    /// Adds one message of the stream; a message whose type or capacity
    /// differs from the first one's, or a negative offset or size, is an
    /// error (the driver broke the spec).
    pub fn add(
        &mut self,
        kind: i32,
        capacity: i64,
        tuples: &[csi::BlockMetadata],
    ) -> Result<(), String> {
        if self.messages > 0 && (kind, capacity) != (self.kind, self.capacity) {
            return Err(format!(
                "message {} says {} and capacity {capacity}, the first said {} and {}",
                self.messages + 1,
                kind_name(kind),
                kind_name(self.kind),
                self.capacity
            ));
        }
        (self.kind, self.capacity) = (kind, capacity);
        for t in tuples {
            match (u64::try_from(t.byte_offset), u64::try_from(t.size_bytes)) {
                (Ok(o), Ok(l)) => self.runs.push((o, l)),
                _ => {
                    return Err(format!(
                        "a run with a negative offset or size: ({}, {})",
                        t.byte_offset, t.size_bytes
                    ))
                }
            }
        }
        self.messages += 1;
        Ok(())
    }

    /// The bytes the runs name (overlaps counted twice).
    pub fn bytes(&self) -> u64 {
        self.runs.iter().map(|(_, l)| l).sum()
    }

    /// The runs sorted, with overlapping and adjacent ones joined: the
    /// fewest reads that cover them (a FIXED_LENGTH answer becomes a few
    /// long runs; empty runs are dropped).
    pub fn merged(&self) -> Vec<(u64, u64)> {
        let mut sorted: Vec<(u64, u64)> =
            self.runs.iter().copied().filter(|(_, l)| *l > 0).collect();
        sorted.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
        for (o, l) in sorted {
            match out.last_mut() {
                Some((po, pl)) if o <= *po + *pl => *pl = (*pl).max(o + l - *po),
                _ => out.push((o, l)),
            }
        }
        out
    }

    /// The largest length every run's offset and length (but the length of
    /// a run that ends the volume) is a multiple of: the answers' block
    /// length, or a multiple of it. `None` without runs.
    pub fn granularity(&self) -> Option<u64> {
        let end = u64::try_from(self.capacity).unwrap_or(u64::MAX);
        let g = self.runs.iter().fold(0, |g, &(o, l)| {
            let g = gcd(g, o);
            if o + l >= end {
                g
            } else {
                gcd(g, l)
            }
        });
        match (g, self.runs.first()) {
            (_, None) => None,
            // One run from 0 to the end: only its length says anything.
            (0, Some(&(_, l))) => Some(l),
            (g, _) => Some(g),
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The proto name of a `BlockMetadataType` value.
pub fn kind_name(kind: i32) -> String {
    csi::BlockMetadataType::try_from(kind)
        .map(|k| k.as_str_name().to_owned())
        .unwrap_or_else(|_| kind.to_string())
}

/// Reads a stream to its end within `timeout` (from the call's start).
async fn read_all<T>(
    timeout: Duration,
    start: impl Future<Output = Result<Response<tonic::Streaming<T>>, Status>>,
    parts: fn(T) -> (i32, i64, Vec<csi::BlockMetadata>),
) -> Result<BlockRuns, Status> {
    let whole = async {
        let mut s = start.await?.into_inner();
        let mut runs = BlockRuns::default();
        while let Some(m) = s.message().await? {
            let (kind, capacity, tuples) = parts(m);
            runs.add(kind, capacity, &tuples)
                .map_err(|e| Status::internal(format!("the driver's answer: {e}")))?;
        }
        Ok(runs)
    };
    tokio::time::timeout(timeout, whole)
        .await
        .unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(format!(
                "the answer did not end within {} s",
                timeout.as_secs_f64()
            )))
        })
}

/// GetMetadataAllocated of `snapshot_id`, read whole.
pub async fn allocated(
    c: &Clients,
    snapshot_id: &str,
    paging: PagingArgs,
) -> Result<BlockRuns, Status> {
    let mut m = c.metadata.clone();
    let mut req = Request::new(csi::GetMetadataAllocatedRequest {
        snapshot_id: snapshot_id.to_owned(),
        starting_offset: paging.starting_offset,
        max_results: paging.max_results,
        secrets: HashMap::new(),
    });
    req.set_timeout(c.timeout);
    read_all(c.timeout, m.get_metadata_allocated(req), |r| {
        (
            r.block_metadata_type,
            r.volume_capacity_bytes,
            r.block_metadata,
        )
    })
    .await
}

/// GetMetadataDelta from `base` to `target`, read whole.
pub async fn delta(
    c: &Clients,
    base: &str,
    target: &str,
    paging: PagingArgs,
) -> Result<BlockRuns, Status> {
    let mut m = c.metadata.clone();
    let mut req = Request::new(csi::GetMetadataDeltaRequest {
        base_snapshot_id: base.to_owned(),
        target_snapshot_id: target.to_owned(),
        starting_offset: paging.starting_offset,
        max_results: paging.max_results,
        secrets: HashMap::new(),
    });
    req.set_timeout(c.timeout);
    read_all(c.timeout, m.get_metadata_delta(req), |r| {
        (
            r.block_metadata_type,
            r.volume_capacity_bytes,
            r.block_metadata,
        )
    })
    .await
}

/// `metadata allocated|delta`: the call, its runs printed.
pub(super) async fn cmd_metadata(
    c: &Clients,
    cmd: &MetadataCommand,
) -> Result<Output, ClientError> {
    let runs = match cmd {
        MetadataCommand::Allocated {
            snapshot_id,
            paging,
        } => allocated(c, snapshot_id, *paging).await,
        MetadataCommand::Delta {
            base_snapshot_id,
            target_snapshot_id,
            paging,
        } => delta(c, base_snapshot_id, target_snapshot_id, *paging).await,
    }
    .map_err(ClientError::Rpc)?;
    let merged = match cmd {
        MetadataCommand::Allocated { paging, .. } | MetadataCommand::Delta { paging, .. } => {
            paging.merged
        }
    };
    Ok(metadata_output(&runs, merged))
}

/// An answer as the documented JSON object, and as text: `OFFSET LENGTH`
/// (bytes) a line, then a summary line; with `merged`, the runs joined.
pub fn metadata_output(r: &BlockRuns, merged: bool) -> Output {
    let runs = if merged { r.merged() } else { r.runs.clone() };
    let mut text: String = runs.iter().map(|(o, l)| format!("{o} {l}\n")).collect();
    let granularity = r.granularity();
    text.push_str(&format!(
        "# {} runs, {} bytes ({}), volume capacity {} ({}), {}, granularity {}, {} messages\n",
        r.runs.len(),
        r.bytes(),
        human(r.bytes()),
        r.capacity,
        bytes_h(r.capacity),
        kind_name(r.kind),
        granularity.map_or("-".to_owned(), human),
        r.messages
    ));
    Output {
        json: json!({
            "block_metadata_type": kind_name(r.kind),
            "volume_capacity_bytes": r.capacity,
            "runs": runs.iter().map(|(o, l)| json!({"byte_offset": o, "size_bytes": l})).collect::<Vec<_>>(),
            "run_count": r.runs.len(),
            "bytes": r.bytes(),
            "granularity_bytes": granularity,
            "messages": r.messages,
        }),
        human: text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VAR: i32 = csi::BlockMetadataType::VariableLength as i32;
    const FIXED: i32 = csi::BlockMetadataType::FixedLength as i32;

    fn t(o: i64, l: i64) -> csi::BlockMetadata {
        csi::BlockMetadata {
            byte_offset: o,
            size_bytes: l,
        }
    }

    #[test]
    fn messages_join_into_one_answer_and_must_agree() {
        let mut r = BlockRuns::default();
        r.add(VAR, 1 << 20, &[t(0, 4096), t(65536, 8192)]).unwrap();
        r.add(VAR, 1 << 20, &[]).unwrap();
        r.add(VAR, 1 << 20, &[t(131072, 4096)]).unwrap();
        assert_eq!(r.runs, [(0, 4096), (65536, 8192), (131072, 4096)]);
        assert_eq!((r.messages, r.bytes()), (3, 16384));
        let e = r.add(VAR, 2 << 20, &[]).unwrap_err();
        assert!(e.contains("message 4") && e.contains("2097152"), "{e}");
        assert!(r.clone().add(FIXED, 1 << 20, &[]).is_err());
        assert!(r.add(VAR, 1 << 20, &[t(-1, 5)]).is_err());
    }

    #[test]
    fn merged_joins_adjacent_and_overlapping_runs_in_order() {
        let r = BlockRuns {
            kind: FIXED,
            capacity: 100,
            runs: vec![(20, 10), (0, 10), (10, 10), (50, 0), (60, 10), (65, 20)],
            messages: 1,
        };
        assert_eq!(r.merged(), [(0, 30), (60, 25)]);
        assert_eq!(BlockRuns::default().merged(), []);
    }

    #[test]
    fn granularity_is_the_runs_common_block() {
        let k = 65536;
        let r = |runs: Vec<(u64, u64)>, capacity: i64| BlockRuns {
            kind: VAR,
            capacity,
            runs,
            messages: 1,
        };
        assert_eq!(
            r(vec![(k, 2 * k), (5 * k, k)], 1 << 30).granularity(),
            Some(k)
        );
        // The last run ends with the volume: its length is not a multiple.
        assert_eq!(
            r(vec![(2 * k, 2 * k), (8 * k, 1000)], (8 * k + 1000) as i64).granularity(),
            Some(2 * k)
        );
        assert_eq!(r(vec![(0, 12345)], 12345).granularity(), Some(12345));
        assert_eq!(r(vec![], 12345).granularity(), None);
    }

    #[test]
    fn output_has_a_line_per_run_then_a_summary() {
        let r = BlockRuns {
            kind: VAR,
            capacity: 1 << 30,
            runs: vec![(0, 65536), (1 << 20, 131072)],
            messages: 2,
        };
        let out = metadata_output(&r, false);
        assert_eq!(
            out.human,
            "0 65536\n1048576 131072\n# 2 runs, 196608 bytes (192Ki), volume capacity 1073741824 (1Gi), VARIABLE_LENGTH, granularity 64Ki, 2 messages\n"
        );
        assert_eq!(
            out.json,
            json!({"block_metadata_type": "VARIABLE_LENGTH", "volume_capacity_bytes": 1 << 30,
                   "runs": [{"byte_offset": 0, "size_bytes": 65536}, {"byte_offset": 1 << 20, "size_bytes": 131072}],
                   "run_count": 2, "bytes": 196608, "granularity_bytes": 65536, "messages": 2})
        );
        // Merged: the runs as extents; the summary counts what was sent.
        let fixed = BlockRuns {
            kind: FIXED,
            capacity: 1 << 20,
            runs: vec![(0, 4096), (4096, 4096), (65536, 4096)],
            messages: 1,
        };
        let out = metadata_output(&fixed, true);
        assert!(
            out.human
                .starts_with("0 8192\n65536 4096\n# 3 runs, 12288 bytes"),
            "{}",
            out.human
        );
        assert_eq!(out.json["runs"].as_array().unwrap().len(), 2);
        assert_eq!(out.json["run_count"], json!(3));
        assert_eq!(kind_name(7), "7");
    }
}
