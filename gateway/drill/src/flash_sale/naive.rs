//! The seeds' uncoordinated baseline (`--naive`), in-process: read a seat map, then book what
//! looked free. Nothing stops two fans from booking one seat, so it oversells; that is the
//! contrast the real sale is measured against.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{FlashSaleArgs, Report};

/// The seeds' uncoordinated baseline: every fan reads a seat map that is up to 100 ms old, then
/// books what looked free with no atomic check (`if seat.free { seat.book() }` against a stale
/// read). Nothing stops two fans from booking one seat.
pub(crate) async fn run(args: &FlashSaleArgs) -> Report {
    let seats = args.seats as usize;
    let owners: Arc<Vec<AtomicU64>> = Arc::new((0..seats).map(|_| AtomicU64::new(0)).collect());
    let map: Arc<Mutex<Arc<Vec<bool>>>> = Arc::new(Mutex::new(Arc::new(vec![true; seats])));
    let started = Instant::now();
    let refresher = {
        let (owners, map) = (owners.clone(), map.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let fresh: Vec<bool> = owners
                    .iter()
                    .map(|o| o.load(Ordering::Relaxed) == 0)
                    .collect();
                if let Ok(mut m) = map.lock() {
                    *m = Arc::new(fresh);
                }
            }
        })
    };
    let next = Arc::new(AtomicUsize::new(0));
    let per_fan = Duration::from_secs_f64(args.arrival_seconds.max(0.0) / args.fans as f64);
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.min(1_024) {
        let (owners, map, next) = (owners.clone(), map.clone(), next.clone());
        let (fans, seed, limit) = (args.fans, args.seed, args.per_user_limit);
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= fans {
                    break;
                }
                tokio::time::sleep_until(
                    (started + per_fan * u32::try_from(i).unwrap_or(u32::MAX)).into(),
                )
                .await;
                let mut rng = StdRng::seed_from_u64(seed ^ i as u64);
                let q = rng.random_range(1..=limit.clamp(1, 4)) as usize;
                let snapshot = map.lock().map(|m| m.clone()).unwrap_or_default();
                // "10 seats left" is what the page said: book the first free-looking ones from
                // a random place.
                let start = rng.random_range(0..seats);
                let picks: Vec<usize> = (0..seats)
                    .map(|k| (start + k) % seats)
                    .filter(|&s| snapshot[s])
                    .take(q)
                    .collect();
                tokio::task::yield_now().await; // the network between the read and the write
                for s in picks {
                    owners[s].fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for w in workers {
        let _ = w.await;
    }
    refresher.abort();
    let mut report = Report {
        fans: args.fans,
        seats: args.seats,
        sale_seconds: started.elapsed().as_secs_f64(),
        ..Report::default()
    };
    for o in owners.iter() {
        let n = o.load(Ordering::Relaxed);
        report.tickets += n;
        if n > 0 {
            report.sold += 1;
        }
        if n > 1 {
            report.double_booked += 1;
        }
    }
    report.available = args.seats - report.sold;
    report.oversold = report.tickets - u64::from(report.sold);
    report
}
