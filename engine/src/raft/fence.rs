//! Linearizable answers from a leader: a read or a refusal is given only once this node is known
//! to have led its group, in its engine's term, at some moment after the answer was made.
//!
//! Why that is enough: an entry another leader commits needs a majority that voted for it, and
//! a node that voted for a later term accepts nothing of ours. So if this node led in its term
//! at moment `t` (a majority accepted something it sent after `t`), nothing of a later leader
//! was committed before `t`; an answer made before `t` from this leader's state (which holds
//! everything committed, and whose refusals wait until what they saw is committed) was true at
//! `t`, which lies within the call.
//!
//! Two things prove a moment of leadership:
//! - a group commit of this engine's term submitted at `t` and committed ([`ReadFence::led_at`]:
//!   the replicator says so), which is free while writes flow;
//! - a round of heartbeats started at `t` that a majority answered (openraft's
//!   `get_read_log_id`), started only when no commit covers an answer. One round at a time: the
//!   answers made before a round starts all wait for it, so a burst of reads costs one round.
//!
//! No clock is trusted beyond this process's monotonic one, so a paused or slow leader (SIGSTOP,
//! a long GC-like stall, a partition) cannot answer from a lease that ran out while it slept.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::types::Raft;

/// How long a round of heartbeats may take before the answers waiting for it are refused.
pub const ROUND_TIMEOUT: Duration = Duration::from_secs(1);

/// Why an answer was not confirmed: the caller hears `NOT_READY` (indefinite) and retries,
/// reaching the group's leader.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    /// This node no longer leads its group in the engine's term.
    #[error("this node no longer leads its group in term {0}")]
    NotLeader(u64),
    /// No majority answered a round of heartbeats in time.
    #[error("no majority of the group confirmed this node's leadership")]
    NoMajority,
}

/// Waits until an answer is known true at some moment after it was made (see the module).
pub struct ReadFence {
    raft: Raft,
    term: u64,
    state: Mutex<Seen>,
    /// Held while a round of heartbeats runs: one at a time.
    round: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Seen {
    /// The latest moment this node is known to have led in `term`.
    led: Option<Instant>,
    /// When the latest round that failed started.
    failed: Option<Instant>,
}

impl ReadFence {
    /// The fence of an engine opened while this node leads in `term`.
    pub fn new(raft: Raft, term: u64) -> Arc<ReadFence> {
        Arc::new(ReadFence {
            raft,
            term,
            state: Mutex::new(Seen::default()),
            round: tokio::sync::Mutex::new(()),
        })
    }

    /// The engine's term.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// This node led in the engine's term at `at` (a group commit of that term submitted then
    /// was committed).
    pub fn led_at(&self, at: Instant) {
        let mut s = self.seen();
        if s.led.is_none_or(|led| led < at) {
            s.led = Some(at);
        }
    }

    /// Returns once this node is known to have led in the engine's term at some moment at or
    /// after `answered` (the moment an answer was made); an error if that cannot be shown.
    pub async fn confirm(&self, answered: Instant) -> Result<(), FenceError> {
        if crate::bugs::on(crate::bugs::Bug::StaleLeaderReads) || self.covers(answered)? {
            return Ok(());
        }
        let _round = tokio::time::timeout(ROUND_TIMEOUT, self.round.lock())
            .await
            .map_err(|_| FenceError::NoMajority)?;
        // A round that ran while this call waited may have settled it either way.
        if self.covers(answered)? {
            return Ok(());
        }
        let started = Instant::now();
        self.in_term()?;
        let round = tokio::time::timeout(ROUND_TIMEOUT, self.raft.get_read_log_id()).await;
        match round {
            Ok(Ok(_)) => {
                // The round's heartbeats carried the vote of the term seen before and after it.
                self.in_term()?;
                self.led_at(started);
                Ok(())
            }
            _ => {
                self.seen().failed = Some(started);
                Err(FenceError::NoMajority)
            }
        }
    }

    /// Whether `answered` is covered already: `Ok(true)` by a moment of leadership at or after
    /// it, an error by a round that started after it and failed, `Ok(false)` when a round must
    /// tell.
    fn covers(&self, answered: Instant) -> Result<bool, FenceError> {
        let s = self.seen();
        if s.led.is_some_and(|led| led >= answered) {
            return Ok(true);
        }
        if s.failed.is_some_and(|failed| failed >= answered) {
            return Err(FenceError::NoMajority);
        }
        Ok(false)
    }

    /// Whether this node leads in the engine's term (by its Raft's metrics).
    fn in_term(&self) -> Result<(), FenceError> {
        let m = self.raft.metrics();
        let m = m.borrow();
        if m.current_term == self.term && m.current_leader == Some(m.id) {
            Ok(())
        } else {
            Err(FenceError::NotLeader(self.term))
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}
