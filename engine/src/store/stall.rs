//! A disk that stalls: a sync that never returns. A failed sync halts the store at once, but a
//! stalled one holds every later write behind it forever while health still says `SERVING`, a
//! cluster node's Raft waits on it too, and nothing says why. [`watch_disk_stalls`] (installed
//! by `serve`, once per process) times every sync of a sled database and every write of a
//! superblock or the Raft marks ([`syncing`]); one that has not returned within the limit is
//! reported to its callback, which ends the process: no answer waiting on that sync was given,
//! so ending is a crash the log recovers from, and a cluster's other nodes go on without it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What a stall does (see [`watch_disk_stalls`]).
type OnStall = Box<dyn Fn(Duration) + Send + Sync>;

/// The syncs in flight, by number, with when each began.
#[derive(Default)]
struct Watch {
    in_flight: Mutex<BTreeMap<u64, Instant>>,
    next: AtomicU64,
}

impl Watch {
    fn begin(&self) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Instant::now());
        id
    }

    fn end(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// How long the oldest sync in flight has been running.
    fn oldest(&self) -> Option<Duration> {
        self.lock().values().min().map(Instant::elapsed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Instant>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The process's watch, once installed.
static WATCH: OnceLock<Arc<Watch>> = OnceLock::new();

/// Starts watching the process's syncs: once one has been running for `limit`, `on_stall` is
/// called (once) with how long it has been running, from a thread of its own. Only the first
/// call installs a watch.
pub fn watch_disk_stalls(limit: Duration, on_stall: impl Fn(Duration) + Send + Sync + 'static) {
    let mut installed = false;
    let watch = WATCH.get_or_init(|| {
        installed = true;
        Arc::default()
    });
    if installed {
        spawn(watch.clone(), limit, Box::new(on_stall));
    }
}

/// Runs `watch`'s thread: `on_stall` once a sync has run for `limit`.
fn spawn(watch: Arc<Watch>, limit: Duration, on_stall: OnStall) {
    let every = (limit / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let spawned = std::thread::Builder::new()
        .name("disk stall watch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                if let Some(age) = watch.oldest()
                    && age >= limit
                {
                    on_stall(age);
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the disk stall watch: stalls go unseen");
    }
}

/// A sync in flight, timed by the process's watch until it is dropped.
pub(crate) struct Syncing(Option<u64>);

/// Marks a sync as begun (nothing if no watch is installed).
pub(crate) fn syncing() -> Syncing {
    Syncing(WATCH.get().map(|w| w.begin()))
}

impl Drop for Syncing {
    fn drop(&mut self) {
        if let (Some(id), Some(watch)) = (self.0, WATCH.get()) {
            watch.end(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sync that outlasts the limit is reported; syncs that end in time are not.
    #[test]
    fn a_sync_past_the_limit_is_reported_and_ended_ones_are_not() {
        let (tx, rx) = std::sync::mpsc::channel();
        let watch = Arc::new(Watch::default());
        spawn(
            watch.clone(),
            Duration::from_millis(200),
            Box::new(move |age| {
                let _ = tx.send(age);
            }),
        );
        for _ in 0..5 {
            let quick = watch.begin();
            std::thread::sleep(Duration::from_millis(20));
            watch.end(quick);
        }
        assert!(
            rx.recv_timeout(Duration::from_millis(400)).is_err(),
            "syncs that ended were reported as a stall"
        );
        let _stalled = watch.begin();
        let age = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("a stalled sync is reported");
        assert!(age >= Duration::from_millis(200), "{age:?}");
    }
}
