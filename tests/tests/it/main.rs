//! The integration tests of boxoffice, as one test binary (one link instead of one per file).
//! Each module is what used to be a test binary of its own; a test's name is prefixed with its
//! module, e.g. `cargo test -p boxoffice-tests -- grpc::` runs the gRPC contract only.
//!
//! The shared rooms (a real gRPC server that stops on drop, polling with a bound, tables of
//! error cases, child processes for crash tests) live in the `boxoffice_tests` library.

mod batch;
mod browser;
mod cancel;
mod cancellation;
mod changes;
mod changes_api;
mod checkout;
mod cluster;
mod contention;
mod crash_cycles;
mod create_event;
mod damage;
mod edges;
mod faces;
mod grpc;
mod harness;
mod http;
mod kill9;
mod layout;
mod line;
mod metrics;
mod model;
mod monitoring;
mod orders;
mod owners;
mod pow;
mod presale;
mod prices;
mod recovery;
mod refunds;
mod sale;
mod sale_api;
mod seams;
mod seat_maps;
mod sweeper;
mod tickets;
mod transfer;
