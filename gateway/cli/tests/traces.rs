//! Distributed traces (issue 31): three `boxoffice serve` processes, their Raft and forwarded
//! calls on the peer port over mutual TLS, each exporting its spans over OTLP/gRPC to a
//! receiver inside this test (built from the OpenTelemetry proto crate's collector service).
//! A hold sent to a follower with a W3C `traceparent` is one trace across the nodes: the
//! follower's gate and forwarding, the leader's gate, the engine's hold, ledger, section and its
//! decision, the group commit, its replication, the appends sent to the followers and received
//! by them, and the acker, each span's parent the one before it. The same over the HTTP API.
//! The nodes run two Raft groups and sample at a ratio of 0: a call without a context, with an
//! unsampled one, or from a caller without a key, sends no span at all (parent-based sampling).
//! A single node's trace has the group commit's fsync and the acker inside the group commit.
//!
//! `BOXOFFICE_TRACE_DUMP=FILE` writes the gRPC hold's trace as text (docs/traces/).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boxoffice_client::{Bearer, Clients};
use boxoffice_proto::v1 as pb;
use common::{ADMIN, CLIENT, admitted, channel, ga_event, layout, leader_of};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};

/// One span as received: the node that sent it (`service.instance.id`) and its fields.
#[derive(Clone, Debug)]
struct Got {
    node: String,
    name: String,
    trace: String,
    id: String,
    parent: String,
    start_ns: u64,
    end_ns: u64,
    attributes: BTreeMap<String, String>,
    links: usize,
}

/// The OTLP receiver: every span exported to it.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Got>>>);

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.0.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let resource = rs
                .resource
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            let node = resource
                .get("service.instance.id")
                .cloned()
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(Got {
                        node: node.clone(),
                        name: s.name,
                        trace: hex(&s.trace_id),
                        id: hex(&s.span_id),
                        parent: hex(&s.parent_span_id),
                        start_ns: s.start_time_unix_nano,
                        end_ns: s.end_time_unix_nano,
                        attributes: attributes(&s.attributes),
                        links: s.links.len(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl Receiver {
    /// Serves on a free loopback port; its address.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(self.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        format!("http://{addr}")
    }

    fn of(&self, trace: &str) -> Vec<Got> {
        let got = self.0.lock().unwrap();
        got.iter().filter(|s| s.trace == trace).cloned().collect()
    }

    fn all(&self) -> Vec<Got> {
        self.0.lock().unwrap().clone()
    }

    /// The spans of `trace` once `done` says they are all there (30 s at most).
    async fn until(&self, trace: &str, done: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.of(trace);
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "the spans of trace {trace} did not all arrive: {}",
                tree(&spans, "")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A trace context as a caller sends it: version 00, trace, parent span, flags (01: sampled).
fn traceparent(trace: &str, parent: &str, sampled: bool) -> String {
    format!("00-{trace}-{parent}-{}", if sampled { "01" } else { "00" })
}

/// Sends `req` in `trace`, as a child of the caller's span `parent`.
fn in_trace<T>(req: &mut tonic::Request<T>, trace: &str, parent: &str, sampled: bool) {
    let value = traceparent(trace, parent, sampled).parse().unwrap();
    req.metadata_mut().insert("traceparent", value);
}

/// The one span of `trace` named `name` on `node`, whose parent is `parent`.
fn child<'a>(spans: &'a [Got], node: &str, name: &str, parent: &str) -> &'a Got {
    let found: Vec<&Got> = spans
        .iter()
        .filter(|s| s.node == node && s.name == name && s.parent == parent)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one span {name} on node {node} under {parent}:\n{}",
        tree(spans, "")
    );
    found[0]
}

/// Whether `s` descends from `root`.
fn under_root(spans: &[Got], s: &Got, root: &str) -> bool {
    let mut at = s;
    for _ in 0..spans.len() {
        if at.parent == root {
            return true;
        }
        match spans.iter().find(|p| p.id == at.parent) {
            Some(p) => at = p,
            None => return false,
        }
    }
    false
}

/// The spans under `root` (a span id; the caller's for the whole trace), as an indented tree:
/// node, name, duration, attributes.
fn tree(spans: &[Got], root: &str) -> String {
    fn walk(spans: &[Got], parent: &str, depth: usize, t0: u64, out: &mut String) {
        let mut under: Vec<&Got> = spans.iter().filter(|s| s.parent == parent).collect();
        under.sort_by_key(|s| s.start_ns);
        for s in under {
            let attrs = s
                .attributes
                .iter()
                .filter(|(k, _)| !k.starts_with("busy_ns") && !k.starts_with("idle_ns"))
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ");
            let links = if s.links > 0 {
                format!(" links={}", s.links)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "{:>9.3} ms {:>8.3} ms  node {}  {}{}  [{attrs}]{links}",
                s.start_ns.saturating_sub(t0) as f64 / 1e6,
                s.end_ns.saturating_sub(s.start_ns) as f64 / 1e6,
                s.node,
                "  ".repeat(depth),
                s.name,
            );
            walk(spans, &s.id, depth + 1, t0, out);
        }
    }
    let t0 = spans.iter().map(|s| s.start_ns).min().unwrap_or(0);
    let mut out = String::from("   start     length   node  span  [attributes]\n");
    walk(spans, root, 0, t0, &mut out);
    for s in spans {
        if !out.contains(&s.id) && !under_root(spans, s, root) {
            let _ = writeln!(out, "not under the root: {s:?}");
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_sent_to_a_follower_is_one_trace_across_the_nodes() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let tmp = tempfile::tempdir().unwrap();
    let mut lay = layout(tmp.path());
    lay.on_peer_tls(&tmp.path().join("certs"));
    // Spans leave each node within a tenth of a second (OTEL_BSP_SCHEDULE_DELAY, read by the
    // OpenTelemetry SDK).
    lay.env = vec![("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into())];
    let http: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", common::free_port()))
        .collect();
    let mut nodes: Vec<common::Node> = (0..3)
        .map(|i| {
            lay.start_with(
                i,
                &[
                    "--otlp-endpoint",
                    &endpoint,
                    "--otlp-sample-ratio",
                    "0",
                    "--http-listen",
                    &http[i],
                    "--groups",
                    "2",
                ],
            )
        })
        .collect();
    for n in &nodes {
        n.wait_ready();
    }
    // The event's group's leader: traced batches of two groups are in flight at once, their
    // streams of the same names (`changes`, `ledger/N`, ...).
    let g = boxoffice_gateway::node::forward::group_of_event("traced", 2);
    let l = leader_of(&nodes, g).await;
    let f = (l + 1) % 3;
    let (leader_node, follower_node) = ((l + 1).to_string(), (f + 1).to_string());
    let admin = Clients::new(&channel(&lay.addrs[f]), &Bearer::new(ADMIN).unwrap());
    let mut client = Clients::new(&channel(&lay.addrs[f]), &Bearer::new(CLIENT).unwrap());
    admin
        .events
        .clone()
        .create_event(ga_event("traced", 100))
        .await
        .unwrap();
    let mut tokens = Vec::new();
    for fan in 0..4 {
        tokens.push(admitted(&mut client, "traced", &format!("fan-{fan}")).await);
    }

    // 1. A hold over gRPC, to a follower, in the caller's trace.
    let (trace, caller) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let mut req = tonic::Request::new(boxoffice_tests::best_available(
        "traced",
        "fan-0",
        &tokens[0],
        "ga",
        2,
        "traced-hold-0",
    ));
    // With a deadline: the gate runs the call on a task of its own, in the call's span.
    req.set_timeout(Duration::from_secs(20));
    in_trace(&mut req, trace, caller, true);
    let held = client.booking.hold(req).await.unwrap().into_inner();
    assert_eq!(held.quantity, 2);

    let spans = receiver
        .until(trace, |s| {
            s.iter().any(|s| s.name == "ack")
                && s.iter().any(|s| s.name == "raft.append")
                && s.iter().any(|s| s.name == "gate" && s.parent == caller)
        })
        .await;
    // Every span of the hold carries the caller's trace id (`until` took them by it), on two
    // nodes at least: the follower asked, the leader decided.
    let gate = child(&spans, &follower_node, "gate", caller);
    assert_eq!(gate.attributes["rpc.method"], "Hold");
    assert_eq!(gate.attributes["rpc.grpc.status_code"], "OK");
    let forward = child(&spans, &follower_node, "forward", &gate.id);
    assert_eq!(forward.attributes["leader"], leader_node);
    assert_eq!(forward.attributes["group"], g.to_string());
    let lead = child(&spans, &leader_node, "gate", &forward.id);
    let hold = child(&spans, &leader_node, "engine.hold", &lead.id);
    child(&spans, &leader_node, "ledger.begin", &hold.id);
    let section = child(&spans, &leader_node, "section", &hold.id);
    assert_eq!(section.attributes["event"], "traced");
    let decide = child(&spans, &leader_node, "section.decide", &section.id);
    assert_eq!(decide.attributes["placed"], "1");
    let commit = child(&spans, &leader_node, "group_commit", &section.id);
    assert!(commit.attributes["records"].parse::<u64>().unwrap() >= 1);
    let replication = child(&spans, &leader_node, "replication", &commit.id);
    child(&spans, &leader_node, "ack", &commit.id);
    // The appends that carried the group commit, sent by the leader and received by the
    // followers, in the same trace.
    let sent: Vec<&Got> = spans
        .iter()
        .filter(|s| s.name == "raft.append_entries" && s.parent == replication.id)
        .collect();
    assert!(!sent.is_empty(), "{}", tree(&spans, caller));
    let received: Vec<&Got> = spans
        .iter()
        .filter(|s| s.name == "raft.append" && sent.iter().any(|a| a.id == s.parent))
        .collect();
    assert!(!received.is_empty(), "{}", tree(&spans, caller));
    assert!(received.iter().all(|s| s.node != leader_node));
    // The leader's call lies within the follower's forwarding (clocks of one machine).
    assert!(lead.start_ns >= forward.start_ns && lead.end_ns <= forward.end_ns);
    let dump = tree(&spans, caller);
    println!("{dump}");
    if let Some(file) = std::env::var_os("BOXOFFICE_TRACE_DUMP") {
        std::fs::write(file, &dump).unwrap();
    }

    // 2. The same over the HTTP API.
    let (trace_http, caller_http) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let parent = traceparent(trace_http, caller_http, true);
    let web = boxoffice_tests::http::Http::new(http[f].parse().unwrap(), Some(CLIENT));
    let answer = web
        .post(
            "/v1/holds",
            &[
                ("traceparent", &parent),
                ("idempotency-key", "traced-hold-1"),
            ],
            &serde_json::json!({"eventId": "traced", "userId": "fan-1",
                "admissionToken": tokens[1], "sectionId": "ga", "quantity": 1}),
        )
        .await;
    assert!(answer.status.is_success(), "{answer:?}");
    let spans = receiver
        .until(trace_http, |s| s.iter().any(|s| s.name == "ack"))
        .await;
    let call = child(&spans, &follower_node, "http", caller_http);
    assert_eq!(call.attributes["http.route"], "/v1/holds");
    let forward = child(&spans, &follower_node, "forward", &call.id);
    let lead = child(&spans, &leader_node, "gate", &forward.id);
    child(&spans, &leader_node, "engine.hold", &lead.id);
    assert_eq!(call.attributes["http.response.status_code"], "201");
    // A read names its route's pattern, not the hold's id.
    let (trace_read, caller_read) = ("5ea7f2e4c1d24b6c9a0e11d6c0ffee01", "c0ffee0000000001");
    let parent = traceparent(trace_read, caller_read, true);
    let path = format!("/v1/holds/{}?userId=fan-0", held.hold_id);
    let answer = web.get(&path, &[("traceparent", &parent)]).await;
    assert!(answer.status.is_success(), "{answer:?}");
    let spans = receiver
        .until(trace_read, |s| s.iter().any(|s| s.name == "gate"))
        .await;
    let call = child(&spans, &follower_node, "http", caller_read);
    assert_eq!(call.attributes["http.route"], "/v1/holds/{hold_id}");

    // 3. Parent-based sampling at a ratio of 0: a call whose caller sent an unsampled context,
    // or none, leaves no span.
    let unsampled = "11111111111111111111111111111111";
    let mut req = tonic::Request::new(boxoffice_tests::best_available(
        "traced",
        "fan-2",
        &tokens[2],
        "ga",
        1,
        "traced-hold-2",
    ));
    in_trace(&mut req, unsampled, caller, false);
    client.booking.hold(req).await.unwrap();
    client
        .booking
        .hold(boxoffice_tests::best_available(
            "traced",
            "fan-3",
            &tokens[3],
            "ga",
            1,
            "traced-hold-3",
        ))
        .await
        .unwrap();
    // A caller without a key cannot have the server trace its call: its context is ignored.
    let anonymous = boxoffice_tests::http::Http::new(http[f].parse().unwrap(), None);
    let forced = "44444444444444444444444444444444";
    let answer = anonymous
        .get(
            "/v1/events/traced",
            &[("traceparent", &traceparent(forced, caller, true))],
        )
        .await;
    assert_eq!(answer.status.as_u16(), 401, "{answer:?}");
    // A sampled call made after both, whose spans are seen: theirs would have left by then.
    let (last, last_caller) = ("22222222222222222222222222222222", "3333333333333333");
    let mut req = tonic::Request::new(pb::GetEventRequest {
        event_id: "traced".into(),
    });
    in_trace(&mut req, last, last_caller, true);
    client.events.get_event(req).await.unwrap();
    receiver
        .until(last, |s| s.iter().any(|s| s.parent == last_caller))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let strays: Vec<Got> = receiver
        .all()
        .into_iter()
        .filter(|s| ![trace, trace_http, trace_read, last].contains(&s.trace.as_str()))
        .collect();
    assert!(strays.is_empty(), "spans not sampled: {strays:#?}");
    for n in &mut nodes {
        n.terminate();
    }
}

/// A single node: the group commit's fsync and the acker, each inside the group commit, which
/// ends once the acker is done (not when its first part does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_nodes_hold_shows_its_fsync_and_acker_inside_its_group_commit() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let tmp = tempfile::tempdir().unwrap();
    let mut lay = layout(tmp.path());
    lay.env = vec![("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into())];
    let mut node = lay.start_single_with(0, &["--otlp-endpoint", &endpoint]);
    node.wait_ready();
    let admin = Clients::new(&channel(&lay.addrs[0]), &Bearer::new(ADMIN).unwrap());
    let mut client = Clients::new(&channel(&lay.addrs[0]), &Bearer::new(CLIENT).unwrap());
    admin
        .events
        .clone()
        .create_event(ga_event("single", 10))
        .await
        .unwrap();
    let token = admitted(&mut client, "single", "fan-0").await;
    let (trace, caller) = ("6f2b0d8e9a3c4b5d8e7f6a5b4c3d2e1f", "1234567890abcdef");
    let mut req = tonic::Request::new(boxoffice_tests::best_available(
        "single",
        "fan-0",
        &token,
        "ga",
        1,
        "single-hold",
    ));
    in_trace(&mut req, trace, caller, true);
    client.booking.hold(req).await.unwrap();
    let spans = receiver
        .until(trace, |s| s.iter().any(|s| s.name == "ack"))
        .await;
    let gate = child(&spans, "", "gate", caller);
    let hold = child(&spans, "", "engine.hold", &gate.id);
    let section = child(&spans, "", "section", &hold.id);
    let commit = child(&spans, "", "group_commit", &section.id);
    let fsync = child(&spans, "", "fsync", &commit.id);
    let ack = child(&spans, "", "ack", &commit.id);
    assert!(fsync.end_ns <= ack.start_ns, "{}", tree(&spans, caller));
    assert!(
        commit.end_ns >= ack.end_ns && commit.start_ns <= fsync.start_ns,
        "{}",
        tree(&spans, caller)
    );
    assert!(!spans.iter().any(|s| s.name == "replication"));
    node.terminate();
}
