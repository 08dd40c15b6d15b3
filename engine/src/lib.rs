//! # boxoffice-engine
//!
//! The inventory engine of boxoffice: every section of every event is owned by one actor that
//! serializes check-and-hold in memory and writes its decisions to a local sled write-ahead log
//! before anyone hears "yes".
//!
//! ## Layout
//! - [`types`]: ids (newtypes), event and section specs, the views the engine answers with.
//! - [`error`]: [`Rejection`] (definite business answers) apart from [`EngineError`]'s fatal
//!   and transient cases.
//! - [`clock`]: the [`Clock`] trait (system and manual).
//! - [`core`]: [`SectionCore`], the pure state machine of one section (no IO, no clock).
//! - [`codec`]: the one module that turns log records into bytes (version byte + CRC32).
//! - `store`: the sled log, the group-commit flusher thread, checkpoints, the sold-seat backstop.
//! - `section`: the section actor (ractor), a thin shell around the core.
//! - `ledger`: per-user quota and idempotency records, sharded by user over actors.
//! - [`waitlist`]: the waitlist's state machine and actor (entries, offers), logged.
//! - [`engine`]: the [`Engine`] handle, the [`Router`], recovery.
//!
//! ## Example
//! ```
//! use boxoffice_engine::{Engine, EngineConfig, EventSpec, Layout, SectionSpec, SectionId,
//!     HoldRequest, ConfirmRequest, Selection, EventId, UserId, HoldStatus};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let engine = Engine::open(EngineConfig::new(dir.path())).await?;
//! let event = engine
//!     .create_event(EventSpec {
//!         event_id: Some(EventId::from("e9")),
//!         name: "The show".into(),
//!         sections: vec![SectionSpec {
//!             section_id: SectionId::from("floor"),
//!             name: "Floor".into(),
//!             price_cents: 5_000,
//!             layout: Layout::GeneralAdmission { capacity: 100 },
//!         }],
//!         hold_ttl_ms: 0,            // 0: the default, 10 minutes
//!         per_user_limit: 0,         // 0: the default, 4
//!         admit_rate_per_second: 0,
//!         admission_window_ms: 0,
//!         sale_opens_at_ms: 0,       // open now
//!     })
//!     .await?;
//! let hold = engine
//!     .hold(HoldRequest {
//!         event_id: event.event_id.clone(),
//!         user_id: UserId::from("fan-1"),
//!         idempotency_key: "tap-1".into(),
//!         selection: Selection::BestAvailable { section: None, quantity: 2 },
//!     })
//!     .await?;
//! assert_eq!(hold.status, HoldStatus::Held);
//! let order = engine
//!     .confirm(ConfirmRequest {
//!         hold_id: hold.hold_id.clone(),
//!         user_id: UserId::from("fan-1"),
//!         payment_ref: "tok_visa".into(),
//!         idempotency_key: "pay-1".into(),
//!     })
//!     .await?;
//! assert_eq!(order.amount_cents, 10_000);
//! assert_eq!(engine.event(&event.event_id)?.sections[0].sold, 2);
//! engine.shutdown().await;
//! # Ok(())
//! # }
//! ```

/// The README's Rust example, compiled and run as a doctest so it stays true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod clock;
pub mod codec;
pub mod core;
pub mod engine;
pub mod error;
mod ledger;
pub mod payment;
pub mod reconcile;
mod section;
mod store;
pub mod types;
pub mod waitlist;

pub use clock::{Clock, ManualClock, SystemClock};
pub use core::SectionCore;
pub use engine::{
    EXPIRE_PER_SECTION_MAX, Engine, EngineConfig, ExpiredAndOffered, RecoveryReport, Router,
};
pub use error::{EngineError, Rejection, StorageError};
pub use payment::{
    BoxFuture, Charge, ChargeStatus, PaymentError, PaymentProvider, SimulatedConfig,
    SimulatedProvider,
};
pub use reconcile::Finding;
pub use section::{Listener, Notice};
pub use store::{Durability, FLUSH_BATCH_JOBS_MAX};
pub use types::*;
pub use waitlist::{WaitlistState, WaitlistView};

/// Tool and test support: the data dir's raw sled database, for tests that damage the log and
/// for offline tools. Tree names: `catalog`, `section/{event}/{section}`, `ledger/{shard}`,
/// `checkpoints`, `sold`; record keys are sequence numbers (u64 big-endian).
pub mod raw {
    pub use crate::store::open_db;
    pub use sled;

    /// The name of a section's log stream (its sled tree).
    pub fn section_stream(event: &crate::EventId, section: &crate::SectionId) -> String {
        format!("section/{event}/{section}")
    }
}
