//! The Raft timing and snapshot policy of a group, checked: a config that cannot run is an
//! error that names its setting.

/// Entries kept in the log behind a snapshot (a follower a little behind catches up from them).
pub const SNAPSHOT_KEEP_DEFAULT: u64 = 1_000;

/// The Raft timing of a group ([`HEARTBEAT_MS`], [`ELECTION_MIN_MS`], [`ELECTION_MAX_MS`]), and
/// a snapshot every `snapshot_every` entries (the log before it is then purged, but for the last
/// 1,000).
pub fn config(snapshot_every: u64) -> Result<std::sync::Arc<openraft::Config>, ConfigError> {
    config_keeping(snapshot_every, SNAPSHOT_KEEP_DEFAULT)
}

/// The leader's heartbeat interval. openraft 0.9 ticks every 1.5 heartbeat intervals (75 ms)
/// and sends a heartbeat at a tick, so followers hear from an idle leader every 75 ms. It is
/// also openraft's timeout of every AppendEntries, which a follower answers once the entries
/// (and its marks) are synced: shorter, a busy disk would fail appends.
pub const HEARTBEAT_MS: u64 = 50;

/// The shortest election timeout. openraft 0.9 draws each node's timeout once, at its start,
/// from `[ELECTION_MIN_MS, ELECTION_MAX_MS)`, and a follower that followed a leader also waits
/// out that leader's lease (`ELECTION_MAX_MS`) first: after a leader dies, a follower stands
/// after 450 to 600 ms without a word from it (and the next tick, up to 75 ms more). If the
/// first to stand has the shorter log, the other refuses it, and stands itself once its own
/// timeout has passed twice (the first candidate took their term): 600 to 900 ms.
pub const ELECTION_MIN_MS: u64 = 150;

/// The longest election timeout, and the lease during which a follower that heard from its
/// leader refuses other candidates (openraft 0.9 has no pre-vote: this lease is what keeps a
/// node that was cut off and comes back from deposing a working leader). Four ticks: a leader
/// whose heartbeats are late by three in a row (a busy machine) is not deposed yet.
pub const ELECTION_MAX_MS: u64 = 300;

/// A Raft config that cannot run: the setting it names and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the Raft setting {setting} is invalid: {why}")]
pub struct ConfigError {
    /// The setting (`snapshot_every`, or openraft's own field).
    pub setting: &'static str,
    /// Why it cannot run.
    pub why: String,
}

/// [`config`], keeping `keep` entries behind a snapshot (a simulation keeps few, so lagging
/// followers catch up from snapshots often). A config that cannot run is an error that names
/// its setting, never openraft's defaults in its place.
pub fn config_keeping(
    snapshot_every: u64,
    keep: u64,
) -> Result<std::sync::Arc<openraft::Config>, ConfigError> {
    if snapshot_every == 0 {
        return Err(ConfigError {
            setting: "snapshot_every",
            why: "a snapshot every 0 entries: it must be at least 1".into(),
        });
    }
    let config = openraft::Config {
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: ELECTION_MIN_MS,
        election_timeout_max: ELECTION_MAX_MS,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(snapshot_every),
        // A follower a little behind catches up from the log, not from a whole snapshot.
        max_in_snapshot_log_to_keep: keep,
        // An entry is a whole group commit (a checkpoint can be megabytes): few per message,
        // so an append stays well within the message limit between nodes.
        max_payload_entries: 16,
        // A snapshot's chunk is written by the receiver before it answers.
        install_snapshot_timeout: 10_000,
        ..Default::default()
    };
    config
        .validate()
        .map(std::sync::Arc::new)
        .map_err(|e| ConfigError {
            setting: match e {
                openraft::ConfigError::ElectionTimeout { .. }
                | openraft::ConfigError::ElectionTimeoutLTHeartBeat { .. } => {
                    "election_timeout_min"
                }
                openraft::ConfigError::MaxPayloadIs0 => "max_payload_entries",
                _ => "openraft config",
            },
            why: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_that_cannot_run_names_its_setting() {
        let err = config(0).unwrap_err();
        assert_eq!(err.setting, "snapshot_every");
        assert!(err.to_string().contains("snapshot_every"), "{err}");
        let ok = config_keeping(7, 3).unwrap();
        assert_eq!(
            ok.snapshot_policy,
            openraft::SnapshotPolicy::LogsSinceLast(7)
        );
        assert_eq!(ok.max_in_snapshot_log_to_keep, 3);
        assert_eq!(ok.heartbeat_interval, HEARTBEAT_MS);
    }
}
