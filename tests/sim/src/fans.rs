//! The simulated fans: the workload of a run, through every public call.
//!
//! The admin makes the event; then each fan joins the line, waits to be admitted, and until the
//! work ends holds (best available, exact seats, batches), confirms, releases, reads its holds
//! and orders, the event, and joins the waitlist when a section is sold out. Every call goes to
//! one node; a call without a definite answer is tried again, with the same idempotency key, on
//! the next node, as a real client would. Once the driver says the cluster is healed, every fan
//! reads back everything it was told, through every node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use boxoffice_client::{Bearer, Clients};
use boxoffice_proto::v1 as pb;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::clock::elapsed_ms;
use crate::history::{Answer, Call, Fan, HoldSeen, NO_KEY, Op, OrderSeen, Shared, lock};
use crate::node::{ADMIN_KEY, CLIENT_KEY, GRPC_PORT, host};

/// The event every run sells.
pub const EVENT: &str = "show";
/// Its sections: a general admission one and a reserved one (rows A and B of 4 seats).
pub const GA: &str = "ga";
/// The reserved section.
pub const FLOOR: &str = "floor";
/// Places in [`GA`].
pub const GA_CAPACITY: u32 = 10;
/// Rows of [`FLOOR`], with their seats.
pub const FLOOR_ROWS: [(&str, u32); 2] = [("A", 4), ("B", 4)];
/// Places one fan may hold or buy.
pub const PER_USER_LIMIT: u32 = 4;
/// A hold's time to live (short: holds expire during a run).
pub const HOLD_TTL_SECONDS: u32 = 4;

/// The admin's number in the history.
pub const ADMIN: Fan = 1_000;

/// How long a call may take before the fan gives up on that attempt.
const CALL_TIMEOUT: Duration = Duration::from_millis(1_500);
/// Attempts of one call (over the nodes in turn) before the fan gives up on it.
const ATTEMPTS_MAX: usize = 60;

/// What the fans share with the driver.
#[derive(Clone)]
pub struct Workload {
    /// The run's seed (each fan draws from its own stream of it).
    pub seed: u64,
    /// Fans.
    pub fans: usize,
    /// Nodes to call.
    pub nodes: u64,
    /// Virtual ms at which the fans stop buying.
    pub work_until_ms: u64,
    /// Set by the driver once every fault is healed: the fans read everything back.
    pub healed: Arc<AtomicBool>,
    /// Where calls are recorded.
    pub history: Shared,
}

struct Conn {
    nodes: Vec<Clients>,
}

impl Conn {
    fn new(nodes: u64, key: &str) -> Conn {
        let bearer = Bearer::new(key).unwrap_or_else(|e| panic!("the key: {e}"));
        Conn {
            nodes: (1..=nodes)
                .map(|i| {
                    Clients::new(
                        &crate::net::channel(&format!("{}:{GRPC_PORT}", host(i))),
                        &bearer,
                    )
                })
                .collect(),
        }
    }

    fn len(&self) -> usize {
        self.nodes.len()
    }
}

/// Sends one call to node `at` (0-based), records it, and returns its answer.
async fn once<T, F, Fut>(
    w: &Workload,
    conn: &Conn,
    fan: Fan,
    at: usize,
    op: &Op,
    send: F,
    answer: impl FnOnce(T) -> Answer,
) -> Answer
where
    F: FnOnce(Clients) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let invoked_ms = elapsed_ms();
    let c = conn.nodes[at % conn.len()].clone();
    let got = match tokio::time::timeout(CALL_TIMEOUT, send(c)).await {
        Ok(Ok(r)) => answer(r.into_inner()),
        Ok(Err(s)) => Answer::of_status(&s),
        Err(_) => Answer::Failed(tonic::Code::DeadlineExceeded as i32, "timeout".into()),
    };
    lock(&w.history).call(Call {
        fan,
        op: op.clone(),
        node: (at % conn.len()) as u64 + 1,
        invoked_ms,
        completed_ms: elapsed_ms(),
        answer: got.clone(),
    });
    got
}

/// Sends a call until it has a definite answer (the next node after each failure, after a
/// pause), at most [`ATTEMPTS_MAX`] times: the last answer.
async fn until_definite<T, F, Fut>(
    w: &Workload,
    conn: &Conn,
    fan: Fan,
    first: usize,
    op: Op,
    send: F,
    answer: impl Fn(T) -> Answer,
) -> Answer
where
    F: Fn(Clients) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    within(w, conn, fan, first, op, send, answer, ATTEMPTS_MAX).await
}

/// As [`until_definite`], at most `attempts` times: a fan that runs out of patience gives up
/// on the call, not knowing whether it took effect.
#[allow(clippy::too_many_arguments)]
async fn within<T, F, Fut>(
    w: &Workload,
    conn: &Conn,
    fan: Fan,
    first: usize,
    op: Op,
    send: F,
    answer: impl Fn(T) -> Answer,
    attempts: usize,
) -> Answer
where
    F: Fn(Clients) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let mut last = Answer::Failed(0, "never sent".into());
    for attempt in 0..attempts {
        last = once(w, conn, fan, first + attempt, &op, &send, &answer).await;
        if last.definite() {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100 + 50 * (attempt as u64 % 4))).await;
    }
    last
}

fn event_request() -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        event_id: EVENT.into(),
        name: "The simulated show".into(),
        sections: vec![
            pb::SectionSpec {
                section_id: GA.into(),
                name: "General admission".into(),
                price_cents: 2_500,
                layout: Some(pb::section_spec::Layout::GeneralAdmissionCapacity(
                    GA_CAPACITY,
                )),
                price_tiers: Vec::new(),
            },
            pb::SectionSpec {
                section_id: FLOOR.into(),
                name: "Floor".into(),
                price_cents: 9_000,
                layout: Some(pb::section_spec::Layout::Reserved(pb::ReservedLayout {
                    rows: FLOOR_ROWS
                        .iter()
                        .map(|(label, n)| pb::RowSpec {
                            label: (*label).into(),
                            seat_count: *n,
                        })
                        .collect(),
                })),
                price_tiers: Vec::new(),
            },
        ],
        hold_ttl_seconds: HOLD_TTL_SECONDS,
        per_user_limit: PER_USER_LIMIT,
        admit_rate_per_second: 50,
        admission_window_seconds: 3_600,
        idempotency_key: "make-the-show".into(),
        ..Default::default()
    }
}

/// The admin makes the event (with a key, through any node, until it is made).
async fn make_event(w: &Workload) {
    let admin = Conn::new(w.nodes, ADMIN_KEY);
    loop {
        // The group forms in its first second or two.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let got = once(
            w,
            &admin,
            ADMIN,
            0,
            &Op::CreateEvent,
            |mut c| async move { c.events.create_event(event_request()).await },
            |e: pb::Event| Answer::Event(counts(&e)),
        )
        .await;
        if got.definite() {
            return;
        }
    }
}

/// Every seat of the reserved section.
pub fn floor_seats() -> Vec<String> {
    FLOOR_ROWS
        .iter()
        .flat_map(|(row, n)| (1..=*n).map(move |i| format!("{FLOOR}:{row}:{i}")))
        .collect()
}

/// What one fan was told, to read back later.
#[derive(Default)]
struct Mine {
    /// My holds by id, as last told.
    holds: BTreeMap<String, HoldSeen>,
    /// My orders by id.
    orders: BTreeMap<String, OrderSeen>,
    /// My waitlist entries.
    entries: Vec<String>,
}

/// Runs every fan to the end of the work, then the read-back.
pub async fn run(w: Workload) -> turmoil::Result {
    make_event(&w).await;
    let fans = (0..w.fans).map(|f| fan(w.clone(), f));
    futures_util::future::join_all(fans).await;
    Ok(())
}

/// How many attempts a fan makes at a hold: one in four gives up after one failed attempt (a
/// caller that gives up mid-call; the hold may or may not have been made).
fn patience(rng: &mut ChaCha8Rng) -> usize {
    if rng.random_range(0..2) == 0 {
        1
    } else {
        ATTEMPTS_MAX
    }
}

/// The key of a fan's `n`th call, a hold (`kind`: `h` best available, `s` a seat), the key it
/// sends, and how many attempts it makes. One hold in four is sent without an idempotency key,
/// as a caller without keys does ("empty means none"); such a caller cannot retry safely, so it
/// makes one attempt. Its key in the history begins with [`NO_KEY`] and only names the call.
fn hold_key(rng: &mut ChaCha8Rng, kind: &str, me: Fan, n: u64) -> (String, String, usize) {
    if rng.random_range(0..4) == 0 {
        (format!("{NO_KEY}{kind}-{me}-{n}"), String::new(), 1)
    } else {
        let key = format!("{kind}-{me}-{n}");
        (key.clone(), key, patience(rng))
    }
}

fn hold_answer(h: pb::Hold) -> Answer {
    Answer::Hold(HoldSeen::of(&h))
}

async fn fan(w: Workload, me: Fan) {
    let mut rng =
        ChaCha8Rng::seed_from_u64(w.seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(me as u64 + 1)));
    let conn = Conn::new(w.nodes, CLIENT_KEY);
    let user = format!("fan-{me}");
    let home = me % conn.len();
    // Staggered arrivals.
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..1_000))).await;
    let token = admitted(&w, &conn, me, home, &user).await;
    let mut mine = Mine::default();
    let mut n = 0u64;
    let mut sold_out = false;
    let mut full = false;
    while elapsed_ms() < w.work_until_ms {
        n += 1;
        let at = home + rng.random_range(0..conn.len());
        // At the limit, a fan pays for or lets go of what it holds.
        let roll = if full {
            full = false;
            rng.random_range(48..76)
        } else {
            rng.random_range(0..100)
        };
        match roll {
            0..30 => {
                let (key, sent, patience) = hold_key(&mut rng, "h", me, n);
                let section = [GA, FLOOR, ""][rng.random_range(0..3)].to_owned();
                let quantity = rng.random_range(1..=2);
                let op = Op::Hold {
                    key,
                    section: section.clone(),
                    seats: vec![],
                    quantity,
                };
                let req = pb::HoldRequest {
                    event_id: EVENT.into(),
                    user_id: user.clone(),
                    admission_token: token.clone(),
                    idempotency_key: sent,
                    selection: Some(pb::hold_request::Selection::BestAvailable(
                        pb::BestAvailable {
                            section_id: section,
                            quantity,
                        },
                    )),
                    access_code: String::new(),
                };
                let got = within(
                    &w,
                    &conn,
                    me,
                    at,
                    op,
                    |mut c| {
                        let req = req.clone();
                        async move { c.booking.hold(req).await }
                    },
                    hold_answer,
                    patience,
                )
                .await;
                sold_out = got.reason() == "SOLD_OUT";
                full = got.reason() == "USER_LIMIT";
                if let Answer::Hold(h) = got {
                    mine.holds.insert(h.id.clone(), h);
                }
            }
            30..40 => {
                let (key, sent, patience) = hold_key(&mut rng, "s", me, n);
                let seats = floor_seats();
                // Half the time one of the two best seats, which every fan wants.
                let pick = if rng.random_range(0..2) == 0 {
                    2
                } else {
                    seats.len()
                };
                let seat = seats[rng.random_range(0..pick)].clone();
                let op = Op::Hold {
                    key,
                    section: FLOOR.into(),
                    seats: vec![seat.clone()],
                    quantity: 1,
                };
                let req = pb::HoldRequest {
                    event_id: EVENT.into(),
                    user_id: user.clone(),
                    admission_token: token.clone(),
                    idempotency_key: sent,
                    selection: Some(pb::hold_request::Selection::Seats(pb::SeatSelection {
                        seat_ids: vec![seat],
                    })),
                    access_code: String::new(),
                };
                let got = within(
                    &w,
                    &conn,
                    me,
                    at,
                    op,
                    |mut c| {
                        let req = req.clone();
                        async move { c.booking.hold(req).await }
                    },
                    hold_answer,
                    patience,
                )
                .await;
                if let Answer::Hold(h) = got {
                    mine.holds.insert(h.id.clone(), h);
                }
            }
            40..48 => {
                let items: Vec<(String, String, u32)> = (0..2)
                    .map(|i| {
                        (
                            format!("b-{me}-{n}-{i}"),
                            [GA, FLOOR][rng.random_range(0..2)].to_owned(),
                            1,
                        )
                    })
                    .collect();
                let req = pb::HoldBatchRequest {
                    event_id: EVENT.into(),
                    items: items
                        .iter()
                        .map(|(key, section, quantity)| pb::HoldBatchItem {
                            user_id: user.clone(),
                            admission_token: token.clone(),
                            idempotency_key: key.clone(),
                            selection: Some(pb::hold_batch_item::Selection::BestAvailable(
                                pb::BestAvailable {
                                    section_id: section.clone(),
                                    quantity: *quantity,
                                },
                            )),
                            access_code: String::new(),
                        })
                        .collect(),
                };
                let got = until_definite(
                    &w,
                    &conn,
                    me,
                    at,
                    Op::Batch { items },
                    |mut c| {
                        let req = req.clone();
                        async move { c.booking.hold_batch(req).await }
                    },
                    |r: pb::HoldBatchResponse| {
                        Answer::Batch(
                            r.results
                                .iter()
                                .map(|item| match &item.result {
                                    Some(pb::hold_batch_result::Result::Hold(h)) => {
                                        Ok(HoldSeen::of(h))
                                    }
                                    Some(pb::hold_batch_result::Result::Error(e)) => {
                                        Err((e.code, e.reason.clone()))
                                    }
                                    None => Err((-1, "empty item".into())),
                                })
                                .collect(),
                        )
                    },
                )
                .await;
                if let Answer::Batch(items) = got {
                    full = items
                        .iter()
                        .any(|i| matches!(i, Err((_, r)) if r == "USER_LIMIT"));
                    for h in items.into_iter().flatten() {
                        mine.holds.insert(h.id.clone(), h);
                    }
                }
            }
            48..68 => {
                let Some(h) = pick_held(&mine, &mut rng) else {
                    continue;
                };
                let token = if rng.random_range(0..10) == 0 {
                    "tok_decline"
                } else {
                    "tok_visa"
                };
                let key = format!("c-{me}-{n}");
                let op = Op::Confirm {
                    hold: h.clone(),
                    key: key.clone(),
                    token: token.into(),
                };
                let req = pb::ConfirmRequest {
                    hold_id: h.clone(),
                    user_id: user.clone(),
                    payment_token: token.into(),
                    idempotency_key: key,
                };
                let got = until_definite(
                    &w,
                    &conn,
                    me,
                    at,
                    op,
                    |mut c| {
                        let req = req.clone();
                        async move { c.booking.confirm(req).await }
                    },
                    |o| Answer::Order(OrderSeen::of(&o)),
                )
                .await;
                match got {
                    Answer::Order(o) => {
                        if let Some(h) = mine.holds.get_mut(&h) {
                            h.status = pb::HoldStatus::Confirmed as i32;
                        }
                        mine.orders.insert(o.id.clone(), o);
                    }
                    Answer::Refused(_, r) if r == "HOLD_EXPIRED" || r == "HOLD_NOT_ACTIVE" => {
                        mine.holds.remove(&h);
                    }
                    _ => {}
                }
            }
            68..76 => {
                let Some(h) = pick_held(&mine, &mut rng) else {
                    continue;
                };
                let req = pb::ReleaseRequest {
                    hold_id: h.clone(),
                    user_id: user.clone(),
                };
                let got = until_definite(
                    &w,
                    &conn,
                    me,
                    at,
                    Op::Release { hold: h.clone() },
                    |mut c| {
                        let req = req.clone();
                        async move { c.booking.release(req).await }
                    },
                    |_| Answer::Released,
                )
                .await;
                if got == Answer::Released
                    && let Some(h) = mine.holds.get_mut(&h)
                {
                    h.status = pb::HoldStatus::Released as i32;
                }
            }
            76..84 => {
                read_back_one(&w, &conn, me, at, &user, &mine, &mut rng).await;
            }
            84..90 => {
                get_event(&w, &conn, me, at).await;
            }
            _ => {
                // Once a section is sold out, fans join its waitlist (and read their entries).
                if sold_out && rng.random_range(0..2) == 0 {
                    let section = [GA, FLOOR][rng.random_range(0..2)].to_owned();
                    let req = pb::JoinWaitlistRequest {
                        event_id: EVENT.into(),
                        user_id: user.clone(),
                        section_id: section.clone(),
                        quantity: 1,
                        admission_token: token.clone(),
                    };
                    let op = Op::JoinWaitlist {
                        section,
                        quantity: 1,
                    };
                    let got = until_definite(
                        &w,
                        &conn,
                        me,
                        at,
                        op,
                        |mut c| {
                            let req = req.clone();
                            async move { c.waitlist.join_waitlist(req).await }
                        },
                        |e| Answer::Entry(e.entry_id, e.state, e.offered_hold_id),
                    )
                    .await;
                    if let Answer::Entry(id, ..) = got
                        && !mine.entries.contains(&id)
                    {
                        mine.entries.push(id);
                    }
                } else if let Some(e) = mine.entries.first().cloned() {
                    get_entry(&w, &conn, me, at, &user, &e).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..200))).await;
    }
    while !w.healed.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Everything I was told, through every node.
    for at in 0..conn.len() {
        for h in mine.holds.keys() {
            get_hold(&w, &conn, me, at, &user, h).await;
        }
        for o in mine.orders.keys() {
            get_order(&w, &conn, me, at, &user, o).await;
        }
        for e in &mine.entries {
            get_entry(&w, &conn, me, at, &user, e).await;
        }
        if me == 0 {
            get_event(&w, &conn, me, at).await;
        }
    }
}

fn pick_held(mine: &Mine, rng: &mut ChaCha8Rng) -> Option<String> {
    let held: Vec<&String> = mine
        .holds
        .values()
        .filter(|h| h.status == pb::HoldStatus::Held as i32)
        .map(|h| &h.id)
        .collect();
    (!held.is_empty()).then(|| held[rng.random_range(0..held.len())].clone())
}

/// Joins the line and waits to be admitted: the admission token.
async fn admitted(w: &Workload, conn: &Conn, me: Fan, home: usize, user: &str) -> String {
    let req = pb::JoinRequest {
        event_id: EVENT.into(),
        user_id: user.to_owned(),
        session_id: "s".into(),
        ..Default::default()
    };
    let joined = loop {
        let got = until_definite(
            w,
            conn,
            me,
            home,
            Op::Join,
            |mut c| {
                let req = req.clone();
                async move { c.room.join(req).await }
            },
            |t: pb::QueueTicket| Answer::Joined(t.queue_token, t.position),
        )
        .await;
        if let Answer::Joined(token, _) = got {
            break token;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut at = home;
    loop {
        let req = pb::GetStatusRequest {
            queue_token: joined.clone(),
        };
        let got = until_definite(
            w,
            conn,
            me,
            at,
            Op::Status,
            |mut c| {
                let req = req.clone();
                async move { c.room.get_status(req).await }
            },
            |s: pb::QueueStatus| Answer::Queue(s.position, s.state, s.admission_token),
        )
        .await;
        if let Answer::Queue(_, state, token) = got
            && state == pb::QueueState::Admitted as i32
        {
            return token;
        }
        at += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn read_back_one(
    w: &Workload,
    conn: &Conn,
    me: Fan,
    at: usize,
    user: &str,
    mine: &Mine,
    rng: &mut ChaCha8Rng,
) {
    if rng.random_range(0..2) == 0 && !mine.orders.is_empty() {
        let orders: Vec<&String> = mine.orders.keys().collect();
        let o = orders[rng.random_range(0..orders.len())].clone();
        get_order(w, conn, me, at, user, &o).await;
    } else if !mine.holds.is_empty() {
        let holds: Vec<&String> = mine.holds.keys().collect();
        let h = holds[rng.random_range(0..holds.len())].clone();
        get_hold(w, conn, me, at, user, &h).await;
    }
}

async fn get_hold(w: &Workload, conn: &Conn, me: Fan, at: usize, user: &str, hold: &str) {
    let req = pb::GetHoldRequest {
        hold_id: hold.to_owned(),
        user_id: user.to_owned(),
    };
    until_definite(
        w,
        conn,
        me,
        at,
        Op::GetHold {
            hold: hold.to_owned(),
        },
        |mut c| {
            let req = req.clone();
            async move { c.booking.get_hold(req).await }
        },
        hold_answer,
    )
    .await;
}

async fn get_order(w: &Workload, conn: &Conn, me: Fan, at: usize, user: &str, order: &str) {
    let req = pb::GetOrderRequest {
        order_id: order.to_owned(),
        user_id: user.to_owned(),
    };
    until_definite(
        w,
        conn,
        me,
        at,
        Op::GetOrder {
            order: order.to_owned(),
        },
        |mut c| {
            let req = req.clone();
            async move { c.booking.get_order(req).await }
        },
        |o| Answer::Order(OrderSeen::of(&o)),
    )
    .await;
}

async fn get_entry(w: &Workload, conn: &Conn, me: Fan, at: usize, user: &str, entry: &str) {
    let req = pb::GetWaitlistEntryRequest {
        entry_id: entry.to_owned(),
        user_id: user.to_owned(),
    };
    until_definite(
        w,
        conn,
        me,
        at,
        Op::GetEntry {
            entry: entry.to_owned(),
        },
        |mut c| {
            let req = req.clone();
            async move { c.waitlist.get_waitlist_entry(req).await }
        },
        |e| Answer::Entry(e.entry_id, e.state, e.offered_hold_id),
    )
    .await;
}

async fn get_event(w: &Workload, conn: &Conn, me: Fan, at: usize) {
    let req = pb::GetEventRequest {
        event_id: EVENT.into(),
    };
    until_definite(
        w,
        conn,
        me,
        at,
        Op::GetEvent,
        |mut c| {
            let req = req.clone();
            async move { c.events.get_event(req).await }
        },
        |e: pb::Event| Answer::Event(counts(&e)),
    )
    .await;
}

fn counts(e: &pb::Event) -> Vec<crate::history::Counts> {
    e.sections
        .iter()
        .map(|s| {
            (
                s.section_id.clone(),
                s.capacity,
                s.available,
                s.held,
                s.sold,
            )
        })
        .collect()
}
