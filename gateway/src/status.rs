//! Every error the API answers, and its gRPC status: the code and the `google.rpc.ErrorInfo`
//! reason of the contract (`docs/api.md`), with domain `boxoffice`. The match is exhaustive (no `_`
//! arm): a new engine error cannot reach a client unmapped.

use std::collections::HashMap;

use boxoffice_engine::{EngineError, Rejection, StorageError};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The `ErrorInfo.domain` of every boxoffice error.
pub const DOMAIN: &str = "boxoffice";

/// An answer that is not a success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// From the engine.
    Engine(EngineError),
    /// A token that is forged, malformed, or for another event or user.
    TokenInvalid(&'static str),
    /// A token past its expiry.
    TokenExpired,
    /// A queue token whose position is not admitted yet.
    NotAdmitted,
    /// The waiting room is full.
    QueueFull,
    /// The proof of work before `Join` is missing, wrong, expired or used.
    Pow(crate::pow::PowError),
    /// Shed before doing any work.
    Overloaded(&'static str),
    /// Recovering or shutting down.
    NotReady,
    /// No key, or an unknown key.
    Unauthenticated,
    /// A client key on an admin RPC.
    PermissionDenied,
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        ApiError::Engine(e)
    }
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> Self {
        ApiError::Engine(EngineError::Rejected(r))
    }
}

fn status(code: Code, reason: &str, message: String, metadata: HashMap<String, String>) -> Status {
    let details = ErrorDetails::with_error_info(reason, DOMAIN, metadata);
    Status::with_error_details(code, message, details)
}

fn rejection_status(r: &Rejection) -> Status {
    let reason = r.reason();
    let message = r.to_string();
    let mut meta = HashMap::new();
    let code = match r {
        Rejection::InvalidRequest { field, reason: why } => {
            meta.insert("field".to_owned(), field.clone());
            let mut details = ErrorDetails::with_error_info(reason, DOMAIN, meta);
            details.add_bad_request_violation(field.clone(), why.clone());
            return Status::with_error_details(Code::InvalidArgument, message, details);
        }
        Rejection::EventNotFound
        | Rejection::SectionNotFound
        | Rejection::HoldNotFound
        | Rejection::OrderNotFound
        | Rejection::EntryNotFound => Code::NotFound,
        Rejection::QueueFull => Code::ResourceExhausted,
        Rejection::SeatNotFound(seat) => {
            meta.insert("seat_id".to_owned(), seat.to_string());
            Code::NotFound
        }
        Rejection::EventExists => Code::AlreadyExists,
        Rejection::SeatUnavailable(seat) => {
            meta.insert("seat_id".to_owned(), seat.to_string());
            Code::FailedPrecondition
        }
        Rejection::SaleNotOpen
        | Rejection::SoldOut
        | Rejection::HoldExpired
        | Rejection::HoldNotActive
        | Rejection::PaymentDeclined
        | Rejection::IdempotencyKeyReused => Code::FailedPrecondition,
        Rejection::IdempotencyKeyInFlight => Code::Aborted,
        Rejection::UserLimit { limit, used } => {
            meta.insert("limit".to_owned(), limit.to_string());
            meta.insert("used".to_owned(), used.to_string());
            Code::ResourceExhausted
        }
    };
    status(code, reason, message, meta)
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let none = HashMap::new;
        match e {
            ApiError::Engine(EngineError::Rejected(r)) => rejection_status(&r),
            ApiError::Engine(EngineError::Overloaded(what)) | ApiError::Overloaded(what) => {
                let mut details = ErrorDetails::with_error_info("OVERLOADED", DOMAIN, none());
                details.set_retry_info(Some(crate::limits::OVERLOADED_RETRY_DELAY));
                Status::with_error_details(
                    Code::ResourceExhausted,
                    format!("overloaded ({what}); back off and retry"),
                    details,
                )
            }
            ApiError::Engine(EngineError::NotReady) | ApiError::NotReady => status(
                Code::Unavailable,
                "NOT_READY",
                "not ready: recovering or shutting down".into(),
                none(),
            ),
            ApiError::Engine(EngineError::Storage(s)) => {
                // A fixed text: the cause (an OS error, an actor's panic message naming other
                // users) is for the server's log and health, never for callers.
                let message = match &s {
                    StorageError::BackstopRefused { .. } => {
                        "the log refused the write; nothing was acknowledged"
                    }
                    _ => "the engine stopped: nothing was acknowledged; retry after a restart",
                };
                status(
                    Code::Unavailable,
                    "STORAGE_FAILED",
                    message.to_owned(),
                    none(),
                )
            }
            ApiError::Engine(EngineError::PaymentUnavailable { timeout, reason }) => {
                // Not a definite answer: no order was made, and a retry with the same payment
                // token picks up the charge's real outcome (never a second charge).
                let (code, why) = if timeout {
                    (Code::DeadlineExceeded, "PAYMENT_TIMEOUT")
                } else {
                    (Code::Unavailable, "PAYMENT_UNAVAILABLE")
                };
                status(
                    code,
                    why,
                    format!("{reason}; retry the confirm with the same payment token"),
                    none(),
                )
            }
            ApiError::TokenInvalid(what) => status(
                Code::Unauthenticated,
                "TOKEN_INVALID",
                format!("{what} is invalid"),
                none(),
            ),
            ApiError::TokenExpired => status(
                Code::Unauthenticated,
                "TOKEN_EXPIRED",
                "the admission window is over".into(),
                none(),
            ),
            ApiError::NotAdmitted => status(
                Code::PermissionDenied,
                "NOT_ADMITTED",
                "not admitted yet: keep polling the waiting room".into(),
                none(),
            ),
            ApiError::QueueFull => status(
                Code::ResourceExhausted,
                "QUEUE_FULL",
                "the waiting room is full; back off and retry".into(),
                none(),
            ),
            ApiError::Pow(e) => {
                use crate::pow::PowError;
                let message = match e {
                    PowError::Required => {
                        "this event asks for a proof of work: GetJoinChallenge, solve it, join with it"
                    }
                    PowError::Invalid => {
                        "the join challenge is not this server's for this event and user, or the nonce does not solve it"
                    }
                    PowError::Expired => "the join challenge expired: get a new one",
                    PowError::Reused => "the join challenge was used already: get a new one",
                };
                status(
                    Code::FailedPrecondition,
                    e.reason(),
                    message.to_owned(),
                    none(),
                )
            }
            ApiError::Unauthenticated => Status::unauthenticated(
                "missing or unknown API key: send `authorization: Bearer <key>`",
            ),
            ApiError::PermissionDenied => Status::permission_denied("this RPC needs an admin key"),
        }
    }
}

/// The `ErrorInfo.reason` a status carries, if any (for clients and tests).
pub fn reason_of(status: &Status) -> Option<String> {
    status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use boxoffice_engine::SeatId;

    #[test]
    fn every_rejection_has_the_documented_code_and_reason() {
        let cases = [
            (
                Rejection::invalid("quantity", "must be 1 to 100"),
                Code::InvalidArgument,
            ),
            (Rejection::EventNotFound, Code::NotFound),
            (Rejection::SectionNotFound, Code::NotFound),
            (
                Rejection::SeatNotFound(SeatId::from("a:A:1")),
                Code::NotFound,
            ),
            (Rejection::HoldNotFound, Code::NotFound),
            (Rejection::OrderNotFound, Code::NotFound),
            (Rejection::EntryNotFound, Code::NotFound),
            (Rejection::QueueFull, Code::ResourceExhausted),
            (Rejection::EventExists, Code::AlreadyExists),
            (Rejection::SaleNotOpen, Code::FailedPrecondition),
            (Rejection::SoldOut, Code::FailedPrecondition),
            (
                Rejection::SeatUnavailable(SeatId::from("a:A:1")),
                Code::FailedPrecondition,
            ),
            (Rejection::HoldExpired, Code::FailedPrecondition),
            (Rejection::HoldNotActive, Code::FailedPrecondition),
            (Rejection::PaymentDeclined, Code::FailedPrecondition),
            (Rejection::IdempotencyKeyReused, Code::FailedPrecondition),
            (Rejection::IdempotencyKeyInFlight, Code::Aborted),
            (
                Rejection::UserLimit { limit: 4, used: 3 },
                Code::ResourceExhausted,
            ),
        ];
        for (r, code) in cases {
            let s: Status = ApiError::from(r.clone()).into();
            assert_eq!(s.code(), code, "{r:?}");
            let details = s.get_error_details();
            let info = details.error_info().expect("ErrorInfo");
            assert_eq!(
                (info.reason.as_str(), info.domain.as_str()),
                (r.reason(), DOMAIN)
            );
        }
        let s: Status = ApiError::from(Rejection::invalid("sections[0].name", "too long")).into();
        let details = s.get_error_details();
        let violations = &details.bad_request().expect("BadRequest").field_violations;
        assert_eq!(violations[0].field, "sections[0].name");
    }

    #[test]
    fn gateway_errors_have_their_reasons() {
        let cases = [
            (
                ApiError::TokenInvalid("admission_token"),
                Code::Unauthenticated,
                "TOKEN_INVALID",
            ),
            (
                ApiError::TokenExpired,
                Code::Unauthenticated,
                "TOKEN_EXPIRED",
            ),
            (
                ApiError::NotAdmitted,
                Code::PermissionDenied,
                "NOT_ADMITTED",
            ),
            (ApiError::QueueFull, Code::ResourceExhausted, "QUEUE_FULL"),
            (
                ApiError::Pow(crate::pow::PowError::Required),
                Code::FailedPrecondition,
                "POW_REQUIRED",
            ),
            (
                ApiError::Pow(crate::pow::PowError::Invalid),
                Code::FailedPrecondition,
                "POW_INVALID",
            ),
            (
                ApiError::Pow(crate::pow::PowError::Expired),
                Code::FailedPrecondition,
                "POW_EXPIRED",
            ),
            (
                ApiError::Pow(crate::pow::PowError::Reused),
                Code::FailedPrecondition,
                "POW_REUSED",
            ),
            (
                ApiError::Overloaded("gate"),
                Code::ResourceExhausted,
                "OVERLOADED",
            ),
            (ApiError::NotReady, Code::Unavailable, "NOT_READY"),
            (
                ApiError::Engine(EngineError::Storage(StorageError::Io("disk".into()))),
                Code::Unavailable,
                "STORAGE_FAILED",
            ),
        ];
        for (e, code, reason) in cases {
            let s: Status = e.into();
            assert_eq!((s.code(), reason_of(&s).as_deref()), (code, Some(reason)));
        }
    }
}
