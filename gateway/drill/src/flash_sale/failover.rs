//! A sale against a cluster (`--nodes 3`): calls that fail on one node go to the next, the
//! leader is killed on time (`--kill-leader-after`), and at the end everything the fans were
//! told is read back.
//!
//! A call fails on a node when the node is down (the connection is refused or reset), has no
//! leader yet or lost it under the call (`UNAVAILABLE`, e.g. `NOT_READY`), or does not answer
//! within 60 s. The caller then sends the same request (the same idempotency key) to the next
//! node after a short backoff (20 ms doubling to 250 ms, plus jitter), while the nodes have not
//! failed it for 60 s in a row (an attempt a leader took up for over 5 s ends a run): the
//! contract replays the first answer of a request that was committed, so nothing is done
//! twice. A retry that finds an earlier attempt still running on the leader
//! (`IDEMPOTENCY_KEY_IN_FLIGHT`: that attempt's connection broke, not its work) waits 0.5 to
//! 1 s and asks again, for up to 120 s, until the first answer is replayed. Against one
//! server nothing of this applies: a call is made once, as always.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use boxoffice_client::Clients;
use boxoffice_proto::v1 as pb;
use rand::Rng;
use tonic::{Code, Status};

use super::tally::{Acked, AckedOrder, Tally, reason};
use crate::cluster::LocalCluster;

/// How long one call keeps trying other nodes while they fail one after the other (a group
/// that lost its leader twice in a row on a loaded machine can take tens of seconds to serve
/// again).
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);
/// A failure that comes this long after the previous one of the same call starts a new run
/// of failures (the attempt between them was taken up by a serving leader, which then went).
const NEW_STREAK_AFTER: Duration = Duration::from_secs(5);
/// How long one call waits for an earlier attempt of its own that still runs.
const IN_FLIGHT_PATIENCE: Duration = Duration::from_secs(120);
/// How long one attempt may take on a cluster before it counts as failed on its node (a
/// backstop: a killed node's connections are reset at once).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(60);
/// The first wait before the next node; it doubles up to [`WAIT_MAX`].
const WAIT_MIN: Duration = Duration::from_millis(20);
const WAIT_MAX: Duration = Duration::from_millis(250);
/// How long a failover may take before the run says it failed.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a call failed on its node rather than being answered: the node is down or
/// unreachable, has no serving leader to answer or forward to, or the connection broke.
pub(crate) fn failed_on_node(s: &Status) -> bool {
    match s.code() {
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => true,
        // A broken HTTP/2 connection.
        Code::Internal => {
            reason(s).is_empty()
                && (s.message().contains("transport") || s.message().contains("h2"))
        }
        _ => false,
    }
}

/// One call's attempts over the nodes: which node it goes to, and whether a failure is sent
/// on to the next one. `at` is the caller's current node (kept across its calls: a caller
/// stays where calls are answered).
pub(crate) struct Attempts<'a> {
    nodes: usize,
    at: &'a AtomicUsize,
    tally: Option<&'a Tally>,
    give_up_at: Option<Instant>,
    last_failure: Option<Instant>,
    in_flight_until: Option<Instant>,
    wait: Duration,
}

impl<'a> Attempts<'a> {
    /// The attempts of one call over `nodes` nodes, starting at node `at`; failures counted in
    /// `tally` (the fans' calls), if given.
    pub fn new(nodes: usize, at: &'a AtomicUsize, tally: Option<&'a Tally>) -> Attempts<'a> {
        Attempts {
            nodes: nodes.max(1),
            at,
            tally,
            give_up_at: None,
            last_failure: None,
            in_flight_until: None,
            wait: WAIT_MIN,
        }
    }

    /// The node of the next attempt (an index into the caller's nodes).
    pub fn node(&self) -> usize {
        self.at.load(Ordering::Relaxed) % self.nodes
    }

    /// One attempt, bounded to [`ATTEMPT_TIMEOUT`] on a cluster (one server: as is).
    pub async fn attempt<T>(
        &self,
        call: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        if self.nodes < 2 {
            return call.await;
        }
        tokio::time::timeout(ATTEMPT_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(
                    "no answer from this node within 60 s",
                ))
            })
    }

    /// After an attempt that failed with `s`: whether to try again after a backoff (already
    /// waited). Only on a cluster: a failure on the node ([`failed_on_node`]) is tried again on
    /// the next node while the failures have not lasted [`GIVE_UP_AFTER`] in a row (counted
    /// in the tally; an attempt that ran longer than [`NEW_STREAK_AFTER`] before it failed
    /// ends a run);
    /// `IDEMPOTENCY_KEY_IN_FLIGHT` (the request's earlier attempt, cut off from this caller,
    /// still runs on the leader) on the same node, within [`IN_FLIGHT_PATIENCE`], until the
    /// first attempt's answer is replayed.
    pub async fn retry(&mut self, s: &Status) -> bool {
        let in_flight = s.code() == Code::Aborted && reason(s) == "IDEMPOTENCY_KEY_IN_FLIGHT";
        if self.nodes < 2 || !(in_flight || failed_on_node(s)) {
            return false;
        }
        let now = Instant::now();
        if in_flight {
            if now > *self.in_flight_until.get_or_insert(now + IN_FLIGHT_PATIENCE) {
                return false;
            }
            let jitter = rand::rng().random_range(0..=500);
            tokio::time::sleep(Duration::from_millis(500 + jitter)).await;
            return true;
        }
        let first = self.give_up_at.is_none();
        if self
            .last_failure
            .is_none_or(|last| now.duration_since(last) > NEW_STREAK_AFTER)
        {
            self.give_up_at = Some(now + GIVE_UP_AFTER);
            self.wait = WAIT_MIN;
        }
        self.last_failure = Some(now);
        if self.give_up_at.is_some_and(|at| now > at) {
            return false;
        }
        if let Some(t) = self.tally {
            if first {
                t.failover_calls.fetch_add(1, Ordering::Relaxed);
            }
            t.failover_attempts.fetch_add(1, Ordering::Relaxed);
        }
        let _ = self
            .at
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |i| {
                Some((i + 1) % self.nodes)
            });
        let jitter = rand::rng().random_range(0..=self.wait.as_millis() as u64);
        tokio::time::sleep(self.wait + Duration::from_millis(jitter)).await;
        self.wait = (self.wait * 2).min(WAIT_MAX);
        true
    }
}

/// `call` on one of `clients` (one per node), starting at node `at`, sent on to the next node
/// while it fails there ([`Attempts`]); not counted as the fans' calls.
pub(crate) async fn on_any_node<C, T, F, Fut>(
    clients: &[C],
    at: &AtomicUsize,
    mut call: F,
) -> Result<T, Status>
where
    C: Clone,
    F: FnMut(C) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let mut tries = Attempts::new(clients.len(), at, None);
    loop {
        let r = tries.attempt(call(clients[tries.node()].clone())).await;
        match r {
            Err(s) if tries.retry(&s).await => {}
            r => return r,
        }
    }
}

/// The leader's kill: which node, when, and how long until a node led again with its engine
/// serving.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kill {
    /// The node killed.
    pub node: u64,
    /// Seconds after the sale opened.
    pub after_opening_seconds: f64,
    /// From the kill until a live node led its group with its engine serving (`None`: not
    /// within 30 s).
    pub failover: Option<Duration>,
    /// The node that leads after the failover (its `/metrics`), if one said so.
    pub new_leader: Option<u64>,
}

/// The task that kills the leader at its time; aborted if dropped before it is awaited (a run
/// that fails or is interrupted).
pub(crate) struct Killer(tokio::task::JoinHandle<anyhow::Result<Kill>>);

impl Killer {
    /// Kills the leader of `cluster` at `at` (the opening plus `--kill-leader-after`), then
    /// measures the failover.
    pub fn spawn(cluster: Arc<LocalCluster>, opened: Instant, at: Instant) -> Killer {
        Killer(tokio::spawn(async move {
            // The leader is looked up a second early (a scrape of each node can be slow on a
            // loaded machine) and checked again at the kill's time.
            tokio::time::sleep_until(at.checked_sub(Duration::from_secs(1)).unwrap_or(at).into())
                .await;
            let mut leader = cluster.await_leader(Duration::from_secs(10)).await;
            tokio::time::sleep_until(at.into()).await;
            if let Some(l) = leader
                && !cluster.leads(l).await
            {
                leader = cluster.await_leader(Duration::from_secs(10)).await;
            }
            let leader = leader.context("no node said it leads: there was no leader to kill")?;
            let killed_at = Instant::now();
            cluster.kill(leader)?;
            let after = killed_at.saturating_duration_since(opened).as_secs_f64();
            eprintln!(
                "[kill] node {leader}, the leader, killed with SIGKILL {after:.2} s after the opening"
            );
            let failover = cluster
                .await_serving_leader(killed_at, FAILOVER_TIMEOUT)
                .await?;
            let new_leader = cluster.await_leader(Duration::from_secs(5)).await;
            match (failover, new_leader) {
                (Some(f), Some(n)) => eprintln!(
                    "[kill] node {n} leads with its engine serving {} ms after the kill",
                    f.as_millis()
                ),
                (Some(f), None) => eprintln!(
                    "[kill] a node leads with its engine serving {} ms after the kill",
                    f.as_millis()
                ),
                (None, _) => eprintln!(
                    "[kill] no node led with its engine serving within {} s of the kill",
                    FAILOVER_TIMEOUT.as_secs()
                ),
            }
            Ok(Kill {
                node: leader,
                after_opening_seconds: after,
                failover,
                new_leader,
            })
        }))
    }

    /// The kill, once done (waiting for its time if the fans finished first).
    pub async fn finish(mut self) -> anyhow::Result<Kill> {
        (&mut self.0).await.context("the killer task failed")?
    }
}

impl Drop for Killer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A node replaced mid-sale (`--replace-node-after`): which by which, when, and how long the
/// replacement took.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replacement {
    /// The node replaced (a follower).
    pub old: u64,
    /// The node that took its place.
    pub new: u64,
    /// Seconds after the sale opened.
    pub after_opening_seconds: f64,
    /// From the start of the new node until the old one was removed and stopped.
    pub took: Duration,
}

/// The task that replaces a follower at its time; aborted if dropped before it is awaited.
pub(crate) struct Replacer(tokio::task::JoinHandle<anyhow::Result<Replacement>>);

impl Replacer {
    /// Replaces a follower of `cluster` by its spare at `at` (the opening plus
    /// `--replace-node-after`).
    pub fn spawn(cluster: Arc<LocalCluster>, opened: Instant, at: Instant) -> Replacer {
        Replacer(tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let leader = cluster.await_leader(Duration::from_secs(10)).await;
            let old = cluster
                .live()
                .into_iter()
                .rfind(|id| Some(*id) != leader)
                .context("no follower to replace")?;
            let began = Instant::now();
            let after = began.saturating_duration_since(opened).as_secs_f64();
            eprintln!(
                "[replace] node {old}, a follower, is replaced {after:.2} s after the opening"
            );
            let new = cluster.replace(old).await?;
            let took = began.elapsed();
            eprintln!(
                "[replace] node {new} votes in every group and node {old} is gone, {} ms later",
                took.as_millis()
            );
            Ok(Replacement {
                old,
                new,
                after_opening_seconds: after,
                took,
            })
        }))
    }

    /// The replacement, once done (waiting for its time if the fans finished first).
    pub async fn finish(mut self) -> anyhow::Result<Replacement> {
        (&mut self.0).await.context("the replacing task failed")?
    }
}

impl Drop for Replacer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What reading back the acknowledged holds and orders found.
#[derive(Debug, Default)]
pub(crate) struct ReadBack {
    /// Holds read back.
    pub holds: u64,
    /// Orders read back.
    pub orders: u64,
    /// Of them, lost: not found, or a paid hold or an order that reads back otherwise than
    /// it was acknowledged.
    pub lost: u64,
    /// The first loss, described.
    pub first_lost: Option<String>,
    /// Reads that failed for good (neither found nor not found).
    pub failed: u64,
    /// The first of those.
    pub first_failed: Option<String>,
}

/// One read of the read-back.
enum Read {
    /// An acknowledged hold, and whether its order was acknowledged too.
    Hold {
        hold_id: String,
        user_id: String,
        paid: bool,
    },
    /// An acknowledged order.
    Order(AckedOrder),
}

/// What one read found.
enum Found {
    Kept,
    Lost(String),
    Failed(String),
}

/// Reads back every acknowledged hold (`GetHold`) and order (`GetOrder`) through `nodes` (the
/// live nodes' clients), 64 at a time, each read sent on to another node while it fails on
/// one. A hold may have expired, been released or confirmed since (not lost); a hold or order
/// that answers `NOT_FOUND` is lost, and so is a hold paid for (its order acknowledged) that
/// is not `CONFIRMED`, or an order whose hold or number of tickets differs from its answer.
pub(crate) async fn read_back(nodes: Vec<Clients>, acked: Acked) -> ReadBack {
    let nodes = Arc::new(nodes);
    let paid: HashSet<&str> = acked.orders.iter().map(|o| o.hold_id.as_str()).collect();
    let holds: Vec<Read> = acked
        .holds
        .iter()
        .map(|(hold_id, user_id)| Read::Hold {
            paid: paid.contains(hold_id.as_str()),
            hold_id: hold_id.clone(),
            user_id: user_id.clone(),
        })
        .collect();
    let mut out = ReadBack {
        holds: acked.holds.len() as u64,
        orders: acked.orders.len() as u64,
        ..ReadBack::default()
    };
    let mut reads = tokio::task::JoinSet::new();
    let all = holds
        .into_iter()
        .chain(acked.orders.into_iter().map(Read::Order));
    for (i, read) in all.enumerate() {
        let nodes = nodes.clone();
        reads.spawn(async move { read_one(&nodes, &AtomicUsize::new(i), read).await });
        while reads.len() >= 64 {
            if let Some(r) = reads.join_next().await {
                out.note(r);
            }
        }
    }
    while let Some(r) = reads.join_next().await {
        out.note(r);
    }
    out
}

impl ReadBack {
    fn note(&mut self, r: Result<Found, tokio::task::JoinError>) {
        match r.unwrap_or_else(|e| Found::Failed(format!("a read panicked: {e}"))) {
            Found::Kept => {}
            Found::Lost(what) => {
                tracing::error!(%what, "an acknowledged answer was lost");
                self.lost += 1;
                self.first_lost.get_or_insert(what);
            }
            Found::Failed(what) => {
                tracing::warn!(%what, "a read-back failed");
                self.failed += 1;
                self.first_failed.get_or_insert(what);
            }
        }
    }
}

/// Reads one acknowledged hold or order back, starting at node `at`.
async fn read_one(nodes: &[Clients], at: &AtomicUsize, read: Read) -> Found {
    match read {
        Read::Hold {
            hold_id,
            user_id,
            paid,
        } => {
            let req = pb::GetHoldRequest {
                hold_id: hold_id.clone(),
                user_id,
            };
            let r = on_any_node(nodes, at, |mut c: Clients| {
                let req = req.clone();
                async move { c.booking.get_hold(req).await }
            })
            .await;
            match r.map(tonic::Response::into_inner) {
                Ok(h) if paid && h.status != pb::HoldStatus::Confirmed as i32 => {
                    Found::Lost(format!(
                        "hold {hold_id} was paid for (its order acknowledged) but reads back \
                         as {:?}",
                        h.status()
                    ))
                }
                Ok(_) => Found::Kept,
                Err(s) if s.code() == Code::NotFound => {
                    Found::Lost(format!("acknowledged hold {hold_id}: {}", reason(&s)))
                }
                Err(s) => {
                    Found::Failed(format!("GetHold {hold_id}: {:?} {}", s.code(), s.message()))
                }
            }
        }
        Read::Order(order) => read_order(nodes, at, order).await,
    }
}

/// Reads one acknowledged order back, starting at node `at`.
async fn read_order(nodes: &[Clients], at: &AtomicUsize, order: AckedOrder) -> Found {
    let req = pb::GetOrderRequest {
        order_id: order.order_id.clone(),
        user_id: order.user_id.clone(),
    };
    let r = on_any_node(nodes, at, |mut c: Clients| {
        let req = req.clone();
        async move { c.booking.get_order(req).await }
    })
    .await;
    match r.map(tonic::Response::into_inner) {
        Ok(o) if o.hold_id == order.hold_id && o.tickets.len() == order.tickets => Found::Kept,
        Ok(o) => Found::Lost(format!(
            "order {} reads back with hold {} and {} tickets, acknowledged with hold {} \
             and {} tickets",
            order.order_id,
            o.hold_id,
            o.tickets.len(),
            order.hold_id,
            order.tickets
        )),
        Err(s) if s.code() == Code::NotFound => Found::Lost(format!(
            "acknowledged order {}: {}",
            order.order_id,
            reason(&s)
        )),
        Err(s) => Found::Failed(format!(
            "GetOrder {}: {:?} {}",
            order.order_id,
            s.code(),
            s.message()
        )),
    }
}
