//! A simulated node: the real `boxoffice serve` stack ([`boxoffice_gateway::server::start`]:
//! gateway, engine, Raft, sweeper) as a turmoil host, over its own simulated disk and clock.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use boxoffice_engine::store::SimKv;
use boxoffice_gateway::server::{ClusterConfig, ServerConfig};

use crate::clock::SimClock;
use crate::net::TurmoilNet;

/// A disk's time to sync: the group commit's batches form while it runs, and a crash can land
/// in the middle of one.
pub const SYNC_LATENCY: Duration = Duration::from_millis(1);

/// The port every node serves gRPC (and Raft) on.
pub const GRPC_PORT: u16 = 50051;
/// Each node's peer port (Raft and forwarded calls; the public port refuses them).
pub const PEER_PORT: u16 = 50061;
/// The admin key of every node.
pub const ADMIN_KEY: &str = "sim-admin-key";
/// The client key of every node.
pub const CLIENT_KEY: &str = "sim-client-key";
const TOKEN_SECRET: &[u8] = b"sim-token-secret-of-the-cluster";
const CLUSTER_SECRET: &str = "sim-cluster-secret";

/// How the nodes of a run are set up (the same for every node).
#[derive(Clone, Debug)]
pub struct Setup {
    /// Nodes in the group.
    pub nodes: u64,
    /// Raft entries between snapshots.
    pub snapshot_every: u64,
    /// Raft entries kept behind a snapshot.
    pub snapshot_keep: u64,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            nodes: 3,
            snapshot_every: 40,
            snapshot_keep: 8,
        }
    }
}

/// The host name of node `id`.
pub fn host(id: u64) -> String {
    format!("n{id}")
}

/// A leader id as openraft 0.9 has it: `(term, node)`. Its leader ids are ordered by both, so
/// two candidates of one term can each win (each its own leader id); an index is still
/// committed with one entry only, which is what the checkers hold it to.
pub type LeaderId = (u64, u64);

/// What the harness sees of every node's Raft, gathered from each node's metrics as they
/// change: the evidence for the Raft checkers.
#[derive(Default)]
pub struct RaftSeen {
    /// Every leadership seen: `(node, leader id, from ms, until ms)` (until: open while it
    /// leads, closed when it stops or its software does).
    pub leads: Vec<(u64, LeaderId, u64, Option<u64>)>,
    /// For each log index seen applied, by which leader's entry, on which nodes.
    pub applied: BTreeMap<u64, BTreeMap<LeaderId, BTreeSet<u64>>>,
    /// Each node's latest figures: (term, leads, last applied index).
    pub now: BTreeMap<u64, (u64, bool, u64)>,
    /// Nodes that started without their data and have not caught up yet: they do not vote,
    /// so each counts as a failed node until it has.
    pub catching_up: BTreeSet<u64>,
    /// Nodes whose Raft stopped (a storage error), with why.
    pub failed: BTreeMap<u64, String>,
    /// The greatest vote (term, candidate) each node reported: a vote is reported once it is
    /// saved, and a saved vote must survive a restart (forgotten when the driver wipes the
    /// node's disk or flips a bit on it).
    pub votes: BTreeMap<u64, (u64, u64)>,
    /// Votes a node forgot across a restart: a vote it granted was not durable.
    pub votes_lost: Vec<String>,
}

impl RaftSeen {
    /// Node `node` reports `vote` (`restarted`: the first report of its software's start,
    /// the vote it read back from its disk), at virtual `now_ms`.
    pub fn vote(&mut self, node: u64, vote: (u64, u64), restarted: bool, now_ms: u64) {
        let before = self.votes.entry(node).or_insert(vote);
        if restarted && vote < *before {
            self.votes_lost.push(format!(
                "node {node} restarted at {now_ms} ms with vote (term {}, node {}), though it had saved (term {}, node {}) before: a vote it granted was not durable",
                vote.0, vote.1, before.0, before.1
            ));
        }
        *before = (*before).max(vote);
    }

    /// Node `node` leads as `id` now (or leads nothing), at virtual `now_ms`.
    pub fn lead(&mut self, node: u64, id: Option<LeaderId>, now_ms: u64) {
        let open = self
            .leads
            .iter_mut()
            .find(|(n, _, _, until)| *n == node && until.is_none());
        match (open, id) {
            (Some((_, was, _, _)), Some(id)) if *was == id => {}
            (Some((_, _, _, until)), id) => {
                *until = Some(now_ms);
                if let Some(id) = id {
                    self.leads.push((node, id, now_ms, None));
                }
            }
            (None, Some(id)) => self.leads.push((node, id, now_ms, None)),
            (None, None) => {}
        }
    }
}

/// One node of a run: its disk, data dir and clock outlive its software (a crash or restart
/// keeps them; a wipe empties them).
#[derive(Clone)]
pub struct Node {
    /// Its id (1-based).
    pub id: u64,
    /// The network it reaches its peers over (with the run's message faults).
    pub net: TurmoilNet,
    /// Its Raft log, state machine and engine log.
    pub disk: SimKv,
    /// Its data dir on the real disk (ticket keys, the recorded group count).
    pub dir: PathBuf,
    /// Its wall clock.
    pub clock: SimClock,
}

impl Node {
    /// Node `id` with an empty disk, its data dir under `root`, on `net`.
    pub fn new(id: u64, root: &std::path::Path, net: &TurmoilNet) -> Node {
        let dir = root.join(host(id));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("the node's data dir {}: {e}", dir.display()));
        let disk = SimKv::new();
        disk.set_sync_latency(SYNC_LATENCY);
        Node {
            id,
            net: net.clone(),
            disk,
            dir,
            clock: SimClock::default(),
        }
    }

    /// Everything the node kept is gone (a replaced disk): it starts pristine.
    pub fn wipe(&self) {
        self.disk.wipe();
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir)
            .unwrap_or_else(|e| panic!("the node's data dir {}: {e}", self.dir.display()));
    }

    fn config(&self, setup: &Setup) -> ServerConfig {
        let mut config = ServerConfig::new(ADMIN_KEY, CLIENT_KEY, TOKEN_SECRET);
        config.listen = std::net::SocketAddr::from(([0, 0, 0, 0], GRPC_PORT));
        config.metrics_listen = None;
        config.http_listen = None;
        config.data_dir = self.dir.clone();
        config.clock = Arc::new(self.clock.clone());
        config.grace = Duration::from_secs(1);
        config.reconcile_every = Some(Duration::from_secs(5));
        config.refund_grace = Duration::from_secs(10);
        config.network = Some(Arc::new(self.net.clone()));
        config.cluster = Some(ClusterConfig {
            node_id: self.id,
            peers: (1..=setup.nodes)
                .map(|i| (i, format!("{}:{PEER_PORT}", host(i))))
                .collect(),
            secret: boxoffice_gateway::node::peers::ClusterSecret::new(CLUSTER_SECRET)
                .unwrap_or_else(|e| panic!("the cluster secret: {e}")),
            snapshot_every: setup.snapshot_every,
            groups: 1,
            stores: Some(vec![Arc::new(self.disk.clone())]),
            snapshot_keep: setup.snapshot_keep,
            // A peer port of its own, in the clear: the simulated network carries no TLS
            // (its handshakes would draw on the OS's randomness, not the seed's).
            peer_listen: Some(std::net::SocketAddr::from(([0, 0, 0, 0], PEER_PORT))),
            peer_tls: None,
        });
        config
    }

    /// The node's software, as turmoil starts it (and starts it again after a crash): serve,
    /// and report Raft's figures to `seen` as they change.
    pub fn software(
        &self,
        setup: &Setup,
        seen: Arc<Mutex<RaftSeen>>,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = turmoil::Result>>> + use<>
    {
        let node = self.clone();
        let setup = setup.clone();
        move || {
            let (node, setup, seen) = (node.clone(), setup.clone(), seen.clone());
            Box::pin(async move {
                let running = match boxoffice_gateway::server::start(node.config(&setup)).await {
                    Ok(r) => r,
                    Err(e) => {
                        // As `serve` exits for its supervisor: the driver restarts it (or, after
                        // failures in a row, an operator replaces its disk).
                        seen.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .failed
                            .insert(node.id, format!("did not start: {e:#}"));
                        std::future::pending::<()>().await;
                        return Ok(());
                    }
                };
                if let Some(raft) = running.raft() {
                    let mut metrics = raft.metrics();
                    let mut restarted = true;
                    loop {
                        {
                            let m = metrics.borrow_and_update();
                            let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                            // (Before Raft reports what it read, its figures are a placeholder
                            // with no membership: a node with data always has one.)
                            if m.membership_config
                                .membership()
                                .voter_ids()
                                .next()
                                .is_some()
                            {
                                let vote = (m.vote.leader_id.term, m.vote.leader_id.node_id);
                                seen.vote(node.id, vote, restarted, crate::clock::elapsed_ms());
                                restarted = false;
                            }
                            let leads = m.state == openraft::ServerState::Leader
                                && m.current_leader == Some(node.id);
                            let id = (m.current_term, node.id);
                            seen.lead(node.id, leads.then_some(id), crate::clock::elapsed_ms());
                            if let Some(l) = m.last_applied {
                                seen.applied
                                    .entry(l.index)
                                    .or_default()
                                    .entry((l.leader_id.term, l.leader_id.node_id))
                                    .or_default()
                                    .insert(node.id);
                            }
                            seen.now.insert(
                                node.id,
                                (m.current_term, leads, m.last_applied.map_or(0, |l| l.index)),
                            );
                            if running.catching_up() {
                                seen.catching_up.insert(node.id);
                            } else {
                                seen.catching_up.remove(&node.id);
                            }
                            if let Err(e) = &m.running_state {
                                seen.failed.insert(node.id, e.to_string());
                            }
                        }
                        if metrics.changed().await.is_err() {
                            break;
                        }
                    }
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    seen.failed
                        .entry(node.id)
                        .or_insert_with(|| "its Raft stopped".into());
                    // A node whose Raft stopped leads nothing.
                    seen.lead(node.id, None, crate::clock::elapsed_ms());
                }
                // Serve until turmoil crashes the host (a node whose Raft stopped waits for a
                // restart, as `serve` exits for its supervisor to restart it).
                std::future::pending::<()>().await;
                drop(running);
                Ok(())
            })
        }
    }
}
