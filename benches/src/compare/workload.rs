//! What every row of the comparison shares: the workload, a row's result with its latencies
//! and outcomes, the health-check ceiling, and the runtime a row runs on.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use boxoffice_drill::measure::RpcFigures;
use hdrhistogram::Histogram;
use serde::Serialize;

/// The two sales the comparison plays, each reported on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// The 100:1 flash sale: far more contenders than places, most attempts refused
    /// (`SOLD_OUT`).
    Sale,
    /// Success-heavy: as many places as contenders, every attempt can succeed (a durable write
    /// each).
    Success,
}

impl Kind {
    /// Both, in report order.
    pub const ALL: [Kind; 2] = [Kind::Sale, Kind::Success];

    /// `sale` or `success`.
    pub fn key(self) -> &'static str {
        match self {
            Kind::Sale => "sale",
            Kind::Success => "success",
        }
    }

    /// Parses `sale,success` (any subset; run in this order).
    pub fn parse_list(s: &str) -> anyhow::Result<Vec<Kind>> {
        parse_list(s, &Kind::ALL, Kind::key, "workload")
    }
}

/// Parses a comma-separated subset of `all` by `key` (any case, any order, repeats ignored),
/// in the order of `all`; `what` names an item in errors.
fn parse_list<T: Copy + PartialEq>(
    s: &str,
    all: &[T],
    key: fn(T) -> &'static str,
    what: &str,
) -> anyhow::Result<Vec<T>> {
    let known = all.iter().map(|&t| key(t)).collect::<Vec<_>>().join(", ");
    let mut out: Vec<T> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let item = all
            .iter()
            .copied()
            .find(|&t| key(t).eq_ignore_ascii_case(part))
            .ok_or_else(|| anyhow::anyhow!("unknown {what} {part:?} ({what}s: {known})"))?;
        if !out.contains(&item) {
            out.push(item);
        }
    }
    if out.is_empty() {
        anyhow::bail!("--{what}s names no {what} ({what}s: {known})");
    }
    out.sort_by_key(|t| all.iter().position(|x| x == t));
    Ok(out)
}

/// The sale every row plays.
#[derive(Clone, Debug, Serialize)]
pub struct Workload {
    /// Which of the two sales.
    pub kind: Kind,
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
    /// Each attempt carries an idempotency key (`k{i}`), on by default as the seeds' notes
    /// ask ("book takes an idempotency key"): rows a and d send it to boxoffice, which records
    /// each answer durably as the key's first answer, refusals too; rows b and c run the full
    /// script, which stores each answer under its key. Row e's simplified script never takes
    /// one.
    pub keys: bool,
}

impl Workload {
    /// The default run: 100,000 contenders, 10,000 seats, 128 in flight over 16 connections,
    /// keys on.
    pub fn full() -> Workload {
        Workload {
            kind: Kind::Sale,
            contenders: 100_000,
            seats: 10_000,
            in_flight: 128,
            connections: 16,
            batch: 64,
            health_calls: 100_000,
            front_redis_connections: 4,
            setup_concurrency: 256,
            keys: true,
        }
    }

    /// This workload played as `kind`: the sale keeps its seats, the success-heavy one has a
    /// place for every contender.
    pub fn as_kind(&self, kind: Kind) -> Workload {
        let seats = match kind {
            Kind::Sale => self.seats,
            Kind::Success => u32::try_from(self.contenders).unwrap_or(u32::MAX),
        };
        Workload {
            kind,
            seats,
            ..self.clone()
        }
    }

    /// One line saying what is played.
    pub fn title(&self) -> String {
        match self.kind {
            Kind::Sale => format!(
                "the flash sale ({} contenders for {} places, {} per place: most attempts are \
                 refused SOLD_OUT)",
                crate::thousands(self.contenders as u64),
                crate::thousands(u64::from(self.seats)),
                (self.contenders as u64).div_ceil(u64::from(self.seats.max(1))),
            ),
            Kind::Success => format!(
                "success-heavy ({} contenders for {} places: every attempt can succeed, each a \
                 durable write)",
                crate::thousands(self.contenders as u64),
                crate::thousands(u64::from(self.seats))
            ),
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
        if self.kind == Kind::Success && u32::try_from(self.contenders).is_err() {
            anyhow::bail!("the success-heavy workload needs --contenders below 2^32");
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
    /// The seeds' design: a gRPC front on Redis + the full seeds' script.
    B,
    /// The seeds' design at its best: raw Redis + the full seeds' script, pipelined.
    C,
    /// boxoffice `HoldBatch`, durable.
    D,
    /// Raw Redis + the simplified script (one counter, a hold with a TTL; no per-user limit,
    /// no expiry index, no idempotency key), pipelined.
    E,
}

impl Row {
    /// All rows, in order.
    pub const ALL: [Row; 5] = [Row::A, Row::B, Row::C, Row::D, Row::E];

    /// `a` to `e`.
    pub fn key(self) -> &'static str {
        match self {
            Row::A => "a",
            Row::B => "b",
            Row::C => "c",
            Row::D => "d",
            Row::E => "e",
        }
    }

    /// The row's name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Row::A => "(a) boxoffice Hold (unary, durable)",
            Row::B => "(b) seeds' design: gRPC front + Redis, full script",
            Row::C => "(c) seeds' design at its best: raw Redis, full script, pipelined",
            Row::D => "(d) boxoffice HoldBatch (durable)",
            Row::E => "(e) raw Redis, SIMPLIFIED script (counter + hold only), pipelined",
        }
    }

    /// Whether the row runs on Redis.
    pub fn is_redis(self) -> bool {
        matches!(self, Row::B | Row::C | Row::E)
    }

    /// Parses `a,b,c,d,e` (any subset, any order; the rows run in table order).
    pub fn parse_list(s: &str) -> anyhow::Result<Vec<Row>> {
        parse_list(s, &Row::ALL, Row::key, "row")
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
    /// Successes per second over the timed part.
    pub held_per_second: f64,
    /// Latency of the attempts that held a place.
    pub held_latency: Latency,
    /// Attempts answered `SOLD_OUT`.
    pub sold_out: u64,
    /// Latency of the attempts answered `SOLD_OUT`.
    pub sold_out_latency: Latency,
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
            held_per_second: 0.0,
            held_latency: Latency::default(),
            sold_out: 0,
            sold_out_latency: Latency::default(),
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
            held_per_second: held as f64 / seconds.max(1e-9),
            held_latency: outcomes.latency_of(true),
            sold_out,
            sold_out_latency: outcomes.latency_of(false),
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
    /// Latency (µs) of the successes, and of the `SOLD_OUT`s.
    held_us: Mutex<Histogram<u64>>,
    sold_out_us: Mutex<Histogram<u64>>,
}

impl Outcomes {
    pub(crate) fn new(attempts: usize) -> Arc<Outcomes> {
        Arc::new(Outcomes {
            held: AtomicU64::new(0),
            sold_out: AtomicU64::new(0),
            other: AtomicU64::new(0),
            first_other: Mutex::new(None),
            ids: (0..attempts).map(|_| OnceLock::new()).collect(),
            held_us: Mutex::new(histogram()),
            sold_out_us: Mutex::new(histogram()),
        })
    }

    /// The latency of the successes (`true`) or of the `SOLD_OUT`s.
    fn latency_of(&self, held: bool) -> Latency {
        let h = if held {
            &self.held_us
        } else {
            &self.sold_out_us
        };
        h.lock()
            .ok()
            .filter(|h| !h.is_empty())
            .map(|h| Latency::of_histogram(&h))
            .unwrap_or_default()
    }

    fn record(h: &Mutex<Histogram<u64>>, us: u64) {
        if let Ok(mut h) = h.lock() {
            let _ = h.record(us.max(1));
        }
    }

    /// Attempt `i` held a place under `id`, answered after `us` µs.
    pub(crate) fn held(&self, i: usize, id: String, us: u64) {
        Self::record(&self.held_us, us);
        self.held.fetch_add(1, Ordering::Relaxed);
        if let Some(slot) = self.ids.get(i)
            && slot.set(id).is_err()
        {
            self.other(1, format!("attempt {i} answered twice"));
        }
    }

    /// An attempt was answered `SOLD_OUT` after `us` µs.
    pub(crate) fn sold_out(&self, us: u64) {
        Self::record(&self.sold_out_us, us);
        self.sold_out.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` attempts failed, the first of them as `what`.
    pub(crate) fn other(&self, n: u64, what: String) {
        self.other.fetch_add(n, Ordering::Relaxed);
        if let Ok(mut first) = self.first_other.lock() {
            first.get_or_insert(what);
        }
    }

    /// The answer to unary attempt `i`, `us` µs after it was sent: its hold id, `SOLD_OUT`,
    /// or another failure (given back to `drive`, which keeps its own count of failed calls).
    pub(crate) fn unary(
        &self,
        i: usize,
        r: Result<String, tonic::Status>,
        us: u64,
    ) -> Result<(), tonic::Status> {
        match r {
            Ok(id) => {
                self.held(i, id, us);
                Ok(())
            }
            Err(s) if boxoffice_client::reason(&s).as_deref() == Some(SOLD_OUT) => {
                self.sold_out(us);
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

/// Microseconds since `started` (at least 1).
pub(crate) fn micros_since(started: std::time::Instant) -> u64 {
    u64::try_from(started.elapsed().as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// A multi-thread tokio runtime of 2 workers (one per core here), threads named `name`.
pub fn runtime(name: &str) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()?)
}
