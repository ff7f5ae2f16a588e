//! The driver's YAML config: which pools this node offers.
//!
//! ```yaml
//! defaultPool: fast
//! maxVolumesPerNode: 0       # 0: no limit reported to the scheduler
//! pools:
//!   - name: fast
//!     type: dir
//!     path: /var/lib/localvol/fast
//!     reserve: 5Gi           # never handed out
//!     capacity: 500Gi        # optional cap on what the pool offers
//!     defaultSize: 1Gi       # size of a volume created without a capacity range
//!     quota: auto            # required | auto | off: enforce sizes with project quotas
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, IoContext, Result};
use crate::ids::PoolName;
use crate::size::ByteSize;

/// Size of a volume whose CreateVolume asked for no particular capacity.
pub const DEFAULT_VOLUME_SIZE: u64 = 1 << 30;

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// Pool used when a StorageClass names none; the first pool when unset.
    #[serde(default)]
    pub default_pool: Option<PoolName>,
    /// Reported as NodeGetInfo `max_volumes_per_node`.
    #[serde(default)]
    pub max_volumes_per_node: i64,
    pub pools: Vec<PoolConfig>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum PoolConfig {
    Dir(DirPoolConfig),
}

impl PoolConfig {
    pub fn name(&self) -> &PoolName {
        match self {
            PoolConfig::Dir(d) => &d.name,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DirPoolConfig {
    pub name: PoolName,
    /// Directory that holds the pool's volumes; created (0700) when missing.
    pub path: PathBuf,
    /// Space on the filesystem that is never handed out.
    #[serde(default)]
    pub reserve: ByteSize,
    /// Upper bound on what the pool offers in total (default: the filesystem size).
    #[serde(default)]
    pub capacity: Option<ByteSize>,
    /// Size of a volume created without a capacity range.
    #[serde(default)]
    pub default_size: Option<ByteSize>,
    /// Size enforcement with project quotas.
    #[serde(default)]
    pub quota: QuotaMode,
}

/// Whether a dir pool enforces volume sizes with project quotas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuotaMode {
    /// Refuse to start unless the filesystem enforces project quotas.
    Required,
    /// Enforce where the filesystem can; warn where it cannot.
    #[default]
    Auto,
    /// Never set quotas (sizes are only accounted, not enforced).
    Off,
}

impl Config {
    pub fn from_yaml(text: &str) -> Result<Self> {
        let cfg: Config = serde_norway::from_str(text)
            .map_err(|e| Error::InvalidArgument(format!("config: {e}")))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).ctx(|| format!("reading config {path:?}"))?;
        Self::from_yaml(&text)
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))
    }

    /// The config `localvol serve` uses without `--config`: one directory pool in
    /// a folder of the user's choice. Nothing else needed: no cluster, no devices.
    pub fn embedded(base: &Path) -> Self {
        Config {
            default_pool: None,
            max_volumes_per_node: 0,
            pools: vec![PoolConfig::Dir(DirPoolConfig {
                name: PoolName::parse("default").expect("valid pool name"),
                path: base.join("pool"),
                reserve: ByteSize(0),
                capacity: None,
                default_size: None,
                quota: QuotaMode::Auto,
            })],
        }
    }

    fn validate(&self) -> Result<()> {
        if self.pools.is_empty() {
            return Err(Error::InvalidArgument("config lists no pools".into()));
        }
        let mut names = BTreeSet::new();
        let mut paths = BTreeSet::new();
        for p in &self.pools {
            if !names.insert(p.name().clone()) {
                return Err(Error::InvalidArgument(format!(
                    "pool {} is listed twice",
                    p.name()
                )));
            }
            match p {
                PoolConfig::Dir(d) => {
                    if !d.path.is_absolute() {
                        return Err(Error::InvalidArgument(format!(
                            "pool {}: path {:?} must be absolute",
                            d.name, d.path
                        )));
                    }
                    if !paths.insert(d.path.clone()) {
                        return Err(Error::InvalidArgument(format!(
                            "pool {}: path {:?} is used by another pool",
                            d.name, d.path
                        )));
                    }
                }
            }
        }
        if let Some(def) = &self.default_pool {
            if !names.contains(def) {
                return Err(Error::InvalidArgument(format!(
                    "defaultPool {def} is not a listed pool"
                )));
            }
        }
        if self.max_volumes_per_node < 0 {
            return Err(Error::InvalidArgument(
                "maxVolumesPerNode must not be negative".into(),
            ));
        }
        Ok(())
    }

    pub fn default_pool(&self) -> &PoolName {
        self.default_pool
            .as_ref()
            .unwrap_or_else(|| self.pools[0].name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_config() {
        let cfg = Config::from_yaml(
            "defaultPool: b\nmaxVolumesPerNode: 50\npools:\n\
             - {name: a, type: dir, path: /x/a}\n\
             - {name: b, type: dir, path: /x/b, reserve: 1Gi, capacity: 10Gi, defaultSize: 100Mi, quota: required}\n",
        )
        .unwrap();
        assert_eq!(cfg.default_pool().as_str(), "b");
        let PoolConfig::Dir(b) = &cfg.pools[1];
        assert_eq!(b.reserve.0, 1 << 30);
        assert_eq!(b.capacity.unwrap().0, 10 << 30);
        assert_eq!(b.quota, QuotaMode::Required);
        let PoolConfig::Dir(a) = &cfg.pools[0];
        assert_eq!(a.quota, QuotaMode::Auto);
    }

    #[test]
    fn rejects_bad_configs() {
        for (yaml, want) in [
            ("pools: []", "no pools"),
            ("pools: [{name: a, type: dir, path: rel}]", "absolute"),
            (
                "pools: [{name: a, type: dir, path: /a}, {name: a, type: dir, path: /b}]",
                "twice",
            ),
            (
                "pools: [{name: a, type: dir, path: /a}, {name: b, type: dir, path: /a}]",
                "another pool",
            ),
            (
                "defaultPool: z\npools: [{name: a, type: dir, path: /a}]",
                "not a listed pool",
            ),
            (
                "pools: [{name: a, type: dir, path: /a, colour: red}]",
                "unknown field",
            ),
            (
                "pools: [{name: A, type: dir, path: /a}]",
                "invalid pool name",
            ),
            ("pools: [{name: a, type: nfs, path: /a}]", "unknown variant"),
            (
                "pools: [{name: a, type: dir, path: /a, reserve: 5Zi}]",
                "unknown unit",
            ),
        ] {
            let err = Config::from_yaml(yaml).unwrap_err().to_string();
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }
}
