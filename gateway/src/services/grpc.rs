//! The four gRPC services of `boxoffice.v1` as tonic serves them: each call checked and
//! turned into a call of the shared [`Api`](super::Api), its answer or refusal into the
//! contract's message or status. `GetSeatMap` is answered pre-encoded ([`EventRoutes`]).

use std::sync::Arc;

use boxoffice_engine::{
    Caller, ConfirmRequest, EventId, EventView, HoldId, OrderCursor, OrderId, Rejection, SectionId,
    UserId, check_idempotency_key,
};
use boxoffice_proto::v1 as pb;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use crate::convert;
use crate::seat_maps::{SeatMapAsk, SeatMapReply};
use crate::status::ApiError;
use crate::tokens::{Claims, TokenError, TokenKind};
use crate::waiting_room::{JoinError, Standing, WaitingRoom};
use boxoffice_engine::rooms::RoomRecord;

use crate::limits::HOLD_BATCH_ITEMS_MAX;
pub use crate::limits::LIST_PAGE_DEFAULT;
pub use crate::limits::LIST_PAGE_MAX;
pub use crate::limits::QUEUE_TOKEN_TTL_MS;

use super::{Api, Groups, Ready, batch_item, join_number, user_id};

type Rpc<T> = Result<Response<T>, Status>;

fn ok<T>(v: T) -> Rpc<T> {
    Ok(Response::new(v))
}

/// `EventService`.
pub struct EventSvc(pub Groups);

/// `WaitingRoomService`.
pub struct WaitingRoomSvc(pub Groups);

/// `BookingService`.
pub struct BookingSvc(pub Groups);

/// `WaitlistService`.
pub struct WaitlistSvc(pub Groups);

/// The shared state, or `NOT_READY` while recovery runs.
fn ready(r: &Ready) -> Result<Arc<Api>, ApiError> {
    r.get().ok_or(ApiError::NotReady)
}

fn required(field: &str, v: &str) -> Result<(), ApiError> {
    convert::required(field, v).map_err(ApiError::from)
}

fn event_id(field: &str, v: String) -> Result<EventId, ApiError> {
    required(field, &v)?;
    Ok(EventId(v))
}

#[tonic::async_trait]
impl pb::event_service_server::EventService for EventSvc {
    async fn create_event(&self, req: Request<pb::CreateEventRequest>) -> Rpc<pb::Event> {
        let api = ready(self.0.of(&req))?;
        let mut req = req.into_inner();
        let key = std::mem::take(&mut req.idempotency_key);
        // The key first, as docs/api.md 4.1 lists the errors.
        boxoffice_engine::types::check_idempotency_key(&key).map_err(ApiError::from)?;
        let spec = convert::event_spec(req).map_err(ApiError::from)?;
        let e = api
            .engine
            .create_event_keyed(spec, &key)
            .await
            .map_err(ApiError::from)?;
        crate::metrics::register_event(e.event_id.as_str());
        ok(api.event_proto(e, true))
    }

    async fn update_sale(&self, req: Request<pb::UpdateSaleRequest>) -> Rpc<pb::Event> {
        let api = ready(self.0.of(&req))?;
        let (id, update, key) = convert::sale_update(req.into_inner()).map_err(ApiError::from)?;
        let e = api
            .engine
            .update_sale(&id, update, &key)
            .await
            .map_err(ApiError::from)?;
        ok(api.event_proto(e, true))
    }

    async fn get_revocation_list(
        &self,
        req: Request<pb::GetRevocationListRequest>,
    ) -> Rpc<pb::RevocationList> {
        let api = ready(self.0.of(&req))?;
        let id = event_id("event_id", req.into_inner().event_id)?;
        // The time is read before the sections are asked: the list holds at least every
        // revocation acknowledged before it.
        let as_of_ms = api.clock.now_ms();
        let ticket_ids = api
            .engine
            .revoked_tickets(&id)
            .await
            .map_err(ApiError::from)?;
        let key = api.tickets.key_for(as_of_ms).map_err(ApiError::from)?;
        let list = crate::tickets::Revocations {
            event_id: id.0,
            as_of_ms,
            ticket_ids,
        };
        let signed = key.sign_revocations(&list);
        ok(pb::RevocationList {
            event_id: list.event_id,
            as_of_unix_ms: convert::ms(as_of_ms),
            ticket_ids: list.ticket_ids,
            kid: key.kid().to_string(),
            signed,
        })
    }

    async fn get_event(&self, req: Request<pb::GetEventRequest>) -> Rpc<pb::Event> {
        let api = ready(self.0.of(&req))?;
        let admin = crate::gate::is_admin(&req);
        let id = event_id("event_id", req.into_inner().event_id)?;
        let e = api.engine.event(&id).map_err(ApiError::from)?;
        ok(api.event_proto(e, admin))
    }

    async fn list_events(
        &self,
        req: Request<pb::ListEventsRequest>,
    ) -> Rpc<pb::ListEventsResponse> {
        let api = ready(self.0.of(&req))?;
        let admin = crate::gate::is_admin(&req);
        let req = req.into_inner();
        let size = crate::lists::events_page_size(&req);
        // The page token is the last event id of the previous page.
        let all = api.engine.events().map_err(ApiError::from)?;
        let start = if req.page_token.is_empty() {
            0
        } else {
            if req.page_token.len() > 256 {
                return Err(ApiError::from(Rejection::invalid("page_token", "malformed")).into());
            }
            all.partition_point(|e| e.event_id.as_str() <= req.page_token.as_str())
        };
        let page: Vec<EventView> = all.into_iter().skip(start).take(size + 1).collect();
        let more = page.len() > size;
        let events: Vec<pb::Event> = page
            .into_iter()
            .take(size)
            .map(|e| api.event_proto(e, admin))
            .collect();
        let next_page_token = crate::lists::next_events_token(&events, more);
        ok(pb::ListEventsResponse {
            events,
            next_page_token,
        })
    }

    /// Served by [`EventRoutes`] from the shared pre-encoded maps; this decodes the same answer
    /// into a message for a server that mounts the generated service alone.
    async fn get_seat_map(&self, req: Request<pb::GetSeatMapRequest>) -> Rpc<pb::SeatMap> {
        use prost::Message as _;
        let group = self.0.of(&req).clone();
        let reply = seat_map_reply(&group, req.into_inner()).await?;
        let map = pb::SeatMap::decode(reply.encode_to_vec().as_slice())
            .map_err(|e| Status::internal(format!("a seat map that does not decode: {e}")))?;
        ok(map)
    }
}

/// `GetSeatMap`: the shared maps of the sections asked for, within the response limit.
async fn seat_map_reply(r: &Ready, req: pb::GetSeatMapRequest) -> Result<SeatMapReply, Status> {
    let api = ready(r)?;
    let ask = SeatMapAsk {
        event_id: event_id("event_id", req.event_id)?,
        section: (!req.section_id.is_empty()).then_some(SectionId(req.section_id)),
        first_row: req.first_row,
    };
    Ok(api
        .seat_maps
        .read(&api.engine, api.clock.as_ref(), ask)
        .await?)
}

/// `GetSeatMap` as the server answers it: the pre-encoded maps, written out as a `SeatMap`.
#[derive(Clone)]
struct SeatMapMethod(Groups);

impl tonic::server::UnaryService<pb::GetSeatMapRequest> for SeatMapMethod {
    type Response = SeatMapReply;
    type Future = BoxFuture<Response<SeatMapReply>, Status>;

    fn call(&mut self, req: Request<pb::GetSeatMapRequest>) -> Self::Future {
        let ready = self.0.of(&req).clone();
        Box::pin(async move {
            Ok(Response::new(
                seat_map_reply(&ready, req.into_inner()).await?,
            ))
        })
    }
}

type BoxFuture<T, E> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, E>> + Send>>;

/// `EventService` as mounted (gzip accepted and offered, as on every service): the generated
/// service, except `GetSeatMap`, which answers with [`SeatMapReply`] (the same bytes on the
/// wire as `SeatMap`, written from shared pre-encoded sections, not a message per reader).
#[derive(Clone)]
pub struct EventRoutes {
    inner: pb::event_service_server::EventServiceServer<EventSvc>,
    ready: Groups,
    decode_max: usize,
    encode_max: usize,
}

impl EventRoutes {
    /// The service over `ready`, decoding requests up to `decode_max` bytes and encoding seat
    /// maps up to `encode_max`.
    pub fn new(ready: Groups, decode_max: usize, encode_max: usize) -> EventRoutes {
        EventRoutes {
            inner: pb::event_service_server::EventServiceServer::new(EventSvc(ready.clone()))
                .max_decoding_message_size(decode_max)
                .accept_compressed(CompressionEncoding::Gzip)
                .send_compressed(CompressionEncoding::Gzip),
            ready,
            decode_max,
            encode_max,
        }
    }
}

impl tonic::server::NamedService for EventRoutes {
    const NAME: &'static str = "boxoffice.v1.EventService";
}

/// The path of `GetSeatMap`.
const GET_SEAT_MAP: &str = "/boxoffice.v1.EventService/GetSeatMap";

impl<B> tower::Service<http::Request<B>> for EventRoutes
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != GET_SEAT_MAP {
            return tower::Service::call(&mut self.inner, req);
        }
        let method = SeatMapMethod(self.ready.clone());
        let (decode_max, encode_max) = (self.decode_max, self.encode_max);
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<SeatMapReply, pb::GetSeatMapRequest>::default();
            let mut gzip = tonic::codec::EnabledCompressionEncodings::default();
            gzip.enable(CompressionEncoding::Gzip);
            let mut grpc = tonic::server::Grpc::new(codec)
                .apply_compression_config(gzip, gzip)
                .apply_max_message_size_config(Some(decode_max), Some(encode_max));
            Ok(grpc.unary(method, req).await)
        })
    }
}

#[tonic::async_trait]
impl pb::waiting_room_service_server::WaitingRoomService for WaitingRoomSvc {
    async fn join(&self, req: Request<pb::JoinRequest>) -> Rpc<pb::QueueTicket> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        let id = check_join(&req)?;
        let event = api.engine.event_terms(&id).map_err(ApiError::from)?;
        if let Some(refused) = event.sale_state.refusal() {
            return Err(ApiError::from(refused).into());
        }
        let room = api.room(&event).await?;
        let now = api.clock.now_ms();
        // A fan joining after the opening instant is never part of the opening draw.
        crate::waiting_room::open_durably(&room, &id, &api.engine, now)
            .await
            .map_err(ApiError::from)?;
        let bits = event.join_pow_difficulty_bits;
        // The proof of work buys a new place; a place this session already has is returned
        // without one (a retry of a Join whose answer was lost, a refresh).
        let used = if bits > 0 && room.find(&req.user_id, &req.session_id).is_none() {
            Some(
                api.challenges
                    .check(
                        &api.signer,
                        &req.join_challenge,
                        req.pow_nonce,
                        id.as_str(),
                        &req.user_id,
                        bits,
                        now,
                    )
                    .map_err(ApiError::Pow)?,
            )
        } else {
            None
        };
        let join = match take_place(&api, &room, &id, &req).await {
            Ok(n) => n,
            Err(e) => {
                // No place was taken: the challenge may be used again.
                if let Some(used) = used {
                    api.challenges.give_back(used);
                }
                return Err(e.into());
            }
        };
        let token = api.signer.sign(&Claims {
            kind: TokenKind::Queue,
            event_id: id.0.clone(),
            user_id: req.user_id,
            number: u64::from(join),
            at_ms: now,
            epoch: room.epoch(),
            expires_at_ms: now + QUEUE_TOKEN_TTL_MS,
        });
        let (position, eta_seconds) = place_shown(&room, join, now);
        let state = match room.standing(join, now) {
            Standing::Admitted { .. } => pb::QueueState::Admitted,
            Standing::Expired { .. } => pb::QueueState::Expired,
            Standing::Waiting { .. } if event.sold_out() => pb::QueueState::SoldOut,
            Standing::Waiting { .. } | Standing::BeforeOpening { .. } => pb::QueueState::Waiting,
        };
        ok(pb::QueueTicket {
            queue_token: token,
            position,
            eta_seconds,
            state: state as i32,
        })
    }

    async fn get_join_challenge(
        &self,
        req: Request<pb::GetJoinChallengeRequest>,
    ) -> Rpc<pb::JoinChallenge> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        let id = event_id("event_id", req.event_id)?;
        user_id(&req.user_id)?;
        let event = api.engine.event_terms(&id).map_err(ApiError::from)?;
        let bits = event.join_pow_difficulty_bits;
        if bits == 0 {
            return ok(pb::JoinChallenge::default());
        }
        let issued =
            api.challenges
                .issue(&api.signer, id.as_str(), &req.user_id, api.clock.now_ms());
        ok(pb::JoinChallenge {
            challenge: issued.challenge,
            difficulty_bits: bits,
            expires_at_unix_ms: i64::try_from(issued.expires_at_ms).unwrap_or(i64::MAX),
        })
    }

    async fn get_status(&self, req: Request<pb::GetStatusRequest>) -> Rpc<pb::QueueStatus> {
        let api = ready(self.0.of(&req))?;
        let token = req.into_inner().queue_token;
        convert::required_token("queue_token", &token).map_err(ApiError::from)?;
        let now = api.clock.now_ms();
        let q = api
            .signer
            .verify(&token, TokenKind::Queue, None, None, now)
            .map_err(|e| match e {
                TokenError::Invalid => ApiError::TokenInvalid("queue_token"),
                TokenError::Expired => ApiError::TokenExpired,
            })?;
        let event_id = EventId(q.event_id.clone());
        let terms = match api.engine.event_terms(&event_id) {
            Ok(t) if q.epoch == api.signer.room_epoch(event_id.as_str()) => t,
            // The line this token belongs to is not this event's (an event made again under
            // the same id): join again.
            Ok(_) | Err(boxoffice_engine::EngineError::Rejected(Rejection::EventNotFound)) => {
                return ok(pb::QueueStatus {
                    state: pb::QueueState::Expired as i32,
                    ..Default::default()
                });
            }
            Err(e) => return Err(ApiError::from(e).into()),
        };
        // Resumed from its record if this server has not served it yet (a restart, another
        // node after a failover): the token keeps its place.
        let room = api.room(&terms).await?;
        let standing = room.standing(join_number(&q)?, now);
        let mut status = status_of(&api, standing, q);
        // A fan still in line is told when every place is taken: waiting would not end in a
        // hold (it waits again once a place comes back).
        if status.state == pb::QueueState::Waiting as i32 && status.position > 0 && terms.sold_out()
        {
            status.state = pb::QueueState::SoldOut as i32;
            status.eta_seconds = 0;
        }
        status.sale_state = convert::sale_state(terms.sale_state) as i32;
        ok(status)
    }
}

#[tonic::async_trait]
impl pb::booking_service_server::BookingService for BookingSvc {
    async fn hold(&self, req: Request<pb::HoldRequest>) -> Rpc<pb::Hold> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        let id = event_id("event_id", req.event_id)?;
        let caller =
            Caller::check(UserId(req.user_id), req.idempotency_key).map_err(ApiError::from)?;
        let selection = convert::selection(req.selection).map_err(ApiError::from)?;
        let hold = caller.hold(id, selection).with_access_code(req.access_code);
        let hold = hold.map_err(ApiError::from)?;
        let event = api.engine.event_terms(&hold.request().event_id);
        let item = Ok((hold, req.admission_token));
        let event = event.map_err(ApiError::from)?;
        // A batch of one: the same path as `HoldBatch`'s items.
        let mut answers = api.hold_admitted(&event, vec![item]).await;
        ok(convert::hold(
            answers.pop().unwrap_or(Err(ApiError::NotReady))?,
        ))
    }

    async fn hold_batch(&self, req: Request<pb::HoldBatchRequest>) -> Rpc<pb::HoldBatchResponse> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        let id = event_id("event_id", req.event_id)?;
        if req.items.is_empty() || req.items.len() > HOLD_BATCH_ITEMS_MAX {
            return Err(ApiError::from(Rejection::invalid(
                "items",
                format!("1 to {HOLD_BATCH_ITEMS_MAX} holds"),
            ))
            .into());
        }
        let event = api.engine.event_terms(&id).map_err(ApiError::from)?;
        let items = req
            .items
            .into_iter()
            .map(|item| batch_item(&id, item))
            .collect();
        let results = api
            .hold_admitted(&event, items)
            .await
            .into_iter()
            .enumerate()
            .map(|(i, answer)| {
                let r = convert::batch_result(i, answer.map(convert::hold));
                crate::metrics::hold_batch_item(&r);
                r
            })
            .collect();
        ok(pb::HoldBatchResponse { results })
    }

    async fn confirm(&self, req: Request<pb::ConfirmRequest>) -> Rpc<pb::Order> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        required("hold_id", &req.hold_id)?;
        user_id(&req.user_id)?;
        check_idempotency_key(&req.idempotency_key).map_err(ApiError::from)?;
        required("payment_token", &req.payment_token)?;
        if !req.payment_token.starts_with("tok_") {
            return Err(ApiError::from(Rejection::invalid(
                "payment_token",
                "must start with tok_",
            ))
            .into());
        }
        let o = api
            .engine
            .confirm(ConfirmRequest {
                hold_id: HoldId(req.hold_id),
                user_id: UserId(req.user_id),
                payment_ref: req.payment_token,
                idempotency_key: req.idempotency_key,
            })
            .await
            .map_err(ApiError::from)?;
        ok(convert::order(o, &api.tickets).map_err(ApiError::from)?)
    }

    async fn release(&self, req: Request<pb::ReleaseRequest>) -> Rpc<pb::ReleaseResponse> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        required("hold_id", &req.hold_id)?;
        user_id(&req.user_id)?;
        api.engine
            .release(&HoldId(req.hold_id), &UserId(req.user_id))
            .await
            .map_err(ApiError::from)?;
        ok(pb::ReleaseResponse {})
    }

    async fn get_hold(&self, req: Request<pb::GetHoldRequest>) -> Rpc<pb::Hold> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        required("hold_id", &req.hold_id)?;
        user_id(&req.user_id)?;
        let h = api
            .engine
            .get_hold_of(&HoldId(req.hold_id), &UserId(req.user_id))
            .await
            .map_err(ApiError::from)?;
        ok(convert::hold(h))
    }

    async fn get_order(&self, req: Request<pb::GetOrderRequest>) -> Rpc<pb::Order> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        required("order_id", &req.order_id)?;
        user_id(&req.user_id)?;
        let o = api
            .engine
            .get_order_of(&OrderId(req.order_id), &UserId(req.user_id))
            .await
            .map_err(ApiError::from)?;
        ok(convert::order(o, &api.tickets).map_err(ApiError::from)?)
    }

    async fn cancel_tickets(
        &self,
        req: Request<pb::CancelTicketsRequest>,
    ) -> Rpc<pb::CancelTicketsResponse> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        required("order_id", &req.order_id)?;
        user_id(&req.user_id)?;
        let done = api
            .engine
            .cancel_tickets(boxoffice_engine::CancelRequest {
                order_id: OrderId(req.order_id),
                user_id: UserId(req.user_id),
                ticket_ids: req.ticket_ids,
                idempotency_key: req.idempotency_key,
            })
            .await
            .map_err(ApiError::from)?;
        let c = done.cancelled;
        ok(pb::CancelTicketsResponse {
            order: Some(convert::order(c.order, &api.tickets).map_err(ApiError::from)?),
            cancelled_ticket_ids: c.ticket_ids,
            refund_cents: c.refund_cents,
            refund_id: done.refund.map(|r| r.payment_id).unwrap_or_default(),
        })
    }

    async fn transfer_tickets(
        &self,
        req: Request<pb::TransferTicketsRequest>,
    ) -> Rpc<pb::TransferTicketsResponse> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        required("order_id", &req.order_id)?;
        user_id(&req.user_id)?;
        required("to_user_id", &req.to_user_id)?;
        let done = api
            .engine
            .transfer_tickets(boxoffice_engine::TransferRequest {
                order_id: OrderId(req.order_id),
                user_id: UserId(req.user_id),
                ticket_ids: req.ticket_ids,
                to_user_id: UserId(req.to_user_id),
                idempotency_key: req.idempotency_key,
            })
            .await
            .map_err(ApiError::from)?;
        ok(pb::TransferTicketsResponse {
            order: Some(convert::order(done.from, &api.tickets).map_err(ApiError::from)?),
            received_order_id: done.to.order_id.0,
            transferred_ticket_ids: done.ticket_ids,
        })
    }

    async fn list_orders(
        &self,
        req: Request<pb::ListOrdersRequest>,
    ) -> Rpc<pb::ListOrdersResponse> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        user_id(&req.user_id)?;
        let event = match req.event_id.as_str() {
            "" => None,
            _ => Some(event_id("event_id", req.event_id.clone())?),
        };
        let before = match req.page_token.as_str() {
            "" => None,
            token => {
                let page = api
                    .signer
                    .verify_orders_page(token, &req.user_id, &req.event_id)
                    .ok_or_else(|| {
                        ApiError::from(Rejection::invalid(
                            "page_token",
                            "not a page token of this listing (altered, or for another user or \
                             event)",
                        ))
                    })?;
                Some(OrderCursor {
                    created_at_ms: page.created_at_ms,
                    order_id: OrderId(page.order_id),
                })
            }
        };
        let size = crate::lists::orders_page_size(&req);
        let page = api
            .engine
            .list_orders(&UserId(req.user_id.clone()), event.as_ref(), before, size)
            .await
            .map_err(ApiError::from)?;
        let orders = page
            .orders
            .into_iter()
            .map(|o| convert::order(o, &api.tickets))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ApiError::from)?;
        let next_page_token =
            crate::lists::next_orders_token(&req, &orders, page.more, &api.signer);
        ok(pb::ListOrdersResponse {
            orders,
            next_page_token,
        })
    }
}

#[tonic::async_trait]
impl pb::waitlist_service_server::WaitlistService for WaitlistSvc {
    async fn join_waitlist(&self, req: Request<pb::JoinWaitlistRequest>) -> Rpc<pb::WaitlistEntry> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        let id = event_id("event_id", req.event_id)?;
        user_id(&req.user_id)?;
        if req.quantity == 0 {
            return Err(
                ApiError::from(Rejection::invalid("quantity", "must be at least 1")).into(),
            );
        }
        let event = api.engine.event_terms(&id).map_err(ApiError::from)?;
        let user = UserId(req.user_id);
        // Behind the line, as `Hold` is: the same admission, checked the same way.
        if let Err(e) = api
            .check_admission(&req.admission_token, &event, user.as_str(), true)
            .await
        {
            // A retry after the window closed still finds the entry the first call made (the
            // token is expired, but genuine and bound to this event and user).
            if e == ApiError::TokenExpired
                && let Some(entry) = api
                    .engine
                    .active_waitlist_entry(&id, &user)
                    .await
                    .map_err(ApiError::from)?
            {
                return ok(convert::waitlist_entry(entry));
            }
            return Err(e.into());
        }
        let section = (!req.section_id.is_empty()).then_some(SectionId(req.section_id));
        let entry = api
            .engine
            .join_waitlist(&id, &user, section, req.quantity)
            .await
            .map_err(ApiError::from)?;
        ok(convert::waitlist_entry(entry))
    }

    async fn get_waitlist_entry(
        &self,
        req: Request<pb::GetWaitlistEntryRequest>,
    ) -> Rpc<pb::WaitlistEntry> {
        let api = ready(self.0.of(&req))?;
        let req = req.into_inner();
        required("entry_id", &req.entry_id)?;
        user_id(&req.user_id)?;
        let entry = api
            .engine
            .waitlist_entry_of(&req.entry_id, &UserId(req.user_id))
            .await
            .map_err(ApiError::from)?;
        ok(convert::waitlist_entry(entry))
    }
}

/// A `Join`'s own fields checked: its event id.
fn check_join(req: &pb::JoinRequest) -> Result<EventId, ApiError> {
    let id = event_id("event_id", req.event_id.clone())?;
    user_id(&req.user_id)?;
    if req.session_id.len() > 256 || req.session_id.chars().any(char::is_control) {
        return Err(ApiError::from(Rejection::invalid(
            "session_id",
            "at most 256 bytes without control characters",
        )));
    }
    if req.join_challenge.len() > crate::limits::TOKEN_LEN_MAX {
        return Err(ApiError::from(Rejection::invalid(
            "join_challenge",
            format!("at most {} bytes", crate::limits::TOKEN_LEN_MAX),
        )));
    }
    Ok(id)
}

/// The fan's number in `room` (its place, or the one this session already has); the next
/// block of numbers is recorded before any of it is handed out.
async fn take_place(
    api: &Api,
    room: &WaitingRoom,
    id: &EventId,
    req: &pb::JoinRequest,
) -> Result<u32, ApiError> {
    loop {
        match room.join(&req.user_id, &req.session_id) {
            Ok(n) => return Ok(n),
            Err(JoinError::Reserve { upto }) => {
                // One joiner records the next block; those that found the same block used up
                // wait for it, then join again.
                let _one = room.reserving.lock().await;
                if room.reserved() >= upto {
                    continue;
                }
                api.engine
                    .record_room(id, vec![RoomRecord::Reserved { upto }])
                    .await
                    .map_err(ApiError::from)?;
                room.reserve(upto);
            }
            Err(JoinError::QueueFull) => return Err(ApiError::QueueFull),
        }
    }
}

/// The place and wait a fan with number `join` is shown: before the opening, its wait until
/// then; once admitted or expired, no wait.
fn place_shown(room: &WaitingRoom, join: u32, now: u64) -> (u64, u32) {
    match room.standing(join, now) {
        Standing::BeforeOpening { opens_in_ms } => (
            0,
            u32::try_from(opens_in_ms.div_ceil(1000)).unwrap_or(u32::MAX),
        ),
        Standing::Waiting {
            position,
            eta_seconds,
            ..
        } => (position, eta_seconds),
        Standing::Admitted { position, .. } | Standing::Expired { position } => (position, 0),
    }
}

/// What `GetStatus` answers a fan of queue token `q` standing so: an admitted fan gets its
/// admission token.
fn status_of(api: &Api, standing: Standing, q: Claims) -> pb::QueueStatus {
    match standing {
        Standing::BeforeOpening { opens_in_ms } => pb::QueueStatus {
            state: pb::QueueState::Waiting as i32,
            eta_seconds: u32::try_from(opens_in_ms.div_ceil(1000)).unwrap_or(u32::MAX),
            ..Default::default()
        },
        Standing::Waiting {
            position,
            ahead,
            eta_seconds,
        } => pb::QueueStatus {
            state: pb::QueueState::Waiting as i32,
            position,
            ahead,
            eta_seconds,
            ..Default::default()
        },
        Standing::Admitted {
            position,
            admitted_at_ms,
            expires_at_ms,
        } => pb::QueueStatus {
            state: pb::QueueState::Admitted as i32,
            position,
            admission_token: api.signer.sign(&Claims {
                kind: TokenKind::Admission,
                event_id: q.event_id,
                user_id: q.user_id,
                number: position,
                at_ms: admitted_at_ms,
                epoch: 0,
                expires_at_ms,
            }),
            admission_expires_at_unix_ms: i64::try_from(expires_at_ms).unwrap_or(i64::MAX),
            ..Default::default()
        },
        Standing::Expired { position } => pb::QueueStatus {
            state: pb::QueueState::Expired as i32,
            position,
            ..Default::default()
        },
    }
}

pub use super::cluster::ClusterSvc;

/// `ChangeService`: the change stream of every group this server has (see
/// [`super::changes`]); the gate's drain ends following readers.
pub struct ChangeSvc {
    /// The groups (their feeds).
    pub groups: Groups,
    /// Turns true when the server drains.
    pub drain: tokio::sync::watch::Receiver<bool>,
}

#[tonic::async_trait]
impl pb::change_service_server::ChangeService for ChangeSvc {
    type WatchChangesStream =
        std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<pb::Change, Status>> + Send>>;

    async fn watch_changes(
        &self,
        req: Request<pb::WatchChangesRequest>,
    ) -> Rpc<Self::WatchChangesStream> {
        let r = req.into_inner();
        let watch = super::changes::Watch::open(
            self.groups.feeds(),
            &r.after_cursor,
            &r.event_id,
            r.follow,
        )
        .await?;
        let rx = super::changes::spawn(watch, self.drain.clone());
        let stream =
            futures_util::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), |r| {
                r.map_err(Status::from)
            });
        ok(Box::pin(stream))
    }
}
