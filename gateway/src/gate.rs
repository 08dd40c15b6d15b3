//! The gate: a tower layer in front of every gRPC service. In this order it
//! 1. lets health checks and reflection through (load balancers and `grpcurl` need no key);
//! 2. authenticates `authorization: Bearer <key>` (SHA-256 of the key compared in constant
//!    time against every configured key): `UNAUTHENTICATED` for no or an unknown key,
//!    `PERMISSION_DENIED` for a client key on an admin RPC;
//! 3. answers `UNAVAILABLE` / `NOT_READY` while the server drains for shutdown;
//! 4. sheds at once with `RESOURCE_EXHAUSTED` / `OVERLOADED` when `in_flight_max` calls are
//!    already running, before any work is done;
//! 5. answers `DEADLINE_EXCEEDED` when the caller's deadline (`grpc-timeout`) passes first;
//! 6. records each call's outcome (`boxoffice_rpc_handled_total`) and latency
//!    (`boxoffice_rpc_duration_seconds`) by method, gRPC code and `ErrorInfo` reason; the calls
//!    in flight and the bound are read at each scrape ([`Gate::in_flight`],
//!    [`Gate::in_flight_max`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::body::Body;
use tower::{Layer, Service};
use tracing::Instrument;

use crate::status::ApiError;

/// What a key may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Everything.
    Admin,
    /// Everything but writes to events, and the change stream.
    Client,
    /// The change stream (`ChangeService`) and nothing else: a read-only key for services
    /// that follow sales.
    Stream,
}

/// RPCs that need an admin key, besides every RPC of [`ADMIN_SERVICES`].
pub const ADMIN_RPCS: &[&str] = &[
    "/boxoffice.v1.EventService/CreateEvent",
    "/boxoffice.v1.EventService/UpdateSale",
];

/// Services whose every RPC needs an admin key (a new RPC there is an admin's from the start).
pub const ADMIN_SERVICES: &[&str] = &["/boxoffice.v1.ClusterService/"];

/// Whether the RPC at `path` needs an admin key.
pub fn needs_admin(path: &str) -> bool {
    ADMIN_RPCS.contains(&path) || ADMIN_SERVICES.iter().any(|s| path.starts_with(s))
}

/// Services an admin key or a stream key may call, and a client key may not.
pub const STREAM_SERVICES: &[&str] = &["/boxoffice.v1.ChangeService/"];

/// Marks a call made with an admin key (a request extension the gate adds): what an answer shows
/// only to admins (each access code's uses) looks for it.
#[derive(Clone, Copy, Debug)]
pub struct AdminCaller;

/// Whether `req` was made with an admin key (see [`AdminCaller`]).
pub fn is_admin<T>(req: &tonic::Request<T>) -> bool {
    req.extensions().get::<AdminCaller>().is_some()
}

/// Whether a key of `scope` may call the RPC at `path`.
pub fn allows(scope: Scope, path: &str) -> bool {
    let stream = STREAM_SERVICES.iter().any(|s| path.starts_with(s));
    match scope {
        Scope::Admin => true,
        Scope::Client => !stream && !needs_admin(path),
        Scope::Stream => stream,
    }
}

/// An API key was empty (or only white space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmptyKey;

impl std::fmt::Display for EmptyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an API key must not be empty")
    }
}

impl std::error::Error for EmptyKey {}

/// The configured API keys (only their SHA-256 digests are kept).
#[derive(Clone, Default)]
pub struct Keys {
    entries: Vec<([u8; 32], Scope)>,
}

impl Keys {
    /// Adds a key with its scope (surrounding white space is not part of a key). Refuses an
    /// empty key.
    pub fn add(&mut self, key: &str, scope: Scope) -> Result<(), EmptyKey> {
        let key = key.trim();
        if key.is_empty() {
            return Err(EmptyKey);
        }
        self.entries
            .push((Sha256::digest(key.as_bytes()).into(), scope));
        Ok(())
    }

    /// The scope of a presented key; every configured key is compared, in constant time.
    pub fn scope_of(&self, presented: &str) -> Option<Scope> {
        if presented.is_empty() {
            return None;
        }
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (k, scope) in &self.entries {
            if bool::from(k.ct_eq(&digest)) {
                found = Some(*scope);
            }
        }
        found
    }
}

/// Shared state of the gate.
pub struct Gate {
    keys: Keys,
    in_flight: AtomicUsize,
    in_flight_max: usize,
    draining: AtomicBool,
    /// The drain flag for those who wait on it (health watches end on it).
    drain: tokio::sync::watch::Sender<bool>,
}

impl Gate {
    /// A gate with these keys and this bound on calls in flight.
    pub fn new(keys: Keys, in_flight_max: usize) -> Gate {
        Gate {
            keys,
            in_flight: AtomicUsize::new(0),
            in_flight_max,
            draining: AtomicBool::new(false),
            drain: tokio::sync::watch::Sender::new(false),
        }
    }

    /// From now on new calls get `UNAVAILABLE`, and health watches end.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.drain.send_replace(true);
    }

    /// Turns true when the drain starts.
    pub fn draining_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.drain.subscribe()
    }

    /// Calls running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Calls in flight past which new ones are shed with `OVERLOADED`.
    pub fn in_flight_max(&self) -> usize {
        self.in_flight_max
    }

    /// The scope of the key `authorization` (an `Authorization: Bearer` header's value)
    /// presents, if it is one of ours.
    pub fn scope_presented(&self, authorization: Option<&str>) -> Option<Scope> {
        authorization
            .and_then(|v| v.strip_prefix("Bearer "))
            .and_then(|key| self.keys.scope_of(key.trim()))
    }

    fn authenticate(&self, path: &str, authorization: Option<&str>) -> Result<Scope, ApiError> {
        let scope = self
            .scope_presented(authorization)
            .ok_or(ApiError::Unauthenticated)?;
        if !allows(scope, path) {
            return Err(ApiError::PermissionDenied);
        }
        Ok(scope)
    }

    /// Admits a call of `path` whose caller presents `authorization` (the `Authorization`
    /// header's value): a known key with the scope the RPC needs, no drain under way, and fewer
    /// than `in_flight_max` calls running. The call counts in flight until the guard is
    /// dropped. Both faces admit their calls here (gRPC in [`GateService`], the in-process
    /// face in [`crate::local`]).
    pub(crate) fn admit(
        self: &Arc<Self>,
        path: &str,
        authorization: Option<&str>,
    ) -> Result<InFlight, ApiError> {
        let scope = self.authenticate(path, authorization)?;
        // Count the call first, then look at the drain flag: a drain that sees no call in
        // flight can never miss one that is about to start.
        let count = self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(self.clone(), scope);
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::NotReady);
        }
        if count >= self.in_flight_max {
            metrics::counter!("boxoffice_gateway_shed_total", "scope" => "gate").increment(1);
            return Err(ApiError::Overloaded("gate"));
        }
        Ok(guard)
    }
}

fn exempt(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/")
        || path.starts_with("/grpc.reflection.")
        // The Raft service between a cluster's nodes checks the cluster secret itself.
        || path.starts_with("/boxoffice.cluster.")
}

/// The layer that puts a [`Gate`] in front of a service.
#[derive(Clone)]
pub struct GateLayer {
    gate: Arc<Gate>,
}

impl GateLayer {
    /// A layer over `gate`.
    pub fn new(gate: Arc<Gate>) -> GateLayer {
        GateLayer { gate }
    }
}

impl<S> Layer<S> for GateLayer {
    type Service = GateService<S>;
    fn layer(&self, inner: S) -> GateService<S> {
        GateService {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// The service the [`GateLayer`] makes.
#[derive(Clone)]
pub struct GateService<S> {
    inner: S,
    gate: Arc<Gate>,
}

/// A call counted in flight (see [`Gate::admit`]) until this is dropped, with the scope of the
/// key it presented (the key is hashed once per call).
pub(crate) struct InFlight(Arc<Gate>, Scope);

impl InFlight {
    /// The scope of the key the call presented.
    pub(crate) fn scope(&self) -> Scope {
        self.1
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The RPCs the gate labels by name (health and reflection pass it unmeasured); any other
/// path is `other`. Bounded cardinality: only our own RPC names become labels.
pub const METHODS: &[&str] = &[
    "CreateEvent",
    "UpdateSale",
    "GetEvent",
    "ListEvents",
    "GetRevocationList",
    "GetSeatMap",
    "Join",
    "GetStatus",
    "GetJoinChallenge",
    "Hold",
    "HoldBatch",
    "Confirm",
    "Release",
    "GetHold",
    "GetOrder",
    "ListOrders",
    "CancelTickets",
    "TransferTickets",
    "JoinWaitlist",
    "GetWaitlistEntry",
    "WatchChanges",
    "other",
];

pub(crate) fn method_label(path: &str) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or("");
    METHODS
        .iter()
        .find(|k| **k == name)
        .copied()
        .unwrap_or("other")
}

/// The label of a gRPC code: its name as the contract spells it.
pub fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
        _ => "OTHER",
    }
}

/// The outcome of a call as labels: (code, reason). Errors are trailers-only responses: the
/// status and its details are in the headers. No status header means the call went on to send
/// a body and trailers: OK for our unary RPCs.
fn outcome(res: &http::Response<Body>) -> (&'static str, &'static str) {
    let headers = res.headers();
    let code = match headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok()?.parse::<i32>().ok())
    {
        None | Some(0) => return ("OK", "none"),
        Some(c) => tonic::Code::from_i32(c),
    };
    // A status this process made carries its reason beside its details: nothing to decode.
    if let Some(reason) = res
        .extensions()
        .get::<tonic::Status>()
        .and_then(crate::status::reason_kept)
    {
        return (code_name(code), reason);
    }
    let reason = match headers.get("grpc-status-details-bin") {
        None => "none",
        Some(details) => reason_of_details(details.as_bytes(), headers),
    };
    (code_name(code), reason)
}

/// The labels of an error status: (code, reason); its kept reason if this process made it, else
/// the one its details carry (a leader's answer, passed on).
pub(crate) fn labels_of(status: &tonic::Status) -> (&'static str, &'static str) {
    let reason =
        crate::status::reason_kept(status).unwrap_or_else(|| crate::status::reason_label(status));
    (code_name(status.code()), reason)
}

/// The reason label of an error's details header made elsewhere (a leader's answer, passed
/// on). The same refusal carries the same bytes every time (`SOLD_OUT` answers most attempts
/// of a sale), so the label of each distinct header is kept (up to [`REASON_MEMO_MAX`] of them)
/// instead of decoding it per call.
fn reason_of_details(details: &[u8], headers: &http::HeaderMap) -> &'static str {
    static MEMO: std::sync::LazyLock<dashmap::DashMap<Box<[u8]>, &'static str>> =
        std::sync::LazyLock::new(dashmap::DashMap::new);
    if let Some(known) = MEMO.get(details) {
        return *known;
    }
    let reason =
        tonic::Status::from_header_map(headers).map_or("none", |s| crate::status::reason_label(&s));
    if MEMO.len() < REASON_MEMO_MAX {
        MEMO.insert(details.into(), reason);
    }
    reason
}

/// Most distinct error details headers whose reason label [`reason_of_details`] keeps (errors
/// that name a seat or a field differ per call; those past the bound are decoded each time).
const REASON_MEMO_MAX: usize = 4_096;

/// Counts a finished call and records its latency, by method, code and reason.
fn record(method: &'static str, res: &http::Response<Body>, started: Instant) -> &'static str {
    let (code, reason) = outcome(res);
    observe(method, code, reason, started);
    code
}

/// Counts a finished call of either face and records its latency, by method, code and reason.
pub(crate) fn observe(
    method: &'static str,
    code: &'static str,
    reason: &'static str,
    started: Instant,
) {
    let labels = [("method", method), ("code", code), ("reason", reason)];
    metrics::counter!("boxoffice_rpc_handled_total", &labels).increment(1);
    metrics::histogram!("boxoffice_rpc_duration_seconds", &labels)
        .record(started.elapsed().as_secs_f64());
}

/// tonic answers a request body it cannot decode (bad protobuf, invalid UTF-8, too large) with
/// INTERNAL or OUT_OF_RANGE and no details; the contract says INVALID_ARGUMENT /
/// INVALID_REQUEST.
fn undecodable_as_invalid(res: http::Response<Body>) -> http::Response<Body> {
    // Only INTERNAL (13) and OUT_OF_RANGE (11) can be tonic's decoding errors.
    if !matches!(
        res.headers().get("grpc-status").map(|v| v.as_bytes()),
        Some(b"13" | b"11")
    ) {
        return res;
    }
    // tonic percent-encodes `grpc-message`: read the status back as tonic parses it.
    let Some(status) = tonic::Status::from_header_map(res.headers()) else {
        return res;
    };
    let undecodable = match status.code() {
        tonic::Code::Internal => status.message().contains("decode"),
        tonic::Code::OutOfRange => status.message().contains("too large"),
        _ => false,
    };
    if !undecodable {
        return res;
    }
    let r = boxoffice_engine::Rejection::invalid(
        "request",
        "the message does not decode, or is too large",
    );
    tonic::Status::from(ApiError::from(r)).into_http()
}

/// The caller's deadline (`grpc-timeout`), shortened by a millisecond so it fires before
/// tonic's timer for the same deadline (which answers `CANCELLED`). `None`: no deadline, or a
/// header tonic will refuse anyway.
fn client_deadline(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    let d = match unit {
        "H" => Duration::from_secs(n.checked_mul(3_600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Some(short_of(d))
}

/// A deadline shortened by a millisecond, so that the gate's answer comes before any timer of
/// the caller's for the same deadline.
pub(crate) fn short_of(d: Duration) -> Duration {
    d.saturating_sub(Duration::from_millis(1))
}

/// The answer to a call whose deadline passed: `DEADLINE_EXCEEDED`, no reason (docs/api.md 7.3).
pub(crate) fn deadline_exceeded() -> tonic::Status {
    tonic::Status::deadline_exceeded(
        "the call's deadline (grpc-timeout) expired before it finished",
    )
}

impl<S> Service<http::Request<Body>> for GateService<S>
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

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // The clone has not been polled ready; the ready one serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let path = req.uri().path().to_owned();
        if exempt(&path) {
            return Box::pin(inner.call(req));
        }
        let method = method_label(&path);
        let started = Instant::now();
        let gate = self.gate.clone();
        let refuse = |e: ApiError| -> Self::Future {
            let res = tonic::Status::from(e).into_http();
            record(method, &res, started);
            Box::pin(async move { Ok(res) })
        };
        let authorization = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let guard = match gate.admit(&path, authorization) {
            Ok(guard) => guard,
            Err(e) => return refuse(e),
        };
        let mut req = req;
        if guard.scope() == Scope::Admin {
            req.extensions_mut().insert(AdminCaller);
        }
        let deadline = client_deadline(req.headers());
        let span = crate::trace::gate_span(method, req.headers());
        let traced = span.clone();
        let call = async move {
            let res = match deadline {
                // A call whose caller has given up is answered DEADLINE_EXCEEDED (tonic's own
                // timeout would answer CANCELLED a moment later). The call itself runs to its
                // end on a task of its own, still counted in flight until then: callers who
                // give up early cannot pile up work past the in-flight bound.
                Some(d) => {
                    let mut call = tokio::spawn(
                        async move {
                            let res = inner.call(req).await;
                            drop(guard);
                            res
                        }
                        .in_current_span(),
                    );
                    match tokio::time::timeout(d, &mut call).await {
                        Ok(Ok(res)) => res,
                        Ok(Err(e)) => Ok(
                            tonic::Status::internal(format!("the call failed: {e}")).into_http()
                        ),
                        Err(_) => Ok(deadline_exceeded().into_http()),
                    }
                }
                None => {
                    let res = inner.call(req).await;
                    drop(guard);
                    res
                }
            };
            res.map(|r| {
                let r = undecodable_as_invalid(r);
                let code = record(method, &r, started);
                traced.record("rpc.grpc.status_code", code);
                r
            })
        };
        Box::pin(call.instrument(span))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cluster_rpc_and_event_creation_needs_an_admin_key() {
        for path in [
            "/boxoffice.v1.EventService/CreateEvent",
            "/boxoffice.v1.EventService/UpdateSale",
            "/boxoffice.v1.ClusterService/GetClusterStatus",
            "/boxoffice.v1.ClusterService/RotateTicketKey",
            "/boxoffice.v1.ClusterService/AnyLaterRpc",
        ] {
            assert!(needs_admin(path), "{path}");
        }
        for path in [
            "/boxoffice.v1.EventService/GetEvent",
            "/boxoffice.v1.BookingService/Hold",
            "/boxoffice.v1.ClusterServiceX/GetClusterStatus",
        ] {
            assert!(!needs_admin(path), "{path}");
        }
    }

    #[test]
    fn a_stream_key_calls_the_change_stream_only_and_a_client_key_never_does() {
        let watch = "/boxoffice.v1.ChangeService/WatchChanges";
        assert!(allows(Scope::Admin, watch));
        assert!(allows(Scope::Stream, watch));
        assert!(!allows(Scope::Client, watch));
        for other in [
            "/boxoffice.v1.EventService/GetEvent",
            "/boxoffice.v1.BookingService/Hold",
            "/boxoffice.v1.EventService/UpdateSale",
        ] {
            assert!(!allows(Scope::Stream, other), "{other}");
            assert!(allows(Scope::Admin, other), "{other}");
        }
        assert!(allows(Scope::Client, "/boxoffice.v1.BookingService/Hold"));
        assert!(!allows(
            Scope::Client,
            "/boxoffice.v1.EventService/UpdateSale"
        ));
    }

    #[test]
    fn client_deadlines_are_read_as_grpc_says() {
        let of = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-timeout", http::HeaderValue::from_str(v).unwrap());
            client_deadline(&h)
        };
        assert_eq!(of("5m"), Some(Duration::from_millis(4)));
        assert_eq!(of("2S"), Some(Duration::from_millis(1_999)));
        assert_eq!(of("1M"), Some(Duration::from_millis(59_999)));
        assert_eq!(of("1H"), Some(Duration::from_millis(3_599_999)));
        assert_eq!(of("300u"), Some(Duration::ZERO));
        assert_eq!(of("99999999n"), Some(Duration::from_nanos(98_999_999)));
        for bad in ["", "m", "5", "5x", "123456789m", "-5m", "5.0S"] {
            assert_eq!(of(bad), None, "{bad:?}");
        }
        assert_eq!(client_deadline(&http::HeaderMap::new()), None);
    }

    #[test]
    fn an_answer_made_here_is_labelled_by_its_kept_reason_and_one_from_elsewhere_by_its_details() {
        use crate::status::ApiError;
        use boxoffice_engine::Rejection;
        let made_here = tonic::Status::from(ApiError::from(Rejection::SoldOut)).into_http::<Body>();
        assert_eq!(outcome(&made_here), ("FAILED_PRECONDITION", "SOLD_OUT"));
        // Its kept reason is what counts, not its headers: none are decoded.
        let mut only_kept = made_here;
        only_kept.headers_mut().remove("grpc-status-details-bin");
        assert_eq!(outcome(&only_kept), ("FAILED_PRECONDITION", "SOLD_OUT"));
        // The same answer as a leader's, passed on: read from its details.
        let (parts, _) = tonic::Status::from(ApiError::from(Rejection::SoldOut))
            .into_http::<Body>()
            .into_parts();
        let mut passed_on = http::Response::new(Body::empty());
        *passed_on.headers_mut() = parts.headers;
        assert_eq!(outcome(&passed_on), ("FAILED_PRECONDITION", "SOLD_OUT"));
        let ok = http::Response::new(Body::empty());
        assert_eq!(outcome(&ok), ("OK", "none"));
    }

    #[test]
    fn keys_have_scopes() {
        let mut k = Keys::default();
        k.add("adm", Scope::Admin).unwrap();
        k.add(" cli ", Scope::Client).unwrap();
        assert_eq!(k.add("  ", Scope::Admin), Err(EmptyKey));
        assert_eq!(k.scope_of("adm"), Some(Scope::Admin));
        assert_eq!(k.scope_of("cli"), Some(Scope::Client));
        assert_eq!(k.scope_of("cl"), None);
        assert_eq!(k.scope_of(""), None);
    }
}
