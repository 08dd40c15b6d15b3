//! The flags of `boxoffice flash-sale`, and the checks that refuse a sale that makes no sense.

use std::path::PathBuf;

use crate::secret::UsageError;
use crate::server_choice::ServerChoice;

/// Flags of `boxoffice flash-sale`.
#[derive(clap::Args, Debug, Clone)]
pub struct FlashSaleArgs {
    /// Fans who try to buy.
    #[arg(long, default_value_t = 100_000)]
    pub fans: usize,
    /// Seats on sale: 40% general admission, the rest in three reserved sections of 50-seat rows.
    #[arg(long, default_value_t = 10_000)]
    pub seats: u32,
    /// Fans arrive evenly over this many seconds (after the pre-opening share).
    #[arg(long, default_value_t = 10.0)]
    pub arrival_seconds: f64,
    /// Share of fans who join the waiting room before the sale opens (shuffled at the opening).
    #[arg(long, default_value_t = 0.1)]
    pub preopen_share: f64,
    /// Waiting-room admissions per second (the event's `admit_rate_per_second`).
    // Old name (hidden, still accepted): `--admit-rate`.
    #[arg(long, alias = "admit-rate", default_value_t = 20_000)]
    pub admit_rate_per_second: u32,
    /// Fans in flight at once (concurrent clients; the fans who have arrived wait for one).
    /// Against one server, one connection per 256 (the server's streams per connection).
    #[arg(long, default_value_t = 512)]
    pub concurrency: usize,
    /// Hold TTL in seconds (the event's `hold_ttl_seconds`): walked-away holds come back after
    /// this.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub hold_ttl_seconds: u64,
    /// The old `--hold-ttl-ms` (milliseconds, rounded up to whole seconds); hidden, use
    /// `--hold-ttl-seconds`.
    #[arg(long, hide = true, conflicts_with = "hold_ttl_seconds")]
    pub hold_ttl_ms: Option<u64>,
    /// Share of holders who pay (0 to 1).
    // Old name (hidden, still accepted): `--pay-rate`.
    #[arg(long, alias = "pay-rate", default_value_t = 0.7)]
    pub pay_share: f64,
    /// Share of payers whose first card is declined (they pay with another).
    // Old name (hidden, still accepted): `--decline-rate`.
    #[arg(long, alias = "decline-rate", default_value_t = 0.1)]
    pub decline_share: f64,
    /// Share of fans who pick exact seats from the seat map (the rest take best available).
    // Old name (hidden, still accepted): `--exact-rate`.
    #[arg(long, alias = "exact-rate", default_value_t = 0.05)]
    pub exact_share: f64,
    /// Share of fans turned away with SOLD_OUT who join the waitlist.
    // Old name (hidden, still accepted): `--waitlist-rate`.
    #[arg(long, alias = "waitlist-rate", default_value_t = 0.02)]
    pub waitlist_share: f64,
    /// Places one fan may hold or own.
    #[arg(long, default_value_t = 4)]
    pub per_user_limit: u32,
    /// Proof of work before joining the line, in leading zero bits (0: off; at most 32): the
    /// event asks for it and every fan fetches a challenge and solves it (about 2^N SHA-256
    /// hashes, on this machine's cores) before `Join`.
    #[arg(long, default_value_t = 0)]
    pub join_pow_bits: u32,
    /// The server the run plays against: embedded, or `--target`.
    #[command(flatten)]
    pub server: ServerChoice,
    /// Servers to play against: 1, the embedded server (or `--target`); 3 or 5, a cluster of
    /// that many `boxoffice serve` processes of this executable on loopback, replicating with
    /// Raft over mutual TLS (their data under `--data-dir` as node1/ to nodeN/, else in a
    /// temporary dir). The fans spread their calls over the nodes and retry a call that failed
    /// on one (UNAVAILABLE, or the connection) on the next, with the same idempotency key.
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// With `--nodes 3` or `5`: this many seconds after the sale opens, kill (SIGKILL) the node
    /// that leads the sale's group, and measure the failover (until a node leads again with its
    /// engine serving). The fans keep going.
    #[arg(long, value_name = "SECONDS")]
    pub kill_leader_after: Option<f64>,
    /// With `--nodes 3` or `5`: this many seconds after the sale opens, replace a follower by a
    /// new node, live (`boxoffice cluster replace-node`: the new node catches up and becomes a
    /// voter, then the old one is removed and stopped), and measure how long it took. The fans
    /// keep going.
    #[arg(long, value_name = "SECONDS")]
    pub replace_node_after: Option<f64>,
    /// This many seconds after the sale opens, an operator pauses it (`UpdateSale`
    /// `SALE_STATE_PAUSED`: the emergency stop), and opens it again `--pause-for` seconds
    /// later. The report says when, and how many places were taken while it was paused (none
    /// may be); the plot shades the pause. Fans refused with SALE_PAUSED wait and try again.
    #[arg(long, value_name = "SECONDS")]
    pub pause_at: Option<f64>,
    /// Bots that hoard: each joins the line before the opening, and once admitted holds the
    /// per-user limit anywhere, never pays, and holds again each time its hold expires, until
    /// the fans are done. The report gives the places they kept from paying fans (left unsold
    /// at the end) and their share of the seats.
    #[arg(long, default_value_t = 0)]
    pub hoarders: usize,
    /// The countermeasure to hoarders: the event's hold cool-down (`UpdateSale`
    /// `hold_cooldown_seconds`, set right after the event is made): a fan whose hold expired
    /// may not hold again for this many seconds (0: none).
    #[arg(long, default_value_t = 0)]
    pub hold_cooldown_seconds: u32,
    /// How long the pause of `--pause-at` lasts, seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 2.0,
        requires = "pause_at"
    )]
    pub pause_for: f64,
    /// Run the seeds' uncoordinated baseline in-process (read the map, book what looked free).
    #[arg(long)]
    pub naive: bool,
    /// A presale with this many access codes (0: none): every section sells only to code
    /// holders for `--presale-seconds` after the opening; each code may take `seats / (2 N)`
    /// places; every fourth fan has one. The others (and fans whose code is used up) wait for
    /// the public sale. The report checks every code's uses against its cap.
    #[arg(long, default_value_t = 0)]
    pub presale_codes: u32,
    /// How long the presale lasts after the opening, seconds.
    #[arg(long, default_value_t = 2.0)]
    pub presale_seconds: f64,
    /// After the sale, this many fans give one ticket back (`CancelTickets`) and as many pass
    /// one to a friend (`TransferTickets`), before the seat-by-seat audit (0: none).
    #[arg(long, default_value_t = 5)]
    pub after_sale: usize,
    /// Random seed for the fans' choices.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also draw seats left, admissions/s, holds/s and the latency percentiles to this SVG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

impl FlashSaleArgs {
    /// Refuses counts of zero and shares outside 0..=1 (a [`UsageError`]).
    pub(crate) fn check(&self) -> Result<(), UsageError> {
        if self.fans == 0 || self.seats < 4 || self.concurrency == 0 {
            return Err(UsageError::new(
                "--fans and --concurrency must be at least 1, --seats at least 4",
            ));
        }
        if self.join_pow_bits > boxoffice_engine::limits::JOIN_POW_DIFFICULTY_BITS_MAX {
            return Err(UsageError::new(format!(
                "--join-pow-bits is at most {}",
                boxoffice_engine::limits::JOIN_POW_DIFFICULTY_BITS_MAX
            )));
        }
        let cluster = self.nodes > 1;
        if cluster && !crate::cluster::SIZES.contains(&u64::from(self.nodes)) {
            return Err(UsageError::new(format!(
                "--nodes {}: 1 (one server), or 3 or 5 (a local cluster of that many nodes)",
                self.nodes
            )));
        }
        if cluster && self.server.target.is_some() {
            return Err(UsageError::new(
                "--nodes 3 or 5 starts its own cluster: it cannot be used with --target",
            ));
        }
        if cluster && self.naive {
            return Err(UsageError::new(
                "--nodes 3 or 5 plays the sale against a cluster: it cannot be used with --naive",
            ));
        }
        for (flag, after, what) in [
            (
                "--kill-leader-after",
                self.kill_leader_after,
                "a leader to kill",
            ),
            (
                "--replace-node-after",
                self.replace_node_after,
                "nodes to replace",
            ),
        ] {
            let Some(after) = after else { continue };
            if !cluster {
                return Err(UsageError::new(format!(
                    "{flag} needs --nodes 3 or 5 (a cluster has {what})"
                )));
            }
            if !(after.is_finite() && after >= 0.0) {
                return Err(UsageError::new(format!(
                    "{flag} is a number of seconds, 0 or more"
                )));
            }
        }
        if let Some(at) = self.pause_at {
            if self.naive {
                return Err(UsageError::new(
                    "--pause-at steers the engine's sale: it cannot be used with --naive",
                ));
            }
            if !(at.is_finite() && at >= 0.0 && self.pause_for.is_finite() && self.pause_for > 0.0)
            {
                return Err(UsageError::new(
                    "--pause-at is a number of seconds, 0 or more; --pause-for more than 0",
                ));
            }
        }
        if self.presale_codes > 0 {
            if self.naive {
                return Err(UsageError::new(
                    "--presale-codes needs the engine's sale: it cannot be used with --naive",
                ));
            }
            if self.presale_codes > 10_000 || self.presale_codes > self.seats / 2 {
                return Err(UsageError::new(
                    "--presale-codes is at most 10,000 and at most half of --seats",
                ));
            }
            if !(self.presale_seconds.is_finite() && self.presale_seconds > 0.0) {
                return Err(UsageError::new(
                    "--presale-seconds is a number of seconds, more than 0",
                ));
            }
        }
        for (name, v) in [
            ("--pay-share", self.pay_share),
            ("--exact-share", self.exact_share),
            ("--decline-share", self.decline_share),
            ("--waitlist-share", self.waitlist_share),
            ("--preopen-share", self.preopen_share),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(UsageError::new(format!(
                    "{name} is a share between 0 and 1"
                )));
            }
        }
        Ok(())
    }

    /// The hold TTL in ms: `--hold-ttl-seconds`, or the old `--hold-ttl-ms` rounded up to whole
    /// seconds (the contract's unit).
    pub fn hold_ttl_ms(&self) -> u64 {
        match self.hold_ttl_ms {
            Some(ms) => ms.div_ceil(1000).max(1) * 1000,
            None => self.hold_ttl_seconds.saturating_mul(1000),
        }
    }

    /// Fans who join before the opening (those with a lower index).
    pub(crate) fn preopen(&self) -> usize {
        ((self.fans as f64) * self.preopen_share) as usize
    }

    /// The waiting room's bound: every fan, and room to spare.
    pub(crate) fn queue_max(&self) -> u32 {
        u32::try_from(self.fans)
            .unwrap_or(u32::MAX)
            .saturating_add(1_000)
    }
}
