//! `HoldBatch` over HTTP: `POST /v1/events/{id}/holds/batch`, many fans' holds of one event in
//! one call, each answered as its own `Hold` would be (a hold, or the problem a `Hold` would
//! have answered), through the same in-process call as gRPC ([`super::api::Backend`]).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use boxoffice_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::api::{Backend, body, json, selection};
use super::problem::{Problem, Refusal};
use super::types::Hold;

/// One hold of a batch: a `POST /v1/holds` body without its event.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BatchItemBody {
    /// The fan holding.
    #[serde(default)]
    pub user_id: String,
    /// The fan's admission token.
    #[serde(default)]
    pub admission_token: String,
    /// The item's idempotency key (scoped per user, shared with single holds).
    #[serde(default)]
    pub idempotency_key: String,
    /// Exact seats, all or none.
    #[serde(default)]
    pub seat_ids: Vec<String>,
    /// Best available: the section (empty: any).
    #[serde(default)]
    pub section_id: String,
    /// Best available: how many places (without seats: 1).
    #[serde(default)]
    pub quantity: Option<u32>,
    /// Presale access code (empty: none), as for a single hold.
    #[serde(default)]
    pub access_code: String,
}

/// `POST /v1/events/{id}/holds/batch`: the holds, 1 to 256.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HoldBatchBody {
    /// The holds, answered in this order.
    #[serde(default)]
    pub items: Vec<BatchItemBody>,
}

/// One item's answer: its hold, or the problem its `Hold` would have answered.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchResult {
    /// The hold, durable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// Why this item holds nothing (its `status` is the HTTP status a single hold would have
    /// answered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
}

/// The answers, `results[i]` answering `items[i]`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HoldBatchAnswer {
    /// One per item, in item order.
    pub results: Vec<BatchResult>,
}

impl From<pb::HoldBatchResponse> for HoldBatchAnswer {
    fn from(r: pb::HoldBatchResponse) -> HoldBatchAnswer {
        let results = r
            .results
            .into_iter()
            .map(|r| match r.result {
                Some(pb::hold_batch_result::Result::Hold(h)) => BatchResult {
                    hold: Some(Hold::from(h)),
                    error: None,
                },
                Some(pb::hold_batch_result::Result::Error(e)) => BatchResult {
                    hold: None,
                    error: Some(Problem::from_item(&e)),
                },
                None => BatchResult {
                    hold: None,
                    error: None,
                },
            })
            .collect();
        HoldBatchAnswer { results }
    }
}

/// Holds places for many admitted fans of one event in one call (`HoldBatch`): each item is a
/// hold of its own, answered in item order once durable. The call itself answers 200 whenever
/// the items were decided (an item's refusal is in its result); a problem only for the whole
/// call (`INVALID_REQUEST` field `items`, an unknown event, the API key, shedding).
#[utoipa::path(post, path = "/v1/events/{id}/holds/batch", tag = "booking",
    params(("id" = String, Path, description = "The event")),
    request_body = HoldBatchBody,
    responses(
        (status = 200, description = "One result per item, in item order", body = HoldBatchAnswer),
        (status = "default", description = "A problem (RFC 9457) of the whole call", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn hold_batch(
    State(b): State<Backend>,
    Path(event_id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let r: HoldBatchBody = body(raw)?;
    let mut items = Vec::with_capacity(r.items.len());
    for (i, item) in r.items.into_iter().enumerate() {
        let selection = selection(item.seat_ids, item.section_id, item.quantity).map_err(|_| {
            Refusal::invalid(
                &format!("items[{i}].selection"),
                "give either seat ids or a quantity (best available), not both",
            )
        })?;
        items.push(pb::HoldBatchItem {
            user_id: item.user_id,
            admission_token: item.admission_token,
            idempotency_key: item.idempotency_key,
            access_code: item.access_code,
            selection: Some(match selection {
                pb::hold_request::Selection::Seats(s) => pb::hold_batch_item::Selection::Seats(s),
                pb::hold_request::Selection::BestAvailable(b) => {
                    pb::hold_batch_item::Selection::BestAvailable(b)
                }
            }),
        });
    }
    let answer = b
        .call(&headers, pb::HoldBatchRequest { event_id, items })
        .await?;
    Ok(json(StatusCode::OK, &HoldBatchAnswer::from(answer)))
}
