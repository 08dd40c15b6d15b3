//! Price tiers: a section's price steps up as its places sell.
//!
//! A section may list tiers by quantity, in order: the first `places` of the first tier at its
//! price, the next tier's `places` at its price, and so on; every place past the tiers is at
//! the section's own `price_cents`. A tier counts the places held or sold under it now.
//!
//! **The rule.** A hold takes the first tiers' places first, place by place, and each place is
//! priced by its own tier: a hold of 4 when 2 places are left in the 90.00 tier and the next
//! is at 120.00 costs 2 x 90.00 + 2 x 120.00, never 4 x 120.00. Its prices are fixed when it is
//! made (the section records each place's tier with the hold), shown on the hold, charged by
//! the confirm and kept by the order's tickets. A place given back (a release, an expiry, a
//! ticket cancelled) returns to the tier it was taken from: the next hold can take it at that
//! tier's price. A ticket moved to another fan keeps its tier (it stays sold).
//!
//! The tiers are fixed when the event is created. They are not part of the section spec's
//! own encoding: the catalog record carries them beside the spec
//! (`CatalogRecord::EventCreatedWithPrices`) and a section's checkpoint beside its core.

use serde::{Deserialize, Serialize};

use crate::error::Rejection;
use crate::hash::HashMap;
use crate::ids::HoldId;
use crate::limits::{PRICE_CENTS_MAX, PRICE_TIERS_PER_SECTION_MAX};

/// One tier of a section's prices, as the organiser specifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriceTier {
    /// How many places the tier has, at least 1.
    pub places: u32,
    /// The price of each of them, cents.
    pub price_cents: u64,
}

/// A tier as the API shows it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierStatus {
    /// The tier's places.
    pub places: u32,
    /// The price of each, cents.
    pub price_cents: u64,
    /// Its places neither held nor sold now.
    pub remaining: u32,
}

/// Checks a section's tiers against its `capacity`; `field` names the section in the error.
pub fn validate(tiers: &[PriceTier], capacity: u32, field: &str) -> Result<(), Rejection> {
    if tiers.len() > PRICE_TIERS_PER_SECTION_MAX {
        return Err(Rejection::invalid(
            &format!("{field}.price_tiers"),
            format!("at most {PRICE_TIERS_PER_SECTION_MAX} tiers"),
        ));
    }
    let mut total = 0u64;
    for (i, t) in tiers.iter().enumerate() {
        let f = format!("{field}.price_tiers[{i}]");
        if t.places == 0 {
            return Err(Rejection::invalid(
                &format!("{f}.places"),
                "must be at least 1",
            ));
        }
        if t.price_cents > PRICE_CENTS_MAX {
            return Err(Rejection::invalid(
                &format!("{f}.price_cents"),
                format!("at most {PRICE_CENTS_MAX} (one million in whole units)"),
            ));
        }
        total += u64::from(t.places);
    }
    if total > u64::from(capacity) {
        return Err(Rejection::invalid(
            &format!("{field}.price_tiers"),
            format!("the tiers have {total} places, the section {capacity}"),
        ));
    }
    Ok(())
}

/// What a section keeps of its prices: its tiers, each hold's places' tiers, and how many
/// places of each tier are held or sold now. A checkpoint carries it after the core.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prices {
    /// The section's tiers (as its spec's).
    tiers: Vec<PriceTier>,
    /// The section's own price: every place past the tiers. Its spec's (never encoded: a
    /// checkpoint's reader sets it, [`Prices::restored`]).
    #[serde(skip)]
    base_cents: u64,
    /// Each hold's places' tiers, in ticket order (ascending; `tiers.len()` is the section's
    /// own price). Only for holds of a tiered section; forgotten with the hold.
    of_hold: HashMap<HoldId, Vec<u32>>,
    /// Places of each tier held or sold now. Derived from the holds, never encoded.
    #[serde(skip)]
    taken: Vec<u32>,
}

impl Prices {
    /// The prices of a section with these tiers and this price past them.
    pub fn new(tiers: Vec<PriceTier>, base_cents: u64) -> Prices {
        Prices {
            taken: vec![0; tiers.len()],
            tiers,
            base_cents,
            of_hold: HashMap::default(),
        }
    }

    /// The prices read from a checkpoint (empty where it was written before prices were part
    /// of it: no tiers) for a section whose own price is `base_cents`.
    pub fn restored(mut self, base_cents: u64) -> Prices {
        self.base_cents = base_cents;
        self
    }

    /// The section's tiers.
    pub fn tiers(&self) -> &[PriceTier] {
        &self.tiers
    }

    /// Whether the section has tiers (else every place is at the section's price).
    pub fn tiered(&self) -> bool {
        !self.tiers.is_empty()
    }

    /// The price of a place of tier `t`.
    pub fn price_of(&self, t: u32) -> u64 {
        self.tiers
            .get(t as usize)
            .map_or(self.base_cents, |tier| tier.price_cents)
    }

    /// The tiers the next `quantity` places would be taken from (see the module's rule);
    /// empty when the section has no tiers.
    pub fn pick(&self, quantity: u32) -> Vec<u32> {
        if !self.tiered() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(quantity as usize);
        for (t, tier) in self.tiers.iter().enumerate() {
            let room = tier.places.saturating_sub(self.taken[t]) as usize;
            let n = room.min(quantity as usize - out.len());
            out.extend(std::iter::repeat_n(t as u32, n));
        }
        let past = self.tiers.len() as u32;
        out.resize(quantity as usize, past);
        out
    }

    /// A hold takes places of these tiers (its record's).
    pub fn take(&mut self, hold_id: &HoldId, tiers: &[u32]) -> Result<(), String> {
        if !self.tiered() {
            return match tiers.is_empty() {
                true => Ok(()),
                false => Err(format!("hold {hold_id}: tiers in a section without tiers")),
            };
        }
        if tiers.is_empty() {
            return Err(format!("hold {hold_id} of a tiered section names no tiers"));
        }
        if tiers.iter().any(|&t| t as usize > self.tiers.len()) {
            return Err(format!("hold {hold_id}: a tier the section does not have"));
        }
        for (t, tier) in self.tiers.iter().enumerate() {
            let more = tiers.iter().filter(|&&x| x as usize == t).count();
            if self.taken[t] as usize + more > tier.places as usize {
                return Err(format!(
                    "hold {hold_id}: more places of tier {t} than it has"
                ));
            }
        }
        self.count(tiers.iter().copied(), true);
        self.of_hold.insert(hold_id.clone(), tiers.to_vec());
        Ok(())
    }

    /// A hold's places `which` (ticket indexes; `None`: all) return to their tiers.
    pub fn give_back(&mut self, hold_id: &HoldId, which: Option<&[u32]>) {
        let Some(tiers) = self.of_hold.get(hold_id) else {
            return;
        };
        let back: Vec<u32> = match which {
            None => tiers.clone(),
            Some(idx) => idx
                .iter()
                .filter_map(|&i| tiers.get(i as usize).copied())
                .collect(),
        };
        self.count(back.into_iter(), false);
    }

    /// A new hold `to` (a transfer's) holds places `which` of `from`, keeping their tiers.
    pub fn carry(&mut self, from: &HoldId, which: &[u32], to: &HoldId) {
        if let Some(tiers) = self.of_hold.get(from) {
            let moved = which
                .iter()
                .filter_map(|&i| tiers.get(i as usize).copied())
                .collect();
            self.of_hold.insert(to.clone(), moved);
        }
    }

    /// Forgets a hold's tiers (its places were given back before).
    pub fn forget(&mut self, hold_id: &HoldId) {
        self.of_hold.remove(hold_id);
    }

    /// The price of each of a hold's `quantity` places, in ticket order.
    pub fn of(&self, hold_id: &HoldId, quantity: u32) -> Vec<u64> {
        match self.of_hold.get(hold_id) {
            Some(tiers) => tiers.iter().map(|&t| self.price_of(t)).collect(),
            None => vec![self.base_cents; quantity as usize],
        }
    }

    /// The tiers as they stand now.
    pub fn status(&self) -> Vec<TierStatus> {
        self.tiers
            .iter()
            .zip(&self.taken)
            .map(|(t, &taken)| TierStatus {
                places: t.places,
                price_cents: t.price_cents,
                remaining: t.places.saturating_sub(taken),
            })
            .collect()
    }

    /// The price the next place would be held at.
    pub fn next_price_cents(&self) -> u64 {
        let first_with_room = self
            .tiers
            .iter()
            .zip(&self.taken)
            .position(|(tier, &taken)| taken < tier.places)
            .unwrap_or(self.tiers.len());
        self.price_of(first_with_room as u32)
    }

    /// Counts each tier again from the holds' places still held or sold (`live` says which of
    /// a hold's places are: `None` for a hold that holds none). After a checkpoint is read.
    pub fn recount(&mut self, live: impl Fn(&HoldId) -> Option<Vec<u32>>) {
        self.taken = vec![0; self.tiers.len()];
        let mut back = Vec::new();
        for (hold, tiers) in &self.of_hold {
            if let Some(idx) = live(hold) {
                back.extend(idx.iter().filter_map(|&i| tiers.get(i as usize).copied()));
            }
        }
        self.count(back.into_iter(), true);
    }

    /// The counts now (for the invariant check: they must equal a recount).
    pub fn taken(&self) -> &[u32] {
        &self.taken
    }

    fn count(&mut self, tiers: impl Iterator<Item = u32>, up: bool) {
        for t in tiers {
            if let Some(n) = self.taken.get_mut(t as usize) {
                *n = if up { *n + 1 } else { n.saturating_sub(1) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{EventId, SectionId};

    fn tiers() -> Prices {
        let t = |places, price_cents| PriceTier {
            places,
            price_cents,
        };
        Prices::new(vec![t(3, 9_000), t(2, 12_000)], 15_000)
    }

    fn id() -> HoldId {
        HoldId::generate(&EventId::from("e"), &SectionId::from("s"))
    }

    #[test]
    fn a_hold_takes_the_first_tiers_first_and_each_place_pays_its_own_tier() {
        let mut p = tiers();
        let a = id();
        assert_eq!(p.pick(2), vec![0, 0]);
        p.take(&a, &[0, 0]).unwrap();
        // 1 left at 90.00, then 2 at 120.00, then the section's price.
        assert_eq!(p.pick(4), vec![0, 1, 1, 2]);
        let b = id();
        p.take(&b, &p.pick(4)).unwrap();
        assert_eq!(p.of(&b, 4), vec![9_000, 12_000, 12_000, 15_000]);
        assert_eq!(p.next_price_cents(), 15_000);
        assert_eq!(
            p.status().iter().map(|s| s.remaining).collect::<Vec<_>>(),
            vec![0, 0]
        );
        // A place given back returns to its tier: the next hold gets it at that price.
        p.give_back(&a, Some(&[1]));
        assert_eq!(p.next_price_cents(), 9_000);
        assert_eq!(p.pick(2), vec![0, 2]);
        p.give_back(&b, None);
        assert_eq!(p.pick(4), vec![0, 0, 1, 1]);
        // A recount from what the holds still hold agrees with the live counts.
        let live = p.taken().to_vec();
        p.recount(|h| (h == &a).then(|| vec![0]));
        assert_eq!(p.taken(), live.as_slice());
    }

    #[test]
    fn tiers_are_checked_against_the_section() {
        let t = |places, price_cents| PriceTier {
            places,
            price_cents,
        };
        assert!(validate(&[t(5, 1), t(5, 2)], 10, "sections[0]").is_ok());
        let e = validate(&[t(5, 1), t(6, 2)], 10, "sections[0]").unwrap_err();
        assert!(e.to_string().contains("sections[0].price_tiers"), "{e}");
        let e = validate(&[t(0, 1)], 10, "sections[1]").unwrap_err();
        assert!(
            e.to_string().contains("sections[1].price_tiers[0].places"),
            "{e}"
        );
        let e = validate(&[t(1, PRICE_CENTS_MAX + 1)], 10, "s").unwrap_err();
        assert!(e.to_string().contains("price_cents"), "{e}");
        let many = vec![t(1, 1); PRICE_TIERS_PER_SECTION_MAX + 1];
        assert!(validate(&many, 100, "s").is_err());
        // A section without tiers: every place at its own price, nothing recorded.
        let p = Prices::new(Vec::new(), 700);
        assert!(p.pick(3).is_empty());
        assert_eq!(p.of(&id(), 3), vec![700; 3]);
    }
}
