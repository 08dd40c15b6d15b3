//! One change a Raft group's leader is asked to make: of its members (openraft's joint
//! consensus), or, in group 0, of the cluster's ticket key ring; and what a failed change means
//! to the node that asked ([`crate::node::members`]).

use std::collections::BTreeSet;
use std::time::Duration;

use boxoffice_engine::raft::Raft;
use openraft::{BasicNode, ChangeMembers};
use serde::{Deserialize, Serialize};

use crate::node::ring::{ClusterRing, Rotate};

/// How long a group's leader waits for a node it adds to catch up before making it a voter.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(60);
/// How long a change is retried while a group has no leader, or its leader changes.
pub const CHANGE_WAIT: Duration = Duration::from_secs(30);

/// One change of a group, as its leader is asked to make it.
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
    /// Add a new key to the ticket key ring that signs from `signs_from_ms` on (group 0 only;
    /// see [`crate::node::ring`]).
    RotateTicketKey {
        /// When the new key starts signing, ms since the Unix epoch.
        signs_from_ms: u64,
    },
}

/// Makes `change` in the group `raft` leads here (`ring`: the node's ticket key ring); `Err`
/// says why not.
pub(crate) async fn apply(
    raft: &Raft,
    change: &MemberChange,
    ring: &ClusterRing,
) -> Result<(), Retry> {
    if let MemberChange::RotateTicketKey { signs_from_ms } = change {
        return ring
            .rotate(raft, *signs_from_ms)
            .await
            .map_err(|e| match e {
                Rotate::Again(why) => Retry::Yes(why),
                Rotate::Refused(why) => Retry::No(why),
                Rotate::Full(keys) => Retry::RingFull(keys),
            });
    }
    members(raft, change).await.map_err(Retry::from_leader)
}

/// Makes the members' `change` in the group `raft` leads here.
async fn members(raft: &Raft, change: &MemberChange) -> Result<(), String> {
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
        MemberChange::RotateTicketKey { .. } => {
            return Err("a rotation is no change of members".to_owned());
        }
    }
    Ok(())
}

/// A failed change: worth trying again at the group's (new) leader, or not.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Retry {
    /// The leader changed or could not be reached: try again.
    Yes(String),
    /// The leader refused the change: say why.
    No(String),
    /// The ticket key ring holds its most keys (this many).
    RingFull(usize),
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
