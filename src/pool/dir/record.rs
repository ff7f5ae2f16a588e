//! A dir pool volume's record in its three forms, and every conversion
//! between them: [`DirRecord`], the JSON file `<key>.json` on disk (the
//! format older versions wrote and read: its field names, order and
//! omissions are the format); [`Entry`], the same record in the pool's
//! index, less what its key and pool already say; and the [`Volume`] the
//! services see.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::super::{AccessType, CreateRequest, Volume};
use crate::ids::{PoolName, VolumeId, VolumeKey, VolumeName};

/// The version a new record is written with.
const RECORD_VERSION: u32 = 1;

/// A volume's record file. Its strings are kept as they are on disk, so a
/// record that is not this pool's (or not this key's) still reads, and is
/// told apart from an unreadable one ([`DirRecord::entry`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DirRecord {
    pub version: u32,
    /// `<pool>.<key>`.
    pub id: String,
    pub name: String,
    pub pool: String,
    pub size_bytes: u64,
    pub access_type: AccessType,
    pub created_unix: u64,
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// Project quota id enforcing the size (pools with quotas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<u32>,
    /// Inode hard limit, when one was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inode_limit: Option<u64>,
    /// Never set by a dir pool; read and written back as it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grow_filesystem: bool,
}

/// Why a record read from disk is not one of the pool's volumes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NotThisPools {
    /// Another pool's, or another key's (a file renamed or copied by hand).
    OtherPoolOrId,
    /// Its name is no volume name the driver takes.
    BadName(String),
}

/// A record in the index: a [`DirRecord`] less its id and pool (its key
/// and the pool say them), its name checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub name: VolumeName,
    pub size_bytes: u64,
    pub created_unix: u64,
    pub version: u32,
    pub access_type: AccessType,
    pub grow_filesystem: bool,
    pub project_id: Option<u32>,
    pub inode_limit: Option<u64>,
    pub parameters: BTreeMap<String, String>,
}

impl DirRecord {
    /// The index entry of a record read from `<key>.json` of `pool`.
    pub fn entry(self, pool: &PoolName, key: &VolumeKey) -> Result<Entry, NotThisPools> {
        let ours = self.pool == pool.as_str()
            && self
                .id
                .strip_prefix(pool.as_str())
                .and_then(|r| r.strip_prefix('.'))
                == Some(key.as_str());
        if !ours {
            return Err(NotThisPools::OtherPoolOrId);
        }
        let name = VolumeName::parse(&self.name).map_err(|e| NotThisPools::BadName(e.0))?;
        Ok(Entry {
            name,
            size_bytes: self.size_bytes,
            created_unix: self.created_unix,
            version: self.version,
            access_type: self.access_type,
            grow_filesystem: self.grow_filesystem,
            project_id: self.project_id,
            inode_limit: self.inode_limit,
            parameters: self.parameters,
        })
    }
}

impl Entry {
    /// The entry of a volume a create is making, written now.
    pub fn new(req: &CreateRequest, size: u64, project_id: Option<u32>, now: u64) -> Entry {
        Entry {
            name: req.name.clone(),
            size_bytes: size,
            created_unix: now,
            version: RECORD_VERSION,
            access_type: req.access_type,
            grow_filesystem: false,
            project_id,
            inode_limit: req.inode_limit,
            parameters: req.parameters.clone(),
        }
    }

    /// Its record file's content, as the volume `id` of the pool.
    pub fn record(&self, id: &VolumeId) -> DirRecord {
        DirRecord {
            version: self.version,
            id: id.to_string(),
            name: self.name.as_str().to_owned(),
            pool: id.pool.to_string(),
            size_bytes: self.size_bytes,
            access_type: self.access_type,
            created_unix: self.created_unix,
            parameters: self.parameters.clone(),
            project_id: self.project_id,
            inode_limit: self.inode_limit,
            grow_filesystem: self.grow_filesystem,
        }
    }

    /// The volume `id` as the services see it.
    pub fn volume(&self, id: VolumeId) -> Volume {
        Volume {
            id,
            name: self.name.clone(),
            size_bytes: self.size_bytes,
            access_type: self.access_type,
            created_unix: self.created_unix,
            parameters: self.parameters.clone(),
            project_id: self.project_id,
            inode_limit: self.inode_limit,
            grow_filesystem: self.grow_filesystem,
            unformatted: false,
            inactive: false,
            // Dir pools refuse encryption and IO limits at create.
            encryption: None,
            io_limits: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef0123456789abcdef";

    /// A record as the driver writes it today (and has since its first
    /// version): `serde_json::to_vec_pretty`, camelCase, what is unset left
    /// out.
    const TODAY: &str = r#"{
  "version": 1,
  "id": "fast.0123456789abcdef0123456789abcdef",
  "name": "pvc-0b0e4e2e",
  "pool": "fast",
  "sizeBytes": 1073741824,
  "accessType": "mount",
  "createdUnix": 1764000000,
  "parameters": {
    "csi.storage.k8s.io/pvc/name": "data"
  },
  "projectId": 1000042,
  "inodeLimit": 5000
}"#;

    fn pool() -> PoolName {
        PoolName::parse("fast").unwrap()
    }

    fn key() -> VolumeKey {
        VolumeKey::parse(KEY).unwrap()
    }

    #[test]
    fn a_record_in_todays_format_loads_and_is_written_back_byte_for_byte() {
        let rec: DirRecord = serde_json::from_str(TODAY).unwrap();
        let entry = rec.clone().entry(&pool(), &key()).unwrap();
        assert_eq!(entry.name.as_str(), "pvc-0b0e4e2e");
        assert_eq!(
            (entry.size_bytes, entry.project_id, entry.inode_limit),
            (1 << 30, Some(1000042), Some(5000))
        );
        let id = VolumeId {
            pool: pool(),
            key: key(),
        };
        assert_eq!(entry.record(&id), rec);
        let written = serde_json::to_vec_pretty(&entry.record(&id)).unwrap();
        assert_eq!(std::str::from_utf8(&written).unwrap(), TODAY);
        let vol = entry.volume(id.clone());
        assert_eq!((vol.id, vol.name.as_str()), (id, "pvc-0b0e4e2e"));
        assert_eq!(vol.access_type, AccessType::Mount);
        assert_eq!(vol.parameters["csi.storage.k8s.io/pvc/name"], "data");
    }

    #[test]
    fn older_and_fuller_records_load() {
        // No `parameters` (the earliest records), and the fields the shared
        // volume record could carry that a dir pool never sets: ignored, as
        // the index always dropped them.
        let old = r#"{"version":1,"id":"fast.0123456789abcdef0123456789abcdef","name":"a",
            "pool":"fast","sizeBytes":4096,"accessType":"mount","createdUnix":0,
            "growFilesystem":true,"unformatted":true,"encryption":"luks2",
            "ioLimits":{"readIops":5}}"#;
        let entry = serde_json::from_str::<DirRecord>(old)
            .unwrap()
            .entry(&pool(), &key())
            .unwrap();
        assert!(entry.parameters.is_empty() && entry.grow_filesystem);
        assert_eq!((entry.project_id, entry.inode_limit), (None, None));
    }

    #[test]
    fn another_pools_or_keys_record_is_not_an_entry() {
        let rec: DirRecord = serde_json::from_str(TODAY).unwrap();
        let other = PoolName::parse("slow").unwrap();
        assert_eq!(
            rec.clone().entry(&other, &key()),
            Err(NotThisPools::OtherPoolOrId)
        );
        let wrong = VolumeKey::parse(&"f".repeat(32)).unwrap();
        assert_eq!(
            rec.clone().entry(&pool(), &wrong),
            Err(NotThisPools::OtherPoolOrId)
        );
        let mut unnamed = rec;
        unnamed.name.clear();
        assert!(matches!(
            unnamed.entry(&pool(), &key()),
            Err(NotThisPools::BadName(_))
        ));
    }
}
