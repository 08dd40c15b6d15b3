//! What the refunder remembers between its passes (see [`crate::refunds`]), and the checkouts
//! running now: the state of the refunds component, owned here. Checkout marks its running
//! checkouts ([`Orphans::checkout`]); the settlement pass asks whether one is running, and keeps
//! when it first found each orphaned charge. In memory: after a restart a charge waits for its
//! grace again, which only delays its refund.

use crate::hash::{DashMap, HashSet};
use crate::share::Share;
use crate::types::HoldId;

/// Orphaned charges not refunded yet, and checkouts running.
pub(crate) struct Orphans {
    /// Orphaned charges not refunded yet: payment id -> when a pass first found it, ms.
    first_seen: DashMap<String, u64>,
    /// Checkouts running, by hold: their charge may become an order any moment.
    checkouts: DashMap<HoldId, u32>,
    /// This engine's part of `boxoffice_refunds_pending`.
    pub(crate) pending: Share,
    /// This engine's part of `boxoffice_reconcile_last_findings`.
    pub(crate) last_findings: Share,
}

impl Default for Orphans {
    fn default() -> Orphans {
        Orphans {
            first_seen: DashMap::default(),
            checkouts: DashMap::default(),
            pending: Share::new("boxoffice_refunds_pending"),
            last_findings: Share::new("boxoffice_reconcile_last_findings"),
        }
    }
}

/// Marks a checkout of a hold as running until dropped.
pub(crate) struct CheckoutRunning<'a> {
    orphans: &'a Orphans,
    hold: HoldId,
}

impl Orphans {
    /// A checkout of `hold` starts; its charge is not an orphan until the guard is dropped.
    pub(crate) fn checkout(&self, hold: &HoldId) -> CheckoutRunning<'_> {
        *self.checkouts.entry(hold.clone()).or_insert(0) += 1;
        CheckoutRunning {
            orphans: self,
            hold: hold.clone(),
        }
    }

    /// Whether a checkout of `hold` is running.
    pub(crate) fn checkout_running(&self, hold: &HoldId) -> bool {
        self.checkouts.contains_key(hold)
    }

    /// When a pass first found `payment_id` orphaned: `now_ms` if this pass is the first.
    pub(crate) fn first_seen(&self, payment_id: &str, now_ms: u64) -> u64 {
        *self
            .first_seen
            .entry(payment_id.to_owned())
            .or_insert(now_ms)
    }

    /// Forgets `payment_id` (refunded, or no longer to be refunded).
    pub(crate) fn forget(&self, payment_id: &str) {
        self.first_seen.remove(payment_id);
    }

    /// Forgets every charge but those `still` orphaned.
    pub(crate) fn keep_only(&self, still: &HashSet<String>) {
        self.first_seen.retain(|id, _| still.contains(id));
    }
}

impl Drop for CheckoutRunning<'_> {
    fn drop(&mut self) {
        self.orphans.checkouts.remove_if_mut(&self.hold, |_, n| {
            *n -= 1;
            *n == 0
        });
    }
}
