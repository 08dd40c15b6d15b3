//! Refusals against the places that could have been taken: a `SOLD_OUT` or a
//! `SEAT_UNAVAILABLE` is linearizable only if, at some moment while the call ran, the places it
//! wanted were taken by holds that could have been there then.
//!
//! Every hold is some fan's call (or a waitlist offer, made for a fan who joined): the checker
//! counts, for each refusal, every hold that could have been active while it ran (made before
//! the refusal answered, not known ended before it was asked), generously: a call without a
//! definite answer may have taken its places, an expired hold counts until a read saw it ended,
//! and a hold whose confirm may have run keeps its places (a confirm that finds its hold expired
//! holds the same places again). If even then the section had the places free throughout, the
//! refusal answered from a state that never was: a violation.

use std::collections::{BTreeMap, BTreeSet};

use boxoffice_proto::v1 as pb;

use crate::check::Violation;
use crate::fans::{FLOOR, GA, GA_CAPACITY, floor_seats};
use crate::history::{Answer, Fan, History, HoldSeen, Op};

/// One logical hold: every attempt of one idempotency key (a call or a batch item).
pub(crate) struct Logical {
    pub(crate) fan: Fan,
    pub(crate) key: String,
    /// The section asked for (empty: any).
    pub(crate) section: String,
    /// Exact seats asked for (empty: best available).
    pub(crate) seats: Vec<String>,
    pub(crate) quantity: u32,
    /// The first attempt's start.
    pub(crate) invoked_ms: u64,
    /// The first definite answer: the hold, or the refusal's reason; with when it came.
    pub(crate) outcome: Option<(u64, Result<HoldSeen, String>)>,
}

fn capacity(section: &str) -> u32 {
    if section == GA {
        GA_CAPACITY
    } else {
        u32::try_from(floor_seats().len()).unwrap_or(u32::MAX)
    }
}

/// The logical holds of a history, in the order of their first attempts.
pub(crate) fn logical(h: &History) -> Vec<Logical> {
    let mut by_key: BTreeMap<(Fan, String), Logical> = BTreeMap::new();
    let mut note = |fan: Fan,
                    key: &str,
                    section: &str,
                    seats: &[String],
                    quantity: u32,
                    invoked_ms: u64,
                    completed_ms: u64,
                    answer: Option<Result<HoldSeen, String>>| {
        let l = by_key
            .entry((fan, key.to_owned()))
            .or_insert_with(|| Logical {
                fan,
                key: key.to_owned(),
                section: section.to_owned(),
                seats: seats.to_vec(),
                quantity,
                invoked_ms,
                outcome: None,
            });
        l.invoked_ms = l.invoked_ms.min(invoked_ms);
        if l.outcome.is_none()
            && let Some(a) = answer
        {
            l.outcome = Some((completed_ms, a));
        }
    };
    for c in &h.calls {
        match (&c.op, &c.answer) {
            (
                Op::Hold {
                    key,
                    section,
                    seats,
                    quantity,
                },
                a,
            ) => {
                let answer = match a {
                    Answer::Hold(held) => Some(Ok(held.clone())),
                    Answer::Refused(_, r) => Some(Err(r.clone())),
                    _ => None,
                };
                note(
                    c.fan,
                    key,
                    section,
                    seats,
                    *quantity,
                    c.invoked_ms,
                    c.completed_ms,
                    answer,
                );
            }
            (Op::Batch { items }, a) => {
                for (i, (key, section, quantity)) in items.iter().enumerate() {
                    let answer = match a {
                        Answer::Batch(results) => results.get(i).map(|r| match r {
                            Ok(held) => Ok(held.clone()),
                            Err((_, reason)) => Err(reason.clone()),
                        }),
                        // A refusal of the whole call is no item's answer.
                        _ => None,
                    };
                    let answer = answer.filter(|r| {
                        !matches!(r, Err(reason) if reason == "OVERLOADED" || reason == "IDEMPOTENCY_KEY_IN_FLIGHT" || reason == "STORAGE_FAILED" || reason == "NOT_READY")
                    });
                    note(
                        c.fan,
                        key,
                        section,
                        &[],
                        *quantity,
                        c.invoked_ms,
                        c.completed_ms,
                        answer,
                    );
                }
            }
            _ => {}
        }
    }
    let mut all: Vec<Logical> = by_key.into_values().collect();
    all.sort_by_key(|l| (l.invoked_ms, l.fan, l.key.clone()));
    all
}

/// Every refusal of a history that no possible state could have given. `never_made`: keys of
/// holds the fans gave up on that no node's disk remembers after the run (they took no places).
pub fn check(h: &History, never_made: &BTreeSet<String>) -> Vec<Violation> {
    let holds = logical(h);
    // When a hold was known to have ended (released, or read released or expired), unless a
    // confirm of it may have run (it may live on as a new hold of the same places).
    let mut ended: BTreeMap<String, u64> = BTreeMap::new();
    let mut confirmed: BTreeSet<String> = BTreeSet::new();
    for c in &h.calls {
        match (&c.op, &c.answer) {
            (Op::Release { hold }, Answer::Released) => {
                ended.entry(hold.clone()).or_insert(c.completed_ms);
            }
            (Op::GetHold { hold }, Answer::Hold(seen))
                if seen.status == pb::HoldStatus::Released as i32
                    || seen.status == pb::HoldStatus::Expired as i32 =>
            {
                ended.entry(hold.clone()).or_insert(c.completed_ms);
            }
            (Op::Confirm { hold, .. }, a) if !matches!(a, Answer::Refused(..)) => {
                confirmed.insert(hold.clone());
            }
            _ => {}
        }
    }
    // Waitlist entries a fan may have been offered places for: `(section, quantity, since)`.
    let offers: Vec<(String, u32, u64)> = h
        .calls
        .iter()
        .filter_map(|c| match (&c.op, &c.answer) {
            (Op::JoinWaitlist { section, quantity }, a) if !matches!(a, Answer::Refused(..)) => {
                Some((section.clone(), *quantity, c.invoked_ms))
            }
            _ => None,
        })
        .collect();

    let mut v = Vec::new();
    for r in &holds {
        let Some((answered_ms, Err(reason))) = &r.outcome else {
            continue;
        };
        // Why no state from `from` (when the places it wanted were last known free) to its
        // answer gives the refusal.
        let why = |from: u64| -> Vec<String> {
            let ctx = Context {
                holds: &holds,
                ended: &ended,
                confirmed: &confirmed,
                offers: &offers,
                never_made,
            };
            ctx.wrong(r, from, *answered_ms, reason)
        };
        let found = why(r.invoked_ms);
        if found.is_empty() {
            continue;
        }
        v.extend(found.into_iter().map(Violation::new));
    }
    v
}

/// What a refusal is judged against: every logical hold, when holds were known to have ended,
/// the holds a confirm may have kept, the waitlist's possible offers and the holds never made.
struct Context<'a> {
    holds: &'a [Logical],
    ended: &'a BTreeMap<String, u64>,
    confirmed: &'a BTreeSet<String>,
    offers: &'a [(String, u32, u64)],
    never_made: &'a BTreeSet<String>,
}

impl Context<'_> {
    /// Could `x` have held places at some moment from `from` to `to`, while `r` ran?
    fn could_hold(&self, x: &Logical, r: &Logical, from: u64, to: u64) -> bool {
        if std::ptr::eq(x, r) || x.invoked_ms >= to {
            return false;
        }
        match &x.outcome {
            Some((_, Err(_))) => false,
            Some((_, Ok(held))) => {
                self.confirmed.contains(&held.id)
                    || self.ended.get(&held.id).is_none_or(|end| *end >= from)
            }
            None => !self.never_made.contains(&x.key),
        }
    }

    /// Why refusal `r` (answered `reason` at `to`) matches no state from `from` on: empty if
    /// some state could have given it.
    fn wrong(&self, r: &Logical, from: u64, to: u64, reason: &str) -> Vec<String> {
        let mut v = Vec::new();
        let could = |x: &&Logical| self.could_hold(x, r, from, to);
        let sections: Vec<&str> = if r.section.is_empty() {
            vec![GA, FLOOR]
        } else {
            vec![r.section.as_str()]
        };
        match reason {
            "SOLD_OUT" if r.seats.is_empty() => {
                // Every section asked must have lacked the places at some moment.
                for section in sections {
                    let mut taken: u32 = self
                        .holds
                        .iter()
                        .filter(could)
                        .map(|x| match &x.outcome {
                            Some((_, Ok(held))) if held.section == section => held.quantity,
                            Some(_) => 0,
                            None if x.section == section || x.section.is_empty() => {
                                x.quantity.max(u32::try_from(x.seats.len()).unwrap_or(0))
                            }
                            None => 0,
                        })
                        .sum();
                    taken += self
                        .offers
                        .iter()
                        .filter(|(s, _, since)| s == section && *since < to)
                        .map(|(_, q, _)| *q)
                        .sum::<u32>();
                    if taken + r.quantity <= capacity(section) {
                        v.push(format!(
                            "fan {}'s hold {} ({} x{}) was refused SOLD_OUT at {to} ms, but at most {taken} of {} places of {section} could have been taken while it ran (from {} ms)",
                            r.fan,
                            r.key,
                            if r.section.is_empty() { "any section" } else { &r.section },
                            r.quantity,
                            capacity(section),
                            r.invoked_ms
                        ));
                    }
                }
            }
            "SEAT_UNAVAILABLE" => {
                // One of the seats asked must have been taken, by some hold that could hold it.
                let takers = |seat: &String| {
                    self.holds.iter().filter(could).any(|x| match &x.outcome {
                        Some((_, Ok(held))) => held.seats.contains(seat),
                        Some(_) => false,
                        None => {
                            x.seats.contains(seat)
                                || (x.seats.is_empty()
                                    && (x.section == FLOOR || x.section.is_empty()))
                        }
                    }) || self
                        .offers
                        .iter()
                        .any(|(s, _, since)| s == FLOOR && *since < to)
                };
                if !r.seats.iter().any(takers) {
                    v.push(format!(
                        "fan {}'s hold {} of {:?} was refused SEAT_UNAVAILABLE at {to} ms, but no hold could have had those seats while it ran (from {} ms)",
                        r.fan, r.key, r.seats, r.invoked_ms
                    ));
                }
            }
            _ => {}
        }
        v
    }
}
