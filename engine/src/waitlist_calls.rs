//! The engine's waitlist calls: join, read, and the sweeper's offer bookkeeping, over the waitlist
//! actor ([`crate::waitlist`]).

use std::sync::{Arc, RwLock};

use ractor::ActorRef;

use crate::booking::offer_mark;
use crate::catalog::Catalog;
use crate::error::{EngineError, Rejection};
use crate::events::EventEntry;
use crate::kernel::Kernel;
use crate::ledger::{Answer, Rpc};
use crate::section::{Notice, SectionMsg};
use crate::types::{EventId, HoldId, HoldView, SectionId, UserId, check_user_id};
use crate::waitlist::{JoinRequest, WaitlistMsg, WaitlistState, WaitlistView};

/// The waitlist's calls over its actor (see the module's doc): cheap to clone (a join's work
/// is detached with a clone of it). The actor is replaced when the supervisor restarts it.
#[derive(Clone)]
pub(crate) struct Waitlist {
    kernel: Arc<Kernel>,
    catalog: Arc<Catalog>,
    actor: Arc<RwLock<ActorRef<WaitlistMsg>>>,
}

impl Waitlist {
    pub(crate) fn new(
        kernel: Arc<Kernel>,
        catalog: Arc<Catalog>,
        actor: ActorRef<WaitlistMsg>,
    ) -> Waitlist {
        Waitlist {
            kernel,
            catalog,
            actor: Arc::new(RwLock::new(actor)),
        }
    }

    /// The waitlist actor now.
    pub(crate) fn actor(&self) -> ActorRef<WaitlistMsg> {
        self.actor.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The waitlist's new actor, once the supervisor restarted it.
    pub(crate) fn replace(&self, actor: ActorRef<WaitlistMsg>) {
        *self.actor.write().unwrap_or_else(|p| p.into_inner()) = actor;
    }
}

impl Waitlist {
    pub(crate) async fn ask_waitlist<T: Send + 'static>(
        &self,
        build: impl FnOnce(ractor::RpcReplyPort<Result<T, EngineError>>) -> WaitlistMsg,
    ) -> Result<T, EngineError> {
        self.actor()
            .call(build, None)
            .await
            .map_err(|_| EngineError::NotReady)?
            .success_or(EngineError::NotReady)?
    }

    /// Joins an event's waitlist for `quantity` places (all or nothing) in `section` (`None`:
    /// any). A fan has at most one active entry per event: joining again returns it. Without
    /// one, the join is refused with `PLACES_AVAILABLE` while `quantity` places are free to
    /// hold in the section (in any one section, for any): the waitlist is for places that
    /// cannot be held now.
    ///
    /// Runs to the end even if the caller stops waiting.
    pub async fn join_waitlist(
        &self,
        event_id: &EventId,
        user_id: &UserId,
        section: Option<SectionId>,
        quantity: u32,
    ) -> Result<WaitlistView, EngineError> {
        let (waitlist, e, u) = (self.clone(), event_id.clone(), user_id.clone());
        crate::kernel::detached(async move {
            waitlist.join_waitlist_now(&e, &u, section, quantity).await
        })
        .await
    }

    async fn join_waitlist_now(
        &self,
        event_id: &EventId,
        user_id: &UserId,
        section: Option<SectionId>,
        quantity: u32,
    ) -> Result<WaitlistView, EngineError> {
        self.kernel.check_ready()?;
        check_user_id(user_id)?;
        let e = self.catalog.entry(event_id)?;
        if let Some(s) = &section
            && !e.sections.iter().any(|slot| &slot.section_id == s)
        {
            return Err(Rejection::SectionNotFound.into());
        }
        if quantity == 0 || quantity > e.per_user_limit() {
            return Err(Rejection::invalid(
                "quantity",
                format!("must be 1 to the per-user limit ({})", e.per_user_limit()),
            )
            .into());
        }
        // A fan who has an active entry gets it back (a retry), whatever the places now.
        if let Some(v) = self.active_waitlist_entry(event_id, user_id).await? {
            return Ok(v);
        }
        self.refuse_if_places_free(&e, section.as_ref(), quantity)
            .await?;
        let join = JoinRequest {
            entry_id: format!("{event_id}.w{}", crate::rt::ulid()),
            event_id: event_id.clone(),
            user_id: user_id.clone(),
            section_id: section,
            quantity,
            at_ms: self.kernel.now_ms(),
        };
        let max = self.kernel.config().waitlist_max;
        let view = self
            .ask_waitlist(|reply| WaitlistMsg::Join(join, max, reply))
            .await?;
        crate::section::notify(
            self.kernel.notices(),
            Notice::WaitlistJoined {
                event_id: event_id.clone(),
            },
        );
        Ok(view)
    }

    /// `PLACES_AVAILABLE` if `quantity` places are free now in `section`, or in any one
    /// section of the event for `None` (a hold, and an offer, never spans sections).
    ///
    /// Asked of the section actors themselves, in their mailbox order, not read from a
    /// published snapshot: every hold, release and expiry they took before is counted. A
    /// place freed after a section answered (a release racing this join) is not lost on the
    /// fan: the join is followed by an offer of whatever is free then
    /// ([`Notice::WaitlistJoined`]), as for any fan who waits.
    async fn refuse_if_places_free(
        &self,
        event: &EventEntry,
        section: Option<&SectionId>,
        quantity: u32,
    ) -> Result<(), EngineError> {
        let sections: Vec<SectionId> = match section {
            Some(s) => vec![s.clone()],
            None => event
                .sections
                .iter()
                .map(|s| s.section_id.clone())
                .collect(),
        };
        for s in &sections {
            let free = self.kernel.ask(event, s, SectionMsg::Available).await?;
            if free >= quantity {
                return Err(Rejection::PlacesAvailable.into());
            }
        }
        Ok(())
    }

    /// A waitlist entry.
    pub async fn waitlist_entry(&self, entry_id: &str) -> Result<WaitlistView, EngineError> {
        self.kernel.check_ready()?;
        let id = entry_id.to_owned();
        self.ask_waitlist(|reply| WaitlistMsg::Get(id, reply)).await
    }

    /// The fan's active (waiting or offered) entry for the event, if any: what joining again
    /// would answer. Changes nothing (for callers that must answer a retry before re-checking
    /// a permission that may have lapsed since: an admission window).
    pub async fn active_waitlist_entry(
        &self,
        event_id: &EventId,
        user_id: &UserId,
    ) -> Result<Option<WaitlistView>, EngineError> {
        self.kernel.check_ready()?;
        let (e, u) = (event_id.clone(), user_id.clone());
        self.ask_waitlist(|reply| WaitlistMsg::Active(e, u, reply))
            .await
    }

    /// A waitlist entry, to its fan only: another user's entry is `ENTRY_NOT_FOUND`, exactly
    /// as an unknown id is (an entry names the hold offered to its fan).
    pub async fn waitlist_entry_of(
        &self,
        entry_id: &str,
        user_id: &UserId,
    ) -> Result<WaitlistView, EngineError> {
        check_user_id(user_id)?;
        let v = self.waitlist_entry(entry_id).await?;
        crate::booking::owned_by(v, |v| &v.user_id, user_id, Rejection::EntryNotFound)
    }

    /// The first `n` waiting entries of an event that would take places of `section`.
    pub async fn waitlist_candidates(
        &self,
        event_id: &EventId,
        section: Option<&SectionId>,
        n: usize,
    ) -> Result<Vec<WaitlistView>, EngineError> {
        let (e, s) = (event_id.clone(), section.cloned());
        self.ask_waitlist(|reply| WaitlistMsg::Candidates(e, s, n, reply))
            .await
    }

    /// The hold an offer to `entry` placed before, if its record is known while the offer was
    /// never recorded with the waitlist: a leader that died between the two (the hold is
    /// replicated, the offer is not) leaves such a hold, which the next leader's sweeper records
    /// as the entry's offer instead of placing a second one (the first would hold its places
    /// for a whole TTL, offered to nobody). Found by the mark the offer's hold carries
    /// ([`offer_mark`]), through the ledger, which learns every hold's mark from the records it
    /// starts from. `None`: no such hold, or its window passed.
    pub async fn waitlist_offer_made(
        &self,
        entry: &WaitlistView,
    ) -> Result<Option<HoldView>, EngineError> {
        self.kernel.check_ready()?;
        let found = self
            .kernel
            .ledger()
            .lookup(
                entry.user_id.clone(),
                Rpc::Hold,
                offer_mark(&entry.entry_id),
                self.kernel.now_ms(),
            )
            .await?;
        Ok(match found {
            Some(Ok(Answer::Hold(view))) => Some(*view),
            _ => None,
        })
    }

    /// Records that `hold_id` was offered to a waiting entry (idempotent for the same hold).
    pub async fn waitlist_offer(
        &self,
        entry_id: &str,
        hold_id: &HoldId,
    ) -> Result<WaitlistView, EngineError> {
        let (id, h) = (entry_id.to_owned(), hold_id.clone());
        self.ask_waitlist(|reply| WaitlistMsg::Offer(id, h, reply))
            .await
    }

    /// Ends an entry (`Expired` or `Fulfilled`); an entry that ended already stays as it is.
    pub async fn waitlist_end(
        &self,
        entry_id: &str,
        state: WaitlistState,
    ) -> Result<WaitlistView, EngineError> {
        let id = entry_id.to_owned();
        self.ask_waitlist(|reply| WaitlistMsg::End(id, state, reply))
            .await
    }

    /// Every entry with an outstanding offer.
    pub async fn waitlist_offered(&self) -> Result<Vec<WaitlistView>, EngineError> {
        self.ask_waitlist(WaitlistMsg::Offered).await
    }

    /// Events with fans waiting.
    pub async fn waitlist_events(&self) -> Result<Vec<EventId>, EngineError> {
        self.ask_waitlist(WaitlistMsg::EventsWaiting).await
    }

    /// Fans waiting on an event's waitlist.
    pub async fn waitlist_len(&self, event_id: &EventId) -> Result<usize, EngineError> {
        let e = event_id.clone();
        self.ask_waitlist(|reply| WaitlistMsg::Len(e, reply)).await
    }
}
