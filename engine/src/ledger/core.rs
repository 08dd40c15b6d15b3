//! [`ShardState`]: one ledger shard as plain state, no IO, no actor, no metrics. It decides what a
//! request comes to (`decide_begin`, `decide_finish`: records to log and answers to give) and keeps
//! its in-memory bookkeeping as it decides (quota reserved, keys in flight): those are not logged
//! (recovery derives quotas from the sections). The only logged change, a refusal given as a
//! key's first answer, goes through `apply`.
//!
//! A key's first answer is kept for the idempotency window from the time it was given
//! ([`crate::retention`]): a lookup past it finds nothing (a new request), and each request
//! forgets a bounded number of answers whose window has passed.

use crate::hash::HashMap;
use serde::{Deserialize, Serialize};

use crate::core::IdemTag;
use crate::error::{EngineError, Rejection};
use crate::limits::{FORGET_PER_STEP_MAX, IDEMPOTENCY_WINDOW_MS_DEFAULT};
use crate::retention::{ForgetBuckets, window_passed};
use crate::types::{EventId, HoldView, OrderView, UserId};

/// What `begin` decided.
#[derive(Debug)]
pub(crate) enum Begin {
    /// Go ahead: quota (if any) is reserved and the key is marked in flight.
    Proceed,
    /// The key was used before with this request: here is its first answer.
    Replay(Result<Answer, Rejection>),
}

pub(crate) struct BeginArgs {
    pub event_id: EventId,
    pub user_id: UserId,
    pub limit: u32,
    pub rpc: Rpc,
    pub tag: Option<IdemTag>,
    pub quantity: u32,
    /// The event's hold cool-down, ms (0: none): a user whose hold expired less than this long
    /// ago is refused (`HoldCooldown`). Only a fan's own hold has one (not a waitlist offer).
    pub cooldown_ms: u64,
    /// Now, by the engine's clock: answers older than the window are forgotten, and a
    /// rejection recorded by this request is recorded at this time.
    pub now_ms: u64,
}

/// Which RPC an idempotency key belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Rpc {
    /// `Hold`.
    Hold,
    /// `Confirm`.
    Confirm,
}

/// A success answer kept for replays.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// The hold as first answered (boxed: a shard keeps a million answers, most of them
    /// holds, and moves each as it recovers; the encoding is the view's).
    Hold(Box<HoldView>),
    /// The order as first answered (boxed: an order is much larger than a hold).
    Order(Box<OrderView>),
}

impl Answer {
    /// When the answer was given: the hold's placement, the order's creation.
    pub fn at_ms(&self) -> u64 {
        match self {
            Answer::Hold(h) => h.placed_at_ms,
            Answer::Order(o) => o.created_at_ms,
        }
    }
}

/// What the ledger's own stream records: rejections given as first answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerRecord {
    /// A request with an idempotency key was refused; replays get the same refusal.
    RejectionRecorded {
        /// The user.
        user_id: UserId,
        /// The RPC.
        rpc: Rpc,
        /// Key and fingerprint.
        tag: IdemTag,
        /// The answer.
        rejection: Rejection,
        /// When it was given (the idempotency window counts from here).
        at_ms: u64,
    },
}

#[derive(Clone, Debug)]
enum Entry {
    InFlight(u64),
    Done {
        fingerprint: u64,
        /// When the answer was given.
        at_ms: u64,
        answer: Result<Answer, Rejection>,
    },
}

/// What recovery gives a shard ([`ShardState::recover`]): places held or sold by a user, or a
/// key's answer (with its time).
#[cfg_attr(test, derive(Clone))]
pub(crate) enum Settled {
    Quota(EventId, UserId, u32),
    Answer(UserId, Rpc, IdemTag, u64, Result<Answer, Rejection>),
}

/// An idempotency key: per user and RPC.
type KeyParts = (UserId, Rpc, String);

/// A key as the shard keeps it: once, shared by its map and its index of answers to forget
/// (a start rebuilds a million of them). Looked up by its parts.
type KeyId = std::sync::Arc<KeyParts>;

/// The state of one ledger shard.
pub(crate) struct ShardState {
    /// Places held or sold, by event, then user (looked up by reference: no key is built).
    quotas: HashMap<EventId, HashMap<UserId, u32>>,
    keys: HashMap<KeyId, Entry>,
    /// Settled keys by the time of their answer: the order they are forgotten in.
    answered: ForgetBuckets<KeyId>,
    /// The idempotency window, ms.
    window_ms: u64,
    /// When each user's latest hold of an event expired (for the hold cool-down), as this shard
    /// learned it; in memory only (a restart forgets it), dropped a day after.
    expired: HashMap<(EventId, UserId), u64>,
    /// When `expired` was last scanned for what is a day old.
    expired_pruned_at: u64,
}

impl Default for ShardState {
    fn default() -> ShardState {
        ShardState::new(IDEMPOTENCY_WINDOW_MS_DEFAULT)
    }
}

/// What a shard's checkpoint holds: its recorded rejections, with their times (successes live
/// in the sections).
type ShardCheckpoint = Vec<(UserId, Rpc, IdemTag, u64, Rejection)>;

/// Expiries kept for the hold cool-down before old ones are dropped.
const EXPIRED_KEPT_MAX: usize = 100_000;

impl ShardState {
    /// An empty shard keeping answers for `window_ms` (at least 1 ms).
    pub fn new(window_ms: u64) -> ShardState {
        ShardState {
            quotas: HashMap::default(),
            keys: HashMap::default(),
            answered: ForgetBuckets::default(),
            window_ms: window_ms.max(1),
            expired: HashMap::default(),
            expired_pruned_at: 0,
        }
    }

    /// `user_id`'s hold of `event_id` expired at `at_ms` (the hold cool-down starts). Entries
    /// older than the longest cool-down (a day) are dropped as the map grows.
    pub(crate) fn expired(&mut self, event_id: EventId, user_id: UserId, at_ms: u64) {
        // Past the bound, a scan drops what is a day old: at most once a minute, so a map full
        // of recent expiries is not scanned at every one.
        if self.expired.len() >= EXPIRED_KEPT_MAX && at_ms >= self.expired_pruned_at + 60_000 {
            let horizon = at_ms.saturating_sub(crate::limits::HOLD_TTL_MS_MAX);
            self.expired.retain(|_, at| *at >= horizon);
            self.expired_pruned_at = at_ms;
        }
        let at = self.expired.entry((event_id, user_id)).or_insert(at_ms);
        *at = (*at).max(at_ms);
    }

    /// Until when `args`' user is cooling down after a hold of theirs expired, if still.
    fn cooling_until(&self, args: &BeginArgs) -> Option<u64> {
        if args.cooldown_ms == 0 {
            return None;
        }
        let key = (args.event_id.clone(), args.user_id.clone());
        let until = self.expired.get(&key)?.saturating_add(args.cooldown_ms);
        (args.now_ms < until).then_some(until)
    }

    pub fn add_quota(&mut self, event_id: EventId, user_id: UserId, quantity: u32) {
        *self
            .quotas
            .entry(event_id)
            .or_default()
            .entry(user_id)
            .or_default() += quantity;
    }

    /// Records a key's first answer, given at `at_ms`. A key used again after its window may
    /// have several answers in the log (recovery meets them in any order): the latest wins.
    pub fn add_answer(
        &mut self,
        user_id: UserId,
        rpc: Rpc,
        tag: &IdemTag,
        at_ms: u64,
        answer: Result<Answer, Rejection>,
    ) {
        let key = (user_id, rpc, tag.key.clone());
        if let Some(Entry::Done { at_ms: newer, .. }) = self.keys.get(&key)
            && *newer > at_ms
        {
            return;
        }
        self.set_entry(
            KeyId::new(key),
            Entry::Done {
                fingerprint: tag.fingerprint,
                at_ms,
                answer,
            },
        );
    }

    /// Recovery's bulk form of [`ShardState::add_quota`] and [`ShardState::add_answer`] (the
    /// same state in the end, the latest answer of a key winning): the keys' map is sized once
    /// for `hint` more keys and the index of answers to forget is built once, after them all.
    pub fn recover(&mut self, items: impl IntoIterator<Item = Settled>, hint: usize) {
        use std::collections::hash_map::Entry as Slot;
        self.keys.reserve(hint);
        // A section's places come one after another: its event's users are kept at hand.
        let mut event: Option<(EventId, HashMap<UserId, u32>)> = None;
        for item in items {
            let (key, fingerprint, at_ms, answer) = match item {
                Settled::Quota(event_id, user_id, places) => {
                    if !matches!(&event, Some((id, _)) if *id == event_id) {
                        if let Some((id, users)) = event.take() {
                            self.quotas.insert(id, users);
                        }
                        let users = self.quotas.remove(&event_id).unwrap_or_default();
                        event = Some((event_id, users));
                    }
                    if let Some((_, users)) = &mut event {
                        *users.entry(user_id).or_default() += places;
                    }
                    continue;
                }
                Settled::Answer(user_id, rpc, tag, at_ms, answer) => {
                    let key = KeyId::new((user_id, rpc, tag.key));
                    (key, tag.fingerprint, at_ms, answer)
                }
            };
            let done = Entry::Done {
                fingerprint,
                at_ms,
                answer,
            };
            match self.keys.entry(key) {
                Slot::Vacant(slot) => {
                    slot.insert(done);
                }
                Slot::Occupied(mut slot) => {
                    if !matches!(slot.get(), Entry::Done { at_ms: newer, .. } if *newer > at_ms) {
                        slot.insert(done);
                    }
                }
            }
        }
        if let Some((id, users)) = event {
            self.quotas.insert(id, users);
        }
        self.answered =
            ForgetBuckets::of(self.keys.iter().filter_map(|(key, entry)| match entry {
                Entry::Done { at_ms, .. } => Some((*at_ms, key.clone())),
                Entry::InFlight(_) => None,
            }));
    }

    /// Sets a key's entry, keeping the index of answers to forget exact.
    fn set_entry(&mut self, key: KeyId, entry: Entry) {
        if let Some(Entry::Done { at_ms, .. }) = self.keys.get(&key) {
            self.answered.remove(*at_ms, &key);
        }
        if let Entry::Done { at_ms, .. } = &entry {
            self.answered.insert(*at_ms, key.clone());
        }
        self.keys.insert(key, entry);
    }

    fn remove_key(&mut self, key: &KeyParts) {
        if let Some((key, Entry::Done { at_ms, .. })) = self.keys.remove_entry(key) {
            self.answered.remove(at_ms, &key);
        }
    }

    /// Forgets at most `max` answers whose window has passed at `now_ms`; returns how many.
    pub fn forget_due(&mut self, now_ms: u64, max: usize) -> usize {
        let due = self.answered.pop_due(now_ms, self.window_ms, max);
        for key in &due {
            self.keys.remove(key);
        }
        due.len()
    }

    /// Keys remembered (settled and in flight).
    pub fn keys_len(&self) -> usize {
        self.keys.len()
    }

    /// The entry of a key, unless it is an answer whose window has passed at `now_ms`.
    fn live_entry(&self, key: &KeyParts, now_ms: u64) -> Option<&Entry> {
        match self.keys.get(key) {
            Some(Entry::Done { at_ms, .. }) if window_passed(*at_ms, now_ms, self.window_ms) => {
                None
            }
            other => other,
        }
    }

    pub(crate) fn checkpoint_state(&self) -> ShardCheckpoint {
        self.keys
            .iter()
            .filter_map(|(k, e)| match (&**k, e) {
                (
                    (user, rpc, key),
                    Entry::Done {
                        fingerprint,
                        at_ms,
                        answer: Err(r),
                    },
                ) => Some((
                    user.clone(),
                    *rpc,
                    IdemTag {
                        key: key.clone(),
                        fingerprint: *fingerprint,
                    },
                    *at_ms,
                    r.clone(),
                )),
                _ => None,
            })
            .collect()
    }

    /// Everything the shard holds, in a fixed order (tests compare shards with it).
    #[cfg(test)]
    pub(crate) fn digest(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .quotas
            .iter()
            .flat_map(|(e, users)| users.iter().map(move |(u, q)| ((e, u), q)))
            .map(|(k, q)| format!("quota {k:?} {q}"))
            .chain(self.keys.iter().map(|(k, e)| format!("key {k:?} {e:?}")))
            .collect();
        lines.sort();
        lines
    }

    /// The recorded rejections, to be redistributed over shards.
    pub fn into_rejections(self) -> ShardCheckpoint {
        self.checkpoint_state()
    }

    /// Loads a checkpoint blob written by `checkpoint_state`.
    pub fn load_checkpoint(&mut self, blob: &[u8]) -> Result<(), crate::codec::DecodeError> {
        let entries: ShardCheckpoint = crate::codec::decode(blob)?;
        for (user, rpc, tag, at_ms, r) in entries {
            self.add_answer(user, rpc, &tag, at_ms, Err(r));
        }
        Ok(())
    }

    pub fn apply(&mut self, record: LedgerRecord) {
        match record {
            LedgerRecord::RejectionRecorded {
                user_id,
                rpc,
                tag,
                rejection,
                at_ms,
            } => self.add_answer(user_id, rpc, &tag, at_ms, Err(rejection)),
        }
    }
}

/// What a `begin` comes to.
#[derive(Debug)]
pub(crate) enum BeginDecision {
    /// Answer at once (replay, key in flight or reused, quota refused without a key).
    Answer(Result<Begin, EngineError>),
    /// A refusal to record durably, then answer with this replay of it.
    Record(LedgerRecord, Begin),
}

impl BeginDecision {
    /// Whether this is a refusal for the per-user limit.
    pub(crate) fn is_user_limit(&self) -> bool {
        matches!(
            self,
            BeginDecision::Answer(Err(EngineError::Rejected(Rejection::UserLimit { .. })))
                | BeginDecision::Record(
                    LedgerRecord::RejectionRecorded {
                        rejection: Rejection::UserLimit { .. },
                        ..
                    },
                    _
                )
        )
    }
}

/// What a `finish` comes to.
#[derive(Debug)]
pub(crate) enum FinishDecision {
    /// Nothing to log.
    Done,
    /// A refusal to record durably before answering.
    Record(LedgerRecord),
}

impl ShardState {
    /// Starts a request: replays a settled key, refuses a reused or in-flight one, reserves
    /// quota (refusing past the limit) and marks the key in flight.
    /// A key whose answer is older than the window is unknown (a new request).
    pub(crate) fn decide_begin(&mut self, args: &BeginArgs) -> BeginDecision {
        self.forget_due(args.now_ms, FORGET_PER_STEP_MAX);
        if let Some(tag) = &args.tag {
            let k = (args.user_id.clone(), args.rpc, tag.key.clone());
            match self.live_entry(&k, args.now_ms) {
                Some(
                    Entry::InFlight(fp)
                    | Entry::Done {
                        fingerprint: fp, ..
                    },
                ) if *fp != tag.fingerprint => {
                    return BeginDecision::Answer(Err(Rejection::IdempotencyKeyReused.into()));
                }
                Some(Entry::InFlight(_)) => {
                    return BeginDecision::Answer(Err(Rejection::IdempotencyKeyInFlight.into()));
                }
                Some(Entry::Done { answer, .. }) => {
                    return BeginDecision::Answer(Ok(Begin::Replay(answer.clone())));
                }
                None => self.remove_key(&k),
            }
        }
        if args.quantity > 0 {
            let used = self.usage(&args.event_id, &args.user_id);
            let refused = if let Some(until_ms) = self.cooling_until(args) {
                Some(Rejection::HoldCooldown { until_ms })
            } else if used.saturating_add(args.quantity) > args.limit {
                Some(Rejection::UserLimit {
                    limit: args.limit,
                    used,
                })
            } else {
                None
            };
            if let Some(rejection) = refused {
                return match &args.tag {
                    Some(tag) => BeginDecision::Record(
                        rejection_record(args, tag, rejection.clone()),
                        Begin::Replay(Err(rejection)),
                    ),
                    None => BeginDecision::Answer(Err(rejection.into())),
                };
            }
            match self
                .quotas
                .get_mut(&args.event_id)
                .and_then(|users| users.get_mut(&args.user_id))
            {
                // The user holds places of this event already: no key to make.
                Some(q) => *q += args.quantity,
                None => {
                    self.add_quota(args.event_id.clone(), args.user_id.clone(), args.quantity);
                }
            }
        }
        if let Some(tag) = &args.tag {
            self.set_entry(
                KeyId::new((args.user_id.clone(), args.rpc, tag.key.clone())),
                Entry::InFlight(tag.fingerprint),
            );
        }
        BeginDecision::Answer(Ok(Begin::Proceed))
    }

    /// Ends a request: a failure gives its quota back; a success settles the key (durable in
    /// the section's record already); a definite refusal is to be recorded; anything else frees
    /// the key for a retry.
    pub(crate) fn decide_finish(
        &mut self,
        args: &BeginArgs,
        outcome: Result<Answer, EngineError>,
    ) -> FinishDecision {
        if outcome.is_err() && args.quantity > 0 {
            self.refund(&args.event_id, &args.user_id, args.quantity);
        }
        let Some(tag) = &args.tag else {
            return FinishDecision::Done;
        };
        match outcome {
            Ok(answer) => {
                self.settle(args, answer);
                FinishDecision::Done
            }
            // A sale paused or ended is the moment's answer, not the request's: a retry with the
            // key once the sale goes on is a new try (as after an indefinite error).
            Err(EngineError::Rejected(r))
                if !matches!(r, Rejection::SalePaused | Rejection::SaleEnded) =>
            {
                FinishDecision::Record(rejection_record(args, tag, r))
            }
            Err(_) => {
                self.remove_key(&(args.user_id.clone(), args.rpc, tag.key.clone()));
                FinishDecision::Done
            }
        }
    }

    /// A success's answer, kept for replays (durable already in the section's record) from
    /// the time it was given.
    pub(crate) fn settle(&mut self, args: &BeginArgs, answer: Answer) {
        self.forget_due(args.now_ms, FORGET_PER_STEP_MAX);
        if let Some(tag) = &args.tag {
            let at_ms = answer.at_ms();
            self.add_answer(args.user_id.clone(), args.rpc, tag, at_ms, Ok(answer));
        }
    }

    /// The settled first answer of a key, if the request matches and its window has not
    /// passed at `now_ms`.
    pub(crate) fn lookup(
        &self,
        user_id: UserId,
        rpc: Rpc,
        tag: IdemTag,
        now_ms: u64,
    ) -> Option<Result<Answer, Rejection>> {
        match self.live_entry(&(user_id, rpc, tag.key), now_ms) {
            Some(Entry::Done {
                fingerprint,
                answer,
                ..
            }) if *fingerprint == tag.fingerprint => Some(answer.clone()),
            _ => None,
        }
    }

    /// Places the user holds or owns for the event.
    pub(crate) fn usage(&self, event_id: &EventId, user_id: &UserId) -> u32 {
        self.quotas
            .get(event_id)
            .and_then(|users| users.get(user_id))
            .copied()
            .unwrap_or(0)
    }

    /// Gives back quota of a hold that ended or failed.
    ///
    /// # Panics
    /// If more comes back than was reserved: the ledger and the sections disagree (a bug), and
    /// the shard's actor stops (the engine then stops visibly).
    pub(crate) fn refund(&mut self, event_id: &EventId, user_id: &UserId, quantity: u32) {
        let users = self.quotas.get_mut(event_id);
        if let Some(used) = users.and_then(|users| users.get_mut(user_id)) {
            assert!(
                *used >= quantity,
                "ledger refund of {quantity} exceeds {used} reserved for {user_id} in {event_id}"
            );
            *used -= quantity;
            if *used == 0
                && let Some(users) = self.quotas.get_mut(event_id)
            {
                users.remove(user_id);
                if users.is_empty() {
                    self.quotas.remove(event_id);
                }
            }
        } else {
            panic!("ledger refund of {quantity} for {user_id} in {event_id} with nothing reserved");
        }
    }
}

fn rejection_record(args: &BeginArgs, tag: &IdemTag, rejection: Rejection) -> LedgerRecord {
    LedgerRecord::RejectionRecorded {
        user_id: args.user_id.clone(),
        rpc: args.rpc,
        tag: tag.clone(),
        rejection,
        at_ms: args.now_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{HoldId, HoldStatus, SectionId};

    const WINDOW: u64 = 10_000;

    fn args(key: &str, fingerprint: u64, quantity: u32, now_ms: u64) -> BeginArgs {
        BeginArgs {
            event_id: EventId::from("e"),
            user_id: UserId::from("u"),
            limit: 4,
            rpc: Rpc::Hold,
            tag: Some(IdemTag {
                key: key.into(),
                fingerprint,
            }),
            quantity,
            cooldown_ms: 0,
            now_ms,
        }
    }

    fn held_at(placed_at_ms: u64) -> Answer {
        Answer::Hold(Box::new(HoldView {
            hold_id: HoldId::generate(&EventId::from("e"), &SectionId::from("s")),
            event_id: EventId::from("e"),
            user_id: UserId::from("u"),
            section_id: SectionId::from("s"),
            seat_ids: Vec::new(),
            quantity: 1,
            status: HoldStatus::Held,
            placed_at_ms,
            expires_at_ms: placed_at_ms + 1_000,
            place_prices_cents: Vec::new(),
        }))
    }

    fn begin(state: &mut ShardState, a: &BeginArgs) -> Result<Begin, EngineError> {
        match state.decide_begin(a) {
            BeginDecision::Answer(r) => r,
            BeginDecision::Record(record, answer) => {
                state.apply(record);
                Ok(answer)
            }
        }
    }

    fn is_proceed(r: &Result<Begin, EngineError>) -> bool {
        matches!(r, Ok(Begin::Proceed))
    }

    /// Recovery's bulk load gives the state that adding each item one by one gives: the same
    /// quotas and keys, a key's latest answer kept (an older one met after it ignored, the
    /// later of two at the same time kept), and the same answers forgotten at each time.
    #[test]
    fn a_bulk_recovery_is_the_same_as_adding_one_by_one() {
        let tag = |key: &str, fingerprint| IdemTag {
            key: key.into(),
            fingerprint,
        };
        let items = {
            let mut items = Vec::new();
            // Keys repeat every 20 items, at other times: a key's answers meet in any order.
            // Places come in runs of one event, then of another, then of the first again.
            for i in 0..40u64 {
                let user = UserId::from(format!("u{}", i % 5).as_str());
                let event = EventId::from(["e", "f"][usize::from((i / 7) % 2 == 1)]);
                items.push(Settled::Quota(event, user.clone(), 1 + (i % 2) as u32));
                let (key, at) = (format!("k{}", i % 4), 1_000 + (i * 7919) % 500);
                let answer = if i % 3 == 0 {
                    Err(Rejection::SoldOut)
                } else {
                    Ok(held_at(at))
                };
                items.push(Settled::Answer(user, Rpc::Hold, tag(&key, i), at, answer));
            }
            // The same key at the same time twice: the later one is kept either way.
            for fingerprint in [1, 2] {
                let at = 1_200;
                items.push(Settled::Answer(
                    UserId::from("u0"),
                    Rpc::Confirm,
                    tag("same", fingerprint),
                    at,
                    Err(Rejection::SoldOut),
                ));
            }
            items
        };
        let mut one_by_one = ShardState::new(WINDOW);
        for item in items.clone() {
            match item {
                Settled::Quota(e, u, q) => one_by_one.add_quota(e, u, q),
                Settled::Answer(u, rpc, t, at, a) => one_by_one.add_answer(u, rpc, &t, at, a),
            }
        }
        let mut bulk = ShardState::new(WINDOW);
        bulk.recover(items, 3);
        assert_eq!(bulk.digest(), one_by_one.digest());
        assert!(bulk.digest().iter().any(|l| l.contains("fingerprint: 2")));
        for now in [10_999, 11_100, 11_250, 11_499, 12_000] {
            assert_eq!(
                bulk.forget_due(now, usize::MAX),
                one_by_one.forget_due(now, usize::MAX),
                "forgotten at {now}"
            );
            assert_eq!(bulk.digest(), one_by_one.digest(), "at {now}");
        }
        assert_eq!(bulk.keys_len(), 0);
    }

    /// A section's `SALE_PAUSED` (or `SALE_ENDED`) is not the key's answer: the retry once the
    /// sale goes on is a new try; a `SOLD_OUT` is kept and replayed.
    #[test]
    fn a_paused_sale_is_not_kept_as_the_keys_answer() {
        let mut s = ShardState::new(WINDOW);
        for r in [Rejection::SalePaused, Rejection::SaleEnded] {
            assert!(is_proceed(&begin(&mut s, &args("p", 7, 1, 0))));
            let d = s.decide_finish(&args("p", 7, 1, 1), Err(r.into()));
            assert!(matches!(d, FinishDecision::Done));
            assert!(is_proceed(&begin(&mut s, &args("p", 7, 1, 2))), "a new try");
            s.settle(&args("p", 7, 1, 2), held_at(2));
            s.refund(&EventId::from("e"), &UserId::from("u"), 1);
            s.remove_key(&(UserId::from("u"), Rpc::Hold, "p".to_owned()));
        }
        assert!(is_proceed(&begin(&mut s, &args("s", 7, 1, 3))));
        let d = s.decide_finish(&args("s", 7, 1, 4), Err(Rejection::SoldOut.into()));
        assert!(matches!(d, FinishDecision::Record(_)));
    }

    #[test]
    fn an_answer_replays_inside_the_window_and_is_forgotten_after_it() {
        let mut s = ShardState::new(WINDOW);
        assert!(is_proceed(&begin(&mut s, &args("k", 7, 1, 0))));
        let first = held_at(5);
        s.settle(&args("k", 7, 1, 5), first.clone());
        // Inside the window (counted from the answer's time, 5): the first answer, and another
        // request with the key is refused.
        let last_inside = 5 + WINDOW - 1;
        assert!(
            matches!(begin(&mut s, &args("k", 7, 1, last_inside)), Ok(Begin::Replay(Ok(a))) if a == first)
        );
        assert!(matches!(
            begin(&mut s, &args("k", 8, 1, last_inside)),
            Err(EngineError::Rejected(Rejection::IdempotencyKeyReused))
        ));
        let tag = args("k", 7, 1, 0).tag.unwrap();
        assert_eq!(
            s.lookup(UserId::from("u"), Rpc::Hold, tag.clone(), last_inside),
            Some(Ok(first))
        );
        // At the window's end the key is unknown: a lookup finds nothing, a retry is new.
        assert_eq!(
            s.lookup(UserId::from("u"), Rpc::Hold, tag, 5 + WINDOW),
            None
        );
        assert!(is_proceed(&begin(&mut s, &args("k", 8, 1, 5 + WINDOW))));
    }

    #[test]
    fn a_recorded_rejection_is_forgotten_after_the_window_too() {
        let mut s = ShardState::new(WINDOW);
        s.add_quota(EventId::from("e"), UserId::from("u"), 4);
        let refused = begin(&mut s, &args("r", 1, 1, 100));
        assert!(matches!(
            refused,
            Ok(Begin::Replay(Err(Rejection::UserLimit { .. })))
        ));
        // The rejection was recorded at 100: replayed until 100 + WINDOW.
        assert!(matches!(
            begin(&mut s, &args("r", 1, 1, 100 + WINDOW - 1)),
            Ok(Begin::Replay(Err(Rejection::UserLimit { .. })))
        ));
        // It survives a checkpoint with its time.
        let blob = crate::codec::encode(&s.checkpoint_state());
        let mut restored = ShardState::new(WINDOW);
        restored.load_checkpoint(&blob).unwrap();
        restored.add_quota(EventId::from("e"), UserId::from("u"), 4);
        assert_eq!(restored.checkpoint_state(), s.checkpoint_state());
        // After the window, the same request is decided afresh (refused again, and recorded
        // again with the new time).
        s.refund(&EventId::from("e"), &UserId::from("u"), 4);
        assert!(is_proceed(&begin(&mut s, &args("r", 1, 1, 100 + WINDOW))));
        match restored.decide_begin(&args("r", 1, 1, 100 + WINDOW)) {
            BeginDecision::Record(LedgerRecord::RejectionRecorded { at_ms, .. }, _) => {
                assert_eq!(at_ms, 100 + WINDOW);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_latest_answer_of_a_key_used_again_after_its_window_wins_in_any_order() {
        let tag = |fingerprint| IdemTag {
            key: "k".into(),
            fingerprint,
        };
        let u = || UserId::from("u");
        let (older, newer) = (held_at(7), held_at(WINDOW + 7));
        for order in [[0, 1], [1, 0]] {
            let mut s = ShardState::new(WINDOW);
            // Recovery may meet the newer answer first.
            for i in order {
                let (fp, at, answer) = [(1, 7, &older), (2, WINDOW + 7, &newer)][i];
                s.add_answer(u(), Rpc::Hold, &tag(fp), at, Ok(answer.clone()));
            }
            s.forget_due(WINDOW + 8, usize::MAX);
            let now = WINDOW + 8;
            assert_eq!(
                s.lookup(u(), Rpc::Hold, tag(2), now),
                Some(Ok(newer.clone()))
            );
            assert_eq!(s.lookup(u(), Rpc::Hold, tag(1), now), None);
        }
    }

    #[test]
    fn requests_forget_old_answers_a_bounded_number_at_a_time() {
        let mut s = ShardState::new(WINDOW);
        let n = 3 * FORGET_PER_STEP_MAX as u64;
        for i in 0..n {
            let key = format!("k{i}");
            assert!(is_proceed(&begin(&mut s, &args(&key, i, 0, i))));
            s.settle(&args(&key, i, 0, i), held_at(i));
        }
        assert_eq!(s.keys_len(), n as usize);
        let later = n + WINDOW;
        s.decide_begin(&args("new", 0, 0, later));
        assert_eq!(
            s.keys_len(),
            n as usize - FORGET_PER_STEP_MAX + 1,
            "one step forgets at most FORGET_PER_STEP_MAX"
        );
        assert_eq!(
            s.forget_due(later, usize::MAX),
            n as usize - FORGET_PER_STEP_MAX
        );
        assert_eq!(s.keys_len(), 1, "only the new key, in flight");
    }
}
