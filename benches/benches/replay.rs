//! Restart time: how long `Engine::open` takes to rebuild a sale from its log.
//!
//! Setup (untimed): an engine in `Buffered` mode writes a log of `R` records, `R` = 100,000 by
//! default and 1,000,000 with `BOXOFFICE_BENCH_FULL=1`, into one event of 4 general-admission
//! sections: 256 concurrent fans each hold one place (with an idempotency key), and of every 4
//! holds one is confirmed (with a key), one released and two left held. So the log has
//! `HoldPlaced`, `HoldConfirmed` and `HoldReleased` records, sold-seat claims and idempotency
//! tags to rebuild. Then a clean shutdown.
//!
//! Two logs are written: one with a checkpoint every `R / 10` records per stream (10,000 by
//! default, 100,000 in the full run) and one without checkpoints (`u64::MAX`). With
//! `BOXOFFICE_BENCH_REPLAY_DIR` set, both are kept under that dir and a later run opens them
//! instead of writing them again (each dir's `replay-bench-written` marks a log written to the
//! end; a build that changes what the log holds needs a fresh dir).
//!
//! Measured: `Engine::open` on the data dir (sled's own recovery, reading every stream,
//! replaying the records into the cores, rebuilding ledgers and the sold-seat backstop,
//! starting the actors). Criterion's throughput is log records per second (the records the
//! log stands for, checkpointed or not); the lines printed to stderr also give the records
//! actually replayed and the restart time.

use std::time::{Duration, Instant};

use boxoffice_benches::{
    bench_config, full_run, ga_event, open, per_second, runtime, section_ids, short, thousands,
};
use boxoffice_engine::{
    ConfirmRequest, Durability, EngineConfig, EventId, HoldRequest, SECTION_CAPACITY_MAX,
    Selection, UserId,
};
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};

const SECTIONS: usize = 4;
const WRITERS: u64 = 256;

/// Log records written by fans `0..units` (plus the catalog's `EventCreated`).
fn records_of(units: u64) -> u64 {
    // Unit u holds; u % 4 == 0 also confirms, u % 4 == 1 also releases.
    let confirms = units.div_ceil(4);
    let releases = (units + 2) / 4;
    1 + units + confirms + releases
}

/// How many fans it takes to write at least `records` records.
fn units_for(records: u64) -> u64 {
    let mut units = records * 2 / 3;
    while records_of(units) < records {
        units += 1;
    }
    units
}

/// A data dir holding a log of about `records` records, and what it took to write.
struct Log {
    dir: LogDir,
    records: u64,
    checkpoint_every: u64,
}

/// Where a log is kept: a temporary dir, or one under `BOXOFFICE_BENCH_REPLAY_DIR` that
/// outlives the run (so profiling the opens does not mean writing the log again).
enum LogDir {
    Temporary(tempfile::TempDir),
    Kept(std::path::PathBuf),
}

impl LogDir {
    fn path(&self) -> &std::path::Path {
        match self {
            LogDir::Temporary(dir) => dir.path(),
            LogDir::Kept(path) => path,
        }
    }
}

/// The marker of a kept log written to the end (its record count inside).
const WRITTEN: &str = "replay-bench-written";

/// The log of `records` records checkpointed every `checkpoint_every`: the one kept under
/// `BOXOFFICE_BENCH_REPLAY_DIR` if it was written to the end, else a new one (kept there if the
/// variable is set).
async fn log_of(records: u64, checkpoint_every: u64) -> Log {
    let dir = match std::env::var("BOXOFFICE_BENCH_REPLAY_DIR") {
        Err(_) => LogDir::Temporary(tempfile::tempdir().expect("a temporary dir")),
        Ok(root) => LogDir::Kept(std::path::Path::new(&root).join(format!(
            "records_{records}_every_{}",
            checkpoint_label(checkpoint_every)
        ))),
    };
    let kept = std::fs::read_to_string(dir.path().join(WRITTEN))
        .ok()
        .and_then(|n| n.trim().parse::<u64>().ok());
    let records = match kept {
        Some(n) => {
            eprintln!(
                "replay setup: the log kept in {} ({n} records)",
                dir.path().display()
            );
            n
        }
        None => {
            if let LogDir::Kept(path) = &dir {
                let _ = std::fs::remove_dir_all(path);
                std::fs::create_dir_all(path).expect("the kept log's dir");
            }
            let n = write_log(dir.path(), records, checkpoint_every).await;
            std::fs::write(dir.path().join(WRITTEN), n.to_string()).expect("the log's marker");
            n
        }
    };
    Log {
        dir,
        records,
        checkpoint_every,
    }
}

/// Writes a log of about `records` records into `dir`; returns how many it wrote.
async fn write_log(dir: &std::path::Path, records: u64, checkpoint_every: u64) -> u64 {
    let engine = open(bench_config(dir, Durability::Buffered, checkpoint_every)).await;
    let event_id = EventId::from("replay");
    engine
        .create_event(ga_event(&event_id, SECTIONS, SECTION_CAPACITY_MAX))
        .await
        .expect("the bench event is valid");
    let sections = section_ids(SECTIONS);
    let units = units_for(records);
    let started = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let engine = engine.clone();
            let event_id = event_id.clone();
            let sections = sections.clone();
            tokio::spawn(async move {
                for u in (w..units).step_by(WRITERS as usize) {
                    let user_id = UserId(format!("fan-{u}"));
                    let section = sections[(u / 4) as usize % SECTIONS].clone();
                    let hold = engine
                        .hold(HoldRequest {
                            event_id: event_id.clone(),
                            user_id: user_id.clone(),
                            idempotency_key: format!("hold-{u}"),
                            selection: Selection::BestAvailable {
                                section: Some(section),
                                quantity: 1,
                            },
                            access_code: String::new(),
                        })
                        .await
                        .expect("a replay-bench hold");
                    match u % 4 {
                        0 => {
                            engine
                                .confirm(ConfirmRequest {
                                    hold_id: hold.hold_id,
                                    user_id,
                                    payment_ref: format!("tok_{u}"),
                                    idempotency_key: format!("pay-{u}"),
                                })
                                .await
                                .expect("a replay-bench confirm");
                        }
                        1 => {
                            engine
                                .release(&hold.hold_id, &user_id)
                                .await
                                .expect("a replay-bench release");
                        }
                        _ => {}
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a writer task panicked");
    }
    let written = started.elapsed();
    engine.shutdown().await;
    let records = records_of(units);
    eprintln!(
        "replay setup: wrote {} records ({} holds) in {:.2} s ({} records/s, Buffered), \
         checkpoint every {}, {} MiB on disk",
        thousands(records),
        thousands(units),
        written.as_secs_f64(),
        per_second(records, written),
        checkpoint_label(checkpoint_every),
        dir_size(dir) / (1 << 20),
    );
    records
}

fn checkpoint_label(every: u64) -> String {
    if every == u64::MAX {
        "never".into()
    } else {
        thousands(every)
    }
}

fn dir_size(path: &std::path::Path) -> u64 {
    boxoffice_engine::store::disk_usage(path).total
}

/// Restart times seen for one log, for the summary line.
#[derive(Default)]
struct Restarts {
    opens: u32,
    total: Duration,
    best: Option<Duration>,
    replayed: u64,
    checkpoints_loaded: usize,
}

impl Restarts {
    fn config(log: &Log) -> EngineConfig {
        bench_config(log.dir.path(), Durability::Sync, log.checkpoint_every)
    }

    /// Opens the engine `iters` times, returning the time spent in `Engine::open`.
    async fn run(&mut self, log: &Log, iters: u64) -> Duration {
        let mut timed = Duration::ZERO;
        for _ in 0..iters {
            let started = Instant::now();
            let engine = open(Self::config(log)).await;
            let took = started.elapsed();
            timed += took;
            let report = engine.recovery_report();
            assert_eq!(report.events, 1);
            assert_eq!(report.sections, SECTIONS);
            assert_eq!(report.torn_tails_dropped, 0);
            if self.opens == 0 {
                eprintln!(
                    "replay open ({} records, checkpoint every {}): {:.1} ms; replayed {} \
                     records ({} records/s), {} checkpoints loaded; engine's own report {} ms",
                    thousands(log.records),
                    checkpoint_label(log.checkpoint_every),
                    took.as_secs_f64() * 1e3,
                    thousands(report.records_replayed),
                    per_second(report.records_replayed, took),
                    report.checkpoints_loaded,
                    report.duration_ms,
                );
            }
            self.opens += 1;
            self.total += took;
            self.best = Some(self.best.map_or(took, |b| b.min(took)));
            self.replayed = report.records_replayed;
            self.checkpoints_loaded = report.checkpoints_loaded;
            engine.shutdown().await;
        }
        timed
    }

    fn summary(&self, log: &Log) {
        if self.opens == 0 {
            return;
        }
        let mean = self.total / self.opens;
        eprintln!(
            "RESTART {} records, checkpoint every {}: mean {:.1} ms, best {:.1} ms over {} opens \
             = {} log records/s; {} records replayed ({} replayed/s), {} checkpoints loaded",
            thousands(log.records),
            checkpoint_label(log.checkpoint_every),
            mean.as_secs_f64() * 1e3,
            self.best.unwrap_or_default().as_secs_f64() * 1e3,
            self.opens,
            per_second(log.records, mean),
            thousands(self.replayed),
            per_second(self.replayed, mean),
            self.checkpoints_loaded,
        );
    }
}

fn restart(c: &mut Criterion) {
    let rt = runtime();
    let records: u64 = if full_run() { 1_000_000 } else { 100_000 };
    let mut group = c.benchmark_group("replay_open");
    short(&mut group);
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(records));
    for checkpoint_every in [records / 10, u64::MAX] {
        let log = rt.block_on(log_of(records, checkpoint_every));
        let mut restarts = Restarts::default();
        let id = BenchmarkId::new(
            format!("records_{records}"),
            if checkpoint_every == u64::MAX {
                "no_checkpoint".to_owned()
            } else {
                format!("checkpoint_every_{checkpoint_every}")
            },
        );
        group.bench_function(id, |b| {
            b.iter_custom(|iters| rt.block_on(restarts.run(&log, iters)));
        });
        restarts.summary(&log);
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = boxoffice_benches::criterion();
    targets = restart
}
criterion_main!(benches);
