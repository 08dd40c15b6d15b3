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
//! the sections' holds.

use std::collections::HashMap;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::core::IdemTag;
use crate::error::{EngineError, Rejection};
use crate::store::{Store, StreamWriter};
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
}

pub(crate) enum LedgerMsg {
    Begin(BeginArgs, RpcReplyPort<Result<Begin, EngineError>>),
    Finish {
        args: BeginArgs,
        outcome: Result<Answer, EngineError>,
        reply: RpcReplyPort<Result<(), EngineError>>,
    },
    /// A success to record, fire and forget: the caller's reply goes out after this message is
    /// queued, so any replay the caller sends later is queued behind it (one mailbox, FIFO).
    Settled {
        args: BeginArgs,
        answer: Answer,
    },
    Refund {
        event_id: EventId,
        user_id: UserId,
        quantity: u32,
    },
    /// The settled first answer of a key, if the request matches; no effect.
    Lookup {
        user_id: UserId,
        rpc: Rpc,
        tag: IdemTag,
        reply: RpcReplyPort<Option<Result<Answer, Rejection>>>,
    },
    Usage {
        event_id: EventId,
        user_id: UserId,
        reply: RpcReplyPort<u32>,
    },
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

    fn checkpoint_state(&self) -> ShardCheckpoint {
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

impl Ledger {
    pub fn new(shards: Vec<ActorRef<LedgerMsg>>) -> Ledger {
        Ledger {
            shards: Arc::new(shards),
        }
    }

    fn shard(&self, user: &UserId) -> &ActorRef<LedgerMsg> {
        &self.shards[shard_of(user, self.shards.len())]
    }

    pub async fn begin(&self, args: BeginArgs) -> Result<Begin, EngineError> {
        let shard = self.shard(&args.user_id).clone();
        shard
            .call(|reply| LedgerMsg::Begin(args, reply), None)
            .await
            .map_err(gone)?
            .success_or(EngineError::NotReady)?
    }

    pub async fn finish(
        &self,
        args: BeginArgs,
        outcome: Result<Answer, EngineError>,
    ) -> Result<(), EngineError> {
        let shard = self.shard(&args.user_id).clone();
        shard
            .call(
                |reply| LedgerMsg::Finish {
                    args,
                    outcome,
                    reply,
                },
                None,
            )
            .await
            .map_err(gone)?
            .success_or(EngineError::NotReady)?
    }

    /// Records a success without waiting (see `LedgerMsg::Settled`).
    pub fn settled(&self, args: BeginArgs, answer: Answer) {
        let _ = self
            .shard(&args.user_id)
            .cast(LedgerMsg::Settled { args, answer });
    }

    /// Gives back quota of a hold that ended. Fire and forget: callable from any thread.
    pub fn refund(&self, event_id: EventId, user_id: UserId, quantity: u32) {
        let _ = self.shard(&user_id).cast(LedgerMsg::Refund {
            event_id,
            user_id,
            quantity,
        });
    }

    pub async fn lookup(
        &self,
        user_id: UserId,
        rpc: Rpc,
        tag: IdemTag,
    ) -> Result<Option<Result<Answer, Rejection>>, EngineError> {
        self.shard(&user_id)
            .call(
                |reply| LedgerMsg::Lookup {
                    user_id,
                    rpc,
                    tag,
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
                |reply| LedgerMsg::Usage {
                    event_id,
                    user_id,
                    reply,
                },
                None,
            )
            .await
            .map_err(gone)?
            .success_or(EngineError::NotReady)
    }

    pub fn actors(&self) -> &[ActorRef<LedgerMsg>] {
        &self.shards
    }
}

/// One ledger shard actor.
pub(crate) struct LedgerShard;

pub(crate) struct ShardArgs {
    pub state: ShardState,
    pub stream: StreamWriter,
    pub store: Arc<Store>,
    pub checkpoint_every: u64,
}

pub(crate) struct ShardActorState {
    state: ShardState,
    stream: StreamWriter,
    store: Arc<Store>,
    checkpoint_every: u64,
}

impl ShardActorState {
    /// Records a rejection durably, then replies.
    fn record_rejection<T: Send + 'static>(
        &mut self,
        args: &BeginArgs,
        tag: &IdemTag,
        rejection: Rejection,
        reply: RpcReplyPort<Result<T, EngineError>>,
        ok: T,
    ) {
        let record = LedgerRecord::RejectionRecorded {
            user_id: args.user_id.clone(),
            rpc: args.rpc,
            tag: tag.clone(),
            rejection,
        };
        let job = self.stream.append(
            std::slice::from_ref(&record),
            Vec::new(),
            Box::new(move |r| {
                let _ = reply.send(r.map(|()| ok).map_err(EngineError::from));
            }),
        );
        self.state.apply(record);
        let state = &self.state;
        self.store
            .submit_with_checkpoint(job, &mut self.stream, self.checkpoint_every, || {
                state.checkpoint_state()
            });
    }
}

impl Actor for LedgerShard {
    type Msg = LedgerMsg;
    type State = ShardActorState;
    type Arguments = ShardArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: ShardArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(ShardActorState {
            state: args.state,
            stream: args.stream,
            store: args.store,
            checkpoint_every: args.checkpoint_every,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            LedgerMsg::Begin(args, reply) => {
                if let Err(e) = st.store.halt.check() {
                    let _ = reply.send(Err(e.into()));
                    return Ok(());
                }
                if let Some(tag) = &args.tag {
                    let k = (args.user_id.clone(), args.rpc, tag.key.clone());
                    match st.state.keys.get(&k) {
                        Some(Entry::InFlight(fp) | Entry::Done(fp, _))
                            if *fp != tag.fingerprint =>
                        {
                            let _ = reply.send(Err(Rejection::IdempotencyKeyReused.into()));
                            return Ok(());
                        }
                        Some(Entry::InFlight(_)) => {
                            let _ = reply.send(Err(Rejection::IdempotencyKeyInFlight.into()));
                            return Ok(());
                        }
                        Some(Entry::Done(_, answer)) => {
                            let _ = reply.send(Ok(Begin::Replay(answer.clone())));
                            return Ok(());
                        }
                        None => {}
                    }
                }
                if args.quantity > 0 {
                    let used = st
                        .state
                        .quotas
                        .get(&(args.event_id.clone(), args.user_id.clone()))
                        .copied()
                        .unwrap_or(0);
                    if used.saturating_add(args.quantity) > args.limit {
                        let rejection = Rejection::UserLimit {
                            limit: args.limit,
                            used,
                        };
                        metrics::counter!("boxoffice_ledger_user_limit_total").increment(1);
                        match args.tag.clone() {
                            Some(tag) => {
                                let answer = Begin::Replay(Err(rejection.clone()));
                                st.record_rejection(&args, &tag, rejection, reply, answer);
                            }
                            None => {
                                let _ = reply.send(Err(rejection.into()));
                            }
                        }
                        return Ok(());
                    }
                    st.state
                        .add_quota(args.event_id.clone(), args.user_id.clone(), args.quantity);
                }
                if let Some(tag) = &args.tag {
                    st.state.keys.insert(
                        (args.user_id.clone(), args.rpc, tag.key.clone()),
                        Entry::InFlight(tag.fingerprint),
                    );
                }
                let _ = reply.send(Ok(Begin::Proceed));
            }
            LedgerMsg::Finish {
                args,
                outcome,
                reply,
            } => {
                if outcome.is_err() && args.quantity > 0 {
                    refund(&mut st.state, &args.event_id, &args.user_id, args.quantity);
                }
                let Some(tag) = args.tag.clone() else {
                    let _ = reply.send(Ok(()));
                    return Ok(());
                };
                let k = (args.user_id.clone(), args.rpc, tag.key.clone());
                match outcome {
                    Ok(answer) => {
                        // Durable already: the section's record carries the key.
                        st.state
                            .keys
                            .insert(k, Entry::Done(tag.fingerprint, Ok(answer)));
                        let _ = reply.send(Ok(()));
                    }
                    Err(EngineError::Rejected(r)) => {
                        st.record_rejection(&args, &tag, r, reply, ());
                    }
                    Err(_) => {
                        // Not a definite answer: the request may be retried with the same key.
                        st.state.keys.remove(&k);
                        let _ = reply.send(Ok(()));
                    }
                }
            }
            LedgerMsg::Settled { args, answer } => {
                if let Some(tag) = args.tag {
                    // Durable already: the section's record carries the key.
                    st.state.keys.insert(
                        (args.user_id, args.rpc, tag.key),
                        Entry::Done(tag.fingerprint, Ok(answer)),
                    );
                }
            }
            LedgerMsg::Refund {
                event_id,
                user_id,
                quantity,
            } => refund(&mut st.state, &event_id, &user_id, quantity),
            LedgerMsg::Lookup {
                user_id,
                rpc,
                tag,
                reply,
            } => {
                let found = match st.state.keys.get(&(user_id, rpc, tag.key)) {
                    Some(Entry::Done(fp, answer)) if *fp == tag.fingerprint => Some(answer.clone()),
                    _ => None,
                };
                let _ = reply.send(found);
            }
            LedgerMsg::Usage {
                event_id,
                user_id,
                reply,
            } => {
                let used = st
                    .state
                    .quotas
                    .get(&(event_id, user_id))
                    .copied()
                    .unwrap_or(0);
                let _ = reply.send(used);
            }
        }
        Ok(())
    }
}

fn refund(state: &mut ShardState, event_id: &EventId, user_id: &UserId, quantity: u32) {
    let key = (event_id.clone(), user_id.clone());
    if let Some(used) = state.quotas.get_mut(&key) {
        assert!(
            *used >= quantity,
            "ledger refund of {quantity} exceeds {used} reserved for {user_id} in {event_id}"
        );
        *used -= quantity;
        if *used == 0 {
            state.quotas.remove(&key);
        }
    } else {
        panic!("ledger refund of {quantity} for {user_id} in {event_id} with nothing reserved");
    }
}
