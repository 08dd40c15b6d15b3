//! `GET /v1/changes`: the change stream (`WatchChanges`) over HTTP, as NDJSON or server-sent
//! events, and its JSON bodies.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use boxoffice_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use tonic::Status;
use utoipa::{IntoParams, ToSchema};

use super::api::{Backend, query};
use super::event_types::Event;
use super::problem::{Problem, Refusal};
use super::types::{Hold, Order, short};

/// The change stream (`WatchChanges`, an admin or stream key): every change after `after`, one
/// JSON object a line (`application/x-ndjson`), or with `Accept: text/event-stream` one
/// server-sent event each (`id`: the cursor, `event`: the kind). A refused cursor is a problem
/// answered at once; an error after the first change ends the stream with a last line (or an
/// `error` event) holding the problem.
#[utoipa::path(get, path = "/v1/changes", tag = "changes",
    params(ChangesQuery),
    responses(
        (status = 200, description = "The changes, one JSON object a line (or server-sent events)", body = Change, content_type = "application/x-ndjson"),
        (status = "default", description = "A problem (RFC 9457): CURSOR_EXPIRED (with oldestCursor), CURSOR_INVALID", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn changes(
    State(b): State<Backend>,
    headers: HeaderMap,
    q: Result<Query<ChangesQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    use futures_util::StreamExt;
    let q = query(q)?;
    let sse = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    // A browser's EventSource reconnects to the same URL with the last id it saw: that wins.
    let last_event = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| sse && !v.is_empty());
    let req = pb::WatchChangesRequest {
        after_cursor: last_event.map_or(q.after, str::to_owned),
        event_id: q.event_id,
        follow: q.follow,
    };
    let rx = b.watch_changes(&headers, req).await?;
    let items = tokio_stream::wrappers::ReceiverStream::new(rx);
    if sse {
        use axum::response::sse::{Event, KeepAlive, Sse};
        let events = items.map(|r| {
            Ok::<_, std::convert::Infallible>(match r {
                Ok(c) => Event::default()
                    .id(c.cursor.clone())
                    .event(c.kind.clone())
                    .json_data(Change::from(c))
                    .unwrap_or_else(|_| Event::default().event("error")),
                Err(e) => Event::default()
                    .event("error")
                    .json_data(Problem::from_status(&Status::from(e)))
                    .unwrap_or_else(|_| Event::default().event("error")),
            })
        });
        return Ok(Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let lines = items.map(|r| {
        let mut line = match r {
            Ok(c) => serde_json::to_vec(&Change::from(c)),
            Err(e) => serde_json::to_vec(&Problem::from_status(&Status::from(e))),
        }
        .unwrap_or_default();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    let mut response = axum::body::Body::from_stream(lines).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(response)
}

/// One change of the change stream (`GET /v1/changes`, one JSON object a line, or one
/// server-sent event each). `kind` names which of the optional fields is set.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// Opaque: `after` (or `Last-Event-ID`) to resume after this change.
    pub cursor: String,
    /// The event changed.
    pub event_id: String,
    /// When the change was made, Unix ms.
    pub at_unix_ms: i64,
    /// `event_created`, `hold_placed`, `hold_released`, `hold_expired`, `order_created`,
    /// `refunded`, `places_withdrawn`, `waitlist_offered`, `sale_updated`, `tickets_cancelled`
    /// or `tickets_transferred`.
    pub kind: String,
    /// `event_created`: the event as created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<Event>,
    /// `hold_*`: the hold, its status after the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// `order_created`: the order, its tickets without codes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Order>,
    /// `refunded`: the refund.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refund: Option<RefundChange>,
    /// `places_withdrawn`: the section and how many places.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub places_withdrawn: Option<PlacesWithdrawn>,
    /// `waitlist_offered`: the entry and its hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waitlist_offer: Option<WaitlistOffer>,
    /// `sale_updated`: the sale's controls after the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sale: Option<SaleControls>,
    /// `tickets_cancelled`: the tickets given back, and the order after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tickets_cancelled: Option<TicketsCancelled>,
    /// `tickets_transferred`: the tickets moved, the order they left and the new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tickets_transferred: Option<TicketsTransferred>,
}

/// Tickets moved to another fan.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TicketsTransferred {
    /// The order they left, after it (no codes).
    pub from_order: Order,
    /// The recipient's new order (no codes).
    pub to_order: Order,
    /// The tickets moved, by their ids in `fromOrder`.
    pub ticket_ids: Vec<String>,
}

/// Tickets of an order given back.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TicketsCancelled {
    /// The order after it (the tickets left, without codes).
    pub order: Order,
    /// The tickets given back.
    pub ticket_ids: Vec<String>,
    /// Refunded for them, cents.
    pub refund_cents: u64,
    /// The refund's idempotency key with the payment provider.
    pub refund_key: String,
}

/// A refund of a payment kept without an order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefundChange {
    /// The payment refunded.
    pub payment_id: String,
    /// The hold it paid for.
    pub hold_id: String,
    /// Whose payment it was (empty: not known any more).
    pub user_id: String,
    /// Amount, cents.
    pub amount_cents: u64,
}

/// Places taken out of sale.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacesWithdrawn {
    /// The section.
    pub section_id: String,
    /// How many places.
    pub quantity: u32,
}

/// A waitlist entry offered places.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitlistOffer {
    /// The entry.
    pub entry_id: String,
    /// The hold placed in its fan's name.
    pub hold_id: String,
}

/// A sale's controls.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SaleControls {
    /// `OPEN`, `PAUSED`, `QUEUE_ALL` or `ENDED`.
    pub state: String,
    /// Fans admitted per second.
    pub admit_rate_per_second: u32,
    /// TTL of new holds, seconds.
    pub hold_ttl_seconds: u32,
    /// Places a fan may hold and own.
    pub per_user_limit: u32,
    /// Seconds after an expired hold before its fan may hold again (0: none).
    pub hold_cooldown_seconds: u32,
}

impl From<pb::Change> for Change {
    fn from(c: pb::Change) -> Change {
        Change {
            cursor: c.cursor,
            event_id: c.event_id,
            at_unix_ms: c.at_unix_ms,
            kind: c.kind,
            event: c.event_created.map(Event::from),
            hold: c.hold.map(Hold::from),
            order: c.order.map(Order::from),
            refund: c.refund.map(|r| RefundChange {
                payment_id: r.payment_id,
                hold_id: r.hold_id,
                user_id: r.user_id,
                amount_cents: r.amount_cents,
            }),
            places_withdrawn: c.places_withdrawn.map(|p| PlacesWithdrawn {
                section_id: p.section_id,
                quantity: p.quantity,
            }),
            waitlist_offer: c.waitlist_offer.map(|w| WaitlistOffer {
                entry_id: w.entry_id,
                hold_id: w.hold_id,
            }),
            sale: c.sale.map(|s| SaleControls {
                state: short(s.state().as_str_name(), "SALE_STATE_"),
                admit_rate_per_second: s.admit_rate_per_second,
                hold_ttl_seconds: s.hold_ttl_seconds,
                per_user_limit: s.per_user_limit,
                hold_cooldown_seconds: s.hold_cooldown_seconds,
            }),
            tickets_transferred: c.tickets_transferred.map(|t| TicketsTransferred {
                from_order: Order::from(t.from_order.unwrap_or_default()),
                to_order: Order::from(t.to_order.unwrap_or_default()),
                ticket_ids: t.ticket_ids,
            }),
            tickets_cancelled: c.tickets_cancelled.map(|t| TicketsCancelled {
                order: Order::from(t.order.unwrap_or_default()),
                ticket_ids: t.ticket_ids,
                refund_cents: t.refund_cents,
                refund_key: t.refund_key,
            }),
        }
    }
}

/// `GET /v1/changes`: where to start, which event, whether to follow.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct ChangesQuery {
    /// Resume after this cursor (a change's `cursor`; with server-sent events a
    /// `Last-Event-ID` header wins over it). Empty: from the oldest change kept; `0`: from the
    /// very first.
    #[serde(default)]
    pub after: String,
    /// Only this event's changes.
    #[serde(default)]
    pub event_id: String,
    /// Keep the response open and send changes as they are made.
    #[serde(default)]
    pub follow: bool,
}
