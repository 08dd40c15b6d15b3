//! Tickets moved to another fan (issue 29, point 3): `TransferTickets` over gRPC and
//! `POST /v1/orders/{orderId}/transfer`. Ownership moves and capacity does not change; the
//! recipient gets new ticket ids and codes in a received order linked to the original (shown by
//! `ListOrders`), the old codes are revoked; the recipient's per-user limit holds; transfers can
//! be switched off per event; a transfer racing a cancellation of the same ticket: one wins; a
//! restart keeps everything and the books add up.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use boxoffice_engine::{Clock, EventId, UserId};
use boxoffice_proto::v1 as pb;
use boxoffice_tests::Clients;
use boxoffice_tests::cases::{case, check_error_cases, expect_err};
use boxoffice_tests::server::{CLIENT, TestServer};
use tonic::Code;

use crate::grpc::{admitted, best, event, ga, reserved, seats, seats_of};

fn transfer(
    order: &pb::Order,
    tickets: &[&str],
    to: &str,
    key: &str,
) -> pb::TransferTicketsRequest {
    pb::TransferTicketsRequest {
        order_id: order.order_id.clone(),
        user_id: order.user_id.clone(),
        ticket_ids: tickets
            .iter()
            .map(|t| format!("{}.{t}", order.order_id))
            .collect(),
        to_user_id: to.into(),
        idempotency_key: key.into(),
    }
}

async fn buy(c: &mut Clients, req: pb::HoldRequest) -> pb::Order {
    let hold = c.booking.hold(req).await.unwrap().into_inner();
    crate::cancel::pay(c, hold).await
}

async fn orders_of(c: &mut Clients, user: &str) -> Vec<pb::Order> {
    c.booking
        .list_orders(pb::ListOrdersRequest {
            user_id: user.into(),
            page_size: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .orders
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_move_to_another_fan_with_new_codes_and_the_old_ones_revoked() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let engine = server.engine();
    let mut a = server.admin();
    let mut c = server.client();
    a.events
        .create_event(pb::CreateEventRequest {
            cancellation_deadline_unix_ms: i64::try_from(clock.now_ms() + 3_600_000).unwrap(),
            ..event(
                "tx",
                vec![reserved("r", &[("A", 4)], 5_000), ga("g", 10, 100)],
            )
        })
        .await
        .unwrap();
    a.events
        .create_event(pb::CreateEventRequest {
            transfers_disabled: true,
            ..event("fixed", vec![ga("g", 4, 100)])
        })
        .await
        .unwrap();
    let ann = admitted(&mut c, &clock, "tx", "ann").await;
    let dan = admitted(&mut c, &clock, "tx", "dan").await;
    let ann_fixed = admitted(&mut c, &clock, "fixed", "ann").await;
    let row = buy(
        &mut c,
        seats("tx", "ann", &ann, &["r:A:1", "r:A:2", "r:A:3"]),
    )
    .await;
    let fixed = buy(&mut c, best("fixed", "ann", &ann_fixed, "g", 1, "")).await;
    // dan holds 4 places: at his limit.
    let dans = buy(&mut c, best("tx", "dan", &dan, "g", 4, "")).await;
    let usage = async |user: &str| {
        engine
            .user_usage(&EventId::from("tx"), &UserId::from(user))
            .await
            .unwrap()
    };
    // The seats and counts, not when they changed.
    let places = async |c: &mut Clients| {
        let mut m = seats_of(c, "tx").await;
        for s in &mut m {
            (s.version, s.changed_at_unix_ms) = (0, 0);
        }
        m
    };
    let seats_before = places(&mut c).await;

    // Refused: nothing moves (the seats, ann's order, the allowances).
    let mut look = server.client();
    let table = vec![
        case(
            "to nobody",
            transfer(&row, &["1"], "", ""),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("to_user_id"),
        case(
            "to oneself",
            transfer(&row, &["1"], "ann", ""),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("to_user_id"),
        case(
            "no tickets",
            transfer(&row, &[], "bob", ""),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("ticket_ids"),
        case(
            "a ticket not of the order",
            transfer(&row, &["9"], "bob", ""),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("ticket_ids"),
        case(
            "someone else's order",
            pb::TransferTicketsRequest {
                user_id: "cat".into(),
                ..transfer(&row, &["1"], "bob", "")
            },
            Code::NotFound,
            "ORDER_NOT_FOUND",
        ),
        case(
            "past the recipient's limit",
            transfer(&row, &["1"], "dan", ""),
            Code::ResourceExhausted,
            "USER_LIMIT",
        ),
        case(
            "an event with transfers off",
            transfer(&fixed, &["1"], "bob", ""),
            Code::FailedPrecondition,
            "TRANSFERS_DISABLED",
        ),
    ];
    let order_now = async |look: &mut Clients, o: &pb::Order| {
        look.booking
            .get_order(pb::GetOrderRequest {
                order_id: o.order_id.clone(),
                user_id: o.user_id.clone(),
            })
            .await
            .unwrap()
            .into_inner()
    };
    check_error_cases(
        "TransferTickets",
        table,
        async |r| c.booking.transfer_tickets(r).await,
        async || {
            (
                seats_of(&mut look, "tx").await,
                order_now(&mut look, &row).await,
                usage("ann").await,
                usage("dan").await,
                usage("bob").await,
            )
        },
    )
    .await;

    // ann moves seat A:2 to bob: the seat stays sold, in bob's new order.
    let moved = c
        .booking
        .transfer_tickets(transfer(&row, &["2"], "bob", "give-bob"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        moved.transferred_ticket_ids,
        [format!("{}.2", row.order_id)]
    );
    let after = moved.order.clone().unwrap();
    let seat_ids =
        |o: &pb::Order| -> Vec<String> { o.tickets.iter().map(|t| t.seat_id.clone()).collect() };
    assert_eq!(seat_ids(&after), ["r:A:1", "r:A:3"]);
    assert_eq!(after.refunded_cents, 0, "nothing refunded");
    assert_eq!(
        places(&mut c).await,
        seats_before,
        "capacity and sales unchanged"
    );
    assert_eq!((usage("ann").await, usage("bob").await), (2, 1));
    let bobs = orders_of(&mut c, "bob").await;
    assert_eq!(bobs.len(), 1);
    let received = &bobs[0];
    assert_eq!(received.order_id, moved.received_order_id);
    assert_eq!(received.transferred_from_order_id, row.order_id);
    assert_eq!(
        (received.amount_cents, received.payment_id.as_str()),
        (0, "")
    );
    assert_eq!(seat_ids(received), ["r:A:2"]);
    assert_eq!(
        received.tickets[0].ticket_id,
        format!("{}.1", received.order_id)
    );
    // The new code verifies; the old one is on the revocation list, the new one is not.
    let keys = boxoffice_gateway::tickets::KeyRing::load(server.dir())
        .unwrap()
        .keys()
        .to_vec();
    let new_claims = boxoffice_gateway::tickets::verify(&received.tickets[0].code, &keys)
        .unwrap()
        .claims;
    assert_eq!(new_claims.order_id, received.order_id);
    let list = c
        .events
        .get_revocation_list(pb::GetRevocationListRequest {
            event_id: "tx".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let (revoked, _) = boxoffice_gateway::tickets::verify_revocations(&list.signed, &keys).unwrap();
    let old = row.tickets.iter().find(|t| t.seat_id == "r:A:2").unwrap();
    let old_claims = boxoffice_gateway::tickets::verify(&old.code, &keys)
        .unwrap()
        .claims;
    assert!(revoked.ticket_ids.contains(&old_claims.ticket_id));
    assert!(!revoked.ticket_ids.contains(&new_claims.ticket_id));
    // The same key again: the same transfer; the ticket is gone from ann's order.
    let again = c
        .booking
        .transfer_tickets(transfer(&row, &["2"], "bob", "give-bob"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.received_order_id, moved.received_order_id);
    assert_eq!(
        (usage("ann").await, usage("bob").await),
        (2, 1),
        "a replay moves nothing"
    );
    expect_err(
        c.booking
            .transfer_tickets(transfer(&row, &["2"], "cat", ""))
            .await,
        Code::FailedPrecondition,
        "TICKET_NOT_ACTIVE",
    );
    // bob passes it on over HTTP: a received order can be transferred again.
    let http = server.http(Some(CLIENT));
    let on = http
        .post(
            &format!("/v1/orders/{}/transfer", received.order_id),
            &[("idempotency-key", "bob-to-eve")],
            &serde_json::json!({"userId": "bob", "toUserId": "eve",
                "ticketIds": [received.tickets[0].ticket_id]}),
        )
        .await;
    assert_eq!(on.status, 200, "{on:?}");
    let eves = orders_of(&mut c, "eve").await;
    assert_eq!(eves[0].transferred_from_order_id, received.order_id);
    assert_eq!(on.json()["receivedOrderId"], eves[0].order_id.as_str());
    assert_eq!((usage("bob").await, usage("eve").await), (0, 1));

    // A transfer and a cancellation of the same ticket at once: exactly one wins.
    let (mut c1, mut c2) = (server.client(), server.client());
    let t = transfer(&row, &["3"], "fay", "");
    let x = pb::CancelTicketsRequest {
        order_id: row.order_id.clone(),
        user_id: "ann".into(),
        ticket_ids: vec![format!("{}.3", row.order_id)],
        idempotency_key: String::new(),
    };
    let (moved3, cancelled3) = tokio::join!(
        async move { c1.booking.transfer_tickets(t).await },
        async move { c2.booking.cancel_tickets(x).await },
    );
    assert_ne!(
        moved3.is_ok(),
        cancelled3.is_ok(),
        "{moved3:?} {cancelled3:?}"
    );
    let lost = moved3.err().or(cancelled3.err()).unwrap();
    assert_eq!(boxoffice_tests::server::reason(&lost), "TICKET_NOT_ACTIVE");
    assert_eq!(
        usage("fay").await,
        u32::from(orders_of(&mut c, "fay").await.len() == 1)
    );
    assert!(engine.reconcile().await.unwrap().is_empty());
    assert!(engine.invariant_violations().await.unwrap().is_empty());
    // eve gives her received ticket back: the place returns, nothing is refunded (she paid
    // nothing), and the books still add up.
    let eves_order = &orders_of(&mut c, "eve").await[0];
    let given = c
        .booking
        .cancel_tickets(pb::CancelTicketsRequest {
            order_id: eves_order.order_id.clone(),
            user_id: "eve".into(),
            ticket_ids: vec![eves_order.tickets[0].ticket_id.clone()],
            idempotency_key: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((given.refund_cents, given.refund_id.as_str()), (0, ""));
    assert_eq!(usage("eve").await, 0);
    assert!(engine.reconcile().await.unwrap().is_empty());

    // The change stream carries the transfers.
    let moves: Vec<_> = crate::cancel::changes_of_kind(&mut a, "tx", "tickets_transferred")
        .await
        .into_iter()
        .map(|c| {
            let t = c.tickets_transferred.unwrap();
            (t.from_order.unwrap().order_id, t.to_order.unwrap().user_id)
        })
        .collect();
    assert_eq!(
        moves[..2],
        [
            (row.order_id.clone(), "bob".into()),
            (received.order_id.clone(), "eve".into())
        ]
    );

    // A restart keeps every order, received ones included; the books add up.
    let home = server.home().clone();
    let (bob_before, eve_before) = (
        orders_of(&mut c, "bob").await,
        orders_of(&mut c, "eve").await,
    );
    drop(engine);
    server.shutdown().await;
    let server = TestServer::builder().home(home).start().await;
    let engine = server.engine();
    let mut c = server.client();
    assert_eq!(orders_of(&mut c, "bob").await, bob_before);
    assert_eq!(orders_of(&mut c, "eve").await, eve_before);
    assert_eq!(
        engine
            .user_usage(&EventId::from("tx"), &UserId::from("eve"))
            .await
            .unwrap(),
        0
    );
    assert!(engine.reconcile().await.unwrap().is_empty());
    let _ = dans;
    drop(engine);
    server.shutdown().await;
}
