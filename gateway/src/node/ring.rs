//! A cluster's ticket key ring (issue 27): the keys that sign and verify ticket codes are the
//! cluster's state, not a node's, so a ticket's code is the same whichever node answers, before
//! and after failovers, and after a node that lost its disk leads.
//!
//! - The ring is one value of group 0's replicated table [`names::TICKET_RING`]: every key's
//!   public half, and its 32-byte seed sealed (XChaCha20-Poly1305, under a key derived with
//!   HKDF-SHA256 from the cluster secret, the key's public half as associated data). It crosses
//!   the wire inside Raft entries and snapshots sealed only, and is kept sealed on disk.
//! - It is made once, by group 0's leader, when its group's state (every committed entry
//!   applied) has none: from the node's own key files if it had them (a cluster from before the
//!   ring keeps its codes), else a new random key. Every other leader, of every group, and a node
//!   whose disk was wiped, takes the ring from its copy of group 0 and never makes a key.
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

use super::peers::ClusterSecret;
use crate::tickets::{KeyRing, PublicKey, TicketSigner};

/// The ring's key in [`names::TICKET_RING`].
const RING: &[u8] = b"ring";
/// HKDF's `info` for the sealing key: another use of the secret derives another key.
const SEAL_INFO: &[u8] = b"boxoffice ticket key ring v1";
/// Bytes of an XChaCha20 nonce, in front of each sealed seed.
const NONCE_BYTES: usize = 24;
/// How long a leader waits for the ring to reach its copy of group 0 before this try to open
/// its engine fails (it tries again while it leads).
pub(crate) const RING_WAIT: Duration = Duration::from_secs(10);

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
}

/// Seals and unseals seeds under the key derived from the cluster secret.
#[derive(Clone)]
pub struct Sealer {
    cipher: XChaCha20Poly1305,
}

impl Sealer {
    /// The sealer of the cluster of `secret`.
    pub fn new(secret: &ClusterSecret) -> Sealer {
        Sealer::from_material(secret.material())
    }

    fn from_material(material: &[u8; 32]) -> Sealer {
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

/// A node's view of its cluster's ring: its copy of group 0's table.
pub(crate) struct ClusterRing {
    /// Group 0's store on this node.
    store: Arc<dyn Kv>,
    sealer: Sealer,
    /// The node's data dir, where the public keys are mirrored.
    data_dir: PathBuf,
}

impl ClusterRing {
    /// The ring in `store` (group 0's, on this node), sealed under `secret`.
    pub(crate) fn new(store: Arc<dyn Kv>, secret: &ClusterSecret, data_dir: PathBuf) -> Self {
        ClusterRing {
            store,
            sealer: Sealer::new(secret),
            data_dir,
        }
    }

    /// The ring as this node's copy of group 0 holds it (`None`: not made yet, or not here yet).
    /// `Err`: the value is damaged.
    pub(crate) fn read(&self) -> anyhow::Result<Option<SealedRing>> {
        let bytes = self
            .store
            .tree(names::TICKET_RING)
            .and_then(|t| t.get(RING))
            .map_err(|e| anyhow::anyhow!("reading the ticket key ring: {e}"))?;
        bytes
            .map(|b| {
                codec::decode::<SealedRing>(&b).map_err(|e| {
                    anyhow::anyhow!(
                        "the cluster's ticket key ring is damaged on this node ({e}): it \
                         refuses to sign tickets (wipe its data dir so that it copies its group \
                         again)"
                    )
                })
            })
            .transpose()
    }

    /// The key that signs, unsealed, with every public key of the ring.
    pub(crate) fn open(&self, ring: &SealedRing) -> anyhow::Result<(TicketSigner, Vec<PublicKey>)> {
        let signing = ring
            .keys
            .iter()
            .find(|k| k.public == ring.signing)
            .context("the cluster's ticket key ring names a signing key it does not hold")?;
        let signer = self.sealer.unseal(signing).context(
            "the cluster's ticket key ring is lost to this node: it refuses to sign tickets",
        )?;
        Ok((signer, ring.public_keys()?))
    }

    /// A new ring for a group that has none: the node's own key files if it has them (the
    /// signing key sealed, every other public key kept to verify), else a new random key.
    fn make(&self) -> anyhow::Result<SealedRing> {
        let local = KeyRing::load(&self.data_dir)?;
        let signer = match local.signer() {
            Some(s) => s.clone(),
            None => {
                let mut seed = [0u8; 32];
                boxoffice_engine::rt::fill_random(&mut seed);
                TicketSigner::from_seed(seed)
            }
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
                }),
        );
        Ok(SealedRing {
            signing: signer.public_key().to_bytes(),
            keys,
        })
    }

    /// The signer of a leader of `group` (its engine about to open): the ring of this node's
    /// copy of group 0, made first if group 0 has none and this is group 0's leader (`replicate`
    /// commits it in this leadership). Waits up to [`RING_WAIT`] for the ring to reach this
    /// node's copy.
    pub(crate) async fn signer(
        &self,
        group: u32,
        replicate: &dyn Replicate,
    ) -> anyhow::Result<TicketSigner> {
        let deadline = tokio::time::Instant::now() + RING_WAIT;
        let mut made = false;
        loop {
            if let Some(ring) = self.read()? {
                let (signer, keys) = self.open(&ring)?;
                self.mirror(&keys)?;
                return Ok(signer);
            }
            if group == 0 && !made {
                // Every committed entry of group 0 is applied here (the leader waited for it),
                // so no ring was ever made: this leader makes it.
                let ring = self.make()?;
                let kid = kid_of(&ring.signing);
                let batch = Batch {
                    term: 0, // the replicator stamps it
                    ops: vec![Op::Put {
                        table: names::TICKET_RING.to_owned(),
                        key: RING.to_vec(),
                        value: codec::encode(&ring),
                    }],
                };
                replicate
                    .commit(batch)
                    .await
                    .map_err(|e| anyhow::anyhow!("committing the ticket key ring: {e}"))?;
                tracing::info!(%kid, keys = ring.keys.len(), "made the cluster's ticket key ring");
                made = true;
                continue;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(NotYet.into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Writes the public half of each of `keys` to the data dir's ring folder (those not there).
    fn mirror(&self, keys: &[PublicKey]) -> anyhow::Result<()> {
        for k in keys {
            crate::tickets::keep_public_key(&self.data_dir, k)?;
        }
        Ok(())
    }

    /// Mirrors the ring's public keys into the data dir whenever this node's copy of group 0
    /// has a ring (every node, leading or not), checking every `every`.
    pub(crate) fn keep_mirrored(self: Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut seen: Option<SealedRing> = None;
            loop {
                match self.read() {
                    Ok(Some(ring)) if seen.as_ref() != Some(&ring) => {
                        match ring.public_keys().and_then(|k| self.mirror(&k)) {
                            Ok(()) => seen = Some(ring),
                            Err(e) => {
                                tracing::warn!(error = %format!("{e:#}"), "mirroring the ticket key ring")
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %format!("{e:#}"), "the ticket key ring"),
                }
                tokio::time::sleep(every).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer(secret: &str) -> Sealer {
        Sealer::new(&ClusterSecret::new(secret).unwrap())
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
        };
        let e = s.unseal(&verify_only).err().unwrap().to_string();
        assert!(e.contains("no private half"), "{e}");
    }

    fn ring_in(dir: &std::path::Path) -> ClusterRing {
        let store: Arc<dyn Kv> = Arc::new(boxoffice_engine::store::SimKv::new());
        ClusterRing::new(
            store,
            &ClusterSecret::new("one cluster").unwrap(),
            dir.to_owned(),
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
        let (signer, keys) = ring.open(&made).unwrap();
        assert_eq!(signer.kid(), now.kid());
        assert!(keys.iter().any(|k| k.kid() == before.kid()));
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
