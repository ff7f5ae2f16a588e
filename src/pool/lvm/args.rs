//! `lvcreate` arguments for new volumes, restores and clones (built by
//! [`lvm::lvcreate_args`], the one builder).

use super::provisioning::Provisioning;
use super::restore::Restore;
use super::tags::*;
use super::LvmPool;
use crate::lvm::{self, NewLv};
use crate::pool::{AccessType, CreateRequest};

impl LvmPool {
    /// A new, empty volume (tagged as `create_tags` says).
    pub(super) fn create_args(&self, req: &CreateRequest, size: u64) -> Vec<String> {
        let tags = self.create_tags(req);
        lvm::lvcreate_args(&self.vg, &lv_name(&req.id.key), &tags, self.new_lv(size))
    }

    /// The tags of a new, empty volume (`--addtag`). A mount volume carries
    /// `unformatted` until its first stage, which also marks an LV a
    /// cut-short `lvcreate` left (nothing is written to it before that stage
    /// erases it whole), so a successful `lvcreate` needs no second lvm run.
    /// A raw block volume, which no stage erases, carries `creating` until
    /// the driver has seen `lvcreate` finish.
    pub(super) fn create_tags(&self, req: &CreateRequest) -> Vec<String> {
        let mut tags = self.tags("volume", req.name.as_str(), req.access_type);
        tags.extend(encryption_tag(req.encryption));
        tags.extend(io_tag(&req.io_limits));
        tags.push(match req.access_type {
            AccessType::Mount => TAG_UNFORMATTED.to_owned(),
            AccessType::Block => TAG_CREATING.to_owned(),
        });
        tags
    }

    /// A thin or thick LV of `size` bytes, as this pool makes them.
    pub(super) fn new_lv(&self, size: u64) -> NewLv<'_> {
        self.provisioning.new_lv(size)
    }

    /// `lvcreate` arguments for a volume made from `src_lv`: a thin snapshot
    /// (thin pools) or a new LV for a block copy (thick pools), each tagged
    /// as unfinished.
    pub(super) fn create_from_args(&self, plan: &Restore) -> Vec<String> {
        let Restore {
            req,
            src_id,
            src_lv,
            src_size,
            size,
        } = *plan;
        let mut tags = self.tags("volume", req.name.as_str(), req.access_type);
        tags.extend(encryption_tag(req.encryption));
        tags.extend(io_tag(&req.io_limits));
        tags.push(format!("{TAG_SOURCE}={src_id}"));
        if size > src_size {
            tags.push(TAG_GROW.to_owned());
        }
        let what = match &self.provisioning {
            Provisioning::Thin(_) => {
                tags.push(TAG_CREATING.to_owned());
                NewLv::ThinVolumeOf {
                    origin: &src_lv.name,
                }
            }
            Provisioning::Thick(_) => {
                tags.push(TAG_RESTORING.to_owned());
                self.new_lv(size)
            }
        };
        lvm::lvcreate_args(&self.vg, &lv_name(&req.id.key), &tags, what)
    }
}
