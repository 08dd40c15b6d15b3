//! `boxoffice`: the command line of the boxoffice engine. One module per subcommand; this file
//! only parses the command line and dispatches.
//!
//! - `boxoffice serve` ([`serve`]): the gRPC server (every flag also reads a `BOXOFFICE_*`
//!   variable).
//! - `boxoffice flash-sale` ([`flash_sale`]): a flash sale against an embedded engine, checked seat
//!   by seat.
//! - `boxoffice loadgen` ([`loadgen`]): drives a running server and reports throughput and
//!   latency.
//! - `boxoffice sessions` ([`sessions`]): 50,000 checkout sessions holding 200,000 places at once,
//!   measured.
//! - `boxoffice ticket` ([`ticket`]): the e-tickets' public keys, offline verification, and the
//!   rotation of the signing key.
//! - `boxoffice reconcile` ([`reconcile`]): the offline reconciliation of a data dir.
//! - `boxoffice check-log` ([`check_log`]): the offline integrity check of a data dir's log.
//! - `boxoffice soak` ([`soak`]): hold + release cycles against an in-process engine; resident
//!   memory and the data dir's size, also after a restart.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod check_log;
mod flash_sale;
mod loadgen;
mod reconcile;
mod serve;
mod sessions;
mod soak;
mod ticket;

/// glibc's malloc spends a third of a sale's CPU in arena locks and chunk consolidation once a
/// hundred thousand fan tasks allocate across both cores; mimalloc's per-thread heaps do not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "boxoffice",
    version,
    about = "Flash-sale ticket inventory engine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the gRPC server (health and reflection on the same port, metrics on their own).
    Serve(serve::ServeArgs),
    /// Run a flash sale end to end against an embedded engine and check every seat.
    FlashSale(boxoffice_drill::flash_sale::FlashSaleArgs),
    /// Drive a running server with concurrent streams; report throughput and latency.
    Loadgen(boxoffice_drill::loadgen::LoadgenArgs),
    /// Hold 50,000 checkout sessions (200,000 places across events) open at once, then pay or
    /// release them; embedded server by default. Exits 2 if the counts do not add up.
    Sessions(boxoffice_drill::sessions::SessionsArgs),
    /// E-tickets: list the public keys, verify a ticket code offline, or rotate the signing key.
    #[command(subcommand)]
    Ticket(ticket::TicketCommand),
    /// Check sold seats against orders, payments and the backstop (offline: the server must be
    /// stopped). Exits 1 if anything does not add up.
    Reconcile(reconcile::ReconcileArgs),
    /// Check a stopped server's log offline: streams, counts, gaps, checksums, the backstop
    /// against the orders. Exits 0 if whole, 1 on any damage, 2 if the check cannot run.
    CheckLog(check_log::CheckLogArgs),
    /// Hold and release places again and again (1,000,000 cycles by default) against an
    /// in-process engine; report resident memory along the way and after a restart, and the
    /// data dir's size. Exits 2 if the counts do not add up.
    Soak(boxoffice_drill::soak::SoakArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => runtime.block_on(serve::run(args)),
        Command::FlashSale(args) => runtime.block_on(flash_sale::run(args)),
        Command::Loadgen(args) => runtime.block_on(loadgen::run(args)),
        Command::Sessions(args) => runtime.block_on(sessions::run(args)),
        Command::Ticket(command) => runtime.block_on(ticket::run(command)),
        Command::Reconcile(args) => runtime.block_on(reconcile::run(args)),
        Command::CheckLog(args) => return check_log::run(args),
        Command::Soak(args) => runtime.block_on(soak::run(args)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
