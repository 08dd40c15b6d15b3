//! The `boxoffice` server: gRPC services behind the gate, health and reflection on the same
//! port, the metrics endpoint on its own port, the sweeper, and an orderly drain.
//!
//! Start-up order: bind both ports, serve health (`NOT_SERVING`) at once, replay the log (the
//! booking services answer `UNAVAILABLE` / `NOT_READY` meanwhile), start the sweeper, then flip
//! health to `SERVING`. Drain: health `NOT_SERVING`, new calls `UNAVAILABLE`, wait for calls in
//! flight (up to the grace period), stop the listener, stop the sweeper, flush and close the log.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use boxoffice_engine::{Clock, Durability, Engine, EngineConfig, RecoveryMode, SystemClock};
use boxoffice_proto::v1 as pb;
use tokio::sync::{Notify, oneshot};
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::gate::{Gate, GateLayer, Keys, Scope};
use crate::net::Listener;
use crate::seat_maps::SeatMaps;
use crate::services::{Api, BookingSvc, EventRoutes, Groups, Ready, WaitingRoomSvc, WaitlistSvc};
use crate::tokens::TokenSigner;

/// Largest request message decoded (see [`crate::limits`]).
pub use crate::limits::MESSAGE_BYTES_MAX;

/// Everything `serve` needs.
#[derive(Clone)]
pub struct ServerConfig {
    /// gRPC address.
    pub listen: SocketAddr,
    /// Metrics address (`None`: no metrics endpoint).
    pub metrics_listen: Option<SocketAddr>,
    /// HTTP/JSON API address (`None`, the default: no HTTP API; see [`crate::http`]).
    pub http_listen: Option<SocketAddr>,
    /// More routes on the HTTP port (the demo's page and race), beside the API and `/ops`.
    pub http_routes: Option<axum::Router>,
    /// Data dir of the log.
    pub data_dir: PathBuf,
    /// Keys with admin scope.
    pub admin_keys: Vec<String>,
    /// Keys with client scope.
    pub client_keys: Vec<String>,
    /// HMAC secret of queue and admission tokens.
    pub token_secret: Vec<u8>,
    /// Log durability.
    pub durability: Durability,
    /// Calls in flight at the gate before shedding.
    pub in_flight_max: usize,
    /// Messages queued per section actor before shedding.
    pub section_inflight_max: usize,
    /// Fans per waiting room.
    pub queue_max: u32,
    /// How long a join challenge (the proof of work before `Join`) stays valid.
    pub join_challenge_ttl: Duration,
    /// How long a drain waits for calls in flight.
    pub grace: Duration,
    /// How long idempotency answers are replayed and ended holds remembered (1 s to 30 days).
    pub idempotency_window: Duration,
    /// Wall clock.
    pub clock: Arc<dyn Clock>,
    /// Tests only: recovery waits until this is notified (to observe `NOT_SERVING`).
    pub recovery_gate: Option<Arc<Notify>>,
    /// How often the reconciliation runs in the server (`None`: never). Each pass also refunds
    /// captured charges left without a sale for at least `refund_grace`.
    pub reconcile_every: Option<Duration>,
    /// How long a captured charge stays without a sale before a reconciliation pass refunds it.
    pub refund_grace: Duration,
    /// The log in this engine config's sink instead of the data dir (tests and simulations:
    /// `EngineConfig::with_sink(MemorySink::new())`). `None`: sled in `data_dir`.
    pub engine: Option<EngineConfig>,
    /// Start with a new ticket signing key although tickets were sold and the key is missing
    /// (the tickets already sold verify only if their public key is kept in the data dir's key
    /// ring). Without it such a start is refused.
    pub new_ticket_key: bool,
    /// What recovery does with a damaged log (`Strict`: refuse to start).
    pub recovery_mode: RecoveryMode,
    /// Largest `GetSeatMap` response, bytes (kept within
    /// [`SEAT_MAP_BYTES_MIN`](crate::limits::SEAT_MAP_BYTES_MIN) to
    /// [`SEAT_MAP_BYTES_MAX`](crate::limits::SEAT_MAP_BYTES_MAX)).
    pub seat_map_max_bytes: usize,
    /// How long a section's seat map is still answered after it was last known true.
    pub seat_map_staleness: Duration,
    /// A cluster node's part (`None`: a single node, the default).
    pub cluster: Option<ClusterConfig>,
    /// The network the server listens on and reaches its peers over: the OS's (`None`, the
    /// default) or a deterministic simulation's ([`crate::net`]).
    pub network: crate::net::Net,
}

/// A cluster node's part of [`ServerConfig`] (issue 13): the node serves the Raft service
/// between nodes on its gRPC address, runs the engine while it leads its group, and forwards
/// public calls to the leader otherwise.
#[derive(Clone)]
pub struct ClusterConfig {
    /// This node's id (a key of `peers`).
    pub node_id: u64,
    /// Every node's gRPC address (`host:port`), this one's among them.
    pub peers: std::collections::BTreeMap<u64, String>,
    /// The secret every node of the cluster shares.
    pub secret: crate::cluster::ClusterSecret,
    /// Raft entries between snapshots (the log before a snapshot is purged).
    pub snapshot_every: u64,
    /// Raft groups (`--groups`, at least 1): an event belongs to group
    /// [`crate::forward::group_of_event`] of its id; group `g`'s first leader is the `g`-th
    /// node (by id, round robin), so leaders are spread over the nodes. The same on every node.
    pub groups: u32,
    /// Each group's store instead of a sled database under the data dir (index: the group; a
    /// deterministic simulation's disks). `None`: sled, the default.
    pub stores: Option<Vec<Arc<dyn boxoffice_engine::store::Kv>>>,
    /// Raft entries kept in the log behind a snapshot
    /// ([`boxoffice_engine::raft::SNAPSHOT_KEEP_DEFAULT`] unless a simulation keeps fewer).
    pub snapshot_keep: u64,
}

/// The file of a cluster node's data dir that records its `--groups`.
pub const GROUPS_FILE: &str = "cluster-groups";

/// Refuses a cluster node's start with another `--groups` than its data dir was made with (an
/// event's group is its id's hash modulo the count: another count would lose events); records
/// the count on the first start. A data dir from before the count was recorded, with a log at
/// its top, was made with one group.
fn check_groups(data_dir: &std::path::Path, groups: u32) -> anyhow::Result<()> {
    let path = data_dir.join(GROUPS_FILE);
    let had = match std::fs::read_to_string(&path) {
        Ok(text) => Some(
            text.trim()
                .parse::<u32>()
                .with_context(|| format!("{} does not hold a group count", path.display()))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            data_dir.join("db").exists().then_some(1)
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if let Some(had) = had
        && had != groups
    {
        anyhow::bail!(
            "{} was made with --groups {had}: a cluster's group count cannot change (an event's \
             group is its id's hash modulo the count); start with --groups {had}",
            data_dir.display()
        );
    }
    if !path.exists() {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating {}", data_dir.display()))?;
        let tmp = data_dir.join(format!("{GROUPS_FILE}.tmp"));
        std::fs::write(&tmp, format!("{groups}\n"))?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(data_dir)?.sync_all()?;
    }
    Ok(())
}

/// Where group `g` of a cluster node keeps its log: the data dir itself for group 0 (a
/// one-group node's layout), `group-{g}/` inside it for the others.
pub fn group_dir(data_dir: &std::path::Path, g: u32) -> PathBuf {
    if g == 0 {
        data_dir.to_owned()
    } else {
        data_dir.join(format!("group-{g}"))
    }
}

impl ServerConfig {
    /// Defaults around the given keys and secret: loopback ports, `./boxoffice-data`, `Sync`.
    pub fn new(admin_key: &str, client_key: &str, token_secret: &[u8]) -> ServerConfig {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
            http_listen: None,
            http_routes: None,
            data_dir: PathBuf::from("boxoffice-data"),
            admin_keys: vec![admin_key.to_owned()],
            client_keys: vec![client_key.to_owned()],
            token_secret: token_secret.to_vec(),
            durability: Durability::Sync,
            in_flight_max: crate::limits::IN_FLIGHT_MAX_DEFAULT,
            section_inflight_max: 10_000,
            queue_max: crate::limits::QUEUE_MAX_DEFAULT,
            join_challenge_ttl: Duration::from_millis(crate::limits::JOIN_CHALLENGE_TTL_MS_DEFAULT),
            grace: Duration::from_secs(10),
            idempotency_window: Duration::from_millis(
                boxoffice_engine::limits::IDEMPOTENCY_WINDOW_MS_DEFAULT,
            ),
            clock: Arc::new(SystemClock),
            recovery_gate: None,
            reconcile_every: Some(Duration::from_secs(60)),
            refund_grace: Duration::from_secs(crate::limits::REFUND_GRACE_SECONDS_DEFAULT),
            engine: None,
            new_ticket_key: false,
            recovery_mode: RecoveryMode::Strict,
            seat_map_max_bytes: crate::limits::SEAT_MAP_BYTES_DEFAULT,
            seat_map_staleness: Duration::from_millis(crate::limits::SEAT_MAP_STALENESS_MS_DEFAULT),
            cluster: None,
            network: None,
        }
    }
}

/// A running server.
pub struct Running {
    /// The gRPC address it listens on.
    pub addr: SocketAddr,
    /// The metrics address, if any.
    pub metrics_addr: Option<SocketAddr>,
    /// The HTTP API's address, if any.
    pub http_addr: Option<SocketAddr>,
    ready: Ready,
    recovered: Option<oneshot::Receiver<anyhow::Result<()>>>,
    gate: Arc<Gate>,
    health: HealthReporter,
    grace: Duration,
    stop_grpc: Option<oneshot::Sender<()>>,
    stop_metrics: Option<oneshot::Sender<()>>,
    stop_http: Option<oneshot::Sender<()>>,
    grpc_task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    background: Vec<tokio::task::JoinHandle<()>>,
    sweeper: SweeperSlot,
    /// Tasks started by recovery (the periodic reconciliation), stopped on shutdown.
    tasks: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    /// A cluster node's Raft and its leadership loop (its stop signal and task).
    node: Option<Node>,
}

/// The sweeper of the engine being served, if any.
type SweeperSlot = Arc<std::sync::Mutex<Option<ractor::ActorRef<boxoffice_sweeper::SweeperMsg>>>>;

/// A cluster node's running parts.
struct Node {
    /// Each group's Raft (index: the group).
    rafts: Vec<boxoffice_engine::raft::Raft>,
    /// Each group's vote guard (index: the group).
    guards: Vec<boxoffice_engine::raft::VoteGuard>,
    stop: tokio::sync::watch::Sender<bool>,
    /// Each group's leadership loop.
    leads: Vec<tokio::task::JoinHandle<()>>,
    /// Why the node left its group on its own (its Raft stopped on an error, or it could not
    /// serve as leader): set once, by the leadership loop.
    failed: tokio::sync::watch::Receiver<Option<String>>,
}

const SERVICES: &[&str] = &[
    "",
    "boxoffice.v1.EventService",
    "boxoffice.v1.WaitingRoomService",
    "boxoffice.v1.BookingService",
    "boxoffice.v1.WaitlistService",
];

/// A cluster node's health over its groups. A group is fine while it is served here (this node
/// leads it, its engine open) or has a leader known to forward to. `SERVING` once every group
/// has been fine at once (the start), then while any group is: an election in one group makes
/// its calls answer `NOT_READY` for a moment, but must not take the node out of a load
/// balancer that sends it the other groups' calls. (One group: `NOT_SERVING` during its
/// elections, as before.)
struct GroupHealth {
    health: HealthReporter,
    ok: tokio::sync::Mutex<GroupStates>,
}

struct GroupStates {
    fine: Vec<bool>,
    /// Every group has been fine at once.
    started: bool,
    /// What health says now.
    serving: Option<bool>,
}

impl GroupHealth {
    fn new(health: HealthReporter, groups: usize) -> GroupHealth {
        GroupHealth {
            health,
            ok: tokio::sync::Mutex::new(GroupStates {
                fine: vec![false; groups],
                started: false,
                serving: None,
            }),
        }
    }

    /// Group `g` is served (`true`) or not; health follows all of them.
    async fn set(&self, g: u32, ok: bool) {
        let mut state = self.ok.lock().await;
        if let Some(slot) = state.fine.get_mut(g as usize) {
            *slot = ok;
        }
        state.started |= state.fine.iter().all(|o| *o);
        let serving = state.started && state.fine.iter().any(|o| *o);
        if state.serving != Some(serving) {
            state.serving = Some(serving);
            set_health(
                &self.health,
                if serving {
                    ServingStatus::Serving
                } else {
                    ServingStatus::NotServing
                },
            )
            .await;
        }
    }
}

async fn set_health(health: &HealthReporter, status: ServingStatus) {
    for s in SERVICES {
        health.set_service_status(*s, status).await;
    }
}

/// The gRPC services behind the gate, ready to serve.
type GrpcRouter = tonic::transport::server::Router<
    tower::layer::util::Stack<
        crate::forward::ForwardLayer,
        tower::layer::util::Stack<GateLayer, tower::layer::util::Identity>,
    >,
>;

/// The Raft service a cluster node serves to its peers, behind the cluster secret.
type RaftService = tonic::service::interceptor::InterceptedService<
    boxoffice_proto::cluster::raft_server::RaftServer<crate::cluster::RaftEndpoint>,
    crate::cluster::SecretCheck,
>;

/// The metrics endpoint: its bound address, its stop signal, its task.
type MetricsServing = (
    std::net::SocketAddr,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
);

/// The API keys of `config`, each with its scope.
fn keys_of(config: &ServerConfig) -> anyhow::Result<Keys> {
    let mut keys = Keys::default();
    for k in &config.admin_keys {
        keys.add(k, Scope::Admin).context("--admin-key")?;
    }
    for k in &config.client_keys {
        keys.add(k, Scope::Client).context("--client-key")?;
    }
    Ok(keys)
}

/// Every service behind the gate: health, reflection and the four `boxoffice.v1` services
/// (which answer `NOT_READY` until `ready` is set).
fn grpc_router(
    gate: &Arc<Gate>,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    ready: &Groups,
    seat_map_max_bytes: usize,
    cluster: Option<(RaftService, Arc<crate::forward::Forwarder>)>,
) -> anyhow::Result<GrpcRouter> {
    let (raft_service, forwarder) = match cluster {
        Some((s, f)) => (Some(s), Some(f)),
        None => (None, None),
    };
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(boxoffice_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    // The same descriptors over the older v1alpha protocol (grpcurl and most reflection
    // clients ask for v1 first and fall back; some, like Python's, speak only v1alpha).
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(boxoffice_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("building the v1alpha reflection service")?;
    let gzip = tonic::codec::CompressionEncoding::Gzip;
    let max = MESSAGE_BYTES_MAX;
    Ok(tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .http2_max_pending_accept_reset_streams(Some(64))
        .max_concurrent_streams(Some(crate::limits::STREAMS_PER_CONNECTION_MAX))
        .layer(GateLayer::new(gate.clone()))
        .layer(crate::forward::ForwardLayer::new(forwarder))
        .add_service(health_service)
        .add_optional_service(raft_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(EventRoutes::new(
            ready.clone(),
            max,
            // A seat map at the limit, and the few bytes of framing a bound may miss.
            seat_map_max_bytes + 1_024,
        ))
        .add_service(
            pb::waiting_room_service_server::WaitingRoomServiceServer::new(WaitingRoomSvc(
                ready.clone(),
            ))
            .max_decoding_message_size(max)
            .accept_compressed(gzip)
            .send_compressed(gzip),
        )
        .add_service(
            pb::booking_service_server::BookingServiceServer::new(BookingSvc(ready.clone()))
                .max_decoding_message_size(max)
                .accept_compressed(gzip)
                .send_compressed(gzip),
        )
        .add_service(
            pb::waitlist_service_server::WaitlistServiceServer::new(WaitlistSvc(ready.clone()))
                .max_decoding_message_size(max)
                .accept_compressed(gzip)
                .send_compressed(gzip),
        ))
}

/// Binds and serves the HTTP API on `addr`, calling the gRPC server at `grpc`; returns the
/// bound address, the stop signal, the task.
async fn serve_http(
    addr: SocketAddr,
    grpc: SocketAddr,
    extra: Option<axum::Router>,
) -> anyhow::Result<MetricsServing> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the HTTP address {addr}"))?;
    let haddr = l.local_addr()?;
    // `/ops` reads this process's metrics: the recorder must be there before the engine's
    // series are made (also without a metrics port).
    crate::metrics::install();
    let app = crate::http::router(crate::http::Backend::new(grpc)?, extra);
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = rx.await;
        };
        if let Err(e) = crate::http::serve(l, app, shutdown).await {
            tracing::error!(error = %e, "HTTP API failed");
        }
    });
    Ok((haddr, tx, task))
}

/// Binds and serves `/metrics` on `addr` (reading the gate's calls in flight at each scrape);
/// returns the bound address, the stop signal, the task.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    gate: Arc<Gate>,
) -> anyhow::Result<MetricsServing> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics address {addr}"))?;
    let maddr = l.local_addr()?;
    let handle = crate::metrics::install();
    crate::metrics::set_in_flight(gate.in_flight(), gate.in_flight_max());
    let collect = move || crate::metrics::set_in_flight(gate.in_flight(), gate.in_flight_max());
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = rx.await;
        };
        if let Err(e) = crate::metrics::serve(l, handle, collect, shutdown).await {
            tracing::error!(error = %e, "metrics endpoint failed");
        }
    });
    Ok((maddr, tx, task))
}

/// Binds, starts serving health at once, and recovers in the background. Use
/// [`Running::wait_ready`] to wait for recovery. A cluster node ([`ServerConfig::cluster`])
/// starts its Raft instead, and runs the engine while it leads (see [`lead`]).
pub async fn start(config: ServerConfig) -> anyhow::Result<Running> {
    let listener = Listener::bind(&config.network, config.listen)
        .await
        .with_context(|| format!("binding the gRPC address {}", config.listen))?;
    let addr = listener.local_addr()?;
    let gate = Arc::new(Gate::new(keys_of(&config)?, config.in_flight_max));
    let (health, _) = tonic_health::server::health_reporter();
    let health_service = crate::health::service(&health, gate.draining_signal());
    set_health(&health, ServingStatus::NotServing).await;
    let n_groups = config.cluster.as_ref().map_or(1, |c| c.groups.max(1));
    let readies: Vec<Ready> = (0..n_groups).map(|_| Ready::default()).collect();
    let groups = Groups::new(readies.clone());
    let ready = readies[0].clone();
    let seat_map_max_bytes = config.seat_map_max_bytes.clamp(
        crate::limits::SEAT_MAP_BYTES_MIN,
        crate::limits::SEAT_MAP_BYTES_MAX,
    );
    let rafts = match &config.cluster {
        Some(c) => {
            check_groups(&config.data_dir, n_groups)?;
            let mut rafts = Vec::new();
            for g in 0..n_groups {
                rafts.push(open_raft(c, &config.data_dir, g, &config.network).await?);
            }
            Some(rafts)
        }
        None => None,
    };
    let cluster = match (&config.cluster, &rafts) {
        (Some(c), Some(rafts)) => Some((
            crate::cluster::raft_service(
                rafts
                    .iter()
                    .map(|(raft, _, guard)| (raft.clone(), guard.clone()))
                    .collect(),
                c.secret.clone(),
            ),
            Arc::new(crate::forward::Forwarder::new(
                c.node_id,
                rafts.iter().map(|(raft, _, _)| raft.clone()).collect(),
                c.peers.clone(),
                c.secret.clone(),
                groups.clone(),
                config.network.clone(),
            )),
        )),
        _ => None,
    };
    let router = grpc_router(&gate, health_service, &groups, seat_map_max_bytes, cluster)?;
    let (stop_grpc, stop_rx) = oneshot::channel::<()>();
    let stopped = async move {
        let _ = stop_rx.await;
    };
    let grpc_task = match listener {
        Listener::Tcp(l) => {
            let incoming = TcpIncoming::from(l).with_nodelay(Some(true));
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
        }
        Listener::Other(_, incoming) => {
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
        }
    };

    let mut background = Vec::new();
    let (http_addr, stop_http) = match config.http_listen {
        Some(h) => {
            let (addr, stop, task) = serve_http(h, addr, config.http_routes.clone()).await?;
            background.push(task);
            (Some(addr), Some(stop))
        }
        None => (None, None),
    };
    let (metrics_addr, stop_metrics) = match config.metrics_listen {
        Some(m) => {
            let (addr, stop, task) = serve_metrics(m, gate.clone()).await?;
            background.push(task);
            let ready = ready.clone();
            background.push(crate::metrics::spawn_sampler(
                config.data_dir.clone(),
                move || ready.get().map(|api| api.engine.clone()),
            ));
            (Some(addr), Some(stop))
        }
        None => (None, None),
    };

    let sweeper: SweeperSlot = Arc::default();
    let (recovered_tx, recovered_rx) = oneshot::channel();
    let tasks = Arc::new(std::sync::Mutex::new(Vec::new()));
    let node = match rafts {
        Some(rafts) => {
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let (failed_tx, failed) = tokio::sync::watch::channel(None);
            let failed_tx = Arc::new(failed_tx);
            let group_health = Arc::new(GroupHealth::new(health.clone(), rafts.len()));
            let mut leads = Vec::new();
            let mut serving = Vec::new();
            for (g, (raft, sm, _)) in rafts.iter().enumerate() {
                let group = u32::try_from(g).unwrap_or(u32::MAX);
                background.push(crate::metrics::spawn_raft_sampler(
                    raft.clone(),
                    sm.warm(),
                    group,
                ));
                let leading = Leading {
                    raft: raft.clone(),
                    sm: sm.clone(),
                    group,
                    config: config.clone(),
                    ready: readies[g].clone(),
                    health: group_health.clone(),
                    // The sweeper of group 0 (the one `Running::sweeper` shows).
                    sweeper: if g == 0 {
                        sweeper.clone()
                    } else {
                        SweeperSlot::default()
                    },
                };
                let (ready_tx, ready_rx) = oneshot::channel();
                serving.push(ready_rx);
                leads.push(tokio::spawn(lead(
                    leading,
                    stopped.clone(),
                    ready_tx,
                    failed_tx.clone(),
                )));
            }
            // Ready once every group serves here or is known to be served elsewhere.
            background.push(tokio::spawn(async move {
                let mut result = Ok(());
                for rx in serving {
                    match rx.await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            result = Err(e);
                            break;
                        }
                        Err(_) => {
                            result = Err(anyhow::anyhow!("the node stopped before it served"));
                            break;
                        }
                    }
                }
                let _ = recovered_tx.send(result);
            }));
            Some(Node {
                guards: rafts.iter().map(|(_, _, guard)| guard.clone()).collect(),
                rafts: rafts.into_iter().map(|(raft, _, _)| raft).collect(),
                stop,
                leads,
                failed,
            })
        }
        None => {
            // Recovery in the background: health says NOT_SERVING until it is done.
            let (ready, health, sweeper) = (ready.clone(), health.clone(), sweeper.clone());
            let (config, tasks) = (config.clone(), tasks.clone());
            background.push(tokio::spawn(async move {
                let r = recover(config, ready, health, sweeper, tasks).await;
                if let Err(e) = &r {
                    tracing::error!(error = %format!("{e:#}"), "recovery failed");
                }
                let _ = recovered_tx.send(r);
            }));
            None
        }
    };
    Ok(Running {
        addr,
        metrics_addr,
        http_addr,
        ready,
        recovered: Some(recovered_rx),
        gate,
        health,
        grace: config.grace,
        stop_grpc: Some(stop_grpc),
        stop_metrics,
        stop_http,
        grpc_task,
        background,
        sweeper,
        tasks,
        node,
    })
}

/// The engine config of `config` (its own, or sled in the data dir), with the server's
/// settings.
fn engine_config(config: &ServerConfig) -> EngineConfig {
    let mut ec = config
        .engine
        .clone()
        .unwrap_or_else(|| EngineConfig::new(&config.data_dir));
    ec.durability = config.durability;
    ec.clock = config.clock.clone();
    ec.section_inflight_max = config.section_inflight_max;
    ec.recovery_mode = config.recovery_mode;
    ec.idempotency_window = config.idempotency_window;
    ec
}

/// What a server runs while it serves an engine: the services' state, the sweeper, the
/// periodic tasks.
struct Stack {
    api: Arc<Api>,
    sweeper: ractor::ActorRef<boxoffice_sweeper::SweeperMsg>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// A cluster node's: the term of the leadership it serves (0 on a single node).
    term: u64,
}

impl Stack {
    /// Stops the tasks, the sweeper and the engine (its log flushed). Returns why the engine
    /// had stopped, if it had.
    async fn stop(self) -> Option<String> {
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        let _ = self
            .sweeper
            .stop_and_wait(None, Some(Duration::from_secs(5)))
            .await;
        self.api.stop();
        let stopped = self.api.engine.stopped();
        self.api.engine.shutdown().await;
        stopped
    }
}

/// Opens the engine of `ec` (replaying its log) and starts what serves it.
async fn open_stack(config: &ServerConfig, ec: EngineConfig) -> anyhow::Result<Stack> {
    let engine = Engine::open(ec)
        .await
        .with_context(|| format!("recovering from {}", config.data_dir.display()))?;
    let tickets = match ticket_signer(config, &engine).await {
        Ok(t) => t,
        Err(e) => {
            // Refused to start: stop the engine, so the data dir is free for the next try.
            engine.shutdown().await;
            return Err(e);
        }
    };
    // The series of every recovered event, at 0 before its first call.
    for e in engine.events().unwrap_or_default() {
        crate::metrics::register_event(e.event_id.as_str());
    }
    let api = Arc::new(Api::new(
        engine.clone(),
        TokenSigner::new(&config.token_secret),
        tickets,
        config.clock.clone(),
        config.queue_max,
        SeatMaps::new(
            config.seat_map_max_bytes,
            u64::try_from(config.seat_map_staleness.as_millis()).unwrap_or(u64::MAX),
        ),
        u64::try_from(config.join_challenge_ttl.as_millis()).unwrap_or(u64::MAX),
    ));
    let mut tasks = Vec::new();
    if let Some(every) = config.reconcile_every {
        // The periodic reconciliation: findings become a metric and a log line each; charges
        // left without a sale are refunded once their grace has passed.
        let engine = engine.clone();
        let grace = config.refund_grace;
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                match engine.settle_and_reconcile(grace).await {
                    Ok((f, _)) if f.is_empty() => tracing::debug!("reconciliation clean"),
                    Ok((f, _)) => {
                        tracing::error!(findings = f.len(), "reconciliation found problems")
                    }
                    Err(boxoffice_engine::EngineError::NotReady) => break,
                    Err(e) => tracing::warn!(error = %e, "reconciliation could not run"),
                }
            }
        }));
    }
    let (sweeper, sweeper_done) =
        match boxoffice_sweeper::start(engine.clone(), boxoffice_sweeper::SweeperConfig::default())
            .await
        {
            Ok(s) => s,
            Err(e) => {
                for t in tasks {
                    t.abort();
                }
                api.stop();
                engine.shutdown().await;
                return Err(e).context("starting the sweeper");
            }
        };
    // Without the sweeper no hold would expire and no waitlist offer be made. A stop aborts
    // this watch before it stops the sweeper.
    tasks.push(engine.stop_when_ended("the sweeper (holds would no longer expire)", sweeper_done));
    Ok(Stack {
        api,
        sweeper,
        tasks,
        term: 0,
    })
}

async fn recover(
    config: ServerConfig,
    ready: Ready,
    health: HealthReporter,
    sweeper: SweeperSlot,
    tasks: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
) -> anyhow::Result<()> {
    if let Some(gate) = &config.recovery_gate {
        gate.notified().await;
    }
    let stack = open_stack(&config, engine_config(&config)).await?;
    let engine = stack.api.engine.clone();
    if let Ok(mut s) = sweeper.lock() {
        *s = Some(stack.sweeper);
    }
    if let Ok(mut t) = tasks.lock() {
        t.extend(stack.tasks);
    }
    ready.set(stack.api);
    set_health(&health, ServingStatus::Serving).await;
    follow_engine_stop(&engine, health, &tasks);
    Ok(())
}

/// Opens a cluster node's sled database for `group` ([`group_dir`]), its Raft log and state
/// machine, and its Raft; the group's first node (round robin by id: group 0 the lowest) forms
/// it on the very first start of every node ([`form_group`]).
async fn open_raft(
    cluster: &ClusterConfig,
    data_dir: &std::path::Path,
    group: u32,
    net: &crate::net::Net,
) -> anyhow::Result<(
    boxoffice_engine::raft::Raft,
    boxoffice_engine::raft::StateMachine,
    boxoffice_engine::raft::VoteGuard,
)> {
    use boxoffice_engine::raft;
    anyhow::ensure!(
        cluster.peers.contains_key(&cluster.node_id),
        "--node-id {} is not one of --peers ({:?})",
        cluster.node_id,
        cluster.peers.keys().collect::<Vec<_>>()
    );
    let dir = group_dir(data_dir, group);
    let shown = dir.clone();
    // The node's groups share one page cache budget (sled's 1 GiB), at least 64 MiB each.
    let cache = (boxoffice_engine::store::SLED_CACHE_BYTES / u64::from(cluster.groups.max(1)))
        .max(64 << 20);
    let store = cluster
        .stores
        .as_ref()
        .and_then(|s| s.get(group as usize).cloned());
    let db = match store {
        Some(store) => raft::NodeDb::new(store),
        None => boxoffice_engine::rt::blocking(move || raft::open_node_db_cached(&dir, cache))
            .await
            .map_err(anyhow::Error::msg)?
            .with_context(|| format!("opening {}", shown.display()))?,
    };
    // What the last run wrote but never synced is made durable before anything is read, so
    // this start never acts on a vote or entries that a power cut could take back.
    let (sm, log, guard) = raft::open_for_start(&db)
        .await
        .with_context(|| format!("opening the Raft storage in {}", shown.display()))?;
    let peers = crate::cluster::Peers::new(cluster.peers.clone(), cluster.secret.clone())
        .in_group(group, cluster.groups.max(1))
        .over(net.clone());
    let raft = raft::Raft::new(
        cluster.node_id,
        raft::config_keeping(cluster.snapshot_every, cluster.snapshot_keep)?,
        peers,
        log,
        sm.clone(),
    )
    .await
    .context("starting Raft")?;
    // Group g is formed by the g-th node (by id, round robin): its first leader.
    let ids: Vec<u64> = cluster.peers.keys().copied().collect();
    if ids.get(group as usize % ids.len().max(1)) == Some(&cluster.node_id) {
        tokio::spawn(form_group(
            raft.clone(),
            guard.clone(),
            crate::cluster::Peers::new(cluster.peers.clone(), cluster.secret.clone())
                .in_group(group, cluster.groups.max(1))
                .over(net.clone()),
        ));
    }
    Ok((raft, sm, guard))
}

/// Forms the group on the first start of the node with the lowest id, once every node of the
/// cluster answers that it is pristine too (a node whose data dir was wiped while a group
/// exists must rejoin that group, never form a new one): until then it asks again every
/// [`FORM_RETRY`], and stops asking once it has Raft state (a leader reached it) or a peer has.
async fn form_group(
    raft: boxoffice_engine::raft::Raft,
    guard: boxoffice_engine::raft::VoteGuard,
    network: crate::cluster::Peers,
) {
    let me = raft.metrics().borrow().id;
    let group = network.group();
    loop {
        tokio::time::sleep(FORM_RETRY).await;
        if !matches!(raft.is_initialized().await, Ok(false))
            || raft.metrics().borrow().current_leader.is_some()
        {
            return;
        }
        match network.all_pristine(me).await {
            Some(true) => break,
            Some(false) => {
                tracing::info!("a group exists: waiting for its leader to reach this node");
                return;
            }
            None => tracing::info!("waiting for every node before forming the group"),
        }
    }
    let members: std::collections::BTreeMap<u64, openraft::BasicNode> = network
        .addrs()
        .iter()
        .map(|(id, a)| (*id, openraft::BasicNode::new(a.clone())))
        .collect();
    match raft.initialize(members).await {
        Ok(()) => {
            guard.set_ready();
            tracing::info!(group, "formed the group");
        }
        Err(e) => tracing::info!(error = %e, "the group was not formed here"),
    }
}

/// How often the lowest node asks its peers before forming the group.
const FORM_RETRY: Duration = Duration::from_millis(1_500);

/// What the leadership loop needs.
struct Leading {
    raft: boxoffice_engine::raft::Raft,
    sm: boxoffice_engine::raft::StateMachine,
    /// Which group.
    group: u32,
    config: ServerConfig,
    ready: Ready,
    health: Arc<GroupHealth>,
    sweeper: SweeperSlot,
}

/// How long a new leader waits to have applied everything its group committed before it
/// gives up this try (and tries again while it still leads).
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(10);

impl Leading {
    /// The engine of a node that leads: its log is the state machine's, every group commit
    /// goes through Raft. Opened once the node has applied everything its group committed.
    async fn open(&self) -> anyhow::Result<Stack> {
        let term = self.raft.metrics().borrow().current_term;
        tokio::time::timeout(CATCH_UP_TIMEOUT, async {
            // A quorum must answer within one heartbeat interval: on a busy machine that can
            // take a few tries; losing the leadership ends them.
            loop {
                match self.raft.ensure_linearizable().await {
                    Ok(_) => return Ok(()),
                    Err(openraft::error::RaftError::APIError(
                        openraft::error::CheckIsLeaderError::QuorumNotEnough(_),
                    )) => tokio::time::sleep(Duration::from_millis(50)).await,
                    Err(e) => return Err(e),
                }
            }
        })
        .await
        .context("catching up with the group took too long")?
        .context("not the leader")?;
        // And everything in this node's log applied: this leadership has written nothing yet,
        // so every entry there is a former leader's, which the engine must see before it
        // numbers its own records (else it would number them over those entries' records).
        let mut metrics = self.raft.metrics();
        if !boxoffice_engine::bugs::on(boxoffice_engine::bugs::Bug::LeaderResumesTerm) {
            tokio::time::timeout(
                CATCH_UP_TIMEOUT,
                metrics.wait_for(|m| {
                    m.last_applied.map(|l| l.index) >= m.last_log_index || m.current_term != term
                }),
            )
            .await
            .context("applying this node's log took too long")?
            .context("this node's Raft stopped")?;
        }
        let mut ec = engine_config(&self.config);
        ec.sink = Some(self.sm.sink());
        // The state this node kept while it followed, if it did: no replay of its copy.
        ec.warm = Some(self.sm.warm());
        // Its batches carry this term: should the node lose the leadership and win it again
        // while this engine runs, they are skipped, and the engine stops (see `lead`).
        ec.replicate = Some(Arc::new(boxoffice_engine::raft::RaftReplicator::new(
            self.raft.clone(),
            term,
        )));
        // Each node signs tickets with its own key (made on its first lead).
        let config = ServerConfig {
            new_ticket_key: true,
            ..self.config.clone()
        };
        let mut stack = open_stack(&config, ec).await?;
        stack.term = term;
        stack
            .tasks
            .push(lease_watchdog(self.raft.clone(), stack.api.engine.clone()));
        let (id, now) = {
            let m = self.raft.metrics().borrow().clone();
            (m.id, (m.current_leader, m.current_term))
        };
        if now != (Some(id), term) {
            stack.stop().await;
            anyhow::bail!("the leadership changed while the engine opened");
        }
        Ok(stack)
    }
}

/// How often a leader serving its engine checks when a majority last acknowledged it, and how
/// long without that it keeps its engine: a leader cut off from the majority (a partition,
/// followers that hang) keeps no engine past that, so it cannot answer reads from a state
/// another leader has moved on from for much longer than this (writes never commit without a
/// majority anyway).
const LEASE_CHECK_EVERY: Duration = Duration::from_millis(500);
const LEASE_LOST_AFTER: Duration = Duration::from_secs(3);

/// The watchdog of a leader's engine (see [`LEASE_LOST_AFTER`]): stops `engine` once no
/// majority has acknowledged anything this node sent (appends, heartbeats) for that long, as
/// Raft's own figure says (`millis_since_quorum_ack`, refreshed at every tick of its loop). Not
/// `ensure_linearizable`, whose quorum must answer within one heartbeat interval: on a busy
/// machine that fails often while the group is fine.
fn lease_watchdog(
    raft: boxoffice_engine::raft::Raft,
    engine: Engine,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let lost_ms = u64::try_from(LEASE_LOST_AFTER.as_millis()).unwrap_or(u64::MAX);
        // tokio's clock: a simulation's virtual one.
        let started = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(LEASE_CHECK_EVERY).await;
            let since = raft.metrics().borrow().millis_since_quorum_ack;
            let lost = match since {
                Some(ms) => ms >= lost_ms,
                None => started.elapsed() >= LEASE_LOST_AFTER,
            };
            if lost {
                engine.halt(&format!(
                    "no majority acknowledged this node's leadership for {} s",
                    LEASE_LOST_AFTER.as_secs()
                ));
                return;
            }
        }
    })
}

/// Opens that fail in a row before a leader gives up its leadership (stops its Raft, so another
/// node leads): a node that cannot serve must not hold the group.
const OPEN_FAILURES_MAX: u32 = 5;

/// A cluster node's leadership loop: while the node leads its group it serves the engine
/// (opened from its copy of the log); when it stops leading, or its engine stops (a commit
/// without a majority, a lost leadership), the engine is stopped and calls are forwarded to
/// the leader. Health is `SERVING` while the node leads with its engine open or knows the
/// leader to forward to, `NOT_SERVING` otherwise (an election, or recovery).
///
/// The loop ends on a stop request, or on its own when the node cannot go on in its group: its
/// Raft stopped (a storage error: the log could not be written) or it could not open its engine
/// as leader [`OPEN_FAILURES_MAX`] times. Then health says `NOT_SERVING` and `failed` says why
/// ([`Running::failed`]: `serve` exits non-zero so that its supervisor restarts it).
async fn lead(
    node: Leading,
    mut stop: tokio::sync::watch::Receiver<bool>,
    ready_tx: oneshot::Sender<anyhow::Result<()>>,
    failed: Arc<tokio::sync::watch::Sender<Option<String>>>,
) {
    let group = node.group;
    let id = node.raft.metrics().borrow().id;
    let mut metrics = node.raft.metrics();
    let mut stack: Option<Stack> = None;
    let mut serving: Option<bool> = None;
    let mut ready_tx = Some(ready_tx);
    let mut failures = 0;
    let mut why_failed: Option<String> = None;
    loop {
        if *stop.borrow() {
            break;
        }
        if let Err(fatal) = &metrics.borrow().running_state {
            why_failed = Some(format!("its Raft stopped: {fatal}"));
            break;
        }
        let (leads, known, term) = {
            let m = metrics.borrow_and_update();
            (
                m.current_leader == Some(id) && m.state == openraft::ServerState::Leader,
                m.current_leader.is_some(),
                m.current_term,
            )
        };
        let stopped = stack.as_ref().and_then(|s| s.api.engine.stopped());
        // An engine serves one leadership: a new term (even one this node leads again) means
        // another leader may have written meanwhile, so the engine is opened again.
        let moved = stack.as_ref().is_some_and(|s| s.term != term);
        if !leads {
            failures = 0;
        }
        if stack.is_some() && (!leads || stopped.is_some() || moved) {
            node.ready.take();
            if let Ok(mut s) = node.sweeper.lock() {
                *s = None;
            }
            if let Some(s) = stack.take() {
                let why = stopped.unwrap_or_else(|| {
                    if leads {
                        "a new term began".into()
                    } else {
                        "another node leads".into()
                    }
                });
                tracing::warn!(group, reason = %why, "this node stops serving its group");
                s.stop().await;
            }
        }
        let mut retry = false;
        if !leads && stack.is_none() && !node.sm.warm().is_warm() {
            // A follower keeps the state its engine would start from (once warmed up, each
            // batch it applies keeps it so): a failover then replays nothing.
            let sm = node.sm.clone();
            let window_ms = engine_config(&node.config)
                .idempotency_window_ms()
                .unwrap_or(boxoffice_engine::IDEMPOTENCY_WINDOW_MS_DEFAULT);
            tokio::spawn(async move { sm.warm_up(window_ms).await });
        }
        if leads && stack.is_none() {
            match node.open().await {
                Ok(s) => {
                    failures = 0;
                    tracing::info!(
                        node = id,
                        group,
                        term,
                        warm = s.api.engine.recovery_report().warm,
                        "this node leads its group and serves it"
                    );
                    if let Ok(mut slot) = node.sweeper.lock() {
                        *slot = Some(s.sweeper.clone());
                    }
                    node.ready.set(s.api.clone());
                    stack = Some(s);
                }
                Err(e) => {
                    failures += 1;
                    tracing::error!(group, error = %format!("{e:#}"), failures, "cannot serve as the leader");
                    if failures >= OPEN_FAILURES_MAX {
                        tracing::error!(
                            "this node cannot serve: it leaves the group (its Raft stops) so \
                             that another node leads; restart it once the cause is fixed"
                        );
                        if let Err(e) = node.raft.shutdown().await {
                            tracing::warn!(error = %e, "stopping Raft");
                        }
                        why_failed = Some(format!(
                            "it could not serve as leader ({failures} tries; the last: {e:#})"
                        ));
                        break;
                    }
                    retry = true;
                }
            }
        }
        let now = if leads { stack.is_some() } else { known };
        if serving != Some(now) {
            node.health.set(group, now).await;
            serving = Some(now);
        }
        if now && let Some(tx) = ready_tx.take() {
            let _ = tx.send(Ok(()));
        }
        let engine_stopped = async {
            match &stack {
                Some(s) => {
                    let mut w = s.api.engine.watch_stopped();
                    let _ = w.wait_for(|s| s.is_some()).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() {
                why_failed = Some(match &node.raft.metrics().borrow().running_state {
                    Err(fatal) => format!("its Raft stopped: {fatal}"),
                    Ok(()) => "its Raft stopped".into(),
                });
                break;
            },
            () = engine_stopped => {}
            _ = stop.changed() => {}
            () = tokio::time::sleep(Duration::from_millis(500)), if retry => {}
        }
    }
    node.ready.take();
    if let Some(s) = stack.take() {
        s.stop().await;
    }
    if let Some(why) = why_failed.filter(|_| !*stop.borrow()) {
        tracing::error!(group, reason = %why, "this node left its group: health is NOT_SERVING until a restart");
        node.health.set(group, false).await;
        if let Some(tx) = ready_tx.take() {
            let _ = tx.send(Err(anyhow::anyhow!("this node left its group: {why}")));
        }
        failed.send_if_modified(|f| {
            if f.is_none() {
                *f = Some(format!("group {group}: {why}"));
                true
            } else {
                false
            }
        });
    }
}

/// The ticket signing key of the data dir's ring ([`crate::tickets`]). A missing key is made
/// anew only when no ticket was sold (a new data dir), or when the operator says so: silently
/// replacing it would sign new tickets with a key the scanners do not have, and make every ticket
/// already sold whose public key is not kept fail at the door. A damaged key file is refused by
/// name, never replaced.
async fn ticket_signer(
    config: &ServerConfig,
    engine: &Engine,
) -> anyhow::Result<crate::tickets::TicketSigner> {
    use crate::tickets::{KEY_FILE, KeyRing, PUBLIC_KEYS_DIR, open_for_signing};
    // A node's groups share its key ring: one of them makes the key, the others load it. One
    // lock per data dir: nodes of other dirs in the same process (the simulation's runs, side
    // by side) never wait on each other.
    static MAKING: std::sync::LazyLock<
        dashmap::DashMap<std::path::PathBuf, Arc<tokio::sync::Mutex<()>>>,
    > = std::sync::LazyLock::new(dashmap::DashMap::new);
    let lock = MAKING
        .entry(config.data_dir.clone())
        .or_default()
        .value()
        .clone();
    let _one_at_a_time = lock.lock().await;
    let dir = &config.data_dir;
    if let Some(signer) = open_for_signing(dir, false)? {
        return Ok(signer);
    }
    let sold = engine.orders().await.context("counting the orders")?.len();
    let kept = KeyRing::load(dir)?.keys().len();
    let old_tickets = if kept > 0 {
        format!(
            "the tickets already sold whose public keys are kept in {PUBLIC_KEYS_DIR}/ \
             ({kept} kept) keep verifying"
        )
    } else {
        "the tickets already sold will not verify: no public key of theirs is kept".to_owned()
    };
    if sold > 0 && !config.new_ticket_key {
        anyhow::bail!(
            "the ticket signing key {} is missing but {sold} orders were sold: restore the file, \
             or start with --new-ticket-key to sign new tickets with a new key ({old_tickets})",
            dir.join(KEY_FILE).display()
        );
    }
    let signer = open_for_signing(dir, true)?.context("a new ticket signing key was not made")?;
    if sold > 0 {
        tracing::warn!(sold, kid = %signer.kid(), "a new ticket signing key: {old_tickets}");
    }
    Ok(signer)
}

/// Rotates the ticket signing key of a stopped server's data dir
/// ([`crate::tickets::rotate`]): a new key signs from the next start on, and the public halves of
/// the old ones stay in the ring so that tickets already sold keep verifying. The data dir is
/// held (its engine opened, which replays the log) while the keys change, so a server cannot
/// start on it meanwhile, and a server running on it makes this fail instead.
pub async fn rotate_ticket_key(
    data_dir: &std::path::Path,
) -> anyhow::Result<crate::tickets::Rotation> {
    if crate::tickets::KeyRing::load(data_dir)?.keys().is_empty() {
        // Not a server's data dir (or one never started on): `rotate` refuses it, saying so,
        // before an engine opened on a wrong path makes a log there.
        return crate::tickets::rotate(data_dir);
    }
    let engine = Engine::open(EngineConfig::new(data_dir))
        .await
        .with_context(|| {
            format!(
                "opening {} (is the server running on it? Keys are rotated with the server \
                 stopped)",
                data_dir.display()
            )
        })?;
    let rotated = crate::tickets::rotate(data_dir);
    engine.shutdown().await;
    rotated
}

/// Health follows the engine: once it stops for good (the log failed, an actor could not be
/// rebuilt), health says `NOT_SERVING` so load balancers and orchestrators take this server out.
fn follow_engine_stop(
    engine: &Engine,
    health: HealthReporter,
    tasks: &Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
) {
    let mut stopped = engine.watch_stopped();
    let task = tokio::spawn(async move {
        let reason = match stopped.wait_for(|s| s.is_some()).await {
            Ok(r) => r.clone().unwrap_or_default(),
            Err(_) => return, // the engine is gone (shutdown)
        };
        tracing::error!(%reason, "the engine stopped: health is NOT_SERVING until a restart");
        set_health(&health, ServingStatus::NotServing).await;
    });
    if let Ok(mut t) = tasks.lock() {
        t.push(task);
    }
}

impl Running {
    /// Waits until recovery finished (or failed).
    pub async fn wait_ready(&mut self) -> anyhow::Result<()> {
        match self.recovered.take() {
            Some(rx) => rx.await.context("recovery task ended")?,
            None => Ok(()),
        }
    }

    /// What the sweeper has done so far (expired holds, largest expiry lag, waitlist offers).
    pub async fn sweeper_stats(&self) -> Option<boxoffice_sweeper::SweeperStats> {
        let sweeper = self.sweeper.lock().ok()?.clone()?;
        boxoffice_sweeper::sync(&sweeper).await
    }

    /// The sweeper, once started (for tests that check what happens when it dies).
    pub fn sweeper(&self) -> Option<ractor::ActorRef<boxoffice_sweeper::SweeperMsg>> {
        self.sweeper.lock().ok()?.clone()
    }

    /// Resolves when a cluster node has left its group on its own (its Raft stopped on an
    /// error, or it could not serve as leader), with the reason; never for a single node, or
    /// a node that goes on.
    pub async fn failed(&self) -> String {
        let Some(node) = &self.node else {
            return std::future::pending().await;
        };
        let mut failed = node.failed.clone();
        match failed.wait_for(|f| f.is_some()).await {
            Ok(why) => why.clone().unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }

    /// A cluster node's Raft of group 0 (`None`: a single node).
    pub fn raft(&self) -> Option<boxoffice_engine::raft::Raft> {
        self.node.as_ref().and_then(|n| n.rafts.first().cloned())
    }

    /// A cluster node's Raft of each group (empty: a single node).
    pub fn rafts(&self) -> Vec<boxoffice_engine::raft::Raft> {
        self.node
            .as_ref()
            .map(|n| n.rafts.clone())
            .unwrap_or_default()
    }

    /// Whether this cluster node, started without its data, still waits to catch up from a
    /// leader before it votes, in some group (see `raft::VoteGuard`); `false` on a single node.
    pub fn catching_up(&self) -> bool {
        self.node
            .as_ref()
            .is_some_and(|n| n.guards.iter().any(|g| g.catching_up()))
    }

    /// The engine, once recovered.
    pub fn engine(&self) -> Option<Engine> {
        self.ready.get().map(|a| a.engine.clone())
    }

    /// Drains and stops: health NOT_SERVING, new calls UNAVAILABLE, calls in flight finish
    /// (up to the grace period), the listener closes, the sweeper stops, the log is flushed.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        set_health(&self.health, ServingStatus::NotServing).await;
        self.gate.start_draining();
        let deadline = tokio::time::Instant::now() + self.grace;
        while self.gate.in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if let Some(tx) = self.stop_grpc.take() {
            let _ = tx.send(());
        }
        if let Some(tx) = self.stop_http.take() {
            let _ = tx.send(());
        }
        let served = tokio::time::timeout(self.grace, &mut self.grpc_task).await;
        // Background tasks first: the sweeper's watch must not take its stop for a failure.
        let tasks: Vec<_> = self
            .tasks
            .lock()
            .map(|mut t| t.drain(..).collect())
            .unwrap_or_default();
        for t in tasks {
            t.abort();
            let _ = t.await;
        }
        let mut stopped = None;
        if let Some(node) = self.node.take() {
            // The leadership loops stop the engines they serve, if any; then Raft stops.
            let _ = node.stop.send(true);
            for lead in node.leads {
                let _ = lead.await;
            }
            for raft in node.rafts {
                if let Err(e) = raft.shutdown().await {
                    tracing::warn!(error = %e, "stopping Raft");
                }
            }
        }
        let sweeper = self.sweeper.lock().ok().and_then(|s| s.clone());
        if let Some(s) = sweeper {
            let _ = s.stop_and_wait(None, Some(Duration::from_secs(5))).await;
        }
        if let Some(api) = self.ready.get() {
            api.stop();
            stopped = api.engine.stopped();
            api.engine.shutdown().await;
        }
        if let Some(tx) = self.stop_metrics.take() {
            let _ = tx.send(());
        }
        for t in self.background.drain(..) {
            t.abort();
        }
        if let Some(reason) = stopped {
            // Not a clean stop: whatever was not acknowledged before the failure is not in the
            // log. Say what failed; the binary exits non-zero.
            anyhow::bail!("the engine had stopped ({reason}); restart to recover from the log");
        }
        match served {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(e).context("the gRPC server failed"),
            Ok(Err(e)) => Err(e).context("the gRPC server task panicked"),
            Err(_) => {
                self.grpc_task.abort();
                Ok(())
            }
        }
    }
}
