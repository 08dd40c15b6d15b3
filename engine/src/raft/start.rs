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
/// vote or lead with it ([`super::marks`]). A tail torn by a crash before its sync (a gap or a
/// damaged entry above the last index marked: never acknowledged) is cut, synced and logged.
pub async fn open_for_start(node: &NodeDb) -> std::io::Result<(StateMachine, LogStore, VoteGuard)> {
    node.make_durable().await?;
    let log = LogStore::open(node)?;
    let torn = log
        .check_marks()
        .map_err(|damage| std::io::Error::other(damaged_store(&damage)))?;
    if let Some(from) = torn {
        let cut = log.cut_torn_tail(from)?;
        node.make_durable().await?;
        tracing::warn!(
            from,
            entries = cut,
            "this node's Raft log held a tail torn by a crash before its sync (never \
             acknowledged): cut"
        );
    }
    Ok((StateMachine::open(node)?, log, VoteGuard::open(node)?))
}

/// A node's store found damaged at its start: what was found. The node must not vote or lead
/// with it; a cluster node moves it aside and rejoins its group empty
/// (`boxoffice_gateway::node`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedStore(pub String);

impl std::fmt::Display for DamagedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this node's store is damaged: {}. It never votes or leads with it",
            self.0
        )
    }
}

impl std::error::Error for DamagedStore {}

/// What a node says of a damaged store (`damage`: what was found).
pub fn damaged_store(damage: &str) -> DamagedStore {
    DamagedStore(damage.to_owned())
}

/// Whether `e`, or an error under it (an I/O error's too), is a [`DamagedStore`].
pub fn is_damaged_store(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(e) = at {
        if e.downcast_ref::<DamagedStore>().is_some()
            || e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .is_some_and(|inner| inner.downcast_ref::<DamagedStore>().is_some())
        {
            return true;
        }
        at = e.source();
    }
    false
}
