//! A thin pool's own block maps, read from its metadata: which data blocks
//! a thin device maps (`thin_dump`), and which differ between two thin
//! devices (`thin_delta`), in time proportional to the metadata, not the
//! data. Both tools read the pool's metadata device while the pool runs,
//! so they read the pool's *metadata snapshot* (`--metadata-snap`): a
//! frozen copy the kernel keeps while it is reserved
//! (`dmsetup message <pool> 0 reserve_metadata_snap`) and frees when it is
//! released (`release_metadata_snap`). A pool holds at most one; the pool
//! layer takes it, serialises its users and releases it
//! (`pool/lvm/blockmap.rs`).
//!
//! The tools' XML is read as it comes ([`crate::command::Streaming`]): a
//! volume of terabytes has millions of mappings, which are never held
//! together. The formats, as thin-provisioning-tools 0.9.0 writes them
//! (one element a line; 1.x writes the same elements):
//!
//! ```text
//! <superblock uuid="" time="1" transaction="2" flags="0" version="2" data_block_size="128" nr_data_blocks="0">
//!   <device dev_id="1" mapped_blocks="6" transaction="0" creation_time="0" snap_time="1">
//!     <range_mapping origin_begin="0" data_begin="0" length="4" time="0"/>
//!     <single_mapping origin_block="10" data_block="4" time="0"/>
//!   </device>
//! </superblock>
//!
//! <superblock uuid="" time="1" transaction="2" data_block_size="128" nr_data_blocks="0">
//!   <diff left="1" right="2">
//!     <same begin="0" length="2"/>
//!     <different begin="2" length="1"/>
//!     <left_only begin="12" length="1"/>
//!     <right_only begin="20" length="1"/>
//!   </diff>
//! </superblock>
//! ```
//!
//! `data_block_size` is in 512-byte sectors; every position is in those
//! blocks. A block is *changed* when it is `different`, `right_only` (new
//! data) or `left_only` (discarded since: it reads as zeroes now).

use std::path::Path;
use std::time::Duration;

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use tokio::io::{AsyncBufRead, BufReader};

use super::LvmError;
use crate::command::{Cmd, CommandError, Streaming};

/// How long a `dmsetup message` may take (the kernel answers at once; a
/// pool suspended by a hung lvm does not).
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a metadata tool may go without writing a line (a hung metadata
/// device); the whole dump may take as long as its reader takes.
const TOOL_STALL: Duration = Duration::from_secs(120);

/// Sends `message` to the thin pool's mapping `pool` (`<vg>-<pool>-tpool`,
/// or `<vg>-<pool>` while no thin volume is active).
async fn message(pool: &str, message: &str) -> Result<(), LvmError> {
    Cmd::new("dmsetup")
        .args(["message", pool, "0", message])
        .timeout(MESSAGE_TIMEOUT)
        .run()
        .await
        .map(|_| ())
        .map_err(LvmError::Command)
}

/// Takes the pool's metadata snapshot (the kernel refuses a second one:
/// "Device or resource busy").
pub(crate) async fn reserve_metadata_snap(pool: &str) -> Result<(), LvmError> {
    message(pool, "reserve_metadata_snap").await
}

/// Releases the pool's metadata snapshot (the kernel refuses when there is
/// none: "Invalid argument").
pub(crate) async fn release_metadata_snap(pool: &str) -> Result<(), LvmError> {
    message(pool, "release_metadata_snap").await
}

/// Deletes thin device `id` from the pool's metadata (see
/// [`orphan_device`]: only a device no LV has).
pub(crate) async fn delete_device(pool: &str, id: u64) -> Result<(), LvmError> {
    message(pool, &format!("delete {id}")).await
}

/// The thin device id an `lvcreate` failed on because the pool's metadata
/// already holds a device of that id. lvm sends the kernel its message
/// (`create_thin N`, `create_snap N O`) before it commits the VG's
/// metadata; an lvm killed between the two leaves device N in the pool and
/// in no LV, and lvm hands out N again. A new thin volume's create replaces
/// such a device itself (seen in the VM); a snapshot's (a thin snapshot, a
/// thin restore or clone) fails with "Thin pool … already contain thin
/// device with device_id N", on every try until the device goes.
pub(crate) fn orphan_device(e: &LvmError) -> Option<u64> {
    let LvmError::Command(c) = e else {
        return None;
    };
    let stderr = c.stderr();
    let (_, after) = stderr.split_once("already contain thin device with device_id ")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Consecutive data blocks of a thin device: `length` blocks from `begin`
/// (in the pool's data blocks, from the device's start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub begin: u64,
    pub length: u64,
}

impl Run {
    fn end(&self) -> u64 {
        self.begin.saturating_add(self.length)
    }
}

/// What a reader of the tools' output ends with: the tool's exit (a
/// process), or nothing (a test's bytes).
pub(crate) trait Ends: AsyncBufRead + Unpin + Send {
    fn end(self) -> impl std::future::Future<Output = Result<(), CommandError>> + Send;
}

impl Ends for BufReader<Streaming> {
    fn end(self) -> impl std::future::Future<Output = Result<(), CommandError>> + Send {
        self.into_inner().finish()
    }
}

impl Ends for std::io::Cursor<Vec<u8>> {
    async fn end(self) -> Result<(), CommandError> {
        Ok(())
    }
}

/// Which answer is read, and of which thin devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Query {
    /// `thin_dump --dev-id N`: the blocks device N maps.
    Mapped(u64),
    /// `thin_delta --snap1 A --snap2 B`: the blocks that differ.
    Changed(u64, u64),
}

/// The runs of one answer, in ascending order, adjacent ones merged, read
/// from the tool's output as the caller asks for them ([`BlockRuns::next`]).
pub struct BlockRuns<R: Ends = BufReader<Streaming>> {
    /// None once the output was read to its end.
    reader: Option<Reader<R>>,
    buf: Vec<u8>,
    query: Query,
    /// The pool's data block, in 512-byte sectors (`data_block_size`).
    block_sectors: u64,
    /// The device's element (`device`, `diff`) was seen.
    found: bool,
    /// Inside a verbose `different`/`left_only`/`right_only` element.
    in_changed: bool,
    /// A run read but not yet handed out (the next may extend it).
    pending: Option<Run>,
    /// Where the last run handed out ended: each must start after it.
    last_end: u64,
    program: &'static str,
}

impl BlockRuns {
    /// The data blocks thin device `dev_id` maps, from the metadata
    /// snapshot of the pool whose metadata device is `tmeta`.
    pub(crate) async fn mapped(tmeta: &Path, dev_id: u64) -> Result<Self, LvmError> {
        let out = Cmd::new("thin_dump")
            .args(["--metadata-snap", "--dev-id", &dev_id.to_string()])
            .arg(tmeta)
            .timeout(TOOL_STALL)
            .stream()
            .map_err(LvmError::Command)?;
        BlockRuns::start(BufReader::new(out), Query::Mapped(dev_id), "thin_dump").await
    }

    /// The data blocks that differ between thin devices `base` and
    /// `target`, from the metadata snapshot of the pool whose metadata
    /// device is `tmeta`.
    pub(crate) async fn changed(tmeta: &Path, base: u64, target: u64) -> Result<Self, LvmError> {
        let out = Cmd::new("thin_delta")
            .args(["--metadata-snap", "--snap1", &base.to_string()])
            .args(["--snap2", &target.to_string()])
            .arg(tmeta)
            .timeout(TOOL_STALL)
            .stream()
            .map_err(LvmError::Command)?;
        let query = Query::Changed(base, target);
        BlockRuns::start(BufReader::new(out), query, "thin_delta").await
    }
}

fn parse_error(program: &str, what: String) -> LvmError {
    LvmError::Parse(format!("{program}: {what}"))
}

/// A numeric attribute of an element.
fn number(program: &str, e: &BytesStart<'_>, name: &str) -> Result<u64, LvmError> {
    let element = e.name().as_ref().to_owned();
    let attr = e
        .try_get_attribute(name)
        .map_err(|err| parse_error(program, format!("<{element}>: {err}")))?
        .ok_or_else(|| parse_error(program, format!("<{element}> has no {name}")))?;
    attr.value.trim().parse().map_err(|_| {
        parse_error(
            program,
            format!("<{element}> {name}={:?} is not a number", attr.value),
        )
    })
}

impl<R: Ends> BlockRuns<R> {
    /// Reads the output up to its `superblock` element (which gives the
    /// block size), so that a tool that cannot start fails here.
    async fn start(reader: R, query: Query, program: &'static str) -> Result<Self, LvmError> {
        let mut runs = BlockRuns {
            reader: Some(Reader::from_reader(reader)),
            buf: Vec::new(),
            query,
            block_sectors: 0,
            found: false,
            in_changed: false,
            pending: None,
            last_end: 0,
            program,
        };
        while runs.block_sectors == 0 {
            if runs.step().await?.is_none() && runs.reader.is_none() {
                return Err(parse_error(program, "no superblock in the output".into()));
            }
        }
        Ok(runs)
    }

    /// The pool's data block, in bytes.
    pub fn block_bytes(&self) -> u64 {
        self.block_sectors.saturating_mul(512)
    }

    /// The next run of blocks (None: the answer is complete and the tool
    /// exited 0).
    pub async fn next(&mut self) -> Result<Option<Run>, LvmError> {
        loop {
            let Some(run) = self.step().await? else {
                if self.reader.is_some() {
                    continue;
                }
                return Ok(self.pending.take());
            };
            if run.length == 0 {
                continue;
            }
            match self.pending {
                Some(p) if p.end() == run.begin => {
                    self.pending = Some(Run {
                        begin: p.begin,
                        length: p.length + run.length,
                    })
                }
                Some(p) => {
                    self.pending = Some(run);
                    return Ok(Some(p));
                }
                None => self.pending = Some(run),
            }
        }
    }

    /// Reads one event: a run it names, or None (another element, or the
    /// end: then `reader` is None).
    async fn step(&mut self) -> Result<Option<Run>, LvmError> {
        let program = self.program;
        let Some(reader) = self.reader.as_mut() else {
            return Ok(None);
        };
        self.buf.clear();
        let mut st = State {
            program,
            query: self.query,
            block_sectors: &mut self.block_sectors,
            found: &mut self.found,
            in_changed: &mut self.in_changed,
        };
        let outcome = match reader.read_event_into_async(&mut self.buf).await {
            Ok(Event::Start(e)) => Outcome::Run(element(&mut st, &e, true)?),
            Ok(Event::Empty(e)) => Outcome::Run(element(&mut st, &e, false)?),
            Ok(Event::End(e)) => {
                let name = e.name();
                if matches!(name.as_ref(), "different" | "left_only" | "right_only") {
                    *st.in_changed = false;
                }
                Outcome::Run(None)
            }
            Ok(Event::Eof) => Outcome::Eof,
            Ok(_) => Outcome::Run(None),
            Err(quick_xml::Error::Io(io)) => {
                Outcome::Io(std::io::Error::new(io.kind(), io.to_string()))
            }
            Err(e) => return Err(parse_error(program, e.to_string())),
        };
        let run = match outcome {
            Outcome::Run(run) => run,
            Outcome::Eof => {
                self.finish().await?;
                None
            }
            Outcome::Io(e) => return Err(self.io_error(e)),
        };
        if let Some(r) = run {
            if r.begin < self.last_end {
                return Err(parse_error(
                    program,
                    format!(
                        "blocks out of order: {} after a run that ended at {}",
                        r.begin, self.last_end
                    ),
                ));
            }
            self.last_end = r.end();
        }
        Ok(run)
    }

    /// A failed read of the output: the tool's own failure when it says
    /// one (its exit and stderr), else the read's.
    fn io_error(&mut self, e: std::io::Error) -> LvmError {
        self.reader = None;
        let timed_out = e.kind() == std::io::ErrorKind::TimedOut;
        LvmError::Command(if timed_out {
            CommandError::Timeout {
                program: self.program.to_owned(),
                after: TOOL_STALL,
            }
        } else {
            CommandError::Output {
                program: self.program.to_owned(),
                source: e,
            }
        })
    }

    /// The output ended: the tool must have exited 0 and named the device.
    async fn finish(&mut self) -> Result<(), LvmError> {
        if let Some(reader) = self.reader.take() {
            reader.into_inner().end().await.map_err(LvmError::Command)?;
        }
        if self.block_sectors == 0 {
            return Err(parse_error(
                self.program,
                "no superblock in the output".into(),
            ));
        }
        if !self.found {
            return Err(parse_error(
                self.program,
                match self.query {
                    Query::Mapped(n) => format!("thin device {n} is not in the metadata snapshot"),
                    Query::Changed(a, b) => format!("no diff of thin devices {a} and {b}"),
                },
            ));
        }
        Ok(())
    }
}

/// What one event of the output came to.
enum Outcome {
    Run(Option<Run>),
    Eof,
    Io(std::io::Error),
}

/// What an element changes of a [`BlockRuns`] being read.
struct State<'a> {
    program: &'static str,
    query: Query,
    block_sectors: &'a mut u64,
    found: &'a mut bool,
    in_changed: &'a mut bool,
}

/// One element of the output: the run it names, if any. Unknown elements
/// are an error, never skipped: a mapping in a form this reader does not
/// know would otherwise go missing from the answer.
fn element(st: &mut State<'_>, e: &BytesStart<'_>, opens: bool) -> Result<Option<Run>, LvmError> {
    let p = st.program;
    let run = |begin: &str, length: Option<&str>| -> Result<Option<Run>, LvmError> {
        Ok(Some(Run {
            begin: number(p, e, begin)?,
            length: match length {
                Some(l) => number(p, e, l)?,
                None => 1,
            },
        }))
    };
    let name = e.name();
    match (st.query, name.as_ref()) {
        (_, "superblock") => {
            *st.block_sectors = number(p, e, "data_block_size")?;
            if *st.block_sectors == 0 {
                return Err(parse_error(p, "data_block_size is 0".into()));
            }
            Ok(None)
        }
        (Query::Mapped(n), "device") => {
            let id = number(p, e, "dev_id")?;
            if id != n || *st.found {
                return Err(parse_error(
                    p,
                    format!("device {id} where {n} was asked for"),
                ));
            }
            *st.found = true;
            Ok(None)
        }
        (Query::Mapped(_), "range_mapping") if *st.found => run("origin_begin", Some("length")),
        (Query::Mapped(_), "single_mapping") if *st.found => run("origin_block", None),
        (Query::Changed(a, b), "diff") => {
            let (left, right) = (number(p, e, "left")?, number(p, e, "right")?);
            if (left, right) != (a, b) || *st.found {
                return Err(parse_error(
                    p,
                    format!("diff of {left} and {right} where {a} and {b} were asked for"),
                ));
            }
            *st.found = true;
            Ok(None)
        }
        (Query::Changed(..), "same") if *st.found => Ok(None),
        (Query::Changed(..), "different" | "left_only" | "right_only") if *st.found => {
            if opens {
                // `--verbose`: the ranges are inner `range` elements.
                *st.in_changed = true;
                return Ok(None);
            }
            run("begin", Some("length"))
        }
        (Query::Changed(..), "range") if *st.found => match *st.in_changed {
            true => run("begin", Some("length")),
            false => Ok(None),
        },
        (_, other) => Err(parse_error(p, format!("unexpected element <{other}>"))),
    }
}

#[cfg(test)]
mod tests;
