//! Tickets given back (`CancelTickets`): a confirmed hold keeps its places and seats as sold, and
//! its cancellations say which of its tickets (by index) left it, and when, for how much. The
//! places come back: a seat is available again, a general-admission place is counted free (its
//! ordinal is never sold again: later sales take new ones).
//!
//! The sold-seat backstop never loses a claim: a cancelled place's claim stays, as the cancelled
//! order's (every claim there ever was is a sale, void or not). A reserved seat sold again after
//! it was given back is claimed under a new key, `{event}/{section}/{seat}~{n}` for its n-th sale
//! after a cancellation (its "generation"), so the first sale's claim and the next never meet.
//!
//! This state is not in the core's own encoding: a checkpoint carries it after the core and its
//! sale ([`super::SectionCore::checkpoint`]), so checkpoints written before it existed decode (as
//! nothing given back).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::Rejection;
use crate::types::{HoldId, HoldStatus, OrderId, OrderView, SeatStatus, UserId};

use super::{IdemTag, SectionCore, SectionRecord};

/// One `CancelTickets` of an order, as the section keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancellation {
    /// The order's ticket indexes (0-based) given back, ascending.
    pub tickets: Vec<u32>,
    /// What is refunded for them, cents.
    pub refund_cents: u64,
    /// When.
    pub at_ms: u64,
    /// The request's idempotency tag, if any (a replay answers this cancellation again).
    pub idem: Option<IdemTag>,
    /// A transfer's: the order the tickets moved to (nothing refunded, no place freed).
    pub to_order: Option<OrderId>,
}

/// What a section keeps of tickets given back (see the module).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Returns {
    /// Each confirmed hold's cancellations, in order.
    by_hold: BTreeMap<HoldId, Vec<Cancellation>>,
    /// Reserved seats: how many times each was given back.
    seat_gen: BTreeMap<u32, u32>,
    /// Holds sold on seats given back before: each seat's generation, in the hold's seat order.
    sale_gen: BTreeMap<HoldId, Vec<u32>>,
}

/// A command to give tickets of an order back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CancelTickets {
    /// The order.
    pub order_id: OrderId,
    /// Must be its buyer.
    pub user_id: UserId,
    /// The tickets, by id (`{order_id}.{n}`).
    pub ticket_ids: Vec<String>,
    /// The request's idempotency tag, if any.
    pub idem: Option<IdemTag>,
}

/// What a cancellation did (or did before: a replay of its key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cancelled {
    /// The order as it is now (its tickets left).
    pub order: OrderView,
    /// The tickets this cancellation gave back.
    pub ticket_ids: Vec<String>,
    /// What it refunds, cents.
    pub refund_cents: u64,
    /// The provider's idempotency key of its refund: `{order_id}:cancel:{n}` (its n-th, from 1).
    pub refund_key: String,
    /// Whether this answers an earlier call with the same key (nothing was done now).
    pub replayed: bool,
}

/// A refund a cancellation owes: what the refund pass makes sure the provider has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundDue {
    /// The order.
    pub order_id: OrderId,
    /// The payment the order was paid with.
    pub payment_ref: String,
    /// The refund's idempotency key with the provider.
    pub refund_key: String,
    /// Amount, cents.
    pub amount_cents: u64,
    /// Whose money it is.
    pub user_id: UserId,
    /// When the tickets were given back.
    pub at_ms: u64,
}

/// The indexes (0-based, ascending) of `ids`, tickets of `order_id` (of `quantity` places, of
/// which `gone` were given back), or why they are not tickets it may give back.
pub(super) fn ticket_indexes(
    order_id: &OrderId,
    ids: &[String],
    quantity: u32,
    gone: &[u32],
) -> Result<Vec<u32>, Rejection> {
    if ids.is_empty() {
        return Err(Rejection::invalid("ticket_ids", "name at least one ticket"));
    }
    let mut tickets = Vec::with_capacity(ids.len());
    for id in ids {
        let index = id
            .strip_prefix(order_id.as_str())
            .and_then(|n| n.strip_prefix('.'))
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|n| (1..=quantity).contains(n))
            .map(|n| n - 1)
            .ok_or_else(|| {
                Rejection::invalid("ticket_ids", format!("{id} is not a ticket of this order"))
            })?;
        if tickets.contains(&index) {
            return Err(Rejection::invalid(
                "ticket_ids",
                format!("{id} is named twice"),
            ));
        }
        if gone.contains(&index) {
            return Err(Rejection::TicketNotActive(id.clone()));
        }
        tickets.push(index);
    }
    tickets.sort_unstable();
    Ok(tickets)
}

/// The refund key of an order's `n`-th cancellation (from 1).
fn refund_key(order_id: &OrderId, n: usize) -> String {
    format!("{order_id}:cancel:{n}")
}

impl SectionCore {
    /// Decides a cancellation: the tickets named leave the order and their places come back
    /// (the record is applied and returned for the log), or the earlier answer of the same key.
    pub fn cancel_tickets(
        &mut self,
        cmd: CancelTickets,
        now_ms: u64,
    ) -> Result<(Cancelled, Option<SectionRecord>), Rejection> {
        let (hold_id, quantity) = self.owned_order(&cmd.order_id, &cmd.user_id)?;
        if let Some(tag) = &cmd.idem
            && let Some((n, c)) = self.keyed_cancellation(&hold_id, tag)
        {
            if c.idem.as_ref() != Some(tag) || c.to_order.is_some() {
                return Err(Rejection::IdempotencyKeyReused);
            }
            let answer = self.cancelled_answer(&cmd.order_id, &hold_id, n, true);
            return Ok((answer, None));
        }
        let tickets = ticket_indexes(
            &cmd.order_id,
            &cmd.ticket_ids,
            quantity,
            &self.cancelled_of(&hold_id),
        )?;
        // Each ticket is refunded what it cost (a received order's cost its recipient nothing).
        let prices = self.ticket_prices(&hold_id);
        let record = SectionRecord::TicketsCancelled {
            hold_id: hold_id.clone(),
            refund_cents: tickets
                .iter()
                .map(|&t| prices.get(t as usize).copied().unwrap_or(0))
                .sum(),
            tickets,
            at_ms: now_ms,
            idem: cmd.idem,
        };
        self.apply(&record)
            .expect("a cancellation just decided always applies");
        let n = self.returns.by_hold.get(&hold_id).map_or(1, Vec::len) - 1;
        let answer = self.cancelled_answer(&cmd.order_id, &hold_id, n, false);
        Ok((answer, Some(record)))
    }

    fn cancelled_answer(
        &self,
        order_id: &OrderId,
        hold_id: &HoldId,
        n: usize,
        replayed: bool,
    ) -> Cancelled {
        let c = &self.returns.by_hold[hold_id][n];
        Cancelled {
            order: self.order_view(order_id).expect("the order is known"),
            ticket_ids: c
                .tickets
                .iter()
                .map(|t| format!("{order_id}.{}", t + 1))
                .collect(),
            refund_cents: c.refund_cents,
            refund_key: refund_key(order_id, n + 1),
            replayed,
        }
    }

    /// Applies a [`SectionRecord::TicketsCancelled`] (any other record: an error).
    pub(super) fn apply_cancellation(&mut self, record: &SectionRecord) -> Result<(), String> {
        let SectionRecord::TicketsCancelled {
            hold_id,
            tickets,
            refund_cents,
            at_ms,
            idem,
        } = record
        else {
            return Err("not a cancellation".into());
        };
        let cancellation = Cancellation {
            tickets: tickets.clone(),
            refund_cents: *refund_cents,
            at_ms: *at_ms,
            idem: idem.clone(),
            to_order: None,
        };
        let seats = self.take_tickets(hold_id, tickets, cancellation)?;
        self.prices.give_back(hold_id, Some(tickets));
        for s in seats {
            self.set_seat(s, SeatStatus::Available);
        }
        let n = u32::try_from(tickets.len()).map_err(|_| "too many tickets")?;
        self.sold -= n;
        self.available += n;
        Ok(())
    }

    /// Notes the generation of each seat a hold is sold on, if any was given back before (see
    /// the module): called as a confirm is applied.
    pub(super) fn note_sale_generations(&mut self, hold_id: &HoldId, seats: &[u32]) {
        let gens: Vec<u32> = seats
            .iter()
            .map(|s| self.returns.seat_gen.get(s).copied().unwrap_or(0))
            .collect();
        if gens.iter().any(|g| *g > 0) {
            self.returns.sale_gen.insert(hold_id.clone(), gens);
        }
    }

    /// The generation of the `i`-th seat of a hold's sale (0: its first sale).
    pub(super) fn sale_generation(&self, hold_id: &HoldId, i: usize) -> u32 {
        self.returns
            .sale_gen
            .get(hold_id)
            .and_then(|g| g.get(i).copied())
            .unwrap_or(0)
    }

    /// Notes that `hold_id`'s `tickets` left it (a cancellation or a transfer): checks they may,
    /// frees nothing. Answers their seats (none for general admission).
    pub(super) fn take_tickets(
        &mut self,
        hold_id: &HoldId,
        tickets: &[u32],
        cancellation: Cancellation,
    ) -> Result<Vec<u32>, String> {
        let h = self
            .holds
            .get(hold_id)
            .ok_or_else(|| format!("tickets of unknown hold {hold_id}"))?;
        if h.status != HoldStatus::Confirmed {
            return Err(format!("tickets of hold {hold_id}, which is not an order"));
        }
        let gone = self.cancelled_of(hold_id);
        if tickets.is_empty() || tickets.iter().any(|t| *t >= h.quantity || gone.contains(t)) {
            return Err(format!("tickets {tickets:?} of {hold_id} do not fit"));
        }
        let seats: Vec<u32> = tickets
            .iter()
            .filter_map(|t| h.seats.get(*t as usize).copied())
            .collect();
        for &s in &seats {
            if self.seats[s as usize] != SeatStatus::Sold {
                return Err(format!("seat {s} of {hold_id} is not sold"));
            }
        }
        for &s in &seats {
            *self.returns.seat_gen.entry(s).or_default() += 1;
        }
        self.returns
            .by_hold
            .entry(hold_id.clone())
            .or_default()
            .push(cancellation);
        Ok(seats)
    }

    /// The hold and the number of places of `order_id`, if `user_id` bought it; otherwise
    /// `ORDER_NOT_FOUND`, exactly as for an unknown id.
    pub(super) fn owned_order(
        &self,
        order_id: &OrderId,
        user_id: &UserId,
    ) -> Result<(HoldId, u32), Rejection> {
        let hold_id = self.orders.get(order_id).ok_or(Rejection::OrderNotFound)?;
        match self.holds.get(hold_id) {
            Some(h) if &h.user_id == user_id => Ok((hold_id.clone(), h.quantity)),
            _ => Err(Rejection::OrderNotFound),
        }
    }

    /// The cancellations of `hold_id` and the idempotency tag `tag` names: the position and
    /// the tag of the one made with its key, if any.
    pub(super) fn keyed_cancellation(
        &self,
        hold_id: &HoldId,
        tag: &IdemTag,
    ) -> Option<(usize, &Cancellation)> {
        self.returns
            .by_hold
            .get(hold_id)?
            .iter()
            .enumerate()
            .find(|(_, c)| c.idem.as_ref().is_some_and(|t| t.key == tag.key))
    }

    /// The ticket indexes of a hold given back so far.
    pub(super) fn cancelled_of(&self, hold_id: &HoldId) -> Vec<u32> {
        self.returns
            .by_hold
            .get(hold_id)
            .into_iter()
            .flatten()
            .flat_map(|c| c.tickets.iter().copied())
            .collect()
    }

    /// What was refunded for a hold's cancellations, cents.
    pub(super) fn refunded_of(&self, hold_id: &HoldId) -> u64 {
        self.returns
            .by_hold
            .get(hold_id)
            .into_iter()
            .flatten()
            .map(|c| c.refund_cents)
            .sum()
    }

    /// Every refund the section's cancellations owe (the refund pass checks the provider has
    /// each, reconciliation that each was made).
    pub fn refunds_due(&self) -> Vec<RefundDue> {
        let mut due = Vec::new();
        for (hold_id, cancellations) in &self.returns.by_hold {
            let Some(h) = self.holds.get(hold_id) else {
                continue;
            };
            let Some(o) = &h.order else {
                continue;
            };
            for (n, c) in cancellations.iter().enumerate() {
                if c.to_order.is_some() || c.refund_cents == 0 {
                    continue; // a transfer, or nothing paid for: nothing is refunded
                }
                due.push(RefundDue {
                    order_id: o.order_id.clone(),
                    payment_ref: o.payment_ref.clone(),
                    refund_key: refund_key(&o.order_id, n + 1),
                    amount_cents: c.refund_cents,
                    user_id: h.user_id.clone(),
                    at_ms: c.at_ms,
                });
            }
        }
        due
    }

    /// The change stream's record of a [`SectionRecord::TicketsCancelled`], with its time.
    pub fn cancellation_change(
        &self,
        record: &SectionRecord,
    ) -> Option<(u64, crate::changes::ChangeKind)> {
        let SectionRecord::TicketsCancelled {
            hold_id,
            tickets,
            at_ms,
            ..
        } = record
        else {
            return None;
        };
        let at_ms = *at_ms;
        let order_id = self.holds.get(hold_id)?.order.as_ref()?.order_id.clone();
        let n = self
            .returns
            .by_hold
            .get(hold_id)?
            .iter()
            .position(|c| &c.tickets == tickets && c.at_ms == at_ms)?;
        let answer = self.cancelled_answer(&order_id, hold_id, n, false);
        let kind = crate::changes::ChangeKind::TicketsCancelled {
            order: answer.order,
            ticket_ids: answer.ticket_ids,
            refund_cents: answer.refund_cents,
            refund_key: answer.refund_key,
        };
        Some((at_ms, kind))
    }

    /// The ids of every ticket of this section given back, ascending: its part of the event's
    /// revocation list.
    pub fn revoked_ticket_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .returns
            .by_hold
            .iter()
            .filter_map(|(hold_id, cs)| {
                let order_id = &self.holds.get(hold_id)?.order.as_ref()?.order_id;
                Some(cs.iter().flat_map(move |c| {
                    c.tickets
                        .iter()
                        .map(move |t| format!("{order_id}.{}", t + 1))
                }))
            })
            .flatten()
            .collect();
        ids.sort();
        ids
    }

    /// The tickets given back, for checkpoints.
    pub(super) fn returns(&self) -> &Returns {
        &self.returns
    }
}
