//! Recovery: the whole log replayed into the state the actors start from, one function per
//! stream: the catalog, each section (from its checkpoint), the ledger shards, the sold-seat
//! backstop, the waitlist. Quotas and idempotency answers are rebuilt from the sections' holds.
//! A restarted section actor is rebuilt by the same [`recover_section`].
//!
//! Every stream is checked as it is read ([`crate::integrity`]): against the superblock's
//! high-water marks, for gaps, checksums and records that do not fit. Nothing is changed until
//! everything has been read: then, with no damage (or with damage an operator accepted), the
//! planned repairs run (a torn tail dropped, an unacknowledged claim set aside, a missing claim
//! restored) and the superblock is rewritten with what the log now holds.

use crate::hash::HashMap;
use std::collections::{BTreeMap, BTreeSet};

use crate::codec;
use crate::core::{SectionCore, SectionRecord};
use crate::error::StorageError;
use crate::integrity::{Damage, Findings, RecoveryMode, read_stream};
use crate::ledger::{Answer, LedgerRecord, Rpc, ShardState, shard_index};
use crate::store::{LogSink, Marks, names};
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
    /// Each event's waiting-room line, with its stream's last sequence number.
    pub rooms: HashMap<EventId, (crate::rooms::RoomLine, u64)>,
    /// What the log holds now: the flusher starts from these marks.
    pub marks: Marks,
}

/// A change recovery makes once it knows it may (no damage, or damage accepted; never in
/// `Verify`).
#[derive(Debug)]
enum Repair {
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

/// Recovery's working state: what it found, what it will repair, how strict it is.
pub(crate) struct Check {
    pub marks: Marks,
    pub mode: RecoveryMode,
    pub found: Findings,
    repairs: Vec<Repair>,
    /// Claims (key, holder) of sales whose records may be lost: withdrawn if damage is accepted.
    orphans: Vec<(String, String)>,
    /// Claim keys accepted now (mismatches, orphans that could not be withdrawn).
    accepted_claims: Vec<String>,
    /// Whether `marks` come from a valid superblock and the sink's records can be torn at
    /// all (else no tail may count as torn: [`LogSink::atomic_records`]).
    trusted: bool,
    /// The streams the log has, listed once at the first read.
    stored: Option<BTreeSet<String>>,
}

impl Check {
    /// A check of `sink` against `marks` (a section restart passes the store's current marks).
    pub fn new(sink: &dyn LogSink, marks: Marks, mode: RecoveryMode) -> Check {
        Check {
            marks,
            mode,
            found: Findings::default(),
            repairs: Vec::new(),
            orphans: Vec::new(),
            accepted_claims: Vec::new(),
            trusted: !sink.atomic_records(),
            stored: None,
        }
    }

    /// Reads a stream, planning the removal of a torn tail.
    fn read<T: serde::de::DeserializeOwned>(
        &mut self,
        sink: &dyn LogSink,
        name: &str,
        report: &mut RecoveryReport,
    ) -> Result<crate::integrity::Replay<T>, StorageError> {
        self.read_with(sink, name, report, codec::decode::<T>)
    }

    /// [`Check::read`] with the records' decoder given.
    fn read_with<T>(
        &mut self,
        sink: &dyn LogSink,
        name: &str,
        report: &mut RecoveryReport,
        decode: impl Fn(&[u8]) -> Result<T, codec::DecodeError>,
    ) -> Result<crate::integrity::Replay<T>, StorageError> {
        if self.stored.is_none() {
            self.stored = Some(sink.stream_names()?.into_iter().collect());
        }
        let stored = self.stored.as_ref().is_some_and(|s| s.contains(name));
        let replay = read_stream(
            sink,
            name,
            stored,
            &self.marks,
            self.trusted,
            &mut self.found,
            decode,
        )?;
        if replay.dropped_tail {
            report.torn_tails_dropped += 1;
            self.repairs.push(Repair::DropTorn {
                stream: name.to_owned(),
                seq: replay.last_seq + 1,
            });
        }
        Ok(replay)
    }

    /// A record that does not fit: damage (unless accepted before), and the record is skipped.
    fn misfit(&mut self, stream: &str, seq: u64, reason: String) {
        let d = Damage::Replay {
            stream: stream.to_owned(),
            seq,
            reason,
        };
        self.found.damage_at(&self.marks, stream, seq, seq, d);
    }

    /// Refuses (strict) if anything was damaged.
    pub fn refuse_if_damaged(&self) -> Result<(), StorageError> {
        if self.found.damage.is_empty() || self.mode != RecoveryMode::Strict {
            return Ok(());
        }
        Err(StorageError::Damaged {
            count: self.found.damage.len(),
            summary: self.found.summary(),
            evidence: None,
        })
    }
}

/// Reads the superblock; its absence where a log exists (or both copies damaged) is damage.
/// Returns the marks and whether they come from a valid superblock.
fn read_marks(sink: &dyn LogSink, found: &mut Findings) -> Result<(Marks, bool), StorageError> {
    let read = sink.superblock()?;
    if let Some(marks) = read.marks {
        for copy in read.damaged_copies {
            found.notes.push(format!(
                "superblock copy {copy} (the other copy is valid: a write torn by a crash)"
            ));
        }
        return Ok((marks, true));
    }
    if holds_data(sink)? {
        found.damage.push(if read.damaged_copies.is_empty() {
            Damage::SuperblockMissing
        } else {
            Damage::SuperblockDamaged {
                copies: read.damaged_copies,
            }
        });
    } else if !read.damaged_copies.is_empty() {
        found.notes.push(format!(
            "superblock copies damaged before any record was written: {}",
            read.damaged_copies.join("; ")
        ));
        // Nothing was ever acknowledged: a torn first record may be dropped.
        return Ok((Marks::default(), true));
    }
    Ok((
        Marks::default(),
        !found.damage.iter().any(is_superblock_damage),
    ))
}

fn is_superblock_damage(d: &Damage) -> bool {
    matches!(
        d,
        Damage::SuperblockMissing | Damage::SuperblockDamaged { .. }
    )
}

/// A log written by a boxoffice from before the superblock and log format 2 is not read (the
/// record shapes changed with it): refused with a clear message, before anything is touched.
fn refuse_older_format(sink: &dyn LogSink) -> Result<(), StorageError> {
    if !sink.stream_names()?.iter().any(|n| n == names::CATALOG) {
        return Ok(());
    }
    let first = sink.stream(names::CATALOG)?.read_after(0)?;
    if let Some((_, bytes)) = first.first()
        && bytes.first().is_some_and(|v| *v < codec::CODEC_VERSION)
    {
        return Err(StorageError::Open {
            path: String::new(),
            reason: format!(
                "the log was written by an older boxoffice (log format {}; this version reads \
                 format {} only, with no migration): start from a new data dir",
                bytes[0],
                codec::CODEC_VERSION
            ),
        });
    }
    Ok(())
}

/// Whether the log holds any record, checkpoint or claim (empty trees do not count: reading a
/// stream creates it).
fn holds_data(sink: &dyn LogSink) -> Result<bool, StorageError> {
    if !sink.claims()?.is_empty() {
        return Ok(true);
    }
    for name in sink.stream_names()? {
        if sink.checkpoint(&name)?.is_some() || !sink.stream(&name)?.read_after(0)?.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
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

impl Repair {
    /// What the repair would change, in a few words.
    fn describe(&self) -> String {
        match self {
            Repair::DropTorn { stream, seq } => format!("drop torn record {stream}#{seq}"),
            Repair::Append { stream, seq, .. } => format!("append {stream}#{seq}"),
            Repair::SetAside { key } => format!("set claim {key} aside"),
            Repair::Restore { key, .. } => format!("restore claim {key}"),
            Repair::Checkpoint { stream, .. } => format!("rewrite the checkpoint of {stream}"),
        }
    }
}

/// The streams as replayed, before the ledger shards are settled: what a start reads from the
/// log, and what a warm follower keeps by applying each committed batch to the same pure cores
/// ([`crate::warm`]). [`settle`] turns either into the state the actors start from.
#[derive(Default)]
pub(crate) struct Replayed {
    pub events: Vec<CatalogEntry>,
    pub catalog_last: u64,
    pub cores: HashMap<(EventId, SectionId), (SectionCore, u64)>,
    /// Each ledger stream's recorded rejections (staged: they go to their users' current
    /// shards when settled), with the stream's last sequence number.
    pub ledgers: BTreeMap<String, (ShardState, u64)>,
    pub waitlist: WaitlistCore,
    pub waitlist_last: u64,
    pub rooms: HashMap<EventId, (crate::rooms::RoomLine, u64)>,
}

/// Reads every stream of the log into its pure core, checking each as it is read, then the
/// sold-seat backstop against the sections: nothing is changed (the repairs are planned in
/// `check`).
fn replay(
    sink: &dyn LogSink,
    window_ms: u64,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<Replayed, StorageError> {
    let (events, catalog_last) = recover_catalog(sink, check, report)?;
    let mut cores = HashMap::default();
    for (event_id, spec, _) in &events {
        for s in &spec.sections {
            let (core, last_seq) = recover_section(sink, event_id, s, window_ms, check, report)?;
            report.sections += 1;
            cores.insert((event_id.clone(), s.section_id.clone()), (core, last_seq));
        }
        report.events += 1;
    }
    let ledgers = recover_ledgers(sink, check, report)?;
    let (waitlist, waitlist_last) = recover_waitlist(sink, check, report)?;
    let mut rooms = HashMap::default();
    for (event_id, _, _) in &events {
        if let Some(room) = recover_room(sink, event_id, check, report)? {
            rooms.insert(event_id.clone(), room);
        }
    }
    check_unread_streams(sink, check, report)?;
    recover_backstop(sink, &cores, check, report)?;
    Ok(Replayed {
        events,
        catalog_last,
        cores,
        ledgers,
        waitlist,
        waitlist_last,
        rooms,
    })
}

/// Replays the whole log (see the module docs).
pub(crate) fn recover(
    sink: &dyn LogSink,
    with: &RecoverWith,
    report: &mut RecoveryReport,
) -> Result<Recovered, StorageError> {
    refuse_older_format(sink)?;
    let mut found = Findings::default();
    let (marks, trusted) = read_marks(sink, &mut found)?;
    let mut check = Check::new(sink, marks, with.mode);
    check.found = found;
    check.trusted &= trusted;
    let mut replayed = replay(sink, with.window_ms, &mut check, report)?;
    check.refuse_if_damaged()?;
    if with.mode == RecoveryMode::AcceptDamage {
        withdraw_orphans(&mut replayed.cores, &mut check, with.now_ms)?;
    }
    if with.replicated && !check.repairs.is_empty() {
        return Err(StorageError::Damaged {
            count: check.repairs.len(),
            summary: format!(
                "this node's copy of its group's log needs {} repairs (first: {}); a node \
                 does not repair its copy alone: wipe its data dir and let it catch up from the \
                 group",
                check.repairs.len(),
                check.repairs[0].describe()
            ),
            evidence: None,
        });
    }
    let marks = finish(sink, &mut check)?;
    report.integrity = check.found;
    Ok(settle(replayed, with, marks))
}

/// A cluster node's copy of its group's log replayed for a warm start ([`crate::warm`]): read
/// and checked as a start reads it, changing nothing. Any damage, or any repair the copy would
/// need, refuses (the engine's own start then finds and reports it).
pub(crate) fn replay_for_warmth(
    sink: &dyn LogSink,
    window_ms: u64,
) -> Result<Replayed, StorageError> {
    refuse_older_format(sink)?;
    let mut found = Findings::default();
    let (marks, trusted) = read_marks(sink, &mut found)?;
    let mut check = Check::new(sink, marks, RecoveryMode::Verify);
    check.found = found;
    check.trusted &= trusted;
    let report = &mut RecoveryReport::default();
    let replayed = replay(sink, window_ms, &mut check, report)?;
    if !check.found.damage.is_empty() || !check.repairs.is_empty() {
        return Err(StorageError::Damaged {
            count: check.found.damage.len() + check.repairs.len(),
            summary: format!(
                "the copy needs repairs or holds damage (first: {})",
                check
                    .found
                    .damage
                    .first()
                    .map(|d| d.to_string())
                    .or_else(|| check.repairs.first().map(|r| r.describe()))
                    .unwrap_or_default()
            ),
            evidence: None,
        });
    }
    Ok(replayed)
}

/// The state a warm follower kept, made the engine's start ([`crate::warm`]): nothing is read
/// but the superblock and the claims' count; the superblock is raised to what the copy holds
/// once that is synced (a follower's applies are not synced one by one).
pub(crate) fn recover_warm(
    sink: &dyn LogSink,
    replayed: Replayed,
    with: &RecoverWith,
    report: &mut RecoveryReport,
) -> Result<Recovered, StorageError> {
    let mut found = Findings::default();
    let (mut marks, _) = read_marks(sink, &mut found)?;
    if !found.damage.is_empty() {
        return Err(StorageError::Io(
            "the superblock is damaged: a warm start needs it".into(),
        ));
    }
    marks.raise(names::CATALOG, replayed.catalog_last);
    marks.raise(names::WAITLIST, replayed.waitlist_last);
    for ((event_id, section_id), (_, last)) in &replayed.cores {
        marks.raise(&names::section(event_id, section_id), *last);
    }
    for (name, (_, last)) in &replayed.ledgers {
        marks.raise(name, *last);
    }
    for (event_id, (_, last)) in &replayed.rooms {
        marks.raise(&names::room(event_id), *last);
    }
    marks.claims = sink.claims()?.len() as u64;
    sink.sync()?;
    sink.put_superblock(&marks)?;
    report.events = replayed.events.len();
    report.sections = replayed.cores.len();
    report.warm = true;
    found.notes.push(
        "warm start: the state was kept by applying each committed batch as it was applied to \
         this node's copy (the copy was checked when this node warmed up)"
            .into(),
    );
    report.integrity = found;
    Ok(settle(replayed, with, marks))
}

/// The ledger shards settled from the replayed streams: each recorded rejection goes to its
/// user's current shard (the shard count may have changed), then the quotas and success
/// answers of the sections' holds; answers past the window are forgotten.
pub(crate) fn settle(replayed: Replayed, with: &RecoverWith, marks: Marks) -> Recovered {
    let shards = with.ledger_shards.max(1);
    let mut ledger_states: Vec<ShardState> = (0..shards)
        .map(|_| ShardState::new(with.window_ms))
        .collect();
    let mut ledger_last = vec![0u64; shards];
    for (name, (staging, last)) in replayed.ledgers {
        if let Some(i) = names::ledger_shard(&name)
            && i < shards
        {
            ledger_last[i] = last;
        }
        for (user_id, rpc, tag, at_ms, rejection) in staging.into_rejections() {
            ledger_states[shard_index(&user_id, shards)].add_answer(
                user_id,
                rpc,
                &tag,
                at_ms,
                Err(rejection),
            );
        }
    }
    for ((event_id, _), (core, _)) in &replayed.cores {
        add_section_to_ledgers(core, event_id, &mut ledger_states);
    }
    for state in &mut ledger_states {
        state.forget_due(with.now_ms, usize::MAX);
    }
    Recovered {
        waitlist: replayed.waitlist,
        waitlist_last: replayed.waitlist_last,
        events: replayed.events,
        cores: replayed.cores,
        catalog_last: replayed.catalog_last,
        ledger_states,
        ledger_last,
        rooms: replayed.rooms,
        marks,
    }
}

/// Checks a log without changing it (offline `check-log`): everything recovery would find.
/// Errors only if the log cannot be read at all.
pub fn verify_log(sink: &dyn LogSink) -> Result<Findings, StorageError> {
    let mut report = RecoveryReport::default();
    let with = RecoverWith {
        ledger_shards: crate::limits::LEDGER_SHARDS_DEFAULT,
        window_ms: crate::limits::IDEMPOTENCY_WINDOW_MS_DEFAULT,
        now_ms: 0,
        mode: RecoveryMode::Verify,
        replicated: false,
    };
    recover(sink, &with, &mut report)?;
    Ok(report.integrity)
}

/// Streams nobody read (the superblock knows them, or sled has them, but no event or shard
/// does: an event the catalog lost, say): checked for what was acknowledged in them.
fn check_unread_streams(
    sink: &dyn LogSink,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<(), StorageError> {
    let read: BTreeSet<String> = check
        .found
        .streams
        .iter()
        .map(|s| s.stream.clone())
        .collect();
    let mut unread: BTreeSet<String> = check.marks.streams.keys().cloned().collect();
    unread.extend(sink.stream_names()?);
    for name in unread.difference(&read) {
        // Only the frames (version, checksum) of a stream nobody reads can be checked.
        let replay = check.read_with(sink, name, report, |b| codec::verify(b).map(|_| ()))?;
        if !replay.records.is_empty() || replay.checkpoint.is_some() {
            check.found.notes.push(format!(
                "stream `{name}` is in the log but no event or shard reads it"
            ));
        }
    }
    Ok(())
}

/// Applies the planned repairs (if allowed), makes them durable, and writes the superblock with
/// what the log now holds (accepted damage remembered). Nothing is written in `Verify`.
fn finish(sink: &dyn LogSink, check: &mut Check) -> Result<Marks, StorageError> {
    let mut marks = Marks {
        streams: check
            .found
            .streams
            .iter()
            .map(|s| (s.stream.clone(), s.last))
            .collect(),
        claims: 0,
        accepted: check.marks.accepted.clone(),
        accepted_claims: check.marks.accepted_claims.clone(),
        accepted_checkpoints: check.marks.accepted_checkpoints.clone(),
    };
    marks
        .accepted_claims
        .extend(check.accepted_claims.iter().cloned());
    for d in &check.found.damage {
        match d {
            Damage::Gap { stream, from, to } | Damage::Missing { stream, from, to } => {
                marks.accept(stream, *from, *to);
                // The stream goes on past the lost records: its mark stays.
                marks.raise(stream, *to);
            }
            Damage::Checkpoint { .. } => {
                marks
                    .accepted_checkpoints
                    .insert(crate::integrity::checkpoint_key(d));
            }
            Damage::Record { stream, seq, .. } | Damage::Replay { stream, seq, .. } => {
                marks.accept(stream, *seq, *seq)
            }
            _ => {}
        }
    }
    if check.mode == RecoveryMode::Verify {
        return Ok(marks);
    }
    if !check.found.damage.is_empty() {
        check.found.actions.push(format!(
            "started with {} damaged or missing parts accepted by the operator; the superblock \
             now records what the log holds",
            check.found.damage.len()
        ));
    }
    for repair in std::mem::take(&mut check.repairs) {
        match repair {
            Repair::DropTorn { stream, seq } => sink.stream(&stream)?.remove(seq)?,
            Repair::Append { stream, seq, bytes } => sink.stream(&stream)?.append(seq, &bytes)?,
            Repair::SetAside { key } => sink.set_claim_aside(&key)?,
            Repair::Restore { key, hold } => {
                sink.claim(&key, hold.as_str().as_bytes())?;
            }
            Repair::Checkpoint { stream, blob } => sink.put_checkpoint(&stream, &blob)?,
        }
    }
    marks.claims = sink.claims()?.len() as u64;
    sink.sync()?;
    sink.put_superblock(&marks)?;
    Ok(marks)
}

/// The catalog stream: every event created, in order.
fn recover_catalog(
    sink: &dyn LogSink,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<(Vec<CatalogEntry>, u64), StorageError> {
    let catalog = check.read::<CatalogRecord>(sink, names::CATALOG, report)?;
    let events = catalog
        .records
        .into_iter()
        .map(|(_, r)| r.into_event())
        .collect();
    Ok((events, catalog.last_seq))
}

/// One section's stream: its checkpoint (if any) and every record after it, applied to the pure
/// core; the core's invariants are checked before it is trusted. Returns the core and the last
/// sequence number of the stream. A record that does not fit is damage and is skipped. The core
/// forgets ended holds by `window_ms` as it replays, exactly as the live section did (by the
/// records' own times).
pub(crate) fn recover_section(
    sink: &dyn LogSink,
    event_id: &EventId,
    spec: &SectionSpec,
    window_ms: u64,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<(SectionCore, u64), StorageError> {
    let name = names::section(event_id, &spec.section_id);
    let replay = check.read::<SectionRecord>(sink, &name, report)?;
    let fresh = || SectionCore::new(event_id.clone(), spec.clone());
    let mut rewrite_checkpoint = false;
    let mut core = match &replay.checkpoint {
        Some((_, blob)) => {
            report.checkpoints_loaded += 1;
            codec::decode::<SectionCore>(blob).unwrap_or_else(|e| {
                check
                    .found
                    .checkpoint_damage(&check.marks, &name, blob, e.to_string());
                rewrite_checkpoint = true;
                fresh()
            })
        }
        None => fresh(),
    }
    .with_window_ms(window_ms);
    for (seq, record) in &replay.records {
        match core.apply(record) {
            Ok(()) => report.records_replayed += 1,
            Err(e) => check.misfit(&name, *seq, e),
        }
    }
    core.check_invariants()
        .map_err(|e| corrupt(&name, replay.last_seq, e))?;
    if rewrite_checkpoint {
        // Accepted: the state as recovered replaces the damaged checkpoint.
        check.repairs.push(Repair::Checkpoint {
            stream: name.clone(),
            blob: codec::encode(&(replay.last_seq, codec::encode(&core))),
        });
    }
    Ok((core, replay.last_seq))
}

fn corrupt(stream: &str, seq: u64, reason: impl Into<String>) -> StorageError {
    StorageError::Corrupt {
        stream: stream.to_owned(),
        seq,
        reason: reason.into(),
    }
}

/// Rebuilds one section for a restarted actor, against the store's current marks; any damage
/// is an error (the actor is not restarted).
pub(crate) fn restart_section(
    sink: &dyn LogSink,
    event_id: &EventId,
    spec: &SectionSpec,
    window_ms: u64,
    marks: Marks,
) -> Result<(SectionCore, u64), StorageError> {
    let mut check = Check::new(sink, marks, RecoveryMode::Strict);
    let report = &mut RecoveryReport::default();
    let rebuilt = recover_section(sink, event_id, spec, window_ms, &mut check, report)?;
    check.refuse_if_damaged()?;
    Ok(rebuilt)
}

/// Rebuilds the waitlist for a restarted actor (see [`restart_section`]).
pub(crate) fn restart_waitlist(
    sink: &dyn LogSink,
    marks: Marks,
) -> Result<(WaitlistCore, u64), StorageError> {
    let mut check = Check::new(sink, marks, RecoveryMode::Strict);
    let rebuilt = recover_waitlist(sink, &mut check, &mut RecoveryReport::default())?;
    check.refuse_if_damaged()?;
    Ok(rebuilt)
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
/// count may have changed), each staged apart with its last sequence number ([`settle`] sends
/// each entry to its user's current shard).
fn recover_ledgers(
    sink: &dyn LogSink,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<BTreeMap<String, (ShardState, u64)>, StorageError> {
    let mut streams: BTreeSet<String> = sink
        .stream_names()?
        .into_iter()
        .filter(|n| n.starts_with(names::LEDGER_PREFIX))
        .collect();
    // A shard stream the superblock knows must be read even if the log lost it entirely.
    streams.extend(
        check
            .marks
            .streams
            .keys()
            .filter(|n| n.starts_with(names::LEDGER_PREFIX))
            .cloned(),
    );
    let mut staged = BTreeMap::new();
    for name in streams {
        let replay = check.read::<LedgerRecord>(sink, &name, report)?;
        let mut staging = ShardState::default();
        if let Some((_, blob)) = &replay.checkpoint {
            report.checkpoints_loaded += 1;
            if let Err(e) = staging.load_checkpoint(blob) {
                check
                    .found
                    .checkpoint_damage(&check.marks, &name, blob, e.to_string());
            }
        }
        for (_, record) in replay.records {
            report.records_replayed += 1;
            staging.apply(record);
        }
        staged.insert(name, (staging, replay.last_seq));
    }
    Ok(staged)
}

/// The backstop, checked against the orders: a claim naming another hold than the order is
/// damage; a claim without a confirm is set aside if every stream is whole (the superblock proves
/// the confirm was never acknowledged) and damage otherwise (its sale's record may be lost);
/// fewer claims than the superblock counted is damage; a confirm without its claim gets it back.
fn recover_backstop(
    sink: &dyn LogSink,
    cores: &HashMap<(EventId, SectionId), (SectionCore, u64)>,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<(), StorageError> {
    let whole = check.found.damage.is_empty();
    let mut expected: HashMap<String, HoldId> = HashMap::default();
    for (core, _) in cores.values() {
        expected.extend(core.all_sold_keys());
    }
    let claims = sink.claims()?;
    check.found.claims = claims.len() as u64;
    check.found.claims_set_aside = sink.claims_set_aside()?.len() as u64;
    if (claims.len() as u64) < check.marks.claims {
        check.found.damage.push(Damage::ClaimsMissing {
            expected: check.marks.claims,
            found: claims.len() as u64,
        });
    }
    for (key, value) in claims {
        let holder = String::from_utf8_lossy(&value).into_owned();
        match expected.remove(&key) {
            Some(hold) if hold.as_str() == holder => {}
            Some(hold) if check.marks.accepted_claims.contains(&key) => {
                check.found.notes.push(format!(
                    "accepted earlier: seat {key} is claimed by {holder} but sold to {hold}"
                ));
            }
            Some(hold) => {
                check.accepted_claims.push(key.clone());
                check.found.damage.push(Damage::ClaimMismatch {
                    key,
                    claimed_by: holder,
                    sold_to: hold.to_string(),
                });
            }
            None if check.marks.accepted_claims.contains(&key) => {
                check.found.notes.push(format!(
                    "accepted earlier: seat {key} is claimed by {holder} with no sale in the log \
                     (kept)"
                ));
            }
            None if whole => {
                tracing::warn!(key = %key, "setting aside a sold-seat claim never acknowledged");
                check.found.actions.push(format!(
                    "table `sold`: set aside the claim of seat {key} by {holder} (its confirm was \
                     never acknowledged: every stream is whole)"
                ));
                report.claims_set_aside += 1;
                check.repairs.push(Repair::SetAside { key });
            }
            None => {
                check.orphans.push((key.clone(), holder.clone()));
                check
                    .found
                    .damage
                    .push(Damage::OrphanClaim { key, hold: holder });
            }
        }
    }
    for (key, hold) in expected {
        check.found.actions.push(format!(
            "table `sold`: claimed seat {key} for {hold} again (its confirm is in the log)"
        ));
        report.claims_restored += 1;
        check.repairs.push(Repair::Restore { key, hold });
    }
    Ok(())
}

/// Accepted damage: the places of sales whose records are lost leave the sale (a live hold on
/// such a seat is released first), recorded in their sections' logs; their claims stay. In a
/// section whose records may be lost (its stream damaged, or claims missing anywhere), every live
/// hold may have been paid for in the lost records: its places leave the sale too, claimed for
/// it. A claim no section can withdraw is kept and remembered as accepted.
fn withdraw_orphans(
    cores: &mut HashMap<(EventId, SectionId), (SectionCore, u64)>,
    check: &mut Check,
    now_ms: u64,
) -> Result<(), StorageError> {
    let mut left: BTreeSet<String> = check.orphans.iter().map(|(k, _)| k.clone()).collect();
    let orphans = std::mem::take(&mut check.orphans);
    let claims_lost = check
        .found
        .damage
        .iter()
        .any(|d| matches!(d, Damage::ClaimsMissing { .. }));
    let damaged: BTreeSet<String> = check
        .found
        .damage
        .iter()
        .filter_map(Damage::stream)
        .map(str::to_owned)
        .collect();
    for ((event_id, section_id), (core, last_seq)) in cores.iter_mut() {
        let prefix = format!("{event_id}/{section_id}/");
        let name = names::section(event_id, section_id);
        let mine: Vec<(String, String)> = orphans
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .cloned()
            .collect();
        if !mine.is_empty() {
            let records = core.plan_withdrawal(&mine, now_ms).0;
            append_withdrawal(core, last_seq, &name, records, check, &mut left)?;
        }
        if claims_lost || damaged.contains(&name) {
            let records = core.plan_withdraw_live(now_ms);
            append_withdrawal(core, last_seq, &name, records, check, &mut left)?;
        }
    }
    for key in left {
        check.found.actions.push(format!(
            "table `sold`: kept the claim of seat {key}: no section could withdraw it"
        ));
        check.accepted_claims.push(key);
    }
    Ok(())
}

/// Applies withdrawal records to a recovered section, plans their append after `last_seq`, and
/// says what was done. A withdrawn place with no surviving claim (a live hold's) is claimed.
fn append_withdrawal(
    core: &mut SectionCore,
    last_seq: &mut u64,
    name: &str,
    records: Vec<SectionRecord>,
    check: &mut Check,
    orphans_left: &mut BTreeSet<String>,
) -> Result<(), StorageError> {
    for record in records {
        core.apply(&record)
            .map_err(|e| corrupt(name, *last_seq + 1, e))?;
        *last_seq += 1;
        match &record {
            SectionRecord::HoldReleased { hold_id, .. } => check.found.actions.push(format!(
                "stream `{name}`: released hold {hold_id} to take its places out of sale"
            )),
            SectionRecord::PlacesWithdrawn { places, .. } => {
                for w in places {
                    if orphans_left.remove(&w.key) {
                        check.found.actions.push(format!(
                            "stream `{name}`: withdrew seat {} from sale (claimed by {}, whose \
                             sale record is lost: its fan may hold a ticket)",
                            w.key, w.holder
                        ));
                    } else {
                        check.found.actions.push(format!(
                            "stream `{name}`: withdrew seat {} of live hold {} from sale (records \
                             were lost: it may have been paid for)",
                            w.key, w.holder
                        ));
                        check.repairs.push(Repair::Restore {
                            key: w.key.clone(),
                            hold: HoldId::from(w.holder.as_str()),
                        });
                    }
                }
            }
            _ => {}
        }
        check.repairs.push(Repair::Append {
            stream: name.to_owned(),
            seq: *last_seq,
            bytes: codec::encode(&record),
        });
    }
    if let Some(s) = check.found.streams.iter_mut().find(|s| s.stream == name) {
        s.last = *last_seq;
    }
    Ok(())
}

/// An event's waiting-room stream, if it has one: the line and the stream's last sequence
/// number.
fn recover_room(
    sink: &dyn LogSink,
    event_id: &EventId,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<Option<(crate::rooms::RoomLine, u64)>, StorageError> {
    let name = names::room(event_id);
    if !sink.stream_names()?.contains(&name) {
        return Ok(None);
    }
    let replay = check.read::<crate::rooms::RoomRecord>(sink, &name, report)?;
    let mut line = match &replay.checkpoint {
        Some((_, blob)) => {
            report.checkpoints_loaded += 1;
            codec::decode::<crate::rooms::RoomLine>(blob).unwrap_or_else(|e| {
                check
                    .found
                    .checkpoint_damage(&check.marks, &name, blob, e.to_string());
                crate::rooms::RoomLine::default()
            })
        }
        None => crate::rooms::RoomLine::default(),
    };
    for (seq, record) in &replay.records {
        match line.apply(record) {
            Ok(()) => report.records_replayed += 1,
            Err(e) => check.misfit(&name, *seq, e),
        }
    }
    Ok(Some((line, replay.last_seq)))
}

/// The waitlist stream. Returns the core and the stream's last sequence number.
pub(crate) fn recover_waitlist(
    sink: &dyn LogSink,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<(WaitlistCore, u64), StorageError> {
    let replay = check.read::<WaitlistRecord>(sink, names::WAITLIST, report)?;
    let mut waitlist = match &replay.checkpoint {
        Some((_, blob)) => {
            report.checkpoints_loaded += 1;
            codec::decode::<WaitlistCore>(blob).unwrap_or_else(|e| {
                check
                    .found
                    .checkpoint_damage(&check.marks, names::WAITLIST, blob, e.to_string());
                WaitlistCore::default()
            })
        }
        None => WaitlistCore::default(),
    };
    for (seq, record) in &replay.records {
        match waitlist.apply(record) {
            Ok(()) => report.records_replayed += 1,
            Err(e) => check.misfit(names::WAITLIST, *seq, e),
        }
    }
    Ok((waitlist, replay.last_seq))
}
