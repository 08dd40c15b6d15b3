//! # boxoffice-client
//!
//! The typed gRPC client of the `boxoffice.v1` services, as the load tools, the integration
//! tests and the benchmarks use it:
//! - [`Bearer`]: the interceptor that sends `authorization: Bearer <key>` on every call;
//! - [`connect`]: a channel to a server (`http://HOST:PORT`);
//! - [`Clients`]: one client of each service over one channel, with one key;
//! - [`reason`]: the `google.rpc.ErrorInfo` reason an error carries;
//! - [`Retry`]: retries of transient failures ([`is_transient`], [`is_overloaded`]) with
//!   exponential backoff and jitter, for [`Idempotent`] requests only;
//! - [`pow`]: the proof of work before `Join` ([`solve`] a `GetJoinChallenge` answer's
//!   challenge, [`join_request`] puts the solution in the `Join`).

use anyhow::Context;
use boxoffice_proto::v1 as pb;
use tonic::Status;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

mod reason;
mod retry;

pub use reason::reason;
pub use retry::{Idempotent, Retry, is_overloaded, is_transient};

/// The join proof of work of the contract: the hash rule, a checker and the solver.
pub use boxoffice_proto::pow;
pub use boxoffice_proto::pow::solve;

/// A `Join` of `event_id` for `user_id` in `session_id`, carrying the solution of `challenge`
/// (the answer of `GetJoinChallenge` for this event and user). A challenge of difficulty 0 (an
/// event without proof of work) gives a plain `Join`. Solving takes about `2^difficulty_bits`
/// SHA-256 hashes of this thread's time: call it off the async runtime's workers (e.g. in
/// `tokio::task::spawn_blocking`) for hard challenges.
pub fn join_request(
    event_id: &str,
    user_id: &str,
    session_id: &str,
    challenge: &pb::JoinChallenge,
) -> pb::JoinRequest {
    let (join_challenge, pow_nonce) = if challenge.difficulty_bits == 0 {
        (String::new(), 0)
    } else {
        (
            challenge.challenge.clone(),
            solve(&challenge.challenge, challenge.difficulty_bits),
        )
    };
    pb::JoinRequest {
        event_id: event_id.to_owned(),
        user_id: user_id.to_owned(),
        session_id: session_id.to_owned(),
        join_challenge,
        pow_nonce,
    }
}

/// Adds `authorization: Bearer <key>` to every call.
#[derive(Clone)]
pub struct Bearer(MetadataValue<Ascii>);

impl Bearer {
    /// An interceptor for `key`.
    pub fn new(key: &str) -> anyhow::Result<Bearer> {
        Ok(Bearer(
            format!("Bearer {key}")
                .parse()
                .context("the API key must be printable ASCII")?,
        ))
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// A channel with the bearer key on every call.
pub type Authed = InterceptedService<Channel, Bearer>;

/// Clients of every `boxoffice.v1` service over one channel, with one key.
#[derive(Clone)]
pub struct Clients {
    /// EventService.
    pub events: pb::event_service_client::EventServiceClient<Authed>,
    /// WaitingRoomService.
    pub room: pb::waiting_room_service_client::WaitingRoomServiceClient<Authed>,
    /// BookingService.
    pub booking: pb::booking_service_client::BookingServiceClient<Authed>,
    /// WaitlistService.
    pub waitlist: pb::waitlist_service_client::WaitlistServiceClient<Authed>,
    /// ChangeService (an admin or stream key).
    pub changes: pb::change_service_client::ChangeServiceClient<Authed>,
}

impl Clients {
    /// Clients over `ch` sending `key`.
    pub fn new(ch: &Channel, key: &Bearer) -> Clients {
        Clients {
            events: pb::event_service_client::EventServiceClient::with_interceptor(
                ch.clone(),
                key.clone(),
            ),
            room: pb::waiting_room_service_client::WaitingRoomServiceClient::with_interceptor(
                ch.clone(),
                key.clone(),
            ),
            booking: pb::booking_service_client::BookingServiceClient::with_interceptor(
                ch.clone(),
                key.clone(),
            ),
            waitlist: pb::waitlist_service_client::WaitlistServiceClient::with_interceptor(
                ch.clone(),
                key.clone(),
            ),
            changes: pb::change_service_client::ChangeServiceClient::with_interceptor(
                ch.clone(),
                key.clone(),
            ),
        }
    }
}

/// Connects to `target` (`https://HOST:PORT`), trusting the CA certificates of `ca_pem` (PEM):
/// a server started with `--tls-cert`.
pub async fn connect_tls(target: &str, ca_pem: &[u8]) -> anyhow::Result<Channel> {
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca_pem));
    Endpoint::from_shared(target.to_owned())
        .context("bad --target")?
        .tls_config(tls)
        .context("the TLS config")?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to {target}"))
}

/// Connects to `target` (e.g. `http://127.0.0.1:50051`).
pub async fn connect(target: &str) -> anyhow::Result<Channel> {
    Endpoint::from_shared(target.to_owned())
        .context("bad --target")?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to {target}"))
}
