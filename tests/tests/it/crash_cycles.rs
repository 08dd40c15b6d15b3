//! Crash cycles (issue 11, point 7): one data dir, a real server in a child process
//! (`server_child`, see `boxoffice_tests::server_process`), and many cycles of
//!
//! 1. start the server on the dir (the first time: create an event with a reserved and a
//!    general-admission section, too big to run out);
//! 2. check it against the clients' record of every answer they were ever given, see
//!    [`verify`]: the acknowledged holds and orders there (read back over gRPC: those of the
//!    last cycle and a sample of older ones, all of them every 50th restart and the last),
//!    unchanged, each hold in its status or a later one the clients caused; replays of
//!    idempotency keys answer the first answer; the answers cut off by the last kill (in doubt)
//!    retried with the same key and settled; then, for every hold and order at once: no seat in
//!    two live holds or orders, the held and sold counters and every seat's status exactly the
//!    record's, `available + held + sold == capacity`, the engine's reconciliation and
//!    invariant checks clean;
//! 3. a mixed load from several clients at once (holds of seats and of places, confirms, a few
//!    declined or timed-out payments, releases, replays of idempotency keys), cut by SIGKILL
//!    once a random number of answers were acknowledged, with the clients mid-call.
//!
//! Every answer a client got is recorded: an acknowledged one (a success or a definite refusal)
//! must hold after every later restart; an indefinite one (the call cut by the kill, or anything
//! the contract calls indefinite) is "in doubt" and may have happened or not, but its retry with
//! the same key settles it, and it never books anything twice.
//!
//! 10 cycles by default, 200 in the slow tier (`BOXOFFICE_SLOW=1`), `BOXOFFICE_CRASH_CYCLES=N`
//! to choose. The seed is printed; `BOXOFFICE_CRASH_SEED=S` replays its choices (what each
//! client asks, when the kill comes); the interleaving of the clients and what the kill cuts
//! still vary from run to run. Nothing here asserts how long anything took.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use boxoffice_proto::v1 as pb;
use boxoffice_tests::server_process::ServerProcess;
use boxoffice_tests::wait::PATIENCE;
use boxoffice_tests::{Clients, child_bin, row_label};
use pb::HoldStatus;
use rand::seq::IteratorRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::{Response, Status};

use crate::grpc::{admitted_all, event, ga, reserved, seats_of};

const SEED_VAR: &str = "BOXOFFICE_CRASH_SEED";
const CYCLES_VAR: &str = "BOXOFFICE_CRASH_CYCLES";
const CYCLES: usize = 10;
const CYCLES_SLOW: usize = 200;

const EVENT: &str = "cycles";
const GA: &str = "floor";
const GA_CAPACITY: u32 = 1_000_000;
const RESERVED: &str = "orch";
const ROWS: u32 = 100;
const SEATS_PER_ROW: u32 = 100;
/// Exact seats are picked in the last rows (best available fills from the first), where they
/// meet each other now and then: `SEAT_UNAVAILABLE`, a definite refusal to replay.
const EXACT_ROWS: u32 = 10;
/// Holds and admission windows outlive the run: nothing expires behind the record's back.
const DAY_SECONDS: u32 = 86_400;
const PER_USER_LIMIT: u32 = 100;

/// Clients calling at once, each as its own user for one cycle.
const CLIENTS: usize = 6;
/// The kill comes once this many answers (at most) were acknowledged in the cycle.
const ACKS_BEFORE_KILL_MAX: u64 = 60;
/// Acknowledged answers of earlier cycles replayed with their keys after each restart, of
/// each kind (holds, confirms, refusals).
const REPLAYS_PER_RESTART: usize = 6;
/// Each restart reads back the holds and orders acknowledged or changed since the last check,
/// and this many older ones, chosen at random; every [`FULL_EVERY`]th restart and the last
/// read back all of them. (Reading an order signs its tickets: in a debug build that is most
/// of what a check costs, and reading everything every time grows with the square of the
/// cycles.)
const OLDER_HOLDS_SAMPLED: usize = 32;
const OLDER_ORDERS_SAMPLED: usize = 8;
const FULL_EVERY: usize = 50;
/// Tries of a confirm whose payment answer was lost.
const TIMEOUT_TRIES: usize = 3;
/// Concurrent readers when checking the record.
const READERS: usize = 8;
/// Discrepancies shown when a restart fails its check.
const SHOWN_MAX: usize = 40;

/// Reasons of indefinite answers (`docs/api.md` 2.8): the call may or may not have happened.
/// An error without a reason (the transport: the kill) is indefinite too.
const INDEFINITE: &[&str] = &[
    "NOT_READY",
    "STORAGE_FAILED",
    "PAYMENT_UNAVAILABLE",
    "PAYMENT_TIMEOUT",
    "OVERLOADED",
    "IDEMPOTENCY_KEY_IN_FLIGHT",
];

/// What the server answered a call.
enum Answer<T> {
    /// A success: acknowledged.
    Done(T),
    /// A definite refusal, with its reason: acknowledged (nothing happened).
    Refused(String),
    /// An indefinite answer: in doubt.
    InDoubt(String),
}

fn answer<T>(r: Result<Response<T>, Status>) -> Answer<T> {
    match r {
        Ok(r) => Answer::Done(r.into_inner()),
        Err(s) => match boxoffice_gateway::status::reason_of(&s) {
            Some(reason) if !INDEFINITE.contains(&reason.as_str()) => Answer::Refused(reason),
            Some(reason) => Answer::InDoubt(reason),
            None => Answer::InDoubt(format!("{:?} {:?}", s.code(), s.message())),
        },
    }
}

/// `Confirm`, with a lost payment answer (`PAYMENT_TIMEOUT`) retried at once with the same key
/// and token as the contract says (the retry finds the charge and makes the order), up to
/// [`TIMEOUT_TRIES`] tries, unless `killing` says the server is being killed.
async fn confirm(c: &mut Clients, ask: &ConfirmAsk, killing: &AtomicBool) -> Answer<pb::Order> {
    let mut tries = 1;
    loop {
        match answer(c.booking.confirm(ask.request()).await) {
            Answer::InDoubt(r)
                if r == "PAYMENT_TIMEOUT"
                    && tries < TIMEOUT_TRIES
                    && !killing.load(Ordering::SeqCst) =>
            {
                tries += 1;
            }
            got => return got,
        }
    }
}

/// What a hold asks for.
#[derive(Clone, Debug)]
enum Pick {
    Best {
        section: &'static str,
        quantity: u32,
    },
    Seats(Vec<String>),
}

/// A `Hold` call as sent, to replay it.
#[derive(Clone, Debug)]
struct HoldAsk {
    user: String,
    key: String,
    pick: Pick,
}

impl HoldAsk {
    fn request(&self, admission: &str) -> pb::HoldRequest {
        let selection = match &self.pick {
            Pick::Best { section, quantity } => {
                pb::hold_request::Selection::BestAvailable(pb::BestAvailable {
                    section_id: (*section).into(),
                    quantity: *quantity,
                })
            }
            Pick::Seats(ids) => pb::hold_request::Selection::Seats(pb::SeatSelection {
                seat_ids: ids.clone(),
            }),
        };
        pb::HoldRequest {
            event_id: EVENT.into(),
            user_id: self.user.clone(),
            admission_token: admission.into(),
            idempotency_key: self.key.clone(),
            selection: Some(selection),
            access_code: String::new(),
        }
    }
}

/// A `Confirm` call as sent, to replay it.
#[derive(Clone, Debug)]
struct ConfirmAsk {
    hold: String,
    user: String,
    key: String,
    token: &'static str,
}

impl ConfirmAsk {
    fn request(&self) -> pb::ConfirmRequest {
        pb::ConfirmRequest {
            hold_id: self.hold.clone(),
            user_id: self.user.clone(),
            payment_token: self.token.into(),
            idempotency_key: self.key.clone(),
        }
    }
}

fn release_request(hold: &pb::Hold) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        hold_id: hold.hold_id.clone(),
        user_id: hold.user_id.clone(),
    }
}

/// What became of an acknowledged hold, as far as the clients know.
#[derive(Clone, Debug)]
enum Fate {
    Held,
    /// A confirm in doubt: held or confirmed until its retry settles it.
    Confirming(ConfirmAsk),
    Confirmed,
    /// A release in doubt: held or released until its retry settles it.
    Releasing,
    Released,
}

impl Fate {
    /// The statuses `GetHold` may show.
    fn allowed(&self) -> &'static [HoldStatus] {
        match self {
            Fate::Held => &[HoldStatus::Held],
            Fate::Confirming(_) => &[HoldStatus::Held, HoldStatus::Confirmed],
            Fate::Confirmed => &[HoldStatus::Confirmed],
            Fate::Releasing => &[HoldStatus::Held, HoldStatus::Released],
            Fate::Released => &[HoldStatus::Released],
        }
    }
}

struct HoldRecord {
    ask: HoldAsk,
    /// The first answer: every later `GetHold` shows the same hold (its status aside), and
    /// every replay of its key this very answer.
    first: pb::Hold,
    fate: Fate,
    cycle: usize,
}

struct OrderRecord {
    ask: ConfirmAsk,
    first: pb::Order,
    cycle: usize,
}

#[derive(Clone, Debug)]
enum Asked {
    Hold(HoldAsk),
    Confirm(ConfirmAsk),
}

struct Refusal {
    asked: Asked,
    reason: String,
    cycle: usize,
}

/// What one call of a client came to.
enum Outcome {
    Held(HoldAsk, pb::Hold),
    Confirmed(ConfirmAsk, pb::Order),
    Released(String),
    Refused(Asked, String),
    HoldInDoubt(HoldAsk),
    ConfirmInDoubt(ConfirmAsk),
    ReleaseInDoubt(String),
    Replayed,
    /// An answer the contract rules out.
    Wrong(String),
}

#[derive(Default)]
struct Tally {
    kills: usize,
    holds: usize,
    orders: usize,
    releases: usize,
    refusals: usize,
    in_doubt: usize,
    /// In-doubt calls whose retry found them done before the kill.
    in_doubt_done: usize,
    replays: usize,
    holds_checked: usize,
    orders_checked: usize,
    missing: usize,
    changed: usize,
}

/// The clients' record: every answer they were given, and the calls in doubt.
#[derive(Default)]
struct Book {
    /// Each user's admission token (valid for a day, across restarts: same token secret).
    admissions: HashMap<String, String>,
    holds: BTreeMap<String, HoldRecord>,
    orders: BTreeMap<String, OrderRecord>,
    refusals: Vec<Refusal>,
    /// `Hold` calls in doubt (no id known): retried at the next start.
    holds_in_doubt: Vec<HoldAsk>,
    /// Holds and orders acknowledged or changed since they were last read back.
    fresh_holds: BTreeSet<String>,
    fresh_orders: BTreeSet<String>,
    tally: Tally,
}

impl Book {
    fn apply(&mut self, cycle: usize, outcome: Outcome, wrong: &mut Vec<String>) {
        match outcome {
            Outcome::Held(ask, first) => {
                self.tally.holds += 1;
                let id = first.hold_id.clone();
                self.fresh_holds.insert(id.clone());
                let record = HoldRecord {
                    ask,
                    first,
                    fate: Fate::Held,
                    cycle,
                };
                if self.holds.insert(id.clone(), record).is_some() {
                    wrong.push(format!("hold {id} was acknowledged to two hold calls"));
                }
            }
            Outcome::Confirmed(ask, first) => {
                self.tally.orders += 1;
                self.set_fate(&ask.hold, Fate::Confirmed);
                let id = first.order_id.clone();
                self.fresh_orders.insert(id.clone());
                if self
                    .orders
                    .insert(id.clone(), OrderRecord { ask, first, cycle })
                    .is_some()
                {
                    wrong.push(format!("order {id} was acknowledged to two confirm calls"));
                }
            }
            Outcome::Released(hold) => {
                self.tally.releases += 1;
                self.set_fate(&hold, Fate::Released);
            }
            Outcome::Refused(asked, reason) => {
                self.tally.refusals += 1;
                if let Asked::Confirm(ask) = &asked {
                    self.set_fate(&ask.hold, Fate::Held); // a declined payment keeps the hold
                }
                self.refusals.push(Refusal {
                    asked,
                    reason,
                    cycle,
                });
            }
            Outcome::HoldInDoubt(ask) => {
                self.tally.in_doubt += 1;
                self.holds_in_doubt.push(ask);
            }
            Outcome::ConfirmInDoubt(ask) => {
                self.tally.in_doubt += 1;
                let hold = ask.hold.clone();
                self.set_fate(&hold, Fate::Confirming(ask));
            }
            Outcome::ReleaseInDoubt(hold) => {
                self.tally.in_doubt += 1;
                self.set_fate(&hold, Fate::Releasing);
            }
            Outcome::Replayed => self.tally.replays += 1,
            Outcome::Wrong(what) => wrong.push(what),
        }
    }

    fn set_fate(&mut self, hold: &str, fate: Fate) {
        self.fresh_holds.insert(hold.to_owned());
        self.holds
            .get_mut(hold)
            .expect("clients confirm and release only holds they were given")
            .fate = fate;
    }

    fn admission(&self, user: &str) -> &str {
        &self.admissions[user]
    }
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_answers_survive_kill_9_cycles() {
    let seed = match std::env::var(SEED_VAR) {
        Ok(s) => s.parse().expect("BOXOFFICE_CRASH_SEED is a u64"),
        Err(_) => rand::random(),
    };
    let cycles = boxoffice_engine::tiers::count(CYCLES_VAR, CYCLES, CYCLES_SLOW);
    println!("crash_cycles: seed {seed}, {cycles} cycles (replay: {SEED_VAR}={seed})");
    let began = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut book = Book::default();
    // Start 0 is on the empty dir; start k follows the kill of cycle k.
    for cycle in 0..=cycles {
        let started_ms = now_ms();
        let start = if cycle == 0 {
            "the first start".to_owned()
        } else {
            format!("the restart after the kill of cycle {cycle}")
        };
        let mut server = ServerProcess::start(child_bin!(), dir.path())
            .await
            .unwrap_or_else(|e| fail(&[format!("the server did not start: {e:#}")], seed, &start));
        if cycle == 0 {
            create_event(&server).await;
        }
        let mut wrong = Vec::new();
        let full = cycle == cycles || (cycle > 0 && cycle % FULL_EVERY == 0);
        verify(
            &mut server,
            &mut book,
            &mut rng,
            started_ms,
            full,
            &mut wrong,
        )
        .await;
        fail_if_wrong(&wrong, seed, &start);
        if full {
            println!(
                "crash_cycles: {start}: all {} holds and {} orders read back, {:.1?}",
                book.holds.len(),
                book.orders.len(),
                began.elapsed()
            );
        }
        if cycle == cycles {
            server.kill();
            break;
        }
        load(server, cycle + 1, &mut book, &mut rng, &mut wrong).await;
        fail_if_wrong(&wrong, seed, &format!("cycle {}", cycle + 1));
    }
    let t = &book.tally;
    println!(
        "crash_cycles: seed {seed}: {} cycles ({} kills); acknowledged and checked: {} holds, \
         {} orders, {} releases, {} refusals ({} hold reads, {} order reads, {} replays); {} \
         answers in doubt, all settled ({} found done before the kill); missing={} changed={}; \
         reconciliation clean after every restart; {:.1?}",
        cycles,
        t.kills,
        t.holds,
        t.orders,
        t.releases,
        t.refusals,
        t.holds_checked,
        t.orders_checked,
        t.replays,
        t.in_doubt,
        t.in_doubt_done,
        t.missing,
        t.changed,
        began.elapsed(),
    );
}

/// Fails the test with every discrepancy in `wrong`, if any.
fn fail_if_wrong(wrong: &[String], seed: u64, when: &str) {
    if !wrong.is_empty() {
        fail(wrong, seed, when);
    }
}

/// Fails the test, saying when, what (the first [`SHOWN_MAX`] lines) and how to replay.
fn fail(what: &[String], seed: u64, when: &str) -> ! {
    let shown: Vec<&str> = what.iter().take(SHOWN_MAX).map(String::as_str).collect();
    let more = match what.len().checked_sub(SHOWN_MAX) {
        Some(n) if n > 0 => format!("\n  ... and {n} more"),
        _ => String::new(),
    };
    panic!(
        "crash_cycles (seed {seed}, replay with {SEED_VAR}={seed}) failed at {when}:\n  {}{more}",
        shown.join("\n  ")
    );
}

async fn create_event(server: &ServerProcess) {
    let rows: Vec<(String, u32)> = (0..ROWS).map(|r| (row_label(r), SEATS_PER_ROW)).collect();
    let rows: Vec<(&str, u32)> = rows.iter().map(|(l, n)| (l.as_str(), *n)).collect();
    let mut req = event(
        EVENT,
        vec![reserved(RESERVED, &rows, 9_000), ga(GA, GA_CAPACITY, 4_000)],
    );
    req.hold_ttl_seconds = DAY_SECONDS;
    req.admission_window_seconds = DAY_SECONDS;
    req.admit_rate_per_second = 100_000;
    req.per_user_limit = PER_USER_LIMIT;
    server.admin().events.create_event(req).await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// The load, and the kill
// ---------------------------------------------------------------------------------------------

/// One client of the load: one user, its own choices (seeded), its own holds.
struct Client {
    c: Clients,
    user: String,
    admission: String,
    rng: ChaCha8Rng,
    cycle: usize,
    calls: usize,
    /// Set just before the SIGKILL: no new calls; calls in flight are cut.
    killing: Arc<AtomicBool>,
    /// Set once a call of its was cut off.
    cut: bool,
    progress: Arc<watch::Sender<Progress>>,
    /// Its holds with fate `Held`.
    live: Vec<pb::Hold>,
    /// Its acknowledged holds and orders, to replay.
    holds: Vec<(HoldAsk, pb::Hold)>,
    orders: Vec<(ConfirmAsk, pb::Order)>,
    out: Vec<Outcome>,
}

/// How far the clients of a cycle are.
#[derive(Default)]
struct Progress {
    /// Answers acknowledged.
    acks: u64,
    /// Clients that stopped.
    ended: usize,
}

/// Runs the mixed load of `cycle` and kills the server at a random moment.
async fn load(
    server: ServerProcess,
    cycle: usize,
    book: &mut Book,
    rng: &mut ChaCha8Rng,
    wrong: &mut Vec<String>,
) {
    let (progress, mut seen) = watch::channel(Progress::default());
    let progress = Arc::new(progress);
    let killing = Arc::new(AtomicBool::new(false));
    let users: Vec<String> = (0..CLIENTS).map(|n| format!("u{cycle}-{n}")).collect();
    let names: Vec<&str> = users.iter().map(String::as_str).collect();
    let admissions = admitted_all(&mut server.client(), || {}, EVENT, &names).await;
    let mut tasks = Vec::new();
    for (user, admission) in users.into_iter().zip(admissions) {
        book.admissions.insert(user.clone(), admission.clone());
        let client = Client {
            c: server.client(),
            user,
            admission,
            rng: ChaCha8Rng::seed_from_u64(rng.random()),
            cycle,
            calls: 0,
            killing: killing.clone(),
            cut: false,
            progress: progress.clone(),
            live: Vec::new(),
            holds: Vec::new(),
            orders: Vec::new(),
            out: Vec::new(),
        };
        tasks.push(tokio::spawn(client.run()));
    }
    // The kill: once `target` answers were acknowledged, with the clients mid-call (a client
    // waits for an answer far longer than it takes to send the next call). The bound only keeps
    // a stuck server from holding the test forever.
    let target = rng.random_range(0..=ACKS_BEFORE_KILL_MAX);
    let due = seen.wait_for(|p| p.acks >= target || p.ended == CLIENTS);
    let _ = tokio::time::timeout(PATIENCE, due).await;
    killing.store(true, Ordering::SeqCst);
    server.kill();
    book.tally.kills += 1;
    for t in tasks {
        for outcome in t.await.unwrap() {
            book.apply(cycle, outcome, wrong);
        }
    }
}

impl Client {
    async fn run(mut self) -> Vec<Outcome> {
        while !self.cut && !self.killing.load(Ordering::SeqCst) {
            self.calls += 1;
            match self.rng.random_range(0..100) {
                45..70 if !self.live.is_empty() => self.confirm().await,
                70..85 if !self.live.is_empty() => self.release().await,
                85..100 => self.replay().await,
                _ => self.hold().await,
            }
        }
        self.progress.send_modify(|p| p.ended += 1);
        self.out
    }

    fn ack(&self) {
        self.progress.send_modify(|p| p.acks += 1);
    }

    /// An answer in doubt: a call cut off by the kill (this client stops there), or, with the
    /// server up, an answer this small load should never get.
    fn cut(&mut self, outcome: Outcome, call: &str, reason: &str) -> Outcome {
        self.cut = true;
        if self.killing.load(Ordering::SeqCst) {
            outcome
        } else {
            Outcome::Wrong(format!(
                "{call} of {} answered {reason} with the server up",
                self.user
            ))
        }
    }

    fn pick(&mut self) -> Pick {
        let rng = &mut self.rng;
        match rng.random_range(0..10) {
            0..4 => Pick::Best {
                section: GA,
                quantity: rng.random_range(1..=3),
            },
            4..8 => Pick::Best {
                section: RESERVED,
                quantity: rng.random_range(1..=3),
            },
            _ => {
                let row = row_label(rng.random_range(ROWS - EXACT_ROWS..ROWS));
                let first = rng.random_range(1..SEATS_PER_ROW);
                let count = rng.random_range(1..=2);
                Pick::Seats(
                    (first..first + count)
                        .map(|n| format!("{RESERVED}:{row}:{n}"))
                        .collect(),
                )
            }
        }
    }

    async fn hold(&mut self) {
        let ask = HoldAsk {
            user: self.user.clone(),
            key: format!("h{}.{}", self.cycle, self.calls),
            pick: self.pick(),
        };
        let outcome = match answer(self.c.booking.hold(ask.request(&self.admission)).await) {
            Answer::Done(h) => {
                self.ack();
                self.live.push(h.clone());
                self.holds.push((ask.clone(), h.clone()));
                Outcome::Held(ask, h)
            }
            Answer::Refused(reason) => {
                self.ack();
                Outcome::Refused(Asked::Hold(ask), reason)
            }
            Answer::InDoubt(reason) => {
                let call = format!("hold key {}", ask.key);
                self.cut(Outcome::HoldInDoubt(ask), &call, &reason)
            }
        };
        self.out.push(outcome);
    }

    async fn confirm(&mut self) {
        let i = self.rng.random_range(0..self.live.len());
        let hold = self.live.swap_remove(i);
        let ask = ConfirmAsk {
            hold: hold.hold_id.clone(),
            user: self.user.clone(),
            key: format!("c{}.{}", self.cycle, self.calls),
            token: match self.rng.random_range(0..20) {
                0 => "tok_decline",
                1 => "tok_timeout",
                _ => "tok_visa",
            },
        };
        let outcome = match confirm(&mut self.c, &ask, &self.killing).await {
            Answer::Done(order) => {
                self.ack();
                self.orders.push((ask.clone(), order.clone()));
                Outcome::Confirmed(ask, order)
            }
            Answer::Refused(reason) if reason == "PAYMENT_DECLINED" => {
                self.ack();
                self.live.push(hold);
                Outcome::Refused(Asked::Confirm(ask), reason)
            }
            Answer::Refused(reason) => Outcome::Wrong(format!(
                "confirm {} (key {}) of the live hold {} was refused: {reason}",
                ask.token, ask.key, ask.hold
            )),
            Answer::InDoubt(reason) => {
                let call = format!(
                    "confirm {} (key {}, {TIMEOUT_TRIES} tries)",
                    ask.hold, ask.key
                );
                self.cut(Outcome::ConfirmInDoubt(ask), &call, &reason)
            }
        };
        self.out.push(outcome);
    }

    async fn release(&mut self) {
        let i = self.rng.random_range(0..self.live.len());
        let hold = self.live.swap_remove(i);
        let outcome = match answer(self.c.booking.release(release_request(&hold)).await) {
            Answer::Done(_) => {
                self.ack();
                Outcome::Released(hold.hold_id)
            }
            Answer::Refused(reason) => Outcome::Wrong(format!(
                "release of the live hold {} was refused: {reason}",
                hold.hold_id
            )),
            Answer::InDoubt(reason) => {
                let call = format!("release {}", hold.hold_id);
                self.cut(Outcome::ReleaseInDoubt(hold.hold_id), &call, &reason)
            }
        };
        self.out.push(outcome);
    }

    /// Replays an acknowledged hold or confirm of this client with its key: the first answer
    /// comes back, whatever happened since.
    async fn replay(&mut self) {
        if !self.orders.is_empty() && self.rng.random_bool(0.5) {
            let i = self.rng.random_range(0..self.orders.len());
            let (ask, first) = self.orders[i].clone();
            let got = answer(self.c.booking.confirm(ask.request()).await);
            self.replayed(&ask.key, &first, got);
        } else if !self.holds.is_empty() {
            let i = self.rng.random_range(0..self.holds.len());
            let (ask, first) = self.holds[i].clone();
            let got = answer(self.c.booking.hold(ask.request(&self.admission)).await);
            self.replayed(&ask.key, &first, got);
        } else {
            self.hold().await;
        }
    }

    fn replayed<T: PartialEq + std::fmt::Debug>(&mut self, key: &str, first: &T, got: Answer<T>) {
        let outcome = match got {
            Answer::Done(again) if &again == first => {
                self.ack();
                Outcome::Replayed
            }
            Answer::Done(again) => Outcome::Wrong(format!(
                "the replay of key {key} of {} answered {again:?}, not the first answer \
                 {first:?}",
                self.user
            )),
            Answer::Refused(reason) => Outcome::Wrong(format!(
                "the replay of key {key} of {} was refused ({reason}), not given the first \
                 answer {first:?}",
                self.user
            )),
            // A replay changes nothing: in doubt, there is nothing to record.
            Answer::InDoubt(reason) => {
                let call = format!("the replay of key {key}");
                match self.cut(Outcome::Replayed, &call, &reason) {
                    Outcome::Replayed => return,
                    wrong => wrong,
                }
            }
        };
        self.out.push(outcome);
    }
}

// ---------------------------------------------------------------------------------------------
// The check after each start
// ---------------------------------------------------------------------------------------------

/// Checks the server just started (at `started_ms`) against the record, settles the calls in
/// doubt, and checks that everything adds up; notes every discrepancy in `wrong`.
async fn verify(
    server: &mut ServerProcess,
    book: &mut Book,
    rng: &mut ChaCha8Rng,
    started_ms: i64,
    full: bool,
    wrong: &mut Vec<String>,
) {
    let mut c = server.client();
    // The reconciliation as recovered: a captured charge without an order is allowed only for
    // a confirm in doubt (the kill came between the charge and the order), until its retry.
    let audit = server.audit();
    wrong.extend(
        audit
            .problems
            .iter()
            .map(|p| format!("after the restart: {p}")),
    );
    for (payment, hold) in &audit.captured_without_order {
        match book.holds.get(hold).map(|h| &h.fate) {
            Some(Fate::Confirming(_)) => {}
            fate => wrong.push(format!(
                "after the restart: charge {payment} for hold {hold} is captured without an \
                 order, but no confirm of that hold was in doubt (its fate: {fate:?})"
            )),
        }
    }
    let holds = to_check(
        &book.holds,
        &mut book.fresh_holds,
        full,
        OLDER_HOLDS_SAMPLED,
        rng,
    );
    check_holds(&c, book, holds, wrong).await;
    let orders = to_check(
        &book.orders,
        &mut book.fresh_orders,
        full,
        OLDER_ORDERS_SAMPLED,
        rng,
    );
    check_orders(&c, book, orders, wrong).await;
    replay_sample(&mut c, book, rng, wrong).await;
    settle_in_doubt(&mut c, book, started_ms, wrong).await;
    // Everything settled: the books balance exactly.
    let audit = server.audit();
    wrong.extend(audit.problems.iter().map(|p| format!("once settled: {p}")));
    for (payment, hold) in &audit.captured_without_order {
        wrong.push(format!(
            "once settled: charge {payment} for hold {hold} is still captured without an order"
        ));
    }
    check_counters(&mut c, book, wrong).await;
}

/// The ids to read back: all of them (`full`), or the fresh ones and a sample of the others.
fn to_check<V>(
    all: &BTreeMap<String, V>,
    fresh: &mut BTreeSet<String>,
    full: bool,
    sampled: usize,
    rng: &mut ChaCha8Rng,
) -> Vec<String> {
    let fresh = std::mem::take(fresh);
    if full {
        return all.keys().cloned().collect();
    }
    let older = all
        .keys()
        .filter(|id| !fresh.contains(*id))
        .cloned()
        .choose_multiple(rng, sampled);
    fresh.into_iter().chain(older).collect()
}

/// Reads every (id, owner) of `ids` with `read`, a few at a time.
async fn read_all<T, F, Fut>(
    ids: Vec<(String, String)>,
    read: F,
) -> BTreeMap<String, Result<T, Status>>
where
    T: Send + 'static,
    F: Fn(String, String) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Response<T>, Status>> + Send,
{
    let mut readers = JoinSet::new();
    for chunk in ids.chunks(ids.len().div_ceil(READERS).max(1)) {
        let (chunk, read) = (chunk.to_vec(), read.clone());
        readers.spawn(async move {
            let mut out = Vec::new();
            for (id, user) in chunk {
                let got = read(id.clone(), user).await.map(Response::into_inner);
                out.push((id, got));
            }
            out
        });
    }
    readers.join_all().await.into_iter().flatten().collect()
}

fn describe(s: &Status) -> String {
    let reason = boxoffice_gateway::status::reason_of(s).unwrap_or_default();
    format!("{:?} {reason} {:?}", s.code(), s.message())
}

fn status_name(status: i32) -> String {
    HoldStatus::try_from(status).map_or_else(|_| format!("status {status}"), |s| format!("{s:?}"))
}

/// Every acknowledged hold is there, the same hold, in a status its fate allows.
async fn check_holds(c: &Clients, book: &mut Book, ids: Vec<String>, wrong: &mut Vec<String>) {
    let booking = c.booking.clone();
    let ids = ids
        .into_iter()
        .map(|id| {
            let user = book.holds[&id].ask.user.clone();
            (id, user)
        })
        .collect();
    let got = read_all(ids, move |hold_id, user_id| {
        let mut booking = booking.clone();
        async move {
            booking
                .get_hold(pb::GetHoldRequest { hold_id, user_id })
                .await
        }
    })
    .await;
    for (id, found) in got {
        let record = &book.holds[&id];
        let told = format!(
            "hold {id} (acknowledged in cycle {} to {}, key {})",
            record.cycle, record.ask.user, record.ask.key
        );
        book.tally.holds_checked += 1;
        let found = match found {
            Ok(found) => found,
            Err(s) => {
                book.tally.missing += 1;
                wrong.push(format!(
                    "{told} is missing: GetHold answered {}",
                    describe(&s)
                ));
                continue;
            }
        };
        let mut as_told = record.first.clone();
        as_told.status = found.status;
        if found != as_told {
            book.tally.changed += 1;
            wrong.push(format!(
                "{told} changed: expected {:?}, found {found:?}",
                record.first
            ));
        }
        let allowed = record.fate.allowed();
        if !allowed.iter().any(|s| *s as i32 == found.status) {
            book.tally.changed += 1;
            wrong.push(format!(
                "{told}: expected status {allowed:?} (its fate: {:?}), found {}",
                record.fate,
                status_name(found.status)
            ));
        }
    }
}

/// Every acknowledged order is there, exactly as first answered, for the places of its hold.
async fn check_orders(c: &Clients, book: &mut Book, ids: Vec<String>, wrong: &mut Vec<String>) {
    let booking = c.booking.clone();
    let ids = ids
        .into_iter()
        .map(|id| {
            let user = book.orders[&id].ask.user.clone();
            (id, user)
        })
        .collect();
    let got = read_all(ids, move |order_id, user_id| {
        let mut booking = booking.clone();
        async move {
            booking
                .get_order(pb::GetOrderRequest { order_id, user_id })
                .await
        }
    })
    .await;
    for (id, found) in got {
        let record = &book.orders[&id];
        let told = format!(
            "order {id} (acknowledged in cycle {} to {}, key {}, hold {})",
            record.cycle, record.ask.user, record.ask.key, record.ask.hold
        );
        book.tally.orders_checked += 1;
        match found {
            Ok(found) if found == record.first => {}
            Ok(found) => {
                book.tally.changed += 1;
                wrong.push(format!(
                    "{told} changed: expected {:?}, found {found:?}",
                    record.first
                ));
            }
            Err(s) => {
                book.tally.missing += 1;
                wrong.push(format!(
                    "{told} is missing: GetOrder answered {}",
                    describe(&s)
                ));
            }
        }
        let hold = &book.holds[&record.ask.hold].first;
        let seats: Vec<&str> = record
            .first
            .tickets
            .iter()
            .map(|t| t.seat_id.as_str())
            .filter(|s| !s.is_empty())
            .collect();
        if record.first.hold_id != hold.hold_id
            || record.first.tickets.len() != hold.quantity as usize
            || seats != hold.seat_ids
        {
            wrong.push(format!(
                "{told} does not sell the places of its hold: order {:?}, hold {hold:?}",
                record.first
            ));
        }
    }
}

/// Replays a few acknowledged holds, confirms and refusals of earlier cycles with their keys:
/// each answers its first answer.
async fn replay_sample(
    c: &mut Clients,
    book: &mut Book,
    rng: &mut ChaCha8Rng,
    wrong: &mut Vec<String>,
) {
    let holds: Vec<&HoldRecord> = book.holds.values().collect();
    let orders: Vec<&OrderRecord> = book.orders.values().collect();
    let mut replays = 0;
    for _ in 0..REPLAYS_PER_RESTART.min(holds.len()) {
        let record = holds[rng.random_range(0..holds.len())];
        let told = format!(
            "the replay of hold key {} of {}",
            record.ask.key, record.ask.user
        );
        let req = record.ask.request(book.admission(&record.ask.user));
        match answer(c.booking.hold(req).await) {
            Answer::Done(h) if h == record.first => replays += 1,
            Answer::Done(h) => wrong.push(format!(
                "{told} answered {h:?}, not the first answer {:?}",
                record.first
            )),
            Answer::Refused(r) | Answer::InDoubt(r) => wrong.push(format!(
                "{told} answered {r}, not the first answer {:?}",
                record.first
            )),
        }
    }
    for _ in 0..REPLAYS_PER_RESTART.min(orders.len()) {
        let record = orders[rng.random_range(0..orders.len())];
        let told = format!(
            "the replay of confirm key {} of {}",
            record.ask.key, record.ask.user
        );
        match answer(c.booking.confirm(record.ask.request()).await) {
            Answer::Done(o) if o == record.first => replays += 1,
            Answer::Done(o) => wrong.push(format!(
                "{told} answered {o:?}, not the first answer {:?}",
                record.first
            )),
            Answer::Refused(r) | Answer::InDoubt(r) => wrong.push(format!(
                "{told} answered {r}, not the first answer {:?}",
                record.first
            )),
        }
    }
    for _ in 0..REPLAYS_PER_RESTART.min(book.refusals.len()) {
        let refusal = &book.refusals[rng.random_range(0..book.refusals.len())];
        let (got, told) = match &refusal.asked {
            Asked::Hold(ask) => (
                answer(c.booking.hold(ask.request(book.admission(&ask.user))).await).map(drop),
                format!("hold key {} of {}", ask.key, ask.user),
            ),
            Asked::Confirm(ask) => (
                answer(c.booking.confirm(ask.request()).await).map(drop),
                format!("confirm key {} of {}", ask.key, ask.user),
            ),
        };
        match got {
            Answer::Refused(r) if r == refusal.reason => replays += 1,
            Answer::Refused(r) | Answer::InDoubt(r) => wrong.push(format!(
                "the replay of {told} (refused {} in cycle {}) answered {r}",
                refusal.reason, refusal.cycle
            )),
            Answer::Done(()) => wrong.push(format!(
                "the replay of {told} (refused {} in cycle {}) succeeded",
                refusal.reason, refusal.cycle
            )),
        }
    }
    book.tally.replays += replays;
}

impl<T> Answer<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Answer<U> {
        match self {
            Answer::Done(v) => Answer::Done(f(v)),
            Answer::Refused(r) => Answer::Refused(r),
            Answer::InDoubt(r) => Answer::InDoubt(r),
        }
    }
}

/// Retries every call the last kill left in doubt, with its key: each is settled now, and is
/// recorded like any acknowledged answer. (Found done: it had happened before the kill, in
/// the server that started before `started_ms`.)
async fn settle_in_doubt(
    c: &mut Clients,
    book: &mut Book,
    started_ms: i64,
    wrong: &mut Vec<String>,
) {
    let cycle = book.tally.kills;
    let ttl_ms = i64::from(DAY_SECONDS) * 1_000;
    for ask in std::mem::take(&mut book.holds_in_doubt) {
        let req = ask.request(book.admission(&ask.user));
        let outcome = match answer(c.booking.hold(req).await) {
            Answer::Done(h) if h.user_id != ask.user || h.event_id != EVENT => {
                Outcome::Wrong(format!("the retry of hold key {} gave {h:?}", ask.key))
            }
            Answer::Done(h) => {
                if h.expires_at_unix_ms - ttl_ms < started_ms {
                    book.tally.in_doubt_done += 1;
                }
                Outcome::Held(ask, h)
            }
            Answer::Refused(reason) => Outcome::Refused(Asked::Hold(ask), reason),
            Answer::InDoubt(r) => Outcome::Wrong(format!(
                "the retry of hold key {} of {} is still in doubt: {r}",
                ask.key, ask.user
            )),
        };
        book.apply(cycle, outcome, wrong);
    }
    let confirming: Vec<ConfirmAsk> = book
        .holds
        .values()
        .filter_map(|h| match &h.fate {
            Fate::Confirming(ask) => Some(ask.clone()),
            _ => None,
        })
        .collect();
    for ask in confirming {
        let outcome = match confirm(c, &ask, &AtomicBool::new(false)).await {
            Answer::Done(o) if o.hold_id != ask.hold => Outcome::Wrong(format!(
                "the retry of confirm key {} of hold {} made an order of another hold: {o:?}",
                ask.key, ask.hold
            )),
            Answer::Done(o) => {
                if o.created_at_unix_ms < started_ms {
                    book.tally.in_doubt_done += 1;
                }
                Outcome::Confirmed(ask, o)
            }
            Answer::Refused(reason) if reason == "PAYMENT_DECLINED" => {
                Outcome::Refused(Asked::Confirm(ask), reason)
            }
            Answer::Refused(r) | Answer::InDoubt(r) => Outcome::Wrong(format!(
                "the retry of confirm key {} ({}) of hold {} answered {r}, not an order",
                ask.key, ask.token, ask.hold
            )),
        };
        book.apply(cycle, outcome, wrong);
    }
    let releasing: Vec<pb::Hold> = book
        .holds
        .values()
        .filter(|h| matches!(h.fate, Fate::Releasing))
        .map(|h| h.first.clone())
        .collect();
    for hold in releasing {
        let outcome = match answer(c.booking.release(release_request(&hold)).await) {
            Answer::Done(_) => Outcome::Released(hold.hold_id),
            Answer::Refused(reason) if reason == "HOLD_NOT_ACTIVE" => {
                // Released before the kill (it cannot have been confirmed: nobody tried).
                book.tally.in_doubt_done += 1;
                Outcome::Released(hold.hold_id)
            }
            Answer::Refused(r) | Answer::InDoubt(r) => Outcome::Wrong(format!(
                "the retry of the release of hold {} answered {r}",
                hold.hold_id
            )),
        };
        book.apply(cycle, outcome, wrong);
    }
}

/// With nothing in doubt, the server's counters and seats are exactly the record's: per
/// section `available + held + sold == capacity`, the held and sold places those of the live
/// holds and orders, every reserved seat in the status of the one hold or order that has it.
async fn check_counters(c: &mut Clients, book: &Book, wrong: &mut Vec<String>) {
    let mut seats: HashMap<&str, (&str, HoldStatus)> = HashMap::new();
    let mut expected: HashMap<&str, (u32, u32)> = HashMap::new();
    for (id, record) in &book.holds {
        let status = match record.fate {
            Fate::Held => HoldStatus::Held,
            Fate::Confirmed => HoldStatus::Confirmed,
            Fate::Released => continue,
            Fate::Confirming(_) | Fate::Releasing => {
                wrong.push(format!("hold {id} is still in doubt after the retries"));
                continue;
            }
        };
        let counts = expected
            .entry(record.first.section_id.as_str())
            .or_default();
        if status == HoldStatus::Held {
            counts.0 += record.first.quantity;
        } else {
            counts.1 += record.first.quantity;
        }
        for seat in &record.first.seat_ids {
            if let Some((other, _)) = seats.insert(seat.as_str(), (id.as_str(), status)) {
                wrong.push(format!(
                    "seat {seat} is in two live holds or orders: {other} and {id}"
                ));
            }
        }
    }
    let sections = seats_of(c, EVENT).await;
    let event = c
        .events
        .get_event(pb::GetEventRequest {
            event_id: EVENT.into(),
        })
        .await
        .unwrap()
        .into_inner();
    for s in &sections {
        let id = s.section_id.as_str();
        if s.available + s.held + s.sold != s.capacity {
            wrong.push(format!(
                "section {id}: available {} + held {} + sold {} != capacity {}",
                s.available, s.held, s.sold, s.capacity
            ));
        }
        let (held, sold) = expected.get(id).copied().unwrap_or_default();
        if (s.held, s.sold) != (held, sold) {
            wrong.push(format!(
                "section {id}: the record has {held} places held and {sold} sold, the seat map \
                 {} held and {} sold",
                s.held, s.sold
            ));
        }
        match event.sections.iter().find(|e| e.section_id == id) {
            Some(e) if (e.capacity, e.available, e.held, e.sold) == (s.capacity, s.available, s.held, s.sold) => {}
            e => wrong.push(format!(
                "section {id}: GetEvent says {e:?}, the seat map capacity {} available {} held {} sold {}",
                s.capacity, s.available, s.held, s.sold
            )),
        }
        for seat in &s.seats {
            let (holder, want) = match seats.get(seat.seat_id.as_str()) {
                Some((hold, HoldStatus::Held)) => (*hold, pb::SeatStatus::Held),
                Some((hold, _)) => (*hold, pb::SeatStatus::Sold),
                None => ("no live hold or order", pb::SeatStatus::Available),
            };
            if seat.status != want as i32 {
                wrong.push(format!(
                    "seat {}: expected {want:?} ({holder}), found {:?}",
                    seat.seat_id,
                    pb::SeatStatus::try_from(seat.status)
                ));
            }
        }
    }
}
