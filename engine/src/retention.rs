//! Retention: what the engine forgets, and when, so that memory and checkpoints are bounded by
//! what is live rather than by everything that ever happened.
//!
//! One knob, the **idempotency window** (`EngineConfig::idempotency_window`, 24 hours by
//! default, [`IDEMPOTENCY_WINDOW_MS_DEFAULT`](crate::limits::IDEMPOTENCY_WINDOW_MS_DEFAULT)):
//!
//! - **Idempotency answers** (successes and recorded rejections, in the ledger shards) are
//!   replayed while `now - answered_at < window`, where `answered_at` is the time the first answer
//!   was recorded (a hold's `placed_at`, an order's `created_at`, a rejection's own time). After
//!   that the key is unknown: a retry is a new request. The age is checked on every lookup, so
//!   the rule is exact however far the clean-up has got; the clean-up itself forgets at most
//!   [`FORGET_PER_STEP_MAX`](crate::limits::FORGET_PER_STEP_MAX) answers per request.
//! - **Ended holds** (released or expired) leave their section once a record the section
//!   applies is at least one window after the hold ended. By then the hold's key was forgotten
//!   too (a hold ends after it is placed), no waitlist offer waits on it (its end was noticed
//!   when it happened; after a restart the sweeper takes a hold it cannot find for a lapsed
//!   offer), and no payment saga can need it (a saga only starts on an active hold and, once it
//!   has charged, a hold it no longer finds is refunded as any refusal is). `GetHold`,
//!   `Confirm` and `Release` then answer `HOLD_NOT_FOUND`. **Confirmed holds stay**: they are
//!   orders, bounded by the section's places.
//!
//! Forgetting ended holds happens inside [`SectionCore::apply`](crate::SectionCore::apply),
//! driven by each record's own time (never the clock), so replaying a section's checkpoint and
//! records forgets exactly what the live actor forgot. Checkpoints then carry only live state,
//! and the log behind them is compacted as before: the data dir is bounded by the live state
//! plus at most `checkpoint_every_records` records per stream.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Whether `window_ms` has passed between `at_ms` and `now_ms` (`now_ms - at_ms >= window_ms`;
/// never for a time in the future).
pub(crate) fn window_passed(at_ms: u64, now_ms: u64, window_ms: u64) -> bool {
    now_ms
        .checked_sub(at_ms)
        .is_some_and(|age| age >= window_ms)
}

/// Things to forget, ordered by the time their window started: the earliest is forgotten first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ForgetIndex<K: Ord> {
    by_time: BTreeSet<(u64, K)>,
}

impl<K: Ord> Default for ForgetIndex<K> {
    fn default() -> Self {
        ForgetIndex {
            by_time: BTreeSet::new(),
        }
    }
}

impl<K: Ord> ForgetIndex<K> {
    /// Remembers `key`, whose window starts at `at_ms`.
    pub fn insert(&mut self, at_ms: u64, key: K) {
        self.by_time.insert((at_ms, key));
    }

    /// Takes out at most `max` keys whose window (`window_ms`) has passed at `now_ms`, earliest
    /// first.
    pub fn pop_due(&mut self, now_ms: u64, window_ms: u64, max: usize) -> Vec<K> {
        let mut out = Vec::new();
        while out.len() < max {
            match self.by_time.first() {
                Some((at, _)) if window_passed(*at, now_ms, window_ms) => {}
                _ => break,
            }
            if let Some((_, key)) = self.by_time.pop_first() {
                out.push(key);
            }
        }
        out
    }

    /// How many keys are remembered.
    pub fn len(&self) -> usize {
        self.by_time.len()
    }

    /// Every key remembered, earliest first.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.by_time.iter().map(|(_, k)| k)
    }
}

/// Things to forget by the time their window started, in no particular order within one
/// millisecond: the ledger's keys, whose answers are checked against the window at every lookup,
/// so which of one millisecond's keys is forgotten first never shows (a section's ended holds
/// need [`ForgetIndex`]'s one order: a replay must forget exactly what the live section did).
/// Built from a million keys without comparing any two keys: a restart's ledger spent most of
/// its index's time sorting keys of the same millisecond by their strings.
#[derive(Debug)]
pub(crate) struct ForgetBuckets<K> {
    by_ms: BTreeMap<u64, Vec<K>>,
}

impl<K> Default for ForgetBuckets<K> {
    fn default() -> Self {
        ForgetBuckets {
            by_ms: BTreeMap::new(),
        }
    }
}

impl<K: PartialEq> ForgetBuckets<K> {
    /// An index of `keys` (each with the time its window starts; each key once).
    pub fn of(keys: impl IntoIterator<Item = (u64, K)>) -> Self {
        let mut index = ForgetBuckets::default();
        for (at_ms, key) in keys {
            index.by_ms.entry(at_ms).or_default().push(key);
        }
        index
    }

    /// Remembers `key`, whose window starts at `at_ms` (once: a key already there stays one).
    pub fn insert(&mut self, at_ms: u64, key: K) {
        let bucket = self.by_ms.entry(at_ms).or_default();
        if !bucket.contains(&key) {
            bucket.push(key);
        }
    }

    /// Drops `key` (inserted at `at_ms`) without forgetting it through [`Self::pop_due`].
    pub fn remove(&mut self, at_ms: u64, key: &K) {
        if let std::collections::btree_map::Entry::Occupied(mut bucket) = self.by_ms.entry(at_ms)
            && let Some(i) = bucket.get().iter().position(|k| k == key)
        {
            bucket.get_mut().swap_remove(i);
            if bucket.get().is_empty() {
                bucket.remove();
            }
        }
    }

    /// Takes out at most `max` keys whose window (`window_ms`) has passed at `now_ms`, earliest
    /// millisecond first.
    pub fn pop_due(&mut self, now_ms: u64, window_ms: u64, max: usize) -> Vec<K> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(mut bucket) = self.by_ms.first_entry() else {
                break;
            };
            if !window_passed(*bucket.key(), now_ms, window_ms) {
                break;
            }
            while out.len() < max
                && let Some(key) = bucket.get_mut().pop()
            {
                out.push(key);
            }
            if bucket.get().is_empty() {
                bucket.remove();
            }
        }
        out
    }
}

/// What an engine remembers now, for the soak and for tests: live state plus what its window
/// still keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remembered {
    /// Holds in every section's memory (active, confirmed, and ended ones within the window).
    pub holds: usize,
    /// Of those, released or expired holds waiting for their window to pass.
    pub ended_holds: usize,
    /// Idempotency keys the ledger shards remember (answers and keys in flight).
    pub idempotency_keys: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_exclusive_of_its_end_and_never_passes_backwards() {
        assert!(!window_passed(1_000, 1_999, 1_000));
        assert!(window_passed(1_000, 2_000, 1_000));
        assert!(!window_passed(5_000, 1_000, 1_000), "a time in the future");
    }

    #[test]
    fn pop_due_takes_the_earliest_first_and_at_most_max() {
        let mut index = ForgetIndex::default();
        for (at, k) in [(30, "c"), (10, "a"), (20, "b"), (40, "d")] {
            index.insert(at, k);
        }
        assert_eq!(index.pop_due(1_029, 1_000, 10), ["a", "b"]);
        index.insert(30, "b");
        assert_eq!(index.pop_due(1_039, 1_000, 10), ["b", "c"]);
        assert_eq!(index.pop_due(1_040, 1_000, 0), Vec::<&str>::new());
        assert_eq!(index.pop_due(5_000, 1_000, 10), ["d"]);
        assert_eq!(index.len(), 0);
    }

    /// The ledger's index: the same times, any order within a millisecond; built at once or one
    /// by one alike; a key inserted twice is there once; removing a key not there changes nothing.
    #[test]
    fn buckets_pop_by_millisecond_and_at_most_max() {
        let keys = [
            (30, "c"),
            (10, "a"),
            (20, "b"),
            (40, "d"),
            (10, "e"),
            (10, "f"),
        ];
        let mut built = ForgetBuckets::of(keys);
        let mut one_by_one = ForgetBuckets::default();
        for (at, k) in keys {
            one_by_one.insert(at, k);
        }
        one_by_one.insert(10, "a");
        for index in [&mut built, &mut one_by_one] {
            index.remove(20, &"b");
            index.remove(20, &"zz");
            index.remove(99, &"a");
            let mut first = index.pop_due(1_010, 1_000, 2);
            first.sort();
            assert!(first.len() == 2 && first.iter().all(|k| ["a", "e", "f"].contains(k)));
            let mut rest = index.pop_due(1_039, 1_000, 10);
            rest.sort();
            assert_eq!(rest.len(), 2, "{rest:?}");
            assert!(rest.contains(&"c"));
            assert_eq!(index.pop_due(1_040, 1_000, 0), Vec::<&str>::new());
            assert_eq!(index.pop_due(5_000, 1_000, 10), ["d"]);
            assert!(index.by_ms.is_empty());
        }
    }
}
