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
//! any other, and that is remembered (`voter_ready` in `raft_meta`). Catching up is remembered
//! too (`voter_catching_up`, with the target once known): a node restarted before it caught up
//! has a log then, but still not everything it may once have acknowledged, so it keeps
//! waiting. A node restarted with its data, never marked either way, was never pristine. See
//! ARCHITECTURE.md, "Replication".

use std::sync::{Arc, Mutex};

use openraft::raft::{AppendEntriesRequest, VoteRequest};

use super::node_db::NodeDb;
use super::types::{Raft, TypeConfig};
use crate::store::names;

const VOTER_READY: &[u8] = b"voter_ready";
/// Present while the node catches up: empty until a leader reached it, then the target index
/// (8 bytes, big-endian).
const VOTER_CATCHING_UP: &[u8] = b"voter_catching_up";

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
        let read = |key: &[u8]| meta.get(key).map_err(std::io::Error::other);
        let ready = read(VOTER_READY)?.is_some();
        let catching_up = read(VOTER_CATCHING_UP)?;
        let pristine = !ready
            && catching_up.is_none()
            && meta.is_empty().map_err(std::io::Error::other)?
            && log.is_empty().map_err(std::io::Error::other)?;
        let state = match (&catching_up, ready) {
            (_, true) => State::Ready,
            (Some(target), false) => State::CatchingUp {
                target: <[u8; 8]>::try_from(target.as_slice())
                    .ok()
                    .map(u64::from_be_bytes),
            },
            (None, false) if pristine => State::CatchingUp { target: None },
            (None, false) => State::Ready,
        };
        let guard = VoteGuard {
            state: Arc::new(Mutex::new(state)),
            meta,
        };
        match state {
            // Durable with the node's first acknowledgement (its sync covers every tree).
            State::CatchingUp { target: None } if pristine => {
                guard.remember(VOTER_CATCHING_UP, &[])
            }
            State::Ready if !ready => guard.set_ready(),
            _ => {}
        }
        Ok(guard)
    }

    fn state(&self) -> State {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the node ready to vote (it formed the group, or it caught up), durably.
    pub fn set_ready(&self) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Ready;
        // Not recorded: after a restart the node still catches up, which is safe.
        self.remember(VOTER_READY, &[1u8]);
        if let Err(e) = self.meta.remove(VOTER_CATCHING_UP) {
            tracing::warn!(error = %e, "cannot record that this node caught up");
        }
    }

    /// Writes a mark of the guard's state; it is durable with the node's next sync (the one
    /// before it acknowledges anything). A write that fails is logged; a restart then goes by
    /// what is on disk.
    fn remember(&self, key: &[u8], value: &[u8]) {
        if let Err(e) = self.meta.insert(key, value) {
            tracing::warn!(error = %e, "cannot record this node's vote guard state");
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
            // Written before the append is taken, so durable with its sync.
            self.remember(VOTER_CATCHING_UP, &target.to_be_bytes());
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

    #[test]
    fn a_node_restarted_before_it_caught_up_still_catches_up() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = super::super::open_node_db(dir.path()).unwrap();
            let g = VoteGuard::open(&db).unwrap();
            assert_eq!(g.state(), State::CatchingUp { target: None });
            // A restart before any leader reached it, with something in its log by then.
            let log = db
                .tree(&format!("{}log", names::RAFT_TREES_PREFIX))
                .unwrap();
            log.insert(b"entry", b"x").unwrap();
        }
        {
            let db = super::super::open_node_db(dir.path()).unwrap();
            let g = VoteGuard::open(&db).unwrap();
            assert_eq!(
                g.state(),
                State::CatchingUp { target: None },
                "not ready for its log"
            );
            let req = AppendEntriesRequest::<TypeConfig> {
                vote: openraft::Vote::new_committed(2, 1),
                prev_log_id: None,
                entries: Vec::new(),
                leader_commit: Some(openraft::LogId::new(
                    openraft::CommittedLeaderId::new(2, 1),
                    41,
                )),
            };
            g.saw_append(&req);
        }
        let db = super::super::open_node_db(dir.path()).unwrap();
        let g = VoteGuard::open(&db).unwrap();
        assert_eq!(
            g.state(),
            State::CatchingUp { target: Some(41) },
            "the target is kept"
        );
        g.set_ready();
        drop(g);
        drop(db);
        let db = super::super::open_node_db(dir.path()).unwrap();
        assert_eq!(VoteGuard::open(&db).unwrap().state(), State::Ready);
    }
}
