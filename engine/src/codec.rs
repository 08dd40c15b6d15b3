//! The log codec: the one place that knows how a record becomes bytes.
//!
//! Frame: `[version: u8][crc32 of payload: u32 LE][payload: bincode 2, standard config]`.
//! Changing the encoding means a new version byte and a decoder for the old one here; nothing
//! else in the engine sees bytes.

use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// The version byte written in front of every record today. Version 2 came with the
/// superblock, retention times in ledger records and withdrawn places in section checkpoints;
/// version 1 logs are refused at start (no migration: nothing before it was released).
pub const CODEC_VERSION: u8 = 2;
const HEADER_LEN: usize = 5;

/// Why bytes did not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than the header.
    #[error("truncated: {0} bytes")]
    Truncated(usize),
    /// A version byte this build does not know.
    #[error("unknown codec version {0}")]
    Version(u8),
    /// The payload's checksum does not match: torn or corrupted.
    #[error("checksum mismatch")]
    Checksum,
    /// Checksum fine but bincode could not decode (a bug, or a format change without a version).
    #[error("undecodable payload: {0}")]
    Payload(String),
}

/// The room [`encode`] starts with.
const ENCODE_ROOM: usize = 256;

/// Encodes a value into a framed record.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Encoded in place after the header, into room for a typical record (a hold's record and
    // its change are 100-300 bytes): no second buffer, few regrowths.
    let mut out = Vec::with_capacity(ENCODE_ROOM);
    out.extend_from_slice(&[CODEC_VERSION, 0, 0, 0, 0]);
    // Encoding our own plain data types into a Vec cannot fail; an error here would be a bug.
    bincode::serde::encode_into_std_write(value, &mut out, bincode::config::standard())
        .expect("log records always encode");
    let crc = crc32fast::hash(&out[HEADER_LEN..]);
    out[1..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Checks a framed record's version and checksum; returns its payload.
pub fn verify(bytes: &[u8]) -> Result<&[u8], DecodeError> {
    if bytes.len() < HEADER_LEN {
        return Err(DecodeError::Truncated(bytes.len()));
    }
    if bytes[0] != CODEC_VERSION {
        return Err(DecodeError::Version(bytes[0]));
    }
    let crc = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    let payload = &bytes[HEADER_LEN..];
    if crc32fast::hash(payload) != crc {
        return Err(DecodeError::Checksum);
    }
    Ok(payload)
}

/// Decodes a framed record, checking version and checksum.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    decode_borrowed(bytes)
}

/// Decodes a framed record into a value that may borrow from `bytes` (a `&[u8]` field is the
/// bytes as they are in the record, not copied one by one: a checkpoint's blob, tens of MB at a
/// million records, decoded as a `Vec<u8>` went byte by byte through serde's sequence).
pub fn decode_borrowed<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, DecodeError> {
    let payload = verify(bytes)?;
    let (value, used) =
        bincode::serde::borrow_decode_from_slice(payload, bincode::config::standard())
            .map_err(|e| DecodeError::Payload(e.to_string()))?;
    if used != payload.len() {
        return Err(DecodeError::Payload(format!(
            "{} trailing bytes",
            payload.len() - used
        )));
    }
    Ok(value)
}

/// Decodes a framed record of a value followed by an extension that later builds write after
/// it (an encoded `(T, E)`): a record written before the extension existed holds the value
/// alone, and decodes with `E`'s default. Nothing is ambiguous: the value's own encoding ends
/// where its decoder stops.
pub fn decode_extended<T: DeserializeOwned, E: DeserializeOwned + Default>(
    bytes: &[u8],
) -> Result<(T, E), DecodeError> {
    decode_extended2::<T, E, ()>(bytes).map(|(value, extension, ())| (value, extension))
}

/// [`decode_extended`] with two extensions, each optional in turn: a value written with the
/// first extension only decodes with the second's default, one written alone with both
/// defaults.
pub fn decode_extended2<T, E1, E2>(bytes: &[u8]) -> Result<(T, E1, E2), DecodeError>
where
    T: DeserializeOwned,
    E1: DeserializeOwned + Default,
    E2: DeserializeOwned + Default,
{
    decode_extended3::<T, E1, E2, ()>(bytes)
        .map(|(value, first, second, ())| (value, first, second))
}

/// [`decode_extended2`] with a third extension, optional as the others are.
pub fn decode_extended3<T, E1, E2, E3>(bytes: &[u8]) -> Result<(T, E1, E2, E3), DecodeError>
where
    T: DeserializeOwned,
    E1: DeserializeOwned + Default,
    E2: DeserializeOwned + Default,
    E3: DeserializeOwned + Default,
{
    decode_extended4::<T, E1, E2, E3, ()>(bytes)
        .map(|(value, first, second, third, ())| (value, first, second, third))
}

/// [`decode_extended3`] with a fourth extension, optional as the others are.
#[allow(clippy::type_complexity)]
pub fn decode_extended4<T, E1, E2, E3, E4>(bytes: &[u8]) -> Result<(T, E1, E2, E3, E4), DecodeError>
where
    T: DeserializeOwned,
    E1: DeserializeOwned + Default,
    E2: DeserializeOwned + Default,
    E3: DeserializeOwned + Default,
    E4: DeserializeOwned + Default,
{
    let payload = verify(bytes)?;
    let config = bincode::config::standard();
    let (value, used) = bincode::serde::decode_from_slice(payload, config)
        .map_err(|e| DecodeError::Payload(e.to_string()))?;
    let mut rest = &payload[used..];
    let first: E1 = next_extension(&mut rest, "extension")?;
    let second: E2 = next_extension(&mut rest, "second extension")?;
    let third: E3 = next_extension(&mut rest, "third extension")?;
    let fourth: E4 = next_extension(&mut rest, "fourth extension")?;
    if !rest.is_empty() {
        return Err(DecodeError::Payload(format!(
            "{} trailing bytes",
            rest.len()
        )));
    }
    Ok((value, first, second, third, fourth))
}

/// The next extension of `rest` (moving past it), or its default where nothing is left.
fn next_extension<E: DeserializeOwned + Default>(
    rest: &mut &[u8],
    which: &str,
) -> Result<E, DecodeError> {
    if rest.is_empty() {
        return Ok(E::default());
    }
    let (e, n) = bincode::serde::decode_from_slice(rest, bincode::config::standard())
        .map_err(|e| DecodeError::Payload(format!("{which}: {e}")))?;
    *rest = &rest[n..];
    Ok(e)
}

/// The first 8 bytes (little-endian) of the SHA-256 of `value`'s framed record, as [`encode`]
/// would make it: a request's idempotency fingerprint. Computed without making the record: the
/// encoder's output is fed to the payload's CRC32, then to the digest behind the header, so no
/// bytes are kept. The same value as hashing [`encode`]'s output (fingerprints already in a log
/// still match).
pub fn fingerprint<T: Serialize>(value: &T) -> u64 {
    use sha2::{Digest, Sha256};
    let config = bincode::config::standard();
    let mut crc = crc32fast::Hasher::new();
    // Feeding our own plain data types to a hasher cannot fail; an error here would be a bug.
    bincode::serde::encode_into_writer(value, Feed(|b: &[u8]| crc.update(b)), config)
        .expect("log records always encode");
    let mut digest = Sha256::new();
    digest.update([CODEC_VERSION]);
    digest.update(crc.finalize().to_le_bytes());
    bincode::serde::encode_into_writer(value, Feed(|b: &[u8]| digest.update(b)), config)
        .expect("log records always encode");
    let digest = digest.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// An encoder's output handed to a function as it comes.
struct Feed<F: FnMut(&[u8])>(F);

impl<F: FnMut(&[u8])> bincode::enc::write::Writer for Feed<F> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        (self.0)(bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fingerprint of a record as earlier builds computed it: the SHA-256 of its bytes.
    fn fingerprint_of_bytes<T: Serialize>(value: &T) -> u64 {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(encode(value));
        u64::from_le_bytes(digest[..8].try_into().unwrap())
    }

    #[test]
    fn a_fingerprint_is_the_digest_of_the_record_it_does_not_make() {
        let values = [
            (0u8, String::new(), vec![]),
            (1, "e9".to_owned(), vec![2u32]),
            (7, "x".repeat(300), (0..200).collect()),
        ];
        for v in &values {
            assert_eq!(fingerprint(v), fingerprint_of_bytes(v));
        }
        assert_ne!(fingerprint(&values[0]), fingerprint(&values[1]));
        // The log's own request types, as the engine fingerprints them.
        let hold = (
            crate::ledger::Rpc::Hold,
            crate::EventId::from("e9"),
            crate::Selection::BestAvailable {
                section: Some(crate::SectionId::from("floor")),
                quantity: 2,
            },
        );
        assert_eq!(fingerprint(&hold), fingerprint_of_bytes(&hold));
    }

    #[test]
    fn an_extension_decodes_after_its_value_and_is_default_in_older_records() {
        let value = (7u64, String::from("core"));
        let old = encode(&value);
        assert_eq!(
            decode_extended::<(u64, String), Option<u64>>(&old),
            Ok((value.clone(), None))
        );
        let new = encode(&(&value, &Some(99u64)));
        assert_eq!(
            decode_extended::<(u64, String), Option<u64>>(&new),
            Ok((value.clone(), Some(99)))
        );
        let mut longer = encode(&(&value, &Some(99u64), 5u8));
        assert!(decode_extended::<(u64, String), Option<u64>>(&longer).is_err());
        longer.truncate(old.len() + 1);
        assert!(decode_extended::<(u64, String), Option<u64>>(&longer).is_err());
    }

    /// A blob encoded as a sequence of bytes (`Vec<u8>`, `&[u8]`: how checkpoints are written)
    /// decodes borrowed as the same bytes, and as a `Vec<u8>` as before; damage is caught alike.
    #[test]
    fn a_blob_decodes_borrowed_as_it_was_written() {
        let blob: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for bytes in [encode(&(9u64, &blob)), encode(&(9u64, blob.as_slice()))] {
            let (upto, borrowed): (u64, &[u8]) = decode_borrowed(&bytes).unwrap();
            assert_eq!((upto, borrowed), (9, blob.as_slice()));
            assert_eq!(decode::<(u64, Vec<u8>)>(&bytes).unwrap(), (9, blob.clone()));
            let mut bad = bytes.clone();
            bad[HEADER_LEN + 3] ^= 1;
            assert_eq!(
                decode_borrowed::<(u64, &[u8])>(&bad),
                Err(DecodeError::Checksum)
            );
            let mut longer = encode(&(9u64, &blob, 1u8));
            assert!(decode_borrowed::<(u64, &[u8])>(&longer).is_err());
            longer.truncate(bytes.len() - 1);
            assert!(decode_borrowed::<(u64, &[u8])>(&longer).is_err());
        }
    }

    #[test]
    fn round_trip_and_every_damage_is_caught() {
        let value = (42u64, String::from("hold"), vec![1u32, 2, 3]);
        let bytes = encode(&value);
        assert_eq!(decode::<(u64, String, Vec<u32>)>(&bytes), Ok(value));
        for cut in 0..bytes.len() {
            assert!(
                decode::<(u64, String, Vec<u32>)>(&bytes[..cut]).is_err(),
                "cut {cut}"
            );
        }
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(decode::<(u64, String, Vec<u32>)>(&b).is_err(), "bit {bit}");
        }
    }
}
