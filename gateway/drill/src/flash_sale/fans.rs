//! The fans, from the waiting room to tickets (or not): `--concurrency` client tasks, each
//! taking the next fan in arrival order once it has arrived (a fan waits for a free client as
//! it would for a free slot), so a million fans cost the load generator no task each.
//!
//! A fan joins the line (first solving the event's join challenge, if it asks for a proof of
//! work) and polls until admitted, holds 1 to 4 places (exact seats picked from
//! the seat map, best available in a section, or anywhere), then pays (maybe with a declined
//! card first) or walks away. Turned away with SOLD_OUT, a fan may wait on the waitlist (with
//! their admission, as the contract wants) and buy what it offers; if places came back
//! meanwhile (PLACES_AVAILABLE), they hold those instead. At most `--concurrency` fans are between joining and paying at once.
//!
//! Against a cluster (`--nodes 3`) fan `i` starts at node `i % 3` and stays where its calls are
//! answered: a call that fails on a node goes to the next one, the same request
//! ([`super::failover`]); a fan whose place in line is gone (a line lost with the node that
//! kept it; the replicated waiting room keeps it) joins the line again; and every hold and order
//! a fan is told about is recorded, to read back at the end.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use boxoffice_client::{Bearer, Clients, Idempotent, Retry, is_overloaded};
use boxoffice_proto::v1 as pb;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;
use tonic::transport::Channel;

use super::args::FlashSaleArgs;
use super::failover::Attempts;
use super::tally::{AckedOrder, Latencies, Tally, Ticket, reason, record, record_duration};

/// Times a fan joins the line again when its place is gone before giving up.
const REJOINS_MAX: u32 = 5;

/// How long a fan told `SALE_PAUSED` waits before trying again (plus up to 50 ms).
const PAUSED_RETRY: Duration = Duration::from_millis(250);

/// How fans retry: only calls the gate or a section shed (`OVERLOADED`), at most 200 times,
/// waiting 5 ms doubling to 70 ms plus jitter (70 to 140 ms once at the cap: on average the
/// 105 ms the fans have always waited at most).
const PATIENCE: Retry =
    Retry::new(Duration::from_millis(5), Duration::from_millis(70), 200).when(is_overloaded);

/// The sale's event as the fans see it.
pub(crate) struct SaleEvent {
    /// Its id.
    pub event_id: String,
    /// Its reserved sections (fans pick exact seats there).
    pub reserved: Vec<String>,
    /// All its sections.
    pub all_sections: Vec<String>,
    /// The proof of work its `Join` asks for, in leading zero bits (0: none).
    pub join_pow_bits: u32,
    /// Its presale (`--presale-codes`), if any.
    pub presale: Option<super::presale::Presale>,
}

/// When each fan arrives: the pre-opening share spread over 80% of the time before the
/// opening, the rest evenly over `--arrival-seconds` after it.
#[derive(Clone, Copy)]
pub(crate) struct Arrivals {
    started: Instant,
    opens_in: Duration,
    preopen: usize,
    per_fan: Duration,
}

impl Arrivals {
    /// The schedule of a sale that started at `started` and opens `opens_in` later.
    pub fn new(args: &FlashSaleArgs, started: Instant, opens_in: Duration) -> Arrivals {
        let preopen = args.preopen();
        let rest = args.fans - preopen;
        Arrivals {
            started,
            opens_in,
            preopen,
            per_fan: Duration::from_secs_f64(args.arrival_seconds.max(0.0) / rest.max(1) as f64),
        }
    }

    /// Fan `i`'s arrival.
    pub(crate) fn at(&self, i: usize) -> Instant {
        if i < self.preopen {
            self.started
                + self
                    .opens_in
                    .mul_f64(i as f64 / self.preopen.max(1) as f64 * 0.8)
        } else {
            self.started
                + self.opens_in
                + self.per_fan * u32::try_from(i - self.preopen).unwrap_or(u32::MAX)
        }
    }
}

/// What every fan task shares.
pub(crate) struct Crowd {
    pub args: Arc<FlashSaleArgs>,
    pub event: SaleEvent,
    /// Fans with a lower index joined before the opening.
    pub preopen: usize,
    /// Fans solving a join challenge at once: one per core (the hash search is all CPU).
    solvers: Arc<Semaphore>,
    /// Per node, the channels to it (one node unless the sale runs against a cluster).
    nodes: Vec<Vec<Channel>>,
    bearer: Bearer,
    /// Whether the holds and orders the fans are told about are recorded (cluster runs).
    record_acks: bool,
    pub tally: Arc<Tally>,
    pub lat: Mutex<Latencies>,
    /// Every ticket the fans bought.
    pub tickets: Mutex<Vec<Ticket>>,
    /// The first orders, for the after-sale (`--after-sale`).
    pub orders: super::presale::Orders,
    /// When the last ticket was bought.
    pub last_sale: Mutex<Option<Instant>>,
}

impl Crowd {
    /// The fans of a sale of `event`, over `nodes` (per node, its channels; fan `i` starts at
    /// node `i % nodes` and takes the same channel of each node).
    pub fn new(
        args: Arc<FlashSaleArgs>,
        event: SaleEvent,
        nodes: Vec<Vec<Channel>>,
        bearer: Bearer,
        tally: Arc<Tally>,
    ) -> Crowd {
        Crowd {
            preopen: args.preopen(),
            solvers: Arc::new(Semaphore::new(
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            )),
            args,
            event,
            record_acks: nodes.len() > 1,
            nodes,
            bearer,
            tally,
            lat: Mutex::default(),
            tickets: Mutex::default(),
            orders: super::presale::Orders::default(),
            last_sale: Mutex::default(),
        }
    }
}

/// Runs every fan, each from its arrival: `--concurrency` clients take the fans in arrival
/// order (a fan not yet arrived is waited for), and count the fans arrived as time goes. A fan
/// who waits on the waitlist does so on a task of its own, its client free for the next fan.
pub(crate) async fn arrive(crowd: Arc<Crowd>, arrivals: &Arrivals) -> anyhow::Result<()> {
    let fans = crowd.args.fans;
    let next = Arc::new(AtomicUsize::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..crowd.args.concurrency.clamp(1, fans.max(1)) {
        let (crowd, next, arrivals) = (crowd.clone(), next.clone(), *arrivals);
        clients.spawn(async move {
            let mut waitlisters = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= crowd.args.fans {
                    break;
                }
                let at = arrivals.at(i);
                if at > Instant::now() {
                    tokio::time::sleep_until(at.into()).await;
                }
                if let Some(w) = Box::pin(one_fan(&crowd, i)).await {
                    waitlisters.push(tokio::spawn(w.wait(crowd.clone())));
                }
            }
            for w in waitlisters {
                w.await.context("a fan on the waitlist panicked")?;
            }
            anyhow::Ok(())
        });
    }
    // The fans arrived so far, for the progress lines and the plot.
    let mut arrived = 0;
    while arrived < fans {
        let now = Instant::now();
        while arrived < fans && arrivals.at(arrived) <= now {
            arrived += 1;
        }
        crowd.tally.arrived.store(arrived, Ordering::Relaxed);
        if arrived < fans {
            let at = arrivals.at(arrived).max(now + Duration::from_millis(1));
            tokio::time::sleep_until(at.into()).await;
        }
    }
    while let Some(r) = clients.join_next().await {
        r.context("a fan's client panicked")??;
    }
    Ok(())
}

/// A hoarding bot (`--hoarders`): it joins the line with the fans who come before the opening
/// (and stays in it when told sold out),
/// and once admitted holds the per-user limit anywhere, never pays, and holds again as soon as
/// its hold has expired, until `stop` is raised (the fans are done). The places it held then.
pub(crate) async fn hoard(crowd: Arc<Crowd>, k: usize, stop: Arc<AtomicBool>) -> u32 {
    let mut bot = Fan::new(&crowd, crowd.args.fans + k);
    bot.user = format!("hoarder-{k}");
    let stopped = || stop.load(Ordering::Acquire);
    // A bot told sold out in line stays in it: places come back as holds expire.
    let mut line = bot.queue().await;
    let token = loop {
        match line {
            Some(Line::Admitted(token)) => break token,
            Some(Line::SoldOut(queue_token)) if !stopped() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                line = match bot.wait_in_line(&queue_token, Instant::now()).await {
                    Polled::Line(l) => Some(l),
                    Polled::Gone | Polled::Over => None,
                };
            }
            _ => return 0,
        }
    };
    let mut n = 0u64;
    while !stopped() {
        n += 1;
        let req = pb::HoldRequest {
            event_id: crowd.event.event_id.clone(),
            user_id: bot.user.clone(),
            admission_token: token.clone(),
            idempotency_key: format!("hoard-{n}"),
            selection: Some(pb::hold_request::Selection::BestAvailable(
                pb::BestAvailable {
                    section_id: String::new(),
                    quantity: crowd.args.per_user_limit,
                },
            )),
            access_code: String::new(),
        };
        let held = bot
            .patient(
                |n| &n.booking,
                req,
                None,
                |mut c, r| async move { c.hold(r).await },
            )
            .await;
        match held {
            Ok(h) => {
                let h = h.into_inner();
                crowd.tally.hoarder_holds.fetch_add(1, Ordering::Relaxed);
                // Until the hold has expired (and its places count against nobody again).
                let deadline_ms = u64::try_from(h.expires_at_unix_ms).unwrap_or(0) + 20;
                while boxoffice_engine::Clock::now_ms(&boxoffice_engine::SystemClock) < deadline_ms
                {
                    if stopped() {
                        return h.quantity;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            // Nothing free right now, or the last hold's places not back yet: soon again.
            Err(s)
                if matches!(
                    reason(&s).as_str(),
                    "SOLD_OUT" | "USER_LIMIT" | "SALE_PAUSED" | "ACCESS_CODE_REQUIRED"
                ) =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => return 0,
        }
    }
    0
}

/// A fan in the line-hold-pay flow: counted in `Tally::in_sale` until dropped (also when its
/// task ends early or panics, so waitlisters never wait for a fan who is gone).
struct InSale(Arc<Tally>);

impl Drop for InSale {
    fn drop(&mut self) {
        self.0.in_sale.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Fan `i`, on a client: the waiting room, a hold, payment; or, turned away, what its wait on
/// the waitlist needs (waiting there would hog the client).
async fn one_fan(crowd: &Crowd, i: usize) -> Option<Waitlister> {
    let in_sale = InSale(crowd.tally.clone());
    let mut fan = Fan::new(crowd, i);
    let mut outcome = fan.buy().await;
    drop(in_sale);
    if let Some((quantity, admission)) = outcome.waitlist.take() {
        return Some(Waitlister {
            i,
            rng: fan.rng,
            at: fan.at.load(Ordering::Relaxed),
            told: fan.told,
            in_line: fan.in_line,
            quantity,
            admission,
        });
    }
    crowd.bought(outcome.tickets);
    None
}

/// A fan turned away who waits on the waitlist: where it stood when it left its client.
struct Waitlister {
    i: usize,
    /// Its own draws go on where they were.
    rng: StdRng,
    at: usize,
    told: bool,
    in_line: Option<String>,
    quantity: u32,
    admission: String,
}

impl Waitlister {
    /// Waits on the waitlist, and buys what it offers while the sale lasts.
    async fn wait(self, crowd: Arc<Crowd>) {
        let mut fan = Fan::new(&crowd, self.i);
        fan.rng = self.rng;
        fan.at = AtomicUsize::new(self.at);
        fan.told = self.told;
        fan.in_line = self.in_line;
        let tickets = fan.wait_on_waitlist(self.quantity, &self.admission).await;
        crowd.bought(tickets);
    }
}

impl Crowd {
    /// Keeps the tickets a fan bought (and when the last were bought).
    fn bought(&self, tickets: Vec<Ticket>) {
        if tickets.is_empty() {
            return;
        }
        if let Ok(mut t) = self.tickets.lock() {
            t.extend(tickets);
        }
        if let Ok(mut l) = self.last_sale.lock() {
            *l = Some(Instant::now());
        }
    }
}

/// Where a fan's wait in line ended.
enum Line {
    /// Admitted: the admission token.
    Admitted(String),
    /// Still in line, but told every place is taken (`QUEUE_STATE_SOLD_OUT`): the queue token.
    SoldOut(String),
}

/// What one wait in line came to.
enum Polled {
    /// Admitted, or told sold out.
    Line(Line),
    /// The place is gone (the waiting room of a leader that died): join again.
    Gone,
    /// Expired, or a call failed.
    Over,
}

/// What a fan got, and whether they go on to wait on the waitlist (for this many places, with
/// this admission token).
#[derive(Default)]
struct Outcome {
    tickets: Vec<Ticket>,
    waitlist: Option<(u32, String)>,
}

/// One fan: their clients (one per node), the node they call now, their name, their own
/// seeded choices.
struct Fan<'a> {
    crowd: &'a Crowd,
    tally: &'a Tally,
    i: usize,
    user: String,
    rng: StdRng,
    nodes: Vec<Clients>,
    at: AtomicUsize,
    /// Told by the line that every place is taken (counted once).
    told: bool,
    /// The queue token of the fan's place in line, while it waits on the waitlist with it
    /// (told sold out before it was admitted).
    in_line: Option<String>,
}

impl<'a> Fan<'a> {
    fn new(crowd: &'a Crowd, i: usize) -> Fan<'a> {
        Fan {
            crowd,
            tally: &crowd.tally,
            i,
            user: format!("fan-{i}"),
            rng: StdRng::seed_from_u64(
                crowd.args.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            ),
            nodes: crowd
                .nodes
                .iter()
                .map(|channels| {
                    Clients::new(
                        &channels[(i / crowd.nodes.len()) % channels.len()],
                        &crowd.bearer,
                    )
                })
                .collect(),
            at: AtomicUsize::new(i % crowd.nodes.len()),
            told: false,
            in_line: None,
        }
    }

    /// Up to 50 ms, so fans told to wait do not all come back at once.
    fn jitter(&mut self) -> Duration {
        Duration::from_millis(self.rng.random_range(0..50))
    }

    /// The clients of the node the fan calls now.
    fn here(&self) -> &Clients {
        &self.nodes[self.at.load(Ordering::Relaxed) % self.nodes.len()]
    }

    /// After a call that failed where it would have been answered elsewhere: the next node.
    fn move_on(&self) {
        self.at.fetch_add(1, Ordering::Relaxed);
    }

    /// `call(client, request)` with the client `pick` chooses of the fan's node, retried while
    /// shed ([`PATIENCE`]), and on a cluster sent again to the next node while it fails on one
    /// ([`Attempts`]). Every attempt counts as a call of the fans (and in `also`, if given),
    /// every retry after a shed as shed.
    async fn patient<C, Req, T, F, Fut>(
        &self,
        pick: fn(&Clients) -> &C,
        request: Req,
        also: Option<&AtomicU64>,
        mut call: F,
    ) -> Result<T, tonic::Status>
    where
        C: Clone,
        Req: Idempotent,
        F: FnMut(C, Req) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let tally = self.tally;
        let mut tries = Attempts::new(self.nodes.len(), &self.at, Some(tally));
        loop {
            let attempt = PATIENCE.call_notify(
                pick(&self.nodes[tries.node()]),
                request.clone(),
                |c, r| {
                    tally.calls.fetch_add(1, Ordering::Relaxed);
                    if let Some(also) = also {
                        also.fetch_add(1, Ordering::Relaxed);
                    }
                    call(c, r)
                },
                |_, _| {
                    tally.shed.fetch_add(1, Ordering::Relaxed);
                },
            );
            match tries.attempt(attempt).await {
                Err(s) if tries.retry(&s).await => {}
                r => return r,
            }
        }
    }

    /// Counts this fan told sold out by the line, and how long after the later of the last
    /// hold acknowledged and its place in line (`joined_at`: its `Join` answered).
    fn told_sold_out(&mut self, joined_at: Instant) {
        if std::mem::replace(&mut self.told, true) {
            return;
        }
        let tally = self.tally;
        tally.told_sold_out.fetch_add(1, Ordering::Relaxed);
        let last = tally.last_hold.lock().ok().and_then(|l| *l);
        let from = last.map_or(joined_at, |l| l.max(joined_at));
        if let Ok(mut d) = tally.sold_out_delays.lock() {
            d.push(from.elapsed());
        }
    }

    /// From the waiting room to tickets (or not).
    async fn buy(&mut self) -> Outcome {
        let admission = match self.queue().await {
            Some(Line::Admitted(token)) => token,
            Some(Line::SoldOut(queue_token)) => {
                // Told by the line: the waitlist (with the queue token), or home.
                let wait = self.rng.random::<f64>() < self.crowd.args.waitlist_share;
                if wait {
                    self.in_line = Some(queue_token.clone());
                }
                return Outcome {
                    tickets: Vec::new(),
                    waitlist: wait.then_some((1, queue_token)),
                };
            }
            None => return Outcome::default(),
        };
        self.tally.admitted.fetch_add(1, Ordering::Relaxed);
        let quantity = match self.rng.random_range(0..10) {
            0..=1 => 1,
            2..=5 => 2,
            6..=7 => 3,
            _ => 4,
        }
        .min(self.crowd.args.per_user_limit);
        let selection = self.choose(quantity).await;
        let hold = match self.hold(&admission, "hold", quantity, selection).await {
            Ok(h) => h,
            Err(turned_away) => return turned_away,
        };
        self.tally.holds_ok.fetch_add(1, Ordering::Relaxed);
        if self.rng.random::<f64>() >= self.crowd.args.pay_share {
            self.tally.walked_away.fetch_add(1, Ordering::Relaxed);
            return Outcome::default();
        }
        let declined_first = self.rng.random::<f64>() < self.crowd.args.decline_share;
        Outcome {
            tickets: self.pay(&hold.hold_id, self.i, declined_first).await,
            waitlist: None,
        }
    }

    /// The `Join` of this fan: with the solution of a fresh join challenge when the event asks
    /// for a proof of work (one solver per core at a time; the challenge is fetched once the
    /// fan's turn to solve has come, so waiting for a core never lets it expire). `None` if a
    /// call failed.
    async fn join_request(&self) -> Option<pb::JoinRequest> {
        let event = &self.crowd.event;
        let no_challenge = pb::JoinChallenge::default();
        if event.join_pow_bits == 0 {
            return Some(boxoffice_client::join_request(
                &event.event_id,
                &self.user,
                "web",
                &no_challenge,
            ));
        }
        let solver = self.crowd.solvers.clone().acquire_owned().await.ok()?;
        let ask = pb::GetJoinChallengeRequest {
            event_id: event.event_id.clone(),
            user_id: self.user.clone(),
        };
        let challenge = match self
            .patient(
                |n| &n.room,
                ask,
                None,
                |mut c, r| async move { c.get_join_challenge(r).await },
            )
            .await
        {
            Ok(c) => c.into_inner(),
            Err(s) => {
                self.tally.error("get_join_challenge", Some(&s));
                return None;
            }
        };
        let (event_id, user) = (event.event_id.clone(), self.user.clone());
        let solved = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let join = boxoffice_client::join_request(&event_id, &user, "web", &challenge);
            let took = started.elapsed();
            drop(solver);
            (join, took)
        })
        .await;
        let Ok((join, took)) = solved else {
            self.tally.error("solving the join challenge", None);
            return None;
        };
        self.tally.pow_solved.fetch_add(1, Ordering::Relaxed);
        self.tally.pow_solve_ns.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        record_duration(&self.crowd.lat, |l| &mut l.pow_solve, took);
        Some(join)
    }

    /// Joins the line and polls until admitted (the ETA paces the polls): the admission token,
    /// or `None` if the fan's place lapsed or a call failed. A place that is gone (the line
    /// answers `EXPIRED` at position 0, or the queue token `TOKEN_EXPIRED`: the waiting room of
    /// a leader that died) sends the fan back to the line: they join again, up to
    /// [`REJOINS_MAX`] times.
    /// One `GetStatus` of the fan's place in line (its latency recorded).
    async fn poll_status(
        &mut self,
        queue_token: &str,
    ) -> Result<tonic::Response<pb::QueueStatus>, tonic::Status> {
        let poll_started = Instant::now();
        let poll = pb::GetStatusRequest {
            queue_token: queue_token.to_owned(),
        };
        let st = self
            .patient(
                |n| &n.room,
                poll,
                None,
                |mut c, r| async move { c.get_status(r).await },
            )
            .await;
        record(&self.crowd.lat, |l| &mut l.status, poll_started);
        st
    }

    async fn queue(&mut self) -> Option<Line> {
        let (tally, lat) = (self.tally, &self.crowd.lat);
        let mut rejoins = 0;
        loop {
            let join = self.join_request().await?;
            let join_started = Instant::now();
            let joined = self
                .patient(
                    |n| &n.room,
                    join,
                    None,
                    |mut c, r| async move { c.join(r).await },
                )
                .await;
            record(lat, |l| &mut l.join, join_started);
            let ticket = match joined {
                Ok(t) => t.into_inner(),
                Err(s) if reason(&s) == "SALE_PAUSED" => {
                    // An operator paused the sale: wait, and join when it goes on.
                    tally.sale_paused.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(PAUSED_RETRY + self.jitter()).await;
                    continue;
                }
                Err(s) => {
                    tally.error("join", Some(&s));
                    return None;
                }
            };
            // The fan has its place in line from now. A fan sent back to the line stands in
            // another line: not compared with the arrival order.
            let joined_at = Instant::now();
            if self.i >= self.crowd.preopen
                && rejoins == 0
                && ticket.position > 0
                && let Ok(mut p) = tally.positions.lock()
            {
                p.push((self.i, ticket.position));
            }
            if ticket.state == pb::QueueState::SoldOut as i32 {
                // Told at once: every place is taken.
                self.told_sold_out(joined_at);
                return Some(Line::SoldOut(ticket.queue_token));
            }
            match self.wait_in_line(&ticket.queue_token, joined_at).await {
                Polled::Line(line) => return Some(line),
                Polled::Gone if rejoins < REJOINS_MAX => {
                    if rejoins == 0 {
                        tally.sent_back_to_line.fetch_add(1, Ordering::Relaxed);
                    }
                    rejoins += 1;
                }
                Polled::Gone | Polled::Over => return None,
            }
        }
    }

    /// Polls the fan's place in line (`queue_token`, joined at `joined_at`) until it is
    /// admitted, told every place is taken, or its place is gone.
    async fn wait_in_line(&mut self, queue_token: &str, joined_at: Instant) -> Polled {
        let tally = self.tally;
        loop {
            let st = self.poll_status(queue_token).await;
            let gone = match &st {
                Ok(st) => {
                    st.get_ref().state == pb::QueueState::Expired as i32
                        && st.get_ref().position == 0
                }
                Err(s) => reason(s) == "TOKEN_EXPIRED",
            };
            if gone {
                return Polled::Gone;
            }
            let st = match st {
                Ok(st) => st.into_inner(),
                Err(s) => {
                    tally.error("status", Some(&s));
                    return Polled::Over;
                }
            };
            if st.state == pb::QueueState::Admitted as i32 {
                return Polled::Line(Line::Admitted(st.admission_token));
            }
            if st.state == pb::QueueState::Expired as i32 {
                return Polled::Over;
            }
            if st.state == pb::QueueState::SoldOut as i32 {
                self.told_sold_out(joined_at);
                return Polled::Line(Line::SoldOut(queue_token.to_owned()));
            }
            let wait = (u64::from(st.eta_seconds) * 300).clamp(50, 1_000);
            tokio::time::sleep(Duration::from_millis(wait + self.rng.random_range(0..50))).await;
        }
    }

    /// What the fan asks for: exact seats from the seat map (`--exact-rate`), best available
    /// in a section (half of the fans), or anywhere (`None`).
    async fn choose(&mut self, quantity: u32) -> Option<pb::hold_request::Selection> {
        let args = &self.crowd.args;
        let event = &self.crowd.event;
        let roll: f64 = self.rng.random();
        if roll < args.exact_share && !event.reserved.is_empty() {
            let section = &event.reserved[self.rng.random_range(0..event.reserved.len())];
            self.pick_from_map(section, quantity).await
        } else if roll < args.exact_share + 0.5 {
            let s = &event.all_sections[self.rng.random_range(0..event.all_sections.len())];
            Some(pb::hold_request::Selection::BestAvailable(
                pb::BestAvailable {
                    section_id: s.clone(),
                    quantity,
                },
            ))
        } else {
            None
        }
    }

    /// Picks `q` adjacent seats that look free in the seat map of `section`, from a random row
    /// (`None` if the map could not be read: the fan then takes best available, and calls the
    /// next node from now on).
    async fn pick_from_map(
        &mut self,
        section: &str,
        q: u32,
    ) -> Option<pb::hold_request::Selection> {
        let map = self
            .here()
            .events
            .clone()
            .get_seat_map(pb::GetSeatMapRequest {
                event_id: self.crowd.event.event_id.clone(),
                section_id: section.into(),
                first_row: 0,
            })
            .await
            .inspect_err(|_| self.move_on())
            .ok()?
            .into_inner();
        let seats = &map.sections.first()?.seats;
        let mut rows: Vec<&str> = seats.iter().map(|s| s.row.as_str()).collect();
        rows.dedup();
        let start = self.rng.random_range(0..rows.len().max(1));
        for k in 0..rows.len() {
            let row = rows[(start + k) % rows.len()];
            let free: Vec<&pb::Seat> = seats
                .iter()
                .filter(|s| s.row == row && s.status == pb::SeatStatus::Available as i32)
                .collect();
            for w in free.windows(q as usize) {
                if w.last()?.number - w[0].number == q - 1 {
                    return Some(pb::hold_request::Selection::Seats(pb::SeatSelection {
                        seat_ids: w.iter().map(|s| s.seat_id.clone()).collect(),
                    }));
                }
            }
        }
        None
    }

    /// Holds `quantity` places, falling back to anywhere when the pick lost the race or its
    /// section is gone; `Err` with the fan's outcome when the sale turned them away. The
    /// idempotency keys are `{key}-{attempt}`.
    async fn hold(
        &mut self,
        admission: &str,
        key: &str,
        quantity: u32,
        mut selection: Option<pb::hold_request::Selection>,
    ) -> Result<pb::Hold, Outcome> {
        let (tally, lat) = (self.tally, &self.crowd.lat);
        let anywhere = pb::hold_request::Selection::BestAvailable(pb::BestAvailable {
            section_id: String::new(),
            quantity,
        });
        let (mut attempt, mut paused) = (0, 0);
        loop {
            attempt += 1;
            let started = Instant::now();
            let request = pb::HoldRequest {
                event_id: self.crowd.event.event_id.clone(),
                user_id: self.user.clone(),
                admission_token: admission.to_owned(),
                // A try refused with SALE_PAUSED may have left that answer under its key: the
                // next try after the pause takes another.
                idempotency_key: match paused {
                    0 => format!("{key}-{attempt}"),
                    p => format!("{key}-{attempt}-p{p}"),
                },
                selection: Some(selection.clone().unwrap_or(anywhere.clone())),
                access_code: (self.crowd.event.presale.as_ref())
                    .map_or_else(String::new, |p| p.code_of(self.i)),
            };
            let r = self
                .patient(
                    |n| &n.booking,
                    request,
                    None,
                    |mut c, r| async move { c.hold(r).await },
                )
                .await;
            record(lat, |l| &mut l.hold, started);
            match r {
                Ok(h) => {
                    let h = h.into_inner();
                    if self.crowd.record_acks
                        && let Ok(mut a) = tally.acked.lock()
                    {
                        a.holds.push((h.hold_id.clone(), self.user.clone()));
                    }
                    if let Ok(mut l) = tally.last_hold.lock() {
                        *l = Some(Instant::now());
                    }
                    return Ok(h);
                }
                Err(s) if reason(&s) == "SALE_PAUSED" => {
                    // An operator paused the sale: wait, and try again when it goes on (the
                    // same try: the fallbacks below count tries the sale answered).
                    tally.sale_paused.fetch_add(1, Ordering::Relaxed);
                    paused += 1;
                    attempt -= 1;
                    tokio::time::sleep(PAUSED_RETRY + self.jitter()).await;
                }
                Err(s)
                    if matches!(
                        reason(&s).as_str(),
                        "ACCESS_CODE_REQUIRED" | "ACCESS_CODE_EXHAUSTED"
                    ) && self.crowd.event.presale.is_some() =>
                {
                    // The presale: no code, or the code used up. Wait for the public sale and
                    // try again (another key: the refusal may be kept under this one).
                    tally.presale_waits.fetch_add(1, Ordering::Relaxed);
                    paused += 1;
                    attempt -= 1;
                    let extra = self.jitter();
                    if let Some(p) = &self.crowd.event.presale {
                        p.wait_for_end(extra).await;
                    }
                }
                Err(s) if reason(&s) == "SEAT_UNAVAILABLE" && attempt < 3 => {
                    // The map was stale: someone was faster. Best available will do.
                    tally.stale_seat_map.fetch_add(1, Ordering::Relaxed);
                    selection = None;
                }
                Err(s) if reason(&s) == "SOLD_OUT" && attempt < 3 && selection.is_some() => {
                    selection = None; // that section is gone; anywhere will do
                }
                Err(s) if matches!(reason(&s).as_str(), "SOLD_OUT" | "SEAT_UNAVAILABLE") => {
                    tally.sold_out.fetch_add(1, Ordering::Relaxed);
                    let wait = self.rng.random::<f64>() < self.crowd.args.waitlist_share;
                    return Err(Outcome {
                        tickets: Vec::new(),
                        waitlist: wait.then(|| (quantity, admission.to_owned())),
                    });
                }
                Err(s) => {
                    tally.error("hold", Some(&s));
                    return Err(Outcome::default());
                }
            }
        }
    }

    /// Pays for `hold_id` with the card `tok_fan_{card}` (after a declined one if
    /// `declined_first`): the tickets, or none if the hold lapsed or a call failed.
    /// The tickets of an order the fan was told about (noted as acknowledged when the run
    /// reads them back).
    fn paid(&self, order: pb::Order) -> Vec<Ticket> {
        self.crowd
            .orders
            .keep(&order, 2 * self.crowd.args.after_sale);
        if self.crowd.record_acks
            && let Ok(mut a) = self.tally.acked.lock()
        {
            a.orders.push(AckedOrder {
                order_id: order.order_id.clone(),
                hold_id: order.hold_id.clone(),
                user_id: self.user.clone(),
                tickets: order.tickets.len(),
            });
        }
        order
            .tickets
            .into_iter()
            .map(|t| (t.section_id, t.seat_id))
            .collect()
    }

    async fn pay(&mut self, hold_id: &str, card: usize, declined_first: bool) -> Vec<Ticket> {
        let (tally, lat) = (self.tally, &self.crowd.lat);
        let confirm = |token: String, key: &str| pb::ConfirmRequest {
            hold_id: hold_id.into(),
            user_id: self.user.clone(),
            payment_token: token,
            idempotency_key: key.into(),
        };
        if declined_first {
            let request = confirm("tok_decline".into(), "pay-declined");
            let r = self
                .patient(
                    |n| &n.booking,
                    request,
                    None,
                    |mut c, r| async move { c.confirm(r).await },
                )
                .await;
            match &r {
                Err(s) if reason(s) == "PAYMENT_DECLINED" => {}
                // Too slow to pay: the hold lapsed before the first card was even tried.
                Err(s) if reason(s) == "HOLD_EXPIRED" => {
                    tally.too_late.fetch_add(1, Ordering::Relaxed);
                    return Vec::new();
                }
                _ => {
                    tally.error("the declined card was not declined", r.as_ref().err());
                    return Vec::new();
                }
            }
        }
        let started = Instant::now();
        let request = confirm(format!("tok_fan_{card}"), "pay");
        let r = self
            .patient(
                |n| &n.booking,
                request,
                None,
                |mut c, r| async move { c.confirm(r).await },
            )
            .await;
        record(lat, |l| &mut l.confirm, started);
        match r {
            Ok(order) => {
                tally.confirms_ok.fetch_add(1, Ordering::Relaxed);
                if declined_first {
                    tally.declined_then_paid.fetch_add(1, Ordering::Relaxed);
                }
                self.paid(order.into_inner())
            }
            // Too slow to pay: the hold lapsed (it happens; the places went back on sale).
            Err(s) if reason(&s) == "HOLD_EXPIRED" => {
                tally.too_late.fetch_add(1, Ordering::Relaxed);
                Vec::new()
            }
            Err(s) => {
                tally.error("confirm", Some(&s));
                Vec::new()
            }
        }
    }

    /// Joins the waitlist (with the fan's admission) and buys the offer if one comes while the
    /// sale lasts. Places that came back since the fan was turned away are refused to the
    /// waitlist (`PLACES_AVAILABLE`): the fan holds and pays for them instead, or joins again if
    /// someone was faster.
    async fn wait_on_waitlist(&mut self, quantity: u32, admission: &str) -> Vec<Ticket> {
        match self.join_waitlist(quantity, admission).await {
            Ok(entry) => self.await_offer(entry).await,
            Err(tickets) => tickets,
        }
    }

    /// Joins the waitlist (holding instead, at most three times, while places are free; told so
    /// a fourth time, the fan leaves):
    /// the entry, or (`Err`) what the fan ends with: tickets a hold instead bought, or none.
    async fn join_waitlist(
        &mut self,
        quantity: u32,
        admission: &str,
    ) -> Result<pb::WaitlistEntry, Vec<Ticket>> {
        let tally = self.tally;
        let mut admission = admission.to_owned();
        let mut tries = 0;
        loop {
            tries += 1;
            let join = pb::JoinWaitlistRequest {
                event_id: self.crowd.event.event_id.clone(),
                user_id: self.user.clone(),
                section_id: String::new(),
                quantity,
                admission_token: admission.clone(),
            };
            let joined = self
                .patient(
                    |n| &n.waitlist,
                    join,
                    None,
                    |mut c, r| async move { c.join_waitlist(r).await },
                )
                .await;
            match joined {
                Ok(e) => return Ok(e.into_inner()),
                // A fan in line with its queue token is NOT_ADMITTED once places came back (the
                // line says WAITING again): as PLACES_AVAILABLE.
                Err(s)
                    if reason(&s) == "PLACES_AVAILABLE"
                        || (reason(&s) == "NOT_ADMITTED" && self.in_line.is_some()) =>
                {
                    tally
                        .waitlist_places_available
                        .fetch_add(1, Ordering::Relaxed);
                    if tries > 3 {
                        // Places keep coming back and going to faster fans (a join sees the
                        // place, the hold after it finds it taken): an answer the contract
                        // gives, not an error. This fan stops chasing them and leaves.
                        return Err(Vec::new());
                    }
                    if let Some(queue_token) = self.in_line.clone() {
                        // Told sold out in line, and places came back: back to its place.
                        match self.wait_in_line(&queue_token, Instant::now()).await {
                            Polled::Line(Line::Admitted(token)) => {
                                self.in_line = None;
                                admission = token;
                            }
                            Polled::Line(Line::SoldOut(_)) => continue,
                            Polled::Gone | Polled::Over => return Err(Vec::new()),
                        }
                    }
                    match self
                        .hold(&admission, &format!("rehold-{tries}"), quantity, None)
                        .await
                    {
                        Ok(h) => {
                            tally.holds_ok.fetch_add(1, Ordering::Relaxed);
                            return Err(self.pay(&h.hold_id, self.i, false).await);
                        }
                        // Sold out again: join again.
                        Err(Outcome {
                            waitlist: Some(_), ..
                        }) => {}
                        Err(_) => return Err(Vec::new()),
                    }
                }
                Err(s) => {
                    tally.error("join_waitlist", Some(&s));
                    return Err(Vec::new());
                }
            }
        }
    }

    /// Waits on the waitlist `entry` for an offer, and pays for it.
    async fn await_offer(&mut self, entry: pb::WaitlistEntry) -> Vec<Ticket> {
        let tally = self.tally;
        tally.waitlist_joined.fetch_add(1, Ordering::Relaxed);
        // Wait while places may still come back, or until an offer comes. Nothing can come back
        // once every place is sold (no place free or held: orders are final), or once no fan is
        // left in the line-hold-pay flow and nothing is held. A fan who left earlier would keep
        // receiving offers that lapse, one TTL each (the contract has no way to leave the
        // waitlist).
        let ttl_ms = self.crowd.args.hold_ttl_ms();
        let give_up = Instant::now() + Duration::from_millis(ttl_ms * 20 + 60_000);
        // A quarter of the hold TTL, at most once a second: an offer is seen with most of its
        // TTL left to pay in.
        let every = Duration::from_millis((ttl_ms / 4).clamp(50, 1_000));
        while Instant::now() < give_up {
            tokio::time::sleep(every).await;
            if tally.sold_out_for_good.load(Ordering::Acquire) {
                break;
            }
            let check = pb::GetWaitlistEntryRequest {
                entry_id: entry.entry_id.clone(),
                user_id: self.user.clone(),
            };
            let checked = self
                .patient(
                    |n| &n.waitlist,
                    check,
                    Some(&tally.waitlist_checks),
                    |mut c, r| async move { c.get_waitlist_entry(r).await },
                )
                .await;
            let Ok(e) = checked.map(tonic::Response::into_inner) else {
                continue;
            };
            if e.state == pb::WaitlistState::Offered as i32 {
                let got = self.pay(&e.offered_hold_id, usize::MAX, false).await;
                if !got.is_empty() {
                    tally.waitlist_bought.fetch_add(1, Ordering::Relaxed);
                }
                return got;
            }
            if e.state != pb::WaitlistState::Waiting as i32 {
                break;
            }
            if tally.in_sale.load(Ordering::Acquire) == 0 {
                tally.calls.fetch_add(1, Ordering::Relaxed);
                tally.waitlist_checks.fetch_add(1, Ordering::Relaxed);
                if self.nothing_held().await {
                    break;
                }
            }
        }
        Vec::new()
    }

    /// Whether the event holds no places right now (read fresh from the server; `false` if it
    /// did not answer, and the fan calls the next node from now on).
    async fn nothing_held(&mut self) -> bool {
        match self
            .here()
            .events
            .clone()
            .get_event(pb::GetEventRequest {
                event_id: self.crowd.event.event_id.clone(),
            })
            .await
        {
            Ok(e) => e.into_inner().sections.iter().all(|s| s.held == 0),
            Err(_) => {
                self.move_on();
                false
            }
        }
    }
}
