//! The [`Engine`] handle: what the gateway and the sweeper call. Opening it recovers the log and
//! starts the actors. It only composes components over a shared [`kernel`](crate::kernel), each
//! owning its state and reached through the calls here: [`catalog`](crate::catalog) (events,
//! availability), [`booking`](crate::booking) (holds and their reads),
//! [`checkout`](crate::checkout) (confirm and payment), [`expiry`](crate::expiry) (deadlines and
//! the waitlist hand-off), [`waitlist_calls`](crate::waitlist_calls) (the waitlist),
//! [`audit`](crate::audit) (reconciliation), [`refunds`](crate::refunds) (orphaned charges),
//! [`rooms`](crate::rooms) (waiting rooms' records) and [`supervisor`](crate::supervisor)
//! (section actors, restarting those that panic).

use crate::changes::{ChangesRead, Position};
use crate::hash::{DashMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorRef};
use tokio::sync::watch;

use crate::audit::Audit;
use crate::booking::Booking;
use crate::cancellations::{CancelRequest, Cancellations, TicketsCancelled};
use crate::catalog::Catalog;
use crate::checkout::Checkout;
use crate::config::EngineConfig;
use crate::core::SaleChange;
use crate::core::SectionCore;
use crate::core::Transferred;
use crate::error::{EngineError, StorageError};
use crate::events::{EventEntry, EventTerms, LoggedEvent, SectionFeed};
use crate::expiry::{ExpiredAndOffered, Expiry};
use crate::kernel::Kernel;
use crate::opening::{checked_payments, open_payments, open_sink, recover_log};
use crate::orphans::Orphans;
use crate::payment::PaymentProvider;
use crate::reconcile::Finding;
use crate::recovery::{CatalogEntry, Recovered, RecoveryReport};
use crate::refunds::{Refunds, Settlement};
use crate::rooms::{RoomLine, Rooms};
use crate::sale::SaleUpdate;
use crate::section::{Listener, SectionMsg};
use crate::store::{LogSink, Store, StreamWriter, names};
use crate::supervisor::{Restart, RestartSlot, Roles, Supervision, Supervisor, SupervisorArgs};
use crate::supervisor::{spawn_ledger, spawn_waitlist};
use crate::transfers::{TransferRequest, Transfers};
use crate::types::{
    CheckedHold, ConfirmRequest, EventId, EventSpec, EventView, HoldId, HoldRequest, HoldView,
    OrderCursor, OrderId, OrderView, OrdersPage, SeatMap, SectionId, UserId,
};
use crate::waitlist::{WaitlistMsg, WaitlistState, WaitlistView};
use crate::waitlist_calls::Waitlist;

/// The engine's components and what they share (the [`Kernel`]). Private: each component is
/// reached through the engine's methods.
pub(crate) struct Inner {
    kernel: Arc<Kernel>,
    catalog: Arc<Catalog>,
    booking: Booking,
    checkout: Checkout,
    cancellations: Cancellations,
    transfers: Transfers,
    expiry: Expiry,
    waitlist: Waitlist,
    audit: Audit,
    refunds: Refunds,
    rooms: Rooms,
    supervision: Arc<Supervision>,
    payments: Arc<dyn PaymentProvider>,
    recovery: OnceLock<RecoveryReport>,
}

impl Inner {
    /// The components over `kernel`, each given the others it calls: the catalog (with its
    /// stream's writer), the waitlist (over its actor), the supervision (which the supervisor,
    /// through `slot`, asks to restart actors), and those that serve calls.
    fn compose(
        kernel: Arc<Kernel>,
        catalog: StreamWriter,
        waitlist: ActorRef<WaitlistMsg>,
        (supervisor, roles, slot): (ActorRef<()>, Roles, RestartSlot),
        payments: Arc<dyn PaymentProvider>,
        rooms: HashMap<EventId, (RoomLine, u64)>,
    ) -> Result<Arc<Inner>, EngineError> {
        let catalog = Arc::new(Catalog::new(kernel.clone(), catalog));
        let waitlist = Waitlist::new(kernel.clone(), catalog.clone(), waitlist);
        let supervision = Arc::new(Supervision::new(
            kernel.clone(),
            catalog.clone(),
            waitlist.clone(),
            supervisor,
            roles,
        ));
        let restart: Arc<dyn Restart> = supervision.clone();
        let _ = slot.set(Arc::downgrade(&restart));
        let orphans = Arc::new(Orphans::default());
        let booking = Booking::new(kernel.clone(), catalog.clone());
        let (k, c, p, o) = (&kernel, &catalog, &payments, &orphans);
        let audit = Audit::new(k.clone(), c.clone(), p.clone(), o.clone());
        Ok(Arc::new(Inner {
            rooms: Rooms::open(kernel.clone(), rooms)?,
            checkout: Checkout::new(k.clone(), c.clone(), booking.clone(), p.clone(), o.clone()),
            refunds: Refunds::new(k.clone(), c.clone(), audit.clone(), booking.clone()),
            cancellations: Cancellations::new(k.clone(), c.clone(), p.clone()),
            transfers: Transfers::new(k.clone(), c.clone()),
            expiry: Expiry::new(k.clone(), c.clone()),
            booking,
            audit,
            waitlist,
            supervision,
            payments,
            catalog,
            kernel,
            recovery: OnceLock::new(),
        }))
    }
}

/// The engine: cheap to clone, shared by every caller.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl Engine {
    /// Opens (or creates) the log, replays it and starts the actors. Returns once the engine is
    /// ready to serve.
    pub async fn open(config: EngineConfig) -> Result<Engine, EngineError> {
        let started = Instant::now();
        let window_ms = config.idempotency_window_ms()?;
        let sink = open_sink(&config).await?;
        if config.recovery_mode == crate::integrity::RecoveryMode::Verify {
            return Err(
                StorageError::Io("an engine cannot open a log in verify mode".into()).into(),
            );
        }
        // The payment record's check runs beside the replay (both read the store, neither
        // writes what the other reads); its damage is acted on after the log's.
        let (recovered, payments) = tokio::join!(
            recover_log(&config, &sink, window_ms),
            open_payments(&config, sink.as_ref())
        );
        let (mut recovered, mut report) = recovered?;
        let payments = checked_payments(payments?, &config, sink.as_ref())?;
        let events = std::mem::take(&mut recovered.events);
        let cores = std::mem::take(&mut recovered.cores);
        let engine = Engine::start_actors(config, sink, recovered, payments).await?;
        engine.start_recovered(events, cores).await?;
        report.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        metrics::gauge!("boxoffice_engine_recovery_seconds").set(started.elapsed().as_secs_f64());
        tracing::info!(?report, "engine recovered");
        let _ = engine.inner.recovery.set(report);
        engine.kernel().set_serving(true);
        Ok(engine)
    }

    /// Starts the store (the group commit), the supervisor, the ledger shards and the waitlist
    /// from what recovery rebuilt; the sections start after ([`Engine::start_recovered`]).
    async fn start_actors(
        config: EngineConfig,
        sink: Arc<dyn LogSink>,
        recovered: Recovered,
        payments: Arc<dyn PaymentProvider>,
    ) -> Result<Engine, EngineError> {
        let store = Arc::new(Store::start(
            sink.clone(),
            config.durability,
            recovered.marks.clone(),
            config.replicate.clone(),
            config.change_retention,
        )?);
        let engine_slot = Arc::new(OnceLock::new());
        let roles: Roles = Arc::new(DashMap::default());
        let (supervisor, supervisor_done) = Actor::spawn(
            None,
            Supervisor,
            SupervisorArgs {
                engine: engine_slot.clone(),
                roles: roles.clone(),
            },
        )
        .await
        .map_err(|e| StorageError::Io(format!("cannot start the supervisor: {e}")))?;
        let (ledger_states, ledger_last) = (recovered.ledger_states, recovered.ledger_last);
        let ledger = spawn_ledger(
            ledger_states,
            &ledger_last,
            &store,
            &config,
            &supervisor,
            &roles,
        )
        .await?;
        let (list, list_last) = (recovered.waitlist, recovered.waitlist_last);
        let waitlist =
            spawn_waitlist(list, list_last, &store, &config, &supervisor, &roles).await?;
        let catalog = StreamWriter::open(sink.as_ref(), names::CATALOG, recovered.catalog_last)?;
        let kernel = Arc::new(Kernel::new(config, store, ledger, recovered.code_uses));
        let supervision = (supervisor, roles, engine_slot);
        let rooms = recovered.rooms;
        let inner = Inner::compose(kernel, catalog, waitlist, supervision, payments, rooms)?;
        let engine = Engine { inner };
        // Nobody supervises the supervisor: its children die with it.
        engine.stop_when_ended("the engine's supervisor", supervisor_done);
        Ok(engine)
    }

    /// Starts every recovered event's section actors from their recovered cores.
    async fn start_recovered(
        &self,
        events: Vec<CatalogEntry>,
        mut cores: HashMap<(EventId, SectionId), (SectionCore, u64)>,
    ) -> Result<(), EngineError> {
        for logged in events {
            let mut sections = Vec::new();
            for s in &logged.spec.sections {
                let key = (logged.event_id.clone(), s.section_id.clone());
                let (core, last_seq) = cores.remove(&key).ok_or_else(|| {
                    StorageError::Io(format!("recovery missed section {}/{}", key.0, key.1))
                })?;
                sections.push((core, last_seq));
            }
            self.start_event(logged, sections).await?;
        }
        // A sale control is recorded in the catalog before its sections act on it: a start
        // finishes what a crash (or a lost leadership) cut short.
        self.converge_sales().await
    }

    /// What recovery found when this engine opened.
    pub fn recovery_report(&self) -> RecoveryReport {
        self.inner.recovery.get().cloned().unwrap_or_default()
    }

    /// Whether the engine serves (false before recovery finished, once shutdown began, and once
    /// it stopped: see [`Engine::stopped`]).
    pub fn is_ready(&self) -> bool {
        self.kernel().serving() && self.kernel().store().halt.check().is_ok()
    }

    /// Why the engine stopped serving for good (a storage failure, an actor that could not be
    /// restarted), if it did; it then answers every change with an error until restarted.
    pub fn stopped(&self) -> Option<String> {
        self.kernel().store().halt.reason()
    }

    /// Up to `max` changes after `after` (`None`: the oldest kept), as far as they are durable
    /// ([`crate::changes`]; a cluster node reads its copy with [`crate::store::read_changes`]).
    pub fn changes(&self, after: Option<Position>, max: usize) -> ChangesRead {
        self.kernel().changes(after, max)
    }

    /// Stops the engine as a crash of its log would: calls answer `NOT_READY` from now on,
    /// nothing more is written. A cluster leader's watchdog uses it when its group stops
    /// confirming its leadership.
    pub fn halt(&self, reason: &str) {
        self.kernel().store().halt_now(reason);
    }

    /// A channel that changes once the engine stops (see [`Engine::stopped`]), for health.
    pub fn watch_stopped(&self) -> watch::Receiver<Option<String>> {
        self.kernel().store().halt.subscribe()
    }

    /// How many actors were restarted after a panic.
    pub fn actor_restarts(&self) -> u64 {
        self.inner.supervision.restarts()
    }

    /// What every component shares (see [`crate::kernel`]).
    pub(crate) fn kernel(&self) -> &Kernel {
        &self.inner.kernel
    }

    /// The payment provider that charges and refunds.
    pub fn payments(&self) -> Arc<dyn PaymentProvider> {
        self.inner.payments.clone()
    }

    /// Now, by the engine's clock (ms since the Unix epoch).
    pub fn now_ms(&self) -> u64 {
        self.kernel().now_ms()
    }

    /// What the engine remembers now: holds (live, and ended within the window) and
    /// idempotency keys. Asks every section and ledger shard (for soaks and tests).
    pub async fn remembered(&self) -> Result<crate::retention::Remembered, EngineError> {
        self.kernel().check_ready()?;
        let mut r = crate::retention::Remembered {
            idempotency_keys: self.kernel().ledger().keys_remembered().await?,
            ..crate::retention::Remembered::default()
        };
        for e in self.inner.catalog.entries() {
            for slot in &e.sections {
                let (holds, ended) = self
                    .kernel()
                    .ask(&e, &slot.section_id, SectionMsg::Remembered)
                    .await?;
                r.holds += holds;
                r.ended_holds += ended;
            }
        }
        Ok(r)
    }

    /// Sets the one listener of engine notices (deadline changes, ended holds, waitlist joins).
    /// Returns false if one was set already.
    pub fn set_listener(&self, listener: Listener) -> bool {
        self.kernel().notices().set(listener).is_ok()
    }

    /// The line of `event_id`'s waiting room as its records leave it (empty if it has none).
    pub async fn room_line(
        &self,
        event_id: &EventId,
    ) -> Result<crate::rooms::RoomLine, EngineError> {
        self.kernel().check_ready()?;
        Ok(self.inner.rooms.line(event_id).await)
    }

    /// Records `records` of `event_id`'s waiting room (an event that exists); returns once they
    /// are durable (on a cluster: committed by a majority). A record that does not fit the line
    /// is refused (nothing is written).
    pub async fn record_room(
        &self,
        event_id: &EventId,
        records: Vec<crate::rooms::RoomRecord>,
    ) -> Result<crate::rooms::RoomLine, EngineError> {
        self.kernel().check_ready()?;
        self.inner.catalog.entry(event_id)?;
        self.inner.rooms.record(event_id, records).await
    }

    /// Orderly stop: refuse new work, stop the actors, flush the log and close it.
    pub async fn shutdown(&self) {
        self.kernel().set_serving(false);
        self.stop_actors().await;
        self.kernel().store().close().await;
    }

    pub(crate) async fn stop_actors(&self) {
        for actor in self.kernel().router().actors() {
            let _ = actor.stop_and_wait(None, None).await;
        }
        for shard in self.kernel().ledger().actors() {
            let _ = shard.stop_and_wait(None, None).await;
        }
        let _ = self.inner.waitlist.actor().stop_and_wait(None, None).await;
        self.inner.supervision.stop().await;
        // An actor's state (with its handles on the store) may be dropped just after it reports
        // stopped; wait for that, so the data dir is free once the last `Engine` goes.
        // tokio's clock: a simulation's virtual one.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while Arc::strong_count(self.kernel().store()) > 1 && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The catalog's calls (see [`Catalog`]) and the composition it needs: an event's section
/// actors are started here, under the supervisor, before the catalog lists it.
impl Engine {
    /// Starts one actor per section of an event (each with its recovered core and the last
    /// sequence number of its stream) and lists the event.
    async fn start_event(
        &self,
        logged: LoggedEvent,
        sections: Vec<(SectionCore, u64)>,
    ) -> Result<(), EngineError> {
        let sections = self.inner.supervision.start_sections(sections).await?;
        self.inner.catalog.list(EventEntry {
            spec: logged.spec,
            event_id: logged.event_id,
            created_at_ms: logged.created_at_ms,
            sections,
            sale: logged.sale.into(),
            sale_keys: logged.sale_keys.into(),
        });
        Ok(())
    }

    /// Has every section of every event stand as its event's sale controls say (paused, ended
    /// or neither): a section already there records nothing.
    async fn converge_sales(&self) -> Result<(), EngineError> {
        for entry in self.inner.catalog.entries() {
            let sale = entry.sale();
            // A pause the catalog recorded holds from then: deadlines after it stand still.
            let paused = sale.state == crate::sale::SaleState::Paused;
            let at = paused.then_some(sale.state_changed_at_ms);
            self.inner
                .catalog
                .sections_follow_sale(&entry, SaleChange::of(sale.state), at)
                .await?;
        }
        Ok(())
    }

    /// Creates an event: validates the spec (zero values take the defaults), logs it durably and
    /// starts one actor per section. Idempotent by event id: the same spec again returns the
    /// event as it is now; another spec under an existing id is `EventExists`. Runs to the end
    /// even if the caller stops waiting.
    pub async fn create_event(&self, spec: EventSpec) -> Result<EventView, EngineError> {
        self.create_event_keyed(spec, "").await
    }

    /// [`Engine::create_event`] with an idempotency key for a spec without an event id: the
    /// event's id is derived from the key ([`crate::event_id_of_key`]), so a retry with the key
    /// and the same spec answers the event the first call made (whether or not its answer
    /// arrived), and the key with another spec is `IdempotencyKeyReused`. The key lasts as long
    /// as the event. With an event id, or an empty key, the key plays no part.
    pub async fn create_event_keyed(
        &self,
        spec: EventSpec,
        idempotency_key: &str,
    ) -> Result<EventView, EngineError> {
        let engine = self.clone();
        let key = idempotency_key.to_owned();
        crate::kernel::detached(async move {
            let starter = engine.clone();
            engine
                .inner
                .catalog
                .create(spec, &key, |cores| async move {
                    starter.inner.supervision.start_sections(cores).await
                })
                .await
        })
        .await
    }

    /// Changes an event's sale (see [`crate::sale`]): its state, admission rate, hold TTL or
    /// per-user limit. The change is one durable catalog record; then every section stands as
    /// the new state says (a pause reaches each section before this answers, so no hold is
    /// placed after it). Answers the event as it is after the change. Idempotent with a key
    /// (per event, for as long as the event lasts): the same request again answers the event
    /// as it is now; another request under the key is `IdempotencyKeyReused`. A request that
    /// changes nothing records nothing. Runs to the end even if the caller stops waiting.
    pub async fn update_sale(
        &self,
        event_id: &EventId,
        update: SaleUpdate,
        idempotency_key: &str,
    ) -> Result<EventView, EngineError> {
        let engine = self.clone();
        let (event_id, key) = (event_id.clone(), idempotency_key.to_owned());
        crate::kernel::detached(async move {
            engine
                .inner
                .catalog
                .update_sale(&event_id, &update, &key)
                .await
        })
        .await
    }

    /// An event with its sections' latest counts.
    pub fn event(&self, event_id: &EventId) -> Result<EventView, EngineError> {
        self.inner.catalog.event(event_id)
    }

    /// An event's settings without its sections (cheap: for the per-request paths).
    pub fn event_terms(&self, event_id: &EventId) -> Result<EventTerms, EngineError> {
        self.inner.catalog.terms(event_id)
    }

    /// Free places per section of an event, from the published snapshots (cheap: no spec).
    pub fn available_places(
        &self,
        event_id: &EventId,
    ) -> Result<Vec<(SectionId, u32)>, EngineError> {
        self.inner.catalog.available(event_id)
    }

    /// Every event, ordered by id.
    pub fn events(&self) -> Result<Vec<EventView>, EngineError> {
        self.inner.catalog.views()
    }

    /// The latest published snapshots of an event (or of one section), built per call (the
    /// gateway's shared maps are `gateway::seat_maps`). Never enters a mailbox. The latest
    /// snapshot of a section shows every change made so far, so the map is true now: `as_of_ms`
    /// is now (not the time a snapshot was published, which is old for an idle section).
    pub fn seat_map(
        &self,
        event_id: &EventId,
        section: Option<&SectionId>,
    ) -> Result<SeatMap, EngineError> {
        self.inner.catalog.seat_map(event_id, section)
    }

    /// Where a reader that builds its own view of an event's sections (the gateway's seat maps)
    /// gets them: per section in event order, its spec and its published snapshots (a `watch`
    /// receiver: `borrow()` is the latest, never entering a mailbox). An event's sections never
    /// change, so a reader may keep these for the life of the engine.
    pub fn section_feeds(&self, event_id: &EventId) -> Result<Vec<SectionFeed>, EngineError> {
        self.inner.catalog.feeds(event_id)
    }

    /// Whether the engine still serves reads: `Storage` once it stopped (its published counts
    /// could include a change that was never acknowledged).
    pub fn check_reads(&self) -> Result<(), EngineError> {
        self.kernel().check_not_stopped()
    }
}

/// Holds, confirms and their reads: the [`Booking`] and [`Checkout`] components' calls.
impl Engine {
    /// Holds places: exact seats, or best available in a section or anywhere in the event. A
    /// batch of one ([`Engine::hold_batch`]). Runs to the end even if the caller stops waiting.
    pub async fn hold(&self, req: HoldRequest) -> Result<HoldView, EngineError> {
        self.inner.booking.hold(req).await
    }

    /// Holds many places at once, each request as a hold of its own would be (its own checks,
    /// idempotency key, quota and answer, in the order given), sharing the round trips. An
    /// error of the whole call (not ready) is every request's answer.
    pub async fn hold_batch(&self, reqs: Vec<HoldRequest>) -> Vec<Result<HoldView, EngineError>> {
        self.inner.booking.hold_batch(reqs).await
    }

    /// [`Engine::hold_batch`] of requests whose caller fields are checked already, all for the
    /// event of `terms`. A request for another event is `EVENT_NOT_FOUND`.
    pub async fn hold_checked(
        &self,
        terms: &EventTerms,
        holds: Vec<CheckedHold>,
    ) -> Vec<Result<HoldView, EngineError>> {
        self.inner.booking.hold_checked(terms, holds).await
    }

    /// Places the hold a waitlist offer makes for `entry`'s fan (best available places of its
    /// section, all or nothing, carrying the entry's mark).
    pub async fn hold_offer(&self, entry: &WaitlistView) -> Result<HoldView, EngineError> {
        self.inner.booking.hold_offer(entry).await
    }

    /// The first answer already given to this request's idempotency key, if it was settled with
    /// this same request; `None` otherwise. Changes nothing.
    pub async fn replayed_hold(
        &self,
        req: &HoldRequest,
    ) -> Result<Option<Result<HoldView, EngineError>>, EngineError> {
        self.inner.booking.replayed_hold(req).await
    }

    /// Releases a hold (by its holder). Runs to the end even if the caller stops waiting.
    pub async fn release(
        &self,
        hold_id: &HoldId,
        user_id: &UserId,
    ) -> Result<HoldView, EngineError> {
        self.inner.booking.release(hold_id, user_id).await
    }

    /// A hold as it is now.
    pub async fn get_hold(&self, hold_id: &HoldId) -> Result<HoldView, EngineError> {
        self.inner.booking.get_hold(hold_id).await
    }

    /// A hold as it is now, to its holder only: another user's hold is `HOLD_NOT_FOUND`.
    pub async fn get_hold_of(
        &self,
        hold_id: &HoldId,
        user_id: &UserId,
    ) -> Result<HoldView, EngineError> {
        self.inner.booking.get_hold_of(hold_id, user_id).await
    }

    /// An order.
    pub async fn get_order(&self, order_id: &OrderId) -> Result<OrderView, EngineError> {
        self.inner.booking.get_order(order_id).await
    }

    /// An order, to its buyer only: another user's order is `ORDER_NOT_FOUND`.
    pub async fn get_order_of(
        &self,
        order_id: &OrderId,
        user_id: &UserId,
    ) -> Result<OrderView, EngineError> {
        self.inner.booking.get_order_of(order_id, user_id).await
    }

    /// Gives tickets of an order back: see the `Cancellations` component.
    pub async fn cancel_tickets(
        &self,
        req: CancelRequest,
    ) -> Result<TicketsCancelled, EngineError> {
        self.inner.cancellations.cancel_tickets(req).await
    }

    /// Moves tickets of an order to another fan: see the `Transfers` component.
    pub async fn transfer_tickets(&self, req: TransferRequest) -> Result<Transferred, EngineError> {
        self.inner.transfers.transfer_tickets(req).await
    }

    /// An event's revoked tickets: see `Cancellations::revoked_tickets`.
    pub async fn revoked_tickets(&self, event_id: &EventId) -> Result<Vec<String>, EngineError> {
        self.inner.cancellations.revoked_tickets(event_id).await
    }

    /// `user_id`'s orders, newest first, a page at a time: see `Booking::list_orders`.
    pub async fn list_orders(
        &self,
        user_id: &UserId,
        event_id: Option<&EventId>,
        before: Option<OrderCursor>,
        limit: usize,
    ) -> Result<OrdersPage, EngineError> {
        self.inner
            .booking
            .list_orders(user_id, event_id, before, limit)
            .await
    }

    /// Places the user holds or owns for the event, as the ledger counts them.
    pub async fn user_usage(
        &self,
        event_id: &EventId,
        user_id: &UserId,
    ) -> Result<u32, EngineError> {
        self.inner.booking.user_usage(event_id, user_id).await
    }

    /// Confirms a hold: charges its price, then the places are sold and an order is made,
    /// durable before the answer (the saga: [`crate::checkout`]). Runs to the end even if the
    /// caller stops waiting.
    pub async fn confirm(&self, req: ConfirmRequest) -> Result<OrderView, EngineError> {
        self.inner.checkout.confirm(req).await
    }
}

/// Deadlines, the waitlist, audits and refunds: the [`Expiry`], [`Waitlist`], [`Audit`] and
/// [`Refunds`] components' calls.
impl Engine {
    /// Expires every hold whose deadline has passed, at most `max_per_section` per section per
    /// call; returns the holds it expired.
    pub async fn expire_due(&self, max_per_section: usize) -> Result<Vec<HoldView>, EngineError> {
        self.inner.expiry.expire_due(max_per_section).await
    }

    /// Expires what is due in a section (at most `max` holds) and then, in the same step of its
    /// actor, places a hold for each of `offers` (user, quantity, waitlist entry), in order.
    /// Returns the ended holds, the section's next deadline and one outcome per offer.
    pub async fn expire_section_offering(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
        max: usize,
        offers: &[(UserId, u32, Option<String>)],
    ) -> Result<ExpiredAndOffered, EngineError> {
        let expiry = &self.inner.expiry;
        expiry
            .expire_section_offering(event_id, section_id, max, offers)
            .await
    }

    /// Every section's earliest active-hold deadline.
    pub async fn next_deadlines(
        &self,
    ) -> Result<Vec<(EventId, SectionId, Option<u64>)>, EngineError> {
        self.inner.expiry.next_deadlines().await
    }

    /// Active holds past their deadline in every section: what the sweeper has yet to expire.
    pub async fn holds_past_deadline(&self) -> Result<u64, EngineError> {
        self.inner.expiry.holds_past_deadline().await
    }

    /// The earliest deadline of any active hold, if any (for the sweeper's sleep).
    pub async fn next_deadline_ms(&self) -> Result<Option<u64>, EngineError> {
        self.inner.expiry.next_deadline_ms().await
    }

    /// Joins an event's waitlist for `quantity` places in `section` (`None`: any); joining
    /// again returns the fan's active entry. Runs to the end even if the caller stops waiting.
    pub async fn join_waitlist(
        &self,
        event_id: &EventId,
        user_id: &UserId,
        section: Option<SectionId>,
        quantity: u32,
    ) -> Result<WaitlistView, EngineError> {
        let waitlist = &self.inner.waitlist;
        waitlist
            .join_waitlist(event_id, user_id, section, quantity)
            .await
    }

    /// A waitlist entry.
    pub async fn waitlist_entry(&self, entry_id: &str) -> Result<WaitlistView, EngineError> {
        self.inner.waitlist.waitlist_entry(entry_id).await
    }

    /// The fan's active (waiting or offered) entry for the event, if any. Changes nothing.
    pub async fn active_waitlist_entry(
        &self,
        event_id: &EventId,
        user_id: &UserId,
    ) -> Result<Option<WaitlistView>, EngineError> {
        let waitlist = &self.inner.waitlist;
        waitlist.active_waitlist_entry(event_id, user_id).await
    }

    /// A waitlist entry, to its fan only: another user's entry is `ENTRY_NOT_FOUND`.
    pub async fn waitlist_entry_of(
        &self,
        entry_id: &str,
        user_id: &UserId,
    ) -> Result<WaitlistView, EngineError> {
        self.inner
            .waitlist
            .waitlist_entry_of(entry_id, user_id)
            .await
    }

    /// The first `n` waiting entries of an event that would take places of `section`.
    pub async fn waitlist_candidates(
        &self,
        event_id: &EventId,
        section: Option<&SectionId>,
        n: usize,
    ) -> Result<Vec<WaitlistView>, EngineError> {
        let waitlist = &self.inner.waitlist;
        waitlist.waitlist_candidates(event_id, section, n).await
    }

    /// The hold an offer to `entry` placed before, if the offer itself was never recorded.
    pub async fn waitlist_offer_made(
        &self,
        entry: &WaitlistView,
    ) -> Result<Option<HoldView>, EngineError> {
        self.inner.waitlist.waitlist_offer_made(entry).await
    }

    /// Records that `hold_id` was offered to a waiting entry (idempotent for the same hold).
    pub async fn waitlist_offer(
        &self,
        entry_id: &str,
        hold_id: &HoldId,
    ) -> Result<WaitlistView, EngineError> {
        self.inner.waitlist.waitlist_offer(entry_id, hold_id).await
    }

    /// Ends an entry (`Expired` or `Fulfilled`); an entry that ended already stays as it is.
    pub async fn waitlist_end(
        &self,
        entry_id: &str,
        state: WaitlistState,
    ) -> Result<WaitlistView, EngineError> {
        self.inner.waitlist.waitlist_end(entry_id, state).await
    }

    /// Every entry with an outstanding offer.
    pub async fn waitlist_offered(&self) -> Result<Vec<WaitlistView>, EngineError> {
        self.inner.waitlist.waitlist_offered().await
    }

    /// Events with fans waiting.
    pub async fn waitlist_events(&self) -> Result<Vec<EventId>, EngineError> {
        self.inner.waitlist.waitlist_events().await
    }

    /// Fans waiting on an event's waitlist.
    pub async fn waitlist_len(&self, event_id: &EventId) -> Result<usize, EngineError> {
        self.inner.waitlist.waitlist_len(event_id).await
    }

    /// Checks sold seats against orders, payments and the sold-seat backstop, and every
    /// section's counters; returns what does not add up. Changes nothing.
    pub async fn reconcile(&self) -> Result<Vec<Finding>, EngineError> {
        self.inner.audit.reconcile().await
    }

    /// Every section whose state breaks an invariant, one line each. Empty when all is well.
    pub async fn invariant_violations(&self) -> Result<Vec<String>, EngineError> {
        self.inner.audit.invariant_violations().await
    }

    /// Presale codes whose live count differs from their holds (see `Audit`): at rest only.
    pub async fn access_code_miscounts(&self) -> Result<Vec<String>, EngineError> {
        self.inner.audit.access_code_miscounts().await
    }

    /// Every order of every section (for reconciliation and tools).
    pub async fn orders(&self) -> Result<Vec<OrderView>, EngineError> {
        self.inner.audit.orders().await
    }

    /// The server's periodic pass: reconciles, refunds the orphaned charges whose grace has
    /// passed ([`crate::refunds`]), and returns the findings left, with what was refunded.
    pub async fn settle_and_reconcile(
        &self,
        grace: Duration,
    ) -> Result<(Vec<Finding>, Settlement), EngineError> {
        self.inner.refunds.settle_and_reconcile(grace).await
    }
}

/// Hooks for tests and benches that reach inside the engine (not part of the contract): a
/// section's core, the raw store, a simulated crash, injected panics (feature `test-support`).
#[cfg(feature = "test-support")]
impl Engine {
    /// A copy of a section's core (for invariant checks in tests).
    pub async fn inspect_section(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
    ) -> Result<SectionCore, EngineError> {
        self.inner.audit.section_core(event_id, section_id).await
    }

    /// The live sled database, for tests that inspect or damage the store on purpose.
    ///
    /// # Panics
    /// If the engine's log is not in sled (a [`MemorySink`](crate::MemorySink)).
    pub fn raw_db(&self) -> sled::Db {
        let kv = self.kernel().store().sink.kv();
        kv.and_then(|kv| kv.as_sled())
            .expect("the engine's log is in sled")
    }

    /// Stops as a crash would (for recovery tests): the log takes nothing more, queued writes
    /// are lost, nothing is flushed. Acknowledged work (with `Durability::Sync`) is durable.
    pub async fn crash(&self) {
        self.kernel().set_serving(false);
        self.kernel().store().halt_now("simulated crash");
        self.stop_actors().await;
        self.kernel().store().close().await;
    }

    /// Makes a section's actor panic in its handler (as a failed invariant check would); the
    /// supervisor restarts it from its log.
    pub async fn panic_section(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
    ) -> Result<(), EngineError> {
        let e = self.inner.catalog.entry(event_id)?;
        let handle = self
            .kernel()
            .router()
            .get(&e.event_id, section_id)
            .ok_or(crate::error::Rejection::SectionNotFound)?;
        // Counted as queued, as `ask` does: the actor counts every message it takes.
        handle
            .depth
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        handle
            .actor
            .cast(SectionMsg::Panic)
            .map_err(|_| EngineError::NotReady)
    }

    /// Makes the waitlist actor panic in its handler.
    pub fn panic_waitlist(&self) -> Result<(), EngineError> {
        let actor = self.inner.waitlist.actor();
        actor
            .cast(crate::waitlist::WaitlistMsg::Panic)
            .map_err(|_| EngineError::NotReady)
    }

    /// Makes the ledger shard of `user` panic in its handler (the engine then stops: a ledger's
    /// quotas cannot be rebuilt while sections hold places).
    pub fn panic_ledger(&self, user: &UserId) -> Result<(), EngineError> {
        self.kernel().ledger().panic_shard_of(user)
    }
}

/// Stopping visibly: what the servers beside the engine ask of it.
impl Engine {
    /// Stops the engine visibly: every change is refused from now on, and why is told to whoever
    /// watches ([`Engine::stopped`], health, logs, the `boxoffice_store_halted` gauge). For
    /// the engine's own actors and for what serves beside it (a sweeper that died, say).
    pub fn stop_visibly(&self, reason: impl Into<String>) {
        self.kernel().store().halt_now(&reason.into());
    }

    /// Watches a task that must run as long as the engine serves (`what` names it): if it ends
    /// while the engine serves, the engine stops visibly. Returns the watch; abort it before
    /// stopping the task on purpose. Holds no strong reference to the engine.
    pub fn stop_when_ended(
        &self,
        what: &'static str,
        done: tokio::task::JoinHandle<()>,
    ) -> tokio::task::JoinHandle<()> {
        let engine = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let how = match done.await {
                Ok(()) => "ended".to_owned(),
                Err(e) => format!("failed: {e}"),
            };
            if let Some(inner) = engine.upgrade()
                && inner.kernel.serving()
            {
                Engine { inner }.stop_visibly(format!("{what} {how}"));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rooms::RoomRecord;
    use crate::store::MemorySink;

    /// Every component that writes borrows the store from the engine: once the engine has
    /// stopped, nothing else holds it (else `stop_actors` waits its whole 5 s for them, on every
    /// shutdown: a room component that kept its own handle once did).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_engine_leaves_its_store_to_nobody() {
        let engine = Engine::open(EngineConfig::with_sink(MemorySink::new()).unwrap())
            .await
            .unwrap();
        let event = engine
            .create_event(crate::types::ga_event_spec("e", "e", 2, 1))
            .await
            .unwrap();
        let line = engine
            .record_room(&event.event_id, vec![RoomRecord::Reserved { upto: 64 }])
            .await
            .unwrap();
        assert_eq!(line.reserved, 64);
        assert_eq!(engine.room_line(&event.event_id).await.unwrap(), line);
        engine.shutdown().await;
        assert_eq!(
            Arc::strong_count(engine.kernel().store()),
            1,
            "another holder of the store"
        );
    }
}
