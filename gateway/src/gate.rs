//! The gate: a tower layer in front of every gRPC service. In this order it
//! 1. lets health checks and reflection through (load balancers and `grpcurl` need no key);
//! 2. answers `UNAVAILABLE` / `NOT_READY` while the server drains for shutdown;
//! 3. authenticates `authorization: Bearer <key>` (SHA-256 of the key compared in constant
//!    time against every configured key): `UNAUTHENTICATED` for no or an unknown key,
//!    `PERMISSION_DENIED` for a client key on an admin RPC;
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

/// The configured API keys (only their SHA-256 digests are kept).
#[derive(Clone, Default)]
pub struct Keys {
    entries: Vec<([u8; 32], Scope)>,
}

impl Keys {
    /// Adds a key with its scope.
    pub fn add(&mut self, key: &str, scope: Scope) {
        self.entries
            .push((Sha256::digest(key.as_bytes()).into(), scope));
    }

    /// The scope of a presented key; every configured key is compared, in constant time.
    pub fn scope_of(&self, presented: &str) -> Option<Scope> {
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

    fn check(&self, req: &http::Request<Body>) -> Result<(), ApiError> {
        if self.draining.load(Ordering::Relaxed) {
            return Err(ApiError::NotReady);
        }
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
        if let Err(e) = gate.check(&req) {
            let res = tonic::Status::from(e).into_http();
            metrics::histogram!("boxoffice_rpc_duration_seconds", "method" => method, "code" => code_label(&res))
                .record(started.elapsed().as_secs_f64());
            return Box::pin(async move { Ok(res) });
        }
        if gate.in_flight.fetch_add(1, Ordering::SeqCst) >= gate.in_flight_max {
            gate.in_flight.fetch_sub(1, Ordering::SeqCst);
            metrics::counter!("boxoffice_gateway_shed_total", "scope" => "gate").increment(1);
            let res = tonic::Status::from(ApiError::Overloaded("gate")).into_http();
            metrics::histogram!("boxoffice_rpc_duration_seconds", "method" => method, "code" => "RESOURCE_EXHAUSTED")
                .record(started.elapsed().as_secs_f64());
            return Box::pin(async move { Ok(res) });
        }
        let guard = InFlight(gate);
        Box::pin(async move {
            let res = inner.call(req).await;
            drop(guard);
            if let Ok(r) = &res {
                metrics::histogram!("boxoffice_rpc_duration_seconds", "method" => method, "code" => code_label(r))
                    .record(started.elapsed().as_secs_f64());
            }
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_scopes() {
        let mut k = Keys::default();
        k.add("adm", Scope::Admin);
        k.add("cli", Scope::Client);
        assert_eq!(k.scope_of("adm"), Some(Scope::Admin));
        assert_eq!(k.scope_of("cli"), Some(Scope::Client));
        assert_eq!(k.scope_of("cl"), None);
        assert_eq!(k.scope_of(""), None);
    }
}
