//! # boxoffice-gateway
//!
//! The front door of boxoffice: the `boxoffice.v1` gRPC services over the engine, the waiting
//! room, authentication, overload shedding, health, reflection and the metrics endpoint. The
//! server library only: the `boxoffice` binary is `gateway/cli`, the typed client
//! `gateway/client` (`boxoffice-client`), the load tools `gateway/drill` (`boxoffice-drill`).
//!
//! ## Layout
//! - [`server`]: the composition of a server: start, drain.
//! - [`config`]: what a server starts with ([`ServerConfig`](config::ServerConfig)).
//! - [`stack`]: what serves an engine: the services' state, the sweeper, the reconciliation.
//! - [`node`]: a cluster node: its Raft groups, the leadership loop, the lease, the Raft
//!   network between nodes ([`node::peers`]) and forwarding to the leader ([`node::forward`]).
//! - [`ticket_keys`]: the ticket signing key a server starts with, and its rotation.
//! - [`gate`]: the tower layer: auth, draining, shedding, RPC metrics.
//! - [`services`]: the four services over one shared [`Api`](services::Api).
//! - [`convert`]: protobuf <-> engine types, validated once at the edge.
//! - [`seat_maps`]: seat maps built once per change of a section, shared and sent pre-encoded,
//!   within a response size limit.
//! - [`status`]: every error's gRPC code and `ErrorInfo` reason.
//! - [`waiting_room`]: the line, the opening shuffle, admission at a rate.
//! - [`tokens`]: HMAC-signed queue and admission tokens (and join challenges).
//! - [`pow`]: the proof of work before `Join`: stateless challenges, checked once each.
//! - [`tickets`]: Ed25519-signed e-ticket codes naming their key, verifiable offline; the key
//!   ring in the data dir and its rotation.
//! - [`metrics`]: the Prometheus endpoint.
//! - [`health`]: `grpc.health.v1.Health` whose watches end when the drain starts.
//! - [`http`]: the HTTP/JSON API (the seeds' REST paths over the same services), its OpenAPI
//!   document.

pub mod certs;
pub mod config;
pub mod convert;
pub mod gate;
pub mod health;
pub mod http;
pub mod limits;
pub mod lists;
pub mod local;
pub mod metrics;
pub mod net;
pub mod node;
pub mod pow;
mod presale;
pub mod seat_maps;
pub mod server;
pub mod services;
pub mod signing;
pub mod stack;
pub mod status;
pub mod ticket_keys;
pub mod tickets;
pub mod tls;
pub mod tokens;
pub mod trace;
pub mod waiting_room;
