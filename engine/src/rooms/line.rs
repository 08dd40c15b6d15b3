//! A waiting room's line as data: its records and what they leave (see [`crate::rooms`]). Below
//! the rooms component, so that recovery and warm starts, which rebuild lines, need nothing of it.

use serde::{Deserialize, Serialize};

/// One change of a waiting room's line (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoomRecord {
    /// Join numbers below `upto` may be handed out.
    Reserved {
        /// The first number not reserved.
        upto: u32,
    },
    /// The opening draw shuffled the join numbers below `drawn`.
    Opened {
        /// How many join numbers were drawn.
        drawn: u32,
    },
    /// Positions `from..to` (0-based) were admitted at `at_ms`.
    Admitted {
        /// The first position admitted (the line's admission frontier before).
        from: u64,
        /// The first position not admitted.
        to: u64,
        /// When, ms since the Unix epoch.
        at_ms: u64,
    },
}

/// A waiting room's line as its records leave it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomLine {
    /// Join numbers below this may have been handed out.
    pub reserved: u32,
    /// The opening draw's size, once the room opened.
    pub drawn: Option<u32>,
    /// Admissions, in order and contiguous from position 0: `(from, to, at_ms)`.
    pub admitted: Vec<(u64, u64, u64)>,
}

impl RoomLine {
    /// The first position not admitted.
    pub fn admitted_upto(&self) -> u64 {
        self.admitted.last().map_or(0, |(_, to, _)| *to)
    }

    /// Applies one record; a record that does not fit the line is refused (and not applied).
    pub fn apply(&mut self, r: &RoomRecord) -> Result<(), String> {
        match *r {
            RoomRecord::Reserved { upto } => self.reserved = self.reserved.max(upto),
            RoomRecord::Opened { drawn } => match self.drawn {
                Some(d) if d != drawn => {
                    return Err(format!("opened twice: {d} then {drawn} drawn"));
                }
                _ => self.drawn = Some(drawn),
            },
            RoomRecord::Admitted { from, to, at_ms } => {
                if from != self.admitted_upto() || to <= from {
                    return Err(format!(
                        "admitted {from}..{to} after {}",
                        self.admitted_upto()
                    ));
                }
                if self.drawn.is_none() {
                    return Err("admitted before the opening".into());
                }
                self.admitted.push((from, to, at_ms));
            }
        }
        Ok(())
    }
}
