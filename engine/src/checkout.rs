//! Checkout: the payment saga of `confirm`. Charge through the [`PaymentProvider`] (keyed by the
//! hold and the token, so a retry never charges twice), then the section confirms (sold, order,
//! backstop claims, durable); a refusal after a charge refunds it, and a charge that lands after
//! the hold expired takes the same places again if they are free (else refunds).

use std::sync::Arc;
use std::time::Instant;

use crate::booking::{Booking, fingerprint, idem_tag, not_found_as, replayed_order};
use crate::catalog::Catalog;
use crate::core::{ConfirmHold, IdemTag};
use crate::error::{EngineError, Rejection, only};
use crate::events::EventEntry;
use crate::kernel::Kernel;
use crate::ledger::{Answer, Begin, BeginArgs, Rpc};
use crate::limits::PAYMENT_TOKEN_LEN_MAX;
use crate::orphans::Orphans;
use crate::payment::{Charge, PaymentError, PaymentProvider};
use crate::section::SectionMsg;
use crate::types::{
    ConfirmRequest, HoldId, HoldRequest, HoldStatus, HoldView, OrderId, OrderView, SectionId,
    Selection, UserId, check_idempotency_key, check_user_id,
};

/// Whether the failpoint `name` is armed (`BOXOFFICE_FAILPOINT=name`), for crash tests that
/// need the process to die at an exact place.
fn failpoint(name: &str) -> bool {
    static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var("BOXOFFICE_FAILPOINT").ok())
        .as_deref()
        == Some(name)
}

/// Confirm's payment saga (see the module's doc): cheap to clone (a confirm's work is
/// detached with a clone of it).
#[derive(Clone)]
pub(crate) struct Checkout {
    kernel: Arc<Kernel>,
    catalog: Arc<Catalog>,
    booking: Booking,
    payments: Arc<dyn PaymentProvider>,
    orphans: Arc<Orphans>,
}

impl Checkout {
    pub(crate) fn new(
        kernel: Arc<Kernel>,
        catalog: Arc<Catalog>,
        booking: Booking,
        payments: Arc<dyn PaymentProvider>,
        orphans: Arc<Orphans>,
    ) -> Checkout {
        Checkout {
            kernel,
            catalog,
            booking,
            payments,
            orphans,
        }
    }
}

impl Checkout {
    /// Confirms a hold: charges the payment token through the payment provider (idempotency key
    /// derived from the hold and the token, so retries never charge twice), then the places
    /// become sold and an order with one ticket per place is made, durable before the answer.
    /// Declined: `PaymentDeclined`, the hold stays. Provider timeout or failure: no order,
    /// `PaymentUnavailable`; a retry with the same token finds the charge's real outcome. Paid
    /// but the hold expired meanwhile: the same places are taken again if free, else the charge
    /// is refunded and the answer is `HoldExpired`. Never a charge without a ticket or a refund
    /// (short of a crash between the charge and the order, which a retry or the reconciliation
    /// settles).
    ///
    /// Runs to the end even if the caller stops waiting (see [`crate::kernel::detached`]).
    pub async fn confirm(&self, req: ConfirmRequest) -> Result<OrderView, EngineError> {
        let checkout = self.clone();
        crate::kernel::detached(async move { checkout.confirm_now(req).await }).await
    }

    async fn confirm_now(&self, req: ConfirmRequest) -> Result<OrderView, EngineError> {
        self.kernel.check_ready()?;
        check_user_id(&req.user_id)?;
        check_idempotency_key(&req.idempotency_key)?;
        if req.payment_ref.is_empty() || req.payment_ref.len() > PAYMENT_TOKEN_LEN_MAX {
            return Err(Rejection::invalid(
                "payment_token",
                format!("must be 1 to {PAYMENT_TOKEN_LEN_MAX} bytes"),
            )
            .into());
        }
        let (event_id, section_id) = req.hold_id.route().ok_or(Rejection::HoldNotFound)?;
        let event = self
            .catalog
            .entry(&event_id)
            .map_err(|_| Rejection::HoldNotFound)?;
        let tag = idem_tag(
            &req.idempotency_key,
            &(Rpc::Confirm, &req.hold_id, &req.payment_ref),
        );
        let args = || BeginArgs {
            event_id: event_id.clone(),
            user_id: req.user_id.clone(),
            limit: event.per_user_limit(),
            rpc: Rpc::Confirm,
            tag: tag.clone(),
            quantity: 0,
            cooldown_ms: 0,
            now_ms: self.kernel.now_ms(),
        };
        if tag.is_some() {
            match only(self.kernel.ledger().begin(vec![args()]).await)? {
                Begin::Replay(answer) => return replayed_order(answer),
                Begin::Proceed => {}
            }
        }
        let outcome = {
            let _running = self.orphans.checkout(&req.hold_id);
            self.checkout(&event, &section_id, &req, tag.clone()).await
        };
        let label = match &outcome {
            Ok(_) => "confirmed",
            Err(EngineError::Rejected(r)) => r.reason(),
            Err(EngineError::PaymentUnavailable { timeout: true, .. }) => "PAYMENT_TIMEOUT",
            Err(EngineError::PaymentUnavailable { .. }) => "PAYMENT_UNAVAILABLE",
            Err(_) => "error",
        };
        metrics::counter!("boxoffice_checkout_confirms_total", "outcome" => label).increment(1);
        if tag.is_some() {
            match &outcome {
                Ok(order) => self
                    .kernel
                    .ledger()
                    .settled(vec![(args(), Answer::Order(Box::new(order.clone())))]),
                Err(e) => {
                    self.kernel
                        .ledger()
                        .finish(vec![(args(), Err(e.clone()))])
                        .await?
                }
            }
        }
        outcome
    }

    /// The saga: a payable hold, the charge, the section's confirm (or a rescue or refund).
    async fn checkout(
        &self,
        event: &EventEntry,
        section_id: &SectionId,
        req: &ConfirmRequest,
        tag: Option<IdemTag>,
    ) -> Result<OrderView, EngineError> {
        let hold = self.payable_hold(event, section_id, req).await?;
        let charge = self.charge(&hold, req).await?;
        match self
            .confirm_in_section(
                event,
                section_id,
                &req.hold_id,
                &req.user_id,
                &charge,
                tag.clone(),
            )
            .await
        {
            Ok(order) => Ok(order),
            Err(EngineError::Rejected(Rejection::HoldExpired)) => {
                self.rescue_or_refund(event, section_id, &hold, &charge, tag)
                    .await
            }
            Err(EngineError::Rejected(r)) => {
                self.refund(&charge).await;
                Err(r.into())
            }
            // Not a definite answer: the charge stays; a retry with the same token finds it.
            Err(e) => Err(e),
        }
    }

    /// The hold, if it is the caller's, active and within its deadline. Charging for a hold
    /// already past its deadline would only buy a refund: it is expired (as a section does when
    /// a confirm comes late) and the answer is `HoldExpired`.
    async fn payable_hold(
        &self,
        event: &EventEntry,
        section_id: &SectionId,
        req: &ConfirmRequest,
    ) -> Result<HoldView, EngineError> {
        let hold = self
            .booking
            .get_hold(&req.hold_id)
            .await
            .map_err(not_found_as(Rejection::HoldNotFound))?;
        if hold.user_id != req.user_id {
            return Err(Rejection::HoldNotFound.into());
        }
        match hold.status {
            HoldStatus::Held => {}
            HoldStatus::Expired => return Err(Rejection::HoldExpired.into()),
            HoldStatus::Confirmed | HoldStatus::Released => {
                return Err(Rejection::HoldNotActive.into());
            }
        }
        if self.kernel.now_ms() >= hold.expires_at_ms {
            // Past its deadline by the clock: the section expires it, unless its sale is
            // paused (its deadlines stand still) and the hold may still be paid.
            let h = req.hold_id.clone();
            let still_held = self
                .kernel
                .ask(event, section_id, |reply| {
                    SectionMsg::ExpireHoldIfDue(h, reply)
                })
                .await?;
            if !still_held {
                return Err(Rejection::HoldExpired.into());
            }
        }
        Ok(hold)
    }

    /// Charges the hold's price (its places' prices, fixed when it was made: see
    /// [`crate::prices`]) through the provider, keyed by the hold and the token (so a retry
    /// finds the same charge instead of making another).
    async fn charge(&self, hold: &HoldView, req: &ConfirmRequest) -> Result<Charge, EngineError> {
        let amount = hold.amount_cents();
        let key = format!("{}:{:016x}", req.hold_id, fingerprint(&req.payment_ref));
        let started = Instant::now();
        let charged = self.payments.charge(&key, amount, &req.payment_ref).await;
        metrics::histogram!("boxoffice_payment_charge_seconds")
            .record(started.elapsed().as_secs_f64());
        match charged {
            Ok(c) => {
                // Crash tests: die between the charge and the order.
                if failpoint("after_charge") {
                    std::process::abort();
                }
                Ok(c)
            }
            Err(PaymentError::Declined) => Err(Rejection::PaymentDeclined.into()),
            Err(PaymentError::InvalidToken) => Err(Rejection::invalid(
                "payment_token",
                "not a token the payment provider takes",
            )
            .into()),
            Err(e) => Err(EngineError::PaymentUnavailable {
                timeout: e == PaymentError::Timeout,
                reason: e.to_string(),
            }),
        }
    }

    async fn confirm_in_section(
        &self,
        event: &EventEntry,
        section_id: &SectionId,
        hold_id: &HoldId,
        user_id: &UserId,
        charge: &Charge,
        tag: Option<IdemTag>,
    ) -> Result<OrderView, EngineError> {
        let cmd = ConfirmHold {
            hold_id: hold_id.clone(),
            user_id: user_id.clone(),
            order_id: OrderId::generate(&event.event_id, section_id),
            payment_ref: charge.payment_id.clone(),
            idem: tag,
        };
        self.kernel
            .ask(event, section_id, |reply| SectionMsg::Confirm(cmd, reply))
            .await
            .map_err(not_found_as(Rejection::HoldNotFound))
    }

    /// Paid, but the hold expired meanwhile: take the same places again if they are free and
    /// confirm them; otherwise refund and answer `HoldExpired`.
    async fn rescue_or_refund(
        &self,
        event: &EventEntry,
        section_id: &SectionId,
        hold: &HoldView,
        charge: &Charge,
        tag: Option<IdemTag>,
    ) -> Result<OrderView, EngineError> {
        let selection = if hold.seat_ids.is_empty() {
            Selection::BestAvailable {
                section: Some(section_id.clone()),
                quantity: hold.quantity,
            }
        } else {
            Selection::Seats(hold.seat_ids.clone())
        };
        let again = self
            .booking
            .hold(HoldRequest {
                event_id: event.event_id.clone(),
                user_id: hold.user_id.clone(),
                idempotency_key: String::new(),
                selection,
                access_code: String::new(),
            })
            .await;
        // The same places at the same price only: the fan was charged the first hold's.
        if let Ok(new_hold) = again.as_ref()
            && new_hold.amount_cents() != charge.amount_cents
        {
            let _ = self.booking.release(&new_hold.hold_id, &hold.user_id).await;
        } else if let Ok(new_hold) = again {
            match self
                .confirm_in_section(
                    event,
                    section_id,
                    &new_hold.hold_id,
                    &hold.user_id,
                    charge,
                    tag,
                )
                .await
            {
                Ok(order) => {
                    metrics::counter!("boxoffice_checkout_rescued_total").increment(1);
                    return Ok(order);
                }
                Err(e) => {
                    tracing::warn!(error = %e, hold = %new_hold.hold_id, "rescue confirm failed");
                    let _ = self.booking.release(&new_hold.hold_id, &hold.user_id).await;
                }
            }
        }
        self.refund(charge).await;
        Err(Rejection::HoldExpired.into())
    }

    async fn refund(&self, charge: &Charge) {
        match self.payments.refund(&charge.payment_id).await {
            Ok(refunded) => {
                if refunded.status == crate::payment::ChargeStatus::Refunded
                    && let Some(hold) = crate::refunds::hold_of(&refunded)
                {
                    let user = self.booking.get_hold(&hold).await.ok().map(|h| h.user_id);
                    self.kernel
                        .note_change(crate::changes::refunded(
                            (&refunded.payment_id, refunded.amount_cents),
                            &hold,
                            user,
                            self.kernel.now_ms(),
                        ))
                        .await;
                }
                metrics::counter!("boxoffice_checkout_refunds_total").increment(1)
            }
            // Left for the reconciliation to report: a captured payment without an order.
            Err(e) => tracing::error!(error = %e, payment = %charge.payment_id, "refund failed"),
        }
    }
}
