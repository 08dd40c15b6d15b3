//! The test tiers' switches, read in one place by every test of the workspace.
//!
//! - `BOXOFFICE_SLOW=1` runs the slow tier: the same tests with more seeds, cases, cycles and
//!   kills (TESTING.md). Unset, empty or `0`: the fast tier.
//! - `BOXOFFICE_REQUIRE_<TOOL>=1` (`PROMTOOL`, `BROWSER`, `REDIS`, `FUSE`, `NETNS`): a test that
//!   needs that system tool fails where it is missing instead of skipping (`.ci/run` sets every
//!   one of them, unconditionally).
//! - Counts (`BOXOFFICE_SIM_SEEDS`, `BOXOFFICE_CRASH_CYCLES`, ...) override a tier's default.
//!
//! Anything else in one of these variables is a mistake of whoever set it: the test panics
//! saying so, rather than guessing.

/// Reads a boolean switch: unset, empty or `0` is off, `1` is on; anything else panics.
fn switch(var: &str) -> bool {
    match std::env::var(var) {
        Err(std::env::VarError::NotPresent) => false,
        Ok(v) if v.is_empty() || v == "0" => false,
        Ok(v) if v == "1" => true,
        Ok(v) => panic!("{var} is `1` (on) or `0` (off), not `{v}`"),
        Err(e) => panic!("{var}: {e}"),
    }
}

/// Whether the slow tier runs (`BOXOFFICE_SLOW=1`).
pub fn slow() -> bool {
    switch("BOXOFFICE_SLOW")
}

/// Whether a missing `tool` fails the test (`BOXOFFICE_REQUIRE_<TOOL>=1`, upper case).
pub fn required(tool: &str) -> bool {
    switch(&format!("BOXOFFICE_REQUIRE_{}", tool.to_ascii_uppercase()))
}

/// A test that needs `tool` found it missing (`why`): panics if it is required, else says on
/// stderr that the test is skipped. Returns so the caller can `return`.
pub fn skip_unless_required(tool: &str, why: &str) {
    assert!(
        !required(tool),
        "{why}; BOXOFFICE_REQUIRE_{}=1 makes this a failure",
        tool.to_ascii_uppercase()
    );
    eprintln!(
        "SKIPPED: {why} (set BOXOFFICE_REQUIRE_{}=1 to fail instead)",
        tool.to_ascii_uppercase()
    );
}

/// A count: `var` if it is set (a number, else a panic), otherwise `slow` in the slow tier and
/// `fast` in the fast one.
pub fn count(var: &str, fast: usize, slow: usize) -> usize {
    match std::env::var(var) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var} is a count, not `{v}`")),
        Err(_) if self::slow() => slow,
        Err(_) => fast,
    }
}

/// An optional number: `var` parsed if set (a panic if it is not a number).
pub fn number(var: &str) -> Option<u64> {
    std::env::var(var).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var} is a number, not `{v}`"))
    })
}
