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

/// The read fence (`fence.rs`): a leader confirms an answer made before a round of heartbeats;
/// cut off from both followers it confirms nothing made after the cut (while the others elect
/// a leader that commits); a fence of another term confirms nothing; a commit of its term
/// covers answers made before it without a round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_confirms_answers_only_while_a_majority_follows_it() {
    use super::fence::{FenceError, ReadFence};
    use tokio::time::Instant;
    let router = Router::default();
    let (_dirs, nodes) = three_nodes(&router, 20).await;
    write(&nodes, 0..3).await;
    let l = leader(&nodes).await;
    let term = nodes[&l].raft.metrics().borrow().current_term;
    let fence = ReadFence::new(nodes[&l].raft.clone(), term);
    fence.confirm(Instant::now()).await.unwrap();
    // Another term's fence (an engine opened in an earlier leadership) confirms nothing.
    let old = ReadFence::new(nodes[&l].raft.clone(), term - 1);
    assert_eq!(
        old.confirm(Instant::now()).await,
        Err(FenceError::NotLeader(term - 1))
    );
    // A commit of its term, submitted after the answer, covers it without a round.
    let answered = Instant::now();
    let submitted = Instant::now();
    fence.led_at(submitted);
    fence.confirm(answered).await.unwrap();

    for other in nodes.keys().filter(|id| **id != l) {
        router.cut(l, *other, true);
    }
    let cut = Instant::now();
    let refused = fence.confirm(cut).await;
    assert!(
        refused.is_err(),
        "a leader cut off from its majority confirmed an answer made after the cut"
    );
    // Answers made before a failed round are refused without another round, and an answer
    // the last commit covers is still confirmed (it was true when it was made).
    assert_eq!(fence.confirm(cut).await, Err(FenceError::NoMajority));
    fence.confirm(answered).await.unwrap();
    for other in nodes.keys().filter(|id| **id != l) {
        router.cut(l, *other, false);
    }
    for n in nodes.values() {
        n.raft.shutdown().await.unwrap();
    }
}

/// The engine itself on a group: the leader's engine replicates every group commit, and the
/// next leader's engine recovers every hold and order from its own copy of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_leaders_engine_has_every_hold_and_order_the_last_one_acknowledged() {
    use crate::{ConfirmRequest, HoldRequest, HoldStatus, Selection, UserId};
    let router = Router::default();
    // Snapshots often, so the sale's log is purged and a snapshot carries it.
    let (_dirs, mut nodes) = three_nodes(&router, 10).await;
    let first = leader(&nodes).await;
    let engine = super::harness::open_engine(&nodes[&first]).await.unwrap();
    let event = engine
        .create_event(crate::types::ga_event_spec("e", "show", 30, 1_000))
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
                    access_code: String::new(),
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
    // Every node has applied the refused batch (its claims are taken and given back in one
    // apply; read before it, a node would show neither, during it the first claim).
    for n in nodes.values() {
        let mut m = n.raft.metrics();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            m.wait_for(|m| m.last_applied.map(|l| l.index) >= Some(applied.index)),
        )
        .await
        .unwrap()
        .unwrap();
    }
    for n in nodes.values() {
        let claims = n.sm.sink().claims().unwrap();
        assert_eq!(claims, vec![claim("e/s/a", "h1")], "node {}", n.id);
    }
    for n in nodes.values() {
        n.raft.shutdown().await.unwrap();
    }
}

/// The spec of an event `id` with a GA section of `ga` places and a reserved section of one row
/// of `row` seats, five places a fan.
fn sale_spec(id: &str, ga: u32, row: u32) -> crate::EventSpec {
    use crate::{EventId, EventSpec, Layout, SectionId, SectionSpec};
    EventSpec {
        event_id: Some(EventId::from(id)),
        name: format!("show {id}"),
        sections: vec![
            SectionSpec {
                section_id: SectionId::from("ga"),
                name: "GA".into(),
                price_cents: 1_000,
                layout: Layout::GeneralAdmission { capacity: ga },
                price_tiers: Vec::new(),
            },
            SectionSpec {
                section_id: SectionId::from("stalls"),
                name: "Stalls".into(),
                price_cents: 5_000,
                layout: Layout::Reserved {
                    rows: vec![crate::RowSpec {
                        label: "a".into(),
                        seat_count: row,
                    }],
                },
                price_tiers: Vec::new(),
            },
        ],
        hold_ttl_ms: 0,
        per_user_limit: 5,
        admit_rate_per_second: 0,
        admission_window_ms: 0,
        sale_opens_at_ms: 0,
        join_pow_difficulty_bits: 0,
        cancellation_deadline_ms: 0,
        transfers_disabled: false,
        presale: Default::default(),
    }
}

/// A sale through `engine` that writes every kind of record: two events, holds of both
/// sections, confirms, releases, refusals answered under idempotency keys (sold out, over the
/// fan's limit), waitlist entries, and a waiting room's line. Returns the holds and orders
/// acknowledged, by fan.
async fn busy_sale(engine: &crate::Engine) -> (Vec<crate::HoldView>, Vec<crate::OrderView>) {
    use crate::rooms::RoomRecord;
    use crate::{ConfirmRequest, EventId, HoldRequest, SectionId, Selection, UserId};
    for (id, ga, row) in [("warm-a", 12, 6), ("warm-b", 4, 3)] {
        engine.create_event(sale_spec(id, ga, row)).await.unwrap();
    }
    let a = EventId::from("warm-a");
    engine
        .record_room(
            &a,
            vec![
                RoomRecord::Reserved { upto: 64 },
                RoomRecord::Opened { drawn: 40 },
            ],
        )
        .await
        .unwrap();
    let mut holds = Vec::new();
    let mut orders = Vec::new();
    let mut admitted = 0u64;
    for fan in 0..24u32 {
        let event = if fan % 3 == 2 { "warm-b" } else { "warm-a" };
        let section = if fan % 2 == 0 { "ga" } else { "stalls" };
        let user = UserId::from(format!("fan-{fan}").as_str());
        let held = engine
            .hold(HoldRequest {
                event_id: EventId::from(event),
                user_id: user.clone(),
                idempotency_key: format!("hold-{fan}"),
                selection: Selection::BestAvailable {
                    section: Some(SectionId::from(section)),
                    quantity: 1 + fan % 3,
                },
                access_code: String::new(),
            })
            .await;
        // Sold out, or over the limit, later on: refusals the ledger records.
        let Ok(h) = held else { continue };
        match fan % 4 {
            0 | 1 => orders.push(
                engine
                    .confirm(ConfirmRequest {
                        hold_id: h.hold_id.clone(),
                        user_id: user.clone(),
                        payment_ref: "tok_visa".into(),
                        idempotency_key: format!("pay-{fan}"),
                    })
                    .await
                    .unwrap(),
            ),
            2 => {
                engine.release(&h.hold_id, &user).await.unwrap();
            }
            _ => {}
        }
        holds.push(h);
        if fan % 5 == 0 {
            engine
                .record_room(
                    &a,
                    vec![RoomRecord::Admitted {
                        from: admitted,
                        to: admitted + 5,
                        at_ms: engine.now_ms(),
                    }],
                )
                .await
                .unwrap();
            admitted += 5;
        }
    }
    // Over the limit of five: a refusal under a key.
    let over = engine
        .hold(HoldRequest {
            event_id: EventId::from("warm-a"),
            user_id: UserId::from("fan-0"),
            idempotency_key: "greedy".into(),
            selection: Selection::BestAvailable {
                section: None,
                quantity: 5,
            },
            access_code: String::new(),
        })
        .await;
    assert!(over.is_err(), "over the limit: {over:?}");
    // Event b sells out; then fans wait, and keyed holds are refused.
    for fan in 100..110u32 {
        let user = UserId::from(format!("fan-{fan}").as_str());
        let _ = engine
            .hold(HoldRequest {
                event_id: EventId::from("warm-b"),
                user_id: user.clone(),
                idempotency_key: format!("late-{fan}"),
                selection: Selection::BestAvailable {
                    section: None,
                    quantity: 2,
                },
                access_code: String::new(),
            })
            .await;
        let _ = engine
            .join_waitlist(&EventId::from("warm-b"), &user, None, 2)
            .await;
    }
    (holds, orders)
}

/// Waits (10 s at most) until every node of `nodes` has applied the same last entry, the last
/// of its log.
async fn all_applied(nodes: &BTreeMap<u64, Node>) {
    for _ in 0..400 {
        let at: BTreeSet<(Option<u64>, Option<u64>)> = nodes
            .values()
            .map(|n| {
                let m = n.raft.metrics().borrow().clone();
                (m.last_applied.map(|l| l.index), m.last_log_index)
            })
            .collect();
        let applied: BTreeSet<Option<u64>> = at.iter().map(|(a, _)| *a).collect();
        if applied.len() == 1 && at.iter().all(|(a, c)| a == c) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the nodes did not apply the same entries within 10 s");
}

/// A follower's warm state (each committed batch applied to the pure cores as it is applied to
/// the follower's copy) is exactly what a start reads from that copy: the same events,
/// sections, waitlist, rooms, ledger shards and sequence numbers, with checkpoints written and
/// streams compacted in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_warm_state_is_what_a_start_reads_from_its_copy() {
    use crate::recovery::{RecoverWith, recover, settle};
    let router = Router::default();
    let (_dirs, nodes) = three_nodes(&router, 1_000).await;
    let first = leader(&nodes).await;
    let window_ms = crate::IDEMPOTENCY_WINDOW_MS_DEFAULT;
    for n in nodes.values().filter(|n| n.id != first) {
        assert!(n.sm.warm_up(window_ms).await, "node {} warms up", n.id);
        assert!(!n.sm.warm_up(window_ms).await, "once");
    }
    let engine = super::harness::open_engine_with(&nodes[&first], |c| {
        c.checkpoint_every_records = 3;
    })
    .await
    .unwrap();
    let (holds, orders) = busy_sale(&engine).await;
    assert!(holds.len() > 10 && orders.len() > 4);
    let now_ms = engine.now_ms();
    engine.shutdown().await;
    all_applied(&nodes).await;
    assert!(!nodes[&first].sm.warm().is_warm(), "the leader keeps none");
    let with = RecoverWith {
        ledger_shards: crate::limits::LEDGER_SHARDS_DEFAULT,
        window_ms,
        now_ms,
        mode: crate::RecoveryMode::Verify,
        replicated: true,
    };
    for n in nodes.values().filter(|n| n.id != first) {
        let warm = n.sm.warm();
        assert!(warm.is_warm(), "node {} stayed warm through the sale", n.id);
        let (replayed, kept_ms) = warm.take().unwrap();
        assert_eq!(kept_ms, window_ms);
        let warm = settle(replayed, &with, crate::store::Marks::default());
        let mut report = crate::RecoveryReport::default();
        let cold = recover(n.sm.sink().as_ref(), &with, &mut report).unwrap();
        assert!(report.checkpoints_loaded > 0, "checkpoints were written");
        assert_eq!(warm.events, cold.events, "node {}: events", n.id);
        assert_eq!(warm.catalog_last, cold.catalog_last);
        assert_eq!(warm.cores.len(), 4);
        assert_eq!(warm.cores, cold.cores, "node {}: sections", n.id);
        assert_eq!(warm.waitlist, cold.waitlist, "node {}: waitlist", n.id);
        assert!(warm.waitlist_last > 0);
        assert_eq!(warm.waitlist_last, cold.waitlist_last);
        assert_eq!(warm.rooms, cold.rooms, "node {}: rooms", n.id);
        assert_eq!(warm.ledger_last, cold.ledger_last);
        assert!(
            warm.ledger_last.iter().any(|l| *l > 0),
            "refusals were recorded"
        );
        let digest = |r: &crate::recovery::Recovered| -> Vec<Vec<String>> {
            r.ledger_states.iter().map(|s| s.digest()).collect()
        };
        assert_eq!(digest(&warm), digest(&cold), "node {}: ledger shards", n.id);
    }
    for n in nodes.values() {
        n.raft.shutdown().await.unwrap();
    }
}

/// A failover from a warm follower: the next leader's engine starts from the state it kept
/// (its report says so) and has every hold, order and first answer of the last leader's, and
/// the sale goes on. A record its state cannot take (a stream of no known event) drops the
/// state: the next start reads the log instead, with the same result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_leader_starts_warm_and_a_state_that_does_not_fit_is_dropped() {
    use crate::{EventId, HoldRequest, Selection, UserId};
    let router = Router::default();
    let (dirs, mut nodes) = three_nodes(&router, 1_000).await;
    let window_ms = crate::IDEMPOTENCY_WINDOW_MS_DEFAULT;
    let mut expected = None;
    for round in 0..2 {
        let first = leader(&nodes).await;
        for n in nodes.values().filter(|n| n.id != first) {
            n.sm.warm_up(window_ms).await;
            assert!(n.sm.warm().is_warm(), "node {} is warm", n.id);
        }
        let engine = super::harness::open_engine(&nodes[&first]).await.unwrap();
        if round == 0 {
            expected = Some(busy_sale(&engine).await);
        } else {
            // A record for a stream no event has: every follower's warm state drops.
            super::harness::write(
                &rafts(&nodes),
                &super::harness::one_record("section/nobody/x", 1, crate::codec::encode(&"x")),
            )
            .await
            .unwrap();
        }
        engine.shutdown().await;
        drop(engine);
        all_applied(&nodes).await;
        router.remove(first);
        let dead = nodes.remove(&first).unwrap();
        dead.raft.shutdown().await.unwrap();
        drop(dead);
        let next = leader(&nodes).await;
        let engine = super::harness::open_engine(&nodes[&next]).await.unwrap();
        assert_eq!(
            engine.recovery_report().warm,
            round == 0,
            "round {round}: the start was warm only while the state fit"
        );
        let (holds, orders) = expected.as_ref().unwrap();
        let mut sold = engine.orders().await.unwrap();
        sold.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        let mut want = orders.clone();
        want.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        assert_eq!(sold, want, "round {round}: every order");
        for h in holds {
            let now = engine.get_hold(&h.hold_id).await.unwrap();
            assert_eq!(
                (&now.seat_ids, now.quantity),
                (&h.seat_ids, h.quantity),
                "round {round}: hold {}",
                h.hold_id
            );
        }
        // Retries answer the first answers, refusals included.
        let again = engine
            .hold(HoldRequest {
                event_id: EventId::from("warm-a"),
                user_id: UserId::from("fan-0"),
                idempotency_key: "greedy".into(),
                selection: Selection::BestAvailable {
                    section: None,
                    quantity: 5,
                },
                access_code: String::new(),
            })
            .await;
        assert!(again.is_err(), "round {round}: the refusal stands");
        let retried = engine
            .hold(HoldRequest {
                event_id: holds[0].event_id.clone(),
                user_id: holds[0].user_id.clone(),
                idempotency_key: "hold-0".into(),
                selection: Selection::BestAvailable {
                    section: Some(crate::SectionId::from("ga")),
                    quantity: 1,
                },
                access_code: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(retried.hold_id, holds[0].hold_id);
        assert!(engine.reconcile().await.unwrap().is_empty());
        engine.shutdown().await;
        // The dead node comes back (its copy as it was) for the next round.
        let dir = dirs[&first].path().to_path_buf();
        let node = start(&router, first, &dir).await;
        nodes.insert(first, node);
        all_applied(&nodes).await;
    }
    for n in nodes.values() {
        n.raft.shutdown().await.unwrap();
    }
}

/// A copy with damage (a charge of the payment record that no longer decodes) builds no
/// snapshot: it is never handed on.
#[tokio::test]
async fn a_damaged_copy_builds_no_snapshot() {
    use openraft::storage::RaftSnapshotBuilder;
    let disk = crate::store::SimKv::new();
    let node = super::NodeDb::new(std::sync::Arc::new(disk.clone()));
    let mut sm = super::StateMachine::open(&node).unwrap();
    // A healthy copy builds one.
    sm.build_snapshot().await.unwrap();
    // A charge of the payment record that no longer decodes (a bit flipped at rest).
    crate::store::Kv::tree(&disk, crate::store::names::PAYMENTS)
        .unwrap()
        .insert(b"show.ga.h1:k", b"not a charge")
        .unwrap();
    let e = sm.build_snapshot().await.err().unwrap().to_string();
    assert!(e.contains("damaged"), "{e}");
    assert!(e.contains("payments"), "{e}");
}
