//! Spans of one request's way through the engine, for distributed traces (issue 31).
//!
//! The engine knows only `tracing`: every span here has the target [`TARGET`], which the binary
//! sends to OpenTelemetry when `--otlp-endpoint` is given and to nothing otherwise (no layer is
//! interested, so each span is `Span::none()` after one cached check: off, they cost nothing
//! measurable). A span crosses a task or thread as a value: the section actor's hold message
//! carries its caller's span, a log job carries the section's decision spans, the acker gets
//! the group commit's span with the batch. A group commit serves many callers: its span is a
//! child of the first traced job's span and *follows from* (an OpenTelemetry link) the others.
//!
//! A replicated group commit's span is kept here, by the batch's first record, while its Raft
//! entry is on its way ([`replicating`]), so the node's Raft network can pass its context on
//! with the append that carries it ([`replication_of`]) and a follower's span of that append
//! joins the same trace.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use tracing::Span;

/// The target of every span of a request's way (`boxoffice::trace`): the binary's log lines
/// leave it out, its OpenTelemetry layer takes only it.
pub const TARGET: &str = "boxoffice::trace";

/// A replicated batch, named by its first record: (stream, seq). Unique while it is in flight:
/// a stream's numbers only grow on a leader.
type Key = (String, u64);

/// The spans of the batches in flight to the group, with how many there are (read without the
/// lock on every append sent, so an untraced node pays one atomic load).
struct InFlight {
    count: AtomicUsize,
    spans: Mutex<HashMap<Key, Span>>,
}

static IN_FLIGHT: LazyLock<InFlight> = LazyLock::new(|| InFlight {
    count: AtomicUsize::new(0),
    spans: Mutex::new(HashMap::new()),
});

/// A traced batch on its way to the group, named by its first record (`first`: stream, seq;
/// see `Batch::first_record`): `span` (its replication's) is found by [`replication_of`] until
/// [`Replicating`] is dropped. Nothing is kept for an untraced span.
pub(crate) fn replicating(first: Option<(&str, u64)>, span: &Span) -> Option<Replicating> {
    if span.is_disabled() {
        return None;
    }
    let (stream, seq) = first?;
    let key = (stream.to_owned(), seq);
    let mut spans = IN_FLIGHT.spans.lock().unwrap_or_else(|p| p.into_inner());
    spans.insert(key.clone(), span.clone());
    IN_FLIGHT.count.store(spans.len(), Ordering::Release);
    Some(Replicating(key))
}

/// A batch's entry in the spans in flight: removed when dropped (its commit answered or
/// failed), so the span can end.
pub(crate) struct Replicating(Key);

impl Drop for Replicating {
    fn drop(&mut self) {
        let mut spans = IN_FLIGHT.spans.lock().unwrap_or_else(|p| p.into_inner());
        spans.remove(&self.0);
        IN_FLIGHT.count.store(spans.len(), Ordering::Release);
    }
}

/// The span of the replication of the batch whose first record is `first` (stream, seq; see
/// `Batch::first_record`), if it is a traced batch in flight from this process: the parent of
/// the append that carries it to a follower.
pub fn replication_of(first: Option<(&str, u64)>) -> Option<Span> {
    if IN_FLIGHT.count.load(Ordering::Acquire) == 0 {
        return None;
    }
    let (stream, seq) = first?;
    let spans = IN_FLIGHT.spans.lock().unwrap_or_else(|p| p.into_inner());
    spans.get(&(stream.to_owned(), seq)).cloned()
}

/// The span of a section's decision on holds asked for under `caller`.
pub(crate) fn decision(caller: &Span, holds: usize) -> Span {
    tracing::info_span!(target: TARGET, parent: caller, "section.decide", holds,
        placed = tracing::field::Empty)
}

/// The span of one group commit: a child of the first traced span among `callers` (the
/// sections' decisions and other traced jobs it carries), following from the others. `None`
/// when none is traced.
pub(crate) fn group_commit(callers: &[Span], jobs: usize) -> Option<Span> {
    let (first, rest) = callers.split_first()?;
    let span = tracing::info_span!(
        target: TARGET,
        parent: first,
        "group_commit",
        jobs,
        traced_callers = callers.len(),
        records = tracing::field::Empty,
        bytes = tracing::field::Empty,
    );
    for other in rest {
        span.follows_from(other);
    }
    Some(span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_untraced_batch_is_not_kept() {
        assert!(replicating(Some(("section:a:b", 7)), &Span::none()).is_none());
        assert!(replication_of(Some(("section:a:b", 7))).is_none());
    }

    #[test]
    fn a_traced_batch_is_found_by_its_first_record_until_its_commit_ends() {
        // A subscriber that takes every span, so the span is not disabled.
        let subscriber = tracing_subscriber::registry();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(target: TARGET, "replication");
            assert!(!span.is_disabled());
            let kept = replicating(Some(("section:traced:x", 11)), &span).expect("kept");
            let found = replication_of(Some(("section:traced:x", 11))).expect("found");
            assert_eq!(found.id(), span.id());
            assert!(replication_of(Some(("section:traced:x", 12))).is_none());
            assert!(replicating(None, &span).is_none());
            drop(kept);
            assert!(replication_of(Some(("section:traced:x", 11))).is_none());
        });
    }
}
