//! `boxoffice check-log`: verifies a stopped server's data dir offline: every stream against the
//! superblock's high-water marks (missing tails, gaps, checksums, records that do not fit), the
//! sold-seat claims against the orders. Nothing in the data dir is changed: the check runs on a
//! copy (sled's own start-up may rewrite its files).
//!
//! Exit codes (the table of every subcommand, [`crate::exit::Exit`]): 0 the log is whole, 1 damage
//! found (each named) or the check failed while running (the copy, or sled cannot open the
//! log), 2 there is nothing to check (no such dir, no log in it, a server holds it). A missing
//! dir is an error, never a clean store.
//!
//! The same report, as JSON, is what `serve --accept-damage REPORT_FILE` writes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use boxoffice_drill::secret::UsageError;
use boxoffice_engine::{Findings, SledSink, verify_log};

use crate::exit::Exit;

/// Flags of `boxoffice check-log`.
#[derive(clap::Args, Debug)]
pub struct CheckLogArgs {
    /// The data dir to check (a stopped server's).
    #[arg(long, env = "BOXOFFICE_DATA_DIR")]
    data_dir: PathBuf,
    /// The report as JSON: `--json` alone prints it instead of the text; `--json FILE` prints
    /// the text and also writes the JSON to FILE, as the drills' `--json FILE` do.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    json: Option<PathBuf>,
}

/// Runs the subcommand; its exit code.
pub fn run(args: CheckLogArgs) -> Exit {
    match check(&args.data_dir) {
        Err(e) => {
            crate::exit::error(format_args!(
                "cannot check {}: {e:#}",
                args.data_dir.display()
            ));
            crate::exit::error_exit(&e)
        }
        Ok(findings) => {
            match &args.json {
                Some(path) if path.as_os_str() == "-" => {
                    println!("{:#}", report(&args.data_dir, &findings, "check-log"));
                }
                Some(path) => {
                    print_text(&findings);
                    let json = report(&args.data_dir, &findings, "check-log");
                    if let Err(e) = std::fs::write(path, format!("{json:#}\n")) {
                        crate::exit::error(format_args!("writing {}: {e}", path.display()));
                        return Exit::Failed;
                    }
                }
                None => print_text(&findings),
            }
            if findings.damage.is_empty() {
                Exit::Ok
            } else {
                Exit::Failed
            }
        }
    }
}

/// Checks `data_dir` on a copy; errors if the check cannot run (a [`UsageError`] when there is
/// nothing to check).
fn check(data_dir: &Path) -> anyhow::Result<Findings> {
    if !data_dir.is_dir() {
        return Err(UsageError::new("no data dir there").into());
    }
    let db = data_dir.join("db");
    if !db.is_file() {
        return Err(UsageError::new("no boxoffice log in it (no `db` file)").into());
    }
    // sled holds an exclusive flock on `db` while a server runs: refuse rather than copy a log
    // that is being written (naming the holder, where the system says).
    boxoffice_drill::held::refuse_if_held(data_dir)?;
    // The lock is held until the copy is made: a server starting meanwhile waits for it.
    let file = std::fs::File::open(&db).with_context(|| format!("opening {}", db.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(UsageError::new("a running server holds it: stop the server first").into());
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e).context("locking `db`"),
    }
    let copy = tempfile::Builder::new()
        .prefix("boxoffice-check-log-")
        .tempdir()
        .context("making a temporary dir for the copy")?;
    copy_dir(data_dir, copy.path()).context("copying the data dir")?;
    file.unlock().context("releasing the lock")?;
    let sink = SledSink::open_without_evidence(copy.path(), Duration::from_secs(5))
        .map_err(|e| anyhow::anyhow!("sled cannot open the log: {e}"))?;
    verify_log(&sink).map_err(|e| anyhow::anyhow!("reading the log: {e}"))
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

fn print_text(f: &Findings) {
    println!(
        "{:<40} {:>12} {:>10} {:>10} {:>14}",
        "stream", "checkpoint", "records", "last", "acknowledged"
    );
    for s in &f.streams {
        let checkpoint = s
            .checkpoint
            .map_or_else(|| "-".to_owned(), |c| c.to_string());
        println!(
            "{:<40} {:>12} {:>10} {:>10} {:>14}",
            s.stream, checkpoint, s.records, s.last, s.acknowledged
        );
    }
    println!(
        "sold-seat claims: {} ({} set aside by earlier recoveries)",
        f.claims, f.claims_set_aside
    );
    for n in &f.notes {
        println!("note: {n}");
    }
    for a in &f.actions {
        println!("a start would: {a}");
    }
    if f.damage.is_empty() {
        println!("the log is whole: every acknowledged record is present");
    } else {
        for d in &f.damage {
            println!("DAMAGE: {d}");
        }
        println!(
            "{} damaged or missing parts; a server refuses to start on this log \
             (`serve --accept-damage REPORT_FILE` starts from what is there)",
            f.damage.len()
        );
    }
}

/// The report of an integrity check as JSON: what was found (each damage with its message),
/// what was done, every stream. `by` says which command wrote it.
pub fn report(data_dir: &Path, f: &Findings, by: &str) -> serde_json::Value {
    let damage: Vec<serde_json::Value> = f
        .damage
        .iter()
        .map(|d| {
            let mut v = serde_json::to_value(d).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("message".into(), d.to_string().into());
            }
            v
        })
        .collect();
    serde_json::json!({
        "by": by,
        "data_dir": data_dir.display().to_string(),
        "written_at_ms": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        "whole": f.damage.is_empty(),
        "damage": damage,
        "actions": f.actions,
        "notes": f.notes,
        "streams": f.streams,
        "claims": f.claims,
        "claims_set_aside": f.claims_set_aside,
    })
}
