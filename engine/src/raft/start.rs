//! A node's Raft storage as a start opens it.

use super::guard::VoteGuard;
use super::node_db::NodeDb;
use super::store::{LogStore, StateMachine};

/// A node's Raft storage at its start: what the last run wrote is made durable first
/// ([`NodeDb::make_durable`]), then the state machine, the log and the vote guard are opened
/// over it.
pub async fn open_for_start(node: &NodeDb) -> std::io::Result<(StateMachine, LogStore, VoteGuard)> {
    node.make_durable().await?;
    Ok((
        StateMachine::open(node)?,
        LogStore::open(node)?,
        VoteGuard::open(node)?,
    ))
}
