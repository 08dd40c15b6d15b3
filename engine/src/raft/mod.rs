//! Replication with openraft (issue 13, first step): batches of the engine's log records become
//! entries of a Raft log, replicated to every node of a group, and applied, once committed by a
//! majority, to each node's copy of the records.
//!
//! What this step builds, and what it does not yet:
//! - [`TypeConfig`]: a Raft entry's payload is a [`Batch`] (one group commit: the records of
//!   several streams, each already encoded by [`crate::codec`]), so replication is paid per batch,
//!   not per hold.
//! - [`LogStore`] ([`openraft::storage::RaftLogStorage`]): the Raft log, vote and commit index
//!   in the node's sled database (trees `raft_log`, `raft_meta`), made durable (sled flush, then
//!   `fdatasync` of sled's data file, as the engine's own sink does) before openraft is told an
//!   append is done. A vote is durable before it is answered.
//! - [`StateMachine`] ([`openraft::storage::RaftStateMachine`]): applies committed batches to
//!   the node's copy of the records (tree `raft_applied`, keyed by Raft log index) with the last
//!   applied log id and membership; snapshots are the whole copy, so a node whose data was wiped
//!   catches up from one.
//! - `network::Router` (tests and feature `test-support` only): an in-process network between
//!   the nodes of one process. The network between processes is gRPC
//!   (`boxoffice_gateway::node::peers`).

// openraft's traits fix the error types (`StorageError`, `RPCError`), large as they are.
#![allow(clippy::result_large_err)]

mod config;
mod fence;
mod guard;
#[cfg(any(test, feature = "test-support"))]
pub mod harness;
mod marks;
#[cfg(any(test, feature = "test-support"))]
pub mod network;
mod node_db;
pub mod observe;
mod replicator;
mod start;
mod store;
mod types;

pub use crate::store::{Batch, Op};
pub use config::{ConfigError, ELECTION_MAX_MS, SNAPSHOT_KEEP_DEFAULT, config, config_keeping};
pub use fence::{FenceError, ROUND_TIMEOUT, ReadFence};
pub use guard::VoteGuard;
pub use node_db::{NodeDb, open_node_db, open_node_db_cached};
pub use replicator::{COMMIT_TIMEOUT, RaftReplicator};
pub use start::{DamagedStore, damaged_store, is_damaged_store, open_for_start};
pub use store::{LogStore, StateMachine};
pub use types::{Applied, Raft, Runtime, TypeConfig};

#[cfg(test)]
mod simulation;
#[cfg(test)]
mod tests;
