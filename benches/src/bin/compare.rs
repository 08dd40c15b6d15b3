//! `compare`: boxoffice against the seeds' design (a booking front on Redis + Lua), the same
//! sales (the 100:1 flash sale, and a success-heavy one) played against each, one row after the
//! other on this machine; see `boxoffice_benches::compare` and `benches/compare.sh`.
//!
//! ```sh
//! cargo run --release -p boxoffice-benches --bin compare -- --rows a,c,d --json /tmp/compare.json
//! ```
//!
//! Exit code 0: every row that ran passed its checks; 1: a row failed (other errors, oversold,
//! counts that disagree), or `--require-redis` and no `redis-server`; 2: bad flags.

use std::path::PathBuf;
use std::process::ExitCode;

use boxoffice_benches::compare::{self, Kind, Options, Row, Workload, seeds};
use clap::Parser;

/// boxoffice against the seeds' design (Redis + Lua): attempts/s, latency, oversold.
#[derive(Parser, Debug)]
#[command(name = "compare")]
struct Args {
    /// Contenders (distinct user ids), one attempt for one place each.
    #[arg(long, default_value_t = 100_000)]
    contenders: usize,
    /// Places for sale in the 100:1 sale (general admission); the success-heavy workload has
    /// one for every contender.
    #[arg(long, default_value_t = 10_000)]
    seats: u32,
    /// Workloads to play, each reported on its own: `sale` (the 100:1 flash sale), `success`
    /// (success-heavy: as many places as contenders), comma-separated.
    #[arg(long, default_value = "sale,success")]
    workloads: String,
    /// Holds in flight at once.
    #[arg(long, default_value_t = 128)]
    in_flight: usize,
    /// Client connections (HTTP/2 for the gRPC rows, TCP for raw Redis).
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Items per HoldBatch call (row d), 1 to 256.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Health checks measured for the ceiling (0: none).
    #[arg(long, default_value_t = 100_000)]
    health_calls: usize,
    /// Rows to run: any of a, b, c, d, e, comma-separated.
    #[arg(long, default_value = "a,b,c,d,e")]
    rows: String,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Multiplexed Redis connections of the gRPC front (row b).
    #[arg(long, default_value_t = 4)]
    front_redis_connections: usize,
    /// Contenders admitted at once during the untimed setup of rows a and d.
    #[arg(long, default_value_t = 256)]
    setup_concurrency: usize,
    /// No idempotency keys: rows a to d send none (by default each attempt carries one, as the
    /// seeds' notes ask; row e's simplified script never takes one).
    #[arg(long)]
    no_keys: bool,
    /// The redis-server to start (default: the one on PATH).
    #[arg(long)]
    redis_server: Option<PathBuf>,
    /// Fail (exit 1) instead of skipping the Redis rows if there is no redis-server (also
    /// with BOXOFFICE_REQUIRE_REDIS=1).
    #[arg(long)]
    require_redis: bool,
}

fn main() -> ExitCode {
    // As the `boxoffice` binary: the servers measured are the ones that ship.
    boxoffice_drill::memory::keep_off_huge_pages();
    let args = Args::parse();
    let base = Workload {
        kind: Kind::Sale,
        contenders: args.contenders,
        seats: args.seats,
        in_flight: args.in_flight,
        connections: args.connections,
        batch: args.batch,
        health_calls: args.health_calls,
        front_redis_connections: args.front_redis_connections,
        setup_concurrency: args.setup_concurrency,
        keys: !args.no_keys,
    };
    let parsed = Row::parse_list(&args.rows).and_then(|rows| {
        let workloads: Vec<Workload> = Kind::parse_list(&args.workloads)?
            .into_iter()
            .map(|k| base.as_kind(k))
            .collect();
        for w in &workloads {
            w.check()?;
        }
        Ok((rows, workloads))
    });
    let (rows, workloads) = match parsed {
        Ok(r) => r,
        Err(e) => {
            eprintln!("compare: {e}");
            return ExitCode::from(2);
        }
    };
    let redis_server = args.redis_server.clone().or_else(seeds::find_redis_server);
    let require_redis = args.require_redis || boxoffice_engine::tiers::required("redis");
    if redis_server.is_none() && rows.iter().any(|r| r.is_redis()) {
        if require_redis {
            eprintln!("compare: redis-server not found on PATH (and Redis is required)");
            return ExitCode::FAILURE;
        }
        eprintln!("compare: redis-server not found on PATH: rows (b), (c) and (e) are skipped");
    }
    let client = match compare::runtime("compare-client") {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("compare: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let report = match compare::run(&workloads, &rows, &Options { redis_server }, &client) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("compare: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    println!("{report}");
    if let Some(path) = &args.json {
        let written = serde_json::to_string_pretty(&report)
            .map_err(anyhow::Error::from)
            .and_then(|j| std::fs::write(path, j + "\n").map_err(anyhow::Error::from));
        match written {
            Ok(()) => eprintln!("results written to {}", path.display()),
            Err(e) => {
                eprintln!("compare: writing {}: {e:#}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    let failures = report.failures();
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("compare: FAILED: {}", failures.join("; "));
        ExitCode::FAILURE
    }
}
