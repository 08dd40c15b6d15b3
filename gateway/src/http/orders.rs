//! A fan's orders over HTTP: `GET /v1/users/{userId}/orders` (`ListOrders`), through the same
//! in-process call as gRPC ([`super::api::Backend`]).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use boxoffice_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::api::{Backend, json, query};
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
