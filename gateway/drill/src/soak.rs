//! `boxoffice soak`: is memory bounded by what is live? Many hold + release cycles against an
//! in-process engine (no gRPC: the engine's memory is what is measured), nothing held at the end.
//!
//! 1. An engine on `--data-dir` (a temporary one by default) with `--idempotency-window-seconds`
//!    (1 s by default: the run must last many windows for the window's share of memory to reach
//!    its steady state before the first sample; with the server's 24 hours it would measure a
//!    day of remembered answers, not a leak), one event with one general-admission section of
//!    `--concurrency` places.
//! 2. `--concurrency` fans each hold one place with a fresh idempotency key and release it, again
//!    and again, until `--cycles` cycles are done. Every `--sample-every` cycles: resident memory
//!    (`VmRSS`), what the engine remembers (holds, ended holds, idempotency keys) and the data
//!    dir's size.
//! 3. At the end: nothing held, every place available, the fans' quotas zero, every hold and
//!    release acknowledged; the engine shuts down and the data dir's size is taken.
//! 4. A fresh process opens the data dir again (recovery from checkpoint + records) and reports
//!    its resident memory and what it remembers.
//!
//! The figure the run is for: resident memory after the run against after the first sample
//! (target: within 20%, `--rss-ratio-max 1.20`). Exit code 3 if the counts do not add up (a
//! leak of places), 1 if only cycles failed or memory missed its target.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use boxoffice_engine::limits::{IDEMPOTENCY_WINDOW_MS_MAX, IDEMPOTENCY_WINDOW_MS_MIN};
use boxoffice_engine::{
    Durability, Engine, EngineConfig, EventId, EventSpec, HoldRequest, Layout, Remembered,
    SectionId, SectionSpec, Selection, UserId,
};
use serde::{Deserialize, Serialize};

use crate::json;
use crate::memory::{dir_bytes, rss_bytes};
use crate::server_choice::durability_parser;

/// The soak's event and section.
const EVENT: &str = "soak";
const SECTION: &str = "floor";

/// Flags of `boxoffice soak`.
#[derive(clap::Args, Debug, Clone)]
pub struct SoakArgs {
    /// Hold + release cycles in all.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub cycles: u64,
    /// Fans cycling at once (one place each; the section has this many places).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub concurrency: u32,
    /// Seconds an idempotency answer, and an ended hold, are remembered. Short by default so
    /// that the run covers many windows (the server's default is 86400).
    #[arg(
        long,
        default_value_t = 1,
        value_parser = clap::value_parser!(u64)
            .range(IDEMPOTENCY_WINDOW_MS_MIN / 1000..=IDEMPOTENCY_WINDOW_MS_MAX / 1000)
    )]
    pub idempotency_window_seconds: u64,
    /// Sample resident memory every this many cycles (the first sample is the baseline).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub sample_every: u64,
    /// sync: fsync (group commit) before every acknowledgement, as the server; buffered: faster,
    /// the same memory.
    #[arg(
        long,
        default_value_t = Durability::Sync,
        value_parser = durability_parser()
    )]
    pub durability: Durability,
    /// The target: resident memory after the run over after the first sample at most this
    /// (1.20: within 20%). A run that misses it, or could not measure it (fewer cycles than
    /// --sample-every), fails (exit code 1).
    #[arg(long, default_value_t = 1.20, value_parser = ratio_parser)]
    pub rss_ratio_max: f64,
    /// Data dir of the engine's log (created if missing; reused as it is). None: a temporary one.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Also write the report as one line of JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Only open the data dir, report (one line of JSON on stdout) and close: the restart half
    /// of a soak, run by the soak in a fresh process.
    #[arg(long, hide = true)]
    pub reopen_only: bool,
}

/// `--rss-ratio-max`: a finite ratio above 0.
fn ratio_parser(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!("{s:?} is not a ratio above 0 (e.g. 1.20)")),
    }
}

/// One sample of the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sample {
    /// Cycles done.
    pub cycles: u64,
    /// Seconds since the cycles started.
    #[serde(serialize_with = "json::millis")]
    pub seconds: f64,
    /// Resident memory of the process, bytes.
    pub rss_bytes: Option<u64>,
    /// What the engine remembered.
    pub remembered: Remembered,
    /// The data dir's size, bytes.
    pub data_dir_bytes: u64,
}

/// What the fresh process found when it opened the data dir again.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Reopened {
    /// Resident memory once the engine was open and ready, bytes.
    pub rss_bytes: Option<u64>,
    /// How long recovery took, ms.
    pub recovery_ms: u64,
    /// Log records replayed after the checkpoints.
    pub records_replayed: u64,
    /// Streams that started from a checkpoint.
    pub checkpoints_loaded: usize,
    /// What the engine remembered after recovery.
    pub remembered: Remembered,
    /// Places held in the soak's section after recovery (must be 0).
    pub held: u32,
}

impl Reopened {
    /// As one line of JSON (what `--reopen-only` prints).
    pub fn json(&self) -> String {
        json::line(self)
    }
}

/// What a soak found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SoakReport {
    /// Cycles asked for.
    pub cycles: u64,
    /// Fans at once.
    pub concurrency: u32,
    /// The idempotency window, seconds.
    pub idempotency_window_seconds: u64,
    /// Log durability.
    pub durability: String,
    /// Holds acknowledged.
    pub holds: u64,
    /// Releases acknowledged.
    pub releases: u64,
    /// Calls that failed, and the first failure.
    pub errors: u64,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// Resident memory before the engine opened, bytes.
    pub rss_start_bytes: Option<u64>,
    /// The memory target: [`SoakReport::rss_ratio`] at most this.
    #[serde(default)]
    pub rss_ratio_max: f64,
    /// Every `--sample-every` cycles.
    pub samples: Vec<Sample>,
    /// Resident memory after the last cycle, bytes.
    pub rss_end_bytes: Option<u64>,
    /// What the engine remembered after the last cycle.
    pub remembered_end: Remembered,
    /// The section's (capacity, available, held, sold) after the last cycle.
    pub counts_end: (u32, u32, u32, u32),
    /// The sum of the fans' quotas after the last cycle (must be 0).
    pub quota_end: u64,
    /// Wall time of the cycles, seconds.
    #[serde(serialize_with = "json::millis")]
    pub seconds: f64,
    /// The data dir's size after the engine shut down, bytes.
    pub data_dir_bytes: u64,
    /// The fresh process's view of the data dir (`None` if it was not run).
    pub reopened: Option<Reopened>,
}

impl SoakReport {
    /// Resident memory after the run over after the first sample.
    pub fn rss_ratio(&self) -> Option<f64> {
        let first = self.samples.first()?.rss_bytes?;
        let end = self.rss_end_bytes?;
        (first > 0).then(|| end as f64 / first as f64)
    }

    /// Whether memory met its target: measured, and the ratio at most `rss_ratio_max`.
    pub fn memory_within_target(&self) -> bool {
        self.rss_ratio().is_some_and(|r| r <= self.rss_ratio_max)
    }

    /// Whether every cycle was acknowledged.
    pub fn cycles_done(&self) -> bool {
        self.errors == 0 && self.holds == self.cycles && self.releases == self.cycles
    }

    /// Whether the run passed: every cycle acknowledged, memory within its target, and the
    /// counts add up ([`SoakReport::promises_kept`]).
    pub fn clean(&self) -> bool {
        self.cycles_done() && self.memory_within_target() && self.promises_kept()
    }

    /// What failed, for the verdict when the counts add up but the run is not clean: failed
    /// cycles, memory past its target, or memory not measured.
    pub fn failures(&self) -> String {
        let mut what = Vec::new();
        if !self.cycles_done() {
            what.push("cycles failed (see above)".to_owned());
        }
        match self.rss_ratio() {
            Some(r) if r > self.rss_ratio_max => what.push(format!(
                "memory grew past its target (ratio {r:.3} > {:.2})",
                self.rss_ratio_max
            )),
            Some(_) => {}
            None => what.push("memory was not measured (fewer cycles than --sample-every)".into()),
        }
        what.join("; ")
    }

    /// Whether nothing leaked: nothing held or sold at the end, every place available again, no
    /// quota owed, nothing held after the restart. `false` is a broken promise (exit code 3);
    /// failed cycles alone are not (exit code 1).
    pub fn promises_kept(&self) -> bool {
        let (capacity, available, held, sold) = self.counts_end;
        held == 0
            && sold == 0
            && available == capacity
            && self.quota_end == 0
            && self.reopened.as_ref().is_none_or(|r| r.held == 0)
    }

    /// The report as one line of JSON.
    pub fn json(&self) -> String {
        #[derive(Serialize)]
        struct Line<'a> {
            #[serde(flatten)]
            report: &'a SoakReport,
            rss_ratio: Option<f64>,
            memory_within_target: bool,
            clean: bool,
        }
        json::line(&Line {
            report: self,
            rss_ratio: self.rss_ratio().map(|r| (r * 1e4).round() / 1e4),
            memory_within_target: self.memory_within_target(),
            clean: self.clean(),
        })
    }
}

fn mib(b: Option<u64>) -> String {
    b.map_or_else(
        || "n/a".to_owned(),
        |b| format!("{:.1}", b as f64 / 1048576.0),
    )
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "soak: {} hold+release cycles, {} fans at once, idempotency window {} s, durability {}",
            self.cycles, self.concurrency, self.idempotency_window_seconds, self.durability
        )?;
        writeln!(
            f,
            "{:>10} {:>9} {:>8} {:>16} {:>12} {:>10} {:>13}",
            "cycles",
            "seconds",
            "RSS MiB",
            "holds remembered",
            "of which ended",
            "keys",
            "data dir MiB"
        )?;
        for s in &self.samples {
            writeln!(
                f,
                "{:>10} {:>9.1} {:>8} {:>16} {:>12} {:>10} {:>13}",
                s.cycles,
                s.seconds,
                mib(s.rss_bytes),
                s.remembered.holds,
                s.remembered.ended_holds,
                s.remembered.idempotency_keys,
                mib(Some(s.data_dir_bytes))
            )?;
        }
        let (capacity, available, held, sold) = self.counts_end;
        writeln!(
            f,
            "end: holds {} and releases {} acknowledged, {} errors; held {held}, sold {sold}, \
             available {available}/{capacity}, quotas {}",
            self.holds, self.releases, self.errors, self.quota_end
        )?;
        if let Some(e) = &self.first_error {
            writeln!(f, "first error: {e}")?;
        }
        let first = self.samples.first();
        writeln!(
            f,
            "RSS: {} MiB at start, {} MiB after {} cycles, {} MiB after {}: ratio {}",
            mib(self.rss_start_bytes),
            mib(first.and_then(|s| s.rss_bytes)),
            first.map_or(0, |s| s.cycles),
            mib(self.rss_end_bytes),
            self.cycles,
            match self.rss_ratio() {
                Some(r) => format!(
                    "{r:.3} (target <= {:.2}: {})",
                    self.rss_ratio_max,
                    if self.memory_within_target() {
                        "met"
                    } else {
                        "MISSED"
                    }
                ),
                None => "not measured (fewer cycles than --sample-every)".to_owned(),
            },
        )?;
        writeln!(
            f,
            "data dir: {:.1} MiB after the run ({} bytes)",
            self.data_dir_bytes as f64 / 1048576.0,
            self.data_dir_bytes
        )?;
        self.fmt_restart(f)?;
        writeln!(f, "wall time of the cycles: {:.1} s", self.seconds)
    }
}

impl SoakReport {
    /// The line of the restart in a fresh process, if it ran.
    fn fmt_restart(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reopened {
            Some(r) => writeln!(
                f,
                "restart (fresh process): RSS {} MiB once open; recovery {} ms, {} checkpoints \
                 loaded, {} records replayed; remembers {} holds ({} ended), {} keys; held {}",
                mib(r.rss_bytes),
                r.recovery_ms,
                r.checkpoints_loaded,
                r.records_replayed,
                r.remembered.holds,
                r.remembered.ended_holds,
                r.remembered.idempotency_keys,
                r.held
            ),
            None => writeln!(f, "restart: not run"),
        }
    }
}

/// The engine configuration of a soak on `dir`.
fn engine_config(dir: &Path, args: &SoakArgs) -> EngineConfig {
    let mut config = EngineConfig::new(dir);
    config.durability = args.durability;
    config.idempotency_window = Duration::from_secs(args.idempotency_window_seconds);
    config.section_inflight_max = config.section_inflight_max.max(args.concurrency as usize);
    config
}

fn soak_event(places: u32) -> EventSpec {
    EventSpec {
        event_id: Some(EventId::from(EVENT)),
        name: "Soak".into(),
        sections: vec![SectionSpec {
            section_id: SectionId::from(SECTION),
            name: "Floor".into(),
            price_cents: 100,
            layout: Layout::GeneralAdmission { capacity: places },
            price_tiers: Vec::new(),
        }],
        hold_ttl_ms: 0,
        per_user_limit: 1,
        admit_rate_per_second: 0,
        admission_window_ms: 0,
        sale_opens_at_ms: 0,
        join_pow_difficulty_bits: 0,
        cancellation_deadline_ms: 0,
        transfers_disabled: false,
        presale: Default::default(),
    }
}

fn fan(i: u32) -> UserId {
    UserId::from(format!("fan-{i}").as_str())
}

/// What the fans did.
#[derive(Default)]
struct Tally {
    holds: AtomicU64,
    releases: AtomicU64,
    errors: AtomicU64,
    done: AtomicU64,
    first_error: Mutex<Option<String>>,
    samples: tokio::sync::Mutex<Vec<Sample>>,
    /// The data dir, sized at every sample.
    dir: PathBuf,
}

impl Tally {
    fn failed(&self, what: &str, e: impl fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut first) = self.first_error.lock() {
            first.get_or_insert_with(|| format!("{what}: {e}"));
        }
    }
}

/// One fan: hold and release until the cycles are taken.
async fn cycle(engine: Engine, fan_no: u32, next: Arc<AtomicU64>, t: Arc<Tally>, run: Run) {
    let user = fan(fan_no);
    loop {
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= run.cycles {
            return;
        }
        let req = HoldRequest {
            event_id: EventId::from(EVENT),
            user_id: user.clone(),
            idempotency_key: format!("c{n}"),
            selection: Selection::BestAvailable {
                section: Some(SectionId::from(SECTION)),
                quantity: 1,
            },
            access_code: String::new(),
        };
        match engine.hold(req).await {
            Ok(h) => {
                t.holds.fetch_add(1, Ordering::Relaxed);
                match engine.release(&h.hold_id, &user).await {
                    Ok(_) => {
                        t.releases.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => t.failed("release", e),
                }
            }
            Err(e) => t.failed("hold", e),
        }
        let done = t.done.fetch_add(1, Ordering::Relaxed) + 1;
        if done.is_multiple_of(run.sample_every) {
            let remembered = engine.remembered().await.unwrap_or_default();
            t.samples.lock().await.push(Sample {
                cycles: done,
                seconds: run.started.elapsed().as_secs_f64(),
                rss_bytes: rss_bytes(),
                remembered,
                data_dir_bytes: dir_bytes(&t.dir),
            });
        }
    }
}

#[derive(Clone, Copy)]
struct Run {
    cycles: u64,
    sample_every: u64,
    started: Instant,
}

/// Runs the cycles on the engine in `dir` (steps 1 to 3 of the module docs).
async fn cycles(dir: &Path, args: &SoakArgs) -> anyhow::Result<SoakReport> {
    let rss_start_bytes = rss_bytes();
    let engine = Engine::open(engine_config(dir, args))
        .await
        .with_context(|| format!("opening the engine on {}", dir.display()))?;
    match engine.create_event(soak_event(args.concurrency)).await {
        Ok(_) => {}
        Err(e) if e.rejection().is_some_and(|r| r.reason() == "EVENT_EXISTS") => {}
        Err(e) => bail!("creating the soak's event: {e}"),
    }
    let next = Arc::new(AtomicU64::new(0));
    let tally = Arc::new(Tally {
        dir: dir.to_path_buf(),
        ..Tally::default()
    });
    let run = Run {
        cycles: args.cycles,
        sample_every: args.sample_every,
        started: Instant::now(),
    };
    let fans: Vec<_> = (0..args.concurrency)
        .map(|i| tokio::spawn(cycle(engine.clone(), i, next.clone(), tally.clone(), run)))
        .collect();
    for f in fans {
        f.await.context("a fan's task failed")?;
    }
    let seconds = run.started.elapsed().as_secs_f64();
    let rss_end_bytes = rss_bytes();
    let remembered_end = engine.remembered().await?;
    let section = engine
        .event(&EventId::from(EVENT))?
        .sections
        .into_iter()
        .next()
        .context("the soak's event has a section")?;
    let mut quota_end = 0u64;
    for i in 0..args.concurrency {
        quota_end += u64::from(engine.user_usage(&EventId::from(EVENT), &fan(i)).await?);
    }
    engine.shutdown().await;
    let mut samples = std::mem::take(&mut *tally.samples.lock().await);
    samples.sort_by_key(|s| s.cycles);
    let first_error = tally.first_error.lock().ok().and_then(|e| e.clone());
    Ok(SoakReport {
        cycles: args.cycles,
        concurrency: args.concurrency,
        idempotency_window_seconds: args.idempotency_window_seconds,
        durability: args.durability.name().to_owned(),
        holds: tally.holds.load(Ordering::Relaxed),
        releases: tally.releases.load(Ordering::Relaxed),
        errors: tally.errors.load(Ordering::Relaxed),
        first_error,
        rss_start_bytes,
        rss_ratio_max: args.rss_ratio_max,
        samples,
        rss_end_bytes,
        remembered_end,
        counts_end: (
            section.capacity,
            section.available,
            section.held,
            section.sold,
        ),
        quota_end,
        seconds,
        data_dir_bytes: dir_bytes(dir),
        reopened: None,
    })
}

/// The restart half (step 4): opens the data dir, reports, closes. Run in a fresh process, so
/// its resident memory is the recovered engine's alone.
pub async fn reopen(args: &SoakArgs) -> anyhow::Result<Reopened> {
    let dir = args
        .data_dir
        .as_deref()
        .context("--reopen-only needs --data-dir")?;
    let engine = Engine::open(engine_config(dir, args))
        .await
        .with_context(|| format!("reopening the engine on {}", dir.display()))?;
    let report = engine.recovery_report();
    let held = engine
        .event(&EventId::from(EVENT))
        .map(|e| e.sections.iter().map(|s| s.held).sum())
        .unwrap_or(0);
    let reopened = Reopened {
        rss_bytes: rss_bytes(),
        recovery_ms: report.duration_ms,
        records_replayed: report.records_replayed,
        checkpoints_loaded: report.checkpoints_loaded,
        remembered: engine.remembered().await?,
        held,
    };
    engine.shutdown().await;
    Ok(reopened)
}

/// Runs `command` (this program, its arguments up to the subcommand) with `--reopen-only` on
/// `dir` in a fresh process, and reads its report.
async fn reopen_in_child(
    command: &[OsString],
    dir: &Path,
    args: &SoakArgs,
) -> anyhow::Result<Reopened> {
    let (program, prefix) = command.split_first().context("no command to reopen with")?;
    let mut child = std::process::Command::new(program);
    child
        .args(prefix)
        .arg("--reopen-only")
        .arg("--data-dir")
        .arg(dir)
        .arg("--idempotency-window-seconds")
        .arg(args.idempotency_window_seconds.to_string())
        .arg("--durability")
        .arg(args.durability.name());
    let out = tokio::task::spawn_blocking(move || child.output())
        .await
        .context("waiting for the reopening process")?
        .context("starting the reopening process")?;
    if !out.status.success() {
        bail!(
            "the reopening process failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("reading the reopened report `{line}`"))
}

/// Runs a soak (see the module docs). `command` is this program and its arguments up to the
/// subcommand, to run the restart in a fresh process (empty: no restart).
pub async fn run(args: SoakArgs, command: &[OsString]) -> anyhow::Result<SoakReport> {
    let temp;
    let dir = match &args.data_dir {
        Some(d) => {
            crate::held::refuse_if_held(d)?;
            d.clone()
        }
        None => {
            temp = tempfile::tempdir().context("creating a temporary data dir")?;
            temp.path().to_path_buf()
        }
    };
    let mut report = cycles(&dir, &args).await?;
    if !command.is_empty() {
        report.reopened = Some(reopen_in_child(command, &dir, &args).await?);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        soak: SoakArgs,
    }

    fn args(extra: &[&str]) -> SoakArgs {
        let mut argv = vec!["soak"];
        argv.extend_from_slice(extra);
        Cli::parse_from(argv).soak
    }

    /// A short soak in process: counts only (never a time or a memory figure).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_soak_holds_nothing_at_the_end_and_its_counts_add_up() {
        let a = args(&[
            "--cycles",
            "3000",
            "--concurrency",
            "16",
            "--sample-every",
            "1000",
            "--idempotency-window-seconds",
            "1",
            // Other tests share this process's memory: the target is the binary's to test.
            "--rss-ratio-max",
            "1000",
        ]);
        let report = run(a, &[]).await.expect("the soak runs");
        assert!(report.clean(), "{report}");
        assert_eq!(
            (report.holds, report.releases, report.errors),
            (3000, 3000, 0)
        );
        assert_eq!(report.counts_end, (16, 16, 0, 0));
        assert_eq!(
            report.samples.iter().map(|s| s.cycles).collect::<Vec<_>>(),
            [1000, 2000, 3000]
        );
        assert_eq!(
            report.remembered_end.holds,
            report.remembered_end.ended_holds
        );
        assert!(report.data_dir_bytes > 0);
        assert!(report.json().contains("\"clean\":true"));
    }

    /// A report of `cycles` cycles whose memory went from 100 MiB at the first sample to `end`.
    fn finished(end_mib: u64, samples: bool) -> SoakReport {
        let mib = 1_048_576;
        SoakReport {
            cycles: 2,
            concurrency: 1,
            idempotency_window_seconds: 1,
            durability: "sync".into(),
            holds: 2,
            releases: 2,
            errors: 0,
            first_error: None,
            rss_start_bytes: Some(90 * mib),
            rss_ratio_max: 1.20,
            samples: if samples {
                vec![Sample {
                    cycles: 1,
                    seconds: 0.1,
                    rss_bytes: Some(100 * mib),
                    remembered: Remembered::default(),
                    data_dir_bytes: 0,
                }]
            } else {
                Vec::new()
            },
            rss_end_bytes: Some(end_mib * mib),
            remembered_end: Remembered::default(),
            counts_end: (1, 1, 0, 0),
            quota_end: 0,
            seconds: 0.2,
            data_dir_bytes: 1,
            reopened: None,
        }
    }

    #[test]
    fn a_soak_that_misses_its_memory_target_fails_and_says_so() {
        let met = finished(120, true);
        assert!(met.clean(), "1.200 is within 1.20");
        assert!(
            met.to_string()
                .contains("ratio 1.200 (target <= 1.20: met)")
        );
        let missed = finished(126, true);
        assert!(!missed.clean(), "{missed}");
        assert!(missed.promises_kept(), "nothing leaked: exit 1, not 3");
        assert!(
            missed
                .to_string()
                .contains("ratio 1.260 (target <= 1.20: MISSED)"),
            "{missed}"
        );
        assert_eq!(
            missed.failures(),
            "memory grew past its target (ratio 1.260 > 1.20)"
        );
        assert!(missed.json().contains("\"memory_within_target\":false"));
        let unmeasured = finished(100, false);
        assert!(!unmeasured.clean());
        assert!(unmeasured.failures().starts_with("memory was not measured"));
    }

    #[test]
    fn bad_flags_are_refused() {
        for bad in [
            ["--cycles", "0"],
            ["--rss-ratio-max", "0"],
            ["--rss-ratio-max", "-1"],
            ["--rss-ratio-max", "NaN"],
            ["--idempotency-window-seconds", "0"],
            ["--concurrency", "0"],
            ["--sample-every", "0"],
            ["--durability", "fast"],
        ] {
            let mut argv = vec!["soak"];
            argv.extend_from_slice(&bad);
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }
}
