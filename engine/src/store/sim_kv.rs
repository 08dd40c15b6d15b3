//! [`SimKv`]: a [`Kv`] store in memory that fails as a disk does, on command.
//!
//! It keeps what was written and what was durable at the last good [`Kv::sync`], with the
//! writes in between in order. A test or a deterministic simulation can:
//! - cut the power ([`SimKv::crash`]): what the last good sync covered survives, with the first
//!   `keep` of the later writes (a drive that got some of them out: a torn tail, never a write
//!   without every one before it; 0 is a clean cut);
//! - fail the next write, or a later one ([`SimKv::fail_write_after`]), or every write as on a
//!   full disk ([`SimKv::fill_disk`]);
//! - fail the next sync, or a later one: everything written since the last good sync is then
//!   lost (as Linux may drop dirty pages after a failed fsync), and a later good sync does not
//!   bring it back;
//! - flip a bit of a stored value ([`SimKv::flip_bit`]), or wipe everything ([`SimKv::wipe`]).
//!
//! A write fault counts every write (an insert, a removal, a batch, a transaction), in order.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::kv::{Change, Kv, KvTree, Pair, Pairs};
use crate::error::StorageError;

type Trees = BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>;

/// One step of a write.
#[derive(Clone)]
enum Step {
    /// A tree came to be.
    Tree(String),
    /// `value` at `key` of `tree` (`None`: removed).
    Set {
        tree: String,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
    },
}

fn apply(trees: &mut Trees, steps: &[Step]) {
    for step in steps {
        match step {
            Step::Tree(name) => {
                trees.entry(name.clone()).or_default();
            }
            Step::Set { tree, key, value } => {
                let t = trees.entry(tree.clone()).or_default();
                match value {
                    Some(v) => {
                        t.insert(key.clone(), v.clone());
                    }
                    None => {
                        t.remove(key);
                    }
                }
            }
        }
    }
}

#[derive(Default)]
struct State {
    written: Trees,
    durable: Trees,
    /// The writes since the last good sync, in order: each one all or nothing.
    pending: Vec<Vec<Step>>,
}

/// A fault armed to fire on the `n`th next call (1: the very next).
#[derive(Default)]
pub(crate) struct Trigger(AtomicU64);

impl Trigger {
    pub(crate) fn arm(&self, nth: u64) {
        self.0.store(nth, Ordering::SeqCst);
    }

    /// Whether this call fires the fault.
    pub(crate) fn fires(&self) -> bool {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok_and(|n| n == 1)
    }
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// How long a sync takes, µs.
    latency_us: AtomicU64,
    fail_write: Trigger,
    full: AtomicBool,
    fail_sync: Trigger,
    syncs: AtomicU64,
    failed_syncs: AtomicU64,
    /// A power cut armed to land in the next sync begun after it was armed.
    cut_in_sync: Mutex<Option<ArmedCut>>,
    /// Syncs begun (their callers asked for the disk's time to sync, then wait it out).
    syncs_begun: AtomicU64,
    /// Syncs asked for.
    syncs_called: AtomicU64,
    /// The power is off: every write and sync fails until [`SimKv::power_on`].
    off: AtomicBool,
}

/// A power cut armed by [`SimKv::cut_in_sync`].
struct ArmedCut {
    /// It lands in a sync that covers at least this many bytes...
    bytes: usize,
    /// ...or, if none has before, in the sync that leaves this many at 0 (each sync begun
    /// after it was armed counts one off).
    within: u64,
    /// Share of the unsynced writes kept, per mille.
    keep: u64,
    /// Syncs begun before it was armed, still to pass.
    before: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data: keep using it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self, steps: Vec<Step>) -> Result<(), StorageError> {
        if self.off.load(Ordering::SeqCst) {
            return Err(StorageError::Io("the disk has no power".into()));
        }
        if self.fail_write.fires() {
            return Err(StorageError::Io("injected write failure".into()));
        }
        if self.full.load(Ordering::SeqCst) {
            return Err(StorageError::Io(
                "No space left on device (os error 28)".into(),
            ));
        }
        let mut st = self.lock();
        apply(&mut st.written, &steps);
        st.pending.push(steps);
        Ok(())
    }

    /// Syncs begun and not yet asked for.
    fn syncs_in_flight(&self) -> u64 {
        self.syncs_begun
            .load(Ordering::SeqCst)
            .saturating_sub(self.syncs_called.load(Ordering::SeqCst))
    }

    fn crash(&self, keep: usize) {
        // The syncs under way die with the power.
        self.syncs_begun
            .store(self.syncs_called.load(Ordering::SeqCst), Ordering::SeqCst);
        let mut st = self.lock();
        let pending = std::mem::take(&mut st.pending);
        for steps in pending.iter().take(keep) {
            apply(&mut st.durable, steps);
        }
        st.written = st.durable.clone();
    }

    /// Bytes written since the last good sync.
    fn pending_bytes(&self) -> usize {
        self.lock()
            .pending
            .iter()
            .flatten()
            .map(|step| match step {
                Step::Tree(name) => name.len(),
                Step::Set { key, value, .. } => key.len() + value.as_ref().map_or(0, Vec::len),
            })
            .sum()
    }
}

/// The store in memory; see the module docs. Cheap to clone: clones share the same "disk".
#[derive(Clone, Default)]
pub struct SimKv {
    shared: Arc<Shared>,
}

impl SimKv {
    /// An empty store.
    pub fn new() -> SimKv {
        SimKv::default()
    }

    /// The power is cut: everything written since the last good sync is lost, but for the
    /// first `keep` of those writes (0: a clean cut; see [`SimKv::unsynced_writes`]).
    pub fn crash(&self, keep: usize) {
        self.shared.crash(keep);
    }

    /// Arms a power cut that lands in the next sync covering at least `bytes` (a cut is
    /// likelier to land in a long sync than a short one), and at the latest in the `within`th
    /// (from 1), of the syncs that began after it was armed (ones that take the disk's time to
    /// sync as it is now: a slow disk stalls them first, and the writes behind them wait): the
    /// sync fails, the disk keeps what was synced and the first `keep` per mille of the writes
    /// it covered, and the power stays off (every write and sync fails) until
    /// [`SimKv::power_on`]. A cut armed while the node is down lands after it starts again.
    pub fn cut_in_sync(&self, bytes: usize, within: u64, keep: u64) {
        let before = self.shared.syncs_in_flight();
        *self
            .shared
            .cut_in_sync
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(ArmedCut {
            bytes,
            within: within.max(1),
            keep,
            before,
        });
    }

    /// Whether the power is off (an armed cut landed).
    pub fn is_off(&self) -> bool {
        self.shared.off.load(Ordering::SeqCst)
    }

    /// Power back on (a cut still armed stays armed).
    pub fn power_on(&self) {
        self.shared.off.store(false, Ordering::SeqCst);
    }

    /// Disarms a cut armed by [`SimKv::cut_in_sync`] that has not landed.
    pub fn disarm_cut(&self) {
        *self
            .shared
            .cut_in_sync
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Drops every write since the last good sync, as a crash would ([`SimKv::crash`] with 0).
    pub fn lose_unsynced(&self) {
        self.shared.crash(0);
    }

    /// Writes made since the last good sync (what a crash may lose).
    pub fn unsynced_writes(&self) -> usize {
        self.shared.lock().pending.len()
    }

    /// An independent copy of what was written now, all of it durable (to read a node's
    /// state offline without touching its disk).
    pub fn fork(&self) -> SimKv {
        let written = self.shared.lock().written.clone();
        let copy = SimKv::new();
        {
            let mut st = copy.shared.lock();
            st.durable = written.clone();
            st.written = written;
        }
        copy
    }

    /// Everything is gone, durable or not (a wiped or replaced disk).
    pub fn wipe(&self) {
        *self.shared.lock() = State::default();
    }

    /// Flips one bit of one stored value, in what was written and what is durable alike (a
    /// damaged sector), chosen by `pick`; says which `(tree, key)`, or `None` if the store holds
    /// no value of a tree whose name `only` accepts.
    pub fn flip_bit(&self, pick: u64, only: impl Fn(&str) -> bool) -> Option<(String, Vec<u8>)> {
        let mut st = self.shared.lock();
        let candidates: Vec<(String, Vec<u8>)> = st
            .durable
            .iter()
            .filter(|(name, _)| only(name))
            .flat_map(|(name, t)| {
                t.iter()
                    .filter(|(_, v)| !v.is_empty())
                    .map(move |(k, _)| (name.clone(), k.clone()))
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let n = u64::try_from(candidates.len()).unwrap_or(u64::MAX);
        let (tree, key) = candidates[usize::try_from(pick % n).unwrap_or(0)].clone();
        let flip = |trees: &mut Trees| {
            if let Some(v) = trees.get_mut(&tree).and_then(|t| t.get_mut(&key)) {
                let bits = u64::try_from(v.len()).unwrap_or(u64::MAX) * 8;
                let bit = (pick >> 20) % bits;
                let byte = usize::try_from(bit / 8).unwrap_or(0);
                v[byte] ^= 1 << (bit % 8);
            }
        };
        flip(&mut st.durable);
        flip(&mut st.written);
        Some((tree, key))
    }

    /// The next write fails (once).
    pub fn fail_next_write(&self) {
        self.shared.fail_write.arm(1);
    }

    /// The `nth` write from now fails (1: the next).
    pub fn fail_write_after(&self, nth: u64) {
        self.shared.fail_write.arm(nth);
    }

    /// From now on every write fails as on a full disk (`ENOSPC`), until [`SimKv::free_disk`].
    pub fn fill_disk(&self) {
        self.shared.full.store(true, Ordering::SeqCst);
    }

    /// Writes succeed again (space was freed).
    pub fn free_disk(&self) {
        self.shared.full.store(false, Ordering::SeqCst);
    }

    /// From now on a sync takes `latency` (a slow disk, or just a disk's time to sync).
    pub fn set_sync_latency(&self, latency: std::time::Duration) {
        self.shared.latency_us.store(
            u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// Whether every write fails as on a full disk.
    pub fn is_full(&self) -> bool {
        self.shared.full.load(Ordering::SeqCst)
    }

    /// The next sync fails (once); what it would have covered is lost.
    pub fn fail_next_sync(&self) {
        self.shared.fail_sync.arm(1);
    }

    /// The `nth` sync from now fails (1: the next).
    pub fn fail_sync_after(&self, nth: u64) {
        self.shared.fail_sync.arm(nth);
    }

    /// Good syncs so far.
    pub fn syncs(&self) -> u64 {
        self.shared.syncs.load(Ordering::SeqCst)
    }

    /// Failed syncs so far.
    pub fn failed_syncs(&self) -> u64 {
        self.shared.failed_syncs.load(Ordering::SeqCst)
    }

    /// The durable pairs of `tree` (what a clean cut now would leave).
    pub fn durable_pairs(&self, tree: &str) -> Pairs {
        self.shared
            .lock()
            .durable
            .get(tree)
            .map(|t| t.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }
}

struct SimTree {
    name: String,
    shared: Arc<Shared>,
}

impl SimTree {
    fn set(&self, key: &[u8], value: Option<&[u8]>) -> Step {
        Step::Set {
            tree: self.name.clone(),
            key: key.to_vec(),
            value: value.map(<[u8]>::to_vec),
        }
    }

    fn read<T>(&self, f: impl FnOnce(Option<&BTreeMap<Vec<u8>, Vec<u8>>>) -> T) -> T {
        let st = self.shared.lock();
        f(st.written.get(&self.name))
    }
}

impl KvTree for SimTree {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.read(|t| t.and_then(|t| t.get(key).cloned())))
    }

    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        self.shared.write(vec![self.set(key, Some(value))])
    }

    fn remove(&self, key: &[u8]) -> Result<(), StorageError> {
        self.shared.write(vec![self.set(key, None)])
    }

    fn insert_if_absent(&self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        if let Some(current) = self.get(key)? {
            return Ok(Some(current));
        }
        self.insert(key, value)?;
        Ok(None)
    }

    fn range(&self, from: Bound<&[u8]>, to: Bound<&[u8]>) -> Result<Pairs, StorageError> {
        Ok(self.read(|t| {
            t.map(|t| {
                t.range::<[u8], _>((from, to))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
        }))
    }

    fn apply(&self, changes: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), StorageError> {
        let steps = changes
            .iter()
            .map(|(k, v)| self.set(k, v.as_deref()))
            .collect();
        self.shared.write(steps)
    }

    fn is_empty(&self) -> Result<bool, StorageError> {
        Ok(self.read(|t| t.is_none_or(BTreeMap::is_empty)))
    }

    fn first_after(&self, key: &[u8]) -> Result<Option<Pair>, StorageError> {
        Ok(self.read(|t| {
            t.and_then(|t| {
                t.range::<[u8], _>((Bound::Excluded(key), Bound::Unbounded))
                    .next()
                    .map(|(k, v)| (k.clone(), v.clone()))
            })
        }))
    }

    fn last(&self) -> Result<Option<Pair>, StorageError> {
        Ok(self.read(|t| {
            t.and_then(|t| t.last_key_value())
                .map(|(k, v)| (k.clone(), v.clone()))
        }))
    }
}

impl Kv for SimKv {
    fn tree(&self, name: &str) -> Result<Arc<dyn KvTree>, StorageError> {
        let exists = self.shared.lock().written.contains_key(name);
        if !exists {
            self.shared.write(vec![Step::Tree(name.to_owned())])?;
        }
        Ok(Arc::new(SimTree {
            name: name.to_owned(),
            shared: self.shared.clone(),
        }))
    }

    fn tree_names(&self) -> Result<Vec<String>, StorageError> {
        Ok(self.shared.lock().written.keys().cloned().collect())
    }

    /// The disk's own time to sync, and a microsecond for every 64 bytes waiting (about
    /// 64 MB/s): a big write, a snapshot's install, takes its time, and a crash can land in it.
    fn sync_latency(&self) -> std::time::Duration {
        // A sync begins: its caller waits this long, then syncs.
        self.shared.syncs_begun.fetch_add(1, Ordering::SeqCst);
        let base = self.shared.latency_us.load(Ordering::SeqCst);
        if base == 0 {
            return std::time::Duration::ZERO;
        }
        let waiting = self.shared.pending_bytes();
        std::time::Duration::from_micros(base + u64::try_from(waiting / 64).unwrap_or(u64::MAX))
    }

    fn transaction(&self, changes: &[Change]) -> Result<(), StorageError> {
        let steps = changes
            .iter()
            .map(|c| Step::Set {
                tree: c.tree.clone(),
                key: c.key.clone(),
                value: c.value.clone(),
            })
            .collect();
        self.shared.write(steps)
    }

    fn sync(&self) -> Result<(), StorageError> {
        if self.shared.off.load(Ordering::SeqCst) {
            return Err(StorageError::Io("the disk has no power".into()));
        }
        self.shared.syncs_called.fetch_add(1, Ordering::SeqCst);
        let cut = {
            let mut armed = self
                .shared
                .cut_in_sync
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match armed.as_mut() {
                // A sync begun before the cut was armed (at the disk's speed then) passes.
                Some(cut) if cut.before > 0 => {
                    cut.before -= 1;
                    None
                }
                Some(cut) => {
                    cut.within -= 1;
                    if cut.within == 0 || self.shared.pending_bytes() >= cut.bytes {
                        let keep = cut.keep;
                        *armed = None;
                        Some(keep)
                    } else {
                        None
                    }
                }
                None => None,
            }
        };
        if let Some(keep) = cut {
            let writes = self.unsynced_writes();
            self.shared.off.store(true, Ordering::SeqCst);
            self.shared
                .crash(writes * usize::try_from(keep).unwrap_or(0) / 1_000);
            return Err(StorageError::Io("the power was cut during an fsync".into()));
        }
        if self.shared.fail_sync.fires() {
            self.shared.failed_syncs.fetch_add(1, Ordering::SeqCst);
            // As Linux may after a failed fsync ("fsyncgate"): the dirty pages are dropped, so
            // a later sync that succeeds does not bring them back.
            self.shared.crash(0);
            return Err(StorageError::Io("injected fsync failure".into()));
        }
        let mut st = self.shared.lock();
        let pending = std::mem::take(&mut st.pending);
        for steps in &pending {
            apply(&mut st.durable, steps);
        }
        self.shared.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(t: &Arc<dyn KvTree>) -> Vec<Vec<u8>> {
        t.pairs().unwrap().into_iter().map(|(k, _)| k).collect()
    }

    #[test]
    fn a_crash_keeps_the_synced_writes_and_a_prefix_of_the_rest() {
        let kv = SimKv::new();
        let t = kv.tree("t").unwrap();
        t.insert(b"a", b"1").unwrap();
        kv.sync().unwrap();
        t.insert(b"b", b"2").unwrap();
        t.apply(&[(b"c".to_vec(), Some(b"3".to_vec())), (b"a".to_vec(), None)])
            .unwrap();
        t.insert(b"d", b"4").unwrap();
        assert_eq!(kv.unsynced_writes(), 3);
        assert_eq!(keys(&t), vec![b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]);
        // The first two unsynced writes reached the disk, the third did not: the batch is
        // whole.
        kv.crash(2);
        assert_eq!(keys(&t), vec![b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(kv.unsynced_writes(), 0);
        t.insert(b"e", b"5").unwrap();
        kv.lose_unsynced();
        assert_eq!(keys(&t), vec![b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(kv.durable_pairs("t").len(), 2);
    }

    #[test]
    fn a_tree_made_after_the_last_sync_is_gone_after_a_crash() {
        let kv = SimKv::new();
        kv.tree("kept").unwrap();
        kv.sync().unwrap();
        kv.tree("lost").unwrap().insert(b"k", b"v").unwrap();
        kv.crash(0);
        assert_eq!(kv.tree_names().unwrap(), vec!["kept".to_owned()]);
    }

    #[test]
    fn a_failed_sync_loses_its_writes_and_a_later_sync_does_not_bring_them_back() {
        let kv = SimKv::new();
        let t = kv.tree("t").unwrap();
        t.insert(b"a", b"1").unwrap();
        kv.sync().unwrap();
        t.insert(b"b", b"2").unwrap();
        kv.fail_next_sync();
        assert!(kv.sync().is_err());
        kv.sync().unwrap();
        assert_eq!(keys(&t), vec![b"a".to_vec()]);
        assert_eq!((kv.syncs(), kv.failed_syncs()), (2, 1));
    }

    #[test]
    fn write_faults_change_nothing() {
        let kv = SimKv::new();
        let t = kv.tree("t").unwrap();
        kv.fail_write_after(2);
        t.insert(b"a", b"1").unwrap();
        assert!(t.insert(b"b", b"2").is_err());
        t.insert(b"c", b"3").unwrap();
        assert_eq!(keys(&t), vec![b"a".to_vec(), b"c".to_vec()]);
        kv.fill_disk();
        assert!(t.remove(b"a").is_err());
        assert!(kv.is_full());
        kv.free_disk();
        t.remove(b"a").unwrap();
        assert_eq!(t.insert_if_absent(b"c", b"9").unwrap(), Some(b"3".to_vec()));
        assert_eq!(t.insert_if_absent(b"z", b"9").unwrap(), None);
    }

    #[test]
    fn a_cut_lands_in_the_first_sync_big_enough_and_keeps_a_prefix() {
        let kv = SimKv::new();
        let t = kv.tree("t").unwrap();
        kv.cut_in_sync(100, u64::MAX, 500);
        t.insert(b"small", b"x").unwrap();
        kv.sync().unwrap();
        assert!(!kv.is_off());
        for i in 0..4u8 {
            t.insert(&[b'k', i], &[i; 40]).unwrap();
        }
        assert!(kv.sync().is_err());
        assert!(kv.is_off());
        assert!(t.insert(b"after", b"y").is_err());
        assert!(kv.sync().is_err());
        kv.power_on();
        // Synced before the cut, and the first half of the four writes it landed in.
        assert_eq!(
            keys(&kv.tree("t").unwrap()),
            vec![b"k\x00".to_vec(), b"k\x01".to_vec(), b"small".to_vec()]
        );
        t.insert(b"again", b"z").unwrap();
        kv.sync().unwrap();
    }

    #[test]
    fn a_cut_lands_only_in_a_sync_begun_after_it_was_armed() {
        let kv = SimKv::new();
        kv.set_sync_latency(std::time::Duration::from_millis(1));
        let t = kv.tree("t").unwrap();
        // A sync under way (its caller waits out the disk's time) when the cut is armed...
        let _ = kv.sync_latency();
        kv.cut_in_sync(10, u64::MAX, 0);
        t.insert(b"a", &[1; 40]).unwrap();
        // ...took the disk's time as it was then: the cut does not land in it.
        kv.sync().unwrap();
        assert!(!kv.is_off());
        // The next one begins after: it lands there.
        t.insert(b"b", &[2; 40]).unwrap();
        let _ = kv.sync_latency();
        assert!(kv.sync().is_err());
        assert!(kv.is_off());
        kv.power_on();
        assert_eq!(keys(&kv.tree("t").unwrap()), vec![b"a".to_vec()]);
    }

    #[test]
    fn a_cut_lands_at_the_latest_in_its_last_sync_however_small() {
        let kv = SimKv::new();
        let t = kv.tree("t").unwrap();
        kv.cut_in_sync(1 << 20, 3, 0);
        for i in 0..2u8 {
            t.insert(&[b'k', i], b"x").unwrap();
            kv.sync().unwrap();
        }
        assert!(!kv.is_off());
        t.insert(b"third", b"x").unwrap();
        assert!(kv.sync().is_err());
        assert!(kv.is_off());
        kv.power_on();
        assert_eq!(
            keys(&kv.tree("t").unwrap()),
            vec![b"k\x00".to_vec(), b"k\x01".to_vec()]
        );
    }

    #[test]
    fn a_flipped_bit_changes_one_value_on_disk() {
        let kv = SimKv::new();
        let t = kv.tree("t").unwrap();
        t.insert(b"a", &[0u8; 4]).unwrap();
        kv.sync().unwrap();
        assert_eq!(kv.flip_bit(7, |n| n == "other"), None);
        assert_eq!(
            kv.flip_bit(7, |n| n == "t"),
            Some(("t".into(), b"a".to_vec()))
        );
        let v = t.get(b"a").unwrap().unwrap();
        assert_eq!(v.iter().map(|b| b.count_ones()).sum::<u32>(), 1);
        kv.lose_unsynced();
        assert_eq!(t.get(b"a").unwrap(), Some(v), "the flip is on disk");
        kv.wipe();
        assert!(kv.tree_names().unwrap().is_empty());
    }
}
