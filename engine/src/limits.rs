//! Every limit (`*_MAX`) and default of the engine and the sweeper, in one place, with the
//! relations between them checked when the crate compiles.
//!
//! Limits bound what a caller may ask for (and so the work and memory one request can cost);
//! defaults are what a zero or missing value means. The gateway's own limits (message size,
//! token length, page sizes) are in the gateway's `limits` module, checked against these.

// ---- Caller input -------------------------------------------------------------------------

/// Longest accepted event, section or user id, in bytes.
pub const ID_LEN_MAX: usize = 64;
/// Longest accepted row label, in bytes.
pub const ROW_LABEL_LEN_MAX: usize = 16;
/// Longest accepted idempotency key, in bytes.
pub const IDEMPOTENCY_KEY_LEN_MAX: usize = 128;
/// Longest accepted payment token, in bytes.
pub const PAYMENT_TOKEN_LEN_MAX: usize = 256;
/// Most sections one event may have.
pub const SECTIONS_PER_EVENT_MAX: usize = 256;
/// Most rows one reserved section may have.
pub const ROWS_PER_SECTION_MAX: usize = 1_000;
/// Most seats one row may have.
pub const SEATS_PER_ROW_MAX: u32 = 1_000;
/// Most places one section may have (reserved or general admission).
pub const SECTION_CAPACITY_MAX: u32 = 1_000_000;
/// Most price tiers one section may have.
pub const PRICE_TIERS_PER_SECTION_MAX: usize = 16;
/// Highest price of one place, in cents (one million in whole units).
pub const PRICE_CENTS_MAX: u64 = 100_000_000;
/// Highest per-user limit an event may set.
pub const PER_USER_LIMIT_MAX: u32 = 100;
/// Most places one hold may take.
pub const PLACES_PER_HOLD_MAX: u32 = 100;
/// Longest hold TTL an event may set (one day).
pub const HOLD_TTL_MS_MAX: u64 = 24 * 60 * 60 * 1000;
/// Highest proof-of-work difficulty an event may ask of a `Join`, in leading zero bits of a
/// SHA-256 (about 4 billion hashes for a fan: minutes of a core).
pub const JOIN_POW_DIFFICULTY_BITS_MAX: u32 = 32;

// ---- Event defaults (a zero in the spec means these) ----------------------------------------

/// Default hold TTL: ten minutes, as the seeds ask.
pub const HOLD_TTL_MS_DEFAULT: u64 = 600_000;
/// Default per-user limit per event.
pub const PER_USER_LIMIT_DEFAULT: u32 = 4;
/// Default admission rate of the waiting room.
pub const ADMIT_RATE_PER_SECOND_DEFAULT: u32 = 500;
/// Default admission window.
pub const ADMISSION_WINDOW_MS_DEFAULT: u64 = 120_000;

// ---- Engine defaults ([`crate::EngineConfig::new`]) --------------------------------------------

/// Default number of ledger shard actors.
pub const LEDGER_SHARDS_DEFAULT: usize = 4;
/// Default bound of messages queued for one section actor (past it: `Overloaded`).
pub const SECTION_INFLIGHT_MAX_DEFAULT: usize = 10_000;
/// Default number of records a stream writes between checkpoints.
pub const CHECKPOINT_EVERY_RECORDS_DEFAULT: u64 = 100_000;
/// Default bound of fans waiting on one event's waitlist (past it: `QUEUE_FULL`).
pub const WAITLIST_MAX_DEFAULT: usize = 100_000;
/// Most times one actor is restarted after a panic before the engine stops instead.
pub const ACTOR_RESTARTS_MAX: u32 = 5;

// ---- Retention ([`crate::retention`]) -----------------------------------------------------------

/// Default idempotency window (Stripe's 24 hours): a key's first answer is replayed for this
/// long after it was given, and a released or expired hold is remembered this long after it
/// ended. After it, both are forgotten.
pub const IDEMPOTENCY_WINDOW_MS_DEFAULT: u64 = 24 * 60 * 60 * 1000;

/// How long the change stream keeps a change by default (`--change-retention-seconds`).
pub const CHANGE_RETENTION_MS_DEFAULT: u64 = 24 * 60 * 60 * 1000;
/// Shortest idempotency window a configuration may set (one second: soaks and tests).
pub const IDEMPOTENCY_WINDOW_MS_MIN: u64 = 1_000;
/// Longest idempotency window a configuration may set (30 days).
pub const IDEMPOTENCY_WINDOW_MS_MAX: u64 = 30 * 24 * 60 * 60 * 1000;
/// Most ended holds a section forgets, or idempotency answers a ledger shard forgets, in one
/// step (bounded work per record or request).
pub const FORGET_PER_STEP_MAX: usize = 64;

// ---- Bounded work per step --------------------------------------------------------------------

/// Most jobs the flusher takes into one batch (one fsync).
pub const FLUSH_BATCH_JOBS_MAX: usize = 8_192;
/// Most replies, or records, a section actor gathers into one log job before it hands the job on (a long
/// mailbox run is cut into batches of at most this many messages).
pub const SECTION_BATCH_REPLIES_MAX: usize = 1_024;
/// Most holds one expiry call expires per section (bounded work per call).
pub const EXPIRE_PER_SECTION_MAX: usize = 1_024;
/// Under sustained load, a section sets its mailbox depth gauge at least every this many messages.
pub const DEPTH_GAUGE_EVERY_MESSAGES: u32 = 256;

// ---- Sweeper defaults ----------------------------------------------------------------------

/// Most sections the sweeper expires in one step before yielding to other messages.
pub const SWEEP_SECTIONS_PER_TICK_DEFAULT: usize = 64;
/// Most holds the sweeper expires per section per call.
pub const SWEEP_EXPIRE_PER_CALL_DEFAULT: usize = 256;
/// Most waiting entries the sweeper tries per offer pass.
pub const SWEEP_OFFERS_PER_PASS_DEFAULT: usize = 16;
/// The sweeper's safety-net sweep period, in ms.
pub const SWEEP_RECHECK_MS_DEFAULT: u64 = 500;

// ---- How they relate -----------------------------------------------------------------------

const _: () = {
    // Defaults are themselves valid values.
    assert!(HOLD_TTL_MS_DEFAULT > 0 && HOLD_TTL_MS_DEFAULT <= HOLD_TTL_MS_MAX);
    assert!(PER_USER_LIMIT_DEFAULT > 0 && PER_USER_LIMIT_DEFAULT <= PER_USER_LIMIT_MAX);
    assert!(ADMIT_RATE_PER_SECOND_DEFAULT > 0);
    assert!(ADMISSION_WINDOW_MS_DEFAULT > 0);
    // A fan at the highest per-user limit can still take it in one hold.
    assert!(PER_USER_LIMIT_MAX <= PLACES_PER_HOLD_MAX);
    // A reserved section at its largest row count and row length fits a section's capacity.
    assert!(ROWS_PER_SECTION_MAX as u64 * SEATS_PER_ROW_MAX as u64 <= SECTION_CAPACITY_MAX as u64);
    // A hold's places fit any section that could take them.
    assert!(PLACES_PER_HOLD_MAX <= SECTION_CAPACITY_MAX);
    // Ids of holds and orders (`{event}.{section}.h{ulid}`) stay well inside a message.
    assert!(2 * ID_LEN_MAX + 32 < 1024);
    // The sweeper never asks a section for more than one call may expire.
    assert!(SWEEP_EXPIRE_PER_CALL_DEFAULT <= EXPIRE_PER_SECTION_MAX);
    // One expiry call's records fit one flush batch.
    assert!(EXPIRE_PER_SECTION_MAX <= FLUSH_BATCH_JOBS_MAX);
    // A section's queue bound leaves room for at least one gauge period.
    assert!(SECTION_INFLIGHT_MAX_DEFAULT >= DEPTH_GAUGE_EVERY_MESSAGES as usize);
    // The safety-net sweep comes well within the shortest sensible TTL (one second).
    assert!(SWEEP_RECHECK_MS_DEFAULT < 1_000);
    // A checkpoint period is at least a full flush batch (else checkpoints dominate the log).
    assert!(CHECKPOINT_EVERY_RECORDS_DEFAULT >= FLUSH_BATCH_JOBS_MAX as u64);
    assert!(LEDGER_SHARDS_DEFAULT > 0 && WAITLIST_MAX_DEFAULT > 0 && ACTOR_RESTARTS_MAX > 0);
    // The default idempotency window is a valid window.
    assert!(IDEMPOTENCY_WINDOW_MS_MIN > 0);
    assert!(IDEMPOTENCY_WINDOW_MS_MIN <= IDEMPOTENCY_WINDOW_MS_DEFAULT);
    assert!(IDEMPOTENCY_WINDOW_MS_DEFAULT <= IDEMPOTENCY_WINDOW_MS_MAX);
    // With the default window, a hold's key replays for the whole life of the longest hold.
    assert!(IDEMPOTENCY_WINDOW_MS_DEFAULT >= HOLD_TTL_MS_MAX);
    // Every record or request adds at most one thing to forget: forgetting more than one per
    // step catches up with any backlog.
    assert!(FORGET_PER_STEP_MAX > 1);
};
