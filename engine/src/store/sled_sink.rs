//! [`SledSink`]: the log in a sled 0.34.7 database in the data dir.
//!
//! | tree | key | value |
//! |---|---|---|
//! | one per stream (`catalog`, `section/{event}/{section}`, `ledger/{n}`, `waitlist`) | seq (u64 BE) | framed record |
//! | `checkpoints` | stream name | framed `(seq, state blob)` |
//! | `sold` | claim key | holder (hold id) |
//! | `sold_set_aside` | `{claim key}@{holder}` | holder: claims recovery set aside, kept as evidence |
//!
//! Beside sled's files: the two superblock copies (see [`superblock`](super::superblock)).
//!
//! `sync` is sled's `flush` (which writes sled's buffers and calls `sync_file_range`: that neither
//! flushes the drive's write cache nor the file's metadata, sled#1452) followed by our own
//! `fdatasync` of sled's data file, so a sync survives a power cut and not only a `kill -9`. One
//! of each per group commit.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::names;
use super::sink::{Claim, LogSink, StreamSink};
use super::superblock::{Marks, SuperblockFiles, SuperblockRead};
use crate::error::StorageError;

fn io(e: sled::Error) -> StorageError {
    StorageError::Io(e.to_string())
}

/// The file sled 0.34 keeps its log and pages in, under the database's directory.
const SLED_DATA_FILE: &str = "db";

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

/// The log in a sled database.
pub struct SledSink {
    db: sled::Db,
    checkpoints: sled::Tree,
    claims: sled::Tree,
    set_aside: sled::Tree,
    /// sled's data file (`{dir}/db`), synced after every flush.
    data_file: std::fs::File,
    /// `None`: a cluster node's log, which keeps none ([`SledSink::over`]).
    superblock: Option<SuperblockFiles>,
    /// The superblock as found when this sink opened.
    superblock_read: SuperblockRead,
    /// The data dir.
    dir: std::path::PathBuf,
    /// sled's files of large values, synced with the log.
    blobs: BlobSync,
}

/// sled 0.34 keeps a value over a quarter of its segment size (128 KiB by default: a big
/// checkpoint, a large group commit as one Raft entry) in a file of its own under `blobs/`,
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
        // (its mtime) holds no blob to sync (most syncs: no value over 128 KiB was written).
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

struct SledStream {
    name: String,
    tree: sled::Tree,
}

impl SledSink {
    /// Opens (or creates) the database under `dir`. sled releases its file lock from a
    /// background thread a little after the last handle of a previous instance is dropped (in
    /// this process or a dying one): a busy lock is retried for up to `lock_wait`.
    ///
    /// sled rewrites its files when it opens them: past the first message that fails its
    /// checksum, everything is wiped as a torn tail. So the files are first copied to
    /// `{dir}/pre-open/` (the evidence, should recovery find the log damaged: see
    /// [`LogSink::keep_evidence`]); recovery drops the copy once the log proves whole.
    pub fn open(dir: &Path, lock_wait: Duration) -> Result<SledSink, StorageError> {
        SledSink::open_inner(dir, lock_wait, true)
    }

    /// [`SledSink::open`] without the copy of the files as they were (for a log that is itself
    /// a copy, as `check-log` makes).
    pub fn open_without_evidence(
        dir: &Path,
        lock_wait: Duration,
    ) -> Result<SledSink, StorageError> {
        SledSink::open_inner(dir, lock_wait, false)
    }

    fn open_inner(
        dir: &Path,
        lock_wait: Duration,
        evidence: bool,
    ) -> Result<SledSink, StorageError> {
        std::fs::create_dir_all(dir).map_err(|e| StorageError::Open {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        let deadline = Instant::now() + lock_wait;
        let evidence = evidence && dir.join(SLED_DATA_FILE).is_file();
        if evidence {
            copy_before_open(dir, deadline)?;
        }
        let db = loop {
            match open_db(dir) {
                Err(StorageError::Open { reason, .. })
                    if reason.contains("could not acquire lock") && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other?,
            }
        };
        let (superblock, superblock_read) = SuperblockFiles::open(dir)?;
        SledSink::with_db(db, dir, Some(superblock), superblock_read)
    }

    /// The log in `db`, a cluster node's sled database already open on `dir`, which its Raft
    /// log and state machine share ([`crate::raft`]). Such a log keeps no superblock: its
    /// records come from the group's Raft log, which is the durable record of what was
    /// acknowledged (a node's copy that lost a tail re-applies it from there, or from a
    /// snapshot); recovery starts from no marks.
    pub fn over(db: sled::Db, dir: &Path) -> Result<SledSink, StorageError> {
        let none = SuperblockRead {
            marks: Some(Marks::default()),
            damaged_copies: vec![],
        };
        SledSink::with_db(db, dir, None, none)
    }

    fn with_db(
        db: sled::Db,
        dir: &Path,
        superblock: Option<SuperblockFiles>,
        superblock_read: SuperblockRead,
    ) -> Result<SledSink, StorageError> {
        let path = dir.join(SLED_DATA_FILE);
        let data_file = std::fs::File::open(&path).map_err(|e| StorageError::Open {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(SledSink {
            checkpoints: db.open_tree(names::CHECKPOINTS).map_err(io)?,
            claims: db.open_tree(names::CLAIMS).map_err(io)?,
            set_aside: db.open_tree(names::CLAIMS_SET_ASIDE).map_err(io)?,
            db,
            data_file,
            superblock,
            superblock_read,
            dir: dir.to_owned(),
            blobs: BlobSync::default(),
        })
    }
}

impl StreamSink for SledStream {
    fn name(&self) -> &str {
        &self.name
    }

    fn append(&self, seq: u64, bytes: &[u8]) -> Result<(), StorageError> {
        self.tree.insert(seq.to_be_bytes(), bytes).map_err(io)?;
        Ok(())
    }

    fn read_after(&self, after: u64) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let mut out = Vec::new();
        for item in self.tree.range((after + 1).to_be_bytes()..) {
            let (key, value) = item.map_err(io)?;
            let seq = <[u8; 8]>::try_from(key.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|_| StorageError::Corrupt {
                    stream: self.name.clone(),
                    seq: 0,
                    reason: format!("key of {} bytes is not a sequence number", key.len()),
                })?;
            out.push((seq, value.to_vec()));
        }
        Ok(out)
    }

    fn remove(&self, seq: u64) -> Result<(), StorageError> {
        self.tree.remove(seq.to_be_bytes()).map_err(io)?;
        Ok(())
    }

    fn remove_upto(&self, upto: u64) -> Result<usize, StorageError> {
        let mut batch = sled::Batch::default();
        let mut n = 0usize;
        for key in self.tree.range(..=upto.to_be_bytes()).keys() {
            batch.remove(key.map_err(io)?);
            n += 1;
            if n.is_multiple_of(10_000) {
                self.tree
                    .apply_batch(std::mem::take(&mut batch))
                    .map_err(io)?;
            }
        }
        self.tree.apply_batch(batch).map_err(io)?;
        Ok(n)
    }
}

impl LogSink for SledSink {
    fn stream(&self, name: &str) -> Result<Arc<dyn StreamSink>, StorageError> {
        Ok(Arc::new(SledStream {
            name: name.to_owned(),
            tree: self.db.open_tree(name).map_err(io)?,
        }))
    }

    fn stream_names(&self) -> Result<Vec<String>, StorageError> {
        let tables = [
            names::CHECKPOINTS,
            names::CLAIMS,
            names::CLAIMS_SET_ASIDE,
            names::PAYMENTS,
            names::PAYMENTS_BY_ID,
        ];
        Ok(self
            .db
            .tree_names()
            .into_iter()
            .map(|n| String::from_utf8_lossy(&n).into_owned())
            .filter(|n| {
                !tables.contains(&n.as_str())
                    && !n.starts_with("__sled")
                    && !n.starts_with(names::RAFT_TREES_PREFIX)
            })
            .collect())
    }

    fn checkpoint(&self, stream: &str) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self
            .checkpoints
            .get(stream.as_bytes())
            .map_err(io)?
            .map(|v| v.to_vec()))
    }

    fn put_checkpoint(&self, stream: &str, blob: &[u8]) -> Result<(), StorageError> {
        self.checkpoints
            .insert(stream.as_bytes(), blob)
            .map_err(io)?;
        Ok(())
    }

    fn claim(&self, key: &str, holder: &[u8]) -> Result<Claim, StorageError> {
        match self
            .claims
            .compare_and_swap(key.as_bytes(), None::<&[u8]>, Some(holder))
            .map_err(io)?
        {
            Ok(()) => Ok(Claim::Taken),
            Err(cas) if cas.current.as_deref() == Some(holder) => Ok(Claim::Already),
            Err(cas) => Ok(Claim::Refused(
                cas.current.map(|v| v.to_vec()).unwrap_or_default(),
            )),
        }
    }

    fn claims(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        entries(&self.claims)
    }

    fn unclaim(&self, key: &str) -> Result<(), StorageError> {
        self.claims.remove(key.as_bytes()).map_err(io)?;
        Ok(())
    }

    fn set_claim_aside(&self, key: &str) -> Result<(), StorageError> {
        if let Some(holder) = self.claims.get(key.as_bytes()).map_err(io)? {
            let aside = super::sink::set_aside_key(key, &holder);
            self.set_aside
                .insert(aside.as_bytes(), holder)
                .map_err(io)?;
            self.claims.remove(key.as_bytes()).map_err(io)?;
        }
        Ok(())
    }

    fn claims_set_aside(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        entries(&self.set_aside)
    }

    fn superblock(&self) -> Result<SuperblockRead, StorageError> {
        Ok(self.superblock_read.clone())
    }

    fn put_superblock(&self, marks: &Marks) -> Result<(), StorageError> {
        match &self.superblock {
            Some(s) => s.write(marks),
            None => Ok(()),
        }
    }

    fn sync(&self) -> Result<(), StorageError> {
        self.db.flush().map_err(io)?;
        self.data_file
            .sync_data()
            .map_err(|e| StorageError::Io(format!("fdatasync of the log: {e}")))?;
        self.blobs
            .sync(&self.dir)
            .map_err(|e| StorageError::Io(format!("fsync of the log's large values: {e}")))?;
        Ok(())
    }

    fn sled_db(&self) -> Option<sled::Db> {
        Some(self.db.clone())
    }

    fn keep_evidence(&self) -> Option<String> {
        let from = self.dir.join(PRE_OPEN);
        if !from.is_dir() {
            return None;
        }
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let to = self.dir.join(format!("damaged-{ms}"));
        match std::fs::rename(&from, &to) {
            Ok(()) => Some(to.display().to_string()),
            Err(e) => {
                tracing::error!(error = %e, "cannot keep the log's files as they were");
                Some(from.display().to_string())
            }
        }
    }

    fn drop_evidence(&self) {
        let dir = self.dir.join(PRE_OPEN);
        if dir.is_dir()
            && let Err(e) = std::fs::remove_dir_all(&dir)
        {
            tracing::warn!(error = %e, "cannot remove {}", dir.display());
        }
    }
}

/// Where [`SledSink::open`] copies sled's files before sled opens (and may rewrite) them.
pub const PRE_OPEN: &str = "pre-open";

/// Copies sled's files (everything in `dir` but our own: the superblock, ticket keys, earlier
/// copies) to `{dir}/pre-open/`, once no other instance holds sled's lock on `db`.
fn copy_before_open(dir: &Path, deadline: Instant) -> Result<(), StorageError> {
    let fail = |what: &str, e: std::io::Error| StorageError::Open {
        path: dir.display().to_string(),
        reason: format!("{what}: {e}"),
    };
    let db = std::fs::File::open(dir.join(SLED_DATA_FILE)).map_err(|e| fail("opening db", e))?;
    loop {
        match db.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StorageError::Open {
                    path: dir.display().to_string(),
                    reason: "could not acquire lock on db: another instance holds it".into(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(fail("locking db", e)),
        }
    }
    let to = dir.join(PRE_OPEN);
    if to.exists() {
        std::fs::remove_dir_all(&to).map_err(|e| fail("clearing pre-open", e))?;
    }
    std::fs::create_dir(&to).map_err(|e| fail("creating pre-open", e))?;
    copy_sled_files(dir, &to).map_err(|e| fail("copying the log before opening it", e))?;
    db.unlock().map_err(|e| fail("unlocking db", e))?;
    Ok(())
}

/// Whether `name` in a data dir is one of sled's own files (`db`, `conf`, `snap.*`).
fn is_sled_file(name: &str) -> bool {
    name == SLED_DATA_FILE || name == "conf" || name.starts_with("snap.")
}

/// sled's own dir of large values.
const SLED_BLOBS_DIR: &str = "blobs";

/// What a data dir takes on disk, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// The log: sled's files (`db`, `conf`, `snap.*`, `blobs/`) and the superblock.
    pub log: u64,
    /// Everything under the data dir (the log, ticket keys, kept copies of a damaged log).
    pub total: u64,
}

/// Walks `dir` (a missing dir takes 0 bytes): sizes of files, as `metadata().len()` says.
pub fn disk_usage(dir: &Path) -> DiskUsage {
    let mut usage = DiskUsage::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return usage;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let bytes = match entry.file_type() {
            Ok(t) if t.is_dir() => disk_usage(&entry.path()).total,
            Ok(_) => entry.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        };
        usage.total += bytes;
        if is_sled_file(&name)
            || name == SLED_BLOBS_DIR
            || super::superblock::FILES.contains(&name.as_str())
        {
            usage.log += bytes;
        }
    }
    usage
}

/// sled's own files and dirs: `db`, `conf`, `snap.*`, `blobs/`.
fn copy_sled_files(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_sled_file(&name) && entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(&name))?;
        } else if name == SLED_BLOBS_DIR && entry.file_type()?.is_dir() {
            std::fs::create_dir_all(to.join(&name))?;
            copy_sled_files_all(&entry.path(), &to.join(&name))?;
        }
    }
    Ok(())
}

fn copy_sled_files_all(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// Every (key, value) of a tree, keys as text.
fn entries(tree: &sled::Tree) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
    tree.iter()
        .map(|item| {
            let (k, v) = item.map_err(io)?;
            Ok((String::from_utf8_lossy(&k).into_owned(), v.to_vec()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_usage_tells_the_log_from_the_rest() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let write = |name: &str, n: usize| {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(path, vec![0u8; n]).expect("write");
        };
        write("db", 10);
        write("conf", 1);
        write("snap.0000001", 2);
        write("blobs/17", 4);
        write("superblock.0", 3);
        write("superblock.1", 3);
        write("ticket-signing.key", 5);
        write("damaged-1/db", 7);
        let usage = disk_usage(dir.path());
        assert_eq!(usage, DiskUsage { log: 23, total: 35 });
        assert_eq!(
            disk_usage(&dir.path().join("missing")),
            DiskUsage::default()
        );
    }

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
}
