//! # boxoffice-drill
//!
//! The load tools of boxoffice, which play fans against a server over real gRPC (through
//! `boxoffice-client`) and check what it promised:
//! - [`flash_sale`]: `boxoffice flash-sale`, the onsale end to end, and its naive baseline;
//! - [`sessions`]: `boxoffice sessions`, 50,000 checkout sessions open at once;
//! - [`loadgen`]: `boxoffice loadgen`, throughput and latency of single RPCs;
//! - [`cluster`]: three `boxoffice serve` processes on loopback for one run (`flash-sale
//!   --nodes 3`), their leader found and killed, their copies checked offline at the end;
//! - [`demo`]: `boxoffice demo`, the race of the dots in a browser (chaos, then the real
//!   engine) and the operations page, on an embedded server;
//! - [`soak`]: `boxoffice soak`, memory and disk over a long run of hold + release cycles
//!   against an in-process engine.
//!
//! Shared by the first two: [`server_choice`] (an embedded server, or `--target`) and
//! [`event`] (the sale's event layout); by `loadgen` and `sessions`, [`measure`] (calls in
//! concurrent streams, their throughput and latency percentiles); by `sessions` and `soak`,
//! [`memory`] (resident memory, a directory's size); by all, [`secret`] (keys given as values
//! or in files, and the usage errors that exit with code 2) and [`signal`] (Ctrl-C or SIGTERM).

pub mod admission;
pub mod changes;
pub mod cluster;
pub mod demo;
pub mod event;
pub mod flash_sale;
pub mod held;
mod json;
pub mod loadgen;
pub mod measure;
pub mod memory;
pub mod secret;
pub mod server_choice;
pub mod sessions;
pub mod signal;
pub mod soak;
