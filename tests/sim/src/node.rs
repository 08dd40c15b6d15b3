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

/// The port every node serves gRPC (and Raft) on.
pub const GRPC_PORT: u16 = 50051;
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

/// What the harness sees of every node's Raft, gathered from each node's metrics as they
/// change: the evidence for the Raft checkers.
#[derive(Default)]
pub struct RaftSeen {
    /// Every node seen leading in a term.
    pub leaders: BTreeMap<u64, BTreeSet<u64>>,
    /// For each log index seen applied, by which term's entry, on which nodes.
    pub applied: BTreeMap<u64, BTreeMap<u64, BTreeSet<u64>>>,
    /// Each node's latest figures: (term, leads, last applied index).
    pub now: BTreeMap<u64, (u64, bool, u64)>,
    /// Nodes whose Raft stopped (a storage error), with why.
    pub failed: BTreeMap<u64, String>,
}

/// One node of a run: its disk, data dir and clock outlive its software (a crash or restart
/// keeps them; a wipe empties them).
#[derive(Clone)]
pub struct Node {
    /// Its id (1-based).
    pub id: u64,
    /// Its Raft log, state machine and engine log.
    pub disk: SimKv,
    /// Its data dir on the real disk (ticket keys, the recorded group count).
    pub dir: PathBuf,
    /// Its wall clock.
    pub clock: SimClock,
}

impl Node {
    /// Node `id` with an empty disk, its data dir under `root`.
    pub fn new(id: u64, root: &std::path::Path) -> Node {
        let dir = root.join(host(id));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("the node's data dir {}: {e}", dir.display()));
        Node {
            id,
            disk: SimKv::new(),
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
        config.network = Some(Arc::new(TurmoilNet));
        config.cluster = Some(ClusterConfig {
            node_id: self.id,
            peers: (1..=setup.nodes)
                .map(|i| (i, format!("{}:{GRPC_PORT}", host(i))))
                .collect(),
            secret: boxoffice_gateway::cluster::ClusterSecret::new(CLUSTER_SECRET)
                .unwrap_or_else(|e| panic!("the cluster secret: {e}")),
            snapshot_every: setup.snapshot_every,
            groups: 1,
            stores: Some(vec![Arc::new(self.disk.clone())]),
            snapshot_keep: setup.snapshot_keep,
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
                let running = boxoffice_gateway::server::start(node.config(&setup))
                    .await
                    .map_err(|e| format!("node {} did not start: {e:#}", node.id))?;
                if let Some(raft) = running.raft() {
                    let mut metrics = raft.metrics();
                    loop {
                        {
                            let m = metrics.borrow_and_update();
                            let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                            let leads = m.state == openraft::ServerState::Leader
                                && m.current_leader == Some(node.id);
                            if leads {
                                seen.leaders
                                    .entry(m.current_term)
                                    .or_default()
                                    .insert(node.id);
                            }
                            if let Some(l) = m.last_applied {
                                seen.applied
                                    .entry(l.index)
                                    .or_default()
                                    .entry(l.leader_id.term)
                                    .or_default()
                                    .insert(node.id);
                            }
                            seen.now.insert(
                                node.id,
                                (m.current_term, leads, m.last_applied.map_or(0, |l| l.index)),
                            );
                            if let Err(e) = &m.running_state {
                                seen.failed.insert(node.id, e.to_string());
                            }
                        }
                        if metrics.changed().await.is_err() {
                            break;
                        }
                    }
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .failed
                        .entry(node.id)
                        .or_insert_with(|| "its Raft stopped".into());
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
