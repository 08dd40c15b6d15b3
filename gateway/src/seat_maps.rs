//! Seat maps, built once per change of a section and shared by every reader.
//!
//! Per section, the seats of its map are kept encoded: the `SectionSeats.seats` entries of the
//! wire format, one `Bytes` for the whole section with the end of every row in it. They are
//! built from the section's published snapshot (never entering its mailbox) lazily, on the first
//! read after a change, by one reader while the others wait or take the previous map; a hold
//! never builds anything. A read takes the map it finds if the section has not changed since
//! (the map is true now) or if the map was known true at most the staleness window ago
//! (less than [`SEAT_MAP_STALENESS_MS_DEFAULT`]); otherwise it builds anew. Under a flash sale, where a big
//! section changes with every hold, that is at most one build per section per window.
//!
//! A response ([`SeatMapReply`]) is written straight from the shared bytes (tonic copies them
//! once into its send buffer): nothing per seat is built per reader. Its size is capped: a whole
//! event over the cap is refused (`SEAT_MAP_TOO_LARGE`), and one section is answered in pages
//! of whole rows that fit the cap (`first_row`, `next_first_row`).

use boxoffice_engine::hash::DashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use boxoffice_engine::{
    Clock, Engine, EngineError, EventId, Layout, Rejection, SectionFeed, SectionId,
    SectionSnapshot, SectionSpec,
};
use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{DecodeContext, WireType, encode_key, encode_varint, encoded_len_varint};

use crate::convert::seat_status;
pub use crate::limits::{
    SEAT_MAP_BYTES_DEFAULT, SEAT_MAP_BYTES_MAX, SEAT_MAP_BYTES_MIN, SEAT_MAP_IDLE_MS,
    SEAT_MAP_STALENESS_MS_DEFAULT,
};
use crate::status::ApiError;

/// The seat maps of every event read so far.
pub struct SeatMaps {
    events: DashMap<EventId, Arc<EventMaps>>,
    limit_bytes: usize,
    staleness_ms: u64,
    /// When the next read looks for maps nobody read for [`SEAT_MAP_IDLE_MS`], ms.
    next_sweep_ms: AtomicU64,
}

/// The sections of one event (they never change once the event exists).
struct EventMaps {
    sections: Vec<Arc<SectionMaps>>,
}

/// What a request asks for, checked.
pub struct SeatMapAsk {
    /// The event.
    pub event_id: EventId,
    /// One section, or all.
    pub section: Option<SectionId>,
    /// With a section: the first row to return.
    pub first_row: u32,
}

impl SeatMaps {
    /// Seat maps answering at most `limit_bytes` per response (clamped to
    /// [`SEAT_MAP_BYTES_MIN`]..=[`SEAT_MAP_BYTES_MAX`]) and reusing a map of a section that
    /// changed since for less than `staleness_ms` after it was last known true (0: a change is
    /// always shown at once).
    pub fn new(limit_bytes: usize, staleness_ms: u64) -> SeatMaps {
        SeatMaps {
            events: DashMap::default(),
            limit_bytes: limit_bytes.clamp(SEAT_MAP_BYTES_MIN, SEAT_MAP_BYTES_MAX),
            staleness_ms,
            next_sweep_ms: AtomicU64::new(0),
        }
    }

    /// Drops the maps nobody read for [`SEAT_MAP_IDLE_MS`] (the next read builds them again):
    /// the memory kept is that of the maps in use, not of every map ever read. Runs at most
    /// once per [`SEAT_MAP_IDLE_MS`] / 4, from a read.
    fn drop_idle(&self, now: u64) {
        let due = self.next_sweep_ms.load(Ordering::Acquire);
        let next = now + SEAT_MAP_IDLE_MS / 4;
        if now < due
            || self
                .next_sweep_ms
                .compare_exchange(due, next, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        for event in &self.events {
            for s in &event.sections {
                if now.saturating_sub(s.last_read_ms.load(Ordering::Acquire)) >= SEAT_MAP_IDLE_MS {
                    s.latest.lock().unwrap_or_else(|e| e.into_inner()).take();
                }
            }
        }
    }

    /// The largest response, in bytes.
    pub fn limit_bytes(&self) -> usize {
        self.limit_bytes
    }

    fn event(&self, engine: &Engine, event_id: &EventId) -> Result<Arc<EventMaps>, EngineError> {
        if let Some(e) = self.events.get(event_id) {
            return Ok(e.clone());
        }
        let feeds = engine.section_feeds(event_id)?;
        let maps = EventMaps {
            sections: feeds
                .into_iter()
                .map(SectionMaps::new)
                .map(Arc::new)
                .collect(),
        };
        Ok(self
            .events
            .entry(event_id.clone())
            .or_insert_with(|| Arc::new(maps))
            .clone())
    }

    /// The sections `ask` wants of `event`: one (its `first_row` within it), or all of them if
    /// the whole event's map fits the limit.
    fn chosen<'e>(
        &self,
        event: &'e EventMaps,
        ask: &SeatMapAsk,
        header: usize,
    ) -> Result<Vec<&'e Arc<SectionMaps>>, ApiError> {
        Ok(match &ask.section {
            Some(id) => {
                let s = event
                    .sections
                    .iter()
                    .find(|s| &s.spec.section_id == id)
                    .ok_or(Rejection::SectionNotFound)?;
                let rows = s.row_count();
                if ask.first_row != 0 && ask.first_row as usize >= rows {
                    return Err(invalid(
                        "first_row",
                        format!("the section has {rows} rows (first_row counts from 0)"),
                    ));
                }
                vec![s]
            }
            None => {
                if ask.first_row != 0 {
                    return Err(invalid(
                        "first_row",
                        "first_row needs a section_id".to_owned(),
                    ));
                }
                let size = header + event.sections.iter().map(|s| s.len_max()).sum::<usize>();
                if size > self.limit_bytes {
                    return Err(ApiError::SeatMapTooLarge {
                        event_id: ask.event_id.0.clone(),
                        size,
                        limit: self.limit_bytes,
                    });
                }
                event.sections.iter().collect()
            }
        })
    }

    /// The answer to `ask`: the shared maps of its sections, within the size limit.
    pub async fn read(
        &self,
        engine: &Engine,
        clock: &dyn Clock,
        ask: SeatMapAsk,
    ) -> Result<SeatMapReply, ApiError> {
        engine.check_reads()?;
        self.drop_idle(clock.now_ms());
        let event = self.event(engine, &ask.event_id)?;
        let header = event_header_len(ask.event_id.as_str());
        let chosen = self.chosen(&event, &ask, header)?;
        let mut sections = Vec::with_capacity(chosen.len());
        let mut next_first_row = 0;
        for s in chosen {
            let (built, as_of_ms) = s.read(clock, self.staleness_ms).await?;
            let rows = if ask.section.is_some() {
                // Whole rows from `first_row` while they fit; at least one (the smallest limit
                // holds the largest row).
                let budget = self
                    .limit_bytes
                    .saturating_sub(header + SECTION_HEADER_LEN_MAX);
                let rows = built.rows_fitting(ask.first_row as usize, budget);
                if rows.end < built.row_ends.len() {
                    next_first_row = rows.end as u32;
                }
                rows
            } else {
                0..built.row_ends.len()
            };
            sections.push(SectionPart {
                built,
                rows,
                as_of_unix_ms: ms(as_of_ms),
            });
        }
        let as_of_unix_ms = sections.iter().map(|s| s.as_of_unix_ms).min().unwrap_or(0);
        Ok(SeatMapReply {
            event_id: ask.event_id.0,
            as_of_unix_ms,
            sections,
            next_first_row,
        })
    }
}

fn invalid(field: &str, reason: String) -> ApiError {
    Rejection::invalid(field, reason).into()
}

fn ms(t: u64) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

/// One section's maps: its feed, its latest built map, and the lock one builder holds.
pub(crate) struct SectionMaps {
    spec: Arc<SectionSpec>,
    snapshots: tokio::sync::watch::Receiver<Arc<SectionSnapshot>>,
    /// Encoded size of the seats: fixed by the layout (a status is always one byte).
    seats_len: usize,
    latest: Mutex<Option<Arc<Built>>>,
    /// One builder at a time; the build holds it (owned) until its map is stored, even if the
    /// reader who started it has gone (a caller's deadline).
    building: Arc<tokio::sync::Mutex<()>>,
    builds: AtomicU64,
    /// The last time a reader asked for this section's map, ms.
    last_read_ms: AtomicU64,
}

impl SectionMaps {
    pub(crate) fn new(feed: SectionFeed) -> SectionMaps {
        let seats_len = seats_len(&feed.spec);
        SectionMaps {
            spec: Arc::new(feed.spec),
            snapshots: feed.snapshots,
            seats_len,
            latest: Mutex::new(None),
            building: Arc::new(tokio::sync::Mutex::new(())),
            builds: AtomicU64::new(0),
            last_read_ms: AtomicU64::new(0),
        }
    }

    fn row_count(&self) -> usize {
        match &self.spec.layout {
            Layout::GeneralAdmission { .. } => 0,
            Layout::Reserved { rows } => rows.len(),
        }
    }

    /// The most this section adds to a response.
    fn len_max(&self) -> usize {
        SECTION_HEADER_LEN_MAX + self.seats_len
    }

    /// How many maps were built (tests).
    #[cfg(test)]
    fn builds(&self) -> u64 {
        self.builds.load(Ordering::Relaxed)
    }

    fn latest(&self) -> Option<Arc<Built>> {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The latest map if it will do for a reader at `now` who saw the section at `version`,
    /// with the time it is known true: the section has not changed since it was built, or it
    /// was known true less than `staleness_ms` ago (0: never a map of an older version).
    fn usable(&self, version: u64, now: u64, staleness_ms: u64) -> Option<(Arc<Built>, u64)> {
        let b = self.latest()?;
        if b.version == version {
            // Unchanged since it was built: true now.
            b.true_at_ms.fetch_max(now, Ordering::AcqRel);
            return Some((b, now));
        }
        let true_at = b.true_at_ms.load(Ordering::Acquire);
        (b.version > version || now.saturating_sub(true_at) < staleness_ms).then_some((b, true_at))
    }

    /// The map a reader gets now, with the time it is known true. A build runs on a task of
    /// its own and stores its map whether or not the reader who started it still waits (a
    /// reader whose deadline passed must not waste the build, nor let the next reader start
    /// another while it still runs).
    pub(crate) async fn read(
        self: &Arc<Self>,
        clock: &dyn Clock,
        staleness_ms: u64,
    ) -> Result<(Arc<Built>, u64), ApiError> {
        let version = self.snapshots.borrow().version;
        let now = clock.now_ms();
        self.last_read_ms.fetch_max(now, Ordering::AcqRel);
        if let Some(hit) = self.usable(version, now, staleness_ms) {
            return Ok(hit);
        }
        let one_builder = self.building.clone().lock_owned().await;
        // Another reader may have built it while this one waited.
        let snap = self.snapshots.borrow().clone();
        let now = clock.now_ms();
        if let Some(hit) = self.usable(snap.version, now, staleness_ms) {
            return Ok(hit);
        }
        let me = Arc::clone(self);
        let build_task = tokio::spawn(async move {
            let _one_builder = one_builder;
            let (spec, seats_len) = (me.spec.clone(), me.seats_len);
            // A big section takes tens of ms to encode: off the async workers.
            let built = boxoffice_engine::rt::blocking(move || build(&spec, &snap, seats_len, now))
                .await
                .ok()?;
            let built = Arc::new(built);
            me.builds.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("boxoffice_seat_map_builds_total").increment(1);
            *me.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(built.clone());
            Some(built)
        });
        let built = build_task
            .await
            .ok()
            .flatten()
            .ok_or(ApiError::Engine(EngineError::NotReady))?;
        Ok((built, now))
    }
}

/// A section's map as built from one snapshot: counts and the encoded seats.
pub struct Built {
    version: u64,
    /// When that version was published, ms.
    changed_at_ms: u64,
    section_id: String,
    capacity: u32,
    available: u32,
    held: u32,
    sold: u32,
    /// The `seats` entries (field 6 of `SectionSeats`), encoded, rows in order.
    seats: Bytes,
    /// Where each row's entries end in `seats`.
    row_ends: Vec<usize>,
    /// The last time the map was known true (its snapshot was the latest), ms.
    true_at_ms: AtomicU64,
    /// The price tiers as they stood (field 10 of `SectionSeats`).
    price_tiers: Vec<boxoffice_proto::v1::PriceTierStatus>,
    /// The price of the next place (field 11).
    next_price_cents: u64,
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built")
            .field("section_id", &self.section_id)
            .field("version", &self.version)
            .field("seats_bytes", &self.seats.len())
            .field("rows", &self.row_ends.len())
            .finish()
    }
}

impl Built {
    /// Rows from `first` whose seats fit in `budget` bytes (at least one).
    fn rows_fitting(&self, first: usize, budget: usize) -> Range<usize> {
        let rows = self.row_ends.len();
        if first >= rows {
            return rows..rows;
        }
        let start = self.row_start(first);
        let mut end = first + 1;
        while end < rows && self.row_ends[end] - start <= budget {
            end += 1;
        }
        first..end
    }

    fn row_start(&self, row: usize) -> usize {
        if row == 0 { 0 } else { self.row_ends[row - 1] }
    }

    fn seats_of(&self, rows: &Range<usize>) -> &[u8] {
        if rows.is_empty() {
            return &[];
        }
        &self.seats[self.row_start(rows.start)..self.row_ends[rows.end - 1]]
    }
}

/// Builds the map of `snap`, true at `now`.
fn build(spec: &SectionSpec, snap: &SectionSnapshot, seats_len: usize, now: u64) -> Built {
    let mut buf = BytesMut::with_capacity(seats_len);
    let mut row_ends = Vec::new();
    if let Layout::Reserved { rows } = &spec.layout {
        row_ends.reserve_exact(rows.len());
        let mut statuses = snap.seats.iter();
        let section = spec.section_id.as_str();
        for r in rows {
            for n in 1..=r.seat_count {
                let status = *statuses.next().expect("a snapshot covers its layout");
                put_seat(&mut buf, section, &r.label, n, seat_status(status));
            }
            row_ends.push(buf.len());
        }
    }
    debug_assert_eq!(buf.len(), seats_len, "the layout fixes the encoded size");
    Built {
        version: snap.version,
        changed_at_ms: snap.changed_at_ms,
        section_id: spec.section_id.0.clone(),
        capacity: snap.capacity,
        available: snap.available,
        held: snap.held,
        sold: snap.sold,
        seats: buf.freeze(),
        row_ends,
        true_at_ms: AtomicU64::new(now),
        price_tiers: crate::convert::price_tiers(&snap.price_tiers),
        next_price_cents: snap.next_price_cents,
    }
}

// ---- The wire format of `Seat` and `SectionSeats` (boxoffice.proto), written by hand --------

const SEAT_ID: u32 = 1;
const SEAT_ROW: u32 = 2;
const SEAT_NUMBER: u32 = 3;
const SEAT_STATUS: u32 = 4;
const SECTION_ID: u32 = 1;
const SECTION_COUNTS: [u32; 4] = [2, 3, 4, 5];
const SECTION_SEATS: u32 = 6;
const SECTION_AS_OF: u32 = 7;
const SECTION_VERSION: u32 = 8;
const SECTION_CHANGED_AT: u32 = 9;
const SECTION_PRICE_TIERS: u32 = 10;
const SECTION_NEXT_PRICE: u32 = 11;
const MAP_EVENT_ID: u32 = 1;
const MAP_AS_OF: u32 = 2;
const MAP_SECTIONS: u32 = 3;
const MAP_NEXT_FIRST_ROW: u32 = 4;

/// Most bytes one `sections` entry of a `SeatMap` takes besides its seats: its key and length
/// (1 + 5), the section id (1 + 1 + 64), four counts (4 x 6), two times (2 x 11), the
/// version (1 + 10), the price tiers (each: key and length 1 + 1, two counts 2 x 6, a price
/// 1 + 10) and the next price (1 + 10).
const SECTION_HEADER_LEN_MAX: usize = 1
    + 5
    + 1
    + 1
    + boxoffice_engine::limits::ID_LEN_MAX
    + 4 * 6
    + 2 * (1 + 10)
    + 1
    + 10
    + boxoffice_engine::limits::PRICE_TIERS_PER_SECTION_MAX * (2 + 2 * 6 + 11)
    + 11;

fn decimal_len(mut n: u32) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

fn put_decimal(buf: &mut BytesMut, n: u32) {
    let mut digits = [0u8; 10];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.put_slice(&digits[i..]);
}

fn len_field(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// Encoded length of one `Seat` message (without its key and length).
fn seat_body_len(section: &str, row: &str, n: u32) -> usize {
    let id = section.len() + 1 + row.len() + 1 + decimal_len(n);
    // status: key and a one-byte value (1 to 3)
    len_field(id) + len_field(row.len()) + 1 + encoded_len_varint(u64::from(n)) + 2
}

/// Encoded length of the seats of a layout.
fn seats_len(spec: &SectionSpec) -> usize {
    let Layout::Reserved { rows } = &spec.layout else {
        return 0;
    };
    let section = spec.section_id.as_str();
    rows.iter()
        .map(|r| {
            (1..=r.seat_count)
                .map(|n| len_field(seat_body_len(section, &r.label, n)))
                .sum::<usize>()
        })
        .sum()
}

/// Writes one `seats` entry: the seat id is `{section}:{row}:{number}` (`SeatId::new`).
fn put_seat(buf: &mut BytesMut, section: &str, row: &str, n: u32, status: i32) {
    encode_key(SECTION_SEATS, WireType::LengthDelimited, buf);
    encode_varint(seat_body_len(section, row, n) as u64, buf);
    encode_key(SEAT_ID, WireType::LengthDelimited, buf);
    encode_varint(
        (section.len() + 1 + row.len() + 1 + decimal_len(n)) as u64,
        buf,
    );
    buf.put_slice(section.as_bytes());
    buf.put_u8(b':');
    buf.put_slice(row.as_bytes());
    buf.put_u8(b':');
    put_decimal(buf, n);
    encode_key(SEAT_ROW, WireType::LengthDelimited, buf);
    encode_varint(row.len() as u64, buf);
    buf.put_slice(row.as_bytes());
    encode_key(SEAT_NUMBER, WireType::Varint, buf);
    encode_varint(u64::from(n), buf);
    encode_key(SEAT_STATUS, WireType::Varint, buf);
    encode_varint(status as u64, buf);
}

/// Most bytes of a `SeatMap` besides its sections: the event id, a time (1 + 10) and
/// `next_first_row` (1 + 5).
fn event_header_len(event_id: &str) -> usize {
    len_field(event_id.len()) + 11 + 6
}

/// One section of a reply: a shared map and the rows of it to send.
#[derive(Debug, Clone)]
pub struct SectionPart {
    built: Arc<Built>,
    rows: Range<usize>,
    as_of_unix_ms: i64,
}

impl SectionPart {
    fn counts(&self) -> [u32; 4] {
        let b = &self.built;
        [b.capacity, b.available, b.held, b.sold]
    }

    fn body_len(&self) -> usize {
        let mut len = 0;
        if !self.built.section_id.is_empty() {
            len += len_field(self.built.section_id.len());
        }
        for c in self.counts() {
            if c != 0 {
                len += 1 + encoded_len_varint(u64::from(c));
            }
        }
        len += self.built.seats_of(&self.rows).len();
        if self.as_of_unix_ms != 0 {
            len += 1 + encoded_len_varint(self.as_of_unix_ms as u64);
        }
        if self.built.version != 0 {
            len += 1 + encoded_len_varint(self.built.version);
        }
        let changed = ms(self.built.changed_at_ms);
        if changed != 0 {
            len += 1 + encoded_len_varint(changed as u64);
        }
        len += prost::encoding::message::encoded_len_repeated(
            SECTION_PRICE_TIERS,
            &self.built.price_tiers,
        );
        if self.built.next_price_cents != 0 {
            len += 1 + encoded_len_varint(self.built.next_price_cents);
        }
        len
    }

    fn encode(&self, buf: &mut impl BufMut) {
        encode_key(MAP_SECTIONS, WireType::LengthDelimited, buf);
        encode_varint(self.body_len() as u64, buf);
        if !self.built.section_id.is_empty() {
            prost::encoding::string::encode(SECTION_ID, &self.built.section_id, buf);
        }
        for (tag, c) in SECTION_COUNTS.into_iter().zip(self.counts()) {
            if c != 0 {
                prost::encoding::uint32::encode(tag, &c, buf);
            }
        }
        buf.put_slice(self.built.seats_of(&self.rows));
        if self.as_of_unix_ms != 0 {
            prost::encoding::int64::encode(SECTION_AS_OF, &self.as_of_unix_ms, buf);
        }
        if self.built.version != 0 {
            prost::encoding::uint64::encode(SECTION_VERSION, &self.built.version, buf);
        }
        let changed = ms(self.built.changed_at_ms);
        if changed != 0 {
            prost::encoding::int64::encode(SECTION_CHANGED_AT, &changed, buf);
        }
        prost::encoding::message::encode_repeated(
            SECTION_PRICE_TIERS,
            &self.built.price_tiers,
            buf,
        );
        if self.built.next_price_cents != 0 {
            prost::encoding::uint64::encode(SECTION_NEXT_PRICE, &self.built.next_price_cents, buf);
        }
    }
}

/// A `SeatMap` response written from shared, pre-encoded sections: the same bytes on the wire
/// as `boxoffice.v1.SeatMap`, so clients decode it as that. Encode-only (the server never reads
/// one).
#[derive(Debug, Clone, Default)]
pub struct SeatMapReply {
    /// The event.
    pub event_id: String,
    /// The oldest `as_of_unix_ms` of the sections.
    pub as_of_unix_ms: i64,
    /// The sections, in event order.
    pub sections: Vec<SectionPart>,
    /// The first row not sent (one section asked), 0: none left.
    pub next_first_row: u32,
}

impl prost::Message for SeatMapReply {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.event_id.is_empty() {
            prost::encoding::string::encode(MAP_EVENT_ID, &self.event_id, buf);
        }
        if self.as_of_unix_ms != 0 {
            prost::encoding::int64::encode(MAP_AS_OF, &self.as_of_unix_ms, buf);
        }
        for s in &self.sections {
            s.encode(buf);
        }
        if self.next_first_row != 0 {
            prost::encoding::uint32::encode(MAP_NEXT_FIRST_ROW, &self.next_first_row, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl bytes::Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Never decoded by the server: clients decode `boxoffice.v1.SeatMap`.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        let mut len = 0;
        if !self.event_id.is_empty() {
            len += len_field(self.event_id.len());
        }
        if self.as_of_unix_ms != 0 {
            len += 1 + encoded_len_varint(self.as_of_unix_ms as u64);
        }
        for s in &self.sections {
            len += len_field(s.body_len());
        }
        if self.next_first_row != 0 {
            len += 1 + encoded_len_varint(u64::from(self.next_first_row));
        }
        len
    }

    fn clear(&mut self) {
        *self = SeatMapReply::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use boxoffice_engine::{ManualClock, RowSpec, SeatId, SeatStatus};
    use boxoffice_proto::v1 as pb;
    use prost::Message as _;

    fn spec(rows: &[(&str, u32)]) -> SectionSpec {
        SectionSpec {
            section_id: SectionId::from("orch"),
            name: String::new(),
            price_cents: 100,
            layout: Layout::Reserved {
                rows: rows
                    .iter()
                    .map(|(l, n)| RowSpec {
                        label: (*l).to_owned(),
                        seat_count: *n,
                    })
                    .collect(),
            },
            price_tiers: Vec::new(),
        }
    }

    fn snapshot(seats: Vec<SeatStatus>, version: u64) -> SectionSnapshot {
        let free = seats
            .iter()
            .filter(|s| **s == SeatStatus::Available)
            .count() as u32;
        let held = seats.iter().filter(|s| **s == SeatStatus::Held).count() as u32;
        SectionSnapshot {
            section_id: SectionId::from("orch"),
            capacity: seats.len() as u32,
            available: free,
            held,
            sold: seats.len() as u32 - free - held,
            seats,
            version,
            changed_at_ms: 0,
            next_price_cents: 0,
            price_tiers: Vec::new(),
        }
    }

    type Feed = tokio::sync::watch::Sender<Arc<SectionSnapshot>>;

    fn maps(spec: SectionSpec, first: SectionSnapshot) -> (Arc<SectionMaps>, Feed) {
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(first));
        let maps = Arc::new(SectionMaps::new(SectionFeed {
            spec,
            snapshots: rx,
        }));
        (maps, tx)
    }

    fn decode(part: SectionPart) -> pb::SectionSeats {
        let reply = SeatMapReply {
            event_id: "e".into(),
            as_of_unix_ms: part.as_of_unix_ms,
            sections: vec![part],
            next_first_row: 0,
        };
        let bytes = reply.encode_to_vec();
        assert_eq!(bytes.len(), reply.encoded_len());
        let mut map = pb::SeatMap::decode(bytes.as_slice()).expect("decodes as a SeatMap");
        map.sections.remove(0)
    }

    /// The largest header a section can have (longest id, every count, time and price at its
    /// most, every tier) fits the bound the pages are cut by.
    #[test]
    fn the_largest_section_header_fits_its_bound() {
        let mut spec = spec(&[("A", 1)]);
        spec.section_id =
            SectionId::from("x".repeat(boxoffice_engine::limits::ID_LEN_MAX).as_str());
        let mut snap = snapshot(vec![SeatStatus::Available], u64::MAX);
        (snap.capacity, snap.available, snap.held, snap.sold) =
            (u32::MAX, u32::MAX, u32::MAX, u32::MAX);
        snap.changed_at_ms = i64::MAX as u64;
        let most = boxoffice_engine::prices::TierStatus {
            places: u32::MAX,
            price_cents: u64::MAX,
            remaining: u32::MAX,
        };
        snap.price_tiers = vec![most; boxoffice_engine::limits::PRICE_TIERS_PER_SECTION_MAX];
        snap.next_price_cents = u64::MAX;
        let built = build(&spec, &snap, seats_len(&spec), 1_000);
        let seats = built.seats.len();
        let part = SectionPart {
            rows: 0..1,
            built: Arc::new(built),
            as_of_unix_ms: i64::MAX,
        };
        let whole = len_field(part.body_len());
        assert!(
            whole - seats <= SECTION_HEADER_LEN_MAX,
            "{} > {SECTION_HEADER_LEN_MAX}",
            whole - seats
        );
    }

    #[test]
    fn the_encoding_is_a_seat_map_and_its_size_is_known_from_the_layout() {
        let spec = spec(&[("A", 3), ("BB", 12), ("C", 1000)]);
        let mut seats = vec![SeatStatus::Available; 1015];
        seats[1] = SeatStatus::Held;
        seats[14] = SeatStatus::Sold;
        let mut snap = snapshot(seats.clone(), 7);
        snap.changed_at_ms = 900;
        let tier = |places, price_cents, remaining| boxoffice_engine::prices::TierStatus {
            places,
            price_cents,
            remaining,
        };
        snap.price_tiers = vec![tier(10, 9_000, 0), tier(20, 12_000, 18)];
        snap.next_price_cents = 12_000;
        let built = build(&spec, &snap, seats_len(&spec), 1_000);
        assert_eq!(built.seats.len(), seats_len(&spec));
        let s = decode(SectionPart {
            rows: 0..3,
            built: Arc::new(built),
            as_of_unix_ms: 1_000,
        });
        assert_eq!(
            (s.section_id.as_str(), s.capacity, s.available),
            ("orch", 1015, 1013)
        );
        assert_eq!((s.held, s.sold, s.as_of_unix_ms), (1, 1, 1_000));
        assert_eq!((s.version, s.changed_at_unix_ms), (7, 900));
        let tiers: Vec<(u32, u64, u32)> = s
            .price_tiers
            .iter()
            .map(|t| (t.places, t.price_cents, t.remaining))
            .collect();
        assert_eq!(tiers, [(10, 9_000, 0), (20, 12_000, 18)]);
        assert_eq!(s.next_price_cents, 12_000);
        assert_eq!(s.seats.len(), 1015);
        let mut i = 0;
        for (row, count) in [("A", 3), ("BB", 12), ("C", 1000)] {
            for n in 1..=count {
                let seat = &s.seats[i];
                let id = SeatId::new(&SectionId::from("orch"), row, n);
                assert_eq!(
                    (seat.seat_id.as_str(), seat.row.as_str()),
                    (id.0.as_str(), row)
                );
                assert_eq!(seat.number, n);
                assert_eq!(seat.status, seat_status(seats[i]));
                i += 1;
            }
        }
    }

    #[test]
    fn pages_are_whole_rows_that_fit() {
        let spec = spec(&[("A", 10), ("B", 10), ("C", 10), ("D", 10)]);
        let snap = snapshot(vec![SeatStatus::Available; 40], 1);
        let built = build(&spec, &snap, seats_len(&spec), 0);
        let row = built.row_ends[0];
        assert_eq!(built.rows_fitting(0, 2 * row), 0..2);
        assert_eq!(built.rows_fitting(1, 2 * row + 1), 1..3);
        assert_eq!(built.rows_fitting(3, 10 * row), 3..4);
        // At least one row, even over the budget.
        assert_eq!(built.rows_fitting(2, 1), 2..3);
        let s = decode(SectionPart {
            rows: 1..3,
            built: Arc::new(built),
            as_of_unix_ms: 5,
        });
        assert_eq!(s.seats.len(), 20);
        assert_eq!(s.seats[0].seat_id, "orch:B:1");
        assert_eq!(s.seats[19].seat_id, "orch:C:10");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_that_gives_up_mid_build_wastes_nothing() {
        let clock = Arc::new(ManualClock::new(10_000));
        let labels: Vec<String> = (0..1000).map(|i| format!("R{i}")).collect();
        let rows: Vec<(&str, u32)> = labels.iter().map(|l| (l.as_str(), 1000)).collect();
        let spec = spec(&rows);
        let (maps, _feed) = maps(spec, snapshot(vec![SeatStatus::Available; 1_000_000], 1));
        // A reader starts the build of a 1M-seat map, and is dropped (its caller's deadline)
        // while the build runs.
        let first = {
            let (maps, clock) = (maps.clone(), clock.clone());
            tokio::spawn(async move { maps.read(clock.as_ref(), 1_000).await.map(|_| ()) })
        };
        while maps.building.try_lock().is_ok() && !first.is_finished() {
            tokio::task::yield_now().await;
        }
        first.abort();
        // The next reader gets that build's map: one build, not two.
        let (b, _) = maps.read(clock.as_ref(), 1_000).await.expect("a map");
        assert_eq!(b.version, 1);
        assert_eq!(maps.builds(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_build_per_change_shared_by_concurrent_readers() {
        let clock = Arc::new(ManualClock::new(10_000));
        let spec = spec(&[("A", 1000), ("B", 1000)]);
        let (maps, feed) = maps(spec, snapshot(vec![SeatStatus::Available; 2000], 1));
        // Eight readers at once: one builds, the others wait for it and share it.
        let reads = (0..8).map(|_| {
            let (maps, clock) = (maps.clone(), clock.clone());
            tokio::spawn(async move { maps.read(clock.as_ref(), 1_000).await.expect("a map") })
        });
        let reads: Vec<_> = reads.collect();
        let mut got = Vec::new();
        for r in reads {
            got.push(r.await);
        }
        assert_eq!(maps.builds(), 1);
        let first = got[0].as_ref().expect("a reader").0.clone();
        for r in &got {
            let (b, as_of) = r.as_ref().expect("a reader");
            assert!(Arc::ptr_eq(b, &first), "every reader shares one map");
            assert_eq!(*as_of, 10_000, "an unchanged section's map is true now");
        }
        // Unchanged, later: the same map, true now.
        clock.advance_ms(5_000);
        let (b, as_of) = maps.read(clock.as_ref(), 1_000).await.expect("a map");
        assert!(Arc::ptr_eq(&b, &first));
        assert_eq!((as_of, maps.builds()), (15_000, 1));
        // A change within the staleness window: the previous map, as of when it was known
        // true; no build.
        let mut seats = vec![SeatStatus::Available; 2000];
        seats[0] = SeatStatus::Held;
        feed.send_replace(Arc::new(snapshot(seats.clone(), 2)));
        clock.advance_ms(999);
        let (b, as_of) = maps.read(clock.as_ref(), 1_000).await.expect("a map");
        assert!(Arc::ptr_eq(&b, &first));
        assert_eq!((as_of, maps.builds()), (15_000, 1));
        // At the window's end: rebuilt once from the latest snapshot, which shows the hold.
        clock.advance_ms(1);
        let (b, as_of) = maps.read(clock.as_ref(), 1_000).await.expect("a map");
        assert_eq!((b.version, b.held, as_of, maps.builds()), (2, 1, 16_000, 2));
        let (again, _) = maps.read(clock.as_ref(), 1_000).await.expect("a map");
        assert!(Arc::ptr_eq(&b, &again));
        assert_eq!(maps.builds(), 2);
        // Without a window, a change is shown at once.
        feed.send_replace(Arc::new(snapshot(vec![SeatStatus::Available; 2000], 3)));
        let (b, _) = maps.read(clock.as_ref(), 0).await.expect("a map");
        assert_eq!((b.version, b.held, maps.builds()), (3, 0, 3));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn maps_nobody_reads_are_dropped() {
        let clock = Arc::new(ManualClock::new(100_000));
        let all = SeatMaps::new(SEAT_MAP_BYTES_DEFAULT, 1_000);
        let free = || vec![SeatStatus::Available; 10];
        let (read, _f1) = maps(spec(&[("A", 10)]), snapshot(free(), 1));
        let (idle, _f2) = maps(spec(&[("A", 10)]), snapshot(free(), 1));
        all.events.insert(
            EventId::from("e"),
            Arc::new(EventMaps {
                sections: vec![read.clone(), idle.clone()],
            }),
        );
        read.read(clock.as_ref(), 1_000).await.expect("a map");
        idle.read(clock.as_ref(), 1_000).await.expect("a map");
        all.drop_idle(clock.now_ms());
        assert!(read.latest().is_some() && idle.latest().is_some());
        clock.advance_ms(SEAT_MAP_IDLE_MS - 1);
        read.read(clock.as_ref(), 1_000).await.expect("a map");
        all.drop_idle(clock.now_ms());
        assert!(
            read.latest().is_some() && idle.latest().is_some(),
            "not idle yet"
        );
        // Sweeps come at most once per quarter of the idle time.
        clock.advance_ms(SEAT_MAP_IDLE_MS / 4);
        read.read(clock.as_ref(), 1_000).await.expect("a map");
        all.drop_idle(clock.now_ms());
        assert!(read.latest().is_some(), "read a moment ago");
        assert!(
            idle.latest().is_none(),
            "nobody read it for the idle time: dropped"
        );
        idle.read(clock.as_ref(), 1_000).await.expect("a map");
        assert_eq!(idle.builds(), 2, "built again when read again");
    }
}
