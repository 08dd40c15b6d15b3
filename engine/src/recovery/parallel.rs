//! Streams read side by side: a start reads each section's stream (and checks the change
//! stream) on as many threads as the machine has cores, each part with its own fork of the
//! check and report, merged back in a fixed order so that what a start finds and reports does
//! not depend on which thread ran first.

use std::sync::Mutex;

use super::check::Check;
use super::report::RecoveryReport;
use crate::error::StorageError;

/// What one part found and made.
pub(super) struct Part<T> {
    pub check: Check,
    pub report: RecoveryReport,
    pub made: Result<T, StorageError>,
}

/// Runs `run` on each of `jobs`, with a fork of `check` each (see [`in_parallel_by`]: jobs of
/// a lower `rank` are taken first); the parts come back in the jobs' order.
pub(super) fn run_parts<J, T, F>(
    check: &Check,
    jobs: &[J],
    rank: impl Fn(&J) -> u8,
    run: F,
) -> Vec<Part<T>>
where
    J: Sync,
    T: Send,
    F: Fn(&J, &mut Check, &mut RecoveryReport) -> Result<T, StorageError> + Sync,
{
    in_parallel_by(
        jobs.iter().collect(),
        |job| rank(job),
        |job| part_of(check.fork(), |check, report| run(job, check, report)),
    )
}

/// What `job` found and made with `check` (a [`Check::fork`]) and a report of its own.
fn part_of<T>(
    mut check: Check,
    job: impl FnOnce(&mut Check, &mut RecoveryReport) -> Result<T, StorageError>,
) -> Part<T> {
    let mut report = RecoveryReport::default();
    let made = job(&mut check, &mut report);
    Part {
        check,
        report,
        made,
    }
}

/// How many threads `jobs` jobs run on: the machine's cores at most, and one in a simulation
/// (the maps a job builds must take the simulating thread's fixed hash keys).
fn threads_for(jobs: usize) -> usize {
    if crate::rt::simulated() {
        return 1;
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs)
}

/// Runs `job` with `fork` (a [`Check::fork`]), if there is one, on a thread of its own beside
/// `rest` on this thread, and gives back both: the job's part (`None` without a fork) and what
/// `rest` made. On one core, in a simulation, or with no thread to be had, the job runs first
/// on this thread.
pub(super) fn beside<T, R>(
    fork: Option<Check>,
    job: impl FnOnce(&mut Check, &mut RecoveryReport) -> Result<T, StorageError> + Send,
    rest: impl FnOnce() -> R,
) -> (Option<Part<T>>, R)
where
    T: Send,
{
    let Some(check) = fork else {
        return (None, rest());
    };
    let run = Mutex::new(Some(move || part_of(check, job)));
    let take = || run.lock().unwrap_or_else(|p| p.into_inner()).take();
    if threads_for(2) <= 1 {
        let part = take().map(|run| run());
        return (part, rest());
    }
    std::thread::scope(|s| {
        let beside = std::thread::Builder::new()
            .name("boxoffice-recover".into())
            .spawn_scoped(s, || take().map(|run| run()));
        let made = rest();
        let part = match beside {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread to be had: the job runs here, after `rest`.
            Err(_) => take().map(|run| run()),
        };
        (part, made)
    })
}

/// Runs `run` on each of `jobs` on up to the machine's cores (the calling thread is one of
/// them; if the OS gives no more threads, it runs them all); the results come back in the
/// jobs' order. A job that panics does not stop the others; once all are done, the first
/// panic in the jobs' order goes on with its own message. In a simulation everything runs on
/// the calling thread: the maps a job builds must take the simulation's fixed hash keys, which
/// are the simulating thread's.
pub(super) fn in_parallel<J, T, F>(jobs: Vec<J>, run: F) -> Vec<T>
where
    J: Send,
    T: Send,
    F: Fn(J) -> T + Sync,
{
    in_parallel_by(jobs, |_| 0, run)
}

/// [`in_parallel`], the threads taking the jobs of a lower `rank` first (in the jobs' order
/// within a rank): a long job ranked first does not run alone at the end while the other
/// threads wait. The results still come back in the jobs' order, and a simulation still runs
/// them in that order.
pub(super) fn in_parallel_by<J, T, F>(jobs: Vec<J>, rank: impl Fn(&J) -> u8, run: F) -> Vec<T>
where
    J: Send,
    T: Send,
    F: Fn(J) -> T + Sync,
{
    let threads = threads_for(jobs.len());
    if threads <= 1 {
        return jobs.into_iter().map(run).collect();
    }
    let count = jobs.len();
    let mut ranked: Vec<(usize, J)> = jobs.into_iter().enumerate().collect();
    ranked.sort_by_key(|(i, job)| (rank(job), *i));
    let next = Mutex::new(ranked.into_iter());
    let done: Mutex<Vec<(usize, std::thread::Result<T>)>> = Mutex::new(Vec::with_capacity(count));
    let work = || {
        loop {
            let job = next.lock().unwrap_or_else(|p| p.into_inner()).next();
            let Some((i, job)) = job else { break };
            let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(job)));
            done.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((i, made));
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            // No thread to be had: the calling thread below takes what is left.
            let _ = std::thread::Builder::new()
                .name("boxoffice-recover".into())
                .spawn_scoped(s, work);
        }
        work();
    });
    let mut done = done.into_inner().unwrap_or_else(|p| p.into_inner());
    done.sort_by_key(|(i, _)| *i);
    done.into_iter()
        .map(|(_, made)| made.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::integrity::RecoveryMode;
    use crate::store::{Marks, MemorySink};

    #[test]
    fn parts_come_back_in_the_jobs_order_each_with_its_own_fork() {
        let sink = MemorySink::new();
        let check = Check::new(sink.as_ref(), Marks::default(), RecoveryMode::Strict);
        let jobs: Vec<u64> = (0..64).collect();
        let parts = run_parts(
            &check,
            &jobs,
            |job| (*job % 3) as u8,
            |job, check, report| {
                // Uneven work, so threads finish out of order.
                std::thread::sleep(std::time::Duration::from_micros((job * 37) % 500));
                check.found.notes.push(format!("job {job}"));
                report.records_replayed = *job;
                if job % 10 == 9 {
                    return Err(StorageError::Io(format!("job {job} failed")));
                }
                Ok(job * 2)
            },
        );
        assert_eq!(parts.len(), 64);
        assert!(
            parts
                .iter()
                .all(|p| std::sync::Arc::ptr_eq(&p.check.marks, &check.marks))
        );
        for (i, part) in parts.iter().enumerate() {
            let i = i as u64;
            assert_eq!(part.check.found.notes, vec![format!("job {i}")]);
            assert_eq!(part.report.records_replayed, i);
            match &part.made {
                Ok(v) => assert_eq!(*v, i * 2),
                Err(e) => {
                    assert_eq!(i % 10, 9);
                    assert!(e.to_string().contains(&format!("job {i} failed")));
                }
            }
        }
    }

    /// A job beside the rest works on its own fork and comes back with it, the rest's result
    /// beside it; without a fork, only the rest runs.
    #[test]
    fn a_job_beside_the_rest_comes_back_with_its_fork() {
        let sink = MemorySink::new();
        let mut check = Check::new(sink.as_ref(), Marks::default(), RecoveryMode::Strict);
        let fork = Some(check.fork());
        let (part, rest) = beside(
            fork,
            |fork, report| {
                fork.found.notes.push("beside".into());
                report.records_replayed = 7;
                Ok(3u8)
            },
            || {
                check.found.notes.push("rest".into());
                "rest made"
            },
        );
        let part = part.expect("a part for the fork");
        assert_eq!(part.check.found.notes, ["beside"]);
        assert_eq!(part.report.records_replayed, 7);
        assert_eq!(part.made.expect("made"), 3);
        assert_eq!(rest, "rest made");
        assert_eq!(check.found.notes, ["rest"]);
        let (none, rest) = beside(None, |_, _| Ok::<u8, StorageError>(1), || 5);
        assert!(none.is_none());
        assert_eq!(rest, 5);
    }

    /// Jobs of a lower rank are taken first (the jobs' order within a rank), and the results
    /// still come back in the jobs' order.
    #[test]
    fn lower_ranks_are_taken_first_and_results_keep_the_jobs_order() {
        let taken = Mutex::new(Vec::new());
        let jobs: Vec<u64> = (0..40).collect();
        let made = in_parallel_by(
            jobs,
            |job| u8::from(job % 4 != 3),
            |job| {
                taken.lock().unwrap().push(job);
                job * 3
            },
        );
        assert_eq!(made, (0..40).map(|j| j * 3).collect::<Vec<_>>());
        let taken = taken.into_inner().unwrap();
        // Each thread pushes a job once it has taken it: every job of rank 0 is taken before
        // any of rank 1, so at most one job per other thread can be pushed out of rank order.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        if threads < 2 {
            // One thread runs the jobs in their order.
            assert_eq!(taken, (0..40).collect::<Vec<_>>());
            return;
        }
        let first: Vec<u64> = taken.iter().copied().take(10).collect();
        let ranked_first = first.iter().filter(|j| *j % 4 == 3).count();
        assert!(
            ranked_first + threads > 10,
            "rank 0 not taken first: {taken:?}"
        );
    }

    /// A job that panics lets the others finish, then its panic goes on with its own message
    /// (the first in the jobs' order).
    #[test]
    fn the_first_panic_in_the_jobs_order_goes_on_with_its_message() {
        let finished = std::sync::atomic::AtomicUsize::new(0);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            in_parallel((0..16u64).collect(), |job| {
                if job == 5 || job == 11 {
                    panic!("job {job} broke");
                }
                finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                job
            })
        }));
        let payload = caught.expect_err("a job panicked");
        let message = payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert_eq!(message, "job 5 broke");
        assert_eq!(finished.load(std::sync::atomic::Ordering::Relaxed), 14);
    }
}
