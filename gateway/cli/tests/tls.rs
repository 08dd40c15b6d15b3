//! TLS with real processes (issue 27, point 3): the public ports (gRPC and the HTTP API) over
//! TLS, optional client certificates, and a cluster whose Raft and forwarded calls run only on
//! its peer port over mutual TLS under the cluster's CA, made by `boxoffice cluster certs`.
//!
//! Refused, each with a clear error: a public port's plaintext caller, a forwarded or Raft call
//! on the public port, a public call on the peer port, and on the peer port a caller with no
//! certificate, another cluster's certificate or an expired one; at start, a node whose
//! certificate is another cluster's, has expired, or is not a certificate at all.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use boxoffice_client::{Bearer, Clients};
use boxoffice_gateway::certs::{self, NodeHosts, Validity};
use boxoffice_proto::cluster::RaftMessage;
use boxoffice_proto::cluster::raft_client::RaftClient;
use boxoffice_proto::v1 as pb;
use common::{ADMIN, CLIENT, Layout, Node};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const BIN: &str = env!("CARGO_BIN_EXE_boxoffice");
const SECRET: &str = "cluster-test-secret";

/// `boxoffice cluster certs --out dir --node 1=127.0.0.1 ...` for `ids`.
fn make_certs(dir: &Path, ids: &[u64]) {
    let mut cmd = Command::new(BIN);
    cmd.args(["cluster", "certs", "--out"]).arg(dir);
    for id in ids {
        cmd.args(["--node", &format!("{id}=127.0.0.1")]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "cluster certs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Node `id`'s certificate in `dir`, signed by the CA there, expired 10 days ago.
fn make_expired(dir: &Path, id: u64) {
    let node = NodeHosts {
        id,
        hosts: vec!["127.0.0.1".into()],
    };
    let validity = Validity {
        from: time::OffsetDateTime::now_utc() - time::Duration::days(40),
        days: 30,
    };
    certs::make(dir, &[node], validity).unwrap();
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A lazy channel to `addr` over TLS, trusting `ca`, presenting `identity` (cert, key) if any.
fn tls_channel(addr: &str, ca: &Path, identity: Option<(&Path, &Path)>) -> Channel {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(read(cert), read(key)));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .connect_lazy()
}

fn clients(ch: &Channel) -> Clients {
    Clients::new(ch, &Bearer::new(ADMIN).unwrap())
}

/// Raft's `probe` to `ch`, presenting the cluster secret: what it answered.
async fn probe(ch: Channel) -> Result<(), tonic::Status> {
    let mut req = tonic::Request::new(RaftMessage {
        payload: vec![],
        group: 0,
        groups: 1,
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {SECRET}").parse().unwrap());
    RaftClient::new(ch).probe(req).await.map(|_| ())
}

/// The whole text of a failed call: its status and the errors under it.
fn told(s: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", s.code(), s.message());
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        text.push_str(&format!(" / {e}"));
        source = e.source();
    }
    text
}

/// Whether `s` is a failed connection (the codes tonic gives a transport error: which one
/// depends on when the TLS alert or the broken connection met the call's writes), never an
/// answer of the services.
fn transport_error(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
    ) && s.metadata().get("content-type").is_none()
}

/// Three nodes under `root` whose `--peers` are their peer ports, each with its flags for the
/// peer port's mutual TLS (certificates in `certs`) and the public ports' TLS (the certificate
/// of `public`, another CA's).
struct Cluster {
    layout: Layout,
    peer_addrs: Vec<String>,
    flags: Vec<Vec<String>>,
}

fn cluster(root: &Path, certs: &Path, public: &Path) -> Cluster {
    let mut layout = common::layout(root);
    let logs = root.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    layout.logs = Some(logs);
    let peer_addrs = layout.on_peer_tls(certs);
    let path = |p: PathBuf| p.display().to_string();
    let flags = (0..3)
        .map(|_| {
            vec![
                "--tls-cert".to_owned(),
                path(certs::node_file(public, 1, "pem")),
                "--tls-key".to_owned(),
                path(certs::node_file(public, 1, "key")),
            ]
        })
        .collect();
    Cluster {
        layout,
        peer_addrs,
        flags,
    }
}

impl Cluster {
    fn start(&self, i: usize) -> Node {
        let extra: Vec<&str> = self.flags[i].iter().map(String::as_str).collect();
        self.layout.start_with(i, &extra)
    }
}

/// A fan admitted to `event` holds one place and pays for it, through `c` (each call retried
/// with its idempotency key while it fails transiently).
async fn hold_and_confirm(c: &Clients, event: &str, user: &str) -> pb::Order {
    let token = common::admitted(&mut c.clone(), event, user).await;
    let retries = std::sync::atomic::AtomicU64::new(0);
    let hold = pb::HoldRequest {
        event_id: event.into(),
        user_id: user.into(),
        admission_token: token,
        idempotency_key: format!("hold-{user}"),
        selection: Some(pb::hold_request::Selection::BestAvailable(
            pb::BestAvailable {
                section_id: "ga".into(),
                quantity: 1,
            },
        )),
        access_code: String::new(),
    };
    let one = std::slice::from_ref(c);
    let hold = common::retrying(one, 0, &retries, |mut c| {
        let hold = hold.clone();
        async move { c.booking.hold(hold).await }
    })
    .await
    .unwrap();
    let confirm = pb::ConfirmRequest {
        hold_id: hold.hold_id,
        user_id: user.into(),
        idempotency_key: format!("confirm-{user}"),
        payment_token: "tok_ok".into(),
    };
    common::retrying(one, 0, &retries, |mut c| {
        let confirm = confirm.clone();
        async move { c.booking.confirm(confirm).await }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_on_its_peer_ports_over_mutual_tls_serves_and_refuses_strangers() {
    let root = tempfile::tempdir().unwrap();
    let (certs, public, other) = (
        root.path().join("certs"),
        root.path().join("public"),
        root.path().join("other"),
    );
    make_certs(&certs, &[1, 2, 3]);
    make_certs(&public, &[1]);
    make_certs(&other, &[1]);
    // An expired certificate that the cluster's own CA signed.
    make_expired(&certs, 9);
    let c = cluster(root.path(), &certs, &public);
    let mut nodes: Vec<Node> = (0..3).map(|i| c.start(i)).collect();
    for n in &nodes {
        n.wait_ready();
    }
    let leader = common::leader(&nodes).await;
    let follower = (leader + 1) % 3;
    let public_ca = public.join("ca.pem");
    let via_follower = tls_channel(&c.layout.addrs[follower], &public_ca, None);

    // Public calls over TLS through a follower: forwarded to the leader over the peer port.
    let mut fc = clients(&via_follower);
    fc.events
        .create_event(common::ga_event("tls", 10))
        .await
        .unwrap();
    let order = hold_and_confirm(&fc, "tls", "fan-1").await;
    assert_eq!(order.tickets.len(), 1);

    // The public port speaks TLS only.
    let plain = common::channel(&c.layout.addrs[follower]);
    let e = clients(&plain)
        .events
        .list_events(pb::ListEventsRequest::default())
        .await
        .unwrap_err();
    // A transport error (which one depends on how the bytes met: h2's or the TLS layer's),
    // never an answer of the services.
    assert!(transport_error(&e), "{}", told(&e));

    // Raft and forwarded calls are refused on the public port, even with the secret.
    let e = probe(via_follower.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", told(&e));
    assert!(e.message().contains("peer port"), "{}", told(&e));
    let mut req = tonic::Request::new(pb::GetEventRequest {
        event_id: "tls".into(),
    });
    req.metadata_mut()
        .insert("x-boxoffice-forwarded-from", "2".parse().unwrap());
    req.metadata_mut().insert(
        "x-boxoffice-cluster",
        format!("Bearer {SECRET}").parse().unwrap(),
    );
    let e = fc.events.get_event(req).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", told(&e));

    // The peer port: a node's certificate of this cluster gets through.
    let peer = &c.peer_addrs[follower];
    let ca = certs.join("ca.pem");
    let node_id = |id| {
        (
            certs::node_file(&certs, id, "pem"),
            certs::node_file(&certs, id, "key"),
        )
    };
    let (cert1, key1) = node_id(1);
    probe(tls_channel(peer, &ca, Some((&cert1, &key1))))
        .await
        .unwrap();
    // ... but a public call on it is refused, with the cluster's certificate too.
    let e = clients(&tls_channel(peer, &ca, Some((&cert1, &key1))))
        .events
        .list_events(pb::ListEventsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", told(&e));
    // No certificate, another cluster's, an expired one: the handshake fails.
    let (cert9, key9) = node_id(9);
    let (other_cert, other_key) = (
        certs::node_file(&other, 1, "pem"),
        certs::node_file(&other, 1, "key"),
    );
    for (what, ch) in [
        ("no certificate", tls_channel(peer, &ca, None)),
        (
            "another cluster's certificate",
            tls_channel(peer, &ca, Some((&other_cert, &other_key))),
        ),
        (
            "an expired certificate",
            tls_channel(peer, &ca, Some((&cert9, &key9))),
        ),
    ] {
        let e = probe(ch).await.unwrap_err();
        // The caller sees the connection fail (how depends on when the alert meets its
        // writes); the node says why.
        assert!(transport_error(&e), "{what}: {}", told(&e));
    }
    let log = c
        .layout
        .logs
        .as_ref()
        .unwrap()
        .join(format!("node{}.log", follower + 1));
    for says in [
        "presented no certificate",
        "not signed by this CA",
        "has expired",
    ] {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains(says) && text.contains("refused a TLS handshake") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the node's log does not say {says:?}:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Raft runs over the peer ports: the leader killed, the others elect one and go on.
    nodes[leader].kill9();
    let live: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    common::leader(&nodes).await;
    let sc = clients(&tls_channel(&c.layout.addrs[live[0]], &public_ca, None));
    let retries = std::sync::atomic::AtomicU64::new(0);
    common::retrying(std::slice::from_ref(&sc), 0, &retries, |mut c| async move {
        c.events
            .get_event(pb::GetEventRequest {
                event_id: "tls".into(),
            })
            .await
    })
    .await
    .unwrap();
    let mut sc = clients(&tls_channel(&c.layout.addrs[live[0]], &public_ca, None));
    let order2 = hold_and_confirm(&sc, "tls", "fan-2").await;
    assert_eq!(order2.tickets.len(), 1);
    let got = sc
        .booking
        .get_order(pb::GetOrderRequest {
            order_id: order.order_id.clone(),
            user_id: "fan-1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(common::codes(&got), common::codes(&order));
    for i in live {
        nodes[i].terminate();
    }
}

/// `boxoffice serve` with `flags` exits at once: its status and stderr.
fn refused_start(root: &Path, flags: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(root.join("refused"))
        .args(flags)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_certificates_stop_a_start_with_their_flag_and_reason() {
    let root = tempfile::tempdir().unwrap();
    let (certs, other) = (root.path().join("certs"), root.path().join("other"));
    make_certs(&certs, &[1]);
    make_certs(&other, &[1]);
    make_expired(&certs, 9);
    let junk = root.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let secret = root.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let p = |p: PathBuf| p.display().to_string();
    let ca = p(certs.join("ca.pem"));
    let cluster = |cert: String, key: String| -> Vec<String> {
        [
            "--node-id",
            "1",
            "--peers",
            "1=127.0.0.1:1",
            "--cluster-secret-file",
            &p(secret.clone()),
            "--admin-key",
            ADMIN,
            "--client-key",
            CLIENT,
            "--token-secret",
            "t",
            "--peer-listen",
            "127.0.0.1:0",
            "--peer-ca",
            &ca,
            "--peer-cert",
            &cert,
            "--peer-key",
            &key,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    // The peer flags with node `id`'s certificate and key in `dir`.
    let pair = |dir: &Path, id: u64| {
        cluster(
            p(certs::node_file(dir, id, "pem")),
            p(certs::node_file(dir, id, "key")),
        )
    };
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "another cluster's certificate",
            pair(&other, 1),
            "not signed by this CA",
        ),
        ("an expired certificate", pair(&certs, 9), "expired"),
        (
            "a key of another certificate",
            cluster(
                p(certs::node_file(&certs, 1, "pem")),
                p(certs::node_file(&certs, 9, "key")),
            ),
            "is not the private key",
        ),
        (
            "a file that is no certificate",
            vec![
                "--tls-cert".into(),
                p(junk.clone()),
                "--tls-key".into(),
                p(certs::node_file(&certs, 1, "key")),
            ],
            "--tls-cert",
        ),
        (
            "a cluster node with public TLS and no peer port",
            vec![
                "--node-id".into(),
                "1".into(),
                "--peers".into(),
                "1=127.0.0.1:1".into(),
                "--cluster-secret-file".into(),
                p(secret.clone()),
                "--admin-key".into(),
                ADMIN.into(),
                "--client-key".into(),
                CLIENT.into(),
                "--token-secret".into(),
                "t".into(),
                "--tls-cert".into(),
                p(certs::node_file(&certs, 1, "pem")),
                "--tls-key".into(),
                p(certs::node_file(&certs, 1, "key")),
            ],
            "needs --peer-listen",
        ),
        (
            "a peer port without its certificates",
            vec![
                "--node-id".into(),
                "1".into(),
                "--peer-listen".into(),
                "127.0.0.1:0".into(),
            ],
            "--peer-ca",
        ),
    ];
    for (what, flags, says) in cases {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let (code, stderr) = refused_start(root.path(), &flags);
        assert_eq!(code, Some(2), "{what}: {stderr}");
        assert!(stderr.contains(says), "{what}: {stderr}");
    }
    assert!(
        !root.path().join("refused").exists(),
        "a refused start made its data dir"
    );
}

/// GET `path` over HTTPS from `addr`, trusting `ca`, presenting `identity` (cert, key) if any:
/// the status and body, or what failed.
async fn https_get(
    addr: &str,
    path: &str,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<(u16, String), String> {
    use http_body_util::BodyExt;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    #[allow(deprecated)] // ring, as the server (see boxoffice_gateway::tls)
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        None => config.with_no_client_auth(),
        Some((cert, key)) => config
            .with_client_auth_cert(
                rustls::pki_types::CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .map(Result::unwrap)
                    .collect(),
                rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
    };
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
            tcp,
        )
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP/1.1: {e}"))?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", addr)
        .header("authorization", format!("Bearer {ADMIN}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_serves_grpc_and_http_over_tls_and_can_require_client_certificates() {
    let root = tempfile::tempdir().unwrap();
    let (server, clients_ca) = (root.path().join("server"), root.path().join("clients"));
    make_certs(&server, &[1]);
    make_certs(&clients_ca, &[1, 2]);
    let (grpc, http, metrics) = (
        format!("127.0.0.1:{}", common::free_port()),
        format!("127.0.0.1:{}", common::free_port()),
        format!("127.0.0.1:{}", common::free_port()),
    );
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .args(["--listen", &grpc, "--metrics-listen", &metrics])
        .args(["--http-listen", &http])
        .arg("--data-dir")
        .arg(root.path().join("data"))
        .args([
            "--admin-key",
            ADMIN,
            "--client-key",
            CLIENT,
            "--token-secret",
            "t",
        ])
        .arg("--tls-cert")
        .arg(certs::node_file(&server, 1, "pem"))
        .arg("--tls-key")
        .arg(certs::node_file(&server, 1, "key"))
        .arg("--tls-client-ca")
        .arg(clients_ca.join("ca.pem"))
        .stderr(Stdio::null());
    let mut node = Node::spawn(1, &metrics, &mut cmd);
    node.wait_ready();
    let ca = server.join("ca.pem");
    let (cert, key) = (
        certs::node_file(&clients_ca, 2, "pem"),
        certs::node_file(&clients_ca, 2, "key"),
    );
    // With a client certificate the CA signed: served.
    let mut c = clients(&tls_channel(&grpc, &ca, Some((&cert, &key))));
    c.events
        .create_event(common::ga_event("e", 5))
        .await
        .unwrap();
    // Without one: refused at the handshake.
    let e = clients(&tls_channel(&grpc, &ca, None))
        .events
        .list_events(pb::ListEventsRequest::default())
        .await
        .unwrap_err();
    assert!(transport_error(&e), "{}", told(&e));
    // The HTTP API is TLS too, with the same client certificates.
    let (status, body) = https_get(&http, "/v1/events", &ca, Some((&cert, &key)))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"e\""), "{body}");
    let e = https_get(&http, "/v1/events", &ca, None).await.unwrap_err();
    assert!(!e.is_empty());
    let (other_cert, other_key) = (
        certs::node_file(&server, 1, "pem"),
        certs::node_file(&server, 1, "key"),
    );
    https_get(&http, "/v1/events", &ca, Some((&other_cert, &other_key)))
        .await
        .unwrap_err();
    // Plain HTTP on it gets no answer.
    let plain = http_plain(&http).await;
    assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
    node.terminate();
}

/// GET /v1/events in plain HTTP/1.1 from `addr`: the status, or what failed.
async fn http_plain(addr: &str) -> Result<u16, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get("/v1/events")
        .header("host", addr)
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .map_err(|_| "no answer".to_owned())?
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string())
}
