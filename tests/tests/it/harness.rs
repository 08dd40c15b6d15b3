//! The rooms themselves: a test server stops when a test fails half-way, a crash child that
//! runs no test fails its parent, and a periodic check returns as soon as its condition holds
//! and otherwise fails saying what it last saw.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use boxoffice_proto::v1 as pb;
use boxoffice_tests::child::ChildTest;
use boxoffice_tests::child_bin;
use boxoffice_tests::server::{Home, TestServer};
use boxoffice_tests::wait::{PATIENCE, periodic_check};

use crate::grpc::{event, ga};

/// The message of a panic payload.
fn message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => payload
            .downcast::<&str>()
            .map(|s| (*s).to_owned())
            .unwrap_or_default(),
    }
}

async fn has_event(server: &TestServer, id: &str) -> bool {
    server
        .admin()
        .events
        .get_event(pb::GetEventRequest {
            event_id: id.into(),
        })
        .await
        .is_ok()
}

/// The data dir is locked while a server runs on it: a second server can only open it once
/// the first has stopped. So a server that outlived its test would fail the restarts below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_server_stops_when_its_test_panics_or_drops_it() {
    let home = Home::new();
    let first = home.clone();
    let failed = tokio::spawn(async move {
        let server = TestServer::builder().home(first).start().await;
        server
            .admin()
            .events
            .create_event(event("kept", vec![ga("g", 1, 1)]))
            .await
            .unwrap();
        panic!("a test fails half-way");
    })
    .await;
    assert!(failed.unwrap_err().is_panic());
    let server = TestServer::builder().home(home.clone()).start().await;
    assert!(
        has_event(&server, "kept").await,
        "it recovers what the first acknowledged"
    );
    // A test that returns without shutting its server down: dropped, it stops too.
    drop(server);
    let server = TestServer::builder().home(home).start().await;
    assert!(has_event(&server, "kept").await);
    server.shutdown().await;
}

#[test]
fn a_crash_child_that_runs_no_role_fails_its_parent() {
    let mut child = ChildTest::spawn(child_bin!(), "no-such-role", &[]);
    let failed = std::panic::catch_unwind(AssertUnwindSafe(|| child.next_line()));
    let message = message(failed.unwrap_err());
    assert!(
        message.contains("never started the role \"no-such-role\""),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_check_returns_once_it_holds_and_fails_with_what_it_saw() {
    let mut polls = 0;
    let third = periodic_check("the third poll", PATIENCE, async || {
        polls += 1;
        if polls == 3 { Ok(polls) } else { Err(polls) }
    })
    .await;
    assert_eq!(third, 3);
    let failed = tokio::spawn(periodic_check(
        "a thing that never happens",
        Duration::from_millis(20),
        async || Err::<(), _>("still not"),
    ))
    .await;
    let message = message(failed.unwrap_err().into_panic());
    assert!(
        message.contains("a thing that never happens") && message.contains("still not"),
        "{message}"
    );
}
