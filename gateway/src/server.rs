//! The `boxoffice` server: gRPC services behind the gate, health and reflection on the same
//! port, the HTTP API and the metrics endpoint on their own ports, and an orderly drain. This
//! module composes them; what runs behind them is elsewhere: the engine a server serves and its
//! sweeper ([`crate::stack`]), a cluster node's Raft groups and leadership ([`crate::node`]).
//!
//! Start-up order: bind both ports, serve health (`NOT_SERVING`) at once, replay the log (the
//! booking services answer `UNAVAILABLE` / `NOT_READY` meanwhile), start the sweeper, then flip
//! health to `SERVING`. Drain: health `NOT_SERVING`, new calls `UNAVAILABLE`, wait for calls in
//! flight (up to the grace period), stop the listener, stop the sweeper, flush and close the log.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use boxoffice_engine::Engine;
use boxoffice_proto::v1 as pb;
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

pub use crate::config::{ClusterConfig, ServerConfig};
use crate::gate::{Gate, GateLayer, Keys, Scope};
use crate::health::set_health;
/// Largest request message decoded (see [`crate::limits`]).
pub use crate::limits::MESSAGE_BYTES_MAX;
use crate::local::Local;
use crate::net::Listener;
use crate::node::forward::Port;
pub use crate::node::{GROUPS_FILE, group_dir};
use crate::node::{Node, Opened, Serving};
use crate::services::changes::Feed;
use crate::services::grpc::{
    BookingSvc, ChangeSvc, ClusterSvc, EventRoutes, WaitingRoomSvc, WaitlistSvc,
};
use crate::services::{Groups, Ready};
use crate::stack::SweeperSlot;
pub use crate::ticket_keys::rotate_ticket_key;

/// A running server.
pub struct Running {
    /// The gRPC address it listens on.
    pub addr: SocketAddr,
    /// The metrics address, if any.
    pub metrics_addr: Option<SocketAddr>,
    /// The HTTP API's address, if any.
    pub http_addr: Option<SocketAddr>,
    /// A cluster node's peer port, if it has one.
    pub peer_addr: Option<SocketAddr>,
    ready: Ready,
    recovered: Option<oneshot::Receiver<anyhow::Result<()>>>,
    gate: Arc<Gate>,
    health: HealthReporter,
    grace: Duration,
    stop_grpc: Option<oneshot::Sender<()>>,
    stop_peer: Option<oneshot::Sender<()>>,
    stop_metrics: Option<oneshot::Sender<()>>,
    stop_http: Option<oneshot::Sender<()>>,
    grpc_task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    background: Vec<tokio::task::JoinHandle<()>>,
    sweeper: SweeperSlot,
    /// Tasks started by recovery (the periodic reconciliation), stopped on shutdown.
    tasks: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    /// A cluster node's Raft groups and their leadership loops.
    node: Option<Node>,
}

/// The gRPC services behind the gate, ready to serve.
type GrpcRouter = tonic::transport::server::Router<
    tower::layer::util::Stack<
        crate::node::forward::ForwardLayer,
        tower::layer::util::Stack<GateLayer, tower::layer::util::Identity>,
    >,
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
    for k in &config.stream_keys {
        keys.add(k, Scope::Stream).context("--stream-key")?;
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
    config: &ServerConfig,
    port: PortParts,
) -> anyhow::Result<GrpcRouter> {
    let PortParts {
        raft: raft_service,
        forwarder,
        port,
        ..
    } = port;
    let (reflection, reflection_v1alpha) = reflection()?;
    let gzip = tonic::codec::CompressionEncoding::Gzip;
    let max = MESSAGE_BYTES_MAX;
    let members = ClusterSvc(forwarder.as_ref().map(|f| Arc::new(f.members())));
    Ok(tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .http2_max_pending_accept_reset_streams(Some(64))
        .max_concurrent_streams(Some(crate::limits::STREAMS_PER_CONNECTION_MAX))
        .layer(GateLayer::new(gate.clone()))
        .layer(crate::node::forward::ForwardLayer::new(forwarder, port))
        .add_service(health_service)
        .add_optional_service(raft_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(EventRoutes::new(
            ready.clone(),
            max,
            // A seat map at the limit, and the few bytes of framing a bound may miss.
            config.seat_map_max_bytes.clamp(
                crate::limits::SEAT_MAP_BYTES_MIN,
                crate::limits::SEAT_MAP_BYTES_MAX,
            ) + 1_024,
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
        .add_service(pb::cluster_service_server::ClusterServiceServer::new(
            members,
        ))
        .add_service(change_service(ready, gate))
        .add_service(
            pb::waitlist_service_server::WaitlistServiceServer::new(WaitlistSvc(ready.clone()))
                .max_decoding_message_size(max)
                .accept_compressed(gzip)
                .send_compressed(gzip),
        ))
}

/// `ChangeService` over `ready`'s feeds, its followers ended by `gate`'s drain.
fn change_service(
    ready: &Groups,
    gate: &Gate,
) -> pb::change_service_server::ChangeServiceServer<ChangeSvc> {
    let gzip = tonic::codec::CompressionEncoding::Gzip;
    pb::change_service_server::ChangeServiceServer::new(ChangeSvc {
        groups: ready.clone(),
        drain: gate.draining_signal(),
    })
    .max_decoding_message_size(MESSAGE_BYTES_MAX)
    .accept_compressed(gzip)
    .send_compressed(gzip)
}

/// Server reflection over v1, and over the older v1alpha protocol (grpcurl and most
/// reflection clients ask for v1 first and fall back; some, like Python's, speak only
/// v1alpha), both describing the public services and health.
fn reflection() -> anyhow::Result<(
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
)> {
    let v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(boxoffice_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(boxoffice_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("building the v1alpha reflection service")?;
    Ok((v1, v1alpha))
}

/// Binds and serves the HTTP API on `addr`, calling the services through `local`; returns the
/// bound address, the stop signal, the task.
async fn serve_http(
    addr: SocketAddr,
    local: Arc<Local>,
    extra: Option<axum::Router>,
    tls: Option<Arc<crate::tls::PublicTls>>,
) -> anyhow::Result<MetricsServing> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the HTTP address {addr}"))?;
    let haddr = l.local_addr()?;
    // `/ops` reads this process's metrics: the recorder must be there before the engine's
    // series are made (also without a metrics port).
    crate::metrics::install();
    let app = crate::http::router(crate::http::Backend::new(local), extra);
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = rx.await;
        };
        let served = match tls {
            None => crate::http::serve(l, app, shutdown).await,
            Some(tls) => match tls.http().accepting(Listener::Tcp(l)) {
                Ok(l) => match crate::tls::AxumListener::new(l) {
                    Ok(l) => crate::http::serve(l, app, shutdown).await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            },
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "HTTP API failed");
        }
    });
    Ok((haddr, tx, task))
}

/// Binds and serves `/metrics` on `addr` (reading the gate's calls in flight at each scrape),
/// and, with `profiles`, `/debug/pprof/profile` for its admin keys;
/// returns the bound address, the stop signal, the task.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    gate: Arc<Gate>,
    profiles: Option<Arc<Gate>>,
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
        if let Err(e) = crate::metrics::serve(l, handle, profiles, collect, shutdown).await {
            tracing::error!(error = %e, "metrics endpoint failed");
        }
    });
    Ok((maddr, tx, task))
}

/// Binds, starts serving health at once, and recovers in the background. Use
/// [`Running::wait_ready`] to wait for recovery. A cluster node ([`ServerConfig::cluster`])
/// starts its Raft instead, and runs the engine while it leads (see [`crate::node`]).
pub async fn start(config: ServerConfig) -> anyhow::Result<Running> {
    let listener = bind_grpc_port(&config).await?;
    let addr = listener.local_addr()?;
    let peer_listener = bind_peer_port(&config).await?;
    let gate = Arc::new(Gate::new(keys_of(&config)?, config.in_flight_max));
    let (health, _) = tonic_health::server::health_reporter();
    set_health(&health, ServingStatus::NotServing).await;
    let n_groups = config.cluster.as_ref().map_or(1, |c| c.groups.max(1));
    let readies: Vec<Ready> = (0..n_groups).map(|_| Ready::default()).collect();
    let groups = Groups::new(readies.clone());
    install_metrics(&config);
    let (opened, cluster) = open_cluster(&config, &groups).await?;
    // The HTTP API calls the same gate, routing and services in process.
    let forwarder = cluster.as_ref().map(|(_, forwarder)| forwarder.clone());
    let local = Arc::new(Local::new(gate.clone(), groups.clone(), forwarder));
    let (public, peer) = port_parts(&config, cluster);
    let (stop_grpc, grpc_task) = serve_port(listener, public, (&gate, &health), &groups, &config)?;
    let mut background = Vec::new();
    let peer = peer.zip(peer_listener);
    let (peer_addr, stop_peer) =
        serve_peer_port(peer, &gate, &health, &groups, &config, &mut background)?.unzip();
    let (http_addr, stop_http) = serve_http_of(&config, local, &mut background).await?;
    let (metrics_addr, stop_metrics) =
        serve_metrics_of(&config, &gate, &readies[0], &mut background).await?;
    let sweeper: SweeperSlot = Arc::default();
    let (recovered, recovered_rx) = oneshot::channel();
    let tasks = Arc::new(std::sync::Mutex::new(Vec::new()));
    let node = match opened {
        Some(opened) => Some(opened.lead(Serving {
            config: &config,
            readies: &readies,
            health: &health,
            sweeper: &sweeper,
            recovered,
            background: &mut background,
        })),
        None => {
            background.push(recover_in_background(
                &config,
                &readies[0],
                &health,
                &sweeper,
                &tasks,
                recovered,
            ));
            None
        }
    };
    Ok(Running {
        addr,
        metrics_addr,
        http_addr,
        peer_addr,
        ready: readies[0].clone(),
        recovered: Some(recovered_rx),
        gate,
        health,
        grace: config.grace,
        stop_grpc: Some(stop_grpc),
        stop_peer,
        stop_metrics,
        stop_http,
        grpc_task,
        background,
        sweeper,
        tasks,
        node,
    })
}

/// Serves a cluster node's peer port, if it has one (its parts and listener), behind `gate`,
/// with the health of `health`: its address and stop signal.
fn serve_peer_port(
    peer: Option<(PortParts, Listener)>,
    gate: &Arc<Gate>,
    health: &HealthReporter,
    groups: &Groups,
    config: &ServerConfig,
    background: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<Option<(SocketAddr, oneshot::Sender<()>)>> {
    let Some((parts, listener)) = peer else {
        return Ok(None);
    };
    let addr = listener.local_addr()?;
    let (stop, task) = serve_port(listener, parts, (gate, health), groups, config)?;
    background.push(tokio::spawn(async move {
        if let Ok(Err(e)) = task.await {
            tracing::error!(error = %e, "the peer port failed");
        }
    }));
    Ok(Some((addr, stop)))
}

/// Serves the gRPC services and what `parts` adds on `listener` (over TLS if `parts` says),
/// behind the gate, with the health of the reporter: the stop signal and the task.
fn serve_port(
    listener: Listener,
    parts: PortParts,
    (gate, health): (&Arc<Gate>, &HealthReporter),
    groups: &Groups,
    config: &ServerConfig,
) -> anyhow::Result<GrpcServing> {
    let listener = with_tls(listener, parts.tls.clone())?;
    let health_service = crate::health::service(health, gate.draining_signal());
    let router = grpc_router(gate, health_service, groups, config, parts)?;
    Ok(serve_grpc(listener, router))
}

/// `listener`'s connections, over TLS if `tls`.
fn with_tls(listener: Listener, tls: Option<crate::tls::Handshakes>) -> anyhow::Result<Listener> {
    match tls {
        None => Ok(listener),
        Some(t) => t.accepting(listener).context("TLS on a port"),
    }
}

/// Binds the gRPC port.
async fn bind_grpc_port(config: &ServerConfig) -> anyhow::Result<Listener> {
    Listener::bind(&config.network, config.listen)
        .await
        .with_context(|| format!("binding the gRPC address {}", config.listen))
}

/// Binds a cluster node's peer port, if it has one (`--peer-listen`); warns when a cluster node
/// has none (its Raft and forwarded calls, the cluster secret with them, cross the public port).
async fn bind_peer_port(config: &ServerConfig) -> anyhow::Result<Option<Listener>> {
    let Some(c) = &config.cluster else {
        return Ok(None);
    };
    let Some(addr) = c.peer_listen else {
        // Its peers would dial its public port in the clear, where it speaks only TLS.
        anyhow::ensure!(
            config.tls.is_none(),
            "a cluster node with TLS on its public port needs a peer port (--peer-listen)"
        );
        tracing::warn!(
            "no peer port (--peer-listen): Raft and forwarded calls, and the cluster secret \
             they carry, cross the public gRPC port in plaintext"
        );
        return Ok(None);
    };
    let l = Listener::bind(&config.network, addr)
        .await
        .with_context(|| format!("binding the peer address {addr} (--peer-listen)"))?;
    Ok(Some(l))
}

/// The recorder, first, when this process's metrics are shown (`/metrics`, `/ops`): so that
/// what the node records while it opens is kept, and a cluster node's own series are there from
/// its start.
fn install_metrics(config: &ServerConfig) {
    if config.metrics_listen.is_some() || config.http_listen.is_some() {
        crate::metrics::install();
        if let Some(c) = &config.cluster {
            crate::metrics::register_cluster(c.node_id, c.peers.keys().copied(), c.groups);
        }
    }
}

/// A cluster node's groups opened, with its Raft service and forwarder; `None` on a single node.
async fn open_cluster(
    config: &ServerConfig,
    groups: &Groups,
) -> anyhow::Result<(Option<Opened>, Option<ClusterParts>)> {
    let group_of = crate::node::forward::group_of_event;
    if config.cluster.is_none() {
        let ready = groups.get(0).cloned().unwrap_or_default();
        groups.feeds().set(vec![Feed::Engine(ready)], group_of);
        return Ok((None, None));
    }
    let (opened, service, forwarder) = Opened::open(config, groups).await?;
    let copies = opened.copies().into_iter().map(Feed::Copy).collect();
    groups.feeds().set(copies, group_of);
    Ok((Some(opened), Some((service, forwarder))))
}

/// A cluster node's Raft service and forwarder.
type ClusterParts = (
    crate::node::peers::PeerService,
    Arc<crate::node::forward::Forwarder>,
);

/// What one gRPC port serves beside the public services: the Raft service (if Raft is taken
/// there), the forwarder (a cluster node), which calls the port takes, and its TLS.
#[derive(Default)]
struct PortParts {
    raft: Option<crate::node::peers::PeerService>,
    forwarder: Option<Arc<crate::node::forward::Forwarder>>,
    port: Port,
    tls: Option<crate::tls::Handshakes>,
}

/// The parts of the public gRPC port and, if the node has one, of its peer port.
fn port_parts(
    config: &ServerConfig,
    cluster: Option<ClusterParts>,
) -> (PortParts, Option<PortParts>) {
    let tls = config.tls.as_ref().map(|t| t.grpc());
    let Some((raft, forwarder)) = cluster else {
        return (
            PortParts {
                tls,
                ..PortParts::default()
            },
            None,
        );
    };
    let peer = config.cluster.as_ref().filter(|c| c.peer_listen.is_some());
    match peer {
        None => (
            PortParts {
                raft: Some(raft),
                forwarder: Some(forwarder),
                port: Port::Shared,
                tls,
            },
            None,
        ),
        Some(c) => (
            PortParts {
                raft: None,
                forwarder: Some(forwarder.clone()),
                port: Port::Public,
                tls,
            },
            Some(PortParts {
                raft: Some(raft),
                forwarder: Some(forwarder),
                port: Port::Peer,
                tls: c.peer_tls.as_ref().map(|t| t.server()),
            }),
        ),
    }
}

/// A gRPC port served: its stop signal and its task.
type GrpcServing = (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
);

/// Serves `router` on `listener` until the returned signal: the signal and the task.
fn serve_grpc(listener: Listener, router: GrpcRouter) -> GrpcServing {
    let (stop, stop_rx) = oneshot::channel::<()>();
    let stopped = async move {
        let _ = stop_rx.await;
    };
    let task = match listener {
        Listener::Tcp(l) => {
            let incoming = TcpIncoming::from(l).with_nodelay(Some(true));
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
        }
        Listener::Other(_, incoming) => {
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
        }
    };
    (stop, task)
}

/// The metrics endpoint of `config`, if any, with the sampler of the engine `ready` serves:
/// its address and stop signal.
async fn serve_metrics_of(
    config: &ServerConfig,
    gate: &Arc<Gate>,
    ready: &Ready,
    background: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<(Option<SocketAddr>, Option<oneshot::Sender<()>>)> {
    let Some(m) = config.metrics_listen else {
        return Ok((None, None));
    };
    let profiles = (m.ip().is_loopback() || config.metrics_pprof).then(|| gate.clone());
    if profiles.is_none() {
        tracing::info!(
            "/debug/pprof/profile is off: the metrics port is not on loopback (--metrics-pprof)"
        );
    }
    let (addr, stop, task) = serve_metrics(m, gate.clone(), profiles).await?;
    background.push(task);
    let ready = ready.clone();
    background.push(crate::metrics::spawn_sampler(
        config.data_dir.clone(),
        move || ready.get().map(|api| api.engine.clone()),
    ));
    Ok((Some(addr), Some(stop)))
}

/// The HTTP API of `config`, if any, calling the services through `local`: its address and stop
/// signal.
async fn serve_http_of(
    config: &ServerConfig,
    local: Arc<Local>,
    background: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<(Option<SocketAddr>, Option<oneshot::Sender<()>>)> {
    let Some(h) = config.http_listen else {
        return Ok((None, None));
    };
    let (addr, stop, task) =
        serve_http(h, local, config.http_routes.clone(), config.tls.clone()).await?;
    background.push(task);
    Ok((Some(addr), Some(stop)))
}

/// A single node's recovery, in the background: health says `NOT_SERVING` until it is done.
fn recover_in_background(
    config: &ServerConfig,
    ready: &Ready,
    health: &HealthReporter,
    sweeper: &SweeperSlot,
    tasks: &Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    recovered: oneshot::Sender<anyhow::Result<()>>,
) -> tokio::task::JoinHandle<()> {
    let (ready, health, sweeper) = (ready.clone(), health.clone(), sweeper.clone());
    let (config, tasks) = (config.clone(), tasks.clone());
    tokio::spawn(async move {
        let r = crate::stack::recover(config, ready, health, sweeper, tasks).await;
        if let Err(e) = &r {
            tracing::error!(error = %format!("{e:#}"), "recovery failed");
        }
        let _ = recovered.send(r);
    })
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
        match &self.node {
            Some(node) => node.failed().await,
            None => std::future::pending().await,
        }
    }

    /// A cluster node's Raft of group 0 (`None`: a single node).
    pub fn raft(&self) -> Option<boxoffice_engine::raft::Raft> {
        self.node.as_ref().and_then(|n| n.rafts().first().cloned())
    }

    /// A cluster node's Raft of each group (empty: a single node).
    pub fn rafts(&self) -> Vec<boxoffice_engine::raft::Raft> {
        self.node
            .as_ref()
            .map(|n| n.rafts().to_vec())
            .unwrap_or_default()
    }

    /// Whether this cluster node, started without its data, still waits to catch up from a
    /// leader before it votes, in some group (see `raft::VoteGuard`); `false` on a single node.
    pub fn catching_up(&self) -> bool {
        self.node.as_ref().is_some_and(Node::catching_up)
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
        if let Some(tx) = self.stop_peer.take() {
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
            node.stop().await;
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
