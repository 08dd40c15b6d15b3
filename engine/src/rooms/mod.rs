//! The waiting rooms' durable record (issue 13): what a waiting room must keep so that its line
//! survives a restart or a cluster's failover, with every queue token keeping its position.
//!
//! The gateway's room (`gateway/src/waiting_room.rs`) keeps the line in memory; a queue token
//! carries the fan's join number. What the numbers mean is written here, one stream per event
//! (`room/{event}`), before the room acts on it:
//! - [`RoomRecord::Reserved`]: join numbers below `upto` may be handed out. A room reserves a
//!   block of numbers before it hands out the first of them, so a room resumed elsewhere never
//!   gives a number twice (the unused rest of a block stays empty places in line).
//! - [`RoomRecord::Opened`]: the opening draw shuffled the join numbers below `drawn` (with the
//!   event's shuffle seed, so the draw is the same wherever it is replayed). Written before any
//!   position is shown.
//! - [`RoomRecord::Admitted`]: the positions `from..to` were admitted at `at_ms`. Written before
//!   the room says so to anyone.
//!
//! A room resumed from its [`RoomLine`] answers every queue token as its first room did.

use std::sync::Arc;

use tokio::sync::Mutex;

use crate::error::{EngineError, StorageError};
use crate::hash::{DashMap, HashMap};
use crate::ids::EventId;
use crate::kernel::Kernel;
use crate::store::{StreamWriter, names};

pub(crate) mod line;
pub use line::{RoomLine, RoomRecord};

/// One event's room stream: its writer and the line so far (the checkpoint's state).
struct RoomWriter {
    stream: StreamWriter,
    line: RoomLine,
}

/// The waiting rooms' records: one stream per event, each with its line. This component owns
/// them; the engine reaches them through [`Rooms::line`] and [`Rooms::record`] only (its
/// `room_line` and `record_room`, after its own readiness and event checks). It writes through
/// the kernel's store (and keeps no handle on the store of its own: the engine's shutdown waits
/// for every other holder of the store to let go of it).
pub(crate) struct Rooms {
    kernel: Arc<Kernel>,
    writers: DashMap<EventId, Arc<Mutex<RoomWriter>>>,
}

impl Rooms {
    /// The rooms recovered from the log (each line with its stream's last record number), each
    /// stream opened after its last record; written through the kernel's store, with its
    /// configured checkpoint interval.
    pub fn open(
        kernel: Arc<Kernel>,
        recovered: HashMap<EventId, (RoomLine, u64)>,
    ) -> Result<Rooms, EngineError> {
        let writers = DashMap::default();
        for (event_id, (line, last)) in recovered {
            let stream =
                StreamWriter::open(kernel.store().sink.as_ref(), &names::room(&event_id), last)?;
            writers.insert(event_id, Arc::new(Mutex::new(RoomWriter { stream, line })));
        }
        Ok(Rooms { kernel, writers })
    }

    /// The line of `event_id`'s room as its records leave it (empty if it has none).
    pub async fn line(&self, event_id: &EventId) -> RoomLine {
        let Some(w) = self.writers.get(event_id).map(|w| w.clone()) else {
            return RoomLine::default();
        };
        w.lock().await.line.clone()
    }

    /// Records `records` of `event_id`'s room; returns once they are durable (on a cluster:
    /// committed by a majority). A record that does not fit the line is refused (nothing is
    /// written).
    pub async fn record(
        &self,
        event_id: &EventId,
        records: Vec<RoomRecord>,
    ) -> Result<RoomLine, EngineError> {
        let writer = self.writer(event_id)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut w = writer.lock().await;
            let mut line = w.line.clone();
            for r in &records {
                line.apply(r)
                    .map_err(|e| StorageError::Io(format!("waiting room {event_id}: {e}")))?;
            }
            w.line = line;
            let RoomWriter { stream, line } = &mut *w;
            let job = stream.append(
                &records,
                Vec::new(),
                Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            );
            let every = self.kernel.config().checkpoint_every_records;
            self.kernel
                .store()
                .submit_with_checkpoint(job, stream, every, || &*line);
        }
        rx.await
            .map_err(|_| StorageError::Halted("the log is closed".into()))??;
        Ok(writer.lock().await.line.clone())
    }

    /// `event_id`'s writer, its stream opened on its first record.
    fn writer(&self, event_id: &EventId) -> Result<Arc<Mutex<RoomWriter>>, EngineError> {
        if let Some(w) = self.writers.get(event_id) {
            return Ok(w.clone());
        }
        let sink = self.kernel.store().sink.as_ref();
        let stream = StreamWriter::open(sink, &names::room(event_id), 0)?;
        Ok(self
            .writers
            .entry(event_id.clone())
            .or_insert_with(|| {
                Arc::new(Mutex::new(RoomWriter {
                    stream,
                    line: RoomLine::default(),
                }))
            })
            .clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_takes_records_that_fit_and_refuses_the_rest() {
        let mut l = RoomLine::default();
        l.apply(&RoomRecord::Reserved { upto: 1024 }).unwrap();
        l.apply(&RoomRecord::Reserved { upto: 512 }).unwrap();
        assert_eq!(l.reserved, 1024, "reservations only grow");
        assert!(
            l.apply(&RoomRecord::Admitted {
                from: 0,
                to: 5,
                at_ms: 1
            })
            .is_err(),
            "no admission before the opening"
        );
        l.apply(&RoomRecord::Opened { drawn: 7 }).unwrap();
        l.apply(&RoomRecord::Opened { drawn: 7 }).unwrap();
        assert!(l.apply(&RoomRecord::Opened { drawn: 8 }).is_err());
        l.apply(&RoomRecord::Admitted {
            from: 0,
            to: 5,
            at_ms: 1,
        })
        .unwrap();
        assert!(
            l.apply(&RoomRecord::Admitted {
                from: 4,
                to: 9,
                at_ms: 2
            })
            .is_err(),
            "admissions are contiguous"
        );
        l.apply(&RoomRecord::Admitted {
            from: 5,
            to: 9,
            at_ms: 2,
        })
        .unwrap();
        assert_eq!(l.admitted_upto(), 9);
    }
}
