//! `compare` (`benches/src/bin/compare.rs`): boxoffice against the seeds' design (a booking
//! front on Redis with a reserve Lua script), the same sales on the same machine, one row after
//! the other:
//!
//! - (a) [`ours::row_a`]: `BookingService.Hold` against an embedded boxoffice server
//!   (`Durability::Sync`), every contender admitted through the waiting room before the clock
//!   starts;
//! - (b) [`seeds::row_b`]: the same client against a small tonic front whose `Hold` runs the
//!   full seeds' script on a `redis-server` child (EVALSHA over multiplexed connections);
//! - (c) [`seeds::row_c`]: no front, the client runs the full script on Redis itself, pipelined;
//! - (d) [`ours::row_d`]: `BookingService.HoldBatch` against a fresh embedded server;
//! - (e) [`seeds::row_e`]: as (c) with the simplified script (a counter and a hold, nothing
//!   more), labelled so.
//!
//! Two workloads ([`Kind`]), each reported on its own: the 100:1 sale (most attempts refused
//! `SOLD_OUT`) and the success-heavy one (a place for every contender). Every attempt carries an
//! idempotency key by default, on both sides. Every contender makes exactly one attempt for one
//! place. Each row reports attempts/s over the whole timed part (first request to last answer),
//! p50/p99 latency per attempt, and the successes and the refusals apart (count, rate,
//! latency), other errors and oversold places, and checks the server's own count afterwards.
//! The health check of (a)'s server (an empty RPC through the same client stack) is the
//! ceiling.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub mod ours;
pub mod seeds;
mod workload;

pub use workload::{
    HealthResult, Kind, Latency, Row, RowResult, SOLD_OUT, Workload, describe, histogram, runtime,
};

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

/// A whole run: every workload asked for.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// One per workload, in order.
    pub runs: Vec<Run>,
}

impl Report {
    /// What went wrong in any workload (empty: nothing).
    pub fn failures(&self) -> Vec<String> {
        self.runs
            .iter()
            .flat_map(|r| {
                r.failures
                    .iter()
                    .map(|f| format!("{}: {f}", r.workload.kind.key()))
            })
            .collect()
    }
}

/// One workload's rows.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    /// What it played.
    pub workload: Workload,
    /// Its rows, in table order.
    pub rows: Vec<RowResult>,
    /// The ceiling, if measured.
    pub health: Option<HealthResult>,
    /// Ratios of attempts/s (`None`: a side did not run).
    pub ratios: Ratios,
    /// What went wrong (empty: nothing).
    pub failures: Vec<String>,
}

/// The ratios of attempts/s a workload's table ends with.
#[derive(Clone, Debug, Serialize)]
pub struct Ratios {
    /// HoldBatch over raw Redis with the full script.
    pub d_over_c: Option<f64>,
    /// HoldBatch over raw Redis with the simplified script.
    pub d_over_e: Option<f64>,
    /// Hold over the gRPC front on Redis.
    pub a_over_b: Option<f64>,
    /// Hold over the health check.
    pub a_over_health: Option<f64>,
}

/// Runs `rows` of each of `workloads`, one after the other, the client on `client` (a runtime of
/// its own: each server gets another), and reports. Failed rows are reported, not returned as
/// errors; a row that cannot run at all (a server that does not start) is an error.
pub fn run(
    workloads: &[Workload],
    rows: &[Row],
    options: &Options,
    client: &tokio::runtime::Runtime,
) -> anyhow::Result<Report> {
    for w in workloads {
        w.check()?;
    }
    let machine = Machine::probe(options.redis_server.as_deref());
    let mut runs = Vec::new();
    for w in workloads {
        eprintln!("workload: {}", w.title());
        runs.push(run_one(w, rows, options, client)?);
    }
    Ok(Report { machine, runs })
}

fn run_one(
    w: &Workload,
    rows: &[Row],
    options: &Options,
    client: &tokio::runtime::Runtime,
) -> anyhow::Result<Run> {
    let mut results = Vec::new();
    let mut health = None;
    for &row in rows {
        eprintln!("running {} ...", row.name());
        let result = match (row, &options.redis_server) {
            (r, None) if r.is_redis() => {
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
            (Row::E, Some(bin)) => seeds::row_e(w, client, bin)?,
            (_, None) => unreachable!("every row without redis-server is ours"),
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
        d_over_e: ratio(rate(Row::D), rate(Row::E)),
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
    Ok(Run {
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
        writeln!(
            f,
            "boxoffice compare: boxoffice against the seeds' design (Redis + Lua)"
        )?;
        writeln!(
            f,
            "machine: nproc {}, CPU {}, commit {}, {}, {}",
            m.nproc, m.cpu_model, m.git_commit, m.date, m.redis_server
        )?;
        for run in &self.runs {
            writeln!(f)?;
            write!(f, "{run}")?;
        }
        writeln!(f)?;
        writeln!(f, "notes:")?;
        for n in NOTES {
            writeln!(f, "  - {n}")?;
        }
        let failures = self.failures();
        if !failures.is_empty() {
            writeln!(f)?;
            writeln!(f, "!!!!!!!! FAILED !!!!!!!!")?;
            for fail in &failures {
                writeln!(f, "!!! {fail}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = &self.workload;
        writeln!(f, "== workload {}: {}", w.kind.key(), w.title())?;
        writeln!(
            f,
            "{} holds in flight over {} connections; HoldBatch of {} items; an idempotency key \
             per attempt: {}",
            w.in_flight,
            w.connections,
            w.batch,
            if w.keys {
                "yes, in (a), (b), (c), (d); never in (e)"
            } else {
                "no (--no-keys)"
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
        writeln!(f, "successes and refusals apart:")?;
        writeln!(
            f,
            "{:<name_w$}  {:>8}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}",
            "row", "held", "held/s", "p50 ms", "p99 ms", "SOLD_OUT", "p50 ms", "p99 ms"
        )?;
        for r in self.rows.iter().filter(|r| r.skipped.is_none()) {
            writeln!(
                f,
                "{:<name_w$}  {:>8}  {:>9}  {:>9.2}  {:>9.2}  {:>9}  {:>9.2}  {:>9.2}",
                r.name,
                grouped(r.held),
                grouped(r.held_per_second.round() as u64),
                r.held_latency.p50_ms,
                r.held_latency.p99_ms,
                grouped(r.sold_out),
                r.sold_out_latency.p50_ms,
                r.sold_out_latency.p99_ms
            )?;
        }
        writeln!(f)?;
        let x = |r: Option<f64>| r.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}x"));
        writeln!(
            f,
            "ratios of attempts/s: (d)/(c) = {}   (d)/(e) = {}   (a)/(b) = {}   (a)/health = {}",
            x(self.ratios.d_over_c),
            x(self.ratios.d_over_e),
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
        Ok(())
    }
}

const HEALTH_NAME: &str = "health check (the ceiling: an empty RPC)";

const NOTES: &[&str] = &[
    "everything runs in one process on this machine's cores: the client on its own 2-worker \
     tokio runtime, each server (boxoffice, or the gRPC front) on another; redis-server is a \
     child process",
    "(a), (d): Durability::Sync (an answer only after the group commit is fsynced); the API key, \
     the admission token and the per-user limit are checked, and each attempt's idempotency key: \
     every answer, each SOLD_OUT too, is recorded durably as its key's first answer (a log \
     write and an fsync); contenders are admitted through the waiting room before the clock \
     starts",
    "(b), (c): the full seeds' script: the idempotency key's first answer returned if stored; \
     the section's counter and the per-user limit checked; the counter decremented, the user's \
     count raised, a hold record (hash) with a TTL, the hold in an expiry index (sorted set); \
     every answer, SOLD_OUT too, stored under its key for 24 hours",
    "(b): the front checks the API key and validates event, section, user, quantity and key, \
     but does NOT check admission tokens: favourable to Redis",
    "(b), (c), (e): redis-server with --appendonly yes --appendfsync everysec: a hold (and a \
     stored answer) is acknowledged before it is on disk (up to about a second of them can be \
     lost on a crash of the machine), again favourable to Redis",
    "(c), (e): no gRPC, no API key, nothing validated: the client runs EVALSHA on 16 \
     multiplexed connections itself, the seeds' design with its front taken away",
    "(e): the SIMPLIFIED script, NOT the seeds' design: one counter for the whole event, a hold \
     key with a TTL; no per-user limit, no expiry index, no idempotency key (its attempts carry \
     none); the least work a Redis hold can do, kept as a lower bound",
    "(d): latency per attempt = the latency of the batch call that carried it",
    "oversold = places held beyond the seats; the servers' own counts are checked after each \
     row (GetEvent for ours; for Redis the counters and hold:* keys, and with the full script \
     the expiry index, the users' counts and the stored answers)",
];

#[cfg(test)]
mod tests {
    use super::workload::Outcomes;
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
        o.held(0, "h0".into(), 1);
        o.held(1, "h1".into(), 1);
        o.sold_out(1);
        o.sold_out(1);
        let r = row_of(&o);
        assert_eq!((r.held, r.sold_out, r.oversold), (2, 2, 0));
        assert_eq!(r.failure(), None);
    }

    #[test]
    fn overselling_failing_or_duplicate_holds_are_loud() {
        let o = Outcomes::new(4);
        for i in 0..3 {
            o.held(i, format!("h{i}"), 1);
        }
        o.sold_out(1);
        let r = row_of(&o);
        assert_eq!(r.oversold, 1);
        assert!(r.failure().is_some_and(|f| f.contains("OVERSOLD by 1")));

        let o = Outcomes::new(4);
        o.held(0, "h0".into(), 1);
        o.held(1, "h1".into(), 1);
        o.sold_out(1);
        o.other(1, "Unavailable : boom".into());
        let r = row_of(&o);
        assert_eq!((r.oversold, r.other_errors), (0, 1));
        assert!(r.failure().is_some_and(|f| f.contains("boom")));

        let o = Outcomes::new(4);
        o.held(0, "same".into(), 1);
        o.held(1, "same".into(), 1);
        o.sold_out(1);
        o.sold_out(1);
        let r = row_of(&o);
        assert!(r.failure().is_some_and(|f| f.contains("distinct hold ids")));

        let o = Outcomes::new(4);
        o.held(0, "h0".into(), 1);
        for _ in 0..3 {
            o.sold_out(1);
        }
        assert!(row_of(&o).failure().is_some_and(|f| f.contains("expected")));
    }
}
