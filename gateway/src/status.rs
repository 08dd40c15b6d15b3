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
    /// A whole-event seat map larger than one response may be.
    SeatMapTooLarge {
        /// The event.
        event_id: String,
        /// The map's size, bytes (an upper bound: at most about 110 bytes per section above it).
        size: usize,
        /// The largest response, bytes.
        limit: usize,
    },
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
    if metadata.is_empty() {
        return plain_status(code, reason, message);
    }
    let details = ErrorDetails::with_error_info(reason, DOMAIN, metadata);
    Status::with_error_details(code, message, details)
}

/// A status whose `ErrorInfo` has no metadata: the same refusal (`SOLD_OUT`, most answers of a
/// sale) is the same bytes every time, so its encoded details are made once and shared (up to
/// [`PLAIN_MEMO_MAX`] distinct ones; past it each is encoded as usual).
fn plain_status(code: Code, reason: &str, message: String) -> Status {
    static MEMO: std::sync::LazyLock<dashmap::DashMap<(i32, String, String), bytes::Bytes>> =
        std::sync::LazyLock::new(dashmap::DashMap::new);
    let key = (code as i32, reason.to_owned(), message);
    if let Some(details) = MEMO.get(&key) {
        return Status::with_details(code, key.2.clone(), details.clone());
    }
    let details = ErrorDetails::with_error_info(reason, DOMAIN, HashMap::new());
    let s = Status::with_error_details(code, key.2.clone(), details);
    if MEMO.len() < PLAIN_MEMO_MAX {
        MEMO.insert(key, s.details().to_vec().into());
    }
    s
}

/// Most distinct metadata-free statuses [`plain_status`] keeps encoded.
const PLAIN_MEMO_MAX: usize = 256;

fn rejection_status(r: &Rejection) -> Status {
    let (code, reason, message, meta) = rejection_parts(r);
    if let Rejection::InvalidRequest { field, reason: why } = r {
        let mut details = ErrorDetails::with_error_info(reason, DOMAIN, meta);
        details.add_bad_request_violation(field.clone(), why.clone());
        return Status::with_error_details(code, message, details);
    }
    status(code, reason, message, meta)
}

/// What the status of a rejection carries: its code, `ErrorInfo` reason and metadata, and its
/// message (for an `INVALID_REQUEST` the `BadRequest` adds the field's violation).
pub fn rejection_parts(r: &Rejection) -> (Code, &'static str, String, HashMap<String, String>) {
    let reason = r.reason();
    let message = r.to_string();
    let mut meta = HashMap::new();
    let code = match r {
        Rejection::InvalidRequest { field, .. } => {
            meta.insert("field".to_owned(), field.clone());
            Code::InvalidArgument
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
        | Rejection::IdempotencyKeyReused
        | Rejection::PlacesAvailable => Code::FailedPrecondition,
        Rejection::IdempotencyKeyInFlight => Code::Aborted,
        Rejection::UserLimit { limit, used } => {
            meta.insert("limit".to_owned(), limit.to_string());
            meta.insert("used".to_owned(), used.to_string());
            Code::ResourceExhausted
        }
    };
    (code, reason, message, meta)
}

impl From<ApiError> for Status {
    // Over 70 lines: one arm per error, so the whole mapping to codes and reasons is one table.
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
            ApiError::SeatMapTooLarge {
                event_id,
                size,
                limit,
            } => status(
                Code::ResourceExhausted,
                "SEAT_MAP_TOO_LARGE",
                format!(
                    "the seat map of event {event_id} takes {size} bytes, over the {limit}-byte \
                     limit of a response: ask for one section at a time (section_id), and for \
                     the rest of a large section from next_first_row (first_row)"
                ),
                HashMap::from([
                    ("size".to_owned(), size.to_string()),
                    ("limit".to_owned(), limit.to_string()),
                ]),
            ),
        }
    }
}

/// One error of every kind the API answers: every rejection of the engine, every other engine
/// error, every error of the gateway's own. `every_error_kind_is_listed` checks none is missing.
fn every_error() -> Vec<ApiError> {
    let mut all: Vec<ApiError> = Rejection::every().into_iter().map(ApiError::from).collect();
    all.extend([
        ApiError::Engine(EngineError::Overloaded("section")),
        ApiError::Engine(EngineError::NotReady),
        ApiError::Engine(EngineError::Storage(StorageError::Io(String::new()))),
        ApiError::Engine(EngineError::PaymentUnavailable {
            timeout: true,
            reason: String::new(),
        }),
        ApiError::Engine(EngineError::PaymentUnavailable {
            timeout: false,
            reason: String::new(),
        }),
        ApiError::TokenInvalid("token"),
        ApiError::TokenExpired,
        ApiError::NotAdmitted,
        ApiError::QueueFull,
        ApiError::Overloaded("gate"),
        ApiError::NotReady,
        ApiError::Unauthenticated,
        ApiError::PermissionDenied,
        ApiError::SeatMapTooLarge {
            event_id: String::new(),
            size: 0,
            limit: 0,
        },
        ApiError::Pow(crate::pow::PowError::Required),
        ApiError::Pow(crate::pow::PowError::Invalid),
        ApiError::Pow(crate::pow::PowError::Expired),
        ApiError::Pow(crate::pow::PowError::Reused),
    ]);
    all
}

/// Every `ErrorInfo.reason` the server answers, each with its gRPC code, in the order of
/// [`every_error`], each once: the one list of reasons (docs/api.md section 7.2 is checked
/// against it). Derived from the mapping above, so it cannot drift from what clients get.
pub fn reasons() -> &'static [(String, Code)] {
    static REASONS: std::sync::OnceLock<Vec<(String, Code)>> = std::sync::OnceLock::new();
    REASONS.get_or_init(|| {
        let mut out: Vec<(String, Code)> = Vec::new();
        for e in every_error() {
            let s = Status::from(e);
            if let Some(reason) = reason_of(&s)
                && !out.iter().any(|(r, _)| *r == reason)
            {
                out.push((reason, s.code()));
            }
        }
        out
    })
}

/// The reason as a metrics label: one of [`reasons`], `none` for a status without one,
/// `other` for one not in the list (never a caller's text: the label set stays bounded).
pub fn reason_label(status: &Status) -> &'static str {
    match reason_of(status) {
        None => "none",
        Some(r) => known_reason(&r),
    }
}

/// A reason as a metric label: itself if the contract has it, `other` if not (bounded).
pub fn known_reason(reason: &str) -> &'static str {
    if reason.is_empty() {
        return "none";
    }
    reasons()
        .iter()
        .find(|(known, _)| known == reason)
        .map_or("other", |(known, _)| known.as_str())
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
            (Rejection::PlacesAvailable, Code::FailedPrecondition),
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

    /// Exhaustive over every kind of error: a new kind must be placed here, and then the
    /// test fails until `every_error` lists it.
    fn kind(e: &ApiError) -> usize {
        match e {
            ApiError::Engine(EngineError::Rejected(_)) => 0,
            ApiError::Engine(EngineError::Overloaded(_)) => 1,
            ApiError::Engine(EngineError::NotReady) => 2,
            ApiError::Engine(EngineError::Storage(_)) => 3,
            ApiError::Engine(EngineError::PaymentUnavailable { timeout: true, .. }) => 4,
            ApiError::Engine(EngineError::PaymentUnavailable { timeout: false, .. }) => 5,
            ApiError::TokenInvalid(_) => 6,
            ApiError::TokenExpired => 7,
            ApiError::NotAdmitted => 8,
            ApiError::QueueFull => 9,
            ApiError::Overloaded(_) => 10,
            ApiError::NotReady => 11,
            ApiError::Unauthenticated => 12,
            ApiError::PermissionDenied => 13,
            ApiError::SeatMapTooLarge { .. } => 14,
            ApiError::Pow(_) => 15,
        }
    }

    #[test]
    fn every_error_kind_is_listed() {
        let mut seen: Vec<usize> = every_error().iter().map(kind).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, (0..16).collect::<Vec<_>>());
    }

    /// The reasons table of docs/api.md (section 7.2) is the list the server answers: the same
    /// reasons, each with the same code, and the count it states.
    #[test]
    fn the_documented_reasons_are_the_answered_ones() {
        let doc = include_str!("../../docs/api.md");
        let start = doc.find("### 7.2 Reasons").expect("section 7.2");
        let end = start + doc[start..].find("### 7.3").expect("section 7.3");
        let table = &doc[start..end];
        let mut documented: Vec<(String, String)> = table
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let reason = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
                let code = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
                Some((reason.to_owned(), code.to_owned()))
            })
            .collect();
        let mut answered: Vec<(String, String)> = reasons()
            .iter()
            .map(|(r, c)| {
                // `Code`'s Debug is CamelCase; the contract spells codes in SCREAMING_SNAKE.
                let mut name = String::new();
                for (i, ch) in format!("{c:?}").chars().enumerate() {
                    if ch.is_ascii_uppercase() && i > 0 {
                        name.push('_');
                    }
                    name.push(ch.to_ascii_uppercase());
                }
                (r.clone(), name)
            })
            .collect();
        assert!(
            table.contains(&format!("That is {} reasons.", answered.len())),
            "section 7.2 states another count than {}",
            answered.len()
        );
        documented.sort();
        answered.sort();
        assert_eq!(documented, answered);
    }

    #[test]
    fn reason_labels_are_bounded() {
        let sold_out: Status = ApiError::from(Rejection::SoldOut).into();
        assert_eq!(reason_label(&sold_out), "SOLD_OUT");
        assert_eq!(reason_label(&Status::unauthenticated("no key")), "none");
        let foreign = status(
            Code::FailedPrecondition,
            "SOMEONE_ELSES_REASON",
            String::new(),
            HashMap::new(),
        );
        assert_eq!(reason_label(&foreign), "other");
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
                ApiError::SeatMapTooLarge {
                    event_id: "e".into(),
                    size: 5_000_000,
                    limit: 4_194_304,
                },
                Code::ResourceExhausted,
                "SEAT_MAP_TOO_LARGE",
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
