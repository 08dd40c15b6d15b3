//! Invariant 4: every acknowledged hold and confirm survives `kill -9`.
//!
//! The test runs the child side in a process of its own (`boxoffice-test-child kill9-sale`,
//! [`boxoffice_tests::children::kill9_sale`]). The child books places as fast as it can and
//! prints each acknowledged hold or confirm on stdout. The parent reads until it has seen enough,
//! sends SIGKILL mid-flight, reopens the data dir and checks that everything acknowledged is
//! there, and that the invariants hold.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use boxoffice_engine::{Engine, EngineConfig, EventId, HoldId, HoldStatus, OrderId};
use boxoffice_tests::child::ChildTest;
use boxoffice_tests::child_bin;
use boxoffice_tests::children::KILL9_DIR_VAR;

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
        child_bin!(),
        "kill9-sale",
        &[(KILL9_DIR_VAR, dir.path().as_os_str())],
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
