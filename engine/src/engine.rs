//! The [`Engine`] handle: what the gateway and the sweeper call. Opening it recovers the log and
//! starts the actors. It composes components over a shared [`kernel`](crate::kernel): the
//! [`catalog`](crate::catalog) component (events, availability) is reached only through the calls
//! here; the others still live as calls with their concern: [`booking`](crate::booking) (holds),
//! [`checkout`](crate::checkout) (confirm and payment), [`expiry`](crate::expiry) (deadlines and
//! waitlist hand-off), [`waitlist`](crate::waitlist), [`audit`](crate::audit) (reconciliation),
//! [`supervisor`](crate::supervisor) (restarting actors that panic).

use crate::hash::{DashMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorRef};
use tokio::sync::watch;

use crate::catalog::Catalog;
use crate::config::EngineConfig;
use crate::core::SectionCore;
use crate::error::{EngineError, Rejection, StorageError};
use crate::events::{EventEntry, EventTerms, SectionFeed, SectionSlot};
use crate::kernel::Kernel;
use crate::payment::{PaymentProvider, SimulatedProvider};
use crate::recovery::{CatalogEntry, RecoverWith, Recovered, RecoveryReport, recover};
use crate::recovery::{restart_section, restart_waitlist};
use crate::router::SectionHandle;
use crate::section::{Listener, SectionMsg};
use crate::section::{SectionActor, SectionArgs};
use crate::store::{LogSink, SledSink, Store, StreamWriter, names};
use crate::supervisor::{
    Restart, Role, Roles, Supervisor, SupervisorArgs, replay_off_runtime, spawn_ledger,
    spawn_waitlist,
};
use crate::types::{EventId, EventSpec, EventView, SeatMap, SectionId, SectionSnapshot};
use crate::waitlist::WaitlistMsg;

/// The engine's components and what they share (the [`Kernel`]). Private: each component is
/// reached through the engine's methods, or through the narrow accessors below.
pub(crate) struct Inner {
    kernel: Arc<Kernel>,
    catalog: Catalog,
    recovery: OnceLock<RecoveryReport>,
    waitlist: RwLock<ActorRef<WaitlistMsg>>,
    payments: Arc<dyn PaymentProvider>,
    supervisor: ActorRef<()>,
    roles: Roles,
    /// Actors restarted after a panic.
    restarts: AtomicU64,
    /// Captured charges without a sale, and the checkouts running (see [`crate::refunds`]).
    orphans: crate::orphans::Orphans,
    /// The waiting rooms' records (see [`crate::rooms`]).
    rooms: crate::rooms::Rooms,
}

impl Inner {
    /// The waitlist actor (replaced when it is restarted).
    pub fn waitlist(&self) -> ActorRef<WaitlistMsg> {
        self.waitlist
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The engine: cheap to clone, shared by every caller.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

/// How long opening waits for a sled lock a previous instance still holds.
const SLED_LOCK_WAIT: Duration = Duration::from_secs(10);

/// The sink `config` asks for: its own, or sled in the data dir (opened off the runtime).
async fn open_sink(config: &EngineConfig) -> Result<Arc<dyn LogSink>, EngineError> {
    if let Some(sink) = &config.sink {
        return Ok(sink.clone());
    }
    let dir = config.data_dir.clone();
    let sink = crate::rt::blocking(move || SledSink::open(&dir, SLED_LOCK_WAIT))
        .await
        .map_err(|e| StorageError::Io(format!("opening the log: {e}")))??;
    Ok(Arc::new(sink))
}

/// The payment provider: the configured one, or the simulated one recording beside the log in
/// its store. A log outside a [`Kv`](crate::store::Kv) store has no durable place for the
/// simulated provider's record, so it needs a provider configured (charges must outlive a
/// restart).
fn open_payments(
    config: &EngineConfig,
    sink: &dyn LogSink,
) -> Result<Arc<dyn PaymentProvider>, EngineError> {
    if let Some(p) = &config.payments {
        return Ok(p.clone());
    }
    let kv = sink.kv().ok_or_else(|| StorageError::Open {
        path: String::new(),
        reason: "a log outside a key-value store needs EngineConfig::payments \
                 (EngineConfig::with_sink sets the simulated provider)"
            .into(),
    })?;
    let provider = SimulatedProvider::open_replicated(
        kv,
        config.simulated_payments.clone(),
        config.replicate.clone(),
    )
    .map_err(|e| StorageError::Io(format!("payments: {e}")))?;
    // Its record is part of the data dir: a charge that does not decode is damage, named now
    // rather than when reconciliation first reads it.
    if let Err(damage) = provider.check_record() {
        if config.recovery_mode == crate::integrity::RecoveryMode::AcceptDamage {
            tracing::error!(%damage, "the payment record is damaged; accepted");
        } else {
            return Err(StorageError::Damaged {
                count: 1,
                summary: damage,
                evidence: sink.keep_evidence(),
            }
            .into());
        }
    }
    Ok(provider)
}

/// Replays the log off the runtime: from a cluster node's warm state if it kept one with this
/// `window_ms` (the log read in full if that fails), else the whole log. The log's files as
/// they were before this start are kept as evidence when damage was found or recovery failed,
/// and dropped otherwise.
async fn recover_log(
    config: &EngineConfig,
    sink: &Arc<dyn LogSink>,
    window_ms: u64,
) -> Result<(Recovered, RecoveryReport), EngineError> {
    let with = RecoverWith {
        ledger_shards: config.ledger_shards,
        window_ms,
        now_ms: config.clock.now_ms(),
        mode: config.recovery_mode,
        replicated: config.replicate.is_some(),
    };
    let warm = config
        .warm
        .as_ref()
        .and_then(|w| w.take())
        .filter(|(_, kept_ms)| *kept_ms == window_ms)
        .map(|(replayed, _)| replayed);
    let sink_ref = sink.clone();
    let (recovered, mut report) = crate::rt::blocking(move || {
        let mut report = RecoveryReport::default();
        let r = match warm {
            Some(replayed) => {
                match crate::recovery::recover_warm(sink_ref.as_ref(), replayed, &with, &mut report)
                {
                    Ok(r) => Ok(r),
                    Err(e) => {
                        tracing::warn!(error = %e, "a warm start failed: reading the log");
                        report = RecoveryReport::default();
                        recover(sink_ref.as_ref(), &with, &mut report)
                    }
                }
            }
            None => recover(sink_ref.as_ref(), &with, &mut report),
        };
        (r, report)
    })
    .await
    .map_err(|e| StorageError::Io(format!("recovery failed: {e}")))?;
    let recovered = keep_evidence(sink.as_ref(), recovered, &mut report)?;
    Ok((recovered, report))
}

/// What recovery gave, with the log's files as they were kept as evidence when it found damage
/// (accepted, or refusing the start) or failed, and dropped when all was well.
fn keep_evidence(
    sink: &dyn LogSink,
    recovered: Result<Recovered, StorageError>,
    report: &mut RecoveryReport,
) -> Result<Recovered, EngineError> {
    match recovered {
        Ok(r) if report.integrity.damage.is_empty() => {
            sink.drop_evidence();
            Ok(r)
        }
        Ok(r) => {
            if let Some(kept) = sink.keep_evidence() {
                report.integrity.actions.push(format!(
                    "kept the log's files as they were before this start in {kept}"
                ));
            }
            Ok(r)
        }
        Err(StorageError::Damaged { count, summary, .. }) => {
            let evidence = sink.keep_evidence();
            Err(StorageError::Damaged {
                count,
                summary,
                evidence,
            }
            .into())
        }
        Err(e) => {
            if let Some(kept) = sink.keep_evidence() {
                tracing::error!(error = %e, kept, "recovery failed; the log's files as they were are kept");
            }
            Err(e.into())
        }
    }
}

impl Engine {
    /// Opens (or creates) the log, replays it and starts the actors. Returns once the engine is
    /// ready to serve.
    pub async fn open(config: EngineConfig) -> Result<Engine, EngineError> {
        let started = Instant::now();
        let window_ms = config.idempotency_window_ms()?;
        let sink = open_sink(&config).await?;
        if config.recovery_mode == crate::integrity::RecoveryMode::Verify {
            return Err(
                StorageError::Io("an engine cannot open a log in verify mode".into()).into(),
            );
        }
        let (mut recovered, mut report) = recover_log(&config, &sink, window_ms).await?;
        let events = std::mem::take(&mut recovered.events);
        let cores = std::mem::take(&mut recovered.cores);
        let engine = Engine::start_actors(config, sink, recovered).await?;
        engine.start_recovered(events, cores).await?;
        report.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        metrics::gauge!("boxoffice_engine_recovery_seconds").set(started.elapsed().as_secs_f64());
        tracing::info!(?report, "engine recovered");
        let _ = engine.inner.recovery.set(report);
        engine.kernel().set_serving(true);
        Ok(engine)
    }

    /// Starts the store (the group commit), the supervisor, the ledger shards and the waitlist
    /// from what recovery rebuilt; the sections start after ([`Engine::start_recovered`]).
    async fn start_actors(
        config: EngineConfig,
        sink: Arc<dyn LogSink>,
        recovered: Recovered,
    ) -> Result<Engine, EngineError> {
        let store = Arc::new(Store::start(
            sink.clone(),
            config.durability,
            recovered.marks.clone(),
            config.replicate.clone(),
        )?);
        let engine_slot = Arc::new(OnceLock::new());
        let roles: Roles = Arc::new(DashMap::default());
        let (supervisor, supervisor_done) = Actor::spawn(
            None,
            Supervisor,
            SupervisorArgs {
                engine: engine_slot.clone(),
                roles: roles.clone(),
            },
        )
        .await
        .map_err(|e| StorageError::Io(format!("cannot start the supervisor: {e}")))?;
        let (ledger_states, ledger_last) = (recovered.ledger_states, recovered.ledger_last);
        let ledger = spawn_ledger(
            ledger_states,
            &ledger_last,
            &store,
            &config,
            &supervisor,
            &roles,
        )
        .await?;
        let (list, list_last) = (recovered.waitlist, recovered.waitlist_last);
        let waitlist =
            spawn_waitlist(list, list_last, &store, &config, &supervisor, &roles).await?;
        let catalog = StreamWriter::open(sink.as_ref(), names::CATALOG, recovered.catalog_last)?;
        let payments = open_payments(&config, sink.as_ref())?;
        let kernel = Arc::new(Kernel::new(config, store, ledger));
        let inner = Arc::new(Inner {
            rooms: crate::rooms::Rooms::open(kernel.clone(), recovered.rooms)?,
            payments,
            catalog: Catalog::new(kernel.clone(), catalog),
            kernel,
            recovery: OnceLock::new(),
            waitlist: RwLock::new(waitlist),
            supervisor,
            roles,
            restarts: AtomicU64::new(0),
            orphans: Default::default(),
        });
        let restart: Arc<dyn Restart> = inner.clone();
        let _ = engine_slot.set(Arc::downgrade(&restart));
        let engine = Engine { inner };
        // Nobody supervises the supervisor: its children die with it.
        engine.stop_when_ended("the engine's supervisor", supervisor_done);
        Ok(engine)
    }

    /// Starts every recovered event's section actors from their recovered cores.
    async fn start_recovered(
        &self,
        events: Vec<CatalogEntry>,
        mut cores: HashMap<(EventId, SectionId), (SectionCore, u64)>,
    ) -> Result<(), EngineError> {
        for (event_id, spec, created_at_ms) in events {
            let mut sections = Vec::new();
            for s in &spec.sections {
                let key = (event_id.clone(), s.section_id.clone());
                let (core, last_seq) = cores.remove(&key).ok_or_else(|| {
                    StorageError::Io(format!("recovery missed section {}/{}", key.0, key.1))
                })?;
                sections.push((core, last_seq));
            }
            self.start_event(event_id, spec, created_at_ms, sections)
                .await?;
        }
        Ok(())
    }

    /// What recovery found when this engine opened.
    pub fn recovery_report(&self) -> RecoveryReport {
        self.inner.recovery.get().cloned().unwrap_or_default()
    }

    /// Whether the engine serves (false before recovery finished, once shutdown began, and once
    /// it stopped: see [`Engine::stopped`]).
    pub fn is_ready(&self) -> bool {
        self.kernel().serving() && self.kernel().store().halt.check().is_ok()
    }

    /// Why the engine stopped serving for good (a storage failure, an actor that could not be
    /// restarted), if it did; it then answers every change with an error until restarted.
    pub fn stopped(&self) -> Option<String> {
        self.kernel().store().halt.reason()
    }

    /// Stops the engine as a crash of its log would: calls answer `NOT_READY` from now on,
    /// nothing more is written. A cluster leader's watchdog uses it when its group stops
    /// confirming its leadership.
    pub fn halt(&self, reason: &str) {
        self.kernel().store().halt_now(reason);
    }

    /// A channel that changes once the engine stops (see [`Engine::stopped`]), for health.
    pub fn watch_stopped(&self) -> watch::Receiver<Option<String>> {
        self.kernel().store().halt.subscribe()
    }

    /// How many actors were restarted after a panic.
    pub fn actor_restarts(&self) -> u64 {
        self.inner.restarts.load(Ordering::SeqCst)
    }

    /// What every component shares (see [`crate::kernel`]).
    pub(crate) fn kernel(&self) -> &Kernel {
        &self.inner.kernel
    }

    /// The captured charges without a sale, and the checkouts running (see [`crate::refunds`]).
    pub(crate) fn orphans(&self) -> &crate::orphans::Orphans {
        &self.inner.orphans
    }

    /// The payment provider that charges and refunds.
    pub fn payments(&self) -> Arc<dyn PaymentProvider> {
        self.inner.payments.clone()
    }

    /// See [`Kernel::check_not_stopped`].
    pub(crate) fn check_not_stopped(&self) -> Result<(), EngineError> {
        self.kernel().check_not_stopped()
    }

    /// See [`Kernel::check_ready`].
    pub(crate) fn check_ready(&self) -> Result<(), EngineError> {
        self.kernel().check_ready()
    }

    /// Now, by the engine's clock (ms since the Unix epoch).
    pub fn now_ms(&self) -> u64 {
        self.kernel().now_ms()
    }

    /// See [`Kernel::window_ms`].
    pub(crate) fn window_ms(&self) -> u64 {
        self.kernel().window_ms()
    }

    /// What the engine remembers now: holds (live, and ended within the window) and
    /// idempotency keys. Asks every section and ledger shard (for soaks and tests).
    pub async fn remembered(&self) -> Result<crate::retention::Remembered, EngineError> {
        self.check_ready()?;
        let mut r = crate::retention::Remembered {
            idempotency_keys: self.kernel().ledger().keys_remembered().await?,
            ..crate::retention::Remembered::default()
        };
        for e in self.event_entries() {
            for slot in &e.sections {
                let (holds, ended) = self
                    .kernel()
                    .ask(&e, &slot.section_id, SectionMsg::Remembered)
                    .await?;
                r.holds += holds;
                r.ended_holds += ended;
            }
        }
        Ok(r)
    }

    /// Sets the one listener of engine notices (deadline changes, ended holds, waitlist joins).
    /// Returns false if one was set already.
    pub fn set_listener(&self, listener: Listener) -> bool {
        self.kernel().notices().set(listener).is_ok()
    }

    /// See [`crate::kernel::detached`].
    pub(crate) async fn detached<T: Send + 'static>(
        &self,
        work: impl std::future::Future<Output = Result<T, EngineError>> + Send + 'static,
    ) -> Result<T, EngineError> {
        crate::kernel::detached(work).await
    }

    /// The line of `event_id`'s waiting room as its records leave it (empty if it has none).
    pub async fn room_line(
        &self,
        event_id: &EventId,
    ) -> Result<crate::rooms::RoomLine, EngineError> {
        self.check_ready()?;
        Ok(self.inner.rooms.line(event_id).await)
    }

    /// Records `records` of `event_id`'s waiting room (an event that exists); returns once they
    /// are durable (on a cluster: committed by a majority). A record that does not fit the line
    /// is refused (nothing is written).
    pub async fn record_room(
        &self,
        event_id: &EventId,
        records: Vec<crate::rooms::RoomRecord>,
    ) -> Result<crate::rooms::RoomLine, EngineError> {
        self.check_ready()?;
        self.entry(event_id)?;
        self.inner.rooms.record(event_id, records).await
    }

    /// Orderly stop: refuse new work, stop the actors, flush the log and close it.
    pub async fn shutdown(&self) {
        self.kernel().set_serving(false);
        self.stop_actors().await;
        self.kernel().store().close().await;
    }

    pub(crate) async fn stop_actors(&self) {
        for actor in self.kernel().router().actors() {
            let _ = actor.stop_and_wait(None, None).await;
        }
        for shard in self.kernel().ledger().actors() {
            let _ = shard.stop_and_wait(None, None).await;
        }
        let _ = self.inner.waitlist().stop_and_wait(None, None).await;
        let _ = self.inner.supervisor.stop_and_wait(None, None).await;
        // An actor's state (with its handles on the store) may be dropped just after it reports
        // stopped; wait for that, so the data dir is free once the last `Engine` goes.
        // tokio's clock: a simulation's virtual one.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while Arc::strong_count(self.kernel().store()) > 1 && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The catalog's calls (see [`Catalog`]) and the composition it needs: an event's section
/// actors are started here, under the supervisor, before the catalog lists it.
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
        let sections = self.start_sections(sections).await?;
        self.inner.catalog.list(EventEntry {
            spec,
            event_id,
            created_at_ms,
            sections,
        });
        Ok(())
    }

    /// Starts one actor per section from its core and its stream's last sequence number: the
    /// slots the catalog lists them by.
    async fn start_sections(
        &self,
        sections: Vec<(SectionCore, u64)>,
    ) -> Result<Vec<SectionSlot>, EngineError> {
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
        Ok(slots)
    }

    /// Creates an event: validates the spec (zero values take the defaults), logs it durably and
    /// starts one actor per section. Idempotent by event id: the same spec again returns the
    /// event as it is now; another spec under an existing id is `EventExists`. Runs to the end
    /// even if the caller stops waiting.
    pub async fn create_event(&self, spec: EventSpec) -> Result<EventView, EngineError> {
        self.create_event_keyed(spec, "").await
    }

    /// [`Engine::create_event`] with an idempotency key for a spec without an event id: the
    /// event's id is derived from the key ([`crate::event_id_of_key`]), so a retry with the key
    /// and the same spec answers the event the first call made (whether or not its answer
    /// arrived), and the key with another spec is `IdempotencyKeyReused`. The key lasts as long
    /// as the event. With an event id, or an empty key, the key plays no part.
    pub async fn create_event_keyed(
        &self,
        spec: EventSpec,
        idempotency_key: &str,
    ) -> Result<EventView, EngineError> {
        let engine = self.clone();
        let key = idempotency_key.to_owned();
        self.detached(async move {
            let starter = engine.clone();
            engine
                .inner
                .catalog
                .create(spec, &key, |cores| async move {
                    starter.start_sections(cores).await
                })
                .await
        })
        .await
    }

    pub(crate) fn entry(&self, event_id: &EventId) -> Result<Arc<EventEntry>, Rejection> {
        self.inner.catalog.entry(event_id)
    }

    pub(crate) fn event_entries(&self) -> Vec<Arc<EventEntry>> {
        self.inner.catalog.entries()
    }

    /// An event with its sections' latest counts.
    pub fn event(&self, event_id: &EventId) -> Result<EventView, EngineError> {
        self.inner.catalog.event(event_id)
    }

    /// An event's settings without its sections (cheap: for the per-request paths).
    pub fn event_terms(&self, event_id: &EventId) -> Result<EventTerms, EngineError> {
        self.inner.catalog.terms(event_id)
    }

    /// Free places per section of an event, from the published snapshots (cheap: no spec).
    pub fn available_places(
        &self,
        event_id: &EventId,
    ) -> Result<Vec<(SectionId, u32)>, EngineError> {
        self.inner.catalog.available(event_id)
    }

    /// Every event, ordered by id.
    pub fn events(&self) -> Result<Vec<EventView>, EngineError> {
        self.inner.catalog.views()
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
        self.inner.catalog.seat_map(event_id, section)
    }

    /// Where a reader that builds its own view of an event's sections (the gateway's seat maps)
    /// gets them: per section in event order, its spec and its published snapshots (a `watch`
    /// receiver: `borrow()` is the latest, never entering a mailbox). An event's sections never
    /// change, so a reader may keep these for the life of the engine.
    pub fn section_feeds(&self, event_id: &EventId) -> Result<Vec<SectionFeed>, EngineError> {
        self.inner.catalog.feeds(event_id)
    }

    /// Whether the engine still serves reads: `Storage` once it stopped (its published counts
    /// could include a change that was never acknowledged).
    pub fn check_reads(&self) -> Result<(), EngineError> {
        self.check_not_stopped()
    }
}

/// Restarting actors and stopping visibly: what the supervisor and the servers beside the
/// engine ask of it.
impl Engine {
    /// Spawns a section's actor (supervised) from its core and its stream's last sequence
    /// number, publishing on `publisher`, and routes the section to it.
    pub(crate) async fn spawn_section(
        &self,
        core: SectionCore,
        last_seq: u64,
        publisher: Arc<watch::Sender<Arc<SectionSnapshot>>>,
    ) -> Result<(), EngineError> {
        let (inner, kernel) = (&self.inner, self.kernel());
        let event_id = core.event_id().clone();
        let section_id = core.spec().section_id.clone();
        let stream = StreamWriter::open(
            kernel.store().sink.as_ref(),
            &names::section(&event_id, &section_id),
            last_seq,
        )?;
        let depth = Arc::new(AtomicUsize::new(0));
        let durable = Arc::new(std::sync::atomic::AtomicU64::new(last_seq));
        let sold_out = metrics::counter!(
            "boxoffice_section_rejections_total",
            "event" => event_id.as_str().to_owned(),
            "section" => section_id.as_str().to_owned(),
            "reason" => Rejection::SoldOut.reason()
        );
        let args = SectionArgs {
            core,
            stream,
            store: kernel.store().clone(),
            clock: kernel.config().clock.clone(),
            ledger: kernel.ledger().clone(),
            snapshot: publisher,
            depth: depth.clone(),
            durable: durable.clone(),
            checkpoint_every: kernel.config().checkpoint_every_records,
            notices: kernel.notices().clone(),
        };
        let (actor, _) = Actor::spawn_linked(None, SectionActor, args, inner.supervisor.get_cell())
            .await
            .map_err(|e| StorageError::Io(format!("cannot start a section actor: {e}")))?;
        inner.roles.insert(
            actor.get_id(),
            Role::Section(event_id.clone(), section_id.clone()),
        );
        kernel.router().insert(
            event_id,
            section_id,
            SectionHandle {
                actor,
                depth,
                durable,
                sold_out,
            },
        );
        Ok(())
    }

    /// Stops the engine visibly: every change is refused from now on, and why is told to whoever
    /// watches ([`Engine::stopped`], health, logs, the `boxoffice_store_halted` gauge). For
    /// the engine's own actors and for what serves beside it (a sweeper that died, say).
    pub fn stop_visibly(&self, reason: impl Into<String>) {
        self.kernel().store().halt_now(&reason.into());
    }

    /// Watches a task that must run as long as the engine serves (`what` names it): if it ends
    /// while the engine serves, the engine stops visibly. Returns the watch; abort it before
    /// stopping the task on purpose. Holds no strong reference to the engine.
    pub fn stop_when_ended(
        &self,
        what: &'static str,
        done: tokio::task::JoinHandle<()>,
    ) -> tokio::task::JoinHandle<()> {
        let engine = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let how = match done.await {
                Ok(()) => "ended".to_owned(),
                Err(e) => format!("failed: {e}"),
            };
            if let Some(inner) = engine.upgrade()
                && inner.kernel.serving()
            {
                Engine { inner }.stop_visibly(format!("{what} {how}"));
            }
        })
    }

    /// Rebuilds a section from its log and starts a new actor for it.
    async fn restart_section(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
    ) -> Result<(), EngineError> {
        // Every record the dead actor handed to the flusher is written before we read.
        self.kernel().store().barrier().await?;
        let entry = self.entry(event_id)?;
        let spec = entry
            .spec
            .sections
            .iter()
            .find(|s| &s.section_id == section_id)
            .ok_or(crate::error::Rejection::SectionNotFound)?;
        let slot = entry
            .sections
            .iter()
            .find(|s| &s.section_id == section_id)
            .ok_or(crate::error::Rejection::SectionNotFound)?;
        let (sink, event, spec, window_ms) = (
            self.kernel().store().sink.clone(),
            event_id.clone(),
            spec.clone(),
            self.window_ms(),
        );
        let marks = self.kernel().store().durable_marks();
        let rebuilt = replay_off_runtime("the section's", move || {
            restart_section(sink.as_ref(), &event, &spec, window_ms, marks)
        })
        .await?;
        let (core, last_seq) = rebuilt;
        self.spawn_section(core, last_seq, slot.publisher.clone())
            .await
    }

    /// Rebuilds the waitlist from its log and starts a new actor for it.
    async fn restart_waitlist(&self) -> Result<(), EngineError> {
        self.kernel().store().barrier().await?;
        let sink = self.kernel().store().sink.clone();
        let marks = self.kernel().store().durable_marks();
        let (core, last_seq) = replay_off_runtime("the waitlist's", move || {
            restart_waitlist(sink.as_ref(), marks)
        })
        .await?;
        let inner = &self.inner;
        let actor = spawn_waitlist(
            core,
            last_seq,
            self.kernel().store(),
            self.kernel().config(),
            &inner.supervisor,
            &inner.roles,
        )
        .await?;
        *inner.waitlist.write().unwrap_or_else(|p| p.into_inner()) = actor;
        Ok(())
    }
}

impl Restart for Inner {
    fn serving(&self) -> bool {
        self.kernel.serving()
    }

    fn restart(self: Arc<Self>, role: Role) -> BoxFuture<'static, Result<(), EngineError>> {
        let engine = Engine { inner: self };
        Box::pin(async move {
            match role {
                Role::Section(e, s) => engine.restart_section(&e, &s).await,
                Role::Waitlist => engine.restart_waitlist().await,
                Role::Ledger(i) => {
                    Err(StorageError::Io(format!("ledger shard {i} cannot be restarted")).into())
                }
            }
        })
    }

    fn stop_visibly(&self, reason: String) {
        self.kernel.store().halt_now(&reason);
    }

    fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::SeqCst);
    }
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rooms::RoomRecord;
    use crate::store::MemorySink;

    /// Every component that writes borrows the store from the engine: once the engine has
    /// stopped, nothing else holds it (else `stop_actors` waits its whole 5 s for them, on every
    /// shutdown: a room component that kept its own handle once did).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_engine_leaves_its_store_to_nobody() {
        let engine = Engine::open(EngineConfig::with_sink(MemorySink::new()).unwrap())
            .await
            .unwrap();
        let event = engine
            .create_event(crate::types::ga_event_spec("e", "e", 2, 1))
            .await
            .unwrap();
        let line = engine
            .record_room(&event.event_id, vec![RoomRecord::Reserved { upto: 64 }])
            .await
            .unwrap();
        assert_eq!(line.reserved, 64);
        assert_eq!(engine.room_line(&event.event_id).await.unwrap(), line);
        engine.shutdown().await;
        assert_eq!(
            Arc::strong_count(engine.kernel().store()),
            1,
            "another holder of the store"
        );
    }
}
