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
    /// This cluster node's copy of the ticket key ring may be stale for an order's codes.
    RingStale(crate::signing::RingStale),
    /// No key, or an unknown key.
    Unauthenticated,
    /// A client key on an admin RPC.
    PermissionDenied,
    /// A change of a cluster's members refused, or a single node asked about its cluster.
    Cluster(ClusterRefusal),
    /// A change stream's cursor older than the retention: the oldest cursor served.
    CursorExpired(String),
    /// A change stream's cursor this server never handed out (malformed, or past the end).
    CursorInvalid(String),
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

/// Why `ClusterService` refused a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterRefusal {
    /// The server is a single node.
    NotACluster,
    /// No group counts this node.
    NodeNotFound(u64),
    /// The node is the last voter of a group.
    LastVoter(u64),
    /// A group's leader could not make the change (why, and which group).
    ChangeFailed(String),
    /// The ticket key ring holds its most keys (this many): no rotation adds another.
    RingFull(usize),
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        ApiError::Engine(e)
    }
}

impl From<crate::signing::RingStale> for ApiError {
    fn from(e: crate::signing::RingStale) -> ApiError {
        ApiError::RingStale(e)
    }
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> Self {
        ApiError::Engine(EngineError::Rejected(r))
    }
}

/// The parts of a status this process made ([`ErrorParts::into_status`]), kept beside its
/// encoded details (as the status's source), so that nothing here decodes what it just encoded:
/// the gate labels the answer by its kept reason, the HTTP API makes its problem from them.
/// Only statuses this process made have them: a leader's forwarded answer is read from its
/// details. The message is not kept twice: these parts' is empty, the status's own is the one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Kept(ErrorParts);

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.reason.unwrap_or("none"))
    }
}

impl std::error::Error for Kept {}

/// The parts kept beside `s` (their message empty); `None` for a status made elsewhere.
fn kept(s: &Status) -> Option<&ErrorParts> {
    use std::error::Error;
    s.source()?.downcast_ref::<Kept>().map(|k| &k.0)
}

/// The parts a status made by this process was made of (see [`Kept`]); `None` for one made
/// elsewhere.
pub fn parts_kept(s: &Status) -> Option<ErrorParts> {
    Some(ErrorParts {
        message: s.message().to_owned(),
        ..kept(s)?.clone()
    })
}

/// The reason a status made by this process carries (see [`Kept`]); `None` for one made
/// elsewhere, or one without a reason.
pub fn reason_kept(s: &Status) -> Option<&'static str> {
    kept(s)?.reason
}

/// What an error's answer carries, as [`ApiError::parts`] makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorParts {
    /// The gRPC code.
    pub code: Code,
    /// The `ErrorInfo` reason (`None`: a status without details, `UNAUTHENTICATED` and
    /// `PERMISSION_DENIED` of the gate).
    pub reason: Option<&'static str>,
    /// For humans.
    pub message: String,
    /// The `ErrorInfo` metadata.
    pub metadata: HashMap<String, String>,
    /// The `RetryInfo` delay, if any.
    pub retry_delay: Option<std::time::Duration>,
    /// The `BadRequest` violation (field, why), for `INVALID_REQUEST`.
    pub violation: Option<(String, String)>,
}

fn parts(
    code: Code,
    reason: &'static str,
    message: String,
    metadata: HashMap<String, String>,
) -> ErrorParts {
    ErrorParts {
        code,
        reason: Some(reason),
        message,
        metadata,
        retry_delay: None,
        violation: None,
    }
}

impl ErrorParts {
    /// Parts without details: a code and a message.
    fn bare(code: Code, message: &str) -> ErrorParts {
        ErrorParts {
            code,
            reason: None,
            message: message.to_owned(),
            metadata: HashMap::new(),
            retry_delay: None,
            violation: None,
        }
    }

    /// A rejection's parts (for an `INVALID_REQUEST` the `BadRequest` adds the field's
    /// violation).
    pub fn of_rejection(r: &Rejection) -> ErrorParts {
        let (code, reason, message, meta) = rejection_parts(r);
        let mut p = parts(code, reason, message, meta);
        if let Rejection::InvalidRequest { field, reason: why } = r {
            p.violation = Some((field.clone(), why.clone()));
        }
        p
    }

    /// The gRPC status: `ErrorInfo` (domain `boxoffice`), and `RetryInfo` and `BadRequest`
    /// where the parts have them, with the parts kept beside it (see [`Kept`]).
    pub fn into_status(self) -> Status {
        let ErrorParts {
            code,
            reason,
            message,
            metadata,
            retry_delay,
            violation,
        } = self;
        let kept = Kept(ErrorParts {
            code,
            reason,
            message: String::new(),
            metadata: metadata.clone(),
            retry_delay,
            violation: violation.clone(),
        });
        let mut s = match reason {
            None => Status::new(code, message),
            Some(reason) if metadata.is_empty() && retry_delay.is_none() && violation.is_none() => {
                plain_status(code, reason, message)
            }
            Some(reason) => {
                let mut details = ErrorDetails::with_error_info(reason, DOMAIN, metadata);
                if let Some(delay) = retry_delay {
                    details.set_retry_info(Some(delay));
                }
                if let Some((field, why)) = violation {
                    details.add_bad_request_violation(field, why);
                }
                Status::with_error_details(code, message, details)
            }
        };
        s.set_source(std::sync::Arc::new(kept));
        s
    }
}

/// A status whose `ErrorInfo` has no metadata: the same refusal (`SOLD_OUT`, most answers of a
/// sale) is the same bytes every time, so its encoded details are made once and shared (up to
/// [`PLAIN_MESSAGES_MAX`] distinct messages for one code and reason; past them each is encoded
/// as usual). A known one costs no copy of its reason or message.
fn plain_status(code: Code, reason: &'static str, message: String) -> Status {
    type Memo = dashmap::DashMap<(i32, &'static str), Vec<(String, bytes::Bytes)>>;
    static MEMO: std::sync::LazyLock<Memo> = std::sync::LazyLock::new(Memo::default);
    let key = (code as i32, reason);
    let full = match MEMO.get(&key) {
        Some(known) => {
            if let Some((_, details)) = known.iter().find(|(m, _)| *m == message) {
                return Status::with_details(code, message, details.clone());
            }
            known.len() >= PLAIN_MESSAGES_MAX
        }
        None => false,
    };
    let details = ErrorDetails::with_error_info(reason, DOMAIN, HashMap::new());
    let s = Status::with_error_details(code, message, details);
    // A full list is not written to (nor locked for writing) again.
    if !full {
        let mut known = MEMO.entry(key).or_default();
        if known.len() < PLAIN_MESSAGES_MAX && !known.iter().any(|(m, _)| m == s.message()) {
            known.push((s.message().to_owned(), s.details().to_vec().into()));
        }
    }
    s
}

/// Most distinct messages of one code and reason whose metadata-free status [`plain_status`]
/// keeps encoded (a message naming the request's own ids is never the same twice).
const PLAIN_MESSAGES_MAX: usize = 16;

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
        | Rejection::PlacesAvailable
        | Rejection::SalePaused
        | Rejection::SaleEnded
        | Rejection::CancellationClosed
        | Rejection::TransfersDisabled
        | Rejection::AccessCodeRequired
        | Rejection::AccessCodeInvalid => Code::FailedPrecondition,
        Rejection::AccessCodeExhausted => Code::ResourceExhausted,
        Rejection::TicketNotActive(ticket) => {
            meta.insert("ticket_id".to_owned(), ticket.clone());
            Code::FailedPrecondition
        }
        Rejection::IdempotencyKeyInFlight => Code::Aborted,
        Rejection::HoldCooldown { until_ms } => {
            meta.insert("until_unix_ms".to_owned(), until_ms.to_string());
            Code::FailedPrecondition
        }
        Rejection::UserLimit { limit, used } => {
            meta.insert("limit".to_owned(), limit.to_string());
            meta.insert("used".to_owned(), used.to_string());
            Code::ResourceExhausted
        }
    };
    (code, reason, message, meta)
}

impl ApiError {
    /// What this error's answer carries: one table for every face (a gRPC status, a batch
    /// item's error, an HTTP problem), so none of them decodes another's encoding.
    // Over 70 lines: one arm per error, so the whole mapping to codes and reasons is one table.
    pub fn parts(&self) -> ErrorParts {
        let none = HashMap::new;
        match self.clone() {
            ApiError::Engine(EngineError::Rejected(r)) => ErrorParts::of_rejection(&r),
            ApiError::Engine(EngineError::Overloaded(what)) | ApiError::Overloaded(what) => {
                let mut p = parts(
                    Code::ResourceExhausted,
                    "OVERLOADED",
                    format!("overloaded ({what}); back off and retry"),
                    none(),
                );
                p.retry_delay = Some(crate::limits::OVERLOADED_RETRY_DELAY);
                p
            }
            ApiError::Engine(EngineError::NotReady) | ApiError::NotReady => parts(
                Code::Unavailable,
                "NOT_READY",
                "not ready: recovering or shutting down".into(),
                none(),
            ),
            ApiError::RingStale(stale) => parts(
                Code::Unavailable,
                "NOT_READY",
                format!("not ready: {stale}"),
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
                parts(
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
                parts(
                    code,
                    why,
                    format!("{reason}; retry the confirm with the same payment token"),
                    none(),
                )
            }
            ApiError::TokenInvalid(what) => parts(
                Code::Unauthenticated,
                "TOKEN_INVALID",
                format!("{what} is invalid"),
                none(),
            ),
            ApiError::TokenExpired => parts(
                Code::Unauthenticated,
                "TOKEN_EXPIRED",
                "the admission window is over".into(),
                none(),
            ),
            ApiError::NotAdmitted => parts(
                Code::PermissionDenied,
                "NOT_ADMITTED",
                "not admitted yet: keep polling the waiting room".into(),
                none(),
            ),
            ApiError::QueueFull => parts(
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
                parts(
                    Code::FailedPrecondition,
                    e.reason(),
                    message.to_owned(),
                    none(),
                )
            }
            ApiError::Unauthenticated => ErrorParts::bare(
                Code::Unauthenticated,
                "missing or unknown API key: send `authorization: Bearer <key>`",
            ),
            ApiError::PermissionDenied => ErrorParts::bare(
                Code::PermissionDenied,
                "this RPC needs an admin key (the change stream: an admin or stream key)",
            ),
            ApiError::Cluster(r) => cluster_parts(r),
            ApiError::CursorExpired(oldest) => parts(
                Code::OutOfRange,
                "CURSOR_EXPIRED",
                format!(
                    "the cursor is older than the change stream keeps: resume from the oldest \
                     cursor served ({oldest}), or from the start with an empty cursor"
                ),
                HashMap::from([("oldest_cursor".to_owned(), oldest)]),
            ),
            ApiError::CursorInvalid(why) => parts(
                Code::InvalidArgument,
                "CURSOR_INVALID",
                why,
                HashMap::from([("field".to_owned(), "after_cursor".to_owned())]),
            ),
            ApiError::SeatMapTooLarge {
                event_id,
                size,
                limit,
            } => parts(
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

/// What a [`ClusterRefusal`]'s answer carries.
fn cluster_parts(r: ClusterRefusal) -> ErrorParts {
    let node = |id: u64| HashMap::from([("node_id".to_owned(), id.to_string())]);
    match r {
        ClusterRefusal::NotACluster => parts(
            Code::FailedPrecondition,
            "NOT_A_CLUSTER",
            "this server is a single node: it has no cluster to show or change".into(),
            HashMap::new(),
        ),
        ClusterRefusal::NodeNotFound(id) => parts(
            Code::NotFound,
            "NODE_NOT_FOUND",
            format!("no group of this cluster counts node {id}"),
            node(id),
        ),
        ClusterRefusal::LastVoter(id) => parts(
            Code::FailedPrecondition,
            "LAST_VOTER",
            format!("node {id} is the last voter of a group: add another node first"),
            node(id),
        ),
        ClusterRefusal::ChangeFailed(why) => parts(
            Code::Unavailable,
            "MEMBERSHIP_CHANGE_FAILED",
            format!("the change was not made everywhere: {why}; retry the same call"),
            HashMap::new(),
        ),
        ClusterRefusal::RingFull(keys) => parts(
            Code::FailedPrecondition,
            "TICKET_RING_FULL",
            format!(
                "the cluster's ticket key ring holds {keys} keys, its most: no rotation adds \
                 another"
            ),
            HashMap::new(),
        ),
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        e.parts().into_status()
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
        ApiError::RingStale(crate::signing::RingStale {
            created_at_ms: 0,
            fresh_until_ms: 0,
        }),
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
        ApiError::Cluster(ClusterRefusal::NotACluster),
        ApiError::Cluster(ClusterRefusal::NodeNotFound(0)),
        ApiError::Cluster(ClusterRefusal::LastVoter(0)),
        ApiError::Cluster(ClusterRefusal::ChangeFailed(String::new())),
        ApiError::Cluster(ClusterRefusal::RingFull(0)),
        ApiError::CursorExpired(String::new()),
        ApiError::CursorInvalid(String::new()),
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
    fn the_reason_kept_beside_a_status_is_the_one_its_details_carry() {
        let mut with_reason = 0;
        for e in every_error() {
            let s = Status::from(e.clone());
            assert_eq!(reason_kept(&s), reason_of(&s).as_deref(), "{e:?}");
            with_reason += usize::from(reason_kept(&s).is_some());
        }
        assert!(with_reason > 30, "{with_reason}");
        // A status made elsewhere (a leader's, read back from its headers) has none kept.
        let s = Status::from(ApiError::from(Rejection::SoldOut));
        let read = Status::from_header_map(s.clone().into_http::<tonic::body::Body>().headers());
        assert_eq!(read.as_ref().and_then(reason_kept), None);
        assert_eq!(
            read.as_ref().and_then(reason_of).as_deref(),
            Some("SOLD_OUT")
        );
    }

    #[test]
    fn the_parts_kept_beside_a_status_are_those_it_was_made_of() {
        // Twice each: the second of a plain status is the memo's, and must carry the same code,
        // message and decoded details (the detail bytes are compared in the test below).
        for e in every_error().into_iter().chain(every_error()) {
            let s = Status::from(e.clone());
            let again = e.parts().into_status();
            assert_eq!(parts_kept(&s), Some(e.parts()), "{e:?}");
            assert_eq!(s.message(), e.parts().message, "{e:?}");
            let answer = |s: &Status| {
                let d = s.get_error_details();
                let info = d
                    .error_info()
                    .map(|i| (i.reason.clone(), i.metadata.clone()));
                let delay = d.retry_info().map(|r| r.retry_delay);
                let violations = d.bad_request().map(|b| {
                    let v = b.field_violations.iter();
                    v.map(|v| (v.field.clone(), v.description.clone()))
                        .collect::<Vec<_>>()
                });
                (s.code(), s.message().to_owned(), info, delay, violations)
            };
            assert_eq!(answer(&s), answer(&again), "{e:?}");
        }
    }

    #[test]
    fn a_plain_status_from_the_memo_is_the_one_encoded_afresh() {
        // One reason, many messages: each keeps its own details (they carry the message).
        for _ in 0..2 {
            for size in 0..(PLAIN_MESSAGES_MAX + 4) {
                let message = format!("message {size}");
                let s = plain_status(Code::ResourceExhausted, "MEMO_TEST", message.clone());
                let details = ErrorDetails::with_error_info("MEMO_TEST", DOMAIN, HashMap::new());
                let fresh = Status::with_error_details(Code::ResourceExhausted, &message, details);
                assert_eq!((s.message(), s.details()), (&*message, fresh.details()));
            }
        }
    }

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
            (Rejection::SalePaused, Code::FailedPrecondition),
            (Rejection::SaleEnded, Code::FailedPrecondition),
            (
                Rejection::HoldCooldown { until_ms: 5 },
                Code::FailedPrecondition,
            ),
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
            ApiError::Cluster(ClusterRefusal::NotACluster) => 16,
            ApiError::Cluster(ClusterRefusal::NodeNotFound(_)) => 17,
            ApiError::Cluster(ClusterRefusal::LastVoter(_)) => 18,
            ApiError::Cluster(ClusterRefusal::ChangeFailed(_)) => 19,
            ApiError::RingStale(_) => 20,
            ApiError::Cluster(ClusterRefusal::RingFull(_)) => 21,
            ApiError::CursorExpired(_) => 22,
            ApiError::CursorInvalid(_) => 23,
        }
    }

    #[test]
    fn every_error_kind_is_listed() {
        let mut seen: Vec<usize> = every_error().iter().map(kind).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, (0..24).collect::<Vec<_>>());
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
        let foreign = parts(
            Code::FailedPrecondition,
            "SOMEONE_ELSES_REASON",
            String::new(),
            HashMap::new(),
        )
        .into_status();
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
