//! Holds per second through the [`Engine`]: validation, the user's ledger shard (reserve quota,
//! settle), the section actor, the sled log with group commit, and back.
//!
//! Matrix: 1, 64 and 1,024 concurrent callers x 1 or 16 sections x `Durability::Sync` and
//! `Buffered`. One criterion iteration is a batch of `N` holds (`Selection::BestAvailable` of one
//! place, a fresh user per hold, sections taken round robin) issued by `C` tokio tasks, each
//! holding its share one after the other; throughput is reported per hold.
//!
//! Sections are general admission of 1,000,000 places; an engine (on a fresh temporary dir) is
//! replaced, outside the timed region, before a batch could run out of places or once it has
//! taken `HOLDS_PER_ENGINE_MAX` holds. The runtime is multi-thread with 2 workers; the log's
//! flusher is its own OS thread. Engines checkpoint every 100,000 records per stream (the
//! engine's default); `BOXOFFICE_BENCH_CHECKPOINT_EVERY=never` (or a number) changes that.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use boxoffice_benches::{bench_config, ga_event, open, runtime, section_ids, short};
use boxoffice_engine::{
    Durability, Engine, EventId, HoldRequest, HoldStatus, SECTION_CAPACITY_MAX, SectionId,
    Selection, UserId,
};
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};

/// Holds one engine takes before it is replaced (bounds memory and the size of checkpoints).
const HOLDS_PER_ENGINE_MAX: u64 = 1_000_000;

/// The engines' checkpoint interval: the engine's default (100,000 records per stream), or
/// `BOXOFFICE_BENCH_CHECKPOINT_EVERY` (`never` for none) to see what checkpoints cost.
fn checkpoint_every() -> u64 {
    match std::env::var("BOXOFFICE_BENCH_CHECKPOINT_EVERY") {
        Ok(v) if v == "never" => u64::MAX,
        Ok(v) => v
            .parse()
            .expect("BOXOFFICE_BENCH_CHECKPOINT_EVERY is a number of records or `never`"),
        Err(_) => 100_000,
    }
}

/// Holds per criterion iteration for `callers` concurrent callers.
fn batch_size(callers: usize) -> usize {
    match callers {
        1 => 256,
        c => (c * 8).max(2_048),
    }
}

/// An engine with one event, and how much of it the bench has used.
struct Rig {
    _dir: tempfile::TempDir,
    engine: Engine,
    event_id: EventId,
    sections: Vec<SectionId>,
    /// Holds placed on this engine (spread evenly over the sections).
    placed: u64,
}

impl Rig {
    async fn new(sections: usize, durability: Durability, generation: u64) -> Rig {
        let dir = tempfile::tempdir().expect("a temporary dir");
        let engine = open(bench_config(dir.path(), durability, checkpoint_every())).await;
        let event_id = EventId(format!("bench{generation}"));
        engine
            .create_event(ga_event(&event_id, sections, SECTION_CAPACITY_MAX))
            .await
            .expect("the bench event is valid");
        Rig {
            _dir: dir,
            engine,
            event_id,
            sections: section_ids(sections),
            placed: 0,
        }
    }

    /// Whether `batch` more holds fit in every section and under the engine's budget.
    fn fits(&self, batch: u64) -> bool {
        let per_section = (self.placed + batch).div_ceil(self.sections.len() as u64);
        per_section <= u64::from(SECTION_CAPACITY_MAX)
            && self.placed + batch <= HOLDS_PER_ENGINE_MAX
    }
}

/// The bench state kept across criterion's calls.
struct Bench {
    sections: usize,
    durability: Durability,
    callers: usize,
    rig: Option<Rig>,
    /// Engines made so far (each event gets a new id) and users made so far (one per hold).
    generation: u64,
    next_user: u64,
}

impl Bench {
    /// Runs `iters` batches and returns the time spent in them (not in making engines).
    async fn run(&mut self, iters: u64) -> Duration {
        let batch = batch_size(self.callers);
        let per_caller = batch / self.callers;
        let mut timed = Duration::ZERO;
        for _ in 0..iters {
            let rig = match self.rig.take() {
                Some(rig) if rig.fits(batch as u64) => rig,
                old => {
                    if let Some(old) = old {
                        old.engine.shutdown().await;
                    }
                    self.generation += 1;
                    Rig::new(self.sections, self.durability, self.generation).await
                }
            };
            // The requests are made before the clock starts: callers have them ready.
            let mut shares: Vec<Vec<HoldRequest>> = (0..self.callers)
                .map(|_| Vec::with_capacity(per_caller))
                .collect();
            for i in 0..batch {
                let section = rig.sections[(rig.placed as usize + i) % rig.sections.len()].clone();
                shares[i % self.callers].push(HoldRequest {
                    event_id: rig.event_id.clone(),
                    user_id: UserId(format!("fan-{}", self.next_user)),
                    idempotency_key: String::new(),
                    selection: Selection::BestAvailable {
                        section: Some(section),
                        quantity: 1,
                    },
                    access_code: String::new(),
                });
                self.next_user += 1;
            }
            let started = Instant::now();
            let tasks: Vec<_> = shares
                .into_iter()
                .map(|share| {
                    let engine = rig.engine.clone();
                    tokio::spawn(async move {
                        for req in share {
                            match engine.hold(req).await {
                                Ok(v) => assert_eq!(v.status, HoldStatus::Held),
                                Err(e) => panic!("a bench hold failed: {e}"),
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("a caller task panicked");
            }
            timed += started.elapsed();
            let mut rig = rig;
            rig.placed += batch as u64;
            self.rig = Some(rig);
        }
        timed
    }
}

fn actor_holds(c: &mut Criterion) {
    let rt = runtime();
    for durability in [Durability::Sync, Durability::Buffered] {
        let mut group = c.benchmark_group(format!("actor_holds/{durability:?}"));
        short(&mut group);
        // Longer than the other benches: a sample that meets a checkpoint is much slower.
        group.measurement_time(Duration::from_secs(5));
        group.sampling_mode(SamplingMode::Flat);
        for sections in [1usize, 16] {
            for callers in [1usize, 64, 1_024] {
                group.throughput(Throughput::Elements(batch_size(callers) as u64));
                let bench = Rc::new(RefCell::new(Some(Bench {
                    sections,
                    durability,
                    callers,
                    rig: None,
                    generation: 0,
                    next_user: 0,
                })));
                let id =
                    BenchmarkId::new(format!("sections_{sections}"), format!("callers_{callers}"));
                group.bench_function(id, |b| {
                    b.to_async(&rt).iter_custom(|iters| {
                        let bench = bench.clone();
                        async move {
                            // Out of the cell for the duration of the run: no borrow across awaits.
                            let mut state = bench.take().expect("the bench state is home");
                            let timed = state.run(iters).await;
                            bench.replace(Some(state));
                            timed
                        }
                    });
                });
                let rig = bench.take().and_then(|mut state| state.rig.take());
                if let Some(rig) = rig {
                    rt.block_on(rig.engine.shutdown());
                }
            }
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = boxoffice_benches::criterion();
    targets = actor_holds
}
criterion_main!(benches);
