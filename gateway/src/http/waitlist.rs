//! The waitlist over HTTP: `POST /v1/events/{id}/waitlist` (`JoinWaitlist`) and
//! `GET /v1/waitlist/{entryId}?userId=` (`GetWaitlistEntry`), through the same in-process calls
//! as gRPC ([`super::api::Backend`]).

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use boxoffice_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::api::{Backend, body, created, json, query};
use super::problem::{Problem, Refusal};
use super::types::{UserQuery, short};

/// `POST /v1/events/{id}/waitlist`: who waits, for what.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinWaitlistBody {
    /// The fan waiting.
    #[serde(default)]
    pub user_id: String,
    /// The section wanted (empty: any).
    #[serde(default)]
    pub section_id: String,
    /// How many places, all or nothing.
    #[serde(default)]
    pub quantity: u32,
    /// The fan's admission token (or admitted queue token), as for a hold.
    #[serde(default)]
    pub admission_token: String,
}

/// A fan's place on an event's waitlist.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitlistEntry {
    /// The entry.
    pub entry_id: String,
    /// Its event.
    pub event_id: String,
    /// The fan waiting.
    pub user_id: String,
    /// Position on the waitlist, from 1; 0 once no longer waiting.
    pub position: u64,
    /// `WAITING`, `OFFERED`, `EXPIRED` or `FULFILLED`.
    pub state: String,
    /// The hold offered to the fan, once `OFFERED`.
    pub offered_hold_id: String,
}

impl From<pb::WaitlistEntry> for WaitlistEntry {
    fn from(e: pb::WaitlistEntry) -> WaitlistEntry {
        WaitlistEntry {
            state: short(e.state().as_str_name(), "WAITLIST_STATE_"),
            entry_id: e.entry_id,
            event_id: e.event_id,
            user_id: e.user_id,
            position: e.position,
            offered_hold_id: e.offered_hold_id,
        }
    }
}

/// Joins an event's waitlist (`JoinWaitlist`): only while the places wanted cannot be held
/// (`PLACES_AVAILABLE` otherwise); the same fan joining again gets their entry back.
#[utoipa::path(post, path = "/v1/events/{id}/waitlist", tag = "waitlist",
    params(("id" = String, Path, description = "The event")),
    request_body = JoinWaitlistBody,
    responses(
        (status = 201, description = "The entry", body = WaitlistEntry),
        (status = "default", description = "A problem (RFC 9457): PLACES_AVAILABLE, TOKEN_INVALID, ...", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn join_waitlist(
    State(b): State<Backend>,
    Path(event_id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let r: JoinWaitlistBody = body(raw)?;
    let entry = b
        .call(
            &headers,
            pb::JoinWaitlistRequest {
                event_id,
                user_id: r.user_id,
                section_id: r.section_id,
                quantity: r.quantity,
                admission_token: r.admission_token,
            },
        )
        .await?;
    let location = format!("/v1/waitlist/{}", entry.entry_id);
    Ok(created(location, &WaitlistEntry::from(entry)))
}

/// A waitlist entry, to its fan (`GetWaitlistEntry`; anyone else: `ENTRY_NOT_FOUND`).
#[utoipa::path(get, path = "/v1/waitlist/{entryId}", tag = "waitlist",
    params(("entryId" = String, Path, description = "The entry"), UserQuery),
    responses(
        (status = 200, description = "The entry", body = WaitlistEntry),
        (status = "default", description = "A problem (RFC 9457)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
pub async fn get_waitlist_entry(
    State(b): State<Backend>,
    Path(entry_id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<UserQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(q)?;
    let entry = b
        .call(
            &headers,
            pb::GetWaitlistEntryRequest {
                entry_id,
                user_id: q.user_id,
            },
        )
        .await?;
    Ok(json(StatusCode::OK, &WaitlistEntry::from(entry)))
}
