//! The metrics endpoint as an SRE's Prometheus meets it: a real server in a process of its own
//! (the recorder is process-global: no other test's traffic shows in its numbers), scraped over
//! HTTP before any traffic and after a few calls, some refused. Every family has HELP and TYPE;
//! the families known up front are there at 0 before the first call; a refusal is counted by
//! its reason (SOLD_OUT, SEAT_UNAVAILABLE and PAYMENT_DECLINED apart, although all three are
//! FAILED_PRECONDITION); and `promtool check metrics` (Prometheus's own linter) finds no
//! problem. Without promtool on PATH that last check is skipped, saying so on stderr (it fails
//! instead when `BOXOFFICE_REQUIRE_PROMTOOL` is set, as `.ci/run` does where it can install it).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use boxoffice_engine::{EventId, ManualClock};
use boxoffice_gateway::metrics::{FAMILIES, Series};
use boxoffice_proto::v1 as pb;
use boxoffice_tests::server_process::ServerProcess;
use boxoffice_tests::wait::{PATIENCE, periodic_check};
use boxoffice_tests::{T0_MS, any_section, child_bin};
use tonic::Code;

use crate::grpc::{admitted_all, best, event, ga, get_raw, reserved, scrape, seats};

/// One scrape, parsed: HELP and TYPE by family, and every sample.
struct Scraped {
    text: String,
    help: HashMap<String, String>,
    types: HashMap<String, String>,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

/// `name{k="v",...} value` -> (name, labels, value).
fn sample(line: &str) -> (String, BTreeMap<String, String>, f64) {
    let (series, value) = line.rsplit_once(' ').unwrap();
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().unwrap_or_else(|_| panic!("a number in {line:?}")),
    };
    let Some((name, rest)) = series.split_once('{') else {
        return (series.to_owned(), BTreeMap::new(), value);
    };
    let mut labels = BTreeMap::new();
    let mut rest = rest.strip_suffix('}').unwrap();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").unwrap();
        let end = after.find('"').unwrap();
        labels.insert(key.to_owned(), after[..end].to_owned());
        rest = after[end + 1..].trim_start_matches(',');
    }
    (name.to_owned(), labels, value)
}

impl Scraped {
    fn parse(text: String) -> Scraped {
        let (mut help, mut types, mut samples) = (HashMap::new(), HashMap::new(), Vec::new());
        for line in text.lines().filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, text) = rest.split_once(' ').unwrap();
                help.insert(name.to_owned(), text.to_owned());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                types.insert(name.to_owned(), kind.to_owned());
            } else {
                assert!(!line.starts_with('#'), "{line}");
                samples.push(sample(line));
            }
        }
        Scraped {
            text,
            help,
            types,
            samples,
        }
    }

    /// The family a sample belongs to (`x_bucket`, `x_sum`, `x_count` of a histogram `x`).
    fn family_of<'a>(&self, name: &'a str) -> &'a str {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix)
                && self.types.get(base).map(String::as_str) == Some("histogram")
            {
                return base;
            }
        }
        name
    }

    /// The value of the first sample of `name` with (at least) these labels.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| *v)
    }

    /// Every family has a HELP (not empty) and a TYPE, and every sample belongs to one.
    fn assert_described(&self) {
        for (name, kind) in &self.types {
            let help = self.help.get(name).map(String::as_str).unwrap_or("");
            assert!(!help.trim().is_empty(), "{name} ({kind}) has no HELP");
        }
        for name in self.help.keys() {
            assert!(self.types.contains_key(name), "{name} has no TYPE");
        }
        for (name, _, _) in &self.samples {
            let family = self.family_of(name);
            assert!(self.types.contains_key(family), "{name} has no TYPE");
        }
    }
}

/// `promtool check metrics` finds no problem in `text` (skipped, saying so, without promtool).
fn promtool_finds_no_problem(what: &str, text: &str) {
    let skipped = format!("the `promtool check metrics` of {what}");
    if let Some((ok, printed)) =
        boxoffice_tests::promtool::run_or_skip(&["check", "metrics"], None, text, &skipped)
    {
        assert!(
            ok && printed.trim().is_empty(),
            "promtool check metrics on {what}: {printed}\n--- the scrape:\n{text}"
        );
    }
}

async fn scraped(server: &ServerProcess) -> Scraped {
    Scraped::parse(scrape(server.metrics_addr().unwrap()).await)
}

/// `counter` went up by exactly `by` between two scrapes.
fn went_up(before: &Scraped, after: &Scraped, name: &str, labels: &[(&str, &str)], by: f64) {
    let b = before.value(name, labels).unwrap_or_else(|| {
        panic!(
            "{name}{labels:?} is not there before\n{}",
            before
                .text
                .lines()
                .filter(|l| l.starts_with(name))
                .collect::<Vec<_>>()
                .join("\n")
        )
    });
    let a = after.value(name, labels).unwrap();
    assert_eq!(a - b, by, "{name}{labels:?}: {b} then {a}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrape_follows_prometheus_conventions_and_counts_refusals_by_reason() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with_metrics(child_bin!(), dir.path())
        .await
        .unwrap();

    // A fresh server, before any call.
    let fresh = scraped(&server).await;
    fresh.assert_described();
    for f in FAMILIES {
        if matches!(f.series, Series::One | Series::Sets(_)) {
            assert_eq!(
                fresh.types.get(f.name).map(String::as_str),
                Some(f.kind.as_str()),
                "{} is there from the start, as a {}",
                f.name,
                f.kind.as_str()
            );
        }
    }
    let zero = |name: &str, labels: &[(&str, &str)]| {
        assert_eq!(
            fresh.value(name, labels),
            Some(0.0),
            "{name}{labels:?} at 0"
        );
    };
    for (method, code, reason) in [
        ("Hold", "FAILED_PRECONDITION", "SOLD_OUT"),
        ("Hold", "FAILED_PRECONDITION", "SEAT_UNAVAILABLE"),
        ("Confirm", "FAILED_PRECONDITION", "PAYMENT_DECLINED"),
        ("Hold", "RESOURCE_EXHAUSTED", "OVERLOADED"),
        ("GetEvent", "UNAUTHENTICATED", "none"),
        ("Hold", "OK", "none"),
    ] {
        let labels = [("method", method), ("code", code), ("reason", reason)];
        zero("boxoffice_rpc_handled_total", &labels);
    }
    zero(
        "boxoffice_rpc_duration_seconds_count",
        &[("method", "Hold"), ("code", "OK"), ("reason", "none")],
    );
    zero("boxoffice_rpc_in_flight", &[]);
    zero("boxoffice_sweeper_backlog_holds", &[]);
    zero("boxoffice_gateway_shed_total", &[("scope", "gate")]);
    zero("boxoffice_engine_shed_total", &[("scope", "section")]);
    zero(
        "boxoffice_engine_actor_restarts_total",
        &[("actor", "section")],
    );
    zero(
        "boxoffice_reconcile_findings_total",
        &[("kind", "sold_without_claim")],
    );
    assert_eq!(
        fresh.value("boxoffice_rpc_in_flight_limit", &[]),
        Some(boxoffice_gateway::limits::IN_FLIGHT_MAX_DEFAULT as f64)
    );
    assert_eq!(
        fresh.value(
            "boxoffice_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0),
        "build info"
    );
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(fresh.value(process, &[]).is_some(), "{process}");
    }
    assert!(fresh.value("process_resident_memory_bytes", &[]).unwrap() > 0.0);
    assert!(fresh.value("boxoffice_store_log_bytes", &[]).is_some());
    assert!(fresh.value("boxoffice_store_data_dir_bytes", &[]).is_some());
    promtool_finds_no_problem("a fresh server's scrape", &fresh.text);

    // An event: its sections' and its own series are there at 0 before its first call.
    let mut c = server.admin();
    c.events
        .create_event(event(
            "m",
            vec![ga("g", 2, 100), reserved("r", &[("A", 2)], 100)],
        ))
        .await
        .unwrap();
    let created = scraped(&server).await;
    created.assert_described();
    let place = |s: &Scraped, section: &str, state: &str| {
        s.value(
            "boxoffice_section_places",
            &[("event", "m"), ("section", section), ("state", state)],
        )
    };
    assert_eq!(place(&created, "g", "available"), Some(2.0));
    assert_eq!(place(&created, "g", "held"), Some(0.0));
    assert_eq!(place(&created, "g", "sold"), Some(0.0));
    assert_eq!(place(&created, "r", "available"), Some(2.0));
    // A cluster node's families are a cluster node's only.
    for f in FAMILIES
        .iter()
        .filter(|f| !matches!(f.series, Series::Cluster))
    {
        assert!(
            created.types.contains_key(f.name),
            "{} is there once an event exists",
            f.name
        );
    }
    for (name, labels) in [
        (
            "boxoffice_section_rejections_total",
            vec![("event", "m"), ("section", "g"), ("reason", "SOLD_OUT")],
        ),
        (
            "boxoffice_section_holds_total",
            vec![("event", "m"), ("section", "r")],
        ),
        (
            "boxoffice_waiting_room_admitted_total",
            vec![("event", "m")],
        ),
        ("boxoffice_waitlist_length", vec![("event", "m")]),
    ] {
        assert_eq!(created.value(name, &labels), Some(0.0), "{name}{labels:?}");
    }
    let before = created;

    // Calls: two holds that succeed, three refusals that share FAILED_PRECONDITION, and a
    // call without a key.
    let tokens = admitted_all(&mut c, || {}, "m", &["ann", "bob", "carl", "dave"]).await;
    let hold = c
        .booking
        .hold(best("m", "ann", &tokens[0], "g", 2, ""))
        .await
        .unwrap()
        .into_inner();
    let s = c
        .booking
        .hold(best("m", "bob", &tokens[1], "g", 1, ""))
        .await
        .unwrap_err();
    assert_eq!(
        (s.code(), boxoffice_tests::server::reason(&s).as_str()),
        (Code::FailedPrecondition, "SOLD_OUT")
    );
    c.booking
        .hold(seats("m", "carl", &tokens[2], &["r:A:1"]))
        .await
        .unwrap();
    let s = c
        .booking
        .hold(seats("m", "dave", &tokens[3], &["r:A:1"]))
        .await
        .unwrap_err();
    assert_eq!(boxoffice_tests::server::reason(&s), "SEAT_UNAVAILABLE");
    let s = c
        .booking
        .confirm(pb::ConfirmRequest {
            hold_id: hold.hold_id.clone(),
            user_id: "ann".into(),
            payment_token: "tok_decline".into(),
            idempotency_key: "pay-1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(boxoffice_tests::server::reason(&s), "PAYMENT_DECLINED");
    let mut keyless = pb::event_service_client::EventServiceClient::new(
        boxoffice_tests::connect(&format!("http://{}", server.addr()))
            .await
            .unwrap(),
    );
    let s = keyless
        .get_event(pb::GetEventRequest {
            event_id: "m".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::Unauthenticated);

    let after = scraped(&server).await;
    after.assert_described();
    let rpc = |method, code, reason| [("method", method), ("code", code), ("reason", reason)];
    let handled = "boxoffice_rpc_handled_total";
    went_up(&before, &after, handled, &rpc("Hold", "OK", "none"), 2.0);
    went_up(
        &before,
        &after,
        handled,
        &rpc("Hold", "FAILED_PRECONDITION", "SOLD_OUT"),
        1.0,
    );
    went_up(
        &before,
        &after,
        handled,
        &rpc("Hold", "FAILED_PRECONDITION", "SEAT_UNAVAILABLE"),
        1.0,
    );
    went_up(
        &before,
        &after,
        handled,
        &rpc("Confirm", "FAILED_PRECONDITION", "PAYMENT_DECLINED"),
        1.0,
    );
    went_up(&before, &after, handled, &rpc("Confirm", "OK", "none"), 0.0);
    went_up(
        &before,
        &after,
        handled,
        &rpc("GetEvent", "UNAUTHENTICATED", "none"),
        1.0,
    );
    let latency = "boxoffice_rpc_duration_seconds_count";
    assert_eq!(
        after.value(latency, &rpc("Hold", "FAILED_PRECONDITION", "SOLD_OUT")),
        Some(1.0),
        "the latency of a SOLD_OUT, apart from the other refusals"
    );
    assert_eq!(
        after.value(
            latency,
            &rpc("Hold", "FAILED_PRECONDITION", "SEAT_UNAVAILABLE")
        ),
        Some(1.0)
    );
    went_up(
        &before,
        &after,
        "boxoffice_section_rejections_total",
        &[("event", "m"), ("section", "g"), ("reason", "SOLD_OUT")],
        1.0,
    );
    assert_eq!(place(&after, "g", "available"), Some(0.0));
    assert_eq!(place(&after, "g", "held"), Some(2.0));
    assert_eq!(place(&after, "r", "held"), Some(1.0));
    assert_eq!(place(&after, "r", "available"), Some(1.0));
    assert_eq!(after.value("boxoffice_rpc_in_flight", &[]), Some(0.0));
    // No label value is a user's or a hold's id.
    for (name, labels, _) in &after.samples {
        for v in labels.values() {
            assert!(
                !["ann", "bob", "carl", "dave"].contains(&v.as_str()) && !v.contains(".h"),
                "{name}{labels:?}"
            );
        }
    }
    promtool_finds_no_problem("a scrape after refusals", &after.text);

    // The log's size is sampled every few seconds: it shows the records written.
    periodic_check("the log's size on disk is sampled", PATIENCE, async || {
        let s = scraped(&server).await;
        let log = s.value("boxoffice_store_log_bytes", &[]).unwrap();
        let total = s.value("boxoffice_store_data_dir_bytes", &[]).unwrap();
        (log > 0.0 && total >= log).then_some(())
    })
    .await;
    server.kill();
}

/// The sweeper's backlog: active holds past their deadline that nothing expired yet (no sweeper
/// runs on this engine), counted by their sections; none once they are expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_past_their_deadline_are_the_sweepers_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let engine = boxoffice_tests::open(dir.path(), &clock).await;
    engine
        .create_event(boxoffice_tests::event(
            "b",
            vec![
                boxoffice_tests::ga("g", 10, 100),
                boxoffice_tests::ga("h", 10, 100),
            ],
            1_000,
            4,
        ))
        .await
        .unwrap();
    for user in ["u1", "u2", "u3"] {
        engine.hold(any_section("b", user, 1)).await.unwrap();
    }
    assert_eq!(engine.holds_past_deadline().await, Ok(0));
    clock.advance_ms(999);
    assert_eq!(engine.holds_past_deadline().await, Ok(0), "not due yet");
    clock.advance_ms(1);
    assert_eq!(
        engine.holds_past_deadline().await,
        Ok(3),
        "due at the deadline"
    );
    let expired = engine.expire_due(100).await.unwrap();
    assert_eq!(expired.len(), 3);
    assert_eq!(engine.holds_past_deadline().await, Ok(0), "swept");
    assert!(engine.event(&EventId::from("b")).is_ok());
    engine.shutdown().await;
}

/// `/debug/pprof/profile`: admin only, its bounds refused, one at a time, and what it answers
/// is a CPU profile of the server under load (pprof's gzipped protobuf naming our code).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_profile_is_admin_only_and_names_the_servers_code() {
    use boxoffice_tests::server::{ADMIN, CLIENT};
    use pprof::protos::Message;

    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with_metrics(child_bin!(), dir.path())
        .await
        .unwrap();
    let m = server.metrics_addr().unwrap();
    let path = "/debug/pprof/profile?seconds=1";
    assert_eq!(get_raw(m, path, None).await.0, 401, "no key");
    assert_eq!(
        get_raw(m, path, Some("not-a-key")).await.0,
        401,
        "unknown key"
    );
    assert_eq!(get_raw(m, path, Some(CLIENT)).await.0, 403, "a client key");
    assert_eq!(
        get_raw(m, "/debug/pprof/profile?seconds=x", None).await.0,
        401,
        "the key is checked before the query"
    );
    for bad in ["seconds=0", "seconds=61", "seconds=x", "seconds=-1"] {
        let (status, body) = get_raw(m, &format!("/debug/pprof/profile?{bad}"), Some(ADMIN)).await;
        assert_eq!(status, 400, "{bad}: {}", String::from_utf8_lossy(&body));
    }

    // Load while the profile is taken: GetEvent of an event that is not there, over and over.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (mut c, stop) = (server.admin(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut calls = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = c
                    .events
                    .get_event(pb::GetEventRequest {
                        event_id: "nowhere".into(),
                    })
                    .await;
                assert_eq!(r.unwrap_err().code(), Code::NotFound);
                calls += 1;
            }
            calls
        }));
    }
    let profiling =
        tokio::spawn(
            async move { get_raw(m, "/debug/pprof/profile?seconds=2", Some(ADMIN)).await },
        );
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (status, _) = get_raw(m, path, Some(ADMIN)).await;
    assert_eq!(status, 409, "one profile at a time");
    let (status, body) = profiling.await.unwrap();
    // Then another, the load still running: one at a time, not one ever.
    let (again, _) = get_raw(m, path, Some(ADMIN)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut calls = 0;
    for l in load {
        calls += l.await.unwrap();
    }
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(again, 200);
    assert!(calls > 0);
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&body[..]), &mut raw).unwrap();
    let profile = pprof::protos::Profile::decode(&raw[..]).unwrap();
    assert!(!profile.sample.is_empty(), "no samples under load");
    assert!(
        profile
            .string_table
            .iter()
            .any(|s| s.contains("boxoffice_gateway")),
        "the server's own functions are named"
    );
    assert!(
        profile.duration_nanos >= 1_000_000_000,
        "{}",
        profile.duration_nanos
    );
}
