//! The Raft log and the state machine of a node, in its store ([`Kv`]: sled in the data dir,
//! or a simulated disk).

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};

use super::node_db::NodeDb;
use super::types::{Applied, TypeConfig};
use crate::codec;
use crate::store::{Batch, Op};
use crate::store::{Change, Claim, Kv, KvSink, KvTree, LogSink, names};

type NodeId = u64;
type Node = openraft::BasicNode;
type Result<T> = std::result::Result<T, StorageError<NodeId>>;

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
    tree: &dyn KvTree,
    key: &[u8],
    read: fn(AnyError) -> StorageIOError<NodeId>,
) -> Result<Option<T>> {
    match tree.get(key).map_err(io(read))? {
        None => Ok(None),
        Some(v) => codec::decode(&v).map(Some).map_err(|e| decode_err(read, e)),
    }
}

fn put_in<T: Serialize>(
    tree: &dyn KvTree,
    key: &[u8],
    value: &T,
    write: fn(AnyError) -> StorageIOError<NodeId>,
) -> Result<()> {
    tree.insert(key, &codec::encode(value)).map_err(io(write))
}

/// The Raft log, vote and commit index (trees `raft_log`, `raft_meta`).
#[derive(Clone)]
pub struct LogStore {
    node: NodeDb,
    log: Arc<dyn KvTree>,
    meta: Arc<dyn KvTree>,
    /// A purge openraft asked for before a stored snapshot covered it: done at the next append
    /// that finds it covered ([`LogStore::purge_covered`]).
    deferred: Arc<std::sync::Mutex<Option<LogId<NodeId>>>>,
}

const VOTE: &[u8] = b"vote";

/// The last log index forming a group writes: the membership (0) and the first leader's blank
/// entry (1). Every batch of an engine's comes after.
const FORMED_INDEX: u64 = 1;
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"last_purged";

impl LogStore {
    /// The log store of `node`.
    pub fn open(node: &NodeDb) -> std::io::Result<LogStore> {
        Ok(LogStore {
            node: node.clone(),
            log: node.tree(&format!("{}log", names::RAFT_TREES_PREFIX))?,
            meta: node.tree(&format!("{}meta", names::RAFT_TREES_PREFIX))?,
            deferred: Arc::default(),
        })
    }

    fn get_meta<T: for<'de> Deserialize<'de>>(&self, key: &[u8]) -> Result<Option<T>> {
        get_in(self.meta.as_ref(), key, StorageIOError::read_logs)
    }

    /// Purges the entries up to `upto` if a stored snapshot covers them (its mark is written
    /// after it, on the same disk: a cut that keeps this purge keeps the snapshot) and they are
    /// not purged yet. Whether they are purged now.
    fn purge_covered(&self, upto: LogId<NodeId>) -> Result<bool> {
        if self.snapshot_at()?.is_none_or(|at| at.index < upto.index) {
            return Ok(false);
        }
        let purged: Option<LogId<NodeId>> = self.get_meta(PURGED)?;
        if purged.is_some_and(|p| p.index >= upto.index) {
            return Ok(true);
        }
        self.put_meta(PURGED, &upto)?;
        self.log
            .remove_upto(&upto.index.to_be_bytes())
            .map_err(io(StorageIOError::write_logs))?;
        Ok(true)
    }

    /// A deferred purge, if a stored snapshot covers it now.
    fn purge_deferred(&self) -> Result<()> {
        let due = *self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(upto) = due
            && self.purge_covered(upto)?
        {
            let mut deferred = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
            if *deferred == Some(upto) {
                *deferred = None;
            }
        }
        Ok(())
    }

    /// The last log id the state machine's stored snapshot covers (written so far).
    fn snapshot_at(&self) -> Result<Option<LogId<NodeId>>> {
        let sm = self
            .node
            .tree(&format!("{}sm", names::RAFT_TREES_PREFIX))
            .map_err(io(StorageIOError::read_logs))?;
        if let Some(at) =
            get_in::<Option<LogId<NodeId>>>(sm.as_ref(), SNAPSHOT_AT, StorageIOError::read_logs)?
        {
            return Ok(at);
        }
        // A snapshot stored before its mark was kept apart.
        let stored: Option<(SnapshotMeta<NodeId, Node>, Vec<u8>)> =
            get_in(sm.as_ref(), SNAPSHOT, StorageIOError::read_logs)?;
        Ok(stored.and_then(|(meta, _)| meta.last_log_id))
    }

    fn put_meta<T: Serialize>(&self, key: &[u8], value: &T) -> Result<()> {
        put_in(self.meta.as_ref(), key, value, StorageIOError::write_logs)
    }

    /// Checks the store at start ([`super::marks::check_log`]): `Err` names the damage.
    pub(super) fn check_marks(&self) -> std::result::Result<(), String> {
        let damaged = |e: StorageError<NodeId>| format!("reading the log: {e}");
        let purged: Option<LogId<NodeId>> = self.get_meta(PURGED).map_err(damaged)?;
        let covered = self.snapshot_at().map_err(damaged)?;
        let vote: Option<Vote<NodeId>> = self.get_meta(VOTE).map_err(damaged)?;
        let behind = [purged, covered]
            .into_iter()
            .flatten()
            .map(|l| l.index)
            .max();
        super::marks::check_log(self.log.as_ref(), behind, vote.as_ref(), &self.node.marks)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let from = start.to_be_bytes();
        let end = match range.end_bound() {
            Bound::Included(i) => Bound::Included(i.to_be_bytes()),
            Bound::Excluded(i) => Bound::Excluded(i.to_be_bytes()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let to = match &end {
            Bound::Included(k) => Bound::Included(&k[..]),
            Bound::Excluded(k) => Bound::Excluded(&k[..]),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for (k, v) in self
            .log
            .range(Bound::Included(&from[..]), to)
            .map_err(io(StorageIOError::read_logs))?
        {
            let index = u64::from_be_bytes(k.as_slice().try_into().unwrap_or([0xff; 8]));
            if !range.contains(&index) {
                break;
            }
            out.push(codec::decode(&v).map_err(|e| decode_err(StorageIOError::read_logs, e))?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>> {
        // A purge deferred before a power cut (or never asked again): entries the stored
        // snapshot covers go now, so the log holds no gap below what comes after the snapshot.
        if let Some(at) = self.snapshot_at()? {
            self.purge_covered(at)?;
        }
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
        if crate::bugs::on(crate::bugs::Bug::VoteBeforeDurable) {
            return Ok(());
        }
        // Marked before the vote leaves: a start that finds an older one knows it was lost.
        let vote = Some(*vote);
        self.node
            .sync_marked(move |h| h.vote = vote)
            .await
            .map_err(io(StorageIOError::write_vote))
    }

    /// The saved vote, never as committed: a node that led before its restart must win an
    /// election in a new term before it leads again. openraft 0.9 restores a node whose saved
    /// vote is its own and committed as the leader at once, in the same term, with no new
    /// entry of its own: its engine would open on a copy that has not yet applied what the
    /// group committed before the restart (entries of that term still to be applied), then
    /// write over those records; and after a coordinated power cut the log it resumes with may
    /// lack a tail its followers committed. A new term begins with a blank entry, committed
    /// and applied only after everything before it, which the engine waits for.
    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>> {
        // A log that holds no more than forming the group wrote has no batch of an engine's to
        // lose or write over: its leader resumes (the other nodes, new, vote only in the
        // group's first election, and could elect it no more).
        let formed_only = self
            .log
            .last()
            .map_err(io(StorageIOError::read_vote))?
            .is_none_or(|(k, _)| k.as_slice() <= FORMED_INDEX.to_be_bytes().as_slice());
        let resume = formed_only || crate::bugs::on(crate::bugs::Bug::LeaderResumesTerm);
        Ok(self.get_meta::<Vote<NodeId>>(VOTE)?.map(|v| Vote {
            committed: v.committed && resume,
            ..v
        }))
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
        self.purge_deferred()?;
        let changes: Vec<_> = entries
            .into_iter()
            .map(|e| {
                (
                    e.log_id.index.to_be_bytes().to_vec(),
                    Some(codec::encode(&e)),
                )
            })
            .collect();
        self.log
            .apply(&changes)
            .map_err(io(StorageIOError::write_logs))?;
        if crate::bugs::on(crate::bugs::Bug::ReplyBeforeSync) {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        // Durable before openraft may count this node in a majority, and marked so: a start
        // that finds a shorter log knows its store lost entries it may have acknowledged.
        let last: Option<[u8; 8]> = changes
            .last()
            .and_then(|(k, _)| k.as_slice().try_into().ok());
        let last = last.map(u64::from_be_bytes);
        let mark = move |h: &mut super::marks::Held| h.last_index = last.or(h.last_index);
        callback.log_io_completed(self.node.sync_marked(mark).await);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<()> {
        // The entries removed were never committed: the log may end before them now. Marked
        // first: a power cut between the two leaves a mark below the log, never above it.
        let below = log_id.index.checked_sub(1);
        (self.node.mark(move |h| h.last_index = below).await)
            .map_err(io(StorageIOError::write_logs))?;
        self.log
            .remove_from(&log_id.index.to_be_bytes())
            .map_err(io(StorageIOError::write_logs))?;
        self.node
            .sync()
            .await
            .map_err(io(StorageIOError::write_logs))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<()> {
        // openraft purges the entries a snapshot covers, and may ask before the state machine
        // has stored that snapshot (a follower's install runs on the state machine's task). A
        // power cut then would leave a log purged past its snapshot: the node could not start
        // again ("purge_upto > snapshot_last_log_id", or entries to re-apply missing). So the
        // entries go only once a stored snapshot covers them; until then the purge waits for
        // the next append (an install is stored before the entries after it come).
        if !self.purge_covered(log_id)? {
            tracing::debug!(
                upto = log_id.index,
                "purge deferred: no stored snapshot covers it yet"
            );
            let mut deferred = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
            if deferred.is_none_or(|d| d.index < log_id.index) {
                *deferred = Some(log_id);
            }
        }
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
pub struct StateMachine {
    node: NodeDb,
    sink: Arc<KvSink>,
    meta: Arc<dyn KvTree>,
    /// Held by `apply`, a snapshot's build and its install: openraft builds snapshots on a task
    /// of its own while it applies, and a snapshot must be one consistent state. It guards
    /// where the log stands: the last applied log id and membership, with how many entries
    /// were applied since they were last recorded.
    turn: Arc<tokio::sync::Mutex<Position>>,
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
const SNAPSHOT: &[u8] = b"snapshot";
/// The last log id the stored snapshot covers, written after (or with) the snapshot itself: the
/// log store reads it before it purges.
const SNAPSHOT_AT: &[u8] = b"snapshot_at";

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
                    super::observe::applied(&super::observe::Applied {
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
        let mut at = self.turn.lock().await;
        let content = self.content(&at)?;
        // A copy with damage (a bit flipped at rest) is never handed on: a follower that
        // installed it would be damaged too, and in time every node. The build fails, this
        // node's Raft stops, and it leaves its group until it is wiped and catches up.
        let check = self.check_snapshots;
        let (content, checked) = crate::rt::blocking(move || {
            let checked = if check {
                check_content(&content)
            } else {
                Ok(())
            };
            (content, checked)
        })
        .await
        .map_err(|e| sm_err(format!("checking the snapshot: {e}")))?;
        match checked {
            Ok(()) => {}
            Err(damage) => {
                tracing::error!(%damage, "this node's copy is damaged: no snapshot is built from it");
                return Err(sm_err(format!(
                    "this node's copy is damaged, so no snapshot is built from it: {damage}"
                )));
            }
        }
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
        self.put(SNAPSHOT_AT, &meta.last_log_id)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
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

    #[tokio::test]
    async fn a_start_makes_what_it_reads_durable_before_reading_it() {
        let disk = crate::store::SimKv::new();
        let vote = Vote::new(3, 2);
        {
            // The last run stopped inside the fsync of its vote: written, never synced.
            let node = NodeDb::new(Arc::new(disk.clone()));
            LogStore::open(&node)
                .unwrap()
                .put_meta(VOTE, &vote)
                .unwrap();
        }
        assert!(disk.unsynced_writes() > 0);
        // The next start reads that vote and acts on it ...
        let node = NodeDb::new(Arc::new(disk.clone()));
        let (_, mut log, _) = crate::raft::open_for_start(&node).await.unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        // ... so a power cut after it must not take it back.
        disk.crash(0);
        let node = NodeDb::new(Arc::new(disk.clone()));
        let mut log = LogStore::open(&node).unwrap();
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(vote),
            "a vote the start read was lost to a later power cut"
        );
    }
}
