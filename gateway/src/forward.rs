//! Any node answers (issue 13): a cluster node that does not lead its group forwards each
//! public call, as it came (headers, the caller's key, its deadline, the body), to the node
//! that leads, and relays the answer. Clients need no cluster awareness.
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
use tonic::transport::{Channel, Endpoint};
use tower::{Layer, Service};

use crate::cluster::ClusterSecret;
use crate::services::Ready;
use crate::status::ApiError;

/// The longest a forwarded call waits for the leader's answer (then `UNAVAILABLE` /
/// `NOT_READY`: retry with the same idempotency key).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// The header naming the node that forwarded a call.
pub const FORWARDED_FROM: &str = "x-boxoffice-forwarded-from";
/// The header carrying the cluster secret on a forwarded call.
pub const CLUSTER_SECRET: &str = "x-boxoffice-cluster";

/// What a node needs to forward: who it is, who leads, where its peers are.
pub struct Forwarder {
    id: u64,
    raft: Raft,
    peers: BTreeMap<u64, String>,
    secret: ClusterSecret,
    ready: Ready,
    channels: Mutex<BTreeMap<u64, Channel>>,
}

impl Forwarder {
    /// Node `id` of the group `raft`, with every node's address in `peers`.
    pub fn new(
        id: u64,
        raft: Raft,
        peers: BTreeMap<u64, String>,
        secret: ClusterSecret,
        ready: Ready,
    ) -> Forwarder {
        Forwarder {
            id,
            raft,
            peers,
            secret,
            ready,
            channels: Mutex::new(BTreeMap::new()),
        }
    }

    /// The node that leads, if known and not this one, with a connection to it.
    fn leader(&self) -> Option<(u64, Channel)> {
        let leader = self.raft.metrics().borrow().current_leader?;
        if leader == self.id {
            return None;
        }
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = channels.get(&leader) {
            return Some((leader, c.clone()));
        }
        let addr = self.peers.get(&leader)?;
        // Keepalive pings: a leader that vanishes without closing its connections (power,
        // network) is noticed in seconds, not when TCP gives up.
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .ok()?
            .connect_timeout(Duration::from_millis(500))
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true)
            .tcp_nodelay(true)
            .connect_lazy();
        channels.insert(leader, channel.clone());
        Some((leader, channel))
    }
}

/// Whether `path` is never forwarded: health, reflection, the Raft service between nodes.
fn local_only(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/")
        || path.starts_with("/grpc.reflection.")
        || path.starts_with("/boxoffice.cluster.")
}

/// The layer that forwards (a single node has none: every call passes).
#[derive(Clone, Default)]
pub struct ForwardLayer {
    forwarder: Option<Arc<Forwarder>>,
}

impl ForwardLayer {
    /// Forwarding through `forwarder`, or none.
    pub fn new(forwarder: Option<Arc<Forwarder>>) -> ForwardLayer {
        ForwardLayer { forwarder }
    }
}

impl<S> Layer<S> for ForwardLayer {
    type Service = ForwardService<S>;

    fn layer(&self, inner: S) -> ForwardService<S> {
        ForwardService {
            inner,
            forwarder: self.forwarder.clone(),
        }
    }
}

/// See [`ForwardLayer`].
#[derive(Clone)]
pub struct ForwardService<S> {
    inner: S,
    forwarder: Option<Arc<Forwarder>>,
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
        if local_only(req.uri().path()) {
            return Box::pin(inner.call(req));
        }
        if req.headers().contains_key(FORWARDED_FROM) {
            // Forwarded here: from a node of this cluster, or refused; never forwarded again.
            if !f.secret.presented_in(req.headers(), CLUSTER_SECRET) {
                let refused = tonic::Status::unauthenticated(
                    "a forwarded call without this cluster's secret",
                );
                return Box::pin(async move { Ok(answer(refused)) });
            }
            return Box::pin(inner.call(req));
        }
        if f.ready.get().is_some() {
            return Box::pin(inner.call(req));
        }
        let Some((leader, mut channel)) = f.leader() else {
            // No leader known (an election), or this node leads and is still recovering: the
            // services answer NOT_READY.
            return Box::pin(inner.call(req));
        };
        let headers = req.headers_mut();
        if let (Ok(id), Ok(secret)) = (
            http::HeaderValue::from_str(&f.id.to_string()),
            http::HeaderValue::from_str(f.secret.bearer()),
        ) {
            headers.insert(FORWARDED_FROM, id);
            headers.insert(CLUSTER_SECRET, secret);
        }
        let method = crate::gate::method_label(req.uri().path());
        metrics::counter!("boxoffice_cluster_forwarded_total", "method" => method).increment(1);
        Box::pin(async move {
            // A channel is a buffer: ready first, then called; never longer than
            // FORWARD_TIMEOUT (the caller's own deadline is the gate's).
            let sent = tokio::time::timeout(FORWARD_TIMEOUT, async {
                let ready = tower::ServiceExt::ready(&mut channel).await?;
                ready.call(req).await
            })
            .await;
            match sent {
                Ok(Ok(res)) => Ok(res),
                Ok(Err(e)) => {
                    tracing::warn!(leader, error = %e, "forwarding to the leader failed");
                    Ok(answer(tonic::Status::from(ApiError::NotReady)))
                }
                Err(_) => {
                    tracing::warn!(leader, "the leader did not answer a forwarded call in time");
                    Ok(answer(tonic::Status::from(ApiError::NotReady)))
                }
            }
        })
    }
}
