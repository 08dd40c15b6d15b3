//! Shared helpers for the integration tests (`tests/it`): engines on temporary data dirs with a
//! manual clock, small event layouts, and the rooms the tests share: a real gRPC server that
//! stops on drop ([`server`]), polling with a bound instead of sleeping ([`wait`]), tables of
//! calls that must be refused ([`cases`]), crash children ([`child`]), and a real server in a
//! child process, to kill with SIGKILL ([`server_process`]), a payment provider that holds
//! charges until the test lets them through ([`payments`]), and a group's majority that holds
//! group commits back likewise ([`majority`]).

pub mod cases;
pub mod child;
pub mod children;
pub mod faces;
pub mod http;
pub mod majority;
pub mod payments;
pub mod promtool;
pub mod server;
pub mod server_process;
pub mod wait;

// The gRPC client: the only place the tests name where it comes from.
pub use boxoffice_client::{Bearer, Clients, connect};

use std::path::Path;
use std::sync::Arc;

use boxoffice_engine::{
    Durability, Engine, EngineConfig, EventId, EventSpec, Layout, ManualClock, RowSpec, SectionId,
    SectionSpec,
};

/// The instant every test clock starts at (2026-01-01T00:00:00Z), in ms.
pub const T0_MS: u64 = 1_767_225_600_000;

/// An engine config on `dir` driven by `clock`, with small bounds so tests exercise them.
pub fn config(dir: &Path, clock: &Arc<ManualClock>) -> EngineConfig {
    let mut c = EngineConfig::new(dir);
    c.clock = clock.clone();
    c.durability = Durability::Sync;
    c
}

/// Opens an engine on `dir` with `clock`.
pub async fn open(dir: &Path, clock: &Arc<ManualClock>) -> Engine {
    Engine::open(config(dir, clock))
        .await
        .expect("engine opens")
}

/// A general-admission section.
pub fn ga(id: &str, capacity: u32, price_cents: u64) -> SectionSpec {
    SectionSpec {
        section_id: SectionId::from(id),
        name: id.to_uppercase(),
        price_cents,
        layout: Layout::GeneralAdmission { capacity },
        price_tiers: Vec::new(),
    }
}

/// A reserved section with `rows` rows of `seats` seats, labelled A, B, C...
pub fn reserved(id: &str, rows: u32, seats: u32, price_cents: u64) -> SectionSpec {
    SectionSpec {
        section_id: SectionId::from(id),
        name: id.to_uppercase(),
        price_cents,
        layout: Layout::Reserved {
            rows: (0..rows)
                .map(|r| RowSpec {
                    label: row_label(r),
                    seat_count: seats,
                })
                .collect(),
        },
        price_tiers: Vec::new(),
    }
}

/// Row labels A..Z, then AA, AB, ...
pub fn row_label(r: u32) -> String {
    let letters = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    if r < 26 {
        (letters[r as usize] as char).to_string()
    } else {
        format!(
            "{}{}",
            letters[(r / 26 - 1) as usize % 26] as char,
            letters[(r % 26) as usize] as char
        )
    }
}

/// A keyless hold of `q` places of `event`, best available in any section, for `user`.
pub fn any_section(event: &str, user: &str, q: u32) -> boxoffice_engine::HoldRequest {
    boxoffice_engine::HoldRequest {
        event_id: EventId::from(event),
        user_id: boxoffice_engine::UserId::from(user),
        idempotency_key: String::new(),
        selection: boxoffice_engine::Selection::BestAvailable {
            section: None,
            quantity: q,
        },
        access_code: String::new(),
    }
}

/// The gRPC `Hold` request of `quantity` places, best available in `section` of `event`, for
/// an admitted (`user`, `token`), under idempotency key `key` (empty: none), without an access
/// code.
pub fn best_available(
    event: &str,
    user: &str,
    token: &str,
    section: &str,
    quantity: u32,
    key: &str,
) -> boxoffice_proto::v1::HoldRequest {
    use boxoffice_proto::v1 as pb;
    pb::HoldRequest {
        event_id: event.into(),
        user_id: user.into(),
        admission_token: token.into(),
        idempotency_key: key.into(),
        selection: Some(pb::hold_request::Selection::BestAvailable(
            pb::BestAvailable {
                section_id: section.into(),
                quantity,
            },
        )),
        access_code: String::new(),
    }
}

/// A confirm of `hold` paid with the simulated provider's good test card, under idempotency
/// key `key` (empty: none).
pub fn pay_with_visa(
    hold: &boxoffice_engine::HoldView,
    key: &str,
) -> boxoffice_engine::ConfirmRequest {
    boxoffice_engine::ConfirmRequest {
        hold_id: hold.hold_id.clone(),
        user_id: hold.user_id.clone(),
        payment_ref: "tok_visa".into(),
        idempotency_key: key.into(),
    }
}

/// An event spec with the given sections, TTL and per-user limit, open now.
pub fn event(id: &str, sections: Vec<SectionSpec>, ttl_ms: u64, per_user_limit: u32) -> EventSpec {
    EventSpec {
        event_id: Some(EventId::from(id)),
        name: format!("Event {id}"),
        sections,
        hold_ttl_ms: ttl_ms,
        per_user_limit,
        admit_rate_per_second: 0,
        admission_window_ms: 0,
        sale_opens_at_ms: 0,
        join_pow_difficulty_bits: 0,
        cancellation_deadline_ms: 0,
        transfers_disabled: false,
        presale: Default::default(),
    }
}

/// Whether the slow tier runs (`BOXOFFICE_SLOW=1`): more cases and cycles of the same tests
/// ([`boxoffice_engine::tiers`], the one parser).
pub fn slow_tier() -> bool {
    boxoffice_engine::tiers::slow()
}

/// Runs `case` to completion on a fresh two-worker runtime (the engine's actors need the
/// multi-thread one): for tests that are not `#[tokio::test]`s (crash children, proptest cases).
pub fn on_runtime<F: std::future::Future>(case: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(case)
}
