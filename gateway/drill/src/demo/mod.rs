//! `boxoffice demo`: an embedded server with its HTTP port on, serving the race of the dots
//! (`/`: 100 fans race for 10 seats, first in chaos, then through the waiting room and atomic
//! holds; streamed to the page as server-sent events from `/demo/race`), the operations page
//! (`/ops`) and the HTTP API (`/v1/...`). The page loads nothing from elsewhere.

pub mod race;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;

pub use race::{Race, Step, Target};

/// Flags of `boxoffice demo`.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Address of the page (and the HTTP API and /ops on the same port).
    #[arg(long, env = "BOXOFFICE_DEMO_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Data dir of the demo's server (default: a new temporary directory, removed at exit).
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
}

/// The largest race the page may ask for.
pub const FANS_MAX: u32 = 2_000;
/// The most seats.
pub const SEATS_MAX: u32 = 500;

/// What the race routes share: where the clean race plays (set once the server is up) and how
/// many races ran (each clean race has an event of its own).
#[derive(Default)]
pub struct DemoState {
    target: OnceLock<Target>,
    runs: AtomicU64,
}

impl DemoState {
    /// Sets where the clean race plays (once).
    pub fn set_target(&self, target: Target) {
        let _ = self.target.set(target);
    }
}

#[derive(Deserialize)]
struct RaceQuery {
    #[serde(default)]
    mode: String,
    #[serde(default = "default_fans")]
    fans: u32,
    #[serde(default = "default_seats")]
    seats: u32,
    #[serde(default = "default_speed")]
    speed: f64,
}

fn default_fans() -> u32 {
    100
}
fn default_seats() -> u32 {
    10
}
fn default_speed() -> f64 {
    1.0
}

/// The demo's routes over `state`: the page and the race.
pub fn routes(state: Arc<DemoState>) -> Router {
    Router::new()
        .route("/", get(|| async { Html(include_str!("page.html")) }))
        .route("/demo/race", get(race_stream))
        .with_state(state)
}

async fn race_stream(
    State(state): State<Arc<DemoState>>,
    q: Result<Query<RaceQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return (
            StatusCode::BAD_REQUEST,
            "bad query: mode, fans, seats, speed",
        )
            .into_response();
    };
    if !(1..=FANS_MAX).contains(&q.fans)
        || !(1..=SEATS_MAX).contains(&q.seats)
        || !(0.1..=20.0).contains(&q.speed)
    {
        return (
            StatusCode::BAD_REQUEST,
            format!("fans 1 to {FANS_MAX}, seats 1 to {SEATS_MAX}, speed 0.1 to 20"),
        )
            .into_response();
    }
    let r = Race {
        fans: q.fans,
        seats: q.seats,
        speed: q.speed,
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Step>(1_024);
    match q.mode.as_str() {
        "chaos" => {
            tokio::spawn(race::chaos(r, tx));
        }
        "clean" => {
            let Some(target) = state.target.get().cloned() else {
                return (StatusCode::SERVICE_UNAVAILABLE, "the server is starting").into_response();
            };
            let run = state.runs.fetch_add(1, Ordering::Relaxed) + 1;
            tokio::spawn(race::clean(r, target, run, tx));
        }
        _ => return (StatusCode::BAD_REQUEST, "mode is chaos or clean").into_response(),
    }
    let events = ReceiverStream::new(rx).map(|step| {
        Ok::<_, Infallible>(Event::default().data(serde_json::to_string(&step).unwrap_or_default()))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A running demo: the embedded server, with the page on its HTTP port.
pub struct Demo {
    /// The server.
    pub running: boxoffice_gateway::server::Running,
    /// The page's (and the HTTP API's) address.
    pub http: SocketAddr,
    /// The keys the server was given.
    pub target: Target,
}

/// Starts the demo's server on `listen` with its log in `data_dir`, ready to race.
pub async fn start(listen: SocketAddr, data_dir: std::path::PathBuf) -> anyhow::Result<Demo> {
    use boxoffice_gateway::server::{self, ServerConfig};
    let admin_key = format!("adm_{}", crate::cluster::random_hex(18));
    let client_key = format!("cli_{}", crate::cluster::random_hex(18));
    let token_secret = crate::cluster::random_hex(32).into_bytes();
    let state = Arc::new(DemoState::default());
    let mut config = ServerConfig::new(&admin_key, &client_key, &token_secret);
    config.listen = "127.0.0.1:0".parse()?;
    config.metrics_listen = None;
    config.http_listen = Some(listen);
    config.http_routes = Some(routes(state.clone()));
    config.data_dir = data_dir;
    let mut running = server::start(config).await?;
    running.wait_ready().await?;
    let target = Target {
        url: format!("http://{}", running.addr),
        admin_key,
        client_key,
    };
    state.set_target(target.clone());
    let http = running
        .http_addr
        .ok_or_else(|| anyhow::anyhow!("the HTTP port did not open"))?;
    Ok(Demo {
        running,
        http,
        target,
    })
}

/// Runs the demo until Ctrl-C or SIGTERM.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let temp = match &args.data_dir {
        Some(_) => None,
        None => Some(tempfile::tempdir()?),
    };
    let data_dir = args
        .data_dir
        .clone()
        .or_else(|| temp.as_ref().map(|t| t.path().to_path_buf()))
        .ok_or_else(|| anyhow::anyhow!("no data dir"))?;
    let demo = start(args.listen, data_dir).await?;
    let (http, t) = (demo.http, &demo.target);
    println!("the race of the dots: open http://{http}/");
    println!("live operations:      http://{http}/ops");
    println!(
        "HTTP API:             http://{http}/v1 (OpenAPI at /v1/openapi.json); client key {}, admin key {}",
        t.client_key, t.admin_key
    );
    println!("Ctrl-C to stop");
    crate::signal::shutdown_signal().await;
    demo.running.shutdown().await?;
    drop(temp);
    Ok(())
}
