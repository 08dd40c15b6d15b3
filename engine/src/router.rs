//! The [`Router`]: (event, section) to the actor that owns it, that actor's queue depth, and
//! how far its log is durable.
//! Nothing else lives in it. A restarted section actor replaces its entry.

use crate::hash::DashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};

use ractor::ActorRef;

use crate::ids::{EventId, SectionId};
use crate::section::SectionMsg;

/// A section actor and the count of messages queued for it.
#[derive(Clone)]
pub(crate) struct SectionHandle {
    pub actor: ActorRef<SectionMsg>,
    pub depth: Arc<AtomicUsize>,
    /// The last record of the section's stream known durable (set by the actor once its
    /// batches are): a published snapshot whose version is at most this shows durable state.
    pub durable: Arc<AtomicU64>,
    /// `boxoffice_section_rejections_total{reason="SOLD_OUT"}` of this section: also counts
    /// the `SOLD_OUT`s answered for it from its durable snapshot.
    pub sold_out: metrics::Counter,
}

/// The router. See the module docs.
#[derive(Default)]
pub struct Router {
    actors: DashMap<(EventId, SectionId), SectionHandle>,
}

impl Router {
    pub(crate) fn get(&self, event: &EventId, section: &SectionId) -> Option<SectionHandle> {
        self.actors
            .get(&(event.clone(), section.clone()))
            .map(|r| r.value().clone())
    }

    /// The last durable record of a section's stream and its `SOLD_OUT` counter, if the
    /// section is routed.
    pub(crate) fn durable_of(
        &self,
        event: &EventId,
        section: &SectionId,
    ) -> Option<(u64, metrics::Counter)> {
        self.actors.get(&(event.clone(), section.clone())).map(|r| {
            let h = r.value();
            (
                h.durable.load(std::sync::atomic::Ordering::Acquire),
                h.sold_out.clone(),
            )
        })
    }

    pub(crate) fn insert(&self, event: EventId, section: SectionId, handle: SectionHandle) {
        self.actors.insert((event, section), handle);
    }

    /// Every section's actor, in the order of (event, section): the map's own order hangs on
    /// its process-random hash keys, and the order in which actors are stopped decides which
    /// waiting caller hears first (a simulation's seed must replay the same run in any process).
    pub(crate) fn actors(&self) -> Vec<ActorRef<SectionMsg>> {
        let mut all: Vec<_> = self
            .actors
            .iter()
            .map(|e| (e.key().clone(), e.value().actor.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.into_iter().map(|(_, actor)| actor).collect()
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
