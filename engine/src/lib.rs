//! # boxoffice-engine
//!
//! The inventory engine of boxoffice: every section of every event is owned by one actor that
//! serializes check-and-hold in memory and writes its decisions to a local sled write-ahead log
//! before anyone hears "yes".
//!
//! ## Layout
//! Each layer only looks down (ids <- error <- types <- core <- store <- actors <- engine):
//! - [`ids`], [`types`], [`limits`], [`error`]: identifiers, specs and views, every limit and
//!   default, and the errors ([`Rejection`]: definite business answers; [`EngineError`]: fatal and
//!   transient cases).
//! - [`clock`]: the [`Clock`] trait (system and manual).
//! - [`core`]: [`SectionCore`], the pure state machine of one section (no IO, no clock).
//! - [`codec`]: the one module that turns log records into bytes (version byte + CRC32).
//! - [`store`]: the log behind the [`LogSink`] seam ([`SledSink`] in the data dir, [`MemorySink`]
//!   for tests with injected faults), the group-commit flusher, checkpoints, stream names.
//! - `section`: the section actor, a thin shell around the core.
//! - `ledger`: per-user quota and idempotency (pure shard state + a thin actor), sharded by user.
//! - [`waitlist`]: the waitlist (pure core + a thin actor), logged.
//! - `recovery`: the log replayed, one function per stream. `supervisor`: actors that panic are
//!   restarted from their log, or the engine stops visibly.
//! - [`engine`]: the [`Engine`] handle (open, shutdown); its calls by concern: `catalog`,
//!   `booking`, `checkout` (payment saga), `expiry`, `audit`; the [`Router`].
//! - [`payment`]: the [`PaymentProvider`] trait and the simulated provider.
//! - [`reconcile`]: the pure checks behind [`Engine::reconcile`].
//! - [`retention`]: what is forgotten and when (the idempotency window): ended holds, old
//!   idempotency answers and recorded rejections.
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
//!             price_tiers: Vec::new(),  // none: every place at price_cents
//!         }],
//!         hold_ttl_ms: 0,            // 0: the default, 10 minutes
//!         per_user_limit: 0,         // 0: the default, 4
//!         admit_rate_per_second: 0,
//!         admission_window_ms: 0,
//!         sale_opens_at_ms: 0,       // open now
//!         join_pow_difficulty_bits: 0, // 0: no proof of work before joining the line
//!         cancellation_deadline_ms: 0, // 0: tickets cannot be given back
//!         transfers_disabled: false,   // fans may pass tickets on
//!         presale: Default::default(), // no presale: no access codes
//!     })
//!     .await?;
//! let hold = engine
//!     .hold(HoldRequest {
//!         event_id: event.event_id.clone(),
//!         user_id: UserId::from("fan-1"),
//!         idempotency_key: "tap-1".into(),
//!         selection: Selection::BestAvailable { section: None, quantity: 2 },
//!         access_code: String::new(), // none needed: no presale
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

/// docs/library.md's Rust example, compiled and run as a doctest so it stays true.
#[doc = include_str!("../../docs/library.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod access;
mod audit;
mod booking;
pub mod bugs;
mod cancellations;
mod catalog;
pub mod changes;
mod checkout;
pub mod clock;
pub mod codec;
pub mod config;
pub mod core;
pub mod engine;
pub mod error;
mod events;
mod expiry;
pub mod hash;
pub mod ids;
pub mod integrity;
mod kernel;
mod ledger;
pub mod limits;
mod opening;
mod orphans;
pub mod payment;
pub mod prices;
pub mod raft;
pub mod reconcile;
mod recovery;
mod refunds;
pub mod retention;
pub mod rooms;
mod router;
pub mod rt;
pub mod sale;
mod section;
mod share;
pub mod store;
mod supervisor;
pub mod tiers;
pub mod trace;
mod transfers;
pub mod types;
pub mod waitlist;
mod waitlist_calls;
pub mod warm;

pub use cancellations::{CancelRequest, TicketsCancelled};
pub use catalog::event_id_of_key;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::EngineConfig;
pub use core::SectionCore;
pub use engine::Engine;
pub use error::{EngineError, Rejection, StorageError};
pub use events::{EventRef, EventTerms, SectionFeed};
pub use expiry::ExpiredAndOffered;
pub use integrity::{Damage, Findings, RecoveryMode, StreamSummary};
pub use limits::*;
pub use payment::{
    BoxFuture, Charge, ChargeStatus, PaymentError, PaymentProvider, SimulatedConfig,
    SimulatedProvider,
};
pub use reconcile::Finding;
pub use recovery::{RecoveryReport, verify_log};
pub use refunds::Settlement;
pub use retention::Remembered;
pub use router::Router;
pub use sale::{SaleControls, SaleState, SaleUpdate};
pub use section::{Listener, Notice};
pub use store::{Durability, LogSink, MemorySink, SledSink};
pub use supervisor::ACTOR_KINDS;
pub use transfers::TransferRequest;
pub use types::*;
pub use waitlist::{WaitlistState, WaitlistView};

/// Test and tool support (feature `test-support`): the data dir's raw sled database, for tests
/// that damage the log. Stream names are in [`store::names`].
#[cfg(feature = "test-support")]
pub mod raw {
    pub use crate::store::open_db;
    pub use sled;

    /// The name of a section's log stream (its sled tree).
    pub fn section_stream(event: &crate::EventId, section: &crate::SectionId) -> String {
        crate::store::names::section(event, section)
    }
}
