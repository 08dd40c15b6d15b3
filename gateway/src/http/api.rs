//! The seeds' REST paths over the `boxoffice.v1` services. Each handler turns its request into
//! the contract's request message, calls the services in process ([`Backend`], over
//! [`crate::local`]: the gate's API keys, shedding and metrics, the services' validation and
//! idempotency, and a cluster node's forwarding apply exactly as to a gRPC caller, through the
//! same code), and turns the answer into JSON, or its error into a problem
//! ([`super::problem`]).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use boxoffice_proto::v1 as pb;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use tonic::Status;

use crate::local::{Local, Unary};

use super::event_types::*;
use super::problem::{Problem, Refusal};
use super::types::*;

/// The server's services as the HTTP API calls them: in process ([`Local`]), through the same
/// gate, routing and handlers as a gRPC call, without a second gRPC call.
#[derive(Clone)]
pub struct Backend {
    local: Arc<Local>,
}

impl Backend {
    /// Calls through `local`.
    pub fn new(local: Arc<Local>) -> Backend {
        Backend { local }
    }

    /// Whether the caller presents a key of this server (`Authorization: Bearer`).
    pub(crate) fn knows_caller(&self, headers: &HeaderMap) -> bool {
        self.local.knows(authorization(headers))
    }

    /// Calls `req`'s RPC with the caller's API key (`Authorization: Bearer`).
    pub async fn call<R: Unary>(&self, headers: &HeaderMap, req: R) -> Result<R::Answer, Status> {
        self.local.call(authorization(headers), req).await
    }

    /// `WatchChanges`, with the caller's API key (see [`super::changes`]).
    pub(crate) async fn watch_changes(
        &self,
        headers: &HeaderMap,
        req: pb::WatchChangesRequest,
    ) -> Result<crate::local::ChangeReceiver, Status> {
        self.local.watch_changes(authorization(headers), req).await
    }

    /// A list call (`ListEvents`, `ListOrders`: every group's, merged, unless it names an
    /// event), with the caller's API key.
    pub async fn list<L>(&self, headers: &HeaderMap, req: L) -> Result<L::Answer, Status>
    where
        L: crate::lists::Listing + Unary<Answer = <L as crate::lists::Listing>::Page>,
    {
        self.local.list(authorization(headers), req).await
    }
}

impl Backend {
    /// A `ClusterService` call (`path`) made by `call`, with the caller's API key: the cluster's
    /// status it answers, as JSON.
    async fn cluster<F>(
        &self,
        headers: &HeaderMap,
        path: &'static str,
        call: impl FnOnce(crate::services::grpc::ClusterSvc) -> F + Send + 'static,
    ) -> Result<Response, Refusal>
    where
        F: std::future::Future<Output = Result<tonic::Response<pb::ClusterStatus>, Status>>
            + Send
            + 'static,
    {
        let s = self
            .local
            .cluster(authorization(headers), path, move |svc| {
                Box::pin(async move { call(svc).await.map(tonic::Response::into_inner) })
            })
            .await?;
        Ok(json(StatusCode::OK, &ClusterStatus::from(s)))
    }
}

/// The cluster's members as this node sees them (`GetClusterStatus`, admin key).
#[utoipa::path(get, path = "/v1/cluster", tag = "cluster",
    responses(
        (status = 200, description = "The cluster", body = ClusterStatus),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn cluster_status(
    State(b): State<Backend>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    use pb::cluster_service_server::ClusterService;
    b.cluster(
        &headers,
        "/boxoffice.v1.ClusterService/GetClusterStatus",
        |svc| async move {
            svc.get_cluster_status(tonic::Request::new(pb::GetClusterStatusRequest {}))
                .await
        },
    )
    .await
}

/// Adds a node to every group, live (`AddNode`, admin key).
#[utoipa::path(post, path = "/v1/cluster/nodes", tag = "cluster",
    request_body = AddNodeBody,
    responses(
        (status = 200, description = "The cluster, the node a voter of every group", body = ClusterStatus),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn add_node(
    State(b): State<Backend>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    use pb::cluster_service_server::ClusterService;
    let r: AddNodeBody = body(raw)?;
    let req = pb::AddNodeRequest {
        node_id: r.node_id,
        address: r.address,
    };
    b.cluster(
        &headers,
        "/boxoffice.v1.ClusterService/AddNode",
        |svc| async move { svc.add_node(tonic::Request::new(req)).await },
    )
    .await
}

/// Removes a node from every group, live (`RemoveNode`, admin key).
#[utoipa::path(delete, path = "/v1/cluster/nodes/{nodeId}", tag = "cluster",
    params(("nodeId" = u64, Path, description = "The node")),
    responses(
        (status = 200, description = "The cluster without the node", body = ClusterStatus),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn remove_node(
    State(b): State<Backend>,
    Path(node_id): Path<u64>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    use pb::cluster_service_server::ClusterService;
    b.cluster(
        &headers,
        "/boxoffice.v1.ClusterService/RemoveNode",
        move |svc| async move {
            svc.remove_node(tonic::Request::new(pb::RemoveNodeRequest { node_id }))
                .await
        },
    )
    .await
}

/// Replaces a node by another, live (`ReplaceNode`, admin key).
#[utoipa::path(post, path = "/v1/cluster/nodes/{nodeId}/replace", tag = "cluster",
    params(("nodeId" = u64, Path, description = "The node to replace")),
    request_body = AddNodeBody,
    responses(
        (status = 200, description = "The cluster, the new node a voter and the old one gone", body = ClusterStatus),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn replace_node(
    State(b): State<Backend>,
    Path(old_node_id): Path<u64>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    use pb::cluster_service_server::ClusterService;
    let r: AddNodeBody = body(raw)?;
    let req = pb::ReplaceNodeRequest {
        old_node_id,
        new_node_id: r.node_id,
        address: r.address,
    };
    b.cluster(
        &headers,
        "/boxoffice.v1.ClusterService/ReplaceNode",
        |svc| async move { svc.replace_node(tonic::Request::new(req)).await },
    )
    .await
}

/// Rotates the cluster's ticket signing key, live (`RotateTicketKey`, admin key).
#[utoipa::path(post, path = "/v1/cluster/ticket-keys/rotate", tag = "cluster",
    responses(
        (status = 200, description = "The cluster, its ring holding the new key", body = ClusterStatus),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn rotate_ticket_key(
    State(b): State<Backend>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    use pb::cluster_service_server::ClusterService;
    b.cluster(
        &headers,
        "/boxoffice.v1.ClusterService/RotateTicketKey",
        |svc| async move {
            svc.rotate_ticket_key(tonic::Request::new(pb::RotateTicketKeyRequest {}))
                .await
        },
    )
    .await
}

/// Spreads the groups' leaders over the nodes again (`Rebalance`, admin key).
#[utoipa::path(post, path = "/v1/cluster/rebalance", tag = "cluster",
    responses(
        (status = 200, description = "The cluster, its leaders spread", body = ClusterStatus),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn rebalance(State(b): State<Backend>, headers: HeaderMap) -> Result<Response, Refusal> {
    use pb::cluster_service_server::ClusterService;
    b.cluster(
        &headers,
        "/boxoffice.v1.ClusterService/Rebalance",
        |svc| async move {
            svc.rebalance(tonic::Request::new(pb::RebalanceRequest {}))
                .await
        },
    )
    .await
}

/// The caller's `Authorization` header, if it is text.
pub(crate) fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

/// A JSON body (an empty body is the type's default), or `INVALID_REQUEST` (field `request`):
/// not JSON, a field of the wrong type or unknown, or over the 256 KiB limit.
pub(crate) fn body<T: DeserializeOwned + Default>(
    raw: Result<Bytes, BytesRejection>,
) -> Result<T, Refusal> {
    let raw = raw.map_err(|e| {
        Refusal::invalid(
            "request",
            format!("the body could not be read (at most 256 KiB): {e}"),
        )
    })?;
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&raw)
        .map_err(|e| Refusal::invalid("request", format!("the body is not the JSON expected: {e}")))
}

pub(crate) fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, Refusal> {
    q.map(|Query(t)| t)
        .map_err(|e| Refusal::invalid("request", format!("bad query string: {}", e.body_text())))
}

/// The idempotency key: the `Idempotency-Key` header, or the body's `idempotencyKey`; both
/// given and different is `INVALID_REQUEST` (field `idempotency_key`).
pub(crate) fn idempotency_key(headers: &HeaderMap, in_body: String) -> Result<String, Refusal> {
    let header = match headers.get("idempotency-key") {
        Some(v) => Some(v.to_str().map_err(|_| {
            Refusal::invalid("idempotency_key", "the Idempotency-Key header is not ASCII")
        })?),
        None => None,
    };
    match header {
        Some(h) if !in_body.is_empty() && h != in_body => Err(Refusal::invalid(
            "idempotency_key",
            "the Idempotency-Key header and the body's idempotencyKey differ",
        )),
        Some(h) => Ok(h.to_owned()),
        None => Ok(in_body),
    }
}

/// A JSON answer with `status`, not to be stored by caches (it is one caller's).
pub(crate) fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    let mut r = (status, Json(value)).into_response();
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    r
}

pub(crate) fn created<T: serde::Serialize>(location: String, value: &T) -> Response {
    let mut r = json(StatusCode::CREATED, value);
    if let Ok(v) = HeaderValue::from_str(&location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// The gRPC selection of a hold: exact seats, or best available (1 place unless `quantity`).
pub(crate) fn selection(
    seat_ids: Vec<String>,
    section_id: String,
    quantity: Option<u32>,
) -> Result<pb::hold_request::Selection, Refusal> {
    if !seat_ids.is_empty() {
        if quantity.is_some() || !section_id.is_empty() {
            return Err(Refusal::invalid(
                "selection",
                "give either seat ids or a quantity (best available), not both",
            ));
        }
        return Ok(pb::hold_request::Selection::Seats(pb::SeatSelection {
            seat_ids,
        }));
    }
    Ok(pb::hold_request::Selection::BestAvailable(
        pb::BestAvailable {
            section_id,
            quantity: quantity.unwrap_or(1),
        },
    ))
}

/// Joins the waiting room (`Join`): the same user and session keep their place.
#[utoipa::path(get, path = "/v1/events/{id}/queue-token", tag = "waiting room",
    params(("id" = String, Path, description = "The event"), JoinQuery),
    responses(
        (status = 200, description = "A place in line", body = QueueToken),
        (status = "default", description = "A problem (RFC 9457) with the contract's reason", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn queue_token(
    State(b): State<Backend>,
    Path(event_id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<JoinQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(q)?;
    let ticket = b
        .call(
            &headers,
            pb::JoinRequest {
                event_id,
                user_id: q.user_id,
                session_id: q.session_id,
                join_challenge: q.join_challenge,
                pow_nonce: q.pow_nonce,
            },
        )
        .await?;
    Ok(json(StatusCode::OK, &QueueToken::from(ticket)))
}

/// The proof of work to solve before joining an event that asks for one (`GetJoinChallenge`).
#[utoipa::path(get, path = "/v1/events/{id}/join-challenge", tag = "waiting room",
    params(("id" = String, Path, description = "The event"), UserQuery),
    responses(
        (status = 200, description = "A challenge", body = JoinChallenge),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn join_challenge(
    State(b): State<Backend>,
    Path(event_id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<UserQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(q)?;
    let c = b
        .call(
            &headers,
            pb::GetJoinChallengeRequest {
                event_id,
                user_id: q.user_id,
            },
        )
        .await?;
    Ok(json(StatusCode::OK, &JoinChallenge::from(c)))
}

/// Where a place in line stands (`GetStatus`); once admitted, the admission token.
#[utoipa::path(get, path = "/v1/queue/{eventId}/status", tag = "waiting room",
    params(("eventId" = String, Path, description = "The event"), StatusQuery),
    responses(
        (status = 200, description = "The place's state", body = QueueStatus),
        (status = "default", description = "A problem (RFC 9457); a token of another event is TOKEN_INVALID", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn queue_status(
    State(b): State<Backend>,
    Path(event_id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(q)?;
    if let Some(of) = crate::tokens::event_of_unverified(&q.token)
        && of != event_id
    {
        return Err(Refusal::from(tonic::Status::from(
            crate::status::ApiError::TokenInvalid("the queue token is for another event"),
        )));
    }
    let s = b
        .call(
            &headers,
            pb::GetStatusRequest {
                queue_token: q.token,
            },
        )
        .await?;
    Ok(json(StatusCode::OK, &QueueStatus::from(s)))
}

async fn hold(b: &Backend, headers: &HeaderMap, req: pb::HoldRequest) -> Result<Response, Refusal> {
    let h = b.call(headers, req).await?;
    let location = format!("/v1/holds/{}", h.hold_id);
    Ok(created(location, &Hold::from(h)))
}

/// Holds places for an admitted fan (the seeds' `book`): `seatId`/`seatIds`, or `quantity`
/// places best available (in `sectionId`, or any). Durable before the answer.
#[utoipa::path(post, path = "/v1/events/{id}/book", tag = "booking",
    params(("id" = String, Path, description = "The event"),
        ("Idempotency-Key" = Option<String>, Header, description = "Recommended (or idempotencyKey in the body): a retry with the same key answers the first answer")),
    request_body = BookRequest,
    responses(
        (status = 201, description = "Held", body = Hold),
        (status = "default", description = "A problem (RFC 9457): SOLD_OUT, SEAT_UNAVAILABLE, USER_LIMIT, NOT_ADMITTED, ...", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn book(
    State(b): State<Backend>,
    Path(event_id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let r: BookRequest = body(raw)?;
    let idempotency_key = idempotency_key(&headers, r.idempotency_key)?;
    let mut seat_ids = r.seat_ids;
    seat_ids.extend(r.seat_id);
    let req = pb::HoldRequest {
        event_id,
        user_id: r.user_id,
        admission_token: r.token,
        idempotency_key,
        selection: Some(selection(seat_ids, r.section_id, r.quantity)?),
        access_code: r.access_code,
    };
    hold(&b, &headers, req).await
}

/// Holds places (the case study's `POST /v1/holds`); as `book`, with the event in the body.
#[utoipa::path(post, path = "/v1/holds", tag = "booking",
    params(("Idempotency-Key" = Option<String>, Header, description = "Recommended (or idempotencyKey in the body)")),
    request_body = HoldBody,
    responses(
        (status = 201, description = "Held", body = Hold),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn create_hold(
    State(b): State<Backend>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let r: HoldBody = body(raw)?;
    let idempotency_key = idempotency_key(&headers, r.idempotency_key)?;
    let req = pb::HoldRequest {
        event_id: r.event_id,
        user_id: r.user_id,
        admission_token: r.admission_token,
        idempotency_key,
        selection: Some(selection(r.seat_ids, r.section_id, r.quantity)?),
        access_code: r.access_code,
    };
    hold(&b, &headers, req).await
}

async fn confirm(
    b: &Backend,
    headers: &HeaderMap,
    req: pb::ConfirmRequest,
) -> Result<Response, Refusal> {
    let o = b.call(headers, req).await?;
    let location = format!("/v1/orders/{}", o.order_id);
    Ok(created(location, &Order::from(o)))
}

/// Pays for a hold and makes the order (`Confirm`; the seeds' `→ { ticketId }`): never
/// charged twice for one key and token.
#[utoipa::path(post, path = "/v1/holds/{holdId}/confirm", tag = "booking",
    params(("holdId" = String, Path, description = "The hold"),
        ("Idempotency-Key" = Option<String>, Header, description = "Strongly recommended (or idempotencyKey in the body): a retry with the same key and token is never charged twice")),
    request_body = ConfirmBody,
    responses(
        (status = 201, description = "The order and its tickets", body = Order),
        (status = "default", description = "A problem (RFC 9457): PAYMENT_DECLINED, HOLD_EXPIRED, ...", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn confirm_hold(
    State(b): State<Backend>,
    Path(hold_id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let r: ConfirmBody = body(raw)?;
    let idempotency_key = idempotency_key(&headers, r.idempotency_key)?;
    let req = pb::ConfirmRequest {
        hold_id,
        user_id: r.user_id,
        payment_token: r.payment_token,
        idempotency_key,
    };
    confirm(&b, &headers, req).await
}

/// Pays for a hold (the case study's `POST /v1/orders`).
#[utoipa::path(post, path = "/v1/orders", tag = "booking",
    request_body = OrderBody,
    responses(
        (status = 201, description = "The order and its tickets", body = Order),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn create_order(
    State(b): State<Backend>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let r: OrderBody = body(raw)?;
    let idempotency_key = idempotency_key(&headers, r.idempotency_key)?;
    let req = pb::ConfirmRequest {
        hold_id: r.hold_id,
        user_id: r.user_id,
        payment_token: r.payment_token,
        idempotency_key,
    };
    confirm(&b, &headers, req).await
}

/// Gives a hold's places back (`Release`): 204.
#[utoipa::path(post, path = "/v1/holds/{holdId}/release", tag = "booking",
    params(("holdId" = String, Path, description = "The hold")),
    request_body = ReleaseBody,
    responses(
        (status = 204, description = "Released (a retry after a lost success answers 409 HOLD_NOT_ACTIVE, and GET shows RELEASED)"),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn release_hold(
    State(b): State<Backend>,
    Path(hold_id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let r: ReleaseBody = body(raw)?;
    b.call(
        &headers,
        pb::ReleaseRequest {
            hold_id,
            user_id: r.user_id,
        },
    )
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A hold, to its holder (`GetHold`).
#[utoipa::path(get, path = "/v1/holds/{holdId}", tag = "booking",
    params(("holdId" = String, Path, description = "The hold"), UserQuery),
    responses(
        (status = 200, description = "The hold", body = Hold),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn get_hold(
    State(b): State<Backend>,
    Path(hold_id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<UserQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(q)?;
    let h = b
        .call(
            &headers,
            pb::GetHoldRequest {
                hold_id,
                user_id: q.user_id,
            },
        )
        .await?;
    Ok(json(StatusCode::OK, &Hold::from(h)))
}

/// An order and its tickets, to its buyer (`GetOrder`).
#[utoipa::path(get, path = "/v1/orders/{orderId}", tag = "booking",
    params(("orderId" = String, Path, description = "The order"), UserQuery),
    responses(
        (status = 200, description = "The order", body = Order),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn get_order(
    State(b): State<Backend>,
    Path(order_id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<UserQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(q)?;
    let o = b
        .call(
            &headers,
            pb::GetOrderRequest {
                order_id,
                user_id: q.user_id,
            },
        )
        .await?;
    Ok(json(StatusCode::OK, &Order::from(o)))
}

/// Creates an event (`CreateEvent`, admin key).
#[utoipa::path(post, path = "/v1/events", tag = "events",
    params(("Idempotency-Key" = Option<String>, Header, description = "Optional: a retry with the same key answers the same event")),
    request_body = CreateEventBody,
    responses(
        (status = 201, description = "The event", body = Event),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn create_event(
    State(b): State<Backend>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let mut r: CreateEventBody = body(raw)?;
    let key = idempotency_key(&headers, std::mem::take(&mut r.idempotency_key))?;
    let e = b.call(&headers, r.into_request(key)).await?;
    let location = format!("/v1/events/{}", e.event_id);
    Ok(created(location, &Event::from(e)))
}

/// Steers a live sale (`UpdateSale`, admin key): pause, queue everyone, end, or go on; the
/// admission rate, the hold TTL of new holds, the per-user limit.
#[utoipa::path(post, path = "/v1/events/{id}/sale", tag = "events",
    params(("id" = String, Path, description = "The event"),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: a retry with the same key answers the event as it is now")),
    request_body = UpdateSaleBody,
    responses(
        (status = 200, description = "The event after the change", body = Event),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn update_sale(
    State(b): State<Backend>,
    Path(event_id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let mut r: UpdateSaleBody = body(raw)?;
    let key = idempotency_key(&headers, std::mem::take(&mut r.idempotency_key))?;
    let req = r.into_request(event_id, key)?;
    let e = b.call(&headers, req).await?;
    Ok(json(StatusCode::OK, &Event::from(e)))
}

/// One sale control without a body (`UpdateSale`, admin key): `pause`, `resume` (to
/// `OPEN`), `queue-all` or `end`.
#[utoipa::path(post, path = "/v1/events/{id}/sale/{action}", tag = "events",
    params(("id" = String, Path, description = "The event"),
        ("action" = String, Path, description = "`pause`, `resume`, `queue-all` or `end`"),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: a retry with the same key answers the event as it is now")),
    responses(
        (status = 200, description = "The event after the change", body = Event),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn sale_action(
    State(b): State<Backend>,
    Path((event_id, action)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    let state = match action.as_str() {
        "pause" => "PAUSED",
        "resume" => "OPEN",
        "queue-all" => "QUEUE_ALL",
        "end" => "ENDED",
        _ => {
            return Err(Refusal::invalid(
                "action",
                "one of pause, resume, queue-all, end",
            ));
        }
    };
    let key = idempotency_key(&headers, String::new())?;
    let body = UpdateSaleBody {
        state: Some(state.to_owned()),
        ..UpdateSaleBody::default()
    };
    let req = body.into_request(event_id, key)?;
    let e = b.call(&headers, req).await?;
    Ok(json(StatusCode::OK, &Event::from(e)))
}

/// An event and its sections' counts (`GetEvent`).
#[utoipa::path(get, path = "/v1/events/{id}", tag = "events",
    params(("id" = String, Path, description = "The event")),
    responses(
        (status = 200, description = "The event", body = Event),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn get_event(
    State(b): State<Backend>,
    Path(event_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    let e = b.call(&headers, pb::GetEventRequest { event_id }).await?;
    Ok(json(StatusCode::OK, &Event::from(e)))
}

/// Events in id order, a page at a time (`ListEvents`).
#[utoipa::path(get, path = "/v1/events", tag = "events",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of events", body = EventPage),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn list_events(
    State(b): State<Backend>,
    headers: HeaderMap,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(q)?;
    let page = b
        .list(
            &headers,
            pb::ListEventsRequest {
                page_size: q.page_size,
                page_token: q.page_token,
            },
        )
        .await?;
    Ok(json(StatusCode::OK, &EventPage::from(page)))
}

/// The seat map's validator: made of what the answer shows (the event, the part asked, and
/// each section's version), never of a clock, so it changes when, and only when, a section in
/// it changes; the same on every node of a cluster.
pub fn seat_map_etag(map: &pb::SeatMap, section: &str, first_row: u32) -> String {
    let mut h = Sha256::new();
    h.update(map.event_id.as_bytes());
    h.update([0]);
    h.update(section.as_bytes());
    h.update([0]);
    h.update(first_row.to_be_bytes());
    h.update(map.next_first_row.to_be_bytes());
    for s in &map.sections {
        h.update(s.section_id.as_bytes());
        h.update([0]);
        h.update(s.version.to_be_bytes());
    }
    let digest = h.finalize();
    format!("W/\"{}\"", hex::encode(&digest[..12]))
}

/// Whether `If-None-Match` names `etag` (weak comparison, RFC 9110 13.1.2), or is `*`.
fn none_match(headers: &HeaderMap, etag: &str) -> Option<bool> {
    let v = headers.get(header::IF_NONE_MATCH)?.to_str().ok()?;
    let opaque = |t: &str| t.trim().trim_start_matches("W/").to_owned();
    let want = opaque(etag);
    Some(v.split(',').any(|t| t.trim() == "*" || opaque(t) == want))
}

/// The seat map (`GetSeatMap`), labelled "as of", cacheable for 5 s (`Cache-Control:
/// max-age=5`), with an `ETag` of the sections' versions and `Last-Modified` from their last
/// change: `If-None-Match` (or, without it, `If-Modified-Since`) answers 304 while nothing in
/// the map changed.
#[utoipa::path(get, path = "/v1/events/{id}/seats", tag = "events",
    params(("id" = String, Path, description = "The event"), SeatsQuery),
    responses(
        (status = 200, description = "The seat map, as of its time", body = SeatMap,
            headers(("ETag" = String, description = "Weak validator of the sections' versions"),
                ("Last-Modified" = String, description = "The last change of a section shown"),
                ("Cache-Control" = String, description = "public, max-age=5"))),
        (status = 304, description = "Not modified since the validator the caller sent"),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn seats(
    State(b): State<Backend>,
    Path(event_id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<SeatsQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(q)?;
    let map = b
        .call(
            &headers,
            pb::GetSeatMapRequest {
                event_id,
                section_id: q.section.clone(),
                first_row: q.first_row,
            },
        )
        .await?;
    let etag = seat_map_etag(&map, &q.section, q.first_row);
    let changed_ms = map
        .sections
        .iter()
        .map(|s| s.changed_at_unix_ms)
        .max()
        .unwrap_or(0)
        .max(0) as u64;
    let changed = std::time::UNIX_EPOCH + std::time::Duration::from_secs(changed_ms / 1_000);
    let not_modified = match none_match(&headers, &etag) {
        Some(m) => m,
        None => headers
            .get(header::IF_MODIFIED_SINCE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
            .is_some_and(|since| changed <= since),
    };
    let mut response = if not_modified {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        Json(SeatMap::from(map)).into_response()
    };
    let h = response.headers_mut();
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=5"),
    );
    h.insert(header::VARY, HeaderValue::from_static("authorization"));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(changed)) {
        h.insert(header::LAST_MODIFIED, v);
    }
    Ok(response)
}
