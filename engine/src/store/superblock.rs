//! The superblock: what the log must hold, kept apart from the log.
//!
//! sled reads its file up to the first message that fails its checksum and treats the rest as a
//! torn tail; a damaged or truncated file therefore loses records *silently*. The superblock is
//! how recovery finds out: after every group commit is durable, and before any reply of that
//! commit leaves, the flusher writes each stream's **high-water mark** (the highest sequence
//! number made durable, so possibly acknowledged) and the number of sold-seat claims. At start a
//! stream that ends below its mark, has a gap, or a record that fails its checksum is damage
//! (see [`crate::integrity`]).
//!
//! On disk (sled sinks): two files beside sled's, `superblock.0` and `superblock.1`, each a whole
//! copy: `MAGIC` then a framed [`codec`] record (version, CRC32, payload). Writes alternate
//! between the copies, each followed by `fdatasync`, so a write torn by a crash leaves the other
//! copy intact, one commit older: that commit's replies had not left, so the older marks still
//! cover everything acknowledged. Reading takes the valid copy with the highest sequence number.
//! The idea is TigerBeetle's superblock copies, at the scale of two small files.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::error::StorageError;

/// What the log must hold: written after each durable commit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marks {
    /// Per stream: the highest sequence number made durable (records up to it may have been
    /// acknowledged, so they must all be there).
    pub streams: BTreeMap<String, u64>,
    /// Sold-seat claims made durable (claims only grow, except those recovery sets aside).
    pub claims: u64,
    /// Per stream: ranges of sequence numbers an operator accepted as lost or damaged
    /// (`serve --accept-damage`); later starts do not report them again.
    pub accepted: BTreeMap<String, Vec<(u64, u64)>>,
    /// Sold-seat claims an operator accepted as disagreeing with the orders (or left without
    /// a place to withdraw): kept, never set aside, not reported again.
    pub accepted_claims: std::collections::BTreeSet<String>,
    /// Damaged checkpoints an operator accepted, as `{stream}#{crc32 of their bytes}`.
    pub accepted_checkpoints: std::collections::BTreeSet<String>,
}

impl Marks {
    /// The high-water mark of `stream` (0: nothing acknowledged).
    pub fn of(&self, stream: &str) -> u64 {
        self.streams.get(stream).copied().unwrap_or(0)
    }

    /// Whether every seq in `from..=to` of `stream` was accepted as lost or damaged.
    pub fn is_accepted(&self, stream: &str, from: u64, to: u64) -> bool {
        self.accepted
            .get(stream)
            .is_some_and(|r| r.iter().any(|&(a, b)| a <= from && to <= b))
    }

    /// Records `from..=to` of `stream` as accepted.
    pub fn accept(&mut self, stream: &str, from: u64, to: u64) {
        self.accepted
            .entry(stream.to_owned())
            .or_default()
            .push((from, to));
    }

    /// Raises the mark of `stream` to `seq` (never lowers it).
    pub fn raise(&mut self, stream: &str, seq: u64) {
        match self.streams.get_mut(stream) {
            Some(m) => *m = (*m).max(seq),
            None => {
                self.streams.insert(stream.to_owned(), seq);
            }
        }
    }
}

/// What reading the superblock found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SuperblockRead {
    /// The newest valid copy's marks; `None` if there is no valid copy.
    pub marks: Option<Marks>,
    /// Copies that exist but do not verify (file name and why). With `marks` set, one damaged
    /// copy is the expected trace of a write torn by a crash; with `marks` unset it is damage.
    pub damaged_copies: Vec<String>,
}

/// The format version inside the superblock.
const FORMAT: u32 = 1;
/// The first bytes of a superblock copy.
const MAGIC: &[u8; 8] = b"BXOSUPR\x01";
/// The two copies' file names.
pub const FILES: [&str; 2] = ["superblock.0", "superblock.1"];
/// The two copies' file names of a cluster node's Raft marks (`crate::raft`'s `marks`): the
/// same format under other names, so that no single-node tool reads them as a log's marks.
pub const RAFT_FILES: [&str; 2] = ["raft-marks.0", "raft-marks.1"];

#[derive(Serialize, Deserialize)]
struct Body {
    format: u32,
    sequence: u64,
    marks: Marks,
}

fn encode(sequence: u64, marks: &Marks) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend(codec::encode(&Body {
        format: FORMAT,
        sequence,
        marks: marks.clone(),
    }));
    out
}

fn decode(bytes: &[u8]) -> Result<(u64, Marks), String> {
    let rest = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| "no superblock magic".to_owned())?;
    let body = codec::decode::<Body>(rest).map_err(|e| e.to_string())?;
    if body.format != FORMAT {
        return Err(format!("unknown superblock format {}", body.format));
    }
    Ok((body.sequence, body.marks))
}

/// The two superblock copies in a directory.
pub struct SuperblockFiles {
    dir: PathBuf,
    /// The copies' names ([`FILES`], or [`RAFT_FILES`]).
    names: [&'static str; 2],
    state: Mutex<Copies>,
}

struct Copies {
    files: [Option<File>; 2],
    /// Each copy's length on disk, once known (`None`: unknown, so set at the next write).
    lens: [Option<u64>; 2],
    sequence: u64,
}

fn open_error(path: &Path, e: impl std::fmt::Display) -> StorageError {
    StorageError::Open {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

impl SuperblockFiles {
    /// Reads both copies in `dir` (nothing is written until [`SuperblockFiles::write`]).
    pub fn open(dir: &Path) -> Result<(SuperblockFiles, SuperblockRead), StorageError> {
        SuperblockFiles::open_named(dir, FILES)
    }

    /// [`SuperblockFiles::open`], the copies named `names`.
    pub fn open_named(
        dir: &Path,
        names: [&'static str; 2],
    ) -> Result<(SuperblockFiles, SuperblockRead), StorageError> {
        let mut read = SuperblockRead::default();
        let mut newest: Option<(u64, Marks)> = None;
        for name in names {
            let path = dir.join(name);
            let mut bytes = Vec::new();
            match File::open(&path) {
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(open_error(&path, e)),
                Ok(mut f) => f
                    .read_to_end(&mut bytes)
                    .map_err(|e| open_error(&path, e))?,
            };
            match decode(&bytes) {
                Ok((seq, marks)) => {
                    if newest.as_ref().is_none_or(|(s, _)| seq > *s) {
                        newest = Some((seq, marks));
                    }
                }
                Err(why) => read.damaged_copies.push(format!("{name}: {why}")),
            }
        }
        let sequence = newest.as_ref().map_or(0, |(s, _)| *s);
        read.marks = newest.map(|(_, m)| m);
        let files = SuperblockFiles {
            dir: dir.to_owned(),
            names,
            state: Mutex::new(Copies {
                files: [None, None],
                lens: [None, None],
                sequence,
            }),
        };
        Ok((files, read))
    }

    /// Writes `marks` over the older copy and makes it durable (`fdatasync`). A failure means
    /// a disk that fails its writes or fsyncs: the process's sled databases are then never
    /// closed (see `sled_kv::KeptOpen`).
    pub fn write(&self, marks: &Marks) -> Result<(), StorageError> {
        let _timed = super::stall::syncing();
        self.write_copy(marks)
            .inspect_err(|_| super::sled_kv::keep_every_db_open())
    }

    fn write_copy(&self, marks: &Marks) -> Result<(), StorageError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let sequence = st.sequence + 1;
        let slot = (sequence % 2) as usize;
        let bytes = encode(sequence, marks);
        if st.files[slot].is_none() {
            let path = self.dir.join(self.names[slot]);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| StorageError::Io(format!("superblock {}: {e}", path.display())))?;
            // The new file's name must be durable too: sync the directory once.
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| StorageError::Io(format!("fsync of the data dir: {e}")))?;
            st.files[slot] = Some(file);
        }
        // The length is set only when it changes: a new length makes `fdatasync` write the
        // file's inode as well (a second write to the disk, about half as much again).
        let known = st.lens[slot].take();
        let Some(file) = st.files[slot].as_ref() else {
            unreachable!("opened above")
        };
        let name = self.names[slot];
        let io = |e: std::io::Error| StorageError::Io(format!("superblock {name}: {e}"));
        let len = bytes.len() as u64;
        file.write_all_at(&bytes, 0).map_err(io)?;
        if known != Some(len) {
            file.set_len(len).map_err(io)?;
        }
        file.sync_data().map_err(io)?;
        st.lens[slot] = Some(len);
        st.sequence = sequence;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(n: u64) -> Marks {
        let mut m = Marks::default();
        m.raise("catalog", n);
        m.raise("section/e/s", n * 10);
        m.claims = n;
        m
    }

    #[test]
    fn newest_copy_wins_and_a_torn_one_falls_back_to_the_other() {
        let dir = tempfile::tempdir().unwrap();
        let (files, read) = SuperblockFiles::open(dir.path()).unwrap();
        assert_eq!(read, SuperblockRead::default());
        for n in 1..=5 {
            files.write(&marks(n)).unwrap();
        }
        let (_, read) = SuperblockFiles::open(dir.path()).unwrap();
        assert_eq!(read.marks, Some(marks(5)));
        // Tear the newest copy (sequence 5 is in slot 1) at every length: the older copy rules.
        let newest = dir.path().join(FILES[1]);
        let bytes = std::fs::read(&newest).unwrap();
        for cut in 0..bytes.len() {
            std::fs::write(&newest, &bytes[..cut]).unwrap();
            let (_, read) = SuperblockFiles::open(dir.path()).unwrap();
            assert_eq!(read.marks, Some(marks(4)), "cut at {cut}");
            assert_eq!(read.damaged_copies.len(), 1, "cut at {cut}");
        }
        // A flipped byte anywhere is caught the same way.
        for at in 0..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            std::fs::write(&newest, &b).unwrap();
            let (_, read) = SuperblockFiles::open(dir.path()).unwrap();
            assert_eq!(read.marks, Some(marks(4)), "flip at {at}");
        }
    }

    #[test]
    fn both_copies_damaged_gives_no_marks_and_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = SuperblockFiles::open(dir.path()).unwrap();
        files.write(&marks(1)).unwrap();
        files.write(&marks(2)).unwrap();
        for name in FILES {
            std::fs::write(dir.path().join(name), b"garbage").unwrap();
        }
        let (_, read) = SuperblockFiles::open(dir.path()).unwrap();
        assert_eq!(read.marks, None);
        assert_eq!(read.damaged_copies.len(), 2);
        assert!(read.damaged_copies[0].starts_with("superblock.0"));
    }

    #[test]
    fn writing_continues_after_the_newest_copy() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = SuperblockFiles::open(dir.path()).unwrap();
        files.write(&marks(1)).unwrap();
        files.write(&marks(2)).unwrap();
        files.write(&marks(3)).unwrap();
        drop(files);
        let (files, read) = SuperblockFiles::open(dir.path()).unwrap();
        assert_eq!(read.marks, Some(marks(3)));
        // The next write must replace the older copy (marks 2), never the newest.
        files.write(&marks(4)).unwrap();
        let (_, read) = SuperblockFiles::open(dir.path()).unwrap();
        assert_eq!(read.marks, Some(marks(4)));
        std::fs::write(dir.path().join(FILES[0]), b"torn").unwrap();
        let (_, read) = SuperblockFiles::open(dir.path()).unwrap();
        assert_eq!(
            read.marks,
            Some(marks(3)),
            "sequence 4 went to the older slot"
        );
    }

    #[test]
    fn a_copy_shorter_than_the_last_is_cut_to_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = SuperblockFiles::open(dir.path()).unwrap();
        let mut long = marks(1);
        for i in 0..40 {
            long.raise(&format!("section/e/s{i}"), 7);
        }
        // Both copies long, then both short, then both of one length again (set once, kept).
        for m in [&long, &long, &marks(2), &marks(3), &marks(4), &marks(5)] {
            files.write(m).unwrap();
        }
        let short = std::fs::metadata(dir.path().join(FILES[0])).unwrap().len();
        assert_eq!(
            short,
            std::fs::metadata(dir.path().join(FILES[1])).unwrap().len()
        );
        assert_eq!(short, encode(6, &marks(5)).len() as u64);
        let (_, read) = SuperblockFiles::open(dir.path()).unwrap();
        assert_eq!(read.marks, Some(marks(5)));
        assert!(read.damaged_copies.is_empty(), "{:?}", read.damaged_copies);
    }
}
