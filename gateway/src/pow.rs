//! The proof of work before `Join` (the bot defence of the waiting room), per event.
//!
//! An event created with `join_pow_difficulty_bits` > 0 asks every fan who takes a new place in
//! its line for a solved challenge:
//!
//! - **Challenges are stateless**: `GetJoinChallenge` signs one with the token secret (a token of
//!   kind [`TokenKind::JoinChallenge`]: event, user, a random 64-bit nonce, the time it was
//!   issued, the server's instance, the expiry) and keeps nothing. Issuing one costs one HMAC.
//!   The instance is random per server start, like the waiting room's epoch: the set of used
//!   challenges lives in memory, so a challenge from before a restart is refused as expired
//!   rather than made usable once more.
//! - **Solving** is the client's work: a nonce such that SHA-256(challenge || nonce) has
//!   `difficulty_bits` leading zero bits ([`boxoffice_proto::pow`]), about `2^bits` hashes.
//! - **Checking** costs one HMAC (the signature, with the binding to the event and user and the
//!   expiry), one SHA-256 (the solution) and one insert into a concurrent set of the challenges
//!   already used ([`DashMap`], sharded: no global lock on the Join path).
//! - **Usable once**: the set keeps a used challenge's id (the first 16 bytes of its HMAC tag)
//!   until the challenge expires. A challenge past its expiry is refused as expired before the
//!   set is looked at, so forgetting it then is safe. [`JoinChallenges::prune`] drops expired
//!   entries; the server runs it every [`PRUNE_EVERY`] ([`spawn_pruner`]).
//!
//! **Bound of the set**: it holds only challenges that were used (each one by a `Join` that took
//! a new place: a `Join` refused with `QUEUE_FULL` gives its challenge back) and have not yet
//! expired, plus at most one prune interval of expired ones. So it never holds more than the
//! places taken in the last `ttl + PRUNE_EVERY`, which is also at most the sum of the lines'
//! `--queue-max`; one entry is a 16-byte id and an 8-byte expiry (about 40 bytes with the
//! table's overhead).

use boxoffice_engine::hash::DashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use boxoffice_engine::Clock;
use dashmap::mapref::entry::Entry;

use crate::tokens::{Claims, TokenError, TokenKind, TokenSigner};

pub use crate::limits::JOIN_CHALLENGE_TTL_MS_DEFAULT;

/// How often the server drops expired entries from the set of used challenges.
pub const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// Why a `Join` was refused by the proof of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowError {
    /// The event asks for a proof of work and the request carries no challenge.
    Required,
    /// The challenge is malformed, forged, for another event or user, of another difficulty,
    /// or the nonce does not solve it.
    Invalid,
    /// The challenge is past its expiry.
    Expired,
    /// The challenge was already used by a `Join`.
    Reused,
}

impl PowError {
    /// The `ErrorInfo.reason` of the contract.
    pub fn reason(self) -> &'static str {
        match self {
            PowError::Required => "POW_REQUIRED",
            PowError::Invalid => "POW_INVALID",
            PowError::Expired => "POW_EXPIRED",
            PowError::Reused => "POW_REUSED",
        }
    }
}

/// A challenge as `GetJoinChallenge` hands it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    /// The signed challenge text.
    pub challenge: String,
    /// When it stops being accepted (exclusive), ms since the Unix epoch.
    pub expires_at_ms: u64,
}

/// The id of a challenge a `Join` used (to give it back if the `Join` took no place).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Used(u128);

/// Issues and checks join challenges; remembers the used ones until they expire.
pub struct JoinChallenges {
    ttl_ms: u64,
    /// Random per instance (server start): challenges of another instance are refused.
    instance: u64,
    used: DashMap<u128, u64>,
}

impl JoinChallenges {
    /// Challenges valid for `ttl_ms` from their issue.
    pub fn new(ttl_ms: u64) -> JoinChallenges {
        JoinChallenges {
            ttl_ms: ttl_ms.max(1),
            instance: boxoffice_engine::rt::random_u64(),
            used: DashMap::default(),
        }
    }

    /// How long a challenge is valid, ms.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// A new challenge for `user_id` joining `event_id`, at `now_ms` (its difficulty is the
    /// event's, which never changes).
    pub fn issue(
        &self,
        signer: &TokenSigner,
        event_id: &str,
        user_id: &str,
        now_ms: u64,
    ) -> Issued {
        let expires_at_ms = now_ms.saturating_add(self.ttl_ms);
        let challenge = signer.sign(&Claims {
            kind: TokenKind::JoinChallenge,
            event_id: event_id.to_owned(),
            user_id: user_id.to_owned(),
            number: boxoffice_engine::rt::random_u64(),
            at_ms: now_ms,
            epoch: self.instance,
            expires_at_ms,
        });
        Issued {
            challenge,
            expires_at_ms,
        }
    }

    /// Checks a `Join`'s proof of work for an event asking for `bits` (> 0): the challenge's
    /// signature, its binding to `event_id` and `user_id`, its expiry at `now_ms` (and that this
    /// instance issued it), the solution, then that it was not used before; on success it is
    /// used now.
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &self,
        signer: &TokenSigner,
        challenge: &str,
        nonce: u64,
        event_id: &str,
        user_id: &str,
        bits: u32,
        now_ms: u64,
    ) -> Result<Used, PowError> {
        if challenge.is_empty() {
            return Err(PowError::Required);
        }
        let (claims, id) = signer
            .verify_with_id(
                challenge,
                TokenKind::JoinChallenge,
                Some(event_id),
                Some(user_id),
                now_ms,
            )
            .map_err(|e| match e {
                TokenError::Invalid => PowError::Invalid,
                TokenError::Expired => PowError::Expired,
            })?;
        if claims.epoch != self.instance {
            // Issued before a restart: the used set of then is gone.
            return Err(PowError::Expired);
        }
        if !boxoffice_proto::pow::is_solution(challenge, nonce, bits) {
            return Err(PowError::Invalid);
        }
        match self.used.entry(id) {
            Entry::Occupied(_) => Err(PowError::Reused),
            Entry::Vacant(v) => {
                v.insert(claims.expires_at_ms);
                Ok(Used(id))
            }
        }
    }

    /// Forgets that a challenge was used (its `Join` took no place): it may be used again.
    pub fn give_back(&self, used: Used) {
        self.used.remove(&used.0);
    }

    /// Drops the used challenges that have expired at `now_ms` (a `Join` with one is refused as
    /// expired before the set is looked at); returns how many are still kept.
    pub fn prune(&self, now_ms: u64) -> usize {
        self.used.retain(|_, expires_at_ms| *expires_at_ms > now_ms);
        self.used.len()
    }

    /// Used challenges remembered now.
    pub fn used_len(&self) -> usize {
        self.used.len()
    }
}

/// Prunes `challenges` every [`PRUNE_EVERY`] until they are dropped elsewhere or the returned
/// task is aborted; publishes the count kept as `boxoffice_join_challenges_used`.
pub fn spawn_pruner(
    challenges: Weak<JoinChallenges>,
    clock: Arc<dyn Clock>,
) -> tokio::task::JoinHandle<()> {
    let kept = metrics::gauge!("boxoffice_join_challenges_used");
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PRUNE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(c) = challenges.upgrade() else {
                break;
            };
            kept.set(c.prune(clock.now_ms()) as f64);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use boxoffice_proto::pow::solve;

    const NOW: u64 = 1_000_000;

    fn setup() -> (TokenSigner, JoinChallenges) {
        (TokenSigner::new(b"secret"), JoinChallenges::new(60_000))
    }

    #[test]
    fn a_solved_challenge_admits_once_and_every_bad_one_is_refused_with_its_reason() {
        let (s, c) = setup();
        let issued = c.issue(&s, "e1", "ann", NOW);
        assert_eq!(issued.expires_at_ms, NOW + 60_000);
        let nonce = solve(&issued.challenge, 8);
        let check = |ch: &str, n: u64, ev: &str, user: &str, bits: u32, now: u64| {
            c.check(&s, ch, n, ev, user, bits, now)
        };
        let ch = issued.challenge.as_str();
        assert_eq!(check("", 0, "e1", "ann", 8, NOW), Err(PowError::Required));
        assert_eq!(
            check(ch, nonce, "e2", "ann", 8, NOW),
            Err(PowError::Invalid)
        );
        assert_eq!(
            check(ch, nonce, "e1", "bob", 8, NOW),
            Err(PowError::Invalid)
        );
        let restarted = JoinChallenges::new(60_000);
        assert_eq!(
            restarted.check(&s, ch, nonce, "e1", "ann", 8, NOW),
            Err(PowError::Expired),
            "issued by the server before a restart (same secret)"
        );
        let harder =
            boxoffice_proto::pow::leading_zero_bits(&boxoffice_proto::pow::pow_hash(ch, nonce)) + 1;
        assert_eq!(
            check(ch, nonce, "e1", "ann", harder, NOW),
            Err(PowError::Invalid),
            "a hash too weak for the event's difficulty"
        );
        let wrong = (0..)
            .find(|n| !boxoffice_proto::pow::is_solution(ch, *n, 8))
            .unwrap();
        assert_eq!(
            check(ch, wrong, "e1", "ann", 8, NOW),
            Err(PowError::Invalid)
        );
        assert_eq!(
            check(ch, nonce, "e1", "ann", 8, NOW + 60_000),
            Err(PowError::Expired),
            "the expiry is exclusive"
        );
        assert_eq!(c.used_len(), 0, "no refusal uses the challenge");
        let used = check(ch, nonce, "e1", "ann", 8, NOW + 59_999).unwrap();
        assert_eq!(check(ch, nonce, "e1", "ann", 8, NOW), Err(PowError::Reused));
        c.give_back(used);
        assert!(check(ch, nonce, "e1", "ann", 8, NOW).is_ok(), "given back");
        // Another challenge for the same fan is another challenge.
        let other = c.issue(&s, "e1", "ann", NOW);
        assert_ne!(other.challenge, issued.challenge);
        assert!(
            check(
                &other.challenge,
                solve(&other.challenge, 8),
                "e1",
                "ann",
                8,
                NOW
            )
            .is_ok()
        );
        // Another secret's challenge, or a tampered one, is invalid.
        let foreign = c.issue(&TokenSigner::new(b"other"), "e1", "ann", NOW);
        assert_eq!(
            check(
                &foreign.challenge,
                solve(&foreign.challenge, 8),
                "e1",
                "ann",
                8,
                NOW
            ),
            Err(PowError::Invalid)
        );
        let mut tampered = ch.as_bytes().to_vec();
        tampered[3] ^= 0x01;
        let tampered = String::from_utf8(tampered).unwrap();
        assert_eq!(
            check(&tampered, solve(&tampered, 8), "e1", "ann", 8, NOW),
            Err(PowError::Invalid)
        );
        // Queue and admission tokens are not challenges.
        let queue = s.sign(&Claims {
            kind: TokenKind::Queue,
            event_id: "e1".into(),
            user_id: "ann".into(),
            number: 1,
            at_ms: NOW,
            epoch: c.instance,
            expires_at_ms: NOW + 1_000,
        });
        assert_eq!(
            check(&queue, solve(&queue, 8), "e1", "ann", 8, NOW),
            Err(PowError::Invalid)
        );
    }

    #[test]
    fn pruning_forgets_only_expired_challenges() {
        let (s, c) = setup();
        let early = c.issue(&s, "e1", "ann", NOW);
        let late = c.issue(&s, "e1", "bob", NOW + 30_000);
        for (i, u) in [(&early, "ann"), (&late, "bob")] {
            c.check(
                &s,
                &i.challenge,
                solve(&i.challenge, 1),
                "e1",
                u,
                1,
                NOW + 30_000,
            )
            .unwrap();
        }
        assert_eq!(c.prune(NOW + 59_999), 2);
        assert_eq!(c.prune(NOW + 60_000), 1, "the early one expired");
        // The late one is still refused as reused; the early one as expired, not as new.
        assert_eq!(
            c.check(
                &s,
                &late.challenge,
                solve(&late.challenge, 1),
                "e1",
                "bob",
                1,
                NOW + 60_000
            ),
            Err(PowError::Reused)
        );
        assert_eq!(
            c.check(
                &s,
                &early.challenge,
                solve(&early.challenge, 1),
                "e1",
                "ann",
                1,
                NOW + 60_000
            ),
            Err(PowError::Expired)
        );
        assert_eq!(c.prune(NOW + 90_000), 0);
    }
}
