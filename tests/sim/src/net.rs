//! The server's network seam ([`boxoffice_gateway::net::Network`]) over turmoil's simulated TCP.

use std::io;
use std::net::SocketAddr;

use boxoffice_gateway::net::{Conn, Incoming, Network};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;

/// turmoil's network, as a server's [`Network`].
pub struct TurmoilNet;

impl Network for TurmoilNet {
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
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{authority}"))
        .unwrap_or_else(|e| panic!("a simulated host's address is a URI: {e}"))
        .connect_timeout(std::time::Duration::from_millis(500));
    boxoffice_gateway::net::channel_lazy(&Some(std::sync::Arc::new(TurmoilNet)), endpoint)
}
