//! What the command line's tests share: data dirs for the offline commands (a small sale
//! written by the engine itself, sled's file cut in half), and a finished command told.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::path::Path;
use std::process::Output;

use boxoffice_engine::{
    ConfirmRequest, Engine, EngineConfig, EventId, EventSpec, HoldRequest, Layout, SectionId,
    SectionSpec, Selection, UserId,
};

/// A data dir with `holds` holds of 2 places, every third confirmed, in a general-admission
/// section of `capacity` places (event `show`, section `floor`).
pub async fn build(dir: &Path, holds: usize, capacity: u32) {
    let engine = Engine::open(EngineConfig::new(dir)).await.unwrap();
    build_on(&engine, holds, capacity).await;
    engine.shutdown().await;
}

/// The same sale on an open `engine` (left open).
pub async fn build_on(engine: &Engine, holds: usize, capacity: u32) {
    engine
        .create_event(EventSpec {
            event_id: Some(EventId::from("show")),
            name: "Show".into(),
            sections: vec![SectionSpec {
                section_id: SectionId::from("floor"),
                name: "Floor".into(),
                price_cents: 5_000,
                layout: Layout::GeneralAdmission { capacity },
                price_tiers: Vec::new(),
            }],
            hold_ttl_ms: 600_000,
            per_user_limit: 4,
            admit_rate_per_second: 0,
            admission_window_ms: 0,
            sale_opens_at_ms: 0,
            join_pow_difficulty_bits: 0,
            cancellation_deadline_ms: 0,
            transfers_disabled: false,
            presale: Default::default(),
        })
        .await
        .unwrap();
    for i in 0..holds {
        let h = engine
            .hold(HoldRequest {
                event_id: EventId::from("show"),
                user_id: UserId::from(format!("fan{i}").as_str()),
                idempotency_key: String::new(),
                selection: Selection::BestAvailable {
                    section: Some(SectionId::from("floor")),
                    quantity: 2,
                },
                access_code: String::new(),
            })
            .await
            .unwrap();
        if i % 3 == 0 {
            engine
                .confirm(ConfirmRequest {
                    hold_id: h.hold_id.clone(),
                    user_id: h.user_id.clone(),
                    payment_ref: "tok_visa".into(),
                    idempotency_key: String::new(),
                })
                .await
                .unwrap();
        }
    }
}

/// Cuts the second half of sled's file in `dir` off: acknowledged records are gone.
pub fn cut_in_half(dir: &Path) {
    let db = dir.join("db");
    let len = std::fs::metadata(&db).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
}

/// A finished command's exit code, stdout and stderr, for a failed assertion's message.
pub fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
