//! Domain types: event and section specifications, requests, and the views the engine answers
//! with; and the validation of caller input (naming the field). Identifiers are in [`crate::ids`],
//! limits and defaults in [`crate::limits`].

use serde::{Deserialize, Serialize};

use crate::error::Rejection;
pub use crate::ids::*;
use crate::limits::*;
use crate::sale::{SaleControls, SaleState};

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
    /// Prices by quantity, in order, before `price_cents` applies ([`crate::prices`]; empty:
    /// every place at `price_cents`). Not part of the spec's own encoding: the catalog record
    /// carries them beside the spec ([`CatalogRecord::EventCreatedWithPrices`]).
    #[serde(skip)]
    pub price_tiers: Vec<crate::prices::PriceTier>,
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
        if self.price_cents > PRICE_CENTS_MAX {
            return Err(Rejection::invalid(
                &field("price_cents"),
                format!("at most {PRICE_CENTS_MAX} (one million in whole units)"),
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
        crate::prices::validate(
            &self.price_tiers,
            self.capacity(),
            &format!("sections[{index}]"),
        )
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
    /// Proof of work a waiting-room `Join` must carry, in leading zero bits (0: none; at most
    /// [`crate::limits::JOIN_POW_DIFFICULTY_BITS_MAX`]). Not part of the spec's own encoding:
    /// the catalog record carries it beside the spec ([`CatalogRecord::EventCreatedWithPow`]),
    /// so catalog records written before it existed still decode (as 0).
    #[serde(skip)]
    pub join_pow_difficulty_bits: u32,
    /// Until when its tickets may be given back (`CancelTickets`), ms since the Unix epoch (0:
    /// never). Not part of the spec's own encoding: the catalog record carries it beside the
    /// spec ([`CatalogRecord::EventCreatedWithTerms`]).
    #[serde(skip)]
    pub cancellation_deadline_ms: u64,
    /// Whether its tickets may not be moved to another fan (`TransferTickets`; false, the
    /// default: they may). Carried beside the spec as the deadline is.
    #[serde(skip)]
    pub transfers_disabled: bool,
    /// The presale: sections that require an access code, until when, and the codes (as
    /// digests). Carried beside the spec as the deadline is
    /// ([`CatalogRecord::EventCreatedWithPresale`]).
    #[serde(skip)]
    pub presale: crate::access::Presale,
}

impl EventSpec {
    /// The sale controls of the event this spec creates at `created_at_ms`: open, with the
    /// spec's settings (see [`crate::sale`]).
    pub fn sale_controls(&self, created_at_ms: u64) -> SaleControls {
        SaleControls {
            state: SaleState::Open,
            admit_rate_per_second: self.admit_rate_per_second,
            hold_ttl_ms: self.hold_ttl_ms,
            per_user_limit: self.per_user_limit,
            state_changed_at_ms: created_at_ms,
            rate_changed_at_ms: created_at_ms,
            terms_changed_at_ms: created_at_ms,
            hold_cooldown_ms: 0,
        }
    }

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
        if self.join_pow_difficulty_bits > JOIN_POW_DIFFICULTY_BITS_MAX {
            return Err(Rejection::invalid(
                "join_pow_difficulty_bits",
                format!("at most {JOIN_POW_DIFFICULTY_BITS_MAX}"),
            ));
        }
        let ids: Vec<SectionId> = self.sections.iter().map(|s| s.section_id.clone()).collect();
        self.presale.validate(&ids)
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
    /// The presale access code (empty: none); judged only where a section requires one
    /// ([`crate::access`]).
    pub access_code: String,
}

impl HoldRequest {
    /// Checks the request's caller fields (user id, then idempotency key): a request the engine
    /// takes without checking them again ([`crate::Engine::hold_checked`]). Its selection is
    /// the event's to judge, when it is placed.
    pub fn checked(self) -> Result<CheckedHold, Rejection> {
        let caller = Caller::check(self.user_id, self.idempotency_key)?;
        caller
            .hold(self.event_id, self.selection)
            .with_access_code(self.access_code)
    }
}

/// A hold's caller whose fields passed their checks: the user id and the idempotency key. For a
/// front that checks them before it has a selection (the contract's order), then makes the
/// [`CheckedHold`] with [`Caller::hold`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    user_id: UserId,
    idempotency_key: String,
}

impl Caller {
    /// Checks a user id, then an idempotency key.
    pub fn check(user_id: UserId, idempotency_key: String) -> Result<Caller, Rejection> {
        check_user_id(&user_id)?;
        check_idempotency_key(&idempotency_key)?;
        Ok(Caller {
            user_id,
            idempotency_key,
        })
    }

    /// The caller's user id.
    pub fn user_id(&self) -> &UserId {
        &self.user_id
    }

    /// This caller's hold of `selection` in `event_id`.
    pub fn hold(self, event_id: EventId, selection: Selection) -> CheckedHold {
        CheckedHold(HoldRequest {
            event_id,
            user_id: self.user_id,
            idempotency_key: self.idempotency_key,
            selection,
            access_code: String::new(),
        })
    }
}

/// A hold request whose caller fields passed their checks, so nothing checks them again: made
/// by [`HoldRequest::checked`] or [`Caller::hold`] only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedHold(HoldRequest);

impl CheckedHold {
    /// The request.
    pub fn request(&self) -> &HoldRequest {
        &self.0
    }

    /// The request, given back.
    pub fn into_request(self) -> HoldRequest {
        self.0
    }

    /// The same request with a presale access code (empty: none), checked
    /// ([`crate::access::check_code`]).
    pub fn with_access_code(mut self, code: String) -> Result<CheckedHold, Rejection> {
        if !code.is_empty() {
            crate::access::check_code("access_code", &code)?;
        }
        self.0.access_code = code;
        Ok(self)
    }
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
    /// Each place's price, cents, in `seat_ids` order, fixed when the hold was made
    /// ([`crate::prices`]). A view only, not in the encoding: every view is made by its section
    /// (a keyed hold's answer too: recovery and a new leader rebuild the ledger's answers from
    /// the sections), and the change stream's from the hold's record.
    #[serde(skip)]
    pub place_prices_cents: Vec<u64>,
}

impl HoldView {
    /// What confirming the hold charges: the sum of its places' prices.
    pub fn amount_cents(&self) -> u64 {
        self.place_prices_cents.iter().sum()
    }
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
    /// What the place cost, cents (its tier's price; 0 in a received order). A view only: not
    /// in the encoding.
    #[serde(skip)]
    pub price_cents: u64,
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
    /// Refunded for tickets given back (`CancelTickets`), cents. A view only: not in the
    /// encoding (an order in the change stream is the order as created).
    #[serde(skip)]
    pub refunded_cents: u64,
    /// The ids of the tickets given back or moved to another fan (no longer in `tickets`). A
    /// view only, as above.
    #[serde(skip)]
    pub cancelled_ticket_ids: Vec<String>,
    /// A received order's: the order its tickets came from (`TransferTickets`; it cost its
    /// recipient nothing: `amount_cents` is 0). A view only, as above.
    #[serde(skip)]
    pub transferred_from: Option<OrderId>,
}

/// Where a page of a user's orders ends (`ListOrders`): the last order shown, by creation time
/// and id. The next page holds the orders before it, newest first.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OrderCursor {
    /// The order's creation time, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// The order's id.
    pub order_id: OrderId,
}

impl OrderCursor {
    /// The cursor just after `order` (the next page starts with the order before it).
    pub fn after(order: &OrderView) -> OrderCursor {
        OrderCursor {
            created_at_ms: order.created_at_ms,
            order_id: order.order_id.clone(),
        }
    }
}

/// A page of a user's orders, newest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrdersPage {
    /// The orders.
    pub orders: Vec<OrderView>,
    /// Whether older orders follow.
    pub more: bool,
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
    /// The change it shows: the sequence number of the last record of the section's stream it
    /// includes. Two snapshots with the same version show the same seats and counts; a change
    /// always publishes a higher one (also across a restart of the section's actor).
    pub version: u64,
    /// The price tiers as they stand (empty: none).
    pub price_tiers: Vec<crate::prices::TierStatus>,
    /// The price the next place would be held at, cents.
    pub next_price_cents: u64,
    /// When the section's actor published this version, Unix ms: the time of the change (for
    /// the version a section starts with, the time its actor started).
    pub changed_at_ms: u64,
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
    /// The price tiers as they stand (empty: none).
    pub price_tiers: Vec<crate::prices::TierStatus>,
    /// The price the next place would be held at, cents.
    pub next_price_cents: u64,
}

/// An event as the engine reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventView {
    /// The spec with defaults applied and the id set (its hold TTL, per-user limit and
    /// admission rate as created: `sale` has them as they are now).
    pub spec: EventSpec,
    /// The sale controls now.
    pub sale: SaleControls,
    /// The event id.
    pub event_id: EventId,
    /// When the event was created, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Sections in the order given.
    pub sections: Vec<SectionSummary>,
    /// The uses of each access code now, in the order of `spec.presale.codes`.
    pub access_code_uses: Vec<u32>,
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
    /// When this section's seats and counts were known true.
    pub as_of_ms: u64,
    /// The price tiers as they stand (empty: none).
    pub price_tiers: Vec<crate::prices::TierStatus>,
    /// The price the next place would be held at, cents.
    pub next_price_cents: u64,
}

/// A seat map of an event: the latest published snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeatMap {
    /// The event.
    pub event_id: EventId,
    /// When the whole map was known true (built from the latest snapshots: when it was read).
    pub as_of_ms: u64,
    /// Sections in event order.
    pub sections: Vec<SectionSeats>,
}

/// What the catalog stream records. Variants are only ever added at the end (bincode numbers
/// them), so records written before a variant existed still decode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum CatalogRecord {
    /// An event created before the join proof of work existed, or without one (its spec's
    /// `join_pow_difficulty_bits` is 0).
    EventCreated {
        spec: EventSpec,
        event_id: EventId,
        created_at_ms: u64,
    },
    /// An event asking for a proof of work before `Join`: the spec (whose own encoding skips
    /// the difficulty) and the difficulty beside it.
    EventCreatedWithPow {
        spec: EventSpec,
        event_id: EventId,
        created_at_ms: u64,
        join_pow_difficulty_bits: u32,
    },
    /// An operator changed an event's sale (`UpdateSale`): its controls after the change, and
    /// the call's idempotency key (empty: none) with its request's fingerprint.
    SaleUpdated {
        event_id: EventId,
        sale: SaleControls,
        key: String,
        fingerprint: u64,
    },
    /// An event with terms beyond the spec's own encoding: the proof of work (0: none), the
    /// cancellation deadline (0: none) and whether transfers are off (an event with neither a
    /// deadline nor transfers off is one of the records above).
    /// The last variant, so older records keep their variant indexes.
    EventCreatedWithTerms {
        spec: EventSpec,
        event_id: EventId,
        created_at_ms: u64,
        join_pow_difficulty_bits: u32,
        cancellation_deadline_ms: u64,
        transfers_disabled: bool,
    },
    /// An event with a presale (sections that require an access code), with every term beyond
    /// the spec's own encoding. After every older variant.
    EventCreatedWithPresale {
        spec: EventSpec,
        event_id: EventId,
        created_at_ms: u64,
        join_pow_difficulty_bits: u32,
        cancellation_deadline_ms: u64,
        transfers_disabled: bool,
        presale: crate::access::Presale,
    },
    /// An event with price tiers in a section: every term beyond the spec's own encoding, and
    /// each section's tiers in the spec's order. After every older variant.
    EventCreatedWithPrices {
        spec: EventSpec,
        event_id: EventId,
        created_at_ms: u64,
        join_pow_difficulty_bits: u32,
        cancellation_deadline_ms: u64,
        transfers_disabled: bool,
        presale: crate::access::Presale,
        price_tiers: Vec<Vec<crate::prices::PriceTier>>,
    },
}

impl CatalogRecord {
    /// The record of a new event: [`CatalogRecord::EventCreated`] when it asks for no proof of
    /// work (byte for byte what earlier builds wrote), else [`CatalogRecord::EventCreatedWithPow`].
    pub(crate) fn event_created(spec: EventSpec, event_id: EventId, created_at_ms: u64) -> Self {
        if spec.sections.iter().any(|s| !s.price_tiers.is_empty()) {
            return CatalogRecord::EventCreatedWithPrices {
                join_pow_difficulty_bits: spec.join_pow_difficulty_bits,
                cancellation_deadline_ms: spec.cancellation_deadline_ms,
                transfers_disabled: spec.transfers_disabled,
                presale: spec.presale.clone(),
                price_tiers: spec
                    .sections
                    .iter()
                    .map(|s| s.price_tiers.clone())
                    .collect(),
                spec,
                event_id,
                created_at_ms,
            };
        }
        if spec.presale != crate::access::Presale::default() {
            return CatalogRecord::EventCreatedWithPresale {
                join_pow_difficulty_bits: spec.join_pow_difficulty_bits,
                cancellation_deadline_ms: spec.cancellation_deadline_ms,
                transfers_disabled: spec.transfers_disabled,
                presale: spec.presale.clone(),
                spec,
                event_id,
                created_at_ms,
            };
        }
        if spec.cancellation_deadline_ms != 0 || spec.transfers_disabled {
            return CatalogRecord::EventCreatedWithTerms {
                join_pow_difficulty_bits: spec.join_pow_difficulty_bits,
                cancellation_deadline_ms: spec.cancellation_deadline_ms,
                transfers_disabled: spec.transfers_disabled,
                spec,
                event_id,
                created_at_ms,
            };
        }
        match spec.join_pow_difficulty_bits {
            0 => CatalogRecord::EventCreated {
                spec,
                event_id,
                created_at_ms,
            },
            bits => CatalogRecord::EventCreatedWithPow {
                spec,
                event_id,
                created_at_ms,
                join_pow_difficulty_bits: bits,
            },
        }
    }

    /// The event a record creates: its id, its whole spec, and when it was created. Only for a
    /// creation (a sale update creates nothing: see `LoggedEvent::fold`).
    pub(crate) fn into_event(self) -> (EventId, EventSpec, u64) {
        match self {
            CatalogRecord::SaleUpdated { .. } => unreachable!("a sale update creates no event"),
            CatalogRecord::EventCreated {
                spec,
                event_id,
                created_at_ms,
            } => (event_id, spec, created_at_ms),
            CatalogRecord::EventCreatedWithPow {
                mut spec,
                event_id,
                created_at_ms,
                join_pow_difficulty_bits,
            } => {
                spec.join_pow_difficulty_bits = join_pow_difficulty_bits;
                (event_id, spec, created_at_ms)
            }
            CatalogRecord::EventCreatedWithTerms {
                mut spec,
                event_id,
                created_at_ms,
                join_pow_difficulty_bits,
                cancellation_deadline_ms,
                transfers_disabled,
            } => {
                spec.join_pow_difficulty_bits = join_pow_difficulty_bits;
                spec.cancellation_deadline_ms = cancellation_deadline_ms;
                spec.transfers_disabled = transfers_disabled;
                (event_id, spec, created_at_ms)
            }
            CatalogRecord::EventCreatedWithPresale {
                mut spec,
                event_id,
                created_at_ms,
                join_pow_difficulty_bits,
                cancellation_deadline_ms,
                transfers_disabled,
                presale,
            } => {
                spec.join_pow_difficulty_bits = join_pow_difficulty_bits;
                spec.cancellation_deadline_ms = cancellation_deadline_ms;
                spec.transfers_disabled = transfers_disabled;
                spec.presale = presale;
                (event_id, spec, created_at_ms)
            }
            CatalogRecord::EventCreatedWithPrices {
                mut spec,
                event_id,
                created_at_ms,
                join_pow_difficulty_bits,
                cancellation_deadline_ms,
                transfers_disabled,
                presale,
                price_tiers,
            } => {
                spec.join_pow_difficulty_bits = join_pow_difficulty_bits;
                spec.cancellation_deadline_ms = cancellation_deadline_ms;
                spec.transfers_disabled = transfers_disabled;
                spec.presale = presale;
                for (s, tiers) in spec.sections.iter_mut().zip(price_tiers) {
                    s.price_tiers = tiers;
                }
                (event_id, spec, created_at_ms)
            }
        }
    }
}

/// Tests: event `id` with one general-admission section `ga` of `capacity` places at
/// `price_cents`, the defaults elsewhere (hold TTL, per-user limit, admission, opening now).
#[cfg(test)]
pub(crate) fn ga_event_spec(id: &str, name: &str, capacity: u32, price_cents: u64) -> EventSpec {
    EventSpec {
        event_id: Some(EventId::from(id)),
        name: name.into(),
        sections: vec![SectionSpec {
            section_id: SectionId::from("ga"),
            name: "GA".into(),
            price_cents,
            layout: Layout::GeneralAdmission { capacity },
            price_tiers: Vec::new(),
        }],
        hold_ttl_ms: 0,
        per_user_limit: 0,
        admit_rate_per_second: 0,
        admission_window_ms: 0,
        sale_opens_at_ms: 0,
        join_pow_difficulty_bits: 0,
        cancellation_deadline_ms: 0,
        transfers_disabled: false,
        presale: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_spec_validation_names_the_field() {
        let spec = EventSpec {
            sections: vec![],
            ..ga_event_spec("bad id", "x", 1, 0)
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
                price_tiers: Vec::new(),
            }],
            ..spec
        };
        assert_eq!(
            spec.validate().unwrap_err().field(),
            Some("sections[0].reserved.rows[0].seat_count")
        );
    }
    #[test]
    fn catalog_records_of_earlier_builds_decode_and_the_difficulty_round_trips() {
        // The catalog record exactly as builds before the join proof of work wrote it.
        #[derive(Serialize)]
        struct OldSpec {
            event_id: Option<EventId>,
            name: String,
            sections: Vec<SectionSpec>,
            hold_ttl_ms: u64,
            per_user_limit: u32,
            admit_rate_per_second: u32,
            admission_window_ms: u64,
            sale_opens_at_ms: u64,
        }
        #[derive(Serialize)]
        enum OldRecord {
            EventCreated {
                spec: OldSpec,
                event_id: EventId,
                created_at_ms: u64,
            },
        }
        let sections = vec![SectionSpec {
            section_id: SectionId::from("a"),
            name: "A".into(),
            price_cents: 100,
            layout: Layout::GeneralAdmission { capacity: 5 },
            price_tiers: Vec::new(),
        }];
        let old = OldRecord::EventCreated {
            spec: OldSpec {
                event_id: Some(EventId::from("e1")),
                name: "E".into(),
                sections: sections.clone(),
                hold_ttl_ms: 1_000,
                per_user_limit: 2,
                admit_rate_per_second: 3,
                admission_window_ms: 4_000,
                sale_opens_at_ms: 5,
            },
            event_id: EventId::from("e1"),
            created_at_ms: 6,
        };
        let old_bytes = crate::codec::encode(&old);
        let spec = EventSpec {
            event_id: Some(EventId::from("e1")),
            name: "E".into(),
            sections,
            hold_ttl_ms: 1_000,
            per_user_limit: 2,
            admit_rate_per_second: 3,
            admission_window_ms: 4_000,
            sale_opens_at_ms: 5,
            join_pow_difficulty_bits: 0,
            cancellation_deadline_ms: 0,
            transfers_disabled: false,
            presale: Default::default(),
        };
        let decoded: CatalogRecord = crate::codec::decode(&old_bytes).unwrap();
        assert_eq!(
            decoded.into_event(),
            (EventId::from("e1"), spec.clone(), 6),
            "an earlier build's record reads as an event without proof of work"
        );
        assert_eq!(
            crate::codec::encode(&CatalogRecord::event_created(
                spec.clone(),
                EventId::from("e1"),
                6
            )),
            old_bytes,
            "an event without proof of work is written as before, byte for byte"
        );
        let hard = EventSpec {
            join_pow_difficulty_bits: 20,
            ..spec
        };
        let bytes = crate::codec::encode(&CatalogRecord::event_created(
            hard.clone(),
            EventId::from("e1"),
            6,
        ));
        let back: CatalogRecord = crate::codec::decode(&bytes).unwrap();
        assert_eq!(back.into_event(), (EventId::from("e1"), hard.clone(), 6));
        assert_eq!(
            EventSpec {
                join_pow_difficulty_bits: 33,
                ..hard
            }
            .validate()
            .unwrap_err()
            .field(),
            Some("join_pow_difficulty_bits")
        );
    }
}
