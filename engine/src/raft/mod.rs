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

mod guard;
#[cfg(any(test, feature = "test-support"))]
pub mod harness;
#[cfg(any(test, feature = "test-support"))]
pub mod network;
pub mod observe;
mod store;

use std::io::Cursor;

use serde::{Deserialize, Serialize};

pub use guard::VoteGuard;
pub use store::{
    LogStore, NodeDb, StateMachine, open_for_start, open_node_db, open_node_db_cached,
};

/// One change to a node's log, as the flusher would make it on a single node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Op {
    /// Records of one stream, numbered by its writer, each encoded by [`crate::codec`]; the
    /// sold-seat claims `(key, holder)` are taken first (a claim another holder has refuses the
    /// records, as the single-node backstop does).
    Append {
        /// The stream (see [`crate::store::names`]).
        stream: String,
        /// `(seq, encoded record)`, in order.
        entries: Vec<(u64, Vec<u8>)>,
        /// Claims to take before the records.
        claims: Vec<(String, Vec<u8>)>,
    },
    /// A checkpoint of `stream` covering every record up to `upto` (the records it covers are
    /// removed once it is durable).
    Checkpoint {
        /// The stream.
        stream: String,
        /// The last seq it covers.
        upto: u64,
        /// The state, encoded by [`crate::codec`].
        blob: Vec<u8>,
    },
    /// A record of a table outside the streams (the simulated payment provider's, see
    /// [`crate::store::names::PAYMENTS`]): `value` at `key` of the sled tree `table`.
    Put {
        /// The table (sled tree).
        table: String,
        /// Its key.
        key: Vec<u8>,
        /// Its value.
        value: Vec<u8>,
    },
}

/// One group commit: the changes of every stream the flusher drained at once. The unit of
/// replication (one Raft entry), so replication is paid per batch, not per hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Batch {
    /// The changes, in the order they were queued.
    pub ops: Vec<Op>,
    /// The term of the leadership whose engine wrote the batch (0: not checked). A batch that
    /// lands in a log entry of another term was written by an engine opened under an earlier
    /// leadership of this node (it lost and regained it meanwhile, while another leader wrote):
    /// every node's state machine skips it alike, and the writer's engine stops.
    #[serde(default)]
    pub term: u64,
}

/// What applying an entry did: the log index it was applied at and, if the sold-seat backstop
/// refused a claim (two holders of one seat: a bug the backstop exists to catch), the key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The entry's log index.
    pub index: u64,
    /// The first claim refused (its records were not written), if any.
    pub refused: Option<String>,
    /// The batch was skipped: written under another term than its entry's (see
    /// [`Batch::term`]).
    pub stale: bool,
}

openraft::declare_raft_types!(
    /// The boxoffice Raft types: entries carry [`Batch`]es; a write answers what applying it did.
    pub TypeConfig:
        D = Batch,
        R = Applied,
        NodeId = u64,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = Runtime,
);

/// A Raft node of this crate's types.
pub type Raft = openraft::Raft<TypeConfig>;

/// How long a leader's group commit waits for a majority before it gives up (and its engine
/// stops: a leader cut off from its group acknowledges nothing, and steps down).
pub const COMMIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The flusher's way into a group ([`crate::store::Replicate`]): each group commit becomes one
/// `client_write` submitted by the flusher, its answer awaited by the acker.
pub struct RaftReplicator {
    raft: Raft,
    term: u64,
}

impl RaftReplicator {
    /// Replicates through `raft`, for an engine opened while this node leads in `term` (its
    /// batches are stamped with it).
    pub fn new(raft: Raft, term: u64) -> RaftReplicator {
        RaftReplicator { raft, term }
    }
}

impl crate::store::Replicate for RaftReplicator {
    fn submit(
        &self,
        mut batch: Batch,
    ) -> futures_util::future::BoxFuture<'_, Result<crate::store::Waiter, crate::error::StorageError>>
    {
        Box::pin(async move {
            batch.term = self.term;
            let rx = self
                .raft
                .client_write_ff(batch)
                .await
                .map_err(|e| crate::error::StorageError::Halted(format!("raft: {e}")))?;
            // From the submit, not from when the waiter is first awaited: the acker awaits the
            // batches in flight one after another, and a timeout of its own for each would add
            // up (seed 7943: four batches of a deposed leader took 20 s to fail, and its
            // engine that long to stop, while the node led again and could not serve).
            let deadline = tokio::time::Instant::now() + COMMIT_TIMEOUT;
            let wait: crate::store::Waiter = Box::pin(async move {
                match tokio::time::timeout_at(deadline, rx).await {
                    Ok(Ok(Ok(r))) if r.data.stale => Err(crate::error::StorageError::Halted(
                        "this engine's leadership ended (the group moved to a later term)".into(),
                    )),
                    Ok(Ok(Ok(r))) => Ok(r.data.refused),
                    Ok(Ok(Err(openraft::error::ClientWriteError::ForwardToLeader(_)))) => {
                        Err(crate::error::StorageError::Halted(
                            "this node no longer leads its group".into(),
                        ))
                    }
                    Ok(Ok(Err(e))) => Err(crate::error::StorageError::Io(format!("raft: {e}"))),
                    Ok(Err(_)) => Err(crate::error::StorageError::Halted(
                        "this node's Raft stopped".into(),
                    )),
                    Err(_) => Err(crate::error::StorageError::Halted(format!(
                        "no majority of the group answered within {} s",
                        COMMIT_TIMEOUT.as_secs()
                    ))),
                }
            });
            Ok(wait)
        })
    }
}

/// openraft's runtime: tokio's, but for its random numbers (the election timeouts), which come
/// from [`crate::rt`]: the OS-seeded thread RNG, or a deterministic simulation's seed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Runtime;

impl openraft::AsyncRuntime for Runtime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: openraft::OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = openraft::TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: std::future::Future<Output = R> + openraft::OptionalSend> =
        tokio::time::Timeout<T>;
    type ThreadLocalRng = crate::rt::RaftRng;
    type OneshotSender<T: openraft::OptionalSend> = openraft::async_runtime::TokioOneShotSender<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;
    type OneshotReceiver<T: openraft::OptionalSend> = tokio::sync::oneshot::Receiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: std::future::Future + openraft::OptionalSend + 'static,
        T::Output: openraft::OptionalSend + 'static,
    {
        tokio::task::spawn(future)
    }

    fn sleep(duration: std::time::Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline)
    }

    fn timeout<R, F: std::future::Future<Output = R> + openraft::OptionalSend>(
        duration: std::time::Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: std::future::Future<Output = R> + openraft::OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        crate::rt::RaftRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: openraft::OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (openraft::async_runtime::TokioOneShotSender(tx), rx)
    }
}

/// Entries kept in the log behind a snapshot (a follower a little behind catches up from them).
pub const SNAPSHOT_KEEP_DEFAULT: u64 = 1_000;

/// The Raft timing of a group: heartbeats every 50 ms, an election after 200 to 400 ms without
/// one (so a leader's death is noticed in well under a second), and a snapshot every
/// `snapshot_every` entries (the log before it is then purged, but for the last 1,000).
pub fn config(snapshot_every: u64) -> Result<std::sync::Arc<openraft::Config>, ConfigError> {
    config_keeping(snapshot_every, SNAPSHOT_KEEP_DEFAULT)
}

/// A Raft config that cannot run: the setting it names and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the Raft setting {setting} is invalid: {why}")]
pub struct ConfigError {
    /// The setting (`snapshot_every`, or openraft's own field).
    pub setting: &'static str,
    /// Why it cannot run.
    pub why: String,
}

/// [`config`], keeping `keep` entries behind a snapshot (a simulation keeps few, so lagging
/// followers catch up from snapshots often). A config that cannot run is an error that names
/// its setting, never openraft's defaults in its place.
pub fn config_keeping(
    snapshot_every: u64,
    keep: u64,
) -> Result<std::sync::Arc<openraft::Config>, ConfigError> {
    if snapshot_every == 0 {
        return Err(ConfigError {
            setting: "snapshot_every",
            why: "a snapshot every 0 entries: it must be at least 1".into(),
        });
    }
    let config = openraft::Config {
        heartbeat_interval: 50,
        election_timeout_min: 200,
        election_timeout_max: 400,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(snapshot_every),
        // A follower a little behind catches up from the log, not from a whole snapshot.
        max_in_snapshot_log_to_keep: keep,
        // An entry is a whole group commit (a checkpoint can be megabytes): few per message,
        // so an append stays well within the message limit between nodes.
        max_payload_entries: 16,
        // A snapshot's chunk is written by the receiver before it answers.
        install_snapshot_timeout: 10_000,
        ..Default::default()
    };
    config
        .validate()
        .map(std::sync::Arc::new)
        .map_err(|e| ConfigError {
            setting: match e {
                openraft::ConfigError::ElectionTimeout { .. }
                | openraft::ConfigError::ElectionTimeoutLTHeartBeat { .. } => {
                    "election_timeout_min"
                }
                openraft::ConfigError::MaxPayloadIs0 => "max_payload_entries",
                _ => "openraft config",
            },
            why: e.to_string(),
        })
}

#[cfg(test)]
mod config_tests {
    use super::*;

    #[test]
    fn a_config_that_cannot_run_names_its_setting() {
        let err = config(0).unwrap_err();
        assert_eq!(err.setting, "snapshot_every");
        assert!(err.to_string().contains("snapshot_every"), "{err}");
        let ok = config_keeping(7, 3).unwrap();
        assert_eq!(
            ok.snapshot_policy,
            openraft::SnapshotPolicy::LogsSinceLast(7)
        );
        assert_eq!(ok.max_in_snapshot_log_to_keep, 3);
        assert_eq!(ok.heartbeat_interval, 50);
    }
}

#[cfg(test)]
mod simulation;
#[cfg(test)]
mod tests;
