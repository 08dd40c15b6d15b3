//! The state machine of a node: committed batches applied to its copy of the engine's log,
//! and the snapshots built from that copy and installed over it.

use std::io::Cursor;
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::{Node, NodeId, Result, decode_err, get_in, io, put_in};
use crate::codec;
use crate::raft::node_db::NodeDb;
use crate::raft::types::{Applied, TypeConfig};
use crate::store::{Batch, Op};
use crate::store::{Change, Claim, Kv, KvSink, KvTree, LogSink, names};

/// A tree's `(key, value)` pairs.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A snapshot's content: every tree of the node's log (streams, checkpoints, claims, the
/// simulated provider's record), with the last applied log id and membership.
#[derive(Serialize, Deserialize)]
struct SnapshotContent {
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, Node>,
    /// `(tree, [(key, value)])`.
    trees: Vec<(String, Pairs)>,
}

/// The node's copy of the engine's log: committed batches applied to its streams, checkpoints
/// and claims through the store seam ([`LogSink`], over the same sled database), exactly as
/// the single-node flusher writes them; the last applied log id and membership in tree
/// `raft_sm`.
#[derive(Clone)]
pub struct StateMachine {
    node: NodeDb,
    sink: Arc<KvSink>,
    meta: Arc<dyn KvTree>,
    /// Held by `apply`, a snapshot's build and its install: openraft builds snapshots on a task
    /// of its own while it applies, and a snapshot must be one consistent state. It guards
    /// where the log stands: the last applied log id and membership, with how many entries
    /// were applied since they were last recorded.
    turn: Arc<tokio::sync::Mutex<Position>>,
    /// Held while the stored snapshot is replaced: by an install (inside the turn) and by a
    /// build's store (outside it, so no apply waits on a big snapshot's write).
    stored: Arc<tokio::sync::Mutex<()>>,
    /// The state this node's engine would start from, kept warm by every batch applied here
    /// ([`crate::warm`]).
    warm: Arc<crate::warm::Warm>,
    /// Whether a snapshot's content is checked as an engine's log before it is built (off
    /// only for tests whose batches are not an engine's: [`StateMachine::with_opaque_batches`]).
    check_snapshots: bool,
}

/// Where a state machine stands. Recorded (`raft_sm`) only once what it counts is synced:
/// every [`RECORD_APPLIED_EVERY`] entries, at a snapshot's build and at its install. A crash
/// between leaves an older record, and openraft applies the entries after it again (an apply
/// is idempotent): the record never runs ahead of the log it describes.
#[derive(Clone, Default)]
struct Position {
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, Node>,
    since_recorded: u64,
}

/// Entries applied between two records of where the state machine stands.
const RECORD_APPLIED_EVERY: u64 = 256;

const LAST_APPLIED: &[u8] = b"last_applied";
const MEMBERSHIP: &[u8] = b"membership";
pub(super) const SNAPSHOT: &[u8] = b"snapshot";
/// The last log id the stored snapshot covers, written after (or with) the snapshot itself: the
/// log store reads it before it purges.
pub(super) const SNAPSHOT_AT: &[u8] = b"snapshot_at";

fn sm_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(AnyError::error(e.to_string())).into()
}

/// Checks a snapshot's trees as an engine start would check them (every record and
/// checkpoint read, the claims matched, the payment record decoded), in a store of their own:
/// `Err` names the first damage, or the first repair the copy would need.
fn check_content(content: &SnapshotContent) -> std::result::Result<(), String> {
    let kv: Arc<dyn Kv> = Arc::new(crate::store::SimKv::new());
    for (name, kvs) in &content.trees {
        let changes: Vec<_> = kvs
            .iter()
            .map(|(k, v)| (k.clone(), Some(v.clone())))
            .collect();
        kv.tree(name)
            .and_then(|t| t.apply(&changes))
            .map_err(|e| e.to_string())?;
    }
    let sink = KvSink::new(kv.clone()).map_err(|e| e.to_string())?;
    crate::recovery::replay_for_warmth(&sink, crate::limits::IDEMPOTENCY_WINDOW_MS_DEFAULT)
        .map_err(|e| e.to_string())?;
    crate::payment::SimulatedProvider::open(kv, Default::default())
        .map_err(|e| e.to_string())?
        .check_record()
}

impl StateMachine {
    /// The state machine of `node`.
    pub fn open(node: &NodeDb) -> std::io::Result<StateMachine> {
        let meta = node.tree(&format!("{}sm", names::RAFT_TREES_PREFIX))?;
        Ok(StateMachine {
            node: node.clone(),
            sink: Arc::new(
                node.sink()
                    .map_err(|e| std::io::Error::other(e.to_string()))?,
            ),
            meta: meta.clone(),
            turn: Arc::new(tokio::sync::Mutex::new(Position {
                last_applied: get_in(
                    meta.as_ref(),
                    LAST_APPLIED,
                    StorageIOError::read_state_machine,
                )
                .map_err(|e| std::io::Error::other(e.to_string()))?,
                membership: get_in(
                    meta.as_ref(),
                    MEMBERSHIP,
                    StorageIOError::read_state_machine,
                )
                .map_err(|e| std::io::Error::other(e.to_string()))?
                .unwrap_or_default(),
                since_recorded: 0,
            })),
            stored: Arc::default(),
            warm: Arc::new(crate::warm::Warm::new()),
            check_snapshots: true,
        })
    }

    /// This state machine for a test whose batches are not an engine's (records of no event,
    /// gaps where a write failed): its snapshots are built without checking them as an
    /// engine's log.
    #[cfg(any(test, feature = "test-support"))]
    pub fn with_opaque_batches(mut self) -> StateMachine {
        self.check_snapshots = false;
        self
    }

    /// The warm state this state machine feeds ([`crate::warm`]); an engine started with it
    /// ([`crate::EngineConfig::warm`]) takes it.
    pub fn warm(&self) -> Arc<crate::warm::Warm> {
        self.warm.clone()
    }

    /// Warms this node up (unless it is warm, or warming): replays its copy of the log into the
    /// engine's pure cores, as a start would (`window_ms`: the engine's idempotency window),
    /// while no batch is applied, and keeps the result warm from then on. `false`: not warmed
    /// (already warm, the copy needs repairs, or the node started leading meanwhile).
    pub async fn warm_up(&self, window_ms: u64) -> bool {
        let Some(generation) = self.warm.begin() else {
            return false;
        };
        let at = self.turn.lock().await;
        let sink = self.sink.clone();
        let replayed = crate::rt::blocking(move || {
            crate::recovery::replay_for_warmth(sink.as_ref(), window_ms)
        })
        .await;
        let replayed = match replayed {
            Ok(Ok(r)) => Some(r),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "not warmed up: the next start reads the log");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "warming up failed");
                None
            }
        };
        let warmed = self.warm.install(generation, replayed, window_ms);
        drop(at);
        if warmed {
            tracing::info!("warm: this node keeps the state its engine would start from");
        }
        warmed
    }

    /// The log this node applies committed batches to (the engine recovers from it when this
    /// node leads).
    pub fn sink(&self) -> Arc<KvSink> {
        self.sink.clone()
    }

    /// The store the batches are applied to: a table outside the streams ([`Op::Put`]'s, such
    /// as [`names::TICKET_RING`]) is read here.
    pub fn store(&self) -> Arc<dyn Kv> {
        self.node.kv.clone()
    }

    fn get<T: for<'de> Deserialize<'de>>(&self, key: &[u8]) -> Result<Option<T>> {
        get_in(self.meta.as_ref(), key, StorageIOError::read_state_machine)
    }

    fn put<T: Serialize>(&self, key: &[u8], value: &T) -> Result<()> {
        put_in(
            self.meta.as_ref(),
            key,
            value,
            StorageIOError::write_state_machine,
        )
    }

    /// The names of the log's trees: every tree but Raft's own.
    fn log_trees(&self) -> Result<Vec<String>> {
        Ok(self
            .node
            .kv
            .tree_names()
            .map_err(sm_err)?
            .into_iter()
            .filter(|n| !n.starts_with(names::RAFT_TREES_PREFIX))
            .collect())
    }

    /// Records where the state machine stands, once what it counts is on disk.
    async fn record(&self, at: &mut Position) -> Result<()> {
        self.node
            .sync()
            .await
            .map_err(io(StorageIOError::write_state_machine))?;
        // One write: a crash must not keep the new mark without the membership it goes with
        // (a node that then reads no membership, and no log entry that names one, is a learner
        // for good: a group of one never leads again).
        let mut marks = vec![(MEMBERSHIP.to_vec(), Some(codec::encode(&at.membership)))];
        if let Some(last) = &at.last_applied {
            marks.push((LAST_APPLIED.to_vec(), Some(codec::encode(last))));
        }
        self.meta
            .apply(&marks)
            .map_err(io(StorageIOError::write_state_machine))?;
        at.since_recorded = 0;
        Ok(())
    }

    fn content(&self, at: &Position) -> Result<SnapshotContent> {
        let mut trees = Vec::new();
        for name in self.log_trees()? {
            let kvs = self
                .node
                .kv
                .tree(&name)
                .and_then(|t| t.pairs())
                .map_err(io(StorageIOError::read_state_machine))?;
            trees.push((name, kvs));
        }
        Ok(SnapshotContent {
            last_applied: at.last_applied,
            membership: at.membership.clone(),
            trees,
        })
    }

    /// Applies one batch to the log, as the single-node flusher writes one: claims before each
    /// stream's records (a refused claim skips them), checkpoints beside. Returns the first
    /// refused claim and the compactions its checkpoints allow.
    fn apply_batch(
        &self,
        index: u64,
        batch: &Batch,
        compactions: &mut Vec<(String, u64)>,
    ) -> std::result::Result<Option<String>, crate::error::StorageError> {
        let mut refused = None;
        for (at, op) in batch.ops.iter().enumerate() {
            match op {
                Op::Append {
                    stream,
                    entries,
                    claims,
                } => {
                    if refused.is_some() && stream == names::CHANGES {
                        // The change stream tells what the batch's records did: one of them
                        // was refused (every node alike), so it tells nothing.
                        continue;
                    }
                    // All of the op's claims or none: a refused one gives back those this op
                    // took, so no node keeps a claim without its sale.
                    let mut took = Vec::new();
                    let mut taken = true;
                    for (key, holder) in claims {
                        match self.sink.claim(key, holder)? {
                            Claim::Taken => took.push(key),
                            Claim::Already => {}
                            Claim::Refused(_) => {
                                refused.get_or_insert_with(|| key.clone());
                                taken = false;
                                break;
                            }
                        }
                    }
                    if !taken {
                        for key in took {
                            self.sink.unclaim(key)?;
                        }
                        continue;
                    }
                    self.sink.stream(stream)?.append_batch(entries)?;
                    self.warm.append(stream, entries);
                    crate::raft::observe::applied(&crate::raft::observe::Applied {
                        index,
                        op: at,
                        stream,
                        entries,
                    });
                }
                Op::Put { table, key, value } => {
                    self.node.kv.tree(table)?.insert(key, value)?;
                }
                Op::Checkpoint { stream, upto, blob } => {
                    self.sink
                        .put_checkpoint(stream, &crate::store::checkpoint_value(*upto, blob))?;
                    self.warm.checkpoint(stream, *upto, blob);
                    compactions.push((stream.clone(), *upto));
                }
            }
        }
        Ok(refused)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>> {
        // Only the read of one consistent state and its record hold the turn: every apply (so
        // every commit's answer) waits while it is held. The check, the encoding and the store
        // run after, while the log goes on.
        let content = {
            let mut at = self.turn.lock().await;
            let content = self.content(&at)?;
            // The log up to this snapshot may be purged once it is built: what it holds must
            // be on disk first (applies are not synced one by one), and recorded as applied.
            self.record(&mut at).await?;
            content
        };
        // A copy with damage (a bit flipped at rest) is never handed on: a follower that
        // installed it would be damaged too, and in time every node. The build fails, this
        // node's Raft stops, and it leaves its group until it is wiped and catches up.
        let check = self.check_snapshots;
        let (content, encoded) = crate::rt::blocking(move || {
            let checked = if check {
                check_content(&content)
            } else {
                Ok(())
            };
            let encoded = checked.map(|()| codec::encode(&content));
            (content, encoded)
        })
        .await
        .map_err(|e| sm_err(format!("checking the snapshot: {e}")))?;
        let bytes = match encoded {
            Ok(bytes) => bytes,
            Err(damage) => {
                tracing::error!(%damage, "this node's copy is damaged: no snapshot is built from it");
                return Err(sm_err(format!(
                    "this node's copy is damaged, so no snapshot is built from it: {damage}"
                )));
            }
        };
        let meta = SnapshotMeta {
            last_log_id: content.last_applied,
            last_membership: content.membership.clone(),
            snapshot_id: format!("{}", content.last_applied.map_or(0, |l| l.index)),
        };
        let (_, bytes) = self.keep_snapshot(&meta, bytes).await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl StateMachine {
    /// Stores a snapshot this node built, unless one stored meanwhile (a leader's, installed
    /// while this one was checked and encoded) covers more of the log: the stored snapshot
    /// never goes back. `false`: not stored.
    async fn keep_snapshot(
        &self,
        meta: &SnapshotMeta<NodeId, Node>,
        bytes: Vec<u8>,
    ) -> Result<(bool, Vec<u8>)> {
        let _stored = self.stored.lock().await;
        let at: Option<Option<LogId<NodeId>>> = self.get(SNAPSHOT_AT)?;
        if at.is_some_and(|at| at >= meta.last_log_id) {
            return Ok((false, bytes));
        }
        // Tens of megabytes to encode and write: off the runtime's workers.
        let (this, meta) = (self.clone(), meta.clone());
        let (stored, bytes) = crate::rt::blocking(move || {
            let stored = this
                .put(SNAPSHOT, &(&meta, &bytes))
                .and_then(|()| this.put(SNAPSHOT_AT, &meta.last_log_id));
            (stored, bytes)
        })
        .await
        .map_err(|e| sm_err(format!("storing the snapshot: {e}")))?;
        stored?;
        Ok((true, bytes))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, Node>)> {
        let at = self.turn.lock().await;
        Ok((at.last_applied, at.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut at = self.turn.lock().await;
        let mut answers = Vec::new();
        let mut compactions = Vec::new();
        for e in entries {
            let mut refused = None;
            let mut stale = false;
            match &e.payload {
                EntryPayload::Blank => {}
                // Records are keyed by seq and claims by key: applying the same entry again
                // (after a restart) writes the same keys, so an apply is idempotent.
                // Written by an engine of an earlier leadership: skipped on every node alike.
                EntryPayload::Normal(batch)
                    if batch.term != 0 && batch.term != e.log_id.leader_id.term =>
                {
                    stale = true;
                }
                EntryPayload::Normal(batch) => {
                    refused = self
                        .apply_batch(e.log_id.index, batch, &mut compactions)
                        .map_err(sm_err)?;
                }
                EntryPayload::Membership(m) => {
                    at.membership = StoredMembership::new(Some(e.log_id), m.clone());
                }
            }
            at.last_applied = Some(e.log_id);
            at.since_recorded += 1;
            answers.push(Applied {
                index: e.log_id.index,
                refused,
                stale,
            });
        }
        if !compactions.is_empty() || at.since_recorded >= RECORD_APPLIED_EVERY {
            // Records go only once the checkpoint covering them is on disk.
            self.record(&mut at).await?;
            for (stream, upto) in compactions {
                let removed = self.sink.stream(&stream).and_then(|s| s.remove_upto(upto));
                if let Err(e) = removed {
                    // Harmless: recovery skips records a checkpoint covers.
                    tracing::warn!(stream, error = %e, "compaction failed");
                }
            }
        }
        Ok(answers)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<()> {
        let bytes = snapshot.into_inner();
        let content: SnapshotContent = codec::decode(&bytes)
            .map_err(|e| decode_err(StorageIOError::write_state_machine, e))?;
        let mut at = self.turn.lock().await;
        let _stored = self.stored.lock().await;
        self.warm
            .drop_state("a snapshot from the leader replaced this node's copy");
        let mut changes = self.replaced_by(&content)?;
        let sm = format!("{}sm", names::RAFT_TREES_PREFIX);
        let mut put = |key: &[u8], value: Vec<u8>| {
            changes.push(Change {
                tree: sm.clone(),
                key: key.to_vec(),
                value: Some(value),
            });
        };
        if let Some(last) = meta.last_log_id {
            put(LAST_APPLIED, codec::encode(&last));
        }
        put(MEMBERSHIP, codec::encode(&meta.last_membership));
        put(SNAPSHOT, codec::encode(&(meta.clone(), bytes)));
        put(SNAPSHOT_AT, codec::encode(&meta.last_log_id));
        // One transaction over every tree: a crash leaves the old state or the new one, never
        // an emptied log under the old last-applied mark.
        if crate::bugs::on(crate::bugs::Bug::SnapshotNonAtomic) {
            // Tree by tree, the state machine's marks first: a crash in between leaves the new
            // marks over part of the old copy.
            let marks = changes.iter().rev().take_while(|c| c.tree == sm).count();
            changes.rotate_right(marks);
            for c in &changes {
                self.node
                    .kv
                    .tree(&c.tree)
                    .and_then(|t| t.apply(&[(c.key.clone(), c.value.clone())]))
                    .map_err(|e| sm_err(format!("installing a snapshot: {e}")))?;
            }
        } else {
            self.node
                .kv
                .transaction(&changes)
                .map_err(|e| sm_err(format!("installing a snapshot: {e}")))?;
        }
        self.node
            .sync()
            .await
            .map_err(io(StorageIOError::write_state_machine))?;
        *at = Position {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            since_recorded: 0,
        };
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>> {
        let stored: Option<(SnapshotMeta<NodeId, Node>, Vec<u8>)> = self.get(SNAPSHOT)?;
        Ok(stored.map(|(meta, bytes)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        }))
    }
}

impl StateMachine {
    /// The changes that make every tree the log has now, or `content` brings, hold exactly
    /// what `content` holds (Raft's state machine tree aside).
    fn replaced_by(&self, content: &SnapshotContent) -> Result<Vec<Change>> {
        // Every tree the log has now or the snapshot brings, then Raft's state machine tree.
        let mut trees = self.log_trees()?;
        for (name, _) in &content.trees {
            if !trees.contains(name) {
                trees.push(name.clone());
            }
        }
        let mut changes = Vec::new();
        for name in &trees {
            let old = self
                .node
                .kv
                .tree(name)
                .and_then(|t| t.pairs())
                .map_err(io(StorageIOError::write_state_machine))?;
            for (key, _) in old {
                changes.push(Change {
                    tree: name.clone(),
                    key,
                    value: None,
                });
            }
            if let Some((_, kvs)) = content.trees.iter().find(|(n, _)| n == name) {
                for (key, value) in kvs {
                    changes.push(Change {
                        tree: name.clone(),
                        key: key.clone(),
                        value: Some(value.clone()),
                    });
                }
            }
        }
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot this node built is stored only if none stored meanwhile covers more of the
    /// log (its check and encoding run while applies and installs go on).
    #[tokio::test]
    async fn a_snapshot_built_before_an_install_never_replaces_it() {
        let disk = crate::store::SimKv::new();
        let node = NodeDb::new(Arc::new(disk));
        let mut sm = StateMachine::open(&node).unwrap();
        let at = |index| Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index));
        let meta = |index| SnapshotMeta {
            last_log_id: at(index),
            last_membership: StoredMembership::default(),
            snapshot_id: format!("{index}"),
        };
        let content = SnapshotContent {
            last_applied: at(20),
            membership: StoredMembership::default(),
            trees: Vec::new(),
        };
        sm.install_snapshot(&meta(20), Box::new(Cursor::new(codec::encode(&content))))
            .await
            .unwrap();
        let stored = |sm: &mut StateMachine| {
            let mut sm = sm.clone();
            async move {
                let s = sm.get_current_snapshot().await.unwrap().unwrap();
                (s.meta.last_log_id, s.snapshot.into_inner())
            }
        };
        let installed = stored(&mut sm).await;
        assert_eq!(installed.0, at(20));
        // Built at 10, before the leader's snapshot at 20 was installed: not stored.
        assert!(
            !sm.keep_snapshot(&meta(10), b"older".to_vec())
                .await
                .unwrap()
                .0
        );
        assert_eq!(stored(&mut sm).await, installed);
        assert!(
            !sm.keep_snapshot(&meta(20), b"same".to_vec())
                .await
                .unwrap()
                .0
        );
        assert_eq!(stored(&mut sm).await, installed);
        // A newer one is.
        assert!(
            sm.keep_snapshot(&meta(30), b"newer".to_vec())
                .await
                .unwrap()
                .0
        );
        assert_eq!(stored(&mut sm).await, (at(30), b"newer".to_vec()));
    }
}
