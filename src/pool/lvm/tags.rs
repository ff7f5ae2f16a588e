//! The tag schema: what the tags on an LV say it is. `lvs` is the ground
//! truth, so these functions are the driver's whole record format: which LVs
//! are this pool's volumes or snapshots, which are unfinished, and which a
//! retried create may take as its own.

use super::provisioning::Provisioning;
use super::LvmPool;
use crate::ids::{VolumeId, VolumeKey, VolumeName};
use crate::lvm::{self, LvInfo};
use crate::pool::{AccessType, CreateRequest, Encryption, Snapshot, Volume};
use crate::pool::{PoolError, Result};

pub(super) const TAG_OWNER: &str = "localvol";

pub(super) const TAG_POOL: &str = "localvol.pool";

pub(super) const TAG_NAME: &str = "localvol.name";

pub(super) const TAG_ACCESS: &str = "localvol.access";

/// `volume` or `snapshot` (LVs without it are volumes).
pub(super) const TAG_KIND: &str = "localvol.kind";

/// Snapshots: id of the volume they copy. Volumes: the snapshot or volume they
/// were created from.
pub(super) const TAG_SOURCE: &str = "localvol.source";

/// Snapshots: size of the source volume when taken.
pub(super) const TAG_SIZE: &str = "localvol.size";

/// A thick volume whose copy from its source has not finished: it stays
/// invisible until a (retried) create completes the copy.
pub(super) const TAG_RESTORING: &str = "localvol.restoring";

/// The volume's filesystem is smaller than the LV (restored into a larger one).
pub(super) const TAG_GROW: &str = "localvol.grow";

/// A new, empty volume of mount access whose filesystem the node has not
/// made yet (set by `lvcreate`, removed after the first `mkfs` succeeds and
/// before the first mount): what a cut-short `mkfs` left is never taken for
/// a finished filesystem.
pub(super) const TAG_UNFORMATTED: &str = "localvol.unformatted";

/// Volumes and snapshots: encrypted at rest (`luks2`): the LV holds a LUKS2
/// volume, opened at NodeStage with the stage secret's key. Restores and
/// clones inherit it from their source (the data copied is ciphertext).
pub(super) const TAG_ENCRYPTION: &str = "localvol.encryption";

/// A volume whose `lvcreate` has not been seen to finish: it stays invisible
/// until a (retried) create completes it (see [`LvmPool::finish_create`]).
pub(super) const TAG_CREATING: &str = "localvol.creating";

/// A thick volume deleted (set by DeleteVolume's one `lvchange`, whose
/// selection has lvm check that the LV is this pool's, not open and no
/// origin of snapshots): from then on it is gone for every RPC, and the
/// wiper renames it to `wp-…` (freeing its name), zeroes and removes it
/// (see `wipe.rs`).
pub(super) const TAG_DELETED: &str = "localvol.deleted";

/// IO limits of a volume (`<readIOPS>:<writeIOPS>:<readBps>:<writeBps>`,
/// `max` for none; no tag: no limits). Set at create from the mutable
/// parameters and changed by ControllerModifyVolume.
pub(super) const TAG_IO: &str = "localvol.io";

/// An LV's IO limits, from its tag (a tag that does not parse: none, and
/// the next modify replaces it).
pub(super) fn io_limits_of(lv: &LvInfo) -> crate::pool::IoLimits {
    lv.tag_value(TAG_IO)
        .and_then(crate::pool::IoLimits::from_tag_value)
        .unwrap_or_default()
}

/// The tag that records `limits` (none when unlimited).
pub(super) fn io_tag(limits: &crate::pool::IoLimits) -> Option<String> {
    limits.to_tag_value().map(|v| format!("{TAG_IO}={v}"))
}

/// How an LV's data is encrypted, from its tag.
pub(super) fn encryption_of(lv: &LvInfo) -> Option<Encryption> {
    lv.tag_value(TAG_ENCRYPTION).and_then(Encryption::parse)
}

/// The tag that records `encryption` (none for plain volumes).
pub(super) fn encryption_tag(encryption: Option<Encryption>) -> Option<String> {
    encryption.map(|e| format!("{TAG_ENCRYPTION}={}", e.as_str()))
}

pub(super) fn lv_name(key: &VolumeKey) -> String {
    format!("lv-{key}")
}

pub(super) fn snap_lv_name(key: &VolumeKey) -> String {
    format!("sn-{key}")
}

/// A volume whose create has not completed (see [`TAG_CREATING`],
/// [`TAG_RESTORING`]).
pub(super) fn is_unfinished(lv: &LvInfo) -> bool {
    lv.has_tag(TAG_CREATING) || lv.has_tag(TAG_RESTORING)
}

/// A COW snapshot whose area overflowed: dm-snapshot dropped it, and its
/// reads fail (`I` in the state column of lv_attr).
pub(super) fn is_invalid_cow(lv: &LvInfo) -> bool {
    lv.is_cow_snapshot() && lv.attr.chars().nth(4) == Some('I')
}

impl LvmPool {
    /// ALREADY_EXISTS: the name an LV of this volume would have is taken by
    /// an LV that is not this pool's (another pool's, another tool's, or a
    /// snapshot's).
    pub(super) fn not_ours(&self, lv: &str) -> PoolError {
        PoolError::NotOurs {
            what: format!("LV {}", self.lv_path(lv)),
        }
    }

    /// A thick pool's volume deleted and waiting for the wiper to rename it
    /// (see [`TAG_DELETED`]).
    pub(super) fn is_deleted(&self, lv: &LvInfo) -> bool {
        matches!(self.provisioning, Provisioning::Thick(_))
            && self.is_ours(lv)
            && lv.has_tag(TAG_DELETED)
    }

    pub(super) fn is_ours(&self, lv: &LvInfo) -> bool {
        lv.has_tag(TAG_OWNER) && lv.tag_value(TAG_POOL) == Some(self.name.as_str())
    }

    /// The volume an LV of this pool represents (None for other LVs).
    pub(super) fn to_volume(&self, lv: &LvInfo) -> Option<Volume> {
        if !self.is_ours(lv)
            || lv.has_tag(TAG_RESTORING)
            || lv.has_tag(TAG_CREATING)
            || lv.has_tag(TAG_DELETED)
        {
            return None;
        }
        let key = VolumeKey::parse(lv.name.strip_prefix("lv-")?)?;
        let name = VolumeName::parse(&lvm::decode_tag_value(lv.tag_value(TAG_NAME)?)?).ok()?;
        let access_type = match lv.tag_value(TAG_ACCESS)? {
            "block" => AccessType::Block,
            _ => AccessType::Mount,
        };
        Some(Volume {
            id: VolumeId {
                pool: self.name.clone(),
                key,
            },
            name,
            size_bytes: lv.size,
            access_type,
            created_unix: 0,
            parameters: Default::default(),
            project_id: None,
            inode_limit: None,
            grow_filesystem: lv.has_tag(TAG_GROW),
            unformatted: lv.has_tag(TAG_UNFORMATTED),
            inactive: !lv.is_active(),
            encryption: encryption_of(lv),
            io_limits: io_limits_of(lv),
        })
    }

    /// The snapshot an LV of this pool represents (None for other LVs).
    pub(super) fn to_snapshot(&self, lv: &LvInfo) -> Option<Snapshot> {
        if !self.is_ours(lv)
            || lv.tag_value(TAG_KIND) != Some("snapshot")
            || self.is_half_made_snapshot(lv)
        {
            return None;
        }
        let key = VolumeKey::parse(lv.name.strip_prefix("sn-")?)?;
        Some(Snapshot {
            id: VolumeId {
                pool: self.name.clone(),
                key,
            }
            .to_string(),
            name: lvm::decode_tag_value(lv.tag_value(TAG_NAME)?)?,
            source_volume_id: lv.tag_value(TAG_SOURCE)?.to_owned(),
            size_bytes: lv.tag_value(TAG_SIZE)?.parse().ok()?,
            created_unix: lv.created_unix,
            ready: !is_invalid_cow(lv),
        })
    }

    /// What a thick pool's `lvcreate -s` killed mid-run can leave: lvm
    /// first commits the COW area as a plain LV (with the snapshot's tags),
    /// then makes it a snapshot of its origin. Such an LV is no snapshot
    /// (restoring it would restore its zeroed bytes); CreateSnapshot's retry
    /// and DeleteSnapshot remove it (it never held data). Seen in the VM:
    /// killed ~0.2 s into a 0.5 s `lvcreate -s`, lvm left `-wi-------`.
    pub(super) fn is_half_made_snapshot(&self, lv: &LvInfo) -> bool {
        matches!(self.provisioning, Provisioning::Thick(_))
            && self.is_ours(lv)
            && lv.tag_value(TAG_KIND) == Some("snapshot")
            && !lv.is_cow_snapshot()
    }

    pub(super) fn tags(&self, kind: &str, name: &str, access: AccessType) -> Vec<String> {
        let access = match access {
            AccessType::Block => "block",
            AccessType::Mount => "mount",
        };
        vec![
            TAG_OWNER.to_owned(),
            format!("{TAG_POOL}={}", self.name),
            format!("{TAG_KIND}={kind}"),
            format!("{TAG_NAME}={}", lvm::encode_tag_value(name)),
            format!("{TAG_ACCESS}={access}"),
        ]
    }

    /// Whether an existing LV is (or is becoming) the volume this create
    /// asks for: this pool's, for this name, from this source.
    pub(super) fn check_restore_of(
        &self,
        lv: &LvInfo,
        req: &CreateRequest,
        src_id: &str,
    ) -> Result<()> {
        if !self.is_ours(lv) || lv.tag_value(TAG_KIND) == Some("snapshot") {
            return Err(self.not_ours(&lv.name));
        }
        let name = lv.tag_value(TAG_NAME).and_then(lvm::decode_tag_value);
        if name.as_deref() != Some(req.name.as_str()) {
            return Err(PoolError::Mismatch {
                name: req.name.as_str().to_owned(),
                why: format!(
                    "LV {} belongs to another name that hashes to the same id",
                    self.lv_path(&lv.name)
                ),
            });
        }
        if encryption_of(lv) != req.encryption {
            return Err(PoolError::Mismatch {
                name: req.name.as_str().to_owned(),
                why: "it was created with another encryption".to_owned(),
            });
        }
        if lv.tag_value(TAG_SOURCE) != Some(src_id) {
            return Err(PoolError::Mismatch {
                name: req.name.as_str().to_owned(),
                why: "it has other content".to_owned(),
            });
        }
        Ok(())
    }

    /// The volume a complete restore or clone is, if it answers `req`.
    pub(super) fn restored_volume(&self, lv: &LvInfo, req: &CreateRequest) -> Result<Volume> {
        let vol = self.to_volume(lv).ok_or_else(|| self.not_ours(&lv.name))?;
        crate::pool::matches_request(vol, req, false)
    }
}
