//! The write-ahead log on sled 0.34.7, and its group-commit flusher thread.
//!
//! Layout of the sled database (one per data dir):
//!
//! | tree | key | value |
//! |---|---|---|
//! | `catalog` | seq (u64 BE) | framed `CatalogRecord` |
//! | `section/{event}/{section}` | seq (u64 BE) | framed `SectionRecord` |
//! | `ledger/{shard}` | seq (u64 BE) | framed `LedgerRecord` |
//! | `checkpoints` | stream name | framed `(seq, state blob)`: the stream's state up to seq |
//! | `sold` | `{event}/{section}/{seat}` (GA: `#{n}`) | hold id: the sold-seat backstop |
//!
//! Every stream has one writer (the actor that owns it), which numbers its records. Writers hand
//! their records to the flusher thread over a channel; the flusher drains the channel, writes
//! everything it drained, makes it durable with **one** `flush` (an fsync) and only then runs the
//! completions, which send the replies. The flusher is a plain OS thread so the fsync never
//! blocks a runtime worker, and sled's `flush_async` (spacejam/sled#1308) is never used.
//!
//! Fail-stop: after a write or flush error, or a backstop refusal, the store halts: every pending
//! and later job fails with a storage error and nothing more is acknowledged (PostgreSQL's answer
//! to fsync failure).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;

use serde::de::DeserializeOwned;

use crate::codec;
use crate::error::StorageError;

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

/// Most jobs the flusher takes into one batch (one fsync).
pub const FLUSH_BATCH_JOBS_MAX: usize = 8_192;

/// A completion run by the flusher thread once a job is durable (or failed).
pub(crate) type Done = Box<dyn FnOnce(Result<(), StorageError>) + Send>;

pub(crate) struct Append {
    pub tree: sled::Tree,
    pub entries: Vec<(u64, Vec<u8>)>,
    /// Sold-seat keys to claim insert-if-absent, each with the hold id as value.
    pub claims: Vec<(String, Vec<u8>)>,
    pub done: Done,
}

pub(crate) enum Job {
    Append(Append),
    Checkpoint {
        stream: String,
        tree: sled::Tree,
        upto: u64,
        blob: Vec<u8>,
    },
    Stop,
}

/// The halt flag, shared by the flusher and every writer.
#[derive(Default)]
pub(crate) struct Halt {
    reason: OnceLock<String>,
    halted: AtomicBool,
}

impl Halt {
    fn set(&self, reason: String) {
        if self.reason.set(reason.clone()).is_ok() {
            tracing::error!(%reason, "storage failure: the engine halts (fail-stop)");
            metrics::counter!("boxoffice_wal_halts_total").increment(1);
        }
        self.halted.store(true, Ordering::SeqCst);
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

/// The sled database and its flusher thread.
pub(crate) struct Store {
    pub db: sled::Db,
    tx: mpsc::Sender<Job>,
    pub halt: Arc<Halt>,
    thread: Mutex<Option<JoinHandle<()>>>,
    compactor: Mutex<Option<JoinHandle<()>>>,
}

/// Records covered by a durable checkpoint, to be removed off the commit path.
struct Compaction {
    tree: sled::Tree,
    upto: u64,
}

/// Removes log records that a durable checkpoint covers, in chunks, on its own thread: the
/// flusher (and so every commit) never waits for it. If a crash loses some removals, replay
/// skips those records anyway (their seq is at or below the checkpoint's).
fn compact(rx: mpsc::Receiver<Compaction>, halt: Arc<Halt>) {
    while let Ok(c) = rx.recv() {
        let started = Instant::now();
        let mut batch = sled::Batch::default();
        let mut n = 0usize;
        for key in c.tree.range(..=c.upto.to_be_bytes()).keys() {
            if halt.check().is_err() {
                return;
            }
            let Ok(key) = key else { break };
            batch.remove(key);
            n += 1;
            if n.is_multiple_of(10_000) {
                let _ = c.tree.apply_batch(std::mem::take(&mut batch));
            }
        }
        let _ = c.tree.apply_batch(batch);
        metrics::histogram!("boxoffice_wal_compaction_seconds")
            .record(started.elapsed().as_secs_f64());
    }
}

/// Opens the sled database under `dir`.
pub fn open_db(dir: &std::path::Path) -> Result<sled::Db, StorageError> {
    sled::Config::new()
        .path(dir)
        .mode(sled::Mode::HighThroughput)
        .open()
        .map_err(|e| StorageError::Open {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })
}

fn io(e: sled::Error) -> StorageError {
    StorageError::Io(e.to_string())
}

impl Store {
    /// Starts the flusher over an open database.
    pub fn start(db: sled::Db, durability: Durability) -> Result<Store, StorageError> {
        let checkpoints = db.open_tree("checkpoints").map_err(io)?;
        let sold = db.open_tree("sold").map_err(io)?;
        let (tx, rx) = mpsc::channel();
        let halt = Arc::new(Halt::default());
        let (compact_tx, compact_rx) = mpsc::channel();
        let compactor = {
            let halt = halt.clone();
            std::thread::Builder::new()
                .name("boxoffice-compact".into())
                .spawn(move || compact(compact_rx, halt))
                .map_err(|e| StorageError::Io(format!("cannot start the compactor thread: {e}")))?
        };
        let flusher = Flusher {
            db: db.clone(),
            checkpoints,
            sold,
            durability,
            halt: halt.clone(),
            compact: compact_tx,
        };
        let thread = std::thread::Builder::new()
            .name("boxoffice-wal".into())
            .spawn(move || flusher.run(rx))
            .map_err(|e| StorageError::Io(format!("cannot start the flusher thread: {e}")))?;
        Ok(Store {
            db,
            tx,
            halt,
            thread: Mutex::new(Some(thread)),
            compactor: Mutex::new(Some(compactor)),
        })
    }

    /// Queues a job. If the flusher is gone the job's completion runs at once with an error.
    pub fn submit(&self, job: Job) {
        if let Err(mpsc::SendError(Job::Append(a))) = self.tx.send(job) {
            (a.done)(Err(StorageError::Halted("the log is closed".into())));
        }
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
    pub fn close(&self) {
        let _ = self.tx.send(Job::Stop);
        let handle = self.thread.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some(h) = handle {
            let _ = h.join();
        }
        // The flusher owned the compactor's sender: with it gone, the compactor finishes.
        let handle = self.compactor.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    /// Halts the store as a crash would: queued jobs fail, nothing more is written.
    pub fn halt_now(&self, reason: &str) {
        self.halt.set(reason.to_owned());
    }
}

struct Flusher {
    db: sled::Db,
    checkpoints: sled::Tree,
    sold: sled::Tree,
    durability: Durability,
    halt: Arc<Halt>,
    compact: mpsc::Sender<Compaction>,
}

impl Flusher {
    fn run(self, rx: mpsc::Receiver<Job>) {
        let mut stop = false;
        while !stop {
            let Ok(first) = rx.recv() else { break };
            let mut batch = vec![first];
            while batch.len() < FLUSH_BATCH_JOBS_MAX {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let started = Instant::now();
            let mut completions: Vec<(Done, Result<(), StorageError>)> = Vec::new();
            let mut compactions = Vec::new();
            let mut bytes = 0usize;
            let mut records = 0usize;
            for job in batch {
                match job {
                    Job::Append(a) => {
                        let r = self.halt.check().and_then(|()| self.append(&a));
                        if r.is_ok() {
                            records += a.entries.len();
                            bytes += a.entries.iter().map(|(_, v)| v.len() + 8).sum::<usize>();
                        }
                        completions.push((a.done, r));
                    }
                    Job::Checkpoint {
                        stream,
                        tree,
                        upto,
                        blob,
                    } => {
                        if self.halt.check().is_ok() {
                            match self.checkpoint(&stream, upto, &blob) {
                                Ok(()) => compactions.push(Compaction { tree, upto }),
                                Err(e) => self.halt.set(e.to_string()),
                            }
                        }
                    }
                    Job::Stop => stop = true,
                }
            }
            if (self.durability == Durability::Sync || stop) && self.halt.check().is_ok() {
                let flush_started = Instant::now();
                if let Err(e) = self.db.flush() {
                    self.halt.set(format!("flush failed: {e}"));
                }
                metrics::histogram!("boxoffice_wal_flush_seconds")
                    .record(flush_started.elapsed().as_secs_f64());
            }
            // A failed flush means none of the batch is known durable: fail all of it.
            let halted = self.halt.check().err();
            if halted.is_none() && !compactions.is_empty() {
                // Records may only go once their checkpoint is durable (Sync flushed above).
                let durable = self.durability == Durability::Sync || self.db.flush().is_ok();
                if durable {
                    for c in compactions {
                        let _ = self.compact.send(c);
                    }
                }
            }
            metrics::histogram!("boxoffice_wal_batch_records").record(records as f64);
            metrics::counter!("boxoffice_wal_records_total").increment(records as u64);
            metrics::counter!("boxoffice_wal_bytes_total").increment(bytes as u64);
            metrics::histogram!("boxoffice_wal_batch_seconds")
                .record(started.elapsed().as_secs_f64());
            for (done, r) in completions {
                let r = match (&halted, r) {
                    (Some(h), Ok(())) => Err(h.clone()),
                    (_, r) => r,
                };
                done(r);
            }
        }
    }

    fn append(&self, a: &Append) -> Result<(), StorageError> {
        for (key, value) in &a.claims {
            match self
                .sold
                .compare_and_swap(key.as_bytes(), None::<&[u8]>, Some(value.as_slice()))
            {
                Ok(Ok(())) => {}
                // The same hold claiming again (a retry after a crash) is not a second sale.
                Ok(Err(cas)) if cas.current.as_deref() == Some(value.as_slice()) => {}
                Ok(Err(_)) => {
                    let e = StorageError::BackstopRefused { key: key.clone() };
                    self.halt.set(e.to_string());
                    return Err(e);
                }
                Err(e) => {
                    self.halt.set(e.to_string());
                    return Err(io(e));
                }
            }
        }
        for (seq, bytes) in &a.entries {
            if let Err(e) = a.tree.insert(seq.to_be_bytes(), bytes.as_slice()) {
                self.halt.set(e.to_string());
                return Err(io(e));
            }
        }
        Ok(())
    }

    fn checkpoint(&self, stream: &str, upto: u64, blob: &[u8]) -> Result<(), StorageError> {
        let started = Instant::now();
        self.checkpoints
            .insert(stream.as_bytes(), codec::encode(&(upto, blob)))
            .map_err(io)?;
        metrics::histogram!("boxoffice_wal_checkpoint_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok(())
    }
}

/// A stream's records read back for recovery.
pub(crate) struct Replay<T> {
    /// The checkpointed state and the seq it covers.
    pub checkpoint: Option<(u64, Vec<u8>)>,
    /// Records after the checkpoint, in order.
    pub records: Vec<(u64, T)>,
    /// The highest seq seen (checkpoint or record): the writer continues after it.
    pub last_seq: u64,
    /// Whether a torn last record was dropped.
    pub dropped_tail: bool,
}

/// Reads a stream: its checkpoint, then every record after it. A record that does not decode is
/// dropped if it is the stream's last (a torn write), and refuses recovery anywhere else.
pub(crate) fn read_stream<T: DeserializeOwned>(
    checkpoints: &sled::Tree,
    name: &str,
    tree: &sled::Tree,
) -> Result<Replay<T>, StorageError> {
    let checkpoint =
        match checkpoints.get(name.as_bytes()).map_err(io)? {
            None => None,
            Some(bytes) => Some(codec::decode::<(u64, Vec<u8>)>(&bytes).map_err(|e| {
                StorageError::Corrupt {
                    stream: format!("checkpoints/{name}"),
                    seq: 0,
                    reason: e.to_string(),
                }
            })?),
        };
    let after = checkpoint.as_ref().map_or(0, |(s, _)| *s);
    let mut last_seq = after;
    let mut records = Vec::new();
    let mut dropped_tail = false;
    let mut iter = tree.range((after + 1).to_be_bytes()..).peekable();
    while let Some(item) = iter.next() {
        let (key, value) = item.map_err(io)?;
        let seq = seq_of(&key).ok_or_else(|| StorageError::Corrupt {
            stream: name.to_owned(),
            seq: 0,
            reason: format!("key of {} bytes is not a sequence number", key.len()),
        })?;
        match codec::decode::<T>(&value) {
            Ok(r) => {
                records.push((seq, r));
                last_seq = seq;
            }
            Err(e) if iter.peek().is_none() => {
                tracing::warn!(stream = name, seq, error = %e, "dropping a torn last record");
                tree.remove(&key).map_err(io)?;
                dropped_tail = true;
            }
            Err(e) => {
                return Err(StorageError::Corrupt {
                    stream: name.to_owned(),
                    seq,
                    reason: e.to_string(),
                });
            }
        }
    }
    Ok(Replay {
        checkpoint,
        records,
        last_seq,
        dropped_tail,
    })
}

fn seq_of(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

/// The writer's side of one stream: numbers records and hands them to the flusher.
pub(crate) struct StreamWriter {
    pub name: String,
    pub tree: sled::Tree,
    pub next_seq: u64,
    pub since_checkpoint: u64,
}

impl StreamWriter {
    pub fn open(db: &sled::Db, name: &str, last_seq: u64) -> Result<StreamWriter, StorageError> {
        Ok(StreamWriter {
            name: name.to_owned(),
            tree: db.open_tree(name).map_err(io)?,
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
            tree: self.tree.clone(),
            entries,
            claims,
            done,
        })
    }

    /// A checkpoint of `state` covering every record numbered so far.
    pub fn checkpoint<S: serde::Serialize>(&mut self, state: &S) -> Job {
        self.since_checkpoint = 0;
        Job::Checkpoint {
            stream: self.name.clone(),
            tree: self.tree.clone(),
            upto: self.next_seq - 1,
            blob: codec::encode(state),
        }
    }
}
