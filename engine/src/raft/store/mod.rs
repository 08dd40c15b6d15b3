//! The Raft log of a node, and its state machine ([`state_machine`]), in its store
//! ([`Kv`](crate::store::Kv): sled in the data dir, or a simulated disk).

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, OptionalSend, RaftLogReader, SnapshotMeta, StorageError,
    StorageIOError, Vote,
};
use serde::{Deserialize, Serialize};

mod state_machine;

pub use state_machine::StateMachine;
use state_machine::{SNAPSHOT, SNAPSHOT_AT};

use super::node_db::NodeDb;
use super::types::TypeConfig;
use crate::codec;
use crate::store::{KvTree, names};

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

/// Keys removed in one write by a purge off openraft's core (each write holds the lock of
/// every sled tree of the process for its length).
const PURGE_STEP: usize = 256;

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
        let key = upto.index.to_be_bytes();
        let last = self.log.last().map_err(io(StorageIOError::write_logs))?;
        if last.is_none_or(|(k, _)| k.as_slice() <= key.as_slice()) {
            // Nothing after the purge (a follower that installed a snapshot past its log): the
            // entries go now, before anything is appended after them. A crash that kept a later
            // append without this removal would leave a log with a gap, which a start refuses.
            self.log
                .remove_upto(&key)
                .map_err(io(StorageIOError::write_logs))?;
            return Ok(true);
        }
        // Entries follow the purge: they go off openraft's core, which appends and commits
        // nothing while a purge runs (10,000 entries took 60 to 310 ms), in small writes, each
        // holding sled's lock briefly. Removed in order, what a crash leaves is still one run
        // of entries from below the mark on; no entry at or below a purge is read again, and
        // the next purge removes what is left.
        let log = self.log.clone();
        crate::rt::detach("purging the Raft log", move || {
            if let Err(e) = log.remove_upto_in_steps(&key, PURGE_STEP) {
                tracing::warn!(upto = upto.index, error = %e, "purging the Raft log failed: the next purge removes what is left");
            }
        });
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

    /// Checks the store at start ([`super::marks::check_log`]): `Err` names the damage;
    /// `Ok(Some(i))`: from index `i` on, the log holds a tail torn by a crash before its sync,
    /// never acknowledged, to cut ([`LogStore::cut_torn_tail`]).
    pub(super) fn check_marks(&self) -> std::result::Result<Option<u64>, String> {
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

    /// Removes the log's entries from index `from` on (a torn tail found at start: what is left
    /// ends at `from - 1`, without a gap). Durable once the caller syncs. Returns how many
    /// entries went.
    pub(super) fn cut_torn_tail(&self, from: u64) -> std::io::Result<usize> {
        self.log
            .remove_from(&from.to_be_bytes())
            .map_err(std::io::Error::other)
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
        // One write per entry, lowest index first, not one batch of them: sled rolls its IO
        // buffer before and after a batch (two more writes to disk, each waking every thread of
        // its IO pool). Nothing here needs the batch's all-or-none, which did not hold after a
        // power cut anyway: none of these entries is acknowledged before the sync below. After
        // a process crash sled recovers a prefix of its writes (a log that ends sooner); after
        // a power cut it may keep a later entry and lose an earlier one (a value of its own
        // under `blobs/` whose file was not synced yet), a tail above the marks that the next
        // start cuts (`marks::check_log`).
        let mut last = None;
        for e in entries {
            let index = e.log_id.index;
            self.log
                .insert(&index.to_be_bytes(), &codec::encode(&e))
                .map_err(io(StorageIOError::write_logs))?;
            last = Some(index);
        }
        if crate::bugs::on(crate::bugs::Bug::ReplyBeforeSync) {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        // Durable before openraft may count this node in a majority, and marked so: a start
        // that finds a shorter log knows its store lost entries it may have acknowledged.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The indexes of the entries in `store`'s log, in order.
    fn log_indexes(store: &LogStore) -> Vec<u64> {
        store
            .log
            .pairs()
            .unwrap()
            .iter()
            .map(|(k, _)| u64::from_be_bytes(k.as_slice().try_into().unwrap()))
            .collect()
    }

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

    /// A start cuts a tail torn by a crash before its sync (a gap above the last index marked:
    /// sled may keep a later write and lose an earlier one, a value of its own under `blobs/`),
    /// and refuses the same gap at or below the mark (entries it may have acknowledged).
    #[tokio::test]
    async fn a_start_cuts_a_torn_tail_above_the_marks_and_refuses_one_below() {
        let dir = tempfile::tempdir().unwrap();
        let write = |indexes: &[u64], marked: u64| {
            let node = super::super::node_db::open_node_db(dir.path()).unwrap();
            let store = LogStore::open(&node).unwrap();
            store.log.remove_from(&0u64.to_be_bytes()).unwrap();
            for &index in indexes {
                let entry = Entry::<TypeConfig> {
                    log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
                    payload: openraft::EntryPayload::Blank,
                };
                store
                    .log
                    .insert(&index.to_be_bytes(), &codec::encode(&entry))
                    .unwrap();
            }
            node.marks.write(|h| h.last_index = Some(marked)).unwrap();
            crate::store::Kv::sync(node.store().as_ref()).unwrap();
        };
        let indexes = |node: &NodeDb| log_indexes(&LogStore::open(node).unwrap());
        // Entries 0 to 3 were synced and marked; 5 and 6 reached the disk without 4.
        write(&[0, 1, 2, 3, 5, 6], 3);
        let node = super::super::node_db::open_node_db(dir.path()).unwrap();
        crate::raft::open_for_start(&node).await.unwrap();
        assert_eq!(indexes(&node), vec![0, 1, 2, 3], "the torn tail stays");
        drop(node);
        // Entry 4 was marked (maybe acknowledged) and is gone: damage, and nothing is cut.
        write(&[0, 1, 2, 3, 5, 6], 4);
        let node = super::super::node_db::open_node_db(dir.path()).unwrap();
        let e = crate::raft::open_for_start(&node).await.err().unwrap();
        assert!(crate::raft::is_damaged_store(&e), "{e}");
        assert!(e.to_string().contains("jumps from index 3 to 5"), "{e}");
        assert_eq!(indexes(&node), vec![0, 1, 2, 3, 5, 6]);
    }

    /// A purge's entries go off openraft's core only while entries follow them (what a crash
    /// leaves is one run of entries then); a purge at or past the log's end (a follower that
    /// installed a snapshot past its log) removes them before it returns, so no later append
    /// can reach the disk without it and leave a gap.
    #[tokio::test]
    async fn a_purge_past_the_logs_end_removes_its_entries_before_it_returns() {
        let node = NodeDb::new(Arc::new(crate::store::SimKv::new()));
        let mut store = LogStore::open(&node).unwrap();
        let log_id = |index| LogId::new(openraft::CommittedLeaderId::new(1, 1), index);
        let sm = node
            .tree(&format!("{}sm", names::RAFT_TREES_PREFIX))
            .unwrap();
        let indexes = log_indexes;
        // A stored snapshot covers `index`, then openraft purges up to it.
        let covered_then_purged = async |store: &mut LogStore, index| {
            put_in(
                sm.as_ref(),
                SNAPSHOT_AT,
                &Some(log_id(index)),
                StorageIOError::write_state_machine,
            )
            .unwrap();
            store.purge(log_id(index)).await.unwrap();
        };
        for index in 1..=600u64 {
            store.log.insert(&index.to_be_bytes(), b"entry").unwrap();
        }
        // Inside the log: the entries up to 500 go (maybe after the call returns), the rest stay.
        covered_then_purged(&mut store, 500).await;
        for _ in 0..1000 {
            if indexes(&store).first() == Some(&501) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(indexes(&store), (501..=600).collect::<Vec<_>>());
        // Past its end: gone when the call returns.
        covered_then_purged(&mut store, 900).await;
        assert_eq!(indexes(&store), Vec::<u64>::new());
    }
}
