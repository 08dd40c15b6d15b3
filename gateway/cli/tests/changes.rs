//! The change stream on a cluster (issue 28, points 3 and 4): three `boxoffice serve` processes
//! under a load of holds, orders and releases; `boxoffice changes --follow` reads from the
//! leader, the leader is killed with SIGKILL, and the command goes on from its last cursor on
//! another node. What it printed is exactly the log as the survivors hold it, read from the
//! first change: no gap, nothing twice, every acknowledged hold, order and release in it, and
//! both survivors hold the same stream under the same cursors. And on one node, during a
//! `flash-sale --target`, the command prints every change the sale made.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boxoffice_client::{Bearer, Clients};
use boxoffice_proto::v1 as pb;
use common::{ADMIN, Layout, Load, admit_to, channel, clients_of, ga_event, layout, leader};

/// Every change node `addr` holds, from the first.
async fn log_of(addr: &str) -> Vec<pb::Change> {
    let mut c = Clients::new(&channel(addr), &Bearer::new(ADMIN).unwrap());
    let mut s = c
        .changes
        .watch_changes(pb::WatchChangesRequest {
            after_cursor: "0".into(),
            event_id: String::new(),
            follow: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(change) = s.message().await.unwrap() {
        out.push(change);
    }
    out
}

/// The lines `boxoffice changes` printed so far, as (cursor, kind).
fn printed(path: &std::path::Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            (
                v["cursor"].as_str().unwrap().to_owned(),
                v["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_stream_follows_a_cluster_across_a_leader_kill_with_no_gap() {
    let tmp = tempfile::tempdir().unwrap();
    let lay = layout(tmp.path());
    let Layout { addrs, .. } = &lay;
    let mut nodes = lay.start_ready(3);
    let l = leader(&nodes).await;
    Clients::new(&channel(&addrs[l]), &Bearer::new(ADMIN).unwrap())
        .events
        .create_event(ga_event("chg", 100_000))
        .await
        .unwrap();
    // The command follows from the leader first, the other nodes after it.
    let targets: Vec<String> = (0..3)
        .map(|k| format!("http://{}", addrs[(l + k) % 3]))
        .collect();
    let out = tmp.path().join("changes.ndjson");
    let err = tmp.path().join("changes.err");
    let mut follower = Command::new(env!("CARGO_BIN_EXE_boxoffice"))
        .args(["changes", "--follow", "--after", "0", "--target"])
        .arg(targets.join(","))
        .env("BOXOFFICE_STREAM_KEY", ADMIN)
        .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&err).unwrap()))
        .spawn()
        .unwrap();

    let clients = Arc::new(clients_of(addrs));
    let tokens = admit_to(&mut clients[l].clone(), "chg", 8).await;
    let load = Load::start("chg", &clients, tokens, None);
    common::until_grown(&load.count, 150).await;
    let heard_before_kill = printed(&out).len();
    nodes[l].kill9();
    let new = leader(&nodes).await;
    common::until_grown(&load.count, 150).await;
    let mut acked = load.finish().await;
    assert!(acked.violations.is_empty(), "{:?}", acked.violations);
    // A few holds not paid for are given back, through the new leader.
    let paid: std::collections::BTreeSet<&String> =
        acked.orders.iter().map(|(_, h, _)| h).collect();
    let unpaid: Vec<(String, String)> = acked
        .holds
        .iter()
        .filter(|(h, _)| !paid.contains(h))
        .take(5)
        .cloned()
        .collect();
    let tally = std::sync::atomic::AtomicU64::new(0);
    for (hold_id, user_id) in unpaid {
        common::retrying(&clients, new, &tally, |mut c| {
            let req = pb::ReleaseRequest {
                hold_id: hold_id.clone(),
                user_id: user_id.clone(),
            };
            async move { c.booking.release(req).await }
        })
        .await
        .unwrap();
        acked.released.push((hold_id, user_id));
    }

    // The log as the new leader holds it: every acknowledged change is in it.
    let log = log_of(&addrs[new]).await;
    let of_kind = |k: &str, id: fn(&pb::Change) -> String| -> std::collections::BTreeSet<String> {
        log.iter().filter(|c| c.kind == k).map(id).collect()
    };
    let placed = of_kind("hold_placed", |c| c.hold.clone().unwrap().hold_id);
    let released = of_kind("hold_released", |c| c.hold.clone().unwrap().hold_id);
    let orders = of_kind("order_created", |c| c.order.clone().unwrap().order_id);
    for (h, _) in &acked.holds {
        assert!(
            placed.contains(h),
            "hold {h} was acknowledged but is not in the stream"
        );
    }
    for (h, _) in &acked.released {
        assert!(
            released.contains(h),
            "release of {h} acknowledged, not in the stream"
        );
    }
    for (o, _, _) in &acked.orders {
        assert!(
            orders.contains(o),
            "order {o} acknowledged, not in the stream"
        );
    }
    assert!(!acked.orders.is_empty() && !acked.released.is_empty());

    // The command caught up, across the kill, and printed exactly the log: no gap, no repeat.
    let deadline = Instant::now() + Duration::from_secs(60);
    while printed(&out).len() < log.len() {
        assert!(
            Instant::now() < deadline,
            "the command printed {} of {} changes: {}",
            printed(&out).len(),
            log.len(),
            std::fs::read_to_string(&err).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = follower.kill();
    let _ = follower.wait();
    let got = printed(&out);
    let log = log_of(&addrs[new]).await;
    let want: Vec<(String, String)> = log
        .iter()
        .map(|c| (c.cursor.clone(), c.kind.clone()))
        .collect();
    assert!(got.len() <= want.len());
    assert_eq!(
        got,
        want[..got.len()],
        "what it printed is the log, in order"
    );
    assert!(
        heard_before_kill > 0 && got.len() > heard_before_kill,
        "it printed before the kill ({heard_before_kill}) and after ({})",
        got.len()
    );
    let said = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(said.contains("resuming after"), "it moved on: {said}");
    // The other survivor holds the same stream under the same cursors.
    let other = (0..3).find(|&i| i != l && i != new).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let theirs = log_of(&addrs[other]).await;
        if theirs.len() >= log.len() {
            assert_eq!(theirs[..log.len()], log[..]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {} did not catch up",
            other + 1
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for n in &mut nodes {
        n.terminate();
    }
}

/// `boxoffice changes --follow` (a stream key) during a sale that `boxoffice flash-sale
/// --target` plays against one `boxoffice serve`: it prints every change, and its holds,
/// releases, expiries and orders are the sale's (the sale's own reader's, which the report
/// checks against the seats).
#[test]
fn boxoffice_changes_follows_a_sale_and_counts_what_the_sale_did() {
    let tmp = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let target = format!("http://127.0.0.1:{port}");
    let mut serve = Command::new(env!("CARGO_BIN_EXE_boxoffice"));
    serve
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(tmp.path().join("data"))
        .args(["--admin-key", ADMIN, "--client-key", "cli-key"])
        .args(["--stream-key", "stream-key", "--token-secret", "secret"])
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null());
    let mut server = common::Node::spawn(1, "", &mut serve);
    server.wait_ready();
    let out = tmp.path().join("changes.ndjson");
    let mut follower = Command::new(env!("CARGO_BIN_EXE_boxoffice"))
        .args(["changes", "--follow", "--target", &target])
        .env("BOXOFFICE_STREAM_KEY", "stream-key")
        .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let report = tmp.path().join("report.json");
    let sale = Command::new(env!("CARGO_BIN_EXE_boxoffice"))
        .args(["flash-sale", "--target", &target, "--admin-key", ADMIN])
        .args(["--fans", "3000", "--seats", "400", "--arrival-seconds", "1"])
        .args(["--hold-ttl-seconds", "2"])
        .arg("--json")
        .arg(&report)
        .output()
        .unwrap();
    assert!(
        sale.status.success(),
        "{}{}",
        String::from_utf8_lossy(&sale.stdout),
        String::from_utf8_lossy(&sale.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let sale_saw = &report["changes_followed"];
    assert_eq!(sale_saw["adds_up"], true, "{report}");
    let want = sale_saw["changes"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (printed(&out).len() as u64) < want {
        assert!(
            Instant::now() < deadline,
            "printed {} of {want}",
            printed(&out).len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = follower.kill();
    let _ = follower.wait();
    let lines = printed(&out);
    let count = |k: &str| lines.iter().filter(|(_, kind)| kind == k).count() as u64;
    assert_eq!(lines.len() as u64, want, "every change, once");
    for (kind, field) in [
        ("hold_placed", "holds"),
        ("hold_released", "released"),
        ("hold_expired", "expired"),
        ("order_created", "orders"),
    ] {
        assert_eq!(count(kind), sale_saw[field].as_u64().unwrap(), "{kind}");
    }
    assert_eq!(
        count("order_created"),
        report["confirms"].as_u64().unwrap(),
        "an order for each confirm the fans were told of"
    );
    assert!(count("hold_expired") > 0);
    server.terminate();
}
