//! `boxoffice reconcile`: the reconciliation of a stopped server's data dir: every sold seat has
//! one order, one claim and one captured payment. Exit code 1 on any finding, 2 (usage) if there
//! is no log to reconcile (a missing dir is an error, not a clean store).

use std::path::PathBuf;

use anyhow::Context;
use boxoffice_drill::secret::UsageError;
use boxoffice_engine::{Engine, EngineConfig};

use crate::exit::Exit;

/// Flags of `boxoffice reconcile`.
#[derive(clap::Args, Debug)]
pub struct ReconcileArgs {
    /// The server's data dir.
    #[arg(long, env = "BOXOFFICE_DATA_DIR", default_value = "boxoffice-data")]
    data_dir: PathBuf,
}

/// Runs the subcommand; its exit code.
pub async fn run(args: ReconcileArgs) -> anyhow::Result<Exit> {
    let data_dir = args.data_dir;
    // A data dir that is not there is an error, never a clean (empty) store.
    if !data_dir.join("db").is_file() {
        return Err(UsageError::new(format!(
            "no boxoffice log in {} (no such dir, or no `db` file in it)",
            data_dir.display()
        ))
        .into());
    }
    boxoffice_drill::held::refuse_if_held(&data_dir)?;
    let engine = Engine::open(EngineConfig::new(&data_dir))
        .await
        .with_context(|| format!("opening {}", data_dir.display()))?;
    let findings = engine.reconcile().await?;
    let orders = engine.orders().await?.len();
    engine.shutdown().await;
    if findings.is_empty() {
        println!(
            "reconciliation clean: {orders} orders, every sold seat has one order, one claim and one captured payment"
        );
        return Ok(Exit::Ok);
    }
    for f in &findings {
        println!("FINDING {}: {f:?}", f.kind());
    }
    println!("{} findings", findings.len());
    Ok(Exit::Failed)
}
