//! `boxoffice loadgen`: drives a running server (`boxoffice_drill::loadgen`) and prints the
//! throughput and latency of each RPC.

use std::process::ExitCode;

use boxoffice_drill::loadgen::{self, LoadgenArgs};

/// Runs the subcommand; its exit code.
pub async fn run(args: LoadgenArgs) -> anyhow::Result<ExitCode> {
    let report = loadgen::run(args).await?;
    print!("{report}");
    Ok(ExitCode::SUCCESS)
}
