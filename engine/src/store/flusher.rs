//! The flusher (group commit), its acker and its compactor: three threads behind [`Store`]
//! (see the module docs of [`super`]).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc;
use tracing::Instrument;

use super::{
    Append, Batch, ChangeLog, Claim, Done, Durability, FLUSH_BATCH_JOBS_MAX, Halt, Job, LogSink,
    Marks, Noted, Op, REPLICATED_IN_FLIGHT_MAX, Replicate, StreamSink, Waiter, checkpoint_value,
};
use crate::error::StorageError;

/// What the flusher starts from.
pub(super) struct Setup {
    pub sink: Arc<dyn LogSink>,
    pub durability: Durability,
    pub halt: Arc<Halt>,
    /// What the log holds at the start.
    pub marks: Marks,
    pub replicate: Option<Arc<dyn Replicate>>,
    pub changes: ChangeLog,
    /// Where the acker keeps the marks last written to the superblock.
    pub durable: Arc<Mutex<Marks>>,
}

/// Starts the compactor, the acker and the flusher over `jobs`: the flusher's thread and the
/// compactor's.
pub(super) fn start(
    setup: Setup,
    jobs: mpsc::UnboundedReceiver<Job>,
) -> Result<(crate::rt::Worker, crate::rt::Worker), StorageError> {
    let Setup {
        sink,
        durability,
        halt,
        marks,
        replicate,
        changes,
        durable,
    } = setup;
    let (compact_tx, compact_rx) = mpsc::unbounded_channel();
    let compactor = crate::rt::spawn_worker("boxoffice-compact", compact(compact_rx, halt.clone()))
        .map_err(|e| StorageError::Io(format!("cannot start the compactor thread: {e}")))?;
    // Bounded: a replicating leader's flusher runs at most this far ahead of the commits.
    let (ack_tx, ack_rx) = mpsc::channel(REPLICATED_IN_FLIGHT_MAX);
    let acker = crate::rt::spawn_worker(
        "boxoffice-ack",
        acker(ack_rx, sink.clone(), halt.clone(), durable),
    )
    .map_err(|e| StorageError::Io(format!("cannot start the acker thread: {e}")))?;
    let flusher = Flusher {
        sink,
        durability,
        halt,
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
        flusher.run(jobs).await
    })
    .map_err(|e| StorageError::Io(format!("cannot start the flusher thread: {e}")))?;
    Ok((thread, compactor))
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

impl Written {
    /// Counts `entries` among the batch's records and bytes (the metrics').
    fn count(&mut self, entries: &[(u64, Vec<u8>)]) {
        self.records += entries.len();
        self.bytes += entries.iter().map(|(_, v)| v.len() + 8).sum::<usize>();
    }
}

/// A stream and records of it (numbered, encoded), in order.
type StreamRecords = (Arc<dyn StreamSink>, Vec<(u64, Vec<u8>)>);

/// The op that appends a stream's gathered records (no claims).
fn append_op((stream, entries): StreamRecords) -> Op {
    Op::Append {
        stream: stream.name().to_owned(),
        entries,
        claims: Vec::new(),
    }
}

/// A batch's records gathered by stream, in the order each stream first appeared; a stream's
/// records in the order they were queued (ascending: one writer numbers them).
#[derive(Default)]
struct Gathered {
    streams: Vec<StreamRecords>,
}

impl Gathered {
    fn add(&mut self, stream: Arc<dyn StreamSink>, mut entries: Vec<(u64, Vec<u8>)>) {
        if entries.is_empty() {
            return;
        }
        match self
            .streams
            .iter_mut()
            .find(|(s, _)| s.name() == stream.name())
        {
            Some((_, all)) => all.append(&mut entries),
            None => self.streams.push((stream, entries)),
        }
    }

    /// The records gathered for the stream `name`, taken out.
    fn take(&mut self, name: &str) -> Option<StreamRecords> {
        let at = self.streams.iter().position(|(s, _)| s.name() == name)?;
        Some(self.streams.remove(at))
    }
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
        let (ops, w) = self.ops_of(batch);
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

    /// A replicated batch's ops and what is left to do once they commit.
    fn ops_of(&self, batch: Vec<Job>) -> (Vec<Op>, Written) {
        let mut w = Written::default();
        let mut ops = Vec::new();
        // Records without claims gathered by stream, as the single node writes them; a job with
        // claims stays an op of its own (a refused claim skips its op's records only), after
        // its stream's gathered records, as a checkpoint does.
        let mut gathered = Gathered::default();
        for job in batch {
            match job {
                Job::Append(a) => {
                    let r = self.halt.check();
                    if r.is_ok() {
                        w.count(&a.entries);
                        if a.claims.is_empty() {
                            gathered.add(a.stream, a.entries);
                        } else {
                            ops.extend(gathered.take(a.stream.name()).map(append_op));
                            ops.push(Op::Append {
                                stream: a.stream.name().to_owned(),
                                entries: a.entries,
                                claims: a.claims,
                            });
                        }
                    }
                    w.completions.push((a.done, r));
                }
                Job::Checkpoint { stream, upto, blob } => {
                    if self.halt.check().is_ok() {
                        ops.extend(gathered.take(stream.name()).map(append_op));
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
        ops.extend(gathered.streams.drain(..).map(append_op));
        (ops, w)
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

    /// Writes every job of a batch (nothing durable yet). The records of one stream are gathered
    /// from all of the batch's jobs and written together (one [`StreamSink::append_batch`], so
    /// as few chunks as their bytes need): a section's job often carries a single hold, and a
    /// value per job would be a sled insert per record again. A checkpoint is written after
    /// its stream's records queued before it. Any failure halts the store, which fails every
    /// completion of the batch ([`Flusher::finish`]).
    fn write(&mut self, batch: Vec<Job>) -> Written {
        let mut w = Written::default();
        let mut gathered = Gathered::default();
        for job in batch {
            match job {
                Job::Append(a) => {
                    let r = self.halt.check().and_then(|()| self.claim(&a.claims));
                    if r.is_ok() {
                        w.count(&a.entries);
                        gathered.add(a.stream, a.entries);
                    }
                    w.completions.push((a.done, r));
                }
                Job::Checkpoint { stream, upto, blob } => {
                    // Its stream's records first, the others' still gathering.
                    if let Some(records) = gathered.take(stream.name()) {
                        self.append_stream(records);
                    }
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
        for records in gathered.streams {
            self.append_stream(records);
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

    /// Takes a job's sold-seat claims; a refused or failed one halts the store.
    fn claim(&mut self, claims: &[(String, Vec<u8>)]) -> Result<(), StorageError> {
        let result = self.take_claims(claims);
        if let Err(e) = &result {
            self.halt.set(e.to_string());
        }
        result
    }

    fn take_claims(&mut self, claims: &[(String, Vec<u8>)]) -> Result<(), StorageError> {
        for (key, value) in claims {
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
        Ok(())
    }

    /// Writes one stream's gathered records and raises its mark; after a halt nothing, and a
    /// failure halts the store (nothing more is written).
    fn append_stream(&mut self, (stream, entries): StreamRecords) {
        if self.halt.check().is_err() {
            return;
        }
        match stream.append_batch(&entries) {
            Ok(()) => {
                if let Some((last, _)) = entries.last() {
                    self.marks.raise(stream.name(), *last);
                    self.dirty = true;
                }
            }
            Err(e) => self.halt.set(e.to_string()),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Kv, KvSink, SimKv};

    fn flusher(sink: Arc<dyn LogSink>) -> Flusher {
        let changes = ChangeLog::open(sink.as_ref(), std::time::Duration::MAX, 0).unwrap();
        Flusher {
            sink,
            durability: Durability::Sync,
            halt: Arc::new(Halt::default()),
            compact: mpsc::unbounded_channel().0,
            marks: Marks::default(),
            dirty: false,
            ack: None,
            acker: None,
            replicate: None,
            changes,
        }
    }

    /// A job of one small record, as a section's job with a single hold is.
    fn one(stream: &Arc<dyn StreamSink>, seq: u64) -> Job {
        Job::Append(Append {
            stream: stream.clone(),
            entries: vec![(seq, crate::codec::encode(&format!("record {seq}")))],
            claims: Vec::new(),
            changes: None,
            done: Box::new(|_| {}),
            traces: Vec::new(),
        })
    }

    /// A batch of 200 one-record jobs from two streams, interleaved, with a checkpoint of the
    /// first stream in the middle: each stream's records are written as a few chunks (not a
    /// value per job), the first stream's records queued before its checkpoint are written
    /// before it, every record reads back in order, and both marks are raised.
    #[test]
    fn a_batch_writes_each_streams_records_together() {
        let kv = Arc::new(SimKv::new());
        let sink: Arc<dyn LogSink> = Arc::new(KvSink::new(kv.clone()).unwrap());
        let (a, b) = (sink.stream("a").unwrap(), sink.stream("b").unwrap());
        let mut batch = Vec::new();
        for seq in 1..=100 {
            batch.push(one(&a, seq));
            batch.push(one(&b, seq));
            if seq == 50 {
                batch.push(Job::Checkpoint {
                    stream: a.clone(),
                    upto: 50,
                    blob: vec![7],
                });
            }
        }
        let mut f = flusher(sink.clone());
        let written = f.write(batch);
        assert_eq!(written.records, 200);
        assert_eq!(written.completions.len(), 200);
        assert!(written.completions.iter().all(|(_, r)| r.is_ok()));
        assert_eq!(written.compactions.len(), 1);
        assert!(f.halt.check().is_ok());
        for (name, stream) in [("a", &a), ("b", &b)] {
            let values = kv.tree(name).unwrap().pairs().unwrap();
            // 100 records of about 20 bytes: a single chunk each for `b`, and `a` cut in two
            // by its checkpoint.
            let most = if name == "a" { 2 } else { 1 };
            assert!(
                values.len() <= most,
                "stream {name}: {} values for 100 records of one batch",
                values.len()
            );
            let read: Vec<u64> = stream.read_after(0).unwrap().iter().map(|r| r.0).collect();
            assert_eq!(read, (1..=100).collect::<Vec<_>>());
            assert_eq!(f.marks.of(name), 100);
        }
        // The checkpoint's records were written before it: the first chunk ends at 50.
        let first = kv.tree("a").unwrap().pairs().unwrap()[0].0.clone();
        assert_eq!(first, 50u64.to_be_bytes().to_vec());
    }

    /// A halt in the middle of a batch (a refused claim) writes nothing after it.
    #[test]
    fn a_refused_claim_halts_the_batch() {
        let kv = Arc::new(SimKv::new());
        let sink: Arc<dyn LogSink> = Arc::new(KvSink::new(kv.clone()).unwrap());
        sink.claim("seat-1", b"hold-x").unwrap();
        let a = sink.stream("a").unwrap();
        let mut refused = one(&a, 2);
        if let Job::Append(job) = &mut refused {
            job.claims = vec![("seat-1".into(), b"hold-y".to_vec())];
        }
        let mut f = flusher(sink.clone());
        let written = f.write(vec![one(&a, 1), refused, one(&a, 3)]);
        assert!(f.halt.check().is_err());
        assert!(written.completions[1].1.is_err());
        assert!(written.completions[2].1.is_err());
        assert!(kv.tree("a").unwrap().pairs().unwrap().is_empty());
    }

    /// A leader's batch: claim-free records gathered into one op per stream; a job with claims
    /// an op of its own after its stream's records queued before it (so a refused claim skips
    /// its own records only, and a stream's records stay in order), a checkpoint likewise.
    #[test]
    fn a_replicated_batch_gathers_records_without_claims() {
        let sink: Arc<dyn LogSink> = Arc::new(KvSink::new(Arc::new(SimKv::new())).unwrap());
        let (a, b) = (sink.stream("a").unwrap(), sink.stream("b").unwrap());
        let mut claimed = one(&a, 3);
        if let Job::Append(job) = &mut claimed {
            job.claims = vec![("seat-1".into(), b"hold-3".to_vec())];
        }
        let batch = vec![
            one(&a, 1),
            one(&b, 1),
            one(&a, 2),
            claimed,
            one(&b, 2),
            one(&a, 4),
            Job::Checkpoint {
                stream: b.clone(),
                upto: 2,
                blob: vec![1],
            },
            one(&a, 5),
            one(&b, 3),
        ];
        let (ops, w) = flusher(sink).ops_of(batch);
        assert_eq!(w.records, 8);
        assert_eq!(w.completions.len(), 8);
        let shape: Vec<(String, Vec<u64>, usize)> = ops
            .iter()
            .map(|op| match op {
                Op::Append {
                    stream,
                    entries,
                    claims,
                } => (
                    stream.clone(),
                    entries.iter().map(|(q, _)| *q).collect(),
                    claims.len(),
                ),
                Op::Checkpoint { stream, upto, .. } => {
                    (format!("checkpoint {stream}"), vec![*upto], 0)
                }
                Op::Put { .. } => ("put".into(), Vec::new(), 0),
            })
            .collect();
        let op = |s: &str, q: &[u64], c: usize| (s.to_owned(), q.to_vec(), c);
        assert_eq!(
            shape,
            [
                op("a", &[1, 2], 0),
                op("a", &[3], 1),
                op("b", &[1, 2], 0),
                op("checkpoint b", &[2], 0),
                op("a", &[4, 5], 0),
                op("b", &[3], 0),
            ]
        );
    }
}
