//! What a cluster node's store must hold, kept apart from it (issue 27).
//!
//! The Raft log and vote sit in the node's sled file, which sled reads up to the first message
//! that fails its checksum and silently truncates after: a damaged or cut file comes back as a
//! shorter log, or an older vote, that looks whole. A node that voted or led with it could help
//! elect a leader missing entries the group acknowledged, or vote twice in a term. So after
//! every sync of the log or the vote, and before openraft is told it is durable (so before this
//! node counts in any majority, or its vote leaves), the node writes what it must hold from
//! then on to two small files beside sled's ([`RAFT_FILES`], the single node's superblock
//! format: two copies written in turn, each synced): the last log index made durable, and the
//! vote. A start compares the store with them ([`RaftMarks::check`]); a store that holds less is
//! damage, named, and the node does not start on it.
//!
//! A gap in the log, or an entry that fails its checksum, **above** the last index marked is a
//! tail torn by a crash before its sync: no entry there was ever acknowledged (the mark moves
//! only once an append is synced, before openraft hears of it). sled does not promise a clean
//! prefix after a power cut (a value it keeps as a file of its own under `blobs/` may be lost
//! while a later one survives), so such a tail is cut ([`check_log`] says from where), not
//! refused. The same at or below the mark is damage.
//!
//! A simulated store (no data dir) keeps no marks: it never loses a synced write, and a gap in
//! it is damage (nothing tells what was acknowledged).

use std::ops::Bound;
use std::sync::{Arc, Mutex};

use openraft::Vote;

use crate::store::KvTree;
use crate::store::superblock::{Marks, RAFT_FILES, SuperblockFiles};

/// A node's id.
type NodeId = u64;

/// The mark of the last durable log index, plus one (0: no entry).
const LOG: &str = "raft_log";
/// The vote's term.
const VOTE_TERM: &str = "raft_vote_term";
/// The node voted for, plus one (0: none).
const VOTE_FOR: &str = "raft_vote_for";
/// 1 if the vote is committed (a leader was elected with it).
const VOTE_COMMITTED: &str = "raft_vote_committed";

/// What the store must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Held {
    /// The last log index made durable (`None`: no entry).
    pub(super) last_index: Option<u64>,
    /// The vote made durable.
    pub(super) vote: Option<Vote<NodeId>>,
}

impl Held {
    fn to_marks(&self) -> Marks {
        let mut m = Marks::default();
        m.streams
            .insert(LOG.into(), self.last_index.map_or(0, |i| i + 1));
        if let Some(v) = &self.vote {
            m.streams.insert(VOTE_TERM.into(), v.leader_id.term);
            m.streams.insert(
                VOTE_FOR.into(),
                v.leader_id.voted_for().map_or(0, |n| n + 1),
            );
            m.streams
                .insert(VOTE_COMMITTED.into(), u64::from(v.committed));
        }
        m
    }

    fn from_marks(m: &Marks) -> Held {
        let last_index = m.of(LOG).checked_sub(1);
        let vote = m.streams.get(VOTE_TERM).map(|&term| {
            let mut v = match m.of(VOTE_FOR).checked_sub(1) {
                Some(node) => Vote::new(term, node),
                None => Vote::default(),
            };
            v.leader_id.term = term;
            v.committed = m.of(VOTE_COMMITTED) == 1;
            v
        });
        Held { last_index, vote }
    }
}

/// A node's marks: what its store must hold, and the files they are kept in.
#[derive(Clone, Default)]
pub(super) struct RaftMarks {
    /// `None`: a simulated store, which keeps none.
    files: Option<Arc<SuperblockFiles>>,
    /// The marks read at start (`None`: none written yet).
    read: Option<Held>,
    /// What was written last.
    held: Arc<Mutex<Held>>,
}

impl RaftMarks {
    /// The marks kept in `dir`. Both copies damaged is damage too.
    pub(super) fn open(dir: &std::path::Path) -> std::io::Result<RaftMarks> {
        let (files, read) = SuperblockFiles::open_named(dir, RAFT_FILES)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if read.marks.is_none() && !read.damaged_copies.is_empty() {
            return Err(std::io::Error::other(format!(
                "this node's Raft marks are damaged ({}): what its store must hold is unknown",
                read.damaged_copies.join("; ")
            )));
        }
        let read = read.marks.as_ref().map(Held::from_marks);
        Ok(RaftMarks {
            files: Some(Arc::new(files)),
            held: Arc::new(Mutex::new(read.clone().unwrap_or_default())),
            read,
        })
    }

    /// Compares what the store holds at start with the marks: `Err` names the damage (a log
    /// that ends before the last index made durable, or an older vote than the one made
    /// durable). `last_index`: the log's last index, or the index a stored snapshot covers if
    /// its log was purged past it.
    pub(super) fn check(
        &self,
        last_index: Option<u64>,
        vote: Option<&Vote<NodeId>>,
    ) -> Result<(), String> {
        let Some(read) = &self.read else {
            return Ok(());
        };
        if read.last_index > last_index {
            return Err(format!(
                "its Raft log ends at index {} but index {} was made durable (and may have \
                 been acknowledged): the store lost its tail (a damaged or cut file)",
                last_index.map_or_else(|| "none".into(), |i| i.to_string()),
                read.last_index.unwrap_or(0)
            ));
        }
        if let Some(marked) = &read.vote {
            let kept = vote.is_some_and(|v| v.partial_cmp(marked).is_some_and(|o| o.is_ge()));
            if !kept {
                return Err(format!(
                    "its saved vote is {} but {marked} was made durable (and may have been \
                     given): the store lost it (a damaged or cut file)",
                    vote.map_or_else(|| "none".into(), |v| v.to_string())
                ));
            }
        }
        Ok(())
    }

    /// The last log index marked at start, if this store keeps marks: entries above it were
    /// never acknowledged. `None`: a simulated store (nothing tells), `Some(None)`: no entry was
    /// marked yet.
    fn marked_upto(&self) -> Option<Option<u64>> {
        self.files
            .as_ref()
            .map(|_| self.read.as_ref().and_then(|h| h.last_index))
    }

    /// Records, durably, that the store now holds `change` applied to what it held.
    pub(super) fn write(&self, change: impl FnOnce(&mut Held)) -> std::io::Result<()> {
        let Some(files) = &self.files else {
            return Ok(());
        };
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut held);
        files
            .write(&held.to_marks())
            .map_err(|e| std::io::Error::other(e.to_string()))
    }
}

/// Checks a node's store at start: its Raft log's entries follow each other from `behind` (the
/// last index purged, or covered by the stored snapshot) on, each passes its checksum, and the
/// store holds what `marks` say was made durable (the log up to its last index, the vote).
/// `Err` names the damage. `Ok(Some(i))`: the log is whole up to `i - 1`, and from `i` on holds a
/// tail torn by a crash before its sync (a gap or a damaged entry above the last index marked,
/// never acknowledged), which the caller cuts.
pub(super) fn check_log(
    log: &dyn KvTree,
    behind: Option<u64>,
    vote: Option<&Vote<NodeId>>,
    marks: &RaftMarks,
) -> Result<Option<u64>, String> {
    let (mut first, mut last): (Option<u64>, Option<u64>) = (None, None);
    let mut torn = None;
    // A fault at `index` above the last index marked tears the tail there; at or below it, or
    // in a store that keeps no marks, it is damage.
    let tears = |index: u64| {
        marks
            .marked_upto()
            .is_some_and(|m| m.is_none_or(|m| index > m))
    };
    for (k, v) in log
        .range(Bound::Unbounded, Bound::Unbounded)
        .map_err(|e| format!("reading the log: {e}"))?
    {
        let index = k
            .as_slice()
            .try_into()
            .map(u64::from_be_bytes)
            .map_err(|_| format!("its Raft log holds a key of {} bytes", k.len()))?;
        if let Some(l) = last
            && index != l + 1
        {
            if tears(l + 1) {
                torn = Some(l + 1);
                break;
            }
            return Err(format!(
                "its Raft log jumps from index {l} to {index}: the entries between are lost"
            ));
        }
        if let Err(e) = crate::codec::verify(&v) {
            if tears(index) {
                torn = Some(index);
                break;
            }
            return Err(format!("its Raft log's entry {index} is damaged: {e}"));
        }
        first.get_or_insert(index);
        last = Some(index);
    }
    let start = behind.map_or(0, |i| i + 1);
    if let Some(first) = first
        && first > start
    {
        if !tears(start) {
            return Err(format!(
                "its Raft log begins at index {first}, but nothing was purged past index \
                 {start}: the entries before are lost"
            ));
        }
        (torn, last) = (Some(start), None);
    }
    marks.check(last.max(behind), vote)?;
    Ok(torn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_say_what_the_store_must_hold_and_a_start_compares() {
        let dir = tempfile::tempdir().unwrap();
        let marks = RaftMarks::open(dir.path()).unwrap();
        // Nothing marked yet: any store passes.
        marks.check(None, None).unwrap();
        let vote = Vote::new(3, 2);
        marks
            .write(|h| {
                h.last_index = Some(41);
                h.vote = Some(vote);
            })
            .unwrap();
        let marks = RaftMarks::open(dir.path()).unwrap();
        marks.check(Some(41), Some(&vote)).unwrap();
        marks.check(Some(50), Some(&Vote::new(4, 1))).unwrap();
        let mut committed = vote;
        committed.committed = true;
        marks.check(Some(41), Some(&committed)).unwrap();
        // A shorter log, an older vote, another vote in the same term, or none: damage.
        let e = marks.check(Some(40), Some(&vote)).unwrap_err();
        assert!(e.contains("index 41 was made durable"), "{e}");
        assert!(marks.check(None, Some(&vote)).is_err());
        assert!(marks.check(Some(41), Some(&Vote::new(2, 2))).is_err());
        assert!(marks.check(Some(41), Some(&Vote::new(3, 1))).is_err());
        let e = marks.check(Some(41), None).unwrap_err();
        assert!(e.contains("saved vote is none"), "{e}");
    }

    /// A gap or a damaged entry above the last index marked is a torn tail, cut from there;
    /// at or below it, or in a store that keeps no marks, it is damage.
    #[test]
    fn a_fault_above_the_marks_tears_the_tail_and_below_them_is_damage() {
        use crate::store::Kv;
        let dir = tempfile::tempdir().unwrap();
        let log_of = |indexes: &[u64], damaged: Option<u64>| {
            let tree = crate::store::SimKv::new().tree("log").unwrap();
            for &i in indexes {
                let value = if damaged == Some(i) {
                    b"garbage".to_vec()
                } else {
                    crate::codec::encode(&i)
                };
                tree.insert(&i.to_be_bytes(), &value).unwrap();
            }
            tree
        };
        let marked = |last: Option<u64>| {
            let marks = RaftMarks::open(dir.path()).unwrap();
            marks.write(|h| h.last_index = last).unwrap();
            RaftMarks::open(dir.path()).unwrap()
        };
        let check = |log: &Arc<dyn KvTree>, m: &RaftMarks| check_log(log.as_ref(), None, None, m);
        // A gap: 4 is missing.
        let gap = log_of(&[0, 1, 2, 3, 5, 6], None);
        assert_eq!(check(&gap, &marked(Some(3))), Ok(Some(4)));
        let e = check(&gap, &marked(Some(4))).unwrap_err();
        assert!(e.contains("jumps from index 3 to 5"), "{e}");
        assert!(
            check(&gap, &RaftMarks::default()).is_err(),
            "no marks: damage"
        );
        // Entry 5 fails its checksum.
        let bad = log_of(&[0, 1, 2, 3, 4, 5, 6], Some(5));
        assert_eq!(check(&bad, &marked(Some(4))), Ok(Some(5)));
        let e = check(&bad, &marked(Some(5))).unwrap_err();
        assert!(e.contains("entry 5 is damaged"), "{e}");
        // The log's first entries are missing: all of it is torn when none was marked.
        let late = log_of(&[2, 3], None);
        assert_eq!(check(&late, &marked(None)), Ok(Some(0)));
        assert!(check(&late, &marked(Some(0))).is_err());
        // Whole logs pass as before.
        let whole = log_of(&[0, 1, 2], None);
        assert_eq!(check(&whole, &marked(Some(2))), Ok(None));
        assert!(check(&whole, &marked(Some(3))).is_err());
    }

    #[test]
    fn both_copies_damaged_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let marks = RaftMarks::open(dir.path()).unwrap();
        marks.write(|h| h.last_index = Some(1)).unwrap();
        marks.write(|h| h.last_index = Some(2)).unwrap();
        for name in RAFT_FILES {
            std::fs::write(dir.path().join(name), b"garbage").unwrap();
        }
        let e = RaftMarks::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains("marks are damaged"), "{e}");
    }
}
