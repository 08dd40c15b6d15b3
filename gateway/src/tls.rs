//! TLS (issue 27, point 3).
//!
//! - **The public ports** (gRPC and the HTTP API) serve TLS with `--tls-cert` and `--tls-key`,
//!   and with `--tls-client-ca` they require a client certificate signed by that CA.
//! - **The peer port** (`--peer-listen`) carries Raft and forwarded calls over mutual TLS under
//!   the cluster's own CA (`--peer-ca`, `--peer-cert`, `--peer-key`; `boxoffice cluster certs`
//!   makes them). A node accepts only peers whose certificate that CA signed, and reaches its
//!   peers only if their certificate is signed by it and names the host it dials.
//!
//! Every file is read and checked when the server starts. A node does not start with a file
//! that is not PEM, a key that is not its certificate's, a certificate that has expired or is
//! not valid yet, or (on the peer port) a certificate its own CA did not sign. Each such error
//! names the flag, the file and what is wrong.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, ensure};
use futures_util::StreamExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::net::{Conn, Listener};

/// How long a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes a port runs at once: past them it accepts no connection until one ends (the
/// kernel's backlog holds the next), so connections that never finish a handshake cannot pile
/// up tasks and memory beyond this many for [`HANDSHAKE_TIMEOUT`] each.
pub const HANDSHAKES_MAX: usize = 1_024;

/// The crypto every TLS config here uses: ring, the provider tonic's `tls-ring` uses for the
/// gRPC ports (rustls 0.23.48 deprecates it for lacking post-quantum key exchange; aws-lc-rs,
/// which has it, needs a C toolchain and CMake to build, so both sides stay on ring together).
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A PEM file read: its text, and the certificates in it.
struct Certs {
    pem: Vec<u8>,
    ders: Vec<CertificateDer<'static>>,
}

/// The certificates in `path` (given as `flag`), at least one.
fn read_certs(flag: &str, path: &Path) -> anyhow::Result<Certs> {
    let pem =
        std::fs::read(path).with_context(|| format!("{flag} {}: cannot read", path.display()))?;
    let ders = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{flag} {}: not a PEM certificate ({e})", path.display()))?;
    ensure!(
        !ders.is_empty(),
        "{flag} {}: no certificate in it (a PEM `BEGIN CERTIFICATE` block is expected)",
        path.display()
    );
    for der in &ders {
        check_dates(flag, path, der)?;
    }
    Ok(Certs { pem, ders })
}

/// The private key in `path` (given as `flag`): its text and the key.
fn read_key(flag: &str, path: &Path) -> anyhow::Result<(Vec<u8>, PrivateKeyDer<'static>)> {
    let pem =
        std::fs::read(path).with_context(|| format!("{flag} {}: cannot read", path.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        anyhow!(
            "{flag} {}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1 expected: {e})",
            path.display()
        )
    })?;
    Ok((pem, key))
}

/// Refuses a certificate that has expired or is not valid yet.
fn check_dates(flag: &str, path: &Path, der: &CertificateDer<'_>) -> anyhow::Result<()> {
    use x509_parser::prelude::FromDer;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der.as_ref())
        .map_err(|e| anyhow!("{flag} {}: not an X.509 certificate ({e})", path.display()))?;
    let now = i64::try_from(UnixTime::now().as_secs()).unwrap_or(i64::MAX);
    let validity = cert.validity();
    ensure!(
        validity.not_after.timestamp() >= now,
        "{flag} {}: the certificate expired at {} (make a new one)",
        path.display(),
        validity.not_after
    );
    ensure!(
        validity.not_before.timestamp() <= now,
        "{flag} {}: the certificate is not valid before {} (is this machine's clock right?)",
        path.display(),
        validity.not_before
    );
    Ok(())
}

/// Refuses a key that is not the certificate's.
fn check_pair(
    cert_flag: &str,
    certs: &Certs,
    key_flag: &str,
    key: &PrivateKeyDer<'static>,
) -> anyhow::Result<()> {
    rustls::sign::CertifiedKey::from_der(certs.ders.clone(), key.clone_key(), &provider())
        .map(|_| ())
        .map_err(|e| {
            anyhow!("{key_flag} is not the private key of {cert_flag}'s certificate ({e})")
        })
}

/// The CA certificates of `certs` as a root store.
fn roots(flag: &str, path: &Path, certs: &Certs) -> anyhow::Result<Arc<rustls::RootCertStore>> {
    let mut roots = rustls::RootCertStore::empty();
    for der in &certs.ders {
        roots.add(der.clone()).map_err(|e| {
            anyhow!(
                "{flag} {}: not a usable CA certificate ({e})",
                path.display()
            )
        })?;
    }
    Ok(Arc::new(roots))
}

/// A client-certificate verifier over `roots` (every client must present one it signed).
fn client_verifier(
    roots: Arc<rustls::RootCertStore>,
) -> anyhow::Result<Arc<dyn rustls::server::danger::ClientCertVerifier>> {
    rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| anyhow!("a client certificate verifier: {e}"))
}

/// What a certificate error means, told for an operator.
fn told(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            "it is not signed by this CA (another cluster's certificate?)".to_owned()
        }
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "it has expired".to_owned()
        }
        rustls::Error::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => {
            "it is not valid yet".to_owned()
        }
        other => other.to_string(),
    }
}

/// A rustls server config for `certs` and `key`, requiring client certificates `clients`
/// verifies (if any), speaking `alpn`.
fn server_config(
    certs: &Certs,
    key: &PrivateKeyDer<'static>,
    clients: Option<Arc<rustls::RootCertStore>>,
    alpn: &[u8],
) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match clients {
        Some(roots) => builder.with_client_cert_verifier(client_verifier(roots)?),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs.ders.clone(), key.clone_key())
        .context("the certificate and its key")?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// TLS on the public ports: the gRPC port's and the HTTP API's.
pub struct PublicTls {
    grpc: tokio_rustls::TlsAcceptor,
    http: tokio_rustls::TlsAcceptor,
    /// Whether clients must present a certificate (`--tls-client-ca`).
    pub client_certs: bool,
}

impl PublicTls {
    /// Reads and checks `cert` (`--tls-cert`, the chain, leaf first), `key` (`--tls-key`) and,
    /// if given, `client_ca` (`--tls-client-ca`: clients must present a certificate it signed).
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> anyhow::Result<PublicTls> {
        let certs = read_certs("--tls-cert", cert)?;
        let (_, key_der) = read_key("--tls-key", key)?;
        check_pair("--tls-cert", &certs, "--tls-key", &key_der)?;
        let clients = match client_ca {
            Some(ca) => Some(roots(
                "--tls-client-ca",
                ca,
                &read_certs("--tls-client-ca", ca)?,
            )?),
            None => None,
        };
        Ok(PublicTls {
            grpc: server_config(&certs, &key_der, clients.clone(), b"h2")?,
            http: server_config(&certs, &key_der, clients, b"http/1.1")?,
            client_certs: client_ca.is_some(),
        })
    }

    /// The gRPC port's handshakes.
    pub(crate) fn grpc(&self) -> Handshakes {
        Handshakes::new("gRPC", self.grpc.clone(), false)
    }

    /// The HTTP API's handshakes.
    pub(crate) fn http(&self) -> Handshakes {
        Handshakes::new("HTTP", self.http.clone(), false)
    }
}

/// Mutual TLS on the peer port, under the cluster's CA: the config a node serves its peers
/// with, and the one it reaches them with.
pub struct PeerTls {
    server: tokio_rustls::TlsAcceptor,
    client: ClientTlsConfig,
}

impl PeerTls {
    /// Reads and checks the cluster's CA (`--peer-ca`) and this node's certificate and key
    /// (`--peer-cert`, `--peer-key`): the certificate must be signed by the CA and valid now,
    /// as its peers will check it.
    pub fn load(ca: &Path, cert: &Path, key: &Path) -> anyhow::Result<PeerTls> {
        let ca_certs = read_certs("--peer-ca", ca)?;
        let roots = roots("--peer-ca", ca, &ca_certs)?;
        let certs = read_certs("--peer-cert", cert)?;
        let (key_pem, key_der) = read_key("--peer-key", key)?;
        check_pair("--peer-cert", &certs, "--peer-key", &key_der)?;
        let (leaf, chain) = certs
            .ders
            .split_first()
            .ok_or_else(|| anyhow!("--peer-cert {}: no certificate", cert.display()))?;
        client_verifier(roots.clone())?
            .verify_client_cert(leaf, chain, UnixTime::now())
            .map_err(|e| {
                anyhow!(
                    "--peer-cert {} is refused by --peer-ca {}: {}",
                    cert.display(),
                    ca.display(),
                    told(&e)
                )
            })?;
        Ok(PeerTls {
            server: server_config(&certs, &key_der, Some(roots), b"h2")?,
            client: ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&ca_certs.pem))
                .identity(Identity::from_pem(&certs.pem, &key_pem))
                .timeout(HANDSHAKE_TIMEOUT),
        })
    }

    /// The peer port's handshakes (client certificates required).
    pub(crate) fn server(&self) -> Handshakes {
        Handshakes::new("peer", self.server.clone(), true)
    }

    /// The config a node reaches its peers with.
    pub fn client(&self) -> ClientTlsConfig {
        self.client.clone()
    }
}

/// The endpoint of a peer at `addr` (`host:port`): over mutual TLS if `tls`, plain otherwise.
pub fn peer_endpoint(
    addr: &str,
    tls: Option<&PeerTls>,
) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
    match tls {
        None => tonic::transport::Endpoint::from_shared(format!("http://{addr}")),
        Some(t) => tonic::transport::Endpoint::from_shared(format!("https://{addr}"))?
            .tls_config(t.client()),
    }
}

/// The TLS handshakes of one port: run beside its accept loop, so a slow client holds up no
/// one else; a refused one is logged (with the caller's address and why; the same reason at
/// most every [`REFUSALS_TOLD_EVERY`]) and counted in `boxoffice_tls_handshakes_refused_total`.
#[derive(Clone)]
pub(crate) struct Handshakes {
    port: &'static str,
    acceptor: tokio_rustls::TlsAcceptor,
    /// Whether a refusal is a warning (the peer port: a node of the cluster, or someone who
    /// should not be there) or routine (the public ports: scanners, clients that give up).
    warn: bool,
    /// When each reason was last told.
    told: Arc<std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>>,
}

/// The ports served over TLS, as `boxoffice_tls_handshakes_refused_total` names them.
pub const PORTS: [&str; 3] = ["gRPC", "HTTP", "peer"];

/// How often a port's refused handshakes of one reason are logged at most (each is counted).
pub const REFUSALS_TOLD_EVERY: Duration = Duration::from_secs(10);

impl Handshakes {
    fn new(port: &'static str, acceptor: tokio_rustls::TlsAcceptor, warn: bool) -> Handshakes {
        Handshakes {
            port,
            acceptor,
            warn,
            told: Arc::default(),
        }
    }

    /// The connections of `listener` whose handshakes succeeded, as a listener of its own.
    pub(crate) fn accepting(self, listener: Listener) -> std::io::Result<Listener> {
        let addr = listener.local_addr()?;
        let (tx, rx) = mpsc::channel::<Conn>(64);
        let mut incoming = listener.incoming();
        let running = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_MAX));
        let task = tokio::spawn(async move {
            loop {
                let Ok(permit) = running.clone().acquire_owned().await else {
                    break;
                };
                let Some(conn) = incoming.next().await else {
                    break;
                };
                let conn = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(port = self.port, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (me, tx) = (self.clone(), tx.clone());
                tokio::spawn(async move {
                    let session = me.shake(conn).await;
                    drop(permit);
                    if let Some(session) = session {
                        let _ = tx.send(session).await;
                    }
                });
            }
        });
        let sessions = futures_util::stream::unfold((rx, AbortOnDrop(task)), |(mut rx, t)| async {
            let conn = rx.recv().await?;
            Some((Ok(conn), (rx, t)))
        });
        Ok(Listener::Other(addr, Box::pin(sessions)))
    }

    /// The TLS session over `conn`, or `None` (refused, told).
    async fn shake(&self, conn: Conn) -> Option<Conn> {
        let (local, remote) = conn.addrs();
        let why = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(conn)).await {
            Ok(Ok(session)) => return Some(Conn::new(session, local, remote)),
            Ok(Err(e)) => refusal(&e),
            Err(_) => format!("no handshake within {HANDSHAKE_TIMEOUT:?}"),
        };
        metrics::counter!("boxoffice_tls_handshakes_refused_total", "port" => self.port)
            .increment(1);
        let now = std::time::Instant::now();
        let mut told = self.told.lock().unwrap_or_else(|p| p.into_inner());
        if told.len() > 64 {
            told.retain(|_, t| now.duration_since(*t) < REFUSALS_TOLD_EVERY);
        }
        let last = told.get(&why).copied();
        if last.is_none_or(|t| now.duration_since(t) >= REFUSALS_TOLD_EVERY) {
            told.insert(why.clone(), now);
            let from = remote.map_or_else(|| "?".to_owned(), |r| r.to_string());
            if self.warn {
                tracing::warn!(port = self.port, %from, "refused a TLS handshake: {why}");
            } else {
                tracing::info!(port = self.port, %from, "refused a TLS handshake: {why}");
            }
        }
        None
    }
}

/// Why a handshake failed, told for an operator.
fn refusal(e: &std::io::Error) -> String {
    let rustls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls {
        Some(rustls::Error::NoCertificatesPresented) => {
            "the caller presented no certificate".to_owned()
        }
        Some(e @ rustls::Error::InvalidCertificate(_)) => {
            format!("the caller's certificate is refused: {}", told(e))
        }
        Some(e) => e.to_string(),
        None => e.to_string(),
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A listener for axum of the connections of a [`Listener`] (the HTTP API's, over TLS).
pub(crate) struct AxumListener {
    addr: SocketAddr,
    incoming: crate::net::Incoming,
}

impl AxumListener {
    /// The connections of `listener`.
    pub(crate) fn new(listener: Listener) -> std::io::Result<AxumListener> {
        Ok(AxumListener {
            addr: listener.local_addr()?,
            incoming: listener.incoming(),
        })
    }
}

impl axum::serve::Listener for AxumListener {
    type Io = Conn;
    type Addr = Option<SocketAddr>;

    async fn accept(&mut self) -> (Conn, Option<SocketAddr>) {
        loop {
            match self.incoming.next().await {
                Some(Ok(conn)) => {
                    let remote = conn.addrs().1;
                    return (conn, remote);
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "HTTP API: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // The accept loop is gone only when the listener is dropped.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Option<SocketAddr>> {
        Ok(Some(self.addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA, and a leaf it signed for `names`, valid from `from` for `days` days.
    fn ca_and_leaf(
        dir: &Path,
        names: &[&str],
        from: time::OffsetDateTime,
        days: i64,
    ) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, &ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut leaf =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        leaf.not_before = from;
        leaf.not_after = from + time::Duration::days(days);
        leaf.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        let paths = (
            dir.join("ca.pem"),
            dir.join("cert.pem"),
            dir.join("key.pem"),
        );
        std::fs::write(&paths.0, ca_cert.pem()).unwrap();
        std::fs::write(&paths.1, cert.pem()).unwrap();
        std::fs::write(&paths.2, key.serialize_pem()).unwrap();
        paths
    }

    fn now() -> time::OffsetDateTime {
        time::OffsetDateTime::now_utc() - time::Duration::hours(1)
    }

    #[test]
    fn a_good_pair_loads_on_both_ports() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = ca_and_leaf(dir.path(), &["127.0.0.1"], now(), 30);
        PublicTls::load(&cert, &key, None).unwrap();
        assert!(
            PublicTls::load(&cert, &key, Some(&ca))
                .unwrap()
                .client_certs
        );
        PeerTls::load(&ca, &cert, &key).unwrap();
    }

    #[test]
    fn bad_files_are_refused_with_their_flag_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = ca_and_leaf(dir.path(), &["127.0.0.1"], now(), 30);
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let e = PublicTls::load(&junk, &key, None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("--tls-cert") && e.contains("no certificate"),
            "{e}"
        );
        let e = PublicTls::load(&cert, &junk, None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("--tls-key") && e.contains("no PEM private key"),
            "{e}"
        );
        let e = PeerTls::load(&junk, &cert, &key).err().unwrap().to_string();
        assert!(e.contains("--peer-ca"), "{e}");
        // Another pair's key.
        let other = tempfile::tempdir().unwrap();
        let (_, _, other_key) = ca_and_leaf(other.path(), &["127.0.0.1"], now(), 30);
        let e = format!("{:#}", PeerTls::load(&ca, &cert, &other_key).err().unwrap());
        assert!(e.contains("is not the private key"), "{e}");
        let e = format!(
            "{:#}",
            PublicTls::load(&cert, &key, Some(&junk)).err().unwrap()
        );
        assert!(e.contains("--tls-client-ca"), "{e}");
    }

    #[test]
    fn a_certificate_of_another_cluster_is_refused() {
        let ours = tempfile::tempdir().unwrap();
        let theirs = tempfile::tempdir().unwrap();
        let (ca, _, _) = ca_and_leaf(ours.path(), &["127.0.0.1"], now(), 30);
        let (_, cert, key) = ca_and_leaf(theirs.path(), &["127.0.0.1"], now(), 30);
        let e = PeerTls::load(&ca, &cert, &key).err().unwrap().to_string();
        assert!(e.contains("not signed by this CA"), "{e}");
    }

    #[test]
    fn expired_and_future_certificates_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let long_ago = time::OffsetDateTime::now_utc() - time::Duration::days(60);
        let (ca, cert, key) = ca_and_leaf(dir.path(), &["127.0.0.1"], long_ago, 30);
        let e = PeerTls::load(&ca, &cert, &key).err().unwrap().to_string();
        assert!(e.contains("--peer-cert") && e.contains("expired"), "{e}");
        let e = PublicTls::load(&cert, &key, None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--tls-cert") && e.contains("expired"), "{e}");
        let later = time::OffsetDateTime::now_utc() + time::Duration::days(2);
        let (ca, cert, key) = ca_and_leaf(dir.path(), &["127.0.0.1"], later, 30);
        let e = PeerTls::load(&ca, &cert, &key).err().unwrap().to_string();
        assert!(e.contains("not valid before"), "{e}");
    }
}
