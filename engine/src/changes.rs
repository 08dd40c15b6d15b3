//! The change stream (`ChangeService.WatchChanges`): every change the engine makes, in log
//! order, each with a cursor a reader resumes from.
//!
//! The data of the stream lives here (below the store); its writing and reading by the log are
//! `store::change_log` ([`crate::store::read_changes`]).
//!
//! Writers describe what their records change ([`Change`]) beside the records (a section actor
//! from its core, which knows the order's amount and tickets; the catalog; the waitlist; the
//! refunds), and encode them there ([`Noted`]), off the flusher's thread. The flusher gathers the
//! encoded changes of every job of a group commit into records of the `changes` stream
//! ([`ChangeRecord`], about `CHANGE_RECORD_BYTES` each, after the commit's own records), so
//! the stream costs at most one more value per job (a section's batch), not one per change, and
//! is durable
//! (and on a cluster replicated, in the same Raft entry) exactly when the records it describes
//! are. A record's changes are in the order their jobs were queued: a section's in its own order,
//! the catalog's before the sections follow it.
//!
//! **Cursors.** A [`Position`] is `(seq, index)`: after the `index`-th change of the record
//! `seq` (`index` [`Position::WHOLE`]: after the whole record). Every node of a group applies
//! the same records under the same numbers, so a position means the same on any node, and a
//! reader that moves to another node (a failover) resumes with no gap.
//!
//! **Retention.** The flusher trims records older than `EngineConfig::change_retention`
//! (measured by the records' own times) through a checkpoint of the stream (replicated like any
//! other), and the compactor removes them. A position inside what is gone is expired
//! ([`ChangesError::Expired`], with the oldest position still served).

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::error::StorageError;
use crate::sale::SaleControls;
use crate::types::{EventId, EventSpec, HoldId, HoldView, OrderView, SectionId, UserId};

/// What changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    /// An event was created.
    EventCreated {
        /// Its spec (the proof of work's difficulty is not kept here).
        spec: EventSpec,
        /// Its sale's controls as created.
        sale: SaleControls,
    },
    /// Places were held (a unary hold, an item of a batch, or a waitlist offer's hold).
    HoldPlaced(HoldView),
    /// A holder released a hold.
    HoldReleased(HoldView),
    /// A hold's time ran out.
    HoldExpired(HoldView),
    /// A hold was paid: an order (tickets without their codes).
    OrderCreated(OrderView),
    /// Places were taken out of sale (an `--accept-damage` start).
    PlacesWithdrawn {
        /// The section.
        section_id: SectionId,
        /// How many places.
        quantity: u32,
    },
    /// A waitlist entry was offered places: a hold in its fan's name.
    WaitlistOffered {
        /// The entry.
        entry_id: String,
        /// The hold placed for it.
        hold_id: HoldId,
    },
    /// An operator changed the sale (`UpdateSale`): the controls after the change.
    SaleUpdated(SaleControls),
    /// A charge kept without an order was refunded.
    Refunded {
        /// The payment refunded.
        payment_id: String,
        /// The hold it was made for, if known.
        hold_id: Option<HoldId>,
        /// Amount, cents.
        amount_cents: u64,
        /// Whose money it was.
        user_id: Option<UserId>,
    },
    /// Tickets of an order were given back (`CancelTickets`). The last variant, so the change
    /// records of older builds keep their variant indexes.
    TicketsCancelled {
        /// The order once its commit's records are applied: the tickets left (no codes).
        order: OrderView,
        /// The tickets given back.
        ticket_ids: Vec<String>,
        /// What is refunded for them, cents.
        refund_cents: u64,
        /// The refund's idempotency key with the payment provider.
        refund_key: String,
    },
    /// Tickets of an order moved to another fan (`TransferTickets`). After every older variant.
    TicketsTransferred {
        /// The order they left, once its commit's records are applied (no codes).
        from: OrderView,
        /// The recipient's new order (no codes).
        to: OrderView,
        /// The tickets moved, by their ids in the order they left.
        ticket_ids: Vec<String>,
    },
}

impl ChangeKind {
    /// The kind's name as the API spells it (`hold_placed`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            ChangeKind::EventCreated { .. } => "event_created",
            ChangeKind::HoldPlaced(_) => "hold_placed",
            ChangeKind::HoldReleased(_) => "hold_released",
            ChangeKind::HoldExpired(_) => "hold_expired",
            ChangeKind::OrderCreated(_) => "order_created",
            ChangeKind::PlacesWithdrawn { .. } => "places_withdrawn",
            ChangeKind::WaitlistOffered { .. } => "waitlist_offered",
            ChangeKind::SaleUpdated(_) => "sale_updated",
            ChangeKind::Refunded { .. } => "refunded",
            ChangeKind::TicketsCancelled { .. } => "tickets_cancelled",
            ChangeKind::TicketsTransferred { .. } => "tickets_transferred",
        }
    }
}

/// One change: of which event, when (the writer's clock), what.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The event.
    pub event_id: EventId,
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// What.
    pub kind: ChangeKind,
}

/// One record of the `changes` stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeRecord {
    /// The latest time among its changes (retention is measured by it).
    pub at_ms: u64,
    /// The changes, in log order: each part one job's, as [`Noted`] encoded them.
    pub parts: Vec<Vec<u8>>,
}

impl ChangeRecord {
    /// The record's changes, in order.
    pub fn changes(&self) -> Result<Vec<Change>, codec::DecodeError> {
        let mut out = Vec::new();
        for part in &self.parts {
            let (mut changes, extras): (Vec<Change>, Vec<Extras>) = codec::decode_extended(part)?;
            if extras.is_empty() {
                // Written before prices were: every place was at its section's one price.
                changes
                    .iter_mut()
                    .for_each(|c| Extras::before_prices(&mut c.kind));
            }
            for (c, e) in changes.iter_mut().zip(extras) {
                e.put(&mut c.kind);
            }
            out.extend(changes);
        }
        Ok(out)
    }
}

/// What a change's views show that their own encoding skips (written after the changes, one
/// per change, so parts written before it existed decode without): each hold's places' prices
/// and each order's tickets' prices, in the change's order of views, and a new event's
/// sections' price tiers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Extras {
    prices: Vec<Vec<u64>>,
    tiers: Vec<Vec<crate::prices::PriceTier>>,
}

impl Extras {
    fn of(kind: &ChangeKind) -> Extras {
        let tickets = |o: &OrderView| o.tickets.iter().map(|t| t.price_cents).collect();
        let (prices, tiers) = match kind {
            ChangeKind::EventCreated { spec, .. } => (
                Vec::new(),
                spec.sections
                    .iter()
                    .map(|s| s.price_tiers.clone())
                    .collect(),
            ),
            ChangeKind::HoldPlaced(h)
            | ChangeKind::HoldReleased(h)
            | ChangeKind::HoldExpired(h) => (vec![h.place_prices_cents.clone()], Vec::new()),
            ChangeKind::OrderCreated(o) | ChangeKind::TicketsCancelled { order: o, .. } => {
                (vec![tickets(o)], Vec::new())
            }
            ChangeKind::TicketsTransferred { from, to, .. } => {
                (vec![tickets(from), tickets(to)], Vec::new())
            }
            _ => (Vec::new(), Vec::new()),
        };
        Extras { prices, tiers }
    }

    /// What a change written before prices were can show of them: a new order's tickets each
    /// cost its amount over their number (one price per section then). A hold's places show
    /// none (its view never had an amount).
    fn before_prices(kind: &mut ChangeKind) {
        if let ChangeKind::OrderCreated(o) = kind
            && let Ok(n) = u64::try_from(o.tickets.len())
            && n > 0
        {
            let each = o.amount_cents / n;
            o.tickets.iter_mut().for_each(|t| t.price_cents = each);
        }
    }

    fn put(self, kind: &mut ChangeKind) {
        let mut prices = self.prices.into_iter();
        let mut tickets = |o: &mut OrderView| {
            for (t, p) in o.tickets.iter_mut().zip(prices.next().unwrap_or_default()) {
                t.price_cents = p;
            }
        };
        match kind {
            ChangeKind::EventCreated { spec, .. } => {
                for (s, tiers) in spec.sections.iter_mut().zip(self.tiers) {
                    s.price_tiers = tiers;
                }
            }
            ChangeKind::HoldPlaced(h)
            | ChangeKind::HoldReleased(h)
            | ChangeKind::HoldExpired(h) => {
                h.place_prices_cents = prices.next().unwrap_or_default();
            }
            ChangeKind::OrderCreated(o) | ChangeKind::TicketsCancelled { order: o, .. } => {
                tickets(o);
            }
            ChangeKind::TicketsTransferred { from, to, .. } => {
                tickets(from);
                tickets(to);
            }
            _ => {}
        }
    }
}

/// One job's changes, encoded by its writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Noted {
    /// The latest time among them.
    pub at_ms: u64,
    /// `Vec<Change>` encoded by [`codec`], then each change's [`Extras`].
    pub bytes: Vec<u8>,
}

impl Noted {
    /// `changes` encoded (`None`: there are none).
    pub fn of(changes: &[Change]) -> Option<Noted> {
        let at_ms = changes.iter().map(|c| c.at_ms).max()?;
        let extras: Vec<Extras> = changes.iter().map(|c| Extras::of(&c.kind)).collect();
        Some(Noted {
            at_ms,
            bytes: codec::encode(&(changes, extras)),
        })
    }
}

/// Where a reader stands: after the `index`-th change of record `seq` (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position {
    /// The record.
    pub seq: u64,
    /// The change within it ([`Position::WHOLE`]: all of them).
    pub index: u32,
}

impl Position {
    /// After the whole record.
    pub const WHOLE: u32 = u32::MAX;

    /// Before everything ever written.
    pub const START: Position = Position {
        seq: 0,
        index: Position::WHOLE,
    };

    /// After the whole of record `seq`.
    pub fn after_record(seq: u64) -> Position {
        Position {
            seq,
            index: Position::WHOLE,
        }
    }
}

impl std::fmt::Display for Position {
    /// `seq` after a whole record, `seq.index` after one of its changes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.index == Position::WHOLE {
            write!(f, "{}", self.seq)
        } else {
            write!(f, "{}.{}", self.seq, self.index)
        }
    }
}

impl std::str::FromStr for Position {
    type Err = String;

    fn from_str(s: &str) -> Result<Position, String> {
        let bad = || format!("`{s}` is not a cursor of this stream");
        let (seq, index) = match s.split_once('.') {
            Some((seq, index)) => {
                let index: u32 = index.parse().map_err(|_| bad())?;
                if index == Position::WHOLE {
                    return Err(bad());
                }
                (seq, index)
            }
            None => (s, Position::WHOLE),
        };
        Ok(Position {
            seq: seq.parse().map_err(|_| bad())?,
            index,
        })
    }
}

/// Why a read of the stream gave nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChangesError {
    /// The position is older than the retention: `oldest` is the oldest still served.
    #[error("the cursor is older than the change stream keeps (oldest: {oldest})")]
    Expired {
        /// The oldest position a reader may resume from.
        oldest: Position,
    },
    /// The position is past the end of the stream (not one this log handed out).
    #[error("the cursor {0} is past the end of the change stream")]
    Unknown(Position),
    /// The log could not be read.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// What a read of the stream gives.
pub type ChangesRead = Result<ChangesPage, ChangesError>;

/// A page of the stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangesPage {
    /// The changes after the position asked for, each with its own position.
    pub changes: Vec<(Position, Change)>,
    /// Where the next read starts (the last change's position, or the one asked for).
    pub next: Position,
    /// The oldest position still served.
    pub oldest: Position,
    /// Whether the page reached the end of what is readable now.
    pub at_end: bool,
}

/// The change a refund makes: payment `payment_id` of `amount_cents` (made for `hold`)
/// refunded at `now_ms`.
pub(crate) fn refunded(
    (payment_id, amount_cents): (&str, u64),
    hold: &HoldId,
    user_id: Option<UserId>,
    now_ms: u64,
) -> Option<Change> {
    let (event_id, _) = hold.route()?;
    Some(Change {
        event_id,
        at_ms: now_ms,
        kind: ChangeKind::Refunded {
            payment_id: payment_id.to_owned(),
            hold_id: Some(hold.clone()),
            amount_cents,
            user_id,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_read_back_as_written_and_bad_ones_are_refused() {
        for p in [
            Position::START,
            Position { seq: 7, index: 0 },
            Position::after_record(12),
        ] {
            assert_eq!(p.to_string().parse::<Position>(), Ok(p));
        }
        assert_eq!("12".parse::<Position>(), Ok(Position::after_record(12)));
        for bad in ["", "x", "1.", ".1", "1.2.3", "-1", "1.4294967295"] {
            assert!(bad.parse::<Position>().is_err(), "{bad}");
        }
    }
    /// A part carries its views' prices, which their own encoding skips; a part written before
    /// it did reads back with each new order's tickets at the order's one price.
    #[test]
    fn prices_survive_the_encoding_and_older_parts_read_at_one_price() {
        use crate::types::{HoldStatus, OrderId, OrderView, SectionId, TicketView};
        let e = EventId::from("e");
        let s = SectionId::from("s");
        let ticket = |n: u32, price_cents: u64| TicketView {
            ticket_id: format!("o.{n}"),
            section_id: s.clone(),
            seat_id: None,
            price_cents,
        };
        let order = OrderView {
            order_id: OrderId::generate(&e, &s),
            hold_id: HoldId::generate(&e, &s),
            event_id: e.clone(),
            user_id: UserId::from("u"),
            tickets: vec![ticket(1, 9_000), ticket(2, 12_000)],
            amount_cents: 21_000,
            payment_ref: "p".into(),
            created_at_ms: 5,
            refunded_cents: 0,
            cancelled_ticket_ids: Vec::new(),
            transferred_from: None,
        };
        let hold = HoldView {
            hold_id: order.hold_id.clone(),
            event_id: e.clone(),
            user_id: UserId::from("u"),
            section_id: s.clone(),
            seat_ids: Vec::new(),
            quantity: 2,
            status: HoldStatus::Held,
            placed_at_ms: 1,
            expires_at_ms: 9,
            place_prices_cents: vec![9_000, 12_000],
        };
        let changes = vec![
            Change {
                event_id: e.clone(),
                at_ms: 1,
                kind: ChangeKind::HoldPlaced(hold),
            },
            Change {
                event_id: e.clone(),
                at_ms: 5,
                kind: ChangeKind::OrderCreated(order),
            },
        ];
        let record = |bytes| ChangeRecord {
            at_ms: 5,
            parts: vec![bytes],
        };
        let read = record(Noted::of(&changes).unwrap().bytes)
            .changes()
            .unwrap();
        assert_eq!(read, changes);
        let older = record(codec::encode(&changes)).changes().unwrap();
        let ChangeKind::OrderCreated(o) = &older[1].kind else {
            panic!("{older:?}")
        };
        let prices: Vec<u64> = o.tickets.iter().map(|t| t.price_cents).collect();
        assert_eq!(prices, [10_500, 10_500]);
    }
}
