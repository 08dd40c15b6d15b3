//! The Raft types of a group: an entry carries a [`Batch`] (one group commit), applying it
//! answers [`Applied`], and openraft runs on [`Runtime`].

use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::store::Batch;

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
