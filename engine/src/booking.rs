//! Booking: holds (exact seats, best in a section, anywhere), releases and reads of holds and
//! orders. A hold reserves the user's quota in their ledger shard first (and settles the
//! idempotency key), then asks the section actor that owns the places.

use crate::hash::HashMap;
use std::sync::Arc;

use serde::Serialize;
use smallvec::SmallVec;
use tracing::Instrument;

use crate::catalog::Catalog;
use crate::codec;
use crate::core::{IdemTag, Pick, PlaceHold};
use crate::error::{EngineError, Rejection, only};
use crate::events::EventEntry;
use crate::events::EventTerms;
use crate::kernel::Kernel;
use crate::ledger::{Answer, Begin, BeginArgs, Rpc};
use crate::limits::PLACES_PER_HOLD_MAX;
use crate::section::SectionMsg;
use crate::types::{
    CheckedHold, EventId, HoldId, HoldRequest, HoldView, OrderCursor, OrderId, OrderView,
    OrdersPage, SectionId, Selection, UserId, check_user_id,
};
use crate::waitlist::WaitlistView;

/// Holds and their reads (see the module's doc): cheap to clone (a hold's work is detached
/// with a clone of it).
#[derive(Clone)]
pub(crate) struct Booking {
    kernel: Arc<Kernel>,
    catalog: Arc<Catalog>,
}

impl Booking {
    pub(crate) fn new(kernel: Arc<Kernel>, catalog: Arc<Catalog>) -> Booking {
        Booking { kernel, catalog }
    }
}

impl Booking {
    /// Holds places: exact seats, or best available in a section or anywhere in the event.
    /// Reserves the user's quota first and gives it back if the hold fails. A batch of one:
    /// see [`Booking::hold_batch`]. Runs to the end even if the caller stops waiting (see
    /// [`crate::kernel::detached`]).
    pub async fn hold(&self, req: HoldRequest) -> Result<HoldView, EngineError> {
        only(self.hold_items(vec![Item::of(req)]).await)
    }

    /// Places the hold a waitlist offer makes for `entry`'s fan: best available places of its
    /// section (any, for none), all or nothing, with no idempotency key of the fan's (a refusal
    /// is not remembered: the entry is tried again when places free up). The hold carries the
    /// entry's mark, so after a crash between this hold and the offer's record the hold is
    /// found again ([`Waitlist::waitlist_offer_made`](crate::waitlist_calls::Waitlist::waitlist_offer_made)) instead of a second one being placed.
    pub async fn hold_offer(&self, entry: &WaitlistView) -> Result<HoldView, EngineError> {
        let req = HoldRequest {
            event_id: entry.event_id.clone(),
            user_id: entry.user_id.clone(),
            idempotency_key: String::new(),
            selection: Selection::BestAvailable {
                section: entry.section_id.clone(),
                quantity: entry.quantity,
            },
            access_code: String::new(),
        };
        let mark = offer_mark(&entry.entry_id);
        let item = Item::of(req).map(|item| Item {
            mark: Some(mark),
            ..item
        });
        only(self.hold_items(vec![item]).await)
    }

    /// Holds many places at once, each request as a hold of its own would be (its own checks,
    /// idempotency key, quota and answer, in the order given): one message per ledger shard to
    /// begin them, one per section to place them (they share its group commit), one per
    /// shard to settle them. Requests of one user are decided in order, so they share the
    /// per-user limit. An error of the whole call (not ready) is every request's answer.
    /// Runs to the end even if the caller stops waiting.
    pub async fn hold_batch(&self, reqs: Vec<HoldRequest>) -> Vec<Result<HoldView, EngineError>> {
        self.hold_items(reqs.into_iter().map(Item::of).collect())
            .await
    }

    /// [`Booking::hold_batch`] of requests whose caller fields are checked already, all for the
    /// event of `terms` (read from the catalog once, for all of them): what a front that checked
    /// them in the contract's order calls. A request for another event is `EVENT_NOT_FOUND`.
    pub async fn hold_checked(
        &self,
        terms: &EventTerms,
        holds: Vec<CheckedHold>,
    ) -> Vec<Result<HoldView, EngineError>> {
        let items = holds
            .into_iter()
            .map(|hold| {
                let req = hold.into_request();
                if req.event_id != terms.event_id {
                    return Err(Rejection::EventNotFound.into());
                }
                Ok(Item {
                    req,
                    event: Some(terms.entry.0.clone()),
                    mark: None,
                })
            })
            .collect();
        self.hold_items(items).await
    }

    /// The one hold path: each item checked already, or its error.
    async fn hold_items(
        &self,
        items: Vec<Result<Item, EngineError>>,
    ) -> Vec<Result<HoldView, EngineError>> {
        let n = items.len();
        let booking = self.clone();
        let span = crate::trace::under_current(
            || tracing::info_span!(target: crate::trace::TARGET, "engine.hold", holds = n),
        );
        let work = async move { Ok(booking.hold_now(items).await) }.instrument(span);
        match crate::kernel::detached(work).await {
            Ok(answers) => answers,
            Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
        }
    }

    async fn hold_now(
        &self,
        items: Vec<Result<Item, EngineError>>,
    ) -> Vec<Result<HoldView, EngineError>> {
        let n = items.len();
        let mut out: Vec<Result<HoldView, EngineError>> =
            (0..n).map(|_| Err(EngineError::NotReady)).collect();
        if let Err(e) = self.kernel.check_ready() {
            return out.into_iter().map(|_| Err(e.clone())).collect();
        }
        // 1. Each request's own checks. Then rounds: a user's first request goes in round 0,
        //    their second in round 1, ... Each round runs to its end (its quotas settled, its
        //    keys' answers recorded) before the next begins, so a user's requests are decided
        //    one after the other, exactly as separate calls would be: a refused one gives its
        //    quota back before the next is checked, and a key given twice gets what a retry
        //    would. Most batches carry one request per user: one round.
        let round_of = rounds_of(&items);
        // Round 0 (every request of most batches, and a unary call's one), then the others.
        let mut first: Vec<(usize, HoldPlan)> = Vec::with_capacity(n);
        let mut later: Vec<Vec<(usize, HoldPlan)>> = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            let round = round_of.as_ref().map_or(0, |r| r[i]);
            match item.and_then(|item| self.plan_hold(item)) {
                Ok(plan) if round == 0 => first.push((i, plan)),
                Ok(plan) => {
                    if later.len() < round {
                        later.resize_with(round, Vec::new);
                    }
                    later[round - 1].push((i, plan));
                }
                Err(e) => out[i] = Err(e),
            }
        }
        // A user whose earlier requests failed their own checks may leave a round empty.
        for plans in std::iter::once(first).chain(later) {
            if !plans.is_empty() {
                self.hold_round(plans, &mut out).await;
            }
        }
        out
    }

    /// One round of a batch (at most one request per user): begun, placed and settled.
    async fn hold_round(
        &self,
        plans: Vec<(usize, HoldPlan)>,
        out: &mut [Result<HoldView, EngineError>],
    ) {
        let go = self.begin_round(plans, out).await;
        let (placed, taken) = self.place_round(&go).await;
        self.give_back_codes(&go, &placed, &taken);
        self.settle_round(go, placed, out).await;
    }

    /// Step 2, quota and keys, all shards at once: the plans that go on (a replayed or refused one
    /// is answered in `out`).
    async fn begin_round(
        &self,
        plans: Vec<(usize, HoldPlan)>,
        out: &mut [Result<HoldView, EngineError>],
    ) -> Vec<(usize, HoldPlan)> {
        let now = self.kernel.now_ms();
        let begun = self
            .kernel
            .ledger()
            .begin(plans.iter().map(|(_, p)| p.begin_args(now)).collect())
            .instrument(crate::trace::under_current(|| {
                tracing::info_span!(target: crate::trace::TARGET, "ledger.begin",
                    requests = plans.len())
            }))
            .await;
        let mut go = Vec::with_capacity(plans.len());
        for ((i, plan), begin) in plans.into_iter().zip(begun) {
            match begin {
                Ok(Begin::Proceed) => go.push((i, plan)),
                Ok(Begin::Replay(answer)) => out[i] = replayed_hold(answer),
                Err(e) => out[i] = Err(e),
            }
        }
        go
    }

    /// Step 3, the places: one message per section for holds of one section (placed in the order
    /// given; those a durable snapshot says are sold out answered without asking); then each
    /// hold in "any section", trying them one by one as a single hold does (these concurrently
    /// with each other). Each plan's answer, by its place in `go`.
    async fn place_round(
        &self,
        go: &[(usize, HoldPlan)],
    ) -> (Vec<Option<Result<HoldView, EngineError>>>, Vec<bool>) {
        let mut placed: Vec<Option<Result<HoldView, EngineError>>> =
            (0..go.len()).map(|_| None).collect();
        let (mut sections, mut anywhere) = by_section(go);
        self.skip_sold_out(go, &mut sections, &mut placed);
        let taken = self.take_codes(go, &mut sections, &mut anywhere, &mut placed);
        let sections = sections.into_iter().map(|(event, section, ks)| {
            let cmds = ks
                .iter()
                .map(|&k| go[k].1.command(section))
                .collect::<Vec<_>>();
            let span = section_span(event, section, cmds.len());
            async move {
                let answers = self
                    .kernel
                    .ask(event, section, |reply| {
                        SectionMsg::Hold(cmds, span.clone(), reply)
                    })
                    .instrument(span.clone())
                    .await;
                (ks, answers)
            }
        });
        let singles = anywhere.iter().map(|&k| {
            let plan = &go[k].1;
            async move { (k, self.place_anywhere(plan).await) }
        });
        let sections = crate::rt::join_all(sections).await;
        // "Any section" items are placed after the others (docs/api.md, HoldBatch).
        let singles = crate::rt::join_all(singles).await;
        for (ks, answers) in sections {
            match answers {
                Ok(answers) => {
                    for (k, a) in ks.into_iter().zip(answers) {
                        placed[k] = Some(a.map_err(EngineError::from));
                    }
                }
                Err(e) => {
                    for k in ks {
                        placed[k] = Some(Err(e.clone()));
                    }
                }
            }
        }
        for (k, a) in singles {
            placed[k] = Some(a);
        }
        (placed, taken)
    }

    /// Answers `SOLD_OUT` in `placed` for the items of each section that a snapshot of durable
    /// state says are sold out (see `sold_out_durably`), and leaves in `sections` the items to
    /// ask about (and the sections with any).
    fn skip_sold_out(
        &self,
        go: &[(usize, HoldPlan)],
        sections: &mut Sections<'_>,
        placed: &mut [Option<Result<HoldView, EngineError>>],
    ) {
        sections.retain_mut(|(event, section, ks)| {
            if let Some((free, sold_out)) = self.durably_free(event, section) {
                let asked = ks.len();
                ks.retain(|&mut k| {
                    let out = go[k].1.sold_out_at(free);
                    if out {
                        placed[k] = Some(Err(Rejection::SoldOut.into()));
                    }
                    !out
                });
                sold_out.increment((asked - ks.len()) as u64);
            }
            !ks.is_empty()
        });
    }

    /// Takes the access code uses of the items that have a code, before any is placed (see
    /// [`crate::access`]): an item whose code has too few left is answered
    /// `ACCESS_CODE_EXHAUSTED` in `placed` and is not asked for. Which items took uses (empty
    /// when no item has a code).
    fn take_codes(
        &self,
        go: &[(usize, HoldPlan)],
        sections: &mut Sections<'_>,
        anywhere: &mut Vec<usize>,
        placed: &mut [Option<Result<HoldView, EngineError>>],
    ) -> Vec<bool> {
        let redemptions = self.kernel.redemptions();
        // Empty (nothing taken) unless an item has a code: most sales have none.
        let mut taken = Vec::new();
        if go.iter().any(|(_, plan)| plan.code.is_some()) {
            taken = vec![false; go.len()];
        }
        let mut take = |k: usize| {
            let plan = &go[k].1;
            let Some((code, max)) = plan.code else {
                return true;
            };
            taken[k] = redemptions.take(&plan.event.event_id, code, max, plan.quantity);
            if !taken[k] {
                placed[k] = Some(Err(Rejection::AccessCodeExhausted.into()));
            }
            taken[k]
        };
        sections.retain_mut(|(_, _, ks)| {
            ks.retain(|&mut k| take(k));
            !ks.is_empty()
        });
        anywhere.retain(|&k| take(k));
        taken
    }

    /// Gives back the access code uses taken by [`Booking::take_codes`] for items that were not
    /// placed.
    fn give_back_codes(
        &self,
        go: &[(usize, HoldPlan)],
        placed: &[Option<Result<HoldView, EngineError>>],
        taken: &[bool],
    ) {
        for (((_, plan), answer), taken) in go.iter().zip(placed).zip(taken) {
            let placed = matches!(answer, Some(Ok(_)));
            if let (true, false, Some((code, _))) = (*taken, placed, plan.code) {
                self.kernel
                    .redemptions()
                    .give_back(&plan.event.event_id, code, plan.quantity);
            }
        }
    }

    /// Step 4, settle: successes with a key are recorded without waiting, failures give their quota
    /// back (and record a keyed refusal) before anyone hears of them; every answer into `out`.
    async fn settle_round(
        &self,
        go: Vec<(usize, HoldPlan)>,
        placed: Vec<Option<Result<HoldView, EngineError>>>,
        out: &mut [Result<HoldView, EngineError>],
    ) {
        let now = self.kernel.now_ms();
        let mut settled = Vec::new();
        let (mut failed, mut failed_at, mut refunds) = (Vec::new(), Vec::new(), Vec::new());
        for ((i, plan), answer) in go.into_iter().zip(placed) {
            let answer = answer.unwrap_or(Err(EngineError::NotReady));
            match &answer {
                Ok(_) if plan.tag.is_none() => {}
                Ok(view) => {
                    settled.push((plan.begin_args(now), Answer::Hold(Box::new(view.clone()))))
                }
                Err(_) if plan.tag.is_none() => refunds.push((
                    plan.event.event_id.clone(),
                    plan.user_id,
                    plan.quantity,
                    None,
                )),
                Err(e) => {
                    failed.push((plan.begin_args(now), Err(e.clone())));
                    failed_at.push(i);
                }
            }
            out[i] = answer;
        }
        self.kernel.ledger().settled(settled);
        self.kernel.ledger().refund(refunds);
        let finishing = crate::trace::under_current(|| {
            tracing::info_span!(target: crate::trace::TARGET, "ledger.finish",
                refusals = failed.len())
        });
        if let Err(e) = self
            .kernel
            .ledger()
            .finish(failed)
            .instrument(finishing)
            .await
        {
            // A refusal could not be recorded as its key's first answer: its caller hears
            // why instead (as a single hold's would).
            for i in failed_at {
                out[i] = Err(e.clone());
            }
        }
    }

    /// The free places of `section` by its published snapshot, if that snapshot shows durable
    /// state (its version is durable), with the section's `SOLD_OUT` counter.
    fn durably_free(
        &self,
        event: &EventEntry,
        section: &SectionId,
    ) -> Option<(u32, metrics::Counter)> {
        let slot = event.sections.iter().find(|s| &s.section_id == section)?;
        let (available, version) = {
            let snap = slot.snapshot.borrow();
            (snap.available, snap.version)
        };
        match self.kernel.router().durable_of(&event.event_id, section) {
            Some((durable, sold_out)) if durable >= version => Some((available, sold_out)),
            _ => None,
        }
    }

    /// What a checked hold asks of the ledger and the sections: its event (from the catalog,
    /// unless the item carries it) and its selection judged against it.
    fn plan_hold(&self, item: Item) -> Result<HoldPlan, EngineError> {
        let Item { req, event, mark } = item;
        let event = match event {
            Some(event) => event,
            None => self.catalog.entry(&req.event_id)?,
        };
        let (candidates, quantity, pick) = hold_plan(&event, &req.selection)?;
        let now = self.kernel.now_ms();
        if now < event.spec.sale_opens_at_ms {
            return Err(Rejection::SaleNotOpen.into());
        }
        // Refused here before anything is asked of the ledger; the section refuses too, in
        // its mailbox's order (a hold checked here before a pause reaches it afterwards).
        if let Some(r) = event.sale_state().refusal() {
            return Err(r.into());
        }
        let any = matches!(
            req.selection,
            Selection::BestAvailable { section: None, .. }
        );
        let (candidates, code) =
            event
                .spec
                .presale
                .judge(candidates, &req.access_code, any, now)?;
        let code = code.map(|c| (c, event.spec.presale.codes[c as usize].max_uses));
        let tag = hold_tag(&req);
        Ok(HoldPlan {
            event,
            user_id: req.user_id,
            candidates,
            quantity,
            pick,
            mark: mark.or_else(|| tag.clone()),
            tag,
            code,
        })
    }

    /// Places a hold for any section of its event: in the first of them that has the places.
    /// A section sold out by a durable snapshot is passed over; one whose snapshot is not
    /// durable yet is asked (its answer waits for what it depends on).
    async fn place_anywhere(&self, plan: &HoldPlan) -> Result<HoldView, EngineError> {
        for section in &plan.candidates {
            if self
                .durably_free(&plan.event, section)
                .is_some_and(|(free, _)| free < plan.quantity)
            {
                continue;
            }
            let cmds = vec![plan.command(section)];
            let span = section_span(&plan.event, section, 1);
            let answer = self
                .kernel
                .ask(&plan.event, section, |reply| {
                    SectionMsg::Hold(cmds, span.clone(), reply)
                })
                .instrument(span.clone())
                .await
                .and_then(|mut answers| {
                    answers
                        .pop()
                        .ok_or(EngineError::NotReady)?
                        .map_err(Into::into)
                });
            match answer {
                Err(EngineError::Rejected(Rejection::SoldOut)) => continue,
                answer => return answer,
            }
        }
        Err(Rejection::SoldOut.into())
    }

    /// The first answer already given to this request's idempotency key, if it was settled with
    /// this same request; `None` otherwise (no key, unknown key, other request, in flight).
    /// Changes nothing: for callers that must answer a replay before re-checking permissions
    /// that may have lapsed since (an admission window).
    pub async fn replayed_hold(
        &self,
        req: &HoldRequest,
    ) -> Result<Option<Result<HoldView, EngineError>>, EngineError> {
        self.kernel.check_ready()?;
        let Some(tag) = hold_tag(req) else {
            return Ok(None);
        };
        let found = self
            .kernel
            .ledger()
            .lookup(req.user_id.clone(), Rpc::Hold, tag, self.kernel.now_ms())
            .await?;
        Ok(found.map(replayed_hold))
    }

    /// Releases a hold (by its holder). Its places are free again and count against nobody.
    /// Runs to the end even if the caller stops waiting.
    pub async fn release(
        &self,
        hold_id: &HoldId,
        user_id: &UserId,
    ) -> Result<HoldView, EngineError> {
        let (booking, h, u) = (self.clone(), hold_id.clone(), user_id.clone());
        crate::kernel::detached(async move { booking.release_now(&h, &u).await }).await
    }

    async fn release_now(
        &self,
        hold_id: &HoldId,
        user_id: &UserId,
    ) -> Result<HoldView, EngineError> {
        self.kernel.check_ready()?;
        check_user_id(user_id)?;
        let (event_id, section_id) = hold_id.route().ok_or(Rejection::HoldNotFound)?;
        let event = self
            .catalog
            .entry(&event_id)
            .map_err(|_| Rejection::HoldNotFound)?;
        let (h, u) = (hold_id.clone(), user_id.clone());
        self.kernel
            .ask(&event, &section_id, |reply| {
                SectionMsg::Release(h, u, reply)
            })
            .await
            .map_err(not_found_as(Rejection::HoldNotFound))
    }

    /// A hold as it is now.
    pub async fn get_hold(&self, hold_id: &HoldId) -> Result<HoldView, EngineError> {
        self.kernel.check_ready()?;
        let (event_id, section_id) = hold_id.route().ok_or(Rejection::HoldNotFound)?;
        let event = self
            .catalog
            .entry(&event_id)
            .map_err(|_| Rejection::HoldNotFound)?;
        let h = hold_id.clone();
        self.kernel
            .ask(&event, &section_id, |reply| SectionMsg::GetHold(h, reply))
            .await
            .map_err(not_found_as(Rejection::HoldNotFound))
    }

    /// A hold as it is now, to its holder only: another user's hold is `HOLD_NOT_FOUND`,
    /// exactly as an unknown id is (nothing tells them apart).
    pub async fn get_hold_of(
        &self,
        hold_id: &HoldId,
        user_id: &UserId,
    ) -> Result<HoldView, EngineError> {
        check_user_id(user_id)?;
        let h = self.get_hold(hold_id).await?;
        owned_by(h, |h| &h.user_id, user_id, Rejection::HoldNotFound)
    }

    /// An order, to its buyer only: another user's order is `ORDER_NOT_FOUND`, exactly as an
    /// unknown id is.
    pub async fn get_order_of(
        &self,
        order_id: &OrderId,
        user_id: &UserId,
    ) -> Result<OrderView, EngineError> {
        check_user_id(user_id)?;
        let o = self.get_order(order_id).await?;
        owned_by(o, |o| &o.user_id, user_id, Rejection::OrderNotFound)
    }

    /// An order.
    pub async fn get_order(&self, order_id: &OrderId) -> Result<OrderView, EngineError> {
        self.kernel.check_ready()?;
        let (event_id, section_id) = order_id.route().ok_or(Rejection::OrderNotFound)?;
        let event = self
            .catalog
            .entry(&event_id)
            .map_err(|_| Rejection::OrderNotFound)?;
        let o = order_id.clone();
        self.kernel
            .ask(&event, &section_id, |reply| SectionMsg::GetOrder(o, reply))
            .await
            .map_err(not_found_as(Rejection::OrderNotFound))
    }

    /// `user_id`'s orders, newest first (by creation time, then order id), of one event or of
    /// every event, those before `before` only if given, at most `limit` (and whether more
    /// follow). Each section is asked in its mailbox's order, as `GetOrder` is, so a page shows
    /// every order that was acknowledged before it was asked for. An unknown event is
    /// `EVENT_NOT_FOUND`.
    pub async fn list_orders(
        &self,
        user_id: &UserId,
        event_id: Option<&EventId>,
        before: Option<OrderCursor>,
        limit: usize,
    ) -> Result<OrdersPage, EngineError> {
        self.kernel.check_ready()?;
        check_user_id(user_id)?;
        let events = match event_id {
            Some(id) => vec![self.catalog.entry(id)?],
            None => self.catalog.entries(),
        };
        let mut asking = Vec::new();
        for event in &events {
            for section in &event.sections {
                let (user, before) = (user_id.clone(), before.clone());
                asking.push(self.kernel.ask(event, &section.section_id, move |reply| {
                    SectionMsg::OrdersOf(user, before, limit + 1, reply)
                }));
            }
        }
        let mut orders: Vec<OrderView> = futures_util::future::try_join_all(asking)
            .await?
            .into_iter()
            .flatten()
            .collect();
        orders.sort_by(|a, b| (b.created_at_ms, &b.order_id).cmp(&(a.created_at_ms, &a.order_id)));
        let more = orders.len() > limit;
        orders.truncate(limit);
        Ok(OrdersPage { orders, more })
    }

    /// Places the user holds or owns for the event, as the ledger counts them.
    pub async fn user_usage(
        &self,
        event_id: &EventId,
        user_id: &UserId,
    ) -> Result<u32, EngineError> {
        self.kernel
            .ledger()
            .usage(event_id.clone(), user_id.clone())
            .await
    }
}

pub(crate) use codec::fingerprint;

/// The span of one section's part of a hold call ([`crate::trace`]): its queue, the decision
/// and the wait until the decision is durable.
fn section_span(event: &EventEntry, section: &SectionId, holds: usize) -> tracing::Span {
    crate::trace::under_current(|| {
        tracing::info_span!(target: crate::trace::TARGET, "section",
            event = event.event_id.as_str(), section = section.as_str(), holds)
    })
}

/// A hold request's idempotency tag: its key, and a fingerprint of what it asks (its access
/// code too, if it has one; without, the fingerprint of earlier builds).
fn hold_tag(req: &HoldRequest) -> Option<IdemTag> {
    let (key, event, selection) = (&req.idempotency_key, &req.event_id, &req.selection);
    if req.access_code.is_empty() {
        idem_tag(key, &(Rpc::Hold, event, selection))
    } else {
        idem_tag(key, &(Rpc::Hold, event, selection, &req.access_code))
    }
}

pub(crate) fn idem_tag<T: Serialize>(key: &str, request: &T) -> Option<IdemTag> {
    (!key.is_empty()).then(|| IdemTag {
        key: key.to_owned(),
        fingerprint: fingerprint(request),
    })
}

/// The mark the hold of an offer to waitlist entry `entry_id` carries in its record, where a
/// fan's hold carries its idempotency key: one per entry (an entry is offered once). Its
/// fingerprint is the entry's, not any request's: a fan's hold sent with the same key is never
/// answered with the offer (it is refused as a reused key once the ledger knows the mark).
pub(crate) fn offer_mark(entry_id: &str) -> IdemTag {
    let key = format!("waitlist-offer:{entry_id}");
    idem_tag(&key, &(Rpc::Hold, entry_id)).unwrap_or(IdemTag {
        key,
        fingerprint: 0,
    })
}

/// `found` if `user` owns it, else `not_found` (the answer for an unknown id).
pub(crate) fn owned_by<T>(
    found: T,
    owner: impl Fn(&T) -> &UserId,
    user: &UserId,
    not_found: Rejection,
) -> Result<T, EngineError> {
    if owner(&found) == user {
        Ok(found)
    } else {
        Err(not_found.into())
    }
}

pub(crate) fn not_found_as(r: Rejection) -> impl Fn(EngineError) -> EngineError {
    move |e| match e {
        EngineError::Rejected(Rejection::SectionNotFound) => r.clone().into(),
        e => e,
    }
}

pub(crate) fn replayed_hold(answer: Result<Answer, Rejection>) -> Result<HoldView, EngineError> {
    match answer {
        Ok(Answer::Hold(v)) => Ok(*v),
        Ok(Answer::Order(_)) => Err(Rejection::IdempotencyKeyReused.into()),
        Err(r) => Err(r.into()),
    }
}

pub(crate) fn replayed_order(answer: Result<Answer, Rejection>) -> Result<OrderView, EngineError> {
    match answer {
        Ok(Answer::Order(v)) => Ok(*v),
        Ok(Answer::Hold(_)) => Err(Rejection::IdempotencyKeyReused.into()),
        Err(r) => Err(r.into()),
    }
}

/// A checked hold request: its event, the sections it may try, and its ledger terms.
struct HoldPlan {
    event: Arc<EventEntry>,
    user_id: UserId,
    candidates: Vec<SectionId>,
    quantity: u32,
    pick: Pick,
    /// The request's key, for the ledger (replays, in flight, remembered refusals).
    tag: Option<IdemTag>,
    /// What the hold's record carries: the request's key, or a waitlist offer's mark.
    mark: Option<IdemTag>,
    /// The access code it is placed under: its number and its cap of uses.
    code: Option<(u32, u32)>,
}

impl HoldPlan {
    fn begin_args(&self, now_ms: u64) -> BeginArgs {
        BeginArgs {
            event_id: self.event.event_id.clone(),
            user_id: self.user_id.clone(),
            limit: self.event.per_user_limit(),
            cooldown_ms: self.event.hold_cooldown_ms(),
            rpc: Rpc::Hold,
            tag: self.tag.clone(),
            quantity: self.quantity,
            now_ms,
        }
    }

    /// Whether a section with `free` places is sold out for this hold (best available only:
    /// exact seats are the section's to judge).
    fn sold_out_at(&self, free: u32) -> bool {
        matches!(self.pick, Pick::Best(_)) && free < self.quantity
    }

    fn command(&self, section: &SectionId) -> PlaceHold {
        PlaceHold {
            hold_id: HoldId::generate(&self.event.event_id, section),
            user_id: self.user_id.clone(),
            pick: self.pick.clone(),
            ttl_ms: self.event.hold_ttl_ms(),
            idem: self.mark.clone(),
            code: self.code.map(|(c, _)| c),
        }
    }
}

/// Which sections a hold may try, how many places it takes, and how each section picks them.
fn hold_plan(
    event: &EventEntry,
    selection: &Selection,
) -> Result<(Vec<SectionId>, u32, Pick), Rejection> {
    match selection {
        Selection::Seats(ids) => {
            if ids.is_empty() {
                return Err(Rejection::invalid("seat_ids", "name at least one seat"));
            }
            let mut section: Option<&str> = None;
            for id in ids {
                let (s, _, _) = id.parse().ok_or_else(|| {
                    Rejection::invalid("seat_ids", "a seat id is {section_id}:{row}:{number}")
                })?;
                match section {
                    None => section = Some(s),
                    Some(prev) if prev != s => {
                        return Err(Rejection::invalid(
                            "seat_ids",
                            "all seats of one hold must be in one section",
                        ));
                    }
                    Some(_) => {}
                }
            }
            let section = SectionId::from(section.unwrap_or_default());
            if !event.sections.iter().any(|s| s.section_id == section) {
                return Err(Rejection::SeatNotFound(ids[0].clone()));
            }
            let quantity = u32::try_from(ids.len()).unwrap_or(u32::MAX);
            Ok((vec![section], quantity, Pick::Seats(ids.clone())))
        }
        Selection::BestAvailable { section, quantity } => {
            if *quantity == 0 || *quantity > PLACES_PER_HOLD_MAX {
                return Err(Rejection::invalid(
                    "quantity",
                    format!("must be 1 to {}", PLACES_PER_HOLD_MAX),
                ));
            }
            let candidates = match section {
                Some(s) => {
                    if !event.sections.iter().any(|slot| &slot.section_id == s) {
                        return Err(Rejection::SectionNotFound);
                    }
                    vec![s.clone()]
                }
                None => event
                    .sections
                    .iter()
                    .map(|s| s.section_id.clone())
                    .collect(),
            };
            Ok((candidates, *quantity, Pick::Best(*quantity)))
        }
    }
}

/// The round of each item: a user's first request is in round 0, their second in round 1
/// (an item that failed its checks takes no round of its user's). `None`: all in round 0 (a
/// batch of one).
fn rounds_of(items: &[Result<Item, EngineError>]) -> Option<Vec<usize>> {
    if items.len() == 1 {
        return None;
    }
    let mut seen: HashMap<&str, usize> =
        HashMap::with_capacity_and_hasher(items.len(), Default::default());
    let rounds = items.iter().map(|item| match item {
        Ok(item) => {
            let k = seen.entry(item.req.user_id.as_str()).or_insert(0);
            *k += 1;
            *k - 1
        }
        Err(_) => 0,
    });
    Some(rounds.collect())
}

/// A hold request whose caller fields are checked, with its event if the caller read it
/// already, and the mark its record carries in place of the request's key (a waitlist
/// offer's), if any.
struct Item {
    req: HoldRequest,
    event: Option<Arc<EventEntry>>,
    mark: Option<IdemTag>,
}

impl Item {
    /// A request checked: its caller fields, once.
    fn of(req: HoldRequest) -> Result<Item, EngineError> {
        Ok(Item {
            req: req.checked()?.into_request(),
            event: None,
            mark: None,
        })
    }
}

/// The items of a round for one section: the event, the section, their places in the round
/// (kept inline: most rounds have one section, and a unary call one item).
type SectionItems<'a> = (&'a EventEntry, &'a SectionId, SmallVec<[usize; 4]>);

/// A round's sections, kept inline for the one section of most rounds.
type Sections<'a> = SmallVec<[SectionItems<'a>; 1]>;

/// The plans of a round for exactly one section, grouped by section (in the order first
/// named), and the places of those for any section.
fn by_section(go: &[(usize, HoldPlan)]) -> (Sections<'_>, Vec<usize>) {
    let mut by_section = Sections::new();
    let mut anywhere = Vec::new();
    for (k, (_, plan)) in go.iter().enumerate() {
        if let [section] = plan.candidates.as_slice() {
            match by_section
                .iter_mut()
                .find(|(e, s, _)| e.event_id == plan.event.event_id && *s == section)
            {
                Some((_, _, ks)) => ks.push(k),
                None => by_section.push((&plan.event, section, smallvec::smallvec![k])),
            }
        } else {
            anywhere.push(k);
        }
    }
    (by_section, anywhere)
}
