//! An entry as the API shows it ([`WaitlistView`]) and what the waitlist stream records
//! ([`WaitlistRecord`]): the data below the core and the actor.

use serde::{Deserialize, Serialize};

use crate::types::{EventId, HoldId, SectionId, UserId};

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
