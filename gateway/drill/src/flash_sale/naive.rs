//! The original design's uncoordinated baseline (`--naive`), in-process: read a seat map, then book what
//! looked free. Nothing stops two fans from booking one seat, so it oversells; that is the
//! contrast the real sale is measured against.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::args::FlashSaleArgs;
use super::report::Report;

/// The original design's uncoordinated baseline: every fan reads a seat map that is up to 100 ms old, then
/// books what looked free with no atomic check (`if seat.free { seat.book() }` against a stale
/// read). Nothing stops two fans from booking one seat.
pub(crate) async fn run(args: &FlashSaleArgs) -> Report {
    let venue = Arc::new(Venue::new(args.seats as usize));
    let started = Instant::now();
    let refresher = tokio::spawn(venue.clone().refresh_every_100_ms());
    let per_fan = Duration::from_secs_f64(args.arrival_seconds.max(0.0) / args.fans as f64);
    let workers: Vec<_> = (0..args.concurrency.min(1_024))
        .map(|_| {
            let fans = Fans {
                count: args.fans,
                seed: args.seed,
                limit: args.per_user_limit,
                started,
                per_fan,
            };
            tokio::spawn(venue.clone().book(fans))
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
    refresher.abort();
    venue.report(args, started)
}

/// The seats: how many times each was booked, and the (stale) map the fans read. Also played
/// fan by fan in `boxoffice demo`'s chaos race.
pub(crate) struct Venue {
    owners: Vec<AtomicU64>,
    map: Mutex<Arc<Vec<bool>>>,
    /// The next fan to arrive.
    next: AtomicUsize,
}

/// The fans' arrivals and choices.
struct Fans {
    count: usize,
    seed: u64,
    limit: u32,
    started: Instant,
    per_fan: Duration,
}

impl Venue {
    /// `seats` seats, all free, on a map that says so.
    pub(crate) fn new(seats: usize) -> Venue {
        Venue {
            owners: (0..seats).map(|_| AtomicU64::new(0)).collect(),
            map: Mutex::new(Arc::new(vec![true; seats])),
            next: AtomicUsize::new(0),
        }
    }

    /// Redraws the map from the bookings.
    pub(crate) fn refresh(&self) {
        let fresh: Vec<bool> = self
            .owners
            .iter()
            .map(|o| o.load(Ordering::Relaxed) == 0)
            .collect();
        if let Ok(mut m) = self.map.lock() {
            *m = Arc::new(fresh);
        }
    }

    /// Redraws the map from the bookings every 100 ms.
    async fn refresh_every_100_ms(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.refresh();
        }
    }

    /// A fan's read of the map: up to `q` seats that looked free on it, from `start` on
    /// ("10 seats left" is what the page said).
    pub(crate) fn looking_free(&self, start: usize, q: usize) -> Vec<usize> {
        let seats = self.owners.len();
        let snapshot = self.map.lock().map(|m| m.clone()).unwrap_or_default();
        (0..seats)
            .map(|k| (start + k) % seats)
            .filter(|&s| snapshot.get(s).copied().unwrap_or(false))
            .take(q)
            .collect()
    }

    /// Books seat `s` with no check (`seat.book(user)` after a stale `if seat.free`); returns
    /// how many bookings it had before.
    pub(crate) fn book_blindly(&self, s: usize) -> u64 {
        self.owners[s].fetch_add(1, Ordering::Relaxed)
    }

    /// What the bookings add up to.
    pub(crate) fn tally(&self) -> Tally {
        let mut t = Tally::default();
        for n in self.owners.iter().map(|o| o.load(Ordering::Relaxed)) {
            t.bookings += n;
            if n > 0 {
                t.sold += 1;
            }
            if n > 1 {
                t.double_booked += 1;
            }
        }
        t.oversold = t.bookings - u64::from(t.sold);
        t
    }

    /// One worker: takes the next fan at their arrival until none is left; each books 1 to 4
    /// seats that looked free on the map.
    async fn book(self: Arc<Self>, fans: Fans) {
        let seats = self.owners.len();
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= fans.count {
                break;
            }
            let arrival = fans.started + fans.per_fan * u32::try_from(i).unwrap_or(u32::MAX);
            tokio::time::sleep_until(arrival.into()).await;
            let mut rng = StdRng::seed_from_u64(fans.seed ^ i as u64);
            let q = rng.random_range(1..=fans.limit.clamp(1, 4)) as usize;
            // Book the first free-looking ones from a random place.
            let picks = self.looking_free(rng.random_range(0..seats), q);
            tokio::task::yield_now().await; // the network between the read and the write
            for s in picks {
                self.book_blindly(s);
            }
        }
    }

    /// The figures: seats booked at least once (sold), more than once (double-booked), and
    /// the bookings past one per seat (oversold).
    fn report(&self, args: &FlashSaleArgs, started: Instant) -> Report {
        let mut report = Report {
            naive: true,
            fans: args.fans,
            seats: args.seats,
            sale_seconds: started.elapsed().as_secs_f64(),
            nodes: 1,
            ..Report::default()
        };
        let t = self.tally();
        report.tickets = t.bookings;
        report.sold = t.sold;
        report.double_booked = t.double_booked;
        report.oversold = t.oversold;
        report.available = args.seats - t.sold;
        report
    }
}

/// A venue's bookings added up.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    /// Seats booked at least once.
    pub sold: u32,
    /// Bookings in all.
    pub bookings: u64,
    /// Bookings past one per seat.
    pub oversold: u64,
    /// Seats booked more than once.
    pub double_booked: u64,
}
