//! Unit tests of the LVM pool that need neither root nor the VM: the tag
//! schema and lvcreate arguments on recorded `lvs` JSON, sizing, and finding
//! a dead driver's copy.

use super::*;
use crate::ids::VolumeName;
use crate::pool::{Encrypted, Encryption, NodeSide, Source};

const MI: u64 = 1 << 20;
/// Recorded in the VM: a thin pool, a thin LV and a thin snapshot of it.
const LVS_THIN: &str = include_str!("../../../tests/fixtures/lvm/lvs-thin.json");
const KEY: &str = "0123456789abcdef0123456789abcdef";

/// A pool over the fixture's VG, opened without running lvm.
fn pool(name: &str, thin: Option<&str>) -> LvmPool {
    LvmPool {
        name: PoolName::parse(name).unwrap(),
        vg: "fxvg".into(),
        provisioning: provisioning(thin),
        reserve: 0,
        default_fs: FsType::Ext4,
        default_size: 64 * MI,
        copies: Arc::default(),
        alloc: tokio::sync::Mutex::new(()),
        health: HealthCache::default(),
        storage: None,
        index: LvIndex::new(thin.map(ThinPoolName::new).as_ref()),
        extent: std::sync::atomic::AtomicU64::new(4 * MI),
        offer: Arc::default(),
    }
}

/// Thin on `thin`, or thick (with lvcreateOptions, and no wiper).
fn provisioning(thin: Option<&str>) -> Provisioning {
    match thin {
        Some(t) => Provisioning::Thin(Thin {
            pool: ThinPoolName::new(t),
            ratio: 1.0,
            full_percent: 90.0,
        }),
        None => Provisioning::Thick(Thick {
            options: vec!["--type".into(), "raid1".into()],
            overhead: 1.0,
            wiper: None,
        }),
    }
}

/// The fixture's LV `name`, with `tags` instead of its own.
fn lv(name: &str, tags: &[&str]) -> LvInfo {
    let mut lv = lvm::parse_lvs(LVS_THIN)
        .unwrap()
        .into_iter()
        .find(|l| l.name == name)
        .unwrap();
    lv.tags = tags.iter().map(|t| t.to_string()).collect();
    lv
}

fn request(name: &str, access: AccessType) -> CreateRequest {
    let name = VolumeName::parse(name).unwrap();
    CreateRequest {
        id: VolumeId::new(PoolName::parse("thin").unwrap(), &name),
        name,
        range: CapacityRange::default(),
        access_type: access,
        inode_limit: None,
        parameters: Default::default(),
        encryption: None,
        io_limits: Default::default(),
        source: None,
    }
}

#[test]
fn its_stand_in_answers_as_it_does() {
    // What a request is checked against before the pool opens, and by
    // `localvol config check --storage-class`.
    for (name, thin) in [("thick", None), ("thin", Some("tp"))] {
        let thin_line = thin.map_or(String::new(), |t| format!("thinPool: {t}\n"));
        let cfg: crate::config::PoolConfig = serde_norway::from_str(&format!(
            "type: lvm\nname: {name}\nvolumeGroup: fxvg\n{thin_line}defaultFsType: ext4\n"
        ))
        .unwrap();
        crate::pool::refused::assert_answers_as_opened(&cfg, &pool(name, thin), true);
    }
}

/// The config's strategy, each with its own settings; what is one kind's
/// alone is offered only by that kind.
#[test]
fn thick_and_thin_are_two_strategies_from_the_config() {
    let lvm_cfg = |extra: &str| {
        let text = format!("type: lvm\nname: p\nvolumeGroup: fxvg\n{extra}");
        match serde_norway::from_str::<crate::config::PoolConfig>(&text).unwrap() {
            crate::config::PoolConfig::Lvm(c) => c,
            other => panic!("{other:?}"),
        }
    };
    let thin = Provisioning::of(&lvm_cfg(
        "thinPool: tp\noverprovisionRatio: 2.5\nthinFullPercent: 80\n",
    ));
    let Provisioning::Thin(t) = &thin else {
        panic!("a thinPool makes a thin pool");
    };
    assert_eq!(
        (t.pool.as_str(), t.ratio, t.full_percent),
        ("tp", 2.5, 80.0)
    );
    assert_eq!(thin.backend(), Backend::LvmThin);
    assert!(thin.checks_room_first(0) && !thin.shapes_otherwise());
    assert_eq!(thin.created_shape(), ("Vwi-a-tz--", "tp".to_owned()));
    let thick = Provisioning::of(&lvm_cfg(
        "capacityOverhead: 1.5\nlvcreateOptions: [\"--type\", \"raid1\"]\n",
    ));
    let Provisioning::Thick(k) = &thick else {
        panic!("no thinPool makes a thick pool");
    };
    assert_eq!((k.options.len(), k.overhead), (2, 1.5));
    assert!(k.wiper.is_none(), "started when the pool has opened");
    assert_eq!(thick.backend(), Backend::Lvm);
    assert!(thick.checks_room_first(0) && thick.shapes_otherwise());
    assert!(thick.thin().is_none() && thick.thin_pool().is_none());
    assert_eq!(thick.created_shape(), ("-wi-a-----", String::new()));
    let plain = Provisioning::of(&lvm_cfg(""));
    assert!(!plain.checks_room_first(0) && plain.checks_room_first(1));
    // Block maps and thin usage are a thin pool's alone.
    assert!(pool("thin", Some("tp")).block_maps().is_some());
    assert!(pool("thick", None).block_maps().is_none());
    let vg = lvm::VgInfo {
        name: "fxvg".into(),
        uuid: String::new(),
        size: 100 * MI,
        free: 40 * MI,
        extent_size: 4 * MI,
        free_extents: 10,
        tags: Vec::new(),
    };
    let Provisioning::Thick(k) = Provisioning::of(&lvm_cfg("capacityOverhead: 2\n")) else {
        unreachable!()
    };
    assert_eq!(k.limits(&vg, 8 * MI), (44 * MI, 16 * MI));
}

#[test]
fn an_lv_is_a_volume_only_when_its_tags_say_so() {
    let p = pool("thin", Some("tp"));
    let lv_name = format!("lv-{KEY}");
    let mine = [
        "localvol",
        "localvol.pool=thin",
        "localvol.name=pvc-1",
        "localvol.access=mount",
    ];
    let v = p.to_volume(&lv(&lv_name, &mine)).expect("our volume");
    assert_eq!(v.id.to_string(), format!("thin.{KEY}"));
    assert_eq!((v.name.as_str(), v.pool().as_str()), ("pvc-1", "thin"));
    assert_eq!((v.size_bytes, v.access_type), (64 * MI, AccessType::Mount));
    assert!(!v.inactive && !v.grow_filesystem);

    let block = [
        "localvol",
        "localvol.pool=thin",
        "localvol.name=b",
        "localvol.access=block",
        "localvol.grow",
    ];
    let v = p.to_volume(&lv(&lv_name, &block)).unwrap();
    assert_eq!(v.access_type, AccessType::Block);
    assert!(v.grow_filesystem);

    // The recorded snapshot is inactive: a volume tagged like it says so.
    let v = p.to_volume(&lv(&format!("sn-{KEY}"), &mine));
    assert!(v.is_none(), "sn- names are snapshots, never volumes");

    for (why, tags) in [
        (
            "another pool's",
            &[
                "localvol",
                "localvol.pool=other",
                "localvol.name=x",
                "localvol.access=mount",
            ][..],
        ),
        (
            "not localvol's",
            &[
                "localvol.pool=thin",
                "localvol.name=x",
                "localvol.access=mount",
            ],
        ),
        (
            "being restored",
            &[
                "localvol",
                "localvol.pool=thin",
                "localvol.name=x",
                "localvol.access=mount",
                "localvol.restoring",
            ],
        ),
        (
            "being created",
            &[
                "localvol",
                "localvol.pool=thin",
                "localvol.name=x",
                "localvol.access=mount",
                "localvol.creating",
            ],
        ),
        (
            "without a name",
            &["localvol", "localvol.pool=thin", "localvol.access=mount"],
        ),
        (
            "without an access type",
            &["localvol", "localvol.pool=thin", "localvol.name=x"],
        ),
    ] {
        assert!(p.to_volume(&lv(&lv_name, tags)).is_none(), "{why}");
    }
}

#[test]
fn an_lv_is_a_snapshot_only_when_its_tags_say_so() {
    let p = pool("thin", Some("tp"));
    let name = format!("sn-{KEY}");
    let source = format!("thin.{}", "f".repeat(32));
    let size = format!("localvol.size={}", 64 * MI);
    let src_tag = format!("localvol.source={source}");
    let tags = [
        "localvol",
        "localvol.pool=thin",
        "localvol.kind=snapshot",
        "localvol.name=snap-1",
        src_tag.as_str(),
        size.as_str(),
    ];
    let s = p.to_snapshot(&lv(&name, &tags)).expect("our snapshot");
    assert_eq!(s.id, format!("thin.{KEY}"));
    assert_eq!(
        (s.name.as_str(), s.source_volume_id.as_str()),
        ("snap-1", source.as_str())
    );
    assert_eq!(s.size_bytes, 64 * MI);
    assert!(s.ready, "a thin snapshot is never an invalid COW");
    assert!(s.created_unix > 0);
    // Missing what a snapshot must record, or not a snapshot at all.
    for drop in [
        "localvol.kind=snapshot",
        src_tag.as_str(),
        size.as_str(),
        "localvol.name=snap-1",
        "localvol.pool=thin",
    ] {
        let fewer: Vec<&str> = tags.iter().copied().filter(|t| *t != drop).collect();
        assert!(
            p.to_snapshot(&lv(&name, &fewer)).is_none(),
            "without {drop}"
        );
    }
    assert!(
        p.to_snapshot(&lv(&format!("lv-{KEY}"), &tags)).is_none(),
        "lv- name"
    );
}

/// A thick pool's snapshot is a COW snapshot (`s`); the plain LV a
/// cut-short `lvcreate -s` leaves with the same tags is not one.
#[test]
fn a_thick_snapshot_must_be_a_cow_snapshot() {
    let p = pool("thick", None);
    let name = format!("sn-{KEY}");
    let size = format!("localvol.size={}", 64 * MI);
    let src_tag = format!("localvol.source=thick.{}", "f".repeat(32));
    let tags = [
        "localvol",
        "localvol.pool=thick",
        "localvol.kind=snapshot",
        "localvol.name=snap-1",
        src_tag.as_str(),
        size.as_str(),
    ];
    let mut snap = lv(&name, &tags);
    snap.attr = "swi-a-s---".into();
    assert!(!p.is_half_made_snapshot(&snap));
    assert!(p.to_snapshot(&snap).is_some(), "a COW snapshot");
    let mut plain = snap.clone();
    plain.attr = "-wi-------".into();
    assert!(p.is_half_made_snapshot(&plain));
    assert!(p.to_snapshot(&plain).is_none(), "a plain LV");
    // Another pool's, or not tagged a snapshot: not ours to remove.
    let mut other = plain.clone();
    other.tags = tags
        .iter()
        .map(|t| t.replace("pool=thick", "pool=other"))
        .collect();
    assert!(!p.is_half_made_snapshot(&other));
    // A thin pool's snapshots are thin volumes, made in one step.
    let mut thin = plain.clone();
    thin.attr = "Vwi---tz-k".into();
    assert!(!pool("thick", Some("tp")).is_half_made_snapshot(&thin));
}

#[test]
fn a_restore_retry_finds_only_its_own_lv() {
    let p = pool("thin", Some("tp"));
    let req = request("pvc-1", AccessType::Mount);
    let src = format!("thin.{}", "f".repeat(32));
    let src_tag = format!("localvol.source={src}");
    let name = format!("lv-{KEY}");
    let ours = [
        "localvol",
        "localvol.pool=thin",
        "localvol.kind=volume",
        "localvol.name=pvc-1",
        "localvol.access=mount",
        src_tag.as_str(),
    ];
    p.check_restore_of(&lv(&name, &ours), &req, &src).unwrap();
    let other_src = format!("localvol.source=thin.{}", "e".repeat(32));
    for (why, tags) in [
        (
            "another pool's",
            vec![
                "localvol",
                "localvol.pool=other",
                "localvol.name=pvc-1",
                src_tag.as_str(),
            ],
        ),
        (
            "a snapshot",
            vec![
                "localvol",
                "localvol.pool=thin",
                "localvol.kind=snapshot",
                "localvol.name=pvc-1",
                src_tag.as_str(),
            ],
        ),
        (
            "another name's",
            vec![
                "localvol",
                "localvol.pool=thin",
                "localvol.name=pvc-2",
                src_tag.as_str(),
            ],
        ),
        (
            "from another source",
            vec![
                "localvol",
                "localvol.pool=thin",
                "localvol.name=pvc-1",
                other_src.as_str(),
            ],
        ),
        (
            "a plain volume",
            vec!["localvol", "localvol.pool=thin", "localvol.name=pvc-1"],
        ),
    ] {
        let e = p
            .check_restore_of(&lv(&name, &tags), &req, &src)
            .unwrap_err();
        assert!(
            matches!(e, PoolError::Mismatch { .. } | PoolError::NotOurs { .. }),
            "{why}: {e:?}"
        );
    }
}

#[test]
fn create_args_carry_every_tag_and_the_pool_kind() {
    let req = request("pvc-1", AccessType::Block);
    let tags_of = |a: &[String]| -> Vec<String> {
        a.windows(2)
            .filter(|w| w[0] == "--addtag")
            .map(|w| w[1].clone())
            .collect()
    };
    let want = [
        "localvol",
        "localvol.pool=thin",
        "localvol.kind=volume",
        "localvol.name=pvc-1",
        "localvol.access=block",
        "localvol.creating",
    ];
    let thin = pool("thin", Some("tp")).create_args(&req, 64 * MI);
    assert_eq!(tags_of(&thin), want);
    assert_eq!(&thin[..4], ["lvcreate", "--yes", "--activate", "y"]);
    let at = thin.iter().position(|a| a == "--virtualsize").unwrap();
    assert_eq!(
        thin[at + 1..at + 4],
        [format!("{}b", 64 * MI), "--thin".into(), "fxvg/tp".into()]
    );
    assert!(
        !thin.contains(&"--wipesignatures".to_owned()),
        "thin LVs are zeroed by the pool"
    );

    let thick = pool("thin", None).create_args(&req, 64 * MI);
    assert_eq!(tags_of(&thick), want);
    let at = thick.iter().position(|a| a == "--size").unwrap();
    assert_eq!(thick[at + 1], format!("{}b", 64 * MI));
    assert!(thick.windows(2).any(|w| w == ["--wipesignatures", "y"]));
    assert!(
        thick.windows(2).any(|w| w == ["--type", "raid1"]),
        "the pool's lvcreateOptions"
    );
    assert_eq!(thick.last().unwrap(), "fxvg");
}

fn sized(required: u64, limit: u64) -> Result<u64> {
    size_in_extents(CapacityRange { required, limit }, 1024 * MI, 4 * MI)
}

#[test]
fn sizes_are_whole_extents_within_the_range() {
    assert_eq!(sized(0, 0).unwrap(), 1024 * MI, "default");
    assert_eq!(sized(1, 0).unwrap(), 4 * MI, "rounded up");
    assert_eq!(sized(10 * MI, 0).unwrap(), 12 * MI);
    assert_eq!(sized(10 * MI, 12 * MI).unwrap(), 12 * MI);
    // Only a limit, below the default and not a whole extent: the most
    // whole extents under it, not a refusal.
    assert_eq!(sized(0, 10 * MI + 1).unwrap(), 8 * MI);
    assert_eq!(
        sized(0, 2048 * MI).unwrap(),
        1024 * MI,
        "default under the limit"
    );
    for (required, limit) in [(10 * MI, 11 * MI), (0, 3 * MI), (1, 1)] {
        let e = sized(required, limit).unwrap_err();
        assert!(
            matches!(e, PoolError::SizeRefused(_)),
            "({required}, {limit}): {e:?}"
        );
    }
}

#[test]
fn thin_offers_the_smaller_of_promise_room_and_unwritten_data() {
    const EXT: u64 = 4 * MI;
    // 1 GiB pool, ratio 2, 64 MiB reserve, nothing promised, empty: the data
    // space (less the reserve) is the smaller.
    let o = capacity::ThinOffer::new(1024 * MI, Some(0.0), 2.0, 64 * MI, 0, EXT);
    assert_eq!(o.ever, 1984 * MI);
    assert_eq!(o.by_promise, 1984 * MI);
    assert_eq!(o.by_data, 960 * MI);
    assert_eq!(o.offered(), 960 * MI);
    // 85% written: 15% of the pool is left, less the reserve, in extents.
    let o = capacity::ThinOffer::new(1024 * MI, Some(85.0), 2.0, 64 * MI, 1024 * MI, EXT);
    let free = 1024 * MI - (1024.0 * MI as f64 * 0.85) as u64 - 64 * MI;
    assert_eq!(o.by_data, free / EXT * EXT);
    assert_eq!(o.offered(), free / EXT * EXT);
    // Promised nearly everything, little written: the promise room is smaller.
    let o = capacity::ThinOffer::new(1024 * MI, Some(1.0), 2.0, 64 * MI, 1900 * MI, EXT);
    assert_eq!(o.by_promise, 84 * MI);
    assert_eq!(o.offered(), 84 * MI);
    // Full beyond the reserve, or no figure at all (inactive: counted empty).
    assert_eq!(
        capacity::ThinOffer::new(1024 * MI, Some(97.0), 2.0, 64 * MI, 0, EXT).offered(),
        0
    );
    assert_eq!(
        capacity::ThinOffer::new(1024 * MI, None, 1.0, 0, 0, EXT).offered(),
        1024 * MI
    );
}

#[test]
fn an_lv_being_wiped_is_neither_a_volume_nor_a_snapshot() {
    let p = pool("thin", Some("tp"));
    let tags = [
        "localvol",
        "localvol.pool=thin",
        "localvol.name=pvc-1",
        "localvol.access=block",
        "localvol.kind=snapshot",
        "localvol.source=thin.x",
        "localvol.size=1",
    ];
    let lv_name = format!("lv-{KEY}");
    let a = wipe::wipe_lv_name(&lv_name);
    let b = wipe::wipe_lv_name(&format!("sn-{KEY}"));
    assert!(a.starts_with(&format!("wp-{KEY}-")), "{a}");
    assert!(b.starts_with(&format!("wp-{KEY}-")), "{b}");
    assert_ne!(a, b, "a second delete of the same name gets its own LV");
    let mut wiping = lv(&lv_name, &tags);
    wiping.name = a;
    assert!(wipe::is_wiping(&wiping));
    assert!(p.to_volume(&wiping).is_none());
    assert!(p.to_snapshot(&wiping).is_none());
    assert!(!wipe::is_wiping(&lv(&lv_name, &tags)));
}

/// A volume DeleteVolume tagged deleted (a thick pool's one-run delete) is
/// no volume any more: never listed, staged or answered to a create,
/// although it keeps its `lv-` name until the wiper renames it.
#[test]
fn a_volume_tagged_deleted_is_no_volume() {
    let p = pool("thin", Some("tp"));
    let mut tags = vec![
        "localvol",
        "localvol.pool=thin",
        "localvol.name=pvc-1",
        "localvol.access=mount",
    ];
    let lv_name = format!("lv-{KEY}");
    assert!(p.to_volume(&lv(&lv_name, &tags)).is_some());
    tags.push(TAG_DELETED);
    assert!(p.to_volume(&lv(&lv_name, &tags)).is_none());
}

/// Encryption is recorded in a tag at create, read back into the volume
/// (what NodeStage goes by), and decides which device the node uses: the
/// mapping named from the id, over the LV.
#[test]
fn encryption_is_a_tag_and_makes_the_mapping_the_source() {
    let p = pool("thin", Some("tp"));
    let mut req = request("pvc-enc", AccessType::Mount);
    req.encryption = Some(Encryption::Luks2);
    let args = p.create_args(&req, 64 * MI);
    assert!(
        args.windows(2)
            .any(|w| w == ["--addtag", "localvol.encryption=luks2"]),
        "{args:?}"
    );
    let plain = p.create_args(&request("pvc-plain", AccessType::Mount), 64 * MI);
    assert!(!plain.iter().any(|a| a.contains("encryption")), "{plain:?}");

    let lv_name = format!("lv-{KEY}");
    let tags = [
        "localvol",
        "localvol.pool=thin",
        "localvol.name=pvc-enc",
        "localvol.access=mount",
        "localvol.encryption=luks2",
    ];
    let v = p.to_volume(&lv(&lv_name, &tags)).unwrap();
    assert_eq!(v.encryption, Some(Encryption::Luks2));
    let mapping = format!("localvol-thin.{KEY}");
    assert_eq!(
        p.source(&v).unwrap(),
        Source::Device(PathBuf::from(format!("/dev/mapper/{mapping}")))
    );
    assert_eq!(
        p.encrypted(&v).unwrap(),
        Some(Encrypted {
            backing: PathBuf::from(format!("/dev/fxvg/{lv_name}")),
            mapping: mapping.clone(),
        })
    );
    let id = VolumeId {
        pool: PoolName::parse("thin").unwrap(),
        key: VolumeKey::parse(KEY).unwrap(),
    };
    assert_eq!(p.mapping_of(&id), Some(mapping));
    // A repeated create must ask for the same encryption.
    let mut again = request("pvc-enc", AccessType::Mount);
    assert!(matches!(
        crate::pool::matches_request(v.clone(), &again, false),
        Err(PoolError::Mismatch { .. })
    ));
    again.encryption = Some(Encryption::Luks2);
    assert!(crate::pool::matches_request(v.clone(), &again, false).is_ok());

    let plain = p.to_volume(&lv(&lv_name, &tags[..4])).unwrap();
    assert_eq!(plain.encryption, None);
    assert_eq!(p.encrypted(&plain).unwrap(), None);
    assert_eq!(
        p.source(&plain).unwrap(),
        Source::Device(PathBuf::from(format!("/dev/fxvg/{lv_name}")))
    );
}

/// A new, empty volume of mount access is created tagged `unformatted` (the
/// node formats it whole, whatever a cut-short mkfs left) and read back so;
/// raw block volumes, which the driver never formats, are not.
#[test]
fn new_mount_volumes_are_unformatted_until_the_node_says_otherwise() {
    let p = pool("thin", Some("tp"));
    let args = p.create_args(&request("pvc-fs", AccessType::Mount), 64 * MI);
    assert!(
        args.windows(2)
            .any(|w| w == ["--addtag", "localvol.unformatted"]),
        "{args:?}"
    );
    let block = p.create_args(&request("pvc-raw", AccessType::Block), 64 * MI);
    assert!(
        !block.iter().any(|a| a.contains("unformatted")),
        "{block:?}"
    );
    let lv_name = format!("lv-{KEY}");
    let tags = [
        "localvol",
        "localvol.pool=thin",
        "localvol.name=pvc-fs",
        "localvol.access=mount",
        "localvol.unformatted",
    ];
    assert!(p.to_volume(&lv(&lv_name, &tags)).unwrap().unformatted);
    assert!(!p.to_volume(&lv(&lv_name, &tags[..4])).unwrap().unformatted);
    // `unformatted` marks a mount volume's unfinished LV too: it is never
    // also tagged `creating` (which would take a second lvm run to remove).
    assert!(!args.iter().any(|a| a.contains("creating")), "{args:?}");
}

/// What a retried CreateVolume takes for an LV a cut-short `lvcreate` left:
/// one still tagged `creating`, or a never-staged mount volume's LV that is
/// not active. A staged (formatted) volume is never one, active or not.
#[test]
fn cut_short_lvs_are_creating_or_unformatted_and_inactive() {
    let name = format!("lv-{KEY}");
    let base = ["localvol", "localvol.pool=thin", "localvol.name=x"];
    let with = |extra: &[&str], active: bool| {
        let tags: Vec<&str> = base.iter().chain(extra).copied().collect();
        let mut l = lv(&name, &tags);
        l.attr = if active { "-wi-a-----" } else { "-wi-------" }.to_owned();
        l
    };
    assert!(super::cut_short(&with(&["localvol.creating"], true)));
    assert!(super::cut_short(&with(&["localvol.creating"], false)));
    assert!(super::cut_short(&with(&["localvol.unformatted"], false)));
    assert!(!super::cut_short(&with(&["localvol.unformatted"], true)));
    assert!(
        !super::cut_short(&with(&[], false)),
        "a staged volume, inactive"
    );
    assert!(!super::cut_short(&with(&[], true)));
}

#[test]
fn a_created_lv_is_what_lvs_would_report() {
    for (kind, thin) in [("thin", Some("tp")), ("thick", None)] {
        let p = pool("thin", thin);
        let req = request("pvc-1", AccessType::Block);
        let mut lv = p.just_created(&req, 64 * MI);
        assert_eq!(lv.name, lv_name(&req.id.key), "{kind}");
        assert_eq!(lv.path, format!("/dev/fxvg/{}", lv.name), "{kind}");
        assert!(lv.is_active(), "{kind}: lvcreate --activate y");
        assert_eq!(lv.is_thin_volume(), thin.is_some(), "{kind}");
        assert!(!lv.is_cow_snapshot() && !lv.is_thin_pool(), "{kind}");
        assert!(!lv.open, "{kind}");
        // Hidden until the creating tag goes, then exactly the volume asked for.
        assert!(p.to_volume(&lv).is_none(), "{kind}: still tagged creating");
        lv.tags.retain(|t| t != TAG_CREATING);
        let vol = p.to_volume(&lv).unwrap();
        assert_eq!(vol.id, req.id);
        assert_eq!(vol.size_bytes, 64 * MI);
        assert!(!vol.inactive);
        super::super::matches_request(vol, &req, false).unwrap();
        // A mount volume is visible at once, still to be formatted.
        let mount = p.just_created(&request("pvc-2", AccessType::Mount), 64 * MI);
        let vol = p.to_volume(&mount).expect("a new mount volume");
        assert!(vol.unformatted && !vol.inactive, "{kind}: {vol:?}");
    }
    // The recorded thin volume's attributes read the same way.
    let recorded = lv("lv-0123456789abcdef0123456789abcdef", &[]);
    let made = pool("thin", Some("tp")).just_created(&request("pvc-1", AccessType::Mount), MI);
    assert_eq!(recorded.is_thin_volume(), made.is_thin_volume());
    assert_eq!(recorded.is_active(), made.is_active());
    assert_eq!(recorded.zeroes_new_blocks(), made.zeroes_new_blocks());
}

#[test]
fn the_index_keeps_volumes_and_drops_reads_older_than_its_changes() {
    let all = lvm::parse_lvs(LVS_THIN).unwrap();
    let vol = "lv-0123456789abcdef0123456789abcdef";
    let idx = LvIndex::default();
    let e = idx.epoch();
    idx.replace(e, &all);
    assert_eq!(
        idx.len(),
        1,
        "only lv- LVs: not the snapshot or the thin pool"
    );
    assert!(idx.get(vol).is_some() && idx.get("tp").is_none());

    // A read that began before one of the driver's own changes is dropped.
    let before = idx.epoch();
    idx.forget(vol);
    idx.replace(before, &all);
    assert!(idx.get(vol).is_none(), "a stale full read came back");
    idx.store(before, vol, all.first());
    assert!(idx.get(vol).is_none(), "a stale single read came back");

    // Current reads are kept, and a read that found nothing drops the entry.
    let now = idx.epoch();
    idx.store(now, vol, all.first());
    assert!(idx.get(vol).is_some());
    idx.store(idx.epoch(), vol, None);
    assert!(idx.get(vol).is_none());
    idx.put(all[0].clone());
    assert_eq!(idx.get(vol).unwrap().size, 64 * MI);
    idx.put(all[1].clone());
    assert!(idx.get(&all[1].name).is_none(), "snapshots are not indexed");
}

#[test]
fn a_thin_index_adds_up_what_the_thin_pool_promised_until_a_change_it_does_not_mirror() {
    let all = lvm::parse_lvs(LVS_THIN).unwrap();
    let vol = "lv-0123456789abcdef0123456789abcdef";
    let new = "lv-ffffffffffffffffffffffffffffffff";
    let idx = LvIndex::new(Some(&ThinPoolName::new("tp")));
    assert_eq!(idx.promised_without(new), None, "nothing read yet");
    idx.replace(idx.epoch(), &all);
    // The volume and the snapshot (thin LVs of tp), not the pool itself.
    assert_eq!(idx.promised_without(new), Some(128 * MI));
    assert_eq!(
        idx.promised_without(vol),
        None,
        "a name already promised asks lvs"
    );
    // The driver's own create and thin delete are mirrored.
    idx.promise(new, 32 * MI);
    assert_eq!(idx.promised_without("lv-x"), Some(160 * MI));
    idx.leaving(vol);
    assert_eq!(
        idx.promised_without("lv-x"),
        Some(160 * MI),
        "not removed yet"
    );
    idx.removed(vol);
    assert_eq!(idx.promised_without("lv-x"), Some(96 * MI));
    // Anything else makes it unknown until the next full read.
    let before = idx.epoch();
    idx.unknown_promises();
    assert_eq!(idx.promised_without("lv-x"), None);
    idx.replace(before, &all);
    assert_eq!(
        idx.promised_without("lv-x"),
        None,
        "a stale full read came back"
    );
    idx.replace(idx.epoch(), &all);
    idx.forget(new);
    assert_eq!(
        idx.promised_without("lv-x"),
        None,
        "forget drops the total too"
    );
    // A thick pool's index has no total.
    let thick = LvIndex::new(None);
    thick.replace(thick.epoch(), &all);
    assert_eq!(thick.promised_without("lv-x"), None);
}

#[test]
fn one_lvs_reports_the_lvs_and_their_vg() {
    let json = r#"{"report":[{"lv":[
        {"lv_name":"tp","vg_name":"fxvg","lv_size":"268435456","lv_tags":"","lv_attr":"twi-aotz--","pool_lv":"","origin":"","data_percent":"6.62","metadata_percent":"11.23","lv_path":"","lv_device_open":"open","lv_time":"2026-11-22 04:26:30 +0000","vg_size":"2143289344","vg_free":"1866465280","vg_extent_size":"4194304","vg_free_count":"445","vg_tags":"a,b"}
    ]}]}"#;
    let (lvs, vg) = lvm::parse_lvs_and_vg(json).unwrap();
    assert_eq!(lvs.len(), 1);
    assert!(lvs[0].is_thin_pool());
    let vg = vg.unwrap();
    assert_eq!(vg.name, "fxvg");
    assert_eq!(vg.size, 2_143_289_344);
    assert_eq!(vg.free, 1_866_465_280);
    assert_eq!(vg.extent_size, 4 * MI);
    assert_eq!(vg.free_extents, 445);
    assert_eq!(vg.tags, ["a", "b"]);
    let (none, no_vg) = lvm::parse_lvs_and_vg(r#"{"report":[{"lv":[]}]}"#).unwrap();
    assert!(none.is_empty() && no_vg.is_none());
}
