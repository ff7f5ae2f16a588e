//! Dir pools on a temporary directory: records, capacity, pages, expansion,
//! retired records, interrupted creates, quota modes without quota support.

use super::index::Index;
use super::records::is_retired_record;
use super::*;
use crate::ids::VolumeName;
use crate::size::ByteSize;
use std::os::unix::fs::PermissionsExt;

fn cfg(path: &Path, quota: QuotaMode) -> DirPoolConfig {
    DirPoolConfig {
        name: PoolName::parse("p").unwrap(),
        path: path.to_path_buf(),
        reserve: ByteSize(0),
        capacity: Some(ByteSize(100 << 20)),
        default_size: Some(ByteSize(8 << 20)),
        quota,
        device: None,
        require_mount_point: None,
    }
}

fn req(name: &str, required: u64) -> CreateRequest {
    let name = VolumeName::parse(name).unwrap();
    CreateRequest {
        source: None,
        id: VolumeId::new(PoolName::parse("p").unwrap(), &name),
        name,
        range: CapacityRange { required, limit: 0 },
        access_type: AccessType::Mount,
        inode_limit: None,
        parameters: Default::default(),
        encryption: None,
        io_limits: Default::default(),
    }
}

#[tokio::test]
async fn its_stand_in_answers_as_it_does() {
    // What a request is checked against before the pool opens, and by
    // `localvol config check --storage-class`. Whether `quota: auto` takes
    // inode limits depends on the filesystem, known once the pool opens.
    let d = tempfile::tempdir().unwrap();
    for quota in [QuotaMode::Off, QuotaMode::Auto] {
        let c = cfg(d.path(), quota);
        let pool = DirPool::open(c.clone()).await.unwrap();
        let cfg = crate::config::PoolConfig::Dir(c);
        crate::pool::refused::assert_answers_as_opened(&cfg, &pool, quota == QuotaMode::Off);
    }
}

#[tokio::test]
async fn storage_id_is_written_once_and_kept_across_opens() {
    let d = tempfile::tempdir().unwrap();
    // A temp file of a first write a crash cut short.
    let stale = d.path().join(format!(".{POOL_ID_FILE}.tmp.1.0"));
    fs::write(&stale, b"partial").unwrap();
    let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    let id = pool.storage_id().unwrap().clone();
    let file = fs::read_to_string(d.path().join(POOL_ID_FILE)).unwrap();
    assert_eq!(id.as_str(), format!("dir:{}", file.trim()));
    assert_eq!(file.trim().len(), 32);
    assert!(!stale.exists(), "the stale temp file is removed");
    drop(pool);
    let again = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    assert_eq!(again.storage_id(), Some(&id));
    // Another pool directory, another identity.
    let other = tempfile::tempdir().unwrap();
    let o = DirPool::open(cfg(other.path(), QuotaMode::Off))
        .await
        .unwrap();
    assert_ne!(o.storage_id(), Some(&id));
    // A file that holds no id stops the pool instead of being replaced.
    fs::write(other.path().join(POOL_ID_FILE), b"../x\n").unwrap();
    drop(o);
    assert!(matches!(
        DirPool::open(cfg(other.path(), QuotaMode::Off)).await,
        Err(PoolError::Misconfigured { .. })
    ));
}

#[tokio::test]
async fn create_is_idempotent_and_survives_reopen() {
    let d = tempfile::tempdir().unwrap();
    let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    let v = pool.create(&req("a", 10 << 20)).await.unwrap();
    assert_eq!(v.size_bytes, 10 << 20);
    assert_eq!(pool.create(&req("a", 10 << 20)).await.unwrap(), v);
    assert!(matches!(
        pool.create(&req("a", 20 << 20)).await,
        Err(PoolError::Mismatch { .. })
    ));
    let Source::Directory(dir) = pool.source(&v).unwrap() else {
        panic!("dir pools hand out directories")
    };
    assert!(dir.is_dir());
    drop(pool);
    let again = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    let id = VolumeId::new(
        PoolName::parse("p").unwrap(),
        &VolumeName::parse("a").unwrap(),
    );
    assert_eq!(again.get(&id).await.unwrap(), Some(v));
}

#[tokio::test]
async fn capacity_counts_allocations_and_refuses_overcommit() {
    let d = tempfile::tempdir().unwrap();
    let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    assert_eq!(pool.capacity().await.unwrap().available_bytes, 100 << 20);
    pool.create(&req("a", 60 << 20)).await.unwrap();
    assert_eq!(pool.capacity().await.unwrap().available_bytes, 40 << 20);
    assert!(matches!(
        pool.create(&req("b", 50 << 20)).await,
        Err(PoolError::NoSpace { .. })
    ));
    assert!(matches!(
        pool.create(&req("c", 200 << 20)).await,
        Err(PoolError::TooLarge { .. })
    ));
    // Nothing was left behind by the refused creates.
    assert_eq!(pool.list().await.unwrap().len(), 1);
    assert_eq!(fs::read_dir(d.path().join("volumes")).unwrap().count(), 2);
}

/// A page starts at its token (an id, or any string between ids) and
/// follows id order; tokens of pools whose ids sort before or after this
/// pool's give everything or nothing.
#[tokio::test]
async fn pages_follow_id_order_from_any_token() {
    let d = tempfile::tempdir().unwrap();
    let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    for i in 0..20 {
        pool.create(&req(&format!("v{i}"), 4096)).await.unwrap();
    }
    let mut ids: Vec<String> = pool
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.id.to_string())
        .collect();
    ids.sort();
    let page = |from: String, max: usize| {
        let pool = &pool;
        async move {
            let got: Vec<String> = pool
                .list_page(&from, max)
                .await
                .unwrap()
                .into_iter()
                .map(|v| v.id.to_string())
                .collect();
            got
        }
    };
    assert_eq!(page(String::new(), 100).await, ids);
    assert_eq!(page(String::new(), 5).await, ids[..5]);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(page(id.clone(), 3).await, ids[i..(i + 3).min(ids.len())]);
    }
    assert_eq!(page(format!("{}0", ids[4]), 2).await, ids[5..7]);
    for before in ["a.zzz", "o", "p-x.0", "p."] {
        assert_eq!(page(before.into(), 100).await, ids, "{before}");
    }
    for after in ["p/", "q", "p.g"] {
        assert!(page(after.into(), 100).await.is_empty(), "{after}");
    }
    // What the index gives back is what was created, parameters and all.
    let mut with_params = req("with-params", 8192);
    with_params
        .parameters
        .insert("csi.storage.k8s.io/pvc/name".into(), "data".into());
    let v = pool.create(&with_params).await.unwrap();
    assert_eq!(pool.get(&with_params.id).await.unwrap(), Some(v.clone()));
    assert!(pool.list_page(&v.id.to_string(), 1).await.unwrap() == [v.clone()]);
    pool.delete(&with_params.id).await.unwrap();
    // The index keeps the allocation as volumes come and go.
    assert_eq!(pool.state().volumes.allocated, 20 * 4096);
    pool.delete(&req("v3", 4096).id).await.unwrap();
    assert_eq!(pool.state().volumes.allocated, 19 * 4096);
}

#[tokio::test]
async fn expand_grows_refuses_shrink_and_is_persisted() {
    let d = tempfile::tempdir().unwrap();
    let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    let r = req("a", 10 << 20);
    pool.create(&r).await.unwrap();
    let grown = pool
        .expand(
            &r.id,
            CapacityRange {
                required: 30 << 20,
                limit: 0,
            },
        )
        .await
        .unwrap();
    assert_eq!(grown.size_bytes, 30 << 20);
    assert!(!grown.node_expansion_required);
    assert!(matches!(
        pool.expand(
            &r.id,
            CapacityRange {
                required: 5 << 20,
                limit: 6 << 20
            }
        )
        .await,
        Err(PoolError::SizeRefused(_))
    ));
    pool.create(&req("other", 50 << 20)).await.unwrap();
    assert!(matches!(
        pool.expand(
            &r.id,
            CapacityRange {
                required: 90 << 20,
                limit: 0
            }
        )
        .await,
        // The growth does not fit: the request may be lowered (the
        // message names the most it can be), unlike a new volume's NoSpace.
        Err(PoolError::NoRoomToGrow { size, bytes, .. }) if size == 30 << 20 && bytes == 90 << 20
    ));
    drop(pool);
    let again = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    assert_eq!(
        again.get(&r.id).await.unwrap().unwrap().size_bytes,
        30 << 20
    );
}

#[tokio::test]
async fn delete_removes_data_and_record_and_is_idempotent() {
    let d = tempfile::tempdir().unwrap();
    let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    let r = req("a", 1 << 20);
    let v = pool.create(&r).await.unwrap();
    let Source::Directory(dir) = pool.source(&v).unwrap() else {
        panic!("dir pools hand out directories")
    };
    fs::create_dir_all(dir.join("x/y")).unwrap();
    fs::write(dir.join("x/y/z"), b"data").unwrap();
    pool.delete(&r.id).await.unwrap();
    pool.delete(&r.id).await.unwrap();
    assert!(!dir.exists());
    assert_eq!(fs::read_dir(d.path().join("volumes")).unwrap().count(), 0);
    assert_eq!(pool.get(&r.id).await.unwrap(), None);
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn deleted_records_are_retired_reused_and_never_loaded() {
    let d = tempfile::tempdir().unwrap();
    let deleted = d.path().join(SPARE_DIR);
    let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    let mut long = req("a-long-one", 1 << 20);
    long.parameters
        .insert("csi.storage.k8s.io/pvc/name".into(), "x".repeat(500));
    pool.create(&long).await.unwrap();
    pool.delete(&long.id).await.unwrap();
    // The record left the volumes directory; it sits retired, not loaded.
    assert!(names(&d.path().join("volumes")).is_empty());
    let retired = names(&deleted);
    assert_eq!(retired.len(), 1, "{retired:?}");
    assert!(is_retired_record(&retired[0]), "{retired:?}");
    assert_eq!(pool.get(&long.id).await.unwrap(), None);

    // The next create rewrites the retired file (shorter content: no tail
    // of the old record survives) and the record reads back exactly.
    let b = req("b", 1 << 20);
    let vb = pool.create(&b).await.unwrap();
    assert!(names(&deleted).is_empty());
    let text = fs::read(pool.record_path(&b.id.key)).unwrap();
    let rec: record::DirRecord = serde_json::from_slice(&text).unwrap();
    let entry = rec.entry(pool.name(), &b.id.key).unwrap();
    assert_eq!(entry.volume(b.id.clone()), vb);
    assert_eq!(
        fs::metadata(pool.record_path(&b.id.key))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );

    // Deleted records found at start are removed and never become volumes;
    // files the driver did not write are left alone.
    pool.delete(&b.id).await.unwrap();
    assert_eq!(names(&deleted).len(), 1);
    fs::write(deleted.join("notes.txt"), b"mine").unwrap();
    drop(pool);
    let again = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    assert!(again.list().await.unwrap().is_empty());
    assert_eq!(names(&deleted), ["notes.txt"]);
    assert!(names(&d.path().join("volumes")).is_empty());
}

#[tokio::test]
async fn retired_records_beyond_the_cap_are_unlinked() {
    let d = tempfile::tempdir().unwrap();
    let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    let n = MAX_SPARES + 3;
    let reqs: Vec<_> = (0..n).map(|i| req(&format!("v{i}"), 4096)).collect();
    for r in &reqs {
        pool.create(r).await.unwrap();
    }
    for r in &reqs {
        pool.delete(&r.id).await.unwrap();
    }
    let deleted = d.path().join(SPARE_DIR);
    for _ in 0..200 {
        if names(&deleted).len() == MAX_SPARES {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(names(&deleted).len(), MAX_SPARES);
    assert_eq!(pool.state().spares.len(), MAX_SPARES);
}

#[test]
fn retired_record_names() {
    let key = "0123456789abcdef0123456789abcdef";
    assert!(is_retired_record(&format!("{key}.json.12.0")));
    for bad in [
        format!("{key}.json"),
        format!("{key}.json.12"),
        format!("{key}.json.12.x"),
        format!("{key}.json.tmp.1.2"),
        "short.json.1.2".to_owned(),
        format!(".{key}.json.tmp.1.2"),
    ] {
        assert!(!is_retired_record(&bad), "{bad}");
    }
}

#[tokio::test]
async fn interrupted_create_is_completed_by_a_retry() {
    let d = tempfile::tempdir().unwrap();
    let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    let r = req("a", 1 << 20);
    // A crash after mkdir and before the record: only the directory exists.
    fs::create_dir(d.path().join("volumes").join(r.id.key.as_str())).unwrap();
    fs::write(d.path().join("volumes/.x.json.tmp.1.1"), b"{").unwrap();
    drop(pool);
    let pool = DirPool::open(cfg(d.path(), QuotaMode::Off)).await.unwrap();
    assert!(pool.list().await.unwrap().is_empty());
    assert!(!d.path().join("volumes/.x.json.tmp.1.1").exists());
    pool.create(&r).await.unwrap();
    assert_eq!(pool.list().await.unwrap().len(), 1);
}

/// This machine's test hosts and most CI kernels lack project quotas on a
/// temp dir's filesystem; where that is so, `required` must refuse to start
/// with an actionable message and `auto` must degrade and say why.
#[tokio::test]
async fn quota_modes_without_quota_support() {
    let d = tempfile::tempdir().unwrap();
    if crate::quota::unsupported_reason(d.path()).is_none() {
        crate::testing::skip(
            "quota_modes_without_quota_support",
            "the temp dir's filesystem enforces project quotas (the VM tests cover both cases)",
        );
        return;
    }
    let err = DirPool::open(cfg(d.path(), QuotaMode::Required))
        .await
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(msg.contains("quota: required"), "{msg}");
    assert!(matches!(err, PoolError::Misconfigured { .. }));
    let pool = DirPool::open(cfg(d.path(), QuotaMode::Auto)).await.unwrap();
    assert!(pool.unenforced_reason().is_some());
    let mut r = req("a", 1 << 20);
    r.inode_limit = Some(100);
    assert!(matches!(
        pool.create(&r).await,
        Err(PoolError::UnsupportedParameter(_))
    ));
}

#[test]
fn project_candidates_are_deterministic_and_in_range() {
    let key = VolumeName::parse("x").unwrap().key();
    let a: Vec<u32> = project_candidates(&key).take(5).collect();
    let b: Vec<u32> = project_candidates(&key).take(5).collect();
    assert_eq!(a, b);
    assert!(a
        .iter()
        .all(|p| *p >= PROJECT_MIN && *p < PROJECT_MIN + PROJECT_SPAN));
    let mut st = State::new(Index::new(PoolName::parse("p").unwrap()));
    st.foreign_projects.insert(a[0]);
    assert_eq!(st.pick_project(&key), Some(a[1]));
}
