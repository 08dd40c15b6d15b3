//! Refunds of money kept without a sale.
//!
//! A charge can be captured and still end without an order: the provider took the money but
//! its answer was lost (`tok_timeout`), and the fan then released the hold or let it expire; or
//! the process died between the charge and the order; or the fan paid again with another token
//! after a lost answer. Checkout refunds what it knows to be orphaned at once; these are the
//! charges it cannot know about, and [`Refunds::settle_and_reconcile`] refunds them.
//!
//! A captured charge is **orphaned** when no order is paid by it, its hold (named by the
//! charge's key, `{hold_id}:{token fingerprint}`) has ended (released, expired, or confirmed by
//! another payment), and no checkout of that hold is running. It is refunded by the first pass
//! at least `grace` after a pass first found it orphaned; just before the refund the section's
//! orders are read again, so an order made meanwhile (a paid-late rescue) keeps its payment.
//! Charges whose hold is still held are left alone: a retry of `Confirm` may still turn them
//! into an order, and once the hold expires they become orphans. Whatever can't be tied to a
//! hold of this engine stays a reconciliation finding for a person to look at.

use std::sync::Arc;

use crate::audit::Audit;
use crate::booking::Booking;
use crate::catalog::Catalog;
use crate::error::EngineError;
use crate::hash::HashSet;
use crate::kernel::Kernel;
use crate::payment::{Charge, ChargeStatus};
use crate::reconcile::{self, Finding};
use crate::types::{HoldId, HoldStatus};

/// What one settlement pass did, besides the findings it returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settlement {
    /// Orphaned charges refunded by this pass: (payment id, amount in cents).
    pub refunded: Vec<(String, u64)>,
    /// Orphaned charges waiting for their grace (or for a refund that failed to be retried).
    pub pending: Vec<String>,
}

/// The hold a charge was made for, from its key (`{hold_id}:{fingerprint}`).
pub(crate) fn hold_of(charge: &Charge) -> Option<HoldId> {
    let (hold, _) = charge.key.rsplit_once(':')?;
    let hold = HoldId(hold.to_owned());
    hold.route().map(|_| hold)
}

/// Refunds of orphaned charges (see the module's doc): the payments and the orphans are the
/// audit's, which gathers the books it settles.
pub(crate) struct Refunds {
    kernel: Arc<Kernel>,
    catalog: Arc<Catalog>,
    audit: Audit,
    booking: Booking,
}

impl Refunds {
    pub(crate) fn new(
        kernel: Arc<Kernel>,
        catalog: Arc<Catalog>,
        audit: Audit,
        booking: Booking,
    ) -> Refunds {
        Refunds {
            kernel,
            catalog,
            audit,
            booking,
        }
    }
}

impl Refunds {
    /// The server's periodic pass: reconciles, refunds the orphaned charges whose grace has
    /// passed (see the module docs), and returns the findings left, with what was refunded.
    /// Orphans waiting for their grace are not findings: they are counted in
    /// `boxoffice_refunds_pending` and logged. Every finding is counted and logged, as
    /// [`Audit::reconcile`] does.
    pub async fn settle_and_reconcile(
        &self,
        grace: std::time::Duration,
    ) -> Result<(Vec<Finding>, Settlement), EngineError> {
        let books = self.audit.books().await?;
        let findings = reconcile::check(&books.borrowed());
        let now = self.kernel.now_ms();
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        let mut settlement = Settlement::default();
        let mut left = Vec::new();
        let mut orphaned_now = HashSet::default();
        for finding in findings {
            if let Finding::RefundMissing { .. } = &finding {
                match self.refund_cancelled(&finding).await {
                    Ok(refunded) => settlement.refunded.push(refunded),
                    Err(e) => {
                        tracing::error!(error = %e, finding = ?finding,
                            "refund of tickets given back failed; retried next pass");
                        left.push(finding);
                    }
                }
                continue;
            }
            let Finding::CapturedWithoutOrder { payment_id, .. } = &finding else {
                left.push(finding);
                continue;
            };
            let Some(charge) = books.charges.iter().find(|c| &c.payment_id == payment_id) else {
                left.push(finding);
                continue;
            };
            match self.orphan_hold(charge).await {
                Orphan::No => {}
                Orphan::Unknown => left.push(finding),
                Orphan::Yes(hold) => {
                    orphaned_now.insert(payment_id.clone());
                    let first = self.audit.orphans().first_seen(payment_id, now);
                    if now.saturating_sub(first) < grace_ms {
                        settlement.pending.push(payment_id.clone());
                        continue;
                    }
                    match self.refund_orphan(charge, &hold).await {
                        Ok(true) => {
                            self.audit.orphans().forget(payment_id);
                            settlement
                                .refunded
                                .push((payment_id.clone(), charge.amount_cents));
                        }
                        Ok(false) => self.audit.orphans().forget(payment_id),
                        Err(e) => {
                            tracing::error!(error = %e, payment = %payment_id,
                                "refund of a charge without a sale failed; retried next pass");
                            settlement.pending.push(payment_id.clone());
                        }
                    }
                }
            }
        }
        // Forget charges no longer orphaned (an order took them, or a person refunded them).
        self.audit.orphans().keep_only(&orphaned_now);
        self.audit
            .orphans()
            .pending
            .set(i64::try_from(settlement.pending.len()).unwrap_or(i64::MAX));
        for id in &settlement.pending {
            tracing::warn!(payment = %id, grace_ms, "captured charge without a sale: refund pending");
        }
        reconcile::report(&left, &self.audit.orphans().last_findings);
        Ok((left, settlement))
    }

    /// Makes the refund a cancellation owes (`finding`, a [`Finding::RefundMissing`]): its key
    /// makes it once at the provider however often it is tried. Answers (refund id, amount).
    async fn refund_cancelled(&self, finding: &Finding) -> Result<(String, u64), EngineError> {
        let Finding::RefundMissing {
            payment_id,
            refund_key,
            amount_cents,
            ..
        } = finding
        else {
            return Err(EngineError::NotReady);
        };
        let refund = crate::cancellations::refund_part(
            self.audit.payments().as_ref(),
            payment_id,
            refund_key,
            *amount_cents,
        )
        .await?;
        tracing::info!(payment = %payment_id, refund = %refund.payment_id, key = %refund_key,
            amount_cents, "refunded tickets given back (the refund at the cancellation failed)");
        Ok((refund.payment_id, refund.amount_cents))
    }

    /// Whether `charge` is orphaned now: its hold ended, and no checkout of it is running.
    async fn orphan_hold(&self, charge: &Charge) -> Orphan {
        let Some(hold_id) = hold_of(charge) else {
            return Orphan::Unknown;
        };
        let Some((event_id, _)) = hold_id.route() else {
            return Orphan::Unknown;
        };
        if self.audit.orphans().checkout_running(&hold_id) {
            return Orphan::No;
        }
        match self.booking.get_hold(&hold_id).await {
            Ok(h) if h.status == HoldStatus::Held => Orphan::No,
            Ok(_) => Orphan::Yes(hold_id),
            // The hold was forgotten (past the retention window): it ended long ago.
            Err(EngineError::Rejected(crate::error::Rejection::HoldNotFound))
                if self.catalog.entry(&event_id).is_ok() =>
            {
                Orphan::Yes(hold_id)
            }
            // Not a hold of this engine (its event is unknown): a finding for a person.
            Err(EngineError::Rejected(_)) => Orphan::Unknown,
            // The section could not answer now (overloaded, stopping): the next pass asks again.
            Err(_) => Orphan::No,
        }
    }

    /// Refunds `charge` unless an order of its section is paid by it (read again now) or a
    /// checkout of its hold started. `Ok(false)`: not refunded, it has a sale after all.
    async fn refund_orphan(&self, charge: &Charge, hold: &HoldId) -> Result<bool, EngineError> {
        let (event_id, section_id) = hold.route().ok_or(crate::error::Rejection::HoldNotFound)?;
        if self.audit.orphans().checkout_running(hold) {
            return Ok(false);
        }
        let paid = self
            .audit
            .section_core(&event_id, &section_id)
            .await?
            .orders()
            .iter()
            .any(|o| o.payment_ref == charge.payment_id);
        if paid {
            return Ok(false);
        }
        let refunded = self
            .audit
            .payments()
            .refund(&charge.payment_id)
            .await
            .map_err(|e| EngineError::PaymentUnavailable {
                timeout: false,
                reason: e.to_string(),
            })?;
        if refunded.status != ChargeStatus::Refunded {
            return Err(EngineError::PaymentUnavailable {
                timeout: false,
                reason: format!("the refund left the charge {:?}", refunded.status),
            });
        }
        let user = self
            .audit
            .section_core(&event_id, &section_id)
            .await
            .ok()
            .and_then(|core| core.hold_view(hold))
            .map(|h| h.user_id);
        self.kernel
            .note_change(crate::changes::refunded(
                (&refunded.payment_id, refunded.amount_cents),
                hold,
                user,
                self.kernel.now_ms(),
            ))
            .await;
        metrics::counter!("boxoffice_refunds_total", "cause" => "charge_without_sale").increment(1);
        tracing::info!(payment = %charge.payment_id, hold = %hold, amount_cents = charge.amount_cents,
            "refunded a captured charge whose hold ended without an order");
        Ok(true)
    }
}

enum Orphan {
    /// Not an orphan (yet): its hold is held, or its checkout is running.
    No,
    /// Orphaned: its hold ended.
    Yes(HoldId),
    /// Not tied to a hold of this engine: a finding for a person.
    Unknown,
}
