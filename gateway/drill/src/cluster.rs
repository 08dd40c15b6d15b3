//! A cluster of three or five `boxoffice serve` processes on loopback (issues 13 and 27),
//! started for one run of a drill and stopped with it: what `flash-sale --nodes N` plays
//! against.
//!
//! [`LocalCluster::start`] picks free loopback ports (bound on `127.0.0.1:0`, then released for
//! the nodes), writes the secrets the nodes share (the cluster secret, an admin and a client key,
//! the token secret) to files only this user can read, starts nodes 1 to N as children of this
//! executable (`serve --node-id N --peers 1=...,2=...,3=...`), each with its own data dir
//! (`node1/` ...) and log file (`node1.log`, its stdout and stderr), and waits until each answers
//! health `SERVING`. One more node, N+1, is kept spare (its ports, its certificate):
//! [`LocalCluster::replace`] starts it and replaces a node by it, live. Dropping the cluster
//! kills (SIGKILL) and reaps every node still running, so no node outlives its run, whichever
//! way the run ends.
//!
//! While the run goes on: [`LocalCluster::leader`] asks each live node's `/metrics` whether it
//! leads (`boxoffice_raft_leader{group="0"} 1`), [`LocalCluster::kill`] kills a node with SIGKILL, and
//! [`LocalCluster::await_serving_leader`] waits until a live node leads with its engine serving.
//! At the end [`LocalCluster::stop`] lets the live nodes apply what their group committed and
//! stops them (SIGTERM, a drain), and [`check_copy`] opens a stopped node's copy of the log
//! offline for the engine's invariants and the reconciliation.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use boxoffice_engine::Durability;
use tonic::transport::{Channel, Endpoint};

use crate::secret::UsageError;

/// The sizes a local cluster can have.
pub const SIZES: [u64; 2] = [3, 5];

/// How long each node may take to answer health `SERVING` after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the failover is polled.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// How often the leader's reconciliation pass runs (it refunds orphaned charges).
const RECONCILE_EVERY: Duration = Duration::from_secs(2);

/// How the nodes are configured beyond the cluster itself.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// `--durability`.
    pub durability: Durability,
    /// `--queue-max`: fans per waiting room.
    pub queue_max: u32,
    /// `--in-flight-max`: calls in flight at once before the gate sheds.
    pub in_flight_max: usize,
}

/// One node: its id, addresses, data dir, log file and process (`None` once stopped or
/// killed).
struct Node {
    id: u64,
    addr: SocketAddr,
    /// Its peer port (Raft and forwarded calls, mutual TLS under the run's cluster CA).
    peer: SocketAddr,
    metrics: SocketAddr,
    dir: PathBuf,
    log: PathBuf,
    child: Mutex<Option<Child>>,
    /// Whether the cluster's groups count it (the spare until it replaces a node; a node
    /// replaced no more).
    member: std::sync::atomic::AtomicBool,
}

impl Node {
    /// Whether the cluster's groups count it.
    fn member(&self) -> bool {
        self.member.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether the node's process runs (it was neither killed nor stopped, and did not exit).
    fn live(&self) -> bool {
        let mut child = lock(&self.child);
        match child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                *child = None;
                false
            }
            None => false,
        }
    }

    /// The node's log file's last lines (for an error that says why it failed).
    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let len = f.metadata().map_or(0, |m| m.len());
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(2_000)));
            let _ = f.read_to_string(&mut text);
        }
        text
    }

    /// The node's metric `name` (a series without labels), if it answers within 500 ms.
    async fn metric(&self, name: &str) -> Option<f64> {
        let text = scrape(self.metrics).await?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// The sum of every series of the metric family `name` (with labels or not), if the node
    /// answers within 500 ms.
    async fn metric_sum(&self, name: &str) -> Option<f64> {
        let text = scrape(self.metrics).await?;
        Some(
            text.lines()
                .filter_map(|l| {
                    let rest = l.strip_prefix(name)?;
                    let value = match rest.strip_prefix('{') {
                        Some(labelled) => labelled.split_once("} ")?.1,
                        None => rest.strip_prefix(' ')?,
                    };
                    value.trim().parse::<f64>().ok()
                })
                .sum(),
        )
    }
}

/// A local cluster; see the module's documentation. Dropping it kills every node still running.
pub struct LocalCluster {
    nodes: Vec<Node>,
    admin_key: String,
    /// The executable the nodes run, and their options (for the spare).
    exe: PathBuf,
    options: NodeOptions,
    /// The temporary root dir (none under `--data-dir`), removed once the nodes are gone.
    _temp: Option<tempfile::TempDir>,
}

impl LocalCluster {
    /// Starts `size` nodes of `exe` (this executable, which has the `serve` subcommand) with
    /// their data under `root` (`node1/` to `nodeN/`, and the spare's; a temporary dir if
    /// `None`), and waits until each answers health `SERVING`. A `root` that already holds a
    /// node's data is a [`UsageError`]: a cluster's nodes remember their peers' addresses,
    /// which are new ports each run.
    pub async fn start(
        exe: &Path,
        root: Option<&Path>,
        options: &NodeOptions,
        size: u64,
    ) -> anyhow::Result<LocalCluster> {
        // The nodes, and a spare.
        let all = size + 1;
        let (temp, root) = match root {
            Some(r) => {
                for i in 1..=all {
                    let dir = r.join(format!("node{i}"));
                    if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
                        return Err(UsageError::new(format!(
                            "--data-dir {}: {} already holds a node's data; a cluster run needs \
                             a new or empty dir",
                            r.display(),
                            dir.display()
                        ))
                        .into());
                    }
                }
                (None, r.to_path_buf())
            }
            None => {
                let t = tempfile::tempdir().context("creating a temporary dir for the nodes")?;
                let root = t.path().to_path_buf();
                (Some(t), root)
            }
        };
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let admin_key = format!("adm-{}", random_hex(16));
        let secrets = [
            ("cluster-secret", random_hex(32)),
            ("admin-key", admin_key.clone()),
            ("client-key", format!("cli-{}", random_hex(16))),
            ("token-secret", random_hex(32)),
        ];
        for (name, value) in &secrets {
            write_secret(&root.join(name), value)?;
        }
        // The peer ports' certificates, as an operator makes them (`boxoffice cluster certs`).
        // Those of an earlier run in the same dir are used again.
        let certs = root.join("certs");
        if !boxoffice_gateway::certs::node_file(&certs, all, "pem").exists() {
            let hosts = (1..=all).map(|id| boxoffice_gateway::certs::NodeHosts {
                id,
                hosts: vec!["127.0.0.1".to_owned()],
            });
            boxoffice_gateway::certs::make(
                &certs,
                &hosts.collect::<Vec<_>>(),
                boxoffice_gateway::certs::Validity::days(30),
            )?;
        }
        let ports = free_ports(3 * all as usize)?;
        let (addrs, rest) = ports.split_at(all as usize);
        let (peer_addrs, metrics) = rest.split_at(all as usize);
        let peers = peer_addrs[..size as usize]
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = LocalCluster {
            nodes: Vec::new(),
            admin_key,
            exe: exe.to_owned(),
            options: options.clone(),
            _temp: temp,
        };
        for i in 0..all as usize {
            let id = i as u64 + 1;
            let node = Node {
                id,
                addr: addrs[i],
                peer: peer_addrs[i],
                metrics: metrics[i],
                dir: root.join(format!("node{id}")),
                log: root.join(format!("node{id}.log")),
                child: Mutex::new(None),
                member: std::sync::atomic::AtomicBool::new(id <= size),
            };
            if id <= size {
                let child = spawn(exe, &node, &peers, &root, options)?;
                *lock(&node.child) = Some(child);
            }
            cluster.nodes.push(node);
        }
        cluster.await_started().await?;
        Ok(cluster)
    }

    /// Waits until every node answers health `SERVING` (all within [`START_TIMEOUT`]). A node
    /// that exits while any is starting fails the wait at once, naming it (a group cannot form
    /// without it); a timeout names every member not serving yet, live or not, each with its
    /// log's tail (the one that stops the others may not be the first).
    async fn await_started(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let members: Vec<&Node> = self.nodes.iter().filter(|n| n.member()).collect();
        let channels: Vec<Channel> = members.iter().map(|n| channel(n.addr)).collect();
        let mut serving_now = vec![false; members.len()];
        loop {
            if let Some(gone) = members.iter().find(|n| !n.live()) {
                anyhow::bail!(
                    "node {} exited while the cluster was starting; its log ({}) ends with:\n{}",
                    gone.id,
                    gone.log.display(),
                    gone.log_tail()
                );
            }
            for (i, c) in channels.iter().enumerate() {
                if !serving_now[i] {
                    serving_now[i] = serving(c).await;
                }
            }
            if serving_now.iter().all(|s| *s) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let waiting: Vec<String> = members
                    .iter()
                    .zip(&serving_now)
                    .filter(|(_, s)| !**s)
                    .map(|(n, _)| {
                        format!(
                            "node {} ({}; log {}) ends with:\n{}",
                            n.id,
                            if n.live() { "running" } else { "exited" },
                            n.log.display(),
                            n.log_tail()
                        )
                    })
                    .collect();
                anyhow::bail!(
                    "{} of {} nodes did not answer health SERVING within {} s:\n{}",
                    waiting.len(),
                    members.len(),
                    START_TIMEOUT.as_secs(),
                    waiting.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many nodes the cluster started with.
    pub fn size(&self) -> usize {
        self.nodes.len() - 1
    }

    /// Every member's gRPC target, `http://127.0.0.1:PORT`, node 1 first.
    pub fn targets(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.member())
            .map(|n| format!("http://{}", n.addr))
            .collect()
    }

    /// Node `id`'s gRPC target.
    pub fn target_of(&self, id: u64) -> anyhow::Result<String> {
        Ok(format!("http://{}", self.node(id)?.addr))
    }

    /// The admin key every node accepts.
    pub fn admin_key(&self) -> &str {
        &self.admin_key
    }

    /// The ids of the nodes still running.
    pub fn live(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|n| n.live())
            .map(|n| n.id)
            .collect()
    }

    /// The live node that says it leads its group (`boxoffice_raft_leader{group="0"} 1` in its
    /// `/metrics`, sampled by the node every 500 ms), if one does now.
    pub async fn leader(&self) -> Option<u64> {
        for n in self.nodes.iter().filter(|n| n.live()) {
            if n.metric("boxoffice_raft_leader{group=\"0\"}").await == Some(1.0) {
                return Some(n.id);
            }
        }
        None
    }

    /// The Raft terms of every group summed, as the live node that has seen the most reports
    /// them (`boxoffice_raft_term{group="G"}`, sampled by the nodes every 500 ms): each election
    /// held in any group raised it by one.
    pub async fn term(&self) -> Option<u64> {
        let mut term = None;
        for n in self.nodes.iter().filter(|n| n.live()) {
            if let Some(t) = n.metric_sum("boxoffice_raft_term").await {
                term = term.max(Some(t as u64));
            }
        }
        term
    }

    /// Whether node `id` runs and says it leads its group.
    pub async fn leads(&self, id: u64) -> bool {
        match self.node(id) {
            Ok(n) => n.live() && n.metric("boxoffice_raft_leader{group=\"0\"}").await == Some(1.0),
            Err(_) => false,
        }
    }

    /// Waits up to `timeout` for a live node to say it leads ([`LocalCluster::leader`]).
    pub async fn await_leader(&self, timeout: Duration) -> Option<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.leader().await {
                return Some(l);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// Kills node `id` with SIGKILL (no drain, no flush) and reaps it.
    pub fn kill(&self, id: u64) -> anyhow::Result<()> {
        let node = self.node(id)?;
        let mut child = lock(&node.child);
        let mut c = child
            .take()
            .with_context(|| format!("node {id} is not running"))?;
        c.kill().with_context(|| format!("killing node {id}"))?;
        c.wait().with_context(|| format!("reaping node {id}"))?;
        Ok(())
    }

    /// Starts node `id` again (after [`LocalCluster::kill`]) on its data dir, its ports and
    /// its log file (appended to), with `options`; does not wait for it.
    pub fn restart(&self, exe: &Path, id: u64, options: &NodeOptions) -> anyhow::Result<()> {
        let node = self.node(id)?;
        let root = node
            .dir
            .parent()
            .context("a node's data dir is in the cluster's root")?;
        let peers = self.peers(None);
        let mut child = lock(&node.child);
        anyhow::ensure!(child.is_none(), "node {id} is running");
        *child = Some(spawn(exe, node, &peers, root, options)?);
        Ok(())
    }

    /// Waits up to `timeout` until a live node leads its group with its engine serving: a
    /// `ListEvents` sent to each live node in turn (every 20 ms) is answered. A node that does
    /// not lead forwards it to the leader it knows, and a leader whose engine is still
    /// recovering answers `NOT_READY`, so an answer means a leader serves. `Some(elapsed)`
    /// since `since`, or `None` if none did in time.
    pub async fn await_serving_leader(
        &self,
        since: Instant,
        timeout: Duration,
    ) -> anyhow::Result<Option<Duration>> {
        use boxoffice_proto::v1 as pb;
        let bearer = boxoffice_client::Bearer::new(&self.admin_key)?;
        let events: Vec<_> = self
            .nodes
            .iter()
            .map(|n| {
                (
                    n,
                    pb::event_service_client::EventServiceClient::with_interceptor(
                        channel(n.addr),
                        bearer.clone(),
                    ),
                )
            })
            .collect();
        let deadline = Instant::now() + timeout;
        loop {
            for (node, client) in &events {
                if !node.live() {
                    continue;
                }
                let mut c = client.clone();
                let ask = c.list_events(pb::ListEventsRequest {
                    page_size: 1,
                    page_token: String::new(),
                });
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(250), ask).await {
                    return Ok(Some(since.elapsed()));
                }
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// Gives the leader's reconciliation passes (every 2 s) up to `timeout` to refund the
    /// charges that checkouts cut by a failover left without an order: waits at least two
    /// passes, then until the leader says no refund is pending (`boxoffice_refunds_pending`
    /// 0). Best effort: a leader elected since has not seen them yet; what is left unrefunded
    /// is counted by [`check_copy`]. Call it once no checkout runs any more. The charges the
    /// live nodes refunded so far (`boxoffice_refunds_total`).
    pub async fn await_refunds(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        tokio::time::sleep(2 * RECONCILE_EVERY + Duration::from_millis(200)).await;
        while Instant::now() < deadline {
            let pending = match self.leader().await {
                Some(l) => match self.node(l) {
                    Ok(n) => n.metric("boxoffice_refunds_pending").await,
                    Err(_) => None,
                },
                None => None,
            };
            if pending == Some(0.0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut refunded = 0.0;
        for n in self.nodes.iter().filter(|n| n.live()) {
            refunded += n.metric_sum("boxoffice_refunds_total").await.unwrap_or(0.0);
        }
        refunded as u64
    }

    /// Stops the live nodes: first waits (up to `settle`) until each has applied every entry
    /// of its log and all have the same (their `/metrics`), then sends them SIGTERM and waits
    /// for their drain (killing any still running after 30 s). The data dirs of the nodes
    /// stopped, to check offline ([`check_copy`]).
    pub async fn stop(&self, settle: Duration) -> anyhow::Result<Vec<(u64, PathBuf)>> {
        let live: Vec<&Node> = self.nodes.iter().filter(|n| n.live()).collect();
        let deadline = Instant::now() + settle;
        loop {
            let mut indexes = Vec::new();
            for n in &live {
                indexes.push((
                    n.metric("boxoffice_raft_last_log_index").await,
                    n.metric("boxoffice_raft_applied_index").await,
                ));
            }
            let settled = indexes.iter().all(|(log, applied)| {
                log.is_some() && log == applied && indexes[0] == (*log, *applied)
            });
            if settled || Instant::now() > deadline {
                if !settled {
                    tracing::info!(?indexes, "the live nodes did not settle on one log");
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for n in &live {
            if let Some(c) = lock(&n.child).as_ref() {
                terminate(c);
            }
        }
        let mut stopped = Vec::new();
        for n in live {
            let Some(mut c) = lock(&n.child).take() else {
                continue;
            };
            let status = wait_until(&mut c, Instant::now() + Duration::from_secs(30))?;
            match status {
                Some(s) if s.success() => stopped.push((n.id, n.dir.clone())),
                Some(s) => anyhow::bail!(
                    "node {} stopped with {s}; its log ({}) ends with:\n{}",
                    n.id,
                    n.log.display(),
                    n.log_tail()
                ),
                None => {
                    let _ = c.kill();
                    let _ = c.wait();
                    anyhow::bail!("node {} did not stop within 30 s of SIGTERM", n.id);
                }
            }
        }
        Ok(stopped)
    }

    /// `--peers` for a node: every member, and `also`.
    fn peers(&self, also: Option<u64>) -> String {
        self.nodes
            .iter()
            .filter(|n| n.member() || Some(n.id) == also)
            .map(|n| format!("{}={}", n.id, n.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Replaces node `old` by the spare, live: starts the spare, asks a member other than
    /// `old` to replace `old` by it (`ClusterService.ReplaceNode`: the spare added to every
    /// group as a voter once it caught up, then `old` removed), then stops `old` (SIGTERM). The
    /// spare's id.
    pub async fn replace(&self, old: u64) -> anyhow::Result<u64> {
        use boxoffice_proto::v1 as pb;
        let spare = self
            .nodes
            .iter()
            .find(|n| !n.member() && lock(&n.child).is_none() && n.id > self.size() as u64)
            .context("no spare node left")?;
        let root = spare
            .dir
            .parent()
            .context("a node's data dir is in the cluster's root")?;
        *lock(&spare.child) = Some(spawn(
            &self.exe,
            spare,
            &self.peers(Some(spare.id)),
            root,
            &self.options,
        )?);
        let via = self
            .nodes
            .iter()
            .find(|n| n.member() && n.id != old && n.live())
            .context("no other member to ask")?;
        let mut c = pb::cluster_service_client::ClusterServiceClient::with_interceptor(
            channel(via.addr),
            boxoffice_client::Bearer::new(&self.admin_key)?,
        );
        let req = pb::ReplaceNodeRequest {
            old_node_id: old,
            new_node_id: spare.id,
            address: spare.peer.to_string(),
        };
        c.replace_node(req).await.with_context(|| {
            format!(
                "replacing node {old} by node {} (through node {}); the new node's log ({}) ends \
                 with:\n{}",
                spare.id,
                via.id,
                spare.log.display(),
                spare.log_tail()
            )
        })?;
        spare
            .member
            .store(true, std::sync::atomic::Ordering::Release);
        let gone = self.node(old)?;
        gone.member
            .store(false, std::sync::atomic::Ordering::Release);
        let child = lock(&gone.child).take();
        if let Some(mut c) = child {
            terminate(&c);
            if wait_until(&mut c, Instant::now() + Duration::from_secs(30))?.is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        Ok(spare.id)
    }

    fn node(&self, id: u64) -> anyhow::Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .with_context(|| format!("no node {id}"))
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for n in &self.nodes {
            if let Some(mut c) = lock(&n.child).take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// What the offline check of one node's copy found.
#[derive(Debug, Default, Clone, Copy)]
pub struct CopyCheck {
    /// The engine's invariant violations.
    pub invariant_violations: u64,
    /// The reconciliation's findings (orders against payments and the sold-seat backstop),
    /// but for the refunds pending.
    pub reconciliation_findings: u64,
    /// Captured charges without a sale whose hold has ended (a checkout cut by a failover):
    /// a server refunds them after its grace; not findings, as for the server's own pass.
    pub refunds_pending: u64,
}

/// Opens a stopped node's copy of the log (its data dir) offline, as its engine would recover
/// it, and runs the engine's invariant checks and the reconciliation as the server's pass
/// does (`Engine::settle_and_reconcile`), with a grace that never passes: nothing is refunded
/// or written, and a captured charge whose hold ended without an order counts as a refund
/// pending, not a finding.
pub async fn check_copy(dir: &Path) -> anyhow::Result<CopyCheck> {
    use boxoffice_engine::raft::{StateMachine, open_node_db};
    use boxoffice_engine::{Engine, EngineConfig};
    let path = dir.to_path_buf();
    let db = tokio::task::spawn_blocking(move || open_node_db(&path))
        .await?
        .with_context(|| format!("opening {}", dir.display()))?;
    let sm = StateMachine::open(&db)?;
    let mut config = EngineConfig::new(dir);
    config.sink = Some(sm.sink());
    let engine = Engine::open(config)
        .await
        .with_context(|| format!("recovering the engine of {}", dir.display()))?;
    let mut check = CopyCheck::default();
    for v in engine.invariant_violations().await? {
        tracing::error!(dir = %dir.display(), violation = %v, "invariant violated");
        check.invariant_violations += 1;
    }
    let (findings, settlement) = engine.settle_and_reconcile(Duration::MAX).await?;
    for f in &findings {
        tracing::error!(dir = %dir.display(), finding = ?f, "reconciliation finding");
    }
    check.reconciliation_findings = findings.len() as u64;
    check.refunds_pending = settlement.pending.len() as u64;
    engine.shutdown().await;
    Ok(check)
}

/// Starts `node` as a child of `exe`, its output to its log file. The keys and secrets are
/// read from files in `root`; the `BOXOFFICE_*` variables of this process are not passed on
/// (they would conflict with the files, or point the node elsewhere).
fn spawn(
    exe: &Path,
    node: &Node,
    peers: &str,
    root: &Path,
    options: &NodeOptions,
) -> anyhow::Result<Child> {
    // Appended to: a node started again (`LocalCluster::restart`) goes on in the same file.
    let log = File::options()
        .create(true)
        .append(true)
        .open(&node.log)
        .with_context(|| format!("opening the log file {}", node.log.display()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("serve")
        .args(["--node-id", &node.id.to_string(), "--peers", peers])
        .args(["--listen", &node.addr.to_string()])
        .args(["--peer-listen", &node.peer.to_string()])
        .arg("--peer-ca")
        .arg(root.join("certs").join("ca.pem"))
        .arg("--peer-cert")
        .arg(boxoffice_gateway::certs::node_file(
            &root.join("certs"),
            node.id,
            "pem",
        ))
        .arg("--peer-key")
        .arg(boxoffice_gateway::certs::node_file(
            &root.join("certs"),
            node.id,
            "key",
        ))
        .args(["--metrics-listen", &node.metrics.to_string()])
        .arg("--data-dir")
        .arg(&node.dir)
        .arg("--cluster-secret-file")
        .arg(root.join("cluster-secret"))
        .arg("--admin-key-file")
        .arg(root.join("admin-key"))
        .arg("--client-key-file")
        .arg(root.join("client-key"))
        .arg("--token-secret-file")
        .arg(root.join("token-secret"))
        .args(["--durability", &options.durability.to_string()])
        .args(["--queue-max", &options.queue_max.to_string()])
        .args(["--in-flight-max", &options.in_flight_max.to_string()])
        // The leader's reconciliation pass every 2 s refunds a charge captured for a checkout
        // that a failover cut (its hold ended without an order) once it was seen so for a
        // second, as a server does after its grace; the run gives it time at its end
        // (`await_refunds`), then reconciles each node's copy.
        .args([
            "--reconcile-seconds",
            &RECONCILE_EVERY.as_secs().to_string(),
        ])
        .args(["--refund-grace-seconds", "1"])
        .args(["--grace-seconds", "5"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BOXOFFICE_") {
            cmd.env_remove(k);
        }
    }
    cmd.spawn()
        .with_context(|| format!("starting node {} ({} serve)", node.id, exe.display()))
}

/// SIGTERM to `child` (a drain); elsewhere than Unix, a kill.
fn terminate(child: &Child) {
    #[cfg(unix)]
    {
        let pid = rustix::process::Pid::from_child(child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    #[cfg(not(unix))]
    {
        let _ = child;
    }
}

/// Waits for `child` to exit until `deadline`: its status, or `None` if it still runs.
fn wait_until(
    child: &mut Child,
    deadline: Instant,
) -> anyhow::Result<Option<std::process::ExitStatus>> {
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if Instant::now() > deadline {
            #[cfg(not(unix))]
            {
                let _ = child.kill();
            }
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `n` distinct free loopback ports: all bound on `127.0.0.1:0` at once, then released for the
/// nodes to bind (another process could take one meanwhile; the node then fails to start, and
/// says so).
fn free_ports(n: usize) -> anyhow::Result<Vec<SocketAddr>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("finding free loopback ports")?;
    Ok(listeners
        .iter()
        .map(TcpListener::local_addr)
        .collect::<Result<Vec<_>, _>>()?)
}

/// Writes a secret to `path`, readable by this user only.
fn write_secret(path: &Path, value: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(f, "{value}").with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// `bytes` random bytes as hex.
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A lazy channel to a node (it reconnects after a failure; a dead node fails fast).
fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("a socket address is a valid URI")
        .connect_timeout(Duration::from_millis(300))
        .tcp_nodelay(true)
        .connect_lazy()
}

/// Whether the node at `channel` answers health `SERVING` within 500 ms.
async fn serving(channel: &Channel) -> bool {
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let mut c = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let ask = c.check(HealthCheckRequest {
        service: String::new(),
    });
    matches!(
        tokio::time::timeout(Duration::from_millis(500), ask).await,
        Ok(Ok(r)) if r.get_ref().status == ServingStatus::Serving as i32
    )
}

/// The Prometheus text of the node's `/metrics` at `addr`, if it answers within 500 ms.
async fn scrape(addr: SocketAddr) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    };
    tokio::time::timeout(Duration::from_millis(500), get)
        .await
        .ok()
        .flatten()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
