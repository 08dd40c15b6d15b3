//! The per-user ledger: quota (places held + sold per event and user) and idempotency records.
//!
//! A user can hold in several sections of one event, so no section actor can enforce the
//! per-user limit alone. The ledger is sharded by user id over a few actors; each user has one
//! owner, which serializes that user's requests: reserve quota first, then hold, then settle
//! (give the quota back if the hold failed). Released and expired holds refund their places once
//! the section's record of it is durable.
//!
//! Idempotency keys are scoped per user and RPC, so they live here too. A first answer that is a
//! success is made durable by the section's own record (the hold or order carries the key and
//! the request's fingerprint); a first answer that is a rejection is made durable by the ledger's
//! own log stream before the caller hears it. Quotas are not logged: recovery derives them from
//! the sections' holds. Answers are kept for the idempotency window ([`crate::retention`]).

//!
//! - `core`: [`ShardState`], one shard as pure state (decides, applies).
//! - `actor`: the shard actor, a thin shell that logs what the core decides and replies.
//! - this module: the [`Ledger`] handle (users spread over shards by a stable hash).

use std::sync::Arc;

use ractor::ActorRef;

use crate::core::IdemTag;
use crate::error::{EngineError, Rejection};
use crate::types::{EventId, UserId};

mod actor;
mod core;

pub(crate) use actor::{Count, LedgerMsg, LedgerShard, ShardArgs};
pub(crate) use core::{Answer, Begin, BeginArgs, LedgerRecord, Rpc, Settled, ShardState};

/// A shard and the items for it, each with its position among all items.
type ShardItems<T> = (ActorRef<LedgerMsg>, Vec<(usize, T)>);

/// Handle to the ledger shards.
#[derive(Clone)]
pub(crate) struct Ledger {
    shards: Arc<Vec<ActorRef<LedgerMsg>>>,
}

/// FNV-1a: a stable hash, so a user's shard does not change between builds.
fn shard_of(user: &UserId, shards: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in user.as_str().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    usize::try_from(h % shards as u64).unwrap_or(0)
}

pub(crate) fn shard_index(user: &UserId, shards: usize) -> usize {
    shard_of(user, shards)
}

fn gone<T>(_: T) -> EngineError {
    EngineError::NotReady
}

/// One shard's answers to `args`, in their order.
async fn begin_at(
    shard: &ActorRef<LedgerMsg>,
    args: Vec<BeginArgs>,
) -> Result<Vec<Result<Begin, EngineError>>, EngineError> {
    shard
        .call(|reply| LedgerMsg::Begin(args, reply), None)
        .await
        .map_err(gone)?
        .success_or(EngineError::NotReady)?
}

impl Ledger {
    pub fn new(shards: Vec<ActorRef<LedgerMsg>>) -> Ledger {
        Ledger {
            shards: Arc::new(shards),
        }
    }

    fn shard(&self, user: &UserId) -> &ActorRef<LedgerMsg> {
        &self.shards[shard_of(user, self.shards.len())]
    }

    /// Begins requests: quota reserved and keys checked, one message per shard (the shards
    /// decide at once), each shard deciding its requests in the order given (so a user's
    /// requests share one quota) and answering once any refusal it records is durable.
    /// Answers in the order given.
    pub async fn begin(&self, many: Vec<BeginArgs>) -> Vec<Result<Begin, EngineError>> {
        let n = many.len();
        // All of one shard (a unary call always is): one message, its answers as they come.
        if let Some(shard) = self.one_shard(&many, |a| &a.user_id) {
            return match begin_at(shard, many).await {
                Ok(answers) => answers,
                Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
            };
        }
        let calls = self
            .by_shard(many, |a| &a.user_id)
            .into_iter()
            .map(|(shard, items)| {
                let (at, args): (Vec<usize>, Vec<BeginArgs>) = items.into_iter().unzip();
                async move { (at, begin_at(&shard, args).await) }
            });
        let mut out: Vec<Result<Begin, EngineError>> =
            (0..n).map(|_| Err(EngineError::NotReady)).collect();
        for (at, answers) in crate::rt::join_all(calls).await {
            match answers {
                Ok(answers) => {
                    for (i, a) in at.into_iter().zip(answers) {
                        out[i] = a;
                    }
                }
                Err(e) => {
                    for i in at {
                        out[i] = Err(e.clone());
                    }
                }
            }
        }
        out
    }

    /// Finishes begun requests that failed (one message per shard): their quota back, and a
    /// keyed refusal recorded as its key's first answer. Returns once that is durable; the first
    /// error, if any.
    pub async fn finish(
        &self,
        many: Vec<(BeginArgs, Result<Answer, EngineError>)>,
    ) -> Result<(), EngineError> {
        if many.is_empty() {
            return Ok(());
        }
        let calls =
            self.groups(many, |m| &m.0.user_id)
                .into_iter()
                .map(|(shard, items)| async move {
                    shard
                        .call(|reply| LedgerMsg::Finish(items, reply), None)
                        .await
                        .map_err(gone)?
                        .success_or(EngineError::NotReady)?
                });
        crate::rt::join_all(calls).await.into_iter().collect()
    }

    /// Records successes as their keys' first answers (one message per shard), without
    /// waiting (see `LedgerMsg::Settled`).
    pub fn settled(&self, many: Vec<(BeginArgs, Answer)>) {
        if many.is_empty() {
            return;
        }
        for (shard, items) in self.groups(many, |m| &m.0.user_id) {
            let _ = shard.cast(LedgerMsg::Settled(items));
        }
    }

    /// Gives back quota: (event, user, places, when the hold expired if it did: the hold
    /// cool-down starts), one message per shard. Fire and forget: callable from any thread.
    pub fn refund(&self, many: Vec<(EventId, UserId, u32, Option<u64>)>) {
        if many.is_empty() {
            return;
        }
        for (shard, items) in self.groups(many, |m| &m.1) {
            let _ = shard.cast(LedgerMsg::Refund(items));
        }
    }

    /// The shard every item of `many` belongs to, if they share one (a unary call's one item
    /// always does).
    fn one_shard<T>(
        &self,
        many: &[T],
        user: impl Fn(&T) -> &UserId,
    ) -> Option<&ActorRef<LedgerMsg>> {
        let n = self.shards.len();
        let first = shard_of(user(many.first()?), n);
        many[1..]
            .iter()
            .all(|m| shard_of(user(m), n) == first)
            .then(|| &self.shards[first])
    }

    /// Items grouped by their user's shard, as [`Ledger::by_shard`] groups them, without their
    /// positions; items of one shard stay in the vector they came in (and the one group is
    /// kept inline).
    fn groups<T>(
        &self,
        many: Vec<T>,
        user: impl Fn(&T) -> &UserId,
    ) -> smallvec::SmallVec<[(ActorRef<LedgerMsg>, Vec<T>); 1]> {
        if let Some(shard) = self.one_shard(&many, &user) {
            return smallvec::smallvec![(shard.clone(), many)];
        }
        self.by_shard(many, user)
            .into_iter()
            .map(|(shard, items)| (shard, items.into_iter().map(|(_, m)| m).collect()))
            .collect()
    }

    /// Items grouped by their user's shard (shards with none left out), each with its position
    /// in `many`, in the order given. A call of one item (a unary call) makes one group.
    fn by_shard<T>(&self, many: Vec<T>, user: impl Fn(&T) -> &UserId) -> Vec<ShardItems<T>> {
        let mut groups: Vec<(usize, Vec<(usize, T)>)> = Vec::new();
        for (i, item) in many.into_iter().enumerate() {
            let shard = shard_of(user(&item), self.shards.len());
            match groups.iter_mut().find(|(s, _)| *s == shard) {
                Some((_, items)) => items.push((i, item)),
                None => groups.push((shard, vec![(i, item)])),
            }
        }
        groups.sort_by_key(|(shard, _)| *shard);
        groups
            .into_iter()
            .map(|(shard, items)| (self.shards[shard].clone(), items))
            .collect()
    }

    pub async fn lookup(
        &self,
        user_id: UserId,
        rpc: Rpc,
        tag: IdemTag,
        now_ms: u64,
    ) -> Result<Option<Result<Answer, Rejection>>, EngineError> {
        self.shard(&user_id)
            .call(
                |reply| LedgerMsg::Lookup {
                    user_id,
                    rpc,
                    tag,
                    now_ms,
                    reply,
                },
                None,
            )
            .await
            .map_err(gone)?
            .success_or(EngineError::NotReady)
    }

    pub async fn usage(&self, event_id: EventId, user_id: UserId) -> Result<u32, EngineError> {
        self.shard(&user_id)
            .call(
                |reply| LedgerMsg::Count(Count::Usage(event_id, user_id), reply),
                None,
            )
            .await
            .map_err(gone)?
            .success_or(EngineError::NotReady)
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Test support: makes the shard of `user` panic.
    #[cfg(feature = "test-support")]
    pub fn panic_shard_of(&self, user: &UserId) -> Result<(), EngineError> {
        self.shard(user)
            .cast(LedgerMsg::Panic)
            .map_err(|_| EngineError::NotReady)
    }

    /// Idempotency keys every shard remembers.
    pub async fn keys_remembered(&self) -> Result<usize, EngineError> {
        let mut n = 0;
        for shard in self.shards.iter() {
            n += shard
                .call(|reply| LedgerMsg::Count(Count::KeysRemembered, reply), None)
                .await
                .map_err(gone)?
                .success_or(EngineError::NotReady)?;
        }
        Ok(n)
    }

    pub fn actors(&self) -> &[ActorRef<LedgerMsg>] {
        &self.shards
    }
}
