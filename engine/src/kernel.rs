//! The kernel: what every component of the engine shares, below them all. The configuration
//! and its clock, the log's store (group commit and halt), the ledger shards, the router of
//! section actors, whether the engine serves, and the one listener of notices.
//!
//! Its fields are private. A component reads them through the methods here and changes nothing
//! of another component's: the kernel holds no component's state (the catalog's events, the
//! waitlist, the orphans, the rooms are each their own component's).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::access::Redemptions;
use crate::config::EngineConfig;
use crate::error::{EngineError, Rejection, StorageError};
use crate::events::EventEntry;
use crate::ledger::Ledger;
use crate::router::Router;
use crate::section::{Notices, SectionMsg};
use crate::store::Store;
use crate::types::SectionId;

/// What every component shares (see the module's doc).
pub(crate) struct Kernel {
    config: EngineConfig,
    store: Arc<Store>,
    ledger: Ledger,
    redemptions: Arc<Redemptions>,
    router: Router,
    serving: AtomicBool,
    notices: Notices,
}

impl Kernel {
    /// A kernel that does not serve yet ([`Kernel::set_serving`] once recovery is done).
    pub(crate) fn new(
        config: EngineConfig,
        store: Arc<Store>,
        ledger: Ledger,
        redemptions: Redemptions,
    ) -> Kernel {
        Kernel {
            config,
            store,
            ledger,
            redemptions: Arc::new(redemptions),
            router: Router::default(),
            serving: AtomicBool::new(false),
            notices: Arc::new(std::sync::OnceLock::new()),
        }
    }

    pub(crate) fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The access codes' uses ([`crate::access`]).
    pub(crate) fn redemptions(&self) -> &Arc<Redemptions> {
        &self.redemptions
    }

    pub(crate) fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Up to `max` changes after `after`, as far as they are durable: with `Sync`, what a crash
    /// cannot take back (the superblock's mark); a leader's copy holds only what its group
    /// committed; `Buffered` promises nothing durable anyway.
    pub(crate) fn changes(
        &self,
        after: Option<crate::changes::Position>,
        max: usize,
    ) -> crate::changes::ChangesRead {
        let readable = if self.config.replicate.is_none()
            && self.config.durability == crate::Durability::Sync
        {
            self.store.durable_marks().of(crate::store::names::CHANGES)
        } else {
            u64::MAX
        };
        crate::store::read_changes(self.store.sink.as_ref(), after, readable, max)
    }

    /// Tells the change stream of `change` (one without a record of its own: a refund), and
    /// waits until the group commit that writes it is done (synced with `Sync` durability,
    /// committed on a cluster): the provider has refunded already, so only a crash within that
    /// one commit can lose the note.
    pub(crate) async fn note_change(&self, change: Option<crate::changes::Change>) {
        if let Some(change) = change
            && let Some(noted) = crate::changes::Noted::of(&[change])
        {
            self.store.submit(crate::store::Job::Note(noted));
            if let Err(e) = self.store.barrier().await {
                tracing::warn!(error = %e, "a refund's change may not be in the change stream");
            }
        }
    }

    pub(crate) fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub(crate) fn router(&self) -> &Router {
        &self.router
    }

    pub(crate) fn notices(&self) -> &Notices {
        &self.notices
    }

    /// Whether the engine was opened and has not begun to shut down (it may have stopped: see
    /// [`Kernel::check_ready`]).
    pub(crate) fn serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }

    pub(crate) fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::SeqCst);
    }

    /// Now, by the engine's clock (ms since the Unix epoch).
    pub(crate) fn now_ms(&self) -> u64 {
        self.config.clock.now_ms()
    }

    /// The idempotency window, ms (checked when the engine opened).
    pub(crate) fn window_ms(&self) -> u64 {
        self.config
            .idempotency_window_ms()
            .unwrap_or(crate::limits::IDEMPOTENCY_WINDOW_MS_DEFAULT)
    }

    /// Refuses once the engine stopped: published snapshots may show changes that were never
    /// acknowledged (a batch whose sync failed), so reads stop too.
    pub(crate) fn check_not_stopped(&self) -> Result<(), EngineError> {
        self.store.halt.check()?;
        Ok(())
    }

    /// Refuses unless the engine serves: `NOT_READY` before recovery finished and once shutdown
    /// began, the storage error once it stopped.
    pub(crate) fn check_ready(&self) -> Result<(), EngineError> {
        if !self.serving() {
            return Err(EngineError::NotReady);
        }
        self.check_not_stopped()
    }

    /// Sends a message to a section actor, refusing if its queue is at the bound.
    pub(crate) async fn ask<T: Send + 'static>(
        &self,
        event: &EventEntry,
        section: &SectionId,
        build: impl FnOnce(ractor::RpcReplyPort<Result<T, EngineError>>) -> SectionMsg,
    ) -> Result<T, EngineError> {
        self.ask_section(event, section, build, true).await
    }

    /// [`Kernel::ask`], never shed however deep the mailbox is: for an operator's control,
    /// which must reach a section most of all when it is flooded.
    pub(crate) async fn ask_unshed<T: Send + 'static>(
        &self,
        event: &EventEntry,
        section: &SectionId,
        build: impl FnOnce(ractor::RpcReplyPort<Result<T, EngineError>>) -> SectionMsg,
    ) -> Result<T, EngineError> {
        self.ask_section(event, section, build, false).await
    }

    async fn ask_section<T: Send + 'static>(
        &self,
        event: &EventEntry,
        section: &SectionId,
        build: impl FnOnce(ractor::RpcReplyPort<Result<T, EngineError>>) -> SectionMsg,
        shed: bool,
    ) -> Result<T, EngineError> {
        if !event.sections.iter().any(|s| &s.section_id == section) {
            return Err(Rejection::SectionNotFound.into());
        }
        let handle = self
            .router
            .get(&event.event_id, section)
            .ok_or(Rejection::SectionNotFound)?;
        let depth = handle.depth.fetch_add(1, Ordering::AcqRel);
        if shed && depth >= self.config.section_inflight_max {
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
}

/// Runs an engine call on a task of its own and waits for it. A caller that stops waiting (a
/// gRPC deadline, a dropped future) drops only its wait: the call still runs to its end, so a
/// ledger reservation is always settled, an idempotency key never stays in flight, and a charge
/// always ends in an order or a refund. (Dropping the call itself between its awaits would leave
/// those half done.)
pub(crate) async fn detached<T: Send + 'static>(
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
