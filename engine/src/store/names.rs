//! The names of the log's streams and tables, in one place.
//!
//! | stream / table | what it holds |
//! |---|---|
//! | `catalog` | `CatalogRecord`s: events created |
//! | `section/{event}/{section}` | one section's `SectionRecord`s |
//! | `ledger/{shard}` | a ledger shard's `LedgerRecord`s (rejections given as first answers) |
//! | `waitlist` | `WaitlistRecord`s |
//! | `room/{event}` | an event's waiting room's `RoomRecord`s (reservations, opening, admissions) |
//! | `changes` | `ChangeRecord`s: what each group commit changed, for `WatchChanges` |
//! | checkpoints (per stream) | the stream's state up to a sequence number |
//! | claims (`sold`) | `{event}/{section}/{seat}` (GA: `#{n}`) -> hold id: the sold-seat backstop |
//! | `sold_set_aside` | claims recovery proved were never acknowledged, kept as evidence |
//! | `superblock.0`, `superblock.1` (files beside sled's) | each stream's high-water mark |
//! | `raft_log`, `raft_meta`, `raft_sm` (a cluster node only) | its Raft log, vote, applied state |
//!
//! Record keys are sequence numbers (u64 big-endian in sled).

use crate::ids::{EventId, SectionId};

/// The catalog stream.
pub const CATALOG: &str = "catalog";
/// The waitlist stream.
pub const WAITLIST: &str = "waitlist";
/// Prefix of the ledger shards' streams (`ledger/{shard}`).
pub const LEDGER_PREFIX: &str = "ledger/";
/// Prefix of the sections' streams (`section/{event}/{section}`).
pub const SECTION_PREFIX: &str = "section/";
/// Prefix of the waiting rooms' streams (`room/{event}`, see [`crate::rooms`]).
pub const ROOM_PREFIX: &str = "room/";
/// The change stream (`crate::changes`): one record per group commit (or part of one), each
/// the changes its records made, written by the flusher itself.
pub const CHANGES: &str = "changes";
/// The sled tree of every stream's checkpoint, keyed by stream name.
pub const CHECKPOINTS: &str = "checkpoints";
/// The sled tree of the sold-seat backstop's claims.
pub const CLAIMS: &str = "sold";
/// The sled tree of claims set aside by recovery (never deleted).
pub const CLAIMS_SET_ASIDE: &str = "sold_set_aside";
/// The simulated payment provider's trees (by idempotency key, by payment id).
pub const PAYMENTS: &str = "payments";
/// See [`PAYMENTS`].
pub const PAYMENTS_BY_ID: &str = "payments_by_id";
/// A cluster's ticket key ring (group 0's, sealed: the gateway's `node::ring`), one value.
pub const TICKET_RING: &str = "ticket_ring";

/// Prefix of a cluster node's Raft trees (`raft_log`, `raft_meta`, `raft_sm`: see
/// [`crate::raft`]), which share the node's sled database with the log and are not streams.
pub const RAFT_TREES_PREFIX: &str = "raft_";

/// The name of an event's waiting-room stream.
pub fn room(event: &EventId) -> String {
    format!("{ROOM_PREFIX}{event}")
}

/// The name of a section's log stream.
pub fn section(event: &EventId, section: &SectionId) -> String {
    format!("{SECTION_PREFIX}{event}/{section}")
}

/// The name of a ledger shard's log stream.
pub fn ledger(shard: usize) -> String {
    format!("{LEDGER_PREFIX}{shard}")
}

/// The shard number of a ledger stream's name, if it is one.
pub fn ledger_shard(name: &str) -> Option<usize> {
    name.strip_prefix(LEDGER_PREFIX)?.parse().ok()
}
