//! Rows (a) and (d): an embedded boxoffice server (`Durability::Sync`, a temporary data dir,
//! `127.0.0.1:0`) on its own 2-worker runtime, an event of general-admission sections
//! totalling the seats, every contender admitted through the waiting room (untimed), then the
//! timed holds: unary `Hold`s (a) or `HoldBatch`es (d), over the client stack of
//! `boxoffice loadgen` (`boxoffice_client::connect`, a bearer client key, one tonic channel per
//! connection, calls round robin over them, measured by `boxoffice_drill::measure::drive`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use boxoffice_client::{Authed, Bearer, connect};
use boxoffice_drill::admission;
use boxoffice_drill::measure::{drive, health_ceiling};
use boxoffice_engine::Durability;
use boxoffice_gateway::server::{Running, ServerConfig, start};
use boxoffice_proto::v1 as pb;
use pb::booking_service_client::BookingServiceClient;
use pb::waiting_room_service_client::WaitingRoomServiceClient;
use tokio::runtime::Runtime;
use tonic::transport::Channel;

use super::workload::{
    HealthResult, Latency, Outcomes, Row, RowResult, SOLD_OUT, Workload, describe, histogram,
    micros_since, runtime,
};

/// The admin key of the embedded servers.
pub const ADMIN_KEY: &str = "compare-admin";
/// The client key of the embedded servers (and of the Redis front).
pub const CLIENT_KEY: &str = "compare-client";
const TOKEN_SECRET: &[u8] = b"compare-token-secret";
/// The event of every row.
pub const EVENT_ID: &str = "compare";
/// Hold TTL of every row: 10 minutes (the seeds' time to pay).
pub const HOLD_TTL_SECONDS: u32 = 600;
/// Places one user may hold at once, in every row (each contender holds one).
pub const PER_USER_LIMIT: u32 = 1;
/// How long an idempotency key's first answer is kept: boxoffice's default window, 24 hours.
pub const IDEMPOTENCY_WINDOW_SECONDS: u64 = 24 * 3600;
/// How long a contender may wait for admission during the setup.
const ADMIT_WAIT_MAX: Duration = Duration::from_secs(120);

/// An embedded boxoffice server on a runtime of its own, stopped by [`Embedded::stop`] (or, less
/// cleanly, when dropped).
pub struct Embedded {
    running: Option<Running>,
    rt: Option<Runtime>,
    _dir: tempfile::TempDir,
    /// Its gRPC address.
    pub addr: SocketAddr,
}

impl Embedded {
    /// Starts a server (`Durability::Sync`, a new temporary data dir, no metrics endpoint, no
    /// periodic reconciliation) and waits until it has recovered. Call from outside any
    /// runtime.
    pub fn start() -> anyhow::Result<Embedded> {
        let rt = runtime("boxoffice-server")?;
        let dir = tempfile::tempdir().context("a temporary data dir")?;
        let mut cfg = ServerConfig::new(ADMIN_KEY, CLIENT_KEY, TOKEN_SECRET);
        cfg.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        cfg.metrics_listen = None;
        cfg.data_dir = dir.path().to_path_buf();
        cfg.durability = Durability::Sync;
        cfg.reconcile_every = None;
        let running = rt.block_on(async {
            let mut s = start(cfg).await.context("starting the embedded server")?;
            s.wait_ready()
                .await
                .context("the embedded server's recovery")?;
            anyhow::Ok(s)
        })?;
        Ok(Embedded {
            addr: running.addr,
            running: Some(running),
            rt: Some(rt),
            _dir: dir,
        })
    }

    /// Drains and stops the server (the log flushed), then its runtime.
    pub fn stop(mut self) -> anyhow::Result<()> {
        let (Some(running), Some(rt)) = (self.running.take(), self.rt.take()) else {
            return Ok(());
        };
        let r = rt.block_on(running.shutdown());
        rt.shutdown_timeout(Duration::from_secs(10));
        r.context("stopping the embedded server")
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let Some(rt) = self.rt.take() else { return };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Inside a runtime nothing may block: abandon the server's tasks.
            drop(self.running.take());
            rt.shutdown_background();
            return;
        }
        if let Some(running) = self.running.take() {
            let _ = rt.block_on(running.shutdown());
        }
        rt.shutdown_timeout(Duration::from_secs(10));
    }
}

/// `connections` channels to `addr`, as `boxoffice loadgen` opens them.
pub async fn channels(addr: SocketAddr, connections: usize) -> anyhow::Result<Vec<Channel>> {
    let target = format!("http://{addr}");
    let mut out = Vec::with_capacity(connections);
    for _ in 0..connections {
        out.push(connect(&target).await?);
    }
    Ok(out)
}

/// The user id of contender `i`.
pub fn user_of(i: usize) -> String {
    format!("c{i}")
}

/// The section ids of the workload's event: `s0`, `s1`, ...
pub fn section_ids(w: &Workload) -> Vec<String> {
    (0..w.sections()).map(|s| format!("s{s}")).collect()
}

/// The event: general-admission sections totalling the seats, admission instant and long
/// (1,000,000 a second, an hour), no proof of work, a per-user limit of 1 (each contender
/// holds one place), holds of 10 minutes.
async fn create_event(ch: &Channel, w: &Workload) -> anyhow::Result<()> {
    let mut events = pb::event_service_client::EventServiceClient::with_interceptor(
        ch.clone(),
        Bearer::new(ADMIN_KEY)?,
    );
    events
        .create_event(pb::CreateEventRequest {
            event_id: EVENT_ID.into(),
            name: "compare".into(),
            sections: section_ids(w)
                .into_iter()
                .enumerate()
                .map(|(s, id)| pb::SectionSpec {
                    name: id.to_uppercase(),
                    section_id: id,
                    price_cents: 5_000,
                    layout: Some(pb::section_spec::Layout::GeneralAdmissionCapacity(
                        w.section_capacity(s),
                    )),
                    price_tiers: Vec::new(),
                })
                .collect(),
            hold_ttl_seconds: HOLD_TTL_SECONDS,
            per_user_limit: PER_USER_LIMIT,
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
        .context("CreateEvent")?;
    Ok(())
}

/// Admission tokens of every contender: `concurrency` workers, each taking the next contender,
/// joining the line for them and polling `GetStatus` until admitted (as `loadgen`'s `admit`).
async fn admit_all(
    channels: &[Channel],
    key: &Bearer,
    contenders: usize,
    concurrency: usize,
) -> anyhow::Result<Vec<String>> {
    let tokens: Arc<Vec<OnceLock<String>>> =
        Arc::new((0..contenders).map(|_| OnceLock::new()).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let rooms: Vec<WaitingRoomServiceClient<Authed>> = channels
        .iter()
        .map(|ch| WaitingRoomServiceClient::with_interceptor(ch.clone(), key.clone()))
        .collect();
    let workers: Vec<_> = (0..concurrency.min(contenders))
        .map(|_| {
            let (tokens, next, rooms) = (tokens.clone(), next.clone(), rooms.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= tokens.len() {
                        return anyhow::Ok(());
                    }
                    let mut room = rooms[i % rooms.len()].clone();
                    let token = admit_one(&mut room, &user_of(i)).await?;
                    let _ = tokens[i].set(token);
                }
            })
        })
        .collect();
    for w in workers {
        w.await.context("an admission worker panicked")??;
    }
    let tokens = Arc::try_unwrap(tokens).map_err(|_| anyhow::anyhow!("workers still running"))?;
    tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.into_inner()
                .ok_or_else(|| anyhow::anyhow!("contender {i} has no admission token"))
        })
        .collect()
}

async fn admit_one(
    room: &mut WaitingRoomServiceClient<Authed>,
    user: &str,
) -> anyhow::Result<String> {
    let queue_token = admission::join(room, EVENT_ID, user, "compare").await?;
    admission::admitted(room, &queue_token, ADMIT_WAIT_MAX)
        .await
        .with_context(|| format!("admitting {user}"))
}

/// A server ready for the timed part: channels, the event, every contender's admission token.
struct Prepared {
    channels: Vec<Channel>,
    key: Bearer,
    tokens: Arc<Vec<String>>,
    sections: Arc<Vec<String>>,
}

async fn prepare(addr: SocketAddr, w: &Workload) -> anyhow::Result<Prepared> {
    let channels = channels(addr, w.connections).await?;
    create_event(&channels[0], w).await?;
    let key = Bearer::new(CLIENT_KEY)?;
    let tokens = admit_all(&channels, &key, w.contenders, w.setup_concurrency).await?;
    Ok(Prepared {
        channels,
        key,
        tokens: Arc::new(tokens),
        sections: Arc::new(section_ids(w)),
    })
}

impl Prepared {
    fn booking(&self) -> Arc<Vec<BookingServiceClient<Authed>>> {
        Arc::new(
            self.channels
                .iter()
                .map(|ch| BookingServiceClient::with_interceptor(ch.clone(), self.key.clone()))
                .collect(),
        )
    }

    fn selection(&self, w: &Workload, i: usize) -> pb::BestAvailable {
        pb::BestAvailable {
            section_id: self.sections[w.section_of(i)].clone(),
            quantity: 1,
        }
    }
}

/// Row (a): unary `Hold`s, `in_flight` at once.
pub fn row_a(
    w: &Workload,
    client: &Runtime,
    health: bool,
) -> anyhow::Result<(RowResult, Option<HealthResult>)> {
    row(Row::A, w, client, health)
}

/// Row (d): `HoldBatch`es of `batch` items, `in_flight / batch` calls at once (at least 1).
pub fn row_d(
    w: &Workload,
    client: &Runtime,
    health: bool,
) -> anyhow::Result<(RowResult, Option<HealthResult>)> {
    row(Row::D, w, client, health)
}

fn row(
    row: Row,
    w: &Workload,
    client: &Runtime,
    health: bool,
) -> anyhow::Result<(RowResult, Option<HealthResult>)> {
    let setup_started = Instant::now();
    let server = Embedded::start()?;
    let out = client.block_on(async {
        let p = prepare(server.addr, w).await?;
        let setup = setup_started.elapsed();
        eprintln!(
            "  setup: server started, event created, {} contenders admitted in {:.1} s (untimed)",
            w.contenders,
            setup.as_secs_f64()
        );
        let mut result = match row {
            Row::D => hold_batches(&p, w).await,
            _ => holds(&p, w).await,
        };
        result.setup_seconds = setup.as_secs_f64();
        check_event(&p, w, &mut result).await;
        let health = if health {
            Some(health_check(&p.channels, w, row).await)
        } else {
            None
        };
        anyhow::Ok((result, health))
    });
    let stopped = server.stop();
    let out = out?;
    stopped?;
    Ok(out)
}

/// Contender `i`'s idempotency key: `k{i}` with [`Workload::keys`], none without.
pub fn key_of(w: &Workload, i: usize) -> String {
    if w.keys {
        format!("k{i}")
    } else {
        String::new()
    }
}

/// The timed part of (a): contender `i`'s `Hold` over channel `i mod connections`.
async fn holds(p: &Prepared, w: &Workload) -> RowResult {
    let outcomes = Outcomes::new(w.contenders);
    let booking = p.booking();
    let (tokens, o, wl) = (p.tokens.clone(), outcomes.clone(), w.clone());
    let selections: Arc<Vec<pb::BestAvailable>> =
        Arc::new((0..w.contenders).map(|i| p.selection(w, i)).collect());
    let figures = drive("Hold", wl.contenders, wl.in_flight, move |i| {
        let mut c = booking[i % booking.len()].clone();
        let req = pb::HoldRequest {
            event_id: EVENT_ID.into(),
            user_id: user_of(i),
            admission_token: tokens[i].clone(),
            idempotency_key: key_of(&wl, i),
            selection: Some(pb::hold_request::Selection::BestAvailable(
                selections[i].clone(),
            )),
            access_code: String::new(),
        };
        let o = o.clone();
        async move {
            let started = Instant::now();
            let r = c.hold(req).await.map(|h| h.into_inner().hold_id);
            o.unary(i, r, micros_since(started))
        }
    })
    .await;
    RowResult::measured(
        Row::A,
        w,
        &outcomes,
        figures.seconds,
        figures.calls,
        Latency::of_figures(&figures),
    )
}

/// The timed part of (d): batch `k` carries contenders `k * batch ..`, over channel
/// `k mod connections`; each attempt's latency is its batch call's.
async fn hold_batches(p: &Prepared, w: &Workload) -> RowResult {
    let outcomes = Outcomes::new(w.contenders);
    let booking = p.booking();
    let latency = Arc::new(Mutex::new(histogram()));
    let batches = w.contenders.div_ceil(w.batch);
    let concurrent = (w.in_flight / w.batch).max(1);
    let items: Arc<Vec<pb::HoldBatchItem>> = Arc::new(
        (0..w.contenders)
            .map(|i| pb::HoldBatchItem {
                user_id: user_of(i),
                admission_token: p.tokens[i].clone(),
                idempotency_key: key_of(w, i),
                selection: Some(pb::hold_batch_item::Selection::BestAvailable(
                    p.selection(w, i),
                )),
                access_code: String::new(),
            })
            .collect(),
    );
    let (o, lat, batch) = (outcomes.clone(), latency.clone(), w.batch);
    let figures = drive("HoldBatch", batches, concurrent, move |k| {
        let mut c = booking[k % booking.len()].clone();
        let range = k * batch..((k + 1) * batch).min(items.len());
        let req = pb::HoldBatchRequest {
            event_id: EVENT_ID.into(),
            items: items[range.clone()].to_vec(),
        };
        let (o, lat) = (o.clone(), lat.clone());
        async move {
            let started = Instant::now();
            let r = c.hold_batch(req).await;
            let us = micros_since(started);
            if let Ok(mut h) = lat.lock() {
                let _ = h.record_n(us, range.len() as u64);
            }
            let results = match r {
                Ok(resp) => resp.into_inner().results,
                Err(s) => {
                    o.other(range.len() as u64, describe(&s));
                    return Err(s);
                }
            };
            if results.len() != range.len() {
                o.other(
                    range.len().saturating_sub(results.len()) as u64,
                    format!("{} results for {} items", results.len(), range.len()),
                );
            }
            for (i, result) in range.zip(results) {
                match result.result {
                    Some(pb::hold_batch_result::Result::Hold(h)) => o.held(i, h.hold_id, us),
                    Some(pb::hold_batch_result::Result::Error(e)) if e.reason == SOLD_OUT => {
                        o.sold_out(us);
                    }
                    Some(pb::hold_batch_result::Result::Error(e)) => o.other(
                        1,
                        format!(
                            "item error {:?} {}: {}",
                            tonic::Code::from_i32(e.code),
                            e.reason,
                            e.message
                        ),
                    ),
                    None => o.other(1, "an item result with neither hold nor error".into()),
                }
            }
            Ok(())
        }
    })
    .await;
    let latency = latency
        .lock()
        .map(|h| Latency::of_histogram(&h))
        .unwrap_or_default();
    RowResult::measured(
        Row::D,
        w,
        &outcomes,
        figures.seconds,
        figures.calls,
        latency,
    )
}

/// The engine's own count after the run (`GetEvent`): places held or sold must be the distinct
/// holds, places available the rest. Published counts may trail the answers for a moment, so
/// this waits up to 5 s for them to agree.
async fn check_event(p: &Prepared, w: &Workload, result: &mut RowResult) {
    let mut events = pb::event_service_client::EventServiceClient::with_interceptor(
        p.channels[0].clone(),
        p.key.clone(),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = events
            .get_event(pb::GetEventRequest {
                event_id: EVENT_ID.into(),
            })
            .await;
        let (taken, available) = match got {
            Ok(e) => e
                .into_inner()
                .sections
                .iter()
                .fold((0u64, 0u64), |(t, a), s| {
                    (
                        t + u64::from(s.held) + u64::from(s.sold),
                        a + u64::from(s.available),
                    )
                }),
            Err(s) => {
                result
                    .failed_checks
                    .push(format!("GetEvent after the run failed: {}", describe(&s)));
                return;
            }
        };
        result.server_count = format!("engine: {taken} places held or sold, {available} available");
        let agrees =
            taken == result.distinct_holds && available == u64::from(w.seats).saturating_sub(taken);
        if agrees {
            if taken > u64::from(w.seats) {
                result.failed_checks.push(format!(
                    "the engine counts {taken} places taken of {}",
                    w.seats
                ));
            }
            return;
        }
        if Instant::now() > deadline {
            result.failed_checks.push(format!(
                "the engine's count disagrees: {taken} held or sold and {available} available, \
                 {} distinct holds answered, {} seats",
                result.distinct_holds, w.seats
            ));
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The ceiling: `grpc.health.v1.Health/Check`, `in_flight` at once over the same channels (as
/// `loadgen` measures it).
async fn health_check(channels: &[Channel], w: &Workload, against: Row) -> HealthResult {
    let figures = health_ceiling(channels, w.health_calls, w.in_flight).await;
    HealthResult::of(against.key(), &figures)
}
