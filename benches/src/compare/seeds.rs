//! Rows (b) and (c): the seeds' design (`shared/seeds/flash-sale-design-notes.txt`): the seats
//! as one Redis counter, each hold one `EVALSHA` of a reserve Lua script that checks, decrements
//! and writes a hold with a TTL in one atomic step.
//!
//! - (b) [`row_b`]: a tonic `BookingService` front ([`Front`], only `Hold` is real) on its own
//!   2-worker runtime, calling the script over a few multiplexed Redis connections; the client
//!   is row (a)'s, sending `Hold`s over 16 HTTP/2 connections.
//! - (c) [`row_c`]: no front: the client keeps `in_flight` script calls in flight over 16
//!   multiplexed Redis connections (which pipeline them).
//!
//! Each row starts its own `redis-server` child ([`RedisServer`], killed when dropped) on a
//! free loopback port and a temporary dir, and checks the counter and the hold keys afterwards.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use boxoffice_client::{Authed, Bearer};
use boxoffice_drill::measure::drive;
use boxoffice_proto::v1 as pb;
use pb::booking_service_client::BookingServiceClient;
use pb::booking_service_server::{BookingService, BookingServiceServer};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Script};
use tokio::runtime::Runtime;
use tonic::{Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::ours::{CLIENT_KEY, EVENT_ID, HOLD_TTL_SECONDS, channels, user_of};
use super::workload::{Latency, Outcomes, Row, RowResult, Workload, runtime};

/// The reserve script: check, decrement and hold in one atomic step (the seeds' `reserve.lua`).
/// `KEYS[1]`: the seats-left counter; `KEYS[2]`: the hold id sequence. `ARGV`: quantity, user
/// id, hold TTL in ms. Returns the new hold's id, or 0 if fewer places than asked are left.
pub const RESERVE_LUA: &str = r"
local qty = tonumber(ARGV[1])
local left = tonumber(redis.call('GET', KEYS[1]) or '0')
if left < qty then
  return 0
end
redis.call('DECRBY', KEYS[1], qty)
local id = redis.call('INCR', KEYS[2])
redis.call('SET', 'hold:' .. id, ARGV[2] .. ' ' .. qty, 'PX', ARGV[3])
return id
";

/// The seats-left counter of the event.
pub fn seats_key() -> String {
    format!("event:{EVENT_ID}:seats_left")
}

/// The hold id sequence of the event.
pub fn sequence_key() -> String {
    format!("event:{EVENT_ID}:hold_seq")
}

/// Hold TTL in ms (10 minutes, as rows a and d).
const HOLD_TTL_MS: u64 = HOLD_TTL_SECONDS as u64 * 1000;

/// The `redis-server` on `PATH`, if any.
pub fn find_redis_server() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-server"))
        .find(|p| p.is_file())
}

/// A `redis-server` child on a free loopback port, append-only file fsynced every second, no
/// snapshots, in a temporary dir; killed when dropped (also on an error or a panic).
pub struct RedisServer {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts `bin` and waits until it answers `PING` (10 s at most).
    pub fn start(bin: &Path) -> anyhow::Result<RedisServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port")?
            .port();
        let dir = tempfile::tempdir().context("a temporary dir for redis-server")?;
        let child = Command::new(bin)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--appendonly", "yes", "--appendfsync", "everysec"])
            .args(["--save", "", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(dir.path().join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut server = RedisServer { child, port, dir };
        server.wait_for_ping()?;
        Ok(server)
    }

    fn wait_for_ping(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!(
                    "redis-server exited ({status}) before answering PING; its log: {}",
                    self.log()
                );
            }
            if ping(self.port) {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "redis-server did not answer PING within 10 s; its log: {}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 16];
    s.write_all(b"PING\r\n").is_ok()
        && s.read(&mut buf)
            .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
}

/// Multiplexed connections to `url` (made on the current runtime, whose tasks drive them),
/// answers awaited up to 30 s (the crate's default is 500 ms).
async fn connections(url: &str, n: usize) -> anyhow::Result<Vec<MultiplexedConnection>> {
    let client = redis::Client::open(url)?;
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .context("connecting to redis-server")?,
        );
    }
    Ok(out)
}

/// The sale's starting state: `seats` left, no holds; the script loaded (so every call of the
/// timed part is one `EVALSHA`).
async fn seed(con: &mut MultiplexedConnection, seats: u32) -> anyhow::Result<Script> {
    redis::cmd("FLUSHALL").query_async::<()>(con).await?;
    redis::cmd("SET")
        .arg(seats_key())
        .arg(seats)
        .query_async::<()>(con)
        .await?;
    let script = Script::new(RESERVE_LUA);
    script.load_async(con).await.context("SCRIPT LOAD")?;
    Ok(script)
}

/// One reserve call: the new hold's id, or 0 (sold out).
async fn reserve(
    script: &Script,
    con: &mut MultiplexedConnection,
    quantity: u32,
    user: &str,
) -> redis::RedisResult<i64> {
    script
        .key(seats_key())
        .key(sequence_key())
        .arg(quantity)
        .arg(user)
        .arg(HOLD_TTL_MS)
        .invoke_async(con)
        .await
}

/// What Redis holds after a row: the counter, and the hold keys (by `SCAN`).
async fn check_redis(con: &mut MultiplexedConnection, w: &Workload, result: &mut RowResult) {
    let left: Option<i64> = match redis::cmd("GET").arg(seats_key()).query_async(con).await {
        Ok(v) => v,
        Err(e) => {
            result
                .failed_checks
                .push(format!("GET seats_left failed: {e}"));
            return;
        }
    };
    let mut keys = HashSet::new();
    let mut cursor = 0u64;
    loop {
        let page: (u64, Vec<String>) = match redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("hold:*")
            .arg("COUNT")
            .arg(1_000)
            .query_async(con)
            .await
        {
            Ok(p) => p,
            Err(e) => {
                result.failed_checks.push(format!("SCAN failed: {e}"));
                return;
            }
        };
        keys.extend(page.1);
        cursor = page.0;
        if cursor == 0 {
            break;
        }
    }
    let Some(left) = left else {
        result.failed_checks.push("seats_left is gone".into());
        return;
    };
    result.seats_left = Some(left);
    result.server_count = format!("redis: seats_left = {left}, {} hold keys", keys.len());
    let expected_left = i64::from(w.seats) - result.held as i64;
    if left < 0 {
        result
            .failed_checks
            .push(format!("seats_left went NEGATIVE: {left}"));
        result.oversold = result.oversold.max(left.unsigned_abs());
    }
    if left != expected_left {
        result.failed_checks.push(format!(
            "seats_left is {left}, {expected_left} expected ({} seats, {} held)",
            w.seats, result.held
        ));
    }
    if keys.len() as u64 != result.held {
        result.failed_checks.push(format!(
            "{} hold keys for {} holds answered",
            keys.len(),
            result.held
        ));
    }
}

/// The reason and domain of a sold-out answer, as boxoffice answers it.
fn sold_out() -> Status {
    Status::with_error_details(
        tonic::Code::FailedPrecondition,
        "sold out",
        ErrorDetails::with_error_info(super::workload::SOLD_OUT, "boxoffice", HashMap::new()),
    )
}

fn invalid(field: &str, message: &str) -> Status {
    Status::with_error_details(
        tonic::Code::InvalidArgument,
        message,
        ErrorDetails::with_error_info(
            "INVALID_REQUEST",
            "boxoffice",
            HashMap::from([("field".to_owned(), field.to_owned())]),
        ),
    )
}

/// The seeds' booking API as a tonic `BookingService`: `Hold` validates its request and runs the
/// reserve script on one of a few multiplexed connections (round robin); every other method
/// answers `UNIMPLEMENTED`. It checks the API key, not admission tokens.
pub struct Front {
    conns: Vec<MultiplexedConnection>,
    next: AtomicUsize,
    script: Script,
    authorization: String,
}

impl Front {
    fn connection(&self) -> MultiplexedConnection {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.conns[i % self.conns.len()].clone()
    }
}

fn unimplemented() -> Status {
    Status::unimplemented("the comparison's Redis front only holds")
}

#[tonic::async_trait]
impl BookingService for Front {
    async fn hold(&self, req: Request<pb::HoldRequest>) -> Result<Response<pb::Hold>, Status> {
        let authorized = req
            .metadata()
            .get("authorization")
            .is_some_and(|v| v.as_bytes() == self.authorization.as_bytes());
        if !authorized {
            return Err(Status::unauthenticated("a client key is needed"));
        }
        let req = req.into_inner();
        if req.event_id.is_empty() {
            return Err(invalid("event_id", "event_id is required"));
        }
        if req.event_id != EVENT_ID {
            return Err(Status::with_error_details(
                tonic::Code::NotFound,
                "no such event",
                ErrorDetails::with_error_info("EVENT_NOT_FOUND", "boxoffice", HashMap::new()),
            ));
        }
        if req.user_id.is_empty() || req.user_id.len() > 64 {
            return Err(invalid("user_id", "user_id must be 1 to 64 bytes"));
        }
        let (section_id, quantity) = match req.selection {
            Some(pb::hold_request::Selection::BestAvailable(b)) => (b.section_id, b.quantity),
            Some(_) => {
                return Err(invalid(
                    "selection",
                    "only best_available in general admission here",
                ));
            }
            None => return Err(invalid("selection", "a selection is required")),
        };
        if !(1..=100).contains(&quantity) {
            return Err(invalid("quantity", "quantity must be 1 to 100"));
        }
        let mut con = self.connection();
        let id = reserve(&self.script, &mut con, quantity, &req.user_id)
            .await
            .map_err(|e| Status::unavailable(format!("redis: {e}")))?;
        if id <= 0 {
            return Err(sold_out());
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        Ok(Response::new(pb::Hold {
            hold_id: id.to_string(),
            event_id: req.event_id,
            user_id: req.user_id,
            section_id,
            seat_ids: Vec::new(),
            quantity,
            status: pb::HoldStatus::Held as i32,
            expires_at_unix_ms: now_ms + HOLD_TTL_MS as i64,
            // The seeds' script knows no prices.
            ..Default::default()
        }))
    }

    async fn hold_batch(
        &self,
        _req: Request<pb::HoldBatchRequest>,
    ) -> Result<Response<pb::HoldBatchResponse>, Status> {
        Err(unimplemented())
    }

    async fn confirm(
        &self,
        _req: Request<pb::ConfirmRequest>,
    ) -> Result<Response<pb::Order>, Status> {
        Err(unimplemented())
    }

    async fn release(
        &self,
        _req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        Err(unimplemented())
    }

    async fn get_hold(
        &self,
        _req: Request<pb::GetHoldRequest>,
    ) -> Result<Response<pb::Hold>, Status> {
        Err(unimplemented())
    }

    async fn get_order(
        &self,
        _req: Request<pb::GetOrderRequest>,
    ) -> Result<Response<pb::Order>, Status> {
        Err(unimplemented())
    }

    async fn transfer_tickets(
        &self,
        _req: Request<pb::TransferTicketsRequest>,
    ) -> Result<Response<pb::TransferTicketsResponse>, Status> {
        Err(unimplemented())
    }

    async fn cancel_tickets(
        &self,
        _req: Request<pb::CancelTicketsRequest>,
    ) -> Result<Response<pb::CancelTicketsResponse>, Status> {
        Err(unimplemented())
    }

    async fn list_orders(
        &self,
        _req: Request<pb::ListOrdersRequest>,
    ) -> Result<Response<pb::ListOrdersResponse>, Status> {
        Err(unimplemented())
    }
}

/// The front serving on its own runtime; stopped when dropped.
pub struct FrontServer {
    rt: Option<Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
    /// Its gRPC address.
    pub addr: SocketAddr,
}

impl FrontServer {
    /// Starts a front on `127.0.0.1:0` with `redis_connections` connections to `url`. Call
    /// from outside any runtime.
    pub fn start(url: &str, redis_connections: usize) -> anyhow::Result<FrontServer> {
        let rt = runtime("redis-front")?;
        let (addr, stop, task) = rt.block_on(async {
            let conns = connections(url, redis_connections).await?;
            let front = Front {
                conns,
                next: AtomicUsize::new(0),
                script: Script::new(RESERVE_LUA),
                authorization: format!("Bearer {CLIENT_KEY}"),
            };
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(BookingServiceServer::new(front))
                    .serve_with_incoming_shutdown(incoming, async move {
                        let _ = stopped.await;
                    }),
            );
            anyhow::Ok((addr, stop, task))
        })?;
        Ok(FrontServer {
            rt: Some(rt),
            stop: Some(stop),
            task: Some(task),
            addr,
        })
    }
}

impl Drop for FrontServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(rt) = self.rt.take() else { return };
        if tokio::runtime::Handle::try_current().is_ok() {
            rt.shutdown_background();
            return;
        }
        if let Some(task) = self.task.take() {
            let _ =
                rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), task).await });
        }
        rt.shutdown_timeout(Duration::from_secs(10));
    }
}

/// Row (b): `Hold`s over 16 HTTP/2 connections to the front, `in_flight` at once.
pub fn row_b(w: &Workload, client: &Runtime, redis_server: &Path) -> anyhow::Result<RowResult> {
    let setup_started = Instant::now();
    let redis = RedisServer::start(redis_server)?;
    let url = redis.url();
    let mut check_con = client.block_on(async {
        let mut con = connections(&url, 1).await?.remove(0);
        seed(&mut con, w.seats).await?;
        anyhow::Ok(con)
    })?;
    let front = FrontServer::start(&url, w.front_redis_connections)?;
    let mut result = client.block_on(async {
        let channels = channels(front.addr, w.connections).await?;
        let key = Bearer::new(CLIENT_KEY)?;
        let booking: Arc<Vec<BookingServiceClient<Authed>>> = Arc::new(
            channels
                .iter()
                .map(|ch| BookingServiceClient::with_interceptor(ch.clone(), key.clone()))
                .collect(),
        );
        let setup = setup_started.elapsed();
        let outcomes = Outcomes::new(w.contenders);
        let sections: Arc<Vec<String>> = Arc::new(super::ours::section_ids(w));
        let (o, wl) = (outcomes.clone(), w.clone());
        let figures = drive("Hold", w.contenders, w.in_flight, move |i| {
            let mut c = booking[i % booking.len()].clone();
            let req = pb::HoldRequest {
                event_id: EVENT_ID.into(),
                user_id: user_of(i),
                admission_token: String::new(),
                idempotency_key: format!("k{i}"),
                selection: Some(pb::hold_request::Selection::BestAvailable(
                    pb::BestAvailable {
                        section_id: sections[wl.section_of(i)].clone(),
                        quantity: 1,
                    },
                )),
                access_code: String::new(),
            };
            let o = o.clone();
            async move {
                let r = c.hold(req).await.map(|h| h.into_inner().hold_id);
                o.unary(i, r)
            }
        })
        .await;
        let mut result = RowResult::measured(
            Row::B,
            w,
            &outcomes,
            figures.seconds,
            figures.calls,
            Latency::of_figures(&figures),
        );
        result.setup_seconds = setup.as_secs_f64();
        anyhow::Ok(result)
    })?;
    drop(front);
    client.block_on(check_redis(&mut check_con, w, &mut result));
    drop(check_con);
    drop(redis);
    Ok(result)
}

/// Row (c): the client runs the script itself, `in_flight` calls at once over `connections`
/// multiplexed connections (call `i` on connection `i mod connections`).
pub fn row_c(w: &Workload, client: &Runtime, redis_server: &Path) -> anyhow::Result<RowResult> {
    let setup_started = Instant::now();
    let redis = RedisServer::start(redis_server)?;
    let url = redis.url();
    let result = client.block_on(async {
        let mut conns = connections(&url, w.connections).await?;
        let script = Arc::new(seed(&mut conns[0], w.seats).await?);
        let mut check_con = conns[0].clone();
        let conns = Arc::new(conns);
        let setup = setup_started.elapsed();
        let outcomes = Outcomes::new(w.contenders);
        let o = outcomes.clone();
        let figures = drive("EVALSHA", w.contenders, w.in_flight, move |i| {
            let mut con = conns[i % conns.len()].clone();
            let (script, o) = (script.clone(), o.clone());
            async move {
                match reserve(&script, &mut con, 1, &user_of(i)).await {
                    Ok(id) if id > 0 => {
                        o.held(i, id.to_string());
                        Ok(())
                    }
                    Ok(_) => {
                        o.sold_out();
                        Ok(())
                    }
                    Err(e) => {
                        // `drive` counts failed calls as tonic statuses.
                        o.other(1, format!("redis: {e}"));
                        Err(Status::unknown(format!("redis: {e}")))
                    }
                }
            }
        })
        .await;
        let mut result = RowResult::measured(
            Row::C,
            w,
            &outcomes,
            figures.seconds,
            figures.calls,
            Latency::of_figures(&figures),
        );
        result.setup_seconds = setup.as_secs_f64();
        check_redis(&mut check_con, w, &mut result).await;
        anyhow::Ok(result)
    })?;
    drop(redis);
    Ok(result)
}
