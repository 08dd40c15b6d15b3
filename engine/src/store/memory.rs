//! [`MemorySink`]: the log in memory, with faults on command.
//!
//! It keeps two copies of everything: what was written, and what was durable at the last good
//! [`sync`](LogSink::sync). A test (or a deterministic simulation) can
//! - fail the next write ([`MemorySink::fail_next_write`]) or a later one, or every write as on a
//!   full disk ([`MemorySink::fill_disk`]),
//! - fail the next sync ([`MemorySink::fail_next_sync`]) or a later one: everything written
//!   since the last good sync is then lost (as Linux may drop dirty pages after a failed fsync),
//! - and lose everything after the last good sync ([`MemorySink::lose_unsynced`]), as a power cut
//!   or `kill -9` would; an engine opened on the same sink afterwards recovers from what is left.
//!
//! A write fault counts every write (records, checkpoints, claims, compaction), in order. Every
//! good sync copies the tables: this sink is for tests and simulations, not for large logs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::sink::{Claim, LogSink, StreamSink};
use super::superblock::{Marks, SuperblockRead};
use crate::error::StorageError;

#[derive(Clone, Default)]
struct Tables {
    streams: BTreeMap<String, BTreeMap<u64, Vec<u8>>>,
    checkpoints: BTreeMap<String, Vec<u8>>,
    claims: BTreeMap<String, Vec<u8>>,
    set_aside: BTreeMap<String, Vec<u8>>,
}

#[derive(Default)]
struct State {
    written: Tables,
    durable: Tables,
}

/// A fault armed to fire on the `n`th next call (1: the very next).
#[derive(Default)]
struct Trigger(AtomicU64);

impl Trigger {
    fn arm(&self, nth: u64) {
        self.0.store(nth, Ordering::SeqCst);
    }

    /// Whether this call fires the fault.
    fn fires(&self) -> bool {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok_and(|n| n == 1)
    }
}

/// The log in memory; see the module docs. Used through an `Arc`, shared by the engines opened
/// on it one after another (a restart) and by the test that damages it.
#[derive(Default)]
pub struct MemorySink {
    shared: Arc<Shared>,
    faults: SyncFaults,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    fail_write: Trigger,
    /// Every write fails as on a full disk until freed.
    full: std::sync::atomic::AtomicBool,
    /// The superblock: durable as soon as it is written (it survives `lose_unsynced`).
    superblock: Mutex<Option<Marks>>,
}

struct MemoryStream {
    name: String,
    shared: Arc<Shared>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data: keep using it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self, change: impl FnOnce(&mut Tables)) -> Result<(), StorageError> {
        if self.fail_write.fires() {
            return Err(StorageError::Io("injected write failure".into()));
        }
        if self.full.load(Ordering::SeqCst) {
            return Err(StorageError::Io(
                "No space left on device (os error 28)".into(),
            ));
        }
        change(&mut self.lock().written);
        Ok(())
    }
}

/// The sink's own counters and faults (apart from the shared tables).
#[derive(Default)]
struct SyncFaults {
    fail_sync: Trigger,
    syncs: AtomicU64,
    failed_syncs: AtomicU64,
}

impl MemorySink {
    /// An empty log.
    pub fn new() -> Arc<MemorySink> {
        Arc::new(MemorySink::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    fn write(&self, change: impl FnOnce(&mut Tables)) -> Result<(), StorageError> {
        self.shared.write(change)
    }

    /// The next write fails (once).
    pub fn fail_next_write(&self) {
        self.shared.fail_write.arm(1);
    }

    /// The `nth` write from now fails (1: the next).
    pub fn fail_write_after(&self, nth: u64) {
        self.shared.fail_write.arm(nth);
    }

    /// From now on every write fails as on a full disk (`ENOSPC`), until [`MemorySink::free_disk`].
    pub fn fill_disk(&self) {
        self.shared.full.store(true, Ordering::SeqCst);
    }

    /// Writes succeed again (space was freed).
    pub fn free_disk(&self) {
        self.shared.full.store(false, Ordering::SeqCst);
    }

    /// The next sync fails (once); what it would have covered is not durable.
    pub fn fail_next_sync(&self) {
        self.faults.fail_sync.arm(1);
    }

    /// The `nth` sync from now fails (1: the next).
    pub fn fail_sync_after(&self, nth: u64) {
        self.faults.fail_sync.arm(nth);
    }

    /// Drops every write since the last good sync, as a crash would.
    pub fn lose_unsynced(&self) {
        let mut st = self.lock();
        st.written = st.durable.clone();
    }

    /// Good syncs so far.
    pub fn syncs(&self) -> u64 {
        self.faults.syncs.load(Ordering::SeqCst)
    }

    /// Failed syncs so far.
    pub fn failed_syncs(&self) -> u64 {
        self.faults.failed_syncs.load(Ordering::SeqCst)
    }

    /// The durable records of a stream (what a crash now would leave), decoded by the caller.
    pub fn durable_records(&self, stream: &str) -> Vec<(u64, Vec<u8>)> {
        self.lock()
            .durable
            .streams
            .get(stream)
            .map(|m| m.iter().map(|(k, v)| (*k, v.clone())).collect())
            .unwrap_or_default()
    }
}

impl StreamSink for MemoryStream {
    fn name(&self) -> &str {
        &self.name
    }

    fn append(&self, seq: u64, bytes: &[u8]) -> Result<(), StorageError> {
        self.shared.write(|t| {
            t.streams
                .entry(self.name.clone())
                .or_default()
                .insert(seq, bytes.to_vec());
        })
    }

    fn read_after(&self, after: u64) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        Ok(self
            .shared
            .lock()
            .written
            .streams
            .get(&self.name)
            .map(|m| m.range(after + 1..).map(|(k, v)| (*k, v.clone())).collect())
            .unwrap_or_default())
    }

    fn remove(&self, seq: u64) -> Result<(), StorageError> {
        self.shared.write(|t| {
            if let Some(m) = t.streams.get_mut(&self.name) {
                m.remove(&seq);
            }
        })
    }

    fn remove_upto(&self, upto: u64) -> Result<usize, StorageError> {
        let mut n = 0;
        self.shared.write(|t| {
            if let Some(m) = t.streams.get_mut(&self.name) {
                let keep = m.split_off(&(upto + 1));
                n = m.len();
                *m = keep;
            }
        })?;
        Ok(n)
    }
}

impl LogSink for MemorySink {
    fn stream(&self, name: &str) -> Result<Arc<dyn StreamSink>, StorageError> {
        self.lock()
            .written
            .streams
            .entry(name.to_owned())
            .or_default();
        Ok(Arc::new(MemoryStream {
            name: name.to_owned(),
            shared: self.shared.clone(),
        }))
    }

    fn stream_names(&self) -> Result<Vec<String>, StorageError> {
        Ok(self.lock().written.streams.keys().cloned().collect())
    }

    fn checkpoint(&self, stream: &str) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.lock().written.checkpoints.get(stream).cloned())
    }

    fn put_checkpoint(&self, stream: &str, blob: &[u8]) -> Result<(), StorageError> {
        self.write(|t| {
            t.checkpoints.insert(stream.to_owned(), blob.to_vec());
        })
    }

    fn claim(&self, key: &str, holder: &[u8]) -> Result<Claim, StorageError> {
        let mut found = Claim::Taken;
        self.write(|t| match t.claims.get(key) {
            None => {
                t.claims.insert(key.to_owned(), holder.to_vec());
            }
            Some(v) if v.as_slice() == holder => found = Claim::Already,
            Some(v) => found = Claim::Refused(v.clone()),
        })?;
        Ok(found)
    }

    fn claims(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        Ok(self
            .lock()
            .written
            .claims
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn unclaim(&self, key: &str) -> Result<(), StorageError> {
        self.write(|t| {
            t.claims.remove(key);
        })
    }

    fn set_claim_aside(&self, key: &str) -> Result<(), StorageError> {
        self.write(|t| {
            if let Some(holder) = t.claims.remove(key) {
                t.set_aside
                    .insert(super::sink::set_aside_key(key, &holder), holder);
            }
        })
    }

    fn claims_set_aside(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        Ok(self
            .lock()
            .written
            .set_aside
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn superblock(&self) -> Result<SuperblockRead, StorageError> {
        let marks = self
            .shared
            .superblock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Ok(SuperblockRead {
            marks,
            damaged_copies: Vec::new(),
        })
    }

    fn put_superblock(&self, marks: &Marks) -> Result<(), StorageError> {
        if self.shared.full.load(Ordering::SeqCst) {
            return Err(StorageError::Io(
                "No space left on device (os error 28)".into(),
            ));
        }
        *self
            .shared
            .superblock
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(marks.clone());
        Ok(())
    }

    fn sync(&self) -> Result<(), StorageError> {
        if self.faults.fail_sync.fires() {
            self.faults.failed_syncs.fetch_add(1, Ordering::SeqCst);
            // As Linux may after a failed fsync ("fsyncgate"): the dirty pages are dropped, so
            // a later sync that succeeds does not bring them back.
            self.lose_unsynced();
            return Err(StorageError::Io("injected fsync failure".into()));
        }
        let mut st = self.lock();
        st.durable = st.written.clone();
        self.faults.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(sink: &MemorySink, name: &str) -> Vec<u64> {
        sink.stream(name)
            .and_then(|s| s.read_after(0))
            .map(|r| r.into_iter().map(|(seq, _)| seq).collect())
            .unwrap_or_default()
    }

    #[test]
    fn only_what_a_good_sync_covered_survives_a_crash() {
        let sink = MemorySink::new();
        let s = sink.stream("a").unwrap();
        s.append(1, b"one").unwrap();
        sink.sync().unwrap();
        s.append(2, b"two").unwrap();
        assert_eq!(
            records(&sink, "a"),
            vec![1, 2],
            "written is readable at once"
        );
        assert_eq!(sink.durable_records("a").len(), 1);
        sink.lose_unsynced();
        assert_eq!(records(&sink, "a"), vec![1]);
        assert_eq!(sink.syncs(), 1);
    }

    #[test]
    fn a_failed_sync_loses_its_writes_and_a_later_sync_does_not_bring_them_back() {
        let sink = MemorySink::new();
        let s = sink.stream("a").unwrap();
        s.append(1, b"one").unwrap();
        sink.sync().unwrap();
        s.append(2, b"two").unwrap();
        sink.claim("seat", b"h2").unwrap();
        sink.fail_next_sync();
        assert!(sink.sync().is_err());
        assert_eq!(sink.failed_syncs(), 1);
        sink.sync().unwrap();
        assert_eq!(records(&sink, "a"), vec![1]);
        assert!(sink.claims().unwrap().is_empty());
        // Only the armed sync failed.
        s.append(3, b"three").unwrap();
        sink.sync().unwrap();
        assert_eq!(sink.durable_records("a").len(), 2);
    }

    #[test]
    fn the_nth_write_fails_and_changes_nothing() {
        let sink = MemorySink::new();
        let s = sink.stream("a").unwrap();
        sink.fail_write_after(2);
        s.append(1, b"one").unwrap();
        assert!(s.append(2, b"two").is_err());
        s.append(3, b"three").unwrap();
        assert_eq!(records(&sink, "a"), vec![1, 3]);
        sink.fail_next_write();
        assert!(sink.put_checkpoint("a", b"state").is_err());
        assert_eq!(sink.checkpoint("a").unwrap(), None);
    }

    #[test]
    fn claims_are_insert_if_absent() {
        let sink = MemorySink::new();
        assert_eq!(sink.claim("k", b"h1").unwrap(), Claim::Taken);
        assert_eq!(sink.claim("k", b"h1").unwrap(), Claim::Already);
        assert_eq!(
            sink.claim("k", b"h2").unwrap(),
            Claim::Refused(b"h1".to_vec())
        );
        sink.set_claim_aside("k").unwrap();
        assert_eq!(sink.claim("k", b"h2").unwrap(), Claim::Taken);
        assert_eq!(
            sink.claims_set_aside().unwrap(),
            vec![("k@h1".to_owned(), b"h1".to_vec())],
            "set aside, not deleted"
        );
        // The same seat set aside again for another holder keeps both.
        sink.set_claim_aside("k").unwrap();
        assert_eq!(sink.claims_set_aside().unwrap().len(), 2);
    }

    #[test]
    fn the_superblock_survives_a_crash_at_once() {
        let sink = MemorySink::new();
        let mut marks = Marks::default();
        marks.raise("a", 3);
        sink.put_superblock(&marks).unwrap();
        sink.lose_unsynced();
        assert_eq!(sink.superblock().unwrap().marks, Some(marks));
        sink.fill_disk();
        assert!(sink.put_superblock(&Marks::default()).is_err());
    }

    #[test]
    fn compaction_and_stream_names() {
        let sink = MemorySink::new();
        let s = sink.stream("a").unwrap();
        for seq in 1..=5 {
            s.append(seq, b"r").unwrap();
        }
        assert_eq!(s.remove_upto(3).unwrap(), 3);
        assert_eq!(records(&sink, "a"), vec![4, 5]);
        s.remove(5).unwrap();
        assert_eq!(records(&sink, "a"), vec![4]);
        sink.stream("b").unwrap();
        assert_eq!(
            sink.stream_names().unwrap(),
            vec!["a".to_owned(), "b".to_owned()]
        );
    }
}
