//! Replication with openraft (issue 13, first step): batches of the engine's log records become
//! entries of a Raft log, replicated to every node of a group, and applied, once committed by a
//! majority, to each node's copy of the records.
//!
//! What this step builds, and what it does not yet:
//! - [`TypeConfig`]: a Raft entry's payload is a [`Batch`] (one group commit: the records of
//!   several streams, each already encoded by [`crate::codec`]), so replication is paid per batch,
//!   not per hold.
//! - [`SledLogStore`] ([`openraft::storage::RaftLogStorage`]): the Raft log, vote and commit index
//!   in the node's sled database (trees `raft_log`, `raft_meta`), made durable (sled flush, then
//!   `fdatasync` of sled's data file, as the engine's own sink does) before openraft is told an
//!   append is done. A vote is durable before it is answered.
//! - [`SledStateMachine`] ([`openraft::storage::RaftStateMachine`]): applies committed batches to
//!   the node's copy of the records (tree `raft_applied`, keyed by Raft log index) with the last
//!   applied log id and membership; snapshots are the whole copy, so a node whose data was wiped
//!   catches up from one.
//! - [`network::Router`]: an in-process network between the nodes of one process (tests and
//!   simulations). The gRPC network between processes, the engine's actors writing through
//!   `client_write`, forwarding, placement and the CLI come in the next steps.

// openraft's traits fix the error types (`StorageError`, `RPCError`), large as they are.
#![allow(clippy::result_large_err)]

#[cfg(any(test, feature = "test-support"))]
pub mod harness;
pub mod network;
mod store;

use std::io::Cursor;

use serde::{Deserialize, Serialize};

pub use store::{NodeDb, SledLogStore, SledStateMachine, open_node_db};

/// One group commit: the records of one or more streams, each record encoded by
/// [`crate::codec`]. The unit of replication.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Batch {
    /// `(stream, encoded record)` in the order they were written.
    pub records: Vec<(String, Vec<u8>)>,
}

openraft::declare_raft_types!(
    /// The boxoffice Raft types: entries carry [`Batch`]es; a write answers the log index it was
    /// applied at.
    pub TypeConfig:
        D = Batch,
        R = u64,
        NodeId = u64,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

/// A Raft node of this crate's types.
pub type Raft = openraft::Raft<TypeConfig>;

/// The Raft timing of a group: heartbeats every 50 ms, an election after 200 to 400 ms without
/// one (so a leader's death is noticed in well under a second), and a snapshot every
/// `snapshot_every` entries (the log before it is then purged).
pub fn config(snapshot_every: u64) -> std::sync::Arc<openraft::Config> {
    let config = openraft::Config {
        heartbeat_interval: 50,
        election_timeout_min: 200,
        election_timeout_max: 400,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(snapshot_every),
        max_in_snapshot_log_to_keep: 0,
        ..Default::default()
    };
    // Valid by construction (the election timeout is above the heartbeat).
    std::sync::Arc::new(config.validate().unwrap_or_default())
}

#[cfg(test)]
mod simulation;
#[cfg(test)]
mod tests;
