//! The Raft log and the state machine of a node, in its sled database.

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};
use sled::Transactional;

use super::{Applied, Batch, Op, TypeConfig};
use crate::codec;
use crate::store::{Claim, LogSink, SledSink, names};

type NodeId = u64;
type Node = openraft::BasicNode;
type Result<T> = std::result::Result<T, StorageError<NodeId>>;

/// A node's sled database and its data file (to `fdatasync`), shared by its log store and
/// state machine.
#[derive(Clone)]
pub struct NodeDb {
    pub(super) db: sled::Db,
    data_file: Arc<std::fs::File>,
    dir: std::path::PathBuf,
    blobs: Arc<crate::store::BlobSync>,
}

impl NodeDb {
    /// The engine's log in this database ([`SledSink::over`]): what the state machine applies
    /// committed batches to, and what the engine recovers from when this node leads.
    pub fn sink(&self) -> std::result::Result<SledSink, crate::error::StorageError> {
        SledSink::over(self.db.clone(), &self.dir)
    }

    /// The node's data dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes everything written so far durable: sled's flush, then `fdatasync` of its data file
    /// (as the engine's own sink does; see the integrity notes on sled's flush). Runs on the
    /// blocking pool, so a slow disk does not stall the async workers (and with them the
    /// heartbeats that keep a leader).
    async fn sync(&self) -> std::io::Result<()> {
        let node = self.clone();
        tokio::task::spawn_blocking(move || {
            node.db.flush()?;
            node.data_file.sync_data()?;
            node.blobs.sync(&node.dir)
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

/// Opens (or creates) a node's sled database in `dir`. A node restarted in the same process
/// may find the lock of its previous instance still held for a moment (its tasks let go of the
/// database as they end): the open is retried for up to 10 s.
pub fn open_node_db(dir: &Path) -> std::io::Result<NodeDb> {
    open_node_db_cached(dir, crate::store::SLED_CACHE_BYTES)
}

/// [`open_node_db`] with a sled page cache of `cache_bytes` (one group of several shares the
/// node's budget).
pub fn open_node_db_cached(dir: &Path, cache_bytes: u64) -> std::io::Result<NodeDb> {
    let mut tries = 0;
    std::fs::create_dir_all(dir)?;
    let db = loop {
        match crate::store::open_db_cached(dir, cache_bytes) {
            Ok(db) => break db,
            Err(crate::error::StorageError::Open { reason, .. })
                if reason.contains("could not acquire lock") && tries < 200 =>
            {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(std::io::Error::other(e.to_string())),
        }
    };
    let data_file = std::fs::File::open(dir.join("db"))?;
    Ok(NodeDb {
        db,
        data_file: Arc::new(data_file),
        dir: dir.to_owned(),
        blobs: Arc::default(),
    })
}

fn io<E: std::error::Error + 'static>(
    make: fn(AnyError) -> StorageIOError<NodeId>,
) -> impl Fn(E) -> StorageError<NodeId> {
    move |e| make(AnyError::new(&e)).into()
}

fn decode_err(
    make: fn(AnyError) -> StorageIOError<NodeId>,
    e: codec::DecodeError,
) -> StorageError<NodeId> {
    make(AnyError::error(e.to_string())).into()
}

/// A tree of small serialized values by key, whose errors read as `read`/`write` say.
fn get_in<T: for<'de> Deserialize<'de>>(
    tree: &sled::Tree,
    key: &[u8],
    read: fn(AnyError) -> StorageIOError<NodeId>,
) -> Result<Option<T>> {
    match tree.get(key).map_err(io(read))? {
        None => Ok(None),
        Some(v) => codec::decode(&v).map(Some).map_err(|e| decode_err(read, e)),
    }
}

fn put_in<T: Serialize>(
    tree: &sled::Tree,
    key: &[u8],
    value: &T,
    write: fn(AnyError) -> StorageIOError<NodeId>,
) -> Result<()> {
    tree.insert(key, codec::encode(value)).map_err(io(write))?;
    Ok(())
}

/// The Raft log, vote and commit index (trees `raft_log`, `raft_meta`).
#[derive(Clone)]
pub struct SledLogStore {
    node: NodeDb,
    log: sled::Tree,
    meta: sled::Tree,
}

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"last_purged";

impl SledLogStore {
    /// The log store of `node`.
    pub fn open(node: &NodeDb) -> std::io::Result<SledLogStore> {
        let open = |name: &str| node.db.open_tree(name).map_err(std::io::Error::other);
        Ok(SledLogStore {
            node: node.clone(),
            log: open(&format!("{}log", names::RAFT_TREES_PREFIX))?,
            meta: open(&format!("{}meta", names::RAFT_TREES_PREFIX))?,
        })
    }

    fn get_meta<T: for<'de> Deserialize<'de>>(&self, key: &[u8]) -> Result<Option<T>> {
        get_in(&self.meta, key, StorageIOError::read_logs)
    }

    fn put_meta<T: Serialize>(&self, key: &[u8], value: &T) -> Result<()> {
        put_in(&self.meta, key, value, StorageIOError::write_logs)
    }
}

impl RaftLogReader<TypeConfig> for SledLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let mut out = Vec::new();
        for kv in self.log.range(start.to_be_bytes()..) {
            let (k, v) = kv.map_err(io(StorageIOError::read_logs))?;
            let index = u64::from_be_bytes(k.as_ref().try_into().unwrap_or([0xff; 8]));
            if !range.contains(&index) {
                break;
            }
            out.push(codec::decode(&v).map_err(|e| decode_err(StorageIOError::read_logs, e))?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for SledLogStore {
    type LogReader = SledLogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>> {
        let last_purged: Option<LogId<NodeId>> = self.get_meta(PURGED)?;
        let last = match self.log.last().map_err(io(StorageIOError::read_logs))? {
            Some((_, v)) => {
                let e: Entry<TypeConfig> =
                    codec::decode(&v).map_err(|e| decode_err(StorageIOError::read_logs, e))?;
                Some(e.log_id)
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<()> {
        self.put_meta(VOTE, vote)?;
        self.node
            .sync()
            .await
            .map_err(io(StorageIOError::write_vote))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>> {
        self.get_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<()> {
        // Not synced: a lost commit index is found again from the log and the leader.
        self.put_meta(COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>> {
        Ok(self.get_meta::<Option<LogId<NodeId>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for e in entries {
            batch.insert(&e.log_id.index.to_be_bytes(), codec::encode(&e));
        }
        self.log
            .apply_batch(batch)
            .map_err(io(StorageIOError::write_logs))?;
        // Durable before openraft may count this node in a majority.
        let synced = self.node.sync().await;
        callback.log_io_completed(synced);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<()> {
        let mut batch = sled::Batch::default();
        for kv in self.log.range(log_id.index.to_be_bytes()..) {
            let (k, _) = kv.map_err(io(StorageIOError::write_logs))?;
            batch.remove(k);
        }
        self.log
            .apply_batch(batch)
            .map_err(io(StorageIOError::write_logs))?;
        self.node
            .sync()
            .await
            .map_err(io(StorageIOError::write_logs))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<()> {
        self.put_meta(PURGED, &log_id)?;
        let mut batch = sled::Batch::default();
        for kv in self.log.range(..=log_id.index.to_be_bytes()) {
            let (k, _) = kv.map_err(io(StorageIOError::write_logs))?;
            batch.remove(k);
        }
        self.log
            .apply_batch(batch)
            .map_err(io(StorageIOError::write_logs))?;
        Ok(())
    }
}

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
pub struct SledStateMachine {
    node: NodeDb,
    sink: Arc<SledSink>,
    meta: sled::Tree,
    /// Held by `apply`, a snapshot's build and its install: openraft builds snapshots on a task
    /// of its own while it applies, and a snapshot must be one consistent state. It guards
    /// where the log stands: the last applied log id and membership, with how many entries
    /// were applied since they were last recorded.
    turn: Arc<tokio::sync::Mutex<Position>>,
    /// The state this node's engine would start from, kept warm by every batch applied here
    /// ([`crate::warm`]).
    warm: Arc<crate::warm::Warm>,
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
const SNAPSHOT: &[u8] = b"snapshot";
/// sled's own tree, which the log does not use.
const SLED_DEFAULT_TREE: &[u8] = b"__sled__default";

fn sm_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(AnyError::error(e.to_string())).into()
}

impl SledStateMachine {
    /// The state machine of `node`.
    pub fn open(node: &NodeDb) -> std::io::Result<SledStateMachine> {
        let meta = node
            .db
            .open_tree(format!("{}sm", names::RAFT_TREES_PREFIX))
            .map_err(std::io::Error::other)?;
        Ok(SledStateMachine {
            node: node.clone(),
            sink: Arc::new(
                node.sink()
                    .map_err(|e| std::io::Error::other(e.to_string()))?,
            ),
            meta: meta.clone(),
            turn: Arc::new(tokio::sync::Mutex::new(Position {
                last_applied: get_in(&meta, LAST_APPLIED, StorageIOError::read_state_machine)
                    .map_err(|e| std::io::Error::other(e.to_string()))?,
                membership: get_in(&meta, MEMBERSHIP, StorageIOError::read_state_machine)
                    .map_err(|e| std::io::Error::other(e.to_string()))?
                    .unwrap_or_default(),
                since_recorded: 0,
            })),
            warm: Arc::new(crate::warm::Warm::new()),
        })
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
        let replayed = tokio::task::spawn_blocking(move || {
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
    pub fn sink(&self) -> Arc<SledSink> {
        self.sink.clone()
    }

    fn get<T: for<'de> Deserialize<'de>>(&self, key: &[u8]) -> Result<Option<T>> {
        get_in(&self.meta, key, StorageIOError::read_state_machine)
    }

    fn put<T: Serialize>(&self, key: &[u8], value: &T) -> Result<()> {
        put_in(&self.meta, key, value, StorageIOError::write_state_machine)
    }

    /// The names of the log's trees: every tree but Raft's own and sled's default.
    fn log_trees(&self) -> Vec<Vec<u8>> {
        self.node
            .db
            .tree_names()
            .into_iter()
            .filter(|n| {
                n.as_ref() != SLED_DEFAULT_TREE
                    && !n.starts_with(names::RAFT_TREES_PREFIX.as_bytes())
            })
            .map(|n| n.to_vec())
            .collect()
    }

    /// Records where the state machine stands, once what it counts is on disk.
    async fn record(&self, at: &mut Position) -> Result<()> {
        self.node
            .sync()
            .await
            .map_err(io(StorageIOError::write_state_machine))?;
        if let Some(last) = &at.last_applied {
            self.put(LAST_APPLIED, last)?;
        }
        self.put(MEMBERSHIP, &at.membership)?;
        at.since_recorded = 0;
        Ok(())
    }

    fn content(&self, at: &Position) -> Result<SnapshotContent> {
        let mut trees = Vec::new();
        for name in self.log_trees() {
            let tree = self.node.db.open_tree(&name).map_err(sm_err)?;
            let kvs = tree
                .iter()
                .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(io(StorageIOError::read_state_machine))?;
            trees.push((String::from_utf8_lossy(&name).into_owned(), kvs));
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
        batch: &Batch,
        compactions: &mut Vec<(String, u64)>,
    ) -> std::result::Result<Option<String>, crate::error::StorageError> {
        let mut refused = None;
        for op in &batch.ops {
            match op {
                Op::Append {
                    stream,
                    entries,
                    claims,
                } => {
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
                    let s = self.sink.stream(stream)?;
                    for (seq, bytes) in entries {
                        s.append(*seq, bytes)?;
                    }
                    self.warm.append(stream, entries);
                }
                Op::Put { table, key, value } => {
                    self.node
                        .db
                        .open_tree(table)
                        .and_then(|t| t.insert(key.as_slice(), value.as_slice()))
                        .map_err(|e| crate::error::StorageError::Io(e.to_string()))?;
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

impl RaftSnapshotBuilder<TypeConfig> for SledStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>> {
        let mut at = self.turn.lock().await;
        let content = self.content(&at)?;
        // The log up to this snapshot may be purged once it is built: what it holds must be on
        // disk first (applies are not synced one by one), and recorded as applied.
        self.record(&mut at).await?;
        let meta = SnapshotMeta {
            last_log_id: content.last_applied,
            last_membership: content.membership.clone(),
            snapshot_id: format!("{}", content.last_applied.map_or(0, |l| l.index)),
        };
        let bytes = codec::encode(&content);
        self.put(SNAPSHOT, &(meta.clone(), bytes.clone()))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for SledStateMachine {
    type SnapshotBuilder = SledStateMachine;

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
                    refused = self.apply_batch(batch, &mut compactions).map_err(sm_err)?;
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
        self.warm
            .drop_state("a snapshot from the leader replaced this node's copy");
        // Every tree the log has now or the snapshot brings, then Raft's state machine tree.
        let mut names: Vec<Vec<u8>> = self.log_trees();
        for (name, _) in &content.trees {
            if !names.iter().any(|n| n == name.as_bytes()) {
                names.push(name.as_bytes().to_vec());
            }
        }
        let mut trees = Vec::new();
        let mut old = Vec::new();
        let mut new: Vec<&[(Vec<u8>, Vec<u8>)]> = Vec::new();
        for name in &names {
            let tree = self.node.db.open_tree(name).map_err(sm_err)?;
            old.push(
                tree.iter()
                    .keys()
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(io(StorageIOError::write_state_machine))?,
            );
            trees.push(tree);
            new.push(
                content
                    .trees
                    .iter()
                    .find(|(n, _)| n.as_bytes() == name.as_slice())
                    .map_or(&[][..], |(_, kvs)| kvs.as_slice()),
            );
        }
        trees.push(self.meta.clone());
        let last = meta.last_log_id.map(|l| codec::encode(&l));
        let membership = codec::encode(&meta.last_membership);
        let stored = codec::encode(&(meta.clone(), bytes));
        // One transaction over every tree: a crash leaves the old state or the new one, never
        // an emptied log under the old last-applied mark.
        trees
            .as_slice()
            .transaction(|views| {
                let (sm, log) = views.split_last().expect("the meta tree is last");
                for ((view, old), new) in log.iter().zip(&old).zip(&new) {
                    for k in old {
                        view.remove(k)?;
                    }
                    for (k, v) in *new {
                        view.insert(k.as_slice(), v.as_slice())?;
                    }
                }
                if let Some(last) = &last {
                    sm.insert(LAST_APPLIED, last.as_slice())?;
                }
                sm.insert(MEMBERSHIP, membership.as_slice())?;
                sm.insert(SNAPSHOT, stored.as_slice())?;
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|e| sm_err(format!("installing a snapshot: {e:?}")))?;
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
