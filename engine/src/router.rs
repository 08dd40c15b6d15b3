//! The [`Router`]: (event, section) to the actor that owns it, and that actor's queue depth.
//! Nothing else lives in it. A restarted section actor replaces its entry.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use dashmap::DashMap;
use ractor::ActorRef;

use crate::ids::{EventId, SectionId};
use crate::section::SectionMsg;

/// A section actor and the count of messages queued for it.
#[derive(Clone)]
pub(crate) struct SectionHandle {
    pub actor: ActorRef<SectionMsg>,
    pub depth: Arc<AtomicUsize>,
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

    pub(crate) fn insert(&self, event: EventId, section: SectionId, handle: SectionHandle) {
        self.actors.insert((event, section), handle);
    }

    pub(crate) fn actors(&self) -> Vec<ActorRef<SectionMsg>> {
        self.actors
            .iter()
            .map(|e| e.value().actor.clone())
            .collect()
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
