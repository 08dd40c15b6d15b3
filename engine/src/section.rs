//! The section actor: a thin shell around [`SectionCore`].
//!
//! For each message it reads the clock, lets the core decide, and hands the resulting log records
//! (and the reply) to the flusher. The reply is sent by the flusher only once the records are
//! durable: group commit happens there, over everything that arrived while the previous fsync ran.
//! The actor does not wait for the fsync, so it keeps deciding while the log catches up; a reply
//! that depends on a not-yet-durable change (say `SOLD_OUT` because of a hold still in flight to
//! disk) is ordered behind it by going through the flusher too. Nothing is acknowledged before
//! the state it reflects is durable.
//!
//! After each batch (when the actor's queue runs empty, or every
//! [`SNAPSHOT_EVERY_MESSAGES`] messages under sustained load) it publishes a
//! [`SectionSnapshot`] on a `watch` channel: reading availability never enters the mailbox.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use metrics::Counter;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;

use crate::clock::Clock;
use crate::core::{ConfirmHold, PlaceHold, SectionCore, SectionRecord};
use crate::error::{EngineError, Rejection, StorageError};
use crate::ledger::Ledger;
use crate::store::{Store, StreamWriter};
use crate::types::{HoldId, HoldView, OrderId, OrderView, SectionSnapshot, UserId};

/// Under sustained load, publish a snapshot at least this often.
pub const SNAPSHOT_EVERY_MESSAGES: u32 = 256;

type Reply<T> = RpcReplyPort<Result<T, EngineError>>;

/// Messages a section actor takes. Commands are imperative.
pub(crate) enum SectionMsg {
    Hold(PlaceHold, Reply<HoldView>),
    Confirm(ConfirmHold, Reply<OrderView>),
    Release(HoldId, UserId, Reply<HoldView>),
    ExpireDue(usize, Reply<Vec<HoldView>>),
    GetHold(HoldId, Reply<HoldView>),
    GetOrder(OrderId, Reply<OrderView>),
    /// A copy of the core, for invariant checks and tests.
    Inspect(Reply<Box<SectionCore>>),
    /// The earliest deadline of an active hold.
    NextDeadline(Reply<Option<u64>>),
}

pub(crate) struct SectionArgs {
    pub core: SectionCore,
    pub stream: StreamWriter,
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    pub ledger: Ledger,
    pub snapshot: watch::Sender<Arc<SectionSnapshot>>,
    pub depth: Arc<AtomicUsize>,
    pub checkpoint_every: u64,
}

pub(crate) struct SectionState {
    a: SectionArgs,
    durable_seq: Arc<AtomicU64>,
    since_publish: u32,
    counters: Counters,
}

struct Counters {
    labels: [(&'static str, String); 2],
    depth: metrics::Gauge,
    holds: Counter,
    confirms: Counter,
    releases: Counter,
    expired: Counter,
    rejections: HashMap<&'static str, Counter>,
}

impl Counters {
    fn new(event: &str, section: &str) -> Counters {
        let labels = [("event", event.to_owned()), ("section", section.to_owned())];
        Counters {
            depth: metrics::gauge!("boxoffice_section_mailbox_depth", &labels),
            holds: metrics::counter!("boxoffice_section_holds_total", &labels),
            confirms: metrics::counter!("boxoffice_section_confirms_total", &labels),
            releases: metrics::counter!("boxoffice_section_releases_total", &labels),
            expired: metrics::counter!("boxoffice_section_expired_total", &labels),
            rejections: HashMap::new(),
            labels,
        }
    }

    fn rejected(&mut self, r: &Rejection) {
        let reason = r.reason();
        let labels = &self.labels;
        self.rejections
            .entry(reason)
            .or_insert_with(|| {
                metrics::counter!(
                    "boxoffice_section_rejections_total",
                    "event" => labels[0].1.clone(),
                    "section" => labels[1].1.clone(),
                    "reason" => reason
                )
            })
            .increment(1);
    }
}

/// A hold that ended and whose places go back to the user's quota once durable.
type Refund = (UserId, u32);

impl SectionState {
    /// Hands `records` to the flusher; `reply` runs once they (and everything before them) are
    /// durable. With no records and nothing pending, replies at once.
    fn commit(
        &mut self,
        records: Vec<SectionRecord>,
        claims: Vec<(String, Vec<u8>)>,
        refunds: Vec<Refund>,
        reply: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) {
        let last_numbered = self.a.stream.next_seq - 1;
        if records.is_empty() && self.durable_seq.load(Ordering::Acquire) >= last_numbered {
            reply(Ok(()));
            return;
        }
        let upto = last_numbered + records.len() as u64;
        let durable = self.durable_seq.clone();
        let ledger = self.a.ledger.clone();
        let event_id = self.a.core.event_id().clone();
        let job = self.a.stream.append(
            &records,
            claims,
            Box::new(move |r| {
                if r.is_ok() {
                    durable.fetch_max(upto, Ordering::AcqRel);
                    for (user, q) in refunds {
                        ledger.refund(event_id.clone(), user, q);
                    }
                }
                reply(r);
            }),
        );
        self.a.store.submit(job);
        if self.a.stream.since_checkpoint >= self.a.checkpoint_every {
            let job = self.a.stream.checkpoint(&self.a.core);
            self.a.store.submit(job);
        }
    }

    fn publish(&mut self, now_ms: u64) {
        self.since_publish = 0;
        let snap = self.a.core.snapshot(now_ms);
        self.a.snapshot.send_replace(Arc::new(snap));
    }
}

fn send<T>(reply: Reply<T>, r: Result<T, EngineError>) {
    // The caller may have gone away (timeout, cancelled RPC); the effect stands regardless.
    let _ = reply.send(r);
}

fn after<T: Send + 'static>(
    reply: Reply<T>,
    answer: Result<T, Rejection>,
) -> impl FnOnce(Result<(), StorageError>) + Send + 'static {
    move |r: Result<(), StorageError>| {
        send(
            reply,
            match r {
                Ok(()) => answer.map_err(EngineError::from),
                Err(e) => Err(e.into()),
            },
        );
    }
}

pub(crate) struct SectionActor;

impl Actor for SectionActor {
    type Msg = SectionMsg;
    type State = SectionState;
    type Arguments = SectionArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        a: SectionArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let durable_seq = Arc::new(AtomicU64::new(a.stream.next_seq - 1));
        let counters = Counters::new(
            a.core.event_id().as_str(),
            a.core.spec().section_id.as_str(),
        );
        let mut st = SectionState {
            a,
            durable_seq,
            since_publish: 0,
            counters,
        };
        let now = st.a.clock.now_ms();
        st.publish(now);
        Ok(st)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let left = st.a.depth.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        let now = st.a.clock.now_ms();
        let halted = st.a.store.halt.check().err();
        match msg {
            SectionMsg::Hold(cmd, reply) => {
                if let Some(e) = halted {
                    send(reply, Err(e.into()));
                    return Ok(());
                }
                match st.a.core.place_hold(cmd, now) {
                    Ok((view, record)) => {
                        st.counters.holds.increment(1);
                        st.commit(vec![record], Vec::new(), Vec::new(), after(reply, Ok(view)));
                    }
                    Err(r) => {
                        st.counters.rejected(&r);
                        st.commit(Vec::new(), Vec::new(), Vec::new(), after(reply, Err(r)));
                    }
                }
            }
            SectionMsg::Confirm(cmd, reply) => {
                if let Some(e) = halted {
                    send(reply, Err(e.into()));
                    return Ok(());
                }
                let user = cmd.user_id.clone();
                let hold_id = cmd.hold_id.clone();
                let (answer, record) = st.a.core.confirm(cmd, now);
                let refunds = ended_refund(&st.a.core, &hold_id, &user, &record);
                let records: Vec<_> = record.into_iter().collect();
                match answer {
                    Ok(c) => {
                        st.counters.confirms.increment(1);
                        let claims = c
                            .sold_keys
                            .into_iter()
                            .map(|k| (k, hold_id.as_str().as_bytes().to_vec()))
                            .collect();
                        st.commit(records, claims, refunds, after(reply, Ok(c.order)));
                    }
                    Err(r) => {
                        st.counters.rejected(&r);
                        if !refunds.is_empty() {
                            st.counters.expired.increment(1);
                        }
                        st.commit(records, Vec::new(), refunds, after(reply, Err(r)));
                    }
                }
            }
            SectionMsg::Release(hold_id, user, reply) => {
                if let Some(e) = halted {
                    send(reply, Err(e.into()));
                    return Ok(());
                }
                let (answer, record) = st.a.core.release(&hold_id, &user, now);
                let refunds = ended_refund(&st.a.core, &hold_id, &user, &record);
                let records: Vec<_> = record.into_iter().collect();
                match answer {
                    Ok(ended) => {
                        st.counters.releases.increment(1);
                        st.commit(records, Vec::new(), refunds, after(reply, Ok(ended.hold)));
                    }
                    Err(r) => {
                        st.counters.rejected(&r);
                        if !refunds.is_empty() {
                            st.counters.expired.increment(1);
                        }
                        st.commit(records, Vec::new(), refunds, after(reply, Err(r)));
                    }
                }
            }
            SectionMsg::ExpireDue(max, reply) => {
                if let Some(e) = halted {
                    send(reply, Err(e.into()));
                    return Ok(());
                }
                let ended = st.a.core.expire_due(now, max);
                st.counters.expired.increment(ended.len() as u64);
                let mut records = Vec::with_capacity(ended.len());
                let mut refunds = Vec::with_capacity(ended.len());
                let mut views = Vec::with_capacity(ended.len());
                for (e, record) in ended {
                    refunds.push((e.hold.user_id.clone(), e.hold.quantity));
                    views.push(e.hold);
                    records.push(record);
                }
                st.commit(records, Vec::new(), refunds, after(reply, Ok(views)));
            }
            SectionMsg::GetHold(hold_id, reply) => {
                let answer = st.a.core.hold_view(&hold_id).ok_or(Rejection::HoldNotFound);
                st.commit(Vec::new(), Vec::new(), Vec::new(), after(reply, answer));
            }
            SectionMsg::GetOrder(order_id, reply) => {
                let answer =
                    st.a.core
                        .order_view(&order_id)
                        .ok_or(Rejection::OrderNotFound);
                st.commit(Vec::new(), Vec::new(), Vec::new(), after(reply, answer));
            }
            SectionMsg::Inspect(reply) => {
                send(reply, Ok(Box::new(st.a.core.clone())));
            }
            SectionMsg::NextDeadline(reply) => {
                send(reply, Ok(st.a.core.next_deadline_ms()));
            }
        }
        st.since_publish += 1;
        if left == 0 || st.since_publish >= SNAPSHOT_EVERY_MESSAGES {
            st.counters.depth.set(left as f64);
            st.publish(now);
        }
        Ok(())
    }
}

/// If `record` ended the hold (an expiry found by a confirm or release, or a release), the
/// holder's places go back to their quota.
fn ended_refund(
    core: &SectionCore,
    hold_id: &HoldId,
    user: &UserId,
    record: &Option<SectionRecord>,
) -> Vec<Refund> {
    match record {
        Some(SectionRecord::HoldExpired { .. } | SectionRecord::HoldReleased { .. }) => core
            .hold_view(hold_id)
            .map(|h| vec![(user.clone(), h.quantity)])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}
