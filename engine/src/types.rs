//! Domain types: identifiers, event and section specifications, and the views the engine answers with.
//!
//! Identifiers are newtypes over `String` so an event id can never be passed where a user id is
//! wanted. Ids the caller chooses (event, section, row label) are restricted to
//! `[A-Za-z0-9_-]`, which lets the engine build hold, order and seat ids that carry their route:
//!
//! | id | format | example |
//! |---|---|---|
//! | seat | `{section_id}:{row_label}:{number}` (numbers start at 1) | `orch:A:12` |
//! | hold | `{event_id}.{section_id}.h{ulid}` | `e9.orch.h01JD…` |
//! | order | `{event_id}.{section_id}.o{ulid}` | `e9.orch.o01JD…` |
//! | ticket | `{order_id}.{n}` (n from 1) | `e9.orch.o01JD….1` |
//!
//! The router needs nothing but the id to find the section actor that owns a hold or an order.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::error::Rejection;

/// Longest accepted event, section or user id, in bytes.
pub const ID_LEN_MAX: usize = 64;
/// Longest accepted row label, in bytes.
pub const ROW_LABEL_LEN_MAX: usize = 16;
/// Longest accepted idempotency key, in bytes.
pub const IDEMPOTENCY_KEY_LEN_MAX: usize = 128;
/// Most sections one event may have.
pub const SECTIONS_PER_EVENT_MAX: usize = 256;
/// Most rows one reserved section may have.
pub const ROWS_PER_SECTION_MAX: usize = 1_000;
/// Most seats one row may have.
pub const SEATS_PER_ROW_MAX: u32 = 1_000;
/// Most places one section may have (reserved or general admission).
pub const SECTION_CAPACITY_MAX: u32 = 1_000_000;
/// Highest per-user limit an event may set.
pub const PER_USER_LIMIT_MAX: u32 = 100;
/// Longest hold TTL an event may set (one day).
pub const HOLD_TTL_MS_MAX: u64 = 24 * 60 * 60 * 1000;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub struct $name(pub String);

        impl $name {
            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
    };
}

id_type!(
    /// An event (one show on sale). Chosen by the caller or generated; `[A-Za-z0-9_-]{1,64}`.
    EventId
);
id_type!(
    /// A section of an event, unique within the event; `[A-Za-z0-9_-]{1,64}`.
    SectionId
);
id_type!(
    /// A seat, unique within its event: `{section_id}:{row_label}:{number}`.
    SeatId
);
id_type!(
    /// A hold: `{event_id}.{section_id}.h{ulid}`.
    HoldId
);
id_type!(
    /// An order: `{event_id}.{section_id}.o{ulid}`.
    OrderId
);
id_type!(
    /// A user (a fan), as the calling service names them; 1 to 64 bytes, no control characters.
    UserId
);

/// Whether `s` is a valid caller-chosen id (event, section): `[A-Za-z0-9_-]`, 1 to `max` bytes.
pub fn is_plain_id(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks a plain id field, naming the field in the rejection.
pub fn check_plain_id(field: &str, s: &str, max: usize) -> Result<(), Rejection> {
    if is_plain_id(s, max) {
        Ok(())
    } else {
        Err(Rejection::invalid(
            field,
            format!("must be 1 to {max} characters of [A-Za-z0-9_-]"),
        ))
    }
}

/// Checks a user id: 1 to 64 bytes, no control characters.
pub fn check_user_id(user: &UserId) -> Result<(), Rejection> {
    let s = user.as_str();
    if s.is_empty() || s.len() > ID_LEN_MAX || s.chars().any(char::is_control) {
        return Err(Rejection::invalid(
            "user_id",
            format!("must be 1 to {ID_LEN_MAX} bytes without control characters"),
        ));
    }
    Ok(())
}

/// Checks an idempotency key (empty means none): at most 128 bytes, no control characters.
pub fn check_idempotency_key(key: &str) -> Result<(), Rejection> {
    if key.len() > IDEMPOTENCY_KEY_LEN_MAX || key.chars().any(char::is_control) {
        return Err(Rejection::invalid(
            "idempotency_key",
            format!("must be at most {IDEMPOTENCY_KEY_LEN_MAX} bytes without control characters"),
        ));
    }
    Ok(())
}

impl SeatId {
    /// Builds the seat id of seat `number` (from 1) in row `row` of section `section`.
    pub fn new(section: &SectionId, row: &str, number: u32) -> SeatId {
        SeatId(format!("{section}:{row}:{number}"))
    }

    /// Splits a seat id into (section, row label, number), or `None` if it is not of our format.
    pub fn parse(&self) -> Option<(&str, &str, u32)> {
        let mut parts = self.0.split(':');
        let section = parts.next()?;
        let row = parts.next()?;
        let number: u32 = parts.next()?.parse().ok()?;
        if parts.next().is_some() || !is_plain_id(section, ID_LEN_MAX) {
            return None;
        }
        Some((section, row, number))
    }
}

/// The route a hold or order id carries: which event and section own it.
fn route_of(id: &str, tag: char) -> Option<(EventId, SectionId)> {
    let mut parts = id.split('.');
    let event = parts.next()?;
    let section = parts.next()?;
    let rest = parts.next()?;
    if parts.next().is_some()
        || !rest.starts_with(tag)
        || rest.len() < 2
        || !is_plain_id(event, ID_LEN_MAX)
        || !is_plain_id(section, ID_LEN_MAX)
    {
        return None;
    }
    Some((EventId::from(event), SectionId::from(section)))
}

impl HoldId {
    /// A new hold id in `section` of `event`, made unique by a ULID.
    pub fn generate(event: &EventId, section: &SectionId) -> HoldId {
        HoldId(format!("{event}.{section}.h{}", ulid::Ulid::generate()))
    }

    /// The (event, section) this hold belongs to, or `None` if the id is not one of ours.
    pub fn route(&self) -> Option<(EventId, SectionId)> {
        route_of(&self.0, 'h')
    }
}

impl OrderId {
    /// A new order id in `section` of `event`, made unique by a ULID.
    pub fn generate(event: &EventId, section: &SectionId) -> OrderId {
        OrderId(format!("{event}.{section}.o{}", ulid::Ulid::generate()))
    }

    /// The (event, section) this order belongs to, or `None` if the id is not one of ours.
    pub fn route(&self) -> Option<(EventId, SectionId)> {
        route_of(&self.0, 'o')
    }
}

/// A row of a reserved section: a label and how many seats it has (numbered from 1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowSpec {
    /// Row label as printed on the ticket, `[A-Za-z0-9_-]{1,16}`.
    pub label: String,
    /// Seats in the row, numbered 1..=seat_count.
    pub seat_count: u32,
}

/// How a section's places are laid out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    /// A standing area or unnumbered places: only a count.
    GeneralAdmission {
        /// Number of places.
        capacity: u32,
    },
    /// Numbered seats in rows.
    Reserved {
        /// Rows in the order the layout lists them (the first is the best).
        rows: Vec<RowSpec>,
    },
}

/// The kind of a section, as the API shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SectionKind {
    /// Places are counted, not numbered.
    GeneralAdmission,
    /// Seats are numbered in rows.
    Reserved,
}

/// One section of an event as the organiser specifies it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SectionSpec {
    /// Unique within the event, `[A-Za-z0-9_-]{1,64}`.
    pub section_id: SectionId,
    /// Display name.
    pub name: String,
    /// Price of one place, in cents.
    pub price_cents: u64,
    /// General admission or reserved rows.
    pub layout: Layout,
}

impl SectionSpec {
    /// Number of places in the section.
    pub fn capacity(&self) -> u32 {
        match &self.layout {
            Layout::GeneralAdmission { capacity } => *capacity,
            Layout::Reserved { rows } => rows.iter().map(|r| r.seat_count).sum(),
        }
    }

    /// General admission or reserved.
    pub fn kind(&self) -> SectionKind {
        match self.layout {
            Layout::GeneralAdmission { .. } => SectionKind::GeneralAdmission,
            Layout::Reserved { .. } => SectionKind::Reserved,
        }
    }

    /// Validates the spec; `index` names the section in the error (`sections[2].…`).
    pub fn validate(&self, index: usize) -> Result<(), Rejection> {
        let field = |f: &str| format!("sections[{index}].{f}");
        check_plain_id(&field("section_id"), self.section_id.as_str(), ID_LEN_MAX)?;
        if self.name.len() > 256 {
            return Err(Rejection::invalid(&field("name"), "at most 256 bytes"));
        }
        if self.price_cents > 100_000_000 {
            return Err(Rejection::invalid(
                &field("price_cents"),
                "at most 100000000 (one million in whole units)",
            ));
        }
        match &self.layout {
            Layout::GeneralAdmission { capacity } => {
                if *capacity == 0 || *capacity > SECTION_CAPACITY_MAX {
                    return Err(Rejection::invalid(
                        &field("general_admission_capacity"),
                        format!("must be 1 to {SECTION_CAPACITY_MAX}"),
                    ));
                }
            }
            Layout::Reserved { rows } => {
                if rows.is_empty() || rows.len() > ROWS_PER_SECTION_MAX {
                    return Err(Rejection::invalid(
                        &field("reserved.rows"),
                        format!("must have 1 to {ROWS_PER_SECTION_MAX} rows"),
                    ));
                }
                let mut labels = std::collections::HashSet::new();
                for (r, row) in rows.iter().enumerate() {
                    let rf = field(&format!("reserved.rows[{r}]"));
                    check_plain_id(&format!("{rf}.label"), &row.label, ROW_LABEL_LEN_MAX)?;
                    if !labels.insert(row.label.as_str()) {
                        return Err(Rejection::invalid(
                            &format!("{rf}.label"),
                            "row labels must be unique within a section",
                        ));
                    }
                    if row.seat_count == 0 || row.seat_count > SEATS_PER_ROW_MAX {
                        return Err(Rejection::invalid(
                            &format!("{rf}.seat_count"),
                            format!("must be 1 to {SEATS_PER_ROW_MAX}"),
                        ));
                    }
                }
                if self.capacity() > SECTION_CAPACITY_MAX {
                    return Err(Rejection::invalid(
                        &field("reserved.rows"),
                        format!("at most {SECTION_CAPACITY_MAX} seats in one section"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Everything needed to create an event. Zero values mean the documented defaults
/// (see [`EventSpec::with_defaults`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSpec {
    /// The event id; `None` lets the engine generate one.
    pub event_id: Option<EventId>,
    /// Display name.
    pub name: String,
    /// The sections, at least one.
    pub sections: Vec<SectionSpec>,
    /// How long a hold lasts before it expires (0: 600 s).
    pub hold_ttl_ms: u64,
    /// Places one user may hold or own for the event (0: 4).
    pub per_user_limit: u32,
    /// Waiting-room admissions per second (0: 500).
    pub admit_rate_per_second: u32,
    /// How long an admitted fan may book (0: 120 s).
    pub admission_window_ms: u64,
    /// When the sale opens, ms since the Unix epoch (0: open now).
    pub sale_opens_at_ms: u64,
}

/// Default hold TTL: ten minutes, as the seeds ask.
pub const HOLD_TTL_MS_DEFAULT: u64 = 600_000;
/// Default per-user limit per event.
pub const PER_USER_LIMIT_DEFAULT: u32 = 4;
/// Default admission rate of the waiting room.
pub const ADMIT_RATE_PER_SECOND_DEFAULT: u32 = 500;
/// Default admission window.
pub const ADMISSION_WINDOW_MS_DEFAULT: u64 = 120_000;

impl EventSpec {
    /// Replaces zero values by the documented defaults.
    pub fn with_defaults(mut self) -> EventSpec {
        if self.hold_ttl_ms == 0 {
            self.hold_ttl_ms = HOLD_TTL_MS_DEFAULT;
        }
        if self.per_user_limit == 0 {
            self.per_user_limit = PER_USER_LIMIT_DEFAULT;
        }
        if self.admit_rate_per_second == 0 {
            self.admit_rate_per_second = ADMIT_RATE_PER_SECOND_DEFAULT;
        }
        if self.admission_window_ms == 0 {
            self.admission_window_ms = ADMISSION_WINDOW_MS_DEFAULT;
        }
        self
    }

    /// Validates a spec (after defaults were applied).
    pub fn validate(&self) -> Result<(), Rejection> {
        if let Some(id) = &self.event_id {
            check_plain_id("event_id", id.as_str(), ID_LEN_MAX)?;
        }
        if self.name.len() > 256 {
            return Err(Rejection::invalid("name", "at most 256 bytes"));
        }
        if self.sections.is_empty() || self.sections.len() > SECTIONS_PER_EVENT_MAX {
            return Err(Rejection::invalid(
                "sections",
                format!("must have 1 to {SECTIONS_PER_EVENT_MAX} sections"),
            ));
        }
        let mut ids = std::collections::HashSet::new();
        for (i, s) in self.sections.iter().enumerate() {
            s.validate(i)?;
            if !ids.insert(&s.section_id) {
                return Err(Rejection::invalid(
                    &format!("sections[{i}].section_id"),
                    "section ids must be unique within an event",
                ));
            }
        }
        if self.hold_ttl_ms > HOLD_TTL_MS_MAX {
            return Err(Rejection::invalid(
                "hold_ttl_seconds",
                "at most 86400 (one day)",
            ));
        }
        if self.per_user_limit > PER_USER_LIMIT_MAX {
            return Err(Rejection::invalid(
                "per_user_limit",
                format!("at most {PER_USER_LIMIT_MAX}"),
            ));
        }
        if self.admit_rate_per_second > 1_000_000 {
            return Err(Rejection::invalid(
                "admit_rate_per_second",
                "at most 1000000",
            ));
        }
        if self.admission_window_ms > HOLD_TTL_MS_MAX {
            return Err(Rejection::invalid(
                "admission_window_seconds",
                "at most 86400 (one day)",
            ));
        }
        Ok(())
    }
}

/// What a hold asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Selection {
    /// These exact seats of a reserved section, all or none.
    Seats(Vec<SeatId>),
    /// `quantity` places chosen by the engine in `section` (`None`: any section, in event order).
    /// Reserved sections give adjacent seats where a row has them; general admission a count.
    BestAvailable {
        /// Restrict to this section.
        section: Option<SectionId>,
        /// How many places.
        quantity: u32,
    },
}

/// A request to hold places.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldRequest {
    /// The event.
    pub event_id: EventId,
    /// Who holds.
    pub user_id: UserId,
    /// Empty for none; otherwise replays return the first answer.
    pub idempotency_key: String,
    /// What to hold.
    pub selection: Selection,
}

/// A request to confirm (pay for) a hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfirmRequest {
    /// The hold.
    pub hold_id: HoldId,
    /// Must be the holder.
    pub user_id: UserId,
    /// The payment reference recorded on the order.
    pub payment_ref: String,
    /// Empty for none; otherwise replays return the first answer.
    pub idempotency_key: String,
}

/// Life cycle of a hold. Only `Held` is active; the others are final.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HoldStatus {
    /// Places are held until `expires_at`.
    Held,
    /// Paid: the places are sold to the holder.
    Confirmed,
    /// Given back by the holder.
    Released,
    /// The TTL ran out before a confirm.
    Expired,
}

/// A hold as the engine reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldView {
    /// The hold id.
    pub hold_id: HoldId,
    /// The event.
    pub event_id: EventId,
    /// The holder.
    pub user_id: UserId,
    /// The section of every place in the hold.
    pub section_id: SectionId,
    /// The seats (empty for general admission).
    pub seat_ids: Vec<SeatId>,
    /// Number of places.
    pub quantity: u32,
    /// Status at the time of the answer.
    pub status: HoldStatus,
    /// When the hold was placed, ms since the Unix epoch.
    pub placed_at_ms: u64,
    /// When the hold expires, ms since the Unix epoch.
    pub expires_at_ms: u64,
}

/// One ticket of an order: one place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TicketView {
    /// `{order_id}.{n}`.
    pub ticket_id: String,
    /// The section.
    pub section_id: SectionId,
    /// The seat (`None` for general admission).
    pub seat_id: Option<SeatId>,
}

/// A confirmed order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderView {
    /// The order id.
    pub order_id: OrderId,
    /// The hold it confirmed.
    pub hold_id: HoldId,
    /// The event.
    pub event_id: EventId,
    /// The buyer.
    pub user_id: UserId,
    /// One per place.
    pub tickets: Vec<TicketView>,
    /// Sum of the places' prices.
    pub amount_cents: u64,
    /// The payment reference given to confirm.
    pub payment_ref: String,
    /// When the order was created, ms since the Unix epoch.
    pub created_at_ms: u64,
}

/// Status of one reserved seat in a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SeatStatus {
    /// Free to hold.
    Available,
    /// In an active hold.
    Held,
    /// Sold.
    Sold,
}

/// A section's availability, published by its actor after each batch. Never a promise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionSnapshot {
    /// The section.
    pub section_id: SectionId,
    /// All places.
    pub capacity: u32,
    /// Free places.
    pub available: u32,
    /// Places in active holds.
    pub held: u32,
    /// Places sold.
    pub sold: u32,
    /// Per seat in layout order (rows in order, seats from 1); empty for general admission.
    pub seats: Vec<SeatStatus>,
    /// When this was true, ms since the Unix epoch.
    pub as_of_ms: u64,
}

/// Summary of a section in an event view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionSummary {
    /// The spec the event was created with.
    pub spec: SectionSpec,
    /// Latest counts from the section's snapshot.
    pub capacity: u32,
    /// Free places.
    pub available: u32,
    /// Held places.
    pub held: u32,
    /// Sold places.
    pub sold: u32,
}

/// An event as the engine reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventView {
    /// The spec with defaults applied and the id set.
    pub spec: EventSpec,
    /// The event id.
    pub event_id: EventId,
    /// When the event was created, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Sections in the order given.
    pub sections: Vec<SectionSummary>,
}

/// The settings of an event that the hot paths (join, hold) read: no sections, so reading them
/// allocates nothing but the id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventTerms {
    /// The event id.
    pub event_id: EventId,
    /// How long a hold lasts, ms.
    pub hold_ttl_ms: u64,
    /// Places one user may hold or own.
    pub per_user_limit: u32,
    /// Waiting-room admissions per second.
    pub admit_rate_per_second: u32,
    /// How long an admitted fan may book, ms.
    pub admission_window_ms: u64,
    /// When the sale opens, ms since the Unix epoch.
    pub sale_opens_at_ms: u64,
}

/// A seat with its id, for seat maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeatView {
    /// The seat id.
    pub seat_id: SeatId,
    /// Row label.
    pub row: String,
    /// Number in the row, from 1.
    pub number: u32,
    /// Status in the snapshot.
    pub status: SeatStatus,
}

/// A section in a seat map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionSeats {
    /// The section.
    pub section_id: SectionId,
    /// All places.
    pub capacity: u32,
    /// Free places.
    pub available: u32,
    /// Held places.
    pub held: u32,
    /// Sold places.
    pub sold: u32,
    /// Seats, empty for general admission.
    pub seats: Vec<SeatView>,
    /// When this section's snapshot was taken.
    pub as_of_ms: u64,
}

/// A seat map of an event: the latest published snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeatMap {
    /// The event.
    pub event_id: EventId,
    /// The oldest `as_of` of the sections shown: the whole map was true at least then.
    pub as_of_ms: u64,
    /// Sections in event order.
    pub sections: Vec<SectionSeats>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_and_order_ids_carry_their_route() {
        let e = EventId::from("e9");
        let s = SectionId::from("orch-left");
        let h = HoldId::generate(&e, &s);
        assert_eq!(h.route(), Some((e.clone(), s.clone())));
        let o = OrderId::generate(&e, &s);
        assert_eq!(o.route(), Some((e, s)));
        assert_eq!(
            HoldId::from(o.as_str()).route(),
            None,
            "an order id is no hold id"
        );
        assert_eq!(HoldId::from("nonsense").route(), None);
        assert_eq!(HoldId::from("a.b.h").route(), None);
        assert_eq!(HoldId::from("a.b.hx.y").route(), None);
    }

    #[test]
    fn seat_ids_round_trip() {
        let s = SeatId::new(&SectionId::from("orch"), "AA", 12);
        assert_eq!(s.as_str(), "orch:AA:12");
        assert_eq!(s.parse(), Some(("orch", "AA", 12)));
        assert_eq!(SeatId::from("orch:AA").parse(), None);
        assert_eq!(SeatId::from("orch:AA:x").parse(), None);
        assert_eq!(SeatId::from("orch:AA:1:2").parse(), None);
    }

    #[test]
    fn event_spec_validation_names_the_field() {
        let spec = EventSpec {
            event_id: Some(EventId::from("bad id")),
            name: "x".into(),
            sections: vec![],
            hold_ttl_ms: 0,
            per_user_limit: 0,
            admit_rate_per_second: 0,
            admission_window_ms: 0,
            sale_opens_at_ms: 0,
        }
        .with_defaults();
        assert_eq!(spec.validate().unwrap_err().field(), Some("event_id"));
        let spec = EventSpec {
            event_id: None,
            sections: vec![SectionSpec {
                section_id: SectionId::from("a"),
                name: String::new(),
                price_cents: 1,
                layout: Layout::Reserved {
                    rows: vec![RowSpec {
                        label: "A".into(),
                        seat_count: 0,
                    }],
                },
            }],
            ..spec
        };
        assert_eq!(
            spec.validate().unwrap_err().field(),
            Some("sections[0].reserved.rows[0].seat_count")
        );
    }
}
