//! Every limit and default of the gateway, in one place, with the relations between them (and
//! with the engine's [`boxoffice_engine::limits`]) checked when the crate compiles.

use std::time::Duration;

use boxoffice_engine::limits::ID_LEN_MAX;

/// Largest request message the server decodes (a larger one is `INVALID_REQUEST`).
pub const MESSAGE_BYTES_MAX: usize = 256 * 1024;
/// Longest text of a required string field the edge accepts (ids, keys), in bytes.
pub const FIELD_LEN_MAX: usize = 256;
/// Most holds in one `HoldBatch` call (the whole request stays within [`MESSAGE_BYTES_MAX`]).
pub const HOLD_BATCH_ITEMS_MAX: usize = 256;
/// Longest queue or admission token text accepted (a longer one is refused before any work).
pub const TOKEN_LEN_MAX: usize = 512;
/// How long a queue token stays valid (a day: a fan may wait long before an opening).
pub const QUEUE_TOKEN_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// How long a join challenge (the proof of work before `Join`) stays valid by default: five
/// minutes, time for a slow device to solve a hard one.
pub const JOIN_CHALLENGE_TTL_MS_DEFAULT: u64 = 5 * 60 * 1000;
/// Events listed per page when the caller asks for 0.
pub const LIST_PAGE_DEFAULT: usize = 50;
/// Most events listed per page.
pub const LIST_PAGE_MAX: usize = 500;
/// Orders listed per page (`ListOrders`) when the caller asks for 0.
pub const ORDERS_PAGE_DEFAULT: usize = 20;
/// Most orders listed per page (each with its tickets' codes).
pub const ORDERS_PAGE_MAX: usize = 100;
/// How often a waiting room's admission timer admits the next fans.
pub const ADMIT_TICK: Duration = Duration::from_millis(20);
/// Default bound of calls in flight through the gate (past it: `OVERLOADED`).
pub const IN_FLIGHT_MAX_DEFAULT: usize = 4_096;
/// The retry delay an `OVERLOADED` answer suggests (`google.rpc.RetryInfo`): where a client's
/// exponential backoff should start.
pub const OVERLOADED_RETRY_DELAY: Duration = Duration::from_millis(100);
/// Default bound of fans in one waiting room (past it: `QUEUE_FULL`).
pub const QUEUE_MAX_DEFAULT: u32 = 2_000_000;
/// Most ticket keys a data dir's ring holds (the signing key and the retired ones whose tickets
/// still verify); a rotation past it is refused. A code from before key ids is checked against
/// each, so this also bounds that work.
pub const TICKET_KEYS_MAX: usize = 16;
/// HTTP/2 streams one connection may have open at once.
pub const STREAMS_PER_CONNECTION_MAX: u32 = 256;
/// Default largest `GetSeatMap` response, bytes (`serve --seat-map-max-bytes`): a client's
/// default receive limit (4 MiB in grpc-go and tonic). A whole event over it is refused
/// (`SEAT_MAP_TOO_LARGE`); one section is answered in pages of whole rows within it.
pub const SEAT_MAP_BYTES_DEFAULT: usize = 4 * 1024 * 1024;
/// Smallest response limit a server may set: the largest row (1,000 seats with the longest
/// ids and labels) fits in one page.
pub const SEAT_MAP_BYTES_MIN: usize = 256 * 1024;
/// Largest response limit a server may set.
pub const SEAT_MAP_BYTES_MAX: usize = 64 * 1024 * 1024;
/// How long a section's built map is still answered after it was last known true, although
/// the section changed since, ms (a map is reused for less than this): under a flash sale a big section's map is rebuilt at most
/// about once per this, not with every hold. The contract's "a few seconds".
pub const SEAT_MAP_STALENESS_MS_DEFAULT: u64 = 1_000;

/// A section's built seat map that nobody read for this long is dropped (built again by the
/// next read), ms: the maps kept are those in use.
pub const SEAT_MAP_IDLE_MS: u64 = 60_000;

/// Most bytes one seat takes in a seat map: its key and length (3), the id `section:row:n`
/// with the longest ids (64 + 1 + 16 + 1 + 7) and its key and length (2), the row label (16
/// + 2), the number (1 + 3) and the status (2).
const SEAT_IN_MAP_BYTES_MAX: usize = 3 + (64 + 1 + 16 + 1 + 7) + 2 + 16 + 2 + 1 + 3 + 2;

/// Base64 (no padding) length of `n` bytes.
const fn base64_len(n: usize) -> usize {
    (n * 4).div_ceil(3)
}

/// The longest token the server signs (queue and admission tokens, and join challenges): payload
/// `[version][kind][4 x u64][u16 + event][u16 + user]` with the longest ids, then `.` and the
/// base64 of a 32-byte HMAC-SHA256 tag.
pub const TOKEN_SIGNED_LEN_MAX: usize =
    base64_len(1 + 1 + 4 * 8 + 2 + ID_LEN_MAX + 2 + ID_LEN_MAX) + 1 + base64_len(32);

const _: () = {
    // Every token the server hands out is one it accepts back.
    assert!(TOKEN_SIGNED_LEN_MAX <= TOKEN_LEN_MAX);
    // Ids the engine accepts pass the edge's field check.
    assert!(ID_LEN_MAX <= FIELD_LEN_MAX);
    // A request of the longest fields still fits a message.
    assert!(TOKEN_LEN_MAX + 16 * FIELD_LEN_MAX < MESSAGE_BYTES_MAX);
    assert!(LIST_PAGE_DEFAULT > 0 && LIST_PAGE_DEFAULT <= LIST_PAGE_MAX);
    assert!(ORDERS_PAGE_DEFAULT > 0 && ORDERS_PAGE_DEFAULT <= ORDERS_PAGE_MAX);
    // More calls may wait in the gate than one connection carries, so shedding is the gate's
    // answer and not HTTP/2 flow control's.
    assert!(IN_FLIGHT_MAX_DEFAULT >= STREAMS_PER_CONNECTION_MAX as usize);
    assert!(QUEUE_MAX_DEFAULT > 0);
    assert!(JOIN_CHALLENGE_TTL_MS_DEFAULT > 0);
    // A rotation needs room for the old key and the new one.
    assert!(TICKET_KEYS_MAX >= 2);
    // The smallest seat-map page holds the largest row with room for the headers.
    assert!(
        boxoffice_engine::limits::ID_LEN_MAX <= 64
            && boxoffice_engine::limits::ROW_LABEL_LEN_MAX <= 16
            && boxoffice_engine::limits::SEATS_PER_ROW_MAX <= 9_999_999
    );
    assert!(
        SEAT_IN_MAP_BYTES_MAX * boxoffice_engine::limits::SEATS_PER_ROW_MAX as usize + 1_024
            <= SEAT_MAP_BYTES_MIN
    );
    assert!(SEAT_MAP_BYTES_MIN <= SEAT_MAP_BYTES_DEFAULT);
    assert!(SEAT_MAP_BYTES_DEFAULT <= SEAT_MAP_BYTES_MAX);
    // A map is dropped only well after the staleness window.
    assert!(SEAT_MAP_IDLE_MS >= 10 * SEAT_MAP_STALENESS_MS_DEFAULT);
};
/// Seconds a captured charge stays without a sale before the server refunds it (docs/api.md 3.3).
pub const REFUND_GRACE_SECONDS_DEFAULT: u64 = 60;
