//! A damaged data dir: byte flips and truncations of sled's `db` file at offsets spread over the
//! whole file, a lost or damaged superblock. Every case ends in one of two ways: the engine
//! refuses to start and names the damage, or every acknowledged hold and order is there as it
//! was acknowledged. Never a start that silently lost something.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use boxoffice_engine::{
    Damage, Engine, EngineError, EventId, HoldId, HoldRequest, HoldStatus, ManualClock, OrderId,
    RecoveryMode, SectionId, Selection, StorageError, UserId, verify_log,
};
use boxoffice_tests::{T0_MS, config, event, ga, open, pay_with_visa, reserved};

/// What the client was told: every hold's last acknowledged status, every order's hold.
#[derive(Default)]
struct Acknowledged {
    holds: BTreeMap<HoldId, HoldStatus>,
    orders: BTreeMap<OrderId, HoldId>,
}

fn best(section: &str, q: u32, user: &str) -> HoldRequest {
    HoldRequest {
        event_id: EventId::from("show"),
        user_id: UserId::from(user),
        idempotency_key: format!("{user}-{section}"),
        selection: Selection::BestAvailable {
            section: Some(SectionId::from(section)),
            quantity: q,
        },
        access_code: String::new(),
    }
}

/// 150 holds over two sections; every fourth confirmed, every seventh released.
async fn build(dir: &Path) -> Acknowledged {
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir, &clock).await;
    engine
        .create_event(event(
            "show",
            vec![reserved("orch", 20, 20, 9_000), ga("floor", 1_000, 4_000)],
            600_000,
            4,
        ))
        .await
        .unwrap();
    let mut ack = Acknowledged::default();
    for i in 0..150 {
        let section = if i % 2 == 0 { "orch" } else { "floor" };
        let h = engine
            .hold(best(section, 1 + i % 2, &format!("fan{i}")))
            .await
            .unwrap();
        ack.holds.insert(h.hold_id.clone(), HoldStatus::Held);
        if i % 4 == 0 {
            let order = engine
                .confirm(pay_with_visa(&h, &format!("pay{i}")))
                .await
                .unwrap();
            ack.holds.insert(h.hold_id.clone(), HoldStatus::Confirmed);
            ack.orders.insert(order.order_id, h.hold_id);
        } else if i % 7 == 0 {
            engine.release(&h.hold_id, &h.user_id).await.unwrap();
            ack.holds.insert(h.hold_id, HoldStatus::Released);
        }
    }
    engine.shutdown().await;
    drop(engine);
    ack
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A copy of the data dir `base` with sled's `db` file cut to `len` bytes.
fn truncated_copy(base: &Path, len: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(base, dir.path());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("db"))
        .unwrap();
    f.set_len(len).unwrap();
    dir
}

/// How one damaged start ended.
#[derive(Debug)]
enum Outcome {
    /// Refused, with this message.
    Refused(String),
    /// Started, and every acknowledged record was there.
    Intact,
}

/// Opens the damaged dir and checks the promise; panics (with `what`) if it is broken.
async fn start_and_check(dir: &Path, ack: &Acknowledged, what: &str) -> Outcome {
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = match Engine::open(config(dir, &clock)).await {
        Err(e) => {
            let message = e.to_string();
            // Damage is named by recovery's checks (which stream, which records), never by an
            // error that merely failed to open the data dir.
            assert!(
                matches!(
                    e,
                    EngineError::Storage(
                        StorageError::Damaged { .. } | StorageError::Corrupt { .. }
                    )
                ),
                "{what}: refused without naming damage: {e:?}"
            );
            return Outcome::Refused(message);
        }
        Ok(engine) => engine,
    };
    for (hold_id, status) in &ack.holds {
        let found = engine.get_hold(hold_id).await;
        match found {
            Ok(h) => assert_eq!(
                h.status, *status,
                "{what}: hold {hold_id} changed after a start that reported nothing"
            ),
            Err(e) => panic!("{what}: acknowledged hold {hold_id} is gone ({e}), silently"),
        }
    }
    for (order_id, hold_id) in &ack.orders {
        let order = engine.get_order(order_id).await;
        assert!(
            order.as_ref().is_ok_and(|o| &o.hold_id == hold_id),
            "{what}: acknowledged order {order_id} is gone or changed: {order:?}"
        );
    }
    let violations = engine.invariant_violations().await.unwrap();
    assert!(violations.is_empty(), "{what}: {violations:?}");
    engine.shutdown().await;
    Outcome::Intact
}

/// Offsets spread over a file of `len` bytes: `n` evenly spaced, off any page boundary.
fn spread(len: u64, n: u64) -> Vec<u64> {
    (0..n).map(|i| (i * len / n + 37 * i) % len).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_flips_anywhere_in_the_log_refuse_or_lose_nothing() {
    let base = tempfile::tempdir().unwrap();
    let ack = build(base.path()).await;
    let len = std::fs::metadata(base.path().join("db")).unwrap().len();
    let (mut refused, mut intact) = (0, 0);
    for offset in spread(len, 24) {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(base.path(), dir.path());
        let db = dir.path().join("db");
        let mut bytes = std::fs::read(&db).unwrap();
        for b in &mut bytes[offset as usize..(offset as usize + 4).min(len as usize)] {
            *b ^= 0xA5;
        }
        std::fs::write(&db, &bytes).unwrap();
        let what = format!("4 bytes flipped at offset {offset} of {len}");
        match start_and_check(dir.path(), &ack, &what).await {
            Outcome::Refused(message) => {
                println!("{what}: {message}");
                refused += 1;
            }
            Outcome::Intact => intact += 1,
        }
    }
    println!("byte flips: {refused} refused with the damage named, {intact} with nothing lost");
    assert!(
        refused > 0,
        "flipping bytes all over the log must be noticed (the test would prove nothing otherwise)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncations_refuse_or_lose_nothing() {
    let base = tempfile::tempdir().unwrap();
    let ack = build(base.path()).await;
    let len = std::fs::metadata(base.path().join("db")).unwrap().len();
    let mut cuts: Vec<u64> = vec![1, 4096, 32 * 1024];
    cuts.extend((1..8).map(|i| len * i / 8));
    let mut refused = 0;
    for cut in cuts.into_iter().filter(|c| *c < len) {
        let dir = truncated_copy(base.path(), len - cut);
        let what = format!("{cut} bytes cut off the end of {len}");
        if let Outcome::Refused(message) = start_and_check(dir.path(), &ack, &what).await {
            refused += 1;
            println!("{what}: {message}");
        }
    }
    assert!(
        refused > 0,
        "cutting most of the log must be noticed (the test would prove nothing otherwise)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_superblock_or_log_is_named_and_one_torn_copy_is_not_damage() {
    let base = tempfile::tempdir().unwrap();
    let ack = build(base.path()).await;

    // Both superblock copies gone, the log intact: refused, named.
    let dir = tempfile::tempdir().unwrap();
    copy_dir(base.path(), dir.path());
    for f in ["superblock.0", "superblock.1"] {
        std::fs::remove_file(dir.path().join(f)).unwrap();
    }
    match start_and_check(dir.path(), &ack, "superblock deleted").await {
        Outcome::Refused(m) => assert!(m.contains("superblock missing"), "{m}"),
        Outcome::Intact => panic!("a log without its superblock started"),
    }

    // The log gone, the superblock kept: every stream's records are missing, named.
    let dir = tempfile::tempdir().unwrap();
    copy_dir(base.path(), dir.path());
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let p = entry.unwrap().path();
        if !p
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("superblock")
            && !p.file_name().unwrap().to_string_lossy().contains("ticket")
        {
            if p.is_dir() {
                std::fs::remove_dir_all(&p).unwrap();
            } else {
                std::fs::remove_file(&p).unwrap();
            }
        }
    }
    match start_and_check(dir.path(), &ack, "log deleted").await {
        Outcome::Refused(m) => assert!(
            m.contains("stream `catalog`: records at sequence 1 to 1 are missing"),
            "{m}"
        ),
        Outcome::Intact => panic!("an empty log started under a superblock that knew better"),
    }
    // Refused means untouched: reading the streams the superblock knows created none of them.
    let db = boxoffice_engine::raw::open_db(dir.path()).unwrap();
    let trees: Vec<String> = db
        .tree_names()
        .iter()
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    assert!(
        !trees
            .iter()
            .any(|n| n == "catalog" || n.starts_with("section/") || n.starts_with("ledger/")),
        "{trees:?}"
    );

    // One copy torn (as a crash mid-write leaves it): the other copy rules; nothing lost.
    let dir = tempfile::tempdir().unwrap();
    copy_dir(base.path(), dir.path());
    std::fs::write(dir.path().join("superblock.0"), b"torn").unwrap();
    assert!(matches!(
        start_and_check(dir.path(), &ack, "one superblock copy torn").await,
        Outcome::Intact
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_log_lists_damage_and_accept_damage_starts_and_remembers() {
    let base = tempfile::tempdir().unwrap();
    let ack = build(base.path()).await;
    let len = std::fs::metadata(base.path().join("db")).unwrap().len();
    // Cut the log where the claims of lost sales survive their orders (a fan may hold a
    // ticket for a seat the log no longer knows is sold). Each candidate is checked on a copy.
    let (dir, findings) = (1..8)
        .rev()
        .find_map(|eighths| {
            let dir = truncated_copy(base.path(), len * eighths / 8);
            let probe = tempfile::tempdir().unwrap();
            copy_dir(dir.path(), probe.path());
            let sink = boxoffice_engine::SledSink::open_without_evidence(
                probe.path(),
                std::time::Duration::from_secs(5),
            );
            let findings = verify_log(&sink.unwrap()).unwrap();
            let orphans = findings
                .damage
                .iter()
                .any(|d| matches!(d, Damage::OrphanClaim { .. }));
            orphans.then_some((dir, findings))
        })
        .expect("some cut leaves claims without their orders");
    assert!(
        findings
            .damage
            .iter()
            .any(|d| matches!(d, Damage::Missing { .. })),
        "{findings:?}"
    );
    // A strict start refuses with the same damage, and keeps sled's files as they were before
    // it opened them (sled wipes a damaged tail when it opens).
    let before = std::fs::read(dir.path().join("db")).unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let refused = Engine::open(config(dir.path(), &clock))
        .await
        .err()
        .unwrap();
    let EngineError::Storage(StorageError::Damaged {
        count,
        evidence: Some(kept),
        ..
    }) = &refused
    else {
        panic!("{refused:?}")
    };
    assert_eq!(*count, findings.damage.len());
    assert!(refused.to_string().contains(kept.as_str()), "{refused}");
    assert_eq!(
        std::fs::read(Path::new(kept).join("db")).unwrap(),
        before,
        "the evidence is the file as it was"
    );
    // The operator accepts: the engine starts with what is there, says what it found.
    let mut cfg = config(dir.path(), &clock);
    cfg.recovery_mode = RecoveryMode::AcceptDamage;
    let engine = Engine::open(cfg).await.unwrap();
    let report = engine.recovery_report();
    assert_eq!(report.integrity.damage, findings.damage);
    assert!(!report.integrity.actions.is_empty());
    assert!(engine.invariant_violations().await.unwrap().is_empty());
    let present = {
        let mut n = 0;
        for h in ack.holds.keys() {
            n += usize::from(engine.get_hold(h).await.is_ok());
        }
        n
    };
    assert!(present < ack.holds.len(), "part of the log is gone");
    // Every claim is still there, and every claimed place is out of sale: selling out what is
    // left never runs into the backstop (which would stop the engine).
    let withdrawn = report
        .integrity
        .actions
        .iter()
        .filter(|a| a.contains("withdrew seat") && a.contains("sale record is lost"))
        .count();
    let orphans = findings
        .damage
        .iter()
        .filter(|d| matches!(d, Damage::OrphanClaim { .. }))
        .count();
    assert_eq!(withdrawn, orphans, "{:#?}", report.integrity.actions);
    // The change stream tells what the withdrawals did: it ends with every place withdrawn
    // and every hold released to take its places out of sale, as the report lists them.
    let actions = &report.integrity.actions;
    let seats_withdrawn = actions
        .iter()
        .filter(|a| a.contains("withdrew seat"))
        .count();
    let released = actions
        .iter()
        .filter(|a| a.contains("released hold"))
        .count();
    assert!(seats_withdrawn > 0);
    let all = crate::changes::read_all(&engine, None, 1_000);
    use boxoffice_engine::changes::ChangeKind;
    let withdrawals = all
        .iter()
        .filter(|(_, c)| matches!(c.kind, ChangeKind::PlacesWithdrawn { .. }))
        .count();
    let noted = withdrawals + released;
    assert!(all.len() >= noted);
    let mut told = (0, 0);
    for (_, c) in &all[all.len() - noted..] {
        match &c.kind {
            ChangeKind::PlacesWithdrawn { quantity, .. } => told.0 += *quantity as usize,
            ChangeKind::HoldReleased(_) => told.1 += 1,
            other => panic!("the withdrawals' changes end the stream: {other:?}"),
        }
    }
    assert_eq!(told, (seats_withdrawn, released), "{actions:#?}");
    // Records were lost: every hold still live may have been paid for in them, so none is
    // left live and their places are out of sale too.
    for s in &engine.event(&EventId::from("show")).unwrap().sections {
        assert_eq!(s.held, 0, "{:?}", s.spec.section_id);
    }
    let mut sold_out = false;
    for i in 0..1_000 {
        let h = match engine.hold(best("orch", 1, &format!("late{i}"))).await {
            Ok(h) => h,
            Err(EngineError::Rejected(boxoffice_engine::Rejection::SoldOut)) => {
                sold_out = true;
                break;
            }
            Err(e) => panic!("selling out after accepted damage: {e:?}"),
        };
        engine.confirm(pay_with_visa(&h, "")).await.unwrap();
    }
    assert!(sold_out && engine.stopped().is_none());
    let findings_now = engine.reconcile().await.unwrap();
    assert!(
        findings_now
            .iter()
            .all(|f| matches!(f, boxoffice_engine::Finding::CapturedWithoutOrder { .. })),
        "only the lost orders' payments are unexplained: {findings_now:?}"
    );
    engine.shutdown().await;
    drop(engine);
    // Accepted once is accepted: a plain start now succeeds, and nothing new is reported.
    let engine = open(dir.path(), &clock).await;
    assert!(engine.recovery_report().integrity.damage.is_empty());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_catalog_lost_is_named_and_its_streams_are_only_noted() {
    let sink = boxoffice_engine::MemorySink::new();
    let cfg = boxoffice_engine::EngineConfig::with_sink(sink.clone()).unwrap();
    let engine = Engine::open(cfg).await.unwrap();
    engine
        .create_event(event("show", vec![ga("floor", 100, 4_000)], 600_000, 4))
        .await
        .unwrap();
    for i in 0..5 {
        engine
            .hold(best("floor", 1, &format!("fan{i}")))
            .await
            .unwrap();
    }
    engine.shutdown().await;
    use boxoffice_engine::LogSink as _;
    sink.stream("catalog").unwrap().remove(1).unwrap();
    let findings = verify_log(sink.as_ref()).unwrap();
    assert_eq!(
        findings.damage,
        vec![Damage::Missing {
            stream: "catalog".into(),
            from: 1,
            to: 1
        }],
        "only the catalog's record is damage; the section's records still verify"
    );
    assert!(
        findings
            .notes
            .iter()
            .any(|n| n.contains("section/show/floor") && n.contains("no event or shard reads it")),
        "{:?}",
        findings.notes
    );
}

/// A charge of the simulated payment provider's record that no longer decodes (its record is
/// part of the data dir; its check runs beside the log's replay): the start refuses and names
/// the table and the charge, changing nothing; an operator's `--accept-damage` start goes on,
/// with every acknowledged hold and order as it was (the log itself is whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_payment_record_refuses_to_start_and_is_accepted_on_request() {
    use boxoffice_engine::raw::open_db;
    use boxoffice_engine::store::names::PAYMENTS;
    let dir = tempfile::tempdir().unwrap();
    let ack = build(dir.path()).await;
    let damaged_key = {
        let db = open_db(dir.path()).unwrap();
        let table = db.open_tree(PAYMENTS).unwrap();
        let (key, _) = table.iter().next().unwrap().unwrap();
        table.insert(&key, &b"not a charge"[..]).unwrap();
        db.flush().unwrap();
        String::from_utf8_lossy(&key).into_owned()
    };
    let clock = Arc::new(ManualClock::new(T0_MS));
    for _ in 0..2 {
        let refused = Engine::open(config(dir.path(), &clock))
            .await
            .err()
            .unwrap();
        let message = refused.to_string();
        assert!(
            matches!(refused, EngineError::Storage(StorageError::Damaged { .. }))
                && message.contains("table `payments`")
                && message.contains(&damaged_key),
            "{message}"
        );
    }
    // Accepted: the start goes on with the log as it was (the charge stays as found).
    let mut cfg = config(dir.path(), &clock);
    cfg.recovery_mode = RecoveryMode::AcceptDamage;
    let what = "a damaged charge accepted";
    let engine = Engine::open(cfg).await.unwrap();
    for (hold_id, status) in &ack.holds {
        let h = engine.get_hold(hold_id).await.unwrap();
        assert_eq!(h.status, *status, "{what}: hold {hold_id}");
    }
    for (order_id, hold_id) in &ack.orders {
        let order = engine.get_order(order_id).await.unwrap();
        assert_eq!(&order.hold_id, hold_id, "{what}: order {order_id}");
    }
    assert!(engine.invariant_violations().await.unwrap().is_empty());
    engine.shutdown().await;
}

/// A whole start deletes its copy of sled's files (off the start's path), and a copy an earlier
/// process dropped but did not get to delete: nothing is left behind but the log itself.
#[tokio::test]
async fn a_whole_start_leaves_no_copy_of_the_log_behind() {
    let dir = tempfile::tempdir().unwrap();
    let ack = build(dir.path()).await;
    let left = dir.path().join("pre-open-dropped-17");
    std::fs::create_dir_all(left.join("blobs")).unwrap();
    std::fs::write(left.join("db"), vec![7u8; 4096]).unwrap();
    std::fs::write(left.join("blobs").join("3"), b"x").unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    for (hold, status) in &ack.holds {
        assert_eq!(engine.get_hold(hold).await.unwrap().status, *status);
    }
    engine.shutdown().await;
    drop(engine);
    let copies = || -> Vec<String> {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("pre-open"))
            .collect()
    };
    // Deleted on a thread of its own: waited for (a bound on a failure, not a time asserted).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !copies().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(copies(), Vec::<String>::new());
    assert!(dir.path().join("db").is_file());
}
