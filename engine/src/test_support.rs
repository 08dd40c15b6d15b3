//! Hooks for tests and benches that reach inside the engine (feature `test-support`; not part
//! of the public API): a section's core, the raw store, a simulated crash, injected panics.

use std::sync::atomic::Ordering;

use crate::core::SectionCore;
use crate::engine::Engine;
use crate::error::{EngineError, Rejection};
use crate::section::SectionMsg;
use crate::types::{EventId, SectionId};
use crate::waitlist::WaitlistMsg;

impl Engine {
    /// A copy of a section's core (for invariant checks in tests).
    pub async fn inspect_section(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
    ) -> Result<SectionCore, EngineError> {
        self.section_core(event_id, section_id).await
    }

    /// The live sled database, for tests that inspect or damage the store on purpose.
    ///
    /// # Panics
    /// If the engine's log is not in sled (a [`MemorySink`](crate::MemorySink)).
    pub fn raw_db(&self) -> sled::Db {
        self.kernel()
            .store()
            .sink
            .kv()
            .and_then(|kv| kv.as_sled())
            .expect("the engine's log is in sled")
    }

    /// Stops as a crash would (for recovery tests): the log takes nothing more, queued writes
    /// are lost, nothing is flushed. Acknowledged work (with `Durability::Sync`) is durable.
    pub async fn crash(&self) {
        self.kernel().set_serving(false);
        self.kernel().store().halt_now("simulated crash");
        self.stop_actors().await;
        self.kernel().store().close().await;
    }

    /// Makes a section's actor panic in its handler (as a failed invariant check would); the
    /// supervisor restarts it from its log.
    pub async fn panic_section(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
    ) -> Result<(), EngineError> {
        let e = self.entry(event_id)?;
        let handle = self
            .kernel()
            .router()
            .get(&e.event_id, section_id)
            .ok_or(Rejection::SectionNotFound)?;
        // Counted as queued, as `ask` does: the actor counts every message it takes.
        handle.depth.fetch_add(1, Ordering::AcqRel);
        handle
            .actor
            .cast(SectionMsg::Panic)
            .map_err(|_| EngineError::NotReady)
    }

    /// Makes the waitlist actor panic in its handler.
    pub fn panic_waitlist(&self) -> Result<(), EngineError> {
        self.inner
            .waitlist()
            .cast(WaitlistMsg::Panic)
            .map_err(|_| EngineError::NotReady)
    }

    /// Makes the ledger shard of `user` panic in its handler (the engine then stops: a ledger's
    /// quotas cannot be rebuilt while sections hold places).
    pub fn panic_ledger(&self, user: &crate::types::UserId) -> Result<(), EngineError> {
        self.kernel().ledger().panic_shard_of(user)
    }
}
