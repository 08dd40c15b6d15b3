//! Log integrity: what recovery (and `boxoffice check-log`) checks, and what it does about it.
//!
//! The promise: after any restart either every acknowledged record of every stream is present,
//! or the engine refuses to start and names what is missing or damaged. The evidence:
//! - every record carries a CRC32 of its payload ([`codec`]);
//! - every stream is numbered 1, 2, 3, … with no gaps (records a checkpoint covers are compacted
//!   away, so a stream reads as its checkpoint's seq, then seq + 1, seq + 2, …);
//! - the superblock ([`crate::store::superblock`]) holds each stream's high-water mark and the
//!   number of sold-seat claims, written after every durable commit and before its replies.
//!
//! So a stream that ends below its mark, skips a number, holds a record that fails its checksum
//! or does not fit the state, a checkpoint that does not decode, fewer claims than the superblock
//! counted, or a claim that disagrees with the orders is [`Damage`]. The engine opened in
//! [`RecoveryMode::Strict`] (the default) refuses to start on any of it;
//! [`RecoveryMode::AcceptDamage`] (`serve --accept-damage REPORT_FILE`) starts from what is
//! there and lists what it found and did; [`RecoveryMode::Verify`] (`check-log`) writes nothing.
//!
//! What is *not* damage, because the superblock proves it was never acknowledged: a last record
//! past the stream's mark that fails its checksum (a torn write: dropped), and a sold-seat claim
//! with no confirm behind it while every stream is whole (a crash between the claim and its
//! record: the claim is set aside in its own table, never deleted).

use serde::Serialize;

use crate::codec;
use crate::error::StorageError;
use crate::store::{LogSink, Marks};

/// How recovery treats damage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecoveryMode {
    /// Refuse to start on any damage (the default).
    #[default]
    Strict,
    /// Start from what is there; report what was found and done (an operator's explicit choice).
    AcceptDamage,
    /// Read and check only: write nothing (offline `check-log`).
    Verify,
}

/// One thing wrong with a log. `Display` names the stream, the sequence numbers and the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Damage {
    /// The data dir holds a log but neither superblock copy.
    SuperblockMissing,
    /// Both superblock copies fail to verify.
    SuperblockDamaged {
        /// Each copy and why.
        copies: Vec<String>,
    },
    /// A stream ends below its high-water mark: acknowledged records are gone.
    Missing {
        /// The stream.
        stream: String,
        /// First missing sequence number.
        from: u64,
        /// Last missing sequence number (the mark).
        to: u64,
    },
    /// Sequence numbers are missing inside a stream.
    Gap {
        /// The stream.
        stream: String,
        /// First missing sequence number.
        from: u64,
        /// Last missing sequence number.
        to: u64,
    },
    /// A record fails its checksum or does not decode.
    Record {
        /// The stream.
        stream: String,
        /// Its sequence number.
        seq: u64,
        /// Why.
        reason: String,
    },
    /// A record decodes but does not fit the state before it.
    Replay {
        /// The stream.
        stream: String,
        /// Its sequence number.
        seq: u64,
        /// Why.
        reason: String,
    },
    /// A stream's checkpoint does not decode.
    Checkpoint {
        /// The stream.
        stream: String,
        /// Why.
        reason: String,
        /// CRC32 of the damaged bytes (so that accepting this damage accepts this checkpoint
        /// only, not a later one).
        fingerprint: u32,
    },
    /// Fewer sold-seat claims than the superblock counted.
    ClaimsMissing {
        /// Claims the superblock counted.
        expected: u64,
        /// Claims found.
        found: u64,
    },
    /// A seat's claim names another hold than the order that sold it.
    ClaimMismatch {
        /// The claim key (`event/section/seat`).
        key: String,
        /// The hold the claim names.
        claimed_by: String,
        /// The hold whose order sold the seat.
        sold_to: String,
    },
    /// A sold-seat claim with no confirm behind it, in a log that lost records: a sale whose
    /// record may be gone (a fan may hold a ticket for this seat).
    OrphanClaim {
        /// The claim key.
        key: String,
        /// The hold it names.
        hold: String,
    },
}

impl Damage {
    /// The stream this damage is in, if it is in one (not the superblock or the claims).
    pub fn stream(&self) -> Option<&str> {
        match self {
            Damage::Missing { stream, .. }
            | Damage::Gap { stream, .. }
            | Damage::Record { stream, .. }
            | Damage::Replay { stream, .. }
            | Damage::Checkpoint { stream, .. } => Some(stream),
            _ => None,
        }
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::SuperblockMissing => write!(
                f,
                "superblock missing: the data dir holds a log but neither superblock.0 nor \
                 superblock.1"
            ),
            Damage::SuperblockDamaged { copies } => write!(
                f,
                "superblock damaged: no copy verifies ({})",
                copies.join("; ")
            ),
            Damage::Missing { stream, from, to } => write!(
                f,
                "stream `{stream}`: records at sequence {from} to {to} are missing \
                 (acknowledged up to {to}, the log ends at {})",
                from - 1
            ),
            Damage::Gap { stream, from, to } => write!(
                f,
                "stream `{stream}`: records at sequence {from} to {to} are missing (a gap)"
            ),
            Damage::Record {
                stream,
                seq,
                reason,
            } => write!(
                f,
                "stream `{stream}`: the record at sequence {seq} is damaged: {reason}"
            ),
            Damage::Replay {
                stream,
                seq,
                reason,
            } => write!(
                f,
                "stream `{stream}`: the record at sequence {seq} does not fit the state: {reason}"
            ),
            Damage::Checkpoint { stream, reason, .. } => write!(
                f,
                "stream `{stream}`: its checkpoint is damaged ({reason}): the records it covers \
                 were compacted away"
            ),
            Damage::ClaimsMissing { expected, found } => write!(
                f,
                "table `sold`: {found} sold-seat claims, {expected} were acknowledged"
            ),
            Damage::ClaimMismatch {
                key,
                claimed_by,
                sold_to,
            } => write!(
                f,
                "table `sold`: seat {key} is claimed by {claimed_by} but sold to {sold_to}"
            ),
            Damage::OrphanClaim { key, hold } => write!(
                f,
                "table `sold`: seat {key} is claimed by {hold}, whose confirm is not in the log \
                 (a sale whose record may be lost)"
            ),
        }
    }
}

/// One stream as recovery read it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StreamSummary {
    /// The stream.
    pub stream: String,
    /// The seq its checkpoint covers, if it has one.
    pub checkpoint: Option<u64>,
    /// Records read after the checkpoint.
    pub records: u64,
    /// The last seq present (checkpoint or record).
    pub last: u64,
    /// The superblock's high-water mark.
    pub acknowledged: u64,
}

/// Everything recovery found wrong (or merely noted), and what it did about it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Findings {
    /// Damage: refuses a strict start.
    pub damage: Vec<Damage>,
    /// What recovery changed because of what it found (accepting damage, dropping a torn tail,
    /// setting a claim aside, restoring a claim).
    pub actions: Vec<String>,
    /// Things worth knowing that are not damage (a superblock copy torn by a crash).
    pub notes: Vec<String>,
    /// Every stream read.
    pub streams: Vec<StreamSummary>,
    /// Sold-seat claims found.
    pub claims: u64,
    /// Sold-seat claims set aside before (by earlier recoveries).
    pub claims_set_aside: u64,
}

impl Findings {
    /// A one-paragraph summary of the damage, for an error message.
    pub fn summary(&self) -> String {
        const SHOWN: usize = 5;
        let mut out = self
            .damage
            .iter()
            .take(SHOWN)
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        if self.damage.len() > SHOWN {
            out.push_str(&format!("; and {} more", self.damage.len() - SHOWN));
        }
        out
    }
}

/// A stream's records read back for recovery.
pub(crate) struct Replay<T> {
    /// The checkpointed state and the seq it covers.
    pub checkpoint: Option<(u64, Vec<u8>)>,
    /// Records after the checkpoint that verify, in order.
    pub records: Vec<(u64, T)>,
    /// The seq the stream continues after: the highest seq present, or its mark if records
    /// up to the mark were lost (and that loss accepted): numbers are never used twice.
    pub last_seq: u64,
    /// Whether a torn last record was dropped.
    pub dropped_tail: bool,
}

impl Findings {
    /// Records damage at `from..=to` of `stream`, unless an operator accepted it before.
    pub(crate) fn damage_at(&mut self, marks: &Marks, stream: &str, from: u64, to: u64, d: Damage) {
        if marks.is_accepted(stream, from, to) {
            self.notes.push(format!("accepted earlier: {d}"));
        } else {
            self.damage.push(d);
        }
    }

    /// Records a checkpoint of `stream` whose `bytes` do not decode, unless an operator
    /// accepted this very checkpoint before.
    pub(crate) fn checkpoint_damage(
        &mut self,
        marks: &Marks,
        stream: &str,
        bytes: &[u8],
        reason: String,
    ) {
        let d = Damage::Checkpoint {
            stream: stream.to_owned(),
            reason,
            fingerprint: crc32fast::hash(bytes),
        };
        if marks.accepted_checkpoints.contains(&checkpoint_key(&d)) {
            self.notes.push(format!("accepted earlier: {d}"));
        } else {
            self.damage.push(d);
        }
    }
}

/// How [`Marks::accepted_checkpoints`] names an accepted damaged checkpoint.
pub(crate) fn checkpoint_key(d: &Damage) -> String {
    match d {
        Damage::Checkpoint {
            stream,
            fingerprint,
            ..
        } => format!("{stream}#{fingerprint:08x}"),
        other => other.to_string(),
    }
}

/// The checkpoint of stream `name`, if it has one that decodes (a damaged one is noted in
/// `found` and not used).
fn read_checkpoint(
    sink: &dyn LogSink,
    name: &str,
    marks: &Marks,
    found: &mut Findings,
) -> Result<Option<(u64, Vec<u8>)>, StorageError> {
    Ok(match sink.checkpoint(name)? {
        None => None,
        Some(bytes) => match codec::decode_borrowed::<(u64, &[u8])>(&bytes) {
            Ok((upto, blob)) => Some((upto, blob.to_vec())),
            Err(e) => {
                found.checkpoint_damage(marks, name, &bytes, e.to_string());
                None
            }
        },
    })
}

/// Notes in `found` the stream read (`summary`), and the records it lacks that were
/// acknowledged (past its last one there).
fn close_stream(summary: StreamSummary, marks: &Marks, found: &mut Findings) {
    let (name, present, acknowledged) = (&summary.stream, summary.last, summary.acknowledged);
    if present < acknowledged {
        let missing = Damage::Missing {
            stream: name.clone(),
            from: present + 1,
            to: acknowledged,
        };
        found.damage_at(marks, name, present + 1, acknowledged, missing);
    }
    found.streams.push(summary);
}

/// A record of `name` that does not decode, and is not a torn tail: damage.
fn bad_record(name: &str, marks: &Marks, found: &mut Findings, seq: u64, e: codec::DecodeError) {
    let bad = Damage::Record {
        stream: name.to_owned(),
        seq,
        reason: e.to_string(),
    };
    found.damage_at(marks, name, seq, seq, bad);
}

/// The last record of `name`, past its mark, does not decode: torn, never acknowledged.
fn torn_tail(name: &str, seq: u64, acknowledged: u64, e: codec::DecodeError, found: &mut Findings) {
    tracing::warn!(stream = name, seq, error = %e, "a torn last record");
    found.actions.push(format!(
        "stream `{name}`: dropped the torn last record at sequence {seq} (past the \
         acknowledged mark {acknowledged}: never acknowledged)"
    ));
}

/// Reads and checks a stream: its checkpoint, then every record after it, against the stream's
/// high-water mark in `marks`. Damage goes to `found` (and the bad record is skipped). A last
/// record past the mark that does not decode is a torn write (`dropped_tail`: the caller plans
/// its removal), but only if `marks` came from a valid superblock (`trusted`); without one,
/// nothing proves it was never acknowledged, and it is damage. Reading changes nothing.
/// `decode` turns a record's bytes into a `T` ([`codec::decode`]; for a stream nobody reads,
/// only the frame: [`codec::verify`]). A stream the log does not have (`stored` is false: the
/// superblock alone knows it) is read as empty, without creating it. Errors only if the sink
/// cannot be read at all.
pub(crate) fn read_stream<T>(
    sink: &dyn LogSink,
    name: &str,
    stored: bool,
    marks: &Marks,
    trusted: bool,
    found: &mut Findings,
    decode: impl Fn(&[u8]) -> Result<T, codec::DecodeError>,
) -> Result<Replay<T>, StorageError> {
    let acknowledged = marks.of(name);
    let checkpoint = read_checkpoint(sink, name, marks, found)?;
    let after = checkpoint.as_ref().map_or(0, |(s, _)| *s);
    let (mut expected, mut read, mut dropped_tail) = (after + 1, 0u64, false);
    let mut records = Vec::new();
    // A record that does not decode is damage, unless it is the stream's last (a torn tail,
    // if past the mark): judged when the next record, or the end, shows which it is.
    let mut failed: Option<(u64, codec::DecodeError)> = None;
    if stored {
        // Each record borrowed from the store as it is read: nothing copied but what decodes.
        sink.stream(name)?.visit_after(after, &mut |seq, value| {
            if let Some((bad, e)) = failed.take() {
                bad_record(name, marks, found, bad, e);
            }
            if seq > expected {
                let gap = Damage::Gap {
                    stream: name.to_owned(),
                    from: expected,
                    to: seq - 1,
                };
                found.damage_at(marks, name, expected, seq - 1, gap);
            }
            expected = seq.saturating_add(1);
            read += 1;
            match decode(value) {
                Ok(r) => records.push((seq, r)),
                Err(e) => failed = Some((seq, e)),
            }
            Ok(())
        })?;
    }
    if let Some((seq, e)) = failed {
        if trusted && seq > acknowledged {
            torn_tail(name, seq, acknowledged, e, found);
            dropped_tail = true;
            expected = seq;
        } else {
            bad_record(name, marks, found, seq, e);
        }
    }
    let present = expected - 1;
    let summary = StreamSummary {
        stream: name.to_owned(),
        checkpoint: checkpoint.as_ref().map(|(s, _)| *s),
        records: read,
        last: present,
        acknowledged,
    };
    close_stream(summary, marks, found);
    Ok(Replay {
        checkpoint,
        records,
        // Numbers are never used twice: after an accepted loss the stream goes on past the
        // mark (the lost range stays accepted).
        last_seq: present.max(acknowledged),
        dropped_tail,
    })
}
