//! The join proof of work of the contract (`docs/api.md` 3.1): the rule both the server (which
//! checks a solution) and clients (which find one) must compute the same way, so it lives with
//! the contract.
//!
//! A solution of a challenge at `bits` of difficulty is a `u64` nonce such that
//! `SHA-256(challenge as UTF-8 bytes || nonce as 8 big-endian bytes)` starts with at least
//! `bits` zero bits (counted from the most significant bit of the first byte). A solver tries
//! about `2^bits` nonces on average; a checker computes one hash.

use sha2::{Digest, Sha256};

/// The hash of a challenge and a nonce.
pub fn pow_hash(challenge: &str, nonce: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(challenge.as_bytes());
    h.update(nonce.to_be_bytes());
    h.finalize().into()
}

/// The leading zero bits of a hash.
pub fn leading_zero_bits(hash: &[u8; 32]) -> u32 {
    let mut bits = 0;
    for b in hash {
        if *b != 0 {
            return bits + b.leading_zeros();
        }
        bits += 8;
    }
    bits
}

/// Whether `nonce` solves `challenge` at `bits` of difficulty (0 bits: every nonce does).
pub fn is_solution(challenge: &str, nonce: u64, bits: u32) -> bool {
    bits == 0 || leading_zero_bits(&pow_hash(challenge, nonce)) >= bits
}

/// Finds the first nonce from 0 up that solves `challenge` at `bits` of difficulty: about
/// `2^bits` hashes on average (0 bits: nonce 0 at once). The challenge's bytes are hashed once;
/// each try hashes only the nonce on top of that state. Servers ask for at most 32 bits
/// (about 4 billion hashes).
pub fn solve(challenge: &str, bits: u32) -> u64 {
    if bits == 0 {
        return 0;
    }
    let mut prefix = Sha256::new();
    prefix.update(challenge.as_bytes());
    let mut nonce = 0u64;
    loop {
        let mut h = prefix.clone();
        h.update(nonce.to_be_bytes());
        let hash: [u8; 32] = h.finalize().into();
        if leading_zero_bits(&hash) >= bits {
            return nonce;
        }
        nonce = nonce.wrapping_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_zero_bits_counts_from_the_first_byte() {
        let mut h = [0u8; 32];
        assert_eq!(leading_zero_bits(&h), 256);
        h[0] = 0x80;
        assert_eq!(leading_zero_bits(&h), 0);
        h[0] = 0x01;
        assert_eq!(leading_zero_bits(&h), 7);
        h[0] = 0;
        h[1] = 0x10;
        assert_eq!(leading_zero_bits(&h), 11);
        h[1] = 0;
        h[2] = 0xff;
        assert_eq!(leading_zero_bits(&h), 16);
    }

    #[test]
    fn the_hash_is_sha256_of_the_challenge_then_the_big_endian_nonce() {
        // Computed independently (Python: hashlib.sha256(b"abc" + bytes([0,0,0,0,0,0,1,2]))).
        let expected = "c1ddcc50ff7d3c4833b69831751598e6a9861384ea00f74a45c9f38d92645e5c";
        let got: String = pow_hash("abc", 0x0102)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn solutions_solve_and_others_do_not() {
        for bits in [0, 1, 8, 12] {
            for c in ["c1", "another challenge", ""] {
                let n = solve(c, bits);
                assert!(is_solution(c, n, bits), "{c} {bits}");
                assert!(leading_zero_bits(&pow_hash(c, n)) >= bits);
                // The solver returns the first solution: every smaller nonce fails.
                for m in 0..n.min(5_000) {
                    assert!(!is_solution(c, m, bits) || bits == 0, "{c} {bits} {m}");
                }
            }
        }
        // A nonce that solves one challenge solves another only by chance: over 64 challenges
        // at 12 bits, expected 64/4096 accidents; require most to fail.
        let n = solve("c1", 12);
        let accidents = (0..64)
            .filter(|i| is_solution(&format!("c1-{i}"), n, 12))
            .count();
        assert!(accidents < 4, "{accidents}");
    }
}
