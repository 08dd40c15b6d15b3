//! The child sides of the crash tests of `tests/it`, run by the helper binary
//! `boxoffice-test-child` (see [`crate::child`]); each announces itself first, and prints what
//! was acknowledged for the parent to check after it killed the process.

use std::sync::Arc;

use boxoffice_engine::{
    ConfirmRequest, Engine, EngineConfig, EventId, HoldRequest, Selection, SystemClock, UserId,
};

use crate::child;
use crate::{any_section, event, ga, on_runtime, pay_with_visa, reserved};

/// The variable naming the data dir of [`kill9_sale`].
pub const KILL9_DIR_VAR: &str = "BOXOFFICE_CRASH_DIR";
/// The variable naming the data dir of [`crash_after_charge`].
pub const CHECKOUT_DIR_VAR: &str = "BOXOFFICE_CHECKOUT_CRASH_DIR";

/// `kill9-sale` (`it::kill9`): books places on the engine in `dir` as fast as 16 tasks can,
/// printing each acknowledged hold (`HOLD id`) and confirm (`ORDER id hold`), until killed.
pub fn kill9_sale(dir: &str) {
    child::announce();
    let dir = dir.to_owned();
    on_runtime(async move {
        let mut config = EngineConfig::new(&dir);
        config.clock = Arc::new(SystemClock);
        let engine = Engine::open(config)
            .await
            .expect("the child's call succeeds");
        engine
            .create_event(event(
                "k9",
                vec![ga("floor", 1_000_000, 10), reserved("orch", 100, 100, 20)],
                600_000,
                4,
            ))
            .await
            .expect("the child's call succeeds");
        let mut tasks = Vec::new();
        for t in 0..16 {
            let engine = engine.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0u64.. {
                    let user = UserId::from(format!("t{t}-{i}"));
                    let section = if i % 2 == 0 { "floor" } else { "orch" };
                    let hold = engine
                        .hold(HoldRequest {
                            event_id: EventId::from("k9"),
                            user_id: user.clone(),
                            idempotency_key: format!("h{i}"),
                            selection: Selection::BestAvailable {
                                section: Some(section.into()),
                                quantity: 1 + (i % 3) as u32,
                            },
                            access_code: String::new(),
                        })
                        .await
                        .expect("the child's call succeeds");
                    println!("HOLD {}", hold.hold_id);
                    if i % 2 == 0 {
                        let order = engine
                            .confirm(ConfirmRequest {
                                hold_id: hold.hold_id.clone(),
                                user_id: user,
                                payment_ref: "tok_visa".into(),
                                idempotency_key: format!("c{i}"),
                            })
                            .await
                            .expect("the child's call succeeds");
                        println!("ORDER {} {}", order.order_id, hold.hold_id);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.expect("the child's call succeeds");
        }
    });
}

/// `crash-after-charge` (`it::checkout`): holds two places on the engine in `dir` (`HOLD id`)
/// and confirms them; with `BOXOFFICE_FAILPOINT=after_charge` the process dies right after the
/// charge, so `SURVIVED` is never printed.
pub fn crash_after_charge(dir: &str) {
    child::announce();
    let dir = dir.to_owned();
    on_runtime(async move {
        let engine = Engine::open(EngineConfig::new(&dir))
            .await
            .expect("the engine opens");
        engine
            .create_event(event("k", vec![ga("g", 10, 700)], 600_000, 4))
            .await
            .expect("the event is made");
        let h = engine
            .hold(any_section("k", "ann", 2))
            .await
            .expect("the hold is made");
        println!("HOLD {}", h.hold_id);
        let _ = engine.confirm(pay_with_visa(&h, "pay")).await;
        println!("SURVIVED");
    });
}
