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
//! It publishes a [`SectionSnapshot`] on a `watch` channel (reading availability never enters the
//! mailbox) with every change once the change is durable, just before its replies leave: a caller
//! that got its reply reads its own change (or a later one), and no reader ever sees a change that
//! a crash could still take back (on a cluster, a leader's batch is durable once committed; a
//! leader that dies first loses it, and a count that had shown it would go back). The snapshot is
//! taken when the batch is sealed and sent by the flusher's completion; a message that changes
//! nothing copies nothing. A snapshot is the counts and one byte per seat (up to 1 MB for the
//! largest section), with its version (the last record of the stream it shows): readers that
//! build something from a snapshot (the gateway's seat maps) rebuild only when the version moved.

use crate::changes::{Change, ChangeKind};
use crate::hash::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use metrics::Counter;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;

use crate::clock::Clock;
use crate::core::{CancelTickets, Cancelled, TransferTickets, Transferred};
use crate::core::{ConfirmHold, PlaceHold, SaleChange, SectionCore, SectionRecord};
use crate::error::{EngineError, Rejection, StorageError};
use crate::ledger::Ledger;
use crate::store::{Store, StreamWriter};
use crate::types::{
    EventId, HoldId, HoldStatus, HoldView, OrderCursor, OrderId, OrderView, SectionId,
    SectionSnapshot, UserId,
};

use crate::limits::{DEPTH_GAUGE_EVERY_MESSAGES, SECTION_BATCH_REPLIES_MAX};

type Reply<T> = RpcReplyPort<Result<T, EngineError>>;
type HoldReply = Reply<Vec<Result<HoldView, Rejection>>>;

/// Messages a section actor takes. Commands are imperative.
pub(crate) enum SectionMsg {
    /// Holds (a call's holds for this section; one for a unary hold), placed in order and
    /// answered together once durable; with the caller's span (the decision's parent in a
    /// trace, see [`crate::trace`]).
    Hold(Vec<PlaceHold>, tracing::Span, HoldReply),
    Confirm(ConfirmHold, Reply<OrderView>),
    Release(HoldId, UserId, Reply<HoldView>),
    /// Gives tickets of an order back (`CancelTickets`), answered once durable.
    Cancel(CancelTickets, Reply<Cancelled>),
    /// Moves tickets of an order to another fan (`TransferTickets`), answered once durable.
    Transfer(TransferTickets, Reply<Transferred>),
    ExpireDue(usize, Vec<PlaceHold>, Reply<Expired>),
    /// Stand as an operator's sale control says (see [`SectionCore::sale_change`]), as of the
    /// given time if any (a pause recorded in the catalog before a crash: from when it was
    /// recorded) or now; answered once its record (if any) is durable.
    Sale(SaleChange, Option<u64>, Reply<()>),
    /// Expire this hold if it is due (a confirm found it past its deadline before charging);
    /// answers whether it is still held (not due: the sale is paused).
    ExpireHoldIfDue(HoldId, Reply<bool>),
    GetHold(HoldId, Reply<HoldView>),
    GetOrder(OrderId, Reply<OrderView>),
    /// The ids of the tickets given back here (the event's revocation list's part).
    Revoked(Reply<Vec<String>>),
    /// A user's orders here, newest first, before the cursor if any, at most so many.
    OrdersOf(UserId, Option<OrderCursor>, usize, Reply<Vec<OrderView>>),
    /// The places free now (neither held, sold nor withdrawn): what a best-available hold
    /// may take. Answered in mailbox order, once everything before it is durable.
    Available(Reply<u32>),
    /// A copy of the core, for invariant checks and tests.
    Inspect(Reply<Box<SectionCore>>),
    /// The earliest deadline of an active hold.
    NextDeadline(Reply<Option<u64>>),
    /// How many active holds are past their deadline now (the sweeper's backlog).
    PastDeadline(Reply<usize>),
    /// (holds remembered, of which ended): see [`SectionCore::remembered`].
    Remembered(Reply<(usize, usize)>),
    /// Ends the open batch (sent by the actor to itself: see [`SectionState::seal`]).
    Seal,
    /// Test support: panic in the handler (as a failed invariant check would).
    #[cfg(feature = "test-support")]
    Panic,
}

impl SectionMsg {
    /// Answers a message that would change the section with `e` instead (the store halted).
    /// Returns the message back if it changes nothing (it is served as usual).
    fn refuse_change(self, e: &StorageError) -> Option<SectionMsg> {
        let err = EngineError::from(e.clone());
        match self {
            SectionMsg::Hold(_, _, reply) => send(reply, Err(err)),
            SectionMsg::Confirm(_, reply) => send(reply, Err(err)),
            SectionMsg::Release(_, _, reply) => send(reply, Err(err)),
            SectionMsg::Cancel(_, reply) => send(reply, Err(err)),
            SectionMsg::Transfer(_, reply) => send(reply, Err(err)),
            SectionMsg::ExpireDue(_, _, reply) => send(reply, Err(err)),
            SectionMsg::ExpireHoldIfDue(_, reply) => send(reply, Err(err)),
            SectionMsg::Sale(_, _, reply) => send(reply, Err(err)),
            other => return Some(other),
        }
        None
    }
}

/// What an `ExpireDue` did: the holds it ended, the section's next deadline after it, and the
/// outcome of each hold it was asked to place for waiting fans once the due ones had ended.
pub(crate) struct Expired {
    pub ended: Vec<HoldView>,
    pub next: Option<u64>,
    pub offers: Vec<Result<HoldView, Rejection>>,
}

pub(crate) struct SectionArgs {
    pub core: SectionCore,
    pub stream: StreamWriter,
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    pub ledger: Ledger,
    /// The access codes' uses: a released or expired hold's come back once durable.
    pub redemptions: Arc<crate::access::Redemptions>,
    pub snapshot: Arc<watch::Sender<Arc<SectionSnapshot>>>,
    pub depth: Arc<AtomicUsize>,
    /// The last record known durable (shared with the router's handle; starts at the last
    /// record of the log the actor starts from).
    pub durable: Arc<AtomicU64>,
    pub checkpoint_every: u64,
    pub notices: Notices,
}

pub(crate) struct SectionState {
    a: SectionArgs,
    durable_seq: Arc<AtomicU64>,
    /// The batch being built: what the messages of this mailbox run wrote and who waits for it.
    open: OpenBatch,
    /// Whether a [`SectionMsg::Seal`] is in the mailbox.
    seal_queued: bool,
    /// Messages since the mailbox depth gauge was last set.
    since_gauge: u32,
    counters: Counters,
    /// The earliest deadline last reported to the listener.
    reported_deadline: Option<Option<u64>>,
}

/// A completion waiting for its batch to be durable.
type Waiting = Box<dyn FnOnce(Result<(), StorageError>) + Send>;

/// The records and replies of the messages handled since the last seal.
#[derive(Default)]
struct OpenBatch {
    records: Vec<SectionRecord>,
    claims: Vec<(String, Vec<u8>)>,
    ended: Vec<HoldView>,
    /// The access code uses of the released and expired holds among `ended`: (code, places),
    /// read as each hold ends (the core forgets its code a window later).
    code_returns: Vec<(u32, u32)>,
    replies: Vec<Waiting>,
    /// The spans of the traced callers among them (their group commit joins their traces).
    traces: Vec<tracing::Span>,
}

struct Counters {
    labels: [(&'static str, String); 2],
    depth: metrics::Gauge,
    /// Places by state (`available`, `held`, `sold`), set with every published snapshot.
    places: [metrics::Gauge; 3],
    holds: Counter,
    confirms: Counter,
    releases: Counter,
    expired: Counter,
    rejections: HashMap<&'static str, Counter>,
}

impl Counters {
    fn new(event: &str, section: &str) -> Counters {
        let labels = [("event", event.to_owned()), ("section", section.to_owned())];
        let place = |state: &'static str| {
            metrics::gauge!(
                "boxoffice_section_places",
                "event" => event.to_owned(),
                "section" => section.to_owned(),
                "state" => state
            )
        };
        let mut rejections = HashMap::default();
        // Every reason at 0 from the section's start, not from its first refusal.
        for r in Rejection::every() {
            let reason = r.reason();
            rejections.entry(reason).or_insert_with(|| {
                metrics::counter!(
                    "boxoffice_section_rejections_total",
                    "event" => event.to_owned(),
                    "section" => section.to_owned(),
                    "reason" => reason
                )
            });
        }
        Counters {
            depth: metrics::gauge!("boxoffice_section_mailbox_depth", &labels),
            places: [place("available"), place("held"), place("sold")],
            holds: metrics::counter!("boxoffice_section_holds_total", &labels),
            confirms: metrics::counter!("boxoffice_section_confirms_total", &labels),
            releases: metrics::counter!("boxoffice_section_releases_total", &labels),
            expired: metrics::counter!("boxoffice_section_expired_total", &labels),
            rejections,
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

impl SectionState {
    /// Adds `records` to the section's open batch; `reply` runs once they (and everything
    /// before them) are durable. With no records and nothing pending or in flight to the log,
    /// replies at once. The batch goes to the flusher as one job at the end of the mailbox
    /// run it was built in ([`SectionState::seal`]).
    fn commit(
        &mut self,
        records: Vec<SectionRecord>,
        claims: Vec<(String, Vec<u8>)>,
        ended: Vec<HoldView>,
        reply: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) {
        let last_numbered = self.a.stream.next_seq - 1;
        let at_once = crate::bugs::on(crate::bugs::Bug::RefusalBeforeDurable)
            || (self.open.replies.is_empty()
                && self.durable_seq.load(Ordering::Acquire) >= last_numbered);
        if records.is_empty() && at_once {
            reply(Ok(()));
            return;
        }
        self.open.records.extend(records);
        self.open.claims.extend(claims);
        // Only a hold that really ended (by the core, not the view passed: tickets given back
        // come as a "released" view of a hold that stays confirmed, and keep their uses).
        let core = &self.a.core;
        // A hold without a code (nearly all) costs one lookup.
        self.open.code_returns.extend(ended.iter().filter_map(|h| {
            let code = core.code_of(&h.hold_id)?;
            let now = core.hold_view(&h.hold_id)?.status;
            matches!(now, HoldStatus::Released | HoldStatus::Expired).then_some((code, h.quantity))
        }));
        self.open.ended.extend(ended);
        self.open.replies.push(Box::new(reply));
    }

    /// Seals the open batch: takes the snapshot of its change, numbers and encodes its records
    /// into one job for the flusher, and queues a checkpoint behind it if one is due. Once the
    /// job is durable, the snapshot is published before any of its replies leave (so a caller
    /// that got its reply reads its own change, and nobody reads a change still in flight).
    /// Nothing open: nothing to do.
    fn seal(&mut self) {
        if self.open.replies.is_empty() {
            return;
        }
        let open = std::mem::take(&mut self.open);
        let upto = self.a.stream.next_seq - 1 + open.records.len() as u64;
        // The snapshot shows these records' change: its version is their last number. A batch
        // that writes nothing changed nothing, so it publishes nothing.
        let snap = (!open.records.is_empty()).then(|| self.snapshot_at(upto));
        let publisher = self.publisher();
        let durable = self.durable_seq.clone();
        let ledger = self.a.ledger.clone();
        let event_id = self.a.core.event_id().clone();
        let notices = self.a.notices.clone();
        let sealed_at = self.a.clock.now_ms();
        let (ended, replies, code_returns) = (open.ended, open.replies, open.code_returns);
        let traces = open.traces;
        // The access code uses of ended holds come back with their quota (see crate::access).
        let redemptions = self.a.redemptions.clone();
        let changes = changes_of(&self.a.core, &open.records);
        let job = self.a.stream.append_changing(
            &open.records,
            open.claims,
            &changes,
            Box::new(move |r| {
                if r.is_ok() {
                    durable.fetch_max(upto, Ordering::AcqRel);
                    if let Some(snap) = snap {
                        publisher.publish(snap);
                    }
                    // Released or expired places count against nobody once durable.
                    let refunds = ended
                        .iter()
                        .filter(|h| matches!(h.status, HoldStatus::Released | HoldStatus::Expired))
                        .map(|h| {
                            let expired = (h.status == HoldStatus::Expired).then_some(sealed_at);
                            (event_id.clone(), h.user_id.clone(), h.quantity, expired)
                        })
                        .collect::<Vec<_>>();
                    if !refunds.is_empty() {
                        ledger.refund(refunds);
                    }
                    for (code, n) in code_returns {
                        redemptions.give_back(&event_id, code, n);
                    }
                    for hold in ended {
                        notify(&notices, Notice::HoldEnded(hold));
                    }
                }
                for reply in replies {
                    reply(r.clone());
                }
            }),
        );
        let core = &self.a.core;
        self.a.store.submit_with_checkpoint(
            job.traced(traces),
            &mut self.a.stream,
            self.a.checkpoint_every,
            || core.checkpoint(),
        );
    }

    /// The section as it stands now, as of record `version`.
    fn snapshot_at(&self, version: u64) -> SectionSnapshot {
        let mut snap = self.a.core.snapshot(version);
        snap.changed_at_ms = self.a.clock.now_ms();
        snap
    }

    fn publisher(&self) -> Publisher {
        Publisher {
            snapshot: self.a.snapshot.clone(),
            places: self.counters.places.clone(),
        }
    }
}

/// Where a section's durable snapshots go: the `watch` channel, and the places gauges.
struct Publisher {
    snapshot: Arc<watch::Sender<Arc<SectionSnapshot>>>,
    places: [metrics::Gauge; 3],
}

impl Publisher {
    /// Publishes `snap` unless a later version is out already (completions run in log order;
    /// this keeps the versions a reader sees from ever going back regardless).
    fn publish(&self, snap: SectionSnapshot) {
        let newer = self.snapshot.send_if_modified(|current| {
            let newer = snap.version > current.version;
            if newer {
                *current = Arc::new(snap);
            }
            newer
        });
        if newer {
            self.gauges();
        }
    }

    /// Sets the places gauges to the published counts: three atomic stores, no lock taken.
    fn gauges(&self) {
        let current = self.snapshot.borrow();
        let [available, held, sold] = &self.places;
        available.set(f64::from(current.available));
        held.set(f64::from(current.held));
        sold.set(f64::from(current.sold));
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
        let durable_seq = a.durable.clone();
        durable_seq.fetch_max(a.stream.next_seq - 1, Ordering::AcqRel);
        let counters = Counters::new(
            a.core.event_id().as_str(),
            a.core.spec().section_id.as_str(),
        );
        let st = SectionState {
            a,
            durable_seq,
            open: OpenBatch::default(),
            seal_queued: false,
            since_gauge: 0,
            counters,
            reported_deadline: None,
        };
        // What the actor starts from is durable: published at once.
        let version = st.a.stream.next_seq - 1;
        let snap = st.snapshot_at(version);
        st.a.snapshot.send_replace(Arc::new(snap));
        st.publisher().gauges();
        Ok(st)
    }

    // Over 70 lines: one arm per message kind, each a short call into the section's core.
    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let left = st.a.depth.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        let now = st.a.clock.now_ms();
        let batch_end = left == 0 || st.since_gauge + 1 >= DEPTH_GAUGE_EVERY_MESSAGES;
        let msg = match st.a.store.halt.check() {
            Ok(()) => Some(msg),
            Err(e) => msg.refuse_change(&e),
        };
        match msg {
            None => return Ok(()),
            Some(SectionMsg::Hold(cmds, span, reply)) => st.on_hold(cmds, &span, now, reply),
            Some(SectionMsg::Seal) => {
                // Everything handled before it is the batch: sealed now, whatever came after.
                st.seal_queued = false;
                st.seal();
            }
            Some(SectionMsg::Confirm(cmd, reply)) => st.on_confirm(cmd, now, reply),
            Some(SectionMsg::Sale(change, at, reply)) => st.on_sale(change, at, now, reply),
            Some(SectionMsg::Release(hold_id, user, reply)) => {
                st.on_release(&hold_id, &user, now, reply);
            }
            Some(SectionMsg::Cancel(cmd, reply)) => st.on_cancel(cmd, now, reply),
            Some(SectionMsg::Transfer(cmd, reply)) => st.on_transfer(cmd, now, reply),
            Some(SectionMsg::ExpireDue(max, offers, reply)) => {
                st.on_expire_due(max, offers, now, reply);
            }
            Some(SectionMsg::ExpireHoldIfDue(hold_id, reply)) => {
                match st.a.core.expire_hold_if_due(&hold_id, now) {
                    Some((ended, record)) => {
                        st.counters.expired.increment(1);
                        let ended = vec![ended.hold];
                        st.commit(vec![record], Vec::new(), ended, after(reply, Ok(false)));
                    }
                    None => {
                        let held =
                            st.a.core
                                .hold_view(&hold_id)
                                .is_some_and(|h| h.status == HoldStatus::Held);
                        st.commit(Vec::new(), Vec::new(), Vec::new(), after(reply, Ok(held)));
                    }
                }
            }
            Some(SectionMsg::GetHold(hold_id, reply)) => {
                let answer = st.a.core.hold_view(&hold_id).ok_or(Rejection::HoldNotFound);
                st.commit(Vec::new(), Vec::new(), Vec::new(), after(reply, answer));
            }
            Some(SectionMsg::GetOrder(order_id, reply)) => {
                let answer =
                    st.a.core
                        .order_view(&order_id)
                        .ok_or(Rejection::OrderNotFound);
                st.commit(Vec::new(), Vec::new(), Vec::new(), after(reply, answer));
            }
            Some(SectionMsg::Revoked(reply)) => {
                let answer = Ok(st.a.core.revoked_ticket_ids());
                st.commit(Vec::new(), Vec::new(), Vec::new(), after(reply, answer));
            }
            Some(SectionMsg::OrdersOf(user, before, limit, reply)) => {
                let answer = Ok(st.a.core.orders_of(&user, before.as_ref(), limit));
                st.commit(Vec::new(), Vec::new(), Vec::new(), after(reply, answer));
            }
            Some(SectionMsg::Available(reply)) => {
                let (_, available, _, _) = st.a.core.counts();
                st.commit(
                    Vec::new(),
                    Vec::new(),
                    Vec::new(),
                    after(reply, Ok(available)),
                );
            }
            Some(SectionMsg::Inspect(reply)) => {
                send(reply, Ok(Box::new(st.a.core.clone())));
            }
            Some(SectionMsg::NextDeadline(reply)) => {
                send(reply, Ok(st.a.core.next_deadline_ms()));
            }
            Some(SectionMsg::PastDeadline(reply)) => {
                send(reply, Ok(st.a.core.holds_past_deadline(now)));
            }
            Some(SectionMsg::Remembered(reply)) => {
                send(reply, Ok(st.a.core.remembered()));
            }
            #[cfg(feature = "test-support")]
            Some(SectionMsg::Panic) => panic!("test support: a section actor was told to panic"),
        }
        st.after_message(left, batch_end);
        st.end_of_message(&myself, left);
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // What the last messages wrote still goes to the log (their callers are waiting).
        st.seal();
        Ok(())
    }
}

impl SectionState {
    /// After each message: seal the open batch if the mailbox is empty (or the batch is at its
    /// bound); otherwise leave it open for the messages already queued, with a
    /// [`SectionMsg::Seal`] queued behind them, so the batch is sealed once they are handled
    /// even if the mailbox never runs dry (or the depth count is briefly high: a caller shed
    /// after counting itself).
    fn end_of_message(&mut self, myself: &ActorRef<SectionMsg>, left: usize) {
        if self.open.replies.is_empty() {
            return;
        }
        if left == 0
            || self.open.replies.len() >= SECTION_BATCH_REPLIES_MAX
            || self.open.records.len() >= SECTION_BATCH_REPLIES_MAX
        {
            self.seal();
            return;
        }
        if !self.seal_queued {
            self.a.depth.fetch_add(1, Ordering::AcqRel);
            if myself.cast(SectionMsg::Seal).is_ok() {
                self.seal_queued = true;
            } else {
                self.a.depth.fetch_sub(1, Ordering::AcqRel);
                self.seal();
            }
        }
    }

    fn on_hold(
        &mut self,
        cmds: Vec<PlaceHold>,
        caller: &tracing::Span,
        now: u64,
        reply: HoldReply,
    ) {
        let decision = crate::trace::decision(caller, cmds.len());
        let deciding = decision.enter();
        let mut records = Vec::with_capacity(cmds.len());
        let mut answers = Vec::with_capacity(cmds.len());
        for cmd in cmds {
            match self.a.core.place_hold(cmd, now) {
                Ok((view, record)) => {
                    self.counters.holds.increment(1);
                    records.push(record);
                    answers.push(Ok(view));
                }
                Err(r) => {
                    self.counters.rejected(&r);
                    answers.push(Err(r));
                }
            }
        }
        decision.record("placed", records.len());
        drop(deciding);
        // The group commit's parent: the caller's span, open until the reply (not the decision).
        if !records.is_empty() && crate::trace::sampled(caller) {
            self.open.traces.push(caller.clone());
        }
        self.commit(records, Vec::new(), Vec::new(), after(reply, Ok(answers)));
    }

    /// An operator's sale control: recorded as of `at` (no later than now) or now.
    fn on_sale(&mut self, change: SaleChange, at: Option<u64>, now: u64, reply: Reply<()>) {
        let at = at.map_or(now, |at| at.min(now));
        let records: Vec<_> = self.a.core.sale_change(change, at).into_iter().collect();
        self.commit(records, Vec::new(), Vec::new(), after(reply, Ok(())));
    }

    fn on_confirm(&mut self, cmd: ConfirmHold, now: u64, reply: Reply<OrderView>) {
        let user = cmd.user_id.clone();
        let hold_id = cmd.hold_id.clone();
        let (answer, record) = self.a.core.confirm(cmd, now);
        let mut ended = ended_hold(&self.a.core, &hold_id, &user, &record);
        let records: Vec<_> = record.into_iter().collect();
        match answer {
            Ok(c) => {
                self.counters.confirms.increment(1);
                // A confirmed hold ended too (for the waitlist); no quota comes back.
                ended.extend(self.a.core.hold_view(&hold_id));
                let claims = c
                    .sold_keys
                    .into_iter()
                    .map(|k| (k, hold_id.as_str().as_bytes().to_vec()))
                    .collect();
                self.commit(records, claims, ended, after(reply, Ok(c.order)));
            }
            Err(r) => {
                self.counters.rejected(&r);
                if !ended.is_empty() {
                    self.counters.expired.increment(1);
                }
                self.commit(records, Vec::new(), ended, after(reply, Err(r)));
            }
        }
    }

    fn on_release(&mut self, hold_id: &HoldId, user: &UserId, now: u64, reply: Reply<HoldView>) {
        let (answer, record) = self.a.core.release(hold_id, user, now);
        let ended = ended_hold(&self.a.core, hold_id, user, &record);
        let records: Vec<_> = record.into_iter().collect();
        match answer {
            Ok(released) => {
                self.counters.releases.increment(1);
                self.commit(records, Vec::new(), ended, after(reply, Ok(released.hold)));
            }
            Err(r) => {
                self.counters.rejected(&r);
                if !ended.is_empty() {
                    self.counters.expired.increment(1);
                }
                self.commit(records, Vec::new(), ended, after(reply, Err(r)));
            }
        }
    }

    /// Gives tickets back: once durable, their places count against their buyer no more and go
    /// to the waitlist first (told as a released part of the order's hold: `ended`).
    fn on_cancel(&mut self, cmd: CancelTickets, now: u64, reply: Reply<Cancelled>) {
        match self.a.core.cancel_tickets(cmd, now) {
            Ok((answer, Some(record))) => {
                let tickets = match &record {
                    SectionRecord::TicketsCancelled { tickets, .. } => tickets.clone(),
                    _ => Vec::new(),
                };
                let returned = self.a.core.hold_view(&answer.order.hold_id).map(|mut h| {
                    h.status = HoldStatus::Released;
                    h.quantity = u32::try_from(tickets.len()).unwrap_or(u32::MAX);
                    h.seat_ids = tickets
                        .iter()
                        .filter_map(|t| h.seat_ids.get(*t as usize).cloned())
                        .collect();
                    h.place_prices_cents = tickets
                        .iter()
                        .filter_map(|t| h.place_prices_cents.get(*t as usize).copied())
                        .collect();
                    h
                });
                self.commit(
                    vec![record],
                    Vec::new(),
                    returned.into_iter().collect(),
                    after(reply, Ok(answer)),
                );
            }
            Ok((answer, None)) => {
                self.commit(Vec::new(), Vec::new(), Vec::new(), after(reply, Ok(answer)))
            }
            Err(r) => {
                self.counters.rejected(&r);
                self.commit(Vec::new(), Vec::new(), Vec::new(), after(reply, Err(r)));
            }
        }
    }

    /// Moves tickets to another fan: the recipient's places are claimed anew (their claims in
    /// the record's job); nothing is freed, nobody is told of places.
    fn on_transfer(&mut self, cmd: TransferTickets, now: u64, reply: Reply<Transferred>) {
        match self.a.core.transfer_tickets(cmd, now) {
            Ok((answer, record)) => {
                let claims = match &record {
                    Some(SectionRecord::TicketsTransferred { new_hold_id, .. }) => answer
                        .sold_keys
                        .iter()
                        .map(|k| (k.clone(), new_hold_id.as_str().as_bytes().to_vec()))
                        .collect(),
                    _ => Vec::new(),
                };
                let records = record.into_iter().collect();
                self.commit(records, claims, Vec::new(), after(reply, Ok(answer)));
            }
            Err(r) => {
                self.counters.rejected(&r);
                self.commit(Vec::new(), Vec::new(), Vec::new(), after(reply, Err(r)));
            }
        }
    }

    /// Expires what is due and, in the same step, places the waiting fans' offers: the freed
    /// places go to them before any other request in the mailbox can take them.
    fn on_expire_due(
        &mut self,
        max: usize,
        offers: Vec<PlaceHold>,
        now: u64,
        reply: Reply<Expired>,
    ) {
        let ended = self.a.core.expire_due(now, max);
        self.counters.expired.increment(ended.len() as u64);
        let mut records = Vec::with_capacity(ended.len() + offers.len());
        let mut views = Vec::with_capacity(ended.len());
        for (e, record) in ended {
            views.push(e.hold);
            records.push(record);
        }
        let mut placed = Vec::with_capacity(offers.len());
        for cmd in offers {
            match self.a.core.place_hold(cmd, now) {
                Ok((view, record)) => {
                    self.counters.holds.increment(1);
                    records.push(record);
                    placed.push(Ok(view));
                }
                Err(r) => placed.push(Err(r)),
            }
        }
        let answer = Expired {
            ended: views.clone(),
            next: self.a.core.next_deadline_ms(),
            offers: placed,
        };
        self.commit(records, Vec::new(), views, after(reply, Ok(answer)));
    }

    /// After every message: tell the listener if the earliest deadline moved, keep the depth
    /// gauge.
    fn after_message(&mut self, left: usize, batch_end: bool) {
        let next = self.a.core.next_deadline_ms();
        if self.reported_deadline != Some(next) {
            self.reported_deadline = Some(next);
            notify(
                &self.a.notices,
                Notice::DeadlineChanged {
                    event_id: self.a.core.event_id().clone(),
                    section_id: self.a.core.spec().section_id.clone(),
                    next_ms: next,
                },
            );
        }
        self.since_gauge += 1;
        if batch_end {
            self.since_gauge = 0;
            self.counters.depth.set(left as f64);
        }
    }
}

/// The hold, if `record` ended it (an expiry found by a confirm or release, or a release):
/// its places go back to the holder's quota once durable.
fn ended_hold(
    core: &SectionCore,
    hold_id: &HoldId,
    user: &UserId,
    record: &Option<SectionRecord>,
) -> Vec<HoldView> {
    match record {
        Some(SectionRecord::HoldExpired { .. } | SectionRecord::HoldReleased { .. }) => core
            .hold_view(hold_id)
            .filter(|h| &h.user_id == user)
            .into_iter()
            .collect(),
        _ => Vec::new(),
    }
}

/// What the engine tells a listener (the sweeper): advisory, after the fact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A section's earliest active-hold deadline changed (`None`: no active hold).
    DeadlineChanged {
        /// The event.
        event_id: EventId,
        /// The section.
        section_id: SectionId,
        /// The earliest deadline now.
        next_ms: Option<u64>,
    },
    /// A hold ended (released, expired or confirmed), durably.
    HoldEnded(HoldView),
    /// Someone joined an event's waitlist.
    WaitlistJoined {
        /// The event.
        event_id: EventId,
    },
}

/// Who hears notices: set once (by the sweeper).
pub type Listener = Arc<dyn Fn(Notice) + Send + Sync>;
/// The engine's listener slot, shared with every actor.
pub(crate) type Notices = Arc<std::sync::OnceLock<Listener>>;

pub(crate) fn notify(notices: &Notices, notice: Notice) {
    if let Some(l) = notices.get() {
        l(notice);
    }
}

/// The change of a hold's record (with or without a code): the hold as placed, whatever
/// happened to it later in the same batch.
fn placed_change(core: &SectionCore, r: &SectionRecord) -> Option<(u64, ChangeKind)> {
    let p = r.as_placed()?;
    let view = HoldView {
        hold_id: p.hold_id.clone(),
        event_id: core.event_id().clone(),
        user_id: p.user_id.clone(),
        section_id: core.spec().section_id.clone(),
        seat_ids: p.seats.iter().map(|&s| core.seat_id(s)).collect(),
        quantity: p.quantity,
        status: HoldStatus::Held,
        placed_at_ms: p.placed_at_ms,
        expires_at_ms: p.expires_at_ms,
        place_prices_cents: match p.tiers {
            [] => vec![core.spec().price_cents; p.quantity as usize],
            tiers => tiers.iter().map(|&t| core.price_of_tier(t)).collect(),
        },
    };
    Some((p.placed_at_ms, ChangeKind::HoldPlaced(view)))
}

/// The changes a section's records made, from its core once they are applied.
pub(crate) fn changes_of(core: &SectionCore, records: &[SectionRecord]) -> Vec<Change> {
    let event_id = core.event_id();
    let hold = |hold_id: &HoldId| core.hold_view(hold_id);
    records
        .iter()
        .filter_map(|r| {
            let (at_ms, kind) = match r {
                SectionRecord::HoldPlaced { .. }
                | SectionRecord::HoldPlacedWithCode { .. }
                | SectionRecord::HoldPlacedPriced { .. } => placed_change(core, r)?,
                SectionRecord::HoldConfirmed {
                    order_id: o, at_ms, ..
                } => (
                    *at_ms,
                    ChangeKind::OrderCreated(core.order_as_confirmed(o)?),
                ),
                SectionRecord::TicketsCancelled { .. } => core.cancellation_change(r)?,
                SectionRecord::TicketsTransferred { .. } => core.transfer_change(r)?,
                SectionRecord::HoldReleased { hold_id, at_ms } => {
                    let mut h = hold(hold_id)?;
                    h.status = HoldStatus::Released;
                    (*at_ms, ChangeKind::HoldReleased(h))
                }
                SectionRecord::HoldExpired { hold_id, at_ms } => {
                    let mut h = hold(hold_id)?;
                    h.status = HoldStatus::Expired;
                    (*at_ms, ChangeKind::HoldExpired(h))
                }
                SectionRecord::PlacesWithdrawn { places, at_ms } => (
                    *at_ms,
                    ChangeKind::PlacesWithdrawn {
                        section_id: core.spec().section_id.clone(),
                        quantity: u32::try_from(places.len()).unwrap_or(u32::MAX),
                    },
                ),
                // The catalog's `SaleUpdated` tells of the sale once, for the whole event.
                SectionRecord::SalePaused { .. }
                | SectionRecord::SaleResumed { .. }
                | SectionRecord::SaleEnded { .. } => return None,
            };
            Some(Change {
                event_id: event_id.clone(),
                at_ms,
                kind,
            })
        })
        .collect()
}
