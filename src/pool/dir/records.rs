//! A dir pool's records on disk: its storage identity file, the volume
//! records loaded at start, the directory retired records go to, and a
//! volume directory prepared with its project quota.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::super::{PoolError, Result};
use super::index::Index;
use super::record::{DirRecord, NotThisPools};
use crate::error::IoContext;
use crate::fsutil;
use crate::ids::{PoolName, StorageId, VolumeKey};
use crate::quota::Quotas;

/// The file under a dir pool's path that holds its storage identity: 32 hex
/// digits, random, written once ([`fsutil::create_once`]) when the pool is
/// first opened and never changed, so the pool keeps it across reinstalls of
/// the node as long as its directory (its disk) survives.
pub const POOL_ID_FILE: &str = ".localvol-pool-id";

/// The pool's storage identity, created on first open.
pub(super) fn storage_id(pool: &PoolName, root: &Path) -> Result<StorageId> {
    let mut random = [0u8; 16];
    std::io::Read::read_exact(
        &mut fs::File::open("/dev/urandom").ctx(|| "opening /dev/urandom".to_owned())?,
        &mut random,
    )
    .ctx(|| "reading /dev/urandom".to_owned())?;
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let path = root.join(POOL_ID_FILE);
    // Temp files of a first write cut short (create_once's `.<name>.tmp.*`).
    let tmp_prefix = format!(".{POOL_ID_FILE}.tmp.");
    for e in fs::read_dir(root).ctx(|| format!("reading {root:?}"))? {
        let e = e.ctx(|| format!("reading {root:?}"))?;
        let stale = e
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&tmp_prefix))
            && e.file_type().is_ok_and(|t| t.is_file());
        if stale {
            fs::remove_file(e.path()).ctx(|| format!("removing {:?}", e.path()))?;
        }
    }
    let raw = fsutil::create_once(&path, format!("{hex}\n").as_bytes())?;
    let text = String::from_utf8_lossy(&raw);
    StorageId::parse(&format!("dir:{}", text.trim())).map_err(|e| PoolError::Misconfigured {
        pool: pool.to_string(),
        why: format!(
            "{path:?} holds no pool id ({e}); remove it only if this is a new, empty pool"
        ),
    })
}

/// Re-applies every recorded volume's limits, so the filesystem matches the
/// records after a restart (or after someone changed them by hand).
pub(super) fn apply_recorded_limits(pool: &PoolName, q: &Quotas, volumes: &Index) -> Result<()> {
    for v in volumes.volumes() {
        match v.project_id {
            Some(p) => q.set_limits(p, v.size_bytes, v.inode_limit.unwrap_or(0))?,
            None => {
                tracing::warn!(pool = %pool, volume = %v.id, "volume was created without a project quota; its size is not enforced")
            }
        }
    }
    Ok(())
}

/// Outcome of preparing a volume directory with a candidate project id.
pub(super) enum Prepared {
    Done,
    /// The id already carries usage or limits nobody recorded: try another.
    ProjectBusy(u32),
}

/// Creates the volume directory and, with quotas, gives it `project` and limits.
pub(super) fn prepare_dir(
    data: &Path,
    quotas: Option<&Quotas>,
    project: Option<u32>,
    size: u64,
    inodes: u64,
) -> Result<Prepared> {
    fsutil::ensure_dir(data, 0o777)?;
    let (Some(q), Some(p)) = (quotas, project) else {
        return Ok(Prepared::Done);
    };
    let (current, _) = crate::quota::project_of(data)?;
    if current != p {
        let existing = q.get(p)?;
        if existing.used_bytes > 0 || existing.used_inodes > 0 || existing.block_limit_bytes > 0 {
            return Ok(Prepared::ProjectBusy(p));
        }
        crate::quota::set_project(data, p)?;
    }
    q.set_limits(p, size, inodes)?;
    Ok(Prepared::Done)
}

pub(super) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Creates the directory retired records go to and removes the retired records
/// a previous run left there (nothing in it is live). Anything else in it is
/// left alone. None when it is not on the filesystem of `volumes`, where a
/// rename cannot reach it.
pub(super) fn open_spare_dir(
    pool: &PoolName,
    dir: &Path,
    volumes: &Path,
) -> Result<Option<PathBuf>> {
    fsutil::ensure_dir(dir, 0o700)?;
    for entry in fs::read_dir(dir).ctx(|| format!("reading {dir:?}"))? {
        let entry = entry.ctx(|| format!("reading {dir:?}"))?;
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        match entry.file_name().to_str() {
            Some(name) if is_file && is_retired_record(name) => {
                fs::remove_file(entry.path()).ctx(|| format!("removing {:?}", entry.path()))?;
            }
            name => {
                tracing::warn!(pool = %pool, dir = ?dir, entry = ?name, "unexpected entry in the directory of deleted records; left alone")
            }
        }
    }
    let dev = |p: &Path| {
        fs::metadata(p)
            .map(|m| m.dev())
            .ctx(|| format!("stat {p:?}"))
    };
    Ok((dev(dir)? == dev(volumes)?).then(|| dir.to_path_buf()))
}

/// `<key>.json.<pid>.<n>`: a record renamed by [`fsutil::retire_file`].
pub(super) fn is_retired_record(name: &str) -> bool {
    let Some((key, rest)) = name.split_once(".json.") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    VolumeKey::parse(key).is_some()
        && rest
            .split_once('.')
            .is_some_and(|(pid, n)| digits(pid) && digits(n))
}

/// Reads every record; removes temp files left by interrupted writes.
pub(super) fn load_records(pool: &PoolName, dir: &Path) -> Result<Index> {
    let mut out = Index::new(pool.clone());
    // One buffer for every record: no allocation per file.
    let mut text = Vec::with_capacity(4096);
    for entry in fs::read_dir(dir).ctx(|| format!("reading {dir:?}"))? {
        let entry = entry.ctx(|| format!("reading {dir:?}"))?;
        let fname = entry.file_name();
        let Some(fname) = fname.to_str() else {
            continue;
        };
        if fname.starts_with('.') && fname.contains(".tmp.") {
            let _ = fs::remove_file(entry.path());
            continue;
        }
        let Some(key) = fname.strip_suffix(".json").and_then(VolumeKey::parse) else {
            if VolumeKey::parse(fname).is_some() && !dir.join(format!("{fname}.json")).exists() {
                tracing::warn!(pool = %pool, dir = fname, "volume directory without a record (interrupted create); a retried create reuses it, a delete removes it");
            }
            continue;
        };
        text.clear();
        fs::File::open(entry.path())
            .and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut text))
            .ctx(|| format!("reading {:?}", entry.path()))?;
        let rec = serde_json::from_slice::<DirRecord>(&text);
        match rec.map(|r| (r.id.clone(), r.entry(pool, &key))) {
            Ok((_, Ok(e))) => out.insert(&key, e),
            Ok((id, Err(NotThisPools::OtherPoolOrId))) => {
                tracing::error!(pool = %pool, record = fname, id, "record belongs to another pool or id; ignored")
            }
            Ok((id, Err(NotThisPools::BadName(why)))) => {
                tracing::error!(pool = %pool, record = fname, id, why, "record names its volume with no valid volume name; ignored (not deleted)")
            }
            Err(e) => {
                tracing::error!(pool = %pool, record = fname, error = %e, "unreadable volume record; ignored (not deleted)")
            }
        }
    }
    Ok(out)
}
