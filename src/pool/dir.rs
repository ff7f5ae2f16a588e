//! Directory pools: a volume is a directory under `<path>/volumes/`, its record
//! a JSON file beside it (`<key>/` and `<key>.json`).
//!
//! With project quotas (see `quota.rs`) each volume directory gets its own
//! project id, recorded in its record, and a hard limit equal to its size. Ids
//! are picked from a deterministic sequence per volume, skipping ids that other
//! records use or that already carry usage on the filesystem; delete releases
//! the id by clearing its limits.
//!
//! The records on disk are the truth. The in-memory index is rebuilt from them
//! at start and changed only after the matching record write has succeeded.
//! Creation writes the directory first and the record last, so the record is the
//! commit point: a directory without a record is an interrupted create, which a
//! retried create completes and a delete removes.
//!
//! Delete removes the data first and the record last. The record is not
//! unlinked but renamed into `<path>/deleted/` (and the rename made durable):
//! unlinking a synced file frees its block, which on a filesystem mounted
//! `discard` is a synchronous discard that costs milliseconds and stalls other
//! fsyncs. A later create rewrites such a retired file in place as its temp
//! file ([`fsutil::write_atomic_reusing`]), so steady create/delete churn
//! allocates and frees no blocks at all. `deleted/` is never read for records:
//! a file there is not a volume. Start-up removes the retired records a
//! previous run left in it, and retired files beyond [`MAX_SPARES`] are
//! unlinked in the background. A crash between the data removal and the
//! durable rename leaves a record without data, which a retried delete
//! finishes, as before.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::{
    AccessType, Capacity, CapacityRange, CreateRequest, Expanded, Health, NodeSide, Pool,
    PoolError, Result, Source, Unusable, Usage, Volume,
};
use crate::config::{DirPoolConfig, QuotaMode, DEFAULT_VOLUME_SIZE};
use crate::error::{blocking, IoContext};
use crate::fsutil::{self, FsStats};
use crate::ids::{PoolName, StorageId, VolumeId, VolumeKey};
use crate::mount::MountTable;
use crate::quota::Quotas;

const RECORD_VERSION: u32 = 1;
/// Volume sizes are rounded up to whole 4 KiB blocks.
const BLOCK: u64 = 4096;
/// Project ids localvol picks from: high enough to stay clear of ids an
/// administrator assigns by hand.
const PROJECT_MIN: u32 = 1_000_000;
const PROJECT_SPAN: u32 = 1 << 30;
/// How many ids a create tries before it gives up.
const PROJECT_TRIES: usize = 64;
/// Where retired records go, beside `volumes/`.
const SPARE_DIR: &str = "deleted";
/// Retired records kept for reuse; more are unlinked.
const MAX_SPARES: usize = 64;

pub struct DirPool {
    name: PoolName,
    root: PathBuf,
    volumes_dir: PathBuf,
    reserve: u64,
    cap: Option<u64>,
    default_size: u64,
    /// Set when the filesystem enforces project quotas and the config allows it.
    quotas: Option<Arc<Quotas>>,
    /// Why sizes are not enforced (quota: auto on a filesystem without quotas).
    unenforced_reason: Option<String>,
    state: Arc<Mutex<State>>,
    /// (device, inode) of `volumes/` when the pool opened it: the health
    /// check tells the directory the records came from from another one at
    /// the same path (the pool's filesystem unmounted, the tree replaced).
    volumes_identity: (u64, u64),
    /// What this pool's storage is (`dir:<id>` from [`POOL_ID_FILE`]).
    storage: StorageId,
    /// `<path>/deleted`, when it is on the same filesystem as `volumes/`;
    /// without it records are unlinked.
    spare_dir: Option<PathBuf>,
}

struct State {
    volumes: Index,
    /// Space (and a project id) promised to creates and expansions that are
    /// still writing.
    reserved: HashMap<VolumeKey, (u64, Option<u32>)>,
    /// Ids found carrying usage that no record explains: never picked.
    foreign_projects: HashSet<u32>,
    /// Retired record files in the spare directory, free for reuse.
    spares: Vec<PathBuf>,
}

/// The records, as loaded at start and changed only after a record write
/// succeeded (under the volume's lock): by key, so in id order, which is what
/// ListVolumes pages through; with the figures a create needs (space
/// promised, project ids taken) kept as volumes come and go instead of
/// summed over every volume on each request.
///
/// Each record is kept without what its key and the pool already say (its
/// id and pool name), and its key inline: a node may hold 10,000 volumes,
/// and every byte per volume is 10 kB of the driver's memory. [`Volume`]s
/// are made from it when asked for.
struct Index {
    pool: PoolName,
    by_key: BTreeMap<KeyBytes, Entry>,
    allocated: u64,
    /// How many records name each project id.
    projects: HashMap<u32, u32>,
}

/// A key's 32 hex digits: orders exactly as the key's text (and the id's,
/// within a pool).
type KeyBytes = [u8; 32];

/// A record in the index: a [`Volume`] less its id and pool.
struct Entry {
    name: Box<str>,
    size_bytes: u64,
    created_unix: u64,
    version: u32,
    access_type: AccessType,
    grow_filesystem: bool,
    project_id: Option<u32>,
    inode_limit: Option<u64>,
    parameters: BTreeMap<String, String>,
}

fn key_bytes(key: &VolumeKey) -> KeyBytes {
    let mut k = [0u8; 32];
    k.copy_from_slice(key.as_str().as_bytes());
    k
}

impl Index {
    fn new(pool: PoolName) -> Index {
        Index {
            pool,
            by_key: BTreeMap::new(),
            allocated: 0,
            projects: HashMap::new(),
        }
    }

    /// The volume a record describes: its id is `<pool>.<key>`.
    fn volume(&self, key: &KeyBytes, e: &Entry) -> Volume {
        let key = std::str::from_utf8(key).unwrap_or_default();
        Volume {
            version: e.version,
            id: format!("{}.{key}", self.pool),
            name: e.name.to_string(),
            pool: self.pool.to_string(),
            size_bytes: e.size_bytes,
            access_type: e.access_type,
            created_unix: e.created_unix,
            parameters: e.parameters.clone(),
            project_id: e.project_id,
            inode_limit: e.inode_limit,
            grow_filesystem: e.grow_filesystem,
            unformatted: false,
            inactive: false,
            // Dir pools refuse encryption at create.
            encryption: None,
        }
    }

    /// Whether a record read from disk is one this index can hold exactly:
    /// this pool's, with the id its key makes.
    fn fits(&self, key: &VolumeKey, v: &Volume) -> bool {
        v.pool == self.pool.as_str()
            && v.id
                .strip_prefix(self.pool.as_str())
                .and_then(|r| r.strip_prefix('.'))
                == Some(key.as_str())
    }

    fn get(&self, key: &VolumeKey) -> Option<Volume> {
        let k = key_bytes(key);
        self.by_key.get(&k).map(|e| self.volume(&k, e))
    }

    fn len(&self) -> usize {
        self.by_key.len()
    }

    fn volumes(&self) -> impl Iterator<Item = Volume> + '_ {
        self.by_key.iter().map(|(k, e)| self.volume(k, e))
    }

    /// (project, size) of every volume with a project id.
    fn projects(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.by_key
            .values()
            .filter_map(|e| e.project_id.map(|p| (p, e.size_bytes)))
    }

    fn insert(&mut self, key: &VolumeKey, vol: Volume) {
        let e = Entry {
            name: vol.name.into_boxed_str(),
            size_bytes: vol.size_bytes,
            created_unix: vol.created_unix,
            version: vol.version,
            access_type: vol.access_type,
            grow_filesystem: vol.grow_filesystem,
            project_id: vol.project_id,
            inode_limit: vol.inode_limit,
            parameters: vol.parameters,
        };
        self.account(&e, true);
        if let Some(old) = self.by_key.insert(key_bytes(key), e) {
            self.account(&old, false);
        }
    }

    fn remove(&mut self, key: &VolumeKey) {
        if let Some(old) = self.by_key.remove(&key_bytes(key)) {
            self.account(&old, false);
        }
    }

    fn account(&mut self, e: &Entry, add: bool) {
        if add {
            self.allocated = self.allocated.saturating_add(e.size_bytes);
        } else {
            self.allocated = self.allocated.saturating_sub(e.size_bytes);
        }
        if let Some(p) = e.project_id {
            let n = self.projects.entry(p).or_default();
            *n = if add { *n + 1 } else { n.saturating_sub(1) };
            if *n == 0 {
                self.projects.remove(&p);
            }
        }
    }

    /// Volumes whose id (`<pool>.<key>`, so key order) is `from` or after it,
    /// in id order, at most `max`.
    fn page(&self, from: &str, max: usize) -> Vec<Volume> {
        use std::ops::Bound;
        let prefix = format!("{}.", self.pool);
        let range = if from <= prefix.as_str() {
            self.by_key.range::<KeyBytes, _>(..)
        } else if let Some(rest) = from.strip_prefix(prefix.as_str()) {
            // Keys are 32 bytes, none of them 0: `rest` padded with zeros is
            // the least key at or after it; a longer `rest` is after the key
            // its first 32 bytes make.
            let mut k = [0u8; 32];
            let n = rest.len().min(32);
            k[..n].copy_from_slice(&rest.as_bytes()[..n]);
            match rest.len() > 32 {
                true => self.by_key.range((Bound::Excluded(k), Bound::Unbounded)),
                false => self.by_key.range(k..),
            }
        } else {
            // After `<pool>.` and not starting with it: after every id here.
            return Vec::new();
        };
        range.take(max).map(|(k, e)| self.volume(k, e)).collect()
    }
}

impl State {
    fn new(volumes: Index) -> State {
        State {
            volumes,
            reserved: HashMap::new(),
            foreign_projects: HashSet::new(),
            spares: Vec::new(),
        }
    }

    fn allocated(&self) -> u64 {
        self.volumes.allocated + self.reserved.values().map(|r| r.0).sum::<u64>()
    }

    fn project_in_use(&self, id: u32) -> bool {
        self.foreign_projects.contains(&id)
            || self.volumes.projects.contains_key(&id)
            || self.reserved.values().any(|r| r.1 == Some(id))
    }

    /// The first free id of the volume's own sequence.
    fn pick_project(&self, key: &VolumeKey) -> Option<u32> {
        project_candidates(key)
            .take(PROJECT_TRIES * 4)
            .find(|id| !self.project_in_use(*id))
    }

    /// (project, size) of every volume whose unused quota must stay free.
    fn projects(&self) -> Vec<(u32, u64)> {
        self.volumes.projects().collect()
    }
}

/// The health of a dir pool whose `volumes/` directory was `opened` (device,
/// inode) at start: still there, a directory, the same one, writable, and
/// its filesystem answers statvfs.
fn dir_health(dir: &Path, opened: (u64, u64)) -> Health {
    let unusable = |u| Health::Unusable(u);
    let md = match fs::metadata(dir) {
        Ok(md) => md,
        Err(e) => {
            return unusable(Unusable::Unreadable {
                path: dir.to_owned(),
                why: e.to_string(),
            })
        }
    };
    if !md.is_dir() {
        return unusable(Unusable::NotADirectory {
            path: dir.to_owned(),
        });
    }
    if (md.dev(), md.ino()) != opened {
        return unusable(Unusable::Replaced {
            path: dir.to_owned(),
        });
    }
    if let Err(e) = nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK) {
        return unusable(Unusable::NotWritable {
            path: dir.to_owned(),
            why: e.desc().to_owned(),
        });
    }
    match fsutil::fs_stats(dir) {
        Ok(_) => Health::Ready,
        Err(e) => unusable(Unusable::CheckFailed(e.to_string())),
    }
}

/// The file under a dir pool's path that holds its storage identity: 32 hex
/// digits, random, written once ([`fsutil::create_once`]) when the pool is
/// first opened and never changed, so the pool keeps it across reinstalls of
/// the node as long as its directory (its disk) survives.
pub const POOL_ID_FILE: &str = ".localvol-pool-id";

/// The pool's storage identity, created on first open.
fn storage_id(pool: &PoolName, root: &Path) -> Result<StorageId> {
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

/// The volume's deterministic sequence of candidate project ids.
fn project_candidates(key: &VolumeKey) -> impl Iterator<Item = u32> {
    let start = u32::from_str_radix(&key.as_str()[..8], 16).unwrap_or(0) % PROJECT_SPAN;
    (0..PROJECT_SPAN).map(move |i| PROJECT_MIN + (start + i) % PROJECT_SPAN)
}

/// Filesystem figures plus the space promised to volumes but not yet used.
struct Space {
    fs: FsStats,
    unused_quota: u64,
}

impl DirPool {
    pub async fn open(cfg: DirPoolConfig) -> Result<Self> {
        let DirPoolConfig {
            name,
            path,
            reserve,
            capacity,
            default_size,
            quota,
            // Mounted at `path` by `disks::prepare_dir` before this runs.
            device: _,
        } = cfg;
        let pool_name = name.clone();
        let (root, volumes, quotas, unenforced_reason, spare_dir, ident, storage) =
            blocking(move || {
                fs::create_dir_all(&path).ctx(|| format!("pool {pool_name}: creating {path:?}"))?;
                let root = fs::canonicalize(&path)
                    .ctx(|| format!("pool {pool_name}: resolving {path:?}"))?;
                let storage = storage_id(&pool_name, &root)?;
                let volumes_dir = root.join("volumes");
                fsutil::ensure_dir(&volumes_dir, 0o700)?;
                let md = fs::metadata(&volumes_dir)
                    .ctx(|| format!("pool {pool_name}: reading {volumes_dir:?}"))?;
                let identity = (md.dev(), md.ino());
                let volumes = load_records(&pool_name, &volumes_dir)?;
                let spare_dir = open_spare_dir(&pool_name, &root.join(SPARE_DIR), &volumes_dir)?;
                let (quotas, reason) = match quota {
                    QuotaMode::Off => (None, Some("quota: off".to_owned())),
                    QuotaMode::Auto | QuotaMode::Required => match Quotas::open(&volumes_dir) {
                        Ok(q) => (Some(Arc::new(q)), None),
                        Err(e) if quota == QuotaMode::Required => {
                            return Err(PoolError::Misconfigured {
                                pool: pool_name.to_string(),
                                why: format!("quota: required, but {e}"),
                            })
                        }
                        Err(e) => (None, Some(e.to_string())),
                    },
                };
                if let Some(q) = &quotas {
                    apply_recorded_limits(&pool_name, q, &volumes)?;
                }
                Ok((root, volumes, quotas, reason, spare_dir, identity, storage))
            })
            .await?;
        match &unenforced_reason {
            None => tracing::info!(pool = %name, root = ?root, volumes = volumes.len(),
                "dir pool loaded; sizes enforced by project quotas"),
            Some(why) => tracing::warn!(pool = %name, root = ?root, volumes = volumes.len(),
                reason = %why, "dir pool loaded; volume sizes are NOT enforced"),
        }
        Ok(DirPool {
            name,
            volumes_dir: root.join("volumes"),
            root,
            reserve: reserve.0,
            cap: capacity.map(|c| c.0),
            default_size: default_size.map_or(DEFAULT_VOLUME_SIZE, |d| d.0),
            quotas,
            unenforced_reason,
            state: Arc::new(Mutex::new(State::new(volumes))),
            volumes_identity: ident,
            spare_dir,
            storage,
        })
    }

    /// Why sizes are not enforced, or None when project quotas enforce them.
    #[cfg(test)]
    fn unenforced_reason(&self) -> Option<&str> {
        self.unenforced_reason.as_deref()
    }

    fn data_dir(&self, key: &VolumeKey) -> PathBuf {
        self.volumes_dir.join(key.as_str())
    }

    fn record_path(&self, key: &VolumeKey) -> PathBuf {
        self.volumes_dir.join(format!("{key}.json"))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("pool state lock poisoned")
    }

    /// The most this pool could ever hold, and what is free for new volumes now:
    /// the smaller of "configured size minus what volumes were promised" and
    /// "free space minus the unused part of every quota", both less the reserve.
    fn limits(&self, space: &Space, allocated: u64) -> (u64, u64) {
        let fs = &space.fs;
        let total = self
            .cap
            .map_or(fs.total_bytes, |c| c.min(fs.total_bytes))
            .saturating_sub(self.reserve);
        let by_allocation = total.saturating_sub(allocated);
        let by_free_space = fs
            .available_bytes
            .saturating_sub(self.reserve)
            .saturating_sub(space.unused_quota);
        (total, by_allocation.min(by_free_space))
    }

    async fn space(&self) -> Result<Space> {
        let root = self.root.clone();
        let quotas = self.quotas.clone();
        let projects = if quotas.is_some() {
            self.state().projects()
        } else {
            Vec::new()
        };
        blocking(move || {
            let fs = fsutil::fs_stats(&root)?;
            let mut unused_quota = 0u64;
            if let Some(q) = quotas {
                for (project, size) in projects {
                    let used = q.get(project)?.used_bytes;
                    unused_quota = unused_quota.saturating_add(size.saturating_sub(used));
                }
            }
            Ok(Space { fs, unused_quota })
        })
        .await
    }

    /// Picks the size for a request: the required size (or the pool's default)
    /// rounded up to whole blocks, never above the limit.
    fn size_for(&self, range: CapacityRange) -> Result<u64> {
        let want = if range.required > 0 {
            range.required
        } else if range.limit > 0 {
            self.default_size.min(range.limit)
        } else {
            self.default_size
        };
        let rounded = want.div_ceil(BLOCK).saturating_mul(BLOCK);
        Ok(if range.limit > 0 && rounded > range.limit {
            want
        } else {
            rounded
        })
    }

    /// Promises `bytes` to `key` if the pool has them; the caller must release
    /// the reservation.
    fn reserve_space(
        &self,
        key: &VolumeKey,
        bytes: u64,
        space: &Space,
        what: &str,
    ) -> Result<Option<u32>> {
        let mut st = self.state();
        let (total, free) = self.limits(space, st.allocated());
        if bytes > total {
            return Err(PoolError::TooLarge {
                what: what.to_owned(),
                bytes,
                pool: self.name.clone(),
                total,
            });
        }
        if bytes > free {
            return Err(PoolError::NoSpace {
                what: what.to_owned(),
                bytes,
                pool: self.name.clone(),
                free,
            });
        }
        let project = match &self.quotas {
            Some(_) => Some(st.pick_project(key).ok_or_else(|| PoolError::NoProjectId {
                what: what.to_owned(),
            })?),
            None => None,
        };
        st.reserved.insert(key.clone(), (bytes, project));
        Ok(project)
    }
}

/// Re-applies every recorded volume's limits, so the filesystem matches the
/// records after a restart (or after someone changed them by hand).
fn apply_recorded_limits(pool: &PoolName, q: &Quotas, volumes: &Index) -> Result<()> {
    for v in volumes.volumes() {
        match v.project_id {
            Some(p) => q.set_limits(p, v.size_bytes, v.inode_limit.unwrap_or(0))?,
            None => {
                tracing::warn!(pool = %pool, volume = v.id, "volume was created without a project quota; its size is not enforced")
            }
        }
    }
    Ok(())
}

/// Outcome of preparing a volume directory with a candidate project id.
enum Prepared {
    Done,
    /// The id already carries usage or limits nobody recorded: try another.
    ProjectBusy(u32),
}

/// Creates the volume directory and, with quotas, gives it `project` and limits.
fn prepare_dir(
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

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Creates the directory retired records go to and removes the retired records
/// a previous run left there (nothing in it is live). Anything else in it is
/// left alone. None when it is not on the filesystem of `volumes`, where a
/// rename cannot reach it.
fn open_spare_dir(pool: &PoolName, dir: &Path, volumes: &Path) -> Result<Option<PathBuf>> {
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
fn is_retired_record(name: &str) -> bool {
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
fn load_records(pool: &PoolName, dir: &Path) -> Result<Index> {
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
        match serde_json::from_slice::<Volume>(&text) {
            Ok(v) if out.fits(&key, &v) => out.insert(&key, v),
            Ok(v) => {
                tracing::error!(pool = %pool, record = fname, id = v.id, "record belongs to another pool or id; ignored")
            }
            Err(e) => {
                tracing::error!(pool = %pool, record = fname, error = %e, "unreadable volume record; ignored (not deleted)")
            }
        }
    }
    Ok(out)
}

#[async_trait]
impl Pool for DirPool {
    fn name(&self) -> &PoolName {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "dir"
    }

    fn storage_id(&self) -> Option<&StorageId> {
        Some(&self.storage)
    }

    fn supports(&self, access: AccessType) -> bool {
        access == AccessType::Mount
    }

    async fn health(&self) -> Health {
        let dir = self.volumes_dir.clone();
        let opened = self.volumes_identity;
        blocking(move || Ok::<_, PoolError>(dir_health(&dir, opened)))
            .await
            .unwrap_or_else(|e| Health::Unusable(Unusable::CheckFailed(e.to_string())))
    }

    async fn create(&self, req: &CreateRequest) -> Result<Volume> {
        if req.encryption.is_some() {
            return Err(PoolError::UnsupportedParameter(format!(
                "encryption applies to LVM pools; pool {} is a directory pool",
                self.name
            )));
        }
        let key = req.id.key.clone();
        let existing = self.state().volumes.get(&key);
        if let Some(existing) = existing {
            return super::matches_request(existing, req, true);
        }
        if req.inode_limit.is_some() && self.quotas.is_none() {
            return Err(PoolError::UnsupportedParameter(format!(
                "pool {} does not enforce quotas ({}); inodeLimit cannot be honoured",
                self.name,
                self.unenforced_reason
                    .as_deref()
                    .unwrap_or("no quota support")
            )));
        }
        let size = self.size_for(req.range)?;
        let what = format!("volume {}", req.name.as_str());
        let data = self.data_dir(&key);
        let record = self.record_path(&key);
        let volume = |project_id: Option<u32>| Volume {
            version: RECORD_VERSION,
            id: req.id.to_string(),
            name: req.name.as_str().to_owned(),
            pool: self.name.to_string(),
            size_bytes: size,
            access_type: req.access_type,
            created_unix: now_unix(),
            parameters: req.parameters.clone(),
            project_id,
            inode_limit: req.inode_limit,
            grow_filesystem: false,
            unformatted: false,
            inactive: false,
            encryption: None,
        };
        for _ in 0..PROJECT_TRIES {
            let space = self.space().await?;
            let candidate = self.reserve_space(&key, size, &space, &what)?;
            let vol = volume(candidate);
            let (d, q, state) = (data.clone(), self.quotas.clone(), self.state.clone());
            let (record, rec) = (record.clone(), vol.clone());
            let inodes = req.inode_limit.unwrap_or(0);
            // The directory (and its quota) first, the record last: one trip
            // to the blocking pool for both.
            let prepared = blocking(move || {
                let prepared = prepare_dir(&d, q.as_deref(), candidate, size, inodes)?;
                if let Prepared::Done = prepared {
                    let json = serde_json::to_vec_pretty(&rec)?;
                    let spare = state.lock().expect("pool state lock poisoned").spares.pop();
                    match spare {
                        Some(spare) => fsutil::write_atomic_reusing(&record, &json, &spare)?,
                        None => fsutil::write_atomic(&record, &json)?,
                    }
                }
                Ok(prepared)
            })
            .await;
            match prepared {
                Ok(Prepared::Done) => {
                    let mut st = self.state();
                    st.reserved.remove(&key);
                    st.volumes.insert(&key, vol.clone());
                    return Ok(vol);
                }
                Ok(Prepared::ProjectBusy(p)) => {
                    tracing::warn!(pool = %self.name, project = p, "project id already in use on the filesystem; skipping it");
                    let mut st = self.state();
                    st.reserved.remove(&key);
                    st.foreign_projects.insert(p);
                }
                Err(e) => {
                    self.state().reserved.remove(&key);
                    return Err(e);
                }
            }
        }
        self.state().reserved.remove(&key);
        Err(PoolError::NoProjectId { what })
    }

    async fn delete(&self, id: &VolumeId) -> Result<()> {
        let key = id.key.clone();
        let (data, record) = (self.data_dir(&key), self.record_path(&key));
        let what = id.to_string();
        let project = self.state().volumes.get(&key).and_then(|v| v.project_id);
        let quotas = self.quotas.clone();
        let spare_dir = self.spare_dir.clone();
        let retired = blocking(move || {
            let table = MountTable::read()?;
            if let Some(loc) = table.locate(&data) {
                if let Some(m) = table.mounts_of(&loc).next() {
                    return Err(PoolError::InUse {
                        volume: what,
                        why: format!(
                            "is still mounted at {:?}; unpublish and unstage it first",
                            m.mount_point
                        ),
                    });
                }
            }
            if let Some(m) = table.mounts_below(&data).next() {
                return Err(PoolError::InUse {
                    volume: what,
                    why: format!("has a mount inside it at {:?}; not deleting", m.mount_point),
                });
            }
            fsutil::remove_tree(&data)?;
            // Release the id: no limits and (the tree is gone) no usage.
            if let (Some(q), Some(p)) = (&quotas, project) {
                q.set_limits(p, 0, 0)?;
            }
            // The record goes last, durably: retired (renamed away), or removed.
            Ok(match spare_dir {
                Some(to) => fsutil::retire_file(&record, &to)?,
                None => fsutil::remove_file_durable(&record).map(|()| None)?,
            })
        })
        .await?;
        let excess = {
            let mut st = self.state();
            st.volumes.remove(&key);
            match retired {
                Some(file) if st.spares.len() < MAX_SPARES => {
                    st.spares.push(file);
                    None
                }
                other => other,
            }
        };
        if let Some(file) = excess {
            // Off the RPC's path; a leftover is removed at the next start.
            tokio::spawn(blocking(move || {
                let _ = fs::remove_file(file);
                Ok::<_, PoolError>(())
            }));
        }
        Ok(())
    }

    async fn expand(&self, id: &VolumeId, range: CapacityRange) -> Result<Expanded> {
        let key = id.key.clone();
        let current = self
            .state()
            .volumes
            .get(&key)
            .ok_or_else(|| PoolError::VolumeNotFound(id.to_string()))?;
        let new_size = self.size_for(CapacityRange {
            required: range.required,
            limit: range.limit,
        })?;
        if new_size < current.size_bytes {
            if range.admits(current.size_bytes) {
                return Ok(Expanded {
                    size_bytes: current.size_bytes,
                    node_expansion_required: false,
                });
            }
            return Err(PoolError::SizeRefused(format!(
                "volume {id} is {} bytes; shrinking to {new_size} is not supported",
                current.size_bytes
            )));
        }
        if new_size == current.size_bytes {
            return Ok(Expanded {
                size_bytes: new_size,
                node_expansion_required: false,
            });
        }
        let space = self.space().await?;
        {
            // Growth is checked like a new volume of the difference; the volume
            // keeps its project id.
            let mut st = self.state();
            let (total, free) = self.limits(&space, st.allocated());
            let delta = new_size - current.size_bytes;
            if new_size > total {
                return Err(PoolError::TooLarge {
                    what: format!("expanding {id}"),
                    bytes: new_size,
                    pool: self.name.clone(),
                    total,
                });
            }
            if delta > free {
                return Err(PoolError::NoSpace {
                    what: format!("expanding {id}"),
                    bytes: delta,
                    pool: self.name.clone(),
                    free,
                });
            }
            st.reserved.insert(key.clone(), (delta, None));
        }
        let mut grown = current.clone();
        grown.size_bytes = new_size;
        let (record, rec, quotas) = (self.record_path(&key), grown.clone(), self.quotas.clone());
        let res = blocking(move || {
            // Raise the limit first: a crash before the record write leaves a
            // limit that the next start lowers back to the recorded size.
            if let (Some(q), Some(p)) = (&quotas, rec.project_id) {
                q.set_limits(p, rec.size_bytes, rec.inode_limit.unwrap_or(0))?;
            }
            let json = serde_json::to_vec_pretty(&rec)?;
            Ok::<_, PoolError>(fsutil::write_atomic(&record, &json)?)
        })
        .await;
        let mut st = self.state();
        st.reserved.remove(&key);
        res?;
        st.volumes.insert(&key, grown);
        Ok(Expanded {
            size_bytes: new_size,
            node_expansion_required: false,
        })
    }

    async fn get(&self, id: &VolumeId) -> Result<Option<Volume>> {
        Ok(self.state().volumes.get(&id.key))
    }

    async fn list(&self) -> Result<Vec<Volume>> {
        Ok(self.state().volumes.volumes().collect())
    }

    async fn list_page(&self, from: &str, max: usize) -> Result<Vec<Volume>> {
        Ok(self.state().volumes.page(from, max))
    }

    async fn capacity(&self) -> Result<Capacity> {
        let space = self.space().await?;
        let (_, free) = self.limits(&space, self.state().allocated());
        Ok(Capacity {
            available_bytes: free,
            maximum_volume_size: free,
        })
    }
}

#[async_trait]
impl NodeSide for DirPool {
    fn source(&self, vol: &Volume) -> Result<Source> {
        let key = vol
            .id
            .rsplit_once('.')
            .and_then(|(_, k)| VolumeKey::parse(k))
            .ok_or_else(|| {
                PoolError::Inconsistent(format!("record has a malformed id {:?}", vol.id))
            })?;
        Ok(Source::Directory(self.data_dir(&key)))
    }

    async fn usage(&self, vol: &Volume) -> Result<Option<Usage>> {
        let (Some(q), Some(p)) = (self.quotas.clone(), vol.project_id) else {
            return Ok(None);
        };
        let (size, inode_limit, root) = (vol.size_bytes, vol.inode_limit, self.root.clone());
        blocking(move || {
            let pq = q.get(p)?;
            let total_inodes = match inode_limit {
                Some(n) => n,
                None => fsutil::fs_stats(&root)?.total_inodes,
            };
            Ok(Some(Usage {
                total_bytes: size,
                used_bytes: pq.used_bytes,
                available_bytes: size.saturating_sub(pq.used_bytes),
                total_inodes,
                used_inodes: pq.used_inodes,
                free_inodes: total_inodes.saturating_sub(pq.used_inodes),
            }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::VolumeName;
    use crate::size::ByteSize;
    use std::os::unix::fs::PermissionsExt;

    fn cfg(path: &Path, quota: QuotaMode) -> DirPoolConfig {
        DirPoolConfig {
            name: PoolName::parse("p").unwrap(),
            path: path.to_path_buf(),
            reserve: ByteSize(0),
            capacity: Some(ByteSize(100 << 20)),
            default_size: Some(ByteSize(8 << 20)),
            quota,
            device: None,
        }
    }

    fn req(name: &str, required: u64) -> CreateRequest {
        let name = VolumeName::parse(name).unwrap();
        CreateRequest {
            source: None,
            id: VolumeId::new(PoolName::parse("p").unwrap(), &name),
            name,
            range: CapacityRange { required, limit: 0 },
            access_type: AccessType::Mount,
            inode_limit: None,
            parameters: Default::default(),
            encryption: None,
        }
    }

    #[tokio::test]
    async fn storage_id_is_written_once_and_kept_across_opens() {
        let d = tempfile::tempdir().unwrap();
        // A temp file of a first write a crash cut short.
        let stale = d.path().join(format!(".{POOL_ID_FILE}.tmp.1.0"));
        fs::write(&stale, b"partial").unwrap();
        let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        let id = pool.storage_id().unwrap().clone();
        let file = fs::read_to_string(d.path().join(POOL_ID_FILE)).unwrap();
        assert_eq!(id.as_str(), format!("dir:{}", file.trim()));
        assert_eq!(file.trim().len(), 32);
        assert!(!stale.exists(), "the stale temp file is removed");
        drop(pool);
        let again = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        assert_eq!(again.storage_id(), Some(&id));
        // Another pool directory, another identity.
        let other = tempfile::tempdir().unwrap();
        let o = DirPool::open(cfg(other.path(), QuotaMode::Off))
            .await
            .unwrap();
        assert_ne!(o.storage_id(), Some(&id));
        // A file that holds no id stops the pool instead of being replaced.
        fs::write(other.path().join(POOL_ID_FILE), b"../x\n").unwrap();
        drop(o);
        assert!(matches!(
            DirPool::open(cfg(other.path(), QuotaMode::Off)).await,
            Err(PoolError::Misconfigured { .. })
        ));
    }

    #[tokio::test]
    async fn create_is_idempotent_and_survives_reopen() {
        let d = tempfile::tempdir().unwrap();
        let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        let v = pool.create(&req("a", 10 << 20)).await.unwrap();
        assert_eq!(v.size_bytes, 10 << 20);
        assert_eq!(pool.create(&req("a", 10 << 20)).await.unwrap(), v);
        assert!(matches!(
            pool.create(&req("a", 20 << 20)).await,
            Err(PoolError::Mismatch { .. })
        ));
        let Source::Directory(dir) = pool.source(&v).unwrap() else {
            panic!("dir pools hand out directories")
        };
        assert!(dir.is_dir());
        drop(pool);
        let again = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        let id = VolumeId::new(
            PoolName::parse("p").unwrap(),
            &VolumeName::parse("a").unwrap(),
        );
        assert_eq!(again.get(&id).await.unwrap(), Some(v));
    }

    #[tokio::test]
    async fn capacity_counts_allocations_and_refuses_overcommit() {
        let d = tempfile::tempdir().unwrap();
        let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        assert_eq!(pool.capacity().await.unwrap().available_bytes, 100 << 20);
        pool.create(&req("a", 60 << 20)).await.unwrap();
        assert_eq!(pool.capacity().await.unwrap().available_bytes, 40 << 20);
        assert!(matches!(
            pool.create(&req("b", 50 << 20)).await,
            Err(PoolError::NoSpace { .. })
        ));
        assert!(matches!(
            pool.create(&req("c", 200 << 20)).await,
            Err(PoolError::TooLarge { .. })
        ));
        // Nothing was left behind by the refused creates.
        assert_eq!(pool.list().await.unwrap().len(), 1);
        assert_eq!(fs::read_dir(d.path().join("volumes")).unwrap().count(), 2);
    }

    /// A page starts at its token (an id, or any string between ids) and
    /// follows id order; tokens of pools whose ids sort before or after this
    /// pool's give everything or nothing.
    #[tokio::test]
    async fn pages_follow_id_order_from_any_token() {
        let d = tempfile::tempdir().unwrap();
        let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        for i in 0..20 {
            pool.create(&req(&format!("v{i}"), 4096)).await.unwrap();
        }
        let mut ids: Vec<String> = pool
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|v| v.id)
            .collect();
        ids.sort();
        let page = |from: String, max: usize| {
            let pool = &pool;
            async move {
                let got: Vec<String> = pool
                    .list_page(&from, max)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|v| v.id)
                    .collect();
                got
            }
        };
        assert_eq!(page(String::new(), 100).await, ids);
        assert_eq!(page(String::new(), 5).await, ids[..5]);
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(page(id.clone(), 3).await, ids[i..(i + 3).min(ids.len())]);
        }
        assert_eq!(page(format!("{}0", ids[4]), 2).await, ids[5..7]);
        for before in ["a.zzz", "o", "p-x.0", "p."] {
            assert_eq!(page(before.into(), 100).await, ids, "{before}");
        }
        for after in ["p/", "q", "p.g"] {
            assert!(page(after.into(), 100).await.is_empty(), "{after}");
        }
        // What the index gives back is what was created, parameters and all.
        let mut with_params = req("with-params", 8192);
        with_params
            .parameters
            .insert("csi.storage.k8s.io/pvc/name".into(), "data".into());
        let v = pool.create(&with_params).await.unwrap();
        assert_eq!(pool.get(&with_params.id).await.unwrap(), Some(v.clone()));
        assert!(pool.list_page(&v.id, 1).await.unwrap() == [v.clone()]);
        pool.delete(&with_params.id).await.unwrap();
        // The index keeps the allocation as volumes come and go.
        assert_eq!(pool.state().volumes.allocated, 20 * 4096);
        pool.delete(&req("v3", 4096).id).await.unwrap();
        assert_eq!(pool.state().volumes.allocated, 19 * 4096);
    }

    #[tokio::test]
    async fn expand_grows_refuses_shrink_and_is_persisted() {
        let d = tempfile::tempdir().unwrap();
        let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        let r = req("a", 10 << 20);
        pool.create(&r).await.unwrap();
        let grown = pool
            .expand(
                &r.id,
                CapacityRange {
                    required: 30 << 20,
                    limit: 0,
                },
            )
            .await
            .unwrap();
        assert_eq!(grown.size_bytes, 30 << 20);
        assert!(!grown.node_expansion_required);
        assert!(matches!(
            pool.expand(
                &r.id,
                CapacityRange {
                    required: 5 << 20,
                    limit: 6 << 20
                }
            )
            .await,
            Err(PoolError::SizeRefused(_))
        ));
        pool.create(&req("other", 50 << 20)).await.unwrap();
        assert!(matches!(
            pool.expand(
                &r.id,
                CapacityRange {
                    required: 90 << 20,
                    limit: 0
                }
            )
            .await,
            Err(PoolError::NoSpace { .. })
        ));
        drop(pool);
        let again = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        assert_eq!(
            again.get(&r.id).await.unwrap().unwrap().size_bytes,
            30 << 20
        );
    }

    #[tokio::test]
    async fn delete_removes_data_and_record_and_is_idempotent() {
        let d = tempfile::tempdir().unwrap();
        let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        let r = req("a", 1 << 20);
        let v = pool.create(&r).await.unwrap();
        let Source::Directory(dir) = pool.source(&v).unwrap() else {
            panic!("dir pools hand out directories")
        };
        fs::create_dir_all(dir.join("x/y")).unwrap();
        fs::write(dir.join("x/y/z"), b"data").unwrap();
        pool.delete(&r.id).await.unwrap();
        pool.delete(&r.id).await.unwrap();
        assert!(!dir.exists());
        assert_eq!(fs::read_dir(d.path().join("volumes")).unwrap().count(), 0);
        assert_eq!(pool.get(&r.id).await.unwrap(), None);
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn deleted_records_are_retired_reused_and_never_loaded() {
        let d = tempfile::tempdir().unwrap();
        let deleted = d.path().join(SPARE_DIR);
        let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        let mut long = req("a-long-one", 1 << 20);
        long.parameters
            .insert("csi.storage.k8s.io/pvc/name".into(), "x".repeat(500));
        pool.create(&long).await.unwrap();
        pool.delete(&long.id).await.unwrap();
        // The record left the volumes directory; it sits retired, not loaded.
        assert!(names(&d.path().join("volumes")).is_empty());
        let retired = names(&deleted);
        assert_eq!(retired.len(), 1, "{retired:?}");
        assert!(is_retired_record(&retired[0]), "{retired:?}");
        assert_eq!(pool.get(&long.id).await.unwrap(), None);

        // The next create rewrites the retired file (shorter content: no tail
        // of the old record survives) and the record reads back exactly.
        let b = req("b", 1 << 20);
        let vb = pool.create(&b).await.unwrap();
        assert!(names(&deleted).is_empty());
        let text = fs::read(pool.record_path(&b.id.key)).unwrap();
        assert_eq!(serde_json::from_slice::<Volume>(&text).unwrap(), vb);
        assert_eq!(
            fs::metadata(pool.record_path(&b.id.key))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );

        // Deleted records found at start are removed and never become volumes;
        // files the driver did not write are left alone.
        pool.delete(&b.id).await.unwrap();
        assert_eq!(names(&deleted).len(), 1);
        fs::write(deleted.join("notes.txt"), b"mine").unwrap();
        drop(pool);
        let again = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        assert!(again.list().await.unwrap().is_empty());
        assert_eq!(names(&deleted), ["notes.txt"]);
        assert!(names(&d.path().join("volumes")).is_empty());
    }

    #[tokio::test]
    async fn retired_records_beyond_the_cap_are_unlinked() {
        let d = tempfile::tempdir().unwrap();
        let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        let n = MAX_SPARES + 3;
        let reqs: Vec<_> = (0..n).map(|i| req(&format!("v{i}"), 4096)).collect();
        for r in &reqs {
            pool.create(r).await.unwrap();
        }
        for r in &reqs {
            pool.delete(&r.id).await.unwrap();
        }
        let deleted = d.path().join(SPARE_DIR);
        for _ in 0..200 {
            if names(&deleted).len() == MAX_SPARES {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(names(&deleted).len(), MAX_SPARES);
        assert_eq!(pool.state().spares.len(), MAX_SPARES);
    }

    #[test]
    fn retired_record_names() {
        let key = "0123456789abcdef0123456789abcdef";
        assert!(is_retired_record(&format!("{key}.json.12.0")));
        for bad in [
            format!("{key}.json"),
            format!("{key}.json.12"),
            format!("{key}.json.12.x"),
            format!("{key}.json.tmp.1.2"),
            "short.json.1.2".to_owned(),
            format!(".{key}.json.tmp.1.2"),
        ] {
            assert!(!is_retired_record(&bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn interrupted_create_is_completed_by_a_retry() {
        let d = tempfile::tempdir().unwrap();
        let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        let r = req("a", 1 << 20);
        // A crash after mkdir and before the record: only the directory exists.
        fs::create_dir(d.path().join("volumes").join(r.id.key.as_str())).unwrap();
        fs::write(d.path().join("volumes/.x.json.tmp.1.1"), b"{").unwrap();
        drop(pool);
        let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
        assert!(pool.list().await.unwrap().is_empty());
        assert!(!d.path().join("volumes/.x.json.tmp.1.1").exists());
        pool.create(&r).await.unwrap();
        assert_eq!(pool.list().await.unwrap().len(), 1);
    }

    /// This machine's test hosts and most CI kernels lack project quotas on a
    /// temp dir's filesystem; where that is so, `required` must refuse to start
    /// with an actionable message and `auto` must degrade and say why.
    #[tokio::test]
    async fn quota_modes_without_quota_support() {
        let d = tempfile::tempdir().unwrap();
        if crate::quota::unsupported_reason(d.path()).is_none() {
            crate::testing::skip(
                "quota_modes_without_quota_support",
                "the temp dir's filesystem enforces project quotas (the VM tests cover both cases)",
            );
            return;
        }
        let err = DirPool::open(cfg(d.path(), QuotaMode::Required))
            .await
            .err()
            .unwrap();
        let msg = err.to_string();
        assert!(msg.contains("quota: required"), "{msg}");
        assert!(matches!(err, PoolError::Misconfigured { .. }));
        let pool = DirPool::open(cfg(d.path(), QuotaMode::Auto)).await.unwrap();
        assert!(pool.unenforced_reason().is_some());
        let mut r = req("a", 1 << 20);
        r.inode_limit = Some(100);
        assert!(matches!(
            pool.create(&r).await,
            Err(PoolError::UnsupportedParameter(_))
        ));
    }

    #[test]
    fn project_candidates_are_deterministic_and_in_range() {
        let key = VolumeName::parse("x").unwrap().key();
        let a: Vec<u32> = project_candidates(&key).take(5).collect();
        let b: Vec<u32> = project_candidates(&key).take(5).collect();
        assert_eq!(a, b);
        assert!(a
            .iter()
            .all(|p| *p >= PROJECT_MIN && *p < PROJECT_MIN + PROJECT_SPAN));
        let mut st = State::new(Index::new(PoolName::parse("p").unwrap()));
        st.foreign_projects.insert(a[0]);
        assert_eq!(st.pick_project(&key), Some(a[1]));
    }
}
