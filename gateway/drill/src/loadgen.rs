//! `boxoffice loadgen`: drives a running server over real gRPC with N concurrent streams and
//! reports throughput and latency percentiles (hdrhistogram) per RPC.
//!
//! In one run it measures the health check (an empty RPC: the ceiling any RPC can reach with
//! this client on this machine), `WaitingRoomService.GetStatus` polls, and durable
//! `BookingService.Hold`s, and reports each as a share of the ceiling.
//!
//! The run's event is made so that every call can succeed (admission is instant, places and the
//! per-user limit are plenty): any call that fails (shed with `OVERLOADED`, refused, timed out)
//! is a failed check, [`LoadReport::failures`] says which, and the command exits with code 1.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use boxoffice_client::{Authed, Bearer, connect};
use boxoffice_proto::v1 as pb;
use pb::booking_service_client::BookingServiceClient;
use pb::waiting_room_service_client::WaitingRoomServiceClient;
use tonic::transport::Channel;

use crate::admission;
use crate::measure::{RpcFigures, drive, health_ceiling};
use crate::secret::{self, UsageError};

/// Flags of `boxoffice loadgen`.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadgenArgs {
    /// Server address.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub target: String,
    /// Admin key (creates the benchmark event).
    #[arg(
        long,
        env = "BOXOFFICE_ADMIN_KEY",
        hide_env_values = true,
        conflicts_with = "admin_key_file",
        required_unless_present = "admin_key_file"
    )]
    pub admin_key: Option<String>,
    /// A file holding the admin key (trailing newline trimmed).
    #[arg(long, env = "BOXOFFICE_ADMIN_KEY_FILE", hide_env_values = true)]
    pub admin_key_file: Option<PathBuf>,
    /// Client key (everything else).
    #[arg(
        long,
        env = "BOXOFFICE_CLIENT_KEY",
        hide_env_values = true,
        conflicts_with = "client_key_file",
        required_unless_present = "client_key_file"
    )]
    pub client_key: Option<String>,
    /// A file holding the client key (trailing newline trimmed).
    #[arg(long, env = "BOXOFFICE_CLIENT_KEY_FILE", hide_env_values = true)]
    pub client_key_file: Option<PathBuf>,
    /// Concurrent streams.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Requests per RPC measured.
    #[arg(long, default_value_t = 20_000)]
    pub requests: usize,
    /// HTTP/2 connections shared by the streams.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Events the holds are spread over (call i goes to event i mod N); on a cluster with
    /// `--groups`, events of several groups load several leaders at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub events: u32,
}

/// A loadgen run.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// Concurrent streams.
    pub concurrency: usize,
    /// Health check (the ceiling), GetStatus, Hold.
    pub rpcs: Vec<RpcFigures>,
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ceiling = self.rpcs.first().map_or(1.0, RpcFigures::rate);
        writeln!(
            f,
            "{:<12} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "rpc", "calls", "errors", "calls/s", "p50 µs", "p99 µs", "p999 µs", "max µs", "ceiling"
        )?;
        for r in &self.rpcs {
            writeln!(
                f,
                "{:<12} {:>8} {:>7} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>7.0}%",
                r.name,
                r.calls,
                r.errors,
                r.rate(),
                r.latency_us[0],
                r.latency_us[1],
                r.latency_us[2],
                r.latency_us[3],
                100.0 * r.rate() / ceiling
            )?;
        }
        for r in &self.rpcs {
            if let Some(e) = &r.first_error {
                writeln!(f, "first {} error: {e}", r.name)?;
            }
        }
        writeln!(
            f,
            "(concurrency {}; ceiling = the health check's rate)",
            self.concurrency
        )
    }
}

impl LoadReport {
    /// What failed, one line (`None` if every call succeeded): e.g. `269 of 300 Hold calls
    /// failed (first: ResourceExhausted OVERLOADED: ...)`, per RPC.
    pub fn failures(&self) -> Option<String> {
        let parts: Vec<String> = self
            .rpcs
            .iter()
            .filter(|r| r.errors > 0)
            .map(|r| {
                format!(
                    "{} of {} {} calls failed (first: {})",
                    r.errors,
                    r.calls,
                    r.name,
                    r.first_error.as_deref().unwrap_or("?")
                )
            })
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// Admission tokens for `users` fresh users of `event` (joins them all, then polls each until
/// admitted).
async fn admit(
    wr: &mut WaitingRoomServiceClient<Authed>,
    event: &str,
    users: &[String],
) -> anyhow::Result<Vec<String>> {
    let mut queue = Vec::new();
    for u in users {
        queue.push(admission::join(wr, event, u, "loadgen").await?);
    }
    // 60 s for all of them, as one bound.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tokens = Vec::new();
    for q in queue {
        let left = deadline.saturating_duration_since(Instant::now());
        tokens.push(admission::admitted(wr, &q, left).await?);
    }
    Ok(tokens)
}

/// Runs the load and returns the figures.
pub async fn run(args: LoadgenArgs) -> anyhow::Result<LoadReport> {
    if args.concurrency == 0 || args.requests == 0 || args.connections == 0 {
        return Err(UsageError::new(
            "--concurrency, --requests and --connections must be at least 1",
        )
        .into());
    }
    let admin_key = secret::one(
        "--admin-key-file",
        args.admin_key.clone(),
        args.admin_key_file.as_deref(),
    )?
    .ok_or_else(|| UsageError::new("an admin key is needed: --admin-key or --admin-key-file"))?;
    let client_key = secret::one(
        "--client-key-file",
        args.client_key.clone(),
        args.client_key_file.as_deref(),
    )?
    .ok_or_else(|| UsageError::new("a client key is needed: --client-key or --client-key-file"))?;
    let mut channels = Vec::new();
    for _ in 0..args.connections {
        channels.push(connect(&args.target).await?);
    }
    let load = Load {
        channels: Arc::new(channels),
        client: Bearer::new(&client_key)?,
        requests: args.requests,
        concurrency: args.concurrency,
    };
    let n_events = args.events as usize;
    // 1. The ceiling: an empty RPC through the same client stack.
    let health = load.health().await;
    let run_id = ulid_like();
    let event_ids: Vec<String> = (0..n_events)
        .map(|e| {
            if n_events == 1 {
                format!("loadgen-{run_id}")
            } else {
                format!("loadgen-{run_id}-{e}")
            }
        })
        .collect();
    for event_id in &event_ids {
        load.create_event(event_id, Bearer::new(&admin_key)?)
            .await?;
    }
    // 2. Queue polls: one fan per stream, polling its status.
    let status = load.polls(&event_ids[0]).await?;
    // 3. Durable holds: one place each, spread over 16 sections (and the events), 100 per user.
    let hold = load.holds(&event_ids).await?;
    Ok(LoadReport {
        concurrency: args.concurrency,
        rpcs: vec![health, status, hold],
    })
}

/// The streams of a run: call `i` goes over channel `i % connections`, with the client key.
#[derive(Clone)]
struct Load {
    channels: Arc<Vec<Channel>>,
    client: Bearer,
    requests: usize,
    concurrency: usize,
}

impl Load {
    fn channel(&self, i: usize) -> Channel {
        self.channels[i % self.channels.len()].clone()
    }

    fn room(&self, i: usize) -> WaitingRoomServiceClient<Authed> {
        WaitingRoomServiceClient::with_interceptor(self.channel(i), self.client.clone())
    }

    fn booking(&self, i: usize) -> BookingServiceClient<Authed> {
        BookingServiceClient::with_interceptor(self.channel(i), self.client.clone())
    }

    /// The health check: an empty RPC, the ceiling of any RPC.
    async fn health(&self) -> RpcFigures {
        health_ceiling(&self.channels, self.requests, self.concurrency).await
    }

    /// The run's event: admission is instant, places are plenty (16 general-admission
    /// sections of `requests` + 1,000 places).
    async fn create_event(&self, event_id: &str, admin: Bearer) -> anyhow::Result<()> {
        let capacity = u32::try_from(self.requests)
            .unwrap_or(u32::MAX)
            .saturating_add(1_000);
        let mut events =
            pb::event_service_client::EventServiceClient::with_interceptor(self.channel(0), admin);
        events
            .create_event(pb::CreateEventRequest {
                event_id: event_id.into(),
                name: "loadgen".into(),
                sections: (0..16)
                    .map(|s| pb::SectionSpec {
                        section_id: format!("s{s}"),
                        name: format!("S{s}"),
                        price_cents: 100,
                        layout: Some(pb::section_spec::Layout::GeneralAdmissionCapacity(capacity)),
                        price_tiers: Vec::new(),
                    })
                    .collect(),
                hold_ttl_seconds: 600,
                per_user_limit: 100,
                admit_rate_per_second: 1_000_000,
                admission_window_seconds: 3_600,
                sale_opens_at_unix_ms: 0,
                idempotency_key: String::new(),
                join_pow_difficulty_bits: 0,
                cancellation_deadline_unix_ms: 0,
                transfers_disabled: false,
                presale_section_ids: Vec::new(),
                presale_ends_at_unix_ms: 0,
                access_codes: Vec::new(),
            })
            .await
            .context("CreateEvent (is --admin-key an admin key?)")?;
        Ok(())
    }

    /// `GetStatus` polls: one fan per stream joins, then every call polls a fan's status.
    async fn polls(&self, event_id: &str) -> anyhow::Result<RpcFigures> {
        let mut room = self.room(0);
        let mut queue_tokens = Vec::new();
        for t in 0..self.concurrency {
            let joined = room
                .join(pb::JoinRequest {
                    event_id: event_id.into(),
                    user_id: format!("{event_id}-poller-{t}"),
                    session_id: "loadgen".into(),
                    ..Default::default()
                })
                .await
                .context("Join")?;
            queue_tokens.push(joined.into_inner().queue_token);
        }
        let load = self.clone();
        Ok(
            drive("GetStatus", self.requests, self.concurrency, move |i| {
                let mut c = load.room(i);
                let token = queue_tokens[i % queue_tokens.len()].clone();
                async move {
                    c.get_status(pb::GetStatusRequest { queue_token: token })
                        .await
                        .map(|_| ())
                }
            })
            .await,
        )
    }

    /// Durable holds: one place each, spread over 16 sections, 100 per (admitted) user. Call
    /// `i` goes to event `i mod N`, as that event's call `j = i / N`, by its user `j / 100`.
    async fn holds(&self, event_ids: &[String]) -> anyhow::Result<RpcFigures> {
        let n = event_ids.len();
        let per_event = self.requests.div_ceil(n);
        let mut users: Vec<Vec<(String, String)>> = Vec::new();
        for event_id in event_ids {
            let names: Vec<String> = (0..per_event.div_ceil(100))
                .map(|u| format!("{event_id}-holder-{u}"))
                .collect();
            let tokens = admit(&mut self.room(0), event_id, &names).await?;
            users.push(names.into_iter().zip(tokens).collect());
        }
        let (load, event_ids) = (self.clone(), event_ids.to_vec());
        Ok(drive("Hold", self.requests, self.concurrency, move |i| {
            let mut c = load.booking(i);
            let (e, j) = (i % n, i / n);
            let (user, token) = &users[e][j / 100];
            let req = pb::HoldRequest {
                event_id: event_ids[e].clone(),
                user_id: user.clone(),
                admission_token: token.clone(),
                idempotency_key: format!("lg-{i}"),
                selection: Some(pb::hold_request::Selection::BestAvailable(
                    pb::BestAvailable {
                        section_id: format!("s{}", i % 16),
                        quantity: 1,
                    },
                )),
                access_code: String::new(),
            };
            async move { c.hold(req).await.map(|_| ()) }
        })
        .await)
    }
}

fn ulid_like() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{ms:x}")
}
