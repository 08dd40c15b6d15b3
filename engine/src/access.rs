//! Presale access codes: which sections need a code, the codes (stored as digests, never in
//! plain text), the rules a hold's code is judged by, and [`Redemptions`], the exact count of
//! each code's uses.
//!
//! - A section listed in [`Presale::sections`] requires a code until [`Presale::ends_at_ms`]
//!   (0: for good); afterwards it is on sale to everyone.
//! - A code unlocks the code-requiring sections it lists (none listed: all of them), from
//!   `valid_from_ms` until `valid_until_ms` (0: no bound). Each place held under it is one use;
//!   its uses never exceed `max_uses`: they are taken before the section is asked, all or none
//!   ([`Redemptions::take`]), given back if the hold fails, and given back when the hold is
//!   released or expires (once that is durable, as the user's quota is). A confirmed hold keeps
//!   its uses, even if its tickets are later given back.
//! - A code is judged only where one is needed: a hold of a public section ignores it.
//!
//! Uses are not logged on their own: a hold records the code it used
//! ([`crate::core::SectionRecord::HoldPlacedWithCode`]), and recovery counts them from the
//! sections' holds (see [`Redemptions::of_counts`]).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Rejection;
use crate::hash::DashMap;
use crate::ids::{EventId, SectionId};

/// Longest accepted access code, in bytes.
pub const ACCESS_CODE_LEN_MAX: usize = 64;
/// Shortest accepted access code, in bytes.
pub const ACCESS_CODE_LEN_MIN: usize = 8;
/// Most access codes one event may have.
pub const ACCESS_CODES_PER_EVENT_MAX: usize = 10_000;
/// Most uses one access code may have.
pub const ACCESS_CODE_USES_MAX: u32 = 1_000_000;

/// An event's presale: the sections that require a code, until when, and the codes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Presale {
    /// The sections that require a code.
    pub sections: Vec<SectionId>,
    /// When they stop requiring one, ms since the Unix epoch (0: never).
    pub ends_at_ms: u64,
    /// The codes, in the order given (a code's index is its number in holds and counts).
    pub codes: Vec<AccessCode>,
}

/// One access code as the engine keeps it: its digest, never the code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessCode {
    /// SHA-256 of the code (with a fixed domain prefix), lower-case hex.
    pub digest: String,
    /// Places that may be held under it, in all.
    pub max_uses: u32,
    /// From when it is valid, ms since the Unix epoch (0: from the start).
    pub valid_from_ms: u64,
    /// Until when it is valid, ms since the Unix epoch (0: no end).
    pub valid_until_ms: u64,
    /// The code-requiring sections it unlocks (empty: all of them).
    pub section_ids: Vec<SectionId>,
}

impl AccessCode {
    /// A code from its plain text (which is dropped: only its digest is kept).
    pub fn new(
        code: &str,
        max_uses: u32,
        valid_from_ms: u64,
        valid_until_ms: u64,
        section_ids: Vec<SectionId>,
    ) -> AccessCode {
        AccessCode {
            digest: digest(code),
            max_uses,
            valid_from_ms,
            valid_until_ms,
            section_ids,
        }
    }

    /// The name operators see for it: the first 12 hex digits of its digest.
    pub fn code_id(&self) -> &str {
        &self.digest[..self.digest.len().min(12)]
    }

    fn unlocks(&self, section: &SectionId) -> bool {
        self.section_ids.is_empty() || self.section_ids.contains(section)
    }

    fn valid_at(&self, now_ms: u64) -> bool {
        now_ms >= self.valid_from_ms && (self.valid_until_ms == 0 || now_ms < self.valid_until_ms)
    }
}

/// The digest a code is kept and looked up by.
pub fn digest(code: &str) -> String {
    let d = Sha256::new()
        .chain_update(b"boxoffice-access-code\0")
        .chain_update(code.as_bytes())
        .finalize();
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks a code as a caller gives it (`field` names it): 8 to 64 characters of
/// `[A-Za-z0-9_-]`.
pub fn check_code(field: &str, code: &str) -> Result<(), Rejection> {
    let ok = (ACCESS_CODE_LEN_MIN..=ACCESS_CODE_LEN_MAX).contains(&code.len())
        && code
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Rejection::invalid(
            field,
            format!(
                "must be {ACCESS_CODE_LEN_MIN} to {ACCESS_CODE_LEN_MAX} characters of [A-Za-z0-9_-]"
            ),
        ))
    }
}

impl Presale {
    /// Whether `section` requires a code at `now_ms`.
    pub fn requires(&self, section: &SectionId, now_ms: u64) -> bool {
        (self.ends_at_ms == 0 || now_ms < self.ends_at_ms) && self.sections.contains(section)
    }

    /// Checks the presale against the event's sections (`sections`, their ids in order).
    pub fn validate(&self, sections: &[SectionId]) -> Result<(), Rejection> {
        let mut seen = std::collections::HashSet::new();
        for (i, s) in self.sections.iter().enumerate() {
            if !sections.contains(s) {
                return Err(Rejection::invalid(
                    &format!("presale_section_ids[{i}]"),
                    "not a section of this event",
                ));
            }
            if !seen.insert(s) {
                return Err(Rejection::invalid(
                    &format!("presale_section_ids[{i}]"),
                    "listed twice",
                ));
            }
        }
        if self.codes.len() > ACCESS_CODES_PER_EVENT_MAX {
            return Err(Rejection::invalid(
                "access_codes",
                format!("at most {ACCESS_CODES_PER_EVENT_MAX} codes"),
            ));
        }
        if !self.codes.is_empty() && self.sections.is_empty() {
            return Err(Rejection::invalid(
                "access_codes",
                "codes need a section that requires one (presale_section_ids)",
            ));
        }
        let mut digests = std::collections::HashSet::new();
        for (i, c) in self.codes.iter().enumerate() {
            c.validate(i, &self.sections)?;
            if !digests.insert(&c.digest) {
                return Err(Rejection::invalid(
                    &format!("access_codes[{i}].code"),
                    "given twice",
                ));
            }
        }
        Ok(())
    }

    /// Judges a hold's `code` for the sections it may go to (`candidates`, in order) at
    /// `now_ms`: the sections it may go to after all, and the code's number if it is counted.
    /// One named section that requires a code: the code must unlock it. Any section (several
    /// candidates): with a code, only the sections it unlocks; without, only the public ones.
    pub fn judge(
        &self,
        candidates: Vec<SectionId>,
        code: &str,
        any_section: bool,
        now_ms: u64,
    ) -> Result<(Vec<SectionId>, Option<u32>), Rejection> {
        if self.sections.is_empty() {
            // No presale: nothing to judge (the common case costs nothing).
            return Ok((candidates, None));
        }
        let needs: Vec<bool> = candidates
            .iter()
            .map(|s| self.requires(s, now_ms))
            .collect();
        if !needs.iter().any(|n| *n) {
            return Ok((candidates, None));
        }
        if code.is_empty() {
            let public: Vec<SectionId> = candidates
                .into_iter()
                .zip(&needs)
                .filter(|(_, n)| !**n)
                .map(|(s, _)| s)
                .collect();
            if any_section && !public.is_empty() {
                return Ok((public, None));
            }
            return Err(Rejection::AccessCodeRequired);
        }
        let d = digest(code);
        let (index, found) = self
            .codes
            .iter()
            .enumerate()
            .find(|(_, c)| c.digest == d)
            .ok_or(Rejection::AccessCodeInvalid)?;
        if !found.valid_at(now_ms) {
            return Err(Rejection::AccessCodeInvalid);
        }
        let unlocked: Vec<SectionId> = candidates
            .into_iter()
            .zip(&needs)
            .filter(|(s, n)| **n && found.unlocks(s))
            .map(|(s, _)| s)
            .collect();
        if unlocked.is_empty() {
            return Err(Rejection::AccessCodeInvalid);
        }
        let index = u32::try_from(index).expect("codes are bounded by validation");
        Ok((unlocked, Some(index)))
    }
}

impl AccessCode {
    fn validate(&self, i: usize, presale_sections: &[SectionId]) -> Result<(), Rejection> {
        let field = |f: &str| format!("access_codes[{i}].{f}");
        if self.max_uses == 0 || self.max_uses > ACCESS_CODE_USES_MAX {
            return Err(Rejection::invalid(
                &field("max_uses"),
                format!("must be 1 to {ACCESS_CODE_USES_MAX}"),
            ));
        }
        if self.valid_until_ms != 0 && self.valid_until_ms <= self.valid_from_ms {
            return Err(Rejection::invalid(
                &field("valid_until_unix_ms"),
                "must be after valid_from_unix_ms (or 0: no end)",
            ));
        }
        for (j, s) in self.section_ids.iter().enumerate() {
            if !presale_sections.contains(s) {
                return Err(Rejection::invalid(
                    &field(&format!("section_ids[{j}]")),
                    "not a section that requires a code (presale_section_ids)",
                ));
            }
        }
        Ok(())
    }
}

/// Each code's uses now, exactly: taken before a hold is placed, given back when it fails,
/// is released or expires. Shared by the hold path and the section actors (which give uses
/// back once an ended hold is durable).
#[derive(Default)]
pub(crate) struct Redemptions {
    used: DashMap<(EventId, u32), u32>,
}

impl Redemptions {
    /// Counts as recovery made them: (event, code, places held or sold under it), each
    /// triple adding to its code's count (see `recovery::settle`).
    pub(crate) fn of_counts(counts: impl IntoIterator<Item = (EventId, u32, u32)>) -> Redemptions {
        let r = Redemptions::default();
        let mut totals: std::collections::BTreeMap<EventId, u32> = Default::default();
        for (event, code, places) in counts {
            *totals.entry(event.clone()).or_default() += places;
            *r.used.entry((event, code)).or_default() += places;
        }
        // Set, not added: an engine opened again in the same process starts from its log.
        for (event, total) in totals {
            gauge(&event).set(f64::from(total));
        }
        r
    }

    /// Takes `n` uses of `code` of `event` if that keeps them within `max`: all or none.
    pub(crate) fn take(&self, event: &EventId, code: u32, max: u32, n: u32) -> bool {
        let mut used = self.used.entry((event.clone(), code)).or_default();
        match used.checked_add(n) {
            Some(after) if after <= max => {
                *used = after;
                gauge(event).increment(f64::from(n));
                true
            }
            _ => false,
        }
    }

    /// Gives `n` uses of `code` of `event` back.
    pub(crate) fn give_back(&self, event: &EventId, code: u32, n: u32) {
        if let Some(mut used) = self.used.get_mut(&(event.clone(), code)) {
            let back = n.min(*used);
            *used -= back;
            gauge(event).decrement(f64::from(back));
        }
    }

    /// The uses of `code` of `event` now.
    pub(crate) fn used(&self, event: &EventId, code: u32) -> u32 {
        self.used.get(&(event.clone(), code)).map_or(0, |u| *u)
    }
}

/// `boxoffice_access_code_uses{event}`: places held or sold under an access code now.
fn gauge(event: &EventId) -> metrics::Gauge {
    metrics::gauge!("boxoffice_access_code_uses", "event" => event.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn presale(ends_at_ms: u64) -> Presale {
        Presale {
            sections: vec!["vip".into(), "pit".into()],
            ends_at_ms,
            codes: vec![
                AccessCode::new("FANCLUB-1", 10, 100, 200, vec![]),
                AccessCode::new("PIT-ONLY", 10, 0, 0, vec!["pit".into()]),
            ],
        }
    }

    fn ids(v: &[&str]) -> Vec<SectionId> {
        v.iter().map(|s| SectionId::from(*s)).collect()
    }

    #[test]
    fn codes_are_judged_only_where_needed_and_only_while_valid() {
        let p = presale(1_000);
        // A public section ignores the code, right or wrong.
        assert_eq!(
            p.judge(ids(&["floor"]), "nope", false, 150),
            Ok((ids(&["floor"]), None))
        );
        // A section that requires one.
        assert_eq!(
            p.judge(ids(&["vip"]), "", false, 150),
            Err(Rejection::AccessCodeRequired)
        );
        assert_eq!(
            p.judge(ids(&["vip"]), "WRONG-CODE", false, 150),
            Err(Rejection::AccessCodeInvalid)
        );
        assert_eq!(
            p.judge(ids(&["vip"]), "FANCLUB-1", false, 150),
            Ok((ids(&["vip"]), Some(0)))
        );
        // Outside its window: before and after.
        for at in [99, 200] {
            assert_eq!(
                p.judge(ids(&["vip"]), "FANCLUB-1", false, at),
                Err(Rejection::AccessCodeInvalid),
                "{at}"
            );
        }
        // A code for other sections.
        assert_eq!(
            p.judge(ids(&["vip"]), "PIT-ONLY", false, 150),
            Err(Rejection::AccessCodeInvalid)
        );
        // Any section: with a code, the ones it unlocks; without, the public ones.
        let all = ids(&["floor", "vip", "pit"]);
        assert_eq!(
            p.judge(all.clone(), "PIT-ONLY", true, 150),
            Ok((ids(&["pit"]), Some(1)))
        );
        assert_eq!(
            p.judge(all.clone(), "", true, 150),
            Ok((ids(&["floor"]), None))
        );
        // After the presale everything is public and codes are ignored.
        assert_eq!(
            p.judge(all.clone(), "WRONG-CODE", true, 1_000),
            Ok((all, None))
        );
    }

    #[test]
    fn uses_are_taken_all_or_none_and_never_past_the_cap() {
        let r = Redemptions::default();
        let e = EventId::from("e");
        assert!(r.take(&e, 0, 5, 3));
        assert!(!r.take(&e, 0, 5, 3), "3 + 3 > 5: none taken");
        assert_eq!(r.used(&e, 0), 3);
        assert!(r.take(&e, 0, 5, 2));
        r.give_back(&e, 0, 4);
        assert_eq!(r.used(&e, 0), 1);
        assert_eq!(r.used(&e, 1), 0);
    }

    #[test]
    fn bad_presales_are_refused_naming_the_field() {
        let sections = ids(&["floor", "vip", "pit"]);
        assert!(presale(0).validate(&sections).is_ok());
        let mut p = presale(0);
        p.codes.push(AccessCode::new("FANCLUB-1", 1, 0, 0, vec![]));
        assert_eq!(
            p.validate(&sections).unwrap_err().field(),
            Some("access_codes[2].code")
        );
        let mut p = presale(0);
        p.codes[1].max_uses = 0;
        assert_eq!(
            p.validate(&sections).unwrap_err().field(),
            Some("access_codes[1].max_uses")
        );
        let mut p = presale(0);
        p.codes[1].section_ids = ids(&["floor"]);
        assert_eq!(
            p.validate(&sections).unwrap_err().field(),
            Some("access_codes[1].section_ids[0]")
        );
        let mut p = presale(0);
        p.sections.push("nowhere".into());
        assert_eq!(
            p.validate(&sections).unwrap_err().field(),
            Some("presale_section_ids[2]")
        );
        assert!(check_code("access_code", "abc").is_err());
        assert!(check_code("access_code", "FAN CLUB").is_err());
        assert!(check_code("access_code", "FAN-club_9").is_ok());
        assert_ne!(digest("a-code"), digest("b-code"));
        assert!(!presale(0).codes[0].digest.contains("FANCLUB"));
    }
}
