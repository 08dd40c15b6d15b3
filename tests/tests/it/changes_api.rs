//! `ChangeService.WatchChanges` over gRPC and `GET /v1/changes` over HTTP (issue 28, point 3):
//! an admin or stream key only; every change in order with cursors to resume from, an event's
//! alone, a following reader told of a new change, NDJSON and server-sent events; bad and
//! expired cursors get their reasons. The engine's side is in `changes`, the cluster's in the
//! CLI's `cluster_changes`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::Duration;

use boxoffice_proto::v1 as pb;
use boxoffice_tests::cases::expect_err;
use boxoffice_tests::server::{ADMIN, CLIENT, STREAM, TestServer};
use http::StatusCode;
use tonic::Code;

use crate::grpc::{admitted, best, event, ga};

fn watch(after: &str, event_id: &str, follow: bool) -> pb::WatchChangesRequest {
    pb::WatchChangesRequest {
        after_cursor: after.into(),
        event_id: event_id.into(),
        follow,
    }
}

/// Every change the stream sends now (it ends once it has sent them).
async fn all(c: &mut boxoffice_tests::Clients, after: &str, event_id: &str) -> Vec<pb::Change> {
    let mut s = c
        .changes
        .watch_changes(watch(after, event_id, false))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(c) = s.message().await.unwrap() {
        out.push(c);
    }
    out
}

fn kinds(changes: &[pb::Change]) -> Vec<&str> {
    changes.iter().map(|c| c.kind.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_stream_over_grpc_and_http() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    let mut s = server.clients(STREAM);
    a.events
        .create_event(event("chg", vec![ga("g", 100, 1_500)]))
        .await
        .unwrap();
    let token = admitted(&mut c, &clock, "chg", "ann").await;
    let paid = c
        .booking
        .hold(best("chg", "ann", &token, "g", 2, "h1"))
        .await
        .unwrap()
        .into_inner();
    let order = c
        .booking
        .confirm(pb::ConfirmRequest {
            hold_id: paid.hold_id.clone(),
            user_id: "ann".into(),
            payment_token: "tok_visa".into(),
            idempotency_key: "c1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let given_back = c
        .booking
        .hold(best("chg", "ann", &token, "g", 1, "h2"))
        .await
        .unwrap()
        .into_inner();
    c.booking
        .release(pb::ReleaseRequest {
            hold_id: given_back.hold_id.clone(),
            user_id: "ann".into(),
        })
        .await
        .unwrap();
    a.events
        .create_event(event("other", vec![ga("g", 5, 1)]))
        .await
        .unwrap();

    // A stream key reads it (an admin key too); a client key may not, nor may a stream key
    // do anything else.
    let changes = all(&mut s, "", "").await;
    assert_eq!(
        kinds(&changes),
        [
            "event_created",
            "hold_placed",
            "order_created",
            "hold_placed",
            "hold_released",
            "event_created"
        ]
    );
    assert_eq!(all(&mut a, "", "").await, changes);
    let denied = c.changes.watch_changes(watch("", "", false)).await;
    assert_eq!(denied.unwrap_err().code(), Code::PermissionDenied);
    let denied = s
        .events
        .get_event(pb::GetEventRequest {
            event_id: "chg".into(),
        })
        .await;
    assert_eq!(denied.unwrap_err().code(), Code::PermissionDenied);
    // What each change carries: the event, the hold, the order without its codes.
    let created = changes[0].event_created.as_ref().unwrap();
    assert_eq!(
        (created.name.as_str(), created.sections[0].capacity),
        ("Event chg", 100)
    );
    assert_eq!(changes[1].hold.as_ref().unwrap().hold_id, paid.hold_id);
    assert_eq!(
        changes[1].hold.as_ref().unwrap().status(),
        pb::HoldStatus::Held
    );
    let o = changes[2].order.as_ref().unwrap();
    assert_eq!(
        (o.order_id.as_str(), o.amount_cents),
        (order.order_id.as_str(), 3_000)
    );
    assert_eq!(
        o.tickets.iter().map(|t| &t.ticket_id).collect::<Vec<_>>(),
        order
            .tickets
            .iter()
            .map(|t| &t.ticket_id)
            .collect::<Vec<_>>()
    );
    assert!(o.tickets.iter().all(|t| t.code.is_empty()), "never codes");
    assert_eq!(
        changes[4].hold.as_ref().unwrap().status(),
        pb::HoldStatus::Released
    );
    assert!(changes.iter().all(|c| c.at_unix_ms > 0));
    // Resuming after a change gives what came after it; one event's changes alone.
    assert_eq!(all(&mut s, &changes[1].cursor, "").await, changes[2..]);
    assert_eq!(all(&mut s, &changes[5].cursor, "").await, []);
    assert_eq!(all(&mut s, "", "chg").await, changes[..5]);
    assert_eq!(
        kinds(&all(&mut s, &changes[0].cursor, "other").await),
        ["event_created"]
    );
    assert_eq!(
        all(&mut s, "0", "").await,
        changes,
        "0: from the very first"
    );

    // Bad cursors: malformed, or never handed out.
    for bad in ["x", "1.2.3", "-4", "99999"] {
        expect_err(
            s.changes.watch_changes(watch(bad, "", false)).await,
            Code::InvalidArgument,
            "CURSOR_INVALID",
        );
    }

    // A following reader hears of a change made after it started.
    let mut following = s
        .changes
        .watch_changes(watch(&changes[5].cursor, "", true))
        .await
        .unwrap()
        .into_inner();
    let later = c
        .booking
        .hold(best("chg", "ann", &token, "g", 1, "h3"))
        .await
        .unwrap()
        .into_inner();
    let heard = tokio::time::timeout(Duration::from_secs(30), following.message())
        .await
        .expect("the follower hears of it")
        .unwrap()
        .unwrap();
    assert_eq!(heard.kind, "hold_placed");
    assert_eq!(heard.hold.unwrap().hold_id, later.hold_id);
    drop(following);

    // HTTP: NDJSON, the same changes and cursors.
    let http = server.http(Some(STREAM));
    let got = http.get("/v1/changes", &[]).await;
    assert_eq!(got.status, StatusCode::OK, "{got:?}");
    assert_eq!(got.header("content-type"), "application/x-ndjson");
    let lines: Vec<serde_json::Value> = String::from_utf8(got.body.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 7);
    for (line, change) in lines.iter().zip(&changes) {
        assert_eq!(line["cursor"], change.cursor.as_str());
        assert_eq!(line["kind"], change.kind.as_str());
    }
    assert_eq!(lines[2]["order"]["orderId"], order.order_id.as_str());
    assert_eq!(lines[2]["order"]["tickets"][0]["code"], "");
    assert_eq!(lines[1]["hold"]["status"], "HELD");
    let after = http
        .get(
            &format!("/v1/changes?after={}&eventId=chg", changes[3].cursor),
            &[],
        )
        .await;
    assert_eq!(
        String::from_utf8(after.body.to_vec())
            .unwrap()
            .lines()
            .count(),
        2,
        "the release and the later hold"
    );
    // Server-sent events, resumed with Last-Event-ID (which wins over `after`, as a browser
    // reconnects to the same URL).
    let sse = http
        .get(
            &format!("/v1/changes?after={}", changes[0].cursor),
            &[
                ("accept", "text/event-stream"),
                ("last-event-id", &changes[4].cursor),
            ],
        )
        .await;
    assert_eq!(sse.status, StatusCode::OK);
    assert!(sse.header("content-type").starts_with("text/event-stream"));
    let text = String::from_utf8(sse.body.to_vec()).unwrap();
    assert!(
        text.contains(&format!("id: {}", changes[5].cursor)),
        "{text}"
    );
    assert!(text.contains("event: event_created"), "{text}");
    assert!(text.contains("event: hold_placed"), "{text}");
    assert!(!text.contains("hold_released"), "resumed after it: {text}");
    // Refusals as problems.
    let bad = http.get("/v1/changes?after=nope", &[]).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.reason(), "CURSOR_INVALID");
    let client = server.http(Some(CLIENT)).get("/v1/changes", &[]).await;
    assert_eq!(client.status, StatusCode::FORBIDDEN);
    let admin = server.http(Some(ADMIN)).get("/v1/changes", &[]).await;
    assert_eq!(admin.status, StatusCode::OK);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_past_the_retention_is_expired_with_the_oldest_cursor() {
    let server = TestServer::builder()
        .change_retention(Duration::from_secs(5))
        .start()
        .await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut s = server.clients(STREAM);
    a.events
        .create_event(event("old", vec![ga("g", 10, 1)]))
        .await
        .unwrap();
    let first = all(&mut s, "", "").await;
    assert_eq!(first.len(), 1);
    // Past the retention by the changes' own times, and past the trim's once-a-second look.
    clock.advance_ms(60_000);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    a.events
        .create_event(event("new", vec![ga("g", 10, 1)]))
        .await
        .unwrap();
    let status = s
        .changes
        .watch_changes(watch("0", "", false))
        .await
        .unwrap_err();
    expect_err::<()>(Err(status.clone()), Code::OutOfRange, "CURSOR_EXPIRED");
    let details = tonic_types::StatusExt::get_error_details(&status);
    let oldest = details.error_info().unwrap().metadata["oldest_cursor"].clone();
    let kept = all(&mut s, &oldest, "").await;
    assert_eq!(kinds(&kept), ["event_created"]);
    assert_eq!(kept[0].event_id, "new");
    assert_eq!(
        all(&mut s, "", "").await,
        kept,
        "empty: from the oldest kept"
    );
    let http = server
        .http(Some(STREAM))
        .get("/v1/changes?after=0", &[])
        .await;
    assert_eq!(http.status, StatusCode::BAD_REQUEST);
    assert_eq!(http.reason(), "CURSOR_EXPIRED");
    assert_eq!(http.json()["metadata"]["oldest_cursor"], oldest.as_str());
    server.shutdown().await;
}
