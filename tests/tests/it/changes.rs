//! The change stream (issue 28, point 3) on one node: read from the start, in pages, it
//! reproduces every section's counts, every order and every refund; it goes on across a
//! restart with the same cursors; a cursor older than the retention is expired, with the
//! oldest one served. The API's face is in
//! `changes_api`, the cluster's in the CLI's `cluster_changes`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use boxoffice_engine::changes::{Change, ChangeKind, ChangesError, Position};
use boxoffice_engine::payment::ChargeStatus;
use boxoffice_engine::{
    Engine, EventId, ManualClock, SaleState, SaleUpdate, UserId, WaitlistState,
};
use boxoffice_sweeper::{SweeperConfig, SweeperMsg, start, sync};
use boxoffice_tests::{T0_MS, any_section as best, config, event, ga, pay_with_visa, reserved};

/// Every change from `after` to the end, read `page` at a time; each page's cursors follow.
pub fn read_all(engine: &Engine, after: Option<Position>, page: usize) -> Vec<(Position, Change)> {
    let mut out: Vec<(Position, Change)> = Vec::new();
    let mut at = after;
    loop {
        let p = engine.changes(at, page).unwrap();
        assert!(p.changes.len() <= page);
        for (pos, _) in &p.changes {
            if let Some((last, _)) = out.last() {
                assert!(pos > last, "cursors rise: {last} then {pos}");
            }
        }
        out.extend(p.changes.iter().cloned());
        at = Some(p.next);
        if p.at_end {
            assert!(
                engine.changes(at, page).unwrap().changes.is_empty(),
                "at the end means nothing after"
            );
            return out;
        }
    }
}

/// What a follower of the stream knows of each section: (held, sold) places.
fn counts(changes: &[(Position, Change)]) -> BTreeMap<(String, String), (i64, i64)> {
    let mut held: BTreeMap<String, (String, u32)> = BTreeMap::new();
    let mut by: BTreeMap<(String, String), (i64, i64)> = BTreeMap::new();
    for (_, c) in changes {
        let e = c.event_id.to_string();
        match &c.kind {
            ChangeKind::EventCreated { spec, .. } => {
                for s in &spec.sections {
                    by.insert((e.clone(), s.section_id.to_string()), (0, 0));
                }
            }
            ChangeKind::HoldPlaced(h) => {
                held.insert(
                    h.hold_id.to_string(),
                    (h.section_id.to_string(), h.quantity),
                );
                by.get_mut(&(e.clone(), h.section_id.to_string()))
                    .unwrap()
                    .0 += i64::from(h.quantity);
            }
            ChangeKind::HoldReleased(h) | ChangeKind::HoldExpired(h) => {
                by.get_mut(&(e.clone(), h.section_id.to_string()))
                    .unwrap()
                    .0 -= i64::from(h.quantity);
            }
            ChangeKind::OrderCreated(o) => {
                let (s, q) = held[&o.hold_id.to_string()].clone();
                assert_eq!(o.tickets.len() as u32, q, "one ticket a place");
                let c = by.get_mut(&(e.clone(), s)).unwrap();
                c.0 -= i64::from(q);
                c.1 += i64::from(q);
            }
            _ => {}
        }
    }
    by
}

fn engine_counts(engine: &Engine) -> BTreeMap<(String, String), (i64, i64)> {
    let mut by = BTreeMap::new();
    for e in engine.events().unwrap() {
        for s in e.sections {
            by.insert(
                (e.event_id.to_string(), s.spec.section_id.to_string()),
                (i64::from(s.held), i64::from(s.sold)),
            );
        }
    }
    by
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_the_stream_from_the_start_gives_the_counts_orders_and_offers() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = Engine::open(config(dir.path(), &clock)).await.unwrap();
    engine
        .create_event(event(
            "c",
            vec![ga("ga", 30, 2_500), reserved("r", 2, 5, 9_000)],
            60_000,
            4,
        ))
        .await
        .unwrap();
    let e = EventId::from("c");
    let sweeper = start(engine.clone(), SweeperConfig::default())
        .await
        .unwrap()
        .0;
    // Holds (unary and a batch), orders, releases, and holds that will expire.
    let mut holds = Vec::new();
    for u in 0..12 {
        holds.push(engine.hold(best("c", &format!("u{u}"), 3)).await.unwrap());
    }
    let batch = engine
        .hold_batch((0..4).map(|u| best("c", &format!("b{u}"), 1)).collect())
        .await;
    assert!(batch.iter().all(Result::is_ok));
    // Sold out now (40 places): a fan waits on the waitlist, and is offered released places.
    let waiting = engine
        .join_waitlist(&e, &UserId::from("w"), None, 2)
        .await
        .unwrap();
    for h in &holds[..5] {
        engine.confirm(pay_with_visa(h, "")).await.unwrap();
    }
    for h in &holds[5..8] {
        engine.release(&h.hold_id, &h.user_id).await.unwrap();
    }
    // A payment whose answer was lost, then the hold given back: the settlement refunds it.
    let lost = &holds[8];
    let mut pay = pay_with_visa(lost, "");
    pay.payment_ref = "tok_timeout".into();
    assert!(engine.confirm(pay).await.is_err());
    engine.release(&lost.hold_id, &lost.user_id).await.unwrap();
    let mut refunded = Vec::new();
    for _ in 0..2 {
        refunded.extend(
            engine
                .settle_and_reconcile(Duration::ZERO)
                .await
                .unwrap()
                .1
                .refunded,
        );
    }
    assert_eq!(refunded.len(), 1, "{refunded:?}");
    engine
        .update_sale(
            &e,
            SaleUpdate {
                admit_rate_per_second: Some(9),
                ..SaleUpdate::default()
            },
            "",
        )
        .await
        .unwrap();
    clock.advance_ms(61_000);
    sweeper.cast(SweeperMsg::Sweep).unwrap();
    let expired = sync(&sweeper).await.unwrap().expired;
    assert!(expired >= 4, "{expired}");
    let offered = engine.waitlist_entry(&waiting.entry_id).await.unwrap();
    // Offered the released places (and, unpaid past the TTL, lapsed).
    assert_ne!(offered.state, WaitlistState::Waiting);
    engine
        .update_sale(
            &e,
            SaleUpdate {
                state: Some(SaleState::Paused),
                ..SaleUpdate::default()
            },
            "",
        )
        .await
        .unwrap();

    let all = read_all(&engine, None, 5);
    assert_eq!(all, read_all(&engine, Some(Position::START), 1_000));
    assert_eq!(counts(&all), engine_counts(&engine));
    let kinds = |k: &str| all.iter().filter(|(_, c)| c.kind.name() == k).count();
    assert_eq!(kinds("event_created"), 1);
    assert_eq!(kinds("hold_placed"), 12 + 4 + 1, "the offer's hold too");
    assert_eq!(kinds("order_created"), 5);
    assert_eq!(kinds("hold_released"), 4);
    assert_eq!(kinds("refunded"), 1);
    assert_eq!(kinds("hold_expired"), expired as usize);
    assert_eq!(kinds("waitlist_offered"), 1);
    assert_eq!(kinds("sale_updated"), 2);
    // The orders, as `GetOrder` has them, their amounts adding up to what was charged.
    let mut orders: Vec<_> = all
        .iter()
        .filter_map(|(_, c)| match &c.kind {
            ChangeKind::OrderCreated(o) => Some(o.clone()),
            _ => None,
        })
        .collect();
    let mut known = engine.orders().await.unwrap();
    orders.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    known.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    assert_eq!(orders, known);
    let charges = engine.payments().charges().await.unwrap();
    let kept: u64 = charges
        .iter()
        .filter(|c| c.status == ChargeStatus::Captured)
        .map(|c| c.amount_cents)
        .sum();
    assert_eq!(orders.iter().map(|o| o.amount_cents).sum::<u64>(), kept);
    // The refund, as the provider has it.
    let refunds: Vec<_> = all
        .iter()
        .filter_map(|(_, c)| match &c.kind {
            ChangeKind::Refunded {
                payment_id,
                amount_cents,
                hold_id,
                user_id,
            } => Some((
                payment_id.clone(),
                *amount_cents,
                hold_id.clone(),
                user_id.clone(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        refunds,
        [(
            refunded[0].0.clone(),
            refunded[0].1,
            Some(lost.hold_id.clone()),
            Some(lost.user_id.clone())
        )]
    );
    assert!(
        charges
            .iter()
            .any(|c| c.payment_id == refunded[0].0 && c.status == ChargeStatus::Refunded)
    );
    assert!(engine.reconcile().await.unwrap().is_empty());

    // A restart: the same cursors, and the stream goes on after them.
    let last = all.last().unwrap().0;
    sweeper.stop(None);
    engine.shutdown().await;
    drop(engine);
    let engine = Engine::open(config(dir.path(), &clock)).await.unwrap();
    assert_eq!(read_all(&engine, None, 7), all);
    assert!(read_all(&engine, Some(last), 7).is_empty());
    engine
        .hold(best("c", "after-restart", 1))
        .await
        .unwrap_err(); // paused
    engine
        .update_sale(
            &e,
            SaleUpdate {
                state: Some(SaleState::Open),
                ..SaleUpdate::default()
            },
            "",
        )
        .await
        .unwrap();
    let h = engine.hold(best("c", "after-restart", 1)).await;
    let after = read_all(&engine, Some(last), 7);
    let names: Vec<_> = after.iter().map(|(_, c)| c.kind.name()).collect();
    let expect: &[&str] = if h.is_ok() {
        &["sale_updated", "hold_placed"]
    } else {
        &["sale_updated"]
    };
    assert_eq!(names, expect);
    assert!(after[0].0.seq > last.seq);
    assert_eq!(
        counts(&read_all(&engine, None, 100)),
        engine_counts(&engine)
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_older_than_the_retention_is_expired_with_the_oldest_kept() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let mut c = config(dir.path(), &clock);
    c.change_retention = Duration::from_secs(10);
    let engine = Engine::open(c.clone()).await.unwrap();
    engine
        .create_event(event("r", vec![ga("g", 100, 1)], 600_000, 100))
        .await
        .unwrap();
    let early = engine.hold(best("r", "early", 1)).await.unwrap();
    let first = read_all(&engine, None, 100);
    assert_eq!(first.len(), 2);
    // Past the retention (by the records' own times), and past the trim's once-a-second look.
    clock.advance_ms(30_000);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    engine.hold(best("r", "late", 1)).await.unwrap();
    let oldest = match engine.changes(Some(Position::START), 10) {
        Err(ChangesError::Expired { oldest }) => oldest,
        other => panic!("expected an expired cursor, got {other:?}"),
    };
    assert!(
        oldest.seq >= first[1].0.seq,
        "{oldest} after the early records"
    );
    assert!(matches!(
        engine.changes(Some(first[0].0), 10),
        Err(ChangesError::Expired { .. })
    ));
    let kept = read_all(&engine, Some(oldest), 10);
    assert_eq!(
        kept.iter().map(|(_, c)| c.kind.name()).collect::<Vec<_>>(),
        ["hold_placed"]
    );
    assert_eq!(
        read_all(&engine, None, 10),
        kept,
        "no cursor: the oldest kept"
    );
    // A cursor past the end was never handed out.
    assert!(matches!(
        engine.changes(Some(Position::after_record(oldest.seq + 1_000)), 10),
        Err(ChangesError::Unknown(_))
    ));
    // The trim survives a restart, and the early hold is still there (only its change went).
    engine.shutdown().await;
    drop(engine);
    let engine = Engine::open(c).await.unwrap();
    assert!(matches!(
        engine.changes(Some(Position::START), 10),
        Err(ChangesError::Expired { .. })
    ));
    assert_eq!(read_all(&engine, None, 10), kept);
    engine.get_hold(&early.hold_id).await.unwrap();
    engine.shutdown().await;
}
