//! `boxoffice flash-sale`: the seeds' onsale, played against a real engine (section actors,
//! durable sled log, ledger, sweeper) in this process, then checked seat by seat.
//!
//! Fans arrive over `--arrival-seconds`; each asks for 1 to 4 places: some pick exact seats from
//! the (possibly stale) seat map, some take best available in a section, some anywhere. About
//! `--pay-rate` of those who get a hold confirm it; the others walk away and their holds expire
//! after `--hold-ttl-ms`, so later fans can take those places. At the end every seat is checked:
//! sold exactly once or free, tickets == sold, the engine's own invariants hold.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use boxoffice_engine::{
    ConfirmRequest, Durability, Engine, EngineConfig, EngineError, EventId, EventSpec, HoldRequest,
    Layout, Rejection, RowSpec, SeatId, SeatStatus, SectionId, SectionSpec, Selection, UserId,
};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Flags of `boxoffice flash-sale`.
#[derive(clap::Args, Debug, Clone)]
pub struct FlashSaleArgs {
    /// Fans who try to buy.
    #[arg(long, default_value_t = 100_000)]
    pub fans: usize,
    /// Seats on sale: 40% general admission, the rest in three reserved sections of 50-seat rows.
    #[arg(long, default_value_t = 10_000)]
    pub seats: u32,
    /// Fans arrive evenly over this many seconds.
    #[arg(long, default_value_t = 10.0)]
    pub arrival_seconds: f64,
    /// Fans in flight at once (concurrent client tasks).
    #[arg(long, default_value_t = 512)]
    pub concurrency: usize,
    /// Hold TTL: walked-away holds come back after this long.
    #[arg(long, default_value_t = 2_000)]
    pub hold_ttl_ms: u64,
    /// Share of holders who pay.
    #[arg(long, default_value_t = 0.7)]
    pub pay_rate: f64,
    /// Share of fans who pick exact seats from the seat map (the rest take best available).
    #[arg(long, default_value_t = 0.2)]
    pub exact_rate: f64,
    /// Places one fan may hold or own.
    #[arg(long, default_value_t = 4)]
    pub per_user_limit: u32,
    /// Data dir for the log (default: a temporary dir, removed at the end).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// sync: fsync before every acknowledgement (group commit); buffered: for benchmarks only.
    #[arg(long, default_value = "sync", value_parser = ["sync", "buffered"])]
    pub durability: String,
    /// Random seed for the fans' choices.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The event the sale plays: 40% GA, the rest over three reserved sections.
pub fn sale_event(seats: u32, ttl_ms: u64, per_user_limit: u32) -> EventSpec {
    let ga = seats * 2 / 5;
    let reserved = seats - ga;
    let mut sections = vec![SectionSpec {
        section_id: SectionId::from("floor"),
        name: "Floor (standing)".into(),
        price_cents: 6_500,
        layout: Layout::GeneralAdmission {
            capacity: ga.max(1),
        },
    }];
    let names = [
        ("orch", "Orchestra", 12_000u64),
        ("mezz", "Mezzanine", 9_000),
        ("balc", "Balcony", 5_500),
    ];
    for (i, (id, name, price)) in names.iter().enumerate() {
        let share = reserved / 3 + u32::from((i as u32) < reserved % 3);
        let mut rows = Vec::new();
        let mut left = share;
        let mut r = 0u32;
        while left > 0 {
            let n = left.min(50);
            rows.push(RowSpec {
                label: format!("R{}", r + 1),
                seat_count: n,
            });
            left -= n;
            r += 1;
        }
        if rows.is_empty() {
            continue;
        }
        sections.push(SectionSpec {
            section_id: SectionId::from(*id),
            name: (*name).into(),
            price_cents: *price,
            layout: Layout::Reserved { rows },
        });
    }
    EventSpec {
        event_id: Some(EventId::from("flash")),
        name: "Flash sale".into(),
        sections,
        hold_ttl_ms: ttl_ms,
        per_user_limit,
        admit_rate_per_second: 0,
        admission_window_ms: 0,
        sale_opens_at_ms: 0,
    }
}

#[derive(Default)]
struct Tally {
    holds_ok: AtomicU64,
    sold_out: AtomicU64,
    stale_seat_map: AtomicU64,
    user_limit: AtomicU64,
    shed: AtomicU64,
    confirms_ok: AtomicU64,
    walked_away: AtomicU64,
    errors: AtomicU64,
}

struct Latencies {
    hold: Histogram<u64>,
    confirm: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// A ticket a fan bought: its section, and its seat (`None` in general admission).
type Ticket = (SectionId, Option<SeatId>);

/// One fan: returns the tickets they bought.
async fn fan(
    engine: &Engine,
    event: &EventSpec,
    args: &FlashSaleArgs,
    i: usize,
    tally: &Tally,
    lat: &Mutex<Latencies>,
) -> Vec<Ticket> {
    let mut rng = StdRng::seed_from_u64(args.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let event_id = EventId::from("flash");
    let user = UserId::from(format!("fan-{i}"));
    let quantity = match rng.random_range(0..10) {
        0..=1 => 1,
        2..=5 => 2,
        6..=7 => 3,
        _ => 4,
    }
    .min(args.per_user_limit);
    let roll: f64 = rng.random();
    let sections = &event.sections;
    let mut selection = if roll < args.exact_rate {
        // Read the map (a snapshot: maybe stale), pick seats that looked free.
        let reserved: Vec<&SectionSpec> = sections
            .iter()
            .filter(|s| matches!(s.layout, Layout::Reserved { .. }))
            .collect();
        match reserved.get(rng.random_range(0..reserved.len().max(1))) {
            Some(s) => pick_from_map(engine, &event_id, &s.section_id, quantity, &mut rng)
                .map(Selection::Seats),
            None => None,
        }
    } else if roll < args.exact_rate + 0.5 {
        let s = &sections[rng.random_range(0..sections.len())];
        Some(Selection::BestAvailable {
            section: Some(s.section_id.clone()),
            quantity,
        })
    } else {
        None
    }
    .unwrap_or(Selection::BestAvailable {
        section: None,
        quantity,
    });
    let mut attempt = 0;
    let hold = loop {
        attempt += 1;
        let started = Instant::now();
        let r = engine
            .hold(HoldRequest {
                event_id: event_id.clone(),
                user_id: user.clone(),
                idempotency_key: format!("hold-{i}-{attempt}"),
                selection: selection.clone(),
            })
            .await;
        record(lat, |l| &mut l.hold, started);
        match r {
            Ok(h) => break h,
            Err(EngineError::Rejected(Rejection::SeatUnavailable(_))) if attempt < 3 => {
                // The map was stale: someone was faster. Fall back to best available.
                tally.stale_seat_map.fetch_add(1, Ordering::Relaxed);
            }
            Err(EngineError::Rejected(Rejection::SoldOut))
                if attempt < 3
                    && !matches!(selection, Selection::BestAvailable { section: None, .. }) =>
            {
                // That section is gone; anywhere will do.
            }
            Err(EngineError::Rejected(Rejection::SoldOut | Rejection::SeatUnavailable(_))) => {
                tally.sold_out.fetch_add(1, Ordering::Relaxed);
                return Vec::new();
            }
            Err(EngineError::Rejected(Rejection::UserLimit { .. })) => {
                tally.user_limit.fetch_add(1, Ordering::Relaxed);
                return Vec::new();
            }
            Err(EngineError::Overloaded(_)) => {
                tally.shed.fetch_add(1, Ordering::Relaxed);
                return Vec::new();
            }
            Err(e) => {
                tally.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "hold failed");
                return Vec::new();
            }
        }
        selection = Selection::BestAvailable {
            section: None,
            quantity,
        };
    };
    tally.holds_ok.fetch_add(1, Ordering::Relaxed);
    if rng.random::<f64>() >= args.pay_rate {
        tally.walked_away.fetch_add(1, Ordering::Relaxed);
        return Vec::new();
    }
    let started = Instant::now();
    let r = engine
        .confirm(ConfirmRequest {
            hold_id: hold.hold_id.clone(),
            user_id: user,
            payment_ref: format!("tok_fan_{i}"),
            idempotency_key: format!("pay-{i}"),
        })
        .await;
    record(lat, |l| &mut l.confirm, started);
    match r {
        Ok(order) => {
            tally.confirms_ok.fetch_add(1, Ordering::Relaxed);
            order
                .tickets
                .into_iter()
                .map(|t| (t.section_id, t.seat_id))
                .collect()
        }
        Err(e) => {
            tally.errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "confirm failed");
            Vec::new()
        }
    }
}

fn record(
    lat: &Mutex<Latencies>,
    which: impl Fn(&mut Latencies) -> &mut Histogram<u64>,
    started: Instant,
) {
    let us = u64::try_from(started.elapsed().as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    if let Ok(mut l) = lat.lock() {
        let _ = which(&mut l).record(us);
    }
}

/// Picks `q` adjacent seats that look free in the seat map of `section`, from a random row.
fn pick_from_map(
    engine: &Engine,
    event: &EventId,
    section: &SectionId,
    q: u32,
    rng: &mut StdRng,
) -> Option<Vec<SeatId>> {
    let map = engine.seat_map(event, Some(section)).ok()?;
    let seats = &map.sections.first()?.seats;
    let mut rows: Vec<&str> = seats.iter().map(|s| s.row.as_str()).collect();
    rows.dedup();
    let start = rng.random_range(0..rows.len().max(1));
    for k in 0..rows.len() {
        let row = rows[(start + k) % rows.len()];
        let free: Vec<&boxoffice_engine::SeatView> = seats
            .iter()
            .filter(|s| s.row == row && s.status == SeatStatus::Available)
            .collect();
        for w in free.windows(q as usize) {
            if w.last()?.number - w[0].number == q - 1 {
                return Some(w.iter().map(|s| s.seat_id.clone()).collect());
            }
        }
    }
    None
}

/// The figures of a run.
#[derive(Debug, Default, Clone)]
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
    /// Wall time of the sale (first arrival to last fan done).
    pub sale_seconds: f64,
    /// Time until the last place was sold (all confirmed).
    pub sold_out_after_seconds: Option<f64>,
    /// Successful holds.
    pub holds: u64,
    /// Successful confirms.
    pub confirms: u64,
    /// Fans turned away with SOLD_OUT.
    pub sold_out_answers: u64,
    /// Exact-seat picks that lost the race (stale seat map).
    pub stale_seat_map: u64,
    /// Holds walked away from (expired later).
    pub walked_away: u64,
    /// Requests shed by overload.
    pub shed: u64,
    /// Unexpected errors.
    pub errors: u64,
    /// Hold latency percentiles (p50, p95, p99, max) in µs.
    pub hold_us: [u64; 4],
    /// Confirm latency percentiles (p50, p95, p99, max) in µs.
    pub confirm_us: [u64; 4],
}

fn percentiles(h: &Histogram<u64>) -> [u64; 4] {
    [
        h.value_at_quantile(0.50),
        h.value_at_quantile(0.95),
        h.value_at_quantile(0.99),
        h.max(),
    ]
}

impl Report {
    /// Whether the run kept every promise.
    pub fn clean(&self) -> bool {
        self.oversold == 0
            && self.double_booked == 0
            && self.invariant_violations == 0
            && self.reconciliation_findings == 0
            && self.tickets == u64::from(self.sold)
            && self.errors == 0
            && self.held == 0
            && self.available + self.sold == self.seats
    }

    fn rows(&self) -> Vec<(&'static str, String)> {
        let rate = |n: u64| format!("{:.0}/s", n as f64 / self.sale_seconds.max(1e-9));
        let pct = |p: [u64; 4]| {
            format!(
                "{:.2} / {:.2} / {:.2} / {:.2}",
                p[0] as f64 / 1000.0,
                p[1] as f64 / 1000.0,
                p[2] as f64 / 1000.0,
                p[3] as f64 / 1000.0
            )
        };
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
                self.invariant_violations.to_string(),
            ),
            (
                "reconciliation findings (must be 0)",
                self.reconciliation_findings.to_string(),
            ),
            ("sale wall time", format!("{:.2} s", self.sale_seconds)),
            (
                "last place sold after",
                self.sold_out_after_seconds
                    .map_or("not sold out".into(), |s| format!("{s:.2} s")),
            ),
            ("holds", format!("{} ({})", self.holds, rate(self.holds))),
            (
                "confirms",
                format!("{} ({})", self.confirms, rate(self.confirms)),
            ),
            ("SOLD_OUT answers", self.sold_out_answers.to_string()),
            ("stale seat-map picks", self.stale_seat_map.to_string()),
            ("walked away (expired)", self.walked_away.to_string()),
            ("shed (OVERLOADED)", self.shed.to_string()),
            ("unexpected errors", self.errors.to_string()),
            ("hold ms p50/p95/p99/max", pct(self.hold_us)),
            ("confirm ms p50/p95/p99/max", pct(self.confirm_us)),
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

    /// The report as a JSON object.
    pub fn json(&self) -> String {
        let arr = |p: [u64; 4]| {
            format!(
                "{{\"p50\":{},\"p95\":{},\"p99\":{},\"max\":{}}}",
                p[0], p[1], p[2], p[3]
            )
        };
        format!(
            "{{\"fans\":{},\"seats\":{},\"sold\":{},\"available\":{},\"held\":{},\"tickets\":{},\"oversold\":{},\"double_booked\":{},\"invariant_violations\":{},\"reconciliation_findings\":{},\"sale_seconds\":{:.3},\"sold_out_after_seconds\":{},\"holds\":{},\"confirms\":{},\"sold_out_answers\":{},\"stale_seat_map\":{},\"walked_away\":{},\"shed\":{},\"errors\":{},\"hold_latency_us\":{},\"confirm_latency_us\":{},\"clean\":{}}}\n",
            self.fans,
            self.seats,
            self.sold,
            self.available,
            self.held,
            self.tickets,
            self.oversold,
            self.double_booked,
            self.invariant_violations,
            self.reconciliation_findings,
            self.sale_seconds,
            self.sold_out_after_seconds
                .map_or("null".into(), |s| format!("{s:.3}")),
            self.holds,
            self.confirms,
            self.sold_out_answers,
            self.stale_seat_map,
            self.walked_away,
            self.shed,
            self.errors,
            arr(self.hold_us),
            arr(self.confirm_us),
            self.clean()
        )
    }
}

/// Runs the sale and returns its report (it does not judge it: see [`Report::clean`]).
pub async fn run(args: FlashSaleArgs) -> anyhow::Result<Report> {
    if args.fans == 0 || args.seats < 4 || args.concurrency == 0 {
        bail!("--fans and --concurrency must be at least 1, --seats at least 4");
    }
    if !(0.0..=1.0).contains(&args.pay_rate) || !(0.0..=1.0).contains(&args.exact_rate) {
        bail!("--pay-rate and --exact-rate are shares between 0 and 1");
    }
    let temp;
    let dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary data dir")?;
            temp.path().to_path_buf()
        }
    };
    let mut config = EngineConfig::new(&dir);
    config.durability = if args.durability == "buffered" {
        Durability::Buffered
    } else {
        Durability::Sync
    };
    let engine = Engine::open(config)
        .await
        .with_context(|| format!("opening the engine on {}", dir.display()))?;
    let spec = sale_event(args.seats, args.hold_ttl_ms, args.per_user_limit);
    let event = engine
        .create_event(spec.clone())
        .await
        .context("creating the event")?;
    let event_id = event.event_id.clone();
    let (sweeper, sweeper_task) =
        boxoffice_sweeper::start(engine.clone(), boxoffice_sweeper::SweeperConfig::default())
            .await
            .context("starting the sweeper")?;

    let tally = Arc::new(Tally::default());
    let lat = Arc::new(Mutex::new(Latencies {
        hold: histogram(),
        confirm: histogram(),
    }));
    let next = Arc::new(AtomicUsize::new(0));
    let tickets: Arc<Mutex<Vec<Ticket>>> = Arc::default();
    let last_sale = Arc::new(Mutex::new(None::<Instant>));
    let started = Instant::now();
    let per_fan = Duration::from_secs_f64(args.arrival_seconds.max(0.0) / args.fans as f64);
    let args = Arc::new(args);
    let spec = Arc::new(spec);
    let progress = {
        let engine = engine.clone();
        let event_id = event_id.clone();
        let next = next.clone();
        let fans = args.fans;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Ok(e) = engine.event(&event_id) {
                    let (a, h, s) = e.sections.iter().fold((0, 0, 0), |t, s| {
                        (t.0 + s.available, t.1 + s.held, t.2 + s.sold)
                    });
                    eprintln!(
                        "[{:>5.1}s] fans arrived {:>8}/{fans}  available {a:>6}  held {h:>6}  sold {s:>6}",
                        started.elapsed().as_secs_f64(),
                        next.load(Ordering::Relaxed).min(fans),
                    );
                }
            }
        })
    };
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (engine, args, spec, tally, lat, next, tickets, last_sale) = (
            engine.clone(),
            args.clone(),
            spec.clone(),
            tally.clone(),
            lat.clone(),
            next.clone(),
            tickets.clone(),
            last_sale.clone(),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= args.fans {
                    break;
                }
                tokio::time::sleep_until((started + per_fan * i as u32).into()).await;
                let got = fan(&engine, &spec, &args, i, &tally, &lat).await;
                if !got.is_empty() {
                    if let Ok(mut t) = tickets.lock() {
                        t.extend(got);
                    }
                    if let Ok(mut l) = last_sale.lock() {
                        *l = Some(Instant::now());
                    }
                }
            }
        }));
    }
    for w in workers {
        w.await.context("a fan task panicked")?;
    }
    let sale_seconds = started.elapsed().as_secs_f64();
    // Walked-away holds expire after their TTL; wait for the sweeper to bring them back.
    let deadline =
        Instant::now() + Duration::from_millis(args.hold_ttl_ms) + Duration::from_secs(30);
    loop {
        let held: u32 = engine
            .event(&event_id)?
            .sections
            .iter()
            .map(|s| s.held)
            .sum();
        if held == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    progress.abort();
    sweeper.stop(None);
    let _ = sweeper_task.await;

    // Check every seat.
    let mut report = Report {
        fans: args.fans,
        seats: args.seats,
        sale_seconds,
        ..Report::default()
    };
    let tickets = std::mem::take(&mut *tickets.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    report.tickets = tickets.len() as u64;
    let mut seen = HashSet::new();
    let mut per_section: HashMap<SectionId, u64> = HashMap::new();
    for (section, seat) in &tickets {
        *per_section.entry(section.clone()).or_default() += 1;
        if let Some(seat) = seat
            && !seen.insert(seat.clone())
        {
            report.double_booked += 1;
        }
    }
    let view = engine.event(&event_id)?;
    for s in &view.sections {
        // The actor's own snapshot is published after each batch; inspect the core for truth.
        let core = engine
            .inspect_section(&event_id, &s.spec.section_id)
            .await
            .context("inspecting a section")?;
        if let Err(e) = core.check_invariants() {
            tracing::error!(section = %s.spec.section_id, error = %e, "invariant violated");
            report.invariant_violations += 1;
        }
        let (capacity, available, held, sold) = core.counts();
        report.sold += sold;
        report.available += available;
        report.held += held;
        let issued = per_section.get(&s.spec.section_id).copied().unwrap_or(0);
        report.oversold += issued.saturating_sub(u64::from(capacity));
        if issued != u64::from(sold) {
            tracing::error!(section = %s.spec.section_id, issued, sold, "tickets and sold disagree");
        }
    }
    report.holds = tally.holds_ok.load(Ordering::Relaxed);
    report.confirms = tally.confirms_ok.load(Ordering::Relaxed);
    report.sold_out_answers = tally.sold_out.load(Ordering::Relaxed);
    report.stale_seat_map = tally.stale_seat_map.load(Ordering::Relaxed);
    report.walked_away = tally.walked_away.load(Ordering::Relaxed);
    report.shed = tally.shed.load(Ordering::Relaxed);
    report.errors = tally.errors.load(Ordering::Relaxed) + tally.user_limit.load(Ordering::Relaxed);
    if report.available == 0 && report.held == 0 {
        report.sold_out_after_seconds = last_sale
            .lock()
            .ok()
            .and_then(|l| *l)
            .map(|t| t.duration_since(started).as_secs_f64());
    }
    if let Ok(l) = lat.lock() {
        report.hold_us = percentiles(&l.hold);
        report.confirm_us = percentiles(&l.confirm);
    }
    report.reconciliation_findings = engine.reconcile().await.context("reconciling")?.len() as u64;
    engine.shutdown().await;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(fans: usize, seats: u32) -> FlashSaleArgs {
        FlashSaleArgs {
            fans,
            seats,
            arrival_seconds: 0.5,
            concurrency: 64,
            hold_ttl_ms: 300,
            pay_rate: 0.7,
            exact_rate: 0.3,
            per_user_limit: 4,
            data_dir: None,
            durability: "sync".into(),
            seed: 7,
            json: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_contended_sale_keeps_every_promise() {
        let report = run(small(2_000, 200)).await.unwrap();
        assert!(report.clean(), "{}", report.table());
        assert!(report.sold > 0 && report.sold <= 200);
        assert_eq!(report.tickets, u64::from(report.sold));
        assert!(
            report.sold_out_answers > 0,
            "10:1 oversubscribed: most fans are turned away"
        );
        assert!(report.walked_away > 0, "some holds were left to expire");
        assert_eq!(report.held, 0, "every walked-away hold expired");
        let json = report.json();
        assert!(
            json.contains("\"oversold\":0") && json.contains("\"clean\":true"),
            "{json}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_flags_are_refused() {
        assert!(run(small(0, 200)).await.is_err());
        let mut a = small(10, 200);
        a.pay_rate = 1.5;
        assert!(run(a).await.is_err());
    }

    #[test]
    fn the_sale_event_has_the_asked_number_of_seats() {
        for seats in [4, 10, 200, 10_000, 12_345] {
            let spec = sale_event(seats, 1_000, 4);
            spec.validate().unwrap();
            assert_eq!(
                spec.sections.iter().map(SectionSpec::capacity).sum::<u32>(),
                seats
            );
        }
    }
}
