//! [`Kv`]: an ordered key-value store of named trees, durable once [`Kv::sync`] returns.
//!
//! sled's shape, as one seam under everything that keeps bytes on a node: the log
//! ([`KvSink`](super::KvSink)), a cluster node's Raft log and state machine
//! ([`crate::raft::NodeDb`]), and the simulated payment provider's record. Two implementations:
//! [`SledKv`](super::SledKv) (a sled database in a data dir, `fdatasync`ed) and
//! [`SimKv`](super::SimKv) (memory, with a disk's faults on command: lost unsynced writes,
//! torn tails, flipped bits, failed syncs, a full disk).
//!
//! The contract:
//! - a write is readable at once, and survives a crash only once a later `sync` returns `Ok`;
//! - a crash keeps what the last good sync covered, and possibly some later writes, in the
//!   order they were made (a prefix of them): never a later one without every earlier one;
//! - [`KvTree::apply`] and [`Kv::transaction`] are one write each: after a crash all of their
//!   changes are there or none;
//! - a `sync` that fails promises nothing about any write since the last good one.

use std::ops::Bound;
use std::sync::Arc;

use crate::error::StorageError;

/// A `(key, value)` pair.
pub type Pair = (Vec<u8>, Vec<u8>);

/// `(key, value)` pairs in key order.
pub type Pairs = Vec<Pair>;

/// One change of a [`Kv::transaction`]: `value` at `key` of `tree`, or the key removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The tree.
    pub tree: String,
    /// The key.
    pub key: Vec<u8>,
    /// The new value (`None`: removed).
    pub value: Option<Vec<u8>>,
}

/// What [`KvTree::visit_range`] gives each pair to (key, value); an error stops the walk.
pub type PairVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), StorageError> + 'a;

/// A store of named trees; see the module docs.
pub trait Kv: Send + Sync + 'static {
    /// The tree `name` (created empty if new).
    fn tree(&self, name: &str) -> Result<Arc<dyn KvTree>, StorageError>;
    /// The names of every tree that exists.
    fn tree_names(&self) -> Result<Vec<String>, StorageError>;
    /// Makes every change at once (all or none survive a crash), over any trees.
    fn transaction(&self, changes: &[Change]) -> Result<(), StorageError>;
    /// Makes every write so far durable. An error means none since the last good sync may be.
    fn sync(&self) -> Result<(), StorageError>;
    /// How long a sync takes on this store, if the caller should wait for it on its runtime's
    /// clock first (a simulated disk, and a slow one on command); zero for a real disk, whose
    /// sync takes its own time.
    fn sync_latency(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    /// The sled database behind this store, if it is one (tools and tests that inspect or
    /// damage a data dir on purpose).
    fn as_sled(&self) -> Option<sled::Db> {
        None
    }
}

/// One tree of a [`Kv`]: keys in byte order.
pub trait KvTree: Send + Sync {
    /// The value at `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;
    /// Writes `value` at `key`.
    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StorageError>;
    /// Removes `key`.
    fn remove(&self, key: &[u8]) -> Result<(), StorageError>;
    /// Writes `value` at `key` if nothing is there; else returns what is there (unchanged).
    fn insert_if_absent(&self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;
    /// The pairs whose keys lie between `from` and `to`, in order.
    fn range(&self, from: Bound<&[u8]>, to: Bound<&[u8]>) -> Result<Pairs, StorageError>;
    /// Several changes of this tree as one write (all or none survive a crash).
    fn apply(&self, changes: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), StorageError>;
    /// Whether the tree has no key.
    fn is_empty(&self) -> Result<bool, StorageError>;
    /// The pair with the greatest key.
    fn last(&self) -> Result<Option<Pair>, StorageError>;

    /// Each pair whose key lies between `from` and `to`, in order, given to `each` borrowed (a
    /// store that can lend its bytes lends them: no pair is copied, none kept).
    fn visit_range(
        &self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        each: &mut PairVisitor<'_>,
    ) -> Result<(), StorageError> {
        for (key, value) in self.range(from, to)? {
            each(&key, &value)?;
        }
        Ok(())
    }

    /// The first pair whose key is greater than `key`.
    fn first_after(&self, key: &[u8]) -> Result<Option<Pair>, StorageError> {
        Ok(self
            .range(Bound::Excluded(key), Bound::Unbounded)?
            .into_iter()
            .next())
    }

    /// Every pair, in order.
    fn pairs(&self) -> Result<Pairs, StorageError> {
        self.range(Bound::Unbounded, Bound::Unbounded)
    }

    /// Removes every key up to and including `upto` (in writes of at most 10,000 keys each);
    /// returns how many went.
    fn remove_upto(&self, upto: &[u8]) -> Result<usize, StorageError> {
        self.remove_upto_in_steps(upto, 10_000)
    }

    /// Removes every key up to and including `upto`, lowest first, in writes of at most `step`
    /// keys each (what a crash leaves is the keys above some point); returns how many went.
    fn remove_upto_in_steps(&self, upto: &[u8], step: usize) -> Result<usize, StorageError> {
        let mut keys = Vec::new();
        self.visit_range(Bound::Unbounded, Bound::Included(upto), &mut |k, _| {
            keys.push(k.to_vec());
            Ok(())
        })?;
        for chunk in keys.chunks(step.max(1)) {
            let changes: Vec<_> = chunk.iter().map(|k| (k.clone(), None)).collect();
            self.apply(&changes)?;
        }
        Ok(keys.len())
    }

    /// Removes every key from `from` on (one write); returns how many went.
    fn remove_from(&self, from: &[u8]) -> Result<usize, StorageError> {
        let keys = self.range(Bound::Included(from), Bound::Unbounded)?;
        let changes: Vec<_> = keys.iter().map(|(k, _)| (k.clone(), None)).collect();
        self.apply(&changes)?;
        Ok(keys.len())
    }
}
