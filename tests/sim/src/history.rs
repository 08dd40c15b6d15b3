//! What the simulated fans asked and heard: every call, through which node, when it was made
//! and when it was answered (virtual ms), and its answer reduced to what the checkers compare.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use boxoffice_proto::v1 as pb;

/// A fan's number.
pub type Fan = usize;

/// How the key of a [`Op::Hold`] sent without an idempotency key begins.
pub const NO_KEY: &str = "n-";

/// One call of the public API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `CreateEvent` (the admin, with a key).
    CreateEvent,
    /// `Join` of the line.
    Join,
    /// `GetStatus` of the fan's queue token.
    Status,
    /// `Hold`: best available (`seats` empty) or exactly `seats`.
    Hold {
        /// Its idempotency key; one that begins with [`NO_KEY`] was not sent (a caller
        /// without keys), and only names the call.
        key: String,
        /// The section asked for (empty: any).
        section: String,
        /// Exact seats, or empty.
        seats: Vec<String>,
        /// Places (best available).
        quantity: u32,
    },
    /// `HoldBatch` of the fan's own items, each `(key, section, quantity)`.
    Batch {
        /// The items.
        items: Vec<(String, String, u32)>,
    },
    /// `Confirm` of a hold with a key and a payment token.
    Confirm {
        /// The hold.
        hold: String,
        /// Its idempotency key.
        key: String,
        /// The payment token (`tok_visa`, `tok_decline`).
        token: String,
    },
    /// `Release` of a hold.
    Release {
        /// The hold.
        hold: String,
    },
    /// `GetHold`.
    GetHold {
        /// The hold.
        hold: String,
    },
    /// `GetOrder`.
    GetOrder {
        /// The order.
        order: String,
    },
    /// `GetEvent`.
    GetEvent,
    /// `JoinWaitlist` for places of a section.
    JoinWaitlist {
        /// The section.
        section: String,
        /// Places.
        quantity: u32,
    },
    /// `GetWaitlistEntry`.
    GetEntry {
        /// The entry.
        entry: String,
    },
}

impl Op {
    /// Whether the call changes something (reads are the rest).
    pub fn writes(&self) -> bool {
        matches!(
            self,
            Op::CreateEvent
                | Op::Join
                | Op::Hold { .. }
                | Op::Batch { .. }
                | Op::Confirm { .. }
                | Op::Release { .. }
                | Op::JoinWaitlist { .. }
        )
    }
}

/// A hold as an answer showed it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HoldSeen {
    /// Its id.
    pub id: String,
    /// Its section.
    pub section: String,
    /// Its seats (reserved sections).
    pub seats: Vec<String>,
    /// Its places.
    pub quantity: u32,
    /// Its status (`pb::HoldStatus` as a number).
    pub status: i32,
}

impl HoldSeen {
    /// From the wire.
    pub fn of(h: &pb::Hold) -> HoldSeen {
        HoldSeen {
            id: h.hold_id.clone(),
            section: h.section_id.clone(),
            seats: h.seat_ids.clone(),
            quantity: h.quantity,
            status: h.status,
        }
    }
}

/// An order as an answer showed it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OrderSeen {
    /// Its id.
    pub id: String,
    /// Its hold.
    pub hold: String,
    /// `(ticket id, section, seat)` of each ticket.
    pub tickets: Vec<(String, String, String)>,
    /// Each ticket's code (signed with the cluster's key ring).
    pub codes: Vec<String>,
    /// What was charged.
    pub amount_cents: u64,
}

impl OrderSeen {
    /// From the wire.
    pub fn of(o: &pb::Order) -> OrderSeen {
        OrderSeen {
            id: o.order_id.clone(),
            hold: o.hold_id.clone(),
            tickets: o
                .tickets
                .iter()
                .map(|t| (t.ticket_id.clone(), t.section_id.clone(), t.seat_id.clone()))
                .collect(),
            codes: o.tickets.iter().map(|t| t.code.clone()).collect(),
            amount_cents: o.amount_cents,
        }
    }

    /// Places sold by this order in `section`.
    pub fn places_in(&self, section: &str) -> usize {
        self.tickets.iter().filter(|(_, s, _)| s == section).count()
    }
}

/// A section's counts as `GetEvent` showed them: `(section, capacity, available, held, sold)`.
pub type Counts = (String, u32, u32, u32, u32);

/// What came back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A queue standing: `(position, state, admission token)`.
    Queue(u64, i32, String),
    /// A queue token (from `Join`).
    Joined(String, u64),
    /// A hold.
    Hold(HoldSeen),
    /// A batch's items: each a hold or a definite refusal `(code, reason)`.
    Batch(Vec<Result<HoldSeen, (i32, String)>>),
    /// An order.
    Order(OrderSeen),
    /// `Release` succeeded.
    Released,
    /// An event's sections.
    Event(Vec<Counts>),
    /// A waitlist entry: `(id, state, offered hold)`.
    Entry(String, i32, String),
    /// A definite refusal: the gRPC code and the contract's reason.
    Refused(i32, String),
    /// No definite answer: the call failed on the way (node down, no leader, timeout,
    /// overloaded, key in flight); the fan may retry it, with the same key.
    Failed(i32, String),
}

impl Answer {
    /// Whether the answer is definite (the call's outcome is known).
    pub fn definite(&self) -> bool {
        !matches!(self, Answer::Failed(..))
    }

    /// The answer of a failed call: definite (`Refused`) or not (`Failed`).
    pub fn of_status(s: &tonic::Status) -> Answer {
        let reason = boxoffice_client::reason(s).unwrap_or_default();
        let code = s.code() as i32;
        // docs/api.md 2.8: what is indefinite, and what is transient.
        let transient = matches!(
            s.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
                | tonic::Code::Unknown
        ) || (s.code() == tonic::Code::Internal && reason.is_empty())
            || reason == "OVERLOADED"
            || reason == "IDEMPOTENCY_KEY_IN_FLIGHT";
        if transient {
            Answer::Failed(code, reason)
        } else {
            Answer::Refused(code, reason)
        }
    }

    /// The contract's reason of a refusal (empty otherwise).
    pub fn reason(&self) -> &str {
        match self {
            Answer::Refused(_, r) | Answer::Failed(_, r) => r,
            _ => "",
        }
    }
}

/// One call: who made it, through which node, when, and what came back.
#[derive(Clone, Debug)]
pub struct Call {
    /// The fan.
    pub fan: Fan,
    /// The call.
    pub op: Op,
    /// The node it was sent to.
    pub node: u64,
    /// Virtual ms when it was sent.
    pub invoked_ms: u64,
    /// Virtual ms when it was answered.
    pub completed_ms: u64,
    /// The answer.
    pub answer: Answer,
}

/// Everything that happened in a run, in the order it happened: calls, and the faults the
/// driver injected.
#[derive(Default)]
pub struct History {
    /// Every call, in the order the answers came.
    pub calls: Vec<Call>,
    /// The faults, `(virtual ms, what)`.
    pub faults: Vec<(u64, String)>,
    /// Calls and faults as lines, in the order they happened: the run's trace.
    trace: String,
}

impl History {
    /// Adds a call.
    pub fn call(&mut self, c: Call) {
        let _ = writeln!(
            self.trace,
            "{}..{} fan{} n{} {:?} -> {:?}",
            c.invoked_ms, c.completed_ms, c.fan, c.node, c.op, c.answer
        );
        self.calls.push(c);
    }

    /// Adds a fault injected at `at_ms`.
    pub fn fault(&mut self, at_ms: u64, what: String) {
        let _ = writeln!(self.trace, "{at_ms} fault {what}");
        self.faults.push((at_ms, what));
    }

    /// Adds a line of anything else that belongs to the trace (the checkers' findings).
    pub fn note(&mut self, line: &str) {
        let _ = writeln!(self.trace, "{line}");
    }

    /// The run's trace: every call, fault and note as one text, in order.
    pub fn trace(&self) -> &str {
        &self.trace
    }
}

/// The history, shared by the fans (who add calls) and the driver (which adds faults and
/// checks as it goes).
pub type Shared = Arc<Mutex<History>>;

/// Locks `h` (a panic elsewhere leaves plain data).
pub fn lock(h: &Shared) -> std::sync::MutexGuard<'_, History> {
    h.lock().unwrap_or_else(|p| p.into_inner())
}
