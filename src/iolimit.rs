//! Per-volume IO limits: what a VolumeAttributesClass (or a StorageClass's
//! mutable parameters) asks for, how an LVM volume records it (one LV tag),
//! and how the node enforces it: cgroup v2 `io.max` of every pod that has
//! the volume published, for the device the pod's I/O reaches (the LV, or
//! the dm-crypt mapping of an encrypted volume).
//!
//! The pod's cgroup is found from its UID (in the target path kubelet
//! gives) below the cgroup v2 root, for both kubelet cgroup drivers:
//! `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice`
//! (systemd; dashes of the UID as underscores) and `kubepods/<qos>/pod<uid>`
//! (cgroupfs); guaranteed pods sit directly below `kubepods`. A limit covers
//! every process of the pod, whatever container, and stays while the pod
//! lives: the kernel holds it, so a driver restart keeps it.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::IoError;

/// Mutable parameter: read operations per second.
pub const READ_IOPS: &str = "readIOPS";
/// Mutable parameter: write operations per second.
pub const WRITE_IOPS: &str = "writeIOPS";
/// Mutable parameter: bytes read per second (a size: `10Mi`, `5M`, `1048576`).
pub const READ_BPS: &str = "readBytesPerSecond";
/// Mutable parameter: bytes written per second.
pub const WRITE_BPS: &str = "writeBytesPerSecond";
/// The value that lifts a limit (the spec has a modify leave the keys it
/// does not name as they are, so a limit is lifted by naming it).
pub const UNLIMITED: &str = "max";

/// The keys, in the order the tag and `io.max` write them.
pub const KEYS: [&str; 4] = [READ_IOPS, WRITE_IOPS, READ_BPS, WRITE_BPS];

/// One volume's limits; `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IoLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bps: Option<u64>,
}

/// What a request's mutable parameters say: for each key named, the limit
/// it sets (`Some(None)`: lifted); keys not named stay as they are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoChange {
    fields: [Option<Option<u64>>; 4],
}

impl IoChange {
    /// Decodes mutable parameters. Every key must be one of [`KEYS`]; a
    /// value is a positive whole number (bytes per second may carry a unit,
    /// `10Mi`) or `max`.
    pub fn parse(params: &HashMap<String, String>) -> Result<IoChange, String> {
        let mut change = IoChange::default();
        for (k, v) in params {
            let Some(i) = KEYS.iter().position(|key| key == k) else {
                return Err(format!(
                    "unknown mutable parameter {:?} (known: {})",
                    crate::ids::truncate(k),
                    KEYS.join(", ")
                ));
            };
            change.fields[i] = Some(parse_value(k, v, i >= 2)?);
        }
        Ok(change)
    }

    pub fn is_empty(&self) -> bool {
        self.fields.iter().all(Option::is_none)
    }

    /// `current` with this change made.
    pub fn apply_to(&self, current: IoLimits) -> IoLimits {
        let mut f = current.fields();
        for (slot, change) in f.iter_mut().zip(self.fields) {
            if let Some(v) = change {
                *slot = v;
            }
        }
        IoLimits::from_fields(f)
    }
}

fn parse_value(key: &str, v: &str, bytes: bool) -> Result<Option<u64>, String> {
    let v = v.trim();
    if v == UNLIMITED {
        return Ok(None);
    }
    let n = if bytes {
        crate::size::parse_size(v).map_err(|e| format!("{key}: {e}"))?
    } else {
        v.parse::<u64>().map_err(|_| {
            format!(
                "{key} must be a whole number of operations per second or {UNLIMITED:?} (got {:?})",
                crate::ids::truncate(v)
            )
        })?
    };
    if n == 0 {
        return Err(format!(
            "{key} must be positive (0 would stop all I/O); {UNLIMITED:?} lifts the limit"
        ));
    }
    Ok(Some(n))
}

impl IoLimits {
    fn fields(&self) -> [Option<u64>; 4] {
        [
            self.read_iops,
            self.write_iops,
            self.read_bps,
            self.write_bps,
        ]
    }

    fn from_fields(f: [Option<u64>; 4]) -> IoLimits {
        IoLimits {
            read_iops: f[0],
            write_iops: f[1],
            read_bps: f[2],
            write_bps: f[3],
        }
    }

    pub fn is_unlimited(&self) -> bool {
        self.fields().iter().all(Option::is_none)
    }

    /// The value of an LV tag: the four limits in [`KEYS`] order, `max`
    /// for none (`100:max:max:10485760`). None when unlimited (no tag).
    pub fn to_tag_value(&self) -> Option<String> {
        if self.is_unlimited() {
            return None;
        }
        let parts: Vec<String> = self
            .fields()
            .iter()
            .map(|f| f.map_or_else(|| UNLIMITED.to_owned(), |n| n.to_string()))
            .collect();
        Some(parts.join(":"))
    }

    /// Reads [`IoLimits::to_tag_value`]'s text back (None: not such text).
    pub fn from_tag_value(s: &str) -> Option<IoLimits> {
        let mut f = [None; 4];
        let mut parts = s.split(':');
        for slot in &mut f {
            *slot = match parts.next()? {
                UNLIMITED => None,
                n => Some(n.parse::<u64>().ok().filter(|&n| n > 0)?),
            };
        }
        parts.next().is_none().then(|| IoLimits::from_fields(f))
    }

    /// The line written to `io.max` for device `dev`: every key, `max` for
    /// the unlimited ones, so one write also lifts what an earlier one set.
    pub fn io_max_line(&self, dev: (u32, u32)) -> String {
        let v = |f: Option<u64>| f.map_or_else(|| UNLIMITED.to_owned(), |n| n.to_string());
        format!(
            "{}:{} rbps={} wbps={} riops={} wiops={}",
            dev.0,
            dev.1,
            v(self.read_bps),
            v(self.write_bps),
            v(self.read_iops),
            v(self.write_iops)
        )
    }
}

impl fmt::Display for IoLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_tag_value() {
            None => f.write_str("unlimited"),
            Some(_) => {
                let mut first = true;
                for (k, v) in KEYS.iter().zip(self.fields()) {
                    if let Some(n) = v {
                        if !first {
                            f.write_str(", ")?;
                        }
                        write!(f, "{k}={n}")?;
                        first = false;
                    }
                }
                Ok(())
            }
        }
    }
}

/// A pod's UID as kubelet names its directory (`pods/<uid>`): 36 characters
/// of hex digits and dashes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodUid(String);

impl PodUid {
    pub fn parse(s: &str) -> Option<PodUid> {
        let ok = s.len() == 36
            && s.bytes().enumerate().all(|(i, b)| match i {
                8 | 13 | 18 | 23 => b == b'-',
                _ => b.is_ascii_hexdigit(),
            });
        ok.then(|| PodUid(s.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The pod a kubelet target path (relative to the kubelet directory)
/// belongs to: `pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount` for a
/// filesystem, `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>`
/// for a raw block volume. None for any other path.
pub fn pod_of_target(rel: &Path) -> Option<PodUid> {
    let c: Vec<&str> = rel.iter().map(|s| s.to_str()).collect::<Option<_>>()?;
    match c.as_slice() {
        ["pods", uid, "volumes", _, _, "mount"] => PodUid::parse(uid),
        ["plugins", "kubernetes.io", "csi", "volumeDevices", "publish", _, uid] => {
            PodUid::parse(uid)
        }
        _ => None,
    }
}

/// Why limits could not be put in place.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The cgroup root is not cgroup v2 (no `cgroup.controllers`).
    #[error(
        "{root:?} is not a cgroup v2 hierarchy (cgroup v1 node?): IO limits need cgroup v2's io.max; \
         the volume is published without them"
    )]
    NotV2 { root: PathBuf },
    #[error(
        "no cgroup of pod {uid} below {root:?} (looked for kubelet's systemd and cgroupfs layouts, \
         kubepods.slice/... and kubepods/...): is the driver's cgroupRoot the node's cgroup v2 root?"
    )]
    NoPodCgroup { uid: PodUid, root: PathBuf },
    #[error(
        "cgroup {cgroup:?} has no io controller (io.max missing): enable it in the parents' \
         cgroup.subtree_control"
    )]
    NoIoController { cgroup: PathBuf },
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Mount(#[from] crate::mount::MountError),
}

/// The cgroup directories kubelet may have made for pod `uid`, in the order
/// they are tried.
fn candidates(root: &Path, uid: &PodUid) -> Vec<PathBuf> {
    let u = uid.as_str();
    let su = u.replace('-', "_");
    let mut v = vec![
        root.join("kubepods.slice")
            .join(format!("kubepods-pod{su}.slice")),
        root.join("kubepods").join(format!("pod{u}")),
    ];
    for qos in ["burstable", "besteffort"] {
        v.push(
            root.join("kubepods.slice")
                .join(format!("kubepods-{qos}.slice"))
                .join(format!("kubepods-{qos}-pod{su}.slice")),
        );
        v.push(root.join("kubepods").join(qos).join(format!("pod{u}")));
    }
    v
}

/// Whether `root` is a cgroup v2 hierarchy (blocking).
pub fn is_v2(root: &Path) -> bool {
    root.join("cgroup.controllers").is_file()
}

/// The cgroup of pod `uid` (blocking).
pub fn pod_cgroup(root: &Path, uid: &PodUid) -> Result<PathBuf, CgroupError> {
    if !is_v2(root) {
        return Err(CgroupError::NotV2 {
            root: root.to_owned(),
        });
    }
    candidates(root, uid)
        .into_iter()
        .find(|p| p.is_dir())
        .ok_or_else(|| CgroupError::NoPodCgroup {
            uid: uid.clone(),
            root: root.to_owned(),
        })
}

/// Writes `limits` for device `dev` into the `io.max` of pod `uid`
/// (blocking); returns the cgroup written.
pub fn apply(
    root: &Path,
    uid: &PodUid,
    dev: (u32, u32),
    limits: &IoLimits,
) -> Result<PathBuf, CgroupError> {
    let cg = pod_cgroup(root, uid)?;
    let file = cg.join("io.max");
    if !file.is_file() {
        return Err(CgroupError::NoIoController { cgroup: cg });
    }
    let line = limits.io_max_line(dev);
    std::fs::write(&file, line.as_bytes())
        .map_err(|e| IoError::new(format!("writing {line:?} to {file:?}"), e))?;
    Ok(cg)
}

/// What `io.max` of a cgroup says for device `dev` (blocking): None when
/// it names the device with no limit or not at all.
pub fn read(cgroup: &Path, dev: (u32, u32)) -> Result<IoLimits, IoError> {
    let file = cgroup.join("io.max");
    let text =
        std::fs::read_to_string(&file).map_err(|e| IoError::new(format!("reading {file:?}"), e))?;
    let want = format!("{}:{}", dev.0, dev.1);
    let mut l = IoLimits::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some(want.as_str()) {
            continue;
        }
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                continue;
            };
            let n = v.parse::<u64>().ok();
            match k {
                "rbps" => l.read_bps = n,
                "wbps" => l.write_bps = n,
                "riops" => l.read_iops = n,
                "wiops" => l.write_iops = n,
                _ => {}
            }
        }
    }
    Ok(l)
}

/// The device number of a device node (blocking).
pub fn device_number(dev: &Path) -> Result<(u32, u32), IoError> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(dev).map_err(|e| IoError::new(format!("inspecting {dev:?}"), e))?;
    let rdev = md.rdev();
    Ok((
        nix::sys::stat::major(rdev) as u32,
        nix::sys::stat::minor(rdev) as u32,
    ))
}

/// The pods that have device `dev` published on this node, from the mount
/// table: a filesystem target of a pod whose mount is of that device
/// (mountinfo's `major:minor`), or a raw block target whose device node is
/// it.
pub fn pods_using(
    table: &crate::mount::MountTable,
    kubelet_dir: &Path,
    dev: (u32, u32),
) -> Vec<PodUid> {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    let want = format!("{}:{}", dev.0, dev.1);
    let mut pods: Vec<PodUid> = table
        .mounts_below(kubelet_dir)
        .filter_map(|m| {
            let rel = m.mount_point.strip_prefix(kubelet_dir).ok()?;
            let uid = pod_of_target(rel)?;
            if m.dev == want {
                return Some(uid);
            }
            let md = std::fs::metadata(&m.mount_point).ok()?;
            let same = md.file_type().is_block_device()
                && (
                    nix::sys::stat::major(md.rdev()) as u32,
                    nix::sys::stat::minor(md.rdev()) as u32,
                ) == dev;
            same.then_some(uid)
        })
        .collect();
    pods.sort();
    pods.dedup();
    pods
}

/// Puts `limits` for the device at `dev` in place (blocking): in the cgroup
/// of pod `only`, or of every pod that has the device published on this
/// node (from the mount table). Returns the pods written. A device that is
/// not on this node now (an inactive LV, a closed mapping) has no pods.
/// Every pod is tried; the first failure is returned.
pub fn enforce(
    root: &Path,
    kubelet_dir: &Path,
    dev: &Path,
    limits: &IoLimits,
    only: Option<&PodUid>,
) -> Result<Vec<PodUid>, CgroupError> {
    let number = match device_number(dev) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(e.into()),
    };
    let pods = match only {
        Some(uid) => vec![uid.clone()],
        None => {
            let table = crate::mount::MountTable::read()?;
            pods_using(&table, kubelet_dir, number)
        }
    };
    if pods.is_empty() {
        return Ok(pods);
    }
    let mut first = None;
    let mut done = Vec::new();
    for uid in pods {
        match apply(root, &uid, number, limits) {
            Ok(cg) => {
                tracing::info!(pod = %uid, cgroup = %cg.display(), device = ?dev, %limits, "IO limits set");
                done.push(uid);
            }
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    match first {
        None => Ok(done),
        Some(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_keys_units_and_max() {
        let c = IoChange::parse(&params(&[
            ("readIOPS", "100"),
            ("writeBytesPerSecond", "10Mi"),
            ("writeIOPS", "max"),
        ]))
        .unwrap();
        let l = c.apply_to(IoLimits {
            write_iops: Some(7),
            read_bps: Some(5),
            ..Default::default()
        });
        assert_eq!(
            l,
            IoLimits {
                read_iops: Some(100),
                write_iops: None,
                read_bps: Some(5),
                write_bps: Some(10 << 20),
            }
        );
        assert!(IoChange::parse(&HashMap::new()).unwrap().is_empty());
    }

    #[test]
    fn refuses_unknown_keys_zero_and_junk() {
        for (k, v, want) in [
            ("readIops", "1", "unknown mutable parameter"),
            ("readIOPS", "0", "must be positive"),
            ("readIOPS", "1k", "whole number"),
            ("readIOPS", "-3", "whole number"),
            ("writeBytesPerSecond", "lots", "writeBytesPerSecond"),
            ("writeBytesPerSecond", "0Mi", "must be positive"),
        ] {
            let e = IoChange::parse(&params(&[(k, v)])).unwrap_err();
            assert!(e.contains(want), "{k}={v}: {e}");
        }
    }

    #[test]
    fn tag_round_trips() {
        let l = IoLimits {
            read_iops: Some(100),
            write_bps: Some(1 << 20),
            ..Default::default()
        };
        let t = l.to_tag_value().unwrap();
        assert_eq!(t, "100:max:max:1048576");
        assert_eq!(IoLimits::from_tag_value(&t), Some(l));
        assert_eq!(IoLimits::default().to_tag_value(), None);
        for bad in ["", "1:2:3", "1:2:3:4:5", "0:max:max:max", "x:max:max:max"] {
            assert_eq!(IoLimits::from_tag_value(bad), None, "{bad:?}");
        }
        assert_eq!(
            l.io_max_line((253, 4)),
            "253:4 rbps=max wbps=1048576 riops=100 wiops=max"
        );
        assert_eq!(l.to_string(), "readIOPS=100, writeBytesPerSecond=1048576");
    }

    #[test]
    fn pods_of_kubelet_targets() {
        let uid = "0a1b2c3d-1111-2222-3333-444455556666";
        let fs = format!("pods/{uid}/volumes/kubernetes.io~csi/pvc-1/mount");
        assert_eq!(pod_of_target(Path::new(&fs)).unwrap().as_str(), uid);
        let blk = format!("plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/{uid}");
        assert_eq!(pod_of_target(Path::new(&blk)).unwrap().as_str(), uid);
        for other in [
            "plugins/kubernetes.io/csi/localvol/abc/globalmount".to_owned(),
            format!("pods/{uid}/volumes/kubernetes.io~csi/pvc-1"),
            "pods/not-a-uid/volumes/kubernetes.io~csi/pvc-1/mount".to_owned(),
            "target".to_owned(),
        ] {
            assert_eq!(pod_of_target(Path::new(&other)), None, "{other}");
        }
    }

    #[test]
    fn finds_pod_cgroups_of_both_drivers() {
        let uid = PodUid::parse("0a1b2c3d-1111-2222-3333-444455556666").unwrap();
        let root = tempfile::tempdir().unwrap();
        let e = pod_cgroup(root.path(), &uid).unwrap_err();
        assert!(matches!(e, CgroupError::NotV2 { .. }), "{e}");
        std::fs::write(root.path().join("cgroup.controllers"), "io memory\n").unwrap();
        let e = pod_cgroup(root.path(), &uid).unwrap_err();
        assert!(matches!(e, CgroupError::NoPodCgroup { .. }), "{e}");
        let systemd = root.path().join(
            "kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod0a1b2c3d_1111_2222_3333_444455556666.slice",
        );
        std::fs::create_dir_all(&systemd).unwrap();
        assert_eq!(pod_cgroup(root.path(), &uid).unwrap(), systemd);
        let e = apply(root.path(), &uid, (253, 1), &IoLimits::default()).unwrap_err();
        assert!(matches!(e, CgroupError::NoIoController { .. }), "{e}");
        std::fs::write(systemd.join("io.max"), "").unwrap();
        let l = IoLimits {
            write_iops: Some(50),
            ..Default::default()
        };
        apply(root.path(), &uid, (253, 1), &l).unwrap();
        assert_eq!(read(&systemd, (253, 1)).unwrap(), l);
        std::fs::remove_dir_all(root.path().join("kubepods.slice")).unwrap();
        let cgroupfs = root
            .path()
            .join("kubepods/besteffort/pod0a1b2c3d-1111-2222-3333-444455556666");
        std::fs::create_dir_all(&cgroupfs).unwrap();
        assert_eq!(pod_cgroup(root.path(), &uid).unwrap(), cgroupfs);
    }
}
