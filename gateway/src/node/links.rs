//! What a node says about its peers' links, once per change rather than once per retry:
//! openraft retries a peer that is down every half second in each group, and this node's
//! forwarded calls fail with it, but the log gets one warning when the peer goes down (after it
//! failed for [`DOWN_AFTER`] without an answer in between), one when it answers again, and a
//! summary every [`SUMMARY_EVERY`] while it stays down. Each failure is logged at debug. The
//! gauge `boxoffice_cluster_peer_up{peer}` says the same (1 up, from the node's start; 0 down).
//!
//! One [`PeerWatch`] serves every group of a node, so a peer down in eight groups is still one
//! warning.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A peer that fails this long with no answer in between is reported down: a single lost
/// heartbeat or a slow answer under load is not.
pub const DOWN_AFTER: Duration = Duration::from_secs(2);
/// While a peer stays down, a summary this often.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// The state of one peer's link.
#[derive(Debug, Clone)]
enum Link {
    /// Its last call was answered.
    Up,
    /// Failing since `since`, not reported yet.
    Failing { since: Instant, failures: u64 },
    /// Reported down; the last summary at `summary_at`.
    Down {
        since: Instant,
        failures: u64,
        summary_at: Instant,
    },
}

/// What one change of a peer's link is: what the log says of it (see [`PeerWatch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Failing for [`DOWN_AFTER`]: reported down.
    Down,
    /// Still down, [`SUMMARY_EVERY`] after the last report.
    StillDown {
        /// Seconds since its first failure.
        for_secs: u64,
        /// Failed calls since then.
        failures: u64,
    },
    /// Answering again after it was reported down.
    Back {
        /// Seconds it was failing.
        for_secs: u64,
        /// Failed calls meanwhile.
        failures: u64,
    },
}

/// The links of a node's peers (by node id), shared by its groups and its forwarder.
#[derive(Debug)]
pub struct PeerWatch {
    peers: BTreeMap<u64, String>,
    links: Mutex<BTreeMap<u64, Link>>,
}

impl PeerWatch {
    /// A watch over `peers` (node id to address), every link up.
    pub fn new(peers: BTreeMap<u64, String>) -> PeerWatch {
        PeerWatch {
            peers,
            links: Mutex::new(BTreeMap::new()),
        }
    }

    /// A call to `peer` was answered (an error of the peer's own is an answer too).
    pub fn answered(&self, peer: u64) -> Option<Change> {
        let change = self.step(peer, None);
        if let Some(Change::Back { for_secs, failures }) = &change {
            metrics::gauge!("boxoffice_cluster_peer_up", "peer" => peer.to_string()).set(1.0);
            tracing::warn!(
                peer,
                addr = self.addr(peer),
                down_seconds = for_secs,
                failed_calls = failures,
                "peer {peer} answers again after {for_secs} s down ({failures} failed calls)"
            );
        }
        change
    }

    /// A call to `peer` failed without an answer (`error`: why): logged at debug; a change is
    /// logged as a warning.
    pub fn failed(&self, peer: u64, error: &dyn Display) -> Option<Change> {
        tracing::debug!(peer, error = %error, "a call to a peer failed");
        let change = self.step(peer, Some(Instant::now()));
        let addr = self.addr(peer);
        match &change {
            Some(Change::Down) => {
                metrics::gauge!("boxoffice_cluster_peer_up", "peer" => peer.to_string()).set(0.0);
                tracing::warn!(
                    peer,
                    addr,
                    error = %error,
                    "peer {peer} is down: no answer for {} s; retries go on quietly, with a \
                     summary every {} s",
                    DOWN_AFTER.as_secs(),
                    SUMMARY_EVERY.as_secs()
                );
            }
            Some(Change::StillDown { for_secs, failures }) => tracing::warn!(
                peer,
                addr,
                down_seconds = for_secs,
                failed_calls = failures,
                last_error = %error,
                "peer {peer} is still down after {for_secs} s ({failures} failed calls)"
            ),
            _ => {}
        }
        change
    }

    fn addr(&self, peer: u64) -> &str {
        self.peers.get(&peer).map_or("?", String::as_str)
    }

    /// The link of `peer` after an answer (`failed_at` None) or a failure at `failed_at`.
    fn step(&self, peer: u64, failed_at: Option<Instant>) -> Option<Change> {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let link = links.entry(peer).or_insert(Link::Up);
        match failed_at {
            None => answer(link),
            Some(now) => failure(link, now),
        }
    }
}

/// An answer: the link is up (and that is told if it was reported down).
fn answer(link: &mut Link) -> Option<Change> {
    match std::mem::replace(link, Link::Up) {
        Link::Down {
            since, failures, ..
        } => Some(Change::Back {
            for_secs: since.elapsed().as_secs(),
            failures,
        }),
        Link::Up | Link::Failing { .. } => None,
    }
}

/// A failure at `now`: the link is failing, down once that lasted [`DOWN_AFTER`], and summed up
/// every [`SUMMARY_EVERY`] while down.
fn failure(link: &mut Link, now: Instant) -> Option<Change> {
    match link {
        Link::Up => {
            *link = Link::Failing {
                since: now,
                failures: 1,
            };
            None
        }
        Link::Failing { since, failures } => {
            *failures += 1;
            let (since, failures) = (*since, *failures);
            if now.duration_since(since) < DOWN_AFTER {
                return None;
            }
            *link = Link::Down {
                since,
                failures,
                summary_at: now,
            };
            Some(Change::Down)
        }
        Link::Down {
            since,
            failures,
            summary_at,
        } => {
            *failures += 1;
            if now.duration_since(*summary_at) < SUMMARY_EVERY {
                return None;
            }
            *summary_at = now;
            Some(Change::StillDown {
                for_secs: now.duration_since(*since).as_secs(),
                failures: *failures,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch() -> PeerWatch {
        PeerWatch::new(BTreeMap::from([(2, "127.0.0.1:2".to_owned())]))
    }

    /// A peer failing every half second for five minutes: one change when it goes down, one
    /// summary a minute, one when it answers again.
    #[tokio::test(start_paused = true)]
    async fn a_peer_down_is_told_once_then_summed_up_then_told_back() {
        let w = watch();
        let mut changes = Vec::new();
        for _ in 0..600 {
            changes.extend(w.failed(2, &"tcp connect error"));
            tokio::time::advance(Duration::from_millis(500)).await;
        }
        changes.extend(w.answered(2));
        assert_eq!(changes.len(), 1 + 4 + 1, "{changes:?}");
        assert_eq!(changes[0], Change::Down);
        assert_eq!(
            changes[1],
            Change::StillDown {
                for_secs: 62,
                failures: 125
            }
        );
        assert!(
            matches!(changes[4], Change::StillDown { for_secs: 242, .. }),
            "{changes:?}"
        );
        assert_eq!(
            changes[5],
            Change::Back {
                for_secs: 300,
                failures: 600
            }
        );
        assert_eq!(w.answered(2), None, "up stays quiet");
    }

    /// Failures with answers in between, or shorter than DOWN_AFTER, are not a peer down.
    #[tokio::test(start_paused = true)]
    async fn a_blip_is_not_a_peer_down() {
        let w = watch();
        for _ in 0..100 {
            assert_eq!(w.failed(2, &"timeout"), None);
            tokio::time::advance(Duration::from_millis(1_500)).await;
            assert_eq!(w.failed(2, &"timeout"), None);
            assert_eq!(w.answered(2), None);
        }
        // A failure shorter than DOWN_AFTER, then an answer: nothing.
        assert_eq!(w.failed(2, &"timeout"), None);
        tokio::time::advance(DOWN_AFTER - Duration::from_millis(1)).await;
        assert_eq!(w.failed(2, &"timeout"), None);
        assert_eq!(w.answered(2), None);
    }
}
