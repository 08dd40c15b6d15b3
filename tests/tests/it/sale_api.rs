//! `UpdateSale` over gRPC and HTTP (issue 28, points 1 and 4): admin only; a pause refuses
//! holds and joins and the line hears it; queue-all admits nobody; a new admission rate is in
//! force within a second; the end is final; bad input gets its reason and changes nothing.
//! The engine's side (deadlines, bursts, restarts) is in `sale`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use boxoffice_proto::v1 as pb;
use boxoffice_tests::cases::{expect_err, mismatch};
use boxoffice_tests::server::{ADMIN, TestServer};
use http::StatusCode;
use serde_json::json;
use tonic::Code;

use crate::grpc::{admitted, best, event, ga};

fn sale(event_id: &str, state: pb::SaleState) -> pb::UpdateSaleRequest {
    pb::UpdateSaleRequest {
        event_id: event_id.into(),
        state: state as i32,
        ..Default::default()
    }
}

async fn join(
    c: &mut boxoffice_tests::Clients,
    event: &str,
    user: &str,
) -> Result<pb::QueueTicket, tonic::Status> {
    c.room
        .join(pb::JoinRequest {
            event_id: event.into(),
            user_id: user.into(),
            session_id: "s".into(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn status(c: &mut boxoffice_tests::Clients, token: &str) -> pb::QueueStatus {
    c.room
        .get_status(pb::GetStatusRequest {
            queue_token: token.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// A hold by an admitted fan and a join by a new one are both refused with `reason`.
async fn holds_and_joins_refused(c: &mut boxoffice_tests::Clients, ann: &str, reason: &str) {
    expect_err(
        c.booking.hold(best("ctl", "ann", ann, "g", 1, "")).await,
        Code::FailedPrecondition,
        reason,
    );
    let joined = join(c, "ctl", &format!("new-{reason}")).await;
    let wrong = mismatch(
        joined.map(tonic::Response::new),
        Code::FailedPrecondition,
        reason,
        None,
    );
    assert!(wrong.is_none(), "{wrong:?}");
}

/// Lets the admission timer (every 20 ms of real time, on the manual clock) take a step.
async fn admission_steps() {
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_queues_everyone_changes_the_pace_and_ends_the_sale() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    a.events
        .create_event(event("ctl", vec![ga("g", 1_000, 10)]))
        .await
        .unwrap();
    // Only an admin steers a sale.
    let denied = c
        .events
        .update_sale(sale("ctl", pb::SaleState::Paused))
        .await;
    assert_eq!(denied.unwrap_err().code(), Code::PermissionDenied);
    let ann = admitted(&mut c, &clock, "ctl", "ann").await;

    // The emergency stop.
    let paused = a
        .events
        .update_sale(sale("ctl", pb::SaleState::Paused))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(paused.sale_state(), pb::SaleState::Paused);
    assert_eq!(
        paused.sale_state_changed_at_unix_ms,
        i64::try_from(clock_now(&clock)).unwrap()
    );
    holds_and_joins_refused(&mut c, &ann, "SALE_PAUSED").await;
    // Everyone queues: joins are taken, nobody is admitted however long it lasts.
    let http = server.http(Some(ADMIN));
    let queued = http
        .post("/v1/events/ctl/sale/queue-all", &[], &json!({}))
        .await;
    assert_eq!(queued.status, StatusCode::OK, "{queued:?}");
    assert_eq!(queued.json()["saleState"], "QUEUE_ALL");
    let mut tokens = Vec::new();
    for i in 0..40 {
        tokens.push(
            join(&mut c, "ctl", &format!("fan{i}"))
                .await
                .unwrap()
                .queue_token,
        );
    }
    for _ in 0..5 {
        clock.advance_ms(1_000);
        admission_steps().await;
    }
    for t in &tokens {
        let s = status(&mut c, t).await;
        assert_eq!(
            (s.state(), s.sale_state()),
            (pb::QueueState::Waiting, pb::SaleState::QueueAll),
            "queue-all admits nobody"
        );
    }
    // Open again at 10 a second: one second later (by the server's clock) exactly 10 more
    // fans are admitted; at 20 a second, 20 more the second after.
    let opened = http
        .post(
            "/v1/events/ctl/sale",
            &[],
            &json!({"state": "OPEN", "admitRatePerSecond": 10}),
        )
        .await;
    assert_eq!(opened.status, StatusCode::OK, "{opened:?}");
    let e = opened.json();
    assert_eq!(
        (e["saleState"].clone(), e["admitRatePerSecond"].clone()),
        (json!("OPEN"), json!(10))
    );
    admission_steps().await;
    let admitted_now = async |c: &mut boxoffice_tests::Clients| {
        let mut n = 0;
        for t in &tokens {
            if status(c, t).await.state() == pb::QueueState::Admitted {
                n += 1;
            }
        }
        n
    };
    let before = admitted_now(&mut c).await;
    clock.advance_ms(1_000);
    admission_steps().await;
    assert_eq!(
        admitted_now(&mut c).await - before,
        10,
        "the new rate within a second"
    );
    let faster = pb::UpdateSaleRequest {
        event_id: "ctl".into(),
        admit_rate_per_second: Some(20),
        ..Default::default()
    };
    a.events.update_sale(faster).await.unwrap();
    admission_steps().await;
    clock.advance_ms(1_000);
    admission_steps().await;
    assert_eq!(admitted_now(&mut c).await - before, 30, "and the next one");

    // Bad input: each refused with its reason; nothing changes.
    let as_is = a
        .events
        .get_event(pb::GetEventRequest {
            event_id: "ctl".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let bad = [
        (
            sale("nope", pb::SaleState::Paused),
            Code::NotFound,
            "EVENT_NOT_FOUND",
            None,
        ),
        (
            pb::UpdateSaleRequest {
                event_id: "ctl".into(),
                admit_rate_per_second: Some(-5),
                ..Default::default()
            },
            Code::InvalidArgument,
            "INVALID_REQUEST",
            Some("admit_rate_per_second"),
        ),
        (
            pb::UpdateSaleRequest {
                event_id: "ctl".into(),
                state: 9,
                ..Default::default()
            },
            Code::InvalidArgument,
            "INVALID_REQUEST",
            Some("state"),
        ),
        (
            pb::UpdateSaleRequest {
                event_id: "ctl".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
            "INVALID_REQUEST",
            Some("state"),
        ),
        (
            pb::UpdateSaleRequest {
                event_id: "ctl".into(),
                hold_ttl_seconds: Some(86_401),
                ..Default::default()
            },
            Code::InvalidArgument,
            "INVALID_REQUEST",
            Some("hold_ttl_seconds"),
        ),
    ];
    for (i, (req, code, reason, field)) in bad.into_iter().enumerate() {
        let r = a.events.update_sale(req).await;
        if let Some(wrong) = mismatch(r, code, reason, field) {
            panic!("case {i}: {wrong}");
        }
    }
    for (body, field) in [
        (json!({"state": "SOMETIMES"}), "state"),
        (json!({"perUserLimit": 0}), "per_user_limit"),
    ] {
        let r = http.post("/v1/events/ctl/sale", &[], &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
        assert_eq!(r.json()["field"], field);
    }
    let r = http.post("/v1/events/ctl/sale/stop", &[], &json!({})).await;
    assert_eq!(
        (r.status, r.json()["field"].clone()),
        (StatusCode::BAD_REQUEST, json!("action"))
    );
    let r = server
        .http(Some(boxoffice_tests::server::CLIENT))
        .post("/v1/events/ctl/sale/pause", &[], &json!({}))
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let still = a
        .events
        .get_event(pb::GetEventRequest {
            event_id: "ctl".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(still.sale_state, as_is.sale_state);
    assert_eq!(still.admit_rate_per_second, as_is.admit_rate_per_second);
    assert_eq!(
        still.sale_state_changed_at_unix_ms,
        as_is.sale_state_changed_at_unix_ms
    );

    // The end: final, the line hears it, nothing more is held or joined.
    let ended = a
        .events
        .update_sale(sale("ctl", pb::SaleState::Ended))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (ended.sale_state(), ended.state()),
        (pb::SaleState::Ended, pb::EventState::Closed)
    );
    assert_eq!(
        status(&mut c, &tokens[39]).await.sale_state(),
        pb::SaleState::Ended
    );
    holds_and_joins_refused(&mut c, &ann, "SALE_ENDED").await;
    expect_err(
        a.events.update_sale(sale("ctl", pb::SaleState::Open)).await,
        Code::FailedPrecondition,
        "SALE_ENDED",
    );
    server.shutdown().await;
}

fn clock_now(clock: &boxoffice_engine::ManualClock) -> u64 {
    use boxoffice_engine::Clock as _;
    clock.now_ms()
}
