//! Every request is safe (issue 12, points 2 and 4), over gRPC:
//! - the waitlist is behind the line: `JoinWaitlist` takes the fan's admission token, checked as
//!   `Hold` checks it, and is refused (`PLACES_AVAILABLE`) while the places wanted can be held;
//! - holds, orders and waitlist entries are their owners': `GetHold`, `GetOrder` and
//!   `GetWaitlistEntry` answer anyone else exactly as they answer an unknown id.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use boxoffice_proto::v1 as pb;
use boxoffice_tests::Clients;
use boxoffice_tests::cases::{case, check_error_cases, expect_err};
use boxoffice_tests::server::TestServer;
use tonic::{Code, Response, Status};

use crate::grpc::{admitted, admitted_all, best, event, ga, reserved, seats_of};

/// An event whose holds outlive the admission window (600 s against 120 s), so a test can let
/// the tokens expire with every hold still held.
fn long_holds(id: &str, sections: Vec<pb::SectionSpec>) -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        hold_ttl_seconds: 600,
        ..event(id, sections)
    }
}

fn join(user: &str, token: &str, section: &str, q: u32) -> pb::JoinWaitlistRequest {
    pb::JoinWaitlistRequest {
        event_id: "bl".into(),
        user_id: user.into(),
        section_id: section.into(),
        quantity: q,
        admission_token: token.into(),
    }
}

async fn entry(c: &mut Clients, id: &str, user: &str) -> pb::WaitlistEntry {
    c.waitlist
        .get_waitlist_entry(pb::GetWaitlistEntryRequest {
            entry_id: id.into(),
            user_id: user.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waitlist_is_behind_the_line_and_only_for_places_that_cannot_be_held() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    let mut look = server.admin();
    a.events
        .create_event(long_holds(
            "bl",
            vec![ga("g", 2, 100), reserved("r", &[("A", 2)], 200)],
        ))
        .await
        .unwrap();
    a.events
        .create_event(long_holds("other", vec![ga("g", 1, 100)]))
        .await
        .unwrap();
    let fans = ["ann", "bob", "cat", "dan", "eve"];
    let t = admitted_all(&mut c, || clock.advance_ms(20), "bl", &fans).await;
    let (ann, bob, cat, dan, eve) = (&t[0], &t[1], &t[2], &t[3], &t[4]);
    let ann_elsewhere = admitted(&mut c, &clock, "other", "ann").await;
    let engine = server.engine();
    // What a refused join must leave as it was: the seats, and the line (its length and every
    // entry in it, positions included).
    let state = async |look: &mut Clients, entries: &[(&str, &str)]| {
        let mut seen = Vec::new();
        for (id, user) in entries {
            seen.push(entry(look, id, user).await);
        }
        let waiting = engine.waitlist_len(&"bl".into()).await.unwrap();
        (seats_of(look, "bl").await, waiting, seen)
    };

    // Every place is free. Mal never joined the waiting room.
    check_error_cases(
        "JoinWaitlist while every place is free",
        vec![
            case(
                "never in line: no admission token",
                join("mal", "", "g", 1),
                Code::InvalidArgument,
                "INVALID_REQUEST",
            )
            .field("admission_token"),
            case(
                "never in line: a made-up token",
                join("mal", "eyJ.bm9wZQ", "g", 1),
                Code::Unauthenticated,
                "TOKEN_INVALID",
            ),
            case(
                "never in line: another fan's admission",
                join("mal", ann, "g", 1),
                Code::Unauthenticated,
                "TOKEN_INVALID",
            ),
            case(
                "admitted to another event",
                join("ann", &ann_elsewhere, "g", 1),
                Code::Unauthenticated,
                "TOKEN_INVALID",
            ),
            case(
                "admitted, but the section's places are free",
                join("ann", ann, "g", 2),
                Code::FailedPrecondition,
                "PLACES_AVAILABLE",
            ),
            case(
                "admitted, but the reserved section's seats are free",
                join("ann", ann, "r", 2),
                Code::FailedPrecondition,
                "PLACES_AVAILABLE",
            ),
            case(
                "admitted, any section, places free",
                join("ann", ann, "", 2),
                Code::FailedPrecondition,
                "PLACES_AVAILABLE",
            ),
        ],
        async |r| c.waitlist.join_waitlist(r).await,
        async || state(&mut look, &[]).await,
    )
    .await;
    let refused = c
        .waitlist
        .join_waitlist(join("ann", ann, "g", 1))
        .await
        .unwrap_err();
    assert!(
        refused.message().contains("hold them"),
        "the message says what to do instead: {}",
        refused.message()
    );

    // Bob takes the reserved section; Cat one of the two places of "g".
    c.booking
        .hold(best("bl", "bob", bob, "r", 2, ""))
        .await
        .unwrap();
    c.booking
        .hold(best("bl", "cat", cat, "g", 1, ""))
        .await
        .unwrap();
    // "r" is sold out: Ann may wait for it, although "g" has a place.
    let ann_entry = c
        .waitlist
        .join_waitlist(join("ann", ann, "r", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            ann_entry.position,
            ann_entry.state,
            ann_entry.user_id.as_str()
        ),
        (1, pb::WaitlistState::Waiting as i32, "ann")
    );
    // "g" has one place, not the two Dan wants: he may wait for them.
    let dan_entry = c
        .waitlist
        .join_waitlist(join("dan", dan, "g", 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dan_entry.position, 2);
    let line = [
        (ann_entry.entry_id.as_str(), "ann"),
        (dan_entry.entry_id.as_str(), "dan"),
    ];
    check_error_cases(
        "JoinWaitlist with fans in line and one place free",
        vec![
            case(
                "the one place Eve wants is free",
                join("eve", eve, "g", 1),
                Code::FailedPrecondition,
                "PLACES_AVAILABLE",
            ),
            case(
                "any section, and one place is free",
                join("eve", eve, "", 1),
                Code::FailedPrecondition,
                "PLACES_AVAILABLE",
            ),
            case(
                "never in line, with Eve's admission",
                join("mal", eve, "r", 1),
                Code::Unauthenticated,
                "TOKEN_INVALID",
            ),
            case(
                "never in line, with no admission",
                join("mal", "", "r", 1),
                Code::InvalidArgument,
                "INVALID_REQUEST",
            )
            .field("admission_token"),
        ],
        async |r| c.waitlist.join_waitlist(r).await,
        async || state(&mut look, &line).await,
    )
    .await;
    // Eve takes the last place; now the whole event is held, and she may wait for any section,
    // third in line (the refused joins took no place).
    c.booking
        .hold(best("bl", "eve", eve, "g", 1, ""))
        .await
        .unwrap();
    let eve_entry = c
        .waitlist
        .join_waitlist(join("eve", eve, "", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(eve_entry.position, 3);
    assert_eq!(entry(&mut c, &ann_entry.entry_id, "ann").await, ann_entry);
    assert_eq!(entry(&mut c, &dan_entry.entry_id, "dan").await, dan_entry);

    // The admission window closes (the holds last longer). A retry of a join that was answered
    // gets its entry back; a fan without an entry is refused as `Hold` refuses her.
    clock.advance_ms(121_000);
    let again = c
        .waitlist
        .join_waitlist(join("ann", ann, "r", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, ann_entry);
    expect_err(
        c.waitlist.join_waitlist(join("cat", cat, "r", 1)).await,
        Code::Unauthenticated,
        "TOKEN_EXPIRED",
    );
    expect_err(
        c.booking.hold(best("bl", "cat", cat, "r", 1, "")).await,
        Code::Unauthenticated,
        "TOKEN_EXPIRED",
    );
    assert_eq!(engine.waitlist_len(&"bl".into()).await.unwrap(), 3);
    server.shutdown().await;
}

/// The code, message and details (every byte of them) of a refusal: what a caller can see.
fn shape<T: std::fmt::Debug>(r: Result<Response<T>, Status>) -> (Code, String, Vec<u8>) {
    let s = r.unwrap_err();
    (s.code(), s.message().to_owned(), s.details().to_vec())
}

/// `id` with its last character changed: well formed, same event and section, no such thing.
fn unknown_like(id: &str) -> String {
    let mut s = id.to_owned();
    let last = s.pop().unwrap();
    s.push(if last == 'Z' { 'Y' } else { 'Z' });
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_orders_and_waitlist_entries_answer_their_owners_only() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    a.events
        .create_event(long_holds("own", vec![ga("g", 2, 2_500)]))
        .await
        .unwrap();
    let t = admitted_all(&mut c, || clock.advance_ms(20), "own", &["ann", "bob"]).await;
    let (ann, bob) = (&t[0], &t[1]);
    let paid = c
        .booking
        .hold(best("own", "ann", ann, "g", 1, ""))
        .await
        .unwrap()
        .into_inner();
    let order = c
        .booking
        .confirm(pb::ConfirmRequest {
            hold_id: paid.hold_id.clone(),
            user_id: "ann".into(),
            payment_token: "tok_visa".into(),
            idempotency_key: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!order.tickets[0].code.is_empty());
    let held = c
        .booking
        .hold(best("own", "ann", ann, "g", 1, ""))
        .await
        .unwrap()
        .into_inner();
    // Sold out: Bob waits.
    let waiting = c
        .waitlist
        .join_waitlist(pb::JoinWaitlistRequest {
            event_id: "own".into(),
            user_id: "bob".into(),
            section_id: String::new(),
            quantity: 1,
            admission_token: bob.clone(),
        })
        .await
        .unwrap()
        .into_inner();

    let get_hold = |id: &str, user: &str| pb::GetHoldRequest {
        hold_id: id.into(),
        user_id: user.into(),
    };
    let get_order = |id: &str, user: &str| pb::GetOrderRequest {
        order_id: id.into(),
        user_id: user.into(),
    };
    let get_entry = |id: &str, user: &str| pb::GetWaitlistEntryRequest {
        entry_id: id.into(),
        user_id: user.into(),
    };

    // The owners read the whole thing: the hold as the answer to Hold, the order with its
    // ticket codes as the answer to Confirm, the entry as the answer to JoinWaitlist.
    let h = c.booking.get_hold(get_hold(&held.hold_id, "ann")).await;
    assert_eq!(h.unwrap().into_inner(), held);
    let h = c.booking.get_hold(get_hold(&paid.hold_id, "ann")).await;
    assert_eq!(
        h.unwrap().into_inner().status,
        pb::HoldStatus::Confirmed as i32
    );
    let o = c.booking.get_order(get_order(&order.order_id, "ann")).await;
    assert_eq!(o.unwrap().into_inner(), order);
    let e = c
        .waitlist
        .get_waitlist_entry(get_entry(&waiting.entry_id, "bob"))
        .await;
    assert_eq!(e.unwrap().into_inner(), waiting);
    // Admin keys name the user too (API keys name the calling service, not the fan).
    let o = a.booking.get_order(get_order(&order.order_id, "ann")).await;
    assert_eq!(o.unwrap().into_inner(), order);

    // Anyone else gets what an unknown id gets, byte for byte: nothing tells "not yours" from
    // "no such thing". Checked with the client key and the admin key.
    for clients in [&mut c, &mut a] {
        for (id, reason) in [
            (&held.hold_id, "HOLD_NOT_FOUND"),
            (&paid.hold_id, "HOLD_NOT_FOUND"),
        ] {
            let theirs = clients.booking.get_hold(get_hold(id, "bob")).await;
            let unknown = clients
                .booking
                .get_hold(get_hold(&unknown_like(id), "bob"))
                .await;
            let unknown_to_owner = clients
                .booking
                .get_hold(get_hold(&unknown_like(id), "ann"))
                .await;
            let (theirs, unknown) = (shape(theirs), shape(unknown));
            assert_eq!(theirs, unknown, "another's hold {id} looks like no hold");
            assert_eq!(shape(unknown_to_owner), unknown);
            expect_err(
                clients.booking.get_hold(get_hold(id, "bob")).await,
                Code::NotFound,
                reason,
            );
        }
        let id = &order.order_id;
        let theirs = shape(clients.booking.get_order(get_order(id, "bob")).await);
        let unknown = shape(
            clients
                .booking
                .get_order(get_order(&unknown_like(id), "bob"))
                .await,
        );
        assert_eq!(theirs, unknown, "another's order looks like no order");
        expect_err(
            clients.booking.get_order(get_order(id, "bob")).await,
            Code::NotFound,
            "ORDER_NOT_FOUND",
        );
        let id = &waiting.entry_id;
        let theirs = shape(
            clients
                .waitlist
                .get_waitlist_entry(get_entry(id, "ann"))
                .await,
        );
        let unknown = shape(
            clients
                .waitlist
                .get_waitlist_entry(get_entry(&unknown_like(id), "ann"))
                .await,
        );
        assert_eq!(theirs, unknown, "another's entry looks like no entry");
        expect_err(
            clients
                .waitlist
                .get_waitlist_entry(get_entry(id, "ann"))
                .await,
            Code::NotFound,
            "ENTRY_NOT_FOUND",
        );
    }

    // Without a user (or with a malformed one) the request is invalid, naming the field, for
    // admin keys too. The reads change nothing, and the owner still reads the same.
    for clients in [&mut c, &mut a] {
        check_error_cases(
            "GetHold without its user",
            vec![
                case(
                    "no user",
                    get_hold(&held.hold_id, ""),
                    Code::InvalidArgument,
                    "INVALID_REQUEST",
                )
                .field("user_id"),
                case(
                    "a user with a control character",
                    get_hold(&held.hold_id, "ann\n"),
                    Code::InvalidArgument,
                    "INVALID_REQUEST",
                )
                .field("user_id"),
                case(
                    "no hold id",
                    get_hold("", "ann"),
                    Code::InvalidArgument,
                    "INVALID_REQUEST",
                )
                .field("hold_id"),
            ],
            async |r| clients.booking.get_hold(r).await,
            async || (),
        )
        .await;
        check_error_cases(
            "GetOrder without its user",
            vec![
                case(
                    "no user",
                    get_order(&order.order_id, ""),
                    Code::InvalidArgument,
                    "INVALID_REQUEST",
                )
                .field("user_id"),
                case(
                    "no order id",
                    get_order("", "ann"),
                    Code::InvalidArgument,
                    "INVALID_REQUEST",
                )
                .field("order_id"),
            ],
            async |r| clients.booking.get_order(r).await,
            async || (),
        )
        .await;
        check_error_cases(
            "GetWaitlistEntry without its user",
            vec![
                case(
                    "no user",
                    get_entry(&waiting.entry_id, ""),
                    Code::InvalidArgument,
                    "INVALID_REQUEST",
                )
                .field("user_id"),
                case(
                    "no entry id",
                    get_entry("", "bob"),
                    Code::InvalidArgument,
                    "INVALID_REQUEST",
                )
                .field("entry_id"),
            ],
            async |r| clients.waitlist.get_waitlist_entry(r).await,
            async || (),
        )
        .await;
    }
    let h = c.booking.get_hold(get_hold(&held.hold_id, "ann")).await;
    assert_eq!(h.unwrap().into_inner(), held, "still held, unchanged");
    server.shutdown().await;
}
