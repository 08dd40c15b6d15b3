//! [`SledSink`]: the log of a single node in a sled 0.34.7 database in the data dir: a
//! [`KvSink`] over [`SledKv`] (sled's `flush`, then `fdatasync`, per group commit), with the two
//! superblock copies beside sled's files (see [`superblock`](super::superblock)) and the
//! evidence of a damaged start kept.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::kv::Kv;
use super::kv_sink::KvSink;
use super::sink::{Claim, LogSink, StreamSink};
use super::sled_kv::{SLED_BLOBS_DIR, SLED_CACHE_BYTES, SLED_DATA_FILE, SledKv};
use super::superblock::{Marks, SuperblockFiles, SuperblockRead};
use crate::error::StorageError;

/// The log of a single node in a sled database.
pub struct SledSink {
    log: KvSink,
    superblock: SuperblockFiles,
    /// The superblock as found when this sink opened.
    superblock_read: SuperblockRead,
    /// The data dir.
    dir: std::path::PathBuf,
}

impl SledSink {
    /// Opens (or creates) the database under `dir`. sled releases its file lock from a
    /// background thread a little after the last handle of a previous instance is dropped (in
    /// this process or a dying one): a busy lock is retried for up to `lock_wait`.
    ///
    /// sled rewrites its files when it opens them: past the first message that fails its
    /// checksum, everything is wiped as a torn tail. So the files are first copied to
    /// `{dir}/pre-open/` (the evidence, should recovery find the log damaged: see
    /// [`LogSink::keep_evidence`]).
    pub fn open(dir: &Path, lock_wait: Duration) -> Result<SledSink, StorageError> {
        SledSink::open_inner(dir, lock_wait, true)
    }

    /// [`SledSink::open`] without copying the files first (a tool that opens a copy).
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
        let kv = SledKv::open(
            dir,
            SLED_CACHE_BYTES,
            deadline.saturating_duration_since(Instant::now()),
        )?;
        let (superblock, superblock_read) = SuperblockFiles::open(dir)?;
        Ok(SledSink {
            log: KvSink::new(Arc::new(kv))?,
            superblock,
            superblock_read,
            dir: dir.to_owned(),
        })
    }
}

impl LogSink for SledSink {
    fn stream(&self, name: &str) -> Result<Arc<dyn StreamSink>, StorageError> {
        self.log.stream(name)
    }

    fn stream_names(&self) -> Result<Vec<String>, StorageError> {
        self.log.stream_names()
    }

    fn checkpoint(&self, stream: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.log.checkpoint(stream)
    }

    fn put_checkpoint(&self, stream: &str, blob: &[u8]) -> Result<(), StorageError> {
        self.log.put_checkpoint(stream, blob)
    }

    fn claim(&self, key: &str, holder: &[u8]) -> Result<Claim, StorageError> {
        self.log.claim(key, holder)
    }

    fn unclaim(&self, key: &str) -> Result<(), StorageError> {
        self.log.unclaim(key)
    }

    fn claims(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        self.log.claims()
    }

    fn set_claim_aside(&self, key: &str) -> Result<(), StorageError> {
        self.log.set_claim_aside(key)
    }

    fn claims_set_aside(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        self.log.claims_set_aside()
    }

    fn superblock(&self) -> Result<SuperblockRead, StorageError> {
        Ok(self.superblock_read.clone())
    }

    fn put_superblock(&self, marks: &Marks) -> Result<(), StorageError> {
        self.superblock.write(marks)
    }

    fn sync(&self) -> Result<(), StorageError> {
        self.log.sync()
    }

    fn kv(&self) -> Option<Arc<dyn Kv>> {
        self.log.kv()
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
}
