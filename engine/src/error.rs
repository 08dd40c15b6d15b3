//! Errors. Business rejections ([`Rejection`]) are definite answers: the request had no effect, and
//! they can be stored as the first answer of an idempotency key. Fatal and transient conditions
//! (storage failure, overload, not ready) are kept apart in [`EngineError`].

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::ids::SeatId;

/// A definite "no": the request was understood and refused, and nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Error, Serialize, Deserialize)]
pub enum Rejection {
    /// A field is missing, malformed or out of range.
    #[error("invalid request: {field}: {reason}")]
    InvalidRequest {
        /// The field, as the API names it (`sections[0].name`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No such event.
    #[error("event not found")]
    EventNotFound,
    /// No such section in the event.
    #[error("section not found")]
    SectionNotFound,
    /// No such seat in the section.
    #[error("seat not found: {0}")]
    SeatNotFound(SeatId),
    /// No such hold (or it belongs to another user).
    #[error("hold not found")]
    HoldNotFound,
    /// No such order.
    #[error("order not found")]
    OrderNotFound,
    /// No such waitlist entry.
    #[error("waitlist entry not found")]
    EntryNotFound,
    /// The waitlist is at its maximum length.
    #[error("the waitlist is full")]
    QueueFull,
    /// The event id is taken.
    #[error("event exists")]
    EventExists,
    /// Before the sale opens.
    #[error("sale not open")]
    SaleNotOpen,
    /// Not enough places left in the requested section(s).
    #[error("sold out")]
    SoldOut,
    /// An exact seat asked for is held or sold.
    #[error("seat unavailable: {0}")]
    SeatUnavailable(SeatId),
    /// The hold's TTL ran out.
    #[error("hold expired")]
    HoldExpired,
    /// The hold was released or confirmed already.
    #[error("hold not active")]
    HoldNotActive,
    /// The payment provider refused.
    #[error("payment declined")]
    PaymentDeclined,
    /// The idempotency key was used before with a different request.
    #[error("idempotency key reused with a different request")]
    IdempotencyKeyReused,
    /// The idempotency key's first request is still running.
    #[error("idempotency key in flight")]
    IdempotencyKeyInFlight,
    /// The user would hold or own more than the event's limit.
    #[error("user limit: {limit} places per event, {used} already held or owned")]
    UserLimit {
        /// The event's per-user limit.
        limit: u32,
        /// Places the user held or owned when asking.
        used: u32,
    },
    /// `JoinWaitlist` while the places wanted are free to hold (kept last: rejections are
    /// stored as idempotency answers, encoded by variant index).
    #[error("places available: hold them instead of joining the waitlist")]
    PlacesAvailable,
    /// The sale is paused by an operator: no new holds or joins until it goes on.
    #[error("the sale is paused")]
    SalePaused,
    /// The sale has ended: no more holds or joins.
    #[error("the sale has ended")]
    SaleEnded,
    /// A hold of this user for this event expired less than the event's hold cool-down ago.
    #[error("a hold of yours expired: hold again from {until_ms} (Unix ms)")]
    HoldCooldown {
        /// When the user may hold again, ms since the Unix epoch.
        until_ms: u64,
    },
    /// A ticket named was given back (or moved to another fan) already.
    #[error("ticket {0} is no longer valid: it was given back already")]
    TicketNotActive(String),
    /// The event's tickets can no longer be given back: its cancellation deadline passed, or
    /// it takes no cancellations.
    #[error("this event's tickets can no longer be cancelled")]
    CancellationClosed,
    /// The event's tickets cannot be moved to another fan (switched off at its creation).
    #[error("this event's tickets cannot be transferred")]
    TransfersDisabled,
    /// The section sells only to holders of an access code (a presale), and none was given.
    #[error("this section needs an access code now")]
    AccessCodeRequired,
    /// The access code is not one of the event's, is outside its time window, or does not
    /// unlock this section.
    #[error("the access code is not valid here or now")]
    AccessCodeInvalid,
    /// The access code has no uses left for this many places.
    #[error("the access code has no uses left for this hold")]
    AccessCodeExhausted,
}

impl Rejection {
    /// An `InvalidRequest` naming `field`.
    pub fn invalid(field: &str, reason: impl Into<String>) -> Rejection {
        Rejection::InvalidRequest {
            field: field.to_owned(),
            reason: reason.into(),
        }
    }

    /// The field named by an `InvalidRequest`.
    pub fn field(&self) -> Option<&str> {
        match self {
            Rejection::InvalidRequest { field, .. } => Some(field),
            _ => None,
        }
    }

    /// One rejection of every kind (with placeholder data): the bounded set of reasons the
    /// engine can answer, for the API's list of reasons and for metrics labels made ready
    /// before the first one happens. `every_kind_is_listed` checks that none is missing.
    pub fn every() -> Vec<Rejection> {
        let seat = SeatId::from("section:A:1");
        vec![
            Rejection::invalid("request", "example"),
            Rejection::EventNotFound,
            Rejection::SectionNotFound,
            Rejection::SeatNotFound(seat.clone()),
            Rejection::HoldNotFound,
            Rejection::OrderNotFound,
            Rejection::EntryNotFound,
            Rejection::QueueFull,
            Rejection::EventExists,
            Rejection::SaleNotOpen,
            Rejection::SoldOut,
            Rejection::SeatUnavailable(seat),
            Rejection::HoldExpired,
            Rejection::HoldNotActive,
            Rejection::PaymentDeclined,
            Rejection::IdempotencyKeyReused,
            Rejection::IdempotencyKeyInFlight,
            Rejection::UserLimit { limit: 1, used: 1 },
            Rejection::PlacesAvailable,
            Rejection::SalePaused,
            Rejection::SaleEnded,
            Rejection::HoldCooldown { until_ms: 1 },
            Rejection::TicketNotActive("o.1".into()),
            Rejection::CancellationClosed,
            Rejection::TransfersDisabled,
            Rejection::AccessCodeRequired,
            Rejection::AccessCodeInvalid,
            Rejection::AccessCodeExhausted,
        ]
    }

    /// The API's reason code (`SOLD_OUT`, ...), as `google.rpc.ErrorInfo.reason` carries it.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::InvalidRequest { .. } => "INVALID_REQUEST",
            Rejection::EventNotFound => "EVENT_NOT_FOUND",
            Rejection::SectionNotFound => "SECTION_NOT_FOUND",
            Rejection::SeatNotFound(_) => "SEAT_NOT_FOUND",
            Rejection::HoldNotFound => "HOLD_NOT_FOUND",
            Rejection::OrderNotFound => "ORDER_NOT_FOUND",
            Rejection::EntryNotFound => "ENTRY_NOT_FOUND",
            Rejection::QueueFull => "QUEUE_FULL",
            Rejection::EventExists => "EVENT_EXISTS",
            Rejection::SaleNotOpen => "SALE_NOT_OPEN",
            Rejection::SoldOut => "SOLD_OUT",
            Rejection::SeatUnavailable(_) => "SEAT_UNAVAILABLE",
            Rejection::HoldExpired => "HOLD_EXPIRED",
            Rejection::HoldNotActive => "HOLD_NOT_ACTIVE",
            Rejection::PaymentDeclined => "PAYMENT_DECLINED",
            Rejection::IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED",
            Rejection::IdempotencyKeyInFlight => "IDEMPOTENCY_KEY_IN_FLIGHT",
            Rejection::UserLimit { .. } => "USER_LIMIT",
            Rejection::PlacesAvailable => "PLACES_AVAILABLE",
            Rejection::SalePaused => "SALE_PAUSED",
            Rejection::SaleEnded => "SALE_ENDED",
            Rejection::HoldCooldown { .. } => "HOLD_COOLDOWN",
            Rejection::TicketNotActive(_) => "TICKET_NOT_ACTIVE",
            Rejection::CancellationClosed => "CANCELLATION_CLOSED",
            Rejection::TransfersDisabled => "TRANSFERS_DISABLED",
            Rejection::AccessCodeRequired => "ACCESS_CODE_REQUIRED",
            Rejection::AccessCodeInvalid => "ACCESS_CODE_INVALID",
            Rejection::AccessCodeExhausted => "ACCESS_CODE_EXHAUSTED",
        }
    }
}

/// Why the log could not be written or read. Storage errors stop the node (fail-stop): nothing
/// is acknowledged after one.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum StorageError {
    /// sled reported an IO error (write or flush).
    #[error("log write failed: {0}")]
    Io(String),
    /// The engine stopped accepting writes after an earlier storage failure.
    #[error("the engine stopped: {0}")]
    Halted(String),
    /// The sold-seat backstop refused a second sale of one seat: an engine bug was caught.
    #[error("backstop refused a second sale of {key}")]
    BackstopRefused {
        /// The sold-seat key (`event/section/seat`).
        key: String,
    },
    /// A record in the middle of a log stream does not decode: the data dir is damaged.
    #[error("corrupt log record in stream `{stream}` at sequence {seq}: {reason}")]
    Corrupt {
        /// The stream (sled tree) name.
        stream: String,
        /// The record's sequence number in that stream.
        seq: u64,
        /// What failed (checksum, version, decoding).
        reason: String,
    },
    /// Recovery found the log damaged (records missing or corrupt, claims that disagree) and
    /// refused to start; nothing was changed. The summary names streams and sequence numbers.
    #[error("start refused: the log is damaged ({count} found): {summary}{}", evidence.as_ref().map(|e| format!("; the log's files as they were before this start are kept in {e}")).unwrap_or_default())]
    Damaged {
        /// How many problems were found.
        count: usize,
        /// The first few, named.
        summary: String,
        /// Where the log's files are kept as they were before this start (sled rewrites a
        /// damaged tail when it opens), if the sink keeps such a copy.
        evidence: Option<String>,
    },
    /// Opening the data dir failed.
    #[error("cannot open data dir {path}: {reason}")]
    Open {
        /// The data dir.
        path: String,
        /// sled's message.
        reason: String,
    },
}

/// Anything the engine can answer instead of a result.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum EngineError {
    /// A definite business rejection; nothing changed.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// Too much work in flight for that section (or the ledger); shed before doing anything.
    #[error("overloaded: {0}")]
    Overloaded(&'static str),
    /// The engine is recovering or shutting down.
    #[error("not ready")]
    NotReady,
    /// The log could not be made durable; nothing was acknowledged. Fatal.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The payment provider did not answer in time (`timeout`) or failed: no order was made;
    /// a retry with the same payment token picks up the charge's real outcome.
    #[error("payment provider unavailable: {reason}")]
    PaymentUnavailable {
        /// Whether it timed out (rather than failed).
        timeout: bool,
        /// What happened.
        reason: String,
    },
}

impl EngineError {
    /// The rejection, if this is a definite business answer.
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            EngineError::Rejected(r) => Some(r),
            _ => None,
        }
    }
}

/// The one answer of a call made for one item (a batch of one). No answer at all (never the
/// case: every call answers each item) is `NOT_READY`.
pub(crate) fn only<T>(mut answers: Vec<Result<T, EngineError>>) -> Result<T, EngineError> {
    answers.pop().unwrap_or(Err(EngineError::NotReady))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The position of a rejection's kind; exhaustive, so a new kind must be placed here, and
    /// the test below then fails until [`Rejection::every`] lists it too.
    fn kind(r: &Rejection) -> usize {
        match r {
            Rejection::InvalidRequest { .. } => 0,
            Rejection::EventNotFound => 1,
            Rejection::SectionNotFound => 2,
            Rejection::SeatNotFound(_) => 3,
            Rejection::HoldNotFound => 4,
            Rejection::OrderNotFound => 5,
            Rejection::EntryNotFound => 6,
            Rejection::QueueFull => 7,
            Rejection::EventExists => 8,
            Rejection::SaleNotOpen => 9,
            Rejection::SoldOut => 10,
            Rejection::SeatUnavailable(_) => 11,
            Rejection::HoldExpired => 12,
            Rejection::HoldNotActive => 13,
            Rejection::PaymentDeclined => 14,
            Rejection::IdempotencyKeyReused => 15,
            Rejection::IdempotencyKeyInFlight => 16,
            Rejection::UserLimit { .. } => 17,
            Rejection::PlacesAvailable => 18,
            Rejection::SalePaused => 19,
            Rejection::SaleEnded => 20,
            Rejection::HoldCooldown { .. } => 21,
            Rejection::TicketNotActive(_) => 22,
            Rejection::CancellationClosed => 23,
            Rejection::TransfersDisabled => 24,
            Rejection::AccessCodeRequired => 25,
            Rejection::AccessCodeInvalid => 26,
            Rejection::AccessCodeExhausted => 27,
        }
    }

    #[test]
    fn every_kind_is_listed() {
        let mut seen: Vec<usize> = Rejection::every().iter().map(kind).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..28).collect::<Vec<_>>());
    }
}
