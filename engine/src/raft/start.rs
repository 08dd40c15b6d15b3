//! A node's Raft storage as a start opens it.

use super::guard::VoteGuard;
use super::node_db::NodeDb;
use super::store::{LogStore, StateMachine};

/// A node's Raft storage at its start: what the last run wrote is made durable first
/// ([`NodeDb::make_durable`]), then the state machine, the log and the vote guard are opened
/// over it.
///
/// A store that holds less than its marks say was made durable (a log that lost its tail, an
/// older vote: sled's file was damaged or cut) is refused, naming the damage: the node must not
/// vote or lead with it ([`super::marks`]).
pub async fn open_for_start(node: &NodeDb) -> std::io::Result<(StateMachine, LogStore, VoteGuard)> {
    node.make_durable().await?;
    let log = LogStore::open(node)?;
    log.check_marks()
        .map_err(|damage| std::io::Error::other(damaged_store(&damage)))?;
    Ok((StateMachine::open(node)?, log, VoteGuard::open(node)?))
}

/// What a node says of a damaged store (`damage`: what was found), and what to do.
pub fn damaged_store(damage: &str) -> String {
    format!(
        "this node's store is damaged: {damage}. It does not start on it (it must not vote or \
         lead with it): move its data dir aside (keep it to inspect) and start the node with an \
         empty one; it catches up from its group and votes again once it has"
    )
}
