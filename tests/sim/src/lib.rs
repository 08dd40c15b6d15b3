//! # boxoffice-sim
//!
//! A deterministic simulation of whole boxoffice nodes: three real servers
//! ([`boxoffice_gateway::server::start`]: gateway, engine, openraft, sweeper) as turmoil hosts
//! on a simulated network and clock, each over a simulated disk; fans driving every public
//! call; faults drawn from the seed; checkers after every run. A seed replays the same run,
//! down to the same trace (and its hash).
//!
//! Layout:
//! - [`node`]: a node is the real server stack as a turmoil host, over its own
//!   [`boxoffice_engine::store::SimKv`] disk and [`clock`], on turmoil's network ([`net`]);
//! - [`fans`]: the workload; [`history`]: every call and its answer;
//! - [`faults`]: what goes wrong, drawn from the seed; the driver here applies it;
//! - [`check`]: the checkers over the history and Raft; [`offline`]: each node's disk read
//!   offline after the run.
//!
//! Every source of nondeterminism goes through a seam: time (tokio's clock, which turmoil
//! drives; [`clock::SimClock`] for wall time), randomness ([`boxoffice_engine::rt`]: ids,
//! jitter, openraft's election timeouts), threads (the log's workers become tasks), storage
//! ([`boxoffice_engine::store::SimKv`]) and the network ([`boxoffice_gateway::net`]).

pub mod check;
pub mod clock;
pub mod committed;
pub mod fans;
pub mod faults;
pub mod history;
pub mod net;
pub mod node;
pub mod offline;
pub mod procs;
pub mod refusals;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::Digest;

use crate::faults::Fault;
use crate::history::{Answer, History, Op, Shared};
use crate::node::{Node, RaftSeen, Setup, host};
use boxoffice_engine::{SeatId, SectionId, Selection};

/// How a run goes (the seed decides the rest).
#[derive(Clone, Debug)]
pub struct Options {
    /// Fans buying.
    pub fans: usize,
    /// How long they buy (virtual ms), after which every fault is healed and they read back.
    pub work_ms: u64,
    /// Whether faults are injected.
    pub faults: bool,
    /// The nodes.
    pub setup: Setup,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            fans: 16,
            work_ms: 12_000,
            faults: true,
            setup: Setup::default(),
        }
    }
}

impl Options {
    /// The options of seed `seed`: every fourth seed runs one node alone (a group of one, whose
    /// disk is the only copy: a power cut there has no follower to fall back on); the others
    /// three.
    pub fn for_seed(seed: u64) -> Options {
        let mut o = Options::default();
        if seed.is_multiple_of(4) {
            o.setup.nodes = 1;
        }
        o
    }
}

/// What a run found. A worker process sends it back without its trace ([`procs`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// Its seed.
    pub seed: u64,
    /// SHA-256 of its trace (every call, fault and finding, in order): the same for the same
    /// seed.
    pub trace_hash: String,
    /// Every broken promise (the first ones found while the run went, when it stopped early).
    pub violations: Vec<String>,
    /// Calls made.
    pub calls: usize,
    /// Calls answered definitely.
    pub answered: usize,
    /// Faults injected (with the driver's restarts).
    pub faults: usize,
    /// Virtual time the run took, ms.
    pub virtual_ms: u64,
    /// The trace itself (empty in a report sent back by a worker process).
    #[serde(skip)]
    pub trace: String,
}

impl Report {
    /// The one-line command that replays this run.
    pub fn replay(&self) -> String {
        format!(
            "BOXOFFICE_SIM_SEED={} cargo test -p boxoffice-sim --test sim -- --nocapture",
            self.seed
        )
    }
}

/// One tick of turmoil's clock.
const TICK: Duration = Duration::from_millis(5);
/// When faults may begin (virtual ms): once the group has formed.
const FAULTS_FROM_MS: u64 = 1_500;
/// How long after the work ends the cluster has to serve every read-back (virtual).
const READ_BACK_MS: u64 = 60_000;

/// Something the driver undoes later.
#[derive(Clone, Debug)]
enum Undo {
    Repair(u64, u64),
    RepairOneWay(u64, u64),
    Release(String, String),
    Start(u64),
    FreeDisk(u64),
    FastDisk(u64),
    Jump(u64, i64),
}

struct Driver {
    nodes: Vec<Node>,
    setup: Setup,
    plan: std::collections::VecDeque<(u64, Fault)>,
    /// Faults timed from the sale's first acknowledged hold ([`faults::in_the_rush`]): `(ms
    /// after it, fault)`, in order.
    rush: std::collections::VecDeque<(u64, Fault)>,
    /// When the sale's first hold was acknowledged.
    sale_began: Option<u64>,
    later: Vec<(u64, Undo)>,
    down: BTreeSet<u64>,
    history: Shared,
    seen: Arc<Mutex<RaftSeen>>,
    /// Restarts of a failed node in a row.
    failures: BTreeMap<u64, u32>,
    /// Virtual ms of the last wipe (one node at a time, with the others caught up).
    wiped_at: Option<u64>,
    /// Nodes whose disk had a bit flipped since it was last wiped.
    flipped: BTreeSet<u64>,
    /// Promises broken that the driver saw itself: a node that refused to start naming damage
    /// although its disk only lost power (a power cut alone is not damage).
    findings: Vec<String>,
    /// Nodes with a power cut armed to land in a sync ([`Fault::CutInSync`]): how long each
    /// stays down once it lands.
    armed: BTreeMap<u64, u64>,
    /// The node whose armed cut cuts every node's power when it lands
    /// ([`Fault::PowerCutAllInLeaderSync`]), with the share of unsynced writes the others keep.
    cut_all_with: Option<(u64, u64)>,
}

impl Driver {
    fn record(&self, now: u64, what: String) {
        history::lock(&self.history).fault(now, what);
    }

    fn node(&self, id: u64) -> &Node {
        &self.nodes[(id - 1) as usize]
    }

    fn ids(&self) -> std::ops::RangeInclusive<u64> {
        1..=self.setup.nodes
    }

    fn stop(&mut self, sim: &mut turmoil::Sim<'_>, id: u64, now: u64) {
        if self.down.insert(id) {
            sim.crash(host(id));
        }
        let mut seen = history_seen(&self.seen);
        seen.now.remove(&id);
        // A node without power leads nothing (it never says so itself).
        seen.lead(id, None, now);
    }

    fn start(&mut self, sim: &mut turmoil::Sim<'_>, id: u64) {
        if self.down.remove(&id) {
            self.node(id).disk.power_on();
            history_seen(&self.seen).failed.remove(&id);
            sim.bounce(host(id));
        }
    }

    /// Whether every node but `id` keeps its data: up, not failed, no bit flipped on its disk,
    /// not wiped in the last 10 s, not catching up after it started without its data (a power
    /// cut in its first sync), and past the group's forming (a wiped or new node counts as
    /// failed until it has caught up; seed 7522 at 2614c48: a node wiped while another caught
    /// up after such a cut left one voter, which no one would vote for). Every committed entry is on a majority, so one of them
    /// has it: a wipe of `id` (or damage to it) then loses nothing.
    fn others_fine(&self, id: u64, now: u64) -> bool {
        let seen = history_seen(&self.seen);
        // (A node alone has no one to catch up from.)
        self.setup.nodes > 1
            && !self.catching_up(now)
            // No link between nodes is down or held: a deposed leader cut off now could
            // commit with the wiped node's acknowledgements.
            && !self.later.iter().any(|(_, u)| {
                matches!(
                    u,
                    Undo::Repair(..) | Undo::RepairOneWay(..) | Undo::Release(..)
                )
            })
            && self.ids().filter(|n| *n != id).all(|n| {
                !self.down.contains(&n)
                    && !seen.failed.contains_key(&n)
                    && !seen.catching_up.contains(&n)
                    && !self.flipped.contains(&n)
                    && seen.now.get(&n).is_some_and(|(_, _, applied)| *applied > 1)
            })
    }

    /// Whether a wiped node may still be catching up (10 s from its wipe). A wiped node lost
    /// its acknowledgements and its vote, so until it has caught up it counts as a failed
    /// node: the promise holds while no other node fails meanwhile (docs/cluster/README.md,
    /// "What happens when things fail"), so no fault is injected in that time.
    fn catching_up(&self, now: u64) -> bool {
        self.wiped_at.is_some_and(|at| now < at + 10_000)
    }

    /// The node that leads now (a node chosen by `now` if none does).
    fn leader_or_any(&self, now: u64) -> u64 {
        history_seen(&self.seen)
            .now
            .iter()
            .find(|(_, (_, leads, _))| *leads)
            .map(|(id, _)| *id)
            .unwrap_or(1 + now % self.setup.nodes)
    }

    fn apply(&mut self, sim: &mut turmoil::Sim<'_>, now: u64, fault: Fault) {
        use Fault::*;
        let named = format!("{fault:?}");
        if self.catching_up(now) {
            self.record(
                now,
                format!("{named}: skipped (a wiped node is catching up)"),
            );
            return;
        }
        match fault {
            Partition { a, b, ms } => {
                sim.partition(host(a), host(b));
                self.later.push((now + ms, Undo::Repair(a, b)));
            }
            OneWay { from, to, ms } => {
                sim.partition_oneway(host(from), host(to));
                self.later.push((now + ms, Undo::RepairOneWay(from, to)));
            }
            Isolate { node, ms } => {
                for other in self.ids().filter(|o| *o != node) {
                    sim.partition(host(node), host(other));
                    self.later.push((now + ms, Undo::Repair(node, other)));
                }
            }
            Delay { a, b, ms } => {
                sim.hold(host(a), host(b));
                self.later.push((now + ms, Undo::Release(host(a), host(b))));
            }
            Crash {
                node,
                down_ms,
                keep,
            } => {
                if self.down.contains(&node) {
                    return;
                }
                self.stop(sim, node, now);
                let disk = &self.node(node).disk;
                disk.crash(disk.unsynced_writes() * keep as usize / 1_000);
                self.later.push((now + down_ms, Undo::Start(node)));
            }
            IsolateLeader { ms } => {
                let node = self.leader_or_any(now);
                self.record(now, format!("{named}: node {node}"));
                return self.apply(sim, now, Isolate { node, ms });
            }
            CrashLeader { down_ms, keep } => {
                let node = self.leader_or_any(now);
                self.record(now, format!("{named}: node {node}"));
                return self.apply(
                    sim,
                    now,
                    Crash {
                        node,
                        down_ms,
                        keep,
                    },
                );
            }
            Flap {
                node,
                down_ms,
                again_ms,
                bytes,
                keep,
            } => {
                if self.down.contains(&node) {
                    return;
                }
                self.apply(
                    sim,
                    now,
                    Crash {
                        node,
                        down_ms,
                        keep,
                    },
                );
                // Armed now, it lands once the node is up again: in its catching up.
                return self.apply(
                    sim,
                    now,
                    CutInSync {
                        node,
                        bytes,
                        within: u64::MAX,
                        sync_ms: node::SYNC_LATENCY.as_millis() as u64,
                        down_ms: again_ms,
                        keep,
                    },
                );
            }
            CutInSync {
                node,
                bytes,
                within,
                sync_ms,
                down_ms,
                keep,
            } => {
                // (A node that is down gets its cut once it is up again.)
                let disk = &self.node(node).disk;
                disk.set_sync_latency(Duration::from_millis(sync_ms));
                disk.cut_in_sync(usize::try_from(bytes).unwrap_or(usize::MAX), within, keep);
                self.armed.insert(node, down_ms);
            }
            PowerCutAllInLeaderSync {
                bytes,
                sync_ms,
                down_ms,
                keep,
            } => {
                let leader = self.leader_or_any(now);
                if self.down.contains(&leader) {
                    return;
                }
                self.record(now, format!("{named}: node {leader}"));
                self.cut_all_with = Some((leader, keep));
                return self.apply(
                    sim,
                    now,
                    CutInSync {
                        node: leader,
                        bytes,
                        within: u64::MAX,
                        sync_ms,
                        down_ms,
                        keep,
                    },
                );
            }
            PowerCutAll { down_ms, keep } => {
                let all: Vec<u64> = self.ids().collect();
                self.cut_power(sim, now, &all, down_ms, keep);
            }
            Wipe { node, down_ms } => {
                if self.down.contains(&node) || !self.others_fine(node, now) {
                    return;
                }
                self.stop(sim, node, now);
                self.node(node).wipe();
                history_seen(&self.seen).votes.remove(&node);
                self.flipped.remove(&node);
                self.wiped_at = Some(now);
                self.later.push((now + down_ms, Undo::Start(node)));
            }
            Pause { node, ms } => {
                for other in self.ids().filter(|o| *o != node) {
                    sim.hold(host(node), host(other));
                    self.later
                        .push((now + ms, Undo::Release(host(node), host(other))));
                }
                sim.hold(host(node), "fans");
                self.later
                    .push((now + ms, Undo::Release(host(node), "fans".into())));
                self.later.push((now + ms, Undo::Jump(node, ms as i64)));
            }
            ClockJump { node, ms } => self.node(node).clock.jump(ms),
            FailSync { node } => self.node(node).disk.fail_next_sync(),
            SlowDisk { node, sync_ms, ms } => {
                self.node(node)
                    .disk
                    .set_sync_latency(Duration::from_millis(sync_ms));
                self.later.push((now + ms, Undo::FastDisk(node)));
            }
            FullDisk { node, ms } => {
                self.node(node).disk.fill_disk();
                self.later.push((now + ms, Undo::FreeDisk(node)));
            }
            BitFlip { node, pick } => {
                if self.down.contains(&node) || !self.others_fine(node, now) {
                    return;
                }
                let flipped = self.node(node).disk.flip_bit(pick, |_| true);
                self.record(now, format!("{named}: {flipped:?}"));
                self.flipped.insert(node);
                history_seen(&self.seen).votes.remove(&node);
                self.stop(sim, node, now);
                self.later.push((now + 300, Undo::Start(node)));
                return;
            }
        }
        self.record(now, named);
    }

    fn undo(&mut self, sim: &mut turmoil::Sim<'_>, now: u64, undo: Undo) {
        self.record(now, format!("undo {undo:?}"));
        match undo {
            Undo::Repair(a, b) => sim.repair(host(a), host(b)),
            Undo::RepairOneWay(a, b) => sim.repair_oneway(host(a), host(b)),
            Undo::Release(a, b) => sim.release(a, b),
            Undo::Start(id) => self.start(sim, id),
            Undo::FreeDisk(id) => self.node(id).disk.free_disk(),
            Undo::FastDisk(id) => self.node(id).disk.set_sync_latency(node::SYNC_LATENCY),
            Undo::Jump(id, ms) => self.node(id).clock.jump(ms),
        }
    }

    /// A node whose Raft stopped (a failed sync, a full disk, damage) is restarted, as its
    /// supervisor would restart `serve`; one that fails three times in a row has its disk
    /// replaced (an operator's wipe), once the others are fine.
    fn restart_failed(&mut self, sim: &mut turmoil::Sim<'_>, now: u64) {
        let failed: Vec<(u64, String)> = history_seen(&self.seen)
            .failed
            .iter()
            .map(|(id, why)| (*id, why.clone()))
            .collect();
        for (id, why) in failed {
            if self.down.contains(&id)
                || self
                    .later
                    .iter()
                    .any(|(_, u)| matches!(u, Undo::Start(n) if *n == id))
            {
                continue;
            }
            // A start refused, or damage named, for anything but a fault the driver put on the
            // disk (a flipped bit, a full disk, a failed write or sync) breaks a promise: a
            // power cut alone is not damage, and every node starts again after one. (A node
            // that starts but finds its copy damaged when it builds a snapshot counts too: a
            // cut in the middle of a snapshot's install leaves that.)
            let disk_fault = ["No space left", "injected", "no power"]
                .iter()
                .any(|w| why.contains(w));
            let refused = why.starts_with("did not start") || why.contains("damage");
            if refused && !disk_fault && !self.flipped.contains(&id) {
                let found = format!(
                    "node {id} failed at {now} ms naming damage or refusing to start, though its disk only lost power: {why}"
                );
                self.record(now, found.clone());
                self.findings.push(found);
            }
            let tries = self.failures.entry(id).or_default();
            *tries += 1;
            let tries = *tries;
            self.stop(sim, id, now);
            if tries >= 3 && self.others_fine(id, now) {
                self.record(
                    now,
                    format!("node {id} failed {tries} times ({why}): the operator wipes it"),
                );
                self.node(id).wipe();
                history_seen(&self.seen).votes.remove(&id);
                self.wiped_at = Some(now);
                self.flipped.remove(&id);
                self.failures.insert(id, 0);
            } else {
                self.record(now, format!("node {id} failed ({why}): restarted"));
            }
            self.later.push((now + 500, Undo::Start(id)));
        }
    }

    /// Nodes `ids` lose power at once: those up stop, to start again `down_ms` later, and each
    /// disk keeps the first `keep` per mille of its unsynced writes.
    fn cut_power(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
        now: u64,
        ids: &[u64],
        down_ms: u64,
        keep: u64,
    ) {
        for &id in ids {
            if !self.down.contains(&id) {
                self.stop(sim, id, now);
                self.later.push((now + down_ms, Undo::Start(id)));
            }
            let disk = &self.node(id).disk;
            disk.crash(disk.unsynced_writes() * keep as usize / 1_000);
        }
    }

    /// Stops each node whose armed power cut landed (its disk is off), to start again later.
    fn cuts_landed(&mut self, sim: &mut turmoil::Sim<'_>, now: u64) {
        let landed: Vec<(u64, u64)> = self
            .armed
            .iter()
            // (A node that is down has its disk off from an earlier cut: its armed cut lands
            // once it is up again.)
            .filter(|(id, _)| !self.down.contains(*id) && self.node(**id).disk.is_off())
            .map(|(id, down)| (*id, *down))
            .collect();
        for (id, down_ms) in landed {
            self.armed.remove(&id);
            self.node(id).disk.set_sync_latency(node::SYNC_LATENCY);
            self.record(now, format!("node {id} lost power during a sync"));
            self.stop(sim, id, now);
            self.later.push((now + down_ms, Undo::Start(id)));
            if let Some((_, keep)) = self.cut_all_with.take_if(|(with, _)| *with == id) {
                self.record(now, "every other node loses power with it".into());
                let others: Vec<u64> = self.ids().filter(|o| *o != id).collect();
                self.cut_power(sim, now, &others, down_ms, keep);
            }
        }
    }

    /// Applies what is due at `now`.
    fn tick(&mut self, sim: &mut turmoil::Sim<'_>, now: u64) {
        self.cuts_landed(sim, now);
        while self.plan.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, f)) = self.plan.pop_front() {
                self.apply(sim, now, f);
            }
        }
        if self.sale_began.is_none() && !self.rush.is_empty() {
            self.sale_began = history::lock(&self.history)
                .calls
                .iter()
                .filter(|c| match &c.answer {
                    Answer::Hold(_) => true,
                    Answer::Batch(items) => items.iter().any(Result::is_ok),
                    _ => false,
                })
                .map(|c| c.completed_ms)
                .min();
        }
        if let Some(began) = self.sale_began {
            while self
                .rush
                .front()
                .is_some_and(|(after, _)| began + *after <= now)
            {
                if let Some((_, f)) = self.rush.pop_front() {
                    self.apply(sim, now, f);
                }
            }
        }
        let mut due = Vec::new();
        self.later.retain(|(at, u)| {
            if *at <= now {
                due.push(u.clone());
                false
            } else {
                true
            }
        });
        for u in due {
            self.undo(sim, now, u);
        }
        self.restart_failed(sim, now);
    }

    /// Ends every fault: links repaired and released, disks freed, every node up.
    fn heal(&mut self, sim: &mut turmoil::Sim<'_>, now: u64) {
        self.plan.clear();
        self.rush.clear();
        self.cuts_landed(sim, now);
        self.cut_all_with = None;
        for (id, _) in std::mem::take(&mut self.armed) {
            self.node(id).disk.disarm_cut();
            self.node(id).disk.set_sync_latency(node::SYNC_LATENCY);
        }
        let pending: Vec<Undo> = self.later.drain(..).map(|(_, u)| u).collect();
        for u in pending {
            self.undo(sim, now, u);
        }
        for a in self.ids() {
            for b in self.ids().filter(|b| *b != a) {
                sim.repair(host(a), host(b));
                sim.release(host(a), host(b));
            }
            sim.release(host(a), "fans");
            self.node(a).disk.free_disk();
        }
        for id in self.ids().collect::<Vec<_>>() {
            self.start(sim, id);
        }
        self.record(now, "healed".into());
    }

    /// Whether the group is whole again: every node up and serving the same applied log.
    fn settled(&self) -> bool {
        let seen = history_seen(&self.seen);
        let applied: BTreeSet<u64> = seen.now.values().map(|(_, _, a)| *a).collect();
        seen.failed.is_empty()
            && seen.now.len() == self.nodes.len()
            && seen.now.values().any(|(_, leads, _)| *leads)
            && applied.len() == 1
    }
}

/// A run's turn: the process's only simulation while it is held, starting at the same place
/// of tokio's task ids as every other run.
///
/// tokio numbers every task it spawns from one counter for the whole process, and a runtime
/// keeps its tasks in lists chosen by that number (four lists for a current-thread runtime,
/// `id & 3`); when a host loses power, turmoil drops its runtime, which shuts its tasks down list
/// by list. The order in which a dead node's connections close, and so which fan hears first,
/// thus hangs on the task ids. Two runs side by side (two threads, or two tests of one binary)
/// take ids from each other at moments that differ from one process to the next, and a run after
/// another starts wherever that one left the counter: a seed gave another trace in a run of many
/// seeds than alone. So runs take turns, and each first spends ids until the next is a multiple
/// of [`TASK_ID_ALIGN`].
fn one_run_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static RUNS: Mutex<()> = Mutex::new(());
    let turn = RUNS.lock().unwrap_or_else(|p| p.into_inner());
    align_task_ids();
    turn
}

/// The task ids a run starts at are a multiple of this: any multiple of tokio's four lists per
/// current-thread runtime.
const TASK_ID_ALIGN: u64 = 64;

/// Spends tokio task ids until the next one spawned is a multiple of [`TASK_ID_ALIGN`].
fn align_task_ids() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("a runtime to align task ids: {e}"));
    // One `block_on` (which may take an id of its own) around all the spawns.
    rt.block_on(async {
        loop {
            let id = tokio::spawn(async { tokio::task::id() })
                .await
                .unwrap_or_else(|e| panic!("a task to read its id: {e}"));
            let id: u64 = id
                .to_string()
                .parse()
                .unwrap_or_else(|e| panic!("tokio's task id {id} is a number: {e}"));
            if (id + 1).is_multiple_of(TASK_ID_ALIGN) {
                return;
            }
        }
    });
}

fn history_seen(seen: &Arc<Mutex<RaftSeen>>) -> std::sync::MutexGuard<'_, RaftSeen> {
    seen.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs the simulation of `seed`: its report. Runs in one process take turns (see
/// [`one_run_at_a_time`]).
pub fn run(seed: u64, options: &Options) -> Report {
    // Declared first, so dropped last: the whole run and its teardown happen inside it.
    let _turn = one_run_at_a_time();
    let _rt = boxoffice_engine::rt::simulate(seed, || clock::EPOCH_MS + clock::elapsed_ms());
    let (log, observing) = committed::watch();
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("a temp dir: {e}"));
    let history: Shared = Arc::new(Mutex::new(History::default()));
    let healed = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(RaftSeen::default()));
    let net = net::TurmoilNet::default();
    if options.faults {
        let (delayed, duplicated) = faults::message_rates(seed);
        net.rates.delayed.store(delayed, Ordering::SeqCst);
        net.rates.duplicated.store(duplicated, Ordering::SeqCst);
    }
    let nodes: Vec<Node> = (1..=options.setup.nodes)
        .map(|i| Node::new(i, root.path(), &net))
        .collect();
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .simulation_duration(Duration::from_millis(options.work_ms + READ_BACK_MS))
        .tick_duration(TICK)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(5))
        // Connections a paused or stalled node has not accepted yet pile up (turmoil panics
        // past its capacity): room for every fan's retries.
        .tcp_capacity(4_096)
        .build();
    for n in &nodes {
        sim.host(host(n.id), n.software(&options.setup, seen.clone()));
    }
    let workload = fans::Workload {
        seed,
        fans: options.fans,
        nodes: options.setup.nodes,
        work_until_ms: options.work_ms,
        healed: healed.clone(),
        history: history.clone(),
    };
    sim.client("fans", fans::run(workload));
    let plan = if options.faults {
        faults::plan(
            seed,
            options.setup.nodes,
            FAULTS_FROM_MS,
            options.work_ms.saturating_sub(500),
        )
    } else {
        Vec::new()
    };
    let mut driver = Driver {
        nodes: nodes.clone(),
        setup: options.setup.clone(),
        plan: plan
            .iter()
            .filter(|(_, f)| !faults::in_the_rush(f))
            .cloned()
            .collect(),
        rush: plan
            .iter()
            .filter(|(_, f)| faults::in_the_rush(f))
            .map(|(at, f)| (at.saturating_sub(FAULTS_FROM_MS), f.clone()))
            .collect(),
        sale_began: None,
        later: Vec::new(),
        down: BTreeSet::new(),
        history: history.clone(),
        seen: seen.clone(),
        failures: BTreeMap::new(),
        wiped_at: None,
        flipped: BTreeSet::new(),
        armed: BTreeMap::new(),
        cut_all_with: None,
        findings: Vec::new(),
    };
    let mut violations: Vec<check::Violation> = Vec::new();
    let mut healed_at = None;
    // The cheap checks (over the history so far) every virtual second: a run that broke a
    // promise stops there, its first violations named with the time they were found.
    let mut next_check = CHECK_EVERY_MS;
    let mut healing_since = None;
    let ms = |sim: &turmoil::Sim<'_>| u64::try_from(sim.elapsed().as_millis()).unwrap_or(u64::MAX);
    loop {
        let now = ms(&sim);
        if now >= options.work_ms && healing_since.is_none() {
            driver.heal(&mut sim, now);
            healing_since = Some(now);
        }
        if healing_since.is_some() {
            // Nothing more is planned; restarts of failed nodes still happen.
            driver.tick(&mut sim, now);
            if healed_at.is_none() {
                let waited = now - healing_since.unwrap_or(now);
                if driver.settled() || waited > 20_000 {
                    if waited > 20_000 {
                        violations.push(check::Violation::new(format!(
                            "the group did not settle within 20 s of healing: {:?}",
                            history_seen(&seen).now
                        )));
                    }
                    healed.store(true, Ordering::SeqCst);
                    healed_at = Some(now);
                }
            }
        } else {
            driver.tick(&mut sim, now);
        }
        if now >= next_check {
            next_check = now + CHECK_EVERY_MS;
            let found = step_checks(&history, &seen, healed_at);
            if !found.is_empty() {
                history::lock(&history).note(&format!("checked at {now} ms: stopped"));
                violations.extend(found);
                break;
            }
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                violations.push(check::Violation::new(format!(
                    "the simulation stopped: {e}"
                )));
                break;
            }
        }
    }
    violations.extend(
        std::mem::take(&mut driver.findings)
            .into_iter()
            .chain(std::mem::take(&mut history_seen(&driver.seen).votes_lost))
            .map(check::Violation::new),
    );
    // Let the group settle (every node applied the same log) before its disks are compared.
    for _ in 0..10_000 {
        if driver.settled() {
            break;
        }
        if sim.step().is_err() {
            break;
        }
    }
    let virtual_ms = ms(&sim);
    drop(sim);

    let h = history::lock(&history);
    if violations.is_empty() {
        violations.extend(check::history(
            &h,
            &history_seen(&seen),
            fans::PER_USER_LIMIT,
            healed_at,
        ));
    }
    if let Some(at) = healed_at {
        violations.extend(check::served_after_healing(&h, at));
    }
    let acked = acknowledged(&h);
    let calls = h.calls.len();
    let answered = h.calls.iter().filter(|c| c.answer.definite()).count();
    let faults = h.faults.len();
    drop(h);
    // (The offline checks open engines of their own: nothing more is the run's to observe.)
    drop(observing);
    let checked_before = violations.is_empty();
    let mut never_made = BTreeSet::new();
    if healed_at.is_some() {
        // (A run stopped early, with its violations, never healed: its nodes' disks are not
        // expected to agree.)
        let (found, never) = offline_checks(
            &nodes,
            &acked,
            clock::EPOCH_MS + virtual_ms,
            &driver.flipped,
        );
        never_made = never;
        violations.extend(found.into_iter().map(check::Violation::new));
    }
    if checked_before {
        // The refusals, once the disks said which holds the fans gave up on were never made,
        // and against the states of the committed log.
        let h = history::lock(&history);
        violations.extend(refusals::check(&h, &never_made));
        violations.extend(committed::check(&h, &log.borrow()));
    }
    let violations: Vec<String> = violations.into_iter().map(|v| v.text).collect();
    let mut h = history::lock(&history);
    for v in &violations {
        h.note(&format!("violation: {v}"));
    }
    let trace = h.trace().to_owned();
    let trace_hash = hex::encode(sha2::Sha256::digest(trace.as_bytes()));
    Report {
        seed,
        trace_hash,
        violations,
        calls,
        answered,
        faults,
        virtual_ms,
        trace,
    }
}

/// How often the cheap checks run while a run goes (virtual ms).
const CHECK_EVERY_MS: u64 = 1_000;

/// The checks over the history so far, and what they found. The refusals wait for
/// the end: a call still running is in no history yet, and it may hold the places a refusal
/// says were taken.
fn step_checks(
    history: &Shared,
    seen: &Arc<Mutex<RaftSeen>>,
    healed_at: Option<u64>,
) -> Vec<check::Violation> {
    let h = history::lock(history);
    let seen = history_seen(seen);
    check::history(&h, &seen, fans::PER_USER_LIMIT, healed_at)
}

/// What the fans were told, for the offline checks.
fn acknowledged(h: &History) -> offline::Acked {
    let mut acked = offline::Acked::default();
    let user = |fan| format!("fan-{fan}");
    for c in &h.calls {
        match (&c.op, &c.answer) {
            (Op::Hold { .. }, Answer::Hold(held)) => {
                acked.holds.push((held.id.clone(), user(c.fan)))
            }
            (Op::Batch { .. }, Answer::Batch(items)) => {
                for held in items.iter().flatten() {
                    acked.holds.push((held.id.clone(), user(c.fan)));
                }
            }
            (Op::Confirm { .. }, Answer::Order(o)) => {
                acked.orders.push((o.id.clone(), o.tickets.clone()))
            }
            (Op::JoinWaitlist { .. }, Answer::Entry(id, ..)) => {
                acked.entries.push((id.clone(), user(c.fan)))
            }
            _ => {}
        }
    }
    acked.holds.sort();
    acked.holds.dedup();
    acked.orders.sort();
    acked.orders.dedup();
    acked.entries.sort();
    acked.entries.dedup();
    // Holds no attempt of which was answered (the fan gave up on them).
    let mut asked: BTreeMap<(String, crate::history::Fan), (String, Selection)> = BTreeMap::new();
    let mut answered: BTreeSet<(String, crate::history::Fan)> = BTreeSet::new();
    for c in &h.calls {
        if let Op::Hold {
            key,
            section,
            seats,
            quantity,
        } = &c.op
        {
            let selection = if seats.is_empty() {
                Selection::BestAvailable {
                    section: (!section.is_empty()).then(|| SectionId::from(section.as_str())),
                    quantity: *quantity,
                }
            } else {
                Selection::Seats(seats.iter().map(|s| SeatId::from(s.as_str())).collect())
            };
            asked.insert((key.clone(), c.fan), (user(c.fan), selection));
            if c.answer.definite() {
                answered.insert((key.clone(), c.fan));
            }
        }
    }
    acked.unanswered = asked
        .into_iter()
        .filter(|(k, _)| !answered.contains(k))
        .map(|((key, _), (user, selection))| (key, user, selection))
        .collect();
    acked
}

/// Every node's disk read offline, and every node's state against the others'.
fn offline_checks(
    nodes: &[Node],
    acked: &offline::Acked,
    now_ms: u64,
    flipped: &BTreeSet<u64>,
) -> (Vec<String>, BTreeSet<String>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return (
                vec![format!("no runtime for the offline checks: {e}")],
                BTreeSet::new(),
            );
        }
    };
    runtime.block_on(async {
        let mut v = Vec::new();
        let mut states = Vec::new();
        let mut made: Vec<BTreeSet<String>> = Vec::new();
        for n in nodes {
            let found =
                offline::check_node(n.id, &n.disk, acked, now_ms, flipped.contains(&n.id)).await;
            v.extend(found.violations);
            if let Some(s) = found.state {
                states.push((n.id, s));
                made.push(found.made);
            }
        }
        // A hold the fan gave up on was never made if no node remembers its key (every node
        // opened: a committed hold is on a majority, with its key, for a day).
        let never: BTreeSet<String> = if made.len() == nodes.len() {
            acked
                .unanswered
                .iter()
                .map(|(key, ..)| key.clone())
                .filter(|key| made.iter().all(|m| !m.contains(key)))
                .collect()
        } else {
            BTreeSet::new()
        };
        for pair in states.windows(2) {
            if pair[0].1 != pair[1].1 {
                v.push(format!(
                    "nodes {} and {} disagree after applying the same log: {:?} / {:?}",
                    pair[0].0, pair[1].0, pair[0].1, pair[1].1
                ));
            }
        }
        (v, never)
    })
}
