//! Where the engine meets the machine: OS threads, blocking work and randomness.
//!
//! Each is one function here, and a deterministic simulation ([`simulate`]) swaps all of them
//! for its own on the thread it runs on:
//!
//! | here | serving | simulated |
//! |---|---|---|
//! | [`spawn_worker`] | an OS thread with its own small runtime (the log's flusher, acker, compactor: a sync never blocks a runtime worker) | a task on the current runtime |
//! | [`blocking`] | tokio's blocking pool | run inline |
//! | [`random_u64`], [`fill_random`], [`ulid`] | the OS-seeded thread RNG | one seeded ChaCha stream |
//! | [`RaftRng`] (openraft's election timeouts) | the OS-seeded thread RNG | the same seeded stream |
//!
//! A simulation runs every node on one thread (turmoil ticks each host's runtime in turn), so a
//! thread-local context is enough to make the whole run replay from its seed; a real thread
//! started by mistake would not see it, and the simulation's determinism check would say so.

use std::cell::RefCell;
use std::future::Future;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Context {
    rng: ChaCha8Rng,
    now_ms: Box<dyn Fn() -> u64>,
}

thread_local! {
    static SIM: RefCell<Option<Context>> = const { RefCell::new(None) };
}

/// A simulation's hold on this thread: while it lives, [`simulated`] is true here. Dropping it
/// gives the thread back to the real machine.
#[must_use = "the simulation ends when this is dropped"]
pub struct Simulation(());

impl Drop for Simulation {
    fn drop(&mut self) {
        SIM.with(|s| s.borrow_mut().take());
    }
}

/// Makes this thread a simulation: workers become tasks, blocking work runs inline, and every
/// random number (ids, jitter, Raft's election timeouts) comes from `seed`; `now_ms` is the
/// simulated wall clock (the time in ids).
pub fn simulate(seed: u64, now_ms: impl Fn() -> u64 + 'static) -> Simulation {
    SIM.with(|s| {
        *s.borrow_mut() = Some(Context {
            rng: ChaCha8Rng::seed_from_u64(seed),
            now_ms: Box::new(now_ms),
        });
    });
    Simulation(())
}

/// Whether this thread runs a simulation.
pub fn simulated() -> bool {
    SIM.with(|s| s.borrow().is_some())
}

fn with_sim_rng<T>(f: impl FnOnce(&mut ChaCha8Rng) -> T) -> Option<T> {
    SIM.with(|s| s.borrow_mut().as_mut().map(|c| f(&mut c.rng)))
}

/// A random `u64`.
pub fn random_u64() -> u64 {
    with_sim_rng(|r| r.next_u64()).unwrap_or_else(rand::random)
}

/// Fills `bytes` with random bytes.
pub fn fill_random(bytes: &mut [u8]) {
    if with_sim_rng(|r| r.fill_bytes(bytes)).is_none() {
        rand::rng().fill_bytes(bytes);
    }
}

/// A new ULID (hold, order, entry, event and payment ids).
pub fn ulid() -> ulid::Ulid {
    let sim = SIM.with(|s| {
        s.borrow_mut().as_mut().map(|c| {
            let ms = (c.now_ms)();
            let random = (u128::from(c.rng.next_u64()) << 64) | u128::from(c.rng.next_u64());
            ulid::Ulid::from_parts(ms, random)
        })
    });
    sim.unwrap_or_else(ulid::Ulid::generate)
}

/// Runs `f`, which blocks (disk IO, a replay), off the runtime's workers; in a simulation, on
/// the spot. `Err` says that `f` panicked.
pub async fn blocking<T, F>(f: F) -> Result<T, String>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    if simulated() {
        return std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .map_err(|p| panic_message(p.as_ref()));
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| e.to_string())
}

/// Runs `f`, which blocks, off the runtime's workers without waiting for it to end (work
/// nobody waits on: a purge's removals behind a snapshot); in a simulation, on the spot, so a
/// run still replays from its seed. A panic in `f` is logged.
pub fn detach<F>(what: &'static str, f: F)
where
    F: FnOnce() + Send + 'static,
{
    if simulated() {
        f();
        return;
    }
    tokio::task::spawn_blocking(move || {
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            tracing::error!(
                what,
                panic = panic_message(p.as_ref()),
                "background work panicked"
            );
        }
    });
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// Awaits every future of `futures`, concurrently; their outputs in the order given. One
/// future (a unary call through a batch path) is awaited as it is, without `join_all`'s
/// bookkeeping.
pub async fn join_all<F: std::future::Future>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let mut futures: Vec<F> = futures.into_iter().collect();
    match futures.len() {
        0 => Vec::new(),
        1 => match futures.pop() {
            Some(f) => vec![f.await],
            None => Vec::new(),
        },
        _ => futures_util::future::join_all(futures).await,
    }
}

/// A worker started by [`spawn_worker`]: [`Worker::join`] waits for it to end.
pub struct Worker {
    done: tokio::sync::oneshot::Receiver<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    /// Waits until the worker's future has ended (or was dropped).
    pub async fn join(mut self) {
        let _ = (&mut self.done).await;
        if let Some(t) = self.thread.take() {
            // The future is done: the thread only has its runtime to drop.
            let _ = blocking(move || t.join()).await;
        }
    }
}

/// Runs `work` on an OS thread of its own named `name`, with a small runtime of its own (so it
/// may block on disk IO without stalling anyone's tasks); in a simulation, as a task of the
/// current runtime.
pub fn spawn_worker<F>(name: &str, work: F) -> std::io::Result<Worker>
where
    F: Future<Output = ()> + Send + 'static,
{
    let (tx, done) = tokio::sync::oneshot::channel();
    let work = async move {
        work.await;
        let _ = tx.send(());
    };
    if simulated() {
        tokio::spawn(work);
        return Ok(Worker { done, thread: None });
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let thread = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || runtime.block_on(work))?;
    Ok(Worker {
        done,
        thread: Some(thread),
    })
}

/// openraft's random numbers (its election timeouts): the thread's OS-seeded RNG, or the
/// simulation's seeded stream ([`crate::raft::Runtime`] hands this out).
#[derive(Debug, Default, Clone, Copy)]
pub struct RaftRng;

impl rand08::RngCore for RaftRng {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        with_sim_rng(|r| r.next_u64())
            .unwrap_or_else(|| rand08::RngCore::next_u64(&mut rand08::thread_rng()))
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        if with_sim_rng(|r| r.fill_bytes(dest)).is_none() {
            rand08::RngCore::fill_bytes(&mut rand08::thread_rng(), dest);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand08::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_its_numbers_and_ids() {
        let draw = |seed| {
            let _sim = simulate(seed, || 1_700_000_000_000);
            assert!(simulated());
            let mut bytes = [0u8; 8];
            fill_random(&mut bytes);
            (
                random_u64(),
                bytes,
                ulid(),
                rand08::RngCore::next_u64(&mut RaftRng),
            )
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert!(!simulated(), "the simulation ends with its guard");
        assert_eq!(draw(7).2.timestamp_ms(), 1_700_000_000_000);
    }

    #[tokio::test]
    async fn a_simulated_worker_is_a_task_and_blocking_work_runs_inline() {
        let _sim = simulate(1, || 0);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let w = spawn_worker("test", async move {
            let _ = tx.send(std::thread::current().id());
        })
        .unwrap();
        w.join().await;
        assert_eq!(rx.await.unwrap(), std::thread::current().id());
        let here = std::thread::current().id();
        assert_eq!(
            blocking(move || std::thread::current().id() == here).await,
            Ok(true)
        );
        assert!(
            blocking(|| panic!("boom"))
                .await
                .unwrap_err()
                .contains("boom")
        );
    }

    #[tokio::test]
    async fn a_real_worker_runs_on_its_own_thread() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let w = spawn_worker("boxoffice-test", async move {
            let _ = tx.send(std::thread::current().name().map(str::to_owned));
        })
        .unwrap();
        w.join().await;
        assert_eq!(rx.await.unwrap().as_deref(), Some("boxoffice-test"));
    }
}
