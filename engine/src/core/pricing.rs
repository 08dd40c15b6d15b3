//! A section's prices as its core keeps them ([`crate::prices`]): restored from a checkpoint,
//! read by the views, checked with the invariants.

use crate::prices::{Prices, TierStatus};
use crate::types::{HoldId, HoldStatus};

use super::SectionCore;

impl SectionCore {
    /// Takes a checkpoint's prices (default in one written before they were part of it): the
    /// spec's tiers again (its own encoding skips them), its own price, and each tier's count
    /// from the places the holds still hold or own.
    pub(super) fn set_prices(&mut self, prices: Prices) {
        self.spec.price_tiers = prices.tiers().to_vec();
        // Recounted over the holds the prices know (none in a section without tiers), each
        // looked up as it comes: no map of every hold's places is built first.
        let mut prices = prices.restored(self.spec.price_cents);
        prices.recount(|h| self.live_places(h));
        self.prices = prices;
    }

    /// The places (ticket indexes) a hold still holds or owns: `None` if it ended.
    fn live_places(&self, hold_id: &HoldId) -> Option<Vec<u32>> {
        let h = self.holds.get(hold_id)?;
        if !matches!(h.status, HoldStatus::Held | HoldStatus::Confirmed) {
            return None;
        }
        let gone = self.cancelled_of(hold_id);
        Some((0..h.quantity).filter(|i| !gone.contains(i)).collect())
    }

    /// Each of a hold's places' price, cents, in ticket order.
    pub(super) fn place_prices(&self, hold_id: &HoldId, quantity: u32) -> Vec<u64> {
        self.prices.of(hold_id, quantity)
    }

    /// What each ticket of a confirmed hold cost, cents, in ticket order: its place's price,
    /// or 0 in a received order (`TransferTickets`: paid for in the order it came from).
    pub(super) fn ticket_prices(&self, hold_id: &HoldId) -> Vec<u64> {
        match self.holds.get(hold_id) {
            Some(h) => self.ticket_prices_of(hold_id, h),
            None => Vec::new(),
        }
    }

    /// [`SectionCore::ticket_prices`] of a hold already found.
    pub(super) fn ticket_prices_of(&self, hold_id: &HoldId, h: &super::HoldEntry) -> Vec<u64> {
        let received = h
            .order
            .as_ref()
            .is_some_and(|o| o.payment_ref.starts_with(super::TRANSFER_PREFIX));
        match received {
            true => vec![0; h.quantity as usize],
            false => self.place_prices(hold_id, h.quantity),
        }
    }

    /// The price of the place of a tier, cents.
    pub fn price_of_tier(&self, tier: u32) -> u64 {
        self.prices.price_of(tier)
    }

    /// The tiers as they stand, and the price the next place would be held at.
    pub fn price_status(&self) -> (Vec<TierStatus>, u64) {
        (self.prices.status(), self.prices.next_price_cents())
    }

    /// Invariant: each tier's count is what the holds' places make it, and none is over.
    pub(super) fn check_prices(&self) -> Result<(), String> {
        let mut again = self.prices.clone();
        again.recount(|h| self.live_places(h));
        if again.taken() != self.prices.taken() {
            return Err(format!(
                "price tiers count {:?}, the holds make {:?}",
                self.prices.taken(),
                again.taken()
            ));
        }
        for (t, (tier, &taken)) in self.prices.tiers().iter().zip(again.taken()).enumerate() {
            if taken > tier.places {
                return Err(format!(
                    "tier {t} has {taken} places held or sold of {}",
                    tier.places
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        CancelTickets, ConfirmHold, Pick, PlaceHold, SectionRecord, TransferTickets,
    };
    use super::*;
    use crate::prices::PriceTier;
    use crate::types::{EventId, HoldView, Layout, OrderId, SectionId, SectionSpec, UserId};

    /// 10 places: 3 at 90.00, 3 at 120.00, the rest at 150.00.
    fn tiered() -> SectionCore {
        let t = |places, price_cents| PriceTier {
            places,
            price_cents,
        };
        SectionCore::new(
            EventId::from("e"),
            SectionSpec {
                section_id: SectionId::from("floor"),
                name: "Floor".into(),
                price_cents: 15_000,
                layout: Layout::GeneralAdmission { capacity: 10 },
                price_tiers: vec![t(3, 9_000), t(3, 12_000)],
            },
        )
    }

    fn place(c: &mut SectionCore, q: u32, log: &mut Vec<SectionRecord>) -> HoldView {
        let (v, r) = c
            .place_hold(
                PlaceHold {
                    hold_id: HoldId::generate(&EventId::from("e"), &SectionId::from("floor")),
                    user_id: UserId::from("ann"),
                    pick: Pick::Best(q),
                    ttl_ms: 1_000,
                    idem: None,
                    code: None,
                },
                10,
            )
            .unwrap();
        log.push(r);
        v
    }

    fn remaining(c: &SectionCore) -> Vec<u32> {
        c.price_status().0.iter().map(|t| t.remaining).collect()
    }

    /// Prices are fixed per place when a hold is made, by the tier each place comes from;
    /// releases, cancellations and expiries give places back to their tiers, a transfer keeps
    /// them; the log replayed and a checkpoint read back price the same; the invariants hold.
    #[test]
    fn each_place_is_priced_by_its_tier_and_goes_back_to_it() {
        let mut c = tiered();
        let mut log = Vec::new();
        let a = place(&mut c, 2, &mut log);
        assert_eq!(a.place_prices_cents, [9_000, 9_000]);
        let b = place(&mut c, 3, &mut log);
        // Across the boundary: one at 90.00, two at 120.00 (never all three at 120.00).
        assert_eq!(b.place_prices_cents, [9_000, 12_000, 12_000]);
        assert_eq!(b.amount_cents(), 33_000);
        assert_eq!(remaining(&c), [0, 1]);
        assert_eq!(c.price_status().1, 12_000);
        // a's release gives two 90.00 places back: the next hold gets them at 90.00.
        let (ended, r) = c.release(&a.hold_id, &a.user_id, 20);
        ended.unwrap();
        log.push(r.unwrap());
        assert_eq!(remaining(&c), [2, 1]);
        let d = place(&mut c, 4, &mut log);
        assert_eq!(d.place_prices_cents, [9_000, 9_000, 12_000, 15_000]);
        // b is paid: its order's tickets keep their prices, the amount is their sum.
        let order_id = OrderId::generate(&EventId::from("e"), &SectionId::from("floor"));
        let (done, r) = c.confirm(
            ConfirmHold {
                hold_id: b.hold_id.clone(),
                user_id: b.user_id.clone(),
                order_id: order_id.clone(),
                payment_ref: "p".into(),
                idem: None,
            },
            30,
        );
        let order = done.unwrap().order;
        log.push(r.unwrap());
        assert_eq!(order.amount_cents, 33_000);
        let prices: Vec<u64> = order.tickets.iter().map(|t| t.price_cents).collect();
        assert_eq!(prices, [9_000, 12_000, 12_000]);
        // Ticket 2 (120.00) given back: refunded what it cost, its place back in its tier.
        let (cancelled, r) = c
            .cancel_tickets(
                CancelTickets {
                    order_id: order_id.clone(),
                    user_id: UserId::from("ann"),
                    ticket_ids: vec![format!("{order_id}.2")],
                    idem: None,
                },
                40,
            )
            .unwrap();
        log.push(r.unwrap());
        assert_eq!(cancelled.refund_cents, 12_000);
        assert_eq!(remaining(&c), [0, 1]);
        // Ticket 1 moved to bob: it stays sold in its tier; it cost bob nothing.
        let new_order = OrderId::generate(&EventId::from("e"), &SectionId::from("floor"));
        let (moved, r) = c
            .transfer_tickets(
                TransferTickets {
                    order_id: order_id.clone(),
                    user_id: UserId::from("ann"),
                    ticket_ids: vec![format!("{order_id}.1")],
                    to_user: UserId::from("bob"),
                    new_hold_id: HoldId::generate(&EventId::from("e"), &SectionId::from("floor")),
                    new_order_id: new_order.clone(),
                    idem: None,
                },
                50,
            )
            .unwrap();
        log.push(r.unwrap());
        assert_eq!(moved.to.amount_cents, 0);
        assert_eq!(remaining(&c), [0, 1]);
        // bob gives it back: it returns to the 90.00 tier, refunded nothing.
        let (back, r) = c
            .cancel_tickets(
                CancelTickets {
                    order_id: new_order.clone(),
                    user_id: UserId::from("bob"),
                    ticket_ids: vec![format!("{new_order}.1")],
                    idem: None,
                },
                60,
            )
            .unwrap();
        log.push(r.unwrap());
        assert_eq!(back.refund_cents, 0);
        assert_eq!(remaining(&c), [1, 1]);
        c.check_invariants().unwrap();
        // The checkpoint read back and the log replayed are the same section.
        let checkpoint = crate::codec::encode(&c.checkpoint());
        let read = SectionCore::from_checkpoint(&checkpoint).unwrap();
        assert_eq!(read, c);
        read.check_invariants().unwrap();
        let mut replayed = tiered();
        for r in &log {
            replayed.apply(r).unwrap();
        }
        assert_eq!(replayed, c);
        // d expires: its places go back to their tiers (one of them past the tiers).
        log.extend(c.expire_due(5_000, 100).into_iter().map(|(_, r)| r));
        assert_eq!(remaining(&c), [3, 2]);
        c.check_invariants().unwrap();
        assert_eq!(c.hold_view(&d.hold_id).unwrap().amount_cents(), 45_000);
    }

    /// A checkpoint written before prices were part of it reads with the section's own price
    /// for every place (not 0), and no tiers.
    #[test]
    fn an_older_checkpoint_prices_every_place_at_the_section_price() {
        let mut c = SectionCore::new(
            EventId::from("e"),
            SectionSpec {
                section_id: SectionId::from("floor"),
                name: "Floor".into(),
                price_cents: 4_200,
                layout: Layout::GeneralAdmission { capacity: 10 },
                price_tiers: Vec::new(),
            },
        );
        let h = place(&mut c, 2, &mut Vec::new());
        assert_eq!(h.place_prices_cents, [4_200, 4_200]);
        let old = crate::codec::encode(&(&c, &c.sale, c.returns(), &c.codes));
        let read = SectionCore::from_checkpoint(&old).unwrap();
        assert_eq!(
            read.hold_view(&h.hold_id).unwrap().place_prices_cents,
            [4_200, 4_200]
        );
        assert_eq!(read.price_status(), (Vec::new(), 4_200));
        assert_eq!(read, c);
    }

    /// A record whose tiers do not fit the section is refused whole.
    #[test]
    fn a_hold_record_with_wrong_tiers_does_not_apply() {
        let mut c = tiered();
        let mut log = Vec::new();
        place(&mut c, 2, &mut log);
        let mut fresh = tiered();
        for wrong in [vec![0], vec![0, 7]] {
            let mut r = log[0].clone();
            let SectionRecord::HoldPlacedPriced { tiers, .. } = &mut r else {
                panic!("a tiered section records tiers: {r:?}");
            };
            *tiers = wrong;
            assert!(fresh.apply(&r).is_err());
            assert_eq!(fresh, tiered());
        }
        fresh.apply(&log[0]).unwrap();
        assert_eq!(remaining(&fresh), [1, 3]);
        // The same hold placed again is refused, and its first placing keeps its prices.
        let before = fresh.clone();
        assert!(fresh.apply(&log[0]).is_err());
        assert_eq!(fresh, before);
        fresh.check_invariants().unwrap();
        // A record taking more of a tier than it has left is refused whole.
        let mut over = tiered();
        let mut o = Vec::new();
        place(&mut over, 2, &mut o);
        let mut r = o[0].clone();
        let SectionRecord::HoldPlacedPriced { hold_id, tiers, .. } = &mut r else {
            unreachable!()
        };
        *hold_id = HoldId::generate(&EventId::from("e"), &SectionId::from("floor"));
        *tiers = vec![0, 0];
        let before = over.clone();
        assert!(over.apply(&r).is_err(), "tier 0 has 1 place left");
        assert_eq!(over, before);
    }
}
