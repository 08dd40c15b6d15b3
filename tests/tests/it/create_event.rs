//! `CreateEvent` is idempotent (issue 12, point 7) over gRPC: by its event id, and without one
//! by its idempotency key. Retries after a deadline never make a second event.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::Duration;

use boxoffice_proto::v1 as pb;
use boxoffice_tests::Clients;
use boxoffice_tests::cases::expect_err;
use boxoffice_tests::server::TestServer;
use tonic::Code;

use crate::grpc::{all_events, event, ga};

fn keyed(key: &str, capacity: u32) -> pb::CreateEventRequest {
    let mut req = event("", vec![ga("floor", capacity, 1_000)]);
    req.idempotency_key = key.into();
    req
}

async fn event_ids(c: &mut Clients) -> Vec<String> {
    let mut ids: Vec<String> = all_events(c)
        .await
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keyed_create_without_an_event_id_makes_one_event_however_often_it_is_sent() {
    let server = TestServer::start().await;
    let mut a = server.admin();

    // Concurrent retries of one keyed create: one event, every answer names it.
    let calls = (0..8).map(|_| {
        let mut a = server.admin();
        tokio::spawn(async move { a.events.create_event(keyed("launch-42", 100)).await })
    });
    let mut ids = Vec::new();
    for call in calls {
        ids.push(call.await.unwrap().unwrap().into_inner().event_id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let id = ids.remove(0);
    assert!(id.starts_with("ev-") && id.len() == 35, "{id}");
    assert_eq!(event_ids(&mut a).await, std::slice::from_ref(&id));

    // The key with another spec is refused, and nothing changes.
    expect_err(
        a.events.create_event(keyed("launch-42", 99)).await,
        Code::FailedPrecondition,
        "IDEMPOTENCY_KEY_REUSED",
    );
    let got = a
        .events
        .get_event(pb::GetEventRequest {
            event_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.sections[0].capacity, 100);
    // A key that is not a key: refused with the field named, nothing created.
    let mut bad = keyed(&"k".repeat(129), 100);
    let r = a.events.create_event(bad.clone()).await;
    expect_err(r, Code::InvalidArgument, "INVALID_REQUEST");
    bad.idempotency_key = "tab\there".into();
    let r = a.events.create_event(bad).await.unwrap_err();
    assert!(r.message().contains("idempotency_key"), "{}", r.message());
    assert_eq!(event_ids(&mut a).await, std::slice::from_ref(&id));

    // With an event id the id is what makes a retry safe; the key plays no part.
    let mut by_id = keyed("launch-42", 100);
    by_id.event_id = "named".into();
    let named = a.events.create_event(by_id).await.unwrap().into_inner();
    assert_eq!(named.event_id, "named");

    // Creates whose callers gave up after 1 ms, then retried with their keys: exactly one
    // event per key, whatever the first attempts did.
    let keys: Vec<String> = (0..40).map(|i| format!("retry-{i}")).collect();
    for key in &keys {
        let mut req = tonic::Request::new(keyed(key, 10));
        req.set_timeout(Duration::from_millis(1));
        let _ = a.events.create_event(req).await; // may or may not have taken effect
    }
    let mut made = Vec::new();
    for key in &keys {
        made.push(
            a.events
                .create_event(keyed(key, 10))
                .await
                .unwrap()
                .into_inner()
                .event_id,
        );
    }
    made.sort();
    made.dedup();
    assert_eq!(made.len(), keys.len());
    let mut all = made.clone();
    all.push(id.clone());
    all.push("named".into());
    all.sort();
    assert_eq!(event_ids(&mut a).await, all, "no event twice");

    // The key outlives a restart: its event is durable, and so is what names it.
    let home = server.home().clone();
    server.shutdown().await;
    let server = TestServer::builder().home(home).start().await;
    let mut a = server.admin();
    let again = a
        .events
        .create_event(keyed("launch-42", 100))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.event_id, id);
    assert_eq!(event_ids(&mut a).await, all);
    server.shutdown().await;
}
