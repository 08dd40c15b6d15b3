//! [`FAMILIES`]: the one list of every family the server exports (besides the `process_*`
//! families of `metrics-process`), with its type, unit, HELP text and the series that exist from
//! the start; and the bounded label values those series are made of.

use boxoffice_engine::{ACTOR_KINDS, Finding, Rejection};
use metrics::Unit;

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
    /// One set per event (label `event`, and what the family adds), set by the engine when
    /// the event is created or recovered and whenever its sale changes.
    PerEventSale,
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
        "boxoffice_changes_readers",
        Gauge,
        COUNT,
        "Readers of the change stream (WatchChanges, GET /v1/changes) this server is sending to now.",
        Series::One,
    ),
    family(
        "boxoffice_changes_sent_total",
        Counter,
        COUNT,
        "Changes of the change stream sent to readers (a change sent to two readers counts twice).",
        Series::One,
    ),
    family(
        "boxoffice_sale_state",
        Gauge,
        None,
        "An event's sale state as an operator set it (UpdateSale): 1 for the state it is in (label state: OPEN, PAUSED, QUEUE_ALL, ENDED), 0 for the others.",
        Series::PerEventSale,
    ),
    family(
        "boxoffice_sale_admit_rate_per_second",
        Gauge,
        None,
        "The admission rate an event's waiting room is set to (as created, or as UpdateSale last set it).",
        Series::PerEventSale,
    ),
    family(
        "boxoffice_sale_hold_ttl_seconds",
        Gauge,
        SECONDS,
        "The TTL of an event's new holds (as created, or as UpdateSale last set it).",
        Series::PerEventSale,
    ),
    family(
        "boxoffice_sale_per_user_limit",
        Gauge,
        COUNT,
        "Most places one user may hold or own for an event (as created, or as UpdateSale last set it).",
        Series::PerEventSale,
    ),
    family(
        "boxoffice_sale_state_changed_at_seconds",
        Gauge,
        SECONDS,
        "When an event's sale state last changed (its creation until it did), Unix seconds.",
        Series::PerEventSale,
    ),
    family(
        "boxoffice_sale_admit_rate_changed_at_seconds",
        Gauge,
        SECONDS,
        "When an event's admission rate last changed (its creation until it did), Unix seconds.",
        Series::PerEventSale,
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
        "boxoffice_access_code_uses",
        Gauge,
        COUNT,
        "Places held or sold under an event's presale access codes now (each code's own count: GetEvent).",
        Series::PerEvent,
    ),
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
        "boxoffice_tickets_cancelled_total",
        Counter,
        COUNT,
        "Tickets given back by their buyers (CancelTickets).",
        Series::One,
    ),
    family(
        "boxoffice_tickets_transferred_total",
        Counter,
        COUNT,
        "Tickets moved by their buyers to other fans (TransferTickets).",
        Series::One,
    ),
    family(
        "boxoffice_refunds_total",
        Counter,
        COUNT,
        "Refunds the server made, by cause: a captured charge whose hold ended without an order, or tickets given back.",
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
        "boxoffice_tls_handshakes_refused_total",
        Counter,
        COUNT,
        "TLS handshakes refused, by port (gRPC, HTTP, peer): no client certificate, one its CA \
         did not sign or that has expired, a handshake that did not finish in time, or no TLS.",
        Series::Sets(tls_ports),
    ),
    family(
        "boxoffice_raft_repairs_total",
        Counter,
        COUNT,
        "Times this node found its store of a group damaged at its start, moved it aside and \
         rejoined the group empty (by group).",
        Series::Cluster,
    ),
    family(
        "boxoffice_cluster_forwarded_total",
        Counter,
        COUNT,
        "Calls this node forwarded to the leader of their group, by method.",
        Series::Cluster,
    ),
    family(
        "boxoffice_cluster_forward_failures_total",
        Counter,
        COUNT,
        "Forwarded calls the leader did not answer (the caller got NOT_READY), by reason: unreachable or timeout.",
        Series::Cluster,
    ),
    family(
        "boxoffice_cluster_fenced_answers_total",
        Counter,
        COUNT,
        "On a group's leader: reads and refusals held until the node was known to have led after they were made, by outcome: confirmed (answered) or refused (NOT_READY: its leadership could not be confirmed).",
        Series::Cluster,
    ),
    family(
        "boxoffice_cluster_peer_up",
        Gauge,
        None,
        "By peer: 1 from the start and while this node's calls to it are answered, 0 once they failed for 2 s with no answer (the log says so once, then a summary a minute). A node that does not call a peer (a follower, for another follower) keeps 1.",
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

fn tls_ports() -> Vec<Labels> {
    one("port", &crate::tls::PORTS)
}

fn one(label: &'static str, values: &[&str]) -> Vec<Labels> {
    values
        .iter()
        .map(|v| vec![(label, (*v).to_owned())])
        .collect()
}

pub(crate) fn build_info_labels() -> Vec<Labels> {
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
    one("cause", &["charge_without_sale", "tickets_cancelled"])
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
