//! The line knows (issue 28, point 2): a fan still in line is told `QUEUE_STATE_SOLD_OUT`
//! while every place is taken (by `Join` and `GetStatus`), may join the waitlist with its queue
//! token then, and is `WAITING` again once a place comes back.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use boxoffice_proto::v1 as pb;
use boxoffice_tests::cases::expect_err;
use boxoffice_tests::server::TestServer;
use tonic::Code;

use crate::grpc::{admitted, best, event, ga};

async fn join(c: &mut boxoffice_tests::Clients, user: &str) -> pb::QueueTicket {
    c.room
        .join(pb::JoinRequest {
            event_id: "so".into(),
            user_id: user.into(),
            session_id: "s".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn status(c: &mut boxoffice_tests::Clients, queue_token: &str) -> pb::QueueStatus {
    c.room
        .get_status(pb::GetStatusRequest {
            queue_token: queue_token.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

fn waitlist(user: &str, token: &str) -> pb::JoinWaitlistRequest {
    pb::JoinWaitlistRequest {
        event_id: "so".into(),
        user_id: user.into(),
        section_id: String::new(),
        quantity: 1,
        admission_token: token.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_in_line_is_told_sold_out_and_waits_again_when_a_place_comes_back() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    // Two places; one admission a second on a clock that moves only when told: the fans who
    // join after the first stay in line.
    let mut req = event("so", vec![ga("g", 2, 10)]);
    req.admit_rate_per_second = 1;
    a.events.create_event(req).await.unwrap();
    let ann = admitted(&mut c, &clock, "so", "ann").await;
    // While places are free, a fan in line waits.
    let bob = join(&mut c, "bob").await;
    assert_eq!(bob.state, pb::QueueState::Waiting as i32);
    assert_eq!(
        status(&mut c, &bob.queue_token).await.state,
        pb::QueueState::Waiting as i32
    );
    // Not sold out: a fan in line is not admitted to the waitlist.
    expect_err(
        c.waitlist
            .join_waitlist(waitlist("bob", &bob.queue_token))
            .await,
        Code::PermissionDenied,
        "NOT_ADMITTED",
    );
    // Ann takes both places: the line is told, at the join and at every poll.
    let held = c
        .booking
        .hold(best("so", "ann", &ann, "g", 2, "ann-1"))
        .await
        .unwrap()
        .into_inner();
    let st = status(&mut c, &bob.queue_token).await;
    assert_eq!(st.state, pb::QueueState::SoldOut as i32, "{st:?}");
    assert!(st.position > 0, "the fan keeps its place: {st:?}");
    assert_eq!(st.eta_seconds, 0);
    let cat = join(&mut c, "cat").await;
    assert_eq!(cat.state, pb::QueueState::SoldOut as i32, "{cat:?}");
    // Told sold out, Bob waits on the waitlist with his queue token.
    let entry = c
        .waitlist
        .join_waitlist(waitlist("bob", &bob.queue_token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(entry.state, pb::WaitlistState::Waiting as i32);
    // Ann gives her places back: Bob's waitlist entry is offered one, the other is free, and
    // the line waits again (Cat keeps her place).
    c.booking
        .release(pb::ReleaseRequest {
            hold_id: held.hold_id,
            user_id: "ann".into(),
        })
        .await
        .unwrap();
    let st = status(&mut c, &cat.queue_token).await;
    assert_eq!(st.state, pb::QueueState::Waiting as i32, "{st:?}");
    assert_eq!(st.position, 3, "{st:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_says_sold_out_over_http_too() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    let mut req = event("so", vec![ga("g", 1, 10)]);
    req.admit_rate_per_second = 1;
    a.events.create_event(req).await.unwrap();
    let ann = admitted(&mut c, &clock, "so", "ann").await;
    c.booking
        .hold(best("so", "ann", &ann, "g", 1, "ann-1"))
        .await
        .unwrap();
    let fan = server.http(Some(boxoffice_tests::server::CLIENT));
    let joined = fan
        .get("/v1/events/so/queue-token?userId=dan&sessionId=s", &[])
        .await;
    assert_eq!(joined.json()["state"], "SOLD_OUT", "{}", joined.json());
    let token = joined.json()["token"].as_str().unwrap().to_owned();
    let st = fan
        .get(&format!("/v1/queue/so/status?token={token}"), &[])
        .await;
    assert_eq!(st.json()["state"], "SOLD_OUT", "{}", st.json());
    server.shutdown().await;
}
