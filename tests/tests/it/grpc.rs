//! The gRPC contract end to end: a real server on 127.0.0.1:0, real tonic clients. Every RPC,
//! its successes and its documented errors (code and `ErrorInfo` reason), auth, tokens, the
//! waiting room, health during recovery, restart, overload, and the metrics endpoint.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::Arc;

use boxoffice_engine::{Clock, ManualClock};
use boxoffice_proto::v1 as pb;
use boxoffice_tests::cases::{case, check_error_cases, expect_err};
use boxoffice_tests::server::{CLIENT, TestServer, reason};
use boxoffice_tests::wait::{PATIENCE, periodic_check};
use boxoffice_tests::{Clients, T0_MS};

pub(crate) use boxoffice_tests::best_available as best;
use sha2::Digest;
use tonic::Code;

pub(crate) fn ga(id: &str, capacity: u32, price: u64) -> pb::SectionSpec {
    pb::SectionSpec {
        section_id: id.into(),
        name: id.to_uppercase(),
        price_cents: price,
        layout: Some(pb::section_spec::Layout::GeneralAdmissionCapacity(capacity)),
        price_tiers: Vec::new(),
    }
}

pub(crate) fn reserved(id: &str, rows: &[(&str, u32)], price: u64) -> pb::SectionSpec {
    pb::SectionSpec {
        section_id: id.into(),
        name: id.to_uppercase(),
        price_cents: price,
        layout: Some(pb::section_spec::Layout::Reserved(pb::ReservedLayout {
            rows: rows
                .iter()
                .map(|(l, n)| pb::RowSpec {
                    label: (*l).into(),
                    seat_count: *n,
                })
                .collect(),
        })),
        price_tiers: Vec::new(),
    }
}

pub(crate) fn event(id: &str, sections: Vec<pb::SectionSpec>) -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        event_id: id.into(),
        name: format!("Event {id}"),
        sections,
        hold_ttl_seconds: 60,
        per_user_limit: 4,
        admit_rate_per_second: 1_000,
        admission_window_seconds: 120,
        sale_opens_at_unix_ms: 0,
        idempotency_key: String::new(),
        join_pow_difficulty_bits: 0,
        cancellation_deadline_unix_ms: 0,
        transfers_disabled: false,
        presale_section_ids: Vec::new(),
        presale_ends_at_unix_ms: 0,
        access_codes: Vec::new(),
    }
}

/// Joins and polls (advancing the manual clock so the admission timer has budget) until
/// admitted; returns the admission token.
pub(crate) async fn admitted(
    c: &mut Clients,
    clock: &ManualClock,
    event: &str,
    user: &str,
) -> String {
    admitted_all(c, || clock.advance_ms(20), event, &[user])
        .await
        .remove(0)
}

/// Joins `users` and polls until every one is admitted, calling `tick` after each poll that
/// found one still waiting (a server on the system clock needs nothing: pass `|| {}`);
/// returns their admission tokens, in order.
pub(crate) async fn admitted_all(
    c: &mut Clients,
    tick: impl Fn(),
    event: &str,
    users: &[&str],
) -> Vec<String> {
    let mut queue_tokens = Vec::new();
    for user in users {
        let t = c
            .room
            .join(pb::JoinRequest {
                event_id: event.into(),
                user_id: (*user).into(),
                session_id: "s".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        queue_tokens.push(t.queue_token);
    }
    let what = format!("{users:?} are admitted to {event}");
    let admitted = periodic_check(&what, PATIENCE, async || {
        let mut admitted = Vec::new();
        for queue_token in &queue_tokens {
            let s = c
                .room
                .get_status(pb::GetStatusRequest {
                    queue_token: queue_token.clone(),
                })
                .await
                .unwrap()
                .into_inner();
            if s.state != pb::QueueState::Admitted as i32 {
                tick();
                return Err(s);
            }
            admitted.push(s);
        }
        Ok(admitted)
    })
    .await;
    admitted
        .into_iter()
        .map(|s| {
            assert!(s.admission_expires_at_unix_ms > 0);
            s.admission_token
        })
        .collect()
}

/// Every section of `event`'s seat map (counts and seats, without their times), to check that
/// a refused call changed nothing.
pub(crate) async fn seats_of(c: &mut Clients, event: &str) -> Vec<pb::SectionSeats> {
    let mut sections = c
        .events
        .get_seat_map(pb::GetSeatMapRequest {
            event_id: event.into(),
            section_id: String::new(),
            first_row: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .sections;
    for s in &mut sections {
        s.as_of_unix_ms = 0;
    }
    sections
}

/// Every event, through every page of `ListEvents`.
pub(crate) async fn all_events(c: &mut Clients) -> Vec<pb::Event> {
    let mut events = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .events
            .list_events(pb::ListEventsRequest {
                page_size: 100,
                page_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        events.extend(page.events);
        if page.next_page_token.is_empty() {
            return events;
        }
        token = page.next_page_token;
    }
}

pub(crate) fn seats(event: &str, user: &str, token: &str, ids: &[&str]) -> pb::HoldRequest {
    pb::HoldRequest {
        event_id: event.into(),
        user_id: user.into(),
        admission_token: token.into(),
        idempotency_key: String::new(),
        selection: Some(pb::hold_request::Selection::Seats(pb::SeatSelection {
            seat_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        })),
        access_code: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_scopes_and_health_without_a_key() {
    let server = TestServer::start().await;
    let ch = server.channel();
    // No key.
    let mut bare = pb::event_service_client::EventServiceClient::new(ch.clone());
    let s = bare
        .get_event(pb::GetEventRequest {
            event_id: "x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::Unauthenticated);
    // Unknown key.
    let mut wrong = server.clients("not-a-key");
    let s = wrong
        .events
        .list_events(pb::ListEventsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::Unauthenticated);
    // A client key on an admin RPC.
    let mut c = server.client();
    let s = c
        .events
        .create_event(event("a", vec![ga("g", 1, 1)]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied);
    // Client keys read; admin keys write.
    let mut a = server.admin();
    a.events
        .create_event(event("a", vec![ga("g", 1, 1)]))
        .await
        .unwrap();
    c.events
        .get_event(pb::GetEventRequest {
            event_id: "a".into(),
        })
        .await
        .unwrap();
    // Health needs no key.
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
    let r = h
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_service_end_to_end() {
    let server = TestServer::start().await;
    let mut a = server.admin();
    let mut look = server.admin();
    let e = a
        .events
        .create_event(event(
            "show",
            vec![
                reserved("orch", &[("A", 4), ("B", 4)], 9_000),
                ga("floor", 10, 5_000),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(e.event_id, "show");
    assert_eq!(e.sections.len(), 2);
    assert_eq!(e.sections[0].kind, pb::SectionKind::Reserved as i32);
    assert_eq!((e.sections[0].capacity, e.sections[0].available), (8, 8));
    assert_eq!(e.sections[1].kind, pb::SectionKind::GeneralAdmission as i32);
    assert_eq!(e.state, pb::EventState::OnSale as i32);
    // Defaults for zero values; a generated id when none is given.
    let mut req = event("", vec![ga("g", 5, 1)]);
    req.hold_ttl_seconds = 0;
    req.per_user_limit = 0;
    req.admit_rate_per_second = 0;
    req.admission_window_seconds = 0;
    let generated = a.events.create_event(req).await.unwrap().into_inner();
    assert!(!generated.event_id.is_empty());
    assert_eq!(
        (
            generated.hold_ttl_seconds,
            generated.per_user_limit,
            generated.admit_rate_per_second,
            generated.admission_window_seconds
        ),
        (600, 4, 500, 120)
    );
    // Errors: refused, and no event is made or changed.
    let mut no_layout = event("bad", vec![ga("g", 1, 1)]);
    no_layout.sections[0].layout = None;
    check_error_cases(
        "CreateEvent",
        vec![
            case(
                "an id that exists",
                event("show", vec![ga("g", 1, 1)]),
                Code::AlreadyExists,
                "EVENT_EXISTS",
            ),
            case(
                "a section without a layout",
                no_layout,
                Code::InvalidArgument,
                "INVALID_REQUEST",
            )
            .field("sections[0].layout"),
            case(
                "an id with a space",
                event("bad id!", vec![ga("g", 1, 1)]),
                Code::InvalidArgument,
                "INVALID_REQUEST",
            ),
            case(
                "no sections",
                event("empty", vec![]),
                Code::InvalidArgument,
                "INVALID_REQUEST",
            ),
        ],
        async |r| a.events.create_event(r).await,
        async || all_events(&mut look).await,
    )
    .await;
    let get = |id: &str| pb::GetEventRequest {
        event_id: id.into(),
    };
    check_error_cases(
        "GetEvent",
        vec![
            case(
                "an unknown event",
                get("nope"),
                Code::NotFound,
                "EVENT_NOT_FOUND",
            ),
            case(
                "no event id",
                get(""),
                Code::InvalidArgument,
                "INVALID_REQUEST",
            ),
        ],
        async |r| a.events.get_event(r).await,
        async || all_events(&mut look).await,
    )
    .await;
    // Listing pages through everything exactly once.
    for i in 0..5 {
        a.events
            .create_event(event(&format!("p{i}"), vec![ga("g", 1, 1)]))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = a
            .events
            .list_events(pb::ListEventsRequest {
                page_size: 3,
                page_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.events.len() <= 3);
        seen.extend(page.events.into_iter().map(|e| e.event_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen.len(), 7);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 7, "no event twice");
    // Seat map: all sections, one section, unknown section.
    let map = a
        .events
        .get_seat_map(pb::GetSeatMapRequest {
            event_id: "show".into(),
            section_id: String::new(),
            first_row: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(map.sections.len(), 2);
    assert_eq!(map.sections[0].seats.len(), 8);
    assert_eq!(map.sections[0].seats[0].seat_id, "orch:A:1");
    assert_eq!(
        (
            map.sections[0].seats[5].row.as_str(),
            map.sections[0].seats[5].number
        ),
        ("B", 2)
    );
    assert!(
        map.sections[1].seats.is_empty(),
        "general admission has no seats"
    );
    assert!(map.as_of_unix_ms > 0);
    let one = a
        .events
        .get_seat_map(pb::GetSeatMapRequest {
            event_id: "show".into(),
            section_id: "floor".into(),
            first_row: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(one.sections.len(), 1);
    expect_err(
        a.events
            .get_seat_map(pb::GetSeatMapRequest {
                event_id: "show".into(),
                section_id: "x".into(),
                first_row: 0,
            })
            .await,
        Code::NotFound,
        "SECTION_NOT_FOUND",
    );
    server.shutdown().await;
}

/// The events of the booking tests: `b` (a reserved row of 4, general admission of 3 and of
/// 10; per-user limit 4) and `elsewhere` (a token for it is another event's).
pub(crate) async fn booking_events(a: &mut Clients) {
    a.events
        .create_event(event(
            "b",
            vec![
                reserved("orch", &[("A", 4)], 9_000),
                ga("floor", 3, 5_000),
                ga("pit", 10, 1_000),
            ],
        ))
        .await
        .unwrap();
    a.events
        .create_event(event("elsewhere", vec![ga("floor", 3, 5_000)]))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn booking_end_to_end_with_every_documented_error() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    let mut look = server.admin();
    booking_events(&mut a).await;
    let ann = admitted(&mut c, &clock, "b", "ann").await;
    let bob = admitted(&mut c, &clock, "b", "bob").await;
    let ann_elsewhere = admitted(&mut c, &clock, "elsewhere", "ann").await;

    // Tokens: missing, forged, flipped, another user's, another event's.
    let mut flipped = ann.clone().into_bytes();
    let mid = flipped.len() / 3;
    flipped[mid] = if flipped[mid] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    let ann_floor = |token: &str| best("b", "ann", token, "floor", 1, "");
    check_error_cases(
        "Hold with a bad admission token",
        vec![
            case(
                "no token",
                ann_floor(""),
                Code::InvalidArgument,
                "INVALID_REQUEST",
            ),
            case(
                "a forged token",
                ann_floor("forged.token"),
                Code::Unauthenticated,
                "TOKEN_INVALID",
            ),
            case(
                "a token with a flipped byte",
                ann_floor(&flipped),
                Code::Unauthenticated,
                "TOKEN_INVALID",
            ),
            case(
                "another fan's token",
                ann_floor(&bob),
                Code::Unauthenticated,
                "TOKEN_INVALID",
            ),
            case(
                "the fan's token for another event",
                ann_floor(&ann_elsewhere),
                Code::Unauthenticated,
                "TOKEN_INVALID",
            ),
        ],
        async |r| c.booking.hold(r).await,
        async || seats_of(&mut look, "b").await,
    )
    .await;

    // Holds: exact seats, a seat someone else holds, best available, sold out.
    let h1 = c
        .booking
        .hold(seats("b", "ann", &ann, &["orch:A:2", "orch:A:3"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(h1.seat_ids, ["orch:A:2", "orch:A:3"]);
    assert_eq!((h1.section_id.as_str(), h1.quantity), ("orch", 2));
    assert_eq!(h1.status, pb::HoldStatus::Held as i32);
    assert_eq!(
        h1.expires_at_unix_ms,
        i64::try_from(clock.now_ms()).unwrap() + 60_000
    );
    check_error_cases(
        "Hold of places that cannot be had",
        vec![
            case(
                "a seat someone else holds",
                seats("b", "bob", &bob, &["orch:A:3"]),
                Code::FailedPrecondition,
                "SEAT_UNAVAILABLE",
            ),
            case(
                "a seat that does not exist",
                seats("b", "bob", &bob, &["orch:Z:1"]),
                Code::NotFound,
                "SEAT_NOT_FOUND",
            ),
            case(
                "a seat id that is not one",
                seats("b", "bob", &bob, &["orch:A:1", "garbage"]),
                Code::InvalidArgument,
                "INVALID_REQUEST",
            )
            .field("seats.seat_ids[1]"),
            case(
                "a section that does not exist",
                best("b", "bob", &bob, "nope", 1, ""),
                Code::NotFound,
                "SECTION_NOT_FOUND",
            ),
            case(
                "no places",
                best("b", "bob", &bob, "floor", 0, ""),
                Code::InvalidArgument,
                "INVALID_REQUEST",
            ),
        ],
        async |r| c.booking.hold(r).await,
        async || seats_of(&mut look, "b").await,
    )
    .await;
    // An empty bearer is no key at all.
    let mut empty = server.clients("");
    let s = empty
        .events
        .list_events(pb::ListEventsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::Unauthenticated);
    let gah = c
        .booking
        .hold(best("b", "bob", &bob, "floor", 3, "k1"))
        .await
        .unwrap()
        .into_inner();
    assert!(gah.seat_ids.is_empty());
    assert_eq!(gah.quantity, 3);
    let carl = admitted(&mut c, &clock, "b", "carl").await;
    // The per-user limit across sections (4): ann has 2 in orch; 3 more in pit is too many.
    check_error_cases(
        "Hold of too many places",
        vec![
            case(
                "a section sold out",
                best("b", "carl", &carl, "floor", 1, ""),
                Code::FailedPrecondition,
                "SOLD_OUT",
            ),
            case(
                "more than the per-user limit across sections",
                best("b", "ann", &ann, "pit", 3, ""),
                Code::ResourceExhausted,
                "USER_LIMIT",
            ),
        ],
        async |r| c.booking.hold(r).await,
        async || seats_of(&mut look, "b").await,
    )
    .await;
    c.booking
        .hold(best("b", "ann", &ann, "pit", 2, ""))
        .await
        .unwrap();
    // Idempotent replay returns the first answer; the key with another request is refused.
    let replay = c
        .booking
        .hold(best("b", "bob", &bob, "floor", 3, "k1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay, gah);
    expect_err(
        c.booking.hold(best("b", "bob", &bob, "pit", 1, "k1")).await,
        Code::FailedPrecondition,
        "IDEMPOTENCY_KEY_REUSED",
    );

    // Confirm: an order with tickets and the amount; a bad payment token; someone else's hold.
    let confirm = |hold: &str, user: &str, token: &str, key: &str| pb::ConfirmRequest {
        hold_id: hold.into(),
        user_id: user.into(),
        payment_token: token.into(),
        idempotency_key: key.into(),
    };
    check_error_cases(
        "Confirm that cannot be",
        vec![
            case(
                "a payment token that is not one",
                confirm(&h1.hold_id, "ann", "visa", ""),
                Code::InvalidArgument,
                "INVALID_REQUEST",
            ),
            case(
                "someone else's hold",
                confirm(&h1.hold_id, "bob", "tok_x", ""),
                Code::NotFound,
                "HOLD_NOT_FOUND",
            ),
        ],
        async |r| c.booking.confirm(r).await,
        async || seats_of(&mut look, "b").await,
    )
    .await;
    let order = c
        .booking
        .confirm(confirm(&h1.hold_id, "ann", "tok_visa", "pay1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(order.amount_cents, 18_000);
    assert_eq!(order.tickets.len(), 2);
    assert_eq!(order.tickets[0].seat_id, "orch:A:2");
    assert!(
        order.payment_id.starts_with("pay_"),
        "the provider's id: {}",
        order.payment_id
    );
    assert_eq!(order.status, pb::OrderStatus::Confirmed as i32);
    let again = c
        .booking
        .confirm(confirm(&h1.hold_id, "ann", "tok_visa", "pay1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, order, "replay");
    expect_err(
        c.booking
            .confirm(confirm(&h1.hold_id, "ann", "tok_visa", ""))
            .await,
        Code::FailedPrecondition,
        "HOLD_NOT_ACTIVE",
    );
    let got = c
        .booking
        .get_order(pb::GetOrderRequest {
            order_id: order.order_id.clone(),
            user_id: "ann".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got, order);
    expect_err(
        c.booking
            .get_order(pb::GetOrderRequest {
                order_id: "b.orch.o123".into(),
                user_id: "ann".into(),
            })
            .await,
        Code::NotFound,
        "ORDER_NOT_FOUND",
    );
    let held = c
        .booking
        .get_hold(pb::GetHoldRequest {
            hold_id: h1.hold_id.clone(),
            user_id: "ann".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.status, pb::HoldStatus::Confirmed as i32);
    expect_err(
        c.booking
            .get_hold(pb::GetHoldRequest {
                hold_id: "junk".into(),
                user_id: "ann".into(),
            })
            .await,
        Code::NotFound,
        "HOLD_NOT_FOUND",
    );

    // Release: places come back; a released hold is not active.
    c.booking
        .release(pb::ReleaseRequest {
            hold_id: gah.hold_id.clone(),
            user_id: "bob".into(),
        })
        .await
        .unwrap();
    expect_err(
        c.booking
            .release(pb::ReleaseRequest {
                hold_id: gah.hold_id.clone(),
                user_id: "bob".into(),
            })
            .await,
        Code::FailedPrecondition,
        "HOLD_NOT_ACTIVE",
    );
    let map = c
        .events
        .get_seat_map(pb::GetSeatMapRequest {
            event_id: "b".into(),
            section_id: "floor".into(),
            first_row: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(map.sections[0].available, 3);

    // Expiry: a hold past its TTL cannot be confirmed.
    let h2 = c
        .booking
        .hold(best("b", "carl", &carl, "floor", 1, ""))
        .await
        .unwrap()
        .into_inner();
    clock.advance_ms(60_000);
    expect_err(
        c.booking
            .confirm(confirm(&h2.hold_id, "carl", "tok_visa", ""))
            .await,
        Code::FailedPrecondition,
        "HOLD_EXPIRED",
    );
    // The admission window (120 s from admission) closes too.
    clock.advance_ms(120_000);
    expect_err(
        c.booking
            .hold(best("b", "carl", &carl, "floor", 1, ""))
            .await,
        Code::Unauthenticated,
        "TOKEN_EXPIRED",
    );
    // A replay still returns the first answer after the admission window closed.
    let replay = c
        .booking
        .hold(best("b", "bob", &bob, "floor", 3, "k1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay, gah, "replay after the window");
    expect_err(
        c.booking
            .hold(best("b", "bob", &bob, "floor", 1, "k-new"))
            .await,
        Code::Unauthenticated,
        "TOKEN_EXPIRED",
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_room_shuffles_before_opening_and_admits_in_order() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    let mut req = event("w", vec![ga("g", 100, 1)]);
    req.sale_opens_at_unix_ms = i64::try_from(T0_MS + 10_000).unwrap();
    req.admit_rate_per_second = 5;
    a.events.create_event(req).await.unwrap();
    let before = a
        .events
        .get_event(pb::GetEventRequest {
            event_id: "w".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(before.state, pb::EventState::Scheduled as i32);
    assert!(
        before.shuffle_seed.is_empty(),
        "the seed is secret before opening"
    );
    assert_eq!(before.shuffle_seed_hash.len(), 64);
    // Fifty fans join before the opening; one refreshes.
    let mut tokens = Vec::new();
    for u in 0..50 {
        let t = c
            .room
            .join(pb::JoinRequest {
                event_id: "w".into(),
                user_id: format!("u{u}"),
                session_id: "s".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(t.position, 0, "no position before the draw");
        tokens.push(t.queue_token);
    }
    let again = c
        .room
        .join(pb::JoinRequest {
            event_id: "w".into(),
            user_id: "u7".into(),
            session_id: "s".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let s1 = c
        .room
        .get_status(pb::GetStatusRequest {
            queue_token: again.queue_token,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s1.state, pb::QueueState::Waiting as i32);
    // A queue token is not an admission.
    expect_err(
        c.booking
            .hold(best("w", "u0", &tokens[0], "g", 1, ""))
            .await,
        Code::PermissionDenied,
        "NOT_ADMITTED",
    );
    // Open: the seed is revealed and matches its commitment; positions are a permutation
    // reproducible from it.
    clock.advance_ms(10_000);
    // The seed is revealed once the line is drawn (at the admission timer's next tick), never
    // before the draw.
    let after = periodic_check("the line is drawn", PATIENCE, async || {
        let e = a
            .events
            .get_event(pb::GetEventRequest {
                event_id: "w".into(),
            })
            .await
            .unwrap()
            .into_inner();
        if !e.shuffle_seed.is_empty() {
            return Ok(e);
        }
        assert_eq!(e.shuffled_fans, 0, "drawn before the seed is revealed");
        Err(e)
    })
    .await;
    assert_eq!(after.state, pb::EventState::OnSale as i32);
    assert_eq!(
        after.shuffled_fans, 50,
        "the draw covered the fifty who came early"
    );
    let seed: [u8; 32] = hex::decode(&after.shuffle_seed)
        .unwrap()
        .try_into()
        .unwrap();
    assert_eq!(
        hex::encode(sha2::Sha256::digest(seed)),
        before.shuffle_seed_hash
    );
    let mut positions = Vec::new();
    for (u, t) in tokens.iter().enumerate() {
        let what = format!("u{u} has a place in the drawn line");
        let s = periodic_check(&what, PATIENCE, async || {
            let s = c
                .room
                .get_status(pb::GetStatusRequest {
                    queue_token: t.clone(),
                })
                .await
                .unwrap()
                .into_inner();
            if s.position > 0 { Ok(s) } else { Err(s) }
        })
        .await;
        positions.push(s.position);
    }
    let expected = boxoffice_gateway::waiting_room::shuffle_positions(&seed, 50);
    let expected: Vec<u64> = expected.iter().map(|p| u64::from(*p) + 1).collect();
    assert_eq!(positions, expected, "reproducible from the revealed seed");
    let mut sorted = positions.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=50).collect::<Vec<u64>>(), "a permutation");
    assert_ne!(
        positions,
        (1..=50).collect::<Vec<u64>>(),
        "not the arrival order"
    );
    // After the opening: first come, first served.
    let late = c
        .room
        .join(pb::JoinRequest {
            event_id: "w".into(),
            user_id: "late".into(),
            session_id: "s".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(late.position, 51);
    assert!(late.eta_seconds >= 1);
    // Admission in position order at 5/s: after 1 s of clock, positions 1..=5 and no others.
    clock.advance_ms(1_000);
    let fifth = positions.iter().position(|p| *p == 5).unwrap();
    let s = periodic_check("position 5 is admitted", PATIENCE, async || {
        let s = c
            .room
            .get_status(pb::GetStatusRequest {
                queue_token: tokens[fifth].clone(),
            })
            .await
            .unwrap()
            .into_inner();
        if s.state == pb::QueueState::Admitted as i32 {
            Ok(s)
        } else {
            Err(s)
        }
    })
    .await;
    // Position 6 is not admitted: the rate holds.
    let sixth = tokens[positions.iter().position(|p| *p == 6).unwrap()].clone();
    let s6 = c
        .room
        .get_status(pb::GetStatusRequest {
            queue_token: sixth.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s6.state, pb::QueueState::Waiting as i32);
    assert_eq!(s6.ahead, 0);
    // Admitted with its queue token or its admission token, the fan can hold.
    let u = format!("u{fifth}");
    c.booking
        .hold(best("w", &u, &s.admission_token, "g", 1, ""))
        .await
        .unwrap();
    // Bad queue tokens.
    expect_err(
        c.room
            .get_status(pb::GetStatusRequest {
                queue_token: "x.y".into(),
            })
            .await,
        Code::Unauthenticated,
        "TOKEN_INVALID",
    );
    expect_err(
        c.room
            .join(pb::JoinRequest {
                event_id: "nope".into(),
                user_id: "u".into(),
                session_id: String::new(),
                ..Default::default()
            })
            .await,
        Code::NotFound,
        "EVENT_NOT_FOUND",
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_has_a_maximum() {
    let server = TestServer::builder().queue_max(3).start().await;
    let mut a = server.admin();
    a.events
        .create_event(event("q", vec![ga("g", 10, 1)]))
        .await
        .unwrap();
    for u in 0..3 {
        a.room
            .join(pb::JoinRequest {
                event_id: "q".into(),
                user_id: format!("u{u}"),
                session_id: String::new(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    expect_err(
        a.room
            .join(pb::JoinRequest {
                event_id: "q".into(),
                user_id: "u9".into(),
                session_id: String::new(),
                ..Default::default()
            })
            .await,
        Code::ResourceExhausted,
        "QUEUE_FULL",
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_serving_until_recovery_and_restart_keeps_holds_and_orders() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    a.events
        .create_event(event("r", vec![ga("g", 10, 100)]))
        .await
        .unwrap();
    let tok = admitted(&mut a, &clock, "r", "ann").await;
    let old_place = a
        .room
        .join(pb::JoinRequest {
            event_id: "r".into(),
            user_id: "zed".into(),
            session_id: "s".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .queue_token;
    let hold = a
        .booking
        .hold(best("r", "ann", &tok, "g", 2, ""))
        .await
        .unwrap()
        .into_inner();
    let other = a
        .booking
        .hold(best("r", "ann", &tok, "g", 1, ""))
        .await
        .unwrap()
        .into_inner();
    let order = a
        .booking
        .confirm(pb::ConfirmRequest {
            hold_id: other.hold_id.clone(),
            user_id: "ann".into(),
            payment_token: "tok_a".into(),
            idempotency_key: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    // zed's turn comes (the same place: the same user and session join again).
    admitted(&mut a, &clock, "r", "zed").await;
    let place_before = a
        .room
        .get_status(pb::GetStatusRequest {
            queue_token: old_place.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(place_before.state, pb::QueueState::Admitted as i32);
    let home = server.home().clone();
    server.shutdown().await;

    // Restart on the same data dir, with recovery held back until we have looked.
    let gate = Arc::new(tokio::sync::Notify::new());
    let mut server = TestServer::builder()
        .home(home)
        .recovery_gate(gate.clone())
        .start()
        .await;
    let mut h = tonic_health::pb::health_client::HealthClient::new(server.channel());
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    let r = h
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, not_serving);
    let mut a = server.admin();
    expect_err(
        a.booking
            .get_hold(pb::GetHoldRequest {
                hold_id: hold.hold_id.clone(),
                user_id: "ann".into(),
            })
            .await,
        Code::Unavailable,
        "NOT_READY",
    );
    gate.notify_one();
    server.wait_ready().await;
    let r = h
        .check(tonic_health::pb::HealthCheckRequest {
            service: "boxoffice.v1.BookingService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let back = a
        .booking
        .get_hold(pb::GetHoldRequest {
            hold_id: hold.hold_id.clone(),
            user_id: "ann".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(back, hold, "the hold survived, same deadline");
    // The line is in the log (issue 13): a queue token from before the restart keeps its place
    // and its admission (same window), and books.
    let st = a
        .room
        .get_status(pb::GetStatusRequest {
            queue_token: old_place.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            st.state,
            st.position,
            st.admission_expires_at_unix_ms,
            &st.admission_token
        ),
        (
            place_before.state,
            place_before.position,
            place_before.admission_expires_at_unix_ms,
            &place_before.admission_token
        )
    );
    a.booking
        .hold(best("r", "zed", &old_place, "g", 1, ""))
        .await
        .unwrap();
    let back = a
        .booking
        .get_order(pb::GetOrderRequest {
            order_id: order.order_id.clone(),
            user_id: "ann".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(back, order);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_shed_at_once_not_queued() {
    let server = TestServer::builder().in_flight_max(2).start().await;
    let mut a = server.admin();
    a.events
        .create_event(event("o", vec![ga("g", 100_000, 1)]))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let mut c = server.client();
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut shed) = (0, 0);
            for i in 0..40 {
                let r = c
                    .room
                    .join(pb::JoinRequest {
                        event_id: "o".into(),
                        user_id: format!("t{t}-{i}"),
                        session_id: String::new(),
                        ..Default::default()
                    })
                    .await;
                match r {
                    Ok(_) => ok += 1,
                    Err(s) if s.code() == Code::ResourceExhausted && reason(&s) == "OVERLOADED" => {
                        use tonic_types::StatusExt as _;
                        let retry = s.get_details_retry_info().and_then(|r| r.retry_delay);
                        assert_eq!(
                            retry,
                            Some(std::time::Duration::from_millis(100)),
                            "OVERLOADED suggests where backoff starts"
                        );
                        shed += 1
                    }
                    Err(s) => panic!("unexpected {s:?}"),
                }
            }
            (ok, shed)
        }));
    }
    let (mut ok, mut shed) = (0, 0);
    for t in tasks {
        let (o, s) = t.await.unwrap();
        ok += o;
        shed += s;
    }
    assert_eq!(ok + shed, 320, "every call answered");
    assert!(ok > 0, "admitted traffic is served");
    assert!(shed > 0, "8 concurrent streams over a bound of 2 are shed");
    server.shutdown().await;
}

/// GET /metrics with a bare HTTP/1.0 request.
pub(crate) async fn scrape(addr: std::net::SocketAddr) -> String {
    let (status, body) = get_raw(addr, "/metrics", None).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    String::from_utf8(body).unwrap()
}

/// `GET path` on the metrics port with `authorization` (a bearer key): status code and body.
pub(crate) async fn get_raw(
    addr: std::net::SocketAddr,
    path: &str,
    key: Option<&str>,
) -> (u16, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n{auth}\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, out[split + 4..].to_vec())
}

/// The metric families the endpoint must export.
const FAMILIES: [&str; 9] = [
    "boxoffice_rpc_duration_seconds_bucket",
    "boxoffice_section_holds_total",
    "boxoffice_section_rejections_total",
    "boxoffice_section_mailbox_depth",
    "boxoffice_wal_flush_seconds_bucket",
    "boxoffice_wal_batch_records_bucket",
    "boxoffice_wal_bytes_total",
    "boxoffice_waiting_room_queue_length",
    "boxoffice_waiting_room_admitted_total",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_prometheus_text_with_the_families() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    a.events
        .create_event(event("m", vec![ga("g", 2, 1)]))
        .await
        .unwrap();
    let tok = admitted(&mut a, &clock, "m", "ann").await;
    a.booking
        .hold(best("m", "ann", &tok, "g", 2, ""))
        .await
        .unwrap();
    let tok = admitted(&mut a, &clock, "m", "bob").await;
    let _ = a
        .booking
        .hold(best("m", "bob", &tok, "g", 1, ""))
        .await
        .unwrap_err();
    // Some families appear with a snapshot/gauge publication or an upkeep: wait for those.
    let text = periodic_check("every family is exported", PATIENCE, async || {
        let text = scrape(server.metrics_addr()).await;
        let missing: Vec<&str> = FAMILIES
            .iter()
            .copied()
            .filter(|f| !text.contains(f))
            .collect();
        if missing.is_empty() {
            Ok(text)
        } else {
            Err(missing)
        }
    })
    .await;
    // Prometheus text: comments, or `name{labels} value`.
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "{line}"
        );
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{line}"
        );
    }
    for family in FAMILIES {
        assert!(text.contains(family), "missing {family} in\n{text}");
    }
    assert!(
        text.contains("# TYPE boxoffice_rpc_duration_seconds histogram"),
        "a histogram, not a summary"
    );
    assert!(text.contains("reason=\"SOLD_OUT\""));
    server.shutdown().await;
}

/// A message with the wire shape of `GetEventRequest` but bytes where a string belongs.
#[derive(Clone, PartialEq, prost::Message)]
struct RawGetEvent {
    #[prost(bytes = "vec", tag = "1")]
    event_id: Vec<u8>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_are_invalid_arguments_with_a_reason() {
    let server = TestServer::start().await;
    let mut grpc = tonic::client::Grpc::new(server.channel());
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(RawGetEvent {
        event_id: vec![0xff, 0xfe, 0x00],
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {CLIENT}").parse().unwrap());
    let path = http::uri::PathAndQuery::from_static("/boxoffice.v1.EventService/GetEvent");
    let codec = tonic_prost::ProstCodec::<RawGetEvent, pb::Event>::default();
    let s = grpc.unary(req, path, codec).await.unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert_eq!(reason(&s), "INVALID_REQUEST");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waitlist_gets_the_released_places_over_grpc() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    let mut look = server.admin();
    a.events
        .create_event(event(
            "wl",
            vec![reserved("orch", &[("A", 2)], 5_000), ga("floor", 1, 1)],
        ))
        .await
        .unwrap();
    // Sell out the orchestra: ann holds both seats.
    let ann = admitted(&mut c, &clock, "wl", "ann").await;
    let hold = c
        .booking
        .hold(best("wl", "ann", &ann, "orch", 2, ""))
        .await
        .unwrap()
        .into_inner();
    expect_err(
        c.booking.hold(best("wl", "ann", &ann, "orch", 1, "")).await,
        Code::FailedPrecondition,
        "SOLD_OUT",
    );
    // Bob and Cat come through the waiting room: the waitlist is behind the line too.
    let tokens = admitted_all(&mut c, || clock.advance_ms(20), "wl", &["bob", "cat"]).await;
    let (bob_tok, cat_tok) = (&tokens[0], &tokens[1]);
    // Bad input and unknown ids.
    let join = |user: &str, token: &str, section: &str, q: u32| pb::JoinWaitlistRequest {
        event_id: "wl".into(),
        user_id: user.into(),
        section_id: section.into(),
        quantity: q,
        admission_token: token.into(),
    };
    // Refused joins take no place in the line: Bob and Cat below are its first two.
    check_error_cases(
        "JoinWaitlist",
        vec![
            case(
                "no places",
                join("bob", bob_tok, "orch", 0),
                Code::InvalidArgument,
                "INVALID_REQUEST",
            )
            .field("quantity"),
            case(
                "more places than the per-user limit",
                join("bob", bob_tok, "orch", 9),
                Code::InvalidArgument,
                "INVALID_REQUEST",
            )
            .field("quantity"),
            case(
                "a section that does not exist",
                join("bob", bob_tok, "nope", 1),
                Code::NotFound,
                "SECTION_NOT_FOUND",
            ),
            case(
                "an event that does not exist",
                pb::JoinWaitlistRequest {
                    event_id: "nope".into(),
                    ..join("bob", bob_tok, "", 1)
                },
                Code::NotFound,
                "EVENT_NOT_FOUND",
            ),
            case(
                "the floor's place is free: hold it",
                join("bob", bob_tok, "floor", 1),
                Code::FailedPrecondition,
                "PLACES_AVAILABLE",
            ),
            case(
                "any section, and the floor's place is free",
                join("bob", bob_tok, "", 1),
                Code::FailedPrecondition,
                "PLACES_AVAILABLE",
            ),
        ],
        async |r| c.waitlist.join_waitlist(r).await,
        async || {
            let waiting = server.engine().waitlist_len(&"wl".into()).await.unwrap();
            (seats_of(&mut look, "wl").await, waiting)
        },
    )
    .await;
    expect_err(
        c.waitlist
            .get_waitlist_entry(pb::GetWaitlistEntryRequest {
                entry_id: "wl.wnothing".into(),
                user_id: "bob".into(),
            })
            .await,
        Code::NotFound,
        "ENTRY_NOT_FOUND",
    );
    // Bob and Cat wait for the orchestra (sold out, although the floor is not).
    let bob = c
        .waitlist
        .join_waitlist(join("bob", bob_tok, "orch", 2))
        .await
        .unwrap()
        .into_inner();
    let cat = c
        .waitlist
        .join_waitlist(join("cat", cat_tok, "orch", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((bob.position, cat.position), (1, 2));
    assert_eq!(bob.state, pb::WaitlistState::Waiting as i32);
    assert!(bob.offered_hold_id.is_empty());
    let entry = |id: &str, user: &str| pb::GetWaitlistEntryRequest {
        entry_id: id.into(),
        user_id: user.into(),
    };
    // Ann releases: the places go to Bob, the head of the line, as a hold in his name.
    c.booking
        .release(pb::ReleaseRequest {
            hold_id: hold.hold_id.clone(),
            user_id: "ann".into(),
        })
        .await
        .unwrap();
    let offered = periodic_check("bob's entry is offered", PATIENCE, async || {
        let e = c
            .waitlist
            .get_waitlist_entry(entry(&bob.entry_id, "bob"))
            .await
            .unwrap()
            .into_inner();
        if e.state == pb::WaitlistState::Offered as i32 {
            Ok(e)
        } else {
            Err(e)
        }
    })
    .await;
    assert_eq!(offered.position, 0);
    let h = c
        .booking
        .get_hold(pb::GetHoldRequest {
            hold_id: offered.offered_hold_id.clone(),
            user_id: "bob".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (h.user_id.as_str(), h.status, h.quantity),
        ("bob", pb::HoldStatus::Held as i32, 2)
    );
    assert_eq!(h.seat_ids, ["orch:A:1", "orch:A:2"]);
    // Cat moved up; Bob confirms and his entry is fulfilled.
    let cat_now = c
        .waitlist
        .get_waitlist_entry(entry(&cat.entry_id, "cat"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (cat_now.position, cat_now.state),
        (1, pb::WaitlistState::Waiting as i32)
    );
    c.booking
        .confirm(pb::ConfirmRequest {
            hold_id: h.hold_id.clone(),
            user_id: "bob".into(),
            payment_token: "tok_visa".into(),
            idempotency_key: String::new(),
        })
        .await
        .unwrap();
    periodic_check("bob's entry is fulfilled", PATIENCE, async || {
        let e = c
            .waitlist
            .get_waitlist_entry(entry(&bob.entry_id, "bob"))
            .await
            .unwrap()
            .into_inner();
        if e.state == pb::WaitlistState::Fulfilled as i32 {
            Ok(())
        } else {
            Err(e)
        }
    })
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_over_grpc_declines_times_out_and_issues_verifiable_tickets() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    let mut look = server.admin();
    a.events
        .create_event(event("co", vec![reserved("orch", &[("A", 4)], 7_500)]))
        .await
        .unwrap();
    let tok = admitted(&mut c, &clock, "co", "ann").await;
    let hold = c
        .booking
        .hold(best("co", "ann", &tok, "orch", 2, ""))
        .await
        .unwrap()
        .into_inner();
    let confirm = |token: &str, key: &str| pb::ConfirmRequest {
        hold_id: hold.hold_id.clone(),
        user_id: "ann".into(),
        payment_token: token.into(),
        idempotency_key: key.into(),
    };
    // The hold stays through all that (the same hold, the same seats).
    check_error_cases(
        "Confirm with a payment that does not go through",
        vec![
            case(
                "a declined card",
                confirm("tok_decline", "k1"),
                Code::FailedPrecondition,
                "PAYMENT_DECLINED",
            ),
            case(
                "a provider that times out",
                confirm("tok_timeout", "k2"),
                Code::DeadlineExceeded,
                "PAYMENT_TIMEOUT",
            ),
            case(
                "a provider that fails",
                confirm("tok_error", "k3"),
                Code::Unavailable,
                "PAYMENT_UNAVAILABLE",
            ),
        ],
        async |r| c.booking.confirm(r).await,
        async || {
            let held = look
                .booking
                .get_hold(pb::GetHoldRequest {
                    hold_id: hold.hold_id.clone(),
                    user_id: "ann".into(),
                })
                .await
                .unwrap()
                .into_inner();
            (held, seats_of(&mut look, "co").await)
        },
    )
    .await;
    // The hold stayed through all that; the timed-out charge is picked up by the retry.
    let order = c
        .booking
        .confirm(confirm("tok_timeout", "k2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(order.amount_cents, 15_000);
    assert!(order.payment_id.starts_with("pay_"));
    // Every ticket carries a code a scanner verifies offline with the public keys.
    let ring = boxoffice_gateway::tickets::KeyRing::load(server.dir()).unwrap();
    for t in &order.tickets {
        let claims = ring.verify(&t.code).unwrap().claims;
        assert_eq!(
            (
                claims.event_id.as_str(),
                claims.seat_id.as_str(),
                claims.order_id.as_str(),
                claims.ticket_id.as_str()
            ),
            (
                "co",
                t.seat_id.as_str(),
                order.order_id.as_str(),
                t.ticket_id.as_str()
            )
        );
    }
    let again = c
        .booking
        .get_order(pb::GetOrderRequest {
            order_id: order.order_id.clone(),
            user_id: "ann".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, order, "codes are stable");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_not_serving_once_the_engine_stops_and_calls_say_storage_failed() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    a.events
        .create_event(event("st", vec![ga("g", 10, 100)]))
        .await
        .unwrap();
    let tok = admitted(&mut a, &clock, "st", "ann").await;
    a.booking
        .hold(best("st", "ann", &tok, "g", 1, ""))
        .await
        .unwrap();
    let mut h = tonic_health::pb::health_client::HealthClient::new(server.channel());
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    assert_eq!(health_of(&mut h).await, vec![serving; 2]);
    // A ledger shard that panics cannot be rebuilt while sections hold places: the engine stops.
    server
        .engine()
        .panic_ledger(&boxoffice_engine::UserId::from("ann"))
        .unwrap();
    periodic_check("health turns NOT_SERVING", PATIENCE, async || {
        health_of(&mut h).await == vec![not_serving; 2]
    })
    .await;
    let err = a
        .booking
        .hold(best("st", "ann", &tok, "g", 1, ""))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(reason(&err), "STORAGE_FAILED");
    assert_eq!(
        err.message(),
        "the engine stopped: nothing was acknowledged; retry after a restart",
        "callers get a fixed text, not the cause (a panic message naming other users)"
    );
    let stop = server.shutdown_result().await.unwrap_err();
    assert!(
        format!("{stop:#}").contains("ledger shard"),
        "the shutdown says what failed: {stop:#}"
    );
}

/// Health of the whole server (`""`) and of the booking service, in that order.
async fn health_of(
    h: &mut tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>,
) -> Vec<i32> {
    let mut out = Vec::new();
    for service in ["", "boxoffice.v1.BookingService"] {
        let r = h
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap();
        out.push(r.into_inner().status);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_sweeper_dies_stops_visibly() {
    let server = TestServer::start().await;
    let mut h = tonic_health::pb::health_client::HealthClient::new(server.channel());
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    assert_eq!(health_of(&mut h).await, vec![serving; 2]);
    // Without a sweeper no hold would ever expire: the server must not go on as if all is well.
    server.sweeper().kill();
    periodic_check("health turns NOT_SERVING", PATIENCE, async || {
        health_of(&mut h).await == vec![not_serving; 2]
    })
    .await;
    let why = server
        .engine()
        .stopped()
        .expect("the engine says why it stopped");
    assert!(why.contains("sweeper"), "{why}");
    let stop = server.shutdown_result().await.unwrap_err();
    assert!(format!("{stop:#}").contains("sweeper"), "{stop:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_ids_get_tokens_the_server_accepts_back() {
    // 64-byte event and user ids (the engine's maximum): their queue and admission tokens are
    // longer than other id fields may be, and must still be accepted by GetStatus and Hold.
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let ev = "e".repeat(boxoffice_engine::ID_LEN_MAX);
    let user = "u".repeat(boxoffice_engine::ID_LEN_MAX);
    a.events
        .create_event(event(&ev, vec![ga("g", 10, 100)]))
        .await
        .unwrap();
    let tok = admitted(&mut a, &clock, &ev, &user).await;
    assert!(
        tok.len() > 256,
        "the admission token is {} bytes",
        tok.len()
    );
    assert!(tok.len() <= boxoffice_gateway::limits::TOKEN_LEN_MAX);
    let hold = a
        .booking
        .hold(best(&ev, &user, &tok, "g", 2, ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hold.quantity, 2);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_server_visibly_and_its_reads_with_it() {
    let sink = boxoffice_engine::MemorySink::new();
    let server = TestServer::builder().memory_log(sink.clone()).start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    a.events
        .create_event(event("fd", vec![ga("g", 10, 100)]))
        .await
        .unwrap();
    let tok = admitted(&mut a, &clock, "fd", "ann").await;
    a.booking
        .hold(best("fd", "ann", &tok, "g", 1, ""))
        .await
        .unwrap();
    sink.fill_disk();
    let err = a
        .booking
        .hold(best("fd", "ann", &tok, "g", 1, ""))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::Unavailable, "STORAGE_FAILED")
    );
    assert!(
        !err.message().contains("os error") && !err.message().contains("space"),
        "no internal text: {}",
        err.message()
    );
    // Reads stop too: the published counts may include the hold that was never acknowledged.
    let reads = [
        a.events
            .get_event(pb::GetEventRequest {
                event_id: "fd".into(),
            })
            .await
            .map(|_| ()),
        a.events
            .get_seat_map(pb::GetSeatMapRequest {
                event_id: "fd".into(),
                section_id: String::new(),
                first_row: 0,
            })
            .await
            .map(|_| ()),
        a.events
            .list_events(pb::ListEventsRequest::default())
            .await
            .map(|_| ()),
    ];
    for read in reads {
        let e = read.unwrap_err();
        assert_eq!(
            (e.code(), reason(&e).as_str()),
            (Code::Unavailable, "STORAGE_FAILED")
        );
    }
    let mut h = tonic_health::pb::health_client::HealthClient::new(server.channel());
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    periodic_check("health turns NOT_SERVING", PATIENCE, async || {
        health_of(&mut h).await == vec![not_serving; 2]
    })
    .await;
    // The shutdown (SIGTERM, for the binary) is not clean, and says what failed.
    let stop = server.shutdown_result().await.unwrap_err();
    assert!(
        format!("{stop:#}").contains("No space left on device"),
        "{stop:#}"
    );
}
