//! Model-based property test: random sequences of hold / hold batch / confirm / release /
//! expire / advance time / replay an idempotency key / crash and restart from the log, run
//! against the real engine (actors, sled log, ledger) and a naive model, compared after every
//! step. A hold batch is one user's items, which the engine decides one after the other as
//! separate holds: each answer is checked against the model in item order.
//!
//! Checked: invariants 1 and 2 (the core's full check after every step), 5 (a key has one
//! effect; replays return the first answer), 6 (no confirm succeeds on an expired hold), 7 (per
//! user `held + sold <= limit`), and that every acknowledged change survives a restart: a crash
//! of the process over the sled log, and (the second property) a power cut over a `MemorySink`,
//! which loses everything after the last good sync.
//!
//! Retention runs with a short idempotency window (`WINDOW_MS`, half a hold TTL): a
//! key's answer is forgotten one window after it was given (a retry is a new request), and a
//! released or expired hold is forgotten by its section at the first record it applies one
//! window or more after the hold ended (`HOLD_NOT_FOUND` from then on). The model forgets by the
//! same rules; after a restart the replayed engine must have forgotten exactly the same holds.
//!
//! `PROPTEST_CASES` sets the number of cases (default 48; the slow tier `BOXOFFICE_SLOW=1`
//! runs 400).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashMap;
use std::sync::Arc;

use boxoffice_engine::{
    ConfirmRequest, Engine, EngineConfig, EngineError, EventId, HoldId, HoldRequest, HoldStatus,
    HoldView, ManualClock, MemorySink, Rejection, SeatId, SeatStatus, SectionId, Selection, UserId,
};
use boxoffice_tests::{T0_MS, event, ga, on_runtime, reserved};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

const TTL_MS: u64 = 30_000;
/// The idempotency window of the model runs: short, so that sequences reach it.
const WINDOW_MS: u64 = 15_000;
const LIMIT: u32 = 4;
const USERS: usize = 4;

/// The sections: a small GA, a 2x4 reserved, a 1x3 reserved.
fn sections() -> Vec<boxoffice_engine::SectionSpec> {
    vec![
        ga("ga", 6, 100),
        reserved("r1", 2, 4, 200),
        reserved("r2", 1, 3, 300),
    ]
}

/// Seat ids of the reserved sections in layout order, by section index (GA has none).
fn seat_ids(section: usize) -> Vec<SeatId> {
    match section {
        1 => ["A", "B"]
            .iter()
            .flat_map(|r| (1..=4).map(move |n| SeatId::from(format!("r1:{r}:{n}"))))
            .collect(),
        2 => (1..=3).map(|n| SeatId::from(format!("r2:A:{n}"))).collect(),
        _ => Vec::new(),
    }
}

fn section_name(i: usize) -> &'static str {
    ["ga", "r1", "r2"][i]
}

#[derive(Clone, Debug)]
enum Op {
    HoldBest {
        user: usize,
        section: Option<usize>,
        quantity: u32,
        key: Option<u8>,
    },
    HoldSeats {
        user: usize,
        section: usize,
        seats: Vec<usize>,
        key: Option<u8>,
    },
    Confirm {
        hold: usize,
        wrong_user: bool,
        key: Option<u8>,
    },
    Release {
        hold: usize,
    },
    /// One user's `HoldBatch`: best-available items (a section, or any), each with its key.
    HoldBatch {
        user: usize,
        items: Vec<(Option<usize>, u32, Option<u8>)>,
    },
    Advance(u64),
    Expire,
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..USERS, proptest::option::of(0..3usize), 1..4u32, proptest::option::of(0..3u8))
            .prop_map(|(user, section, quantity, key)| Op::HoldBest { user, section, quantity, key }),
        3 => (0..USERS, 1..3usize, proptest::collection::vec(0..8usize, 1..3), proptest::option::of(0..3u8))
            .prop_map(|(user, section, seats, key)| Op::HoldSeats { user, section, seats, key }),
        3 => (0..64usize, proptest::bool::weighted(0.1), proptest::option::of(0..3u8))
            .prop_map(|(hold, wrong_user, key)| Op::Confirm { hold, wrong_user, key }),
        1 => (0..64usize).prop_map(|hold| Op::Release { hold }),
        2 => (0..USERS, proptest::collection::vec(
                (proptest::option::of(0..3usize), 1..4u32, proptest::option::of(0..3u8)),
                1..5,
            ))
            .prop_map(|(user, items)| Op::HoldBatch { user, items }),
        2 => prop_oneof![Just(1u64), 0..20_000u64, Just(TTL_MS)].prop_map(Op::Advance),
        1 => Just(Op::Expire),
        1 => Just(Op::Restart),
    ]
}

#[derive(Clone, Debug)]
struct MHold {
    view: HoldView,
    section: usize,
    /// Seat indices (reserved) in layout order.
    seats: Vec<usize>,
    status: HoldStatus,
    /// When it was released or expired.
    ended_at: Option<u64>,
    /// Its section forgot it (an ended hold, one window after it ended).
    forgotten: bool,
}

#[derive(Default)]
struct Model {
    now: u64,
    /// Per section: capacity and per seat (reserved) the status; GA uses counts only.
    seats: Vec<Vec<SeatStatus>>,
    ga_held: u32,
    ga_sold: u32,
    holds: Vec<MHold>,
    /// (user, rpc, key) -> (request fingerprint as debug text, first answer as debug text,
    /// when the answer was given)
    keys: HashMap<(usize, &'static str, u8), (String, String, u64)>,
}

impl Model {
    fn new() -> Model {
        Model {
            now: T0_MS,
            seats: vec![
                Vec::new(),
                vec![SeatStatus::Available; 8],
                vec![SeatStatus::Available; 3],
            ],
            ..Model::default()
        }
    }

    fn available(&self, section: usize) -> u32 {
        if section == 0 {
            6 - self.ga_held - self.ga_sold
        } else {
            self.seats[section]
                .iter()
                .filter(|s| **s == SeatStatus::Available)
                .count() as u32
        }
    }

    fn usage(&self, user: usize) -> u32 {
        self.holds
            .iter()
            .filter(|h| h.view.user_id.as_str() == user_name(user))
            .filter(|h| matches!(h.status, HoldStatus::Held | HoldStatus::Confirmed))
            .map(|h| h.view.quantity)
            .sum()
    }

    fn set(&mut self, h: usize, status: HoldStatus) {
        let hold = &self.holds[h];
        let (section, q) = (hold.section, hold.view.quantity);
        let seat_status = match status {
            HoldStatus::Held => SeatStatus::Held,
            HoldStatus::Confirmed => SeatStatus::Sold,
            _ => SeatStatus::Available,
        };
        if section == 0 {
            match (hold.status, status) {
                (HoldStatus::Held, HoldStatus::Confirmed) => {
                    self.ga_held -= q;
                    self.ga_sold += q;
                }
                (HoldStatus::Held, _) => self.ga_held -= q,
                _ => unreachable!(),
            }
        } else {
            for &s in &hold.seats.clone() {
                self.seats[section][s] = seat_status;
            }
        }
        self.holds[h].status = status;
        if matches!(status, HoldStatus::Released | HoldStatus::Expired) {
            self.holds[h].ended_at = Some(self.now);
        }
    }

    /// A record was applied in `section` now: it forgets the section's holds that ended one
    /// window or more ago.
    fn recorded(&mut self, section: usize) {
        let now = self.now;
        for h in &mut self.holds {
            if h.section == section && h.ended_at.is_some_and(|at| now - at >= WINDOW_MS) {
                h.forgotten = true;
            }
        }
    }

    /// The first answer of a key, unless its window has passed (then the key is forgotten).
    fn key(&mut self, k: (usize, &'static str, u8)) -> Option<(String, String)> {
        match self.keys.get(&k) {
            Some((_, _, at)) if self.now - at >= WINDOW_MS => {
                self.keys.remove(&k);
                None
            }
            Some((fp, answer, _)) => Some((fp.clone(), answer.clone())),
            None => None,
        }
    }
}

fn user_name(u: usize) -> String {
    format!("user{u}")
}

fn key_name(k: Option<u8>) -> String {
    k.map(|k| format!("key{k}")).unwrap_or_default()
}

fn rejection(r: &Result<impl std::fmt::Debug, EngineError>) -> Option<Rejection> {
    match r {
        Err(EngineError::Rejected(rej)) => Some(rej.clone()),
        Ok(_) => None,
        Err(e) => panic!("unexpected engine error {e:?}"),
    }
}

/// Compares the engine with the model: counts, seats, holds, usage; full core invariants.
async fn compare(engine: &Engine, m: &Model) {
    let ev = EventId::from("m");
    for i in 0..3 {
        let core = engine
            .inspect_section(&ev, &SectionId::from(section_name(i)))
            .await
            .unwrap();
        core.check_invariants().unwrap();
        let (cap, avail, held, sold) = core.counts();
        if i == 0 {
            assert_eq!((cap, held, sold), (6, m.ga_held, m.ga_sold), "ga counts");
        } else {
            assert_eq!(
                core.snapshot(0).seats,
                m.seats[i],
                "seats of {}",
                section_name(i)
            );
        }
        assert_eq!(avail, m.available(i), "available in {}", section_name(i));
    }
    for h in &m.holds {
        let now = engine.get_hold(&h.view.hold_id).await;
        if h.forgotten {
            assert_eq!(
                rejection(&now),
                Some(Rejection::HoldNotFound),
                "forgotten {h:?}"
            );
            continue;
        }
        let now = now.unwrap();
        assert_eq!(now.status, h.status, "status of {}", h.view.hold_id);
        assert_eq!(now.expires_at_ms, h.view.expires_at_ms);
    }
    let remembered = engine.remembered().await.unwrap();
    let kept = m.holds.iter().filter(|h| !h.forgotten);
    let ended = kept
        .clone()
        .filter(|h| matches!(h.status, HoldStatus::Released | HoldStatus::Expired));
    assert_eq!(
        (remembered.holds, remembered.ended_holds),
        (kept.count(), ended.count()),
        "holds remembered (all, ended)"
    );
    for u in 0..USERS {
        let used = engine
            .user_usage(&ev, &UserId::from(user_name(u)))
            .await
            .unwrap();
        assert_eq!(used, m.usage(u), "usage of user{u}");
        assert!(used <= LIMIT, "invariant 7");
    }
}

/// Where the model run keeps its log, and what a `Restart` does to it.
enum Log {
    /// sled in a temporary data dir; a restart is a simulated crash (`kill -9`).
    Disk,
    /// A `MemorySink`; a restart is a power cut: everything after the last good sync is lost.
    PowerCut(Arc<MemorySink>),
}

async fn run(ops: Vec<Op>, log: Log) {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let mut config = match &log {
        Log::Disk => boxoffice_tests::config(dir.path(), &clock),
        Log::PowerCut(sink) => {
            let mut c = EngineConfig::with_sink(sink.clone()).unwrap();
            c.clock = clock.clone();
            c
        }
    };
    config.idempotency_window = std::time::Duration::from_millis(WINDOW_MS);
    let reopen = || async { Engine::open(config.clone()).await.unwrap() };
    let mut engine = reopen().await;
    engine
        .create_event(event("m", sections(), TTL_MS, LIMIT))
        .await
        .unwrap();
    let mut m = Model::new();
    let ev = EventId::from("m");
    for op in ops {
        match op {
            Op::HoldBest {
                user,
                section,
                quantity,
                key,
            } => {
                let selection = best_in(section, quantity);
                hold(&engine, &mut m, user, key, selection, |m| {
                    best_fit(m, section, quantity)
                })
                .await;
            }
            Op::HoldSeats {
                user,
                section,
                seats,
                key,
            } => {
                let ids = seat_ids(section);
                let chosen: Vec<SeatId> =
                    seats.iter().map(|&i| ids[i % ids.len()].clone()).collect();
                let selection = Selection::Seats(chosen.clone());
                let r = hold(&engine, &mut m, user, key, selection, |_| Some(section)).await;
                if let Some(Rejection::InvalidRequest { field, .. }) = r {
                    assert_eq!(field, "seat_ids");
                    assert!(
                        chosen.len()
                            != chosen
                                .iter()
                                .collect::<std::collections::HashSet<_>>()
                                .len(),
                        "only duplicates are invalid here"
                    );
                }
            }
            Op::Confirm {
                hold,
                wrong_user,
                key,
            } => {
                if m.holds.is_empty() {
                    continue;
                }
                let h = hold % m.holds.len();
                let mh = m.holds[h].clone();
                let user = if wrong_user {
                    UserId::from("intruder")
                } else {
                    mh.view.user_id.clone()
                };
                let req = ConfirmRequest {
                    hold_id: mh.view.hold_id.clone(),
                    user_id: user,
                    payment_ref: "tok_visa".into(),
                    idempotency_key: key_name(key),
                };
                let r = engine.confirm(req.clone()).await;
                // Keys are per user: the intruder (index USERS) has keys of its own.
                let caller = if wrong_user {
                    USERS
                } else {
                    mh.view
                        .user_id
                        .as_str()
                        .trim_start_matches("user")
                        .parse::<usize>()
                        .unwrap()
                };
                let first_key = key.map(|k| (caller, "confirm", k));
                if let Some(k) = first_key
                    && let Some((fp, answer)) = m.key(k)
                {
                    if fp == format!("{:?}", mh.view.hold_id) {
                        assert_eq!(format!("{r:?}"), answer, "replay of confirm");
                    } else {
                        assert_eq!(rejection(&r), Some(Rejection::IdempotencyKeyReused));
                    }
                    continue;
                }
                let expected = if wrong_user || mh.forgotten {
                    Some(Rejection::HoldNotFound)
                } else {
                    match mh.status {
                        HoldStatus::Held if m.now < mh.view.expires_at_ms => None,
                        HoldStatus::Held | HoldStatus::Expired => Some(Rejection::HoldExpired),
                        _ => Some(Rejection::HoldNotActive),
                    }
                };
                assert_eq!(rejection(&r), expected, "confirm of {:?} at {}", mh, m.now);
                match (&expected, mh.status) {
                    (None, _) => {
                        let order = r.as_ref().unwrap();
                        assert_eq!(order.tickets.len() as u32, mh.view.quantity);
                        m.set(h, HoldStatus::Confirmed);
                        m.recorded(mh.section);
                    }
                    (Some(Rejection::HoldExpired), HoldStatus::Held) => {
                        m.set(h, HoldStatus::Expired);
                        m.recorded(mh.section);
                    }
                    _ => {}
                }
                if let Some(k) = first_key {
                    let answer = (format!("{:?}", mh.view.hold_id), format!("{r:?}"), m.now);
                    m.keys.insert(k, answer);
                }
            }
            Op::Release { hold } => {
                if m.holds.is_empty() {
                    continue;
                }
                let h = hold % m.holds.len();
                let mh = m.holds[h].clone();
                let r = engine.release(&mh.view.hold_id, &mh.view.user_id).await;
                let expected = match mh.status {
                    _ if mh.forgotten => Some(Rejection::HoldNotFound),
                    HoldStatus::Held if m.now < mh.view.expires_at_ms => None,
                    HoldStatus::Held | HoldStatus::Expired => Some(Rejection::HoldExpired),
                    _ => Some(Rejection::HoldNotActive),
                };
                assert_eq!(rejection(&r), expected, "release");
                match (&expected, mh.status) {
                    (None, _) => {
                        m.set(h, HoldStatus::Released);
                        m.recorded(mh.section);
                    }
                    (Some(Rejection::HoldExpired), HoldStatus::Held) => {
                        m.set(h, HoldStatus::Expired);
                        m.recorded(mh.section);
                    }
                    _ => {}
                }
            }
            Op::HoldBatch { user, items } => {
                // One user's items are decided one after the other, as separate `Hold`s would
                // be (docs/api.md, HoldBatch): each answer is checked against the model in
                // item order.
                let reqs: Vec<HoldRequest> = items
                    .iter()
                    .map(|&(section, quantity, key)| {
                        hold_request(user, key, best_in(section, quantity))
                    })
                    .collect();
                let answers = engine.hold_batch(reqs).await;
                assert_eq!(answers.len(), items.len(), "one answer per item");
                for (&(section, quantity, key), r) in items.iter().zip(answers) {
                    let selection = best_in(section, quantity);
                    check_hold(&mut m, user, key, selection, r, |m| {
                        best_fit(m, section, quantity)
                    });
                }
            }
            Op::Advance(ms) => {
                clock.advance_ms(ms);
                m.now += ms;
            }
            Op::Expire => {
                let mut got: Vec<HoldId> = engine
                    .expire_due(1_000)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|h| h.hold_id)
                    .collect();
                let mut want = Vec::new();
                for h in 0..m.holds.len() {
                    if m.holds[h].status == HoldStatus::Held
                        && m.holds[h].view.expires_at_ms <= m.now
                    {
                        want.push(m.holds[h].view.hold_id.clone());
                        m.set(h, HoldStatus::Expired);
                        m.recorded(m.holds[h].section);
                    }
                }
                got.sort();
                want.sort();
                assert_eq!(got, want, "expired set");
            }
            Op::Restart => {
                engine.crash().await;
                drop(engine);
                if let Log::PowerCut(sink) = &log {
                    sink.lose_unsynced();
                }
                engine = reopen().await;
            }
        }
        compare(&engine, &m).await;
    }
    let _ = ev;
    engine.shutdown().await;
}

/// Places a hold and checks it against the model. `fits` says which section the model
/// expects to serve it (None: sold out). Returns the rejection, if any.
/// Best available in section `section` (`None`: any).
fn best_in(section: Option<usize>, quantity: u32) -> Selection {
    Selection::BestAvailable {
        section: section.map(|s| SectionId::from(section_name(s))),
        quantity,
    }
}

/// Where the model puts a best-available hold of `quantity` in `section` (`None`: the first
/// section, in event order, with room).
fn best_fit(m: &Model, section: Option<usize>, quantity: u32) -> Option<usize> {
    let candidates: Vec<usize> = match section {
        Some(s) => vec![s],
        None => vec![0, 1, 2],
    };
    candidates.into_iter().find(|&s| m.available(s) >= quantity)
}

fn hold_request(user: usize, key: Option<u8>, selection: Selection) -> HoldRequest {
    HoldRequest {
        event_id: EventId::from("m"),
        user_id: UserId::from(user_name(user)),
        idempotency_key: key_name(key),
        selection,
        access_code: String::new(),
    }
}

async fn hold(
    engine: &Engine,
    m: &mut Model,
    user: usize,
    key: Option<u8>,
    selection: Selection,
    fits: impl Fn(&Model) -> Option<usize>,
) -> Option<Rejection> {
    let r = engine
        .hold(hold_request(user, key, selection.clone()))
        .await;
    check_hold(m, user, key, selection, r, fits)
}

/// Checks the engine's answer `r` to a hold of `selection` by `user` (keyed `key`) against the
/// model, and applies it to the model.
fn check_hold(
    m: &mut Model,
    user: usize,
    key: Option<u8>,
    selection: Selection,
    r: Result<HoldView, EngineError>,
    fits: impl Fn(&Model) -> Option<usize>,
) -> Option<Rejection> {
    let k = key.map(|k| (user, "hold", k));
    if let Some(k) = k
        && let Some((fp, answer)) = m.key(k)
    {
        if fp == format!("{selection:?}") {
            assert_eq!(format!("{r:?}"), answer, "replay returns the first answer");
        } else {
            assert_eq!(rejection(&r), Some(Rejection::IdempotencyKeyReused));
        }
        return rejection(&r);
    }
    let quantity = match &selection {
        Selection::Seats(s) => s.len() as u32,
        Selection::BestAvailable { quantity, .. } => *quantity,
    };
    let got = rejection(&r);
    if let Some(k) = k {
        m.keys
            .insert(k, (format!("{selection:?}"), format!("{r:?}"), m.now));
    }
    let used = m.usage(user);
    if used + quantity > LIMIT {
        assert_eq!(
            got,
            Some(Rejection::UserLimit { limit: LIMIT, used }),
            "limit"
        );
        return got;
    }
    match &selection {
        Selection::Seats(ids) => {
            let mut uniq = ids.clone();
            uniq.sort();
            uniq.dedup();
            if uniq.len() != ids.len() {
                assert!(
                    matches!(got, Some(Rejection::InvalidRequest { .. })),
                    "{got:?}"
                );
                return got;
            }
            let section = fits(m).unwrap();
            let all = seat_ids(section);
            let busy = ids.iter().find(|id| {
                let i = all.iter().position(|s| s == *id).unwrap();
                m.seats[section][i] != SeatStatus::Available
            });
            match busy {
                Some(id) => {
                    assert_eq!(got, Some(Rejection::SeatUnavailable(id.clone())));
                    return got;
                }
                None => assert_eq!(got, None, "seats {ids:?} were free"),
            }
        }
        Selection::BestAvailable { .. } => match fits(m) {
            None => {
                assert_eq!(got, Some(Rejection::SoldOut));
                return got;
            }
            Some(_) => assert_eq!(got, None, "best available with room"),
        },
    }
    let view = r.unwrap();
    let section = ["ga", "r1", "r2"]
        .iter()
        .position(|s| *s == view.section_id.as_str())
        .unwrap();
    assert_eq!(view.quantity, quantity);
    assert_eq!(view.expires_at_ms, m.now + TTL_MS);
    let all = seat_ids(section);
    let seats: Vec<usize> = view
        .seat_ids
        .iter()
        .map(|id| {
            all.iter()
                .position(|s| s == id)
                .expect("a seat of the section")
        })
        .collect();
    for &s in &seats {
        assert_eq!(
            m.seats[section][s],
            SeatStatus::Available,
            "a free seat was given"
        );
    }
    if section == 0 {
        m.ga_held += quantity;
    } else {
        for &s in &seats {
            m.seats[section][s] = SeatStatus::Held;
        }
    }
    m.holds.push(MHold {
        view,
        section,
        seats,
        status: HoldStatus::Held,
        ended_at: None,
        forgotten: false,
    });
    m.recorded(section);
    None
}

fn cases() -> u32 {
    let n = boxoffice_engine::tiers::count("PROPTEST_CASES", 48, 400);
    u32::try_from(n).expect("PROPTEST_CASES is a count of cases")
}

/// The seeds of past failures are kept beside this file, in `model.proptest-regressions`, and
/// re-run before any new case. (Proptest's default would look for them in a
/// `proptest-regressions/model.txt` beside the binary's `main.rs`.)
const REGRESSIONS: FileFailurePersistence =
    FileFailurePersistence::WithSource("proptest-regressions");

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        max_shrink_iters: 200,
        failure_persistence: Some(Box::new(REGRESSIONS)),
        ..ProptestConfig::default()
    }
}

/// The regressions file is where proptest looks for it, and every seed in it is read.
#[test]
fn the_saved_regressions_are_replayed() {
    let saved = include_str!("model.proptest-regressions")
        .lines()
        .filter(|l| l.starts_with("cc "))
        .count();
    assert!(saved >= 4, "the file has the seeds of past failures");
    let read = config()
        .failure_persistence
        .unwrap()
        .load_persisted_failures2(Some(file!()));
    assert_eq!(
        read.len(),
        saved,
        "every saved seed is read from beside {}",
        file!()
    );
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn engine_matches_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        on_runtime(run(ops, Log::Disk));
    }

    /// The same, with the log in memory and every restart a power cut: whatever was not synced
    /// is gone, and no acknowledged change may be missing.
    #[test]
    fn engine_matches_the_model_across_power_cuts(ops in proptest::collection::vec(op(), 1..40)) {
        on_runtime(run(ops, Log::PowerCut(MemorySink::new())));
    }
}
