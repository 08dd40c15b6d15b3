//! Rows (b), (c) and (e): the seeds' design (`shared/seeds/flash-sale-design-notes.txt`): the
//! places in Redis, each hold one `EVALSHA` of a reserve Lua script that checks and holds in one
//! atomic step.
//!
//! - [`FULL_LUA`], the full seeds' script (rows b and c): the idempotency key's first answer
//!   returned if there is one; the section's counter checked ("partition the counter per
//!   section"); the per-user limit checked ("per-user hold limits (e.g. 4 seats)"); then the
//!   counter decremented, the user's count raised, a hold record written with a TTL, the hold put
//!   in an expiry index (a sorted set by expiry, for the sweeper of "a cron sweeper releases
//!   expired holds"), and the answer, refusals too, stored under the idempotency key ("book
//!   takes an idempotency key") for 24 hours.
//! - [`SIMPLIFIED_LUA`], the simplified script (row e, labelled so): one counter for the event,
//!   a hold with a TTL; no per-user limit, no expiry index, no idempotency key.
//! - (b) [`row_b`]: a tonic `BookingService` front ([`Front`], only `Hold` is real) on its own
//!   2-worker runtime, calling the full script over a few multiplexed Redis connections; the
//!   client is row (a)'s, sending `Hold`s over 16 HTTP/2 connections.
//! - (c) [`row_c`], (e) [`row_e`]: no front: the client keeps `in_flight` script calls in
//!   flight over 16 multiplexed Redis connections (which pipeline them).
//!
//! Each row starts its own `redis-server` child ([`RedisServer`], killed when dropped) on a
//! free loopback port and a temporary dir, and checks the counters, the hold keys and (full
//! script) the expiry index, the users' counts and the stored answers afterwards.

use std::collections::HashMap;
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

use super::ours::{
    CLIENT_KEY, EVENT_ID, HOLD_TTL_SECONDS, IDEMPOTENCY_WINDOW_SECONDS, PER_USER_LIMIT, channels,
    key_of, section_ids, user_of,
};
use super::workload::{Latency, Outcomes, Row, RowResult, Workload, micros_since, runtime};

/// The full seeds' script. `KEYS`: the section's places-left counter, the hold id sequence,
/// the user's held-places count, the expiry index, the idempotency key (unused when `ARGV[7]`
/// is `0`). `ARGV`: quantity, user id, section id, hold TTL (ms), now (Unix ms), per-user
/// limit, `1` if keyed, how long the key's answer is kept (ms). Returns the new hold's id, or
/// `SOLD_OUT`, or `USER_LIMIT`; with a key already answered, that first answer, changing
/// nothing. For one Redis server, as the seeds' design has: the hold record's key is made inside
/// the script (not declared in `KEYS`) and the keys fall in different hash slots, so it would
/// not run unchanged on Redis Cluster.
pub const FULL_LUA: &str = r"
local keyed = ARGV[7] == '1'
if keyed then
  local first = redis.call('GET', KEYS[5])
  if first then
    return first
  end
end
local qty = tonumber(ARGV[1])
local ttl = tonumber(ARGV[4])
local expires = tonumber(ARGV[5]) + ttl
local answer
local left = tonumber(redis.call('GET', KEYS[1]) or '0')
local held = tonumber(redis.call('GET', KEYS[3]) or '0')
if left < qty then
  answer = 'SOLD_OUT'
elseif held + qty > tonumber(ARGV[6]) then
  answer = 'USER_LIMIT'
else
  redis.call('DECRBY', KEYS[1], qty)
  redis.call('INCRBY', KEYS[3], qty)
  redis.call('PEXPIRE', KEYS[3], ttl)
  local id = redis.call('INCR', KEYS[2])
  local hold = 'hold:' .. id
  redis.call('HSET', hold, 'user', ARGV[2], 'section', ARGV[3], 'qty', qty,
    'status', 'held', 'expires', expires)
  redis.call('PEXPIRE', hold, ttl)
  redis.call('ZADD', KEYS[4], expires, id)
  answer = tostring(id)
end
if keyed then
  redis.call('SET', KEYS[5], answer, 'PX', ARGV[8])
end
return answer
";

/// The simplified script (row e): check, decrement and hold in one atomic step, nothing more.
/// `KEYS[1]`: the event's seats-left counter; `KEYS[2]`: the hold id sequence. `ARGV`:
/// quantity, user id, hold TTL in ms. Returns the new hold's id, or 0 if fewer places than
/// asked are left.
pub const SIMPLIFIED_LUA: &str = r"
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

/// Which script a row runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Design {
    /// [`FULL_LUA`].
    Full,
    /// [`SIMPLIFIED_LUA`].
    Simplified,
}

impl Design {
    /// The script's source.
    pub fn source(self) -> &'static str {
        match self {
            Design::Full => FULL_LUA,
            Design::Simplified => SIMPLIFIED_LUA,
        }
    }
}

/// The simplified script's one counter of the event.
pub fn seats_key() -> String {
    format!("event:{EVENT_ID}:seats_left")
}

/// The full script's places-left counter of section `section_id`.
pub fn section_key(section_id: &str) -> String {
    format!("event:{EVENT_ID}:section:{section_id}:left")
}

/// The hold id sequence of the event.
pub fn sequence_key() -> String {
    format!("event:{EVENT_ID}:hold_seq")
}

/// The places `user` holds (full script).
pub fn user_key(user: &str) -> String {
    format!("event:{EVENT_ID}:user:{user}:held")
}

/// The expiry index of the event's holds: hold id by expiry (Unix ms).
pub fn expiry_key() -> String {
    format!("event:{EVENT_ID}:holds_by_expiry")
}

/// Where an idempotency key's first answer is kept.
pub fn idempotency_key(key: &str) -> String {
    format!("idem:{EVENT_ID}:{key}")
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
pub async fn connections(url: &str, n: usize) -> anyhow::Result<Vec<MultiplexedConnection>> {
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

/// The sale's starting state: no holds, the places on the script's counters (one per section
/// for the full script, one for the event for the simplified one); the script loaded (so every
/// call of the timed part is one `EVALSHA`).
pub async fn seed(
    con: &mut MultiplexedConnection,
    w: &Workload,
    design: Design,
) -> anyhow::Result<Script> {
    redis::cmd("FLUSHALL").query_async::<()>(con).await?;
    match design {
        Design::Full => {
            for (s, id) in section_ids(w).iter().enumerate() {
                redis::cmd("SET")
                    .arg(section_key(id))
                    .arg(w.section_capacity(s))
                    .query_async::<()>(con)
                    .await?;
            }
        }
        Design::Simplified => {
            redis::cmd("SET")
                .arg(seats_key())
                .arg(w.seats)
                .query_async::<()>(con)
                .await?;
        }
    }
    let script = Script::new(design.source());
    script.load_async(con).await.context("SCRIPT LOAD")?;
    Ok(script)
}

/// A reserve call's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Held, under this hold id.
    Held(String),
    /// Fewer places left than asked.
    SoldOut,
    /// The user would hold more than the per-user limit (full script).
    UserLimit,
}

impl Answer {
    fn of_full(reply: &str) -> redis::RedisResult<Answer> {
        match reply {
            "SOLD_OUT" => Ok(Answer::SoldOut),
            "USER_LIMIT" => Ok(Answer::UserLimit),
            id if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) => {
                Ok(Answer::Held(id.to_owned()))
            }
            other => Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected answer of the full script",
                other.to_owned(),
            ))),
        }
    }
}

/// One call of `design`'s script: `quantity` places of section `section_id` for `user`, under
/// idempotency key `key` (empty: none; the simplified script never takes one).
pub async fn reserve(
    design: Design,
    script: &Script,
    con: &mut MultiplexedConnection,
    section_id: &str,
    quantity: u32,
    user: &str,
    key: &str,
) -> redis::RedisResult<Answer> {
    match design {
        Design::Full => {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let reply: String = script
                .key(section_key(section_id))
                .key(sequence_key())
                .key(user_key(user))
                .key(expiry_key())
                .key(idempotency_key(key))
                .arg(quantity)
                .arg(user)
                .arg(section_id)
                .arg(HOLD_TTL_MS)
                .arg(now_ms)
                .arg(PER_USER_LIMIT)
                .arg(if key.is_empty() { "0" } else { "1" })
                .arg(IDEMPOTENCY_WINDOW_SECONDS * 1000)
                .invoke_async(con)
                .await?;
            Answer::of_full(&reply)
        }
        Design::Simplified => {
            let id: i64 = script
                .key(seats_key())
                .key(sequence_key())
                .arg(quantity)
                .arg(user)
                .arg(HOLD_TTL_MS)
                .invoke_async(con)
                .await?;
            Ok(if id > 0 {
                Answer::Held(id.to_string())
            } else {
                Answer::SoldOut
            })
        }
    }
}

/// The keys matching `pattern` (by `SCAN`).
async fn count_keys(con: &mut MultiplexedConnection, pattern: &str) -> redis::RedisResult<u64> {
    let mut n = 0u64;
    let mut cursor = 0u64;
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1_000)
            .query_async(con)
            .await?;
        n += page.len() as u64;
        cursor = next;
        if cursor == 0 {
            return Ok(n);
        }
    }
}

/// What Redis holds after a row: the counters, the hold keys and (full script) the expiry
/// index, the users' counts and the stored answers, each against the answers the client got.
async fn check_redis(
    con: &mut MultiplexedConnection,
    w: &Workload,
    design: Design,
    result: &mut RowResult,
) {
    if let Err(e) = try_check_redis(con, w, design, result).await {
        result
            .failed_checks
            .push(format!("reading Redis after the run failed: {e}"));
    }
}

async fn try_check_redis(
    con: &mut MultiplexedConnection,
    w: &Workload,
    design: Design,
    result: &mut RowResult,
) -> redis::RedisResult<()> {
    let counters: Vec<String> = match design {
        Design::Full => section_ids(w).iter().map(|s| section_key(s)).collect(),
        Design::Simplified => vec![seats_key()],
    };
    let mut left = 0i64;
    for key in &counters {
        let v: Option<i64> = redis::cmd("GET").arg(key).query_async(con).await?;
        let Some(v) = v else {
            result.failed_checks.push(format!("{key} is gone"));
            continue;
        };
        if v < 0 {
            result
                .failed_checks
                .push(format!("{key} went NEGATIVE: {v}"));
            result.oversold += v.unsigned_abs();
        }
        left += v;
    }
    let holds = count_keys(con, "hold:*").await?;
    result.seats_left = Some(left);
    let mut count = format!("redis: {left} places left, {holds} hold keys");
    let expected_left = i64::from(w.seats) - result.held as i64;
    if left != expected_left {
        result.failed_checks.push(format!(
            "{left} places left, {expected_left} expected ({} seats, {} held)",
            w.seats, result.held
        ));
    }
    if holds != result.held {
        result.failed_checks.push(format!(
            "{holds} hold keys for {} holds answered",
            result.held
        ));
    }
    if design == Design::Full {
        let indexed: u64 = redis::cmd("ZCARD")
            .arg(expiry_key())
            .query_async(con)
            .await?;
        let users = count_keys(con, &user_key("*")).await?;
        let answers = count_keys(con, &idempotency_key("*")).await?;
        count.push_str(&format!(
            ", {indexed} in the expiry index, {users} users holding, {answers} stored answers"
        ));
        if indexed != result.held {
            result.failed_checks.push(format!(
                "{indexed} holds in the expiry index for {} holds answered",
                result.held
            ));
        }
        if users != result.held {
            result.failed_checks.push(format!(
                "{users} users hold places for {} holds answered (one each)",
                result.held
            ));
        }
        let expected_answers = if w.keys { result.attempts } else { 0 };
        if answers != expected_answers {
            result.failed_checks.push(format!(
                "{answers} answers stored under idempotency keys, {expected_answers} expected"
            ));
        }
    }
    result.server_count = count;
    Ok(())
}

/// The reason and domain of a sold-out answer, as boxoffice answers it.
fn sold_out() -> Status {
    Status::with_error_details(
        tonic::Code::FailedPrecondition,
        "sold out",
        ErrorDetails::with_error_info(super::workload::SOLD_OUT, "boxoffice", HashMap::new()),
    )
}

/// The reason of a per-user-limit refusal, as boxoffice answers it.
fn user_limit() -> Status {
    Status::with_error_details(
        tonic::Code::FailedPrecondition,
        "the user holds as many places as the event allows",
        ErrorDetails::with_error_info("USER_LIMIT", "boxoffice", HashMap::new()),
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
/// full script on one of a few multiplexed connections (round robin); every other method
/// answers `UNIMPLEMENTED`. It checks the API key, not admission tokens.
pub struct Front {
    sections: Vec<String>,
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
        if !self.sections.contains(&section_id) {
            return Err(Status::with_error_details(
                tonic::Code::NotFound,
                "no such section",
                ErrorDetails::with_error_info("SECTION_NOT_FOUND", "boxoffice", HashMap::new()),
            ));
        }
        if req.idempotency_key.len() > 128 {
            return Err(invalid(
                "idempotency_key",
                "idempotency_key must be at most 128 bytes",
            ));
        }
        let mut con = self.connection();
        let answer = reserve(
            Design::Full,
            &self.script,
            &mut con,
            &section_id,
            quantity,
            &req.user_id,
            &req.idempotency_key,
        )
        .await
        .map_err(|e| Status::unavailable(format!("redis: {e}")))?;
        let id = match answer {
            Answer::Held(id) => id,
            Answer::SoldOut => return Err(sold_out()),
            Answer::UserLimit => return Err(user_limit()),
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        Ok(Response::new(pb::Hold {
            hold_id: id,
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
    /// Starts a front selling `w`'s sections on `127.0.0.1:0`, with `w.front_redis_connections`
    /// connections to `url`. Call from outside any runtime.
    pub fn start(url: &str, w: &Workload) -> anyhow::Result<FrontServer> {
        let rt = runtime("redis-front")?;
        let (addr, stop, task) = rt.block_on(async {
            let conns = connections(url, w.front_redis_connections).await?;
            let front = Front {
                sections: section_ids(w),
                conns,
                next: AtomicUsize::new(0),
                script: Script::new(FULL_LUA),
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

/// Row (b): `Hold`s over 16 HTTP/2 connections to the front (the full script), `in_flight` at
/// once.
pub fn row_b(w: &Workload, client: &Runtime, redis_server: &Path) -> anyhow::Result<RowResult> {
    let setup_started = Instant::now();
    let redis = RedisServer::start(redis_server)?;
    let url = redis.url();
    let mut check_con = client.block_on(async {
        let mut con = connections(&url, 1).await?.remove(0);
        seed(&mut con, w, Design::Full).await?;
        anyhow::Ok(con)
    })?;
    let front = FrontServer::start(&url, w)?;
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
        let sections: Arc<Vec<String>> = Arc::new(section_ids(w));
        let (o, wl) = (outcomes.clone(), w.clone());
        let figures = drive("Hold", w.contenders, w.in_flight, move |i| {
            let mut c = booking[i % booking.len()].clone();
            let req = pb::HoldRequest {
                event_id: EVENT_ID.into(),
                user_id: user_of(i),
                admission_token: String::new(),
                idempotency_key: key_of(&wl, i),
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
                let started = Instant::now();
                let r = c.hold(req).await.map(|h| h.into_inner().hold_id);
                o.unary(i, r, micros_since(started))
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
    client.block_on(check_redis(&mut check_con, w, Design::Full, &mut result));
    drop(check_con);
    drop(redis);
    Ok(result)
}

/// Row (c): the client runs the full script itself, `in_flight` calls at once over
/// `connections` multiplexed connections (call `i` on connection `i mod connections`).
pub fn row_c(w: &Workload, client: &Runtime, redis_server: &Path) -> anyhow::Result<RowResult> {
    raw_row(Row::C, Design::Full, w, client, redis_server)
}

/// Row (e): as (c) with the simplified script.
pub fn row_e(w: &Workload, client: &Runtime, redis_server: &Path) -> anyhow::Result<RowResult> {
    raw_row(Row::E, Design::Simplified, w, client, redis_server)
}

fn raw_row(
    row: Row,
    design: Design,
    w: &Workload,
    client: &Runtime,
    redis_server: &Path,
) -> anyhow::Result<RowResult> {
    let setup_started = Instant::now();
    let redis = RedisServer::start(redis_server)?;
    let url = redis.url();
    let result = client.block_on(async {
        let mut conns = connections(&url, w.connections).await?;
        let script = Arc::new(seed(&mut conns[0], w, design).await?);
        let mut check_con = conns[0].clone();
        let conns = Arc::new(conns);
        let setup = setup_started.elapsed();
        let outcomes = Outcomes::new(w.contenders);
        let sections: Arc<Vec<String>> = Arc::new(section_ids(w));
        let (o, wl) = (outcomes.clone(), w.clone());
        let figures = drive("EVALSHA", w.contenders, w.in_flight, move |i| {
            let mut con = conns[i % conns.len()].clone();
            let (script, o) = (script.clone(), o.clone());
            let section = sections[wl.section_of(i)].clone();
            let key = if design == Design::Full {
                key_of(&wl, i)
            } else {
                String::new()
            };
            async move {
                let started = Instant::now();
                let r = reserve(design, &script, &mut con, &section, 1, &user_of(i), &key).await;
                let us = micros_since(started);
                match r {
                    Ok(Answer::Held(id)) => {
                        o.held(i, id, us);
                        Ok(())
                    }
                    Ok(Answer::SoldOut) => {
                        o.sold_out(us);
                        Ok(())
                    }
                    Ok(Answer::UserLimit) => {
                        o.other(1, "USER_LIMIT from the script".into());
                        Err(Status::failed_precondition("USER_LIMIT"))
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
            row,
            w,
            &outcomes,
            figures.seconds,
            figures.calls,
            Latency::of_figures(&figures),
        );
        result.setup_seconds = setup.as_secs_f64();
        check_redis(&mut check_con, w, design, &mut result).await;
        anyhow::Ok(result)
    })?;
    drop(redis);
    Ok(result)
}
