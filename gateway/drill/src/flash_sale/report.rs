//! The figures of a sale: what the fans counted, what the server says at the end, and the
//! checks; as a table for people and as JSON for tools.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Instant;

use boxoffice_proto::v1 as pb;
use hdrhistogram::Histogram;
use serde::Serialize;

use super::progress::{Sample, peak_rate};
use super::tally::{Latencies, Tally, Ticket};
use crate::json;

/// Fans compared for first-come-first-served order are this many arrivals apart.
const FCFS_STRIDE: usize = 1_000;

/// The figures of a run. Its JSON ([`Report::json`]) has the fields below in this order, but
/// for those marked table-only, and ends with `clean`; the latencies are named
/// `*_latency_us` there; the cluster's figures ([`ClusterFigures`]) are there on cluster runs
/// only, as fields of the object itself.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Report {
    /// Fans who tried.
    pub fans: usize,
    /// Seats on sale.
    pub seats: u32,
    /// Places sold (engine's count).
    pub sold: u32,
    /// Places free at the end.
    pub available: u32,
    /// Places still held at the end (0 once TTLs passed).
    pub held: u32,
    /// Tickets the fans hold.
    pub tickets: u64,
    /// Seats sold more than capacity allows.
    pub oversold: u64,
    /// Seats in two orders.
    pub double_booked: u64,
    /// Engine invariant violations found.
    pub invariant_violations: u64,
    /// Reconciliation findings (orders vs payments vs the sold-seat backstop).
    pub reconciliation_findings: u64,
    /// Whether the two above were checked (only with the embedded server: `--target` runs see
    /// the server from outside). Table only.
    #[serde(skip)]
    pub engine_checked: bool,
    /// Wall time of the sale (first arrival to last fan done).
    #[serde(serialize_with = "json::millis")]
    pub sale_seconds: f64,
    /// Time until the last place was sold (all confirmed).
    #[serde(serialize_with = "json::opt_millis")]
    pub sold_out_after_seconds: Option<f64>,
    /// Successful holds.
    pub holds: u64,
    /// Successful confirms.
    pub confirms: u64,
    /// gRPC calls the fans made (all kinds; the gate's load).
    pub calls: u64,
    /// The gate's busiest second: the most calls the fans made in any one-second window of the
    /// progress samples (taken every 250 ms).
    pub peak_calls_per_second: u64,
    /// Of `calls`, those of fans checking their waitlist entry (once a second while waiting).
    pub waitlist_checks: u64,
    /// Payers whose hold had expired when they paid (`HOLD_EXPIRED`).
    pub paid_too_late: u64,
    /// The busiest second without the waitlist checks.
    pub peak_calls_per_second_without_waitlist: u64,
    /// Fans admitted by the waiting room.
    pub admitted: u64,
    /// Share of post-opening fans 1,000 arrivals apart who stand in line in arrival order (1.0:
    /// first come, first served).
    #[serde(serialize_with = "json::opt_share")]
    pub fcfs_after_opening: Option<f64>,
    /// Fans turned away with SOLD_OUT.
    pub sold_out_answers: u64,
    /// Fans who joined the waitlist after a SOLD_OUT.
    pub waitlist_joined: u64,
    /// Waitlist offers confirmed.
    pub waitlist_bought: u64,
    /// Waitlist joins refused with `PLACES_AVAILABLE` (places had come back since the
    /// `SOLD_OUT`): the fan held them instead.
    pub waitlist_places_available: u64,
    /// Payments declined once and paid with another card.
    pub declined_then_paid: u64,
    /// Requests the gate shed and the fans retried.
    pub retried_after_shed: u64,
    /// Exact-seat picks that lost the race (stale seat map).
    pub stale_seat_map: u64,
    /// Holds walked away from (expired later).
    pub walked_away: u64,
    /// Requests shed by overload.
    pub shed: u64,
    /// Unexpected errors.
    pub errors: u64,
    /// The first unexpected error, if any. Table only.
    #[serde(skip)]
    pub first_error: Option<String>,
    /// Holds the sweeper expired (embedded server). Table only.
    #[serde(skip)]
    pub expired: u64,
    /// The largest delay between a hold's deadline and its expiry, ms (embedded server). Table
    /// only.
    #[serde(skip)]
    pub expiry_lag_max_ms: Option<u64>,
    /// Hold latency percentiles in µs.
    #[serde(rename = "hold_latency_us")]
    pub hold_us: Percentiles,
    /// Confirm latency percentiles in µs.
    #[serde(rename = "confirm_latency_us")]
    pub confirm_us: Percentiles,
    /// Join latency percentiles in µs.
    #[serde(rename = "join_latency_us")]
    pub join_us: Percentiles,
    /// GetStatus latency percentiles in µs.
    #[serde(rename = "status_latency_us")]
    pub status_us: Percentiles,
    /// The proof of work the event asked before `Join`, in leading zero bits (0: none).
    pub join_pow_bits: u32,
    /// Join challenges the fans solved.
    pub pow_solved: u64,
    /// Time the fans spent solving them, summed, seconds of a core.
    #[serde(serialize_with = "json::millis")]
    pub pow_solve_seconds: f64,
    /// Percentiles of one fan's solve time in µs (the hash search only).
    #[serde(rename = "pow_solve_us")]
    pub pow_solve_us: Percentiles,
    /// Servers the sale played against: 1 (the embedded server, or `--target`) or 3 (a local
    /// cluster, `--nodes 3`).
    pub nodes: u32,
    /// A cluster run's figures (`--nodes 3`).
    #[serde(flatten)]
    pub cluster: Option<ClusterFigures>,
}

/// The figures of a sale against a local cluster (`--nodes 3`).
#[derive(Debug, Default, Clone, Serialize)]
pub struct ClusterFigures {
    /// The node killed with SIGKILL (`--kill-leader-after`): the leader of the sale's group.
    pub killed_node: Option<u64>,
    /// When, seconds after the sale opened.
    #[serde(serialize_with = "json::opt_millis")]
    pub killed_after_opening_seconds: Option<f64>,
    /// From the kill until a live node led the group with its engine serving, ms (`None`: not
    /// within 30 s, or no kill).
    pub failover_ms: Option<u64>,
    /// The node that led after the failover (as its `/metrics` said).
    pub new_leader: Option<u64>,
    /// Elections held while the sale ran (the rise of the group's Raft term): the kill's, and
    /// any a node held when it heard from no leader in time (a loaded machine).
    pub elections: u64,
    /// The fans' calls that failed on a node (it was down, had no serving leader, or the
    /// connection broke) and were sent again, the same request, to another node.
    pub calls_failed_in_failover: u64,
    /// Their failed attempts.
    pub failed_attempts: u64,
    /// Fans whose place in line was gone (`EXPIRED` at position 0, or `TOKEN_EXPIRED`: a line
    /// lost with the leader that kept it; 0 while the waiting room is replicated) and who joined
    /// the line again.
    pub fans_sent_back_to_line: u64,
    /// Holds the fans were told about (`Hold` answered OK), read back through the cluster.
    pub acknowledged_holds: u64,
    /// Orders the fans were told about (`Confirm` answered OK), read back.
    pub acknowledged_orders: u64,
    /// Of those, lost: `NOT_FOUND`, a paid hold not `CONFIRMED`, or an order that reads back
    /// otherwise. Must be 0.
    pub acknowledged_lost: u64,
    /// The first of those, described. Table only.
    #[serde(skip)]
    pub first_lost: Option<String>,
    /// Charges the live nodes' reconciliation refunded: captured for a checkout that a
    /// failover cut, whose hold then ended without an order (the fan was never told it paid).
    pub charges_refunded: u64,
    /// Such charges not refunded yet when the run ended (in the nodes' copies): a leader
    /// refunds them after its grace. Not findings, as for the server's own reconciliation.
    pub refunds_pending: u64,
}

/// Latency percentiles of one kind of call, µs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: u64,
    /// 95th percentile.
    pub p95: u64,
    /// 99th percentile.
    pub p99: u64,
    /// The slowest call.
    pub max: u64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Percentiles {
        Percentiles {
            p50: h.value_at_quantile(0.50),
            p95: h.value_at_quantile(0.95),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        }
    }

    /// "p50 / p95 / p99 / max" in ms.
    fn ms(self) -> String {
        let ms = |us: u64| us as f64 / 1000.0;
        format!(
            "{:.2} / {:.2} / {:.2} / {:.2}",
            ms(self.p50),
            ms(self.p95),
            ms(self.p99),
            ms(self.max)
        )
    }
}

/// The JSON object of a report: its fields, then whether it is clean.
#[derive(Serialize)]
struct ReportJson<'a> {
    #[serde(flatten)]
    report: &'a Report,
    clean: bool,
}

impl Report {
    /// A count the embedded server checked, or "n/a" when it was not checked.
    fn checked(&self, n: u64) -> String {
        if self.engine_checked {
            n.to_string()
        } else {
            "n/a (checked only with the embedded server)".into()
        }
    }

    /// Whether the run kept every promise and no call failed unexpectedly.
    pub fn clean(&self) -> bool {
        self.errors == 0 && self.promises_kept()
    }

    /// Whether the seats add up: none oversold or sold twice, the engine's invariants and the
    /// reconciliation clean, one ticket per sold seat, nothing left held, nothing acknowledged
    /// lost (cluster runs). `false` is a broken
    /// promise (exit code 3); calls that failed alone are not (exit code 1).
    pub fn promises_kept(&self) -> bool {
        self.cluster
            .as_ref()
            .is_none_or(|c| c.acknowledged_lost == 0)
            && self.oversold == 0
            && self.double_booked == 0
            && self.invariant_violations == 0
            && self.reconciliation_findings == 0
            && self.tickets == u64::from(self.sold)
            && self.held == 0
            && self.available + self.sold == self.seats
    }

    fn rows(&self) -> Vec<(&'static str, String)> {
        [
            self.outcome_rows(),
            self.cluster_rows(),
            self.load_rows(),
            self.path_rows(),
            self.latency_rows(),
        ]
        .concat()
    }

    /// What was sold, and the checks.
    fn outcome_rows(&self) -> Vec<(&'static str, String)> {
        vec![
            ("fans", self.fans.to_string()),
            ("seats", self.seats.to_string()),
            ("sold", self.sold.to_string()),
            ("free at the end", self.available.to_string()),
            ("held at the end", self.held.to_string()),
            ("tickets issued", self.tickets.to_string()),
            ("oversold (must be 0)", self.oversold.to_string()),
            ("double-booked (must be 0)", self.double_booked.to_string()),
            (
                "invariant violations (must be 0)",
                self.checked(self.invariant_violations),
            ),
            (
                "reconciliation findings (must be 0)",
                self.checked(self.reconciliation_findings),
            ),
        ]
    }

    /// The cluster's figures (none for one server).
    fn cluster_rows(&self) -> Vec<(&'static str, String)> {
        let Some(c) = &self.cluster else {
            return Vec::new();
        };
        let node = |n: Option<u64>| n.map_or("?".to_owned(), |n| format!("node {n}"));
        vec![
            (
                "nodes",
                format!("{} (boxoffice serve processes on loopback)", self.nodes),
            ),
            (
                "leader killed (SIGKILL)",
                match (c.killed_node, c.killed_after_opening_seconds) {
                    (Some(n), Some(t)) => format!("node {n}, {t:.2} s after the opening"),
                    (Some(n), None) => format!("node {n}"),
                    (None, _) => "none".into(),
                },
            ),
            (
                "failover (until a leader serves again)",
                match (c.killed_node, c.failover_ms) {
                    (None, _) => "n/a".into(),
                    (Some(_), Some(ms)) => format!("{ms} ms ({} leads)", node(c.new_leader)),
                    (Some(_), None) => "no leader within 30 s".into(),
                },
            ),
            (
                "elections while the sale ran",
                format!(
                    "{} ({} the kill's)",
                    c.elections,
                    if c.killed_node.is_some() {
                        "one of them"
                    } else {
                        "none of them"
                    }
                ),
            ),
            (
                "calls failed during the failover (retried)",
                format!(
                    "{} ({} failed attempts, each sent again to another node)",
                    c.calls_failed_in_failover, c.failed_attempts
                ),
            ),
            (
                "fans sent back to the line",
                c.fans_sent_back_to_line.to_string(),
            ),
            (
                "acknowledged but lost (must be 0)",
                format!(
                    "{} (of {} holds and {} orders read back){}",
                    c.acknowledged_lost,
                    c.acknowledged_holds,
                    c.acknowledged_orders,
                    c.first_lost
                        .as_ref()
                        .map_or(String::new(), |f| format!("; first: {f}"))
                ),
            ),
            (
                "checkouts cut by a failover: charges refunded / pending",
                format!(
                    "{} / {} (captured, the hold ended without an order; never told paid)",
                    c.charges_refunded, c.refunds_pending
                ),
            ),
        ]
    }

    /// How long, how many calls, how fast.
    fn load_rows(&self) -> Vec<(&'static str, String)> {
        let rate = |n: u64| format!("{:.0}/s", n as f64 / self.sale_seconds.max(1e-9));
        vec![
            ("sale wall time", format!("{:.2} s", self.sale_seconds)),
            (
                "last place sold after",
                self.sold_out_after_seconds
                    .map_or("not sold out".into(), |s| format!("{s:.2} s")),
            ),
            (
                "gRPC calls by the fans",
                format!("{} ({})", self.calls, rate(self.calls)),
            ),
            (
                "  of which waitlist checks",
                format!("{} ({})", self.waitlist_checks, rate(self.waitlist_checks)),
            ),
            (
                "gate rate in the busiest second",
                format!(
                    "{} calls/s ({} without waitlist checks)",
                    self.peak_calls_per_second, self.peak_calls_per_second_without_waitlist
                ),
            ),
            ("holds", format!("{} ({})", self.holds, rate(self.holds))),
            (
                "confirms",
                format!("{} ({})", self.confirms, rate(self.confirms)),
            ),
        ]
    }

    /// The fans' ways through the sale.
    fn path_rows(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "fans admitted by the waiting room",
                self.admitted.to_string(),
            ),
            (
                "admission order after opening",
                self.fcfs_after_opening.map_or("n/a".into(), |f| {
                    format!(
                        "{:.1}% of fans {FCFS_STRIDE} arrivals apart in line order",
                        f * 100.0
                    )
                }),
            ),
            ("SOLD_OUT answers", self.sold_out_answers.to_string()),
            (
                "waitlist: joined / bought / PLACES_AVAILABLE (held instead)",
                format!(
                    "{} / {} / {}",
                    self.waitlist_joined, self.waitlist_bought, self.waitlist_places_available
                ),
            ),
            (
                "declined once, then paid",
                self.declined_then_paid.to_string(),
            ),
            (
                "calls retried after OVERLOADED",
                self.retried_after_shed.to_string(),
            ),
            ("stale seat-map picks", self.stale_seat_map.to_string()),
            ("walked away (expired)", self.walked_away.to_string()),
            (
                "tried to pay after the hold expired",
                self.paid_too_late.to_string(),
            ),
            (
                "holds expired / max expiry lag",
                match self.expiry_lag_max_ms {
                    Some(l) => format!("{} / {l} ms", self.expired),
                    None => "n/a (known to the embedded server only)".into(),
                },
            ),
            (
                "join proof of work",
                if self.join_pow_bits == 0 {
                    "off".into()
                } else {
                    format!(
                        "{} bits: {} challenges solved, {:.2} s of a core ({:.2} ms a fan)",
                        self.join_pow_bits,
                        self.pow_solved,
                        self.pow_solve_seconds,
                        self.pow_solve_seconds * 1000.0 / self.pow_solved.max(1) as f64
                    )
                },
            ),
            ("shed (OVERLOADED)", self.shed.to_string()),
            (
                "unexpected errors",
                match &self.first_error {
                    Some(e) => format!("{} (first: {e})", self.errors),
                    None => self.errors.to_string(),
                },
            ),
        ]
    }

    /// The latency percentiles.
    fn latency_rows(&self) -> Vec<(&'static str, String)> {
        vec![
            ("hold ms p50/p95/p99/max", self.hold_us.ms()),
            ("confirm ms p50/p95/p99/max", self.confirm_us.ms()),
            ("join ms p50/p95/p99/max", self.join_us.ms()),
            ("status poll ms p50/p95/p99/max", self.status_us.ms()),
            ("pow solve ms p50/p95/p99/max", self.pow_solve_us.ms()),
        ]
    }

    /// The report as a table.
    pub fn table(&self) -> String {
        let rows = self.rows();
        let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, v) in rows {
            out.push_str(&format!("{k:<w$}  {v}\n"));
        }
        out
    }

    /// The report as one line of JSON (the fields of [`Report`] and `clean`).
    pub fn json(&self) -> String {
        json::line(&ReportJson {
            report: self,
            clean: self.clean(),
        })
    }
}

impl Report {
    /// Counts the tickets the fans hold against the server's final counts (`view`): sold,
    /// free and held places, seats sold twice, sections sold past capacity.
    pub(crate) fn count_tickets(&mut self, tickets: &[Ticket], view: &pb::Event) {
        self.tickets = tickets.len() as u64;
        let mut seen = HashSet::new();
        let mut per_section: HashMap<&str, u64> = HashMap::new();
        for (section, seat) in tickets {
            *per_section.entry(section).or_default() += 1;
            if !seat.is_empty() && !seen.insert(seat) {
                self.double_booked += 1;
            }
        }
        for s in &view.sections {
            self.sold += s.sold;
            self.available += s.available;
            self.held += s.held;
            let issued = per_section.get(s.section_id.as_str()).copied().unwrap_or(0);
            self.oversold += issued.saturating_sub(u64::from(s.capacity));
            if issued != u64::from(s.sold) {
                tracing::error!(section = %s.section_id, issued, sold = s.sold, "tickets and sold disagree");
            }
        }
    }

    /// Takes the fans' counters, the busiest seconds of the samples, the line order after the
    /// opening, and the time the last place sold (if all did: `last_sale` after `started`).
    pub(crate) fn count_fans(
        &mut self,
        tally: &Tally,
        samples: &[Sample],
        started: Instant,
        last_sale: Option<Instant>,
    ) {
        let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        self.admitted = n(&tally.admitted);
        self.calls = n(&tally.calls);
        self.peak_calls_per_second = peak_rate(samples, |s| s.calls);
        self.waitlist_checks = n(&tally.waitlist_checks);
        self.paid_too_late = n(&tally.too_late);
        self.peak_calls_per_second_without_waitlist =
            peak_rate(samples, |s| s.calls.saturating_sub(s.waitlist_checks));
        self.holds = n(&tally.holds_ok);
        self.confirms = n(&tally.confirms_ok);
        self.sold_out_answers = n(&tally.sold_out);
        self.stale_seat_map = n(&tally.stale_seat_map);
        self.walked_away = n(&tally.walked_away);
        self.retried_after_shed = n(&tally.shed);
        self.declined_then_paid = n(&tally.declined_then_paid);
        self.waitlist_joined = n(&tally.waitlist_joined);
        self.waitlist_bought = n(&tally.waitlist_bought);
        self.waitlist_places_available = n(&tally.waitlist_places_available);
        self.errors = n(&tally.errors);
        self.pow_solved = n(&tally.pow_solved);
        self.pow_solve_seconds = n(&tally.pow_solve_ns) as f64 / 1e9;
        self.fcfs_after_opening = tally.positions.lock().ok().and_then(|mut p| fcfs(&mut p));
        self.first_error = tally.first_error.lock().ok().and_then(|f| f.clone());
        if self.available == 0 && self.held == 0 {
            self.sold_out_after_seconds =
                last_sale.map(|t| t.duration_since(started).as_secs_f64());
        }
    }

    /// Takes the latency percentiles of the fans' calls.
    pub(crate) fn count_latencies(&mut self, lat: &Mutex<Latencies>) {
        if let Ok(l) = lat.lock() {
            self.hold_us = Percentiles::of(&l.hold);
            self.confirm_us = Percentiles::of(&l.confirm);
            self.join_us = Percentiles::of(&l.join);
            self.status_us = Percentiles::of(&l.status);
            self.pow_solve_us = Percentiles::of(&l.pow_solve);
        }
    }
}

/// First come, first served after the opening: the share of fans who arrived `FCFS_STRIDE`
/// arrivals apart (0.1 s at the default rate; closer ones race each other to the server) who
/// stand in line in that order. `positions`: (arrival index, position in line).
fn fcfs(positions: &mut [(usize, u64)]) -> Option<f64> {
    positions.sort_unstable();
    let pairs: Vec<_> = positions
        .iter()
        .zip(positions.iter().skip(FCFS_STRIDE))
        .collect();
    let ordered = pairs.iter().filter(|(a, b)| a.1 < b.1).count();
    (!pairs.is_empty()).then(|| ordered as f64 / pairs.len() as f64)
}
