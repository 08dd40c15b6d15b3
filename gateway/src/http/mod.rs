//! The HTTP/JSON face of the server (`serve --http-listen`, on by default in `boxoffice demo`):
//! the seeds' REST paths over the same services as gRPC ([`api`]), errors as RFC 9457 problem
//! details carrying the contract's reasons ([`problem`]), and the OpenAPI document generated
//! from the handlers and types at `GET /v1/openapi.json`.
//!
//! | path | gRPC |
//! |---|---|
//! | `GET /v1/events/{id}/queue-token` | `Join` |
//! | `GET /v1/events/{id}/join-challenge` | `GetJoinChallenge` |
//! | `GET /v1/queue/{eventId}/status` | `GetStatus` |
//! | `GET /v1/events/{id}/seats` | `GetSeatMap` (cached 5 s, `ETag`, `Last-Modified`, 304) |
//! | `POST /v1/events/{id}/book`, `POST /v1/holds` | `Hold` |
//! | `POST /v1/holds/{holdId}/confirm`, `POST /v1/orders` | `Confirm` |
//! | `POST /v1/holds/{holdId}/release` | `Release` (204) |
//! | `GET /v1/holds/{holdId}`, `GET /v1/orders/{orderId}` | `GetHold`, `GetOrder` |
//! | `GET /v1/users/{userId}/orders` | `ListOrders` |
//! | `POST /v1/orders/{orderId}/cancel` | `CancelTickets` |
//! | `POST /v1/orders/{orderId}/transfer` | `TransferTickets` |
//! | `GET /v1/events/{id}/revocations` | `GetRevocationList` |
//! | `POST /v1/events/{id}/holds/batch` | `HoldBatch` |
//! | `POST /v1/events/{id}/waitlist`, `GET /v1/waitlist/{entryId}` | `JoinWaitlist`, `GetWaitlistEntry` |
//! | `POST /v1/events`, `GET /v1/events`, `GET /v1/events/{id}` | `CreateEvent`, `ListEvents`, `GetEvent` |
//! | `POST /v1/events/{id}/sale`, `POST /v1/events/{id}/sale/{pause,resume,queue-all,end}` | `UpdateSale` (admin) |
//! | `GET /v1/changes?after=CURSOR&eventId=&follow=` (NDJSON, or server-sent events) | `WatchChanges` (admin or stream key) |
//! | `GET /v1/cluster`, `POST /v1/cluster/nodes`, `DELETE /v1/cluster/nodes/{nodeId}`, `POST /v1/cluster/nodes/{nodeId}/replace`, `POST /v1/cluster/ticket-keys/rotate`, `POST /v1/cluster/rebalance` | `GetClusterStatus`, `AddNode`, `RemoveNode`, `ReplaceNode`, `RotateTicketKey`, `Rebalance` (admin) |
//!
//! Beside them, on the same port: the live operations page `/ops` ([`ops`]), and whatever
//! routes the embedding program adds ([`crate::server::ServerConfig::http_routes`]: the demo's
//! race page).

pub mod api;
pub mod batch;
pub mod changes;
pub mod event_types;
pub mod json;
pub mod ops;
pub mod orders;
pub mod problem;
pub mod types;
pub mod waitlist;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

pub use api::Backend;

/// The OpenAPI document of the HTTP API, generated from the handlers' annotations.
#[derive(OpenApi)]
#[openapi(
    info(title = "boxoffice HTTP API", description = "The seeds' REST paths over the boxoffice.v1 services: the same API keys (Authorization: Bearer), validation, idempotency (Idempotency-Key) and reasons as gRPC (docs/api.md). Errors are RFC 9457 problem details whose `reason` is the contract's."),
    paths(
        api::queue_token, api::join_challenge, api::queue_status, api::seats, api::book,
        api::create_hold, api::confirm_hold, api::create_order, api::release_hold,
        api::get_hold, api::get_order, api::create_event, api::update_sale, api::sale_action,
        api::get_event, api::list_events, orders::list_orders, orders::cancel_tickets,
        orders::revocations, orders::transfer_tickets,
        batch::hold_batch,
        waitlist::join_waitlist, waitlist::get_waitlist_entry,
        api::cluster_status, api::add_node, api::remove_node, api::replace_node,
        api::rotate_ticket_key, api::rebalance, changes::changes,
    ),
    components(schemas(
        problem::Problem, types::QueueToken, types::JoinChallenge, types::QueueStatus,
        types::BookRequest, types::HoldBody, types::Hold, types::ConfirmBody, types::OrderBody,
        types::ReleaseBody, types::Ticket, types::Order, event_types::RowSpec, event_types::SectionSpec,
        event_types::CreateEventBody, event_types::UpdateSaleBody, event_types::SectionSummary, event_types::Event, event_types::EventPage, event_types::AccessCodeSpec, event_types::AccessCodeUsage,
        event_types::PriceTier, event_types::PriceTierStatus,
        types::Seat, types::SectionSeats, types::SeatMap, types::AddNodeBody,
        types::ClusterNode, types::ClusterGroup, types::ClusterStatus, types::TicketKey,
        changes::Change, changes::RefundChange, changes::PlacesWithdrawn, changes::WaitlistOffer,
        changes::SaleControls, changes::TicketsCancelled, orders::OrderPage, orders::CancelBody, orders::Cancellation,
        orders::RevocationList, orders::TransferBody, orders::Transfer,
        changes::TicketsTransferred, batch::BatchItemBody, batch::HoldBatchBody,
        batch::BatchResult, batch::HoldBatchAnswer, waitlist::JoinWaitlistBody,
        waitlist::WaitlistEntry,
    )),
    modifiers(&BearerAuth),
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API key of the server (client scope; admin for POST /v1/events, POST /v1/events/{id}/sale and /v1/cluster; admin or stream for GET /v1/changes)",
                    ))
                    .build(),
            ),
        );
    }
}

/// The OpenAPI document, as served.
pub fn openapi_json() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// Every path of the API over `backend`, the operations page, and `extra`.
pub fn router(backend: Backend, extra: Option<Router>) -> Router {
    let openapi = openapi_json();
    Router::new()
        .route("/v1/events", post(api::create_event).get(api::list_events))
        .route("/v1/events/{id}", get(api::get_event))
        .route("/v1/events/{id}/sale", post(api::update_sale))
        .route("/v1/events/{id}/sale/{action}", post(api::sale_action))
        .route("/v1/events/{id}/queue-token", get(api::queue_token))
        .route("/v1/events/{id}/join-challenge", get(api::join_challenge))
        .route("/v1/events/{id}/seats", get(api::seats))
        .route("/v1/events/{id}/book", post(api::book))
        .route("/v1/queue/{event_id}/status", get(api::queue_status))
        .route("/v1/holds", post(api::create_hold))
        .route("/v1/holds/{hold_id}", get(api::get_hold))
        .route("/v1/holds/{hold_id}/confirm", post(api::confirm_hold))
        .route("/v1/holds/{hold_id}/release", post(api::release_hold))
        .route("/v1/orders", post(api::create_order))
        .route("/v1/orders/{order_id}", get(api::get_order))
        .route("/v1/changes", get(changes::changes))
        .route("/v1/cluster", get(api::cluster_status))
        .route("/v1/cluster/nodes", post(api::add_node))
        .route(
            "/v1/cluster/nodes/{node_id}",
            axum::routing::delete(api::remove_node),
        )
        .route(
            "/v1/cluster/nodes/{node_id}/replace",
            post(api::replace_node),
        )
        .route(
            "/v1/cluster/ticket-keys/rotate",
            post(api::rotate_ticket_key),
        )
        .route("/v1/cluster/rebalance", post(api::rebalance))
        .route(
            "/v1/openapi.json",
            get(move || {
                let body = openapi.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        body,
                    )
                }
            }),
        )
        .fallback(|| async {
            problem::Problem {
                kind: "about:blank".into(),
                title: "Not Found".into(),
                status: 404,
                detail: "no such path: see /v1/openapi.json".into(),
                reason: None,
                grpc_code: "UNIMPLEMENTED".into(),
                metadata: Default::default(),
                field: None,
                retry_after_ms: None,
            }
        })
        .route("/ops", get(ops::page))
        .route("/ops/stats", get(ops::stats))
        .merge(after_the_seeds())
        .layer(DefaultBodyLimit::max(crate::limits::MESSAGE_BYTES_MAX))
        .layer(axum::middleware::from_fn_with_state(
            backend.clone(),
            traced,
        ))
        .with_state(backend)
        .merge(extra.unwrap_or_default())
}

/// Runs an HTTP API call in its span ([`crate::trace::http_span`]), with its answer's status.
async fn traced(
    axum::extract::State(backend): axum::extract::State<Backend>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use tracing::Instrument;
    let route = req.extensions().get::<axum::extract::MatchedPath>();
    let span = crate::trace::http_span(
        req.method(),
        route.map(axum::extract::MatchedPath::as_str),
        req.headers(),
        || backend.knows_caller(req.headers()),
    );
    let res = next.run(req).instrument(span.clone()).await;
    span.record("http.response.status_code", res.status().as_u16());
    res
}

/// The paths beyond the seeds' REST paths: a fan's orders and their tickets given back, the
/// revocation list, batches of holds and the waitlist.
fn after_the_seeds() -> Router<Backend> {
    Router::new()
        .route("/v1/users/{user_id}/orders", get(orders::list_orders))
        .route("/v1/orders/{order_id}/cancel", post(orders::cancel_tickets))
        .route(
            "/v1/orders/{order_id}/transfer",
            post(orders::transfer_tickets),
        )
        .route("/v1/events/{id}/revocations", get(orders::revocations))
        .route("/v1/events/{id}/holds/batch", post(batch::hold_batch))
        .route("/v1/events/{id}/waitlist", post(waitlist::join_waitlist))
        .route("/v1/waitlist/{entry_id}", get(waitlist::get_waitlist_entry))
}

/// Serves `app` on `listener` until `shutdown` resolves (then finishes the requests in flight).
pub async fn serve<L>(
    listener: L,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
