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
    Batch {
        records: vec![(
            "section/e/s".into(),
            crate::codec::encode(&format!("hold {n}")),
        )],
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_death_loses_nothing_acknowledged_and_nodes_catch_up() {
    let dirs: BTreeMap<u64, tempfile::TempDir> = (1..=3)
        .map(|id| (id, tempfile::tempdir().unwrap()))
        .collect();
    let router = Router::default();
    let mut nodes = BTreeMap::new();
    for (id, dir) in &dirs {
        nodes.insert(*id, start(&router, *id, dir.path()).await);
    }
    let members: BTreeMap<u64, BasicNode> = (1..=3).map(|id| (id, BasicNode::default())).collect();
    nodes[&1].raft.initialize(members).await.unwrap();

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
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let router = Router::default();
    let mut nodes = BTreeMap::new();
    for (i, dir) in dirs.iter().enumerate() {
        let id = i as u64 + 1;
        nodes.insert(id, start(&router, id, dir.path()).await);
    }
    let members: BTreeMap<u64, BasicNode> = (1..=3).map(|id| (id, BasicNode::default())).collect();
    nodes[&1].raft.initialize(members).await.unwrap();
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
