//! The catalog component: events and their sections as the engine lists them, created durably
//! (the `catalog` stream) and read from the sections' published snapshots (never a mailbox).

use crate::access::Redemptions;
use crate::changes::{Change, ChangeKind};
use std::sync::Arc;

use tokio::sync::{Mutex, oneshot};

use crate::core::{SaleChange, SectionCore};
use crate::error::{EngineError, Rejection};
use crate::events::{EventEntry, EventRef, EventTerms, SectionFeed, SectionSlot};
use crate::hash::DashMap;
use crate::kernel::Kernel;
use crate::sale::{SaleControls, SaleState, SaleUpdate};
use crate::section::SectionMsg;
use crate::store::StreamWriter;
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

/// The catalog component: the events the engine lists and the `catalog` stream that records
/// them. It owns both; its callers read events through it, and an event is listed only once
/// its section actors run (by `create`, after the engine's closure started them, or by
/// `Engine::start_event` in recovery).
pub(crate) struct Catalog {
    kernel: Arc<Kernel>,
    events: DashMap<EventId, Arc<EventEntry>>,
    /// The `catalog` stream's writer; held while an event is created, so creations are one at a
    /// time and an id is checked and listed under one lock.
    writer: Mutex<StreamWriter>,
}

impl Catalog {
    pub(crate) fn new(kernel: Arc<Kernel>, writer: StreamWriter) -> Catalog {
        Catalog {
            kernel,
            events: DashMap::default(),
            writer: Mutex::new(writer),
        }
    }

    /// Lists an event whose section actors run.
    pub(crate) fn list(&self, entry: EventEntry) {
        sale_gauges(&entry.event_id, &entry.sale());
        self.events.insert(entry.event_id.clone(), Arc::new(entry));
    }

    /// Creates an event (see `Engine::create_event_keyed`): checks the spec and the id, logs the
    /// event durably, has `start` start its sections' actors from new cores, and lists it. The
    /// catalog's lock is held from the id's check until the event is listed.
    pub(crate) async fn create<F, Fut>(
        &self,
        spec: EventSpec,
        key: &str,
        start: F,
    ) -> Result<EventView, EngineError>
    where
        F: FnOnce(Vec<(SectionCore, u64)>) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<SectionSlot>, EngineError>>,
    {
        self.kernel.check_ready()?;
        let (spec, event_id, keyed) = spec_and_id(spec, key)?;
        let window_ms = self.kernel.window_ms();
        let mut writer = self.writer.lock().await;
        if let Some(existing) = self.events.get(&event_id).map(|e| e.spec.clone()) {
            // A retry of the same request (a lost answer, a deadline) gets the event; another
            // spec under the id is refused.
            let mut asked = spec.clone();
            asked.event_id = Some(event_id.clone());
            if asked == existing {
                drop(writer);
                return self.event(&event_id);
            }
            return Err(if keyed {
                Rejection::IdempotencyKeyReused
            } else {
                Rejection::EventExists
            }
            .into());
        }
        let created_at_ms = self.kernel.now_ms();
        let mut spec = spec;
        spec.event_id = Some(event_id.clone());
        let record = CatalogRecord::event_created(spec.clone(), event_id.clone(), created_at_ms);
        self.record(&mut writer, record).await?;
        let cores = spec
            .sections
            .iter()
            .map(|s| {
                let core = SectionCore::new(event_id.clone(), s.clone()).with_window_ms(window_ms);
                (core, 0)
            })
            .collect();
        let sections = start(cores).await?;
        self.list(EventEntry {
            sale: spec.sale_controls(created_at_ms).into(),
            sale_keys: Default::default(),
            spec,
            event_id: event_id.clone(),
            created_at_ms,
            sections,
        });
        drop(writer);
        metrics::counter!("boxoffice_engine_events_created_total").increment(1);
        self.event(&event_id)
    }

    /// Tells each section of `event` to stand as `change` says (as of `at`, or now), and
    /// waits until each has (its record durable, or nothing to record). Never shed: a pause
    /// must reach a section whose mailbox is full of holds.
    pub(crate) async fn sections_follow_sale(
        &self,
        event: &EventEntry,
        change: SaleChange,
        at: Option<u64>,
    ) -> Result<(), EngineError> {
        let asks = event.sections.iter().map(|slot| {
            self.kernel.ask_unshed(event, &slot.section_id, |reply| {
                SectionMsg::Sale(change, at, reply)
            })
        });
        for answer in futures_util::future::join_all(asks).await {
            answer?;
        }
        Ok(())
    }

    /// Changes an event's sale (see `Engine::update_sale`): checks the key and the update,
    /// records the controls after it durably, then brings the event's sections to the new
    /// state. The catalog's lock is held throughout, so sections follow changes in the order
    /// they were recorded.
    pub(crate) async fn update_sale(
        &self,
        event_id: &EventId,
        update: &SaleUpdate,
        key: &str,
    ) -> Result<EventView, EngineError> {
        self.kernel.check_ready()?;
        check_idempotency_key(key)?;
        let entry = self.entry(event_id)?;
        let fingerprint = crate::codec::fingerprint(&(event_id, update));
        let mut writer = self.writer.lock().await;
        let used = entry
            .sale_keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied();
        // A retry (or a request that changes nothing) records nothing, but still has the
        // sections stand as the controls say: a first call whose sections did not all answer
        // (an actor restarting) is finished by its retry.
        let settled = match used {
            Some(f) if f == fingerprint => true,
            Some(_) => return Err(Rejection::IdempotencyKeyReused.into()),
            None => false,
        };
        let now = self.kernel.now_ms();
        let current = entry.sale();
        let after = if settled {
            None
        } else {
            current.after(update, now)?
        };
        if settled || (after.is_none() && key.is_empty()) {
            self.sections_follow_sale(&entry, SaleChange::of(current.state), None)
                .await?;
            drop(writer);
            return self.event(event_id);
        }
        let sale = after.unwrap_or(current);
        let record = CatalogRecord::SaleUpdated {
            event_id: event_id.clone(),
            sale: sale.clone(),
            key: key.to_owned(),
            fingerprint,
        };
        self.record(&mut writer, record).await?;
        *entry.sale.write().unwrap_or_else(|p| p.into_inner()) = sale.clone();
        if !key.is_empty() {
            entry
                .sale_keys
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.to_owned(), fingerprint);
        }
        sale_gauges(event_id, &sale);
        tracing::info!(event = %event_id, state = sale.state.name(),
            admit_rate = sale.admit_rate_per_second, hold_ttl_ms = sale.hold_ttl_ms,
            per_user_limit = sale.per_user_limit, "sale updated");
        self.sections_follow_sale(&entry, SaleChange::of(sale.state), None)
            .await?;
        drop(writer);
        self.event(event_id)
    }

    /// Appends `record` to the `catalog` stream (under its writer's lock) and waits until it
    /// is durable.
    async fn record(
        &self,
        writer: &mut StreamWriter,
        record: CatalogRecord,
    ) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        let change = change_of(&record, self.kernel.now_ms());
        let job = writer.append_changing(
            std::slice::from_ref(&record),
            Vec::new(),
            &[change],
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        self.kernel.store().submit(job);
        rx.await.map_err(|_| EngineError::NotReady)??;
        Ok(())
    }

    pub(crate) fn entry(&self, event_id: &EventId) -> Result<Arc<EventEntry>, Rejection> {
        self.events
            .get(event_id)
            .map(|e| e.value().clone())
            .ok_or(Rejection::EventNotFound)
    }

    pub(crate) fn entries(&self) -> Vec<Arc<EventEntry>> {
        self.events.iter().map(|e| e.value().clone()).collect()
    }

    pub(crate) fn event(&self, event_id: &EventId) -> Result<EventView, EngineError> {
        self.kernel.check_not_stopped()?;
        let e = self.entry(event_id)?;
        Ok(view_of(&e, self.kernel.redemptions()))
    }

    pub(crate) fn terms(&self, event_id: &EventId) -> Result<EventTerms, EngineError> {
        self.kernel.check_not_stopped()?;
        let e = self.entry(event_id)?;
        let sale = e.sale();
        Ok(EventTerms {
            event_id: e.event_id.clone(),
            hold_ttl_ms: sale.hold_ttl_ms,
            per_user_limit: sale.per_user_limit,
            admit_rate_per_second: sale.admit_rate_per_second,
            sale_state: sale.state,
            admission_window_ms: e.spec.admission_window_ms,
            sale_opens_at_ms: e.spec.sale_opens_at_ms,
            join_pow_difficulty_bits: e.spec.join_pow_difficulty_bits,
            entry: EventRef(e),
        })
    }

    pub(crate) fn available(
        &self,
        event_id: &EventId,
    ) -> Result<Vec<(SectionId, u32)>, EngineError> {
        self.kernel.check_not_stopped()?;
        let e = self.entry(event_id)?;
        Ok(e.sections
            .iter()
            .map(|slot| (slot.section_id.clone(), slot.snapshot.borrow().available))
            .collect())
    }

    pub(crate) fn views(&self) -> Result<Vec<EventView>, EngineError> {
        self.kernel.check_not_stopped()?;
        let mut all: Vec<EventView> = self
            .events
            .iter()
            .map(|e| view_of(e.value(), self.kernel.redemptions()))
            .collect();
        all.sort_by(|a, b| a.event_id.cmp(&b.event_id));
        Ok(all)
    }

    pub(crate) fn seat_map(
        &self,
        event_id: &EventId,
        section: Option<&SectionId>,
    ) -> Result<SeatMap, EngineError> {
        self.kernel.check_not_stopped()?;
        let e = self.entry(event_id)?;
        let now = self.kernel.now_ms();
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
                price_tiers: snap.price_tiers.clone(),
                next_price_cents: snap.next_price_cents,
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

    pub(crate) fn feeds(&self, event_id: &EventId) -> Result<Vec<SectionFeed>, EngineError> {
        self.kernel.check_not_stopped()?;
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
}

/// The sale's gauges of an event: its state (1 for the state it is in, 0 for the others), its
/// admission rate, hold TTL and per-user limit, and when the state and the rate last changed.
fn sale_gauges(event_id: &EventId, sale: &SaleControls) {
    let event = event_id.to_string();
    for state in SaleState::ALL {
        metrics::gauge!("boxoffice_sale_state", "event" => event.clone(), "state" => state.name())
            .set(if state == sale.state { 1.0 } else { 0.0 });
    }
    let seconds = |ms: u64| ms as f64 / 1000.0;
    for (name, v) in [
        (
            "boxoffice_sale_admit_rate_per_second",
            f64::from(sale.admit_rate_per_second),
        ),
        ("boxoffice_sale_hold_ttl_seconds", seconds(sale.hold_ttl_ms)),
        (
            "boxoffice_sale_per_user_limit",
            f64::from(sale.per_user_limit),
        ),
        (
            "boxoffice_sale_state_changed_at_seconds",
            seconds(sale.state_changed_at_ms),
        ),
        (
            "boxoffice_sale_admit_rate_changed_at_seconds",
            seconds(sale.rate_changed_at_ms),
        ),
    ] {
        metrics::gauge!(name, "event" => event.clone()).set(v);
    }
}

/// A create's spec with its defaults, checked; the id it makes (its own, the key's by
/// [`event_id_of_key`], or a new one); and whether the key names it.
fn spec_and_id(spec: EventSpec, key: &str) -> Result<(EventSpec, EventId, bool), EngineError> {
    check_idempotency_key(key)?;
    let spec = spec.with_defaults();
    spec.validate()?;
    let keyed = spec.event_id.is_none() && !key.is_empty();
    let event_id = match &spec.event_id {
        Some(id) => id.clone(),
        None if keyed => event_id_of_key(key),
        None => EventId(format!("ev-{}", crate::rt::ulid()).to_lowercase()),
    };
    Ok((spec, event_id, keyed))
}

fn view_of(e: &EventEntry, codes: &Redemptions) -> EventView {
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
                price_tiers: snap.price_tiers.clone(),
                next_price_cents: snap.next_price_cents,
            }
        })
        .collect();
    EventView {
        spec: e.spec.clone(),
        sale: e.sale(),
        event_id: e.event_id.clone(),
        created_at_ms: e.created_at_ms,
        sections,
        access_code_uses: (0..e.spec.presale.codes.len())
            .map(|i| codes.used(&e.event_id, u32::try_from(i).unwrap_or(u32::MAX)))
            .collect(),
    }
}

/// The change a catalog record makes.
fn change_of(record: &CatalogRecord, now_ms: u64) -> Change {
    match record {
        CatalogRecord::EventCreated {
            spec,
            event_id,
            created_at_ms,
        }
        | CatalogRecord::EventCreatedWithPow {
            spec,
            event_id,
            created_at_ms,
            ..
        }
        | CatalogRecord::EventCreatedWithTerms {
            spec,
            event_id,
            created_at_ms,
            ..
        }
        | CatalogRecord::EventCreatedWithPresale {
            spec,
            event_id,
            created_at_ms,
            ..
        }
        | CatalogRecord::EventCreatedWithPrices {
            spec,
            event_id,
            created_at_ms,
            ..
        } => Change {
            event_id: event_id.clone(),
            at_ms: *created_at_ms,
            kind: ChangeKind::EventCreated {
                spec: spec.clone(),
                sale: spec.sale_controls(*created_at_ms),
            },
        },
        CatalogRecord::SaleUpdated { event_id, sale, .. } => Change {
            event_id: event_id.clone(),
            at_ms: now_ms,
            kind: ChangeKind::SaleUpdated(sale.clone()),
        },
    }
}
