//! The one module that runs the `lvm` binary.
//!
//! Every call goes through [`crate::command::Cmd`] (so `LC_ALL=C`, a timeout and
//! kill-on-drop: a cancelled RPC never leaves an `lvcreate` running) and asks
//! for JSON reports in bytes (`--reportformat json --units b --nosuffix`).
//! Failures are classified from lvm's stderr into [`LvmError`] kinds, which
//! the pool layer wraps (and `service/status.rs` answers NOT_FOUND,
//! RESOURCE_EXHAUSTED, ALREADY_EXISTS for).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;

use crate::command::{Cmd, CommandError};

/// Limit for one lvm call. Metadata operations take well under a second; the
/// limit only catches a hung device.
const LVM_TIMEOUT: Duration = Duration::from_secs(60);

const LV_FIELDS: &str =
    "lv_name,vg_name,lv_size,lv_tags,lv_attr,pool_lv,origin,data_percent,metadata_percent,lv_path,lv_device_open,lv_time";
const VG_FIELDS: &str = "vg_name,vg_uuid,vg_size,vg_free,vg_extent_size,vg_free_count,vg_tags";

#[derive(Debug, thiserror::Error)]
pub enum LvmError {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("not enough space: {0}")]
    InsufficientSpace(String),
    #[error("already exists: {0}")]
    AlreadyExists(String),
    #[error("unexpected lvm output: {0}")]
    Parse(String),
    #[error(transparent)]
    Command(CommandError),
}

/// Sorts an lvm failure by what its stderr says.
pub fn classify(err: CommandError) -> LvmError {
    let stderr = err.stderr();
    let line = stderr
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("WARNING"))
        .unwrap_or("")
        .to_owned();
    let lower = stderr.to_ascii_lowercase();
    if lower.contains("insufficient free space")
        || lower.contains("insufficient suitable allocatable extents")
        || lower.contains("insufficient free extents")
        || lower.contains("not enough free space")
    {
        LvmError::InsufficientSpace(line)
    } else if lower.contains("already exists") {
        LvmError::AlreadyExists(line)
    } else if lower.contains("not found") || lower.contains("failed to find") {
        LvmError::NotFound(line)
    } else {
        LvmError::Command(err)
    }
}

/// A volume group as `vgs` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VgInfo {
    pub name: String,
    /// The VG's UUID (`vg_uuid`): stays with its disks whatever the node.
    pub uuid: String,
    pub size: u64,
    pub free: u64,
    pub extent_size: u64,
    pub free_extents: u64,
    pub tags: Vec<String>,
}

/// A logical volume as `lvs` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct LvInfo {
    pub name: String,
    pub vg: String,
    pub size: u64,
    pub tags: Vec<String>,
    /// The ten `lv_attr` characters (`lvs(8)`).
    pub attr: String,
    pub pool_lv: String,
    pub origin: String,
    pub data_percent: Option<f64>,
    pub metadata_percent: Option<f64>,
    pub path: String,
    /// Something holds the device open (a mount, a process, a holder device).
    pub open: bool,
    /// Creation time, seconds since the epoch (0 when lvm did not say).
    pub created_unix: u64,
}

impl LvInfo {
    fn attr_char(&self, i: usize) -> char {
        self.attr.chars().nth(i).unwrap_or('-')
    }
    /// A thin pool (`t`).
    pub fn is_thin_pool(&self) -> bool {
        self.attr_char(0) == 't'
    }
    /// A thin volume (`V`), including thin snapshots.
    pub fn is_thin_volume(&self) -> bool {
        self.attr_char(0) == 'V'
    }
    /// A thick copy-on-write snapshot (`s`).
    pub fn is_cow_snapshot(&self) -> bool {
        self.attr_char(0) == 's'
    }
    /// A thin pool that zeroes each data block it provisions before a thin
    /// volume sees it (`z`, the pool's `--zero y`, LVM's default).
    pub fn zeroes_new_blocks(&self) -> bool {
        self.attr_char(7) == 'z'
    }
    /// Whether the device is active (state `a`).
    pub fn is_active(&self) -> bool {
        self.attr_char(4) == 'a'
    }
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t == tag)
    }
    /// The value of the first `key=value` tag with this key.
    pub fn tag_value(&self, key: &str) -> Option<&str> {
        self.tags
            .iter()
            .find_map(|t| t.strip_prefix(key)?.strip_prefix('='))
    }
}

#[derive(Deserialize)]
struct Report<T> {
    report: Vec<T>,
}
#[derive(Deserialize)]
struct LvSection {
    #[serde(default)]
    lv: Vec<RawLv>,
}
#[derive(Deserialize)]
struct VgSection {
    #[serde(default)]
    vg: Vec<RawVg>,
}
#[derive(Deserialize)]
struct PvSection {
    #[serde(default)]
    pv: Vec<RawPv>,
}
#[derive(Deserialize)]
struct RawPv {
    pv_name: String,
    #[serde(default)]
    vg_name: String,
}
#[derive(Deserialize)]
struct RawLv {
    lv_name: String,
    vg_name: String,
    lv_size: String,
    #[serde(default)]
    lv_tags: String,
    #[serde(default)]
    lv_attr: String,
    #[serde(default)]
    pool_lv: String,
    #[serde(default)]
    origin: String,
    #[serde(default)]
    data_percent: String,
    #[serde(default)]
    metadata_percent: String,
    #[serde(default)]
    lv_path: String,
    #[serde(default)]
    lv_device_open: String,
    #[serde(default)]
    lv_time: String,
    /// The VG's fields, in [`lvs_and_vg`]'s report only.
    #[serde(default)]
    vg_uuid: String,
    #[serde(default)]
    vg_size: String,
    #[serde(default)]
    vg_free: String,
    #[serde(default)]
    vg_extent_size: String,
    #[serde(default)]
    vg_free_count: String,
    #[serde(default)]
    vg_tags: String,
}
#[derive(Deserialize)]
struct RawVg {
    vg_name: String,
    #[serde(default)]
    vg_uuid: String,
    vg_size: String,
    vg_free: String,
    vg_extent_size: String,
    vg_free_count: String,
    #[serde(default)]
    vg_tags: String,
}

fn num(field: &str, v: &str) -> Result<u64, LvmError> {
    v.trim()
        .parse()
        .map_err(|_| LvmError::Parse(format!("{field} = {v:?} is not a byte count")))
}

fn percent(v: &str) -> Option<f64> {
    let v = v.trim();
    if v.is_empty() {
        None
    } else {
        v.parse().ok()
    }
}

fn tags(v: &str) -> Vec<String> {
    v.split(',')
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Parses lvm's `lv_time` (`2026-11-22 03:05:21 +0000`) into Unix seconds.
pub fn parse_lv_time(s: &str) -> Option<u64> {
    let mut parts = s.split_whitespace();
    let (date, time, zone) = (
        parts.next()?,
        parts.next()?,
        parts.next().unwrap_or("+0000"),
    );
    let d: Vec<i64> = date
        .split('-')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let t: Vec<i64> = time
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if d.len() != 3 || t.len() != 3 || zone.len() != 5 {
        return None;
    }
    let (y, m, day) = (d[0], d[1], d[2]);
    // Days from 1970-01-01 to the civil date (proleptic Gregorian).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let sign = if zone.starts_with('-') { -1 } else { 1 };
    let off =
        sign * (zone[1..3].parse::<i64>().ok()? * 3600 + zone[3..5].parse::<i64>().ok()? * 60);
    u64::try_from(days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2] - off).ok()
}

/// Parses `lvs --reportformat json --units b --nosuffix` output.
pub fn parse_lvs(json: &str) -> Result<Vec<LvInfo>, LvmError> {
    lv_rows(json)?.into_iter().map(lv_of).collect()
}

fn lv_rows(json: &str) -> Result<Vec<RawLv>, LvmError> {
    let r: Report<LvSection> =
        serde_json::from_str(json).map_err(|e| LvmError::Parse(format!("lvs JSON: {e}")))?;
    Ok(r.report.into_iter().flat_map(|s| s.lv).collect())
}

fn lv_of(l: RawLv) -> Result<LvInfo, LvmError> {
    Ok(LvInfo {
        size: num("lv_size", &l.lv_size)?,
        tags: tags(&l.lv_tags),
        data_percent: percent(&l.data_percent),
        metadata_percent: percent(&l.metadata_percent),
        name: l.lv_name,
        vg: l.vg_name,
        attr: l.lv_attr,
        pool_lv: l.pool_lv,
        origin: l.origin,
        path: l.lv_path,
        open: l.lv_device_open == "open",
        created_unix: parse_lv_time(&l.lv_time).unwrap_or(0),
    })
}

/// Parses [`lvs_and_vg`]'s report: the LVs, and the VG from the first row
/// (None when the VG has no LV).
pub fn parse_lvs_and_vg(json: &str) -> Result<(Vec<LvInfo>, Option<VgInfo>), LvmError> {
    let rows = lv_rows(json)?;
    let vg = match rows.first() {
        None => None,
        Some(l) => Some(VgInfo {
            name: l.vg_name.clone(),
            uuid: l.vg_uuid.clone(),
            size: num("vg_size", &l.vg_size)?,
            free: num("vg_free", &l.vg_free)?,
            extent_size: num("vg_extent_size", &l.vg_extent_size)?,
            free_extents: num("vg_free_count", &l.vg_free_count)?,
            tags: tags(&l.vg_tags),
        }),
    };
    let lvs = rows.into_iter().map(lv_of).collect::<Result<_, _>>()?;
    Ok((lvs, vg))
}

/// Parses `vgs --reportformat json --units b --nosuffix` output.
pub fn parse_vgs(json: &str) -> Result<Vec<VgInfo>, LvmError> {
    let r: Report<VgSection> =
        serde_json::from_str(json).map_err(|e| LvmError::Parse(format!("vgs JSON: {e}")))?;
    r.report
        .into_iter()
        .flat_map(|s| s.vg)
        .map(|v| {
            Ok(VgInfo {
                size: num("vg_size", &v.vg_size)?,
                free: num("vg_free", &v.vg_free)?,
                extent_size: num("vg_extent_size", &v.vg_extent_size)?,
                free_extents: num("vg_free_count", &v.vg_free_count)?,
                tags: tags(&v.vg_tags),
                name: v.vg_name,
                uuid: v.vg_uuid,
            })
        })
        .collect()
}

/// A physical volume as `pvs` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PvInfo {
    /// The device as lvm names it (`/dev/sdb`, `/dev/loop3`).
    pub name: String,
    /// Its volume group; empty for a PV in no VG.
    pub vg: String,
}

/// Parses `pvs --reportformat json` output.
pub fn parse_pvs(json: &str) -> Result<Vec<PvInfo>, LvmError> {
    let r: Report<PvSection> =
        serde_json::from_str(json).map_err(|e| LvmError::Parse(format!("pvs JSON: {e}")))?;
    Ok(r.report
        .into_iter()
        .flat_map(|s| s.pv)
        .map(|p| PvInfo {
            name: p.pv_name,
            vg: p.vg_name,
        })
        .collect())
}

/// Characters LVM accepts in a tag (`lvm(8)`: `A-Z a-z 0-9 _ + . - / = ! : # &`).
pub fn is_tag_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_+.-/=!:#&".contains(c)
}

/// Encodes any string into LVM tag characters: allowed characters stay,
/// everything else becomes `&XX` (hex of each UTF-8 byte), and `&` itself too.
pub fn encode_tag_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let c = b as char;
        if b.is_ascii() && is_tag_char(c) && c != '&' {
            out.push(c);
        } else {
            out.push_str(&format!("&{b:02x}"));
        }
    }
    out
}

/// Inverse of [`encode_tag_value`].
pub fn decode_tag_value(s: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(s.len());
    let mut it = s.bytes();
    while let Some(b) = it.next() {
        if b == b'&' {
            let hi = (it.next()? as char).to_digit(16)?;
            let lo = (it.next()? as char).to_digit(16)?;
            bytes.push((hi * 16 + lo) as u8);
        } else {
            bytes.push(b);
        }
    }
    String::from_utf8(bytes).ok()
}

/// Settings every lvm command of the driver gets on its command line
/// (`--config`, which takes precedence over lvm.conf). `monitoring = 0`:
/// activating or creating an LV must not start a `dmeventd` inside the
/// driver's container (it would die with the container, or fight the host's
/// over its FIFOs in the shared `/run`); the host's own lvm monitors what
/// it activates. The image cannot carry this in an lvm.conf of its own: the
/// container sees the host's `/etc/lvm`.
pub const LVM_CONFIG: &str = "activation { monitoring = 0 }";

/// The arguments of `lvm`: the subcommand first, then [`LVM_CONFIG`], then
/// the command's own arguments.
pub fn command_args(args: Vec<String>) -> Vec<String> {
    let mut it = args.into_iter();
    let mut out: Vec<String> = it.next().into_iter().collect();
    out.extend(["--config".to_owned(), LVM_CONFIG.to_owned()]);
    out.extend(it);
    out
}

tokio::task_local! {
    /// What the running task works for (an RPC's method, `wipe`, `metrics`,
    /// ...), set by [`attributed`]: each lvm run is counted under it.
    static CALLER: &'static str;
}

/// lvm runs so far, by (caller, subcommand): process starts are what an LVM
/// volume's lifecycle costs, so they are counted, not estimated
/// (`localvol_lvm_runs_total` on /metrics, read by `vm/bench-lvm`).
static RUNS: Mutex<BTreeMap<(&'static str, &'static str), u64>> = Mutex::new(BTreeMap::new());

/// Runs `f` with its lvm runs counted under `caller` (runs outside any such
/// scope count under `other`). Tasks that `f` spawns are not covered.
pub async fn attributed<F: Future>(caller: &'static str, f: F) -> F::Output {
    CALLER.scope(caller, f).await
}

/// Every (caller, subcommand, runs) counted so far.
pub fn runs() -> Vec<(&'static str, &'static str, u64)> {
    let runs = RUNS.lock().unwrap_or_else(|e| e.into_inner());
    runs.iter().map(|(&(c, s), &n)| (c, s, n)).collect()
}

fn count_run(sub: &str) {
    const KNOWN: [&str; 9] = [
        "lvs",
        "vgs",
        "lvcreate",
        "lvchange",
        "lvextend",
        "lvremove",
        "lvrename",
        "lvconvert",
        "fullreport",
    ];
    let sub = KNOWN.into_iter().find(|k| *k == sub).unwrap_or("other");
    let caller = CALLER.try_with(|c| *c).unwrap_or("other");
    let mut runs = RUNS.lock().unwrap_or_else(|e| e.into_inner());
    *runs.entry((caller, sub)).or_default() += 1;
}

async fn run(args: Vec<String>) -> Result<String, LvmError> {
    count_run(args.first().map_or("", String::as_str));
    Cmd::new("lvm")
        .args(command_args(args))
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .timeout(LVM_TIMEOUT)
        .run()
        .await
        .map(|o| o.stdout)
        .map_err(classify)
}

fn report_args(cmd: &str, fields: &str) -> Vec<String> {
    [
        cmd,
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        fields,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// One volume group.
pub async fn vg(vg: &str) -> Result<VgInfo, LvmError> {
    let mut args = report_args("vgs", VG_FIELDS);
    args.push(vg.to_owned());
    parse_vgs(&run(args).await?)?
        .into_iter()
        .next()
        .ok_or_else(|| LvmError::NotFound(format!("volume group {vg}")))
}

/// Whether a volume group exists (`vgs` of it answers; "not found" is no).
pub async fn vg_exists(name: &str) -> Result<bool, LvmError> {
    match vg(name).await {
        Ok(_) => Ok(true),
        Err(LvmError::NotFound(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Every physical volume lvm sees on the node, in a VG or not.
pub async fn pvs() -> Result<Vec<PvInfo>, LvmError> {
    parse_pvs(&run(report_args("pvs", "pv_name,vg_name")).await?)
}

/// Creates volume group `vg` on blank `devices` (lvm makes them PVs).
/// Never `--yes`: should a signature have appeared on one since the caller
/// probed it, lvm's question goes unanswered and it refuses instead of
/// wiping it.
pub async fn vgcreate(vg: &str, devices: &[std::path::PathBuf]) -> Result<(), LvmError> {
    let mut a = vec!["vgcreate".to_owned(), vg.to_owned()];
    a.extend(devices.iter().map(|d| d.to_string_lossy().into_owned()));
    change(a).await
}

/// Adds blank `devices` to volume group `vg` (as [`vgcreate`]: no `--yes`).
pub async fn vgextend(vg: &str, devices: &[std::path::PathBuf]) -> Result<(), LvmError> {
    let mut a = vec!["vgextend".to_owned(), vg.to_owned()];
    a.extend(devices.iter().map(|d| d.to_string_lossy().into_owned()));
    change(a).await
}

/// How big a new thin pool is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThinPoolSize {
    /// This percentage of the VG (`--extents N%VG`).
    PercentOfVg(u8),
    Bytes(u64),
}

/// `lvcreate` arguments of a thin pool that zeroes the blocks it provisions
/// (`--zero y`, which the pools' health check requires).
pub fn thin_pool_args(vg: &str, name: &str, size: ThinPoolSize) -> Vec<String> {
    let mut a: Vec<String> = ["lvcreate", "--yes", "--type", "thin-pool", "--zero", "y"]
        .map(String::from)
        .to_vec();
    match size {
        ThinPoolSize::PercentOfVg(p) => a.extend(["--extents".into(), format!("{p}%VG")]),
        ThinPoolSize::Bytes(b) => a.extend(["--size".into(), format!("{b}b")]),
    }
    a.extend(["--name".into(), name.into(), vg.into()]);
    a
}

tokio::task_local! {
    /// The `lvs` answers of one [`one_lvs_per_vg`] scope, by VG.
    static VG_READS: std::cell::RefCell<std::collections::HashMap<String, Vec<LvInfo>>>;
}

/// Runs `f` with [`lvs_once`] answering each VG from one `lvs`: pools that
/// share a VG (a thick and a thin pool on one disk) list it once per
/// ListVolumes. Only for reads that change nothing between them.
pub async fn one_lvs_per_vg<F: Future>(f: F) -> F::Output {
    VG_READS
        .scope(std::cell::RefCell::new(Default::default()), f)
        .await
}

/// [`lvs`], answered from the enclosing [`one_lvs_per_vg`] scope when the
/// VG was read there already.
pub async fn lvs_once(vg: &str) -> Result<Vec<LvInfo>, LvmError> {
    if let Ok(Some(all)) = VG_READS.try_with(|m| m.borrow().get(vg).cloned()) {
        return Ok(all);
    }
    let all = lvs(vg).await?;
    let _ = VG_READS.try_with(|m| m.borrow_mut().insert(vg.to_owned(), all.clone()));
    Ok(all)
}

/// All logical volumes of a volume group.
pub async fn lvs(vg: &str) -> Result<Vec<LvInfo>, LvmError> {
    let mut args = report_args("lvs", LV_FIELDS);
    args.push(vg.to_owned());
    parse_lvs(&run(args).await?)
}

/// All logical volumes of a volume group and, in the same run, the group
/// itself (`lvs` reports VG fields on each row; a VG without LVs has no row,
/// and then `vgs` answers: a second run).
pub async fn lvs_and_vg(vg: &str) -> Result<(Vec<LvInfo>, VgInfo), LvmError> {
    let fields = format!("{LV_FIELDS},{}", VG_FIELDS.trim_start_matches("vg_name,"));
    let mut args = report_args("lvs", &fields);
    args.push(vg.to_owned());
    match parse_lvs_and_vg(&run(args).await?)? {
        (lvs, Some(info)) => Ok((lvs, info)),
        (lvs, None) => Ok((lvs, self::vg(vg).await?)),
    }
}

/// One logical volume, or None when it does not exist.
pub async fn lv(vg: &str, name: &str) -> Result<Option<LvInfo>, LvmError> {
    let mut args = report_args("lvs", LV_FIELDS);
    args.push(format!("{vg}/{name}"));
    match run(args).await {
        Ok(out) => Ok(parse_lvs(&out)?.into_iter().next()),
        Err(LvmError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Runs an lvm command that changes something (`lvcreate`, `lvextend`, ...).
pub async fn change(args: Vec<String>) -> Result<(), LvmError> {
    run(args).await.map(|_| ())
}

/// What a new LV is, for [`lvcreate_args`].
#[derive(Clone, Copy, Debug)]
pub enum NewLv<'a> {
    /// A thin LV of `size` bytes in the thin pool `pool` of the VG.
    Thin { pool: &'a str, size: u64 },
    /// A thick LV of `size` bytes whose old signatures are wiped and whose
    /// start is zeroed (a deleted volume's filesystem must never show
    /// through), with the pool's extra `lvcreate` options (e.g. raid1).
    Thick { size: u64, options: &'a [String] },
    /// A thin snapshot of `origin` (an LV name in the VG) that is a volume:
    /// activated like any volume.
    ThinVolumeOf { origin: &'a str },
    /// A snapshot of `origin`: copy-on-write with room for `cow_size` bytes
    /// of changes (thick), or thin (None; its activation is skipped, as
    /// lvm does by default).
    Snapshot {
        origin: &'a str,
        cow_size: Option<u64>,
    },
}

/// The one place `lvcreate` arguments are built (for [`change`]): the
/// driver's volumes, restores, clones and snapshots, and the benchmark's
/// bare floor. `tags` are added with `--addtag`.
pub fn lvcreate_args(vg: &str, name: &str, tags: &[String], what: NewLv) -> Vec<String> {
    let mut a: Vec<String> = vec!["lvcreate".into(), "--yes".into()];
    if !matches!(what, NewLv::Snapshot { .. }) {
        a.extend(["--activate".into(), "y".into()]);
    }
    a.extend(["--name".into(), name.into()]);
    for t in tags {
        a.extend(["--addtag".into(), t.clone()]);
    }
    match what {
        NewLv::Thin { pool, size } => a.extend([
            "--virtualsize".into(),
            format!("{size}b"),
            "--thin".into(),
            format!("{vg}/{pool}"),
        ]),
        NewLv::Thick { size, options } => {
            a.extend(["--wipesignatures", "y", "--zero", "y"].map(String::from));
            a.extend(["--size".into(), format!("{size}b")]);
            a.extend(options.iter().cloned());
            a.push(vg.into());
        }
        NewLv::ThinVolumeOf { origin } => {
            a.extend(["--snapshot", "--setactivationskip", "n"].map(String::from));
            a.push(format!("{vg}/{origin}"));
        }
        NewLv::Snapshot { origin, cow_size } => {
            a.push("--snapshot".into());
            if let Some(cow) = cow_size {
                a.extend(["--size".into(), format!("{cow}b")]);
            }
            a.push(format!("{vg}/{origin}"));
        }
    }
    a
}

/// Grows `VG/LV` to `size` bytes.
pub async fn extend(lv_path: &str, size: u64) -> Result<(), LvmError> {
    change(vec![
        "lvextend".into(),
        "--size".into(),
        format!("{size}b"),
        lv_path.into(),
    ])
    .await
}

/// Removes `VG/LV`; one that is already gone is fine (idempotent deletes).
pub async fn remove(lv_path: &str) -> Result<(), LvmError> {
    match change(vec!["lvremove".into(), "--yes".into(), lv_path.into()]).await {
        Ok(()) | Err(LvmError::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Renames `VG/from` to `VG/to`: one metadata commit, so an LV is found
/// under exactly one of the two names whenever a crash comes.
/// Removes `lv_path` only if lvm's own selection `select` (`lvmreport(7)`)
/// matches it when the command runs, so a check and the removal are one run
/// and nothing can change between them. `Ok(true)`: removed; `Ok(false)`:
/// not removed (missing, or not selected; lvm's message is not what it
/// always was, which is also `false`): the caller looks and decides.
/// Whether lvm refused to remove an LV because something holds it: mounted
/// or open ("... in use", "Can't remove open logical volume"), or the
/// backing of another dm device such as a dm-crypt mapping ("... is used by
/// another device").
pub fn refused_as_held(e: &LvmError) -> bool {
    let LvmError::Command(c) = e else {
        return false;
    };
    let err = c.stderr();
    ["in use", "used by another device", "open logical volume"]
        .iter()
        .any(|m| err.contains(m))
}

pub async fn remove_selected(lv_path: &str, select: &str) -> Result<bool, LvmError> {
    let args = ["lvremove", "--yes", "--select", select, lv_path];
    match run(args.iter().map(|s| s.to_string()).collect()).await {
        Ok(out) => Ok(out.contains("successfully removed")),
        Err(LvmError::NotFound(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

pub async fn rename(vg: &str, from: &str, to: &str) -> Result<(), LvmError> {
    change(vec![
        "lvrename".into(),
        "--yes".into(),
        vg.to_owned(),
        from.to_owned(),
        to.to_owned(),
    ])
    .await
}

/// Turns the copy-on-write snapshot `VG/LV` into a plain LV holding its
/// exception store (`lvconvert --splitsnapshot`), so its blocks can be
/// zeroed through its own device before they return to the VG.
pub async fn split_snapshot(lv_path: &str) -> Result<(), LvmError> {
    change(vec![
        "lvconvert".into(),
        "--yes".into(),
        "--splitsnapshot".into(),
        lv_path.to_owned(),
    ])
    .await
}

/// Activates `VG/LV`, also when it carries the activation-skip flag (thin
/// snapshots do by default): whoever asks needs its device node.
pub async fn activate(lv_path: &str) -> Result<(), LvmError> {
    change(vec![
        "lvchange".into(),
        "--activate".into(),
        "y".into(),
        "--ignoreactivationskip".into(),
        lv_path.to_owned(),
    ])
    .await
}

/// Removes a tag from `VG/LV`.
pub async fn delete_tag(lv_path: &str, tag: &str) -> Result<(), LvmError> {
    change(vec![
        "lvchange".into(),
        "--deltag".into(),
        tag.to_owned(),
        lv_path.to_owned(),
    ])
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removals_refused_because_the_lv_is_held_are_told_apart() {
        let failed = |stderr: &str| {
            LvmError::Command(CommandError::Failed {
                program: "lvm".into(),
                code: Some(5),
                stdout: String::new(),
                stderr: stderr.into(),
            })
        };
        for held in [
            "  Logical volume vg/lv-1 is used by another device.",
            "  Logical volume vg/lv-1 contains a filesystem in use.",
            "  Can't remove open logical volume \"lv-1\".",
        ] {
            assert!(refused_as_held(&failed(held)), "{held}");
        }
        assert!(!refused_as_held(&failed("  Volume group \"vg\" not found")));
        assert!(!refused_as_held(&LvmError::NotFound("vg/lv-1".into())));
    }

    #[tokio::test]
    async fn runs_are_counted_by_caller_and_subcommand() {
        let counted = |caller, sub| {
            runs()
                .into_iter()
                .find(|&(c, s, _)| c == caller && s == sub)
                .map_or(0, |r| r.2)
        };
        attributed("test-caller", async {
            count_run("lvs");
            count_run("lvs");
            count_run("lvcreate");
            count_run("no-such-subcommand");
        })
        .await;
        assert_eq!(counted("test-caller", "lvs"), 2);
        assert_eq!(counted("test-caller", "lvcreate"), 1);
        assert_eq!(counted("test-caller", "other"), 1);
        assert_eq!(counted("test-caller", "vgs"), 0);
    }

    #[test]
    fn every_lvm_command_turns_dmeventd_monitoring_off() {
        let create = lvcreate_args(
            "vg",
            "lv-a",
            &[],
            NewLv::Thin {
                pool: "tp",
                size: 1 << 20,
            },
        );
        for args in [
            create,
            report_args("vgs", VG_FIELDS),
            vec![
                "lvchange".into(),
                "--activate".into(),
                "y".into(),
                "vg/lv".into(),
            ],
        ] {
            let sub = args[0].clone();
            let full = command_args(args.clone());
            assert_eq!(full[0], sub, "{full:?}");
            assert_eq!(
                full[1..3],
                ["--config", "activation { monitoring = 0 }"],
                "{full:?}"
            );
            assert_eq!(full[3..], args[1..], "{full:?}");
        }
    }

    const LVS_THICK: &str = include_str!("../tests/fixtures/lvm/lvs-thick.json");
    const VGS_THICK: &str = include_str!("../tests/fixtures/lvm/vgs-thick.json");
    const LVS_MISSING: &str = include_str!("../tests/fixtures/lvm/lvs-missing.json");
    /// Recorded in the VM (lvm 2.03, Debian 12): a thin pool, a mounted thin LV
    /// holding data, and a thin snapshot of it (activation skipped).
    const LVS_THIN: &str = include_str!("../tests/fixtures/lvm/lvs-thin.json");

    #[test]
    fn lvcreate_args_for_snapshots_and_restores() {
        let tags = ["localvol".to_owned()];
        let cow = lvcreate_args(
            "vg",
            "sn-a",
            &tags,
            NewLv::Snapshot {
                origin: "lv-a",
                cow_size: Some(4096),
            },
        );
        assert_eq!(
            cow,
            [
                "lvcreate",
                "--yes",
                "--name",
                "sn-a",
                "--addtag",
                "localvol",
                "--snapshot",
                "--size",
                "4096b",
                "vg/lv-a"
            ]
        );
        let thin = lvcreate_args(
            "vg",
            "sn-a",
            &[],
            NewLv::Snapshot {
                origin: "lv-a",
                cow_size: None,
            },
        );
        assert_eq!(
            thin,
            [
                "lvcreate",
                "--yes",
                "--name",
                "sn-a",
                "--snapshot",
                "vg/lv-a"
            ]
        );
        let restore = lvcreate_args("vg", "lv-b", &[], NewLv::ThinVolumeOf { origin: "sn-a" });
        assert_eq!(
            restore,
            [
                "lvcreate",
                "--yes",
                "--activate",
                "y",
                "--name",
                "lv-b",
                "--snapshot",
                "--setactivationskip",
                "n",
                "vg/sn-a"
            ]
        );
    }

    #[test]
    fn parses_recorded_lvs() {
        let lvs = parse_lvs(LVS_THICK).unwrap();
        assert_eq!(lvs.len(), 2);
        let a = &lvs[0];
        assert_eq!(a.name, "lv-a");
        assert_eq!(a.vg, "fxvg");
        assert_eq!(a.size, 67_108_864);
        assert_eq!(a.tags, ["localvol", "localvol.name=pvc-1"]);
        assert_eq!(a.tag_value("localvol.name"), Some("pvc-1"));
        assert!(a.has_tag("localvol"));
        assert!(!a.is_thin_pool() && !a.is_thin_volume() && !a.is_cow_snapshot());
        assert_eq!(a.data_percent, None);
        assert_eq!(a.path, "/dev/fxvg/lv-a");
        assert!(parse_lvs(LVS_MISSING).unwrap().is_empty());
    }

    #[test]
    fn parses_recorded_thin_lvs() {
        let lvs = parse_lvs(LVS_THIN).unwrap();
        let by_name = |n: &str| lvs.iter().find(|l| l.name == n).unwrap();
        assert_eq!(lvs.len(), 3);

        let vol = by_name("lv-0123456789abcdef0123456789abcdef");
        assert!(vol.is_thin_volume() && !vol.is_thin_pool() && !vol.is_cow_snapshot());
        assert_eq!(vol.pool_lv, "tp");
        assert_eq!(vol.origin, "");
        assert_eq!(vol.size, 64 << 20);
        assert_eq!(vol.data_percent, Some(26.17));
        assert_eq!(vol.metadata_percent, None);
        assert!(vol.is_active() && vol.open, "mounted");
        assert_eq!(vol.tag_value("localvol.pool"), Some("thin"));
        assert_eq!(vol.tag_value("localvol.name"), Some("pvc-1"));
        assert_eq!(vol.path, "/dev/fxvg/lv-0123456789abcdef0123456789abcdef");
        assert_eq!(
            vol.created_unix,
            parse_lv_time("2026-11-22 04:26:32 +0000").unwrap()
        );

        let snap = by_name("sn-0123456789abcdef0123456789abcdef");
        assert!(snap.is_thin_volume() && !snap.is_thin_pool() && !snap.is_cow_snapshot());
        assert_eq!(snap.origin, vol.name);
        assert_eq!(snap.pool_lv, "tp");
        assert_eq!(snap.size, vol.size);
        assert_eq!(snap.data_percent, None, "inactive: lvm reports no usage");
        assert!(
            !snap.is_active() && !snap.open,
            "thin snapshots skip activation"
        );
        assert_eq!(snap.tag_value("localvol.kind"), Some("snapshot"));

        let pool = by_name("tp");
        assert!(pool.is_thin_pool() && !pool.is_thin_volume());
        assert_eq!(pool.size, 256 << 20);
        assert_eq!(pool.data_percent, Some(6.62));
        assert_eq!(pool.metadata_percent, Some(11.23));
        assert!(pool.tags.is_empty() && pool.path.is_empty());
        assert!(pool.is_active() && pool.open);
    }

    #[test]
    fn parses_pvs_and_builds_thin_pool_args() {
        let pvs = parse_pvs(
            r#"{"report":[{"pv":[{"pv_name":"/dev/loop0","vg_name":"fast"},{"pv_name":"/dev/loop1","vg_name":""}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            pvs,
            [
                PvInfo {
                    name: "/dev/loop0".into(),
                    vg: "fast".into()
                },
                PvInfo {
                    name: "/dev/loop1".into(),
                    vg: String::new()
                }
            ]
        );
        assert!(parse_pvs("{}").is_err());
        assert_eq!(
            thin_pool_args("fast", "tp", ThinPoolSize::PercentOfVg(90)),
            [
                "lvcreate",
                "--yes",
                "--type",
                "thin-pool",
                "--zero",
                "y",
                "--extents",
                "90%VG",
                "--name",
                "tp",
                "fast"
            ]
        );
        assert_eq!(
            thin_pool_args("v", "t", ThinPoolSize::Bytes(1 << 30))[6..8],
            ["--size", "1073741824b"]
        );
    }

    #[test]
    fn parses_recorded_vgs() {
        let vgs = parse_vgs(VGS_THICK).unwrap();
        assert_eq!(vgs.len(), 1);
        assert_eq!(vgs[0].name, "fxvg");
        assert_eq!(vgs[0].extent_size, 4 << 20);
        assert!(vgs[0].free < vgs[0].size);
        assert_eq!(vgs[0].free, vgs[0].free_extents * vgs[0].extent_size);
    }

    #[test]
    fn rejects_malformed_reports() {
        assert!(parse_lvs("not json").is_err());
        assert!(parse_lvs(
            r#"{"report":[{"lv":[{"lv_name":"a","vg_name":"v","lv_size":"12x"}]}]}"#
        )
        .is_err());
    }

    fn failed(stderr: &str) -> CommandError {
        CommandError::Failed {
            program: "lvm".into(),
            code: Some(5),
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }

    #[test]
    fn classifies_recorded_failures() {
        // Messages recorded from lvm 2.03 on Debian 12.
        let cases = [
            (
                "  Volume group \"fxvg\" has insufficient free space (239 extents): 1280 required.",
                "space",
            ),
            (
                "  Logical Volume \"lv-a\" already exists in volume group \"fxvg\"",
                "exists",
            ),
            (
                "  Failed to find logical volume \"fxvg/nothere\"",
                "missing",
            ),
            (
                "  Volume group \"nosuchvg\" not found\n  Cannot process volume group nosuchvg",
                "missing",
            ),
            (
                "  Can't create thin-pool without using device-mapper kernel driver.",
                "other",
            ),
        ];
        for (stderr, want) in cases {
            let got = match classify(failed(stderr)) {
                LvmError::InsufficientSpace(_) => "space",
                LvmError::AlreadyExists(_) => "exists",
                LvmError::NotFound(_) => "missing",
                _ => "other",
            };
            assert_eq!(got, want, "{stderr}");
        }
        let e = classify(failed(
            "  Volume group \"v\" has insufficient free space (1 extents): 2 required.",
        ));
        assert!(matches!(e, LvmError::InsufficientSpace(_)));
    }

    #[test]
    fn parses_lv_time() {
        assert_eq!(parse_lv_time("1970-01-01 00:00:00 +0000"), Some(0));
        assert_eq!(
            parse_lv_time("2026-11-22 03:05:21 +0000"),
            Some(1_795_316_721)
        );
        assert_eq!(
            parse_lv_time("2026-11-22 04:05:21 +0100"),
            Some(1_795_316_721)
        );
        assert_eq!(
            parse_lv_time("2000-02-29 12:00:00 -0230"),
            Some(951_834_600)
        );
        assert_eq!(parse_lv_time(""), None);
        assert_eq!(parse_lv_time("yesterday"), None);
    }

    #[test]
    fn tag_values_round_trip() {
        for s in ["pvc-1", "a b/c", "ünï&code", "x=y,z", ""] {
            let enc = encode_tag_value(s);
            assert!(enc.chars().all(is_tag_char), "{enc}");
            assert!(!enc.contains(','));
            assert_eq!(decode_tag_value(&enc).as_deref(), Some(s));
        }
        assert_eq!(decode_tag_value("&zz"), None);
    }
}
