//! What the tests of `boxoffice serve` clusters share (`tests/cluster.rs` on loopback,
//! `tests/netns.rs` in network namespaces): starting and stopping the nodes, finding the leader
//! through `/metrics`, the fans that hold and confirm with idempotency keys (retrying a failed
//! call on another node with the same key), the waiting room, and the offline check of a
//! stopped node's data dir.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use boxoffice_client::Clients;
use boxoffice_proto::v1 as pb;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

pub const ADMIN: &str = "adm-cluster-test";
pub const CLIENT: &str = "cli-cluster-test";

/// A free loopback port for a node to bind, never the same one twice in this process.
///
/// Not one the kernel picks for `127.0.0.1:0`: those come from the ephemeral range
/// (`ip_local_port_range`, 32768..60999 here), where the kernel may hand the same port to the next
/// such bind, or to the source end of any outgoing connection, before the node binds it (one CI run
/// gave two nodes the same metrics port). These come from below that range, are checked free by
/// binding them, and are remembered.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let port = rand::random_range(20_000..32_000u16);
        if given.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
}

/// One `boxoffice serve` child process.
pub struct Node {
    pub id: u64,
    pub metrics: String,
    pub child: Option<Child>,
    lines: mpsc::Receiver<String>,
}

impl Node {
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("node {} never said `ready: serving`", self.id));
            if line.contains("ready: serving") {
                return;
            }
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap(); // SIGKILL: no drain, no flush
            c.wait().unwrap();
        }
    }

    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let ok = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status()
                .unwrap();
            assert!(ok.success());
            let status = c.wait().unwrap();
            assert!(status.success(), "node {} stopped with {status:?}", self.id);
        }
    }

    /// Whether the process has exited (it is then reaped), with its status.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().unwrap()
    }

    /// Waits (20 s at most) until the node says it keeps its group's state warm
    /// (`boxoffice_raft_warm`).
    pub async fn until_warm(&self) {
        for _ in 0..200 {
            if self.metric("boxoffice_raft_warm{group=\"0\"}").await == Some(1.0) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("node {} did not warm up within 20 s", self.id);
    }

    /// The node's `/metrics` answer, if it answers (within 2 s).
    pub async fn scrape(&self) -> Option<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let scrape = async {
            let mut s = tokio::net::TcpStream::connect(&self.metrics).await.ok()?;
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
                .await
                .ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).await.ok()?;
            Some(out)
        };
        tokio::time::timeout(Duration::from_secs(2), scrape)
            .await
            .ok()?
    }

    /// The node's series `name` (with its labels, if any, as exported), if it answers (within
    /// 2 s).
    pub async fn metric(&self, name: &str) -> Option<f64> {
        self.scrape()
            .await?
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }
}

impl Node {
    /// Spawns `cmd` (a `boxoffice serve` command line) as node `id` whose metrics are at
    /// `metrics`, reading its stdout line by line (its stderr goes where `cmd` says).
    pub fn spawn(id: u64, metrics: &str, cmd: &mut Command) -> Node {
        let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Node {
            id,
            metrics: metrics.to_owned(),
            child: Some(child),
            lines,
        }
    }

    /// Waits (`within` at most) until the node says `ready: serving`; `Err` says what happened
    /// instead: it exited (with its status and what it printed), or it stayed silent.
    pub fn ready_or_exit(&mut self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        let mut said = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains("ready: serving") => return Ok(()),
                Ok(line) => said.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.take().map(|mut c| c.wait());
                    return Err(format!(
                        "node {} exited before it was ready ({status:?}); it said: {said:?}",
                        self.id
                    ));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "node {} was not ready within {within:?}; it said: {said:?}",
                        self.id
                    ));
                }
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Where three nodes live: the cluster secret's file, their gRPC and metrics addresses,
/// `--peers`, their data dirs, and (in `tests/netns.rs`) the network namespace each runs in and
/// the folder of their logs.
pub struct Layout {
    pub secret: PathBuf,
    pub addrs: Vec<String>,
    pub metrics: Vec<String>,
    pub peers: String,
    pub dirs: Vec<PathBuf>,
    /// The namespace node `i` runs in (`ip netns exec`); empty: this one.
    pub netns: Vec<Option<String>>,
    /// Where node `i`'s stderr goes (`node{i+1}.log`, appended); `None`: nowhere.
    pub logs: Option<PathBuf>,
    /// Flags node `i` starts with besides its own (the peer port's, with [`Layout::on_peer_tls`]).
    pub flags: Vec<Vec<String>>,
    /// Variables every node starts with besides the test's own (`RUST_LOG`).
    pub env: Vec<(String, String)>,
}

/// Three local nodes on free loopback ports, under `root`.
pub fn layout(root: &Path) -> Layout {
    layout_of(root, 3)
}

/// `n` local nodes on free loopback ports, under `root`.
pub fn layout_of(root: &Path, n: usize) -> Layout {
    let addrs: Vec<String> = (0..n)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let metrics = (0..n)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    layout_at(root, addrs, metrics)
}

/// Nodes at the given gRPC and metrics addresses (one each), under `root`.
pub fn layout_at(root: &Path, addrs: Vec<String>, metrics: Vec<String>) -> Layout {
    let secret = root.join("cluster-secret");
    std::fs::write(&secret, "cluster-test-secret\n").unwrap();
    let peers = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let dirs = (1..=addrs.len())
        .map(|i| root.join(format!("node{i}")))
        .collect();
    let netns = vec![None; addrs.len()];
    let flags = vec![Vec::new(); addrs.len()];
    Layout {
        secret,
        addrs,
        metrics,
        peers,
        dirs,
        netns,
        logs: None,
        flags,
        env: Vec::new(),
    }
}

impl Layout {
    /// The nodes talk to each other on peer ports of their own over mutual TLS, under a cluster
    /// CA made in `certs` (as `boxoffice cluster certs` makes it, unless the nodes' certificates
    /// are there already): `--peers` names the peer
    /// ports, and each node starts with `--peer-listen`, `--peer-ca`, `--peer-cert` and
    /// `--peer-key`. The peer ports, node 1 first.
    pub fn on_peer_tls(&mut self, certs: &Path) -> Vec<String> {
        use boxoffice_gateway::certs::{self, NodeHosts, Validity};
        let n = self.addrs.len();
        let hosts: Vec<NodeHosts> = (1..=n as u64)
            .map(|id| NodeHosts {
                id,
                hosts: vec!["127.0.0.1".into()],
            })
            .collect();
        if !certs::node_file(certs, n as u64, "pem").exists() {
            certs::make(certs, &hosts, Validity::days(30)).unwrap();
        }
        let peer_addrs: Vec<String> = (0..n)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        self.peers = peer_addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let path = |p: PathBuf| p.display().to_string();
        for (i, flags) in self.flags.iter_mut().enumerate() {
            let id = i as u64 + 1;
            flags.extend([
                "--peer-listen".to_owned(),
                peer_addrs[i].clone(),
                "--peer-ca".to_owned(),
                path(certs.join("ca.pem")),
                "--peer-cert".to_owned(),
                path(certs::node_file(certs, id, "pem")),
                "--peer-key".to_owned(),
                path(certs::node_file(certs, id, "key")),
            ]);
        }
        peer_addrs
    }

    /// Starts node `i` (0-based; its id is `i + 1`).
    pub fn start(&self, i: usize) -> Node {
        self.start_with(i, &[])
    }

    /// Starts nodes `0..n` and waits until each serves.
    pub fn start_ready(&self, n: usize) -> Vec<Node> {
        let nodes: Vec<Node> = (0..n).map(|i| self.start(i)).collect();
        for node in &nodes {
            node.wait_ready();
        }
        nodes
    }

    /// Starts a single node (no cluster: the embedded default's `serve`) on node `i`'s
    /// addresses and data dir.
    pub fn start_single(&self, i: usize) -> Node {
        self.start_single_with(i, &[])
    }

    /// [`Layout::start_single`] with `extra` flags (and the layout's variables).
    pub fn start_single_with(&self, i: usize, extra: &[&str]) -> Node {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_boxoffice"));
        cmd.args(["serve", "--listen", &self.addrs[i]])
            .args(["--metrics-listen", &self.metrics[i]])
            .arg("--data-dir")
            .arg(&self.dirs[i])
            .args(["--admin-key", ADMIN, "--client-key", CLIENT])
            .args(["--token-secret", "cluster-test-token-secret"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stderr(Stdio::null());
        Node::spawn(i as u64 + 1, &self.metrics[i], &mut cmd)
    }

    /// Starts node `i` with `extra` flags.
    pub fn start_with(&self, i: usize, extra: &[&str]) -> Node {
        let id = i as u64 + 1;
        let bin = env!("CARGO_BIN_EXE_boxoffice");
        let mut cmd = match &self.netns[i] {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin]);
                c
            }
            None => Command::new(bin),
        };
        let stderr = match &self.logs {
            Some(dir) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join(format!("node{id}.log")))
                    .unwrap(),
            ),
            None => Stdio::null(),
        };
        let mut child = cmd
            .args([
                "serve",
                "--node-id",
                &id.to_string(),
                "--peers",
                &self.peers,
            ])
            .args([
                "--listen",
                &self.addrs[i],
                "--metrics-listen",
                &self.metrics[i],
            ])
            .arg("--cluster-secret-file")
            .arg(&self.secret)
            .arg("--data-dir")
            .arg(&self.dirs[i])
            .args(["--admin-key", ADMIN, "--client-key", CLIENT])
            .args(["--token-secret", "cluster-test-token-secret"])
            // Small, so the group's log is purged behind snapshots during the run.
            .args(["--snapshot-every", "200"])
            .args(&self.flags[i])
            .args(extra)
            .env("RUST_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Node {
            id,
            metrics: self.metrics[i].clone(),
            child: Some(child),
            lines,
        }
    }
}

/// The live node that says it leads (group 0), waiting up to 20 s for one.
pub async fn leader(nodes: &[Node]) -> usize {
    leader_of(nodes, 0).await
}

/// The live node that says it leads group `g`, waiting up to 20 s for one.
pub async fn leader_of(nodes: &[Node], g: u32) -> usize {
    let series = format!("boxoffice_raft_leader{{group=\"{g}\"}}");
    for _ in 0..1_000 {
        for (i, n) in nodes.iter().enumerate() {
            if n.child.is_some() && n.metric(&series).await == Some(1.0) {
                return i;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no leader of group {g} within 20 s");
}

/// The nodes that say they lead group 0 now (each asked once).
pub async fn claiming_leaders(nodes: &[Node]) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        if n.child.is_some() && n.metric("boxoffice_raft_leader{group=\"0\"}").await == Some(1.0) {
            out.push(i);
        }
    }
    out
}

/// The one node that leads group 0 once exactly one says it leads and every other live node
/// knows a leader, waiting up to `within`.
pub async fn sole_leader(nodes: &[Node], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let leaders = claiming_leaders(nodes).await;
        if let [l] = leaders[..] {
            let mut known = true;
            for (i, n) in nodes.iter().enumerate() {
                if i != l
                    && n.child.is_some()
                    && n.metric("boxoffice_raft_leader_known{group=\"0\"}").await != Some(1.0)
                {
                    known = false;
                }
            }
            if known {
                return l;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no sole leader within {within:?} (nodes saying they lead: {leaders:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn channel(addr: &str) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(300))
        .tcp_nodelay(true)
        .connect_lazy()
}

/// Whether a failed call may be retried on another node with the same idempotency key: the
/// node is down, has no leader yet, or the leader changed under the call; or the key's first
/// attempt is still running on the new leader (`IDEMPOTENCY_KEY_IN_FLIGHT`: retry shortly).
pub fn transient(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    ) || (s.code() == Code::Internal && s.message().contains("transport"))
        || boxoffice_client::reason(s).as_deref() == Some("IDEMPOTENCY_KEY_IN_FLIGHT")
}

/// How long one attempt may take on one node, and how long a call is retried in all.
#[derive(Clone, Copy, Debug)]
pub struct Patience {
    pub per_call: Duration,
    pub total: Duration,
}

impl Patience {
    /// The loopback cluster's: 5 s per attempt, 30 s in all.
    pub const CLUSTER: Patience = Patience {
        per_call: Duration::from_secs(5),
        total: Duration::from_secs(30),
    };
}

/// What is counted of the attempts of [`retrying`]'s calls.
pub trait Tally: Send + Sync {
    /// An attempt failed transiently with `error` (`None`: it took too long): the call is
    /// retried on the next node.
    fn failed(&self, error: Option<&tonic::Status>);
    /// An attempt was answered for good (a success, or an error that is final).
    fn answered(&self) {}
}

/// Counts the retries.
impl Tally for AtomicU64 {
    fn failed(&self, _: Option<&tonic::Status>) {
        self.fetch_add(1, Ordering::Relaxed);
    }
}

/// Calls `call` on node `first`, then the next nodes in turn, while it fails transiently (up to
/// 30 s, 5 s per attempt); counts the retries.
pub async fn retrying<T, F, Fut>(
    clients: &[Clients],
    first: usize,
    tally: &(impl Tally + ?Sized),
    call: F,
) -> Result<T, tonic::Status>
where
    F: FnMut(Clients) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    retrying_on(clients, first, tally, Patience::CLUSTER, call)
        .await
        .map(|(t, _)| t)
}

/// [`retrying`] with its `patience`; also says which node (index in `clients`) answered.
pub async fn retrying_on<T, F, Fut>(
    clients: &[Clients],
    first: usize,
    tally: &(impl Tally + ?Sized),
    patience: Patience,
    mut call: F,
) -> Result<(T, usize), tonic::Status>
where
    F: FnMut(Clients) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let deadline = Instant::now() + patience.total;
    let mut at = first;
    loop {
        let node = at % clients.len();
        let c = clients[node].clone();
        let error = match tokio::time::timeout(patience.per_call, call(c)).await {
            Ok(Ok(r)) => {
                tally.answered();
                return Ok((r.into_inner(), node));
            }
            Ok(Err(s)) if !transient(&s) => {
                tally.answered();
                return Err(s);
            }
            Ok(Err(s)) => Some(s),
            Err(_) => None,
        };
        if Instant::now() > deadline {
            return Err(tonic::Status::unavailable(format!(
                "no node answered within {:?}",
                patience.total
            )));
        }
        tally.failed(error.as_ref());
        at += 1;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A keyed `Hold` answered for good, kept to be replayed.
#[derive(Clone, Debug)]
pub struct HoldAnswer {
    pub request: pb::HoldRequest,
    /// The node (index) that answered.
    pub node: usize,
    /// The hold (id, expiry), or the error's reason.
    pub answer: Result<(String, i64), String>,
}

/// A keyed `Confirm` answered for good, kept to be replayed.
#[derive(Clone, Debug)]
pub struct ConfirmAnswer {
    pub request: pb::ConfirmRequest,
    pub node: usize,
    pub order_id: String,
    /// The codes of its tickets, as the fan received them.
    pub codes: Vec<String>,
}

/// The codes of an order's tickets.
pub fn codes(o: &pb::Order) -> Vec<String> {
    o.tickets.iter().map(|t| t.code.clone()).collect()
}

/// Every node of `live` shows a sample of the acknowledged orders (about `max`) with the codes
/// their fans received: whichever node signs now, after failovers and a wiped node's lead,
/// the codes are the cluster key ring's and never change.
pub async fn codes_as_received(clients: &[Clients], live: &[usize], acked: &Acked, max: usize) {
    assert!(!acked.confirm_answers.is_empty(), "no order to read back");
    let tally = AtomicU64::new(0);
    let step = (acked.confirm_answers.len() / max.max(1)).max(1);
    for a in acked.confirm_answers.iter().step_by(step) {
        for &n in live {
            let o = retrying(std::slice::from_ref(&clients[n]), 0, &tally, |mut c| {
                let req = pb::GetOrderRequest {
                    order_id: a.order_id.clone(),
                    user_id: a.request.user_id.clone(),
                };
                async move { c.booking.get_order(req).await }
            })
            .await
            .unwrap_or_else(|s| panic!("order {} read through node {}: {s:?}", a.order_id, n + 1));
            assert_eq!(
                codes(&o),
                a.codes,
                "order {} read through node {} shows other codes than its fan received",
                a.order_id,
                n + 1
            );
        }
    }
}

/// What the clients saw.
#[derive(Default)]
pub struct Acked {
    /// Acknowledged holds: (hold id, user).
    pub holds: Vec<(String, String)>,
    /// Acknowledged orders: (order id, hold id, user).
    pub orders: Vec<(String, String, String)>,
    /// Holds released (the release acknowledged, or answered `HOLD_NOT_ACTIVE` on a retry
    /// after a lost answer): (hold id, user).
    pub released: Vec<(String, String)>,
    /// Every keyed `Hold` answered for good (successes and `USER_LIMIT` refusals).
    pub hold_answers: Vec<HoldAnswer>,
    /// Every keyed `Confirm` answered.
    pub confirm_answers: Vec<ConfirmAnswer>,
    /// What a fan saw that its own record says cannot be: a hold granted over the per-user
    /// limit, refused under it, or a release of a held hold refused.
    pub violations: Vec<String>,
}

impl Acked {
    /// Adds what another load saw.
    pub fn absorb(&mut self, other: Acked) {
        self.holds.extend(other.holds);
        self.orders.extend(other.orders);
        self.released.extend(other.released);
        self.hold_answers.extend(other.hold_answers);
        self.confirm_answers.extend(other.confirm_answers);
        self.violations.extend(other.violations);
    }
}

/// A client of each node at `addrs`, with the client key.
pub fn clients_of(addrs: &[String]) -> Vec<Clients> {
    let client = boxoffice_client::Bearer::new(CLIENT).unwrap();
    addrs
        .iter()
        .map(|a| Clients::new(&channel(a), &client))
        .collect()
}

/// Joins `user` to the line of `event`: the queue token.
pub async fn join(c: &mut Clients, event: &str, user: &str) -> String {
    let room = c.room.clone();
    patiently(|| {
        let mut room = room.clone();
        let req = join_request(event, user);
        async move { room.join(req).await }
    })
    .await
    .queue_token
}

/// `call`'s answer, the call made again while it fails transiently ([`transient`]: an
/// election, a leader not yet confirmed, a node starting), for 30 s at most: what any client
/// does with `NOT_READY` and `UNAVAILABLE`.
pub async fn patiently<T, F, Fut>(mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match call().await {
            Ok(r) => return r.into_inner(),
            Err(s) if transient(&s) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(s) => panic!("{s:?}"),
        }
    }
}

fn join_request(event: &str, user: &str) -> pb::JoinRequest {
    pb::JoinRequest {
        event_id: event.into(),
        user_id: user.into(),
        session_id: "s".into(),
        ..Default::default()
    }
}

/// The standing of a queue token.
pub async fn status(c: &mut Clients, token: &str) -> pb::QueueStatus {
    let room = c.room.clone();
    patiently(|| {
        let mut room = room.clone();
        let req = pb::GetStatusRequest {
            queue_token: token.to_owned(),
        };
        async move { room.get_status(req).await }
    })
    .await
}

/// An admission token for each of `fans` users (`fan-{w}`) to event `c` (join, then poll until
/// admitted).
pub async fn admit(c: &mut Clients, fans: usize) -> Vec<String> {
    admit_to(c, "c", fans).await
}

/// An admission token to `event` for each of `fans` users.
pub async fn admit_to(c: &mut Clients, event: &str, fans: usize) -> Vec<String> {
    admit_fans(c, event, 0..fans).await
}

/// The admission tokens of fans `fans` (users `fan-{w}`) to `event`, in order.
pub async fn admit_fans(c: &mut Clients, event: &str, fans: std::ops::Range<usize>) -> Vec<String> {
    let mut tokens = Vec::new();
    for w in fans {
        tokens.push(admitted(c, event, &format!("fan-{w}")).await);
    }
    tokens
}

/// `user`'s admission token to `event` (join, then poll until admitted).
pub async fn admitted(c: &mut Clients, event: &str, user: &str) -> String {
    let q = join(c, event, user).await;
    loop {
        let s = status(c, &q).await;
        if s.state == pb::QueueState::Admitted as i32 {
            return s.admission_token;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `count` has grown by `by` (60 s at most).
pub async fn until_grown(count: &AtomicU64, by: u64) {
    let from = count.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count.load(Ordering::Relaxed) < from + by {
        assert!(
            Instant::now() < deadline,
            "the load stalled at {}",
            count.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A load on a cluster: one [`Fan`] per admission token, holding any place of `event` (at most
/// `limit` each, see [`Fan`]) until [`Load::finish`].
pub struct Load {
    pub stop: Arc<AtomicBool>,
    pub acked: Arc<Mutex<Acked>>,
    /// Acknowledged holds and confirms.
    pub count: Arc<AtomicU64>,
    /// Calls retried on another node.
    pub retried: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts the fans.
    pub fn start(
        event: &str,
        clients: &Arc<Vec<Clients>>,
        tokens: Vec<String>,
        limit: Option<u32>,
    ) -> Load {
        Load::start_at(event, clients, tokens, limit, 0)
    }

    /// Starts the fans `first..` (users `fan-{w}`, admitted with `tokens` in order).
    pub fn start_at(
        event: &str,
        clients: &Arc<Vec<Clients>>,
        tokens: Vec<String>,
        limit: Option<u32>,
        first: usize,
    ) -> Load {
        let (stop, acked) = (Arc::new(AtomicBool::new(false)), Arc::default());
        let (count, retried) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let tasks = tokens
            .into_iter()
            .enumerate()
            .map(|(w, token)| {
                tokio::spawn(
                    Fan {
                        w: first + w,
                        event: event.into(),
                        clients: clients.clone(),
                        token,
                        sections: vec![String::new()],
                        limit,
                        spare_users: 0,
                        patience: Patience::CLUSTER,
                        stop: Arc::clone(&stop),
                        acked: Arc::clone(&acked),
                        count: count.clone(),
                        tally: retried.clone(),
                    }
                    .run(),
                )
            })
            .collect();
        Load {
            stop,
            acked,
            count,
            retried,
            tasks,
        }
    }

    /// Stops the fans; what they saw acknowledged.
    pub async fn finish(self) -> Acked {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        std::mem::take(&mut *self.acked.lock().unwrap())
    }
}

/// One fan: user `fan-{w}` (admitted with `token`) holding one place at a time in `event`
/// with idempotency keys, every second hold confirmed, each failed call retried on the next
/// node with the same key, until `stop`.
///
/// Without a `limit` that is all (the fan stays far below the event's per-user limit). With
/// the event's per-user `limit`, the fan goes up to it: it confirms every second hold while it
/// owns less than half the limit, keeps the others, and holds on until a hold is refused with
/// `USER_LIMIT`; then it releases its oldest hold and goes on as a new user (`fan-{w}-{k}`,
/// joining the line and admitted on the way) while it has `spare_users` left. Anything its own
/// record says cannot be (a hold granted over the limit or refused under it) goes to
/// [`Acked::violations`].
pub struct Fan<T: Tally + 'static> {
    pub w: usize,
    pub event: String,
    pub clients: Arc<Vec<Clients>>,
    pub token: String,
    /// The sections held in turn (`""`: any).
    pub sections: Vec<String>,
    pub limit: Option<u32>,
    pub spare_users: usize,
    pub patience: Patience,
    pub stop: Arc<AtomicBool>,
    pub acked: Arc<Mutex<Acked>>,
    /// Acknowledged holds and confirms.
    pub count: Arc<AtomicU64>,
    pub tally: Arc<T>,
}

impl<T: Tally + 'static> Fan<T> {
    pub async fn run(self) {
        let w = self.w;
        let mut user = format!("fan-{w}");
        let mut token = self.token.clone();
        let mut spare = self.spare_users;
        let mut next_user = 1;
        // The current user's holds still held, oldest first, and the places it owns.
        let mut held: VecDeque<String> = VecDeque::new();
        let mut owned = 0u32;
        let half = self.limit.map_or(u32::MAX, |l| l / 2);
        for i in 0u64.. {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let req = pb::HoldRequest {
                event_id: self.event.clone(),
                user_id: user.clone(),
                admission_token: token.clone(),
                idempotency_key: format!("h-{w}-{i}"),
                selection: Some(pb::hold_request::Selection::BestAvailable(
                    pb::BestAvailable {
                        section_id: self.sections[i as usize % self.sections.len()].clone(),
                        quantity: 1,
                    },
                )),
                access_code: String::new(),
            };
            let used = owned + held.len() as u32;
            // The attempts, so the node that answered an error is known: the first one, then
            // one more per failed attempt.
            let first = w + i as usize;
            let tries = AtomicUsize::new(0);
            let answer = retrying_on(
                &self.clients,
                first,
                &*self.tally,
                self.patience,
                |mut c| {
                    tries.fetch_add(1, Ordering::Relaxed);
                    let req = req.clone();
                    async move { c.booking.hold(req).await }
                },
            )
            .await;
            let (hold, node) = match answer {
                Ok(h) => h,
                Err(s)
                    if self.limit.is_some()
                        && boxoffice_client::reason(&s).as_deref() == Some("USER_LIMIT") =>
                {
                    {
                        let mut acked = self.acked.lock().unwrap();
                        if used < self.limit.unwrap() {
                            acked.violations.push(format!(
                                "{user}: hold {i} refused with USER_LIMIT while it holds and \
                                 owns {used} of {:?}: {s:?}",
                                self.limit
                            ));
                        }
                        acked.hold_answers.push(HoldAnswer {
                            request: req,
                            node: (first + tries.load(Ordering::Relaxed) - 1) % self.clients.len(),
                            answer: Err("USER_LIMIT".into()),
                        });
                    }
                    self.count.fetch_add(1, Ordering::Relaxed);
                    if let Some(oldest) = held.pop_front() {
                        self.release(&user, &oldest, first).await;
                    }
                    if owned >= half && spare > 0 {
                        spare -= 1;
                        user = format!("fan-{w}-{next_user}");
                        next_user += 1;
                        token = self.admitted(&user).await;
                        held.clear();
                        owned = 0;
                    }
                    continue;
                }
                Err(s) => panic!("fan {w}: hold {i} failed for good: {s:?}"),
            };
            {
                let mut acked = self.acked.lock().unwrap();
                if let Some(limit) = self.limit
                    && used >= limit
                {
                    acked.violations.push(format!(
                        "{user}: hold {i} ({}) granted while it holds and owns {used} of \
                         {limit}",
                        hold.hold_id
                    ));
                }
                acked.holds.push((hold.hold_id.clone(), user.clone()));
                acked.hold_answers.push(HoldAnswer {
                    request: req,
                    node,
                    answer: Ok((hold.hold_id.clone(), hold.expires_at_unix_ms)),
                });
            }
            self.count.fetch_add(1, Ordering::Relaxed);
            if i % 2 == 0 && owned < half {
                let req = pb::ConfirmRequest {
                    hold_id: hold.hold_id.clone(),
                    user_id: user.clone(),
                    payment_token: "tok_visa".into(),
                    idempotency_key: format!("c-{w}-{i}"),
                };
                let (order, node) = retrying_on(
                    &self.clients,
                    w + i as usize + 1,
                    &*self.tally,
                    self.patience,
                    |mut c| {
                        let req = req.clone();
                        async move { c.booking.confirm(req).await }
                    },
                )
                .await
                .unwrap_or_else(|s| panic!("fan {w}: confirm {i} failed for good: {s:?}"));
                let mut acked = self.acked.lock().unwrap();
                acked
                    .orders
                    .push((order.order_id.clone(), hold.hold_id, user.clone()));
                acked.confirm_answers.push(ConfirmAnswer {
                    request: req,
                    node,
                    codes: codes(&order),
                    order_id: order.order_id,
                });
                drop(acked);
                owned += 1;
                self.count.fetch_add(1, Ordering::Relaxed);
            } else if self.limit.is_some() {
                held.push_back(hold.hold_id);
            }
        }
    }

    /// Releases `hold` of `user`: a `HOLD_NOT_ACTIVE` answer after a failed attempt is the
    /// release that attempt made (its answer lost); on the first attempt it is a violation.
    async fn release(&self, user: &str, hold: &str, first: usize) {
        let tries = AtomicUsize::new(0);
        let req = pb::ReleaseRequest {
            hold_id: hold.to_owned(),
            user_id: user.to_owned(),
        };
        let answer = retrying_on(
            &self.clients,
            first,
            &*self.tally,
            self.patience,
            |mut c| {
                tries.fetch_add(1, Ordering::Relaxed);
                let req = req.clone();
                async move { c.booking.release(req).await }
            },
        )
        .await;
        let mut acked = self.acked.lock().unwrap();
        match answer {
            Ok(_) => {}
            Err(s)
                if boxoffice_client::reason(&s).as_deref() == Some("HOLD_NOT_ACTIVE")
                    && tries.load(Ordering::Relaxed) > 1 => {}
            Err(s) => {
                acked
                    .violations
                    .push(format!("{user}: release of its hold {hold} refused: {s:?}"));
                return;
            }
        }
        acked.released.push((hold.to_owned(), user.to_owned()));
        drop(acked);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Joins `user` to the line (retried on the next node while it fails) and waits until it
    /// is admitted: its admission token.
    async fn admitted(&self, user: &str) -> String {
        let at = self.w;
        let req = join_request(&self.event, user);
        let (ticket, _) = retrying_on(&self.clients, at, &*self.tally, self.patience, |mut c| {
            let req = req.clone();
            async move { c.room.join(req).await }
        })
        .await
        .unwrap_or_else(|s| panic!("{user}: join failed for good: {s:?}"));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let req = pb::GetStatusRequest {
                queue_token: ticket.queue_token.clone(),
            };
            let (s, _) = retrying_on(&self.clients, at, &*self.tally, self.patience, |mut c| {
                let req = req.clone();
                async move { c.room.get_status(req).await }
            })
            .await
            .unwrap_or_else(|s| panic!("{user}: status failed for good: {s:?}"));
            if s.state == pb::QueueState::Admitted as i32 {
                return s.admission_token;
            }
            assert!(Instant::now() < deadline, "{user} not admitted: {s:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Opens a stopped node's copy of the log offline and checks it holds everything acknowledged
/// of `event`: every hold (released ones released), every order, one seat sold per order, every
/// section's places conserved (available + held + sold = capacity), reconciliation clean.
pub async fn check_copy(dir: &Path, event: &str, acked: &Acked) {
    use boxoffice_engine::raft::{StateMachine, open_node_db};
    use boxoffice_engine::{Engine, EngineConfig, EventId, HoldId, HoldStatus, UserId};
    let db = open_node_db(dir).unwrap();
    let sm = StateMachine::open(&db).unwrap();
    let mut config = EngineConfig::new(dir);
    config.sink = Some(sm.sink());
    let engine = Engine::open(config).await.unwrap();
    for (hold, user) in &acked.holds {
        engine
            .get_hold_of(&HoldId::from(hold.as_str()), &UserId::from(user.as_str()))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{}: acknowledged hold {hold} is missing: {e}",
                    dir.display()
                )
            });
    }
    for (hold, user) in &acked.released {
        let h = engine
            .get_hold_of(&HoldId::from(hold.as_str()), &UserId::from(user.as_str()))
            .await
            .unwrap();
        assert_eq!(
            h.status,
            HoldStatus::Released,
            "{}: released hold {hold}",
            dir.display()
        );
    }
    let orders: BTreeSet<String> = engine
        .orders()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.order_id.to_string())
        .collect();
    for (order, _, _) in &acked.orders {
        assert!(
            orders.contains(order),
            "{}: acknowledged order {order} is missing",
            dir.display()
        );
    }
    let event = engine.event(&EventId::from(event)).unwrap();
    let sold: u32 = event.sections.iter().map(|s| s.sold).sum();
    assert_eq!(
        sold as usize,
        orders.len(),
        "{}: one seat per order",
        dir.display()
    );
    for s in &event.sections {
        assert_eq!(
            s.available + s.held + s.sold,
            s.capacity,
            "{}: places of section {} conserved",
            dir.display(),
            s.spec.section_id
        );
    }
    let findings = engine.reconcile().await.unwrap();
    assert!(findings.is_empty(), "{}: {findings:?}", dir.display());
    engine.shutdown().await;
}

/// Waits (20 s at most) until every node of `live` has applied the same last log index of
/// group 0, then one metrics period more (they are sampled every 500 ms), so the figures are
/// the last ones.
pub async fn until_applied(nodes: &[Node], live: &[usize]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = BTreeMap::new();
    loop {
        last.clear();
        for &i in live {
            let log = nodes[i]
                .metric("boxoffice_raft_last_log_index{group=\"0\"}")
                .await;
            let applied = nodes[i]
                .metric("boxoffice_raft_applied_index{group=\"0\"}")
                .await;
            last.insert(i, (log, applied));
        }
        let first = last.values().next().copied();
        if last
            .values()
            .all(|v| Some(*v) == first && v.0.is_some() && v.0 == v.1)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the nodes did not apply the same last entry within 20 s: (last log index, applied \
             index) by node index: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
}

/// An event of one general-admission section of `seats`, admitting fans at once.
pub fn ga_event(id: &str, seats: u32) -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        event_id: id.into(),
        name: format!("event {id}"),
        sections: vec![pb::SectionSpec {
            section_id: "ga".into(),
            name: "GA".into(),
            price_cents: 100,
            layout: Some(pb::section_spec::Layout::GeneralAdmissionCapacity(seats)),
            price_tiers: Vec::new(),
        }],
        hold_ttl_seconds: 600,
        per_user_limit: 100,
        admit_rate_per_second: 100_000,
        admission_window_seconds: 3_600,
        ..Default::default()
    }
}
