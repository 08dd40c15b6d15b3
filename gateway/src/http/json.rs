//! The JSON conventions every body of the HTTP API shares: times as RFC 3339 strings beside the
//! contract's Unix ms, enums by their proto value's name without its prefix.

/// An RFC 3339 time (UTC, ms) of Unix ms; empty for 0 (not set).
pub fn rfc3339(unix_ms: i64) -> String {
    if unix_ms <= 0 {
        return String::new();
    }
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// An enum value's name without its prefix (`HOLD_STATUS_HELD` -> `HELD`).
pub fn short(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_owned()
}
