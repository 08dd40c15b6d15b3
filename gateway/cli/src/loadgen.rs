//! `boxoffice loadgen`: drives a running server (`boxoffice_drill::loadgen`) and prints the
//! throughput and latency of each RPC. Every call of the run is expected to succeed: if any
//! failed, a summary on stderr and exit code 1.

use boxoffice_drill::loadgen::{self, LoadgenArgs};

use crate::exit::Exit;

/// Runs the subcommand; its exit code.
pub async fn run(args: LoadgenArgs) -> anyhow::Result<Exit> {
    let report = loadgen::run(args).await?;
    print!("{report}");
    match report.failures() {
        None => Ok(Exit::Ok),
        Some(what) => {
            crate::exit::error(format_args!("loadgen: FAILED: {what}"));
            Ok(Exit::Failed)
        }
    }
}
