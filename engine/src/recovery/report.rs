//! What recovery reports ([`RecoveryReport`]), the repairs it plans, and how it is asked to
//! run ([`RecoverWith`]): the data below recovery's steps.

use crate::error::StorageError;
use crate::integrity::{Findings, RecoveryMode};
use crate::types::HoldId;

/// What recovery found, for logs and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Events in the catalog.
    pub events: usize,
    /// Sections rebuilt.
    pub sections: usize,
    /// Log records replayed (after checkpoints).
    pub records_replayed: u64,
    /// Streams that started from a checkpoint.
    pub checkpoints_loaded: usize,
    /// Torn last records dropped (past their stream's acknowledged mark).
    pub torn_tails_dropped: usize,
    /// Sold-seat claims without a confirm in a whole log (a crash between the claim and its
    /// record: never acknowledged), moved to the set-aside table.
    pub claims_set_aside: usize,
    /// Confirms whose sold-seat claim was missing (the record was written, the claim was not):
    /// claimed again.
    pub claims_restored: usize,
    /// The integrity check: damage (accepted, if the engine started), actions, every stream.
    pub integrity: Findings,
    /// Time recovery took, in ms.
    pub duration_ms: u64,
    /// A cluster node's warm start: the state its follower kept ([`crate::warm`]), not read
    /// from the log again.
    pub warm: bool,
}

impl RecoveryReport {
    /// Adds the counts of a part of recovery run beside this one.
    pub(super) fn absorb(&mut self, part: &RecoveryReport) {
        self.events += part.events;
        self.sections += part.sections;
        self.records_replayed += part.records_replayed;
        self.checkpoints_loaded += part.checkpoints_loaded;
        self.torn_tails_dropped += part.torn_tails_dropped;
        self.claims_set_aside += part.claims_set_aside;
        self.claims_restored += part.claims_restored;
    }
}

/// A change recovery makes once it knows it may (no damage, or damage accepted; never in
/// `Verify`).
#[derive(Debug)]
pub(super) enum Repair {
    DropTorn {
        stream: String,
        seq: u64,
    },
    Append {
        stream: String,
        seq: u64,
        bytes: Vec<u8>,
    },
    SetAside {
        key: String,
    },
    Restore {
        key: String,
        hold: HoldId,
    },
    Checkpoint {
        stream: String,
        blob: Vec<u8>,
    },
}

impl Repair {
    /// What the repair would change, in a few words.
    pub(super) fn describe(&self) -> String {
        match self {
            Repair::DropTorn { stream, seq } => format!("drop torn record {stream}#{seq}"),
            Repair::Append { stream, seq, .. } => format!("append {stream}#{seq}"),
            Repair::SetAside { key } => format!("set claim {key} aside"),
            Repair::Restore { key, .. } => format!("restore claim {key}"),
            Repair::Checkpoint { stream, .. } => format!("rewrite the checkpoint of {stream}"),
        }
    }
}

/// What recovery needs to know beyond the log.
pub(crate) struct RecoverWith {
    /// Number of ledger shards.
    pub ledger_shards: usize,
    /// The idempotency window, ms (sections forget ended holds by it as they replay).
    pub window_ms: u64,
    /// Now, by the engine's clock: idempotency answers older than the window are not kept, and
    /// places withdrawn for accepted damage are recorded at this time.
    pub now_ms: u64,
    /// What to do with damage.
    pub mode: RecoveryMode,
    /// A cluster node's copy of its group's log: recovery changes nothing in it (a repair made
    /// here alone would make this copy differ from the others'); damage that needs one refuses
    /// the start.
    pub replicated: bool,
}

pub(super) fn corrupt(stream: &str, seq: u64, reason: impl Into<String>) -> StorageError {
    StorageError::Corrupt {
        stream: stream.to_owned(),
        seq,
        reason: reason.into(),
    }
}
