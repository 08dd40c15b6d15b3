//! Waiting-room benchmarks: memory per waiting fan for 1,000,000 fans, and the cost of a
//! `GetStatus`-style poll and of a join.
//!
//! Memory is reported two ways: the room's own accounting of its heap (`memory_bytes`, from the
//! capacities it holds), and the growth of the process's resident set while the fans join.

use std::hint::black_box;
use std::time::Instant;

use boxoffice_gateway::waiting_room::{Admitter, RoomConfig, WaitingRoom};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn rss_bytes() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn config(opens_at_ms: u64) -> RoomConfig {
    RoomConfig {
        opens_at_ms,
        admit_rate_per_second: 500,
        admission_window_ms: 120_000,
        queue_max: 2_000_000,
        seed: [9; 32],
    }
}

fn fans() -> u32 {
    std::env::var("BOXOFFICE_BENCH_FANS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

fn memory_per_fan(_c: &mut Criterion) {
    let n = fans();
    let before = rss_bytes();
    let started = Instant::now();
    // Everyone joins before the opening (the worst case: they all get a drawn position too).
    let room = WaitingRoom::new(config(1_000), 0);
    for u in 0..n {
        room.join(&format!("user-{u}"), "session")
            .expect("room has space");
    }
    let joined = started.elapsed();
    let drawn = Instant::now();
    let mut admitter = Admitter::new();
    admitter.step(&room, 1_000);
    let draw_time = drawn.elapsed();
    // Admit 30 s worth, as after the opening burst.
    for t in 1..=1_500u64 {
        admitter.step(&room, 1_000 + t * 20);
    }
    let after = rss_bytes();
    let accounted = room.memory_bytes();
    eprintln!(
        "WAITING ROOM {n} fans: joined in {:.2} s ({:.0} joins/s), opening draw {:.1} ms, {} admitted; \
         heap accounted {:.1} MiB = {:.1} bytes/fan; RSS growth {} = {} bytes/fan",
        joined.as_secs_f64(),
        f64::from(n) / joined.as_secs_f64(),
        draw_time.as_secs_f64() * 1000.0,
        room.admitted(),
        accounted as f64 / (1024.0 * 1024.0),
        accounted as f64 / f64::from(n),
        match (before, after) {
            (Some(b), Some(a)) => format!(
                "{:.1} MiB",
                (a.saturating_sub(b)) as f64 / (1024.0 * 1024.0)
            ),
            _ => "n/a".into(),
        },
        match (before, after) {
            (Some(b), Some(a)) => format!("{:.1}", (a.saturating_sub(b)) as f64 / f64::from(n)),
            _ => "n/a".into(),
        },
    );
    black_box(&room);
}

fn polls_and_joins(c: &mut Criterion) {
    let room = WaitingRoom::new(config(0), 0);
    for u in 0..100_000u32 {
        room.join(&format!("user-{u}"), "s").expect("space");
    }
    let mut admitter = Admitter::new();
    admitter.step(&room, 0);
    for t in 1..=100u64 {
        admitter.step(&room, t * 20);
    }
    let mut g = c.benchmark_group("waiting_room");
    g.throughput(Throughput::Elements(1));
    let mut j = 0u32;
    g.bench_function("status_poll", |b| {
        b.iter(|| {
            j = (j + 7919) % 100_000;
            black_box(room.standing(black_box(j), 2_500))
        })
    });
    let mut k = 0u64;
    g.bench_function("join", |b| {
        let room = WaitingRoom::new(config(0), 0);
        b.iter(|| {
            k += 1;
            if room.len() >= 1_900_000 {
                return None;
            }
            black_box(room.join(&format!("fan-{k}"), "s").ok())
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = boxoffice_benches::criterion().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = memory_per_fan, polls_and_joins
}
criterion_main!(benches);
