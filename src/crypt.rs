//! Encryption at rest: LUKS2 on a volume's device, opened to a device-mapper
//! mapping whose name comes from the volume id, so the node finds it again
//! after a restart without any record of its own.
//!
//! Every `cryptsetup` runs through [`crate::command::Cmd`] with the key on its
//! stdin (`--key-file -`): never in an argument, the environment, a file or a
//! log line. [`Key`]'s `Debug` prints nothing of it.
//!
//! The rule that protects data holds here too: the backing device is made a
//! LUKS2 volume only when `blkid -p` finds it blank, and the caller formats
//! the opened mapping only when it is blank in turn.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::blockdev::{self, Content};
use crate::command::{Cmd, CommandError};
use crate::dm::{self, Deps, DevNum};
use crate::error::{IoContext, IoError};

/// The NodeStageVolume secret (`csi.storage.k8s.io/node-stage-secret-*` in the
/// StorageClass) field that holds an encrypted volume's key.
pub const KEY_FIELD: &str = "encryptionKey";

/// Longest key accepted (bytes).
pub const MAX_KEY_BYTES: usize = 4096;

/// Limit for one `cryptsetup` run (a key derivation under emulation takes
/// seconds).
const CRYPTSETUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// How a volume is encrypted (the StorageClass parameter `encryption`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encryption {
    Luks2,
}

impl Encryption {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "luks2" => Some(Encryption::Luks2),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Encryption::Luks2 => "luks2",
        }
    }
}

/// A volume key (LUKS passphrase): the secret's bytes, exactly. Shown as
/// `Key(<redacted>)`; overwritten with zeroes when dropped.
pub struct Key(Vec<u8>);

/// Why a secret is not a usable key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the key is empty")]
    Empty,
    #[error("the key is longer than {MAX_KEY_BYTES} bytes")]
    TooLong,
}

impl Key {
    pub fn new(bytes: &[u8]) -> Result<Self, KeyError> {
        match bytes.len() {
            0 => Err(KeyError::Empty),
            n if n > MAX_KEY_BYTES => Err(KeyError::TooLong),
            _ => Ok(Key(bytes.to_vec())),
        }
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        self.0.iter_mut().for_each(|b| *b = 0);
        std::hint::black_box(&self.0);
    }
}

/// What went wrong opening or closing an encrypted volume. Messages never
/// carry the key (cryptsetup does not print it; nothing here does).
#[derive(Debug, thiserror::Error)]
pub enum CryptError {
    /// The key opens none of the device's key slots.
    #[error("the key does not open the LUKS volume on {dev:?} (wrong {KEY_FIELD}?)")]
    WrongKey { dev: PathBuf },
    /// The backing device holds something that is not a LUKS volume.
    #[error("{dev:?} holds {found}, not a LUKS volume; not encrypting or opening it")]
    NotLuks { dev: PathBuf, found: String },
    /// The mapping name is taken by a mapping of another device.
    #[error("device-mapper name {name} maps device {found}, not the volume's ({want})")]
    NameTaken {
        name: String,
        found: String,
        want: String,
    },
    /// The mapping is still mounted (or its node bound) somewhere.
    #[error("mapping {name} is still in use: mounted at {at:?}")]
    InUse { name: String, at: PathBuf },
    /// `cryptsetup close` found it open (a process or a holder device).
    #[error("mapping {name} is still open: {why}")]
    Busy { name: String, why: String },
    /// `cryptsetup luksFormat` or `open` found the volume's device busy
    /// (exit code 5): another process has it open exclusively, e.g. a
    /// `cryptsetup` still running for a driver that was killed. Transient:
    /// the caller tries again.
    #[error("{dev:?} is busy (another process holds it); try again: {why}")]
    DeviceBusy { dev: PathBuf, why: String },
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Mount(#[from] crate::mount::MountError),
    #[error(transparent)]
    Command(#[from] CommandError),
}

type Result<T, E = CryptError> = std::result::Result<T, E>;

/// The device-mapper name of a volume's opened LUKS device: from its id
/// (`<pool>.<key>`, no `/`), unique on the node as the id is.
pub fn mapping_name(volume_id: &str) -> String {
    format!("localvol-{volume_id}")
}

/// Where the opened mapping `name` shows up.
pub fn mapping_path(name: &str) -> PathBuf {
    Path::new("/dev/mapper").join(name)
}

/// Key-slot settings of `luksFormat`: argon2id with fixed cost (64 MiB,
/// 4 passes) instead of cryptsetup's benchmark (which takes seconds and, by
/// default, up to 1 GiB of memory: more than a driver pod's limit). Keys
/// from Kubernetes Secrets should be random (docs/configuration.md,
/// "Encryption at rest"), which a slow KDF does not protect further.
const PBKDF_ARGS: [&str; 6] = [
    "--pbkdf",
    "argon2id",
    "--pbkdf-memory",
    "65536",
    "--pbkdf-force-iterations",
    "4",
];

/// Bytes a LUKS2 header (cryptsetup's default, metadata and keyslots) takes
/// from the start of the device: what the filesystem inside does not get.
pub const LUKS2_HEADER_BYTES: u64 = 16 << 20;

/// The most a LUKS2 header's binary part and JSON area take (the format's
/// largest metadata size, 4 MiB).
const LUKS2_MAX_HEADER: u64 = 4 << 20;

/// Where the data of the LUKS2 volume on `dev` starts, in bytes from its
/// start: its data segment's `offset`, read from the header (no key
/// needed; the header is plaintext). What its opened mapping shows starts
/// there. Blocking: call it through [`crate::error::blocking`].
pub fn luks2_data_offset(dev: &Path) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let not_luks = |found: &str| CryptError::NotLuks {
        dev: dev.to_owned(),
        found: found.to_owned(),
    };
    let f = std::fs::File::open(dev).ctx(|| format!("opening {dev:?}"))?;
    let mut bin = [0u8; 4096];
    f.read_exact_at(&mut bin, 0)
        .ctx(|| format!("reading the LUKS header of {dev:?}"))?;
    if &bin[..6] != b"LUKS\xba\xbe" || bin[6..8] != [0, 2] {
        return Err(not_luks("no LUKS2 header"));
    }
    let size = u64::from_be_bytes(bin[8..16].try_into().unwrap_or_default());
    if !(4096..=LUKS2_MAX_HEADER).contains(&size) {
        return Err(not_luks(&format!("a LUKS2 header of {size} bytes")));
    }
    let mut json = vec![0u8; (size - 4096) as usize];
    f.read_exact_at(&mut json, 4096)
        .ctx(|| format!("reading the LUKS2 metadata of {dev:?}"))?;
    let end = json.iter().position(|b| *b == 0).unwrap_or(json.len());
    let meta: serde_json::Value = serde_json::from_slice(&json[..end])
        .map_err(|e| not_luks(&format!("LUKS2 metadata that does not parse ({e})")))?;
    let offsets: Vec<u64> = meta["segments"]
        .as_object()
        .into_iter()
        .flat_map(|segs| segs.values())
        .filter(|seg| seg["type"] == "crypt")
        .filter_map(|seg| seg["offset"].as_str()?.parse().ok())
        .collect();
    match offsets.as_slice() {
        [one] => Ok(*one),
        _ => Err(not_luks(&format!(
            "a LUKS2 volume with {} data segments",
            offsets.len()
        ))),
    }
}

/// `cryptsetup luksFormat` of `dev` (key on stdin).
pub fn format_command(dev: &Path, key: &Key) -> Cmd {
    Cmd::new("cryptsetup")
        .args(["luksFormat", "--batch-mode", "--type", "luks2"])
        .args(PBKDF_ARGS)
        .args(["--key-file", "-"])
        .arg(dev)
        .secret_stdin(&key.0)
        .timeout(CRYPTSETUP_TIMEOUT)
}

/// `cryptsetup open` of `dev` as `name` (key on stdin). `--disable-keyring`
/// keeps the volume key in the dm-crypt table (root on the node can read it
/// either way), so `cryptsetup resize` needs no key: NodeExpandVolume gets
/// no secrets.
pub fn open_command(dev: &Path, name: &str, key: &Key) -> Cmd {
    Cmd::new("cryptsetup")
        .args([
            "open",
            "--type",
            "luks2",
            "--disable-keyring",
            "--key-file",
            "-",
        ])
        .arg(dev)
        .arg(name)
        .secret_stdin(&key.0)
        .timeout(CRYPTSETUP_TIMEOUT)
}

/// A block device's number. Blocking.
fn dev_num(dev: &Path) -> Result<DevNum> {
    use std::os::unix::fs::MetadataExt;
    let (_, md) = crate::mount::block_device(dev)?;
    Ok(DevNum::from_encoded(md.rdev()))
}

/// The number (`major:minor`) of the device an open mapping is on, as the
/// kernel knows the mapping by name; None when no mapping of that name
/// exists, or when it maps nothing (a device a killed `cryptsetup open` left
/// without its table: see [`ensure_open`]). Never from the `/dev/mapper`
/// node: see [`crate::dm::deps`]. Blocking.
pub fn mapped_device(name: &str) -> Result<Option<String>> {
    Ok(mapping(name)?.and_then(|d| d.below.first().map(|n| n.to_string())))
}

fn mapping(name: &str) -> Result<Option<Deps>> {
    Ok(dm::deps(name).ctx(|| format!("asking device-mapper for {name}"))?)
}

/// Makes `/dev/mapper/<name>` the node of device `dev` (the kernel's device
/// of that name) when it is missing or names another device: what a
/// `cryptsetup` cut short or outlived by a killed driver can leave. Without
/// this, mounting the mapping's path could mount another volume's mapping
/// that was given the stale node's minor. Blocking.
fn ensure_node(name: &str, dev: DevNum) -> Result<()> {
    use nix::sys::stat::{mknod, Mode, SFlag};
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let path = mapping_path(name);
    let found = match std::fs::metadata(&path) {
        Ok(md) if md.file_type().is_block_device() && md.rdev() == dev.encoded() => return Ok(()),
        Ok(md) if md.file_type().is_block_device() => DevNum::from_encoded(md.rdev()).to_string(),
        Ok(_) => "not a block device".to_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "missing".to_owned(),
        Err(e) => return Err(IoError::new(format!("reading {path:?}"), e).into()),
    };
    tracing::warn!(
        mapping = name,
        found,
        device = %dev,
        "the mapping's /dev/mapper node did not name its device; making it again"
    );
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(IoError::new(format!("removing {path:?}"), e).into())
        }
        _ => {}
    }
    mknod(
        &path,
        SFlag::S_IFBLK,
        Mode::from_bits_truncate(0o600),
        dev.encoded(),
    )
    .map_err(|e| IoError::new(format!("making {path:?}"), std::io::Error::from(e)))?;
    Ok(())
}

/// The mapping `name`, as the kernel answered (`found`), as it must be once
/// open on `want`: its live table maps `want` and nothing else, and its node
/// names it. Blocking.
fn verify_open(name: &str, found: Option<Deps>, want: DevNum) -> Result<PathBuf> {
    match found {
        Some(d) if d.below == [want] => {
            ensure_node(name, d.dev)?;
            Ok(mapping_path(name))
        }
        found => Err(CryptError::NameTaken {
            name: name.to_owned(),
            found: match found {
                Some(d) if !d.below.is_empty() => d
                    .below
                    .iter()
                    .map(DevNum::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                Some(_) => "nothing (no live table)".to_owned(),
                None => "nothing (no such mapping)".to_owned(),
            },
            want: want.to_string(),
        }),
    }
}

/// Makes sure `backing` is open as `name`, and returns the mapping's path.
///
/// - A mapping `name` already open on `backing` (staged before, or left by a
///   driver that was killed) is used as it is: never opened twice.
/// - Otherwise `backing` is probed: blank, it becomes a LUKS2 volume (the
///   only time anything is written to it); a LUKS volume is opened with
///   `key` ([`CryptError::WrongKey`] when it does not fit, and nothing
///   changed); anything else is refused.
/// - `fresh`: the pool records that nothing was ever written through the
///   mapping (the LV is still marked unformatted). Then a LUKS header that
///   does not open, or bytes that are not one, can only be what a
///   `luksFormat` of the driver's own left when it was cut short: its
///   signatures are erased and the volume is formatted again. A filesystem
///   on the LV is refused as ever.
pub async fn ensure_open(backing: &Path, name: &str, key: &Key, fresh: bool) -> Result<PathBuf> {
    let (b, n) = (backing.to_path_buf(), name.to_owned());
    let (mapped, want) =
        crate::error::blocking(move || -> Result<_> { Ok((mapping(&n)?, dev_num(&b)?)) }).await?;
    if mapped.as_ref().is_some_and(|d| !d.below.is_empty()) {
        // Open already (or taken by another device: refused).
        let n = name.to_owned();
        return crate::error::blocking(move || verify_open(&n, mapped, want)).await;
    }
    match blockdev::probe(backing).await? {
        Content::Empty => format(backing, key).await?,
        Content::Luks => match open(backing, name, key).await {
            Err(e) if fresh && !matches!(e, CryptError::DeviceBusy { .. }) => {
                reformat(
                    backing,
                    key,
                    &format!("a LUKS header that does not open ({e})"),
                )
                .await?
            }
            opened => {
                opened?;
                return verified(name, want).await;
            }
        },
        Content::Other(what) if fresh => reformat(backing, key, &what).await?,
        Content::Filesystem(t) => {
            return Err(CryptError::NotLuks {
                dev: backing.into(),
                found: format!("a {t} filesystem"),
            })
        }
        Content::Other(what) => {
            return Err(CryptError::NotLuks {
                dev: backing.into(),
                found: what,
            })
        }
    }
    open(backing, name, key).await?;
    verified(name, want).await
}

/// [`verify_open`] of the mapping as the kernel has it now (just opened).
async fn verified(name: &str, want: DevNum) -> Result<PathBuf> {
    let n = name.to_owned();
    crate::error::blocking(move || verify_open(&n, mapping(&n)?, want)).await
}

/// `luksFormat` of a blank device (exit code 5: another process holds it).
async fn format(backing: &Path, key: &Key) -> Result<()> {
    match format_command(backing, key).run().await {
        Ok(_) => Ok(()),
        Err(e) if e.exit_code() == Some(5) => Err(CryptError::DeviceBusy {
            dev: backing.into(),
            why: e.to_string(),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Erases what a cut-short `luksFormat` left (`found`) and formats again.
async fn reformat(backing: &Path, key: &Key, found: &str) -> Result<()> {
    tracing::warn!(
        device = ?backing,
        found,
        "formatting again what a cut-short luksFormat left on a volume never written"
    );
    blockdev::raw::erase_signatures(backing).await?;
    format(backing, key).await
}

/// Opens the LUKS volume `backing` as `name` with `key`.
async fn open(backing: &Path, name: &str, key: &Key) -> Result<PathBuf> {
    let mut opened = open_command(backing, name, key).run().await;
    if opened
        .as_ref()
        .is_err_and(|e| e.exit_code() == Some(5) && e.stderr().contains("already exists"))
    {
        // Not open as far as the node can see (no `/dev/mapper` node, or no
        // table), yet the kernel has a device of that name: what a driver
        // killed mid `cryptsetup open` leaves. Remove it (refused while
        // anything holds it open) and open again, once.
        tracing::warn!(
            mapping = name,
            "removing a mapping a cut-short open left behind"
        );
        remove_half_made(name).await?;
        opened = open_command(backing, name, key).run().await;
    }
    match opened {
        Ok(_) => Ok(mapping_path(name)),
        // cryptsetup's exit code 2: no key slot opens with this passphrase.
        Err(e) if e.exit_code() == Some(2) => Err(CryptError::WrongKey {
            dev: backing.into(),
        }),
        Err(e) if e.exit_code() == Some(5) => Err(CryptError::DeviceBusy {
            dev: backing.into(),
            why: e.to_string(),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Removes the device-mapper device `name` that a cut-short `cryptsetup
/// open` left (its table may be missing, so `cryptsetup close` may not know
/// it). `dmsetup remove` refuses a device that is open (mounted or held).
async fn remove_half_made(name: &str) -> Result<()> {
    Cmd::new("dmsetup")
        .args(["remove", name])
        .timeout(CRYPTSETUP_TIMEOUT)
        .run()
        .await?;
    Ok(())
}

/// Grows an open mapping to its (grown) backing device. No key needed: see
/// [`open_command`].
pub async fn resize(name: &str) -> Result<()> {
    Cmd::new("cryptsetup")
        .args(["resize", name])
        .timeout(CRYPTSETUP_TIMEOUT)
        .run()
        .await?;
    Ok(())
}

/// Closes the mapping `name` unless something still uses it; one that is not
/// open is fine. A mount of its filesystem or a bind of its device node
/// anywhere is [`CryptError::InUse`] (a bind does not hold the device open,
/// so `cryptsetup close` alone would not see it).
pub async fn close(name: &str) -> Result<()> {
    let (path, n) = (mapping_path(name), name.to_owned());
    let mounted = crate::error::blocking(move || -> Result<Option<PathBuf>> {
        use std::os::unix::fs::MetadataExt;
        // The kernel's device of that name, never the node's (it may be stale).
        let Some(d) = mapping(&n)? else {
            return Ok(None);
        };
        let table = crate::mount::MountTable::read()?;
        let fs = crate::mount::Location {
            dev: d.dev.to_string(),
            root: PathBuf::from("/"),
        };
        if let Some(m) = table.mounts_of(&fs).next() {
            return Ok(Some(m.mount_point.clone()));
        }
        // A raw block volume's pods have the node itself bound.
        let node = match crate::mount::block_device(&path) {
            Ok((real, md)) if md.rdev() == d.dev.encoded() => table.locate(&real),
            Ok(_) | Err(crate::mount::MountError::DeviceMissing { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        let at = node
            .as_ref()
            .and_then(|n| table.mounts_of(n).find(|m| m.root == n.root));
        Ok(at.map(|m| m.mount_point.clone()))
    })
    .await?;
    if let Some(at) = mounted {
        return Err(CryptError::InUse {
            name: name.to_owned(),
            at,
        });
    }
    match Cmd::new("cryptsetup")
        .args(["close", name])
        .timeout(CRYPTSETUP_TIMEOUT)
        .run()
        .await
    {
        Ok(_) => Ok(()),
        // 4: no such mapping (closed already, or never opened).
        Err(e) if e.exit_code() == Some(4) => Ok(()),
        // 5: busy (open by a process or a holder device).
        Err(e) if e.exit_code() == Some(5) => Err(CryptError::Busy {
            name: name.to_owned(),
            why: e.stderr().trim().to_owned(),
        }),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "correct horse battery staple";

    /// Neither command line carries the key, and what the log would print of
    /// the command does not either; the key is in neither's Debug.
    #[test]
    fn the_key_is_never_on_a_command_line() {
        let key = Key::new(SECRET.as_bytes()).unwrap();
        let dev = Path::new("/dev/vg/lv-0123");
        for cmd in [
            format_command(dev, &key),
            open_command(dev, "localvol-p.0123", &key),
        ] {
            let argv: Vec<String> = cmd
                .argv()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            assert!(argv.iter().all(|a| !a.contains(SECRET)), "{argv:?}");
            assert!(
                argv.windows(2).any(|w| w == ["--key-file", "-"]),
                "{argv:?}"
            );
            let shown = format!("{cmd:?}");
            assert!(!shown.contains(SECRET), "{shown}");
        }
        assert_eq!(format!("{key:?}"), "Key(<redacted>)");
        let open: Vec<_> = open_command(dev, "n", &key).argv().cloned().collect();
        assert!(open.iter().any(|a| a == "--disable-keyring"));
    }

    #[test]
    fn keys_and_names() {
        assert!(matches!(Key::new(b""), Err(KeyError::Empty)));
        assert!(matches!(
            Key::new(&[7; MAX_KEY_BYTES + 1]),
            Err(KeyError::TooLong)
        ));
        assert!(Key::new(&[7; MAX_KEY_BYTES]).is_ok());
        assert_eq!(
            mapping_name("fast.0123456789abcdef0123456789abcdef"),
            "localvol-fast.0123456789abcdef0123456789abcdef"
        );
        assert_eq!(
            mapping_path("localvol-a.b"),
            Path::new("/dev/mapper/localvol-a.b")
        );
        assert_eq!(Encryption::parse("luks2"), Some(Encryption::Luks2));
        assert_eq!(Encryption::parse("LUKS2"), None);
        assert_eq!(Encryption::parse("luks1"), None);
        assert_eq!(Encryption::Luks2.as_str(), "luks2");
    }

    #[test]
    fn no_mapping_of_an_unknown_name() {
        assert!(mapped_device("localvol-no.such-mapping").unwrap().is_none());
    }

    /// The data offset is read from a header `cryptsetup luksFormat` made
    /// (on a plain file: no device-mapper needed), and an offset that is
    /// not the default is read as it is.
    #[tokio::test]
    async fn the_data_offset_is_read_from_the_luks2_header() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("luks.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(40 << 20)
            .unwrap();
        let key = Key::new(b"0123456789abcdef0123456789abcdef").unwrap();
        match format_command(&img, &key).run().await {
            Ok(_) => {}
            Err(CommandError::Spawn { .. }) => {
                return crate::testing::skip(
                    "the_data_offset_is_read_from_the_luks2_header",
                    "cryptsetup is not installed",
                )
            }
            Err(e) => panic!("luksFormat of a file: {e}"),
        }
        assert_eq!(luks2_data_offset(&img).unwrap(), LUKS2_HEADER_BYTES);
        let other = dir.path().join("other.img");
        std::fs::File::create(&other)
            .unwrap()
            .set_len(40 << 20)
            .unwrap();
        Cmd::new("cryptsetup")
            .args(["luksFormat", "--batch-mode", "--type", "luks2"])
            .args(PBKDF_ARGS)
            .args(["--offset", "65536", "--key-file", "-"])
            .arg(&other)
            .secret_stdin(&key.0)
            .run()
            .await
            .unwrap();
        assert_eq!(luks2_data_offset(&other).unwrap(), 65536 * 512);
        // Not LUKS: zeroes, or a LUKS1-style version.
        let zero = dir.path().join("zero.img");
        std::fs::write(&zero, vec![0u8; 8192]).unwrap();
        assert!(matches!(
            luks2_data_offset(&zero),
            Err(CryptError::NotLuks { .. })
        ));
        let mut v1 = std::fs::read(&img).unwrap()[..8192].to_vec();
        v1[7] = 1;
        std::fs::write(&zero, v1).unwrap();
        assert!(matches!(
            luks2_data_offset(&zero),
            Err(CryptError::NotLuks { .. })
        ));
    }
}
