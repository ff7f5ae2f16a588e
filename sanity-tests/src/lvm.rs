//! LVM volume groups on loop devices (VM tests: `tests/vm/vm_lvm.rs` and the
//! others on LVM pools), and `lvs` as the tests read it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{mounts, path_str, quiet, run_cmd, LoopDevice};

/// Whether device-mapper works here: in the project's VM, not on hosts whose
/// kernel lacks it.
pub fn has_device_mapper() -> bool {
    Path::new("/dev/mapper/control").exists()
        && Command::new("dmsetup")
            .arg("version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// One logical volume as `lvs` reports it (parsed here, independently of the
/// driver's own parser).
#[derive(Clone, Debug, PartialEq)]
pub struct LvRow {
    pub name: String,
    pub size: i64,
    pub tags: Vec<String>,
    pub attr: String,
    pub pool_lv: String,
    pub origin: String,
    pub data_percent: Option<f64>,
    /// `lv_device_open`: something holds the device open.
    pub open: bool,
}

impl LvRow {
    pub fn is_active(&self) -> bool {
        self.attr.chars().nth(4) == Some('a')
    }
}

/// A volume group on a loop device over a sparse image in its own temp dir
/// (tmpfs in the VM), with an optional thin pool `tp`. Drop unmounts whatever
/// is mounted from its LVs, removes the VG, the PV and the loop device, so a
/// failed test leaves nothing behind. Declare it before the [`Driver`](crate::Driver) (locals
/// drop in reverse order), or after it in a struct.
pub struct LoopVg {
    pub vg: String,
    pub thin_pool: Option<String>,
    device: Option<LoopDevice>,
    _dir: tempfile::TempDir,
}

impl LoopVg {
    /// A VG of `bytes` (sparse), with a thin pool of `thin_pool_bytes` if given.
    pub fn create(bytes: u64, thin_pool_bytes: Option<u64>) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        assert!(
            has_device_mapper(),
            "no device-mapper in this kernel: LVM tests run in the VM (make test-vm)"
        );
        let dir = tempfile::Builder::new()
            .prefix("localvol-vg-")
            .tempdir()
            .unwrap();
        let device = LoopDevice::create(&dir.path().join("pv.img"), bytes);
        let mut me = Self {
            vg: format!(
                "lvt{}n{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
            thin_pool: None,
            device: Some(device),
            _dir: dir,
        };
        // vgcreate makes the PV too (one lvm call: they are slow in the VM).
        run_cmd("lvm", &["vgcreate", "-qq", &me.vg, &me.pv()]);
        if let Some(b) = thin_pool_bytes {
            let tp = format!("{}/tp", me.vg);
            run_cmd(
                "lvm",
                &["lvcreate", "-qq", "-y", "-T", "-L", &format!("{b}b"), &tp],
            );
            me.thin_pool = Some("tp".into());
        }
        me
    }

    /// The loop device under the VG.
    pub fn pv(&self) -> String {
        path_str(&self.device.as_ref().expect("loop device").path)
    }

    /// `/dev/<vg>/<lv>`.
    pub fn dev_path(&self, lv: &str) -> PathBuf {
        PathBuf::from(format!("/dev/{}/{lv}", self.vg))
    }

    /// The device-mapper name lvm gives `lv` of this VG (every `-` of both
    /// names doubled, joined by `-`).
    pub fn dm_name(&self, lv: &str) -> String {
        format!("{}-{}", self.vg.replace('-', "--"), lv.replace('-', "--"))
    }

    /// Every LV of the VG (`lvs` without `-a`: no hidden LVs).
    pub fn lvs(&self) -> Vec<LvRow> {
        let out = run_cmd(
            "lvm",
            &[
                "lvs",
                "--reportformat",
                "json",
                "--units",
                "b",
                "--nosuffix",
                "-o",
                "lv_name,lv_size,lv_tags,lv_attr,pool_lv,origin,data_percent,lv_device_open",
                &self.vg,
            ],
        );
        let v: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("lvs printed no JSON ({e}): {out}"));
        let s = |l: &serde_json::Value, k: &str| l[k].as_str().unwrap_or_default().to_owned();
        v["report"][0]["lv"]
            .as_array()
            .map(|a| a.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|l| LvRow {
                name: s(l, "lv_name"),
                size: s(l, "lv_size").parse().expect("lv_size in bytes"),
                tags: s(l, "lv_tags")
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned)
                    .collect(),
                attr: s(l, "lv_attr"),
                pool_lv: s(l, "pool_lv"),
                origin: s(l, "origin"),
                data_percent: s(l, "data_percent").parse().ok(),
                open: s(l, "lv_device_open") == "open",
            })
            .collect()
    }

    pub fn lv(&self, name: &str) -> Option<LvRow> {
        self.lvs().into_iter().find(|l| l.name == name)
    }

    /// (`vg_size`, `vg_free`, `vg_extent_size`) in bytes.
    pub fn vg_sizes(&self) -> (i64, i64, i64) {
        let out = run_cmd(
            "lvm",
            &[
                "vgs",
                "--noheadings",
                "--units",
                "b",
                "--nosuffix",
                "--separator",
                ":",
                "-o",
                "vg_size,vg_free,vg_extent_size",
                &self.vg,
            ],
        );
        let n: Vec<i64> = out
            .trim()
            .split(':')
            .map(|x| x.trim().parse().expect("vgs number"))
            .collect();
        (n[0], n[1], n[2])
    }
}

/// The block devices (`dm-N`) stacked on `devs`, at any depth, each listed
/// after what it is stacked on; from `/sys/block/<dev>/holders`.
fn holders_of(devs: &[String]) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let mut next: Vec<String> = devs.to_vec();
    while let Some(d) = next.pop() {
        for h in fs::read_dir(format!("/sys/block/{d}/holders"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let h = h.file_name().to_string_lossy().into_owned();
            if !devs.contains(&h) && !found.contains(&h) {
                found.push(h.clone());
                next.push(h);
            }
        }
    }
    found
}

/// Unmounts whatever a failed test left mounted from the VG `vg`'s LVs (the
/// dm devices named `<vg>-...`: the VG's name has no '-') or from a device
/// stacked on them (a dm-crypt mapping), then removes those stacked devices:
/// they hold the LVs open, and a test that failed with one left would leave
/// it to fail the next test of that pool.
fn release_leftovers(vg: &str) {
    let prefix = format!("{vg}-");
    let ours: Vec<String> = fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            fs::read_to_string(e.path().join("dm/name")).is_ok_and(|n| n.starts_with(&prefix))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let stacked = holders_of(&ours);
    let devs: Vec<String> = ours
        .iter()
        .chain(&stacked)
        .filter_map(|b| {
            Some(
                fs::read_to_string(format!("/sys/block/{b}/dev"))
                    .ok()?
                    .trim()
                    .to_owned(),
            )
        })
        .collect();
    for _ in 0..64 {
        let Some(m) = mounts()
            .into_iter()
            .filter(|m| devs.contains(&m.dev))
            .max_by_key(|m| m.mount_point.components().count())
        else {
            break;
        };
        use nix::mount::{umount2, MntFlags};
        if umount2(&m.mount_point, MntFlags::empty()).is_err() {
            let _ = umount2(&m.mount_point, MntFlags::MNT_DETACH);
        }
    }
    // The topmost first (`holders_of` lists them so).
    for b in stacked.iter().rev() {
        if let Ok(name) = fs::read_to_string(format!("/sys/block/{b}/dm/name")) {
            eprintln!("WARNING: removing {} left stacked on VG {vg}", name.trim());
            let _ = Command::new("dmsetup")
                .args(["remove", "--force", name.trim()])
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for LoopVg {
    fn drop(&mut self) {
        release_leftovers(&self.vg);
        // Deactivating is enough: the metadata goes with the image file, and
        // it is cheaper than vgremove (each lvm call is slow in the VM).
        if !quiet("lvm", &["vgchange", "-qq", "-an", &self.vg]) {
            eprintln!(
                "WARNING: vgchange -an {} failed; removing its dm devices",
                self.vg
            );
            // dm names are `<vg>-<lv>` (this VG's name has no '-').
            let prefix = format!("{}-", self.vg);
            if let Ok(out) = Command::new("dmsetup")
                .args(["ls"])
                .stderr(Stdio::null())
                .output()
            {
                for name in String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter_map(|l| l.split_whitespace().next())
                    .filter(|n| n.starts_with(&prefix))
                {
                    let _ = Command::new("dmsetup")
                        .args(["remove", "--force", name])
                        .stdin(Stdio::null())
                        .status();
                }
            }
            quiet("lvm", &["vgchange", "-qq", "-an", &self.vg]);
        }
        // The loop device detaches when `device` drops, and the image goes
        // with the temp dir.
        self.device.take();
    }
}
