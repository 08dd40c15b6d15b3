//! `BookingService.HoldBatch` (issue 15): many holds in one call, each answered as a `Hold` of
//! its own would be. The main test is differential: the same requests, one by one as `Hold`s on
//! one server and as one batch on another server in the same state, must get the same answers
//! (every documented error, per item, with its field moved under `items[i]`), and leave the
//! same seat maps. Then: the whole call's own errors, idempotency per item and across calls
//! (shared with `Hold`), durability over a restart, and callers that give up mid-batch.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use boxoffice_engine::{
    Clock, EngineError, EventId, HoldRequest, HoldStatus, HoldView, Rejection, SectionId,
    Selection, UserId,
};
use boxoffice_proto::v1 as pb;
use boxoffice_tests::Clients;
use boxoffice_tests::server::{Home, TestServer, reason};
use boxoffice_tests::wait::{PATIENCE, periodic_check};
use tonic::Code;
use tonic_types::StatusExt;

use crate::grpc::{admitted_all, best, booking_events, seats, seats_of};

const USERS: &[&str] = &["ann", "bob", "cat", "dan", "eve", "fay"];

/// The event of the differential test (per-user limit 4) and a second one, and every user's
/// admission token for the first (and ann's for the second).
async fn stage(server: &TestServer) -> (Clients, HashMap<&'static str, String>) {
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    booking_events(&mut a).await;
    let tokens = admitted_all(&mut c, || clock.advance_ms(20), "b", USERS).await;
    let mut map: HashMap<&'static str, String> = USERS.iter().copied().zip(tokens).collect();
    let elsewhere = admitted_all(&mut c, || clock.advance_ms(20), "elsewhere", &["ann"]).await;
    map.insert("ann@elsewhere", elsewhere[0].clone());
    (c, map)
}

fn keyed(mut r: pb::HoldRequest, key: &str) -> pb::HoldRequest {
    r.idempotency_key = key.into();
    r
}

/// Every kind of answer a `Hold` can give, in an order where each has its cause (the items
/// before it), for event `b` as [`stage`] makes it.
fn cases(t: &HashMap<&'static str, String>) -> Vec<(&'static str, pb::HoldRequest)> {
    let tok = |u: &str| t[u].clone();
    let mut flipped = tok("ann").into_bytes();
    let mid = flipped.len() / 3;
    flipped[mid] = if flipped[mid] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    let mut no_selection = best("b", "bob", &tok("bob"), "pit", 1, "");
    no_selection.selection = None;
    vec![
        (
            "exact seats",
            keyed(
                seats("b", "ann", &tok("ann"), &["orch:A:2", "orch:A:3"]),
                "k1",
            ),
        ),
        (
            "a seat the item before holds",
            seats("b", "bob", &tok("bob"), &["orch:A:3"]),
        ),
        (
            "a seat that does not exist",
            seats("b", "bob", &tok("bob"), &["orch:Z:1"]),
        ),
        (
            "a seat id that is not one",
            seats("b", "bob", &tok("bob"), &["orch:A:1", "garbage"]),
        ),
        (
            "seats of two sections",
            seats("b", "bob", &tok("bob"), &["orch:A:1", "pit:A:1"]),
        ),
        (
            "seat ids in a general-admission section",
            seats("b", "bob", &tok("bob"), &["floor:A:1"]),
        ),
        (
            "a section that does not exist",
            best("b", "bob", &tok("bob"), "nope", 1, ""),
        ),
        ("no places", best("b", "bob", &tok("bob"), "floor", 0, "")),
        (
            "too many places",
            best("b", "bob", &tok("bob"), "floor", 101, ""),
        ),
        ("no selection", no_selection),
        ("no token", best("b", "bob", "", "floor", 1, "")),
        (
            "a forged token",
            best("b", "bob", "forged.token", "floor", 1, ""),
        ),
        (
            "a token with a flipped byte",
            best("b", "ann", &flipped, "floor", 1, ""),
        ),
        (
            "another fan's token",
            best("b", "bob", &tok("ann"), "floor", 1, ""),
        ),
        (
            "the fan's token for another event",
            best("b", "ann", &tok("ann@elsewhere"), "floor", 1, ""),
        ),
        ("no user", best("b", "", &tok("bob"), "floor", 1, "")),
        (
            "a key with a control character",
            best("b", "bob", &tok("bob"), "floor", 1, "k\u{7}"),
        ),
        (
            "the last places of a section",
            best("b", "cat", &tok("cat"), "floor", 3, "k2"),
        ),
        ("sold out", best("b", "dan", &tok("dan"), "floor", 1, "")),
        (
            "over the per-user limit (3 held, 2 asked, limit 4)",
            best("b", "cat", &tok("cat"), "pit", 2, "k3"),
        ),
        (
            "a key used for another request",
            best("b", "ann", &tok("ann"), "pit", 2, "k1"),
        ),
        (
            "a key used for this same request: its first answer",
            keyed(
                seats("b", "ann", &tok("ann"), &["orch:A:2", "orch:A:3"]),
                "k1",
            ),
        ),
        (
            "a key whose first answer was a refusal: the refusal",
            best("b", "cat", &tok("cat"), "pit", 2, "k3"),
        ),
        (
            "eve's first two",
            best("b", "eve", &tok("eve"), "pit", 2, ""),
        ),
        (
            "eve's second two: at the limit",
            best("b", "eve", &tok("eve"), "pit", 2, ""),
        ),
        (
            "eve's fifth place: past the limit",
            best("b", "eve", &tok("eve"), "pit", 1, ""),
        ),
        (
            "3 places of a sold-out section (reserved, then given back)",
            best("b", "fay", &tok("fay"), "floor", 3, "k5"),
        ),
        (
            "then 2 more: the refused 3 count against nobody",
            best("b", "fay", &tok("fay"), "pit", 2, "k6"),
        ),
        (
            "any section, after every item naming one",
            best("b", "dan", &tok("dan"), "", 2, "k4"),
        ),
    ]
}

/// An answer as both paths can give it: a hold (without its id, which is random), or an
/// error's code, reason and metadata (the field as the unary call names it).
#[derive(Debug, PartialEq)]
enum Answer {
    Held {
        section: String,
        seats: Vec<String>,
        quantity: u32,
        status: i32,
        expires: i64,
    },
    Refused {
        code: i32,
        reason: String,
        metadata: BTreeMap<String, String>,
    },
}

fn held(h: &pb::Hold) -> Answer {
    Answer::Held {
        section: h.section_id.clone(),
        seats: h.seat_ids.clone(),
        quantity: h.quantity,
        status: h.status,
        expires: h.expires_at_unix_ms,
    }
}

fn unary_answer(r: &Result<pb::Hold, tonic::Status>) -> Answer {
    match r {
        Ok(h) => held(h),
        Err(s) => {
            let details = s.get_error_details();
            let info = details.error_info().expect("every error has an ErrorInfo");
            if let Some(bad) = details.bad_request() {
                assert_eq!(
                    info.metadata.get("field"),
                    Some(&bad.field_violations[0].field)
                );
            }
            Answer::Refused {
                code: s.code() as i32,
                reason: info.reason.clone(),
                metadata: info.metadata.clone().into_iter().collect(),
            }
        }
    }
}

/// Item `i`'s answer, with its field (`items[i].<field>`) named as the unary call names it.
fn batch_answer(i: usize, r: &pb::HoldBatchResult) -> Answer {
    match r.result.as_ref().expect("every item is answered") {
        pb::hold_batch_result::Result::Hold(h) => held(h),
        pb::hold_batch_result::Result::Error(e) => {
            let mut metadata: BTreeMap<String, String> = e.metadata.clone().into_iter().collect();
            if let Some(field) = metadata.get_mut("field") {
                let prefix = format!("items[{i}].");
                assert!(field.starts_with(&prefix), "item {i}'s field is {field}");
                *field = field[prefix.len()..].to_owned();
            }
            assert!(!e.message.is_empty());
            Answer::Refused {
                code: e.code,
                reason: e.reason.clone(),
                metadata,
            }
        }
    }
}

pub(crate) fn item(r: pb::HoldRequest) -> pb::HoldBatchItem {
    pb::HoldBatchItem {
        user_id: r.user_id,
        admission_token: r.admission_token,
        idempotency_key: r.idempotency_key,
        selection: r.selection.map(|s| match s {
            pb::hold_request::Selection::Seats(s) => pb::hold_batch_item::Selection::Seats(s),
            pb::hold_request::Selection::BestAvailable(b) => {
                pb::hold_batch_item::Selection::BestAvailable(b)
            }
        }),
        access_code: String::new(),
    }
}

fn batch(event: &str, items: Vec<pb::HoldRequest>) -> pb::HoldBatchRequest {
    pb::HoldBatchRequest {
        event_id: event.into(),
        items: items.into_iter().map(item).collect(),
    }
}

fn hold_of(r: &pb::HoldBatchResult) -> Option<&pb::Hold> {
    match r.result.as_ref()? {
        pb::hold_batch_result::Result::Hold(h) => Some(h),
        pb::hold_batch_result::Result::Error(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_every_item_as_a_hold_would() {
    // Two servers in the same state (the same clock steps: their times match too).
    let one = TestServer::start().await;
    let many = TestServer::start().await;
    let (mut c1, t1) = stage(&one).await;
    let (mut c2, t2) = stage(&many).await;
    let now = one.clock().now_ms().max(many.clock().now_ms());
    one.clock().set_ms(now);
    many.clock().set_ms(now);

    let unary_cases = cases(&t1);
    let mut unary = Vec::new();
    for (_, r) in unary_cases.clone() {
        unary.push(c1.booking.hold(r).await.map(|r| r.into_inner()));
    }
    let batch_cases = cases(&t2);
    let names: Vec<&str> = batch_cases.iter().map(|(n, _)| *n).collect();
    let answers = c2
        .booking
        .hold_batch(batch(
            "b",
            batch_cases.into_iter().map(|(_, r)| r).collect(),
        ))
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(answers.len(), unary.len());
    let mut wrong = Vec::new();
    for (i, (u, b)) in unary.iter().zip(&answers).enumerate() {
        let (u, b) = (unary_answer(u), batch_answer(i, b));
        if u != b {
            wrong.push(format!(
                "item {i} ({}): Hold {u:?}, HoldBatch {b:?}",
                names[i]
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // Every kind of answer is there (the cases are what the test says they are).
    let reasons: Vec<String> = unary
        .iter()
        .map(|r| r.as_ref().map_or_else(reason, |_| "OK".into()))
        .collect();
    for expected in [
        "OK",
        "SEAT_UNAVAILABLE",
        "SEAT_NOT_FOUND",
        "INVALID_REQUEST",
        "SECTION_NOT_FOUND",
        "TOKEN_INVALID",
        "SOLD_OUT",
        "USER_LIMIT",
        "IDEMPOTENCY_KEY_REUSED",
    ] {
        assert!(
            reasons.iter().any(|r| r == expected),
            "no {expected}: {reasons:?}"
        );
    }
    // The replayed item is the first item's very hold.
    let first = hold_of(&answers[0]).unwrap();
    let replay = hold_of(&answers[21]).unwrap();
    assert_eq!(first.hold_id, replay.hold_id);
    // Both servers hold the same places.
    assert_eq!(seats_of(&mut c1, "b").await, seats_of(&mut c2, "b").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_call_is_refused_for_a_bad_event_or_item_count() {
    let server = TestServer::start().await;
    let (mut c, t) = stage(&server).await;
    let before = seats_of(&mut c, "b").await;
    let one = || best("b", "ann", &t["ann"], "pit", 1, "");
    let cases = [
        (
            "no event",
            batch("", vec![one()]),
            Code::InvalidArgument,
            "INVALID_REQUEST",
            Some("event_id"),
        ),
        (
            "an unknown event",
            batch("nope", vec![one()]),
            Code::NotFound,
            "EVENT_NOT_FOUND",
            None,
        ),
        (
            "no items",
            batch("b", vec![]),
            Code::InvalidArgument,
            "INVALID_REQUEST",
            Some("items"),
        ),
        (
            "257 items",
            batch("b", (0..257).map(|_| one()).collect()),
            Code::InvalidArgument,
            "INVALID_REQUEST",
            Some("items"),
        ),
    ];
    for (name, req, code, why, field) in cases {
        let s = c.booking.hold_batch(req).await.unwrap_err();
        assert_eq!(
            (s.code(), reason(&s).as_str()),
            (code, why),
            "{name}: {s:?}"
        );
        if let Some(field) = field {
            let details = s.get_error_details();
            assert_eq!(
                details.bad_request().unwrap().field_violations[0].field,
                field,
                "{name}"
            );
        }
    }
    // Without a key: refused at the gate.
    let mut bare = pb::booking_service_client::BookingServiceClient::new(server.channel());
    let s = bare.hold_batch(batch("b", vec![one()])).await.unwrap_err();
    assert_eq!(s.code(), Code::Unauthenticated);
    // 256 items are fine (each its own answer): ann may hold 4 of them, the rest USER_LIMIT.
    let limited =
        r#"boxoffice_hold_batch_items_total{code="RESOURCE_EXHAUSTED",reason="USER_LIMIT"}"#;
    let held_items = r#"boxoffice_hold_batch_items_total{code="OK",reason="none"}"#;
    let scraped = crate::grpc::scrape(server.metrics_addr()).await;
    let (limited_before, held_before) = (counter(&scraped, limited), counter(&scraped, held_items));
    let answers = c
        .booking
        .hold_batch(batch("b", (0..256).map(|_| one()).collect()))
        .await
        .unwrap()
        .into_inner()
        .results;
    let held = answers.iter().filter(|r| hold_of(r).is_some()).count();
    assert_eq!(held, 4);
    for (i, r) in answers.iter().enumerate().skip(4) {
        match r.result.as_ref().unwrap() {
            pb::hold_batch_result::Result::Error(e) => {
                assert_eq!(
                    (e.code, e.reason.as_str()),
                    (Code::ResourceExhausted as i32, "USER_LIMIT"),
                    "item {i}"
                );
                assert_eq!(e.metadata.get("limit").map(String::as_str), Some("4"));
                assert_eq!(e.metadata.get("used").map(String::as_str), Some("4"));
            }
            other => panic!("item {i}: {other:?}"),
        }
    }
    // Its items are counted by outcome (the recorder is the test binary's: at least these).
    let scraped = crate::grpc::scrape(server.metrics_addr()).await;
    assert!(
        counter(&scraped, limited) >= limited_before + 252.0,
        "{limited}"
    );
    assert!(
        counter(&scraped, held_items) >= held_before + 4.0,
        "{held_items}"
    );
    // The refused calls changed nothing; the last one took exactly ann's four pit places.
    let after = seats_of(&mut c, "b").await;
    for (b, a) in before.iter().zip(&after) {
        if b.section_id == "pit" {
            assert_eq!(a.held, b.held + 4);
        } else {
            assert_eq!(b, a);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_replay_per_item_across_batches_and_holds_and_holds_survive_a_restart() {
    let server = TestServer::builder().home(Home::new()).start().await;
    let (mut c, t) = stage(&server).await;
    // A Hold first; then a batch with its key and request, a new keyed item, and a repeat of
    // that item's key with another request within the batch.
    let single = c
        .booking
        .hold(best("b", "bob", &t["bob"], "pit", 1, "kb"))
        .await
        .unwrap()
        .into_inner();
    let first = batch(
        "b",
        vec![
            best("b", "bob", &t["bob"], "pit", 1, "kb"),
            best("b", "ann", &t["ann"], "pit", 2, "ka"),
            best("b", "ann", &t["ann"], "pit", 1, "ka"),
            best("b", "ann", &t["ann"], "pit", 2, "ka"),
            best("b", "cat", &t["cat"], "floor", 1, ""),
        ],
    );
    let a1 = c
        .booking
        .hold_batch(first.clone())
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(hold_of(&a1[0]).unwrap().hold_id, single.hold_id);
    let ann = hold_of(&a1[1]).unwrap().clone();
    match a1[2].result.as_ref().unwrap() {
        pb::hold_batch_result::Result::Error(e) => assert_eq!(e.reason, "IDEMPOTENCY_KEY_REUSED"),
        other => panic!("{other:?}"),
    }
    assert_eq!(hold_of(&a1[3]).unwrap().hold_id, ann.hold_id);
    let cat = hold_of(&a1[4]).unwrap().clone();
    let seen = seats_of(&mut c, "b").await;

    // The same batch again: every keyed item replays; the unkeyed one holds again.
    let a2 = c
        .booking
        .hold_batch(first)
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(hold_of(&a2[0]).unwrap().hold_id, single.hold_id);
    assert_eq!(hold_of(&a2[1]).unwrap().hold_id, ann.hold_id);
    assert_eq!(hold_of(&a2[3]).unwrap().hold_id, ann.hold_id);
    let cat2 = hold_of(&a2[4]).unwrap().clone();
    assert_ne!(cat2.hold_id, cat.hold_id);
    // A Hold with ann's key and request gets the batch item's answer.
    let again = c
        .booking
        .hold(best("b", "ann", &t["ann"], "pit", 2, "ka"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.hold_id, ann.hold_id);
    let after = seats_of(&mut c, "b").await;
    let pit = |m: &[pb::SectionSeats]| m.iter().find(|s| s.section_id == "pit").unwrap().held;
    let floor = |m: &[pb::SectionSeats]| m.iter().find(|s| s.section_id == "floor").unwrap().held;
    assert_eq!(pit(&after), pit(&seen));
    assert_eq!(floor(&after), floor(&seen) + 1);

    // Durable: a restart finds every hold the batches answered.
    let home = server.home().clone();
    server.shutdown().await;
    let server = TestServer::builder().home(home).start().await;
    let mut c = server.client();
    for h in [&single, &ann, &cat, &cat2] {
        let found = c
            .booking
            .get_hold(pb::GetHoldRequest {
                hold_id: h.hold_id.clone(),
                user_id: h.user_id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(found, *h);
    }
    // And the keys still replay after the restart.
    let t = token_again(&server, &mut c, "ann").await;
    let a3 = c
        .booking
        .hold_batch(batch("b", vec![best("b", "ann", &t, "pit", 2, "ka")]))
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(hold_of(&a3[0]).unwrap().hold_id, ann.hold_id);
}

/// The value of the series `series` (name and labels, as scraped) in a Prometheus text scrape.
fn counter(scraped: &str, series: &str) -> f64 {
    scraped
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} is not in the scrape"))
}

/// A fresh admission token for `user` on event `b` (after a restart the fan joins again).
async fn token_again(server: &TestServer, c: &mut Clients, user: &str) -> String {
    let clock = server.clock().clone();
    admitted_all(c, || clock.advance_ms(20), "b", &[user])
        .await
        .remove(0)
}

fn engine_req(user: usize, key: bool) -> HoldRequest {
    HoldRequest {
        event_id: EventId::from("e"),
        user_id: UserId::from(format!("u{}", user % 40).as_str()),
        idempotency_key: if key {
            format!("k{user}")
        } else {
            String::new()
        },
        selection: Selection::BestAvailable {
            section: Some(SectionId::from(if user.is_multiple_of(3) {
                "floor"
            } else {
                "pit"
            })),
            quantity: 1,
        },
        access_code: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_caller_gives_up_still_runs_to_its_end() {
    let clock = std::sync::Arc::new(boxoffice_engine::ManualClock::new(boxoffice_tests::T0_MS));
    let dir = tempfile::tempdir().unwrap();
    let engine = boxoffice_tests::open(dir.path(), &clock).await;
    engine
        .create_event(boxoffice_tests::event(
            "e",
            vec![
                boxoffice_tests::ga("floor", 50, 100),
                boxoffice_tests::ga("pit", 60, 100),
            ],
            60_000,
            2,
        ))
        .await
        .unwrap();
    // 10 waves of 20 keyed holds by 40 users (limit 2 each: 80 places wanted, 110 there):
    // each wave's caller gives up after a moment, often before the answers.
    let mut gave_up = 0;
    for wave in 0..10 {
        let reqs: Vec<HoldRequest> = (wave * 20..wave * 20 + 20)
            .map(|u| engine_req(u, true))
            .collect();
        let e = engine.clone();
        let call =
            // The first wave's caller gives up after 20 µs: before any fsync can return.
            tokio::time::timeout(Duration::from_micros(if wave == 0 { 20 } else { 200 + 300 * wave as u64 }), async move {
                e.hold_batch(reqs).await
            });
        if call.await.is_err() {
            gave_up += 1;
        }
    }
    // Retries of every key settle to the first answers: none stays in flight, none holds twice.
    let mut by_user: HashMap<String, Vec<HoldView>> = HashMap::new();
    for wave in 0..10 {
        let reqs: Vec<HoldRequest> = (wave * 20..wave * 20 + 20)
            .map(|u| engine_req(u, true))
            .collect();
        let answers = periodic_check("no key of the wave is in flight", PATIENCE, async || {
            let answers = engine.hold_batch(reqs.clone()).await;
            if answers.iter().any(|a| {
                matches!(
                    a,
                    Err(EngineError::Rejected(Rejection::IdempotencyKeyInFlight))
                )
            }) {
                return Err("a key in flight");
            }
            Ok(answers)
        })
        .await;
        let again = engine.hold_batch(reqs).await;
        for (a, b) in answers.iter().zip(&again) {
            assert_eq!(a, b, "a retry gets the first answer");
            match a {
                Ok(h) => by_user
                    .entry(h.user_id.as_str().to_owned())
                    .or_default()
                    .push(h.clone()),
                Err(EngineError::Rejected(Rejection::UserLimit { .. })) => {}
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
    }
    // Each user holds exactly their limit, and the ledger and the sections agree.
    let mut held = 0;
    for u in 0..40 {
        let user = UserId::from(format!("u{u}").as_str());
        let holds = by_user.get(user.as_str()).cloned().unwrap_or_default();
        assert_eq!(holds.len(), 2, "{user:?}");
        assert!(holds.iter().all(|h| h.status == HoldStatus::Held));
        assert_eq!(
            engine.user_usage(&EventId::from("e"), &user).await.unwrap(),
            2
        );
        held += holds.len() as u32;
    }
    let view = engine.event(&EventId::from("e")).unwrap();
    let sections_held: u32 = view.sections.iter().map(|s| s.held).sum();
    assert_eq!(sections_held, held);
    eprintln!("{gave_up} of 10 batch callers gave up before their answers");
    assert!(gave_up >= 1, "no caller gave up: the test proved nothing");
}
