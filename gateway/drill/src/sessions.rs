//! `boxoffice sessions`: the case study's concurrent checkout sessions, measured.
//!
//! The seeds ask the booking path to carry 50,000 checkout sessions at once with up to 200,000
//! seats held across events. This run opens that many sessions over real gRPC (an embedded
//! server, or `--target`) and keeps them all open at the same time:
//!
//! 1. `--events` events whose seats together are exactly `--sessions x --quantity`;
//! 2. every session joins its event's waiting room, is admitted, and holds `--quantity` places
//!    (best available anywhere; holds last the default ten minutes, so none lapses during the run);
//! 3. with every session open, the server's own counts are read (`GetEvent`): the held places must
//!    equal sessions x quantity; then every session refreshes its hold (`GetHold`), the checkout
//!    page's poll, while all of them are held;
//! 4. `--pay-share` of the sessions pay (`Confirm`), the others give their places back (`Release`);
//! 5. at the end no place is held, sold places equal the paid sessions' places, and (embedded)
//!    the engine's invariants hold and the reconciliation is clean.
//!
//! Exit code 2 if any check fails. Every phase reports calls/s and latency percentiles, and the
//! peak resident memory of the process (server and load generator when embedded).

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use boxoffice_proto::v1 as pb;
use serde::Serialize;
use tonic::transport::Channel;

use boxoffice_engine::{EventSpec, Layout, RowSpec, SectionId, SectionSpec};

use crate::event::{RESERVED_SECTIONS, create_request, sale_event};
use crate::json;
use crate::loadgen::{RpcFigures, drive};
use crate::server_choice::ServerChoice;
use boxoffice_client::{Authed, Bearer, Clients, connect};

/// Flags of `boxoffice sessions`.
#[derive(clap::Args, Debug, Clone)]
pub struct SessionsArgs {
    /// Checkout sessions open at once (each one fan with one hold).
    #[arg(long, default_value_t = 50_000)]
    pub sessions: usize,
    /// Places each session holds (1-4: the per-user limit is this).
    #[arg(long, default_value_t = 4)]
    pub quantity: u32,
    /// Events the sessions are spread over; their seats add up to sessions x quantity.
    #[arg(long, default_value_t = 20)]
    pub events: usize,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 1_024)]
    pub concurrency: usize,
    /// Share of the sessions that pay at the end (the rest release their places).
    #[arg(long, default_value_t = 0.5)]
    pub pay_share: f64,
    /// The server the run plays against: embedded, or `--target`.
    #[command(flatten)]
    pub server: ServerChoice,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// What a sessions run measured. Its JSON ([`SessionsReport::to_json`]) has these fields in
/// this order, then `clean`, then the phases.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SessionsReport {
    /// Sessions opened.
    pub sessions: usize,
    /// Events they were spread over.
    pub events: usize,
    /// Places each held.
    pub quantity: u32,
    /// Places held at the peak, as the server counts them (sum over events and sections).
    pub held_at_peak: u64,
    /// Holds that the server did not grant (must be 0: the seats are exactly enough).
    pub holds_refused: u64,
    /// Join + admission, hold, refresh, confirm, release.
    #[serde(skip)]
    pub phases: Vec<RpcFigures>,
    /// Places sold, free and held at the end (server counts).
    pub sold: u64,
    /// Free places at the end.
    pub available: u64,
    /// Held places at the end (must be 0).
    pub held_at_end: u64,
    /// Sessions that paid.
    pub paid: u64,
    /// Section invariant violations (`None`: not checked, the server is not embedded).
    pub invariant_violations: Option<u64>,
    /// Reconciliation findings (`None`: not checked, the server is not embedded).
    pub reconciliation_findings: Option<u64>,
    /// Peak resident memory of this process, bytes (server + load generator when embedded).
    pub peak_rss_bytes: Option<u64>,
    /// Wall time of the run, seconds.
    #[serde(serialize_with = "json::millis")]
    pub seconds: f64,
}

/// The JSON object of a sessions report: its fields, whether it is clean, its phases.
#[derive(Serialize)]
struct SessionsJson<'a> {
    #[serde(flatten)]
    report: &'a SessionsReport,
    clean: bool,
    phases: Vec<PhaseJson<'a>>,
}

/// One phase in the JSON of a sessions report.
#[derive(Serialize)]
struct PhaseJson<'a> {
    name: &'a str,
    calls: u64,
    errors: u64,
    #[serde(serialize_with = "json::millis")]
    seconds: f64,
    #[serde(serialize_with = "json::tenths")]
    calls_per_second: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    max_us: u64,
}

impl<'a> From<&'a RpcFigures> for PhaseJson<'a> {
    fn from(p: &'a RpcFigures) -> PhaseJson<'a> {
        let [p50_us, p99_us, p999_us, max_us] = p.latency_us;
        PhaseJson {
            name: p.name,
            calls: p.calls,
            errors: p.errors,
            seconds: p.seconds,
            calls_per_second: p.rate(),
            p50_us,
            p99_us,
            p999_us,
            max_us,
        }
    }
}

impl SessionsReport {
    /// Whether every check passed.
    pub fn clean(&self) -> bool {
        let expected = self.sessions as u64 * u64::from(self.quantity);
        self.held_at_peak == expected
            && self.holds_refused == 0
            && self.held_at_end == 0
            && self.sold == self.paid * u64::from(self.quantity)
            && self.sold + self.available == expected
            && self.invariant_violations.unwrap_or(0) == 0
            && self.reconciliation_findings.unwrap_or(0) == 0
            && self.phases.iter().all(|p| p.errors == 0)
    }

    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        json::line(&SessionsJson {
            report: self,
            clean: self.clean(),
            phases: self.phases.iter().map(PhaseJson::from).collect(),
        })
    }
}

impl fmt::Display for SessionsReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let expected = self.sessions as u64 * u64::from(self.quantity);
        writeln!(
            f,
            "{:<40} {}",
            "checkout sessions open at once", self.sessions
        )?;
        writeln!(f, "{:<40} {}", "events", self.events)?;
        writeln!(
            f,
            "{:<40} {} (expected {expected})",
            "places held at the peak (server count)", self.held_at_peak
        )?;
        writeln!(
            f,
            "{:<40} {}",
            "holds refused (must be 0)", self.holds_refused
        )?;
        writeln!(
            f,
            "{:<40} {} / {} / {}",
            "at the end: sold / free / held", self.sold, self.available, self.held_at_end
        )?;
        writeln!(f, "{:<40} {}", "sessions that paid", self.paid)?;
        writeln!(
            f,
            "{:<40} {}",
            "invariant violations (must be 0)",
            text_opt(self.invariant_violations)
        )?;
        writeln!(
            f,
            "{:<40} {}",
            "reconciliation findings (must be 0)",
            text_opt(self.reconciliation_findings)
        )?;
        match self.peak_rss_bytes {
            Some(b) => writeln!(
                f,
                "{:<40} {:.0} MB",
                "peak resident memory (this process)",
                b as f64 / 1e6
            )?,
            None => writeln!(f, "{:<40} unknown", "peak resident memory (this process)")?,
        }
        writeln!(f, "{:<40} {:.2} s", "wall time", self.seconds)?;
        writeln!(
            f,
            "{:<24} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9}",
            "phase", "calls", "errors", "calls/s", "p50 µs", "p99 µs", "p999 µs", "max µs"
        )?;
        for p in &self.phases {
            writeln!(
                f,
                "{:<24} {:>8} {:>7} {:>10.0} {:>9} {:>9} {:>9} {:>9}",
                p.name,
                p.calls,
                p.errors,
                p.rate(),
                p.latency_us[0],
                p.latency_us[1],
                p.latency_us[2],
                p.latency_us[3]
            )?;
        }
        for p in &self.phases {
            if let Some(e) = &p.first_error {
                writeln!(f, "first {} error: {e}", p.name)?;
            }
        }
        writeln!(
            f,
            "result: {}",
            if self.clean() {
                "every session held its places at once; counters add up"
            } else {
                "FAILED (see above)"
            }
        )
    }
}

fn text_opt(v: Option<u64>) -> String {
    v.map_or_else(
        || "n/a (checked only with the embedded server)".to_owned(),
        |n| n.to_string(),
    )
}

/// Peak resident memory of this process (`VmHWM`), where `/proc` tells it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// An event for `sessions` sessions of `q` places each: 40% general admission, the rest over
/// three reserved sections; every section and every row holds a multiple of `q` places.
pub fn sessions_event(sessions: u32, q: u32) -> EventSpec {
    let mut spec = sale_event(q, 600_000, q);
    let ga = (sessions * 2 / 5).clamp(1, sessions.max(1));
    let reserved = sessions.saturating_sub(ga);
    let mut sections = vec![SectionSpec {
        layout: Layout::GeneralAdmission { capacity: ga * q },
        ..spec.sections[0].clone()
    }];
    for (i, (id, name, price)) in RESERVED_SECTIONS.iter().enumerate() {
        let mut blocks = reserved / 3 + u32::from((i as u32) < reserved % 3);
        let mut rows = Vec::new();
        while blocks > 0 {
            let n = blocks.min(12);
            rows.push(RowSpec {
                label: format!("R{}", rows.len() + 1),
                seat_count: n * q,
            });
            blocks -= n;
        }
        if !rows.is_empty() {
            sections.push(SectionSpec {
                section_id: SectionId::from(*id),
                name: (*name).into(),
                price_cents: *price,
                layout: Layout::Reserved { rows },
            });
        }
    }
    spec.sections = sections;
    spec
}

/// One slot per session, filled once.
type Slots = Arc<Vec<OnceLock<String>>>;

fn slots(n: usize) -> Slots {
    Arc::new((0..n).map(|_| OnceLock::new()).collect())
}

fn taken(s: &Slots, i: usize) -> Result<String, tonic::Status> {
    s[i].get()
        .cloned()
        .ok_or_else(|| tonic::Status::failed_precondition("an earlier phase failed for it"))
}

/// Runs the sessions and returns what they measured.
pub async fn run(args: SessionsArgs) -> anyhow::Result<SessionsReport> {
    if args.sessions == 0 || args.events == 0 || args.concurrency == 0 {
        bail!("--sessions, --events and --concurrency must be at least 1");
    }
    if !(1..=4).contains(&args.quantity) {
        bail!("--quantity must be 1 to 4");
    }
    if !(0.0..=1.0).contains(&args.pay_share) {
        bail!("--pay-share must be between 0 and 1");
    }
    let started = Instant::now();
    let queue_max = u32::try_from(args.sessions)?.saturating_add(1_000);
    let mut backend = args.server.open("sessions-admin", queue_max).await?;
    let (server, target, key) = (
        backend.server.take(),
        backend.target.clone(),
        backend.admin_key.clone(),
    );
    let bearer = Bearer::new(&key)?;
    let mut channels: Vec<Channel> = Vec::new();
    for _ in 0..8 {
        channels.push(connect(&target).await?);
    }
    let clients = Arc::new(
        channels
            .iter()
            .map(|c| Clients::new(c, &bearer))
            .collect::<Vec<_>>(),
    );
    let pick = move |i: usize| clients[i % clients.len()].clone();

    // The events: their places add up to sessions x quantity, every section a multiple of the
    // quantity (so all-or-nothing holds fill them exactly).
    let mut admin = pick(0).events;
    let mut event_ids = Vec::with_capacity(args.events);
    for e in 0..args.events {
        let sessions_here =
            args.sessions / args.events + usize::from(e < args.sessions % args.events);
        if sessions_here == 0 {
            continue;
        }
        let spec = sessions_event(u32::try_from(sessions_here)?, args.quantity);
        let ev = admin
            .create_event(create_request(&spec, 600, 1_000_000, 3_600, 0))
            .await
            .context("creating an event (is --api-key an admin key?)")?
            .into_inner();
        event_ids.push(ev.event_id);
    }
    let events = Arc::new(event_ids);
    // Fans of this run are new to the server (`--target` may have served earlier runs: the
    // same user with the same idempotency key would be IDEMPOTENCY_KEY_REUSED).
    let run_tag = format!("{:016x}", rand::random::<u64>());
    let user = {
        let run_tag = run_tag.clone();
        Arc::new(move |i: usize| format!("session-{run_tag}-{i}"))
    };
    let n = args.sessions;
    let c = args.concurrency;
    let mut phases = Vec::new();

    // 1. Join and be admitted.
    let admission = slots(n);
    phases.push({
        let (pick, events, user, admission) = (
            pick.clone(),
            events.clone(),
            user.clone(),
            admission.clone(),
        );
        drive("join + admission", n, c, move |i| {
            let mut room = pick(i).room;
            let (event_id, user_id, admission) =
                (events[i % events.len()].clone(), user(i), admission.clone());
            async move {
                let q = room
                    .join(pb::JoinRequest {
                        event_id,
                        user_id,
                        session_id: "checkout".into(),
                    })
                    .await?
                    .into_inner()
                    .queue_token;
                loop {
                    let st = room
                        .get_status(pb::GetStatusRequest {
                            queue_token: q.clone(),
                        })
                        .await?
                        .into_inner();
                    if st.state == pb::QueueState::Admitted as i32 {
                        let _ = admission[i].set(st.admission_token);
                        return Ok(());
                    }
                    if st.state == pb::QueueState::Expired as i32 {
                        return Err(tonic::Status::deadline_exceeded("queue token expired"));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        })
        .await
    });

    // 2. Every session holds its places; none lapses (ten-minute TTL).
    let holds = slots(n);
    let quantity = args.quantity;
    phases.push({
        let (pick, events, user, admission, holds) = (
            pick.clone(),
            events.clone(),
            user.clone(),
            admission.clone(),
            holds.clone(),
        );
        drive("Hold", n, c, move |i| {
            let mut booking = pick(i).booking;
            let (event_id, user_id, admission, holds) = (
                events[i % events.len()].clone(),
                user(i),
                taken(&admission, i),
                holds.clone(),
            );
            async move {
                let h = booking
                    .hold(pb::HoldRequest {
                        event_id,
                        user_id,
                        admission_token: admission?,
                        idempotency_key: "checkout-hold".into(),
                        selection: Some(pb::hold_request::Selection::BestAvailable(
                            pb::BestAvailable {
                                section_id: String::new(),
                                quantity,
                            },
                        )),
                    })
                    .await?
                    .into_inner();
                let _ = holds[i].set(h.hold_id);
                Ok(())
            }
        })
        .await
    });
    let holds_refused = holds.iter().filter(|h| h.get().is_none()).count() as u64;

    // 3. All open at once: the server's own count, then every session refreshes its hold.
    let (held_at_peak, _, _) = counts(&mut admin, &events).await?;
    phases.push({
        let (pick, holds) = (pick.clone(), holds.clone());
        drive("GetHold (all held)", n, c, move |i| {
            let mut booking = pick(i).booking;
            let hold = taken(&holds, i);
            async move {
                let h = booking
                    .get_hold(pb::GetHoldRequest { hold_id: hold? })
                    .await?
                    .into_inner();
                if h.status == pb::HoldStatus::Held as i32 {
                    Ok(())
                } else {
                    Err(tonic::Status::internal(format!(
                        "hold {} is {:?}, not HELD",
                        h.hold_id, h.status
                    )))
                }
            }
        })
        .await
    });

    // 4. Checkout: the first `pay_share` of each stride of 100 pay, the others release.
    let pays = {
        let cut = (args.pay_share * 100.0).round() as usize;
        move |i: usize| i % 100 < cut
    };
    let payers: Arc<Vec<usize>> = Arc::new((0..n).filter(|&i| pays(i)).collect());
    let leavers: Arc<Vec<usize>> = Arc::new((0..n).filter(|&i| !pays(i)).collect());
    let paid = slots(n);
    phases.push({
        let (pick, user, holds, payers, paid) = (
            pick.clone(),
            user.clone(),
            holds.clone(),
            payers.clone(),
            paid.clone(),
        );
        drive("Confirm", payers.len(), c, move |k| {
            let i = payers[k];
            let mut booking = pick(i).booking;
            let (user_id, hold, paid) = (user(i), taken(&holds, i), paid.clone());
            async move {
                let o = booking
                    .confirm(pb::ConfirmRequest {
                        hold_id: hold?,
                        user_id,
                        payment_token: format!("tok_session_{i}"),
                        idempotency_key: "checkout-pay".into(),
                    })
                    .await?
                    .into_inner();
                let _ = paid[i].set(o.order_id);
                Ok(())
            }
        })
        .await
    });
    phases.push({
        let (pick, user, holds, leavers) =
            (pick.clone(), user.clone(), holds.clone(), leavers.clone());
        drive("Release", leavers.len(), c, move |k| {
            let i = leavers[k];
            let mut booking = pick(i).booking;
            let (user_id, hold) = (user(i), taken(&holds, i));
            async move {
                booking
                    .release(pb::ReleaseRequest {
                        hold_id: hold?,
                        user_id,
                    })
                    .await
                    .map(|_| ())
            }
        })
        .await
    });

    // 5. The end: nothing held, sold == paid places; the engine's own checks when embedded.
    let (held_at_end, sold, available) = counts(&mut admin, &events).await?;
    let mut report = SessionsReport {
        sessions: n,
        events: events.len(),
        quantity,
        held_at_peak,
        holds_refused,
        phases,
        sold,
        available,
        held_at_end,
        paid: paid.iter().filter(|p| p.get().is_some()).count() as u64,
        ..SessionsReport::default()
    };
    if let Some(server) = server {
        if let Some(engine) = server.engine() {
            let mut violations = 0;
            for v in engine.invariant_violations().await? {
                tracing::error!(violation = %v, "invariant violated");
                violations += 1;
            }
            let findings = engine.reconcile().await?;
            for f in &findings {
                tracing::error!(finding = ?f, "reconciliation finding");
            }
            report.invariant_violations = Some(violations);
            report.reconciliation_findings = Some(findings.len() as u64);
        }
        server.shutdown().await?;
    }
    report.peak_rss_bytes = peak_rss_bytes();
    report.seconds = started.elapsed().as_secs_f64();
    if let Some(path) = &args.json {
        std::fs::write(path, report.to_json())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

/// (held, sold, available) summed over the events' sections, as the server counts them.
async fn counts(
    admin: &mut pb::event_service_client::EventServiceClient<Authed>,
    events: &[String],
) -> anyhow::Result<(u64, u64, u64)> {
    let (mut held, mut sold, mut available) = (0u64, 0u64, 0u64);
    for e in events {
        let ev = admin
            .get_event(pb::GetEventRequest {
                event_id: e.clone(),
            })
            .await
            .context("GetEvent")?
            .into_inner();
        for s in ev.sections {
            held += u64::from(s.held);
            sold += u64::from(s.sold);
            available += u64::from(s.available);
        }
    }
    Ok((held, sold, available))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(sessions: usize, events: usize) -> SessionsArgs {
        SessionsArgs {
            sessions,
            quantity: 3,
            events,
            concurrency: 64,
            pay_share: 0.5,
            server: ServerChoice {
                durability: boxoffice_engine::Durability::Sync,
                ..ServerChoice::default()
            },
            json: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_session_holds_at_once_then_pays_or_releases() {
        let report = run(small(400, 3)).await.expect("run");
        assert_eq!(report.sessions, 400);
        assert_eq!(report.events, 3);
        assert_eq!(report.holds_refused, 0, "{report}");
        assert_eq!(report.held_at_peak, 1_200, "{report}");
        assert_eq!(report.paid, 200, "{report}");
        assert_eq!(report.sold, 600, "{report}");
        assert_eq!(report.available, 600, "{report}");
        assert_eq!(report.held_at_end, 0, "{report}");
        assert_eq!(report.invariant_violations, Some(0), "{report}");
        assert_eq!(report.reconciliation_findings, Some(0), "{report}");
        let names: Vec<&str> = report.phases.iter().map(|p| p.name).collect();
        assert_eq!(
            names,
            [
                "join + admission",
                "Hold",
                "GetHold (all held)",
                "Confirm",
                "Release"
            ]
        );
        for p in &report.phases {
            assert_eq!(p.errors, 0, "{report}");
        }
        assert!(report.clean());
        assert!(report.to_json().contains("\"held_at_peak\":1200"));
    }

    #[test]
    fn session_events_fill_exactly_with_whole_holds() {
        for (sessions, q) in [(1u32, 4u32), (2, 3), (3, 1), (7, 3), (2_500, 4), (133, 2)] {
            let spec = sessions_event(sessions, q);
            let mut total = 0;
            for s in &spec.sections {
                match &s.layout {
                    Layout::GeneralAdmission { capacity } => {
                        assert_eq!(capacity % q, 0);
                        total += capacity;
                    }
                    Layout::Reserved { rows } => {
                        for r in rows {
                            assert_eq!(r.seat_count % q, 0, "{sessions} x {q}");
                            total += r.seat_count;
                        }
                    }
                }
            }
            assert_eq!(total, sessions * q, "{sessions} x {q}");
        }
    }

    #[test]
    fn a_report_that_does_not_add_up_is_not_clean() {
        let good = SessionsReport {
            sessions: 10,
            events: 1,
            quantity: 2,
            held_at_peak: 20,
            sold: 10,
            available: 10,
            paid: 5,
            ..SessionsReport::default()
        };
        assert!(good.clean());
        for bad in [
            SessionsReport {
                held_at_peak: 19,
                ..good.clone()
            },
            SessionsReport {
                held_at_end: 1,
                ..good.clone()
            },
            SessionsReport {
                sold: 12,
                available: 8,
                ..good.clone()
            },
            SessionsReport {
                holds_refused: 1,
                ..good.clone()
            },
            SessionsReport {
                reconciliation_findings: Some(1),
                ..good.clone()
            },
        ] {
            assert!(!bad.clean(), "{bad}");
        }
    }

    #[tokio::test]
    async fn bad_flags_are_refused() {
        for (args, flag) in [
            (
                SessionsArgs {
                    sessions: 0,
                    ..small(1, 1)
                },
                "--sessions",
            ),
            (
                SessionsArgs {
                    quantity: 5,
                    ..small(1, 1)
                },
                "--quantity",
            ),
            (
                SessionsArgs {
                    pay_share: 1.5,
                    ..small(1, 1)
                },
                "--pay-share",
            ),
        ] {
            let e = run(args).await.expect_err("refused");
            assert!(e.to_string().contains(flag), "{e}");
        }
    }
}
