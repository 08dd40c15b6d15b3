//! Bugs put back on purpose (feature `test-support` only): the proof that the deterministic
//! simulation bites. Each switch brings back one mistake a storage engine or a Raft
//! implementation is known to make; the simulation must find it within its seeds.
//!
//! The switches are process-wide and off by default; only the simulation's tests set them (one
//! run at a time). Without `test-support` they cannot be set, and [`on`] is `false` at compile
//! time.

use std::sync::atomic::{AtomicU32, Ordering};

/// A bug that can be put back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bug {
    /// A write is acknowledged before its fsync: a node's Raft log reports an append durable
    /// without syncing it, and a single node's flusher replies before its sync.
    ReplyBeforeSync,
    /// A section answers a refusal (`SOLD_OUT`, `SEAT_UNAVAILABLE`) at once, although the change
    /// it depends on (the hold that took the last places) is not durable yet.
    RefusalBeforeDurable,
    /// A node answers a vote before the vote is durable (`save_vote` without a sync).
    VoteBeforeDurable,
    /// A snapshot is installed in several writes instead of one: a crash in the middle leaves
    /// part of it.
    SnapshotNonAtomic,
    /// A restarted leader resumes its term at once (openraft 0.9 restores a node whose saved
    /// vote is committed and its own as leader), and its engine opens before the node has
    /// applied every entry in its log: the coordinated power cut's loss (issue 24).
    LeaderResumesTerm,
    /// A leader answers reads and refusals from its state without confirming that it still
    /// leads (no read fence): a deposed leader answers from a state a newer leader has moved on
    /// from (issue 27).
    StaleLeaderReads,
    /// Each cluster node signs tickets with a key of its own (made on its first lead) instead
    /// of the cluster's key ring: an order read through another leader shows other codes than
    /// its fan received (issue 27).
    NodeTicketKeys,
}

impl Bug {
    /// Every bug.
    pub const ALL: [Bug; 7] = [
        Bug::ReplyBeforeSync,
        Bug::RefusalBeforeDurable,
        Bug::VoteBeforeDurable,
        Bug::SnapshotNonAtomic,
        Bug::LeaderResumesTerm,
        Bug::StaleLeaderReads,
        Bug::NodeTicketKeys,
    ];

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

static ON: AtomicU32 = AtomicU32::new(0);

/// Puts `bugs` back (and takes every other one out).
#[cfg(feature = "test-support")]
pub fn set(bugs: &[Bug]) {
    ON.store(
        bugs.iter().fold(0, |b, bug| b | bug.bit()),
        Ordering::SeqCst,
    );
}

/// Whether `bug` is put back (never without `test-support`).
pub fn on(bug: Bug) -> bool {
    cfg!(feature = "test-support") && ON.load(Ordering::Relaxed) & bug.bit() != 0
}
