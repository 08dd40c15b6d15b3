//! The server's network seam ([`boxoffice_gateway::net::Network`]) over turmoil's simulated TCP.

use std::io;
use std::net::SocketAddr;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use boxoffice_gateway::net::{Conn, Incoming, MessageFaults, Network};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;

/// How often the nodes' messages to each other are delayed or sent twice (per mille), shared
/// by every node of a run and set by its driver.
#[derive(Default)]
pub struct MessageRates {
    /// Messages held a few ms before they are sent (a later one may overtake them).
    pub delayed: AtomicU64,
    /// Messages sent twice.
    pub duplicated: AtomicU64,
}

/// turmoil's network, as a server's [`Network`], with the run's message faults.
#[derive(Clone, Default)]
pub struct TurmoilNet {
    /// The run's rates.
    pub rates: Arc<MessageRates>,
}

impl Network for TurmoilNet {
    fn message_faults(&self, _to: u64) -> MessageFaults {
        let per_mille = |r: &AtomicU64| {
            let rate = r.load(Ordering::Relaxed);
            rate > 0 && boxoffice_engine::rt::random_u64() % 1_000 < rate
        };
        let delay = if per_mille(&self.rates.delayed) {
            std::time::Duration::from_millis(1 + boxoffice_engine::rt::random_u64() % 40)
        } else {
            std::time::Duration::ZERO
        };
        MessageFaults {
            delay,
            duplicate: per_mille(&self.rates.duplicated),
        }
    }

    fn bind(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<(SocketAddr, Incoming)>> {
        Box::pin(async move {
            let listener = turmoil::net::TcpListener::bind(addr).await?;
            let local = listener.local_addr()?;
            let incoming = futures_util::stream::unfold(listener, move |l| async move {
                let accepted = l
                    .accept()
                    .await
                    .map(|(s, peer)| Conn::new(s, Some(local), Some(peer)));
                Some((accepted, l))
            })
            .boxed();
            Ok((local, incoming))
        })
    }

    fn connect(&self, authority: String) -> BoxFuture<'static, io::Result<Conn>> {
        Box::pin(async move {
            let s = turmoil::net::TcpStream::connect(authority).await?;
            let (local, remote) = (s.local_addr().ok(), s.peer_addr().ok());
            Ok(Conn::new(s, local, remote))
        })
    }
}

/// A tonic channel to `authority` (`host:port`) over turmoil's network, connecting on first use.
pub fn channel(authority: &str) -> tonic::transport::Channel {
    // Keepalive pings, as a real client should have: a connection that a partition left dead
    // (turmoil drops what a partitioned link carries, and TCP does not resend it here) is
    // noticed and opened again.
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{authority}"))
        .unwrap_or_else(|e| panic!("a simulated host's address is a URI: {e}"))
        .connect_timeout(std::time::Duration::from_millis(500))
        .http2_keep_alive_interval(std::time::Duration::from_secs(1))
        .keep_alive_timeout(std::time::Duration::from_secs(2))
        .keep_alive_while_idle(true);
    boxoffice_gateway::net::channel_lazy(&Some(Arc::new(TurmoilNet::default())), endpoint)
}
