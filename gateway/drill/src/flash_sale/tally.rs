//! What the fans count while the sale runs: calls, outcomes, latencies, the tickets they got.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use hdrhistogram::Histogram;

/// A ticket a fan bought: its section, and its seat (empty in general admission).
pub(crate) type Ticket = (String, String);

/// An order a fan was told about (`Confirm` answered OK).
#[derive(Debug, Clone)]
pub(crate) struct AckedOrder {
    pub order_id: String,
    pub hold_id: String,
    pub user_id: String,
    /// Its tickets.
    pub tickets: usize,
}

/// What the fans were told succeeded, to read back at the end of a cluster run.
#[derive(Debug, Default)]
pub(crate) struct Acked {
    /// (hold id, user id) of every `Hold` answered OK.
    pub holds: Vec<(String, String)>,
    /// Every `Confirm` answered OK.
    pub orders: Vec<AckedOrder>,
}

/// The fans' counters, shared by every fan task and read by the progress sampler.
#[derive(Default)]
pub(crate) struct Tally {
    /// Fans who arrived so far.
    pub arrived: AtomicUsize,
    pub calls: AtomicU64,
    pub admitted: AtomicU64,
    pub holds_ok: AtomicU64,
    pub sold_out: AtomicU64,
    pub stale_seat_map: AtomicU64,
    pub shed: AtomicU64,
    pub confirms_ok: AtomicU64,
    pub walked_away: AtomicU64,
    pub declined_then_paid: AtomicU64,
    pub waitlist_joined: AtomicU64,
    pub waitlist_bought: AtomicU64,
    /// Waitlist joins refused with `PLACES_AVAILABLE`: the fan held instead.
    pub waitlist_places_available: AtomicU64,
    /// Payers whose hold expired before they paid (`HOLD_EXPIRED` on `Confirm`).
    pub too_late: AtomicU64,
    /// Seen by the progress sampler: no place free and none held, so every place is sold and
    /// none can come back (orders are final).
    pub sold_out_for_good: AtomicBool,
    /// Calls of fans checking their waitlist entry (polls, and the event's counts at the end).
    pub waitlist_checks: AtomicU64,
    /// Fans who have not finished their way through the line, hold and payment yet (those on
    /// the waitlist count as finished: they can only take places that come back).
    pub in_sale: AtomicU64,
    /// Join challenges solved (events with a proof of work before `Join`).
    pub pow_solved: AtomicU64,
    /// Time spent solving them, summed over the fans, ns.
    pub pow_solve_ns: AtomicU64,
    /// Calls that failed on a node (it was down, had no serving leader, or the connection
    /// broke) and were sent again to another node (clusters only).
    pub failover_calls: AtomicU64,
    /// Their failed attempts.
    pub failover_attempts: AtomicU64,
    /// Fans whose place in line was gone (the waiting room of a leader that died) and who
    /// joined the line again.
    pub sent_back_to_line: AtomicU64,
    /// What the fans were told succeeded (recorded on cluster runs only).
    pub acked: Mutex<Acked>,
    pub errors: AtomicU64,
    pub first_error: Mutex<Option<String>>,
    /// (fan index, position in line) of fans who joined after the opening.
    pub positions: Mutex<Vec<(usize, u64)>>,
    /// Fans told by the line that every place is taken (`QUEUE_STATE_SOLD_OUT`), once each.
    pub told_sold_out: AtomicU64,
    /// Joins and holds refused with `SALE_PAUSED` (tried again after a wait).
    pub sale_paused: AtomicU64,
    /// Holds the presale turned away (no code, or the code used up): tried again once the
    /// public sale began.
    pub presale_waits: AtomicU64,
    /// Holds the hoarding bots (`--hoarders`) made.
    pub hoarder_holds: AtomicU64,
    /// When the last hold was acknowledged.
    pub last_hold: Mutex<Option<Instant>>,
    /// For each fan told sold out: how long after the later of the last hold acknowledged
    /// before it and the fan's join it was told.
    pub sold_out_delays: Mutex<Vec<std::time::Duration>>,
}

impl Tally {
    /// Counts an unexpected error (and keeps the first one's text).
    pub fn error(&self, what: &str, s: Option<&tonic::Status>) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let text = match s {
            Some(s) => format!("{what}: {:?} {} {}", s.code(), reason(s), s.message()),
            None => what.to_owned(),
        };
        tracing::warn!(error = %text, "fan error");
        if let Ok(mut f) = self.first_error.lock() {
            f.get_or_insert(text);
        }
    }
}

/// Latency histograms of the fans' calls, µs.
pub(crate) struct Latencies {
    pub join: Histogram<u64>,
    pub status: Histogram<u64>,
    pub hold: Histogram<u64>,
    pub confirm: Histogram<u64>,
    /// Solving a join challenge (the hash search only, not the calls).
    pub pow_solve: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Latencies {
        Latencies {
            join: histogram(),
            status: histogram(),
            hold: histogram(),
            confirm: histogram(),
            pow_solve: histogram(),
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// Records the time since `started` in the histogram `which` picks.
pub(crate) fn record(
    lat: &Mutex<Latencies>,
    which: fn(&mut Latencies) -> &mut Histogram<u64>,
    started: Instant,
) {
    record_duration(lat, which, started.elapsed());
}

/// Records `took` in the histogram `which` picks.
pub(crate) fn record_duration(
    lat: &Mutex<Latencies>,
    which: fn(&mut Latencies) -> &mut Histogram<u64>,
    took: std::time::Duration,
) {
    let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
    if let Ok(mut l) = lat.lock() {
        let _ = which(&mut l).record(us);
    }
}

/// The `ErrorInfo.reason` of a status, or "".
pub(crate) fn reason(s: &tonic::Status) -> String {
    boxoffice_client::reason(s).unwrap_or_default()
}
