//! `boxoffice`: the command line of the boxoffice engine.
//!
//! - `boxoffice serve`: the gRPC server (every flag also reads a `BOXOFFICE_*` variable).
//! - `boxoffice flash-sale`: a flash sale against an embedded engine, checked seat by seat.
//! - `boxoffice loadgen`: drives a running server and reports throughput and latency.
//! - `boxoffice sessions`: 50,000 checkout sessions holding 200,000 places at once, measured.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use base64::Engine as _;
use boxoffice_drill::{flash_sale, loadgen, sessions};
use boxoffice_engine::Durability;
use boxoffice_gateway::server;
use clap::{Parser, Subcommand};
use rand::RngCore;

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
    Serve(ServeArgs),
    /// Run a flash sale end to end against an embedded engine and check every seat.
    FlashSale(flash_sale::FlashSaleArgs),
    /// Drive a running server with concurrent streams; report throughput and latency.
    Loadgen(loadgen::LoadgenArgs),
    /// Hold 50,000 checkout sessions (200,000 places across events) open at once, then pay or
    /// release them; embedded server by default. Exits 2 if the counts do not add up.
    Sessions(sessions::SessionsArgs),
    /// E-tickets: print the public key, or verify a ticket code offline.
    #[command(subcommand)]
    Ticket(TicketCommand),
    /// Check sold seats against orders, payments and the backstop (offline: the server must be
    /// stopped). Exits 1 if anything does not add up.
    Reconcile {
        /// The server's data dir.
        #[arg(long, env = "BOXOFFICE_DATA_DIR", default_value = "boxoffice-data")]
        data_dir: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum TicketCommand {
    /// Print the public key door scanners verify ticket codes with (hex).
    PublicKey {
        /// The server's data dir (where `ticket-signing.key` is).
        #[arg(long, env = "BOXOFFICE_DATA_DIR", default_value = "boxoffice-data")]
        data_dir: PathBuf,
    },
    /// Verify a ticket code offline; prints what it says, exits 1 if it is not genuine.
    Verify {
        /// The code, as `Ticket.code` shows it.
        code: String,
        /// The public key (hex); without it, the one of `--data-dir`.
        #[arg(long)]
        public_key: Option<String>,
        /// The server's data dir (used when no `--public-key` is given).
        #[arg(long, env = "BOXOFFICE_DATA_DIR", default_value = "boxoffice-data")]
        data_dir: PathBuf,
    },
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// gRPC address to listen on.
    #[arg(long, env = "BOXOFFICE_LISTEN", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Metrics (Prometheus text, GET /metrics) address to listen on.
    #[arg(
        long,
        env = "BOXOFFICE_METRICS_LISTEN",
        default_value = "127.0.0.1:9464"
    )]
    metrics_listen: SocketAddr,
    /// Data dir of the write-ahead log (created if missing; replayed on start).
    #[arg(long, env = "BOXOFFICE_DATA_DIR", default_value = "boxoffice-data")]
    data_dir: PathBuf,
    /// API key with admin scope (repeatable; comma-separated in the variable). None given:
    /// one is generated and printed.
    #[arg(
        long = "admin-key",
        env = "BOXOFFICE_ADMIN_KEYS",
        value_delimiter = ','
    )]
    admin_keys: Vec<String>,
    /// API key with client scope (repeatable; comma-separated in the variable). None given:
    /// one is generated and printed.
    #[arg(
        long = "client-key",
        env = "BOXOFFICE_CLIENT_KEYS",
        value_delimiter = ','
    )]
    client_keys: Vec<String>,
    /// Secret that signs queue and admission tokens (and derives shuffle seeds). None given:
    /// a random one, so tokens do not survive a restart.
    #[arg(long, env = "BOXOFFICE_TOKEN_SECRET", hide_env_values = true)]
    token_secret: Option<String>,
    /// sync: fsync (group commit) before every acknowledgement; buffered: benchmarks only,
    /// a crash can lose the last ~500 ms of acknowledged work.
    #[arg(long, env = "BOXOFFICE_DURABILITY", default_value = "sync", value_parser = ["sync", "buffered"])]
    durability: String,
    /// Calls in flight at once before the gate sheds with RESOURCE_EXHAUSTED / OVERLOADED.
    #[arg(long, env = "BOXOFFICE_IN_FLIGHT_MAX", default_value_t = 4_096)]
    in_flight_max: usize,
    /// Requests queued per section actor before shedding.
    #[arg(long, env = "BOXOFFICE_SECTION_INFLIGHT_MAX", default_value_t = 10_000)]
    section_inflight_max: usize,
    /// Fans per waiting room before Join answers QUEUE_FULL.
    #[arg(long, env = "BOXOFFICE_QUEUE_MAX", default_value_t = 2_000_000)]
    queue_max: u32,
    /// Seconds a shutdown (SIGTERM, Ctrl-C) waits for calls in flight.
    #[arg(long, env = "BOXOFFICE_GRACE_SECONDS", default_value_t = 10)]
    grace_seconds: u64,
    /// Seconds between reconciliation runs in the server (0: never).
    #[arg(long, env = "BOXOFFICE_RECONCILE_SECONDS", default_value_t = 60)]
    reconcile_seconds: u64,
}

fn random_text(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut b);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut admin_keys = args.admin_keys;
    let mut client_keys = args.client_keys;
    if admin_keys.is_empty() {
        let k = format!("adm_{}", random_text(18));
        println!("generated admin key:  {k}");
        admin_keys.push(k);
    }
    if client_keys.is_empty() {
        let k = format!("cli_{}", random_text(18));
        println!("generated client key: {k}");
        client_keys.push(k);
    }
    let secret = match args.token_secret {
        Some(s) if !s.is_empty() => s.into_bytes(),
        _ => {
            eprintln!(
                "warning: no --token-secret: using a random one; tokens will not survive a restart"
            );
            random_text(32).into_bytes()
        }
    };
    let mut config = server::ServerConfig::new("", "", &secret);
    config.listen = args.listen;
    config.metrics_listen = Some(args.metrics_listen);
    config.data_dir = args.data_dir;
    config.admin_keys = admin_keys;
    config.client_keys = client_keys;
    config.durability = if args.durability == "buffered" {
        Durability::Buffered
    } else {
        Durability::Sync
    };
    config.in_flight_max = args.in_flight_max;
    config.section_inflight_max = args.section_inflight_max;
    config.queue_max = args.queue_max;
    config.grace = Duration::from_secs(args.grace_seconds);
    config.reconcile_every =
        (args.reconcile_seconds > 0).then(|| Duration::from_secs(args.reconcile_seconds));
    let data_dir = config.data_dir.clone();
    let mut running = server::start(config).await?;
    println!(
        "gRPC listening on {} (health and reflection too)",
        running.addr
    );
    if let Some(m) = running.metrics_addr {
        println!("metrics on {}", boxoffice_gateway::metrics::describe(m));
    }
    println!("data dir {}; recovering...", data_dir.display());
    tokio::select! {
        r = running.wait_ready() => {
            r.context("recovery failed")?;
            println!("ready: serving");
        }
        () = shutdown_signal() => {
            println!("signal during recovery: stopping");
            return running.shutdown().await;
        }
    }
    shutdown_signal().await;
    println!("draining...");
    running.shutdown().await?;
    println!("stopped; log flushed");
    Ok(())
}

fn verify_ticket(
    code: &str,
    key: Option<String>,
    data_dir: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    use boxoffice_gateway::tickets;
    let hex_key = match key {
        Some(k) => k,
        None => tickets::TicketSigner::load(data_dir)?.public_key_hex(),
    };
    let key = tickets::public_key(&hex_key).map_err(anyhow::Error::from)?;
    match tickets::verify(code, &key) {
        Ok(t) => {
            println!("valid ticket");
            println!("event   {}", t.event_id);
            println!("section {}", t.section_id);
            println!(
                "seat    {}",
                if t.seat_id.is_empty() {
                    "(general admission)"
                } else {
                    &t.seat_id
                }
            );
            println!("order   {}", t.order_id);
            println!("ticket  {}", t.ticket_id);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("NOT VALID: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn reconcile(data_dir: PathBuf) -> anyhow::Result<ExitCode> {
    let engine = boxoffice_engine::Engine::open(boxoffice_engine::EngineConfig::new(&data_dir))
        .await
        .with_context(|| format!("opening {}", data_dir.display()))?;
    let findings = engine.reconcile().await?;
    let orders = engine.orders().await?.len();
    engine.shutdown().await;
    if findings.is_empty() {
        println!(
            "reconciliation clean: {orders} orders, every sold seat has one order, one claim and one captured payment"
        );
        return Ok(ExitCode::SUCCESS);
    }
    for f in &findings {
        println!("FINDING {}: {f:?}", f.kind());
    }
    println!("{} findings", findings.len());
    Ok(ExitCode::FAILURE)
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
        Command::Ticket(TicketCommand::PublicKey { data_dir }) => {
            boxoffice_gateway::tickets::TicketSigner::load(&data_dir).map(|s| {
                println!("{}", s.public_key_hex());
                ExitCode::SUCCESS
            })
        }
        Command::Ticket(TicketCommand::Verify {
            code,
            public_key,
            data_dir,
        }) => verify_ticket(&code, public_key, &data_dir),
        Command::Reconcile { data_dir } => runtime.block_on(reconcile(data_dir)),
        Command::Serve(args) => runtime.block_on(serve(args)).map(|()| ExitCode::SUCCESS),
        Command::Loadgen(args) => runtime.block_on(loadgen::run(args)).map(|report| {
            print!("{report}");
            ExitCode::SUCCESS
        }),
        Command::Sessions(args) => runtime.block_on(sessions::run(args)).map(|report| {
            print!("{report}");
            if report.clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            }
        }),
        Command::FlashSale(args) => {
            let json = args.json.clone();
            runtime.block_on(flash_sale::run(args)).and_then(|report| {
                print!("{}", report.table());
                if let Some(path) = json {
                    std::fs::write(&path, report.json())
                        .with_context(|| format!("writing {}", path.display()))?;
                }
                if report.clean() {
                    println!("result: every seat sold at most once; counters add up");
                    Ok(ExitCode::SUCCESS)
                } else {
                    println!("result: FAILED: the sale broke a promise (see above)");
                    Ok(ExitCode::from(2))
                }
            })
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
