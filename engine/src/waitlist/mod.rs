//! The waitlist: fans who want places of a sold-out event, in the order they joined.
//!
//! - [`WaitlistCore`] (`core`): pure state, changed only by applying [`WaitlistRecord`]s (as a
//!   section is); it also decides what a request would record (`decide_*`), so the actor only
//!   logs and replies.
//! - `actor`: the one actor that owns the core and logs every change to its own stream
//!   (`waitlist`) before replying, so entries and offers survive a restart.
//!
//! The engine's waitlist calls are in `waitlist_calls` (the engine layer, above this one).
//!
//! The waitlist owns no places: the sweeper hands freed places to the head of the line by placing
//! an ordinary hold in the fan's name and recording it here as an offer.

use serde::{Deserialize, Serialize};

use crate::types::{EventId, HoldId, SectionId, UserId};

mod actor;
mod core;

pub(crate) use actor::{WaitlistActor, WaitlistArgs, WaitlistMsg};
pub(crate) use core::JoinRequest;
pub use core::WaitlistCore;

/// The state of a waitlist entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WaitlistState {
    /// In line.
    Waiting,
    /// Offered a hold (see `offered_hold_id`); waiting for the fan to confirm it.
    Offered,
    /// Left the line without a sale: the offer lapsed, or the fan could not take one.
    Expired,
    /// The offered hold was confirmed.
    Fulfilled,
}

/// An entry as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitlistView {
    /// `{event_id}.w{ulid}`.
    pub entry_id: String,
    /// The event.
    pub event_id: EventId,
    /// The fan.
    pub user_id: UserId,
    /// The section asked for (`None`: any).
    pub section_id: Option<SectionId>,
    /// Places asked for (all or nothing).
    pub quantity: u32,
    /// 1-based place among the event's waiting entries; 0 once not waiting.
    pub position: u64,
    /// State.
    pub state: WaitlistState,
    /// The hold offered, if any.
    pub offered_hold_id: Option<HoldId>,
    /// When the fan joined, ms since the Unix epoch.
    pub joined_at_ms: u64,
}

/// What the waitlist stream records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitlistRecord {
    /// A fan joined.
    EntryJoined {
        /// The new entry.
        entry_id: String,
        /// The event.
        event_id: EventId,
        /// The fan.
        user_id: UserId,
        /// Section asked for.
        section_id: Option<SectionId>,
        /// Places asked for.
        quantity: u32,
        /// When.
        at_ms: u64,
    },
    /// A hold was offered to the entry's fan.
    EntryOffered {
        /// The entry.
        entry_id: String,
        /// The hold placed in the fan's name.
        hold_id: HoldId,
    },
    /// The entry left the line.
    EntryEnded {
        /// The entry.
        entry_id: String,
        /// `Expired` or `Fulfilled`.
        state: WaitlistState,
    },
}
