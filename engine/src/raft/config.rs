//! The Raft timing and snapshot policy of a group, checked: a config that cannot run is an
//! error that names its setting.

/// Entries kept in the log behind a snapshot (a follower a little behind catches up from them).
pub const SNAPSHOT_KEEP_DEFAULT: u64 = 1_000;

/// The Raft timing of a group: heartbeats every 50 ms, an election after 200 to 400 ms without
/// one (so a leader's death is noticed in well under a second), and a snapshot every
/// `snapshot_every` entries (the log before it is then purged, but for the last 1,000).
pub fn config(snapshot_every: u64) -> Result<std::sync::Arc<openraft::Config>, ConfigError> {
    config_keeping(snapshot_every, SNAPSHOT_KEEP_DEFAULT)
}

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
        heartbeat_interval: 50,
        election_timeout_min: 200,
        election_timeout_max: 400,
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
        assert_eq!(ok.heartbeat_interval, 50);
    }
}
