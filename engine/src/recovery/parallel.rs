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

/// Runs `run` on each of `jobs`, with a fork of `check` each (see [`in_parallel`]); the parts
/// come back in the jobs' order.
pub(super) fn run_parts<J, T, F>(check: &Check, jobs: &[J], run: F) -> Vec<Part<T>>
where
    J: Sync,
    T: Send,
    F: Fn(&J, &mut Check, &mut RecoveryReport) -> Result<T, StorageError> + Sync,
{
    in_parallel(jobs.iter().collect(), |job| {
        let mut check = check.fork();
        let mut report = RecoveryReport::default();
        let made = run(job, &mut check, &mut report);
        Part {
            check,
            report,
            made,
        }
    })
}

/// Runs `run` on each of `jobs` on up to the machine's cores; the results come back in the
/// jobs' order. In a simulation everything runs on the calling thread: the maps a job builds
/// must take the simulation's fixed hash keys, which are the simulating thread's.
pub(super) fn in_parallel<J, T, F>(jobs: Vec<J>, run: F) -> Vec<T>
where
    J: Send,
    T: Send,
    F: Fn(J) -> T + Sync,
{
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len());
    if threads <= 1 || crate::rt::simulated() {
        return jobs.into_iter().map(run).collect();
    }
    let count = jobs.len();
    let next = Mutex::new(jobs.into_iter().enumerate());
    let done: Mutex<Vec<(usize, T)>> = Mutex::new(Vec::with_capacity(count));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let job = next.lock().unwrap_or_else(|p| p.into_inner()).next();
                    let Some((i, job)) = job else { break };
                    let made = run(job);
                    done.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((i, made));
                }
            });
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|p| p.into_inner());
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, made)| made).collect()
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
        let parts = run_parts(&check, &jobs, |job, check, report| {
            // Uneven work, so threads finish out of order.
            std::thread::sleep(std::time::Duration::from_micros((job * 37) % 500));
            check.found.notes.push(format!("job {job}"));
            report.records_replayed = *job;
            if job % 10 == 9 {
                return Err(StorageError::Io(format!("job {job} failed")));
            }
            Ok(job * 2)
        });
        assert_eq!(parts.len(), 64);
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
}
