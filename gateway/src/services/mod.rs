//! The four gRPC services of `boxoffice.v1` over one shared [`Api`]: the state every call
//! shares (engine, waiting rooms, tokens, seat maps, join challenges) and what is decided
//! before the engine is called. The tonic services themselves are in [`grpc`].

pub mod changes;
mod cluster;
pub mod grpc;

use boxoffice_engine::hash::DashMap;
use boxoffice_engine::raft::ReadFence;
use std::sync::Arc;

use boxoffice_engine::{
    Caller, CheckedHold, Clock, Engine, EventId, EventTerms, EventView, HoldView, SaleState,
    UserId, check_user_id,
};
use boxoffice_proto::v1 as pb;
use tonic::Request;

use crate::convert;
use crate::pow::{JoinChallenges, spawn_pruner};
use crate::seat_maps::SeatMaps;
use crate::status::ApiError;
use crate::tokens::{Claims, TokenError, TokenKind, TokenSigner, seed_commitment};
use crate::waiting_room::{RoomConfig, Standing, WaitingRoom, spawn_admitter};

pub use crate::limits::LIST_PAGE_DEFAULT;
pub use crate::limits::LIST_PAGE_MAX;
pub use crate::limits::QUEUE_TOKEN_TTL_MS;

/// The services' shared state, set once recovery has finished (the server sets it; until then
/// every call answers `UNAVAILABLE` / `NOT_READY`). A cluster node sets it while it leads its
/// group and takes it back when it stops leading (its calls are then forwarded to the leader:
/// see [`crate::node::forward`]).
#[derive(Clone, Default)]
pub struct Ready(Arc<std::sync::RwLock<Option<Arc<Api>>>>);

impl Ready {
    /// The state, if set.
    pub fn get(&self) -> Option<Arc<Api>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Sets the state (the services answer from now on).
    pub fn set(&self, api: Arc<Api>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(api);
    }

    /// Takes the state back (the services answer `NOT_READY` from now on).
    pub fn take(&self) -> Option<Arc<Api>> {
        self.0.write().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The state of each Raft group this server serves (index: the group; one on a single node
/// and in a one-group cluster). A call is served by the group named in its [`GroupOf`]
/// extension (set by the cluster's routing layer, [`crate::node::forward`]), group 0 without one.
#[derive(Clone)]
pub struct Groups(Arc<[Ready]>, changes::Feeds);

/// The Raft group a call belongs to (a request extension; see [`Groups`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupOf(pub usize);

impl Groups {
    /// One group's state: a single node's, or a one-group cluster's.
    pub fn one(ready: Ready) -> Groups {
        Groups(Arc::from(vec![ready]), changes::Feeds::default())
    }

    /// Each group's state, by index.
    pub fn new(readies: Vec<Ready>) -> Groups {
        Groups(Arc::from(readies), changes::Feeds::default())
    }

    /// Where each group's change stream is read (set once the server knows).
    pub fn feeds(&self) -> &changes::Feeds {
        &self.1
    }

    /// The state of group `g`, if this server has it.
    pub fn get(&self, g: usize) -> Option<&Ready> {
        self.0.get(g)
    }

    /// How many groups.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none (never: a server has at least one group).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The state serving `req`: its group's (group 0 without a [`GroupOf`]; a group this
    /// server does not have answers as one not ready).
    pub fn of<T>(&self, req: &Request<T>) -> &Ready {
        static NONE: std::sync::LazyLock<Ready> = std::sync::LazyLock::new(Ready::default);
        let g = req.extensions().get::<GroupOf>().map_or(0, |g| g.0);
        self.0.get(g).unwrap_or(&NONE)
    }
}

/// Everything the services share.
pub struct Api {
    /// The engine.
    pub engine: Engine,
    /// Token signer (and shuffle seeds).
    pub signer: TokenSigner,
    /// Wall clock (the engine's).
    pub clock: Arc<dyn Clock>,
    /// Most fans per waiting room.
    pub queue_max: u32,
    /// Signs e-ticket codes (each order with the key of its time).
    pub tickets: Arc<crate::signing::Signing>,
    /// Seat maps, built once per change and shared.
    pub seat_maps: SeatMaps,
    /// Join challenges (the proof of work before `Join`) and the set of used ones.
    pub challenges: Arc<JoinChallenges>,
    /// A cluster leader's: where its reads and refusals wait until this node is known to have
    /// led after they were made ([`crate::node::reads`]). None on a single node (set by the
    /// node's leadership loop before the state is shared).
    pub fence: Option<Arc<ReadFence>>,
    rooms: DashMap<EventId, Arc<WaitingRoom>>,
    admitters: DashMap<EventId, tokio::task::JoinHandle<()>>,
    pruner: tokio::task::JoinHandle<()>,
}

impl Api {
    /// The shared state of the services; join challenges are valid for `join_challenge_ttl_ms`.
    /// Starts the task that forgets expired used challenges (so it needs a tokio runtime).
    pub fn new(
        engine: Engine,
        signer: TokenSigner,
        tickets: Arc<crate::signing::Signing>,
        clock: Arc<dyn Clock>,
        queue_max: u32,
        seat_maps: SeatMaps,
        join_challenge_ttl_ms: u64,
    ) -> Api {
        let challenges = Arc::new(JoinChallenges::new(join_challenge_ttl_ms));
        let pruner = spawn_pruner(Arc::downgrade(&challenges), clock.clone());
        Api {
            engine,
            signer,
            tickets,
            clock,
            queue_max,
            seat_maps,
            challenges,
            fence: None,
            rooms: DashMap::default(),
            admitters: DashMap::default(),
            pruner,
        }
    }

    /// The waiting room of an event, resumed from its record (with its admission timer) on
    /// first use.
    pub async fn room(&self, event: &EventTerms) -> Result<Arc<WaitingRoom>, ApiError> {
        if let Some(r) = self.rooms.get(&event.event_id) {
            return Ok(r.clone());
        }
        let line = self
            .engine
            .room_line(&event.event_id)
            .await
            .map_err(ApiError::from)?;
        let entry = self.rooms.entry(event.event_id.clone()).or_insert_with(|| {
            let room = Arc::new(WaitingRoom::resume(
                RoomConfig {
                    opens_at_ms: event.sale_opens_at_ms,
                    admit_rate_per_second: event.admit_rate_per_second,
                    admission_window_ms: event.admission_window_ms,
                    queue_max: self.queue_max,
                    seed: self.signer.shuffle_seed(event.event_id.as_str()),
                },
                self.signer.room_epoch(event.event_id.as_str()),
                &line,
            ));
            self.admitters.insert(
                event.event_id.clone(),
                spawn_admitter(
                    &event.event_id,
                    room.clone(),
                    self.clock.clone(),
                    self.engine.clone(),
                ),
            );
            room
        });
        Ok(entry.clone())
    }

    /// The waiting room of an event, if anyone joined it.
    pub fn existing_room(&self, event_id: &EventId) -> Option<Arc<WaitingRoom>> {
        self.rooms.get(event_id).map(|r| r.clone())
    }

    /// Stops every admission timer, and the pruning of used join challenges.
    pub fn stop(&self) {
        for a in self.admitters.iter() {
            a.value().abort();
        }
        self.pruner.abort();
    }

    /// The event as `Event` shows it; each access code's uses only to an admin key (`admin`).
    fn event_proto(&self, e: EventView, admin: bool) -> pb::Event {
        let now = self.clock.now_ms();
        let opened = now >= e.spec.sale_opens_at_ms;
        let seed = self.signer.shuffle_seed(e.event_id.as_str());
        // The seed is revealed only once the line was actually drawn (a line nobody joined has
        // nothing to draw): revealing it at the opening instant, before the draw, would let a
        // bot time its joins against it.
        let room = self.existing_room(&e.event_id);
        let drawn = room.as_ref().and_then(|r| r.drawn());
        let reveal = match &room {
            Some(r) => r.is_open(),
            None => opened,
        };
        let mut out = pb::Event {
            event_id: e.event_id.0.clone(),
            name: e.spec.name.clone(),
            sections: e
                .sections
                .iter()
                .map(|s| pb::SectionSummary {
                    section_id: s.spec.section_id.0.clone(),
                    name: s.spec.name.clone(),
                    kind: convert::section_kind(s.spec.kind()),
                    capacity: s.capacity,
                    available: s.available,
                    held: s.held,
                    sold: s.sold,
                    price_cents: s.spec.price_cents,
                    access_code_required: false,
                    price_tiers: convert::price_tiers(&s.price_tiers),
                    next_price_cents: s.next_price_cents,
                })
                .collect(),
            hold_ttl_seconds: u32::try_from(e.sale.hold_ttl_ms / 1000).unwrap_or(u32::MAX),
            per_user_limit: e.sale.per_user_limit,
            admit_rate_per_second: e.sale.admit_rate_per_second,
            admission_window_seconds: u32::try_from(e.spec.admission_window_ms / 1000)
                .unwrap_or(u32::MAX),
            sale_opens_at_unix_ms: i64::try_from(e.spec.sale_opens_at_ms).unwrap_or(i64::MAX),
            state: if e.sale.state == SaleState::Ended {
                pb::EventState::Closed
            } else if opened {
                pb::EventState::OnSale
            } else {
                pb::EventState::Scheduled
            } as i32,
            shuffle_seed_hash: seed_commitment(&seed),
            shuffle_seed: if reveal {
                hex::encode(seed)
            } else {
                String::new()
            },
            shuffled_fans: u64::from(drawn.unwrap_or(0)),
            join_pow_difficulty_bits: e.spec.join_pow_difficulty_bits,
            sale_state: convert::sale_state(e.sale.state) as i32,
            sale_state_changed_at_unix_ms: convert::ms(e.sale.state_changed_at_ms),
            admit_rate_changed_at_unix_ms: convert::ms(e.sale.rate_changed_at_ms),
            terms_changed_at_unix_ms: convert::ms(e.sale.terms_changed_at_ms),
            hold_cooldown_seconds: u32::try_from(e.sale.hold_cooldown_ms / 1000)
                .unwrap_or(u32::MAX),
            cancellation_deadline_unix_ms: convert::ms(e.spec.cancellation_deadline_ms),
            transfers_disabled: e.spec.transfers_disabled,
            ..pb::Event::default()
        };
        crate::presale::fill(&mut out, &e, admin, now);
        out
    }

    /// Checks the admission token of a hold or a waitlist join: bound to the event and user,
    /// admitted, in window.
    /// A queue token is accepted too once its position is admitted.
    ///
    /// For the waitlist (`waitlist`), a queue token still in line is accepted too while the
    /// event is sold out: that fan is told `QUEUE_STATE_SOLD_OUT` and offered the waitlist.
    async fn check_admission(
        &self,
        token: &str,
        event: &EventTerms,
        user: &str,
        waitlist: bool,
    ) -> Result<(), ApiError> {
        convert::required_token("admission_token", token)?;
        let now = self.clock.now_ms();
        let event_id = event.event_id.as_str();
        match self
            .signer
            .verify(token, TokenKind::Admission, Some(event_id), Some(user), now)
        {
            Ok(_) => return Ok(()),
            Err(TokenError::Expired) => return Err(ApiError::TokenExpired),
            Err(TokenError::Invalid) => {}
        }
        // Maybe a queue token: then it depends on the fan's standing.
        match self
            .signer
            .verify(token, TokenKind::Queue, Some(event_id), Some(user), now)
        {
            Ok(q) if q.epoch != self.signer.room_epoch(event_id) => Err(ApiError::TokenExpired),
            Ok(q) => match self.room(event).await?.standing(join_number(&q)?, now) {
                Standing::Admitted { .. } => Ok(()),
                Standing::Expired { .. } => Err(ApiError::TokenExpired),
                Standing::Waiting { .. } if waitlist && event.sold_out() => Ok(()),
                Standing::BeforeOpening { .. } | Standing::Waiting { .. } => {
                    Err(ApiError::NotAdmitted)
                }
            },
            Err(TokenError::Expired) => Err(ApiError::TokenExpired),
            Err(TokenError::Invalid) => Err(ApiError::TokenInvalid("admission_token")),
        }
    }
}

impl Api {
    /// The one hold path of the services, for `Hold` (one item) and `HoldBatch`: each item's
    /// admission token checked in item order (an expired one answered by its key's first answer
    /// if it has one), then every admitted item placed in one engine batch. Answers in item
    /// order.
    pub(crate) async fn hold_admitted(
        &self,
        event: &EventTerms,
        items: Vec<Result<(CheckedHold, String), ApiError>>,
    ) -> Vec<Result<HoldView, ApiError>> {
        let n = items.len();
        // The items answered here (a replay, a refusal), by position; the rest go to the engine.
        let mut early: Vec<(usize, Result<HoldView, ApiError>)> = Vec::new();
        let mut holds = Vec::with_capacity(n);
        for (i, item) in items.into_iter().enumerate() {
            let admitted = match item {
                Ok((hold, token)) => self.admitted(hold, &token, event).await,
                Err(e) => Err(e),
            };
            match admitted {
                Ok(Admitted::Hold(hold)) => holds.push(hold),
                Ok(Admitted::Replayed(first)) => early.push((i, Ok(first))),
                Err(e) => early.push((i, Err(e))),
            }
        }
        let placed = if holds.is_empty() {
            Vec::new()
        } else {
            self.engine.hold_checked(event, holds).await
        };
        let mut placed = placed.into_iter().map(|a| a.map_err(ApiError::from));
        let mut early = early.into_iter().peekable();
        (0..n)
            .map(|i| match early.next_if(|(at, _)| *at == i) {
                Some((_, answer)) => answer,
                None => placed.next().unwrap_or(Err(ApiError::NotReady)),
            })
            .collect()
    }

    /// The admission check of a hold. A replay returns the first answer even once the
    /// admission window has closed.
    async fn admitted(
        &self,
        hold: CheckedHold,
        token: &str,
        event: &EventTerms,
    ) -> Result<Admitted, ApiError> {
        match self
            .check_admission(token, event, hold.request().user_id.as_str(), false)
            .await
        {
            Ok(()) => Ok(Admitted::Hold(hold)),
            Err(ApiError::TokenExpired) => match self.engine.replayed_hold(hold.request()).await? {
                Some(first) => Ok(Admitted::Replayed(first?)),
                None => Err(ApiError::TokenExpired),
            },
            Err(e) => Err(e),
        }
    }
}

/// A hold request past its admission check: to place, or answered by its key's first answer.
enum Admitted {
    Hold(CheckedHold),
    Replayed(HoldView),
}

/// One item of a `HoldBatch`, checked as a `Hold` of the batch's event is, up to its admission
/// token: the hold and its token.
pub(crate) fn batch_item(
    event_id: &EventId,
    item: pb::HoldBatchItem,
) -> Result<(CheckedHold, String), ApiError> {
    let caller = Caller::check(UserId(item.user_id), item.idempotency_key)?;
    let selection = convert::selection(item.selection.map(convert::batch_selection))?;
    let hold = caller
        .hold(event_id.clone(), selection)
        .with_access_code(item.access_code)?;
    Ok((hold, item.admission_token))
}

fn join_number(q: &Claims) -> Result<u32, ApiError> {
    u32::try_from(q.number).map_err(|_| ApiError::TokenInvalid("queue_token"))
}

pub(crate) fn user_id(v: &str) -> Result<(), ApiError> {
    check_user_id(&UserId(v.to_owned())).map_err(ApiError::from)
}
