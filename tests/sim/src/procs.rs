//! Many seeds on many cores: worker processes, each a copy of the test binary running its share
//! of the seeds one at a time.
//!
//! Runs in one process take turns (tokio numbers tasks process-wide, and the numbers decide the
//! order in which a dead node's tasks are dropped: see [`crate::run`]), so the cores are used by
//! processes instead of threads. A worker is the same test, started again with
//! [`SEEDS_VAR`] naming its seeds; it sends each run's [`Report`] (without its trace) back on
//! its standard output, one line each, as soon as the run ends, so the parent can stop early
//! (the bug hunt stops at its first catch).

use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use crate::Report;

/// The variable that makes a test process a worker: the seeds it runs, comma-separated.
pub const SEEDS_VAR: &str = "BOXOFFICE_SIM_WORKER_SEEDS";
/// The start of a summary's line on a worker's standard output.
const PREFIX: &str = "@boxoffice-sim-summary ";

/// The seeds this process runs as a worker, if it is one.
pub fn worker_seeds() -> Option<Vec<u64>> {
    let list = std::env::var(SEEDS_VAR).ok()?;
    Some(
        list.split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse()
                    .unwrap_or_else(|_| panic!("{SEEDS_VAR} holds seeds, not `{s}`"))
            })
            .collect(),
    )
}

/// In a worker: sends one run's summary to the parent (and, with `BOXOFFICE_SIM_TRACE_DIR`
/// set, writes its trace there as `seed-<seed>.trace`).
pub fn send(report: &Report) {
    if let Some(dir) = std::env::var_os("BOXOFFICE_SIM_TRACE_DIR") {
        let path = std::path::Path::new(&dir).join(format!("seed-{}.trace", report.seed));
        std::fs::write(&path, &report.trace)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
    let line = serde_json::to_string(report).unwrap_or_else(|e| panic!("a summary as JSON: {e}"));
    let mut out = std::io::stdout().lock();
    writeln!(out, "{PREFIX}{line}")
        .and_then(|()| out.flush())
        .unwrap_or_else(|e| panic!("sending a summary to the parent: {e}"));
}

/// How many worker processes to start: `BOXOFFICE_SIM_PROCS`, else one per core.
pub fn default_count() -> usize {
    boxoffice_engine::tiers::number("BOXOFFICE_SIM_PROCS").map_or_else(
        || std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        |n| usize::try_from(n).unwrap_or(1).max(1),
    )
}

/// Worker processes running seeds; dropping this kills those still running.
pub struct Workers {
    children: Vec<Child>,
    summaries: mpsc::Receiver<Result<Report, String>>,
    expected: usize,
    received: usize,
}

impl Workers {
    /// Starts `count` copies of this test binary, each running the test named `test` (exactly)
    /// as a worker on every `count`th of `seeds`, with `env` added to each.
    pub fn start(test: &str, seeds: &[u64], count: usize, env: &[(&str, String)]) -> Self {
        let exe = std::env::current_exe()
            .unwrap_or_else(|e| panic!("the test binary's own path, to start workers: {e}"));
        let count = count.clamp(1, seeds.len().max(1));
        let (tx, summaries) = mpsc::channel();
        let mut children = Vec::new();
        for k in 0..count {
            let mine: Vec<String> = seeds
                .iter()
                .skip(k)
                .step_by(count)
                .map(u64::to_string)
                .collect();
            let mut command = Command::new(&exe);
            command
                .args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env(SEEDS_VAR, mine.join(","))
                .env_remove("BOXOFFICE_SIM_SEED")
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            for (k, v) in env {
                command.env(k, v);
            }
            let mut child = command
                .spawn()
                .unwrap_or_else(|e| panic!("starting worker {k} ({}): {e}", exe.display()));
            let stdout = child.stdout.take().expect("a piped stdout");
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    // The harness may have begun the line (`test <name> ... `).
                    if let Some(json) = line.find(PREFIX).map(|at| &line[at + PREFIX.len()..]) {
                        let summary = serde_json::from_str(json)
                            .map_err(|e| format!("worker {k} sent a bad summary ({e}): {json}"));
                        if tx.send(summary).is_err() {
                            break;
                        }
                    }
                }
            });
            children.push(child);
        }
        Self {
            children,
            summaries,
            expected: seeds.len(),
            received: 0,
        }
    }

    /// Every summary, in seed order.
    pub fn all(self) -> Vec<Report> {
        let mut all: Vec<Report> = self.collect();
        all.sort_by_key(|s| s.seed);
        all
    }
}

/// The summaries in the order they arrive from the workers, ending once every seed's has.
/// Panics if a worker ended without sending all of its seeds' summaries (a run panicked: its
/// message is on standard error).
impl Iterator for Workers {
    type Item = Report;

    fn next(&mut self) -> Option<Report> {
        if self.received == self.expected {
            return None;
        }
        match self
            .summaries
            .recv_timeout(std::time::Duration::from_secs(600))
        {
            Ok(Ok(s)) => {
                self.received += 1;
                Some(s)
            }
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => {
                let codes: Vec<String> = self
                    .children
                    .iter_mut()
                    .map(|c| match c.try_wait() {
                        Ok(Some(status)) => status.to_string(),
                        _ => "running".into(),
                    })
                    .collect();
                panic!(
                    "the workers sent {} of {} summaries and then no more (their exits: {codes:?}; \
                     a run's panic is on standard error above)",
                    self.received, self.expected
                )
            }
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
