//! No money kept without a sale (issue 12, point 5): a captured charge whose hold ended without
//! an order is refunded by the server's reconciliation pass once its grace has passed, and the
//! reconciliation is clean afterwards. Driven over gRPC as a fan meets it: `Confirm` with a
//! payment whose answer is lost (`tok_timeout`), then the fan releases, lets the hold expire,
//! retries, or pays with another card.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::Duration;

use boxoffice_engine::payment::{Charge, ChargeStatus};
use boxoffice_engine::{Engine, Finding};
use boxoffice_proto::v1 as pb;
use boxoffice_tests::server::{TestServer, reason};
use boxoffice_tests::wait::{PATIENCE, periodic_check};
use tonic::Code;

use crate::grpc::{admitted, best, event, ga};

const GRACE: Duration = Duration::from_secs(60);

async fn charges_of(engine: &Engine, hold_id: &str) -> Vec<Charge> {
    engine
        .payments()
        .charges()
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.key.starts_with(&format!("{hold_id}:")))
        .collect()
}

fn confirm(hold: &pb::Hold, token: &str, key: &str) -> pb::ConfirmRequest {
    pb::ConfirmRequest {
        hold_id: hold.hold_id.clone(),
        user_id: hold.user_id.clone(),
        payment_token: token.into(),
        idempotency_key: key.into(),
    }
}

/// A `Confirm` whose charge is captured but whose answer is lost.
async fn lost_answer(c: &mut boxoffice_tests::Clients, hold: &pb::Hold, key: &str) {
    let lost = c
        .booking
        .confirm(confirm(hold, "tok_timeout", key))
        .await
        .unwrap_err();
    assert_eq!(lost.code(), Code::DeadlineExceeded);
    assert_eq!(reason(&lost), "PAYMENT_TIMEOUT");
}

/// Creates event `ev` (10 places at 15.00) and holds `places` of them for `user`, admitted.
async fn event_with_a_hold(server: &TestServer, ev: &str, user: &str, places: u32) -> pb::Hold {
    let clock = server.clock().clone();
    let mut c = server.client();
    server
        .admin()
        .events
        .create_event(event(ev, vec![ga("floor", 10, 1_500)]))
        .await
        .unwrap();
    let tok = admitted(&mut c, &clock, ev, user).await;
    c.booking
        .hold(best(ev, user, &tok, "floor", places, ""))
        .await
        .unwrap()
        .into_inner()
}

fn status_of(charges: &[Charge]) -> Vec<ChargeStatus> {
    charges.iter().map(|c| c.status).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_charge_left_without_a_sale_is_refunded_after_its_grace() {
    // The test runs the passes itself (the server's timer is off), on the manual clock.
    let server = TestServer::builder().settlement(None, GRACE).start().await;
    let engine = server.engine();
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    let mut ev = event("rf", vec![ga("floor", 100, 4_000)]);
    ev.hold_ttl_seconds = 600; // the holds outlive the grace
    a.events.create_event(ev).await.unwrap();
    let hold = |user: &'static str| {
        let clock = clock.clone();
        let mut c = server.client();
        async move {
            let tok = admitted(&mut c, &clock, "rf", user).await;
            c.booking
                .hold(best("rf", user, &tok, "floor", 2, ""))
                .await
                .unwrap()
                .into_inner()
        }
    };

    // 1. Charged, answer lost, then released: the money has no sale.
    let released = hold("ann").await;
    lost_answer(&mut c, &released, "k1").await;
    c.booking
        .release(pb::ReleaseRequest {
            hold_id: released.hold_id.clone(),
            user_id: "ann".into(),
        })
        .await
        .unwrap();
    // 2. Charged, answer lost, then the fan paid with another card: the first charge has no sale.
    let repaid = hold("bob").await;
    lost_answer(&mut c, &repaid, "k2").await;
    let order = c
        .booking
        .confirm(confirm(&repaid, "tok_visa", "k3"))
        .await
        .unwrap()
        .into_inner();
    // 3. Charged, answer lost, and the retry found the charge: a sale, nothing to refund.
    let retried = hold("cat").await;
    lost_answer(&mut c, &retried, "k4").await;
    let kept = c
        .booking
        .confirm(confirm(&retried, "tok_timeout", "k4-retry"))
        .await
        .unwrap()
        .into_inner();
    // 4. Charged, answer lost, and the hold is still held: a retry may still make the sale.
    let still_held = hold("dan").await;
    lost_answer(&mut c, &still_held, "k5").await;

    // The plain reconciliation reports both orphans, and nothing else.
    let orphans = |findings: &[Finding]| {
        let mut ids: Vec<String> = findings
            .iter()
            .map(|f| match f {
                Finding::CapturedWithoutOrder { payment_id, .. } => payment_id.clone(),
                other => panic!("unexpected finding {other:?}"),
            })
            .collect();
        ids.sort();
        ids
    };
    let released_charge = charges_of(&engine, &released.hold_id).await;
    let repaid_charges = charges_of(&engine, &repaid.hold_id).await;
    assert_eq!(released_charge.len(), 1);
    assert_eq!(repaid_charges.len(), 2, "the lost one and the paid one");
    let lost_repaid = repaid_charges
        .iter()
        .find(|c| c.payment_id != order.payment_id)
        .unwrap()
        .clone();
    let mut expected = vec![
        released_charge[0].payment_id.clone(),
        lost_repaid.payment_id.clone(),
        charges_of(&engine, &still_held.hold_id).await[0]
            .payment_id
            .clone(),
    ];
    expected.sort();
    assert_eq!(orphans(&engine.reconcile().await.unwrap()), expected);

    // First pass: found, within its grace: pending, not a finding, nothing refunded.
    let (findings, settled) = engine.settle_and_reconcile(GRACE).await.unwrap();
    assert!(findings.is_empty(), "{findings:?}");
    assert!(settled.refunded.is_empty());
    let mut pending = settled.pending.clone();
    pending.sort();
    let mut ended = vec![
        released_charge[0].payment_id.clone(),
        lost_repaid.payment_id.clone(),
    ];
    ended.sort();
    assert_eq!(pending, ended, "a held hold's charge is not pending");
    clock.advance_ms(GRACE.as_millis() as u64 - 1);
    let (_, settled) = engine.settle_and_reconcile(GRACE).await.unwrap();
    assert!(settled.refunded.is_empty(), "not before the grace");

    // The grace has passed: both refunded, in full, and nothing else touched.
    clock.advance_ms(1);
    let (findings, settled) = engine.settle_and_reconcile(GRACE).await.unwrap();
    assert!(findings.is_empty(), "{findings:?}");
    let mut refunded = settled.refunded.clone();
    refunded.sort();
    let mut want = vec![
        (released_charge[0].payment_id.clone(), 8_000),
        (lost_repaid.payment_id.clone(), 8_000),
    ];
    want.sort();
    assert_eq!(refunded, want);
    assert_eq!(
        status_of(&charges_of(&engine, &released.hold_id).await),
        [ChargeStatus::Refunded]
    );
    for ch in charges_of(&engine, &repaid.hold_id).await {
        let want = if ch.payment_id == order.payment_id {
            ChargeStatus::Captured
        } else {
            ChargeStatus::Refunded
        };
        assert_eq!(ch.status, want, "{ch:?}");
    }
    let kept_charges = charges_of(&engine, &retried.hold_id).await;
    assert_eq!(status_of(&kept_charges), [ChargeStatus::Captured]);
    assert_eq!(kept_charges[0].payment_id, kept.payment_id);
    assert_eq!(
        status_of(&charges_of(&engine, &still_held.hold_id).await),
        [ChargeStatus::Captured]
    );
    // The orders stand.
    for o in [&order, &kept] {
        let got = c
            .booking
            .get_order(pb::GetOrderRequest {
                order_id: o.order_id.clone(),
                user_id: o.user_id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.status, o.status, "{o:?}");
        assert_eq!(got.payment_id, o.payment_id);
    }

    // 5. The held hold expires without a sale: its charge is refunded after its grace too.
    clock.advance_ms(600_000);
    periodic_check("the hold expires", PATIENCE, async || {
        let (_, s) = engine.settle_and_reconcile(GRACE).await.unwrap();
        if s.pending.is_empty() {
            Err("not pending yet")
        } else {
            Ok(())
        }
    })
    .await;
    clock.advance_ms(GRACE.as_millis() as u64);
    let (findings, settled) = engine.settle_and_reconcile(GRACE).await.unwrap();
    assert!(findings.is_empty(), "{findings:?}");
    assert_eq!(settled.refunded.len(), 1);
    assert_eq!(
        status_of(&charges_of(&engine, &still_held.hold_id).await),
        [ChargeStatus::Refunded]
    );
    // Clean, and a pass again refunds nothing twice.
    assert!(engine.reconcile().await.unwrap().is_empty());
    let (findings, settled) = engine.settle_and_reconcile(GRACE).await.unwrap();
    assert!(findings.is_empty() && settled.refunded.is_empty() && settled.pending.is_empty());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_server_refunds_on_its_own_and_its_reconciliation_is_clean_afterwards() {
    let server = TestServer::builder()
        .settlement(Some(Duration::from_millis(50)), Duration::ZERO)
        .start()
        .await;
    let engine = server.engine();
    let mut c = server.client();
    let hold = event_with_a_hold(&server, "rs", "eve", 1).await;
    lost_answer(&mut c, &hold, "k").await;
    c.booking
        .release(pb::ReleaseRequest {
            hold_id: hold.hold_id.clone(),
            user_id: "eve".into(),
        })
        .await
        .unwrap();
    periodic_check("the server refunds the charge", PATIENCE, async || {
        let statuses = status_of(&charges_of(&engine, &hold.hold_id).await);
        if statuses == [ChargeStatus::Refunded] {
            Ok(())
        } else {
            Err(format!("{statuses:?}"))
        }
    })
    .await;
    assert!(engine.reconcile().await.unwrap().is_empty());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_about_to_become_an_order_is_never_refunded() {
    // The provider captures the money, then holds its answer: the window between the money
    // taken and the order made, held open while the hold expires and a pass runs.
    let payments = tempfile::tempdir().unwrap();
    let provider = boxoffice_tests::payments::Gated::open(payments.path());
    provider.hold_after_capture();
    provider.gate.add_permits(1);
    let server = TestServer::builder()
        .payments(provider.clone())
        .settlement(None, Duration::ZERO)
        .start()
        .await;
    let engine = server.engine();
    let clock = server.clock().clone();
    let hold = event_with_a_hold(&server, "win", "ann", 2).await;
    let confirm = {
        let mut c = server.client();
        let req = confirm(&hold, "tok_visa", "k");
        tokio::spawn(async move { c.booking.confirm(req).await })
    };
    provider.captured.acquire().await.unwrap().forget();
    // Captured, no order yet; the hold expires meanwhile.
    clock.advance_ms(61_000);
    let hold_id = boxoffice_engine::HoldId(hold.hold_id.clone());
    periodic_check("the hold expires", PATIENCE, async || {
        match engine.get_hold(&hold_id).await.unwrap().status {
            boxoffice_engine::HoldStatus::Expired => Ok(()),
            s => Err(format!("{s:?}")),
        }
    })
    .await;
    // A pass with no grace at all: the checkout is still running, so its charge is left alone.
    let (_, settled) = engine.settle_and_reconcile(Duration::ZERO).await.unwrap();
    assert!(
        settled.refunded.is_empty() && settled.pending.is_empty(),
        "{settled:?}"
    );
    assert_eq!(
        status_of(&charges_of(&engine, &hold.hold_id).await),
        [ChargeStatus::Captured]
    );
    // The answer comes back: the places are taken again and the order is paid by that charge.
    provider.after.add_permits(1);
    let order = confirm.await.unwrap().unwrap().into_inner();
    let charges = charges_of(&engine, &hold.hold_id).await;
    assert_eq!(status_of(&charges), [ChargeStatus::Captured]);
    assert_eq!(order.payment_id, charges[0].payment_id);
    assert_eq!(order.tickets.len(), 2);
    // Clean, and a pass now refunds nothing either.
    let (findings, settled) = engine.settle_and_reconcile(Duration::ZERO).await.unwrap();
    assert!(findings.is_empty(), "{findings:?}");
    assert!(settled.refunded.is_empty(), "{settled:?}");
    assert!(engine.reconcile().await.unwrap().is_empty());
    server.shutdown().await;
}
