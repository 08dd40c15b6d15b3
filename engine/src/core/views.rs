//! What a section shows of itself: its counts, holds, orders and snapshot, and the check of
//! its invariants.

use crate::hash::HashMap;

use crate::types::{
    EventId, HoldId, HoldStatus, HoldView, OrderCursor, OrderId, OrderView, SeatStatus,
    SectionSnapshot, SectionSpec, TicketView, UserId,
};

use super::{HoldEntry, IdemTag, SectionCore};

impl SectionCore {
    /// (holds remembered, of which released or expired): live state plus the window's.
    pub fn remembered(&self) -> (usize, usize) {
        (self.holds.len(), self.ended.len())
    }

    /// The section's spec.
    pub fn spec(&self) -> &SectionSpec {
        &self.spec
    }

    /// The event this section belongs to.
    pub fn event_id(&self) -> &EventId {
        &self.event_id
    }

    /// (capacity, available, held, sold).
    pub fn counts(&self) -> (u32, u32, u32, u32) {
        (self.capacity, self.available, self.held, self.sold)
    }

    /// Invariant 1: `available + held + sold == capacity`. O(1), so it runs after every change.
    pub(super) fn assert_counts(&self) {
        assert_eq!(
            u64::from(self.available) + u64::from(self.held) + u64::from(self.sold),
            u64::from(self.capacity),
            "section {} of {}: available + held + sold != capacity",
            self.spec.section_id,
            self.event_id
        );
    }

    /// Full consistency check (O(seats + holds)), for tests and recovery: counters, per-row
    /// counts, seat statuses against holds, the deadline index against active holds.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.assert_counts();
        let mut held = 0u32;
        let mut sold = 0u32;
        let mut owner: HashMap<u32, &HoldId> = HashMap::default();
        for (id, h) in &self.holds {
            let counted = match h.status {
                HoldStatus::Held => {
                    held += h.quantity;
                    if !self.deadlines.contains(&(h.expires_at_ms, id.clone())) {
                        return Err(format!("active hold {id} missing from deadline index"));
                    }
                    Some(SeatStatus::Held)
                }
                HoldStatus::Confirmed => {
                    sold += h.quantity;
                    Some(SeatStatus::Sold)
                }
                _ => None,
            };
            let gone = self.cancelled_of(id); // tickets given back: no longer the order's places
            if let Some(want) = counted {
                sold -= u32::try_from(gone.len()).unwrap_or(u32::MAX);
                for (i, &s) in h.seats.iter().enumerate() {
                    if gone.contains(&(i as u32)) {
                        continue;
                    }
                    if let Some(other) = owner.insert(s, id) {
                        return Err(format!("seat {s} in holds {other} and {id}"));
                    }
                    if self.seats[s as usize] != want {
                        return Err(format!(
                            "seat {s} of hold {id} is {:?}",
                            self.seats[s as usize]
                        ));
                    }
                }
            }
        }
        for w in &self.withdrawn {
            sold += 1;
            if self.is_reserved() {
                if self.seats[w.place as usize] != SeatStatus::Sold {
                    return Err(format!("withdrawn seat {} is not sold", w.place));
                }
                if owner.contains_key(&w.place) {
                    return Err(format!("withdrawn seat {} is in a hold", w.place));
                }
            }
        }
        let owned = owner.len()
            + if self.is_reserved() {
                self.withdrawn.len()
            } else {
                0
            };
        if held != self.held || sold != self.sold {
            return Err(format!(
                "holds say held {held} sold {sold}, counters say {} {}",
                self.held, self.sold
            ));
        }
        self.check_indexes()?;
        self.check_prices()?;
        if self.is_reserved() {
            self.check_seats(owned)?;
        }
        Ok(())
    }

    /// The deadline index has exactly the active holds, the index of ended holds to forget
    /// exactly the released and expired ones.
    fn check_indexes(&self) -> Result<(), String> {
        if self.deadlines.len()
            != self
                .holds
                .values()
                .filter(|h| h.status == HoldStatus::Held)
                .count()
        {
            return Err("deadline index has ended holds".into());
        }
        let ended = self
            .holds
            .values()
            .filter(|h| matches!(h.status, HoldStatus::Released | HoldStatus::Expired))
            .count();
        let indexed_ended = self.ended.keys().all(|id| {
            self.holds
                .get(id)
                .is_some_and(|h| matches!(h.status, HoldStatus::Released | HoldStatus::Expired))
        });
        if ended != self.ended.len() || !indexed_ended {
            return Err(format!(
                "{ended} ended holds but {} in the index of holds to forget",
                self.ended.len()
            ));
        }
        Ok(())
    }

    /// Seats agree with the holds (`owned` seats belong to an active or confirmed hold) and
    /// every row's free count is right.
    pub(super) fn check_seats(&self, owned: usize) -> Result<(), String> {
        let busy = self
            .seats
            .iter()
            .filter(|s| **s != SeatStatus::Available)
            .count();
        if busy != owned {
            return Err(format!("{busy} seats busy but {owned} owned by holds"));
        }
        for r in &self.rows {
            let free = self.seats[r.start as usize..(r.start + r.len) as usize]
                .iter()
                .filter(|s| **s == SeatStatus::Available)
                .count();
            if free != r.available as usize {
                return Err(format!("row {} count is off", r.label));
            }
        }
        Ok(())
    }

    pub(super) fn sold_keys(&self, hold_id: &HoldId) -> Vec<String> {
        match self.holds.get(hold_id) {
            Some(h) => self.sold_keys_of(hold_id, h),
            None => Vec::new(),
        }
    }

    /// [`SectionCore::sold_keys`] of a hold already found.
    fn sold_keys_of(&self, hold_id: &HoldId, h: &HoldEntry) -> Vec<String> {
        let prefix = format!("{}/{}", self.event_id, self.spec.section_id);
        if self.is_reserved() {
            h.seats
                .iter()
                .enumerate()
                .map(|(i, &s)| match self.sale_generation(hold_id, i) {
                    0 => format!("{prefix}/{}", self.seat_id(s)),
                    n => format!("{prefix}/{}~{n}", self.seat_id(s)),
                })
                .collect()
        } else {
            let first = h.order.as_ref().map_or(0, |o| o.first_place);
            (first..first + h.quantity)
                .map(|n| format!("{prefix}/#{n}"))
                .collect()
        }
    }

    /// Backstop keys of every confirmed hold and withdrawn place (recovery checks the store
    /// against them).
    pub fn all_sold_keys(&self) -> Vec<(String, HoldId)> {
        let mut out: Vec<(String, HoldId)> = self
            .withdrawn
            .iter()
            .map(|w| (w.key.clone(), HoldId::from(w.holder.as_str())))
            .collect();
        for (id, h) in &self.holds {
            if h.status == HoldStatus::Confirmed {
                out.extend(
                    self.sold_keys_of(id, h)
                        .into_iter()
                        .map(|k| (k, id.clone())),
                );
            }
        }
        out
    }

    /// A hold as the API shows it.
    pub fn hold_view(&self, hold_id: &HoldId) -> Option<HoldView> {
        Some(self.hold_view_of(hold_id, self.holds.get(hold_id)?))
    }

    /// [`SectionCore::hold_view`] of a hold already found.
    fn hold_view_of(&self, hold_id: &HoldId, h: &HoldEntry) -> HoldView {
        HoldView {
            hold_id: hold_id.clone(),
            event_id: self.event_id.clone(),
            user_id: h.user_id.clone(),
            section_id: self.spec.section_id.clone(),
            seat_ids: h.seats.iter().map(|&s| self.seat_id(s)).collect(),
            quantity: h.quantity,
            status: h.status,
            placed_at_ms: h.placed_at_ms,
            expires_at_ms: h.expires_at_ms,
            place_prices_cents: self.place_prices(hold_id, h.quantity),
        }
    }

    /// An order as the API shows it.
    pub fn order_view(&self, order_id: &OrderId) -> Option<OrderView> {
        self.order_view_of(order_id, false)
    }

    /// An order as its confirm answered it (every ticket, nothing refunded): what a replay of
    /// the confirm's key answers, whatever was given back since.
    pub fn order_as_confirmed(&self, order_id: &OrderId) -> Option<OrderView> {
        self.order_view_of(order_id, true)
    }

    fn order_view_of(&self, order_id: &OrderId, as_confirmed: bool) -> Option<OrderView> {
        let hold_id = self.orders.get(order_id)?;
        self.order_view_with(order_id, hold_id, self.holds.get(hold_id)?, as_confirmed)
    }

    /// [`SectionCore::order_view_of`] with its hold already found.
    fn order_view_with(
        &self,
        order_id: &OrderId,
        hold_id: &HoldId,
        h: &HoldEntry,
        as_confirmed: bool,
    ) -> Option<OrderView> {
        let o = h.order.as_ref()?;
        let gone = if as_confirmed {
            Vec::new()
        } else {
            self.cancelled_of(hold_id)
        };
        let prices = self.ticket_prices_of(hold_id, h);
        let ticket = |i: u32| TicketView {
            ticket_id: format!("{order_id}.{}", i + 1),
            section_id: self.spec.section_id.clone(),
            seat_id: h.seats.get(i as usize).map(|&s| self.seat_id(s)),
            price_cents: prices.get(i as usize).copied().unwrap_or(0),
        };
        let tickets = (0..h.quantity)
            .filter(|i| !gone.contains(i))
            .map(ticket)
            .collect();
        let transferred_from = o
            .payment_ref
            .strip_prefix(super::TRANSFER_PREFIX)
            .map(OrderId::from);
        let mut cancelled = gone;
        cancelled.sort_unstable();
        Some(OrderView {
            order_id: order_id.clone(),
            hold_id: hold_id.clone(),
            event_id: self.event_id.clone(),
            user_id: h.user_id.clone(),
            tickets,
            amount_cents: prices.iter().sum(),
            payment_ref: o.payment_ref.clone(),
            created_at_ms: o.created_at_ms,
            refunded_cents: if as_confirmed {
                0
            } else {
                self.refunded_of(hold_id)
            },
            cancelled_ticket_ids: cancelled.into_iter().map(|i| ticket(i).ticket_id).collect(),
            transferred_from,
        })
    }

    /// Every order of the section.
    pub fn orders(&self) -> Vec<OrderView> {
        self.orders
            .keys()
            .filter_map(|id| self.order_view(id))
            .collect()
    }

    /// `user`'s orders in this section, newest first (by creation time, then order id), those
    /// before `before` only (exclusive) if given, at most `limit`.
    pub fn orders_of(
        &self,
        user: &UserId,
        before: Option<&OrderCursor>,
        limit: usize,
    ) -> Vec<OrderView> {
        let Some(mine) = self.by_user.get(user) else {
            return Vec::new();
        };
        let newest_first: Box<dyn Iterator<Item = &(u64, OrderId)>> = match before {
            Some(c) => Box::new(mine.range(..(c.created_at_ms, c.order_id.clone())).rev()),
            None => Box::new(mine.iter().rev()),
        };
        newest_first
            .take(limit)
            .filter_map(|(_, id)| self.order_view(id))
            .collect()
    }

    /// The access code a hold was placed under (its number), if any.
    pub fn code_of(&self, hold_id: &HoldId) -> Option<u32> {
        self.codes.get(hold_id).copied()
    }

    /// The uses of each access code in this section: (code, places) for every held or
    /// confirmed hold placed under one (a confirmed hold keeps its uses: see [`crate::access`]).
    pub fn code_uses(&self) -> Vec<(u32, u32)> {
        self.codes
            .iter()
            .filter_map(|(hold_id, code)| {
                let h = self.holds.get(hold_id)?;
                matches!(h.status, HoldStatus::Held | HoldStatus::Confirmed)
                    .then_some((*code, h.quantity))
            })
            .collect()
    }

    /// Every hold with its idempotency tags, for rebuilding the ledger on recovery:
    /// (view as it is now, the places it holds or owns now (a confirmed hold's tickets given
    /// back are not), hold tag, confirm tag and the order as its confirm answered it).
    #[allow(clippy::type_complexity)]
    pub fn holds_for_ledger(
        &self,
    ) -> impl Iterator<
        Item = (
            HoldView,
            u32,
            Option<&IdemTag>,
            Option<(&IdemTag, OrderView)>,
        ),
    > + '_ {
        // Each view made from the hold found by the walk (no lookup by id again).
        self.holds.iter().map(move |(id, h)| {
            let view = self.hold_view_of(id, h);
            let gone = u32::try_from(self.cancelled_of(id).len()).unwrap_or(u32::MAX);
            let confirm = h.order.as_ref().and_then(|o| {
                let tag = o.idem.as_ref()?;
                Some((tag, self.order_view_with(&o.order_id, id, h, true)?))
            });
            (view, h.quantity - gone, h.idem.as_ref(), confirm)
        })
    }

    /// The availability snapshot the actor publishes, showing every change up to the stream's
    /// record `version`.
    pub fn snapshot(&self, version: u64) -> SectionSnapshot {
        let (price_tiers, next_price_cents) = self.price_status();
        SectionSnapshot {
            section_id: self.spec.section_id.clone(),
            capacity: self.capacity,
            available: self.available,
            held: self.held,
            sold: self.sold,
            seats: self.seats.clone(),
            version,
            changed_at_ms: 0,
            price_tiers,
            next_price_cents,
        }
    }
}
