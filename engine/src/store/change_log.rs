//! The change stream as the log keeps it (see [`crate::changes`] for what it is): the
//! flusher's numbering and trimming ([`ChangeLog`]) and reading a page after a cursor
//! ([`read_changes`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::names;
use super::sink::{LogSink, StreamSink};
use crate::changes::{
    Change, ChangeRecord, ChangesError, ChangesPage, ChangesRead, Noted, Position,
};
use crate::codec;
use crate::error::StorageError;

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
pub fn read_changes(
    sink: &dyn LogSink,
    after: Option<Position>,
    readable: u64,
    max: usize,
) -> ChangesRead {
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
    let full = fill(stream.as_ref(), after, last, max, &mut page)?;
    page.at_end = !full && page.next.seq >= last && page.next.index == Position::WHOLE;
    // A trim that landed while this page was read may have removed records it skipped over:
    // then the reader was too far behind after all.
    let now = self::oldest(sink)?;
    if expired(now) {
        return Err(ChangesError::Expired { oldest: now });
    }
    Ok(page)
}

/// Adds to `page` the changes after `after`, up to record `last` and `max` changes; whether
/// it stopped because the page is full.
fn fill(
    stream: &dyn StreamSink,
    after: Position,
    last: u64,
    max: usize,
    page: &mut ChangesPage,
) -> Result<bool, ChangesError> {
    // A record holds a job's changes: read a few records at a time.
    let mut from = if after.index == Position::WHOLE {
        after.seq
    } else {
        after.seq - 1
    };
    while page.changes.len() < max && from < last {
        let upto = last.min(from + 1 + (max / CHANGES_PER_RECORD_TYPICAL) as u64);
        for (seq, bytes) in stream.read_between(from, upto)? {
            let changes = record_changes(seq, &bytes)?;
            let skip = if seq == after.seq && after.index != Position::WHOLE {
                after.index as usize + 1
            } else {
                0
            };
            let n = changes.len();
            for (i, change) in changes.into_iter().enumerate().skip(skip) {
                if page.changes.len() == max {
                    return Ok(true);
                }
                let index = if i + 1 == n {
                    Position::WHOLE
                } else {
                    u32::try_from(i).unwrap_or(Position::WHOLE - 1)
                };
                page.next = Position { seq, index };
                page.changes.push((page.next, change));
            }
            page.next = Position::after_record(seq);
        }
        from = upto;
    }
    Ok(false)
}

/// The changes of record `seq` of the stream, `bytes` as stored.
fn record_changes(seq: u64, bytes: &[u8]) -> Result<Vec<Change>, StorageError> {
    let corrupt = |e: codec::DecodeError| StorageError::Corrupt {
        stream: names::CHANGES.to_owned(),
        seq,
        reason: e.to_string(),
    };
    let record: ChangeRecord = codec::decode(bytes).map_err(corrupt)?;
    record.changes().map_err(corrupt)
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

    /// Numbers the next record after `last` (and after what the stream has trimmed) instead
    /// of after what the stream holds now: recovery's own count, which leaves out a torn
    /// last record it is about to drop.
    pub fn continue_after(&mut self, last: u64) {
        self.next_seq = last.max(self.first_kept - 1) + 1;
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
