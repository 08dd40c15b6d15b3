//! [`KvSink`]: the log over any [`Kv`] store.
//!
//! | tree | key | value |
//! |---|---|---|
//! | one per stream (`catalog`, `section/{event}/{section}`, `ledger/{n}`, `waitlist`) | seq (u64 BE) | framed record |
//! | `checkpoints` | stream name | framed `(seq, state blob)` |
//! | `sold` | claim key | holder (hold id) |
//! | `sold_set_aside` | `{claim key}@{holder}` | holder: claims recovery set aside, kept as evidence |
//!
//! It keeps no superblock: a cluster node's copy of the log needs none (the Raft log is the
//! durable record), and the single node's sinks add theirs ([`SledSink`](super::SledSink)
//! beside sled's files, [`MemorySink`](super::MemorySink) in memory).

use std::ops::Bound;
use std::sync::Arc;

use super::kv::{Kv, KvTree};
use super::names;
use super::sink::{Claim, LogSink, StreamSink};
use super::superblock::{Marks, SuperblockRead};
use crate::error::StorageError;

/// The log in a [`Kv`] store; see the module docs.
pub struct KvSink {
    kv: Arc<dyn Kv>,
    checkpoints: Arc<dyn KvTree>,
    claims: Arc<dyn KvTree>,
    set_aside: Arc<dyn KvTree>,
}

impl KvSink {
    /// The log in `kv`.
    pub fn new(kv: Arc<dyn Kv>) -> Result<KvSink, StorageError> {
        Ok(KvSink {
            checkpoints: kv.tree(names::CHECKPOINTS)?,
            claims: kv.tree(names::CLAIMS)?,
            set_aside: kv.tree(names::CLAIMS_SET_ASIDE)?,
            kv,
        })
    }

    /// The store under this log.
    pub fn store(&self) -> &Arc<dyn Kv> {
        &self.kv
    }
}

struct KvStream {
    name: String,
    tree: Arc<dyn KvTree>,
}

impl StreamSink for KvStream {
    fn name(&self) -> &str {
        &self.name
    }

    fn append(&self, seq: u64, bytes: &[u8]) -> Result<(), StorageError> {
        self.tree.insert(&seq.to_be_bytes(), bytes)
    }

    fn read_after(&self, after: u64) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        self.read_between(after, u64::MAX)
    }

    fn read_between(&self, after: u64, upto: u64) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let (after, upto) = (after.to_be_bytes(), upto.to_be_bytes());
        self.tree
            .range(Bound::Excluded(&after[..]), Bound::Included(&upto[..]))?
            .into_iter()
            .map(|(key, value)| {
                let seq = <[u8; 8]>::try_from(key.as_slice())
                    .map(u64::from_be_bytes)
                    .map_err(|_| StorageError::Corrupt {
                        stream: self.name.clone(),
                        seq: 0,
                        reason: format!("key of {} bytes is not a sequence number", key.len()),
                    })?;
                Ok((seq, value))
            })
            .collect()
    }

    fn remove(&self, seq: u64) -> Result<(), StorageError> {
        self.tree.remove(&seq.to_be_bytes())
    }

    fn last_seq(&self) -> Result<u64, StorageError> {
        Ok(self
            .tree
            .last()?
            .and_then(|(k, _)| <[u8; 8]>::try_from(k.as_slice()).ok())
            .map_or(0, u64::from_be_bytes))
    }

    fn remove_upto(&self, upto: u64) -> Result<usize, StorageError> {
        self.tree.remove_upto(&upto.to_be_bytes())
    }
}

/// Every (key, value) of a tree, keys as text.
fn entries(tree: &dyn KvTree) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
    Ok(tree
        .pairs()?
        .into_iter()
        .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
        .collect())
}

impl LogSink for KvSink {
    fn stream(&self, name: &str) -> Result<Arc<dyn StreamSink>, StorageError> {
        Ok(Arc::new(KvStream {
            name: name.to_owned(),
            tree: self.kv.tree(name)?,
        }))
    }

    fn stream_names(&self) -> Result<Vec<String>, StorageError> {
        let tables = [
            names::CHECKPOINTS,
            names::CLAIMS,
            names::CLAIMS_SET_ASIDE,
            names::PAYMENTS,
            names::PAYMENTS_BY_ID,
            names::TICKET_RING,
        ];
        Ok(self
            .kv
            .tree_names()?
            .into_iter()
            .filter(|n| !tables.contains(&n.as_str()) && !n.starts_with(names::RAFT_TREES_PREFIX))
            .collect())
    }

    fn checkpoint(&self, stream: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.checkpoints.get(stream.as_bytes())
    }

    fn put_checkpoint(&self, stream: &str, blob: &[u8]) -> Result<(), StorageError> {
        self.checkpoints.insert(stream.as_bytes(), blob)
    }

    fn claim(&self, key: &str, holder: &[u8]) -> Result<Claim, StorageError> {
        Ok(
            match self.claims.insert_if_absent(key.as_bytes(), holder)? {
                None => Claim::Taken,
                Some(current) if current == holder => Claim::Already,
                Some(current) => Claim::Refused(current),
            },
        )
    }

    fn claims(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        entries(self.claims.as_ref())
    }

    fn unclaim(&self, key: &str) -> Result<(), StorageError> {
        self.claims.remove(key.as_bytes())
    }

    fn set_claim_aside(&self, key: &str) -> Result<(), StorageError> {
        if let Some(holder) = self.claims.get(key.as_bytes())? {
            let aside = super::sink::set_aside_key(key, &holder);
            self.set_aside.insert(aside.as_bytes(), &holder)?;
            self.claims.remove(key.as_bytes())?;
        }
        Ok(())
    }

    fn claims_set_aside(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        entries(self.set_aside.as_ref())
    }

    fn superblock(&self) -> Result<SuperblockRead, StorageError> {
        Ok(SuperblockRead {
            marks: Some(Marks::default()),
            damaged_copies: vec![],
        })
    }

    fn put_superblock(&self, _marks: &Marks) -> Result<(), StorageError> {
        Ok(())
    }

    fn sync(&self) -> Result<(), StorageError> {
        self.kv.sync()
    }

    fn kv(&self) -> Option<Arc<dyn Kv>> {
        Some(self.kv.clone())
    }

    fn atomic_records(&self) -> bool {
        true
    }
}
