//! Retrying calls that failed for a passing reason, with exponential backoff and jitter
//! (`backon`).
//!
//! Retrying must never change what a call does, so only requests whose repetition changes
//! nothing the first one did not are retried: they implement [`Idempotent`], a sealed marker.
//! Those are the reads (`GetJoinChallenge` too: it only signs a new challenge), `Join` (a fan
//! who joins again keeps their place, and a place already taken needs no new proof of work, so
//! a retry whose first try used the challenge still gets the place), `JoinWaitlist` (a fan
//! has one entry per event; joining again returns it), and `Hold` and `Confirm`, which carry an
//! idempotency key (a replay gets the first answer and never charges twice). `CreateEvent`
//! (without an event id the server makes a new event each time) and `Release` (a replay
//! answers `HOLD_NOT_ACTIVE`) are not.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use boxoffice_proto::v1 as pb;
use tonic::{Code, Status};

use crate::reason::reason;

/// A request that may be sent again: a repetition changes nothing the first one did not.
pub trait Idempotent: Clone + sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! idempotent {
    ($($request:ident),* $(,)?) => {
        $(
            impl sealed::Sealed for pb::$request {}
            impl Idempotent for pb::$request {}
        )*
    };
}

idempotent!(
    GetEventRequest,
    ListEventsRequest,
    GetSeatMapRequest,
    GetStatusRequest,
    GetJoinChallengeRequest,
    GetHoldRequest,
    GetOrderRequest,
    ListOrdersRequest,
    GetRevocationListRequest,
    GetWaitlistEntryRequest,
    JoinRequest,
    JoinWaitlistRequest,
    HoldRequest,
    ConfirmRequest,
);

/// Whether the gate or a section shed the call before doing any work (`RESOURCE_EXHAUSTED` /
/// `OVERLOADED`): the same call may pass a moment later.
pub fn is_overloaded(s: &Status) -> bool {
    s.code() == Code::ResourceExhausted && reason(s).as_deref() == Some("OVERLOADED")
}

/// Whether a call failed for a passing reason: shed (`OVERLOADED`), the server recovering or
/// draining (`UNAVAILABLE` / `NOT_READY`), or the connection (`UNAVAILABLE` without a reason:
/// refused, reset). Not `QUEUE_FULL`, the per-user limit, `STORAGE_FAILED` (the server stops
/// writing) or `PAYMENT_UNAVAILABLE` (the caller decides whether to try again).
pub fn is_transient(s: &Status) -> bool {
    match s.code() {
        Code::ResourceExhausted => is_overloaded(s),
        Code::Unavailable => matches!(reason(s).as_deref(), None | Some("NOT_READY")),
        _ => false,
    }
}

/// How to retry: which failures, how often, how long to wait between attempts.
#[derive(Clone, Copy, Debug)]
pub struct Retry {
    backoff: ExponentialBuilder,
    when: fn(&Status) -> bool,
}

impl Default for Retry {
    /// Transient failures ([`is_transient`]), up to 5 retries from 10 ms doubling to 1 s.
    fn default() -> Retry {
        Retry::new(Duration::from_millis(10), Duration::from_secs(1), 5)
    }
}

impl Retry {
    /// Retries transient failures ([`is_transient`]) up to `times` times, waiting `min` at
    /// first and twice as long after each retry up to `max`, each wait plus a random part of
    /// itself (up to as long again), so that shed callers do not come back in step.
    pub const fn new(min: Duration, max: Duration, times: usize) -> Retry {
        Retry {
            backoff: ExponentialBuilder::new()
                .with_min_delay(min)
                .with_max_delay(max)
                .with_factor(2.0)
                .with_max_times(times)
                .with_jitter(),
            when: is_transient,
        }
    }

    /// The same, retrying only the failures `when` picks (say [`is_overloaded`]).
    pub const fn when(mut self, when: fn(&Status) -> bool) -> Retry {
        self.when = when;
        self
    }

    /// `call(client, request)`, retried as this policy says; each attempt gets a clone of
    /// `client` (tonic clients are cheap handles on a channel) and of `request`.
    pub async fn call<C, Req, T, F, Fut>(
        &self,
        client: &C,
        request: Req,
        call: F,
    ) -> Result<T, Status>
    where
        C: Clone,
        Req: Idempotent,
        F: FnMut(C, Req) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.call_notify(client, request, call, |_, _| {}).await
    }

    /// As [`Retry::call`], telling `notify` of each failure about to be retried and the wait
    /// before the retry.
    pub async fn call_notify<C, Req, T, F, Fut, N>(
        &self,
        client: &C,
        request: Req,
        mut call: F,
        notify: N,
    ) -> Result<T, Status>
    where
        C: Clone,
        Req: Idempotent,
        F: FnMut(C, Req) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
        N: FnMut(&Status, Duration),
    {
        (|| call(client.clone(), request.clone()))
            .retry(self.backoff)
            .when(self.when)
            .notify(notify)
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU32, Ordering};

    use tonic_types::{ErrorDetails, StatusExt};

    use super::*;

    fn with_reason(code: Code, reason: &str) -> Status {
        let details = ErrorDetails::with_error_info(reason, "boxoffice", HashMap::new());
        Status::with_error_details(code, "test", details)
    }

    fn quick(times: usize) -> Retry {
        Retry::new(Duration::from_millis(1), Duration::from_millis(2), times)
    }

    fn poll() -> pb::GetStatusRequest {
        pb::GetStatusRequest {
            queue_token: "q".into(),
        }
    }

    #[test]
    fn transient_failures_are_the_passing_ones() {
        assert!(is_transient(&with_reason(
            Code::ResourceExhausted,
            "OVERLOADED"
        )));
        assert!(is_transient(&with_reason(Code::Unavailable, "NOT_READY")));
        assert!(is_transient(&Status::unavailable("connection refused")));
        assert!(!is_transient(&with_reason(
            Code::ResourceExhausted,
            "QUEUE_FULL"
        )));
        assert!(!is_transient(&with_reason(
            Code::ResourceExhausted,
            "USER_LIMIT"
        )));
        assert!(!is_transient(&with_reason(
            Code::Unavailable,
            "STORAGE_FAILED"
        )));
        assert!(!is_transient(&with_reason(
            Code::Unavailable,
            "PAYMENT_UNAVAILABLE"
        )));
        assert!(!is_transient(&with_reason(
            Code::FailedPrecondition,
            "SOLD_OUT"
        )));
        assert!(is_overloaded(&with_reason(
            Code::ResourceExhausted,
            "OVERLOADED"
        )));
        assert!(!is_overloaded(&with_reason(Code::Unavailable, "NOT_READY")));
    }

    #[tokio::test]
    async fn a_shed_call_is_retried_until_it_passes() {
        let attempts = AtomicU32::new(0);
        let mut retried = Vec::new();
        let r = quick(5)
            .call_notify(
                &(),
                poll(),
                |(), req| {
                    let n = attempts.fetch_add(1, Ordering::Relaxed);
                    async move {
                        assert_eq!(req.queue_token, "q", "every attempt sends the same request");
                        if n < 2 {
                            Err(with_reason(Code::ResourceExhausted, "OVERLOADED"))
                        } else {
                            Ok(n)
                        }
                    }
                },
                |s, wait| retried.push((s.code(), wait)),
            )
            .await;
        assert_eq!(r.ok(), Some(2));
        assert_eq!(attempts.load(Ordering::Relaxed), 3);
        assert_eq!(retried.len(), 2);
        assert!(retried.iter().all(|(c, w)| *c == Code::ResourceExhausted
            && *w >= Duration::from_millis(1)
            && *w <= Duration::from_millis(4)));
    }

    #[tokio::test]
    async fn other_failures_come_back_at_once_and_retries_end() {
        let attempts = AtomicU32::new(0);
        let sold_out = quick(5)
            .call(&(), poll(), |(), _| {
                attempts.fetch_add(1, Ordering::Relaxed);
                async { Err::<(), _>(with_reason(Code::FailedPrecondition, "SOLD_OUT")) }
            })
            .await;
        assert_eq!(
            sold_out.map_err(|s| reason(&s)),
            Err(Some("SOLD_OUT".into()))
        );
        assert_eq!(attempts.swap(0, Ordering::Relaxed), 1, "not retried");

        let shed = quick(3)
            .call(&(), poll(), |(), _| {
                attempts.fetch_add(1, Ordering::Relaxed);
                async { Err::<(), _>(with_reason(Code::ResourceExhausted, "OVERLOADED")) }
            })
            .await;
        assert!(shed.is_err());
        assert_eq!(
            attempts.swap(0, Ordering::Relaxed),
            4,
            "the first try and 3 retries"
        );

        let not_ready = quick(3)
            .when(is_overloaded)
            .call(&(), poll(), |(), _| {
                attempts.fetch_add(1, Ordering::Relaxed);
                async { Err::<(), _>(with_reason(Code::Unavailable, "NOT_READY")) }
            })
            .await;
        assert!(not_ready.is_err());
        assert_eq!(
            attempts.load(Ordering::Relaxed),
            1,
            "only OVERLOADED is retried with is_overloaded"
        );
    }
}
