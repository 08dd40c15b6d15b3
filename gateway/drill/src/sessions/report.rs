//! What a sessions run measured: a table for people (`Display`), one line of JSON for tools.

use std::fmt;

use serde::Serialize;

use crate::json;
use crate::measure::RpcFigures;

/// What a sessions run measured. Its JSON ([`SessionsReport::to_json`]) has these fields in
/// this order, then `clean`, then the phases.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SessionsReport {
    /// Sessions opened.
    pub sessions: usize,
    /// Events they were spread over.
    pub events: usize,
    /// Places each held.
    pub quantity: u32,
    /// Places held at the peak, as the server counts them (sum over events and sections).
    pub held_at_peak: u64,
    /// Holds that the server did not grant (must be 0: the seats are exactly enough).
    pub holds_refused: u64,
    /// Join + admission, hold, refresh, confirm, release.
    #[serde(skip)]
    pub phases: Vec<RpcFigures>,
    /// Places sold, free and held at the end (server counts).
    pub sold: u64,
    /// Free places at the end.
    pub available: u64,
    /// Held places at the end (must be 0).
    pub held_at_end: u64,
    /// Sessions that paid.
    pub paid: u64,
    /// Section invariant violations (`None`: not checked, the server is not embedded).
    pub invariant_violations: Option<u64>,
    /// Reconciliation findings (`None`: not checked, the server is not embedded).
    pub reconciliation_findings: Option<u64>,
    /// Peak resident memory of this process, bytes (server + load generator when embedded).
    pub peak_rss_bytes: Option<u64>,
    /// Wall time of the run, seconds.
    #[serde(serialize_with = "json::millis")]
    pub seconds: f64,
}

/// The JSON object of a sessions report: its fields, whether it is clean, its phases.
#[derive(Serialize)]
struct SessionsJson<'a> {
    #[serde(flatten)]
    report: &'a SessionsReport,
    clean: bool,
    phases: Vec<PhaseJson<'a>>,
}

/// One phase in the JSON of a sessions report.
#[derive(Serialize)]
struct PhaseJson<'a> {
    name: &'a str,
    calls: u64,
    errors: u64,
    #[serde(serialize_with = "json::millis")]
    seconds: f64,
    #[serde(serialize_with = "json::tenths")]
    calls_per_second: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    max_us: u64,
}

impl<'a> From<&'a RpcFigures> for PhaseJson<'a> {
    fn from(p: &'a RpcFigures) -> PhaseJson<'a> {
        let [p50_us, p99_us, p999_us, max_us] = p.latency_us;
        PhaseJson {
            name: p.name,
            calls: p.calls,
            errors: p.errors,
            seconds: p.seconds,
            calls_per_second: p.rate(),
            p50_us,
            p99_us,
            p999_us,
            max_us,
        }
    }
}

impl SessionsReport {
    /// Whether every check passed.
    pub fn clean(&self) -> bool {
        let expected = self.sessions as u64 * u64::from(self.quantity);
        self.held_at_peak == expected
            && self.holds_refused == 0
            && self.phases.iter().all(|p| p.errors == 0)
            && self.promises_kept()
    }

    /// Whether the places add up: nothing held at the end, one sale per paid place, sold and
    /// available make up every place, the invariants and the reconciliation clean. `false` is a
    /// broken promise (exit code 3); refused holds or failed calls alone are not (exit code 1).
    pub fn promises_kept(&self) -> bool {
        let expected = self.sessions as u64 * u64::from(self.quantity);
        self.held_at_end == 0
            && self.sold == self.paid * u64::from(self.quantity)
            && self.sold + self.available == expected
            && self.invariant_violations.unwrap_or(0) == 0
            && self.reconciliation_findings.unwrap_or(0) == 0
    }

    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        json::line(&SessionsJson {
            report: self,
            clean: self.clean(),
            phases: self.phases.iter().map(PhaseJson::from).collect(),
        })
    }
}

impl fmt::Display for SessionsReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_counts(f)?;
        self.fmt_phases(f)?;
        writeln!(
            f,
            "result: {}",
            if self.clean() {
                "every session held its places at once; counters add up"
            } else {
                "FAILED (see above)"
            }
        )
    }
}

impl SessionsReport {
    /// The counts and checks, one per line.
    fn fmt_counts(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let expected = self.sessions as u64 * u64::from(self.quantity);
        writeln!(
            f,
            "{:<40} {}",
            "checkout sessions open at once", self.sessions
        )?;
        writeln!(f, "{:<40} {}", "events", self.events)?;
        writeln!(
            f,
            "{:<40} {} (expected {expected})",
            "places held at the peak (server count)", self.held_at_peak
        )?;
        writeln!(
            f,
            "{:<40} {}",
            "holds refused (must be 0)", self.holds_refused
        )?;
        writeln!(
            f,
            "{:<40} {} / {} / {}",
            "at the end: sold / free / held", self.sold, self.available, self.held_at_end
        )?;
        writeln!(f, "{:<40} {}", "sessions that paid", self.paid)?;
        // Checked only with the embedded server: a --target run sees the server from outside,
        // and leaves the rows out.
        if let Some(n) = self.invariant_violations {
            writeln!(f, "{:<40} {n}", "invariant violations (must be 0)")?;
        }
        if let Some(n) = self.reconciliation_findings {
            writeln!(f, "{:<40} {n}", "reconciliation findings (must be 0)")?;
        }
        match self.peak_rss_bytes {
            Some(b) => writeln!(
                f,
                "{:<40} {:.0} MB",
                "peak resident memory (this process)",
                b as f64 / 1e6
            )?,
            None => writeln!(f, "{:<40} unknown", "peak resident memory (this process)")?,
        }
        writeln!(f, "{:<40} {:.2} s", "wall time", self.seconds)?;
        Ok(())
    }

    /// Each phase's calls, rate and latencies, then the first error of each.
    fn fmt_phases(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<24} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9}",
            "phase", "calls", "errors", "calls/s", "p50 µs", "p99 µs", "p999 µs", "max µs"
        )?;
        for p in &self.phases {
            writeln!(
                f,
                "{:<24} {:>8} {:>7} {:>10.0} {:>9} {:>9} {:>9} {:>9}",
                p.name,
                p.calls,
                p.errors,
                p.rate(),
                p.latency_us[0],
                p.latency_us[1],
                p.latency_us[2],
                p.latency_us[3]
            )?;
        }
        for p in &self.phases {
            if let Some(e) = &p.first_error {
                writeln!(f, "first {} error: {e}", p.name)?;
            }
        }
        Ok(())
    }
}
