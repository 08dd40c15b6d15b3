//! A node's store ([`NodeDb`]): the one key-value store its Raft log, vote and state machine
//! share, with one sync for all of them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::marks::RaftMarks;
use crate::store::{FailStopKv, Kv, KvSink, KvTree, SledKv};

/// A node's store ([`Kv`]), shared by its log store, state machine and vote guard: one sync
/// makes all of them durable.
#[derive(Clone)]
pub struct NodeDb {
    pub(super) kv: Arc<dyn Kv>,
    pub(super) dir: Option<PathBuf>,
    /// What the store must hold, kept beside it (none for a store in memory).
    pub(super) marks: RaftMarks,
}

impl NodeDb {
    /// A node over `kv` (a simulated disk: no data dir). The node stops using it for good at
    /// its first failed sync ([`FailStopKv`]).
    pub fn new(kv: Arc<dyn Kv>) -> NodeDb {
        NodeDb {
            kv: Arc::new(FailStopKv::new(kv)),
            dir: None,
            marks: RaftMarks::default(),
        }
    }

    /// The engine's log in this store ([`KvSink`]): what the state machine applies committed
    /// batches to, and what the engine recovers from when this node leads.
    pub fn sink(&self) -> std::result::Result<KvSink, crate::error::StorageError> {
        KvSink::new(self.kv.clone())
    }

    /// The node's store.
    pub fn store(&self) -> &Arc<dyn Kv> {
        &self.kv
    }

    /// The node's data dir (`None`: a store in memory).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    pub(super) fn tree(&self, name: &str) -> std::io::Result<Arc<dyn KvTree>> {
        self.kv.tree(name).map_err(std::io::Error::other)
    }

    /// Makes what a start is about to read durable. It may still be only in the OS's cache:
    /// the last run stopped inside an fsync, or before one (a crash, a `kill -9`). Read and acted
    /// on (a vote a restarted node keeps, entries it acknowledges to a leader), a power cut
    /// could still take it back. The single node's recovery syncs what it read for the same
    /// reason before it serves.
    pub async fn make_durable(&self) -> std::io::Result<()> {
        self.sync().await
    }

    /// Makes everything written so far durable (sled: its flush, then `fdatasync` of its data
    /// file). Runs off the async workers ([`crate::rt::blocking`]), so a slow disk does not
    /// stall them (and with them the heartbeats that keep a leader).
    pub(super) async fn sync(&self) -> std::io::Result<()> {
        self.sync_then(|| Ok(())).await
    }

    /// [`NodeDb::sync`], then [`NodeDb::mark`], in one trip off the async workers (an append
    /// waits for both: one hand-over to a blocking thread fewer per Raft append).
    pub(super) async fn sync_marked(
        &self,
        change: impl FnOnce(&mut super::marks::Held) + Send + 'static,
    ) -> std::io::Result<()> {
        let marks = self.marks.clone();
        self.sync_then(move || marks.write(change)).await
    }

    /// Syncs the store, then runs `after` (only if the sync succeeded), off the async workers.
    async fn sync_then(
        &self,
        after: impl FnOnce() -> std::io::Result<()> + Send + 'static,
    ) -> std::io::Result<()> {
        let latency = self.kv.sync_latency();
        if !latency.is_zero() {
            // A simulated disk's time to sync.
            tokio::time::sleep(latency).await;
        }
        let kv = self.kv.clone();
        crate::rt::blocking(move || {
            kv.sync().map_err(std::io::Error::other)?;
            after()
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// Records `change` in the marks ([`super::marks`]): what the store must hold from now on,
    /// durable when this returns. Off the async workers, as [`NodeDb::sync`].
    pub(super) async fn mark(
        &self,
        change: impl FnOnce(&mut super::marks::Held) + Send + 'static,
    ) -> std::io::Result<()> {
        let marks = self.marks.clone();
        crate::rt::blocking(move || marks.write(change))
            .await
            .map_err(std::io::Error::other)?
    }
}

/// How long opening a node's sled database waits for the lock of a previous instance (in this
/// process, its tasks let go of the database as they end).
const NODE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Opens (or creates) a node's sled database in `dir`, waiting up to 10 s for the lock of a
/// previous instance.
pub fn open_node_db(dir: &Path) -> std::io::Result<NodeDb> {
    open_node_db_cached(dir, crate::store::SLED_CACHE_BYTES)
}

/// [`open_node_db`] with a sled page cache of `cache_bytes` (one group of several shares the
/// node's budget).
pub fn open_node_db_cached(dir: &Path, cache_bytes: u64) -> std::io::Result<NodeDb> {
    let kv = SledKv::open(dir, cache_bytes, NODE_LOCK_WAIT)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(NodeDb {
        kv: Arc::new(FailStopKv::new(Arc::new(kv))),
        dir: Some(dir.to_owned()),
        marks: RaftMarks::open(dir)?,
    })
}
