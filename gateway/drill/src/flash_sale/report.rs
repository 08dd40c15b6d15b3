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
    /// The uncoordinated baseline (`--naive`) was played, in-process, instead of the sale: only
    /// the seat counts and the wall time apply (the table shows only those).
    pub naive: bool,
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
    /// The most holds made in any one-second window of the progress samples: the maximum of the
    /// plot's "holds per second" line.
    pub peak_holds_per_second: u64,
    /// The most fans admitted in any one-second window: the maximum of the plot's "admissions
    /// per second" line.
    pub peak_admissions_per_second: u64,
    /// Fans admitted by the waiting room.
    pub admitted: u64,
    /// Share of post-opening fans 1,000 arrivals apart who stand in line in arrival order (1.0:
    /// first come, first served).
    #[serde(serialize_with = "json::opt_share")]
    pub fcfs_after_opening: Option<f64>,
    /// Fans turned away with SOLD_OUT.
    pub sold_out_answers: u64,
    /// Fans told by the line that every place was taken (`QUEUE_STATE_SOLD_OUT`) while they
    /// waited, once each.
    pub told_sold_out: u64,
    /// How long after the later of the last hold acknowledged before it and their place in
    /// line (their `Join` answered) the fans told sold out were told, ms: median.
    pub told_sold_out_p50_ms: Option<u64>,
    /// The same, the longest.
    pub told_sold_out_max_ms: Option<u64>,
    /// With `--pause-at`: when the pause was answered, seconds since the sale's start (the
    /// plot's time axis).
    #[serde(serialize_with = "json::opt_millis")]
    pub paused_at_seconds: Option<f64>,
    /// With `--pause-at`: when the resume was answered, seconds since the sale's start.
    #[serde(serialize_with = "json::opt_millis")]
    pub resumed_at_seconds: Option<f64>,
    /// With `--pause-at`: places taken (held or sold) while the sale was paused, from the
    /// pause's answer to the resume (0 or less: none may be taken).
    pub places_taken_during_pause: Option<i64>,
    /// With `--pause-at`: how long the pause took to answer (every section paused), ms.
    pub pause_call_ms: Option<u64>,
    /// Joins and holds refused with `SALE_PAUSED` (the fans waited and tried again).
    pub sale_paused_answers: u64,
    /// With `--hoarders`: the bots.
    pub hoarders: Option<u64>,
    /// With `--hoarders`: the holds they made (one per TTL each, none paid).
    pub hoarder_holds: Option<u64>,
    /// With `--hoarders`: the places they held when the last fan was done: kept from paying
    /// fans (they expire after the sale, unsold).
    pub hoarded_at_end: Option<u64>,
    /// With `--presale-codes`: the presale, and each code's uses against its cap.
    pub presale: Option<super::presale::PresaleFigures>,
    /// With `--after-sale`: the tickets given back and moved after the sale.
    pub after_sale: Option<super::presale::AfterSale>,
    /// The event's hold cool-down, seconds (`--hold-cooldown-seconds`; 0: none).
    pub hold_cooldown_seconds: u32,
    /// The change stream as the sale's own reader followed it (`WatchChanges`), and whether
    /// it adds up to the seats.
    pub changes_followed: Option<super::watch::ChangesFollowed>,
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
    /// The follower replaced live (`--replace-node-after`).
    pub replaced_node: Option<u64>,
    /// The node that took its place.
    pub replaced_by: Option<u64>,
    /// When the replacement began, seconds after the sale opened.
    #[serde(serialize_with = "json::opt_millis")]
    pub replaced_after_opening_seconds: Option<f64>,
    /// From the new node's start until it voted in every group and the old one was removed
    /// and stopped, ms.
    pub replace_ms: Option<u64>,
    /// Elections held while the sale ran (the rise of the Raft terms, summed over the groups):
    /// those after the kill, and any a node held when it heard from no leader in time (a loaded
    /// machine). `None`: no live node reported its terms.
    pub elections: Option<u64>,
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

impl ClusterFigures {
    /// The elections, told so that the count and its explanation agree: a kill forces at
    /// least one; others come from a node that heard from no leader in time.
    fn elections_row(&self) -> String {
        match (self.elections, self.killed_node) {
            (None, _) => "unknown (no live node reported its Raft terms)".into(),
            (Some(0), None) => "0".into(),
            (Some(n), None) => format!("{n} (no kill: a node heard from no leader in time)"),
            (Some(0), Some(_)) => {
                "0 seen (the terms had not risen when the nodes were last asked)".into()
            }
            (Some(1), Some(_)) => "1 (the one after the kill)".into(),
            (Some(n), Some(_)) => format!(
                "{n} (one after the kill, {} more: a node heard from no leader in time)",
                n - 1
            ),
        }
    }
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
    /// Whether the run kept every promise and no call failed unexpectedly.
    pub fn clean(&self) -> bool {
        self.errors == 0
            && self.after_sale.as_ref().is_none_or(|a| a.failed == 0)
            && self.promises_kept()
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
            && self.changes_followed.as_ref().is_none_or(|c| c.adds_up)
            && self
                .presale
                .as_ref()
                .is_none_or(|p| p.codes_over_cap == 0 && p.codes_miscounted == 0)
    }

    fn rows(&self) -> Vec<(&'static str, String)> {
        if self.naive {
            return self.naive_rows();
        }
        [
            self.outcome_rows(),
            self.cluster_rows(),
            self.load_rows(),
            self.path_rows(),
            self.latency_rows(),
        ]
        .concat()
    }

    /// The naive baseline's figures: what it booked, and how often past one booking a seat.
    fn naive_rows(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "mode",
                "naive baseline (in-process): every fan read a seat map up to 100 ms old and \
                 booked what looked free, with no atomic hold"
                    .into(),
            ),
            ("fans", self.fans.to_string()),
            ("seats", self.seats.to_string()),
            ("seats booked at least once", self.sold.to_string()),
            ("seats never booked", self.available.to_string()),
            ("bookings (tickets handed out)", self.tickets.to_string()),
            (
                "oversold: bookings past one a seat",
                self.oversold.to_string(),
            ),
            ("seats booked twice or more", self.double_booked.to_string()),
            ("wall time", format!("{:.2} s", self.sale_seconds)),
        ]
    }

    /// The line that ends the table: the verdict for each of [`Report::clean`], calls failed
    /// with every promise kept, and a broken promise ([`Report::promises_kept`] false), in that
    /// order. The naive baseline's says that it oversold as meant, and why that exits 3.
    pub fn result_lines(&self) -> [String; 3] {
        if self.naive {
            return [
                "result: the naive baseline sold no seat twice this time (with few fans at \
                 once it may not; with many it does)"
                    .into(),
                "result: the naive baseline made no calls that could fail".into(),
                format!(
                    "result: the naive baseline oversold, as it is meant to: {} bookings past \
                     one a seat, {} seats booked twice or more. Exit code 3 marks that broken \
                     promise; the real sale (without --naive) keeps it",
                    self.oversold, self.double_booked
                ),
            ];
        }
        [
            "result: every seat sold at most once; counters add up".into(),
            "result: FAILED: calls failed (see above); every seat sold at most once".into(),
            "result: FAILED: the sale broke a promise (see above)".into(),
        ]
    }

    /// What was sold, and the checks.
    fn outcome_rows(&self) -> Vec<(&'static str, String)> {
        let mut rows = vec![
            ("fans", self.fans.to_string()),
            ("seats", self.seats.to_string()),
            ("sold", self.sold.to_string()),
            ("free at the end", self.available.to_string()),
            ("held at the end", self.held.to_string()),
            ("tickets issued", self.tickets.to_string()),
            ("oversold (must be 0)", self.oversold.to_string()),
            ("double-booked (must be 0)", self.double_booked.to_string()),
        ];
        // Only a server the run opened itself (embedded, or the cluster's copies) is checked
        // from inside; a --target run sees the server from outside.
        if self.engine_checked {
            rows.push((
                "invariant violations (must be 0)",
                self.invariant_violations.to_string(),
            ));
            rows.push((
                "reconciliation findings (must be 0)",
                self.reconciliation_findings.to_string(),
            ));
        }
        rows
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
                    (None, _) => String::new(),
                    (Some(_), Some(ms)) => format!("{ms} ms ({} leads)", node(c.new_leader)),
                    (Some(_), None) => "no leader within 30 s".into(),
                },
            ),
            (
                "node replaced (live)",
                match (c.replaced_node, c.replaced_by) {
                    (Some(old), Some(new)) => format!(
                        "node {old} by node {new}, {:.2} s after the opening, in {} ms",
                        c.replaced_after_opening_seconds.unwrap_or_default(),
                        c.replace_ms.unwrap_or_default()
                    ),
                    _ => String::new(),
                },
            ),
            ("elections while the sale ran", c.elections_row()),
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
        .into_iter()
        // Without a kill there is no failover to time.
        .filter(|(_, v)| !v.is_empty())
        .collect()
    }

    /// How long, how many calls, how fast.
    fn load_rows(&self) -> Vec<(&'static str, String)> {
        let rate = |n: u64| format!("{:.0}/s", n as f64 / self.sale_seconds.max(1e-9));
        vec![
            ("sale wall time", format!("{:.2} s", self.sale_seconds)),
            (
                "last place sold after",
                match self.sold_out_after_seconds {
                    Some(s) => format!(
                        "{s:.2} s (the sale ended {:.2} s later)",
                        (self.sale_seconds - s).max(0.0)
                    ),
                    None => format!(
                        "not sold out ({} free, {} held at the end)",
                        self.available, self.held
                    ),
                },
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
            (
                "holds",
                format!(
                    "{} ({}; {}/s in the busiest second)",
                    self.holds,
                    rate(self.holds),
                    self.peak_holds_per_second
                ),
            ),
            (
                "confirms",
                format!("{} ({})", self.confirms, rate(self.confirms)),
            ),
        ]
    }

    /// The fans' ways through the sale (rows that cannot apply to the run left out).
    fn path_rows(&self) -> Vec<(&'static str, String)> {
        let mut rows = vec![(
            "fans admitted by the waiting room",
            format!(
                "{} ({}/s in the busiest second)",
                self.admitted, self.peak_admissions_per_second
            ),
        )];
        if let Some(f) = self.fcfs_after_opening {
            rows.push((
                "admission order after opening",
                format!(
                    "{:.1}% of fans {FCFS_STRIDE} arrivals apart in line order",
                    f * 100.0
                ),
            ));
        }
        if let (Some(bots), Some(holds), Some(kept)) =
            (self.hoarders, self.hoarder_holds, self.hoarded_at_end)
        {
            rows.push((
                "hoarders: bots / their holds / places kept from paying fans",
                format!(
                    "{bots} / {holds} / {kept} ({:.2}% of the seats held when the last fan was \
                     done; unsold at the end: {}; hold cool-down {} s)",
                    100.0 * kept as f64 / f64::from(self.seats.max(1)),
                    self.available,
                    self.hold_cooldown_seconds
                ),
            ));
        }
        if let Some(p) = &self.presale {
            rows.push((
                "presale: codes / cap each / seconds / places under codes",
                format!(
                    "{} / {} / {:.1} s / {} ({} codes used up exactly, {} over their cap, {} \
                     counted apart from their holds; {} holds waited for the public sale)",
                    p.codes,
                    p.cap_per_code,
                    p.seconds,
                    p.places_under_codes,
                    p.codes_used_up,
                    p.codes_over_cap,
                    p.codes_miscounted,
                    p.waited_for_public_sale
                ),
            ));
        }
        if let Some(a) = &self.after_sale {
            rows.push((
                "after the sale: tickets given back / moved to a friend",
                format!(
                    "{} / {} ({} calls failed; after the sale's end: places given back stay free, checked below)",
                    a.cancelled, a.transferred, a.failed
                ),
            ));
        }
        if let Some(c) = &self.changes_followed {
            rows.push((
                "change stream: holds / releases / expiries / orders",
                format!(
                    "{} / {} / {} / {} ({} changes, {} of them while following; orders' places {}; {})",
                    c.holds,
                    c.released,
                    c.expired,
                    c.orders,
                    c.changes,
                    c.while_following,
                    c.order_places,
                    if c.adds_up {
                        "adds up to the seats"
                    } else {
                        "DOES NOT ADD UP"
                    }
                ),
            ));
        }
        if let (Some(from), Some(to)) = (self.paused_at_seconds, self.resumed_at_seconds) {
            rows.push((
                "sale paused (operator): from / to / places taken meanwhile",
                format!(
                    "{from:.2} s / {to:.2} s / {} (the pause answered in {} ms; {} joins and \
                     holds told SALE_PAUSED, tried again)",
                    self.places_taken_during_pause.unwrap_or(0),
                    self.pause_call_ms.unwrap_or(0),
                    self.sale_paused_answers
                ),
            ));
        }
        rows.extend([
            ("SOLD_OUT answers", self.sold_out_answers.to_string()),
            (
                "fans told sold out in line (after the last hold: median / max)",
                match (self.told_sold_out_p50_ms, self.told_sold_out_max_ms) {
                    (Some(p50), Some(max)) => format!(
                        "{} ({:.2} s / {:.2} s)",
                        self.told_sold_out,
                        p50 as f64 / 1e3,
                        max as f64 / 1e3
                    ),
                    _ => self.told_sold_out.to_string(),
                },
            ),
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
        ]);
        // The sweeper's figures are known to the embedded server only.
        if let Some(lag) = self.expiry_lag_max_ms {
            rows.push((
                "holds expired / max expiry lag",
                format!("{} / {lag} ms", self.expired),
            ));
        }
        rows.push((
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
        ));
        rows.extend([
            ("shed (OVERLOADED)", self.shed.to_string()),
            (
                "unexpected errors",
                match &self.first_error {
                    Some(e) => format!("{} (first: {e})", self.errors),
                    None => self.errors.to_string(),
                },
            ),
        ]);
        rows
    }

    /// The latency percentiles (the proof of work's only when the event asked for one).
    fn latency_rows(&self) -> Vec<(&'static str, String)> {
        let mut rows = vec![
            ("hold ms p50/p95/p99/max", self.hold_us.ms()),
            ("confirm ms p50/p95/p99/max", self.confirm_us.ms()),
            ("join ms p50/p95/p99/max", self.join_us.ms()),
            ("status poll ms p50/p95/p99/max", self.status_us.ms()),
        ];
        if self.join_pow_bits > 0 {
            rows.push(("pow solve ms p50/p95/p99/max", self.pow_solve_us.ms()));
        }
        rows
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
        self.peak_holds_per_second = peak_rate(samples, |s| s.holds);
        self.peak_admissions_per_second = peak_rate(samples, |s| s.admitted);
        self.confirms = n(&tally.confirms_ok);
        self.sold_out_answers = n(&tally.sold_out);
        self.told_sold_out = n(&tally.told_sold_out);
        self.sale_paused_answers = n(&tally.sale_paused);
        if let Ok(d) = tally.sold_out_delays.lock() {
            let mut ms: Vec<u64> = d
                .iter()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .collect();
            ms.sort_unstable();
            self.told_sold_out_p50_ms = ms.get(ms.len() / 2).copied();
            self.told_sold_out_max_ms = ms.last().copied();
        }
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
        // Places given back after the sale's end (`--after-sale`) do not undo its sell-out.
        let given_back = self.after_sale.as_ref().map_or(0, |a| a.cancelled);
        if u64::from(self.available) == given_back && self.held == 0 {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows' names of a table.
    fn names(r: &Report) -> Vec<&'static str> {
        r.rows().into_iter().map(|(k, _)| k).collect()
    }

    #[test]
    fn the_naive_baseline_says_it_oversold_as_meant_and_why_it_exits_3() {
        let r = Report {
            naive: true,
            fans: 1_000,
            seats: 200,
            sold: 200,
            tickets: 312,
            oversold: 112,
            double_booked: 55,
            sale_seconds: 9.99,
            nodes: 1,
            ..Report::default()
        };
        assert!(!r.promises_kept(), "overselling is a broken promise");
        let table = r.table();
        for want in [
            "naive baseline (in-process)",
            "seats booked at least once          200",
            "seats never booked                  0",
            "bookings (tickets handed out)       312",
            "oversold: bookings past one a seat  112",
            "seats booked twice or more          55",
        ] {
            assert!(table.contains(want), "{want:?} in\n{table}");
        }
        // Nothing of the real sale: no calls, latencies, waiting room, "sold out".
        for absent in [
            "FAILED",
            "sold out",
            "gRPC calls",
            "hold ms",
            "waiting room",
            "must be 0",
        ] {
            assert!(!table.contains(absent), "{absent:?} in\n{table}");
        }
        let [_, _, broken] = r.result_lines();
        assert!(
            broken.starts_with("result: the naive baseline oversold, as it is meant to: 112 ")
                && broken.contains("55 seats booked twice or more")
                && broken.contains("Exit code 3")
                && !broken.contains("FAILED"),
            "{broken}"
        );
    }

    #[test]
    fn rows_that_cannot_apply_to_a_run_are_left_out() {
        // A --target run: the server is seen from outside, no proof of work, no sweeper figures.
        let target = Report {
            seats: 10,
            sold: 10,
            tickets: 10,
            sale_seconds: 2.0,
            sold_out_after_seconds: Some(1.5),
            nodes: 1,
            ..Report::default()
        };
        let n = names(&target);
        for absent in [
            "invariant violations (must be 0)",
            "reconciliation findings (must be 0)",
            "holds expired / max expiry lag",
            "pow solve ms p50/p95/p99/max",
            "admission order after opening",
            "nodes",
        ] {
            assert!(!n.contains(&absent), "{absent:?} in {n:?}");
        }
        assert!(!target.table().contains("n/a"), "{}", target.table());
        // The embedded server: checked from inside, with the sweeper's figures.
        let embedded = Report {
            engine_checked: true,
            expiry_lag_max_ms: Some(40),
            join_pow_bits: 8,
            fcfs_after_opening: Some(0.98),
            ..target.clone()
        };
        let n = names(&embedded);
        for present in [
            "invariant violations (must be 0)",
            "reconciliation findings (must be 0)",
            "holds expired / max expiry lag",
            "pow solve ms p50/p95/p99/max",
            "admission order after opening",
        ] {
            assert!(n.contains(&present), "{present:?} in {n:?}");
        }
        let [clean, failed, broken] = embedded.result_lines();
        assert_eq!(
            clean,
            "result: every seat sold at most once; counters add up"
        );
        assert!(failed.contains("calls failed") && broken.contains("broke a promise"));
    }

    #[test]
    fn the_election_count_and_its_explanation_agree() {
        let row = |elections, killed_node| {
            let r = Report {
                nodes: 3,
                cluster: Some(ClusterFigures {
                    elections,
                    killed_node,
                    failover_ms: killed_node.map(|_| 900),
                    new_leader: killed_node.map(|n| n % 3 + 1),
                    ..ClusterFigures::default()
                }),
                ..Report::default()
            };
            let rows = r.rows();
            let (_, v) = rows
                .iter()
                .find(|(k, _)| *k == "elections while the sale ran")
                .cloned()
                .expect("an elections row");
            (v, rows.iter().any(|(k, _)| k.starts_with("failover")))
        };
        assert_eq!(row(Some(1), Some(2)).0, "1 (the one after the kill)");
        assert_eq!(
            row(Some(3), Some(2)).0,
            "3 (one after the kill, 2 more: a node heard from no leader in time)"
        );
        assert!(
            row(Some(0), Some(2))
                .0
                .starts_with("0 seen (the terms had not risen")
        );
        assert_eq!(
            row(Some(0), None),
            ("0".to_owned(), false),
            "no kill, no failover row"
        );
        assert!(row(Some(2), None).0.starts_with("2 (no kill:"));
        assert!(row(None, Some(1)).0.starts_with("unknown"));
        assert!(row(Some(1), Some(1)).1, "a kill has a failover row");
    }
}
