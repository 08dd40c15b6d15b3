//! Measuring one kind of call: `concurrency` streams calling it in turn, the throughput and the
//! latency percentiles (hdrhistogram) of all their calls. Used by `loadgen`, `sessions` and the
//! benches' comparison.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

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

/// Runs `concurrency` tasks, each calling `call(i)` for its share of `requests` (task `t`
/// takes `i = t, t + concurrency, ...`), and measures them.
pub async fn drive<F, Fut>(
    name: &'static str,
    requests: usize,
    concurrency: usize,
    call: F,
) -> RpcFigures
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), tonic::Status>> + Send + 'static,
{
    let call = Arc::new(call);
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| tokio::spawn(stream(call.clone(), t, requests, concurrency)))
        .collect();
    let mut all = Stream::default();
    for t in tasks {
        if let Ok(s) = t.await {
            all.add(s);
        }
    }
    all.figures(name, started.elapsed())
}

/// One stream's calls: `call(i)` for `i = first, first + stride, ...` below `requests`.
async fn stream<F, Fut>(call: Arc<F>, first: usize, requests: usize, stride: usize) -> Stream
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<(), tonic::Status>>,
{
    let mut s = Stream::default();
    for i in (first..requests).step_by(stride) {
        let started = Instant::now();
        let r = call(i).await;
        s.record(started.elapsed(), r.err());
    }
    s
}

/// What one stream (or all of them) measured.
struct Stream {
    latency: Histogram<u64>,
    calls: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Default for Stream {
    fn default() -> Stream {
        Stream {
            latency: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
            calls: 0,
            errors: 0,
            first_error: None,
        }
    }
}

impl Stream {
    fn record(&mut self, took: Duration, error: Option<tonic::Status>) {
        if let Some(e) = error {
            self.errors += 1;
            self.first_error.get_or_insert_with(|| {
                format!(
                    "{:?} {}: {}",
                    e.code(),
                    boxoffice_client::reason(&e).unwrap_or_default(),
                    e.message()
                )
            });
        }
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        let _ = self.latency.record(us);
        self.calls += 1;
    }

    fn add(&mut self, other: Stream) {
        let _ = self.latency.add(other.latency);
        self.calls += other.calls;
        self.errors += other.errors;
        self.first_error = self.first_error.take().or(other.first_error);
    }

    fn figures(self, name: &'static str, took: Duration) -> RpcFigures {
        let h = &self.latency;
        RpcFigures {
            name,
            calls: self.calls,
            errors: self.errors,
            seconds: took.as_secs_f64(),
            latency_us: [
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.value_at_quantile(0.999),
                h.max(),
            ],
            first_error: self.first_error,
        }
    }
}

/// The ceiling of any RPC: `grpc.health.v1.Health/Check` (an empty RPC), `requests` calls with
/// `concurrency` in flight, call `i` over channel `i mod channels`.
pub async fn health_ceiling(
    channels: &[tonic::transport::Channel],
    requests: usize,
    concurrency: usize,
) -> RpcFigures {
    let channels: Arc<Vec<tonic::transport::Channel>> = Arc::new(channels.to_vec());
    drive("health", requests, concurrency, move |i| {
        let mut c = tonic_health::pb::health_client::HealthClient::new(
            channels[i % channels.len()].clone(),
        );
        async move {
            c.check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(|_| ())
        }
    })
    .await
}
