//! Every RPC's operation on a driver with one dir pool in a temp dir. Those
//! that mount (stage, publish and their inverses of a real volume) need
//! root and say SKIPPED without it; the rest run anywhere.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::config::Config;
use crate::driver::Identity;
use crate::fsutil::{PathPlace, RequestPath};
use crate::ids::{ParsedId, PoolName};
use crate::iolimit::IoChange;
use crate::pool::CapacityRange;

const MI: u64 = 1 << 20;

/// Asserts that `e` matches `pattern`, printing it when it does not.
macro_rules! assert_is {
    ($e:expr, $pattern:pat) => {{
        let e = &$e;
        assert!(matches!(e, $pattern), "{e:?}");
    }};
}

/// A driver on node n0 with one dir pool ("default") below `dir`, kubelet's
/// directory at `dir/kubelet`.
async fn driver(dir: &Path) -> Arc<Driver> {
    std::fs::create_dir_all(dir.join("kubelet")).unwrap();
    let who = Identity {
        driver_name: "localvol.csi.dev".into(),
        node_id: "n0".into(),
        kubelet_dir: dir.join("kubelet"),
    };
    Driver::open(&who, &Config::embedded(dir)).await.unwrap()
}

/// A temp dir and [`driver`] in it.
async fn setup() -> (tempfile::TempDir, Arc<Driver>) {
    let dir = tempfile::tempdir().unwrap();
    let d = driver(dir.path()).await;
    (dir, d)
}

fn cap(access_type: AccessType) -> Capability {
    Capability {
        access_type,
        fs_type: String::new(),
        mount_flags: vec![],
        mode: AccessMode::SingleNodeWriter,
    }
}

fn new_volume(name: &str, size: u64) -> NewVolume {
    NewVolume {
        name: VolumeName::parse(name).unwrap(),
        caps: vec![cap(AccessType::Mount)],
        range: CapacityRange {
            required: size,
            limit: 0,
        },
        params: PoolParams::default(),
        content: None,
        io_limits: Default::default(),
        topology: vec![],
    }
}

/// Creates a volume and returns its id.
async fn made(d: &Driver, name: &str) -> String {
    let made = create_volume(d, new_volume(name, 8 * MI)).await.unwrap();
    made.entry.volume.id.to_string()
}

fn parsed(id: &str) -> ParsedId {
    VolumeId::parse("volume_id", id).unwrap()
}

/// A kubelet-style path below `dir/kubelet`, decoded as a request's.
fn path(dir: &Path, rel: &str) -> RequestPath {
    let root = dir.join("kubelet");
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    RequestPath::parse("path", &root, p.to_str().unwrap()).unwrap()
}

const STAGING: &str = "plugins/kubernetes.io/csi/staging/v1/globalmount";
const TARGET: &str = "pods/0b8c3a5e-1111-2222-3333-444455556666/volumes/kubernetes.io~csi/v1/mount";

fn unfit_says(e: &OpError, part: &str) {
    assert!(
        matches!(e, OpError::Refused(Refusal::Unfit(_))) && e.to_string().contains(part),
        "{part:?}: {e:?}"
    );
}

#[tokio::test]
async fn create_volume_is_idempotent_and_checks_the_pool_first() {
    let (_dir, d) = setup().await;
    let a = create_volume(&d, new_volume("pvc-a", 8 * MI))
        .await
        .unwrap();
    let again = create_volume(&d, new_volume("pvc-a", 8 * MI))
        .await
        .unwrap();
    assert_eq!(a.entry.volume.id, again.entry.volume.id);
    assert!(a.entry.storage.is_some(), "a dir pool has an identity");
    // The same name, another size: the volume exists and does not match.
    let e = create_volume(&d, new_volume("pvc-a", 64 * MI))
        .await
        .unwrap_err();
    assert_is!(e, OpError::Pool(PoolError::Mismatch { .. }));
    // What a dir pool cannot do is refused before anything is made.
    let mut limits = new_volume("pvc-b", MI);
    limits.io_limits = IoChange::parse(&[("readIOPS".to_owned(), "5".to_owned())].into())
        .unwrap()
        .apply_to(Default::default());
    let mut luks = new_volume("pvc-b", MI);
    luks.params.encryption = crate::pool::Encryption::parse("luks2");
    let mut block = new_volume("pvc-b", MI);
    block.caps = vec![cap(AccessType::Block)];
    let mut clone = new_volume("pvc-b", MI);
    clone.content = Some(("volume", parsed(&a.entry.volume.id.to_string())));
    for (req, says) in [
        (limits, "apply to LVM volumes"),
        (luks, "applies to LVM pools"),
        (block, "does not support Block access"),
        (clone, "cannot create volumes from snapshots"),
    ] {
        let e = create_volume(&d, req).await.unwrap_err();
        unfit_says(&e, says);
    }
    let listed = list_volumes(&d, page_of("", 10)).await.unwrap();
    assert_eq!(listed.entries.len(), 1, "{listed:?}");
}

#[tokio::test]
async fn create_volume_answers_only_for_this_node() {
    let (_dir, d) = setup().await;
    let mut elsewhere = new_volume("pvc-t", MI);
    elsewhere.topology = vec![Some("n1".into()), None];
    let e = create_volume(&d, elsewhere).await.unwrap_err();
    assert_is!(e, OpError::Refused(Refusal::NotInTopology { .. }));
    let mut here = new_volume("pvc-t", MI);
    here.topology = vec![Some("n1".into()), Some("n0".into())];
    create_volume(&d, here).await.unwrap();
}

#[tokio::test]
async fn snapshots_are_refused_where_no_pool_takes_them() {
    let (_dir, d) = setup().await;
    let id = made(&d, "pvc-s").await;
    assert!(!offers_snapshots(&d));
    let e = snapshots_offered(&d).unwrap_err();
    assert_is!(e, OpError::Refused(Refusal::NoSnapshots));
    let snap = |source: ParsedId| NewSnapshot {
        name: VolumeName::parse("snap-1").unwrap(),
        source,
        cow_size: None,
    };
    let e = create_snapshot(&d, snap(parsed(&id))).await.unwrap_err();
    unfit_says(&e, "does not support snapshots");
    let e = create_snapshot(&d, snap(parsed("not-ours")))
        .await
        .unwrap_err();
    assert_is!(e, OpError::Refused(Refusal::Missing { .. }));
    // Nothing to list, nothing to delete.
    let all = list_snapshots(&d, SnapshotFilter::default(), page_of("", 0))
        .await
        .unwrap();
    assert!(all.entries.is_empty() && all.next_token.is_empty());
    delete_snapshot(&d, parsed("default.0123456789abcdef0123456789abcdef"))
        .await
        .unwrap();
}

#[tokio::test]
async fn delete_volume_is_idempotent() {
    let (_dir, d) = setup().await;
    let id = made(&d, "pvc-d").await;
    delete_volume(&d, parsed(&id)).await.unwrap();
    delete_volume(&d, parsed(&id)).await.unwrap();
    // Not ours, or of a pool this node lacks: nothing to delete.
    delete_volume(&d, parsed("not-ours")).await.unwrap();
    let other = VolumeId::new(
        PoolName::parse("other").unwrap(),
        &VolumeName::parse("x").unwrap(),
    );
    delete_volume(&d, ParsedId::Volume(other)).await.unwrap();
    assert!(list_volumes(&d, page_of("", 0))
        .await
        .unwrap()
        .entries
        .is_empty());
}

#[tokio::test]
async fn validate_confirms_only_what_the_volume_is() {
    let (_dir, d) = setup().await;
    let id = made(&d, "pvc-v").await;
    let ok = validate(&d, &id, vec![Ok(cap(AccessType::Mount))], None);
    assert_eq!(ok.await.unwrap(), None);
    let block = validate(&d, &id, vec![Ok(cap(AccessType::Block))], None);
    let msg = block.await.unwrap().unwrap();
    assert!(msg.contains("capability asks for Block"), "{msg}");
    let params = validate(
        &d,
        &id,
        vec![Err("bad cap".into())],
        Some("bad params".into()),
    );
    assert_eq!(params.await.unwrap().as_deref(), Some("bad params"));
    let e = validate(&d, "default.0123456789abcdef0123456789abcdef", vec![], None)
        .await
        .unwrap_err();
    assert_is!(e, OpError::Driver(DriverError::VolumeNotFound { .. }));
}

fn page_of(token: &str, max: usize) -> ListPage {
    ListPage {
        token: token.into(),
        max: if max == 0 { 1000 } else { max },
    }
}

#[tokio::test]
async fn list_volumes_pages_through_every_volume_once() {
    let (_dir, d) = setup().await;
    for i in 0..5 {
        made(&d, &format!("pvc-{i}")).await;
    }
    let (mut seen, mut token) = (Vec::new(), String::new());
    loop {
        let page = list_volumes(&d, page_of(&token, 2)).await.unwrap();
        assert!(page.entries.len() <= 2);
        assert!(page.entries.iter().all(|e| e.storage.is_some()));
        seen.extend(page.entries.into_iter().map(|e| e.volume.id));
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!((seen.len(), &seen), (5, &sorted));
    let e = list_volumes(&d, page_of("default.nothing", 2))
        .await
        .unwrap_err();
    assert_is!(e, OpError::Refused(Refusal::BadToken { .. }));
}

#[tokio::test]
async fn capacity_is_nothing_where_this_node_cannot_serve() {
    let (_dir, d) = setup().await;
    let q = |access: AccessType, node: Option<Option<String>>| CapacityQuery {
        pool: None,
        access: vec![access],
        node,
    };
    let (available, max) = capacity(&d, q(AccessType::Mount, None)).await.unwrap();
    assert!(available > 0 && max > 0, "{available} {max}");
    let here = capacity(&d, q(AccessType::Mount, Some(Some("n0".into()))));
    assert!(here.await.unwrap().0 > 0);
    for query in [
        q(AccessType::Mount, Some(Some("n1".into()))),
        q(AccessType::Mount, Some(None)),
        q(AccessType::Block, None),
    ] {
        assert_eq!(capacity(&d, query).await.unwrap(), (0, 0));
    }
    let mut unknown = q(AccessType::Mount, None);
    unknown.pool = Some(PoolName::parse("nope").unwrap());
    let e = capacity(&d, unknown).await.unwrap_err();
    assert_is!(e, OpError::Pool(PoolError::UnknownPool { .. }));
}

#[tokio::test]
async fn controller_expand_and_modify_of_a_dir_volume() {
    let (_dir, d) = setup().await;
    let id = made(&d, "pvc-e").await;
    let cluster = Cluster::default();
    let range = CapacityRange {
        required: 16 * MI,
        limit: 0,
    };
    let expand = |volume_id: &str| Expand {
        volume_id: volume_id.into(),
        range,
    };
    let grown = expand_volume(&d, &cluster, expand(&id)).await.unwrap();
    assert!(grown.size_bytes >= 16 * MI, "{grown:?}");
    let e = expand_volume(&d, &cluster, expand("not-ours"))
        .await
        .unwrap_err();
    assert_is!(e, OpError::Refused(Refusal::NotOurs { .. }));
    let change = |k: &str, v: &str| IoChange::parse(&[(k.to_owned(), v.to_owned())].into());
    let modify = |volume_id: &str, change| Modify {
        volume_id: volume_id.into(),
        change,
    };
    // A limit a dir volume cannot take; lifting one is nothing to do.
    let e = modify_volume(&d, &cluster, modify(&id, change("readIOPS", "9").unwrap()))
        .await
        .unwrap_err();
    unfit_says(&e, "apply to LVM volumes");
    modify_volume(
        &d,
        &cluster,
        modify(&id, change("readIOPS", "max").unwrap()),
    )
    .await
    .unwrap();
    // Outside a cluster, a volume this node lacks is nowhere.
    let absent = "default.0123456789abcdef0123456789abcdef";
    let e = modify_volume(
        &d,
        &cluster,
        modify(absent, change("readIOPS", "1").unwrap()),
    )
    .await
    .unwrap_err();
    assert_is!(e, OpError::Refused(Refusal::Missing { .. }));
}

/// Every operation that changes a volume takes its lock before it looks the
/// volume up: while another holds it, each is refused at once, whether the
/// volume exists or not.
#[tokio::test]
async fn every_change_to_a_busy_volume_is_refused_before_the_lookup() {
    let (dir, d) = setup().await;
    let id = made(&d, "pvc-busy").await;
    let absent = VolumeId::new(
        PoolName::parse("default").unwrap(),
        &VolumeName::parse("pvc-absent").unwrap(),
    )
    .to_string();
    for raw in [id.as_str(), absent.as_str()] {
        let _held = lock(&d, Kind::Volume, "volume_id", raw).unwrap();
        let busy = |r: Result<()>| assert!(matches!(r, Err(OpError::Busy(_))), "{raw}: {r:?}");
        let cluster = Cluster::default();
        let range = CapacityRange {
            required: 16 * MI,
            limit: 0,
        };
        let vol = || raw.to_owned();
        busy(delete_volume(&d, parsed(raw)).await);
        busy(
            expand_volume(
                &d,
                &cluster,
                Expand {
                    volume_id: vol(),
                    range,
                },
            )
            .await
            .map(drop),
        );
        let change = IoChange::parse(&Default::default()).unwrap();
        busy(
            modify_volume(
                &d,
                &cluster,
                Modify {
                    volume_id: vol(),
                    change,
                },
            )
            .await,
        );
        busy(stage(&d, stage_req(dir.path(), raw)).await);
        busy(publish(&d, publish_req(dir.path(), raw)).await);
        busy(unpublish(&d, unpublish_req(dir.path(), raw)).await);
        busy(unstage(&d, unstage_req(dir.path(), raw)).await);
        let place = RequestPath::place("volume_path", &dir.path().join("kubelet"), TARGET);
        let expand = NodeExpand {
            volume_id: vol(),
            place: place.unwrap(),
            staging: None,
            range,
            cap: None,
        };
        busy(expand_on_node(&d, expand).await.map(drop));
    }
    // A new volume's lock is its name's: the same key as the id's.
    let _held = lock(&d, Kind::Volume, "volume_id", &id).unwrap();
    let again = create_volume(&d, new_volume("pvc-busy", 8 * MI)).await;
    assert!(matches!(again, Err(OpError::Busy(_))), "{again:?}");
    // And an ephemeral volume's, its handle's.
    let _held = lock(&d, Kind::Volume, "volume_id", "csi-eph").unwrap();
    let e = publish_ephemeral(&d, ephemeral_req(dir.path(), "csi-eph")).await;
    assert_is!(e, Err(OpError::Busy(_)));
}

fn stage_req(dir: &Path, id: &str) -> Stage {
    Stage {
        volume_id: id.into(),
        staging: path(dir, STAGING),
        cap: cap(AccessType::Mount),
        key: None,
        storage: None,
        format: Default::default(),
        fs_type: None,
    }
}

fn publish_req(dir: &Path, id: &str) -> Publish {
    Publish {
        volume_id: id.into(),
        target: path(dir, TARGET),
        staging: Some(path(dir, STAGING)),
        cap: cap(AccessType::Mount),
        read_only: false,
        storage: None,
    }
}

fn unpublish_req(dir: &Path, id: &str) -> Unpublish {
    Unpublish {
        volume_id: id.into(),
        target: path(dir, TARGET),
    }
}

fn unstage_req(dir: &Path, id: &str) -> Unstage {
    Unstage {
        volume_id: id.into(),
        staging: path(dir, STAGING),
    }
}

fn ephemeral_req(dir: &Path, name: &str) -> NewEphemeral {
    NewEphemeral {
        name: VolumeName::parse(name).unwrap(),
        target: path(dir, TARGET),
        cap: cap(AccessType::Mount),
        params: PoolParams::default(),
        size: 8 * MI,
    }
}

#[tokio::test]
async fn node_calls_refuse_what_does_not_fit_the_volume() {
    let (dir, d) = setup().await;
    let id = made(&d, "pvc-n").await;
    let mut block = stage_req(dir.path(), &id);
    block.cap = cap(AccessType::Block);
    unfit_says(&stage(&d, block).await.unwrap_err(), "is a Mount volume");
    let mut flags = publish_req(dir.path(), &id);
    flags.cap.mount_flags = vec!["size=1".into()];
    let e = publish(&d, flags).await.unwrap_err();
    unfit_says(&e, "not supported for directory volumes");
    let mut other = stage_req(dir.path(), &id);
    other.storage = Some(crate::ids::StorageId::parse("dir:elsewhere").unwrap());
    let e = stage(&d, other).await.unwrap_err();
    assert_is!(e, OpError::Driver(DriverError::OtherStorage { .. }));
    let absent = "default.0123456789abcdef0123456789abcdef";
    for e in [
        stage(&d, stage_req(dir.path(), absent)).await.unwrap_err(),
        publish(&d, publish_req(dir.path(), absent))
            .await
            .unwrap_err(),
        unstage(&d, unstage_req(dir.path(), absent))
            .await
            .unwrap_err(),
    ] {
        assert_is!(e, OpError::Driver(DriverError::VolumeNotFound { .. }));
    }
    // A volume that is gone leaves nothing to unmount: an empty target
    // is removed, and that is done.
    std::fs::create_dir_all(dir.path().join("kubelet").join(TARGET)).unwrap();
    unpublish(&d, unpublish_req(dir.path(), absent))
        .await
        .unwrap();
    assert!(!dir.path().join("kubelet").join(TARGET).exists());
}

#[tokio::test]
async fn stats_and_node_expand_need_the_volume_where_the_path_says() {
    let (dir, d) = setup().await;
    let id = made(&d, "pvc-p").await;
    let root = dir.path().join("kubelet");
    let elsewhere = RequestPath::place("volume_path", &root, "/not/kubelet").unwrap();
    assert!(matches!(elsewhere, PathPlace::Elsewhere(_)));
    let e = stats(&d, &id, elsewhere).await.unwrap_err();
    assert_is!(e, OpError::Step(_));
    let nothing = RequestPath::place("volume_path", &root, root.join(TARGET).to_str().unwrap());
    let expand = NodeExpand {
        volume_id: id.clone(),
        place: nothing.unwrap(),
        staging: None,
        range: CapacityRange::default(),
        cap: Some(cap(AccessType::Mount)),
    };
    let e = expand_on_node(&d, expand).await.unwrap_err();
    assert_is!(e, OpError::Step(_));
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// What is mounted at `p` now (mountinfo's mount points).
fn mounted(p: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = p.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(p))
}

#[tokio::test]
async fn a_dir_volume_goes_through_every_node_call() {
    if !is_root() {
        crate::testing::skip("a dir volume's node calls", "bind mounts need root");
        return;
    }
    let (dir, d) = setup().await;
    let id = made(&d, "pvc-life").await;
    let root: PathBuf = dir.path().join("kubelet");
    std::fs::create_dir_all(root.join(STAGING)).unwrap();
    stage(&d, stage_req(dir.path(), &id)).await.unwrap();
    stage(&d, stage_req(dir.path(), &id)).await.unwrap();
    assert!(mounted(&root.join(STAGING)));
    publish(&d, publish_req(dir.path(), &id)).await.unwrap();
    publish(&d, publish_req(dir.path(), &id)).await.unwrap();
    assert!(mounted(&root.join(TARGET)));
    let place = || RequestPath::place("volume_path", &root, root.join(TARGET).to_str().unwrap());
    let s = stats(&d, &id, place().unwrap()).await.unwrap();
    assert_eq!(s.condition, None, "{s:?}");
    assert!(s.bytes.1 > 0 && s.inodes.is_some(), "{s:?}");
    let expand = NodeExpand {
        volume_id: id.clone(),
        place: place().unwrap(),
        staging: Some(path(dir.path(), STAGING)),
        range: CapacityRange {
            required: 16 * MI,
            limit: 0,
        },
        cap: None,
    };
    assert!(expand_on_node(&d, expand).await.unwrap() >= 16 * MI);
    for _ in 0..2 {
        unpublish(&d, unpublish_req(dir.path(), &id)).await.unwrap();
    }
    assert!(!mounted(&root.join(TARGET)));
    for _ in 0..2 {
        unstage(&d, unstage_req(dir.path(), &id)).await.unwrap();
    }
    assert!(!mounted(&root.join(STAGING)));
    delete_volume(&d, parsed(&id)).await.unwrap();
}

#[tokio::test]
async fn an_ephemeral_volume_lives_as_long_as_its_target() {
    if !is_root() {
        crate::testing::skip("an ephemeral volume's node calls", "bind mounts need root");
        return;
    }
    let (dir, d) = setup().await;
    let target = dir.path().join("kubelet").join(TARGET);
    publish_ephemeral(&d, ephemeral_req(dir.path(), "csi-abc"))
        .await
        .unwrap();
    publish_ephemeral(&d, ephemeral_req(dir.path(), "csi-abc"))
        .await
        .unwrap();
    assert!(mounted(&target));
    let listed = list_volumes(&d, page_of("", 0)).await.unwrap();
    assert_eq!(listed.entries.len(), 1);
    let unpub = || unpublish_req(dir.path(), "csi-abc");
    unpublish(&d, unpub()).await.unwrap();
    assert!(!mounted(&target));
    assert!(list_volumes(&d, page_of("", 0))
        .await
        .unwrap()
        .entries
        .is_empty());
    // Gone with its volume: a repeat finds nothing and nothing to remove.
    unpublish(&d, unpub()).await.unwrap();
}
