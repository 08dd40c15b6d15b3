//! The log codec: the one place that knows how a record becomes bytes.
//!
//! Frame: `[version: u8][crc32 of payload: u32 LE][payload: bincode 2, standard config]`.
//! Changing the encoding means a new version byte and a decoder for the old one here; nothing
//! else in the engine sees bytes.

use serde::{Serialize, de::DeserializeOwned};

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

/// Encodes a value into a framed record.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![CODEC_VERSION, 0, 0, 0, 0];
    // Encoding our own plain data types into a Vec cannot fail; an error here would be a bug.
    let payload = bincode::serde::encode_to_vec(value, bincode::config::standard())
        .expect("log records always encode");
    let crc = crc32fast::hash(&payload);
    out[1..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&payload);
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
    let payload = verify(bytes)?;
    let (value, used) = bincode::serde::decode_from_slice(payload, bincode::config::standard())
        .map_err(|e| DecodeError::Payload(e.to_string()))?;
    if used != payload.len() {
        return Err(DecodeError::Payload(format!(
            "{} trailing bytes",
            payload.len() - used
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

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
