//! The change stream (`ChangeService.WatchChanges`): every change the engine makes, in log
//! order, each with a cursor a reader resumes from.
//!
//! Writers describe what their records change ([`Change`]) beside the records (a section actor
//! from its core, which knows the order's amount and tickets; the catalog; the waitlist; the
//! refunds), and encode them there ([`Noted`]), off the flusher's thread. The flusher gathers the
//! encoded changes of every job of a group commit into records of the `changes` stream
//! ([`ChangeRecord`], about [`CHANGE_RECORD_BYTES`] each, after the commit's own records), so
//! the stream costs at most one more value per job (a section's batch), not one per change, and
//! is durable
//! (and on a cluster replicated, in the same Raft entry) exactly when the records it describes
//! are. A record's changes are in the order their jobs were queued: a section's in its own order,
//! the catalog's before the sections follow it.
//!
//! **Cursors.** A [`Position`] is `(seq, index)`: after the `index`-th change of the record
//! `seq` (`index` [`Position::WHOLE`]: after the whole record). Every node of a group applies
//! the same records under the same numbers, so a position means the same on any node, and a
//! reader that moves to another node (a failover) resumes with no gap.
//!
//! **Retention.** The flusher trims records older than `EngineConfig::change_retention`
//! (measured by the records' own times) through a checkpoint of the stream (replicated like any
//! other), and the compactor removes them. A position inside what is gone is expired
//! ([`ChangesError::Expired`], with the oldest position still served).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::core::{SectionCore, SectionRecord};
use crate::error::StorageError;
use crate::payment::Charge;
use crate::sale::SaleControls;
use crate::store::{LogSink, StreamSink, names};
use crate::types::{
    CatalogRecord, EventId, EventSpec, HoldId, HoldStatus, HoldView, OrderView, SectionId, UserId,
};
use crate::waitlist::{WaitlistCore, WaitlistRecord};

/// The encoded changes one record of the stream holds at most, unless one job's alone are more
/// (they are never split). Small values keep sled fast: its leaves are serialized whole, so
/// big values make every write of a leaf big. Measured with the actor bench (Sync, 16
/// sections, 1,024 callers; BENCHMARKS.md): 32 KiB cost a third of the holds/s, 4 KiB a
/// quarter, 1 KiB (about one job's changes a record) a tenth, within the bench's noise.
pub const CHANGE_RECORD_BYTES: usize = 1024;

/// Records read from the stream at a time when paging, per this many changes asked for.
const CHANGES_PER_RECORD_TYPICAL: usize = 8;

/// How often the flusher looks for records past the retention.
const TRIM_EVERY: Duration = Duration::from_secs(1);

/// How far past a missing record the trim looks for the next one.
const TRIM_HOLE_SPAN: u64 = 64;

/// What changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    /// An event was created.
    EventCreated {
        /// Its spec (the proof of work's difficulty is not kept here).
        spec: EventSpec,
        /// Its sale's controls as created.
        sale: SaleControls,
    },
    /// Places were held (a unary hold, an item of a batch, or a waitlist offer's hold).
    HoldPlaced(HoldView),
    /// A holder released a hold.
    HoldReleased(HoldView),
    /// A hold's time ran out.
    HoldExpired(HoldView),
    /// A hold was paid: an order (tickets without their codes).
    OrderCreated(OrderView),
    /// Places were taken out of sale (an `--accept-damage` start).
    PlacesWithdrawn {
        /// The section.
        section_id: SectionId,
        /// How many places.
        quantity: u32,
    },
    /// A waitlist entry was offered places: a hold in its fan's name.
    WaitlistOffered {
        /// The entry.
        entry_id: String,
        /// The hold placed for it.
        hold_id: HoldId,
    },
    /// An operator changed the sale (`UpdateSale`): the controls after the change.
    SaleUpdated(SaleControls),
    /// A charge kept without an order was refunded.
    Refunded {
        /// The payment refunded.
        payment_id: String,
        /// The hold it was made for, if known.
        hold_id: Option<HoldId>,
        /// Amount, cents.
        amount_cents: u64,
        /// Whose money it was.
        user_id: Option<UserId>,
    },
}

impl ChangeKind {
    /// The kind's name as the API spells it (`hold_placed`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            ChangeKind::EventCreated { .. } => "event_created",
            ChangeKind::HoldPlaced(_) => "hold_placed",
            ChangeKind::HoldReleased(_) => "hold_released",
            ChangeKind::HoldExpired(_) => "hold_expired",
            ChangeKind::OrderCreated(_) => "order_created",
            ChangeKind::PlacesWithdrawn { .. } => "places_withdrawn",
            ChangeKind::WaitlistOffered { .. } => "waitlist_offered",
            ChangeKind::SaleUpdated(_) => "sale_updated",
            ChangeKind::Refunded { .. } => "refunded",
        }
    }
}

/// One change: of which event, when (the writer's clock), what.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The event.
    pub event_id: EventId,
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// What.
    pub kind: ChangeKind,
}

/// One record of the `changes` stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeRecord {
    /// The latest time among its changes (retention is measured by it).
    pub at_ms: u64,
    /// The changes, in log order: each part one job's, as [`Noted`] encoded them.
    pub parts: Vec<Vec<u8>>,
}

impl ChangeRecord {
    /// The record's changes, in order.
    pub fn changes(&self) -> Result<Vec<Change>, codec::DecodeError> {
        let mut out = Vec::new();
        for part in &self.parts {
            out.extend(codec::decode::<Vec<Change>>(part)?);
        }
        Ok(out)
    }
}

/// One job's changes, encoded by its writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Noted {
    /// The latest time among them.
    pub at_ms: u64,
    /// `Vec<Change>` encoded by [`codec`].
    pub bytes: Vec<u8>,
}

impl Noted {
    /// `changes` encoded (`None`: there are none).
    pub fn of(changes: &[Change]) -> Option<Noted> {
        let at_ms = changes.iter().map(|c| c.at_ms).max()?;
        Some(Noted {
            at_ms,
            bytes: codec::encode(&changes),
        })
    }
}

/// Where a reader stands: after the `index`-th change of record `seq` (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position {
    /// The record.
    pub seq: u64,
    /// The change within it ([`Position::WHOLE`]: all of them).
    pub index: u32,
}

impl Position {
    /// After the whole record.
    pub const WHOLE: u32 = u32::MAX;

    /// Before everything ever written.
    pub const START: Position = Position {
        seq: 0,
        index: Position::WHOLE,
    };

    /// After the whole of record `seq`.
    pub fn after_record(seq: u64) -> Position {
        Position {
            seq,
            index: Position::WHOLE,
        }
    }
}

impl std::fmt::Display for Position {
    /// `seq` after a whole record, `seq.index` after one of its changes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.index == Position::WHOLE {
            write!(f, "{}", self.seq)
        } else {
            write!(f, "{}.{}", self.seq, self.index)
        }
    }
}

impl std::str::FromStr for Position {
    type Err = String;

    fn from_str(s: &str) -> Result<Position, String> {
        let bad = || format!("`{s}` is not a cursor of this stream");
        let (seq, index) = match s.split_once('.') {
            Some((seq, index)) => {
                let index: u32 = index.parse().map_err(|_| bad())?;
                if index == Position::WHOLE {
                    return Err(bad());
                }
                (seq, index)
            }
            None => (s, Position::WHOLE),
        };
        Ok(Position {
            seq: seq.parse().map_err(|_| bad())?,
            index,
        })
    }
}

/// Why a read of the stream gave nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChangesError {
    /// The position is older than the retention: `oldest` is the oldest still served.
    #[error("the cursor is older than the change stream keeps (oldest: {oldest})")]
    Expired {
        /// The oldest position a reader may resume from.
        oldest: Position,
    },
    /// The position is past the end of the stream (not one this log handed out).
    #[error("the cursor {0} is past the end of the change stream")]
    Unknown(Position),
    /// The log could not be read.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A page of the stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangesPage {
    /// The changes after the position asked for, each with its own position.
    pub changes: Vec<(Position, Change)>,
    /// Where the next read starts (the last change's position, or the one asked for).
    pub next: Position,
    /// The oldest position still served.
    pub oldest: Position,
    /// Whether the page reached the end of what is readable now.
    pub at_end: bool,
}

/// The oldest position still served: after the record the stream's checkpoint covers.
fn oldest(sink: &dyn LogSink) -> Result<Position, StorageError> {
    let upto = match sink.checkpoint(names::CHANGES)? {
        Some(bytes) => {
            codec::decode::<(u64, Vec<u8>)>(&bytes)
                .map_err(|e| StorageError::Corrupt {
                    stream: names::CHANGES.to_owned(),
                    seq: 0,
                    reason: format!("its checkpoint: {e}"),
                })?
                .0
        }
        None => 0,
    };
    Ok(Position::after_record(upto))
}

/// Reads up to `max` changes after `after` (`None`: from the oldest still served), from records
/// numbered up to `readable` (what is durable; on a cluster node's copy, everything applied:
/// `u64::MAX`).
pub fn read(
    sink: &dyn LogSink,
    after: Option<Position>,
    readable: u64,
    max: usize,
) -> Result<ChangesPage, ChangesError> {
    let oldest = oldest(sink)?;
    let after = after.unwrap_or(oldest);
    let expired = |oldest: Position| {
        after.seq < oldest.seq || (after.seq == oldest.seq && after.index != Position::WHOLE)
    };
    if expired(oldest) {
        return Err(ChangesError::Expired { oldest });
    }
    let stream = sink.stream(names::CHANGES)?;
    let last = stream.last_seq()?.min(readable);
    if after.seq > last {
        return Err(ChangesError::Unknown(after));
    }
    let mut page = ChangesPage {
        next: after,
        oldest,
        ..ChangesPage::default()
    };
    // A record holds a job's changes: read a few records at a time.
    let first = if after.index == Position::WHOLE {
        after.seq
    } else {
        after.seq - 1
    };
    let mut from = first;
    while page.changes.len() < max && from < last {
        let upto = last.min(from + 1 + (max / CHANGES_PER_RECORD_TYPICAL) as u64);
        for (seq, bytes) in stream.read_between(from, upto)? {
            let corrupt = |e: codec::DecodeError| StorageError::Corrupt {
                stream: names::CHANGES.to_owned(),
                seq,
                reason: e.to_string(),
            };
            let record: ChangeRecord = codec::decode(&bytes).map_err(corrupt)?;
            let changes = record.changes().map_err(corrupt)?;
            let skip = if seq == after.seq && after.index != Position::WHOLE {
                after.index as usize + 1
            } else {
                0
            };
            let n = changes.len();
            for (i, change) in changes.into_iter().enumerate().skip(skip) {
                if page.changes.len() == max {
                    page.at_end = false;
                    let now = self::oldest(sink)?;
                    if expired(now) {
                        return Err(ChangesError::Expired { oldest: now });
                    }
                    return Ok(page);
                }
                let index = if i + 1 == n {
                    Position::WHOLE
                } else {
                    u32::try_from(i).unwrap_or(Position::WHOLE - 1)
                };
                let at = Position { seq, index };
                page.next = at;
                page.changes.push((at, change));
            }
            page.next = Position::after_record(seq);
        }
        from = upto;
    }
    page.at_end = page.next.seq >= last && page.next.index == Position::WHOLE;
    // A trim that landed while this page was read may have removed records it skipped over:
    // then the reader was too far behind after all.
    let now = self::oldest(sink)?;
    if expired(now) {
        return Err(ChangesError::Expired { oldest: now });
    }
    Ok(page)
}

/// The changes a section's records made, from its core once they are applied.
pub(crate) fn of_section(core: &SectionCore, records: &[SectionRecord]) -> Vec<Change> {
    let event_id = core.event_id();
    let hold = |hold_id: &HoldId| core.hold_view(hold_id);
    records
        .iter()
        .filter_map(|r| {
            let (at_ms, kind) = match r {
                SectionRecord::HoldPlaced {
                    hold_id,
                    user_id,
                    seats,
                    quantity,
                    placed_at_ms,
                    expires_at_ms,
                    ..
                } => (
                    *placed_at_ms,
                    ChangeKind::HoldPlaced(HoldView {
                        hold_id: hold_id.clone(),
                        event_id: event_id.clone(),
                        user_id: user_id.clone(),
                        section_id: core.spec().section_id.clone(),
                        seat_ids: seats.iter().map(|&s| core.seat_id(s)).collect(),
                        quantity: *quantity,
                        status: HoldStatus::Held,
                        placed_at_ms: *placed_at_ms,
                        expires_at_ms: *expires_at_ms,
                    }),
                ),
                SectionRecord::HoldConfirmed {
                    order_id, at_ms, ..
                } => (*at_ms, ChangeKind::OrderCreated(core.order_view(order_id)?)),
                SectionRecord::HoldReleased { hold_id, at_ms } => {
                    let mut h = hold(hold_id)?;
                    h.status = HoldStatus::Released;
                    (*at_ms, ChangeKind::HoldReleased(h))
                }
                SectionRecord::HoldExpired { hold_id, at_ms } => {
                    let mut h = hold(hold_id)?;
                    h.status = HoldStatus::Expired;
                    (*at_ms, ChangeKind::HoldExpired(h))
                }
                SectionRecord::PlacesWithdrawn { places, at_ms } => (
                    *at_ms,
                    ChangeKind::PlacesWithdrawn {
                        section_id: core.spec().section_id.clone(),
                        quantity: u32::try_from(places.len()).unwrap_or(u32::MAX),
                    },
                ),
                // The catalog's `SaleUpdated` tells of the sale once, for the whole event.
                SectionRecord::SalePaused { .. }
                | SectionRecord::SaleResumed { .. }
                | SectionRecord::SaleEnded { .. } => return None,
            };
            Some(Change {
                event_id: event_id.clone(),
                at_ms,
                kind,
            })
        })
        .collect()
}

/// The change a catalog record makes.
pub(crate) fn of_catalog(record: &CatalogRecord, now_ms: u64) -> Change {
    match record {
        CatalogRecord::EventCreated {
            spec,
            event_id,
            created_at_ms,
        }
        | CatalogRecord::EventCreatedWithPow {
            spec,
            event_id,
            created_at_ms,
            ..
        } => Change {
            event_id: event_id.clone(),
            at_ms: *created_at_ms,
            kind: ChangeKind::EventCreated {
                spec: spec.clone(),
                sale: spec.sale_controls(*created_at_ms),
            },
        },
        CatalogRecord::SaleUpdated { event_id, sale, .. } => Change {
            event_id: event_id.clone(),
            at_ms: now_ms,
            kind: ChangeKind::SaleUpdated(sale.clone()),
        },
    }
}

/// The change a waitlist record makes, if it is one the stream tells of (an offer), from the
/// waitlist's core once it is applied.
pub(crate) fn of_waitlist(
    core: &WaitlistCore,
    record: &WaitlistRecord,
    now_ms: u64,
) -> Option<Change> {
    let WaitlistRecord::EntryOffered { entry_id, hold_id } = record else {
        return None;
    };
    Some(Change {
        event_id: core.view(entry_id)?.event_id,
        at_ms: now_ms,
        kind: ChangeKind::WaitlistOffered {
            entry_id: entry_id.clone(),
            hold_id: hold_id.clone(),
        },
    })
}

/// The change a refund makes: `charge` (made for `hold`) refunded at `now_ms`.
pub(crate) fn refunded(
    charge: &Charge,
    hold: &HoldId,
    user_id: Option<UserId>,
    now_ms: u64,
) -> Option<Change> {
    let (event_id, _) = hold.route()?;
    Some(Change {
        event_id,
        at_ms: now_ms,
        kind: ChangeKind::Refunded {
            payment_id: charge.payment_id.clone(),
            hold_id: Some(hold.clone()),
            amount_cents: charge.amount_cents,
            user_id,
        },
    })
}

/// The flusher's side of the stream: numbers its records and trims it.
pub(crate) struct ChangeLog {
    stream: Arc<dyn StreamSink>,
    next_seq: u64,
    /// The first record not yet trimmed.
    first_kept: u64,
    retention_ms: u64,
    trimmed_at: Option<Instant>,
}

impl ChangeLog {
    /// The stream of `sink`, going on after what it holds and after `acknowledged` (the
    /// superblock's mark: numbers an accepted loss took are never used again).
    pub fn open(
        sink: &dyn LogSink,
        retention: Duration,
        acknowledged: u64,
    ) -> Result<ChangeLog, StorageError> {
        let stream = sink.stream(names::CHANGES)?;
        let last = stream.last_seq()?.max(acknowledged);
        let first_kept = oldest(sink)?.seq + 1;
        Ok(ChangeLog {
            next_seq: last.max(first_kept - 1) + 1,
            stream,
            first_kept,
            retention_ms: u64::try_from(retention.as_millis()).unwrap_or(u64::MAX),
            trimmed_at: None,
        })
    }

    /// The stream.
    pub fn stream(&self) -> &Arc<dyn StreamSink> {
        &self.stream
    }

    /// Numbers the jobs' encoded changes into records of at most [`CHANGE_RECORD_BYTES`]
    /// each (none if there are none).
    pub fn seal(&mut self, noted: Vec<Noted>) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let mut record = ChangeRecord {
            at_ms: 0,
            parts: Vec::new(),
        };
        let mut bytes = 0;
        for n in noted {
            if bytes > 0 && bytes + n.bytes.len() > CHANGE_RECORD_BYTES {
                let full = std::mem::replace(
                    &mut record,
                    ChangeRecord {
                        at_ms: 0,
                        parts: Vec::new(),
                    },
                );
                out.push(self.number(&full));
                bytes = 0;
            }
            bytes += n.bytes.len();
            record.at_ms = record.at_ms.max(n.at_ms);
            record.parts.push(n.bytes);
        }
        if !record.parts.is_empty() {
            out.push(self.number(&record));
        }
        out
    }

    fn number(&mut self, record: &ChangeRecord) -> (u64, Vec<u8>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        (seq, codec::encode(record))
    }

    /// The record to trim up to, if some are older than the retention than `now_ms` (the
    /// newest record's time), looked for at most once a second: the first record young enough
    /// is found by halving (records are in time order), reading a few of them.
    pub fn trim_due(&mut self, now_ms: u64) -> Option<u64> {
        if self.trimmed_at.is_some_and(|t| t.elapsed() < TRIM_EVERY) {
            return None;
        }
        self.trimmed_at = Some(Instant::now());
        let horizon = now_ms.checked_sub(self.retention_ms)?;
        // The time of the first record at or after `seq` (a hole, a batch whose claim was
        // refused on a cluster, counts as the record after it).
        let at = |seq: u64| -> Option<u64> {
            let (_, bytes) = self
                .stream
                .read_between(seq - 1, seq + TRIM_HOLE_SPAN)
                .ok()?
                .into_iter()
                .next()?;
            codec::decode::<ChangeRecord>(&bytes).ok().map(|r| r.at_ms)
        };
        // The first record at or after the horizon, in [first_kept, last_written].
        let (mut lo, mut hi) = (self.first_kept, self.next_seq - 1);
        if lo > hi || at(lo)? >= horizon {
            return None;
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if at(mid)? < horizon {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let upto = if at(lo)? < horizon { lo } else { lo - 1 };
        (upto >= self.first_kept).then(|| {
            self.first_kept = upto + 1;
            upto
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_read_back_as_written_and_bad_ones_are_refused() {
        for p in [
            Position::START,
            Position { seq: 7, index: 0 },
            Position::after_record(12),
        ] {
            assert_eq!(p.to_string().parse::<Position>(), Ok(p));
        }
        assert_eq!("12".parse::<Position>(), Ok(Position::after_record(12)));
        for bad in ["", "x", "1.", ".1", "1.2.3", "-1", "1.4294967295"] {
            assert!(bad.parse::<Position>().is_err(), "{bad}");
        }
    }
}
