//! Booking: holds (exact seats, best in a section, anywhere), releases and reads of holds and
//! orders. A hold reserves the user's quota in their ledger shard first (and settles the
//! idempotency key), then asks the section actor that owns the places.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::catalog::EventEntry;
use crate::codec;
use crate::core::{IdemTag, Pick, PlaceHold};
use crate::engine::Engine;
use crate::error::{EngineError, Rejection};
use crate::ledger::{Answer, Begin, BeginArgs, Rpc};
use crate::limits::PLACES_PER_HOLD_MAX;
use crate::section::SectionMsg;
use crate::types::{
    EventId, HoldId, HoldRequest, HoldView, OrderId, OrderView, SectionId, Selection, UserId,
    check_idempotency_key, check_user_id,
};

impl Engine {
    /// Holds places: exact seats, or best available in a section or anywhere in the event.
    /// Reserves the user's quota first and gives it back if the hold fails. Runs to the end
    /// even if the caller stops waiting (see [`Engine::detached`]).
    pub async fn hold(&self, req: HoldRequest) -> Result<HoldView, EngineError> {
        let engine = self.clone();
        self.detached(async move { engine.hold_now(req).await })
            .await
    }

    async fn hold_now(&self, req: HoldRequest) -> Result<HoldView, EngineError> {
        self.check_ready()?;
        check_user_id(&req.user_id)?;
        check_idempotency_key(&req.idempotency_key)?;
        let event = self.entry(&req.event_id)?;
        let (candidates, quantity, pick) = hold_plan(&event, &req.selection)?;
        if self.now_ms() < event.spec.sale_opens_at_ms {
            return Err(Rejection::SaleNotOpen.into());
        }
        let tag = idem_tag(
            &req.idempotency_key,
            &(Rpc::Hold, &req.event_id, &req.selection),
        );
        let args = || BeginArgs {
            event_id: req.event_id.clone(),
            user_id: req.user_id.clone(),
            limit: event.spec.per_user_limit,
            rpc: Rpc::Hold,
            tag: tag.clone(),
            quantity,
            now_ms: self.now_ms(),
        };
        match self.inner.ledger.begin(args()).await? {
            Begin::Replay(answer) => return replayed_hold(answer),
            Begin::Proceed => {}
        }
        let mut outcome: Result<HoldView, EngineError> = Err(Rejection::SoldOut.into());
        let any_section = candidates.len() > 1;
        for section in candidates {
            if any_section {
                let slot = event.sections.iter().find(|s| s.section_id == section);
                if slot.is_some_and(|s| s.snapshot.borrow().available < quantity) {
                    continue;
                }
            }
            let cmd = PlaceHold {
                hold_id: HoldId::generate(&req.event_id, &section),
                user_id: req.user_id.clone(),
                pick: pick.clone(),
                ttl_ms: event.spec.hold_ttl_ms,
                idem: tag.clone(),
            };
            outcome = self
                .ask(&event, &section, |reply| SectionMsg::Hold(cmd, reply))
                .await;
            match &outcome {
                Err(EngineError::Rejected(Rejection::SoldOut)) if any_section => continue,
                _ => break,
            }
        }
        match &outcome {
            // Without a key, a success leaves nothing to settle: the quota stays reserved.
            Ok(_) if tag.is_none() => {}
            Ok(view) => self
                .inner
                .ledger
                .settled(args(), Answer::Hold(view.clone())),
            Err(e) => self.inner.ledger.finish(args(), Err(e.clone())).await?,
        }
        outcome
    }

    /// The first answer already given to this request's idempotency key, if it was settled with
    /// this same request; `None` otherwise (no key, unknown key, other request, in flight).
    /// Changes nothing: for callers that must answer a replay before re-checking permissions
    /// that may have lapsed since (an admission window).
    pub async fn replayed_hold(
        &self,
        req: &HoldRequest,
    ) -> Result<Option<Result<HoldView, EngineError>>, EngineError> {
        self.check_ready()?;
        let Some(tag) = idem_tag(
            &req.idempotency_key,
            &(Rpc::Hold, &req.event_id, &req.selection),
        ) else {
            return Ok(None);
        };
        let found = self
            .inner
            .ledger
            .lookup(req.user_id.clone(), Rpc::Hold, tag, self.now_ms())
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
        let (engine, h, u) = (self.clone(), hold_id.clone(), user_id.clone());
        self.detached(async move { engine.release_now(&h, &u).await })
            .await
    }

    async fn release_now(
        &self,
        hold_id: &HoldId,
        user_id: &UserId,
    ) -> Result<HoldView, EngineError> {
        self.check_ready()?;
        check_user_id(user_id)?;
        let (event_id, section_id) = hold_id.route().ok_or(Rejection::HoldNotFound)?;
        let event = self.entry(&event_id).map_err(|_| Rejection::HoldNotFound)?;
        let (h, u) = (hold_id.clone(), user_id.clone());
        self.ask(&event, &section_id, |reply| {
            SectionMsg::Release(h, u, reply)
        })
        .await
        .map_err(not_found_as(Rejection::HoldNotFound))
    }

    /// A hold as it is now.
    pub async fn get_hold(&self, hold_id: &HoldId) -> Result<HoldView, EngineError> {
        self.check_ready()?;
        let (event_id, section_id) = hold_id.route().ok_or(Rejection::HoldNotFound)?;
        let event = self.entry(&event_id).map_err(|_| Rejection::HoldNotFound)?;
        let h = hold_id.clone();
        self.ask(&event, &section_id, |reply| SectionMsg::GetHold(h, reply))
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
        self.check_ready()?;
        let (event_id, section_id) = order_id.route().ok_or(Rejection::OrderNotFound)?;
        let event = self
            .entry(&event_id)
            .map_err(|_| Rejection::OrderNotFound)?;
        let o = order_id.clone();
        self.ask(&event, &section_id, |reply| SectionMsg::GetOrder(o, reply))
            .await
            .map_err(not_found_as(Rejection::OrderNotFound))
    }

    /// Places the user holds or owns for the event, as the ledger counts them.
    pub async fn user_usage(
        &self,
        event_id: &EventId,
        user_id: &UserId,
    ) -> Result<u32, EngineError> {
        self.inner
            .ledger
            .usage(event_id.clone(), user_id.clone())
            .await
    }
}

pub(crate) fn fingerprint<T: Serialize>(value: &T) -> u64 {
    let bytes = codec::encode(value);
    let digest = Sha256::digest(&bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

pub(crate) fn idem_tag<T: Serialize>(key: &str, request: &T) -> Option<IdemTag> {
    (!key.is_empty()).then(|| IdemTag {
        key: key.to_owned(),
        fingerprint: fingerprint(request),
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
        Ok(Answer::Hold(v)) => Ok(v),
        Ok(Answer::Order(_)) => Err(Rejection::IdempotencyKeyReused.into()),
        Err(r) => Err(r.into()),
    }
}

pub(crate) fn replayed_order(answer: Result<Answer, Rejection>) -> Result<OrderView, EngineError> {
    match answer {
        Ok(Answer::Order(v)) => Ok(v),
        Ok(Answer::Hold(_)) => Err(Rejection::IdempotencyKeyReused.into()),
        Err(r) => Err(r.into()),
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
