//! `GET /debug/pprof/profile?seconds=N` on the metrics port: a CPU profile of the whole process
//! (every thread: the runtime's workers, the section and ledger actors, the log's flusher and
//! acker), taken by sampling (pprof-rs, `SIGPROF` at [`FREQUENCY_HZ`]) for `seconds` (1 to
//! [`SECONDS_MAX`], default [`SECONDS_DEFAULT`]).
//!
//! - Admin only: `Authorization: Bearer <admin key>` (no key or an unknown one: 401; a client or
//!   stream key: 403), checked before anything else of the request.
//! - Served only where the key does not cross a network in plain HTTP: on a loopback metrics
//!   address, or elsewhere with `--metrics-pprof` (`ServerConfig::metrics_pprof`); else 404.
//! - The answer is pprof's protobuf, gzipped, as Go's `net/http/pprof` serves it, so
//!   `go tool pprof` (`-top`, or `-http=:` for a flame graph) and the usual viewers read it.
//!   (pprof-rs's own SVG flame graph is not built in: its inferno is CDDL-1.0 and brought a
//!   vulnerable quick-xml, both refused by `cargo deny`.)
//! - One profile at a time (another while one runs: 409); a bad `seconds`: 400.
//!
//! Nothing samples until a profile is asked for: the timer runs only for its seconds.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::gate::{Gate, Scope};

/// Samples per second (a prime near 100, as pprof-rs and Go advise: no lockstep with timers).
pub const FREQUENCY_HZ: i32 = 99;
/// The longest profile, seconds.
pub const SECONDS_MAX: u64 = 60;
/// A profile's length when `seconds` is not given.
pub const SECONDS_DEFAULT: u64 = 10;

/// One profile at a time: the sampler is the process's.
static TAKING: AtomicBool = AtomicBool::new(false);

/// The profile being taken: [`TAKING`] is up while it lives.
struct Taking;

impl Taking {
    /// Raises the flag, unless a profile is already being taken.
    fn start() -> Option<Taking> {
        (!TAKING.swap(true, Ordering::AcqRel)).then_some(Taking)
    }
}

impl Drop for Taking {
    fn drop(&mut self) {
        TAKING.store(false, Ordering::Release);
    }
}

/// The query of `/debug/pprof/profile`.
#[derive(Debug, Deserialize)]
pub struct ProfileQuery {
    seconds: Option<u64>,
}

fn refuse(status: StatusCode, message: &str) -> Response {
    let mut r = (status, format!("{message}\n")).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

/// `GET /debug/pprof/profile`.
pub async fn profile(
    State(gate): State<Arc<Gate>>,
    headers: HeaderMap,
    query: Result<Query<ProfileQuery>, QueryRejection>,
) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match gate.scope_presented(authorization) {
        Some(Scope::Admin) => {}
        Some(_) => return refuse(StatusCode::FORBIDDEN, "profiles need an admin key"),
        None => return refuse(StatusCode::UNAUTHORIZED, "profiles need an admin key"),
    }
    // The query only once the key is known good: the key's answer first, whatever is asked.
    let Ok(Query(q)) = query else {
        return refuse(
            StatusCode::BAD_REQUEST,
            &format!("seconds must be 1 to {SECONDS_MAX}"),
        );
    };
    let seconds = q.seconds.unwrap_or(SECONDS_DEFAULT);
    if !(1..=SECONDS_MAX).contains(&seconds) {
        return refuse(
            StatusCode::BAD_REQUEST,
            &format!("seconds must be 1 to {SECONDS_MAX}"),
        );
    }
    let Some(taking) = Taking::start() else {
        return refuse(StatusCode::CONFLICT, "a profile is already being taken");
    };
    // The flag goes down with `taking`, however the blocking task ends (a panic too), and
    // whether or not anyone still waits for its answer.
    let taken = tokio::task::spawn_blocking(move || {
        let _taking = taking;
        take(Duration::from_secs(seconds))
    })
    .await;
    let body = match taken {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "a CPU profile failed");
            return refuse(StatusCode::INTERNAL_SERVER_ERROR, &format!("profile: {e}"));
        }
        Err(e) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, &format!("profile: {e}")),
    };
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"profile.pb.gz\"",
            ),
        ],
        body,
    )
        .into_response()
}

/// Samples the process for `length`, then encodes the profile as pprof's protobuf, gzipped
/// (blocking: run off the runtime).
fn take(length: Duration) -> anyhow::Result<Vec<u8>> {
    use pprof::protos::Message;
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY_HZ)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()?;
    std::thread::sleep(length);
    let report = guard.report().build()?;
    drop(guard);
    let profile = report.pprof()?;
    let mut raw = Vec::with_capacity(profile.encoded_len());
    profile.encode(&mut raw)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw)?;
    Ok(gz.finish()?)
}
