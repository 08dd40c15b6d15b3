//! [`KvSink`]: the log over any [`Kv`] store.
//!
//! | tree | key | value |
//! |---|---|---|
//! | one per stream (`catalog`, `section/{event}/{section}`, `ledger/{n}`, `waitlist`) | seq (u64 BE) | a framed record, or a chunk of records keyed by its last ([`chunks`](super::chunks)) |
//! | `checkpoints` | stream name | framed `(seq, state blob)` |
//! | `sold` | claim key | holder (hold id) |
//! | `sold_set_aside` | `{claim key}@{holder}` | holder: claims recovery set aside, kept as evidence |
//!
//! It keeps no superblock: a cluster node's copy of the log needs none (the Raft log is the
//! durable record), and the single node's sinks add theirs ([`SledSink`](super::SledSink)
//! beside sled's files, [`MemorySink`](super::MemorySink) in memory).

use std::ops::Bound;
use std::sync::Arc;

use super::chunks;
use super::kv::{Kv, KvTree};
use super::names;
use super::sink::{Claim, LogSink, StreamSink};
use super::superblock::{Marks, SuperblockRead};
use crate::error::StorageError;

/// The log in a [`Kv`] store; see the module docs.
pub struct KvSink {
    kv: Arc<dyn Kv>,
    checkpoints: Arc<dyn KvTree>,
    claims: Arc<dyn KvTree>,
    set_aside: Arc<dyn KvTree>,
}

impl KvSink {
    /// The log in `kv`.
    pub fn new(kv: Arc<dyn Kv>) -> Result<KvSink, StorageError> {
        Ok(KvSink {
            checkpoints: kv.tree(names::CHECKPOINTS)?,
            claims: kv.tree(names::CLAIMS)?,
            set_aside: kv.tree(names::CLAIMS_SET_ASIDE)?,
            kv,
        })
    }

    /// The store under this log.
    pub fn store(&self) -> &Arc<dyn Kv> {
        &self.kv
    }
}

struct KvStream {
    name: String,
    tree: Arc<dyn KvTree>,
}

impl KvStream {
    fn seq_of(&self, key: &[u8]) -> Result<u64, StorageError> {
        <[u8; 8]>::try_from(key)
            .map(u64::from_be_bytes)
            .map_err(|_| StorageError::Corrupt {
                stream: self.name.clone(),
                seq: 0,
                reason: format!("key of {} bytes is not a sequence number", key.len()),
            })
    }
}

impl StreamSink for KvStream {
    fn name(&self) -> &str {
        &self.name
    }

    fn append(&self, seq: u64, bytes: &[u8]) -> Result<(), StorageError> {
        self.tree.insert(&seq.to_be_bytes(), bytes)
    }

    fn append_batch(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), StorageError> {
        for (key, value) in chunks::pack(entries) {
            self.tree.insert(&key.to_be_bytes(), &value)?;
        }
        Ok(())
    }

    fn read_after(&self, after: u64) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        self.read_between(after, u64::MAX)
    }

    /// Values are keyed by their last record: those keyed in `(after, upto]`, and the first
    /// one past `upto` (a chunk may begin at or before it), each unpacked and cut to the range.
    fn read_between(&self, after: u64, upto: u64) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let (from, to) = (after.to_be_bytes(), upto.to_be_bytes());
        let mut values = self
            .tree
            .range(Bound::Excluded(&from[..]), Bound::Included(&to[..]))?;
        if upto < u64::MAX {
            values.extend(self.tree.first_after(&to)?);
        }
        let mut out = Vec::new();
        for (key, value) in values {
            let key = self.seq_of(&key)?;
            out.extend(
                chunks::unpack(key, value)
                    .into_iter()
                    .filter(|(seq, _)| *seq > after && *seq <= upto),
            );
        }
        Ok(out)
    }

    fn visit_after(
        &self,
        after: u64,
        each: &mut super::sink::RecordVisitor<'_>,
    ) -> Result<(), StorageError> {
        let from = after.to_be_bytes();
        self.tree.visit_range(
            Bound::Excluded(&from[..]),
            Bound::Unbounded,
            &mut |key, value| {
                chunks::unpack_each(self.seq_of(key)?, value, |seq, record| match seq > after {
                    true => each(seq, record),
                    false => Ok(()),
                })
            },
        )
    }

    /// Removes one record: its value, or, in a chunk, the chunk written again without it.
    fn remove(&self, seq: u64) -> Result<(), StorageError> {
        let Some((key, value)) = self
            .tree
            .first_after(&seq.saturating_sub(1).to_be_bytes())?
        else {
            return Ok(());
        };
        let records = chunks::unpack(self.seq_of(&key)?, value);
        if !records.iter().any(|(s, _)| *s == seq) {
            return Ok(());
        }
        let left: Vec<(u64, Vec<u8>)> = records.into_iter().filter(|(s, _)| *s != seq).collect();
        let mut changes = vec![(key, None)];
        for (k, v) in chunks::pack(&left) {
            changes.retain(|(old, _)| old.as_slice() != k.to_be_bytes());
            changes.push((k.to_be_bytes().to_vec(), Some(v)));
        }
        self.tree.apply(&changes)
    }

    fn last_seq(&self) -> Result<u64, StorageError> {
        Ok(self
            .tree
            .last()?
            .and_then(|(k, _)| <[u8; 8]>::try_from(k.as_slice()).ok())
            .map_or(0, u64::from_be_bytes))
    }

    fn remove_upto(&self, upto: u64) -> Result<usize, StorageError> {
        self.tree.remove_upto(&upto.to_be_bytes())
    }
}

/// Every (key, value) of a tree, keys as text.
fn entries(tree: &dyn KvTree) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
    Ok(tree
        .pairs()?
        .into_iter()
        .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
        .collect())
}

impl LogSink for KvSink {
    fn stream(&self, name: &str) -> Result<Arc<dyn StreamSink>, StorageError> {
        Ok(Arc::new(KvStream {
            name: name.to_owned(),
            tree: self.kv.tree(name)?,
        }))
    }

    fn stream_names(&self) -> Result<Vec<String>, StorageError> {
        let tables = [
            names::CHECKPOINTS,
            names::CLAIMS,
            names::CLAIMS_SET_ASIDE,
            names::PAYMENTS,
            names::PAYMENTS_BY_ID,
            names::TICKET_RING,
        ];
        Ok(self
            .kv
            .tree_names()?
            .into_iter()
            .filter(|n| !tables.contains(&n.as_str()) && !n.starts_with(names::RAFT_TREES_PREFIX))
            .collect())
    }

    fn checkpoint(&self, stream: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.checkpoints.get(stream.as_bytes())
    }

    fn put_checkpoint(&self, stream: &str, blob: &[u8]) -> Result<(), StorageError> {
        self.checkpoints.insert(stream.as_bytes(), blob)
    }

    fn claim(&self, key: &str, holder: &[u8]) -> Result<Claim, StorageError> {
        Ok(
            match self.claims.insert_if_absent(key.as_bytes(), holder)? {
                None => Claim::Taken,
                Some(current) if current == holder => Claim::Already,
                Some(current) => Claim::Refused(current),
            },
        )
    }

    fn claims(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        entries(self.claims.as_ref())
    }

    fn unclaim(&self, key: &str) -> Result<(), StorageError> {
        self.claims.remove(key.as_bytes())
    }

    fn set_claim_aside(&self, key: &str) -> Result<(), StorageError> {
        if let Some(holder) = self.claims.get(key.as_bytes())? {
            let aside = super::sink::set_aside_key(key, &holder);
            self.set_aside.insert(aside.as_bytes(), &holder)?;
            self.claims.remove(key.as_bytes())?;
        }
        Ok(())
    }

    fn claims_set_aside(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        entries(self.set_aside.as_ref())
    }

    fn superblock(&self) -> Result<SuperblockRead, StorageError> {
        Ok(SuperblockRead {
            marks: Some(Marks::default()),
            damaged_copies: vec![],
        })
    }

    fn put_superblock(&self, _marks: &Marks) -> Result<(), StorageError> {
        Ok(())
    }

    fn sync(&self) -> Result<(), StorageError> {
        self.kv.sync()
    }

    fn kv(&self) -> Option<Arc<dyn Kv>> {
        Some(self.kv.clone())
    }

    fn atomic_records(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of which five fill a chunk (and six do not).
    fn record(seq: u64) -> Vec<u8> {
        crate::codec::encode(&vec![seq as u8; chunks::CHUNK_BYTES / 5 - 128])
    }

    fn seqs(r: &[(u64, Vec<u8>)]) -> Vec<u64> {
        r.iter().map(|(s, _)| *s).collect()
    }

    /// Format 3 beside format 2: records written one by one and in chunks read back alike, by
    /// any range (chunks that straddle its ends cut to it); a record removed from a chunk
    /// (a torn tail dropped) leaves the others; compaction removes whole chunks only.
    #[test]
    fn chunks_and_lone_records_read_remove_and_compact_alike() {
        let sink = KvSink::new(Arc::new(super::super::sim_kv::SimKv::new())).unwrap();
        let s = sink.stream("section/e/s").unwrap();
        s.append(1, &record(1)).unwrap(); // format 2
        let batch: Vec<_> = (2..=20).map(|q| (q, record(q))).collect();
        s.append_batch(&batch).unwrap(); // chunks of 5
        let values = sink.store().tree("section/e/s").unwrap().pairs().unwrap();
        assert_eq!(values.len(), 1 + 4, "one value per chunk");
        assert_eq!(s.last_seq().unwrap(), 20);
        let all = s.read_after(0).unwrap();
        assert_eq!(seqs(&all), (1..=20).collect::<Vec<_>>());
        assert!(all.iter().all(|(q, b)| *b == record(*q)));
        assert_eq!(seqs(&s.read_between(3, 8).unwrap()), [4, 5, 6, 7, 8]);
        assert_eq!(seqs(&s.read_between(19, 25).unwrap()), [20]);
        assert!(s.read_between(20, 30).unwrap().is_empty());
        // The last record dropped, then one in the middle of a chunk.
        s.remove(20).unwrap();
        assert_eq!(s.last_seq().unwrap(), 19);
        s.remove(9).unwrap();
        let left = seqs(&s.read_after(0).unwrap());
        assert_eq!(left.len(), 18);
        assert!(!left.contains(&9) && !left.contains(&20));
        // Compaction: whole values up to the mark; a chunk across it stays, and reads after
        // the mark see only what is past it.
        s.remove_upto(12).unwrap();
        assert!(seqs(&s.read_after(0).unwrap()).iter().all(|q| *q > 10));
        assert_eq!(
            seqs(&s.read_after(12).unwrap()),
            (13..=19).collect::<Vec<_>>()
        );
    }

    /// A stream walked record by record, borrowed (how recovery checks it), gives what reading
    /// it gives, from any point: format-2 records, chunks cut where the point falls, and a
    /// chunk whose index is damaged (one bad record at its key), over sled and over the
    /// simulation's store.
    #[test]
    fn a_stream_walked_borrowed_is_the_stream_read() {
        let dir = tempfile::tempdir().unwrap();
        let db = super::super::sled_kv::open_db(dir.path()).unwrap();
        let sled = super::super::sled_kv::SledKv::over(db, dir.path()).unwrap();
        let stores: [Arc<dyn Kv>; 2] =
            [Arc::new(sled), Arc::new(super::super::sim_kv::SimKv::new())];
        for kv in stores {
            let sink = KvSink::new(kv.clone()).unwrap();
            let s = sink.stream("section/e/s").unwrap();
            s.append(1, &record(1)).unwrap();
            let batch: Vec<_> = (2..=20).map(|q| (q, record(q))).collect();
            s.append_batch(&batch).unwrap();
            // A chunk of 21..=25 whose index fails its checksum.
            let mut bad = chunks::pack(&(21..=25).map(|q| (q, record(q))).collect::<Vec<_>>())
                .remove(0)
                .1;
            bad[6] ^= 0xff;
            kv.tree("section/e/s")
                .unwrap()
                .insert(&25u64.to_be_bytes(), &bad)
                .unwrap();
            s.append(26, &record(26)).unwrap();
            for after in [0, 3, 12, 20, 25, 26] {
                let mut walked = Vec::new();
                s.visit_after(after, &mut |seq, bytes| {
                    walked.push((seq, bytes.to_vec()));
                    Ok(())
                })
                .unwrap();
                assert_eq!(walked, s.read_after(after).unwrap(), "after {after}");
            }
            let all = seqs(&s.read_after(0).unwrap());
            assert_eq!(all.len(), 22, "{all:?}");
            assert!(all.contains(&25) && !all.contains(&24));
            // An error from the walker stops the walk and comes back.
            let mut seen = 0;
            let stopped = s.visit_after(0, &mut |seq, _| {
                seen += 1;
                match seq {
                    7 => Err(StorageError::Io("stop".into())),
                    _ => Ok(()),
                }
            });
            assert!(matches!(stopped, Err(StorageError::Io(m)) if m == "stop"));
            assert_eq!(seen, 7);
        }
    }
}
