//! When a leader's AppendEntries last reached this node, in each group: the peers' service
//! notes it, and what needs to know whether this node's copy of a group is current (the ticket
//! key ring) asks.

use std::sync::Arc;
use std::time::Duration;

/// When a leader's AppendEntries last reached a node, in each of its groups.
#[derive(Clone)]
pub(crate) struct Heard(Arc<Vec<std::sync::Mutex<Option<tokio::time::Instant>>>>);

impl Heard {
    /// Nothing heard yet in any of `groups` groups.
    pub(crate) fn new(groups: u32) -> Heard {
        Heard(Arc::new(
            (0..groups).map(|_| std::sync::Mutex::new(None)).collect(),
        ))
    }

    /// Notes that group `g`'s leader was heard now.
    pub(crate) fn note(&self, g: u32) {
        if let Some(at) = self.0.get(g as usize) {
            *at.lock().unwrap_or_else(|p| p.into_inner()) = Some(tokio::time::Instant::now());
        }
    }

    /// Whether group `g`'s leader was heard within `within`.
    pub(crate) fn within(&self, g: u32, within: Duration) -> bool {
        self.0.get(g as usize).is_some_and(|at| {
            at.lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|t| t.elapsed() <= within)
        })
    }
}
