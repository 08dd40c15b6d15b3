//! Three Raft nodes talking over real gRPC on loopback (the cluster port, behind the cluster
//! secret), each with its log in its own sled database (issue 13, second step): acknowledged
//! batches reach every node; the leader's death (its server and Raft stopped) loses nothing
//! acknowledged and the two others go on; a node with another secret is refused and cannot
//! take part.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use boxoffice_engine::raft::{
    Batch, LogStore, NodeDb, Raft, StateMachine, VoteGuard, harness, open_node_db,
};
use boxoffice_gateway::node::peers::{self, ClusterSecret, Peers};
use openraft::BasicNode;
use tokio::sync::oneshot;

struct Node {
    raft: Raft,
    sm: StateMachine,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
    _db: NodeDb,
}

impl Node {
    async fn kill(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.raft.shutdown().await.unwrap();
        self.served.abort();
        let _ = self.served.await;
    }
}

/// Binds a cluster port for each of `ids` (their addresses are known before any node starts).
async fn bind(ids: &[u64]) -> BTreeMap<u64, tokio::net::TcpListener> {
    let mut out = BTreeMap::new();
    for id in ids {
        out.insert(
            *id,
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        );
    }
    out
}

async fn start(
    id: u64,
    dir: &std::path::Path,
    listener: tokio::net::TcpListener,
    addrs: &BTreeMap<u64, SocketAddr>,
    secret: &str,
) -> Node {
    let db = open_node_db(dir).unwrap();
    let sm = StateMachine::open(&db).unwrap();
    let guard = VoteGuard::open(&db).unwrap();
    let addrs = addrs.iter().map(|(id, a)| (*id, a.to_string())).collect();
    let peers = Peers::new(addrs, ClusterSecret::new(secret).unwrap());
    let raft = Raft::new(
        id,
        boxoffice_engine::raft::config(50).expect("a valid Raft config"),
        peers,
        LogStore::open(&db).unwrap(),
        sm.clone(),
    )
    .await
    .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = {
        let (raft, secret) = (raft.clone(), ClusterSecret::new(secret).unwrap());
        tokio::spawn(async move {
            let _ = peers::serve(listener, raft, guard, secret, async move {
                let _ = stopped.await;
            })
            .await;
        })
    };
    Node {
        raft,
        sm,
        stop: Some(stop),
        served,
        _db: db,
    }
}

fn batch(n: u64) -> Batch {
    harness::one_record("section/e/s", n + 1, n.to_be_bytes().to_vec())
}

fn rafts(nodes: &BTreeMap<u64, Node>) -> BTreeMap<u64, Raft> {
    nodes.iter().map(|(id, n)| (*id, n.raft.clone())).collect()
}

async fn leader_of(nodes: &BTreeMap<u64, Node>) -> u64 {
    harness::leader(&rafts(nodes)).await.unwrap()
}

async fn write(nodes: &BTreeMap<u64, Node>, range: std::ops::Range<u64>, acked: &mut Vec<Batch>) {
    for n in range {
        let b = batch(n);
        harness::write(&rafts(nodes), &b).await.unwrap();
        acked.push(b);
    }
}

async fn all_hold(nodes: &BTreeMap<u64, Node>, acked: &[Batch]) {
    let sms = nodes.iter().map(|(id, n)| (*id, n.sm.clone())).collect();
    harness::all_hold(&sms, acked).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_grpc_lose_nothing_acknowledged_when_the_leader_dies() {
    let dirs: BTreeMap<u64, tempfile::TempDir> = (1..=3)
        .map(|id| (id, tempfile::tempdir().unwrap()))
        .collect();
    let listeners = bind(&[1, 2, 3]).await;
    let addrs: BTreeMap<u64, SocketAddr> = listeners
        .iter()
        .map(|(id, l)| (*id, l.local_addr().unwrap()))
        .collect();
    let mut nodes = BTreeMap::new();
    for (id, l) in listeners {
        nodes.insert(id, start(id, dirs[&id].path(), l, &addrs, "s3cret").await);
    }
    let members: BTreeMap<u64, BasicNode> = addrs
        .iter()
        .map(|(id, a)| (*id, BasicNode::new(a.to_string())))
        .collect();
    nodes[&1].raft.initialize(members).await.unwrap();

    let mut acked = Vec::new();
    write(&nodes, 0..20, &mut acked).await;
    all_hold(&nodes, &acked).await;

    let dead = leader_of(&nodes).await;
    nodes.remove(&dead).unwrap().kill().await;
    write(&nodes, 20..40, &mut acked).await;
    all_hold(&nodes, &acked).await;
    for n in nodes.into_values() {
        n.kill().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_cluster_secret_is_refused() {
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let listeners = bind(&[1, 2]).await;
    let addrs: BTreeMap<u64, SocketAddr> = listeners
        .iter()
        .map(|(id, l)| (*id, l.local_addr().unwrap()))
        .collect();
    let mut listeners = listeners.into_iter();
    let (_, l1) = listeners.next().unwrap();
    let (_, l2) = listeners.next().unwrap();
    let one = start(1, dirs[0].path(), l1, &addrs, "right").await;
    let two = start(2, dirs[1].path(), l2, &addrs, "wrong").await;
    let members: BTreeMap<u64, BasicNode> = addrs
        .iter()
        .map(|(id, a)| (*id, BasicNode::new(a.to_string())))
        .collect();
    one.raft.initialize(members).await.unwrap();
    // Two voters, each refusing the other's calls: no majority, so no leader ever, and nothing
    // applied (with the same secret, the three-node test elects one in well under a second).
    tokio::time::sleep(Duration::from_secs(2)).await;
    for n in [&one, &two] {
        let m = n.raft.metrics().borrow().clone();
        assert_eq!(m.current_leader, None, "node {} sees a leader", m.id);
        assert!(harness::records(&n.sm, "section/e/s").is_empty());
    }
    // And a plain call with the wrong secret is refused outright.
    let mut client =
        boxoffice_proto::cluster::raft_client::RaftClient::connect(format!("http://{}", addrs[&1]))
            .await
            .unwrap();
    let mut req = tonic::Request::new(boxoffice_proto::cluster::RaftMessage {
        payload: vec![],
        group: 0,
        groups: 0,
    });
    req.metadata_mut()
        .insert("authorization", "Bearer wrong".parse().unwrap());
    let refused = client.vote(req).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    one.kill().await;
    two.kill().await;
}
