//! What lvm reports: its JSON reports (`--reportformat json --units b
//! --nosuffix`) parsed into [`VgInfo`], [`LvInfo`] and [`PvInfo`], and the
//! encoding of any string into the characters an LVM tag may hold.

use serde::Deserialize;

use super::LvmError;

pub(super) const LV_FIELDS: &str =
    "lv_name,vg_name,lv_size,lv_tags,lv_attr,pool_lv,origin,data_percent,metadata_percent,lv_path,lv_device_open,lv_time,thin_id";
pub(super) const VG_FIELDS: &str =
    "vg_name,vg_uuid,vg_size,vg_free,vg_extent_size,vg_free_count,vg_tags";

/// A volume group as `vgs` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VgInfo {
    pub name: String,
    /// The VG's UUID (`vg_uuid`): stays with its disks whatever the node.
    pub uuid: String,
    pub size: u64,
    pub free: u64,
    pub extent_size: u64,
    pub free_extents: u64,
    pub tags: Vec<String>,
}

/// A logical volume as `lvs` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct LvInfo {
    pub name: String,
    pub vg: String,
    pub size: u64,
    pub tags: Vec<String>,
    /// The ten `lv_attr` characters (`lvs(8)`).
    pub attr: String,
    pub pool_lv: String,
    pub origin: String,
    pub data_percent: Option<f64>,
    pub metadata_percent: Option<f64>,
    pub path: String,
    /// Something holds the device open (a mount, a process, a holder device).
    pub open: bool,
    /// Creation time, seconds since the epoch (0 when lvm did not say).
    pub created_unix: u64,
    /// A thin volume's device id in its pool's metadata (`thin_id`: what
    /// `thin_dump --dev-id` and `thin_delta` name it by); None for others.
    pub thin_id: Option<u64>,
}

impl LvInfo {
    fn attr_char(&self, i: usize) -> char {
        self.attr.chars().nth(i).unwrap_or('-')
    }
    /// A thin pool (`t`).
    pub fn is_thin_pool(&self) -> bool {
        self.attr_char(0) == 't'
    }
    /// A thin volume (`V`), including thin snapshots.
    pub fn is_thin_volume(&self) -> bool {
        self.attr_char(0) == 'V'
    }
    /// A thick copy-on-write snapshot (`s`).
    pub fn is_cow_snapshot(&self) -> bool {
        self.attr_char(0) == 's'
    }
    /// A thin pool that zeroes each data block it provisions before a thin
    /// volume sees it (`z`, the pool's `--zero y`, LVM's default).
    pub fn zeroes_new_blocks(&self) -> bool {
        self.attr_char(7) == 'z'
    }
    /// Whether the device is active (state `a`).
    pub fn is_active(&self) -> bool {
        self.attr_char(4) == 'a'
    }
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t == tag)
    }
    /// The value of the first `key=value` tag with this key.
    pub fn tag_value(&self, key: &str) -> Option<&str> {
        self.tags
            .iter()
            .find_map(|t| t.strip_prefix(key)?.strip_prefix('='))
    }
}

#[derive(Deserialize)]
struct Report<T> {
    report: Vec<T>,
}
#[derive(Deserialize)]
struct LvSection {
    #[serde(default)]
    lv: Vec<RawLv>,
}
#[derive(Deserialize)]
struct VgSection {
    #[serde(default)]
    vg: Vec<RawVg>,
}
#[derive(Deserialize)]
struct PvSection {
    #[serde(default)]
    pv: Vec<RawPv>,
}
#[derive(Deserialize)]
struct RawPv {
    pv_name: String,
    #[serde(default)]
    vg_name: String,
}
#[derive(Deserialize)]
struct RawLv {
    lv_name: String,
    vg_name: String,
    lv_size: String,
    #[serde(default)]
    lv_tags: String,
    #[serde(default)]
    lv_attr: String,
    #[serde(default)]
    pool_lv: String,
    #[serde(default)]
    origin: String,
    #[serde(default)]
    data_percent: String,
    #[serde(default)]
    metadata_percent: String,
    #[serde(default)]
    lv_path: String,
    #[serde(default)]
    lv_device_open: String,
    #[serde(default)]
    lv_time: String,
    #[serde(default)]
    thin_id: String,
    /// The VG's fields, in [`lvs_and_vg`]'s report only.
    #[serde(default)]
    vg_uuid: String,
    #[serde(default)]
    vg_size: String,
    #[serde(default)]
    vg_free: String,
    #[serde(default)]
    vg_extent_size: String,
    #[serde(default)]
    vg_free_count: String,
    #[serde(default)]
    vg_tags: String,
}
#[derive(Deserialize)]
struct RawVg {
    vg_name: String,
    #[serde(default)]
    vg_uuid: String,
    vg_size: String,
    vg_free: String,
    vg_extent_size: String,
    vg_free_count: String,
    #[serde(default)]
    vg_tags: String,
}

fn num(field: &str, v: &str) -> Result<u64, LvmError> {
    v.trim()
        .parse()
        .map_err(|_| LvmError::Parse(format!("{field} = {v:?} is not a byte count")))
}

fn percent(v: &str) -> Option<f64> {
    let v = v.trim();
    if v.is_empty() {
        None
    } else {
        v.parse().ok()
    }
}

fn tags(v: &str) -> Vec<String> {
    v.split(',')
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Parses lvm's `lv_time` (`2026-11-22 03:05:21 +0000`) into Unix seconds.
pub fn parse_lv_time(s: &str) -> Option<u64> {
    let mut parts = s.split_whitespace();
    let (date, time, zone) = (
        parts.next()?,
        parts.next()?,
        parts.next().unwrap_or("+0000"),
    );
    let d: Vec<i64> = date
        .split('-')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let t: Vec<i64> = time
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if d.len() != 3 || t.len() != 3 || zone.len() != 5 {
        return None;
    }
    let (y, m, day) = (d[0], d[1], d[2]);
    // Days from 1970-01-01 to the civil date (proleptic Gregorian).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let sign = if zone.starts_with('-') { -1 } else { 1 };
    let off =
        sign * (zone[1..3].parse::<i64>().ok()? * 3600 + zone[3..5].parse::<i64>().ok()? * 60);
    u64::try_from(days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2] - off).ok()
}

/// Parses `lvs --reportformat json --units b --nosuffix` output.
pub fn parse_lvs(json: &str) -> Result<Vec<LvInfo>, LvmError> {
    lv_rows(json)?.into_iter().map(lv_of).collect()
}

fn lv_rows(json: &str) -> Result<Vec<RawLv>, LvmError> {
    let r: Report<LvSection> =
        serde_json::from_str(json).map_err(|e| LvmError::Parse(format!("lvs JSON: {e}")))?;
    Ok(r.report.into_iter().flat_map(|s| s.lv).collect())
}

fn lv_of(l: RawLv) -> Result<LvInfo, LvmError> {
    Ok(LvInfo {
        size: num("lv_size", &l.lv_size)?,
        tags: tags(&l.lv_tags),
        data_percent: percent(&l.data_percent),
        metadata_percent: percent(&l.metadata_percent),
        name: l.lv_name,
        vg: l.vg_name,
        attr: l.lv_attr,
        pool_lv: l.pool_lv,
        origin: l.origin,
        path: l.lv_path,
        open: l.lv_device_open == "open",
        created_unix: parse_lv_time(&l.lv_time).unwrap_or(0),
        thin_id: l.thin_id.trim().parse().ok(),
    })
}

/// Parses [`lvs_and_vg`]'s report: the LVs, and the VG from the first row
/// (None when the VG has no LV).
pub fn parse_lvs_and_vg(json: &str) -> Result<(Vec<LvInfo>, Option<VgInfo>), LvmError> {
    let rows = lv_rows(json)?;
    let vg = match rows.first() {
        None => None,
        Some(l) => Some(VgInfo {
            name: l.vg_name.clone(),
            uuid: l.vg_uuid.clone(),
            size: num("vg_size", &l.vg_size)?,
            free: num("vg_free", &l.vg_free)?,
            extent_size: num("vg_extent_size", &l.vg_extent_size)?,
            free_extents: num("vg_free_count", &l.vg_free_count)?,
            tags: tags(&l.vg_tags),
        }),
    };
    let lvs = rows.into_iter().map(lv_of).collect::<Result<_, _>>()?;
    Ok((lvs, vg))
}

/// Parses `vgs --reportformat json --units b --nosuffix` output.
pub fn parse_vgs(json: &str) -> Result<Vec<VgInfo>, LvmError> {
    let r: Report<VgSection> =
        serde_json::from_str(json).map_err(|e| LvmError::Parse(format!("vgs JSON: {e}")))?;
    r.report
        .into_iter()
        .flat_map(|s| s.vg)
        .map(|v| {
            Ok(VgInfo {
                size: num("vg_size", &v.vg_size)?,
                free: num("vg_free", &v.vg_free)?,
                extent_size: num("vg_extent_size", &v.vg_extent_size)?,
                free_extents: num("vg_free_count", &v.vg_free_count)?,
                tags: tags(&v.vg_tags),
                name: v.vg_name,
                uuid: v.vg_uuid,
            })
        })
        .collect()
}

/// A physical volume as `pvs` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PvInfo {
    /// The device as lvm names it (`/dev/sdb`, `/dev/loop3`).
    pub name: String,
    /// Its volume group; empty for a PV in no VG.
    pub vg: String,
}

/// Parses `pvs --reportformat json` output.
pub fn parse_pvs(json: &str) -> Result<Vec<PvInfo>, LvmError> {
    let r: Report<PvSection> =
        serde_json::from_str(json).map_err(|e| LvmError::Parse(format!("pvs JSON: {e}")))?;
    Ok(r.report
        .into_iter()
        .flat_map(|s| s.pv)
        .map(|p| PvInfo {
            name: p.pv_name,
            vg: p.vg_name,
        })
        .collect())
}

/// Characters LVM accepts in a tag (`lvm(8)`: `A-Z a-z 0-9 _ + . - / = ! : # &`).
pub fn is_tag_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_+.-/=!:#&".contains(c)
}

/// Encodes any string into LVM tag characters: allowed characters stay,
/// everything else becomes `&XX` (hex of each UTF-8 byte), and `&` itself too.
pub fn encode_tag_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let c = b as char;
        if b.is_ascii() && is_tag_char(c) && c != '&' {
            out.push(c);
        } else {
            out.push_str(&format!("&{b:02x}"));
        }
    }
    out
}

/// Inverse of [`encode_tag_value`].
pub fn decode_tag_value(s: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(s.len());
    let mut it = s.bytes();
    while let Some(b) = it.next() {
        if b == b'&' {
            let hi = (it.next()? as char).to_digit(16)?;
            let lo = (it.next()? as char).to_digit(16)?;
            bytes.push((hi * 16 + lo) as u8);
        } else {
            bytes.push(b);
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LVS_THICK: &str = include_str!("../../tests/fixtures/lvm/lvs-thick.json");
    const VGS_THICK: &str = include_str!("../../tests/fixtures/lvm/vgs-thick.json");
    const LVS_MISSING: &str = include_str!("../../tests/fixtures/lvm/lvs-missing.json");
    /// Recorded in the VM (lvm 2.03, Debian 12): a thin pool, a mounted thin LV
    /// holding data, and a thin snapshot of it (activation skipped).
    const LVS_THIN: &str = include_str!("../../tests/fixtures/lvm/lvs-thin.json");

    #[test]
    fn parses_recorded_lvs() {
        let lvs = parse_lvs(LVS_THICK).unwrap();
        assert_eq!(lvs.len(), 2);
        let a = &lvs[0];
        assert_eq!(a.name, "lv-a");
        assert_eq!(a.vg, "fxvg");
        assert_eq!(a.size, 67_108_864);
        assert_eq!(a.tags, ["localvol", "localvol.name=pvc-1"]);
        assert_eq!(a.tag_value("localvol.name"), Some("pvc-1"));
        assert!(a.has_tag("localvol"));
        assert!(!a.is_thin_pool() && !a.is_thin_volume() && !a.is_cow_snapshot());
        assert_eq!(a.data_percent, None);
        assert_eq!(a.path, "/dev/fxvg/lv-a");
        assert!(parse_lvs(LVS_MISSING).unwrap().is_empty());
    }

    #[test]
    fn parses_recorded_thin_lvs() {
        let lvs = parse_lvs(LVS_THIN).unwrap();
        let by_name = |n: &str| lvs.iter().find(|l| l.name == n).unwrap();
        assert_eq!(lvs.len(), 3);

        let vol = by_name("lv-0123456789abcdef0123456789abcdef");
        assert!(vol.is_thin_volume() && !vol.is_thin_pool() && !vol.is_cow_snapshot());
        assert_eq!(vol.pool_lv, "tp");
        assert_eq!(vol.origin, "");
        assert_eq!(vol.size, 64 << 20);
        assert_eq!(vol.data_percent, Some(26.17));
        assert_eq!(vol.metadata_percent, None);
        assert!(vol.is_active() && vol.open, "mounted");
        assert_eq!(vol.tag_value("localvol.pool"), Some("thin"));
        assert_eq!(vol.tag_value("localvol.name"), Some("pvc-1"));
        assert_eq!(vol.path, "/dev/fxvg/lv-0123456789abcdef0123456789abcdef");
        assert_eq!(
            vol.created_unix,
            parse_lv_time("2026-11-22 04:26:32 +0000").unwrap()
        );

        let snap = by_name("sn-0123456789abcdef0123456789abcdef");
        assert!(snap.is_thin_volume() && !snap.is_thin_pool() && !snap.is_cow_snapshot());
        assert_eq!(snap.origin, vol.name);
        assert_eq!(snap.pool_lv, "tp");
        assert_eq!(snap.size, vol.size);
        assert_eq!(snap.data_percent, None, "inactive: lvm reports no usage");
        assert!(
            !snap.is_active() && !snap.open,
            "thin snapshots skip activation"
        );
        assert_eq!(snap.tag_value("localvol.kind"), Some("snapshot"));

        let pool = by_name("tp");
        assert!(pool.is_thin_pool() && !pool.is_thin_volume());
        assert_eq!(pool.size, 256 << 20);
        assert_eq!(pool.data_percent, Some(6.62));
        assert_eq!(pool.metadata_percent, Some(11.23));
        assert!(pool.tags.is_empty() && pool.path.is_empty());
        assert!(pool.is_active() && pool.open);
    }

    #[test]
    fn reads_thin_device_ids() {
        // `thin_id` is in the fields asked for; lvm leaves it empty for
        // what is not a thin volume (the recorded fixtures predate it).
        let json = r#"{"report":[{"lv":[
            {"lv_name":"sn-a","vg_name":"vg","lv_size":"67108864","lv_attr":"Vwi---tz-k","thin_id":"7"},
            {"lv_name":"tp","vg_name":"vg","lv_size":"268435456","lv_attr":"twi-aotz--","thin_id":""},
            {"lv_name":"lv-b","vg_name":"vg","lv_size":"4194304","lv_attr":"-wi-a-----"}
        ]}]}"#;
        let lvs = parse_lvs(json).unwrap();
        assert_eq!(lvs[0].thin_id, Some(7));
        assert_eq!(lvs[1].thin_id, None);
        assert_eq!(lvs[2].thin_id, None);
        assert!(LV_FIELDS.split(',').any(|f| f == "thin_id"));
    }

    #[test]
    fn parses_pvs() {
        let pvs = parse_pvs(
            r#"{"report":[{"pv":[{"pv_name":"/dev/loop0","vg_name":"fast"},{"pv_name":"/dev/loop1","vg_name":""}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            pvs,
            [
                PvInfo {
                    name: "/dev/loop0".into(),
                    vg: "fast".into()
                },
                PvInfo {
                    name: "/dev/loop1".into(),
                    vg: String::new()
                }
            ]
        );
        assert!(parse_pvs("{}").is_err());
    }

    #[test]
    fn parses_recorded_vgs() {
        let vgs = parse_vgs(VGS_THICK).unwrap();
        assert_eq!(vgs.len(), 1);
        assert_eq!(vgs[0].name, "fxvg");
        assert_eq!(vgs[0].extent_size, 4 << 20);
        assert!(vgs[0].free < vgs[0].size);
        assert_eq!(vgs[0].free, vgs[0].free_extents * vgs[0].extent_size);
    }

    #[test]
    fn rejects_malformed_reports() {
        assert!(parse_lvs("not json").is_err());
        assert!(parse_lvs(
            r#"{"report":[{"lv":[{"lv_name":"a","vg_name":"v","lv_size":"12x"}]}]}"#
        )
        .is_err());
    }

    #[test]
    fn parses_lv_time() {
        assert_eq!(parse_lv_time("1970-01-01 00:00:00 +0000"), Some(0));
        assert_eq!(
            parse_lv_time("2026-11-22 03:05:21 +0000"),
            Some(1_795_316_721)
        );
        assert_eq!(
            parse_lv_time("2026-11-22 04:05:21 +0100"),
            Some(1_795_316_721)
        );
        assert_eq!(
            parse_lv_time("2000-02-29 12:00:00 -0230"),
            Some(951_834_600)
        );
        assert_eq!(parse_lv_time(""), None);
        assert_eq!(parse_lv_time("yesterday"), None);
    }

    #[test]
    fn tag_values_round_trip() {
        for s in ["pvc-1", "a b/c", "ünï&code", "x=y,z", ""] {
            let enc = encode_tag_value(s);
            assert!(enc.chars().all(is_tag_char), "{enc}");
            assert!(!enc.contains(','));
            assert_eq!(decode_tag_value(&enc).as_deref(), Some(s));
        }
        assert_eq!(decode_tag_value("&zz"), None);
    }
}
