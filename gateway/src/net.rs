//! Where the server meets the network: the listener it serves on, and the connections it opens
//! to its peers (Raft, forwarded calls).
//!
//! By default both are the OS's TCP. A deterministic simulation gives the server a [`Network`]
//! of its own ([`crate::server::ServerConfig::network`]), so whole nodes serve and call each
//! other over a simulated network whose partitions, delays and timing replay from a seed.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::{Channel, Endpoint};

/// A byte stream both ways: a connection.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// One connection of a [`Network`], with its two ends' addresses.
pub struct Conn {
    io: Box<dyn Io>,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
}

impl Conn {
    /// The connection `io` between `local` and `remote`.
    pub fn new(io: impl Io, local: Option<SocketAddr>, remote: Option<SocketAddr>) -> Conn {
        Conn {
            io: Box::new(io),
            local,
            remote,
        }
    }
}

impl Conn {
    /// The two ends' addresses: local, remote.
    pub fn addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        (self.local, self.remote)
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.local,
            remote_addr: self.remote,
        }
    }
}

/// Accepted connections, as a listener yields them.
pub type Incoming = BoxStream<'static, io::Result<Conn>>;

/// What happens to one message a node sends a peer (Raft's), beyond what TCP does: TCP never
/// duplicates or reorders, but a retry after a lost answer duplicates, and a slow path lets a
/// later message overtake an earlier one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MessageFaults {
    /// Held this long before it is sent (a message sent meanwhile may arrive first).
    pub delay: std::time::Duration,
    /// Sent twice (the peer answers both; the first answer is dropped).
    pub duplicate: bool,
}

/// A network other than the OS's (a simulation's); see the module docs.
pub trait Network: Send + Sync + 'static {
    /// Binds `addr`: the address bound, and the connections accepted there.
    fn bind(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<(SocketAddr, Incoming)>>;
    /// Opens a connection to `authority` (`host:port`).
    fn connect(&self, authority: String) -> BoxFuture<'static, io::Result<Conn>>;
    /// What happens to the next message to peer `to` (none by default).
    fn message_faults(&self, to: u64) -> MessageFaults {
        let _ = to;
        MessageFaults::default()
    }
}

/// The network a server uses: the OS's (`None`) or a simulation's.
pub type Net = Option<Arc<dyn Network>>;

/// tonic's connector over `network`.
fn connector(
    network: Arc<dyn Network>,
) -> impl tower::Service<
    http::Uri,
    Response = hyper_util::rt::TokioIo<Conn>,
    Error = io::Error,
    Future = BoxFuture<'static, io::Result<hyper_util::rt::TokioIo<Conn>>>,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |uri: http::Uri| -> BoxFuture<'static, io::Result<_>> {
        let network = network.clone();
        Box::pin(async move {
            let authority = uri
                .authority()
                .map(|a| a.to_string())
                .ok_or_else(|| io::Error::other(format!("no host:port in {uri}")))?;
            Ok(hyper_util::rt::TokioIo::new(
                network.connect(authority).await?,
            ))
        })
    })
}

/// A channel to `endpoint` that connects on first use, over `net`.
pub fn channel_lazy(net: &Net, endpoint: Endpoint) -> Channel {
    match net {
        None => endpoint.connect_lazy(),
        Some(n) => endpoint.connect_with_connector_lazy(connector(n.clone())),
    }
}

/// A channel to `endpoint`, connected now, over `net`.
pub async fn channel_now(
    net: &Net,
    endpoint: Endpoint,
) -> Result<Channel, tonic::transport::Error> {
    match net {
        None => endpoint.connect().await,
        Some(n) => endpoint.connect_with_connector(connector(n.clone())).await,
    }
}

/// What a server listens on: the OS's TCP listener, or a [`Network`]'s.
pub enum Listener {
    /// A TCP listener.
    Tcp(tokio::net::TcpListener),
    /// Another network's: the address bound and the connections accepted.
    Other(SocketAddr, Incoming),
}

impl Listener {
    /// Binds `addr` on `net`.
    pub async fn bind(net: &Net, addr: SocketAddr) -> io::Result<Listener> {
        match net {
            None => Ok(Listener::Tcp(tokio::net::TcpListener::bind(addr).await?)),
            Some(n) => {
                let (addr, incoming) = n.bind(addr).await?;
                Ok(Listener::Other(addr, incoming))
            }
        }
    }

    /// The connections accepted, as a stream (TCP's with `TCP_NODELAY`).
    pub fn incoming(self) -> Incoming {
        match self {
            Listener::Tcp(l) => Box::pin(futures_util::stream::unfold(l, |l| async move {
                let accepted = l.accept().await.map(|(stream, remote)| {
                    let _ = stream.set_nodelay(true);
                    let local = stream.local_addr().ok();
                    Conn::new(stream, local, Some(remote))
                });
                Some((accepted, l))
            })),
            Listener::Other(_, incoming) => incoming,
        }
    }

    /// The address bound.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr(),
            Listener::Other(addr, _) => Ok(*addr),
        }
    }
}
