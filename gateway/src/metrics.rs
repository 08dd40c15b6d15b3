//! The metrics endpoint: Prometheus text over HTTP on its own port.
//!
//! The recorder is process-global and installed once. Every histogram gets real buckets
//! (Prometheus histograms SREs can aggregate, not summaries): latencies in seconds from 50 µs to
//! 10 s, batch sizes from 1 to 8,192.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Latency buckets, seconds.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];
/// Batch-size buckets, records.
pub const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the recorder (once per process) and returns its handle.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets(LATENCY_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Suffix("_records".into()), BATCH_BUCKETS)
                })
                .and_then(|b| b.install_recorder());
            match handle {
                Ok(h) => h,
                // Another recorder is installed (an embedding program's): render ours anyway,
                // empty, rather than fail.
                Err(e) => {
                    tracing::warn!(error = %e, "metrics recorder not installed");
                    PrometheusBuilder::new().build_recorder().handle()
                }
            }
        })
        .clone()
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves; runs the recorder's upkeep.
pub async fn serve(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let upkeep = {
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                handle.run_upkeep();
            }
        })
    };
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move { handle.render() }
        }),
    );
    let r = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    upkeep.abort();
    r
}

/// The address a listener is bound to, for logs.
pub fn describe(addr: SocketAddr) -> String {
    format!("http://{addr}/metrics")
}
