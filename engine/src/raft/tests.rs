//! Three nodes in one process over the in-process router, each on its own sled database: every
//! acknowledged batch is on a majority and then on every live node; the leader's death loses
//! nothing acknowledged; a restarted node, and a node whose data was wiped, catch up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use openraft::BasicNode;

use super::Batch;
use super::harness::Node;
use super::network::Router;

async fn start(router: &Router, id: u64, dir: &Path) -> Node {
    super::harness::start(router, id, dir, 20).await.unwrap()
}

fn batch(n: u64) -> Batch {
    super::harness::one_record(
        "section/e/s",
        n + 1,
        crate::codec::encode(&format!("hold {n}")),
    )
}

fn rafts(nodes: &BTreeMap<u64, Node>) -> BTreeMap<u64, super::Raft> {
    nodes.iter().map(|(id, n)| (*id, n.raft.clone())).collect()
}

async fn leader(nodes: &BTreeMap<u64, Node>) -> u64 {
    super::harness::leader(&rafts(nodes)).await.unwrap()
}

/// Writes `range` through the leader; returns the batches acknowledged (committed by a majority).
async fn write(nodes: &BTreeMap<u64, Node>, range: std::ops::Range<u64>) -> Vec<Batch> {
    let mut acked = Vec::new();
    for n in range {
        let b = batch(n);
        super::harness::write(&rafts(nodes), &b).await.unwrap();
        acked.push(b);
    }
    acked
}

/// Every node of `nodes` has applied exactly `acked`, in order.
async fn all_hold(nodes: &BTreeMap<u64, Node>, acked: &[Batch]) {
    let sms = nodes.iter().map(|(id, n)| (*id, n.sm.clone())).collect();
    super::harness::all_hold(&sms, acked).await.unwrap();
}

/// Three nodes (ids 1 to 3) on `router`, each in its own temp dir, one snapshot every
/// `snapshot_every` entries, initialized as one group.
async fn three_nodes(
    router: &Router,
    snapshot_every: u64,
) -> (BTreeMap<u64, tempfile::TempDir>, BTreeMap<u64, Node>) {
    let dirs: BTreeMap<u64, tempfile::TempDir> = (1..=3)
        .map(|id| (id, tempfile::tempdir().unwrap()))
        .collect();
    let mut nodes = BTreeMap::new();
    for (id, dir) in &dirs {
        let node = super::harness::start(router, *id, dir.path(), snapshot_every)
            .await
            .unwrap();
        nodes.insert(*id, node);
    }
    let members: BTreeMap<u64, BasicNode> = (1..=3).map(|id| (id, BasicNode::default())).collect();
    nodes[&1].raft.initialize(members).await.unwrap();
    (dirs, nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_death_loses_nothing_acknowledged_and_nodes_catch_up() {
    let router = Router::default();
    let (dirs, mut nodes) = three_nodes(&router, 20).await;

    // Acknowledged writes are on every node.
    let mut acked = write(&nodes, 0..30).await;
    all_hold(&nodes, &acked).await;

    // The leader dies (off the network, stopped): the two others elect one and go on, and
    // nothing acknowledged is missing from them.
    let dead = leader(&nodes).await;
    router.remove(dead);
    let old = nodes.remove(&dead).unwrap();
    old.raft.shutdown().await.unwrap();
    drop(old);
    acked.extend(write(&nodes, 30..60).await);
    all_hold(&nodes, &acked).await;

    // It restarts from its own data and catches up.
    nodes.insert(dead, start(&router, dead, dirs[&dead].path()).await);
    acked.extend(write(&nodes, 60..70).await);
    all_hold(&nodes, &acked).await;

    // A follower's data is wiped. A node that lost its log and its vote must not vote again as
    // if it had them (it could elect a leader without the acknowledged entries), so it rejoins
    // the way Raft allows: the group drops it, it comes back as a learner, catches up (from a
    // snapshot: the log it missed has been purged), and only then votes again.
    let l = leader(&nodes).await;
    let wiped = *nodes.keys().find(|id| **id != l).unwrap();
    router.remove(wiped);
    let gone = nodes.remove(&wiped).unwrap();
    gone.raft.shutdown().await.unwrap();
    drop(gone);
    acked.extend(write(&nodes, 70..100).await);
    let survivors: BTreeSet<u64> = nodes.keys().copied().collect();
    nodes[&l]
        .raft
        .change_membership(survivors.clone(), false)
        .await
        .unwrap();
    let fresh = tempfile::tempdir().unwrap();
    nodes.insert(wiped, start(&router, wiped, fresh.path()).await);
    nodes[&l]
        .raft
        .add_learner(wiped, BasicNode::default(), true)
        .await
        .unwrap();
    let all: BTreeSet<u64> = (1..=3).collect();
    nodes[&l].raft.change_membership(all, false).await.unwrap();
    acked.extend(write(&nodes, 100..105).await);
    all_hold(&nodes, &acked).await;
    let snapshot = nodes[&wiped].raft.metrics().borrow().snapshot;
    assert!(
        snapshot.is_some(),
        "the wiped node caught up from a snapshot"
    );

    for n in nodes.values() {
        n.raft.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_majority_acknowledges_nothing() {
    let router = Router::default();
    let (_dirs, nodes) = three_nodes(&router, 20).await;
    let acked = write(&nodes, 0..5).await;
    all_hold(&nodes, &acked).await;

    // The leader is cut off from both others: a write to it is never acknowledged.
    let l = leader(&nodes).await;
    for other in nodes.keys().filter(|id| **id != l) {
        router.cut(l, *other, true);
    }
    let stuck = tokio::time::timeout(
        Duration::from_millis(1_500),
        nodes[&l].raft.client_write(batch(999)),
    )
    .await;
    // It took the write and waited for a majority that never answered (not a refusal).
    assert!(
        stuck.is_err(),
        "a leader without a majority answered a write: {stuck:?}"
    );
    for other in nodes.keys().filter(|id| **id != l) {
        router.cut(l, *other, false);
    }
    // Healed: the group agrees on what was acknowledged, and the unacknowledged write is gone
    // (the others elected a leader without it, which overwrites it).
    let mut acked = acked;
    acked.extend(write(&nodes, 5..8).await);
    all_hold(&nodes, &acked).await;
    for n in nodes.values() {
        n.raft.shutdown().await.unwrap();
    }
}

/// The engine itself on a group: the leader's engine replicates every group commit, and the
/// next leader's engine recovers every hold and order from its own copy of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_leaders_engine_has_every_hold_and_order_the_last_one_acknowledged() {
    use crate::{
        ConfirmRequest, EventId, EventSpec, HoldRequest, HoldStatus, Layout, SectionId,
        SectionSpec, Selection, UserId,
    };
    let router = Router::default();
    // Snapshots often, so the sale's log is purged and a snapshot carries it.
    let (_dirs, mut nodes) = three_nodes(&router, 10).await;
    let first = leader(&nodes).await;
    let engine = super::harness::open_engine(&nodes[&first]).await.unwrap();
    let event = engine
        .create_event(EventSpec {
            event_id: Some(EventId::from("e")),
            name: "show".into(),
            sections: vec![SectionSpec {
                section_id: SectionId::from("ga"),
                name: "GA".into(),
                price_cents: 1_000,
                layout: Layout::GeneralAdmission { capacity: 30 },
            }],
            hold_ttl_ms: 0,
            per_user_limit: 0,
            admit_rate_per_second: 0,
            admission_window_ms: 0,
            sale_opens_at_ms: 0,
            join_pow_difficulty_bits: 0,
        })
        .await
        .unwrap();
    let hold = |engine: crate::Engine, fan: u32| {
        let event_id = event.event_id.clone();
        async move {
            engine
                .hold(HoldRequest {
                    event_id,
                    user_id: UserId::from(format!("fan-{fan}").as_str()),
                    idempotency_key: format!("hold-{fan}"),
                    selection: Selection::BestAvailable {
                        section: None,
                        quantity: 2,
                    },
                })
                .await
        }
    };
    let mut holds = Vec::new();
    for fan in 0..10 {
        holds.push(hold(engine.clone(), fan).await.unwrap());
    }
    let mut orders = Vec::new();
    for (fan, h) in holds.iter().enumerate().take(5) {
        orders.push(
            engine
                .confirm(ConfirmRequest {
                    hold_id: h.hold_id.clone(),
                    user_id: UserId::from(format!("fan-{fan}").as_str()),
                    payment_ref: "tok_visa".into(),
                    idempotency_key: format!("pay-{fan}"),
                })
                .await
                .unwrap(),
        );
    }
    engine.shutdown().await;

    // The leader dies; the next one's engine recovers from its own copy.
    router.remove(first);
    let dead = nodes.remove(&first).unwrap();
    dead.raft.shutdown().await.unwrap();
    drop(dead);
    let next = leader(&nodes).await;
    let engine = super::harness::open_engine(&nodes[&next]).await.unwrap();
    let mut sold_orders = engine.orders().await.unwrap();
    sold_orders.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    orders.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    assert_eq!(
        sold_orders, orders,
        "every acknowledged order is on the next leader"
    );
    let section = &engine.event(&event.event_id).unwrap().sections[0];
    assert_eq!(section.sold, 10);
    assert_eq!(
        section.held, 10,
        "the five unconfirmed holds of two seats are still held"
    );
    // Retries answer the first answers: nothing is held or charged twice.
    for (fan, h) in holds.iter().enumerate() {
        let again = hold(engine.clone(), fan as u32).await.unwrap();
        assert_eq!(again.hold_id, h.hold_id);
    }
    let charged = engine
        .confirm(ConfirmRequest {
            hold_id: holds[0].hold_id.clone(),
            user_id: UserId::from("fan-0"),
            payment_ref: "tok_visa".into(),
            idempotency_key: "pay-0".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        charged.order_id,
        orders
            .iter()
            .find(|o| o.hold_id == holds[0].hold_id)
            .unwrap()
            .order_id
    );
    // The sale goes on: the 10 seats left sell, and not one more.
    let mut more = 0;
    for fan in 10..20 {
        match hold(engine.clone(), fan).await {
            Ok(h) if h.status == HoldStatus::Held => more += 1,
            _ => {}
        }
    }
    assert_eq!(more, 5, "the 10 seats left go to 5 fans of 2");
    assert!(engine.reconcile().await.unwrap().is_empty());
    engine.shutdown().await;
    for n in nodes.values() {
        n.raft.shutdown().await.unwrap();
    }
}

/// What every node's state machine does alike: a batch written under another term than its
/// entry's is skipped (an engine of an earlier leadership), and an append whose claim is
/// refused writes none of its claims and none of its records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_batches_and_refused_claims_change_no_node() {
    use crate::store::LogSink;
    let router = Router::default();
    let (_dirs, nodes) = three_nodes(&router, 1_000).await;
    let rafts = rafts(&nodes);
    let term = nodes[&leader(&nodes).await]
        .raft
        .metrics()
        .borrow()
        .current_term;
    let claim = |key: &str, holder: &str| (key.to_owned(), holder.as_bytes().to_vec());
    let append = |seq: u64, claims: Vec<(String, Vec<u8>)>, term: u64| Batch {
        term,
        ops: vec![super::Op::Append {
            stream: "section/e/s".into(),
            entries: vec![(seq, crate::codec::encode(&seq))],
            claims,
        }],
    };
    // Seat a is sold to hold h1.
    let first = append(1, vec![claim("e/s/a", "h1")], term);
    let applied = super::harness::write_applied(&rafts, &first).await.unwrap();
    assert!(!applied.stale && applied.refused.is_none());
    // An engine of another term writes: skipped everywhere.
    let stale = append(2, vec![claim("e/s/z", "h9")], term + 7);
    assert!(
        super::harness::write_applied(&rafts, &stale)
            .await
            .unwrap()
            .stale
    );
    // Seats b and a for hold h2: a is h1's, so neither claim nor the record stays.
    let refused = append(3, vec![claim("e/s/b", "h2"), claim("e/s/a", "h2")], term);
    let applied = super::harness::write_applied(&rafts, &refused)
        .await
        .unwrap();
    assert_eq!(applied.refused.as_deref(), Some("e/s/a"));
    all_hold(&nodes, &[first]).await;
    for n in nodes.values() {
        let claims = n.sm.sink().claims().unwrap();
        assert_eq!(claims, vec![claim("e/s/a", "h1")], "node {}", n.id);
    }
    for n in nodes.values() {
        n.raft.shutdown().await.unwrap();
    }
}
