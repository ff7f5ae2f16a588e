//! Directory volumes with enforced sizes: project quotas on XFS and ext4.
//!
//! Each test formats a fresh filesystem on a loop device over a sparse image
//! in the driver's temp dir and mounts it over the pool directory before the
//! driver starts (`quota: required`). Nearly all of them need a kernel with
//! project quotas (`CONFIG_XFS_QUOTA`, `CONFIG_QFMT_V2`), which the CI
//! machines' own kernel lacks: they are `#[ignore]`d here and run by
//! `make test-vm` inside the VM (`vm/run`, Debian's kernel) with
//! `--include-ignored`. Every such test runs its body on XFS and on ext4.
//!
//! Data is written the way a pod writes it: from a thread without
//! CAP_SYS_RESOURCE. With it, ext4 lets a process exceed quota limits (XFS
//! does not), and the node test process runs as root.

use std::future::Future;
use std::io::{self, Write};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use futures::FutureExt;
use localvol::csi;
use localvol::quota::{ProjectQuota, Quotas};
use sanity_tests::*;
use tonic::Code;

const POOL: &str = "q";
/// Large enough for XFS (mkfs.xfs refuses filesystems under 300 MiB); sparse
/// on the guest's tmpfs, so only what is written costs memory.
const IMAGE_BYTES: u64 = 512 << 20;
/// How far a project's usage may be from the bytes written into it: the
/// directory's own blocks (measured: 0 on XFS, one 4 KiB block on ext4).
const USED_SLACK: u64 = 64 << 10;
/// Writes go in chunks of this size.
const CHUNK: usize = 64 << 10;
/// What a write or create past a project quota limit fails with: ext4 says
/// EDQUOT ("Disk quota exceeded"); XFS says ENOSPC for project quotas (its
/// directory-tree quotas look like a full disk, `xfs_trans_dqresv`).
fn over_quota_errno(kind: FsKind) -> i32 {
    match kind {
        FsKind::Xfs => nix::libc::ENOSPC,
        FsKind::Ext4 => nix::libc::EDQUOT,
    }
}

// ---------------------------------------------------------------------------
// Fixture
// ---------------------------------------------------------------------------

/// A driver whose pool directory is the root of a fresh loop-mounted filesystem.
struct QuotaPool {
    /// Dropped first: kills the driver, unmounts its binds and the pool
    /// filesystem, removes the temp dir (and with it the image).
    d: Driver,
    fs: LoopFs,
}

impl QuotaPool {
    /// `quota: required` on `kind` mounted with project quotas.
    async fn start(kind: FsKind, pool: PoolOpts) -> Self {
        let mut q = Self::prepare(kind, pool.quota("required"), "prjquota");
        q.d.start_again().await;
        q
    }

    /// The driver's dirs and config with the filesystem mounted over the pool
    /// directory (`options` for mount -o); the driver is not started.
    fn prepare(kind: FsKind, pool: PoolOpts, options: &str) -> Self {
        require_root();
        let d = Driver::new(DriverOpts::with_pool(pool));
        let fs = LoopFs::create(
            kind,
            &d.dir().join("pool.img"),
            IMAGE_BYTES,
            &d.pool_dir(POOL),
            options,
        );
        QuotaPool { d, fs }
    }

    fn volumes_dir(&self) -> PathBuf {
        self.d.pool_dir(POOL).join("volumes")
    }

    /// The pool filesystem's quotas, read independently of the driver.
    fn quotas(&self) -> Quotas {
        Quotas::open(&self.volumes_dir())
            .unwrap_or_else(|e| panic!("{}: project quotas not on: {e}", self.fs.kind))
    }

    fn quota_of(&self, project: u32) -> ProjectQuota {
        self.quotas().get(project).unwrap()
    }

    /// The project id in the volume's JSON record (`<pool>/volumes/<key>.json`).
    fn project_of(&self, volume_id: &str) -> u32 {
        let key = volume_id.rsplit_once('.').unwrap().1;
        let path = self.volumes_dir().join(format!("{key}.json"));
        let text = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {path:?}: {e}"));
        let rec: serde_json::Value = serde_json::from_slice(&text).unwrap();
        let id = rec["projectId"]
            .as_u64()
            .unwrap_or_else(|| panic!("no projectId in {path:?}: {rec}"));
        u32::try_from(id).unwrap()
    }

    /// Creates a volume of `bytes` with StorageClass `parameters`.
    async fn create_with(&self, name: &str, bytes: i64, parameters: &[(&str, &str)]) -> String {
        let r = ok(
            &format!("CreateVolume {name}"),
            self.d
                .controller()
                .create_volume(csi::CreateVolumeRequest {
                    capacity_range: Some(range(bytes, 0)),
                    parameters: params(parameters),
                    ..create_req(name)
                })
                .await,
        );
        r.volume.unwrap().volume_id
    }

    /// Creates, stages and publishes a volume; returns (id, staging, target).
    async fn published(
        &self,
        name: &str,
        bytes: i64,
        parameters: &[(&str, &str)],
    ) -> (String, PathBuf, PathBuf) {
        let id = self.create_with(name, bytes, parameters).await;
        let staging = self.d.staging_path(name);
        let target = self.d.target_path(name);
        self.d.stage(&id, &staging).await;
        self.d.publish(&id, &staging, &target, false).await;
        (id, staging, target)
    }

    /// NodeGetVolumeStats: (bytes, inodes) usage entries.
    async fn stats(&self, id: &str, path: &Path) -> (csi::VolumeUsage, csi::VolumeUsage) {
        let r = ok(
            "NodeGetVolumeStats",
            self.d
                .node()
                .node_get_volume_stats(stats_req(id, path))
                .await,
        );
        let unit = |u: csi::volume_usage::Unit| {
            r.usage
                .iter()
                .find(|x| x.unit == u as i32)
                .cloned()
                .unwrap_or_else(|| panic!("no {u:?} entry in {r:?}"))
        };
        let cond = r.volume_condition.clone().unwrap();
        assert!(!cond.abnormal, "volume condition: {cond:?}");
        (
            unit(csi::volume_usage::Unit::Bytes),
            unit(csi::volume_usage::Unit::Inodes),
        )
    }

    async fn controller_expand(&self, id: &str, bytes: i64) -> csi::ControllerExpandVolumeResponse {
        ok(
            "ControllerExpandVolume",
            self.d
                .controller()
                .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                    volume_id: id.to_owned(),
                    capacity_range: Some(range(bytes, 0)),
                    volume_capability: Some(mount_cap(AccessMode::SingleNodeWriter)),
                    ..Default::default()
                })
                .await,
        )
    }

    /// Unpublishes, unstages and deletes.
    async fn remove(&self, id: &str, staging: &Path, target: &Path) {
        self.d.unpublish(id, target).await;
        self.d.unstage(id, staging).await;
        self.d.delete(id).await;
    }
}

/// Runs `test` on XFS and on ext4 (both, even when the first fails), then
/// fails naming the filesystems it failed on.
async fn on_each_fs<F, Fut>(test: F)
where
    F: Fn(FsKind) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut failed = Vec::new();
    for kind in FsKind::ALL {
        eprintln!("--- on {kind} ---");
        if AssertUnwindSafe(test(kind)).catch_unwind().await.is_err() {
            failed.push(kind.name());
        }
    }
    assert!(failed.is_empty(), "failed on {failed:?} (see above)");
}

// ---------------------------------------------------------------------------
// Writing like a pod
// ---------------------------------------------------------------------------

/// Runs `f` on a new thread whose capabilities lack CAP_SYS_RESOURCE (bounding
/// set untouched; capabilities are per thread, so the rest of the test process
/// keeps them).
fn as_pod<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        drop_cap_sys_resource();
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

fn drop_cap_sys_resource() {
    use nix::libc;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    const CAP_SYS_RESOURCE: u32 = 24;
    let get = || {
        let mut h = Header {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let mut d = [Data::default(); 2];
        // SAFETY: a v3 header and two data structs, as capget(2) expects.
        let r = unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) };
        assert_eq!(r, 0, "capget: {}", io::Error::last_os_error());
        d
    };
    let mut d = get();
    d[0].effective &= !(1 << CAP_SYS_RESOURCE);
    d[0].permitted &= !(1 << CAP_SYS_RESOURCE);
    d[0].inheritable &= !(1 << CAP_SYS_RESOURCE);
    let mut h = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: as above; pid 0 is the calling thread.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) };
    assert_eq!(r, 0, "capset: {}", io::Error::last_os_error());
    assert_eq!(get()[0].effective & (1 << CAP_SYS_RESOURCE), 0);
}

/// What a write attempt achieved.
#[derive(Debug)]
struct Filled {
    /// Bytes the kernel accepted.
    written: u64,
    /// The error that stopped it (from write or from fsync), if any.
    error: Option<io::Error>,
}

impl Filled {
    #[track_caller]
    fn assert_ok(&self, what: &str) {
        assert!(self.error.is_none(), "{what}: {self:?}");
    }

    /// Stopped by the quota (EDQUOT, or ENOSPC on XFS).
    #[track_caller]
    fn assert_over_quota(&self, kind: FsKind, what: &str) {
        let code = self.error.as_ref().and_then(io::Error::raw_os_error);
        let want = over_quota_errno(kind);
        assert_eq!(
            code,
            Some(want),
            "{kind}: {what}: expected {}, got {self:?}",
            io::Error::from_raw_os_error(want)
        );
    }
}

/// Appends up to `bytes` to `dir/name` (as a pod) and fsyncs it; stops at the
/// first error.
fn fill(dir: &Path, name: &str, bytes: u64) -> Filled {
    let path = dir.join(name);
    as_pod(move || {
        let mut f = match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                return Filled {
                    written: 0,
                    error: Some(e),
                }
            }
        };
        let chunk = vec![0x5au8; CHUNK];
        let mut written = 0u64;
        let mut error = None;
        while written < bytes {
            let n = (bytes - written).min(CHUNK as u64) as usize;
            match f.write(&chunk[..n]) {
                Ok(0) => break,
                Ok(k) => written += k as u64,
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        if let Err(e) = f.sync_all() {
            error.get_or_insert(e);
        }
        Filled { written, error }
    })
}

/// Creates empty files `prefix0`, `prefix1`, ... (as a pod) until `max` exist
/// or one fails; returns how many were created and the error.
fn create_files(dir: &Path, prefix: &str, max: usize) -> (usize, Option<io::Error>) {
    let (dir, prefix) = (dir.to_path_buf(), prefix.to_owned());
    as_pod(move || {
        for i in 0..max {
            if let Err(e) = std::fs::File::create(dir.join(format!("{prefix}{i}"))) {
                return (i, Some(e));
            }
        }
        (max, None)
    })
}

fn sync_fs(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    nix::unistd::syncfs(&f).unwrap();
}

#[track_caller]
fn assert_near(what: &str, got: u64, want: u64, tolerance: u64) {
    eprintln!(
        "{what}: {got} (want {want}, off by {})",
        got as i128 - want as i128
    );
    assert!(
        got.abs_diff(want) <= tolerance,
        "{what}: got {got}, want {want} ± {tolerance} (off by {})",
        got as i128 - want as i128
    );
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap()
}

/// Polls the project's quota until `done` holds (XFS frees the blocks and
/// inodes of removed files in a background worker, shortly after the unlink);
/// returns the last reading.
async fn quota_when(
    q: &QuotaPool,
    project: u32,
    done: impl Fn(&ProjectQuota) -> bool,
) -> ProjectQuota {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = q.quota_of(project);
        if done(&now) || std::time::Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------
// 1. Writes stop at the volume's size
// ---------------------------------------------------------------------------

#[tokio::test]
#[ignore = "needs project quotas: run by make test-vm in the VM"]
async fn write_past_the_size_fails() {
    on_each_fs(|kind| async move {
        let q = QuotaPool::start(kind, PoolOpts::new(POOL)).await;
        let (id, _, target) = q.published("full", 16 * MI, &[]).await;

        fill(&target, "first", 10 << 20).assert_ok("10 MiB into a 16 MiB volume");
        let more = fill(&target, "second", 32 << 20);
        more.assert_over_quota(kind, "writing past 16 MiB");
        let total = (10 << 20) + more.written;
        assert!(
            ((15 << 20)..=(16 << 20)).contains(&total),
            "{kind}: {total} bytes fit in a 16 MiB volume"
        );

        let (bytes, inodes) = q.stats(&id, &target).await;
        assert_eq!(u(bytes.total), 16 << 20, "{bytes:?}");
        // The data, plus the directory's own blocks.
        assert_near("used bytes", u(bytes.used), total, USED_SLACK);
        assert_eq!(bytes.available, bytes.total - bytes.used, "{bytes:?}");
        // The volume directory and the two files.
        assert_eq!(inodes.used, 3, "{inodes:?}");
        assert!(inodes.total > inodes.used, "{inodes:?}");
        assert_eq!(inodes.available, inodes.total - inodes.used, "{inodes:?}");

        // The data written before the limit is intact.
        let first = std::fs::read(target.join("first")).unwrap();
        assert!(first.len() == 10 << 20 && first.iter().all(|b| *b == 0x5a));
    })
    .await;
}

/// A CSI ephemeral inline volume (issue 14, item 4) on a quota-enforced
/// pool is size-limited like a persistent one: a pod writing past its
/// `size` attribute gets EDQUOT (ENOSPC on XFS); unpublish removes it and
/// gives its project id back.
#[tokio::test]
#[ignore = "needs project quotas: run by make test-vm in the VM"]
async fn ephemeral_volume_write_past_the_size_fails() {
    on_each_fs(|kind| async move {
        let q = QuotaPool::start(kind, PoolOpts::new(POOL)).await;
        let handle = ephemeral_handle(7);
        let target = q.d.target_path("scratch");
        let req = ephemeral_publish_req(&handle, &target, &[("size", "8Mi"), ("pool", POOL)]);
        ok("publish", q.d.node().node_publish_volume(req).await);
        let more = fill(&target, "data", 16 << 20);
        more.assert_over_quota(kind, "writing past 8 MiB");
        assert!(
            ((7 << 20)..=(8 << 20)).contains(&more.written),
            "{kind}: {} bytes fit in an 8 MiB ephemeral volume",
            more.written
        );
        ok(
            "unpublish",
            q.d.node()
                .node_unpublish_volume(unpublish_req(&handle, &target))
                .await,
        );
        assert!(!target.exists());
        let left: Vec<_> = std::fs::read_dir(q.volumes_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{kind}: left in the pool: {left:?}");
    })
    .await;
}

// ---------------------------------------------------------------------------
// 2. Online expansion
// ---------------------------------------------------------------------------

#[tokio::test]
#[ignore = "needs project quotas: run by make test-vm in the VM"]
async fn expansion_while_published_raises_the_limit() {
    on_each_fs(|kind| async move {
        let q = QuotaPool::start(kind, PoolOpts::new(POOL)).await;
        let (id, staging, target) = q.published("grow", 16 * MI, &[]).await;
        let project = q.project_of(&id);
        fill(&target, "a", 10 << 20).assert_ok("10 MiB into 16 MiB");
        fill(&target, "b", 10 << 20).assert_over_quota(kind, "20 MiB into 16 MiB");

        let r = q.controller_expand(&id, 48 * MI).await;
        assert_eq!(r.capacity_bytes, 48 * MI, "{r:?}");
        assert!(!r.node_expansion_required, "{r:?}");
        assert_eq!(q.quota_of(project).block_limit_bytes, 48 << 20);
        // Same published path, no remount.
        fill(&target, "c", 20 << 20).assert_ok("20 MiB more after growing to 48 MiB");
        let (bytes, _) = q.stats(&id, &target).await;
        assert_eq!(u(bytes.total), 48 << 20, "{bytes:?}");

        // NodeExpandVolume with a larger range applies it on the node.
        let r = ok(
            "NodeExpandVolume to 64Mi",
            q.d.node()
                .node_expand_volume(csi::NodeExpandVolumeRequest {
                    volume_id: id.clone(),
                    volume_path: path_str(&target),
                    staging_target_path: path_str(&staging),
                    capacity_range: Some(range(64 * MI, 0)),
                    volume_capability: Some(mount_cap(AccessMode::SingleNodeWriter)),
                    ..Default::default()
                })
                .await,
        );
        assert_eq!(r.capacity_bytes, 64 * MI, "{r:?}");
        assert_eq!(q.quota_of(project).block_limit_bytes, 64 << 20);
        let (bytes, _) = q.stats(&id, &target).await;
        assert_eq!(u(bytes.total), 64 << 20, "{bytes:?}");
        let listed = q.d.list_all().await;
        assert_eq!(listed[0].capacity_bytes, 64 * MI);

        let used = u(bytes.used);
        let last = fill(&target, "d", 64 << 20);
        last.assert_over_quota(kind, "writing past 64 MiB");
        assert!(
            ((63 << 20)..=(64 << 20)).contains(&(used + last.written)),
            "{kind}: {used} + {} bytes in a 64 MiB volume",
            last.written
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// 3. Restarts
// ---------------------------------------------------------------------------

#[tokio::test]
#[ignore = "needs project quotas: run by make test-vm in the VM"]
async fn limits_persist_across_restarts() {
    on_each_fs(|kind| async move {
        let mut q = QuotaPool::start(kind, PoolOpts::new(POOL)).await;
        let (id, _, target) = q.published("keep", 16 * MI, &[]).await;
        let project = q.project_of(&id);
        fill(&target, "a", 8 << 20).assert_ok("8 MiB into 16 MiB");
        q.controller_expand(&id, 24 * MI).await;

        q.d.restart().await;
        let (bytes, _) = q.stats(&id, &target).await;
        assert_eq!(u(bytes.total), 24 << 20, "{bytes:?}");
        assert_near("used bytes", u(bytes.used), 8 << 20, USED_SLACK);
        assert_eq!(q.quota_of(project).block_limit_bytes, 24 << 20);

        // A limit changed behind the driver's back is put back at start.
        let stopped = q.d.stop().await;
        assert!(stopped.success(), "{stopped}");
        q.quotas().set_limits(project, 0, 0).unwrap();
        assert_eq!(q.quota_of(project).block_limit_bytes, 0);
        q.d.start_again().await;
        assert_eq!(q.quota_of(project).block_limit_bytes, 24 << 20);

        let more = fill(&target, "b", 32 << 20);
        more.assert_over_quota(kind, "writing past 24 MiB after restarts");
        let total = (8 << 20) + more.written;
        assert!(
            ((23 << 20)..=(24 << 20)).contains(&total),
            "{kind}: {total} bytes in a 24 MiB volume"
        );
        let (bytes, _) = q.stats(&id, &target).await;
        assert_eq!(u(bytes.total), 24 << 20, "{bytes:?}");
        assert_near("used bytes", u(bytes.used), total, USED_SLACK);
    })
    .await;
}

// ---------------------------------------------------------------------------
// 4. Delete releases the project id
// ---------------------------------------------------------------------------

#[tokio::test]
#[ignore = "needs project quotas: run by make test-vm in the VM"]
async fn delete_releases_the_project_id() {
    on_each_fs(|kind| async move {
        let q = QuotaPool::start(kind, PoolOpts::new(POOL)).await;
        let (id, staging, target) = q.published("gone", 16 * MI, &[("inodeLimit", "50")]).await;
        let project = q.project_of(&id);
        fill(&target, "a", 4 << 20).assert_ok("4 MiB");
        let (n, err) = create_files(&target, "f", 5);
        assert!(n == 5 && err.is_none(), "{n} files: {err:?}");
        let before = q.quota_of(project);
        assert_eq!(before.block_limit_bytes, 16 << 20, "{before:?}");
        assert_eq!(before.inode_limit, 50, "{before:?}");
        assert!(before.used_bytes >= 4 << 20, "{before:?}");

        q.remove(&id, &staging, &target).await;
        let after = quota_when(&q, project, |p| *p == ProjectQuota::default()).await;
        assert_eq!(
            after,
            ProjectQuota::default(),
            "{kind}: project {project} still has limits or usage after delete"
        );

        // The pool is usable, and the same name gets the released id back.
        let (id2, staging2, target2) = q.published("gone", 16 * MI, &[]).await;
        assert_eq!(q.project_of(&id2), project);
        fill(&target2, "a", 1 << 20).assert_ok("1 MiB into the new volume");
        let other = q.create_with("other", 8 * MI, &[]).await;
        assert_ne!(q.project_of(&other), project);
        assert_eq!(q.quota_of(q.project_of(&other)).block_limit_bytes, 8 << 20);
        q.remove(&id2, &staging2, &target2).await;
        let after = quota_when(&q, project, |p| *p == ProjectQuota::default()).await;
        assert_eq!(
            after,
            ProjectQuota::default(),
            "{kind}: after the second delete"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// 5. inodeLimit
// ---------------------------------------------------------------------------

#[tokio::test]
#[ignore = "needs project quotas: run by make test-vm in the VM"]
async fn inode_limit_caps_the_number_of_files() {
    on_each_fs(|kind| async move {
        let q = QuotaPool::start(kind, PoolOpts::new(POOL)).await;
        let (id, _, target) = q.published("files", 16 * MI, &[("inodeLimit", "10")]).await;
        assert_eq!(q.quota_of(q.project_of(&id)).inode_limit, 10);

        let (created, err) = create_files(&target, "f", 30);
        let code = err.as_ref().and_then(io::Error::raw_os_error);
        assert_eq!(
            code,
            Some(over_quota_errno(kind)),
            "{kind}: creating file {created} of 30: {err:?}"
        );
        // The volume directory counts as one of the 10.
        assert_eq!(created, 9, "{kind}: files created before the limit");

        let (bytes, inodes) = q.stats(&id, &target).await;
        assert_eq!(u(bytes.total), 16 << 20, "{bytes:?}");
        assert_eq!(inodes.total, 10, "{inodes:?}");
        assert_eq!(inodes.used, 10, "{inodes:?}");
        assert_eq!(inodes.available, 0, "{inodes:?}");

        // A directory is an inode too; removing a file frees one.
        std::fs::remove_file(target.join("f0")).unwrap();
        let project = q.project_of(&id);
        let freed = quota_when(&q, project, |p| p.used_inodes == 9).await;
        assert_eq!(freed.used_inodes, 9, "{kind}: {freed:?}");
        as_pod({
            let t = target.clone();
            move || std::fs::create_dir(t.join("d"))
        })
        .unwrap();
        let e = as_pod({
            let t = target.clone();
            move || std::fs::create_dir(t.join("d2"))
        })
        .unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(over_quota_errno(kind)),
            "{kind}: {e}"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// 6. GetCapacity never overcommits
// ---------------------------------------------------------------------------

/// The pool filesystem's free space (statvfs f_bavail) and the unused part of
/// every volume's quota: the pool offers the first less the second, less the
/// reserve.
fn free_and_unused(q: &QuotaPool, volumes: &[(&str, i64)]) -> (u64, u64) {
    sync_fs(&q.volumes_dir());
    let st = nix::sys::statvfs::statvfs(&q.volumes_dir()).unwrap();
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    let quotas = q.quotas();
    let unused: u64 = volumes
        .iter()
        .map(|(id, size)| {
            let used = quotas.get(q.project_of(id)).unwrap().used_bytes;
            u(*size).saturating_sub(used)
        })
        .sum();
    (free, unused)
}

#[tokio::test]
#[ignore = "needs project quotas: run by make test-vm in the VM"]
async fn capacity_is_free_space_less_unused_quota_and_reserve() {
    const RESERVE: u64 = 8 << 20;
    // A few blocks: free space moves a little as metadata is written (measured:
    // exact on both filesystems).
    const TOLERANCE: u64 = 64 << 10;
    on_each_fs(|kind| async move {
        let q = QuotaPool::start(kind, PoolOpts::new(POOL).reserve("8Mi")).await;
        let (a, _, target) = q.published("a", 64 * MI, &[]).await;
        let b = q.create_with("b", 32 * MI, &[]).await;
        fill(&target, "data", 20 << 20).assert_ok("20 MiB into a");
        let mut vols = vec![(a.as_str(), 64 * MI), (b.as_str(), 32 * MI)];

        let (free, unused) = free_and_unused(&q, &vols);
        let want = free - unused - RESERVE;
        let got = u(q.d.capacity(Some(POOL)).await.available_capacity);
        assert_near(
            &format!("{kind}: GetCapacity (fs free {free})"),
            got,
            want,
            TOLERANCE,
        );
        // Data written into a volume's quota does not change what is offered.
        fill(&target, "more", 10 << 20).assert_ok("10 MiB more into a");
        let again = u(q.d.capacity(Some(POOL)).await.available_capacity);
        assert_near(
            "GetCapacity after writing inside a quota",
            again,
            got,
            TOLERANCE,
        );

        // Slightly more than offered is refused; slightly less fits.
        let over = (again + (1 << 20)).next_multiple_of(4096);
        assert_code(
            "a volume larger than the capacity",
            q.d.controller()
                .create_volume(csi::CreateVolumeRequest {
                    capacity_range: Some(range(over as i64, 0)),
                    ..create_req("too-big")
                })
                .await,
            Code::ResourceExhausted,
        );
        let under = (again - (1 << 20)) / 4096 * 4096;
        let c = q.create_with("fits", under as i64, &[]).await;
        vols.push((c.as_str(), under as i64));

        // Never overcommitted: every quota can be filled, and the reserve stays.
        let (free, unused) = free_and_unused(&q, &vols);
        let left = u(q.d.capacity(Some(POOL)).await.available_capacity);
        assert!(left <= 2 << 20, "{kind}: {left} bytes still offered");
        assert_near(
            "GetCapacity after the big volume",
            left,
            free.saturating_sub(unused + RESERVE),
            TOLERANCE,
        );
        assert!(
            unused + RESERVE <= free,
            "{kind}: unused quota {unused} + reserve exceed the free space {free}"
        );
        assert_code(
            "a 2 MiB volume with ~1 MiB left",
            q.d.controller()
                .create_volume(csi::CreateVolumeRequest {
                    capacity_range: Some(range(2 * MI, 0)),
                    ..create_req("no-room")
                })
                .await,
            Code::ResourceExhausted,
        );
        // Expansion is held to the same account. Growth that does not fit
        // is OUT_OF_RANGE (Kubernetes then lets the user lower the request),
        // and the message says how far it could go.
        let e = assert_code(
            "growing b by 2 MiB",
            q.d.controller()
                .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                    volume_id: b.clone(),
                    capacity_range: Some(range(34 * MI, 0)),
                    ..Default::default()
                })
                .await,
            Code::OutOfRange,
        );
        assert!(e.message().contains("ask for at most"), "{e:?}");
    })
    .await;
}

// ---------------------------------------------------------------------------
// quota: required refuses filesystems that do not enforce project quotas
// ---------------------------------------------------------------------------

/// Starts a `quota: required` driver on `kind` mounted with `options`: the
/// pool must not open (the driver serves on, the pool unusable), and a new
/// volume in it is refused with an error that tells the operator to mount
/// with prjquota.
async fn assert_refuses(kind: FsKind, options: &str) {
    let mut q = QuotaPool::prepare(kind, PoolOpts::new(POOL).quota("required"), options);
    q.d.start_again().await;
    let mut req = create_req("refused");
    req.parameters = params(&[("pool", POOL)]);
    let s = must_fail(
        &format!("{kind} mounted with {options:?}: CreateVolume with quota: required"),
        q.d.controller().create_volume(req).await,
        Code::ResourceExhausted,
    );
    assert!(
        s.message().contains("quota: required") && s.message().contains("prjquota"),
        "{kind} mounted with {options:?}: the error does not name the missing mount option:\n{s:?}"
    );
    assert_eq!(q.d.capacity(Some(POOL)).await.available_capacity, 0);
    // Nothing was created on the filesystem besides the pool's own dirs.
    assert!(q.d.volume_dirs(POOL).is_empty());
}

/// Runs everywhere (the host's XFS has no quota support at all; the VM's has
/// it, but it is off without the mount option).
#[tokio::test]
async fn quota_required_refuses_xfs_without_prjquota() {
    assert_refuses(FsKind::Xfs, "").await;
}

/// Tracking without enforcement: ext4 with the quota feature but without
/// prjquota, and XFS with pqnoenforce, both answer quota queries.
#[tokio::test]
#[ignore = "needs project quotas: run by make test-vm in the VM"]
async fn quota_required_refuses_accounting_only_mounts() {
    assert_refuses(FsKind::Ext4, "").await;
    assert_refuses(FsKind::Xfs, "pqnoenforce").await;
}
