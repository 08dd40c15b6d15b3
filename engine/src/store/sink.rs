//! The seam between the log and the bytes on a device: [`LogSink`].
//!
//! Everything above this trait (the flusher, recovery, the actors) speaks of streams, sequence
//! numbers, checkpoints and claims; only an implementation knows where they live. Each is a
//! [`KvSink`](super::KvSink) over a [`Kv`](super::Kv) store: [`SledSink`](super::SledSink) (the
//! data dir, sled 0.34, with its superblock files), [`MemorySink`](super::MemorySink) (in memory,
//! for tests and simulation: it can fail a write, fail a sync, or lose everything after the last
//! sync on command), and a cluster node's copy of the log (`KvSink` itself, over the node's
//! store).
//!
//! The contract every implementation keeps:
//! - Writes (`append`, `put_checkpoint`, `claim`, `set_claim_aside`, `remove_upto`) may be lost in
//!   a crash until a later [`LogSink::sync`] returns `Ok`; after that they survive.
//! - `put_superblock` is durable when it returns `Ok` (it is written after a good sync, so the
//!   marks it holds never run ahead of what the log holds).
//! - A `sync` that returns an error promises nothing about any write since the last good sync.
//! - `claim` is insert-if-absent: the first holder of a key keeps it.

use std::sync::Arc;

use super::superblock::{Marks, SuperblockRead};
use crate::error::StorageError;

/// The key a claim is set aside under: `{key}@{holder}`, so that the same seat set aside on two
/// restarts for two holders keeps both.
pub(crate) fn set_aside_key(key: &str, holder: &[u8]) -> String {
    format!("{key}@{}", String::from_utf8_lossy(holder))
}

/// What a [`LogSink::claim`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The key was free and is now claimed by the given holder.
    Taken,
    /// The key was already claimed by this same holder (a retry): not a second claim.
    Already,
    /// The key is claimed by another holder (whose value is given).
    Refused(Vec<u8>),
}

/// What [`StreamSink::visit_after`] gives each record to (sequence number, bytes); an error
/// stops the walk.
pub type RecordVisitor<'a> = dyn FnMut(u64, &[u8]) -> Result<(), StorageError> + 'a;

/// One log stream of a [`LogSink`]: records keyed by sequence number, in order.
pub trait StreamSink: Send + Sync {
    /// The stream's name (see [`names`](super::names)).
    fn name(&self) -> &str;
    /// Writes a record (durable after the next good sync).
    fn append(&self, seq: u64, bytes: &[u8]) -> Result<(), StorageError>;
    /// Writes a group commit's records of this stream (ascending sequence numbers), in as few
    /// writes as the store likes (a [`KvSink`](super::KvSink): one value per chunk of about
    /// 16 KiB). Nothing is durable until the next sync, as with `append`.
    fn append_batch(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), StorageError> {
        for (seq, bytes) in entries {
            self.append(*seq, bytes)?;
        }
        Ok(())
    }
    /// Every record with a sequence number above `after`, in order.
    fn read_after(&self, after: u64) -> Result<Vec<(u64, Vec<u8>)>, StorageError>;
    /// [`StreamSink::read_after`] record by record, each given to `each` borrowed where the
    /// store can lend it (recovery checks a stream without copying it).
    fn visit_after(&self, after: u64, each: &mut RecordVisitor<'_>) -> Result<(), StorageError> {
        for (seq, bytes) in self.read_after(after)? {
            each(seq, &bytes)?;
        }
        Ok(())
    }
    /// The records numbered above `after` and up to `upto`, in order.
    fn read_between(&self, after: u64, upto: u64) -> Result<Vec<(u64, Vec<u8>)>, StorageError>;

    /// The highest sequence number stored (0: none).
    fn last_seq(&self) -> Result<u64, StorageError>;

    /// Removes one record (a torn tail found by recovery).
    fn remove(&self, seq: u64) -> Result<(), StorageError>;
    /// Removes every record up to and including `upto` (covered by a durable checkpoint);
    /// returns how many went.
    fn remove_upto(&self, upto: u64) -> Result<usize, StorageError>;
}

/// Where the log lives. See the module docs for the contract.
pub trait LogSink: Send + Sync + 'static {
    /// A handle on the stream `name` (created empty if new).
    fn stream(&self, name: &str) -> Result<Arc<dyn StreamSink>, StorageError>;
    /// The names of every stream that exists.
    fn stream_names(&self) -> Result<Vec<String>, StorageError>;
    /// The latest checkpoint blob written for `stream`, if any.
    fn checkpoint(&self, stream: &str) -> Result<Option<Vec<u8>>, StorageError>;
    /// Writes (replaces) the checkpoint blob of `stream`.
    fn put_checkpoint(&self, stream: &str, blob: &[u8]) -> Result<(), StorageError>;
    /// Claims `key` for `holder` if nobody holds it (the sold-seat backstop).
    fn claim(&self, key: &str, holder: &[u8]) -> Result<Claim, StorageError>;
    /// Gives back a claim just taken (a cluster's state machine, when another claim of the same
    /// append is refused: all of an append's claims or none).
    fn unclaim(&self, key: &str) -> Result<(), StorageError>;
    /// Every claim, as (key, holder).
    fn claims(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError>;
    /// Moves a claim out of the backstop into the set-aside table (kept, never deleted): a claim
    /// recovery proved was never acknowledged (see [`crate::integrity`]).
    fn set_claim_aside(&self, key: &str) -> Result<(), StorageError>;
    /// Every claim set aside, as (key, holder).
    fn claims_set_aside(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError>;
    /// The superblock as it is now (see [`superblock`](super::superblock)).
    fn superblock(&self) -> Result<SuperblockRead, StorageError>;
    /// Writes the superblock; durable when it returns `Ok`.
    fn put_superblock(&self, marks: &Marks) -> Result<(), StorageError>;
    /// Makes every write so far durable. An error means none of them may be.
    fn sync(&self) -> Result<(), StorageError>;
    /// The store behind this sink, if it is a [`Kv`](super::Kv) (for the simulated payment
    /// provider's own trees beside the log, and for tools that inspect the data dir).
    fn kv(&self) -> Option<Arc<dyn super::kv::Kv>> {
        None
    }
    /// Recovery refused a damaged log: keeps the copy of the files as they were before this
    /// open (sled rewrites a damaged tail when it opens) where nothing overwrites it; returns
    /// where. `None`: this sink keeps no such copy.
    fn keep_evidence(&self) -> Option<String> {
        None
    }
    /// Recovery found the log whole (or accepted its damage): the copy is not needed.
    fn drop_evidence(&self) {}
    /// Whether this sink writes every record whole and keeps no marks of its own (a cluster
    /// node's store: each write atomic, the Raft log the durable record): a last record that
    /// does not decode was then not torn by a crash but damaged, and is never dropped as a
    /// torn write, whatever the marks say.
    fn atomic_records(&self) -> bool {
        false
    }
}
