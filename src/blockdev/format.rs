//! Format options a StorageClass may choose (`format.*` parameters), as
//! typed values: each key is one of a fixed set, each value a boolean or a
//! feature from an allow-list, and [`FormatOptions::mkfs_args`] renders them
//! as mkfs arguments the driver writes itself. No text of a request reaches
//! a command line.
//!
//! The same keys travel from CreateVolume (the StorageClass parameters) to
//! NodeStageVolume (the volume context), where they are decoded again.

use super::FsType;

/// Prefix of every format parameter.
pub const FORMAT_PREFIX: &str = "format.";

/// The XFS on-disk features a class may turn on or off, each a key
/// `format.xfs.<name>` with the value `true` or `false`, and the mkfs.xfs
/// option that sets it.
const XFS_FEATURES: [(&str, XfsSection); 4] = [
    // Large extent counters (kernel 5.19+ mounts it; mkfs.xfs 6.5+ turns
    // it on by default): off by default here, see `mkfs_args`.
    ("nrext64", XfsSection::Inode),
    // Timestamps beyond 2038 (kernel 5.10+).
    ("bigtime", XfsSection::Metadata),
    // Inode btree counters (kernel 5.10+).
    ("inobtcount", XfsSection::Metadata),
    // Shared extents (kernel 4.9+; 5.1+ without the experimental warning).
    ("reflink", XfsSection::Metadata),
];

/// The mkfs.xfs option a feature belongs to (`-i` or `-m`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum XfsSection {
    Inode,
    Metadata,
}

/// The ext4 features `format.ext4.features` may name, each on (`name`) or
/// off (`^name`): those a newer mke2fs turns on by default and an older
/// kernel or e2fsck may not know, and a few others a class commonly sets.
const EXT4_FEATURES: [&str; 8] = [
    "64bit",
    "metadata_csum",
    "metadata_csum_seed",
    "orphan_file",
    "huge_file",
    "large_dir",
    "extra_isize",
    "dir_nlink",
];

/// The key that names ext4 features.
const EXT4_FEATURES_KEY: &str = "ext4.features";

/// A bad `format.*` parameter: what was wrong with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct FormatError(pub String);

/// The format options of a volume, decoded. `None` for a feature: mkfs's
/// own default (for `nrext64`: off where mkfs.xfs knows it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FormatOptions {
    xfs: [Option<bool>; XFS_FEATURES.len()],
    ext4: [Option<bool>; EXT4_FEATURES.len()],
}

fn parse_bool(key: &str, v: &str) -> Result<bool, FormatError> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(FormatError(format!(
            "{FORMAT_PREFIX}{key} must be \"true\" or \"false\" (got {:?})",
            crate::ids::truncate(v)
        ))),
    }
}

fn known_keys() -> String {
    let mut keys: Vec<String> = XFS_FEATURES
        .iter()
        .map(|(n, _)| format!("{FORMAT_PREFIX}xfs.{n}"))
        .collect();
    keys.push(format!("{FORMAT_PREFIX}{EXT4_FEATURES_KEY}"));
    keys.join(", ")
}

impl FormatOptions {
    /// Whether `key` (a parameter or volume-context key) is a format key;
    /// [`FormatOptions::set`] then decodes it or says why not.
    pub fn is_format_key(key: &str) -> bool {
        key.starts_with(FORMAT_PREFIX)
    }

    /// Decodes one `format.*` parameter into these options.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), FormatError> {
        let Some(name) = key.strip_prefix(FORMAT_PREFIX) else {
            return Err(FormatError(format!("{key:?} is not a format parameter")));
        };
        if let Some(feature) = name.strip_prefix("xfs.") {
            if let Some(i) = XFS_FEATURES.iter().position(|(n, _)| *n == feature) {
                self.xfs[i] = Some(parse_bool(name, value)?);
                return Ok(());
            }
        } else if name == EXT4_FEATURES_KEY {
            return self.set_ext4_features(value);
        }
        Err(FormatError(format!(
            "unknown format parameter {:?} (known: {})",
            crate::ids::truncate(key),
            known_keys()
        )))
    }

    /// `format.ext4.features`: a comma-separated list of features from
    /// [`EXT4_FEATURES`], each optionally prefixed `^` (off), each at most
    /// once.
    fn set_ext4_features(&mut self, value: &str) -> Result<(), FormatError> {
        let key = format!("{FORMAT_PREFIX}{EXT4_FEATURES_KEY}");
        if value.is_empty() {
            return Err(FormatError(format!("{key} must not be empty")));
        }
        let mut out = [None; EXT4_FEATURES.len()];
        for item in value.split(',') {
            let (name, on) = match item.strip_prefix('^') {
                Some(n) => (n, false),
                None => (item, true),
            };
            let i = EXT4_FEATURES.iter().position(|f| *f == name).ok_or_else(|| {
                FormatError(format!(
                    "{key}: {:?} is not a feature the driver sets (allowed, each optionally prefixed ^ to turn it off: {})",
                    crate::ids::truncate(item),
                    EXT4_FEATURES.join(", ")
                ))
            })?;
            if out[i].is_some() {
                return Err(FormatError(format!("{key}: {name} is named twice")));
            }
            out[i] = Some(on);
        }
        self.ext4 = out;
        Ok(())
    }

    /// Decodes every `format.*` key of `params` (other keys are skipped).
    pub fn from_params<'a>(
        params: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<Self, FormatError> {
        let mut out = Self::default();
        for (k, v) in params {
            if Self::is_format_key(k) {
                out.set(k, v)?;
            }
        }
        Ok(out)
    }

    /// Whether no option is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The filesystem the options are for, if any is set: options of one
    /// filesystem only, so a class cannot mix them up.
    pub fn filesystem(&self) -> Result<Option<FsType>, FormatError> {
        let xfs = self.xfs.iter().any(Option::is_some);
        let ext4 = self.ext4.iter().any(Option::is_some);
        match (xfs, ext4) {
            (true, true) => Err(FormatError(format!(
                "{FORMAT_PREFIX}xfs.* and {FORMAT_PREFIX}ext4.* cannot both be set: a volume has one filesystem"
            ))),
            (true, false) => Ok(Some(FsType::Xfs)),
            (false, true) => Ok(Some(FsType::Ext4)),
            (false, false) => Ok(None),
        }
    }

    /// Checks that the options are for `fs` (the filesystem the volume gets).
    pub fn check_for(&self, fs: FsType) -> Result<(), FormatError> {
        match self.filesystem()? {
            Some(want) if want != fs => Err(FormatError(format!(
                "{FORMAT_PREFIX}{}.* options are set, but the volume's filesystem is {} (csi.storage.k8s.io/fstype or the pool's default)",
                want.as_str(),
                fs.as_str()
            ))),
            _ => Ok(()),
        }
    }

    /// The options as volume-context entries, in canonical form (what
    /// NodeStageVolume decodes again).
    pub fn to_context(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = XFS_FEATURES
            .iter()
            .zip(self.xfs)
            .filter_map(|((n, _), v)| v.map(|v| (format!("{FORMAT_PREFIX}xfs.{n}"), v.to_string())))
            .collect();
        let ext4 = self.ext4_list();
        if !ext4.is_empty() {
            out.push((format!("{FORMAT_PREFIX}{EXT4_FEATURES_KEY}"), ext4));
        }
        out
    }

    /// The ext4 features set, as mke2fs's `-O` takes them.
    fn ext4_list(&self) -> String {
        EXT4_FEATURES
            .iter()
            .zip(self.ext4)
            .filter_map(|(n, v)| v.map(|on| if on { n.to_string() } else { format!("^{n}") }))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The mkfs arguments for `fs` (before the device), beyond the driver's
    /// fixed ones. XFS: `-i nrext64=0` unless the class turns it on, when
    /// the installed mkfs.xfs knows the option (`knows_nrext64`), so that a
    /// newer mkfs.xfs does not make filesystems an older node kernel
    /// (< 5.19) cannot mount.
    pub fn mkfs_args(&self, fs: FsType, knows_nrext64: bool) -> Vec<String> {
        match fs {
            FsType::Ext4 => match self.ext4_list() {
                l if l.is_empty() => vec![],
                l => vec!["-O".to_owned(), l],
            },
            FsType::Xfs => {
                let (mut inode, mut meta) = (vec![], vec![]);
                for ((name, section), v) in XFS_FEATURES.iter().zip(self.xfs) {
                    let v = match (v, *name) {
                        (Some(v), _) => v,
                        (None, "nrext64") if knows_nrext64 => false,
                        (None, _) => continue,
                    };
                    let opt = format!("{name}={}", u8::from(v));
                    match section {
                        XfsSection::Inode => inode.push(opt),
                        XfsSection::Metadata => meta.push(opt),
                    }
                }
                let mut args = vec![];
                for (flag, opts) in [("-i", inode), ("-m", meta)] {
                    if !opts.is_empty() {
                        args.push(flag.to_owned());
                        args.push(opts.join(","));
                    }
                }
                args
            }
        }
    }
}

/// Whether mkfs.xfs of this version knows `-i nrext64` (xfsprogs 5.19+),
/// from `mkfs.xfs -V` ("mkfs.xfs version 6.1.0"). `None`: not understood.
pub fn version_knows_nrext64(version_output: &str) -> Option<bool> {
    let v = version_output.split_whitespace().last()?;
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next()??, parts.next().flatten().unwrap_or(0));
    Some((major, minor) >= (5, 19))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> Result<FormatOptions, FormatError> {
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        FormatOptions::from_params(owned.iter().map(|(k, v)| (k, v)))
    }

    #[test]
    fn default_xfs_turns_nrext64_off_only_where_mkfs_knows_it() {
        let d = FormatOptions::default();
        assert!(d.is_empty());
        assert_eq!(d.mkfs_args(FsType::Xfs, true), ["-i", "nrext64=0"]);
        assert!(d.mkfs_args(FsType::Xfs, false).is_empty());
        assert!(d.mkfs_args(FsType::Ext4, true).is_empty());
        assert_eq!(d.filesystem(), Ok(None));
        assert!(d.to_context().is_empty());
    }

    #[test]
    fn xfs_features_become_their_sections() {
        let o = opts(&[
            ("format.xfs.nrext64", "true"),
            ("format.xfs.bigtime", "false"),
            ("format.xfs.inobtcount", "false"),
            ("format.xfs.reflink", "true"),
            ("pool", "ignored"),
        ])
        .unwrap();
        assert_eq!(
            o.mkfs_args(FsType::Xfs, true),
            ["-i", "nrext64=1", "-m", "bigtime=0,inobtcount=0,reflink=1"]
        );
        // Asked for explicitly: passed even to a mkfs.xfs that may not know
        // it (mkfs then refuses, rather than the class being ignored).
        assert_eq!(
            opts(&[("format.xfs.nrext64", "false")])
                .unwrap()
                .mkfs_args(FsType::Xfs, false),
            ["-i", "nrext64=0"]
        );
        let only_meta = opts(&[("format.xfs.bigtime", "false")]).unwrap();
        assert_eq!(
            only_meta.mkfs_args(FsType::Xfs, true),
            ["-i", "nrext64=0", "-m", "bigtime=0"]
        );
        assert_eq!(o.filesystem(), Ok(Some(FsType::Xfs)));
        assert!(o.check_for(FsType::Xfs).is_ok());
        assert!(o.check_for(FsType::Ext4).is_err());
    }

    #[test]
    fn ext4_features_from_the_allow_list_in_a_fixed_order() {
        let o = opts(&[(
            "format.ext4.features",
            "^orphan_file,^metadata_csum_seed,64bit",
        )])
        .unwrap();
        assert_eq!(
            o.mkfs_args(FsType::Ext4, true),
            ["-O", "64bit,^metadata_csum_seed,^orphan_file"]
        );
        assert_eq!(o.filesystem(), Ok(Some(FsType::Ext4)));
        assert!(o.check_for(FsType::Xfs).is_err());
    }

    #[test]
    fn the_context_decodes_to_the_same_options() {
        let o = opts(&[
            ("format.xfs.nrext64", "true"),
            ("format.xfs.reflink", "false"),
        ])
        .unwrap();
        let ctx = o.to_context();
        assert_eq!(
            ctx,
            [
                ("format.xfs.nrext64".to_owned(), "true".to_owned()),
                ("format.xfs.reflink".to_owned(), "false".to_owned())
            ]
        );
        assert_eq!(
            FormatOptions::from_params(ctx.iter().map(|(k, v)| (k, v))),
            Ok(o)
        );
        let e = opts(&[("format.ext4.features", "^orphan_file")]).unwrap();
        let ctx = e.to_context();
        assert_eq!(
            FormatOptions::from_params(ctx.iter().map(|(k, v)| (k, v))),
            Ok(e)
        );
    }

    #[test]
    fn bad_values_are_refused_with_what_was_wrong() {
        for (k, v, says) in [
            ("format.xfs.nrext64", "0", "must be \"true\" or \"false\""),
            ("format.xfs.nrext64", "yes", "must be \"true\" or \"false\""),
            ("format.xfs.crc", "false", "unknown format parameter"),
            ("format.xfs.", "false", "unknown format parameter"),
            ("format.btrfs.x", "1", "unknown format parameter"),
            ("format.ext4.features", "", "must not be empty"),
            ("format.ext4.features", "orphan_file,", "is not a feature"),
            ("format.ext4.features", "has_journal", "is not a feature"),
            ("format.ext4.features", "^^64bit", "is not a feature"),
            ("format.ext4.features", "64bit -E x", "is not a feature"),
            ("format.ext4.features", "64bit,^64bit", "named twice"),
            ("format.ext4.features", " 64bit", "is not a feature"),
        ] {
            let e = opts(&[(k, v)]).expect_err(&format!("{k}={v:?} was accepted"));
            assert!(e.0.contains(says), "{k}={v:?}: {e}");
        }
        let both = opts(&[
            ("format.xfs.nrext64", "false"),
            ("format.ext4.features", "64bit"),
        ])
        .unwrap();
        assert!(both.filesystem().is_err());
        assert!(both.check_for(FsType::Xfs).is_err());
    }

    #[test]
    fn mkfs_xfs_versions() {
        for (out, want) in [
            ("mkfs.xfs version 6.1.0\n", Some(true)),
            ("mkfs.xfs version 5.19.0", Some(true)),
            ("mkfs.xfs version 5.18.0", Some(false)),
            ("mkfs.xfs version 4.20.0", Some(false)),
            ("mkfs.xfs version 6.5", Some(true)),
            ("mkfs.xfs version 10.0.1", Some(true)),
            ("mkfs.xfs version x", None),
            ("", None),
        ] {
            assert_eq!(version_knows_nrext64(out), want, "{out:?}");
        }
    }
}
