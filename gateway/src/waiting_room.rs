//! The virtual waiting room: one per event. It absorbs the burst so the booking path only ever
//! serves a controlled stream.
//!
//! - **Join** gives each (user, session) one join sequence number, kept in a map from a 64-bit
//!   hash of the pair to the number (joining again returns the same place). Past `queue_max`,
//!   `QUEUE_FULL`.
//! - **Opening.** Fans who joined before `sale_opens_at` are shuffled when it comes: a
//!   Fisher-Yates shuffle of their join numbers driven by ChaCha20 seeded with the event's
//!   shuffle seed, which is committed (its SHA-256 published) before opening and revealed after.
//!   Anyone can replay [`shuffle_positions`] with the revealed seed. After opening, first come,
//!   first served: position = join number.
//! - **Admission** runs at `admit_rate_per_second` on a timer: positions below `admitted` are
//!   admitted; each admitted position's admission time is kept (8 bytes) so its admission token
//!   expires `admission_window` after it, however often the fan polls. The budget never banks
//!   more than one second of admissions while the line is empty, so the rate stays under its cap.
//! - **Polling** (`status`) reads atomics and write-once arrays only: no lock shared with Join or
//!   with admission, no allocation.
//!
//! **Durable** (issue 13): a room made by [`WaitingRoom::resume`] acts on nothing its event's
//! room stream does not already hold (`boxoffice_engine::rooms`): it hands out join numbers from
//! blocks reserved there first ([`JoinError::Reserve`]), opens once the draw's size is recorded
//! ([`WaitingRoom::opening_due`], [`WaitingRoom::open`]), and admits positions once their
//! admission is recorded ([`spawn_admitter`]). A room resumed from that record on another node
//! or after a restart answers every queue token with the same position, admission time and
//! epoch (the epoch is derived from the event, not drawn at random); only the join map (who has
//! which number) is not kept, so a fan who joins again after a failover takes a new place (the
//! fan's queue token keeps the old one).
//!
//! Memory per waiting fan: the join map entry (8-byte keyed hash + 4-byte number, in a hash
//! table), 8 bytes of admission time, and 4 bytes of shuffled position for pre-opening fans:
//! [`WaitingRoom::memory_bytes`] reports it; the `waiting_room` bench measures 1,000,000 fans.

use boxoffice_engine::hash::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use boxoffice_engine::rooms::RoomRecord;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

pub use crate::limits::ADMIT_TICK;
const CHUNK: usize = 1 << 16;

/// How a waiting room is configured (from its event).
#[derive(Clone, Debug)]
pub struct RoomConfig {
    /// When the sale opens, ms since the Unix epoch (0: open already).
    pub opens_at_ms: u64,
    /// Admissions per second.
    pub admit_rate_per_second: u32,
    /// How long an admitted fan may book.
    pub admission_window_ms: u64,
    /// Most fans in the line.
    pub queue_max: u32,
    /// The shuffle seed (revealed after opening).
    pub seed: [u8; 32],
}

/// A fan's standing, as `GetStatus` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Before the opening draw: no position yet.
    BeforeOpening {
        /// ms until the sale opens.
        opens_in_ms: u64,
    },
    /// In line.
    Waiting {
        /// 1-based position in line.
        position: u64,
        /// Fans ahead not yet admitted.
        ahead: u64,
        /// Estimated seconds until admission.
        eta_seconds: u32,
    },
    /// Admitted at `admitted_at_ms`; the window closes at `expires_at_ms`.
    Admitted {
        /// 1-based position in line.
        position: u64,
        /// When admitted.
        admitted_at_ms: u64,
        /// When the admission window closes.
        expires_at_ms: u64,
    },
    /// Admitted, but the window has closed.
    Expired {
        /// 1-based position in line.
        position: u64,
    },
}

struct Joins {
    map: HashMap<u64, u32>,
    opened: bool,
}

/// A write-once array of u64 in lazily allocated chunks: lock-free reads after the write.
struct Chunked {
    chunks: Box<[OnceLock<Box<[AtomicU64]>>]>,
}

impl Chunked {
    fn new(len: usize) -> Chunked {
        Chunked {
            chunks: (0..len.div_ceil(CHUNK)).map(|_| OnceLock::new()).collect(),
        }
    }
    fn set(&self, i: usize, v: u64) {
        if let Some(c) = self.chunks.get(i / CHUNK) {
            let chunk = c.get_or_init(|| (0..CHUNK).map(|_| AtomicU64::new(0)).collect());
            chunk[i % CHUNK].store(v, Ordering::Release);
        }
    }
    fn get(&self, i: usize) -> Option<u64> {
        let v = self.chunks.get(i / CHUNK)?.get()?[i % CHUNK].load(Ordering::Acquire);
        Some(v)
    }
    fn bytes(&self) -> usize {
        self.chunks.iter().filter(|c| c.get().is_some()).count() * CHUNK * 8
            + self.chunks.len() * std::mem::size_of::<OnceLock<Box<[AtomicU64]>>>()
    }
}

/// One event's waiting room.
pub struct WaitingRoom {
    config: RoomConfig,
    joins: Mutex<Joins>,
    /// Fans in line (join numbers handed out).
    joined: AtomicU32,
    /// Join numbers below this may be handed out (`u32::MAX` in a room that records nothing).
    reserved: AtomicU32,
    /// Held while the room opens (the draw's size recorded, then the draw made).
    pub opening: tokio::sync::Mutex<()>,
    /// Held while the next block of join numbers is recorded: one joiner records it, and the
    /// others that found the block used up wait, then take numbers from it (not one record
    /// each, all waiting on the log).
    pub reserving: tokio::sync::Mutex<()>,
    /// Pre-opening fans and their shuffled positions, set once at opening.
    drawn: OnceLock<Vec<u32>>,
    opened: AtomicBool,
    /// Positions below this are admitted.
    admitted: AtomicU64,
    /// Per position: admission time, ms since the Unix epoch (0: not yet).
    admitted_at: Chunked,
    /// Signed into queue tokens: a durable room's is derived from its event (the same on every
    /// node and after a restart); one that records nothing draws a random one.
    epoch: u64,
    /// Keyed hasher of (user, session): nobody can search for colliding pairs offline.
    hasher: std::collections::hash_map::RandomState,
    /// Admissions per second measured over the last ticks (f64 bits), for ETAs.
    measured_rate: AtomicU64,
    /// Admissions per second now: the configured rate until an operator changes it
    /// ([`WaitingRoom::set_rate`]).
    rate: AtomicU32,
}

/// The opening draw: position (0-based) of each pre-opening join number, from the seed.
/// Fisher-Yates over `0..n` with ChaCha20 seeded by `seed`; `positions[join] = position`.
pub fn shuffle_positions(seed: &[u8; 32], n: u32) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n).collect();
    let mut rng = ChaCha20Rng::from_seed(*seed);
    for i in (1..order.len()).rev() {
        let j = rng.random_range(0..=i);
        order.swap(i, j);
    }
    // order[position] = join number; invert it.
    let mut positions = vec![0u32; order.len()];
    for (pos, join) in order.into_iter().enumerate() {
        positions[join as usize] = u32::try_from(pos).expect("n fits u32");
    }
    positions
}

/// Why a join was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinError {
    /// The line is at `queue_max`.
    QueueFull,
    /// The numbers reserved are all handed out: reserve up to `upto` (durably), then
    /// [`WaitingRoom::reserve`] and join again.
    Reserve {
        /// The end of the next block.
        upto: u32,
    },
}

/// Join numbers reserved at once by a durable room: one record per block. A room resumed
/// elsewhere starts after the last block, so up to this many places stay empty in line.
pub const RESERVE_BLOCK: u32 = 256;

impl WaitingRoom {
    /// A room that records nothing (benchmarks, tests): its line lives in memory only.
    /// `_now_ms` is when it was made (kept for symmetry with the clock-driven API).
    pub fn new(config: RoomConfig, _now_ms: u64) -> WaitingRoom {
        WaitingRoom::with(config, boxoffice_engine::rt::random_u64(), u32::MAX)
    }

    fn with(config: RoomConfig, epoch: u64, reserved: u32) -> WaitingRoom {
        let max = config.queue_max as usize;
        WaitingRoom {
            joins: Mutex::new(Joins {
                map: HashMap::default(),
                opened: false,
            }),
            joined: AtomicU32::new(0),
            reserved: AtomicU32::new(reserved),
            opening: tokio::sync::Mutex::new(()),
            reserving: tokio::sync::Mutex::new(()),
            drawn: OnceLock::new(),
            opened: AtomicBool::new(false),
            admitted: AtomicU64::new(0),
            admitted_at: Chunked::new(max),
            epoch,
            hasher: std::collections::hash_map::RandomState::new(),
            measured_rate: AtomicU64::new(f64::from(config.admit_rate_per_second).to_bits()),
            rate: AtomicU32::new(config.admit_rate_per_second),
            config,
        }
    }

    /// A durable room, resumed from what its record holds (`line`; empty for a new room): the
    /// numbers reserved are taken (the next join gets the first number after them), the draw
    /// and the admissions recorded are made again.
    pub fn resume(
        config: RoomConfig,
        epoch: u64,
        line: &boxoffice_engine::rooms::RoomLine,
    ) -> WaitingRoom {
        let room = WaitingRoom::with(config, epoch, line.reserved);
        room.joined.store(line.reserved, Ordering::Release);
        if let Some(drawn) = line.drawn {
            room.open(drawn);
        }
        for &(from, to, at_ms) in &line.admitted {
            room.admit_range(from, to, at_ms);
        }
        room
    }

    /// Admissions per second now.
    pub fn rate(&self) -> u32 {
        self.rate.load(Ordering::Relaxed)
    }

    /// Admits `per_second` from the next step on (an operator's `UpdateSale`).
    pub fn set_rate(&self, per_second: u32) {
        self.rate.store(per_second, Ordering::Relaxed);
    }

    /// The room's configuration.
    pub fn config(&self) -> &RoomConfig {
        &self.config
    }

    /// Whether the opening draw happened.
    pub fn is_open(&self) -> bool {
        self.opened.load(Ordering::Acquire)
    }

    /// Fans in line.
    pub fn len(&self) -> u32 {
        self.joined.load(Ordering::Acquire)
    }

    /// Whether nobody joined yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions admitted so far.
    pub fn admitted(&self) -> u64 {
        self.admitted.load(Ordering::Acquire)
    }

    /// This room's epoch (a random number signed into its queue tokens).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Fans drawn at the opening (those who joined before it), once it happened.
    pub fn drawn(&self) -> Option<u32> {
        self.drawn
            .get()
            .map(|d| u32::try_from(d.len()).unwrap_or(u32::MAX))
    }

    /// The join number of the place `(user, session)` already has, if any (takes no place).
    pub fn find(&self, user: &str, session: &str) -> Option<u32> {
        use std::hash::BuildHasher;
        let key = self.hasher.hash_one((user, session));
        let j = self.joins.lock().unwrap_or_else(|e| e.into_inner());
        j.map.get(&key).copied()
    }

    /// Joins (or rejoins) the line: the fan's join number.
    pub fn join(&self, user: &str, session: &str) -> Result<u32, JoinError> {
        use std::hash::BuildHasher;
        let key = self.hasher.hash_one((user, session));
        let mut j = self.joins.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&n) = j.map.get(&key) {
            return Ok(n);
        }
        let n = self.joined.load(Ordering::Acquire);
        if n >= self.config.queue_max {
            return Err(JoinError::QueueFull);
        }
        let reserved = self.reserved.load(Ordering::Acquire);
        if n >= reserved {
            return Err(JoinError::Reserve {
                upto: n.saturating_add(RESERVE_BLOCK).min(self.config.queue_max),
            });
        }
        j.map.insert(key, n);
        self.joined.store(n + 1, Ordering::Release);
        Ok(n)
    }

    /// The 0-based position of join number `join`, once drawn.
    pub fn position_of(&self, join: u32) -> Option<u64> {
        if !self.is_open() {
            return None;
        }
        let drawn = self.drawn.get()?;
        Some(u64::from(drawn.get(join as usize).copied().unwrap_or(join)))
    }

    /// Join numbers below this may be handed out.
    pub fn reserved(&self) -> u32 {
        self.reserved.load(Ordering::Acquire)
    }

    /// Join numbers up to `upto` may be handed out (their reservation is recorded).
    pub fn reserve(&self, upto: u32) {
        self.reserved.fetch_max(upto, Ordering::AcqRel);
    }

    /// If the room is not open and `now_ms` has reached the opening: the size of the opening
    /// draw (every join number handed out so far). A durable room records it, then [`open`]s.
    ///
    /// [`open`]: WaitingRoom::open
    pub fn opening_due(&self, now_ms: u64) -> Option<u32> {
        if self.is_open() || now_ms < self.config.opens_at_ms {
            return None;
        }
        Some(self.joined.load(Ordering::Acquire))
    }

    /// Opens the room with a draw of the join numbers below `drawn` (once; later calls keep the
    /// first draw). Numbers handed out from now on are not drawn.
    pub fn open(&self, drawn: u32) {
        let mut j = self.joins.lock().unwrap_or_else(|e| e.into_inner());
        if !j.opened {
            let _ = self.drawn.set(shuffle_positions(&self.config.seed, drawn));
            // Joins from now on get numbers past the draw.
            self.joined.fetch_max(drawn, Ordering::AcqRel);
            j.opened = true;
            self.opened.store(true, Ordering::Release);
        }
    }

    /// Opens the room if `now_ms` has reached the opening (a room that records nothing):
    /// draws the pre-opening fans' order. Returns whether the room is open.
    pub fn open_if_due(&self, now_ms: u64) -> bool {
        if let Some(n) = self.opening_due(now_ms) {
            self.open(n);
        }
        self.is_open()
    }

    /// The next admission step's range: up to `budget` positions from the admission frontier,
    /// as many as are in line (`(from, to)`).
    pub fn next_admissions(&self, budget: u64) -> (u64, u64) {
        let from = self.admitted.load(Ordering::Acquire);
        let waiting = u64::from(self.len()).saturating_sub(from);
        (from, from + budget.min(waiting))
    }

    /// Admits the positions `from..to` at `at_ms` (a durable room, once recorded). Positions
    /// below the frontier are left as they were.
    pub fn admit_range(&self, from: u64, to: u64, at_ms: u64) {
        // 0 means "not yet": an admission at the epoch itself is stamped 1 ms later.
        let stamp = at_ms.max(1);
        let frontier = self.admitted.load(Ordering::Acquire);
        for p in from.max(frontier)..to {
            self.admitted_at.set(p as usize, stamp);
        }
        self.admitted.fetch_max(to, Ordering::AcqRel);
    }

    /// One admission step: admits up to `budget` more positions at `now_ms`; returns how many.
    pub fn admit(&self, budget: u64, now_ms: u64) -> u64 {
        if !self.open_if_due(now_ms) {
            return 0;
        }
        let (from, to) = self.next_admissions(budget);
        self.admit_range(from, to, now_ms);
        to - from
    }

    /// Admissions per second, as recently measured (the ETA's basis).
    pub fn measured_rate(&self) -> f64 {
        f64::from_bits(self.measured_rate.load(Ordering::Relaxed))
    }

    fn record_rate(&self, per_second: f64) {
        let old = f64::from_bits(self.measured_rate.load(Ordering::Relaxed));
        let new = 0.8 * old + 0.2 * per_second;
        self.measured_rate.store(new.to_bits(), Ordering::Relaxed);
    }

    /// Where join number `join` stands at `now_ms`.
    pub fn standing(&self, join: u32, now_ms: u64) -> Standing {
        let Some(pos) = self.position_of(join) else {
            return Standing::BeforeOpening {
                opens_in_ms: self.config.opens_at_ms.saturating_sub(now_ms),
            };
        };
        let admitted = self.admitted();
        if pos < admitted
            && let Some(admitted_at_ms) = self.admitted_at.get(pos as usize).filter(|s| *s > 0)
        {
            let expires_at_ms = admitted_at_ms + self.config.admission_window_ms;
            return if now_ms < expires_at_ms {
                Standing::Admitted {
                    position: pos + 1,
                    admitted_at_ms,
                    expires_at_ms,
                }
            } else {
                Standing::Expired { position: pos + 1 }
            };
        }
        let ahead = pos.saturating_sub(admitted);
        let rate = f64::from_bits(self.measured_rate.load(Ordering::Relaxed))
            .max(f64::from(self.rate()) * 0.1)
            .max(1.0);
        let eta = ((ahead + 1) as f64 / rate).ceil();
        Standing::Waiting {
            position: pos + 1,
            ahead,
            eta_seconds: if eta > f64::from(u32::MAX) {
                u32::MAX
            } else {
                eta as u32
            },
        }
    }

    /// Approximate heap bytes held for the line (join map, draw, admission times).
    pub fn memory_bytes(&self) -> usize {
        let map = self
            .joins
            .lock()
            .map(|j| {
                // hashbrown: one (u64, u32) slot (16 bytes) + one control byte per bucket.
                j.map.capacity() * 17
            })
            .unwrap_or(0);
        let drawn = self.drawn.get().map_or(0, |d| d.capacity() * 4);
        map + drawn + self.admitted_at.bytes() + std::mem::size_of::<WaitingRoom>()
    }
}

/// The admission rate limiter: a budget that grows at `admit_rate_per_second` of clock time
/// and never banks more than one second of admissions while the line is empty, so the rate
/// stays under its cap.
pub struct Admitter {
    budget: f64,
    last_ms: Option<u64>,
    /// Seconds since the step before (for the measured rate).
    dt: f64,
}

impl Default for Admitter {
    fn default() -> Self {
        Self::new()
    }
}

impl Admitter {
    /// A limiter with an empty budget.
    pub fn new() -> Admitter {
        Admitter {
            budget: 0.0,
            last_ms: None,
            dt: 0.0,
        }
    }

    /// One step at `now_ms` (a room that records nothing): admits what the budget allows;
    /// returns how many were admitted.
    pub fn step(&mut self, room: &WaitingRoom, now_ms: u64) -> u64 {
        if !room.open_if_due(now_ms) {
            self.last_ms = Some(now_ms);
            return 0;
        }
        let (from, to) = self.plan(room, now_ms);
        room.admit_range(from, to, now_ms);
        self.spent(room, to - from);
        to - from
    }

    /// The budget at `now_ms` of an open room, as the range of positions it admits
    /// (`(from, to)`, possibly empty); then [`Admitter::spent`] with how many were admitted.
    pub fn plan(&mut self, room: &WaitingRoom, now_ms: u64) -> (u64, u64) {
        let last = self.last_ms.replace(now_ms).unwrap_or(now_ms);
        let rate = f64::from(room.rate());
        // Budget accrues from the opening on, never for time before it.
        let since = last.max(room.config.opens_at_ms);
        self.dt = now_ms.saturating_sub(since) as f64 / 1000.0;
        self.budget = (self.budget + rate * self.dt).min(rate.max(1.0));
        room.next_admissions(self.budget.floor() as u64)
    }

    /// `n` positions were admitted: they leave the budget, and count in the measured rate.
    pub fn spent(&mut self, room: &WaitingRoom, n: u64) {
        self.budget -= n as f64;
        if self.dt > 0.0 && room.admitted() < u64::from(room.len()) {
            room.record_rate(n as f64 / self.dt);
        }
    }

    /// The room is not open yet at `now_ms`: no budget accrues before the opening.
    pub fn idle(&mut self, now_ms: u64) {
        self.last_ms = Some(now_ms);
    }
}

/// Opens a durable room if its opening is due: records the draw's size, then draws. Returns
/// whether the room is open (an error: the record failed, the room stays closed).
pub async fn open_durably(
    room: &WaitingRoom,
    event_id: &boxoffice_engine::EventId,
    engine: &boxoffice_engine::Engine,
    now_ms: u64,
) -> Result<bool, boxoffice_engine::EngineError> {
    if room.is_open() {
        return Ok(true);
    }
    let _opening = room.opening.lock().await;
    let Some(drawn) = room.opening_due(now_ms) else {
        return Ok(room.is_open());
    };
    engine
        .record_room(event_id, vec![RoomRecord::Opened { drawn }])
        .await?;
    room.open(drawn);
    Ok(true)
}

/// Runs a durable room's admission timer (every [`ADMIT_TICK`]) until the room is dropped
/// elsewhere (`Arc` count 1) or the returned task is aborted: opens the room when due, and
/// admits at the event's rate, each step recorded before the room says so to anyone.
pub fn spawn_admitter(
    event_id: &boxoffice_engine::EventId,
    room: Arc<WaitingRoom>,
    clock: Arc<dyn boxoffice_engine::Clock>,
    engine: boxoffice_engine::Engine,
) -> tokio::task::JoinHandle<()> {
    let labels = [("event", event_id.to_string())];
    let admitted = metrics::counter!("boxoffice_waiting_room_admitted_total", &labels);
    let rate = metrics::gauge!("boxoffice_waiting_room_admit_rate", &labels);
    let length = metrics::gauge!("boxoffice_waiting_room_queue_length", &labels);
    let event_id = event_id.clone();
    tokio::spawn(async move {
        let mut admitter = Admitter::new();
        let mut tick = tokio::time::interval(ADMIT_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if Arc::strong_count(&room) == 1 {
                break;
            }
            let now = clock.now_ms();
            length.set(f64::from(room.len()));
            match open_durably(&room, &event_id, &engine, now).await {
                Ok(true) => {}
                Ok(false) => {
                    admitter.idle(now);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(event = %event_id, error = %e, "the waiting room cannot open");
                    continue;
                }
            }
            // The operator's controls, read every tick: a new rate is in force from this step,
            // and a paused, queue-all or ended sale admits nobody (no budget builds up).
            let Ok(terms) = engine.event_terms(&event_id) else {
                admitter.idle(now);
                continue;
            };
            room.set_rate(terms.admit_rate_per_second);
            if !terms.sale_state.admits() {
                admitter.idle(now);
                rate.set(0.0);
                continue;
            }
            let (from, to) = admitter.plan(&room, now);
            if to > from {
                let at_ms = now.max(1);
                let recorded = engine
                    .record_room(&event_id, vec![RoomRecord::Admitted { from, to, at_ms }])
                    .await;
                if let Err(e) = recorded {
                    // Nobody is told of an admission not recorded: the next tick tries again.
                    tracing::warn!(event = %event_id, error = %e, "admissions not recorded");
                    continue;
                }
                room.admit_range(from, to, at_ms);
            }
            admitter.spent(&room, to - from);
            admitted.increment(to - from);
            rate.set(room.measured_rate());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(opens_at_ms: u64, rate: u32, max: u32) -> WaitingRoom {
        WaitingRoom::new(
            RoomConfig {
                opens_at_ms,
                admit_rate_per_second: rate,
                admission_window_ms: 10_000,
                queue_max: max,
                seed: [7; 32],
            },
            0,
        )
    }

    #[test]
    fn rejoin_keeps_the_place_and_the_line_has_a_bound() {
        let r = room(0, 10, 3);
        assert_eq!(r.find("a", "s1"), None, "no place before the join");
        assert_eq!(r.join("a", "s1"), Ok(0));
        assert_eq!(r.join("b", "s1"), Ok(1));
        assert_eq!(r.find("b", "s1"), Some(1));
        assert_eq!(r.find("b", "s2"), None);
        assert_eq!(r.join("a", "s1"), Ok(0), "refresh keeps the place");
        assert_eq!(r.join("a", "s2"), Ok(2), "another session is another place");
        assert_eq!(r.join("c", "s1"), Err(JoinError::QueueFull));
        assert_eq!(
            r.join("b", "s1"),
            Ok(1),
            "members can still rejoin when full"
        );
    }

    #[test]
    fn pre_opening_fans_are_shuffled_then_first_come_first_served() {
        let r = room(1_000, 1_000, 1_000);
        for u in 0..100 {
            r.join(&format!("u{u}"), "s").unwrap();
        }
        assert!(matches!(
            r.standing(5, 500),
            Standing::BeforeOpening { opens_in_ms: 500 }
        ));
        assert_eq!(r.admit(10, 999), 0, "nobody before the opening");
        assert!(r.open_if_due(1_000));
        let late = r.join("late", "s").unwrap();
        let mut positions: Vec<u64> = (0..100).map(|j| r.position_of(j).unwrap()).collect();
        assert_eq!(
            r.position_of(late),
            Some(100),
            "after opening: first come, first served"
        );
        assert_ne!(positions, (0..100).collect::<Vec<_>>(), "shuffled");
        positions.sort_unstable();
        assert_eq!(positions, (0..100).collect::<Vec<_>>(), "a permutation");
        assert_eq!(
            shuffle_positions(&[7; 32], 100),
            (0..100)
                .map(|j| r.position_of(j).unwrap() as u32)
                .collect::<Vec<_>>(),
            "reproducible from the seed"
        );
    }

    #[test]
    fn admission_runs_at_the_rate_and_never_banks_more_than_a_second() {
        let r = room(1_000, 500, 100_000);
        for u in 0..10_000 {
            r.join(&format!("u{u}"), "s").unwrap();
        }
        let mut a = Admitter::new();
        // Four seconds of 20 ms ticks from the opening: 500/s gives 2,000 (within 10%).
        let mut now = 1_000;
        a.step(&r, now);
        for _ in 0..200 {
            now += 20;
            a.step(&r, now);
        }
        let admitted = r.admitted();
        assert!(
            (1_800..=2_200).contains(&admitted),
            "admitted {admitted} in 4 s at 500/s"
        );
        // Late ticks (a stalled timer) do not burst past one second's worth.
        now += 30_000;
        let burst = a.step(&r, now);
        assert!(burst <= 500, "burst {burst}");
        // An empty line does not bank budget: after 10 idle seconds, a new crowd is admitted at
        // the rate again.
        let r = room(0, 100, 100_000);
        let mut a = Admitter::new();
        a.step(&r, 0);
        a.step(&r, 10_000);
        for u in 0..1_000 {
            r.join(&format!("v{u}"), "s").unwrap();
        }
        let first = a.step(&r, 10_020);
        assert!(first <= 100, "at most one second of budget: {first}");
    }

    #[test]
    fn admission_window_runs_from_admission_not_from_polling() {
        let r = room(0, 100, 100);
        for u in 0..10 {
            r.join(&format!("u{u}"), "s").unwrap();
        }
        assert_eq!(r.admit(3, 5_000), 3);
        let first = (0..10).find(|&j| r.position_of(j) == Some(0)).unwrap();
        let fourth = (0..10).find(|&j| r.position_of(j) == Some(3)).unwrap();
        assert_eq!(
            r.standing(first, 6_000),
            Standing::Admitted {
                position: 1,
                admitted_at_ms: 5_000,
                expires_at_ms: 15_000
            }
        );
        assert_eq!(r.standing(first, 15_000), Standing::Expired { position: 1 });
        match r.standing(fourth, 6_000) {
            Standing::Waiting {
                position: 4,
                ahead: 0,
                eta_seconds,
            } => assert!(eta_seconds >= 1),
            s => panic!("{s:?}"),
        }
    }
}
