//! Where a run's load goes: an embedded server on loopback, or one already running
//! (`--target`). Shared by `flash-sale` and `sessions`.

use std::path::PathBuf;

use anyhow::Context;
use boxoffice_engine::Durability;
use boxoffice_gateway::server::{self, Running, ServerConfig};
use clap::builder::{PossibleValuesParser, TypedValueParser};

use crate::secret::{self, UsageError};

/// The parser of a `--durability` flag: `sync` or `buffered`.
pub fn durability_parser() -> impl TypedValueParser<Value = Durability> {
    PossibleValuesParser::new(Durability::NAMES).try_map(|s| s.parse::<Durability>())
}

/// The server flags of a run: an embedded server (the default), or `--target`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServerChoice {
    /// Data dir of the embedded server (default: a temporary dir, removed at the end).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// sync: fsync before every acknowledgement (group commit); buffered: for benchmarks only.
    #[arg(
        long,
        default_value_t = Durability::Sync,
        value_parser = durability_parser()
    )]
    pub durability: Durability,
    /// Run against a server already running there (e.g. http://127.0.0.1:50051) instead of an
    /// embedded one; needs `--admin-key` or `--admin-key-file`.
    #[arg(long)]
    pub target: Option<String>,
    /// An admin key of the `--target` server (the run creates its events with it).
    // Old name (hidden, still accepted): `--api-key`.
    #[arg(
        long,
        alias = "api-key",
        env = "BOXOFFICE_ADMIN_KEY",
        hide_env_values = true,
        conflicts_with = "admin_key_file"
    )]
    pub admin_key: Option<String>,
    /// A file holding the admin key of the `--target` server (trailing newline trimmed).
    #[arg(long, env = "BOXOFFICE_ADMIN_KEY_FILE", hide_env_values = true)]
    pub admin_key_file: Option<PathBuf>,
}

/// The server of a run. The embedded one is on loopback with a temporary (or given) data dir, a
/// durable log, a generated admin key, no metrics port and no periodic reconciliation (the run
/// reconciles at its end).
pub(crate) struct Backend {
    /// The embedded server (`None` with `--target`).
    pub server: Option<Running>,
    /// The embedded server's temporary data dir, removed when dropped.
    _temp: Option<tempfile::TempDir>,
    /// `http://HOST:PORT`.
    pub target: String,
    /// An admin key of the server.
    pub admin_key: String,
}

impl ServerChoice {
    /// Connects the choice: starts the embedded server (admin key `embedded_key`, at most
    /// `queue_max` fans per waiting room), or checks that `--target` came with an admin key
    /// (`--admin-key` or `--admin-key-file`; a [`UsageError`] if not, or if the file cannot be
    /// read).
    pub(crate) async fn open(&self, embedded_key: &str, queue_max: u32) -> anyhow::Result<Backend> {
        if let Some(t) = &self.target {
            let key = secret::one(
                "--admin-key-file",
                self.admin_key.clone(),
                self.admin_key_file.as_deref(),
            )?
            .ok_or_else(|| {
                UsageError::new(
                    "--target needs --admin-key or --admin-key-file (an admin key of that server)",
                )
            })?;
            return Ok(Backend {
                server: None,
                _temp: None,
                target: t.clone(),
                admin_key: key,
            });
        }
        let (temp, dir) = match &self.data_dir {
            Some(d) => {
                crate::held::refuse_if_held(d)?;
                (None, d.clone())
            }
            None => {
                let t = tempfile::tempdir().context("creating a temporary data dir")?;
                let dir = t.path().to_path_buf();
                (Some(t), dir)
            }
        };
        let mut secret = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut secret);
        let mut cfg = ServerConfig::new(embedded_key, "embedded-client", &secret);
        cfg.listen = "127.0.0.1:0".parse()?;
        cfg.metrics_listen = None;
        cfg.data_dir = dir;
        cfg.durability = self.durability;
        cfg.in_flight_max = 8_192;
        cfg.queue_max = queue_max;
        cfg.reconcile_every = None;
        let mut server = server::start(cfg)
            .await
            .context("starting the embedded server")?;
        server.wait_ready().await?;
        Ok(Backend {
            target: format!("http://{}", server.addr),
            server: Some(server),
            _temp: temp,
            admin_key: embedded_key.to_owned(),
        })
    }
}
