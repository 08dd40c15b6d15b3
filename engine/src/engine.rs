//! The [`Engine`] handle: what the gateway and the sweeper call. Opening it recovers the log and
//! starts the actors; the rest of its calls live with their concern:
//! [`catalog`](crate::catalog) (events, availability), [`booking`](crate::booking) (holds),
//! [`checkout`](crate::checkout) (confirm and payment), [`expiry`](crate::expiry) (deadlines and
//! waitlist hand-off), [`waitlist`](crate::waitlist), [`audit`](crate::audit) (reconciliation),
//! [`supervisor`](crate::supervisor) (restarting actors that panic).

use crate::hash::{DashMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorRef};
use tokio::sync::{Mutex, watch};

use crate::config::EngineConfig;
use crate::core::SectionCore;
use crate::error::{EngineError, Rejection, StorageError};
use crate::events::EventEntry;
use crate::ledger::Ledger;
use crate::payment::{PaymentProvider, SimulatedProvider};
use crate::recovery::{CatalogEntry, RecoverWith, Recovered, RecoveryReport, recover};
use crate::recovery::{restart_section, restart_waitlist};
use crate::router::Router;
use crate::router::SectionHandle;
use crate::section::{Listener, Notices, SectionMsg};
use crate::section::{SectionActor, SectionArgs};
use crate::store::{LogSink, SledSink, Store, StreamWriter, names};
use crate::supervisor::{
    Restart, Role, Roles, Supervisor, SupervisorArgs, replay_off_runtime, spawn_ledger,
    spawn_waitlist,
};
use crate::types::{EventId, SectionId, SectionSnapshot};
use crate::waitlist::WaitlistMsg;

/// Everything an engine handle shares.
pub(crate) struct Inner {
    pub config: EngineConfig,
    pub store: Arc<Store>,
    pub ledger: Ledger,
    pub router: Router,
    pub events: DashMap<EventId, Arc<EventEntry>>,
    pub catalog: Mutex<StreamWriter>,
    pub ready: AtomicBool,
    pub recovery: OnceLock<RecoveryReport>,
    pub notices: Notices,
    pub waitlist: RwLock<ActorRef<WaitlistMsg>>,
    pub payments: Arc<dyn PaymentProvider>,
    pub supervisor: ActorRef<()>,
    pub roles: Roles,
    /// Actors restarted after a panic.
    pub restarts: AtomicU64,
    /// Captured charges without a sale, and the checkouts running (see [`crate::refunds`]).
    pub orphans: crate::orphans::Orphans,
    /// The waiting rooms' records (see [`crate::rooms`]).
    pub rooms: crate::rooms::Rooms,
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
        engine.inner.ready.store(true, Ordering::SeqCst);
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
        let inner = Arc::new(Inner {
            rooms: crate::rooms::Rooms::open(
                sink.as_ref(),
                config.checkpoint_every_records,
                recovered.rooms,
            )?,
            payments: open_payments(&config, sink.as_ref())?,
            config,
            store,
            ledger,
            router: Router::default(),
            events: DashMap::default(),
            catalog: Mutex::new(catalog),
            ready: AtomicBool::new(false),
            recovery: OnceLock::new(),
            notices: Arc::new(OnceLock::new()),
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
        self.inner.ready.load(Ordering::SeqCst) && self.inner.store.halt.check().is_ok()
    }

    /// Why the engine stopped serving for good (a storage failure, an actor that could not be
    /// restarted), if it did; it then answers every change with an error until restarted.
    pub fn stopped(&self) -> Option<String> {
        self.inner.store.halt.reason()
    }

    /// Stops the engine as a crash of its log would: calls answer `NOT_READY` from now on,
    /// nothing more is written. A cluster leader's watchdog uses it when its group stops
    /// confirming its leadership.
    pub fn halt(&self, reason: &str) {
        self.inner.store.halt_now(reason);
    }

    /// A channel that changes once the engine stops (see [`Engine::stopped`]), for health.
    pub fn watch_stopped(&self) -> watch::Receiver<Option<String>> {
        self.inner.store.halt.subscribe()
    }

    /// How many actors were restarted after a panic.
    pub fn actor_restarts(&self) -> u64 {
        self.inner.restarts.load(Ordering::SeqCst)
    }

    /// Refuses once the engine stopped: published snapshots may show changes that were never
    /// acknowledged (a batch whose sync failed), so reads stop too.
    pub(crate) fn check_not_stopped(&self) -> Result<(), EngineError> {
        self.inner.store.halt.check()?;
        Ok(())
    }

    pub(crate) fn check_ready(&self) -> Result<(), EngineError> {
        if !self.inner.ready.load(Ordering::SeqCst) {
            return Err(EngineError::NotReady);
        }
        self.inner.store.halt.check()?;
        Ok(())
    }

    /// Now, by the engine's clock (ms since the Unix epoch).
    pub fn now_ms(&self) -> u64 {
        self.inner.config.clock.now_ms()
    }

    /// The idempotency window, ms (checked when the engine opened).
    pub(crate) fn window_ms(&self) -> u64 {
        self.inner
            .config
            .idempotency_window_ms()
            .unwrap_or(crate::limits::IDEMPOTENCY_WINDOW_MS_DEFAULT)
    }

    /// What the engine remembers now: holds (live, and ended within the window) and
    /// idempotency keys. Asks every section and ledger shard (for soaks and tests).
    pub async fn remembered(&self) -> Result<crate::retention::Remembered, EngineError> {
        self.check_ready()?;
        let mut r = crate::retention::Remembered {
            idempotency_keys: self.inner.ledger.keys_remembered().await?,
            ..crate::retention::Remembered::default()
        };
        for e in self.event_entries() {
            for slot in &e.sections {
                let (holds, ended) = self
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
        self.inner.notices.set(listener).is_ok()
    }

    /// Runs an engine call on a task of its own and waits for it. A caller that stops waiting
    /// (a gRPC deadline, a dropped future) drops only its wait: the call still runs to its end,
    /// so a ledger reservation is always settled, an idempotency key never stays in flight, and a
    /// charge always ends in an order or a refund. (Dropping the call itself between its awaits
    /// would leave those half done.)
    pub(crate) async fn detached<T: Send + 'static>(
        &self,
        work: impl std::future::Future<Output = Result<T, EngineError>> + Send + 'static,
    ) -> Result<T, EngineError> {
        match tokio::spawn(work).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "an engine call panicked");
                Err(StorageError::Io(format!("an engine call failed: {e}")).into())
            }
        }
    }

    /// Sends a message to a section actor, refusing if its queue is at the bound.
    pub(crate) async fn ask<T: Send + 'static>(
        &self,
        event: &EventEntry,
        section: &SectionId,
        build: impl FnOnce(ractor::RpcReplyPort<Result<T, EngineError>>) -> SectionMsg,
    ) -> Result<T, EngineError> {
        if !event.sections.iter().any(|s| &s.section_id == section) {
            return Err(Rejection::SectionNotFound.into());
        }
        let handle = self
            .inner
            .router
            .get(&event.event_id, section)
            .ok_or(Rejection::SectionNotFound)?;
        let depth = handle.depth.fetch_add(1, Ordering::AcqRel);
        if depth >= self.inner.config.section_inflight_max {
            handle.depth.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!("boxoffice_engine_shed_total", "scope" => "section").increment(1);
            return Err(EngineError::Overloaded("section queue full"));
        }
        match handle.actor.call(build, None).await {
            Ok(r) => r.success_or(EngineError::NotReady)?,
            Err(_) => {
                handle.depth.fetch_sub(1, Ordering::AcqRel);
                Err(EngineError::NotReady)
            }
        }
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
        self.inner
            .rooms
            .record(&self.inner.store, event_id, records)
            .await
    }

    /// Orderly stop: refuse new work, stop the actors, flush the log and close it.
    pub async fn shutdown(&self) {
        self.inner.ready.store(false, Ordering::SeqCst);
        self.stop_actors().await;
        self.inner.store.close().await;
    }

    pub(crate) async fn stop_actors(&self) {
        for actor in self.inner.router.actors() {
            let _ = actor.stop_and_wait(None, None).await;
        }
        for shard in self.inner.ledger.actors() {
            let _ = shard.stop_and_wait(None, None).await;
        }
        let _ = self.inner.waitlist().stop_and_wait(None, None).await;
        let _ = self.inner.supervisor.stop_and_wait(None, None).await;
        // An actor's state (with its handles on the store) may be dropped just after it reports
        // stopped; wait for that, so the data dir is free once the last `Engine` goes.
        // tokio's clock: a simulation's virtual one.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while Arc::strong_count(&self.inner.store) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
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
        let inner = &self.inner;
        let event_id = core.event_id().clone();
        let section_id = core.spec().section_id.clone();
        let stream = StreamWriter::open(
            inner.store.sink.as_ref(),
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
            store: inner.store.clone(),
            clock: inner.config.clock.clone(),
            ledger: inner.ledger.clone(),
            snapshot: publisher,
            depth: depth.clone(),
            durable: durable.clone(),
            checkpoint_every: inner.config.checkpoint_every_records,
            notices: inner.notices.clone(),
        };
        let (actor, _) = Actor::spawn_linked(None, SectionActor, args, inner.supervisor.get_cell())
            .await
            .map_err(|e| StorageError::Io(format!("cannot start a section actor: {e}")))?;
        inner.roles.insert(
            actor.get_id(),
            Role::Section(event_id.clone(), section_id.clone()),
        );
        inner.router.insert(
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
        self.inner.store.halt_now(&reason.into());
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
                && inner.ready.load(Ordering::SeqCst)
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
        self.inner.store.barrier().await?;
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
            self.inner.store.sink.clone(),
            event_id.clone(),
            spec.clone(),
            self.window_ms(),
        );
        let marks = self.inner.store.durable_marks();
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
        self.inner.store.barrier().await?;
        let sink = self.inner.store.sink.clone();
        let marks = self.inner.store.durable_marks();
        let (core, last_seq) = replay_off_runtime("the waitlist's", move || {
            restart_waitlist(sink.as_ref(), marks)
        })
        .await?;
        let inner = &self.inner;
        let actor = spawn_waitlist(
            core,
            last_seq,
            &inner.store,
            &inner.config,
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
        self.ready.load(Ordering::SeqCst)
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
        self.store.halt_now(&reason);
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
            Arc::strong_count(&engine.inner.store),
            1,
            "another holder of the store"
        );
    }
}
