//! The transport's edges (issue 12, point 8) over gRPC: an oversize request is
//! `INVALID_ARGUMENT` / `INVALID_REQUEST`, a caller's expired deadline is `DEADLINE_EXCEEDED`,
//! health watches end when the drain starts, gzip is accepted and offered, and reflection
//! answers in v1 and v1alpha.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use boxoffice_proto::v1 as pb;
use boxoffice_tests::payments::Gated;
use boxoffice_tests::server::{CLIENT, TestServer, reason};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::codec::CompressionEncoding;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::grpc::{admitted, all_events, best, event, ga};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_request_is_an_invalid_request_and_changes_nothing() {
    let server = TestServer::start().await;
    let mut a = server.admin();
    let mut big = event("big", vec![ga("floor", 10, 100)]);
    big.name = "n".repeat(300 * 1024);
    let s = a.events.create_event(big).await.unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert_eq!(reason(&s), "INVALID_REQUEST");
    let details = tonic_types::StatusExt::get_error_details(&s);
    let field = details
        .bad_request()
        .map(|b| b.field_violations[0].field.clone());
    assert_eq!(field.as_deref(), Some("request"));
    assert!(all_events(&mut a).await.is_empty(), "nothing was created");
    server.shutdown().await;
}

/// A server charging through a [`Gated`] provider recording in `payments`, an event `ev` with
/// 10 places, and a hold of one of them by `ann`.
async fn held_with_gated_payments(
    payments: &std::path::Path,
    ev: &str,
    in_flight_max: usize,
) -> (TestServer, std::sync::Arc<Gated>, pb::Hold) {
    let provider = Gated::open(payments);
    let server = TestServer::builder()
        .payments(provider.clone())
        .in_flight_max(in_flight_max)
        .start()
        .await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    a.events
        .create_event(event(ev, vec![ga("floor", 10, 100)]))
        .await
        .unwrap();
    let tok = admitted(&mut c, &clock, ev, "ann").await;
    let hold = c
        .booking
        .hold(best(ev, "ann", &tok, "floor", 1, ""))
        .await
        .unwrap()
        .into_inner();
    (server, provider, hold)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_is_deadline_exceeded_and_finishes_anyway() {
    let payments = tempfile::tempdir().unwrap();
    let (server, provider, hold) = held_with_gated_payments(payments.path(), "dl", 1).await;
    let mut c = server.client();
    // The charge waits at the provider until the test opens its gate: the caller's 200 ms
    // deadline passes first, whatever the machine's speed. The call is made over raw HTTP/2:
    // tonic's client would give up on its own at the deadline (and say CANCELLED itself); here
    // the server's answer is what the caller reads.
    let confirm = pb::ConfirmRequest {
        hold_id: hold.hold_id.clone(),
        user_id: "ann".into(),
        payment_token: "tok_visa".into(),
        idempotency_key: "k".into(),
    };
    let (code, message) = raw_unary(
        server.addr(),
        "/boxoffice.v1.BookingService/Confirm",
        CLIENT,
        "200m",
        &confirm,
    )
    .await;
    assert_eq!(code, Code::DeadlineExceeded as i32, "{message}");
    // The call still runs without its caller, and still counts against the in-flight bound
    // (here 1): callers who give up cannot pile up work past it.
    let shed = c
        .events
        .get_event(pb::GetEventRequest {
            event_id: "dl".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (shed.code(), reason(&shed).as_str()),
        (Code::ResourceExhausted, "OVERLOADED")
    );
    // The work goes on without the caller: once the provider answers, the order is made and
    // the retry with the key gets it.
    provider.arrived.acquire().await.unwrap().forget();
    provider.gate.add_permits(1);
    let order = boxoffice_tests::wait::periodic_check(
        "the retry gets the order",
        boxoffice_tests::wait::PATIENCE,
        async || {
            c.booking
                .confirm(pb::ConfirmRequest {
                    hold_id: hold.hold_id.clone(),
                    user_id: "ann".into(),
                    payment_token: "tok_visa".into(),
                    idempotency_key: "k".into(),
                })
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| format!("{s:?}"))
        },
    )
    .await;
    assert_eq!(order.hold_id, hold.hold_id);
    assert_eq!(order.tickets.len(), 1);
    server.shutdown().await;
}

/// A unary gRPC call over a bare HTTP/2 connection with `grpc-timeout: timeout`; returns the
/// answer's `grpc-status` and `grpc-message` (from the headers of a trailers-only answer, or the
/// trailers).
async fn raw_unary(
    addr: std::net::SocketAddr,
    path: &str,
    key: &str,
    timeout: &str,
    msg: &impl prost::Message,
) -> (i32, String) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {key}"))
        .header("grpc-timeout", timeout)
        .body(())
        .unwrap();
    let (answer, mut body) = client.send_request(req, false).unwrap();
    let encoded = msg.encode_to_vec();
    let mut frame = Vec::with_capacity(5 + encoded.len());
    frame.push(0);
    frame.extend_from_slice(&u32::try_from(encoded.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(&encoded);
    body.send_data(bytes::Bytes::from(frame), true).unwrap();
    let answer = answer.await.unwrap();
    let status_of = |h: &http::HeaderMap| {
        let s = tonic::Status::from_header_map(h)?;
        Some((s.code() as i32, s.message().to_owned()))
    };
    if let Some(s) = status_of(answer.headers()) {
        return s;
    }
    let mut recv = answer.into_body();
    while let Some(chunk) = recv.data().await {
        chunk.unwrap();
    }
    let trailers = recv.trailers().await.unwrap().unwrap_or_default();
    status_of(&trailers).unwrap_or((0, String::new()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watches_end_when_the_drain_starts() {
    let payments = tempfile::tempdir().unwrap();
    let (server, provider, hold) = held_with_gated_payments(payments.path(), "hw", 64).await;
    let mut health = HealthClient::new(server.channel());
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    // A call in flight (its charge held at the provider) keeps the drain waiting.
    let in_flight = {
        let mut c = server.client();
        let hold_id = hold.hold_id.clone();
        tokio::spawn(async move {
            c.booking
                .confirm(pb::ConfirmRequest {
                    hold_id,
                    user_id: "ann".into(),
                    payment_token: "tok_visa".into(),
                    idempotency_key: "k".into(),
                })
                .await
        })
    };
    provider.arrived.acquire().await.unwrap().forget();
    let drain = tokio::spawn(server.shutdown());
    // While the drain waits for that call, the watch says NOT_SERVING and ends cleanly.
    let mut seen = Vec::new();
    let ended = tokio::time::timeout(boxoffice_tests::wait::PATIENCE, async {
        while let Some(m) = watch.next().await {
            seen.push(m.unwrap().status);
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the watch is still open during the drain: {seen:?}"
    );
    assert_eq!(seen.last(), Some(&(ServingStatus::NotServing as i32)));
    assert!(!drain.is_finished(), "the watch ended before the drain did");
    // The call in flight finishes, and so does the drain.
    provider.gate.add_permits(1);
    let order = in_flight.await.unwrap().unwrap().into_inner();
    assert_eq!(order.tickets.len(), 1);
    drain.await.unwrap();
}

/// The `grpc-encoding` an answer came in.
fn encoding(m: &tonic::metadata::MetadataMap) -> Option<&str> {
    m.get("grpc-encoding").and_then(|v| v.to_str().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_is_accepted_and_offered() {
    let server = TestServer::start().await;
    let mut a = server.admin();
    a.events
        .create_event(event("gz", vec![ga("floor", 10, 100)]))
        .await
        .unwrap();
    let mut events = pb::event_service_client::EventServiceClient::with_interceptor(
        server.channel(),
        boxoffice_tests::Bearer::new(CLIENT).unwrap(),
    )
    .send_compressed(CompressionEncoding::Gzip)
    .accept_compressed(CompressionEncoding::Gzip);
    let r = events
        .get_event(pb::GetEventRequest {
            event_id: "gz".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        encoding(r.metadata()),
        Some("gzip"),
        "the answer is compressed"
    );
    assert_eq!(r.into_inner().event_id, "gz");
    // The seat map too (answered from pre-encoded sections on a route of its own).
    let r = events
        .get_seat_map(pb::GetSeatMapRequest {
            event_id: "gz".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        encoding(r.metadata()),
        Some("gzip"),
        "the seat map is compressed"
    );
    assert_eq!(r.into_inner().sections[0].available, 10);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_answers_in_v1_and_v1alpha() {
    use tonic_reflection::pb::{v1, v1alpha};
    let server = TestServer::start().await;
    let mut v1c = v1::server_reflection_client::ServerReflectionClient::new(server.channel());
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers = v1c
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answers.next().await.unwrap().unwrap().message_response
    else {
        panic!("v1 did not list services");
    };
    let v1_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(v1_names.contains(&"boxoffice.v1.BookingService".to_owned()));

    let mut alpha =
        v1alpha::server_reflection_client::ServerReflectionClient::new(server.channel());
    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = alpha
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answers.next().await.unwrap().unwrap().message_response
    else {
        panic!("v1alpha did not list services");
    };
    let alpha_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    // Each lists the services, and among them its own reflection service.
    let ours = |names: &[String]| {
        let mut ours: Vec<String> = names
            .iter()
            .filter(|n| !n.starts_with("grpc.reflection."))
            .cloned()
            .collect();
        ours.sort();
        ours
    };
    assert_eq!(ours(&alpha_names), ours(&v1_names));
    assert!(alpha_names.contains(&"grpc.reflection.v1alpha.ServerReflection".to_owned()));
    assert!(v1_names.contains(&"grpc.reflection.v1.ServerReflection".to_owned()));
    server.shutdown().await;
}
