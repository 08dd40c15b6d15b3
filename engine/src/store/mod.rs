//! The write-ahead log and its group-commit flusher thread, over a [`LogSink`].
//!
//! - [`names`]: every stream's and table's name.
//! - [`sink`]: the [`LogSink`] seam; [`SledSink`] (the data dir) and [`MemorySink`] (tests and
//!   simulation, with injected faults) implement it, each a [`KvSink`] over a [`Kv`] store
//!   ([`SledKv`], [`SimKv`]): the seam under everything a node keeps on its disk.
//! - this module: [`Durability`], the [`Store`] and its jobs, the halt flag (fail-stop),
//!   [`StreamWriter`] (numbering a stream's records).
//! - [`flusher`]: the flusher (group commit: each stream's records of a commit gathered and
//!   written together), its acker and its compactor. Recovery's checking reader is
//!   [`crate::integrity::read_stream`].
//! - [`superblock`]: each stream's high-water mark, written after every durable commit.
//!
//! Every stream has one writer (the actor that owns it), which numbers its records. Writers hand
//! their records to the flusher thread over a channel; the flusher drains the channel, writes
//! everything it drained and makes it durable with **one** [`LogSink::sync`]; then the acker
//! thread records the new high-water marks in the superblock ([`LogSink::put_superblock`]) and
//! only then runs the completions, which send the replies. The acker works beside the flusher,
//! so one commit's superblock write overlaps the next commit's writes and sync. Both are
//! [`crate::rt::spawn_worker`]s: OS threads with a small runtime of their own, so a sync never
//! blocks a runtime worker (and sled's `flush_async`, spacejam/sled#1308, is never used); in a
//! deterministic simulation, tasks of the node's runtime over a [`SimKv`].
//!
//! Fail-stop: after a write or flush error, or a backstop refusal, the store halts: every pending
//! and later job fails with a storage error and nothing more is acknowledged (PostgreSQL's answer
//! to fsync failure).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use crate::changes::Noted;
use crate::codec;
use crate::error::StorageError;
pub(crate) use change_log::ChangeLog;

mod batch;
mod change_log;
mod chunks;
mod fail_stop;
mod flusher;
mod kv;
mod kv_sink;
mod memory;
pub mod names;
mod sim_kv;
mod sink;
mod sled_kv;
mod sled_sink;
mod stall;
pub mod superblock;

pub use batch::{Batch, Op};
pub use change_log::{CHANGE_RECORD_BYTES, read_changes};
pub use fail_stop::FailStopKv;
pub use kv::{Change, Kv, KvTree, Pair, Pairs};
pub use kv_sink::KvSink;
pub use memory::MemorySink;
pub use sim_kv::SimKv;
pub use sink::{Claim, LogSink, StreamSink};
pub use sled_kv::{SLED_CACHE_BYTES, SledKv, open_db, open_db_cached};
pub use sled_sink::{DiskUsage, SledSink, disk_usage};
pub use stall::watch_disk_stalls;
pub use superblock::{Marks, SuperblockRead};

/// When an acknowledged write is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// Flush (fsync) each batch before replying. The default, and the only mode that keeps
    /// the promise "acknowledged means it survives a crash".
    #[default]
    Sync,
    /// Reply once the batch is written to sled's buffers; sled flushes them within ~500 ms.
    /// For benchmarks: a crash can lose the last half second of acknowledged work.
    Buffered,
}

impl Durability {
    /// The names the command line and the environment use: `sync`, `buffered`.
    pub const NAMES: [&'static str; 2] = ["sync", "buffered"];

    /// This mode's name.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Sync => "sync",
            Durability::Buffered => "buffered",
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Durability, String> {
        match s {
            "sync" => Ok(Durability::Sync),
            "buffered" => Ok(Durability::Buffered),
            other => Err(format!("durability is `sync` or `buffered`, not `{other}`")),
        }
    }
}

pub use crate::limits::FLUSH_BATCH_JOBS_MAX;

/// A checkpoint as the log keeps it: `(upto, blob)` encoded by [`codec`].
pub(crate) fn checkpoint_value(upto: u64, blob: &[u8]) -> Vec<u8> {
    codec::encode(&(upto, blob))
}

/// Where a replicated store's group commits go instead of its own sink: a cluster node's Raft
/// group ([`crate::raft::RaftReplicator`]), whose state machine writes them to every node's log.
pub trait Replicate: Send + Sync + 'static {
    /// Commits `batch` on a majority of the group and applies it on this node.
    /// `Ok(Some(key))`: the sold-seat backstop refused the claim `key` (that stream's records
    /// were not written). `Err`: not known committed (this node lost its leadership, or no
    /// majority answered in time).
    fn commit(&self, batch: Batch) -> BoxFuture<'_, Result<Option<String>, StorageError>> {
        Box::pin(async move { self.submit(batch).await?.await })
    }

    /// Hands `batch` to the group without waiting for it (so the next batch can follow it
    /// while it replicates): the returned waiter ends once it is committed and applied, and
    /// answers as [`Replicate::commit`] does. Batches commit in the order they are submitted.
    fn submit(&self, batch: Batch) -> BoxFuture<'_, Result<Waiter, StorageError>>;
}

/// Ends once a submitted batch is committed (see [`Replicate::submit`]).
pub type Waiter = BoxFuture<'static, Result<Option<String>, StorageError>>;

/// Group commits a replicating leader keeps in flight at once (each one Raft entry): while one
/// replicates, the flusher forms the next. Measured with `benches/cluster.sh` (BENCHMARKS.md):
/// 1 and 2 give about the same holds/s, 8 a quarter fewer (smaller entries: more fsyncs on
/// every node for the same records).
pub const REPLICATED_IN_FLIGHT_MAX: usize = 2;

/// A completion run by the acker thread once a job is durable (or failed).
pub(crate) type Done = Box<dyn FnOnce(Result<(), StorageError>) + Send>;

pub(crate) struct Append {
    pub stream: Arc<dyn StreamSink>,
    pub entries: Vec<(u64, Vec<u8>)>,
    /// Sold-seat keys to claim insert-if-absent, each with the hold id as value.
    pub claims: Vec<(String, Vec<u8>)>,
    /// What the records change, for the change stream ([`crate::changes`]), encoded.
    pub changes: Option<Noted>,
    pub done: Done,
    /// The traced requests whose records these are (the section's decisions; empty when
    /// tracing is off): the group commit's span joins their traces ([`crate::trace`]).
    pub traces: Vec<tracing::Span>,
}

pub(crate) enum Job {
    Append(Append),
    /// Changes without records of their own (a refund: the payment provider keeps its
    /// record), for the change stream, written with the next group commit (the noter waits
    /// on a barrier after it).
    Note(Noted),
    Checkpoint {
        stream: Arc<dyn StreamSink>,
        upto: u64,
        blob: Vec<u8>,
    },
    /// Runs once everything queued before it has been written (and synced, with `Sync`).
    Barrier(Done),
    Stop,
}

impl Job {
    /// The job with the spans of the traced requests it carries ([`Append::traces`]).
    pub(crate) fn traced(mut self, spans: Vec<tracing::Span>) -> Job {
        if let Job::Append(a) = &mut self {
            a.traces = spans;
        }
        self
    }
}

/// The halt flag, shared by the flusher and every writer. Once set it stays set: every later
/// change is refused (fail-stop), and whoever watches (health) hears why.
pub(crate) struct Halt {
    reason: OnceLock<String>,
    halted: AtomicBool,
    watch: tokio::sync::watch::Sender<Option<String>>,
    /// This store's part of `boxoffice_store_halted` (1 once halted; gone with the store).
    gauge: crate::share::Share,
}

impl Default for Halt {
    fn default() -> Halt {
        Halt {
            reason: OnceLock::new(),
            halted: AtomicBool::new(false),
            watch: tokio::sync::watch::Sender::new(None),
            gauge: crate::share::Share::new("boxoffice_store_halted"),
        }
    }
}

impl Halt {
    pub(crate) fn set(&self, reason: String) {
        let first = self.reason.set(reason.clone()).is_ok();
        // Halted before anyone hears of it: a watcher that wakes sees `check` fail.
        self.halted.store(true, Ordering::SeqCst);
        if first {
            tracing::error!(%reason, "the engine halts (fail-stop)");
            metrics::counter!("boxoffice_wal_halts_total").increment(1);
            self.gauge.set(1);
            self.watch.send_replace(Some(reason));
        }
    }

    /// Why the store halted, if it did.
    pub(crate) fn reason(&self) -> Option<String> {
        self.reason.get().cloned()
    }

    /// A channel that changes once the store halts.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.watch.subscribe()
    }

    pub(crate) fn check(&self) -> Result<(), StorageError> {
        if self.halted.load(Ordering::Relaxed) {
            Err(StorageError::Halted(
                self.reason.get().cloned().unwrap_or_default(),
            ))
        } else {
            Ok(())
        }
    }
}

/// The log sink and its flusher thread.
pub(crate) struct Store {
    pub sink: Arc<dyn LogSink>,
    tx: mpsc::UnboundedSender<Job>,
    pub halt: Arc<Halt>,
    thread: Mutex<Option<crate::rt::Worker>>,
    compactor: Mutex<Option<crate::rt::Worker>>,
    /// The marks last written to the superblock (what the log must hold now).
    durable: Arc<Mutex<Marks>>,
}

impl Store {
    /// Starts the flusher over a sink whose log holds (at least) `marks`.
    pub fn start(
        sink: Arc<dyn LogSink>,
        durability: Durability,
        marks: Marks,
        replicate: Option<Arc<dyn Replicate>>,
        change_retention: std::time::Duration,
    ) -> Result<Store, StorageError> {
        let changes = ChangeLog::open(sink.as_ref(), change_retention, marks.of(names::CHANGES))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let halt = Arc::new(Halt::default());
        let durable = Arc::new(Mutex::new(marks.clone()));
        let (thread, compactor) = flusher::start(
            flusher::Setup {
                sink: sink.clone(),
                durability,
                halt: halt.clone(),
                marks,
                replicate,
                changes,
                durable: durable.clone(),
            },
            rx,
        )?;
        Ok(Store {
            sink,
            tx,
            halt,
            thread: Mutex::new(Some(thread)),
            compactor: Mutex::new(Some(compactor)),
            durable,
        })
    }

    /// The marks last written to the superblock: every record up to them must be there.
    pub fn durable_marks(&self) -> Marks {
        self.durable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Queues a job. If the flusher is gone the job's completion runs at once with an error.
    pub fn submit(&self, job: Job) {
        let closed = || Err(StorageError::Halted("the log is closed".into()));
        match self.tx.send(job) {
            Err(mpsc::error::SendError(Job::Append(a))) => (a.done)(closed()),
            Err(mpsc::error::SendError(Job::Barrier(done))) => done(closed()),
            _ => {}
        }
    }

    /// Waits until everything queued before now has been written (and synced, with `Sync`).
    pub async fn barrier(&self) -> Result<(), StorageError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(Job::Barrier(Box::new(move |r| {
            let _ = tx.send(r);
        })));
        rx.await
            .map_err(|_| StorageError::Halted("the log is closed".into()))?
    }

    /// Queues `job`, then a checkpoint of `state()` if `stream` has written `every` records
    /// since its last one (the checkpoint queues behind the records it covers).
    pub fn submit_with_checkpoint<S: serde::Serialize>(
        &self,
        job: Job,
        stream: &mut StreamWriter,
        every: u64,
        state: impl FnOnce() -> S,
    ) {
        self.submit(job);
        if stream.since_checkpoint >= every {
            let job = stream.checkpoint(&state());
            self.submit(job);
        }
    }

    /// Stops the flusher after the jobs already queued (with a final flush), and waits for it.
    pub async fn close(&self) {
        let _ = self.tx.send(Job::Stop);
        let handle = self.thread.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some(h) = handle {
            h.join().await;
        }
        // The flusher owned the compactor's sender: with it gone, the compactor finishes.
        let handle = self.compactor.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some(h) = handle {
            h.join().await;
        }
    }

    /// Halts the store as a crash would: queued jobs fail, nothing more is written.
    pub fn halt_now(&self, reason: &str) {
        self.halt.set(reason.to_owned());
    }
}

/// The writer's side of one stream: numbers records and hands them to the flusher.
pub(crate) struct StreamWriter {
    pub stream: Arc<dyn StreamSink>,
    pub next_seq: u64,
    pub since_checkpoint: u64,
}

impl StreamWriter {
    pub fn open(
        sink: &dyn LogSink,
        name: &str,
        last_seq: u64,
    ) -> Result<StreamWriter, StorageError> {
        Ok(StreamWriter {
            stream: sink.stream(name)?,
            next_seq: last_seq + 1,
            since_checkpoint: 0,
        })
    }

    /// Encodes and numbers `records` into an append job (possibly with none, as an ordering
    /// barrier: its completion runs only after everything queued before it is durable).
    pub fn append<T: serde::Serialize>(
        &mut self,
        records: &[T],
        claims: Vec<(String, Vec<u8>)>,
        done: Done,
    ) -> Job {
        self.append_changing(records, claims, &[], done)
    }

    /// [`StreamWriter::append`], with what the records change for the change stream.
    pub fn append_changing<T: serde::Serialize>(
        &mut self,
        records: &[T],
        claims: Vec<(String, Vec<u8>)>,
        changes: &[crate::changes::Change],
        done: Done,
    ) -> Job {
        let entries = records
            .iter()
            .map(|r| {
                let seq = self.next_seq;
                self.next_seq += 1;
                (seq, codec::encode(r))
            })
            .collect::<Vec<_>>();
        self.since_checkpoint += entries.len() as u64;
        Job::Append(Append {
            stream: self.stream.clone(),
            entries,
            claims,
            changes: Noted::of(changes),
            done,
            traces: Vec::new(),
        })
    }

    /// A checkpoint of `state` covering every record numbered so far.
    pub fn checkpoint<S: serde::Serialize>(&mut self, state: &S) -> Job {
        self.since_checkpoint = 0;
        Job::Checkpoint {
            stream: self.stream.clone(),
            upto: self.next_seq - 1,
            blob: codec::encode(state),
        }
    }
}
