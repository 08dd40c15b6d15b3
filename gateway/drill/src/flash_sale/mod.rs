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
//! `--nodes 3` plays the sale against a local cluster instead ([`crate::cluster`]): three
//! `boxoffice serve` processes of this executable replicating with Raft. The fans spread their
//! calls over the nodes and send a call that failed on one to the next, the same request
//! (`failover`); `--kill-leader-after SECONDS` kills the leader with SIGKILL that long after the
//! opening and measures the failover. At the end every hold and order the fans were told about
//! is read back through the cluster (none may be lost), and each live node's copy of the log is
//! checked offline (invariants, reconciliation).
//!
//! Modules by concern: [`FlashSaleArgs`] (the flags), the event (`crate::event`), the server
//! (`crate::server_choice`, or `crate::cluster`), `fans` (the simulation), `failover` (calls
//! over a cluster's nodes, the kill, the read-back), `tally` (what the fans count), `progress`
//! (samples and bars), [`Report`] (table and JSON), `plot` (the SVG) and `naive` (the baseline).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use boxoffice_client::{Authed, Bearer, Clients};
use boxoffice_gateway::server::Running;
use boxoffice_proto::v1 as pb;

use crate::cluster::{LocalCluster, NodeOptions};
use crate::event::{create_request, sale_event};
use crate::server_choice::Backend;

mod args;
mod failover;
mod fans;
pub(crate) mod naive;
mod pause;
mod plot;
mod presale;
mod progress;
mod report;
mod tally;
mod watch;

pub use args::FlashSaleArgs;
pub use report::{ClusterFigures, Report};

use failover::{Kill, Killer, Replacer};
use fans::{Arrivals, Crowd, SaleEvent};
use presale::Presale;
use progress::Progress;
use tally::Tally;

type Events = pb::event_service_client::EventServiceClient<Authed>;

/// Calls in flight at once on each server before its gate sheds (`OVERLOADED`).
const IN_FLIGHT_MAX: usize = 8_192;

/// Runs the sale (or the naive baseline) and returns its report; see [`Report::clean`].
pub async fn run(args: FlashSaleArgs) -> anyhow::Result<Report> {
    args.check()?;
    if args.naive {
        return Ok(naive::run(&args).await);
    }
    if args.nodes == 1 {
        let backend = args
            .server
            .open(&format!("flash-sale-{}", args.seed), args.queue_max())
            .await?;
        return sale(args, Servers::One(Box::new(backend))).await;
    }
    let exe = std::env::current_exe().context("finding this executable to start the nodes")?;
    let options = NodeOptions {
        durability: args.server.durability,
        queue_max: args.queue_max(),
        in_flight_max: IN_FLIGHT_MAX,
    };
    // The nodes go with the run: dropped (killed) when it ends, fails or is interrupted.
    let run = async {
        let size = u64::from(args.nodes);
        let cluster = LocalCluster::start(&exe, args.server.data_dir.as_deref(), &options, size)
            .await
            .with_context(|| format!("starting the cluster's {size} nodes"))?;
        sale(args, Servers::Cluster(Arc::new(cluster))).await
    };
    tokio::select! {
        r = run => r,
        () = crate::signal::shutdown_signal() => Err(anyhow::anyhow!("interrupted: the cluster's nodes were stopped")),
    }
}

/// What the sale plays against.
enum Servers {
    /// The embedded server, or `--target`.
    One(Box<Backend>),
    /// A local cluster (`--nodes 3`).
    Cluster(Arc<LocalCluster>),
}

impl Servers {
    /// The gRPC target of each server (node 1 first).
    fn targets(&self) -> Vec<String> {
        match self {
            Servers::One(b) => vec![b.target.clone()],
            Servers::Cluster(c) => c.targets(),
        }
    }

    /// An admin key of the servers.
    fn admin_key(&self) -> &str {
        match self {
            Servers::One(b) => &b.admin_key,
            Servers::Cluster(c) => c.admin_key(),
        }
    }
}

/// Channels to each of `targets`: to one server, as few as carry `concurrency` calls at the
/// server's streams per connection (two at the default 512), four to each node of a cluster.
/// Few connections carry many calls each, and each write then carries the frames of many: on
/// two shared cores the million-fan sale ran about a fifth faster on two connections than on
/// eight (BENCHMARKS.md, "The sale's tail").
async fn connect_all(
    targets: &[String],
    concurrency: usize,
) -> anyhow::Result<Vec<Vec<tonic::transport::Channel>>> {
    let streams = boxoffice_gateway::limits::STREAMS_PER_CONNECTION_MAX as usize;
    let per_node = if targets.len() == 1 {
        concurrency.div_ceil(streams).max(1)
    } else {
        4
    };
    let mut nodes = Vec::new();
    for target in targets {
        let mut channels = Vec::new();
        for _ in 0..per_node {
            channels.push(boxoffice_client::connect(target).await?);
        }
        nodes.push(channels);
    }
    Ok(nodes)
}

/// The checks after the sale: the embedded engine's, or the cluster's (see [`check_cluster`]).
async fn check_servers(
    servers: &mut Servers,
    crowd: &Crowd,
    kill: Option<Kill>,
    first_term: Option<u64>,
    bearer: &Bearer,
    report: &mut Report,
) -> anyhow::Result<()> {
    match servers {
        Servers::One(backend) => {
            let server = backend.server.take();
            report.engine_checked = server.is_some();
            if let Some(server) = server {
                check_engine(server, report).await?;
            }
        }
        Servers::Cluster(cluster) => {
            check_cluster(cluster, crowd, kill, first_term, bearer, report).await?;
        }
    }
    Ok(())
}

/// The leader's killer of `--kill-leader-after`, on a cluster: it kills that long after the
/// `opening`.
fn killer(servers: &Servers, args: &FlashSaleArgs, opening: Instant) -> Option<Killer> {
    match (servers, args.kill_leader_after) {
        (Servers::Cluster(c), Some(after)) => Some(Killer::spawn(
            c.clone(),
            opening,
            opening + Duration::from_secs_f64(after),
        )),
        _ => None,
    }
}

/// The replacer of `--replace-node-after`, on a cluster: it replaces a follower that long after
/// the `opening`.
fn replacer(servers: &Servers, args: &FlashSaleArgs, opening: Instant) -> Option<Replacer> {
    match (servers, args.replace_node_after) {
        (Servers::Cluster(c), Some(after)) => Some(Replacer::spawn(
            c.clone(),
            opening,
            opening + Duration::from_secs_f64(after),
        )),
        _ => None,
    }
}

/// The sale itself, against `servers`.
async fn sale(args: FlashSaleArgs, mut servers: Servers) -> anyhow::Result<Report> {
    let targets = servers.targets();
    let bearer = Bearer::new(servers.admin_key())?;
    let nodes = connect_all(&targets, args.concurrency).await?;
    let admins: Vec<Events> = nodes
        .iter()
        .map(|c| {
            pb::event_service_client::EventServiceClient::with_interceptor(
                c[0].clone(),
                bearer.clone(),
            )
        })
        .collect();
    // The opening comes once the pre-opening fans joined.
    let opens_in = Duration::from_millis(if args.preopen() > 0 { 1_500 } else { 0 });
    let mut event = create_event(&mut admins[0].clone(), &args, opens_in).await?;
    let event_id = event.event_id.clone();
    if args.hold_cooldown_seconds > 0 {
        admins[0]
            .clone()
            .update_sale(pb::UpdateSaleRequest {
                event_id: event_id.clone(),
                hold_cooldown_seconds: Some(i64::from(args.hold_cooldown_seconds)),
                ..Default::default()
            })
            .await
            .context("setting the hold cool-down")?;
    }
    let watcher = watch::Watcher::spawn(targets.clone(), servers.admin_key(), &event_id);
    let tally = Arc::new(Tally::default());
    tally.in_sale.store(args.fans as u64, Ordering::Release);
    let started = Instant::now();
    let progress = Progress::start(
        admins.clone(),
        event_id.clone(),
        started,
        (args.fans, args.seats),
        tally.clone(),
    );
    let first_term = match &servers {
        Servers::Cluster(c) => c.term().await,
        Servers::One(_) => None,
    };
    let killer = killer(&servers, &args, started + opens_in);
    let replacer = replacer(&servers, &args, started + opens_in);
    let pauser = args.pause_at.map(|at| {
        pause::Pauser::spawn(
            admins.clone(),
            event_id.clone(),
            started,
            started + opens_in + Duration::from_secs_f64(at),
            Duration::from_secs_f64(args.pause_for),
        )
    });
    let arrivals = Arrivals::new(&args, started, opens_in);
    if let Some(p) = &mut event.presale {
        // The fans who come before the public sale are the fan club.
        p.ends_at = started + opens_in + Duration::from_secs_f64(args.presale_seconds);
        p.fan_club = (0..args.fans)
            .take_while(|&i| arrivals.at(i) < p.ends_at)
            .count();
    }
    let channels: Vec<_> = nodes.iter().map(|c| c[0].clone()).collect();
    let args = Arc::new(args);
    let crowd = Arc::new(Crowd::new(
        args.clone(),
        event,
        nodes,
        bearer.clone(),
        tally,
    ));
    let stop_hoarding = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hoarders: Vec<_> = (0..args.hoarders)
        .map(|k| tokio::spawn(fans::hoard(crowd.clone(), k, stop_hoarding.clone())))
        .collect();
    fans::arrive(crowd.clone(), &arrivals).await?;
    let sale_seconds = started.elapsed().as_secs_f64();
    stop_hoarding.store(true, Ordering::Release);
    let mut hoarded_at_end = 0u64;
    for h in hoarders {
        hoarded_at_end += u64::from(h.await.context("a hoarding bot panicked")?);
    }
    // The kill (if the fans were done before its time, it comes now), then the final counts.
    let kill = match killer {
        Some(k) => Some(k.finish().await?),
        None => None,
    };
    let replaced = match replacer {
        Some(r) => Some(r.finish().await?),
        None => None,
    };
    let paused = match pauser {
        Some(p) => Some(p.finish().await?),
        None => None,
    };
    let mut tickets = std::mem::take(
        &mut *crowd
            .tickets
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?,
    );
    let after_sale = if args.after_sale > 0 {
        // The sale is over: its end is recorded, so places given back stay free (no new
        // hold, no waitlist offer) for the seat-by-seat audit below.
        end_sale(&admins, &event_id).await?;
        let orders = (&crowd.orders, &crowd.tally.acked);
        let n = args.after_sale;
        Some(presale::after_sale(&channels, &bearer, orders, n, &mut tickets).await)
    } else {
        None
    };
    let view = await_expiry(&admins, &event_id, args.hold_ttl_ms()).await?;
    let samples = progress.stop();
    let mut report = Report {
        fans: args.fans,
        seats: args.seats,
        join_pow_bits: crowd.event.join_pow_bits,
        sale_seconds,
        nodes: u32::try_from(targets.len()).unwrap_or(u32::MAX),
        ..Report::default()
    };
    report.count_tickets(&tickets, &view);
    report.after_sale = after_sale;
    report.presale = crowd.event.presale.as_ref().map(|p| {
        let waits = crowd.tally.presale_waits.load(Ordering::Relaxed);
        presale::PresaleFigures::audit(p, &view, waits)
    });
    report.changes_followed = Some(watcher.finish(report.held, report.sold).await?);
    check_servers(&mut servers, &crowd, kill, first_term, &bearer, &mut report).await?;
    if let (Some(c), Some(r)) = (&mut report.cluster, replaced) {
        c.replaced_node = Some(r.old);
        c.replaced_by = Some(r.new);
        c.replaced_after_opening_seconds = Some(r.after_opening_seconds);
        c.replace_ms = Some(u64::try_from(r.took.as_millis()).unwrap_or(u64::MAX));
    }
    if args.hoarders > 0 {
        report.hoarders = Some(args.hoarders as u64);
        report.hoarder_holds = Some(crowd.tally.hoarder_holds.load(Ordering::Relaxed));
        report.hoarded_at_end = Some(hoarded_at_end);
        report.hold_cooldown_seconds = args.hold_cooldown_seconds;
    }
    if let Some(p) = paused {
        report.paused_at_seconds = Some(p.paused_at_seconds);
        report.resumed_at_seconds = Some(p.resumed_at_seconds);
        report.places_taken_during_pause = Some(p.taken_during_pause);
        report.pause_call_ms = Some(p.pause_call_ms);
    }
    count_and_plot(&mut report, &crowd, &samples, started)?;
    Ok(report)
}

/// The fans' and latencies' figures of the sale begun at `started`, and its chart (`--plot`).
fn count_and_plot(
    report: &mut Report,
    crowd: &Crowd,
    samples: &[progress::Sample],
    started: Instant,
) -> anyhow::Result<()> {
    let last_sale = crowd.last_sale.lock().ok().and_then(|l| *l);
    report.count_fans(&crowd.tally, samples, started, last_sale);
    report.count_latencies(&crowd.lat);
    if let Some(path) = &crowd.args.plot {
        std::fs::write(path, plot::plot_svg(samples, report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The end of a cluster run: every hold and order the fans were told about is read back
/// through the live nodes (none may be lost), then the live nodes settle and stop, and each
/// one's copy of the log is opened offline for the engine's invariants and the
/// reconciliation (summed over the copies). A read that failed for good counts as an
/// unexpected error of the fans.
async fn check_cluster(
    cluster: &LocalCluster,
    crowd: &Crowd,
    kill: Option<Kill>,
    first_term: Option<u64>,
    bearer: &Bearer,
    report: &mut Report,
) -> anyhow::Result<()> {
    let tally = &crowd.tally;
    let last_term = cluster.term().await;
    let read = read_back(cluster, bearer, tally).await?;
    let refunded = cluster.await_refunds(Duration::from_secs(15)).await;
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    report.cluster = Some(ClusterFigures {
        killed_node: kill.map(|k| k.node),
        killed_after_opening_seconds: kill.map(|k| k.after_opening_seconds),
        failover_ms: kill
            .and_then(|k| k.failover)
            .map(|f| u64::try_from(f.as_millis()).unwrap_or(u64::MAX)),
        new_leader: kill.and_then(|k| k.new_leader),
        elections: last_term
            .zip(first_term)
            .map(|(last, first)| last.saturating_sub(first)),
        calls_failed_in_failover: n(&tally.failover_calls),
        failed_attempts: n(&tally.failover_attempts),
        fans_sent_back_to_line: n(&tally.sent_back_to_line),
        acknowledged_holds: read.holds,
        acknowledged_orders: read.orders,
        acknowledged_lost: read.lost,
        first_lost: read.first_lost,
        charges_refunded: refunded,
        refunds_pending: 0,
        ..ClusterFigures::default()
    });
    if kill.is_some_and(|k| k.failover.is_none()) {
        tally.error(
            "no node led the group with its engine serving within 30 s of the kill",
            None,
        );
    }
    check_copies(cluster, report).await
}

/// Every hold and order the fans were told about, read back through the live nodes; a read
/// that failed for good counts as an error of the run.
async fn read_back(
    cluster: &LocalCluster,
    bearer: &Bearer,
    tally: &Tally,
) -> anyhow::Result<failover::ReadBack> {
    let mut clients = Vec::new();
    for id in &cluster.live() {
        let target = cluster.target_of(*id)?;
        clients.push(Clients::new(
            &boxoffice_client::connect(&target).await?,
            bearer,
        ));
    }
    let acked = std::mem::take(
        &mut *tally
            .acked
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?,
    );
    let read = failover::read_back(clients, acked).await;
    if read.failed > 0 {
        tally.errors.fetch_add(read.failed, Ordering::Relaxed);
        if let Ok(mut f) = tally.first_error.lock() {
            f.get_or_insert(format!(
                "reading back what the fans were told: {}",
                read.first_failed.clone().unwrap_or_default()
            ));
        }
    }
    Ok(read)
}

/// Stops the live nodes and opens each one's copy of the log offline: the engine's
/// invariants and the reconciliation, summed over the copies.
async fn check_copies(cluster: &LocalCluster, report: &mut Report) -> anyhow::Result<()> {
    for (id, dir) in cluster.stop(Duration::from_secs(10)).await? {
        let copy = crate::cluster::check_copy(&dir)
            .await
            .with_context(|| format!("checking node {id}'s copy offline"))?;
        report.invariant_violations += copy.invariant_violations;
        report.reconciliation_findings += copy.reconciliation_findings;
        if let Some(c) = &mut report.cluster {
            c.refunds_pending = c.refunds_pending.max(copy.refunds_pending);
        }
    }
    report.engine_checked = true;
    Ok(())
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
    let opening_ms = i64::try_from(now_ms + u64::try_from(opens_in.as_millis())?)?;
    let mut req = create_request(
        &spec,
        u32::try_from(args.hold_ttl_ms() / 1000).unwrap_or(600),
        args.admit_rate_per_second,
        120,
        opening_ms,
    );
    let presale = Presale::plan(args, Instant::now() + opens_in, opening_ms);
    if let Some(p) = &presale {
        p.apply(&mut req);
    }
    if args.after_sale > 0 {
        // Tickets may be given back for an hour (the after-sale gives some back).
        req.cancellation_deadline_unix_ms = opening_ms + 3_600_000;
    }
    let event = admin
        .create_event(req)
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
        presale,
    })
}

/// Ends the sale (`UpdateSale` `SALE_STATE_ENDED`), on any node that answers.
async fn end_sale(admins: &[Events], event_id: &str) -> anyhow::Result<()> {
    let at = AtomicUsize::new(0);
    failover::on_any_node(admins, &at, |mut c: Events| async move {
        c.update_sale(pb::UpdateSaleRequest {
            event_id: event_id.into(),
            state: pb::SaleState::Ended as i32,
            idempotency_key: "flash-sale-end".into(),
            ..Default::default()
        })
        .await
    })
    .await
    .context("ending the sale before the after-sale")?;
    Ok(())
}

/// Waits for the sweeper to bring back the walked-away holds (they expire after their TTL;
/// 30 s more at most); the event as the servers see it then (asked of each node in turn while
/// one fails, on a cluster).
async fn await_expiry(
    admins: &[Events],
    event_id: &str,
    hold_ttl_ms: u64,
) -> anyhow::Result<pb::Event> {
    let deadline = Instant::now() + Duration::from_millis(hold_ttl_ms) + Duration::from_secs(30);
    let at = AtomicUsize::new(0);
    loop {
        let e = failover::on_any_node(admins, &at, |mut c: Events| async move {
            c.get_event(pb::GetEventRequest {
                event_id: event_id.into(),
            })
            .await
        })
        .await
        .context("reading the event's counts at the end of the sale")?
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
        if let Some(p) = &mut report.presale {
            for m in engine.access_code_miscounts().await? {
                tracing::error!(miscount = %m, "an access code's uses and its holds disagree");
                p.codes_miscounted += 1;
            }
        }
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
            nodes: 1,
            kill_leader_after: None,
            replace_node_after: None,
            pause_at: None,
            pause_for: 2.0,
            hoarders: 0,
            hold_cooldown_seconds: 0,
            presale_codes: 0,
            presale_seconds: 2.0,
            after_sale: 3,
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
            report.admitted + report.told_sold_out,
            2_000,
            "everyone got through the waiting room, or was told in line that every place was \
             taken: {}",
            report.table()
        );
        assert!(
            report.told_sold_out > 0 && report.sold_out_answers + report.told_sold_out > 1_000,
            "10:1 oversubscribed: most fans are turned away, most of them told by the line"
        );
        assert!(report.walked_away > 0, "some holds were left to expire");
        assert!(
            report.declined_then_paid > 0,
            "some paid with a second card"
        );
        assert_eq!(report.held, 0, "every walked-away hold expired");
        // The sale's reader of the change stream saw every hold, expiry and order.
        let changes = report.changes_followed.clone().unwrap();
        assert!(changes.adds_up, "{}", report.table());
        assert!(changes.holds >= report.holds && changes.orders >= report.confirms);
        assert!(changes.expired > 0 && changes.while_following > 0);
        assert!(report.table().contains("adds up to the seats"));
        // After the sale three fans gave a ticket back and three passed one on: the audit
        // above counted the places given back as free, the moved ones as sold.
        let after = report.after_sale.clone().unwrap();
        assert_eq!(
            (after.cancelled, after.transferred, after.failed),
            (3, 3, 0)
        );
        assert_eq!(
            (changes.cancelled_places, changes.transferred_places),
            (3, 3)
        );
        assert!(report.available >= 3, "{}", report.table());
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
    async fn a_presale_sells_to_code_holders_first_and_no_code_goes_over_its_cap() {
        let mut args = small(2_000, 200);
        // 50 codes of 2 places each, for 500 fan-club fans: the caps bind.
        (args.presale_codes, args.presale_seconds) = (50, 1.5);
        let report = run(args).await.unwrap();
        assert!(report.clean(), "{}", report.table());
        let p = report.presale.clone().unwrap();
        assert_eq!((p.codes, p.cap_per_code, p.codes_over_cap), (50, 2, 0));
        assert_eq!(p.codes_miscounted, 0, "{}", report.table());
        assert!(
            p.places_under_codes > 0 && p.places_under_codes <= 100 && p.codes_used_up > 0,
            "fan-club fans bought first, up to the codes' caps and never past them: {}",
            report.table()
        );
        assert!(p.waited_for_public_sale > 0, "the public waited");
        assert!(report.table().contains("presale: codes"));
        assert!(report.json().contains("\"codes_over_cap\":0"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_a_join_proof_of_work_every_fan_solves_a_challenge_before_the_line() {
        let mut args = small(300, 60);
        args.join_pow_bits = 10;
        let report = run(args).await.unwrap();
        assert!(report.clean(), "{}", report.table());
        assert_eq!(report.join_pow_bits, 10, "the event asked for it");
        assert_eq!(report.pow_solved, 300, "every fan solved one challenge");
        assert_eq!(
            report.admitted + report.told_sold_out,
            300,
            "and every solution was accepted: each fan was admitted, or told in line that \
             every place was taken"
        );
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
    async fn a_sale_paused_in_its_burst_takes_no_place_while_paused_and_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let plot = dir.path().join("sale.svg");
        let mut args = small(2_000, 400);
        // Arrivals over 2 s: the pause at 0.5 s comes in the middle of them.
        args.arrival_seconds = 2.0;
        args.pause_at = Some(0.5);
        args.pause_for = 1.0;
        args.plot = Some(plot.clone());
        let report = run(args).await.unwrap();
        assert!(report.clean(), "{}", report.table());
        let (from, to) = (
            report.paused_at_seconds.unwrap(),
            report.resumed_at_seconds.unwrap(),
        );
        assert!(to - from >= 1.0, "{}", report.table());
        assert!(
            report.places_taken_during_pause.unwrap() <= 0,
            "no place taken while paused: {}",
            report.table()
        );
        assert!(
            report.sale_paused_answers > 0,
            "fans were told SALE_PAUSED, and tried again: {}",
            report.table()
        );
        assert_eq!(
            report.admitted + report.told_sold_out,
            2_000,
            "every fan went on after the pause: {}",
            report.table()
        );
        assert!(report.sold > 0 && report.sold <= 400);
        assert!(report.table().contains("sale paused (operator)"));
        assert!(std::fs::read_to_string(&plot).unwrap().contains("paused"));
        assert!(report.json().contains("\"places_taken_during_pause\":"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hoarding_bots_keep_places_from_the_fans_and_the_report_counts_them() {
        let mut args = small(2_000, 200);
        args.arrival_seconds = 2.0;
        args.hoarders = 10;
        // Without a waitlist, expired places go back to anyone: the bots hold them again (with
        // one, the waiting fans get them first).
        args.waitlist_share = 0.0;
        let report = run(args).await.unwrap();
        assert!(report.clean(), "{}", report.table());
        assert_eq!(report.hoarders, Some(10));
        // A bot drawn late in the opening's lottery may be told sold out and never be let in
        // again before the fans are done; those that held kept at most their limit each.
        let kept = report.hoarded_at_end.unwrap();
        let holds = report.hoarder_holds.unwrap();
        assert!(
            holds >= 1 && holds * 4 >= kept,
            "the bots' holds are counted: {}",
            report.table()
        );
        assert!(
            kept > 0 && kept <= 40,
            "the bots kept places from the fans, at most their limit each: {}",
            report.table()
        );
        assert!(
            u64::from(report.available) >= kept,
            "what they kept went unsold: {}",
            report.table()
        );
        assert!(report.table().contains("hoarders: bots / their holds"));
        assert!(report.json().contains("\"hoarder_holds\":"));
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
        (a.presale_codes, a.naive) = (2, true);
        assert!(run(a).await.is_err(), "a presale needs the engine");
        let mut a = small(10, 200);
        a.presale_codes = 101;
        assert!(run(a).await.is_err(), "more codes than half the seats");
        let mut a = small(10, 200);
        (a.presale_codes, a.presale_seconds) = (2, 0.0);
        assert!(run(a).await.is_err());
        let mut a = small(10, 200);
        a.pay_share = 1.5;
        assert!(run(a).await.is_err());
        let mut a = small(10, 200);
        a.server.target = Some("http://127.0.0.1:1".into());
        assert!(run(a).await.is_err(), "--target without --admin-key");
    }
}
