//! The same table of good and bad requests over both faces of one server, gRPC and HTTP/JSON
//! (issue 25): every answer the same (the HTTP one as the contract maps the gRPC one to JSON),
//! through one in-process service layer: keys, validation, idempotency (an HTTP retry of a gRPC
//! call's key gets its answer), shedding and reasons. The same table runs against a cluster's
//! follower, whose calls are forwarded, in the cluster tests (`gateway/cli/tests/cluster.rs`).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::Duration;

use boxoffice_proto::v1 as pb;
use boxoffice_tests::faces::{Face, Faces, compare};
use boxoffice_tests::server::{ADMIN, CLIENT, TestServer};

/// Joins over gRPC and polls (advancing the server's manual clock) until admitted.
async fn admitted(server: &TestServer, event: &str, user: &str) -> String {
    let mut c = server.client();
    let ticket = c
        .room
        .join(pb::JoinRequest {
            event_id: event.into(),
            user_id: user.into(),
            session_id: "s".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for _ in 0..500 {
        let s = c
            .room
            .get_status(pb::GetStatusRequest {
                queue_token: ticket.queue_token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        if !s.admission_token.is_empty() {
            return s.admission_token;
        }
        server.clock().advance_ms(20);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{user} was not admitted to {event}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_table_over_grpc_and_http_gets_the_same_answers() {
    let server = TestServer::start().await;
    let faces = Faces::new(&server.channel(), server.http_addr(), ADMIN, CLIENT);
    let table = compare(&faces, "faces", |e, u| {
        let server = &server;
        async move { admitted(server, &e, &u).await }
    })
    .await;
    let (rows, errors) = table.summary();
    println!("{rows} rows compared, {errors} of them errors");
    // Nothing the refusals touched changed: fan-1 holds nothing (their seat released, their
    // places sold) and owns the 2 they paid for.
    let e = server.engine();
    let event = e.event(&"faces".into()).unwrap();
    let sold: u32 = event.sections.iter().map(|s| s.sold).sum();
    let held: u32 = event.sections.iter().map(|s| s.held).sum();
    assert_eq!((sold, held), (2, 0));
    assert_eq!(
        e.user_usage(&"faces".into(), &"fan-1".into())
            .await
            .unwrap(),
        2
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_at_its_bound_sheds_both_faces_alike() {
    let server = TestServer::builder().in_flight_max(0).start().await;
    let faces = Faces::new(&server.channel(), server.http_addr(), ADMIN, CLIENT);
    let overloaded = same_answer(&faces.client).await;
    assert_eq!(overloaded.reason.as_deref(), Some("OVERLOADED"));
    // An unknown key is refused before the bound: the same on both faces.
    let refused = same_answer(&faces.stranger).await;
    assert_eq!(refused.grpc_code, "UNAUTHENTICATED");
    server.shutdown().await;
}

/// `GetEvent` over both faces of `face`: refused alike (the same problem, its HTTP status, and
/// `Retry-After` where it has a retry delay). The problem.
async fn same_answer(face: &Face) -> boxoffice_gateway::http::problem::Problem {
    let mut g = face.grpc.clone();
    let grpc = g
        .events
        .get_event(pb::GetEventRequest {
            event_id: "any".into(),
        })
        .await
        .unwrap_err();
    let http = face.http.get("/v1/events/any", &[]).await;
    let want = boxoffice_gateway::http::problem::Problem::from_status(&grpc);
    assert_eq!(http.status.as_u16(), want.status);
    assert_eq!(http.json(), serde_json::to_value(&want).unwrap());
    if want.retry_after_ms.is_some() {
        assert_eq!(http.header("retry-after"), "1");
    }
    want
}
