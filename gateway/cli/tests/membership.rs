//! A cluster's members changed live, under load (issue 27, point 7): three nodes grow to five
//! (`boxoffice cluster add-node`: each a learner that catches up, then a voter in every group),
//! then the leader is removed (`remove-node`) and stopped. Fans hold and pay throughout, each
//! call retried on another node with its idempotency key; at the end every remaining node's copy
//! holds every acknowledged answer, and bad input changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use boxoffice_client::{Bearer, Clients};
use boxoffice_proto::v1 as pb;
use common::{ADMIN, CLIENT, Load, Node, admit_to, channel, check_copy, ga_event, leader};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_boxoffice");

/// `boxoffice cluster ARGS --target http://TARGET --admin-key ADMIN`: its stdout, or a panic
/// with what it said.
fn cluster_cli(target: &str, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("cluster")
        .args(args)
        .args([
            "--target",
            &format!("http://{target}"),
            "--admin-key",
            ADMIN,
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "cluster {args:?}: {stdout}{stderr}");
    stdout
}

fn members(
    addr: &str,
) -> pb::cluster_service_client::ClusterServiceClient<boxoffice_client::Authed> {
    pb::cluster_service_client::ClusterServiceClient::with_interceptor(
        channel(addr),
        Bearer::new(ADMIN).unwrap(),
    )
}

/// Node `i` of `lay`; node 1 serves the HTTP API at `http` too.
fn start(lay: &common::Layout, i: usize, http: &str) -> Node {
    match i {
        0 => lay.start_with(0, &["--http-listen", http]),
        _ => lay.start(i),
    }
}

/// Group 0's voters as node `addr` sees them.
async fn voters(addr: &str) -> Vec<u64> {
    let status = members(addr)
        .get_cluster_status(pb::GetClusterStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    status.groups[0].voters.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_grow_to_five_and_lose_their_leader_live_under_load() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lay = common::layout_of(tmp.path(), 6);
    lay.logs = Some(tmp.path().to_owned());
    let all_peers = lay.peers.clone();
    // The first three know only each other: they form the group.
    lay.peers = all_peers.split(',').take(3).collect::<Vec<_>>().join(",");
    // Node 1 serves the HTTP API too.
    let http = format!("127.0.0.1:{}", common::free_port());
    let mut nodes: Vec<Node> = (0..3).map(|i| start(&lay, i, &http)).collect();
    for n in &nodes {
        n.wait_ready();
    }
    let client = Bearer::new(CLIENT).unwrap();
    let clients: Arc<Vec<Clients>> = Arc::new(common::clients_of(&lay.addrs[..3]));
    let l = leader(&nodes).await;
    Clients::new(&channel(&lay.addrs[l]), &Bearer::new(ADMIN).unwrap())
        .events
        .create_event(ga_event("m", 100_000))
        .await
        .unwrap();
    let tokens = admit_to(&mut clients[l].clone(), "m", 16).await;
    let load = Load::start("m", &clients, tokens, Some(100));
    let count = load.count.clone();
    common::until_grown(&count, 200).await;

    // Bad input changes nothing: a node id 0, an address that is not HOST:PORT, an unknown
    // node, a client key.
    let before = voters(&lay.addrs[0]).await;
    for (req, code, reason) in [
        (
            pb::AddNodeRequest {
                node_id: 0,
                address: "127.0.0.1:1".into(),
            },
            Code::InvalidArgument,
            "INVALID_REQUEST",
        ),
        (
            pb::AddNodeRequest {
                node_id: 9,
                address: "nowhere".into(),
            },
            Code::InvalidArgument,
            "INVALID_REQUEST",
        ),
    ] {
        let e = members(&lay.addrs[0]).add_node(req).await.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert_eq!(boxoffice_client::reason(&e).as_deref(), Some(reason));
    }
    let e = members(&lay.addrs[1])
        .remove_node(pb::RemoveNodeRequest { node_id: 9 })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(
        boxoffice_client::reason(&e).as_deref(),
        Some("NODE_NOT_FOUND")
    );
    let mut as_client = pb::cluster_service_client::ClusterServiceClient::with_interceptor(
        channel(&lay.addrs[0]),
        client.clone(),
    );
    let e = as_client
        .add_node(pb::AddNodeRequest {
            node_id: 4,
            address: lay.addrs[3].clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert_eq!(voters(&lay.addrs[0]).await, before);

    // Over HTTP too: a client key is refused, an unknown node is NODE_NOT_FOUND.
    let (status, _) = http_call("GET", &http, "/v1/cluster", CLIENT, None).await;
    assert_eq!(status, 403);
    let (status, body) = http_call("DELETE", &http, "/v1/cluster/nodes/9", ADMIN, None).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("NODE_NOT_FOUND"), "{body}");
    let (status, body) = http_call(
        "POST",
        &http,
        "/v1/cluster/nodes/9/replace",
        ADMIN,
        Some("{\"nodeId\":8,\"address\":\"127.0.0.1:1\"}"),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("NODE_NOT_FOUND"), "{body}");
    assert_eq!(voters(&lay.addrs[0]).await, before);

    // Nodes 4 and 5 start knowing everyone; 4 is added through node 2 with the CLI (any node
    // will do), 5 through node 1's HTTP API.
    lay.peers = all_peers;
    nodes.push(lay.start(3));
    nodes.push(lay.start(4));
    let said = cluster_cli(
        &lay.addrs[1],
        &["add-node", "--node-id", "4", "--address", &lay.addrs[3]],
    );
    assert!(
        said.contains(&format!("node 4  {}  voter", lay.addrs[3])),
        "{said}"
    );
    common::until_grown(&count, 100).await;
    let add = format!("{{\"nodeId\":5,\"address\":\"{}\"}}", lay.addrs[4]);
    let (status, body) = http_call("POST", &http, "/v1/cluster/nodes", ADMIN, Some(&add)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"nodeId\":5"), "{body}");
    common::until_grown(&count, 100).await;
    let (status, body) = http_call("GET", &http, "/v1/cluster", ADMIN, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"voters\":[1,2,3,4,5]"), "{body}");
    assert_eq!(voters(&lay.addrs[0]).await, vec![1, 2, 3, 4, 5]);
    let said = cluster_cli(&lay.addrs[4], &["status"]);
    assert!(said.contains("group 0: leader"), "{said}");

    // The leader is removed (through another node) and stopped; the others go on.
    let l = leader(&nodes).await;
    let gone = nodes[l].id;
    let via = (l + 1) % 5;
    let moved = (l + 2) % 5;
    let said = cluster_cli(
        &lay.addrs[via],
        &["remove-node", "--node-id", &gone.to_string()],
    );
    assert!(!said.contains(&format!("node {gone} ")), "{said}");
    nodes[l].terminate();
    let live: Vec<usize> = (0..5).filter(|i| *i != l).collect();
    let expected: Vec<u64> = live.iter().map(|i| *i as u64 + 1).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while voters(&lay.addrs[via]).await != expected {
        assert!(
            std::time::Instant::now() < deadline,
            "node {gone} still votes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    common::until_grown(&count, 200).await;

    // A node moves: node 6 starts at a new address and replaces it.
    nodes.push(lay.start(5));
    let old_id = nodes[moved].id;
    let said = cluster_cli(
        &lay.addrs[via],
        &[
            "replace-node",
            "--old-node-id",
            &old_id.to_string(),
            "--new-node-id",
            "6",
            "--address",
            &lay.addrs[5],
        ],
    );
    assert!(
        said.contains(&format!("node 6  {}  voter", lay.addrs[5])),
        "{said}"
    );
    nodes[moved].terminate();
    let live: Vec<usize> = (0..6).filter(|i| *i != l && *i != moved).collect();
    let expected: Vec<u64> = live.iter().map(|i| *i as u64 + 1).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while voters(&lay.addrs[5]).await != expected {
        assert!(
            std::time::Instant::now() < deadline,
            "node {old_id} was not replaced by node 6"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The same call again: the old node is gone.
    let e = members(&lay.addrs[5])
        .replace_node(pb::ReplaceNodeRequest {
            old_node_id: old_id,
            new_node_id: 6,
            address: lay.addrs[5].clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        boxoffice_client::reason(&e).as_deref(),
        Some("NODE_NOT_FOUND")
    );
    common::until_grown(&count, 200).await;
    let acked = load.finish().await;
    common::until_applied(&nodes, &live).await;
    for &i in &live {
        nodes[i].terminate();
    }
    for &i in &live {
        check_copy(&lay.dirs[i], "m", &acked).await;
    }
}

/// `METHOD path` on the HTTP API at `addr` with `key` (and a JSON `body`): status and body.
async fn http_call(
    method: &str,
    addr: &str,
    path: &str,
    key: &str,
    body: Option<&str>,
) -> (u16, String) {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.unwrap_or("").to_owned(),
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// The key ids of the codes of `acked`'s orders, as the ring in `dir` verifies them (every code
/// must verify there), by order id.
fn kids_of(dir: &std::path::Path, acked: &common::Acked) -> Vec<(String, String)> {
    let ring = boxoffice_gateway::tickets::KeyRing::load(dir).unwrap();
    acked
        .confirm_answers
        .iter()
        .flat_map(|a| {
            a.codes.iter().map(|c| {
                let v = ring
                    .verify(c)
                    .unwrap_or_else(|e| panic!("{c} does not verify in {}: {e}", dir.display()));
                (a.order_id.clone(), v.kid.to_string())
            })
        })
        .collect()
}

/// The ticket key is rotated live, under load, through a follower: the new key signs the orders
/// made from its time on, every order made before keeps the codes its fan received (read back
/// through every node, before and after the leader's death), every code verifies with the
/// public keys any node mirrors, and the ring refuses a 17th key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ticket_key_rotates_live_and_no_code_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lay = common::layout_of(tmp.path(), 3);
    lay.logs = Some(tmp.path().to_owned());
    let http = format!("127.0.0.1:{}", common::free_port());
    let mut nodes: Vec<Node> = (0..3).map(|i| start(&lay, i, &http)).collect();
    for n in &nodes {
        n.wait_ready();
    }
    let clients: Arc<Vec<Clients>> = Arc::new(common::clients_of(&lay.addrs));
    let l = leader(&nodes).await;
    let admin = Clients::new(&channel(&lay.addrs[l]), &Bearer::new(ADMIN).unwrap());
    admin
        .events
        .clone()
        .create_event(ga_event("r", 100_000))
        .await
        .unwrap();
    let tokens = admit_to(&mut clients[l].clone(), "r", 16).await;
    let load = Load::start("r", &clients, tokens, Some(100));
    let count = load.count.clone();
    common::until_grown(&count, 100).await;
    let first = members(&lay.addrs[0])
        .get_cluster_status(pb::GetClusterStatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .ticket_keys;
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].signs_from_unix_ms, 0);

    // Rotated through a follower, with the CLI.
    let follower = (l + 1) % 3;
    let asked = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let said = cluster_cli(&lay.addrs[follower], &["rotate-ticket-key"]);
    let ring = members(&lay.addrs[follower])
        .get_cluster_status(pb::GetClusterStatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .ticket_keys;
    assert_eq!(ring.len(), 2, "{said}");
    let new = ring[1].clone();
    assert!(new.can_sign && new.key_id != first[0].key_id, "{new:?}");
    assert!(
        said.contains(&format!("ticket key {}", new.key_id)),
        "{said}"
    );
    let from = new.signs_from_unix_ms;
    assert!(
        (asked + 25_000..asked + 35_000).contains(&from),
        "the new key signs 30 s after it was asked for: {from} (asked at {asked})"
    );
    // The first fans stop (each went up to the per-user limit, 100); others buy once the new
    // key signs, and the leader dies.
    let mut acked = load.finish().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    tokio::time::sleep(Duration::from_millis((from + 1_000 - now).max(0) as u64)).await;
    let l = leader(&nodes).await;
    let tokens = common::admit_fans(&mut clients[l].clone(), "r", 16..32).await;
    let load = Load::start_at("r", &clients, tokens, Some(100), 16);
    let count = load.count.clone();
    common::until_grown(&count, 100).await;
    nodes[l].kill9();
    leader(&nodes).await;
    nodes[l] = start(&lay, l, &http);
    nodes[l].wait_ready();
    common::until_grown(&count, 100).await;
    let second = load.finish().await;
    acked.absorb(second);
    common::codes_as_received(&clients, &[0, 1, 2], &acked, 80).await;

    // Each order is signed with the key of its time: the old one before `from`, the new one
    // after; every node's mirrored public keys verify every code.
    common::until_applied(&nodes, &[0, 1, 2]).await;
    let mut made_at = std::collections::HashMap::new();
    for a in &acked.confirm_answers {
        let o = common::patiently(|| {
            let mut booking = clients[0].booking.clone();
            let req = pb::GetOrderRequest {
                order_id: a.order_id.clone(),
                user_id: a.request.user_id.clone(),
            };
            async move { booking.get_order(req).await }
        })
        .await;
        made_at.insert(a.order_id.clone(), o.created_at_unix_ms);
    }
    for dir in &lay.dirs {
        let kids = kids_of(dir, &acked);
        for (order, kid) in &kids {
            let want = if made_at[order] < from {
                &first[0].key_id
            } else {
                &new.key_id
            };
            assert_eq!(kid, want, "order {order} made at {}", made_at[order]);
        }
        for k in [&first[0].key_id, &new.key_id] {
            assert!(kids.iter().any(|(_, kid)| kid == k), "no code of key {k}");
        }
    }

    // Over HTTP too, with a client key refused; then the ring fills up and refuses a 17th key.
    let (status, _) = http_call(
        "POST",
        &http,
        "/v1/cluster/ticket-keys/rotate",
        CLIENT,
        None,
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) =
        http_call("POST", &http, "/v1/cluster/ticket-keys/rotate", ADMIN, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"ticketKeys\""), "{body}");
    let mut keys = 3;
    while keys < 16 {
        keys = members(&lay.addrs[2])
            .rotate_ticket_key(pb::RotateTicketKeyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ticket_keys
            .len();
    }
    let e = members(&lay.addrs[1])
        .rotate_ticket_key(pb::RotateTicketKeyRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        boxoffice_client::reason(&e).as_deref(),
        Some("TICKET_RING_FULL")
    );
    for n in &mut nodes {
        n.terminate();
    }
    for dir in &lay.dirs {
        check_copy(dir, "r", &acked).await;
    }
}

/// How many groups each node leads, as node `addr` sees it (by node id).
async fn leads(addr: &str) -> std::collections::BTreeMap<u64, usize> {
    let status = members(addr)
        .get_cluster_status(pb::GetClusterStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    status
        .nodes
        .iter()
        .map(|n| (n.node_id, n.leads.len()))
        .collect()
}

/// Leaders are spread again after a failover left one node leading two groups and another
/// none: `cluster rebalance` hands groups over, under load, losing no acknowledged answer; a
/// balanced cluster is left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_spreads_the_leaders_again_under_load() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lay = common::layout_of(tmp.path(), 3);
    lay.logs = Some(tmp.path().to_owned());
    let start = |lay: &common::Layout, i: usize| lay.start_with(i, &["--groups", "3"]);
    let mut nodes: Vec<Node> = (0..3).map(|i| start(&lay, i)).collect();
    for n in &nodes {
        n.wait_ready();
    }
    let clients: Arc<Vec<Clients>> = Arc::new(common::clients_of(&lay.addrs));
    let admin = Clients::new(&channel(&lay.addrs[0]), &Bearer::new(ADMIN).unwrap());
    admin
        .events
        .clone()
        .create_event(ga_event("b", 100_000))
        .await
        .unwrap();
    let tokens = admit_to(&mut clients[0].clone(), "b", 8).await;
    let load = Load::start("b", &clients, tokens, Some(100));
    let count = load.count.clone();
    common::until_grown(&count, 50).await;

    // Node 1 leads group 0 (each group is formed by its node); it dies and comes back: it
    // leads nothing, and another node leads two groups.
    let l0 = common::leader_of(&nodes, 0).await;
    nodes[l0].kill9();
    common::leader_of(&nodes, 0).await;
    nodes[l0] = start(&lay, l0);
    nodes[l0].wait_ready();
    common::until_grown(&count, 50).await;
    let before = leads(&lay.addrs[0]).await;
    assert_eq!(
        before.get(&(l0 as u64 + 1)),
        Some(&0),
        "the node that came back leads nothing: {before:?}"
    );
    assert!(before.values().any(|n| *n == 2), "{before:?}");

    // Rebalanced through a node that leads two groups, with the CLI.
    let busy = (0..3)
        .find(|i| before.get(&(*i as u64 + 1)) == Some(&2))
        .unwrap();
    let said = cluster_cli(&lay.addrs[busy], &["rebalance"]);
    let after = leads(&lay.addrs[busy]).await;
    assert!(after.values().all(|n| *n == 1), "{after:?}\n{said}");
    for g in 0..3 {
        assert!(said.contains(&format!("group {g}: leader ")), "{said}");
    }
    common::until_grown(&count, 50).await;
    // Balanced: nothing moves.
    let terms: Vec<u64> = members(&lay.addrs[0])
        .get_cluster_status(pb::GetClusterStatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .groups
        .iter()
        .map(|g| g.term)
        .collect();
    let again = members(&lay.addrs[1])
        .rebalance(pb::RebalanceRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        again.groups.iter().map(|g| g.term).collect::<Vec<_>>(),
        terms,
        "a balanced cluster is left as it is"
    );
    common::until_grown(&count, 50).await;
    let acked = load.finish().await;
    common::until_applied(&nodes, &[0, 1, 2]).await;
    for n in &mut nodes {
        n.terminate();
    }
    let g = boxoffice_gateway::node::forward::group_of_event("b", 3);
    for dir in &lay.dirs {
        check_copy(&boxoffice_gateway::node::group_dir(dir, g), "b", &acked).await;
    }
}
