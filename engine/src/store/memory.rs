//! [`MemorySink`]: the log of a single node in memory, with faults on command.
//!
//! A [`KvSink`] over a [`SimKv`] (see there for the faults: a power cut losing what was not
//! synced, failed writes and syncs, a full disk), with the superblock in memory, durable as soon
//! as it is written. An engine opened on the same sink afterwards recovers from what is left.
//! A write fault counts every write (records, checkpoints, claims, compaction), in order.

use std::sync::{Arc, Mutex};

use super::kv::Kv;
use super::kv_sink::KvSink;
use super::sim_kv::SimKv;
use super::sink::{Claim, LogSink, StreamSink};
use super::superblock::{Marks, SuperblockRead};
use crate::error::StorageError;

/// The log in memory; see the module docs. Used through an `Arc`, shared by the engines opened
/// on it one after another (a restart) and by the test that damages it.
pub struct MemorySink {
    disk: SimKv,
    log: KvSink,
    /// The superblock: durable as soon as it is written (it survives `lose_unsynced`).
    superblock: Mutex<Option<Marks>>,
}

impl MemorySink {
    /// An empty log.
    pub fn new() -> Arc<MemorySink> {
        let disk = SimKv::new();
        let log = KvSink::new(Arc::new(disk.clone())).unwrap_or_else(|e| {
            unreachable!("a new store in memory opens its trees without a fault: {e}")
        });
        Arc::new(MemorySink {
            disk,
            log,
            superblock: Mutex::new(None),
        })
    }

    /// The simulated disk under this log (every fault of [`SimKv`]).
    pub fn disk(&self) -> &SimKv {
        &self.disk
    }

    /// The next write fails (once).
    pub fn fail_next_write(&self) {
        self.disk.fail_next_write();
    }

    /// The `nth` write from now fails (1: the next).
    pub fn fail_write_after(&self, nth: u64) {
        self.disk.fail_write_after(nth);
    }

    /// From now on every write fails as on a full disk (`ENOSPC`), until [`MemorySink::free_disk`].
    pub fn fill_disk(&self) {
        self.disk.fill_disk();
    }

    /// Writes succeed again (space was freed).
    pub fn free_disk(&self) {
        self.disk.free_disk();
    }

    /// The next sync fails (once); what it would have covered is not durable.
    pub fn fail_next_sync(&self) {
        self.disk.fail_next_sync();
    }

    /// The `nth` sync from now fails (1: the next).
    pub fn fail_sync_after(&self, nth: u64) {
        self.disk.fail_sync_after(nth);
    }

    /// Drops every write since the last good sync, as a crash would.
    pub fn lose_unsynced(&self) {
        self.disk.lose_unsynced();
    }

    /// Good syncs so far.
    pub fn syncs(&self) -> u64 {
        self.disk.syncs()
    }

    /// Failed syncs so far.
    pub fn failed_syncs(&self) -> u64 {
        self.disk.failed_syncs()
    }

    /// The durable records of a stream (what a crash now would leave), decoded by the caller.
    pub fn durable_records(&self, stream: &str) -> Vec<(u64, Vec<u8>)> {
        self.disk
            .durable_pairs(stream)
            .into_iter()
            .filter_map(|(k, v)| Some((u64::from_be_bytes(k.try_into().ok()?), v)))
            .collect()
    }
}

impl LogSink for MemorySink {
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

    fn claims(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        self.log.claims()
    }

    fn unclaim(&self, key: &str) -> Result<(), StorageError> {
        self.log.unclaim(key)
    }

    fn set_claim_aside(&self, key: &str) -> Result<(), StorageError> {
        self.log.set_claim_aside(key)
    }

    fn claims_set_aside(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        self.log.claims_set_aside()
    }

    fn superblock(&self) -> Result<SuperblockRead, StorageError> {
        let marks = self
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
        if self.disk.is_full() {
            return Err(StorageError::Io(
                "No space left on device (os error 28)".into(),
            ));
        }
        *self.superblock.lock().unwrap_or_else(|p| p.into_inner()) = Some(marks.clone());
        Ok(())
    }

    fn sync(&self) -> Result<(), StorageError> {
        self.log.sync()
    }

    fn kv(&self) -> Option<Arc<dyn Kv>> {
        self.log.kv()
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
