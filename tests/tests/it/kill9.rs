//! Invariant 4: every acknowledged hold and confirm survives `kill -9`.
//!
//! The test re-runs its own binary as a child process (the `crash_child` test, which does
//! nothing unless `BOXOFFICE_CRASH_DIR` is set). The child books places as fast as it can and
//! prints each acknowledged hold or confirm on stdout. The parent reads until it has seen enough,
//! sends SIGKILL mid-flight, reopens the data dir and checks that everything acknowledged is
//! there, and that the invariants hold.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::Arc;

use boxoffice_engine::{
    ConfirmRequest, Engine, EngineConfig, EventId, HoldId, HoldRequest, HoldStatus, OrderId,
    Selection, SystemClock, UserId,
};
use boxoffice_tests::child::{self, ChildTest};
use boxoffice_tests::{child_test_name, event, ga, on_runtime, reserved};

const DIR_VAR: &str = "BOXOFFICE_CRASH_DIR";

#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(DIR_VAR) else {
        return; // Only does something when started by the parent below.
    };
    child::announce();
    on_runtime(async move {
        let mut config = EngineConfig::new(&dir);
        config.clock = Arc::new(SystemClock);
        let engine = Engine::open(config).await.unwrap();
        engine
            .create_event(event(
                "k9",
                vec![ga("floor", 1_000_000, 10), reserved("orch", 100, 100, 20)],
                600_000,
                4,
            ))
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for t in 0..16 {
            let engine = engine.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0u64.. {
                    let user = UserId::from(format!("t{t}-{i}"));
                    let section = if i % 2 == 0 { "floor" } else { "orch" };
                    let hold = engine
                        .hold(HoldRequest {
                            event_id: EventId::from("k9"),
                            user_id: user.clone(),
                            idempotency_key: format!("h{i}"),
                            selection: Selection::BestAvailable {
                                section: Some(section.into()),
                                quantity: 1 + (i % 3) as u32,
                            },
                        })
                        .await
                        .unwrap();
                    println!("HOLD {}", hold.hold_id);
                    if i % 2 == 0 {
                        let order = engine
                            .confirm(ConfirmRequest {
                                hold_id: hold.hold_id.clone(),
                                user_id: user,
                                payment_ref: "tok_visa".into(),
                                idempotency_key: format!("c{i}"),
                            })
                            .await
                            .unwrap();
                        println!("ORDER {} {}", order.order_id, hold.hold_id);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// Notes what one line of the child's output acknowledged.
fn record(line: &str, holds: &mut Vec<HoldId>, orders: &mut Vec<(OrderId, HoldId)>) {
    let mut parts = line.split_whitespace();
    match parts.next() {
        Some("HOLD") => holds.push(HoldId::from(parts.next().unwrap())),
        Some("ORDER") => orders.push((
            OrderId::from(parts.next().unwrap()),
            HoldId::from(parts.next().unwrap()),
        )),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_holds_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = ChildTest::spawn(
        child_test_name!(crash_child),
        &[(DIR_VAR, dir.path().as_os_str())],
    );
    let mut holds = Vec::new();
    let mut orders = Vec::new();
    while holds.len() < 2_000 {
        let Some(line) = child.next_line() else {
            panic!("the child stopped early after {} holds", holds.len());
        };
        record(&line, &mut holds, &mut orders);
    }
    child.kill(); // SIGKILL: no destructor, no flush, no goodbye
    // Lines the child printed before dying were acknowledged too.
    for line in child.rest() {
        record(&line, &mut holds, &mut orders);
    }

    let engine = Engine::open(EngineConfig::new(dir.path())).await.unwrap();
    for h in &holds {
        let hold = engine.get_hold(h).await.unwrap();
        assert!(
            matches!(hold.status, HoldStatus::Held | HoldStatus::Confirmed),
            "{h} is {:?}",
            hold.status
        );
    }
    for (o, h) in &orders {
        let order = engine.get_order(o).await.unwrap();
        assert_eq!(&order.hold_id, h);
        assert_eq!(
            engine.get_hold(h).await.unwrap().status,
            HoldStatus::Confirmed
        );
    }
    for s in engine.event(&EventId::from("k9")).unwrap().sections {
        let core = engine
            .inspect_section(&EventId::from("k9"), &s.spec.section_id)
            .await
            .unwrap();
        core.check_invariants().unwrap();
    }
    assert!(holds.len() >= 2_000 && !orders.is_empty());
    engine.shutdown().await;
}
