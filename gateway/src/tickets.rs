//! Signed e-tickets: each ticket's `code` is an Ed25519 signature over (event, section, seat,
//! order, ticket id) that a door scanner verifies offline with the public key
//! (`boxoffice ticket public-key`, `boxoffice ticket verify CODE`).
//!
//! Code: `base64url(payload) "." base64url(signature)`, no padding; payload is the text
//! `bt1\n{event}\n{section}\n{seat}\n{order}\n{ticket}` (seat empty for general admission).
//! The signing key is a 32-byte seed kept in the data dir (`ticket-signing.key`, hex), created on
//! first start, so codes stay valid across restarts. Ed25519 signatures are deterministic: the
//! same ticket always shows the same code.

use std::path::Path;

use anyhow::Context;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};

/// File name of the signing key inside the data dir.
pub const KEY_FILE: &str = "ticket-signing.key";
const VERSION: &str = "bt1";

/// What a ticket code says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TicketClaims {
    /// The event.
    pub event_id: String,
    /// The section.
    pub section_id: String,
    /// The seat (empty for general admission).
    pub seat_id: String,
    /// The order.
    pub order_id: String,
    /// The ticket.
    pub ticket_id: String,
}

/// Signs ticket codes.
#[derive(Clone)]
pub struct TicketSigner {
    key: SigningKey,
}

impl TicketSigner {
    /// A signer from a 32-byte seed.
    pub fn from_seed(seed: [u8; 32]) -> TicketSigner {
        TicketSigner {
            key: SigningKey::from_bytes(&seed),
        }
    }

    /// Loads the key from `dir/ticket-signing.key`, creating it (random) if missing.
    pub fn load_or_create(dir: &Path) -> anyhow::Result<TicketSigner> {
        let path = dir.join(KEY_FILE);
        if path.exists() {
            return Self::load(dir);
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut seed = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut seed);
        std::fs::write(&path, hex::encode(seed))
            .with_context(|| format!("writing {}", path.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
        }
        Ok(Self::from_seed(seed))
    }

    /// Loads the key from `dir/ticket-signing.key`.
    pub fn load(dir: &Path) -> anyhow::Result<TicketSigner> {
        let path = dir.join(KEY_FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let bytes = hex::decode(text.trim()).context("the ticket key is not hex")?;
        let seed: [u8; 32] = bytes
            .try_into()
            .map_err(|_| anyhow::anyhow!("the ticket key must be 32 bytes"))?;
        Ok(Self::from_seed(seed))
    }

    /// The public key, hex: what door scanners need.
    pub fn public_key_hex(&self) -> String {
        hex::encode(self.key.verifying_key().to_bytes())
    }

    /// The code of a ticket.
    pub fn sign(&self, t: &TicketClaims) -> String {
        let payload = format!(
            "{VERSION}\n{}\n{}\n{}\n{}\n{}",
            t.event_id, t.section_id, t.seat_id, t.order_id, t.ticket_id
        );
        let sig = self.key.sign(payload.as_bytes());
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload.as_bytes()),
            URL_SAFE_NO_PAD.encode(sig.to_bytes())
        )
    }
}

/// Why a code does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    /// Not a code of ours.
    #[error("malformed ticket code")]
    Malformed,
    /// The signature does not match (forged, altered, or another key).
    #[error("bad signature: not a genuine ticket for this key")]
    BadSignature,
    /// The public key given is not a valid Ed25519 key.
    #[error("invalid public key")]
    BadKey,
}

/// Parses a hex public key.
pub fn public_key(hex_key: &str) -> Result<VerifyingKey, TicketError> {
    let bytes: [u8; 32] = hex::decode(hex_key.trim())
        .map_err(|_| TicketError::BadKey)?
        .try_into()
        .map_err(|_| TicketError::BadKey)?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| TicketError::BadKey)
}

/// Verifies a code offline with the public key; returns what it says.
pub fn verify(code: &str, key: &VerifyingKey) -> Result<TicketClaims, TicketError> {
    let (p64, s64) = code.trim().split_once('.').ok_or(TicketError::Malformed)?;
    let payload = URL_SAFE_NO_PAD
        .decode(p64)
        .map_err(|_| TicketError::Malformed)?;
    let sig: [u8; 64] = URL_SAFE_NO_PAD
        .decode(s64)
        .map_err(|_| TicketError::Malformed)?
        .try_into()
        .map_err(|_| TicketError::Malformed)?;
    key.verify(&payload, &Signature::from_bytes(&sig))
        .map_err(|_| TicketError::BadSignature)?;
    let text = String::from_utf8(payload).map_err(|_| TicketError::Malformed)?;
    let parts: Vec<&str> = text.split('\n').collect();
    match parts.as_slice() {
        [VERSION, event, section, seat, order, ticket] => Ok(TicketClaims {
            event_id: (*event).to_owned(),
            section_id: (*section).to_owned(),
            seat_id: (*seat).to_owned(),
            order_id: (*order).to_owned(),
            ticket_id: (*ticket).to_owned(),
        }),
        _ => Err(TicketError::Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> TicketClaims {
        TicketClaims {
            event_id: "e9".into(),
            section_id: "orch".into(),
            seat_id: "orch:A:12".into(),
            order_id: "e9.orch.o01".into(),
            ticket_id: "e9.orch.o01.1".into(),
        }
    }

    #[test]
    fn codes_verify_and_every_flipped_bit_or_other_key_fails() {
        let s = TicketSigner::from_seed([7; 32]);
        let code = s.sign(&claims());
        let key = public_key(&s.public_key_hex()).unwrap();
        assert_eq!(verify(&code, &key), Ok(claims()));
        assert_eq!(s.sign(&claims()), code, "deterministic");
        let bytes = code.as_bytes();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.to_vec();
                b[i] ^= 1 << bit;
                let Ok(text) = String::from_utf8(b) else {
                    continue;
                };
                if text == code {
                    continue;
                }
                assert!(verify(&text, &key).is_err(), "flip {i}:{bit} verified");
            }
        }
        let other = TicketSigner::from_seed([8; 32]);
        let other_key = public_key(&other.public_key_hex()).unwrap();
        assert_eq!(verify(&code, &other_key), Err(TicketError::BadSignature));
        assert_eq!(public_key("zz"), Err(TicketError::BadKey));
    }

    #[test]
    fn the_key_persists_in_the_data_dir() {
        let dir = tempfile::tempdir().unwrap();
        let a = TicketSigner::load_or_create(dir.path()).unwrap();
        let b = TicketSigner::load_or_create(dir.path()).unwrap();
        assert_eq!(a.public_key_hex(), b.public_key_hex());
        assert_eq!(a.sign(&claims()), b.sign(&claims()));
    }
}
