//! One change a Raft group's leader is asked to make: of its members (openraft's joint
//! consensus), or, in group 0, of the cluster's ticket key ring; and what a failed change means
//! to the node that asked ([`crate::node::members`]).

use std::collections::BTreeSet;
use std::time::Duration;

use boxoffice_engine::raft::Raft;
use openraft::{BasicNode, ChangeMembers};
use serde::{Deserialize, Serialize};

use crate::node::handover::{HANDOVER_WAIT, Handover};
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
    /// Hand the leadership over to node `to` (asked of the leader: it stops serving and waits
    /// until `to` holds its whole log; see [`crate::node::handover`]).
    HandOver {
        /// The node that is to lead.
        to: u64,
    },
    /// Stand for election now (asked of the node a leader hands over to).
    Elect,
}

/// What a group's changes need beside its Raft.
pub(crate) struct Context<'a> {
    /// The node's ticket key ring (group 0's leader rotates it).
    pub ring: &'a ClusterRing,
    /// The group's handover on this node.
    pub handover: &'a Handover,
}

/// Makes `change` in the group `raft` leads here (or, for [`MemberChange::Elect`], is a
/// member of); `Err` says why not.
pub(crate) async fn apply(
    raft: &Raft,
    change: &MemberChange,
    ctx: &Context<'_>,
) -> Result<(), Retry> {
    match change {
        MemberChange::RotateTicketKey { signs_from_ms } => ctx
            .ring
            .rotate(raft, *signs_from_ms)
            .await
            .map_err(|e| match e {
                Rotate::Again(why) => Retry::Yes(why),
                Rotate::Refused(why) => Retry::No(why),
                Rotate::Full(keys) => Retry::RingFull(keys),
            }),
        MemberChange::HandOver { to } => hand_over(raft, *to, ctx.handover).await,
        MemberChange::Elect => {
            let m = raft.metrics().borrow().clone();
            if m.current_leader == Some(m.id) {
                return Ok(());
            }
            raft.trigger()
                .elect()
                .await
                .map_err(|e| Retry::No(format!("standing for election: {e}")))
        }
        _ => members(raft, change).await.map_err(Retry::from_leader),
    }
}

/// Hands the group `raft` leads here over to node `to`: stops serving it, and waits until `to`
/// holds the whole log.
async fn hand_over(raft: &Raft, to: u64, handover: &Handover) -> Result<(), Retry> {
    let m = raft.metrics().borrow().clone();
    if m.current_leader == Some(to) {
        return Ok(());
    }
    if !m
        .membership_config
        .membership()
        .voter_ids()
        .any(|v| v == to)
    {
        return Err(Retry::No(format!("node {to} is not a voter of the group")));
    }
    handover.begin(to);
    if !handover.quiet(HANDOVER_WAIT).await {
        return Err(Retry::Yes("the leader did not stop serving in time".into()));
    }
    let mut w = raft.metrics();
    let held = tokio::time::timeout(
        HANDOVER_WAIT,
        w.wait_for(|m| {
            let held = m
                .replication
                .as_ref()
                .and_then(|r| r.get(&to))
                .and_then(|l| l.map(|l| l.index));
            held >= m.last_log_index
        }),
    )
    .await;
    match held {
        Ok(Ok(_)) => Ok(()),
        _ => Err(Retry::Yes(format!(
            "node {to} did not catch up with the leader within {HANDOVER_WAIT:?}"
        ))),
    }
}

/// Makes the members' `change` in the group `raft` leads here.
async fn members(raft: &Raft, change: &MemberChange) -> Result<(), String> {
    let membership = raft.metrics().borrow().membership_config.clone();
    let m = membership.membership();
    match change {
        MemberChange::AddVoter { id, addr } => {
            // A voter of the config the group moves to; a joint config (a change a crash or a
            // power cut interrupted) is finished by the change below, never taken as done.
            let joint = m.get_joint_config();
            let votes = joint.last().is_some_and(|c| c.contains(id));
            if votes && joint.len() == 1 {
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
        MemberChange::RotateTicketKey { .. }
        | MemberChange::HandOver { .. }
        | MemberChange::Elect => {
            return Err("not a change of members".to_owned());
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
