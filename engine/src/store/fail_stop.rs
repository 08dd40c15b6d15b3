//! [`FailStopKv`]: a [`Kv`] that stops for good after its first failed sync (the fsync, or a
//! write the sync had to finish first, such as one that found the disk full).
//!
//! A sync that fails promises nothing about any write since the last good one, and a later
//! sync that succeeds does not bring those writes back: Linux may drop the dirty pages of a
//! failed `fsync` and mark them clean ("fsyncgate"). What this process has read or written
//! since then may not be what the disk keeps, so it must not go on: every later read, write
//! and sync of the store fails, until the process starts again and reads what is durable. A
//! cluster node opens its store through this ([`crate::raft::NodeDb`]): its Raft and its
//! engine then stop, the node leaves its group, and its supervisor starts it again.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::kv::{Change, Kv, KvTree, Pair, Pairs};
use crate::error::StorageError;

/// A [`Kv`] that refuses everything after its first failed sync; see the module docs.
pub struct FailStopKv {
    inner: Arc<dyn Kv>,
    failed: Arc<AtomicBool>,
}

impl FailStopKv {
    /// `inner`, stopping for good at its first failed sync.
    pub fn new(inner: Arc<dyn Kv>) -> FailStopKv {
        FailStopKv {
            inner,
            failed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether a sync has failed (everything fails from then on).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }
}

fn check(failed: &AtomicBool) -> Result<(), StorageError> {
    if failed.load(Ordering::SeqCst) {
        return Err(StorageError::Halted(
            "a sync of this store failed (a write it had to make durable, or the fsync): writes \
             since the last good one may be lost, so nothing is read or written until the \
             process starts again"
                .into(),
        ));
    }
    Ok(())
}

impl Kv for FailStopKv {
    fn tree(&self, name: &str) -> Result<Arc<dyn KvTree>, StorageError> {
        check(&self.failed)?;
        Ok(Arc::new(FailStopTree {
            inner: self.inner.tree(name)?,
            failed: self.failed.clone(),
        }))
    }

    fn tree_names(&self) -> Result<Vec<String>, StorageError> {
        check(&self.failed)?;
        self.inner.tree_names()
    }

    fn transaction(&self, changes: &[Change]) -> Result<(), StorageError> {
        check(&self.failed)?;
        self.inner.transaction(changes)
    }

    fn sync(&self) -> Result<(), StorageError> {
        check(&self.failed)?;
        self.inner.sync().inspect_err(|e| {
            if !self.failed.swap(true, Ordering::SeqCst) {
                tracing::error!(
                    error = %e,
                    "a sync of this store failed (a write it had to make durable, or the \
                     fsync): this store stops until a restart"
                );
            }
        })
    }

    fn sync_latency(&self) -> std::time::Duration {
        self.inner.sync_latency()
    }

    fn as_sled(&self) -> Option<sled::Db> {
        self.inner.as_sled()
    }
}

struct FailStopTree {
    inner: Arc<dyn KvTree>,
    failed: Arc<AtomicBool>,
}

impl KvTree for FailStopTree {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        check(&self.failed)?;
        self.inner.get(key)
    }

    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        check(&self.failed)?;
        self.inner.insert(key, value)
    }

    fn remove(&self, key: &[u8]) -> Result<(), StorageError> {
        check(&self.failed)?;
        self.inner.remove(key)
    }

    fn insert_if_absent(&self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        check(&self.failed)?;
        self.inner.insert_if_absent(key, value)
    }

    fn range(&self, from: Bound<&[u8]>, to: Bound<&[u8]>) -> Result<Pairs, StorageError> {
        check(&self.failed)?;
        self.inner.range(from, to)
    }

    fn apply(&self, changes: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), StorageError> {
        check(&self.failed)?;
        self.inner.apply(changes)
    }

    fn is_empty(&self) -> Result<bool, StorageError> {
        check(&self.failed)?;
        self.inner.is_empty()
    }

    fn last(&self) -> Result<Option<Pair>, StorageError> {
        check(&self.failed)?;
        self.inner.last()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SimKv;

    #[test]
    fn after_a_failed_sync_nothing_is_read_or_written_until_a_restart() {
        let disk = SimKv::new();
        let kv = FailStopKv::new(Arc::new(disk.clone()));
        let t = kv.tree("t").unwrap();
        t.insert(b"a", b"1").unwrap();
        kv.sync().unwrap();
        t.insert(b"b", b"2").unwrap();
        disk.fail_next_sync();
        assert!(kv.sync().is_err());
        assert!(kv.failed());
        // The store neither answers from what it may have lost nor takes new writes, and a
        // sync cannot succeed again.
        assert!(matches!(t.get(b"a"), Err(StorageError::Halted(_))));
        assert!(t.insert(b"c", b"3").is_err());
        assert!(kv.tree("u").is_err());
        assert!(kv.sync().is_err());
        // A restart (a new process over the same disk) reads what is durable.
        let again = FailStopKv::new(Arc::new(disk));
        let t = again.tree("t").unwrap();
        assert_eq!(t.get(b"a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(t.get(b"b").unwrap(), None);
        again.sync().unwrap();
    }
}
