//! `discovery:` in the config: the classes of static discovery, checked at
//! load time. Used by `discovery/`, which re-exports these types.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::ConfigError;

type Result<T, E = ConfigError> = std::result::Result<T, E>;

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiscoveryConfig {
    pub classes: Vec<DiscoveryClass>,
    /// Where cleanup markers are kept (`<stateDir>/cleanup/<handle>.json`).
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
}

/// Default for `discovery.stateDir`.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/localvol/state";

fn default_state_dir() -> PathBuf {
    DEFAULT_STATE_DIR.into()
}

/// How a discovered entry is consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeMode {
    /// A mounted filesystem: the entry must be a mount point.
    Filesystem,
    /// A raw block device: the entry is a device node or a symlink to one.
    Block,
}

impl VolumeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeMode::Filesystem => "Filesystem",
            VolumeMode::Block => "Block",
        }
    }
}

/// How a released volume is wiped before it is offered again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CleanupMethod {
    /// Remove everything inside the mount point (Filesystem only).
    DeleteContents,
    /// `blkdiscard` the device (Block only).
    Blkdiscard,
    /// Overwrite the device with zeroes (Block only).
    Zero,
    /// `shred` the device (Block only).
    Shred,
    /// Run the configured command with the path as its last argument.
    Command,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CleanupConfig {
    pub method: CleanupMethod,
    /// Program and arguments for `method: command` (no shell).
    #[serde(default)]
    pub command: Option<Vec<String>>,
}

/// Kubernetes access modes a node-local volume can offer.
pub const ACCESS_MODES: &[&str] = &["ReadWriteOnce", "ReadWriteOncePod", "ReadOnlyMany"];

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiscoveryClass {
    pub storage_class: String,
    /// Directory whose first-level entries are the volumes.
    pub host_dir: PathBuf,
    pub volume_mode: VolumeMode,
    /// Filesystem type recorded on the PV (Filesystem mode).
    #[serde(default)]
    pub fs_type: Option<String>,
    /// Glob the entry name must match.
    #[serde(default = "default_pattern")]
    pub name_pattern: String,
    #[serde(default = "default_access_modes")]
    pub access_modes: Vec<String>,
    pub cleanup: CleanupConfig,
    /// Extra labels on the PVs of this class.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

fn default_pattern() -> String {
    "*".into()
}

fn default_access_modes() -> Vec<String> {
    vec!["ReadWriteOnce".into()]
}

/// A Kubernetes object name (DNS subdomain, RFC 1123).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// A label key: optional DNS-subdomain prefix and a name of at most 63 characters.
fn is_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    prefix.is_none_or(is_dns_subdomain) && !name.is_empty() && is_label_value(name)
}

fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && v.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
}

impl DiscoveryClass {
    /// Short stable key of the class: derived from its host directory (unique
    /// among classes), so renaming the StorageClass keeps handles stable.
    pub fn key(&self) -> String {
        hex_digest(self.host_dir.as_os_str().as_encoded_bytes(), 8)
    }

    pub fn pattern(&self) -> glob::Pattern {
        glob::Pattern::new(&self.name_pattern).expect("validated at load")
    }

    fn validate(&self) -> Result<()> {
        self.check_names_and_paths()
            .and_then(|()| self.check_modes())
            .and_then(|()| self.check_cleanup())
            .map_err(|m| {
                ConfigError::Invalid(format!("discovery class {:?}: {m}", self.storage_class))
            })
    }

    /// storageClass, hostDir, namePattern and labels.
    fn check_names_and_paths(&self) -> std::result::Result<(), String> {
        if !is_dns_subdomain(&self.storage_class) {
            return Err("storageClass is not a valid Kubernetes name".into());
        }
        if !self.host_dir.is_absolute()
            || self
                .host_dir
                .components()
                .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
            || self.host_dir.as_os_str().as_encoded_bytes().contains(&0)
        {
            return Err(format!(
                "hostDir {:?} must be absolute, without '.' or '..'",
                self.host_dir
            ));
        }
        if self.host_dir.parent().is_none() {
            return Err("hostDir may not be /".into());
        }
        if let Err(e) = glob::Pattern::new(&self.name_pattern) {
            return Err(format!("namePattern {:?}: {e}", self.name_pattern));
        }
        if self.name_pattern.contains('/') {
            return Err("namePattern matches entry names and may not contain '/'".into());
        }
        for (k, v) in &self.labels {
            if !is_label_key(k) || !is_label_value(v) {
                return Err(format!("label {k:?}={v:?} is not a valid Kubernetes label"));
            }
        }
        Ok(())
    }

    /// accessModes and fsType against volumeMode.
    fn check_modes(&self) -> std::result::Result<(), String> {
        if self.access_modes.is_empty() {
            return Err("accessModes is empty".into());
        }
        if let Some(m) = self
            .access_modes
            .iter()
            .find(|m| !ACCESS_MODES.contains(&m.as_str()))
        {
            return Err(format!(
                "access mode {m:?} is not one of {}",
                ACCESS_MODES.join(", ")
            ));
        }
        match (&self.fs_type, self.volume_mode) {
            (Some(_), VolumeMode::Block) => Err("fsType applies to Filesystem only".into()),
            (Some(f), _) if !is_label_value(f) || f.is_empty() => {
                Err(format!("fsType {f:?} is not a filesystem type name"))
            }
            _ => Ok(()),
        }
    }

    /// The cleanup method against volumeMode, and its command.
    fn check_cleanup(&self) -> std::result::Result<(), String> {
        match (self.cleanup.method, self.volume_mode) {
            (CleanupMethod::DeleteContents, VolumeMode::Block) => {
                return Err("cleanup delete-contents needs volumeMode Filesystem".into())
            }
            (
                CleanupMethod::Blkdiscard | CleanupMethod::Zero | CleanupMethod::Shred,
                VolumeMode::Filesystem,
            ) => {
                return Err(format!(
                    "cleanup {:?} needs volumeMode Block",
                    self.cleanup.method
                ))
            }
            _ => {}
        }
        match (&self.cleanup.command, self.cleanup.method) {
            (Some(c), CleanupMethod::Command) if c.is_empty() || c[0].is_empty() => {
                Err("cleanup command is empty".into())
            }
            (Some(c), CleanupMethod::Command) if c.iter().any(|a| a.contains('\0')) => {
                Err("cleanup command contains NUL".into())
            }
            (None, CleanupMethod::Command) => Err("cleanup method command needs a command".into()),
            (Some(_), m) if m != CleanupMethod::Command => {
                Err("cleanup command is only for method command".into())
            }
            _ => Ok(()),
        }
    }
}

impl DiscoveryConfig {
    pub fn validate(&self) -> Result<()> {
        if self.classes.is_empty() {
            return Err(ConfigError::Invalid("discovery lists no classes".into()));
        }
        if !self.state_dir.is_absolute()
            || self
                .state_dir
                .components()
                .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        {
            return Err(ConfigError::Invalid(format!(
                "discovery stateDir {:?} must be absolute, without '.' or '..'",
                self.state_dir
            )));
        }
        let mut dirs = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for c in &self.classes {
            c.validate()?;
            if !dirs.insert(c.host_dir.clone()) || !keys.insert(c.key()) {
                return Err(ConfigError::Invalid(format!(
                    "discovery hostDir {:?} is used by two classes",
                    c.host_dir
                )));
            }
        }
        // One hostDir inside another would discover the inner one as an entry.
        for a in &dirs {
            for b in &dirs {
                if a != b && b.starts_with(a) {
                    return Err(ConfigError::Invalid(format!(
                        "discovery hostDir {b:?} lies inside {a:?}"
                    )));
                }
            }
        }
        Ok(())
    }

    pub fn class_by_key(&self, key: &str) -> Option<&DiscoveryClass> {
        self.classes.iter().find(|c| c.key() == key)
    }
}

/// First `bytes` bytes of SHA-256, in hex.
pub fn hex_digest(data: &[u8], bytes: usize) -> String {
    Sha256::digest(data)[..bytes]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
