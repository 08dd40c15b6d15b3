//! `boxoffice serve`: the gRPC server with no setup needed (generated keys, a data dir under the
//! current directory), draining on SIGTERM or Ctrl-C. Every flag also reads a `BOXOFFICE_*`
//! variable; every key and the token secret can also be given in a file (`--admin-key-file`,
//! `BOXOFFICE_ADMIN_KEY_FILE`, ...), as Docker and Kubernetes mount secrets.
//!
//! Names: the flag and the variable of a key are singular, as the clients' (`--admin-key`,
//! `BOXOFFICE_ADMIN_KEY`); the server takes several: the flag repeated, the variable
//! comma-separated, the file one per line. The old plural variables (`BOXOFFICE_ADMIN_KEYS`,
//! `BOXOFFICE_CLIENT_KEYS`, and their `_FILE`s) and `--section-inflight-max`
//! (`BOXOFFICE_SECTION_INFLIGHT_MAX`) are still read when the canonical names are not given.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use base64::Engine as _;
use boxoffice_drill::secret::{self, UsageError};
use boxoffice_drill::signal::shutdown_signal;
use boxoffice_engine::limits::{
    IDEMPOTENCY_WINDOW_MS_DEFAULT, IDEMPOTENCY_WINDOW_MS_MAX, IDEMPOTENCY_WINDOW_MS_MIN,
};
use boxoffice_engine::{Durability, Engine, EngineError, RecoveryMode, StorageError};
use boxoffice_gateway::limits::REFUND_GRACE_SECONDS_DEFAULT;
use boxoffice_gateway::limits::{SEAT_MAP_BYTES_DEFAULT, SEAT_MAP_BYTES_MAX, SEAT_MAP_BYTES_MIN};
use boxoffice_gateway::server::{self, ServerConfig};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use rand::RngCore;

use crate::exit::Exit;

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
    /// Serve the CPU profile (`GET /debug/pprof/profile`, admin key) on a metrics address that
    /// is not loopback too: the admin key then crosses that network in plain HTTP. On loopback
    /// it is always served.
    #[arg(long, env = "BOXOFFICE_METRICS_PPROF")]
    metrics_pprof: bool,
    /// Address of the HTTP/JSON API (the seeds' REST paths, `/v1/openapi.json`); off unless
    /// given.
    #[arg(long, env = "BOXOFFICE_HTTP_LISTEN")]
    http_listen: Option<SocketAddr>,
    /// Data dir of the write-ahead log (created if missing; replayed on start).
    #[arg(long, env = "BOXOFFICE_DATA_DIR", default_value = "boxoffice-data")]
    data_dir: PathBuf,
    /// API key with admin scope (repeatable; comma-separated in the variable). None given
    /// (nor a file): one is generated and printed.
    #[arg(
        long = "admin-key",
        env = "BOXOFFICE_ADMIN_KEY",
        value_delimiter = ',',
        hide_env_values = true,
        conflicts_with = "admin_key_file"
    )]
    admin_keys: Vec<String>,
    /// A file of API keys with admin scope, one per line.
    #[arg(long, env = "BOXOFFICE_ADMIN_KEY_FILE", hide_env_values = true)]
    admin_key_file: Option<PathBuf>,
    /// API key with client scope (repeatable; comma-separated in the variable). None given
    /// (nor a file): one is generated and printed.
    #[arg(
        long = "client-key",
        env = "BOXOFFICE_CLIENT_KEY",
        value_delimiter = ',',
        hide_env_values = true,
        conflicts_with = "client_key_file"
    )]
    client_keys: Vec<String>,
    /// A file of API keys with client scope, one per line.
    #[arg(long, env = "BOXOFFICE_CLIENT_KEY_FILE", hide_env_values = true)]
    client_key_file: Option<PathBuf>,
    /// API key with stream scope: the change stream (`ChangeService`) and nothing else
    /// (repeatable; comma-separated in the variable). None by default.
    #[arg(
        long = "stream-key",
        env = "BOXOFFICE_STREAM_KEY",
        value_delimiter = ',',
        hide_env_values = true,
        conflicts_with = "stream_key_file"
    )]
    stream_keys: Vec<String>,
    /// A file of API keys with stream scope, one per line.
    #[arg(long, env = "BOXOFFICE_STREAM_KEY_FILE", hide_env_values = true)]
    stream_key_file: Option<PathBuf>,
    /// How long the change stream keeps a change, seconds (a cursor older than this is
    /// CURSOR_EXPIRED).
    #[arg(
        long,
        env = "BOXOFFICE_CHANGE_RETENTION_SECONDS",
        default_value_t = boxoffice_engine::limits::CHANGE_RETENTION_MS_DEFAULT / 1000,
        value_parser = clap::value_parser!(u64).range(1..=30 * 86_400)
    )]
    change_retention_seconds: u64,
    /// Secret that signs queue and admission tokens (and derives shuffle seeds). None given
    /// (nor a file): a random one, so tokens do not survive a restart.
    #[arg(
        long,
        env = "BOXOFFICE_TOKEN_SECRET",
        hide_env_values = true,
        conflicts_with = "token_secret_file"
    )]
    token_secret: Option<String>,
    /// A file holding the token secret (trailing newline trimmed).
    #[arg(long, env = "BOXOFFICE_TOKEN_SECRET_FILE", hide_env_values = true)]
    token_secret_file: Option<PathBuf>,
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
    /// Requests queued per section actor before shedding [default: 10000].
    #[arg(
        long,
        alias = "section-inflight-max",
        env = "BOXOFFICE_SECTION_IN_FLIGHT_MAX"
    )]
    section_in_flight_max: Option<usize>,
    /// Fans per waiting room before Join answers QUEUE_FULL.
    #[arg(long, env = "BOXOFFICE_QUEUE_MAX", default_value_t = 2_000_000)]
    queue_max: u32,
    /// Largest GetSeatMap response, bytes (262144 to 67108864). A whole-event map over it is
    /// refused with RESOURCE_EXHAUSTED / SEAT_MAP_TOO_LARGE; one section is answered in pages
    /// of whole rows within it.
    #[arg(
        long,
        env = "BOXOFFICE_SEAT_MAP_MAX_BYTES",
        default_value_t = SEAT_MAP_BYTES_DEFAULT,
        value_parser = clap::value_parser!(u64)
            .range(SEAT_MAP_BYTES_MIN as u64..=SEAT_MAP_BYTES_MAX as u64)
            .try_map(usize::try_from)
    )]
    seat_map_max_bytes: usize,
    /// Seconds a join challenge (the proof of work before Join, for events that ask for one)
    /// stays valid from GetJoinChallenge (1 to 86400).
    #[arg(
        long,
        env = "BOXOFFICE_JOIN_CHALLENGE_TTL_SECONDS",
        default_value_t = boxoffice_gateway::limits::JOIN_CHALLENGE_TTL_MS_DEFAULT / 1000,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    join_challenge_ttl_seconds: u64,
    /// Seconds a sync of the log may run before the disk counts as stalled and the process
    /// exits 1, to be restarted (a cluster's other nodes go on without it); 0: never.
    #[arg(long, env = "BOXOFFICE_DISK_STALL_SECONDS", default_value_t = 20)]
    disk_stall_seconds: u64,
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
    /// Seconds a captured charge stays without a sale (its hold released or expired, no order
    /// paid by it) before the reconciliation pass refunds it.
    #[arg(long, env = "BOXOFFICE_REFUND_GRACE_SECONDS", default_value_t = REFUND_GRACE_SECONDS_DEFAULT)]
    refund_grace_seconds: u64,
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
    /// TLS on the public ports.
    #[command(flatten)]
    tls: crate::links::TlsArgs,
    /// A cluster node's flags.
    #[command(flatten)]
    cluster: crate::links::ClusterArgs,
}

impl ServeArgs {
    /// This node's id in its cluster, if it is a cluster node.
    pub fn node_id(&self) -> Option<u64> {
        self.cluster.node_id
    }
}

/// Serves until SIGTERM or Ctrl-C, then drains.
pub async fn run(args: ServeArgs) -> anyhow::Result<Exit> {
    // Keys and flags first: a usage error opens nothing.
    let accept_damage = args.accept_damage.clone();
    let stall = args.disk_stall_seconds;
    let config = config(args)?;
    if stall > 0 {
        // Before the first read of the log: a start can stall as well.
        boxoffice_engine::store::watch_disk_stalls(Duration::from_secs(stall), move |age| {
            let what = format!(
                "the disk stalled: a sync of the log has not returned in {:.1} s \
                 (--disk-stall-seconds {stall}); exiting, nothing it held was acknowledged",
                age.as_secs_f64()
            );
            tracing::error!("{what}");
            eprintln!("error: {what}");
            std::process::exit(1);
        });
    }
    // A data dir another process holds: said at once, naming it (not after the log's wait).
    boxoffice_drill::held::refuse_if_held(&config.data_dir)?;
    if let Some(path) = &accept_damage {
        // Fail before touching the log if the report cannot be written.
        std::fs::write(path, b"").map_err(|e| {
            UsageError::new(format!(
                "--accept-damage: cannot write {}: {e}",
                path.display()
            ))
        })?;
    }
    let data_dir = config.data_dir.clone();
    let mut running = server::start(config).await?;
    say_where(&running, &data_dir);
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
                    crate::exit::error(format_args!(
                        "the log in {dir} is damaged and was left as it is: \
                         `boxoffice check-log --data-dir {dir}` lists everything found; \
                         `boxoffice serve --accept-damage REPORT_FILE` starts from what is there",
                        dir = data_dir.display()
                    ));
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
            return Ok(Exit::Ok);
        }
    }
    tokio::select! {
        () = shutdown_signal() => {}
        why = running.failed() => {
            // A node that left its group serves nothing: it exits non-zero, so that its
            // supervisor (systemd's Restart=on-failure, an orchestrator) starts it again.
            running.shutdown().await.ok();
            anyhow::bail!("this node left its cluster group: {why}; restart it");
        }
    }
    println!("draining...");
    running.shutdown().await?;
    println!("stopped; log flushed");
    Ok(Exit::Ok)
}

/// Says where the server listens and what it recovers.
fn say_where(running: &server::Running, data_dir: &Path) {
    println!(
        "gRPC listening on {} (health and reflection too)",
        running.addr
    );
    if let Some(m) = running.metrics_addr {
        println!("metrics on {}", boxoffice_gateway::metrics::describe(m));
    }
    if let Some(h) = running.http_addr {
        println!("HTTP API on http://{h}/v1 (OpenAPI at http://{h}/v1/openapi.json)");
    }
    println!("data dir {}; recovering...", data_dir.display());
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

/// Default of `--section-in-flight-max`.
const SECTION_IN_FLIGHT_MAX_DEFAULT: usize = 10_000;

/// Keys of one scope: the canonical flag, variable or file, else the old plural variables
/// `old_var` / `old_file_var`.
fn keys(
    file_flag: &str,
    values: Vec<String>,
    file: Option<PathBuf>,
    old_var: &str,
    old_file_var: &str,
) -> Result<Vec<String>, UsageError> {
    let (values, file) = if values.is_empty() && file.is_none() {
        secret::legacy_pair(old_var, old_file_var)?
    } else {
        (values, file)
    };
    secret::many(file_flag, values, file.as_deref())
}

/// `--section-in-flight-max`, else the old `BOXOFFICE_SECTION_INFLIGHT_MAX`, else the default.
fn section_in_flight_max(given: Option<usize>) -> Result<usize, UsageError> {
    if let Some(n) = given {
        return Ok(n);
    }
    match secret::legacy_env("BOXOFFICE_SECTION_INFLIGHT_MAX") {
        None => Ok(SECTION_IN_FLIGHT_MAX_DEFAULT),
        Some(v) => v.trim().parse().map_err(|_| {
            UsageError::new(format!(
                "BOXOFFICE_SECTION_INFLIGHT_MAX (now --section-in-flight-max): {v:?} is not a count"
            ))
        }),
    }
}

/// The server's config from the flags; keys that were not given are generated and printed. A
/// key file that cannot be read, or old and new names that disagree, is a [`UsageError`].
fn config(args: ServeArgs) -> Result<ServerConfig, UsageError> {
    let mut admin_keys = keys(
        "--admin-key-file",
        args.admin_keys,
        args.admin_key_file,
        "BOXOFFICE_ADMIN_KEYS",
        "BOXOFFICE_ADMIN_KEYS_FILE",
    )?;
    let mut client_keys = keys(
        "--client-key-file",
        args.client_keys,
        args.client_key_file,
        "BOXOFFICE_CLIENT_KEYS",
        "BOXOFFICE_CLIENT_KEYS_FILE",
    )?;
    let stream_keys = secret::many(
        "--stream-key-file",
        args.stream_keys,
        args.stream_key_file.as_deref(),
    )?;
    let token_secret = secret::one(
        "--token-secret-file",
        args.token_secret,
        args.token_secret_file.as_deref(),
    )?;
    let section_in_flight_max = section_in_flight_max(args.section_in_flight_max)?;
    let tls = crate::links::public_tls(args.tls)?;
    let cluster = crate::links::cluster_config(
        args.cluster,
        !admin_keys.is_empty()
            && !client_keys.is_empty()
            && token_secret.as_ref().is_some_and(|s| !s.is_empty()),
        tls.is_some(),
    )?;
    let secret = generate_missing(&mut admin_keys, &mut client_keys, token_secret);
    let mut config = ServerConfig::new("", "", &secret);
    config.listen = args.listen;
    config.metrics_listen = Some(args.metrics_listen);
    config.metrics_pprof = args.metrics_pprof;
    config.http_listen = args.http_listen;
    config.data_dir = args.data_dir;
    config.admin_keys = admin_keys;
    config.client_keys = client_keys;
    config.stream_keys = stream_keys;
    config.change_retention = Duration::from_secs(args.change_retention_seconds);
    config.durability = args.durability;
    config.in_flight_max = args.in_flight_max;
    config.section_inflight_max = section_in_flight_max;
    config.queue_max = args.queue_max;
    config.seat_map_max_bytes = args.seat_map_max_bytes;
    config.join_challenge_ttl = Duration::from_secs(args.join_challenge_ttl_seconds);
    config.grace = Duration::from_secs(args.grace_seconds);
    config.idempotency_window = Duration::from_secs(args.idempotency_window_seconds);
    config.refund_grace = Duration::from_secs(args.refund_grace_seconds);
    config.reconcile_every =
        (args.reconcile_seconds > 0).then(|| Duration::from_secs(args.reconcile_seconds));
    config.new_ticket_key = args.new_ticket_key;
    config.cluster = cluster;
    config.tls = tls;
    if args.accept_damage.is_some() {
        config.recovery_mode = RecoveryMode::AcceptDamage;
    }
    Ok(config)
}

/// Keys that were not given are generated and printed; a token secret that was not given is
/// random (and said so): the token secret.
fn generate_missing(
    admin_keys: &mut Vec<String>,
    client_keys: &mut Vec<String>,
    token_secret: Option<String>,
) -> Vec<u8> {
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
    match token_secret {
        Some(s) if !s.is_empty() => s.into_bytes(),
        _ => {
            crate::exit::warn(
                "no --token-secret: using a random one; tokens will not survive a restart",
            );
            random_text(32).into_bytes()
        }
    }
}

fn random_text(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut b);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}
