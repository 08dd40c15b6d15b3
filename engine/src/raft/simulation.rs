//! A randomized fault simulation of a three-node group over the in-process router: writes,
//! cut and healed links, crashes and restarts, in an order drawn from a seed. At the end every
//! link is healed and every node restarted, and then every node must hold the same sequence of
//! batches, containing every acknowledged batch in the order it was acknowledged (nothing
//! acknowledged lost, no node diverging). Each batch is proposed once, so the check that none
//! appears twice guards the log's storage (an entry kept under two indexes), not client retries.
//!
//! The schedule of faults replays from its seed (`BOXOFFICE_RAFT_SEED=N` runs only that seed);
//! the timing of messages is the machine's, so a replay follows the same schedule but not
//! necessarily the same interleaving. The short tier runs 4 seeds of 30 steps;
//! `BOXOFFICE_SLOW=1` runs 40 seeds of 60 steps.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use openraft::BasicNode;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::harness::Node;
use super::network::Router;
use super::store::StateMachine;
use crate::store::Batch;

async fn start(router: &Router, id: u64, dir: &Path) -> Node {
    super::harness::start_opaque(router, id, dir, 10)
        .await
        .unwrap()
}

/// Write `n` appends record `n + 1` of the stream `sim`, holding `n`.
fn batch(n: u64) -> Batch {
    super::harness::one_record("sim", n.saturating_add(1), n.to_be_bytes().to_vec())
}

fn applied(sm: &StateMachine) -> Vec<(u64, Vec<u8>)> {
    super::harness::records(sm, "sim")
}

async fn run(seed: u64, steps: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dirs: BTreeMap<u64, tempfile::TempDir> = (1..=3)
        .map(|id| (id, tempfile::tempdir().unwrap()))
        .collect();
    let router = Router::default();
    let mut up: BTreeMap<u64, Node> = BTreeMap::new();
    for (id, dir) in &dirs {
        up.insert(*id, start(&router, *id, dir.path()).await);
    }
    let members: BTreeMap<u64, BasicNode> = (1..=3).map(|id| (id, BasicNode::default())).collect();
    up[&1].raft.initialize(members).await.unwrap();
    let mut cut: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut acked: Vec<Batch> = Vec::new();
    let mut next = 0u64;
    let mut log = Vec::new();
    for _ in 0..steps {
        match rng.random_range(0..10) {
            // Writes (most steps): to whichever node believes it leads.
            0..=5 => {
                let leaders: Vec<u64> = up
                    .iter()
                    .filter(|(id, n)| n.raft.metrics().borrow().current_leader == Some(**id))
                    .map(|(id, _)| *id)
                    .collect();
                let Some(&l) = leaders.first() else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    log.push("no leader".to_owned());
                    continue;
                };
                for _ in 0..rng.random_range(1..5) {
                    let b = batch(next);
                    next += 1;
                    let w = tokio::time::timeout(
                        Duration::from_millis(600),
                        up[&l].raft.client_write(b.clone()),
                    )
                    .await;
                    // Only an answer is an acknowledgement; a timeout or an error may or may
                    // not have taken effect.
                    if matches!(w, Ok(Ok(_))) {
                        acked.push(b);
                    }
                }
                log.push(format!("write via {l}"));
            }
            6 => {
                let a = rng.random_range(1..=3u64);
                let b = rng.random_range(1..=3u64);
                if a != b {
                    router.cut(a, b, true);
                    cut.insert((a.min(b), a.max(b)));
                    log.push(format!("cut {a}-{b}"));
                }
            }
            7 => {
                if let Some(&(a, b)) = cut.iter().next() {
                    router.cut(a, b, false);
                    cut.remove(&(a, b));
                    log.push(format!("heal {a}-{b}"));
                }
            }
            8 => {
                let id = rng.random_range(1..=3u64);
                if let Some(n) = up.remove(&id) {
                    router.remove(id);
                    n.raft.shutdown().await.unwrap();
                    log.push(format!("crash {id}"));
                }
            }
            _ => {
                let down: Vec<u64> = (1..=3).filter(|id| !up.contains_key(id)).collect();
                if !down.is_empty() {
                    let id = down[rng.random_range(0..down.len())];
                    up.insert(id, start(&router, id, dirs[&id].path()).await);
                    log.push(format!("restart {id}"));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..60))).await;
    }
    // Heal everything, restart everyone, then wait for one agreed sequence.
    for (a, b) in std::mem::take(&mut cut) {
        router.cut(a, b, false);
    }
    for id in 1..=3u64 {
        if let std::collections::btree_map::Entry::Vacant(slot) = up.entry(id) {
            slot.insert(start(&router, id, dirs[&id].path()).await);
        }
    }
    // A write after healing commits everything before it in the new leader's term.
    let rafts = up.iter().map(|(id, n)| (*id, n.raft.clone())).collect();
    let last = batch(u64::MAX - 1);
    super::harness::write(&rafts, &last)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: no write after healing: {e}; {log:?}"));
    acked.push(last);
    let want = super::harness::expected(&acked)
        .remove("sim")
        .unwrap_or_default();
    let mut seen = Vec::new();
    for _ in 0..400 {
        seen = up.values().map(|n| applied(&n.sm)).collect::<Vec<_>>();
        if seen.windows(2).all(|w| w[0] == w[1])
            && seen[0].last().map(|(s, _)| *s) == want.keys().last().copied()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let lens: Vec<usize> = seen.iter().map(Vec::len).collect();
    assert!(
        seen.windows(2).all(|w| w[0] == w[1]),
        "seed {seed}: the nodes diverge ({lens:?} records); schedule {log:?}"
    );
    let held: BTreeMap<u64, Vec<u8>> = seen[0].iter().cloned().collect();
    let missing: Vec<u64> = want
        .iter()
        .filter(|(seq, bytes)| held.get(seq) != Some(bytes))
        .map(|(seq, _)| *seq)
        .collect();
    assert!(
        missing.is_empty(),
        "seed {seed}: acknowledged records missing or changed: {missing:?} ({} acknowledged, {} \
         held); schedule {log:?}",
        want.len(),
        held.len()
    );
    // Anything else held is a write that committed without its answer reaching the writer
    // (a timeout): allowed, but only as that write wrote it.
    for (seq, bytes) in &held {
        assert_eq!(
            bytes,
            &seq.wrapping_sub(1).to_be_bytes().to_vec(),
            "seed {seed}: record {seq} holds what no write wrote"
        );
    }
    for n in up.into_values() {
        n.raft.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_partitions_crashes_and_restarts_lose_nothing_acknowledged() {
    let slow = crate::tiers::slow();
    let seeds: Vec<u64> = match crate::tiers::number("BOXOFFICE_RAFT_SEED") {
        Some(s) => vec![s],
        None if slow => (0..40).collect(),
        None => (0..4).collect(),
    };
    let steps = if slow { 60 } else { 30 };
    for seed in seeds {
        run(seed, steps).await;
    }
}
