//! The engine's seams at work: the log in a `MemorySink` that fails an fsync, and supervised
//! actors that panic (restarted from their log, or the engine stops visibly).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::Arc;

use boxoffice_engine::{
    ACTOR_RESTARTS_MAX, Engine, EngineConfig, EngineError, EventId, HoldStatus, HoldView,
    ManualClock, MemorySink, Rejection, SectionId, StorageError, UserId, WaitlistState,
};
use boxoffice_tests::wait::{PATIENCE, periodic_check};
use boxoffice_tests::{T0_MS, any_section, event, ga, open};

/// Waits until the engine has restarted `n` actors in all.
async fn restarted(engine: &Engine, n: u64) {
    periodic_check("the actor is restarted", PATIENCE, async || {
        engine.actor_restarts() == n
    })
    .await;
}

/// Waits until the engine says it stopped; returns why.
async fn stopped(engine: &Engine) -> String {
    periodic_check("the engine says it stopped", PATIENCE, async || {
        engine.stopped()
    })
    .await
}

fn memory_config(sink: &Arc<MemorySink>, clock: &Arc<ManualClock>) -> EngineConfig {
    let mut c = EngineConfig::with_sink(sink.clone()).unwrap();
    c.clock = clock.clone();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_acknowledges_nothing_of_its_batch() {
    let sink = MemorySink::new();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let config = memory_config(&sink, &clock);
    let engine = Engine::open(config.clone()).await.unwrap();
    engine
        .create_event(event("fs", vec![ga("ga", 10_000, 100)], 60_000, 100))
        .await
        .unwrap();
    // Waves of concurrent holds, each wave awaited (so each needs at least one sync of its own):
    // the 4th sync from now fails, in the middle of the stream of batches.
    sink.fail_sync_after(4);
    let mut acked: Vec<HoldView> = Vec::new();
    let mut refused = 0usize;
    let mut failed_in_wave = None;
    for wave in 0..10 {
        let calls = (0..10).map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move {
                engine
                    .hold(any_section("fs", &format!("w{wave}-u{i}"), 1))
                    .await
            })
        });
        for r in futures_join(calls).await {
            match r {
                Ok(view) => {
                    assert!(
                        failed_in_wave.is_none_or(|w| w == wave),
                        "wave {wave} was acknowledged after the sync failed in an earlier wave"
                    );
                    acked.push(view);
                }
                Err(EngineError::Storage(StorageError::Halted(why))) => {
                    assert!(
                        why.contains("injected fsync failure"),
                        "refused for the failed sync, not for something else: {why}"
                    );
                    failed_in_wave.get_or_insert(wave);
                    refused += 1;
                }
                Err(other) => panic!("unexpected answer: {other:?}"),
            }
        }
    }
    assert_eq!(sink.failed_syncs(), 1, "exactly one sync failed");
    let failed_in_wave = failed_in_wave.expect("the failed sync's batch had callers");
    assert!(
        failed_in_wave < 9 && refused >= 10 * (9 - failed_in_wave),
        "every wave after the failure was refused"
    );
    assert!(
        !acked.is_empty(),
        "batches before the failure were acknowledged"
    );
    // Fail-stop: the engine says why and takes nothing more.
    assert!(engine.stopped().is_some_and(|r| r.contains("fsync")));
    assert!(!engine.is_ready());
    assert!(engine.hold(any_section("fs", "late", 1)).await.is_err());
    // A crash loses everything after the last good sync; what was acknowledged is all there.
    engine.crash().await;
    sink.lose_unsynced();
    let engine = Engine::open(config).await.unwrap();
    for h in &acked {
        let now = engine.get_hold(&h.hold_id).await.unwrap();
        assert_eq!(
            now.status,
            HoldStatus::Held,
            "acknowledged hold {} lost",
            h.hold_id
        );
    }
    let view = engine.event(&EventId::from("fs")).unwrap();
    assert_eq!(
        view.sections[0].held as usize,
        acked.len(),
        "no hold of the failed batch (never acknowledged) survived as held"
    );
    assert!(engine.invariant_violations().await.unwrap().is_empty());
    engine.shutdown().await;
}

/// A read never counts a change that is not durable yet: a section publishes a batch's
/// snapshot once the batch is durable, so a read while its fsync runs (a batch a crash would
/// still lose) shows the state before it (simulation seeds 1037, 1485 and 2470: a leader
/// published at seal, a read counted a sale that its crash then lost, and the next leader's
/// count went back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_never_counts_a_change_before_it_is_durable() {
    let sink = MemorySink::new();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = Engine::open(memory_config(&sink, &clock)).await.unwrap();
    engine
        .create_event(event("rd", vec![ga("ga", 10, 10)], 60_000, 10))
        .await
        .unwrap();
    engine.hold(any_section("rd", "first", 2)).await.unwrap();
    let counts = |engine: &Engine| {
        let s = &engine.event(&EventId::from("rd")).unwrap().sections[0];
        (s.available, s.held, s.sold)
    };
    assert_eq!(
        counts(&engine),
        (8, 2, 0),
        "an acknowledged hold is counted"
    );
    // The next sync takes 2 s: the batch is written (not durable) for that long.
    sink.disk()
        .set_sync_latency(std::time::Duration::from_secs(2));
    let in_flight = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.hold(any_section("rd", "second", 3)).await })
    };
    periodic_check(
        "the batch is written, its sync not done",
        PATIENCE,
        async || sink.disk().unsynced_writes() > 0,
    )
    .await;
    assert_eq!(
        counts(&engine),
        (8, 2, 0),
        "a hold still on its way to disk is not counted"
    );
    in_flight.await.unwrap().unwrap();
    assert_eq!(counts(&engine), (5, 5, 0), "counted once durable");
    engine.shutdown().await;
}

async fn futures_join<T>(calls: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_section_actor_that_panics_is_restarted_from_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("sp", vec![ga("ga", 100, 100)], 60_000, 10))
        .await
        .unwrap();
    let before = engine.hold(any_section("sp", "u1", 3)).await.unwrap();
    let (ev, sec) = (EventId::from("sp"), SectionId::from("ga"));
    // Holds race the panic: some are decided before it, some are queued behind it in the dying
    // actor's mailbox, some reach the restarted actor.
    let race = |range: std::ops::Range<u32>| {
        range
            .map(|i| {
                let engine = engine.clone();
                tokio::spawn(async move {
                    let user = format!("c{i}");
                    (user.clone(), engine.hold(any_section("sp", &user, 1)).await)
                })
            })
            .collect::<Vec<_>>()
    };
    let mut racing = race(0..20);
    engine.panic_section(&ev, &sec).await.unwrap();
    racing.extend(race(20..40));
    let mut acked = Vec::new();
    let mut refused = Vec::new();
    for (user, r) in futures_join(racing.into_iter()).await {
        match r {
            Ok(h) => acked.push((user, h)),
            Err(EngineError::NotReady) => refused.push(user),
            Err(other) => panic!("a hold racing a panic got {other:?}, not OK or NOT_READY"),
        }
    }
    restarted(&engine, 1).await;
    // The next hold in that section succeeds, and nothing acknowledged was lost.
    let after = engine.hold(any_section("sp", "u2", 2)).await.unwrap();
    assert_eq!(after.status, HoldStatus::Held);
    for (_, h) in acked.iter().chain([(String::new(), before.clone())].iter()) {
        assert_eq!(
            engine.get_hold(&h.hold_id).await.unwrap().status,
            HoldStatus::Held,
            "acknowledged hold {} lost in the restart",
            h.hold_id
        );
    }
    let s = &engine.event(&ev).unwrap().sections[0];
    let held = 3 + 2 + acked.len() as u32;
    assert_eq!(
        (s.held, s.available, s.sold),
        (held, 100 - held, 0),
        "the rebuilt section counts exactly the acknowledged holds"
    );
    // Quotas add up: a refused hold gave its place back, an acknowledged one kept it.
    for (user, _) in &acked {
        assert_eq!(
            engine
                .user_usage(&ev, &UserId::from(user.as_str()))
                .await
                .unwrap(),
            1
        );
    }
    for user in &refused {
        assert_eq!(
            engine
                .user_usage(&ev, &UserId::from(user.as_str()))
                .await
                .unwrap(),
            0,
            "{user} was refused NOT_READY but its quota stayed taken"
        );
    }
    // u1 holds 3 of 10: 8 more is refused, 7 is fine.
    match engine.hold(any_section("sp", "u1", 8)).await {
        Err(EngineError::Rejected(Rejection::UserLimit { limit: 10, used: 3 })) => {}
        other => panic!("expected USER_LIMIT, got {other:?}"),
    }
    engine.hold(any_section("sp", "u1", 7)).await.unwrap();
    assert!(engine.stopped().is_none());
    assert!(engine.is_ready());
    assert!(engine.invariant_violations().await.unwrap().is_empty());
    // And the restarted actor's writes survive a restart of the engine.
    engine.shutdown().await;
    drop(engine);
    let engine = open(dir.path(), &clock).await;
    assert_eq!(
        engine.get_hold(&after.hold_id).await.unwrap().status,
        HoldStatus::Held
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waitlist_actor_that_panics_is_restarted_with_its_entries() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("wp", vec![ga("ga", 1, 100)], 60_000, 4))
        .await
        .unwrap();
    let ev = EventId::from("wp");
    // The one place is held: the waitlist takes joins only for places that cannot be held.
    engine.hold(any_section("wp", "h", 1)).await.unwrap();
    let entry = engine
        .join_waitlist(&ev, &UserId::from("w1"), None, 1)
        .await
        .unwrap();
    engine.panic_waitlist().unwrap();
    restarted(&engine, 1).await;
    let again = engine.waitlist_entry(&entry.entry_id).await.unwrap();
    assert_eq!(again.state, WaitlistState::Waiting);
    assert_eq!(again.position, 1);
    let second = engine
        .join_waitlist(&ev, &UserId::from("w2"), None, 1)
        .await
        .unwrap();
    assert_eq!(second.position, 2);
    assert!(engine.stopped().is_none());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_shard_that_panics_stops_the_engine_visibly() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("lp", vec![ga("ga", 100, 100)], 60_000, 10))
        .await
        .unwrap();
    let held = engine.hold(any_section("lp", "u1", 2)).await.unwrap();
    let mut watch = engine.watch_stopped();
    engine.panic_ledger(&UserId::from("u1")).unwrap();
    let reason = stopped(&engine).await;
    assert_eq!(
        watch.wait_for(|s| s.is_some()).await.unwrap().as_deref(),
        Some(reason.as_str()),
        "watchers (health) hear the same reason"
    );
    assert!(reason.contains("ledger"), "{reason}");
    assert!(!engine.is_ready());
    // Every change is refused with the storage (fail-stop) error, never a silent NOT_READY.
    match engine.hold(any_section("lp", "u2", 1)).await {
        Err(EngineError::Storage(StorageError::Halted(r))) => assert!(r.contains("ledger")),
        other => panic!("expected a halted engine, got {other:?}"),
    }
    engine.shutdown().await;
    drop(engine);
    // What was acknowledged is there after a restart, and the engine serves again.
    let engine = open(dir.path(), &clock).await;
    assert_eq!(
        engine.get_hold(&held.hold_id).await.unwrap().status,
        HoldStatus::Held
    );
    assert!(engine.stopped().is_none());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_section_that_keeps_panicking_stops_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("kp", vec![ga("ga", 100, 100)], 60_000, 10))
        .await
        .unwrap();
    let (ev, sec) = (EventId::from("kp"), SectionId::from("ga"));
    for n in 1..=u64::from(ACTOR_RESTARTS_MAX) {
        engine.panic_section(&ev, &sec).await.unwrap();
        restarted(&engine, n).await;
    }
    engine.panic_section(&ev, &sec).await.unwrap();
    assert!(stopped(&engine).await.contains("panicked"));
    assert_eq!(
        engine.actor_restarts(),
        u64::from(ACTOR_RESTARTS_MAX),
        "no restart past the limit"
    );
    match engine.hold(any_section("kp", "u1", 1)).await {
        Err(EngineError::Storage(StorageError::Halted(why))) => assert!(why.contains("panicked")),
        other => panic!("expected the engine stopped visibly, got {other:?}"),
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_fails_stops_the_engine_and_its_reads() {
    for (fault, named) in [
        ("write error", "injected write failure"),
        ("fsync error", "injected fsync failure"),
        ("full disk", "No space left on device"),
    ] {
        let sink = MemorySink::new();
        let clock = Arc::new(ManualClock::new(T0_MS));
        let config = memory_config(&sink, &clock);
        let engine = Engine::open(config.clone()).await.unwrap();
        let ev = EventId::from("sf");
        engine
            .create_event(event("sf", vec![ga("ga", 10, 100)], 60_000, 10))
            .await
            .unwrap();
        let kept = engine.hold(any_section("sf", "u1", 1)).await.unwrap();
        match fault {
            "write error" => sink.fail_next_write(),
            "fsync error" => sink.fail_next_sync(),
            _ => sink.fill_disk(),
        }
        match engine.hold(any_section("sf", "u2", 2)).await {
            Err(EngineError::Storage(_)) => {}
            other => panic!("{fault}: the hold was answered {other:?}"),
        }
        let why = engine.stopped().unwrap_or_default();
        assert!(why.contains(named), "{fault}: the stop names it: {why}");
        // Nothing unacknowledged is shown: reads are refused, not served from the snapshot.
        assert!(
            matches!(engine.event(&ev), Err(EngineError::Storage(_))),
            "{fault}"
        );
        assert!(
            matches!(engine.seat_map(&ev, None), Err(EngineError::Storage(_))),
            "{fault}"
        );
        assert!(
            matches!(engine.events(), Err(EngineError::Storage(_))),
            "{fault}"
        );
        engine.crash().await;
        drop(engine);
        sink.free_disk();
        sink.lose_unsynced();
        let engine = Engine::open(config).await.unwrap();
        let s = &engine.event(&ev).unwrap().sections[0];
        assert_eq!(
            (s.held, s.available),
            (1, 9),
            "{fault}: only the acknowledged hold"
        );
        assert_eq!(
            engine.get_hold(&kept.hold_id).await.unwrap().status,
            HoldStatus::Held
        );
        engine.shutdown().await;
    }
}
