//! What every row of the comparison shares: the workload, a row's result with its latencies
//! and outcomes, the health-check ceiling, and the runtime a row runs on.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use boxoffice_drill::measure::RpcFigures;
use hdrhistogram::Histogram;
use serde::Serialize;

/// The sale every row plays.
#[derive(Clone, Debug, Serialize)]
pub struct Workload {
    /// Contenders (distinct user ids), one attempt each for one place.
    pub contenders: usize,
    /// Places for sale (general admission).
    pub seats: u32,
    /// Holds in flight at once.
    pub in_flight: usize,
    /// HTTP/2 (gRPC rows) or TCP (raw Redis row) connections of the client.
    pub connections: usize,
    /// Items per `HoldBatch` call (row d).
    pub batch: usize,
    /// Health checks measured for the ceiling (0: none).
    pub health_calls: usize,
    /// Multiplexed Redis connections of the gRPC front (row b).
    pub front_redis_connections: usize,
    /// Contenders admitted at once during the untimed setup of rows a and d.
    pub setup_concurrency: usize,
    /// Rows a and d send an idempotency key with each attempt (`k{i}`). Off by default: the
    /// seeds' design has no keys, so the same workload is without them. With keys, each
    /// refusal is recorded durably as its key's first answer (a log write the Redis rows do
    /// not make).
    pub keys: bool,
}

impl Workload {
    /// The default run: 100,000 contenders, 10,000 seats, 128 in flight over 16 connections.
    pub fn full() -> Workload {
        Workload {
            contenders: 100_000,
            seats: 10_000,
            in_flight: 128,
            connections: 16,
            batch: 64,
            health_calls: 100_000,
            front_redis_connections: 4,
            setup_concurrency: 256,
            keys: false,
        }
    }

    /// Refuses a workload no row can play.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.contenders == 0 || self.seats == 0 {
            anyhow::bail!("--contenders and --seats must be at least 1");
        }
        if self.in_flight == 0 || self.connections == 0 || self.setup_concurrency == 0 {
            anyhow::bail!("--in-flight, --connections and --setup-concurrency must be at least 1");
        }
        if !(1..=256).contains(&self.batch) {
            anyhow::bail!("--batch must be 1 to 256 (HoldBatch takes 1 to 256 items)");
        }
        if self.front_redis_connections == 0 {
            anyhow::bail!("--front-redis-connections must be at least 1");
        }
        Ok(())
    }

    /// Sections of the event (rows a and d): 16, or fewer if there are fewer seats.
    pub fn sections(&self) -> usize {
        16.min(self.seats as usize)
    }

    /// The places of section `s` of [`Workload::sections`]: the seats split evenly.
    pub fn section_capacity(&self, s: usize) -> u32 {
        let k = self.sections() as u32;
        self.seats / k + u32::from((s as u32) < self.seats % k)
    }

    /// The section contender `i` asks for (`i mod sections`).
    pub fn section_of(&self, i: usize) -> usize {
        i % self.sections()
    }

    /// How many holds must succeed: in each section, the fewer of its places and its
    /// contenders (with more contenders than seats, all the seats).
    pub fn expected_held(&self) -> u64 {
        let k = self.sections();
        (0..k)
            .map(|s| {
                let contenders = self.contenders / k + usize::from(s < self.contenders % k);
                u64::from(self.section_capacity(s)).min(contenders as u64)
            })
            .sum()
    }
}

/// The rows of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Row {
    /// boxoffice `Hold`, unary, durable.
    A,
    /// The seeds' design: a gRPC front on Redis + Lua.
    B,
    /// The seeds' design at its best: raw Redis + Lua, pipelined.
    C,
    /// boxoffice `HoldBatch`, durable.
    D,
}

impl Row {
    /// All rows, in order.
    pub const ALL: [Row; 4] = [Row::A, Row::B, Row::C, Row::D];

    /// `a`, `b`, `c` or `d`.
    pub fn key(self) -> &'static str {
        match self {
            Row::A => "a",
            Row::B => "b",
            Row::C => "c",
            Row::D => "d",
        }
    }

    /// The row's name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Row::A => "(a) boxoffice Hold (unary, durable)",
            Row::B => "(b) original design: gRPC front + Redis Lua",
            Row::C => "(c) original design at its best: raw Redis + Lua, pipelined",
            Row::D => "(d) boxoffice HoldBatch (durable)",
        }
    }

    /// Parses `a,b,c,d` (any subset, any order; the rows run in table order).
    pub fn parse_list(s: &str) -> anyhow::Result<Vec<Row>> {
        let mut rows = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let row = Row::ALL
                .into_iter()
                .find(|r| r.key().eq_ignore_ascii_case(part))
                .ok_or_else(|| anyhow::anyhow!("unknown row {part:?} (rows: a, b, c, d)"))?;
            if !rows.contains(&row) {
                rows.push(row);
            }
        }
        if rows.is_empty() {
            anyhow::bail!("--rows names no row (rows: a, b, c, d)");
        }
        rows.sort_by_key(|r| Row::ALL.iter().position(|x| x == r));
        Ok(rows)
    }
}

/// Latency percentiles, ms.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Latency {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Latency {
    /// From `drive`'s percentiles (µs: p50, p99, p99.9, max).
    pub fn of_figures(f: &RpcFigures) -> Latency {
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            p50_ms: ms(f.latency_us[0]),
            p99_ms: ms(f.latency_us[1]),
            p999_ms: ms(f.latency_us[2]),
            max_ms: ms(f.latency_us[3]),
        }
    }

    /// From a histogram of µs.
    pub fn of_histogram(h: &Histogram<u64>) -> Latency {
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            p50_ms: ms(h.value_at_quantile(0.5)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }
}

/// A histogram of µs with the bounds of `boxoffice_drill::measure` (1 µs to 60 s, 3 digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

/// What one row measured.
#[derive(Clone, Debug, Serialize)]
pub struct RowResult {
    /// `a` to `d`.
    pub row: &'static str,
    /// The row's name.
    pub name: &'static str,
    /// Why the row did not run (then every figure is 0).
    pub skipped: Option<String>,
    /// Hold attempts made.
    pub attempts: u64,
    /// RPCs (or Redis calls) made: the attempts, or the batches of row d.
    pub calls: u64,
    /// Wall time of the timed part, first request to last answer.
    pub seconds: f64,
    /// Attempts per second over the timed part.
    pub attempts_per_second: f64,
    /// Latency per attempt (row d: the latency of its batch call).
    pub latency: Latency,
    /// Attempts that held a place.
    pub held: u64,
    /// Attempts answered `SOLD_OUT`.
    pub sold_out: u64,
    /// Attempts that failed any other way.
    pub other_errors: u64,
    /// The first of those, `code reason: message`.
    pub first_other_error: Option<String>,
    /// Places held beyond the seats.
    pub oversold: u64,
    /// Distinct hold ids among the successes.
    pub distinct_holds: u64,
    /// The server's own count after the run, as one line (e.g. `seats_left = 0`).
    pub server_count: String,
    /// Redis rows: the seats-left counter after the run.
    pub seats_left: Option<i64>,
    /// Checks that failed (empty: all passed).
    pub failed_checks: Vec<String>,
    /// The untimed setup (server start, event, admissions), seconds.
    pub setup_seconds: f64,
}

impl RowResult {
    /// A row that did not run, and why.
    pub fn skipped(row: Row, why: String) -> RowResult {
        RowResult {
            row: row.key(),
            name: row.name(),
            skipped: Some(why),
            attempts: 0,
            calls: 0,
            seconds: 0.0,
            attempts_per_second: 0.0,
            latency: Latency::default(),
            held: 0,
            sold_out: 0,
            other_errors: 0,
            first_other_error: None,
            oversold: 0,
            distinct_holds: 0,
            server_count: String::new(),
            seats_left: None,
            failed_checks: Vec::new(),
            setup_seconds: 0.0,
        }
    }

    /// A row's figures from its outcomes: `seconds` of timed wall clock, `calls` calls.
    pub(crate) fn measured(
        row: Row,
        w: &Workload,
        outcomes: &Outcomes,
        seconds: f64,
        calls: u64,
        latency: Latency,
    ) -> RowResult {
        let held = outcomes.held.load(Ordering::Relaxed);
        let sold_out = outcomes.sold_out.load(Ordering::Relaxed);
        let other_errors = outcomes.other.load(Ordering::Relaxed);
        let distinct = outcomes.distinct_ids() as u64;
        let attempts = held + sold_out + other_errors;
        let mut failed_checks = Vec::new();
        if attempts != w.contenders as u64 {
            failed_checks.push(format!(
                "{attempts} attempts answered of {} made",
                w.contenders
            ));
        }
        if distinct != held {
            failed_checks.push(format!("{held} successes but {distinct} distinct hold ids"));
        }
        let oversold = distinct.max(held).saturating_sub(u64::from(w.seats));
        if oversold > 0 {
            failed_checks.push(format!("OVERSOLD by {oversold}"));
        }
        if other_errors == 0 && held != w.expected_held() {
            failed_checks.push(format!(
                "{held} held, {} expected (seats left unsold while contenders were turned away)",
                w.expected_held()
            ));
        }
        RowResult {
            row: row.key(),
            name: row.name(),
            skipped: None,
            attempts,
            calls,
            seconds,
            attempts_per_second: attempts as f64 / seconds.max(1e-9),
            latency,
            held,
            sold_out,
            other_errors,
            first_other_error: outcomes.first_other(),
            oversold,
            distinct_holds: distinct,
            server_count: String::new(),
            seats_left: None,
            failed_checks,
            setup_seconds: 0.0,
        }
    }

    /// What is wrong with this row (`None`: nothing, or skipped).
    pub fn failure(&self) -> Option<String> {
        if self.skipped.is_some() {
            return None;
        }
        let mut parts = self.failed_checks.clone();
        if self.other_errors > 0 {
            parts.push(format!(
                "{} other errors (first: {})",
                self.other_errors,
                self.first_other_error.as_deref().unwrap_or("?")
            ));
        }
        (!parts.is_empty()).then(|| format!("{}: {}", self.name, parts.join("; ")))
    }
}

/// The health check's figures (the ceiling).
#[derive(Clone, Debug, Serialize)]
pub struct HealthResult {
    /// Which row's server answered.
    pub against: &'static str,
    /// Calls made.
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Calls per second.
    pub calls_per_second: f64,
    /// Latency per call.
    pub latency: Latency,
}

impl HealthResult {
    /// From `drive`'s figures.
    pub fn of(against: &'static str, f: &RpcFigures) -> HealthResult {
        HealthResult {
            against,
            calls: f.calls,
            errors: f.errors,
            first_error: f.first_error.clone(),
            seconds: f.seconds,
            calls_per_second: f.rate(),
            latency: Latency::of_figures(f),
        }
    }
}

/// How each attempt of a row ended: counts, the first unexpected failure, the hold ids.
pub(crate) struct Outcomes {
    held: AtomicU64,
    sold_out: AtomicU64,
    other: AtomicU64,
    first_other: Mutex<Option<String>>,
    /// Attempt `i`'s hold id, if it held.
    ids: Vec<OnceLock<String>>,
}

impl Outcomes {
    pub(crate) fn new(attempts: usize) -> Arc<Outcomes> {
        Arc::new(Outcomes {
            held: AtomicU64::new(0),
            sold_out: AtomicU64::new(0),
            other: AtomicU64::new(0),
            first_other: Mutex::new(None),
            ids: (0..attempts).map(|_| OnceLock::new()).collect(),
        })
    }

    /// Attempt `i` held a place under `id`.
    pub(crate) fn held(&self, i: usize, id: String) {
        self.held.fetch_add(1, Ordering::Relaxed);
        if let Some(slot) = self.ids.get(i)
            && slot.set(id).is_err()
        {
            self.other(1, format!("attempt {i} answered twice"));
        }
    }

    /// An attempt was answered `SOLD_OUT`.
    pub(crate) fn sold_out(&self) {
        self.sold_out.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` attempts failed, the first of them as `what`.
    pub(crate) fn other(&self, n: u64, what: String) {
        self.other.fetch_add(n, Ordering::Relaxed);
        if let Ok(mut first) = self.first_other.lock() {
            first.get_or_insert(what);
        }
    }

    /// The answer to unary attempt `i`: its hold id, `SOLD_OUT`, or another failure (given
    /// back to `drive`, which keeps its own count of failed calls).
    pub(crate) fn unary(
        &self,
        i: usize,
        r: Result<String, tonic::Status>,
    ) -> Result<(), tonic::Status> {
        match r {
            Ok(id) => {
                self.held(i, id);
                Ok(())
            }
            Err(s) if boxoffice_client::reason(&s).as_deref() == Some(SOLD_OUT) => {
                self.sold_out();
                Ok(())
            }
            Err(s) => {
                self.other(1, describe(&s));
                Err(s)
            }
        }
    }

    fn first_other(&self) -> Option<String> {
        self.first_other.lock().ok().and_then(|f| f.clone())
    }

    /// The distinct hold ids.
    pub(crate) fn distinct_ids(&self) -> usize {
        self.ids
            .iter()
            .filter_map(OnceLock::get)
            .collect::<HashSet<_>>()
            .len()
    }
}

/// The reason of a sold-out answer.
pub const SOLD_OUT: &str = "SOLD_OUT";

/// `code reason: message` of a failed call.
pub fn describe(s: &tonic::Status) -> String {
    format!(
        "{:?} {}: {}",
        s.code(),
        boxoffice_client::reason(s).unwrap_or_default(),
        s.message()
    )
}

/// A multi-thread tokio runtime of 2 workers (one per core here), threads named `name`.
pub fn runtime(name: &str) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()?)
}
