//! `boxoffice sessions`: the concurrent checkout sessions (`boxoffice_drill::sessions`); prints
//! the report; exit code 3 if the places do not add up, 1 if only calls failed or were refused.

use boxoffice_drill::sessions::{self, SessionsArgs};

use crate::exit::Exit;

/// Runs the subcommand; its exit code.
pub async fn run(args: SessionsArgs) -> anyhow::Result<Exit> {
    let report = sessions::run(args).await?;
    print!("{report}");
    Ok(if report.clean() {
        Exit::Ok
    } else if report.promises_kept() {
        crate::exit::error("FAILED: calls failed or holds were refused (see above)");
        Exit::Failed
    } else {
        crate::exit::error("FAILED: the places do not add up: a broken promise (see above)");
        Exit::BrokenPromise
    })
}
