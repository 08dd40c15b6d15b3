//! The gate: a tower layer in front of every gRPC service. In this order it
//! 1. lets health checks and reflection through (load balancers and `grpcurl` need no key);
//! 2. authenticates `authorization: Bearer <key>` (SHA-256 of the key compared in constant
//!    time against every configured key): `UNAUTHENTICATED` for no or an unknown key,
//!    `PERMISSION_DENIED` for a client key on an admin RPC;
//! 3. answers `UNAVAILABLE` / `NOT_READY` while the server drains for shutdown;
//! 4. sheds at once with `RESOURCE_EXHAUSTED` / `OVERLOADED` when `in_flight_max` calls are
//!    already running, before any work is done;
//! 5. records each call's latency by method and gRPC code.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::body::Body;
use tower::{Layer, Service};

use crate::status::ApiError;

/// What a key may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Everything.
    Admin,
    /// Everything but writes to events.
    Client,
}

/// RPCs that need an admin key.
pub const ADMIN_RPCS: &[&str] = &["/boxoffice.v1.EventService/CreateEvent"];

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
}

impl Gate {
    /// A gate with these keys and this bound on calls in flight.
    pub fn new(keys: Keys, in_flight_max: usize) -> Gate {
        Gate {
            keys,
            in_flight: AtomicUsize::new(0),
            in_flight_max,
            draining: AtomicBool::new(false),
        }
    }

    /// From now on new calls get `UNAVAILABLE`.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Calls running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    fn authenticate(&self, req: &http::Request<Body>) -> Result<(), ApiError> {
        let key = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or(ApiError::Unauthenticated)?;
        let scope = self
            .keys
            .scope_of(key.trim())
            .ok_or(ApiError::Unauthenticated)?;
        if scope != Scope::Admin && ADMIN_RPCS.contains(&req.uri().path()) {
            return Err(ApiError::PermissionDenied);
        }
        Ok(())
    }
}

fn exempt(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/") || path.starts_with("/grpc.reflection.")
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

struct InFlight(Arc<Gate>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

fn method_label(path: &str) -> &'static str {
    // Bounded cardinality: only our own RPC names become labels.
    const KNOWN: &[&str] = &[
        "CreateEvent",
        "GetEvent",
        "ListEvents",
        "GetSeatMap",
        "Join",
        "GetStatus",
        "GetJoinChallenge",
        "Hold",
        "Confirm",
        "Release",
        "GetHold",
        "GetOrder",
        "JoinWaitlist",
        "GetWaitlistEntry",
        "Check",
        "Watch",
    ];
    let name = path.rsplit('/').next().unwrap_or("");
    KNOWN
        .iter()
        .find(|k| **k == name)
        .copied()
        .unwrap_or("other")
}

fn code_label(res: &http::Response<Body>) -> &'static str {
    // Errors are trailers-only responses: the status is in the headers. No status header means
    // the call went on to send a body and trailers: OK for our unary RPCs.
    let code = res
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(0);
    match tonic::Code::from_i32(code) {
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

/// tonic answers a request body it cannot decode (bad protobuf, invalid UTF-8, too large) with
/// INTERNAL or OUT_OF_RANGE and no details; the contract says INVALID_ARGUMENT /
/// INVALID_REQUEST.
fn undecodable_as_invalid(res: http::Response<Body>) -> http::Response<Body> {
    let header = |name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let code = header("grpc-status").and_then(|c| c.parse::<i32>().ok());
    let message = header("grpc-message").unwrap_or_default();
    let undecodable = match code {
        Some(13) => message.contains("decode"),
        Some(11) => message.contains("too large"),
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
            metrics::histogram!("boxoffice_rpc_duration_seconds", "method" => method, "code" => code_label(&res))
                .record(started.elapsed().as_secs_f64());
            Box::pin(async move { Ok(res) })
        };
        if let Err(e) = gate.authenticate(&req) {
            return refuse(e);
        }
        // Count the call first, then look at the drain flag: a drain that sees no call in
        // flight can never miss one that is about to start.
        let count = gate.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(gate.clone());
        if gate.draining.load(Ordering::SeqCst) {
            drop(guard);
            return refuse(ApiError::NotReady);
        }
        if count >= gate.in_flight_max {
            drop(guard);
            metrics::counter!("boxoffice_gateway_shed_total", "scope" => "gate").increment(1);
            return refuse(ApiError::Overloaded("gate"));
        }
        Box::pin(async move {
            let res = inner.call(req).await;
            drop(guard);
            res.map(|r| {
                let r = undecodable_as_invalid(r);
                metrics::histogram!("boxoffice_rpc_duration_seconds", "method" => method, "code" => code_label(&r))
                    .record(started.elapsed().as_secs_f64());
                r
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
