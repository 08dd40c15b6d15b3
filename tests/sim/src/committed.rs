//! The committed log, as the nodes applied it, and every refusal checked against it.
//!
//! Every node shows the simulation each op of records its state machine applies
//! ([`boxoffice_engine::raft::observe`]); a committed entry is the same on every node, so the
//! sections' records in log order are known once any node applied them. A section decides a
//! hold on the state its records made, and answers only once those records are durable
//! (committed): so a `SOLD_OUT` or a `SEAT_UNAVAILABLE` must be what the section's state was
//! after some prefix of the committed log, and that prefix lies within the call's time:
//! - it holds every record whose call was acknowledged before the refusal was asked (that record
//!   was committed before its answer left);
//! - it holds no record of a call first sent after the refusal was answered (decided later).
//!
//! A refusal no such state gives was decided on a state the log never had: places taken by a
//! change that was never committed, or on a state a newer leader had moved past (a deposed
//! leader's: since issue 27 a leader answers a refusal only once it is known to have led after
//! making it).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use boxoffice_engine::core::SectionRecord;
use boxoffice_engine::raft::observe::{self, Observing};
use boxoffice_engine::store::names;
use boxoffice_engine::{EventId, Layout, RowSpec, SeatStatus, SectionCore, SectionId, SectionSpec};

use crate::check::Violation;
use crate::fans::{EVENT, FLOOR, FLOOR_ROWS, GA, GA_CAPACITY, floor_seats};
use crate::history::{Answer, Fan, History, Op};

/// The ops of section records applied, by `(log index, op in the entry)`: `(stream, records)`.
type Ops = BTreeMap<(u64, usize), (String, Vec<(u64, Vec<u8>)>)>;

/// What the nodes applied in a run (see the module docs).
#[derive(Default)]
pub struct Committed {
    ops: Ops,
    /// Two nodes that applied different records at one place of the log.
    differ: Vec<String>,
}

/// Watches what the nodes of this thread's run apply, until the guard is dropped.
pub fn watch() -> (Rc<RefCell<Committed>>, Observing) {
    let committed = Rc::new(RefCell::new(Committed::default()));
    let into = committed.clone();
    let guard = observe::observe(move |a| {
        if !a.stream.starts_with(names::SECTION_PREFIX) {
            return;
        }
        let mut c = into.borrow_mut();
        let c = &mut *c;
        match c.ops.get(&(a.index, a.op)) {
            None => {
                c.ops
                    .insert((a.index, a.op), (a.stream.to_owned(), a.entries.to_vec()));
            }
            Some((stream, entries)) if stream == a.stream && entries.as_slice() == a.entries => {}
            Some((stream, _)) => c.differ.push(format!(
                "two nodes applied different records at log index {} (op {}): {stream} and {}",
                a.index, a.op, a.stream
            )),
        }
    });
    (committed, guard)
}

/// A record's effect on a hold, to find the record of a call.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Effect {
    Placed(String),
    Confirmed(String),
    Released(String),
}

/// One section's states after each of its records: `(place in the log, free places, seats
/// not free)`, beginning with the state before any record (place 0).
type States = Vec<(u64, u32, BTreeSet<String>)>;

fn spec(section: &str) -> SectionSpec {
    SectionSpec {
        section_id: SectionId::from(section),
        name: section.to_owned(),
        price_cents: 0,
        layout: if section == GA {
            Layout::GeneralAdmission {
                capacity: GA_CAPACITY,
            }
        } else {
            Layout::Reserved {
                rows: FLOOR_ROWS
                    .iter()
                    .map(|(label, n)| RowSpec {
                        label: (*label).to_owned(),
                        seat_count: *n,
                    })
                    .collect(),
            }
        },
        price_tiers: Vec::new(),
    }
}

/// The sections' states through the log, and where each hold's records are in it.
fn replay(
    c: &Committed,
    v: &mut Vec<Violation>,
) -> (BTreeMap<String, States>, BTreeMap<Effect, u64>) {
    let event = EventId::from(EVENT);
    let seats = floor_seats();
    let mut cores: BTreeMap<String, SectionCore> = [GA, FLOOR]
        .into_iter()
        .map(|s| (s.to_owned(), SectionCore::new(event.clone(), spec(s))))
        .collect();
    let mut states: BTreeMap<String, States> = cores
        .iter()
        .map(|(s, core)| (s.clone(), vec![(0, core.counts().1, BTreeSet::new())]))
        .collect();
    let mut at: BTreeMap<Effect, u64> = BTreeMap::new();
    let prefix = names::section(&event, &SectionId::from(""));
    let mut place = 0u64;
    for ((index, _), (stream, entries)) in &c.ops {
        let Some(section) = stream.strip_prefix(&prefix) else {
            continue;
        };
        let Some(core) = cores.get_mut(section) else {
            continue;
        };
        for (seq, bytes) in entries {
            place += 1;
            let record: SectionRecord = match boxoffice_engine::codec::decode(bytes) {
                Ok(r) => r,
                Err(e) => {
                    v.push(Violation::new(format!(
                        "record {seq} of {stream} at log index {index} does not decode: {e}"
                    )));
                    continue;
                }
            };
            let effect = match &record {
                SectionRecord::HoldPlaced { hold_id, .. }
                | SectionRecord::HoldPlacedWithCode { hold_id, .. }
                | SectionRecord::HoldPlacedPriced { hold_id, .. } => {
                    Some(Effect::Placed(hold_id.to_string()))
                }
                SectionRecord::HoldConfirmed { hold_id, .. } => {
                    Some(Effect::Confirmed(hold_id.to_string()))
                }
                SectionRecord::HoldReleased { hold_id, .. } => {
                    Some(Effect::Released(hold_id.to_string()))
                }
                _ => None,
            };
            if let Some(e) = effect {
                at.entry(e).or_insert(place);
            }
            if let Err(e) = core.apply(&record) {
                v.push(Violation::new(format!(
                    "committed record {seq} of {stream} (log index {index}) does not apply: {e}"
                )));
                continue;
            }
            let snap = core.snapshot(*seq);
            let taken = snap
                .seats
                .iter()
                .enumerate()
                .filter(|(_, s)| **s != SeatStatus::Available)
                .filter_map(|(i, _)| seats.get(i).cloned())
                .collect();
            if let Some(s) = states.get_mut(section) {
                s.push((place, snap.available, taken));
            }
        }
    }
    (states, at)
}

/// Each effect the fans' calls may have had: `(effect, when the first call that may have had
/// it was sent, when one was first acknowledged)`. Every attempt of a hold's key counts for the
/// hold it was answered with; every confirm or release of a hold counts for its record.
fn effects(h: &History) -> BTreeMap<Effect, (u64, Option<u64>)> {
    // The hold each key was answered with.
    let mut ids: BTreeMap<(Fan, &str), &str> = BTreeMap::new();
    for c in &h.calls {
        match (&c.op, &c.answer) {
            (Op::Hold { key, .. }, Answer::Hold(held)) => {
                ids.insert((c.fan, key), &held.id);
            }
            (Op::Batch { items }, Answer::Batch(results)) => {
                for ((key, ..), r) in items.iter().zip(results) {
                    if let Ok(held) = r {
                        ids.insert((c.fan, key), &held.id);
                    }
                }
            }
            _ => {}
        }
    }
    let mut by: BTreeMap<Effect, (u64, Option<u64>)> = BTreeMap::new();
    let mut note = |effect: Effect, invoked: u64, acked: bool, completed: u64| {
        let e = by.entry(effect).or_insert((invoked, None));
        e.0 = e.0.min(invoked);
        if acked {
            e.1 = Some(e.1.map_or(completed, |b| b.min(completed)));
        }
    };
    for c in &h.calls {
        let (invoked, completed) = (c.invoked_ms, c.completed_ms);
        match (&c.op, &c.answer) {
            (Op::Hold { key, .. }, a) => {
                if let Some(id) = ids.get(&(c.fan, key.as_str())) {
                    let acked = matches!(a, Answer::Hold(_));
                    note(Effect::Placed((*id).to_owned()), invoked, acked, completed);
                }
            }
            (Op::Batch { items }, a) => {
                for (i, (key, ..)) in items.iter().enumerate() {
                    if let Some(id) = ids.get(&(c.fan, key.as_str())) {
                        let acked =
                            matches!(a, Answer::Batch(r) if matches!(r.get(i), Some(Ok(_))));
                        note(Effect::Placed((*id).to_owned()), invoked, acked, completed);
                    }
                }
            }
            (Op::Confirm { hold, .. }, a) => {
                let acked = matches!(a, Answer::Order(_));
                note(Effect::Confirmed(hold.clone()), invoked, acked, completed);
            }
            (Op::Release { hold }, a) => {
                let acked = matches!(a, Answer::Released);
                note(Effect::Released(hold.clone()), invoked, acked, completed);
            }
            _ => {}
        }
    }
    by
}

/// Why a refusal of `quantity` places of `section` (or `seats`) for `reason` is given by no
/// state of the sections' log from place `lo` to place `hi`; `None` if some state gives it.
fn wrong_refusal(
    states: &BTreeMap<String, States>,
    lo: u64,
    hi: u64,
    section: &str,
    seats: &[String],
    quantity: u32,
    reason: &str,
) -> Option<String> {
    // The states of `section` in that range: the one standing at `lo`, and each after.
    let within = |section: &str| -> Vec<&(u64, u32, BTreeSet<String>)> {
        let Some(s) = states.get(section) else {
            return Vec::new();
        };
        let first = s.iter().rposition(|(p, ..)| *p <= lo).unwrap_or(0);
        s[first..]
            .iter()
            .enumerate()
            .filter(|(i, (p, ..))| *i == 0 || (*p > lo && *p <= hi))
            .map(|(_, state)| state)
            .collect()
    };
    match reason {
        "SOLD_OUT" if seats.is_empty() => {
            let sections: Vec<&str> = if section.is_empty() {
                vec![GA, FLOOR]
            } else {
                vec![section]
            };
            // Every section it asked must have lacked the places at some moment.
            sections
                .into_iter()
                .find(|s| within(s).iter().all(|(_, free, _)| *free >= quantity))
                .map(|s| format!("{s} had {quantity} or more places free in every state"))
        }
        "SEAT_UNAVAILABLE" => within(FLOOR)
            .iter()
            .all(|(_, _, taken)| !seats.iter().any(|seat| taken.contains(seat)))
            .then(|| format!("{seats:?} were free in every state")),
        _ => None,
    }
}

/// Every refusal of `h` that no state of the committed log within its time gives, and what
/// is wrong with the log itself (see the module docs).
pub fn check(h: &History, c: &Committed) -> Vec<Violation> {
    let mut v: Vec<Violation> = c.differ.iter().cloned().map(Violation::new).collect();
    let (states, at) = replay(c, &mut v);
    // Each call's record's place in the log, with when it was first sent and acknowledged.
    let placed: Vec<(u64, u64, Option<u64>)> = effects(h)
        .into_iter()
        .filter_map(|(e, (invoked, acked))| at.get(&e).map(|p| (*p, invoked, acked)))
        .collect();
    // Every refusal of a hold or a batch's item, once per key: from its first attempt (a retry
    // may be answered with the refusal an earlier attempt was decided with) to its first
    // definite answer.
    for r in crate::refusals::logical(h) {
        let Some((to, Err(reason))) = &r.outcome else {
            continue;
        };
        let (from, to, reason) = (r.invoked_ms, *to, reason.as_str());
        let (key, section, seats, quantity) = (&r.key, r.section.as_str(), &r.seats, r.quantity);
        // The places in the log the state it was decided on may end at: after every record
        // acknowledged before it was asked (`since`: before that moment), before any record
        // of a call first sent after it was answered.
        let lo = |since: u64| {
            placed
                .iter()
                .filter(|(_, _, acked)| acked.is_some_and(|a| a < since))
                .map(|(p, ..)| *p)
                .max()
                .unwrap_or(0)
        };
        let hi = placed
            .iter()
            .filter(|(_, invoked, _)| *invoked > to)
            .map(|(p, ..)| p.saturating_sub(1))
            .min()
            .unwrap_or(u64::MAX);
        let wrong = |lo: u64| wrong_refusal(&states, lo, hi, section, seats, quantity, reason);
        let Some(why) = wrong(lo(from)) else {
            continue;
        };
        v.push(Violation::new(format!(
            "fan {}'s hold {key} was refused {reason} at {to} ms (asked at {from} ms), but {why} of the committed log while it ran (its records {}..={})",
            r.fan,
            lo(from),
            if hi == u64::MAX {
                "end".to_owned()
            } else {
                hi.to_string()
            }
        )));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GA's states: free 2 from the start, 0 after record 3, 1 after record 5.
    fn ga() -> BTreeMap<String, States> {
        let state = |place, free| (place, free, BTreeSet::new());
        [(GA.to_owned(), vec![state(0, 2), state(3, 0), state(5, 1)])]
            .into_iter()
            .collect()
    }

    #[test]
    fn a_sold_out_is_right_only_if_a_state_within_its_time_had_too_few_places() {
        let states = ga();
        let wrong =
            |lo, hi, quantity| wrong_refusal(&states, lo, hi, GA, &[], quantity, "SOLD_OUT");
        // Records 3..=4 within its time: the state after record 3 had none free.
        assert_eq!(wrong(1, 4, 1), None);
        // The state standing at its start counts (record 3 before it, record 5 after it).
        assert_eq!(wrong(4, 4, 1), None);
        // Only states with 2 free, or with 1 free for a hold of 1: no state gives it.
        assert!(wrong(0, 2, 1).is_some());
        assert!(wrong(5, u64::MAX, 1).is_some());
        // A hold of 2 with 1 free is refused rightly.
        assert_eq!(wrong(5, u64::MAX, 2), None);
    }

    #[test]
    fn a_seat_unavailable_is_right_only_if_the_seat_was_taken_within_its_time() {
        let seat = "floor:A:1".to_owned();
        let states: BTreeMap<String, States> = [(
            FLOOR.to_owned(),
            vec![
                (0, 8, BTreeSet::new()),
                (2, 7, [seat.clone()].into_iter().collect()),
                (4, 8, BTreeSet::new()),
            ],
        )]
        .into_iter()
        .collect();
        let wrong = |lo, hi| {
            wrong_refusal(
                &states,
                lo,
                hi,
                FLOOR,
                std::slice::from_ref(&seat),
                1,
                "SEAT_UNAVAILABLE",
            )
        };
        assert_eq!(wrong(0, 3), None);
        assert!(wrong(4, 9).is_some());
        assert!(wrong(0, 1).is_some());
    }
}
