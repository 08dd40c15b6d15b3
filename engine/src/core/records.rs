//! The records a section applies (the log's, replayed the same way) and what its commands
//! decide: the data of [`super::SectionCore`], below the code that uses it.

use serde::{Deserialize, Serialize};

use crate::sale::SaleState;
use crate::types::{HoldId, HoldView, OrderId, OrderView, SeatId, UserId};

/// Tag of an idempotency key on a record: the key and the request's fingerprint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IdemTag {
    /// The caller's key (scoped per user and RPC).
    pub key: String,
    /// Fingerprint of the request the key was first used with.
    pub fingerprint: u64,
}

/// What a section's log stream records. Past tense: each is a fact that happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SectionRecord {
    /// Places were held (in a section without price tiers, without an access code).
    HoldPlaced {
        /// The new hold.
        hold_id: HoldId,
        /// The holder.
        user_id: UserId,
        /// Seat indices in layout order (empty for general admission).
        seats: Vec<u32>,
        /// Number of places.
        quantity: u32,
        /// When.
        placed_at_ms: u64,
        /// Deadline.
        expires_at_ms: u64,
        /// Idempotency key of the hold request, if any.
        idem: Option<IdemTag>,
    },
    /// A hold was paid: its places are sold and an order exists.
    HoldConfirmed {
        /// The hold.
        hold_id: HoldId,
        /// The new order.
        order_id: OrderId,
        /// Payment reference.
        payment_ref: String,
        /// When.
        at_ms: u64,
        /// Idempotency key of the confirm request, if any.
        idem: Option<IdemTag>,
        /// General admission: the ordinal of the order's first place (its backstop keys are
        /// `#first_place` on), recorded so a replay never renumbers (0 for reserved seats).
        first_place: u32,
    },
    /// The holder gave the places back.
    HoldReleased {
        /// The hold.
        hold_id: HoldId,
        /// When.
        at_ms: u64,
    },
    /// The hold's TTL ran out.
    HoldExpired {
        /// The hold.
        hold_id: HoldId,
        /// When.
        at_ms: u64,
    },
    /// Places taken out of sale by an operator's `--accept-damage` start: the sold-seat backstop
    /// claims them for holds whose sale records were lost (their fans may hold tickets).
    PlacesWithdrawn {
        /// The places, each with its backstop claim.
        places: Vec<Withdrawn>,
        /// When.
        at_ms: u64,
    },
    /// The operator paused the sale: the section takes no new holds, and its holds' deadlines
    /// stand still (none expires past this time) until [`SectionRecord::SaleResumed`].
    SalePaused {
        /// When.
        at_ms: u64,
    },
    /// The sale goes on after a pause: every active hold whose deadline was after the pause
    /// began gets the pause's length added to it.
    SaleResumed {
        /// When.
        at_ms: u64,
    },
    /// The sale ended (final): no new holds. A pause ends with it (as a resume would).
    SaleEnded {
        /// When.
        at_ms: u64,
    },
    /// Tickets of an order were given back (`CancelTickets`): their places are free again, and
    /// what they cost is refunded. The last variant, so the records of older builds keep their
    /// variant indexes.
    TicketsCancelled {
        /// The order's hold.
        hold_id: HoldId,
        /// The ticket indexes (0-based), ascending.
        tickets: Vec<u32>,
        /// Refunded, cents.
        refund_cents: u64,
        /// When.
        at_ms: u64,
        /// Idempotency key of the request, if any.
        idem: Option<IdemTag>,
    },
    /// Tickets of an order moved to another fan (`TransferTickets`): they leave the order (as
    /// given back, nothing refunded), and a new order in the recipient's name holds the same
    /// places, still sold. After every older variant.
    TicketsTransferred {
        /// The order's hold.
        hold_id: HoldId,
        /// The ticket indexes (0-based), ascending.
        tickets: Vec<u32>,
        /// The recipient.
        to_user: UserId,
        /// The recipient's new hold (confirmed at once).
        new_hold_id: HoldId,
        /// The recipient's new order.
        new_order_id: OrderId,
        /// General admission: the ordinal of the new order's first place (its backstop keys);
        /// 0 for reserved seats.
        first_place: u32,
        /// When.
        at_ms: u64,
        /// Idempotency key of the request, if any.
        idem: Option<IdemTag>,
    },
    /// Places were held under a presale access code: a [`SectionRecord::HoldPlaced`] that
    /// names the code (its number among the event's codes), so its uses are counted again on
    /// recovery. After every older variant.
    HoldPlacedWithCode {
        /// The new hold.
        hold_id: HoldId,
        /// The holder.
        user_id: UserId,
        /// Seat indices in layout order (empty for general admission).
        seats: Vec<u32>,
        /// Number of places.
        quantity: u32,
        /// When.
        placed_at_ms: u64,
        /// Deadline.
        expires_at_ms: u64,
        /// Idempotency key of the hold request, if any.
        idem: Option<IdemTag>,
        /// The access code's number.
        code: u32,
    },
    /// Places were held in a section with price tiers ([`crate::prices`]): a
    /// [`SectionRecord::HoldPlaced`] that names each place's tier (so its prices are fixed),
    /// and its access code if it used one. After every older variant.
    HoldPlacedPriced {
        /// The new hold.
        hold_id: HoldId,
        /// The holder.
        user_id: UserId,
        /// Seat indices in layout order (empty for general admission).
        seats: Vec<u32>,
        /// Number of places.
        quantity: u32,
        /// When.
        placed_at_ms: u64,
        /// Deadline.
        expires_at_ms: u64,
        /// Idempotency key of the hold request, if any.
        idem: Option<IdemTag>,
        /// The access code's number, if it was held under one.
        code: Option<u32>,
        /// Each place's tier, in ticket order.
        tiers: Vec<u32>,
    },
}

/// What an operator's sale control asks of one section (see [`crate::sale`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaleChange {
    /// Stop taking holds; deadlines stand still.
    Pause,
    /// Take holds again; deadlines move on, extended by the pause.
    Resume,
    /// Take no more holds, for good.
    End,
}

impl SaleChange {
    /// What each section of an event whose sale is in `state` must stand as: paused, ended,
    /// or neither (a resume, which changes nothing in a section that is not paused).
    pub fn of(state: SaleState) -> SaleChange {
        match state {
            SaleState::Paused => SaleChange::Pause,
            SaleState::Ended => SaleChange::End,
            SaleState::Open | SaleState::QueueAll => SaleChange::Resume,
        }
    }
}

/// A section's own view of its sale: paused since when, and whether it ended. Recorded in its
/// log ([`SectionRecord::SalePaused`] and the others) and carried by its checkpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SectionSale {
    /// When the pause began, while paused.
    pub paused_since_ms: Option<u64>,
    /// Whether the sale ended.
    pub ended: bool,
}

/// A place taken out of sale because its sale record was lost (see
/// [`SectionRecord::PlacesWithdrawn`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Withdrawn {
    /// The seat index (reserved) or the place's ordinal (general admission).
    pub place: u32,
    /// The backstop key that claims it.
    pub key: String,
    /// The hold the claim names.
    pub holder: String,
}

impl SectionRecord {
    /// When the change happened, by the section's clock: the time `apply` forgets by.
    pub fn at_ms(&self) -> u64 {
        match self {
            SectionRecord::HoldPlaced { placed_at_ms, .. }
            | SectionRecord::HoldPlacedWithCode { placed_at_ms, .. }
            | SectionRecord::HoldPlacedPriced { placed_at_ms, .. } => *placed_at_ms,
            SectionRecord::HoldConfirmed { at_ms, .. }
            | SectionRecord::HoldReleased { at_ms, .. }
            | SectionRecord::HoldExpired { at_ms, .. }
            | SectionRecord::PlacesWithdrawn { at_ms, .. }
            | SectionRecord::TicketsCancelled { at_ms, .. }
            | SectionRecord::TicketsTransferred { at_ms, .. }
            | SectionRecord::SalePaused { at_ms }
            | SectionRecord::SaleResumed { at_ms }
            | SectionRecord::SaleEnded { at_ms } => *at_ms,
        }
    }
}

/// A hold's record read the same way with or without a code ([`SectionRecord::as_placed`]).
#[derive(Clone, Copy, Debug)]
pub struct PlacedRef<'a> {
    /// The new hold.
    pub hold_id: &'a HoldId,
    /// The holder.
    pub user_id: &'a UserId,
    /// Seat indices in layout order (empty for general admission).
    pub seats: &'a [u32],
    /// Number of places.
    pub quantity: u32,
    /// When.
    pub placed_at_ms: u64,
    /// Deadline.
    pub expires_at_ms: u64,
    /// Idempotency key of the hold request, if any.
    pub idem: Option<&'a IdemTag>,
    /// The access code's number, if it was held under one.
    pub code: Option<u32>,
    /// Each place's price tier (empty: the section has none).
    pub tiers: &'a [u32],
}

impl SectionRecord {
    /// The hold a [`SectionRecord::HoldPlaced`] (or one of its later forms) places; `None`
    /// for any other record.
    pub fn as_placed(&self) -> Option<PlacedRef<'_>> {
        let (code, tiers): (Option<u32>, &[u32]) = match self {
            SectionRecord::HoldPlaced { .. } => (None, &[]),
            SectionRecord::HoldPlacedWithCode { code, .. } => (Some(*code), &[]),
            SectionRecord::HoldPlacedPriced { code, tiers, .. } => (*code, tiers),
            _ => return None,
        };
        match self {
            SectionRecord::HoldPlaced {
                hold_id,
                user_id,
                seats,
                quantity,
                placed_at_ms,
                expires_at_ms,
                idem,
            }
            | SectionRecord::HoldPlacedWithCode {
                hold_id,
                user_id,
                seats,
                quantity,
                placed_at_ms,
                expires_at_ms,
                idem,
                ..
            }
            | SectionRecord::HoldPlacedPriced {
                hold_id,
                user_id,
                seats,
                quantity,
                placed_at_ms,
                expires_at_ms,
                idem,
                ..
            } => Some(PlacedRef {
                hold_id,
                user_id,
                seats,
                quantity: *quantity,
                placed_at_ms: *placed_at_ms,
                expires_at_ms: *expires_at_ms,
                idem: idem.as_ref(),
                code,
                tiers,
            }),
            _ => None,
        }
    }
}

/// How a hold chooses its places inside one section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pick {
    /// These exact seats (reserved sections only).
    Seats(Vec<SeatId>),
    /// This many places, chosen by the engine.
    Best(u32),
}

/// A command to place a hold in this section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlaceHold {
    /// Id for the new hold (generated by the caller).
    pub hold_id: HoldId,
    /// The holder.
    pub user_id: UserId,
    /// What to hold.
    pub pick: Pick,
    /// The event's hold TTL.
    pub ttl_ms: u64,
    /// Idempotency tag to record with the hold.
    pub idem: Option<IdemTag>,
    /// The access code it is held under (its number), if any.
    pub code: Option<u32>,
}

/// A command to confirm a hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfirmHold {
    /// The hold.
    pub hold_id: HoldId,
    /// Must be the holder.
    pub user_id: UserId,
    /// Id for the new order (generated by the caller).
    pub order_id: OrderId,
    /// Payment reference.
    pub payment_ref: String,
    /// Idempotency tag to record with the order.
    pub idem: Option<IdemTag>,
}

/// What a confirm produced: the order, and the sold-seat backstop keys to claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confirmed {
    /// The new order.
    pub order: OrderView,
    /// Unique keys, one per sold place, for the store's insert-if-absent backstop.
    pub sold_keys: Vec<String>,
}

/// A hold that ended (released, expired): who gets quota back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    /// The hold as it is now.
    pub hold: HoldView,
}
