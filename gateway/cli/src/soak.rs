//! `boxoffice soak`: hold + release cycles against an in-process engine, memory and disk
//! measured (`boxoffice_drill::soak`); the restart half runs in a fresh `boxoffice soak
//! --reopen-only` process. Exit code 3 if places leaked, 1 if only cycles failed or memory missed
//! its target.

use std::ffi::OsString;

use anyhow::Context;
use boxoffice_drill::soak::{self, SoakArgs};

use crate::exit::Exit;

/// Runs the subcommand; its exit code.
pub async fn run(args: SoakArgs) -> anyhow::Result<Exit> {
    if args.reopen_only {
        print!("{}", soak::reopen(&args).await?.json());
        return Ok(Exit::Ok);
    }
    let exe = std::env::current_exe().context("finding this program to restart it")?;
    let command = [exe.into_os_string(), OsString::from("soak")];
    let json = args.json.clone();
    let report = soak::run(args, &command).await?;
    print!("{report}");
    let failed = format!("result: FAILED: {}; nothing leaked", report.failures());
    Ok(crate::exit::verdict(
        report.clean(),
        report.promises_kept(),
        [
            "result: nothing held at the end; the counts add up; memory within its target",
            &failed,
            "result: FAILED: the counts do not add up (see above)",
        ],
        json.as_deref().map(|p| (p, report.json())),
    ))
}
