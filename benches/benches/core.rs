//! Pure `SectionCore` throughput: holds per second with no actor, no log and no clock.
//!
//! - `ga_best2`: `Pick::Best(2)` in a general-admission section of 1,000,000 places (the
//!   section keeps every hold, so its maps grow to 500,000 entries before it is replaced);
//! - `ga_best2_10k`: the same in a section of 10,000 places (small, cache-resident state), to
//!   tell the cost of the decision from the cost of a large state;
//! - `seats2`: `Pick::Seats` of two free adjacent seats in a reserved section of 100 rows x 100
//!   seats (the seats are named in layout order, so every hold succeeds);
//! - `best4`: `Pick::Best(4)` in a reserved section of 100 rows x 100 seats.
//!
//! Every iteration is one successful hold. When a section is full a new one is made outside the
//! timed region, as are the commands (hold ids, user ids, seat ids): only `place_hold` (the
//! decision, the record, the view it answers with) is timed.

use std::hint::black_box;
use std::time::{Duration, Instant};

use boxoffice_engine::core::{Pick, PlaceHold, SectionCore};
use boxoffice_engine::{
    EventId, HoldId, Layout, RowSpec, SECTION_CAPACITY_MAX, SectionId, SectionSpec, UserId,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const NOW_MS: u64 = 1_767_225_600_000;
const TTL_MS: u64 = 600_000;
/// Commands built (untimed) per timed chunk.
const CHUNK: u64 = 4_096;

#[derive(Clone, Copy)]
enum Kind {
    GaBest2,
    GaBest2Small,
    Seats2,
    Best4,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::GaBest2 => "ga_best2",
            Kind::GaBest2Small => "ga_best2_10k",
            Kind::Seats2 => "seats2",
            Kind::Best4 => "best4",
        }
    }

    fn section(self) -> SectionCore {
        let section_id = SectionId::from("s");
        let layout = match self {
            Kind::GaBest2 => Layout::GeneralAdmission {
                capacity: SECTION_CAPACITY_MAX,
            },
            Kind::GaBest2Small => Layout::GeneralAdmission { capacity: 10_000 },
            Kind::Seats2 | Kind::Best4 => Layout::Reserved {
                rows: (0..100)
                    .map(|r| RowSpec {
                        label: format!("R{r}"),
                        seat_count: 100,
                    })
                    .collect(),
            },
        };
        SectionCore::new(
            EventId::from("e"),
            SectionSpec {
                section_id,
                name: "bench".into(),
                price_cents: 5_000,
                layout,
                price_tiers: Vec::new(),
            },
        )
    }

    fn places_per_hold(self) -> u32 {
        match self {
            Kind::GaBest2 | Kind::GaBest2Small | Kind::Seats2 => 2,
            Kind::Best4 => 4,
        }
    }

    /// The `n`th hold into a section (0-based since the section was made).
    fn command(self, core: &SectionCore, n: u64, serial: u64) -> PlaceHold {
        let pick = match self {
            Kind::GaBest2 | Kind::GaBest2Small => Pick::Best(2),
            Kind::Best4 => Pick::Best(4),
            Kind::Seats2 => {
                let first = u32::try_from(2 * n).expect("a section has at most 1,000,000 seats");
                Pick::Seats(vec![core.seat_id(first), core.seat_id(first + 1)])
            }
        };
        PlaceHold {
            // A ULID is 26 characters: keep the ids as long as the engine's.
            hold_id: HoldId(format!("e.s.h{serial:026}")),
            user_id: UserId(format!("user-{serial}")),
            pick,
            ttl_ms: TTL_MS,
            idem: None,
            code: None,
        }
    }
}

/// A section being filled, kept across criterion's calls so every hold succeeds.
struct Filling {
    kind: Kind,
    core: SectionCore,
    /// Holds placed in `core`.
    placed: u64,
    /// Holds the section takes before it is full.
    fits: u64,
    /// Holds placed in all sections (unique ids).
    serial: u64,
}

impl Filling {
    fn new(kind: Kind) -> Filling {
        let core = kind.section();
        let (capacity, ..) = core.counts();
        Filling {
            kind,
            core,
            placed: 0,
            fits: u64::from(capacity / kind.places_per_hold()),
            serial: 0,
        }
    }

    /// Places `iters` holds, returning the time spent in `place_hold` only.
    fn run(&mut self, iters: u64) -> Duration {
        let mut left = iters;
        let mut timed = Duration::ZERO;
        while left > 0 {
            if self.placed == self.fits {
                // Full: a fresh section (the old one is dropped here, untimed).
                self.core = self.kind.section();
                self.placed = 0;
            }
            let chunk = left.min(self.fits - self.placed).min(CHUNK);
            let commands: Vec<PlaceHold> = (0..chunk)
                .map(|i| {
                    self.kind
                        .command(&self.core, self.placed + i, self.serial + i)
                })
                .collect();
            let mut answers = Vec::with_capacity(commands.len());
            let started = Instant::now();
            for cmd in commands {
                let answer = self.core.place_hold(black_box(cmd), NOW_MS);
                answers.push(black_box(answer));
            }
            timed += started.elapsed();
            for answer in answers {
                if let Err(e) = answer {
                    panic!("a {} hold was refused: {e}", self.kind.name());
                }
            }
            self.placed += chunk;
            self.serial += chunk;
            left -= chunk;
        }
        timed
    }
}

fn core_holds(c: &mut Criterion) {
    let mut group = c.benchmark_group("core_holds");
    boxoffice_benches::short(&mut group);
    group.throughput(Throughput::Elements(1));
    for kind in [Kind::GaBest2, Kind::GaBest2Small, Kind::Seats2, Kind::Best4] {
        let mut filling = Filling::new(kind);
        group.bench_function(kind.name(), |b| b.iter_custom(|iters| filling.run(iters)));
        let (capacity, available, held, sold) = filling.core.counts();
        assert_eq!(available + held + sold, capacity);
        filling
            .core
            .check_invariants()
            .expect("the core is consistent after the bench");
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = boxoffice_benches::criterion();
    targets = core_holds
}
criterion_main!(benches);
