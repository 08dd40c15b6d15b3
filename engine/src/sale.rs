//! Sale controls (issue 28): what an operator may change about a live sale, and how a change is
//! judged. Data and pure rules only; the catalog ([`crate::catalog`]) records a change and the
//! sections ([`crate::core`]) act on it.
//!
//! - **States.** `Open`; `Paused` (new holds and joins refused, existing holds may still confirm
//!   and their deadlines stand still: each section extends them by the pause's length when the
//!   sale goes on); `QueueAll` (joins accepted, nobody admitted; holds of fans already admitted
//!   go on); `Ended` (final: holds and joins refused).
//! - **Settings.** The admission rate, the hold TTL of new holds and the per-user limit. A lower
//!   limit takes nothing away: a user who holds or owns more keeps it and may hold no more.
//! - Each change is one `catalog` record ([`crate::types::CatalogRecord::SaleUpdated`]) carrying
//!   the whole controls after it, so the latest record is the truth after a restart or a
//!   failover; the sections then follow it ([`crate::core::SaleChange`]).

use serde::{Deserialize, Serialize};

use crate::error::Rejection;
use crate::limits::{HOLD_TTL_MS_MAX, PER_USER_LIMIT_MAX};

/// Most admissions per second an event may be set to (as at creation).
pub const ADMIT_RATE_PER_SECOND_MAX: u32 = 1_000_000;

/// Where a sale stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SaleState {
    /// Holds and joins accepted, the line admitted at the rate.
    Open,
    /// New holds and joins refused (`SALE_PAUSED`); holds that exist may confirm, and their
    /// deadlines are extended by the pause's length.
    Paused,
    /// Joins accepted, nobody admitted.
    QueueAll,
    /// Final: holds and joins refused (`SALE_ENDED`).
    Ended,
}

impl SaleState {
    /// Every state, in API order.
    pub const ALL: [SaleState; 4] = [
        SaleState::Open,
        SaleState::Paused,
        SaleState::QueueAll,
        SaleState::Ended,
    ];

    /// The state's name as the API spells it (`SALE_STATE_` and this).
    pub fn name(self) -> &'static str {
        match self {
            SaleState::Open => "OPEN",
            SaleState::Paused => "PAUSED",
            SaleState::QueueAll => "QUEUE_ALL",
            SaleState::Ended => "ENDED",
        }
    }

    /// Whether the waiting room admits anybody in this state.
    pub fn admits(self) -> bool {
        self == SaleState::Open
    }

    /// The refusal a new hold or join gets in this state, if any.
    pub fn refusal(self) -> Option<Rejection> {
        match self {
            SaleState::Paused => Some(Rejection::SalePaused),
            SaleState::Ended => Some(Rejection::SaleEnded),
            SaleState::Open | SaleState::QueueAll => None,
        }
    }
}

/// An event's sale controls as they stand: the state and the settings an operator may change,
/// with when each last changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaleControls {
    /// The state.
    pub state: SaleState,
    /// Waiting-room admissions per second.
    pub admit_rate_per_second: u32,
    /// How long a new hold lasts, ms.
    pub hold_ttl_ms: u64,
    /// Places one user may hold or own.
    pub per_user_limit: u32,
    /// When the state last changed (the event's creation until it did), ms since the epoch.
    pub state_changed_at_ms: u64,
    /// When the admission rate last changed (creation until it did).
    pub rate_changed_at_ms: u64,
    /// When the hold TTL, the per-user limit or the hold cool-down last changed (creation until
    /// one did).
    pub terms_changed_at_ms: u64,
    /// How long after a user's hold expired they may not hold again, ms (0: no cool-down).
    pub hold_cooldown_ms: u64,
}

impl SaleControls {
    /// The controls after `update` at `now_ms`, or why it is refused. `None`: it changes
    /// nothing (answered as it stands, nothing recorded).
    pub fn after(
        &self,
        update: &SaleUpdate,
        now_ms: u64,
    ) -> Result<Option<SaleControls>, Rejection> {
        let (rate, ttl_s, limit) = update.settings()?;
        let cooldown_s = checked(
            update.hold_cooldown_seconds,
            "hold_cooldown_seconds",
            HOLD_TTL_MS_MAX / 1000,
            0,
        )?;
        let settings = rate.is_some() || ttl_s.is_some() || limit.is_some() || cooldown_s.is_some();
        if update.state.is_none() && !settings {
            return Err(Rejection::invalid(
                "state",
                "set the state or at least one setting to change",
            ));
        }
        if self.state == SaleState::Ended {
            // Final: ending it again changes nothing; anything else is refused (not even the
            // settings change: nothing would read them).
            let again = update.state == Some(SaleState::Ended) && !settings;
            return if again {
                Ok(None)
            } else {
                Err(Rejection::SaleEnded)
            };
        }
        let mut next = self.clone();
        if let Some(state) = update.state
            && state != self.state
        {
            next.state = state;
            next.state_changed_at_ms = now_ms;
        }
        if let Some(rate) = rate {
            let rate = u32::try_from(rate).expect("checked against the maximum");
            if rate != self.admit_rate_per_second {
                next.admit_rate_per_second = rate;
                next.rate_changed_at_ms = now_ms;
            }
        }
        if let Some(ttl_s) = ttl_s
            && ttl_s * 1000 != self.hold_ttl_ms
        {
            next.hold_ttl_ms = ttl_s * 1000;
            next.terms_changed_at_ms = now_ms;
        }
        if let Some(cooldown_s) = cooldown_s
            && cooldown_s * 1000 != self.hold_cooldown_ms
        {
            next.hold_cooldown_ms = cooldown_s * 1000;
            next.terms_changed_at_ms = now_ms;
        }
        if let Some(limit) = limit {
            let limit = u32::try_from(limit).expect("checked against the maximum");
            if limit != self.per_user_limit {
                next.per_user_limit = limit;
                next.terms_changed_at_ms = now_ms;
            }
        }
        Ok((next != *self).then_some(next))
    }
}

impl SaleUpdate {
    /// The settings asked for, each checked against its range: the admission rate, the hold
    /// TTL in seconds, the per-user limit.
    #[allow(clippy::type_complexity)]
    fn settings(&self) -> Result<(Option<u64>, Option<u64>, Option<u64>), Rejection> {
        Ok((
            checked(
                self.admit_rate_per_second,
                "admit_rate_per_second",
                u64::from(ADMIT_RATE_PER_SECOND_MAX),
                0,
            )?,
            checked(
                self.hold_ttl_seconds,
                "hold_ttl_seconds",
                HOLD_TTL_MS_MAX / 1000,
                1,
            )?,
            checked(
                self.per_user_limit,
                "per_user_limit",
                u64::from(PER_USER_LIMIT_MAX),
                1,
            )?,
        ))
    }
}

/// A setting as asked: absent, or within `min..=max` (a negative or larger value is refused,
/// naming the field as the API does).
fn checked(value: Option<i64>, field: &str, max: u64, min: u64) -> Result<Option<u64>, Rejection> {
    let Some(v) = value else {
        return Ok(None);
    };
    match u64::try_from(v) {
        Ok(v) if (min..=max).contains(&v) => Ok(Some(v)),
        _ => Err(Rejection::invalid(field, format!("must be {min} to {max}"))),
    }
}

/// What an `UpdateSale` asks to change; absent fields stay as they are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaleUpdate {
    /// The new state.
    pub state: Option<SaleState>,
    /// Admissions per second (0 to 1,000,000; 0 admits nobody).
    pub admit_rate_per_second: Option<i64>,
    /// The TTL of holds placed from now on, seconds (1 to 86,400).
    pub hold_ttl_seconds: Option<i64>,
    /// Places one user may hold or own (1 to 100); lowering it takes nothing away.
    pub per_user_limit: Option<i64>,
    /// Seconds after a user's hold expired before they may hold again (0 to 86,400; 0: none).
    pub hold_cooldown_seconds: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> SaleControls {
        SaleControls {
            state: SaleState::Open,
            admit_rate_per_second: 500,
            hold_ttl_ms: 600_000,
            per_user_limit: 4,
            state_changed_at_ms: 1,
            rate_changed_at_ms: 1,
            terms_changed_at_ms: 1,
            hold_cooldown_ms: 0,
        }
    }

    #[test]
    fn a_change_records_when_each_part_changed() {
        let c = open();
        let paused = c
            .after(
                &SaleUpdate {
                    state: Some(SaleState::Paused),
                    ..SaleUpdate::default()
                },
                10,
            )
            .unwrap()
            .unwrap();
        assert_eq!(paused.state, SaleState::Paused);
        assert_eq!(
            (paused.state_changed_at_ms, paused.rate_changed_at_ms),
            (10, 1)
        );
        let faster = paused
            .after(
                &SaleUpdate {
                    admit_rate_per_second: Some(50),
                    hold_ttl_seconds: Some(60),
                    ..SaleUpdate::default()
                },
                20,
            )
            .unwrap()
            .unwrap();
        assert_eq!(
            (faster.admit_rate_per_second, faster.hold_ttl_ms),
            (50, 60_000)
        );
        assert_eq!(
            (
                faster.state_changed_at_ms,
                faster.rate_changed_at_ms,
                faster.terms_changed_at_ms
            ),
            (10, 20, 20)
        );
        // The same again changes nothing.
        let same = SaleUpdate {
            state: Some(SaleState::Paused),
            admit_rate_per_second: Some(50),
            ..SaleUpdate::default()
        };
        assert_eq!(faster.after(&same, 30), Ok(None));
    }

    #[test]
    fn bad_updates_are_refused_by_field_and_an_ended_sale_stays_ended() {
        let c = open();
        let bad = |u: SaleUpdate| c.after(&u, 5).unwrap_err();
        let field = |r: Rejection| r.field().map(str::to_owned);
        assert_eq!(
            field(bad(SaleUpdate {
                admit_rate_per_second: Some(-1),
                ..SaleUpdate::default()
            })),
            Some("admit_rate_per_second".into())
        );
        assert_eq!(
            field(bad(SaleUpdate {
                hold_ttl_seconds: Some(0),
                ..SaleUpdate::default()
            })),
            Some("hold_ttl_seconds".into())
        );
        assert_eq!(
            field(bad(SaleUpdate {
                per_user_limit: Some(101),
                ..SaleUpdate::default()
            })),
            Some("per_user_limit".into())
        );
        assert_eq!(field(bad(SaleUpdate::default())), Some("state".into()));
        let ended = c
            .after(
                &SaleUpdate {
                    state: Some(SaleState::Ended),
                    ..SaleUpdate::default()
                },
                6,
            )
            .unwrap()
            .unwrap();
        for state in [SaleState::Open, SaleState::Paused, SaleState::QueueAll] {
            let other = SaleUpdate {
                state: Some(state),
                ..SaleUpdate::default()
            };
            assert_eq!(ended.after(&other, 7), Err(Rejection::SaleEnded));
        }
        let rate = SaleUpdate {
            admit_rate_per_second: Some(10),
            ..SaleUpdate::default()
        };
        assert_eq!(ended.after(&rate, 7), Err(Rejection::SaleEnded));
        let again = SaleUpdate {
            state: Some(SaleState::Ended),
            ..SaleUpdate::default()
        };
        assert_eq!(
            ended.after(&again, 7),
            Ok(None),
            "ending again is no change"
        );
    }
}
