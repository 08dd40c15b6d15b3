//! The in-process face of the services: what the HTTP API calls. A call here takes the steps a
//! gRPC call takes, through the same code, without a second gRPC call:
//! 1. the gate ([`Gate::admit`]): the API key, the drain, the bound on calls in flight;
//! 2. the caller's deadline (the HTTP API's is [`CALL_TIMEOUT`]): `DEADLINE_EXCEEDED` when it
//!    passes first, while the call runs to its end on a task of its own, still counted in flight;
//! 3. the cluster's routing ([`Forwarder::place`], by the request's [`Routed`] event): served
//!    here by the services' own handlers (the typed request, as tonic would have decoded it),
//!    or forwarded to the group's leader (the one hop a cluster needs);
//! 4. the gate's metrics, by method, code and reason ([`crate::gate::observe`]).
//!
//! Each request type of the contract names its RPC and its handler once ([`Unary`]).
//! `ListEvents`, and `ListOrders` of every event, ask every group at once ([`Local::list`]), as
//! the gRPC face does.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use boxoffice_proto::v1 as pb;
use pb::booking_service_server::BookingService;
use pb::event_service_server::EventService;
use pb::waiting_room_service_server::WaitingRoomService;
use pb::waitlist_service_server::WaitlistService;
use tonic::Status;

use crate::gate::{Gate, Scope};
use crate::lists::Listing;
use crate::node::forward::{Forwarder, Place, Route, Routed, group_of_event};
use crate::services::grpc::{BookingSvc, EventSvc, WaitingRoomSvc, WaitlistSvc};
use crate::services::{GroupOf, Groups};

/// How long a call of the in-process face may take (a caller that leaves sooner does not stop
/// it: it runs to its end).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest a `ClusterService` call over HTTP may take: a change waits for each group's new
/// node to catch up (up to a minute), and for each group's leader (up to 30 s), group by group.
pub const CLUSTER_CALL_TIMEOUT: Duration = Duration::from_secs(300);

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A unary request of the contract, with its RPC's path and the handler that serves it.
pub trait Unary: Routed + prost::Message + Default + Send + 'static {
    /// The answer.
    type Answer: prost::Message + Default + Send + 'static;
    /// The RPC's gRPC path.
    const PATH: &'static str;
    /// Serves the request here, with the services' own handler.
    fn serve(
        groups: Groups,
        req: tonic::Request<Self>,
    ) -> BoxFuture<Result<tonic::Response<Self::Answer>, Status>>;
}

macro_rules! unary {
    ($req:ty => $answer:ty, $path:literal, $svc:ident . $method:ident) => {
        impl Unary for $req {
            type Answer = $answer;
            const PATH: &'static str = $path;
            fn serve(
                groups: Groups,
                req: tonic::Request<Self>,
            ) -> BoxFuture<Result<tonic::Response<Self::Answer>, Status>> {
                Box::pin(async move { $svc(groups).$method(req).await })
            }
        }
    };
}

unary!(pb::CreateEventRequest => pb::Event, "/boxoffice.v1.EventService/CreateEvent", EventSvc.create_event);
unary!(pb::ListEventsRequest => pb::ListEventsResponse, "/boxoffice.v1.EventService/ListEvents", EventSvc.list_events);
unary!(pb::GetRevocationListRequest => pb::RevocationList, "/boxoffice.v1.EventService/GetRevocationList", EventSvc.get_revocation_list);
unary!(pb::GetEventRequest => pb::Event, "/boxoffice.v1.EventService/GetEvent", EventSvc.get_event);
unary!(pb::UpdateSaleRequest => pb::Event, "/boxoffice.v1.EventService/UpdateSale", EventSvc.update_sale);
unary!(pb::GetSeatMapRequest => pb::SeatMap, "/boxoffice.v1.EventService/GetSeatMap", EventSvc.get_seat_map);
unary!(pb::JoinRequest => pb::QueueTicket, "/boxoffice.v1.WaitingRoomService/Join", WaitingRoomSvc.join);
unary!(pb::GetJoinChallengeRequest => pb::JoinChallenge, "/boxoffice.v1.WaitingRoomService/GetJoinChallenge", WaitingRoomSvc.get_join_challenge);
unary!(pb::GetStatusRequest => pb::QueueStatus, "/boxoffice.v1.WaitingRoomService/GetStatus", WaitingRoomSvc.get_status);
unary!(pb::HoldRequest => pb::Hold, "/boxoffice.v1.BookingService/Hold", BookingSvc.hold);
unary!(pb::HoldBatchRequest => pb::HoldBatchResponse, "/boxoffice.v1.BookingService/HoldBatch", BookingSvc.hold_batch);
unary!(pb::ConfirmRequest => pb::Order, "/boxoffice.v1.BookingService/Confirm", BookingSvc.confirm);
unary!(pb::ReleaseRequest => pb::ReleaseResponse, "/boxoffice.v1.BookingService/Release", BookingSvc.release);
unary!(pb::GetHoldRequest => pb::Hold, "/boxoffice.v1.BookingService/GetHold", BookingSvc.get_hold);
unary!(pb::GetOrderRequest => pb::Order, "/boxoffice.v1.BookingService/GetOrder", BookingSvc.get_order);
unary!(pb::TransferTicketsRequest => pb::TransferTicketsResponse, "/boxoffice.v1.BookingService/TransferTickets", BookingSvc.transfer_tickets);
unary!(pb::CancelTicketsRequest => pb::CancelTicketsResponse, "/boxoffice.v1.BookingService/CancelTickets", BookingSvc.cancel_tickets);
unary!(pb::ListOrdersRequest => pb::ListOrdersResponse, "/boxoffice.v1.BookingService/ListOrders", BookingSvc.list_orders);
unary!(pb::JoinWaitlistRequest => pb::WaitlistEntry, "/boxoffice.v1.WaitlistService/JoinWaitlist", WaitlistSvc.join_waitlist);
unary!(pb::GetWaitlistEntryRequest => pb::WaitlistEntry, "/boxoffice.v1.WaitlistService/GetWaitlistEntry", WaitlistSvc.get_waitlist_entry);

/// The path of `WatchChanges`.
const WATCH_CHANGES: &str = "/boxoffice.v1.ChangeService/WatchChanges";

/// Where a change stream's changes arrive (an error last, if one ends it).
pub type ChangeReceiver = tokio::sync::mpsc::Receiver<Result<pb::Change, crate::status::ApiError>>;

/// The in-process face: the gate, the cluster's routing and the services of one server.
pub struct Local {
    gate: Arc<Gate>,
    forwarder: Option<Arc<Forwarder>>,
    groups: Groups,
}

impl Local {
    /// Whether `authorization` (an `Authorization` header's value) presents a key of this
    /// server, of any scope.
    pub fn knows(&self, authorization: Option<&str>) -> bool {
        self.gate.scope_presented(authorization).is_some()
    }

    /// The face of a server with this gate, these groups and (a cluster node) this forwarder.
    pub fn new(gate: Arc<Gate>, groups: Groups, forwarder: Option<Arc<Forwarder>>) -> Local {
        Local {
            gate,
            forwarder,
            groups,
        }
    }

    /// Calls `req`'s RPC as the caller of `authorization` (an `Authorization` header's value).
    pub async fn call<R: Unary>(
        &self,
        authorization: Option<&str>,
        req: R,
    ) -> Result<R::Answer, Status> {
        let (forwarder, groups) = (self.forwarder.clone(), self.groups.clone());
        let key = authorization.map(str::to_owned);
        self.run(R::PATH, authorization, move |scope| {
            let admin = scope == Scope::Admin;
            Box::pin(async move { serve(forwarder, groups, key, admin, req).await })
        })
        .await
    }

    /// A list call (`ListEvents`, `ListOrders`): with several groups and no event named, each
    /// group's page (here, or at its leader) merged as the gRPC face merges them
    /// ([`Listing::merge`]); otherwise the call of the one group it names.
    pub async fn list<L: Listing + Unary<Answer = <L as Listing>::Page>>(
        &self,
        authorization: Option<&str>,
        req: L,
    ) -> Result<L::Answer, Status> {
        let (forwarder, groups) = (self.forwarder.clone(), self.groups.clone());
        let key = authorization.map(str::to_owned);
        self.run(<L as Unary>::PATH, authorization, move |scope| {
            let admin = scope == Scope::Admin;
            Box::pin(async move {
                let f = match forwarder {
                    Some(f) if f.group_count() > 1 && req.route() == Route::All => f,
                    one => return serve(one, groups, key, admin, req).await,
                };
                let mut asking = tokio::task::JoinSet::new();
                for g in 0..f.group_count() {
                    let sub = req.of_group();
                    let (f, groups, key) = (f.clone(), groups.clone(), key.clone());
                    asking
                        .spawn(async move { in_group(Some(f), groups, key, admin, g, sub).await });
                }
                let mut pages = Vec::new();
                while let Some(page) = asking.join_next().await {
                    pages.push(
                        page.map_err(|e| Status::internal(format!("listing a group: {e}")))??,
                    );
                }
                Ok(req.merge(pages, f.signer()))
            })
        })
        .await
    }

    /// A `ClusterService` call (`path`, admin scope) made with `call` on this node's members
    /// (never forwarded: the node asks each group's leader itself).
    pub async fn cluster<T: Send + 'static>(
        &self,
        authorization: Option<&str>,
        path: &'static str,
        call: impl FnOnce(crate::services::grpc::ClusterSvc) -> BoxFuture<Result<T, Status>>,
    ) -> Result<T, Status> {
        let svc = crate::services::grpc::ClusterSvc(
            self.forwarder.as_ref().map(|f| Arc::new(f.members())),
        );
        self.run_for(path, authorization, CLUSTER_CALL_TIMEOUT, move |_| {
            call(svc)
        })
        .await
    }

    /// `WatchChanges` as the caller of `authorization` (an admin or stream key): the changes
    /// after `req`'s cursor, sent into the returned channel (see [`crate::services::changes`]).
    /// A refused cursor is refused here, before anything is sent.
    pub async fn watch_changes(
        &self,
        authorization: Option<&str>,
        req: pb::WatchChangesRequest,
    ) -> Result<ChangeReceiver, Status> {
        let feeds = self.groups.feeds().clone();
        let drain = self.gate.draining_signal();
        self.run(WATCH_CHANGES, authorization, move |_| {
            Box::pin(async move {
                let watch = crate::services::changes::Watch::open(
                    &feeds,
                    &req.after_cursor,
                    &req.event_id,
                    req.follow,
                )
                .await?;
                Ok(crate::services::changes::spawn(watch, drain))
            })
        })
        .await
    }

    /// The gate, the deadline ([`CALL_TIMEOUT`]) and the metrics around `work`.
    async fn run<T: Send + 'static>(
        &self,
        path: &'static str,
        authorization: Option<&str>,
        work: impl FnOnce(Scope) -> BoxFuture<Result<T, Status>>,
    ) -> Result<T, Status> {
        self.run_for(path, authorization, CALL_TIMEOUT, work).await
    }

    /// The gate, the deadline `timeout` and the metrics around `work`.
    async fn run_for<T: Send + 'static>(
        &self,
        path: &'static str,
        authorization: Option<&str>,
        timeout: Duration,
        work: impl FnOnce(Scope) -> BoxFuture<Result<T, Status>>,
    ) -> Result<T, Status> {
        let method = crate::gate::method_label(path);
        let started = Instant::now();
        let answer = match self.gate.admit(path, authorization) {
            Err(e) => Err(Status::from(e)),
            Ok(in_flight) => {
                let work = work(in_flight.scope());
                // In the HTTP call's span (crate::trace), on its task of its own.
                let mut call = tokio::spawn(tracing::Instrument::in_current_span(async move {
                    let answer = work.await;
                    drop(in_flight);
                    answer
                }));
                match tokio::time::timeout(crate::gate::short_of(timeout), &mut call).await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(e)) => Err(Status::internal(format!("the call failed: {e}"))),
                    Err(_) => Err(crate::gate::deadline_exceeded()),
                }
            }
        };
        let (code, reason) = match &answer {
            Ok(_) => ("OK", "none"),
            Err(status) => crate::gate::labels_of(status),
        };
        crate::gate::observe(method, code, reason, started);
        answer
    }
}

/// Serves `req` where its group is served: here, or at the group's leader.
async fn serve<R: Unary>(
    forwarder: Option<Arc<Forwarder>>,
    groups: Groups,
    key: Option<String>,
    admin: bool,
    mut req: R,
) -> Result<R::Answer, Status> {
    let Some(f) = forwarder else {
        return here(groups, 0, admin, req).await;
    };
    let g = if f.group_count() <= 1 {
        0
    } else {
        req.name_event();
        match req.route() {
            Route::Event(event) => group_of_event(&event, f.group_count()),
            Route::All | Route::Unknown => 0,
        }
    };
    match f.place(g) {
        Place::Here => here(groups, g, admin, req).await,
        Place::Leader(leader, channel) => {
            f.ask_leader(
                (g, leader, channel),
                R::PATH,
                key.as_deref(),
                CALL_TIMEOUT,
                &req,
            )
            .await
        }
    }
}

/// Serves `req` here, as group `g`'s (for an admin key's caller: `admin`).
async fn here<R: Unary>(groups: Groups, g: u32, admin: bool, req: R) -> Result<R::Answer, Status> {
    let mut req = tonic::Request::new(req);
    req.extensions_mut().insert(GroupOf(g as usize));
    if admin {
        req.extensions_mut().insert(crate::gate::AdminCaller);
    }
    fenced(&groups, g, R::PATH, R::serve(groups.clone(), req)).await
}

/// `call`'s answer, served here as group `g`'s, once it may be given: as the gRPC face's
/// `held`, a leader's read or refusal waits for the fence of the engine that answered.
async fn fenced<T>(
    groups: &Groups,
    g: u32,
    path: &str,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    crate::node::reads::fenced(groups, g as usize, path, call, |a| Some(a.is_err()))
        .await?
        .map(tonic::Response::into_inner)
}

/// `req` served as group `g`'s: here, or at its leader.
async fn in_group<R: Unary>(
    forwarder: Option<Arc<Forwarder>>,
    groups: Groups,
    key: Option<String>,
    admin: bool,
    g: u32,
    req: R,
) -> Result<R::Answer, Status> {
    let place = forwarder.as_ref().map_or(Place::Here, |f| f.place(g));
    match (place, forwarder) {
        (Place::Leader(leader, channel), Some(f)) => {
            f.ask_leader(
                (g, leader, channel),
                R::PATH,
                key.as_deref(),
                CALL_TIMEOUT,
                &req,
            )
            .await
        }
        _ => here(groups, g, admin, req).await,
    }
}
