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
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| match i {
            0 => lay.start_with(0, &["--http-listen", &http]),
            _ => lay.start(i),
        })
        .collect();
    for n in &nodes {
        n.wait_ready();
    }
    let client = Bearer::new(CLIENT).unwrap();
    let clients: Arc<Vec<Clients>> = Arc::new(
        lay.addrs[..3]
            .iter()
            .map(|a| Clients::new(&channel(a), &client))
            .collect(),
    );
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
