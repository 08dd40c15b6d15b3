//! The ledger shard actor: a thin shell around [`ShardState`]. It carries out what the state
//! decides: answers at once, or logs a refusal durably and answers once it is durable.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::core::{
    Answer, Begin, BeginArgs, BeginDecision, FinishDecision, LedgerRecord, Rpc, ShardState,
};
use crate::core::IdemTag;
use crate::error::{EngineError, Rejection};
use crate::store::{Store, StreamWriter};
use crate::types::{EventId, UserId};

/// The seven kinds of message a shard takes (one of them for tests only). Each change takes
/// many items: a unary call sends one.
pub(crate) enum LedgerMsg {
    /// Begins requests (quota reserved, keys checked), decided in order (so a user's items share
    /// one quota) and answered together once any refusal they record is durable.
    Begin(
        Vec<BeginArgs>,
        RpcReplyPort<Result<Vec<Result<Begin, EngineError>>, EngineError>>,
    ),
    /// Finishes begun requests that failed (quota back, a keyed refusal recorded), answered once
    /// what they record is durable.
    Finish(
        Vec<(BeginArgs, Result<Answer, EngineError>)>,
        RpcReplyPort<Result<(), EngineError>>,
    ),
    /// Successes to record, fire and forget: the caller's reply goes out after this message is
    /// queued, so any replay the caller sends later is queued behind it (one mailbox, FIFO).
    Settled(Vec<(BeginArgs, Answer)>),
    /// Quota given back: (event, user, places).
    /// Quota back: (event, user, places, when the hold expired if it did).
    Refund(Vec<(EventId, UserId, u32, Option<u64>)>),
    /// The settled first answer of a key, if the request matches; no effect.
    Lookup {
        user_id: UserId,
        rpc: Rpc,
        tag: IdemTag,
        now_ms: u64,
        reply: RpcReplyPort<Option<Result<Answer, Rejection>>>,
    },
    /// A count the shard keeps.
    Count(Count, RpcReplyPort<usize>),
    /// Test support: panic in the handler (to exercise supervision).
    #[cfg(feature = "test-support")]
    Panic,
}

/// What a [`LedgerMsg::Count`] counts.
pub(crate) enum Count {
    /// The places a user holds or owns for an event.
    Usage(EventId, UserId),
    /// The idempotency keys the shard remembers.
    KeysRemembered,
}

/// One ledger shard actor.
pub(crate) struct LedgerShard;

pub(crate) struct ShardArgs {
    pub state: ShardState,
    pub stream: StreamWriter,
    pub store: Arc<Store>,
    pub checkpoint_every: u64,
}

impl ShardArgs {
    /// Decides begins in order, applying each refusal it records at once (so the next item of
    /// the same user sees it); answers once those are durable.
    fn begin(
        &mut self,
        many: Vec<BeginArgs>,
        reply: RpcReplyPort<Result<Vec<Result<Begin, EngineError>>, EngineError>>,
    ) {
        if let Err(e) = self.store.halt.check() {
            let _ = reply.send(Err(e.into()));
            return;
        }
        let mut records = Vec::new();
        let mut answers = Vec::with_capacity(many.len());
        for args in &many {
            let decision = self.state.decide_begin(args);
            if decision.is_user_limit() {
                metrics::counter!("boxoffice_ledger_user_limit_total").increment(1);
            }
            match decision {
                BeginDecision::Answer(answer) => answers.push(answer),
                BeginDecision::Record(record, answer) => {
                    self.state.apply(record.clone());
                    records.push(record);
                    answers.push(Ok(answer));
                }
            }
        }
        self.log_applied(records, reply, answers);
    }

    /// Logs refusals already applied to the state, then replies `ok` once they are durable;
    /// with nothing to log, replies at once.
    fn log_applied<T: Send + 'static>(
        &mut self,
        records: Vec<LedgerRecord>,
        reply: RpcReplyPort<Result<T, EngineError>>,
        ok: T,
    ) {
        if records.is_empty() {
            let _ = reply.send(Ok(ok));
            return;
        }
        let job = self.stream.append(
            &records,
            Vec::new(),
            Box::new(move |r| {
                let _ = reply.send(r.map(|()| ok).map_err(EngineError::from));
            }),
        );
        let state = &self.state;
        self.store
            .submit_with_checkpoint(job, &mut self.stream, self.checkpoint_every, || {
                state.checkpoint_state()
            });
    }
}

impl Actor for LedgerShard {
    type Msg = LedgerMsg;
    type State = ShardArgs;
    type Arguments = ShardArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: ShardArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            LedgerMsg::Begin(many, reply) => st.begin(many, reply),
            LedgerMsg::Finish(many, reply) => {
                let mut records = Vec::new();
                for (args, outcome) in many {
                    if let FinishDecision::Record(record) = st.state.decide_finish(&args, outcome) {
                        st.state.apply(record.clone());
                        records.push(record);
                    }
                }
                st.log_applied(records, reply, ());
            }
            LedgerMsg::Settled(many) => {
                for (args, answer) in many {
                    st.state.settle(&args, answer);
                }
            }
            LedgerMsg::Refund(many) => {
                for (event_id, user_id, quantity, expired_at) in many {
                    st.state.refund(&event_id, &user_id, quantity);
                    if let Some(at_ms) = expired_at {
                        st.state.expired(event_id, user_id, at_ms);
                    }
                }
            }
            LedgerMsg::Lookup {
                user_id,
                rpc,
                tag,
                now_ms,
                reply,
            } => {
                let _ = reply.send(st.state.lookup(user_id, rpc, tag, now_ms));
            }
            LedgerMsg::Count(count, reply) => {
                let n = match count {
                    Count::Usage(event_id, user_id) => st.state.usage(&event_id, &user_id) as usize,
                    Count::KeysRemembered => st.state.keys_len(),
                };
                let _ = reply.send(n);
            }
            #[cfg(feature = "test-support")]
            LedgerMsg::Panic => panic!("test support: a ledger shard was told to panic"),
        }
        Ok(())
    }
}
