//! Linearizable reads and refusals on a cluster leader: an answer that may come from state
//! rather than from a commit of its own is given only once the node is known to have led its
//! group after the answer was made ([`ReadFence`]); otherwise the caller hears `NOT_READY` and
//! retries at the leader. A partitioned old leader so never answers from a state a newer
//! leader has moved on from.
//!
//! Which answers wait:
//! - every answer of the reads ([`ALWAYS`]: `GetEvent`, `ListEvents`, `GetRevocationList`,
//!   `GetHold`, `GetOrder`,
//!   `ListOrders`, `GetWaitlistEntry`, the waiting room's `Join` and `GetStatus`) and of
//!   `HoldBatch`, `JoinWaitlist`, `CancelTickets` and `TransferTickets` (whose answers may
//!   carry refusals, or an entry, a replayed cancellation or transfer read from memory);
//! - every refusal of the other calls (`SOLD_OUT`, `USER_LIMIT`, `SEAT_UNAVAILABLE`, ...).
//!
//! A success of `Hold`, `Confirm`, `Release` or `CreateEvent` does not wait: it was committed by
//! a majority in the leader's term after it was made, or it replays a key's first answer, which
//! was committed and never changes. `GetSeatMap` answers from its shared cache, whose `as_of`
//! says how old it is (docs/api.md); `GetJoinChallenge` reads no state.
//!
//! Both faces pass here: the gRPC calls the forwarding layer serves here through [`held`]
//! ([`crate::node::forward`]), the HTTP API's in-process calls through [`settle`]. A single
//! node has no fence: nothing waits.

use std::future::Future;

use boxoffice_engine::raft::ReadFence;
use tokio::time::Instant;
use tonic::Status;
use tonic::body::Body;

use crate::services::Groups;
use crate::status::ApiError;

/// The calls whose every answer waits (see the module).
pub const ALWAYS: [&str; 14] = [
    "/boxoffice.v1.EventService/GetEvent",
    "/boxoffice.v1.EventService/UpdateSale",
    "/boxoffice.v1.EventService/ListEvents",
    "/boxoffice.v1.EventService/GetRevocationList",
    "/boxoffice.v1.WaitingRoomService/Join",
    "/boxoffice.v1.WaitingRoomService/GetStatus",
    "/boxoffice.v1.BookingService/HoldBatch",
    "/boxoffice.v1.BookingService/GetHold",
    "/boxoffice.v1.BookingService/GetOrder",
    "/boxoffice.v1.BookingService/ListOrders",
    "/boxoffice.v1.BookingService/CancelTickets",
    "/boxoffice.v1.BookingService/TransferTickets",
    "/boxoffice.v1.WaitlistService/JoinWaitlist",
    "/boxoffice.v1.WaitlistService/GetWaitlistEntry",
];

/// The calls that never wait: answered from a cache that says its age, or from no state.
const NEVER: [&str; 3] = [
    "/boxoffice.v1.EventService/GetSeatMap",
    "/boxoffice.v1.WaitingRoomService/GetJoinChallenge",
    // The change stream sends only what this node's copy holds, all of it committed: a node
    // cut off sends nothing new, never anything the group did not commit.
    "/boxoffice.v1.ChangeService/WatchChanges",
];

/// The outcomes of `boxoffice_cluster_fenced_answers_total`.
pub const OUTCOMES: [&str; 2] = ["confirmed", "refused"];

/// Whether an answer of `path` (a refusal, or not) waits for the fence.
pub fn waits(path: &str, refused: bool) -> bool {
    if NEVER.contains(&path) || !path.starts_with("/boxoffice.v1.") {
        return false;
    }
    refused || ALWAYS.contains(&path)
}

/// The fence of group `g`'s engine, if this node leads the group with one.
fn fence_of(groups: &Groups, g: usize) -> Option<std::sync::Arc<ReadFence>> {
    groups.get(g)?.get()?.fence.clone()
}

/// Waits, for an answer of `path` made at `answered` by the engine whose fence is `fence`,
/// until this node is known to have led the group after that moment; `NOT_READY` if it cannot
/// be shown (the answer is then not given: the caller retries, at the leader).
async fn settle(
    fence: Option<std::sync::Arc<ReadFence>>,
    path: &str,
    refused: bool,
    answered: Instant,
) -> Result<(), Status> {
    if !waits(path, refused) {
        return Ok(());
    }
    let Some(fence) = fence else {
        return Ok(());
    };
    match fence.confirm(answered).await {
        Ok(()) => {
            metrics::counter!("boxoffice_cluster_fenced_answers_total", "outcome" => "confirmed")
                .increment(1);
            Ok(())
        }
        Err(e) => {
            metrics::counter!("boxoffice_cluster_fenced_answers_total", "outcome" => "refused")
                .increment(1);
            tracing::debug!(error = %e, path, "an answer withheld: leadership not confirmed");
            Err(Status::from(ApiError::NotReady))
        }
    }
}

/// Whether a gRPC answer is a refusal: its status is in its headers (a unary error is sent
/// trailers-only) and is not OK.
fn refused(res: &http::Response<Body>) -> bool {
    res.headers()
        .get("grpc-status")
        .is_some_and(|v| v.as_bytes() != b"0")
}

/// Serves `call`, a call of group `g` to `path` served here, and gives its answer once
/// [`settle`] lets it go (else `NOT_READY`). `refused` says whether the answer is a refusal, or
/// (`None`) no answer at all (nothing to hold). The fence is the engine's that answered: taken
/// before the call (and after it, should the engine have opened meanwhile), since an engine
/// stopped while its answer was on its way (its lease lost) has left the group's slot, and its
/// answer must still wait for its fence, never pass unfenced.
pub async fn fenced<T>(
    groups: &Groups,
    g: usize,
    path: &str,
    call: impl Future<Output = T>,
    refused: impl FnOnce(&T) -> Option<bool>,
) -> Result<T, Status> {
    let before = fence_of(groups, g);
    let answer = call.await;
    let answered = Instant::now();
    if let Some(refused) = refused(&answer) {
        let fence = before.or_else(|| fence_of(groups, g));
        settle(fence, path, refused, answered).await?;
    }
    Ok(answer)
}

/// Serves `call`, a gRPC call of group `g` to `path` served here (the forwarding layer's
/// choice), and holds its answer until [`settle`] lets it go (else `NOT_READY` in its place).
pub async fn held<E>(
    groups: &Groups,
    g: usize,
    path: &str,
    call: impl Future<Output = Result<http::Response<Body>, E>>,
) -> Result<http::Response<Body>, E> {
    fenced(groups, g, path, call, |r| r.as_ref().ok().map(refused))
        .await
        .unwrap_or_else(|status| Ok(status.into_http()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_refusals_wait_and_fresh_writes_do_not() {
        for path in ALWAYS {
            assert!(waits(path, false), "{path}");
        }
        for path in [
            "/boxoffice.v1.BookingService/Hold",
            "/boxoffice.v1.BookingService/Confirm",
            "/boxoffice.v1.BookingService/Release",
            "/boxoffice.v1.EventService/CreateEvent",
        ] {
            assert!(!waits(path, false), "{path}");
            assert!(waits(path, true), "{path}");
        }
        for path in NEVER {
            assert!(!waits(path, true), "{path}");
        }
        assert!(!waits("/grpc.health.v1.Health/Check", true));
        assert!(!waits("/boxoffice.cluster.v1.Raft/Vote", true));
    }

    #[test]
    fn every_rpc_of_the_contract_is_classified() {
        // Each public method either always waits, never waits, or waits when refused: a new
        // read must be put in ALWAYS or NEVER on purpose, so this lists the rest by name.
        let writes = [
            "/boxoffice.v1.EventService/CreateEvent",
            "/boxoffice.v1.BookingService/Hold",
            "/boxoffice.v1.BookingService/Confirm",
            "/boxoffice.v1.BookingService/Release",
        ];
        let classified: Vec<&str> = ALWAYS
            .iter()
            .chain(&NEVER)
            .chain(&writes)
            .copied()
            .collect();
        for method in crate::gate::METHODS.iter().filter(|m| **m != "other") {
            let known = classified
                .iter()
                .any(|p| p.rsplit('/').next() == Some(*method));
            assert!(known, "{method} is not classified for the read fence");
        }
    }
}
