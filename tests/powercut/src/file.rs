//! One regular file's bytes: the current content, and what it takes to rebuild the durable one.
//!
//! The current content is a plain `Vec<u8>`. The durable content is not stored apart: it is the
//! current content except on the pages changed since the last sync, whose durable bytes are kept
//! aside (`undo`) the first time each page is touched, and past the durable size. So a write
//! costs at most one page copy, a sync forgets the saved pages, and a cut writes them back.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

/// The unit a cut keeps or drops: a drive writes whole pages.
pub(crate) const PAGE: u64 = 4096;

/// What a cut did to one file.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileCut {
    /// Bytes of the pre-cut content that the cut changed, removed or brought back.
    pub(crate) dropped: u64,
    /// Unsynced bytes (different from the durable ones) that the cut kept.
    pub(crate) kept: u64,
}

/// A regular file's content (see the module doc).
///
/// Invariant: a byte below the durable size on a page that is not in `undo` is below the current
/// size and equal to its durable value; so every byte between the current and the durable size
/// (whichever is larger) is on a page of `undo` or at or past the durable size.
#[derive(Debug, Default)]
pub(crate) struct FileData {
    /// What reads see now.
    cur: Vec<u8>,
    /// The size that survives a cut.
    durable_len: u64,
    /// For each page that starts below `durable_len` and was changed since the last sync: its
    /// durable bytes (those below `durable_len`).
    undo: BTreeMap<u64, Vec<u8>>,
}

/// How many positions differ between `a` and `b` (a position in only one of them counts).
fn differing(a: &[u8], b: &[u8]) -> u64 {
    let same_len = a.iter().zip(b).filter(|(x, y)| x != y).count();
    (same_len + a.len().abs_diff(b.len())) as u64
}

/// `x` as an index into a file's bytes. Callers keep sizes under [`crate::state::MAX_FILE_SIZE`],
/// so this never saturates on a 64-bit target.
fn idx(x: u64) -> usize {
    usize::try_from(x).unwrap_or(usize::MAX)
}

impl FileData {
    /// The current size.
    pub(crate) fn len(&self) -> u64 {
        self.cur.len() as u64
    }

    /// Up to `size` current bytes from `offset` (fewer at the end of the file).
    pub(crate) fn read(&self, offset: u64, size: u32) -> &[u8] {
        let start = idx(offset).min(self.cur.len());
        let end = start.saturating_add(size as usize).min(self.cur.len());
        &self.cur[start..end]
    }

    /// Saves the durable bytes of every page overlapping `[start, end)` that starts below the
    /// durable size and was not saved since the last sync. Called before those bytes change.
    fn touch(&mut self, start: u64, end: u64) {
        let end = end.min(self.durable_len);
        if start >= end {
            return;
        }
        for page in start / PAGE..=(end - 1) / PAGE {
            if let Entry::Vacant(slot) = self.undo.entry(page) {
                let from = idx(page * PAGE);
                let to = idx(((page + 1) * PAGE).min(self.durable_len)).min(self.cur.len());
                slot.insert(
                    self.cur
                        .get(from..to)
                        .map(<[u8]>::to_vec)
                        .unwrap_or_default(),
                );
            }
        }
    }

    /// Writes `data` at `offset`, extending the file (with zeros up to `offset`) if needed.
    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) {
        let old = self.len();
        let end = offset + data.len() as u64;
        self.touch(offset, end);
        if offset > old {
            self.touch(old, offset);
        }
        if end > old {
            self.cur.resize(idx(end), 0);
        }
        self.cur[idx(offset)..idx(end)].copy_from_slice(data);
    }

    /// Truncates or extends (with zeros) to `len`.
    pub(crate) fn set_len(&mut self, len: u64) {
        let old = self.len();
        if len < old {
            self.touch(len, old);
        } else {
            self.touch(old, len);
        }
        self.cur.resize(idx(len), 0);
        if self.cur.capacity() > 2 * self.cur.len() + (1 << 20) {
            self.cur.shrink_to_fit();
        }
    }

    /// Makes the current content durable.
    pub(crate) fn sync(&mut self) {
        self.durable_len = self.len();
        self.undo.clear();
    }

    /// The pages on which current and durable content may differ, in order.
    fn unsynced_pages(&self) -> BTreeSet<u64> {
        let mut pages: BTreeSet<u64> = self.undo.keys().copied().collect();
        let (d, l) = (self.durable_len, self.len());
        if l > d {
            pages.extend(d / PAGE..=(l - 1) / PAGE);
        }
        pages
    }

    /// How many byte positions differ between the current and the durable content (a byte that
    /// exists in only one of them counts).
    pub(crate) fn unsynced_bytes(&self) -> u64 {
        let (d, l) = (self.durable_len, self.len());
        let mut n = 0;
        for page in self.unsynced_pages() {
            let start = page * PAGE;
            let end = (start + PAGE).min(l.max(d));
            match self.undo.get(&page) {
                Some(saved) => {
                    let cur = self.cur.get(idx(start)..idx(end.min(l))).unwrap_or(&[]);
                    n += differing(cur, saved);
                }
                // Below the durable size such a page is unchanged; past it, every byte is new.
                None => n += end.min(l).saturating_sub(start.max(d)),
            }
        }
        n
    }

    /// Cuts the power on this file: each unsynced page keeps its current bytes if `keep` says so
    /// (asked once per page, in page order) and reverts to its durable bytes otherwise. The size
    /// becomes the durable one, or the end of the last kept page (at most the current size) if
    /// that is larger; a byte past the durable size on a page that was not kept reads as zero.
    /// Afterwards everything is durable.
    pub(crate) fn cut(&mut self, mut keep: impl FnMut() -> bool) -> FileCut {
        let (d, l) = (self.durable_len, self.len());
        let pages = self.unsynced_pages();
        let kept: BTreeSet<u64> = pages.iter().copied().filter(|_| keep()).collect();
        let mut new_len = d;
        for &page in &kept {
            let end = ((page + 1) * PAGE).min(l);
            if end > page * PAGE {
                new_len = new_len.max(end);
            }
        }
        let mut out = FileCut::default();
        let FileData { cur, undo, .. } = self;
        if new_len > l {
            cur.resize(idx(new_len), 0);
        }
        for &page in &pages {
            let start = page * PAGE;
            let end = (start + PAGE).min(l.max(new_len));
            let lim = end.min(new_len);
            let keep_page = kept.contains(&page);
            let saved = undo.get(&page);
            if keep_page {
                // unsynced bytes kept: the current ones that differ from the durable ones
                let cur_end = lim.min(l);
                if cur_end > start {
                    let kept_bytes = &cur[idx(start)..idx(cur_end)];
                    out.kept += match saved {
                        Some(s) => differing(kept_bytes, s),
                        None => cur_end.saturating_sub(start.max(d)),
                    };
                }
            }
            // From `from` to `lim` the bytes become durable ones (zero past the durable size).
            let mut from = if keep_page {
                start.max(lim.min(l))
            } else {
                start
            };
            if saved.is_none() {
                // Not touched below the durable size: those bytes already are the durable ones.
                from = from.max(d.min(end));
            }
            if from < lim {
                let durable = saved
                    .and_then(|s| s.get(idx(from - start)..))
                    .unwrap_or(&[]);
                let take = durable.len().min(idx(lim - from));
                let old_end = lim.min(l);
                if old_end > from {
                    let old = &cur[idx(from)..idx(old_end)];
                    let a = take.min(old.len());
                    out.dropped += differing(&old[..a], &durable[..a]);
                    out.dropped += old[a..].iter().filter(|&&b| b != 0).count() as u64;
                }
                // bytes that did not exist before the cut (a truncation undone)
                out.dropped += lim.saturating_sub(from.max(l));
                let at = idx(from);
                cur[at..at + take].copy_from_slice(&durable[..take]);
                cur[at + take..idx(lim)].fill(0);
            }
            // Pre-cut bytes past the new end are gone.
            out.dropped += end.min(l).saturating_sub(start.max(new_len));
        }
        cur.truncate(idx(new_len));
        self.durable_len = new_len;
        self.undo.clear();
        out
    }

    /// The whole current content (tests).
    #[cfg(test)]
    pub(crate) fn current(&self) -> &[u8] {
        &self.cur
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    /// The obvious model: two full copies.
    #[derive(Default, Clone)]
    struct Model {
        cur: Vec<u8>,
        durable: Vec<u8>,
    }

    fn random_ops(rng: &mut ChaCha8Rng, f: &mut FileData, m: &mut Model, n: usize) {
        for _ in 0..n {
            match rng.random_range(0..10) {
                0..=5 => {
                    let off = rng.random_range(0..6 * PAGE);
                    let len = rng.random_range(0..2 * PAGE as usize);
                    let byte: u8 = rng.random_range(1..=255);
                    let data = vec![byte; len];
                    f.write(off, &data);
                    let end = off as usize + len;
                    if end > m.cur.len() {
                        m.cur.resize(end, 0);
                    }
                    m.cur[off as usize..end].copy_from_slice(&data);
                }
                6 | 7 => {
                    let len = rng.random_range(0..7 * PAGE);
                    f.set_len(len);
                    m.cur.resize(len as usize, 0);
                }
                _ => {
                    f.sync();
                    m.durable = m.cur.clone();
                }
            }
            assert_eq!(f.current(), &m.cur[..]);
        }
    }

    fn model_differing(m: &Model) -> u64 {
        let n = m.cur.len().max(m.durable.len());
        (0..n).filter(|&i| m.cur.get(i) != m.durable.get(i)).count() as u64
    }

    #[test]
    fn drop_unsynced_restores_the_durable_content() {
        for seed in 0..300 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let (mut f, mut m) = (FileData::default(), Model::default());
            random_ops(&mut rng, &mut f, &mut m, 12);
            assert_eq!(f.unsynced_bytes(), model_differing(&m), "seed {seed}");
            let cut = f.cut(|| false);
            assert_eq!(f.current(), &m.durable[..], "seed {seed}");
            assert_eq!(cut.kept, 0);
            assert_eq!(f.unsynced_bytes(), 0);
            // and it goes on working after the cut
            m.cur = m.durable.clone();
            random_ops(&mut rng, &mut f, &mut m, 6);
            f.cut(|| false);
            assert_eq!(f.current(), &m.durable[..], "seed {seed}, second cut");
        }
    }

    #[test]
    fn keeping_some_pages_gives_only_durable_or_current_bytes() {
        let (mut saw_kept, mut saw_dropped) = (false, false);
        for seed in 0..500 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let (mut f, mut m) = (FileData::default(), Model::default());
            random_ops(&mut rng, &mut f, &mut m, 12);
            let before = m.clone();
            let cut = f.cut(|| rng.random_bool(0.5));
            let after = f.current();
            let d = before.durable.len();
            let l = before.cur.len();
            assert!(
                after.len() >= d.min(l) && after.len() <= d.max(l),
                "seed {seed}: size {} outside [{}, {}]",
                after.len(),
                d.min(l),
                d.max(l)
            );
            for (i, &b) in after.iter().enumerate() {
                // past the durable size, the durable value of a byte is zero
                let durable = before.durable.get(i).copied().unwrap_or(0);
                let current = before.cur.get(i).copied();
                assert!(
                    b == durable || Some(b) == current,
                    "seed {seed}: byte {i} is {b}, durable {durable}, current {current:?}"
                );
                saw_kept |= Some(b) == current && b != durable;
                saw_dropped |= Some(b) != current;
            }
            assert_eq!(f.unsynced_bytes(), 0);
            assert!(cut.dropped + cut.kept <= model_differing(&before) + (d.max(l) as u64));
        }
        assert!(saw_kept && saw_dropped);
    }

    #[test]
    fn sync_then_cut_keeps_everything() {
        let mut f = FileData::default();
        f.write(10, b"hello");
        f.sync();
        assert_eq!(f.unsynced_bytes(), 0);
        assert_eq!(f.cut(|| false), FileCut::default());
        assert_eq!(f.current(), b"\0\0\0\0\0\0\0\0\0\0hello");
        f.write(0, b"xx");
        f.set_len(3);
        assert_eq!(f.unsynced_bytes(), 2 + 12);
        let cut = f.cut(|| false);
        assert_eq!(cut.dropped, 2 + 12);
        assert_eq!(f.current(), b"\0\0\0\0\0\0\0\0\0\0hello");
    }
}
