//! An LVM pool's node side: where a volume is (its LV, or its open
//! mapping when encrypted), activation, the marks NodeStage clears, usage,
//! and the volume's condition from device-mapper's state (no `lvm` run for a
//! healthy volume).

use std::path::PathBuf;

use async_trait::async_trait;

use super::super::{Encrypted, NodeSide, Result, Source, Usage, Volume};
use super::provisioning::{Provisioning, Thin};
use super::*;
use crate::blockdev::FsType;
use crate::ids::VolumeId;

impl LvmPool {
    /// Activates one of the pool's LVs by name, and makes its `/dev` nodes
    /// when activation left them missing.
    pub(super) async fn activate_lv(&self, lv: &str) -> Result<()> {
        let path = self.lv_path(lv);
        match lvm::activate(&path).await {
            Err(e) if self.repair_component(&e).await? => lvm::activate(&path).await?,
            done => done?,
        }
        self.index.forget(lv);
        ensure_nodes(&path).await
    }

    /// Makes an LV that `lvs` reported usable through its device node: an
    /// LV not active (`-`), or whose device holds only an inactive table
    /// (`i`, a killed lvcreate) is activated; an active one whose nodes are
    /// missing gets them.
    pub(super) async fn make_usable(&self, lv: &LvInfo) -> Result<()> {
        if lv.is_active() {
            ensure_nodes(&self.lv_path(&lv.name)).await
        } else {
            self.activate_lv(&lv.name).await
        }
    }
}

/// `/dev/VG/LV` of the active LV `VG/LV` exists, or `vgmknodes` makes it
/// (or, when its device still has an old name, `lvchange --refresh`): lvm
/// makes the nodes itself only after resuming the device (on a node
/// without udev), so one killed in between (an lvcreate, an activation, an
/// lvrename) leaves an active LV that nothing can open, and `lvchange -ay`
/// leaves it so.
pub(super) async fn ensure_nodes(path: &str) -> Result<()> {
    let dev = PathBuf::from(format!("/dev/{path}"));
    let present = |dev: PathBuf| crate::error::blocking(move || Ok::<_, PoolError>(dev.exists()));
    if present(dev.clone()).await? {
        return Ok(());
    }
    tracing::warn!(lv = %path, "an active LV has no device node; making it");
    lvm::make_nodes(path).await?;
    if present(dev.clone()).await? {
        return Ok(());
    }
    lvm::refresh(path).await?;
    if present(dev.clone()).await? {
        return Ok(());
    }
    Err(PoolError::Inconsistent(format!(
        "{} is still missing after vgmknodes and lvchange --refresh {path}",
        dev.display()
    )))
}

#[async_trait]
impl NodeSide for LvmPool {
    fn default_fs_type(&self) -> Option<FsType> {
        Some(self.default_fs)
    }

    fn source(&self, vol: &Volume) -> Result<Source> {
        if vol.encryption.is_some() {
            // What is mounted, bound and grown is the opened mapping.
            return Ok(Source::Device(crypt::mapping_path(&crypt::mapping_name(
                &vol.id.to_string(),
            ))));
        }
        Ok(Source::Device(PathBuf::from(format!(
            "/dev/{}/{}",
            self.vg,
            lv_name(&vol.id.key)
        ))))
    }

    async fn usage(&self, vol: &Volume) -> Result<Option<Usage>> {
        if vol.access_type != AccessType::Block {
            return Ok(None);
        }
        Ok(Some(Usage {
            total_bytes: vol.size_bytes,
            ..Usage::default()
        }))
    }

    fn device_of(&self, id: &VolumeId) -> Option<PathBuf> {
        Some(PathBuf::from(format!(
            "/dev/{}",
            self.lv_path(&lv_name(&id.key))
        )))
    }

    fn mapping_of(&self, id: &VolumeId) -> Option<String> {
        Some(crypt::mapping_name(&id.to_string()))
    }

    fn encrypted(&self, vol: &Volume) -> Result<Option<Encrypted>> {
        if vol.encryption.is_none() {
            return Ok(None);
        }
        Ok(Some(Encrypted {
            backing: PathBuf::from(format!("/dev/{}", self.lv_path(&lv_name(&vol.id.key)))),
            mapping: crypt::mapping_name(&vol.id.to_string()),
        }))
    }

    async fn activate(&self, vol: &Volume) -> Result<()> {
        self.activate_lv(&lv_name(&vol.id.key)).await?;
        tracing::info!(volume = %vol.id, "activated the volume's LV");
        Ok(())
    }

    async fn filesystem_grown(&self, vol: &Volume) -> Result<()> {
        let name = lv_name(&vol.id.key);
        lvm::delete_tag(&self.lv_path(&name), TAG_GROW).await?;
        self.index.forget(&name);
        Ok(())
    }

    async fn filesystem_made(&self, vol: &Volume) -> Result<()> {
        let name = lv_name(&vol.id.key);
        let done = lvm::delete_tag(&self.lv_path(&name), TAG_UNFORMATTED).await;
        // NodeStage erases a volume the index says is `unformatted`, so the
        // entry must never keep a tag lvm no longer has: mirror the change,
        // or (lvchange failed, and may have committed) forget the entry.
        match (&done, self.index.get(&name)) {
            (Ok(()), Some(mut lv)) => {
                lv.tags.retain(|t| t != TAG_UNFORMATTED);
                self.index.put(lv);
            }
            _ => self.index.forget(&name),
        }
        done?;
        Ok(())
    }

    async fn condition(&self, vol: &Volume) -> Result<Option<String>> {
        let key = &vol.id.key;
        // The condition is the LV's state now, never the index's: first as
        // device-mapper has it (no process: kubelet asks about every volume
        // every minute); lvs only when that cannot tell (no mapping).
        let (vg, name) = (self.vg.clone(), lv_name(key));
        let thin = self.provisioning.thin().cloned();
        let from_dm = crate::error::blocking(move || {
            Ok::<_, crate::error::IoError>(dm_condition(&vg, &name, thin.as_ref()))
        })
        .await;
        if let Ok(Some(answer)) = from_dm {
            return Ok(answer);
        }
        let Some(lv) = self.lookup(key).await? else {
            return Ok(Some(format!("LV {}/{} is missing", self.vg, lv_name(key))));
        };
        if !lv.is_active() {
            return Ok(Some(format!("LV {}/{} is not active", self.vg, lv.name)));
        }
        match &self.provisioning {
            Provisioning::Thin(thin) => {
                Ok(lvm::lv(&self.vg, thin.pool.as_str())
                    .await?
                    .and_then(|pool| {
                        let data = pool.data_percent.unwrap_or(0.0);
                        thin.nearly_full(&self.vg, data, pool.metadata_percent.unwrap_or(0.0))
                    }))
            }
            Provisioning::Thick(_) => Ok(None),
        }
    }
}

/// A volume's condition from device-mapper alone: `Some(None)` healthy (its
/// mapping is there, and a thin volume's pool serves below its
/// `thinFullPercent`),
/// `Some(Some(why))` abnormal, `None` when it cannot tell (no mapping, or not
/// one lvm made: the LV is inactive or gone, which lvs tells apart).
fn dm_condition(vg: &str, lv: &str, thin: Option<&Thin>) -> Option<Option<String>> {
    let st = crate::dm::status(&crate::dm::lv_name(vg, lv)).ok()??;
    if !st.is_lvm() {
        return None;
    }
    if st.targets.iter().any(|t| t.status == "Fail") {
        return Some(Some(format!("LV {vg}/{lv} has failed (device-mapper)")));
    }
    match thin {
        Some(thin) => thin.dm_condition(vg),
        None => Some(None),
    }
}

impl Thin {
    /// The thin pool's part of a thin volume's condition, from its
    /// device-mapper status (as [`dm_condition`] answers).
    fn dm_condition(&self, vg: &str) -> Option<Option<String>> {
        let thin = &self.pool;
        let (_, pool) = crate::dm::thin_pool(vg, thin.as_str()).ok()??;
        if let Some(why) = self.nearly_full(vg, pool.data_percent, pool.metadata_percent) {
            return Some(Some(why));
        }
        if !pool.serving() {
            return Some(Some(format!(
                "thin pool {vg}/{thin} is {}{} (device-mapper)",
                pool.mode,
                if pool.needs_check {
                    ", needs_check"
                } else {
                    ""
                }
            )));
        }
        Some(None)
    }

    /// Why every volume of the thin pool is abnormal when its Data% or
    /// Metadata% is at or over `thinFullPercent`.
    fn nearly_full(&self, vg: &str, data: f64, meta: f64) -> Option<String> {
        let full = self.full_percent;
        (data >= full || meta >= full).then(|| {
            format!(
                "thin pool {vg}/{} is nearly full (data {data:.1}%, metadata {meta:.1}%; threshold {full}%)",
                self.pool
            )
        })
    }
}
