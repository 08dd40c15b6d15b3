//! The Raft network between processes (issue 13, second step): each node serves
//! `boxoffice.cluster.v1.Raft` on its cluster port, and reaches its peers there with openraft's
//! messages encoded by the engine's codec. Every call carries the cluster secret
//! (`authorization: Bearer …`); a node compares its SHA-256 in constant time and answers
//! `UNAUTHENTICATED` to anything else, so only nodes that share the secret form a group.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use boxoffice_engine::codec;
use boxoffice_engine::raft::{Raft, TypeConfig, VoteGuard};
use boxoffice_proto::cluster::RaftMessage;
use boxoffice_proto::cluster::raft_client::RaftClient;
use boxoffice_proto::cluster::raft_server::{Raft as RaftService, RaftServer};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::heard::Heard;
use super::links::PeerWatch;

type NodeId = u64;

/// The shared secret of a cluster's nodes.
#[derive(Clone)]
pub struct ClusterSecret {
    bearer: String,
    digest: [u8; 32],
}

impl ClusterSecret {
    /// A secret; refused if empty (or only white space).
    pub fn new(secret: &str) -> anyhow::Result<ClusterSecret> {
        let secret = secret.trim();
        anyhow::ensure!(!secret.is_empty(), "the cluster secret must not be empty");
        Ok(ClusterSecret {
            bearer: format!("Bearer {secret}"),
            digest: Sha256::digest(secret.as_bytes()).into(),
        })
    }

    fn admits<T>(&self, req: &Request<T>) -> Result<(), Status> {
        if self.presented_in(req.metadata().as_ref(), "authorization") {
            Ok(())
        } else {
            Err(Status::unauthenticated("not a node of this cluster"))
        }
    }

    /// Whether header `name` of `headers` carries this secret (`Bearer …`), compared by
    /// SHA-256 in constant time.
    pub(crate) fn presented_in(&self, headers: &http::HeaderMap, name: &str) -> bool {
        let presented = headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let digest: [u8; 32] = Sha256::digest(presented.trim().as_bytes()).into();
        bool::from(digest.ct_eq(&self.digest))
    }

    /// Key material derived from the secret (its SHA-256), for keys of the cluster's own
    /// (the ticket key ring's sealing key, see `node::ring`).
    pub(crate) fn material(&self) -> &[u8; 32] {
        &self.digest
    }

    /// A Raft message to a peer, for group `group` of `groups`, presenting this secret.
    fn request(&self, payload: Vec<u8>, group: u32, groups: u32) -> Request<RaftMessage> {
        let mut req = Request::new(RaftMessage {
            payload,
            group,
            groups,
        });
        if let Ok(v) = self.bearer.parse() {
            req.metadata_mut().insert("authorization", v);
        }
        req
    }

    /// The header value that presents this secret.
    pub(crate) fn bearer(&self) -> &str {
        &self.bearer
    }
}

/// The service a node serves to its peers (behind the secret's interceptor).
pub struct RaftEndpoint {
    /// This node's Raft of each group (index: the group), with its vote guard.
    groups: Arc<Vec<(Raft, VoteGuard)>>,
    /// When this node last stood after refusing a vote by log, and when an AppendEntries last
    /// reached it, in each group.
    stood: Arc<Vec<std::sync::Mutex<Stood>>>,
    /// When a leader's AppendEntries last reached this node, in each group (shared with what
    /// asks, such as the ticket key ring).
    heard: Heard,
    /// The node's ticket key ring (group 0's leader rotates it when asked; `None`: a bare Raft
    /// group's, as tests serve one).
    ring: Option<Arc<crate::node::ring::ClusterRing>>,
    /// Each group's handover on this node (empty for a bare Raft group).
    handovers: Vec<Arc<crate::node::handover::Handover>>,
}

/// When a node last stood after refusing a vote by log, and last heard a leader, in a group.
#[derive(Default)]
struct Stood {
    stood: Option<std::time::Instant>,
    heard: Option<std::time::Instant>,
}

/// How often at most a node stands after refusing a vote by log (in one group): once an
/// election, never a storm of them.
const STAND_EVERY: Duration = Duration::from_millis(1_000);

impl RaftEndpoint {
    /// Whether this node stands now, having answered `answer` to `req` in group `g`: it refused
    /// because its log is ahead of the candidate's, in the first election after the leader it
    /// followed went silent (the candidate's term is the next one, and no AppendEntries came
    /// for longer than a leader's lease), it does not lead, it holds what was committed (not
    /// catching up), and it has not stood so in the last [`STAND_EVERY`]. The candidate cannot win this node's vote, and this node can win the
    /// candidate's: without this, the group waits for this node's election timeout (150 to
    /// 300 ms), often twice.
    fn may_stand(
        &self,
        g: u32,
        raft: &Raft,
        guard: &VoteGuard,
        req: &VoteRequest<NodeId>,
        answer: &VoteResponse<NodeId>,
    ) -> bool {
        let ahead = !answer.vote_granted
            && answer.last_log_id > req.last_log_id
            && req.vote.leader_id().term == answer.vote.leader_id().term + 1;
        let metrics = raft.metrics().borrow().clone();
        if !ahead || guard.catching_up() || metrics.current_leader == Some(metrics.id) {
            return false;
        }
        let Some(stood) = self.stood.get(g as usize) else {
            return false;
        };
        let mut stood = stood.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        // Refused by log, not by the lease of a leader still heard (openraft answers both the
        // same way): no AppendEntries for longer than that lease.
        let lease = Duration::from_millis(boxoffice_engine::raft::ELECTION_MAX_MS);
        let silent = stood.heard.is_none_or(|t| now.duration_since(t) > lease);
        if !silent
            || stood
                .stood
                .is_some_and(|t| now.duration_since(t) < STAND_EVERY)
        {
            return false;
        }
        stood.stood = Some(now);
        true
    }

    /// Notes that a leader's AppendEntries reached this node in group `g`.
    fn heard(&self, g: u32) {
        if let Some(stood) = self.stood.get(g as usize) {
            stood.lock().unwrap_or_else(|p| p.into_inner()).heard = Some(std::time::Instant::now());
        }
        self.heard.note(g);
    }

    /// The Raft of the group `m` is for.
    fn group(&self, m: &RaftMessage) -> Result<&(Raft, VoteGuard), Status> {
        if m.groups != 0 && m.groups as usize != self.groups.len() {
            return Err(Status::failed_precondition(format!(
                "this node runs {} Raft groups, the caller {}: --groups must be the same on \
                 every node",
                self.groups.len(),
                m.groups
            )));
        }
        usize::try_from(m.group)
            .ok()
            .and_then(|g| self.groups.get(g))
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "this node has no Raft group {} (it runs {}: is --groups the same on \
                     every node?)",
                    m.group,
                    self.groups.len()
                ))
            })
    }
}

fn decode<T: DeserializeOwned>(m: &RaftMessage) -> Result<T, Status> {
    codec::decode(&m.payload)
        .map_err(|e| Status::invalid_argument(format!("an undecodable Raft message: {e}")))
}

fn encode<T: Serialize>(value: &T) -> Response<RaftMessage> {
    Response::new(RaftMessage {
        payload: codec::encode(value),
        group: 0,
        groups: 0,
    })
}

/// Stands for election at once, in a term above the refused candidate's. openraft 0.9 refuses a
/// vote by log without taking the candidate's term, so the first election is in the
/// candidate's term (which the candidate, having voted for itself, refuses) and the second one
/// above it. Raft stays safe whoever stands and when; this only saves the wait.
fn stand(raft: Raft) {
    tokio::spawn(async move {
        for _ in 0..2 {
            if raft.trigger().elect().await.is_err() {
                return;
            }
        }
    });
}

#[tonic::async_trait]
impl RaftService for RaftEndpoint {
    async fn append_entries(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let (raft, guard) = self.group(req.get_ref())?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode(req.get_ref())?;
        self.heard(req.get_ref().group);
        guard.saw_append(&rpc);
        // A traced group commit's append continues its leader's trace (crate::trace).
        let span = if req.metadata().contains_key(crate::trace::TRACEPARENT) {
            tracing::info_span!(target: crate::trace::TARGET, "raft.append", otel.kind = "server",
                group = req.get_ref().group, entries = rpc.entries.len())
        } else {
            tracing::Span::none()
        };
        crate::trace::continue_from_metadata(&span, req.metadata());
        let answer = tracing::Instrument::instrument(raft.append_entries(rpc), span).await;
        guard.check(raft);
        Ok(encode(&answer))
    }

    async fn vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let (raft, guard) = self.group(req.get_ref())?;
        let rpc: VoteRequest<NodeId> = decode(req.get_ref())?;
        if !guard.may_vote(raft, &rpc) {
            // Not a refusal Raft knows: the candidate counts this node as unreachable.
            return Err(Status::unavailable(
                "this node started without its data and votes once it has caught up",
            ));
        }
        let answer = raft.vote(rpc.clone()).await;
        if let Ok(a) = &answer
            && self.may_stand(req.get_ref().group, raft, guard, &rpc, a)
        {
            stand(raft.clone());
        }
        Ok(encode(&answer))
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let (raft, _) = self.group(req.get_ref())?;
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(req.get_ref())?;
        Ok(encode(&raft.install_snapshot(rpc).await))
    }

    async fn change_members(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let (raft, _) = self.group(req.get_ref())?;
        let change: crate::node::membership::MemberChange = decode(req.get_ref())?;
        let metrics = raft.metrics().borrow().clone();
        let elect = change == crate::node::membership::MemberChange::Elect;
        if !elect && metrics.current_leader != Some(metrics.id) {
            return Err(Status::failed_precondition(format!(
                "node {} does not lead group {} (its leader: {:?})",
                metrics.id,
                req.get_ref().group,
                metrics.current_leader
            )));
        }
        let (Some(ring), Some(handover)) =
            (&self.ring, self.handovers.get(req.get_ref().group as usize))
        else {
            return Err(Status::failed_precondition(
                "this Raft group takes no change from its peers",
            ));
        };
        let ctx = crate::node::membership::Context { ring, handover };
        Ok(encode(
            &crate::node::membership::apply(raft, &change, &ctx).await,
        ))
    }

    async fn probe(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let (raft, guard) = self.group(req.get_ref())?;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| Status::unavailable(format!("raft: {e}")))?;
        Ok(encode(&(!initialized && guard.catching_up())))
    }
}

impl Peers {
    /// Whether every other peer answers that it is pristine in this group (no Raft state):
    /// `Some(true)` all are, `Some(false)` one is not (the group exists), `None` one cannot be
    /// reached.
    pub async fn all_pristine(&self, me: NodeId) -> Option<bool> {
        for id in self.addrs().into_keys().filter(|id| *id != me) {
            if !self.pristine(id).await? {
                return Some(false);
            }
        }
        Some(true)
    }

    /// Whether some other peer answers that it holds this group (it has Raft state).
    pub async fn any_formed(&self, me: NodeId) -> bool {
        for id in self.addrs().into_keys().filter(|id| *id != me) {
            if self.pristine(id).await == Some(false) {
                return true;
            }
        }
        false
    }

    /// Asks node `leader` to make `change` in this group (it must lead it).
    pub(crate) async fn change_members(
        &self,
        leader: NodeId,
        change: &crate::node::membership::MemberChange,
    ) -> Result<(), crate::node::membership::Retry> {
        use crate::node::membership::Retry;
        let endpoint = self
            .endpoint(leader)
            .ok_or_else(|| Retry::Yes(format!("no address for node {leader}")))?
            .timeout(crate::node::membership::CATCH_UP_WAIT + Duration::from_secs(30));
        let channel = crate::net::channel_now(&self.net, endpoint)
            .await
            .map_err(|e| Retry::Yes(format!("node {leader}: {e}")))?;
        let req = self
            .secret
            .request(codec::encode(change), self.group, self.groups);
        let answer = RaftClient::new(channel)
            .change_members(req)
            .await
            .map_err(|s| match s.code() {
                // Not (or no longer) the leader, or gone: the next leader is asked.
                tonic::Code::FailedPrecondition | tonic::Code::Unavailable => {
                    Retry::Yes(Failure(&s).to_string())
                }
                _ => Retry::No(Failure(&s).to_string()),
            })?;
        let result: Result<(), Retry> = codec::decode(&answer.get_ref().payload)
            .map_err(|e| Retry::No(format!("an undecodable answer: {e}")))?;
        result
    }

    /// Whether peer `id` answers that it is pristine in this group (`None`: no answer).
    async fn pristine(&self, id: NodeId) -> Option<bool> {
        let endpoint = self.endpoint(id)?.timeout(Duration::from_secs(2));
        let channel = crate::net::channel_now(&self.net, endpoint).await.ok()?;
        let req = self.secret.request(vec![], self.group, self.groups);
        let answer = RaftClient::new(channel).probe(req).await.ok()?;
        codec::decode(&answer.get_ref().payload).ok()
    }
}

/// The interceptor that admits only calls presenting the cluster secret.
#[derive(Clone)]
pub struct SecretCheck(ClusterSecret);

impl tonic::service::Interceptor for SecretCheck {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.0.admits(&req).map(|()| req)
    }
}

/// The Raft service a cluster node serves to its peers, behind the cluster secret.
pub type PeerService =
    tonic::service::interceptor::InterceptedService<RaftServer<RaftEndpoint>, SecretCheck>;

/// The Raft service of this node's `groups` (each one's Raft, its votes behind its guard; the
/// index is the group) for its peers, behind `secret` (checked from the headers, before a
/// request's body is read).
pub(crate) fn raft_service(
    groups: Vec<(Raft, VoteGuard)>,
    secret: ClusterSecret,
    heard: Heard,
    ring: Option<Arc<crate::node::ring::ClusterRing>>,
    handovers: Vec<Arc<crate::node::handover::Handover>>,
) -> PeerService {
    tonic::service::interceptor::InterceptedService::new(
        RaftServer::new(RaftEndpoint {
            stood: Arc::new(groups.iter().map(|_| std::sync::Mutex::default()).collect()),
            groups: Arc::new(groups),
            heard,
            ring,
            handovers,
        })
        .max_decoding_message_size(MESSAGE_BYTES_MAX)
        .max_encoding_message_size(MESSAGE_BYTES_MAX),
        SecretCheck(secret),
    )
}

/// Serves `raft` (behind `guard`) to its peers on `listener` until `shutdown` resolves (a port of its own; a
/// `serve --node-id` node serves it on its gRPC address instead).
pub async fn serve(
    listener: tokio::net::TcpListener,
    raft: Raft,
    guard: VoteGuard,
    secret: ClusterSecret,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(raft_service(
            vec![(raft, guard)],
            secret,
            Heard::new(1),
            None,
            Vec::new(),
        ))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// The largest Raft message, bytes: openraft sends snapshots in chunks (3 MiB by default) and
/// appends of at most `max_payload_entries` (16) entries, each one group commit, the largest of
/// which is a big section's checkpoint (a million seats: tens of MB); only callers presenting
/// the cluster secret get this far (it is checked before the body is read).
pub const MESSAGE_BYTES_MAX: usize = 256 << 20;

/// How a node reaches its peers in one group: their cluster addresses, the secret, the TLS of
/// the peer port, the group.
#[derive(Clone)]
pub struct Peers {
    /// Each node's address: `--peers`, then what the groups' membership says of a node it does
    /// not name (a node added live), as openraft hands it when it connects (shared by every
    /// clone).
    addrs: Arc<std::sync::RwLock<BTreeMap<NodeId, String>>>,
    /// The nodes `--peers` names (their addresses are never taken from the membership).
    named: Arc<std::collections::BTreeSet<NodeId>>,
    pub(crate) secret: ClusterSecret,
    /// Mutual TLS under the cluster's CA (`None`: plaintext).
    tls: Option<Arc<crate::tls::PeerTls>>,
    /// What the log says of the peers' links (shared by the node's groups).
    watch: Arc<PeerWatch>,
    group: u32,
    groups: u32,
    net: crate::net::Net,
    /// The channel of the small Raft calls to each node (votes, and appends without entries:
    /// heartbeats and read-index rounds) and the address it was made for, shared by every
    /// client openraft asks for, in every group (every clone shares it): openraft 0.9 asks for
    /// a new client for each read-index round (`ensure_linearizable`, behind the read fence)
    /// and each election, and a channel of its own would open a connection each time (a TCP and
    /// HTTP/2 handshake on both nodes, then a teardown). Appends with entries and snapshot
    /// chunks go over a client's own channel ([`PeerClient`]), so no bulk transfer holds up a
    /// heartbeat, a vote or a read.
    channels: Arc<std::sync::Mutex<BTreeMap<NodeId, (String, Channel)>>>,
}

impl Peers {
    /// The peers at `addrs` (`host:port`; this node's own address may be among them), sharing
    /// `secret`, in group 0.
    pub fn new(addrs: BTreeMap<NodeId, String>, secret: ClusterSecret) -> Peers {
        Peers {
            watch: Arc::new(PeerWatch::new(addrs.clone())),
            named: Arc::new(addrs.keys().copied().collect()),
            addrs: Arc::new(std::sync::RwLock::new(addrs)),
            secret,
            tls: None,
            group: 0,
            groups: 1,
            net: None,
            channels: Arc::default(),
        }
    }

    /// The group these peers are reached in.
    pub fn group(&self) -> u32 {
        self.group
    }

    /// Every node's address.
    pub fn addrs(&self) -> BTreeMap<NodeId, String> {
        self.addrs.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Notes that node `id`, which `--peers` does not name, is at `addr` (the membership's
    /// word: a node added live). `--peers` wins for the nodes it names: the membership keeps
    /// the addresses a group was formed or joined with, and a node's address in `--peers` may
    /// have changed since (a peer port turned on, a node moved).
    pub(crate) fn learn(&self, id: NodeId, addr: &str) {
        if addr.is_empty() || self.named.contains(&id) {
            return;
        }
        if self
            .addrs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .is_some_and(|a| a == addr)
        {
            return;
        }
        let mut addrs = self.addrs.write().unwrap_or_else(|p| p.into_inner());
        addrs.insert(id, addr.to_owned());
    }

    /// The same peers, reached over `net` (a simulation's network; `None`: the OS's).
    pub fn over(mut self, net: crate::net::Net) -> Peers {
        self.net = net;
        self.channels = Arc::default();
        self
    }

    /// The same peers, reached over mutual TLS with `tls` (`None`: plaintext).
    pub fn with_tls(mut self, tls: Option<Arc<crate::tls::PeerTls>>) -> Peers {
        self.tls = tls;
        self.channels = Arc::default();
        self
    }

    /// What the log says of the peers' links.
    pub(crate) fn watch(&self) -> &Arc<PeerWatch> {
        &self.watch
    }

    /// The network the peers are reached over.
    pub(crate) fn net(&self) -> &crate::net::Net {
        &self.net
    }

    /// The endpoint of node `node`, if it has an address: over the peer port's TLS if there is
    /// one, with keepalive pings, so that a connection a partition or a peer's power cut left
    /// dead (nothing comes back, no reset) is noticed in seconds and opened again, instead of
    /// failing every call until TCP gives up.
    pub(crate) fn endpoint(&self, node: NodeId) -> Option<Endpoint> {
        self.endpoint_at(node, &self.addr(node)?)
    }

    /// Node `node`'s address, if it has one.
    fn addr(&self, node: NodeId) -> Option<String> {
        let addrs = self.addrs.read().unwrap_or_else(|p| p.into_inner());
        addrs.get(&node).cloned()
    }

    /// [`Peers::endpoint`] of node `node` at `addr`.
    fn endpoint_at(&self, node: NodeId, addr: &str) -> Option<Endpoint> {
        let endpoint = crate::tls::peer_endpoint(addr, self.tls.as_deref())
            .map_err(|e| tracing::warn!(node, %addr, error = %e, "no endpoint for a peer"))
            .ok()?;
        Some(
            endpoint
                .connect_timeout(Duration::from_millis(500))
                .http2_keep_alive_interval(Duration::from_secs(1))
                .keep_alive_timeout(Duration::from_secs(2))
                .keep_alive_while_idle(true)
                .tcp_nodelay(true),
        )
    }

    /// The channel of the small calls to node `node` (none without an address): the one made
    /// for its address before, or a new one (connected on first use).
    fn shared_channel(&self, node: NodeId) -> Option<Channel> {
        let addr = self.addr(node)?;
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((made_for, channel)) = channels.get(&node)
            && *made_for == addr
        {
            return Some(channel.clone());
        }
        let channel = crate::net::channel_lazy(&self.net, self.endpoint_at(node, &addr)?);
        channels.insert(node, (addr, channel.clone()));
        Some(channel)
    }

    /// The same peers, their links told by `watch` (one for all of a node's groups).
    pub fn watched_by(mut self, watch: Arc<PeerWatch>) -> Peers {
        self.watch = watch;
        self
    }

    /// The same peers, in group `group` of `groups`.
    pub fn in_group(mut self, group: u32, groups: u32) -> Peers {
        self.group = group;
        self.groups = groups;
        self
    }
}

impl RaftNetworkFactory<TypeConfig> for Peers {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        self.learn(target, &node.addr);
        PeerClient {
            target,
            shared: self.shared_channel(target),
            own: None,
            endpoint: self.endpoint(target),
            watch: self.watch.clone(),
            secret: self.secret.clone(),
            group: self.group,
            groups: self.groups,
            net: self.net.clone(),
        }
    }
}

/// A failed call's status, told in a line: its code and message, and for a refused secret
/// what that means.
pub(crate) struct Failure<'a>(pub(crate) &'a Status);

impl std::fmt::Display for Failure<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.0;
        if s.code() == tonic::Code::Unauthenticated {
            return write!(
                f,
                "the peer refuses this node's cluster secret (UNAUTHENTICATED: {})",
                s.message()
            );
        }
        write!(f, "{:?}: {}", s.code(), s.message())?;
        if let Some(source) = std::error::Error::source(s) {
            write!(f, " ({source})")?;
        }
        Ok(())
    }
}

/// A client of one peer: its small calls over the channel shared by the node's clients of that
/// peer, its appends with entries and snapshot chunks over a channel of its own.
pub struct PeerClient {
    target: NodeId,
    /// The node's channel of small calls to the peer ([`Peers`]).
    shared: Option<Channel>,
    /// This client's own channel (made at its first bulk call: a replication stream's appends,
    /// a snapshot's chunks), and the peer's endpoint to make it from.
    own: Option<Channel>,
    endpoint: Option<Endpoint>,
    watch: Arc<PeerWatch>,
    secret: ClusterSecret,
    group: u32,
    groups: u32,
    /// A simulation's network, whose message faults apply (`None`: the OS's).
    net: crate::net::Net,
}

impl PeerClient {
    /// The channel of a bulk call (this client's own, made now if need be) or of a small one
    /// (the shared one); `None` without an address.
    fn channel(&mut self, bulk: bool) -> Option<Channel> {
        if !bulk {
            return self.shared.clone();
        }
        if self.own.is_none() {
            self.own = self
                .endpoint
                .clone()
                .map(|e| crate::net::channel_lazy(&self.net, e));
        }
        self.own.clone()
    }

    /// Sends `rpc` with `call`, and decodes the peer's answer (its result or openraft's error).
    /// `bulk`: over this client's own channel (entries or a snapshot chunk), else over the
    /// shared one.
    async fn call<Q, A, E>(
        &mut self,
        bulk: bool,
        rpc: &Q,
        option: &RPCOption,
        span: &tracing::Span,
        call: impl AsyncFn(
            RaftClient<Channel>,
            Request<RaftMessage>,
        ) -> Result<Response<RaftMessage>, Status>,
    ) -> Result<A, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Q: Serialize,
        A: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
        RaftError<NodeId, E>: DeserializeOwned,
    {
        let Some(channel) = self.channel(bulk) else {
            return Err(RPCError::Unreachable(openraft::error::Unreachable::new(
                &AnyError::error(format!("no address for node {}", self.target)),
            )));
        };
        let client = RaftClient::new(channel)
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX);
        let payload = codec::encode(rpc);
        let request = || {
            let mut req = self
                .secret
                .request(payload.clone(), self.group, self.groups);
            req.set_timeout(option.hard_ttl());
            crate::trace::pass_on_metadata(span, req.metadata_mut());
            req
        };
        let faults = self
            .net
            .as_ref()
            .map(|n| n.message_faults(self.target))
            .unwrap_or_default();
        if !faults.delay.is_zero() {
            tokio::time::sleep(faults.delay).await;
        }
        if faults.duplicate {
            // The peer gets the message twice; only the second answer is read.
            let _ = call(client.clone(), request()).await;
        }
        let answer = call(client, request()).await.map_err(|s| {
            self.watch.failed(self.target, &Failure(&s));
            match s.code() {
                // The peer is down or cannot be reached: openraft backs off from it.
                tonic::Code::Unavailable => {
                    RPCError::Unreachable(openraft::error::Unreachable::new(&s))
                }
                _ => RPCError::Network(NetworkError::new(&s)),
            }
        })?;
        let result: Result<A, RaftError<NodeId, E>> = codec::decode(&answer.get_ref().payload)
            .map_err(|e| {
                self.watch.failed(self.target, &e);
                RPCError::Network(NetworkError::new(&e))
            })?;
        // An answer, even an error of the peer's Raft: the link works.
        self.watch.answered(self.target);
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        // The append of a traced group commit, in its trace (crate::trace).
        let group = self.group;
        let span = boxoffice_engine::trace::any_in_flight()
            .then(|| {
                rpc.entries.iter().find_map(|e| match &e.payload {
                    openraft::EntryPayload::Normal(batch) => {
                        boxoffice_engine::trace::replication_of(group, batch.first_record())
                    }
                    _ => None,
                })
            })
            .flatten()
            .map_or_else(tracing::Span::none, |parent| {
                tracing::info_span!(target: crate::trace::TARGET, parent: &parent,
                    "raft.append_entries", otel.kind = "client", peer = self.target,
                    entries = rpc.entries.len())
            });
        let bulk = !rpc.entries.is_empty();
        let sent = self.call(bulk, &rpc, &option, &span, async |mut c, r| {
            c.append_entries(r).await
        });
        tracing::Instrument::instrument(sent, span.clone()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(
            true,
            &rpc,
            &option,
            &tracing::Span::none(),
            async |mut c, r| c.install_snapshot(r).await,
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(
            false,
            &rpc,
            &option,
            &tracing::Span::none(),
            async |mut c, r| c.vote(r).await,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures_util::StreamExt;

    use super::*;

    /// openraft 0.9 asks the factory for a new client for each read-index round and each
    /// election: their calls must share one connection to a peer, not open one each; bulk calls
    /// (appends with entries) keep a connection of their client's own.
    #[tokio::test]
    async fn clients_of_a_peer_share_one_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let incoming =
            tokio_stream::wrappers::TcpListenerStream::new(listener).inspect(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            });
        // A server with no service: every call is answered UNIMPLEMENTED, over a connection.
        let server = tonic::transport::Server::builder()
            .add_optional_service(None::<RaftServer<RaftEndpoint>>)
            .serve_with_incoming(incoming);
        let served = tokio::spawn(server);
        let mut peers = Peers::new(
            BTreeMap::from([(1, "127.0.0.1:1".to_owned()), (2, addr.clone())]),
            ClusterSecret::new("a-secret-for-the-test").unwrap(),
        );
        let node = BasicNode { addr: addr.clone() };
        for _ in 0..5 {
            let mut client = peers.new_client(2, &node).await;
            let answer = client
                .vote(
                    VoteRequest::new(openraft::Vote::new(1, 1), None),
                    RPCOption::new(Duration::from_secs(5)),
                )
                .await;
            assert!(
                matches!(answer, Err(RPCError::Network(_))),
                "the server has no Raft service: {answer:?}"
            );
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for five clients"
        );
        // A replication stream's appends with entries go over a connection of its own (made
        // once), its heartbeats (appends without entries) over the shared one.
        let mut stream = peers.new_client(2, &node).await;
        let append = |entries| AppendEntriesRequest::<TypeConfig> {
            vote: openraft::Vote::new(1, 1),
            prev_log_id: None,
            entries,
            leader_commit: None,
        };
        let entry = openraft::Entry::<TypeConfig> {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), 1),
            payload: openraft::EntryPayload::Blank,
        };
        for (entries, connections) in [(vec![entry.clone()], 2), (vec![entry], 2), (Vec::new(), 2)]
        {
            let answer = stream
                .append_entries(append(entries), RPCOption::new(Duration::from_secs(5)))
                .await;
            assert!(matches!(answer, Err(RPCError::Network(_))), "{answer:?}");
            assert_eq!(accepted.load(Ordering::SeqCst), connections);
        }
        served.abort();
    }
}
