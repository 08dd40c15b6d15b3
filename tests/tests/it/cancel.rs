//! Tickets given back (issue 29, point 2): `CancelTickets` over gRPC and
//! `POST /v1/orders/{orderId}/cancel`. In one logged step the tickets leave the order, their
//! places come back (first to the waitlist), the buyer's allowance goes down; the refund is made
//! once per cancellation, and a refund that fails is made by the refund pass. Bad input is
//! refused with its reason and changes nothing; a restart keeps every cancellation; the change
//! stream carries each; reconciliation stays clean.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::atomic::Ordering;

use boxoffice_engine::{Clock, EventId, UserId};
use boxoffice_proto::v1 as pb;
use boxoffice_tests::Clients;
use boxoffice_tests::cases::{case, check_error_cases};
use boxoffice_tests::server::{CLIENT, TestServer};
use boxoffice_tests::wait::{PATIENCE, periodic_check};
use tonic::Code;

use crate::grpc::{admitted, best, event, ga, reserved, seats, seats_of};

/// An event whose tickets may be given back for an hour from `now`.
fn cancellable(id: &str, now_ms: u64, sections: Vec<pb::SectionSpec>) -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        cancellation_deadline_unix_ms: i64::try_from(now_ms + 3_600_000).unwrap(),
        ..event(id, sections)
    }
}

/// Pays for `hold`: its order.
pub(crate) async fn pay(c: &mut Clients, hold: pb::Hold) -> pb::Order {
    c.booking
        .confirm(pb::ConfirmRequest {
            hold_id: hold.hold_id,
            user_id: hold.user_id,
            payment_token: "tok_visa".into(),
            idempotency_key: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
}

fn cancel(order: &pb::Order, user: &str, tickets: &[&str], key: &str) -> pb::CancelTicketsRequest {
    pb::CancelTicketsRequest {
        order_id: order.order_id.clone(),
        user_id: user.into(),
        ticket_ids: tickets
            .iter()
            .map(|t| format!("{}.{t}", order.order_id))
            .collect(),
        idempotency_key: key.into(),
    }
}

/// Every change of `kind` to `event` so far, in order.
pub(crate) async fn changes_of_kind(a: &mut Clients, event: &str, kind: &str) -> Vec<pb::Change> {
    let mut stream = a
        .changes
        .watch_changes(pb::WatchChangesRequest {
            after_cursor: "0".into(),
            event_id: event.into(),
            follow: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut found = Vec::new();
    while let Some(change) = stream.message().await.unwrap() {
        if change.kind == kind {
            found.push(change);
        }
    }
    found
}

async fn order_now(c: &mut Clients, order: &pb::Order) -> pb::Order {
    c.booking
        .get_order(pb::GetOrderRequest {
            order_id: order.order_id.clone(),
            user_id: order.user_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_given_back_come_back_refunded_once_and_survive_a_restart() {
    let payments = tempfile::tempdir().unwrap();
    let provider = boxoffice_tests::payments::Gated::open(payments.path());
    provider.gate.add_permits(1_000);
    let server = TestServer::builder()
        .payments(provider.clone())
        .start()
        .await;
    let clock = server.clock().clone();
    let now = clock.now_ms();
    let engine = server.engine();
    let mut a = server.admin();
    let mut c = server.client();
    a.events
        .create_event(cancellable(
            "cx",
            now,
            vec![reserved("r", &[("A", 3)], 5_000), ga("g", 10, 1_000)],
        ))
        .await
        .unwrap();
    a.events
        .create_event(event("nocancel", vec![ga("g", 10, 1_000)]))
        .await
        .unwrap();
    let ann = admitted(&mut c, &clock, "cx", "ann").await;
    let cat = admitted(&mut c, &clock, "cx", "cat").await;
    let ann_elsewhere = admitted(&mut c, &clock, "nocancel", "ann").await;
    // ann buys the whole row A (3 seats, at the per-user limit of 4 with 1 GA place).
    let row = c
        .booking
        .hold(seats("cx", "ann", &ann, &["r:A:1", "r:A:2", "r:A:3"]))
        .await
        .unwrap()
        .into_inner();
    let row = pay(&mut c, row).await;
    let floor = c
        .booking
        .hold(best("cx", "ann", &ann, "g", 1, ""))
        .await
        .unwrap()
        .into_inner();
    let floor = pay(&mut c, floor).await;
    let elsewhere = c
        .booking
        .hold(best("nocancel", "ann", &ann_elsewhere, "g", 1, ""))
        .await
        .unwrap()
        .into_inner();
    let elsewhere = pay(&mut c, elsewhere).await;
    assert_eq!(
        engine
            .user_usage(&EventId::from("cx"), &UserId::from("ann"))
            .await
            .unwrap(),
        4
    );
    // cat waits for a seat of row A (sold out).
    let entry = c
        .waitlist
        .join_waitlist(pb::JoinWaitlistRequest {
            event_id: "cx".into(),
            user_id: "cat".into(),
            section_id: "r".into(),
            quantity: 1,
            admission_token: cat.clone(),
        })
        .await
        .unwrap()
        .into_inner();

    // Refused: nothing changes (the seats, the order, ann's allowance).
    let mut look = server.client();
    let table = vec![
        case(
            "no user",
            cancel(&row, "", &["2"], ""),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("user_id"),
        case(
            "no order",
            pb::CancelTicketsRequest {
                order_id: String::new(),
                ..cancel(&row, "ann", &["2"], "")
            },
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("order_id"),
        case(
            "no tickets",
            cancel(&row, "ann", &[], ""),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("ticket_ids"),
        case(
            "a ticket of no order of this order",
            cancel(&row, "ann", &["7"], ""),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("ticket_ids"),
        case(
            "a ticket named twice",
            cancel(&row, "ann", &["1", "1"], ""),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("ticket_ids"),
        case(
            "another fan's order",
            cancel(&row, "cat", &["2"], ""),
            Code::NotFound,
            "ORDER_NOT_FOUND",
        ),
        case(
            "an order id that is not one",
            pb::CancelTicketsRequest {
                order_id: "cx.r.onothing".into(),
                ..cancel(&row, "ann", &["2"], "")
            },
            Code::NotFound,
            "ORDER_NOT_FOUND",
        ),
        case(
            "an event without cancellations",
            cancel(&elsewhere, "ann", &["1"], ""),
            Code::FailedPrecondition,
            "CANCELLATION_CLOSED",
        ),
    ];
    let usage = async || {
        engine
            .user_usage(&EventId::from("cx"), &UserId::from("ann"))
            .await
            .unwrap()
    };
    check_error_cases(
        "CancelTickets",
        table,
        async |r| c.booking.cancel_tickets(r).await,
        async || {
            (
                seats_of(&mut look, "cx").await,
                order_now(&mut look, &row).await,
                usage().await,
            )
        },
    )
    .await;

    // ann gives seat A:2 back: the order keeps A:1 and A:3, ann's allowance is 3, the refund is
    // made at once; the seat goes to cat, who waited.
    let done = c
        .booking
        .cancel_tickets(cancel(&row, "ann", &["2"], "give-back-1"))
        .await
        .unwrap()
        .into_inner();
    let after = done.order.clone().unwrap();
    let seat_ids =
        |o: &pb::Order| -> Vec<String> { o.tickets.iter().map(|t| t.seat_id.clone()).collect() };
    assert_eq!(seat_ids(&after), ["r:A:1", "r:A:3"]);
    assert_eq!(done.cancelled_ticket_ids, [format!("{}.2", row.order_id)]);
    assert_eq!(after.cancelled_ticket_ids, done.cancelled_ticket_ids);
    assert_eq!((done.refund_cents, after.refunded_cents), (5_000, 5_000));
    assert_eq!(after.amount_cents, 15_000, "what was charged stays");
    assert!(!done.refund_id.is_empty(), "refunded at once");
    assert_eq!(after.status, pb::OrderStatus::Confirmed as i32);
    assert_eq!(order_now(&mut c, &row).await, after);
    // The same key again: the same answer, nothing more given back or refunded.
    let again = c
        .booking
        .cancel_tickets(cancel(&row, "ann", &["2"], "give-back-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, done);
    for (name, req, code, reason) in [
        (
            "the key with other tickets",
            cancel(&row, "ann", &["3"], "give-back-1"),
            Code::FailedPrecondition,
            "IDEMPOTENCY_KEY_REUSED",
        ),
        (
            "a ticket given back already",
            cancel(&row, "ann", &["2"], ""),
            Code::FailedPrecondition,
            "TICKET_NOT_ACTIVE",
        ),
    ] {
        let got = c.booking.cancel_tickets(req).await;
        boxoffice_tests::cases::expect_err(got, code, reason);
        let _ = name;
    }
    // The event's revocation list names the ticket: signed with the ticket key, it revokes
    // the code ann was given for it (checked offline, as a gate does), and no other.
    let keys = boxoffice_gateway::tickets::KeyRing::load(server.dir())
        .unwrap()
        .keys()
        .to_vec();
    let list = c
        .events
        .get_revocation_list(pb::GetRevocationListRequest {
            event_id: "cx".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let (signed, _) = boxoffice_gateway::tickets::verify_revocations(&list.signed, &keys).unwrap();
    assert_eq!(signed.ticket_ids, done.cancelled_ticket_ids);
    assert_eq!(signed.ticket_ids, list.ticket_ids);
    for t in &row.tickets {
        let claims = boxoffice_gateway::tickets::verify(&t.code, &keys)
            .unwrap()
            .claims;
        assert_eq!(
            signed.ticket_ids.contains(&claims.ticket_id),
            claims.seat_id == "r:A:2",
            "{claims:?}"
        );
    }
    let over_http = server
        .http(Some(CLIENT))
        .get("/v1/events/cx/revocations", &[])
        .await
        .json();
    assert_eq!(
        over_http["ticketIds"],
        serde_json::json!(done.cancelled_ticket_ids)
    );
    boxoffice_gateway::tickets::verify_revocations(over_http["signed"].as_str().unwrap(), &keys)
        .unwrap();
    let offered = periodic_check("cat is offered the seat given back", PATIENCE, async || {
        let e = c
            .waitlist
            .get_waitlist_entry(pb::GetWaitlistEntryRequest {
                entry_id: entry.entry_id.clone(),
                user_id: "cat".into(),
            })
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
    let cats = c
        .booking
        .get_hold(pb::GetHoldRequest {
            hold_id: offered.offered_hold_id.clone(),
            user_id: "cat".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cats.seat_ids, ["r:A:2"]);
    let cats_order = pay(&mut c, cats).await;
    assert_eq!(
        seat_ids(&cats_order),
        ["r:A:2"],
        "the seat is sold again, once"
    );
    assert_eq!(
        usage().await,
        3,
        "ann's allowance went down by the ticket given back"
    );
    // ann may buy one more place now.
    let more = c
        .booking
        .hold(best("cx", "ann", &ann, "g", 1, ""))
        .await
        .unwrap()
        .into_inner();
    pay(&mut c, more).await;

    // The whole floor order over HTTP, while the provider's refunds are down: the places come
    // back at once, the refund is owed; reconciliation names it until the refund pass makes
    // it.
    provider.fail_refunds.store(true, Ordering::SeqCst);
    let http = server.http(Some(CLIENT));
    let whole = http
        .post(
            &format!("/v1/orders/{}/cancel", floor.order_id),
            &[("idempotency-key", "floor-back")],
            &serde_json::json!({"userId": "ann", "ticketIds": [format!("{}.1", floor.order_id)]}),
        )
        .await;
    assert_eq!(whole.status, 200, "{whole:?}");
    let whole = whole.json();
    assert_eq!(whole["order"]["status"], "REFUNDED");
    assert_eq!(whole["order"]["tickets"].as_array().unwrap().len(), 0);
    assert_eq!(
        (whole["refundCents"].as_u64(), whole["refundId"].as_str()),
        (Some(1_000), Some(""))
    );
    let findings = engine.reconcile().await.unwrap();
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0].kind(), "refund_missing");
    let late = http
        .post(
            &format!("/v1/orders/{}/cancel", floor.order_id),
            &[],
            &serde_json::json!({"userId": "ann", "ticketIds": [format!("{}.1", floor.order_id)]}),
        )
        .await;
    assert_eq!(
        (late.status.as_u16(), late.reason()),
        (409, "TICKET_NOT_ACTIVE".to_owned())
    );
    provider.fail_refunds.store(false, Ordering::SeqCst);
    let (left, settled) = engine
        .settle_and_reconcile(std::time::Duration::ZERO)
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(settled.refunded.len(), 1);
    assert_eq!(settled.refunded[0].1, 1_000);
    assert!(engine.reconcile().await.unwrap().is_empty());
    // Made once: another pass refunds nothing more.
    let (_, settled) = engine
        .settle_and_reconcile(std::time::Duration::ZERO)
        .await
        .unwrap();
    assert!(settled.refunded.is_empty());

    // The change stream carries both cancellations, with their refund keys.
    let cancelled: Vec<_> = changes_of_kind(&mut a, "cx", "tickets_cancelled")
        .await
        .into_iter()
        .map(|c| {
            let t = c.tickets_cancelled.unwrap();
            (t.ticket_ids, t.refund_cents, t.refund_key)
        })
        .collect();
    assert_eq!(
        cancelled,
        [
            (
                done.cancelled_ticket_ids.clone(),
                5_000,
                format!("{}:cancel:1", row.order_id)
            ),
            (
                vec![format!("{}.1", floor.order_id)],
                1_000,
                format!("{}:cancel:1", floor.order_id)
            ),
        ]
    );

    // A restart keeps every cancellation, the seats, the allowance; the books still add up.
    let seats_before = seats_of(&mut look, "cx").await;
    let home = server.home().clone();
    drop(engine);
    server.shutdown().await;
    let server = TestServer::builder()
        .home(home)
        .payments(provider.clone())
        .start()
        .await;
    let engine = server.engine();
    let mut c = server.client();
    assert_eq!(order_now(&mut c, &row).await, after);
    assert_eq!(seats_of(&mut c, "cx").await, seats_before);
    assert_eq!(
        engine
            .user_usage(&EventId::from("cx"), &UserId::from("ann"))
            .await
            .unwrap(),
        3
    );
    assert!(engine.reconcile().await.unwrap().is_empty());
    assert!(engine.invariant_violations().await.unwrap().is_empty());
    // The revocation list still names both cancellations' tickets.
    let list = c
        .events
        .get_revocation_list(pb::GetRevocationListRequest {
            event_id: "cx".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut revoked = done.cancelled_ticket_ids.clone();
    revoked.push(format!("{}.1", floor.order_id));
    revoked.sort();
    assert_eq!(list.ticket_ids, revoked);
    // The key still answers its first cancellation.
    let replayed = c
        .booking
        .cancel_tickets(cancel(&row, "ann", &["2"], "give-back-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replayed.cancelled_ticket_ids, done.cancelled_ticket_ids);
    assert_eq!(replayed.refund_id, done.refund_id);
    server.shutdown().await;
}

/// Past the event's cancellation deadline nothing is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cancellation_deadline_closes_cancellations() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    a.events
        .create_event(cancellable("late", clock.now_ms(), vec![ga("g", 4, 100)]))
        .await
        .unwrap();
    let ann = admitted(&mut c, &clock, "late", "ann").await;
    let h = c
        .booking
        .hold(best("late", "ann", &ann, "g", 2, ""))
        .await
        .unwrap()
        .into_inner();
    let order = pay(&mut c, h).await;
    let event = c
        .events
        .get_event(pb::GetEventRequest {
            event_id: "late".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(event.cancellation_deadline_unix_ms > 0);
    clock.advance_ms(3_600_001);
    let refused = c
        .booking
        .cancel_tickets(cancel(&order, "ann", &["1"], ""))
        .await;
    boxoffice_tests::cases::expect_err(refused, Code::FailedPrecondition, "CANCELLATION_CLOSED");
    assert_eq!(order_now(&mut c, &order).await.tickets.len(), 2);
    server.shutdown().await;
}
