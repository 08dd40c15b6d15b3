//! `boxoffice sessions`: the concurrent checkout sessions (`boxoffice_drill::sessions`); prints
//! the report, exit code 2 if the counts do not add up.

use std::process::ExitCode;

use boxoffice_drill::sessions::{self, SessionsArgs};

/// Runs the subcommand; its exit code.
pub async fn run(args: SessionsArgs) -> anyhow::Result<ExitCode> {
    let report = sessions::run(args).await?;
    print!("{report}");
    Ok(if report.clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}
