//! The fixture of the LVM scenarios run in the VM (`tests/vm/vm_lvm.rs`,
//! `tests/vm/vm_snapshots.rs`): the real driver serving one LVM pool on a volume
//! group of its own. What only one of those files needs stays there.

use localvol::csi;
use localvol::ids::VolumeName;
use tonic::Status;

use crate::{delete_req, lv_name, Driver, DriverOpts, LoopVg, LvRow, LvmKind, LvmPoolOpts, MI};

/// The tag a thick pool's DeleteVolume puts on the LV it hands to the wiper
/// (which renames it `wp-…`, zeroes and removes it).
pub const TAG_DELETED: &str = "localvol.deleted";

/// A driver serving one LVM pool ("thick", or "thin" on the thin pool `tp`)
/// on a VG of its own over a loop device ([`LoopVg`]). Fields drop in order:
/// the driver (and every mount below its dir) before the VG.
pub struct LvmFx {
    pub d: Driver,
    pub vg: LoopVg,
    pub kind: LvmKind,
    /// The pool's name: "thick" or "thin" (see [`LvmFx::serve`] for others).
    pub pool: &'static str,
}

impl LvmFx {
    /// The VG's size, unless the test asks for another.
    pub const VG_BYTES: u64 = 2 << 30;
    /// The thin pool's size (thin pools), unless the test asks for another.
    pub const THIN_BYTES: u64 = 1 << 30;
    /// Thin pools offer this many times their size (`overprovisionRatio`).
    pub const THIN_RATIO: f64 = 2.0;
    /// What every pool keeps back: its `reserve: 64Mi`.
    pub const RESERVE: i64 = 64 * MI;
    /// LVM's default extent size (the VG's): volume sizes are multiples of it.
    pub const EXTENT: i64 = 4 * MI;

    /// A pool of this kind on a [`LvmFx::VG_BYTES`] VG.
    pub async fn new(kind: LvmKind) -> Self {
        Self::start(kind, Self::VG_BYTES, Self::THIN_BYTES, |o| o).await
    }

    /// Like [`LvmFx::new`], with changes to the pool's options.
    pub async fn with(kind: LvmKind, change: impl FnOnce(LvmPoolOpts) -> LvmPoolOpts) -> Self {
        Self::start(kind, Self::VG_BYTES, Self::THIN_BYTES, change).await
    }

    /// Like [`LvmFx::new`], on a VG of `vg_bytes`; a thin pool gets a thin
    /// pool LV of `thin_bytes`.
    pub async fn sized(kind: LvmKind, vg_bytes: u64, thin_bytes: u64) -> Self {
        Self::start(kind, vg_bytes, thin_bytes, |o| o).await
    }

    /// The general case: a VG of `vg_bytes` (with a thin pool LV `tp` of
    /// `thin_bytes` for a thin pool) and the pool's options (reserve, thin
    /// pool and ratio already set) passed through `change`.
    pub async fn start(
        kind: LvmKind,
        vg_bytes: u64,
        thin_bytes: u64,
        change: impl FnOnce(LvmPoolOpts) -> LvmPoolOpts,
    ) -> Self {
        Self::start_with(kind, vg_bytes, thin_bytes, change, |o| o).await
    }

    /// Like [`LvmFx::start`], with changes to the driver's options too (e.g.
    /// its environment: `tests/vm/vm_faults.rs`).
    pub async fn start_with(
        kind: LvmKind,
        vg_bytes: u64,
        thin_bytes: u64,
        change: impl FnOnce(LvmPoolOpts) -> LvmPoolOpts,
        change_driver: impl FnOnce(DriverOpts) -> DriverOpts,
    ) -> Self {
        let (vg, opts, pool) = match kind {
            LvmKind::Thick => {
                let vg = LoopVg::create(vg_bytes, None);
                let o = LvmPoolOpts::new("thick", &vg.vg);
                (vg, o, "thick")
            }
            LvmKind::Thin => {
                let vg = LoopVg::create(vg_bytes, Some(thin_bytes));
                let o = LvmPoolOpts::new("thin", &vg.vg)
                    .thin_pool("tp")
                    .overprovision_ratio(Self::THIN_RATIO);
                (vg, o, "thin")
            }
        };
        let opts = change(opts.reserve("64Mi"));
        let driver = change_driver(DriverOpts::with_lvm_pools(vec![opts]));
        Self::serve(kind, pool, vg, driver).await
    }

    /// A driver on `opts` whose pool `pool` lives on `vg`, a VG the test made
    /// itself (a shape [`LvmFx::start`] cannot make).
    pub async fn serve(kind: LvmKind, pool: &'static str, vg: LoopVg, opts: DriverOpts) -> Self {
        let mut d = Driver::new(opts);
        d.start_again_retrying().await;
        Self { d, vg, kind, pool }
    }

    /// The LV behind a volume id.
    pub fn lv(&self, volume_id: &str) -> Option<LvRow> {
        self.vg.lv(&lv_name(volume_id))
    }

    /// Names of every LV in the VG, sorted.
    pub fn lv_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.vg.lvs().into_iter().map(|l| l.name).collect();
        v.sort();
        v
    }

    /// LVs a thick pool is zeroing before they go: `wp-<key>-<stamp>` (the
    /// driver renames a deleted volume's or snapshot's LV so), and volumes
    /// DeleteVolume tagged `localvol.deleted` that the wiper has not
    /// renamed yet.
    pub fn wiping_lvs(&self) -> Vec<LvRow> {
        self.vg
            .lvs()
            .into_iter()
            .filter(|l| l.name.starts_with("wp-") || l.tags.iter().any(|t| t == TAG_DELETED))
            .collect()
    }

    /// Waits until no deleted LV is left to wipe, so the pool has its space
    /// back (a thick pool's DeleteVolume returns before the wipe ends).
    /// Panics with the driver's log after `WIPE_WAIT`: a wipe that never
    /// ends is a failure, not a slow machine (64 MiB takes well under a
    /// second in the VM).
    pub async fn wait_for_wipes(&self) {
        const WIPE_WAIT: std::time::Duration = std::time::Duration::from_secs(180);
        let deadline = std::time::Instant::now() + WIPE_WAIT;
        loop {
            let left = self.wiping_lvs();
            if left.is_empty() {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "LVs still waiting to be wiped after {WIPE_WAIT:?}: {left:?}\nlog:\n{}",
                self.d.log_tail(40)
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    #[track_caller]
    pub fn assert_lv_gone(&self, volume_id: &str) {
        let lv = self.lv(volume_id);
        assert!(
            lv.as_ref()
                .is_none_or(|l| l.tags.iter().any(|t| t == TAG_DELETED)),
            "the LV of {volume_id} is still there, not tagged deleted: {lv:?} (LVs: {:?})",
            self.lv_names()
        );
    }

    /// The id the pool gives the volume named `name` (`<pool>.<key>`).
    pub fn volume_id(&self, name: &str) -> String {
        let key = VolumeName::parse(name).unwrap().key();
        format!("{}.{key}", self.pool)
    }

    /// Unpublishes and unstages the volume at the target and staging paths
    /// of `tag` (what the tests' `mount` helpers staged and published there).
    pub async fn unmount(&self, id: &str, tag: &str) {
        self.d.unpublish(id, &self.d.target_path(tag)).await;
        self.d.unstage(id, &self.d.staging_path(tag)).await;
    }

    /// CreateVolume; the volume it returned.
    pub async fn create(&self, req: csi::CreateVolumeRequest) -> Result<csi::Volume, Status> {
        self.d.controller().create_volume(req).await.map(|r| {
            r.into_inner()
                .volume
                .expect("CreateVolume returned no volume")
        })
    }

    pub async fn delete_volume(&self, volume_id: &str) -> Result<(), Status> {
        self.d
            .controller()
            .delete_volume(delete_req(volume_id))
            .await
            .map(|_| ())
    }
}
