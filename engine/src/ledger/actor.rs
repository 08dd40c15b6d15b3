//! The ledger shard actor: a thin shell around [`ShardState`]. It carries out what the state
//! decides: answers at once, or logs a refusal durably and answers once it is durable.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::core::{BeginDecision, FinishDecision, LedgerRecord, ShardState};
use super::{Answer, Begin, BeginArgs, Rpc};
use crate::core::IdemTag;
use crate::error::{EngineError, Rejection};
use crate::store::{Store, StreamWriter};
use crate::types::{EventId, UserId};

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
