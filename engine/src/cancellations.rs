//! The `Cancellations` component: tickets of an order given back (`CancelTickets`).
//!
//! One logged step, in the order's section: the tickets leave the order (their codes are
//! revoked), their places come back (first to the waitlist's next fan, through the sweeper;
//! otherwise on sale), and the buyer's allowance goes down by as many places, once the record is
//! durable. Then the refund of those tickets (their section's price each) is made with the
//! payment provider under the cancellation's own key (`{order_id}:cancel:{n}`), so it is made
//! once however often it is tried. A refund that fails is left to the refund pass
//! (`Refunds::settle_and_reconcile`), which finds every cancellation whose refund the provider
//! does not have and makes it; reconciliation names one still missing (`refund_missing`).
//!
//! The event's cancellation deadline (`EventSpec::cancellation_deadline_ms`, 0: none) closes
//! it: `CANCELLATION_CLOSED`. The idempotency key is scoped per order: a retry with the same key
//! and tickets answers the first cancellation again (its refund tried again if it is missing);
//! the same key with other tickets is `IDEMPOTENCY_KEY_REUSED`.

use std::sync::Arc;

use crate::booking::{idem_tag, not_found_as};
use crate::catalog::Catalog;
use crate::core::{CancelTickets, Cancelled};
use crate::error::{EngineError, Rejection};
use crate::kernel::Kernel;
use crate::payment::{Charge, ChargeStatus, PaymentProvider};
use crate::section::SectionMsg;
use crate::types::{EventId, OrderId, UserId, check_idempotency_key, check_user_id};

/// Most tickets one `CancelTickets` names (an order has at most this many).
const TICKETS_PER_CALL_MAX: usize = crate::limits::PLACES_PER_HOLD_MAX as usize;

/// What a cancellation answers: what it did, and its refund (`None`: not made yet; the refund
/// pass makes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TicketsCancelled {
    /// The cancellation.
    pub cancelled: Cancelled,
    /// The provider's refund, if made.
    pub refund: Option<Charge>,
}

/// A `CancelTickets` as the engine takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CancelRequest {
    /// The order.
    pub order_id: OrderId,
    /// Its buyer.
    pub user_id: UserId,
    /// The tickets to give back (`{order_id}.{n}`).
    pub ticket_ids: Vec<String>,
    /// The idempotency key (empty: none), scoped per order.
    pub idempotency_key: String,
}

/// See the module.
#[derive(Clone)]
pub(crate) struct Cancellations {
    kernel: Arc<Kernel>,
    catalog: Arc<Catalog>,
    payments: Arc<dyn PaymentProvider>,
}

impl Cancellations {
    pub(crate) fn new(
        kernel: Arc<Kernel>,
        catalog: Arc<Catalog>,
        payments: Arc<dyn PaymentProvider>,
    ) -> Cancellations {
        Cancellations {
            kernel,
            catalog,
            payments,
        }
    }

    /// Gives `ticket_ids` of `order_id` back (see the module); runs to its end even if the
    /// caller stops waiting.
    pub async fn cancel_tickets(
        &self,
        req: CancelRequest,
    ) -> Result<TicketsCancelled, EngineError> {
        let me = self.clone();
        crate::kernel::detached(async move { me.cancel_now(req).await }).await
    }

    async fn cancel_now(&self, req: CancelRequest) -> Result<TicketsCancelled, EngineError> {
        let CancelRequest {
            order_id,
            user_id,
            mut ticket_ids,
            idempotency_key: key,
        } = req;
        let (order_id, user_id, key) = (&order_id, &user_id, key.as_str());
        self.kernel.check_ready()?;
        check_user_id(user_id)?;
        check_idempotency_key(key)?;
        if ticket_ids.is_empty() || ticket_ids.len() > TICKETS_PER_CALL_MAX {
            return Err(Rejection::invalid(
                "ticket_ids",
                format!("name 1 to {TICKETS_PER_CALL_MAX} tickets"),
            )
            .into());
        }
        let (event_id, section_id) = order_id.route().ok_or(Rejection::OrderNotFound)?;
        let event = self
            .catalog
            .entry(&event_id)
            .map_err(|_| Rejection::OrderNotFound)?;
        let deadline = event.spec.cancellation_deadline_ms;
        if deadline == 0 || self.kernel.now_ms() >= deadline {
            return Err(Rejection::CancellationClosed.into());
        }
        ticket_ids.sort();
        let idem = idem_tag(key, &("CancelTickets", order_id, &ticket_ids));
        let cmd = CancelTickets {
            order_id: order_id.clone(),
            user_id: user_id.clone(),
            ticket_ids,
            idem,
        };
        let cancelled = self
            .kernel
            .ask(&event, &section_id, |reply| SectionMsg::Cancel(cmd, reply))
            .await
            .map_err(not_found_as(Rejection::OrderNotFound))?;
        if !cancelled.replayed {
            metrics::counter!("boxoffice_tickets_cancelled_total")
                .increment(cancelled.ticket_ids.len() as u64);
        }
        if cancelled.refund_cents == 0 {
            // Nothing was paid for them (a received order, or a free section).
            return Ok(TicketsCancelled {
                cancelled,
                refund: None,
            });
        }
        let refund = match refund_part(
            self.payments.as_ref(),
            &cancelled.order.payment_ref,
            &cancelled.refund_key,
            cancelled.refund_cents,
        )
        .await
        {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(error = %e, order = %order_id, key = %cancelled.refund_key,
                    "the refund of tickets given back failed; the refund pass retries it");
                None
            }
        };
        Ok(TicketsCancelled { cancelled, refund })
    }
}

impl Cancellations {
    /// The ids of every ticket of `event_id` given back, ascending (its revocation list), each
    /// section asked in its mailbox's order: every cancellation acknowledged before is in it.
    pub async fn revoked_tickets(&self, event_id: &EventId) -> Result<Vec<String>, EngineError> {
        self.kernel.check_ready()?;
        let event = self.catalog.entry(event_id)?;
        let asks = event
            .sections
            .iter()
            .map(|s| self.kernel.ask(&event, &s.section_id, SectionMsg::Revoked));
        let mut ids: Vec<String> = futures_util::future::try_join_all(asks)
            .await?
            .into_iter()
            .flatten()
            .collect();
        ids.sort();
        Ok(ids)
    }
}

/// Makes the refund of a cancellation with the provider: `amount_cents` of `payment_id` under
/// `key` (once, however often it is called), counted in `boxoffice_refunds_total`.
pub(crate) async fn refund_part(
    payments: &dyn PaymentProvider,
    payment_id: &str,
    key: &str,
    amount_cents: u64,
) -> Result<Charge, EngineError> {
    let unavailable = |reason: String| EngineError::PaymentUnavailable {
        timeout: false,
        reason,
    };
    if let Some(done) = payments
        .lookup(key)
        .await
        .map_err(|e| unavailable(e.to_string()))?
    {
        return Ok(done);
    }
    let refund = payments
        .refund_part(payment_id, key, amount_cents)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    if refund.status != ChargeStatus::Refunded {
        return Err(unavailable(format!("the refund is {:?}", refund.status)));
    }
    metrics::counter!("boxoffice_refunds_total", "cause" => "tickets_cancelled").increment(1);
    Ok(refund)
}
