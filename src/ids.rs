//! Typed identifiers decoded at the RPC boundary.
//!
//! Nothing builds a path from request input before it has become one of these
//! types: a [`VolumeId`] can only hold a validated pool name and a fixed-width hex
//! key, so it can never contain `/`, `..` or NUL.

use std::cmp::Ordering;
use std::fmt;

/// Topology key every volume and node is labelled with (`<key>=<node name>`).
pub const TOPOLOGY_KEY: &str = "topology.localvol.csi.dev/node";

use sha2::{Digest, Sha256};

/// A name, id or text field from a request or the config that fails
/// validation; the message says which and why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InvalidName(pub String);

type Result<T, E = InvalidName> = std::result::Result<T, E>;

/// The longest id, name or path component the driver accepts (the CSI spec's
/// recommended bound for strings is 128 bytes).
pub const MAX_ID_LEN: usize = 128;

/// Hex digits in the key part of a volume id (128 bits of SHA-256).
const KEY_HEX_LEN: usize = 32;

/// A pool name from the config or a StorageClass parameter: a DNS-label-like
/// string (`[a-z0-9]([a-z0-9-]*[a-z0-9])?`, at most 32 bytes).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct PoolName(String);

impl PoolName {
    pub fn parse(s: &str) -> Result<Self> {
        let ok = !s.is_empty()
            && s.len() <= 32
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-');
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidName(format!(
                "invalid pool name {:?}: use 1-32 lowercase letters, digits and '-', \
                 starting and ending with a letter or digit",
                truncate(s)
            )))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for PoolName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PoolName::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The CO-chosen name of a volume (CreateVolume `name`). Boxed: a dir
/// pool's index keeps one per volume.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VolumeName(Box<str>);

impl VolumeName {
    pub fn parse(s: &str) -> Result<Self> {
        check_text("name", s)?;
        Ok(Self(s.into()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The hex key every volume with this name gets, in whichever pool: it is also
    /// the key of the per-volume lock, so two requests for one name never run at once.
    pub fn key(&self) -> VolumeKey {
        self.salted_key("localvol-volume")
    }

    /// The key of a snapshot with this name: snapshots and volumes have their
    /// own name spaces, so the same name never collides across them.
    pub fn snapshot_key(&self) -> VolumeKey {
        self.salted_key("localvol-snapshot")
    }

    fn salted_key(&self, salt: &str) -> VolumeKey {
        let digest = Sha256::digest(format!("{salt}\0{}", self.0).as_bytes());
        let mut hex = String::with_capacity(KEY_HEX_LEN);
        for b in &digest[..KEY_HEX_LEN / 2] {
            hex.push_str(&format!("{b:02x}"));
        }
        VolumeKey(hex)
    }
}

impl fmt::Display for VolumeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fixed-width hex part of a volume id; safe to use as a file name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VolumeKey(String);

impl VolumeKey {
    pub fn parse(s: &str) -> Option<Self> {
        (s.len() == KEY_HEX_LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| Self(s.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VolumeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A dynamic volume's id: `<pool>.<key>`. It carries the pool, so the node finds
/// the volume without any lookup table, and the key, derived from the name.
/// Ids order as their text does (ListVolumes' pages and tokens are text), which
/// is not pool-then-key order (`a-b.…` sorts before `a.…`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VolumeId {
    pub pool: PoolName,
    pub key: VolumeKey,
}

/// What an id string from a request turned out to be.
#[derive(Debug)]
pub enum ParsedId {
    /// One of ours (the volume may or may not exist).
    Volume(VolumeId),
    /// A harmless string that is not in our format: no such volume can exist.
    Foreign(String),
}

impl VolumeId {
    pub fn new(pool: PoolName, name: &VolumeName) -> Self {
        Self {
            pool,
            key: name.key(),
        }
    }

    /// Decodes an id from a request. Dangerous or malformed input (empty, too
    /// long, NUL, control characters, `/`, `..`) is INVALID_ARGUMENT; a clean
    /// string that is not our format is `Foreign`, which callers treat as "no such
    /// volume".
    pub fn parse(what: &str, s: &str) -> Result<ParsedId> {
        check_text(what, s)?;
        if s.contains('/') || s.contains("..") {
            return Err(InvalidName(format!(
                "{what} {:?} contains '/' or '..'",
                truncate(s)
            )));
        }
        let parsed = s.rsplit_once('.').and_then(|(pool, key)| {
            Some(VolumeId {
                pool: PoolName::parse(pool).ok()?,
                key: VolumeKey::parse(key)?,
            })
        });
        Ok(match parsed {
            Some(id) => ParsedId::Volume(id),
            None => ParsedId::Foreign(s.to_owned()),
        })
    }
}

impl VolumeId {
    /// The bytes of the id's text, without building it.
    fn text(&self) -> impl Iterator<Item = u8> + '_ {
        let (pool, key) = (self.pool.as_str().bytes(), self.key.as_str().bytes());
        pool.chain(std::iter::once(b'.')).chain(key)
    }

    /// How the id's text compares with `s`.
    pub fn cmp_text(&self, s: &str) -> Ordering {
        self.text().cmp(s.bytes())
    }
}

impl Ord for VolumeId {
    fn cmp(&self, other: &Self) -> Ordering {
        self.text().cmp(other.text())
    }
}

impl PartialOrd for VolumeId {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Whether `s` is this id's text.
impl PartialEq<str> for VolumeId {
    fn eq(&self, s: &str) -> bool {
        self.cmp_text(s) == Ordering::Equal
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.pool, self.key)
    }
}

/// The volume attribute (CreateVolume's `volume_context`, so a PV's
/// `spec.csi.volumeAttributes`) that names the storage a volume lives on.
pub const STORAGE_ID_KEY: &str = "storageIdentity";

/// What a pool's storage is, independent of the node's name: `lvm:<VG
/// UUID>` for an LVM pool, `dir:<32 hex>` for a dir pool (a random id
/// written once into the pool directory). A node that is reinstalled with
/// its disks keeps it; new disks give a new one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StorageId(String);

impl StorageId {
    /// `lvm:` or `dir:` and 1-64 of `[A-Za-z0-9-]`.
    pub fn parse(s: &str) -> Result<Self> {
        let ok = ["lvm:", "dir:"].iter().any(|p| {
            s.strip_prefix(p).is_some_and(|rest| {
                !rest.is_empty()
                    && rest.len() <= 64
                    && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
        });
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidName(format!(
                "invalid storage identity {:?}: expected lvm:<VG UUID> or dir:<hex id>",
                truncate(s)
            )))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StorageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A node id: printable, no whitespace, at most [`MAX_ID_LEN`] bytes.
pub fn check_node_id(s: &str) -> Result<()> {
    check_text("node id", s)?;
    if s.chars().any(char::is_whitespace) {
        return Err(InvalidName(format!("node id {s:?} contains whitespace")));
    }
    Ok(())
}

/// Common checks for every string field that names something.
pub fn check_text(what: &str, s: &str) -> Result<()> {
    if s.is_empty() {
        return Err(InvalidName(format!("{what} is required")));
    }
    if s.len() > MAX_ID_LEN {
        return Err(InvalidName(format!(
            "{what} is {} bytes long; the limit is {MAX_ID_LEN}",
            s.len()
        )));
    }
    if s.chars().any(char::is_control) {
        return Err(InvalidName(format!(
            "{what} {:?} contains NUL or control characters",
            truncate(s)
        )));
    }
    Ok(())
}

/// Shortens untrusted input before it goes into an error message.
pub fn truncate(s: &str) -> String {
    if s.len() <= 64 {
        return s.to_owned();
    }
    let mut end = 64;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_ids_are_lvm_or_dir_and_plain() {
        for ok in ["lvm:Xk2vYb-0Qz1-ABCD-efgh-1234-5678-9aBcDe", "dir:0123abcd"] {
            assert_eq!(StorageId::parse(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "", "lvm:", "zfs:abc", "dir:a/b", "dir:../x", "dir:a b", "DIR:abc",
        ] {
            assert!(StorageId::parse(bad).is_err(), "{bad:?}");
        }
        assert!(StorageId::parse(&format!("dir:{}", "a".repeat(65))).is_err());
    }

    #[test]
    fn id_round_trips_and_is_deterministic() {
        let pool = PoolName::parse("fast-1").unwrap();
        let name = VolumeName::parse("pvc-0b0e4e2e").unwrap();
        let id = VolumeId::new(pool.clone(), &name);
        assert_eq!(id, VolumeId::new(pool, &name));
        let s = id.to_string();
        assert!(s.starts_with("fast-1.") && s.len() == 7 + 32, "{s}");
        match VolumeId::parse("volume id", &s).unwrap() {
            ParsedId::Volume(back) => assert_eq!(back, id),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ids_order_and_compare_as_their_text() {
        let name = VolumeName::parse("n").unwrap();
        let mut ids: Vec<VolumeId> = ["a", "a-b", "a0", "b", "ab"]
            .iter()
            .map(|p| VolumeId::new(PoolName::parse(p).unwrap(), &name))
            .collect();
        ids.sort();
        let mut texts: Vec<String> = ids.iter().map(VolumeId::to_string).collect();
        let sorted = texts.clone();
        texts.sort();
        assert_eq!(sorted, texts);
        assert!(sorted[0].starts_with("a-b."), "{sorted:?}");
        for id in &ids {
            let text = id.to_string();
            assert!(*id == *text.as_str());
            assert_eq!(id.cmp_text(&text), Ordering::Equal);
            assert!(*id != *format!("{text}0").as_str());
            assert_eq!(id.cmp_text(&format!("{text}0")), Ordering::Less);
            assert!(*id != text[..text.len() - 1]);
            assert_eq!(id.cmp_text(""), Ordering::Greater);
        }
    }

    #[test]
    fn names_in_different_pools_share_a_key() {
        let name = VolumeName::parse("a").unwrap();
        let a = VolumeId::new(PoolName::parse("one").unwrap(), &name);
        let b = VolumeId::new(PoolName::parse("two").unwrap(), &name);
        assert_eq!(a.key, b.key);
        assert_ne!(a, b);
    }

    #[test]
    fn snapshot_keys_differ_from_volume_keys() {
        let name = VolumeName::parse("same").unwrap();
        assert_ne!(name.key(), name.snapshot_key());
        assert_eq!(
            name.snapshot_key(),
            VolumeName::parse("same").unwrap().snapshot_key()
        );
    }

    #[test]
    fn dangerous_ids_are_invalid_argument() {
        let long = "a".repeat(MAX_ID_LEN + 1);
        for bad in [
            "",
            "../etc",
            "a/b",
            "x\0y",
            "tab\there",
            long.as_str(),
            "pool....",
        ] {
            assert!(
                matches!(VolumeId::parse("volume id", bad), Err(InvalidName(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn clean_foreign_ids_are_not_errors() {
        for s in [
            "reallyfakevolumeid",
            "pool.notHex",
            "UPPER.0123456789abcdef0123456789abcdef",
        ] {
            assert!(
                matches!(VolumeId::parse("volume id", s), Ok(ParsedId::Foreign(_))),
                "{s}"
            );
        }
    }

    #[test]
    fn pool_names() {
        for good in ["a", "dir-1", "x9"] {
            PoolName::parse(good).unwrap();
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(33)] {
            assert!(PoolName::parse(bad).is_err(), "{bad}");
        }
    }
}
