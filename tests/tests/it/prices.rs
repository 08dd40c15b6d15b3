//! Price tiers (issue 29, point 6): a section's first places sell at a lower price, each place
//! priced by the tier it is taken from (a hold across a boundary pays each tier's price for
//! its own places), fixed when the hold is made, shown on the hold, the order's tickets, the
//! event and the seat map, charged by the confirm, refunded per ticket; a place given back
//! returns to its tier. Over gRPC and HTTP, with bad tiers refused and nothing created; kept by
//! a restart (and a replayed hold's answer read back from disk); exact under concurrent buyers.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::Arc;

use boxoffice_engine::{ConfirmRequest, EventId, HoldRequest, SectionId, Selection, UserId};
use boxoffice_proto::v1 as pb;
use boxoffice_tests::cases::expect_err;
use boxoffice_tests::server::{ADMIN, CLIENT, TestServer};
use tonic::Code;

use crate::grpc::{admitted, best, event, ga, reserved};

fn tier(places: u32, price_cents: u64) -> pb::PriceTier {
    pb::PriceTier {
        places,
        price_cents,
    }
}

fn tiered(mut section: pb::SectionSpec, tiers: Vec<pb::PriceTier>) -> pb::SectionSpec {
    section.price_tiers = tiers;
    section
}

/// `floor`: 10 places, 3 at 90.00, 3 at 120.00, the rest at 150.00; `orch`: 2 rows of 5
/// seats, the first 4 at 200.00, the rest at 300.00; `plain`: no tiers. Tickets may be given
/// back.
fn tiered_event(id: &str) -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        cancellation_deadline_unix_ms: i64::MAX / 2,
        ..event(
            id,
            vec![
                tiered(
                    ga("floor", 10, 15_000),
                    vec![tier(3, 9_000), tier(3, 12_000)],
                ),
                tiered(
                    reserved("orch", &[("A", 5), ("B", 5)], 30_000),
                    vec![tier(4, 20_000)],
                ),
                ga("plain", 10, 5_000),
            ],
        )
    }
}

/// Each section's tiers as (places, price, remaining), and its next price.
async fn tiers_of(
    c: &mut boxoffice_tests::Clients,
    event: &str,
) -> Vec<(Vec<(u32, u64, u32)>, u64)> {
    c.events
        .get_event(pb::GetEventRequest {
            event_id: event.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .sections
        .iter()
        .map(|s| {
            let tiers = s
                .price_tiers
                .iter()
                .map(|t| (t.places, t.price_cents, t.remaining))
                .collect();
            (tiers, s.next_price_cents)
        })
        .collect()
}

/// A hold that must succeed.
async fn held(c: &mut boxoffice_tests::Clients, req: pb::HoldRequest) -> pb::Hold {
    c.booking.hold(req).await.unwrap().into_inner()
}

async fn charged(server: &TestServer, payment_id: &str) -> u64 {
    let charges = server.engine().payments().charges().await.unwrap();
    charges
        .iter()
        .find(|c| c.payment_id == payment_id)
        .map(|c| c.amount_cents)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prices_step_up_as_places_sell_and_each_hold_pays_its_own_places_tiers() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    let made = a
        .events
        .create_event(tiered_event("tiers"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(made.sections[0].next_price_cents, 9_000);
    let whole = vec![
        (vec![(3, 9_000, 3), (3, 12_000, 3)], 9_000),
        (vec![(4, 20_000, 4)], 20_000),
        (vec![], 5_000),
    ];
    assert_eq!(tiers_of(&mut c, "tiers").await, whole);

    let ann = admitted(&mut c, &clock, "tiers", "ann").await;
    let bob = admitted(&mut c, &clock, "tiers", "bob").await;
    let cat = admitted(&mut c, &clock, "tiers", "cat").await;
    let hold = |user: &str, token: &str, section: &str, q: u32, key: &str| {
        best("tiers", user, token, section, q, key)
    };
    let a1 = held(&mut c, hold("ann", &ann, "floor", 2, "")).await;
    assert_eq!(
        (a1.place_prices_cents.clone(), a1.amount_cents),
        (vec![9_000, 9_000], 18_000)
    );
    // Across the boundary: one place at 90.00, two at 120.00 (never three at 120.00).
    let b1 = held(&mut c, hold("bob", &bob, "floor", 3, "bob-1")).await;
    assert_eq!(b1.place_prices_cents, [9_000, 12_000, 12_000]);
    assert_eq!(b1.amount_cents, 33_000);
    let now = tiers_of(&mut c, "tiers").await;
    assert_eq!(now[0], (vec![(3, 9_000, 0), (3, 12_000, 1)], 12_000));
    // The seat map shows the same.
    let map = c
        .events
        .get_seat_map(pb::GetSeatMapRequest {
            event_id: "tiers".into(),
            section_id: String::new(),
            first_row: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let floor = map
        .sections
        .iter()
        .find(|s| s.section_id == "floor")
        .unwrap();
    let remaining: Vec<u32> = floor.price_tiers.iter().map(|t| t.remaining).collect();
    assert_eq!((remaining, floor.next_price_cents), (vec![0, 1], 12_000));

    // ann's release gives her two 90.00 places back: the next hold gets them at 90.00.
    c.booking
        .release(pb::ReleaseRequest {
            hold_id: a1.hold_id.clone(),
            user_id: "ann".into(),
        })
        .await
        .unwrap();
    let c1 = held(&mut c, hold("cat", &cat, "floor", 4, "")).await;
    assert_eq!(c1.place_prices_cents, [9_000, 9_000, 12_000, 15_000]);
    // Reserved seats: by quantity too.
    let a2 = held(&mut c, hold("ann", &ann, "orch", 3, "")).await;
    let a3 = held(&mut c, hold("ann", &ann, "orch", 1, "")).await;
    assert_eq!(a2.place_prices_cents, [20_000; 3]);
    assert_eq!(a3.place_prices_cents, [20_000]);
    let d = admitted(&mut c, &clock, "tiers", "dan").await;
    let d1 = held(&mut c, hold("dan", &d, "orch", 2, "")).await;
    assert_eq!(d1.place_prices_cents, [30_000, 30_000]);
    // A section without tiers: every place at its price.
    let p1 = held(&mut c, hold("dan", &d, "plain", 2, "")).await;
    assert_eq!(
        (p1.place_prices_cents.clone(), p1.amount_cents),
        (vec![5_000; 2], 10_000)
    );

    // The confirm charges the hold's fixed price; the tickets keep each place's.
    let order = crate::cancel::pay(&mut c, b1.clone()).await;
    assert_eq!(order.amount_cents, 33_000);
    let prices: Vec<u64> = order.tickets.iter().map(|t| t.price_cents).collect();
    assert_eq!(prices, [9_000, 12_000, 12_000]);
    assert_eq!(charged(&server, &order.payment_id).await, 33_000);
    let plain = crate::cancel::pay(&mut c, p1).await;
    assert_eq!(charged(&server, &plain.payment_id).await, 10_000);
    // Ticket 2 (120.00) given back: refunded what it cost; its place is back in its tier.
    let cancelled = c
        .booking
        .cancel_tickets(pb::CancelTicketsRequest {
            order_id: order.order_id.clone(),
            user_id: "bob".into(),
            ticket_ids: vec![format!("{}.2", order.order_id)],
            idempotency_key: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.refund_cents, 12_000);
    assert_eq!(
        tiers_of(&mut c, "tiers").await[0],
        (vec![(3, 9_000, 0), (3, 12_000, 1)], 12_000)
    );

    // A restart keeps every tier's count and every hold's prices; a keyed hold's replay read
    // back from disk shows its prices too; the books add up.
    let before = tiers_of(&mut c, "tiers").await;
    let engine = server.engine();
    engine
        .settle_and_reconcile(std::time::Duration::ZERO)
        .await
        .unwrap();
    assert!(engine.reconcile().await.unwrap().is_empty());
    drop(engine);
    let home = server.home().clone();
    server.shutdown().await;
    let server = TestServer::builder().home(home).start().await;
    let mut c = server.client();
    assert_eq!(tiers_of(&mut c, "tiers").await, before);
    let again = c
        .booking
        .get_hold(pb::GetHoldRequest {
            hold_id: c1.hold_id.clone(),
            user_id: "cat".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.place_prices_cents, c1.place_prices_cents);
    let bob = admitted(&mut c, server.clock(), "tiers", "bob").await;
    let replayed = held(&mut c, best("tiers", "bob", &bob, "floor", 3, "bob-1")).await;
    assert_eq!(replayed.hold_id, b1.hold_id);
    assert_eq!(replayed.place_prices_cents, [9_000, 12_000, 12_000]);
    let next = held(&mut c, best("tiers", "bob", &bob, "floor", 1, "")).await;
    assert_eq!(
        next.place_prices_cents,
        [12_000],
        "the place given back, at its tier"
    );
    // The change stream, read back from disk, carries the tiers and every price.
    let mut a = server.admin();
    let created = crate::cancel::changes_of_kind(&mut a, "tiers", "event_created").await;
    let event = created[0].event_created.as_ref().unwrap();
    assert_eq!(event.sections[0].price_tiers.len(), 2);
    assert_eq!(event.sections[0].next_price_cents, 9_000);
    let placed = crate::cancel::changes_of_kind(&mut a, "tiers", "hold_placed").await;
    let b = placed
        .iter()
        .filter_map(|c| c.hold.as_ref())
        .find(|h| h.hold_id == b1.hold_id)
        .unwrap();
    assert_eq!(
        (b.place_prices_cents.clone(), b.amount_cents),
        (vec![9_000, 12_000, 12_000], 33_000)
    );
    let orders = crate::cancel::changes_of_kind(&mut a, "tiers", "order_created").await;
    let o = orders
        .iter()
        .filter_map(|c| c.order.as_ref())
        .find(|o| o.order_id == order.order_id)
        .unwrap();
    let prices: Vec<u64> = o.tickets.iter().map(|t| t.price_cents).collect();
    assert_eq!(prices, [9_000, 12_000, 12_000]);
    let engine = server.engine();
    assert!(engine.reconcile().await.unwrap().is_empty());
    assert!(engine.invariant_violations().await.unwrap().is_empty());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tiers_are_refused_naming_the_field_and_create_nothing() {
    let server = TestServer::start().await;
    let mut a = server.admin();
    let bad = [
        (vec![tier(6, 100), tier(5, 200)], "sections[0].price_tiers"),
        (vec![tier(0, 100)], "sections[0].price_tiers[0].places"),
        (
            vec![tier(1, 100_000_001)],
            "sections[0].price_tiers[0].price_cents",
        ),
        (vec![tier(1, 1); 17], "sections[0].price_tiers"),
    ];
    for (tiers, field) in bad {
        let req = event("bad", vec![tiered(ga("floor", 10, 100), tiers)]);
        let status = a.events.create_event(req).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(boxoffice_tests::server::reason(&status), "INVALID_REQUEST");
        assert!(status.message().contains(field), "{field}: {status:?}");
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
    // Over HTTP: the same reason as a problem.
    let http = server.http(Some(ADMIN));
    let r = http
        .post(
            "/v1/events",
            &[],
            &serde_json::json!({"eventId": "bad", "name": "Bad", "sections": [
                {"sectionId": "floor", "name": "Floor", "priceCents": 100, "capacity": 10,
                 "priceTiers": [{"places": 11, "priceCents": 50}]}]}),
        )
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.reason(), "INVALID_REQUEST");
    assert!(
        r.json()["detail"].as_str().unwrap().contains("price_tiers"),
        "{r:?}"
    );
    // A tier's fields default as over gRPC: the engine's check names the field.
    let r = http
        .post(
            "/v1/events",
            &[],
            &serde_json::json!({"eventId": "bad", "name": "Bad", "sections": [
                {"sectionId": "floor", "name": "Floor", "priceCents": 100, "capacity": 10,
                 "priceTiers": [{"priceCents": 50}]}]}),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), r.reason()),
        (400, "INVALID_REQUEST".into()),
        "{r:?}"
    );
    assert_eq!(
        r.json()["field"],
        "sections[0].price_tiers[0].places",
        "{r:?}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_over_http_on_the_event_the_seat_map_the_hold_and_the_order() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let admin = server.http(Some(ADMIN));
    let made = admin
        .post(
            "/v1/events",
            &[],
            &serde_json::json!({"eventId": "th", "name": "Tiers", "sections": [
                {"sectionId": "floor", "name": "Floor", "priceCents": 15000, "capacity": 10,
                 "priceTiers": [{"places": 3, "priceCents": 9000},
                                {"places": 3, "priceCents": 12000}]}]}),
        )
        .await;
    assert_eq!(made.status, 201, "{made:?}");
    let tiers = serde_json::json!([
        {"places": 3, "priceCents": 9000, "remaining": 3},
        {"places": 3, "priceCents": 12000, "remaining": 3}]);
    assert_eq!(made.json()["sections"][0]["priceTiers"], tiers);
    let mut c = server.client();
    let token = admitted(&mut c, &clock, "th", "ann").await;
    let http = server.http(Some(CLIENT));
    let held = http
        .post(
            "/v1/events/th/book",
            &[],
            &serde_json::json!({"userId": "ann", "token": token, "sectionId": "floor",
                "quantity": 4}),
        )
        .await;
    assert_eq!(held.status, 201, "{held:?}");
    let hold = held.json();
    assert_eq!(
        hold["placePricesCents"],
        serde_json::json!([9000, 9000, 9000, 12000])
    );
    assert_eq!(hold["amountCents"], 39000);
    let event = http.get("/v1/events/th", &[]).await.json();
    assert_eq!(event["sections"][0]["priceTiers"][1]["remaining"], 2);
    assert_eq!(event["sections"][0]["nextPriceCents"], 12000);
    let seats = http.get("/v1/events/th/seats", &[]).await.json();
    assert_eq!(seats["sections"][0]["priceTiers"][0]["remaining"], 0);
    assert_eq!(seats["sections"][0]["nextPriceCents"], 12000);
    let hold_id = hold["holdId"].as_str().unwrap();
    let paid = http
        .post(
            &format!("/v1/holds/{hold_id}/confirm"),
            &[],
            &serde_json::json!({"userId": "ann", "paymentToken": "tok_visa"}),
        )
        .await;
    assert_eq!(paid.status, 201, "{paid:?}");
    let order = paid.json();
    assert_eq!(order["amountCents"], 39000);
    assert_eq!(order["tickets"][3]["priceCents"], 12000);
    assert_eq!(
        charged(&server, order["paymentId"].as_str().unwrap()).await,
        39_000
    );
    server.shutdown().await;
}

/// 200 fans race for 100 places of one section, one place each, and pay: the places of each
/// tier are sold exactly once at its price, and the charges add up to the tiers' sum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_buyers_get_each_tier_exactly_and_pay_exactly_its_price() {
    let server = TestServer::start().await;
    let engine = server.engine();
    let mut a = server.admin();
    a.events
        .create_event(event(
            "race",
            vec![tiered(
                ga("floor", 100, 15_000),
                vec![tier(30, 9_000), tier(30, 12_000)],
            )],
        ))
        .await
        .unwrap();
    let started = Arc::new(tokio::sync::Barrier::new(200));
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (engine, started) = (engine.clone(), started.clone());
        tasks.push(tokio::spawn(async move {
            started.wait().await;
            let user = UserId::from(format!("fan-{i}").as_str());
            let hold = engine
                .hold(HoldRequest {
                    event_id: EventId::from("race"),
                    user_id: user.clone(),
                    idempotency_key: String::new(),
                    selection: Selection::BestAvailable {
                        section: Some(SectionId::from("floor")),
                        quantity: 1,
                    },
                    access_code: String::new(),
                })
                .await
                .ok()?;
            let order = engine
                .confirm(ConfirmRequest {
                    hold_id: hold.hold_id.clone(),
                    user_id: user,
                    payment_ref: "tok_visa".into(),
                    idempotency_key: String::new(),
                })
                .await
                .unwrap();
            Some((hold.amount_cents(), order.amount_cents))
        }));
    }
    let mut paid = Vec::new();
    for t in tasks {
        if let Some(p) = t.await.unwrap() {
            paid.push(p);
        }
    }
    assert_eq!(paid.len(), 100);
    assert!(paid.iter().all(|(held, ordered)| held == ordered));
    let mut by_price = std::collections::BTreeMap::new();
    for (price, _) in &paid {
        *by_price.entry(*price).or_insert(0) += 1;
    }
    assert_eq!(
        by_price.into_iter().collect::<Vec<_>>(),
        [(9_000, 30), (12_000, 30), (15_000, 40)]
    );
    let charges = engine.payments().charges().await.unwrap();
    let total: u64 = charges.iter().map(|c| c.amount_cents).sum();
    assert_eq!(total, 30 * 9_000 + 30 * 12_000 + 40 * 15_000);
    assert!(engine.reconcile().await.unwrap().is_empty());
    assert!(engine.invariant_violations().await.unwrap().is_empty());
    server.shutdown().await;
}
