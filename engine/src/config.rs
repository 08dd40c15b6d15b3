//! [`EngineConfig`]: how an engine runs. Every default comes from [`crate::limits`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{Rejection, StorageError};
use crate::integrity::RecoveryMode;
use crate::limits::{
    CHANGE_RETENTION_MS_DEFAULT, CHECKPOINT_EVERY_RECORDS_DEFAULT, IDEMPOTENCY_WINDOW_MS_DEFAULT,
    IDEMPOTENCY_WINDOW_MS_MAX, IDEMPOTENCY_WINDOW_MS_MIN, LEDGER_SHARDS_DEFAULT,
    SECTION_INFLIGHT_MAX_DEFAULT, WAITLIST_MAX_DEFAULT,
};
use crate::payment::{PaymentProvider, SimulatedConfig, SimulatedProvider};
use crate::store::{Durability, LogSink, Replicate};

/// How the engine runs. `EngineConfig::new(dir)` gives the defaults.
#[derive(Clone)]
pub struct EngineConfig {
    /// Where the sled database lives (created if missing). Unused when `sink` is set.
    pub data_dir: PathBuf,
    /// Where the log lives instead of a sled database in `data_dir` (for example a
    /// [`MemorySink`](crate::MemorySink) in tests and simulations). `None`: sled in `data_dir`.
    pub sink: Option<Arc<dyn LogSink>>,
    /// When an acknowledged write is durable.
    pub durability: Durability,
    /// Wall clock for deadlines.
    pub clock: Arc<dyn Clock>,
    /// Number of ledger shard actors (users are spread over them by a stable hash).
    pub ledger_shards: usize,
    /// Most messages queued for one section actor; past it requests get `Overloaded`.
    pub section_inflight_max: usize,
    /// A stream writes a checkpoint after this many records, and drops the records behind it.
    pub checkpoint_every_records: u64,
    /// Most fans waiting on one event's waitlist; past it `QUEUE_FULL`.
    pub waitlist_max: usize,
    /// How long an idempotency key's first answer is replayed, and a released or expired hold
    /// remembered, after it was given or ended (see [`crate::retention`]). 1 s to 30 days;
    /// [`crate::Engine::open`] refuses anything else.
    pub idempotency_window: Duration,
    /// How long the change stream (`crate::changes`) keeps a change, by its time: a cursor
    /// older than this is expired. 24 hours by default.
    pub change_retention: Duration,
    /// The payment provider (`None`: the built-in simulated one, recording in the log's store;
    /// a log outside a store needs one set, as [`EngineConfig::with_sink`] does).
    pub payments: Option<Arc<dyn PaymentProvider>>,
    /// How the built-in simulated provider behaves (when `payments` is `None`).
    pub simulated_payments: SimulatedConfig,
    /// What recovery does with a damaged log: refuse to start (`Strict`, the default) or start
    /// from what is there (`AcceptDamage`, an operator's choice; the report says what was found).
    pub recovery_mode: RecoveryMode,
    /// A cluster node leading its group: every group commit is replicated through Raft
    /// ([`crate::raft::RaftReplicator`]) and written to `sink` by the group's state machine on
    /// each node, instead of being written here. `None`: a single node.
    pub replicate: Option<Arc<dyn Replicate>>,
    /// A cluster node's warm state for its group ([`crate::raft::StateMachine::warm`]): the
    /// engine starts from it if it is kept (and was kept with this engine's idempotency
    /// window), instead of reading `sink` again. `None`, or nothing kept: the log is read.
    pub warm: Option<Arc<crate::warm::Warm>>,
}

impl EngineConfig {
    /// Defaults: sled in `data_dir`, `Sync` durability, system clock, 4 ledger shards, 10,000
    /// messages in flight per section, a checkpoint every 100,000 records, a 24-hour
    /// idempotency window.
    pub fn new(data_dir: impl Into<PathBuf>) -> EngineConfig {
        EngineConfig {
            data_dir: data_dir.into(),
            sink: None,
            durability: Durability::Sync,
            clock: Arc::new(SystemClock),
            ledger_shards: LEDGER_SHARDS_DEFAULT,
            section_inflight_max: SECTION_INFLIGHT_MAX_DEFAULT,
            checkpoint_every_records: CHECKPOINT_EVERY_RECORDS_DEFAULT,
            waitlist_max: WAITLIST_MAX_DEFAULT,
            idempotency_window: Duration::from_millis(IDEMPOTENCY_WINDOW_MS_DEFAULT),
            change_retention: Duration::from_millis(CHANGE_RETENTION_MS_DEFAULT),
            payments: None,
            simulated_payments: SimulatedConfig::default(),
            recovery_mode: RecoveryMode::Strict,
            replicate: None,
            warm: None,
        }
    }

    /// Defaults, with the log in `sink` instead of a data dir, and the simulated payment
    /// provider recording in a store in memory that lives as long as this config (and its
    /// clones): engines opened one after another on the same sink and config share their
    /// charges, as they share their log.
    pub fn with_sink(sink: Arc<dyn LogSink>) -> Result<EngineConfig, StorageError> {
        let payments = SimulatedProvider::open(
            Arc::new(crate::store::SimKv::new()),
            SimulatedConfig::default(),
        )
        .map_err(|e| StorageError::Io(format!("payments: {e}")))?;
        Ok(EngineConfig {
            sink: Some(sink),
            payments: Some(payments),
            ..EngineConfig::new(PathBuf::new())
        })
    }

    /// The idempotency window in ms, if it is within the bounds (1 s to 30 days; else an
    /// `InvalidRequest` naming `idempotency_window`).
    pub fn idempotency_window_ms(&self) -> Result<u64, Rejection> {
        let ms = u64::try_from(self.idempotency_window.as_millis()).unwrap_or(u64::MAX);
        if !(IDEMPOTENCY_WINDOW_MS_MIN..=IDEMPOTENCY_WINDOW_MS_MAX).contains(&ms) {
            return Err(Rejection::invalid(
                "idempotency_window",
                format!(
                    "must be {} s to {} s",
                    IDEMPOTENCY_WINDOW_MS_MIN / 1000,
                    IDEMPOTENCY_WINDOW_MS_MAX / 1000
                ),
            ));
        }
        Ok(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idempotency_window_is_one_second_to_thirty_days() {
        let mut c = EngineConfig::new("unused");
        assert_eq!(c.idempotency_window_ms(), Ok(IDEMPOTENCY_WINDOW_MS_DEFAULT));
        for ok in [IDEMPOTENCY_WINDOW_MS_MIN, IDEMPOTENCY_WINDOW_MS_MAX] {
            c.idempotency_window = Duration::from_millis(ok);
            assert_eq!(c.idempotency_window_ms(), Ok(ok));
        }
        for bad in [
            Duration::ZERO,
            Duration::from_millis(IDEMPOTENCY_WINDOW_MS_MIN - 1),
            Duration::from_millis(IDEMPOTENCY_WINDOW_MS_MAX + 1),
            Duration::MAX,
        ] {
            c.idempotency_window = bad;
            let refused = c.idempotency_window_ms().unwrap_err();
            assert_eq!(refused.field(), Some("idempotency_window"), "{bad:?}");
        }
    }
}
