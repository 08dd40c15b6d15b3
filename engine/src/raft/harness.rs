//! Helpers for tests that run a group of nodes (feature `test-support`): who leads, and a
//! write that follows the leader.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{Batch, Raft};

/// The leader every node of `rafts` agrees on, within 10 s (`Err`: what they said last).
pub async fn leader(rafts: &BTreeMap<u64, Raft>) -> Result<u64, String> {
    let mut seen = BTreeSet::new();
    for _ in 0..400 {
        seen = rafts
            .values()
            .map(|r| r.metrics().borrow().current_leader)
            .collect();
        if let [Some(l)] = seen.iter().copied().collect::<Vec<_>>()[..]
            && rafts.contains_key(&l)
        {
            return Ok(l);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(format!(
        "no leader agreed on by {:?}: {seen:?}",
        rafts.keys()
    ))
}

/// Writes `batch` through the group's leader until one takes it; returns once it is committed
/// by a majority. A node that is no longer the leader takes nothing (openraft says where the
/// leader is), so sending the batch again to the new leader cannot write it twice; any other
/// error is returned.
pub async fn write(rafts: &BTreeMap<u64, Raft>, batch: &Batch) -> Result<u64, String> {
    loop {
        let l = leader(rafts).await?;
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            rafts[&l].client_write(batch.clone()),
        )
        .await
        .map_err(|_| format!("node {l} did not answer a write within 10 s"))?;
        match answer {
            Ok(r) => return Ok(r.data),
            Err(e) if e.forward_to_leader().is_some() => {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Waits (10 s at most) until every state machine of `sms` has applied exactly `acked`, in
/// order (`Err`: how many each had applied).
pub async fn all_hold(
    sms: &BTreeMap<u64, super::SledStateMachine>,
    acked: &[Batch],
) -> Result<(), String> {
    let applied = |sm: &super::SledStateMachine| -> Vec<Batch> {
        sm.batches()
            .map(|b| b.into_iter().map(|(_, b)| b).collect())
            .unwrap_or_default()
    };
    for _ in 0..400 {
        if sms.values().all(|sm| applied(sm) == acked) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let counts: BTreeMap<u64, usize> = sms
        .iter()
        .map(|(id, sm)| (*id, applied(sm).len()))
        .collect();
    Err(format!(
        "not every node holds the {} acknowledged batches: {counts:?}",
        acked.len()
    ))
}

/// A node of an in-process group: its Raft and its state machine, on its own sled database.
pub struct Node {
    /// Its Raft.
    pub raft: Raft,
    /// Its copy of the replicated batches.
    pub sm: super::SledStateMachine,
    _db: super::NodeDb,
}

/// Starts node `id` on the sled database in `dir` (new or as it was left), on `router`, with a
/// snapshot every `snapshot_every` entries.
pub async fn start(
    router: &super::network::Router,
    id: u64,
    dir: &std::path::Path,
    snapshot_every: u64,
) -> Result<Node, String> {
    let db = super::open_node_db(dir).map_err(|e| e.to_string())?;
    let sm = super::SledStateMachine::open(&db).map_err(|e| e.to_string())?;
    let log = super::SledLogStore::open(&db).map_err(|e| e.to_string())?;
    let raft = Raft::new(
        id,
        super::config(snapshot_every),
        router.client_of(id),
        log,
        sm.clone(),
    )
    .await
    .map_err(|e| e.to_string())?;
    router.add(id, raft.clone());
    Ok(Node { raft, sm, _db: db })
}
