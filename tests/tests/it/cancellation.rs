//! Callers that give up (issue 12, point 1): a hold or confirm whose caller stops waiting (a
//! client deadline; here `tokio::time::timeout`, which drops the call's future as tonic drops a
//! handler's) still runs to its end. Afterwards no idempotency key is stuck in flight, every
//! retry of a key gets the first answer, and every user's quota is what they really hold.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::Arc;
use std::time::Duration;

use boxoffice_engine::{
    EngineError, EventId, HoldRequest, HoldStatus, HoldView, ManualClock, OrderView, Rejection,
    SectionId, Selection, UserId,
};
use boxoffice_tests::wait::{PATIENCE, periodic_check};
use boxoffice_tests::{T0_MS, event, ga, open, pay_with_visa, reserved};
use rand::{Rng, SeedableRng};

const USERS: usize = 500;
const WAVE: usize = 25;

fn hold_req(user: usize) -> HoldRequest {
    HoldRequest {
        event_id: EventId::from("e"),
        user_id: UserId::from(format!("u{user}").as_str()),
        idempotency_key: format!("hold-{user}"),
        selection: Selection::BestAvailable {
            section: Some(SectionId::from(if user.is_multiple_of(2) {
                "floor"
            } else {
                "orch"
            })),
            quantity: 1 + (user % 2) as u32,
        },
        access_code: String::new(),
    }
}

/// What the first, impatient attempt of each call got: `None` when the caller gave up.
#[derive(Default)]
struct FirstAnswers {
    hold: Option<Result<HoldView, EngineError>>,
    confirm: Option<Result<OrderView, EngineError>>,
}

/// Retries `call` until the key is no longer in flight (its first call still running in the
/// background); never longer than the patience bound.
async fn settled<T: std::fmt::Debug>(
    what: &str,
    mut call: impl AsyncFnMut() -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    periodic_check(what, PATIENCE, async || match call().await {
        Err(EngineError::Rejected(Rejection::IdempotencyKeyInFlight)) => Err("key in flight"),
        other => Ok(other),
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_give_up_never_wedge_a_key_or_a_quota() {
    let seed: u64 = std::env::var("BOXOFFICE_CANCEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("cancellation: seed {seed} (replay: BOXOFFICE_CANCEL_SEED={seed})");
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = open(dir.path(), &clock).await;
    engine
        .create_event(event(
            "e",
            vec![ga("floor", 10_000, 1_000), reserved("orch", 40, 25, 2_000)],
            600_000,
            4,
        ))
        .await
        .unwrap();

    // 500 users, each a keyed hold then a keyed confirm, every call with a 1-10 ms deadline;
    // in waves of 25 at once, so that some calls finish in time and some do not.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut firsts = Vec::new();
    for wave in 0..USERS / WAVE {
        let mut tasks = Vec::new();
        for user in wave * WAVE..(wave + 1) * WAVE {
            let (engine, hold_ms, confirm_ms) = (
                engine.clone(),
                rng.random_range(1..=10u64),
                rng.random_range(1..=10u64),
            );
            tasks.push(tokio::spawn(async move {
                let mut first = FirstAnswers::default();
                let patience = |ms| Duration::from_millis(ms);
                first.hold = tokio::time::timeout(patience(hold_ms), engine.hold(hold_req(user)))
                    .await
                    .ok();
                if let Some(Ok(h)) = &first.hold {
                    let pay = pay_with_visa(h, &format!("pay-{user}"));
                    first.confirm = tokio::time::timeout(patience(confirm_ms), engine.confirm(pay))
                        .await
                        .ok();
                }
                first
            }));
        }
        for t in tasks {
            firsts.push(t.await.unwrap());
        }
    }
    let gave_up = firsts.iter().filter(|f| f.hold.is_none()).count()
        + firsts
            .iter()
            .filter(|f| matches!(f.hold, Some(Ok(_))) && f.confirm.is_none())
            .count();
    let answered = firsts.iter().filter(|f| f.hold.is_some()).count()
        + firsts.iter().filter(|f| f.confirm.is_some()).count();
    println!(
        "cancellation: {gave_up} first calls given up by their callers, {answered} answered in time"
    );

    // Every key settles, and its retry gets the first answer.
    for (user, first) in firsts.iter().enumerate() {
        let hold = settled(&format!("hold key of u{user}"), async || {
            engine.hold(hold_req(user)).await
        })
        .await;
        if let Some(answer) = &first.hold {
            assert_eq!(&hold, answer, "u{user}: a retry of the hold key");
        }
        let Ok(h) = hold else {
            let usage = engine
                .user_usage(
                    &EventId::from("e"),
                    &UserId::from(format!("u{user}").as_str()),
                )
                .await
                .unwrap();
            assert_eq!(usage, 0, "u{user}: quota after a refused hold");
            continue;
        };
        let pay = pay_with_visa(&h, &format!("pay-{user}"));
        let order = settled(&format!("confirm key of u{user}"), async || {
            engine.confirm(pay.clone()).await
        })
        .await;
        if let Some(answer) = &first.confirm {
            assert_eq!(&order, answer, "u{user}: a retry of the confirm key");
        }
        // The quota is what the user really holds or owns.
        let now = engine.get_hold(&h.hold_id).await.unwrap();
        let owned = match now.status {
            HoldStatus::Held | HoldStatus::Confirmed => now.quantity,
            _ => 0,
        };
        assert_eq!(
            engine
                .user_usage(&EventId::from("e"), &h.user_id)
                .await
                .unwrap(),
            owned,
            "u{user}: quota"
        );
    }
    assert!(engine.invariant_violations().await.unwrap().is_empty());
    let findings = engine.reconcile().await.unwrap();
    assert!(findings.is_empty(), "{findings:?}");
    engine.shutdown().await;
}
