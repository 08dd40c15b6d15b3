//! Recovery: what was acknowledged survives a crash, a torn last record that was never
//! acknowledged is dropped, a damaged acknowledged record refuses to start, checkpoints bound replay, the backstop refuses a
//! second sale.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::Arc;

use boxoffice_engine::raw::{open_db, section_stream, sled};
use boxoffice_engine::{
    Engine, EngineError, EventId, HoldRequest, HoldStatus, HoldView, ManualClock, Rejection,
    SeatId, SectionId, Selection, StorageError, UserId,
};
use boxoffice_tests::{T0_MS, config, event, ga, open, reserved};

fn best(event: &str, section: &str, q: u32, user: &str, key: &str) -> HoldRequest {
    HoldRequest {
        event_id: EventId::from(event),
        user_id: UserId::from(user),
        idempotency_key: key.into(),
        selection: Selection::BestAvailable {
            section: Some(SectionId::from(section)),
            quantity: q,
        },
        access_code: String::new(),
    }
}

use boxoffice_tests::pay_with_visa as confirm;

/// Everything observable about the engine's state, for before/after comparisons.
async fn state_of(engine: &Engine, users: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for e in engine.events().expect("the engine serves") {
        for s in &e.sections {
            let core = engine
                .inspect_section(&e.event_id, &s.spec.section_id)
                .await
                .unwrap();
            core.check_invariants().unwrap();
            out.push(format!(
                "{}/{} {:?}",
                e.event_id,
                s.spec.section_id,
                core.counts()
            ));
            let snap = core.snapshot(0);
            out.push(format!("{:?}", snap.seats));
            let mut holds: Vec<String> = core
                .holds_for_ledger()
                .map(|(v, _, _, order)| format!("{v:?} {:?}", order.map(|(_, o)| o)))
                .collect();
            holds.sort();
            out.extend(holds);
        }
        for u in users {
            let used = engine
                .user_usage(&e.event_id, &UserId::from(*u))
                .await
                .unwrap();
            out.push(format!("{} {u} uses {used}", e.event_id));
        }
    }
    out
}

/// Builds a sale with holds in every state; returns the live holds for later checks.
async fn build_state(engine: &Engine, clock: &ManualClock) -> Vec<HoldView> {
    engine
        .create_event(event(
            "e1",
            vec![reserved("orch", 4, 10, 9_000), ga("floor", 50, 4_000)],
            60_000,
            6,
        ))
        .await
        .unwrap();
    let mut live = Vec::new();
    let a = engine
        .hold(best("e1", "orch", 2, "ann", "k1"))
        .await
        .unwrap();
    engine.confirm(confirm(&a, "c1")).await.unwrap();
    let b = engine
        .hold(best("e1", "floor", 3, "bob", "k2"))
        .await
        .unwrap();
    engine.release(&b.hold_id, &b.user_id).await.unwrap();
    clock.advance_ms(1_000);
    let c = engine
        .hold(best("e1", "orch", 4, "cat", "k3"))
        .await
        .unwrap();
    live.push(c);
    let d = engine
        .hold(best("e1", "floor", 5, "dan", ""))
        .await
        .unwrap();
    engine.confirm(confirm(&d, "")).await.unwrap();
    // A rejection given as a first answer is recorded too.
    let rejected = engine.hold(best("e1", "floor", 7, "eve", "k4")).await;
    assert!(matches!(
        rejected,
        Err(EngineError::Rejected(Rejection::UserLimit { .. }))
    ));
    let x = engine
        .hold(HoldRequest {
            event_id: EventId::from("e1"),
            user_id: UserId::from("eve"),
            idempotency_key: "k5".into(),
            selection: Selection::Seats(vec![SeatId::from("orch:D:1"), SeatId::from("orch:D:2")]),
            access_code: String::new(),
        })
        .await
        .unwrap();
    live.push(x);
    // One that expires: hold, then let its TTL pass and sweep.
    let _e = engine
        .hold(best("e1", "floor", 1, "fay", "k6"))
        .await
        .unwrap();
    live
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_and_reopen_rebuilds_identical_state() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let users = ["ann", "bob", "cat", "dan", "eve", "fay"];
    let engine = open(dir.path(), &clock).await;
    let live = build_state(&engine, &clock).await;
    let before = state_of(&engine, &users).await;
    engine.crash().await;
    drop(engine);

    let engine = open(dir.path(), &clock).await;
    assert_eq!(state_of(&engine, &users).await, before);
    assert_eq!(engine.recovery_report().events, 1);
    assert_eq!(engine.recovery_report().sections, 2);
    // Holds keep their original deadlines.
    for h in &live {
        let now = engine.get_hold(&h.hold_id).await.unwrap();
        assert_eq!(now.expires_at_ms, h.expires_at_ms);
        assert_eq!(now.status, HoldStatus::Held);
    }
    // Idempotency survives: the same key and request replay the first answer (success and
    // rejection alike); a different request with the key is refused.
    let replay = engine
        .hold(best("e1", "orch", 4, "cat", "k3"))
        .await
        .unwrap();
    assert_eq!(replay, live[0]);
    let replay = engine.hold(best("e1", "floor", 7, "eve", "k4")).await;
    assert!(matches!(
        replay,
        Err(EngineError::Rejected(Rejection::UserLimit {
            limit: 6,
            used: 0
        }))
    ));
    let reused = engine.hold(best("e1", "floor", 1, "cat", "k3")).await;
    assert_eq!(reused, Err(Rejection::IdempotencyKeyReused.into()));
    assert_eq!(
        state_of(&engine, &users).await,
        before,
        "replays changed nothing"
    );

    // Past the deadline the recovered holds expire, and their quota comes back.
    clock.advance_ms(60_000);
    let expired = engine.expire_due(1_000).await.unwrap();
    assert_eq!(expired.len(), 3);
    assert_eq!(
        engine
            .user_usage(&EventId::from("e1"), &UserId::from("cat"))
            .await
            .unwrap(),
        0
    );
    engine.shutdown().await;
}

/// Event `e2` with a section `floor` of 100 places, and five holds of one place in it (a
/// record each).
async fn five_holds(engine: &Engine) {
    engine
        .create_event(event("e2", vec![ga("floor", 100, 1)], 60_000, 4))
        .await
        .unwrap();
    for u in 0..5 {
        engine
            .hold(best("e2", "floor", 1, &format!("u{u}"), ""))
            .await
            .unwrap();
    }
}

/// Builds a little state, stops, and returns the section stream's record keys and values.
async fn log_of_one_section(dir: &std::path::Path) -> (Vec<(sled::IVec, sled::IVec)>, String) {
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir, &clock).await;
    five_holds(&engine).await;
    engine.crash().await;
    drop(engine);
    let name = section_stream(&EventId::from("e2"), &SectionId::from("floor"));
    let db = open_db(dir).unwrap();
    let tree = db.open_tree(&name).unwrap();
    let records = tree.iter().map(|r| r.unwrap()).collect();
    (records, name)
}

fn rewrite(dir: &std::path::Path, name: &str, key: &[u8], value: &[u8]) {
    let db = open_db(dir).unwrap();
    let tree = db.open_tree(name).unwrap();
    tree.insert(key, value).unwrap();
    db.flush().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_last_record_past_the_mark_is_dropped_at_any_byte() {
    let probe = tempfile::tempdir().unwrap();
    let (records, _) = log_of_one_section(probe.path()).await;
    assert_eq!(records.len(), 5);
    let last_len = records[4].1.len();
    for cut in [0, 1, 4, 5, last_len / 2, last_len - 1] {
        let dir = tempfile::tempdir().unwrap();
        let (records, name) = log_of_one_section(dir.path()).await;
        // A sixth record was being written when the process died: it was never acknowledged
        // (the superblock's mark for the stream is 5), and only part of it reached the file.
        let value = &records[4].1;
        rewrite(dir.path(), &name, &6u64.to_be_bytes(), &value[..cut]);
        let clock = Arc::new(ManualClock::new(T0_MS));
        let engine = open(dir.path(), &clock).await;
        let report = engine.recovery_report();
        assert_eq!(report.torn_tails_dropped, 1, "cut at {cut}");
        assert!(report.integrity.damage.is_empty(), "{report:?}");
        let s = &engine.event(&EventId::from("e2")).unwrap().sections[0];
        assert_eq!(
            (s.held, s.available),
            (5, 95),
            "every acknowledged hold survives, cut at {cut}"
        );
        // The engine goes on from there: the next record takes the torn one's place.
        engine
            .hold(best("e2", "floor", 1, "late", ""))
            .await
            .unwrap();
        engine.crash().await;
        drop(engine);
        let engine = open(dir.path(), &clock).await;
        assert_eq!(
            engine.event(&EventId::from("e2")).unwrap().sections[0].held,
            6
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_acknowledged_last_record_refuses_to_start_and_names_it() {
    for cut in [0usize, 3, 9] {
        let dir = tempfile::tempdir().unwrap();
        let (records, name) = log_of_one_section(dir.path()).await;
        let (key, value) = &records[4];
        rewrite(dir.path(), &name, key, &value[..cut.min(value.len() - 1)]);
        let clock = Arc::new(ManualClock::new(T0_MS));
        let err = Engine::open(config(dir.path(), &clock))
            .await
            .err()
            .unwrap();
        let message = err.to_string();
        assert!(
            matches!(err, EngineError::Storage(StorageError::Damaged { .. }))
                && message.contains("section/e2/floor")
                && message.contains("sequence 5"),
            "cut at {cut}: {message}"
        );
    }
}

/// A cluster node's store (a key-value store whose every write is whole, with no superblock of
/// its own: its Raft log is the durable record) never drops a bad last record as torn: a crash
/// cannot tear one there, so it is damage, named, even with no marks to say it was
/// acknowledged. (The simulation found a node that restarted after a bit flipped in its last
/// waitlist record and silently lost an acknowledged entry.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_stores_bad_last_record_is_damage_not_a_torn_write() {
    use boxoffice_engine::store::{Kv, KvSink, SimKv};
    let disk = SimKv::new();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let open_on = |disk: &SimKv| {
        let mut c = config(std::path::Path::new(""), &clock);
        c.sink = Some(Arc::new(KvSink::new(Arc::new(disk.clone())).unwrap()));
        Engine::open(c)
    };
    let engine = open_on(&disk).await.unwrap();
    five_holds(&engine).await;
    engine.shutdown().await;
    let name = section_stream(&EventId::from("e2"), &SectionId::from("floor"));
    let tree = disk.tree(&name).unwrap();
    let records = tree.pairs().unwrap();
    let (key, value) = records.last().unwrap().clone();
    // Cut short, as a torn write would be on a store that can tear one.
    tree.insert(&key, &value[..value.len() / 2]).unwrap();
    disk.sync().unwrap();
    let err = open_on(&disk).await.err().unwrap();
    let message = err.to_string();
    assert!(
        matches!(err, EngineError::Storage(StorageError::Damaged { .. }))
            && message.contains("section/e2/floor")
            && message.contains(&format!("sequence {}", records.len())),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_middle_record_refuses_to_start_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let (records, name) = log_of_one_section(dir.path()).await;
    let (key, value) = &records[2];
    let mut bad = value.to_vec();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    rewrite(dir.path(), &name, key, &bad);
    let clock = Arc::new(ManualClock::new(T0_MS));
    let err = Engine::open(config(dir.path(), &clock))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            &err,
            EngineError::Storage(StorageError::Damaged { count: 1, .. })
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("section/e2/floor") && message.contains("sequence 3"),
        "{message}"
    );
    // Refused means untouched: the damaged record is still there, and still refused.
    let err = Engine::open(config(dir.path(), &clock))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("sequence 3"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_bound_replay_and_keep_everything() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let mut cfg = config(dir.path(), &clock);
    cfg.checkpoint_every_records = 10;
    let engine = Engine::open(cfg.clone()).await.unwrap();
    engine
        .create_event(event("e3", vec![reserved("orch", 5, 10, 100)], 60_000, 4))
        .await
        .unwrap();
    let mut holds = Vec::new();
    for u in 0..25 {
        let h = engine
            .hold(best("e3", "orch", 2, &format!("u{u}"), &format!("k{u}")))
            .await
            .unwrap();
        if u % 3 == 0 {
            engine.confirm(confirm(&h, "")).await.unwrap();
        }
        holds.push(h);
    }
    let users: Vec<String> = (0..25).map(|u| format!("u{u}")).collect();
    let users: Vec<&str> = users.iter().map(String::as_str).collect();
    let before = state_of(&engine, &users).await;
    engine.crash().await;
    drop(engine);

    let engine = Engine::open(cfg).await.unwrap();
    let report = engine.recovery_report();
    assert!(report.checkpoints_loaded >= 1, "{report:?}");
    assert!(
        report.records_replayed < 10,
        "replay starts at the last checkpoint: {report:?}"
    );
    assert_eq!(state_of(&engine, &users).await, before);
    // Idempotency answers made before the checkpoint still replay.
    let replay = engine
        .hold(best("e3", "orch", 2, "u0", "k0"))
        .await
        .unwrap();
    assert_eq!(replay, holds[0]);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backstop_refuses_a_second_sale_and_the_engine_stops() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("e4", vec![reserved("orch", 1, 4, 100)], 60_000, 4))
        .await
        .unwrap();
    let h = engine
        .hold(HoldRequest {
            event_id: EventId::from("e4"),
            user_id: UserId::from("ann"),
            idempotency_key: String::new(),
            selection: Selection::Seats(vec![SeatId::from("orch:A:1")]),
            access_code: String::new(),
        })
        .await
        .unwrap();
    // Plant a sale of the same seat by another hold, as a buggy actor would have left it.
    engine
        .raw_db()
        .open_tree("sold")
        .unwrap()
        .insert("e4/orch/orch:A:1", "e4.orch.hSOMEONEELSE")
        .unwrap();
    let refused = engine.confirm(confirm(&h, "")).await;
    assert!(
        matches!(
            refused,
            Err(EngineError::Storage(StorageError::BackstopRefused { ref key })) if key == "e4/orch/orch:A:1"
        ),
        "{refused:?}"
    );
    // Fail-stop: nothing more is acknowledged.
    let after = engine.hold(best("e4", "orch", 1, "bob", "")).await;
    assert!(matches!(after, Err(EngineError::Storage(_))), "{after:?}");
    engine.crash().await;
    drop(engine);
    // The refused confirm never reached the log: on restart the hold is still held, the planted
    // claim (no confirm behind it, in a whole log) is set aside, and the seat can be confirmed
    // once.
    let engine = open(dir.path(), &clock).await;
    assert_eq!(engine.recovery_report().claims_set_aside, 1);
    assert_eq!(
        engine.get_hold(&h.hold_id).await.unwrap().status,
        HoldStatus::Held
    );
    let order = engine.confirm(confirm(&h, "")).await.unwrap();
    assert_eq!(order.tickets[0].seat_id, Some(SeatId::from("orch:A:1")));
    engine.shutdown().await;
}

/// Retention across a restart: released holds leave their section one idempotency window after
/// they ended (at the section's first record after that), checkpoints then carry only what is
/// left, and the engine rebuilt from checkpoint + records forgets exactly the same holds; keys
/// and recorded rejections older than the window are new requests, before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgotten_holds_stay_forgotten_after_a_restart_and_checkpoints_keep_only_live_state() {
    const WINDOW_MS: u64 = 60_000;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let mut cfg = config(dir.path(), &clock);
    cfg.checkpoint_every_records = 10;
    cfg.idempotency_window = std::time::Duration::from_millis(WINDOW_MS);
    let engine = Engine::open(cfg.clone()).await.unwrap();
    engine
        .create_event(event("e4", vec![ga("floor", 100, 100)], 30_000, 4))
        .await
        .unwrap();
    let cycle = |user: String, key: String| {
        let engine = engine.clone();
        async move {
            let h = engine
                .hold(best("e4", "floor", 1, &user, &key))
                .await
                .unwrap();
            engine.release(&h.hold_id, &h.user_id).await.unwrap();
            h
        }
    };
    let mut old = Vec::new();
    for i in 0..30 {
        old.push(cycle(format!("u{}", i % 5), format!("k{i}")).await);
    }
    let bought = engine
        .hold(best("e4", "floor", 1, "buyer", "b"))
        .await
        .unwrap();
    let order = engine.confirm(confirm(&bought, "pay")).await.unwrap();
    let refused = engine.hold(best("e4", "floor", 5, "buyer", "big")).await;
    assert!(matches!(
        refused,
        Err(EngineError::Rejected(Rejection::UserLimit { .. }))
    ));
    let remembered = engine.remembered().await.unwrap();
    assert_eq!((remembered.holds, remembered.ended_holds), (31, 30));
    assert_eq!(
        engine.hold(best("e4", "floor", 1, "buyer", "big")).await,
        Err(Rejection::IdempotencyKeyReused.into())
    );

    // One window later the clock alone forgets nothing: a record does.
    clock.advance_ms(WINDOW_MS);
    assert_eq!(
        engine.get_hold(&old[0].hold_id).await.unwrap().status,
        HoldStatus::Released
    );
    let mut recent = Vec::new();
    for i in 0..12 {
        recent.push(cycle(format!("v{i}"), format!("r{i}")).await);
    }
    for h in &old {
        assert_eq!(
            engine.get_hold(&h.hold_id).await,
            Err(Rejection::HoldNotFound.into())
        );
    }
    assert_eq!(
        engine.release(&old[0].hold_id, &old[0].user_id).await,
        Err(Rejection::HoldNotFound.into())
    );
    let remembered = engine.remembered().await.unwrap();
    assert_eq!((remembered.holds, remembered.ended_holds), (13, 12));
    // Keys older than the window are new requests: another hold, another request with "big",
    // and a confirm key that no longer replays its order.
    let again = engine
        .hold(best("e4", "floor", 1, "u0", "k0"))
        .await
        .unwrap();
    assert_ne!(again.hold_id, old[0].hold_id);
    engine
        .release(&again.hold_id, &again.user_id)
        .await
        .unwrap();
    // (Inside the window this other request with "big" would be IDEMPOTENCY_KEY_REUSED.)
    let big = engine
        .hold(best("e4", "floor", 1, "buyer", "big"))
        .await
        .unwrap();
    engine.release(&big.hold_id, &big.user_id).await.unwrap();
    assert_eq!(
        engine.confirm(confirm(&bought, "pay")).await,
        Err(Rejection::HoldNotActive.into())
    );
    assert_eq!(
        engine.get_order(&order.order_id).await.unwrap(),
        order,
        "orders stay"
    );

    let users: Vec<String> = (0..5)
        .map(|u| format!("u{u}"))
        .chain((0..12).map(|v| format!("v{v}")))
        .chain(["buyer".to_owned()])
        .collect();
    let users: Vec<&str> = users.iter().map(String::as_str).collect();
    let before = state_of(&engine, &users).await;
    let remembered = engine.remembered().await.unwrap();
    engine.crash().await;
    drop(engine);

    // The section's checkpoint (written after the forgetting) carries only what is left.
    {
        let db = open_db(dir.path()).unwrap();
        let name = section_stream(&EventId::from("e4"), &SectionId::from("floor"));
        let blob = db
            .open_tree("checkpoints")
            .unwrap()
            .get(name)
            .unwrap()
            .unwrap();
        let (_, state): (u64, Vec<u8>) = boxoffice_engine::codec::decode(&blob).unwrap();
        let core = boxoffice_engine::SectionCore::from_checkpoint(&state).unwrap();
        let (holds, _) = core.remembered();
        assert!(holds <= remembered.holds, "{holds} holds in the checkpoint");
        assert!(old.iter().all(|h| core.hold_view(&h.hold_id).is_none()));
    }

    let engine = Engine::open(cfg).await.unwrap();
    assert!(engine.recovery_report().checkpoints_loaded >= 1);
    assert_eq!(state_of(&engine, &users).await, before);
    let after = engine.remembered().await.unwrap();
    assert_eq!(
        (after.holds, after.ended_holds),
        (remembered.holds, remembered.ended_holds)
    );
    assert_eq!(
        engine.get_hold(&old[5].hold_id).await,
        Err(Rejection::HoldNotFound.into())
    );
    // A key inside the window still replays after the restart.
    let replay = engine
        .hold(best("e4", "floor", 1, "v3", "r3"))
        .await
        .unwrap();
    assert_eq!(replay, recent[3]);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_with_a_bad_idempotency_window_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let mut cfg = config(dir.path(), &clock);
    cfg.idempotency_window = std::time::Duration::from_millis(999);
    match Engine::open(cfg).await {
        Err(EngineError::Rejected(r)) => assert_eq!(r.field(), Some("idempotency_window")),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("opened with a window under one second"),
    }
}
