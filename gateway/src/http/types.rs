//! The JSON bodies of the HTTP API: camelCase names (the seeds' `holdId`, `expiresAt`,
//! `etaSec`), times as RFC 3339 strings beside the contract's Unix ms, enums by the name their
//! proto value has without its prefix (`HELD`, `ADMITTED`). Each answer is made from the gRPC
//! message the services returned; each request becomes the gRPC request.

use boxoffice_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

pub use super::json::{rfc3339, short};

// ---- Waiting room ------------------------------------------------------------------------------

/// `GET /v1/events/{id}/queue-token`: who joins.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct JoinQuery {
    /// The fan joining.
    #[serde(default)]
    pub user_id: String,
    /// The fan's session: the same session keeps its place (`Join` is idempotent per event,
    /// user and session).
    #[serde(default)]
    pub session_id: String,
    /// For events with a proof of work: the challenge of `GET .../join-challenge`.
    #[serde(default)]
    pub join_challenge: String,
    /// The nonce that solves it.
    #[serde(default)]
    pub pow_nonce: u64,
}

/// A place in line (the seeds' `{ token, position, etaSec }`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueToken {
    /// The queue token: pass it to `GET /v1/queue/{eventId}/status`.
    pub token: String,
    /// Position in line, from 1; 0 before the sale opens (drawn at the opening).
    pub position: u64,
    /// Estimated seconds until admission.
    pub eta_sec: u32,
    /// `WAITING`, `ADMITTED` (a session already admitted) or `SOLD_OUT` (every place taken
    /// now: join the waitlist with this token, or leave).
    pub state: String,
}

impl From<pb::QueueTicket> for QueueToken {
    fn from(t: pb::QueueTicket) -> QueueToken {
        QueueToken {
            state: short(t.state().as_str_name(), "QUEUE_STATE_"),
            token: t.queue_token,
            position: t.position,
            eta_sec: t.eta_seconds,
        }
    }
}

/// `GET /v1/events/{id}/join-challenge`: who asks.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct UserQuery {
    /// The fan.
    #[serde(default)]
    pub user_id: String,
}

/// A proof-of-work challenge to solve before joining (docs/api.md 3.1).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinChallenge {
    /// The challenge (pass it back as `joinChallenge`).
    pub challenge: String,
    /// Leading zero bits the solution's hash needs (0: no proof of work).
    pub difficulty_bits: u32,
    /// When it stops being accepted, Unix ms.
    pub expires_at_unix_ms: i64,
}

impl From<pb::JoinChallenge> for JoinChallenge {
    fn from(c: pb::JoinChallenge) -> JoinChallenge {
        JoinChallenge {
            challenge: c.challenge,
            difficulty_bits: c.difficulty_bits,
            expires_at_unix_ms: c.expires_at_unix_ms,
        }
    }
}

/// `GET /v1/queue/{eventId}/status`: whose place.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct StatusQuery {
    /// The queue token of `queue-token`.
    #[serde(default)]
    pub token: String,
}

/// Where a place in line stands.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// `WAITING`, `ADMITTED`, `EXPIRED` or `SOLD_OUT` (still in line, every place taken now).
    pub state: String,
    /// Position in line, from 1; 0 before the opening draw.
    pub position: u64,
    /// Fans still ahead.
    pub ahead: u64,
    /// Estimated seconds until admission; 0 once admitted.
    pub eta_sec: u32,
    /// Once admitted: the token a hold needs.
    pub admission_token: String,
    /// When the admission token stops being valid (RFC 3339; empty until admitted).
    pub admission_expires_at: String,
    /// The same, Unix ms (0 until admitted).
    pub admission_expires_at_unix_ms: i64,
    /// Where an operator has set the sale: `OPEN`, `PAUSED` (nobody admitted, nothing held
    /// until it goes on), `QUEUE_ALL` (nobody admitted for now) or `ENDED` (leave the line);
    /// `UNSPECIFIED` with `EXPIRED` when the event is gone.
    pub sale_state: String,
}

impl From<pb::QueueStatus> for QueueStatus {
    fn from(s: pb::QueueStatus) -> QueueStatus {
        QueueStatus {
            sale_state: short(s.sale_state().as_str_name(), "SALE_STATE_"),
            state: short(s.state().as_str_name(), "QUEUE_STATE_"),
            position: s.position,
            ahead: s.ahead,
            eta_sec: s.eta_seconds,
            admission_expires_at: rfc3339(s.admission_expires_at_unix_ms),
            admission_token: s.admission_token,
            admission_expires_at_unix_ms: s.admission_expires_at_unix_ms,
        }
    }
}

// ---- Holds and orders --------------------------------------------------------------------------

/// `POST /v1/events/{id}/book` (the seeds' `{ seatId, token }`): exact seats, or let the
/// engine pick `quantity` places (best available, in `section` or any).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BookRequest {
    /// The fan holding.
    #[serde(default)]
    pub user_id: String,
    /// The admission token of the queue status.
    #[serde(default)]
    pub token: String,
    /// One exact seat.
    #[serde(default)]
    pub seat_id: Option<String>,
    /// Exact seats, all or none.
    #[serde(default)]
    pub seat_ids: Vec<String>,
    /// Best available: the section (empty: any).
    #[serde(default)]
    pub section_id: String,
    /// Best available: how many places (without seats: 1).
    #[serde(default)]
    pub quantity: Option<u32>,
    /// Presale access code (empty: none): needed by a presale section until the presale ends.
    #[serde(default)]
    pub access_code: String,
    /// The idempotency key, if not in the `Idempotency-Key` header.
    #[serde(default)]
    pub idempotency_key: String,
}

/// `POST /v1/holds` (the case study's `{ eventId, seatIds[] }`).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HoldBody {
    /// The event.
    #[serde(default)]
    pub event_id: String,
    /// The fan holding.
    #[serde(default)]
    pub user_id: String,
    /// The admission token of the queue status.
    #[serde(default)]
    pub admission_token: String,
    /// Exact seats, all or none.
    #[serde(default)]
    pub seat_ids: Vec<String>,
    /// Best available: the section (empty: any).
    #[serde(default)]
    pub section_id: String,
    /// Best available: how many places (without seats: 1).
    #[serde(default)]
    pub quantity: Option<u32>,
    /// Presale access code (empty: none): needed by a presale section until the presale ends.
    #[serde(default)]
    pub access_code: String,
    /// The idempotency key, if not in the `Idempotency-Key` header.
    #[serde(default)]
    pub idempotency_key: String,
}

/// Held places.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hold {
    /// The hold.
    pub hold_id: String,
    /// Its event.
    pub event_id: String,
    /// The fan it holds for.
    pub user_id: String,
    /// Its section (a hold never spans sections).
    pub section_id: String,
    /// Its seats (empty for general admission).
    pub seat_ids: Vec<String>,
    /// Its places.
    pub quantity: u32,
    /// `HELD`, `CONFIRMED`, `RELEASED` or `EXPIRED`.
    pub status: String,
    /// Until when the places are held (RFC 3339).
    pub expires_at: String,
    /// The same, Unix ms.
    pub expires_at_unix_ms: i64,
    /// What confirming it charges, cents: the sum of `placePricesCents`, fixed when it was made.
    pub amount_cents: u64,
    /// Each place's price, cents, in `seatIds` order (by the price tier it came from).
    pub place_prices_cents: Vec<u64>,
}

impl From<pb::Hold> for Hold {
    fn from(h: pb::Hold) -> Hold {
        Hold {
            status: short(h.status().as_str_name(), "HOLD_STATUS_"),
            expires_at: rfc3339(h.expires_at_unix_ms),
            hold_id: h.hold_id,
            event_id: h.event_id,
            user_id: h.user_id,
            section_id: h.section_id,
            seat_ids: h.seat_ids,
            quantity: h.quantity,
            expires_at_unix_ms: h.expires_at_unix_ms,
            amount_cents: h.amount_cents,
            place_prices_cents: h.place_prices_cents,
        }
    }
}

/// `POST /v1/holds/{holdId}/confirm`: who pays, with what.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfirmBody {
    /// The holder.
    #[serde(default)]
    pub user_id: String,
    /// The payment token (the simulated provider: `tok_visa`, `tok_decline`, ...).
    #[serde(default)]
    pub payment_token: String,
    /// The idempotency key, if not in the `Idempotency-Key` header.
    #[serde(default)]
    pub idempotency_key: String,
}

/// `POST /v1/orders` (the case study's `{ holdId, paymentToken, idempotencyKey }`).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OrderBody {
    /// The hold to pay for.
    #[serde(default)]
    pub hold_id: String,
    /// The holder.
    #[serde(default)]
    pub user_id: String,
    /// The payment token.
    #[serde(default)]
    pub payment_token: String,
    /// The idempotency key (or the `Idempotency-Key` header).
    #[serde(default)]
    pub idempotency_key: String,
}

/// `POST /v1/holds/{holdId}/release`: who gives the places back.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReleaseBody {
    /// The holder.
    #[serde(default)]
    pub user_id: String,
}

/// A ticket of an order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ticket {
    /// The ticket.
    pub ticket_id: String,
    /// Its section.
    pub section_id: String,
    /// Its seat (empty for general admission).
    pub seat_id: String,
    /// The signed e-ticket code, verifiable offline (`boxoffice ticket verify`).
    pub code: String,
    /// What the place cost, cents (its price tier's; 0 in a received order).
    pub price_cents: u64,
}

/// A paid order and its tickets.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    /// The order.
    pub order_id: String,
    /// The hold it paid for.
    pub hold_id: String,
    /// Its event.
    pub event_id: String,
    /// The buyer.
    pub user_id: String,
    /// The first ticket's id (the seeds' `{ ticketId }`).
    pub ticket_id: String,
    /// Every ticket.
    pub tickets: Vec<Ticket>,
    /// What was charged, cents.
    pub amount_cents: u64,
    /// The payment provider's id of the charge.
    pub payment_id: String,
    /// `CONFIRMED` or `REFUNDED`.
    pub status: String,
    /// When it was made (RFC 3339).
    pub created_at: String,
    /// The same, Unix ms.
    pub created_at_unix_ms: i64,
    /// Refunded for tickets given back, cents.
    pub refunded_cents: u64,
    /// The tickets given back or moved (no longer in `tickets`).
    pub cancelled_ticket_ids: Vec<String>,
    /// A received order's: the order its tickets came from.
    pub transferred_from_order_id: String,
}

impl From<pb::Order> for Order {
    fn from(o: pb::Order) -> Order {
        Order {
            status: short(o.status().as_str_name(), "ORDER_STATUS_"),
            created_at: rfc3339(o.created_at_unix_ms),
            ticket_id: o
                .tickets
                .first()
                .map(|t| t.ticket_id.clone())
                .unwrap_or_default(),
            tickets: o
                .tickets
                .into_iter()
                .map(|t| Ticket {
                    ticket_id: t.ticket_id,
                    section_id: t.section_id,
                    seat_id: t.seat_id,
                    code: t.code,
                    price_cents: t.price_cents,
                })
                .collect(),
            order_id: o.order_id,
            hold_id: o.hold_id,
            event_id: o.event_id,
            user_id: o.user_id,
            amount_cents: o.amount_cents,
            payment_id: o.payment_id,
            created_at_unix_ms: o.created_at_unix_ms,
            refunded_cents: o.refunded_cents,
            cancelled_ticket_ids: o.cancelled_ticket_ids,
            transferred_from_order_id: o.transferred_from_order_id,
        }
    }
}

// ---- Seat maps (events' bodies are in `event_types`) ---------------------------------------------

/// `GET /v1/events/{id}/seats`: which part of the map.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct SeatsQuery {
    /// One section (empty: all).
    #[serde(default)]
    pub section: String,
    /// With `section`: the first row (paging a large section; see `nextFirstRow`).
    #[serde(default)]
    pub first_row: u32,
}

/// One reserved seat.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Seat {
    /// Seat id (`{section}:{row}:{number}`).
    pub seat_id: String,
    /// Row label.
    pub row: String,
    /// Number in the row, from 1.
    pub number: u32,
    /// `AVAILABLE`, `HELD` or `SOLD`.
    pub status: String,
}

/// One section of a seat map.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SectionSeats {
    /// Section id.
    pub section_id: String,
    /// All places.
    pub capacity: u32,
    /// Free places.
    pub available: u32,
    /// Held places.
    pub held: u32,
    /// Sold places.
    pub sold: u32,
    /// The last change of the section this map shows (the `ETag` is made of these).
    pub version: u64,
    /// When that change was made (RFC 3339).
    pub changed_at: String,
    /// When this section's counts and seats were known true, Unix ms.
    pub as_of_unix_ms: i64,
    /// Seats in row order (empty for general admission).
    pub seats: Vec<Seat>,
    /// The price tiers as they stand (empty: none).
    pub price_tiers: Vec<super::event_types::PriceTierStatus>,
    /// The price the next place held here would cost, cents.
    pub next_price_cents: u64,
}

/// A seat map, labelled with the time it was true ("as of"): never a reservation.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SeatMap {
    /// The event.
    pub event_id: String,
    /// When the oldest section shown was known true (RFC 3339): "as of".
    pub as_of: String,
    /// The same, Unix ms.
    pub as_of_unix_ms: i64,
    /// The sections.
    pub sections: Vec<SectionSeats>,
    /// One section asked: the first row not in this answer (0: none left).
    pub next_first_row: u32,
}

impl From<pb::SeatMap> for SeatMap {
    fn from(m: pb::SeatMap) -> SeatMap {
        SeatMap {
            as_of: rfc3339(m.as_of_unix_ms),
            sections: m
                .sections
                .into_iter()
                .map(|s| SectionSeats {
                    changed_at: rfc3339(s.changed_at_unix_ms),
                    seats: s
                        .seats
                        .iter()
                        .map(|seat| Seat {
                            status: short(seat.status().as_str_name(), "SEAT_STATUS_"),
                            seat_id: seat.seat_id.clone(),
                            row: seat.row.clone(),
                            number: seat.number,
                        })
                        .collect(),
                    section_id: s.section_id,
                    capacity: s.capacity,
                    available: s.available,
                    held: s.held,
                    sold: s.sold,
                    version: s.version,
                    as_of_unix_ms: s.as_of_unix_ms,
                    price_tiers: super::event_types::price_tiers(s.price_tiers),
                    next_price_cents: s.next_price_cents,
                })
                .collect(),
            event_id: m.event_id,
            as_of_unix_ms: m.as_of_unix_ms,
            next_first_row: m.next_first_row,
        }
    }
}

// ---- Cluster -------------------------------------------------------------------------------------

/// `POST /v1/cluster/nodes`: the node to add.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddNodeBody {
    /// Its id (`serve --node-id`), at least 1.
    #[serde(default)]
    pub node_id: u64,
    /// Where its peers reach it (`HOST:PORT`: its peer port if the nodes have one).
    #[serde(default)]
    pub address: String,
}

/// A node of the cluster.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNode {
    /// Its id.
    pub node_id: u64,
    /// The address its peers reach it on.
    pub address: String,
    /// Whether it votes in every group (false: a learner in some).
    pub voter: bool,
    /// The groups it leads.
    pub leads: Vec<u32>,
}

/// A Raft group of the cluster.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterGroup {
    /// Its number.
    pub group: u32,
    /// Its leader (0: none known to the answering node).
    pub leader_id: u64,
    /// Its current term.
    pub term: u64,
    /// The nodes that vote in it.
    pub voters: Vec<u64>,
    /// The nodes that only receive its log.
    pub learners: Vec<u64>,
    /// The answering node's last log index in it.
    pub last_log_index: u64,
}

/// The cluster as the answering node sees it (`ClusterStatus`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// The node that answered.
    pub answered_by: u64,
    /// Every node a group counts.
    pub nodes: Vec<ClusterNode>,
    /// Each Raft group.
    pub groups: Vec<ClusterGroup>,
    /// The cluster's ticket key ring, oldest key first (empty while it is not made yet).
    pub ticket_keys: Vec<TicketKey>,
}

/// One key of the cluster's ticket key ring (`TicketKey`): it signs the orders made from
/// `signsFromUnixMs` until the next key's, and verifies codes always.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TicketKey {
    /// The key id its codes carry (hex).
    pub key_id: String,
    /// The Ed25519 public key (hex).
    pub public_key: String,
    /// When it starts signing, ms since the Unix epoch (0: the ring's first key).
    pub signs_from_unix_ms: i64,
    /// Whether the ring holds its private half (`false`: it only verifies).
    pub can_sign: bool,
}

impl From<pb::ClusterStatus> for ClusterStatus {
    fn from(s: pb::ClusterStatus) -> Self {
        ClusterStatus {
            answered_by: s.answered_by,
            nodes: s
                .nodes
                .into_iter()
                .map(|n| ClusterNode {
                    node_id: n.node_id,
                    address: n.address,
                    voter: n.voter,
                    leads: n.leads,
                })
                .collect(),
            groups: s
                .groups
                .into_iter()
                .map(|g| ClusterGroup {
                    group: g.group,
                    leader_id: g.leader_id,
                    term: g.term,
                    voters: g.voters,
                    learners: g.learners,
                    last_log_index: g.last_log_index,
                })
                .collect(),
            ticket_keys: s
                .ticket_keys
                .into_iter()
                .map(|k| TicketKey {
                    key_id: k.key_id,
                    public_key: k.public_key,
                    signs_from_unix_ms: k.signs_from_unix_ms,
                    can_sign: k.can_sign,
                })
                .collect(),
        }
    }
}
