//! `grpc.health.v1.Health` as tonic-health serves it, except that `Watch` streams end when the
//! server starts to drain: a watcher gets the `NOT_SERVING` update and then the end of its
//! stream, so an open watch never holds a shutdown for its whole grace period.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
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
