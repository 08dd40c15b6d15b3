//! The flusher's way into a group: each group commit of a leader's engine becomes one Raft
//! entry.

use std::sync::Arc;

use super::fence::ReadFence;
use super::types::Raft;
use crate::store::Batch;

/// How long a leader's group commit waits for a majority before it gives up (and its engine
/// stops: a leader cut off from its group acknowledges nothing, and steps down).
pub const COMMIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The flusher's way into a group ([`crate::store::Replicate`]): each group commit becomes one
/// `client_write` submitted by the flusher, its answer awaited by the acker.
pub struct RaftReplicator {
    raft: Raft,
    term: u64,
    fence: Option<Arc<ReadFence>>,
    /// The node's Raft group (names its traced batches in flight, see [`crate::trace`]).
    group: u32,
}

impl RaftReplicator {
    /// Replicates through `raft`, for an engine opened while this node leads in `term` (its
    /// batches are stamped with it).
    pub fn new(raft: Raft, term: u64) -> RaftReplicator {
        RaftReplicator {
            raft,
            term,
            fence: None,
            group: 0,
        }
    }

    /// Replicates into Raft group `group` of the node (0 unless it runs several).
    pub fn of_group(self, group: u32) -> RaftReplicator {
        RaftReplicator { group, ..self }
    }

    /// Tells `fence` of each batch committed in this engine's term (a moment this node led:
    /// reads waiting for one need no round of heartbeats while writes flow).
    pub fn fenced(self, fence: Arc<ReadFence>) -> RaftReplicator {
        RaftReplicator {
            fence: Some(fence),
            ..self
        }
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
            // A traced group commit is submitted in its replication's span: kept where the Raft
            // network finds it (by the batch's first record) until the commit is answered.
            let traced = crate::trace::replicating(
                self.group,
                batch.first_record(),
                &tracing::Span::current(),
            );
            let submitted = tokio::time::Instant::now();
            let fence = self.fence.clone();
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
                let answer = tokio::time::timeout_at(deadline, rx).await;
                drop(traced);
                match answer {
                    Ok(Ok(Ok(r))) if r.data.stale => Err(crate::error::StorageError::Halted(
                        "this engine's leadership ended (the group moved to a later term)".into(),
                    )),
                    Ok(Ok(Ok(r))) => {
                        // Committed in this engine's term: this node led when it was submitted.
                        if let Some(fence) = &fence {
                            fence.led_at(submitted);
                        }
                        Ok(r.data.refused)
                    }
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
