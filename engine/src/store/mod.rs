//! The write-ahead log and its group-commit flusher thread, over a [`LogSink`].
//!
//! - [`names`]: every stream's and table's name.
//! - [`sink`]: the [`LogSink`] seam; [`SledSink`] (the data dir) and [`MemorySink`] (tests and
//!   simulation, with injected faults) implement it, each a [`KvSink`] over a [`Kv`] store
//!   ([`SledKv`], [`SimKv`]): the seam under everything a node keeps on its disk.
//! - this module: [`Durability`], the flusher (group commit), the halt flag (fail-stop),
//!   [`StreamWriter`] (numbering a stream's records). Recovery's checking reader is
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
use std::time::Instant;

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::changes::Noted;
use crate::codec;
use crate::error::StorageError;
pub(crate) use change_log::ChangeLog;

mod batch;
mod change_log;
mod chunks;
mod fail_stop;
mod kv;
mod kv_sink;
mod memory;
pub mod names;
mod sim_kv;
mod sink;
mod sled_kv;
mod sled_sink;
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

/// Records covered by a durable checkpoint, to be removed off the commit path.
struct Compaction {
    stream: Arc<dyn StreamSink>,
    upto: u64,
}

/// Removes log records that a durable checkpoint covers, in chunks, on its own thread: the
/// flusher (and so every commit) never waits for it. If a crash loses some removals, replay
/// skips those records anyway (their seq is at or below the checkpoint's).
async fn compact(mut rx: mpsc::UnboundedReceiver<Compaction>, halt: Arc<Halt>) {
    while let Some(c) = rx.recv().await {
        if halt.check().is_err() {
            return;
        }
        let started = Instant::now();
        if let Err(e) = c.stream.remove_upto(c.upto) {
            // Harmless: replay skips records at or below the checkpoint anyway.
            tracing::warn!(stream = c.stream.name(), error = %e, "compaction failed");
        }
        metrics::histogram!("boxoffice_wal_compaction_seconds")
            .record(started.elapsed().as_secs_f64());
    }
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
        let (compact_tx, compact_rx) = mpsc::unbounded_channel();
        let compactor =
            crate::rt::spawn_worker("boxoffice-compact", compact(compact_rx, halt.clone()))
                .map_err(|e| StorageError::Io(format!("cannot start the compactor thread: {e}")))?;
        let durable = Arc::new(Mutex::new(marks.clone()));
        // Bounded: a replicating leader's flusher runs at most this far ahead of the commits.
        let (ack_tx, ack_rx) = mpsc::channel(REPLICATED_IN_FLIGHT_MAX);
        let acker = crate::rt::spawn_worker(
            "boxoffice-ack",
            acker(ack_rx, sink.clone(), halt.clone(), durable.clone()),
        )
        .map_err(|e| StorageError::Io(format!("cannot start the acker thread: {e}")))?;
        let flusher = Flusher {
            sink: sink.clone(),
            durability,
            halt: halt.clone(),
            compact: compact_tx,
            marks,
            dirty: false,
            ack: Some(ack_tx),
            acker: Some(acker),
            replicate,
            changes,
        };
        let thread = crate::rt::spawn_worker("boxoffice-wal", async move {
            let mut flusher = flusher;
            flusher.run(rx).await
        })
        .map_err(|e| StorageError::Io(format!("cannot start the flusher thread: {e}")))?;
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

struct Flusher {
    sink: Arc<dyn LogSink>,
    durability: Durability,
    halt: Arc<Halt>,
    compact: mpsc::UnboundedSender<Compaction>,
    /// Every stream's highest written seq and the claims taken (durable at the next sync).
    marks: Marks,
    /// Whether `marks` changed since they were last handed to the acker.
    dirty: bool,
    /// The acker thread: writes each synced batch's marks to the superblock, then replies.
    ack: Option<mpsc::Sender<Ack>>,
    acker: Option<crate::rt::Worker>,
    /// A cluster node's leader: batches go to its Raft group instead of the sink.
    replicate: Option<Arc<dyn Replicate>>,
    /// The change stream, written after each batch's own records.
    changes: ChangeLog,
}

/// A written batch handed to the acker: its marks (to write to the superblock first, if the
/// batch was synced and changed them), and its completions with what the flusher knew.
struct Ack {
    marks: Option<Marks>,
    halted: Option<StorageError>,
    completions: Vec<(Done, Result<(), StorageError>)>,
    /// A replicated batch: wait for its commit before its completions run.
    commit: Option<Waiter>,
    /// The group commit's span and its replication's, when a traced request is in the batch.
    span: Option<Traced>,
}

/// The spans of a traced group commit ([`crate::trace`]): the commit's own, and while it
/// replicates, its replication's (the replicator keeps it where the Raft network finds it until
/// the commit ends).
struct Traced {
    commit: tracing::Span,
    replication: Option<tracing::Span>,
}

/// The acker: for each batch in order, writes its marks to the superblock (made durable), then
/// runs its completions, which send the replies. It runs beside the flusher, so the superblock
/// write of one commit overlaps the writing and syncing of the next; a reply still leaves only
/// after both its records and the superblock that counts them are durable. A failed superblock
/// write halts the store and fails this batch and every later one.
async fn acker(
    mut rx: mpsc::Receiver<Ack>,
    sink: Arc<dyn LogSink>,
    halt: Arc<Halt>,
    durable: Arc<Mutex<Marks>>,
) {
    let mut failed: Option<StorageError> = None;
    while let Some(ack) = rx.recv().await {
        let span = ack.span;
        if let Some(wait) = ack.commit {
            let started = Instant::now();
            // The wait for the majority, in the trace of a traced batch.
            let answer = match span.as_ref().and_then(|t| t.replication.as_ref()) {
                Some(replication) => wait.instrument(replication.clone()).await,
                None => wait.await,
            };
            let reason = match answer {
                Ok(None) => None,
                Ok(Some(key)) => Some(StorageError::BackstopRefused { key }.to_string()),
                Err(e) => Some(format!("replication failed: {e}")),
            };
            metrics::histogram!("boxoffice_wal_flush_seconds")
                .record(started.elapsed().as_secs_f64());
            if let Some(reason) = reason {
                halt.set(reason.clone());
                failed.get_or_insert(StorageError::Halted(reason));
            }
        }
        // The group commit's span ends when the acker leaves it (its last exit), not when its
        // slowest follower's append ends.
        let _commit = span.as_ref().map(|t| t.commit.enter());
        let acking = span.as_ref().map(|t| {
            tracing::info_span!(target: crate::trace::TARGET, parent: &t.commit, "ack",
                replies = ack.completions.len())
        });
        let _acking = acking.as_ref().map(tracing::Span::enter);
        if let (Some(marks), None) = (ack.marks, &failed) {
            let started = Instant::now();
            match sink.put_superblock(&marks) {
                Ok(()) => {
                    metrics::histogram!("boxoffice_wal_superblock_seconds")
                        .record(started.elapsed().as_secs_f64());
                    *durable.lock().unwrap_or_else(|p| p.into_inner()) = marks;
                }
                Err(e) => {
                    let reason = format!("superblock write failed: {e}");
                    halt.set(reason.clone());
                    failed = Some(StorageError::Halted(reason));
                }
            }
        }
        let halted = ack.halted.or_else(|| failed.clone());
        for (done, r) in ack.completions {
            let r = match (&halted, r) {
                (Some(h), Ok(())) => Err(h.clone()),
                (_, r) => r,
            };
            done(r);
        }
    }
}

/// The span of a group commit of `batch` if any of its jobs is traced (their spans taken).
fn traced(batch: &mut [Job]) -> Option<Traced> {
    let mut callers = Vec::new();
    for job in batch.iter_mut() {
        if let Job::Append(a) = job {
            callers.append(&mut a.traces);
        }
    }
    crate::trace::group_commit(&callers, batch.len()).map(|commit| Traced {
        commit,
        replication: None,
    })
}

/// What writing one batch left to do once it is durable.
#[derive(Default)]
struct Written {
    completions: Vec<(Done, Result<(), StorageError>)>,
    compactions: Vec<Compaction>,
    records: usize,
    bytes: usize,
    stop: bool,
}

impl Flusher {
    async fn run(&mut self, mut rx: mpsc::UnboundedReceiver<Job>) {
        let mut stop = false;
        while !stop {
            let Some(first) = rx.recv().await else { break };
            let mut batch = vec![first];
            while batch.len() < FLUSH_BATCH_JOBS_MAX {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let started = Instant::now();
            self.note_changes(&mut batch);
            let traced = traced(&mut batch);
            if let Some(replicate) = self.replicate.clone() {
                stop = self
                    .replicate(batch, replicate.as_ref(), started, traced)
                    .await;
                continue;
            }
            let written = {
                let _in = traced.as_ref().map(|t| t.commit.enter());
                self.write(batch)
            };
            stop = written.stop;
            if let Some(latency) = self.sink.kv().map(|kv| kv.sync_latency())
                && !latency.is_zero()
            {
                // A simulated disk's time to sync (the batch's replies wait for it).
                tokio::time::sleep(latency).await;
            }
            let synced = (self.durability == Durability::Sync || stop)
                && self.halt.check().is_ok()
                && (crate::bugs::on(crate::bugs::Bug::ReplyBeforeSync)
                    || {
                        let fsync = traced.as_ref().map(|t| {
                        tracing::info_span!(target: crate::trace::TARGET, parent: &t.commit, "fsync")
                    });
                        let _in = fsync.as_ref().map(tracing::Span::enter);
                        self.sync()
                    });
            self.finish(written, started, synced, None, traced).await;
        }
        // Every batch's replies are out before the store reports closed.
        drop(self.ack.take());
        if let Some(h) = self.acker.take() {
            h.join().await;
        }
    }

    /// A cluster leader's group commit: the batch's jobs become one Raft entry, submitted to the
    /// group; the acker waits for it to be committed by a majority (each durable on its node)
    /// and applied to this node's log by the state machine before any completion runs (up to
    /// [`REPLICATED_IN_FLIGHT_MAX`] batches replicate at once). No superblock here: Raft's log is the durable record, and
    /// the state machine's copy is rebuilt from it. Returns whether a stop was queued.
    async fn replicate(
        &mut self,
        batch: Vec<Job>,
        replicate: &dyn Replicate,
        started: Instant,
        mut traced: Option<Traced>,
    ) -> bool {
        let mut w = Written::default();
        let mut ops = Vec::new();
        for job in batch {
            match job {
                Job::Append(a) => {
                    let r = self.halt.check();
                    if r.is_ok() {
                        w.records += a.entries.len();
                        w.bytes += a.entries.iter().map(|(_, v)| v.len() + 8).sum::<usize>();
                        ops.push(Op::Append {
                            stream: a.stream.name().to_owned(),
                            entries: a.entries,
                            claims: a.claims,
                        });
                    }
                    w.completions.push((a.done, r));
                }
                Job::Checkpoint { stream, upto, blob } => {
                    if self.halt.check().is_ok() {
                        ops.push(Op::Checkpoint {
                            stream: stream.name().to_owned(),
                            upto,
                            blob,
                        });
                    }
                }
                Job::Barrier(done) => w.completions.push((done, self.halt.check())),
                // Gathered into the change stream's record before.
                Job::Note(_) => {}
                Job::Stop => w.stop = true,
            }
        }
        let mut commit = None;
        if !ops.is_empty() && self.halt.check().is_ok() {
            // Submitted in the replication's span: the replicator keeps it for the Raft network.
            let replication = traced.as_mut().map_or_else(tracing::Span::none, |t| {
                let span = tracing::info_span!(target: crate::trace::TARGET, parent: &t.commit,
                    "replication", ops = ops.len());
                t.replication = Some(span.clone());
                span
            });
            // The replicator stamps the term.
            let submitted = replicate.submit(Batch { ops, term: 0 });
            match submitted.instrument(replication).await {
                Ok(wait) => commit = Some(wait),
                Err(e) => self.halt.set(format!("replication failed: {e}")),
            }
        }
        let stop = w.stop;
        self.finish(w, started, false, commit, traced).await;
        stop
    }

    /// Gathers what the batch's jobs change into records of the change stream, appended after
    /// the batch's own records (so they are written, synced and replicated with them), and a
    /// checkpoint of the stream that trims what is past its retention, when one is due.
    fn note_changes(&mut self, batch: &mut Vec<Job>) {
        let mut noted = Vec::new();
        batch.retain_mut(|job| match job {
            Job::Append(a) => {
                noted.extend(a.changes.take());
                true
            }
            Job::Note(n) => {
                noted.push(std::mem::replace(
                    n,
                    Noted {
                        at_ms: 0,
                        bytes: Vec::new(),
                    },
                ));
                false
            }
            _ => true,
        });
        let Some(now_ms) = noted.iter().map(|n| n.at_ms).max() else {
            return;
        };
        // Looked for among the records written before this one.
        let trim = self.changes.trim_due(now_ms);
        let entries = self.changes.seal(noted);
        let stream = self.changes.stream().clone();
        batch.push(Job::Append(Append {
            stream: stream.clone(),
            entries,
            claims: Vec::new(),
            changes: None,
            done: Box::new(|_| {}),
            traces: Vec::new(),
        }));
        if let Some(upto) = trim {
            batch.push(Job::Checkpoint {
                stream,
                upto,
                blob: Vec::new(),
            });
        }
    }

    /// Syncs the log; a failure halts the store (and so fails every completion of the batch).
    fn sync(&mut self) -> bool {
        let flush_started = Instant::now();
        let result = self.sink.sync();
        metrics::histogram!("boxoffice_wal_flush_seconds")
            .record(flush_started.elapsed().as_secs_f64());
        match result {
            Ok(()) => true,
            Err(e) => {
                self.halt.set(format!("flush failed: {e}"));
                false
            }
        }
    }

    /// Writes every job of a batch (nothing durable yet).
    fn write(&mut self, batch: Vec<Job>) -> Written {
        let mut w = Written::default();
        for job in batch {
            match job {
                Job::Append(a) => {
                    let r = self.halt.check().and_then(|()| self.append(&a));
                    if r.is_ok() {
                        w.records += a.entries.len();
                        w.bytes += a.entries.iter().map(|(_, v)| v.len() + 8).sum::<usize>();
                    }
                    w.completions.push((a.done, r));
                }
                Job::Checkpoint { stream, upto, blob } => {
                    if self.halt.check().is_ok() {
                        match self.checkpoint(stream.name(), upto, &blob) {
                            Ok(()) => w.compactions.push(Compaction { stream, upto }),
                            Err(e) => self.halt.set(e.to_string()),
                        }
                    }
                }
                Job::Barrier(done) => w.completions.push((done, self.halt.check())),
                // Gathered into the change stream's record before.
                Job::Note(_) => {}
                Job::Stop => w.stop = true,
            }
        }
        w
    }

    /// After the batch's sync: hands compactions on, and the completions to the acker (with
    /// the marks to write first, if the batch was synced). A failed sync (or any halt) means
    /// none of the batch is known durable: every completion gets the error.
    async fn finish(
        &mut self,
        w: Written,
        started: Instant,
        mut synced: bool,
        commit: Option<Waiter>,
        span: Option<Traced>,
    ) {
        let halted = self.halt.check().err();
        if halted.is_none() && !w.compactions.is_empty() {
            // Records may only go once their checkpoint is durable (Sync synced above).
            if self.durability != Durability::Sync {
                synced = self.sync();
            }
            if synced {
                for c in w.compactions {
                    let _ = self.compact.send(c);
                }
            }
        }
        let halted = self.halt.check().err();
        let marks = (synced && halted.is_none() && std::mem::take(&mut self.dirty))
            .then(|| self.marks.clone());
        metrics::histogram!("boxoffice_wal_batch_records").record(w.records as f64);
        metrics::counter!("boxoffice_wal_records_total").increment(w.records as u64);
        metrics::counter!("boxoffice_wal_bytes_total").increment(w.bytes as u64);
        metrics::histogram!("boxoffice_wal_batch_seconds").record(started.elapsed().as_secs_f64());
        if let Some(t) = &span {
            t.commit.record("records", w.records);
            t.commit.record("bytes", w.bytes);
        }
        let ack = Ack {
            marks,
            halted,
            completions: w.completions,
            commit,
            span,
        };
        if let Some(tx) = &self.ack
            && let Err(mpsc::error::SendError(ack)) = tx.send(ack).await
        {
            // The acker is gone (it cannot be, short of a panic): nothing is acknowledged.
            let closed = StorageError::Halted("the log's acker stopped".into());
            self.halt.set(closed.to_string());
            for (done, _) in ack.completions {
                done(Err(closed.clone()));
            }
        }
    }

    fn append(&mut self, a: &Append) -> Result<(), StorageError> {
        let result = self.claim_and_append(a);
        if let Err(e) = &result {
            self.halt.set(e.to_string());
        }
        result
    }

    fn claim_and_append(&mut self, a: &Append) -> Result<(), StorageError> {
        for (key, value) in &a.claims {
            match self.sink.claim(key, value)? {
                Claim::Taken => {
                    self.marks.claims += 1;
                    self.dirty = true;
                }
                // The same hold claiming again (a retry after a crash) is not a second sale.
                Claim::Already => {}
                Claim::Refused(_) => {
                    return Err(StorageError::BackstopRefused { key: key.clone() });
                }
            }
        }
        a.stream.append_batch(&a.entries)?;
        if let Some((last, _)) = a.entries.last() {
            self.marks.raise(a.stream.name(), *last);
            self.dirty = true;
        }
        Ok(())
    }

    fn checkpoint(&self, stream: &str, upto: u64, blob: &[u8]) -> Result<(), StorageError> {
        let started = Instant::now();
        self.sink
            .put_checkpoint(stream, &checkpoint_value(upto, blob))?;
        metrics::histogram!("boxoffice_wal_checkpoint_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok(())
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
