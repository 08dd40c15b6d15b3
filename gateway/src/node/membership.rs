//! One change of a Raft group's members, as its leader makes it (openraft's joint consensus),
//! and what a failed change means to the node that asked ([`crate::node::members`]).

use std::collections::BTreeSet;
use std::time::Duration;

use boxoffice_engine::raft::Raft;
use openraft::{BasicNode, ChangeMembers};
use serde::{Deserialize, Serialize};

/// How long a group's leader waits for a node it adds to catch up before making it a voter.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(60);
/// How long a change is retried while a group has no leader, or its leader changes.
pub const CHANGE_WAIT: Duration = Duration::from_secs(30);

/// One change of a group's members, as its leader is asked to make it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum MemberChange {
    /// Add node `id`, reached at `addr`, as a voter (a learner first, until it caught up).
    AddVoter {
        /// The node.
        id: u64,
        /// Where its peers reach it.
        addr: String,
    },
    /// Remove node `id` (a voter or a learner).
    Remove {
        /// The node.
        id: u64,
    },
}

/// Makes `change` in the group `raft` leads here; `Err` says why not.
pub(crate) async fn apply(raft: &Raft, change: &MemberChange) -> Result<(), String> {
    let membership = raft.metrics().borrow().membership_config.clone();
    let m = membership.membership();
    match change {
        MemberChange::AddVoter { id, addr } => {
            if m.voter_ids().any(|v| v == *id) {
                return Ok(());
            }
            // A learner already (an earlier try that timed out) is added again: openraft then
            // waits again for it to catch up, so it never votes before it has.
            let added = tokio::time::timeout(
                CATCH_UP_WAIT,
                raft.add_learner(*id, BasicNode::new(addr.clone()), true),
            )
            .await
            .map_err(|_| {
                format!(
                    "node {id} did not catch up within {CATCH_UP_WAIT:?} (is it running, and \
                     reachable at {addr}?); it stays a learner until it has"
                )
            })?;
            added.map_err(|e| format!("adding node {id} as a learner: {e}"))?;
            raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([*id])), false)
                .await
                .map_err(|e| format!("making node {id} a voter: {e}"))?;
        }
        MemberChange::Remove { id } => {
            if m.get_node(id).is_none() {
                return Ok(());
            }
            let change = if m.voter_ids().any(|v| v == *id) {
                ChangeMembers::RemoveVoters(BTreeSet::from([*id]))
            } else {
                ChangeMembers::RemoveNodes(BTreeSet::from([*id]))
            };
            raft.change_membership(change, false)
                .await
                .map_err(|e| format!("removing node {id}: {e}"))?;
        }
    }
    Ok(())
}

/// A failed change: worth trying again at the group's (new) leader, or not.
#[derive(Debug)]
pub(crate) enum Retry {
    /// The leader changed or could not be reached: try again.
    Yes(String),
    /// The leader refused the change: say why.
    No(String),
}

impl Retry {
    /// A leader's refusal: a change that lost its leadership on the way is tried again.
    pub(crate) fn from_leader(why: String) -> Retry {
        if why.contains("ForwardToLeader") || why.contains("has to forward request") {
            Retry::Yes(why)
        } else {
            Retry::No(why)
        }
    }
}
