//! Errors of the HTTP API as RFC 9457 problem details (`application/problem+json`), made from
//! the gRPC status the services answered: the contract's `reason` (docs/api.md 7.2) is kept as
//! is, with the `ErrorInfo` metadata, the `BadRequest` violation and the `RetryInfo` delay.

use std::collections::BTreeMap;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tonic::Code;
use tonic_types::StatusExt;
use utoipa::ToSchema;

/// The media type of a problem.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A problem (RFC 9457): what went wrong, in the contract's words.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// `urn:boxoffice:reason:{REASON}` for an error with a reason, `about:blank` otherwise.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary: the reason, or the HTTP status phrase.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// For humans; may change (switch on `reason`).
    pub detail: String,
    /// The contract's reason (docs/api.md 7.2), if the error has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The gRPC code the same call would have answered (`INVALID_ARGUMENT`, `NOT_FOUND`, ...).
    pub grpc_code: String,
    /// The `ErrorInfo` metadata (`field`, `seat_id`, `limit`, `used`, `size`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// For `INVALID_REQUEST`: the field at fault (as in docs/api.md 7.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Where to start backing off, ms (`OVERLOADED`); also sent as `Retry-After`, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// The gRPC code's name, as the contract writes it.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The HTTP status of an answer with gRPC `code` and `reason` (the table in docs/api.md,
/// "HTTP/JSON"): a refusal the caller can resolve by acting differently is 409, a limit the
/// caller may wait out is 429, anything the server could not do now is 503.
pub fn http_status(code: Code, reason: Option<&str>) -> StatusCode {
    match (code, reason) {
        (Code::ResourceExhausted, Some("USER_LIMIT" | "ACCESS_CODE_EXHAUSTED")) => {
            StatusCode::CONFLICT
        }
        (Code::ResourceExhausted, Some("SEAT_MAP_TOO_LARGE")) => StatusCode::UNPROCESSABLE_ENTITY,
        (Code::ResourceExhausted, _) => StatusCode::TOO_MANY_REQUESTS,
        (Code::InvalidArgument | Code::OutOfRange, _) => StatusCode::BAD_REQUEST,
        (Code::NotFound, _) => StatusCode::NOT_FOUND,
        (Code::AlreadyExists | Code::FailedPrecondition | Code::Aborted, _) => StatusCode::CONFLICT,
        (Code::Unauthenticated, _) => StatusCode::UNAUTHORIZED,
        (Code::PermissionDenied, _) => StatusCode::FORBIDDEN,
        (Code::Unavailable | Code::Cancelled, _) => StatusCode::SERVICE_UNAVAILABLE,
        (Code::DeadlineExceeded, _) => StatusCode::GATEWAY_TIMEOUT,
        (Code::Unimplemented, _) => StatusCode::NOT_IMPLEMENTED,
        (Code::Ok, _) => StatusCode::OK,
        (Code::Unknown | Code::Internal | Code::DataLoss, _) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl Problem {
    /// The problem of a gRPC status: from the parts it was made of if this process made it
    /// (nothing decoded), else from its details (a leader's answer, passed on).
    pub fn from_status(status: &tonic::Status) -> Problem {
        match crate::status::parts_kept(status) {
            Some(parts) => Problem::from_parts(&parts),
            None => Problem::from_details(status),
        }
    }

    /// The problem of an error's parts ([`crate::status::ApiError::parts`]).
    pub fn from_parts(parts: &crate::status::ErrorParts) -> Problem {
        let reason = parts.reason.filter(|r| !r.is_empty()).map(str::to_owned);
        let metadata: BTreeMap<String, String> = parts
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let field = parts
            .violation
            .as_ref()
            .map(|(field, _)| field.clone())
            .or_else(|| metadata.get("field").cloned());
        let retry_after_ms = parts.retry_delay.map(|d| d.as_millis() as u64);
        Problem::of(
            parts.code,
            reason,
            parts.message.clone(),
            metadata,
            field,
            retry_after_ms,
        )
    }

    /// The problem of one `HoldBatch` item's error: what its own `Hold` would have answered.
    pub fn from_item(e: &boxoffice_proto::v1::ItemError) -> Problem {
        let metadata: BTreeMap<String, String> = e
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let field = metadata.get("field").cloned();
        let retry_after_ms = u64::try_from(e.retry_delay_ms).ok().filter(|ms| *ms > 0);
        Problem::of(
            Code::from_i32(e.code),
            Some(e.reason.clone()).filter(|r| !r.is_empty()),
            e.message.clone(),
            metadata,
            field,
            retry_after_ms,
        )
    }

    /// The problem of a status made elsewhere, read from its details.
    fn from_details(status: &tonic::Status) -> Problem {
        let details = status.get_error_details();
        let info = details.error_info();
        let reason = info.map(|i| i.reason.clone()).filter(|r| !r.is_empty());
        let metadata: BTreeMap<String, String> = info
            .map(|i| i.metadata.clone().into_iter().collect())
            .unwrap_or_default();
        let field = details
            .bad_request()
            .and_then(|b| b.field_violations.first())
            .map(|v| v.field.clone())
            .or_else(|| metadata.get("field").cloned());
        let retry_after_ms = details
            .retry_info()
            .and_then(|r| r.retry_delay)
            .map(|d| d.as_millis() as u64);
        Problem::of(
            status.code(),
            reason,
            status.message().to_owned(),
            metadata,
            field,
            retry_after_ms,
        )
    }

    fn of(
        code: Code,
        reason: Option<String>,
        detail: String,
        metadata: BTreeMap<String, String>,
        field: Option<String>,
        retry_after_ms: Option<u64>,
    ) -> Problem {
        let http = http_status(code, reason.as_deref());
        Problem {
            kind: reason.as_ref().map_or_else(
                || "about:blank".to_owned(),
                |r| format!("urn:boxoffice:reason:{r}"),
            ),
            title: reason
                .clone()
                .unwrap_or_else(|| http.canonical_reason().unwrap_or("Error").to_owned()),
            status: http.as_u16(),
            detail,
            reason,
            grpc_code: code_name(code).to_owned(),
            metadata,
            field,
            retry_after_ms,
        }
    }

    /// `INVALID_REQUEST` naming `field`, found by the HTTP layer itself (a body that is not
    /// JSON, a header that contradicts the body): the same reason and code a gRPC call gets.
    pub fn invalid(field: &str, detail: impl Into<String>) -> Problem {
        let rejection = boxoffice_engine::Rejection::invalid(field, detail);
        Problem::from_parts(&crate::status::ApiError::from(rejection).parts())
    }

    fn http(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// A refused call, answered as its problem (boxed: handlers return it by value).
#[derive(Debug)]
pub struct Refusal(pub Box<Problem>);

impl Refusal {
    /// See [`Problem::invalid`].
    pub fn invalid(field: &str, detail: impl Into<String>) -> Refusal {
        Refusal(Box::new(Problem::invalid(field, detail)))
    }
}

impl From<tonic::Status> for Refusal {
    fn from(status: tonic::Status) -> Refusal {
        Refusal(Box::new(Problem::from_status(&status)))
    }
}

impl From<Problem> for Refusal {
    fn from(p: Problem) -> Refusal {
        Refusal(Box::new(p))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (*self.0).into_response()
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let http = self.http();
        let retry_after = match (self.retry_after_ms, http) {
            (Some(ms), _) => Some(ms.div_ceil(1_000).max(1)),
            (None, StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS) => Some(1),
            (None, StatusCode::CONFLICT) if self.grpc_code == "ABORTED" => Some(1),
            _ => None,
        };
        let unauthenticated = http == StatusCode::UNAUTHORIZED && self.reason.is_none();
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (http, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(s) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if unauthenticated {
            // The API key is missing or unknown (a bad queue or admission token has a reason).
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"boxoffice\""),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_documented_reason_maps_to_a_client_or_server_error() {
        for (reason, code) in crate::status::reasons() {
            let s = http_status(*code, Some(reason));
            assert!(s.is_client_error() || s.is_server_error(), "{reason}: {s}");
        }
        assert_eq!(
            http_status(Code::FailedPrecondition, Some("SOLD_OUT")),
            StatusCode::CONFLICT
        );
        assert_eq!(
            http_status(Code::ResourceExhausted, Some("OVERLOADED")),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            http_status(Code::Unavailable, Some("NOT_READY")),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn an_invalid_request_names_its_field() {
        let p = Problem::invalid("user_id", "user_id is required");
        assert_eq!(p.status, 400);
        assert_eq!(p.reason.as_deref(), Some("INVALID_REQUEST"));
        assert_eq!(p.field.as_deref(), Some("user_id"));
        assert_eq!(p.kind, "urn:boxoffice:reason:INVALID_REQUEST");
        assert_eq!(p.grpc_code, "INVALID_ARGUMENT");
    }
}
