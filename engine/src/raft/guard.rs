//! A node that lost its data does not vote until it has caught up.
//!
//! Raft counts a node's acknowledgement of an entry forever: an entry committed by a majority
//! that included node C is safe only while C keeps it. A node whose data dir was wiped (or
//! replaced by an empty one) comes back with no log and no vote, and would grant its vote to
//! any candidate (an empty log is behind every log), so a stale candidate could win with it and
//! lose entries that were acknowledged. So a node that starts *pristine* (no vote, no log)
//! votes only for a candidate whose log is empty too (the group's first election, when nothing
//! was ever committed), until it has applied everything its group had committed when a leader
//! first reached it (the `leader_commit` of that first append); from then on it is a node like
//! any other, and that is remembered (`voter_ready` in `raft_meta`). A node restarted with its
//! data was never pristine. See ARCHITECTURE.md, "Replication".

use std::sync::{Arc, Mutex};

use openraft::raft::{AppendEntriesRequest, VoteRequest};

use super::{NodeDb, Raft, TypeConfig};
use crate::store::names;

const VOTER_READY: &[u8] = b"voter_ready";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Votes as Raft says.
    Ready,
    /// Pristine at start: votes only in the group's first election until it has applied up to
    /// `target` (the first `leader_commit` it heard; `None`: no leader reached it yet).
    CatchingUp { target: Option<u64> },
}

/// See the module docs.
#[derive(Clone)]
pub struct VoteGuard {
    state: Arc<Mutex<State>>,
    meta: Arc<dyn crate::store::KvTree>,
}

impl VoteGuard {
    /// The guard of `node`: ready if it was ready before, or if its Raft state is not pristine
    /// (it kept its data); catching up otherwise.
    pub fn open(node: &NodeDb) -> std::io::Result<VoteGuard> {
        let meta = node.tree(&format!("{}meta", names::RAFT_TREES_PREFIX))?;
        let log = node.tree(&format!("{}log", names::RAFT_TREES_PREFIX))?;
        let ready = meta
            .get(VOTER_READY)
            .map_err(std::io::Error::other)?
            .is_some();
        let pristine = !ready
            && meta.is_empty().map_err(std::io::Error::other)?
            && log.is_empty().map_err(std::io::Error::other)?;
        let guard = VoteGuard {
            state: Arc::new(Mutex::new(if pristine {
                State::CatchingUp { target: None }
            } else {
                State::Ready
            })),
            meta,
        };
        if !pristine && !ready {
            guard.set_ready();
        }
        Ok(guard)
    }

    fn state(&self) -> State {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the node ready to vote (it formed the group, or it caught up), durably.
    pub fn set_ready(&self) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Ready;
        if let Err(e) = self.meta.insert(VOTER_READY, &[1u8]) {
            // Not durable: after a restart the node is not pristine anyway (it has a log).
            tracing::warn!(error = %e, "cannot record that this node may vote");
        }
    }

    /// Whether this node still waits to catch up before it votes.
    pub fn catching_up(&self) -> bool {
        matches!(self.state(), State::CatchingUp { .. })
    }

    /// Notes a leader's append (its commit index is the catch-up target, the first time).
    pub fn saw_append(&self, req: &AppendEntriesRequest<TypeConfig>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let State::CatchingUp { target: None } = *s {
            let target = req.leader_commit.map_or(0, |l| l.index);
            tracing::info!(
                target,
                "this node started without data: it votes once it has applied up to {target}"
            );
            *s = State::CatchingUp {
                target: Some(target),
            };
        }
    }

    /// Checks whether `raft` has caught up (then the node is ready from now on).
    pub fn check(&self, raft: &Raft) {
        if let State::CatchingUp {
            target: Some(target),
        } = self.state()
        {
            let applied = raft.metrics().borrow().last_applied.map_or(0, |l| l.index);
            if applied >= target {
                tracing::info!(applied, "this node has caught up with its group: it votes");
                self.set_ready();
            }
        }
    }

    /// Whether this node may answer `req` as Raft would (else it refuses to take part).
    pub fn may_vote(&self, raft: &Raft, req: &VoteRequest<u64>) -> bool {
        self.check(raft);
        match self.state() {
            State::Ready => true,
            // The group's first election: nothing was ever committed, nothing can be lost.
            State::CatchingUp { .. } => req.last_log_id.is_none_or(|l| l.index == 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pristine_node_is_catching_up_and_one_with_data_is_ready() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = super::super::open_node_db(dir.path()).unwrap();
            let g = VoteGuard::open(&db).unwrap();
            assert!(g.catching_up());
            g.set_ready();
            assert!(!g.catching_up());
        }
        let db = super::super::open_node_db(dir.path()).unwrap();
        assert!(!VoteGuard::open(&db).unwrap().catching_up(), "remembered");
        let wiped = tempfile::tempdir().unwrap();
        let db = super::super::open_node_db(wiped.path()).unwrap();
        assert!(VoteGuard::open(&db).unwrap().catching_up());
    }
}
