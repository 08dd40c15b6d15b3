//! `ChangeService.WatchChanges`: the change stream ([`boxoffice_engine::changes`]) of every
//! group this server has, as gRPC and HTTP (NDJSON, server-sent events) give it.
//!
//! A single node reads its engine's stream, as far as it is durable. A cluster node reads its
//! own copy of each group's log (everything there is committed), whether it leads or not, so
//! the call is never forwarded, and a reader that moves to another node resumes with no gap:
//! a change has the same cursor on every node. A cursor is each group's position, joined by
//! `_` (one group: just its position).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use boxoffice_engine::LogSink;
use boxoffice_engine::changes::{Change, ChangeKind, ChangesError, ChangesPage, Position};
use boxoffice_engine::sale::SaleControls;
use boxoffice_proto::v1 as pb;

use super::Ready;
use crate::convert;
use crate::status::ApiError;

/// Changes read from a group's log at a time.
pub const PAGE: usize = 256;

/// How often a following reader looks for new changes.
pub const FOLLOW_POLL: Duration = Duration::from_millis(50);

/// How long a cluster node waits for its copy to reach a cursor another node handed out.
const CATCH_UP_WAIT: Duration = Duration::from_secs(5);

/// Where one group's change stream is read.
pub enum Feed {
    /// A single node: its engine's stream, as far as it is durable.
    Engine(Ready),
    /// A cluster node: its copy of the group's log.
    Copy(Arc<dyn LogSink>),
}

impl Feed {
    fn read(&self, after: Option<Position>, max: usize) -> Result<ChangesPage, Read> {
        let page = match self {
            Feed::Engine(ready) => {
                let api = ready.get().ok_or(Read::Api(ApiError::NotReady))?;
                api.engine.changes(after, max)
            }
            Feed::Copy(sink) => {
                boxoffice_engine::store::read_changes(sink.as_ref(), after, u64::MAX, max)
            }
        };
        page.map_err(Read::Changes)
    }

    /// Whether a cursor past this feed's end may yet be reached (a cluster node's copy that
    /// lags the node that handed it out).
    fn may_catch_up(&self) -> bool {
        matches!(self, Feed::Copy(_))
    }
}

/// Why a read gave nothing.
enum Read {
    Api(ApiError),
    Changes(ChangesError),
}

/// Which group of `groups` an event's changes are in (the cluster's routing's hash).
pub type GroupOf = fn(&str, u32) -> u32;

/// Every group's feed, set once the server knows them, with how events map to groups.
#[derive(Clone, Default)]
pub struct Feeds(Arc<OnceLock<(Arc<[Feed]>, GroupOf)>>);

impl Feeds {
    /// Sets the feeds (the first call wins).
    pub fn set(&self, feeds: Vec<Feed>, group_of: GroupOf) {
        let _ = self.0.set((Arc::from(feeds), group_of));
    }

    fn get(&self) -> Result<(Arc<[Feed]>, GroupOf), ApiError> {
        self.0.get().cloned().ok_or(ApiError::NotReady)
    }
}

/// The cursor of a reader that stands at `positions` (one per group).
pub fn cursor_text(positions: &[Position]) -> String {
    positions
        .iter()
        .map(Position::to_string)
        .collect::<Vec<_>>()
        .join("_")
}

/// A cursor as a client sent it: empty (from the oldest kept), `0` (from the very start), or
/// one position per group.
fn parse_cursor(text: &str, groups: usize) -> Result<Vec<Option<Position>>, ApiError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(vec![None; groups]);
    }
    if text == "0" {
        return Ok(vec![Some(Position::START); groups]);
    }
    let parts: Vec<&str> = text.split('_').collect();
    if parts.len() != groups {
        return Err(ApiError::CursorInvalid(format!(
            "`{text}` is not a cursor of this server's change stream ({groups} groups)"
        )));
    }
    parts
        .into_iter()
        .map(|p| p.parse().map(Some).map_err(ApiError::CursorInvalid))
        .collect()
}

/// One reader's walk over the stream.
pub struct Watch {
    feeds: Arc<[Feed]>,
    at: Vec<Position>,
    /// Only this event's changes (and only its group is read).
    event: Option<(String, usize)>,
    /// Whether the reader waits for changes to come.
    pub follow: bool,
}

impl Watch {
    /// Checks `after` against each group's stream: a cursor older than the retention is
    /// [`ApiError::CursorExpired`] (with the oldest cursor served), one this server never handed
    /// out [`ApiError::CursorInvalid`] (a cluster node first waits a few seconds for its copy to
    /// reach it).
    pub async fn open(
        feeds: &Feeds,
        after: &str,
        event_id: &str,
        follow: bool,
    ) -> Result<Watch, ApiError> {
        let (feeds, group_of) = feeds.get()?;
        let n = feeds.len();
        let asked = parse_cursor(after, n)?;
        let event = (!event_id.is_empty()).then(|| {
            let g = group_of(event_id, u32::try_from(n).unwrap_or(u32::MAX));
            (event_id.to_owned(), g as usize)
        });
        let mut at = Vec::with_capacity(n);
        let mut oldest = Vec::with_capacity(n);
        let mut expired = false;
        for (g, feed) in feeds.iter().enumerate() {
            let deadline = Instant::now() + CATCH_UP_WAIT;
            loop {
                match feed.read(asked[g], 0) {
                    Ok(page) => {
                        at.push(asked[g].unwrap_or(page.oldest));
                        oldest.push(page.oldest);
                    }
                    Err(Read::Api(e)) => return Err(e),
                    Err(Read::Changes(ChangesError::Expired { oldest: o })) => {
                        expired = true;
                        at.push(o);
                        oldest.push(o);
                    }
                    Err(Read::Changes(ChangesError::Unknown(_)))
                        if feed.may_catch_up() && Instant::now() < deadline =>
                    {
                        tokio::time::sleep(FOLLOW_POLL).await;
                        continue;
                    }
                    Err(Read::Changes(ChangesError::Unknown(p))) => {
                        return Err(ApiError::CursorInvalid(format!(
                            "`{after}` is past the end of this server's change stream (at {p})"
                        )));
                    }
                    Err(Read::Changes(ChangesError::Storage(e))) => {
                        return Err(ApiError::Engine(e.into()));
                    }
                }
                break;
            }
        }
        if expired {
            // The oldest cursor served: the reader's own position where it is still kept.
            let served: Vec<Position> = at.iter().zip(&oldest).map(|(a, o)| *a.max(o)).collect();
            return Err(ApiError::CursorExpired(cursor_text(&served)));
        }
        Ok(Watch {
            feeds,
            at,
            event,
            follow,
        })
    }

    /// The changes after where the reader stands, up to a page of each group read, and
    /// whether every group was read to its end.
    pub fn next_batch(&mut self) -> Result<(Vec<pb::Change>, bool), ApiError> {
        let mut out = Vec::new();
        let mut at_end = true;
        for g in 0..self.feeds.len() {
            if self.event.as_ref().is_some_and(|(_, eg)| *eg != g) {
                continue;
            }
            let page = match self.feeds[g].read(Some(self.at[g]), PAGE) {
                Ok(page) => page,
                Err(Read::Api(e)) => return Err(e),
                Err(Read::Changes(ChangesError::Expired { oldest })) => {
                    // Trimmed while the reader was away (retention passed it by).
                    let mut served = self.at.clone();
                    served[g] = oldest;
                    return Err(ApiError::CursorExpired(cursor_text(&served)));
                }
                // A copy behind the reader (replaced by an older snapshot): it catches up.
                Err(Read::Changes(ChangesError::Unknown(_))) => continue,
                Err(Read::Changes(ChangesError::Storage(e))) => {
                    return Err(ApiError::Engine(e.into()));
                }
            };
            at_end &= page.at_end;
            for (pos, change) in page.changes {
                self.at[g] = pos;
                if self
                    .event
                    .as_ref()
                    .is_some_and(|(e, _)| e != change.event_id.as_str())
                {
                    continue;
                }
                out.push(change_proto(cursor_text(&self.at), change));
            }
            self.at[g] = page.next;
        }
        Ok((out, at_end))
    }
}

/// Streams `watch` into a channel: every change, then (following) each new one, until the
/// reader goes, the server drains (`drain`), or an error (sent last).
pub fn spawn(
    mut watch: Watch,
    mut drain: tokio::sync::watch::Receiver<bool>,
) -> tokio::sync::mpsc::Receiver<Result<pb::Change, ApiError>> {
    let (tx, rx) = tokio::sync::mpsc::channel(PAGE);
    tokio::spawn(async move {
        let _reader = Reader::counted();
        loop {
            if *drain.borrow() {
                // Not the end of the stream: the reader resumes elsewhere, or after the restart.
                let _ = tx.send(Err(ApiError::NotReady)).await;
                return;
            }
            let (batch, at_end) = match watch.next_batch() {
                Ok(b) => b,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            for change in batch {
                if tx.send(Ok(change)).await.is_err() {
                    return;
                }
                metrics::counter!("boxoffice_changes_sent_total").increment(1);
            }
            if at_end {
                if !watch.follow {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(FOLLOW_POLL) => {}
                    () = tx.closed() => return,
                    _ = drain.changed() => {}
                }
            }
        }
    });
    rx
}

/// One reader, counted in `boxoffice_changes_readers` while it lives.
struct Reader;

impl Reader {
    fn counted() -> Reader {
        metrics::gauge!("boxoffice_changes_readers").increment(1.0);
        Reader
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        metrics::gauge!("boxoffice_changes_readers").decrement(1.0);
    }
}

fn sale_proto(s: &SaleControls) -> pb::SaleChange {
    pb::SaleChange {
        state: convert::sale_state(s.state) as i32,
        admit_rate_per_second: s.admit_rate_per_second,
        hold_ttl_seconds: u32::try_from(s.hold_ttl_ms / 1000).unwrap_or(u32::MAX),
        per_user_limit: s.per_user_limit,
        hold_cooldown_seconds: u32::try_from(s.hold_cooldown_ms / 1000).unwrap_or(u32::MAX),
    }
}

/// An event as created (counts zero), as the API shows it.
fn event_proto(
    event_id: String,
    at_ms: u64,
    spec: &boxoffice_engine::EventSpec,
    sale: &SaleControls,
) -> pb::Event {
    pb::Event {
        event_id,
        name: spec.name.clone(),
        sections: spec
            .sections
            .iter()
            .map(|s| {
                // A new section: every tier whole.
                let prices =
                    boxoffice_engine::prices::Prices::new(s.price_tiers.clone(), s.price_cents);
                pb::SectionSummary {
                    section_id: s.section_id.0.clone(),
                    name: s.name.clone(),
                    kind: convert::section_kind(s.kind()),
                    capacity: s.capacity(),
                    available: s.capacity(),
                    held: 0,
                    sold: 0,
                    price_cents: s.price_cents,
                    access_code_required: false,
                    price_tiers: convert::price_tiers(&prices.status()),
                    next_price_cents: prices.next_price_cents(),
                }
            })
            .collect(),
        hold_ttl_seconds: u32::try_from(sale.hold_ttl_ms / 1000).unwrap_or(u32::MAX),
        per_user_limit: sale.per_user_limit,
        admit_rate_per_second: sale.admit_rate_per_second,
        admission_window_seconds: u32::try_from(spec.admission_window_ms / 1000)
            .unwrap_or(u32::MAX),
        sale_opens_at_unix_ms: convert::ms(spec.sale_opens_at_ms),
        state: if spec.sale_opens_at_ms > at_ms {
            pb::EventState::Scheduled
        } else {
            pb::EventState::OnSale
        } as i32,
        sale_state: convert::sale_state(sale.state) as i32,
        sale_state_changed_at_unix_ms: convert::ms(sale.state_changed_at_ms),
        admit_rate_changed_at_unix_ms: convert::ms(sale.rate_changed_at_ms),
        terms_changed_at_unix_ms: convert::ms(sale.terms_changed_at_ms),
        hold_cooldown_seconds: u32::try_from(sale.hold_cooldown_ms / 1000).unwrap_or(u32::MAX),
        ..pb::Event::default()
    }
}

/// A change as the API shows it, with its cursor.
pub fn change_proto(cursor: String, c: Change) -> pb::Change {
    let mut out = pb::Change {
        cursor,
        event_id: c.event_id.0.clone(),
        at_unix_ms: convert::ms(c.at_ms),
        kind: c.kind.name().to_owned(),
        ..pb::Change::default()
    };
    match c.kind {
        ChangeKind::EventCreated { spec, sale } => {
            out.event_created = Some(event_proto(c.event_id.0, c.at_ms, &spec, &sale));
        }
        ChangeKind::HoldPlaced(h) | ChangeKind::HoldReleased(h) | ChangeKind::HoldExpired(h) => {
            out.hold = Some(convert::hold(h));
        }
        ChangeKind::OrderCreated(o) => out.order = Some(convert::order_without_codes(o)),
        ChangeKind::PlacesWithdrawn {
            section_id,
            quantity,
        } => {
            out.places_withdrawn = Some(pb::PlacesWithdrawnChange {
                section_id: section_id.0,
                quantity,
            });
        }
        ChangeKind::WaitlistOffered { entry_id, hold_id } => {
            out.waitlist_offer = Some(pb::WaitlistOfferChange {
                entry_id,
                hold_id: hold_id.0,
            });
        }
        ChangeKind::SaleUpdated(sale) => out.sale = Some(sale_proto(&sale)),
        ChangeKind::Refunded {
            payment_id,
            hold_id,
            amount_cents,
            user_id,
        } => {
            out.refund = Some(pb::RefundChange {
                payment_id,
                hold_id: hold_id.map(|h| h.0).unwrap_or_default(),
                user_id: user_id.map(|u| u.0).unwrap_or_default(),
                amount_cents,
            });
        }
        kind @ (ChangeKind::TicketsTransferred { .. } | ChangeKind::TicketsCancelled { .. }) => {
            tickets_change(kind, &mut out);
        }
    }
    out
}

/// Sets `out`'s part of a change of tickets (moved or given back).
fn tickets_change(kind: ChangeKind, out: &mut pb::Change) {
    match kind {
        ChangeKind::TicketsTransferred {
            from,
            to,
            ticket_ids,
        } => {
            out.tickets_transferred = Some(pb::TicketsTransferredChange {
                from_order: Some(crate::convert::order_without_codes(from)),
                to_order: Some(crate::convert::order_without_codes(to)),
                ticket_ids,
            });
        }
        ChangeKind::TicketsCancelled {
            order,
            ticket_ids,
            refund_cents,
            refund_key,
        } => {
            out.tickets_cancelled = Some(pb::TicketsCancelledChange {
                order: Some(crate::convert::order_without_codes(order)),
                ticket_ids,
                refund_cents,
                refund_key,
            });
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_name_every_group_and_bad_ones_are_refused() {
        let at = [Position { seq: 4, index: 2 }, Position::after_record(9)];
        let text = cursor_text(&at);
        assert_eq!(text, "4.2_9");
        assert_eq!(
            parse_cursor(&text, 2).unwrap(),
            at.iter().copied().map(Some).collect::<Vec<_>>()
        );
        assert_eq!(parse_cursor("", 2).unwrap(), vec![None, None]);
        assert_eq!(
            parse_cursor("0", 3).unwrap(),
            vec![Some(Position::START); 3]
        );
        for bad in ["4.2", "4.2_9_1", "x_1", "1_", "-1_2"] {
            assert!(
                matches!(parse_cursor(bad, 2), Err(ApiError::CursorInvalid(_))),
                "{bad}"
            );
        }
    }
}
