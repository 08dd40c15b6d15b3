//! Spans of one request's way through the engine, for distributed traces (issue 31).
//!
//! The engine knows only `tracing`: every span here has the target [`TARGET`], which the binary
//! sends to OpenTelemetry when `--otlp-endpoint` is given and to nothing otherwise (then no
//! layer takes it, the log's filter caps the level below it, and each span is `Span::none()`
//! after the macro's static level check). With export on, a call the gate did not sample has no
//! span, and none is made under it ([`under_current`]). A span crosses a task or thread as a value: the section
//! actor's hold message carries its caller's span, a log job carries the spans of the sampled
//! callers it serves ([`sampled`]), the acker gets the group commit's span with the batch. A
//! group commit serves many callers: its span is a child of the first sampled caller's span and
//! *follows from* (an OpenTelemetry link) the others.
//!
//! A replicated group commit's span is kept here, by its group and the batch's first record,
//! while its Raft entry is on its way ([`replicating`]), so the node's Raft network can pass its
//! context on with the append that carries it ([`replication_of`]) and a follower's span of that
//! append joins the same trace.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, OnceLock};

use tracing::Span;

/// The target of every span of a request's way (`boxoffice::trace`): the binary's log lines
/// leave it out, its OpenTelemetry layer takes only it.
pub const TARGET: &str = "boxoffice::trace";

/// Whether a span is sampled, as the exporter decides (installed with it, [`set_sampler`]).
static SAMPLED: OnceLock<fn(&Span) -> bool> = OnceLock::new();

/// Installs the exporter's answer to "is this span sampled?" (once per process; the gateway's
/// exporter installs it). Without it every span that is not disabled counts as sampled.
pub fn set_sampler(sampled: fn(&Span) -> bool) {
    let _ = SAMPLED.set(sampled);
}

/// Whether `span` will be exported: not disabled, and sampled. Only a sampled caller's span is
/// carried on to the group commit, so that an unsampled caller first in a batch cannot leave a
/// sampled one's group commit unsampled, and unsampled calls cost the log nothing.
pub fn sampled(span: &Span) -> bool {
    !span.is_disabled() && SAMPLED.get().is_none_or(|f| f(span))
}

/// A replicated batch: its Raft group and first record (stream, seq). Unique while it is in
/// flight: a stream's numbers only grow on a group's leader.
type Key = (u32, String, u64);

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

/// A traced batch of Raft group `group` on its way to the group, named by its first record
/// (`first`: stream, seq; see `Batch::first_record`): `span` (its replication's) is found by
/// [`replication_of`] until [`Replicating`] is dropped. Nothing is kept for an untraced span.
pub fn replicating(group: u32, first: Option<(&str, u64)>, span: &Span) -> Option<Replicating> {
    if span.is_disabled() {
        return None;
    }
    let (stream, seq) = first?;
    let key = (group, stream.to_owned(), seq);
    let mut spans = IN_FLIGHT.spans.lock().unwrap_or_else(|p| p.into_inner());
    spans.insert(key.clone(), span.clone());
    IN_FLIGHT.count.store(spans.len(), Ordering::Release);
    Some(Replicating { key, id: span.id() })
}

/// A batch's entry in the spans in flight: removed when dropped (its commit answered or
/// failed), so the span can end; only if it is still this batch's (not a later one's with the
/// same name, which would be another process's engine of the same group, in a simulation).
pub struct Replicating {
    key: Key,
    id: Option<tracing::Id>,
}

impl Drop for Replicating {
    fn drop(&mut self) {
        let mut spans = IN_FLIGHT.spans.lock().unwrap_or_else(|p| p.into_inner());
        if spans.get(&self.key).is_some_and(|s| s.id() == self.id) {
            spans.remove(&self.key);
        }
        IN_FLIGHT.count.store(spans.len(), Ordering::Release);
    }
}

/// Whether any traced batch is in flight from this process (one atomic load): the Raft network
/// looks no further when none is.
pub fn any_in_flight() -> bool {
    IN_FLIGHT.count.load(Ordering::Acquire) > 0
}

/// The span of the replication of group `group`'s batch whose first record is `first` (stream,
/// seq; see `Batch::first_record`), if it is a traced batch in flight from this process: the
/// parent of the append that carries it to a follower.
pub fn replication_of(group: u32, first: Option<(&str, u64)>) -> Option<Span> {
    if !any_in_flight() {
        return None;
    }
    let (stream, seq) = first?;
    let spans = IN_FLIGHT.spans.lock().unwrap_or_else(|p| p.into_inner());
    spans.get(&(group, stream.to_owned(), seq)).cloned()
}

/// A span made by `make` in the trace of the current span, or none if the current span is
/// none: the call is not traced (export off, or a gate that did not sample it), and nothing
/// under it is made either. Off, one static level check.
pub fn under_current(make: impl FnOnce() -> Span) -> Span {
    if !tracing::level_enabled!(tracing::Level::INFO) || Span::current().is_disabled() {
        return Span::none();
    }
    make()
}

/// The span of a section's decision on holds asked for under `caller` (none if it is none).
pub(crate) fn decision(caller: &Span, holds: usize) -> Span {
    if caller.is_disabled() {
        return Span::none();
    }
    tracing::info_span!(target: TARGET, parent: caller, "section.decide", holds,
        placed = tracing::field::Empty)
}

/// The span of one group commit: a child of the first of `callers` (the sampled callers' spans
/// its jobs carry), following from the others. `None` when it carries none.
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
        assert!(replicating(0, Some(("section:a:b", 7)), &Span::none()).is_none());
        assert!(replication_of(0, Some(("section:a:b", 7))).is_none());
    }

    #[test]
    fn a_traced_batch_is_found_by_its_first_record_until_its_commit_ends() {
        // A subscriber that takes every span, so the span is not disabled.
        let subscriber = tracing_subscriber::registry();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(target: TARGET, "replication");
            assert!(!span.is_disabled());
            let kept = replicating(3, Some(("ledger/0", 11)), &span).expect("kept");
            let found = replication_of(3, Some(("ledger/0", 11))).expect("found");
            assert_eq!(found.id(), span.id());
            // Another record, or the same stream's record of another group: not this batch.
            assert!(replication_of(3, Some(("ledger/0", 12))).is_none());
            assert!(replication_of(4, Some(("ledger/0", 11))).is_none());
            assert!(replicating(3, None, &span).is_none());
            // A later batch of the same name replaces it; the earlier one's end leaves it.
            let later = tracing::info_span!(target: TARGET, "replication");
            let kept_later = replicating(3, Some(("ledger/0", 11)), &later).expect("kept");
            drop(kept);
            let found = replication_of(3, Some(("ledger/0", 11))).expect("still there");
            assert_eq!(found.id(), later.id());
            drop(kept_later);
            assert!(replication_of(3, Some(("ledger/0", 11))).is_none());
        });
    }
}
