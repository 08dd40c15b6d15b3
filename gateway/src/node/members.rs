//! A cluster's members, changed live (issue 27, point 7): `ClusterService` (`GetClusterStatus`,
//! `AddNode`, `RemoveNode`) on any node, and each change made by each group's leader with
//! openraft's joint consensus.
//!
//! - **Adding** a node: each group's leader adds it as a learner and waits (up to
//!   [`CATCH_UP_WAIT`]) until it has caught up, then makes it a voter. The node was started
//!   first (`serve --node-id N`), pristine: it waits to be reached, and its vote guard keeps it
//!   from voting until it holds what was committed.
//! - **Removing** a node: each group's leader removes it from the voters and the nodes (a
//!   leader that removes itself steps down once the change commits).
//!
//! The node that is called sends each group's change to that group's leader over the peer
//! links (`boxoffice.cluster.v1.Raft/ChangeMembers`), retrying while a group has no leader or
//! its leader changes, up to [`CHANGE_WAIT`]. Each change is idempotent: a node that already
//! votes is not added again, one that is gone is not removed again, so a caller retries a
//! failed call as it is. Addresses travel in the membership (each node's `BasicNode`): a node
//! added live is reached there by every node, whatever `--peers` said at their start.

use std::sync::Arc;
use std::time::Duration;

use boxoffice_engine::raft::Raft;
use boxoffice_proto::v1 as pb;

use crate::node::handover::{HANDOVER_WAIT, Handovers};
pub use crate::node::membership::{CATCH_UP_WAIT, CHANGE_WAIT, MemberChange};
use crate::node::membership::{Context, Retry, apply};
use crate::node::peers::Peers;
use crate::node::ring::{ClusterRing, ROTATION_LEAD};
use crate::status::{ApiError, ClusterRefusal};

/// The members of this node's groups, and its cluster's ticket key ring, for `ClusterService`.
pub struct Members {
    me: u64,
    /// Each group's Raft (index: the group).
    rafts: Vec<Raft>,
    /// How the node reaches its peers (each group's leader).
    peers: Peers,
    /// The cluster's ticket key ring, as this node holds it.
    ring: Arc<ClusterRing>,
    /// Each group's handover on this node.
    handovers: Handovers,
}

impl Members {
    /// Node `me`'s groups `rafts`, reaching its peers through `peers`, with its copy of the
    /// ticket key ring and its groups' handovers.
    pub(crate) fn new(
        me: u64,
        rafts: Vec<Raft>,
        peers: Peers,
        ring: Arc<ClusterRing>,
        handovers: Handovers,
    ) -> Members {
        Members {
            me,
            rafts,
            peers,
            ring,
            handovers,
        }
    }

    /// Spreads the groups' leaders over the voters again: while one voter leads two groups
    /// more than another, one of its groups is handed over to the one that leads fewest
    /// ([`crate::node::handover`]). Best effort: a move whose target did not win is tried again
    /// (at most twice a group); the status says where the leaders are.
    pub async fn rebalance(&self) -> Result<pb::ClusterStatus, ApiError> {
        let groups = self.rafts.len();
        for _ in 0..groups * 2 {
            let Some((g, to)) = self.next_move() else {
                break;
            };
            let raft = &self.rafts[g];
            let group = u32::try_from(g).unwrap_or(u32::MAX);
            self.in_group(group, raft, &MemberChange::HandOver { to })
                .await?;
            self.stand(group, raft, to).await?;
            let mut seen = raft.metrics();
            let _ = tokio::time::timeout(
                HANDOVER_WAIT,
                seen.wait_for(|m| m.current_leader == Some(to)),
            )
            .await;
            // Every group has a leader again before the next move.
            let _ =
                tokio::time::timeout(CHANGE_WAIT, seen.wait_for(|m| m.current_leader.is_some()))
                    .await;
        }
        Ok(self.status())
    }

    /// The next leadership to move, as this node sees the groups: a group of the voter that
    /// leads most, and the voter that leads fewest, if they differ by two or more.
    fn next_move(&self) -> Option<(usize, u64)> {
        let voters: Vec<u64> = self
            .rafts
            .first()?
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        let leaders: Vec<Option<u64>> = self
            .rafts
            .iter()
            .map(|r| r.metrics().borrow().current_leader)
            .collect();
        let leads = |v: u64| leaders.iter().filter(|l| **l == Some(v)).count();
        let most = *voters
            .iter()
            .max_by_key(|v| (leads(**v), std::cmp::Reverse(**v)))?;
        let fewest = *voters.iter().min_by_key(|v| (leads(**v), **v))?;
        if leads(most) < leads(fewest) + 2 {
            return None;
        }
        let g = leaders.iter().rposition(|l| *l == Some(most))?;
        Some((g, fewest))
    }

    /// Asks node `to` to stand for election in group `group`.
    async fn stand(&self, group: u32, raft: &Raft, to: u64) -> Result<(), ApiError> {
        let groups = u32::try_from(self.rafts.len()).unwrap_or(u32::MAX);
        let outcome = if to == self.me {
            apply(raft, &MemberChange::Elect, &self.context(group)).await
        } else {
            self.peers
                .clone()
                .in_group(group, groups)
                .change_members(to, &MemberChange::Elect)
                .await
        };
        outcome.map_err(|e| {
            ApiError::Cluster(ClusterRefusal::ChangeFailed(format!(
                "group {group}: node {to} could not stand: {e:?}"
            )))
        })
    }

    /// What group `group`'s changes need on this node.
    fn context(&self, group: u32) -> Context<'_> {
        Context {
            ring: &self.ring,
            handover: &self.handovers[group as usize],
        }
    }

    /// Rotates the cluster's ticket signing key: a new key, made by group 0's leader, signs
    /// from [`ROTATION_LEAD`] after now ([`crate::node::ring`]).
    pub async fn rotate_ticket_key(&self) -> Result<pb::ClusterStatus, ApiError> {
        let lead = u64::try_from(ROTATION_LEAD.as_millis()).unwrap_or(u64::MAX);
        let signs_from_ms = self.ring.now_ms().saturating_add(lead);
        let change = MemberChange::RotateTicketKey { signs_from_ms };
        let Some(raft) = self.rafts.first() else {
            return Err(ApiError::Cluster(ClusterRefusal::NotACluster));
        };
        self.in_group(0, raft, &change).await?;
        // The answer is this node's view: it waits until its copy of group 0 holds the key.
        let _ = tokio::time::timeout(CHANGE_WAIT, async {
            while !self
                .ring
                .public()
                .iter()
                .any(|k| k.signs_from_ms == signs_from_ms)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        Ok(self.status())
    }

    /// The cluster as this node sees it.
    pub fn status(&self) -> pb::ClusterStatus {
        let mut nodes: std::collections::BTreeMap<u64, pb::ClusterNode> = Default::default();
        let mut groups = Vec::new();
        for (g, raft) in self.rafts.iter().enumerate() {
            let metrics = raft.metrics().borrow().clone();
            let m = metrics.membership_config.membership();
            let voters: Vec<u64> = m.voter_ids().collect();
            let learners: Vec<u64> = m.learner_ids().collect();
            for (id, node) in m.nodes() {
                let entry = nodes.entry(*id).or_insert_with(|| pb::ClusterNode {
                    node_id: *id,
                    address: node.addr.clone(),
                    voter: true,
                    leads: Vec::new(),
                });
                entry.voter &= voters.contains(id);
                if metrics.current_leader == Some(*id) {
                    entry.leads.push(u32::try_from(g).unwrap_or(u32::MAX));
                }
            }
            groups.push(pb::ClusterGroup {
                group: u32::try_from(g).unwrap_or(u32::MAX),
                leader_id: metrics.current_leader.unwrap_or(0),
                term: metrics.current_term,
                voters,
                learners,
                last_log_index: metrics.last_log_index.unwrap_or(0),
            });
        }
        let ticket_keys = self
            .ring
            .public()
            .into_iter()
            .map(|k| pb::TicketKey {
                key_id: k.kid,
                public_key: k.public_hex,
                signs_from_unix_ms: i64::try_from(k.signs_from_ms).unwrap_or(i64::MAX),
                can_sign: k.can_sign,
            })
            .collect();
        pb::ClusterStatus {
            answered_by: self.me,
            nodes: nodes.into_values().collect(),
            groups,
            ticket_keys,
        }
    }

    /// Adds node `id` at `addr` to every group, as a voter.
    pub async fn add(&self, id: u64, addr: &str) -> Result<pb::ClusterStatus, ApiError> {
        check_address(addr)?;
        if id == 0 {
            return Err(invalid("node_id", "must be at least 1"));
        }
        let change = MemberChange::AddVoter {
            id,
            addr: addr.to_owned(),
        };
        self.everywhere(&change).await?;
        Ok(self.status())
    }

    /// Removes node `id` from every group.
    pub async fn remove(&self, id: u64) -> Result<pb::ClusterStatus, ApiError> {
        if !self.counts(id) {
            return Err(ApiError::Cluster(ClusterRefusal::NodeNotFound(id)));
        }
        let last = self.rafts.iter().any(|r| {
            let metrics = r.metrics().borrow().membership_config.clone();
            let voters: Vec<u64> = metrics.membership().voter_ids().collect();
            voters == [id]
        });
        if last {
            return Err(ApiError::Cluster(ClusterRefusal::LastVoter(id)));
        }
        self.everywhere(&MemberChange::Remove { id }).await?;
        Ok(self.status())
    }

    /// Replaces node `old` by node `new` at `addr` in every group: `new` added as a voter
    /// first, then `old` removed.
    pub async fn replace(
        &self,
        old: u64,
        new: u64,
        addr: &str,
    ) -> Result<pb::ClusterStatus, ApiError> {
        check_address(addr)?;
        if new == 0 {
            return Err(invalid("new_node_id", "must be at least 1"));
        }
        if new == old {
            return Err(invalid(
                "new_node_id",
                "must differ from old_node_id (to move a node, start it under a new id)",
            ));
        }
        if !self.counts(old) {
            return Err(ApiError::Cluster(ClusterRefusal::NodeNotFound(old)));
        }
        let add = MemberChange::AddVoter {
            id: new,
            addr: addr.to_owned(),
        };
        self.everywhere(&add).await?;
        self.everywhere(&MemberChange::Remove { id: old }).await?;
        Ok(self.status())
    }

    /// Whether some group counts node `id` (a voter or a learner).
    fn counts(&self, id: u64) -> bool {
        self.rafts.iter().any(|r| {
            let metrics = r.metrics().borrow().membership_config.clone();
            metrics.membership().get_node(&id).is_some()
        })
    }

    /// Makes `change` in every group, through each one's leader.
    async fn everywhere(&self, change: &MemberChange) -> Result<(), ApiError> {
        for (g, raft) in self.rafts.iter().enumerate() {
            let group = u32::try_from(g).unwrap_or(u32::MAX);
            self.in_group(group, raft, change).await?;
            // The answer is this node's view: it waits until that view holds the change too
            // (a node that does not lead learns the committed membership a heartbeat later;
            // a node removing itself may never hear the last of it).
            if *change == (MemberChange::Remove { id: self.me }) {
                continue;
            }
            let mut seen = raft.metrics();
            let _ = tokio::time::timeout(
                CHANGE_WAIT,
                seen.wait_for(|m| made(change, m.membership_config.membership())),
            )
            .await;
        }
        Ok(())
    }

    /// Makes `change` in group `group` through its leader, retrying while it has none or its
    /// leader changes.
    async fn in_group(
        &self,
        group: u32,
        raft: &Raft,
        change: &MemberChange,
    ) -> Result<(), ApiError> {
        let deadline = tokio::time::Instant::now() + CHANGE_WAIT;
        let groups = u32::try_from(self.rafts.len()).unwrap_or(u32::MAX);
        let peers = self.peers.clone().in_group(group, groups);
        loop {
            let leader = raft.metrics().borrow().current_leader;
            let outcome = match leader {
                None => Err(Retry::Yes("no leader".to_owned())),
                Some(l) if l == self.me => apply(raft, change, &self.context(group)).await,
                Some(l) => peers.change_members(l, change).await,
            };
            match outcome {
                Ok(()) => return Ok(()),
                Err(Retry::RingFull(keys)) => {
                    return Err(ApiError::Cluster(ClusterRefusal::RingFull(keys)));
                }
                Err(Retry::No(why)) => {
                    return Err(ApiError::Cluster(ClusterRefusal::ChangeFailed(format!(
                        "group {group}: {why}"
                    ))));
                }
                Err(Retry::Yes(why)) if tokio::time::Instant::now() >= deadline => {
                    return Err(ApiError::Cluster(ClusterRefusal::ChangeFailed(format!(
                        "group {group}: {why} (for {CHANGE_WAIT:?}); retry"
                    ))));
                }
                Err(Retry::Yes(_)) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

fn invalid(field: &str, why: &str) -> ApiError {
    ApiError::from(boxoffice_engine::Rejection::InvalidRequest {
        field: field.to_owned(),
        reason: why.to_owned(),
    })
}

/// `HOST:PORT`.
fn check_address(addr: &str) -> Result<(), ApiError> {
    let ok = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if ok {
        Ok(())
    } else {
        Err(invalid("address", "must be HOST:PORT"))
    }
}

/// Whether `membership` shows `change` made.
fn made(
    change: &MemberChange,
    membership: &openraft::Membership<u64, openraft::BasicNode>,
) -> bool {
    match change {
        MemberChange::AddVoter { id, .. } => {
            let joint = membership.get_joint_config();
            joint.len() == 1 && joint[0].contains(id)
        }
        MemberChange::Remove { id } => membership.get_node(id).is_none(),
        MemberChange::RotateTicketKey { .. }
        | MemberChange::HandOver { .. }
        | MemberChange::Elect => true,
    }
}
