//! The `Engine` handle: what the gateway and the sweeper call.
//!
//! It validates requests, routes them through the [`Router`] to the section actor that owns the
//! place, brackets holds and confirms with the user's ledger shard (quota, idempotency), and
//! serves availability from the sections' published snapshots. Opening an engine on a data dir
//! replays the log into the cores, ledgers and idempotency records before anything is served.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use dashmap::DashMap;
use ractor::{Actor, ActorRef};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{Mutex, oneshot, watch};

use crate::clock::{Clock, SystemClock};
use crate::codec;
use crate::core::{ConfirmHold, IdemTag, Pick, PlaceHold, SectionCore, SectionRecord};
use crate::error::{EngineError, Rejection, StorageError};
use crate::ledger::{
    Answer, Begin, BeginArgs, Ledger, LedgerRecord, LedgerShard, Rpc, ShardArgs, ShardState,
    shard_index,
};
use crate::payment::{Charge, PaymentError, PaymentProvider, SimulatedConfig, SimulatedProvider};
use crate::reconcile::Finding;
use crate::section::{Listener, Notice, Notices, SectionActor, SectionArgs, SectionMsg};
use crate::store::{self, Durability, Store, StreamWriter};
use crate::types::{
    ConfirmRequest, EventId, EventSpec, EventTerms, EventView, HoldId, HoldRequest, HoldStatus,
    HoldView, Layout, OrderId, OrderView, SeatId, SeatMap, SeatView, SectionId, SectionSeats,
    SectionSnapshot, SectionSummary, Selection, UserId, check_idempotency_key, check_user_id,
};
use crate::waitlist::{
    WaitlistActor, WaitlistArgs, WaitlistCore, WaitlistMsg, WaitlistRecord, WaitlistState,
    WaitlistView,
};

/// How the engine runs. `EngineConfig::new(dir)` gives the defaults.
#[derive(Clone)]
pub struct EngineConfig {
    /// Where the sled database lives (created if missing).
    pub data_dir: PathBuf,
    /// When an acknowledged write is durable.
    pub durability: Durability,
    /// Wall clock for deadlines.
    pub clock: Arc<dyn Clock>,
    /// Number of ledger shard actors (users are spread over them by a stable hash).
    pub ledger_shards: usize,
    /// Most messages queued for one section actor; past it requests get `Overloaded`.
    pub section_inflight_max: usize,
    /// A stream writes a checkpoint after this many records, and drops the records behind it.
    pub checkpoint_every_records: u64,
    /// Most fans waiting on one event's waitlist; past it `QUEUE_FULL`.
    pub waitlist_max: usize,
    /// The payment provider (`None`: the built-in simulated one, recording in the data dir).
    pub payments: Option<Arc<dyn PaymentProvider>>,
    /// How the built-in simulated provider behaves (when `payments` is `None`).
    pub simulated_payments: SimulatedConfig,
}

impl EngineConfig {
    /// Defaults: `Sync` durability, system clock, 4 ledger shards, 10,000 messages in flight per
    /// section, a checkpoint every 100,000 records.
    pub fn new(data_dir: impl Into<PathBuf>) -> EngineConfig {
        EngineConfig {
            data_dir: data_dir.into(),
            durability: Durability::Sync,
            clock: Arc::new(SystemClock),
            ledger_shards: 4,
            section_inflight_max: 10_000,
            checkpoint_every_records: 100_000,
            waitlist_max: 100_000,
            payments: None,
            simulated_payments: SimulatedConfig::default(),
        }
    }
}

/// What the catalog stream records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum CatalogRecord {
    EventCreated {
        spec: EventSpec,
        event_id: EventId,
        created_at_ms: u64,
    },
}

/// What recovery found, for logs and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Events in the catalog.
    pub events: usize,
    /// Sections rebuilt.
    pub sections: usize,
    /// Log records replayed (after checkpoints).
    pub records_replayed: u64,
    /// Streams that started from a checkpoint.
    pub checkpoints_loaded: usize,
    /// Torn last records dropped.
    pub torn_tails_dropped: usize,
    /// Sold-seat keys without a durable confirm (a crash between claim and record), removed.
    pub orphan_claims_removed: usize,
    /// Time recovery took, in ms.
    pub duration_ms: u64,
}

/// The router: (event, section) to the actor that owns it. Nothing else lives in it.
#[derive(Default)]
pub struct Router {
    actors: DashMap<(EventId, SectionId), ActorRef<SectionMsg>>,
}

impl Router {
    fn get(&self, event: &EventId, section: &SectionId) -> Option<ActorRef<SectionMsg>> {
        self.actors
            .get(&(event.clone(), section.clone()))
            .map(|r| r.value().clone())
    }

    fn insert(&self, event: EventId, section: SectionId, actor: ActorRef<SectionMsg>) {
        self.actors.insert((event, section), actor);
    }

    /// Number of section actors.
    pub fn len(&self) -> usize {
        self.actors.len()
    }

    /// Whether there are no sections at all.
    pub fn is_empty(&self) -> bool {
        self.actors.is_empty()
    }
}

/// One section as the engine's catalog sees it: its published snapshot and its queue depth.
struct SectionSlot {
    section_id: SectionId,
    snapshot: watch::Receiver<Arc<SectionSnapshot>>,
    depth: Arc<AtomicUsize>,
}

struct EventEntry {
    spec: EventSpec,
    event_id: EventId,
    created_at_ms: u64,
    sections: Vec<SectionSlot>,
}

struct Inner {
    config: EngineConfig,
    store: Arc<Store>,
    ledger: Ledger,
    router: Router,
    events: DashMap<EventId, Arc<EventEntry>>,
    catalog: Mutex<StreamWriter>,
    ready: AtomicBool,
    recovery: std::sync::OnceLock<RecoveryReport>,
    notices: Notices,
    waitlist: ractor::ActorRef<WaitlistMsg>,
    payments: Arc<dyn PaymentProvider>,
}

/// What [`Engine::expire_section_offering`] did: the holds that ended, the section's next
/// deadline, one outcome per offer.
pub type ExpiredAndOffered = (
    Vec<HoldView>,
    Option<u64>,
    Vec<Result<HoldView, EngineError>>,
);

/// The engine: cheap to clone, shared by every caller.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// Most holds one `expire_due` call expires per section (bounded work per call).
pub const EXPIRE_PER_SECTION_MAX: usize = 1_024;

/// Whether the failpoint `name` is armed (`BOXOFFICE_FAILPOINT=name`), for crash tests that
/// need the process to die at an exact place.
fn failpoint(name: &str) -> bool {
    static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var("BOXOFFICE_FAILPOINT").ok())
        .as_deref()
        == Some(name)
}

fn fingerprint<T: Serialize>(value: &T) -> u64 {
    let bytes = codec::encode(value);
    let digest = Sha256::digest(&bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

fn idem_tag<T: Serialize>(key: &str, request: &T) -> Option<IdemTag> {
    (!key.is_empty()).then(|| IdemTag {
        key: key.to_owned(),
        fingerprint: fingerprint(request),
    })
}

impl Engine {
    /// Opens (or creates) the data dir, replays the log and starts the actors. Returns once the
    /// engine is ready to serve.
    pub async fn open(config: EngineConfig) -> Result<Engine, EngineError> {
        let started = Instant::now();
        std::fs::create_dir_all(&config.data_dir).map_err(|e| StorageError::Open {
            path: config.data_dir.display().to_string(),
            reason: e.to_string(),
        })?;
        // sled releases its file lock from a background thread a little after the last handle
        // of a previous instance is dropped (in this process or a dying one): retry briefly.
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let db = loop {
            match store::open_db(&config.data_dir) {
                Err(StorageError::Open { reason, .. })
                    if reason.contains("could not acquire lock") && Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                other => break other?,
            }
        };
        let mut report = RecoveryReport::default();
        let recovered = recover(&db, &config, &mut report)?;
        let store = Arc::new(Store::start(db.clone(), config.durability)?);

        // Ledger shards, with quotas and idempotency answers rebuilt from the sections.
        let shards = config.ledger_shards.max(1);
        let mut shard_states: Vec<ShardState> = recovered.ledger_states;
        let mut shard_refs = Vec::with_capacity(shards);
        for (i, state) in shard_states.drain(..).enumerate() {
            let stream = StreamWriter::open(&db, &format!("ledger/{i}"), recovered.ledger_last[i])?;
            let (actor, _) = Actor::spawn(
                None,
                LedgerShard,
                ShardArgs {
                    state,
                    stream,
                    store: store.clone(),
                    checkpoint_every: config.checkpoint_every_records,
                },
            )
            .await
            .map_err(|e| StorageError::Io(format!("cannot start a ledger shard: {e}")))?;
            shard_refs.push(actor);
        }
        let ledger = Ledger::new(shard_refs);
        let catalog = StreamWriter::open(&db, "catalog", recovered.catalog_last)?;
        let (waitlist, _) = Actor::spawn(
            None,
            WaitlistActor,
            WaitlistArgs {
                core: recovered.waitlist,
                stream: StreamWriter::open(&db, "waitlist", recovered.waitlist_last)?,
                store: store.clone(),
                checkpoint_every: config.checkpoint_every_records,
            },
        )
        .await
        .map_err(|e| StorageError::Io(format!("cannot start the waitlist: {e}")))?;
        let notices: Notices = Arc::new(std::sync::OnceLock::new());
        let payments: Arc<dyn PaymentProvider> = match &config.payments {
            Some(p) => p.clone(),
            None => SimulatedProvider::open(&db, config.simulated_payments.clone())
                .map_err(|e| StorageError::Io(format!("payments: {e}")))?,
        };
        let engine = Engine {
            inner: Arc::new(Inner {
                config: config.clone(),
                store,
                ledger,
                router: Router::default(),
                events: DashMap::new(),
                catalog: Mutex::new(catalog),
                ready: AtomicBool::new(false),
                recovery: std::sync::OnceLock::new(),
                notices,
                waitlist,
                payments,
            }),
        };
        let mut cores = recovered.cores;
        for (event_id, spec, created_at_ms) in recovered.events {
            let mut sections = Vec::new();
            for s in &spec.sections {
                let (core, last_seq) = cores
                    .remove(&(event_id.clone(), s.section_id.clone()))
                    .expect("recovery rebuilt every section of the catalog");
                sections.push((core, last_seq));
            }
            engine
                .start_event(event_id, spec, created_at_ms, sections)
                .await?;
        }
        report.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        metrics::gauge!("boxoffice_engine_recovery_seconds").set(started.elapsed().as_secs_f64());
        tracing::info!(?report, "engine recovered");
        let _ = engine.inner.recovery.set(report);
        engine.inner.ready.store(true, Ordering::SeqCst);
        Ok(engine)
    }

    /// What recovery found when this engine opened.
    pub fn recovery_report(&self) -> RecoveryReport {
        self.inner.recovery.get().cloned().unwrap_or_default()
    }

    /// Whether the engine serves (false before recovery finished and once shutdown began).
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::SeqCst)
    }

    fn check_ready(&self) -> Result<(), EngineError> {
        if !self.is_ready() {
            return Err(EngineError::NotReady);
        }
        self.inner.store.halt.check()?;
        Ok(())
    }

    /// Now, by the engine's clock (ms since the Unix epoch).
    pub fn now_ms(&self) -> u64 {
        self.inner.config.clock.now_ms()
    }

    /// Sets the one listener of engine notices (deadline changes, ended holds, waitlist joins).
    /// Returns false if one was set already.
    pub fn set_listener(&self, listener: Listener) -> bool {
        self.inner.notices.set(listener).is_ok()
    }

    async fn start_event(
        &self,
        event_id: EventId,
        spec: EventSpec,
        created_at_ms: u64,
        sections: Vec<(SectionCore, u64)>,
    ) -> Result<(), EngineError> {
        let inner = &self.inner;
        let mut slots = Vec::with_capacity(sections.len());
        for (core, last_seq) in sections {
            let section_id = core.spec().section_id.clone();
            let stream = StreamWriter::open(
                &inner.store.db,
                &section_stream(&event_id, &section_id),
                last_seq,
            )?;
            let (tx, rx) = watch::channel(Arc::new(core.snapshot(self.now_ms())));
            let depth = Arc::new(AtomicUsize::new(0));
            let (actor, _) = Actor::spawn(
                None,
                SectionActor,
                SectionArgs {
                    core,
                    stream,
                    store: inner.store.clone(),
                    clock: inner.config.clock.clone(),
                    ledger: inner.ledger.clone(),
                    snapshot: tx,
                    depth: depth.clone(),
                    checkpoint_every: inner.config.checkpoint_every_records,
                    notices: inner.notices.clone(),
                },
            )
            .await
            .map_err(|e| StorageError::Io(format!("cannot start a section actor: {e}")))?;
            inner
                .router
                .insert(event_id.clone(), section_id.clone(), actor);
            slots.push(SectionSlot {
                section_id,
                snapshot: rx,
                depth,
            });
        }
        inner.events.insert(
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
    /// starts one actor per section.
    pub async fn create_event(&self, spec: EventSpec) -> Result<EventView, EngineError> {
        self.check_ready()?;
        let spec = spec.with_defaults();
        spec.validate()?;
        let event_id = spec
            .event_id
            .clone()
            .unwrap_or_else(|| EventId(format!("ev-{}", ulid::Ulid::generate()).to_lowercase()));
        let mut catalog = self.inner.catalog.lock().await;
        if self.inner.events.contains_key(&event_id) {
            return Err(Rejection::EventExists.into());
        }
        let created_at_ms = self.now_ms();
        let mut spec = spec;
        spec.event_id = Some(event_id.clone());
        let record = CatalogRecord::EventCreated {
            spec: spec.clone(),
            event_id: event_id.clone(),
            created_at_ms,
        };
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
            .map(|s| (SectionCore::new(event_id.clone(), s.clone()), 0))
            .collect();
        self.start_event(event_id.clone(), spec, created_at_ms, sections)
            .await?;
        drop(catalog);
        metrics::counter!("boxoffice_engine_events_created_total").increment(1);
        self.event(&event_id)
    }

    fn entry(&self, event_id: &EventId) -> Result<Arc<EventEntry>, Rejection> {
        self.inner
            .events
            .get(event_id)
            .map(|e| e.value().clone())
            .ok_or(Rejection::EventNotFound)
    }

    /// An event with its sections' latest counts.
    pub fn event(&self, event_id: &EventId) -> Result<EventView, EngineError> {
        let e = self.entry(event_id)?;
        Ok(view_of(&e))
    }

    /// An event's settings without its sections (cheap: for the per-request paths).
    pub fn event_terms(&self, event_id: &EventId) -> Result<EventTerms, EngineError> {
        let e = self.entry(event_id)?;
        Ok(EventTerms {
            event_id: e.event_id.clone(),
            hold_ttl_ms: e.spec.hold_ttl_ms,
            per_user_limit: e.spec.per_user_limit,
            admit_rate_per_second: e.spec.admit_rate_per_second,
            admission_window_ms: e.spec.admission_window_ms,
            sale_opens_at_ms: e.spec.sale_opens_at_ms,
        })
    }

    /// Free places per section of an event, from the published snapshots (cheap: no spec).
    pub fn available_places(
        &self,
        event_id: &EventId,
    ) -> Result<Vec<(SectionId, u32)>, EngineError> {
        let e = self.entry(event_id)?;
        Ok(e.sections
            .iter()
            .map(|slot| (slot.section_id.clone(), slot.snapshot.borrow().available))
            .collect())
    }

    /// Every event, ordered by id.
    pub fn events(&self) -> Vec<EventView> {
        let mut all: Vec<EventView> = self
            .inner
            .events
            .iter()
            .map(|e| view_of(e.value()))
            .collect();
        all.sort_by(|a, b| a.event_id.cmp(&b.event_id));
        all
    }

    /// The latest published snapshots of an event (or of one section). Never enters a mailbox.
    pub fn seat_map(
        &self,
        event_id: &EventId,
        section: Option<&SectionId>,
    ) -> Result<SeatMap, EngineError> {
        let e = self.entry(event_id)?;
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
                as_of_ms: snap.as_of_ms,
            });
        }
        if sections.is_empty() {
            return Err(Rejection::SectionNotFound.into());
        }
        let as_of_ms = sections.iter().map(|s| s.as_of_ms).min().unwrap_or(0);
        Ok(SeatMap {
            event_id: event_id.clone(),
            as_of_ms,
            sections,
        })
    }

    /// Sends a message to a section actor, refusing if its queue is at the bound.
    async fn ask<T: Send + 'static>(
        &self,
        event: &EventEntry,
        section: &SectionId,
        build: impl FnOnce(ractor::RpcReplyPort<Result<T, EngineError>>) -> SectionMsg,
    ) -> Result<T, EngineError> {
        let slot = event
            .sections
            .iter()
            .find(|s| &s.section_id == section)
            .ok_or(Rejection::SectionNotFound)?;
        let actor = self
            .inner
            .router
            .get(&event.event_id, section)
            .ok_or(Rejection::SectionNotFound)?;
        let depth = slot.depth.fetch_add(1, Ordering::AcqRel);
        if depth >= self.inner.config.section_inflight_max {
            slot.depth.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!("boxoffice_engine_shed_total", "scope" => "section").increment(1);
            return Err(EngineError::Overloaded("section queue full"));
        }
        match actor.call(build, None).await {
            Ok(r) => r.success_or(EngineError::NotReady)?,
            Err(_) => {
                slot.depth.fetch_sub(1, Ordering::AcqRel);
                Err(EngineError::NotReady)
            }
        }
    }

    /// Holds places: exact seats, or best available in a section or anywhere in the event.
    /// Reserves the user's quota first and gives it back if the hold fails.
    pub async fn hold(&self, req: HoldRequest) -> Result<HoldView, EngineError> {
        self.check_ready()?;
        check_user_id(&req.user_id)?;
        check_idempotency_key(&req.idempotency_key)?;
        let event = self.entry(&req.event_id)?;
        let (candidates, quantity, pick) = hold_plan(&event, &req.selection)?;
        if self.now_ms() < event.spec.sale_opens_at_ms {
            return Err(Rejection::SaleNotOpen.into());
        }
        let tag = idem_tag(
            &req.idempotency_key,
            &(Rpc::Hold, &req.event_id, &req.selection),
        );
        let args = || BeginArgs {
            event_id: req.event_id.clone(),
            user_id: req.user_id.clone(),
            limit: event.spec.per_user_limit,
            rpc: Rpc::Hold,
            tag: tag.clone(),
            quantity,
        };
        match self.inner.ledger.begin(args()).await? {
            Begin::Replay(answer) => return replayed_hold(answer),
            Begin::Proceed => {}
        }
        let mut outcome: Result<HoldView, EngineError> = Err(Rejection::SoldOut.into());
        let any_section = candidates.len() > 1;
        for section in candidates {
            if any_section {
                let slot = event.sections.iter().find(|s| s.section_id == section);
                if slot.is_some_and(|s| s.snapshot.borrow().available < quantity) {
                    continue;
                }
            }
            let cmd = PlaceHold {
                hold_id: HoldId::generate(&req.event_id, &section),
                user_id: req.user_id.clone(),
                pick: pick.clone(),
                ttl_ms: event.spec.hold_ttl_ms,
                idem: tag.clone(),
            };
            outcome = self
                .ask(&event, &section, |reply| SectionMsg::Hold(cmd, reply))
                .await;
            match &outcome {
                Err(EngineError::Rejected(Rejection::SoldOut)) if any_section => continue,
                _ => break,
            }
        }
        match &outcome {
            // Without a key, a success leaves nothing to settle: the quota stays reserved.
            Ok(_) if tag.is_none() => {}
            Ok(view) => self
                .inner
                .ledger
                .settled(args(), Answer::Hold(view.clone())),
            Err(e) => self.inner.ledger.finish(args(), Err(e.clone())).await?,
        }
        outcome
    }

    /// The first answer already given to this request's idempotency key, if it was settled with
    /// this same request; `None` otherwise (no key, unknown key, other request, in flight).
    /// Changes nothing: for callers that must answer a replay before re-checking permissions
    /// that may have lapsed since (an admission window).
    pub async fn replayed_hold(
        &self,
        req: &HoldRequest,
    ) -> Result<Option<Result<HoldView, EngineError>>, EngineError> {
        self.check_ready()?;
        let Some(tag) = idem_tag(
            &req.idempotency_key,
            &(Rpc::Hold, &req.event_id, &req.selection),
        ) else {
            return Ok(None);
        };
        let found = self
            .inner
            .ledger
            .lookup(req.user_id.clone(), Rpc::Hold, tag)
            .await?;
        Ok(found.map(replayed_hold))
    }

    /// Confirms a hold: charges the payment token through the payment provider (idempotency key
    /// derived from the hold and the token, so retries never charge twice), then the places
    /// become sold and an order with one ticket per place is made, durable before the answer.
    /// Declined: `PaymentDeclined`, the hold stays. Provider timeout or failure: no order,
    /// `PaymentUnavailable`; a retry with the same token finds the charge's real outcome. Paid
    /// but the hold expired meanwhile: the same places are taken again if free, else the charge
    /// is refunded and the answer is `HoldExpired`. Never a charge without a ticket or a refund
    /// (short of a crash between the charge and the order, which a retry or the reconciliation
    /// settles).
    pub async fn confirm(&self, req: ConfirmRequest) -> Result<OrderView, EngineError> {
        self.check_ready()?;
        check_user_id(&req.user_id)?;
        check_idempotency_key(&req.idempotency_key)?;
        if req.payment_ref.is_empty() || req.payment_ref.len() > 256 {
            return Err(Rejection::invalid("payment_token", "must be 1 to 256 bytes").into());
        }
        let (event_id, section_id) = req.hold_id.route().ok_or(Rejection::HoldNotFound)?;
        let event = self.entry(&event_id).map_err(|_| Rejection::HoldNotFound)?;
        let tag = idem_tag(
            &req.idempotency_key,
            &(Rpc::Confirm, &req.hold_id, &req.payment_ref),
        );
        let args = || BeginArgs {
            event_id: event_id.clone(),
            user_id: req.user_id.clone(),
            limit: event.spec.per_user_limit,
            rpc: Rpc::Confirm,
            tag: tag.clone(),
            quantity: 0,
        };
        if tag.is_some() {
            match self.inner.ledger.begin(args()).await? {
                Begin::Replay(answer) => return replayed_order(answer),
                Begin::Proceed => {}
            }
        }
        let outcome = self.checkout(&event, &section_id, &req, tag.clone()).await;
        let label = match &outcome {
            Ok(_) => "confirmed",
            Err(EngineError::Rejected(r)) => r.reason(),
            Err(EngineError::PaymentUnavailable { timeout: true, .. }) => "PAYMENT_TIMEOUT",
            Err(EngineError::PaymentUnavailable { .. }) => "PAYMENT_UNAVAILABLE",
            Err(_) => "error",
        };
        metrics::counter!("boxoffice_checkout_confirms_total", "outcome" => label).increment(1);
        if tag.is_some() {
            match &outcome {
                Ok(order) => self
                    .inner
                    .ledger
                    .settled(args(), Answer::Order(order.clone())),
                Err(e) => self.inner.ledger.finish(args(), Err(e.clone())).await?,
            }
        }
        outcome
    }

    async fn checkout(
        &self,
        event: &EventEntry,
        section_id: &SectionId,
        req: &ConfirmRequest,
        tag: Option<IdemTag>,
    ) -> Result<OrderView, EngineError> {
        let hold = self
            .get_hold(&req.hold_id)
            .await
            .map_err(not_found_as(Rejection::HoldNotFound))?;
        if hold.user_id != req.user_id {
            return Err(Rejection::HoldNotFound.into());
        }
        match hold.status {
            HoldStatus::Held => {}
            HoldStatus::Expired => return Err(Rejection::HoldExpired.into()),
            HoldStatus::Confirmed | HoldStatus::Released => {
                return Err(Rejection::HoldNotActive.into());
            }
        }
        // Charging for a hold already past its deadline would only buy a refund: expire it
        // (as a section does when a confirm comes late) and say so.
        if self.now_ms() >= hold.expires_at_ms {
            let h = req.hold_id.clone();
            self.ask(event, section_id, |reply| {
                SectionMsg::ExpireHoldIfDue(h, reply)
            })
            .await?;
            return Err(Rejection::HoldExpired.into());
        }
        let price = event
            .spec
            .sections
            .iter()
            .find(|s| &s.section_id == section_id)
            .map_or(0, |s| s.price_cents);
        let amount = price * u64::from(hold.quantity);
        let key = format!("{}:{:016x}", req.hold_id, fingerprint(&req.payment_ref));
        let started = Instant::now();
        let charged = self
            .inner
            .payments
            .charge(&key, amount, &req.payment_ref)
            .await;
        metrics::histogram!("boxoffice_payment_charge_seconds")
            .record(started.elapsed().as_secs_f64());
        let charge = match charged {
            Ok(c) => {
                // Crash tests: die between the charge and the order.
                if failpoint("after_charge") {
                    std::process::abort();
                }
                c
            }
            Err(PaymentError::Declined) => return Err(Rejection::PaymentDeclined.into()),
            Err(PaymentError::InvalidToken) => {
                return Err(Rejection::invalid(
                    "payment_token",
                    "not a token the payment provider takes",
                )
                .into());
            }
            Err(e) => {
                return Err(EngineError::PaymentUnavailable {
                    timeout: e == PaymentError::Timeout,
                    reason: e.to_string(),
                });
            }
        };
        match self
            .confirm_in_section(
                event,
                section_id,
                &req.hold_id,
                &req.user_id,
                &charge,
                tag.clone(),
            )
            .await
        {
            Ok(order) => Ok(order),
            Err(EngineError::Rejected(Rejection::HoldExpired)) => {
                self.rescue_or_refund(event, section_id, &hold, &charge, tag)
                    .await
            }
            Err(EngineError::Rejected(r)) => {
                self.refund(&charge).await;
                Err(r.into())
            }
            // Not a definite answer: the charge stays; a retry with the same token finds it.
            Err(e) => Err(e),
        }
    }

    async fn confirm_in_section(
        &self,
        event: &EventEntry,
        section_id: &SectionId,
        hold_id: &HoldId,
        user_id: &UserId,
        charge: &Charge,
        tag: Option<IdemTag>,
    ) -> Result<OrderView, EngineError> {
        let cmd = ConfirmHold {
            hold_id: hold_id.clone(),
            user_id: user_id.clone(),
            order_id: OrderId::generate(&event.event_id, section_id),
            payment_ref: charge.payment_id.clone(),
            idem: tag,
        };
        self.ask(event, section_id, |reply| SectionMsg::Confirm(cmd, reply))
            .await
            .map_err(not_found_as(Rejection::HoldNotFound))
    }

    /// Paid, but the hold expired meanwhile: take the same places again if they are free and
    /// confirm them; otherwise refund and answer `HoldExpired`.
    async fn rescue_or_refund(
        &self,
        event: &EventEntry,
        section_id: &SectionId,
        hold: &HoldView,
        charge: &Charge,
        tag: Option<IdemTag>,
    ) -> Result<OrderView, EngineError> {
        let selection = if hold.seat_ids.is_empty() {
            Selection::BestAvailable {
                section: Some(section_id.clone()),
                quantity: hold.quantity,
            }
        } else {
            Selection::Seats(hold.seat_ids.clone())
        };
        let again = self
            .hold(HoldRequest {
                event_id: event.event_id.clone(),
                user_id: hold.user_id.clone(),
                idempotency_key: String::new(),
                selection,
            })
            .await;
        if let Ok(new_hold) = again {
            match self
                .confirm_in_section(
                    event,
                    section_id,
                    &new_hold.hold_id,
                    &hold.user_id,
                    charge,
                    tag,
                )
                .await
            {
                Ok(order) => {
                    metrics::counter!("boxoffice_checkout_rescued_total").increment(1);
                    return Ok(order);
                }
                Err(e) => {
                    tracing::warn!(error = %e, hold = %new_hold.hold_id, "rescue confirm failed");
                    let _ = self.release(&new_hold.hold_id, &hold.user_id).await;
                }
            }
        }
        self.refund(charge).await;
        Err(Rejection::HoldExpired.into())
    }

    async fn refund(&self, charge: &Charge) {
        match self.inner.payments.refund(&charge.payment_id).await {
            Ok(_) => metrics::counter!("boxoffice_checkout_refunds_total").increment(1),
            // Left for the reconciliation to report: a captured payment without an order.
            Err(e) => tracing::error!(error = %e, payment = %charge.payment_id, "refund failed"),
        }
    }

    /// The payment provider.
    pub fn payments(&self) -> Arc<dyn PaymentProvider> {
        self.inner.payments.clone()
    }

    /// Checks sold seats against orders, payments and the sold-seat backstop, and every
    /// section's counters; returns what does not add up.
    pub async fn reconcile(&self) -> Result<Vec<Finding>, EngineError> {
        crate::reconcile::run(self).await
    }

    /// Every section whose state breaks an invariant (counts, seats, holds, orders), one line
    /// each: `{event}/{section}: what is wrong`. Empty when all is well.
    pub async fn invariant_violations(&self) -> Result<Vec<String>, EngineError> {
        let mut out = Vec::new();
        for e in self.events() {
            for s in &e.sections {
                let core = self
                    .inspect_section(&e.event_id, &s.spec.section_id)
                    .await?;
                if let Err(detail) = core.check_invariants() {
                    out.push(format!("{}/{}: {detail}", e.event_id, s.spec.section_id));
                }
            }
        }
        Ok(out)
    }

    /// Every order of every section (for reconciliation and tools).
    pub async fn orders(&self) -> Result<Vec<OrderView>, EngineError> {
        let mut out = Vec::new();
        for e in self.event_entries() {
            for slot in &e.sections {
                let core = self.inspect_section(&e.event_id, &slot.section_id).await?;
                out.extend(core.orders());
            }
        }
        Ok(out)
    }

    /// Releases a hold (by its holder). Its places are free again and count against nobody.
    pub async fn release(
        &self,
        hold_id: &HoldId,
        user_id: &UserId,
    ) -> Result<HoldView, EngineError> {
        self.check_ready()?;
        check_user_id(user_id)?;
        let (event_id, section_id) = hold_id.route().ok_or(Rejection::HoldNotFound)?;
        let event = self.entry(&event_id).map_err(|_| Rejection::HoldNotFound)?;
        let (h, u) = (hold_id.clone(), user_id.clone());
        self.ask(&event, &section_id, |reply| {
            SectionMsg::Release(h, u, reply)
        })
        .await
        .map_err(not_found_as(Rejection::HoldNotFound))
    }

    /// A hold as it is now.
    pub async fn get_hold(&self, hold_id: &HoldId) -> Result<HoldView, EngineError> {
        self.check_ready()?;
        let (event_id, section_id) = hold_id.route().ok_or(Rejection::HoldNotFound)?;
        let event = self.entry(&event_id).map_err(|_| Rejection::HoldNotFound)?;
        let h = hold_id.clone();
        self.ask(&event, &section_id, |reply| SectionMsg::GetHold(h, reply))
            .await
            .map_err(not_found_as(Rejection::HoldNotFound))
    }

    /// An order.
    pub async fn get_order(&self, order_id: &OrderId) -> Result<OrderView, EngineError> {
        self.check_ready()?;
        let (event_id, section_id) = order_id.route().ok_or(Rejection::OrderNotFound)?;
        let event = self
            .entry(&event_id)
            .map_err(|_| Rejection::OrderNotFound)?;
        let o = order_id.clone();
        self.ask(&event, &section_id, |reply| SectionMsg::GetOrder(o, reply))
            .await
            .map_err(not_found_as(Rejection::OrderNotFound))
    }

    /// Expires every hold whose deadline has passed (by the engine's clock), at most
    /// `max_per_section` per section per call; returns the holds it expired.
    pub async fn expire_due(&self, max_per_section: usize) -> Result<Vec<HoldView>, EngineError> {
        self.check_ready()?;
        let mut out = Vec::new();
        for e in self.event_entries() {
            for slot in &e.sections {
                let (expired, _) = self
                    .expire_section(&e.event_id, &slot.section_id, max_per_section)
                    .await?;
                out.extend(expired);
            }
        }
        Ok(out)
    }

    /// Expires at most `max` due holds of one section; returns them and the section's next
    /// deadline (which may already be due if `max` was reached).
    pub async fn expire_section(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
        max: usize,
    ) -> Result<(Vec<HoldView>, Option<u64>), EngineError> {
        let (ended, next, _) = self
            .expire_section_offering(event_id, section_id, max, &[])
            .await?;
        Ok((ended, next))
    }

    /// Expires what is due in a section (at most `max` holds) and then, in the same step of the
    /// section's actor, places a hold for each of `offers` (user, quantity), in order, each all or
    /// nothing at the best available places of this section, with the event's TTL. No request
    /// queued behind can take the freed places first: waiting fans are served before new ones.
    /// Quota is reserved per offer as for any hold (USER_LIMIT skips that fan) and given back
    /// for each offer that did not fit. Returns the ended holds, the section's next deadline and
    /// one outcome per offer.
    pub async fn expire_section_offering(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
        max: usize,
        offers: &[(UserId, u32)],
    ) -> Result<ExpiredAndOffered, EngineError> {
        self.check_ready()?;
        let max = max.clamp(1, EXPIRE_PER_SECTION_MAX);
        let e = self.entry(event_id)?;
        if !e.sections.iter().any(|slot| &slot.section_id == section_id) {
            return Err(Rejection::SectionNotFound.into());
        }
        let args = |user: &UserId, quantity: u32| BeginArgs {
            event_id: event_id.clone(),
            user_id: user.clone(),
            limit: e.spec.per_user_limit,
            rpc: Rpc::Hold,
            tag: None,
            quantity,
        };
        let mut outcomes: Vec<Option<Result<HoldView, EngineError>>> =
            offers.iter().map(|_| None).collect();
        // Reserve every offer's quota at once (one round trip of waiting, not one per offer:
        // the sweeper does this while sections' deadlines wait for it).
        let mut asks = Vec::new();
        for (k, (user, quantity)) in offers.iter().enumerate() {
            if *quantity == 0 || *quantity > crate::core::PLACES_PER_HOLD_MAX {
                outcomes[k] = Some(Err(Rejection::invalid(
                    "quantity",
                    format!("must be 1 to {}", crate::core::PLACES_PER_HOLD_MAX),
                )
                .into()));
                continue;
            }
            let a = args(user, *quantity);
            let ledger = &self.inner.ledger;
            asks.push(async move { (k, user, *quantity, ledger.begin(a).await) });
        }
        let (mut plans, mut reserved) = (Vec::new(), Vec::new());
        for (k, user, quantity, begun) in futures_util::future::join_all(asks).await {
            match begun {
                Ok(Begin::Proceed) => {
                    plans.push(PlaceHold {
                        hold_id: HoldId::generate(event_id, section_id),
                        user_id: user.clone(),
                        pick: Pick::Best(quantity),
                        ttl_ms: e.spec.hold_ttl_ms,
                        idem: None,
                    });
                    reserved.push((k, user, quantity));
                }
                // Without a key there is nothing to replay; never reached.
                Ok(Begin::Replay(_)) => outcomes[k] = Some(Err(EngineError::NotReady)),
                Err(err) => outcomes[k] = Some(Err(err)),
            }
        }
        let done = self
            .ask(&e, section_id, |reply| {
                SectionMsg::ExpireDue(max, plans, reply)
            })
            .await;
        // Quota of offers not placed goes back; a ledger that cannot take it (only while
        // shutting down) is logged, and the rest still goes back and the outcomes still return.
        let give_back = |user: &UserId, quantity: u32, err: EngineError| {
            let ledger = &self.inner.ledger;
            let a = args(user, quantity);
            async move {
                if let Err(e) = ledger.finish(a, Err(err)).await {
                    tracing::error!(error = %e, "cannot give back an offer's quota");
                }
            }
        };
        let done = match done {
            Ok(d) => d,
            Err(err) => {
                futures_util::future::join_all(
                    reserved
                        .into_iter()
                        .map(|(_, user, quantity)| give_back(user, quantity, err.clone())),
                )
                .await;
                return Err(err);
            }
        };
        let mut returns = Vec::new();
        for ((k, user, quantity), placed) in reserved.into_iter().zip(done.offers) {
            outcomes[k] = Some(match placed {
                Ok(view) => Ok(view),
                Err(r) => {
                    let err = EngineError::from(r);
                    returns.push(give_back(user, quantity, err.clone()));
                    Err(err)
                }
            });
        }
        futures_util::future::join_all(returns).await;
        let outcomes = outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Err(EngineError::NotReady)))
            .collect();
        Ok((done.ended, done.next, outcomes))
    }

    /// Every section's earliest active-hold deadline.
    pub async fn next_deadlines(
        &self,
    ) -> Result<Vec<(EventId, SectionId, Option<u64>)>, EngineError> {
        self.check_ready()?;
        let mut out = Vec::new();
        for e in self.event_entries() {
            for slot in &e.sections {
                let d = self
                    .ask(&e, &slot.section_id, SectionMsg::NextDeadline)
                    .await?;
                out.push((e.event_id.clone(), slot.section_id.clone(), d));
            }
        }
        Ok(out)
    }

    /// The earliest deadline of any active hold, if any (for the sweeper's sleep).
    pub async fn next_deadline_ms(&self) -> Result<Option<u64>, EngineError> {
        self.check_ready()?;
        let mut next: Option<u64> = None;
        for e in self.event_entries() {
            for slot in &e.sections {
                let d = self
                    .ask(&e, &slot.section_id, SectionMsg::NextDeadline)
                    .await?;
                next = match (next, d) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        Ok(next)
    }

    fn event_entries(&self) -> Vec<Arc<EventEntry>> {
        self.inner
            .events
            .iter()
            .map(|e| e.value().clone())
            .collect()
    }

    async fn ask_waitlist<T: Send + 'static>(
        &self,
        build: impl FnOnce(ractor::RpcReplyPort<Result<T, EngineError>>) -> WaitlistMsg,
    ) -> Result<T, EngineError> {
        self.inner
            .waitlist
            .call(build, None)
            .await
            .map_err(|_| EngineError::NotReady)?
            .success_or(EngineError::NotReady)?
    }

    /// Joins an event's waitlist for `quantity` places (all or nothing) in `section` (`None`:
    /// any). A fan has at most one active entry per event: joining again returns it.
    pub async fn join_waitlist(
        &self,
        event_id: &EventId,
        user_id: &UserId,
        section: Option<SectionId>,
        quantity: u32,
    ) -> Result<WaitlistView, EngineError> {
        self.check_ready()?;
        check_user_id(user_id)?;
        let e = self.entry(event_id)?;
        if let Some(s) = &section
            && !e.sections.iter().any(|slot| &slot.section_id == s)
        {
            return Err(Rejection::SectionNotFound.into());
        }
        if quantity == 0 || quantity > e.spec.per_user_limit {
            return Err(Rejection::invalid(
                "quantity",
                format!(
                    "must be 1 to the per-user limit ({})",
                    e.spec.per_user_limit
                ),
            )
            .into());
        }
        let entry_id = format!("{event_id}.w{}", ulid::Ulid::generate());
        let (event, user, max, now) = (
            event_id.clone(),
            user_id.clone(),
            self.inner.config.waitlist_max,
            self.now_ms(),
        );
        let view = self
            .ask_waitlist(|reply| WaitlistMsg::Join {
                entry_id,
                event_id: event,
                user_id: user,
                section_id: section,
                quantity,
                max,
                now_ms: now,
                reply,
            })
            .await?;
        crate::section::notify(
            &self.inner.notices,
            Notice::WaitlistJoined {
                event_id: event_id.clone(),
            },
        );
        Ok(view)
    }

    /// A waitlist entry.
    pub async fn waitlist_entry(&self, entry_id: &str) -> Result<WaitlistView, EngineError> {
        self.check_ready()?;
        let id = entry_id.to_owned();
        self.ask_waitlist(|reply| WaitlistMsg::Get(id, reply)).await
    }

    /// The first `n` waiting entries of an event that would take places of `section`.
    pub async fn waitlist_candidates(
        &self,
        event_id: &EventId,
        section: Option<&SectionId>,
        n: usize,
    ) -> Result<Vec<WaitlistView>, EngineError> {
        let (e, s) = (event_id.clone(), section.cloned());
        self.ask_waitlist(|reply| WaitlistMsg::Candidates(e, s, n, reply))
            .await
    }

    /// Records that `hold_id` was offered to a waiting entry (idempotent for the same hold).
    pub async fn waitlist_offer(
        &self,
        entry_id: &str,
        hold_id: &HoldId,
    ) -> Result<WaitlistView, EngineError> {
        let (id, h) = (entry_id.to_owned(), hold_id.clone());
        self.ask_waitlist(|reply| WaitlistMsg::Offer(id, h, reply))
            .await
    }

    /// Ends an entry (`Expired` or `Fulfilled`); an entry that ended already stays as it is.
    pub async fn waitlist_end(
        &self,
        entry_id: &str,
        state: WaitlistState,
    ) -> Result<WaitlistView, EngineError> {
        let id = entry_id.to_owned();
        self.ask_waitlist(|reply| WaitlistMsg::End(id, state, reply))
            .await
    }

    /// The entry a hold was offered to, if any.
    pub async fn waitlist_entry_of_hold(
        &self,
        hold_id: &HoldId,
    ) -> Result<Option<WaitlistView>, EngineError> {
        let h = hold_id.clone();
        self.ask_waitlist(|reply| WaitlistMsg::OfHold(h, reply))
            .await
    }

    /// Every entry with an outstanding offer.
    pub async fn waitlist_offered(&self) -> Result<Vec<WaitlistView>, EngineError> {
        self.ask_waitlist(WaitlistMsg::Offered).await
    }

    /// Events with fans waiting.
    pub async fn waitlist_events(&self) -> Result<Vec<EventId>, EngineError> {
        self.ask_waitlist(WaitlistMsg::EventsWaiting).await
    }

    /// Fans waiting on an event's waitlist.
    pub async fn waitlist_len(&self, event_id: &EventId) -> Result<usize, EngineError> {
        let e = event_id.clone();
        self.ask_waitlist(|reply| WaitlistMsg::Len(e, reply)).await
    }

    /// Places the user holds or owns for the event, as the ledger counts them.
    pub async fn user_usage(
        &self,
        event_id: &EventId,
        user_id: &UserId,
    ) -> Result<u32, EngineError> {
        self.inner
            .ledger
            .usage(event_id.clone(), user_id.clone())
            .await
    }

    /// A copy of a section's core (for invariant checks, tests and tools).
    pub async fn inspect_section(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
    ) -> Result<SectionCore, EngineError> {
        let e = self.entry(event_id)?;
        Ok(*self.ask(&e, section_id, SectionMsg::Inspect).await?)
    }

    /// The live sled database, for tools and tests that inspect or damage the store on purpose.
    pub fn raw_db(&self) -> sled::Db {
        self.inner.store.db.clone()
    }

    /// Orderly stop: refuse new work, stop the actors, flush the log and close it.
    pub async fn shutdown(&self) {
        self.inner.ready.store(false, Ordering::SeqCst);
        self.stop_actors().await;
        self.inner.store.close();
    }

    /// Stops as a crash would (for recovery tests): the log takes nothing more, queued writes
    /// are lost, nothing is flushed. Acknowledged work (with `Durability::Sync`) is durable.
    pub async fn crash(&self) {
        self.inner.ready.store(false, Ordering::SeqCst);
        self.inner.store.halt_now("simulated crash");
        self.stop_actors().await;
        self.inner.store.close();
    }

    async fn stop_actors(&self) {
        let actors: Vec<ActorRef<SectionMsg>> = self
            .inner
            .router
            .actors
            .iter()
            .map(|e| e.value().clone())
            .collect();
        for actor in actors {
            let _ = actor.stop_and_wait(None, None).await;
        }
        for shard in self.inner.ledger.actors() {
            let _ = shard.stop_and_wait(None, None).await;
        }
        let _ = self.inner.waitlist.stop_and_wait(None, None).await;
        // An actor's state (with its handles on the store) may be dropped just after it reports
        // stopped; wait for that, so the data dir is free once the last `Engine` goes.
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while Arc::strong_count(&self.inner.store) > 1 && Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

use crate::raw::section_stream;

fn not_found_as(r: Rejection) -> impl Fn(EngineError) -> EngineError {
    move |e| match e {
        EngineError::Rejected(Rejection::SectionNotFound) => r.clone().into(),
        e => e,
    }
}

fn replayed_hold(answer: Result<Answer, Rejection>) -> Result<HoldView, EngineError> {
    match answer {
        Ok(Answer::Hold(v)) => Ok(v),
        Ok(Answer::Order(_)) => Err(Rejection::IdempotencyKeyReused.into()),
        Err(r) => Err(r.into()),
    }
}

fn replayed_order(answer: Result<Answer, Rejection>) -> Result<OrderView, EngineError> {
    match answer {
        Ok(Answer::Order(v)) => Ok(v),
        Ok(Answer::Hold(_)) => Err(Rejection::IdempotencyKeyReused.into()),
        Err(r) => Err(r.into()),
    }
}

/// Which sections a hold may try, how many places it takes, and how each section picks them.
fn hold_plan(
    event: &EventEntry,
    selection: &Selection,
) -> Result<(Vec<SectionId>, u32, Pick), Rejection> {
    match selection {
        Selection::Seats(ids) => {
            if ids.is_empty() {
                return Err(Rejection::invalid("seat_ids", "name at least one seat"));
            }
            let mut section: Option<&str> = None;
            for id in ids {
                let (s, _, _) = id.parse().ok_or_else(|| {
                    Rejection::invalid("seat_ids", "a seat id is {section_id}:{row}:{number}")
                })?;
                match section {
                    None => section = Some(s),
                    Some(prev) if prev != s => {
                        return Err(Rejection::invalid(
                            "seat_ids",
                            "all seats of one hold must be in one section",
                        ));
                    }
                    Some(_) => {}
                }
            }
            let section = SectionId::from(section.unwrap_or_default());
            if !event.sections.iter().any(|s| s.section_id == section) {
                return Err(Rejection::SeatNotFound(ids[0].clone()));
            }
            let quantity = u32::try_from(ids.len()).unwrap_or(u32::MAX);
            Ok((vec![section], quantity, Pick::Seats(ids.clone())))
        }
        Selection::BestAvailable { section, quantity } => {
            if *quantity == 0 || *quantity > crate::core::PLACES_PER_HOLD_MAX {
                return Err(Rejection::invalid(
                    "quantity",
                    format!("must be 1 to {}", crate::core::PLACES_PER_HOLD_MAX),
                ));
            }
            let candidates = match section {
                Some(s) => {
                    if !event.sections.iter().any(|slot| &slot.section_id == s) {
                        return Err(Rejection::SectionNotFound);
                    }
                    vec![s.clone()]
                }
                None => event
                    .sections
                    .iter()
                    .map(|s| s.section_id.clone())
                    .collect(),
            };
            Ok((candidates, *quantity, Pick::Best(*quantity)))
        }
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

struct Recovered {
    waitlist: WaitlistCore,
    waitlist_last: u64,
    events: Vec<(EventId, EventSpec, u64)>,
    cores: HashMap<(EventId, SectionId), (SectionCore, u64)>,
    catalog_last: u64,
    ledger_states: Vec<ShardState>,
    ledger_last: Vec<u64>,
}

fn corrupt(stream: &str, seq: u64, reason: impl Into<String>) -> StorageError {
    StorageError::Corrupt {
        stream: stream.to_owned(),
        seq,
        reason: reason.into(),
    }
}

/// Replays the whole log: catalog, sections (from their checkpoints), ledgers; rebuilds quotas
/// and idempotency answers; reconciles the sold-seat backstop with the confirmed holds.
fn recover(
    db: &sled::Db,
    config: &EngineConfig,
    report: &mut RecoveryReport,
) -> Result<Recovered, StorageError> {
    let io = |e: sled::Error| StorageError::Io(e.to_string());
    let checkpoints = db.open_tree("checkpoints").map_err(io)?;
    let catalog_tree = db.open_tree("catalog").map_err(io)?;
    let catalog = store::read_stream::<CatalogRecord>(&checkpoints, "catalog", &catalog_tree)?;
    report.torn_tails_dropped += usize::from(catalog.dropped_tail);
    let mut events = Vec::new();
    let mut cores = HashMap::new();
    let shards = config.ledger_shards.max(1);
    let mut ledger_states: Vec<ShardState> = (0..shards).map(|_| ShardState::default()).collect();
    for (
        _,
        CatalogRecord::EventCreated {
            spec,
            event_id,
            created_at_ms,
        },
    ) in catalog.records
    {
        for s in &spec.sections {
            let name = section_stream(&event_id, &s.section_id);
            let tree = db.open_tree(&name).map_err(io)?;
            let replay = store::read_stream::<SectionRecord>(&checkpoints, &name, &tree)?;
            report.torn_tails_dropped += usize::from(replay.dropped_tail);
            let mut core = match &replay.checkpoint {
                Some((seq, blob)) => {
                    report.checkpoints_loaded += 1;
                    codec::decode::<SectionCore>(blob)
                        .map_err(|e| corrupt(&format!("checkpoints/{name}"), *seq, e.to_string()))?
                }
                None => SectionCore::new(event_id.clone(), s.clone()),
            };
            for (seq, record) in &replay.records {
                core.apply(record).map_err(|e| corrupt(&name, *seq, e))?;
                report.records_replayed += 1;
            }
            core.check_invariants()
                .map_err(|e| corrupt(&name, replay.last_seq, e))?;
            for (view, hold_tag, confirm) in core.holds_for_ledger() {
                let shard = &mut ledger_states[shard_index(&view.user_id, shards)];
                if matches!(view.status, HoldStatus::Held | HoldStatus::Confirmed) {
                    shard.add_quota(event_id.clone(), view.user_id.clone(), view.quantity);
                }
                if let Some((tag, order)) = confirm {
                    shard.add_answer(
                        view.user_id.clone(),
                        Rpc::Confirm,
                        tag,
                        Ok(Answer::Order(order)),
                    );
                }
                if let Some(tag) = hold_tag {
                    let mut first = view.clone();
                    first.status = HoldStatus::Held;
                    shard.add_answer(
                        view.user_id.clone(),
                        Rpc::Hold,
                        tag,
                        Ok(Answer::Hold(first)),
                    );
                }
            }
            report.sections += 1;
            cores.insert(
                (event_id.clone(), s.section_id.clone()),
                (core, replay.last_seq),
            );
        }
        report.events += 1;
        events.push((event_id, spec, created_at_ms));
    }
    // Ledger streams: recorded rejections. Read every ledger tree there is (the shard count
    // may have changed) and give each entry to its user's current shard.
    let mut ledger_last = vec![0u64; shards];
    for name in db.tree_names() {
        let name = String::from_utf8_lossy(&name).into_owned();
        let Some(index) = name.strip_prefix("ledger/") else {
            continue;
        };
        let tree = db.open_tree(&name).map_err(io)?;
        let replay = store::read_stream::<LedgerRecord>(&checkpoints, &name, &tree)?;
        report.torn_tails_dropped += usize::from(replay.dropped_tail);
        if let Ok(i) = index.parse::<usize>()
            && i < shards
        {
            ledger_last[i] = replay.last_seq;
        }
        let mut staging = ShardState::default();
        if let Some((seq, blob)) = &replay.checkpoint {
            report.checkpoints_loaded += 1;
            staging
                .load_checkpoint(blob)
                .map_err(|e| corrupt(&format!("checkpoints/{name}"), *seq, e.to_string()))?;
        }
        for (_, record) in replay.records {
            report.records_replayed += 1;
            let LedgerRecord::RejectionRecorded {
                user_id,
                rpc,
                tag,
                rejection,
            } = record;
            ledger_states[shard_index(&user_id, shards)].add_answer(
                user_id,
                rpc,
                &tag,
                Err(rejection),
            );
        }
        for (user_id, rpc, tag, rejection) in staging.into_rejections() {
            ledger_states[shard_index(&user_id, shards)].add_answer(
                user_id,
                rpc,
                &tag,
                Err(rejection),
            );
        }
    }
    // The backstop: a claim without a durable confirm is an orphan of a crash between the claim
    // and the record (the confirm was never acknowledged); a confirm without its claim gets one.
    let sold = db.open_tree("sold").map_err(io)?;
    let mut expected: HashMap<String, HoldId> = HashMap::new();
    for (core, _) in cores.values() {
        expected.extend(core.all_sold_keys());
    }
    for item in sold.iter() {
        let (key, value) = item.map_err(io)?;
        let key_s = String::from_utf8_lossy(&key).into_owned();
        match expected.remove(&key_s) {
            Some(hold) if hold.as_str().as_bytes() == value.as_ref() => {}
            Some(hold) => {
                return Err(corrupt(
                    "sold",
                    0,
                    format!("seat {key_s} is claimed by another hold than {hold}"),
                ));
            }
            None => {
                tracing::warn!(key = %key_s, "removing a sold-seat claim without a durable confirm");
                sold.remove(&key).map_err(io)?;
                report.orphan_claims_removed += 1;
            }
        }
    }
    for (key, hold) in expected {
        sold.insert(key.as_bytes(), hold.as_str().as_bytes())
            .map_err(io)?;
    }
    // The waitlist stream.
    let tree = db.open_tree("waitlist").map_err(io)?;
    let replay = store::read_stream::<WaitlistRecord>(&checkpoints, "waitlist", &tree)?;
    report.torn_tails_dropped += usize::from(replay.dropped_tail);
    let mut waitlist = match &replay.checkpoint {
        Some((seq, blob)) => {
            report.checkpoints_loaded += 1;
            codec::decode::<WaitlistCore>(blob)
                .map_err(|e| corrupt("checkpoints/waitlist", *seq, e.to_string()))?
        }
        None => WaitlistCore::default(),
    };
    for (seq, record) in &replay.records {
        waitlist
            .apply(record)
            .map_err(|e| corrupt("waitlist", *seq, e))?;
        report.records_replayed += 1;
    }
    db.flush().map_err(io)?;
    Ok(Recovered {
        waitlist,
        waitlist_last: replay.last_seq,
        events,
        cores,
        catalog_last: catalog.last_seq,
        ledger_states,
        ledger_last,
    })
}
