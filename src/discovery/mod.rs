//! Static discovery (issue 5): disks an operator mounts under a discovery
//! directory (or block devices linked there) become volumes with a
//! deterministic handle, and released ones are cleaned before they are offered
//! again.
//!
//! - [`scan`]: finds the entries of each class and what they hold.
//! - [`cleanup`]: wipes a released entry, with a marker file that makes an
//!   interrupted cleanup survive a restart.
//!
//! The config types live here; `config.rs` only holds the `discovery:` field.
//!
//! ```yaml
//! discovery:
//!   classes:
//!     - storageClass: local-ssd
//!       hostDir: /mnt/disks
//!       volumeMode: Filesystem      # or Block
//!       namePattern: "ssd*"         # glob on the entry name (default "*")
//!       accessModes: [ReadWriteOnce]
//!       cleanup: {method: delete-contents}   # blkdiscard | zero | shred | command
//!       labels: {tier: fast}
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

pub mod cleanup;
pub mod k8s;
pub mod node;
pub mod orphans;
pub mod pv;
pub mod scan;

/// Prefix of every static volume handle.
pub const HANDLE_PREFIX: &str = "static";

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
        let bad = |m: String| {
            Err(Error::InvalidArgument(format!(
                "discovery class {:?}: {m}",
                self.storage_class
            )))
        };
        if !is_dns_subdomain(&self.storage_class) {
            return bad("storageClass is not a valid Kubernetes name".into());
        }
        if !self.host_dir.is_absolute()
            || self
                .host_dir
                .components()
                .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
            || self.host_dir.as_os_str().as_encoded_bytes().contains(&0)
        {
            return bad(format!(
                "hostDir {:?} must be absolute, without '.' or '..'",
                self.host_dir
            ));
        }
        if self.host_dir.parent().is_none() {
            return bad("hostDir may not be /".into());
        }
        if let Err(e) = glob::Pattern::new(&self.name_pattern) {
            return bad(format!("namePattern {:?}: {e}", self.name_pattern));
        }
        if self.name_pattern.contains('/') {
            return bad("namePattern matches entry names and may not contain '/'".into());
        }
        if self.access_modes.is_empty() {
            return bad("accessModes is empty".into());
        }
        for m in &self.access_modes {
            if !ACCESS_MODES.contains(&m.as_str()) {
                return bad(format!(
                    "access mode {m:?} is not one of {}",
                    ACCESS_MODES.join(", ")
                ));
            }
        }
        match (&self.fs_type, self.volume_mode) {
            (Some(_), VolumeMode::Block) => return bad("fsType applies to Filesystem only".into()),
            (Some(f), _) if !is_label_value(f) || f.is_empty() => {
                return bad(format!("fsType {f:?} is not a filesystem type name"))
            }
            _ => {}
        }
        match (self.cleanup.method, self.volume_mode) {
            (CleanupMethod::DeleteContents, VolumeMode::Block) => {
                return bad("cleanup delete-contents needs volumeMode Filesystem".into())
            }
            (
                CleanupMethod::Blkdiscard | CleanupMethod::Zero | CleanupMethod::Shred,
                VolumeMode::Filesystem,
            ) => {
                return bad(format!(
                    "cleanup {:?} needs volumeMode Block",
                    self.cleanup.method
                ))
            }
            _ => {}
        }
        match (&self.cleanup.command, self.cleanup.method) {
            (Some(c), CleanupMethod::Command) => {
                if c.is_empty() || c[0].is_empty() {
                    return bad("cleanup command is empty".into());
                }
                if c.iter().any(|a| a.contains('\0')) {
                    return bad("cleanup command contains NUL".into());
                }
            }
            (None, CleanupMethod::Command) => {
                return bad("cleanup method command needs a command".into())
            }
            (Some(_), _) => return bad("cleanup command is only for method command".into()),
            (None, _) => {}
        }
        for (k, v) in &self.labels {
            if !is_label_key(k) || !is_label_value(v) {
                return bad(format!("label {k:?}={v:?} is not a valid Kubernetes label"));
            }
        }
        Ok(())
    }
}

impl DiscoveryConfig {
    pub fn validate(&self) -> Result<()> {
        if self.classes.is_empty() {
            return Err(Error::InvalidArgument("discovery lists no classes".into()));
        }
        if !self.state_dir.is_absolute()
            || self
                .state_dir
                .components()
                .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        {
            return Err(Error::InvalidArgument(format!(
                "discovery stateDir {:?} must be absolute, without '.' or '..'",
                self.state_dir
            )));
        }
        let mut dirs = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for c in &self.classes {
            c.validate()?;
            if !dirs.insert(c.host_dir.clone()) || !keys.insert(c.key()) {
                return Err(Error::InvalidArgument(format!(
                    "discovery hostDir {:?} is used by two classes",
                    c.host_dir
                )));
            }
        }
        // One hostDir inside another would discover the inner one as an entry.
        for a in &dirs {
            for b in &dirs {
                if a != b && b.starts_with(a) {
                    return Err(Error::InvalidArgument(format!(
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

/// The deterministic handle of a discovered entry:
/// `static.<class key, 16 hex>.<entry key, 32 hex>`. The entry key is a hash of
/// the entry's name; the node finds the entry again by scanning the class's
/// directory. A handle can never contain `/`, `..` or NUL, and never parses as a
/// dynamic `<pool>.<key>` id (its "pool" part contains a dot).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StaticHandle {
    pub class_key: String,
    pub entry_key: String,
}

impl StaticHandle {
    pub fn new(class: &DiscoveryClass, entry_name: &std::ffi::OsStr) -> Self {
        StaticHandle {
            class_key: class.key(),
            entry_key: hex_digest(entry_name.as_encoded_bytes(), 16),
        }
    }

    /// Decodes a handle string; None when it is not a static handle.
    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.split('.');
        let (Some(HANDLE_PREFIX), Some(class), Some(entry), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let hex = |p: &str, n: usize| {
            p.len() == n
                && p.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        (hex(class, 16) && hex(entry, 32)).then(|| StaticHandle {
            class_key: class.into(),
            entry_key: entry.into(),
        })
    }
}

impl std::fmt::Display for StaticHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{HANDLE_PREFIX}.{}.{}", self.class_key, self.entry_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::ids::{ParsedId, VolumeId};

    const POOLS: &str = "pools: [{name: a, type: dir, path: /x/a}]\n";

    fn with(classes: &str) -> Result<Config> {
        Config::from_yaml(&format!("{POOLS}discovery:\n  classes:\n{classes}"))
    }

    #[test]
    fn parses_discovery_classes() {
        let cfg = with(
            "  - {storageClass: local-ssd, hostDir: /mnt/disks, volumeMode: Filesystem, fsType: ext4,\n\
             \x20    namePattern: 'ssd*', cleanup: {method: delete-contents}, labels: {tier: fast}}\n\
             \x20 - {storageClass: local-raw, hostDir: /dev/disks, volumeMode: Block,\n\
             \x20    accessModes: [ReadWriteOncePod], cleanup: {method: command, command: [/bin/wipe, --all]}}\n",
        )
        .unwrap();
        let d = cfg.discovery.unwrap();
        assert_eq!(d.classes.len(), 2);
        let fs = &d.classes[0];
        assert_eq!(fs.volume_mode, VolumeMode::Filesystem);
        assert_eq!(fs.access_modes, ["ReadWriteOnce"]);
        assert!(fs.pattern().matches("ssd1"));
        assert!(!fs.pattern().matches("hdd1"));
        let raw = &d.classes[1];
        assert_eq!(raw.name_pattern, "*");
        assert_eq!(raw.cleanup.method, CleanupMethod::Command);
        assert_eq!(
            raw.cleanup.command.as_deref().unwrap(),
            ["/bin/wipe", "--all"]
        );
        assert_ne!(fs.key(), raw.key());
        assert_eq!(d.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
    }

    #[test]
    fn rejects_bad_discovery_classes() {
        let fs = "storageClass: s, volumeMode: Filesystem, cleanup: {method: delete-contents}";
        let blk = "storageClass: s, volumeMode: Block";
        for (class, want) in [
            (format!("{{{fs}, hostDir: rel}}"), "absolute"),
            (format!("{{{fs}, hostDir: /a/../b}}"), "absolute"),
            (format!("{{{fs}, hostDir: /}}"), "may not be /"),
            (format!("{{{fs}, hostDir: /a, namePattern: '[a'}}"), "namePattern"),
            (format!("{{{fs}, hostDir: /a, namePattern: 'a/b'}}"), "'/'"),
            (format!("{{{fs}, hostDir: /a, accessModes: [ReadWriteMany]}}"), "access mode"),
            (format!("{{{fs}, hostDir: /a, accessModes: []}}"), "empty"),
            (format!("{{{fs}, hostDir: /a, labels: {{'bad key': x}}}}"), "label"),
            (format!("{{{fs}, hostDir: /a, colour: red}}"), "unknown field"),
            (
                "{storageClass: Bad_Name, hostDir: /a, volumeMode: Filesystem, cleanup: {method: delete-contents}}".into(),
                "valid Kubernetes name",
            ),
            (format!("{{{blk}, hostDir: /a, cleanup: {{method: delete-contents}}}}"), "needs volumeMode Filesystem"),
            (
                "{storageClass: s, volumeMode: Filesystem, hostDir: /a, cleanup: {method: blkdiscard}}".into(),
                "needs volumeMode Block",
            ),
            (
                "{storageClass: s, volumeMode: Filesystem, hostDir: /a, cleanup: {method: zero}}".into(),
                "needs volumeMode Block",
            ),
            (format!("{{{blk}, hostDir: /a, cleanup: {{method: command}}}}"), "needs a command"),
            (format!("{{{blk}, hostDir: /a, cleanup: {{method: command, command: []}}}}"), "empty"),
            (format!("{{{blk}, hostDir: /a, cleanup: {{method: zero, command: [x]}}}}"), "only for method command"),
            (format!("{{{blk}, hostDir: /a, fsType: ext4, cleanup: {{method: zero}}}}"), "Filesystem only"),
            (format!("{{{blk}, hostDir: /a, cleanup: {{method: format}}}}"), "unknown variant"),
        ] {
            let err = with(&format!("  - {class}\n")).unwrap_err().to_string();
            assert!(err.contains(want), "{class}: {err}");
        }
        let err = with(&format!(
            "  - {{{fs}, hostDir: /a}}\n  - {{{fs}, hostDir: /a}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("two classes"), "{err}");
        let err = with(&format!(
            "  - {{{fs}, hostDir: /a}}\n  - {{{fs}, hostDir: /a/b}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("inside"), "{err}");
        let err = Config::from_yaml(&format!("{POOLS}discovery: {{classes: []}}\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no classes"), "{err}");
        let err = Config::from_yaml(&format!(
            "{POOLS}discovery: {{stateDir: rel, classes: [{{{fs}, hostDir: /a}}]}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("stateDir"), "{err}");
    }

    #[test]
    fn handles_are_safe_deterministic_and_decodable() {
        let cfg = with(
            "  - {storageClass: s, hostDir: /mnt/disks, volumeMode: Filesystem, cleanup: {method: delete-contents}}\n",
        )
        .unwrap();
        let class = &cfg.discovery.as_ref().unwrap().classes[0];
        let h = StaticHandle::new(class, "disk..1/x".as_ref());
        assert_eq!(h, StaticHandle::new(class, "disk..1/x".as_ref()));
        assert_ne!(h, StaticHandle::new(class, "disk2".as_ref()));
        let s = h.to_string();
        assert!(s.len() <= crate::ids::MAX_ID_LEN, "{s}");
        assert!(
            !s.contains('/') && !s.contains("..") && !s.contains('\0'),
            "{s}"
        );
        assert_eq!(StaticHandle::parse(&s), Some(h.clone()));
        assert_eq!(
            cfg.discovery
                .as_ref()
                .unwrap()
                .class_by_key(&h.class_key)
                .unwrap()
                .host_dir,
            class.host_dir
        );
        // Never mistaken for a dynamic volume id.
        assert!(matches!(
            VolumeId::parse("volume id", &s).unwrap(),
            ParsedId::Foreign(_)
        ));
        for bad in [
            "static",
            "static.abc.def",
            "pool.0123456789abcdef0123456789abcdef",
            &format!("{s}.x"),
            &s.to_uppercase(),
            &s.replacen("static", "statik", 1),
        ] {
            assert_eq!(StaticHandle::parse(bad), None, "{bad}");
        }
    }
}
