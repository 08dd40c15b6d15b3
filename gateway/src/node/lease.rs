//! A leader's lease: a leader cut off from its majority stops its engine.

use std::time::Duration;

use boxoffice_engine::Engine;

/// How often a leader serving its engine checks when a majority last acknowledged it.
pub const LEASE_CHECK_EVERY: Duration = Duration::from_millis(500);

/// How long without a majority's acknowledgement a leader keeps its engine: a leader cut off
/// from the majority (a partition, followers that hang) keeps no engine past that, so it
/// cannot answer reads from a state another leader has moved on from for much longer than this
/// (writes never commit without a majority anyway).
pub const LEASE_LOST_AFTER: Duration = Duration::from_secs(3);

/// The watchdog of a leader's engine (see [`LEASE_LOST_AFTER`]): stops `engine` once no
/// majority has acknowledged anything this node sent (appends, heartbeats) for that long, as
/// Raft's own figure says (`millis_since_quorum_ack`, refreshed at every tick of its loop). Not
/// `ensure_linearizable`, whose quorum must answer within one heartbeat interval: on a busy
/// machine that fails often while the group is fine.
pub(crate) fn lease_watchdog(
    raft: boxoffice_engine::raft::Raft,
    engine: Engine,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let lost_ms = u64::try_from(LEASE_LOST_AFTER.as_millis()).unwrap_or(u64::MAX);
        // tokio's clock: a simulation's virtual one.
        let started = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(LEASE_CHECK_EVERY).await;
            let since = raft.metrics().borrow().millis_since_quorum_ack;
            let lost = match since {
                Some(ms) => ms >= lost_ms,
                None => started.elapsed() >= LEASE_LOST_AFTER,
            };
            if lost {
                engine.halt(&format!(
                    "no majority acknowledged this node's leadership for {} s",
                    LEASE_LOST_AFTER.as_secs()
                ));
                return;
            }
        }
    })
}
