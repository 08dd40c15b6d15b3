//! Identifiers: newtypes over `String`, so an event id can never be passed where a user id is
//! wanted. Ids the caller chooses (event, section, row label) are restricted to
//! `[A-Za-z0-9_-]`, which lets the engine build hold, order and seat ids that carry their route:
//!
//! | id | format | example |
//! |---|---|---|
//! | seat | `{section_id}:{row_label}:{number}` (numbers start at 1) | `orch:A:12` |
//! | hold | `{event_id}.{section_id}.h{ulid}` | `e9.orch.h01JD…` |
//! | order | `{event_id}.{section_id}.o{ulid}` | `e9.orch.o01JD…` |
//! | ticket | `{order_id}.{n}` (n from 1) | `e9.orch.o01JD….1` |
//!
//! The router needs nothing but the id to find the section actor that owns a hold or an order.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::limits::ID_LEN_MAX;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub struct $name(pub String);

        impl $name {
            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
    };
}

id_type!(
    /// An event (one show on sale). Chosen by the caller or generated; `[A-Za-z0-9_-]{1,64}`.
    EventId
);
id_type!(
    /// A section of an event, unique within the event; `[A-Za-z0-9_-]{1,64}`.
    SectionId
);
id_type!(
    /// A seat, unique within its event: `{section_id}:{row_label}:{number}`.
    SeatId
);
id_type!(
    /// A hold: `{event_id}.{section_id}.h{ulid}`.
    HoldId
);
id_type!(
    /// An order: `{event_id}.{section_id}.o{ulid}`.
    OrderId
);
id_type!(
    /// A user (a fan), as the calling service names them; 1 to 64 bytes, no control characters.
    UserId
);

/// Whether `s` is a valid caller-chosen id (event, section): `[A-Za-z0-9_-]`, 1 to `max` bytes.
pub fn is_plain_id(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl SeatId {
    /// Builds the seat id of seat `number` (from 1) in row `row` of section `section`.
    pub fn new(section: &SectionId, row: &str, number: u32) -> SeatId {
        SeatId(format!("{section}:{row}:{number}"))
    }

    /// Splits a seat id into (section, row label, number), or `None` if it is not of our format.
    pub fn parse(&self) -> Option<(&str, &str, u32)> {
        let mut parts = self.0.split(':');
        let section = parts.next()?;
        let row = parts.next()?;
        let number: u32 = parts.next()?.parse().ok()?;
        if parts.next().is_some() || !is_plain_id(section, ID_LEN_MAX) {
            return None;
        }
        Some((section, row, number))
    }
}

/// The route a hold or order id carries: which event and section own it.
fn route_of(id: &str, tag: char) -> Option<(EventId, SectionId)> {
    let mut parts = id.split('.');
    let event = parts.next()?;
    let section = parts.next()?;
    let rest = parts.next()?;
    if parts.next().is_some()
        || !rest.starts_with(tag)
        || rest.len() < 2
        || !is_plain_id(event, ID_LEN_MAX)
        || !is_plain_id(section, ID_LEN_MAX)
    {
        return None;
    }
    Some((EventId::from(event), SectionId::from(section)))
}

impl HoldId {
    /// A new hold id in `section` of `event`, made unique by a ULID.
    pub fn generate(event: &EventId, section: &SectionId) -> HoldId {
        HoldId(format!("{event}.{section}.h{}", crate::rt::ulid()))
    }

    /// The (event, section) this hold belongs to, or `None` if the id is not one of ours.
    pub fn route(&self) -> Option<(EventId, SectionId)> {
        route_of(&self.0, 'h')
    }
}

impl OrderId {
    /// A new order id in `section` of `event`, made unique by a ULID.
    pub fn generate(event: &EventId, section: &SectionId) -> OrderId {
        OrderId(format!("{event}.{section}.o{}", crate::rt::ulid()))
    }

    /// The (event, section) this order belongs to, or `None` if the id is not one of ours.
    pub fn route(&self) -> Option<(EventId, SectionId)> {
        route_of(&self.0, 'o')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_and_order_ids_carry_their_route() {
        let e = EventId::from("e9");
        let s = SectionId::from("orch-left");
        let h = HoldId::generate(&e, &s);
        assert_eq!(h.route(), Some((e.clone(), s.clone())));
        let o = OrderId::generate(&e, &s);
        assert_eq!(o.route(), Some((e, s)));
        assert_eq!(
            HoldId::from(o.as_str()).route(),
            None,
            "an order id is no hold id"
        );
        assert_eq!(HoldId::from("nonsense").route(), None);
        assert_eq!(HoldId::from("a.b.h").route(), None);
        assert_eq!(HoldId::from("a.b.hx.y").route(), None);
    }

    #[test]
    fn seat_ids_round_trip() {
        let s = SeatId::new(&SectionId::from("orch"), "AA", 12);
        assert_eq!(s.as_str(), "orch:AA:12");
        assert_eq!(s.parse(), Some(("orch", "AA", 12)));
        assert_eq!(SeatId::from("orch:AA").parse(), None);
        assert_eq!(SeatId::from("orch:AA:x").parse(), None);
        assert_eq!(SeatId::from("orch:AA:1:2").parse(), None);
    }
}
