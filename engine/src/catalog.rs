//! The catalog: events and their sections as the engine lists them, created durably (the
//! `catalog` stream) and read from the sections' published snapshots (never a mailbox).

use std::sync::Arc;

use tokio::sync::{oneshot, watch};

use crate::core::SectionCore;
use crate::engine::Engine;
use crate::error::{EngineError, Rejection};
use crate::events::{EventEntry, EventRef, EventTerms, SectionFeed, SectionSlot};
use crate::types::{
    CatalogRecord, EventId, EventSpec, EventView, Layout, SeatId, SeatMap, SeatView, SectionId,
    SectionSeats, SectionSummary, check_idempotency_key,
};

/// The id of the event a keyed create without an event id makes: `ev-` and 32 hex digits of
/// SHA-256 over the key (so every retry with the key names the same event).
pub fn event_id_of_key(key: &str) -> EventId {
    use sha2::Digest;
    let digest = sha2::Sha256::new()
        .chain_update(b"boxoffice CreateEvent idempotency key\0")
        .chain_update(key.as_bytes())
        .finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    EventId(format!("ev-{hex}"))
}

impl Engine {
    /// Starts one actor per section of an event (each with its recovered core and the last
    /// sequence number of its stream) and lists the event.
    pub(crate) async fn start_event(
        &self,
        event_id: EventId,
        spec: EventSpec,
        created_at_ms: u64,
        sections: Vec<(SectionCore, u64)>,
    ) -> Result<(), EngineError> {
        let mut slots = Vec::with_capacity(sections.len());
        for (core, last_seq) in sections {
            let section_id = core.spec().section_id.clone();
            let (tx, rx) = watch::channel(Arc::new(core.snapshot(last_seq)));
            let publisher = Arc::new(tx);
            self.spawn_section(core, last_seq, publisher.clone())
                .await?;
            slots.push(SectionSlot {
                section_id,
                snapshot: rx,
                publisher,
            });
        }
        self.inner.events.insert(
            event_id.clone(),
            Arc::new(EventEntry {
                spec,
                event_id,
                created_at_ms,
                sections: slots,
            }),
        );
        Ok(())
    }

    /// Creates an event: validates the spec (zero values take the defaults), logs it durably and
    /// starts one actor per section. Idempotent by event id: the same spec again returns the
    /// event as it is now; another spec under an existing id is `EventExists`. Runs to the end
    /// even if the caller stops waiting.
    pub async fn create_event(&self, spec: EventSpec) -> Result<EventView, EngineError> {
        self.create_event_keyed(spec, "").await
    }

    /// [`Engine::create_event`] with an idempotency key for a spec without an event id: the
    /// event's id is derived from the key ([`event_id_of_key`]), so a retry with the key and the
    /// same spec answers the event the first call made (whether or not its answer arrived), and
    /// the key with another spec is `IdempotencyKeyReused`. The key lasts as long as the event.
    /// With an event id, or an empty key, the key plays no part.
    pub async fn create_event_keyed(
        &self,
        spec: EventSpec,
        idempotency_key: &str,
    ) -> Result<EventView, EngineError> {
        let engine = self.clone();
        let key = idempotency_key.to_owned();
        self.detached(async move { engine.create_event_now(spec, &key).await })
            .await
    }

    async fn create_event_now(&self, spec: EventSpec, key: &str) -> Result<EventView, EngineError> {
        self.check_ready()?;
        check_idempotency_key(key)?;
        let spec = spec.with_defaults();
        spec.validate()?;
        let keyed = spec.event_id.is_none() && !key.is_empty();
        let event_id = match &spec.event_id {
            Some(id) => id.clone(),
            None if keyed => event_id_of_key(key),
            None => EventId(format!("ev-{}", crate::rt::ulid()).to_lowercase()),
        };
        let window_ms = self.window_ms();
        let mut catalog = self.inner.catalog.lock().await;
        if let Some(existing) = self.inner.events.get(&event_id).map(|e| e.spec.clone()) {
            // A retry of the same request (a lost answer, a deadline) gets the event; another
            // spec under the id is refused.
            let mut asked = spec.clone();
            asked.event_id = Some(event_id.clone());
            if asked == existing {
                drop(catalog);
                return self.event(&event_id);
            }
            return Err(if keyed {
                Rejection::IdempotencyKeyReused
            } else {
                Rejection::EventExists
            }
            .into());
        }
        let created_at_ms = self.now_ms();
        let mut spec = spec;
        spec.event_id = Some(event_id.clone());
        let record = CatalogRecord::event_created(spec.clone(), event_id.clone(), created_at_ms);
        let (tx, rx) = oneshot::channel();
        let job = catalog.append(
            std::slice::from_ref(&record),
            Vec::new(),
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        self.inner.store.submit(job);
        rx.await.map_err(|_| EngineError::NotReady)??;
        let sections = spec
            .sections
            .iter()
            .map(|s| {
                let core = SectionCore::new(event_id.clone(), s.clone()).with_window_ms(window_ms);
                (core, 0)
            })
            .collect();
        self.start_event(event_id.clone(), spec, created_at_ms, sections)
            .await?;
        drop(catalog);
        metrics::counter!("boxoffice_engine_events_created_total").increment(1);
        self.event(&event_id)
    }

    pub(crate) fn entry(&self, event_id: &EventId) -> Result<Arc<EventEntry>, Rejection> {
        self.inner
            .events
            .get(event_id)
            .map(|e| e.value().clone())
            .ok_or(Rejection::EventNotFound)
    }

    /// An event with its sections' latest counts.
    pub fn event(&self, event_id: &EventId) -> Result<EventView, EngineError> {
        self.check_not_stopped()?;
        let e = self.entry(event_id)?;
        Ok(view_of(&e))
    }

    /// An event's settings without its sections (cheap: for the per-request paths).
    pub fn event_terms(&self, event_id: &EventId) -> Result<EventTerms, EngineError> {
        self.check_not_stopped()?;
        let e = self.entry(event_id)?;
        Ok(EventTerms {
            event_id: e.event_id.clone(),
            hold_ttl_ms: e.spec.hold_ttl_ms,
            per_user_limit: e.spec.per_user_limit,
            admit_rate_per_second: e.spec.admit_rate_per_second,
            admission_window_ms: e.spec.admission_window_ms,
            sale_opens_at_ms: e.spec.sale_opens_at_ms,
            join_pow_difficulty_bits: e.spec.join_pow_difficulty_bits,
            entry: EventRef(e),
        })
    }

    /// Free places per section of an event, from the published snapshots (cheap: no spec).
    pub fn available_places(
        &self,
        event_id: &EventId,
    ) -> Result<Vec<(SectionId, u32)>, EngineError> {
        self.check_not_stopped()?;
        let e = self.entry(event_id)?;
        Ok(e.sections
            .iter()
            .map(|slot| (slot.section_id.clone(), slot.snapshot.borrow().available))
            .collect())
    }

    /// Every event, ordered by id.
    pub fn events(&self) -> Result<Vec<EventView>, EngineError> {
        self.check_not_stopped()?;
        let mut all: Vec<EventView> = self
            .inner
            .events
            .iter()
            .map(|e| view_of(e.value()))
            .collect();
        all.sort_by(|a, b| a.event_id.cmp(&b.event_id));
        Ok(all)
    }

    /// The latest published snapshots of an event (or of one section), built per call (the
    /// gateway's shared maps are `gateway::seat_maps`). Never enters a mailbox. The latest
    /// snapshot of a section shows every change made so far, so the map is true now: `as_of_ms`
    /// is now (not the time a snapshot was published, which is old for an idle section).
    pub fn seat_map(
        &self,
        event_id: &EventId,
        section: Option<&SectionId>,
    ) -> Result<SeatMap, EngineError> {
        self.check_not_stopped()?;
        let e = self.entry(event_id)?;
        let now = self.now_ms();
        let mut sections = Vec::new();
        for (slot, spec) in e.sections.iter().zip(&e.spec.sections) {
            if section.is_some_and(|s| s != &slot.section_id) {
                continue;
            }
            let snap = slot.snapshot.borrow().clone();
            let seats = match &spec.layout {
                Layout::GeneralAdmission { .. } => Vec::new(),
                Layout::Reserved { rows } => {
                    let mut out = Vec::with_capacity(snap.seats.len());
                    let mut statuses = snap.seats.iter();
                    for r in rows {
                        for n in 1..=r.seat_count {
                            let status = *statuses.next().expect("snapshot covers the layout");
                            out.push(SeatView {
                                seat_id: SeatId::new(&slot.section_id, &r.label, n),
                                row: r.label.clone(),
                                number: n,
                                status,
                            });
                        }
                    }
                    out
                }
            };
            sections.push(SectionSeats {
                section_id: slot.section_id.clone(),
                capacity: snap.capacity,
                available: snap.available,
                held: snap.held,
                sold: snap.sold,
                seats,
                as_of_ms: now,
            });
        }
        if sections.is_empty() {
            return Err(Rejection::SectionNotFound.into());
        }
        Ok(SeatMap {
            event_id: event_id.clone(),
            as_of_ms: now,
            sections,
        })
    }

    /// Where a reader that builds its own view of an event's sections (the gateway's seat maps)
    /// gets them: per section in event order, its spec and its published snapshots (a `watch`
    /// receiver: `borrow()` is the latest, never entering a mailbox). An event's sections never
    /// change, so a reader may keep these for the life of the engine.
    pub fn section_feeds(&self, event_id: &EventId) -> Result<Vec<SectionFeed>, EngineError> {
        self.check_not_stopped()?;
        let e = self.entry(event_id)?;
        Ok(e.sections
            .iter()
            .zip(&e.spec.sections)
            .map(|(slot, spec)| SectionFeed {
                spec: spec.clone(),
                snapshots: slot.snapshot.clone(),
            })
            .collect())
    }

    /// Whether the engine still serves reads: `Storage` once it stopped (its published counts
    /// could include a change that was never acknowledged).
    pub fn check_reads(&self) -> Result<(), EngineError> {
        self.check_not_stopped()
    }

    pub(crate) fn event_entries(&self) -> Vec<Arc<EventEntry>> {
        self.inner
            .events
            .iter()
            .map(|e| e.value().clone())
            .collect()
    }
}

fn view_of(e: &EventEntry) -> EventView {
    let sections = e
        .sections
        .iter()
        .zip(&e.spec.sections)
        .map(|(slot, spec)| {
            let snap = slot.snapshot.borrow();
            SectionSummary {
                spec: spec.clone(),
                capacity: snap.capacity,
                available: snap.available,
                held: snap.held,
                sold: snap.sold,
            }
        })
        .collect();
    EventView {
        spec: e.spec.clone(),
        event_id: e.event_id.clone(),
        created_at_ms: e.created_at_ms,
        sections,
    }
}
