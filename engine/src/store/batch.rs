//! What the flusher hands to replication ([`super::Replicate`]): one group commit, the changes
//! of every stream it drained at once ([`Batch`]). A cluster node's Raft log carries these as
//! its entries (`crate::raft`).

use serde::{Deserialize, Serialize};

/// One change to a node's log, as the flusher would make it on a single node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Op {
    /// Records of one stream, numbered by its writer, each encoded by [`crate::codec`]; the
    /// sold-seat claims `(key, holder)` are taken first (a claim another holder has refuses the
    /// records, as the single-node backstop does).
    Append {
        /// The stream (see [`super::names`]).
        stream: String,
        /// `(seq, encoded record)`, in order.
        entries: Vec<(u64, Vec<u8>)>,
        /// Claims to take before the records.
        claims: Vec<(String, Vec<u8>)>,
    },
    /// A checkpoint of `stream` covering every record up to `upto` (the records it covers are
    /// removed once it is durable).
    Checkpoint {
        /// The stream.
        stream: String,
        /// The last seq it covers.
        upto: u64,
        /// The state, encoded by [`crate::codec`].
        blob: Vec<u8>,
    },
    /// A record of a table outside the streams (the simulated payment provider's, see
    /// [`super::names::PAYMENTS`]): `value` at `key` of the sled tree `table`.
    Put {
        /// The table (sled tree).
        table: String,
        /// Its key.
        key: Vec<u8>,
        /// Its value.
        value: Vec<u8>,
    },
}

/// One group commit: the changes of every stream the flusher drained at once. The unit of
/// replication (one Raft entry), so replication is paid per batch, not per hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Batch {
    /// The changes, in the order they were queued.
    pub ops: Vec<Op>,
    /// The term of the leadership whose engine wrote the batch (0: not checked). A batch that
    /// lands in a log entry of another term was written by an engine opened under an earlier
    /// leadership of this node (it lost and regained it meanwhile, while another leader wrote):
    /// every node's state machine skips it alike, and the writer's engine stops.
    #[serde(default)]
    pub term: u64,
}

impl Batch {
    /// The batch's first appended record: its stream and number (what names a batch in flight,
    /// see [`crate::trace`]).
    pub fn first_record(&self) -> Option<(&str, u64)> {
        first_record(&self.ops)
    }
}

/// The first appended record of `ops`: its stream and number.
pub(crate) fn first_record(ops: &[Op]) -> Option<(&str, u64)> {
    ops.iter().find_map(|op| match op {
        Op::Append {
            stream, entries, ..
        } => entries.first().map(|(seq, _)| (stream.as_str(), *seq)),
        _ => None,
    })
}
