//! Each node's disk after a run, read offline: an engine opened on a copy of what the node
//! wrote (as a new leader would open it), checked against what the fans were told.

use std::collections::BTreeMap;
use std::sync::Arc;

use boxoffice_engine::store::{KvSink, SimKv};
use boxoffice_engine::{
    Engine, EngineConfig, EventId, HoldId, HoldRequest, ManualClock, SectionId, Selection, UserId,
};

use crate::fans::EVENT;

/// A ticket as an answer showed it: `(ticket, section, seat)`.
pub type Ticket = (String, String, String);

/// What the fans were told, to find on every node.
#[derive(Default)]
pub struct Acked {
    /// `(hold, fan's user)`.
    pub holds: Vec<(String, String)>,
    /// `(order, its tickets)`.
    pub orders: Vec<(String, Vec<Ticket>)>,
    /// `(waitlist entry, fan's user)`.
    pub entries: Vec<(String, String)>,
    /// Holds of which no attempt got a definite answer (the fan gave up): `(key, fan's user,
    /// what it asked for)`. Whether each was made is read from the disks.
    pub unanswered: Vec<(String, String, Selection)>,
}

/// What one node's disk holds.
#[derive(Default)]
pub struct Found {
    /// What is wrong with it.
    pub violations: Vec<String>,
    /// Its state, if it opened with the event made.
    pub state: Option<State>,
    /// The keys of [`Acked::unanswered`] it remembers (those holds were made).
    pub made: std::collections::BTreeSet<String>,
}

/// A node's state, as far as two nodes that applied the same entries must agree.
#[derive(Debug, PartialEq, Eq)]
pub struct State {
    /// Each section's `(available, held, sold)`.
    pub counts: BTreeMap<String, (u32, u32, u32)>,
    /// Each reserved seat's status.
    pub seats: BTreeMap<String, String>,
    /// Every order: `(id, hold, seats)`.
    pub orders: Vec<(String, String, Vec<String>)>,
}

/// Opens an engine on a copy of `disk` (node `id`'s) at `now_ms` and checks it: what it
/// found. A node whose disk had a bit flipped (`damaged`) may refuse to open, naming the
/// damage; every other refusal, and any loss, is a violation.
pub async fn check_node(id: u64, disk: &SimKv, acked: &Acked, now_ms: u64, damaged: bool) -> Found {
    let (violations, state, made) = check_copy(id, disk, acked, now_ms, damaged).await;
    Found {
        violations,
        state,
        made,
    }
}

/// The holds on a node's disk that were placed without a key and that no answer named:
/// `(user, section, seats, quantity)`. `None` if a section could not be read.
async fn keyless_holds(
    engine: &Engine,
    acked: &Acked,
) -> Option<Vec<(String, String, Vec<String>, u32)>> {
    let answered: std::collections::BTreeSet<&str> =
        acked.holds.iter().map(|(h, _)| h.as_str()).collect();
    let mut found = Vec::new();
    for section in [crate::fans::GA, crate::fans::FLOOR] {
        let core = engine
            .inspect_section(&EventId::from(EVENT), &SectionId::from(section))
            .await
            .ok()?;
        found.extend(
            core.holds_for_ledger()
                .filter(|(view, _, tag, _)| {
                    tag.is_none() && !answered.contains(view.hold_id.as_str())
                })
                .map(|(view, ..)| {
                    let mut seats: Vec<String> =
                        view.seat_ids.iter().map(|s| s.to_string()).collect();
                    seats.sort();
                    (
                        view.user_id.to_string(),
                        view.section_id.to_string(),
                        seats,
                        view.quantity,
                    )
                }),
        );
    }
    Some(found)
}

async fn check_copy(
    id: u64,
    disk: &SimKv,
    acked: &Acked,
    now_ms: u64,
    damaged: bool,
) -> (
    Vec<String>,
    Option<State>,
    std::collections::BTreeSet<String>,
) {
    let mut made = std::collections::BTreeSet::new();
    let mut v = Vec::new();
    let copy = disk.fork();
    let sink = match KvSink::new(Arc::new(copy)) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            return (
                vec![format!("node {id}: its disk does not open: {e}")],
                None,
                made,
            );
        }
    };
    let mut config = EngineConfig::new(std::path::PathBuf::new());
    config.sink = Some(sink);
    config.clock = Arc::new(ManualClock::new(now_ms));
    let engine = match Engine::open(config).await {
        Ok(e) => e,
        Err(boxoffice_engine::EngineError::Storage(boxoffice_engine::StorageError::Damaged {
            ..
        })) if damaged => {
            // A flipped bit, named: the node refuses to serve from its copy.
            return (v, None, made);
        }
        Err(e) => {
            return (
                vec![format!("node {id}: its copy of the log does not open: {e}")],
                None,
                made,
            );
        }
    };
    if engine.event(&EventId::from(EVENT)).is_err() {
        // The event was never made (a run that did not get that far): nothing to check.
        engine.shutdown().await;
        return (v, None, made);
    }
    let keyless = keyless_holds(&engine, acked).await;
    for (key, user, selection) in &acked.unanswered {
        if key.starts_with(crate::history::NO_KEY) {
            // Sent without a key: made if the disk has a hold with no key that could be it (the
            // fan's, of what it asked for, and answered to no call); counted as made when the
            // sections cannot be read (the refusals' check stays generous).
            let could_be = |(u, section, seats, quantity): &(String, String, Vec<String>, u32)| {
                u == user
                    && match selection {
                        Selection::Seats(asked) => {
                            let mut asked: Vec<String> =
                                asked.iter().map(|s| s.to_string()).collect();
                            asked.sort();
                            asked == *seats
                        }
                        Selection::BestAvailable {
                            section: asked,
                            quantity: q,
                        } => q == quantity && asked.as_ref().is_none_or(|a| a.as_str() == section),
                    }
            };
            if keyless
                .as_ref()
                .is_none_or(|found| found.iter().any(could_be))
            {
                made.insert(key.clone());
            }
            continue;
        }
        let asked = HoldRequest {
            event_id: EventId::from(EVENT),
            user_id: UserId::from(user.as_str()),
            idempotency_key: key.clone(),
            selection: selection.clone(),
            access_code: String::new(),
        };
        // Known, or not readable (then counted as made: the refusals' check stays generous).
        if !matches!(engine.replayed_hold(&asked).await, Ok(None)) {
            made.insert(key.clone());
        }
    }
    for (hold, user) in &acked.holds {
        if let Err(e) = engine
            .get_hold_of(&HoldId::from(hold.as_str()), &UserId::from(user.as_str()))
            .await
        {
            v.push(format!(
                "node {id}: acknowledged hold {hold} is missing from its copy: {e}"
            ));
        }
    }
    let orders = engine.orders().await.unwrap_or_default();
    for (order, tickets) in &acked.orders {
        match orders.iter().find(|o| o.order_id.as_str() == order) {
            None => v.push(format!(
                "node {id}: acknowledged order {order} is missing from its copy"
            )),
            Some(o) => {
                let seen: Vec<Ticket> = o
                    .tickets
                    .iter()
                    .map(|t| {
                        (
                            t.ticket_id.clone(),
                            t.section_id.to_string(),
                            t.seat_id
                                .as_ref()
                                .map(|s| s.to_string())
                                .unwrap_or_default(),
                        )
                    })
                    .collect();
                if &seen != tickets {
                    v.push(format!("node {id}: order {order}'s tickets changed: {seen:?}, acknowledged {tickets:?}"));
                }
            }
        }
    }
    for (entry, user) in &acked.entries {
        if let Err(e) = engine
            .waitlist_entry_of(entry, &UserId::from(user.as_str()))
            .await
        {
            v.push(format!(
                "node {id}: acknowledged waitlist entry {entry} is missing from its copy: {e}"
            ));
        }
    }
    // As the server's periodic pass sees it: a captured charge whose checkout ended without
    // an order waits for its refund (not a finding); anything else is one.
    match engine
        .settle_and_reconcile(std::time::Duration::from_secs(3_600))
        .await
    {
        Ok((f, _)) if f.is_empty() => {}
        Ok((f, _)) => v.push(format!("node {id}: reconciliation found {f:?}")),
        Err(e) => v.push(format!("node {id}: reconciliation could not run: {e}")),
    }
    match engine.invariant_violations().await {
        Ok(f) if f.is_empty() => {}
        Ok(f) => v.push(format!(
            "node {id}: the engine's invariants are broken: {f:?}"
        )),
        Err(e) => v.push(format!(
            "node {id}: the invariants could not be checked: {e}"
        )),
    }
    let state = engine
        .seat_map(&EventId::from(EVENT), None)
        .ok()
        .map(|map| State {
            counts: map
                .sections
                .iter()
                .map(|s| (s.section_id.to_string(), (s.available, s.held, s.sold)))
                .collect(),
            seats: map
                .sections
                .iter()
                .flat_map(|s| {
                    s.seats
                        .iter()
                        .map(|seat| (seat.seat_id.to_string(), format!("{:?}", seat.status)))
                })
                .collect(),
            orders: {
                let mut o: Vec<(String, String, Vec<String>)> = orders
                    .iter()
                    .map(|o| {
                        (
                            o.order_id.to_string(),
                            o.hold_id.to_string(),
                            o.tickets
                                .iter()
                                .map(|t| {
                                    t.seat_id
                                        .as_ref()
                                        .map(|s| s.to_string())
                                        .unwrap_or_default()
                                })
                                .collect(),
                        )
                    })
                    .collect();
                o.sort();
                o
            },
        });
    engine.shutdown().await;
    (v, state, made)
}
