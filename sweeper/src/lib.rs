//! # boxoffice-sweeper
//!
//! The sweeper actor: releases holds whose TTL ran out, and hands freed places to the waitlist.
//!
//! ## Expiry
//! It keeps every section's earliest active-hold deadline in an index ordered by deadline
//! (`BTreeSet<(deadline, event, section)>`, after mini-redis's expiry task), fed by the engine's
//! `DeadlineChanged` notices. It sleeps until the earliest deadline with a timer message
//! (`send_after`; a newer, earlier deadline re-arms it and the stale timer is ignored by its
//! generation), never with a sleep in a handler. When it wakes it asks each due section to
//! expire what is due, bounded: at most [`SweeperConfig::sections_per_tick_max`] sections of at
//! most [`SweeperConfig::expire_per_call_max`] holds each; a longer backlog continues in a
//! `Sweep` message queued behind whatever else arrived, so booking traffic interleaves with it.
//! The section checks deadlines itself too: a confirm after the deadline is refused even if the
//! sweeper has not run yet, and confirm and expiry of one hold are serialized by its section.
//!
//! ## Waitlist hand-off
//! When places come back (a hold released or expired) and fans wait for the event, it offers
//! them: for each waiting entry that fits the freed section, in line order, it places a hold in
//! the fan's name (best available, all or nothing, the event's TTL, per-user limit enforced by
//! the ledger as for any hold) and records the offer. For expiry the offers travel with the
//! expiry itself (`Engine::expire_section_offering`): the section ends the due holds and places
//! the offered ones in one step of its actor, so a fan's `Hold` queued behind cannot take the
//! freed places before the waiting fans (without that, under a flash sale's traffic, newly
//! admitted fans won nearly every race). A `Release`, and a late `Confirm` or `Release` that
//! expires its hold on the spot, free the places first and the offer follows on the
//! `HoldEnded` notice, so there a racing `Hold` can still come first. An entry
//! whose quantity does not fit is skipped for now (smaller requests behind it may fit), and so is
//! a fan who is at the per-user limit (they keep their place). An offered hold that is confirmed makes
//! its entry `FULFILLED`; one that is released or expires makes it `EXPIRED`, and its places go
//! to the next fan. On start it reconciles offers with their holds (a restart may have happened
//! in between) and offers whatever is free.

use boxoffice_engine::hash::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use boxoffice_engine::limits;
use boxoffice_engine::{
    Engine, EngineError, EventId, HoldId, HoldStatus, HoldView, Notice, Rejection, SectionId,
    UserId, WaitlistState, WaitlistView,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

mod index;
pub use index::{Arm, DeadlineIndex};

/// How much the sweeper does per step.
#[derive(Clone, Debug)]
pub struct SweeperConfig {
    /// Most sections expired per wake-up.
    pub sections_per_tick_max: usize,
    /// Most holds expired per section per call.
    pub expire_per_call_max: usize,
    /// Most waitlist entries tried per hand-off.
    pub offers_per_pass_max: usize,
    /// A safety-net sweep this often, whatever the index says (clock changes, lost timers).
    pub recheck: Duration,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            sections_per_tick_max: limits::SWEEP_SECTIONS_PER_TICK_DEFAULT,
            expire_per_call_max: limits::SWEEP_EXPIRE_PER_CALL_DEFAULT,
            offers_per_pass_max: limits::SWEEP_OFFERS_PER_PASS_DEFAULT,
            recheck: Duration::from_millis(limits::SWEEP_RECHECK_MS_DEFAULT),
        }
    }
}

/// What the sweeper has done, for tests and tools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweeperStats {
    /// Holds it expired.
    pub expired: u64,
    /// Largest delay between a deadline and its expiry, ms.
    pub lag_max_ms: u64,
    /// Holds offered to waitlist entries.
    pub offers_made: u64,
    /// Offers confirmed.
    pub offers_accepted: u64,
    /// Offers released or expired.
    pub offers_lapsed: u64,
}

/// Messages the sweeper takes.
pub enum SweeperMsg {
    /// An engine notice (deadline changed, hold ended, waitlist joined).
    Notice(Notice),
    /// The deadline timer (ignored unless its generation is current).
    Tick(u64),
    /// Expire what is due now.
    Sweep,
    /// Replies with the stats once every message sent before it was handled.
    Sync(RpcReplyPort<SweeperStats>),
}

/// How soon a section that answered `NOT_READY` (its actor restarting) is tried again, in ms.
const SECTION_RETRY_MS: u64 = 50;

/// How many passes' worth of waiting entries (`offers_per_pass_max` each) a restarted sweeper
/// looks at for an offer made but never recorded (`adopt_offers`). Offers go to the head of the
/// line a pass at a time, so an unrecorded one is near the head; the rest of a long line is
/// not read.
const ADOPT_SCAN_PASSES: usize = 4;

/// The sweeper actor.
pub struct Sweeper;

/// Arguments to start a sweeper.
pub struct SweeperArgs {
    /// The engine to sweep.
    pub engine: Engine,
    /// Bounds.
    pub config: SweeperConfig,
}

/// What the sweeper keeps.
pub struct SweeperState {
    engine: Engine,
    config: SweeperConfig,
    deadlines: DeadlineIndex,
    /// Holds offered to waitlist entries, by hold.
    offered: HashMap<HoldId, String>,
    /// Events with fans waiting (as far as the sweeper knows).
    waiting_events: HashSet<EventId>,
    /// Holds this sweeper expired while offering their places in the same step; removed when
    /// their `HoldEnded` arrives.
    handed_off: HashSet<HoldId>,
    /// Waitlist entries being ended (their records on the way to disk).
    pending_ends: tokio::task::JoinSet<()>,
    stats: SweeperStats,
}

impl SweeperState {
    fn set_deadline(&mut self, event: EventId, section: SectionId, next: Option<u64>) {
        self.deadlines.set(event, section, next);
    }

    /// Expires what is due, bounded; returns whether more is due.
    async fn sweep(&mut self) -> bool {
        let now = self.engine.now_ms();
        let mut sections = 0;
        while sections < self.config.sections_per_tick_max {
            let Some((event, section)) = self.deadlines.first_due(now) else {
                break;
            };
            sections += 1;
            // Fans waiting for this event are offered the freed places in the same step of
            // the section that frees them, before any other request can take them.
            let handing_off = self.waiting_events.contains(&event);
            let candidates = if handing_off {
                self.engine
                    .waitlist_candidates(&event, Some(&section), self.config.offers_per_pass_max)
                    .await
                    .unwrap_or_else(|e| {
                        tracing::error!(error = %e, %event, "cannot read the waitlist");
                        Vec::new()
                    })
            } else {
                Vec::new()
            };
            let offers: Vec<(UserId, u32, Option<String>)> = candidates
                .iter()
                .map(|c| (c.user_id.clone(), c.quantity, Some(c.entry_id.clone())))
                .collect();
            match self
                .engine
                .expire_section_offering(&event, &section, self.config.expire_per_call_max, &offers)
                .await
            {
                Ok((expired, next, placed)) => {
                    let mut made = Vec::new();
                    for (c, outcome) in candidates.into_iter().zip(placed) {
                        Self::offered_hold(&event, c, outcome, &mut made);
                    }
                    self.record_offers(made).await;
                    // Their places were offered just now: their `HoldEnded` needs no second
                    // pass over the same entries.
                    if handing_off {
                        self.handed_off
                            .extend(expired.iter().map(|h| h.hold_id.clone()));
                    }
                    for h in &expired {
                        let lag = now.saturating_sub(h.expires_at_ms);
                        self.stats.lag_max_ms = self.stats.lag_max_ms.max(lag);
                        metrics::histogram!("boxoffice_sweeper_expiry_lag_seconds")
                            .record(lag as f64 / 1000.0);
                    }
                    self.stats.expired += expired.len() as u64;
                    metrics::counter!("boxoffice_sweeper_expired_total")
                        .increment(expired.len() as u64);
                    self.set_deadline(event, section, next);
                }
                // The engine is shutting down: stop. Otherwise one section is being restarted
                // by the engine's supervisor: try it again shortly, and go on with the others.
                Err(EngineError::NotReady) if !self.engine.is_ready() => return false,
                Err(EngineError::NotReady) => {
                    self.set_deadline(event, section, Some(now + SECTION_RETRY_MS));
                }
                Err(e) => {
                    tracing::error!(error = %e, %event, %section, "expiry failed");
                    // Try again at the next wake-up rather than spin on it.
                    self.set_deadline(event, section, Some(now + 1_000));
                }
            }
        }
        self.deadlines.is_due(now)
    }

    fn arm(&mut self, myself: &ActorRef<SweeperMsg>) {
        if let Some(arm) = self.deadlines.rearm() {
            let delay = arm.at_ms.saturating_sub(self.engine.now_ms());
            let generation = arm.generation;
            myself.send_after(Duration::from_millis(delay), move || {
                SweeperMsg::Tick(generation)
            });
        }
    }

    /// Ends the waitlist entry an offered hold was made for: fulfilled if the hold was
    /// confirmed, lapsed otherwise.
    fn end_offer(&mut self, entry: String, confirmed: bool) {
        let (state, outcome) = if confirmed {
            self.stats.offers_accepted += 1;
            (WaitlistState::Fulfilled, "accepted")
        } else {
            self.stats.offers_lapsed += 1;
            (WaitlistState::Expired, "lapsed")
        };
        metrics::counter!("boxoffice_waitlist_offers_total", "outcome" => outcome).increment(1);
        // Recorded in the background: the sweeper does not wait for the waitlist's fsync
        // (deadlines would). `Sync` waits for these.
        let engine = self.engine.clone();
        self.pending_ends.spawn(async move {
            if let Err(e) = engine.waitlist_end(&entry, state).await {
                tracing::error!(error = %e, %entry, "cannot end a waitlist entry");
            }
        });
        while self.pending_ends.try_join_next().is_some() {}
    }

    async fn hold_ended(&mut self, hold: HoldView) {
        if let Some(entry) = self.offered.remove(&hold.hold_id) {
            self.end_offer(entry, hold.status == HoldStatus::Confirmed);
        }
        if self.handed_off.remove(&hold.hold_id) {
            return;
        }
        if matches!(hold.status, HoldStatus::Released | HoldStatus::Expired)
            && self.waiting_events.contains(&hold.event_id)
        {
            self.offer(&hold.event_id, Some(&hold.section_id)).await;
        }
    }

    /// Sorts what came of a hold placed for a waiting entry: an offer to record (into `made`),
    /// or a refusal. False if the engine failed in a way worth stopping this pass for.
    fn offered_hold(
        event: &EventId,
        c: WaitlistView,
        outcome: Result<HoldView, EngineError>,
        made: &mut Vec<(WaitlistView, HoldView)>,
    ) -> bool {
        match outcome {
            Ok(h) => {
                made.push((c, h));
                true
            }
            // All or nothing: this entry does not fit now; a smaller one behind it may.
            Err(EngineError::Rejected(Rejection::SoldOut)) => true,
            // Never past the per-user limit: this fan cannot take an offer now (they may
            // after releasing something); skip them, they keep their place.
            Err(EngineError::Rejected(Rejection::UserLimit { .. })) => true,
            // The section sells to code holders only (a presale): no offer until it ends. Or
            // the sale is over: places given back after it stay free.
            Err(EngineError::Rejected(Rejection::AccessCodeRequired | Rejection::SaleEnded)) => {
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, %event, "waitlist offer failed; will retry later");
                false
            }
        }
    }

    /// Records offers with the waitlist, all at once (they share the waitlist's group commit
    /// instead of waiting for one fsync each while deadlines wait for the sweeper).
    async fn record_offers(&mut self, made: Vec<(WaitlistView, HoldView)>) {
        let engine = self.engine.clone();
        let recorded = futures_util::future::join_all(
            made.iter()
                .map(|(c, h)| engine.waitlist_offer(&c.entry_id, &h.hold_id)),
        )
        .await;
        for ((c, h), r) in made.into_iter().zip(recorded) {
            if let Err(e) = r {
                tracing::error!(error = %e, entry = %c.entry_id, "cannot record an offer");
                continue;
            }
            self.stats.offers_made += 1;
            metrics::counter!("boxoffice_waitlist_offers_total", "outcome" => "made").increment(1);
            self.offered.insert(h.hold_id, c.entry_id);
        }
    }

    /// Offers freed places of `section` (`None`: any) to the event's waiting fans, in order.
    async fn offer(&mut self, event: &EventId, section: Option<&SectionId>) {
        // Free places per section, from the published counts (never behind an acknowledged
        // change). An entry that cannot fit is not tried: in a sold-out sale every join would
        // otherwise cost up to 16 holds answered SOLD_OUT, each behind the section's fsync.
        let mut free: HashMap<SectionId, u32> = match self.engine.available_places(event) {
            Ok(v) => v.into_iter().collect(),
            Err(e) => {
                tracing::error!(error = %e, %event, "cannot read the event");
                return;
            }
        };
        let candidates = if free.values().all(|&a| a == 0) {
            Vec::new()
        } else {
            match self
                .engine
                .waitlist_candidates(event, section, self.config.offers_per_pass_max)
                .await
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, %event, "cannot read the waitlist");
                    return;
                }
            }
        };
        let mut made = Vec::new();
        for c in candidates {
            let fits = match &c.section_id {
                Some(s) => free.get(s).is_some_and(|&a| a >= c.quantity),
                None => free.values().any(|&a| a >= c.quantity),
            };
            if !fits {
                continue;
            }
            // No idempotency key (a key would replay this attempt's SOLD_OUT forever), but the
            // entry's mark: a crash between this hold and its record leaves a hold the next
            // leader finds and offers (`adopt_offers`), not one offered to nobody.
            let outcome = self.engine.hold_offer(&c).await;
            if let Ok(h) = &outcome
                && let Some(a) = free.get_mut(&h.section_id)
            {
                *a = a.saturating_sub(h.quantity);
            }
            if !Self::offered_hold(event, c, outcome, &mut made) {
                break;
            }
        }
        self.record_offers(made).await;
        if let Ok(n) = self.engine.waitlist_len(event).await {
            metrics::gauge!("boxoffice_waitlist_length", "event" => event.to_string())
                .set(n as f64);
            if n == 0 {
                self.waiting_events.remove(event);
            }
        }
    }

    /// Offers made but never recorded: a leader that died between an offer's hold and its
    /// record with the waitlist left the hold (replicated) without the offer (not). Each is
    /// recorded now as its entry's offer, before any new offer could place a second hold for
    /// the same entry; one that ended meanwhile ends its offer as any ended offer does.
    async fn adopt_offers(&mut self) -> Result<(), EngineError> {
        for event in self.engine.waitlist_events().await? {
            let waiting = self
                .engine
                .waitlist_candidates(
                    &event,
                    None,
                    ADOPT_SCAN_PASSES.saturating_mul(self.config.offers_per_pass_max),
                )
                .await?;
            let mut made = Vec::new();
            for c in waiting {
                if let Some(hold) = self.engine.waitlist_offer_made(&c).await? {
                    tracing::warn!(entry = %c.entry_id, hold = %hold.hold_id, "a waitlist offer made before a restart was never recorded: recorded now");
                    made.push((c, hold));
                }
            }
            let holds: Vec<HoldId> = made.iter().map(|(_, h)| h.hold_id.clone()).collect();
            self.record_offers(made).await;
            for id in holds {
                match self.engine.get_hold(&id).await {
                    Ok(hold) if hold.status == HoldStatus::Held => {}
                    Ok(hold) => self.hold_ended(hold).await,
                    Err(EngineError::Rejected(Rejection::HoldNotFound)) => {
                        if let Some(entry) = self.offered.remove(&id) {
                            self.end_offer(entry, false);
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// After a (re)start: deadlines, outstanding offers, and places free for waiting fans.
    async fn reconcile(&mut self) -> Result<(), EngineError> {
        for (event, section, next) in self.engine.next_deadlines().await? {
            self.set_deadline(event, section, next);
        }
        for entry in self.engine.waitlist_offered().await? {
            let Some(hold_id) = entry.offered_hold_id else {
                continue;
            };
            match self.engine.get_hold(&hold_id).await {
                Ok(hold) => {
                    self.offered.insert(hold_id, entry.entry_id);
                    if hold.status != HoldStatus::Held {
                        self.hold_ended(hold).await;
                    }
                }
                // Forgotten: it ended (released or expired; confirmed holds are never
                // forgotten) an idempotency window ago or more, and the offer lapsed with it.
                Err(EngineError::Rejected(Rejection::HoldNotFound)) => {
                    self.end_offer(entry.entry_id, false);
                }
                Err(e) => return Err(e),
            }
        }
        self.adopt_offers().await?;
        for event in self.engine.waitlist_events().await? {
            self.waiting_events.insert(event.clone());
            self.offer(&event, None).await;
        }
        Ok(())
    }
}

impl Actor for Sweeper {
    type Msg = SweeperMsg;
    type State = SweeperState;
    type Arguments = SweeperArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SweeperArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let me = myself.clone();
        let listener: boxoffice_engine::Listener = Arc::new(move |n| {
            let _ = me.cast(SweeperMsg::Notice(n));
        });
        if !args.engine.set_listener(listener) {
            return Err("the engine has a sweeper already".into());
        }
        myself.send_interval(args.config.recheck, || SweeperMsg::Sweep);
        let mut st = SweeperState {
            engine: args.engine,
            config: args.config,
            deadlines: DeadlineIndex::default(),
            offered: HashMap::default(),
            handed_off: HashSet::default(),
            pending_ends: tokio::task::JoinSet::new(),
            waiting_events: HashSet::default(),
            stats: SweeperStats::default(),
        };
        // Holds already past their deadline (say, after a restart) expire right away.
        if let Err(e) = st.reconcile().await {
            tracing::error!(error = %e, "sweeper reconciliation failed");
        }
        let _ = myself.cast(SweeperMsg::Sweep);
        Ok(st)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let mut sweep = false;
        match msg {
            SweeperMsg::Notice(Notice::DeadlineChanged {
                event_id,
                section_id,
                next_ms,
            }) => st.set_deadline(event_id, section_id, next_ms),
            SweeperMsg::Notice(Notice::HoldEnded(hold)) => st.hold_ended(hold).await,
            SweeperMsg::Notice(Notice::WaitlistJoined { event_id }) => {
                st.waiting_events.insert(event_id.clone());
                st.offer(&event_id, None).await;
            }
            SweeperMsg::Tick(generation) => {
                sweep = st.deadlines.tick(generation);
            }
            SweeperMsg::Sweep => sweep = true,
            SweeperMsg::Sync(reply) => {
                while st.pending_ends.join_next().await.is_some() {}
                let _ = reply.send(st.stats);
            }
        }
        if sweep && st.sweep().await {
            // More is due: continue behind whatever else is queued.
            let _ = myself.cast(SweeperMsg::Sweep);
        }
        st.arm(&myself);
        Ok(())
    }
}

/// Starts a sweeper for `engine` (one per engine); stop it with `actor.stop(None)`.
pub async fn start(
    engine: Engine,
    config: SweeperConfig,
) -> Result<(ActorRef<SweeperMsg>, tokio::task::JoinHandle<()>), ractor::SpawnErr> {
    Actor::spawn(None, Sweeper, SweeperArgs { engine, config }).await
}

/// Waits until the sweeper handled everything sent before, then returns its stats.
pub async fn sync(sweeper: &ActorRef<SweeperMsg>) -> Option<SweeperStats> {
    match sweeper.call(SweeperMsg::Sync, None).await {
        Ok(ractor::rpc::CallResult::Success(s)) => Some(s),
        _ => None,
    }
}
