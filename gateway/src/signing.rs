//! The keys a server signs ticket codes with while it serves.
//!
//! - A single node signs with its data dir's key ([`crate::ticket_keys::signer`]), always.
//! - A cluster node signs with its cluster's ring ([`crate::node::ring`]). Each key of the ring
//!   signs the orders made from its `signs_from` time on, so an order's codes are the same
//!   before and after a rotation, whichever node answers. A rotation takes effect a while after
//!   it commits ([`crate::node::ring::ROTATION_LEAD`]), and every node takes it from its copy of
//!   group 0 well before that. A node whose copy may be stale (group 0 not heard lately) shows
//!   no code of an order made after its copy was last known current: it answers `NOT_READY`
//!   instead of a code that a later read would show differently.

use std::sync::RwLock;

use crate::tickets::{TicketClaims, TicketSigner};

/// The keys that sign, each from a time on.
pub struct Signing {
    state: RwLock<State>,
}

#[derive(Clone)]
struct State {
    /// `(signs_from_ms, key)`, oldest first; the first signs whatever is older than the second.
    keys: Vec<(u64, TicketSigner)>,
    /// Orders made before this time (ms since the Unix epoch) are signed; newer ones wait for a
    /// fresher copy of the ring.
    fresh_until_ms: u64,
}

/// This node's copy of the ring may be stale for an order this new.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "this node's copy of the cluster's ticket key ring may be stale for an order made at \
     {created_at_ms} ms (it was last known current up to {fresh_until_ms} ms: group 0 has not \
     been heard from lately); try again"
)]
pub struct RingStale {
    /// The order's time.
    pub created_at_ms: u64,
    /// Until when the copy is known current.
    pub fresh_until_ms: u64,
}

impl Signing {
    /// One key that signs every order (a single node).
    pub fn fixed(key: TicketSigner) -> Signing {
        Signing {
            state: RwLock::new(State {
                keys: vec![(0, key)],
                fresh_until_ms: u64::MAX,
            }),
        }
    }

    /// Keys not known yet: nothing is signed until [`Signing::set`].
    pub(crate) fn unset() -> Signing {
        Signing {
            state: RwLock::new(State {
                keys: Vec::new(),
                fresh_until_ms: 0,
            }),
        }
    }

    /// Signs with `keys` (each from its time on, any order), orders made before
    /// `fresh_until_ms`.
    pub(crate) fn set(&self, mut keys: Vec<(u64, TicketSigner)>, fresh_until_ms: u64) {
        keys.sort_by_key(|(from, _)| *from);
        let mut s = self.state.write().unwrap_or_else(|p| p.into_inner());
        s.keys = keys;
        s.fresh_until_ms = s.fresh_until_ms.max(fresh_until_ms);
    }

    /// The key that signs an order made at `created_at_ms`.
    pub fn key_for(&self, created_at_ms: u64) -> Result<TicketSigner, RingStale> {
        let s = self.read();
        if created_at_ms >= s.fresh_until_ms || s.keys.is_empty() {
            return Err(RingStale {
                created_at_ms,
                fresh_until_ms: s.fresh_until_ms,
            });
        }
        let at = s.keys.partition_point(|(from, _)| *from <= created_at_ms);
        Ok(s.keys[at.saturating_sub(1)].1.clone())
    }

    /// The code of ticket `t` of an order made at `created_at_ms`.
    pub fn sign(&self, created_at_ms: u64, t: &TicketClaims) -> Result<String, RingStale> {
        Ok(self.key_for(created_at_ms)?.sign(t))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> TicketSigner {
        TicketSigner::from_seed([b; 32])
    }

    #[test]
    fn each_key_signs_the_orders_made_from_its_time_on() {
        let s = Signing::unset();
        assert!(s.key_for(5).is_err(), "no keys: nothing signs");
        s.set(vec![(1_000, key(2)), (0, key(1))], 10_000);
        assert_eq!(s.key_for(0).unwrap().kid(), key(1).kid());
        assert_eq!(s.key_for(999).unwrap().kid(), key(1).kid());
        assert_eq!(s.key_for(1_000).unwrap().kid(), key(2).kid());
        assert_eq!(s.key_for(9_999).unwrap().kid(), key(2).kid());
        let stale = s.key_for(10_000).err().unwrap();
        assert_eq!(stale.fresh_until_ms, 10_000);
        // A fresher copy signs newer orders; an older one never narrows what was signed.
        s.set(vec![(0, key(1)), (1_000, key(2))], 20_000);
        assert!(s.key_for(15_000).is_ok());
        s.set(vec![(0, key(1)), (1_000, key(2))], 5_000);
        assert!(s.key_for(15_000).is_ok());
    }

    #[test]
    fn a_fixed_key_signs_every_order() {
        let s = Signing::fixed(key(3));
        assert_eq!(s.key_for(u64::MAX - 1).unwrap().kid(), key(3).kid());
        assert_eq!(s.key_for(0).unwrap().kid(), key(3).kid());
    }
}
