//! Expiry throughput: 200,000 due holds (the seeds' peak of held seats) released by the sweeper
//! while booking goes on elsewhere. Reports how long the backlog takes, the expiry rate, and the
//! booking path's hold latency before and during the drain.
//!
//! `BOXOFFICE_BENCH_DUE=N` changes the backlog (default 200,000). Time is a manual clock: the
//! backlog becomes due in one step, then the sweeper is poked once and left alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use boxoffice_engine::{
    Durability, Engine, EngineConfig, EventId, HoldRequest, ManualClock, SectionId, Selection,
    UserId,
};
use boxoffice_sweeper::{SweeperConfig, SweeperMsg};
use hdrhistogram::Histogram;

const T0_MS: u64 = 1_767_225_600_000;

fn due() -> usize {
    std::env::var("BOXOFFICE_BENCH_DUE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
}

async fn place(engine: &Engine, event: &str, sections: usize, n: usize, prefix: &str) {
    let mut tasks = Vec::new();
    for t in 0..64 {
        let engine = engine.clone();
        let (event, prefix) = (event.to_owned(), prefix.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while i < n {
                engine
                    .hold(HoldRequest {
                        event_id: EventId::from(event.as_str()),
                        user_id: UserId(format!("{prefix}{}", i / 100)),
                        idempotency_key: String::new(),
                        selection: Selection::BestAvailable {
                            section: Some(SectionId(format!("s{:02}", i % sections))),
                            quantity: 1,
                        },
                        access_code: String::new(),
                    })
                    .await
                    .expect("hold");
                i += 64;
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
}

/// Holds on the `live` event from 32 tasks until `stop`; returns their latency histogram.
async fn booking_load(engine: Engine, stop: Arc<AtomicBool>, tag: &'static str) -> Histogram<u64> {
    let mut tasks = Vec::new();
    for t in 0..32u64 {
        let (engine, stop) = (engine.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let r = engine
                    .hold(HoldRequest {
                        event_id: EventId::from("live"),
                        user_id: UserId(format!("{tag}-{t}-{}", i / 100)),
                        idempotency_key: String::new(),
                        selection: Selection::BestAvailable {
                            section: Some(SectionId(format!("s{:02}", i % 16))),
                            quantity: 1,
                        },
                        access_code: String::new(),
                    })
                    .await;
                if r.is_ok() {
                    let _ = h.record(
                        u64::try_from(started.elapsed().as_micros())
                            .unwrap_or(u64::MAX)
                            .max(1),
                    );
                }
                i += 1;
            }
            h
        }));
    }
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    for t in tasks {
        let _ = all.add(t.await.expect("task"));
    }
    all
}

fn main() {
    boxoffice_drill::memory::keep_off_huge_pages();
    let n = due();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(ManualClock::new(T0_MS));
        let mut cfg = EngineConfig::new(dir.path());
        cfg.clock = clock.clone();
        cfg.durability = Durability::Sync;
        cfg.section_inflight_max = 1_000_000;
        let engine = Engine::open(cfg).await.expect("engine");
        let spec = |id: &str, capacity: u32, ttl_ms: u64| {
            let mut s = boxoffice_benches::ga_event(&EventId::from(id), 16, capacity);
            s.hold_ttl_ms = ttl_ms;
            s
        };
        let per_section = u32::try_from(n.div_ceil(16)).expect("fits");
        engine.create_event(spec("backlog", per_section, 60_000)).await.expect("event");
        engine.create_event(spec("live", 1_000_000, 86_400_000)).await.expect("event");
        let started = Instant::now();
        place(&engine, "backlog", 16, n, "b").await;
        eprintln!("EXPIRY setup: {n} holds placed in {:.2} s", started.elapsed().as_secs_f64());
        let (sweeper, _) = boxoffice_sweeper::start(engine.clone(), SweeperConfig::default())
            .await
            .expect("sweeper");

        // Hold latency with no backlog.
        let stop = Arc::new(AtomicBool::new(false));
        let load = tokio::spawn(booking_load(engine.clone(), stop.clone(), "before"));
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, Ordering::Relaxed);
        let before = load.await.expect("load");

        // Everything becomes due at once; booking goes on while the sweeper drains it.
        clock.advance_ms(60_000);
        let stop = Arc::new(AtomicBool::new(false));
        let load = tokio::spawn(booking_load(engine.clone(), stop.clone(), "during"));
        let drain = Instant::now();
        sweeper.cast(SweeperMsg::Sweep).expect("poke");
        let backlog = EventId::from("backlog");
        loop {
            let held: u32 = engine
                .event(&backlog)
                .expect("event")
                .sections
                .iter()
                .map(|s| s.held)
                .sum();
            if held == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let drained = drain.elapsed();
        stop.store(true, Ordering::Relaxed);
        let during = load.await.expect("load");
        let stats = boxoffice_sweeper::sync(&sweeper).await.expect("stats");
        eprintln!(
            "EXPIRY {} due holds released in {:.2} s = {:.0} expiries/s (sweeper counted {}); \
             hold latency before: {} holds p50 {} us p99 {} us max {} us; during the drain: {} holds p50 {} us p99 {} us max {} us",
            n,
            drained.as_secs_f64(),
            n as f64 / drained.as_secs_f64(),
            stats.expired,
            before.len(),
            before.value_at_quantile(0.5),
            before.value_at_quantile(0.99),
            before.max(),
            during.len(),
            during.value_at_quantile(0.5),
            during.value_at_quantile(0.99),
            during.max(),
        );
        sweeper.stop(None);
        engine.shutdown().await;
    });
}
