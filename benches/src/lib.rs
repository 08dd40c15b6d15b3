//! Shared helpers of the boxoffice criterion benchmarks (`benches/benches/*.rs`).
//!
//! - `core`: the pure [`SectionCore`](boxoffice_engine::SectionCore), holds/s per kind of hold;
//! - `actors`: holds/s through the [`Engine`] (ledger + section actors + sled log), 1, 64 and
//!   1,024 concurrent callers, 1 or 16 sections, `Durability::Sync` and `Buffered`;
//! - `replay`: restart (recovery) time and records/s for a log of 100,000 records
//!   (1,000,000 with `BOXOFFICE_BENCH_FULL=1`), with and without checkpoints;
//! - `waiting_room`: bytes per waiting fan for 1,000,000 fans, poll and join cost;
//! - `grpc`: the end-to-end gRPC path against an embedded server ([`grpc_server`]);
//! - `pow`: the join proof of work: a client's solve time by difficulty, the server's check.
//!
//! Not a criterion bench: [`compare`] (the `compare` binary, `benches/compare.sh`), boxoffice
//! against the seeds' design (a booking front on Redis with a reserve Lua script), one flash
//! sale played against each.
//!
//! Results and the machine they were measured on are in `BENCHMARKS.md` at the workspace root.

pub mod compare;

/// The allocator of every bench and of `compare`: the `boxoffice` binary's (mimalloc's
/// per-thread heaps), so the engine is measured as it ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Every criterion bench's configuration: this process kept off transparent huge pages first,
/// as the `boxoffice` binary keeps itself
/// ([`keep_off_huge_pages`](boxoffice_drill::memory::keep_off_huge_pages)), then criterion's
/// defaults.
pub fn criterion() -> criterion::Criterion {
    boxoffice_drill::memory::keep_off_huge_pages();
    criterion::Criterion::default()
}

use std::path::Path;
use std::time::Duration;

use boxoffice_engine::{
    Durability, Engine, EngineConfig, EventId, EventSpec, HOLD_TTL_MS_MAX, Layout, SectionId,
    SectionSpec,
};

/// Whether the long variants were asked for (`BOXOFFICE_BENCH_FULL=1`).
pub fn full_run() -> bool {
    std::env::var("BOXOFFICE_BENCH_FULL").is_ok_and(|v| v == "1")
}

/// The ids of `n` sections: `s00`, `s01`, ...
pub fn section_ids(n: usize) -> Vec<SectionId> {
    (0..n).map(|i| SectionId(format!("s{i:02}"))).collect()
}

/// An event of `sections` general-admission sections of `capacity` places each, a per-user
/// limit of 100 (the highest allowed) and the longest hold TTL (one day), so nothing expires
/// while a bench runs.
pub fn ga_event(event_id: &EventId, sections: usize, capacity: u32) -> EventSpec {
    EventSpec {
        event_id: Some(event_id.clone()),
        name: "bench".into(),
        sections: section_ids(sections)
            .into_iter()
            .map(|section_id| SectionSpec {
                name: section_id.to_string(),
                section_id,
                price_cents: 5_000,
                layout: Layout::GeneralAdmission { capacity },
                price_tiers: Vec::new(),
            })
            .collect(),
        hold_ttl_ms: HOLD_TTL_MS_MAX,
        per_user_limit: 100,
        admit_rate_per_second: 0,
        admission_window_ms: 0,
        sale_opens_at_ms: 0,
        join_pow_difficulty_bits: 0,
        cancellation_deadline_ms: 0,
        transfers_disabled: false,
        presale: Default::default(),
    }
}

/// An engine configuration for benches: the given durability, a section queue bound high
/// enough that no request is shed, the given checkpoint interval.
pub fn bench_config(dir: &Path, durability: Durability, checkpoint_every: u64) -> EngineConfig {
    let mut config = EngineConfig::new(dir);
    config.durability = durability;
    config.section_inflight_max = 100_000;
    config.checkpoint_every_records = checkpoint_every;
    config
}

/// Opens an engine on `dir`, panicking with the error (a bench cannot go on without it).
pub async fn open(config: EngineConfig) -> Engine {
    match Engine::open(config).await {
        Ok(engine) => engine,
        Err(e) => panic!("cannot open the engine: {e}"),
    }
}

/// The tokio runtime every engine bench uses: multi-thread, 2 workers (one per core here).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Short default runs: `cargo bench -p boxoffice-benches` finishes in a few minutes.
pub fn short(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
}

/// `n` per second, formatted with thousands separators (`123,456`).
pub fn per_second(n: u64, d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs == 0.0 {
        return "inf".into();
    }
    thousands((n as f64 / secs).round() as u64)
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// An embedded gRPC server for the benches (`Durability::Sync`, loopback, admin key
/// `bench-admin`, no metrics endpoint, no periodic reconciliation) on a temporary data dir,
/// recovered and ready, and a channel to it. Keep the dir as long as the server.
pub async fn grpc_server() -> (
    tempfile::TempDir,
    boxoffice_gateway::server::Running,
    tonic::transport::Channel,
) {
    use boxoffice_gateway::server::{ServerConfig, start};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ServerConfig::new("bench-admin", "bench-client", b"bench-secret");
    cfg.listen = "127.0.0.1:0".parse().expect("addr");
    cfg.metrics_listen = None;
    cfg.data_dir = dir.path().to_path_buf();
    cfg.reconcile_every = None;
    let mut server = start(cfg).await.expect("server");
    server.wait_ready().await.expect("ready");
    let ch = boxoffice_client::connect(&format!("http://{}", server.addr))
        .await
        .expect("connect");
    (dir, server, ch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
