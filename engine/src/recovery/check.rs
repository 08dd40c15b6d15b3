//! The checks recovery makes before it trusts the log: the superblock's marks, the format, and
//! every stream read against them ([`crate::integrity`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use super::report::{RecoveryReport, Repair};
use crate::codec;
use crate::error::StorageError;
use crate::integrity::{Damage, Findings, RecoveryMode, read_stream};
use crate::store::{LogSink, Marks, names};

/// Recovery's working state: what it found, what it will repair, how strict it is.
pub(crate) struct Check {
    /// Read only while the log is read: shared with forks, not copied.
    pub marks: Arc<Marks>,
    pub mode: RecoveryMode,
    pub found: Findings,
    pub(super) repairs: Vec<Repair>,
    /// Claims (key, holder) of sales whose records may be lost: withdrawn if damage is accepted.
    pub(super) orphans: Vec<(String, String)>,
    /// Claim keys accepted now (mismatches, orphans that could not be withdrawn).
    pub(super) accepted_claims: Vec<String>,
    /// Whether `marks` come from a valid superblock and the sink's records can be torn at
    /// all (else no tail may count as torn: [`LogSink::atomic_records`]).
    pub(super) trusted: bool,
    /// The streams the log has, listed once at the first read.
    pub(super) stored: Option<Arc<BTreeSet<String>>>,
    /// What accepted damage changed (places withdrawn, holds released for it), for the change
    /// stream.
    pub(super) changes: Vec<crate::changes::Change>,
}

impl Check {
    /// A check of `sink` against `marks` (a section restart passes the store's current marks).
    pub fn new(sink: &dyn LogSink, marks: Marks, mode: RecoveryMode) -> Check {
        Check {
            marks: Arc::new(marks),
            mode,
            found: Findings::default(),
            repairs: Vec::new(),
            orphans: Vec::new(),
            accepted_claims: Vec::new(),
            trusted: !sink.atomic_records(),
            stored: None,
            changes: Vec::new(),
        }
    }

    /// Lists the log's streams once (a fork shares the list).
    pub(super) fn list_stored(&mut self, sink: &dyn LogSink) -> Result<(), StorageError> {
        if self.stored.is_none() {
            self.stored = Some(Arc::new(sink.stream_names()?.into_iter().collect()));
        }
        Ok(())
    }

    /// A check of the same log against the same marks with nothing found yet, for streams
    /// read beside this one; what it finds is merged back with [`Check::absorb`]. The marks and
    /// the list of streams are shared, not copied (a start may read thousands of sections).
    pub(super) fn fork(&self) -> Check {
        Check {
            marks: self.marks.clone(),
            mode: self.mode,
            found: Findings::default(),
            repairs: Vec::new(),
            orphans: Vec::new(),
            accepted_claims: Vec::new(),
            trusted: self.trusted,
            stored: self.stored.clone(),
            changes: Vec::new(),
        }
    }

    /// Adds what a [`Check::fork`] found, after what this one found.
    pub(super) fn absorb(&mut self, fork: Check) {
        let found = fork.found;
        self.found.damage.extend(found.damage);
        self.found.actions.extend(found.actions);
        self.found.notes.extend(found.notes);
        self.found.streams.extend(found.streams);
        self.found.claims += found.claims;
        self.found.claims_set_aside += found.claims_set_aside;
        self.repairs.extend(fork.repairs);
        self.orphans.extend(fork.orphans);
        self.accepted_claims.extend(fork.accepted_claims);
        self.changes.extend(fork.changes);
    }

    /// Reads a stream, planning the removal of a torn tail.
    pub(super) fn read<T: serde::de::DeserializeOwned>(
        &mut self,
        sink: &dyn LogSink,
        name: &str,
        report: &mut RecoveryReport,
    ) -> Result<crate::integrity::Replay<T>, StorageError> {
        self.read_with(sink, name, report, codec::decode::<T>)
    }

    /// [`Check::read`] with the records' decoder given.
    pub(super) fn read_with<T>(
        &mut self,
        sink: &dyn LogSink,
        name: &str,
        report: &mut RecoveryReport,
        decode: impl Fn(&[u8]) -> Result<T, codec::DecodeError>,
    ) -> Result<crate::integrity::Replay<T>, StorageError> {
        self.list_stored(sink)?;
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
    pub(super) fn misfit(&mut self, stream: &str, seq: u64, reason: String) {
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
pub(super) fn read_marks(
    sink: &dyn LogSink,
    found: &mut Findings,
) -> Result<(Marks, bool), StorageError> {
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
pub(super) fn refuse_older_format(sink: &dyn LogSink) -> Result<(), StorageError> {
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

/// Streams nobody read (the superblock knows them, or sled has them, but no event or shard
/// does: an event the catalog lost, say): checked for what was acknowledged in them.
pub(super) fn check_unread_streams(
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
        if name == names::CHANGES {
            check_changes(sink, check, report)?;
            continue;
        }
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

/// Whether the log has a change stream to check (the superblock or sled knows it).
pub(super) fn has_changes(check: &Check) -> bool {
    check.marks.streams.contains_key(names::CHANGES)
        || check
            .stored
            .as_ref()
            .is_some_and(|s| s.contains(names::CHANGES))
}

/// The change stream, read by `WatchChanges`: checked here as every stream is (against its
/// mark, for gaps, and each record's frame: version and checksum), but its changes are not
/// decoded at start. Damage on disk fails the checksum; a record whose checksum holds but
/// whose changes do not decode (a bug, not the disk) is named `Corrupt` by the reader that
/// meets it. Decoding every change took 1.5 s of a 5.8 s start at a million records.
pub(super) fn check_changes(
    sink: &dyn LogSink,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<(), StorageError> {
    check.read_with(sink, names::CHANGES, report, |b| {
        codec::verify(b).map(|_| ())
    })?;
    Ok(())
}
