//! The catalog's entries: an event as the engine holds it (its spec and its sections' published
//! snapshots), and what readers are given of it. Data only: the catalog's calls are in
//! [`crate::catalog`].

use std::sync::Arc;

use tokio::sync::watch;

use crate::types::{EventId, EventSpec, SectionId, SectionSnapshot, SectionSpec};

/// One section as the engine's catalog sees it: its published snapshot (the publisher outlives
/// the section's actor, so a restarted actor publishes on the same channel).
pub(crate) struct SectionSlot {
    pub section_id: SectionId,
    pub snapshot: watch::Receiver<Arc<SectionSnapshot>>,
    pub publisher: Arc<watch::Sender<Arc<SectionSnapshot>>>,
}

/// One section of an event for a reader that builds its own views of it: see
/// `Engine::section_feeds`.
#[derive(Clone, Debug)]
pub struct SectionFeed {
    /// The section's spec (its layout: rows and seats in snapshot order).
    pub spec: SectionSpec,
    /// The section's published snapshots.
    pub snapshots: watch::Receiver<Arc<SectionSnapshot>>,
}

/// An event as the engine's catalog holds it.
pub(crate) struct EventEntry {
    pub spec: EventSpec,
    pub event_id: EventId,
    pub created_at_ms: u64,
    pub sections: Vec<SectionSlot>,
}

/// The settings of an event that the hot paths (join, hold) read: no sections, so reading them
/// allocates nothing but the id. They carry the event's catalog entry, so a hold placed with them
/// (`Engine::hold_checked`) does not read the catalog again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventTerms {
    /// The event id.
    pub event_id: EventId,
    /// How long a hold lasts, ms.
    pub hold_ttl_ms: u64,
    /// Places one user may hold or own.
    pub per_user_limit: u32,
    /// Waiting-room admissions per second.
    pub admit_rate_per_second: u32,
    /// How long an admitted fan may book, ms.
    pub admission_window_ms: u64,
    /// When the sale opens, ms since the Unix epoch.
    pub sale_opens_at_ms: u64,
    /// Proof of work a `Join` must carry, in leading zero bits (0: none).
    pub join_pow_difficulty_bits: u32,
    /// The catalog entry they were read from.
    pub(crate) entry: EventRef,
}

impl EventTerms {
    /// Whether every place of the event is taken (held or sold) now, as its sections' latest
    /// published snapshots say (no mailbox, no allocation).
    pub fn sold_out(&self) -> bool {
        self.entry
            .0
            .sections
            .iter()
            .all(|s| s.snapshot.borrow().available == 0)
    }
}

/// An event's catalog entry, as [`EventTerms`] carry it. Equal when it is the same entry.
#[derive(Clone)]
pub struct EventRef(pub(crate) Arc<EventEntry>);

impl std::fmt::Debug for EventRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("EventRef").field(&self.0.event_id).finish()
    }
}

impl PartialEq for EventRef {
    fn eq(&self, other: &EventRef) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for EventRef {}
