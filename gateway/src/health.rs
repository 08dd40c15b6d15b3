//! `grpc.health.v1.Health` as tonic-health serves it, except that `Watch` streams end when the
//! server starts to drain: a watcher gets the `NOT_SERVING` update and then the end of its
//! stream, so an open watch never holds a shutdown for its whole grace period.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

/// The health service over `reporter`'s statuses; its watches end once `draining` turns true.
pub fn service(
    reporter: &HealthReporter,
    draining: watch::Receiver<bool>,
) -> HealthServer<DrainingHealth> {
    HealthServer::new(DrainingHealth {
        inner: HealthService::from_health_reporter(reporter.clone()),
        draining,
    })
}

/// See the module docs.
pub struct DrainingHealth {
    inner: HealthService,
    draining: watch::Receiver<bool>,
}

type Drained = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A watch that ends once the drain has started and every status change before it was sent.
pub struct EndsOnDrain {
    inner: <HealthService as Health>::WatchStream,
    drained: Option<Drained>,
}

impl Stream for EndsOnDrain {
    type Item = Result<HealthCheckResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // A status change first (the drain sets NOT_SERVING before it starts), then the end.
        if let Poll::Ready(item) = Pin::new(&mut self.inner).poll_next(cx) {
            return Poll::Ready(item);
        }
        match self.drained.as_mut().map(|d| d.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => {
                self.drained = None;
                Poll::Ready(None)
            }
            Some(Poll::Pending) => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}

#[tonic::async_trait]
impl Health for DrainingHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = EndsOnDrain;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let inner = self.inner.watch(request).await?.into_inner();
        let mut draining = self.draining.clone();
        let drained: Drained = Box::pin(async move {
            // A dropped sender (the server is gone) ends the watch too.
            let _ = draining.wait_for(|d| *d).await;
        });
        Ok(Response::new(EndsOnDrain {
            inner,
            drained: Some(drained),
        }))
    }
}

/// The services whose health the server reports: the server as a whole (`""`) and each
/// `boxoffice.v1` service.
const SERVICES: &[&str] = &[
    "",
    "boxoffice.v1.EventService",
    "boxoffice.v1.WaitingRoomService",
    "boxoffice.v1.BookingService",
    "boxoffice.v1.WaitlistService",
    "boxoffice.v1.ChangeService",
];

/// Sets every service's health ([`SERVICES`]) to `status`.
pub(crate) async fn set_health(health: &HealthReporter, status: ServingStatus) {
    for s in SERVICES {
        health.set_service_status(*s, status).await;
    }
}

/// A cluster node's health over its groups. A group is fine while it is served here (this node
/// leads it, its engine open) or has a leader known to forward to. `SERVING` once every group
/// has been fine at once (the start), then while any group is: an election in one group makes
/// its calls answer `NOT_READY` for a moment, but must not take the node out of a load
/// balancer that sends it the other groups' calls. (One group: `NOT_SERVING` during its
/// elections, as before.)
pub(crate) struct GroupHealth {
    health: HealthReporter,
    ok: tokio::sync::Mutex<GroupStates>,
}

struct GroupStates {
    fine: Vec<bool>,
    /// Every group has been fine at once.
    started: bool,
    /// What health says now.
    serving: Option<bool>,
}

impl GroupHealth {
    pub(crate) fn new(health: HealthReporter, groups: usize) -> GroupHealth {
        GroupHealth {
            health,
            ok: tokio::sync::Mutex::new(GroupStates {
                fine: vec![false; groups],
                started: false,
                serving: None,
            }),
        }
    }

    /// Group `g` is served (`true`) or not; health follows all of them.
    pub(crate) async fn set(&self, g: u32, ok: bool) {
        let mut state = self.ok.lock().await;
        if let Some(slot) = state.fine.get_mut(g as usize) {
            *slot = ok;
        }
        state.started |= state.fine.iter().all(|o| *o);
        let serving = state.started && state.fine.iter().any(|o| *o);
        if state.serving != Some(serving) {
            state.serving = Some(serving);
            set_health(
                &self.health,
                if serving {
                    ServingStatus::Serving
                } else {
                    ServingStatus::NotServing
                },
            )
            .await;
        }
    }
}
