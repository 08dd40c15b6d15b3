//! Checkout: payment, orders, e-tickets, reconciliation. Nothing is charged twice, nothing is
//! sold twice, and a charge always ends as a ticket or a refund.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::ffi::OsStr;
use std::sync::Arc;

use boxoffice_engine::{
    Charge, ChargeStatus, ConfirmRequest, Engine, EngineConfig, EngineError, EventId, Finding,
    HoldId, HoldRequest, HoldStatus, HoldView, ManualClock, Rejection, SeatId, Selection, UserId,
};
use boxoffice_tests::child::ChildTest;
use boxoffice_tests::children::CHECKOUT_DIR_VAR;
use boxoffice_tests::payments::Gated;
use boxoffice_tests::{T0_MS, any_section as best, child_bin, config, event, ga, open, reserved};

fn pay(hold: &HoldView, token: &str, key: &str) -> ConfirmRequest {
    ConfirmRequest {
        hold_id: hold.hold_id.clone(),
        user_id: hold.user_id.clone(),
        payment_ref: token.into(),
        idempotency_key: key.into(),
    }
}

async fn charges(engine: &Engine) -> Vec<Charge> {
    engine.payments().charges().await.unwrap()
}

fn captured(cs: &[Charge]) -> usize {
    cs.iter()
        .filter(|c| c.status == ChargeStatus::Captured)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_replayed_100_times_charges_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("c", vec![ga("g", 10, 2_500)], 60_000, 4))
        .await
        .unwrap();
    let hold = engine.hold(best("c", "ann", 2)).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (engine, req) = (engine.clone(), pay(&hold, "tok_visa", "tap"));
        tasks.push(tokio::spawn(async move { engine.confirm(req).await }));
    }
    let mut orders = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(o) => orders.push(o),
            Err(EngineError::Rejected(Rejection::IdempotencyKeyInFlight)) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert!(!orders.is_empty());
    assert!(orders.iter().all(|o| o == &orders[0]), "identical replies");
    assert_eq!(
        engine.confirm(pay(&hold, "tok_visa", "tap")).await.unwrap(),
        orders[0]
    );
    assert_eq!(orders[0].amount_cents, 5_000);
    assert!(orders[0].payment_ref.starts_with("pay_"));
    assert_eq!(captured(&charges(&engine).await), 1, "one charge");
    assert_eq!(engine.orders().await.unwrap().len(), 1, "one order");
    // The same key with another request is refused, and charges nothing.
    assert_eq!(
        engine.confirm(pay(&hold, "tok_other", "tap")).await,
        Err(Rejection::IdempotencyKeyReused.into())
    );
    assert_eq!(charges(&engine).await.len(), 1);
    assert!(engine.reconcile().await.unwrap().is_empty());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declined_then_another_card_timeout_then_retry_error_charges_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event("p", vec![ga("g", 10, 1_000)], 60_000, 4))
        .await
        .unwrap();
    // Declined: the hold stays; another card works.
    let h = engine.hold(best("p", "ann", 1)).await.unwrap();
    assert_eq!(
        engine.confirm(pay(&h, "tok_decline", "k1")).await,
        Err(Rejection::PaymentDeclined.into())
    );
    assert_eq!(
        engine.confirm(pay(&h, "tok_decline", "k1")).await,
        Err(Rejection::PaymentDeclined.into()),
        "a replay answers the first answer"
    );
    assert_eq!(
        engine.get_hold(&h.hold_id).await.unwrap().status,
        HoldStatus::Held
    );
    engine.confirm(pay(&h, "tok_visa", "k2")).await.unwrap();
    // Timeout: no order, a retryable answer; the retry finds the charge, never a second one.
    let h = engine.hold(best("p", "bob", 1)).await.unwrap();
    assert!(matches!(
        engine.confirm(pay(&h, "tok_timeout", "t1")).await,
        Err(EngineError::PaymentUnavailable { timeout: true, .. })
    ));
    assert_eq!(
        engine.get_hold(&h.hold_id).await.unwrap().status,
        HoldStatus::Held
    );
    let order = engine.confirm(pay(&h, "tok_timeout", "t1")).await.unwrap();
    let key_charges: Vec<Charge> = charges(&engine)
        .await
        .into_iter()
        .filter(|c| c.key.starts_with(h.hold_id.as_str()))
        .collect();
    assert_eq!(key_charges.len(), 1, "exactly one charge");
    assert_eq!(key_charges[0].payment_id, order.payment_ref);
    // The provider fails: nothing is charged, nothing changes.
    let h = engine.hold(best("p", "cat", 1)).await.unwrap();
    assert!(matches!(
        engine.confirm(pay(&h, "tok_error", "e1")).await,
        Err(EngineError::PaymentUnavailable { timeout: false, .. })
    ));
    assert_eq!(
        engine.get_hold(&h.hold_id).await.unwrap().status,
        HoldStatus::Held
    );
    assert!(
        charges(&engine)
            .await
            .iter()
            .all(|c| !c.key.starts_with(h.hold_id.as_str()))
    );
    // Not a token: invalid, nothing charged.
    let r = engine.confirm(pay(&h, "visa", "")).await;
    assert_eq!(
        r.unwrap_err().rejection().and_then(|r| r.field()),
        Some("payment_token")
    );
    assert!(engine.reconcile().await.unwrap().is_empty());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paid_after_expiry_is_rescued_or_refunded_never_lost() {
    let dir = tempfile::tempdir().unwrap();
    let payments_dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let provider = Gated::open(payments_dir.path());
    let (gate, arrived) = (provider.gate.clone(), provider.arrived.clone());
    let mut cfg = config(dir.path(), &clock);
    cfg.payments = Some(provider);
    let engine = Engine::open(cfg).await.unwrap();
    engine
        .create_event(event("x", vec![reserved("orch", 1, 4, 3_000)], 10_000, 4))
        .await
        .unwrap();
    let seats = |ids: &[&str], user: &str| HoldRequest {
        event_id: EventId::from("x"),
        user_id: UserId::from(user),
        idempotency_key: String::new(),
        selection: Selection::Seats(ids.iter().map(|s| SeatId::from(*s)).collect()),
        access_code: String::new(),
    };
    // 1. The hold expires while the charge is in flight; the seats are still free: rescued.
    let h = engine
        .hold(seats(&["orch:A:1", "orch:A:2"], "ann"))
        .await
        .unwrap();
    let pending = {
        let (engine, req) = (engine.clone(), pay(&h, "tok_visa", ""));
        tokio::spawn(async move { engine.confirm(req).await })
    };
    arrived.acquire().await.unwrap().forget(); // the charge is in flight
    clock.advance_ms(10_000);
    assert_eq!(
        engine.expire_due(100).await.unwrap().len(),
        1,
        "the hold lapsed"
    );
    gate.add_permits(1);
    let order = pending.await.unwrap().unwrap();
    let tickets: Vec<_> = order
        .tickets
        .iter()
        .map(|t| t.seat_id.clone().unwrap())
        .collect();
    assert_eq!(
        tickets,
        [SeatId::from("orch:A:1"), SeatId::from("orch:A:2")]
    );
    assert_ne!(order.hold_id, h.hold_id, "a new hold of the same seats");
    // 2. Expired and someone else took the seats: refunded, HOLD_EXPIRED.
    let h = engine.hold(seats(&["orch:A:3"], "bob")).await.unwrap();
    let pending = {
        let (engine, req) = (engine.clone(), pay(&h, "tok_visa", ""));
        tokio::spawn(async move { engine.confirm(req).await })
    };
    arrived.acquire().await.unwrap().forget(); // the charge is in flight
    clock.advance_ms(10_000);
    engine.expire_due(100).await.unwrap();
    engine.hold(seats(&["orch:A:3"], "cat")).await.unwrap();
    gate.add_permits(1);
    assert_eq!(pending.await.unwrap(), Err(Rejection::HoldExpired.into()));
    let all = charges(&engine).await;
    let bobs: Vec<&Charge> = all
        .iter()
        .filter(|c| c.key.starts_with(h.hold_id.as_str()))
        .collect();
    assert_eq!(bobs.len(), 1);
    assert_eq!(
        bobs[0].status,
        ChargeStatus::Refunded,
        "never a charge without a ticket or a refund"
    );
    assert!(engine.reconcile().await.unwrap().is_empty());
    engine.shutdown().await;
}

/// Paid, the hold expired meanwhile, and its cheaper place was taken by another fan: the
/// places free now cost more than was charged, so they are not taken (the fan was charged the
/// first hold's price): refunded, `HOLD_EXPIRED`. With the cheaper place free again, the same
/// situation is rescued at the price charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescue_only_takes_places_at_the_price_charged() {
    let dir = tempfile::tempdir().unwrap();
    let payments_dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let provider = Gated::open(payments_dir.path());
    let (gate, arrived) = (provider.gate.clone(), provider.arrived.clone());
    let mut cfg = config(dir.path(), &clock);
    cfg.payments = Some(provider);
    let engine = Engine::open(cfg).await.unwrap();
    let mut floor = ga("floor", 10, 15_000);
    floor.price_tiers = vec![boxoffice_engine::prices::PriceTier {
        places: 1,
        price_cents: 9_000,
    }];
    engine
        .create_event(event("t", vec![floor], 10_000, 4))
        .await
        .unwrap();
    let one = |user: &str| best("t", user, 1);
    // Expired while paying; bob takes the 90.00 place: the rescue would cost 150.00.
    let h = engine.hold(one("ann")).await.unwrap();
    assert_eq!(h.place_prices_cents, [9_000]);
    let pending = {
        let (engine, req) = (engine.clone(), pay(&h, "tok_visa", ""));
        tokio::spawn(async move { engine.confirm(req).await })
    };
    arrived.acquire().await.unwrap().forget();
    clock.advance_ms(10_000);
    engine.expire_due(100).await.unwrap();
    let bobs = engine.hold(one("bob")).await.unwrap();
    assert_eq!(bobs.place_prices_cents, [9_000]);
    gate.add_permits(1);
    assert_eq!(pending.await.unwrap(), Err(Rejection::HoldExpired.into()));
    let all = charges(&engine).await;
    let anns: Vec<&Charge> = all
        .iter()
        .filter(|c| c.key.starts_with(h.hold_id.as_str()))
        .collect();
    assert_eq!((anns.len(), anns[0].status), (1, ChargeStatus::Refunded));
    let section = &engine.event(&EventId::from("t")).unwrap().sections[0];
    assert_eq!(
        (section.held, section.sold),
        (1, 0),
        "only bob's hold: the dearer rescue hold was given back"
    );
    // bob lets go; cat's hold expires while paying with the 90.00 place free: rescued at 90.00.
    engine.release(&bobs.hold_id, &bobs.user_id).await.unwrap();
    let h = engine.hold(one("cat")).await.unwrap();
    let pending = {
        let (engine, req) = (engine.clone(), pay(&h, "tok_visa", ""));
        tokio::spawn(async move { engine.confirm(req).await })
    };
    arrived.acquire().await.unwrap().forget();
    clock.advance_ms(10_000);
    engine.expire_due(100).await.unwrap();
    gate.add_permits(1);
    let order = pending.await.unwrap().unwrap();
    assert_ne!(order.hold_id, h.hold_id, "a new hold");
    assert_eq!(order.amount_cents, 9_000);
    assert!(engine.reconcile().await.unwrap().is_empty());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_between_charge_and_order_then_retry_charges_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = ChildTest::spawn(
        child_bin!(),
        "crash-after-charge",
        &[
            (CHECKOUT_DIR_VAR, dir.path().as_os_str()),
            ("BOXOFFICE_FAILPOINT", OsStr::new("after_charge")),
        ],
    );
    let out = child.rest();
    let status = child.wait();
    assert!(!status.success(), "the child died at the failpoint");
    assert!(!out.iter().any(|l| l.contains("SURVIVED")), "{out:?}");
    let hold_id = out
        .iter()
        .find_map(|l| l.split("HOLD ").nth(1))
        .map(HoldId::from)
        .unwrap();
    // Restart: the charge is there, the order is not.
    let engine = Engine::open(EngineConfig::new(dir.path())).await.unwrap();
    let before = charges(&engine).await;
    assert_eq!(captured(&before), 1);
    assert!(engine.orders().await.unwrap().is_empty());
    let findings = engine.reconcile().await.unwrap();
    assert!(
        matches!(findings.as_slice(), [Finding::CapturedWithoutOrder { .. }]),
        "{findings:?}"
    );
    // The fan retries the confirm: the same charge is found, one order is made.
    let hold = engine.get_hold(&hold_id).await.unwrap();
    let order = engine.confirm(pay(&hold, "tok_visa", "pay")).await.unwrap();
    let after = charges(&engine).await;
    assert_eq!(after.len(), 1, "one charge");
    assert_eq!(order.payment_ref, before[0].payment_id);
    assert_eq!(engine.orders().await.unwrap().len(), 1, "one order");
    assert!(engine.reconcile().await.unwrap().is_empty());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_finds_exactly_what_was_planted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event(
            "r",
            vec![reserved("orch", 2, 5, 100), ga("g", 5, 50)],
            60_000,
            4,
        ))
        .await
        .unwrap();
    for (u, q) in [("a", 2), ("b", 3), ("c", 1)] {
        let h = engine.hold(best("r", u, q)).await.unwrap();
        engine.confirm(pay(&h, "tok_visa", "")).await.unwrap();
    }
    engine.hold(best("r", "d", 2)).await.unwrap();
    assert_eq!(
        engine.reconcile().await.unwrap(),
        vec![],
        "clean after a sale"
    );
    // Plant: a captured charge nobody ordered, and a sold-seat claim without a sale.
    let stray = engine
        .payments()
        .charge("stray", 999, "tok_visa")
        .await
        .unwrap();
    engine
        .raw_db()
        .open_tree("sold")
        .unwrap()
        .insert("r/orch/orch:B:5", "r.orch.hNOBODY")
        .unwrap();
    let mut found = engine.reconcile().await.unwrap();
    found.sort_by_key(|f| f.kind());
    assert_eq!(
        found,
        vec![
            Finding::CapturedWithoutOrder {
                payment_id: stray.payment_id,
                amount_cents: 999
            },
            Finding::ClaimWithoutSale {
                key: "r/orch/orch:B:5".into()
            },
        ]
    );
    engine.shutdown().await;
}
