//! One table of exit codes for every subcommand ([`Exit`], shown by every `--help`), the end
//! of a drill ([`verdict`]), and the command's own errors and warnings on stderr (text, or log
//! events with `--log-format json`).

use std::fmt::Display;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

/// The end of a drill: prints its verdict (`clean`: all well; `kept`: only calls failed, every
/// promise kept; otherwise a promise broke) with the matching line of `lines`, writes its JSON
/// report if asked, and gives the exit code. A broken promise stays 3 even when the report cannot
/// be written; otherwise an unwritten report is a failure (1).
pub fn verdict(
    clean: bool,
    kept: bool,
    lines: [&str; 3],
    json: Option<(&std::path::Path, String)>,
) -> Exit {
    let (exit, line) = if clean {
        (Exit::Ok, lines[0])
    } else if kept {
        (Exit::Failed, lines[1])
    } else {
        (Exit::BrokenPromise, lines[2])
    };
    println!("{line}");
    if let Some((path, text)) = json
        && let Err(e) = std::fs::write(path, text)
    {
        eprintln!("error: writing {}: {e}", path.display());
        if exit == Exit::Ok {
            return Exit::Failed;
        }
    }
    exit
}

/// The exit codes of every subcommand (the table [`EXIT_CODES`] is in every `--help` and in
/// docs/cli.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// 0: done, nothing found.
    Ok = 0,
    /// 1: findings or failed checks (reconcile's findings, check-log's damage, a ticket that is
    /// not genuine, loadgen's failed calls), or an error while running (a server unreachable, a
    /// file that cannot be written).
    Failed = 1,
    /// 2: usage: a bad flag or value (clap's own errors too), an unreadable or empty key file, a
    /// value and its file both given, nothing to work on (no log in the data dir, the data dir
    /// held by a running server). Nothing was done.
    Usage = 2,
    /// 3: a broken promise: a seat oversold or sold twice, an acknowledged sale lost, places
    /// that do not add up (the checks of flash-sale, sessions and soak).
    BrokenPromise = 3,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}

/// The exit-code table of every subcommand's `--help`.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  ok
  1  findings or failed checks (reconcile findings, check-log damage, a ticket not genuine,
     loadgen calls that failed), or an error while running
  2  usage: a bad flag or value, an unreadable or empty key file, a value and its file both
     given, nothing to work on (no log or ticket keys in the data dir, a server holds it)
  3  a broken promise: a seat oversold or sold twice, an acknowledged sale lost, places that
     do not add up (flash-sale, sessions, soak)";

/// Whether log lines are JSON (`--log-format json`): then the command's own errors and warnings
/// are log events too, so that every stderr line is JSON.
static LOG_JSON: AtomicBool = AtomicBool::new(false);

/// Says on stderr that the command failed: `error: MESSAGE`, or an ERROR event with
/// `--log-format json`.
pub fn error(message: impl Display) {
    if LOG_JSON.load(Ordering::Relaxed) {
        tracing::error!("{message}");
    } else {
        eprintln!("error: {message}");
    }
}

/// Warns on stderr: `warning: MESSAGE`, or a WARN event with `--log-format json`.
pub fn warn(message: impl Display) {
    if LOG_JSON.load(Ordering::Relaxed) {
        tracing::warn!("{message}");
    } else {
        eprintln!("warning: {message}");
    }
}

/// Makes the command's own errors and warnings log events (`--log-format json`).
pub fn log_as_json(json: bool) {
    LOG_JSON.store(json, Ordering::Relaxed);
}

/// The exit code of a subcommand's error: [`Exit::Usage`] for a usage error, else
/// [`Exit::Failed`].
pub fn error_exit(e: &anyhow::Error) -> Exit {
    if boxoffice_drill::secret::is_usage(e) {
        Exit::Usage
    } else {
        Exit::Failed
    }
}
