//! A cluster's log at the default level: three `boxoffice serve` processes on loopback (as
//! `flash-sale --nodes 3` starts them), their stderr counted line by line. Healthy, they write
//! less than a line a second; with a follower killed, the leader (which calls it) says once that
//! it is down and then less than a line a second (openraft retries it every half second in
//! every group, and wrote about ten lines a second of it before), the other follower nothing;
//! when it comes back, one line on the leader says so.
//! The nodes' level is the default: run this without `RUST_LOG` (CI does).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

use std::path::Path;
use std::time::Duration;

use boxoffice_drill::cluster::{LocalCluster, NodeOptions};

/// The window the lines are counted over.
const WINDOW: Duration = Duration::from_secs(10);

/// A node's log so far, by lines.
fn lines(root: &Path, id: u64) -> Vec<String> {
    std::fs::read_to_string(root.join(format!("node{id}.log")))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The lines each of `ids` writes during `WINDOW` from now.
async fn written_in_window(root: &Path, ids: &[u64]) -> Vec<(u64, Vec<String>)> {
    let before: Vec<usize> = ids.iter().map(|&id| lines(root, id).len()).collect();
    tokio::time::sleep(WINDOW).await;
    ids.iter()
        .zip(before)
        .map(|(&id, n)| (id, lines(root, id).split_off(n)))
        .collect()
}

/// Fewer lines than seconds in the window, for each node.
fn under_one_a_second(what: &str, written: &[(u64, Vec<String>)]) {
    for (id, new) in written {
        assert!(
            (new.len() as u64) < WINDOW.as_secs(),
            "{what}: node {id} wrote {} lines in {} s:\n{}",
            new.len(),
            WINDOW.as_secs(),
            new.join("\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_a_dead_peer_logs_under_a_line_a_second() {
    assert!(
        std::env::var_os("RUST_LOG").is_none(),
        "this test counts the default level's lines: unset RUST_LOG"
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cluster");
    let options = NodeOptions {
        durability: boxoffice_engine::Durability::Sync,
        queue_max: 1_000,
        in_flight_max: 1_024,
    };
    let exe = Path::new(env!("CARGO_BIN_EXE_boxoffice"));
    let cluster = LocalCluster::start(exe, Some(&root), &options, 3)
        .await
        .unwrap();
    let leader = cluster
        .await_leader(Duration::from_secs(30))
        .await
        .expect("a leader");
    // Healthy: nothing a second.
    under_one_a_second("healthy", &written_in_window(&root, &[1, 2, 3]).await);

    // A follower killed: after the warning that it is down, quiet.
    let dead = leader % 3 + 1;
    let survivors: Vec<u64> = (1..=3).filter(|&id| id != dead).collect();
    let before: Vec<usize> = survivors.iter().map(|&id| lines(&root, id).len()).collect();
    cluster.kill(dead).unwrap();
    let window = written_in_window(&root, &survivors).await;
    under_one_a_second("a peer down", &window);
    let down = format!("peer {dead} is down: no answer for 2 s");
    // The leader calls the dead follower (heartbeats), so it says so, once; the other
    // follower never calls it, and says nothing.
    for (&id, n) in survivors.iter().zip(before) {
        let since_kill = lines(&root, id).split_off(n);
        assert_eq!(
            since_kill.iter().filter(|l| l.contains(&down)).count(),
            usize::from(id == leader),
            "node {id} (the leader: {leader}) on node {dead} down:\n{}",
            since_kill.join("\n")
        );
        assert!(
            !since_kill.iter().any(|l| l.contains("openraft")),
            "openraft's routine messages stay at debug: node {id}:\n{}",
            since_kill.join("\n")
        );
    }

    // Back: one line on the leader once it answers again.
    let before = lines(&root, leader).len();
    cluster.restart(exe, dead, &options).unwrap();
    let back = format!("peer {dead} answers again after ");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    {
        let (id, n) = (leader, before);
        let told = loop {
            let since = lines(&root, id).split_off(n);
            let told = since.iter().filter(|l| l.contains(&back)).count();
            if told > 0 || tokio::time::Instant::now() > deadline {
                break since;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(
            told.iter().filter(|l| l.contains(&back)).count(),
            1,
            "node {id} says once that node {dead} is back:\n{}",
            told.join("\n")
        );
    }
}
