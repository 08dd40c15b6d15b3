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
//! - `boxoffice completions SHELL`, `boxoffice man` ([`manual`]): the command line for shells
//!   and for `man`, generated from its own definition.
//!
//! One vocabulary across subcommands: the same flag and variable for the same thing (keys as a
//! value or in a `-file`, `-seconds`/`-ms` flags in the unit of their name), one table of exit
//! codes ([`Exit`], shown by every `--help`), logs as text (colour only on a terminal) or JSON
//! (`--log-format json`).

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use exit::{EXIT_CODES, Exit, error, error_exit};

mod changes;
mod check_log;
mod cluster;
mod exit;
mod flash_sale;
mod links;
mod loadgen;
mod manual;
mod reconcile;
mod sale;
mod serve;
mod sessions;
mod soak;
mod ticket;

/// glibc's malloc spends a third of a sale's CPU in arena locks and chunk consolidation once a
/// hundred thousand fan tasks allocate across both cores; mimalloc's per-thread heaps do not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How log lines (stderr) are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines; colour only when stderr is a terminal and NO_COLOR is not set.
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}

#[derive(Parser, Debug)]
#[command(
    name = "boxoffice",
    version,
    about = "Flash-sale ticket inventory engine"
)]
struct Cli {
    /// Log lines on stderr as text or as JSON (one object per line). Levels: RUST_LOG
    /// (default warn, without openraft's routine messages).
    #[arg(
        long,
        global = true,
        env = "BOXOFFICE_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    log_format: LogFormat,
    /// Distributed traces.
    #[command(flatten)]
    otlp: OtlpArgs,
    #[command(subcommand)]
    command: Command,
}

/// Distributed traces: each call's way through the gate, forwarding, the ledger, the section,
/// the group commit, replication and the acker, sent as OpenTelemetry spans over OTLP/gRPC.
/// Off unless an endpoint is given (here or by OTEL_EXPORTER_OTLP_ENDPOINT); the standard
/// OTEL_* variables (OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, OTEL_BSP_*, ...) apply.
#[derive(clap::Args, Debug)]
struct OtlpArgs {
    /// Export traces to this OTLP/gRPC collector, e.g. http://127.0.0.1:4317.
    #[arg(
        long,
        global = true,
        env = "BOXOFFICE_OTLP_ENDPOINT",
        value_name = "URL"
    )]
    otlp_endpoint: Option<String>,
    /// Trace this share (0 to 1) of the calls that come without a trace context; a call whose
    /// caller sent a `traceparent` is traced as its caller decided (parent-based). Default:
    /// OTEL_TRACES_SAMPLER's choice, by default every call.
    #[arg(
        long,
        global = true,
        env = "BOXOFFICE_OTLP_SAMPLE_RATIO",
        value_name = "RATIO"
    )]
    otlp_sample_ratio: Option<f64>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the gRPC server (health and reflection on the same port, metrics on their own).
    Serve(Box<serve::ServeArgs>),
    /// Run a flash sale end to end against an embedded engine and check every seat. Exits 3 if
    /// the sale broke a promise.
    FlashSale(boxoffice_drill::flash_sale::FlashSaleArgs),
    /// Drive a running server with concurrent streams; report throughput and latency. Exits 1
    /// if any call failed.
    Loadgen(boxoffice_drill::loadgen::LoadgenArgs),
    /// Hold 50,000 checkout sessions (200,000 places across events) open at once, then pay or
    /// release them; embedded server by default. Exits 3 if the places do not add up.
    Sessions(boxoffice_drill::sessions::SessionsArgs),
    /// E-tickets: list the public keys, verify a ticket code offline, or rotate the signing key.
    #[command(subcommand)]
    Ticket(ticket::TicketCommand),
    /// A cluster's tools: `certs` makes the cluster's CA and its nodes' certificates for the
    /// peer port's mutual TLS; `status`, `add-node`, `remove-node` and `replace-node` show and
    /// change a running cluster's members.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Steer a live sale on a running server: `pause`, `resume`, `queue-all`, `end`, or `set`
    /// the admission rate, hold TTL and per-user limit (`UpdateSale`, admin key).
    #[command(subcommand)]
    Sale(sale::SaleCommand),
    /// Print a running server's change stream (`WatchChanges`, an admin or stream key), one
    /// JSON object a line: holds, releases, expiries, orders, refunds, waitlist offers, sale
    /// controls, events created. `--follow` keeps reading, across a failover too.
    Changes(changes::ChangesArgs),
    /// Check sold seats against orders, payments and the backstop (offline: the server must be
    /// stopped). Exits 1 if anything does not add up, 2 if there is no log.
    Reconcile(reconcile::ReconcileArgs),
    /// Check a stopped server's log offline: streams, counts, gaps, checksums, the backstop
    /// against the orders. Exits 0 if whole, 1 on any damage, 2 if there is no log to check
    /// (or a server holds it).
    CheckLog(check_log::CheckLogArgs),
    /// Hold and release places again and again (1,000,000 cycles by default) against an
    /// in-process engine; report resident memory along the way and after a restart, and the
    /// data dir's size. Exits 3 if places leaked, 1 if memory missed its target.
    Soak(boxoffice_drill::soak::SoakArgs),
    /// The race of the dots in a browser: an embedded server whose page races fans for seats in
    /// chaos (the naive baseline) and clean (the real engine), with the operations page (/ops)
    /// and the HTTP API on the same port. Runs until Ctrl-C.
    Demo(boxoffice_drill::demo::DemoArgs),
    /// Print a completion script for a shell (bash, zsh, fish, elvish, powershell), e.g.
    /// `boxoffice completions bash > /etc/bash_completion.d/boxoffice`.
    Completions(manual::CompletionsArgs),
    /// Print the man page (roff), or with `--out-dir DIR` write one page for the command and
    /// one for every subcommand (`boxoffice-serve.1`, ...); read one with `man -l FILE`.
    Man(manual::ManArgs),
}

/// The command line with the exit-code table after every (sub)command's help.
fn command() -> clap::Command {
    fn with_exit_codes(cmd: clap::Command) -> clap::Command {
        cmd.after_help(EXIT_CODES).mut_subcommands(with_exit_codes)
    }
    with_exit_codes(Cli::command())
}

/// The log levels when `RUST_LOG` is not set: warnings and errors, but openraft's routine
/// messages are left to `RUST_LOG=openraft=debug`: its warnings (a vote that changed under a
/// message, the back-off from a peer), its replication's errors, and its errors about one peer
/// (events with a `target` field: a failed heartbeat, append or vote request to a peer that is
/// down; see [`about_one_peer`]). A node tells its peers' links itself, once per change
/// (`boxoffice_gateway::node::links`). openraft's other errors (storage, a fatal stop) show.
const DEFAULT_LOG_FILTER: &str = "warn,openraft=error,openraft::replication=off,\
                                  openraft::engine::handler::replication_handler=off";

/// Whether an event is openraft's about one peer (it names the peer in a `target` field).
fn about_one_peer(meta: &tracing::Metadata<'_>) -> bool {
    meta.target().starts_with("openraft") && meta.fields().field("target").is_some()
}

/// Log lines on stderr: `RUST_LOG` levels (default [`DEFAULT_LOG_FILTER`] without openraft's
/// events about one peer), text or JSON; colour only when stderr is a terminal and `NO_COLOR` is
/// unset or empty.
fn init_logging(format: LogFormat, traces: Option<&boxoffice_gateway::trace::Exporter>) {
    use tracing_subscriber::util::SubscriberInitExt;
    exit::log_as_json(format == LogFormat::Json);
    subscriber(format, traces).init();
}

/// The log lines' subscriber, and the traces' layer if they are exported.
fn subscriber(
    format: LogFormat,
    traces: Option<&boxoffice_gateway::trace::Exporter>,
) -> Box<dyn tracing::Subscriber + Send + Sync> {
    use boxoffice_gateway::trace::is_trace_span;
    use tracing_subscriber::filter::{FilterExt, LevelFilter, filter_fn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::{EnvFilter, Layer};
    // A request's spans go to the traces, never to the log lines. The level's cap is kept (a
    // filter_fn has none of its own): without traces, a span or event above it is
    // `Span::none()` after one static check.
    let filter = match EnvFilter::try_from_default_env() {
        Ok(asked) => {
            let cap = asked.max_level_hint();
            let not_traces = filter_fn(|meta| !is_trace_span(meta));
            match cap {
                Some(cap) => asked.and(not_traces.with_max_level_hint(cap)).boxed(),
                None => asked.and(not_traces).boxed(),
            }
        }
        Err(_) => {
            let asked = EnvFilter::new(DEFAULT_LOG_FILTER);
            let cap = asked.max_level_hint().unwrap_or(LevelFilter::TRACE);
            asked
                .and(
                    filter_fn(|meta| !about_one_peer(meta) && !is_trace_span(meta))
                        .with_max_level_hint(cap),
                )
                .boxed()
        }
    };
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let layer = match format {
        LogFormat::Text => layer
            .with_ansi(colour(std::io::stderr().is_terminal()))
            .boxed(),
        LogFormat::Json => layer.json().with_ansi(false).boxed(),
    };
    let logs = tracing_subscriber::registry().with(layer.with_filter(filter));
    // Two stacks, not an empty layer when off: an absent (`None`) layer would make every
    // callsite the log leaves out be asked again at each hit.
    match traces {
        Some(traces) => Box::new(logs.with(traces.layer())),
        None => Box::new(logs),
    }
}

/// What `--otlp-*` ask for; a cluster node names itself by its id (`service.instance.id`).
fn trace_config(cli: &Cli) -> boxoffice_gateway::trace::TraceConfig {
    let instance = match &cli.command {
        Command::Serve(args) => args.node_id().map(|id| id.to_string()),
        _ => None,
    };
    boxoffice_gateway::trace::TraceConfig {
        endpoint: cli.otlp.otlp_endpoint.clone(),
        sample_ratio: cli.otlp.otlp_sample_ratio,
        instance,
    }
}

/// Whether the command runs a server (its own or embedded), whose calls can be traced: only
/// these start the exporter (a bad OTLP variable cannot stop `completions` or `check-log`).
fn runs_a_server(command: &Command) -> bool {
    matches!(
        command,
        Command::Serve(_)
            | Command::FlashSale(_)
            | Command::Sessions(_)
            | Command::Demo(_)
            | Command::Soak(_)
    )
}

/// Whether to colour: on a terminal, unless `NO_COLOR` is set to anything but empty.
fn colour(terminal: bool) -> bool {
    terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// How long the end of the process waits for blocking tasks still running (see `main`).
const RUNTIME_SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn main() -> ExitCode {
    // Before the runtime and the engine allocate: mimalloc's arenas on transparent huge pages
    // cost a success-heavy sale about 40% of its throughput in page zeroing (see the function).
    boxoffice_drill::memory::keep_off_huge_pages();
    let cli = match Cli::from_arg_matches(&command().get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            init_logging(cli.log_format, None);
            error(format_args!("cannot start the runtime: {e}"));
            return Exit::Failed.into();
        }
    };
    // The exporter's gRPC client lives on the runtime.
    let traces = if runs_a_server(&cli.command) {
        let _on = runtime.enter();
        boxoffice_gateway::trace::Exporter::start(&trace_config(&cli))
    } else {
        Ok(None)
    };
    let traces = match traces {
        Ok(traces) => traces,
        Err(e) => {
            init_logging(cli.log_format, None);
            error(format_args!("{e:#}"));
            return Exit::Usage.into();
        }
    };
    init_logging(cli.log_format, traces.as_ref());
    let result = match cli.command {
        Command::Serve(args) => runtime.block_on(serve::run(*args)),
        Command::FlashSale(args) => runtime.block_on(flash_sale::run(args)),
        Command::Loadgen(args) => runtime.block_on(loadgen::run(args)),
        Command::Sessions(args) => runtime.block_on(sessions::run(args)),
        Command::Ticket(command) => runtime.block_on(ticket::run(command)),
        Command::Cluster(command) => runtime.block_on(cluster::run(command)),
        Command::Sale(command) => runtime.block_on(sale::run(command)),
        Command::Changes(args) => runtime.block_on(changes::run(args)),
        Command::Reconcile(args) => runtime.block_on(reconcile::run(args)),
        Command::CheckLog(args) => Ok(check_log::run(args)),
        Command::Soak(args) => runtime.block_on(soak::run(args)),
        Command::Demo(args) => runtime
            .block_on(boxoffice_drill::demo::run(args))
            .map(|()| Exit::Ok),
        Command::Completions(args) => manual::completions(&args, command()),
        Command::Man(args) => manual::man(&args, command()),
    };
    if let Some(traces) = traces {
        // The spans still buffered are sent before the process ends.
        let _on = runtime.enter();
        traces.shutdown();
    }
    // The server's work is done (its engine stopped, its log synced or its store halted); a
    // blocking task still running is one the disk never answered (after a failed write of a
    // large value sled's every later flush waits forever): the process ends all the same,
    // where a plain drop of the runtime would wait for it for good.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_WAIT);
    match result {
        Ok(code) => code.into(),
        Err(e) => {
            error(format_args!("{e:#}"));
            error_exit(&e).into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_the_documented_ones() {
        assert_eq!(Exit::Ok as u8, 0);
        assert_eq!(Exit::Failed as u8, 1);
        assert_eq!(Exit::Usage as u8, 2);
        assert_eq!(Exit::BrokenPromise as u8, 3);
        let usage = anyhow::Error::new(boxoffice_drill::secret::UsageError::new("bad"))
            .context("reading the keys");
        assert_eq!(error_exit(&usage), Exit::Usage);
        assert_eq!(error_exit(&anyhow::anyhow!("unreachable")), Exit::Failed);
        for line in ["0  ok", "1  findings", "2  usage", "3  a broken promise"] {
            assert!(EXIT_CODES.contains(line), "{line}");
        }
    }

    /// One test, not two: tracing keeps each callsite's interest for every live subscriber of
    /// the process, so a test with traces on running beside one with traces off could make the
    /// latter's span merely "sometimes" wanted (CI saw it enabled once). Off first, then on.
    #[tokio::test]
    async fn a_requests_span_is_nothing_without_traces_and_taken_with_them() {
        tracing::subscriber::with_default(subscriber(LogFormat::Text, None), || {
            let span = tracing::info_span!(target: boxoffice_gateway::trace::TARGET, "gate");
            assert!(span.is_disabled());
        });
        let config = boxoffice_gateway::trace::TraceConfig {
            // Nothing listens there; nothing is sent in this test.
            endpoint: Some("http://127.0.0.1:9".into()),
            ..Default::default()
        };
        let traces = boxoffice_gateway::trace::Exporter::start(&config)
            .unwrap()
            .unwrap();
        tracing::subscriber::with_default(subscriber(LogFormat::Text, Some(&traces)), || {
            let span = tracing::info_span!(target: boxoffice_gateway::trace::TARGET, "gate");
            assert!(!span.is_disabled());
            // A span of another target at a level the log leaves out stays nothing.
            assert!(tracing::trace_span!("elsewhere").is_disabled());
        });
    }

    #[test]
    fn no_colour_off_a_terminal() {
        assert!(!colour(false));
    }

    #[test]
    fn the_command_line_is_consistent() {
        command().debug_assert();
    }
}
