//! A fan's orders over HTTP: `GET /v1/users/{userId}/orders` (`ListOrders`), through the same
//! in-process call as gRPC ([`super::api::Backend`]).

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use boxoffice_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::api::{Backend, body, idempotency_key, json, query};
use super::problem::Refusal;
use super::types::Order;

/// `GET /v1/users/{userId}/orders`: which orders.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct OrdersQuery {
    /// Only this event's orders; empty: every event's.
    #[serde(default)]
    pub event_id: String,
    /// Most orders per page, 1 to 100 (0 or absent: 20).
    #[serde(default)]
    pub page_size: u32,
    /// The `nextPageToken` of the page before (for the same user and event).
    #[serde(default)]
    pub page_token: String,
}

/// A page of a user's orders, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrderPage {
    /// The orders, with their tickets' codes.
    pub orders: Vec<Order>,
    /// The next (older) page's token (empty: none left).
    pub next_page_token: String,
}

impl From<pb::ListOrdersResponse> for OrderPage {
    fn from(page: pb::ListOrdersResponse) -> OrderPage {
        OrderPage {
            orders: page.orders.into_iter().map(Order::from).collect(),
            next_page_token: page.next_page_token,
        }
    }
}

/// `POST /v1/orders/{orderId}/cancel`: who gives which tickets back.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CancelBody {
    /// The buyer.
    #[serde(default)]
    pub user_id: String,
    /// The tickets to give back (every ticket: the whole order).
    #[serde(default)]
    pub ticket_ids: Vec<String>,
    /// The idempotency key, if not in the `Idempotency-Key` header.
    #[serde(default)]
    pub idempotency_key: String,
}

/// What a cancellation did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cancellation {
    /// The order as it is now (the tickets left).
    pub order: Order,
    /// The tickets this call gave back.
    pub cancelled_ticket_ids: Vec<String>,
    /// What is refunded for them, cents.
    pub refund_cents: u64,
    /// The payment provider's refund id (empty: not made yet; the server's refund pass makes it).
    pub refund_id: String,
}

impl From<pb::CancelTicketsResponse> for Cancellation {
    fn from(r: pb::CancelTicketsResponse) -> Cancellation {
        Cancellation {
            order: Order::from(r.order.unwrap_or_default()),
            cancelled_ticket_ids: r.cancelled_ticket_ids,
            refund_cents: r.refund_cents,
            refund_id: r.refund_id,
        }
    }
}

/// Gives some or all tickets of an order back (`CancelTickets`): before the event's
/// cancellation deadline, to its buyer only; refunded at their price.
#[utoipa::path(post, path = "/v1/orders/{orderId}/cancel", tag = "booking",
    params(("orderId" = String, Path, description = "The order"),
        ("Idempotency-Key" = Option<String>, Header, description = "Recommended (or idempotencyKey in the body): a retry with the same key and tickets answers the first cancellation")),
    request_body = CancelBody,
    responses(
        (status = 200, description = "What was given back, and the order now", body = Cancellation),
        (status = "default", description = "A problem (RFC 9457): CANCELLATION_CLOSED, TICKET_NOT_ACTIVE, ORDER_NOT_FOUND, ...", body = super::problem::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn cancel_tickets(
    State(b): State<Backend>,
    Path(order_id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let r: CancelBody = body(raw)?;
    let idempotency_key = idempotency_key(&headers, r.idempotency_key)?;
    let done = b
        .call(
            &headers,
            pb::CancelTicketsRequest {
                order_id,
                user_id: r.user_id,
                ticket_ids: r.ticket_ids,
                idempotency_key,
            },
        )
        .await?;
    Ok(json(StatusCode::OK, &Cancellation::from(done)))
}

/// `POST /v1/orders/{orderId}/transfer`: who moves which tickets to whom.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TransferBody {
    /// The buyer.
    #[serde(default)]
    pub user_id: String,
    /// The tickets to move.
    #[serde(default)]
    pub ticket_ids: Vec<String>,
    /// The recipient.
    #[serde(default)]
    pub to_user_id: String,
    /// The idempotency key, if not in the `Idempotency-Key` header.
    #[serde(default)]
    pub idempotency_key: String,
}

/// What a transfer did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Transfer {
    /// The order the tickets left, as it is now.
    pub order: Order,
    /// The recipient's new order.
    pub received_order_id: String,
    /// The tickets moved, by their ids in `order`.
    pub transferred_ticket_ids: Vec<String>,
}

impl From<pb::TransferTicketsResponse> for Transfer {
    fn from(r: pb::TransferTicketsResponse) -> Transfer {
        Transfer {
            order: Order::from(r.order.unwrap_or_default()),
            received_order_id: r.received_order_id,
            transferred_ticket_ids: r.transferred_ticket_ids,
        }
    }
}

/// Moves some or all tickets of an order to another fan (`TransferTickets`): the recipient
/// gets a new order with new ticket ids and codes; the old codes are revoked.
#[utoipa::path(post, path = "/v1/orders/{orderId}/transfer", tag = "booking",
    params(("orderId" = String, Path, description = "The order"),
        ("Idempotency-Key" = Option<String>, Header, description = "Recommended (or idempotencyKey in the body): a retry with the same key and request answers the first transfer")),
    request_body = TransferBody,
    responses(
        (status = 200, description = "What was moved, and the order now", body = Transfer),
        (status = "default", description = "A problem (RFC 9457): TRANSFERS_DISABLED, USER_LIMIT, TICKET_NOT_ACTIVE, ORDER_NOT_FOUND, ...", body = super::problem::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn transfer_tickets(
    State(b): State<Backend>,
    Path(order_id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let r: TransferBody = body(raw)?;
    let idempotency_key = idempotency_key(&headers, r.idempotency_key)?;
    let done = b
        .call(
            &headers,
            pb::TransferTicketsRequest {
                order_id,
                user_id: r.user_id,
                ticket_ids: r.ticket_ids,
                to_user_id: r.to_user_id,
                idempotency_key,
            },
        )
        .await?;
    Ok(json(StatusCode::OK, &Transfer::from(done)))
}

/// An event's revocation list (`GetRevocationList`): as `boxoffice ticket verify
/// --revocations` reads it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevocationList {
    /// The event.
    pub event_id: String,
    /// When it was made, Unix ms.
    pub as_of_unix_ms: i64,
    /// The revoked tickets' ids, ascending.
    pub ticket_ids: Vec<String>,
    /// The key that signed it.
    pub kid: String,
    /// The list signed (what a gate trusts: docs/api.md, `GetRevocationList`).
    pub signed: String,
}

impl From<pb::RevocationList> for RevocationList {
    fn from(l: pb::RevocationList) -> RevocationList {
        RevocationList {
            event_id: l.event_id,
            as_of_unix_ms: l.as_of_unix_ms,
            ticket_ids: l.ticket_ids,
            kid: l.kid,
            signed: l.signed,
        }
    }
}

/// An event's revoked tickets, signed with the ticket key (`GetRevocationList`): a gate checks
/// codes against it offline.
#[utoipa::path(get, path = "/v1/events/{id}/revocations", tag = "events",
    params(("id" = String, Path, description = "The event")),
    responses(
        (status = 200, description = "The revocation list, signed", body = RevocationList),
        (status = "default", description = "A problem (RFC 9457)", body = super::problem::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn revocations(
    State(b): State<Backend>,
    Path(event_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    let list = b
        .call(&headers, pb::GetRevocationListRequest { event_id })
        .await?;
    Ok(json(StatusCode::OK, &RevocationList::from(list)))
}

/// A user's orders, newest first, a page at a time (`ListOrders`).
#[utoipa::path(get, path = "/v1/users/{userId}/orders", tag = "booking",
    params(("userId" = String, Path, description = "The buyer: only their own orders are listed"), OrdersQuery),
    responses(
        (status = 200, description = "A page of the user's orders", body = OrderPage),
        (status = "default", description = "A problem (RFC 9457)", body = super::problem::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn list_orders(
    State(b): State<Backend>,
    Path(user_id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<OrdersQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(q)?;
    let page = b
        .list(
            &headers,
            pb::ListOrdersRequest {
                user_id,
                event_id: q.event_id,
                page_size: q.page_size,
                page_token: q.page_token,
            },
        )
        .await?;
    Ok(json(StatusCode::OK, &OrderPage::from(page)))
}
