//! [`WaitlistCore`]: every event's waitlist as pure state. `apply` is the only mutation; the
//! `decide_*` functions say what a request would record, or answer it outright.

use crate::hash::HashMap;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::records::{WaitlistRecord, WaitlistState, WaitlistView};
use crate::error::Rejection;
use crate::types::{EventId, HoldId, SectionId, UserId};

/// What a request to the waitlist comes to.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Nothing to record: this is the answer.
    Answer(Result<WaitlistView, Rejection>),
    /// Record this (then answer with the entry's view).
    Record(WaitlistRecord),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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

impl WaitlistCore {
    /// A fan asks to join: their active entry if they have one (joining again keeps the place),
    /// `QUEUE_FULL` past `max` waiting, else the entry to record.
    pub(crate) fn decide_join(&self, join: JoinRequest, max: usize) -> Decision {
        if let Some(v) = self.active_of(&join.event_id, &join.user_id) {
            return Decision::Answer(Ok(v));
        }
        if self.waiting_len(&join.event_id) >= max {
            return Decision::Answer(Err(Rejection::QueueFull));
        }
        Decision::Record(WaitlistRecord::EntryJoined {
            entry_id: join.entry_id,
            event_id: join.event_id,
            user_id: join.user_id,
            section_id: join.section_id,
            quantity: join.quantity,
            at_ms: join.at_ms,
        })
    }

    /// The sweeper offers `hold_id` to an entry: recorded if the entry waits; the same offer
    /// again is answered as it stands; anything else is refused.
    pub(crate) fn decide_offer(&self, entry_id: &str, hold_id: HoldId) -> Decision {
        match self.view(entry_id) {
            None => Decision::Answer(Err(Rejection::EntryNotFound)),
            Some(v) if v.offered_hold_id.as_ref() == Some(&hold_id) => Decision::Answer(Ok(v)),
            Some(v) if v.state != WaitlistState::Waiting => {
                Decision::Answer(Err(Rejection::HoldNotActive))
            }
            Some(_) => Decision::Record(WaitlistRecord::EntryOffered {
                entry_id: entry_id.to_owned(),
                hold_id,
            }),
        }
    }

    /// An entry ends (`Expired` or `Fulfilled`): recorded if it is still active; an entry that
    /// ended already is answered as it stands.
    pub(crate) fn decide_end(&self, entry_id: &str, state: WaitlistState) -> Decision {
        match self.view(entry_id) {
            None => Decision::Answer(Err(Rejection::EntryNotFound)),
            Some(v) if !matches!(v.state, WaitlistState::Waiting | WaitlistState::Offered) => {
                Decision::Answer(Ok(v))
            }
            Some(_) => Decision::Record(WaitlistRecord::EntryEnded {
                entry_id: entry_id.to_owned(),
                state,
            }),
        }
    }
}

/// A fan's request to join an event's waitlist.
#[derive(Clone, Debug)]
pub(crate) struct JoinRequest {
    pub entry_id: String,
    pub event_id: EventId,
    pub user_id: UserId,
    pub section_id: Option<SectionId>,
    pub quantity: u32,
    pub at_ms: u64,
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
        let offered = w.offered();
        assert_eq!(offered.len(), 1);
        assert_eq!(offered[0].entry_id, "a");
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
