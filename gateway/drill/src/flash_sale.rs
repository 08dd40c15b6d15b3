//! `boxoffice flash-sale`: the seeds' onsale, end to end over real gRPC, and its proof.
//!
//! With no flags it starts an embedded server (temporary data dir, durable log, gRPC on
//! loopback), creates an event of 10,000 seats (40% general admission, three reserved sections,
//! priced per section) and lets 100,000 fans at it through real tonic clients:
//! - 10% join the waiting room before the sale opens (they are shuffled at the opening), the rest
//!   arrive over `--arrival-seconds`; every fan polls `GetStatus` until admitted (admission runs
//!   at `--admit-rate`);
//! - admitted fans hold 1 to 4 places: some pick exact seats from the (as-of) seat map, some best
//!   available in a section, the rest anywhere;
//! - about `--pay-rate` pay (some with a card that is declined first, then another); the others
//!   walk away and their holds expire after `--hold-ttl-ms`;
//! - some fans turned away with SOLD_OUT join the waitlist and buy what it offers them.
//!
//! At the end every seat is checked (embedded server: the engine's own state, invariants and the
//! reconciliation; `--target`: the seat map against the tickets the fans hold). `--naive` runs the
//! seeds' uncoordinated baseline in-process instead (read the map, then book what looked free):
//! it oversells, which is the point of the contrast.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use boxoffice_engine::{Durability, EventSpec, Layout, RowSpec, SectionId, SectionSpec};
use boxoffice_proto::v1 as pb;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use boxoffice_client::Bearer;
use tonic::transport::Channel;

/// Fans compared for first-come-first-served order are this many arrivals apart.
const FCFS_STRIDE: usize = 1_000;

/// Flags of `boxoffice flash-sale`.
#[derive(clap::Args, Debug, Clone)]
pub struct FlashSaleArgs {
    /// Fans who try to buy.
    #[arg(long, default_value_t = 100_000)]
    pub fans: usize,
    /// Seats on sale: 40% general admission, the rest in three reserved sections of 50-seat rows.
    #[arg(long, default_value_t = 10_000)]
    pub seats: u32,
    /// Fans arrive evenly over this many seconds (after the pre-opening share).
    #[arg(long, default_value_t = 10.0)]
    pub arrival_seconds: f64,
    /// Share of fans who join the waiting room before the sale opens (shuffled at the opening).
    #[arg(long, default_value_t = 0.1)]
    pub preopen_share: f64,
    /// Waiting-room admissions per second.
    #[arg(long, default_value_t = 20_000)]
    pub admit_rate: u32,
    /// Fans in flight at once (concurrent client tasks).
    #[arg(long, default_value_t = 2_048)]
    pub concurrency: usize,
    /// Hold TTL in ms (rounded up to whole seconds): walked-away holds come back after this.
    #[arg(long, default_value_t = 2_000)]
    pub hold_ttl_ms: u64,
    /// Share of holders who pay.
    #[arg(long, default_value_t = 0.7)]
    pub pay_rate: f64,
    /// Share of payers whose first card is declined (they pay with another).
    #[arg(long, default_value_t = 0.1)]
    pub decline_rate: f64,
    /// Share of fans who pick exact seats from the seat map (the rest take best available).
    #[arg(long, default_value_t = 0.05)]
    pub exact_rate: f64,
    /// Share of fans turned away with SOLD_OUT who join the waitlist.
    #[arg(long, default_value_t = 0.02)]
    pub waitlist_rate: f64,
    /// Places one fan may hold or own.
    #[arg(long, default_value_t = 4)]
    pub per_user_limit: u32,
    /// The server the run plays against: embedded, or `--target`.
    #[command(flatten)]
    pub server: ServerChoice,
    /// Run the seeds' uncoordinated baseline in-process (read the map, book what looked free).
    #[arg(long)]
    pub naive: bool,
    /// Random seed for the fans' choices.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also draw seats left, admissions/s, holds/s and the latency percentiles to this SVG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// The sale's reserved sections: id, name, price in cents.
pub(crate) const RESERVED_SECTIONS: [(&str, &str, u64); 3] = [
    ("orch", "Orchestra", 12_000),
    ("mezz", "Mezzanine", 9_000),
    ("balc", "Balcony", 5_500),
];

/// The event the sale plays: 40% GA, the rest over three reserved sections of 50-seat rows.
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
    for (i, (id, name, price)) in RESERVED_SECTIONS.iter().enumerate() {
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
        event_id: None,
        name: "Flash sale".into(),
        sections,
        hold_ttl_ms: ttl_ms,
        per_user_limit,
        admit_rate_per_second: 0,
        admission_window_ms: 0,
        sale_opens_at_ms: 0,
    }
}

/// Where a run's load goes: an embedded server, or one already running (`--target`). Shared
/// by `flash-sale` and `sessions`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServerChoice {
    /// Data dir of the embedded server (default: a temporary dir, removed at the end).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// sync: fsync before every acknowledgement (group commit); buffered: for benchmarks only.
    #[arg(
        long,
        default_value_t = Durability::Sync,
        value_parser = PossibleValuesParser::new(Durability::NAMES).try_map(|s| s.parse::<Durability>())
    )]
    pub durability: Durability,
    /// Run against a server already running there (e.g. http://127.0.0.1:50051) instead of an
    /// embedded one; needs `--api-key`.
    #[arg(long)]
    pub target: Option<String>,
    /// An admin key of the `--target` server (the run creates its events with it).
    #[arg(long, env = "BOXOFFICE_ADMIN_KEY")]
    pub api_key: Option<String>,
}

/// The server of a run. The embedded one is on loopback with a temporary (or given) data dir, a
/// durable log, a generated admin key, no metrics port and no periodic reconciliation (the run
/// reconciles at its end).
pub(crate) struct Backend {
    /// The embedded server (`None` with `--target`).
    pub server: Option<boxoffice_gateway::server::Running>,
    /// The embedded server's temporary data dir, removed when dropped.
    _temp: Option<tempfile::TempDir>,
    /// `http://HOST:PORT`.
    pub target: String,
    pub admin_key: String,
}

impl ServerChoice {
    /// Connects the choice: starts the embedded server (admin key `embedded_key`, at most
    /// `queue_max` fans per waiting room), or checks that `--target` came with `--api-key`.
    pub(crate) async fn open(&self, embedded_key: &str, queue_max: u32) -> anyhow::Result<Backend> {
        match (&self.target, &self.api_key) {
            (Some(t), Some(k)) => {
                return Ok(Backend {
                    server: None,
                    _temp: None,
                    target: t.clone(),
                    admin_key: k.clone(),
                });
            }
            (Some(_), None) => bail!("--target needs --api-key (an admin key of that server)"),
            (None, _) => {}
        }
        let (temp, dir) = match &self.data_dir {
            Some(d) => (None, d.clone()),
            None => {
                let t = tempfile::tempdir().context("creating a temporary data dir")?;
                let dir = t.path().to_path_buf();
                (Some(t), dir)
            }
        };
        let mut secret = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut secret);
        let mut cfg =
            boxoffice_gateway::server::ServerConfig::new(embedded_key, "embedded-client", &secret);
        cfg.listen = "127.0.0.1:0".parse()?;
        cfg.metrics_listen = None;
        cfg.data_dir = dir;
        cfg.durability = self.durability;
        cfg.in_flight_max = 8_192;
        cfg.queue_max = queue_max;
        cfg.reconcile_every = None;
        let mut server = boxoffice_gateway::server::start(cfg)
            .await
            .context("starting the embedded server")?;
        server.wait_ready().await?;
        Ok(Backend {
            target: format!("http://{}", server.addr),
            server: Some(server),
            _temp: temp,
            admin_key: embedded_key.to_owned(),
        })
    }
}

/// The `CreateEvent` request of an engine event spec (`event_id` empty: the server picks one).
pub(crate) fn create_request(
    spec: &EventSpec,
    hold_ttl_seconds: u32,
    admit_rate_per_second: u32,
    admission_window_seconds: u32,
    sale_opens_at_unix_ms: i64,
) -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        event_id: spec
            .event_id
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        name: spec.name.clone(),
        sections: spec
            .sections
            .iter()
            .map(|s| pb::SectionSpec {
                section_id: s.section_id.to_string(),
                name: s.name.clone(),
                price_cents: s.price_cents,
                layout: Some(match &s.layout {
                    Layout::GeneralAdmission { capacity } => {
                        pb::section_spec::Layout::GeneralAdmissionCapacity(*capacity)
                    }
                    Layout::Reserved { rows } => {
                        pb::section_spec::Layout::Reserved(pb::ReservedLayout {
                            rows: rows
                                .iter()
                                .map(|r| pb::RowSpec {
                                    label: r.label.clone(),
                                    seat_count: r.seat_count,
                                })
                                .collect(),
                        })
                    }
                }),
            })
            .collect(),
        hold_ttl_seconds,
        per_user_limit: spec.per_user_limit,
        admit_rate_per_second,
        admission_window_seconds,
        sale_opens_at_unix_ms,
    }
}

#[derive(Default)]
struct Tally {
    calls: AtomicU64,
    admitted: AtomicU64,
    holds_ok: AtomicU64,
    sold_out: AtomicU64,
    stale_seat_map: AtomicU64,
    shed: AtomicU64,
    confirms_ok: AtomicU64,
    walked_away: AtomicU64,
    declined_then_paid: AtomicU64,
    waitlist_joined: AtomicU64,
    waitlist_bought: AtomicU64,
    /// Payers whose hold expired before they paid (`HOLD_EXPIRED` on `Confirm`).
    too_late: AtomicU64,
    /// Seen by the progress sampler: no place free and none held, so every place is sold and
    /// none can come back (orders are final).
    sold_out_for_good: std::sync::atomic::AtomicBool,
    /// Calls of fans checking their waitlist entry (polls, and the event's counts at the end).
    waitlist_checks: AtomicU64,
    /// Fans who have not finished their way through the line, hold and payment yet (those on
    /// the waitlist count as finished: they can only take places that come back).
    in_sale: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// (fan index, position in line) of fans who joined after the opening.
    positions: Mutex<Vec<(usize, u64)>>,
}

impl Tally {
    fn error(&self, what: &str, s: Option<&tonic::Status>) {
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

struct Latencies {
    join: Histogram<u64>,
    status: Histogram<u64>,
    hold: Histogram<u64>,
    confirm: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn record(
    lat: &Mutex<Latencies>,
    which: fn(&mut Latencies) -> &mut Histogram<u64>,
    started: Instant,
) {
    let us = u64::try_from(started.elapsed().as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    if let Ok(mut l) = lat.lock() {
        let _ = which(&mut l).record(us);
    }
}

/// A ticket a fan bought: its section, and its seat (empty in general admission).
type Ticket = (String, String);

fn reason(s: &tonic::Status) -> String {
    boxoffice_client::reason(s).unwrap_or_default()
}

/// The services a fan talks to.
type Fan = boxoffice_client::Clients;

/// Retries a call the gate shed (RESOURCE_EXHAUSTED / OVERLOADED) with a short back-off.
/// With a third argument, that counter of the tally counts every attempt too (a share of the
/// calls, such as the waitlist checks).
macro_rules! patient {
    ($tally:expr, $call:expr $(, $also:ident)?) => {{
        let mut tries = 0u32;
        loop {
            $tally.calls.fetch_add(1, Ordering::Relaxed);
            $($tally.$also.fetch_add(1, Ordering::Relaxed);)?
            match $call.await {
                Err(s) if reason(&s) == "OVERLOADED" && tries < 200 => {
                    tries += 1;
                    $tally.shed.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5 + u64::from(tries.min(20)) * 5))
                        .await;
                }
                other => break other,
            }
        }
    }};
}

struct Plan<'a> {
    args: &'a FlashSaleArgs,
    /// Fans with a lower index joined before the opening.
    preopen: usize,
    event_id: &'a str,
    reserved: &'a [String],
    all_sections: &'a [String],
}

/// One fan, from the waiting room to tickets (or not).
async fn fan(
    mut f: Fan,
    plan: &Plan<'_>,
    i: usize,
    tally: &Tally,
    lat: &Mutex<Latencies>,
) -> Outcome {
    let args = plan.args;
    let mut rng = StdRng::seed_from_u64(args.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let user = format!("fan-{i}");
    let join_started = Instant::now();
    let joined = patient!(
        tally,
        f.room.join(pb::JoinRequest {
            event_id: plan.event_id.into(),
            user_id: user.clone(),
            session_id: "web".into(),
        })
    );
    record(lat, |l| &mut l.join, join_started);
    let Ok(ticket) = joined.map(tonic::Response::into_inner) else {
        tally.error("join", None);
        return Outcome::default();
    };
    // Poll the line until admitted; the ETA paces the polls.
    let admission = loop {
        let poll_started = Instant::now();
        let st = patient!(
            tally,
            f.room.get_status(pb::GetStatusRequest {
                queue_token: ticket.queue_token.clone(),
            })
        );
        record(lat, |l| &mut l.status, poll_started);
        let Ok(st) = st.map(tonic::Response::into_inner) else {
            tally.error("status", None);
            return Outcome::default();
        };
        if st.state == pb::QueueState::Admitted as i32 {
            if i >= plan.preopen
                && st.position > 0
                && let Ok(mut p) = tally.positions.lock()
            {
                p.push((i, st.position));
            }
            break st.admission_token;
        }
        if st.state == pb::QueueState::Expired as i32 {
            return Outcome::default();
        }
        let wait = (u64::from(st.eta_seconds) * 300).clamp(50, 1_000);
        tokio::time::sleep(Duration::from_millis(wait + rng.random_range(0..50))).await;
    };
    tally.admitted.fetch_add(1, Ordering::Relaxed);
    let quantity = match rng.random_range(0..10) {
        0..=1 => 1,
        2..=5 => 2,
        6..=7 => 3,
        _ => 4,
    }
    .min(args.per_user_limit);
    let roll: f64 = rng.random();
    let mut selection = if roll < args.exact_rate && !plan.reserved.is_empty() {
        let section = &plan.reserved[rng.random_range(0..plan.reserved.len())];
        pick_from_map(&mut f, plan.event_id, section, quantity, &mut rng).await
    } else if roll < args.exact_rate + 0.5 {
        let s = &plan.all_sections[rng.random_range(0..plan.all_sections.len())];
        Some(pb::hold_request::Selection::BestAvailable(
            pb::BestAvailable {
                section_id: s.clone(),
                quantity,
            },
        ))
    } else {
        None
    };
    let anywhere = pb::hold_request::Selection::BestAvailable(pb::BestAvailable {
        section_id: String::new(),
        quantity,
    });
    let mut attempt = 0;
    let hold = loop {
        attempt += 1;
        let started = Instant::now();
        let r = patient!(
            tally,
            f.booking.hold(pb::HoldRequest {
                event_id: plan.event_id.into(),
                user_id: user.clone(),
                admission_token: admission.clone(),
                idempotency_key: format!("hold-{attempt}"),
                selection: Some(selection.clone().unwrap_or(anywhere.clone())),
            })
        );
        record(lat, |l| &mut l.hold, started);
        match r {
            Ok(h) => break h.into_inner(),
            Err(s) if reason(&s) == "SEAT_UNAVAILABLE" && attempt < 3 => {
                // The map was stale: someone was faster. Best available will do.
                tally.stale_seat_map.fetch_add(1, Ordering::Relaxed);
                selection = None;
            }
            Err(s) if reason(&s) == "SOLD_OUT" && attempt < 3 && selection.is_some() => {
                selection = None; // that section is gone; anywhere will do
            }
            Err(s) if matches!(reason(&s).as_str(), "SOLD_OUT" | "SEAT_UNAVAILABLE") => {
                tally.sold_out.fetch_add(1, Ordering::Relaxed);
                let wait = rng.random::<f64>() < args.waitlist_rate;
                return Outcome {
                    tickets: Vec::new(),
                    waitlist: wait.then(|| (user.clone(), quantity)),
                };
            }
            Err(s) => {
                tally.error("hold", Some(&s));
                return Outcome::default();
            }
        }
    };
    tally.holds_ok.fetch_add(1, Ordering::Relaxed);
    if rng.random::<f64>() >= args.pay_rate {
        tally.walked_away.fetch_add(1, Ordering::Relaxed);
        return Outcome::default();
    }
    let declined_first = rng.random::<f64>() < args.decline_rate;
    Outcome {
        tickets: pay(&mut f, &hold.hold_id, &user, i, declined_first, tally, lat).await,
        waitlist: None,
    }
}

/// What a fan got, and whether they go on to wait on the waitlist (outside their slot of
/// `--concurrency`, which waiting would hog).
#[derive(Default)]
struct Outcome {
    tickets: Vec<Ticket>,
    waitlist: Option<(String, u32)>,
}

async fn pay(
    f: &mut Fan,
    hold_id: &str,
    user: &str,
    i: usize,
    declined_first: bool,
    tally: &Tally,
    lat: &Mutex<Latencies>,
) -> Vec<Ticket> {
    let confirm = |token: String, key: &str| pb::ConfirmRequest {
        hold_id: hold_id.into(),
        user_id: user.into(),
        payment_token: token,
        idempotency_key: key.into(),
    };
    if declined_first {
        let r = patient!(
            tally,
            f.booking
                .confirm(confirm("tok_decline".into(), "pay-declined"))
        );
        match &r {
            Err(s) if reason(s) == "PAYMENT_DECLINED" => {}
            // Too slow to pay: the hold lapsed before the first card was even tried.
            Err(s) if reason(s) == "HOLD_EXPIRED" => {
                tally.too_late.fetch_add(1, Ordering::Relaxed);
                return Vec::new();
            }
            _ => {
                tally.error("the declined card was not declined", r.as_ref().err());
                return Vec::new();
            }
        }
    }
    let started = Instant::now();
    let r = patient!(
        tally,
        f.booking.confirm(confirm(format!("tok_fan_{i}"), "pay"))
    );
    record(lat, |l| &mut l.confirm, started);
    match r {
        Ok(order) => {
            tally.confirms_ok.fetch_add(1, Ordering::Relaxed);
            if declined_first {
                tally.declined_then_paid.fetch_add(1, Ordering::Relaxed);
            }
            order
                .into_inner()
                .tickets
                .into_iter()
                .map(|t| (t.section_id, t.seat_id))
                .collect()
        }
        // Too slow to pay: the hold lapsed (it happens; the places went back on sale).
        Err(s) if reason(&s) == "HOLD_EXPIRED" => {
            tally.too_late.fetch_add(1, Ordering::Relaxed);
            Vec::new()
        }
        Err(s) => {
            tally.error("confirm", Some(&s));
            Vec::new()
        }
    }
}

/// Joins the waitlist and buys the offer if one comes while the sale lasts.
async fn waitlist(
    f: &mut Fan,
    plan: &Plan<'_>,
    user: &str,
    quantity: u32,
    tally: &Tally,
    lat: &Mutex<Latencies>,
) -> Vec<Ticket> {
    let joined = patient!(
        tally,
        f.waitlist.join_waitlist(pb::JoinWaitlistRequest {
            event_id: plan.event_id.into(),
            user_id: user.into(),
            section_id: String::new(),
            quantity,
        })
    );
    let Ok(entry) = joined.map(tonic::Response::into_inner) else {
        tally.error("join_waitlist", None);
        return Vec::new();
    };
    tally.waitlist_joined.fetch_add(1, Ordering::Relaxed);
    // Wait while places may still come back, or until an offer comes. Nothing can come back
    // once every place is sold (no place free or held: orders are final), or once no fan is left
    // in the line-hold-pay flow and nothing is held. A fan who left earlier would keep receiving
    // offers that lapse, one TTL each (the contract has no way to leave the waitlist).
    let give_up = Instant::now() + Duration::from_millis(plan.args.hold_ttl_ms * 20 + 60_000);
    // A quarter of the hold TTL, at most once a second: an offer is seen with most of its TTL
    // left to pay in.
    let every = Duration::from_millis((plan.args.hold_ttl_ms / 4).clamp(50, 1_000));
    while Instant::now() < give_up {
        tokio::time::sleep(every).await;
        if tally.sold_out_for_good.load(Ordering::Acquire) {
            break;
        }
        let Ok(e) = patient!(
            tally,
            f.waitlist.get_waitlist_entry(pb::GetWaitlistEntryRequest {
                entry_id: entry.entry_id.clone(),
            }),
            waitlist_checks
        )
        .map(tonic::Response::into_inner) else {
            continue;
        };
        if e.state == pb::WaitlistState::Offered as i32 {
            let got = pay(f, &e.offered_hold_id, user, usize::MAX, false, tally, lat).await;
            if !got.is_empty() {
                tally.waitlist_bought.fetch_add(1, Ordering::Relaxed);
            }
            return got;
        }
        if e.state != pb::WaitlistState::Waiting as i32 {
            break;
        }
        if tally.in_sale.load(Ordering::Acquire) == 0 {
            tally.calls.fetch_add(1, Ordering::Relaxed);
            tally.waitlist_checks.fetch_add(1, Ordering::Relaxed);
            if nothing_held(f, plan.event_id).await {
                break;
            }
        }
    }
    Vec::new()
}

/// Whether the event holds no places right now (read fresh from the server).
async fn nothing_held(f: &mut Fan, event_id: &str) -> bool {
    match f
        .events
        .get_event(pb::GetEventRequest {
            event_id: event_id.into(),
        })
        .await
    {
        Ok(e) => e.into_inner().sections.iter().all(|s| s.held == 0),
        Err(_) => false,
    }
}

/// A fan in the line-hold-pay flow: counted in `Tally::in_sale` until dropped (also when its
/// task ends early or panics, so waitlisters never wait for a fan who is gone).
struct InSale(Arc<Tally>);

impl Drop for InSale {
    fn drop(&mut self) {
        self.0.in_sale.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What every fan task shares.
struct FanShared {
    args: Arc<FlashSaleArgs>,
    /// (event id, reserved sections, all sections).
    parts: Arc<(String, Vec<String>, Vec<String>)>,
    preopen: usize,
    slots: tokio::sync::Semaphore,
    channels: Vec<Channel>,
    bearer: Bearer,
    tally: Arc<Tally>,
    lat: Arc<Mutex<Latencies>>,
    tickets: Arc<Mutex<Vec<Ticket>>>,
    last_sale: Arc<Mutex<Option<Instant>>>,
}

/// Fan `i` once it has a slot: the waiting room, a hold, payment, maybe the waitlist.
async fn one_fan(s: &FanShared, i: usize, slot: tokio::sync::SemaphorePermit<'_>, in_sale: InSale) {
    let plan = Plan {
        args: &s.args,
        preopen: s.preopen,
        event_id: &s.parts.0,
        reserved: &s.parts.1,
        all_sections: &s.parts.2,
    };
    let mut f = Fan::new(&s.channels[i % s.channels.len()], &s.bearer);
    let mut outcome = fan(f.clone(), &plan, i, &s.tally, &s.lat).await;
    drop(in_sale);
    drop(slot);
    if let Some((user, quantity)) = outcome.waitlist.take() {
        outcome.tickets = waitlist(&mut f, &plan, &user, quantity, &s.tally, &s.lat).await;
    }
    if !outcome.tickets.is_empty() {
        if let Ok(mut t) = s.tickets.lock() {
            t.extend(outcome.tickets);
        }
        if let Ok(mut l) = s.last_sale.lock() {
            *l = Some(Instant::now());
        }
    }
}

/// Picks `q` adjacent seats that look free in the seat map of `section`, from a random row.
async fn pick_from_map(
    f: &mut Fan,
    event: &str,
    section: &str,
    q: u32,
    rng: &mut StdRng,
) -> Option<pb::hold_request::Selection> {
    let map = f
        .events
        .get_seat_map(pb::GetSeatMapRequest {
            event_id: event.into(),
            section_id: section.into(),
        })
        .await
        .ok()?
        .into_inner();
    let seats = &map.sections.first()?.seats;
    let mut rows: Vec<&str> = seats.iter().map(|s| s.row.as_str()).collect();
    rows.dedup();
    let start = rng.random_range(0..rows.len().max(1));
    for k in 0..rows.len() {
        let row = rows[(start + k) % rows.len()];
        let free: Vec<&pb::Seat> = seats
            .iter()
            .filter(|s| s.row == row && s.status == pb::SeatStatus::Available as i32)
            .collect();
        for w in free.windows(q as usize) {
            if w.last()?.number - w[0].number == q - 1 {
                return Some(pb::hold_request::Selection::Seats(pb::SeatSelection {
                    seat_ids: w.iter().map(|s| s.seat_id.clone()).collect(),
                }));
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
    /// Whether the two above were checked (only with the embedded server: `--target` runs see
    /// the server from outside).
    pub engine_checked: bool,
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
    /// Fans admitted by the waiting room.
    pub admitted: u64,
    /// gRPC calls the fans made (all kinds; the gate's load).
    pub calls: u64,
    /// The gate's busiest second: the most calls the fans made in any one-second window of the
    /// progress samples (taken every 250 ms).
    pub peak_calls_per_second: u64,
    /// Payers whose hold had expired when they paid (`HOLD_EXPIRED`).
    pub paid_too_late: u64,
    /// Of `calls`, those of fans checking their waitlist entry (once a second while waiting).
    pub waitlist_checks: u64,
    /// The busiest second without the waitlist checks.
    pub peak_calls_per_second_without_waitlist: u64,
    /// Fans who joined the waitlist after a SOLD_OUT.
    pub waitlist_joined: u64,
    /// Waitlist offers confirmed.
    pub waitlist_bought: u64,
    /// Payments declined once and paid with another card.
    pub declined_then_paid: u64,
    /// Requests the gate shed and the fans retried.
    pub retried_after_shed: u64,
    /// Holds walked away from (expired later).
    pub walked_away: u64,
    /// Requests shed by overload.
    pub shed: u64,
    /// Unexpected errors.
    pub errors: u64,
    /// The first unexpected error, if any.
    pub first_error: Option<String>,
    /// Holds the sweeper expired (embedded server).
    pub expired: u64,
    /// Share of post-opening fans 1,000 arrivals apart who stand in line in arrival order (1.0:
    /// first come, first served).
    pub fcfs_after_opening: Option<f64>,
    /// The largest delay between a hold's deadline and its expiry, ms (embedded server).
    pub expiry_lag_max_ms: Option<u64>,
    /// Hold latency percentiles (p50, p95, p99, max) in µs.
    pub hold_us: [u64; 4],
    /// Confirm latency percentiles (p50, p95, p99, max) in µs.
    pub confirm_us: [u64; 4],
    /// Join latency percentiles (p50, p95, p99, max) in µs.
    pub join_us: [u64; 4],
    /// GetStatus latency percentiles (p50, p95, p99, max) in µs.
    pub status_us: [u64; 4],
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
    /// A count the embedded server checked, or "n/a" when it was not checked.
    fn checked(&self, n: u64) -> String {
        if self.engine_checked {
            n.to_string()
        } else {
            "n/a (checked only with the embedded server)".into()
        }
    }

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
                self.checked(self.invariant_violations),
            ),
            (
                "reconciliation findings (must be 0)",
                self.checked(self.reconciliation_findings),
            ),
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
                "waitlist: joined / bought",
                format!("{} / {}", self.waitlist_joined, self.waitlist_bought),
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
            ("shed (OVERLOADED)", self.shed.to_string()),
            (
                "unexpected errors",
                match &self.first_error {
                    Some(e) => format!("{} (first: {e})", self.errors),
                    None => self.errors.to_string(),
                },
            ),
            ("hold ms p50/p95/p99/max", pct(self.hold_us)),
            ("confirm ms p50/p95/p99/max", pct(self.confirm_us)),
            ("join ms p50/p95/p99/max", pct(self.join_us)),
            ("status poll ms p50/p95/p99/max", pct(self.status_us)),
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
            "{{\"fans\":{},\"seats\":{},\"sold\":{},\"available\":{},\"held\":{},\"tickets\":{},\"oversold\":{},\"double_booked\":{},\"invariant_violations\":{},\"reconciliation_findings\":{},\"sale_seconds\":{:.3},\"sold_out_after_seconds\":{},\"holds\":{},\"confirms\":{},\"calls\":{},\"peak_calls_per_second\":{},\"waitlist_checks\":{},\"paid_too_late\":{},\"peak_calls_per_second_without_waitlist\":{},\"admitted\":{},\"fcfs_after_opening\":{},\"sold_out_answers\":{},\"waitlist_joined\":{},\"waitlist_bought\":{},\"declined_then_paid\":{},\"retried_after_shed\":{},\"stale_seat_map\":{},\"walked_away\":{},\"shed\":{},\"errors\":{},\"hold_latency_us\":{},\"confirm_latency_us\":{},\"join_latency_us\":{},\"status_latency_us\":{},\"clean\":{}}}\n",
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
            self.calls,
            self.peak_calls_per_second,
            self.waitlist_checks,
            self.paid_too_late,
            self.peak_calls_per_second_without_waitlist,
            self.admitted,
            self.fcfs_after_opening
                .map_or("null".into(), |f| format!("{f:.4}")),
            self.sold_out_answers,
            self.waitlist_joined,
            self.waitlist_bought,
            self.declined_then_paid,
            self.retried_after_shed,
            self.stale_seat_map,
            self.walked_away,
            self.shed,
            self.errors,
            arr(self.hold_us),
            arr(self.confirm_us),
            arr(self.join_us),
            arr(self.status_us),
            self.clean()
        )
    }
}

/// Runs the sale (or the naive baseline) and returns its report; see [`Report::clean`].
pub async fn run(args: FlashSaleArgs) -> anyhow::Result<Report> {
    if args.fans == 0 || args.seats < 4 || args.concurrency == 0 {
        bail!("--fans and --concurrency must be at least 1, --seats at least 4");
    }
    for (name, v) in [
        ("--pay-rate", args.pay_rate),
        ("--exact-rate", args.exact_rate),
        ("--decline-rate", args.decline_rate),
        ("--waitlist-rate", args.waitlist_rate),
        ("--preopen-share", args.preopen_share),
    ] {
        if !(0.0..=1.0).contains(&v) {
            bail!("{name} is a share between 0 and 1");
        }
    }
    if args.naive {
        return Ok(run_naive(&args).await);
    }
    let queue_max = u32::try_from(args.fans)
        .unwrap_or(u32::MAX)
        .saturating_add(1_000);
    let mut backend = args
        .server
        .open(&format!("flash-sale-{}", args.seed), queue_max)
        .await?;
    let (server, target, key) = (
        backend.server.take(),
        backend.target.clone(),
        backend.admin_key.clone(),
    );
    let bearer = Bearer::new(&key)?;
    let mut channels = Vec::new();
    for _ in 0..8 {
        channels.push(boxoffice_client::connect(&target).await?);
    }
    // The event: sections as `sale_event`, admission at --admit-rate, opening after the
    // pre-opening fans joined.
    let spec = sale_event(args.seats, args.hold_ttl_ms, args.per_user_limit);
    let preopen = ((args.fans as f64) * args.preopen_share) as usize;
    let opens_in = if preopen > 0 {
        Duration::from_millis(1_500)
    } else {
        Duration::ZERO
    };
    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    let mut admin = pb::event_service_client::EventServiceClient::with_interceptor(
        channels[0].clone(),
        bearer.clone(),
    );
    let event = admin
        .create_event(create_request(
            &spec,
            u32::try_from(args.hold_ttl_ms.div_ceil(1000).max(1)).unwrap_or(600),
            args.admit_rate,
            120,
            i64::try_from(now_ms + u64::try_from(opens_in.as_millis())?)?,
        ))
        .await
        .context("creating the sale's event (is --api-key an admin key?)")?
        .into_inner();
    let event_id = event.event_id.clone();
    let reserved: Vec<String> = event
        .sections
        .iter()
        .filter(|s| s.kind == pb::SectionKind::Reserved as i32)
        .map(|s| s.section_id.clone())
        .collect();
    let all_sections: Vec<String> = event
        .sections
        .iter()
        .map(|s| s.section_id.clone())
        .collect();

    let tally = Arc::new(Tally::default());
    tally.in_sale.store(args.fans as u64, Ordering::Release);
    let lat = Arc::new(Mutex::new(Latencies {
        join: histogram(),
        status: histogram(),
        hold: histogram(),
        confirm: histogram(),
    }));
    let tickets: Arc<Mutex<Vec<Ticket>>> = Arc::default();
    let last_sale = Arc::new(Mutex::new(None::<Instant>));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let opening = started + opens_in;
    let rest = args.fans - preopen;
    let per_fan = Duration::from_secs_f64(args.arrival_seconds.max(0.0) / rest.max(1) as f64);
    let arrival = move |i: usize| -> Instant {
        if i < preopen {
            started + opens_in.mul_f64(i as f64 / preopen.max(1) as f64 * 0.8)
        } else {
            opening + per_fan * u32::try_from(i - preopen).unwrap_or(u32::MAX)
        }
    };
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let progress = {
        let (mut events, next, event_id) = (admin.clone(), next.clone(), event_id.clone());
        let (fans, seats, tally, samples) = (args.fans, args.seats, tally.clone(), samples.clone());
        // Bars on a terminal; a plain line a second otherwise (logs, CI).
        let bars =
            std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| Bars::new(fans, seats));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            let mut last_line = Instant::now();
            loop {
                tick.tick().await;
                let Ok(e) = events
                    .get_event(pb::GetEventRequest {
                        event_id: event_id.clone(),
                    })
                    .await
                else {
                    continue;
                };
                let (a, h, s) = e.get_ref().sections.iter().fold((0, 0, 0), |t, s| {
                    (t.0 + s.available, t.1 + s.held, t.2 + s.sold)
                });
                if a == 0 && h == 0 {
                    tally.sold_out_for_good.store(true, Ordering::Release);
                }
                let sample = Sample {
                    t: started.elapsed().as_secs_f64(),
                    calls: tally.calls.load(Ordering::Relaxed),
                    waitlist_checks: tally.waitlist_checks.load(Ordering::Relaxed),
                    arrived: next.load(Ordering::Relaxed).min(fans) as u64,
                    admitted: tally.admitted.load(Ordering::Relaxed),
                    holds: tally.holds_ok.load(Ordering::Relaxed),
                    available: a,
                    held: h,
                    sold: s,
                };
                match &bars {
                    Some(b) => b.show(&sample),
                    None if last_line.elapsed() >= Duration::from_secs(1) => {
                        last_line = Instant::now();
                        eprintln!(
                            "[{:>5.1}s] fans arrived {:>8}/{fans}  admitted {:>8}  available {a:>6}  held {h:>6}  sold {s:>6}",
                            sample.t, sample.arrived, sample.admitted,
                        );
                    }
                    None => {}
                }
                if let Ok(mut v) = samples.lock() {
                    v.push(sample);
                }
            }
        })
    };
    let args = Arc::new(args);
    let plan_parts = Arc::new((event_id.clone(), reserved, all_sections));
    // One task per fan, started at its arrival; at most --concurrency fans between joining and
    // paying at once (waiting on the waitlist does not count). A fan waiting for a slot is a
    // small task (an `Arc` and a semaphore wait); its clients and its call futures (about 6 KB)
    // are made and boxed only once it has a slot, so a million arrived fans stay cheap.
    let shared = Arc::new(FanShared {
        args: args.clone(),
        parts: plan_parts,
        preopen,
        slots: tokio::sync::Semaphore::new(args.concurrency),
        channels: channels.clone(),
        bearer: bearer.clone(),
        tally: tally.clone(),
        lat: lat.clone(),
        tickets: tickets.clone(),
        last_sale: last_sale.clone(),
    });
    let mut fans = tokio::task::JoinSet::new();
    for i in 0..args.fans {
        tokio::time::sleep_until(arrival(i).into()).await;
        next.store(i + 1, Ordering::Relaxed);
        let shared = shared.clone();
        fans.spawn(async move {
            let in_sale = InSale(shared.tally.clone());
            let Ok(slot) = shared.slots.acquire().await else {
                return;
            };
            Box::pin(one_fan(&shared, i, slot, in_sale)).await;
        });
        // Reap finished fans as we go, so the set stays small.
        while fans.try_join_next().is_some() {}
    }
    while let Some(r) = fans.join_next().await {
        r.context("a fan task panicked")?;
    }
    let sale_seconds = started.elapsed().as_secs_f64();
    // Walked-away holds expire after their TTL; wait for the sweeper to bring them back.
    let deadline =
        Instant::now() + Duration::from_millis(args.hold_ttl_ms) + Duration::from_secs(30);
    let view = loop {
        let e = admin
            .get_event(pb::GetEventRequest {
                event_id: event_id.clone(),
            })
            .await?
            .into_inner();
        let held: u32 = e.sections.iter().map(|s| s.held).sum();
        if held == 0 || Instant::now() > deadline {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    progress.abort();
    let samples = samples.lock().map(|v| v.clone()).unwrap_or_default();

    let mut report = Report {
        fans: args.fans,
        seats: args.seats,
        sale_seconds,
        ..Report::default()
    };
    let tickets = std::mem::take(&mut *tickets.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    report.tickets = tickets.len() as u64;
    let mut seen = HashSet::new();
    let mut per_section: HashMap<String, u64> = HashMap::new();
    for (section, seat) in &tickets {
        *per_section.entry(section.clone()).or_default() += 1;
        if !seat.is_empty() && !seen.insert(seat.clone()) {
            report.double_booked += 1;
        }
    }
    for s in &view.sections {
        report.sold += s.sold;
        report.available += s.available;
        report.held += s.held;
        let issued = per_section.get(&s.section_id).copied().unwrap_or(0);
        report.oversold += issued.saturating_sub(u64::from(s.capacity));
        if issued != u64::from(s.sold) {
            tracing::error!(section = %s.section_id, issued, sold = s.sold, "tickets and sold disagree");
        }
    }
    report.engine_checked = server.is_some();
    if let Some(server) = server {
        // Embedded: also the engine's own truth: invariants and the reconciliation.
        if let Some(engine) = server.engine() {
            for v in engine.invariant_violations().await? {
                tracing::error!(violation = %v, "invariant violated");
                report.invariant_violations += 1;
            }
            report.reconciliation_findings = engine.reconcile().await?.len() as u64;
        }
        if let Some(stats) = server.sweeper_stats().await {
            report.expiry_lag_max_ms = Some(stats.lag_max_ms);
            report.expired = stats.expired;
        }
        server.shutdown().await?;
    }
    report.admitted = tally.admitted.load(Ordering::Relaxed);
    report.calls = tally.calls.load(Ordering::Relaxed);
    report.peak_calls_per_second = peak_rate(&samples, |s| s.calls);
    report.waitlist_checks = tally.waitlist_checks.load(Ordering::Relaxed);
    report.paid_too_late = tally.too_late.load(Ordering::Relaxed);
    report.peak_calls_per_second_without_waitlist =
        peak_rate(&samples, |s| s.calls.saturating_sub(s.waitlist_checks));
    report.holds = tally.holds_ok.load(Ordering::Relaxed);
    report.confirms = tally.confirms_ok.load(Ordering::Relaxed);
    report.sold_out_answers = tally.sold_out.load(Ordering::Relaxed);
    report.stale_seat_map = tally.stale_seat_map.load(Ordering::Relaxed);
    report.walked_away = tally.walked_away.load(Ordering::Relaxed);
    report.retried_after_shed = tally.shed.load(Ordering::Relaxed);
    report.declined_then_paid = tally.declined_then_paid.load(Ordering::Relaxed);
    report.waitlist_joined = tally.waitlist_joined.load(Ordering::Relaxed);
    report.waitlist_bought = tally.waitlist_bought.load(Ordering::Relaxed);
    report.errors = tally.errors.load(Ordering::Relaxed);
    // First come, first served after the opening: fans who arrived FCFS_STRIDE arrivals
    // apart (0.1 s at the default rate; closer ones race each other to the server) should
    // stand in line in that order.
    if let Ok(mut p) = tally.positions.lock() {
        p.sort_unstable();
        let pairs: Vec<_> = p.iter().zip(p.iter().skip(FCFS_STRIDE)).collect();
        let ordered = pairs.iter().filter(|(a, b)| a.1 < b.1).count();
        if !pairs.is_empty() {
            report.fcfs_after_opening = Some(ordered as f64 / pairs.len() as f64);
        }
    }
    report.first_error = tally.first_error.lock().ok().and_then(|f| f.clone());
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
        report.join_us = percentiles(&l.join);
        report.status_us = percentiles(&l.status);
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot_svg(&samples, &report))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

/// One progress sample (every 250 ms).
#[derive(Clone, Copy, Debug)]
struct Sample {
    t: f64,
    /// Calls the fans made so far.
    calls: u64,
    /// Of those, waitlist checks.
    waitlist_checks: u64,
    arrived: u64,
    admitted: u64,
    holds: u64,
    available: u32,
    held: u32,
    sold: u32,
}

/// Progress bars on a terminal.
struct Bars {
    _multi: indicatif::MultiProgress,
    arrived: indicatif::ProgressBar,
    admitted: indicatif::ProgressBar,
    holding: indicatif::ProgressBar,
    sold: indicatif::ProgressBar,
    left: indicatif::ProgressBar,
}

impl Bars {
    fn new(fans: usize, seats: u32) -> Bars {
        let multi = indicatif::MultiProgress::new();
        let style =
            indicatif::ProgressStyle::with_template("{prefix:>14} [{bar:40}] {pos:>7}/{len}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        let bar = |name: &'static str, len: u64| {
            let b = multi.add(indicatif::ProgressBar::new(len));
            b.set_style(style.clone());
            b.set_prefix(name);
            b
        };
        Bars {
            arrived: bar("fans queued", fans as u64),
            admitted: bar("admitted", fans as u64),
            holding: bar("holding", u64::from(seats)),
            sold: bar("paid (sold)", u64::from(seats)),
            left: bar("seats left", u64::from(seats)),
            _multi: multi,
        }
    }

    fn show(&self, s: &Sample) {
        self.arrived.set_position(s.arrived);
        self.admitted.set_position(s.admitted);
        self.holding.set_position(u64::from(s.held));
        self.sold.set_position(u64::from(s.sold));
        self.left.set_position(u64::from(s.available));
    }
}

/// A named line of (seconds, value) points with its colour.
type Series = (&'static str, Vec<(f64, f64)>, &'static str);

/// The most calls made in any window of at least one second between two samples, per second.
fn peak_rate(samples: &[Sample], count: impl Fn(&Sample) -> u64) -> u64 {
    let mut best = 0.0f64;
    let mut j = 0;
    for (i, a) in samples.iter().enumerate() {
        j = j.max(i);
        while j < samples.len() && samples[j].t - a.t < 1.0 {
            j += 1;
        }
        let Some(b) = samples.get(j) else {
            break;
        };
        best = best.max(count(b).saturating_sub(count(a)) as f64 / (b.t - a.t));
    }
    best.round() as u64
}

/// An SVG picture of the sale: seats left, admissions/s and holds/s over time, and the latency
/// percentiles.
fn plot_svg(samples: &[Sample], r: &Report) -> String {
    const W: f64 = 900.0;
    const PANEL: f64 = 160.0;
    let t_max = samples.last().map_or(1.0, |s| s.t).max(1.0);
    let rates = |f: fn(&Sample) -> u64| -> Vec<(f64, f64)> {
        samples
            .windows(2)
            .map(|w| {
                let dt = (w[1].t - w[0].t).max(1e-3);
                (w[1].t, f(&w[1]).saturating_sub(f(&w[0])) as f64 / dt)
            })
            .collect()
    };
    let series: [Series; 3] = [
        (
            "seats left",
            samples
                .iter()
                .map(|s| (s.t, f64::from(s.available)))
                .collect(),
            "#1f77b4",
        ),
        ("admissions per second", rates(|s| s.admitted), "#2ca02c"),
        ("holds per second", rates(|s| s.holds), "#d62728"),
    ];
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        PANEL * 3.0 + 140.0
    );
    for (k, (name, pts, color)) in series.iter().enumerate() {
        let top = 20.0 + k as f64 * PANEL;
        let y_max = pts.iter().map(|p| p.1).fold(1.0, f64::max);
        out.push_str(&format!(
            "<text x=\"60\" y=\"{}\">{name} (max {:.0})</text>\n<line x1=\"60\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#999\"/>\n",
            top + 12.0,
            y_max,
            top + PANEL - 10.0,
            W - 20.0,
            top + PANEL - 10.0
        ));
        let path: Vec<String> = pts
            .iter()
            .map(|(t, y)| {
                let x = 60.0 + (W - 80.0) * t / t_max;
                let yy = top + PANEL - 10.0 - (PANEL - 40.0) * y / y_max;
                format!("{x:.1},{yy:.1}")
            })
            .collect();
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
            path.join(" ")
        ));
    }
    let base = 20.0 + 3.0 * PANEL;
    out.push_str(&format!(
        "<text x=\"60\" y=\"{}\">time: 0 to {t_max:.1} s</text>\n",
        base
    ));
    let ms = |us: u64| us as f64 / 1000.0;
    for (k, (name, p)) in [("Hold", r.hold_us), ("Confirm", r.confirm_us)]
        .iter()
        .enumerate()
    {
        out.push_str(&format!(
            "<text x=\"60\" y=\"{}\">{name} latency ms: p50 {:.2}  p95 {:.2}  p99 {:.2}  max {:.2}</text>\n",
            base + 24.0 + 18.0 * k as f64,
            ms(p[0]),
            ms(p[1]),
            ms(p[2]),
            ms(p[3])
        ));
    }
    out.push_str(&format!(
        "<text x=\"60\" y=\"{}\">{} fans, {} seats, sold {}, oversold {}, double-booked {}</text>\n</svg>\n",
        base + 66.0,
        r.fans,
        r.seats,
        r.sold,
        r.oversold,
        r.double_booked
    ));
    out
}

/// The seeds' uncoordinated baseline: every fan reads a seat map that is up to 100 ms old, then
/// books what looked free with no atomic check (`if seat.free { seat.book() }` against a stale
/// read). Nothing stops two fans from booking one seat.
async fn run_naive(args: &FlashSaleArgs) -> Report {
    let seats = args.seats as usize;
    let owners: Arc<Vec<AtomicU64>> = Arc::new((0..seats).map(|_| AtomicU64::new(0)).collect());
    let map: Arc<Mutex<Arc<Vec<bool>>>> = Arc::new(Mutex::new(Arc::new(vec![true; seats])));
    let started = Instant::now();
    let refresher = {
        let (owners, map) = (owners.clone(), map.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let fresh: Vec<bool> = owners
                    .iter()
                    .map(|o| o.load(Ordering::Relaxed) == 0)
                    .collect();
                if let Ok(mut m) = map.lock() {
                    *m = Arc::new(fresh);
                }
            }
        })
    };
    let next = Arc::new(AtomicUsize::new(0));
    let per_fan = Duration::from_secs_f64(args.arrival_seconds.max(0.0) / args.fans as f64);
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.min(1_024) {
        let (owners, map, next) = (owners.clone(), map.clone(), next.clone());
        let (fans, seed, limit) = (args.fans, args.seed, args.per_user_limit);
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= fans {
                    break;
                }
                tokio::time::sleep_until(
                    (started + per_fan * u32::try_from(i).unwrap_or(u32::MAX)).into(),
                )
                .await;
                let mut rng = StdRng::seed_from_u64(seed ^ i as u64);
                let q = rng.random_range(1..=limit.clamp(1, 4)) as usize;
                let snapshot = map.lock().map(|m| m.clone()).unwrap_or_default();
                // "10 seats left" is what the page said: book the first free-looking ones from
                // a random place.
                let start = rng.random_range(0..seats);
                let picks: Vec<usize> = (0..seats)
                    .map(|k| (start + k) % seats)
                    .filter(|&s| snapshot[s])
                    .take(q)
                    .collect();
                tokio::task::yield_now().await; // the network between the read and the write
                for s in picks {
                    owners[s].fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for w in workers {
        let _ = w.await;
    }
    refresher.abort();
    let mut report = Report {
        fans: args.fans,
        seats: args.seats,
        sale_seconds: started.elapsed().as_secs_f64(),
        ..Report::default()
    };
    for o in owners.iter() {
        let n = o.load(Ordering::Relaxed);
        report.tickets += n;
        if n > 0 {
            report.sold += 1;
        }
        if n > 1 {
            report.double_booked += 1;
        }
    }
    report.available = args.seats - report.sold;
    report.oversold = report.tickets - u64::from(report.sold);
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(fans: usize, seats: u32) -> FlashSaleArgs {
        FlashSaleArgs {
            fans,
            seats,
            arrival_seconds: 0.5,
            preopen_share: 0.2,
            admit_rate: 5_000,
            concurrency: 128,
            hold_ttl_ms: 1_000,
            pay_rate: 0.7,
            decline_rate: 0.2,
            exact_rate: 0.3,
            waitlist_rate: 0.3,
            per_user_limit: 4,
            server: ServerChoice {
                durability: Durability::Sync,
                ..ServerChoice::default()
            },
            naive: false,
            seed: 7,
            json: None,
            plot: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_contended_sale_over_grpc_keeps_every_promise() {
        let dir = tempfile::tempdir().unwrap();
        let plot = dir.path().join("sale.svg");
        let mut args = small(2_000, 200);
        args.plot = Some(plot.clone());
        let report = run(args).await.unwrap();
        let svg = std::fs::read_to_string(&plot).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("polyline") && svg.contains("seats left"));
        assert!(report.clean(), "{}", report.table());
        assert!(
            report.engine_checked,
            "the embedded server's invariants and reconciliation ran"
        );
        assert!(report.sold > 0 && report.sold <= 200);
        assert_eq!(report.tickets, u64::from(report.sold));
        assert_eq!(
            report.admitted, 2_000,
            "everyone got through the waiting room"
        );
        assert!(
            report.sold_out_answers > 0,
            "10:1 oversubscribed: most fans are turned away"
        );
        assert!(report.walked_away > 0, "some holds were left to expire");
        assert!(
            report.declined_then_paid > 0,
            "some paid with a second card"
        );
        assert_eq!(report.held, 0, "every walked-away hold expired");
        assert!(
            report.waitlist_joined > 0,
            "turned-away fans joined the waitlist"
        );
        assert!(
            report.waitlist_bought > 0,
            "walked-away places went to the waitlist first: {}",
            report.table()
        );
        let json = report.json();
        assert!(
            json.contains("\"oversold\":0") && json.contains("\"clean\":true"),
            "{json}"
        );
    }

    #[test]
    fn the_busiest_second_is_found_between_samples() {
        let at = |t: f64, calls: u64| Sample {
            t,
            calls,
            waitlist_checks: calls / 10,
            arrived: 0,
            admitted: 0,
            holds: 0,
            available: 0,
            held: 0,
            sold: 0,
        };
        let all = |s: &Sample| s.calls;
        assert_eq!(peak_rate(&[], all), 0);
        assert_eq!(
            peak_rate(&[at(0.0, 5)], all),
            0,
            "one sample spans no second"
        );
        // 100/s, then 1,000 calls in the second from 1.0 s to 2.0 s, then quiet.
        let s = [
            at(0.0, 0),
            at(0.5, 50),
            at(1.0, 100),
            at(1.5, 600),
            at(2.0, 1_100),
            at(2.5, 1_100),
            at(3.0, 1_100),
        ];
        assert_eq!(peak_rate(&s, all), 1_000);
        assert_eq!(peak_rate(&s, |s| s.calls - s.waitlist_checks), 900);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_naive_baseline_oversells() {
        let mut a = small(2_000, 200);
        a.naive = true;
        let report = run(a).await.unwrap();
        assert!(report.oversold > 0, "{}", report.table());
        assert!(report.double_booked > 0);
        assert!(!report.clean());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_flags_are_refused() {
        assert!(run(small(0, 200)).await.is_err());
        let mut a = small(10, 200);
        a.pay_rate = 1.5;
        assert!(run(a).await.is_err());
        let mut a = small(10, 200);
        a.server.target = Some("http://127.0.0.1:1".into());
        assert!(run(a).await.is_err(), "--target without --api-key");
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
