//! The checkers: what must hold of every run, whatever its faults.
//!
//! Over the history of calls (each answer against the answers that came before the call was
//! made: a linearizable system may not answer from the past):
//! - places are conserved in every section a `GetEvent` shows, and the sold count never goes
//!   back, nor shows fewer places than the orders acknowledged before the read began;
//! - no seat is in two orders, and a general admission section sells at most its capacity;
//! - an acknowledged hold, order or waitlist entry is found by every later read; a confirmed
//!   hold stays confirmed, a released one released, an order keeps its tickets;
//! - one idempotency key, one answer: every definite answer to a key is the same;
//! - per-user limits hold; queue positions never move back;
//! - every read after the healing gets a definite answer (the cluster serves again).
//!
//! Over what the harness saw of Raft: one node per leader id (openraft 0.9's leader ids are a
//! term and a node, so a term may see two leaders, each with its own id); every node applied
//! the same entry (the same leader's) at a given index.
//!
//! Over each node's disk after the run (an engine opened offline on a copy): it starts, holds
//! every acknowledged hold and order, reconciliation is clean, the engine's invariants hold,
//! and every node's state agrees with every other's.

use std::collections::{BTreeMap, BTreeSet};

use boxoffice_proto::v1 as pb;

use crate::history::{Answer, Call, Fan, History, HoldSeen, Op, OrderSeen};
use crate::node::RaftSeen;

/// A broken promise, named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// What was broken.
    pub text: String,
}

impl Violation {
    /// A broken promise, named.
    pub fn new(text: String) -> Violation {
        Violation { text }
    }
}

/// The key of a call that carries one (holds, confirms), with the fan.
fn keyed(c: &Call) -> Vec<((Fan, String), Result<String, String>)> {
    let summary = |a: &Answer| -> Option<Result<String, String>> {
        match a {
            Answer::Hold(h) => Some(Ok(format!(
                "{} {} {:?} {}",
                h.id, h.section, h.seats, h.quantity
            ))),
            Answer::Order(o) => Some(Ok(format!("{} {} {:?}", o.id, o.hold, o.tickets))),
            Answer::Refused(_, r) => Some(Err(r.clone())),
            _ => None,
        }
    };
    match (&c.op, &c.answer) {
        (Op::Hold { key, .. }, a) | (Op::Confirm { key, .. }, a) => summary(a)
            .map(|s| vec![((c.fan, key.clone()), s)])
            .unwrap_or_default(),
        (Op::Batch { items }, Answer::Batch(results)) => items
            .iter()
            .zip(results)
            .map(|((key, ..), r)| {
                let s = match r {
                    Ok(h) => Ok(format!(
                        "{} {} {:?} {}",
                        h.id, h.section, h.seats, h.quantity
                    )),
                    Err((_, reason)) => Err(reason.clone()),
                };
                ((c.fan, key.clone()), s)
            })
            .collect(),
        _ => vec![],
    }
}

/// Holds acknowledged in an answer, with when.
fn holds_acked(c: &Call) -> Vec<&HoldSeen> {
    match (&c.op, &c.answer) {
        (Op::Hold { .. }, Answer::Hold(h)) => vec![h],
        (Op::Batch { .. }, Answer::Batch(items)) => items.iter().flatten().collect(),
        _ => vec![],
    }
}

/// Every check over the history and what was seen of Raft (`healed_at_ms`: when the fans began
/// to read everything back, if they did).
pub fn history(
    h: &History,
    seen: &RaftSeen,
    per_user_limit: u32,
    healed_at_ms: Option<u64>,
) -> Vec<Violation> {
    let mut v = Vec::new();
    let calls = &h.calls;

    // Acknowledgements and their times.
    let mut hold_acked: BTreeMap<String, u64> = BTreeMap::new();
    let mut confirmed: BTreeMap<String, (u64, OrderSeen)> = BTreeMap::new();
    let mut released: BTreeMap<String, u64> = BTreeMap::new();
    let mut entries: BTreeMap<String, u64> = BTreeMap::new();
    let mut orders: BTreeMap<String, (u64, OrderSeen)> = BTreeMap::new();
    for c in calls {
        for held in holds_acked(c) {
            hold_acked.entry(held.id.clone()).or_insert(c.completed_ms);
        }
        match (&c.op, &c.answer) {
            (Op::Confirm { .. }, Answer::Order(o)) => {
                // The order's hold: the one confirmed, or a new hold of the same places when
                // the one asked for expired while the card was charged (docs/api.md, Confirm).
                confirmed
                    .entry(o.hold.clone())
                    .or_insert((c.completed_ms, o.clone()));
                orders
                    .entry(o.id.clone())
                    .or_insert((c.completed_ms, o.clone()));
            }
            (Op::Release { hold }, Answer::Released) => {
                released.entry(hold.clone()).or_insert(c.completed_ms);
            }
            (Op::JoinWaitlist { .. }, Answer::Entry(id, ..)) => {
                entries.entry(id.clone()).or_insert(c.completed_ms);
            }
            _ => {}
        }
    }

    // Reads against what was acknowledged before they began.
    for c in calls {
        match (&c.op, &c.answer) {
            (Op::GetHold { hold }, a)
            | (Op::Confirm { hold, .. }, a)
            | (Op::Release { hold }, a)
                if a.reason() == "HOLD_NOT_FOUND" =>
            {
                if let Some(at) = hold_acked.get(hold).filter(|at| **at < c.invoked_ms) {
                    v.push(Violation::new(format!(
                        "hold {hold}, acknowledged at {at} ms, was not found by {:?} through node {} at {} ms",
                        c.op, c.node, c.invoked_ms
                    )));
                }
            }
            (Op::GetHold { hold }, Answer::Hold(seen)) => {
                if let Some((at, _)) = confirmed.get(hold).filter(|(at, _)| *at < c.invoked_ms)
                    && seen.status != pb::HoldStatus::Confirmed as i32
                {
                    v.push(Violation::new(format!(
                        "hold {hold}, confirmed at {at} ms, read as status {} through node {} at {} ms",
                        seen.status, c.node, c.invoked_ms
                    )));
                }
                if let Some(at) = released.get(hold).filter(|at| **at < c.invoked_ms)
                    && seen.status != pb::HoldStatus::Released as i32
                {
                    v.push(Violation::new(format!(
                        "hold {hold}, released at {at} ms, read as status {} through node {} at {} ms",
                        seen.status, c.node, c.invoked_ms
                    )));
                }
            }
            (Op::GetOrder { order }, a) => {
                if let Some((at, o)) = orders.get(order).filter(|(at, _)| *at < c.invoked_ms) {
                    match a {
                        Answer::Order(seen)
                            if seen.tickets == o.tickets
                                && seen.amount_cents == o.amount_cents
                                && seen.codes == o.codes => {}
                        Answer::Failed(..) => {}
                        other => v.push(Violation::new(format!(
                            "order {order}, acknowledged at {at} ms as {o:?}, read as {other:?} through node {} at {} ms",
                            c.node, c.invoked_ms
                        ))),
                    }
                }
            }
            (Op::GetEntry { entry }, a)
                if a.reason() == "NOT_FOUND" || a.reason() == "ENTRY_NOT_FOUND" =>
            {
                if let Some(at) = entries.get(entry).filter(|at| **at < c.invoked_ms) {
                    v.push(Violation::new(format!(
                        "waitlist entry {entry}, acknowledged at {at} ms, was not found through node {} at {} ms",
                        c.node, c.invoked_ms
                    )));
                }
            }
            _ => {}
        }
    }

    // Event reads: conservation, never behind the acknowledged orders, never backwards.
    let reads: Vec<&Call> = calls
        .iter()
        .filter(|c| matches!((&c.op, &c.answer), (Op::GetEvent, Answer::Event(_))))
        .collect();
    for r in &reads {
        let Answer::Event(sections) = &r.answer else {
            continue;
        };
        for (section, capacity, available, held, sold) in sections {
            if u64::from(*available) + u64::from(*held) + u64::from(*sold) != u64::from(*capacity) {
                v.push(Violation::new(format!(
                    "section {section} through node {} at {} ms: {available} available + {held} held + {sold} sold != {capacity}",
                    r.node, r.invoked_ms
                )));
            }
            let acked: usize = orders
                .values()
                .filter(|(at, _)| *at < r.invoked_ms)
                .map(|(_, o)| o.places_in(section))
                .sum();
            if (*sold as usize) < acked {
                v.push(Violation::new(format!(
                    "section {section} read through node {} at {} ms shows {sold} sold, but {acked} places were sold in orders acknowledged before (a stale read)",
                    r.node, r.invoked_ms
                )));
            }
        }
    }
    for a in &reads {
        for b in &reads {
            if a.completed_ms >= b.invoked_ms {
                continue;
            }
            let (Answer::Event(sa), Answer::Event(sb)) = (&a.answer, &b.answer) else {
                continue;
            };
            for (section, _, _, _, sold_a) in sa {
                if let Some((_, _, _, _, sold_b)) = sb.iter().find(|s| &s.0 == section)
                    && sold_b < sold_a
                {
                    v.push(Violation::new(format!(
                        "section {section}: {sold_a} sold read through node {} by {} ms, then {sold_b} through node {} at {} ms (sold went back)",
                        a.node, a.completed_ms, b.node, b.invoked_ms
                    )));
                }
            }
        }
    }

    // No seat in two orders; general admission within capacity.
    let mut seat_orders: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut all_orders: BTreeMap<String, OrderSeen> = BTreeMap::new();
    for c in calls {
        if let Answer::Order(o) = &c.answer {
            // A ticket's code never changes, whichever node answers (the cluster's key ring).
            let first = all_orders.entry(o.id.clone()).or_insert_with(|| o.clone());
            if first.codes != o.codes {
                v.push(Violation::new(format!(
                    "order {}'s tickets showed the codes {:?}, then {:?} through node {} at {} ms",
                    o.id, first.codes, o.codes, c.node, c.invoked_ms
                )));
            }
            for (_, section, seat) in &o.tickets {
                if !seat.is_empty() {
                    seat_orders
                        .entry((section.clone(), seat.clone()))
                        .or_default()
                        .insert(o.id.clone());
                }
            }
        }
    }
    for ((section, seat), os) in &seat_orders {
        if os.len() > 1 {
            v.push(Violation::new(format!(
                "seat {seat} of {section} is in {} orders: {os:?}",
                os.len()
            )));
        }
    }
    let ga_sold: usize = all_orders
        .values()
        .map(|o| o.places_in(crate::fans::GA))
        .sum();
    if ga_sold > crate::fans::GA_CAPACITY as usize {
        v.push(Violation::new(format!(
            "{ga_sold} general admission places sold in orders, capacity {}",
            crate::fans::GA_CAPACITY
        )));
    }

    // One key, one answer.
    let mut answers: BTreeMap<(Fan, String), BTreeSet<Result<String, String>>> = BTreeMap::new();
    for c in calls {
        for (k, a) in keyed(c) {
            answers.entry(k).or_default().insert(a);
        }
    }
    for ((fan, key), set) in &answers {
        if set.len() > 1 {
            v.push(Violation::new(format!(
                "fan {fan}'s key {key} had {} different answers: {set:?}",
                set.len()
            )));
        }
    }

    // Queue positions never move back; an admission is never taken back. (Each is a read
    // answered from an older state of the line than one already shown.) Waiting at position 0
    // is the line before its opening draw: no place yet.
    let mut standing: BTreeMap<Fan, (u64, i32)> = BTreeMap::new();
    for c in calls {
        if let (Op::Status, Answer::Queue(position, state, _)) = (&c.op, &c.answer) {
            let unplaced = *position == 0 && *state == pb::QueueState::Waiting as i32;
            if let Some((p, s)) = standing.get(&c.fan) {
                if unplaced {
                    v.push(Violation::new(format!(
                            "fan {} had place {p} in the line, then was told the line has not                              opened (node {}, {} ms)",
                            c.fan, c.node, c.invoked_ms
                        ),
                    ));
                    continue;
                }
                if position > p {
                    v.push(Violation::new(format!(
                            "fan {}'s place in the line moved back from {p} to {position} (node {}, {} ms)",
                            c.fan, c.node, c.invoked_ms
                        ),
                    ));
                }
                if *s == pb::QueueState::Admitted as i32
                    && *state != pb::QueueState::Admitted as i32
                {
                    v.push(Violation::new(format!(
                        "fan {}'s admission was taken back (state {state}, node {}, {} ms)",
                        c.fan, c.node, c.invoked_ms
                    )));
                }
            }
            if !unplaced {
                standing.insert(c.fan, (*position, *state));
            }
        }
    }

    // Per-user limit: the places a fan's holds take as the read-back finds them (no fan takes
    // a new hold then, so what one read shows held was held at every earlier read too).
    let mut last_read: BTreeMap<String, (Fan, HoldSeen)> = BTreeMap::new();
    for c in calls
        .iter()
        .filter(|c| healed_at_ms.is_some_and(|at| c.invoked_ms >= at))
    {
        if let (Op::GetHold { .. }, Answer::Hold(h)) = (&c.op, &c.answer) {
            last_read.entry(h.id.clone()).or_insert((c.fan, h.clone()));
        }
    }
    let mut taken: BTreeMap<Fan, u32> = BTreeMap::new();
    for (fan, h) in last_read.values() {
        if h.status == pb::HoldStatus::Held as i32 || h.status == pb::HoldStatus::Confirmed as i32 {
            *taken.entry(*fan).or_default() += h.quantity;
        }
    }
    for (fan, places) in taken {
        if places > per_user_limit {
            v.push(Violation::new(format!(
                "fan {fan} holds or bought {places} places, the limit is {per_user_limit}"
            )));
        }
    }

    // Raft: one leader per leader id (openraft's is the term and the node); one entry per
    // index, on every node that applied it.
    let mut ids: BTreeMap<crate::node::LeaderId, BTreeSet<u64>> = BTreeMap::new();
    for (node, id, _, _) in &seen.leads {
        ids.entry(*id).or_default().insert(*node);
    }
    for (id, nodes) in &ids {
        if nodes.len() > 1 {
            v.push(Violation::new(format!(
                "leader id {id:?} was held by {nodes:?}"
            )));
        }
    }
    for (index, leaders) in &seen.applied {
        if leaders.len() > 1 {
            v.push(Violation::new(format!(
                "log index {index} was applied from the entries of different leaders (term, node): {leaders:?}"
            )));
        }
    }
    v
}

/// The calls after the healing that never got a definite answer: the cluster did not serve
/// again.
pub fn served_after_healing(h: &History, healed_at_ms: u64) -> Vec<Violation> {
    h.calls
        .iter()
        .filter(|c| c.invoked_ms >= healed_at_ms && !c.op.writes())
        .fold(BTreeMap::<String, Option<&Call>>::new(), |mut last, c| {
            last.insert(format!("{}:{:?}", c.fan, c.op), Some(c));
            last
        })
        .into_values()
        .flatten()
        .filter(|c| !c.answer.definite())
        .map(|c| {
            Violation::new(format!(
                "after healing, {:?} of fan {} never got an answer (last: {:?} from node {})",
                c.op, c.fan, c.answer, c.node
            ))
        })
        .collect()
}
