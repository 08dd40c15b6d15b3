//! The proof of work before `Join` over gRPC (issue 12, point 3): an event created with
//! `join_pow_difficulty_bits` refuses a `Join` without a solved challenge of this server, for this
//! event and user, in its validity, used once; an event without it works as before.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use boxoffice_client::pow::{is_solution, leading_zero_bits, pow_hash, solve};
use boxoffice_engine::Clock;
use boxoffice_proto::v1 as pb;
use boxoffice_tests::Clients;
use boxoffice_tests::cases::{expect_err, mismatch};
use boxoffice_tests::server::TestServer;
use tonic::Code;

use crate::grpc::{event, ga};

const BITS: u32 = 12;

fn pow_event(id: &str, bits: u32) -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        join_pow_difficulty_bits: bits,
        ..event(id, vec![ga("g", 100, 1)])
    }
}

async fn challenge(c: &mut Clients, event_id: &str, user: &str) -> pb::JoinChallenge {
    c.room
        .get_join_challenge(pb::GetJoinChallengeRequest {
            event_id: event_id.into(),
            user_id: user.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

fn join(event_id: &str, user: &str, session: &str, challenge: &str, nonce: u64) -> pb::JoinRequest {
    pb::JoinRequest {
        event_id: event_id.into(),
        user_id: user.into(),
        session_id: session.into(),
        join_challenge: challenge.into(),
        pow_nonce: nonce,
    }
}

/// A `Join` of `user` / `session` to `event_id` that must be refused with `reason`, and must
/// leave that session without a place: joining again without a solution is still
/// `POW_REQUIRED` (a place taken would be returned instead).
async fn refused(c: &mut Clients, what: &str, request: pb::JoinRequest, code: Code, reason: &str) {
    let (event_id, user, session) = (
        request.event_id.clone(),
        request.user_id.clone(),
        request.session_id.clone(),
    );
    if let Some(wrong) = mismatch(c.room.join(request).await, code, reason, None) {
        panic!("{what}: expected {code:?}/{reason}: {wrong}");
    }
    if let Some(wrong) = mismatch(
        c.room.join(join(&event_id, &user, &session, "", 0)).await,
        Code::FailedPrecondition,
        "POW_REQUIRED",
        None,
    ) {
        panic!("{what}: the refused join took a place: {wrong}");
    }
}

/// The `join_pow_difficulty_bits` `GetEvent` answers for `event_id`.
async fn difficulty_of(c: &mut Clients, event_id: &str) -> u32 {
    let e = pb::GetEventRequest {
        event_id: event_id.into(),
    };
    c.events
        .get_event(e)
        .await
        .unwrap()
        .into_inner()
        .join_pow_difficulty_bits
}

/// The position of the place a `Join` that must succeed answers.
async fn position(c: &mut Clients, request: pb::JoinRequest) -> u64 {
    c.room.join(request).await.unwrap().into_inner().position
}

/// A `Join` with `challenge` solved.
fn solved_join(
    event_id: &str,
    user: &str,
    session: &str,
    challenge: &pb::JoinChallenge,
) -> pb::JoinRequest {
    let nonce = solve(&challenge.challenge, challenge.difficulty_bits);
    join(event_id, user, session, &challenge.challenge, nonce)
}

/// A nonce that does not solve `challenge` at `bits`.
fn wrong_nonce(challenge: &str, bits: u32) -> u64 {
    (0..).find(|n| !is_solution(challenge, *n, bits)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_needs_a_solved_challenge_of_this_event_and_user_used_once() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut c = server.admin();
    let created = c
        .events
        .create_event(pow_event("p", BITS))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.join_pow_difficulty_bits, BITS, "echoed on Event");
    c.events.create_event(pow_event("q", BITS)).await.unwrap();
    assert_eq!(difficulty_of(&mut c, "p").await, BITS);

    // The challenge: signed text, the event's difficulty, an expiry from the server's clock.
    let ann = challenge(&mut c, "p", "ann").await;
    assert_eq!(ann.difficulty_bits, BITS);
    assert!(!ann.challenge.is_empty());
    let ttl_ms = boxoffice_gateway::limits::JOIN_CHALLENGE_TTL_MS_DEFAULT;
    assert_eq!(
        ann.expires_at_unix_ms,
        i64::try_from(clock.now_ms() + ttl_ms).unwrap()
    );
    let nonce = solve(&ann.challenge, BITS);
    assert!(leading_zero_bits(&pow_hash(&ann.challenge, nonce)) >= BITS);
    // Cal's challenge will be used only once it has expired (at the end).
    let cal = challenge(&mut c, "p", "cal").await;
    let cal_nonce = solve(&cal.challenge, BITS);

    // Challenges that must not admit ann: bob's, another event's, ann's own changed in one
    // character of its signed payload (still base64url), and a queue token of an event without
    // proof of work; each solved.
    let bob = challenge(&mut c, "p", "bob").await;
    let other_event = challenge(&mut c, "q", "ann").await;
    let mut tampered = ann.challenge.clone().into_bytes();
    tampered[5] = if tampered[5] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    c.events.create_event(pow_event("free", 0)).await.unwrap();
    let queue_token = c
        .room
        .join(join("free", "ann", "tab-1", "", 0))
        .await
        .unwrap()
        .into_inner()
        .queue_token;
    let solved = |ch: &str| (ch.to_owned(), solve(ch, BITS));
    let refusals = [
        ("no solution", (String::new(), 0), "POW_REQUIRED"),
        ("a nonce alone", (String::new(), nonce), "POW_REQUIRED"),
        (
            "a wrong nonce",
            (ann.challenge.clone(), wrong_nonce(&ann.challenge, BITS)),
            "POW_INVALID",
        ),
        (
            "another user's challenge",
            solved(&bob.challenge),
            "POW_INVALID",
        ),
        (
            "another event's challenge",
            solved(&other_event.challenge),
            "POW_INVALID",
        ),
        ("a tampered challenge", solved(&tampered), "POW_INVALID"),
        (
            "a queue token as the challenge",
            solved(&queue_token),
            "POW_INVALID",
        ),
    ];
    // Every refusal, each leaving the session without a place.
    for (what, (ch, n), reason) in refusals {
        let request = join("p", "ann", "tab-1", &ch, n);
        refused(&mut c, what, request, Code::FailedPrecondition, reason).await;
    }
    refused(
        &mut c,
        "a challenge over 512 bytes",
        join("p", "ann", "tab-1", &"x".repeat(513), 0),
        Code::InvalidArgument,
        "INVALID_REQUEST",
    )
    .await;

    // The solved challenge admits into line: the first place (no refusal above took one).
    let placed = c
        .room
        .join(join("p", "ann", "tab-1", &ann.challenge, nonce))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        placed.position, 1,
        "nothing was queued by the refused joins"
    );
    let status = c
        .room
        .get_status(pb::GetStatusRequest {
            queue_token: placed.queue_token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.position, 1);
    // The place is this session's: joining again (a retry after a lost answer, with the used
    // challenge, or a refresh without one) returns it, without a new proof of work.
    for (ch, n) in [(ann.challenge.as_str(), nonce), ("", 0)] {
        assert_eq!(
            position(&mut c, join("p", "ann", "tab-1", ch, n)).await,
            1,
            "the same place"
        );
    }
    // The same challenge for another session (a bot taking a second place with one solution):
    // refused, and that session has no place.
    refused(
        &mut c,
        "a used challenge, by another session",
        join("p", "ann", "tab-2", &ann.challenge, nonce),
        Code::FailedPrecondition,
        "POW_REUSED",
    )
    .await;
    // A fresh challenge gives that session the next place.
    let fresh = challenge(&mut c, "p", "ann").await;
    assert_ne!(fresh.challenge, ann.challenge, "every challenge is new");
    assert_eq!(
        position(&mut c, solved_join("p", "ann", "tab-2", &fresh)).await,
        2
    );
    // Bob's challenge is still his to use.
    assert_eq!(
        position(&mut c, solved_join("p", "bob", "web", &bob)).await,
        3
    );
    // Expired: cal's solved challenge once the server's clock reaches its expiry (exclusive).
    clock.set_ms(u64::try_from(cal.expires_at_unix_ms).unwrap());
    refused(
        &mut c,
        "an expired challenge",
        join("p", "cal", "web", &cal.challenge, cal_nonce),
        Code::FailedPrecondition,
        "POW_EXPIRED",
    )
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_without_pow_joins_as_before_and_bad_difficulties_are_refused() {
    let server = TestServer::start().await;
    let mut c = server.admin();
    let free = c
        .events
        .create_event(event("free", vec![ga("g", 10, 1)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(free.join_pow_difficulty_bits, 0);
    assert_eq!(
        challenge(&mut c, "free", "ann").await,
        pb::JoinChallenge::default(),
        "difficulty 0, no challenge, no expiry"
    );
    assert_eq!(position(&mut c, join("free", "ann", "s", "", 0)).await, 1);
    // Challenge fields on an event without proof of work are ignored.
    assert_eq!(
        position(&mut c, join("free", "bob", "s", "whatever", 7)).await,
        2
    );

    // The challenge RPC's own errors.
    expect_err(
        c.room
            .get_join_challenge(pb::GetJoinChallengeRequest {
                event_id: "nope".into(),
                user_id: "ann".into(),
            })
            .await,
        Code::NotFound,
        "EVENT_NOT_FOUND",
    );
    for (event_id, user_id, field) in [("", "ann", "event_id"), ("free", "", "user_id")] {
        if let Some(wrong) = mismatch(
            c.room
                .get_join_challenge(pb::GetJoinChallengeRequest {
                    event_id: event_id.into(),
                    user_id: user_id.into(),
                })
                .await,
            Code::InvalidArgument,
            "INVALID_REQUEST",
            Some(field),
        ) {
            panic!("{field}: {wrong}");
        }
    }

    // At CreateEvent: above 32 bits is INVALID_REQUEST naming the field, and creates nothing;
    // 32 is accepted.
    if let Some(wrong) = mismatch(
        c.events.create_event(pow_event("hard", 33)).await,
        Code::InvalidArgument,
        "INVALID_REQUEST",
        Some("join_pow_difficulty_bits"),
    ) {
        panic!("33 bits: {wrong}");
    }
    expect_err(
        c.events
            .get_event(pb::GetEventRequest {
                event_id: "hard".into(),
            })
            .await,
        Code::NotFound,
        "EVENT_NOT_FOUND",
    );
    let hard = c
        .events
        .create_event(pow_event("hard", 32))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hard.join_pow_difficulty_bits, 32);
    // Another difficulty under an existing id is another spec.
    expect_err(
        c.events.create_event(pow_event("hard", 31)).await,
        Code::AlreadyExists,
        "EVENT_EXISTS",
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_difficulty_survives_a_restart_and_older_challenges_do_not() {
    let server = TestServer::start().await;
    let mut c = server.admin();
    c.events.create_event(pow_event("p", BITS)).await.unwrap();
    let used = challenge(&mut c, "p", "ann").await;
    let used_nonce = solve(&used.challenge, BITS);
    c.room
        .join(join("p", "ann", "s", &used.challenge, used_nonce))
        .await
        .unwrap();
    let unused = challenge(&mut c, "p", "bob").await;
    let unused_nonce = solve(&unused.challenge, BITS);
    let home = server.home().clone();
    server.shutdown().await;

    let server = TestServer::builder().home(home).start().await;
    let mut c = server.admin();
    assert_eq!(
        difficulty_of(&mut c, "p").await,
        BITS,
        "recovered from the log"
    );
    // The used set of the last run is gone, so challenges it issued are refused (used or not,
    // and although the token secret is the same): fans get new ones, as they join again.
    let refusals = [
        (
            "no solution after the restart",
            join("p", "ann", "s", "", 0),
            "POW_REQUIRED",
        ),
        (
            "a challenge used before the restart",
            join("p", "ann", "s", &used.challenge, used_nonce),
            "POW_EXPIRED",
        ),
        (
            "a challenge issued before the restart",
            join("p", "bob", "s", &unused.challenge, unused_nonce),
            "POW_EXPIRED",
        ),
    ];
    for (what, request, reason) in refusals {
        refused(&mut c, what, request, Code::FailedPrecondition, reason).await;
    }
    // The line itself survives (issue 13): who holds which place is not kept, so ann's new join
    // takes a new place, after the block of numbers the last run had reserved.
    let fresh = challenge(&mut c, "p", "ann").await;
    assert_eq!(
        position(&mut c, solved_join("p", "ann", "s", &fresh)).await,
        u64::from(boxoffice_gateway::waiting_room::RESERVE_BLOCK) + 1,
        "the first place after the last run's reserved numbers"
    );
    server.shutdown().await;
}
