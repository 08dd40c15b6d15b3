//! The waitlist actor: a thin shell that logs what [`WaitlistCore`] decides, applies it, and
//! replies once durable.

use crate::changes::{Change, ChangeKind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::core::WaitlistCore;
use super::core::{Decision, JoinRequest};
use super::records::{WaitlistRecord, WaitlistState, WaitlistView};
use crate::error::{EngineError, Rejection, StorageError};
use crate::store::{Job, Store, StreamWriter};
use crate::types::{EventId, HoldId, SectionId, UserId};

type Reply<T> = RpcReplyPort<Result<T, EngineError>>;

/// Messages of the waitlist actor.
pub(crate) enum WaitlistMsg {
    Join(JoinRequest, usize, Reply<WaitlistView>),
    Get(String, Reply<WaitlistView>),
    /// The fan's active (waiting or offered) entry for the event, if any.
    Active(EventId, UserId, Reply<Option<WaitlistView>>),
    Candidates(EventId, Option<SectionId>, usize, Reply<Vec<WaitlistView>>),
    Offer(String, HoldId, Reply<WaitlistView>),
    End(String, WaitlistState, Reply<WaitlistView>),
    Offered(Reply<Vec<WaitlistView>>),
    EventsWaiting(Reply<Vec<EventId>>),
    Len(EventId, Reply<usize>),
    /// Test support: panic in the handler (to exercise supervision).
    #[cfg(feature = "test-support")]
    Panic,
}

pub(crate) struct WaitlistActor;

pub(crate) struct WaitlistArgs {
    pub core: WaitlistCore,
    pub stream: StreamWriter,
    pub store: Arc<Store>,
    pub checkpoint_every: u64,
    /// How far this actor's records are durable.
    pub written: Written,
    /// The engine's clock (the change stream's times).
    pub clock: Arc<dyn crate::Clock>,
}

/// How far the records this actor logged are durable: counted as they are submitted, and as
/// their commits complete (in order). An answer from memory waits until what it may have read
/// is durable (on a cluster leader: committed by a majority), so a retried join or a read is
/// never told of an entry that a crash, or a lost majority, could still take away.
#[derive(Default)]
pub(crate) struct Written {
    submitted: u64,
    durable: Arc<AtomicU64>,
}

impl WaitlistArgs {
    /// Answers a decision outright, or logs its record (refused once the store halted).
    fn carry_out(&mut self, decision: Decision, reply: Reply<WaitlistView>, entry_id: &str) {
        match decision {
            Decision::Answer(answer) => self.answer(answer.map_err(EngineError::from), reply),
            Decision::Record(record) => match self.store.halt.check() {
                Err(e) => {
                    let _ = reply.send(Err(e.into()));
                }
                Ok(()) => self.commit(record, reply, entry_id),
            },
        }
    }

    /// Logs `record`, applies it, and replies `answer` once durable.
    fn commit(&mut self, record: WaitlistRecord, reply: Reply<WaitlistView>, entry_id: &str) {
        if let Err(e) = self.core.apply(&record) {
            let _ = reply.send(Err(StorageError::Io(format!("waitlist: {e}")).into()));
            return;
        }
        let answer = self.core.view(entry_id);
        self.written.submitted += 1;
        let (n, durable) = (self.written.submitted, self.written.durable.clone());
        let changes: Vec<_> = change_of(&self.core, &record, self.clock.now_ms())
            .into_iter()
            .collect();
        let job = self.stream.append_changing(
            std::slice::from_ref(&record),
            Vec::new(),
            &changes,
            Box::new(move |r| {
                if r.is_ok() {
                    durable.fetch_max(n, Ordering::AcqRel);
                }
                let _ = reply.send(
                    r.map_err(EngineError::from)
                        .and_then(|()| answer.ok_or(Rejection::EntryNotFound.into())),
                );
            }),
        );
        let core = &self.core;
        self.store
            .submit_with_checkpoint(job, &mut self.stream, self.checkpoint_every, || core);
    }

    /// Replies `answer`, made from memory, once every record logged before it is durable: at
    /// once if they are, else behind a barrier of the log (which fails if the log does).
    fn answer<T: Send + 'static>(&self, answer: Result<T, EngineError>, reply: Reply<T>) {
        let durable = self.written.durable.load(Ordering::Acquire);
        if durable >= self.written.submitted {
            let _ = reply.send(answer);
            return;
        }
        self.store.submit(Job::Barrier(Box::new(move |r| {
            let _ = reply.send(r.map_err(EngineError::from).and(answer));
        })));
    }
}

impl Actor for WaitlistActor {
    type Msg = WaitlistMsg;
    type State = WaitlistArgs;
    type Arguments = WaitlistArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: WaitlistArgs,
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
            WaitlistMsg::Join(join, max, reply) => {
                let entry_id = join.entry_id.clone();
                let decision = st.core.decide_join(join, max);
                st.carry_out(decision, reply, &entry_id);
            }
            WaitlistMsg::Offer(id, hold_id, reply) => {
                let decision = st.core.decide_offer(&id, hold_id);
                st.carry_out(decision, reply, &id);
            }
            WaitlistMsg::End(id, state, reply) => {
                let decision = st.core.decide_end(&id, state);
                st.carry_out(decision, reply, &id);
            }
            WaitlistMsg::Get(id, reply) => {
                st.answer(
                    st.core.view(&id).ok_or(Rejection::EntryNotFound.into()),
                    reply,
                );
            }
            WaitlistMsg::Active(event, user, reply) => {
                st.answer(Ok(st.core.active_of(&event, &user)), reply);
            }
            WaitlistMsg::Candidates(event, section, n, reply) => {
                let _ = reply.send(Ok(st.core.candidates(&event, section.as_ref(), n)));
            }
            WaitlistMsg::Offered(reply) => {
                let _ = reply.send(Ok(st.core.offered()));
            }
            WaitlistMsg::EventsWaiting(reply) => {
                let _ = reply.send(Ok(st.core.events_waiting()));
            }
            WaitlistMsg::Len(event, reply) => {
                let _ = reply.send(Ok(st.core.waiting_len(&event)));
            }
            #[cfg(feature = "test-support")]
            WaitlistMsg::Panic => panic!("test support: the waitlist actor was told to panic"),
        }
        Ok(())
    }
}

/// The change a waitlist record makes, if it is one the stream tells of (an offer), from the
/// waitlist's core once it is applied.
fn change_of(core: &WaitlistCore, record: &WaitlistRecord, now_ms: u64) -> Option<Change> {
    let WaitlistRecord::EntryOffered { entry_id, hold_id } = record else {
        return None;
    };
    Some(Change {
        event_id: core.view(entry_id)?.event_id,
        at_ms: now_ms,
        kind: ChangeKind::WaitlistOffered {
            entry_id: entry_id.clone(),
            hold_id: hold_id.clone(),
        },
    })
}
