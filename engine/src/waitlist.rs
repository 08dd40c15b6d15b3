//! The waitlist: fans who want places of a sold-out event, in the order they joined.
//!
//! [`WaitlistCore`] is pure state changed only by applying [`WaitlistRecord`]s (as a section
//! is); one actor owns it and logs every change to its own stream (`waitlist`) before replying,
//! so entries and offers survive a restart. The waitlist owns no places: the sweeper hands freed
//! places to the head of the line by placing an ordinary hold in the fan's name and recording
//! it here as an offer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Rejection, StorageError};
use crate::store::{Store, StreamWriter};
use crate::types::{EventId, HoldId, SectionId, UserId};

/// The state of a waitlist entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WaitlistState {
    /// In line.
    Waiting,
    /// Offered a hold (see `offered_hold_id`); waiting for the fan to confirm it.
    Offered,
    /// Left the line without a sale: the offer lapsed, or the fan could not take one.
    Expired,
    /// The offered hold was confirmed.
    Fulfilled,
}

/// An entry as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitlistView {
    /// `{event_id}.w{ulid}`.
    pub entry_id: String,
    /// The event.
    pub event_id: EventId,
    /// The fan.
    pub user_id: UserId,
    /// The section asked for (`None`: any).
    pub section_id: Option<SectionId>,
    /// Places asked for (all or nothing).
    pub quantity: u32,
    /// 1-based place among the event's waiting entries; 0 once not waiting.
    pub position: u64,
    /// State.
    pub state: WaitlistState,
    /// The hold offered, if any.
    pub offered_hold_id: Option<HoldId>,
    /// When the fan joined, ms since the Unix epoch.
    pub joined_at_ms: u64,
}

/// What the waitlist stream records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitlistRecord {
    /// A fan joined.
    EntryJoined {
        /// The new entry.
        entry_id: String,
        /// The event.
        event_id: EventId,
        /// The fan.
        user_id: UserId,
        /// Section asked for.
        section_id: Option<SectionId>,
        /// Places asked for.
        quantity: u32,
        /// When.
        at_ms: u64,
    },
    /// A hold was offered to the entry's fan.
    EntryOffered {
        /// The entry.
        entry_id: String,
        /// The hold placed in the fan's name.
        hold_id: HoldId,
    },
    /// The entry left the line.
    EntryEnded {
        /// The entry.
        entry_id: String,
        /// `Expired` or `Fulfilled`.
        state: WaitlistState,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    event_id: EventId,
    user_id: UserId,
    section_id: Option<SectionId>,
    quantity: u32,
    seq: u64,
    state: WaitlistState,
    offered_hold_id: Option<HoldId>,
    joined_at_ms: u64,
}

/// Every event's waitlist. See the module docs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WaitlistCore {
    entries: HashMap<String, Entry>,
    waiting: BTreeMap<(EventId, u64), String>,
    active_by_user: HashMap<(EventId, UserId), String>,
    by_hold: HashMap<HoldId, String>,
    next_seq: u64,
}

impl WaitlistCore {
    /// Applies one record: the only function that changes the waitlist (replay uses it too).
    pub fn apply(&mut self, record: &WaitlistRecord) -> Result<(), String> {
        match record {
            WaitlistRecord::EntryJoined {
                entry_id,
                event_id,
                user_id,
                section_id,
                quantity,
                at_ms,
            } => {
                if self.entries.contains_key(entry_id) {
                    return Err(format!("entry {entry_id} joined twice"));
                }
                let seq = self.next_seq;
                self.next_seq += 1;
                self.waiting
                    .insert((event_id.clone(), seq), entry_id.clone());
                self.active_by_user
                    .insert((event_id.clone(), user_id.clone()), entry_id.clone());
                self.entries.insert(
                    entry_id.clone(),
                    Entry {
                        event_id: event_id.clone(),
                        user_id: user_id.clone(),
                        section_id: section_id.clone(),
                        quantity: *quantity,
                        seq,
                        state: WaitlistState::Waiting,
                        offered_hold_id: None,
                        joined_at_ms: *at_ms,
                    },
                );
            }
            WaitlistRecord::EntryOffered { entry_id, hold_id } => {
                let e = self
                    .entries
                    .get_mut(entry_id)
                    .ok_or_else(|| format!("offer to unknown entry {entry_id}"))?;
                if e.state != WaitlistState::Waiting {
                    return Err(format!("offer to entry {entry_id} in state {:?}", e.state));
                }
                e.state = WaitlistState::Offered;
                e.offered_hold_id = Some(hold_id.clone());
                self.waiting.remove(&(e.event_id.clone(), e.seq));
                self.by_hold.insert(hold_id.clone(), entry_id.clone());
            }
            WaitlistRecord::EntryEnded { entry_id, state } => {
                let e = self
                    .entries
                    .get_mut(entry_id)
                    .ok_or_else(|| format!("end of unknown entry {entry_id}"))?;
                if !matches!(e.state, WaitlistState::Waiting | WaitlistState::Offered)
                    || !matches!(state, WaitlistState::Expired | WaitlistState::Fulfilled)
                {
                    return Err(format!("entry {entry_id}: {:?} -> {state:?}", e.state));
                }
                e.state = *state;
                self.waiting.remove(&(e.event_id.clone(), e.seq));
                self.active_by_user
                    .remove(&(e.event_id.clone(), e.user_id.clone()));
            }
        }
        Ok(())
    }

    /// An entry as the API shows it.
    pub fn view(&self, entry_id: &str) -> Option<WaitlistView> {
        let e = self.entries.get(entry_id)?;
        let position = if e.state == WaitlistState::Waiting {
            self.waiting
                .range((e.event_id.clone(), 0)..(e.event_id.clone(), e.seq))
                .count() as u64
                + 1
        } else {
            0
        };
        Some(WaitlistView {
            entry_id: entry_id.to_owned(),
            event_id: e.event_id.clone(),
            user_id: e.user_id.clone(),
            section_id: e.section_id.clone(),
            quantity: e.quantity,
            position,
            state: e.state,
            offered_hold_id: e.offered_hold_id.clone(),
            joined_at_ms: e.joined_at_ms,
        })
    }

    /// Fans waiting for an event.
    pub fn waiting_len(&self, event_id: &EventId) -> usize {
        self.waiting
            .range((event_id.clone(), 0)..=(event_id.clone(), u64::MAX))
            .count()
    }

    /// The first `n` waiting entries of an event that would take places of `section` (entries
    /// for that section or for any), in line order; `section: None` takes every entry.
    pub fn candidates(
        &self,
        event_id: &EventId,
        section: Option<&SectionId>,
        n: usize,
    ) -> Vec<WaitlistView> {
        self.waiting
            .range((event_id.clone(), 0)..=(event_id.clone(), u64::MAX))
            .filter_map(|(_, id)| {
                let e = self.entries.get(id)?;
                let fits = match (section, &e.section_id) {
                    (None, _) | (_, None) => true,
                    (Some(s), Some(wanted)) => s == wanted,
                };
                fits.then(|| self.view(id)).flatten()
            })
            .take(n)
            .collect()
    }

    /// The active (waiting or offered) entry of a fan for an event.
    pub fn active_of(&self, event_id: &EventId, user_id: &UserId) -> Option<WaitlistView> {
        let id = self
            .active_by_user
            .get(&(event_id.clone(), user_id.clone()))?;
        self.view(id)
    }

    /// The entry a hold was offered to.
    pub fn of_hold(&self, hold_id: &HoldId) -> Option<WaitlistView> {
        self.view(self.by_hold.get(hold_id)?)
    }

    /// Every entry with an outstanding offer.
    pub fn offered(&self) -> Vec<WaitlistView> {
        self.entries
            .iter()
            .filter(|(_, e)| e.state == WaitlistState::Offered)
            .filter_map(|(id, _)| self.view(id))
            .collect()
    }

    /// Events with fans waiting.
    pub fn events_waiting(&self) -> Vec<EventId> {
        let mut out: Vec<EventId> = self.waiting.keys().map(|(e, _)| e.clone()).collect();
        out.dedup();
        out
    }
}

type Reply<T> = RpcReplyPort<Result<T, EngineError>>;

/// Messages of the waitlist actor.
pub(crate) enum WaitlistMsg {
    Join {
        entry_id: String,
        event_id: EventId,
        user_id: UserId,
        section_id: Option<SectionId>,
        quantity: u32,
        max: usize,
        now_ms: u64,
        reply: Reply<WaitlistView>,
    },
    Get(String, Reply<WaitlistView>),
    Candidates(EventId, Option<SectionId>, usize, Reply<Vec<WaitlistView>>),
    Offer(String, HoldId, Reply<WaitlistView>),
    End(String, WaitlistState, Reply<WaitlistView>),
    OfHold(HoldId, Reply<Option<WaitlistView>>),
    Offered(Reply<Vec<WaitlistView>>),
    EventsWaiting(Reply<Vec<EventId>>),
    Len(EventId, Reply<usize>),
}

pub(crate) struct WaitlistActor;

pub(crate) struct WaitlistArgs {
    pub core: WaitlistCore,
    pub stream: StreamWriter,
    pub store: Arc<Store>,
    pub checkpoint_every: u64,
}

impl WaitlistArgs {
    /// Logs `record`, applies it, and replies `answer` once durable.
    fn commit(&mut self, record: WaitlistRecord, reply: Reply<WaitlistView>, entry_id: &str) {
        if let Err(e) = self.core.apply(&record) {
            let _ = reply.send(Err(StorageError::Io(format!("waitlist: {e}")).into()));
            return;
        }
        let answer = self.core.view(entry_id);
        let job = self.stream.append(
            std::slice::from_ref(&record),
            Vec::new(),
            Box::new(move |r| {
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
        let halted = st.store.halt.check().err();
        match msg {
            WaitlistMsg::Join {
                entry_id,
                event_id,
                user_id,
                section_id,
                quantity,
                max,
                now_ms,
                reply,
            } => {
                if let Some(e) = halted {
                    let _ = reply.send(Err(e.into()));
                } else if let Some(v) = st.core.active_of(&event_id, &user_id) {
                    // One active entry per fan and event: joining again keeps the place.
                    let _ = reply.send(Ok(v));
                } else if st.core.waiting_len(&event_id) >= max {
                    let _ = reply.send(Err(Rejection::QueueFull.into()));
                } else {
                    let record = WaitlistRecord::EntryJoined {
                        entry_id: entry_id.clone(),
                        event_id,
                        user_id,
                        section_id,
                        quantity,
                        at_ms: now_ms,
                    };
                    st.commit(record, reply, &entry_id);
                }
            }
            WaitlistMsg::Get(id, reply) => {
                let _ = reply.send(st.core.view(&id).ok_or(Rejection::EntryNotFound.into()));
            }
            WaitlistMsg::Candidates(event, section, n, reply) => {
                let _ = reply.send(Ok(st.core.candidates(&event, section.as_ref(), n)));
            }
            WaitlistMsg::Offer(id, hold_id, reply) => match st.core.view(&id) {
                None => {
                    let _ = reply.send(Err(Rejection::EntryNotFound.into()));
                }
                Some(v) if v.offered_hold_id.as_ref() == Some(&hold_id) => {
                    let _ = reply.send(Ok(v));
                }
                Some(v) if v.state != WaitlistState::Waiting => {
                    let _ = reply.send(Err(Rejection::HoldNotActive.into()));
                }
                Some(_) => {
                    if let Some(e) = halted {
                        let _ = reply.send(Err(e.into()));
                    } else {
                        let record = WaitlistRecord::EntryOffered {
                            entry_id: id.clone(),
                            hold_id,
                        };
                        st.commit(record, reply, &id);
                    }
                }
            },
            WaitlistMsg::End(id, state, reply) => match st.core.view(&id) {
                None => {
                    let _ = reply.send(Err(Rejection::EntryNotFound.into()));
                }
                Some(v) if !matches!(v.state, WaitlistState::Waiting | WaitlistState::Offered) => {
                    let _ = reply.send(Ok(v));
                }
                Some(_) => {
                    if let Some(e) = halted {
                        let _ = reply.send(Err(e.into()));
                    } else {
                        let record = WaitlistRecord::EntryEnded {
                            entry_id: id.clone(),
                            state,
                        };
                        st.commit(record, reply, &id);
                    }
                }
            },
            WaitlistMsg::OfHold(hold_id, reply) => {
                let _ = reply.send(Ok(st.core.of_hold(&hold_id)));
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
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(id: &str, event: &str, user: &str, section: Option<&str>, q: u32) -> WaitlistRecord {
        WaitlistRecord::EntryJoined {
            entry_id: id.into(),
            event_id: EventId::from(event),
            user_id: UserId::from(user),
            section_id: section.map(SectionId::from),
            quantity: q,
            at_ms: 0,
        }
    }

    #[test]
    fn positions_candidates_offers_and_ends() {
        let mut w = WaitlistCore::default();
        w.apply(&joined("a", "e", "ann", None, 2)).unwrap();
        w.apply(&joined("b", "e", "bob", Some("orch"), 1)).unwrap();
        w.apply(&joined("c", "e", "cat", Some("floor"), 3)).unwrap();
        w.apply(&joined("x", "other", "ann", None, 1)).unwrap();
        assert_eq!(w.view("c").unwrap().position, 3);
        assert_eq!(w.view("x").unwrap().position, 1, "per event");
        let orch: Vec<String> = w
            .candidates(&EventId::from("e"), Some(&SectionId::from("orch")), 10)
            .into_iter()
            .map(|v| v.entry_id)
            .collect();
        assert_eq!(
            orch,
            ["a", "b"],
            "any-section entries and orch entries, in order"
        );
        w.apply(&WaitlistRecord::EntryOffered {
            entry_id: "a".into(),
            hold_id: HoldId::from("e.orch.h1"),
        })
        .unwrap();
        assert_eq!(
            w.view("b").unwrap().position,
            1,
            "the offered one left the line"
        );
        assert_eq!(w.view("a").unwrap().position, 0);
        assert_eq!(w.of_hold(&HoldId::from("e.orch.h1")).unwrap().entry_id, "a");
        assert_eq!(w.offered().len(), 1);
        w.apply(&WaitlistRecord::EntryEnded {
            entry_id: "a".into(),
            state: WaitlistState::Fulfilled,
        })
        .unwrap();
        assert!(
            w.active_of(&EventId::from("e"), &UserId::from("ann"))
                .is_none()
        );
        assert_eq!(w.waiting_len(&EventId::from("e")), 2);
        // Records that do not fit the state are refused.
        assert!(
            w.apply(&WaitlistRecord::EntryOffered {
                entry_id: "a".into(),
                hold_id: HoldId::from("e.orch.h2"),
            })
            .is_err()
        );
        assert!(w.apply(&joined("b", "e", "bob", None, 1)).is_err());
    }
}
