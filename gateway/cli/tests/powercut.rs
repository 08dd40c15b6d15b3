//! Power cuts of `boxoffice serve` itself, on the real disk path (issue 24, points 5 and 6):
//! each data dir lives on a [`PowerCutDisk`] (an in-memory FUSE filesystem that keeps, for each
//! file, what `fsync`/`fdatasync` made durable). Fans hold and confirm seats of a reserved
//! section in a burst, each call with an idempotency key (retried on the next node with the same
//! key); mid-burst (after a seeded number of acknowledged calls, the disks slowed by a seeded
//! 0 to 2 ms per write and fsync so that the kill often finds writes not yet synced) every
//! `serve` process is killed with SIGKILL and its disk loses what was not synced
//! (`Cut::DropUnsynced` in even cycles, `Cut::KeepSomeUnsynced` with a seed in odd ones); the
//! servers start again on the same dirs. Then:
//!
//! - every server starts (a power cut alone is not damage: no refusal, no "damaged" in its log)
//!   and stays up;
//! - each key whose answer the cut took (sent, never answered) is sent again: its first answer
//!   if it was durable, a fresh one if not; either way the key is answered from then on;
//! - every acknowledged hold is found by `GetHold` with the same seats (held, or confirmed once
//!   its confirm was answered), and replaying its key gives the same hold (not a new one);
//! - every acknowledged order is confirmed, with the same tickets (ticket ids, seats, and codes:
//!   the same code on one node; on a cluster the code of the node that leads now, whose key
//!   must verify it, and the acknowledged code must still verify with the nodes' keys);
//!   replaying its confirm key gives the same order;
//! - `GetEvent`'s counters match the holds the fans know of (held = live holds, sold = orders,
//!   nothing else), and the seat map shows exactly their seats held and sold: no seat held by a
//!   hold nobody was answered, no seat in two holds.
//!
//! Every cycle checks all the promises of the cycle just cut through every node, and those of
//! earlier cycles again (through one node, and the counters through every node); the end checks
//! everything through every node, stops the servers and checks their dirs offline.
//!
//! - `single_node_power_cut_keeps_every_acknowledged_sale`: one `serve` process.
//!   `BOXOFFICE_POWERCUT_CYCLES` cycles (default 3; 20 with `BOXOFFICE_SLOW=1`).
//! - `coordinated_power_cut_of_a_cluster_loses_nothing_acknowledged`: three `serve` nodes of a
//!   Raft group, each on its own disk, all killed and all cut at once. They replicate over their
//!   peer ports' mutual TLS, and in about every other cycle (seeded) a node is removed from the
//!   group halfway to the cut (`RemoveNode`, a joint-consensus change the cut may interrupt) and
//!   added back after the restart (`AddNode`).
//!   `BOXOFFICE_POWERCUT_CLUSTER_CUTS` cuts (default 3; 50 with `BOXOFFICE_SLOW=1`).
//!
//! - `a_single_node_stops_visibly_on_a_full_disk_or_failed_fsync_and_loses_nothing` and
//!   `a_cluster_node_whose_disk_fails_stops_and_its_group_loses_nothing`: mid-burst, one node's
//!   disk fails: it fills up, then fails every fsync, then has 64 KiB left when an admin makes
//!   an event whose record is over sled's 128 KiB blob threshold, then stalls (every write and
//!   fsync takes an hour; the nodes run with `--disk-stall-seconds 5`); on a cluster the
//!   leader's disk and a follower's in turn, and a follower's fsyncs fail once more. The node
//!   must show it within 60 s while the fans keep calling: a single node halts its store
//!   (`boxoffice_store_halted` 1) and exits 1 on SIGTERM, or exits 1 by itself; a cluster node
//!   exits 1 by itself and the other two go on acknowledging calls; on a stalled disk the node
//!   says `the disk stalled` (its exit ends once the disk is mended: closing its files waits for
//!   the disk). Then the fault is lifted, the node's disk loses
//!   what was not synced (a power cut: a failed sync may have dropped writes), the node starts
//!   again on it without a word of damage, and every promise is checked as after a cut.
//!
//! `BOXOFFICE_POWERCUT_SEED=N` fixes the seed of the cuts, of when they come and of the disks'
//! slowness (printed at the start; failures name it, with the cycle and the cuts). It replays
//! each cut's choices for the same history; the history itself (which calls were in flight at
//! the kill) depends on timing. The offline checks at the end: `boxoffice check-log` and
//! `reconcile` of the single node's dir, `check_copy` of each cluster node's.
//! Every test here skips without FUSE, unless `BOXOFFICE_REQUIRE_FUSE=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boxoffice_client::{Bearer, Clients};
use boxoffice_engine::tiers;
use boxoffice_gateway::tickets::{KeyRing, PublicKey};
use boxoffice_powercut::{Cut, CutReport, PowerCutDisk, fuse_or_skip};
use boxoffice_proto::v1 as pb;
use common::{
    ADMIN, Acked, CLIENT, Layout, Node, Patience, channel, check_copy, free_port, ga_event, layout,
    leader, retrying, retrying_on, until_applied, until_grown,
};

const EVENT: &str = "pc";
const SECTION: &str = "floor";
const SEATS_PER_ROW: u32 = 100;
/// Holds a fan asks for in one cycle (every second one confirmed): far below the per-user limit.
const HOLDS_PER_FAN: usize = 40;
/// How long a server may take to say `ready: serving` after a start.
const READY_WITHIN: Duration = Duration::from_secs(90);
/// The fans' patience: long enough to outlast the cut (their tasks are stopped at the cut).
const FAN_PATIENCE: Patience = Patience {
    per_call: Duration::from_secs(5),
    total: Duration::from_secs(600),
};

/// splitmix64 of `seed` and `n`: the cycles' choices.
fn mix(seed: u64, n: u64) -> u64 {
    let mut z = seed.wrapping_add(n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `BOXOFFICE_POWERCUT_SEED`, or one from the clock.
fn base_seed() -> u64 {
    tiers::number("BOXOFFICE_POWERCUT_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        mix(t.as_nanos() as u64, u64::from(std::process::id()))
    })
}

/// The cut of node `node`'s disk in `cycle`.
fn cut_of(seed: u64, cycle: usize, node: usize) -> Cut {
    if cycle.is_multiple_of(2) {
        Cut::DropUnsynced
    } else {
        Cut::KeepSomeUnsynced {
            seed: mix(seed, (cycle * 8 + node) as u64),
        }
    }
}

/// How long each write and fsync of the disks takes during `cycle`'s burst.
fn disk_delay(seed: u64, cycle: usize) -> Duration {
    Duration::from_micros(mix(seed, 2_000_000 + cycle as u64) % 2_001)
}

/// The node (index) a cluster's `cycle` removes from its group mid-burst, if any (every other
/// cycle on average), and how many acknowledged calls before the cut (0 to 8, or halfway to
/// it): the cut comes during the joint-consensus change, or after it; after the restart the
/// node is added back (`AddNode`).
fn removed_in(seed: u64, cycle: usize) -> Option<(usize, u64)> {
    let m = mix(seed, 3_000_000 + cycle as u64);
    let early = match (m >> 16) % 10 {
        9 => u64::MAX,
        n => n,
    };
    m.is_multiple_of(2)
        .then_some((((m >> 8) % 3) as usize, early))
}

/// Acknowledged calls between the start of a cycle's burst and its cut: 20 to 150.
fn calls_before_cut(seed: u64, cycle: usize) -> u64 {
    20 + mix(seed, 1_000_000 + cycle as u64) % 131
}

/// An answer for good, and where and when it came.
#[derive(Clone, Debug)]
struct Answer<T> {
    value: T,
    /// The node (index) that answered.
    node: usize,
    /// The cycle it was answered in.
    cycle: usize,
    /// Answered to a replay after a cut (its first attempt's answer was lost in the cut).
    after_cut: bool,
}

impl<T> Answer<T> {
    fn origin(&self) -> String {
        format!(
            "answered by node {} in cycle {}{}",
            self.node + 1,
            self.cycle,
            if self.after_cut {
                " (to a replay after the cut)"
            } else {
                ""
            }
        )
    }
}

/// One keyed hold of a fan, and the keyed confirm of it, if one was sent.
#[derive(Clone, Debug)]
struct Keyed {
    req: pb::HoldRequest,
    hold: Option<Answer<pb::Hold>>,
    confirm: Option<(pb::ConfirmRequest, Option<Answer<pb::Order>>)>,
}

impl Keyed {
    fn order(&self) -> Option<&Answer<pb::Order>> {
        self.confirm.as_ref().and_then(|(_, o)| o.as_ref())
    }
}

/// Every key the fans sent, and what went wrong before a cut.
#[derive(Default)]
struct Book {
    keys: Vec<Keyed>,
    errors: Vec<String>,
}

/// One fan of one cycle: holds one seat at a time with idempotency keys, confirming every
/// second hold, each failed call retried on the next node with the same key.
struct Fan {
    w: usize,
    cycle: usize,
    user: String,
    token: String,
    clients: Arc<Vec<Clients>>,
    book: Arc<Mutex<Book>>,
    count: Arc<AtomicU64>,
    retried: Arc<AtomicU64>,
    cut_started: Arc<AtomicBool>,
}

impl Fan {
    async fn run(self) {
        let (w, cycle) = (self.w, self.cycle);
        for i in 0..HOLDS_PER_FAN {
            let req = pb::HoldRequest {
                event_id: EVENT.into(),
                user_id: self.user.clone(),
                admission_token: self.token.clone(),
                idempotency_key: format!("h-{cycle}-{w}-{i}"),
                selection: Some(pb::hold_request::Selection::BestAvailable(
                    pb::BestAvailable {
                        section_id: SECTION.into(),
                        quantity: 1,
                    },
                )),
                access_code: String::new(),
            };
            let idx = {
                let mut book = self.book.lock().unwrap();
                book.keys.push(Keyed {
                    req: req.clone(),
                    hold: None,
                    confirm: None,
                });
                book.keys.len() - 1
            };
            let hold = self
                .call(&req.idempotency_key, w + i, |mut c| {
                    let req = req.clone();
                    async move { c.booking.hold(req).await }
                })
                .await;
            let Some((hold, node)) = hold else { return };
            self.book.lock().unwrap().keys[idx].hold = Some(Answer {
                value: hold.clone(),
                node,
                cycle,
                after_cut: false,
            });
            self.count.fetch_add(1, Ordering::Relaxed);
            if i % 2 == 1 {
                continue;
            }
            let creq = pb::ConfirmRequest {
                hold_id: hold.hold_id.clone(),
                user_id: self.user.clone(),
                payment_token: "tok_visa".into(),
                idempotency_key: format!("c-{cycle}-{w}-{i}"),
            };
            self.book.lock().unwrap().keys[idx].confirm = Some((creq.clone(), None));
            let order = self
                .call(&creq.idempotency_key, w + i + 1, |mut c| {
                    let req = creq.clone();
                    async move { c.booking.confirm(req).await }
                })
                .await;
            let Some((order, node)) = order else { return };
            if let Some((_, answer)) = self.book.lock().unwrap().keys[idx].confirm.as_mut() {
                *answer = Some(Answer {
                    value: order,
                    node,
                    cycle,
                    after_cut: false,
                });
            }
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `call` retried on the next node while it fails transiently; a failure for good before
    /// the cut is recorded (after it, the key is sent again once the servers are back).
    async fn call<T, F, Fut>(&self, key: &str, first: usize, call: F) -> Option<(T, usize)>
    where
        F: FnMut(Clients) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match retrying_on(&self.clients, first, &*self.retried, FAN_PATIENCE, call).await {
            Ok(answer) => Some(answer),
            Err(s) => {
                if !self.cut_started.load(Ordering::SeqCst) {
                    self.book.lock().unwrap().errors.push(format!(
                        "cycle {}: {} (key {key}) failed for good before the cut: {s:?}",
                        self.cycle, self.user
                    ));
                }
                None
            }
        }
    }
}

/// How the servers of a test are started.
enum Kind {
    /// One `serve` process (no cluster).
    Single {
        addr: String,
        metrics: String,
        dir: PathBuf,
        log: PathBuf,
    },
    /// Three nodes of a Raft group ([`Layout`]; their stderr in `node{id}.log` of its logs).
    Cluster(Layout),
}

/// The servers under test, their disks, and the fans' clients. The nodes are dropped (killed)
/// before the disks (unmounted).
struct Rig {
    name: &'static str,
    nodes: Vec<Node>,
    disks: Vec<PowerCutDisk>,
    kind: Kind,
    /// Each node's stderr: the file, and how much of it the checks have read.
    logs: Vec<(PathBuf, u64)>,
    clients: Arc<Vec<Clients>>,
    admin: Vec<Clients>,
    seed: u64,
    /// Every key sent, with its answers.
    book: Arc<Mutex<Book>>,
    retried: Arc<AtomicU64>,
    /// Where the disks are mounted and the logs kept: removed last (kept if the test fails).
    tmp: Option<tempfile::TempDir>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(tmp) = self.tmp.take()
        {
            eprintln!(
                "{}: the nodes' logs are kept in {}/logs",
                self.name,
                tmp.keep().display()
            );
        }
    }
}

impl Rig {
    /// Mounts one disk per node under a new temporary dir and starts the nodes on them.
    fn new(name: &'static str, nodes: usize, seed: u64) -> Rig {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let logs_dir = root.join("logs");
        std::fs::create_dir_all(&logs_dir).unwrap();
        let (kind, addrs, dirs, logs) = if nodes == 1 {
            let dir = root.join("data");
            let log = logs_dir.join("node1.log");
            let addr = format!("127.0.0.1:{}", free_port());
            let metrics = format!("127.0.0.1:{}", free_port());
            (
                Kind::Single {
                    addr: addr.clone(),
                    metrics,
                    dir: dir.clone(),
                    log: log.clone(),
                },
                vec![addr],
                vec![dir],
                vec![log],
            )
        } else {
            let mut lay = layout(root);
            lay.logs = Some(logs_dir.clone());
            lay.env
                .push(("BOXOFFICE_DISK_STALL_SECONDS".into(), STALL_SECONDS.into()));
            // The nodes replicate over their peer ports' mutual TLS.
            lay.on_peer_tls(&root.join("certs"));
            let logs = (1..=3)
                .map(|i| logs_dir.join(format!("node{i}.log")))
                .collect();
            let (addrs, dirs) = (lay.addrs.clone(), lay.dirs.clone());
            (Kind::Cluster(lay), addrs, dirs, logs)
        };
        let disks = dirs
            .iter()
            .map(|d| {
                std::fs::create_dir_all(d).unwrap();
                PowerCutDisk::mount(d).unwrap_or_else(|e| panic!("mounting {}: {e}", d.display()))
            })
            .collect();
        let client = Bearer::new(CLIENT).unwrap();
        let admin = Bearer::new(ADMIN).unwrap();
        let mut rig = Rig {
            name,
            nodes: Vec::new(),
            disks,
            kind,
            logs: logs.into_iter().map(|l| (l, 0)).collect(),
            clients: Arc::new(
                addrs
                    .iter()
                    .map(|a| Clients::new(&channel(a), &client))
                    .collect(),
            ),
            admin: addrs
                .iter()
                .map(|a| Clients::new(&channel(a), &admin))
                .collect(),
            seed,
            book: Arc::default(),
            retried: Arc::default(),
            tmp: Some(tmp),
        };
        rig.nodes = (0..nodes).map(|i| rig.start(i)).collect();
        if let Err(e) = rig.all_ready() {
            panic!("{name}: the first start failed: {e}");
        }
        rig
    }

    fn start(&self, i: usize) -> Node {
        match &self.kind {
            Kind::Cluster(lay) => lay.start(i),
            Kind::Single {
                addr,
                metrics,
                dir,
                log,
            } => {
                let stderr = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)
                    .unwrap();
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_boxoffice"));
                cmd.args(["serve", "--listen", addr, "--metrics-listen", metrics])
                    .arg("--data-dir")
                    .arg(dir)
                    .args(["--admin-key", ADMIN, "--client-key", CLIENT])
                    .args(["--token-secret", "powercut-test-token-secret"])
                    .args(["--disk-stall-seconds", STALL_SECONDS])
                    .env("RUST_LOG", "warn")
                    .stderr(Stdio::from(stderr));
                Node::spawn(1, metrics, &mut cmd)
            }
        }
    }

    fn dirs(&self) -> Vec<PathBuf> {
        self.disks.iter().map(|d| d.path().to_owned()).collect()
    }

    /// What node `i` wrote to its stderr since the checks last read it.
    fn new_log(&mut self, i: usize) -> String {
        let (path, read) = &mut self.logs[i];
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(path) {
            f.seek(SeekFrom::Start(*read)).unwrap();
            f.read_to_string(&mut text).unwrap();
            *read += text.len() as u64;
        }
        text
    }

    /// Waits until every node says it serves; `Err` names each that did not, with its log.
    fn all_ready(&mut self) -> Result<(), String> {
        let mut failed = Vec::new();
        for i in 0..self.nodes.len() {
            if let Err(e) = self.nodes[i].ready_or_exit(READY_WITHIN) {
                let log = self.new_log(i);
                failed.push(format!("{e}; its stderr:\n{}", tail(&log, 40)));
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("\n"))
        }
    }

    /// Every node still runs, and none wrote of damage or of leaving its group since the last
    /// look (a leader's failed try to open its engine, retried, is not counted).
    fn all_well(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        for i in 0..self.nodes.len() {
            let exited = self.nodes[i].exited();
            let log = self.new_log(i);
            let bad: Vec<&str> = log
                .lines()
                .filter(|l| {
                    let l = l.to_ascii_lowercase();
                    l.contains("damage") || l.contains("left its") || l.contains("leaves the")
                })
                .collect();
            if let Some(status) = exited {
                problems.push(format!(
                    "node {} exited ({status}); its stderr:\n{}",
                    i + 1,
                    tail(&log, 40)
                ));
            } else if !bad.is_empty() {
                problems.push(format!("node {} logged: {bad:#?}", i + 1));
            }
        }
        problems
    }

    /// Makes the event (through the first node, forwarded to the leader on a cluster), with a
    /// row of seats for every hold the fans may ask for.
    async fn create_event(&self, holds: usize) {
        let rows = holds.div_ceil(SEATS_PER_ROW as usize).clamp(1, 1_000) as u32;
        let req = pb::CreateEventRequest {
            event_id: EVENT.into(),
            name: "power cuts".into(),
            sections: vec![pb::SectionSpec {
                section_id: SECTION.into(),
                name: "Floor".into(),
                price_cents: 100,
                layout: Some(pb::section_spec::Layout::Reserved(pb::ReservedLayout {
                    rows: (0..rows)
                        .map(|r| pb::RowSpec {
                            label: format!("R{r}"),
                            seat_count: SEATS_PER_ROW,
                        })
                        .collect(),
                })),
                price_tiers: Vec::new(),
            }],
            hold_ttl_seconds: 86_400,
            per_user_limit: 100,
            admit_rate_per_second: 100_000,
            admission_window_seconds: 86_400,
            idempotency_key: "powercut-event".into(),
            ..Default::default()
        };
        retrying(&self.admin, 0, &*self.retried, |mut c| {
            let req = req.clone();
            async move { c.events.create_event(req).await }
        })
        .await
        .unwrap_or_else(|s| panic!("{}: CreateEvent: {s:?}", self.name));
    }

    /// Admits `users` to the event: their admission tokens.
    async fn admit(&self, users: &[String]) -> Vec<String> {
        let mut tokens = Vec::new();
        for (i, user) in users.iter().enumerate() {
            let join = pb::JoinRequest {
                event_id: EVENT.into(),
                user_id: user.clone(),
                session_id: "s".into(),
                ..Default::default()
            };
            let ticket = retrying(&self.clients, i, &*self.retried, |mut c| {
                let req = join.clone();
                async move { c.room.join(req).await }
            })
            .await
            .unwrap_or_else(|s| panic!("{}: {user} joins: {s:?}", self.name));
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let req = pb::GetStatusRequest {
                    queue_token: ticket.queue_token.clone(),
                };
                let s = retrying(&self.clients, i, &*self.retried, |mut c| {
                    let req = req.clone();
                    async move { c.room.get_status(req).await }
                })
                .await
                .unwrap_or_else(|s| panic!("{}: {user}'s standing: {s:?}", self.name));
                if s.state == pb::QueueState::Admitted as i32 {
                    tokens.push(s.admission_token);
                    break;
                }
                assert!(Instant::now() < deadline, "{user} not admitted: {s:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        tokens
    }

    /// Admits `fans` fans of `cycle` and sets them going.
    async fn burst(&self, cycle: usize, fans: usize) -> Burst {
        let users: Vec<String> = (0..fans).map(|w| format!("c{cycle}-fan{w}")).collect();
        let tokens = self.admit(&users).await;
        let count = Arc::new(AtomicU64::new(0));
        let cut_started = Arc::new(AtomicBool::new(false));
        let load = users
            .into_iter()
            .zip(tokens)
            .enumerate()
            .map(|(w, (user, token))| {
                tokio::spawn(
                    Fan {
                        w,
                        cycle,
                        user,
                        token,
                        clients: self.clients.clone(),
                        book: self.book.clone(),
                        count: count.clone(),
                        retried: self.retried.clone(),
                        cut_started: cut_started.clone(),
                    }
                    .run(),
                )
            })
            .collect();
        Burst {
            load,
            count,
            cut_started,
        }
    }

    /// One cycle: a burst of `fans` fans, every node killed with SIGKILL after
    /// [`calls_before_cut`] acknowledged calls, every disk cut, every node started again;
    /// the answers the cut took are asked for again; everything is checked. Returns what was
    /// acknowledged before the cut and what each disk's cut did.
    async fn cycle(&mut self, cycle: usize, fans: usize) -> (u64, Vec<CutReport>) {
        // Slow disks during the burst: the kill more often finds writes not synced yet.
        let delay = disk_delay(self.seed, cycle);
        for d in &self.disks {
            d.set_op_delay(delay);
        }
        let Burst {
            load,
            count,
            cut_started,
        } = self.burst(cycle, fans).await;
        let before_cut = calls_before_cut(self.seed, cycle);
        let removed = match &self.kind {
            Kind::Cluster(_) => removed_in(self.seed, cycle),
            Kind::Single { .. } => None,
        };
        let burst = async {
            let mut removal = None;
            let mut first = before_cut;
            if let Some((x, early)) = removed {
                // Shortly before the cut (or halfway to it), node x is removed from the group,
                // through another node.
                first = before_cut.saturating_sub(early.min(before_cut / 2));
                until_grown(&count, first).await;
                let members = self.members((x + 1) % 3);
                removal = Some(tokio::spawn(async move {
                    let mut m = members;
                    let _ = m
                        .remove_node(pb::RemoveNodeRequest {
                            node_id: x as u64 + 1,
                        })
                        .await;
                }));
            }
            until_grown(&count, before_cut - first).await;
            removal
        };
        let burst = Caught(Box::pin(burst)).await;
        if let Ok(Some(removal)) = &burst {
            // The power cut takes the call too, wherever it was.
            removal.abort();
        }
        if let Err(why) = burst {
            let mut problems = vec![why];
            problems.append(&mut self.book.lock().unwrap().errors);
            problems.extend(self.all_well());
            fail_if_any(&format!("{}: the burst", self.context(cycle)), &problems);
        }
        // The power goes: every process at once, then every disk.
        cut_started.store(true, Ordering::SeqCst);
        for n in &mut self.nodes {
            if let Some(c) = n.child.as_mut() {
                let _ = c.kill();
            }
        }
        for n in &mut self.nodes {
            n.kill9();
        }
        let acked = count.load(Ordering::Relaxed);
        stop_fans(load).await;
        let reports: Vec<CutReport> = self
            .disks
            .iter()
            .enumerate()
            .map(|(i, d)| {
                d.set_op_delay(Duration::ZERO);
                let cut = cut_of(self.seed, cycle, i);
                d.power_cut(cut)
                    .unwrap_or_else(|e| panic!("{}: cycle {cycle}: {cut:?}: {e}", self.name))
            })
            .collect();
        let ctx = format!(
            "{}; the cuts did (node 1 first): {:?}",
            self.context(cycle),
            reports.iter().map(describe_cut).collect::<Vec<_>>()
        );
        self.nodes = (0..self.nodes.len()).map(|i| self.start(i)).collect();
        if let Some((x, _)) = removed {
            // The others serve; node x, if its removal committed, waits to be reached: it is
            // added back (an AddNode of a node that still votes changes nothing).
            let seen = self.add_back(x, &ctx).await;
            println!(
                "{}: cycle {cycle}: node {} was removed shortly before the cut; after it: \
                 {seen}; added back",
                self.name,
                x + 1
            );
        }
        if let Err(e) = self.all_ready() {
            panic!("{ctx}: a node did not start again after the cut: {e}");
        }
        if matches!(self.kind, Kind::Cluster(_)) {
            let all: Vec<usize> = (0..self.nodes.len()).collect();
            let settled = Caught(Box::pin(async {
                leader(&self.nodes).await;
                until_applied(&self.nodes, &all).await;
            }))
            .await;
            if let Err(why) = settled {
                let mut problems = vec![why];
                problems.extend(self.all_well());
                for i in 0..self.nodes.len() {
                    let log = self.new_log(i);
                    problems.push(format!("node {}'s stderr:\n{}", i + 1, tail(&log, 20)));
                }
                fail_if_any(&format!("{ctx}: after the restart"), &problems);
            }
        }
        let mut problems = std::mem::take(&mut self.book.lock().unwrap().errors);
        problems.extend(self.resolve(cycle).await);
        problems.extend(self.check(cycle, false).await);
        problems.extend(self.all_well());
        fail_if_any(&ctx, &problems);
        (acked, reports)
    }

    /// The cluster service of node `i`, with the admin key.
    fn members(
        &self,
        i: usize,
    ) -> pb::cluster_service_client::ClusterServiceClient<boxoffice_client::Authed> {
        let Kind::Cluster(lay) = &self.kind else {
            panic!("a single node has no members");
        };
        pb::cluster_service_client::ClusterServiceClient::with_interceptor(
            channel(&lay.addrs[i]),
            Bearer::new(ADMIN).unwrap(),
        )
    }

    /// Adds node `x` back to the group after a cut that may have taken its removal, through
    /// another node, retrying while the group elects; panics (with `ctx`) if it cannot. What
    /// the group's membership was after the restart, as that node saw it.
    async fn add_back(&mut self, x: usize, ctx: &str) -> String {
        let Kind::Cluster(lay) = &self.kind else {
            return String::new();
        };
        let address = lay
            .peers
            .split(',')
            .find_map(|p| p.strip_prefix(&format!("{}=", x + 1)))
            .unwrap()
            .to_owned();
        let members = self.members((x + 1) % 3);
        let seen = Caught(Box::pin(common::patiently(|| {
            let mut m = members.clone();
            async move { m.get_cluster_status(pb::GetClusterStatusRequest {}).await }
        })))
        .await
        .map(|s| {
            let g = &s.groups[0];
            format!("voters {:?}, learners {:?}", g.voters, g.learners)
        })
        .unwrap_or_else(|e| format!("unknown ({e})"));
        let added = Caught(Box::pin(common::patiently(|| {
            let mut m = members.clone();
            let req = pb::AddNodeRequest {
                node_id: x as u64 + 1,
                address: address.clone(),
            };
            async move { m.add_node(req).await }
        })))
        .await;
        if let Err(why) = added {
            let mut problems = vec![format!("adding node {} back: {why}", x + 1)];
            problems.extend(self.all_well());
            fail_if_any(ctx, &problems);
        }
        seen
    }

    /// Names a cycle in failures: the test, the cycle, each disk's cut, the seed.
    fn context(&self, cycle: usize) -> String {
        let cuts: Vec<Cut> = (0..self.disks.len())
            .map(|i| cut_of(self.seed, cycle, i))
            .collect();
        format!(
            "{}: cycle {cycle}, cuts (node 1 first) {cuts:?}, BOXOFFICE_POWERCUT_SEED={}",
            self.name, self.seed
        )
    }

    /// Sends again every key the cut left unanswered (the hold, else the confirm), on the nodes
    /// in turn: the key's first answer if it was durable, else a fresh one. Returns failures.
    async fn resolve(&self, cycle: usize) -> Vec<String> {
        let pending: Vec<(usize, Keyed)> = self
            .book
            .lock()
            .unwrap()
            .keys
            .iter()
            .enumerate()
            .filter(|(_, k)| {
                k.hold.is_none() || k.confirm.as_ref().is_some_and(|(_, o)| o.is_none())
            })
            .map(|(i, k)| (i, k.clone()))
            .collect();
        let mut problems = Vec::new();
        for (idx, k) in pending {
            if k.hold.is_none() {
                let req = k.req.clone();
                match retrying_on(
                    &self.clients,
                    idx,
                    &*self.retried,
                    Patience::CLUSTER,
                    |mut c| {
                        let req = req.clone();
                        async move { c.booking.hold(req).await }
                    },
                )
                .await
                {
                    Ok((hold, node)) => {
                        self.book.lock().unwrap().keys[idx].hold = Some(Answer {
                            value: hold,
                            node,
                            cycle,
                            after_cut: true,
                        });
                    }
                    Err(s) => problems.push(format!(
                        "hold key {} of {}, unanswered at the cut, sent again: {}",
                        req.idempotency_key,
                        req.user_id,
                        said(&s)
                    )),
                }
            } else if let Some((creq, None)) = &k.confirm {
                match retrying_on(
                    &self.clients,
                    idx,
                    &*self.retried,
                    Patience::CLUSTER,
                    |mut c| {
                        let req = creq.clone();
                        async move { c.booking.confirm(req).await }
                    },
                )
                .await
                {
                    Ok((order, node)) => {
                        if let Some((_, answer)) =
                            self.book.lock().unwrap().keys[idx].confirm.as_mut()
                        {
                            *answer = Some(Answer {
                                value: order,
                                node,
                                cycle,
                                after_cut: true,
                            });
                        }
                    }
                    Err(s) => problems.push(format!(
                        "confirm key {} of {} (hold {}), unanswered at the cut, sent again: \
                         {}",
                        creq.idempotency_key,
                        creq.user_id,
                        creq.hold_id,
                        said(&s)
                    )),
                }
            }
        }
        problems
    }

    /// The ticket keys of every node's dir (a cluster's nodes each sign with their own).
    fn ticket_keys(&self) -> Vec<PublicKey> {
        self.dirs()
            .iter()
            .flat_map(|d| {
                KeyRing::load(d)
                    .map(|r| r.keys().to_vec())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Checks the promises: those of `cycle` (all of them if `all`) through every node with
    /// their keys replayed, the earlier ones through one node (in turn), the counters and the
    /// seat map through every node. Returns what is wrong.
    async fn check(&self, cycle: usize, all: bool) -> Vec<String> {
        let keys = self.book.lock().unwrap().keys.clone();
        let (recent, older): (Vec<Keyed>, Vec<Keyed>) = keys
            .iter()
            .cloned()
            .partition(|k| all || k.hold.as_ref().is_some_and(|h| h.cycle == cycle));
        let every: Vec<usize> = (0..self.nodes.len()).collect();
        let rings = Arc::new(self.ticket_keys());
        let mut problems = check_promises(&self.clients, &every, recent, true, &rings).await;
        let one = [cycle % self.nodes.len()];
        problems.extend(check_promises(&self.clients, &one, older, false, &rings).await);
        problems.extend(check_books(&keys));
        for n in every {
            problems.extend(check_counters(&self.clients[n], n, &keys).await);
        }
        problems
    }

    /// What the fans were answered, as the offline check takes it.
    fn acked(&self) -> Acked {
        let mut acked = Acked::default();
        for k in &self.book.lock().unwrap().keys {
            if let Some(h) = &k.hold {
                acked
                    .holds
                    .push((h.value.hold_id.clone(), k.req.user_id.clone()));
                if let Some(o) = k.order() {
                    acked.orders.push((
                        o.value.order_id.clone(),
                        h.value.hold_id.clone(),
                        k.req.user_id.clone(),
                    ));
                }
            }
        }
        acked
    }

    /// Totals: holds and orders acknowledged, and of them those learned by a replay after a
    /// cut.
    fn totals(&self) -> (usize, usize, usize, usize) {
        let book = self.book.lock().unwrap();
        let holds: Vec<_> = book.keys.iter().filter_map(|k| k.hold.as_ref()).collect();
        let orders: Vec<_> = book.keys.iter().filter_map(|k| k.order()).collect();
        (
            holds.len(),
            orders.len(),
            holds.iter().filter(|h| h.after_cut).count(),
            orders.iter().filter(|o| o.after_cut).count(),
        )
    }
}

/// A burst of fans under way (see [`Rig::burst`]).
struct Burst {
    load: Vec<tokio::task::JoinHandle<()>>,
    /// Calls acknowledged so far.
    count: Arc<AtomicU64>,
    /// Set once failures are expected: a fan's call that fails for good after it is not a
    /// problem (its key is sent again later).
    cut_started: Arc<AtomicBool>,
}

/// Stops the fans' tasks (a panic in one is the test's).
async fn stop_fans(load: Vec<tokio::task::JoinHandle<()>>) {
    for t in &load {
        t.abort();
    }
    for t in load {
        if let Err(e) = t.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// A fault of one node's disk while it serves.
#[derive(Clone, Copy, Debug)]
enum DiskFault {
    /// The disk is full: a write that would grow a file answers `ENOSPC`.
    Full,
    /// Every `fsync` and `fdatasync` answers `EIO` and makes nothing durable.
    FsyncFails,
    /// The disk has 64 KiB left when an admin makes an event of 4,000 access codes: its
    /// record (over 128 KiB) is too large for sled's log and goes to a file of its own under
    /// `blobs/`, which finds the disk full (sled 0.34 never flushes again after that).
    FullAtALargeWrite,
    /// Every write and fsync takes an hour: the disk stalls (the nodes run with
    /// `--disk-stall-seconds` [`STALL_SECONDS`]).
    Stalled,
}

/// The nodes' `--disk-stall-seconds`.
const STALL_SECONDS: &str = "5";

impl DiskFault {
    fn set(self, disk: &PowerCutDisk, on: bool) {
        match self {
            DiskFault::Full => {
                // Full from now on: no file may grow past what the disk holds now.
                let used = on.then(|| disk.stats().used_bytes);
                disk.set_capacity(used);
            }
            DiskFault::FullAtALargeWrite => {
                let left = on.then(|| disk.stats().used_bytes + 64 * 1024);
                disk.set_capacity(left);
            }
            DiskFault::FsyncFails => disk.set_fsync_fails(on),
            DiskFault::Stalled => disk.set_op_delay(if on {
                Duration::from_secs(3600)
            } else {
                Duration::ZERO
            }),
        }
    }
}

/// An event whose record is over 128 KiB (a request just under the 256 KiB limit): 4,000
/// presale access codes.
fn large_event(cycle: usize) -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        presale_section_ids: vec!["ga".into()],
        access_codes: (0..4_000)
            .map(|i| pb::AccessCode {
                code: format!("LARGE-{cycle}-{i:06}-0123456789abcdef0123456789"),
                max_uses: 4,
                ..Default::default()
            })
            .collect(),
        idempotency_key: format!("large-event-{cycle}"),
        ..ga_event(&format!("large-{cycle}"), 1_000)
    }
}

/// The files under a `blobs/` directory below `dir` (sled's large values) shorter than sled
/// writes one (128 KiB): a large value whose write found the disk full.
fn short_blobs(dir: &std::path::Path) -> Vec<(PathBuf, u64)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let (path, Ok(meta)) = (e.path(), e.metadata()) else {
            continue;
        };
        if meta.is_dir() {
            found.extend(short_blobs(&path));
        } else if meta.len() < 128 * 1024 && path.parent().is_some_and(|p| p.ends_with("blobs")) {
            found.push((path, meta.len()));
        }
    }
    found
}

/// How long a node whose disk failed may take to show it (its store halted, or its process
/// gone), while fans keep calling.
const FAULT_SHOWN_WITHIN: Duration = Duration::from_secs(60);

impl Rig {
    /// One cycle with a disk fault: a burst of `fans` fans; after [`calls_before_cut`]
    /// acknowledged calls node `x`'s disk develops `fault`. Node `x` must stop visibly within
    /// [`FAULT_SHOWN_WITHIN`]: a single node halts its store (`boxoffice_store_halted` 1) and
    /// exits non-zero on SIGTERM; a cluster node exits non-zero by itself, and the others go
    /// on acknowledging the fans' calls. Then the fault is lifted, node `x`'s disk loses what
    /// it did not sync (a power cut: a failed sync may have dropped writes), node `x` starts
    /// again on it without a word of damage, and every promise is checked as after a cut.
    /// Returns what happened, for the test's output.
    async fn fault_cycle(
        &mut self,
        cycle: usize,
        fans: usize,
        x: usize,
        fault: DiskFault,
    ) -> String {
        let ctx = format!(
            "{}: cycle {cycle}, {fault:?} on node {}, BOXOFFICE_POWERCUT_SEED={}",
            self.name,
            x + 1,
            self.seed
        );
        let burst = self.burst(cycle, fans).await;
        let before = calls_before_cut(self.seed, cycle);
        if let Err(why) = Caught(Box::pin(until_grown(&burst.count, before))).await {
            let mut problems = vec![why];
            problems.append(&mut self.book.lock().unwrap().errors);
            fail_if_any(&format!("{ctx}: the burst"), &problems);
        }
        let at_fault = burst.count.load(Ordering::Relaxed);
        burst.cut_started.store(true, Ordering::SeqCst);
        fault.set(&self.disks[x], true);
        let faulted = Instant::now();
        let large = matches!(fault, DiskFault::FullAtALargeWrite).then(|| {
            let mut admin = self.admin[x].clone();
            tokio::spawn(async move { admin.events.create_event(large_event(cycle)).await })
        });
        let cluster = matches!(self.kind, Kind::Cluster(_));
        let stalled = matches!(fault, DiskFault::Stalled);
        let shown = loop {
            if let Some(status) = self.nodes[x].exited() {
                break format!("exited ({status})");
            }
            if stalled
                && std::fs::read_to_string(&self.logs[x].0)
                    .is_ok_and(|log| log[self.logs[x].1 as usize..].contains("the disk stalled"))
            {
                break "said the disk stalled and exits".to_owned();
            }
            if !cluster && self.nodes[x].metric("boxoffice_store_halted").await == Some(1.0) {
                break "halted its store".to_owned();
            }
            if faulted.elapsed() > FAULT_SHOWN_WITHIN {
                let log = self.new_log(x);
                panic!(
                    "{ctx}: node {} neither halted its store nor exited within \
                     {FAULT_SHOWN_WITHIN:?} of the fault (calls acknowledged: {} at the fault, \
                     {} now); its stderr:\n{}",
                    x + 1,
                    at_fault,
                    burst.count.load(Ordering::Relaxed),
                    tail(&log, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let took = faulted.elapsed();
        if stalled {
            // Its exit closes files on the stalled disk, which waits for the disk: mend it, and
            // the exit ends.
            fault.set(&self.disks[x], false);
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.nodes[x].exited().is_none() {
                assert!(
                    Instant::now() < deadline,
                    "{ctx}: node {} said the disk stalled but did not exit",
                    x + 1
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let mut said = format!("node {} {shown} {took:?} after the fault", x + 1);
        if cluster {
            // The others go on: more calls are acknowledged without node x.
            let more = Caught(Box::pin(until_grown(&burst.count, 20))).await;
            if let Err(why) = more {
                fail_if_any(
                    &format!("{ctx}: the group after node {}'s stop", x + 1),
                    &[why],
                );
            }
            let status = self.nodes[x].exited().expect("exited above");
            let log = self.new_log(x);
            assert_eq!(
                status.code(),
                Some(1),
                "{ctx}: node {} exited with {status}, not 1 (an error while running); its \
                 stderr:\n{}",
                x + 1,
                tail(&log, 40)
            );
            said.push_str(&log_errors(&log));
        } else if let Some(status) = self.nodes[x].exited() {
            // It ended itself (a stalled disk).
            let log = self.new_log(x);
            assert_eq!(
                status.code(),
                Some(1),
                "{ctx}: node 1 exited with {status}, not 1; its stderr:\n{}",
                tail(&log, 40)
            );
            said.push_str(&log_errors(&log));
        } else {
            let child = self.nodes[x].child.take().expect("a running node");
            let asked = Instant::now();
            let status = stop_within(child, Duration::from_secs(60));
            let exit_took = asked.elapsed();
            let log = self.new_log(x);
            assert_eq!(
                status.code(),
                Some(1),
                "{ctx}: the halted node's SIGTERM ended with {status}, not 1 (an error while \
                 running: the store's failure); its stderr:\n{}",
                tail(&log, 40)
            );
            said.push_str(&format!(
                "; on SIGTERM it exited ({status}) {exit_took:?} later"
            ));
            said.push_str(&log_errors(&log));
        }
        let acked = burst.count.load(Ordering::Relaxed);
        stop_fans(burst.load).await;
        if let Some(large) = large {
            // The large event is refused, and its record's write is what found the disk full.
            let refused = large
                .await
                .unwrap()
                .expect_err("the large event made on a full disk");
            let blobs = short_blobs(self.disks[x].path());
            said.push_str(&format!(
                "; the large event: {}; blob files cut short: {blobs:?}",
                self::said(&refused)
            ));
        }
        said.push_str(&format!(
            "; {at_fault} calls acknowledged before the fault, {acked} in all"
        ));
        fault.set(&self.disks[x], false);
        self.nodes[x].kill9();
        let cut = self.disks[x]
            .power_cut(Cut::DropUnsynced)
            .unwrap_or_else(|e| panic!("{ctx}: the cut: {e}"));
        let ctx = format!("{ctx}; the cut after it did {}", describe_cut(&cut));
        self.nodes[x] = self.start(x);
        if let Err(e) = self.nodes[x].ready_or_exit(READY_WITHIN) {
            let log = self.new_log(x);
            panic!(
                "{ctx}: node {} did not start again: {e}; its stderr:\n{}",
                x + 1,
                tail(&log, 40)
            );
        }
        if cluster {
            let all: Vec<usize> = (0..self.nodes.len()).collect();
            if let Err(why) = Caught(Box::pin(until_applied(&self.nodes, &all))).await {
                fail_if_any(&format!("{ctx}: after the restart"), &[why]);
            }
        }
        let mut problems = std::mem::take(&mut self.book.lock().unwrap().errors);
        problems.extend(self.resolve(cycle).await);
        problems.extend(self.check(cycle, false).await);
        problems.extend(self.all_well());
        fail_if_any(&ctx, &problems);
        said
    }
}

/// The first errors a node's stderr shows, for the test's output.
fn log_errors(log: &str) -> String {
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR") || l.starts_with("error"))
        .take(3)
        .collect();
    format!("; it logged: {errors:?}")
}

/// Sends SIGTERM to `child` and waits (`within` at most) for its exit.
fn stop_within(mut child: std::process::Child, within: Duration) -> std::process::ExitStatus {
    let pid = child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("process {pid} did not exit within {within:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A future whose panic is caught: `Err` is the panic's message.
struct Caught<F>(std::pin::Pin<Box<F>>);

impl<F: std::future::Future> std::future::Future for Caught<F> {
    type Output = Result<F::Output, String>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(payload) => std::task::Poll::Ready(Err(payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic".to_owned()))),
        }
    }
}

/// A refusal, short: its code, its reason and its message.
fn said(s: &tonic::Status) -> String {
    format!(
        "{:?} {} ({})",
        s.code(),
        boxoffice_client::reason(s).unwrap_or_default(),
        s.message()
    )
}

/// What a cut did, in a line.
fn describe_cut(r: &CutReport) -> String {
    format!(
        "{} B dropped, {} B kept, files reverted {:?}, {} namespace ops dropped, {} kept, names \
         vanished {:?}, names back {:?}",
        r.bytes_dropped,
        r.bytes_kept,
        r.files_reverted,
        r.ops_dropped,
        r.ops_kept,
        r.names_vanished,
        r.names_reappeared
    )
}

/// The last `n` lines of a node's stderr, without the frames of a backtrace (indented) and
/// without repeats of the line before.
fn tail(text: &str, n: usize) -> String {
    let mut lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with(char::is_whitespace) && *l != "stack backtrace:")
        .collect();
    lines.dedup_by(|a, b| a.get(27..) == b.get(27..));
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn fail_if_any(ctx: &str, problems: &[String]) {
    if !problems.is_empty() {
        let shown: Vec<&String> = problems.iter().take(30).collect();
        panic!(
            "{ctx}: {} problem(s) (the first {}):\n{}",
            problems.len(),
            shown.len(),
            shown
                .iter()
                .map(|p| format!("- {p}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Checks every acknowledged hold and order of `keys` through each node of `through`, 8 at a
/// time: `GetHold` (same seats, held or confirmed as answered), `GetOrder` (confirmed, same
/// tickets), and with `replay` the keys sent again (the same hold, the same order).
async fn check_promises(
    clients: &Arc<Vec<Clients>>,
    through: &[usize],
    keys: Vec<Keyed>,
    replay: bool,
    rings: &Arc<Vec<PublicKey>>,
) -> Vec<String> {
    const LANES: usize = 8;
    let keys = Arc::new(keys);
    let mut lanes = tokio::task::JoinSet::new();
    for lane in 0..LANES {
        let (keys, clients, rings, through) = (
            keys.clone(),
            clients.clone(),
            rings.clone(),
            through.to_vec(),
        );
        lanes.spawn(async move {
            let mut problems = Vec::new();
            for k in keys.iter().skip(lane).step_by(LANES) {
                for &n in &through {
                    check_one(&clients[n], n, k, replay, &rings, &mut problems).await;
                }
            }
            problems
        });
    }
    let mut problems = Vec::new();
    while let Some(lane) = lanes.join_next().await {
        match lane {
            Ok(p) => problems.extend(p),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    problems
}

/// Calls `call` on one node (retried there while it fails transiently).
async fn on<T, F, Fut>(c: &Clients, call: F) -> Result<T, tonic::Status>
where
    F: FnMut(Clients) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    retrying(std::slice::from_ref(c), 0, &AtomicU64::new(0), call).await
}

/// One key's promises through node `n` (see [`check_promises`]).
async fn check_one(
    c: &Clients,
    n: usize,
    k: &Keyed,
    replay: bool,
    rings: &[PublicKey],
    problems: &mut Vec<String>,
) {
    let Some(h) = &k.hold else { return };
    let acked = &h.value;
    let who = format!(
        "node {}: hold {} (key {} of {}, seats {:?}, {})",
        n + 1,
        acked.hold_id,
        k.req.idempotency_key,
        k.req.user_id,
        acked.seat_ids,
        h.origin()
    );
    let want = match &k.confirm {
        None => Some(pb::HoldStatus::Held),
        Some((_, Some(_))) => Some(pb::HoldStatus::Confirmed),
        // Its confirm is unknown (and reported as such): held or confirmed.
        Some((_, None)) => None,
    };
    let get = pb::GetHoldRequest {
        hold_id: acked.hold_id.clone(),
        user_id: k.req.user_id.clone(),
    };
    match on(c, |mut c| {
        let req = get.clone();
        async move { c.booking.get_hold(req).await }
    })
    .await
    {
        Err(s) => problems.push(format!("{who}: LOST: GetHold answers {}", said(&s))),
        Ok(now) => {
            if now.seat_ids != acked.seat_ids || now.section_id != acked.section_id {
                problems.push(format!(
                    "{who}: GetHold shows seats {:?} of section {}",
                    now.seat_ids, now.section_id
                ));
            }
            if let Some(want) = want
                && now.status != want as i32
            {
                problems.push(format!(
                    "{who}: GetHold says {:?}, not {want:?}",
                    pb::HoldStatus::try_from(now.status)
                ));
            }
        }
    }
    if replay {
        match on(c, |mut c| {
            let req = k.req.clone();
            async move { c.booking.hold(req).await }
        })
        .await
        {
            Err(s) => problems.push(format!("{who}: its key replayed: {}", said(&s))),
            Ok(again) => {
                if again.hold_id != acked.hold_id
                    || again.seat_ids != acked.seat_ids
                    || again.expires_at_unix_ms != acked.expires_at_unix_ms
                {
                    problems.push(format!(
                        "{who}: its key replayed gives another answer: hold {} seats {:?} \
                         expiring {} (acknowledged: expiring {})",
                        again.hold_id,
                        again.seat_ids,
                        again.expires_at_unix_ms,
                        acked.expires_at_unix_ms
                    ));
                }
            }
        }
    }
    let Some((creq, Some(o))) = &k.confirm else {
        return;
    };
    let order = &o.value;
    let who = format!(
        "node {}: order {} of hold {} (key {} of {}, {})",
        n + 1,
        order.order_id,
        acked.hold_id,
        creq.idempotency_key,
        creq.user_id,
        o.origin()
    );
    let get = pb::GetOrderRequest {
        order_id: order.order_id.clone(),
        user_id: creq.user_id.clone(),
    };
    match on(c, |mut c| {
        let req = get.clone();
        async move { c.booking.get_order(req).await }
    })
    .await
    {
        Err(s) => problems.push(format!("{who}: LOST: GetOrder answers {}", said(&s))),
        Ok(now) => {
            if now.status != pb::OrderStatus::Confirmed as i32 || now.hold_id != acked.hold_id {
                problems.push(format!(
                    "{who}: GetOrder says {:?} of hold {}",
                    pb::OrderStatus::try_from(now.status),
                    now.hold_id
                ));
            }
            if let Err(e) = same_tickets(order, &now, rings) {
                problems.push(format!("{who}: GetOrder: {e}"));
            }
        }
    }
    if replay {
        match on(c, |mut c| {
            let req = creq.clone();
            async move { c.booking.confirm(req).await }
        })
        .await
        {
            Err(s) => problems.push(format!("{who}: its confirm key replayed: {}", said(&s))),
            Ok(again) => {
                if again.order_id != order.order_id {
                    problems.push(format!(
                        "{who}: its confirm key replayed gives order {}",
                        again.order_id
                    ));
                } else if let Err(e) = same_tickets(order, &again, rings) {
                    problems.push(format!("{who}: its confirm key replayed: {e}"));
                }
            }
        }
    }
}

/// The tickets of `now` are those of `acked`: same ids and seats, and the same codes, or (on a
/// cluster, whose nodes each sign with their own key) codes of two different keys of `rings`
/// saying the same.
fn same_tickets(acked: &pb::Order, now: &pb::Order, rings: &[PublicKey]) -> Result<(), String> {
    let ids = |o: &pb::Order| -> Vec<(String, String, String)> {
        o.tickets
            .iter()
            .map(|t| (t.ticket_id.clone(), t.section_id.clone(), t.seat_id.clone()))
            .collect()
    };
    if ids(acked) != ids(now) {
        return Err(format!(
            "tickets {:?}, acknowledged {:?}",
            ids(now),
            ids(acked)
        ));
    }
    for (a, b) in acked.tickets.iter().zip(&now.tickets) {
        if a.code == b.code {
            continue;
        }
        let verify = |code: &str, what: &str| {
            boxoffice_gateway::tickets::verify(code, rings).map_err(|e| {
                format!(
                    "ticket {}: the {what} code does not verify: {e}",
                    a.ticket_id
                )
            })
        };
        let (va, vb) = (
            verify(&a.code, "acknowledged")?,
            verify(&b.code, "current")?,
        );
        if va.kid == vb.kid || va.claims != vb.claims {
            return Err(format!(
                "ticket {}: code {} now, {} acknowledged",
                a.ticket_id, b.code, a.code
            ));
        }
    }
    Ok(())
}

/// What the fans were answered cannot overlap: no hold id answered to two keys, no seat in two
/// holds.
fn check_books(keys: &[Keyed]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut ids: BTreeMap<&str, &str> = BTreeMap::new();
    let mut seats: BTreeMap<&str, &str> = BTreeMap::new();
    for k in keys {
        let Some(h) = &k.hold else { continue };
        let key = k.req.idempotency_key.as_str();
        if let Some(other) = ids.insert(&h.value.hold_id, key) {
            problems.push(format!(
                "hold {} answered to keys {other} and {key}",
                h.value.hold_id
            ));
        }
        for s in &h.value.seat_ids {
            if let Some(other) = seats.insert(s, key) {
                problems.push(format!("seat {s} answered to keys {other} and {key}"));
            }
        }
    }
    problems
}

/// Through node `n`: `GetEvent`'s counters are those of the holds the fans were answered (held
/// = live holds, sold = orders, conserved), and the seat map shows exactly their seats held and
/// sold (it may be up to a second stale, so it is read again for a while before it counts).
/// A hold whose confirm went unanswered (reported already) may be either.
async fn check_counters(c: &Clients, n: usize, keys: &[Keyed]) -> Vec<String> {
    let mut want = Seats::default();
    for k in keys {
        let Some(h) = &k.hold else { continue };
        let name = format!(
            "hold {} (key {} of {})",
            h.value.hold_id, k.req.idempotency_key, k.req.user_id
        );
        let to = match &k.confirm {
            None => &mut want.held,
            Some((_, Some(_))) => &mut want.sold,
            Some((_, None)) => &mut want.either,
        };
        for s in &h.value.seat_ids {
            to.insert(s.clone(), name.clone());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let problems = counters_now(c, n, &want).await;
        if problems.is_empty() || Instant::now() > deadline {
            return problems;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Seats of the holds the fans were answered, each with the hold that has it: held, sold, and
/// either (a confirm of unknown outcome).
#[derive(Default)]
struct Seats {
    held: BTreeMap<String, String>,
    sold: BTreeMap<String, String>,
    either: BTreeMap<String, String>,
}

async fn counters_now(c: &Clients, n: usize, want: &Seats) -> Vec<String> {
    let node = n + 1;
    let mut problems = Vec::new();
    let event = match on(c, |mut c| async move {
        c.events
            .get_event(pb::GetEventRequest {
                event_id: EVENT.into(),
            })
            .await
    })
    .await
    {
        Ok(e) => e,
        Err(s) => return vec![format!("node {node}: GetEvent: {}", said(&s))],
    };
    let Some(s) = event.sections.first() else {
        return vec![format!("node {node}: GetEvent shows no section: {event:?}")];
    };
    if s.available + s.held + s.sold != s.capacity {
        problems.push(format!(
            "node {node}: GetEvent: available {} + held {} + sold {} != capacity {}",
            s.available, s.held, s.sold, s.capacity
        ));
    }
    let (held, sold, either) = (want.held.len(), want.sold.len(), want.either.len());
    let fits = |got: u32, at_least: usize| (at_least..=at_least + either).contains(&(got as usize));
    if !fits(s.held, held)
        || !fits(s.sold, sold)
        || (s.held + s.sold) as usize != held + sold + either
    {
        problems.push(format!(
            "node {node}: GetEvent counts {} held and {} sold; the fans were answered {held} \
             live holds and {sold} orders ({either} more holds either)",
            s.held, s.sold
        ));
    }
    let mut map_held = BTreeSet::new();
    let mut map_sold = BTreeSet::new();
    let mut first_row = 0;
    loop {
        let req = pb::GetSeatMapRequest {
            event_id: EVENT.into(),
            section_id: SECTION.into(),
            first_row,
        };
        let map = match on(c, |mut c| {
            let req = req.clone();
            async move { c.events.get_seat_map(req).await }
        })
        .await
        {
            Ok(m) => m,
            Err(s) => return vec![format!("node {node}: GetSeatMap: {}", said(&s))],
        };
        for seat in map.sections.iter().flat_map(|s| &s.seats) {
            if seat.status == pb::SeatStatus::Held as i32 {
                map_held.insert(seat.seat_id.clone());
            } else if seat.status == pb::SeatStatus::Sold as i32 {
                map_sold.insert(seat.seat_id.clone());
            }
        }
        if map.next_first_row == 0 {
            break;
        }
        first_row = map.next_first_row;
    }
    let ghosts: Vec<&String> = map_held
        .iter()
        .chain(&map_sold)
        .filter(|s| {
            !want.held.contains_key(*s)
                && !want.sold.contains_key(*s)
                && !want.either.contains_key(*s)
        })
        .collect();
    if !ghosts.is_empty() {
        problems.push(format!(
            "node {node}: the seat map shows {} seats taken by no hold the fans were answered: \
             {:?}",
            ghosts.len(),
            ghosts.iter().take(10).collect::<Vec<_>>()
        ));
    }
    for (seat, by) in &want.held {
        if !map_held.contains(seat) {
            problems.push(format!(
                "node {node}: seat {seat} of {by} is not held on the seat map"
            ));
        }
    }
    for (seat, by) in &want.sold {
        if !map_sold.contains(seat) {
            problems.push(format!(
                "node {node}: seat {seat} of {by} is not sold on the seat map"
            ));
        }
    }
    for (seat, by) in &want.either {
        if !map_held.contains(seat) && !map_sold.contains(seat) {
            problems.push(format!(
                "node {node}: seat {seat} of {by} is free on the seat map"
            ));
        }
    }
    problems
}

/// Runs `cycles` cycles of `fans` fans on `nodes` nodes, then checks everything and stops the
/// nodes: their dirs are checked offline by `offline`.
async fn run(name: &'static str, nodes: usize, cycles: usize, fans: usize) -> Rig {
    let seed = base_seed();
    println!(
        "{name}: {cycles} cycles of {fans} fans on {nodes} node(s); \
         BOXOFFICE_POWERCUT_SEED={seed}"
    );
    let mut rig = Rig::new(name, nodes, seed);
    rig.create_event(cycles * fans * HOLDS_PER_FAN).await;
    let started = Instant::now();
    for cycle in 0..cycles {
        let t = Instant::now();
        let (acked, reports) = rig.cycle(cycle, fans).await;
        let (holds, orders, h_after, o_after) = rig.totals();
        let cuts: Vec<String> = reports.iter().map(describe_cut).collect();
        println!(
            "{name}: cycle {cycle}: cut after {acked} acknowledged calls; {:?}: {cuts:?}; \
             checked; now {holds} holds and {orders} orders acknowledged ({h_after} and \
             {o_after} of them answered to a replay after their cut); {:?}",
            cut_of(seed, cycle, 0),
            t.elapsed()
        );
    }
    // Everything, through every node.
    let problems = rig.check(cycles, true).await;
    fail_if_any(&format!("{name}: after the last cycle"), &problems);
    println!(
        "{name}: {cycles} cycles in {:?}; {} calls retried on another node",
        started.elapsed(),
        rig.retried.load(Ordering::Relaxed)
    );
    for (i, d) in rig.disks.iter().enumerate() {
        let st = d.stats();
        println!(
            "{name}: node {}'s disk: {} file fsyncs ({} failed), {} directory fsyncs; by file: \
             {:?}",
            i + 1,
            st.fsyncs,
            st.failed_fsyncs,
            st.dir_fsyncs,
            st.fsyncs_by_path
        );
    }
    for n in &mut rig.nodes {
        n.terminate();
    }
    rig
}

/// One `serve` process whose data dir is on a power-cut disk, cut mid-burst again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_power_cut_keeps_every_acknowledged_sale() {
    let name = "single_node_power_cut_keeps_every_acknowledged_sale";
    if !fuse_or_skip(name) {
        return;
    }
    let cycles = tiers::count("BOXOFFICE_POWERCUT_CYCLES", 3, 20);
    let rig = run(name, 1, cycles, 8).await;
    // Offline: the log is whole, and reconciliation is clean.
    let dir = rig.dirs().remove(0);
    for (args, says) in [
        (["check-log", "--data-dir"], ""),
        (["reconcile", "--data-dir"], "reconciliation clean"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_boxoffice"))
            .args(args)
            .arg(&dir)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && text.contains(says),
            "{name}: boxoffice {args:?} after the last cut: {:?}: {text}",
            out.status
        );
    }
}

/// Three `serve` nodes of a Raft group, each on its own power-cut disk, all killed and all cut
/// at once mid-burst, again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinated_power_cut_of_a_cluster_loses_nothing_acknowledged() {
    let name = "coordinated_power_cut_of_a_cluster_loses_nothing_acknowledged";
    if !fuse_or_skip(name) {
        return;
    }
    let cuts = tiers::count("BOXOFFICE_POWERCUT_CLUSTER_CUTS", 3, 50);
    let rig = run(name, 3, cuts, 12).await;
    // Offline: each node's copy holds everything acknowledged, conserved and reconciled.
    let acked = rig.acked();
    for dir in rig.dirs() {
        check_copy(&dir, EVENT, &acked).await;
    }
}

/// A full disk, then fsyncs that fail, under one `serve` process and under a cluster's
/// leader, while fans hold and confirm: the node stops visibly, nothing acknowledged is lost,
/// and once the disk is mended (and has lost what it did not sync) the node starts again.
async fn disk_faults(name: &'static str, nodes: usize) {
    if !fuse_or_skip(name) {
        return;
    }
    let seed = base_seed();
    let fans = 8;
    println!("{name}: {nodes} node(s); BOXOFFICE_POWERCUT_SEED={seed}");
    let mut rig = Rig::new(name, nodes, seed);
    rig.create_event(6 * fans * HOLDS_PER_FAN).await;
    // On a cluster the leader's disk fails, then a follower's, in turn.
    let faults = [
        DiskFault::Full,
        DiskFault::FsyncFails,
        DiskFault::FullAtALargeWrite,
        DiskFault::FsyncFails,
        DiskFault::Stalled,
    ];
    for (cycle, fault) in faults.into_iter().enumerate() {
        if nodes == 1 && cycle == 3 {
            // A single node has no followers: its disk fails three ways, then stalls.
            continue;
        }
        let x = if nodes == 1 {
            0
        } else {
            let l = leader(&rig.nodes).await;
            if cycle % 2 == 0 { l } else { (l + 1) % nodes }
        };
        let said = rig.fault_cycle(cycle, fans, x, fault).await;
        let (holds, orders, h_after, o_after) = rig.totals();
        println!(
            "{name}: cycle {cycle}: {fault:?}: {said}; checked; now {holds} holds and {orders} \
             orders acknowledged ({h_after} and {o_after} answered to a replay)"
        );
    }
    let problems = rig.check(faults.len(), true).await;
    fail_if_any(&format!("{name}: at the end"), &problems);
    let acked = rig.acked();
    for n in &mut rig.nodes {
        n.terminate();
    }
    if nodes > 1 {
        for dir in rig.dirs() {
            check_copy(&dir, EVENT, &acked).await;
        }
    }
}

/// One `serve` process whose disk fills up, then fails its fsyncs, mid-burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_stops_visibly_on_a_full_disk_or_failed_fsync_and_loses_nothing() {
    disk_faults(
        "a_single_node_stops_visibly_on_a_full_disk_or_failed_fsync_and_loses_nothing",
        1,
    )
    .await;
}

/// A cluster whose leader's disk fills up, then a follower's fails its fsyncs, then the
/// leader's fills up under a large write, then a follower's fails its fsyncs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_whose_disk_fails_stops_and_its_group_loses_nothing() {
    disk_faults(
        "a_cluster_node_whose_disk_fails_stops_and_its_group_loses_nothing",
        3,
    )
    .await;
}
