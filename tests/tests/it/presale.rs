//! Presale access codes (issue 29, point 5): sections that sell only to code holders until the
//! presale ends; codes with a use cap, a time window and the sections they unlock, kept as
//! digests; `ACCESS_CODE_REQUIRED`, `ACCESS_CODE_INVALID`, `ACCESS_CODE_EXHAUSTED` over gRPC
//! and HTTP with nothing changed; the cap exact under 1,000 concurrent redeemers; uses given
//! back by releases and expiries, kept by orders and across a restart; counts in `GetEvent`
//! for admin keys only and in metrics.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::Arc;

use boxoffice_engine::{
    Clock, EngineError, EventId, HoldRequest, Rejection, SectionId, Selection, UserId,
};
use boxoffice_proto::v1 as pb;
use boxoffice_tests::cases::expect_err;
use boxoffice_tests::server::{CLIENT, TestServer};
use tonic::Code;

use crate::grpc::{admitted, best, event, ga};

/// The presale event `id`: `club` (a presale section of 2,000 places) and `floor` (public,
/// 100 places); codes `FANCLUB-2026` (cap `cap`, every presale section, valid from `from` to
/// `until`) and `VIP-ONLY-77` (cap 5, unlocks `vip` only, a second presale section of 10).
fn presale_event(id: &str, cap: u32, from: i64, until: i64, ends: i64) -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        presale_section_ids: vec!["club".into(), "vip".into()],
        presale_ends_at_unix_ms: ends,
        access_codes: vec![
            pb::AccessCode {
                code: "FANCLUB-2026".into(),
                max_uses: cap,
                valid_from_unix_ms: from,
                valid_until_unix_ms: until,
                section_ids: Vec::new(),
            },
            pb::AccessCode {
                code: "VIP-ONLY-77".into(),
                max_uses: 5,
                valid_from_unix_ms: 0,
                valid_until_unix_ms: 0,
                section_ids: vec!["vip".into()],
            },
        ],
        ..event(
            id,
            vec![
                ga("club", 2_000, 9_000),
                ga("vip", 10, 20_000),
                ga("floor", 100, 5_000),
            ],
        )
    }
}

fn engine_hold(event: &str, user: &str, section: Option<&str>, q: u32, code: &str) -> HoldRequest {
    HoldRequest {
        event_id: EventId::from(event),
        user_id: UserId::from(user),
        idempotency_key: String::new(),
        selection: Selection::BestAvailable {
            section: section.map(SectionId::from),
            quantity: q,
        },
        access_code: code.into(),
    }
}

fn with_code(req: pb::HoldRequest, code: &str) -> pb::HoldRequest {
    pb::HoldRequest {
        access_code: code.into(),
        ..req
    }
}

async fn uses(a: &mut boxoffice_tests::Clients, event: &str) -> Vec<u32> {
    a.events
        .get_event(pb::GetEventRequest {
            event_id: event.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .access_codes
        .iter()
        .map(|c| c.uses)
        .collect()
}

async fn counts(c: &mut boxoffice_tests::Clients, event: &str) -> Vec<(u32, u32, u32)> {
    c.events
        .get_event(pb::GetEventRequest {
            event_id: event.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .sections
        .iter()
        .map(|s| (s.available, s.held, s.sold))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presale_sections_sell_only_to_valid_codes_and_refusals_change_nothing() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let now = i64::try_from(clock.now_ms()).unwrap();
    let mut a = server.admin();
    let mut c = server.client();
    let made = a
        .events
        .create_event(presale_event("pre", 100, 0, now + 60_000, now + 120_000))
        .await
        .unwrap()
        .into_inner();
    // The codes are never shown, only their ids; the sections say what they need.
    assert_eq!(made.presale_section_ids, ["club", "vip"]);
    assert_eq!(made.access_codes.len(), 2);
    assert_eq!(made.access_codes[0].code_id.len(), 12);
    assert!(!format!("{made:?}").contains("FANCLUB"));
    let required: Vec<bool> = made
        .sections
        .iter()
        .map(|s| s.access_code_required)
        .collect();
    assert_eq!(required, [true, true, false]);
    // A client key sees no codes.
    let seen = c
        .events
        .get_event(pb::GetEventRequest {
            event_id: "pre".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(seen.access_codes.is_empty());
    assert_eq!(seen.presale_section_ids, ["club", "vip"]);

    let ann = admitted(&mut c, &clock, "pre", "ann").await;
    let before = counts(&mut c, "pre").await;
    let club = |code: &str| with_code(best("pre", "ann", &ann, "club", 1, ""), code);
    let refused = [
        // No code for a presale section, a code that is not the event's, a code for other
        // sections, and malformed codes (named as the field).
        (club(""), Code::FailedPrecondition, "ACCESS_CODE_REQUIRED"),
        (
            club("NOT-A-CODE"),
            Code::FailedPrecondition,
            "ACCESS_CODE_INVALID",
        ),
        (
            club("VIP-ONLY-77"),
            Code::FailedPrecondition,
            "ACCESS_CODE_INVALID",
        ),
        (club("no spaces"), Code::InvalidArgument, "INVALID_REQUEST"),
        (club("abc"), Code::InvalidArgument, "INVALID_REQUEST"),
    ];
    for (req, code, reason) in refused {
        let status = c.booking.hold(req.clone()).await.unwrap_err();
        assert_eq!(status.code(), code, "{req:?}: {status:?}");
        assert_eq!(boxoffice_tests::server::reason(&status), reason, "{req:?}");
        if code == Code::InvalidArgument {
            assert!(status.message().contains("access_code"), "{status:?}");
        }
    }
    assert_eq!(counts(&mut c, "pre").await, before, "nothing changed");
    assert_eq!(uses(&mut a, "pre").await, [0, 0]);

    // A good code holds; a public section ignores codes, right or wrong.
    let held = c
        .booking
        .hold(with_code(
            best("pre", "ann", &ann, "club", 2, ""),
            "FANCLUB-2026",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.section_id, "club");
    c.booking
        .hold(with_code(
            best("pre", "ann", &ann, "floor", 1, ""),
            "NOT-A-CODE",
        ))
        .await
        .unwrap();
    assert_eq!(uses(&mut a, "pre").await, [2, 0]);
    // "Any section" with a code: only the sections it unlocks.
    let bob = admitted(&mut c, &clock, "pre", "bob").await;
    let vip = c
        .booking
        .hold(with_code(
            best("pre", "bob", &bob, "", 3, ""),
            "VIP-ONLY-77",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(vip.section_id, "vip");
    assert_eq!(uses(&mut a, "pre").await, [2, 3]);
    // Three of five used: a hold of three more is refused whole, and is kept under its key.
    let cat = admitted(&mut c, &clock, "pre", "cat").await;
    let over = with_code(best("pre", "cat", &cat, "vip", 3, "k-over"), "VIP-ONLY-77");
    for _ in 0..2 {
        expect_err(
            c.booking.hold(over.clone()).await,
            Code::ResourceExhausted,
            "ACCESS_CODE_EXHAUSTED",
        );
    }
    assert_eq!(uses(&mut a, "pre").await, [2, 3]);
    // The same key with another code is another request.
    expect_err(
        c.booking
            .hold(with_code(
                best("pre", "cat", &cat, "vip", 3, "k-over"),
                "FANCLUB-2026",
            ))
            .await,
        Code::FailedPrecondition,
        "IDEMPOTENCY_KEY_REUSED",
    );
    let two = c
        .booking
        .hold(with_code(
            best("pre", "cat", &cat, "vip", 2, ""),
            "VIP-ONLY-77",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(uses(&mut a, "pre").await, [2, 5]);

    // A release gives its uses back; an order keeps them.
    c.booking
        .release(pb::ReleaseRequest {
            hold_id: two.hold_id.clone(),
            user_id: "cat".into(),
        })
        .await
        .unwrap();
    assert_eq!(uses(&mut a, "pre").await, [2, 3]);
    crate::cancel::pay(&mut c, held).await;
    assert_eq!(uses(&mut a, "pre").await, [2, 3]);

    // Over HTTP: the same reasons as problems, the same holds.
    let http = server.http(Some(CLIENT));
    let dan = admitted(&mut c, &clock, "pre", "dan").await;
    for (code, status, reason) in [
        ("", 409, "ACCESS_CODE_REQUIRED"),
        ("WRONG-CODE", 409, "ACCESS_CODE_INVALID"),
        ("bad code", 400, "INVALID_REQUEST"),
    ] {
        let r = http
            .post(
                "/v1/events/pre/book",
                &[],
                &serde_json::json!({"userId": "dan", "token": dan, "sectionId": "club",
                    "quantity": 1, "accessCode": code}),
            )
            .await;
        assert_eq!(r.status, status, "{code}: {r:?}");
        assert_eq!(r.json()["reason"], reason, "{code}: {r:?}");
    }
    let ok = http
        .post(
            "/v1/events/pre/book",
            &[],
            &serde_json::json!({"userId": "dan", "token": dan, "sectionId": "club",
                "quantity": 1, "accessCode": "FANCLUB-2026"}),
        )
        .await;
    assert_eq!(ok.status, 201, "{ok:?}");
    // A batch: each item judged as its own hold would be.
    let batch = serde_json::json!({"items": [
        {"userId": "dan", "admissionToken": dan, "sectionId": "club", "quantity": 1,
         "accessCode": "FANCLUB-2026"},
        {"userId": "dan", "admissionToken": dan, "sectionId": "club", "quantity": 1},
        {"userId": "dan", "admissionToken": dan, "sectionId": "vip", "quantity": 1,
         "accessCode": "FANCLUB-2026"},
    ]});
    let answer = http.post("/v1/events/pre/holds/batch", &[], &batch).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let results = answer.json()["results"].as_array().unwrap().clone();
    assert_eq!(results[0]["hold"]["sectionId"], "club");
    assert_eq!(results[1]["error"]["reason"], "ACCESS_CODE_REQUIRED");
    assert_eq!(results[2]["hold"]["sectionId"], "vip");
    let event = http.get("/v1/events/pre", &[]).await.json();
    assert_eq!(event["sections"][0]["accessCodeRequired"], true);
    assert_eq!(
        event["accessCodes"],
        serde_json::json!([]),
        "a client key sees none"
    );
    let admin = server.http(Some(boxoffice_tests::server::ADMIN));
    let event = admin.get("/v1/events/pre", &[]).await.json();
    assert_eq!(event["accessCodes"][0]["uses"], 5);
    assert_eq!(event["accessCodes"][1]["maxUses"], 5);

    // Past the code's window it is refused; past the presale the section is public.
    clock.advance_ms(60_000);
    expect_err(
        c.booking
            .hold(with_code(
                best("pre", "dan", &dan, "club", 1, ""),
                "FANCLUB-2026",
            ))
            .await,
        Code::FailedPrecondition,
        "ACCESS_CODE_INVALID",
    );
    clock.advance_ms(60_000);
    let eve = admitted(&mut c, &clock, "pre", "eve").await;
    let public = c
        .booking
        .hold(best("pre", "eve", &eve, "club", 1, ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(public.section_id, "club");
    assert_eq!(
        uses(&mut a, "pre").await,
        [5, 3],
        "a public hold uses no code"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_presales_are_refused_naming_the_field_and_create_nothing() {
    let server = TestServer::start().await;
    let mut a = server.admin();
    let good = || presale_event("bad", 10, 0, 0, 0);
    let mut cases = Vec::new();
    let mut r = good();
    r.presale_section_ids.push("nowhere".into());
    cases.push((r, "presale_section_ids[2]"));
    let mut r = good();
    r.access_codes[1].code = "FANCLUB-2026".into();
    cases.push((r, "access_codes[1].code"));
    let mut r = good();
    r.access_codes[0].code = "x y".into();
    cases.push((r, "access_codes[0].code"));
    let mut r = good();
    r.access_codes[0].max_uses = 0;
    cases.push((r, "access_codes[0].max_uses"));
    let mut r = good();
    r.access_codes[0].valid_from_unix_ms = 10;
    r.access_codes[0].valid_until_unix_ms = 5;
    cases.push((r, "access_codes[0].valid_until_unix_ms"));
    let mut r = good();
    r.access_codes[1].section_ids = vec!["floor".into()];
    cases.push((r, "access_codes[1].section_ids[0]"));
    let mut r = good();
    r.presale_section_ids.clear();
    cases.push((r, "access_codes"));
    let mut r = good();
    r.presale_ends_at_unix_ms = -1;
    cases.push((r, "presale_ends_at_unix_ms"));
    for (req, field) in cases {
        let s = a.events.create_event(req).await.unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{field}: {s:?}");
        assert!(s.message().contains(field), "{field}: {s:?}");
    }
    expect_err(
        a.events
            .get_event(pb::GetEventRequest {
                event_id: "bad".into(),
            })
            .await,
        Code::NotFound,
        "EVENT_NOT_FOUND",
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_redeemers_of_a_code_capped_at_100_get_exactly_100_places() {
    let server = TestServer::start().await;
    let engine = server.engine();
    let mut a = server.admin();
    a.events
        .create_event(presale_event("cap", 100, 0, 0, 0))
        .await
        .unwrap();
    let started = Arc::new(tokio::sync::Barrier::new(1_000));
    let mut tasks = Vec::new();
    for i in 0..1_000 {
        let (engine, started) = (engine.clone(), started.clone());
        tasks.push(tokio::spawn(async move {
            started.wait().await;
            // Each fan holds 1 place, some in "any section" (the code unlocks club and vip).
            let section = if i % 5 == 0 { None } else { Some("club") };
            engine
                .hold(engine_hold(
                    "cap",
                    &format!("fan-{i}"),
                    section,
                    1,
                    "FANCLUB-2026",
                ))
                .await
        }));
    }
    let (mut held, mut exhausted) = (Vec::new(), 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(h) => held.push(h),
            Err(EngineError::Rejected(Rejection::AccessCodeExhausted)) => exhausted += 1,
            Err(e) => panic!("unexpected answer: {e:?}"),
        }
    }
    assert_eq!((held.len(), exhausted), (100, 900));
    assert_eq!(uses(&mut a, "cap").await, [100, 0]);
    let taken: u32 = engine
        .event(&EventId::from("cap"))
        .unwrap()
        .sections
        .iter()
        .map(|s| s.held)
        .sum();
    assert_eq!(taken, 100, "exactly the places of the 100 holds");

    // A batch of 10 more: every item refused, nothing placed.
    let batch = (0..10)
        .map(|i| engine_hold("cap", &format!("late-{i}"), Some("club"), 1, "FANCLUB-2026"))
        .collect();
    for r in engine.hold_batch(batch).await {
        assert!(matches!(
            r,
            Err(EngineError::Rejected(Rejection::AccessCodeExhausted))
        ));
    }

    // Releases and expiries give uses back, once; orders keep theirs.
    for h in &held[..10] {
        engine.release(&h.hold_id, &h.user_id).await.unwrap();
    }
    assert_eq!(uses(&mut a, "cap").await, [90, 0]);
    for h in &held[10..20] {
        engine
            .confirm(boxoffice_tests::pay_with_visa(h, ""))
            .await
            .unwrap();
    }
    server.clock().advance_ms(61_000);
    let expired = engine.expire_due(10_000).await.unwrap();
    assert_eq!(expired.len(), 80);
    assert_eq!(
        uses(&mut a, "cap").await,
        [10, 0],
        "the ten orders keep theirs"
    );
    // The freed uses are taken again, up to the cap and no further.
    let batch = (0..95)
        .map(|i| {
            engine_hold(
                "cap",
                &format!("again-{i}"),
                Some("club"),
                1,
                "FANCLUB-2026",
            )
        })
        .collect();
    let ok = engine
        .hold_batch(batch)
        .await
        .into_iter()
        .filter(Result::is_ok)
        .count();
    assert_eq!(ok, 90);
    assert_eq!(uses(&mut a, "cap").await, [100, 0]);

    // A restart counts them again from the holds.
    let home = server.home().clone();
    drop(engine);
    server.shutdown().await;
    let server = TestServer::builder().home(home).start().await;
    let mut a = server.admin();
    assert_eq!(uses(&mut a, "cap").await, [100, 0]);
    let engine = server.engine();
    assert!(matches!(
        engine
            .hold(engine_hold("cap", "after", Some("club"), 1, "FANCLUB-2026"))
            .await,
        Err(EngineError::Rejected(Rejection::AccessCodeExhausted))
    ));
    let metrics = crate::grpc::scrape(server.metrics_addr()).await;
    assert!(
        metrics.contains("boxoffice_access_code_uses{event=\"cap\"} 100"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("access_code"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(engine.reconcile().await.unwrap().is_empty());
    assert!(engine.access_code_miscounts().await.unwrap().is_empty());
    drop(engine);
    server.shutdown().await;
}

/// A power cut in the middle of a presale: holds under a code race a failing fsync; after the
/// cut (everything since the last good sync gone) the engine counts exactly the places of the
/// acknowledged holds against the code, never more than its cap, and the cap still binds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failed_fsync_and_a_power_cut_a_code_counts_exactly_its_acknowledged_holds() {
    use boxoffice_engine::access::{AccessCode, Presale};
    use boxoffice_engine::{Engine, EngineConfig, ManualClock, MemorySink, StorageError};
    let sink = MemorySink::new();
    let clock = Arc::new(ManualClock::new(boxoffice_tests::T0_MS));
    let mut config = EngineConfig::with_sink(sink.clone()).unwrap();
    config.clock = clock.clone();
    let engine = Engine::open(config.clone()).await.unwrap();
    let mut spec = boxoffice_tests::event(
        "cut",
        vec![boxoffice_tests::ga("club", 1_000, 100)],
        60_000,
        4,
    );
    spec.presale = Presale {
        sections: vec![SectionId::from("club")],
        ends_at_ms: 0,
        codes: vec![AccessCode::new("POWER-CUT-1", 60, 0, 0, Vec::new())],
    };
    engine.create_event(spec).await.unwrap();
    sink.fail_sync_after(3);
    let mut acked = 0u32;
    for wave in 0..8 {
        let calls: Vec<_> = (0..10)
            .map(|i| {
                let engine = engine.clone();
                tokio::spawn(async move {
                    let user = format!("w{wave}-{i}");
                    engine
                        .hold(engine_hold("cut", &user, Some("club"), 1, "POWER-CUT-1"))
                        .await
                })
            })
            .collect();
        for c in calls {
            match c.await.unwrap() {
                Ok(h) => acked += h.quantity,
                Err(EngineError::Storage(StorageError::Halted(_)))
                | Err(EngineError::Rejected(Rejection::AccessCodeExhausted)) => {}
                Err(e) => panic!("unexpected answer: {e:?}"),
            }
        }
    }
    assert_eq!(sink.failed_syncs(), 1);
    assert!(acked > 0 && acked <= 60, "{acked}");
    engine.crash().await;
    sink.lose_unsynced();
    let engine = Engine::open(config).await.unwrap();
    let view = engine.event(&EventId::from("cut")).unwrap();
    assert_eq!(
        view.access_code_uses,
        [acked],
        "exactly the acknowledged places"
    );
    assert_eq!(view.sections[0].held, acked);
    assert!(engine.invariant_violations().await.unwrap().is_empty());
    // The rest of the cap, and not one place more.
    let left = 60 - acked;
    let more = (0..left + 5)
        .map(|i| engine_hold("cut", &format!("after-{i}"), Some("club"), 1, "POWER-CUT-1"))
        .collect();
    let placed = engine
        .hold_batch(more)
        .await
        .into_iter()
        .filter(Result::is_ok)
        .count();
    assert_eq!(placed as u32, left);
    assert_eq!(
        engine
            .event(&EventId::from("cut"))
            .unwrap()
            .access_code_uses,
        [60]
    );
    engine.shutdown().await;
}

/// Tickets given back after the sale keep their code's uses (docs/api.md 3.6): a code capped at
/// 4, one order of 4, 2 tickets given back: the code stays used up, a hold of 2 more under it is
/// refused, and the count from the holds (invariants, a restart) agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_given_back_keep_their_codes_uses_and_the_cap_holds() {
    use boxoffice_engine::access::{AccessCode, Presale};
    let server = TestServer::start().await;
    let engine = server.engine();
    let clock = server.clock().clone();
    let mut spec = boxoffice_tests::event(
        "back",
        vec![boxoffice_tests::ga("club", 100, 100)],
        60_000,
        10,
    );
    spec.cancellation_deadline_ms = clock.now_ms() + 3_600_000;
    spec.presale = Presale {
        sections: vec![SectionId::from("club")],
        ends_at_ms: 0,
        codes: vec![AccessCode::new("GIVE-BACK-1", 4, 0, 0, Vec::new())],
    };
    engine.create_event(spec).await.unwrap();
    let held = engine
        .hold(engine_hold("back", "ann", Some("club"), 4, "GIVE-BACK-1"))
        .await
        .unwrap();
    let order = engine
        .confirm(boxoffice_tests::pay_with_visa(&held, ""))
        .await
        .unwrap();
    engine
        .cancel_tickets(boxoffice_engine::CancelRequest {
            order_id: order.order_id.clone(),
            user_id: order.user_id.clone(),
            ticket_ids: vec![
                format!("{}.1", order.order_id),
                format!("{}.2", order.order_id),
            ],
            idempotency_key: String::new(),
        })
        .await
        .unwrap();
    let uses =
        |e: &boxoffice_engine::Engine| e.event(&EventId::from("back")).unwrap().access_code_uses;
    assert_eq!(uses(&engine), [4], "the order keeps its uses");
    assert!(matches!(
        engine
            .hold(engine_hold("back", "bob", Some("club"), 2, "GIVE-BACK-1"))
            .await,
        Err(EngineError::Rejected(Rejection::AccessCodeExhausted))
    ));
    assert!(engine.invariant_violations().await.unwrap().is_empty());
    assert!(engine.access_code_miscounts().await.unwrap().is_empty());
    let home = server.home().clone();
    drop(engine);
    server.shutdown().await;
    let server = TestServer::builder().home(home).start().await;
    assert_eq!(uses(&server.engine()), [4]);
    server.shutdown().await;
}
