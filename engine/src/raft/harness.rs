//! Helpers for tests that run a group of nodes (feature `test-support`): who leads, and a
//! write that follows the leader.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::types::Raft;
use crate::store::LogSink;
use crate::store::{Batch, Op};

/// A batch of one record, `bytes` at `seq` of `stream` (seq from 1).
pub fn one_record(stream: &str, seq: u64, bytes: Vec<u8>) -> Batch {
    Batch {
        term: 0,
        ops: vec![Op::Append {
            stream: stream.to_owned(),
            entries: vec![(seq, bytes)],
            claims: vec![],
        }],
    }
}

/// Every record of `stream` in the log `sm` applies to, by seq.
pub fn records(sm: &super::store::StateMachine, stream: &str) -> Vec<(u64, Vec<u8>)> {
    sm.sink()
        .stream(stream)
        .and_then(|s| s.read_after(0))
        .unwrap_or_default()
}

/// The records `batches` append, by stream, in seq order.
pub fn expected(batches: &[Batch]) -> BTreeMap<String, BTreeMap<u64, Vec<u8>>> {
    let mut out: BTreeMap<String, BTreeMap<u64, Vec<u8>>> = BTreeMap::new();
    for b in batches {
        for op in &b.ops {
            if let Op::Append {
                stream, entries, ..
            } = op
            {
                out.entry(stream.clone())
                    .or_default()
                    .extend(entries.iter().cloned());
            }
        }
    }
    out
}

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
    write_applied(rafts, batch).await.map(|a| a.index)
}

/// [`write`], answering what applying the batch did.
pub async fn write_applied(
    rafts: &BTreeMap<u64, Raft>,
    batch: &Batch,
) -> Result<super::types::Applied, String> {
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

/// Waits (10 s at most) until the log of every state machine of `sms` holds exactly the
/// records of `acked` in the streams they write (`Err`: how many each held).
pub async fn all_hold(
    sms: &BTreeMap<u64, super::store::StateMachine>,
    acked: &[Batch],
) -> Result<(), String> {
    let want = expected(acked);
    let held = |sm: &super::store::StateMachine| -> BTreeMap<String, BTreeMap<u64, Vec<u8>>> {
        want.keys()
            .map(|s| (s.clone(), records(sm, s).into_iter().collect()))
            .collect()
    };
    for _ in 0..400 {
        if sms.values().all(|sm| held(sm) == want) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let counts: BTreeMap<u64, usize> = sms
        .iter()
        .map(|(id, sm)| (*id, held(sm).values().map(BTreeMap::len).sum()))
        .collect();
    Err(format!(
        "not every node holds exactly the {} acknowledged records: {counts:?}",
        want.values().map(BTreeMap::len).sum::<usize>()
    ))
}

/// An engine leading `node`'s group: its log is the node's state machine's, and every group
/// commit goes through the node's Raft. Waits first until the node has applied everything its
/// group committed (as a new leader must before it serves).
pub async fn open_engine(node: &Node) -> Result<crate::Engine, String> {
    open_engine_with(node, |_| {}).await
}

/// [`open_engine`], with the engine's config changed by `change` first.
pub async fn open_engine_with(
    node: &Node,
    change: impl FnOnce(&mut crate::EngineConfig),
) -> Result<crate::Engine, String> {
    node.raft
        .ensure_linearizable()
        .await
        .map_err(|e| format!("node {}: not the leader: {e}", node.id))?;
    let mut config = crate::EngineConfig::new(
        node.db
            .dir()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default(),
    );
    config.sink = Some(node.sm.sink());
    // The state the node kept while it followed, if it warmed up.
    config.warm = Some(node.sm.warm());
    let term = node.raft.metrics().borrow().current_term;
    config.replicate = Some(std::sync::Arc::new(super::replicator::RaftReplicator::new(
        node.raft.clone(),
        term,
    )));
    change(&mut config);
    crate::Engine::open(config).await.map_err(|e| e.to_string())
}

/// A node of an in-process group: its Raft and its state machine, on its own sled database.
pub struct Node {
    /// Its Raft.
    pub raft: Raft,
    /// Its state machine (its copy of the log).
    pub sm: super::store::StateMachine,
    /// Its id.
    pub id: u64,
    db: super::node_db::NodeDb,
}

/// Starts node `id` on the sled database in `dir` (new or as it was left), on `router`, with a
/// snapshot every `snapshot_every` entries.
pub async fn start(
    router: &super::network::Router,
    id: u64,
    dir: &std::path::Path,
    snapshot_every: u64,
) -> Result<Node, String> {
    start_with(router, id, dir, snapshot_every, false).await
}

/// [`start`] for batches that are not an engine's (records of no event, with gaps where a
/// write failed): its snapshots are not checked as an engine's log
/// ([`super::store::StateMachine::with_opaque_batches`]).
pub async fn start_opaque(
    router: &super::network::Router,
    id: u64,
    dir: &std::path::Path,
    snapshot_every: u64,
) -> Result<Node, String> {
    start_with(router, id, dir, snapshot_every, true).await
}

async fn start_with(
    router: &super::network::Router,
    id: u64,
    dir: &std::path::Path,
    snapshot_every: u64,
    opaque: bool,
) -> Result<Node, String> {
    let db = super::node_db::open_node_db(dir).map_err(|e| e.to_string())?;
    let mut sm = super::store::StateMachine::open(&db).map_err(|e| e.to_string())?;
    if opaque {
        sm = sm.with_opaque_batches();
    }
    let log = super::store::LogStore::open(&db).map_err(|e| e.to_string())?;
    let raft = Raft::new(
        id,
        super::config::config(snapshot_every).map_err(|e| e.to_string())?,
        router.client_of(id),
        log,
        sm.clone(),
    )
    .await
    .map_err(|e| e.to_string())?;
    router.add(id, raft.clone());
    Ok(Node { raft, sm, id, db })
}
