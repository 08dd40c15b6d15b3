//! The metrics endpoint: Prometheus text over HTTP on its own port.
//!
//! The recorder is process-global and installed once. Every histogram gets real buckets
//! (Prometheus histograms SREs can aggregate, not summaries): latencies in seconds from 50 µs to
//! 10 s, batch sizes from 1 to 8,192.
//!
//! [`FAMILIES`] is the one list of every family the server exports (besides the `process_*`
//! families of `metrics-process`): its type, unit and HELP text, and which series exist from
//! the start. [`install`] describes them all and registers, at 0, every series whose labels are
//! known up front (RPC method x code x reason, actor kinds, finding kinds, outcomes); series
//! labelled by event and section are registered when the event is created or recovered, before
//! its first call. Label values are bounded: methods, codes and reasons from fixed lists (an
//! unknown reason is `other`), events and sections only as configured (events are never
//! deleted, so their series stay; their number is sections x a few series).
//!
//! Gauges that are cheap to read are read at each scrape (calls in flight, process metrics);
//! the data dir's size and the sweeper's backlog are sampled every [`SAMPLE_EVERY`] by
//! [`spawn_sampler`] (a directory walk and one message per section, never per request); the
//! places of each section follow the snapshots the sections publish.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use boxoffice_engine::{ACTOR_KINDS, Engine, EngineError, Finding, Rejection};
use metrics::{KeyName, SharedString, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Latency buckets, seconds.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];
/// Batch-size buckets, records.
pub const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];

/// How often [`spawn_sampler`] measures the data dir and the sweeper's backlog.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// What a family is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (`_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets.
    Histogram,
}

impl Kind {
    /// The `# TYPE` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// The labels of one series.
pub type Labels = Vec<(&'static str, String)>;

/// Which series of a family exist before anything happens.
#[derive(Clone, Copy)]
pub enum Series {
    /// One series without labels, from the start.
    One,
    /// These label sets, from the start.
    Sets(fn() -> Vec<Labels>),
    /// One set per section (labels `event`, `section`, and what the family adds), registered
    /// by the engine when the section starts (created or recovered).
    PerSection,
    /// One set per event (label `event`), registered when the event is created or recovered.
    PerEvent,
    /// A cluster node's only (see [`spawn_raft_sampler`]): absent on a single node.
    Cluster,
}

/// One metric family.
#[derive(Clone, Copy)]
pub struct Family {
    /// Its name.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its unit (`None`: a plain number).
    pub unit: Option<Unit>,
    /// The `# HELP` text.
    pub help: &'static str,
    /// The series present from the start.
    pub series: Series,
}

const fn family(
    name: &'static str,
    kind: Kind,
    unit: Option<Unit>,
    help: &'static str,
    series: Series,
) -> Family {
    Family {
        name,
        kind,
        unit,
        help,
        series,
    }
}

use Kind::{Counter, Gauge, Histogram};
const SECONDS: Option<Unit> = Some(Unit::Seconds);
const BYTES: Option<Unit> = Some(Unit::Bytes);
const COUNT: Option<Unit> = Some(Unit::Count);

/// Every family the server exports (the `process_*` ones come from `metrics-process`).
pub const FAMILIES: &[Family] = &[
    // gateway
    family(
        "boxoffice_build_info",
        Gauge,
        None,
        "Always 1; the labels say which build runs (version, git_commit, rustc; unknown when not known at build time).",
        Series::Sets(build_info_labels),
    ),
    family(
        "boxoffice_rpc_handled_total",
        Counter,
        COUNT,
        "gRPC calls answered, by method, gRPC code and ErrorInfo reason (none: no reason; other: a reason not in the contract). Every combination is present from the start.",
        Series::Sets(rpc_outcomes),
    ),
    family(
        "boxoffice_hold_batch_items_total",
        Counter,
        COUNT,
        "Items of HoldBatch calls answered, by gRPC code and ErrorInfo reason (OK/none: held), as a Hold would have answered each. Every combination is present from the start.",
        Series::Sets(item_outcomes),
    ),
    family(
        "boxoffice_rpc_duration_seconds",
        Histogram,
        SECONDS,
        "Time from a call reaching the gate to its answer, by method, gRPC code and ErrorInfo reason. Present from the start for each method with code OK.",
        Series::Sets(rpc_ok),
    ),
    family(
        "boxoffice_rpc_in_flight",
        Gauge,
        COUNT,
        "gRPC calls being served now (read at each scrape); past boxoffice_rpc_in_flight_limit new calls are shed with OVERLOADED.",
        Series::One,
    ),
    family(
        "boxoffice_rpc_in_flight_limit",
        Gauge,
        COUNT,
        "The bound of calls in flight (--in-flight-max) past which the gate sheds with OVERLOADED.",
        Series::One,
    ),
    family(
        "boxoffice_gateway_shed_total",
        Counter,
        COUNT,
        "Calls shed by the gate with OVERLOADED because boxoffice_rpc_in_flight_limit calls were in flight.",
        Series::Sets(scope_gate),
    ),
    family(
        "boxoffice_waiting_room_admitted_total",
        Counter,
        COUNT,
        "Fans admitted from an event's waiting room.",
        Series::PerEvent,
    ),
    family(
        "boxoffice_waiting_room_admit_rate",
        Gauge,
        None,
        "Fans admitted per second from an event's waiting room, as measured while fans wait.",
        Series::PerEvent,
    ),
    family(
        "boxoffice_waiting_room_queue_length",
        Gauge,
        COUNT,
        "Fans in an event's waiting room (admitted or not).",
        Series::PerEvent,
    ),
    family(
        "boxoffice_join_challenges_used",
        Gauge,
        COUNT,
        "Join challenges (the proof of work before Join) used and not yet expired: the set that refuses a second use, pruned every second.",
        Series::One,
    ),
    // engine: sections
    family(
        "boxoffice_section_places",
        Gauge,
        COUNT,
        "Places of a section by state (available, held, sold; sold includes places withdrawn after accepted damage), from the snapshot the section publishes with every change.",
        Series::PerSection,
    ),
    family(
        "boxoffice_section_mailbox_depth",
        Gauge,
        COUNT,
        "Requests queued for a section's actor when it last finished a batch; at --section-inflight-max the engine sheds.",
        Series::PerSection,
    ),
    family(
        "boxoffice_section_holds_total",
        Counter,
        COUNT,
        "Holds a section placed (waitlist offers included).",
        Series::PerSection,
    ),
    family(
        "boxoffice_section_confirms_total",
        Counter,
        COUNT,
        "Holds a section confirmed (sold).",
        Series::PerSection,
    ),
    family(
        "boxoffice_section_releases_total",
        Counter,
        COUNT,
        "Holds a section released on request.",
        Series::PerSection,
    ),
    family(
        "boxoffice_section_expired_total",
        Counter,
        COUNT,
        "Holds a section expired (by the sweeper, or found past their deadline by a confirm or release).",
        Series::PerSection,
    ),
    family(
        "boxoffice_section_rejections_total",
        Counter,
        COUNT,
        "Requests a section refused, by reason (every reason present from the section's start).",
        Series::PerSection,
    ),
    // engine: the rest
    family(
        "boxoffice_engine_shed_total",
        Counter,
        COUNT,
        "Requests the engine shed with OVERLOADED because a section's queue was full.",
        Series::Sets(scope_section),
    ),
    family(
        "boxoffice_engine_actor_panics_total",
        Counter,
        COUNT,
        "Engine actors that panicked, by kind (section, waitlist, ledger).",
        Series::Sets(actor_kinds),
    ),
    family(
        "boxoffice_engine_actor_restarts_total",
        Counter,
        COUNT,
        "Engine actors rebuilt from the log after a panic, by kind.",
        Series::Sets(actor_kinds),
    ),
    family(
        "boxoffice_engine_recovery_seconds",
        Gauge,
        SECONDS,
        "How long the last start took to replay the log.",
        Series::One,
    ),
    family(
        "boxoffice_engine_events_created_total",
        Counter,
        COUNT,
        "Events created since the start.",
        Series::One,
    ),
    family(
        "boxoffice_ledger_user_limit_total",
        Counter,
        COUNT,
        "Holds refused with USER_LIMIT by the per-user ledger.",
        Series::One,
    ),
    family(
        "boxoffice_checkout_confirms_total",
        Counter,
        COUNT,
        "Confirm calls that reached checkout, by outcome (confirmed, a reason, or error).",
        Series::Sets(confirm_outcomes),
    ),
    family(
        "boxoffice_checkout_rescued_total",
        Counter,
        COUNT,
        "Confirms whose hold expired after the charge but whose places were still free and were taken again.",
        Series::One,
    ),
    family(
        "boxoffice_checkout_refunds_total",
        Counter,
        COUNT,
        "Charges refunded by checkout because the places were gone after the hold expired.",
        Series::One,
    ),
    family(
        "boxoffice_payment_charge_seconds",
        Histogram,
        SECONDS,
        "Time the payment provider took to answer a charge.",
        Series::One,
    ),
    family(
        "boxoffice_payment_charges_total",
        Counter,
        COUNT,
        "Charges the simulated payment provider decided, by outcome (captured, declined).",
        Series::Sets(charge_outcomes),
    ),
    family(
        "boxoffice_payment_refunds_total",
        Counter,
        COUNT,
        "Refunds the simulated payment provider made.",
        Series::One,
    ),
    family(
        "boxoffice_reconcile_findings_total",
        Counter,
        COUNT,
        "Reconciliation findings (orders, claims and payments that do not add up), by kind.",
        Series::Sets(finding_kinds),
    ),
    family(
        "boxoffice_seat_map_builds_total",
        Counter,
        COUNT,
        "Seat maps of a section built (encoded) for GetSeatMap: one per change that a reader asked for, shared by every reader of that version.",
        Series::One,
    ),
    family(
        "boxoffice_refunds_pending",
        Gauge,
        COUNT,
        "Captured charges without a sale waiting out --refund-grace-seconds before the server refunds them (set by each reconciliation pass).",
        Series::One,
    ),
    family(
        "boxoffice_refunds_total",
        Counter,
        COUNT,
        "Captured charges the server refunded because their hold ended without an order, by cause.",
        Series::Sets(refund_causes),
    ),
    family(
        "boxoffice_reconcile_last_findings",
        Gauge,
        COUNT,
        "Findings of the last reconciliation (0: clean).",
        Series::One,
    ),
    // a cluster node (issue 13)
    family(
        "boxoffice_raft_leader",
        Gauge,
        None,
        "By group: 1 while this node leads the Raft group, 0 while another does or none is known.",
        Series::Cluster,
    ),
    family(
        "boxoffice_raft_leader_known",
        Gauge,
        None,
        "By group: 1 while this node knows the group's leader (to serve or forward to), 0 during an election.",
        Series::Cluster,
    ),
    family(
        "boxoffice_raft_term",
        Gauge,
        COUNT,
        "By group: this node's current Raft term.",
        Series::Cluster,
    ),
    family(
        "boxoffice_raft_last_log_index",
        Gauge,
        COUNT,
        "By group: the index of the last entry in this node's Raft log.",
        Series::Cluster,
    ),
    family(
        "boxoffice_raft_applied_index",
        Gauge,
        COUNT,
        "By group: the index of the last entry this node applied to its copy of the log.",
        Series::Cluster,
    ),
    family(
        "boxoffice_raft_warm",
        Gauge,
        None,
        "By group: 1 while this node keeps the state its engine would start from (a follower applying each committed batch to it), 0 while it leads or has not warmed up.",
        Series::Cluster,
    ),
    family(
        "boxoffice_raft_commit_lag_entries",
        Gauge,
        COUNT,
        "By group and peer, on the group's leader: entries of its log the peer has not acknowledged yet (0 on other nodes).",
        Series::Cluster,
    ),
    family(
        "boxoffice_raft_leader_changes_total",
        Counter,
        COUNT,
        "By group: leader changes this node has seen (elections won by some node, or leaders lost).",
        Series::Cluster,
    ),
    family(
        "boxoffice_cluster_forwarded_total",
        Counter,
        COUNT,
        "Calls this node forwarded to the leader of their group, by method.",
        Series::Cluster,
    ),
    // engine: the log
    family(
        "boxoffice_store_halted",
        Gauge,
        None,
        "1 once the engine stopped for good (the log failed, an actor could not be rebuilt, or the sweeper stopped): restart the server.",
        Series::One,
    ),
    family(
        "boxoffice_store_log_bytes",
        Gauge,
        BYTES,
        "Bytes of the log on disk: sled's files and the superblock (sampled every few seconds).",
        Series::One,
    ),
    family(
        "boxoffice_store_data_dir_bytes",
        Gauge,
        BYTES,
        "Bytes of everything under the data dir: the log, ticket keys, kept copies of a damaged log (sampled every few seconds).",
        Series::One,
    ),
    family(
        "boxoffice_wal_halts_total",
        Counter,
        COUNT,
        "Times the log halted the engine (fail-stop).",
        Series::One,
    ),
    family(
        "boxoffice_wal_records_total",
        Counter,
        COUNT,
        "Records written to the log.",
        Series::One,
    ),
    family(
        "boxoffice_wal_bytes_total",
        Counter,
        BYTES,
        "Bytes of records written to the log.",
        Series::One,
    ),
    family(
        "boxoffice_wal_batch_records",
        Histogram,
        COUNT,
        "Records per group-commit batch.",
        Series::One,
    ),
    family(
        "boxoffice_wal_batch_seconds",
        Histogram,
        SECONDS,
        "Time to write and make durable one group-commit batch.",
        Series::One,
    ),
    family(
        "boxoffice_wal_flush_seconds",
        Histogram,
        SECONDS,
        "Time of one sled flush (fsync).",
        Series::One,
    ),
    family(
        "boxoffice_wal_superblock_seconds",
        Histogram,
        SECONDS,
        "Time to write the superblock of high-water marks.",
        Series::One,
    ),
    family(
        "boxoffice_wal_checkpoint_seconds",
        Histogram,
        SECONDS,
        "Time to write one stream's checkpoint.",
        Series::One,
    ),
    family(
        "boxoffice_wal_compaction_seconds",
        Histogram,
        SECONDS,
        "Time to drop log records a checkpoint covers.",
        Series::One,
    ),
    // sweeper
    family(
        "boxoffice_sweeper_backlog_holds",
        Gauge,
        COUNT,
        "Active holds past their deadline that the sweeper has not expired yet (sampled every few seconds; a few for a moment after each deadline are normal, a growing number is not).",
        Series::One,
    ),
    family(
        "boxoffice_sweeper_expired_total",
        Counter,
        COUNT,
        "Holds the sweeper expired.",
        Series::One,
    ),
    family(
        "boxoffice_sweeper_expiry_lag_seconds",
        Histogram,
        SECONDS,
        "Delay between a hold's deadline and its expiry by the sweeper.",
        Series::One,
    ),
    family(
        "boxoffice_waitlist_offers_total",
        Counter,
        COUNT,
        "Waitlist offers by outcome (made, accepted, lapsed).",
        Series::Sets(offer_outcomes),
    ),
    family(
        "boxoffice_waitlist_length",
        Gauge,
        COUNT,
        "Fans waiting on an event's waitlist (updated when the sweeper offers places).",
        Series::PerEvent,
    ),
];

fn one(label: &'static str, values: &[&str]) -> Vec<Labels> {
    values
        .iter()
        .map(|v| vec![(label, (*v).to_owned())])
        .collect()
}

fn build_info_labels() -> Vec<Labels> {
    vec![vec![
        ("version", env!("CARGO_PKG_VERSION").to_owned()),
        (
            "git_commit",
            option_env!("BOXOFFICE_GIT_COMMIT")
                .unwrap_or("unknown")
                .to_owned(),
        ),
        (
            "rustc",
            option_env!("BOXOFFICE_RUSTC_VERSION")
                .unwrap_or("unknown")
                .to_owned(),
        ),
    ]]
}

/// (code, reason) of every answer without a reason that the gate can see, then every reason.
fn outcomes() -> Vec<(&'static str, &'static str)> {
    let mut out = vec![
        ("OK", "none"),
        ("UNAUTHENTICATED", "none"),
        ("PERMISSION_DENIED", "none"),
        ("UNIMPLEMENTED", "none"),
        ("DEADLINE_EXCEEDED", "none"),
    ];
    out.extend(
        crate::status::reasons()
            .iter()
            .map(|(reason, code)| (crate::gate::code_name(*code), reason.as_str())),
    );
    out
}

fn rpc_outcomes() -> Vec<Labels> {
    let outcomes = outcomes();
    crate::gate::METHODS
        .iter()
        .flat_map(|m| {
            outcomes.iter().map(move |(code, reason)| {
                vec![
                    ("method", (*m).to_owned()),
                    ("code", (*code).to_owned()),
                    ("reason", (*reason).to_owned()),
                ]
            })
        })
        .collect()
}

fn item_outcomes() -> Vec<Labels> {
    outcomes()
        .iter()
        .map(|(code, reason)| {
            vec![
                ("code", (*code).to_owned()),
                ("reason", (*reason).to_owned()),
            ]
        })
        .collect()
}

/// Counts one answered `HoldBatch` item (`boxoffice_hold_batch_items_total`).
pub fn hold_batch_item(r: &boxoffice_proto::v1::HoldBatchResult) {
    use boxoffice_proto::v1::hold_batch_result::Result as R;
    let (code, reason) = match &r.result {
        Some(R::Error(e)) => (
            crate::gate::code_name(tonic::Code::from(e.code)),
            crate::status::known_reason(&e.reason),
        ),
        _ => ("OK", "none"),
    };
    metrics::counter!("boxoffice_hold_batch_items_total", "code" => code, "reason" => reason)
        .increment(1);
}

fn rpc_ok() -> Vec<Labels> {
    crate::gate::METHODS
        .iter()
        .filter(|m| **m != "other") // an unknown method is never OK
        .map(|m| {
            vec![
                ("method", (*m).to_owned()),
                ("code", "OK".to_owned()),
                ("reason", "none".to_owned()),
            ]
        })
        .collect()
}

fn scope_gate() -> Vec<Labels> {
    one("scope", &["gate"])
}

fn scope_section() -> Vec<Labels> {
    one("scope", &["section"])
}

fn actor_kinds() -> Vec<Labels> {
    one("actor", &ACTOR_KINDS)
}

fn finding_kinds() -> Vec<Labels> {
    one("kind", &Finding::KINDS)
}

fn charge_outcomes() -> Vec<Labels> {
    one("outcome", &["captured", "declined"])
}

fn refund_causes() -> Vec<Labels> {
    one("cause", &["charge_without_sale"])
}

fn offer_outcomes() -> Vec<Labels> {
    one("outcome", &["made", "accepted", "lapsed"])
}

fn confirm_outcomes() -> Vec<Labels> {
    let mut outcomes = vec![
        "confirmed",
        "PAYMENT_TIMEOUT",
        "PAYMENT_UNAVAILABLE",
        "error",
    ];
    for r in Rejection::every() {
        if !outcomes.contains(&r.reason()) {
            outcomes.push(r.reason());
        }
    }
    one("outcome", &outcomes)
}

/// Registers a series at 0 (a counter at 0, a gauge at 0, a histogram without observations).
fn register(f: &Family, labels: &Labels) {
    let labels: Vec<metrics::Label> = labels
        .iter()
        .map(|(k, v)| metrics::Label::new(*k, v.clone()))
        .collect();
    match f.kind {
        Kind::Counter => drop(metrics::counter!(f.name, labels)),
        Kind::Gauge => drop(metrics::gauge!(f.name, labels)),
        Kind::Histogram => drop(metrics::histogram!(f.name, labels)),
    }
}

/// Describes every family (HELP and unit) and registers the series known up front.
fn describe_and_register() {
    metrics::with_recorder(|r| {
        for f in FAMILIES {
            let (name, help) = (KeyName::from(f.name), SharedString::from(f.help));
            match f.kind {
                Kind::Counter => r.describe_counter(name, f.unit, help),
                Kind::Gauge => r.describe_gauge(name, f.unit, help),
                Kind::Histogram => r.describe_histogram(name, f.unit, help),
            }
        }
    });
    for f in FAMILIES {
        match f.series {
            Series::One => register(f, &Vec::new()),
            Series::Sets(sets) => {
                for labels in sets() {
                    register(f, &labels);
                }
            }
            Series::PerSection | Series::PerEvent | Series::Cluster => {}
        }
    }
    for labels in build_info_labels() {
        let labels: Vec<metrics::Label> = labels
            .into_iter()
            .map(|(k, v)| metrics::Label::new(k, v))
            .collect();
        metrics::gauge!("boxoffice_build_info", labels).set(1.0);
    }
    process().describe();
}

/// Registers at 0 the series of an event's own families ([`Series::PerEvent`]); its sections'
/// series are registered by the engine when they start.
pub fn register_event(event_id: &str) {
    for f in FAMILIES {
        if matches!(f.series, Series::PerEvent) {
            register(f, &vec![("event", event_id.to_owned())]);
        }
    }
}

fn process() -> &'static metrics_process::Collector {
    static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();
    PROCESS.get_or_init(metrics_process::Collector::default)
}

/// Sets the gauges of the gate's calls in flight and its bound (at each scrape).
pub fn set_in_flight(in_flight: usize, limit: usize) {
    metrics::gauge!("boxoffice_rpc_in_flight").set(in_flight as f64);
    metrics::gauge!("boxoffice_rpc_in_flight_limit").set(limit as f64);
}

/// Every [`SAMPLE_EVERY`] until aborted: the data dir's size on disk and, once `engine` yields
/// one that is ready, the sweeper's backlog. The walk runs on a blocking thread; a backlog that
/// cannot be counted within one period (sections busy) keeps its last value.
pub fn spawn_sampler(
    data_dir: std::path::PathBuf,
    engine: impl Fn() -> Option<Engine> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let log = metrics::gauge!("boxoffice_store_log_bytes");
        let total = metrics::gauge!("boxoffice_store_data_dir_bytes");
        let backlog = metrics::gauge!("boxoffice_sweeper_backlog_holds");
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let dir = data_dir.clone();
            if let Ok(usage) =
                boxoffice_engine::rt::blocking(move || boxoffice_engine::store::disk_usage(&dir))
                    .await
            {
                log.set(usage.log as f64);
                total.set(usage.total as f64);
            }
            let Some(engine) = engine() else { continue };
            match tokio::time::timeout(SAMPLE_EVERY, engine.holds_past_deadline()).await {
                Ok(Ok(n)) => backlog.set(n as f64),
                Ok(Err(EngineError::NotReady)) if !engine.is_ready() => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "sweeper backlog not counted"),
                Err(_) => tracing::debug!("sweeper backlog not counted in time"),
            }
        }
    })
}

/// A cluster node's Raft figures, updated as soon as Raft's own metrics change (a new leader
/// shows at once) and at least every [`RAFT_SAMPLE_EVERY`], until aborted: whether it leads,
/// its term, log and applied indexes, each peer's lag (on the leader), and leader changes.
/// Every series is labelled with the group (`group="0"` to `N-1`).
pub fn spawn_raft_sampler(
    raft: boxoffice_engine::raft::Raft,
    warm: std::sync::Arc<boxoffice_engine::warm::Warm>,
    group: u32,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut watch = raft.metrics();
        let g = group.to_string();
        let changes =
            metrics::counter!("boxoffice_raft_leader_changes_total", "group" => g.clone());
        let mut last_leader = None;
        loop {
            let m = watch.borrow_and_update().clone();
            let leads = m.current_leader == Some(m.id);
            metrics::gauge!("boxoffice_raft_leader", "group" => g.clone()).set(if leads {
                1.0
            } else {
                0.0
            });
            metrics::gauge!("boxoffice_raft_leader_known", "group" => g.clone())
                .set(if m.current_leader.is_some() { 1.0 } else { 0.0 });
            metrics::gauge!("boxoffice_raft_term", "group" => g.clone()).set(m.current_term as f64);
            let last = m.last_log_index.unwrap_or(0);
            metrics::gauge!("boxoffice_raft_last_log_index", "group" => g.clone()).set(last as f64);
            metrics::gauge!("boxoffice_raft_applied_index", "group" => g.clone())
                .set(m.last_applied.map_or(0, |l| l.index) as f64);
            metrics::gauge!("boxoffice_raft_warm", "group" => g.clone()).set(if warm.is_warm() {
                1.0
            } else {
                0.0
            });
            for peer in m.membership_config.nodes().map(|(id, _)| *id) {
                if peer == m.id {
                    continue;
                }
                // Only the leader knows its followers' lag: 0 elsewhere (not a stale figure
                // from when this node last led).
                let lag = m.replication.as_ref().map_or(0, |peers| {
                    peers.get(&peer).map_or(last, |matched| {
                        last.saturating_sub(matched.map_or(0, |l| l.index))
                    })
                });
                metrics::gauge!("boxoffice_raft_commit_lag_entries", "group" => g.clone(), "peer" => peer.to_string())
                    .set(lag as f64);
            }
            if m.current_leader != last_leader {
                if last_leader.is_some() || m.current_leader.is_some() {
                    changes.increment(1);
                }
                last_leader = m.current_leader;
            }
            tokio::select! {
                changed = watch.changed() => if changed.is_err() { break },
                () = tokio::time::sleep(RAFT_SAMPLE_EVERY) => {}
            }
        }
    })
}

/// How often [`spawn_raft_sampler`] samples at least.
pub const RAFT_SAMPLE_EVERY: Duration = Duration::from_millis(500);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the recorder (once per process), describes every family and registers the series
/// known up front; returns its handle.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets(LATENCY_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Suffix("_records".into()), BATCH_BUCKETS)
                })
                .and_then(|b| b.install_recorder());
            let handle = match handle {
                Ok(h) => h,
                // Another recorder is installed (an embedding program's): render ours anyway,
                // empty, rather than fail.
                Err(e) => {
                    tracing::warn!(error = %e, "metrics recorder not installed");
                    PrometheusBuilder::new().build_recorder().handle()
                }
            };
            describe_and_register();
            handle
        })
        .clone()
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves; runs the recorder's upkeep.
/// Each scrape first reads the process metrics and calls `collect` (for gauges read at scrape
/// time).
pub async fn serve(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    collect: impl Fn() + Send + Sync + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let collect = std::sync::Arc::new(collect);
    let upkeep = {
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                handle.run_upkeep();
            }
        })
    };
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            process().collect();
            collect.as_ref()();
            async move { handle.render() }
        }),
    );
    let r = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    upkeep.abort();
    r
}

/// The address a listener is bound to, for logs.
pub fn describe(addr: SocketAddr) -> String {
    format!("http://{addr}/metrics")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family some crate of the server emits (a `counter!`, `gauge!` or `histogram!`
    /// naming a `boxoffice_` family in engine/, sweeper/, gateway/) is in [`FAMILIES`], once.
    #[test]
    fn every_family_emitted_is_listed_once() {
        fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).expect("a source dir").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    sources(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in ["engine/src", "sweeper/src", "gateway/src"] {
            sources(&root.join(dir), &mut files);
        }
        let mut emitted = std::collections::BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a source file");
            for mac in ["counter!(", "gauge!(", "histogram!("] {
                for (at, _) in text.match_indices(mac) {
                    let rest = text[at + mac.len()..].trim_start();
                    if let Some(name) = rest.strip_prefix("\"boxoffice_") {
                        let end = name.find('"').expect("a closing quote");
                        emitted.insert(format!("boxoffice_{}", &name[..end]));
                    }
                }
            }
        }
        assert!(emitted.len() > 30, "found {emitted:?}");
        let listed: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
        for name in &emitted {
            assert!(
                listed.contains(&name.as_str()),
                "{name} is emitted but not in FAMILIES"
            );
        }
        let mut unique = listed.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), listed.len(), "a family listed twice");
    }
}
