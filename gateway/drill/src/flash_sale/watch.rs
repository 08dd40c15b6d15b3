//! The sale's own reader of the change stream: from the event's creation it follows
//! `WatchChanges` (as `boxoffice changes --follow` does, across a failover too) and counts what
//! it reads; after the sale it reads on to the end, and the report checks the counts against
//! the seats: every hold placed was released, expired or paid, and the orders' places are the
//! places sold.

use std::sync::{Arc, Mutex};

use boxoffice_proto::v1 as pb;
use serde::Serialize;

use crate::changes::{Ended, Follow, follow};

/// What the reader read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ChangesFollowed {
    /// Every change of the event.
    pub changes: u64,
    /// `hold_placed` (fans' holds, batch items, waitlist offers' holds).
    pub holds: u64,
    /// `hold_released`.
    pub released: u64,
    /// `hold_expired`.
    pub expired: u64,
    /// `order_created`.
    pub orders: u64,
    /// The orders' places (tickets).
    pub order_places: u64,
    /// Tickets given back after the sale (`tickets_cancelled`): their places are sold no more.
    pub cancelled_places: u64,
    /// Tickets moved to another fan (`tickets_transferred`): still sold, in a new order.
    pub transferred_places: u64,
    /// Read by following while the sale ran (the rest in the read to the end after it).
    pub while_following: u64,
    /// Whether they add up: holds = released + expired + orders + held at the end, and the
    /// orders' places are the places sold.
    pub adds_up: bool,
}

#[derive(Default)]
struct Read {
    counts: ChangesFollowed,
    last: String,
}

impl Read {
    fn add(&mut self, c: &pb::Change) {
        let n = &mut self.counts;
        n.changes += 1;
        match c.kind.as_str() {
            "hold_placed" => n.holds += 1,
            "hold_released" => n.released += 1,
            "hold_expired" => n.expired += 1,
            "order_created" => {
                n.orders += 1;
                n.order_places += c.order.as_ref().map_or(0, |o| o.tickets.len() as u64);
            }
            "tickets_cancelled" => {
                n.cancelled_places += c
                    .tickets_cancelled
                    .as_ref()
                    .map_or(0, |t| t.ticket_ids.len() as u64);
            }
            "tickets_transferred" => {
                n.transferred_places += c
                    .tickets_transferred
                    .as_ref()
                    .map_or(0, |t| t.ticket_ids.len() as u64);
            }
            _ => {}
        }
        self.last = c.cursor.clone();
    }
}

/// The reader, following.
pub(crate) struct Watcher {
    read: Arc<Mutex<Read>>,
    task: tokio::task::JoinHandle<anyhow::Result<Ended>>,
    follow: Follow,
}

impl Watcher {
    /// Follows `event`'s changes on `targets` with `key`, from the oldest kept.
    pub(crate) fn spawn(targets: Vec<String>, key: &str, event: &str) -> Watcher {
        let f = Follow {
            targets,
            key: key.to_owned(),
            ca_cert: None,
            after: String::new(),
            event: event.to_owned(),
            follow: true,
        };
        let read: Arc<Mutex<Read>> = Arc::default();
        let (f2, r2) = (f.clone(), read.clone());
        let task = tokio::spawn(async move {
            follow(
                &f2,
                |c| {
                    r2.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.add(&c);
                    Ok(())
                },
                |target, why, _| tracing::info!(target, why, "the change reader moves on"),
            )
            .await
        });
        Watcher {
            read,
            task,
            follow: f,
        }
    }

    /// Stops following, reads on to the end, and counts; `held` and `sold` are the seats'
    /// figures at the end, to check the counts against.
    pub(crate) async fn finish(self, held: u32, sold: u32) -> anyhow::Result<ChangesFollowed> {
        self.task.abort();
        if let Ok(Err(e)) = self.task.await {
            anyhow::bail!("following the change stream: {e:#}");
        }
        let (last, while_following) = {
            let r = self.read.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            (r.last.clone(), r.counts.changes)
        };
        let rest = Follow {
            after: last,
            follow: false,
            ..self.follow
        };
        let read = self.read.clone();
        let ended = follow(
            &rest,
            |c| {
                read.lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .add(&c);
                Ok(())
            },
            |_, _, _| {},
        )
        .await?;
        if let Ended::Refused(s) = ended {
            anyhow::bail!("the change stream refused: {s:?}");
        }
        let mut counts = self
            .read
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .counts
            .clone();
        counts.while_following = while_following;
        counts.adds_up = counts.holds
            == counts.released + counts.expired + counts.orders + u64::from(held)
            && counts.order_places - counts.cancelled_places.min(counts.order_places)
                == u64::from(sold);
        Ok(counts)
    }
}
