//! The options a [`Driver`](crate::Driver) starts with: its flags and the pools
//! of the config it writes (`type: dir` and `type: lvm`).

use crate::NODE_ID;

/// One `type: dir` pool of the driver's config.
#[derive(Clone, Debug)]
pub struct PoolOpts {
    pub name: String,
    /// `reserve:` (a Kubernetes quantity such as `16Mi`).
    pub reserve: Option<String>,
    /// `capacity:`.
    pub capacity: Option<String>,
    /// `defaultSize:`.
    pub default_size: Option<String>,
    /// `quota:` (`required`, `auto` or `off`).
    pub quota: Option<String>,
    /// `requireMountPoint:` (`true` or `false`).
    pub require_mount_point: Option<String>,
}

impl PoolOpts {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            reserve: None,
            capacity: None,
            default_size: None,
            quota: None,
            require_mount_point: None,
        }
    }
    pub fn require_mount_point(mut self, on: bool) -> Self {
        self.require_mount_point = Some(on.to_string());
        self
    }
    pub fn capacity(mut self, q: &str) -> Self {
        self.capacity = Some(q.to_owned());
        self
    }
    pub fn reserve(mut self, q: &str) -> Self {
        self.reserve = Some(q.to_owned());
        self
    }
    pub fn default_size(mut self, q: &str) -> Self {
        self.default_size = Some(q.to_owned());
        self
    }
    pub fn quota(mut self, mode: &str) -> Self {
        self.quota = Some(mode.to_owned());
        self
    }
}

#[derive(Clone, Debug)]
pub struct DriverOpts {
    pub node_id: String,
    /// `--driver-name`; the binary's default when unset.
    pub driver_name: Option<String>,
    /// The first pool lives in `<dir>/pool`, the others in `<dir>/pool-<name>`.
    pub pools: Vec<PoolOpts>,
    pub default_pool: Option<String>,
    pub max_volumes_per_node: i64,
    /// Make `<dir>/kubelet` a symlink to `<dir>/kubelet-real` (some nodes have
    /// kubelet's root dir on another disk behind a symlink).
    pub kubelet_dir_is_symlink: bool,
    /// `--socket-group`.
    pub socket_group: Option<String>,
    /// `type: lvm` pools, written after the dir pools (so they are the default
    /// pool when `pools` is empty).
    pub lvm_pools: Vec<LvmPoolOpts>,
    /// YAML appended to the generated config as it is (e.g. a `discovery:`
    /// section: `tests/host/static_volumes.rs`).
    pub extra_config: String,
    /// `--metrics-addr` (e.g. `127.0.0.1:PORT`; see [`free_port`](crate::free_port)).
    pub metrics_addr: Option<String>,
    /// Extra environment of the driver process (e.g. a `PATH` that puts
    /// fault-injecting wrappers of `lvm` or `mkfs` first: `tests/vm/vm_faults.rs`).
    pub env: Vec<(String, String)>,
    /// Extra `localvol serve` arguments (e.g. `--kube-api URL`:
    /// [`replace`](crate::replace)).
    pub args: Vec<String>,
    /// Run the driver in a process group of its own, with every program it
    /// runs, for [`Driver::kill9_then`](crate::Driver::kill9_then) (the kill
    /// campaigns). Off elsewhere: when a killed group leader leaves a
    /// stopped program behind (a test holding a copy with SIGSTOP), the
    /// kernel hangs up on the orphaned group, and the program dies.
    pub own_process_group: bool,
}

impl Default for DriverOpts {
    fn default() -> Self {
        Self {
            node_id: NODE_ID.to_owned(),
            driver_name: None,
            // A small default size keeps tests that create many volumes cheap.
            pools: vec![PoolOpts::new("default").default_size("16Mi")],
            default_pool: None,
            max_volumes_per_node: 0,
            kubelet_dir_is_symlink: false,
            socket_group: None,
            lvm_pools: Vec::new(),
            extra_config: String::new(),
            metrics_addr: None,
            env: Vec::new(),
            args: Vec::new(),
            own_process_group: false,
        }
    }
}

impl DriverOpts {
    /// One pool named `name` with the given settings.
    pub fn with_pool(pool: PoolOpts) -> Self {
        Self {
            pools: vec![pool],
            ..Self::default()
        }
    }

    /// Only these LVM pools (no dir pool); the first is the default pool.
    pub fn with_lvm_pools(pools: Vec<LvmPoolOpts>) -> Self {
        Self {
            pools: Vec::new(),
            lvm_pools: pools,
            ..Self::default()
        }
    }
}

/// One `type: lvm` pool of the driver's config (VM tests: `tests/vm/vm_lvm.rs`).
#[derive(Clone, Debug)]
pub struct LvmPoolOpts {
    pub name: String,
    pub volume_group: String,
    pub thin_pool: Option<String>,
    pub overprovision_ratio: Option<f64>,
    /// `reserve:` (a quantity such as `64Mi`).
    pub reserve: Option<String>,
    /// `defaultFsType:` (`ext4` or `xfs`).
    pub default_fs_type: Option<String>,
    pub default_size: Option<String>,
    /// `thinFullPercent:`.
    pub thin_full_percent: Option<f64>,
    /// `wipeRateLimit:` (bytes per second, a quantity such as `16Mi`).
    pub wipe_rate_limit: Option<String>,
}

impl LvmPoolOpts {
    pub fn new(name: &str, volume_group: &str) -> Self {
        Self {
            name: name.to_owned(),
            volume_group: volume_group.to_owned(),
            thin_pool: None,
            overprovision_ratio: None,
            reserve: None,
            default_fs_type: None,
            default_size: None,
            thin_full_percent: None,
            wipe_rate_limit: None,
        }
    }
    pub fn thin_full_percent(mut self, p: f64) -> Self {
        self.thin_full_percent = Some(p);
        self
    }
    pub fn wipe_rate_limit(mut self, q: &str) -> Self {
        self.wipe_rate_limit = Some(q.to_owned());
        self
    }
    pub fn thin_pool(mut self, lv: &str) -> Self {
        self.thin_pool = Some(lv.to_owned());
        self
    }
    pub fn overprovision_ratio(mut self, r: f64) -> Self {
        self.overprovision_ratio = Some(r);
        self
    }
    pub fn reserve(mut self, q: &str) -> Self {
        self.reserve = Some(q.to_owned());
        self
    }
    pub fn default_fs_type(mut self, fs: &str) -> Self {
        self.default_fs_type = Some(fs.to_owned());
        self
    }
    pub fn default_size(mut self, q: &str) -> Self {
        self.default_size = Some(q.to_owned());
        self
    }

    pub(crate) fn yaml(&self) -> String {
        let mut y = format!(
            "  - name: {}\n    type: lvm\n    volumeGroup: {}\n",
            yaml_str(&self.name),
            yaml_str(&self.volume_group)
        );
        if let Some(r) = self.overprovision_ratio {
            y.push_str(&format!("    overprovisionRatio: {r}\n"));
        }
        if let Some(p) = self.thin_full_percent {
            y.push_str(&format!("    thinFullPercent: {p}\n"));
        }
        for (k, v) in [
            ("thinPool", &self.thin_pool),
            ("reserve", &self.reserve),
            ("defaultFsType", &self.default_fs_type),
            ("defaultSize", &self.default_size),
            ("wipeRateLimit", &self.wipe_rate_limit),
        ] {
            if let Some(v) = v {
                y.push_str(&format!("    {k}: {}\n", yaml_str(v)));
            }
        }
        y
    }
}

pub(crate) fn yaml_str(s: &str) -> String {
    // JSON strings are valid YAML double-quoted scalars.
    serde_json::to_string(s).expect("string to JSON")
}
