//! `boxoffice serve`: the gRPC server with no setup needed (generated keys, a data dir under the
//! current directory), draining on SIGTERM or Ctrl-C. Every flag also reads a `BOXOFFICE_*`
//! variable.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use base64::Engine as _;
use boxoffice_engine::limits::{
    IDEMPOTENCY_WINDOW_MS_DEFAULT, IDEMPOTENCY_WINDOW_MS_MAX, IDEMPOTENCY_WINDOW_MS_MIN,
};
use boxoffice_engine::{Durability, Engine, EngineError, RecoveryMode, StorageError};
use boxoffice_gateway::server::{self, ServerConfig};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use rand::RngCore;

/// Flags of `boxoffice serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
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
        value_delimiter = ',',
        hide_env_values = true
    )]
    admin_keys: Vec<String>,
    /// API key with client scope (repeatable; comma-separated in the variable). None given:
    /// one is generated and printed.
    #[arg(
        long = "client-key",
        env = "BOXOFFICE_CLIENT_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    client_keys: Vec<String>,
    /// Secret that signs queue and admission tokens (and derives shuffle seeds). None given:
    /// a random one, so tokens do not survive a restart.
    #[arg(long, env = "BOXOFFICE_TOKEN_SECRET", hide_env_values = true)]
    token_secret: Option<String>,
    /// sync: fsync (group commit) before every acknowledgement; buffered: benchmarks only,
    /// a crash can lose the last ~500 ms of acknowledged work.
    #[arg(
        long,
        env = "BOXOFFICE_DURABILITY",
        default_value_t = Durability::Sync,
        value_parser = PossibleValuesParser::new(Durability::NAMES).try_map(|s| s.parse::<Durability>())
    )]
    durability: Durability,
    /// Calls in flight at once before the gate sheds with RESOURCE_EXHAUSTED / OVERLOADED.
    #[arg(long, env = "BOXOFFICE_IN_FLIGHT_MAX", default_value_t = 4_096)]
    in_flight_max: usize,
    /// Requests queued per section actor before shedding.
    #[arg(long, env = "BOXOFFICE_SECTION_INFLIGHT_MAX", default_value_t = 10_000)]
    section_inflight_max: usize,
    /// Fans per waiting room before Join answers QUEUE_FULL.
    #[arg(long, env = "BOXOFFICE_QUEUE_MAX", default_value_t = 2_000_000)]
    queue_max: u32,
    /// Seconds a join challenge (the proof of work before Join, for events that ask for one)
    /// stays valid from GetJoinChallenge (1 to 86400).
    #[arg(
        long,
        env = "BOXOFFICE_JOIN_CHALLENGE_TTL_SECONDS",
        default_value_t = boxoffice_gateway::limits::JOIN_CHALLENGE_TTL_MS_DEFAULT / 1000,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    join_challenge_ttl_seconds: u64,
    /// Seconds a shutdown (SIGTERM, Ctrl-C) waits for calls in flight.
    #[arg(long, env = "BOXOFFICE_GRACE_SECONDS", default_value_t = 10)]
    grace_seconds: u64,
    /// Seconds an idempotency key's first answer is replayed, and a released or expired hold
    /// remembered, after it was given or ended (1 to 2592000, 30 days).
    #[arg(
        long,
        env = "BOXOFFICE_IDEMPOTENCY_WINDOW_SECONDS",
        default_value_t = IDEMPOTENCY_WINDOW_MS_DEFAULT / 1000,
        value_parser = clap::value_parser!(u64)
            .range(IDEMPOTENCY_WINDOW_MS_MIN / 1000..=IDEMPOTENCY_WINDOW_MS_MAX / 1000)
    )]
    idempotency_window_seconds: u64,
    /// Seconds between reconciliation runs in the server (0: never).
    #[arg(long, env = "BOXOFFICE_RECONCILE_SECONDS", default_value_t = 60)]
    reconcile_seconds: u64,
    /// Start with a new ticket signing key when the data dir's key is missing although tickets
    /// were sold (those tickets verify only if their public keys are kept in
    /// `ticket-public-keys/`). Without it such a start is refused.
    #[arg(long, env = "BOXOFFICE_NEW_TICKET_KEY")]
    new_ticket_key: bool,
    /// Start even if the log is damaged (records missing or corrupt, claims without orders),
    /// from what is there, and write what was found and done to REPORT_FILE (JSON). Without it
    /// a damaged log refuses to start. Accepted damage is remembered: later starts do not
    /// report it again.
    #[arg(long, env = "BOXOFFICE_ACCEPT_DAMAGE", value_name = "REPORT_FILE")]
    accept_damage: Option<PathBuf>,
}

/// Serves until SIGTERM or Ctrl-C, then drains.
pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let accept_damage = args.accept_damage.clone();
    if let Some(path) = &accept_damage {
        // Fail before touching the log if the report cannot be written.
        std::fs::write(path, b"")
            .with_context(|| format!("--accept-damage: cannot write {}", path.display()))?;
    }
    let config = config(args);
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
            if let Err(e) = r {
                let damaged = e.chain().any(|c| {
                    matches!(
                        c.downcast_ref::<EngineError>(),
                        Some(EngineError::Storage(StorageError::Damaged { .. }))
                    )
                });
                if damaged {
                    eprintln!(
                        "the log in {dir} is damaged and was left as it is: \
                         `boxoffice check-log --data-dir {dir}` lists everything found; \
                         `boxoffice serve --accept-damage REPORT_FILE` starts from what is there",
                        dir = data_dir.display()
                    );
                }
                running.shutdown().await.ok();
                return Err(e.context("recovery failed"));
            }
            if let (Some(path), Some(engine)) = (&accept_damage, running.engine()) {
                write_damage_report(path, &data_dir, &engine)?;
            }
            println!("ready: serving");
        }
        () = shutdown_signal() => {
            println!("signal during recovery: stopping");
            running.shutdown().await?;
            return Ok(ExitCode::SUCCESS);
        }
    }
    shutdown_signal().await;
    println!("draining...");
    running.shutdown().await?;
    println!("stopped; log flushed");
    Ok(ExitCode::SUCCESS)
}

/// Writes what recovery found and did (`--accept-damage`).
fn write_damage_report(path: &Path, data_dir: &Path, engine: &Engine) -> anyhow::Result<()> {
    let findings = engine.recovery_report().integrity;
    let report = crate::check_log::report(data_dir, &findings, "serve --accept-damage");
    std::fs::write(path, format!("{report:#}\n"))
        .with_context(|| format!("writing the damage report {}", path.display()))?;
    if findings.damage.is_empty() {
        println!(
            "accept-damage: the log was whole; report in {}",
            path.display()
        );
    } else {
        println!(
            "accept-damage: started with {} damaged or missing parts accepted; report in {}",
            findings.damage.len(),
            path.display()
        );
    }
    Ok(())
}

/// The server's config from the flags; keys that were not given are generated and printed.
fn config(args: ServeArgs) -> ServerConfig {
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
    let mut config = ServerConfig::new("", "", &secret);
    config.listen = args.listen;
    config.metrics_listen = Some(args.metrics_listen);
    config.data_dir = args.data_dir;
    config.admin_keys = admin_keys;
    config.client_keys = client_keys;
    config.durability = args.durability;
    config.in_flight_max = args.in_flight_max;
    config.section_inflight_max = args.section_inflight_max;
    config.queue_max = args.queue_max;
    config.join_challenge_ttl = Duration::from_secs(args.join_challenge_ttl_seconds);
    config.grace = Duration::from_secs(args.grace_seconds);
    config.idempotency_window = Duration::from_secs(args.idempotency_window_seconds);
    config.reconcile_every =
        (args.reconcile_seconds > 0).then(|| Duration::from_secs(args.reconcile_seconds));
    config.new_ticket_key = args.new_ticket_key;
    if args.accept_damage.is_some() {
        config.recovery_mode = RecoveryMode::AcceptDamage;
    }
    config
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
