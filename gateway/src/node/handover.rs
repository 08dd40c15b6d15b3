//! Moving a group's leadership to another node (`ClusterService.Rebalance`), as openraft 0.9
//! allows it (it has no leadership transfer of its own): the Raft thesis' transfer (section
//! 3.10), made of what 0.9 offers.
//!
//! 1. The leader hands over: its engine for the group stops (callers get `NOT_READY`, as in an
//!    election), so its log stops growing, and it waits until the target holds all of it.
//! 2. The target stands (`trigger().elect()`) with a log as long as the leader's. The leader
//!    grants its vote: it refuses a candidate only while its own leadership is younger than the
//!    leader lease (the longest election timeout), or for a shorter log. In a group of three,
//!    the two votes are a majority at once; in a larger group the others refuse while the old
//!    leader's lease on them runs (up to 0.3 s), and the target wins at its next try, unless
//!    another node's election timer fires first (then that node leads: the move is tried again).
//! 3. A handover ends by itself after [`HANDOVER_WAIT`]: if the target did not win, the old
//!    leader serves again.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How long a leader stays handed over (not serving) waiting for the target to win.
pub const HANDOVER_WAIT: Duration = Duration::from_secs(3);

/// Each group's handover on this node (index: the group).
pub(crate) type Handovers = std::sync::Arc<Vec<std::sync::Arc<Handover>>>;

/// A handover for each of `groups` groups, none begun.
pub(crate) fn handovers(groups: u32) -> Handovers {
    std::sync::Arc::new((0..groups).map(|_| Default::default()).collect())
}

/// Whether this node hands a group over now, and to which node, until when.
pub(crate) struct Handover {
    to: watch::Sender<Option<(u64, Instant)>>,
    /// The leadership loop serves no engine for the group (since the handover began).
    quiet: watch::Sender<bool>,
}

impl Default for Handover {
    fn default() -> Self {
        Handover {
            to: watch::Sender::new(None),
            quiet: watch::Sender::new(false),
        }
    }
}

impl Handover {
    /// Hands the group over to node `to` for [`HANDOVER_WAIT`] from now.
    pub(crate) fn begin(&self, to: u64) {
        self.quiet.send_replace(false);
        self.to
            .send_replace(Some((to, Instant::now() + HANDOVER_WAIT)));
    }

    /// The leadership loop says it serves no engine for the group any more.
    pub(crate) fn now_quiet(&self) {
        self.quiet.send_if_modified(|q| !std::mem::replace(q, true));
    }

    /// Waits (up to `within`) until the leadership loop serves no engine for the group: the
    /// group's log grows no more. `false` if it still did by then.
    pub(crate) async fn quiet(&self, within: Duration) -> bool {
        let mut q = self.quiet.subscribe();
        tokio::time::timeout(within, q.wait_for(|q| *q))
            .await
            .is_ok()
    }

    /// Whether the group is handed over now.
    pub(crate) fn active(&self) -> bool {
        matches!(*self.to.borrow(), Some((_, until)) if Instant::now() < until)
    }

    /// Told of every handover begun.
    pub(crate) fn watch(&self) -> watch::Receiver<Option<(u64, Instant)>> {
        self.to.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_handover_ends_by_itself() {
        let h = Handover::default();
        assert!(!h.active());
        let mut told = h.watch();
        h.begin(2);
        assert!(told.has_changed().unwrap());
        assert_eq!(told.borrow_and_update().map(|(to, _)| to), Some(2));
        assert!(h.active());
        assert!(!h.quiet(Duration::from_millis(10)).await);
        h.now_quiet();
        assert!(h.quiet(Duration::from_millis(10)).await);
        tokio::time::advance(HANDOVER_WAIT + Duration::from_millis(1)).await;
        assert!(!h.active());
        // A new handover waits for the loop to be quiet again.
        h.begin(3);
        assert!(!h.quiet(Duration::from_millis(10)).await);
    }
}
