//! What a server is started with: [`ServerConfig`], and a cluster node's part of it,
//! [`ClusterConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use boxoffice_engine::{Clock, Durability, EngineConfig, RecoveryMode, SystemClock};
use tokio::sync::Notify;

/// Everything `serve` needs.
#[derive(Clone)]
pub struct ServerConfig {
    /// gRPC address.
    pub listen: SocketAddr,
    /// Metrics address (`None`: no metrics endpoint).
    pub metrics_listen: Option<SocketAddr>,
    /// Serve `/debug/pprof/profile` on a metrics address that is not loopback too (the admin
    /// key then crosses that network in plain HTTP). On a loopback address it is always served.
    pub metrics_pprof: bool,
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
    /// Keys with stream scope (the change stream only).
    pub stream_keys: Vec<String>,
    /// How long the change stream keeps a change.
    pub change_retention: Duration,
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
    /// TLS on the public ports, gRPC and HTTP (`--tls-cert`, `--tls-key`, `--tls-client-ca`;
    /// `None`, the default: plaintext).
    pub tls: Option<Arc<crate::tls::PublicTls>>,
    /// A cluster node's part (`None`: a single node, the default).
    pub cluster: Option<ClusterConfig>,
    /// The network the server listens on and reaches its peers over: the OS's (`None`, the
    /// default) or a deterministic simulation's ([`crate::net`]).
    pub network: crate::net::Net,
}

/// A cluster node's part of [`ServerConfig`] (issue 13): the node serves the Raft service
/// between nodes on its peer port (or, without one, on its gRPC address), runs the engine while
/// it leads its group, and forwards public calls to the leader otherwise.
#[derive(Clone)]
pub struct ClusterConfig {
    /// This node's id (a key of `peers`).
    pub node_id: u64,
    /// Every node's address as its peers reach it (`host:port`), this one's among them: its
    /// peer port ([`ClusterConfig::peer_listen`]) if it has one, its gRPC address otherwise.
    pub peers: std::collections::BTreeMap<u64, String>,
    /// The peer port (`--peer-listen`): Raft and forwarded calls are served there, and only
    /// there; the public gRPC port then refuses them. `None`: both on the gRPC address, in the
    /// clear unless it has TLS (the cluster secret crosses the public port: a start warns).
    pub peer_listen: Option<SocketAddr>,
    /// Mutual TLS on the peer port, under the cluster's CA (`None`: plaintext).
    pub peer_tls: Option<Arc<crate::tls::PeerTls>>,
    /// The secret every node of the cluster shares.
    pub secret: crate::node::peers::ClusterSecret,
    /// Raft entries between snapshots (the log before a snapshot is purged).
    pub snapshot_every: u64,
    /// Raft groups (`--groups`, at least 1): an event belongs to group
    /// [`crate::node::forward::group_of_event`] of its id; group `g`'s first leader is the `g`-th
    /// node (by id, round robin), so leaders are spread over the nodes. The same on every node.
    pub groups: u32,
    /// Each group's store instead of a sled database under the data dir (index: the group; a
    /// deterministic simulation's disks). `None`: sled, the default.
    pub stores: Option<Vec<Arc<dyn boxoffice_engine::store::Kv>>>,
    /// Raft entries kept in the log behind a snapshot
    /// ([`boxoffice_engine::raft::SNAPSHOT_KEEP_DEFAULT`] unless a simulation keeps fewer).
    pub snapshot_keep: u64,
}

impl ServerConfig {
    /// Defaults around the given keys and secret: loopback ports, `./boxoffice-data`, `Sync`.
    pub fn new(admin_key: &str, client_key: &str, token_secret: &[u8]) -> ServerConfig {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
            metrics_pprof: false,
            http_listen: None,
            http_routes: None,
            data_dir: PathBuf::from("boxoffice-data"),
            admin_keys: vec![admin_key.to_owned()],
            client_keys: vec![client_key.to_owned()],
            stream_keys: Vec::new(),
            change_retention: Duration::from_millis(
                boxoffice_engine::limits::CHANGE_RETENTION_MS_DEFAULT,
            ),
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
            tls: None,
            cluster: None,
            network: None,
        }
    }
}
