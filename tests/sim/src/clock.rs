//! The simulated wall clock: turmoil's virtual time since the run began, from a fixed epoch,
//! plus each node's own offset (a clock that jumped).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use boxoffice_engine::Clock;

/// Unix ms at the simulation's start (a fixed instant: a run replays the same times).
pub const EPOCH_MS: u64 = 1_800_000_000_000;

/// Virtual ms since the run began (0 outside a host's turn).
pub fn elapsed_ms() -> u64 {
    turmoil::sim_elapsed()
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A node's wall clock: [`EPOCH_MS`] + virtual time + the node's offset.
#[derive(Clone, Default)]
pub struct SimClock {
    offset_ms: Arc<AtomicI64>,
}

impl SimClock {
    /// Moves this clock by `ms` (forwards or back), as an NTP step or a VM pause would.
    pub fn jump(&self, ms: i64) {
        self.offset_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        let now = EPOCH_MS + elapsed_ms();
        now.saturating_add_signed(self.offset_ms.load(Ordering::SeqCst))
    }
}
