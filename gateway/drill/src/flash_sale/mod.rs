//! `boxoffice flash-sale`: the seeds' onsale, end to end over real gRPC, and its proof.
//!
//! With no flags it starts an embedded server (temporary data dir, durable log, gRPC on
//! loopback), creates an event of 10,000 seats (40% general admission, three reserved sections,
//! priced per section) and lets 100,000 fans at it through real tonic clients:
//! - 10% join the waiting room before the sale opens (they are shuffled at the opening), the rest
//!   arrive over `--arrival-seconds`; every fan polls `GetStatus` until admitted (admission runs
//!   at `--admit-rate-per-second`);
//! - admitted fans hold 1 to 4 places: some pick exact seats from the (as-of) seat map, some best
//!   available in a section, the rest anywhere;
//! - about `--pay-share` pay (some with a card that is declined first, then another); the others
//!   walk away and their holds expire after `--hold-ttl-seconds`;
//! - some fans turned away with SOLD_OUT join the waitlist and buy what it offers them;
//! - with `--join-pow-bits N` the event asks for a proof of work before `Join`: every fan fetches
//!   a challenge and solves it first (on as many threads as the machine has cores), and the
//!   report shows the time spent solving.
//!
//! At the end every seat is checked (embedded server: the engine's own state, invariants and the
//! reconciliation; `--target`: the seat map against the tickets the fans hold). `--naive` runs the
//! seeds' uncoordinated baseline in-process instead (read the map, then book what looked free):
//! it oversells, which is the point of the contrast.
//!
//! Modules by concern: [`FlashSaleArgs`] (the flags), the event (`crate::event`), the server
//! (`crate::server_choice`), `fans` (the simulation), `tally` (what the fans count), `progress`
//! (samples and bars), [`Report`] (table and JSON), `plot` (the SVG) and `naive` (the baseline).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use boxoffice_client::{Authed, Bearer};
use boxoffice_gateway::server::Running;
use boxoffice_proto::v1 as pb;

use crate::event::{create_request, sale_event};

mod args;
mod fans;
mod naive;
mod plot;
mod progress;
mod report;
mod tally;

pub use args::FlashSaleArgs;
pub use report::Report;

use fans::{Arrivals, Crowd, SaleEvent};
use progress::Progress;
use tally::Tally;

type Events = pb::event_service_client::EventServiceClient<Authed>;

/// Runs the sale (or the naive baseline) and returns its report; see [`Report::clean`].
pub async fn run(args: FlashSaleArgs) -> anyhow::Result<Report> {
    args.check()?;
    if args.naive {
        return Ok(naive::run(&args).await);
    }
    let mut backend = args
        .server
        .open(&format!("flash-sale-{}", args.seed), args.queue_max())
        .await?;
    let server = backend.server.take();
    let bearer = Bearer::new(&backend.admin_key)?;
    let mut channels = Vec::new();
    for _ in 0..8 {
        channels.push(boxoffice_client::connect(&backend.target).await?);
    }
    let mut admin = pb::event_service_client::EventServiceClient::with_interceptor(
        channels[0].clone(),
        bearer.clone(),
    );
    // The opening comes once the pre-opening fans joined.
    let opens_in = if args.preopen() > 0 {
        Duration::from_millis(1_500)
    } else {
        Duration::ZERO
    };
    let event = create_event(&mut admin, &args, opens_in).await?;
    let event_id = event.event_id.clone();
    let tally = Arc::new(Tally::default());
    tally.in_sale.store(args.fans as u64, Ordering::Release);
    let started = Instant::now();
    let progress = Progress::start(
        admin.clone(),
        event_id.clone(),
        started,
        (args.fans, args.seats),
        tally.clone(),
    );
    let arrivals = Arrivals::new(&args, started, opens_in);
    let args = Arc::new(args);
    let crowd = Arc::new(Crowd::new(args.clone(), event, channels, bearer, tally));
    fans::arrive(crowd.clone(), &arrivals).await?;
    let sale_seconds = started.elapsed().as_secs_f64();
    let view = await_expiry(&mut admin, &event_id, args.hold_ttl_ms()).await?;
    let samples = progress.stop();
    let mut report = Report {
        fans: args.fans,
        seats: args.seats,
        join_pow_bits: crowd.event.join_pow_bits,
        sale_seconds,
        ..Report::default()
    };
    let tickets = std::mem::take(
        &mut *crowd
            .tickets
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?,
    );
    report.count_tickets(&tickets, &view);
    report.engine_checked = server.is_some();
    if let Some(server) = server {
        check_engine(server, &mut report).await?;
    }
    let last_sale = crowd.last_sale.lock().ok().and_then(|l| *l);
    report.count_fans(&crowd.tally, &samples, started, last_sale);
    report.count_latencies(&crowd.lat);
    if let Some(path) = &args.plot {
        std::fs::write(path, plot::plot_svg(&samples, &report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

/// Creates the sale's event: sections as [`sale_event`], admission at `--admit-rate-per-second`, the
/// opening `opens_in` from now.
async fn create_event(
    admin: &mut Events,
    args: &FlashSaleArgs,
    opens_in: Duration,
) -> anyhow::Result<SaleEvent> {
    let mut spec = sale_event(args.seats, args.hold_ttl_ms(), args.per_user_limit);
    spec.join_pow_difficulty_bits = args.join_pow_bits;
    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    let event = admin
        .create_event(create_request(
            &spec,
            u32::try_from(args.hold_ttl_ms() / 1000).unwrap_or(600),
            args.admit_rate_per_second,
            120,
            i64::try_from(now_ms + u64::try_from(opens_in.as_millis())?)?,
        ))
        .await
        .context("creating the sale's event (is --admin-key an admin key?)")?
        .into_inner();
    let reserved = event
        .sections
        .iter()
        .filter(|s| s.kind == pb::SectionKind::Reserved as i32)
        .map(|s| s.section_id.clone())
        .collect();
    let all_sections = event
        .sections
        .iter()
        .map(|s| s.section_id.clone())
        .collect();
    Ok(SaleEvent {
        event_id: event.event_id,
        reserved,
        all_sections,
        join_pow_bits: event.join_pow_difficulty_bits,
    })
}

/// Waits for the sweeper to bring back the walked-away holds (they expire after their TTL;
/// 30 s more at most); the event as the server sees it then.
async fn await_expiry(
    admin: &mut Events,
    event_id: &str,
    hold_ttl_ms: u64,
) -> anyhow::Result<pb::Event> {
    let deadline = Instant::now() + Duration::from_millis(hold_ttl_ms) + Duration::from_secs(30);
    loop {
        let e = admin
            .get_event(pb::GetEventRequest {
                event_id: event_id.into(),
            })
            .await?
            .into_inner();
        let held: u32 = e.sections.iter().map(|s| s.held).sum();
        if held == 0 || Instant::now() > deadline {
            return Ok(e);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The embedded server's own truth: the engine's invariants, the reconciliation, the
/// sweeper's figures; then stops the server.
async fn check_engine(server: Running, report: &mut Report) -> anyhow::Result<()> {
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
    server.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server_choice::ServerChoice;
    use boxoffice_engine::Durability;

    fn small(fans: usize, seats: u32) -> FlashSaleArgs {
        FlashSaleArgs {
            fans,
            seats,
            arrival_seconds: 0.5,
            preopen_share: 0.2,
            admit_rate_per_second: 5_000,
            concurrency: 128,
            // Long enough that a declined payer still pays in time on a loaded CI machine.
            hold_ttl_seconds: 2,
            hold_ttl_ms: None,
            pay_share: 0.7,
            decline_share: 0.2,
            exact_share: 0.3,
            waitlist_share: 0.3,
            per_user_limit: 4,
            join_pow_bits: 0,
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_a_join_proof_of_work_every_fan_solves_a_challenge_before_the_line() {
        let mut args = small(300, 60);
        args.join_pow_bits = 10;
        let report = run(args).await.unwrap();
        assert!(report.clean(), "{}", report.table());
        assert_eq!(report.join_pow_bits, 10, "the event asked for it");
        assert_eq!(report.pow_solved, 300, "every fan solved one challenge");
        assert_eq!(report.admitted, 300, "and every solution was accepted");
        assert!(report.pow_solve_seconds > 0.0 && report.pow_solve_us.max > 0);
        assert!(report.sold > 0 && report.sold <= 60);
        assert!(
            report.table().contains("10 bits: 300 challenges solved"),
            "{}",
            report.table()
        );
        assert!(report.json().contains("\"pow_solved\":300"));
        let mut a = small(10, 60);
        a.join_pow_bits = 33;
        assert!(run(a).await.is_err(), "above the documented maximum");
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
        a.pay_share = 1.5;
        assert!(run(a).await.is_err());
        let mut a = small(10, 200);
        a.server.target = Some("http://127.0.0.1:1".into());
        assert!(run(a).await.is_err(), "--target without --admin-key");
    }
}
