//! `compare` (`benches/src/bin/compare.rs`): boxoffice against the seeds' design (a booking
//! front on Redis with a reserve Lua script), the same flash sale on the same machine, one row
//! after the other:
//!
//! - (a) [`ours::row_a`]: `BookingService.Hold` against an embedded boxoffice server
//!   (`Durability::Sync`), every contender admitted through the waiting room before the clock
//!   starts;
//! - (b) [`seeds::row_b`]: the same client against a small tonic front whose `Hold` runs the
//!   reserve script on a `redis-server` child (EVALSHA over multiplexed connections);
//! - (c) [`seeds::row_c`]: no front, the client runs the script on Redis itself, pipelined;
//! - (d) [`ours::row_d`]: `BookingService.HoldBatch` against a fresh embedded server.
//!
//! Every contender makes exactly one attempt for one place; the seats sell out, the rest are
//! answered `SOLD_OUT`. Each row reports attempts/s over the whole timed part (first request to
//! last answer), p50/p99 latency per attempt, successes, `SOLD_OUT`s, other errors and
//! oversold places, and checks the server's own count afterwards. The health check of (a)'s
//! server (an empty RPC through the same client stack) is the ceiling.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use boxoffice_drill::measure::RpcFigures;
use hdrhistogram::Histogram;
use serde::Serialize;

pub mod ours;
pub mod seeds;

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
            Row::B => "(b) seeds' design: gRPC front + Redis Lua",
            Row::C => "(c) seeds' design at its best: raw Redis + Lua, pipelined",
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

/// The machine and code a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// Cores the process may use.
    pub nproc: usize,
    /// `model name` of `/proc/cpuinfo`.
    pub cpu_model: String,
    /// `git rev-parse --short HEAD`, `+dirty` if the tree has changes.
    pub git_commit: String,
    /// When the run started (UTC).
    pub date: String,
    /// `redis-server --version`, if found.
    pub redis_server: String,
}

impl Machine {
    /// Looks at this machine (`redis` is the redis-server found, if any).
    pub fn probe(redis: Option<&Path>) -> Machine {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        let git_commit = match output("git", &["rev-parse", "--short", "HEAD"]) {
            Some(c) => {
                let dirty =
                    output("git", &["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
                if dirty { format!("{c}+dirty") } else { c }
            }
            None => "unknown".into(),
        };
        let date = output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).unwrap_or_else(|| {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            format!("{secs} s since the Unix epoch")
        });
        let redis_server = redis
            .and_then(|p| output(&p.to_string_lossy(), &["--version"]))
            .unwrap_or_else(|| "not found".into());
        Machine {
            nproc: std::thread::available_parallelism().map_or(0, usize::from),
            cpu_model,
            git_commit,
            date,
            redis_server,
        }
    }
}

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(cmd)
        .args(args)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// How a run is done beyond its workload.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The `redis-server` to start (`None`: the Redis rows are skipped).
    pub redis_server: Option<PathBuf>,
}

/// A whole run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// What it played.
    pub workload: Workload,
    /// Its rows, in table order.
    pub rows: Vec<RowResult>,
    /// The ceiling, if measured.
    pub health: Option<HealthResult>,
    /// `(d)/(c)`, `(a)/(b)`, `(a)/health` of attempts/s (`None`: a side did not run).
    pub ratios: Ratios,
    /// What went wrong (empty: nothing).
    pub failures: Vec<String>,
}

/// The ratios of attempts/s the table ends with.
#[derive(Clone, Debug, Serialize)]
pub struct Ratios {
    /// HoldBatch over raw Redis.
    pub d_over_c: Option<f64>,
    /// Hold over the gRPC front on Redis.
    pub a_over_b: Option<f64>,
    /// Hold over the health check.
    pub a_over_health: Option<f64>,
}

/// Runs `rows` of workload `w` one after the other, the client on `client` (a runtime of its
/// own: each server gets another), and reports. Failed rows are reported, not returned as
/// errors; a row that cannot run at all (a server that does not start) is an error.
pub fn run(
    w: &Workload,
    rows: &[Row],
    options: &Options,
    client: &tokio::runtime::Runtime,
) -> anyhow::Result<Report> {
    w.check()?;
    let machine = Machine::probe(options.redis_server.as_deref());
    let mut results = Vec::new();
    let mut health = None;
    for &row in rows {
        eprintln!("running {} ...", row.name());
        let result = match (row, &options.redis_server) {
            (Row::B | Row::C, None) => {
                let why =
                    "skipped: redis-server not found on PATH (benches/compare.sh installs it \
                           with apt-get when run as root)"
                        .to_owned();
                eprintln!("{}: {why}", row.name());
                RowResult::skipped(row, why)
            }
            (Row::A, _) => {
                let (r, h) = ours::row_a(w, client, health.is_none() && w.health_calls > 0)?;
                health = health.or(h);
                r
            }
            (Row::D, _) => {
                let (r, h) = ours::row_d(w, client, health.is_none() && w.health_calls > 0)?;
                health = health.or(h);
                r
            }
            (Row::B, Some(bin)) => seeds::row_b(w, client, bin)?,
            (Row::C, Some(bin)) => seeds::row_c(w, client, bin)?,
        };
        eprintln!("{}", one_line(&result));
        results.push(result);
    }
    let rate = |r: Row| {
        results
            .iter()
            .find(|x| x.row == r.key() && x.skipped.is_none() && x.attempts > 0)
            .map(|x| x.attempts_per_second)
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let ratios = Ratios {
        d_over_c: ratio(rate(Row::D), rate(Row::C)),
        a_over_b: ratio(rate(Row::A), rate(Row::B)),
        a_over_health: ratio(rate(Row::A), health.as_ref().map(|h| h.calls_per_second)),
    };
    let mut failures: Vec<String> = results.iter().filter_map(RowResult::failure).collect();
    if let Some(h) = &health
        && h.errors > 0
    {
        failures.push(format!(
            "health check: {} of {} calls failed (first: {})",
            h.errors,
            h.calls,
            h.first_error.as_deref().unwrap_or("?")
        ));
    }
    Ok(Report {
        machine,
        workload: w.clone(),
        rows: results,
        health,
        ratios,
        failures,
    })
}

fn one_line(r: &RowResult) -> String {
    match &r.skipped {
        Some(why) => format!("  {why}"),
        None => format!(
            "  {:.0} attempts/s, p50 {:.2} ms, p99 {:.2} ms, held {}, SOLD_OUT {}, other errors {}, \
             oversold {}, setup {:.1} s, {}",
            r.attempts_per_second,
            r.latency.p50_ms,
            r.latency.p99_ms,
            r.held,
            r.sold_out,
            r.other_errors,
            r.oversold,
            r.setup_seconds,
            r.server_count
        ),
    }
}

/// `1234567` as `1,234,567`.
fn grouped(n: u64) -> String {
    crate::thousands(n)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.machine;
        let w = &self.workload;
        writeln!(
            f,
            "boxoffice compare: boxoffice against the seeds' design (Redis + Lua)"
        )?;
        writeln!(
            f,
            "machine: nproc {}, CPU {}, commit {}, {}, {}",
            m.nproc, m.cpu_model, m.git_commit, m.date, m.redis_server
        )?;
        writeln!(
            f,
            "workload: {} contenders (distinct users, 1 attempt for 1 place each), {} seats \
             (general admission), {} holds in flight over {} connections; HoldBatch of {} items; \
             idempotency keys in (a) and (d): {}",
            grouped(w.contenders as u64),
            grouped(u64::from(w.seats)),
            w.in_flight,
            w.connections,
            w.batch,
            if w.keys {
                "yes (--keys)"
            } else {
                "no (as the seeds' design)"
            }
        )?;
        writeln!(f)?;
        let name_w = self
            .rows
            .iter()
            .map(|r| r.name.chars().count())
            .chain([HEALTH_NAME.chars().count(), 3])
            .max()
            .unwrap_or(3);
        writeln!(
            f,
            "{:<name_w$}  {:>11}  {:>8}  {:>8}  {:>8}  {:>9}  {:>12}  {:>8}",
            "row", "attempts/s", "p50 ms", "p99 ms", "held", "SOLD_OUT", "other errors", "oversold"
        )?;
        for r in &self.rows {
            match &r.skipped {
                Some(why) => writeln!(f, "{:<name_w$}  {why}", r.name)?,
                None => writeln!(
                    f,
                    "{:<name_w$}  {:>11}  {:>8.2}  {:>8.2}  {:>8}  {:>9}  {:>12}  {:>8}",
                    r.name,
                    grouped(r.attempts_per_second.round() as u64),
                    r.latency.p50_ms,
                    r.latency.p99_ms,
                    grouped(r.held),
                    grouped(r.sold_out),
                    grouped(r.other_errors),
                    grouped(r.oversold)
                )?,
            }
        }
        if let Some(h) = &self.health {
            writeln!(
                f,
                "{:<name_w$}  {:>11}  {:>8.2}  {:>8.2}  {:>8}  {:>9}  {:>12}  {:>8}",
                HEALTH_NAME,
                grouped(h.calls_per_second.round() as u64),
                h.latency.p50_ms,
                h.latency.p99_ms,
                "-",
                "-",
                grouped(h.errors),
                "-"
            )?;
        }
        writeln!(f)?;
        let x = |r: Option<f64>| r.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}x"));
        writeln!(
            f,
            "ratios of attempts/s: (d)/(c) = {}   (a)/(b) = {}   (a)/health = {}",
            x(self.ratios.d_over_c),
            x(self.ratios.a_over_b),
            x(self.ratios.a_over_health)
        )?;
        writeln!(f)?;
        writeln!(f, "per row:")?;
        for r in &self.rows {
            if r.skipped.is_some() {
                continue;
            }
            writeln!(
                f,
                "  ({}) {} attempts in {} calls, {:.2} s timed, p99.9 {:.2} ms, max {:.2} ms, \
                 {} distinct holds; setup {:.1} s (untimed); {}",
                r.row,
                grouped(r.attempts),
                grouped(r.calls),
                r.seconds,
                r.latency.p999_ms,
                r.latency.max_ms,
                grouped(r.distinct_holds),
                r.setup_seconds,
                r.server_count
            )?;
        }
        if let Some(h) = &self.health {
            writeln!(
                f,
                "  health: {} calls against ({})'s server in {:.2} s (run after its holds, \
                 not part of its timed part)",
                grouped(h.calls),
                h.against,
                h.seconds
            )?;
        }
        writeln!(f)?;
        writeln!(f, "notes:")?;
        for n in NOTES {
            writeln!(f, "  - {n}")?;
        }
        if !self.failures.is_empty() {
            writeln!(f)?;
            writeln!(f, "!!!!!!!! FAILED !!!!!!!!")?;
            for fail in &self.failures {
                writeln!(f, "!!! {fail}")?;
            }
        }
        Ok(())
    }
}

const HEALTH_NAME: &str = "health check (the ceiling: an empty RPC)";

const NOTES: &[&str] = &[
    "everything runs in one process on this machine's cores: the client on its own 2-worker \
     tokio runtime, each server (boxoffice, or the gRPC front) on another; redis-server is a \
     child process",
    "(a), (d): Durability::Sync (an answer only after the group commit is fsynced); the API key, \
     the admission token and the per-user limit are checked (and, with --keys, an idempotency \
     key per attempt, each refusal recorded durably as its key's first answer); contenders are \
     admitted through the waiting room before the clock starts",
    "(b): the front checks the API key and validates event, user and quantity, but does NOT check \
     admission tokens, idempotency keys or a per-user limit, and runs one counter for the event \
     (the section asked for is ignored): favourable to Redis",
    "(b), (c): redis-server with --appendonly yes --appendfsync everysec: a hold is answered \
     before it is on disk (up to about a second of acknowledged holds can be lost on a crash of \
     the machine), again favourable to Redis",
    "(c): no gRPC, no API key, nothing validated: the client runs EVALSHA on 16 multiplexed \
     connections itself, the seeds' design with its front taken away",
    "(d): latency per attempt = the latency of the batch call that carried it",
    "oversold = places held beyond the seats; the servers' own counts are checked after each \
     row (GetEvent for ours; seats_left and the hold:* keys for Redis)",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn row_of(outcomes: &Outcomes) -> RowResult {
        let w = Workload {
            contenders: 4,
            seats: 2,
            ..Workload::full()
        };
        RowResult::measured(Row::C, &w, outcomes, 1.0, 4, Latency::default())
    }

    #[test]
    fn a_clean_row_passes() {
        let o = Outcomes::new(4);
        o.held(0, "h0".into());
        o.held(1, "h1".into());
        o.sold_out();
        o.sold_out();
        let r = row_of(&o);
        assert_eq!((r.held, r.sold_out, r.oversold), (2, 2, 0));
        assert_eq!(r.failure(), None);
    }

    #[test]
    fn overselling_failing_or_duplicate_holds_are_loud() {
        let o = Outcomes::new(4);
        for i in 0..3 {
            o.held(i, format!("h{i}"));
        }
        o.sold_out();
        let r = row_of(&o);
        assert_eq!(r.oversold, 1);
        assert!(r.failure().is_some_and(|f| f.contains("OVERSOLD by 1")));

        let o = Outcomes::new(4);
        o.held(0, "h0".into());
        o.held(1, "h1".into());
        o.sold_out();
        o.other(1, "Unavailable : boom".into());
        let r = row_of(&o);
        assert_eq!((r.oversold, r.other_errors), (0, 1));
        assert!(r.failure().is_some_and(|f| f.contains("boom")));

        let o = Outcomes::new(4);
        o.held(0, "same".into());
        o.held(1, "same".into());
        o.sold_out();
        o.sold_out();
        let r = row_of(&o);
        assert!(r.failure().is_some_and(|f| f.contains("distinct hold ids")));

        let o = Outcomes::new(4);
        o.held(0, "h0".into());
        for _ in 0..3 {
            o.sold_out();
        }
        assert!(row_of(&o).failure().is_some_and(|f| f.contains("expected")));
    }
}
