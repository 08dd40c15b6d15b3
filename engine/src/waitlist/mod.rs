//! The waitlist: fans who want places of a sold-out event, in the order they joined.
//!
//! - [`WaitlistCore`] (`core`): pure state, changed only by applying [`WaitlistRecord`]s (as a
//!   section is); it also decides what a request would record (`decide_*`), so the actor only
//!   logs and replies.
//! - `records`: an entry as the API shows it, and the records of the waitlist's stream.
//! - `actor`: the one actor that owns the core and logs every change to its own stream
//!   (`waitlist`) before replying, so entries and offers survive a restart.
//!
//! The engine's waitlist calls are in `waitlist_calls` (the engine layer, above this one).
//!
//! The waitlist owns no places: the sweeper hands freed places to the head of the line by placing
//! an ordinary hold in the fan's name and recording it here as an offer.

mod actor;
mod core;
mod records;

pub(crate) use actor::{WaitlistActor, WaitlistArgs, WaitlistMsg};
pub(crate) use core::JoinRequest;
pub use core::WaitlistCore;
pub use records::{WaitlistRecord, WaitlistState, WaitlistView};
