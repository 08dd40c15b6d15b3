//! [`DeadlineIndex`]: every section's earliest active-hold deadline, ordered, and the one timer
//! that wakes the sweeper for the earliest. Pure: no actor, no clock, no IO.
//!
//! Timers are numbered by a generation: re-arming (an earlier deadline came in) makes the old
//! timer stale, and a stale timer's tick is ignored.

use boxoffice_engine::hash::HashMap;
use std::collections::BTreeSet;

use boxoffice_engine::{EventId, SectionId};

/// See the module docs.
#[derive(Debug, Default)]
pub struct DeadlineIndex {
    index: BTreeSet<(u64, EventId, SectionId)>,
    by_section: HashMap<(EventId, SectionId), u64>,
    timer_at: Option<u64>,
    generation: u64,
}

/// A timer to set: wake at `at_ms` with this `generation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arm {
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// The generation to tick with.
    pub generation: u64,
}

impl DeadlineIndex {
    /// Sets a section's earliest deadline (`None`: no active hold).
    pub fn set(&mut self, event: EventId, section: SectionId, next: Option<u64>) {
        let key = (event, section);
        if let Some(old) = self.by_section.remove(&key) {
            self.index.remove(&(old, key.0.clone(), key.1.clone()));
        }
        if let Some(d) = next {
            self.index.insert((d, key.0.clone(), key.1.clone()));
            self.by_section.insert(key, d);
        }
    }

    /// The section with the earliest deadline, if it is due at `now_ms`.
    pub fn first_due(&self, now_ms: u64) -> Option<(EventId, SectionId)> {
        self.index
            .first()
            .filter(|(d, _, _)| *d <= now_ms)
            .map(|(_, e, s)| (e.clone(), s.clone()))
    }

    /// Whether anything is due at `now_ms`.
    pub fn is_due(&self, now_ms: u64) -> bool {
        self.first_due(now_ms).is_some()
    }

    /// The earliest deadline of all.
    pub fn earliest(&self) -> Option<u64> {
        self.index.first().map(|(d, _, _)| *d)
    }

    /// Sections with a deadline.
    pub fn len(&self) -> usize {
        self.by_section.len()
    }

    /// Whether no section has a deadline.
    pub fn is_empty(&self) -> bool {
        self.by_section.is_empty()
    }

    /// The timer to set for the earliest deadline, unless the one set already is for it.
    pub fn rearm(&mut self) -> Option<Arm> {
        let earliest = self.earliest();
        if earliest == self.timer_at {
            return None;
        }
        self.timer_at = earliest;
        self.generation += 1;
        earliest.map(|at_ms| Arm {
            at_ms,
            generation: self.generation,
        })
    }

    /// A timer ticked: whether it is the current one (stale ones are ignored).
    pub fn tick(&mut self, generation: u64) -> bool {
        if generation == self.generation {
            self.timer_at = None;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> (EventId, SectionId) {
        (EventId::from("e"), SectionId::from(s))
    }

    #[test]
    fn orders_sections_by_deadline_and_moves_them() {
        let mut ix = DeadlineIndex::default();
        ix.set(key("a").0, key("a").1, Some(300));
        ix.set(key("b").0, key("b").1, Some(100));
        assert_eq!(ix.earliest(), Some(100));
        assert_eq!(ix.first_due(99), None);
        assert_eq!(ix.first_due(100), Some(key("b")));
        ix.set(key("b").0, key("b").1, Some(400));
        assert_eq!(ix.first_due(350), Some(key("a")));
        ix.set(key("a").0, key("a").1, None);
        assert_eq!((ix.len(), ix.earliest()), (1, Some(400)));
        ix.set(key("b").0, key("b").1, None);
        assert!(ix.is_empty() && !ix.is_due(u64::MAX));
    }

    #[test]
    fn one_current_timer_and_stale_ticks_ignored() {
        let mut ix = DeadlineIndex::default();
        assert_eq!(ix.rearm(), None, "nothing to wait for");
        ix.set(key("a").0, key("a").1, Some(500));
        let first = ix.rearm().expect("armed for 500");
        assert_eq!(first.at_ms, 500);
        assert_eq!(ix.rearm(), None, "already armed for the earliest");
        ix.set(key("b").0, key("b").1, Some(200));
        let second = ix.rearm().expect("an earlier deadline re-arms");
        assert_eq!(second.at_ms, 200);
        assert!(!ix.tick(first.generation), "the old timer is stale");
        assert!(ix.tick(second.generation));
        assert_eq!(
            ix.rearm().map(|a| a.at_ms),
            Some(200),
            "after a tick the timer is re-armed"
        );
    }
}
