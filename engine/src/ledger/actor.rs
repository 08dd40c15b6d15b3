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

pub(crate) enum LedgerMsg {
    Begin(BeginArgs, RpcReplyPort<Result<Begin, EngineError>>),
    /// Several begins at once (a batch call's users of this shard), decided in order (so a
    /// user's items share one quota) and answered together once any refusal they record is
    /// durable.
    BeginMany(
        Vec<BeginArgs>,
        RpcReplyPort<Result<Vec<Result<Begin, EngineError>>, EngineError>>,
    ),
    /// Several finishes at once (see `Finish`), answered once what they record is durable.
    FinishMany(
        Vec<(BeginArgs, Result<Answer, EngineError>)>,
        RpcReplyPort<Result<(), EngineError>>,
    ),
    /// Several successes to record, fire and forget (see `Settled`).
    SettledMany(Vec<(BeginArgs, Answer)>),
    /// Several refunds (see `Refund`): (event, user, places).
    RefundMany(Vec<(EventId, UserId, u32)>),
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
        now_ms: u64,
        reply: RpcReplyPort<Option<Result<Answer, Rejection>>>,
    },
    /// How many idempotency keys the shard remembers.
    KeysRemembered(RpcReplyPort<usize>),
    Usage {
        event_id: EventId,
        user_id: UserId,
        reply: RpcReplyPort<u32>,
    },
    /// Test support: panic in the handler (to exercise supervision).
    #[cfg(feature = "test-support")]
    Panic,
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
    /// Records a refusal durably (applied at once), then replies `ok`.
    fn record<T: Send + 'static>(
        &mut self,
        record: LedgerRecord,
        reply: RpcReplyPort<Result<T, EngineError>>,
        ok: T,
    ) {
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

impl ShardArgs {
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

    // Over 70 lines: one arm per message kind, each a short call into the shard's core.
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
                let decision = st.state.decide_begin(&args);
                if decision.is_user_limit() {
                    metrics::counter!("boxoffice_ledger_user_limit_total").increment(1);
                }
                match decision {
                    BeginDecision::Answer(answer) => {
                        let _ = reply.send(answer);
                    }
                    BeginDecision::Record(record, answer) => st.record(record, reply, answer),
                }
            }
            LedgerMsg::Finish {
                args,
                outcome,
                reply,
            } => match st.state.decide_finish(&args, outcome) {
                FinishDecision::Done => {
                    let _ = reply.send(Ok(()));
                }
                FinishDecision::Record(record) => st.record(record, reply, ()),
            },
            LedgerMsg::BeginMany(many, reply) => {
                if let Err(e) = st.store.halt.check() {
                    let _ = reply.send(Err(e.into()));
                    return Ok(());
                }
                let mut records = Vec::new();
                let mut answers = Vec::with_capacity(many.len());
                for args in &many {
                    let decision = st.state.decide_begin(args);
                    if decision.is_user_limit() {
                        metrics::counter!("boxoffice_ledger_user_limit_total").increment(1);
                    }
                    match decision {
                        BeginDecision::Answer(answer) => answers.push(answer),
                        BeginDecision::Record(record, answer) => {
                            // Applied now, so the next item of the same user sees it.
                            st.state.apply(record.clone());
                            records.push(record);
                            answers.push(Ok(answer));
                        }
                    }
                }
                st.log_applied(records, reply, answers);
            }
            LedgerMsg::FinishMany(many, reply) => {
                let mut records = Vec::new();
                for (args, outcome) in many {
                    if let FinishDecision::Record(record) = st.state.decide_finish(&args, outcome) {
                        st.state.apply(record.clone());
                        records.push(record);
                    }
                }
                st.log_applied(records, reply, ());
            }
            LedgerMsg::RefundMany(many) => {
                for (event_id, user_id, quantity) in many {
                    st.state.refund(&event_id, &user_id, quantity);
                }
            }
            LedgerMsg::SettledMany(many) => {
                for (args, answer) in many {
                    st.state.settle(&args, answer);
                }
            }
            LedgerMsg::Settled { args, answer } => st.state.settle(&args, answer),
            LedgerMsg::Refund {
                event_id,
                user_id,
                quantity,
            } => st.state.refund(&event_id, &user_id, quantity),
            LedgerMsg::Lookup {
                user_id,
                rpc,
                tag,
                now_ms,
                reply,
            } => {
                let _ = reply.send(st.state.lookup(user_id, rpc, tag, now_ms));
            }
            LedgerMsg::KeysRemembered(reply) => {
                let _ = reply.send(st.state.keys_len());
            }
            LedgerMsg::Usage {
                event_id,
                user_id,
                reply,
            } => {
                let _ = reply.send(st.state.usage(&event_id, &user_id));
            }
            #[cfg(feature = "test-support")]
            LedgerMsg::Panic => panic!("test support: a ledger shard was told to panic"),
        }
        Ok(())
    }
}
