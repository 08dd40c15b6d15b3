//! The catalog's entries: an event as the engine holds it (its spec and its sections' published
//! snapshots), and what readers are given of it. Data only: the catalog's calls are in
//! [`crate::catalog`].

use crate::hash::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;

use crate::sale::{SaleControls, SaleState};
use crate::types::{CatalogRecord, EventId, EventSpec, SectionId, SectionSnapshot, SectionSpec};

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
    /// The sale controls as the latest durable catalog record left them (see [`crate::sale`]).
    pub sale: RwLock<SaleControls>,
    /// `UpdateSale` idempotency keys used on this event, with their requests' fingerprints.
    pub sale_keys: Mutex<HashMap<String, u64>>,
}

impl EventEntry {
    fn controls(&self) -> std::sync::RwLockReadGuard<'_, SaleControls> {
        self.sale.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The sale controls now.
    pub fn sale(&self) -> SaleControls {
        self.controls().clone()
    }

    /// The sale's state now.
    pub fn sale_state(&self) -> SaleState {
        self.controls().state
    }

    /// The TTL a hold placed now gets, ms.
    pub fn hold_ttl_ms(&self) -> u64 {
        self.controls().hold_ttl_ms
    }

    /// The per-user limit now.
    pub fn per_user_limit(&self) -> u32 {
        self.controls().per_user_limit
    }

    /// The hold cool-down now, ms (0: none).
    pub fn hold_cooldown_ms(&self) -> u64 {
        self.controls().hold_cooldown_ms
    }
}

/// An event as the catalog stream left it: its creation, and its sale controls and
/// `UpdateSale` keys after every record since. Recovery and a warm follower fold the stream
/// into these ([`LoggedEvent::fold`]); the engine lists them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LoggedEvent {
    pub event_id: EventId,
    pub spec: EventSpec,
    pub created_at_ms: u64,
    pub sale: SaleControls,
    pub sale_keys: HashMap<String, u64>,
}

impl LoggedEvent {
    /// Folds one catalog record into `events`: a creation adds its event (returned, for the
    /// caller to start its sections), a sale update replaces its event's controls. A record
    /// that does not fit (a second creation of an id, an update of an unknown event) is an
    /// error, and changes nothing.
    pub fn fold(
        events: &mut Vec<LoggedEvent>,
        record: CatalogRecord,
    ) -> Result<Option<&LoggedEvent>, String> {
        match record {
            CatalogRecord::SaleUpdated {
                event_id,
                sale,
                key,
                fingerprint,
            } => {
                let e = events
                    .iter_mut()
                    .find(|e| e.event_id == event_id)
                    .ok_or_else(|| format!("a sale update of unknown event {event_id}"))?;
                e.sale = sale;
                if !key.is_empty() {
                    e.sale_keys.insert(key, fingerprint);
                }
                Ok(None)
            }
            created => {
                let (event_id, spec, created_at_ms) = created.into_event();
                if events.iter().any(|e| e.event_id == event_id) {
                    return Err(format!("event {event_id} created twice"));
                }
                events.push(LoggedEvent {
                    sale: spec.sale_controls(created_at_ms),
                    event_id,
                    spec,
                    created_at_ms,
                    sale_keys: HashMap::default(),
                });
                Ok(events.last())
            }
        }
    }
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
    /// Where the sale stands (see [`crate::sale`]).
    pub sale_state: SaleState,
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
