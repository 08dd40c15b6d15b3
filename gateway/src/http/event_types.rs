//! The JSON bodies of the HTTP API's events: creating one, changing its sale, and the event as
//! answered (the conventions of [`super::types`]).

use boxoffice_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::json::{rfc3339, short};

// ---- Events and seat maps ----------------------------------------------------------------------

/// A row of a reserved section.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RowSpec {
    /// Row label.
    pub label: String,
    /// Seats in the row, numbered from 1.
    pub seat_count: u32,
}

/// A section of a new event: general admission (`capacity`) or reserved (`rows`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SectionSpec {
    /// Section id (unique in the event).
    #[serde(default)]
    pub section_id: String,
    /// Display name.
    #[serde(default)]
    pub name: String,
    /// Price of one place, cents.
    #[serde(default)]
    pub price_cents: u64,
    /// General admission: the number of places.
    #[serde(default)]
    pub capacity: Option<u32>,
    /// Reserved seating: the rows.
    #[serde(default)]
    pub rows: Option<Vec<RowSpec>>,
    /// Prices by quantity, in order, before `priceCents` applies (docs/api.md, section 3.7).
    #[serde(default)]
    pub price_tiers: Vec<PriceTier>,
}

/// One price tier of a new section: its first (or next) `places` at `priceCents`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriceTier {
    /// Places in the tier (at least 1).
    #[serde(default)]
    pub places: u32,
    /// Price of each, cents.
    #[serde(default)]
    pub price_cents: u64,
}

/// A price tier as it stands.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PriceTierStatus {
    /// Places in the tier.
    pub places: u32,
    /// Price of each, cents.
    pub price_cents: u64,
    /// Its places neither held nor sold now.
    pub remaining: u32,
}

/// The tiers of a section as the API shows them.
pub fn price_tiers(tiers: Vec<pb::PriceTierStatus>) -> Vec<PriceTierStatus> {
    tiers
        .into_iter()
        .map(|t| PriceTierStatus {
            places: t.places,
            price_cents: t.price_cents,
            remaining: t.remaining,
        })
        .collect()
}

/// `POST /v1/events` (admin key): the `CreateEvent` fields, camelCase.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateEventBody {
    /// Event id (empty: the server makes one).
    #[serde(default)]
    pub event_id: String,
    /// Display name.
    #[serde(default)]
    pub name: String,
    /// The sections.
    #[serde(default)]
    pub sections: Vec<SectionSpec>,
    /// Hold TTL, seconds (0: 600).
    #[serde(default)]
    pub hold_ttl_seconds: u32,
    /// Places a fan may hold and own (0: 4).
    #[serde(default)]
    pub per_user_limit: u32,
    /// Fans admitted per second (0: 500).
    #[serde(default)]
    pub admit_rate_per_second: u32,
    /// How long an admission lasts, seconds (0: 120).
    #[serde(default)]
    pub admission_window_seconds: u32,
    /// When the sale opens, Unix ms (0: now).
    #[serde(default)]
    pub sale_opens_at_unix_ms: i64,
    /// Proof of work before joining, leading zero bits (0: none).
    #[serde(default)]
    pub join_pow_difficulty_bits: u32,
    /// Until when fans may give tickets back, Unix ms (0: no cancellations).
    #[serde(default)]
    pub cancellation_deadline_unix_ms: i64,
    /// True: fans may not move tickets to other fans.
    #[serde(default)]
    pub transfers_disabled: bool,
    /// The sections that sell only to holders of an access code during the presale.
    #[serde(default)]
    pub presale_section_ids: Vec<String>,
    /// When the presale ends, Unix ms (0: never).
    #[serde(default)]
    pub presale_ends_at_unix_ms: i64,
    /// The access codes (kept as digests only).
    #[serde(default)]
    pub access_codes: Vec<AccessCodeSpec>,
    /// The idempotency key, if not in the `Idempotency-Key` header.
    #[serde(default)]
    pub idempotency_key: String,
}

/// One presale access code of `POST /v1/events` (`AccessCode`).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccessCodeSpec {
    /// The code: 8 to 64 characters of [A-Za-z0-9_-].
    #[serde(default)]
    pub code: String,
    /// Places that may be held under it in all, 1 to 1,000,000.
    #[serde(default)]
    pub max_uses: u32,
    /// From when it is valid, Unix ms (0: from creation).
    #[serde(default)]
    pub valid_from_unix_ms: i64,
    /// Until when it is valid (exclusive), Unix ms (0: no end).
    #[serde(default)]
    pub valid_until_unix_ms: i64,
    /// The presale sections it unlocks (empty: all of them).
    #[serde(default)]
    pub section_ids: Vec<String>,
}

/// An access code as an event shows it to admin keys (`AccessCodeUsage`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessCodeUsage {
    /// The first 12 hex digits of the code's SHA-256 digest.
    pub code_id: String,
    /// As created.
    pub max_uses: u32,
    /// Places held or sold under it now.
    pub uses: u32,
    /// As created (0: from creation).
    pub valid_from_unix_ms: i64,
    /// As created (0: no end).
    pub valid_until_unix_ms: i64,
    /// As created (empty: every presale section).
    pub section_ids: Vec<String>,
}

/// `POST /v1/events/{id}/sale`: what to change (`UpdateSale`); absent fields stay as they are.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateSaleBody {
    /// The new state: `OPEN`, `PAUSED`, `QUEUE_ALL` or `ENDED` (absent: unchanged).
    #[serde(default)]
    pub state: Option<String>,
    /// Fans admitted per second, 0 to 1,000,000.
    #[serde(default)]
    pub admit_rate_per_second: Option<i64>,
    /// Lifetime of holds placed from now on, seconds, 1 to 86,400.
    #[serde(default)]
    pub hold_ttl_seconds: Option<i64>,
    /// Places one fan may hold or own, 1 to 100 (lowering it takes nothing away).
    #[serde(default)]
    pub per_user_limit: Option<i64>,
    /// Seconds after a fan's hold expired before that fan may hold again, 0 to 86,400.
    #[serde(default)]
    pub hold_cooldown_seconds: Option<i64>,
    /// The idempotency key, if not in the `Idempotency-Key` header.
    #[serde(default)]
    pub idempotency_key: String,
}

impl UpdateSaleBody {
    /// The gRPC request for `event_id` (with the key the caller chose); a state that is not one
    /// of the four is `INVALID_REQUEST` (field `state`).
    pub fn into_request(
        self,
        event_id: String,
        idempotency_key: String,
    ) -> Result<pb::UpdateSaleRequest, super::problem::Refusal> {
        let state = match self.state.as_deref() {
            None => pb::SaleState::Unspecified,
            Some(name) => pb::SaleState::from_str_name(&format!("SALE_STATE_{name}"))
                .filter(|s| *s != pb::SaleState::Unspecified)
                .ok_or_else(|| {
                    super::problem::Refusal::invalid(
                        "state",
                        "one of OPEN, PAUSED, QUEUE_ALL, ENDED",
                    )
                })?,
        };
        Ok(pb::UpdateSaleRequest {
            event_id,
            state: state as i32,
            admit_rate_per_second: self.admit_rate_per_second,
            hold_ttl_seconds: self.hold_ttl_seconds,
            per_user_limit: self.per_user_limit,
            hold_cooldown_seconds: self.hold_cooldown_seconds,
            idempotency_key,
        })
    }
}

impl CreateEventBody {
    /// The gRPC request (with the key the caller chose).
    pub fn into_request(self, idempotency_key: String) -> pb::CreateEventRequest {
        pb::CreateEventRequest {
            event_id: self.event_id,
            name: self.name,
            sections: self
                .sections
                .into_iter()
                .map(|s| pb::SectionSpec {
                    section_id: s.section_id,
                    name: s.name,
                    price_cents: s.price_cents,
                    price_tiers: s
                        .price_tiers
                        .into_iter()
                        .map(|t| pb::PriceTier {
                            places: t.places,
                            price_cents: t.price_cents,
                        })
                        .collect(),
                    layout: match (s.capacity, s.rows) {
                        (_, Some(rows)) => {
                            Some(pb::section_spec::Layout::Reserved(pb::ReservedLayout {
                                rows: rows
                                    .into_iter()
                                    .map(|r| pb::RowSpec {
                                        label: r.label,
                                        seat_count: r.seat_count,
                                    })
                                    .collect(),
                            }))
                        }
                        (Some(c), None) => {
                            Some(pb::section_spec::Layout::GeneralAdmissionCapacity(c))
                        }
                        (None, None) => None,
                    },
                })
                .collect(),
            hold_ttl_seconds: self.hold_ttl_seconds,
            per_user_limit: self.per_user_limit,
            admit_rate_per_second: self.admit_rate_per_second,
            admission_window_seconds: self.admission_window_seconds,
            sale_opens_at_unix_ms: self.sale_opens_at_unix_ms,
            idempotency_key,
            join_pow_difficulty_bits: self.join_pow_difficulty_bits,
            cancellation_deadline_unix_ms: self.cancellation_deadline_unix_ms,
            transfers_disabled: self.transfers_disabled,
            presale_section_ids: self.presale_section_ids,
            presale_ends_at_unix_ms: self.presale_ends_at_unix_ms,
            access_codes: self
                .access_codes
                .into_iter()
                .map(|c| pb::AccessCode {
                    code: c.code,
                    max_uses: c.max_uses,
                    valid_from_unix_ms: c.valid_from_unix_ms,
                    valid_until_unix_ms: c.valid_until_unix_ms,
                    section_ids: c.section_ids,
                })
                .collect(),
        }
    }
}

/// A section of an event, with its latest counts.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SectionSummary {
    /// Section id.
    pub section_id: String,
    /// Display name.
    pub name: String,
    /// `GENERAL_ADMISSION` or `RESERVED`.
    pub kind: String,
    /// All places.
    pub capacity: u32,
    /// Free places (never a promise: holding is).
    pub available: u32,
    /// Held places.
    pub held: u32,
    /// Sold places.
    pub sold: u32,
    /// Price of one place past the price tiers (of every place without tiers), cents.
    pub price_cents: u64,
    /// Whether a hold here needs an access code now (a presale section).
    pub access_code_required: bool,
    /// The price tiers as they stand (empty: none).
    pub price_tiers: Vec<PriceTierStatus>,
    /// The price the next place held here would cost, cents.
    pub next_price_cents: u64,
}

/// An event.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Event id.
    pub event_id: String,
    /// Display name.
    pub name: String,
    /// `SCHEDULED`, `ON_SALE` or `CLOSED`.
    pub state: String,
    /// Its sections.
    pub sections: Vec<SectionSummary>,
    /// Hold TTL, seconds.
    pub hold_ttl_seconds: u32,
    /// Places a fan may hold and own.
    pub per_user_limit: u32,
    /// Fans admitted per second.
    pub admit_rate_per_second: u32,
    /// How long an admission lasts, seconds.
    pub admission_window_seconds: u32,
    /// When the sale opens (RFC 3339).
    pub sale_opens_at: String,
    /// The same, Unix ms.
    pub sale_opens_at_unix_ms: i64,
    /// Proof of work before joining, bits (0: none).
    pub join_pow_difficulty_bits: u32,
    /// Where an operator has set the sale: `OPEN`, `PAUSED`, `QUEUE_ALL` or `ENDED`.
    pub sale_state: String,
    /// When `saleState` last changed, Unix ms (the creation time until it did).
    pub sale_state_changed_at_unix_ms: i64,
    /// When `admitRatePerSecond` last changed, Unix ms (the creation time until it did).
    pub admit_rate_changed_at_unix_ms: i64,
    /// When `holdTtlSeconds`, `perUserLimit` or `holdCooldownSeconds` last changed, Unix ms
    /// (creation until one did).
    pub terms_changed_at_unix_ms: i64,
    /// Seconds after a fan's hold expired before that fan may hold again (0: none).
    pub hold_cooldown_seconds: u32,
    /// Until when fans may give tickets back, Unix ms (0: no cancellations).
    pub cancellation_deadline_unix_ms: i64,
    /// Whether fans may not move tickets to other fans.
    pub transfers_disabled: bool,
    /// The sections that need an access code during the presale.
    pub presale_section_ids: Vec<String>,
    /// When the presale ends, Unix ms (0: never).
    pub presale_ends_at_unix_ms: i64,
    /// Each access code with its uses now: to admin keys only (empty for others).
    pub access_codes: Vec<AccessCodeUsage>,
}

impl From<pb::Event> for Event {
    fn from(e: pb::Event) -> Event {
        Event {
            sale_state: short(e.sale_state().as_str_name(), "SALE_STATE_"),
            sale_state_changed_at_unix_ms: e.sale_state_changed_at_unix_ms,
            admit_rate_changed_at_unix_ms: e.admit_rate_changed_at_unix_ms,
            terms_changed_at_unix_ms: e.terms_changed_at_unix_ms,
            hold_cooldown_seconds: e.hold_cooldown_seconds,
            state: short(e.state().as_str_name(), "EVENT_STATE_"),
            sale_opens_at: rfc3339(e.sale_opens_at_unix_ms),
            sections: e
                .sections
                .into_iter()
                .map(|s| SectionSummary {
                    kind: short(s.kind().as_str_name(), "SECTION_KIND_"),
                    section_id: s.section_id,
                    name: s.name,
                    capacity: s.capacity,
                    available: s.available,
                    held: s.held,
                    sold: s.sold,
                    price_cents: s.price_cents,
                    access_code_required: s.access_code_required,
                    price_tiers: price_tiers(s.price_tiers),
                    next_price_cents: s.next_price_cents,
                })
                .collect(),
            access_codes: e
                .access_codes
                .into_iter()
                .map(|c| AccessCodeUsage {
                    code_id: c.code_id,
                    max_uses: c.max_uses,
                    uses: c.uses,
                    valid_from_unix_ms: c.valid_from_unix_ms,
                    valid_until_unix_ms: c.valid_until_unix_ms,
                    section_ids: c.section_ids,
                })
                .collect(),
            presale_section_ids: e.presale_section_ids,
            presale_ends_at_unix_ms: e.presale_ends_at_unix_ms,
            event_id: e.event_id,
            name: e.name,
            hold_ttl_seconds: e.hold_ttl_seconds,
            per_user_limit: e.per_user_limit,
            admit_rate_per_second: e.admit_rate_per_second,
            admission_window_seconds: e.admission_window_seconds,
            sale_opens_at_unix_ms: e.sale_opens_at_unix_ms,
            join_pow_difficulty_bits: e.join_pow_difficulty_bits,
            cancellation_deadline_unix_ms: e.cancellation_deadline_unix_ms,
            transfers_disabled: e.transfers_disabled,
        }
    }
}

/// `GET /v1/events`: a page.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Events per page (0: 50).
    #[serde(default)]
    pub page_size: u32,
    /// The `nextPageToken` of the page before.
    #[serde(default)]
    pub page_token: String,
}

/// A page of events, in id order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventPage {
    /// The events.
    pub events: Vec<Event>,
    /// The next page's token (empty: none left).
    pub next_page_token: String,
}

impl From<pb::ListEventsResponse> for EventPage {
    fn from(page: pb::ListEventsResponse) -> EventPage {
        EventPage {
            events: page.events.into_iter().map(Event::from).collect(),
            next_page_token: page.next_page_token,
        }
    }
}
