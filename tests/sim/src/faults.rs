//! The faults of a run: drawn from its seed before it starts, applied by the driver between
//! turmoil's steps.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One fault, at a virtual time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Nodes `a` and `b` cannot reach each other for `ms`.
    Partition {
        /// One node.
        a: u64,
        /// The other.
        b: u64,
        /// How long.
        ms: u64,
    },
    /// Nothing from `from` reaches `to` for `ms` (the other way works).
    OneWay {
        /// The sender cut off.
        from: u64,
        /// The receiver.
        to: u64,
        /// How long.
        ms: u64,
    },
    /// Node `node` reaches no other node for `ms` (clients still reach it).
    Isolate {
        /// The node.
        node: u64,
        /// How long.
        ms: u64,
    },
    /// Messages between `a` and `b` are held for `ms`, then delivered (a slow link: they arrive
    /// late, after others).
    Delay {
        /// One node.
        a: u64,
        /// The other.
        b: u64,
        /// How long.
        ms: u64,
    },
    /// Node `node` loses power: its software stops, its disk keeps what was synced and the
    /// first `keep` per mille of the later writes; it starts again after `down_ms`.
    Crash {
        /// The node.
        node: u64,
        /// How long it stays down.
        down_ms: u64,
        /// Share of the unsynced writes that reached the disk, per mille.
        keep: u64,
    },
    /// Whichever node leads is cut off from the others for `ms` (as [`Fault::Isolate`]; a
    /// random node if none leads): writes it takes meanwhile never commit.
    IsolateLeader {
        /// How long.
        ms: u64,
    },
    /// Whichever node leads loses power (as [`Fault::Crash`]; a random node if none leads).
    CrashLeader {
        /// How long it stays down.
        down_ms: u64,
        /// Share of the unsynced writes that reached the disk, per mille.
        keep: u64,
    },
    /// Node `node` loses power, starts again after `down_ms`, and loses power again in its
    /// first sync of at least `bytes` (while it catches up: often a snapshot's install); then
    /// starts for good `again_ms` later.
    Flap {
        /// The node.
        node: u64,
        /// How long it stays down the first time.
        down_ms: u64,
        /// How long it stays down the second time.
        again_ms: u64,
        /// The second cut lands in a sync of at least this many bytes.
        bytes: u64,
        /// Share of the unsynced writes that reached the disk, per mille.
        keep: u64,
    },
    /// Node `node`'s syncs slow down to `sync_ms` each (a disk in trouble), and it loses power
    /// in its next sync of at least `bytes` (a cut is likelier to land in a long fsync), or at
    /// the latest in its `within`th slow sync: the writes that sync covered are kept in part
    /// (the first `keep` per mille); it starts again `down_ms` later, its disk back to speed.
    CutInSync {
        /// The node.
        node: u64,
        /// The sync it lands in covers at least this many bytes...
        bytes: u64,
        /// ...or is the node's `within`th slow sync (from 1; `u64::MAX`: only a big one).
        within: u64,
        /// How long each sync takes until the cut lands.
        sync_ms: u64,
        /// How long it stays down.
        down_ms: u64,
        /// Share of the unsynced writes that reached the disk, per mille.
        keep: u64,
    },
    /// Every node loses power at once (the coordinated power cut); all start again after
    /// `down_ms`.
    PowerCutAll {
        /// How long they stay down.
        down_ms: u64,
        /// Share of the unsynced writes that reached each disk, per mille.
        keep: u64,
    },
    /// The coordinated power cut in its worst moment: whichever node leads (a random node if
    /// none does) has its syncs slow down to `sync_ms` each, and loses power in its next sync
    /// of at least `bytes` (its log's fdatasync, while the followers have synced and
    /// committed what it is writing); every other node loses power at that moment too. Each
    /// disk keeps the first `keep` per mille of its unsynced writes; all start again
    /// `down_ms` later.
    PowerCutAllInLeaderSync {
        /// The leader's sync it lands in covers at least this many bytes.
        bytes: u64,
        /// How long each of the leader's syncs takes until the cut lands.
        sync_ms: u64,
        /// How long they stay down.
        down_ms: u64,
        /// Share of the unsynced writes that reached each disk, per mille.
        keep: u64,
    },
    /// Node `node`'s disk is replaced by an empty one (with the others up): it starts pristine
    /// after `down_ms` and catches up from its group.
    Wipe {
        /// The node.
        node: u64,
        /// How long it stays down.
        down_ms: u64,
    },
    /// Node `node` stops for `ms` (its messages and its clients' wait), then its clock jumps by
    /// as much, as a paused VM's would.
    Pause {
        /// The node.
        node: u64,
        /// How long.
        ms: u64,
    },
    /// Node `node`'s wall clock jumps by `ms` (back if negative).
    ClockJump {
        /// The node.
        node: u64,
        /// How far.
        ms: i64,
    },
    /// Node `node`'s next fsync fails (it must stop acknowledging, and is restarted).
    FailSync {
        /// The node.
        node: u64,
    },
    /// Node `node`'s disk syncs take `sync_ms` each for `ms` (a slow disk).
    SlowDisk {
        /// The node.
        node: u64,
        /// How long a sync takes.
        sync_ms: u64,
        /// How long.
        ms: u64,
    },
    /// Node `node`'s disk is full for `ms`.
    FullDisk {
        /// The node.
        node: u64,
        /// How long.
        ms: u64,
    },
    /// One bit of a value on node `node`'s disk flips (`pick` chooses it), and the node
    /// restarts: it must refuse to start naming the damage, or lose nothing.
    BitFlip {
        /// The node.
        node: u64,
        /// Which value and bit.
        pick: u64,
    },
}

/// Faults at their virtual times (ms), in order.
pub type Plan = Vec<(u64, Fault)>;

/// Whether `fault` is timed from the sale's rush: then the time [`plan`] gives it, less the
/// window's start, is how long after the sale's first acknowledged hold it comes (a cut in a
/// stalled sync is the worst while fans fight for the last places; before the sale has begun,
/// the stall would only hold the queue up).
pub fn in_the_rush(fault: &Fault) -> bool {
    matches!(fault, Fault::CutInSync { .. } | Fault::IsolateLeader { .. })
}

/// How often a run's nodes' messages to each other are delayed and sent twice (per mille): a
/// third of the runs have neither.
pub fn message_rates(seed: u64) -> (u64, u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6d65_7373_6167_6573);
    if rng.random_range(0..3) == 0 {
        return (0, 0);
    }
    (rng.random_range(0..100), rng.random_range(0..50))
}

/// Draws a run's faults from `seed`: between `from_ms` and `until_ms`, on `nodes` nodes.
pub fn plan(seed: u64, nodes: u64, from_ms: u64, until_ms: u64) -> Plan {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xfa17_5eed_0000_0001);
    let count = rng.random_range(2..=7);
    let mut plan: Plan = (0..count)
        .map(|_| {
            let at = rng.random_range(from_ms..until_ms.max(from_ms + 1));
            let node = rng.random_range(1..=nodes);
            let other = (node % nodes) + 1;
            let ms = rng.random_range(300..3_000);
            // A node alone has no links to cut: it gets the node and disk faults.
            let roll = if nodes == 1 {
                rng.random_range(40..100)
            } else {
                rng.random_range(0..100)
            };
            let fault = match roll {
                0..12 => Fault::Partition {
                    a: node,
                    b: other,
                    ms,
                },
                12..20 => Fault::OneWay {
                    from: node,
                    to: other,
                    ms,
                },
                20..26 => Fault::Isolate { node, ms },
                26..32 => Fault::IsolateLeader { ms },
                32..40 => Fault::Delay {
                    a: node,
                    b: other,
                    ms,
                },
                40..45 => Fault::Crash {
                    node,
                    down_ms: ms,
                    keep: rng.random_range(0..1_000),
                },
                45..48 => Fault::CutInSync {
                    node,
                    bytes: 1 << rng.random_range(6..12),
                    within: rng.random_range(1..=4),
                    sync_ms: rng.random_range(1..1_000),
                    down_ms: ms,
                    // Half the cuts keep nothing the failed sync covered.
                    keep: rng.random_range(0..1_000u64).saturating_sub(500) * 2,
                },
                48..53 => Fault::CrashLeader {
                    down_ms: ms,
                    keep: rng.random_range(0..1_000),
                },
                53..58 => Fault::Flap {
                    node,
                    down_ms: ms,
                    again_ms: rng.random_range(30..300),
                    // 2 to 16 KiB: past the appends a node catches up with, within a
                    // snapshot's install.
                    bytes: 1 << rng.random_range(11..15),
                    keep: rng.random_range(0..1_000),
                },
                58..64 => Fault::PowerCutAll {
                    down_ms: ms,
                    // Half the cuts keep nothing unsynced.
                    keep: rng.random_range(0..1_000u64).saturating_sub(500) * 2,
                },
                64..70 => Fault::Wipe { node, down_ms: ms },
                70..74 => Fault::Pause { node, ms },
                74..78 => Fault::PowerCutAllInLeaderSync {
                    bytes: 1 << rng.random_range(6..11),
                    sync_ms: rng.random_range(1..200),
                    down_ms: ms,
                    keep: rng.random_range(0..1_000),
                },
                78..82 => Fault::ClockJump {
                    node,
                    ms: rng.random_range(-5_000..20_000),
                },
                82..88 => Fault::FailSync { node },
                88..91 => Fault::FullDisk { node, ms },
                91..95 => Fault::SlowDisk {
                    node,
                    sync_ms: rng.random_range(20..300),
                    ms,
                },
                _ => Fault::BitFlip {
                    node,
                    pick: rng.random(),
                },
            };
            // A cut inside a sync bites while the sale is busy (its rush, when many writes are
            // in flight): its time counts from the sale's first hold (see [`in_the_rush`]).
            let at = if in_the_rush(&fault) {
                from_ms + (at - from_ms) / 15
            } else {
                at
            };
            (at, fault)
        })
        .collect();
    plan.sort_by_key(|(at, _)| *at);
    plan
}
