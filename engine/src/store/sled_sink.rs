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
        let to = self.dir.join(format!("damaged-{}", unix_ms()));
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
        if !dir.is_dir() {
            return;
        }
        // Renamed at once (a later start's copy goes to `pre-open/` again), deleted off the
        // start's path: unlinking a copy of hundreds of MB takes tens of ms.
        let dropped = self.dir.join(format!("{PRE_OPEN_DROPPED}{}", unix_ms()));
        match std::fs::rename(&dir, &dropped) {
            Ok(()) => remove_dropped(vec![dropped]),
            Err(e) => {
                tracing::warn!(error = %e, "cannot move {} aside", dir.display());
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    tracing::warn!(error = %e, "cannot remove {}", dir.display());
                }
            }
        }
    }
}

/// Now, ms since the Unix epoch: what names a kept or dropped copy of the log.
fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// A copy in `pre-open/` a whole start no longer needs is renamed `pre-open-dropped-<ms>/`,
/// then deleted in the background (a process that exits first leaves it to the next start).
const PRE_OPEN_DROPPED: &str = "pre-open-dropped-";

/// Deletes `dirs` on a thread of its own (on the calling thread in a simulation). A dir
/// already gone is no error; with no thread to be had, the next start deletes them.
fn remove_dropped(dirs: Vec<std::path::PathBuf>) {
    let remove = move || {
        for dir in dirs {
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(error = %e, "cannot remove {}", dir.display());
                }
                _ => {}
            }
        }
    };
    if crate::rt::simulated() {
        return remove();
    }
    if let Err(e) = std::thread::Builder::new()
        .name("boxoffice-rm-copy".into())
        .spawn(remove)
    {
        tracing::warn!(error = %e, "no thread to delete a dropped copy; the next start does");
    }
}

/// The copies earlier starts dropped but did not get to delete (the process exited first).
fn dropped_copies(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(PRE_OPEN_DROPPED)
        })
        .map(|e| e.path())
        .collect()
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
    let leftovers = dropped_copies(dir);
    if !leftovers.is_empty() {
        remove_dropped(leftovers);
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
            copy_file(&entry.path(), &to.join(&name))?;
        } else if name == SLED_BLOBS_DIR && entry.file_type()?.is_dir() {
            std::fs::create_dir_all(to.join(&name))?;
            copy_sled_files_all(&entry.path(), &to.join(&name))?;
        }
    }
    Ok(())
}

/// Files at least this large are copied in parts, one per core.
const COPY_IN_PARTS_BYTES: u64 = 64 << 20;

/// Copies `from` to `to` as `std::fs::copy` does; a large file (sled's `db`: hundreds of MB at
/// a million records, copied before every start while nothing else can run) in parts side by
/// side, one per core.
fn copy_file(from: &Path, to: &Path) -> std::io::Result<()> {
    let len = std::fs::metadata(from)?.len();
    let parts = std::thread::available_parallelism().map_or(1, |n| n.get().min(8)) as u64;
    if len < COPY_IN_PARTS_BYTES || parts < 2 || crate::rt::simulated() {
        return std::fs::copy(from, to).map(|_| ());
    }
    copy_in_parts(from, to, len, parts)
}

/// Copies the first `len` bytes of `from` to a new `to` in `parts` ranges, each on its own
/// thread.
fn copy_in_parts(from: &Path, to: &Path, len: u64, parts: u64) -> std::io::Result<()> {
    let out = std::fs::File::create(to)?;
    out.set_len(len)?;
    out.set_permissions(std::fs::metadata(from)?.permissions())?;
    let part = len.div_ceil(parts);
    std::thread::scope(|s| {
        let copies: Vec<_> = (0..parts)
            .map(|i| {
                let (start, end) = ((i * part).min(len), ((i + 1) * part).min(len));
                s.spawn(move || copy_range(from, to, start, end))
            })
            .collect();
        copies.into_iter().try_for_each(|c| {
            c.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a copying thread panicked")))
        })
    })
}

/// Copies bytes `start..end` of `from` to the same place in `to` (which is long enough).
fn copy_range(from: &Path, to: &Path, start: u64, end: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let src = std::fs::File::open(from)?;
    let dst = std::fs::OpenOptions::new().write(true).open(to)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = start;
    while at < end {
        let want = usize::try_from(end - at).map_or(buf.len(), |n| n.min(buf.len()));
        let got = src.read_at(&mut buf[..want], at)?;
        if got == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{} ended at byte {at} while being copied", from.display()),
            ));
        }
        dst.write_all_at(&buf[..got], at)?;
        at += got as u64;
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

    #[test]
    fn a_file_copied_in_parts_is_the_same_file() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let from = dir.path().join("db");
        // Not a multiple of the parts or of the copy's buffer.
        let bytes: Vec<u8> = (0..(3u32 << 20) + 17)
            .map(|i| (i * 7 + i / 4099) as u8)
            .collect();
        std::fs::write(&from, &bytes).expect("write");
        for parts in [1, 2, 3, 8] {
            let to = dir.path().join(format!("copy-{parts}"));
            copy_in_parts(&from, &to, bytes.len() as u64, parts).expect("copied");
            assert!(std::fs::read(&to).expect("read") == bytes, "{parts} parts");
        }
        // A source shorter than it was said to be is an error, not a copy padded with zeros.
        let to = dir.path().join("copy-short");
        let err = copy_in_parts(&from, &to, bytes.len() as u64 + 100, 2).expect_err("short");
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        // The whole path: a small file is copied as it is.
        copy_file(&from, &dir.path().join("copy-small")).expect("copied");
        assert!(std::fs::read(dir.path().join("copy-small")).expect("read") == bytes);
    }
}
