//! Recovery: the whole log replayed into the state the actors start from, one function per
//! stream: the catalog, each section (from its checkpoint), the ledger shards, the sold-seat
//! backstop, the waitlist. Quotas and idempotency answers are rebuilt from the sections' holds.
//! A restarted section actor is rebuilt by the same [`recover_section`].

use std::collections::HashMap;

use crate::codec;
use crate::core::{SectionCore, SectionRecord};
use crate::error::StorageError;
use crate::ledger::{Answer, LedgerRecord, Rpc, ShardState, shard_index};
use crate::store::{LogSink, names, read_stream};
use crate::types::{CatalogRecord, EventId, EventSpec, HoldId, HoldStatus, SectionId, SectionSpec};
use crate::waitlist::{WaitlistCore, WaitlistRecord};

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
    /// Torn last records dropped.
    pub torn_tails_dropped: usize,
    /// Sold-seat keys without a durable confirm (a crash between claim and record), removed.
    pub orphan_claims_removed: usize,
    /// Time recovery took, in ms.
    pub duration_ms: u64,
}

/// An event as the catalog recorded it: id, spec, creation time.
pub(crate) type CatalogEntry = (EventId, EventSpec, u64);

/// The state the actors start from.
pub(crate) struct Recovered {
    pub waitlist: WaitlistCore,
    pub waitlist_last: u64,
    pub events: Vec<CatalogEntry>,
    pub cores: HashMap<(EventId, SectionId), (SectionCore, u64)>,
    pub catalog_last: u64,
    pub ledger_states: Vec<ShardState>,
    pub ledger_last: Vec<u64>,
}

fn corrupt(stream: &str, seq: u64, reason: impl Into<String>) -> StorageError {
    StorageError::Corrupt {
        stream: stream.to_owned(),
        seq,
        reason: reason.into(),
    }
}

/// What recovery needs to know beyond the log: the ledger's shape and the idempotency window.
pub(crate) struct RecoverWith {
    /// Number of ledger shards.
    pub ledger_shards: usize,
    /// The idempotency window, ms (sections forget ended holds by it as they replay).
    pub window_ms: u64,
    /// Now, by the engine's clock: idempotency answers older than the window are not kept.
    pub now_ms: u64,
}

/// Replays the whole log (see the module docs).
pub(crate) fn recover(
    sink: &dyn LogSink,
    with: &RecoverWith,
    report: &mut RecoveryReport,
) -> Result<Recovered, StorageError> {
    let (events, catalog_last) = recover_catalog(sink, report)?;
    let shards = with.ledger_shards.max(1);
    let mut ledger_states: Vec<ShardState> = (0..shards)
        .map(|_| ShardState::new(with.window_ms))
        .collect();
    let mut cores = HashMap::new();
    for (event_id, spec, _) in &events {
        for s in &spec.sections {
            let (core, last_seq) = recover_section(sink, event_id, s, with.window_ms, report)?;
            add_section_to_ledgers(&core, event_id, &mut ledger_states);
            report.sections += 1;
            cores.insert((event_id.clone(), s.section_id.clone()), (core, last_seq));
        }
        report.events += 1;
    }
    let ledger_last = recover_ledgers(sink, &mut ledger_states, report)?;
    for state in &mut ledger_states {
        state.forget_due(with.now_ms, usize::MAX);
    }
    recover_backstop(sink, &cores, report)?;
    let (waitlist, waitlist_last) = recover_waitlist(sink, report)?;
    sink.sync()?;
    Ok(Recovered {
        waitlist,
        waitlist_last,
        events,
        cores,
        catalog_last,
        ledger_states,
        ledger_last,
    })
}

/// The catalog stream: every event created, in order.
fn recover_catalog(
    sink: &dyn LogSink,
    report: &mut RecoveryReport,
) -> Result<(Vec<CatalogEntry>, u64), StorageError> {
    let catalog = read_stream::<CatalogRecord>(sink, names::CATALOG)?;
    report.torn_tails_dropped += usize::from(catalog.dropped_tail);
    let events = catalog
        .records
        .into_iter()
        .map(|(_, r)| match r {
            CatalogRecord::EventCreated {
                spec,
                event_id,
                created_at_ms,
            } => (event_id, spec, created_at_ms),
        })
        .collect();
    Ok((events, catalog.last_seq))
}

/// One section's stream: its checkpoint (if any) and every record after it, applied to the pure
/// core; the core's invariants are checked before it is trusted. Returns the core and the last
/// sequence number of the stream. The core forgets ended holds by `window_ms` as it replays,
/// exactly as the live section did (by the records' own times).
pub(crate) fn recover_section(
    sink: &dyn LogSink,
    event_id: &EventId,
    spec: &SectionSpec,
    window_ms: u64,
    report: &mut RecoveryReport,
) -> Result<(SectionCore, u64), StorageError> {
    let name = names::section(event_id, &spec.section_id);
    let replay = read_stream::<SectionRecord>(sink, &name)?;
    report.torn_tails_dropped += usize::from(replay.dropped_tail);
    let mut core = match &replay.checkpoint {
        Some((seq, blob)) => {
            report.checkpoints_loaded += 1;
            codec::decode::<SectionCore>(blob)
                .map_err(|e| corrupt(&format!("checkpoints/{name}"), *seq, e.to_string()))?
        }
        None => SectionCore::new(event_id.clone(), spec.clone()),
    }
    .with_window_ms(window_ms);
    for (seq, record) in &replay.records {
        core.apply(record).map_err(|e| corrupt(&name, *seq, e))?;
        report.records_replayed += 1;
    }
    core.check_invariants()
        .map_err(|e| corrupt(&name, replay.last_seq, e))?;
    Ok((core, replay.last_seq))
}

/// Quotas (places held or sold per user) and success answers of idempotency keys, from a
/// section's holds.
fn add_section_to_ledgers(core: &SectionCore, event_id: &EventId, ledgers: &mut [ShardState]) {
    let shards = ledgers.len();
    for (view, hold_tag, confirm) in core.holds_for_ledger() {
        let shard = &mut ledgers[shard_index(&view.user_id, shards)];
        if matches!(view.status, HoldStatus::Held | HoldStatus::Confirmed) {
            shard.add_quota(event_id.clone(), view.user_id.clone(), view.quantity);
        }
        if let Some((tag, order)) = confirm {
            shard.add_answer(
                view.user_id.clone(),
                Rpc::Confirm,
                tag,
                order.created_at_ms,
                Ok(Answer::Order(order)),
            );
        }
        if let Some(tag) = hold_tag {
            let mut first = view.clone();
            first.status = HoldStatus::Held;
            shard.add_answer(
                view.user_id.clone(),
                Rpc::Hold,
                tag,
                view.placed_at_ms,
                Ok(Answer::Hold(first)),
            );
        }
    }
}

/// The ledger streams: recorded rejections. Every ledger stream there is is read (the shard
/// count may have changed) and each entry goes to its user's current shard. Returns the last
/// sequence number of each current shard's stream.
fn recover_ledgers(
    sink: &dyn LogSink,
    ledgers: &mut [ShardState],
    report: &mut RecoveryReport,
) -> Result<Vec<u64>, StorageError> {
    let shards = ledgers.len();
    let mut ledger_last = vec![0u64; shards];
    for name in sink.stream_names()? {
        if !name.starts_with(names::LEDGER_PREFIX) {
            continue;
        }
        let replay = read_stream::<LedgerRecord>(sink, &name)?;
        report.torn_tails_dropped += usize::from(replay.dropped_tail);
        if let Some(i) = names::ledger_shard(&name)
            && i < shards
        {
            ledger_last[i] = replay.last_seq;
        }
        let mut staging = ShardState::default();
        if let Some((seq, blob)) = &replay.checkpoint {
            report.checkpoints_loaded += 1;
            staging
                .load_checkpoint(blob)
                .map_err(|e| corrupt(&format!("checkpoints/{name}"), *seq, e.to_string()))?;
        }
        for (_, record) in replay.records {
            report.records_replayed += 1;
            staging.apply(record);
        }
        for (user_id, rpc, tag, at_ms, rejection) in staging.into_rejections() {
            ledgers[shard_index(&user_id, shards)].add_answer(
                user_id,
                rpc,
                &tag,
                at_ms,
                Err(rejection),
            );
        }
    }
    Ok(ledger_last)
}

/// The backstop: a claim without a durable confirm is an orphan of a crash between the claim
/// and the record (the confirm was never acknowledged); a confirm without its claim gets one.
fn recover_backstop(
    sink: &dyn LogSink,
    cores: &HashMap<(EventId, SectionId), (SectionCore, u64)>,
    report: &mut RecoveryReport,
) -> Result<(), StorageError> {
    let mut expected: HashMap<String, HoldId> = HashMap::new();
    for (core, _) in cores.values() {
        expected.extend(core.all_sold_keys());
    }
    for (key, value) in sink.claims()? {
        match expected.remove(&key) {
            Some(hold) if hold.as_str().as_bytes() == value.as_slice() => {}
            Some(hold) => {
                return Err(corrupt(
                    names::CLAIMS,
                    0,
                    format!("seat {key} is claimed by another hold than {hold}"),
                ));
            }
            None => {
                tracing::warn!(key = %key, "removing a sold-seat claim without a durable confirm");
                sink.remove_claim(&key)?;
                report.orphan_claims_removed += 1;
            }
        }
    }
    for (key, hold) in expected {
        sink.claim(&key, hold.as_str().as_bytes())?;
    }
    Ok(())
}

/// The waitlist stream. Returns the core and the stream's last sequence number.
pub(crate) fn recover_waitlist(
    sink: &dyn LogSink,
    report: &mut RecoveryReport,
) -> Result<(WaitlistCore, u64), StorageError> {
    let replay = read_stream::<WaitlistRecord>(sink, names::WAITLIST)?;
    report.torn_tails_dropped += usize::from(replay.dropped_tail);
    let mut waitlist = match &replay.checkpoint {
        Some((seq, blob)) => {
            report.checkpoints_loaded += 1;
            codec::decode::<WaitlistCore>(blob)
                .map_err(|e| corrupt("checkpoints/waitlist", *seq, e.to_string()))?
        }
        None => WaitlistCore::default(),
    };
    for (seq, record) in &replay.records {
        waitlist
            .apply(record)
            .map_err(|e| corrupt(names::WAITLIST, *seq, e))?;
        report.records_replayed += 1;
    }
    Ok((waitlist, replay.last_seq))
}
