//! Signed e-tickets: each ticket's `code` is an Ed25519 signature over (key id, event, section,
//! seat, order, ticket id) that a door scanner verifies offline with the public keys
//! (`boxoffice ticket public-key`, `boxoffice ticket verify CODE`).
//!
//! Code: `base64url(payload) "." base64url(signature)`, no padding; payload is the text
//! `bt2\n{kid}\n{event}\n{section}\n{seat}\n{order}\n{ticket}` (seat empty for general
//! admission). The key id (`kid`) is the hex of the first 8 bytes of the SHA-256 of the 32-byte
//! public key, so a scanner holding several keys knows which one to check with. Codes made
//! before key ids (`bt1\n{event}\n...`, no kid) still verify: the version is the payload's first
//! line, and a `bt1` code is checked against every key of the ring (at most
//! [`TICKET_KEYS_MAX`]); the key it was made with is in the ring, because the server keeps the
//! public half of the signing key it finds at start.
//!
//! The key ring in the data dir:
//! - `ticket-signing.key`: the 32-byte seed (hex) of the key that signs now, created on first
//!   start, so codes stay valid across restarts. Ed25519 signatures are deterministic: the same
//!   ticket under the same key always shows the same code.
//! - `ticket-public-keys/{kid}.pub`: the public key (hex) of every key whose tickets verify, the
//!   signing one included. A rotation ([`rotate`]) makes a new signing key and keeps the old
//!   public half here, so tickets already sold keep verifying; the old private key is gone. If
//!   `ticket-signing.key` is lost, the kept public keys still verify every ticket sold.
//!
//! Every file is written to a `.tmp` beside it, synced, then renamed over its name: a crash
//! leaves the old file or the new one, never half of one. A file that does not parse is refused
//! by name, never replaced.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use sha2::{Digest, Sha256};

pub use crate::limits::TICKET_KEYS_MAX;

/// File name of the signing key inside the data dir.
pub const KEY_FILE: &str = "ticket-signing.key";
/// Folder of the public keys that verify tickets, inside the data dir (`{kid}.pub` each).
pub const PUBLIC_KEYS_DIR: &str = "ticket-public-keys";
/// Extension of a public key file in [`PUBLIC_KEYS_DIR`].
const PUBLIC_KEY_EXT: &str = "pub";
/// The code format with a key id.
const VERSION: &str = "bt2";
/// The code format before key ids.
const VERSION_BT1: &str = "bt1";
/// Bytes of SHA-256 kept as the key id.
const KEY_ID_BYTES: usize = 8;

/// The id of a ticket key: the first 8 bytes of the SHA-256 of its public key, shown as hex.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId([u8; KEY_ID_BYTES]);

impl KeyId {
    /// The id of `key`.
    pub fn of(key: &VerifyingKey) -> KeyId {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let mut id = [0u8; KEY_ID_BYTES];
        id.copy_from_slice(&digest[..KEY_ID_BYTES]);
        KeyId(id)
    }

    /// Parses the hex form (16 lowercase or uppercase hex digits).
    pub fn parse(text: &str) -> Option<KeyId> {
        hex::decode(text).ok()?.try_into().ok().map(KeyId)
    }
}

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// A public key that verifies tickets, with its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    kid: KeyId,
    key: VerifyingKey,
}

impl PublicKey {
    /// The key with its id.
    pub fn new(key: VerifyingKey) -> PublicKey {
        PublicKey {
            kid: KeyId::of(&key),
            key,
        }
    }

    /// Parses a hex public key (64 hex digits).
    pub fn from_hex(hex_key: &str) -> Result<PublicKey, TicketError> {
        let bytes: [u8; 32] = hex::decode(hex_key.trim())
            .map_err(|_| TicketError::BadKey)?
            .try_into()
            .map_err(|_| TicketError::BadKey)?;
        PublicKey::from_bytes(&bytes)
    }

    /// The key's id.
    pub fn kid(&self) -> KeyId {
        self.kid
    }

    /// The key's 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<PublicKey, TicketError> {
        VerifyingKey::from_bytes(bytes)
            .map(PublicKey::new)
            .map_err(|_| TicketError::BadKey)
    }

    /// The key, hex: what door scanners need.
    pub fn to_hex(&self) -> String {
        hex::encode(self.key.to_bytes())
    }
}

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

/// A code that verified: what it says and the key that signed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// What the code says.
    pub claims: TicketClaims,
    /// The key whose signature it carries.
    pub kid: KeyId,
    /// False for a `bt1` code (made before key ids; its key was found by trying each).
    pub kid_in_code: bool,
}

/// Signs ticket codes.
#[derive(Clone)]
pub struct TicketSigner {
    key: SigningKey,
    public: PublicKey,
}

impl TicketSigner {
    /// A signer from a 32-byte seed.
    pub fn from_seed(seed: [u8; 32]) -> TicketSigner {
        let key = SigningKey::from_bytes(&seed);
        TicketSigner {
            public: PublicKey::new(key.verifying_key()),
            key,
        }
    }

    /// The public half, with its id.
    pub fn public_key(&self) -> &PublicKey {
        &self.public
    }

    /// The 32-byte seed the key is made from (its secret).
    pub(crate) fn seed(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// The id of the key, carried by every code it signs.
    pub fn kid(&self) -> KeyId {
        self.public.kid
    }

    /// `payload` signed: `base64url(payload) "." base64url(Ed25519 signature)`, as codes and
    /// revocation lists are written.
    fn seal(&self, payload: &str) -> String {
        let sig = self.key.sign(payload.as_bytes());
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload.as_bytes()),
            URL_SAFE_NO_PAD.encode(sig.to_bytes())
        )
    }

    /// The code of a ticket.
    pub fn sign(&self, t: &TicketClaims) -> String {
        let payload = format!(
            "{VERSION}\n{}\n{}\n{}\n{}\n{}\n{}",
            self.kid(),
            t.event_id,
            t.section_id,
            t.seat_id,
            t.order_id,
            t.ticket_id
        );
        self.seal(&payload)
    }
}

impl TicketSigner {
    /// The signed text of `list`, an event's revocation list: `base64url(payload) "."
    /// base64url(signature)`, the payload `brl1`, the key id, the event, the time (Unix ms) and
    /// each ticket id, one per line.
    pub fn sign_revocations(&self, list: &Revocations) -> String {
        let mut payload = format!(
            "{REVOCATIONS_VERSION}\n{}\n{}\n{}",
            self.kid(),
            list.event_id,
            list.as_of_ms
        );
        for t in &list.ticket_ids {
            payload.push('\n');
            payload.push_str(t);
        }
        self.seal(&payload)
    }
}

/// The first line of a revocation list's signed payload.
const REVOCATIONS_VERSION: &str = "brl1";

/// An event's revocation list: the tickets whose codes no longer admit anyone (given back, or
/// moved to another fan), as of a time. A gate checks a code against the latest list it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revocations {
    /// The event.
    pub event_id: String,
    /// When the list was made, ms since the Unix epoch: it holds every revocation made before.
    pub as_of_ms: u64,
    /// The revoked tickets' ids, ascending.
    pub ticket_ids: Vec<String>,
}

/// Verifies a signed revocation list ([`TicketSigner::sign_revocations`]) with the keys that
/// verify tickets; returns it and the key that signed it.
pub fn verify_revocations(
    signed: &str,
    keys: &[PublicKey],
) -> Result<(Revocations, KeyId), TicketError> {
    let (payload, sig) = open_signed(signed)?;
    let text = std::str::from_utf8(&payload).map_err(|_| TicketError::Malformed)?;
    let mut lines = text.split('\n');
    if lines.next() != Some(REVOCATIONS_VERSION) {
        return Err(TicketError::Malformed);
    }
    let kid = lines
        .next()
        .and_then(KeyId::parse)
        .ok_or(TicketError::Malformed)?;
    let key = keys
        .iter()
        .find(|k| k.kid == kid)
        .ok_or(TicketError::UnknownKey(kid))?;
    key.key
        .verify(&payload, &sig)
        .map_err(|_| TicketError::BadSignature)?;
    let event_id = lines.next().ok_or(TicketError::Malformed)?.to_owned();
    let as_of_ms = lines
        .next()
        .and_then(|t| t.parse().ok())
        .ok_or(TicketError::Malformed)?;
    let list = Revocations {
        event_id,
        as_of_ms,
        ticket_ids: lines.map(str::to_owned).collect(),
    };
    Ok((list, kid))
}

/// Why a code does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    /// Not a code of ours.
    #[error("malformed ticket code")]
    Malformed,
    /// The signature does not match (forged, altered, or another key).
    #[error("bad signature: not a genuine ticket for these keys (forged or altered)")]
    BadSignature,
    /// The code names a key that is not among those given.
    #[error(
        "signed with key {0}, which is not among the keys that verify tickets here \
         (not ours, or a retired key whose public half was removed)"
    )]
    UnknownKey(KeyId),
    /// The public key given is not a valid Ed25519 key.
    #[error("invalid public key: expected 64 hex digits of an Ed25519 public key")]
    BadKey,
}

/// The payload and signature of a signed text ([`TicketSigner::seal`]'s form), unchecked.
fn open_signed(text: &str) -> Result<(Vec<u8>, Signature), TicketError> {
    let (p64, s64) = text.trim().split_once('.').ok_or(TicketError::Malformed)?;
    let payload = URL_SAFE_NO_PAD
        .decode(p64)
        .map_err(|_| TicketError::Malformed)?;
    let sig: [u8; 64] = URL_SAFE_NO_PAD
        .decode(s64)
        .map_err(|_| TicketError::Malformed)?
        .try_into()
        .map_err(|_| TicketError::Malformed)?;
    Ok((payload, Signature::from_bytes(&sig)))
}

/// Verifies a code offline with the keys that verify tickets; returns what it says and which key
/// signed it. A `bt2` code is checked with the key it names only; a `bt1` code with each key.
pub fn verify(code: &str, keys: &[PublicKey]) -> Result<Verified, TicketError> {
    let (payload, sig) = open_signed(code)?;
    let text = std::str::from_utf8(&payload).map_err(|_| TicketError::Malformed)?;
    let parts: Vec<&str> = text.split('\n').collect();
    let claims = |[event, section, seat, order, ticket]: [&str; 5]| TicketClaims {
        event_id: event.to_owned(),
        section_id: section.to_owned(),
        seat_id: seat.to_owned(),
        order_id: order.to_owned(),
        ticket_id: ticket.to_owned(),
    };
    match parts.as_slice() {
        [VERSION, kid, event, section, seat, order, ticket] => {
            let kid = KeyId::parse(kid).ok_or(TicketError::Malformed)?;
            let key = keys
                .iter()
                .find(|k| k.kid == kid)
                .ok_or(TicketError::UnknownKey(kid))?;
            key.key
                .verify(&payload, &sig)
                .map_err(|_| TicketError::BadSignature)?;
            Ok(Verified {
                claims: claims([event, section, seat, order, ticket]),
                kid,
                kid_in_code: true,
            })
        }
        [VERSION_BT1, event, section, seat, order, ticket] => {
            let key = keys
                .iter()
                .find(|k| k.key.verify(&payload, &sig).is_ok())
                .ok_or(TicketError::BadSignature)?;
            Ok(Verified {
                claims: claims([event, section, seat, order, ticket]),
                kid: key.kid,
                kid_in_code: false,
            })
        }
        _ => Err(TicketError::Malformed),
    }
}

/// The ticket keys of a data dir: the signing key (if present) and every public key that
/// verifies tickets.
#[derive(Clone)]
pub struct KeyRing {
    signer: Option<TicketSigner>,
    /// The signing key's public half first (when there is one), then the others by id.
    keys: Vec<PublicKey>,
}

impl KeyRing {
    /// Reads the ring of `dir` without changing anything. A missing signing key or public-key
    /// folder is not an error (the ring is then smaller, or empty); a file that does not parse
    /// is, naming the file. The signing key's public half is in [`KeyRing::keys`] even when its
    /// `.pub` file was not written yet (a data dir from before key rings).
    pub fn load(dir: &Path) -> anyhow::Result<KeyRing> {
        let signer = read_signing_key(dir)?;
        let mut keys = read_public_keys(dir)?;
        if let Some(s) = &signer {
            keys.retain(|k| k.kid != s.kid());
            keys.insert(0, s.public.clone());
        }
        anyhow::ensure!(
            keys.len() <= TICKET_KEYS_MAX,
            "{} holds {} ticket keys, more than {TICKET_KEYS_MAX}: remove the .pub files of \
             retired keys whose tickets no longer need to verify",
            dir.join(PUBLIC_KEYS_DIR).display(),
            keys.len()
        );
        Ok(KeyRing { signer, keys })
    }

    /// The key that signs new tickets (`None` if `ticket-signing.key` is missing).
    pub fn signer(&self) -> Option<&TicketSigner> {
        self.signer.as_ref()
    }

    /// Every key that verifies tickets, the signing one first.
    pub fn keys(&self) -> &[PublicKey] {
        &self.keys
    }

    /// Verifies a code with the ring's keys.
    pub fn verify(&self, code: &str) -> Result<Verified, TicketError> {
        verify(code, &self.keys)
    }
}

/// Opens the ring of `dir` for a server: the signing key with its public half kept in the ring
/// (written if missing: the one change made to a data dir from before key rings). A missing
/// signing key is made anew only if `new_key_allowed`; `Ok(None)` otherwise.
///
/// The caller holds the data dir (its engine is open), so nothing else changes the ring meanwhile.
pub fn open_for_signing(dir: &Path, new_key_allowed: bool) -> anyhow::Result<Option<TicketSigner>> {
    let ring = KeyRing::load(dir)?;
    match ring.signer {
        Some(signer) => {
            keep_public_key(dir, signer.public_key())?;
            Ok(Some(signer))
        }
        None if new_key_allowed => new_signing_key(dir, ring.keys.len()).map(Some),
        None => Ok(None),
    }
}

/// What a rotation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rotation {
    /// The key that signed before (`None` if `ticket-signing.key` was missing).
    pub retired: Option<KeyId>,
    /// The key that signs from now on.
    pub signing: KeyId,
    /// How many keys verify tickets now (the new one included).
    pub keys: usize,
}

/// Makes a new signing key for `dir`, keeping the public half of the old one (and of every
/// key before it) so that tickets already sold keep verifying. Refused for a data dir with no
/// ticket keys at all (not a server's data dir, or a server that never started there), and when
/// the ring is full.
///
/// The server must not be running on `dir` (it reads the ring once, at start): hold the data dir
/// while rotating (see `server::rotate_ticket_key`).
pub fn rotate(dir: &Path) -> anyhow::Result<Rotation> {
    let ring = KeyRing::load(dir)?;
    anyhow::ensure!(
        !ring.keys.is_empty(),
        "{} has no ticket keys (neither {KEY_FILE} nor {PUBLIC_KEYS_DIR}/): is it the server's \
         data dir? The server makes the first key on its first start",
        dir.display()
    );
    let retired = ring
        .signer
        .as_ref()
        .map(|s| keep_public_key(dir, s.public_key()).map(|()| s.kid()));
    let retired = retired.transpose()?;
    let signer = new_signing_key(dir, ring.keys.len())?;
    Ok(Rotation {
        retired,
        signing: signer.kid(),
        keys: ring.keys.len() + 1,
    })
}

/// A new random signing key: its public half is written to the ring first, then the key file
/// replaces the old one (a crash in between leaves an extra public key nobody signs with,
/// which is harmless). `kept` is how many keys the ring holds already.
fn new_signing_key(dir: &Path, kept: usize) -> anyhow::Result<TicketSigner> {
    anyhow::ensure!(
        kept < TICKET_KEYS_MAX,
        "{} holds {kept} ticket keys, the most there may be: remove the .pub files of retired \
         keys whose tickets no longer need to verify, then try again",
        dir.join(PUBLIC_KEYS_DIR).display()
    );
    let mut seed = [0u8; 32];
    boxoffice_engine::rt::fill_random(&mut seed);
    let signer = TicketSigner::from_seed(seed);
    keep_public_key(dir, signer.public_key())?;
    write_atomically(&dir.join(KEY_FILE), hex::encode(seed).as_bytes(), true)?;
    Ok(signer)
}

/// Writes `key` to the ring unless it is there already.
pub(crate) fn keep_public_key(dir: &Path, key: &PublicKey) -> anyhow::Result<()> {
    let path = public_key_path(dir, key.kid);
    if path.exists() {
        return Ok(());
    }
    write_atomically(&path, key.to_hex().as_bytes(), false)
}

fn public_key_path(dir: &Path, kid: KeyId) -> PathBuf {
    dir.join(PUBLIC_KEYS_DIR)
        .join(format!("{kid}.{PUBLIC_KEY_EXT}"))
}

fn read_signing_key(dir: &Path) -> anyhow::Result<Option<TicketSigner>> {
    let path = dir.join(KEY_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let seed: [u8; 32] = hex::decode(text.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .with_context(|| {
            format!(
                "the ticket signing key {} is damaged (not 64 hex digits): restore it from a \
                 backup, or move it away and start with --new-ticket-key (tickets already sold \
                 keep verifying with the public keys in {PUBLIC_KEYS_DIR}/)",
                path.display()
            )
        })?;
    Ok(Some(TicketSigner::from_seed(seed)))
}

/// The public keys of the ring folder, by id. Files not ending in `.pub` (such as a `.tmp`
/// left by a crash) are not keys and are skipped.
fn read_public_keys(dir: &Path) -> anyhow::Result<Vec<PublicKey>> {
    let folder = dir.join(PUBLIC_KEYS_DIR);
    let entries = match fs::read_dir(&folder) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", folder.display())),
    };
    let mut keys = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("reading {}", folder.display()))?
            .path();
        if path.extension().and_then(|e| e.to_str()) != Some(PUBLIC_KEY_EXT) {
            continue;
        }
        anyhow::ensure!(
            keys.len() < TICKET_KEYS_MAX,
            "{} holds more than {TICKET_KEYS_MAX} ticket keys: remove the .pub files of \
             retired keys whose tickets no longer need to verify",
            folder.display()
        );
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let damaged = |why: &str| {
            anyhow::anyhow!(
                "the ticket public key {} is damaged ({why}): restore it from a backup (or \
                 remove it, and the tickets it signed no longer verify)",
                path.display()
            )
        };
        let key =
            PublicKey::from_hex(&text).map_err(|_| damaged("not an Ed25519 public key in hex"))?;
        let named = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(KeyId::parse);
        if named != Some(key.kid) {
            return Err(damaged(&format!(
                "it holds key {}, which its name does not match",
                key.kid
            )));
        }
        keys.push(key);
    }
    keys.sort_by_key(|k| k.kid);
    Ok(keys)
}

/// Writes `bytes` to `path` so that a crash leaves the old file or the new one: a `.tmp` beside
/// it, synced, renamed over it, and the folder synced. `private`: readable by the owner only.
fn write_atomically(path: &Path, bytes: &[u8], private: bool) -> anyhow::Result<()> {
    let folder = path
        .parent()
        .with_context(|| format!("{} has no folder", path.display()))?;
    fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        if private {
            options.mode(0o600);
        }
    }
    #[cfg(not(unix))]
    let _ = private;
    let write = || -> std::io::Result<()> {
        let mut file = options.open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        // The rename is durable once the folder is synced.
        fs::File::open(folder)?.sync_all()
    };
    write().with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revocation_list_verifies_with_the_ticket_keys_and_only_as_signed() {
        let signer = TicketSigner::from_seed([7; 32]);
        let other = TicketSigner::from_seed([8; 32]);
        let keys = vec![signer.public_key().clone()];
        for ids in [vec![], vec!["e.s.o1.1".to_owned(), "e.s.o1.3".to_owned()]] {
            let list = Revocations {
                event_id: "e".into(),
                as_of_ms: 1_234,
                ticket_ids: ids,
            };
            let signed = signer.sign_revocations(&list);
            assert_eq!(
                verify_revocations(&signed, &keys),
                Ok((list.clone(), signer.kid()))
            );
            assert_eq!(
                verify_revocations(&other.sign_revocations(&list), &keys),
                Err(TicketError::UnknownKey(other.kid()))
            );
            let mut altered = signed.clone().into_bytes();
            altered[10] ^= 1;
            let altered = String::from_utf8(altered).unwrap_or_default();
            assert!(verify_revocations(&altered, &keys).is_err());
        }
        // A ticket code is not a revocation list, and the other way round.
        let code = signer.sign(&TicketClaims {
            event_id: "e".into(),
            section_id: "s".into(),
            seat_id: String::new(),
            order_id: "e.s.o1".into(),
            ticket_id: "e.s.o1.1".into(),
        });
        assert_eq!(
            verify_revocations(&code, &keys),
            Err(TicketError::Malformed)
        );
        let list = signer.sign_revocations(&Revocations {
            event_id: "e".into(),
            as_of_ms: 1,
            ticket_ids: vec!["a".into(), "b".into(), "c".into()],
        });
        assert!(verify(&list, &keys).is_err());
    }

    fn claims() -> TicketClaims {
        TicketClaims {
            event_id: "e9".into(),
            section_id: "orch".into(),
            seat_id: "orch:A:12".into(),
            order_id: "e9.orch.o01".into(),
            ticket_id: "e9.orch.o01.1".into(),
        }
    }

    /// A code of any payload, signed with the key of `seed`.
    fn code_of(seed: [u8; 32], payload: &str) -> String {
        let sig = SigningKey::from_bytes(&seed).sign(payload.as_bytes());
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload.as_bytes()),
            URL_SAFE_NO_PAD.encode(sig.to_bytes())
        )
    }

    /// A code as the server made them before key ids.
    fn sign_bt1(seed: [u8; 32], t: &TicketClaims) -> String {
        let payload = format!(
            "bt1\n{}\n{}\n{}\n{}\n{}",
            t.event_id, t.section_id, t.seat_id, t.order_id, t.ticket_id
        );
        code_of(seed, &payload)
    }

    /// Every code made by flipping one bit of `code` is refused by `keys`.
    fn every_flipped_bit_fails(code: &str, keys: &[PublicKey]) {
        let bytes = code.as_bytes();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.to_vec();
                b[i] ^= 1 << bit;
                let Ok(text) = String::from_utf8(b) else {
                    continue;
                };
                if text.trim() == code {
                    continue;
                }
                assert!(verify(&text, keys).is_err(), "flip {i}:{bit} verified");
            }
        }
    }

    #[test]
    fn codes_carry_their_kid_and_every_flipped_bit_or_other_key_fails() {
        let s = TicketSigner::from_seed([7; 32]);
        let code = s.sign(&claims());
        let keys = [s.public_key().clone()];
        let v = verify(&code, &keys).unwrap();
        assert_eq!((v.claims, v.kid, v.kid_in_code), (claims(), s.kid(), true));
        assert_eq!(s.sign(&claims()), code, "deterministic");
        let payload = URL_SAFE_NO_PAD
            .decode(code.split_once('.').unwrap().0)
            .unwrap();
        assert!(
            String::from_utf8(payload)
                .unwrap()
                .starts_with(&format!("bt2\n{}\n", s.kid()))
        );
        every_flipped_bit_fails(&code, &keys);
        let other = TicketSigner::from_seed([8; 32]);
        assert_eq!(
            verify(&code, &[other.public_key().clone()]),
            Err(TicketError::UnknownKey(s.kid()))
        );
        assert_eq!(verify(&code, &[]), Err(TicketError::UnknownKey(s.kid())));
        // Another key's signature passed off under this key's id.
        let forged = code_of(
            [8; 32],
            &format!(
                "bt2\n{}\ne9\norch\norch:A:12\ne9.orch.o01\ne9.orch.o01.1",
                s.kid()
            ),
        );
        assert_eq!(verify(&forged, &keys), Err(TicketError::BadSignature));
        assert_eq!(
            verify(&code_of([7; 32], "bt2\nnot-a-kid\ne\ns\n\no\nt"), &keys),
            Err(TicketError::Malformed)
        );
        assert_eq!(
            verify(&code_of([7; 32], "bt9\ne\ns\n\no\nt"), &keys),
            Err(TicketError::Malformed)
        );
        assert_eq!(verify("no-dot", &keys), Err(TicketError::Malformed));
        assert_eq!(PublicKey::from_hex("zz"), Err(TicketError::BadKey));
        assert_eq!(
            PublicKey::from_hex(&"ab".repeat(31)),
            Err(TicketError::BadKey)
        );
        assert_eq!(
            PublicKey::from_hex(&format!(" {} \n", s.public_key().to_hex())).unwrap(),
            *s.public_key()
        );
    }

    #[test]
    fn the_kid_is_the_first_8_bytes_of_the_public_keys_sha256() {
        let s = TicketSigner::from_seed([7; 32]);
        let digest = Sha256::digest(s.public_key().key.as_bytes());
        assert_eq!(s.kid().to_string(), hex::encode(&digest[..8]));
        assert_eq!(KeyId::parse(&s.kid().to_string()), Some(s.kid()));
        assert_eq!(KeyId::parse("abc"), None);
    }

    #[test]
    fn codes_from_before_key_ids_verify_with_the_key_they_were_made_with() {
        let old = TicketSigner::from_seed([7; 32]);
        let new = TicketSigner::from_seed([8; 32]);
        let code = sign_bt1([7; 32], &claims());
        let ring = [new.public_key().clone(), old.public_key().clone()];
        let v = verify(&code, &ring).unwrap();
        assert_eq!(
            (v.claims, v.kid, v.kid_in_code),
            (claims(), old.kid(), false)
        );
        assert_eq!(
            verify(&code, &[new.public_key().clone()]),
            Err(TicketError::BadSignature)
        );
        every_flipped_bit_fails(&code, &[old.public_key().clone()]);
    }

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn a_rotation_keeps_old_tickets_verifying_and_new_ones_carry_the_new_kid() {
        let dir = tempfile::tempdir().unwrap();
        assert!(KeyRing::load(dir.path()).unwrap().keys().is_empty());
        let err = rotate(dir.path()).unwrap_err().to_string();
        assert!(err.contains("has no ticket keys"), "{err}");
        // First start: a new key, its public half in the ring.
        let first = open_for_signing(dir.path(), true).unwrap().unwrap();
        assert!(public_key_path(dir.path(), first.kid()).exists());
        let again = open_for_signing(dir.path(), false).unwrap().unwrap();
        assert_eq!(again.kid(), first.kid(), "the key persists");
        let old_code = first.sign(&claims());
        let r = rotate(dir.path()).unwrap();
        assert_eq!(r.retired, Some(first.kid()));
        assert_ne!(r.signing, first.kid());
        assert_eq!(r.keys, 2);
        let ring = KeyRing::load(dir.path()).unwrap();
        let second = ring.signer().unwrap();
        assert_eq!(second.kid(), r.signing);
        assert_eq!(
            ring.keys()[0].kid(),
            r.signing,
            "the signing key is listed first"
        );
        assert_eq!(ring.verify(&old_code).unwrap().kid, first.kid());
        let new_code = second.sign(&claims());
        assert_eq!(ring.verify(&new_code).unwrap().kid, r.signing);
        // The private key lost: not made anew unless allowed; the public keys still verify.
        fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        assert!(open_for_signing(dir.path(), false).unwrap().is_none());
        assert!(!dir.path().join(KEY_FILE).exists());
        let ring = KeyRing::load(dir.path()).unwrap();
        assert!(ring.signer().is_none());
        assert_eq!(ring.keys().len(), 2);
        assert!(ring.verify(&old_code).is_ok() && ring.verify(&new_code).is_ok());
        let third = open_for_signing(dir.path(), true).unwrap().unwrap();
        let ring = KeyRing::load(dir.path()).unwrap();
        assert_eq!(ring.keys().len(), 3);
        assert_eq!(ring.signer().unwrap().kid(), third.kid());
        assert!(ring.verify(&old_code).is_ok() && ring.verify(&new_code).is_ok());
        // A retired key's public half removed: its tickets are refused, by kid.
        fs::remove_file(public_key_path(dir.path(), first.kid())).unwrap();
        assert_eq!(
            KeyRing::load(dir.path()).unwrap().verify(&old_code),
            Err(TicketError::UnknownKey(first.kid()))
        );
    }

    #[test]
    fn a_data_dir_from_before_key_rings_gets_its_key_kept_at_start() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join(KEY_FILE), &hex::encode([7u8; 32]));
        let old = TicketSigner::from_seed([7; 32]);
        let ring = KeyRing::load(dir.path()).unwrap();
        assert_eq!(ring.keys(), [old.public_key().clone()]);
        assert!(
            !dir.path().join(PUBLIC_KEYS_DIR).exists(),
            "loading writes nothing"
        );
        open_for_signing(dir.path(), false).unwrap().unwrap();
        assert!(public_key_path(dir.path(), old.kid()).exists());
        let code = sign_bt1([7; 32], &claims());
        rotate(dir.path()).unwrap();
        fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        assert_eq!(
            KeyRing::load(dir.path())
                .unwrap()
                .verify(&code)
                .unwrap()
                .kid,
            old.kid()
        );
    }

    #[test]
    fn damaged_key_files_are_refused_by_name_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let signer = open_for_signing(dir.path(), true).unwrap().unwrap();
        let key_file = dir.path().join(KEY_FILE);
        let good = fs::read_to_string(&key_file).unwrap();
        write(&key_file, "not a key");
        for err in [
            KeyRing::load(dir.path()).err(),
            open_for_signing(dir.path(), true).err(),
            rotate(dir.path()).err(),
        ] {
            let err = format!("{:#}", err.unwrap());
            assert!(err.contains(KEY_FILE) && err.contains("damaged"), "{err}");
        }
        assert_eq!(
            fs::read_to_string(&key_file).unwrap(),
            "not a key",
            "not replaced"
        );
        write(&key_file, &good);
        let pub_file = public_key_path(dir.path(), signer.kid());
        for text in [
            "zz",
            &TicketSigner::from_seed([9; 32]).public_key().to_hex(),
        ] {
            write(&pub_file, text);
            let err = format!("{:#}", open_for_signing(dir.path(), true).err().unwrap());
            assert!(
                err.contains(&pub_file.display().to_string()) && err.contains("damaged"),
                "{err}"
            );
            assert_eq!(fs::read_to_string(&pub_file).unwrap(), text, "not replaced");
        }
        write(&pub_file, &signer.public_key().to_hex());
        // Leftovers of an interrupted write are not keys.
        write(&dir.path().join(PUBLIC_KEYS_DIR).join("x.pub.tmp"), "half");
        assert_eq!(KeyRing::load(dir.path()).unwrap().keys().len(), 1);
    }

    #[test]
    fn the_ring_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        open_for_signing(dir.path(), true).unwrap().unwrap();
        for _ in 1..TICKET_KEYS_MAX {
            rotate(dir.path()).unwrap();
        }
        assert_eq!(
            KeyRing::load(dir.path()).unwrap().keys().len(),
            TICKET_KEYS_MAX
        );
        let err = rotate(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("remove the .pub files of retired keys"),
            "{err}"
        );
        assert_eq!(
            KeyRing::load(dir.path()).unwrap().keys().len(),
            TICKET_KEYS_MAX
        );
    }
}
