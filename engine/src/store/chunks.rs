//! Log format 3: a group commit's records of one stream as few values (chunks), not one value
//! per record.
//!
//! A stream's tree maps a sequence number to a value, which is either
//! - one framed record ([`crate::codec`]: it begins with the codec's version byte), keyed by its
//!   sequence number: every record of format 2, and a chunk of one record in format 3; or
//! - a **chunk** of several records, keyed by its **last** record's sequence number:
//!   `[CHUNK_TAG][crc32 of the index: u32 LE][count: u32 LE][index][records]`, the index being
//!   `count` times `(seq: u64 LE, len: u32 LE)`, the records their framed bytes one after the
//!   other. Each record keeps its own frame (version and checksum), so damage inside a chunk is
//!   named record by record; damage to the index is named at the chunk's key (the chunk's
//!   bytes as one bad record, its other numbers a gap).
//!
//! A chunk is at most [`CHUNK_BYTES`] long, head and index counted (a record larger than that
//! is a value of its own). The bound is set by sled's leaves, not by the values alone: sled
//! splits a leaf once it holds more than 16 items, whatever their size, and writes a whole
//! leaf again at each split and consolidation; a message over a quarter of its 512 KiB segment
//! goes to a file of its own under `blobs/`, which every sync must then fsync with its
//! directory. So a leaf of 17 full chunks stays under that threshold: with 16 KiB chunks it did
//! not, and the actor bench lost about a quarter of its durable holds/s to blob files
//! (BENCHMARKS.md, "The actor row again").
//!
//! Readers take both kinds of value in any mix: a data dir of format 2 opens as it is and new
//! commits are written as chunks (a migration in place, record by record as the log turns
//! over; nothing to run). Chunks written under another bound read the same.

use super::sled_kv::{BLOB_THRESHOLD, LEAF_ITEMS_MAX};

/// The first byte of a chunk (never a codec version byte).
pub const CHUNK_TAG: u8 = 0xC3;

/// The most bytes one chunk takes, head and index counted (a single larger record is a value
/// of its own).
pub const CHUNK_BYTES: usize = 6 * 1024;

// A leaf of full chunks, each item's key and sled's framing generously counted, is no blob:
// checked when the crate is built.
const _: () = assert!(LEAF_ITEMS_MAX * (CHUNK_BYTES + 8 + 64) < BLOB_THRESHOLD);

const HEAD: usize = 1 + 4 + 4;
const INDEX_ENTRY: usize = 8 + 4;

/// Splits a group commit's entries (ascending) into chunks of at most [`CHUNK_BYTES`] each,
/// head and index counted: each `(key, value)` to write, the key the last record's number.
pub fn pack(entries: &[(u64, Vec<u8>)]) -> Vec<(u64, Vec<u8>)> {
    // What a record adds to its chunk: its index entry and its bytes.
    let cost = |(_, bytes): &(u64, Vec<u8>)| INDEX_ENTRY + bytes.len();
    let mut out = Vec::new();
    let mut start = 0;
    while start < entries.len() {
        let mut end = start + 1;
        let mut bytes = HEAD + cost(&entries[start]);
        while end < entries.len() && bytes + cost(&entries[end]) <= CHUNK_BYTES {
            bytes += cost(&entries[end]);
            end += 1;
        }
        out.push(chunk(&entries[start..end]));
        start = end;
    }
    out
}

/// One value for `entries` (a lone record as it is).
fn chunk(entries: &[(u64, Vec<u8>)]) -> (u64, Vec<u8>) {
    let last = entries.last().map_or(0, |(seq, _)| *seq);
    if let [(seq, bytes)] = entries {
        return (*seq, bytes.clone());
    }
    let records: usize = entries.iter().map(|(_, b)| b.len()).sum();
    let mut value = Vec::with_capacity(HEAD + entries.len() * INDEX_ENTRY + records);
    value.push(CHUNK_TAG);
    value.extend_from_slice(&[0; 4]);
    value.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (seq, bytes) in entries {
        value.extend_from_slice(&seq.to_le_bytes());
        value.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    }
    let crc = crc32fast::hash(&value[5..]);
    value[1..5].copy_from_slice(&crc.to_le_bytes());
    for (_, bytes) in entries {
        value.extend_from_slice(bytes);
    }
    (last, value)
}

/// The records a value stored at `key` holds, in order: a lone record as it is; a chunk's
/// records; a chunk whose index is damaged as one bad record at `key` (its frame fails).
pub fn unpack(key: u64, value: Vec<u8>) -> Vec<(u64, Vec<u8>)> {
    if value.first() != Some(&CHUNK_TAG) {
        return vec![(key, value)];
    }
    let mut records = Vec::new();
    let unpacked: Result<(), std::convert::Infallible> = unpack_each(key, &value, |seq, record| {
        records.push((seq, record.to_vec()));
        Ok(())
    });
    match unpacked {
        Ok(()) => records,
    }
}

/// [`unpack`] without copying: `each` is given the value's records in order, borrowed; the
/// first error it returns stops the walk.
pub fn unpack_each<E>(
    key: u64,
    value: &[u8],
    mut each: impl FnMut(u64, &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    if value.first() == Some(&CHUNK_TAG)
        && let Some(index) = index(value)
    {
        let mut at = HEAD + index.len() * INDEX_ENTRY;
        for (seq, len) in index {
            each(seq, &value[at..at + len])?;
            at += len;
        }
        return Ok(());
    }
    each(key, value)
}

/// A chunk's index, if it is whole: its checksum holds, its numbers ascend, its lengths fill
/// the value exactly.
fn index(value: &[u8]) -> Option<Vec<(u64, usize)>> {
    let head = value.get(..HEAD)?;
    let crc = u32::from_le_bytes(head[1..5].try_into().ok()?);
    let count = u32::from_le_bytes(head[5..9].try_into().ok()?) as usize;
    let end = HEAD.checked_add(count.checked_mul(INDEX_ENTRY)?)?;
    let raw = value.get(HEAD..end)?;
    if crc32fast::hash(&value[5..end]) != crc {
        return None;
    }
    let mut index = Vec::with_capacity(count);
    let mut total = end;
    for e in raw.chunks_exact(INDEX_ENTRY) {
        let seq = u64::from_le_bytes(e[..8].try_into().ok()?);
        let len = u32::from_le_bytes(e[8..].try_into().ok()?) as usize;
        if index.last().is_some_and(|(prev, _)| *prev >= seq) {
            return None;
        }
        total = total.checked_add(len)?;
        index.push((seq, len));
    }
    (total == value.len()).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(n: u64, len: usize) -> Vec<(u64, Vec<u8>)> {
        (1..=n)
            .map(|seq| (seq, crate::codec::encode(&vec![seq as u8; len])))
            .collect()
    }

    #[test]
    fn chunks_hold_every_record_in_order_and_stay_under_the_bound() {
        let entries = records(500, 100);
        let chunks = pack(&entries);
        // Filled: every chunk but the last would be over the bound with the next record.
        let bytes: usize = entries.iter().map(|(_, b)| b.len() + INDEX_ENTRY).sum();
        let least = bytes.div_ceil(CHUNK_BYTES);
        assert!(
            chunks.len() >= least && chunks.len() <= least + 1,
            "{} chunks for {bytes} bytes",
            chunks.len()
        );
        let mut back = Vec::new();
        for (key, value) in chunks {
            assert!(value.len() <= CHUNK_BYTES, "{} bytes", value.len());
            let records = unpack(key, value);
            assert_eq!(
                records.last().map(|(s, _)| *s),
                Some(key),
                "keyed by its last"
            );
            back.extend(records);
        }
        assert_eq!(back, entries);
        // One record: written as format 2 wrote it.
        let one = records(1, 10);
        assert_eq!(pack(&one), one);
        // A record over the bound: a chunk of its own.
        let big = vec![(7, vec![1u8; CHUNK_BYTES + 1]), (8, vec![2u8; 10])];
        assert_eq!(pack(&big).len(), 2);
    }

    /// Tiny records fill a chunk with index entries as much as with bytes: still within the
    /// bound (the index is counted).
    #[test]
    fn a_chunk_of_tiny_records_counts_its_index() {
        let tiny = records(5_000, 1);
        let chunks = pack(&tiny);
        assert!(chunks.iter().all(|(_, v)| v.len() <= CHUNK_BYTES));
        assert!(
            chunks.iter().any(|(_, v)| v.len() > CHUNK_BYTES - 64),
            "chunks are filled"
        );
    }

    #[test]
    fn a_damaged_chunk_is_named_where_it_is() {
        let entries = records(5, 40);
        let (key, value) = pack(&entries).remove(0);
        // A flipped bit in a record: that record fails its own frame, the others read.
        let mut flipped = value.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        let back = unpack(key, flipped);
        assert_eq!(back.len(), 5);
        assert!(crate::codec::verify(&back[4].1).is_err());
        assert!(
            back[..4]
                .iter()
                .all(|(_, b)| crate::codec::verify(b).is_ok())
        );
        // A flipped bit in the index: the chunk as one bad record at its key.
        let mut flipped = value.clone();
        flipped[HEAD + 3] ^= 1;
        let back = unpack(key, flipped);
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].0, key);
        assert!(crate::codec::verify(&back[0].1).is_err());
        // Cut short: the same.
        let back = unpack(key, value[..value.len() - 3].to_vec());
        assert_eq!((back.len(), back[0].0), (1, key));
    }
}
