//! Every limit and default of the gateway, in one place, with the relations between them (and
//! with the engine's [`boxoffice_engine::limits`]) checked when the crate compiles.

use std::time::Duration;

use boxoffice_engine::limits::ID_LEN_MAX;

/// Largest request message the server decodes (a larger one is `INVALID_REQUEST`).
pub const MESSAGE_BYTES_MAX: usize = 256 * 1024;
/// Longest text of a required string field the edge accepts (ids, keys), in bytes.
pub const FIELD_LEN_MAX: usize = 256;
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
    // More calls may wait in the gate than one connection carries, so shedding is the gate's
    // answer and not HTTP/2 flow control's.
    assert!(IN_FLIGHT_MAX_DEFAULT >= STREAMS_PER_CONNECTION_MAX as usize);
    assert!(QUEUE_MAX_DEFAULT > 0);
    assert!(JOIN_CHALLENGE_TTL_MS_DEFAULT > 0);
    // A rotation needs room for the old key and the new one.
    assert!(TICKET_KEYS_MAX >= 2);
};
