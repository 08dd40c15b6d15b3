//! Contention: many tasks race for few places. Exactly capacity succeed, no seat is taken twice,
//! counters add up; the per-user limit holds across sections under concurrency; idempotency
//! keys have one effect.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashSet;
use std::sync::Arc;

use boxoffice_engine::{
    ConfirmRequest, Engine, EngineError, EventId, HoldRequest, HoldView, ManualClock, Rejection,
    SeatId, SectionId, Selection, UserId,
};
use boxoffice_tests::{T0_MS, event, ga, open, reserved};

async fn check_all_sections(engine: &Engine, event_id: &EventId) {
    for s in engine.event(event_id).unwrap().sections {
        let core = engine
            .inspect_section(event_id, &s.spec.section_id)
            .await
            .unwrap();
        core.check_invariants().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_on_one_general_admission_section() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("gen", vec![ga("floor", 100, 10)], 60_000, 100))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for t in 0..64 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let mut won = Vec::new();
            let mut sold_out = 0;
            for i in 0..10 {
                let r = engine
                    .hold(HoldRequest {
                        event_id: EventId::from("gen"),
                        user_id: UserId::from(format!("t{t}-{i}")),
                        idempotency_key: String::new(),
                        selection: Selection::BestAvailable {
                            section: Some(SectionId::from("floor")),
                            quantity: 1,
                        },
                        access_code: String::new(),
                    })
                    .await;
                match r {
                    Ok(h) => won.push(h),
                    Err(EngineError::Rejected(Rejection::SoldOut)) => sold_out += 1,
                    Err(e) => panic!("unexpected {e:?}"),
                }
            }
            (won, sold_out)
        }));
    }
    let mut won = Vec::new();
    let mut sold_out = 0;
    for t in tasks {
        let (w, s) = t.await.unwrap();
        won.extend(w);
        sold_out += s;
    }
    assert_eq!(won.len(), 100, "exactly capacity succeed");
    assert_eq!(sold_out, 540);
    let ids: HashSet<_> = won.iter().map(|h| h.hold_id.clone()).collect();
    assert_eq!(ids.len(), 100);
    let s = &engine.event(&EventId::from("gen")).unwrap().sections[0];
    assert_eq!((s.available, s.held, s.sold), (0, 100, 0));
    check_all_sections(&engine, &EventId::from("gen")).await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everyone_wants_the_same_ten_seats() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("res", vec![reserved("orch", 10, 20, 10)], 60_000, 4))
        .await
        .unwrap();
    // The ten front-centre seats of row A: 6..=15.
    let hot: Vec<SeatId> = (6..=15)
        .map(|n| SeatId::from(format!("orch:A:{n}")))
        .collect();
    let mut tasks = Vec::new();
    for t in 0..64u32 {
        let engine = engine.clone();
        let hot = hot.clone();
        tasks.push(tokio::spawn(async move {
            let mut won: Vec<HoldView> = Vec::new();
            // Each task tries pairs of hot seats, then single seats, in its own order.
            for k in 0..10u32 {
                let a = hot[((t + k) % 10) as usize].clone();
                let b = hot[((t + k + 1) % 10) as usize].clone();
                let seats = if k % 2 == 0 { vec![a, b] } else { vec![a] };
                match engine
                    .hold(HoldRequest {
                        event_id: EventId::from("res"),
                        user_id: UserId::from(format!("fan{t}-{k}")),
                        idempotency_key: String::new(),
                        selection: Selection::Seats(seats),
                        access_code: String::new(),
                    })
                    .await
                {
                    Ok(h) => won.push(h),
                    Err(EngineError::Rejected(Rejection::SeatUnavailable(_))) => {}
                    Err(e) => panic!("unexpected {e:?}"),
                }
            }
            won
        }));
    }
    let mut seats = Vec::new();
    for t in tasks {
        for h in t.await.unwrap() {
            seats.extend(h.seat_ids);
        }
    }
    let unique: HashSet<_> = seats.iter().cloned().collect();
    assert_eq!(seats.len(), unique.len(), "no seat twice");
    assert_eq!(
        unique,
        hot.into_iter().collect::<HashSet<_>>(),
        "all ten went"
    );
    let s = &engine.event(&EventId::from("res")).unwrap().sections[0];
    assert_eq!((s.capacity, s.available, s.held, s.sold), (200, 190, 10, 0));
    check_all_sections(&engine, &EventId::from("res")).await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_limit_holds_across_sections_under_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    let sections = (0..8).map(|i| ga(&format!("s{i}"), 100, 10)).collect();
    engine
        .create_event(event("lim", sections, 60_000, 4))
        .await
        .unwrap();
    // One user fires 32 concurrent holds of 1 place each at 8 different sections.
    let mut tasks = Vec::new();
    for i in 0..32 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            engine
                .hold(HoldRequest {
                    event_id: EventId::from("lim"),
                    user_id: UserId::from("greedy"),
                    idempotency_key: String::new(),
                    selection: Selection::BestAvailable {
                        section: Some(SectionId::from(format!("s{}", i % 8))),
                        quantity: 1,
                    },
                    access_code: String::new(),
                })
                .await
        }));
    }
    let mut ok = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(h) => ok.push(h),
            Err(EngineError::Rejected(Rejection::UserLimit { limit: 4, .. })) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(ok.len(), 4, "exactly the limit");
    let event_id = EventId::from("lim");
    let user = UserId::from("greedy");
    assert_eq!(engine.user_usage(&event_id, &user).await.unwrap(), 4);
    let held: u32 = engine
        .event(&event_id)
        .unwrap()
        .sections
        .iter()
        .map(|s| s.held)
        .sum();
    assert_eq!(held, 4);
    // Releasing one gives one place back; confirming keeps it counted.
    engine.release(&ok[0].hold_id, &user).await.unwrap();
    assert_eq!(engine.user_usage(&event_id, &user).await.unwrap(), 3);
    engine
        .confirm(ConfirmRequest {
            hold_id: ok[1].hold_id.clone(),
            user_id: user.clone(),
            payment_ref: "tok_visa".into(),
            idempotency_key: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(engine.user_usage(&event_id, &user).await.unwrap(), 3);
    // A failed hold gives its reservation back: ask for 1 in a sold-out section.
    engine
        .create_event(event("tiny", vec![ga("one", 1, 1)], 60_000, 4))
        .await
        .unwrap();
    let tiny = EventId::from("tiny");
    let first = |u: &str| HoldRequest {
        event_id: tiny.clone(),
        user_id: UserId::from(u),
        idempotency_key: String::new(),
        selection: Selection::BestAvailable {
            section: None,
            quantity: 1,
        },
        access_code: String::new(),
    };
    engine.hold(first("x")).await.unwrap();
    assert_eq!(
        engine.hold(first("y")).await,
        Err(Rejection::SoldOut.into())
    );
    assert_eq!(
        engine.user_usage(&tiny, &UserId::from("y")).await.unwrap(),
        0
    );
    // Expired holds count against nobody.
    clock.advance_ms(60_000);
    assert_eq!(
        engine.expire_due(100).await.unwrap().len(),
        3,
        "two of greedy, one of x"
    );
    assert_eq!(
        engine.user_usage(&event_id, &user).await.unwrap(),
        1,
        "the confirmed one"
    );
    assert_eq!(
        engine.user_usage(&tiny, &UserId::from("x")).await.unwrap(),
        0
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_has_one_effect() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("idem", vec![ga("floor", 100, 25)], 60_000, 4))
        .await
        .unwrap();
    let req = |user: &str, key: &str, q: u32| HoldRequest {
        event_id: EventId::from("idem"),
        user_id: UserId::from(user),
        idempotency_key: key.into(),
        selection: Selection::BestAvailable {
            section: None,
            quantity: q,
        },
        access_code: String::new(),
    };
    // 50 concurrent double-taps with one key: one hold, every success identical.
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let engine = engine.clone();
        let r = req("ann", "tap", 2);
        tasks.push(tokio::spawn(async move { engine.hold(r).await }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(h) => answers.push(h),
            Err(EngineError::Rejected(Rejection::IdempotencyKeyInFlight)) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert!(!answers.is_empty());
    assert!(
        answers.iter().all(|h| h == &answers[0]),
        "replays return the first answer"
    );
    assert_eq!(
        engine.event(&EventId::from("idem")).unwrap().sections[0].held,
        2
    );
    // After it settled, a replay still answers the same, even once the hold changed.
    let first = answers[0].clone();
    engine
        .release(&first.hold_id, &first.user_id)
        .await
        .unwrap();
    assert_eq!(engine.hold(req("ann", "tap", 2)).await.unwrap(), first);
    assert_eq!(
        engine.event(&EventId::from("idem")).unwrap().sections[0].held,
        0
    );
    // Same key, different request: refused, nothing changes.
    assert_eq!(
        engine.hold(req("ann", "tap", 3)).await,
        Err(Rejection::IdempotencyKeyReused.into())
    );
    // Keys are per user: another user may use the same key.
    let bob = engine.hold(req("bob", "tap", 2)).await.unwrap();
    assert_ne!(bob.hold_id, first.hold_id);
    // Confirm: one order however often it is replayed; a different payment with the key is
    // refused.
    let confirm = |key: &str, pay: &str| ConfirmRequest {
        hold_id: bob.hold_id.clone(),
        user_id: UserId::from("bob"),
        payment_ref: pay.into(),
        idempotency_key: key.into(),
    };
    let o1 = engine.confirm(confirm("pay", "tok_a")).await.unwrap();
    let o2 = engine.confirm(confirm("pay", "tok_a")).await.unwrap();
    assert_eq!(o1, o2);
    assert_eq!(
        engine.confirm(confirm("pay", "tok_b")).await,
        Err(Rejection::IdempotencyKeyReused.into())
    );
    // Without a key, a second confirm of the same hold is refused: it is not active any more.
    assert_eq!(
        engine.confirm(confirm("", "tok_a")).await,
        Err(Rejection::HoldNotActive.into())
    );
    let s = &engine.event(&EventId::from("idem")).unwrap().sections[0];
    assert_eq!((s.held, s.sold), (0, 2));
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_the_field_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event(
            "bad",
            vec![reserved("orch", 2, 5, 10), ga("floor", 10, 5)],
            60_000,
            4,
        ))
        .await
        .unwrap();
    let hold = |user: &str, key: &str, selection: Selection| HoldRequest {
        event_id: EventId::from("bad"),
        user_id: UserId::from(user),
        idempotency_key: key.into(),
        selection,
        access_code: String::new(),
    };
    let field = |r: Result<HoldView, EngineError>| match r {
        Err(EngineError::Rejected(rej)) => rej
            .field()
            .map(str::to_owned)
            .unwrap_or(rej.reason().to_owned()),
        other => format!("not a rejection: {other:?}"),
    };
    let best = |section: Option<&str>, q| Selection::BestAvailable {
        section: section.map(SectionId::from),
        quantity: q,
    };
    // Each case: what is wrong, the request, and the field (or reason) the refusal names.
    let seats = |ids: &[&str]| Selection::Seats(ids.iter().map(|s| SeatId::from(*s)).collect());
    let cases = [
        ("no user", hold("", "", best(None, 1)), "user_id"),
        (
            "a key too long",
            hold("u", &"k".repeat(200), best(None, 1)),
            "idempotency_key",
        ),
        ("no places", hold("u", "", best(None, 0)), "quantity"),
        ("no seats", hold("u", "", seats(&[])), "seat_ids"),
        (
            "seats of two sections",
            hold("u", "", seats(&["orch:A:1", "floor:A:1"])),
            "seat_ids",
        ),
        (
            "a section that does not exist",
            hold("u", "", best(Some("nope"), 1)),
            "SECTION_NOT_FOUND",
        ),
        (
            "a seat that does not exist",
            hold("u", "", seats(&["orch:Z:1"])),
            "SEAT_NOT_FOUND",
        ),
        (
            "a seat id that is not one",
            hold("u", "", seats(&["garbage"])),
            "seat_ids",
        ),
        (
            "an event that does not exist",
            HoldRequest {
                event_id: EventId::from("none"),
                ..hold("u", "", best(None, 1))
            },
            "EVENT_NOT_FOUND",
        ),
        (
            "more than the per-user limit",
            hold("u", "", best(None, 5)),
            "USER_LIMIT",
        ),
    ];
    let counts = async || {
        let sections: Vec<(u32, u32)> = engine
            .event(&EventId::from("bad"))
            .unwrap()
            .sections
            .iter()
            .map(|s| (s.held, s.sold))
            .collect();
        let used = engine
            .user_usage(&EventId::from("bad"), &UserId::from("u"))
            .await
            .unwrap();
        (sections, used)
    };
    let mut wrong = Vec::new();
    for (name, request, expected) in cases {
        let before = counts().await;
        let got = field(engine.hold(request).await);
        if got != expected {
            wrong.push(format!("{name}: refused naming {got:?}, not {expected:?}"));
        }
        let after = counts().await;
        if after != before {
            wrong.push(format!("{name}: changed {before:?} to {after:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    for h in ["nonsense", "bad.orch.hX", "bad.orch.o01", "other.orch.hX"] {
        let r = engine
            .release(&boxoffice_engine::HoldId::from(h), &UserId::from("u"))
            .await;
        assert_eq!(r, Err(Rejection::HoldNotFound.into()), "{h}");
    }
    assert_eq!(
        engine
            .create_event(event("bad", vec![ga("x", 1, 1)], 0, 0))
            .await,
        Err(Rejection::EventExists.into())
    );
    // The same request again (a retry after a lost answer), even many at once, answers the one
    // event; another spec under its id is refused.
    let again = event("again", vec![ga("x", 7, 1)], 0, 0);
    let tries: Vec<_> = (0..8)
        .map(|_| {
            let (engine, spec) = (engine.clone(), again.clone());
            tokio::spawn(async move { engine.create_event(spec).await })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tries {
        answers.push(t.await.unwrap().unwrap());
    }
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    assert_eq!(
        engine
            .events()
            .unwrap()
            .iter()
            .filter(|e| e.event_id == EventId::from("again"))
            .count(),
        1
    );
    let mut other = again.clone();
    other.sections[0] = ga("x", 8, 1);
    assert_eq!(
        engine.create_event(other).await,
        Err(Rejection::EventExists.into())
    );
    // Nothing changed anywhere.
    for s in engine.event(&EventId::from("bad")).unwrap().sections {
        assert_eq!((s.held, s.sold), (0, 0));
    }
    assert_eq!(
        engine
            .user_usage(&EventId::from("bad"), &UserId::from("u"))
            .await
            .unwrap(),
        0
    );
    // Before the sale opens: SALE_NOT_OPEN.
    let mut later = event("later", vec![ga("x", 1, 1)], 0, 0);
    later.sale_opens_at_ms = T0_MS + 10_000;
    engine.create_event(later).await.unwrap();
    let r = engine
        .hold(HoldRequest {
            event_id: EventId::from("later"),
            ..hold("u", "", best(None, 1))
        })
        .await;
    assert_eq!(r, Err(Rejection::SaleNotOpen.into()));
    clock.advance_ms(10_000);
    engine
        .hold(HoldRequest {
            event_id: EventId::from("later"),
            ..hold("u", "", best(None, 1))
        })
        .await
        .unwrap();
    engine.shutdown().await;
}

/// The published counts (`Engine::event`, `GetEvent`, seat maps) never lag an acknowledged
/// change: a caller that got its answer reads its own change. Other fans keep the flusher and
/// the cores busy meanwhile (in another section, so the counts of this one are exact).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_reads_its_own_change_in_the_published_counts() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event(
            "own",
            vec![ga("mine", 10, 1), ga("busy", 100, 1)],
            600_000,
            4,
        ))
        .await
        .unwrap();
    let e = EventId::from("own");
    let hold = |user: &str, section: &str| HoldRequest {
        event_id: e.clone(),
        user_id: UserId::from(user),
        idempotency_key: String::new(),
        selection: Selection::BestAvailable {
            section: Some(SectionId::from(section)),
            quantity: 1,
        },
        access_code: String::new(),
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut others = Vec::new();
    for k in 0..4 {
        let (engine, stop) = (engine.clone(), stop.clone());
        let req = hold(&format!("other-{k}"), "busy");
        others.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let h = engine.hold(req.clone()).await.unwrap();
                engine.release(&h.hold_id, &h.user_id).await.unwrap();
            }
        }));
    }
    let mine = |engine: &Engine| engine.event(&e).unwrap().sections[0].clone();
    for round in 0..300 {
        let h = engine.hold(hold("me", "mine")).await.unwrap();
        let s = mine(&engine);
        assert_eq!(
            (s.held, s.available),
            (1, 9),
            "round {round}: my hold is not in the counts"
        );
        engine.release(&h.hold_id, &h.user_id).await.unwrap();
        let s = mine(&engine);
        assert_eq!(
            (s.held, s.available),
            (0, 10),
            "round {round}: my release is not in the counts"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for o in others {
        o.await.unwrap();
    }
    engine.shutdown().await;
}
