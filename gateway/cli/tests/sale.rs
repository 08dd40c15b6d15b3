//! Sale controls on a cluster and from the command line (issue 28, points 1 and 4): three
//! `boxoffice serve` processes; `boxoffice sale pause` sent to a follower is forwarded to the
//! leader, replicated, and in force on every node; the leader is killed with SIGKILL while the
//! sale is paused; the new leader keeps it paused (and its rate), and its resume extends the
//! paused fan's hold by the pause; a bad command exits 1 with the reason and changes nothing.
//! And a pause in the middle of a burst of holds through every node acknowledges none after it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

mod common;

use std::process::Command;
use std::time::Duration;

use boxoffice_client::{Bearer, Clients};
use boxoffice_proto::v1 as pb;
use common::{ADMIN, Layout, admitted, channel, ga_event, layout, leader, retrying};

fn hold(user: &str, token: &str) -> pb::HoldRequest {
    pb::HoldRequest {
        event_id: "ctl".into(),
        user_id: user.into(),
        admission_token: token.into(),
        idempotency_key: String::new(),
        selection: Some(pb::hold_request::Selection::BestAvailable(
            pb::BestAvailable {
                section_id: "ga".into(),
                quantity: 1,
            },
        )),
    }
}

/// `boxoffice sale ARGS` against `target`: its exit code and its output.
fn sale(target: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_boxoffice"))
        .arg("sale")
        .args(args)
        .args(["--target", &format!("http://{target}")])
        .env("BOXOFFICE_ADMIN_KEY", ADMIN)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn event(clients: &[Clients], first: usize) -> pb::Event {
    let tally = std::sync::atomic::AtomicU64::new(0);
    retrying(clients, first, &tally, |mut c| async move {
        c.events
            .get_event(pb::GetEventRequest {
                event_id: "ctl".into(),
            })
            .await
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_is_forwarded_replicated_and_outlives_the_leader() {
    let tmp = tempfile::tempdir().unwrap();
    let lay = layout(tmp.path());
    let Layout { addrs, .. } = &lay;
    let mut nodes = lay.start_ready(3);
    let admin = Bearer::new(ADMIN).unwrap();
    let clients = common::clients_of(addrs);
    let l = leader(&nodes).await;
    let follower = (l + 1) % 3;
    Clients::new(&channel(&addrs[follower]), &admin)
        .events
        .create_event(ga_event("ctl", 100))
        .await
        .unwrap();
    let token = admitted(&mut clients[follower].clone(), "ctl", "ann").await;
    let held = clients[follower]
        .clone()
        .booking
        .hold(hold("ann", &token))
        .await
        .unwrap()
        .into_inner();

    // Paused through a follower, with a new rate: every node refuses holds.
    let (code, out, err) = sale(&addrs[follower], &["pause", "ctl", "--admit-rate", "7"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("sale PAUSED") && out.contains("admit rate 7/s"),
        "{out}"
    );
    for (i, c) in clients.iter().enumerate() {
        let refused = c.clone().booking.hold(hold("ann", &token)).await;
        let s = refused.unwrap_err();
        assert_eq!(
            boxoffice_client::reason(&s).as_deref(),
            Some("SALE_PAUSED"),
            "node {i}: {s:?}"
        );
    }
    let paused = event(&clients, follower).await;
    // A bad command changes nothing and says why.
    let (code, _, err) = sale(&addrs[follower], &["set", "ctl", "--admit-rate", "-3"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("INVALID_REQUEST"), "{err}");
    let (code, _, err) = sale(&addrs[follower], &["pause", "nope"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("EVENT_NOT_FOUND"), "{err}");

    // The leader dies while paused: the new one keeps the pause and the rate.
    let l = leader(&nodes).await;
    nodes[l].kill9();
    let new = leader(&nodes).await;
    let kept = event(&clients, new).await;
    assert_eq!(
        (kept.sale_state(), kept.admit_rate_per_second),
        (pb::SaleState::Paused, 7)
    );
    assert_eq!(
        kept.sale_state_changed_at_unix_ms,
        paused.sale_state_changed_at_unix_ms
    );
    let tally = std::sync::atomic::AtomicU64::new(0);
    let refused = retrying(&clients, new, &tally, |mut c| {
        let token = token.clone();
        async move { c.booking.hold(hold("ann", &token)).await }
    })
    .await
    .unwrap_err();
    assert_eq!(
        boxoffice_client::reason(&refused).as_deref(),
        Some("SALE_PAUSED")
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    // Resumed on the new leader: ann's hold lives the pause's length longer.
    let (code, out, err) = sale(&addrs[new], &["resume", "ctl"]);
    assert_eq!(code, 0, "{out}{err}");
    let resumed = event(&clients, new).await;
    let pause_ms = resumed.sale_state_changed_at_unix_ms - paused.sale_state_changed_at_unix_ms;
    assert!(pause_ms >= 1_500);
    let now = retrying(&clients, new, &tally, |mut c| {
        let hold_id = held.hold_id.clone();
        async move {
            c.booking
                .get_hold(pb::GetHoldRequest {
                    hold_id,
                    user_id: "ann".into(),
                })
                .await
        }
    })
    .await
    .unwrap();
    let moved = now.expires_at_unix_ms - held.expires_at_unix_ms;
    assert!(
        (pause_ms - 1_000..=pause_ms + 1_000).contains(&moved),
        "the hold moved by {moved} ms, the pause lasted {pause_ms} ms"
    );
    retrying(&clients, new, &tally, |mut c| {
        let token = token.clone();
        async move { c.booking.hold(hold("ann", &token)).await }
    })
    .await
    .unwrap();
    // The killed node comes back and sees the sale as the group does.
    nodes[l] = lay.start(l);
    nodes[l].wait_ready();
    let seen = event(&clients, l).await;
    assert_eq!(seen.sale_state(), pb::SaleState::Open);
    for n in &mut nodes {
        n.terminate();
    }
}

/// Places held or sold in event `e`, as `clients[first]` (or the next node) answers.
async fn taken(clients: &[Clients], first: usize, e: &str) -> u32 {
    let tally = std::sync::atomic::AtomicU64::new(0);
    let ev = retrying(clients, first, &tally, |mut c| {
        let event_id = e.to_owned();
        async move { c.events.get_event(pb::GetEventRequest { event_id }).await }
    })
    .await
    .unwrap();
    ev.sections.iter().map(|s| s.held + s.sold).sum()
}

/// A pause in the middle of a burst on a cluster: twelve fans' agents hold one place after
/// another through every node (each until its limit); `boxoffice sale pause` through a
/// follower; once it has answered, no hold is placed (the places taken stay as they were when
/// it answered, and the agents still holding hear `SALE_PAUSED`); the resume lets them hold
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_in_a_burst_on_a_cluster_acknowledges_no_hold_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let lay = layout(tmp.path());
    let Layout { addrs, .. } = &lay;
    let mut nodes = lay.start_ready(3);
    let l = leader(&nodes).await;
    let follower = (l + 1) % 3;
    let spec = ga_event("burst", 50_000);
    Clients::new(&channel(&addrs[l]), &Bearer::new(ADMIN).unwrap())
        .events
        .create_event(spec)
        .await
        .unwrap();
    let clients = std::sync::Arc::new(common::clients_of(addrs));
    let tokens = common::admit_to(&mut clients[l].clone(), "burst", 12).await;
    let agents: Vec<_> = tokens
        .into_iter()
        .enumerate()
        .map(|(a, token)| {
            let clients = clients.clone();
            tokio::spawn(async move {
                let tally = std::sync::atomic::AtomicU64::new(0);
                let (mut held, mut refusals, mut paused) = (0u32, 0u32, false);
                for i in 0usize.. {
                    let mut req = hold(&format!("fan-{a}"), &token);
                    req.event_id = "burst".into();
                    req.idempotency_key = format!("b-{a}-{i}");
                    match retrying(&clients, a + i, &tally, |mut c| {
                        let req = req.clone();
                        async move { c.booking.hold(req).await }
                    })
                    .await
                    {
                        Ok(_) => held += 1,
                        Err(s)
                            if boxoffice_client::reason(&s).as_deref() == Some("SALE_PAUSED") =>
                        {
                            paused = true;
                            refusals += 1;
                            if refusals == 10 {
                                break;
                            }
                        }
                        // The event's limit, 100 places a fan: this agent is done.
                        Err(s) if boxoffice_client::reason(&s).as_deref() == Some("USER_LIMIT") => {
                            break;
                        }
                        Err(s) => panic!("agent {a}: hold {i} failed otherwise: {s:?}"),
                    }
                }
                (held, paused)
            })
        })
        .collect();
    while taken(&clients, l, "burst").await < 240 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (code, out, err) = sale(&addrs[follower], &["pause", "burst"]);
    assert_eq!(code, 0, "{out}{err}");
    let at_pause = taken(&clients, l, "burst").await;
    let (mut acknowledged, mut told) = (0, 0);
    for a in agents {
        let (held, paused) = a.await.unwrap();
        acknowledged += held;
        told += u32::from(paused);
    }
    assert!(told > 0, "the agents heard SALE_PAUSED");
    assert_eq!(
        taken(&clients, l, "burst").await,
        at_pause,
        "no place was taken after the pause answered"
    );
    assert!(
        acknowledged <= at_pause && at_pause >= 240,
        "{acknowledged} holds acknowledged, {at_pause} places taken at the pause"
    );
    let (code, out, err) = sale(&addrs[follower], &["resume", "burst"]);
    assert_eq!(code, 0, "{out}{err}");
    let token = admitted(&mut clients[follower].clone(), "burst", "late").await;
    let mut late = hold("late", &token);
    late.event_id = "burst".into();
    let tally = std::sync::atomic::AtomicU64::new(0);
    retrying(&clients, follower, &tally, |mut c| {
        let req = late.clone();
        async move { c.booking.hold(req).await }
    })
    .await
    .unwrap();
    assert_eq!(taken(&clients, l, "burst").await, at_pause + 1);
    for n in &mut nodes {
        n.terminate();
    }
}
