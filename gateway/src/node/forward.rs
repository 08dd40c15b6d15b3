//! Any node answers (issue 13): a cluster node that does not lead a call's group forwards the
//! call, as it came (headers, the caller's key, its deadline, the body), to the node that
//! leads it, and relays the answer. Clients need no cluster awareness.
//!
//! With several Raft groups (`--groups N`) a call's group is its event's
//! ([`group_of_event`]): the request is read (one unary gRPC frame) for the event it names,
//! directly or inside a hold, order or waitlist entry id or a queue token; the call is then
//! served here, marked with [`GroupOf`] for the services, or forwarded with [`GROUP`].
//! `ListEvents` asks every group (here or at its leader) and merges their pages in event id
//! order. A `CreateEvent` with neither an event id nor an idempotency key is given an id here
//! (as the engine would make one), so that its group is known.
//!
//! A forwarded call carries `x-boxoffice-forwarded-from` (the forwarding node's id) and the
//! cluster secret in `x-boxoffice-cluster`; a node refuses a call that names a forwarder
//! without the secret (`UNAUTHENTICATED`), and never forwards a forwarded call again (no
//! loops while leadership moves: the call is answered `UNAVAILABLE` / `NOT_READY` and the
//! caller retries). Health, reflection and the Raft service itself are never forwarded.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use boxoffice_engine::raft::Raft;
use tonic::body::Body;
use tonic::transport::Channel;
use tower::{Layer, Service};

use boxoffice_engine::types::{HoldId, OrderId};
use boxoffice_proto::v1 as pb;
use http_body_util::{BodyExt, Full};
use prost::Message;

use crate::limits::MESSAGE_BYTES_MAX;
use crate::lists::Listing;
use crate::node::peers::Peers;
use crate::services::{GroupOf, Groups};
use crate::status::ApiError;
use crate::tokens::TokenSigner;

/// The longest a forwarded call waits for the leader's answer (then `UNAVAILABLE` /
/// `NOT_READY`: retry with the same idempotency key).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// The header naming the node that forwarded a call.
pub const FORWARDED_FROM: &str = "x-boxoffice-forwarded-from";
/// The header carrying the cluster secret on a forwarded call.
pub const CLUSTER_SECRET: &str = "x-boxoffice-cluster";
/// The header naming the Raft group a forwarded call is for (`--groups`).
pub const GROUP: &str = "x-boxoffice-group";
/// The header saying how many groups the forwarding node runs (they must agree).
pub const GROUPS: &str = "x-boxoffice-groups";

/// What a node needs to forward: who it is, who leads each group, where its peers are.
pub struct Forwarder {
    id: u64,
    /// Each group's Raft (index: the group).
    rafts: Vec<Raft>,
    /// How the node reaches its peers (their addresses, TLS, the secret, the links' watch).
    peers: Peers,
    groups: Groups,
    channels: Mutex<BTreeMap<u64, Channel>>,
    /// The cluster's ticket key ring, as this node holds it.
    ring: Arc<crate::node::ring::ClusterRing>,
    /// Each group's handover on this node.
    handovers: crate::node::handover::Handovers,
    /// The node's token signer: signs the page tokens of the pages it merges.
    signer: TokenSigner,
}

impl Forwarder {
    /// Node `id` of the groups `rafts` (index: the group), reaching the leaders through
    /// `peers` (the links' watch of which the node's groups share); `groups` is each group's
    /// state here (set while this node serves it); `ring` is the node's ticket key ring;
    /// `signer` signs the page tokens of the pages it merges ([`Listing::merge`]).
    pub(crate) fn new(
        id: u64,
        rafts: Vec<Raft>,
        peers: Peers,
        groups: Groups,
        ring: Arc<crate::node::ring::ClusterRing>,
        handovers: crate::node::handover::Handovers,
        signer: TokenSigner,
    ) -> Forwarder {
        Forwarder {
            id,
            rafts,
            peers,
            groups,
            channels: Mutex::new(BTreeMap::new()),
            ring,
            handovers,
            signer,
        }
    }

    /// The node's token signer (see [`Forwarder::new`]).
    pub(crate) fn signer(&self) -> &TokenSigner {
        &self.signer
    }

    /// The members of this node's groups (for `ClusterService`), reached as this forwarder
    /// reaches them.
    pub(crate) fn members(&self) -> crate::node::members::Members {
        crate::node::members::Members::new(
            self.id,
            self.rafts.clone(),
            self.peers.clone(),
            self.ring.clone(),
            self.handovers.clone(),
        )
    }

    /// How many groups.
    pub(crate) fn group_count(&self) -> u32 {
        u32::try_from(self.rafts.len()).unwrap_or(u32::MAX)
    }

    /// Whether this node serves group `g` now (it leads it, its engine open).
    fn serves(&self, g: u32) -> bool {
        self.groups
            .get(g as usize)
            .is_some_and(|r| r.get().is_some())
    }

    /// The node that leads group `g`, if known and not this one, with a connection to it.
    fn leader(&self, g: u32) -> Option<(u64, Channel)> {
        let watch = self.rafts.get(g as usize)?.metrics();
        let (leader, addr) = {
            let m = watch.borrow();
            let leader = m.current_leader?;
            let membership = m.membership_config.membership();
            (leader, membership.get_node(&leader).map(|n| n.addr.clone()))
        };
        if leader == self.id {
            return None;
        }
        // A leader added live is where the membership says (not in `--peers`).
        if let Some(addr) = addr {
            self.peers.learn(leader, &addr);
        }
        self.channel(leader).map(|c| (leader, c))
    }

    /// Serves `call`, a call of group `g` to `path` that this node serves, with its answer held
    /// at the group's read fence ([`crate::node::reads`]).
    pub(crate) async fn here<E>(
        &self,
        g: usize,
        path: &str,
        call: impl Future<Output = Result<http::Response<Body>, E>>,
    ) -> Result<http::Response<Body>, E> {
        crate::node::reads::held(&self.groups, g, path, call).await
    }

    /// Where group `g`'s calls are served now: here if this node serves the group (or nobody
    /// is known to: the services answer `NOT_READY`), else at the group's leader.
    pub(crate) fn place(&self, g: u32) -> Place {
        if self.serves(g) {
            return Place::Here;
        }
        match self.leader(g) {
            Some((leader, channel)) => Place::Leader(leader, channel),
            // No leader known (an election), or this node leads and is still recovering.
            None => Place::Here,
        }
    }

    /// Sends a call of group `g` to its leader `leader` over `channel`, marked as forwarded by
    /// this node; its whole answer, or `NOT_READY` (indefinite: the leader did not answer in
    /// [`FORWARD_TIMEOUT`], or not in whole).
    async fn forward(
        &self,
        g: u32,
        leader: u64,
        mut channel: Channel,
        mut req: http::Request<Body>,
    ) -> Result<http::Response<Body>, tonic::Status> {
        self.mark(req.headers_mut(), g);
        let method = crate::gate::method_label(req.uri().path());
        // The leader's gate continues the trace from this span (crate::trace).
        let span = boxoffice_engine::trace::under_current(|| {
            tracing::info_span!(
                target: crate::trace::TARGET,
                "forward",
                otel.kind = "client",
                rpc.method = method,
                leader,
                group = g,
            )
        });
        crate::trace::pass_on(&span, req.headers_mut());
        metrics::counter!("boxoffice_cluster_forwarded_total", "method" => method).increment(1);
        // A channel is a buffer: ready first, then called; never longer than FORWARD_TIMEOUT
        // (the caller's own deadline is the gate's).
        // A failure is the caller's NOT_READY and a count; the log tells the leader's link
        // once per change (see `links`), not once per call.
        let failed = |why: &dyn std::fmt::Display, reason: &'static str| {
            metrics::counter!("boxoffice_cluster_forward_failures_total", "reason" => reason)
                .increment(1);
            tracing::debug!(leader, group = g, error = %why, "forwarding to the leader failed");
            self.peers.watch().failed(leader, why);
            Err(tonic::Status::from(ApiError::NotReady))
        };
        let sent = tokio::time::timeout(FORWARD_TIMEOUT, send(&mut channel, req));
        match tracing::Instrument::instrument(sent, span).await {
            Ok(Ok(res)) => {
                self.peers.watch().answered(leader);
                Ok(res)
            }
            Ok(Err(e)) => failed(&e, crate::metrics::FORWARD_FAILURES[0]),
            Err(_) => failed(
                &format_args!(
                    "the leader did not answer a forwarded call within {} ms",
                    FORWARD_TIMEOUT.as_millis()
                ),
                crate::metrics::FORWARD_FAILURES[1],
            ),
        }
    }

    /// A typed call of `path` for group `g`, sent to its leader as a forwarded call with the
    /// caller's key (`authorization`, an `Authorization` header's value) and `deadline`: the
    /// leader's answer, read.
    pub(crate) async fn ask_leader<Req: Message, Res: Message + Default>(
        &self,
        (g, leader, channel): (u32, u64, Channel),
        path: &str,
        authorization: Option<&str>,
        deadline: Duration,
        req: &Req,
    ) -> Result<Res, tonic::Status> {
        let mut caller = http::HeaderMap::new();
        if let Some(v) = authorization.and_then(|a| http::HeaderValue::from_str(a).ok()) {
            caller.insert(http::header::AUTHORIZATION, v);
        }
        let timeout = format!("{}m", deadline.as_millis());
        if let Ok(v) = http::HeaderValue::from_str(&timeout) {
            caller.insert("grpc-timeout", v);
        }
        let req = unary_request(path, &caller, g, req)?;
        read_answer(self.forward(g, leader, channel, req).await?).await
    }

    /// A connection to node `node`.
    fn channel(&self, node: u64) -> Option<Channel> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = channels.get(&node) {
            return Some(c.clone());
        }
        let channel = crate::net::channel_lazy(self.peers.net(), self.peers.endpoint(node)?);
        channels.insert(node, channel.clone());
        Some(channel)
    }

    /// Marks `req` as forwarded by this node (its id, the cluster secret) for group `g`.
    fn mark(&self, headers: &mut http::HeaderMap, g: u32) {
        if let (Ok(id), Ok(secret)) = (
            http::HeaderValue::from_str(&self.id.to_string()),
            http::HeaderValue::from_str(self.peers.secret.bearer()),
        ) {
            headers.insert(FORWARDED_FROM, id);
            headers.insert(CLUSTER_SECRET, secret);
        }
        headers.insert(GROUP, http::HeaderValue::from(g));
        headers.insert(GROUPS, http::HeaderValue::from(self.group_count()));
    }
}

/// The Raft group of the event `event_id` among `groups`: the first 8 bytes of its SHA-256, as
/// a big-endian number, modulo `groups` (stable across builds and machines).
pub fn group_of_event(event_id: &str, groups: u32) -> u32 {
    use sha2::Digest;
    if groups <= 1 {
        return 0;
    }
    let digest = sha2::Sha256::digest(event_id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u32::try_from(u64::from_be_bytes(first) % u64::from(groups)).unwrap_or(0)
}

/// Whether `path` is never forwarded: health, reflection, the Raft service between nodes, the
/// cluster's members (any node asks each group's leader itself), the change stream (any node
/// reads its own copy of each group's log).
fn local_only(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/")
        || path.starts_with("/grpc.reflection.")
        || path.starts_with("/boxoffice.cluster.")
        || path.starts_with("/boxoffice.v1.ClusterService/")
        || path.starts_with("/boxoffice.v1.ChangeService/")
}

/// Which port a cluster node's router serves, as the forwarding layer takes calls there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Port {
    /// The gRPC port of a node without a peer port: public calls, Raft and forwarded calls.
    #[default]
    Shared,
    /// The public gRPC port of a node with a peer port (`--peer-listen`): public calls only.
    Public,
    /// The peer port: Raft and calls forwarded by the cluster's nodes only.
    Peer,
}

impl Port {
    /// Why a call to `path` (forwarded if `forwarded`) is not taken on this port, if it is not.
    fn refuses(self, path: &str, forwarded: bool) -> Option<tonic::Status> {
        let raft = path.starts_with("/boxoffice.cluster.");
        match self {
            Port::Shared => None,
            Port::Public if raft || forwarded => Some(tonic::Status::permission_denied(
                "this node takes Raft and forwarded calls on its peer port (--peer-listen) only",
            )),
            Port::Peer if !raft && !forwarded && !local_only(path) => {
                Some(tonic::Status::permission_denied(
                    "the peer port takes only Raft and calls forwarded by this cluster's nodes: \
                     call the node's public gRPC port",
                ))
            }
            _ => None,
        }
    }
}

/// The layer that forwards (a single node has none: every call passes).
#[derive(Clone, Default)]
pub struct ForwardLayer {
    forwarder: Option<Arc<Forwarder>>,
    port: Port,
}

impl ForwardLayer {
    /// Forwarding through `forwarder`, or none, of the calls `port` takes.
    pub fn new(forwarder: Option<Arc<Forwarder>>, port: Port) -> ForwardLayer {
        ForwardLayer { forwarder, port }
    }
}

impl<S> Layer<S> for ForwardLayer {
    type Service = ForwardService<S>;

    fn layer(&self, inner: S) -> ForwardService<S> {
        ForwardService {
            inner,
            forwarder: self.forwarder.clone(),
            port: self.port,
        }
    }
}

/// See [`ForwardLayer`].
#[derive(Clone)]
pub struct ForwardService<S> {
    inner: S,
    forwarder: Option<Arc<Forwarder>>,
    port: Port,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

fn answer(status: tonic::Status) -> http::Response<Body> {
    status.into_http()
}

impl<S> Service<http::Request<Body>> for ForwardService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(f) = self.forwarder.clone() else {
            return Box::pin(inner.call(req));
        };
        let forwarded = req.headers().contains_key(FORWARDED_FROM);
        if let Some(refused) = self.port.refuses(req.uri().path(), forwarded) {
            return Box::pin(async move { Ok(answer(refused)) });
        }
        if local_only(req.uri().path()) {
            return Box::pin(inner.call(req));
        }
        if forwarded {
            // Forwarded here: from a node of this cluster, or refused; never forwarded again.
            if !f.peers.secret.presented_in(req.headers(), CLUSTER_SECRET) {
                let refused = tonic::Status::unauthenticated(
                    "a forwarded call without this cluster's secret",
                );
                return Box::pin(async move { Ok(answer(refused)) });
            }
            let theirs = req
                .headers()
                .get(GROUPS)
                .and_then(|v| v.to_str().ok()?.parse::<u32>().ok());
            if let Some(n) = theirs.filter(|n| *n != f.group_count()) {
                let refused = tonic::Status::failed_precondition(format!(
                    "forwarded by a node running {n} Raft groups, this one runs {}: --groups \
                     must be the same on every node",
                    f.group_count()
                ));
                return Box::pin(async move { Ok(answer(refused)) });
            }
            let group = req
                .headers()
                .get(GROUP)
                .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
            if let Some(g) = group {
                req.extensions_mut().insert(GroupOf(g));
            }
            let path = req.uri().path().to_owned();
            let call = inner.call(req);
            return Box::pin(async move { f.here(group.unwrap_or(0), &path, call).await });
        }
        if f.group_count() <= 1 {
            // One group: every call is its; the body is not read.
            return Box::pin(dispatch(f, inner, 0, req));
        }
        // Several groups: the request names its event (directly, or in a hold, order, entry
        // or queue token); the body is read to find it.
        Box::pin(by_event(f, inner, req))
    }
}

/// Serves or forwards a call of a node with several groups: its body is read to find the event
/// it names (directly, or in a hold, order, entry or queue token), whose group it goes to.
async fn by_event<S>(
    f: Arc<Forwarder>,
    inner: S,
    req: http::Request<Body>,
) -> Result<http::Response<Body>, S::Error>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    let (parts, body) = req.into_parts();
    let bytes = match http_body_util::Limited::new(body, MESSAGE_BYTES_MAX + FRAME_HEADER)
        .collect()
        .await
    {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            // As the services answer a request over the limit.
            let too_big = boxoffice_engine::Rejection::invalid(
                "request",
                format!("over {MESSAGE_BYTES_MAX} bytes"),
            );
            return Ok(answer(tonic::Status::from(ApiError::from(too_big))));
        }
        Err(_) => {
            return Ok(answer(tonic::Status::cancelled(
                "the request's body could not be read (the caller went away?)",
            )));
        }
    };
    let path = parts.uri.path().to_owned();
    let (route, bytes) = route_of(&path, &parts.headers, bytes);
    let g = match route {
        Route::All if path == <pb::ListOrdersRequest as Listing>::LIST_PATH => {
            return list_all::<_, pb::ListOrdersRequest>(f, inner, parts, bytes).await;
        }
        Route::All => return list_all::<_, pb::ListEventsRequest>(f, inner, parts, bytes).await,
        Route::Event(event) => group_of_event(&event, f.group_count()),
        // Not a request the services can read: any group answers its error.
        Route::Unknown => 0,
    };
    let mut parts = parts;
    // The body may have been rewritten (a CreateEvent given its id): its own length.
    parts.headers.remove(http::header::CONTENT_LENGTH);
    let req = http::Request::from_parts(parts, Body::new(Full::new(bytes)));
    dispatch(f, inner, g, req).await
}

/// Serves a call of group `g` where [`Forwarder::place`] says: here, or at the group's leader.
async fn dispatch<S>(
    f: Arc<Forwarder>,
    mut inner: S,
    g: u32,
    mut req: http::Request<Body>,
) -> Result<http::Response<Body>, S::Error>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>>,
{
    req.extensions_mut().insert(GroupOf(g as usize));
    match f.place(g) {
        Place::Here => {
            let path = req.uri().path().to_owned();
            f.here(g as usize, &path, inner.call(req)).await
        }
        Place::Leader(leader, channel) => Ok(match f.forward(g, leader, channel, req).await {
            Ok(res) => res,
            Err(status) => answer(status),
        }),
    }
}

/// Sends `req` to the leader over `channel` and reads its whole answer before any of it is
/// passed on: a leader that dies half-way through its answer leaves the call's outcome unknown,
/// which the caller must hear as `NOT_READY` (indefinite), never as a reset stream (`INTERNAL`;
/// seen once in the cluster test's leader kill). `Err`: no whole answer came.
async fn send(
    channel: &mut Channel,
    req: http::Request<Body>,
) -> Result<http::Response<Body>, String> {
    let ready = tower::ServiceExt::ready(channel)
        .await
        .map_err(|e| e.to_string())?;
    let (parts, body) = ready
        .call(req)
        .await
        .map_err(|e| e.to_string())?
        .into_parts();
    let whole = body.collect().await.map_err(|e| e.to_string())?;
    Ok(http::Response::from_parts(parts, whole_body(whole)))
}

/// A body of what `whole` collected: its data, then its trailers (a gRPC answer's status).
fn whole_body(whole: http_body_util::Collected<bytes::Bytes>) -> Body {
    let trailers = whole.trailers().cloned();
    Body::new(
        Full::new(whole.to_bytes())
            .with_trailers(async move { trailers.map(Ok::<_, std::convert::Infallible>) }),
    )
}

/// The 5 bytes before a gRPC message: compressed flag, length.
const FRAME_HEADER: usize = 5;

/// Where a group's calls are served (see [`Forwarder::place`]).
pub(crate) enum Place {
    /// Here.
    Here,
    /// At this leader, over this connection.
    Leader(u64, Channel),
}

/// How a public call finds its group.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// The group of this event.
    Event(String),
    /// Every group (`ListEvents`).
    All,
    /// No event to be read: malformed, or not a call of the contract.
    Unknown,
}

/// The message of a unary gRPC request body (one frame), gunzipped if so sent.
fn message<'a>(headers: &http::HeaderMap, body: &'a [u8]) -> Option<std::borrow::Cow<'a, [u8]>> {
    let len = u32::from_be_bytes(body.get(1..FRAME_HEADER)?.try_into().ok()?) as usize;
    let msg = body.get(FRAME_HEADER..FRAME_HEADER.checked_add(len)?)?;
    match body.first()? {
        0 => Some(std::borrow::Cow::Borrowed(msg)),
        1 if headers.get("grpc-encoding").and_then(|v| v.to_str().ok()) == Some("gzip") => {
            use std::io::Read;
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(msg)
                .take(MESSAGE_BYTES_MAX as u64 + 1)
                .read_to_end(&mut out)
                .ok()?;
            Some(std::borrow::Cow::Owned(out))
        }
        _ => None,
    }
}

/// `msg` as an uncompressed gRPC frame.
fn frame(msg: &[u8]) -> bytes::Bytes {
    let mut out = Vec::with_capacity(FRAME_HEADER + msg.len());
    out.push(0);
    out.extend_from_slice(&u32::try_from(msg.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(msg);
    out.into()
}

/// A request of the contract as the cluster routes it: by the event it names (directly, or in a
/// hold, order or waitlist entry id or a queue token). One implementation per request: the gRPC
/// face reads the request from its body ([`route_of`]), the in-process face has it typed.
pub trait Routed {
    /// The route.
    fn route(&self) -> Route;

    /// Names the request's event if it names none yet, as the engine would (only a
    /// `CreateEvent` without an event id or idempotency key: `ev-` and a ULID), so that its group
    /// is known. Whether it did.
    fn name_event(&mut self) -> bool {
        false
    }
}

macro_rules! routed_by {
    ($req:ty, |$m:ident| $event:expr) => {
        impl Routed for $req {
            fn route(&self) -> Route {
                let $m = self;
                let event: Option<String> = $event;
                event.map_or(Route::Unknown, Route::Event)
            }
        }
    };
}

impl Routed for pb::ListEventsRequest {
    fn route(&self) -> Route {
        Route::All
    }
}

impl Routed for pb::CreateEventRequest {
    /// Its event id, or the one the engine derives from its idempotency key (every retry
    /// lands in one group).
    fn route(&self) -> Route {
        if !self.event_id.is_empty() {
            Route::Event(self.event_id.clone())
        } else if !self.idempotency_key.is_empty() {
            Route::Event(boxoffice_engine::event_id_of_key(&self.idempotency_key).0)
        } else {
            Route::Unknown
        }
    }

    fn name_event(&mut self) -> bool {
        if !self.event_id.is_empty() || !self.idempotency_key.is_empty() {
            return false;
        }
        self.event_id = format!("ev-{}", boxoffice_engine::rt::ulid()).to_lowercase();
        true
    }
}

fn of_hold(id: &str) -> Option<String> {
    HoldId::from(id).route().map(|(e, _)| e.0)
}

routed_by!(pb::GetEventRequest, |m| Some(m.event_id.clone()));
routed_by!(pb::GetSeatMapRequest, |m| Some(m.event_id.clone()));
routed_by!(pb::GetRevocationListRequest, |m| Some(m.event_id.clone()));
routed_by!(pb::UpdateSaleRequest, |m| Some(m.event_id.clone()));
routed_by!(pb::JoinRequest, |m| Some(m.event_id.clone()));
routed_by!(pb::GetJoinChallengeRequest, |m| Some(m.event_id.clone()));
routed_by!(
    pb::GetStatusRequest,
    |m| crate::tokens::event_of_unverified(&m.queue_token)
);
routed_by!(pb::HoldRequest, |m| Some(m.event_id.clone()));
routed_by!(pb::HoldBatchRequest, |m| Some(m.event_id.clone()));
routed_by!(pb::ConfirmRequest, |m| of_hold(&m.hold_id));
routed_by!(pb::ReleaseRequest, |m| of_hold(&m.hold_id));
routed_by!(pb::GetHoldRequest, |m| of_hold(&m.hold_id));
routed_by!(pb::GetOrderRequest, |m| OrderId::from(m.order_id.as_str())
    .route()
    .map(|(e, _)| e.0));
routed_by!(pb::TransferTicketsRequest, |m| OrderId::from(
    m.order_id.as_str()
)
.route()
.map(|(e, _)| e.0));
routed_by!(pb::CancelTicketsRequest, |m| OrderId::from(
    m.order_id.as_str()
)
.route()
.map(|(e, _)| e.0));
impl Routed for pb::ListOrdersRequest {
    /// Its event's group, or every group (every event's orders).
    fn route(&self) -> Route {
        if self.event_id.is_empty() {
            Route::All
        } else {
            Route::Event(self.event_id.clone())
        }
    }
}

routed_by!(pb::JoinWaitlistRequest, |m| Some(m.event_id.clone()));
routed_by!(pb::GetWaitlistEntryRequest, |m| m
    .entry_id
    .split_once('.')
    .map(|(e, _)| e.to_owned()));

/// The route of a call to `path` with request body `body` (see [`Routed`]), and the body to
/// send on: the same, except for a `CreateEvent` that [`Routed::name_event`] named.
fn route_of(path: &str, headers: &http::HeaderMap, body: bytes::Bytes) -> (Route, bytes::Bytes) {
    use boxoffice_proto::v1 as pb;
    fn read<M: Message + Default + Routed>(
        msg: &[u8],
        body: bytes::Bytes,
    ) -> (Route, bytes::Bytes) {
        let Ok(mut m) = M::decode(msg) else {
            return (Route::Unknown, body);
        };
        if m.name_event() {
            (m.route(), frame(&m.encode_to_vec()))
        } else {
            (m.route(), body)
        }
    }
    let Some(msg) = message(headers, &body) else {
        return (Route::Unknown, body);
    };
    let msg = msg.into_owned();
    match path {
        "/boxoffice.v1.EventService/ListEvents" => (Route::All, body),
        "/boxoffice.v1.EventService/CreateEvent" => read::<pb::CreateEventRequest>(&msg, body),
        "/boxoffice.v1.EventService/GetEvent" => read::<pb::GetEventRequest>(&msg, body),
        "/boxoffice.v1.EventService/GetSeatMap" => read::<pb::GetSeatMapRequest>(&msg, body),
        "/boxoffice.v1.EventService/GetRevocationList" => {
            read::<pb::GetRevocationListRequest>(&msg, body)
        }
        "/boxoffice.v1.EventService/UpdateSale" => read::<pb::UpdateSaleRequest>(&msg, body),
        "/boxoffice.v1.WaitingRoomService/Join" => read::<pb::JoinRequest>(&msg, body),
        "/boxoffice.v1.WaitingRoomService/GetJoinChallenge" => {
            read::<pb::GetJoinChallengeRequest>(&msg, body)
        }
        "/boxoffice.v1.WaitingRoomService/GetStatus" => read::<pb::GetStatusRequest>(&msg, body),
        "/boxoffice.v1.BookingService/Hold" => read::<pb::HoldRequest>(&msg, body),
        "/boxoffice.v1.BookingService/HoldBatch" => read::<pb::HoldBatchRequest>(&msg, body),
        "/boxoffice.v1.BookingService/Confirm" => read::<pb::ConfirmRequest>(&msg, body),
        "/boxoffice.v1.BookingService/Release" => read::<pb::ReleaseRequest>(&msg, body),
        "/boxoffice.v1.BookingService/GetHold" => read::<pb::GetHoldRequest>(&msg, body),
        "/boxoffice.v1.BookingService/GetOrder" => read::<pb::GetOrderRequest>(&msg, body),
        "/boxoffice.v1.BookingService/ListOrders" => read::<pb::ListOrdersRequest>(&msg, body),
        "/boxoffice.v1.BookingService/TransferTickets" => {
            read::<pb::TransferTicketsRequest>(&msg, body)
        }
        "/boxoffice.v1.BookingService/CancelTickets" => {
            read::<pb::CancelTicketsRequest>(&msg, body)
        }
        "/boxoffice.v1.WaitlistService/JoinWaitlist" => read::<pb::JoinWaitlistRequest>(&msg, body),
        "/boxoffice.v1.WaitlistService/GetWaitlistEntry" => {
            read::<pb::GetWaitlistEntryRequest>(&msg, body)
        }
        _ => (Route::Unknown, body),
    }
}

/// The unary call `m` of `path` for group `g`, with the caller's headers (its key and
/// deadline; not this request's own framing and encodings).
fn unary_request<M: Message>(
    path: &str,
    caller: &http::HeaderMap,
    g: u32,
    m: &M,
) -> Result<http::Request<Body>, tonic::Status> {
    let mut req = http::Request::post(path)
        .body(Body::new(Full::new(frame(&m.encode_to_vec()))))
        .map_err(|e| tonic::Status::internal(e.to_string()))?;
    for (name, value) in caller {
        if !matches!(
            name.as_str(),
            "content-length" | "grpc-encoding" | "grpc-accept-encoding" | "content-type" | "te"
        ) {
            req.headers_mut().insert(name.clone(), value.clone());
        }
    }
    req.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    req.headers_mut()
        .insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    req.extensions_mut().insert(GroupOf(g as usize));
    Ok(req)
}

/// A unary answer, read: its message, or its status (in its headers, or its trailers).
async fn read_answer<M: Message + Default>(res: http::Response<Body>) -> Result<M, tonic::Status> {
    let (parts, body) = res.into_parts();
    if let Some(status) = tonic::Status::from_header_map(&parts.headers)
        && status.code() != tonic::Code::Ok
    {
        return Err(status);
    }
    let collected = body
        .collect()
        .await
        .map_err(|_| tonic::Status::from(ApiError::NotReady))?;
    if let Some(status) = collected
        .trailers()
        .and_then(tonic::Status::from_header_map)
        && status.code() != tonic::Code::Ok
    {
        return Err(status);
    }
    let bytes = collected.to_bytes();
    let msg = message(&http::HeaderMap::new(), &bytes)
        .ok_or_else(|| tonic::Status::internal("an answer without a message"))?;
    M::decode(&*msg).map_err(|e| tonic::Status::internal(format!("an answer: {e}")))
}

/// A list call `L` over several groups: each group's page (served here, or by its leader),
/// merged into one page of the size asked, as one group would answer it ([`Listing`]).
async fn list_all<S, L: Listing>(
    f: Arc<Forwarder>,
    inner: S,
    parts: http::request::Parts,
    body: bytes::Bytes,
) -> Result<http::Response<Body>, S::Error>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    let gzip = tonic::codec::CompressionEncoding::Gzip;
    let mut encodings = tonic::codec::EnabledCompressionEncodings::default();
    encodings.enable(gzip);
    let codec = tonic_prost::ProstCodec::<L::Page, L>::default();
    let mut grpc = tonic::server::Grpc::new(codec)
        .apply_compression_config(encodings, encodings)
        .apply_max_message_size_config(Some(MESSAGE_BYTES_MAX), None);
    let method = MergedList {
        f,
        inner,
        headers: parts.headers.clone(),
        listing: std::marker::PhantomData::<L>,
    };
    let req = http::Request::from_parts(parts, Body::new(Full::new(body)));
    Ok(grpc.unary(method, req).await)
}

/// See [`list_all`].
struct MergedList<S, L> {
    f: Arc<Forwarder>,
    inner: S,
    headers: http::HeaderMap,
    listing: std::marker::PhantomData<L>,
}

impl<S, L: Listing> tonic::server::UnaryService<L> for MergedList<S, L>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = L::Page;
    type Future = BoxFuture<Result<tonic::Response<L::Page>, tonic::Status>>;

    fn call(&mut self, req: tonic::Request<L>) -> Self::Future {
        let (f, inner, headers) = (self.f.clone(), self.inner.clone(), self.headers.clone());
        Box::pin(async move {
            let asked = req.into_inner();
            // Every group at once, each within FORWARD_TIMEOUT (so the whole within it too).
            let mut asking = tokio::task::JoinSet::new();
            for g in 0..f.group_count() {
                let sub = asked.of_group();
                let (f, inner, headers) = (f.clone(), inner.clone(), headers.clone());
                asking.spawn(async move { one_group(&f, inner, &headers, g, &sub).await });
            }
            let mut pages = Vec::new();
            while let Some(page) = asking.join_next().await {
                pages.push(
                    page.map_err(|e| tonic::Status::internal(format!("listing a group: {e}")))??,
                );
            }
            Ok(tonic::Response::new(asked.merge(pages, f.signer())))
        })
    }
}

/// Group `g`'s answer to the list call `sub`, asked where [`Forwarder::place`] says: this
/// node's services, or the group's leader (a forwarded call, with the caller's key).
async fn one_group<S, L: Listing>(
    f: &Forwarder,
    mut inner: S,
    caller: &http::HeaderMap,
    g: u32,
    sub: &L,
) -> Result<L::Page, tonic::Status>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>>,
{
    let req = unary_request(L::LIST_PATH, caller, g, sub)?;
    let res = match f.place(g) {
        Place::Here => f
            .here(g as usize, L::LIST_PATH, inner.call(req))
            .await
            .map_err(|_| tonic::Status::from(ApiError::NotReady))?,
        Place::Leader(leader, channel) => f.forward(g, leader, channel, req).await?,
    };
    read_answer(res).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use boxoffice_proto::v1 as pb;
    use prost::Message;

    fn body<M: Message>(m: &M) -> bytes::Bytes {
        frame(&m.encode_to_vec())
    }

    fn routed<M: Message>(path: &str, m: &M) -> Route {
        route_of(path, &http::HeaderMap::new(), body(m)).0
    }

    /// An event's group is part of where its data lives: the function must never change.
    #[test]
    fn the_group_of_an_event_is_a_fixed_function_of_its_id() {
        assert_eq!(group_of_event("anything", 1), 0);
        let spread: Vec<u32> = (0..8)
            .map(|i| group_of_event(&format!("e{i}"), 2))
            .collect();
        assert_eq!(spread, vec![1, 0, 0, 1, 0, 1, 1, 0]);
        assert_eq!(group_of_event("ev-01kb0000000000000000000000", 3), 0);
        for n in 1..=64 {
            assert!(group_of_event("concert", n) < n);
        }
    }

    #[test]
    fn every_call_of_the_contract_is_routed_by_the_event_it_names() {
        let e = || Route::Event("ev1".into());
        let hold = "ev1.ga.h01kb0000000000000000000000".to_owned();
        let order = "ev1.ga.o01kb0000000000000000000000".to_owned();
        let es = "/boxoffice.v1.EventService/";
        let wr = "/boxoffice.v1.WaitingRoomService/";
        let bk = "/boxoffice.v1.BookingService/";
        let wl = "/boxoffice.v1.WaitlistService/";
        let ev = |s: &str| s.to_owned();
        assert_eq!(
            routed(
                &format!("{es}GetEvent"),
                &pb::GetEventRequest {
                    event_id: ev("ev1")
                }
            ),
            e()
        );
        assert_eq!(
            routed(
                &format!("{es}GetSeatMap"),
                &pb::GetSeatMapRequest {
                    event_id: ev("ev1"),
                    ..Default::default()
                }
            ),
            e()
        );
        assert_eq!(
            routed(
                &format!("{es}UpdateSale"),
                &pb::UpdateSaleRequest {
                    event_id: ev("ev1"),
                    ..Default::default()
                }
            ),
            e()
        );
        assert_eq!(
            routed(
                &format!("{es}ListEvents"),
                &pb::ListEventsRequest::default()
            ),
            Route::All
        );
        assert_eq!(
            routed(
                &format!("{wr}Join"),
                &pb::JoinRequest {
                    event_id: ev("ev1"),
                    ..Default::default()
                }
            ),
            e()
        );
        assert_eq!(
            routed(
                &format!("{wr}GetJoinChallenge"),
                &pb::GetJoinChallengeRequest {
                    event_id: ev("ev1"),
                    ..Default::default()
                }
            ),
            e()
        );
        let token = crate::tokens::TokenSigner::new(b"secret").sign(&crate::tokens::Claims {
            kind: crate::tokens::TokenKind::Queue,
            event_id: "ev1".into(),
            user_id: "u".into(),
            number: 1,
            at_ms: 1,
            epoch: 1,
            expires_at_ms: u64::MAX,
        });
        assert_eq!(
            routed(
                &format!("{wr}GetStatus"),
                &pb::GetStatusRequest { queue_token: token }
            ),
            e()
        );
        assert_eq!(
            routed(
                &format!("{bk}Hold"),
                &pb::HoldRequest {
                    event_id: ev("ev1"),
                    ..Default::default()
                }
            ),
            e()
        );
        assert_eq!(
            routed(
                &format!("{bk}HoldBatch"),
                &pb::HoldBatchRequest {
                    event_id: ev("ev1"),
                    ..Default::default()
                }
            ),
            e()
        );
        for m in ["Confirm", "Release", "GetHold"] {
            let path = format!("{bk}{m}");
            let r = match m {
                "Confirm" => routed(
                    &path,
                    &pb::ConfirmRequest {
                        hold_id: hold.clone(),
                        ..Default::default()
                    },
                ),
                "Release" => routed(
                    &path,
                    &pb::ReleaseRequest {
                        hold_id: hold.clone(),
                        ..Default::default()
                    },
                ),
                _ => routed(
                    &path,
                    &pb::GetHoldRequest {
                        hold_id: hold.clone(),
                        ..Default::default()
                    },
                ),
            };
            assert_eq!(r, e(), "{m}");
        }
        assert_eq!(
            routed(
                &format!("{bk}GetOrder"),
                &pb::GetOrderRequest {
                    order_id: order,
                    ..Default::default()
                }
            ),
            e()
        );
        assert_eq!(
            routed(
                &format!("{wl}JoinWaitlist"),
                &pb::JoinWaitlistRequest {
                    event_id: ev("ev1"),
                    ..Default::default()
                }
            ),
            e()
        );
        assert_eq!(
            routed(
                &format!("{wl}GetWaitlistEntry"),
                &pb::GetWaitlistEntryRequest {
                    entry_id: ev("ev1.w01kb0000000000000000000000"),
                    ..Default::default()
                }
            ),
            e()
        );
        // Ids that are not ours, bodies that do not decode, paths not in the contract: no
        // event (the services answer their own errors).
        assert_eq!(
            routed(
                &format!("{bk}GetHold"),
                &pb::GetHoldRequest {
                    hold_id: ev("nonsense"),
                    ..Default::default()
                }
            ),
            Route::Unknown
        );
        assert_eq!(
            route_of(
                &format!("{es}GetEvent"),
                &http::HeaderMap::new(),
                bytes::Bytes::from_static(&[0, 0, 0, 0, 9, 1])
            )
            .0,
            Route::Unknown
        );
        assert_eq!(
            routed("/boxoffice.v1.Other/Call", &pb::GetEventRequest::default()),
            Route::Unknown
        );
    }

    #[test]
    fn a_create_without_id_is_named_here_and_a_keyed_one_as_the_engine_names_it() {
        let path = "/boxoffice.v1.EventService/CreateEvent";
        let named = pb::CreateEventRequest {
            event_id: "concert".into(),
            ..Default::default()
        };
        assert_eq!(routed(path, &named), Route::Event("concert".into()));
        let keyed = pb::CreateEventRequest {
            idempotency_key: "k1".into(),
            ..Default::default()
        };
        assert_eq!(
            routed(path, &keyed),
            Route::Event(boxoffice_engine::event_id_of_key("k1").0)
        );
        let bare = pb::CreateEventRequest {
            name: "show".into(),
            ..Default::default()
        };
        let (route, rewritten) = route_of(path, &http::HeaderMap::new(), body(&bare));
        let Route::Event(id) = route else {
            panic!("{route:?}")
        };
        assert!(id.starts_with("ev-"), "{id}");
        let sent =
            pb::CreateEventRequest::decode(&*message(&http::HeaderMap::new(), &rewritten).unwrap())
                .unwrap();
        assert_eq!(sent.event_id, id, "the request sent on carries the id");
        assert_eq!(sent.name, "show", "and the rest as it came");
    }

    /// A leader on 127.0.0.1 that answers each call with headers, then either a whole answer
    /// (`whole`: a frame and an OK status in the trailers) or half a frame and a reset stream,
    /// as a leader killed mid-answer leaves it.
    async fn leader_answering(whole: bool) -> Channel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(socket).await.unwrap();
            while let Some(Ok((_req, mut respond))) = conn.accept().await {
                let head = http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(())
                    .unwrap();
                let mut out = respond.send_response(head, false).unwrap();
                if whole {
                    out.send_data(frame(b"\x0a\x01x"), false).unwrap();
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", "0".parse().unwrap());
                    out.send_trailers(trailers).unwrap();
                } else {
                    out.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 9, 1]), false)
                        .unwrap();
                    // Once the caller has the headers (the connection keeps being driven).
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        out.send_reset(h2::Reason::INTERNAL_ERROR);
                    });
                }
            }
        });
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy()
    }

    fn confirm_call() -> http::Request<Body> {
        http::Request::builder()
            .method("POST")
            .uri("http://leader/boxoffice.v1.BookingService/Confirm")
            .header("content-type", "application/grpc")
            .body(Body::new(Full::new(frame(b""))))
            .unwrap()
    }

    #[tokio::test]
    async fn a_leader_that_dies_mid_answer_gives_no_answer_to_pass_on() {
        let mut cut = leader_answering(false).await;
        let sent = send(&mut cut, confirm_call()).await;
        assert!(sent.is_err(), "half an answer was passed on");

        let mut fine = leader_answering(true).await;
        let answer = send(&mut fine, confirm_call()).await.unwrap();
        let whole = answer.into_body().collect().await.unwrap();
        let status = whole.trailers().and_then(|t| t.get("grpc-status")).cloned();
        assert_eq!(
            status.as_ref().map(|v| v.as_bytes()),
            Some(&b"0"[..]),
            "the status is kept"
        );
        assert_eq!(whole.to_bytes(), frame(b"\x0a\x01x"), "the message is kept");
    }

    #[test]
    fn gzipped_requests_are_read() {
        use std::io::Write;
        let m = pb::GetEventRequest {
            event_id: "ev1".into(),
        };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&m.encode_to_vec()).unwrap();
        let zipped = gz.finish().unwrap();
        let mut b = vec![1];
        b.extend_from_slice(&u32::try_from(zipped.len()).unwrap().to_be_bytes());
        b.extend_from_slice(&zipped);
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-encoding", http::HeaderValue::from_static("gzip"));
        let (route, _) = route_of(
            "/boxoffice.v1.EventService/GetEvent",
            &headers,
            bytes::Bytes::from(b.clone()),
        );
        assert_eq!(route, Route::Event("ev1".into()));
        // Compressed without saying how: not read.
        let (route, _) = route_of(
            "/boxoffice.v1.EventService/GetEvent",
            &http::HeaderMap::new(),
            bytes::Bytes::from(b),
        );
        assert_eq!(route, Route::Unknown);
    }
}
