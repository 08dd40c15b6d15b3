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
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// How long a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
        .map_err(|e| anyhow!("{key_flag} is not the private key of {cert_flag}'s certificate ({e})"))
}

/// The CA certificates of `certs` as a root store.
fn roots(flag: &str, path: &Path, certs: &Certs) -> anyhow::Result<Arc<rustls::RootCertStore>> {
    let mut roots = rustls::RootCertStore::empty();
    for der in &certs.ders {
        roots
            .add(der.clone())
            .map_err(|e| anyhow!("{flag} {}: not a usable CA certificate ({e})", path.display()))?;
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

/// TLS on the public ports: gRPC's config, and the HTTP API's acceptor.
pub struct PublicTls {
    grpc: ServerTlsConfig,
    http: tokio_rustls::TlsAcceptor,
    /// Whether clients must present a certificate (`--tls-client-ca`).
    pub client_certs: bool,
}

impl PublicTls {
    /// Reads and checks `cert` (`--tls-cert`, the chain, leaf first), `key` (`--tls-key`) and,
    /// if given, `client_ca` (`--tls-client-ca`: clients must present a certificate it signed).
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> anyhow::Result<PublicTls> {
        let certs = read_certs("--tls-cert", cert)?;
        let (key_pem, key_der) = read_key("--tls-key", key)?;
        check_pair("--tls-cert", &certs, "--tls-key", &key_der)?;
        let mut grpc = ServerTlsConfig::new()
            .identity(Identity::from_pem(&certs.pem, &key_pem))
            .timeout(HANDSHAKE_TIMEOUT);
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let builder = match client_ca {
            Some(ca) => {
                let ca_certs = read_certs("--tls-client-ca", ca)?;
                let roots = roots("--tls-client-ca", ca, &ca_certs)?;
                grpc = grpc.client_ca_root(Certificate::from_pem(&ca_certs.pem));
                builder.with_client_cert_verifier(client_verifier(roots)?)
            }
            None => builder.with_no_client_auth(),
        };
        let mut http = builder
            .with_single_cert(certs.ders, key_der)
            .context("--tls-cert / --tls-key")?;
        http.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(PublicTls {
            grpc,
            http: tokio_rustls::TlsAcceptor::from(Arc::new(http)),
            client_certs: client_ca.is_some(),
        })
    }

    /// The gRPC server's TLS config.
    pub fn grpc(&self) -> ServerTlsConfig {
        self.grpc.clone()
    }
}

/// Mutual TLS on the peer port, under the cluster's CA: the config a node serves its peers
/// with, and the one it reaches them with.
pub struct PeerTls {
    server: ServerTlsConfig,
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
        client_verifier(roots)?
            .verify_client_cert(leaf, chain, UnixTime::now())
            .map_err(|e| {
                anyhow!(
                    "--peer-cert {} is refused by --peer-ca {}: {}",
                    cert.display(),
                    ca.display(),
                    told(&e)
                )
            })?;
        let identity = Identity::from_pem(&certs.pem, &key_pem);
        let ca_root = Certificate::from_pem(&ca_certs.pem);
        Ok(PeerTls {
            server: ServerTlsConfig::new()
                .identity(identity.clone())
                .client_ca_root(ca_root.clone())
                .timeout(HANDSHAKE_TIMEOUT),
            client: ClientTlsConfig::new()
                .ca_certificate(ca_root)
                .identity(identity)
                .timeout(HANDSHAKE_TIMEOUT),
        })
    }

    /// The peer port's server config (client certificates required).
    pub fn server(&self) -> ServerTlsConfig {
        self.server.clone()
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

/// A listener whose connections are TLS sessions, for the HTTP API (axum's [`Listener`]):
/// handshakes run beside the accept loop, so a slow client holds up no one else.
///
/// [`Listener`]: axum::serve::Listener
pub struct TlsListener {
    addr: SocketAddr,
    sessions: mpsc::Receiver<(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr)>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Sessions of `tls` over the connections of `listener`.
    pub fn new(listener: TcpListener, tls: &PublicTls) -> std::io::Result<TlsListener> {
        let addr = listener.local_addr()?;
        let acceptor = tls.http.clone();
        let (tx, sessions) = mpsc::channel(64);
        let task = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "HTTP API: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(session)) => {
                            let _ = tx.send((session, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "HTTP API: TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "HTTP API: TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            addr,
            sessions,
            task,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.sessions.recv().await {
            Some(s) => s,
            // The accept loop is gone only when the listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
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
        let paths = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
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
        assert!(PublicTls::load(&cert, &key, Some(&ca)).unwrap().client_certs);
        PeerTls::load(&ca, &cert, &key).unwrap();
    }

    #[test]
    fn bad_files_are_refused_with_their_flag_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = ca_and_leaf(dir.path(), &["127.0.0.1"], now(), 30);
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let e = PublicTls::load(&junk, &key, None).err().unwrap().to_string();
        assert!(e.contains("--tls-cert") && e.contains("no certificate"), "{e}");
        let e = PublicTls::load(&cert, &junk, None).err().unwrap().to_string();
        assert!(e.contains("--tls-key") && e.contains("no PEM private key"), "{e}");
        let e = PeerTls::load(&junk, &cert, &key).err().unwrap().to_string();
        assert!(e.contains("--peer-ca"), "{e}");
        // Another pair's key.
        let other = tempfile::tempdir().unwrap();
        let (_, _, other_key) = ca_and_leaf(other.path(), &["127.0.0.1"], now(), 30);
        let e = format!("{:#}", PeerTls::load(&ca, &cert, &other_key).err().unwrap());
        assert!(e.contains("is not the private key"), "{e}");
        let e = format!("{:#}", PublicTls::load(&cert, &key, Some(&junk)).err().unwrap());
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
        let e = PublicTls::load(&cert, &key, None).err().unwrap().to_string();
        assert!(e.contains("--tls-cert") && e.contains("expired"), "{e}");
        let later = time::OffsetDateTime::now_utc() + time::Duration::days(2);
        let (ca, cert, key) = ca_and_leaf(dir.path(), &["127.0.0.1"], later, 30);
        let e = PeerTls::load(&ca, &cert, &key).err().unwrap().to_string();
        assert!(e.contains("not valid before"), "{e}");
    }
}
