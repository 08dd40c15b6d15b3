//! [`SledKv`]: the [`Kv`] seam over a sled 0.34.7 database in a directory.
//!
//! `sync` is sled's `flush` (which writes sled's buffers and calls `sync_file_range`: that
//! neither flushes the drive's write cache nor the file's metadata, sled#1452) followed by our
//! own `fdatasync` of sled's data file, and an fsync of every file sled wrote under `blobs/`
//! since the last sync: so a sync survives a power cut and not only a `kill -9`.
//!
//! Once a write or sync of a database failed, no sled database of the process is closed
//! ([`KeptOpen`]).

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::kv::{Change, Kv, KvTree, Pair, Pairs};
use crate::error::StorageError;

/// Keeps sled databases from ever closing once a write or sync of one failed. sled 0.34
/// flushes again when it closes (the last handle of a tree, then of the database, dropped):
/// that flush never returns after a failed write of a large value (the failed blob file keeps
/// its place in sled's IO buffer, so every later flush waits for it: a `serve` whose disk
/// filled up hung at its exit), and the close's own fsync panics on a disk whose fsyncs fail.
/// Every [`SledKv`] and its trees share one of these, holding a handle of the database; when
/// the last of them goes after any write or sync of the process failed (this database's,
/// another group's, the superblock's or the Raft marks'), that handle is leaked instead of
/// dropped, so the database stays open until the process exits, and the process (whose store
/// halts) is restarted to recover from what is durable. This process syncs a failed database
/// no more; sled's own background flusher may still try to. A failed read poisons nothing: it
/// writes nothing.
struct KeptOpen {
    db: sled::Db,
    /// A write or sync of this database failed.
    failed: std::sync::atomic::AtomicBool,
}

/// Whether a write or sync of any sled database of this process failed (see [`KeptOpen`]).
static ANY_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl KeptOpen {
    /// `e` of a write or sync as a storage error, the database kept open from now on.
    fn failed(&self, e: impl std::fmt::Display) -> StorageError {
        keep_every_db_open();
        if !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tracing::warn!(
                "a write or sync of the sled database failed: it stays open until the process \
                 exits (closing it would flush it again)"
            );
        }
        StorageError::Io(e.to_string())
    }

    /// Refuses a sync once a write or sync has failed: sled 0.34's flush may never return then.
    fn check(&self) -> Result<(), StorageError> {
        if self.failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StorageError::Io(
                "an earlier write or sync of this sled database failed: it is not synced again \
                 (its flush may never return)"
                    .into(),
            ));
        }
        Ok(())
    }
}

impl Drop for KeptOpen {
    fn drop(&mut self) {
        if ANY_FAILED.load(std::sync::atomic::Ordering::SeqCst) {
            std::mem::forget(self.db.clone());
        }
    }
}

/// From now on no sled database of this process is closed: a write or fsync on its disk failed
/// (see [`KeptOpen`]).
pub(crate) fn keep_every_db_open() {
    ANY_FAILED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// A failed read, or a tree's open (an error that wrote nothing), as a storage error.
fn read_err(e: sled::Error) -> StorageError {
    StorageError::Io(e.to_string())
}

/// The file sled 0.34 keeps its log and pages in, under the database's directory.
pub(crate) const SLED_DATA_FILE: &str = "db";

/// Opens the sled database under `dir` (no retry).
pub fn open_db(dir: &Path) -> Result<sled::Db, StorageError> {
    open_db_cached(dir, SLED_CACHE_BYTES)
}

/// sled's page cache per database (its own default: 1 GiB).
pub const SLED_CACHE_BYTES: u64 = 1 << 30;

/// [`open_db`] with a page cache of `cache_bytes` (a cluster node's groups share one budget).
pub fn open_db_cached(dir: &Path, cache_bytes: u64) -> Result<sled::Db, StorageError> {
    sled::Config::new()
        .path(dir)
        .mode(sled::Mode::HighThroughput)
        .cache_capacity(cache_bytes)
        .open()
        .map_err(|e| StorageError::Open {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })
}

/// sled 0.34 writes a message over this many bytes (a quarter of its default 512 KiB segment)
/// as a blob file: a value, or a whole leaf written again at a split or consolidation.
pub(crate) const BLOB_THRESHOLD: usize = 512 * 1024 / 4;

/// The most items a sled 0.34 leaf holds, whatever their size (it splits once past 16).
pub(crate) const LEAF_ITEMS_MAX: usize = 17;

/// sled 0.34 keeps a message over [`BLOB_THRESHOLD`] (a big checkpoint, a large group commit as
/// one Raft entry, a leaf of large values) in a file of its own under `blobs/`,
/// written without an fsync: its flush does not cover them. So a sync also fsyncs every blob
/// file written since the last sync (by modification time, with a margin for the clock's
/// granularity), and the `blobs/` directory (for the new names).
#[derive(Default)]
pub(crate) struct BlobSync {
    last: std::sync::Mutex<Option<std::time::SystemTime>>,
}

impl BlobSync {
    /// Fsyncs the blob files of the sled database in `dir` written since the last call.
    pub(crate) fn sync(&self, dir: &Path) -> std::io::Result<()> {
        let blobs = dir.join(SLED_BLOBS_DIR);
        if !blobs.is_dir() {
            return Ok(());
        }
        let started = std::time::SystemTime::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let since = last.map(|t| t - Duration::from_secs(2));
        // sled writes a blob once, as a new file: a directory unchanged since the last sync
        // (its mtime) holds no blob to sync (most syncs: nothing over the threshold was written).
        if let (Some(since), Ok(m)) = (since, blobs.metadata().and_then(|m| m.modified()))
            && m < since
        {
            *last = Some(started);
            return Ok(());
        }
        for entry in std::fs::read_dir(&blobs)? {
            let entry = entry?;
            // A blob removed meanwhile (its value replaced or deleted, a purged Raft entry)
            // needs no sync.
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if !meta.is_file() {
                continue;
            }
            let fresh = match (since, meta.modified()) {
                (Some(since), Ok(m)) => m >= since,
                _ => true,
            };
            if fresh {
                match std::fs::File::open(entry.path()).and_then(|f| f.sync_data()) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        std::fs::File::open(&blobs)?.sync_all()?;
        *last = Some(started);
        Ok(())
    }
}

/// sled's directory of large values.
pub(crate) const SLED_BLOBS_DIR: &str = "blobs";

/// A sled database as a [`Kv`]; see the module docs.
pub struct SledKv {
    db: sled::Db,
    /// Shared with its trees: keeps the database open after a failure (see [`KeptOpen`]).
    open: Arc<KeptOpen>,
    /// sled's data file (`{dir}/db`), synced after every flush.
    data_file: std::fs::File,
    dir: std::path::PathBuf,
    /// sled's files of large values, synced with the log.
    blobs: BlobSync,
}

impl SledKv {
    /// The database `db`, whose files are under `dir`.
    pub fn over(db: sled::Db, dir: &Path) -> Result<SledKv, StorageError> {
        let path = dir.join(SLED_DATA_FILE);
        let data_file = std::fs::File::open(&path).map_err(|e| StorageError::Open {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(SledKv {
            open: Arc::new(KeptOpen {
                db: db.clone(),
                failed: std::sync::atomic::AtomicBool::new(false),
            }),
            db,
            data_file,
            dir: dir.to_owned(),
            blobs: BlobSync::default(),
        })
    }

    /// Opens (or creates) the database under `dir` with a page cache of `cache_bytes`,
    /// retrying a busy lock for up to `lock_wait` (sled releases its lock from a background
    /// thread a little after the last handle of a previous instance went, in this process or a
    /// dying one).
    pub fn open(dir: &Path, cache_bytes: u64, lock_wait: Duration) -> Result<SledKv, StorageError> {
        std::fs::create_dir_all(dir).map_err(|e| StorageError::Open {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        let deadline = std::time::Instant::now() + lock_wait;
        let db = loop {
            match open_db_cached(dir, cache_bytes) {
                Err(StorageError::Open { reason, .. })
                    if reason.contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other?,
            }
        };
        SledKv::over(db, dir)
    }

    /// The directory of the database's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

struct SledTree {
    tree: sled::Tree,
    open: Arc<KeptOpen>,
}

fn bound(b: Bound<&[u8]>) -> Bound<sled::IVec> {
    match b {
        Bound::Included(k) => Bound::Included(sled::IVec::from(k)),
        Bound::Excluded(k) => Bound::Excluded(sled::IVec::from(k)),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl KvTree for SledTree {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.tree.get(key).map_err(read_err)?.map(|v| v.to_vec()))
    }

    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        self.tree
            .insert(key, value)
            .map_err(|e| self.open.failed(e))?;
        Ok(())
    }

    fn remove(&self, key: &[u8]) -> Result<(), StorageError> {
        self.tree.remove(key).map_err(|e| self.open.failed(e))?;
        Ok(())
    }

    fn insert_if_absent(&self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        match self
            .tree
            .compare_and_swap(key, None::<&[u8]>, Some(value))
            .map_err(|e| self.open.failed(e))?
        {
            Ok(()) => Ok(None),
            Err(cas) => Ok(Some(cas.current.map(|v| v.to_vec()).unwrap_or_default())),
        }
    }

    fn range(&self, from: Bound<&[u8]>, to: Bound<&[u8]>) -> Result<Pairs, StorageError> {
        self.tree
            .range::<sled::IVec, _>((bound(from), bound(to)))
            .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(read_err))
            .collect()
    }

    fn visit_range(
        &self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        each: &mut super::kv::PairVisitor<'_>,
    ) -> Result<(), StorageError> {
        for pair in self.tree.range::<sled::IVec, _>((bound(from), bound(to))) {
            let (key, value) = pair.map_err(read_err)?;
            each(&key, &value)?;
        }
        Ok(())
    }

    fn apply(&self, changes: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for (k, v) in changes {
            match v {
                Some(v) => batch.insert(k.as_slice(), v.as_slice()),
                None => batch.remove(k.as_slice()),
            }
        }
        self.tree
            .apply_batch(batch)
            .map_err(|e| self.open.failed(e))
    }

    fn is_empty(&self) -> Result<bool, StorageError> {
        Ok(self.tree.is_empty())
    }

    fn first_after(&self, key: &[u8]) -> Result<Option<Pair>, StorageError> {
        self.tree
            .range::<&[u8], _>((Bound::Excluded(key), Bound::Unbounded))
            .next()
            .transpose()
            .map_err(read_err)
            .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())))
    }

    fn last(&self) -> Result<Option<Pair>, StorageError> {
        Ok(self
            .tree
            .last()
            .map_err(read_err)?
            .map(|(k, v)| (k.to_vec(), v.to_vec())))
    }
}

impl Kv for SledKv {
    fn tree(&self, name: &str) -> Result<Arc<dyn KvTree>, StorageError> {
        Ok(Arc::new(SledTree {
            tree: self.db.open_tree(name).map_err(read_err)?,
            open: self.open.clone(),
        }))
    }

    fn tree_names(&self) -> Result<Vec<String>, StorageError> {
        Ok(self
            .db
            .tree_names()
            .into_iter()
            .map(|n| String::from_utf8_lossy(&n).into_owned())
            .filter(|n| !n.starts_with("__sled"))
            .collect())
    }

    fn transaction(&self, changes: &[Change]) -> Result<(), StorageError> {
        use sled::Transactional;
        let mut names: Vec<&str> = changes.iter().map(|c| c.tree.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let trees = names
            .iter()
            .map(|n| self.db.open_tree(n).map_err(read_err))
            .collect::<Result<Vec<_>, _>>()?;
        trees
            .as_slice()
            .transaction(|views| {
                for c in changes {
                    let i = names.binary_search(&c.tree.as_str()).unwrap_or_default();
                    match &c.value {
                        Some(v) => views[i].insert(c.key.as_slice(), v.as_slice())?,
                        None => views[i].remove(c.key.as_slice())?,
                    };
                }
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|e| self.open.failed(format!("transaction: {e:?}")))
    }

    fn sync(&self) -> Result<(), StorageError> {
        self.open.check()?;
        let _timed = super::stall::syncing();
        self.db.flush().map_err(|e| self.open.failed(e))?;
        // The large values first: the data file points to them. This narrows, but does not
        // close, the window for a durable pointer to a blob that is not: sled's flush has
        // already pushed the data file's pages out (`sync_file_range`), so a power cut before
        // the blob's fsync can keep the pointer and lose the blob (sled then skips that write
        // and keeps later ones; a Raft start cuts such a tail, `raft::marks`).
        self.blobs.sync(&self.dir).map_err(|e| {
            self.open
                .failed(format!("fsync of the log's large values: {e}"))
        })?;
        self.data_file
            .sync_data()
            .map_err(|e| self.open.failed(format!("fdatasync of the log: {e}")))?;
        Ok(())
    }

    fn as_sled(&self) -> Option<sled::Db> {
        Some(self.db.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sled removes a blob file when its value goes (a replaced checkpoint, a Raft entry
    /// purged behind a snapshot), at any moment: a sync that lists the blob directory while
    /// that happens skips the file that went, instead of failing the sync (and with it the
    /// node's Raft log, which once stopped a follower's Raft for good).
    #[test]
    fn blob_sync_skips_blobs_removed_under_it() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let blobs = dir.path().join(SLED_BLOBS_DIR);
        std::fs::create_dir_all(&blobs).expect("mkdir");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (blobs, stop) = (blobs.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let path = blobs.join(n.to_string());
                    std::fs::write(&path, b"value").expect("write a blob");
                    std::fs::remove_file(&path).expect("remove it");
                    n += 1;
                }
                n
            })
        };
        let sync = BlobSync::default();
        for _ in 0..2_000 {
            sync.sync(dir.path())
                .expect("a sync while blobs come and go");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(
            churn.join().expect("the churn thread") > 0,
            "blobs came and went"
        );
        // A blob that stays is synced and the directory too: no error either.
        std::fs::write(blobs.join("kept"), b"value").expect("write");
        sync.sync(dir.path()).expect("a sync");
    }

    #[test]
    fn a_tree_ranges_applies_and_claims() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let kv = SledKv::open(dir.path(), 16 << 20, Duration::ZERO).expect("open");
        let t = kv.tree("t").expect("tree");
        for i in 1u64..=5 {
            t.insert(&i.to_be_bytes(), b"v").expect("insert");
        }
        let keys = |t: &Arc<dyn KvTree>| -> Vec<u64> {
            t.pairs()
                .expect("pairs")
                .into_iter()
                .map(|(k, _)| u64::from_be_bytes(k.try_into().expect("8 bytes")))
                .collect()
        };
        let two = 2u64.to_be_bytes();
        let four = 4u64.to_be_bytes();
        assert_eq!(
            t.range(Bound::Excluded(&two[..]), Bound::Included(&four[..]))
                .expect("range")
                .len(),
            2
        );
        assert_eq!(t.remove_upto(&two).expect("remove"), 2);
        assert_eq!(keys(&t), vec![3, 4, 5]);
        assert_eq!(t.remove_from(&four).expect("remove"), 2);
        assert_eq!(keys(&t), vec![3]);
        assert_eq!(t.insert_if_absent(b"c", b"h1").expect("claim"), None);
        assert_eq!(
            t.insert_if_absent(b"c", b"h2").expect("claim"),
            Some(b"h1".to_vec())
        );
        kv.transaction(&[
            Change {
                tree: "a".into(),
                key: b"k".to_vec(),
                value: Some(b"1".to_vec()),
            },
            Change {
                tree: "t".into(),
                key: b"c".to_vec(),
                value: None,
            },
        ])
        .expect("transaction");
        assert_eq!(t.get(b"c").expect("get"), None);
        assert_eq!(
            kv.tree("a").expect("tree").get(b"k").expect("get"),
            Some(b"1".to_vec())
        );
        assert!(kv.tree_names().expect("names").contains(&"a".to_owned()));
        kv.sync().expect("sync");
    }
}
