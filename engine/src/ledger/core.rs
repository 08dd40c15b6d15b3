//! [`ShardState`]: one ledger shard as plain state, no IO, no actor, no metrics. It decides what a
//! request comes to (`decide_begin`, `decide_finish`: records to log and answers to give) and keeps
//! its in-memory bookkeeping as it decides (quota reserved, keys in flight): those are not logged
//! (recovery derives quotas from the sections). The only logged change, a refusal given as a
//! key's first answer, goes through `apply`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{Begin, BeginArgs};
use crate::core::IdemTag;
use crate::error::{EngineError, Rejection};
use crate::types::{EventId, HoldView, OrderView, UserId};

/// Which RPC an idempotency key belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rpc {
    /// `Hold`.
    Hold,
    /// `Confirm`.
    Confirm,
}

/// A success answer kept for replays.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// The hold as first answered.
    Hold(HoldView),
    /// The order as first answered.
    Order(OrderView),
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
    },
}

#[derive(Clone, Debug)]
enum Entry {
    InFlight(u64),
    Done(u64, Result<Answer, Rejection>),
}

/// The state of one ledger shard.
#[derive(Default)]
pub(crate) struct ShardState {
    quotas: HashMap<(EventId, UserId), u32>,
    keys: HashMap<(UserId, Rpc, String), Entry>,
}

/// What a shard's checkpoint holds: its recorded rejections (successes live in the sections).
type ShardCheckpoint = Vec<(UserId, Rpc, IdemTag, Rejection)>;

impl ShardState {
    pub fn add_quota(&mut self, event_id: EventId, user_id: UserId, quantity: u32) {
        *self.quotas.entry((event_id, user_id)).or_default() += quantity;
    }

    pub fn add_answer(
        &mut self,
        user_id: UserId,
        rpc: Rpc,
        tag: &IdemTag,
        answer: Result<Answer, Rejection>,
    ) {
        self.keys.insert(
            (user_id, rpc, tag.key.clone()),
            Entry::Done(tag.fingerprint, answer),
        );
    }

    pub(crate) fn checkpoint_state(&self) -> ShardCheckpoint {
        self.keys
            .iter()
            .filter_map(|((user, rpc, key), e)| match e {
                Entry::Done(fp, Err(r)) => Some((
                    user.clone(),
                    *rpc,
                    IdemTag {
                        key: key.clone(),
                        fingerprint: *fp,
                    },
                    r.clone(),
                )),
                _ => None,
            })
            .collect()
    }

    /// The recorded rejections, to be redistributed over shards.
    pub fn into_rejections(self) -> ShardCheckpoint {
        self.checkpoint_state()
    }

    /// Loads a checkpoint blob written by `checkpoint_state`.
    pub fn load_checkpoint(&mut self, blob: &[u8]) -> Result<(), crate::codec::DecodeError> {
        let entries: ShardCheckpoint = crate::codec::decode(blob)?;
        for (user, rpc, tag, r) in entries {
            self.add_answer(user, rpc, &tag, Err(r));
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
            } => self.add_answer(user_id, rpc, &tag, Err(rejection)),
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
    pub(crate) fn decide_begin(&mut self, args: &BeginArgs) -> BeginDecision {
        if let Some(tag) = &args.tag {
            let k = (args.user_id.clone(), args.rpc, tag.key.clone());
            match self.keys.get(&k) {
                Some(Entry::InFlight(fp) | Entry::Done(fp, _)) if *fp != tag.fingerprint => {
                    return BeginDecision::Answer(Err(Rejection::IdempotencyKeyReused.into()));
                }
                Some(Entry::InFlight(_)) => {
                    return BeginDecision::Answer(Err(Rejection::IdempotencyKeyInFlight.into()));
                }
                Some(Entry::Done(_, answer)) => {
                    return BeginDecision::Answer(Ok(Begin::Replay(answer.clone())));
                }
                None => {}
            }
        }
        if args.quantity > 0 {
            let used = self.usage(&args.event_id, &args.user_id);
            if used.saturating_add(args.quantity) > args.limit {
                let rejection = Rejection::UserLimit {
                    limit: args.limit,
                    used,
                };
                return match &args.tag {
                    Some(tag) => BeginDecision::Record(
                        rejection_record(args, tag, rejection.clone()),
                        Begin::Replay(Err(rejection)),
                    ),
                    None => BeginDecision::Answer(Err(rejection.into())),
                };
            }
            self.add_quota(args.event_id.clone(), args.user_id.clone(), args.quantity);
        }
        if let Some(tag) = &args.tag {
            self.keys.insert(
                (args.user_id.clone(), args.rpc, tag.key.clone()),
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
            Err(EngineError::Rejected(r)) => FinishDecision::Record(rejection_record(args, tag, r)),
            Err(_) => {
                self.keys
                    .remove(&(args.user_id.clone(), args.rpc, tag.key.clone()));
                FinishDecision::Done
            }
        }
    }

    /// A success's answer, kept for replays (durable already in the section's record).
    pub(crate) fn settle(&mut self, args: &BeginArgs, answer: Answer) {
        if let Some(tag) = &args.tag {
            self.keys.insert(
                (args.user_id.clone(), args.rpc, tag.key.clone()),
                Entry::Done(tag.fingerprint, Ok(answer)),
            );
        }
    }

    /// The settled first answer of a key, if the request matches.
    pub(crate) fn lookup(
        &self,
        user_id: UserId,
        rpc: Rpc,
        tag: IdemTag,
    ) -> Option<Result<Answer, Rejection>> {
        match self.keys.get(&(user_id, rpc, tag.key)) {
            Some(Entry::Done(fp, answer)) if *fp == tag.fingerprint => Some(answer.clone()),
            _ => None,
        }
    }

    /// Places the user holds or owns for the event.
    pub(crate) fn usage(&self, event_id: &EventId, user_id: &UserId) -> u32 {
        self.quotas
            .get(&(event_id.clone(), user_id.clone()))
            .copied()
            .unwrap_or(0)
    }

    /// Gives back quota of a hold that ended or failed.
    ///
    /// # Panics
    /// If more comes back than was reserved: the ledger and the sections disagree (a bug), and
    /// the shard's actor stops (the engine then stops visibly).
    pub(crate) fn refund(&mut self, event_id: &EventId, user_id: &UserId, quantity: u32) {
        let key = (event_id.clone(), user_id.clone());
        if let Some(used) = self.quotas.get_mut(&key) {
            assert!(
                *used >= quantity,
                "ledger refund of {quantity} exceeds {used} reserved for {user_id} in {event_id}"
            );
            *used -= quantity;
            if *used == 0 {
                self.quotas.remove(&key);
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
    }
}
