//! The pipeline's decisions from facts, and its executors against a fake
//! pool for the steps that need no mount (raw block, static directories,
//! refusals before anything is touched). Mounting and formatting paths run
//! in the sanity and VM suites.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use async_trait::async_trait;

use super::*;
use crate::crypt::Encryption;
use crate::ids::{PoolName, VolumeId, VolumeKey, VolumeName};

/// A pool that records what the pipeline asked of it.
struct FakePool {
    src: Source,
    encrypted: bool,
    stages_dirs: bool,
    calls: Mutex<Vec<&'static str>>,
}

impl FakePool {
    fn new(src: Source) -> Self {
        FakePool {
            src,
            encrypted: false,
            stages_dirs: true,
            calls: Mutex::new(Vec::new()),
        }
    }
    fn calls(&self) -> Vec<&'static str> {
        self.calls.lock().unwrap().clone()
    }
    fn called(&self, what: &'static str) {
        self.calls.lock().unwrap().push(what);
    }
}

#[async_trait]
impl NodeSide for FakePool {
    fn source(&self, _vol: &Volume) -> crate::pool::Result<Source> {
        Ok(self.src.clone())
    }
    fn stages_directories(&self) -> bool {
        self.stages_dirs
    }
    fn encrypted(&self, _vol: &Volume) -> crate::pool::Result<Option<Encrypted>> {
        Ok(self.encrypted.then(|| Encrypted {
            backing: "/dev/fake/lv".into(),
            mapping: "localvol-fake".into(),
        }))
    }
    async fn activate(&self, _vol: &Volume) -> crate::pool::Result<()> {
        self.called("activate");
        Ok(())
    }
    async fn filesystem_grown(&self, _vol: &Volume) -> crate::pool::Result<()> {
        self.called("filesystem_grown");
        Ok(())
    }
    async fn filesystem_made(&self, _vol: &Volume) -> crate::pool::Result<()> {
        self.called("filesystem_made");
        Ok(())
    }
}

fn volume(access: AccessType) -> Volume {
    Volume {
        id: VolumeId {
            pool: PoolName::parse("p").unwrap(),
            key: VolumeKey::parse("0123456789abcdef0123456789abcdef").unwrap(),
        },
        name: VolumeName::parse("v").unwrap(),
        size_bytes: 1 << 30,
        access_type: access,
        created_unix: 0,
        parameters: BTreeMap::new(),
        project_id: None,
        inode_limit: None,
        grow_filesystem: false,
        unformatted: false,
        inactive: false,
        encryption: None::<Encryption>,
        io_limits: Default::default(),
    }
}

fn dev() -> Source {
    Source::Device("/dev/fake/lv".into())
}

fn dir(p: &Path) -> Source {
    Source::Directory(p.into())
}

#[test]
fn stage_steps_follow_the_volume_kind() {
    let d = dir(Path::new("/x"));
    let mut v = volume(AccessType::Mount);
    assert_eq!(
        stage_steps(&v, &d, false, true, false),
        [Step::BindDirectory]
    );
    assert_eq!(
        stage_steps(&v, &d, false, false, false),
        [Step::CheckDirectory]
    );
    assert_eq!(
        stage_steps(&v, &dev(), false, true, false),
        [Step::Filesystem]
    );
    v.access_type = AccessType::Block;
    assert_eq!(
        stage_steps(&v, &dev(), false, true, false),
        [Step::CheckStagingPath]
    );
    // Activation, then the mapping, then the rest: the mapping needs the
    // LV, the filesystem needs the mapping.
    v.access_type = AccessType::Mount;
    assert_eq!(
        stage_steps(&v, &dev(), true, true, true),
        [Step::Activate, Step::OpenEncryption, Step::Filesystem]
    );
}

#[test]
fn filesystem_steps_mark_before_mount_and_grow_last() {
    use FsStep::*;
    assert_eq!(
        filesystem_steps(false, false, false),
        [Format { whole: false }, Mount]
    );
    // Never formatted: the whole device, marked made before anything can
    // write to it (a later stage must not format it again).
    assert_eq!(
        filesystem_steps(false, true, false),
        [Format { whole: true }, MarkFormatted, Mount]
    );
    // Restored into a larger volume: grown once mounted.
    assert_eq!(
        filesystem_steps(false, false, true),
        [Format { whole: false }, Mount, Grow]
    );
    // A retry finds it staged: nothing formatted or mounted again; a grow
    // that failed the first time is taken again, once.
    assert_eq!(filesystem_steps(true, false, false), []);
    assert_eq!(filesystem_steps(true, true, true), [Grow]);
}

#[test]
fn publish_reaches_the_device_the_source_or_the_staging_path() {
    let d = dir(Path::new("/x"));
    assert_eq!(
        publish_from(&dev(), AccessType::Block, true),
        PublishFrom::Device
    );
    assert_eq!(
        publish_from(&dev(), AccessType::Mount, true),
        PublishFrom::Staging
    );
    assert_eq!(
        publish_from(&d, AccessType::Mount, true),
        PublishFrom::Staging
    );
    assert_eq!(
        publish_from(&d, AccessType::Mount, false),
        PublishFrom::Source
    );
}

/// A kubelet directory and a staging path below it, as a request names it.
fn staging(root: &Path) -> RequestPath {
    let p = root.join("plugins/kubernetes.io/csi/staging/v");
    std::fs::create_dir_all(&p).unwrap();
    RequestPath::parse("staging_target_path", root, p.to_str().unwrap()).unwrap()
}

fn stage_req(root: &Path, key: Option<Key>) -> Stage {
    Stage {
        staging: staging(root),
        fs_type: None,
        format: Default::default(),
        mount: MountOptions::default(),
        key,
    }
}

#[tokio::test]
async fn a_raw_block_stage_activates_and_mounts_nothing() {
    let t = tempfile::tempdir().unwrap();
    let pool = FakePool::new(dev());
    let mut v = volume(AccessType::Block);
    v.inactive = true;
    stage(&pool, &v, stage_req(t.path(), None)).await.unwrap();
    assert_eq!(pool.calls(), ["activate"]);
    // Active, but its device has no node (an lvm killed before making it):
    // the pool is asked to make it usable all the same.
    v.inactive = false;
    stage(&pool, &v, stage_req(t.path(), None)).await.unwrap();
    assert_eq!(pool.calls(), ["activate", "activate"]);
    // Active with its device there: nothing asked of the pool at all.
    let device = t.path().join("device");
    std::fs::write(&device, b"").unwrap();
    let pool = FakePool::new(Source::Device(device));
    stage(&pool, &v, stage_req(t.path(), None)).await.unwrap();
    assert_eq!(pool.calls(), Vec::<&str>::new());
}

#[tokio::test]
async fn a_static_volume_is_checked_not_staged() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("disk");
    let mut pool = FakePool::new(dir(&src));
    pool.stages_dirs = false;
    let v = volume(AccessType::Mount);
    // Its directory gone: NOT_FOUND's error, nothing made.
    let e = stage(&pool, &v, stage_req(t.path(), None))
        .await
        .unwrap_err();
    assert!(
        matches!(e, StepError::Node(NodeError::VolumeDirMissing { .. })),
        "{e:?}"
    );
    assert!(!src.exists());
    std::fs::create_dir(&src).unwrap();
    stage(&pool, &v, stage_req(t.path(), None)).await.unwrap();
    // Checked only: the staging path holds nothing.
    let staged = t.path().join("plugins/kubernetes.io/csi/staging/v");
    assert_eq!(std::fs::read_dir(&staged).unwrap().count(), 0);
}

#[tokio::test]
async fn an_encrypted_volume_without_its_key_is_refused_before_anything() {
    let t = tempfile::tempdir().unwrap();
    let mut pool = FakePool::new(dev());
    pool.encrypted = true;
    let v = volume(AccessType::Mount);
    let e = stage(&pool, &v, stage_req(t.path(), None))
        .await
        .unwrap_err();
    assert!(matches!(e, StepError::KeyRequired { .. }), "{e:?}");
    assert_eq!(pool.calls(), Vec::<&str>::new());
}

#[tokio::test]
async fn publish_of_a_staged_kind_needs_its_staging_path() {
    let t = tempfile::tempdir().unwrap();
    let pool = FakePool::new(dir(t.path()));
    let target = t.path().join("pods/p/volumes/v");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let req = Publish {
        target: RequestPath::parse("target_path", t.path(), target.to_str().unwrap()).unwrap(),
        staging: None,
        read_only: false,
        mode: AccessMode::SingleNodeWriter,
        mount: MountOptions::default(),
    };
    let e = publish(&pool, &volume(AccessType::Mount), req)
        .await
        .unwrap_err();
    assert!(matches!(e, StepError::StagingRequired), "{e:?}");
    assert!(!target.exists(), "nothing made at the target");
}

#[tokio::test]
async fn a_path_that_does_not_exist_does_not_hold_the_volume() {
    let t = tempfile::tempdir().unwrap();
    let missing: PathBuf = t.path().join("pods/p/volumes/none");
    let place = RequestPath::place("volume_path", t.path(), missing.to_str().unwrap()).unwrap();
    let v = volume(AccessType::Mount);
    let e = volume_at_path(place, dir(t.path()), &v, "p.v", true)
        .await
        .err()
        .unwrap();
    assert!(matches!(e, StepError::NotAtPath(_)), "{e:?}");
}

#[tokio::test]
async fn a_path_outside_the_kubelet_dir_does_not_hold_the_volume() {
    let t = tempfile::tempdir().unwrap();
    let place = RequestPath::place("volume_path", &t.path().join("kubelet"), "/etc").unwrap();
    let e = volume_at_path(
        place,
        dir(t.path()),
        &volume(AccessType::Mount),
        "p.v",
        false,
    )
    .await
    .err()
    .unwrap();
    assert!(matches!(e, StepError::NotAtPath(_)), "{e:?}");
}
