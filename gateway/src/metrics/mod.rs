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
use boxoffice_engine::{Engine, EngineError};
use metrics::{KeyName, SharedString};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

mod families;
pub mod pprof;

use families::build_info_labels;
pub use families::{FAMILIES, Family, Kind, Labels, Series, hold_batch_item};

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
            Series::PerSection | Series::PerEvent | Series::PerEventSale | Series::Cluster => {}
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

/// The reasons of `boxoffice_cluster_forward_failures_total`: the leader could not be reached,
/// or did not answer a forwarded call in time.
pub const FORWARD_FAILURES: [&str; 2] = ["unreachable", "timeout"];

/// Registers a cluster node's own series ([`Series::Cluster`] families that the Raft sampler
/// does not set): each of its `groups`' repairs, the forwarded calls by method and their
/// failures by reason at 0, and each peer's link up (1: as the node's watch starts, see `node::links`), so that they
/// are exported from the node's start.
pub fn register_cluster(node_id: u64, peers: impl Iterator<Item = u64>, groups: u32) {
    for g in 0..groups.max(1) {
        drop(metrics::counter!("boxoffice_raft_repairs_total", "group" => g.to_string()));
    }
    for method in crate::gate::METHODS {
        drop(metrics::counter!("boxoffice_cluster_forwarded_total", "method" => *method));
    }
    for reason in FORWARD_FAILURES {
        drop(metrics::counter!("boxoffice_cluster_forward_failures_total", "reason" => reason));
    }
    for outcome in crate::node::reads::OUTCOMES {
        drop(metrics::counter!("boxoffice_cluster_fenced_answers_total", "outcome" => outcome));
    }
    for peer in peers.filter(|p| *p != node_id) {
        metrics::gauge!("boxoffice_cluster_peer_up", "peer" => peer.to_string()).set(1.0);
    }
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
/// time). With `profiles`, also `GET /debug/pprof/profile` ([`pprof`]) for its admin keys.
pub async fn serve(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    profiles: Option<std::sync::Arc<crate::gate::Gate>>,
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
    let mut app = Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            process().collect();
            collect.as_ref()();
            async move { handle.render() }
        }),
    );
    if let Some(gate) = profiles {
        app = app.route("/debug/pprof/profile", get(pprof::profile).with_state(gate));
    }
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
