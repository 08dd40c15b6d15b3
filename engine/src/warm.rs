//! A warm follower (issue 13): a cluster node that does not lead its group keeps the state its
//! engine would start from, by applying each committed batch to the same pure cores a start
//! replays the log into ([`SectionCore::apply`], the ledger's, the waitlist's, the rooms'). A
//! node that becomes leader then opens its engine from that state ([`crate::recovery`]'s
//! `recover_warm`) instead of reading its copy of the log again.
//!
//! The state is kept only while it is known to match the node's copy exactly:
//! - it is built by replaying the copy (checked as a start checks it) under the state
//!   machine's lock, so no batch is applied meanwhile ([`crate::raft::StateMachine::warm_up`]);
//! - from then on every record the state machine writes is applied to it, in order: a record
//!   already applied (openraft applies the entries after its last recorded position again after
//!   a restart) is skipped by its sequence number, and anything that does not fit (a gap, a
//!   record for a stream of no known event, a record a core refuses) drops the state;
//! - a snapshot's install drops it (the copy was replaced), and so does the start of this node's
//!   engine, which takes it: a leader's own batches are not applied twice. Once the node follows
//!   again, it warms up anew.
//!
//! A dropped state costs nothing but speed: the engine then starts as a single node does, from
//! the log.

use crate::hash::HashMap;
use std::sync::Mutex;

use crate::codec;
use crate::core::{SectionCore, SectionRecord};
use crate::events::LoggedEvent;
use crate::ledger::{LedgerRecord, ShardState};
use crate::recovery::Replayed;
use crate::rooms::line::{RoomLine, RoomRecord};
use crate::store::names;
use crate::types::{CatalogRecord, EventId, SectionId};
use crate::waitlist::WaitlistRecord;

/// A node's warm state for one group (see the module docs). Shared by the group's state
/// machine, which feeds it, and the engine that starts from it.
#[derive(Default)]
pub struct Warm {
    slot: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    kept: Option<Kept>,
    /// Raised whenever the state is taken or dropped: a warm-up that began before does not
    /// install what it read.
    generation: u64,
    warming: bool,
    /// After a failed warm-up, none begins before this (the copy is read whole each time).
    retry_after: Option<tokio::time::Instant>,
}

/// How long after a failed warm-up the next may begin.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// The kept state, with what finds a stream's core.
struct Kept {
    replayed: Replayed,
    window_ms: u64,
    sections: HashMap<String, (EventId, SectionId)>,
    rooms: HashMap<String, EventId>,
    /// The records of each ledger stream after its last checkpoint: a checkpoint replaces the
    /// stream's staged state, and those after it are applied again, as a start reads them.
    ledger_tails: HashMap<String, Vec<(u64, LedgerRecord)>>,
}

/// Why a record did not fit: the state is dropped.
type Misfit = String;

impl Kept {
    fn new(replayed: Replayed, window_ms: u64) -> Kept {
        let mut kept = Kept {
            replayed,
            window_ms,
            sections: HashMap::default(),
            rooms: HashMap::default(),
            ledger_tails: HashMap::default(),
        };
        let events: Vec<_> = kept
            .replayed
            .events
            .iter()
            .map(|e| (e.event_id.clone(), e.spec.clone()))
            .collect();
        for (event_id, spec) in events {
            kept.name_event(&event_id, &spec);
        }
        kept
    }

    fn name_event(&mut self, event_id: &EventId, spec: &crate::types::EventSpec) {
        for s in &spec.sections {
            self.sections.insert(
                names::section(event_id, &s.section_id),
                (event_id.clone(), s.section_id.clone()),
            );
        }
        self.rooms.insert(names::room(event_id), event_id.clone());
    }

    /// A catalog record: an event created gets its new sections' cores (and their streams'
    /// names); a sale update changes its event's controls.
    fn catalog(&mut self, record: CatalogRecord) -> Result<(), Misfit> {
        let created = LoggedEvent::fold(&mut self.replayed.events, record)?
            .map(|e| (e.event_id.clone(), e.spec.clone()));
        if let Some((event_id, spec)) = created {
            for s in &spec.sections {
                let core =
                    SectionCore::new(event_id.clone(), s.clone()).with_window_ms(self.window_ms);
                self.replayed
                    .cores
                    .insert((event_id.clone(), s.section_id.clone()), (core, 0));
            }
            self.name_event(&event_id, &spec);
        }
        Ok(())
    }

    /// The next sequence number `stream` expects, and whether `seq` is it (`Ok(false)`: applied
    /// already).
    fn next(stream: &str, last: u64, seq: u64) -> Result<bool, Misfit> {
        if seq <= last {
            Ok(false)
        } else if seq == last + 1 {
            Ok(true)
        } else {
            Err(format!(
                "stream `{stream}`: record {seq} after {last} (a gap)"
            ))
        }
    }

    fn append(&mut self, stream: &str, seq: u64, bytes: &[u8]) -> Result<(), Misfit> {
        let bad = |e: codec::DecodeError| format!("stream `{stream}` #{seq}: {e}");
        if stream == names::CHANGES {
            // Read by `WatchChanges` from the copy itself: no state to keep.
            return Ok(());
        }
        if stream == names::CATALOG {
            if Self::next(stream, self.replayed.catalog_last, seq)? {
                let record: CatalogRecord = codec::decode(bytes).map_err(bad)?;
                self.catalog(record)
                    .map_err(|e| format!("stream `{stream}` #{seq}: {e}"))?;
                self.replayed.catalog_last = seq;
            }
        } else if stream == names::WAITLIST {
            if Self::next(stream, self.replayed.waitlist_last, seq)? {
                let record: WaitlistRecord = codec::decode(bytes).map_err(bad)?;
                self.replayed
                    .waitlist
                    .apply(&record)
                    .map_err(|e| format!("stream `{stream}` #{seq}: {e}"))?;
                self.replayed.waitlist_last = seq;
            }
        } else if let Some(key) = self.sections.get(stream) {
            let (core, last) = self
                .replayed
                .cores
                .get_mut(key)
                .ok_or_else(|| format!("stream `{stream}`: its section has no core"))?;
            if Self::next(stream, *last, seq)? {
                let record: SectionRecord = codec::decode(bytes).map_err(bad)?;
                core.apply(&record)
                    .map_err(|e| format!("stream `{stream}` #{seq}: {e}"))?;
                *last = seq;
            }
        } else if let Some(event_id) = self.rooms.get(stream) {
            let (line, last) = self
                .replayed
                .rooms
                .entry(event_id.clone())
                .or_insert_with(|| (RoomLine::default(), 0));
            if Self::next(stream, *last, seq)? {
                let record: RoomRecord = codec::decode(bytes).map_err(bad)?;
                line.apply(&record)
                    .map_err(|e| format!("stream `{stream}` #{seq}: {e}"))?;
                *last = seq;
            }
        } else if stream.starts_with(names::LEDGER_PREFIX) {
            let (staging, last) = self
                .replayed
                .ledgers
                .entry(stream.to_owned())
                .or_insert_with(|| (ShardState::default(), 0));
            if Self::next(stream, *last, seq)? {
                let record: LedgerRecord = codec::decode(bytes).map_err(bad)?;
                staging.apply(record.clone());
                *last = seq;
                self.ledger_tails
                    .entry(stream.to_owned())
                    .or_default()
                    .push((seq, record));
            }
        } else {
            return Err(format!("stream `{stream}` belongs to no known event"));
        }
        Ok(())
    }

    /// A checkpoint of `stream` up to `upto`. The pure cores of sections, rooms and the
    /// waitlist already hold what it does (it was written from the same records); a ledger
    /// stream's staged state is replaced by it, with the records after it applied again.
    fn checkpoint(&mut self, stream: &str, upto: u64, blob: &[u8]) -> Result<(), Misfit> {
        if !stream.starts_with(names::LEDGER_PREFIX) {
            return Ok(());
        }
        let mut staging = ShardState::default();
        staging
            .load_checkpoint(blob)
            .map_err(|e| format!("checkpoint of `{stream}`: {e}"))?;
        let tail = self.ledger_tails.entry(stream.to_owned()).or_default();
        tail.retain(|(seq, _)| *seq > upto);
        for (_, record) in tail.iter() {
            staging.apply(record.clone());
        }
        let last = self.replayed.ledgers.get(stream).map_or(upto, |(_, l)| *l);
        self.replayed
            .ledgers
            .insert(stream.to_owned(), (staging, last.max(upto)));
        Ok(())
    }
}

impl Warm {
    /// A node's warm state, cold until [`Warm::install`].
    pub fn new() -> Warm {
        Warm::default()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a state is kept.
    pub fn is_warm(&self) -> bool {
        self.slot().kept.is_some()
    }

    /// Starts a warm-up unless the state is kept or one is under way: the generation to hand to
    /// [`Warm::install`].
    pub(crate) fn begin(&self) -> Option<u64> {
        let mut slot = self.slot();
        if slot.kept.is_some()
            || slot.warming
            || slot
                .retry_after
                .is_some_and(|t| tokio::time::Instant::now() < t)
        {
            return None;
        }
        slot.warming = true;
        Some(slot.generation)
    }

    /// Ends a warm-up begun at `generation`: keeps `replayed` unless the state was taken or
    /// dropped since (`false`). `None`: the warm-up failed.
    pub(crate) fn install(
        &self,
        generation: u64,
        replayed: Option<Replayed>,
        window_ms: u64,
    ) -> bool {
        let mut slot = self.slot();
        slot.warming = false;
        match replayed {
            Some(r) if slot.generation == generation => {
                slot.kept = Some(Kept::new(r, window_ms));
                true
            }
            Some(_) => false,
            None => {
                slot.retry_after = Some(tokio::time::Instant::now() + RETRY_AFTER);
                false
            }
        }
    }

    /// Drops the state (a snapshot replaced the copy, or a record did not fit).
    pub(crate) fn drop_state(&self, why: &str) {
        let mut slot = self.slot();
        slot.generation += 1;
        if slot.kept.take().is_some() {
            tracing::warn!(
                reason = why,
                "the warm state is dropped: the next start reads the log"
            );
        }
    }

    /// Takes the state for an engine's start (the node leads): the state machine stops
    /// feeding it.
    pub(crate) fn take(&self) -> Option<(Replayed, u64)> {
        let mut slot = self.slot();
        slot.generation += 1;
        let kept = slot.kept.take()?;
        Some((kept.replayed, kept.window_ms))
    }

    /// A record the state machine wrote to `stream` at `seq`.
    pub(crate) fn append(&self, stream: &str, entries: &[(u64, Vec<u8>)]) {
        let mut slot = self.slot();
        let Some(kept) = slot.kept.as_mut() else {
            return;
        };
        let mut misfit = None;
        for (seq, bytes) in entries {
            if let Err(e) = kept.append(stream, *seq, bytes) {
                misfit = Some(e);
                break;
            }
        }
        drop(slot);
        if let Some(why) = misfit {
            self.drop_state(&why);
        }
    }

    /// A checkpoint the state machine wrote.
    pub(crate) fn checkpoint(&self, stream: &str, upto: u64, blob: &[u8]) {
        let mut slot = self.slot();
        let Some(kept) = slot.kept.as_mut() else {
            return;
        };
        let misfit = kept.checkpoint(stream, upto, blob).err();
        drop(slot);
        if let Some(why) = misfit {
            self.drop_state(&why);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::types::EventSpec;

    fn spec() -> EventSpec {
        crate::types::ga_event_spec("e", "show", 10, 100)
    }

    fn hold(n: u32) -> Vec<u8> {
        codec::encode(&SectionRecord::HoldPlaced {
            hold_id: crate::types::HoldId::from(format!("h{n}").as_str()),
            user_id: crate::types::UserId::from("fan"),
            seats: vec![],
            quantity: 1,
            placed_at_ms: 1,
            expires_at_ms: 1_000_000,
            idem: None,
        })
    }

    /// A warm state with event `e` created (catalog record 1).
    fn warm() -> Warm {
        let warm = Warm::new();
        let generation = warm.begin().unwrap();
        assert!(warm.begin().is_none(), "one warm-up at a time");
        assert!(warm.install(generation, Some(Replayed::default()), 60_000));
        let created = codec::encode(&CatalogRecord::EventCreated {
            spec: spec(),
            event_id: EventId::from("e"),
            created_at_ms: 1,
        });
        warm.append(names::CATALOG, &[(1, created)]);
        assert!(warm.is_warm());
        warm
    }

    fn held(warm: Warm) -> u32 {
        let (replayed, _) = warm.take().unwrap();
        let key = (EventId::from("e"), SectionId::from("ga"));
        replayed.cores[&key].0.counts().2
    }

    #[test]
    fn records_applied_again_after_a_restart_are_skipped_by_their_sequence_numbers() {
        let warm = warm();
        let stream = names::section(&EventId::from("e"), &SectionId::from("ga"));
        warm.append(&stream, &[(1, hold(1)), (2, hold(2))]);
        // openraft applies the entries after its last recorded position again.
        warm.append(&stream, &[(1, hold(1)), (2, hold(2)), (3, hold(3))]);
        assert!(warm.is_warm());
        assert_eq!(held(warm), 3);
    }

    #[test]
    fn a_gap_a_record_that_does_not_decode_or_fit_and_an_unknown_stream_drop_the_state() {
        let stream = names::section(&EventId::from("e"), &SectionId::from("ga"));
        let gap = warm();
        gap.append(&stream, &[(2, hold(2))]);
        assert!(!gap.is_warm(), "record 2 without 1");
        let garbled = warm();
        garbled.append(&stream, &[(1, vec![1, 2, 3])]);
        assert!(!garbled.is_warm());
        let misfit = warm();
        misfit.append(&stream, &[(1, hold(1)), (2, hold(1))]);
        assert!(!misfit.is_warm(), "a hold placed twice");
        let unknown = warm();
        unknown.append("section/other/ga", &[(1, hold(1))]);
        assert!(!unknown.is_warm());
        assert!(unknown.take().is_none());
    }

    #[test]
    fn a_warm_up_begun_before_a_take_or_a_drop_installs_nothing() {
        let warm = Warm::new();
        let generation = warm.begin().unwrap();
        warm.drop_state("a snapshot was installed");
        assert!(!warm.install(generation, Some(Replayed::default()), 60_000));
        assert!(!warm.is_warm());
        let generation = warm.begin().unwrap();
        assert!(warm.take().is_none());
        assert!(!warm.install(generation, Some(Replayed::default()), 60_000));
        // A failed warm-up waits before the next.
        let generation = warm.begin().unwrap();
        assert!(!warm.install(generation, None, 60_000));
        assert!(warm.begin().is_none());
    }
}
