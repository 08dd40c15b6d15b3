//! Protobuf <-> engine types. Requests are validated once, here at the edge: a bad field answers
//! `INVALID_ARGUMENT` naming it and never reaches an actor.

use boxoffice_engine::access::{AccessCode, Presale, check_code};
use boxoffice_engine::{
    EventId, EventSpec, HoldStatus, HoldView, Layout, OrderView, Rejection, RowSpec, SaleState,
    SaleUpdate, SeatId, SeatStatus, SectionId, SectionKind, SectionSpec, Selection,
};
use boxoffice_proto::v1 as pb;

use crate::limits::{FIELD_LEN_MAX, TOKEN_LEN_MAX};

fn invalid(field: &str, reason: &str) -> Rejection {
    Rejection::invalid(field, reason)
}

/// Converts a `CreateEventRequest` into an engine spec (zero values keep meaning "default").
pub fn event_spec(req: pb::CreateEventRequest) -> Result<EventSpec, Rejection> {
    if req.name.trim().is_empty() {
        return Err(invalid("name", "required"));
    }
    if req.sale_opens_at_unix_ms < 0 {
        return Err(invalid("sale_opens_at_unix_ms", "must not be negative"));
    }
    let mut sections = Vec::with_capacity(req.sections.len());
    for (i, s) in req.sections.into_iter().enumerate() {
        let layout = match s.layout {
            Some(pb::section_spec::Layout::GeneralAdmissionCapacity(capacity)) => {
                Layout::GeneralAdmission { capacity }
            }
            Some(pb::section_spec::Layout::Reserved(r)) => Layout::Reserved {
                rows: r
                    .rows
                    .into_iter()
                    .map(|row| RowSpec {
                        label: row.label,
                        seat_count: row.seat_count,
                    })
                    .collect(),
            },
            None => {
                return Err(invalid(
                    &format!("sections[{i}].layout"),
                    "set general_admission_capacity or reserved",
                ));
            }
        };
        sections.push(SectionSpec {
            section_id: SectionId(s.section_id),
            name: s.name,
            price_cents: s.price_cents,
            layout,
            price_tiers: s
                .price_tiers
                .into_iter()
                .map(|t| boxoffice_engine::prices::PriceTier {
                    places: t.places,
                    price_cents: t.price_cents,
                })
                .collect(),
        });
    }
    let presale = presale_of(
        req.presale_section_ids,
        req.presale_ends_at_unix_ms,
        req.access_codes,
    )?;
    Ok(EventSpec {
        event_id: (!req.event_id.is_empty()).then_some(EventId(req.event_id)),
        name: req.name,
        sections,
        hold_ttl_ms: u64::from(req.hold_ttl_seconds) * 1000,
        per_user_limit: req.per_user_limit,
        admit_rate_per_second: req.admit_rate_per_second,
        admission_window_ms: u64::from(req.admission_window_seconds) * 1000,
        sale_opens_at_ms: req.sale_opens_at_unix_ms.unsigned_abs(),
        join_pow_difficulty_bits: req.join_pow_difficulty_bits,
        cancellation_deadline_ms: u64::try_from(req.cancellation_deadline_unix_ms)
            .map_err(|_| invalid("cancellation_deadline_unix_ms", "a time after 1970"))?,
        transfers_disabled: req.transfers_disabled,
        presale,
    })
}

/// The presale of a `CreateEventRequest`: its sections, its end, its codes (each checked, then
/// only its digest kept). The engine checks the rest against the event's sections.
fn presale_of(
    section_ids: Vec<String>,
    ends_at_unix_ms: i64,
    codes: Vec<pb::AccessCode>,
) -> Result<Presale, Rejection> {
    let time = |field: &str, v: i64| {
        u64::try_from(v).map_err(|_| Rejection::invalid(field, "a time after 1970 (or 0)"))
    };
    let ends_at_ms = time("presale_ends_at_unix_ms", ends_at_unix_ms)?;
    let mut kept = Vec::with_capacity(codes.len());
    for (i, c) in codes.into_iter().enumerate() {
        let field = |f: &str| format!("access_codes[{i}].{f}");
        check_code(&field("code"), &c.code)?;
        kept.push(AccessCode::new(
            &c.code,
            c.max_uses,
            time(&field("valid_from_unix_ms"), c.valid_from_unix_ms)?,
            time(&field("valid_until_unix_ms"), c.valid_until_unix_ms)?,
            c.section_ids.into_iter().map(SectionId).collect(),
        ));
    }
    Ok(Presale {
        sections: section_ids.into_iter().map(SectionId).collect(),
        ends_at_ms,
        codes: kept,
    })
}

/// An `UpdateSale` request as the engine takes it: its event, its update, its key.
pub fn sale_update(
    req: pb::UpdateSaleRequest,
) -> Result<(boxoffice_engine::EventId, SaleUpdate, String), Rejection> {
    required("event_id", &req.event_id)?;
    let state = match pb::SaleState::try_from(req.state) {
        Ok(pb::SaleState::Unspecified) => None,
        Ok(pb::SaleState::Open) => Some(SaleState::Open),
        Ok(pb::SaleState::Paused) => Some(SaleState::Paused),
        Ok(pb::SaleState::QueueAll) => Some(SaleState::QueueAll),
        Ok(pb::SaleState::Ended) => Some(SaleState::Ended),
        Err(_) => return Err(invalid("state", "not a SaleState")),
    };
    boxoffice_engine::types::check_idempotency_key(&req.idempotency_key)?;
    Ok((
        boxoffice_engine::EventId(req.event_id),
        SaleUpdate {
            state,
            admit_rate_per_second: req.admit_rate_per_second,
            hold_ttl_seconds: req.hold_ttl_seconds,
            per_user_limit: req.per_user_limit,
            hold_cooldown_seconds: req.hold_cooldown_seconds,
        },
        req.idempotency_key,
    ))
}

/// A sale state as the API spells it.
pub fn sale_state(s: SaleState) -> pb::SaleState {
    match s {
        SaleState::Open => pb::SaleState::Open,
        SaleState::Paused => pb::SaleState::Paused,
        SaleState::QueueAll => pb::SaleState::QueueAll,
        SaleState::Ended => pb::SaleState::Ended,
    }
}

/// A required id field: non-empty and at most [`FIELD_LEN_MAX`] bytes.
pub fn required(field: &str, value: &str) -> Result<(), Rejection> {
    required_upto(field, value, FIELD_LEN_MAX)
}

/// A required token field: non-empty and at most [`TOKEN_LEN_MAX`] bytes (every token the server
/// signs fits: see [`crate::limits`]).
pub fn required_token(field: &str, value: &str) -> Result<(), Rejection> {
    required_upto(field, value, TOKEN_LEN_MAX)
}

fn required_upto(field: &str, value: &str, max: usize) -> Result<(), Rejection> {
    if value.is_empty() {
        return Err(invalid(field, "required"));
    }
    if value.len() > max {
        return Err(invalid(field, &format!("at most {max} bytes")));
    }
    Ok(())
}

/// The selection of a `HoldRequest`.
pub fn selection(sel: Option<pb::hold_request::Selection>) -> Result<Selection, Rejection> {
    match sel {
        None => Err(invalid("selection", "set seats or best_available")),
        Some(pb::hold_request::Selection::Seats(s)) => {
            if s.seat_ids.is_empty() {
                return Err(invalid("seats.seat_ids", "name at least one seat"));
            }
            if s.seat_ids.len() > 100 {
                return Err(invalid("seats.seat_ids", "at most 100 seats"));
            }
            for (i, id) in s.seat_ids.iter().enumerate() {
                if id.len() > 200 || SeatId(id.clone()).parse().is_none() {
                    return Err(invalid(
                        &format!("seats.seat_ids[{i}]"),
                        "a seat id is {section_id}:{row}:{number}, at most 200 bytes",
                    ));
                }
            }
            Ok(Selection::Seats(
                s.seat_ids.into_iter().map(SeatId).collect(),
            ))
        }
        Some(pb::hold_request::Selection::BestAvailable(b)) => {
            if b.quantity == 0 {
                return Err(invalid("best_available.quantity", "must be at least 1"));
            }
            if b.quantity > 100 {
                return Err(invalid("best_available.quantity", "at most 100"));
            }
            Ok(Selection::BestAvailable {
                section: (!b.section_id.is_empty()).then_some(SectionId(b.section_id)),
                quantity: b.quantity,
            })
        }
    }
}

/// Unix ms as the API's int64 fields carry them.
pub fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A hold as the API shows it.
pub fn hold(h: HoldView) -> pb::Hold {
    let amount_cents = h.amount_cents();
    pb::Hold {
        hold_id: h.hold_id.0,
        event_id: h.event_id.0,
        user_id: h.user_id.0,
        section_id: h.section_id.0,
        seat_ids: h.seat_ids.into_iter().map(|s| s.0).collect(),
        quantity: h.quantity,
        status: match h.status {
            HoldStatus::Held => pb::HoldStatus::Held,
            HoldStatus::Confirmed => pb::HoldStatus::Confirmed,
            HoldStatus::Released => pb::HoldStatus::Released,
            HoldStatus::Expired => pb::HoldStatus::Expired,
        } as i32,
        expires_at_unix_ms: ms(h.expires_at_ms),
        amount_cents,
        place_prices_cents: h.place_prices_cents,
    }
}

/// A section's price tiers as they stand, as the API shows them.
pub fn price_tiers(tiers: &[boxoffice_engine::prices::TierStatus]) -> Vec<pb::PriceTierStatus> {
    tiers
        .iter()
        .map(|t| pb::PriceTierStatus {
            places: t.places,
            price_cents: t.price_cents,
            remaining: t.remaining,
        })
        .collect()
}

/// An order as the API shows it, each ticket with its signed code (signed with the key of the
/// order's time; `Err` if this node's copy of its cluster's ring may be stale for it).
pub fn order(
    o: OrderView,
    tickets: &crate::signing::Signing,
) -> Result<pb::Order, crate::signing::RingStale> {
    let key = tickets.key_for(o.created_at_ms)?;
    let mut order = order_without_codes(o);
    for t in &mut order.tickets {
        t.code = key.sign(&crate::tickets::TicketClaims {
            event_id: order.event_id.clone(),
            section_id: t.section_id.clone(),
            seat_id: t.seat_id.clone(),
            order_id: order.order_id.clone(),
            ticket_id: t.ticket_id.clone(),
        });
    }
    Ok(order)
}

/// An order as the API shows it, its tickets without codes (the change stream's).
pub fn order_without_codes(o: OrderView) -> pb::Order {
    let refunded = o.tickets.is_empty() && !o.cancelled_ticket_ids.is_empty();
    pb::Order {
        hold_id: o.hold_id.0,
        user_id: o.user_id.0,
        tickets: o
            .tickets
            .into_iter()
            .map(|t| pb::Ticket {
                ticket_id: t.ticket_id,
                section_id: t.section_id.0,
                seat_id: t.seat_id.map(|s| s.0).unwrap_or_default(),
                code: String::new(),
                price_cents: t.price_cents,
            })
            .collect(),
        order_id: o.order_id.0,
        event_id: o.event_id.0,
        amount_cents: o.amount_cents,
        payment_id: if o.transferred_from.is_some() {
            String::new()
        } else {
            o.payment_ref
        },
        status: if refunded {
            pb::OrderStatus::Refunded
        } else {
            pb::OrderStatus::Confirmed
        } as i32,
        created_at_unix_ms: ms(o.created_at_ms),
        refunded_cents: o.refunded_cents,
        cancelled_ticket_ids: o.cancelled_ticket_ids,
        transferred_from_order_id: o.transferred_from.map(|f| f.0).unwrap_or_default(),
    }
}

/// A seat status as the API shows it.
pub fn seat_status(s: SeatStatus) -> i32 {
    (match s {
        SeatStatus::Available => pb::SeatStatus::Available,
        SeatStatus::Held => pb::SeatStatus::Held,
        SeatStatus::Sold => pb::SeatStatus::Sold,
    }) as i32
}

/// A section kind as the API shows it.
pub fn section_kind(k: SectionKind) -> i32 {
    (match k {
        SectionKind::GeneralAdmission => pb::SectionKind::GeneralAdmission,
        SectionKind::Reserved => pb::SectionKind::Reserved,
    }) as i32
}

/// A waitlist entry as the API shows it.
pub fn waitlist_entry(e: boxoffice_engine::WaitlistView) -> pb::WaitlistEntry {
    use boxoffice_engine::WaitlistState as S;
    pb::WaitlistEntry {
        entry_id: e.entry_id,
        event_id: e.event_id.0,
        user_id: e.user_id.0,
        position: e.position,
        state: (match e.state {
            S::Waiting => pb::WaitlistState::Waiting,
            S::Offered => pb::WaitlistState::Offered,
            S::Expired => pb::WaitlistState::Expired,
            S::Fulfilled => pb::WaitlistState::Fulfilled,
        }) as i32,
        offered_hold_id: e.offered_hold_id.map(|h| h.0).unwrap_or_default(),
    }
}

/// A `HoldBatch` item's selection as a `Hold`'s (the same two choices).
pub fn batch_selection(s: pb::hold_batch_item::Selection) -> pb::hold_request::Selection {
    match s {
        pb::hold_batch_item::Selection::Seats(s) => pb::hold_request::Selection::Seats(s),
        pb::hold_batch_item::Selection::BestAvailable(b) => {
            pb::hold_request::Selection::BestAvailable(b)
        }
    }
}

/// The answer to item `i` of a `HoldBatch`: its hold, or the status a `Hold` would have
/// answered, flattened (a field it names is the item's: `items[i].<field>`).
pub fn batch_result(
    i: usize,
    answer: Result<pb::Hold, crate::status::ApiError>,
) -> pb::HoldBatchResult {
    let e = match answer {
        Ok(hold) => {
            return pb::HoldBatchResult {
                result: Some(pb::hold_batch_result::Result::Hold(hold)),
            };
        }
        Err(e) => e,
    };
    // The parts its status would carry, as they are: nothing encoded to be read back.
    let parts = e.parts();
    let mut metadata = parts.metadata;
    if let Some(field) = metadata.get_mut("field") {
        *field = format!("items[{i}].{field}");
    }
    pb::HoldBatchResult {
        result: Some(pb::hold_batch_result::Result::Error(pb::ItemError {
            code: parts.code as i32,
            reason: parts.reason.unwrap_or_default().to_owned(),
            message: parts.message,
            metadata,
            retry_delay_ms: parts
                .retry_delay
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        })),
    }
}
