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
    let mut lay = common::layout_of(tmp.path(), 5);
    lay.logs = Some(tmp.path().to_owned());
    let all_peers = lay.peers.clone();
    // The first three know only each other: they form the group.
    lay.peers = all_peers.split(',').take(3).collect::<Vec<_>>().join(",");
    let mut nodes: Vec<Node> = (0..3).map(|i| lay.start(i)).collect();
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

    // Nodes 4 and 5 start knowing everyone, and are added through node 2 (any node will do).
    lay.peers = all_peers;
    nodes.push(lay.start(3));
    nodes.push(lay.start(4));
    for (i, id) in [(3, "4"), (4, "5")] {
        let said = cluster_cli(
            &lay.addrs[1],
            &["add-node", "--node-id", id, "--address", &lay.addrs[i]],
        );
        assert!(
            said.contains(&format!("node {id}  {}  voter", lay.addrs[i])),
            "{said}"
        );
        common::until_grown(&count, 100).await;
    }
    assert_eq!(voters(&lay.addrs[0]).await, vec![1, 2, 3, 4, 5]);
    let said = cluster_cli(&lay.addrs[4], &["status"]);
    assert!(said.contains("group 0: leader"), "{said}");

    // The leader is removed (through another node) and stopped; the others go on.
    let l = leader(&nodes).await;
    let gone = nodes[l].id;
    let via = (l + 1) % 5;
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
    let acked = load.finish().await;
    common::until_applied(&nodes, &live).await;
    for &i in &live {
        nodes[i].terminate();
    }
    for &i in &live {
        check_copy(&lay.dirs[i], "m", &acked).await;
    }
}
