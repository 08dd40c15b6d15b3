//! `otlp-sink`: an OTLP/gRPC trace receiver that counts what it is sent and drops it, for
//! measuring what exporting traces costs a server (BENCHMARKS.md, "Traces").
//!
//! ```sh
//! cargo run --release -p boxoffice-benches --bin otlp-sink -- --listen 127.0.0.1:4317
//! ```
//!
//! Prints the spans and export calls received once a second while any arrive, and the totals
//! on Ctrl-C.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use clap::Parser;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Flags of `otlp-sink`.
#[derive(Parser, Debug)]
#[command(about = "An OTLP/gRPC trace receiver that counts spans and drops them")]
struct Args {
    /// Address to listen on (loopback only in tests and benchmarks).
    #[arg(long, default_value = "127.0.0.1:4317")]
    listen: SocketAddr,
}

/// What has been received.
#[derive(Clone, Default)]
struct Counts {
    spans: Arc<AtomicU64>,
    exports: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl TraceService for Counts {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize = req
            .get_ref()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.spans.fetch_add(spans as u64, Ordering::Relaxed);
        self.exports.fetch_add(1, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let counts = Counts::default();
    let report = counts.clone();
    tokio::spawn(async move {
        let mut last = 0;
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let now = report.spans.load(Ordering::Relaxed);
            if now != last {
                println!("{} spans/s ({now} in all)", now - last);
                last = now;
            }
        }
    });
    println!("otlp-sink: listening on {}", args.listen);
    tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(counts.clone()))
        .serve_with_shutdown(args.listen, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    println!(
        "otlp-sink: {} spans in {} exports",
        counts.spans.load(Ordering::Relaxed),
        counts.exports.load(Ordering::Relaxed)
    );
    Ok(())
}
