//! `boxoffice loadgen`: drives a running server over real gRPC with N concurrent streams and
//! reports throughput and latency percentiles (hdrhistogram) per RPC.
//!
//! In one run it measures the health check (an empty RPC: the ceiling any RPC can reach with
//! this client on this machine), `WaitingRoomService.GetStatus` polls, and durable
//! `BookingService.Hold`s, and reports each as a share of the ceiling.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use boxoffice_client::{Authed, Bearer, connect};
use boxoffice_proto::v1 as pb;
use hdrhistogram::Histogram;

/// Flags of `boxoffice loadgen`.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadgenArgs {
    /// Server address.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub target: String,
    /// Admin key (creates the benchmark event).
    #[arg(long, env = "BOXOFFICE_ADMIN_KEY")]
    pub admin_key: String,
    /// Client key (everything else).
    #[arg(long, env = "BOXOFFICE_CLIENT_KEY")]
    pub client_key: String,
    /// Concurrent streams.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Requests per RPC measured.
    #[arg(long, default_value_t = 20_000)]
    pub requests: usize,
    /// HTTP/2 connections shared by the streams.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
}

/// Throughput and latency of one RPC.
#[derive(Clone, Debug)]
pub struct RpcFigures {
    /// The RPC.
    pub name: &'static str,
    /// Calls made.
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Wall time.
    pub seconds: f64,
    /// Latency percentiles p50, p99, p99.9 and max, µs.
    pub latency_us: [u64; 4],
    /// The first error seen, if any.
    pub first_error: Option<String>,
}

impl RpcFigures {
    /// Calls per second.
    pub fn rate(&self) -> f64 {
        self.calls as f64 / self.seconds.max(1e-9)
    }
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

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

/// Runs `concurrency` tasks, each calling `call(i)` for its share of `requests`.
pub(crate) async fn drive<F, Fut>(
    name: &'static str,
    requests: usize,
    concurrency: usize,
    call: F,
) -> RpcFigures
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), tonic::Status>> + Send,
{
    let call = Arc::new(call);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = histogram();
            let mut errors = 0u64;
            let mut calls = 0u64;
            let mut first = None;
            let mut i = t;
            while i < requests {
                let s = Instant::now();
                if let Err(e) = call(i).await {
                    errors += 1;
                    first.get_or_insert_with(|| {
                        format!(
                            "{:?} {}: {}",
                            e.code(),
                            boxoffice_client::reason(&e).unwrap_or_default(),
                            e.message()
                        )
                    });
                }
                let _ = h.record(
                    u64::try_from(s.elapsed().as_micros())
                        .unwrap_or(u64::MAX)
                        .max(1),
                );
                calls += 1;
                i += concurrency;
            }
            (h, calls, errors, first)
        }));
    }
    let mut h = histogram();
    let (mut calls, mut errors) = (0, 0);
    let mut first_error = None;
    for t in tasks {
        if let Ok((th, c, e, f)) = t.await {
            let _ = h.add(th);
            calls += c;
            errors += e;
            first_error = first_error.or(f);
        }
    }
    RpcFigures {
        name,
        calls,
        errors,
        seconds: started.elapsed().as_secs_f64(),
        latency_us: [
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max(),
        ],
        first_error,
    }
}

/// Admission tokens for `users` fresh users of `event` (joins, then polls until admitted).
async fn admit(
    wr: &mut pb::waiting_room_service_client::WaitingRoomServiceClient<Authed>,
    event: &str,
    users: &[String],
) -> anyhow::Result<Vec<String>> {
    let mut queue = Vec::new();
    for u in users {
        let t = wr
            .join(pb::JoinRequest {
                event_id: event.into(),
                user_id: u.clone(),
                session_id: "loadgen".into(),
            })
            .await
            .context("Join")?
            .into_inner();
        queue.push(t.queue_token);
    }
    let mut tokens = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for q in queue {
        loop {
            let s = wr
                .get_status(pb::GetStatusRequest {
                    queue_token: q.clone(),
                })
                .await
                .context("GetStatus")?
                .into_inner();
            if s.state == pb::QueueState::Admitted as i32 {
                tokens.push(s.admission_token);
                break;
            }
            if Instant::now() > deadline {
                bail!("not admitted within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(tokens)
}

/// Runs the load and returns the figures.
pub async fn run(args: LoadgenArgs) -> anyhow::Result<LoadReport> {
    if args.concurrency == 0 || args.requests == 0 || args.connections == 0 {
        bail!("--concurrency, --requests and --connections must be at least 1");
    }
    let mut channels = Vec::new();
    for _ in 0..args.connections {
        channels.push(connect(&args.target).await?);
    }
    let client = Bearer::new(&args.client_key)?;
    let admin = Bearer::new(&args.admin_key)?;
    let pick = {
        let channels = channels.clone();
        move |i: usize| channels[i % channels.len()].clone()
    };

    // 1. The ceiling: an empty RPC through the same client stack.
    let health = {
        let pick = pick.clone();
        drive("health", args.requests, args.concurrency, move |i| {
            let mut c = tonic_health::pb::health_client::HealthClient::new(pick(i));
            async move {
                c.check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .map(|_| ())
            }
        })
        .await
    };

    // An event for the run: admission is instant, places are plenty.
    let event_id = format!("loadgen-{}", ulid_like());
    let mut events =
        pb::event_service_client::EventServiceClient::with_interceptor(channels[0].clone(), admin);
    events
        .create_event(pb::CreateEventRequest {
            event_id: event_id.clone(),
            name: "loadgen".into(),
            sections: (0..16)
                .map(|s| pb::SectionSpec {
                    section_id: format!("s{s}"),
                    name: format!("S{s}"),
                    price_cents: 100,
                    layout: Some(pb::section_spec::Layout::GeneralAdmissionCapacity(
                        u32::try_from(args.requests)
                            .unwrap_or(u32::MAX)
                            .saturating_add(1_000),
                    )),
                })
                .collect(),
            hold_ttl_seconds: 600,
            per_user_limit: 100,
            admit_rate_per_second: 1_000_000,
            admission_window_seconds: 3_600,
            sale_opens_at_unix_ms: 0,
        })
        .await
        .context("CreateEvent (is --admin-key an admin key?)")?;
    let mut wr = pb::waiting_room_service_client::WaitingRoomServiceClient::with_interceptor(
        channels[0].clone(),
        client.clone(),
    );

    // 2. Queue polls: one fan per stream, polling its status.
    let pollers: Vec<String> = (0..args.concurrency)
        .map(|t| format!("{event_id}-poller-{t}"))
        .collect();
    let mut queue_tokens = Vec::new();
    for u in &pollers {
        let t = wr
            .join(pb::JoinRequest {
                event_id: event_id.clone(),
                user_id: u.clone(),
                session_id: "loadgen".into(),
            })
            .await
            .context("Join")?;
        queue_tokens.push(t.into_inner().queue_token);
    }
    let queue_tokens = Arc::new(queue_tokens);
    let status = {
        let (pick, client, queue_tokens) = (pick.clone(), client.clone(), queue_tokens.clone());
        let concurrency = args.concurrency;
        drive("GetStatus", args.requests, args.concurrency, move |i| {
            let mut c = pb::waiting_room_service_client::WaitingRoomServiceClient::with_interceptor(
                pick(i),
                client.clone(),
            );
            let token = queue_tokens[i % concurrency].clone();
            async move {
                c.get_status(pb::GetStatusRequest { queue_token: token })
                    .await
                    .map(|_| ())
            }
        })
        .await
    };

    // 3. Durable holds: one place each, spread over 16 sections, 100 per user.
    let users: Vec<String> = (0..args.requests.div_ceil(100))
        .map(|u| format!("{event_id}-holder-{u}"))
        .collect();
    let tokens = Arc::new(admit(&mut wr, &event_id, &users).await?);
    let users = Arc::new(users);
    let hold = {
        let (pick, client) = (pick.clone(), client.clone());
        let event_id = event_id.clone();
        drive("Hold", args.requests, args.concurrency, move |i| {
            let mut c = pb::booking_service_client::BookingServiceClient::with_interceptor(
                pick(i),
                client.clone(),
            );
            let req = pb::HoldRequest {
                event_id: event_id.clone(),
                user_id: users[i / 100].clone(),
                admission_token: tokens[i / 100].clone(),
                idempotency_key: format!("lg-{i}"),
                selection: Some(pb::hold_request::Selection::BestAvailable(
                    pb::BestAvailable {
                        section_id: format!("s{}", i % 16),
                        quantity: 1,
                    },
                )),
            };
            async move { c.hold(req).await.map(|_| ()) }
        })
        .await
    };
    Ok(LoadReport {
        concurrency: args.concurrency,
        rpcs: vec![health, status, hold],
    })
}

fn ulid_like() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{ms:x}")
}
