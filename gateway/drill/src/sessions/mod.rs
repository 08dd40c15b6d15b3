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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use boxoffice_client::{Authed, Bearer, Clients, connect};
use boxoffice_engine::{EventSpec, Layout, RowSpec, SectionId, SectionSpec};
use boxoffice_gateway::server::Running;
use boxoffice_proto::v1::event_service_client::EventServiceClient;

use crate::event::{RESERVED_SECTIONS, create_request, sale_event};
use crate::secret::UsageError;
use crate::server_choice::ServerChoice;

mod phases;
mod report;

pub use crate::memory::peak_rss_bytes;
pub use report::SessionsReport;

use phases::{Sessions, slots};

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
                price_tiers: Vec::new(),
            });
        }
    }
    spec.sections = sections;
    spec
}

/// Runs the sessions and returns what they measured.
pub async fn run(args: SessionsArgs) -> anyhow::Result<SessionsReport> {
    args.check()?;
    let started = Instant::now();
    let queue_max = u32::try_from(args.sessions)?.saturating_add(1_000);
    let mut backend = args.server.open("sessions-admin", queue_max).await?;
    let server = backend.server.take();
    let bearer = Bearer::new(&backend.admin_key)?;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(Clients::new(&connect(&backend.target).await?, &bearer));
    }
    let events = create_events(&mut clients[0].events, &args).await?;
    let sessions = Sessions {
        clients: Arc::new(clients),
        events: Arc::new(events),
        tag: format!("{:016x}", rand::random::<u64>()).into(),
        n: args.sessions,
        concurrency: args.concurrency,
        quantity: args.quantity,
    };
    let mut report = play(&sessions, args.pay_share).await?;
    if let Some(server) = server {
        check_engine(server, &mut report).await?;
    }
    report.peak_rss_bytes = peak_rss_bytes();
    report.seconds = started.elapsed().as_secs_f64();
    if let Some(path) = &args.json {
        std::fs::write(path, report.to_json())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

impl SessionsArgs {
    /// Refuses counts of zero, a quantity outside 1..=4 and a share outside 0..=1 (a
    /// [`UsageError`]).
    fn check(&self) -> Result<(), UsageError> {
        if self.sessions == 0 || self.events == 0 || self.concurrency == 0 {
            return Err(UsageError::new(
                "--sessions, --events and --concurrency must be at least 1",
            ));
        }
        if !(1..=4).contains(&self.quantity) {
            return Err(UsageError::new("--quantity must be 1 to 4"));
        }
        if !(0.0..=1.0).contains(&self.pay_share) {
            return Err(UsageError::new("--pay-share must be between 0 and 1"));
        }
        Ok(())
    }
}

/// The events: their places add up to sessions x quantity, every section a multiple of the
/// quantity (so all-or-nothing holds fill them exactly). Their ids.
async fn create_events(
    admin: &mut EventServiceClient<Authed>,
    args: &SessionsArgs,
) -> anyhow::Result<Vec<String>> {
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
            .context("creating an event (is --admin-key an admin key?)")?
            .into_inner();
        event_ids.push(ev.event_id);
    }
    Ok(event_ids)
}

/// The phases, and the server's counts at the peak and at the end.
async fn play(s: &Sessions, pay_share: f64) -> anyhow::Result<SessionsReport> {
    let (admission, holds, paid) = (slots(s.n), slots(s.n), slots(s.n));
    let mut phases = vec![s.join(&admission).await, s.hold(&admission, &holds).await];
    let holds_refused = holds.iter().filter(|h| h.get().is_none()).count() as u64;
    // All open at once: the server's own count, then every session refreshes its hold.
    let (held_at_peak, _, _) = s.counts().await?;
    phases.push(s.refresh(&holds).await);
    // Checkout: the first `pay_share` of each stride of 100 pay, the others release.
    let cut = (pay_share * 100.0).round() as usize;
    let (payers, leavers): (Vec<usize>, Vec<usize>) = (0..s.n).partition(|i| i % 100 < cut);
    phases.push(s.confirm(payers, &holds, &paid).await);
    phases.push(s.release(leavers, &holds).await);
    // The end: nothing held, sold == paid places.
    let (held_at_end, sold, available) = s.counts().await?;
    Ok(SessionsReport {
        sessions: s.n,
        events: s.events.len(),
        quantity: s.quantity,
        held_at_peak,
        holds_refused,
        phases,
        sold,
        available,
        held_at_end,
        paid: paid.iter().filter(|p| p.get().is_some()).count() as u64,
        ..SessionsReport::default()
    })
}

/// The embedded server's own checks: the engine's invariants and the reconciliation; then
/// stops the server.
async fn check_engine(server: Running, report: &mut SessionsReport) -> anyhow::Result<()> {
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
    server.shutdown().await
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
