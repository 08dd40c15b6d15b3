//! Waiting for something that happens in the background (a timer's tick, a hand-off between
//! actors), without sleeping a guessed time: poll until it holds, and fail with what was last
//! seen if it does not within a bound. The bound only decides when to give up; tests never
//! assert how long anything took.

use std::fmt::Debug;
use std::time::Duration;

use tokio::time::Instant;

/// The usual bound: generous, as a loaded machine (a CI box, a debug build) may be slow; a
/// check that holds returns as soon as it does.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// How often [`periodic_check`] polls.
const EVERY: Duration = Duration::from_millis(5);

/// What one poll of [`periodic_check`] found: a condition that holds (with a value to give
/// back) or not yet (with what was seen, for the failure message).
pub trait Checked {
    /// What the check gives back once the condition holds.
    type Value;
    /// `Ok` once the condition holds; otherwise what was seen.
    fn settled(self) -> Result<Self::Value, String>;
}

impl Checked for bool {
    type Value = ();
    fn settled(self) -> Result<(), String> {
        if self { Ok(()) } else { Err("false".into()) }
    }
}

impl<T> Checked for Option<T> {
    type Value = T;
    fn settled(self) -> Result<T, String> {
        self.ok_or_else(|| "None".into())
    }
}

/// `Ok(value)` holds; `Err(seen)` does not yet, and `seen` is shown if it never does.
impl<T, E: Debug> Checked for Result<T, E> {
    type Value = T;
    fn settled(self) -> Result<T, String> {
        self.map_err(|seen| format!("{seen:#?}"))
    }
}

/// Polls `cond` every few milliseconds until it holds and returns its value; fails the test,
/// naming `what` and the last thing `cond` saw, if it does not hold within `timeout`. `cond`
/// may assert things that must be true on every poll.
pub async fn periodic_check<C: Checked>(
    what: &str,
    timeout: Duration,
    mut cond: impl AsyncFnMut() -> C,
) -> C::Value {
    let deadline = Instant::now() + timeout;
    loop {
        match cond().await.settled() {
            Ok(value) => return value,
            Err(seen) if Instant::now() >= deadline => {
                panic!("{what}: still not so after {timeout:?}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(EVERY).await,
        }
    }
}
