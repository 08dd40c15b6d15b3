//! Supervision: every actor of the engine is spawned here, linked to one supervisor actor, and
//! registered with its role. When an actor
//! panics (a failed invariant check, a bug), nothing it had not made durable was acknowledged,
//! so its state can be rebuilt from its own log stream:
//!
//! - a **section** actor is restarted from its stream (checkpoint + records), after a barrier
//!   in the flusher so every record it handed over before it died is in the log; messages that
//!   were queued for it are answered `NOT_READY` (nothing of theirs happened) and may be retried;
//! - the **waitlist** actor is restarted the same way from the `waitlist` stream;
//! - a **ledger** shard cannot be rebuilt safely while sections hold places (its quotas live only
//!   in memory, derived from every section at start), so the engine **stops visibly**: every
//!   change is refused, [`Engine::stopped`] says why (health turns `NOT_SERVING`), a log line and
//!   the `boxoffice_store_halted` gauge.
//!
//! An actor restarted more than [`ACTOR_RESTARTS_MAX`] times, or one whose log cannot be
//! replayed, also stops the engine. Never a silent, permanent `NOT_READY`.

use crate::events::SectionSlot;
use crate::hash::{DashMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::watch;

use crate::catalog::Catalog;
use crate::core::SectionCore;
use crate::error::Rejection;
use crate::kernel::Kernel;
use crate::recovery::{restart_section, restart_waitlist};
use crate::router::SectionHandle;
use crate::section::{SectionActor, SectionArgs};
use crate::types::SectionSnapshot;
use crate::waitlist_calls::Waitlist;

use crate::config::EngineConfig;
use crate::error::{EngineError, StorageError};
use crate::ledger::{Ledger, LedgerMsg, LedgerShard, ShardArgs, ShardState};
use crate::limits::ACTOR_RESTARTS_MAX;
use crate::store::Store;
use crate::store::{StreamWriter, names};
use crate::types::{EventId, SectionId};
use crate::waitlist::{WaitlistActor, WaitlistArgs, WaitlistCore, WaitlistMsg};

/// What a supervised actor is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    Section(EventId, SectionId),
    Waitlist,
    Ledger(usize),
}

impl Role {
    /// One of [`ACTOR_KINDS`].
    fn kind(&self) -> &'static str {
        match self {
            Role::Section(..) => "section",
            Role::Waitlist => "waitlist",
            Role::Ledger(_) => "ledger",
        }
    }
}

/// The kinds of supervised actors, as the `actor` label of the panic and restart counters.
pub const ACTOR_KINDS: [&str; 3] = ["section", "waitlist", "ledger"];

/// Where the supervisor finds what restarts actors, once the engine is built (it starts first).
pub(crate) type RestartSlot = Arc<OnceLock<Weak<dyn Restart>>>;

/// Supervised actors by id.
pub(crate) type Roles = Arc<DashMap<ActorId, Role>>;

pub(crate) struct Supervisor;

pub(crate) struct SupervisorArgs {
    /// The engine, once it is built (the supervisor starts first).
    pub engine: RestartSlot,
    pub roles: Roles,
}

pub(crate) struct SupervisorState {
    args: SupervisorArgs,
    restarts: HashMap<Role, u32>,
}

impl Actor for Supervisor {
    type Msg = ();
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        Ok(SupervisorState {
            args,
            restarts: HashMap::default(),
        })
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<()>,
        event: SupervisionEvent,
        st: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                let Some((_, role)) = st.args.roles.remove(&cell.get_id()) else {
                    return Ok(());
                };
                let Some(engine) = st.args.engine.get().and_then(Weak::upgrade) else {
                    return Ok(());
                };
                let count = st.restarts.entry(role.clone()).or_default();
                *count += 1;
                on_actor_failed(engine, role, *count, err.to_string()).await;
            }
            SupervisionEvent::ActorTerminated(cell, ..) => {
                st.args.roles.remove(&cell.get_id());
            }
            _ => {}
        }
        Ok(())
    }
}

/// Starts the ledger shards, supervised, with quotas and idempotency answers recovered.
pub(crate) async fn spawn_ledger(
    states: Vec<ShardState>,
    last: &[u64],
    store: &Arc<Store>,
    config: &EngineConfig,
    supervisor: &ActorRef<()>,
    roles: &Roles,
) -> Result<Ledger, EngineError> {
    let mut refs: Vec<ActorRef<LedgerMsg>> = Vec::with_capacity(states.len());
    for (i, state) in states.into_iter().enumerate() {
        let stream = StreamWriter::open(store.sink.as_ref(), &names::ledger(i), last[i])?;
        let args = ShardArgs {
            state,
            stream,
            store: store.clone(),
            checkpoint_every: config.checkpoint_every_records,
        };
        let (actor, _) = Actor::spawn_linked(None, LedgerShard, args, supervisor.get_cell())
            .await
            .map_err(|e| StorageError::Io(format!("cannot start a ledger shard: {e}")))?;
        roles.insert(actor.get_id(), Role::Ledger(i));
        refs.push(actor);
    }
    Ok(Ledger::new(refs))
}

/// Starts the waitlist actor, supervised, from its recovered core.
pub(crate) async fn spawn_waitlist(
    core: WaitlistCore,
    last_seq: u64,
    store: &Arc<Store>,
    config: &EngineConfig,
    supervisor: &ActorRef<()>,
    roles: &Roles,
) -> Result<ActorRef<WaitlistMsg>, EngineError> {
    let args = WaitlistArgs {
        core,
        stream: StreamWriter::open(store.sink.as_ref(), names::WAITLIST, last_seq)?,
        store: store.clone(),
        checkpoint_every: config.checkpoint_every_records,
        written: Default::default(),
        clock: config.clock.clone(),
    };
    let (actor, _) = Actor::spawn_linked(None, WaitlistActor, args, supervisor.get_cell())
        .await
        .map_err(|e| StorageError::Io(format!("cannot start the waitlist: {e}")))?;
    roles.insert(actor.get_id(), Role::Waitlist);
    Ok(actor)
}

/// What the supervisor needs of the engine when an actor panics: the narrow interface it
/// restarts actors through ([`Supervision`] implements it; the supervisor sees nothing else).
pub(crate) trait Restart: Send + Sync {
    /// Whether the engine serves (a panic while it shuts down is left alone).
    fn serving(&self) -> bool;
    /// Rebuilds the actor of `role` (a section, or the waitlist) from its log and starts it.
    fn restart(self: Arc<Self>, role: Role) -> BoxFuture<'static, Result<(), EngineError>>;
    /// Stops the engine visibly, saying why.
    fn stop_visibly(&self, reason: String);
    /// Counts an actor restarted.
    fn restarted(&self);
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A supervised actor panicked (`count` times so far): restart it from its log, or stop.
async fn on_actor_failed(engine: Arc<dyn Restart>, role: Role, count: u32, reason: String) {
    if !engine.serving() {
        return; // shutting down
    }
    metrics::counter!("boxoffice_engine_actor_panics_total", "actor" => role.kind()).increment(1);
    tracing::error!(?role, count, %reason, "an engine actor panicked");
    if count > ACTOR_RESTARTS_MAX {
        engine.stop_visibly(format!(
            "{role:?} panicked {count} times (more than {ACTOR_RESTARTS_MAX}): {reason}"
        ));
        return;
    }
    if let Role::Ledger(i) = role {
        engine.stop_visibly(format!(
            "ledger shard {i} panicked ({reason}); its quotas cannot be rebuilt while sections \
             hold places"
        ));
        return;
    }
    match engine.clone().restart(role.clone()).await {
        Ok(()) => {
            engine.restarted();
            metrics::counter!("boxoffice_engine_actor_restarts_total", "actor" => role.kind())
                .increment(1);
            tracing::warn!(?role, "engine actor restarted from its log");
        }
        Err(e) => engine.stop_visibly(format!("{role:?} could not be restarted: {e}")),
    }
}

/// Replays a stream on a blocking thread (a long log must not hold a runtime worker); a panic
/// while replaying is an error like a corrupt record.
pub(crate) async fn replay_off_runtime<T: Send + 'static>(
    what: &str,
    replay: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, EngineError> {
    match crate::rt::blocking(replay).await {
        Ok(r) => Ok(r?),
        Err(e) => Err(StorageError::Io(format!("replaying {what} log failed: {e}")).into()),
    }
}

/// The supervised actors' side of the engine: it spawns section actors under the supervisor,
/// rebuilds a section or the waitlist from its log when the supervisor asks (the [`Restart`]
/// interface, all the supervisor sees), and counts the restarts.
pub(crate) struct Supervision {
    kernel: Arc<Kernel>,
    catalog: Arc<Catalog>,
    waitlist: Waitlist,
    supervisor: ActorRef<()>,
    roles: Roles,
    /// Actors restarted after a panic.
    restarts: AtomicU64,
}

impl Supervision {
    pub(crate) fn new(
        kernel: Arc<Kernel>,
        catalog: Arc<Catalog>,
        waitlist: Waitlist,
        supervisor: ActorRef<()>,
        roles: Roles,
    ) -> Supervision {
        Supervision {
            kernel,
            catalog,
            waitlist,
            supervisor,
            roles,
            restarts: AtomicU64::new(0),
        }
    }

    /// How many actors were restarted after a panic.
    pub(crate) fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::SeqCst)
    }

    /// Stops the supervisor (once its children are stopped: they die with it).
    pub(crate) async fn stop(&self) {
        let _ = self.supervisor.stop_and_wait(None, None).await;
    }

    /// Starts one actor per section from its core and its stream's last sequence number: the
    /// slots the catalog lists them by.
    pub(crate) async fn start_sections(
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

    /// Spawns a section's actor (supervised) from its core and its stream's last sequence
    /// number, publishing on `publisher`, and routes the section to it.
    pub(crate) async fn spawn_section(
        &self,
        core: SectionCore,
        last_seq: u64,
        publisher: Arc<watch::Sender<Arc<SectionSnapshot>>>,
    ) -> Result<(), EngineError> {
        let kernel = &self.kernel;
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
            redemptions: kernel.redemptions().clone(),
            snapshot: publisher,
            depth: depth.clone(),
            durable: durable.clone(),
            checkpoint_every: kernel.config().checkpoint_every_records,
            notices: kernel.notices().clone(),
        };
        let (actor, _) = Actor::spawn_linked(None, SectionActor, args, self.supervisor.get_cell())
            .await
            .map_err(|e| StorageError::Io(format!("cannot start a section actor: {e}")))?;
        self.roles.insert(
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

    /// Rebuilds a section from its log and starts a new actor for it.
    pub(crate) async fn restart_section(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
    ) -> Result<(), EngineError> {
        // Every record the dead actor handed to the flusher is written before we read.
        self.kernel.store().barrier().await?;
        let entry = self.catalog.entry(event_id)?;
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
            self.kernel.store().sink.clone(),
            event_id.clone(),
            spec.clone(),
            self.kernel.window_ms(),
        );
        let marks = self.kernel.store().durable_marks();
        let rebuilt = replay_off_runtime("the section's", move || {
            restart_section(sink.as_ref(), &event, &spec, window_ms, marks)
        })
        .await?;
        let (core, last_seq) = rebuilt;
        self.spawn_section(core, last_seq, slot.publisher.clone())
            .await?;
        // A sale control its predecessor did not get to record: the section stands as the
        // catalog says before it serves on (a record only if it does not already).
        let change = crate::core::SaleChange::of(entry.sale_state());
        self.kernel
            .ask_unshed(&entry, section_id, |reply| {
                crate::section::SectionMsg::Sale(change, None, reply)
            })
            .await
    }

    /// Rebuilds the waitlist from its log and starts a new actor for it.
    pub(crate) async fn restart_waitlist(&self) -> Result<(), EngineError> {
        self.kernel.store().barrier().await?;
        let sink = self.kernel.store().sink.clone();
        let marks = self.kernel.store().durable_marks();
        let (core, last_seq) = replay_off_runtime("the waitlist's", move || {
            restart_waitlist(sink.as_ref(), marks)
        })
        .await?;
        let actor = spawn_waitlist(
            core,
            last_seq,
            self.kernel.store(),
            self.kernel.config(),
            &self.supervisor,
            &self.roles,
        )
        .await?;
        self.waitlist.replace(actor);
        Ok(())
    }
}

impl Restart for Supervision {
    fn serving(&self) -> bool {
        self.kernel.serving()
    }

    fn restart(self: Arc<Self>, role: Role) -> BoxFuture<'static, Result<(), EngineError>> {
        Box::pin(async move {
            match role {
                Role::Section(e, s) => self.restart_section(&e, &s).await,
                Role::Waitlist => self.restart_waitlist().await,
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
