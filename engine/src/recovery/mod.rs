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

mod backstop;
mod check;
mod parallel;
mod report;

use crate::hash::HashMap;
use backstop::{recover_backstop, withdraw_orphans};
use check::{
    Check, check_changes, check_unread_streams, has_changes, read_marks, refuse_older_format,
};
use parallel::{beside, in_parallel, run_parts};
pub(crate) use report::RecoverWith;
pub use report::RecoveryReport;
use report::{Repair, corrupt};
use std::collections::{BTreeMap, BTreeSet};

use crate::codec;
use crate::core::{SectionCore, SectionRecord};
use crate::error::StorageError;
use crate::integrity::{Damage, Findings, RecoveryMode};
use crate::ledger::{Answer, LedgerRecord, Rpc, Settled, ShardState, shard_index};
use crate::store::{LogSink, Marks, names};
use crate::types::{CatalogRecord, EventId, HoldStatus, SectionId, SectionSpec};
use crate::waitlist::{WaitlistCore, WaitlistRecord};

/// An event as the catalog recorded it: id, spec, creation time, sale controls.
pub(crate) type CatalogEntry = crate::events::LoggedEvent;

/// The state the actors start from.
pub(crate) struct Recovered {
    pub waitlist: WaitlistCore,
    pub waitlist_last: u64,
    pub events: Vec<CatalogEntry>,
    pub cores: HashMap<(EventId, SectionId), (SectionCore, u64)>,
    pub catalog_last: u64,
    pub ledger_states: Vec<ShardState>,
    pub ledger_last: Vec<u64>,
    /// The access codes' uses, counted from the sections' holds.
    pub code_uses: crate::access::Redemptions,
    /// Each event's waiting-room line, with its stream's last sequence number.
    pub rooms: HashMap<EventId, (crate::rooms::line::RoomLine, u64)>,
    /// What the log holds now: the flusher starts from these marks.
    pub marks: Marks,
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
    pub rooms: HashMap<EventId, (crate::rooms::line::RoomLine, u64)>,
    /// Each section's ledger items by shard ([`ledger_items`]), in the catalog's order, made
    /// beside its stream's read when a start asked for them: valid only for the cores as read
    /// (an accepted-damage start withdraws places, and a warm follower applies more, so
    /// neither asks; [`settle`] makes them then).
    pub ledger_items: Option<Vec<Vec<Vec<Settled>>>>,
}

/// A job of the parallel part of a start: a stream read, or the sold-seat table.
enum Read<'a> {
    Section(&'a EventId, &'a SectionSpec),
    /// The sold-seat backstop's claims, read for [`recover_backstop`].
    Claims,
}

/// What a job of the parallel part made.
enum Made {
    Section(Box<SectionRead>),
    Claims(Vec<(String, Vec<u8>)>),
}

/// A section as read: its core and its stream's last sequence number, its ledger items by
/// shard (if asked for), and the backstop keys of its sold places.
struct SectionRead {
    core: SectionCore,
    last_seq: u64,
    items: Option<Vec<Vec<Settled>>>,
    sold: Vec<(String, crate::types::HoldId)>,
}

/// Runs one job of the parallel part (see [`replay`]).
fn read_part(
    sink: &dyn LogSink,
    job: &Read,
    (window_ms, items_for): (u64, Option<usize>),
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<Made, StorageError> {
    Ok(match job {
        Read::Section(event_id, s) => {
            let (core, last_seq) = recover_section(sink, event_id, s, window_ms, check, report)?;
            let items = items_for.map(|shards| ledger_items(&core, event_id, shards));
            let sold = core.all_sold_keys();
            Made::Section(Box::new(SectionRead {
                core,
                last_seq,
                items,
                sold,
            }))
        }
        Read::Claims => Made::Claims(sink.claims()?),
    })
}

/// Reads every stream of the log into its pure core, checking each as it is read, then the
/// sold-seat backstop against the sections: nothing is changed (the repairs are planned in
/// `check`). `items_for`: the ledger's shard count, to make each section's ledger items as it
/// is read ([`Replayed::ledger_items`]).
fn replay(
    sink: &dyn LogSink,
    window_ms: u64,
    items_for: Option<usize>,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<Replayed, StorageError> {
    check.list_stored(sink)?;
    // The change stream is checked from the start, beside the catalog and the sections' streams
    // (its check is about as long as theirs together); what each part found is taken in the
    // order a start on one thread would find it.
    let changes = has_changes(check).then(|| check.fork());
    let (changes, read) = beside(
        changes,
        |check, report| check_changes(sink, check, report),
        || read_sections(sink, (window_ms, items_for), check, report),
    );
    let (events, catalog_last, sections, claims) = read?;
    let ledgers = recover_ledgers(sink, check, report)?;
    let (waitlist, waitlist_last) = recover_waitlist(sink, check, report)?;
    let mut rooms = HashMap::default();
    for CatalogEntry { event_id, .. } in &events {
        if let Some(room) = recover_room(sink, event_id, check, report)? {
            rooms.insert(event_id.clone(), room);
        }
    }
    if let Some(part) = changes {
        check.absorb(part.check);
        report.absorb(&part.report);
        part.made?;
    }
    check.absorb(claims.check);
    report.absorb(&claims.report);
    let Made::Claims(claims) = claims.made? else {
        unreachable!("the claims' part made claims")
    };
    check_unread_streams(sink, check, report)?;
    recover_backstop(sink, claims, sections.sold, check, report)?;
    Ok(Replayed {
        events,
        catalog_last,
        cores: sections.cores,
        ledgers,
        waitlist,
        waitlist_last,
        rooms,
        ledger_items: sections.ledger_items,
    })
}

/// The catalog, then the sections' streams and the sold-seat table side by side (the claims
/// taken last): the events, the catalog's last sequence number, the sections, the claims'
/// part.
#[allow(clippy::type_complexity)]
fn read_sections(
    sink: &dyn LogSink,
    (window_ms, items_for): (u64, Option<usize>),
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<(Vec<CatalogEntry>, u64, Sections, parallel::Part<Made>), StorageError> {
    let (events, catalog_last) = recover_catalog(sink, check, report)?;
    let mut jobs: Vec<Read> = events
        .iter()
        .flat_map(|e| {
            e.spec
                .sections
                .iter()
                .map(|s| Read::Section(&e.event_id, s))
        })
        .collect();
    jobs.push(Read::Claims);
    let rank = |job: &Read| u8::from(matches!(job, Read::Claims));
    let mut parts = run_parts(check, &jobs, rank, |job, check, report| {
        read_part(sink, job, (window_ms, items_for), check, report)
    })
    .into_iter();
    let sections = take_sections(&events, &mut parts, items_for.is_some(), check, report)?;
    let Some(claims) = parts.next() else {
        unreachable!("a part for the claims")
    };
    Ok((events, catalog_last, sections, claims))
}

/// The sections as the parallel part read them.
struct Sections {
    cores: HashMap<(EventId, SectionId), (SectionCore, u64)>,
    /// See [`Replayed::ledger_items`].
    ledger_items: Option<Vec<Vec<Vec<Settled>>>>,
    /// Each section's sold places' backstop keys.
    sold: Vec<Vec<(String, crate::types::HoldId)>>,
}

/// The sections read in the parallel part (the first parts, in the catalog's order), each
/// part's findings taken in that order; their ledger items if `items` asked for them.
fn take_sections(
    events: &[CatalogEntry],
    parts: &mut impl Iterator<Item = parallel::Part<Made>>,
    items: bool,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<Sections, StorageError> {
    let mut cores = HashMap::default();
    let mut ledger_items = items.then(Vec::new);
    let mut sold = Vec::new();
    for CatalogEntry { event_id, spec, .. } in events {
        for s in &spec.sections {
            let Some(part) = parts.next() else {
                unreachable!("a part for each section")
            };
            check.absorb(part.check);
            report.absorb(&part.report);
            let Made::Section(read) = part.made? else {
                unreachable!("a section's part made a section")
            };
            let SectionRead {
                core,
                last_seq,
                items,
                sold: keys,
            } = *read;
            report.sections += 1;
            cores.insert((event_id.clone(), s.section_id.clone()), (core, last_seq));
            if let (Some(all), Some(items)) = (ledger_items.as_mut(), items) {
                all.push(items);
            }
            sold.push(keys);
        }
        report.events += 1;
    }
    Ok(Sections {
        cores,
        ledger_items,
        sold,
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
    // Accepting damage may withdraw places after the read: the ledger's items are made then.
    let items_for = (with.mode != RecoveryMode::AcceptDamage).then_some(with.ledger_shards.max(1));
    let mut replayed = replay(sink, with.window_ms, items_for, &mut check, report)?;
    check.refuse_if_damaged()?;
    if with.mode == RecoveryMode::AcceptDamage {
        withdraw_orphans(sink, &mut replayed.cores, &mut check, with.now_ms)?;
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
    let replayed = replay(sink, window_ms, None, &mut check, report)?;
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
    let mut ledger_last = vec![0u64; shards];
    // Each shard's items: the recorded rejections, then each section's holds, in the order a
    // start on one thread would add them. Sections are read and shards built side by side.
    let mut items: Vec<Vec<Vec<Settled>>> = (0..shards).map(|_| vec![Vec::new()]).collect();
    for (name, (staging, last)) in replayed.ledgers {
        if let Some(i) = names::ledger_shard(&name)
            && i < shards
        {
            ledger_last[i] = last;
        }
        for (user_id, rpc, tag, at_ms, rejection) in staging.into_rejections() {
            let shard = shard_index(&user_id, shards);
            items[shard][0].push(Settled::Answer(user_id, rpc, tag, at_ms, Err(rejection)));
        }
    }
    let by_section = match replayed.ledger_items {
        Some(made) => made,
        None => in_parallel(
            replayed.cores.iter().collect(),
            |((event_id, _), (core, _))| ledger_items(core, event_id, shards),
        ),
    };
    for section in by_section {
        for (shard, list) in section.into_iter().enumerate() {
            items[shard].push(list);
        }
    }
    let ledger_states = in_parallel(items, |lists| {
        let mut state = ShardState::new(with.window_ms);
        // The keys' map holds the answers only (not the places held).
        let hint = lists
            .iter()
            .flatten()
            .filter(|item| matches!(item, Settled::Answer(..)))
            .count();
        state.recover(lists.into_iter().flatten(), hint);
        state.forget_due(with.now_ms, usize::MAX);
        state
    });
    let code_uses =
        crate::access::Redemptions::of_counts(replayed.cores.values().flat_map(|(core, _)| {
            let event = core.event_id().clone();
            core.code_uses()
                .into_iter()
                .map(move |(code, places)| (event.clone(), code, places))
        }));
    Recovered {
        code_uses,
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
    // The claims' count as the backstop read it, unless a repair below changes the table.
    let mut claims = Some(check.found.claims);
    for repair in std::mem::take(&mut check.repairs) {
        if matches!(repair, Repair::SetAside { .. } | Repair::Restore { .. }) {
            claims = None;
        }
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
    marks.claims = match claims {
        Some(read) => read,
        None => sink.claims()?.len() as u64,
    };
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
    let mut events = Vec::new();
    for (seq, record) in catalog.records {
        if let Err(e) = CatalogEntry::fold(&mut events, record) {
            check.misfit(names::CATALOG, seq, e);
        }
    }
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
            SectionCore::from_checkpoint(blob).unwrap_or_else(|e| {
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
            blob: codec::encode(&(replay.last_seq, codec::encode(&core.checkpoint()))),
        });
    }
    Ok((core, replay.last_seq))
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
/// section's holds, by the shard of their user.
fn ledger_items(core: &SectionCore, event_id: &EventId, shards: usize) -> Vec<Vec<Settled>> {
    // Up to three items a hold (its quota, its hold's and its confirm's answers): sized once,
    // not grown (growing these was a quarter of this function's time at a million records).
    let (holds, _) = core.remembered();
    let per_shard = (holds * 3).div_ceil(shards);
    let mut out: Vec<Vec<Settled>> = (0..shards).map(|_| Vec::with_capacity(per_shard)).collect();
    for (view, places, hold_tag, confirm) in core.holds_for_ledger() {
        let shard = &mut out[shard_index(&view.user_id, shards)];
        if matches!(view.status, HoldStatus::Held | HoldStatus::Confirmed) {
            shard.push(Settled::Quota(
                event_id.clone(),
                view.user_id.clone(),
                places,
            ));
        }
        if let Some((tag, order)) = confirm {
            shard.push(Settled::Answer(
                view.user_id.clone(),
                Rpc::Confirm,
                tag.clone(),
                order.created_at_ms,
                Ok(Answer::Order(Box::new(order))),
            ));
        }
        if let Some(tag) = hold_tag {
            let (user_id, at_ms) = (view.user_id.clone(), view.placed_at_ms);
            let mut first = view;
            first.status = HoldStatus::Held;
            shard.push(Settled::Answer(
                user_id,
                Rpc::Hold,
                tag.clone(),
                at_ms,
                Ok(Answer::Hold(Box::new(first))),
            ));
        }
    }
    out
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

/// An event's waiting-room stream, if it has one: the line and the stream's last sequence
/// number.
fn recover_room(
    sink: &dyn LogSink,
    event_id: &EventId,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<Option<(crate::rooms::line::RoomLine, u64)>, StorageError> {
    let name = names::room(event_id);
    if !sink.stream_names()?.contains(&name) {
        return Ok(None);
    }
    let replay = check.read::<crate::rooms::line::RoomRecord>(sink, &name, report)?;
    let mut line = match &replay.checkpoint {
        Some((_, blob)) => {
            report.checkpoints_loaded += 1;
            codec::decode::<crate::rooms::line::RoomLine>(blob).unwrap_or_else(|e| {
                check
                    .found
                    .checkpoint_damage(&check.marks, &name, blob, e.to_string());
                crate::rooms::line::RoomLine::default()
            })
        }
        None => crate::rooms::line::RoomLine::default(),
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
