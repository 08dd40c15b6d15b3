//! A cluster's ticket key ring (issue 27): the keys that sign and verify ticket codes are the
//! cluster's state, not a node's, so a ticket's code is the same whichever node answers, before
//! and after failovers, and after a node that lost its disk leads.
//!
//! - The ring is one value of group 0's replicated table [`names::TICKET_RING`]: every key's
//!   public half, the time from which it signs, and its 32-byte seed sealed (XChaCha20-Poly1305,
//!   under a key derived with HKDF-SHA256 from the cluster secret, the key's public half as
//!   associated data). It crosses the wire inside Raft entries and snapshots sealed only, and is
//!   kept sealed on disk.
//! - It is made once, by group 0's leader, when its group's state (every committed entry
//!   applied) has none: from the node's own key files if it had them (a cluster from before the
//!   ring keeps its codes), else a new random key. Every other leader, of every group, and a node
//!   whose disk was wiped, takes the ring from its copy of group 0 and never makes a key.
//! - **Rotation** (`ClusterService.RotateTicketKey`) is one replicated record: group 0's leader
//!   adds a new key whose `signs_from_ms` is [`ROTATION_LEAD`] after the call. Each key signs the
//!   orders made from its time until the next key's: an order's codes never change, and every
//!   key keeps verifying. Every node re-reads its copy of group 0 every [`REFRESH_EVERY`], and
//!   signs an order only if its copy was known current (group 0's leader heard within
//!   [`HEARD_WITHIN`], or this node leads group 0) less than [`FRESH_FOR`] before the order was
//!   made; else it answers `NOT_READY` ([`crate::signing`]). The margin
//!   (`ROTATION_LEAD - FRESH_FOR` = 15 s) covers the time for a committed rotation to reach a node
//!   that hears its leader, and clock skew between the nodes.
//! - A ring this node cannot read (damaged) or unseal (another cluster secret) is lost to it:
//!   the node refuses to sign, says so in its log and in the error of each try to lead, and
//!   serves nothing (its engine does not open, so another node leads).
//! - Every node mirrors the ring's public keys into its data dir (`ticket-public-keys/`), where
//!   `boxoffice ticket public-key --data-dir` and `ticket verify --data-dir` read them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use boxoffice_engine::codec;
use boxoffice_engine::store::{Batch, Kv, Op, Replicate, names};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};

use boxoffice_engine::Clock;
use boxoffice_engine::raft::Raft;

use super::heard::Heard;
use crate::signing::Signing;
use crate::tickets::{KeyRing, PublicKey, TicketSigner};

/// The ring's key in [`names::TICKET_RING`] (since rotation: each key with its time).
const RING: &[u8] = b"ring.v2";
/// Where the first clusters with a ring kept it (one key that signs, no times): read when there
/// is no [`RING`], and replaced by it at the first rotation.
const RING_V1: &[u8] = b"ring";
/// HKDF's `info` for the sealing key: another use of the secret derives another key.
const SEAL_INFO: &[u8] = b"boxoffice ticket key ring v1";
/// Bytes of an XChaCha20 nonce, in front of each sealed seed.
const NONCE_BYTES: usize = 24;
/// How long a leader waits for the ring to reach its copy of group 0 before this try to open
/// its engine fails (it tries again while it leads).
pub(crate) const RING_WAIT: Duration = Duration::from_secs(10);
/// How long after a rotation is asked for its new key starts signing.
pub const ROTATION_LEAD: Duration = Duration::from_secs(30);
/// For how long a copy of the ring known current signs new orders.
pub const FRESH_FOR: Duration = Duration::from_secs(15);
/// How recently group 0's leader must have been heard for this node's copy to count as current.
pub const HEARD_WITHIN: Duration = Duration::from_secs(2);
/// How often a node re-reads its copy of the ring.
pub const REFRESH_EVERY: Duration = Duration::from_millis(500);

/// The ring has not reached this node's copy of group 0 yet (group 0's leader makes it): a
/// leader of another group waits for it, trying again without counting a failure to serve.
#[derive(Debug, thiserror::Error)]
#[error(
    "the cluster's ticket key ring has not reached this node's copy of group 0 within {} s \
     (group 0's leader makes it): this node signs no tickets yet",
    RING_WAIT.as_secs()
)]
pub(crate) struct NotYet;

/// The ring as group 0 replicates it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedRing {
    /// The public half of the key that signs new tickets (one of `keys`).
    pub signing: [u8; 32],
    /// Every key whose tickets verify.
    pub keys: Vec<SealedKey>,
}

impl SealedRing {
    /// Every key's public half, parsed.
    fn public_keys(&self) -> anyhow::Result<Vec<PublicKey>> {
        self.keys
            .iter()
            .map(|k| PublicKey::from_bytes(&k.public))
            .collect::<Result<Vec<_>, _>>()
            .context("the cluster's ticket key ring holds a public key that does not parse")
    }
}

/// The id of the key whose public half is `public`, as text (`?` if it does not parse).
fn kid_of(public: &[u8; 32]) -> String {
    PublicKey::from_bytes(public).map_or_else(|_| "?".into(), |k| k.kid().to_string())
}

/// One key of the ring.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedKey {
    /// Its public half.
    pub public: [u8; 32],
    /// Its seed, sealed: nonce then ciphertext. Empty for a key that only verifies (its
    /// private half was gone before the ring was made).
    pub sealed: Vec<u8>,
    /// It signs the orders made from this time on (ms since the Unix epoch), until the next
    /// key's time. 0 for the ring's first key.
    pub signs_from_ms: u64,
}

/// The ring as the first clusters with one wrote it (no rotation yet: one key signed).
#[derive(Serialize, Deserialize)]
struct SealedRingV1 {
    signing: [u8; 32],
    keys: Vec<SealedKeyV1>,
}

#[derive(Serialize, Deserialize)]
struct SealedKeyV1 {
    public: [u8; 32],
    sealed: Vec<u8>,
}

impl From<SealedRingV1> for SealedRing {
    fn from(v1: SealedRingV1) -> SealedRing {
        SealedRing {
            signing: v1.signing,
            keys: v1
                .keys
                .into_iter()
                .map(|k| SealedKey {
                    public: k.public,
                    sealed: k.sealed,
                    signs_from_ms: 0,
                })
                .collect(),
        }
    }
}

/// Seals and unseals seeds under the key derived from the cluster secret.
#[derive(Clone)]
pub struct Sealer {
    cipher: XChaCha20Poly1305,
}

impl Sealer {
    /// The sealer of the cluster whose secret's key material is `material`
    /// (`ClusterSecret::material`).
    pub fn new(material: &[u8; 32]) -> Sealer {
        let mut key = [0u8; 32];
        hkdf::Hkdf::<sha2::Sha256>::new(None, material)
            .expand(SEAL_INFO, &mut key)
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        Sealer {
            cipher: XChaCha20Poly1305::new(&Key::from(key)),
        }
    }

    /// `signer`'s key, its seed sealed.
    pub fn seal(&self, signer: &TicketSigner) -> SealedKey {
        let public = signer.public_key().to_bytes();
        let mut nonce = [0u8; NONCE_BYTES];
        boxoffice_engine::rt::fill_random(&mut nonce);
        let seed = signer.seed();
        let sealed = self
            .cipher
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &seed,
                    aad: &public,
                },
            )
            .expect("sealing 32 bytes cannot fail");
        SealedKey {
            public,
            sealed: [nonce.as_slice(), &sealed].concat(),
            signs_from_ms: 0,
        }
    }

    /// The signer of a sealed key: `Err` if it cannot be unsealed (another cluster's secret,
    /// or bytes changed), or unseals to another key than its public half says.
    pub fn unseal(&self, key: &SealedKey) -> anyhow::Result<TicketSigner> {
        let kid = kid_of(&key.public);
        anyhow::ensure!(
            key.sealed.len() > NONCE_BYTES,
            "the ring's key {kid} has no private half (it only verifies)"
        );
        let (nonce, sealed) = key.sealed.split_at(NONCE_BYTES);
        let nonce: [u8; NONCE_BYTES] = nonce.try_into().expect("split at the nonce's length");
        let seed = self
            .cipher
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: sealed,
                    aad: &key.public,
                },
            )
            .map_err(|_| {
                anyhow::anyhow!(
                    "the ring's key {kid} cannot be unsealed with this node's cluster secret \
                     (is it another cluster's secret, or were the ring's bytes changed?)"
                )
            })?;
        let seed: [u8; 32] = seed
            .try_into()
            .map_err(|_| anyhow::anyhow!("the ring's key {kid} unseals to no 32-byte seed"))?;
        let signer = TicketSigner::from_seed(seed);
        anyhow::ensure!(
            signer.public_key().to_bytes() == key.public,
            "the ring's key {kid} unseals to another key than its public half"
        );
        Ok(signer)
    }
}

/// A node's view of its cluster's ring: its copy of group 0's table, and the keys it signs
/// with ([`Signing`], shared by every group this node leads).
pub(crate) struct ClusterRing {
    /// Group 0's store on this node.
    store: Arc<dyn Kv>,
    sealer: Sealer,
    /// The node's data dir, where the public keys are mirrored.
    data_dir: PathBuf,
    /// The keys this node signs with, from its copy of the ring.
    signing: Arc<Signing>,
    /// Whether this node's copy of group 0 is current (`None`: a test's ring, always current).
    current: Option<Current>,
    /// The wall clock (the engine's).
    clock: Arc<dyn Clock>,
    /// One rotation at a time on this node.
    rotating: tokio::sync::Mutex<()>,
}

/// What tells whether a node's copy of group 0 is current: its Raft of group 0, and when that
/// group's leader was last heard.
pub(crate) struct Current {
    /// The node's Raft of group 0.
    pub raft: Raft,
    /// When each group's leader was last heard here.
    pub heard: Heard,
}

impl Current {
    /// This node leads group 0, or heard its leader within [`HEARD_WITHIN`] and has applied its
    /// whole log.
    fn now(&self) -> bool {
        let m = self.raft.metrics().borrow().clone();
        if m.current_leader == Some(m.id) {
            return true;
        }
        let applied = m.last_applied.map(|l| l.index) >= m.last_log_index;
        applied && self.heard.within(0, HEARD_WITHIN)
    }
}

impl ClusterRing {
    /// The ring in `store` (group 0's, on this node), sealed by `sealer`; `current` says
    /// whether the node's copy is current.
    pub(crate) fn new(
        store: Arc<dyn Kv>,
        sealer: Sealer,
        data_dir: PathBuf,
        current: Option<Current>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        ClusterRing {
            store,
            sealer,
            data_dir,
            signing: Arc::new(Signing::unset()),
            current,
            clock,
            rotating: tokio::sync::Mutex::new(()),
        }
    }

    /// The ring as this node's copy of group 0 holds it (`None`: not made yet, or not here yet).
    /// `Err`: the value is damaged.
    pub(crate) fn read(&self) -> anyhow::Result<Option<SealedRing>> {
        let tree = self
            .store
            .tree(names::TICKET_RING)
            .map_err(|e| anyhow::anyhow!("reading the ticket key ring: {e}"))?;
        let damaged = |e: codec::DecodeError| {
            anyhow::anyhow!(
                "the cluster's ticket key ring is damaged on this node ({e}): it refuses to sign \
                 tickets (wipe its data dir so that it copies its group again)"
            )
        };
        let get = |key: &[u8]| {
            tree.get(key)
                .map_err(|e| anyhow::anyhow!("reading the ticket key ring: {e}"))
        };
        if let Some(b) = get(RING)? {
            return codec::decode::<SealedRing>(&b).map(Some).map_err(damaged);
        }
        match get(RING_V1)? {
            Some(b) => codec::decode::<SealedRingV1>(&b)
                .map(|r| Some(r.into()))
                .map_err(damaged),
            None => Ok(None),
        }
    }

    /// Every key of `ring` that can sign, unsealed, each from its time on, with every public
    /// key of the ring.
    pub(crate) fn open(&self, ring: &SealedRing) -> anyhow::Result<Opened> {
        anyhow::ensure!(
            ring.keys.iter().any(|k| k.public == ring.signing),
            "the cluster's ticket key ring names a signing key it does not hold"
        );
        let mut signers = Vec::new();
        for k in ring.keys.iter().filter(|k| !k.sealed.is_empty()) {
            let signer = self.sealer.unseal(k).context(
                "the cluster's ticket key ring is lost to this node: it refuses to sign tickets",
            )?;
            signers.push((k.signs_from_ms, signer));
        }
        Ok(Opened {
            signers,
            public: ring.public_keys()?,
        })
    }

    /// A new ring for a group that has none: the node's own key files if it has them (the
    /// signing key sealed, every other public key kept to verify), else a new random key.
    fn make(&self) -> anyhow::Result<SealedRing> {
        let local = KeyRing::load(&self.data_dir)?;
        let signer = match local.signer() {
            Some(s) => s.clone(),
            None => new_key(),
        };
        let mut keys = vec![self.sealer.seal(&signer)];
        keys.extend(
            local
                .keys()
                .iter()
                .filter(|k| k.kid() != signer.kid())
                .map(|k| SealedKey {
                    public: k.to_bytes(),
                    sealed: Vec::new(),
                    signs_from_ms: 0,
                }),
        );
        Ok(SealedRing {
            signing: signer.public_key().to_bytes(),
            keys,
        })
    }

    /// The keys a leader of `group` signs with (its engine about to open): the ring of this
    /// node's copy of group 0, made first if group 0 has none and this is group 0's leader
    /// (`replicate` commits it in this leadership). Waits up to [`RING_WAIT`] for the ring to
    /// reach this node's copy.
    pub(crate) async fn signer(
        &self,
        group: u32,
        replicate: &dyn Replicate,
    ) -> anyhow::Result<Arc<Signing>> {
        let deadline = tokio::time::Instant::now() + RING_WAIT;
        let mut made = false;
        loop {
            if self.refresh()? {
                return Ok(self.signing.clone());
            }
            if group == 0 && !made {
                // Every committed entry of group 0 is applied here (the leader waited for it),
                // so no ring was ever made: this leader makes it.
                let ring = self.make()?;
                commit(replicate, &ring).await?;
                tracing::info!(kid = %kid_of(&ring.signing), keys = ring.keys.len(), "made the cluster's ticket key ring");
                made = true;
                continue;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(NotYet.into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Takes this node's copy of the ring into its signing keys (and mirrors its public keys),
    /// noting how long it signs new orders if the copy is current. `false`: no ring here yet.
    fn refresh(&self) -> anyhow::Result<bool> {
        // Whether the copy is current is asked before it is read: what it says holds for the
        // copy read after.
        let current = self.current.as_ref().is_none_or(Current::now);
        let now = self.clock.now_ms();
        let Some(ring) = self.read()? else {
            return Ok(false);
        };
        let opened = self.open(&ring)?;
        for k in &opened.public {
            crate::tickets::keep_public_key(&self.data_dir, k)?;
        }
        let fresh_until = if current {
            now.saturating_add(u64::try_from(FRESH_FOR.as_millis()).unwrap_or(u64::MAX))
        } else {
            0
        };
        self.signing.set(opened.signers, fresh_until);
        Ok(true)
    }

    /// Keeps this node's signing keys and mirrored public keys up to its copy of the ring (every
    /// node, leading or not), every [`REFRESH_EVERY`].
    pub(crate) fn keep_current(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut said: Option<String> = None;
            loop {
                match self.refresh() {
                    Ok(_) => said = None,
                    Err(e) => {
                        let e = format!("{e:#}");
                        if said.as_ref() != Some(&e) {
                            tracing::warn!(error = %e, "the ticket key ring");
                            said = Some(e);
                        }
                    }
                }
                tokio::time::sleep(REFRESH_EVERY).await;
            }
        })
    }

    /// Now, on this node's clock, ms since the Unix epoch.
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The ring's public keys as the API shows them (empty: no ring here yet, or damaged).
    pub(crate) fn public(&self) -> Vec<RingKey> {
        let Ok(Some(ring)) = self.read() else {
            return Vec::new();
        };
        ring.keys
            .iter()
            .map(|k| RingKey {
                kid: kid_of(&k.public),
                public_hex: hex::encode(k.public),
                signs_from_ms: k.signs_from_ms,
                can_sign: !k.sealed.is_empty(),
            })
            .collect()
    }

    /// Adds a new key to the ring that signs the orders made from `signs_from_ms` on, as group
    /// 0's leader (`raft`). A ring that already has a key of that time is left as it is (the
    /// same rotation, asked again). `Err` says why not.
    pub(crate) async fn rotate(&self, raft: &Raft, signs_from_ms: u64) -> Result<(), Rotate> {
        let _one = self.rotating.lock().await;
        // Leading now, with every committed entry applied: the ring read is the latest.
        raft.ensure_linearizable()
            .await
            .map_err(|e| Rotate::Again(format!("group 0: {e}")))?;
        let term = raft.metrics().borrow().current_term;
        let mut ring = self
            .read()
            .map_err(|e| Rotate::Refused(format!("{e:#}")))?
            .ok_or_else(|| Rotate::Again("the ring is not made yet".into()))?;
        if ring.keys.iter().any(|k| k.signs_from_ms == signs_from_ms) {
            return Ok(());
        }
        let latest = ring.keys.iter().map(|k| k.signs_from_ms).max().unwrap_or(0);
        if signs_from_ms <= latest {
            return Err(Rotate::Refused(format!(
                "a later rotation is already in the ring (its key signs from {latest} ms)"
            )));
        }
        if ring.keys.len() >= crate::tickets::TICKET_KEYS_MAX {
            return Err(Rotate::Full(ring.keys.len()));
        }
        let key = new_key();
        ring.keys.push(SealedKey {
            signs_from_ms,
            ..self.sealer.seal(&key)
        });
        ring.signing = key.public_key().to_bytes();
        let replicate = boxoffice_engine::raft::RaftReplicator::new(raft.clone(), term);
        commit(&replicate, &ring)
            .await
            .map_err(|e| Rotate::Again(format!("{e:#}")))?;
        tracing::info!(kid = %key.kid(), signs_from_ms, keys = ring.keys.len(), "rotated the cluster's ticket key");
        Ok(())
    }
}

/// Why a rotation was not made.
#[derive(Debug)]
pub(crate) enum Rotate {
    /// Not made now (leadership moved, no ring yet): the same call may be tried again.
    Again(String),
    /// The ring holds its most keys.
    Full(usize),
    /// The ring cannot be changed (damaged, or a later rotation is in).
    Refused(String),
}

/// A ring's keys, opened.
pub(crate) struct Opened {
    /// Each key that can sign, with the time it signs from.
    pub signers: Vec<(u64, TicketSigner)>,
    /// Every public key.
    pub public: Vec<PublicKey>,
}

/// One key of the ring as the API shows it.
pub(crate) struct RingKey {
    pub kid: String,
    pub public_hex: String,
    pub signs_from_ms: u64,
    pub can_sign: bool,
}

/// A new random key.
fn new_key() -> TicketSigner {
    let mut seed = [0u8; 32];
    boxoffice_engine::rt::fill_random(&mut seed);
    TicketSigner::from_seed(seed)
}

/// Commits `ring` into group 0 through `replicate` (its leader's).
async fn commit(replicate: &dyn Replicate, ring: &SealedRing) -> anyhow::Result<()> {
    let batch = Batch {
        term: 0, // the replicator stamps it
        ops: vec![Op::Put {
            table: names::TICKET_RING.to_owned(),
            key: RING.to_vec(),
            value: codec::encode(ring),
        }],
    };
    replicate
        .commit(batch)
        .await
        .map_err(|e| anyhow::anyhow!("committing the ticket key ring: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer(secret: &str) -> Sealer {
        Sealer::new(
            crate::node::peers::ClusterSecret::new(secret)
                .unwrap()
                .material(),
        )
    }

    fn signer(byte: u8) -> TicketSigner {
        TicketSigner::from_seed([byte; 32])
    }

    #[test]
    fn a_sealed_key_unseals_only_under_its_clusters_secret() {
        let s = sealer("one cluster");
        let key = s.seal(&signer(7));
        // The seed is not in the sealed bytes.
        assert!(!key.sealed.windows(32).any(|w| w == [7u8; 32]));
        assert_eq!(s.unseal(&key).unwrap().kid(), signer(7).kid());
        // Each seal draws its own nonce.
        assert_ne!(s.seal(&signer(7)).sealed, key.sealed);
        let e = sealer("another cluster")
            .unseal(&key)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("cannot be unsealed"), "{e}");
    }

    #[test]
    fn a_changed_sealed_key_is_refused() {
        let s = sealer("one cluster");
        let key = s.seal(&signer(7));
        let mut flipped = key.clone();
        let last = flipped.sealed.len() - 1;
        flipped.sealed[last] ^= 1;
        assert!(s.unseal(&flipped).is_err());
        // Another key's public half with this key's sealed seed: the associated data differs.
        let mut swapped = key.clone();
        swapped.public = signer(8).public_key().to_bytes();
        assert!(s.unseal(&swapped).is_err());
        // A key that only verifies has nothing to unseal.
        let verify_only = SealedKey {
            public: key.public,
            sealed: Vec::new(),
            signs_from_ms: 0,
        };
        let e = s.unseal(&verify_only).err().unwrap().to_string();
        assert!(e.contains("no private half"), "{e}");
    }

    fn ring_in(dir: &std::path::Path) -> ClusterRing {
        let store: Arc<dyn Kv> = Arc::new(boxoffice_engine::store::SimKv::new());
        ClusterRing::new(
            store,
            sealer("one cluster"),
            dir.to_owned(),
            None,
            Arc::new(boxoffice_engine::SystemClock),
        )
    }

    #[test]
    fn a_ring_is_made_from_the_nodes_own_keys_when_it_has_them() {
        let tmp = tempfile::tempdir().unwrap();
        // A fresh node: a new key.
        let fresh = ring_in(tmp.path()).make().unwrap();
        assert_eq!(fresh.keys.len(), 1);
        // A node from before the ring: its signing key signs, its other keys verify.
        let old = tmp.path().join("old");
        std::fs::create_dir_all(&old).unwrap();
        let before = crate::tickets::open_for_signing(&old, true)
            .unwrap()
            .unwrap();
        crate::tickets::rotate(&old).unwrap();
        let now = KeyRing::load(&old).unwrap().signer().unwrap().clone();
        let ring = ring_in(&old);
        let made = ring.make().unwrap();
        assert_eq!(made.signing, now.public_key().to_bytes());
        assert_eq!(made.keys.len(), 2);
        let opened = ring.open(&made).unwrap();
        assert_eq!(
            opened.signers.len(),
            1,
            "only the signing key's private half is kept"
        );
        assert_eq!(opened.signers[0].1.kid(), now.kid());
        assert!(opened.public.iter().any(|k| k.kid() == before.kid()));
        let retired = made
            .keys
            .iter()
            .find(|k| k.public == before.public_key().to_bytes())
            .unwrap();
        assert!(
            retired.sealed.is_empty(),
            "a retired key's private half is gone"
        );
    }

    #[test]
    fn a_ring_of_the_first_format_is_read_its_keys_signing_from_the_start() {
        let tmp = tempfile::tempdir().unwrap();
        let ring = ring_in(tmp.path());
        let key = ring.sealer.seal(&signer(9));
        let v1 = SealedRingV1 {
            signing: key.public,
            keys: vec![SealedKeyV1 {
                public: key.public,
                sealed: key.sealed.clone(),
            }],
        };
        ring.store
            .tree(names::TICKET_RING)
            .unwrap()
            .insert(RING_V1, &codec::encode(&v1))
            .unwrap();
        let read = ring.read().unwrap().unwrap();
        assert_eq!(read.keys, vec![key]);
        let opened = ring.open(&read).unwrap();
        assert_eq!(opened.signers[0].0, 0);
        assert_eq!(opened.signers[0].1.kid(), signer(9).kid());
        // A ring of the new format wins over it.
        let mut rotated = read.clone();
        rotated.keys.push(SealedKey {
            signs_from_ms: 5,
            ..ring.sealer.seal(&signer(10))
        });
        ring.store
            .tree(names::TICKET_RING)
            .unwrap()
            .insert(RING, &codec::encode(&rotated))
            .unwrap();
        assert_eq!(ring.read().unwrap().unwrap(), rotated);
        assert_eq!(ring.open(&rotated).unwrap().signers.len(), 2);
    }

    #[test]
    fn a_damaged_ring_is_refused_not_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let ring = ring_in(tmp.path());
        assert_eq!(ring.read().unwrap(), None);
        ring.store
            .tree(names::TICKET_RING)
            .unwrap()
            .insert(RING, b"not a ring")
            .unwrap();
        let e = ring.read().unwrap_err().to_string();
        assert!(
            e.contains("damaged") && e.contains("refuses to sign"),
            "{e}"
        );
    }
}
