//! `SectionCore`: the pure state machine of one section. No IO, no clock, no randomness: `now`
//! and new ids are passed in, and every change is made by applying a [`SectionRecord`], the same
//! function recovery uses to replay the log. What a command decided and what replay rebuilds can
//! therefore never differ.
//!
//! ## Best available (reserved sections)
//! 1. Rows are tried in the order the layout lists them (the first row is the best). The first row
//!    that has `n` adjacent free seats wins, and within it the window of `n` seats whose centre is
//!    nearest the row's centre (ties: the lower seat numbers).
//! 2. If no row has `n` adjacent free seats, the seats are spread over as few rows as possible:
//!    rows are taken in decreasing number of free seats (ties: layout order) until they hold `n`;
//!    within each row the free seats nearest its centre are taken.
//! 3. If the section has fewer than `n` free seats: `SoldOut`.
//!
//! ## Retention
//! A released or expired hold is forgotten once a record the section applies is one idempotency
//! window after the hold ended (see [`crate::retention`]): `apply` does it, driven by the
//! record's own time, so replay forgets exactly what the live section forgot. Confirmed holds
//! (orders) stay.

mod cancel;
mod pricing;
mod records;
mod seats;
mod transfer;
mod views;

use crate::hash::{HashMap, HashSet};
use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::error::Rejection;
use crate::limits::{FORGET_PER_STEP_MAX, IDEMPOTENCY_WINDOW_MS_DEFAULT};
use crate::prices::Prices;
use crate::retention::ForgetIndex;
use crate::types::{
    EventId, HoldId, HoldStatus, HoldView, Layout, OrderId, SeatId, SeatStatus, SectionSpec, UserId,
};

pub use crate::limits::PLACES_PER_HOLD_MAX;
pub use cancel::{CancelTickets, Cancellation, Cancelled, RefundDue, Returns};
pub use records::{
    ConfirmHold, Confirmed, Ended, IdemTag, Pick, PlaceHold, PlacedRef, SaleChange, SectionRecord,
    SectionSale, Withdrawn,
};
pub use transfer::{TRANSFER_PREFIX, TransferTickets, Transferred};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct RowMeta {
    label: String,
    start: u32,
    len: u32,
    available: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct OrderEntry {
    order_id: OrderId,
    payment_ref: String,
    created_at_ms: u64,
    idem: Option<IdemTag>,
    /// General admission: ordinal of the first place sold by this order (for backstop keys).
    first_place: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct HoldEntry {
    user_id: UserId,
    seats: Vec<u32>,
    quantity: u32,
    placed_at_ms: u64,
    expires_at_ms: u64,
    status: HoldStatus,
    idem: Option<IdemTag>,
    order: Option<OrderEntry>,
}

/// One section's inventory: the only place its seats change. See the module docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SectionCore {
    event_id: EventId,
    spec: SectionSpec,
    rows: Vec<RowMeta>,
    row_index: HashMap<String, u32>,
    seats: Vec<SeatStatus>,
    capacity: u32,
    available: u32,
    held: u32,
    sold: u32,
    #[serde(deserialize_with = "crate::hash::presized")]
    holds: HashMap<HoldId, HoldEntry>,
    deadlines: BTreeSet<(u64, HoldId)>,
    #[serde(deserialize_with = "crate::hash::presized")]
    orders: HashMap<OrderId, HoldId>,
    /// Places withdrawn from sale (counted in `sold`).
    withdrawn: Vec<Withdrawn>,
    /// General admission: the ordinal the next sold place gets (past every withdrawn one).
    next_place: u32,
    /// Released and expired holds by the time they ended: the order they are forgotten in.
    ended: ForgetIndex<HoldId>,
    /// The idempotency window: an ended hold is forgotten this long after it ended. Set by the
    /// engine's configuration (never recorded: the same log replays under any window).
    #[serde(skip, default = "default_window_ms")]
    window_ms: u64,
    /// The sale as this section applies it. Not in the core's own encoding: a checkpoint
    /// carries it after the core ([`SectionCore::checkpoint`]), so checkpoints written before
    /// it existed still decode (as open).
    #[serde(skip)]
    sale: SectionSale,
    /// Each buyer's orders by (creation time, order id), for `ListOrders`. Derived from the
    /// holds, never encoded: a checkpoint's reader rebuilds it ([`SectionCore::from_checkpoint`]).
    #[serde(skip)]
    by_user: HashMap<UserId, BTreeSet<(u64, OrderId)>>,
    /// Tickets given back ([`cancel`]). Not in the core's own encoding: a checkpoint carries it
    /// after the sale.
    #[serde(skip)]
    returns: Returns,
    /// The access code each hold was placed under (its number), for holds that used one
    /// ([`crate::access`]). Not in the core's own encoding: a checkpoint carries it after the
    /// tickets given back. Forgotten with the hold.
    #[serde(skip)]
    codes: HashMap<HoldId, u32>,
    /// The price tiers and each hold's places' tiers ([`crate::prices`]). Not in the core's own
    /// encoding: a checkpoint carries it after the access codes.
    #[serde(skip)]
    prices: Prices,
}

fn default_window_ms() -> u64 {
    IDEMPOTENCY_WINDOW_MS_DEFAULT
}

impl SectionCore {
    /// A fresh section with every place available.
    pub fn new(event_id: EventId, spec: SectionSpec) -> SectionCore {
        let mut rows = Vec::new();
        let mut row_index = HashMap::default();
        let mut seats = Vec::new();
        if let Layout::Reserved { rows: specs } = &spec.layout {
            for (i, r) in specs.iter().enumerate() {
                let start = u32::try_from(seats.len()).expect("capacity is bounded by validation");
                rows.push(RowMeta {
                    label: r.label.clone(),
                    start,
                    len: r.seat_count,
                    available: r.seat_count,
                });
                row_index.insert(
                    r.label.clone(),
                    u32::try_from(i).expect("rows are bounded by validation"),
                );
                seats.extend(std::iter::repeat_n(
                    SeatStatus::Available,
                    r.seat_count as usize,
                ));
            }
        }
        let capacity = spec.capacity();
        let prices = Prices::new(spec.price_tiers.clone(), spec.price_cents);
        SectionCore {
            event_id,
            spec,
            rows,
            row_index,
            seats,
            capacity,
            available: capacity,
            held: 0,
            sold: 0,
            holds: HashMap::default(),
            deadlines: BTreeSet::new(),
            orders: HashMap::default(),
            withdrawn: Vec::new(),
            next_place: 0,
            ended: ForgetIndex::default(),
            window_ms: IDEMPOTENCY_WINDOW_MS_DEFAULT,
            sale: SectionSale::default(),
            by_user: HashMap::default(),
            returns: Returns::default(),
            codes: HashMap::default(),
            prices,
        }
    }

    /// What a checkpoint of the section holds: the core, then its sale, then the tickets given
    /// back, then the access codes of holds, then its prices.
    #[allow(clippy::type_complexity)]
    pub fn checkpoint(
        &self,
    ) -> (
        &SectionCore,
        &SectionSale,
        &Returns,
        &HashMap<HoldId, u32>,
        &Prices,
    ) {
        (self, &self.sale, self.returns(), &self.codes, &self.prices)
    }

    /// A section from a checkpoint's bytes ([`SectionCore::checkpoint`]; one written before
    /// the sale was part of it is an open sale).
    pub fn from_checkpoint(blob: &[u8]) -> Result<SectionCore, crate::codec::DecodeError> {
        let (mut core, sale, returns, codes, prices): (SectionCore, SectionSale, Returns, _, _) =
            crate::codec::decode_extended4(blob)?;
        core.sale = sale;
        core.returns = returns;
        core.codes = codes;
        core.set_prices(prices);
        core.by_user.reserve(core.orders.len());
        for (order_id, hold_id) in &core.orders {
            if let Some(h) = core.holds.get(hold_id)
                && let Some(o) = &h.order
            {
                core.by_user
                    .entry(h.user_id.clone())
                    .or_default()
                    .insert((o.created_at_ms, order_id.clone()));
            }
        }
        Ok(core)
    }

    /// The section's sale as it applies it.
    pub fn sale(&self) -> SectionSale {
        self.sale
    }

    /// The clock deadlines are judged by: time stands still for them while the sale is paused.
    fn deadline_clock(&self, now_ms: u64) -> u64 {
        match self.sale.paused_since_ms {
            Some(since) => now_ms.min(since),
            None => now_ms,
        }
    }

    /// Decides a sale control: the record that makes it, or `None` if the section already
    /// stands so (an ended sale is neither paused nor resumed).
    pub fn sale_change(&mut self, change: SaleChange, now_ms: u64) -> Option<SectionRecord> {
        let s = self.sale;
        let record = match change {
            SaleChange::Pause if !s.ended && s.paused_since_ms.is_none() => {
                SectionRecord::SalePaused { at_ms: now_ms }
            }
            SaleChange::Resume if s.paused_since_ms.is_some() => {
                SectionRecord::SaleResumed { at_ms: now_ms }
            }
            SaleChange::End if !s.ended => SectionRecord::SaleEnded { at_ms: now_ms },
            _ => return None,
        };
        self.apply(&record)
            .expect("a sale control just decided always applies");
        Some(record)
    }

    /// The same section, forgetting ended holds `window_ms` after they ended (at least 1 ms).
    pub fn with_window_ms(mut self, window_ms: u64) -> SectionCore {
        self.window_ms = window_ms.max(1);
        self
    }

    /// Decides a hold. On success the hold is applied and its record returned for the log.
    pub fn place_hold(
        &mut self,
        cmd: PlaceHold,
        now_ms: u64,
    ) -> Result<(HoldView, SectionRecord), Rejection> {
        if self.sale.ended {
            return Err(Rejection::SaleEnded);
        }
        if self.sale.paused_since_ms.is_some() {
            return Err(Rejection::SalePaused);
        }
        if self.holds.contains_key(&cmd.hold_id) {
            // Ids are ULIDs generated per request; a clash is a caller bug, refuse it plainly.
            return Err(Rejection::invalid("hold_id", "already used"));
        }
        let (seats, quantity) = match &cmd.pick {
            Pick::Best(q) => self.pick_best(*q)?,
            Pick::Seats(ids) => self.pick_seats(ids)?,
        };
        let (hold_id, user_id, idem) = (cmd.hold_id.clone(), cmd.user_id, cmd.idem);
        let (placed_at_ms, expires_at_ms) = (now_ms, now_ms.saturating_add(cmd.ttl_ms));
        let tiers = self.prices.pick(quantity);
        let record = match cmd.code {
            _ if !tiers.is_empty() => SectionRecord::HoldPlacedPriced {
                hold_id,
                user_id,
                seats,
                quantity,
                placed_at_ms,
                expires_at_ms,
                idem,
                code: cmd.code,
                tiers,
            },
            None => SectionRecord::HoldPlaced {
                hold_id,
                user_id,
                seats,
                quantity,
                placed_at_ms,
                expires_at_ms,
                idem,
            },
            Some(code) => SectionRecord::HoldPlacedWithCode {
                hold_id,
                user_id,
                seats,
                quantity,
                placed_at_ms,
                expires_at_ms,
                idem,
                code,
            },
        };
        self.apply(&record)
            .expect("a hold just decided always applies");
        let view = self.hold_view(&cmd.hold_id).expect("hold was just placed");
        Ok((view, record))
    }

    /// Decides a confirm. A hold past its deadline is expired on the spot (the record is
    /// returned beside the rejection), whatever the sweeper has done so far.
    pub fn confirm(
        &mut self,
        cmd: ConfirmHold,
        now_ms: u64,
    ) -> (Result<Confirmed, Rejection>, Option<SectionRecord>) {
        if let Err(e) = self.check_active(&cmd.hold_id, &cmd.user_id) {
            return (Err(e), None);
        }
        if let Some(rec) = self.expire_if_due(&cmd.hold_id, now_ms) {
            return (Err(Rejection::HoldExpired), Some(rec));
        }
        if self.orders.contains_key(&cmd.order_id) {
            return (Err(Rejection::invalid("order_id", "already used")), None);
        }
        let record = SectionRecord::HoldConfirmed {
            hold_id: cmd.hold_id.clone(),
            order_id: cmd.order_id.clone(),
            payment_ref: cmd.payment_ref,
            at_ms: now_ms,
            idem: cmd.idem,
            first_place: if self.is_reserved() {
                0
            } else {
                self.next_place
            },
        };
        self.apply(&record)
            .expect("a confirm just decided always applies");
        let order = self.order_view(&cmd.order_id).expect("order was just made");
        let sold_keys = self.sold_keys(&cmd.hold_id);
        (Ok(Confirmed { order, sold_keys }), Some(record))
    }

    /// Decides a release by the holder.
    pub fn release(
        &mut self,
        hold_id: &HoldId,
        user_id: &UserId,
        now_ms: u64,
    ) -> (Result<Ended, Rejection>, Option<SectionRecord>) {
        if let Err(e) = self.check_active(hold_id, user_id) {
            return (Err(e), None);
        }
        if let Some(rec) = self.expire_if_due(hold_id, now_ms) {
            return (Err(Rejection::HoldExpired), Some(rec));
        }
        let record = SectionRecord::HoldReleased {
            hold_id: hold_id.clone(),
            at_ms: now_ms,
        };
        self.apply(&record)
            .expect("a release just decided always applies");
        let hold = self.hold_view(hold_id).expect("hold exists");
        (Ok(Ended { hold }), Some(record))
    }

    /// Expires at most `max` holds whose deadline is at or before `now_ms`, earliest first
    /// (while the sale is paused: at or before the pause began).
    pub fn expire_due(&mut self, now_ms: u64, max: usize) -> Vec<(Ended, SectionRecord)> {
        let due_by = self.deadline_clock(now_ms);
        let mut out = Vec::new();
        while out.len() < max {
            let Some((deadline, hold_id)) = self.deadlines.first().cloned() else {
                break;
            };
            if deadline > due_by {
                break;
            }
            let record = SectionRecord::HoldExpired {
                hold_id: hold_id.clone(),
                at_ms: now_ms,
            };
            self.apply(&record)
                .expect("a due hold in the deadline index is active");
            let hold = self.hold_view(&hold_id).expect("hold exists");
            out.push((Ended { hold }, record));
        }
        out
    }

    /// Expires this one hold if it is active and due at `now_ms`.
    pub fn expire_hold_if_due(
        &mut self,
        hold_id: &HoldId,
        now_ms: u64,
    ) -> Option<(Ended, SectionRecord)> {
        let record = self.expire_if_due(hold_id, now_ms)?;
        let hold = self.hold_view(hold_id)?;
        Some((Ended { hold }, record))
    }

    /// Active holds whose deadline is at or before `now_ms`: due for expiry, not expired yet.
    pub fn holds_past_deadline(&self, now_ms: u64) -> usize {
        let due_by = self.deadline_clock(now_ms);
        self.deadlines
            .iter()
            .take_while(|(deadline, _)| *deadline <= due_by)
            .count()
    }

    /// The earliest deadline of an active hold, if any (while the sale is paused, only one
    /// that had come before the pause began: the others wait for the sale to go on).
    pub fn next_deadline_ms(&self) -> Option<u64> {
        let (d, _) = self.deadlines.first()?;
        match self.sale.paused_since_ms {
            Some(since) if *d > since => None,
            _ => Some(*d),
        }
    }

    fn check_active(&self, hold_id: &HoldId, user_id: &UserId) -> Result<(), Rejection> {
        let Some(h) = self.holds.get(hold_id) else {
            return Err(Rejection::HoldNotFound);
        };
        // Another user's hold answers as if it did not exist: ids are not to be probed.
        if &h.user_id != user_id {
            return Err(Rejection::HoldNotFound);
        }
        match h.status {
            HoldStatus::Held => Ok(()),
            HoldStatus::Expired => Err(Rejection::HoldExpired),
            HoldStatus::Confirmed | HoldStatus::Released => Err(Rejection::HoldNotActive),
        }
    }

    fn expire_if_due(&mut self, hold_id: &HoldId, now_ms: u64) -> Option<SectionRecord> {
        let h = self.holds.get(hold_id)?;
        if h.status != HoldStatus::Held || self.deadline_clock(now_ms) < h.expires_at_ms {
            return None;
        }
        let record = SectionRecord::HoldExpired {
            hold_id: hold_id.clone(),
            at_ms: now_ms,
        };
        self.apply(&record).expect("an active due hold expires");
        Some(record)
    }

    /// Applies one record: the only function that changes the section. Replay calls it too; an
    /// error means the record does not fit the state (a damaged or foreign log).
    pub fn apply(&mut self, record: &SectionRecord) -> Result<(), String> {
        match record {
            SectionRecord::HoldPlaced { .. }
            | SectionRecord::HoldPlacedWithCode { .. }
            | SectionRecord::HoldPlacedPriced { .. } => {
                self.apply_placed_record(record)?;
            }
            SectionRecord::HoldConfirmed {
                hold_id,
                order_id,
                payment_ref,
                at_ms,
                idem,
                first_place,
            } => self.apply_confirmed(
                hold_id,
                OrderEntry {
                    order_id: order_id.clone(),
                    payment_ref: payment_ref.clone(),
                    created_at_ms: *at_ms,
                    idem: idem.clone(),
                    first_place: *first_place,
                },
            )?,
            SectionRecord::HoldReleased { hold_id, at_ms } => {
                self.end_hold(hold_id, HoldStatus::Released, *at_ms)?;
            }
            SectionRecord::HoldExpired { hold_id, at_ms } => {
                self.end_hold(hold_id, HoldStatus::Expired, *at_ms)?;
            }
            SectionRecord::PlacesWithdrawn { places, .. } => self.apply_withdrawn(places)?,
            SectionRecord::TicketsCancelled { .. } => self.apply_cancellation(record)?,
            SectionRecord::TicketsTransferred { .. } => self.apply_transfer(record)?,
            SectionRecord::SalePaused { .. }
            | SectionRecord::SaleResumed { .. }
            | SectionRecord::SaleEnded { .. } => self.apply_sale(record)?,
        }
        self.assert_counts();
        self.forget_ended(record.at_ms());
        Ok(())
    }

    /// A sale control's record: a pause, a resume (the deadlines move), an end.
    fn apply_sale(&mut self, record: &SectionRecord) -> Result<(), String> {
        match record {
            SectionRecord::SalePaused { at_ms } => {
                if self.sale.ended || self.sale.paused_since_ms.is_some() {
                    return Err("a pause of a sale paused or ended".into());
                }
                self.sale.paused_since_ms = Some(*at_ms);
            }
            SectionRecord::SaleResumed { at_ms } => {
                if self.sale.paused_since_ms.is_none() {
                    return Err("a resume of a sale not paused".into());
                }
                self.end_pause(*at_ms);
            }
            SectionRecord::SaleEnded { at_ms } => {
                if self.sale.ended {
                    return Err("the end of a sale ended already".into());
                }
                self.end_pause(*at_ms);
                self.sale.ended = true;
            }
            _ => unreachable!("only a sale control's record is applied here"),
        }
        Ok(())
    }

    /// Ends a pause (if any) at `at_ms`: every active hold whose deadline was after the pause
    /// began gets the pause's length added (those due before it began stay due).
    fn end_pause(&mut self, at_ms: u64) {
        let Some(since) = self.sale.paused_since_ms.take() else {
            return;
        };
        let by = at_ms.saturating_sub(since);
        if by == 0 {
            return;
        }
        let moved: Vec<(u64, HoldId)> = self
            .deadlines
            .range((since.saturating_add(1), HoldId::from(""))..)
            .cloned()
            .collect();
        for (deadline, hold_id) in moved {
            self.deadlines.remove(&(deadline, hold_id.clone()));
            let later = deadline.saturating_add(by);
            if let Some(h) = self.holds.get_mut(&hold_id) {
                h.expires_at_ms = later;
            }
            self.deadlines.insert((later, hold_id));
        }
    }

    /// Forgets (at most [`FORGET_PER_STEP_MAX`]) released or expired holds that ended one
    /// window or more before `now_ms`. Nothing refers to them any more (see
    /// [`crate::retention`]); every record ends at most one hold, so this keeps up.
    fn forget_ended(&mut self, now_ms: u64) {
        for hold_id in self
            .ended
            .pop_due(now_ms, self.window_ms, FORGET_PER_STEP_MAX)
        {
            let gone = self.holds.remove(&hold_id);
            self.codes.remove(&hold_id);
            self.prices.forget(&hold_id);
            debug_assert!(
                gone.is_some_and(|h| matches!(
                    h.status,
                    HoldStatus::Released | HoldStatus::Expired
                )),
                "only ended holds are forgotten"
            );
        }
    }

    /// A hold's record (with or without a code) applied.
    fn apply_placed_record(&mut self, record: &SectionRecord) -> Result<(), String> {
        let p = record.as_placed().ok_or("not a hold's record")?;
        let entry = HoldEntry {
            user_id: p.user_id.clone(),
            seats: p.seats.to_vec(),
            quantity: p.quantity,
            placed_at_ms: p.placed_at_ms,
            expires_at_ms: p.expires_at_ms,
            status: HoldStatus::Held,
            idem: p.idem.cloned(),
            order: None,
        };
        if self.holds.contains_key(p.hold_id) {
            return Err(format!("hold {} placed twice", p.hold_id));
        }
        if self.prices.tiered() && p.tiers.len() != p.quantity as usize {
            return Err(format!("hold {}: tiers and quantity disagree", p.hold_id));
        }
        self.prices.take(p.hold_id, p.tiers)?;
        if let Err(e) = self.apply_placed(p.hold_id, entry) {
            self.prices.give_back(p.hold_id, None);
            self.prices.forget(p.hold_id);
            return Err(e);
        }
        if let Some(code) = p.code {
            self.codes.insert(p.hold_id.clone(), code);
        }
        Ok(())
    }

    /// A new hold takes its places (all of them free, or the record does not fit).
    fn apply_placed(&mut self, hold_id: &HoldId, hold: HoldEntry) -> Result<(), String> {
        if self.holds.contains_key(hold_id) {
            return Err(format!("hold {hold_id} placed twice"));
        }
        if self.available < hold.quantity {
            return Err(format!("hold {hold_id} takes more than is available"));
        }
        if self.is_reserved() {
            if hold.seats.len() != hold.quantity as usize {
                return Err(format!("hold {hold_id}: seats and quantity disagree"));
            }
            for &s in &hold.seats {
                if self.seats.get(s as usize) != Some(&SeatStatus::Available) {
                    return Err(format!("hold {hold_id}: seat {s} is not available"));
                }
            }
            for &s in &hold.seats {
                self.set_seat(s, SeatStatus::Held);
            }
        } else if !hold.seats.is_empty() {
            return Err(format!("hold {hold_id}: seats in general admission"));
        }
        self.available -= hold.quantity;
        self.held += hold.quantity;
        self.deadlines.insert((hold.expires_at_ms, hold_id.clone()));
        self.holds.insert(hold_id.clone(), hold);
        Ok(())
    }

    /// An active hold's places become sold, under `order`.
    fn apply_confirmed(&mut self, hold_id: &HoldId, order: OrderEntry) -> Result<(), String> {
        let h = self
            .holds
            .get_mut(hold_id)
            .ok_or_else(|| format!("confirm of unknown hold {hold_id}"))?;
        if h.status != HoldStatus::Held {
            return Err(format!("confirm of inactive hold {hold_id}"));
        }
        h.status = HoldStatus::Confirmed;
        let order_id = order.order_id.clone();
        let first_place = order.first_place;
        self.by_user
            .entry(h.user_id.clone())
            .or_default()
            .insert((order.created_at_ms, order_id.clone()));
        h.order = Some(order);
        let (q, expires, seats) = (h.quantity, h.expires_at_ms, h.seats.clone());
        self.deadlines.remove(&(expires, hold_id.clone()));
        self.note_sale_generations(hold_id, &seats);
        for s in seats {
            self.set_seat(s, SeatStatus::Sold);
        }
        self.held -= q;
        self.sold += q;
        if !self.is_reserved() {
            // Past this order's places (a replay that skipped a lost order keeps the numbers).
            self.next_place = self.next_place.max(first_place + q);
        }
        self.orders.insert(order_id, hold_id.clone());
        Ok(())
    }

    /// Free places leave the sale, sold to nobody the log knows (see
    /// [`SectionRecord::PlacesWithdrawn`]).
    fn apply_withdrawn(&mut self, places: &[Withdrawn]) -> Result<(), String> {
        let q = u32::try_from(places.len()).map_err(|_| "too many places withdrawn")?;
        if self.available < q {
            return Err(format!(
                "{q} places withdrawn, {} available",
                self.available
            ));
        }
        for w in places {
            if self.is_reserved() {
                if self.seats.get(w.place as usize) != Some(&SeatStatus::Available) {
                    return Err(format!("withdrawn seat {} is not available", w.place));
                }
                self.set_seat(w.place, SeatStatus::Sold);
            } else {
                self.next_place = self.next_place.max(w.place + 1);
            }
        }
        self.available -= q;
        self.sold += q;
        self.withdrawn.extend_from_slice(places);
        Ok(())
    }

    /// Plans taking every live hold's places out of sale (accepted damage in this section's
    /// log: any of them may have been paid for in the records that were lost): each hold is
    /// released, then its places withdrawn, claimed for it.
    pub fn plan_withdraw_live(&self, now_ms: u64) -> Vec<SectionRecord> {
        let mut live: Vec<(&HoldId, &HoldEntry)> = self
            .holds
            .iter()
            .filter(|(_, h)| h.status == HoldStatus::Held)
            .collect();
        live.sort_by(|a, b| a.0.cmp(b.0));
        let prefix = format!("{}/{}", self.event_id, self.spec.section_id);
        let mut records = Vec::new();
        let mut places = Vec::new();
        let mut next = self.next_place;
        for (id, h) in live {
            records.push(SectionRecord::HoldReleased {
                hold_id: id.clone(),
                at_ms: now_ms,
            });
            if self.is_reserved() {
                places.extend(h.seats.iter().map(|&seat| Withdrawn {
                    place: seat,
                    key: format!("{prefix}/{}", self.seat_id(seat)),
                    holder: id.to_string(),
                }));
            } else {
                places.extend((next..next + h.quantity).map(|n| Withdrawn {
                    place: n,
                    key: format!("{prefix}/#{n}"),
                    holder: id.to_string(),
                }));
                next += h.quantity;
            }
        }
        if !places.is_empty() {
            records.push(SectionRecord::PlacesWithdrawn {
                places,
                at_ms: now_ms,
            });
        }
        records
    }

    /// Plans taking the places of `claims` (backstop key, holder) out of sale: the record to
    /// apply, and the live holds to release first (a held seat a lost sale claims). Keys that
    /// are not this section's, or places already sold, are left out (returned as such).
    pub fn plan_withdrawal(
        &self,
        claims: &[(String, String)],
        now_ms: u64,
    ) -> (Vec<SectionRecord>, Vec<String>) {
        let prefix = format!("{}/{}/", self.event_id, self.spec.section_id);
        let mut records = Vec::new();
        let mut places = Vec::new();
        let mut left = Vec::new();
        let mut releasing = HashSet::default();
        let mut free = self.available;
        for (key, holder) in claims {
            let Some(place) = key.strip_prefix(&prefix) else {
                left.push(key.clone());
                continue;
            };
            let place = if self.is_reserved() {
                let Some(i) = self.seat_index(&SeatId::from(place)) else {
                    left.push(key.clone());
                    continue;
                };
                match self.seats[i as usize] {
                    SeatStatus::Available => {}
                    SeatStatus::Held => {
                        if let Some((id, h)) = self
                            .holds
                            .iter()
                            .find(|(_, h)| h.status == HoldStatus::Held && h.seats.contains(&i))
                            && releasing.insert(id.clone())
                        {
                            free += h.quantity;
                            records.push(SectionRecord::HoldReleased {
                                hold_id: id.clone(),
                                at_ms: now_ms,
                            });
                        }
                    }
                    SeatStatus::Sold => {
                        left.push(key.clone());
                        continue;
                    }
                }
                i
            } else {
                match place.strip_prefix('#').and_then(|n| n.parse::<u32>().ok()) {
                    Some(n) if free > 0 => n,
                    _ => {
                        left.push(key.clone());
                        continue;
                    }
                }
            };
            free -= 1;
            places.push(Withdrawn {
                place,
                key: key.clone(),
                holder: holder.clone(),
            });
        }
        if !places.is_empty() {
            records.push(SectionRecord::PlacesWithdrawn {
                places,
                at_ms: now_ms,
            });
        }
        (records, left)
    }

    fn end_hold(&mut self, hold_id: &HoldId, status: HoldStatus, at_ms: u64) -> Result<(), String> {
        let h = self
            .holds
            .get_mut(hold_id)
            .ok_or_else(|| format!("end of unknown hold {hold_id}"))?;
        if h.status != HoldStatus::Held {
            return Err(format!("end of inactive hold {hold_id}"));
        }
        h.status = status;
        let (q, expires, seats) = (h.quantity, h.expires_at_ms, h.seats.clone());
        self.prices.give_back(hold_id, None);
        self.deadlines.remove(&(expires, hold_id.clone()));
        for s in seats {
            self.set_seat(s, SeatStatus::Available);
        }
        self.held -= q;
        self.available += q;
        self.ended.insert(at_ms, hold_id.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{OrderCursor, RowSpec, SeatId, SectionId};

    fn reserved(rows: &[(&str, u32)]) -> SectionCore {
        SectionCore::new(
            EventId::from("e"),
            SectionSpec {
                section_id: SectionId::from("s"),
                name: "S".into(),
                price_cents: 100,
                layout: Layout::Reserved {
                    rows: rows
                        .iter()
                        .map(|(l, n)| RowSpec {
                            label: (*l).into(),
                            seat_count: *n,
                        })
                        .collect(),
                },
                price_tiers: Vec::new(),
            },
        )
    }

    fn ga(capacity: u32) -> SectionCore {
        SectionCore::new(
            EventId::from("e"),
            SectionSpec {
                section_id: SectionId::from("floor"),
                name: "Floor".into(),
                price_cents: 50,
                layout: Layout::GeneralAdmission { capacity },
                price_tiers: Vec::new(),
            },
        )
    }

    fn hold(
        core: &mut SectionCore,
        user: &str,
        pick: Pick,
        now: u64,
    ) -> Result<HoldView, Rejection> {
        let id = HoldId::generate(&EventId::from("e"), &core.spec.section_id.clone());
        core.place_hold(
            PlaceHold {
                hold_id: id,
                user_id: UserId::from(user),
                pick,
                ttl_ms: 1_000,
                idem: None,
                code: None,
            },
            now,
        )
        .map(|(v, _)| v)
    }

    fn seats(v: &HoldView) -> Vec<&str> {
        v.seat_ids.iter().map(SeatId::as_str).collect()
    }

    #[test]
    fn best_available_takes_centre_of_first_row() {
        let mut c = reserved(&[("A", 10), ("B", 10)]);
        let v = hold(&mut c, "u", Pick::Best(2), 0).unwrap();
        assert_eq!(seats(&v), ["s:A:5", "s:A:6"]);
        let v = hold(&mut c, "u", Pick::Best(3), 0).unwrap();
        // Windows 2-4 (centre 3) and 7-9 (centre 8) are both 2.5 from the row centre 5.5:
        // the tie goes to the lower seats.
        assert_eq!(seats(&v), ["s:A:2", "s:A:3", "s:A:4"]);
        let v = hold(&mut c, "u", Pick::Best(4), 0).unwrap();
        assert_eq!(seats(&v), ["s:A:7", "s:A:8", "s:A:9", "s:A:10"]);
        // Row A has seat 1 left; 2 adjacent must come from row B.
        let v = hold(&mut c, "u", Pick::Best(2), 0).unwrap();
        assert_eq!(seats(&v), ["s:B:5", "s:B:6"]);
        c.check_invariants().unwrap();
    }

    #[test]
    fn best_available_spreads_over_fewest_rows_when_no_row_has_a_block() {
        let mut c = reserved(&[("A", 3), ("B", 3), ("C", 3)]);
        // Leave A with seats 1 and 3, B with 1 and 3, C with 1, 3 free: no row has 3 adjacent.
        for s in ["s:A:2", "s:B:2", "s:C:2"] {
            hold(&mut c, "x", Pick::Seats(vec![SeatId::from(s)]), 0).unwrap();
        }
        let v = hold(&mut c, "u", Pick::Best(3), 0).unwrap();
        assert_eq!(seats(&v), ["s:A:1", "s:A:3", "s:B:1"]);
        assert_eq!(hold(&mut c, "u", Pick::Best(4), 0), Err(Rejection::SoldOut));
        c.check_invariants().unwrap();
    }

    #[test]
    fn exact_seats_are_all_or_nothing() {
        let mut c = reserved(&[("A", 4)]);
        hold(&mut c, "x", Pick::Seats(vec![SeatId::from("s:A:2")]), 0).unwrap();
        let before = c.counts();
        let r = hold(
            &mut c,
            "u",
            Pick::Seats(vec![SeatId::from("s:A:1"), SeatId::from("s:A:2")]),
            0,
        );
        assert_eq!(r, Err(Rejection::SeatUnavailable(SeatId::from("s:A:2"))));
        assert_eq!(c.counts(), before, "nothing changed");
        let r = hold(&mut c, "u", Pick::Seats(vec![SeatId::from("s:A:9")]), 0);
        assert_eq!(r, Err(Rejection::SeatNotFound(SeatId::from("s:A:9"))));
        let r = hold(&mut c, "u", Pick::Seats(vec![SeatId::from("t:A:1")]), 0);
        assert_eq!(r, Err(Rejection::SeatNotFound(SeatId::from("t:A:1"))));
        let r = hold(
            &mut c,
            "u",
            Pick::Seats(vec![SeatId::from("s:A:1"), SeatId::from("s:A:1")]),
            0,
        );
        assert_eq!(r.unwrap_err().field(), Some("seat_ids"));
        assert_eq!(c.counts(), before, "nothing changed");
    }

    #[test]
    fn general_admission_ordinals_are_recorded_so_a_replay_that_lost_an_order_keeps_them() {
        let mut live = ga(10);
        let mut log = Vec::new();
        let mut keys = Vec::new();
        for (user, q) in [("a", 2), ("b", 3)] {
            let id = HoldId::generate(&EventId::from("e"), &SectionId::from("floor"));
            let (_, placed) = live
                .place_hold(
                    PlaceHold {
                        hold_id: id.clone(),
                        user_id: UserId::from(user),
                        pick: Pick::Best(q),
                        ttl_ms: 1_000,
                        idem: None,
                        code: None,
                    },
                    0,
                )
                .unwrap();
            log.push(placed);
            let (r, confirmed) = live.confirm(
                ConfirmHold {
                    hold_id: id,
                    user_id: UserId::from(user),
                    order_id: OrderId::generate(&EventId::from("e"), &SectionId::from("floor")),
                    payment_ref: "tok_ok".into(),
                    idem: None,
                },
                1,
            );
            keys.push(r.unwrap().sold_keys);
            log.push(confirmed.unwrap());
        }
        assert_eq!(keys[1], ["e/floor/#2", "e/floor/#3", "e/floor/#4"]);
        // A replay that lost a's confirm (accepted damage) still numbers b's places #2..#4,
        // and the next sale starts after them.
        let mut replayed = ga(10);
        for (i, r) in log.iter().enumerate() {
            if i != 1 {
                replayed.apply(r).unwrap();
            }
        }
        let b_keys: Vec<String> = replayed
            .all_sold_keys()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(b_keys, keys[1]);
        assert_eq!(replayed.next_place, 5);
    }

    #[test]
    fn general_admission_counts_and_confirm_expire_release() {
        let mut c = ga(5);
        let a = hold(&mut c, "a", Pick::Best(3), 0).unwrap();
        assert_eq!(hold(&mut c, "b", Pick::Best(3), 0), Err(Rejection::SoldOut));
        let b = hold(&mut c, "b", Pick::Best(2), 10).unwrap();
        assert_eq!(c.counts(), (5, 0, 5, 0));
        let (r, rec) = c.confirm(
            ConfirmHold {
                hold_id: a.hold_id.clone(),
                user_id: UserId::from("a"),
                order_id: OrderId::generate(&EventId::from("e"), &SectionId::from("floor")),
                payment_ref: "tok_ok".into(),
                idem: None,
            },
            999,
        );
        let confirmed = r.unwrap();
        assert!(rec.is_some());
        assert_eq!(confirmed.order.amount_cents, 150);
        assert_eq!(confirmed.order.tickets.len(), 3);
        assert_eq!(
            confirmed.sold_keys,
            ["e/floor/#0", "e/floor/#1", "e/floor/#2"]
        );
        assert_eq!(c.counts(), (5, 0, 2, 3));
        // b's deadline is 1010: not due at 1009, due at 1010.
        assert!(c.expire_due(1009, 10).is_empty());
        let ended = c.expire_due(1010, 10);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].0.hold.hold_id, b.hold_id);
        assert_eq!(c.counts(), (5, 2, 0, 3));
        let (r, rec) = c.release(&b.hold_id, &UserId::from("b"), 1011);
        assert_eq!(r.unwrap_err(), Rejection::HoldExpired);
        assert!(rec.is_none());
        let (r, _) = c.release(&a.hold_id, &UserId::from("a"), 1011);
        assert_eq!(r.unwrap_err(), Rejection::HoldNotActive);
        c.check_invariants().unwrap();
    }

    #[test]
    fn confirm_checks_the_deadline_itself() {
        let mut c = ga(5);
        let a = hold(&mut c, "a", Pick::Best(1), 0).unwrap();
        let b = hold(&mut c, "b", Pick::Best(1), 0).unwrap();
        let confirm = |c: &mut SectionCore, h: &HoldView, user: &str, now| {
            c.confirm(
                ConfirmHold {
                    hold_id: h.hold_id.clone(),
                    user_id: UserId::from(user),
                    order_id: OrderId::generate(&EventId::from("e"), &SectionId::from("floor")),
                    payment_ref: "p".into(),
                    idem: None,
                },
                now,
            )
        };
        assert!(confirm(&mut c, &a, "a", 999).0.is_ok(), "deadline - 1 ms");
        assert_eq!(
            confirm(&mut c, &b, "a", 1001).0.unwrap_err(),
            Rejection::HoldNotFound
        );
        let (r, rec) = confirm(&mut c, &b, "b", 1001);
        assert_eq!(r.unwrap_err(), Rejection::HoldExpired, "deadline + 1 ms");
        assert!(matches!(rec, Some(SectionRecord::HoldExpired { .. })));
        assert_eq!(c.counts(), (5, 4, 0, 1));
        c.check_invariants().unwrap();
    }

    /// A pause refuses new holds and stops every deadline after its start; the resume adds the
    /// pause's length to them; an end refuses holds for good. A checkpoint carries the pause.
    #[test]
    fn a_pause_stops_the_deadlines_and_the_resume_extends_them() {
        let mut c = ga(10);
        let a = hold(&mut c, "a", Pick::Best(1), 0).unwrap(); // due at 1000
        hold(&mut c, "e", Pick::Best(1), 0).unwrap(); // due at 1000
        let b = hold(&mut c, "b", Pick::Best(1), 500).unwrap(); // due at 1500
        let paused = c.sale_change(SaleChange::Pause, 800);
        assert!(matches!(
            paused,
            Some(SectionRecord::SalePaused { at_ms: 800 })
        ));
        assert_eq!(
            c.sale_change(SaleChange::Pause, 900),
            None,
            "paused already"
        );
        assert_eq!(
            hold(&mut c, "c", Pick::Best(1), 900).unwrap_err(),
            Rejection::SalePaused
        );
        assert_eq!(c.next_deadline_ms(), None, "no deadline comes while paused");
        assert!(c.expire_due(60_000, 100).is_empty(), "time stands still");
        assert_eq!(c.holds_past_deadline(60_000), 0);
        // A paused hold past its old deadline still confirms.
        assert!(confirm_as(&mut c, &a, 3_000).is_ok());
        let resumed = c.sale_change(SaleChange::Resume, 3_800);
        assert!(matches!(
            resumed,
            Some(SectionRecord::SaleResumed { at_ms: 3_800 })
        ));
        // b was due at 1500, after the pause began at 800: it moves by 3000 ms.
        assert_eq!(c.hold_view(&b.hold_id).unwrap().expires_at_ms, 4_500);
        assert_eq!(c.next_deadline_ms(), Some(4_000), "e's deadline moved too");
        assert_eq!(
            c.expire_due(4_499, 100).len(),
            1,
            "only e (due 1000 + 3000)"
        );
        assert_eq!(
            c.expire_due(4_500, 100).len(),
            1,
            "then b, on its new deadline"
        );
        // The end: nothing more is held, and nothing pauses it.
        let ended = c.sale_change(SaleChange::End, 5_000);
        assert!(matches!(
            ended,
            Some(SectionRecord::SaleEnded { at_ms: 5_000 })
        ));
        assert_eq!(
            hold(&mut c, "d", Pick::Best(1), 5_001).unwrap_err(),
            Rejection::SaleEnded
        );
        assert_eq!(c.sale_change(SaleChange::Pause, 5_002), None);
        assert_eq!(c.sale_change(SaleChange::End, 5_002), None);
        assert!(c.sale().ended);
        c.check_invariants().unwrap();
        // A checkpoint taken while paused carries the pause, and replaying the records from a
        // fresh section gives the same section; an older checkpoint (the core alone) decodes
        // as an open sale.
        let mut p = ga(3);
        let (_, placed) = p
            .place_hold(
                PlaceHold {
                    hold_id: HoldId::generate(&EventId::from("e"), &SectionId::from("floor")),
                    user_id: UserId::from("a"),
                    pick: Pick::Best(1),
                    ttl_ms: 1_000,
                    idem: None,
                    code: None,
                },
                0,
            )
            .unwrap();
        let pause = p.sale_change(SaleChange::Pause, 10).unwrap();
        let blob = crate::codec::encode(&p.checkpoint());
        assert_eq!(SectionCore::from_checkpoint(&blob).unwrap(), p);
        let mut replayed = ga(3);
        replayed.apply(&placed).unwrap();
        replayed.apply(&pause).unwrap();
        assert_eq!(replayed, p);
        assert!(
            replayed.apply(&pause).is_err(),
            "a second pause does not fit"
        );
        let old = crate::codec::encode(&p);
        let open = SectionCore::from_checkpoint(&old).unwrap();
        assert_eq!(open.sale(), SectionSale::default());
    }

    fn confirm_as(c: &mut SectionCore, h: &HoldView, now: u64) -> Result<Confirmed, Rejection> {
        let order_id = OrderId::generate(&EventId::from("e"), &c.spec.section_id.clone());
        c.confirm(
            ConfirmHold {
                hold_id: h.hold_id.clone(),
                user_id: h.user_id.clone(),
                order_id,
                payment_ref: "p".into(),
                idem: None,
            },
            now,
        )
        .0
    }

    /// Holds placed under access codes: each records its code, the live ones count (held or
    /// confirmed, not released or expired), and replaying the log or reading a checkpoint
    /// (or a checkpoint written before codes existed) gives the same counts.
    #[test]
    fn holds_under_a_code_count_for_it_through_replay_and_checkpoints() {
        let mut c = ga(20);
        let mut log = Vec::new();
        let place = |c: &mut SectionCore, q: u32, code: Option<u32>, log: &mut Vec<_>| {
            let (v, r) = c
                .place_hold(
                    PlaceHold {
                        hold_id: HoldId::generate(&EventId::from("e"), &SectionId::from("floor")),
                        user_id: UserId::from("u"),
                        pick: Pick::Best(q),
                        ttl_ms: 1_000,
                        idem: None,
                        code,
                    },
                    10,
                )
                .unwrap();
            assert_eq!(r.as_placed().map(|p| p.code), Some(code));
            log.push(r);
            v
        };
        let a = place(&mut c, 2, Some(0), &mut log);
        let b = place(&mut c, 1, Some(0), &mut log);
        let d = place(&mut c, 3, Some(1), &mut log);
        let plain = place(&mut c, 1, None, &mut log);
        let sorted = |c: &SectionCore| {
            let mut by_code = std::collections::BTreeMap::new();
            for (code, n) in c.code_uses() {
                *by_code.entry(code).or_insert(0) += n;
            }
            by_code.into_iter().collect::<Vec<_>>()
        };
        assert_eq!(sorted(&c), [(0, 3), (1, 3)]);
        assert_eq!(
            (c.code_of(&a.hold_id), c.code_of(&plain.hold_id)),
            (Some(0), None)
        );
        // A release gives its uses back; a confirmed hold keeps them; an expiry gives them back.
        let (ended, r) = c.release(&b.hold_id, &b.user_id, 20);
        ended.unwrap();
        log.push(r.unwrap());
        let (order, r) = c.confirm(
            ConfirmHold {
                hold_id: d.hold_id.clone(),
                user_id: d.user_id.clone(),
                order_id: OrderId::generate(&EventId::from("e"), &SectionId::from("floor")),
                payment_ref: "p".into(),
                idem: None,
            },
            20,
        );
        order.unwrap();
        log.push(r.unwrap());
        assert_eq!(sorted(&c), [(0, 2), (1, 3)]);
        let checkpoint = crate::codec::encode(&c.checkpoint());
        log.extend(c.expire_due(2_000, 100).into_iter().map(|(_, r)| r));
        assert_eq!(
            sorted(&c),
            [(1, 3)],
            "a's hold expired: only the order counts"
        );
        // The log replayed, and the checkpoint read back, count the same.
        let mut replayed = ga(20);
        for r in &log {
            replayed.apply(r).unwrap();
        }
        assert_eq!(sorted(&replayed), sorted(&c));
        let read = SectionCore::from_checkpoint(&checkpoint).unwrap();
        assert_eq!(sorted(&read), [(0, 2), (1, 3)]);
        assert_eq!(read.code_of(&a.hold_id), Some(0));
        // A checkpoint written before codes existed reads with none.
        let old = crate::codec::encode(&(&c, &c.sale, c.returns()));
        assert!(
            SectionCore::from_checkpoint(&old)
                .unwrap()
                .code_uses()
                .is_empty()
        );
    }

    #[test]
    fn tickets_given_back_free_their_places_and_a_seat_sold_again_is_claimed_anew() {
        let mut c = reserved(&[("A", 4)]);
        let mut log = Vec::new();
        let place =
            |c: &mut SectionCore, log: &mut Vec<SectionRecord>, user: &str, ids: &[&str]| {
                let (v, r) = c
                    .place_hold(
                        PlaceHold {
                            hold_id: HoldId::generate(&EventId::from("e"), &SectionId::from("s")),
                            user_id: UserId::from(user),
                            pick: Pick::Seats(ids.iter().map(|s| SeatId::from(*s)).collect()),
                            ttl_ms: 1_000,
                            idem: None,
                            code: None,
                        },
                        10,
                    )
                    .unwrap();
                log.push(r);
                let (confirmed, r) = c.confirm(
                    ConfirmHold {
                        hold_id: v.hold_id.clone(),
                        user_id: v.user_id.clone(),
                        order_id: OrderId::generate(&EventId::from("e"), &SectionId::from("s")),
                        payment_ref: "p".into(),
                        idem: None,
                    },
                    20,
                );
                log.push(r.unwrap());
                confirmed.unwrap()
            };
        let ann = place(&mut c, &mut log, "ann", &["s:A:1", "s:A:2", "s:A:3"]);
        let o = ann.order.order_id.clone();
        let cancel = |tickets: &[&str], user: &str, key: Option<u64>| CancelTickets {
            order_id: o.clone(),
            user_id: UserId::from(user),
            ticket_ids: tickets.iter().map(|t| format!("{o}.{t}")).collect(),
            idem: key.map(|f| IdemTag {
                key: "k1".into(),
                fingerprint: f,
            }),
        };
        // Refusals change nothing.
        let before = c.clone();
        for (cmd, want) in [
            (cancel(&["2"], "bob", None), Rejection::OrderNotFound),
            (
                cancel(&[], "ann", None),
                Rejection::invalid("ticket_ids", "name at least one ticket"),
            ),
            (
                cancel(&["9"], "ann", None),
                Rejection::invalid("ticket_ids", format!("{o}.9 is not a ticket of this order")),
            ),
            (
                cancel(&["2", "2"], "ann", None),
                Rejection::invalid("ticket_ids", format!("{o}.2 is named twice")),
            ),
        ] {
            assert_eq!(c.cancel_tickets(cmd, 30).unwrap_err(), want);
            assert_eq!(c, before);
        }
        // Ticket 2 (seat A:2) given back: the seat is free, the order shows what is left.
        let (done, record) = c
            .cancel_tickets(cancel(&["2"], "ann", Some(7)), 30)
            .unwrap();
        log.push(record.unwrap());
        assert_eq!(done.ticket_ids, [format!("{o}.2")]);
        assert_eq!(
            (done.refund_cents, done.refund_key.as_str()),
            (100, format!("{o}:cancel:1").as_str())
        );
        assert_eq!(done.order.tickets.len(), 2);
        assert_eq!(done.order.cancelled_ticket_ids, [format!("{o}.2")]);
        assert_eq!(done.order.refunded_cents, 100);
        assert_eq!(c.counts(), (4, 2, 0, 2));
        c.check_invariants().unwrap();
        // The same key and tickets: the same answer, nothing done; other tickets: refused.
        let (again, none) = c
            .cancel_tickets(cancel(&["2"], "ann", Some(7)), 40)
            .unwrap();
        assert!(none.is_none() && again.replayed);
        assert_eq!(
            (again.ticket_ids, again.refund_key),
            (done.ticket_ids.clone(), done.refund_key.clone())
        );
        assert_eq!(
            c.cancel_tickets(cancel(&["3"], "ann", Some(8)), 40)
                .unwrap_err(),
            Rejection::IdempotencyKeyReused
        );
        assert_eq!(
            c.cancel_tickets(cancel(&["2"], "ann", None), 40)
                .unwrap_err(),
            Rejection::TicketNotActive(format!("{o}.2"))
        );
        // A:2 sold again: claimed under a new key; the first sale's claim stays the first
        // order's.
        let bob = place(&mut c, &mut log, "bob", &["s:A:2"]);
        assert_eq!(bob.sold_keys, ["e/s/s:A:2~1"]);
        let keys = c.all_sold_keys();
        assert!(keys.contains(&("e/s/s:A:2".into(), ann.order.hold_id.clone())));
        assert!(keys.contains(&("e/s/s:A:2~1".into(), bob.order.hold_id.clone())));
        c.check_invariants().unwrap();
        assert_eq!(c.refunds_due().len(), 1);
        // The rest of ann's order: every ticket given back.
        let (all, record) = c
            .cancel_tickets(cancel(&["1", "3"], "ann", None), 50)
            .unwrap();
        log.push(record.unwrap());
        assert!(all.order.tickets.is_empty());
        assert_eq!(all.order.refunded_cents, 300);
        assert_eq!(all.refund_key, format!("{o}:cancel:2"));
        assert_eq!(c.counts(), (4, 3, 0, 1));
        // Replayed from the log, or read from a checkpoint: the same section.
        let mut replayed = reserved(&[("A", 4)]);
        for r in &log {
            replayed.apply(r).unwrap();
        }
        assert_eq!(replayed, c);
        let back = SectionCore::from_checkpoint(&crate::codec::encode(&c.checkpoint())).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.refunds_due(), c.refunds_due());
        // A record that does not fit (the ticket was given back) is refused by apply.
        assert!(replayed.apply(&log[4]).is_err());
    }

    #[test]
    fn tickets_moved_to_another_fan_stay_sold_in_a_new_order_claimed_anew() {
        for reserved_seats in [true, false] {
            let mut c = if reserved_seats {
                reserved(&[("A", 4)])
            } else {
                ga(4)
            };
            let mut log = Vec::new();
            let pick = if reserved_seats {
                Pick::Seats(vec![SeatId::from("s:A:1"), SeatId::from("s:A:2")])
            } else {
                Pick::Best(2)
            };
            let section = c.spec.section_id.clone();
            let (v, r) = c
                .place_hold(
                    PlaceHold {
                        hold_id: HoldId::generate(&EventId::from("e"), &section),
                        user_id: UserId::from("ann"),
                        pick,
                        ttl_ms: 1_000,
                        idem: None,
                        code: None,
                    },
                    10,
                )
                .unwrap();
            log.push(r);
            let o = OrderId::generate(&EventId::from("e"), &section);
            let (confirmed, r) = c.confirm(
                ConfirmHold {
                    hold_id: v.hold_id.clone(),
                    user_id: v.user_id.clone(),
                    order_id: o.clone(),
                    payment_ref: "p".into(),
                    idem: None,
                },
                20,
            );
            log.push(r.unwrap());
            let first_keys = confirmed.unwrap().sold_keys;
            let counts = c.counts();
            let cmd = |to: &str, key: u64| TransferTickets {
                order_id: o.clone(),
                user_id: UserId::from("ann"),
                ticket_ids: vec![format!("{o}.2")],
                to_user: UserId::from(to),
                new_hold_id: HoldId::generate(&EventId::from("e"), &section),
                new_order_id: OrderId::generate(&EventId::from("e"), &section),
                idem: Some(IdemTag {
                    key: "t".into(),
                    fingerprint: key,
                }),
            };
            assert_eq!(
                c.transfer_tickets(cmd("ann", 1), 30).unwrap_err().field(),
                Some("to_user_id")
            );
            let (moved, record) = c.transfer_tickets(cmd("bob", 1), 30).unwrap();
            log.push(record.unwrap());
            assert_eq!(c.counts(), counts, "capacity and sales unchanged");
            assert_eq!(moved.ticket_ids, [format!("{o}.2")]);
            assert_eq!(moved.from.tickets.len(), 1);
            assert_eq!(moved.to.user_id, UserId::from("bob"));
            assert_eq!(moved.to.transferred_from, Some(o.clone()));
            assert_eq!(moved.to.amount_cents, 0);
            assert_eq!(
                moved.to.tickets[0].ticket_id,
                format!("{}.1", moved.to.order_id)
            );
            assert_eq!(
                moved.to.tickets[0].seat_id,
                moved.from.tickets.first().and(if reserved_seats {
                    Some(SeatId::from("s:A:2"))
                } else {
                    None
                })
            );
            // New claims, never one of the first order's.
            assert_eq!(moved.sold_keys.len(), 1);
            assert!(
                !first_keys.contains(&moved.sold_keys[0]),
                "{:?}",
                moved.sold_keys
            );
            c.check_invariants().unwrap();
            assert!(c.refunds_due().is_empty(), "a transfer refunds nothing");
            assert_eq!(c.revoked_ticket_ids(), [format!("{o}.2")]);
            assert_eq!(
                c.orders_of(&UserId::from("bob"), None, 10),
                std::slice::from_ref(&moved.to)
            );
            // The key again: the same transfer; with another request: refused.
            let (again, none) = c.transfer_tickets(cmd("bob", 1), 40).unwrap();
            assert!(none.is_none() && again.replayed);
            assert_eq!(again.to.order_id, moved.to.order_id);
            assert_eq!(
                c.transfer_tickets(cmd("cat", 2), 40).unwrap_err(),
                Rejection::IdempotencyKeyReused
            );
            // Replayed, or read from a checkpoint: the same section.
            let mut replayed = if reserved_seats {
                reserved(&[("A", 4)])
            } else {
                ga(4)
            };
            for r in &log {
                replayed.apply(r).unwrap();
            }
            assert_eq!(replayed, c);
            let back =
                SectionCore::from_checkpoint(&crate::codec::encode(&c.checkpoint())).unwrap();
            assert_eq!(back, c);
        }
    }

    #[test]
    fn a_users_orders_are_listed_newest_first_from_a_cursor_and_after_a_checkpoint() {
        let mut c = ga(20);
        let mut anns = Vec::new();
        for (i, now) in [10, 30, 20, 30].into_iter().enumerate() {
            let h = hold(&mut c, "ann", Pick::Best(1), now).unwrap();
            anns.push(confirm_as(&mut c, &h, now).unwrap().order);
            let b = hold(&mut c, "bob", Pick::Best(1), now + i as u64).unwrap();
            confirm_as(&mut c, &b, now).unwrap();
        }
        hold(&mut c, "ann", Pick::Best(1), 40).unwrap(); // held, not an order
        let mut newest = anns.clone();
        newest.sort_by(|a, b| (b.created_at_ms, &b.order_id).cmp(&(a.created_at_ms, &a.order_id)));
        let ann = UserId::from("ann");
        assert_eq!(c.orders_of(&ann, None, 10), newest);
        assert_eq!(c.orders_of(&ann, None, 2), newest[..2]);
        let cursor = OrderCursor::after(&newest[1]);
        assert_eq!(c.orders_of(&ann, Some(&cursor), 10), newest[2..]);
        assert_eq!(c.orders_of(&UserId::from("bob"), None, 10).len(), 4);
        assert!(c.orders_of(&UserId::from("cat"), None, 10).is_empty());
        // A checkpoint's reader rebuilds the index: the same section, the same listing.
        let back = SectionCore::from_checkpoint(&crate::codec::encode(&c.checkpoint())).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.orders_of(&ann, Some(&cursor), 10), newest[2..]);
    }

    #[test]
    fn ended_holds_are_forgotten_a_window_after_they_ended_confirmed_ones_stay() {
        let mut c = ga(10).with_window_ms(5_000);
        let released = hold(&mut c, "a", Pick::Best(1), 0).unwrap();
        let confirmed = hold(&mut c, "b", Pick::Best(1), 0).unwrap();
        let expired = hold(&mut c, "c", Pick::Best(1), 0).unwrap();
        c.release(&released.hold_id, &released.user_id, 100)
            .0
            .unwrap();
        let order = confirm_as(&mut c, &confirmed, 200).unwrap().order;
        assert_eq!(
            c.expire_due(1_000, 10).len(),
            1,
            "c expires at its deadline"
        );
        assert_eq!(c.remembered(), (3, 2));
        // A record 1 ms before the released hold's window passes forgets nothing.
        hold(&mut c, "x", Pick::Best(1), 5_099).unwrap();
        assert!(c.hold_view(&released.hold_id).is_some());
        // The first record at the window's end forgets it; the others are not due yet.
        hold(&mut c, "y", Pick::Best(1), 5_100).unwrap();
        assert_eq!(c.hold_view(&released.hold_id), None);
        assert_eq!(
            c.release(&released.hold_id, &released.user_id, 5_100).0,
            Err(Rejection::HoldNotFound)
        );
        assert!(c.hold_view(&expired.hold_id).is_some());
        // Reading the clock forgets nothing: only records do (so replay agrees).
        assert!(c.hold_view(&expired.hold_id).is_some());
        hold(&mut c, "z", Pick::Best(1), 6_000).unwrap();
        assert_eq!(
            c.hold_view(&expired.hold_id),
            None,
            "expired at 1000, forgotten at 6000"
        );
        // The confirmed hold is an order: never forgotten.
        hold(&mut c, "w", Pick::Best(1), 1_000_000).unwrap();
        assert_eq!(
            c.hold_view(&confirmed.hold_id).map(|h| h.status),
            Some(HoldStatus::Confirmed)
        );
        assert_eq!(c.order_view(&order.order_id), Some(order));
        assert_eq!(
            c.counts(),
            (10, 5, 4, 1),
            "counts are untouched by forgetting"
        );
        c.check_invariants().unwrap();
    }

    #[test]
    fn replay_and_a_checkpoint_forget_exactly_what_the_live_section_forgot() {
        let window = 3_000;
        let mut live = reserved(&[("A", 20), ("B", 20), ("C", 20)]).with_window_ms(window);
        let mut log = Vec::new();
        let mut checkpoint = None;
        for i in 0..40u64 {
            let now = i * 400;
            let (v, rec) = live
                .place_hold(
                    PlaceHold {
                        hold_id: HoldId::generate(&EventId::from("e"), &SectionId::from("s")),
                        user_id: UserId::from(format!("u{i}").as_str()),
                        pick: Pick::Best(1 + (i % 3) as u32),
                        ttl_ms: 1_000,
                        idem: None,
                        code: None,
                    },
                    now,
                )
                .unwrap();
            log.push(rec);
            match i % 4 {
                0 => log.extend(live.release(&v.hold_id, &v.user_id, now + 1).1),
                1 => {
                    let order_id = OrderId::generate(&EventId::from("e"), &SectionId::from("s"));
                    let (r, rec) = live.confirm(
                        ConfirmHold {
                            hold_id: v.hold_id.clone(),
                            user_id: v.user_id.clone(),
                            order_id,
                            payment_ref: "p".into(),
                            idem: None,
                        },
                        now + 2,
                    );
                    r.unwrap();
                    log.extend(rec);
                }
                _ => {}
            }
            log.extend(live.expire_due(now + 3, 100).into_iter().map(|(_, r)| r));
            if i == 20 {
                checkpoint = Some((log.len(), crate::codec::encode(&live)));
            }
        }
        let (holds, ended) = live.remembered();
        assert!(
            holds < 40 && ended > 0,
            "some ended holds are forgotten, some not yet"
        );
        let mut replayed = reserved(&[("A", 20), ("B", 20), ("C", 20)]).with_window_ms(window);
        for r in &log {
            replayed.apply(r).unwrap();
        }
        let (at, blob) = checkpoint.unwrap();
        let mut from_checkpoint = SectionCore::from_checkpoint(&blob)
            .unwrap()
            .with_window_ms(window);
        for r in &log[at..] {
            from_checkpoint.apply(r).unwrap();
        }
        for other in [&replayed, &from_checkpoint] {
            other.check_invariants().unwrap();
            assert_eq!(other.remembered(), live.remembered());
            assert_eq!(other.snapshot(0), live.snapshot(0));
            let mut ids: Vec<_> = other.holds.keys().collect();
            let mut want: Vec<_> = live.holds.keys().collect();
            ids.sort();
            want.sort();
            assert_eq!(ids, want, "the same holds remembered");
        }
    }

    #[test]
    fn replaying_records_rebuilds_the_same_state() {
        let mut c = reserved(&[("A", 6), ("B", 6)]);
        let mut log = Vec::new();
        for (i, q) in [2u32, 3, 1, 4].into_iter().enumerate() {
            let (v, rec) = c
                .place_hold(
                    PlaceHold {
                        hold_id: HoldId::generate(&EventId::from("e"), &SectionId::from("s")),
                        user_id: UserId::from(format!("u{i}").as_str()),
                        pick: Pick::Best(q),
                        ttl_ms: 100,
                        idem: None,
                        code: None,
                    },
                    i as u64,
                )
                .unwrap();
            log.push(rec);
            if i == 1 {
                let (r, rec) = c.release(&v.hold_id, &v.user_id, 5);
                r.unwrap();
                log.push(rec.unwrap());
            }
        }
        log.extend(c.expire_due(102, 1).into_iter().map(|(_, r)| r));
        let mut replayed = reserved(&[("A", 6), ("B", 6)]);
        for r in &log {
            replayed.apply(r).unwrap();
        }
        assert_eq!(replayed.snapshot(0), c.snapshot(0));
        replayed.check_invariants().unwrap();
        // A record that does not fit is refused, not applied.
        assert!(replayed.apply(&log[0]).is_err());
    }
}
