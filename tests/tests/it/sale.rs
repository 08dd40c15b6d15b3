//! Sale controls (issue 28, point 1) on one node: a pause in the middle of a burst
//! acknowledges no hold after the pause is acknowledged; while paused nothing expires and
//! paid holds still confirm; the resume extends every deadline by the pause; the controls
//! survive a crash; a lower limit takes nothing away; a new TTL is for new holds; bad updates
//! change nothing. The API's face of them is in `grpc_sale`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::Arc;

use boxoffice_engine::{
    Engine, EngineError, EventId, HoldStatus, ManualClock, Rejection, SaleState, SaleUpdate,
};
use boxoffice_sweeper::{SweeperConfig, SweeperMsg, start, sync};
use boxoffice_tests::{T0_MS, any_section as best, event, ga, open, pay_with_visa};

fn to(state: SaleState) -> SaleUpdate {
    SaleUpdate {
        state: Some(state),
        ..SaleUpdate::default()
    }
}

fn taken(engine: &Engine, event: &str) -> u32 {
    engine
        .event(&EventId::from(event))
        .unwrap()
        .sections
        .iter()
        .map(|s| s.held + s.sold)
        .sum()
}

fn refused(r: Result<impl std::fmt::Debug, EngineError>) -> Rejection {
    match r {
        Err(EngineError::Rejected(r)) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_in_a_burst_acknowledges_no_hold_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    let sections = (0..4).map(|i| ga(&format!("s{i}"), 5_000, 1)).collect();
    engine
        .create_event(event("burst", sections, 60_000, 4))
        .await
        .unwrap();
    let e = EventId::from("burst");
    // Eight fans' agents hold one place after another until they have been refused 20 times.
    let mut agents = Vec::new();
    for a in 0..8 {
        let engine = engine.clone();
        agents.push(tokio::spawn(async move {
            let (mut ok, mut refusals, mut i) = (0u32, 0u32, 0u32);
            while refusals < 20 {
                match engine.hold(best("burst", &format!("a{a}-{i}"), 1)).await {
                    Ok(_) => ok += 1,
                    Err(EngineError::Rejected(Rejection::SalePaused)) => refusals += 1,
                    Err(e) => panic!("a hold in the burst failed otherwise: {e}"),
                }
                i += 1;
            }
            ok
        }));
    }
    // In the middle of the burst.
    while taken(&engine, "burst") < 2_000 {
        tokio::task::yield_now().await;
    }
    let view = engine
        .update_sale(&e, to(SaleState::Paused), "")
        .await
        .unwrap();
    assert_eq!(view.sale.state, SaleState::Paused);
    // Every hold acknowledged so far is in the counts; none may be placed from now on.
    let at_pause = taken(&engine, "burst");
    let late = engine.hold(best("burst", "late", 1)).await;
    assert_eq!(refused(late), Rejection::SalePaused);
    let mut ok = 0;
    for a in agents {
        ok += a.await.unwrap();
    }
    assert!(
        at_pause < 20_000,
        "the pause came before the places ran out"
    );
    assert_eq!(
        taken(&engine, "burst"),
        at_pause,
        "no hold was placed after the pause was acknowledged"
    );
    assert_eq!(ok, at_pause, "every acknowledged hold is counted");
    // Resumed: holds are taken again.
    engine
        .update_sale(&e, to(SaleState::Open), "")
        .await
        .unwrap();
    engine.hold(best("burst", "after", 1)).await.unwrap();
    for s in engine.event(&e).unwrap().sections {
        let core = engine
            .inspect_section(&e, &s.spec.section_id)
            .await
            .unwrap();
        core.check_invariants().unwrap();
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_paused_nothing_expires_and_the_resume_extends_every_deadline_across_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("p", vec![ga("g", 100, 1)], 60_000, 4))
        .await
        .unwrap();
    let e = EventId::from("p");
    let mut holds = Vec::new();
    for i in 0..5 {
        holds.push(engine.hold(best("p", &format!("u{i}"), 1)).await.unwrap());
    }
    clock.advance_ms(30_000);
    let view = engine
        .update_sale(&e, to(SaleState::Paused), "")
        .await
        .unwrap();
    assert_eq!(
        (view.sale.state, view.sale.state_changed_at_ms),
        (SaleState::Paused, T0_MS + 30_000)
    );
    let sweeper = start(engine.clone(), SweeperConfig::default())
        .await
        .unwrap()
        .0;
    // Far past every deadline: nothing expires while paused, and a paid hold confirms.
    clock.advance_ms(120_000);
    sweeper.cast(SweeperMsg::Sweep).unwrap();
    assert_eq!(sync(&sweeper).await.unwrap().expired, 0);
    engine.confirm(pay_with_visa(&holds[0], "")).await.unwrap();
    sweeper.stop(None);
    engine.crash().await;
    drop(engine);
    // Restarted: still paused, still nothing expires.
    let engine = open(dir.path(), &clock).await;
    assert_eq!(engine.event(&e).unwrap().sale.state, SaleState::Paused);
    assert_eq!(
        refused(engine.hold(best("p", "new", 1)).await),
        Rejection::SalePaused
    );
    let sweeper = start(engine.clone(), SweeperConfig::default())
        .await
        .unwrap()
        .0;
    assert_eq!(sync(&sweeper).await.unwrap().expired, 0);
    clock.advance_ms(10_000);
    // The pause lasted 130 s: from T0 + 30 s to T0 + 160 s.
    engine
        .update_sale(&e, to(SaleState::Open), "")
        .await
        .unwrap();
    for h in &holds[1..] {
        let now = engine.get_hold(&h.hold_id).await.unwrap();
        assert_eq!(
            (now.status, now.expires_at_ms),
            (HoldStatus::Held, h.expires_at_ms + 130_000),
            "a paused fan keeps the cart for the pause's length"
        );
    }
    let deadline = holds[1].expires_at_ms + 130_000;
    clock.set_ms(deadline - 1);
    sweeper.cast(SweeperMsg::Sweep).unwrap();
    assert_eq!(sync(&sweeper).await.unwrap().expired, 0, "never early");
    clock.set_ms(deadline);
    sweeper.cast(SweeperMsg::Sweep).unwrap();
    assert_eq!(sync(&sweeper).await.unwrap().expired, 4);
    engine.hold(best("p", "new", 1)).await.unwrap();
    sweeper.stop(None);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_change_new_holds_only_and_bad_updates_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("s", vec![ga("g", 100, 1)], 60_000, 4))
        .await
        .unwrap();
    let e = EventId::from("s");
    let ann: Vec<_> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(engine.hold(best("s", "ann", 1)).await.unwrap());
        }
        v
    };
    clock.advance_ms(1_000);
    let set = SaleUpdate {
        hold_ttl_seconds: Some(5),
        per_user_limit: Some(2),
        admit_rate_per_second: Some(7),
        ..SaleUpdate::default()
    };
    let view = engine.update_sale(&e, set, "k1").await.unwrap();
    let sale = view.sale.clone();
    assert_eq!(
        (
            sale.hold_ttl_ms,
            sale.per_user_limit,
            sale.admit_rate_per_second
        ),
        (5_000, 2, 7)
    );
    assert_eq!(
        (
            sale.state_changed_at_ms,
            sale.rate_changed_at_ms,
            sale.terms_changed_at_ms
        ),
        (T0_MS, T0_MS + 1_000, T0_MS + 1_000)
    );
    // Ann keeps her three places; she may hold no more.
    for h in &ann {
        assert_eq!(
            engine.get_hold(&h.hold_id).await.unwrap().status,
            HoldStatus::Held
        );
    }
    assert!(matches!(
        refused(engine.hold(best("s", "ann", 1)).await),
        Rejection::UserLimit { limit: 2, used: 3 }
    ));
    // A new hold lives 5 s; the old ones keep their 60 s.
    let bob = engine.hold(best("s", "bob", 1)).await.unwrap();
    assert_eq!(bob.expires_at_ms - bob.placed_at_ms, 5_000);
    assert_eq!(ann[0].expires_at_ms - ann[0].placed_at_ms, 60_000);
    // The same key and request again: the event as it is, nothing recorded; another request
    // under the key is refused.
    let again = SaleUpdate {
        hold_ttl_seconds: Some(5),
        per_user_limit: Some(2),
        admit_rate_per_second: Some(7),
        ..SaleUpdate::default()
    };
    assert_eq!(
        engine.update_sale(&e, again, "k1").await.unwrap().sale,
        sale
    );
    assert_eq!(
        refused(engine.update_sale(&e, to(SaleState::Paused), "k1").await),
        Rejection::IdempotencyKeyReused
    );
    // Bad input: each refused with its reason, and nothing changes.
    let bad: Vec<(EventId, SaleUpdate, &str)> = vec![
        (EventId::from("nope"), to(SaleState::Paused), ""),
        (
            e.clone(),
            SaleUpdate {
                admit_rate_per_second: Some(-1),
                ..SaleUpdate::default()
            },
            "",
        ),
        (e.clone(), SaleUpdate::default(), ""),
        (
            e.clone(),
            SaleUpdate {
                per_user_limit: Some(0),
                ..SaleUpdate::default()
            },
            "",
        ),
    ];
    let reasons: Vec<String> = {
        let mut out = Vec::new();
        for (id, u, k) in bad {
            let r = refused(engine.update_sale(&id, u, k).await);
            out.push(format!("{} {}", r.reason(), r.field().unwrap_or("")));
        }
        out
    };
    assert_eq!(
        reasons,
        [
            "EVENT_NOT_FOUND ",
            "INVALID_REQUEST admit_rate_per_second",
            "INVALID_REQUEST state",
            "INVALID_REQUEST per_user_limit",
        ]
    );
    assert_eq!(engine.event(&e).unwrap().sale, sale, "nothing changed");
    // The end is final: no hold, no other state, and it survives a restart.
    engine
        .update_sale(&e, to(SaleState::Ended), "")
        .await
        .unwrap();
    assert_eq!(
        refused(engine.hold(best("s", "cat", 1)).await),
        Rejection::SaleEnded
    );
    assert_eq!(
        refused(engine.update_sale(&e, to(SaleState::Open), "").await),
        Rejection::SaleEnded
    );
    engine
        .update_sale(&e, to(SaleState::Ended), "")
        .await
        .unwrap();
    engine.crash().await;
    drop(engine);
    let engine = open(dir.path(), &clock).await;
    let after = engine.event(&e).unwrap().sale;
    assert_eq!(
        (
            after.state,
            after.hold_ttl_ms,
            after.per_user_limit,
            after.admit_rate_per_second
        ),
        (SaleState::Ended, 5_000, 2, 7)
    );
    assert_eq!(
        refused(engine.hold(best("s", "cat", 1)).await),
        Rejection::SaleEnded
    );
    // Holds that exist may still be paid after the end.
    engine.confirm(pay_with_visa(&bob, "")).await.unwrap();
    engine.shutdown().await;
}

/// A crash between the pause's catalog record and its sections' records (the section's write
/// fails, and the engine stops): the next start finds the catalog paused and a section that is
/// not, and pauses it before serving; nothing is held meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_finishes_a_pause_its_sections_did_not_record() {
    let sink = boxoffice_engine::MemorySink::new();
    let cfg = || boxoffice_engine::EngineConfig::with_sink(sink.clone()).unwrap();
    let engine = Engine::open(cfg()).await.unwrap();
    engine
        .create_event(event("c", vec![ga("g", 100, 1)], 60_000, 4))
        .await
        .unwrap();
    engine.hold(best("c", "ann", 1)).await.unwrap();
    let e = EventId::from("c");
    // The write after the catalog's fails: the section's pause.
    sink.fail_write_after(2);
    let r = engine.update_sale(&e, to(SaleState::Paused), "").await;
    assert!(r.is_err(), "the pause was not answered: {r:?}");
    assert!(
        engine.stopped().is_some(),
        "a failed write stops the engine"
    );
    drop(engine);
    let engine = Engine::open(cfg()).await.unwrap();
    assert_eq!(engine.event(&e).unwrap().sale.state, SaleState::Paused);
    let core = engine
        .inspect_section(&e, &boxoffice_engine::SectionId::from("g"))
        .await
        .unwrap();
    assert!(
        core.sale().paused_since_ms.is_some(),
        "the section was paused at the start"
    );
    assert_eq!(
        refused(engine.hold(best("c", "bob", 1)).await),
        Rejection::SalePaused
    );
    engine.shutdown().await;
}

/// The hold cool-down (against hoarding bots): a user whose hold expired may not hold again in
/// the event until the cool-down has passed (`HOLD_COOLDOWN`, saying until when); a released
/// hold starts none; other users are not affected; set to 0, it is off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_whose_hold_expired_waits_out_the_hold_cooldown() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("cd", vec![ga("g", 100, 1)], 10_000, 4))
        .await
        .unwrap();
    let e = EventId::from("cd");
    let cool = SaleUpdate {
        hold_cooldown_seconds: Some(30),
        ..SaleUpdate::default()
    };
    let view = engine.update_sale(&e, cool, "").await.unwrap();
    assert_eq!(view.sale.hold_cooldown_ms, 30_000);
    let bot = engine.hold(best("cd", "bot", 4)).await.unwrap();
    let fan = engine.hold(best("cd", "fan", 1)).await.unwrap();
    engine.release(&fan.hold_id, &fan.user_id).await.unwrap();
    let sweeper = start(engine.clone(), SweeperConfig::default())
        .await
        .unwrap()
        .0;
    clock.advance_ms(10_000);
    sweeper.cast(SweeperMsg::Sweep).unwrap();
    assert_eq!(sync(&sweeper).await.unwrap().expired, 1);
    let expired_at = T0_MS + 10_000;
    // The expiry's quota comes back after its record is durable: until then USER_LIMIT; then
    // the cool-down, until 30 s after the expiry.
    let refusal = loop {
        match engine.hold(best("cd", "bot", 1)).await {
            Err(EngineError::Rejected(Rejection::UserLimit { .. })) => {
                tokio::task::yield_now().await;
            }
            other => break refused(other),
        }
    };
    assert_eq!(
        refusal,
        Rejection::HoldCooldown {
            until_ms: expired_at + 30_000
        }
    );
    // A release starts no cool-down; another user is not affected.
    engine.hold(best("cd", "fan", 1)).await.unwrap();
    engine.hold(best("cd", "other", 1)).await.unwrap();
    clock.advance_ms(29_999);
    assert!(matches!(
        refused(engine.hold(best("cd", "bot", 1)).await),
        Rejection::HoldCooldown { .. }
    ));
    clock.advance_ms(1);
    engine.hold(best("cd", "bot", 1)).await.unwrap();
    // Off again: no cool-down after the next expiry.
    let off = SaleUpdate {
        hold_cooldown_seconds: Some(0),
        ..SaleUpdate::default()
    };
    engine.update_sale(&e, off, "").await.unwrap();
    clock.advance_ms(10_000);
    sweeper.cast(SweeperMsg::Sweep).unwrap();
    sync(&sweeper).await.unwrap();
    let again = loop {
        match engine.hold(best("cd", "bot", 1)).await {
            Err(EngineError::Rejected(Rejection::UserLimit { .. })) => {
                tokio::task::yield_now().await;
            }
            other => break other,
        }
    };
    again.unwrap();
    let _ = bot;
    sweeper.stop(None);
    engine.shutdown().await;
}
