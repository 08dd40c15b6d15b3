//! A real gRPC server on `127.0.0.1:0` for the integration tests, on a temporary data dir with a
//! manual clock, that stops when dropped.
//!
//! ```text
//! let server = TestServer::start().await;
//! let (mut admin, mut fan) = (server.admin(), server.client());
//! // ...
//! server.shutdown().await; // checks the shutdown was clean; a panicking test stops it on drop
//! ```

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use boxoffice_engine::ManualClock;
use boxoffice_gateway::server::{self, Running, ServerConfig};
use tempfile::TempDir;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::Notify;
use tonic::transport::Channel;

use crate::{Bearer, Clients, T0_MS, connect};

/// The admin key of test servers.
pub const ADMIN: &str = "test-admin-key";
/// The client key of test servers.
pub const CLIENT: &str = "test-client-key";
/// The stream key of test servers (the change stream only).
pub const STREAM: &str = "test-stream-key";
/// The token secret of test servers.
pub const SECRET: &[u8] = b"test-token-secret";

/// How long a dropped server may take to stop before it is abandoned (a failure bound, not a
/// wait: a clean stop takes milliseconds).
const DROP_STOP_MAX: Duration = Duration::from_secs(30);

/// Where a server keeps its state: a temporary data dir and the manual clock. A server started
/// on the home of a stopped one recovers what that one acknowledged. The dir is removed when
/// the last clone of the home is dropped.
#[derive(Clone)]
pub struct Home {
    dir: Arc<TempDir>,
    clock: Arc<ManualClock>,
}

impl Home {
    /// A new empty data dir, and a clock at [`T0_MS`].
    pub fn new() -> Home {
        Home {
            dir: Arc::new(tempfile::tempdir().expect("a temporary data dir")),
            clock: Arc::new(ManualClock::new(T0_MS)),
        }
    }

    /// The data dir.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The manual clock.
    pub fn clock(&self) -> &Arc<ManualClock> {
        &self.clock
    }
}

impl Default for Home {
    fn default() -> Home {
        Home::new()
    }
}

/// Options of a [`TestServer`] other than the defaults of [`TestServer::start`].
#[must_use]
pub struct TestServerBuilder {
    home: Option<Home>,
    queue_max: Option<u32>,
    in_flight_max: Option<usize>,
    recovery_gate: Option<Arc<Notify>>,
    memory_log: Option<Arc<boxoffice_engine::MemorySink>>,
    new_ticket_key: bool,
    wait: bool,
    settlement: Option<(Option<Duration>, Duration)>,
    payments: Option<Arc<dyn boxoffice_engine::PaymentProvider>>,
    seat_map_max_bytes: Option<usize>,
    seat_map_staleness: Duration,
    change_retention: Option<Duration>,
}

impl TestServerBuilder {
    /// Allows a new ticket signing key where tickets were sold (`serve --new-ticket-key`).
    pub fn new_ticket_key(mut self) -> Self {
        self.new_ticket_key = true;
        self
    }

    /// Keeps the change stream's changes this long (`serve --change-retention-seconds`).
    pub fn change_retention(mut self, keep: Duration) -> Self {
        self.change_retention = Some(keep);
        self
    }

    /// Does not wait for recovery in [`TestServerBuilder::start`] (see [`TestServer::recovery`]).
    pub fn no_wait(mut self) -> Self {
        self.wait = false;
        self
    }

    /// Keeps the log in `sink` (which a test can make fail) instead of the data dir.
    pub fn memory_log(mut self, sink: Arc<boxoffice_engine::MemorySink>) -> Self {
        self.memory_log = Some(sink);
        self
    }

    /// Runs on `home` (e.g. the home of a server that was shut down: a restart) instead of a
    /// new one.
    pub fn home(mut self, home: Home) -> Self {
        self.home = Some(home);
        self
    }

    /// The reconciliation pass runs `every` (`None`: never, the test calls
    /// `Engine::settle_and_reconcile` itself) and refunds charges without a sale after `grace`
    /// (`serve --reconcile-seconds`, `--refund-grace-seconds`).
    pub fn settlement(mut self, every: Option<Duration>, grace: Duration) -> Self {
        self.settlement = Some((every, grace));
        self
    }

    /// Charges through `provider` instead of the simulated one in the data dir.
    pub fn payments(mut self, provider: Arc<dyn boxoffice_engine::PaymentProvider>) -> Self {
        self.payments = Some(provider);
        self
    }

    /// At most `n` fans in a waiting-room line.
    pub fn queue_max(mut self, n: u32) -> Self {
        self.queue_max = Some(n);
        self
    }

    /// `GetSeatMap` answers at most `n` bytes (`serve --seat-map-max-bytes`).
    pub fn seat_map_max_bytes(mut self, n: usize) -> Self {
        self.seat_map_max_bytes = Some(n);
        self
    }

    /// A section's seat map is reused for `window` after it was last known true although the
    /// section changed since (the server's default is 1 s; test servers use 0, so every read
    /// shows every change before it).
    pub fn seat_map_staleness(mut self, window: Duration) -> Self {
        self.seat_map_staleness = window;
        self
    }

    /// At most `n` calls in flight; more are shed.
    pub fn in_flight_max(mut self, n: usize) -> Self {
        self.in_flight_max = Some(n);
        self
    }

    /// Recovery waits for `gate` to be notified: the server serves health (NOT_SERVING) and
    /// answers UNAVAILABLE until then. [`TestServerBuilder::start`] does not wait for recovery
    /// then; [`TestServer::wait_ready`] does.
    pub fn recovery_gate(mut self, gate: Arc<Notify>) -> Self {
        self.recovery_gate = Some(gate);
        self
    }

    /// Starts the server, connects a channel to it, and (without a recovery gate) waits until
    /// it has recovered.
    ///
    /// Needs the multi-thread runtime (`#[tokio::test(flavor = "multi_thread")]`): dropping
    /// the server stops it by blocking on the runtime.
    pub async fn start(self) -> TestServer {
        assert_eq!(
            Handle::current().runtime_flavor(),
            RuntimeFlavor::MultiThread,
            "a TestServer needs #[tokio::test(flavor = \"multi_thread\")]: it stops on drop"
        );
        let home = self.home.unwrap_or_default();
        let mut config = ServerConfig::new(ADMIN, CLIENT, SECRET);
        config.stream_keys = vec![STREAM.to_owned()];
        config.listen = "127.0.0.1:0".parse().expect("loopback");
        config.metrics_listen = Some("127.0.0.1:0".parse().expect("loopback"));
        config.http_listen = Some("127.0.0.1:0".parse().expect("loopback"));
        config.data_dir = home.path().to_path_buf();
        config.clock = home.clock.clone();
        config.grace = Duration::from_secs(5);
        if let Some(n) = self.queue_max {
            config.queue_max = n;
        }
        if let Some(n) = self.in_flight_max {
            config.in_flight_max = n;
        }
        if let Some(n) = self.seat_map_max_bytes {
            config.seat_map_max_bytes = n;
        }
        config.seat_map_staleness = self.seat_map_staleness;
        if let Some(keep) = self.change_retention {
            config.change_retention = keep;
        }
        config.new_ticket_key = self.new_ticket_key;
        if let Some((every, grace)) = self.settlement {
            config.reconcile_every = every;
            config.refund_grace = grace;
        }
        if let Some(sink) = self.memory_log {
            config.engine =
                Some(boxoffice_engine::EngineConfig::with_sink(sink).expect("a memory log"));
        }
        if let Some(p) = self.payments {
            let mut ec = config
                .engine
                .take()
                .unwrap_or_else(|| boxoffice_engine::EngineConfig::new(home.path()));
            ec.payments = Some(p);
            config.engine = Some(ec);
        }
        let gated = self.recovery_gate.is_some();
        config.recovery_gate = self.recovery_gate;
        // From here on the server is stopped however the test ends.
        let running = Stopper(Some(
            server::start(config).await.expect("the server starts"),
        ));
        let channel = connect(&format!("http://{}", running.get().addr))
            .await
            .expect("connects");
        let mut server = TestServer {
            running,
            channel,
            home,
        };
        if !gated && self.wait {
            server.wait_ready().await;
        }
        server
    }
}

/// A running server (see the module's documentation). Dropping it stops it: a test that
/// panics leaves no server behind holding its data dir.
pub struct TestServer {
    // Dropped first: the server stops before its data dir is removed.
    running: Stopper,
    channel: Channel,
    home: Home,
}

impl TestServer {
    /// A server with the defaults, recovered and ready.
    pub async fn start() -> TestServer {
        TestServer::builder().start().await
    }

    /// The server's engine (once recovered), for tests that reach inside it.
    pub fn engine(&self) -> boxoffice_engine::Engine {
        self.running
            .get()
            .engine()
            .expect("the server has recovered")
    }

    /// The server's sweeper actor.
    pub fn sweeper(&self) -> ractor::ActorRef<boxoffice_sweeper::SweeperMsg> {
        self.running
            .get()
            .sweeper()
            .expect("the server has recovered")
    }

    /// A server with other options.
    pub fn builder() -> TestServerBuilder {
        TestServerBuilder {
            home: None,
            queue_max: None,
            in_flight_max: None,
            recovery_gate: None,
            memory_log: None,
            new_ticket_key: false,
            wait: true,
            settlement: None,
            payments: None,
            seat_map_max_bytes: None,
            seat_map_staleness: Duration::ZERO,
            change_retention: None,
        }
    }

    /// Waits until recovery has finished; fails the test if it failed.
    pub async fn wait_ready(&mut self) {
        self.recovery().await.expect("the server recovers");
    }

    /// Waits until recovery has finished, and says how it went (for tests of a refused start).
    pub async fn recovery(&mut self) -> anyhow::Result<()> {
        self.running.get_mut().wait_ready().await
    }

    /// The data dir and clock, to start another server on after this one is shut down.
    pub fn home(&self) -> &Home {
        &self.home
    }

    /// The data dir.
    pub fn dir(&self) -> &Path {
        self.home.path()
    }

    /// The manual clock of the server.
    pub fn clock(&self) -> &Arc<ManualClock> {
        self.home.clock()
    }

    /// The gRPC address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.running.get().addr
    }

    /// The address of the metrics endpoint.
    pub fn metrics_addr(&self) -> std::net::SocketAddr {
        self.running.get().metrics_addr.expect("a metrics endpoint")
    }

    /// The address of the HTTP API.
    pub fn http_addr(&self) -> std::net::SocketAddr {
        self.running.get().http_addr.expect("an HTTP API")
    }

    /// A client of the HTTP API sending `key` (none: no `Authorization`).
    pub fn http(&self, key: Option<&str>) -> crate::http::Http {
        crate::http::Http::new(self.http_addr(), key)
    }

    /// A channel to the server (clones share one connection).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Clients of every service sending `key`.
    pub fn clients(&self, key: &str) -> Clients {
        clients(&self.channel, key)
    }

    /// Clients with the admin key.
    pub fn admin(&self) -> Clients {
        self.clients(ADMIN)
    }

    /// Clients with the client key.
    pub fn client(&self) -> Clients {
        self.clients(CLIENT)
    }

    /// Drains and stops the server, and fails the test unless that went cleanly. The data dir
    /// stays as long as a clone of [`TestServer::home`] does.
    pub async fn shutdown(self) {
        self.shutdown_result()
            .await
            .expect("the server shuts down cleanly");
    }

    /// Drains and stops the server; what its shutdown said (an error if the engine had stopped,
    /// as the binary's exit code would show).
    pub async fn shutdown_result(mut self) -> anyhow::Result<()> {
        match self.running.0.take() {
            Some(running) => running.shutdown().await,
            None => Ok(()),
        }
    }
}

/// Owns the running server and stops it when dropped, unless [`TestServer::shutdown`] took it.
struct Stopper(Option<Running>);

impl Stopper {
    fn get(&self) -> &Running {
        self.0.as_ref().expect("the server runs until shut down")
    }

    fn get_mut(&mut self) -> &mut Running {
        self.0.as_mut().expect("the server runs until shut down")
    }
}

impl Drop for Stopper {
    /// The fallback for a test that did not reach [`TestServer::shutdown`] (it panicked, or
    /// returned early): stops the server before the data dir goes, blocking this thread on the
    /// runtime meanwhile (which the multi-thread runtime allows, even while unwinding).
    fn drop(&mut self) {
        let Some(running) = self.0.take() else {
            return;
        };
        let Ok(handle) = Handle::try_current() else {
            // Outside the runtime the server ran on: that runtime, and so the server, is gone.
            return;
        };
        let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tokio::task::block_in_place(|| {
                handle.block_on(tokio::time::timeout(DROP_STOP_MAX, running.shutdown()))
            })
        }));
        let failure = match stopped {
            Ok(Ok(Ok(()))) => return,
            Ok(Ok(Err(e))) => format!("failed: {e:#}"),
            Ok(Err(_)) => format!("took more than {DROP_STOP_MAX:?}"),
            Err(_) => "panicked".to_owned(),
        };
        if std::thread::panicking() {
            eprintln!("stopping the dropped test server {failure}");
        } else {
            panic!("stopping the dropped test server {failure}");
        }
    }
}

/// Clients of every service over `ch`, sending `key`.
fn clients(ch: &Channel, key: &str) -> Clients {
    Clients::new(ch, &Bearer::new(key).expect("an ASCII key"))
}

/// The `ErrorInfo.reason` of a status.
pub fn reason(s: &tonic::Status) -> String {
    boxoffice_gateway::status::reason_of(s).unwrap_or_else(|| format!("<no reason: {s:?}>"))
}
