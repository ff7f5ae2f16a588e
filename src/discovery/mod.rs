//! Static discovery: disks an operator mounts under a discovery
//! directory (or block devices linked there) become volumes with a
//! deterministic handle, and released ones are cleaned before they are offered
//! again.
//!
//! - [`scan`]: finds the entries of each class and what they hold.
//! - [`cleanup`]: wipes a released entry, with a marker file that makes an
//!   interrupted cleanup survive a restart.
//!
//! Its config types (`discovery:`) live in `config/discovery.rs`.
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

pub mod cleanup;
pub mod k8s;
pub mod node;
pub mod pv;
pub mod scan;

/// Prefix of every static volume handle.
pub const HANDLE_PREFIX: &str = "static";

pub use crate::config::discovery::*;

/// What went wrong finding, checking or cleaning a discovered volume.
#[derive(Debug, thiserror::Error)]
pub enum StaticError {
    /// Mounted, bound or open elsewhere: not cleaned.
    #[error("{handle}: {why}")]
    InUse { handle: String, why: String },
    /// A pending cleanup whose entry is not there now (it may come back).
    #[error("volume {0} of a pending cleanup is not discovered now")]
    Vanished(String),
    /// A cleanup marker that cannot be trusted: its volume is not offered.
    #[error("cleanup marker {path:?}: {why}")]
    BadMarker {
        path: std::path::PathBuf,
        why: String,
    },
    /// The discovery config does not fit the entry (a bug or a config
    /// change under a running cleanup).
    #[error("{0}")]
    Config(String),
    #[error("cleanup marker: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Io(#[from] crate::error::IoError),
    #[error(transparent)]
    Fs(#[from] crate::fsutil::FsError),
    #[error(transparent)]
    Mount(#[from] crate::mount::MountError),
    #[error(transparent)]
    Command(#[from] crate::command::CommandError),
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
    use crate::config::ConfigError;
    use crate::ids::{ParsedId, VolumeId};
    use std::path::PathBuf;

    const POOLS: &str = "pools: [{name: a, type: dir, path: /x/a}]\n";

    fn with(classes: &str) -> Result<Config, ConfigError> {
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
