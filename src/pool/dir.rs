//! Directory pools: a volume is a directory under `<path>/volumes/`, its record
//! a JSON file beside it (`<key>/` and `<key>.json`).
//!
//! The records on disk are the truth. The in-memory index is rebuilt from them
//! at start and changed only after the matching record write has succeeded.
//! Creation writes the directory first and the record last, so the record is the
//! commit point: a directory without a record is an interrupted create, which a
//! retried create completes and a delete removes.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::{AccessType, Capacity, CapacityRange, CreateRequest, Expanded, Pool, Source, Volume};
use crate::config::{DirPoolConfig, DEFAULT_VOLUME_SIZE};
use crate::error::{blocking, Error, IoContext, Result};
use crate::fsutil::{self, FsStats};
use crate::ids::{PoolName, VolumeId, VolumeKey};
use crate::mount::MountTable;

const RECORD_VERSION: u32 = 1;
/// Volume sizes are rounded up to whole 4 KiB blocks.
const BLOCK: u64 = 4096;

pub struct DirPool {
    name: PoolName,
    root: PathBuf,
    volumes_dir: PathBuf,
    reserve: u64,
    cap: Option<u64>,
    default_size: u64,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    volumes: HashMap<VolumeKey, Volume>,
    /// Space promised to creates and expansions that are still writing.
    reserved: HashMap<VolumeKey, u64>,
}

impl State {
    fn allocated(&self) -> u64 {
        self.volumes.values().map(|v| v.size_bytes).sum::<u64>()
            + self.reserved.values().sum::<u64>()
    }
}

impl DirPool {
    pub async fn open(cfg: DirPoolConfig) -> Result<Self> {
        let DirPoolConfig {
            name,
            path,
            reserve,
            capacity,
            default_size,
        } = cfg;
        let pool_name = name.clone();
        let (root, volumes) = blocking(move || {
            fs::create_dir_all(&path).ctx(|| format!("pool {pool_name}: creating {path:?}"))?;
            let root =
                fs::canonicalize(&path).ctx(|| format!("pool {pool_name}: resolving {path:?}"))?;
            let volumes_dir = root.join("volumes");
            fsutil::ensure_dir(&volumes_dir, 0o700)?;
            let volumes = load_records(&pool_name, &volumes_dir)?;
            Ok((root, volumes))
        })
        .await?;
        tracing::info!(pool = %name, root = ?root, volumes = volumes.len(), "dir pool loaded");
        Ok(DirPool {
            name,
            volumes_dir: root.join("volumes"),
            root,
            reserve: reserve.0,
            cap: capacity.map(|c| c.0),
            default_size: default_size.map_or(DEFAULT_VOLUME_SIZE, |d| d.0),
            state: Arc::new(Mutex::new(State {
                volumes,
                reserved: HashMap::new(),
            })),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
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

    /// The most this pool could ever hold, and what is free for new volumes now.
    fn limits(&self, fs: &FsStats, allocated: u64) -> (u64, u64) {
        let total = self
            .cap
            .map_or(fs.total_bytes, |c| c.min(fs.total_bytes))
            .saturating_sub(self.reserve);
        let by_allocation = total.saturating_sub(allocated);
        let by_free_space = fs.available_bytes.saturating_sub(self.reserve);
        (total, by_allocation.min(by_free_space))
    }

    async fn stats(&self) -> Result<FsStats> {
        let root = self.root.clone();
        blocking(move || fsutil::fs_stats(&root)).await
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
    fn reserve_space(&self, key: &VolumeKey, bytes: u64, fs: &FsStats, what: &str) -> Result<()> {
        let mut st = self.state();
        let (total, free) = self.limits(fs, st.allocated());
        if bytes > total {
            return Err(Error::OutOfRange(format!(
                "{what}: {bytes} bytes is more than pool {} can ever hold ({total} bytes)",
                self.name
            )));
        }
        if bytes > free {
            return Err(Error::ResourceExhausted(format!(
                "{what}: pool {} has {free} bytes free, {bytes} requested",
                self.name
            )));
        }
        st.reserved.insert(key.clone(), bytes);
        Ok(())
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Reads every record; removes temp files left by interrupted writes.
fn load_records(pool: &PoolName, dir: &Path) -> Result<HashMap<VolumeKey, Volume>> {
    let mut out = HashMap::new();
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
        let text = fs::read(entry.path()).ctx(|| format!("reading {:?}", entry.path()))?;
        match serde_json::from_slice::<Volume>(&text) {
            Ok(v) if v.pool == pool.as_str() && v.id.ends_with(key.as_str()) => {
                out.insert(key, v);
            }
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

    fn supports(&self, access: AccessType) -> bool {
        access == AccessType::Mount
    }

    async fn check(&self) -> Result<()> {
        let dir = self.volumes_dir.clone();
        blocking(move || {
            let md = fs::metadata(&dir).ctx(|| format!("pool directory {dir:?}"))?;
            if !md.is_dir() {
                return Err(Error::Unavailable(format!("{dir:?} is not a directory")));
            }
            nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK)
                .ctx(|| format!("{dir:?} is not writable"))?;
            fsutil::fs_stats(&dir).map(|_| ())
        })
        .await
    }

    async fn create(&self, req: &CreateRequest) -> Result<Volume> {
        let key = req.id.key.clone();
        if let Some(existing) = self.state().volumes.get(&key).cloned() {
            return matches_request(existing, req);
        }
        let size = self.size_for(req.range)?;
        let fs = self.stats().await?;
        self.reserve_space(&key, size, &fs, &format!("volume {}", req.name.as_str()))?;

        let vol = Volume {
            version: RECORD_VERSION,
            id: req.id.to_string(),
            name: req.name.as_str().to_owned(),
            pool: self.name.to_string(),
            size_bytes: size,
            access_type: req.access_type,
            created_unix: now_unix(),
            parameters: req.parameters.clone(),
        };
        let (data, record, rec) = (self.data_dir(&key), self.record_path(&key), vol.clone());
        let res = blocking(move || {
            fsutil::ensure_dir(&data, 0o777)?;
            let json =
                serde_json::to_vec_pretty(&rec).map_err(|e| Error::Internal(e.to_string()))?;
            fsutil::write_atomic(&record, &json)
        })
        .await;
        let mut st = self.state();
        st.reserved.remove(&key);
        res?;
        st.volumes.insert(key, vol.clone());
        Ok(vol)
    }

    async fn delete(&self, id: &VolumeId) -> Result<()> {
        let key = id.key.clone();
        let (data, record) = (self.data_dir(&key), self.record_path(&key));
        let what = id.to_string();
        blocking(move || {
            let table = MountTable::read()?;
            if let Some(loc) = table.locate(&data) {
                if let Some(m) = table.mounts_of(&loc).next() {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {what} is still mounted at {:?}; unpublish and unstage it first",
                        m.mount_point
                    )));
                }
            }
            if let Some(m) = table.mounts_below(&data).next() {
                return Err(Error::FailedPrecondition(format!(
                    "volume {what} has a mount inside it at {:?}; not deleting",
                    m.mount_point
                )));
            }
            fsutil::remove_tree(&data)?;
            fsutil::remove_file_durable(&record)
        })
        .await?;
        self.state().volumes.remove(&key);
        Ok(())
    }

    async fn expand(&self, id: &VolumeId, range: CapacityRange) -> Result<Expanded> {
        let key = id.key.clone();
        let current = self
            .state()
            .volumes
            .get(&key)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("volume {id} does not exist")))?;
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
            return Err(Error::OutOfRange(format!(
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
        let fs = self.stats().await?;
        self.reserve_space(
            &key,
            new_size - current.size_bytes,
            &fs,
            &format!("expanding {id}"),
        )?;
        let mut grown = current.clone();
        grown.size_bytes = new_size;
        let (record, rec) = (self.record_path(&key), grown.clone());
        let res = blocking(move || {
            let json =
                serde_json::to_vec_pretty(&rec).map_err(|e| Error::Internal(e.to_string()))?;
            fsutil::write_atomic(&record, &json)
        })
        .await;
        let mut st = self.state();
        st.reserved.remove(&key);
        res?;
        st.volumes.insert(key, grown);
        Ok(Expanded {
            size_bytes: new_size,
            node_expansion_required: false,
        })
    }

    async fn get(&self, id: &VolumeId) -> Result<Option<Volume>> {
        Ok(self.state().volumes.get(&id.key).cloned())
    }

    async fn list(&self) -> Result<Vec<Volume>> {
        Ok(self.state().volumes.values().cloned().collect())
    }

    async fn capacity(&self) -> Result<Capacity> {
        let fs = self.stats().await?;
        let (_, free) = self.limits(&fs, self.state().allocated());
        Ok(Capacity {
            available_bytes: free,
            maximum_volume_size: free,
        })
    }

    fn source(&self, vol: &Volume) -> Result<Source> {
        let key = vol
            .id
            .rsplit_once('.')
            .and_then(|(_, k)| VolumeKey::parse(k))
            .ok_or_else(|| Error::Internal(format!("record has a malformed id {:?}", vol.id)))?;
        Ok(Source::Directory(self.data_dir(&key)))
    }
}

/// An existing volume answers a repeated CreateVolume only when the request
/// describes it; anything else is ALREADY_EXISTS.
fn matches_request(existing: Volume, req: &CreateRequest) -> Result<Volume> {
    let mismatch = if existing.name != req.name.as_str() {
        Some("another name hashes to the same id".to_owned())
    } else if !req.range.admits(existing.size_bytes) {
        Some(format!("it has {} bytes", existing.size_bytes))
    } else if existing.access_type != req.access_type {
        Some(format!("it is a {:?} volume", existing.access_type))
    } else if existing.parameters != req.parameters {
        Some("it was created with other parameters".to_owned())
    } else {
        None
    };
    match mismatch {
        None => Ok(existing),
        Some(why) => Err(Error::AlreadyExists(format!(
            "volume {:?} already exists and does not match the request: {why}",
            req.name.as_str()
        ))),
    }
}
