//! The `Transfers` component: tickets of an order moved to another fan (`TransferTickets`).
//!
//! The recipient's allowance is reserved first in their ledger shard (`USER_LIMIT` if the
//! places would take them past the event's per-user limit), then the order's section moves the
//! tickets in one logged step (`core::transfer`): they leave the order (their codes revoked), a
//! new order in the recipient's name holds the same places, claimed anew. Once that is durable
//! the sender's allowance goes down by as many places; a refusal gives the recipient's
//! reservation back. Capacity never changes and nothing is refunded or charged.
//!
//! Switched off per event at its creation (`transfers_disabled`): `TRANSFERS_DISABLED`. The
//! idempotency key is scoped per order, shared with `CancelTickets`.

use std::sync::Arc;

use crate::booking::{idem_tag, not_found_as};
use crate::catalog::Catalog;
use crate::core::{TransferTickets, Transferred};
use crate::error::{EngineError, Rejection, only};
use crate::kernel::Kernel;
use crate::ledger::{Begin, BeginArgs, Rpc};
use crate::section::SectionMsg;
use crate::types::{HoldId, OrderId, UserId, check_idempotency_key, check_user_id};

/// A `TransferTickets` as the engine takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferRequest {
    /// The order.
    pub order_id: OrderId,
    /// Its buyer.
    pub user_id: UserId,
    /// The tickets to move (`{order_id}.{n}`).
    pub ticket_ids: Vec<String>,
    /// The recipient.
    pub to_user_id: UserId,
    /// The idempotency key (empty: none), scoped per order.
    pub idempotency_key: String,
}

/// The request's fields, checked before anything is read.
fn check(req: &TransferRequest) -> Result<(), EngineError> {
    check_user_id(&req.user_id)?;
    check_user_id(&req.to_user_id)
        .map_err(|_| Rejection::invalid("to_user_id", "1 to 64 bytes, no control characters"))?;
    check_idempotency_key(&req.idempotency_key)?;
    let max = crate::limits::PLACES_PER_HOLD_MAX as usize;
    if req.ticket_ids.is_empty() || req.ticket_ids.len() > max {
        return Err(Rejection::invalid("ticket_ids", format!("name 1 to {max} tickets")).into());
    }
    Ok(())
}

/// See the module.
#[derive(Clone)]
pub(crate) struct Transfers {
    kernel: Arc<Kernel>,
    catalog: Arc<Catalog>,
}

impl Transfers {
    pub(crate) fn new(kernel: Arc<Kernel>, catalog: Arc<Catalog>) -> Transfers {
        Transfers { kernel, catalog }
    }

    /// Moves the tickets (see the module); runs to its end even if the caller stops waiting.
    pub async fn transfer_tickets(&self, req: TransferRequest) -> Result<Transferred, EngineError> {
        let me = self.clone();
        crate::kernel::detached(async move { me.transfer_now(req).await }).await
    }

    async fn transfer_now(&self, req: TransferRequest) -> Result<Transferred, EngineError> {
        self.kernel.check_ready()?;
        check(&req)?;
        let (event_id, section_id) = req.order_id.route().ok_or(Rejection::OrderNotFound)?;
        let event = self
            .catalog
            .entry(&event_id)
            .map_err(|_| Rejection::OrderNotFound)?;
        if event.spec.transfers_disabled {
            return Err(Rejection::TransfersDisabled.into());
        }
        let mut ticket_ids = req.ticket_ids;
        ticket_ids.sort();
        let n = u32::try_from(ticket_ids.len()).unwrap_or(u32::MAX);
        let idem = idem_tag(
            &req.idempotency_key,
            &(
                "TransferTickets",
                &req.order_id,
                &ticket_ids,
                &req.to_user_id,
            ),
        );
        // The recipient's allowance first: refused here, nothing moves.
        let reserve = BeginArgs {
            event_id: event_id.clone(),
            user_id: req.to_user_id.clone(),
            limit: event.per_user_limit(),
            rpc: Rpc::Hold,
            tag: None,
            quantity: n,
            cooldown_ms: 0,
            now_ms: self.kernel.now_ms(),
        };
        match only(self.kernel.ledger().begin(vec![reserve]).await)? {
            Begin::Proceed => {}
            Begin::Replay(_) => return Err(EngineError::NotReady),
        }
        let cmd = TransferTickets {
            order_id: req.order_id.clone(),
            user_id: req.user_id.clone(),
            ticket_ids,
            to_user: req.to_user_id.clone(),
            new_hold_id: HoldId::generate(&event_id, &section_id),
            new_order_id: OrderId::generate(&event_id, &section_id),
            idem,
        };
        let answer = self
            .kernel
            .ask(&event, &section_id, |reply| {
                SectionMsg::Transfer(cmd, reply)
            })
            .await
            .map_err(not_found_as(Rejection::OrderNotFound));
        let ledger = self.kernel.ledger();
        match &answer {
            // Done now: the sender's places are theirs no more.
            Ok(t) if !t.replayed => {
                ledger.refund(vec![(event_id, req.user_id, n, None)]);
                metrics::counter!("boxoffice_tickets_transferred_total").increment(u64::from(n));
            }
            // Nothing moved now: the recipient's reservation goes back.
            _ => ledger.refund(vec![(event_id, req.to_user_id, n, None)]),
        }
        answer
    }
}
