//! The sweeper and the waitlist, with injected time (a manual clock; the sweeper is poked with
//! `Sweep` and synchronised with `Sync`, no sleeps): holds expire within 1 s of their deadline
//! and never before; confirm racing expiry has exactly one outcome; a restart keeps deadlines
//! and expires the overdue at once; waitlist offers go in order, all or nothing, pass on when
//! they lapse, never exceed the per-user limit, and survive a restart.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::Arc;

use boxoffice_engine::{
    Clock, ConfirmRequest, Engine, EngineError, EventId, HoldStatus, HoldView, ManualClock,
    Rejection, SectionId, UserId, WaitlistState,
};
use boxoffice_sweeper::{SweeperConfig, SweeperMsg, start, sync};
use boxoffice_tests::{T0_MS, any_section as best, config, event, ga, open, pay_with_visa};
use ractor::ActorRef;

async fn poke(s: &ActorRef<SweeperMsg>) -> boxoffice_sweeper::SweeperStats {
    s.cast(SweeperMsg::Sweep).unwrap();
    sync(s).await.unwrap()
}

async fn held(engine: &Engine, event: &str) -> u32 {
    let e = EventId::from(event);
    let mut n = 0;
    for s in engine.event(&e).unwrap().sections {
        let core = engine
            .inspect_section(&e, &s.spec.section_id)
            .await
            .unwrap();
        core.check_invariants().unwrap();
        n += core.counts().2;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_holds_expire_within_a_second_and_never_early() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("x", vec![ga("g", 10_000, 1)], 30_000, 4))
        .await
        .unwrap();
    // 10,000 holds placed over about 30 s of clock: deadlines spread over 30 s.
    let mut deadlines = Vec::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for batch in 0..500 {
        let mut tasks = Vec::new();
        for i in 0..20 {
            let engine = engine.clone();
            tasks.push(tokio::spawn(async move {
                engine
                    .hold(best("x", &format!("u{batch}-{i}"), 1))
                    .await
                    .unwrap()
            }));
        }
        for t in tasks {
            deadlines.push(t.await.unwrap().expires_at_ms);
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        clock.advance_ms(seed % 120);
    }
    let sweeper = start(engine.clone(), SweeperConfig::default())
        .await
        .unwrap()
        .0;
    let last = *deadlines.iter().max().unwrap();
    let mut stats = poke(&sweeper).await;
    loop {
        let now = clock.now_ms();
        let due = deadlines.iter().filter(|d| **d <= now).count();
        let held_now = held(&engine, "x").await as usize;
        assert_eq!(
            held_now,
            deadlines.len() - due,
            "at {now}: every due hold and only those expired"
        );
        if now > last {
            break;
        }
        clock.advance_ms(250);
        stats = poke(&sweeper).await;
    }
    assert_eq!(stats.expired, 10_000);
    assert!(stats.lag_max_ms <= 1_000, "lag {} ms", stats.lag_max_ms);
    sweeper.stop(None);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_racing_expiry_has_exactly_one_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("r", vec![ga("g", 200, 1)], 10_000, 4))
        .await
        .unwrap();
    let mut holds = Vec::new();
    for u in 0..200 {
        holds.push(engine.hold(best("r", &format!("u{u}"), 1)).await.unwrap());
    }
    let sweeper = start(engine.clone(), SweeperConfig::default())
        .await
        .unwrap()
        .0;
    clock.advance_ms(10_000 - 1);
    let mut tasks = Vec::new();
    for h in holds.clone() {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            engine.confirm(pay_with_visa(&h, "")).await
        }));
    }
    // The deadline passes while the confirms are in flight, and the sweeper runs.
    tokio::task::yield_now().await;
    clock.advance_ms(1);
    sweeper.cast(SweeperMsg::Sweep).unwrap();
    // Each hold has exactly one outcome: confirmed; or paid just as it expired and rescued (the
    // same place held again and sold, the original hold expired); or HOLD_EXPIRED and no sale.
    let mut confirmed = 0;
    let mut rescued = 0;
    let mut direct = Vec::new();
    for (t, h) in tasks.into_iter().zip(&holds) {
        match t.await.unwrap() {
            Ok(order) => {
                confirmed += 1;
                assert_eq!(order.user_id, h.user_id);
                if order.hold_id == h.hold_id {
                    direct.push(h.hold_id.clone());
                } else {
                    rescued += 1;
                    assert_eq!(
                        engine.get_hold(&h.hold_id).await.unwrap().status,
                        HoldStatus::Expired
                    );
                    let again = engine.get_hold(&order.hold_id).await.unwrap();
                    assert_eq!(again.status, HoldStatus::Confirmed);
                }
            }
            Err(EngineError::Rejected(Rejection::HoldExpired)) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    sync(&sweeper).await.unwrap();
    let mut sold = 0;
    for h in &holds {
        match engine.get_hold(&h.hold_id).await.unwrap().status {
            HoldStatus::Confirmed => {
                sold += 1;
                assert!(
                    direct.contains(&h.hold_id),
                    "confirmed means its confirm answered so"
                );
            }
            HoldStatus::Expired => {}
            s => panic!("hold left {s:?}"),
        }
    }
    assert_eq!(
        sold + rescued,
        confirmed,
        "one outcome per hold: the answers match the state"
    );
    let s = &engine.event(&EventId::from("r")).unwrap().sections[0];
    let core = engine
        .inspect_section(&EventId::from("r"), &s.spec.section_id)
        .await
        .unwrap();
    assert_eq!(core.counts(), (200, 200 - confirmed, 0, confirmed));
    sweeper.stop(None);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_deadlines_and_expires_the_overdue_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("d", vec![ga("g", 100, 1)], 60_000, 4))
        .await
        .unwrap();
    let early: Vec<HoldView> = futures_holds(&engine, "d", "early", 5).await;
    clock.advance_ms(30_000);
    let late: Vec<HoldView> = futures_holds(&engine, "d", "late", 5).await;
    engine.crash().await;
    drop(engine);
    // Down for 40 s: the early holds' deadlines passed meanwhile, the late ones' did not.
    clock.advance_ms(40_000);
    let engine = open(dir.path(), &clock).await;
    let sweeper = start(engine.clone(), SweeperConfig::default())
        .await
        .unwrap()
        .0;
    let stats = sync(&sweeper).await.unwrap();
    assert_eq!(stats.expired, 5, "overdue holds expire right away");
    for h in &early {
        assert_eq!(
            engine.get_hold(&h.hold_id).await.unwrap().status,
            HoldStatus::Expired
        );
    }
    for h in &late {
        let now = engine.get_hold(&h.hold_id).await.unwrap();
        assert_eq!(
            (now.status, now.expires_at_ms),
            (HoldStatus::Held, h.expires_at_ms)
        );
    }
    clock.advance_ms(20_000);
    assert_eq!(poke(&sweeper).await.expired, 10);
    sweeper.stop(None);
    engine.shutdown().await;
}

async fn futures_holds(engine: &Engine, event: &str, prefix: &str, n: usize) -> Vec<HoldView> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(
            engine
                .hold(best(event, &format!("{prefix}{i}"), 1))
                .await
                .unwrap(),
        );
    }
    out
}

/// An engine in `dir` with event `w`: 4 places of general admission in section `g`, holds of
/// 10 s, 4 places per fan.
async fn open_four_places(dir: &std::path::Path, clock: &Arc<ManualClock>) -> Engine {
    let engine = open(dir, clock).await;
    engine
        .create_event(event("w", vec![ga("g", 4, 1)], 10_000, 4))
        .await
        .unwrap();
    engine
}

/// Crashes `engine`, opens it again from `dir` with a sweeper, and waits for the sweeper's
/// start (its reconciliation) to be done.
async fn crash_and_restart(
    engine: Engine,
    dir: &std::path::Path,
    clock: &Arc<ManualClock>,
) -> (Engine, ActorRef<SweeperMsg>) {
    engine.crash().await;
    drop(engine);
    let engine = open(dir, clock).await;
    let sweeper = start(engine.clone(), SweeperConfig::default())
        .await
        .unwrap()
        .0;
    sync(&sweeper).await.unwrap();
    (engine, sweeper)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waitlist_offers_in_order_all_or_nothing_pass_on_and_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open_four_places(dir.path(), &clock).await;
    let e = EventId::from("w");
    let sweeper = start(engine.clone(), SweeperConfig::default())
        .await
        .unwrap()
        .0;
    let h1 = engine.hold(best("w", "u1", 2)).await.unwrap();
    let h2 = engine.hold(best("w", "u2", 2)).await.unwrap();
    let join = |user: &str, q| {
        let engine = engine.clone();
        let (e, user) = (e.clone(), UserId::from(user));
        async move { engine.join_waitlist(&e, &user, None, q).await.unwrap() }
    };
    let a = join("a", 3).await;
    let b = join("b", 2).await;
    let c = join("c", 1).await;
    assert_eq!((a.position, b.position, c.position), (1, 2, 3));
    assert_eq!(
        join("a", 3).await.entry_id,
        a.entry_id,
        "joining again keeps the place"
    );
    sync(&sweeper).await.unwrap();
    // 3 s later two places come back: a (3) does not fit, b (2) does, c (1) finds none left.
    clock.advance_ms(3_000);
    engine.release(&h1.hold_id, &h1.user_id).await.unwrap();
    sync(&sweeper).await.unwrap();
    let view = |id: String| {
        let engine = engine.clone();
        async move { engine.waitlist_entry(&id).await.unwrap() }
    };
    let b_now = view(b.entry_id.clone()).await;
    assert_eq!(b_now.state, WaitlistState::Offered);
    let offered = engine
        .get_hold(b_now.offered_hold_id.as_ref().unwrap())
        .await
        .unwrap();
    assert_eq!(
        (offered.user_id.as_str(), offered.quantity, offered.status),
        ("b", 2, HoldStatus::Held)
    );
    assert_eq!(view(a.entry_id.clone()).await.state, WaitlistState::Waiting);
    assert_eq!(view(c.entry_id.clone()).await.position, 2);

    // Restart: entries, positions and offers survive.
    sweeper.stop(None);
    let (engine, sweeper) = crash_and_restart(engine, dir.path(), &clock).await;
    let view = |id: String| {
        let engine = engine.clone();
        async move { engine.waitlist_entry(&id).await.unwrap() }
    };
    assert_eq!(view(b.entry_id.clone()).await, b_now);
    assert_eq!(view(a.entry_id.clone()).await.position, 1);

    // h2 expires (its deadline is 3 s before b's offer's): 2 places; a (3) still does not fit,
    // c (1) does.
    clock.advance_ms(7_000);
    poke(&sweeper).await;
    let stats = sync(&sweeper).await.unwrap();
    assert_eq!(stats.expired, 1);
    assert_eq!(
        engine.get_hold(&h2.hold_id).await.unwrap().status,
        HoldStatus::Expired
    );
    assert_eq!(view(c.entry_id.clone()).await.state, WaitlistState::Offered);
    assert_eq!(view(b.entry_id.clone()).await.state, WaitlistState::Offered);
    let a_wait = view(a.entry_id.clone()).await;
    assert_eq!((a_wait.state, a_wait.position), (WaitlistState::Waiting, 1));
    // b lets the offer lapse: it passes on; with b's 2 and the 1 left, a's 3 fit.
    clock.advance_ms(3_000);
    poke(&sweeper).await;
    let stats = sync(&sweeper).await.unwrap();
    assert_eq!(stats.expired, 2);
    assert_eq!(view(b.entry_id.clone()).await.state, WaitlistState::Expired);
    let a_now = view(a.entry_id.clone()).await;
    assert_eq!(a_now.state, WaitlistState::Offered);
    let offered = engine
        .get_hold(a_now.offered_hold_id.as_ref().unwrap())
        .await
        .unwrap();
    assert_eq!((offered.user_id.as_str(), offered.quantity), ("a", 3));
    assert!(stats.offers_lapsed >= 1);
    // a confirms: fulfilled.
    let a_hold = a_now.offered_hold_id.unwrap();
    engine
        .confirm(ConfirmRequest {
            hold_id: a_hold,
            user_id: UserId::from("a"),
            payment_ref: "tok_visa".into(),
            idempotency_key: String::new(),
        })
        .await
        .unwrap();
    let stats = sync(&sweeper).await.unwrap();
    assert_eq!(
        view(a.entry_id.clone()).await.state,
        WaitlistState::Fulfilled
    );
    assert!(stats.offers_accepted >= 1);
    sweeper.stop(None);
    engine.shutdown().await;
}

/// A leader that dies between an offer's hold and the offer's record leaves the hold (it is in
/// the log) and an entry still waiting (its record is not). The next start records that hold
/// as the entry's offer; it does not place a second one (seeds 6791 and 9709 of the simulation:
/// the first hold then held its places for a whole TTL, offered to nobody).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_whose_record_was_lost_is_found_again_not_made_twice() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open_four_places(dir.path(), &clock).await;
    let e = EventId::from("w");
    let all = engine.hold(best("w", "u1", 4)).await.unwrap();
    let b = engine
        .join_waitlist(&e, &UserId::from("b"), None, 2)
        .await
        .unwrap();
    engine.release(&all.hold_id, &all.user_id).await.unwrap();
    // What the dead leader's sweeper did before it could record the offer.
    let orphan = engine.hold_offer(&b).await.unwrap();
    assert_eq!(held(&engine, "w").await, 2);
    let (engine, sweeper) = crash_and_restart(engine, dir.path(), &clock).await;
    let b_now = engine.waitlist_entry(&b.entry_id).await.unwrap();
    assert_eq!(b_now.state, WaitlistState::Offered);
    assert_eq!(b_now.offered_hold_id.as_ref(), Some(&orphan.hold_id));
    assert_eq!(held(&engine, "w").await, 2, "one hold for b's 2 places");
    // It is an offer like any other: when it lapses, the entry ends and the places come back.
    clock.advance_ms(11_000);
    poke(&sweeper).await;
    sync(&sweeper).await.unwrap();
    assert_eq!(
        engine.waitlist_entry(&b.entry_id).await.unwrap().state,
        WaitlistState::Expired
    );
    assert_eq!(held(&engine, "w").await, 0);
    sweeper.stop(None);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waitlist_never_exceeds_the_per_user_limit_and_has_a_maximum() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let mut cfg = config(dir.path(), &clock);
    cfg.waitlist_max = 2;
    let engine = Engine::open(cfg).await.unwrap();
    let e = EventId::from("l");
    engine
        .create_event(event("l", vec![ga("g", 6, 1), ga("h", 1, 1)], 10_000, 4))
        .await
        .unwrap();
    let sweeper = start(engine.clone(), SweeperConfig::default())
        .await
        .unwrap()
        .0;
    // d holds the limit (4); the other 2 places of g go to x; h's one place to y.
    engine.hold(best("l", "d", 4)).await.unwrap();
    let x = engine.hold(best("l", "x", 2)).await.unwrap();
    engine.hold(best("l", "y", 1)).await.unwrap();
    let d_entry = engine
        .join_waitlist(&e, &UserId::from("d"), Some(SectionId::from("g")), 1)
        .await
        .unwrap();
    let z_entry = engine
        .join_waitlist(&e, &UserId::from("z"), None, 2)
        .await
        .unwrap();
    assert_eq!(
        engine.join_waitlist(&e, &UserId::from("q"), None, 1).await,
        Err(Rejection::QueueFull.into())
    );
    assert_eq!(
        engine.join_waitlist(&e, &UserId::from("q"), None, 5).await,
        Err(Rejection::invalid("quantity", "must be 1 to the per-user limit (4)").into())
    );
    assert_eq!(
        engine
            .join_waitlist(&e, &UserId::from("q"), Some(SectionId::from("nope")), 1)
            .await,
        Err(Rejection::SectionNotFound.into())
    );
    sync(&sweeper).await.unwrap();
    engine.release(&x.hold_id, &x.user_id).await.unwrap();
    sync(&sweeper).await.unwrap();
    // d is at the limit: skipped (keeps the place, gets nothing), the places go to z.
    let d_now = engine.waitlist_entry(&d_entry.entry_id).await.unwrap();
    assert_eq!((d_now.state, d_now.position), (WaitlistState::Waiting, 1));
    assert_eq!(engine.user_usage(&e, &UserId::from("d")).await.unwrap(), 4);
    let z_now = engine.waitlist_entry(&z_entry.entry_id).await.unwrap();
    assert_eq!(z_now.state, WaitlistState::Offered);
    assert_eq!(
        engine.waitlist_entry("l.wnothing").await,
        Err(Rejection::EntryNotFound.into())
    );
    sweeper.stop(None);
    engine.shutdown().await;
}

/// The hand-off primitive: the section ends the due holds and places the waiting fans' holds in
/// one step, in order, all or nothing each; quota of an offer that did not fit comes back, and a
/// fan at the per-user limit is skipped without touching anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_hands_freed_places_to_waiting_fans_in_the_same_step() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("w", vec![ga("g", 5, 1), ga("h", 4, 1)], 10_000, 4))
        .await
        .unwrap();
    let (e, g) = (EventId::from("w"), SectionId::from("g"));
    // Sold out: a 3 and a 2 in g (the 2 will lapse), and a fan at the limit holds all of h.
    let lapsing = engine.hold(best("w", "walker", 2)).await.unwrap();
    assert_eq!(lapsing.section_id, g);
    clock.advance_ms(5_000);
    engine.hold(best("w", "keeper", 3)).await.unwrap();
    engine.hold(best("w", "full", 4)).await.unwrap();
    clock.advance_ms(5_001);
    // Offers in line order: 3 does not fit the 2 freed, the fan at the limit is skipped, the 1
    // and the next 1 fit.
    let offers = [
        (UserId::from("big"), 3, None),
        (UserId::from("full"), 1, None),
        (UserId::from("one"), 1, None),
        (UserId::from("two"), 1, None),
        (UserId::from("late"), 1, None),
    ];
    let (ended, next, outcomes) = engine
        .expire_section_offering(&e, &g, 64, &offers)
        .await
        .unwrap();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].hold_id, lapsing.hold_id);
    assert_eq!(ended[0].status, HoldStatus::Expired);
    assert!(matches!(
        outcomes[0],
        Err(EngineError::Rejected(Rejection::SoldOut))
    ));
    assert!(matches!(
        outcomes[1],
        Err(EngineError::Rejected(Rejection::UserLimit { .. }))
    ));
    let one = outcomes[2].as_ref().unwrap();
    let two = outcomes[3].as_ref().unwrap();
    assert!(matches!(
        outcomes[4],
        Err(EngineError::Rejected(Rejection::SoldOut))
    ));
    for (h, user) in [(one, "one"), (two, "two")] {
        assert_eq!(h.user_id, UserId::from(user));
        assert_eq!(h.section_id, g);
        assert_eq!(h.quantity, 1);
        assert_eq!(h.status, HoldStatus::Held);
        assert_eq!(h.expires_at_ms, clock.now_ms() + 10_000);
    }
    // The keeper's 3 is due next; the offers' deadlines come after.
    assert_eq!(next, Some(T0_MS + 15_000));
    // Nothing free for anyone else: the freed places went to the waiting fans.
    assert!(matches!(
        engine.hold(best("w", "newcomer", 1)).await,
        Err(EngineError::Rejected(Rejection::SoldOut))
    ));
    assert_eq!(held(&engine, "w").await, 3 + 4 + 2);
    // The fan whose 3 did not fit got its quota back: when the 4 of h lapse, it takes all 4
    // (with 3 still reserved that would be USER_LIMIT).
    clock.advance_ms(5_000);
    let (ended, _, outcomes) = engine
        .expire_section_offering(
            &e,
            &SectionId::from("h"),
            64,
            &[(UserId::from("big"), 4, None)],
        )
        .await
        .unwrap();
    assert_eq!(ended.len(), 1);
    assert_eq!(outcomes[0].as_ref().unwrap().quantity, 4);
    // Bad input: an unknown section is refused; a bad offer is refused on its own (the due
    // holds still expire).
    assert!(matches!(
        engine
            .expire_section_offering(&e, &SectionId::from("nope"), 64, &[])
            .await,
        Err(EngineError::Rejected(Rejection::SectionNotFound))
    ));
    let before = held(&engine, "w").await;
    let (_, _, outcomes) = engine
        .expire_section_offering(&e, &g, 64, &[(UserId::from("zero"), 0, None)])
        .await
        .unwrap();
    assert_eq!(
        held(&engine, "w").await,
        before - 3,
        "only the keeper's due 3 ended"
    );
    assert!(matches!(
        outcomes[0],
        Err(EngineError::Rejected(Rejection::InvalidRequest { .. }))
    ));
    engine.shutdown().await;
}

/// An engine on `dir` whose group commits go through a [`Majority`] the test can hold back, with
/// event `w` of 4 places in section `g`, `taken` of them held by `u1`.
///
/// [`Majority`]: boxoffice_tests::majority::Majority
async fn four_places_held_back(
    dir: &std::path::Path,
    taken: u32,
) -> (Engine, Arc<boxoffice_tests::majority::Majority>) {
    let clock = Arc::new(ManualClock::new(T0_MS));
    let majority = boxoffice_tests::majority::Majority::new();
    let mut cfg = config(dir, &clock);
    cfg.replicate = Some(majority.clone());
    let engine = Engine::open(cfg).await.unwrap();
    engine
        .create_event(event("w", vec![ga("g", 4, 1)], 10_000, 4))
        .await
        .unwrap();
    engine.hold(best("w", "u1", taken)).await.unwrap();
    (engine, majority)
}

/// No waitlist answer depends on a record that is not durable (issue 27): while a first join's
/// record waits for its majority, a retried join and a read of the entry are not answered; once
/// it commits, all three answer the same entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_join_waits_for_the_first_joins_commit() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let (engine, majority) = four_places_held_back(dir.path(), 4).await;

    // The majority stops answering; the first join's record is submitted and waits for it.
    majority.hold_back();
    let before = majority.submitted();
    let join = || {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .join_waitlist(&EventId::from("w"), &UserId::from("b"), None, 2)
                .await
        })
    };
    let first = join();
    majority.until_submitted(before + 1).await;
    let retry = join();
    let active = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .active_waitlist_entry(&EventId::from("w"), &UserId::from("b"))
                .await
        })
    };
    // Given every chance to answer from memory (a bound on waiting, not a timing claim).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !first.is_finished(),
        "the first join answered before its commit"
    );
    assert!(
        !retry.is_finished(),
        "a retried join answered from an entry whose record was not committed"
    );
    assert!(
        !active.is_finished(),
        "the fan's active entry was read before its record was committed"
    );

    majority.let_through();
    let first = first.await.unwrap().unwrap();
    let retry = retry.await.unwrap().unwrap();
    assert_eq!(retry.entry_id, first.entry_id);
    let active = active.await.unwrap().unwrap().unwrap();
    assert_eq!(active.entry_id, first.entry_id);
    // Everything durable: a read answers at once.
    let read = engine.waitlist_entry(&first.entry_id).await.unwrap();
    assert_eq!(read.state, WaitlistState::Waiting);
    engine.shutdown().await;
}

/// A refusal is answered only once the change it depends on is durable: while the hold that
/// took the last place waits for its majority, a second fan's `SOLD_OUT` is not answered (had
/// the group lost that hold, the refusal would have been a lie); once the hold commits, both
/// answer. (The simulation's `RefusalBeforeDurable`, which the read fence of a cluster leader
/// now hides from it: see TESTING.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_waits_for_the_change_it_depends_on_to_commit() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let (engine, majority) = four_places_held_back(dir.path(), 3).await;

    majority.hold_back();
    let before = majority.submitted();
    let hold = |user: &str| {
        let (engine, user) = (engine.clone(), user.to_owned());
        tokio::spawn(async move { engine.hold(best("w", &user, 1)).await })
    };
    let last = hold("u2");
    majority.until_submitted(before + 1).await;
    let refused = hold("u3");
    // Given every chance to answer early (a bound on waiting, not a timing claim).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!last.is_finished(), "a hold answered before its commit");
    assert!(
        !refused.is_finished(),
        "a refusal answered before the hold it depends on was committed"
    );

    majority.let_through();
    assert_eq!(last.await.unwrap().unwrap().status, HoldStatus::Held);
    assert!(matches!(
        refused.await.unwrap(),
        Err(EngineError::Rejected(Rejection::SoldOut))
    ));
    engine.shutdown().await;
}
