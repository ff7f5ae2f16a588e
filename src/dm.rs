//! Device-mapper state read from the kernel, without running a process: one
//! `DM_TABLE_STATUS` ioctl on `/dev/mapper/control` gives what `dmsetup
//! status NAME` prints, one `DM_TABLE_DEPS` what `dmsetup deps NAME` does. The kernel's mapping of an active LV is as much the
//! node's ground truth as lvm's metadata: an LV is active exactly when its
//! mapping exists, and a thin pool's usage is what its `thin-pool` target
//! reports (lvm's Data% and Meta% are computed from the same status).

use std::fs::File;
use std::os::fd::AsRawFd;

/// `struct dm_ioctl` (linux/dm-ioctl.h), the header of every request.
const HEADER: usize = 312;
/// `struct dm_target_spec`, before each target's parameter string.
const SPEC: usize = 40;
const NAME_LEN: usize = 128;
const UUID_LEN: usize = 129;
/// `DM_TABLE_DEPS_CMD`.
const TABLE_DEPS: u8 = 11;
/// `DM_TABLE_STATUS_CMD`.
const TABLE_STATUS: u8 = 12;
/// Set by the kernel when the answer did not fit the buffer.
const BUFFER_FULL_FLAG: u32 = 1 << 8;
/// The device is suspended.
const SUSPEND_FLAG: u32 = 1 << 1;

/// `DM_TABLE_STATUS`: `_IOWR(0xfd, 12, struct dm_ioctl)`.
const TABLE_STATUS_IOCTL: libc::c_ulong = nix::request_code_readwrite!(0xfd, TABLE_STATUS, HEADER);
/// `DM_TABLE_DEPS`: `_IOWR(0xfd, 11, struct dm_ioctl)`.
const TABLE_DEPS_IOCTL: libc::c_ulong = nix::request_code_readwrite!(0xfd, TABLE_DEPS, HEADER);

/// The mapping's name lvm gives an LV: VG and LV names with every `-`
/// doubled, joined by `-` (`vg0/lv-a` is `vg0-lv--a`).
pub fn lv_name(vg: &str, lv: &str) -> String {
    format!("{}-{}", vg.replace('-', "--"), lv.replace('-', "--"))
}

/// One target of a mapping and its status line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub start: u64,
    /// Sectors (512 bytes).
    pub length: u64,
    pub kind: String,
    pub status: String,
}

/// What the kernel reports of one mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub uuid: String,
    pub open_count: i32,
    pub suspended: bool,
    pub targets: Vec<Target>,
}

impl Status {
    /// Whether lvm made this mapping (its uuid is `LVM-<VG uuid><LV uuid>`).
    pub fn is_lvm(&self) -> bool {
        self.uuid.starts_with("LVM-")
    }
}

/// The status of the mapping `name` (None: there is none).
pub fn status(name: &str) -> std::io::Result<Option<Status>> {
    let Some(buf) = call(TABLE_STATUS_IOCTL, name)? else {
        return Ok(None);
    };
    parse(&buf)
        .map(Some)
        .ok_or_else(|| malformed("status", name))
}

/// A device number as the kernel writes it in a `dm_ioctl` answer
/// (`huge_encode_dev`, the encoding of glibc's `makedev`): `major:minor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl DevNum {
    pub fn from_encoded(dev: u64) -> Self {
        DevNum {
            major: libc::major(dev as libc::dev_t),
            minor: libc::minor(dev as libc::dev_t),
        }
    }

    pub fn encoded(self) -> libc::dev_t {
        libc::makedev(self.major, self.minor)
    }
}

impl std::fmt::Display for DevNum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// The mapping `name` as the kernel knows it, by name: its own device number
/// and the devices its live table maps (none while it has no live table:
/// created, but its table never loaded or never resumed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deps {
    pub dev: DevNum,
    pub below: Vec<DevNum>,
}

/// `dmsetup deps NAME` without a process (None: no mapping of that name). A
/// `/dev/mapper` node can outlive its device, or be made for a device that
/// was removed again (a `cryptsetup` that outlived a killed driver does its
/// node work last), and its minor can then belong to another mapping: only
/// the kernel's answer by name says which device a name is.
pub fn deps(name: &str) -> std::io::Result<Option<Deps>> {
    let Some(buf) = call(TABLE_DEPS_IOCTL, name)? else {
        return Ok(None);
    };
    parse_deps(&buf)
        .map(Some)
        .ok_or_else(|| malformed("deps", name))
}

fn malformed(what: &str, name: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("device-mapper {what} of {name}: malformed answer"),
    )
}

/// One dm ioctl `request` about the mapping `name`, with a buffer grown
/// until the answer fits (None: no mapping of that name, or no
/// device-mapper on this node).
fn call(request_code: libc::c_ulong, name: &str) -> std::io::Result<Option<Vec<u8>>> {
    if name.len() >= NAME_LEN {
        return Ok(None);
    }
    let control = match File::open("/dev/mapper/control") {
        Ok(f) => f,
        // No device-mapper on this node: no control node, or one whose
        // driver this kernel lacks (a libdevmapper tool makes the node
        // wherever it runs). No mapping either.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || matches!(e.raw_os_error(), Some(libc::ENODEV | libc::ENXIO)) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let mut size = 16 << 10;
    loop {
        let mut buf = request(name, size);
        // SAFETY: buf is a dm_ioctl header followed by its data area, and
        // data_size (set by `request`) is the buffer's length: the kernel
        // writes no further.
        let res = unsafe { libc::ioctl(control.as_raw_fd(), request_code, buf.as_mut_ptr()) };
        if res < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                return Ok(None);
            }
            return Err(e);
        }
        if u32_at(&buf, 28) & BUFFER_FULL_FLAG != 0 && size < 1 << 20 {
            size *= 4;
            continue;
        }
        return Ok(Some(buf));
    }
}

/// A `DM_TABLE_DEPS` answer: the header's `dev`, then at `data_start` a
/// `struct dm_target_deps` (`count`, padding, `count` device numbers). With
/// no live table the kernel writes no data area: the request's zeros read
/// as none.
fn parse_deps(b: &[u8]) -> Option<Deps> {
    if b.len() < HEADER {
        return None;
    }
    let at = u32_at(b, 16) as usize;
    let count = u32_at(b.get(at..at + 8)?, 0) as usize;
    let below = (0..count)
        .map(|i| {
            let from = at + 8 + i * 8;
            b.get(from..from + 8)
                .map(|d| DevNum::from_encoded(u64_at(d, 0)))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Deps {
        dev: DevNum::from_encoded(u64_at(b, 40)),
        below,
    })
}

/// A `DM_TABLE_STATUS` request for `name` in a buffer of `size` bytes.
fn request(name: &str, size: usize) -> Vec<u8> {
    let mut buf = vec![0u8; size];
    // version 4.0.0: any kernel's dm interface 4 answers.
    buf[0..4].copy_from_slice(&4u32.to_ne_bytes());
    buf[12..16].copy_from_slice(&(size as u32).to_ne_bytes());
    buf[16..20].copy_from_slice(&(HEADER as u32).to_ne_bytes());
    buf[48..48 + name.len()].copy_from_slice(name.as_bytes());
    buf
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// A C string in `b` from `at`, at most `max` bytes.
fn cstr(b: &[u8], at: usize, max: usize) -> Option<String> {
    let field = b.get(at..(at + max).min(b.len()))?;
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    Some(String::from_utf8_lossy(&field[..end]).into_owned())
}

/// The kernel's answer: the header, then `target_count` specs from
/// `data_start`, each followed by its status string; a spec's `next` is the
/// offset of the following one from `data_start`.
fn parse(b: &[u8]) -> Option<Status> {
    if b.len() < HEADER {
        return None;
    }
    let data_start = u32_at(b, 16) as usize;
    let count = u32_at(b, 20);
    let open_count = u32_at(b, 24) as i32;
    let flags = u32_at(b, 28);
    let uuid = cstr(b, 48 + NAME_LEN, UUID_LEN)?;
    let mut targets = Vec::new();
    let mut at = data_start;
    for _ in 0..count {
        let spec = b.get(at..at + SPEC)?;
        let next = u32_at(spec, 20) as usize;
        targets.push(Target {
            start: u64_at(spec, 0),
            length: u64_at(spec, 8),
            kind: cstr(spec, 24, 16)?,
            status: cstr(b, at + SPEC, b.len().saturating_sub(at + SPEC))?,
        });
        at = data_start.checked_add(next)?;
    }
    Some(Status {
        uuid,
        open_count,
        suspended: flags & SUSPEND_FLAG != 0,
        targets,
    })
}

/// A `thin-pool` target's status: `<transaction id> <used>/<total> metadata
/// blocks <used>/<total> data blocks <held root> rw|ro|out_of_data_space
/// ...`, or `Fail`.
#[derive(Clone, Debug, PartialEq)]
pub struct ThinPoolStatus {
    pub metadata_percent: f64,
    pub data_percent: f64,
    /// `rw`, `ro`, `out_of_data_space` or `Fail`.
    pub mode: String,
    /// The pool asks for `thin_check` (its metadata is damaged).
    pub needs_check: bool,
    /// The block of the pool's metadata snapshot, while one is reserved
    /// (`reserve_metadata_snap`; `-` when none is).
    pub held_root: Option<u64>,
}

impl ThinPoolStatus {
    pub fn parse(line: &str) -> Option<Self> {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first() == Some(&"Fail") {
            return Some(ThinPoolStatus {
                metadata_percent: 0.0,
                data_percent: 0.0,
                mode: "Fail".into(),
                needs_check: false,
                held_root: None,
            });
        }
        let percent = |s: &str| -> Option<f64> {
            let (used, total) = s.split_once('/')?;
            let (used, total): (u64, u64) = (used.parse().ok()?, total.parse().ok()?);
            Some(match total {
                0 => 0.0,
                t => used as f64 * 100.0 / t as f64,
            })
        };
        Some(ThinPoolStatus {
            metadata_percent: percent(f.get(1)?)?,
            data_percent: percent(f.get(2)?)?,
            held_root: match *f.get(3)? {
                "-" => None,
                n => Some(n.parse().ok()?),
            },
            mode: (*f.get(4)?).to_owned(),
            needs_check: f.get(7) == Some(&"needs_check"),
        })
    }

    /// Whether the pool serves writes as it should.
    pub fn serving(&self) -> bool {
        self.mode == "rw" && !self.needs_check
    }
}

/// A thin pool's `thin-pool` target: the mapping that holds it (where
/// `dmsetup message` goes), its data size and its status.
#[derive(Clone, Debug, PartialEq)]
pub struct ThinPoolTarget {
    pub mapping: String,
    /// The pool's data space, in bytes.
    pub size: u64,
    pub status: ThinPoolStatus,
}

/// The thin pool `vg/thin`'s target (None: not active, or not a thin
/// pool). lvm puts the target in `<vg>-<thin>-tpool` while thin volumes use
/// the pool, and in `<vg>-<thin>` otherwise.
pub fn thin_pool_target(vg: &str, thin: &str) -> std::io::Result<Option<ThinPoolTarget>> {
    let name = lv_name(vg, thin);
    for candidate in [format!("{name}-tpool"), name] {
        let Some(st) = status(&candidate)? else {
            continue;
        };
        if let [t] = st.targets.as_slice() {
            if t.kind == "thin-pool" {
                return Ok(
                    ThinPoolStatus::parse(&t.status).map(|status| ThinPoolTarget {
                        mapping: candidate.clone(),
                        size: t.length * 512,
                        status,
                    }),
                );
            }
        }
    }
    Ok(None)
}

/// The thin pool `vg/thin` as its `thin-pool` target reports it: the size of
/// its data space in bytes and its status (None: not active, or not a thin
/// pool).
pub fn thin_pool(vg: &str, thin: &str) -> std::io::Result<Option<(u64, ThinPoolStatus)>> {
    Ok(thin_pool_target(vg, thin)?.map(|t| (t.size, t.status)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer as the kernel writes it, for one target.
    fn answer(uuid: &str, open: i32, flags: u32, kind: &str, length: u64, line: &str) -> Vec<u8> {
        let mut b = vec![0u8; 1024];
        b[16..20].copy_from_slice(&(HEADER as u32).to_ne_bytes());
        b[20..24].copy_from_slice(&1u32.to_ne_bytes());
        b[24..28].copy_from_slice(&open.to_ne_bytes());
        b[28..32].copy_from_slice(&flags.to_ne_bytes());
        b[176..176 + uuid.len()].copy_from_slice(uuid.as_bytes());
        let s = HEADER;
        b[s + 8..s + 16].copy_from_slice(&length.to_ne_bytes());
        let next = (SPEC + line.len() + 1).div_ceil(8) * 8;
        b[s + 20..s + 24].copy_from_slice(&(next as u32).to_ne_bytes());
        b[s + 24..s + 24 + kind.len()].copy_from_slice(kind.as_bytes());
        b[s + SPEC..s + SPEC + line.len()].copy_from_slice(line.as_bytes());
        b
    }

    #[test]
    fn lvm_names_its_mappings_with_dashes_doubled() {
        assert_eq!(lv_name("vg0", "lv-a"), "vg0-lv--a");
        assert_eq!(lv_name("my-vg", "tp"), "my--vg-tp");
    }

    #[test]
    fn a_status_answer_is_read_back() {
        let line = "0 14/1024 100/400 - rw discard_passdown queue_if_no_space - 1024";
        let b = answer("LVM-abc", 2, SUSPEND_FLAG, "thin-pool", 8192, line);
        let st = parse(&b).unwrap();
        assert_eq!(st.uuid, "LVM-abc");
        assert!(st.is_lvm());
        assert_eq!(st.open_count, 2);
        assert!(st.suspended);
        assert_eq!(st.targets[0].length, 8192);
        assert_eq!(st.targets[0].kind, "thin-pool");
        assert_eq!(st.targets[0].status, line);
        // A request carries the name and its own size.
        let r = request("vg0-lv--a", 4096);
        assert_eq!(u32_at(&r, 12), 4096);
        assert_eq!(cstr(&r, 48, NAME_LEN).unwrap(), "vg0-lv--a");
    }

    #[test]
    fn a_deps_answer_is_read_back() {
        let enc = |major: u32, minor: u32| libc::makedev(major, minor) as u64;
        let mut b = vec![0u8; 1024];
        b[16..20].copy_from_slice(&(HEADER as u32).to_ne_bytes());
        b[40..48].copy_from_slice(&enc(254, 300).to_ne_bytes());
        b[HEADER..HEADER + 4].copy_from_slice(&2u32.to_ne_bytes());
        b[HEADER + 8..HEADER + 16].copy_from_slice(&enc(254, 1).to_ne_bytes());
        b[HEADER + 16..HEADER + 24].copy_from_slice(&enc(8, 16).to_ne_bytes());
        let d = parse_deps(&b).unwrap();
        assert_eq!(d.dev.to_string(), "254:300");
        assert_eq!(
            d.below.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            ["254:1", "8:16"]
        );
        assert_eq!(DevNum::from_encoded(d.dev.encoded() as u64), d.dev);
        // No live table: the kernel leaves the data area as it was sent.
        let mut none = request("localvol-x", 1024);
        none[40..48].copy_from_slice(&enc(254, 7).to_ne_bytes());
        assert_eq!(parse_deps(&none).unwrap().below, []);
        // A count the buffer cannot hold is malformed, not a short list.
        b[HEADER..HEADER + 4].copy_from_slice(&200u32.to_ne_bytes());
        assert_eq!(parse_deps(&b), None);
    }

    #[test]
    fn thin_pool_status_lines() {
        let s = ThinPoolStatus::parse(
            "0 14/1024 100/400 - rw discard_passdown queue_if_no_space - 1024",
        )
        .unwrap();
        assert_eq!(s.data_percent, 25.0);
        assert!((s.metadata_percent - 1.3671875).abs() < 1e-9);
        assert!(s.serving());
        assert_eq!(s.held_root, None);
        let held = ThinPoolStatus::parse(
            "5 30/1024 100/400 1021 rw discard_passdown queue_if_no_space - 1024",
        )
        .unwrap();
        assert_eq!(held.held_root, Some(1021), "a metadata snapshot is held");
        assert!(held.serving());
        let full = ThinPoolStatus::parse(
            "3 20/1024 400/400 - out_of_data_space discard_passdown error_if_no_space - 1024",
        )
        .unwrap();
        assert_eq!(full.data_percent, 100.0);
        assert!(!full.serving());
        let check = ThinPoolStatus::parse(
            "3 20/1024 4/400 - ro no_discard_passdown queue_if_no_space needs_check 1024",
        )
        .unwrap();
        assert!(check.needs_check && !check.serving());
        assert_eq!(ThinPoolStatus::parse("Fail").unwrap().mode, "Fail");
        assert_eq!(ThinPoolStatus::parse("0 x"), None);
    }
}
