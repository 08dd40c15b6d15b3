//! Expiry: ending holds whose deadline passed (the sweeper drives it), and handing the freed
//! places to waiting fans in the same step of the section's actor.

use std::sync::Arc;

use crate::catalog::Catalog;
use crate::core::{Pick, PlaceHold};
use crate::error::{EngineError, Rejection};
use crate::events::EventEntry;
use crate::kernel::Kernel;
use crate::ledger::{Begin, BeginArgs, Rpc};
use crate::limits::{EXPIRE_PER_SECTION_MAX, PLACES_PER_HOLD_MAX};
use crate::section::SectionMsg;
use crate::types::{EventId, HoldId, HoldView, SectionId, UserId};

/// What [`Expiry::expire_section_offering`] did: the holds that ended, the section's next
/// deadline, one outcome per offer.
pub type ExpiredAndOffered = (
    Vec<HoldView>,
    Option<u64>,
    Vec<Result<HoldView, EngineError>>,
);

/// Ending holds past their deadline, and offering what they free (see the module's doc).
pub(crate) struct Expiry {
    kernel: Arc<Kernel>,
    catalog: Arc<Catalog>,
}

impl Expiry {
    pub(crate) fn new(kernel: Arc<Kernel>, catalog: Arc<Catalog>) -> Expiry {
        Expiry { kernel, catalog }
    }
}

impl Expiry {
    /// Expires every hold whose deadline has passed (by the engine's clock), at most
    /// `max_per_section` per section per call; returns the holds it expired.
    pub async fn expire_due(&self, max_per_section: usize) -> Result<Vec<HoldView>, EngineError> {
        self.kernel.check_ready()?;
        let mut out = Vec::new();
        for e in self.catalog.entries() {
            for slot in &e.sections {
                let (expired, _) = self
                    .expire_section(&e.event_id, &slot.section_id, max_per_section)
                    .await?;
                out.extend(expired);
            }
        }
        Ok(out)
    }

    /// Expires at most `max` due holds of one section; returns them and the section's next
    /// deadline (which may already be due if `max` was reached).
    pub async fn expire_section(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
        max: usize,
    ) -> Result<(Vec<HoldView>, Option<u64>), EngineError> {
        let (ended, next, _) = self
            .expire_section_offering(event_id, section_id, max, &[])
            .await?;
        Ok((ended, next))
    }

    /// Expires what is due in a section (at most `max` holds) and then, in the same step of the
    /// section's actor, places a hold for each of `offers` (user, quantity, the waitlist entry
    /// it is for: its hold carries the entry's mark, see [`Waitlist::waitlist_offer_made`](crate::waitlist_calls::Waitlist::waitlist_offer_made)), in
    /// order, each all or
    /// nothing at the best available places of this section, with the event's TTL. No request
    /// queued behind can take the freed places first: waiting fans are served before new ones.
    /// Quota is reserved per offer as for any hold (USER_LIMIT skips that fan) and given back
    /// for each offer that did not fit. Returns the ended holds, the section's next deadline and
    /// one outcome per offer.
    pub async fn expire_section_offering(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
        max: usize,
        offers: &[(UserId, u32, Option<String>)],
    ) -> Result<ExpiredAndOffered, EngineError> {
        self.kernel.check_ready()?;
        let max = max.clamp(1, EXPIRE_PER_SECTION_MAX);
        let e = self.catalog.entry(event_id)?;
        if !e.sections.iter().any(|slot| &slot.section_id == section_id) {
            return Err(Rejection::SectionNotFound.into());
        }
        let mut offering = Offering {
            kernel: &self.kernel,
            event: &e,
            section_id,
            outcomes: offers.iter().map(|_| None).collect(),
            reserved: Vec::new(),
        };
        let plans = offering.reserve(offers).await;
        let done = self
            .kernel
            .ask(&e, section_id, |reply| {
                SectionMsg::ExpireDue(max, plans, reply)
            })
            .await;
        let done = match done {
            Ok(d) => d,
            Err(err) => {
                offering.give_back_all(err.clone()).await;
                return Err(err);
            }
        };
        let outcomes = offering.settle(done.offers).await;
        Ok((done.ended, done.next, outcomes))
    }

    /// Every section's earliest active-hold deadline.
    pub async fn next_deadlines(
        &self,
    ) -> Result<Vec<(EventId, SectionId, Option<u64>)>, EngineError> {
        self.kernel.check_ready()?;
        let mut out = Vec::new();
        for e in self.catalog.entries() {
            for slot in &e.sections {
                let d = self
                    .kernel
                    .ask(&e, &slot.section_id, SectionMsg::NextDeadline)
                    .await?;
                out.push((e.event_id.clone(), slot.section_id.clone(), d));
            }
        }
        Ok(out)
    }

    /// Active holds past their deadline in every section, by the engine's clock: what the
    /// sweeper has yet to expire (its backlog; a few are normal for a moment after each
    /// deadline). Asks every section at once; a section that cannot answer (its queue full,
    /// restarting) fails the whole count.
    pub async fn holds_past_deadline(&self) -> Result<u64, EngineError> {
        self.kernel.check_ready()?;
        let entries = self.catalog.entries();
        let asks = entries.iter().flat_map(|e| {
            e.sections.iter().map(move |slot| {
                self.kernel
                    .ask(e, &slot.section_id, SectionMsg::PastDeadline)
            })
        });
        let mut due = 0u64;
        for n in futures_util::future::join_all(asks).await {
            due += n? as u64;
        }
        Ok(due)
    }

    /// The earliest deadline of any active hold, if any (for the sweeper's sleep).
    pub async fn next_deadline_ms(&self) -> Result<Option<u64>, EngineError> {
        self.kernel.check_ready()?;
        let mut next: Option<u64> = None;
        for e in self.catalog.entries() {
            for slot in &e.sections {
                let d = self
                    .kernel
                    .ask(&e, &slot.section_id, SectionMsg::NextDeadline)
                    .await?;
                next = match (next, d) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        Ok(next)
    }
}

/// The waiting fans' offers of one `expire_section_offering`: their quota reservations and
/// outcomes.
struct Offering<'a> {
    kernel: &'a Kernel,
    event: &'a EventEntry,
    section_id: &'a SectionId,
    outcomes: Vec<Option<Result<HoldView, EngineError>>>,
    /// (offer index, user, quantity) of every offer whose quota is reserved.
    reserved: Vec<(usize, UserId, u32)>,
}

impl Offering<'_> {
    fn args(&self, user: &UserId, quantity: u32) -> BeginArgs {
        BeginArgs {
            event_id: self.event.event_id.clone(),
            user_id: user.clone(),
            limit: self.event.per_user_limit(),
            rpc: Rpc::Hold,
            tag: None,
            quantity,
            // An offer is the engine's, not a fan's own hold: no cool-down.
            cooldown_ms: 0,
            now_ms: self.kernel.now_ms(),
        }
    }

    /// Reserves every offer's quota at once (one round trip of waiting, not one per offer: the
    /// sweeper does this while sections' deadlines wait for it); returns the holds to place.
    async fn reserve(&mut self, offers: &[(UserId, u32, Option<String>)]) -> Vec<PlaceHold> {
        let mut asks = Vec::new();
        // An offer is a hold without an access code: none is made while the section needs one.
        let presale = (self.event.spec.presale).requires(self.section_id, self.kernel.now_ms());
        for (k, (user, quantity, entry)) in offers.iter().enumerate() {
            if presale {
                self.outcomes[k] = Some(Err(Rejection::AccessCodeRequired.into()));
                continue;
            }
            if *quantity == 0 || *quantity > PLACES_PER_HOLD_MAX {
                self.outcomes[k] = Some(Err(Rejection::invalid(
                    "quantity",
                    format!("must be 1 to {PLACES_PER_HOLD_MAX}"),
                )
                .into()));
                continue;
            }
            asks.push((k, user, *quantity, entry));
        }
        let args = asks.iter().map(|(_, u, q, _)| self.args(u, *q)).collect();
        let begun = self.kernel.ledger().begin(args).await;
        let mut plans = Vec::new();
        for ((k, user, quantity, entry), begun) in asks.into_iter().zip(begun) {
            match begun {
                Ok(Begin::Proceed) => {
                    plans.push(PlaceHold {
                        hold_id: HoldId::generate(&self.event.event_id, self.section_id),
                        user_id: user.clone(),
                        pick: Pick::Best(quantity),
                        ttl_ms: self.event.hold_ttl_ms(),
                        idem: entry.as_deref().map(crate::booking::offer_mark),
                        code: None,
                    });
                    self.reserved.push((k, user.clone(), quantity));
                }
                // Without a key there is nothing to replay; never reached.
                Ok(Begin::Replay(_)) => self.outcomes[k] = Some(Err(EngineError::NotReady)),
                Err(err) => self.outcomes[k] = Some(Err(err)),
            }
        }
        plans
    }

    /// Gives offers' quota back: (user, places, why). A ledger that cannot take it (only while
    /// shutting down) is logged; the rest still goes back and the outcomes still return.
    async fn give_back(&self, returns: Vec<(&UserId, u32, EngineError)>) {
        if returns.is_empty() {
            return;
        }
        let many = returns
            .into_iter()
            .map(|(user, quantity, err)| (self.args(user, quantity), Err(err)))
            .collect();
        if let Err(e) = self.kernel.ledger().finish(many).await {
            tracing::error!(error = %e, "cannot give back an offer's quota");
        }
    }

    async fn give_back_all(&self, err: EngineError) {
        let returns = self
            .reserved
            .iter()
            .map(|(_, user, quantity)| (user, *quantity, err.clone()))
            .collect();
        self.give_back(returns).await;
    }

    /// Records each placed offer's outcome and gives back the quota of those that did not fit.
    async fn settle(
        mut self,
        placed: Vec<Result<HoldView, Rejection>>,
    ) -> Vec<Result<HoldView, EngineError>> {
        let mut returns = Vec::new();
        for ((k, user, quantity), placed) in self.reserved.iter().zip(placed) {
            self.outcomes[*k] = Some(match placed {
                Ok(view) => Ok(view),
                Err(r) => {
                    let err = EngineError::from(r);
                    returns.push((user, *quantity, err.clone()));
                    Err(err)
                }
            });
        }
        self.give_back(returns).await;
        std::mem::take(&mut self.outcomes)
            .into_iter()
            .map(|o| o.unwrap_or(Err(EngineError::NotReady)))
            .collect()
    }
}
