//! The monitoring kit in docs/monitoring/ against the server it watches: every metric the
//! alert rules (alerts.yml) and the Grafana dashboard (grafana-dashboard.json) query is one a
//! live server exports, with the labels their selectors and groupings name; the dashboard is a
//! dashboard (panels, each with a query); every alert has its severity, annotations and unit
//! tests (one input that fires it, one that does not); and `promtool check rules` and
//! `promtool test rules` pass. Without promtool on PATH those last two are skipped, saying so on
//! stderr (they fail instead when `BOXOFFICE_REQUIRE_PROMTOOL` is set, as `.ci/run` does where
//! it can install it), as in `metrics.rs`.
//!
//! There is no YAML crate in the tree: the rules file is read with plain string handling (its
//! `- alert:` and `expr:` lines, an `expr: |` block being the more indented lines below it).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use boxoffice_gateway::metrics::{FAMILIES, Kind};
use boxoffice_tests::server::TestServer;

use crate::grpc::{event, ga, reserved, scrape};

/// The workspace root (the tests crate is one of its members).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

const ALERTS: &str = "docs/monitoring/alerts.yml";
const ALERTS_TEST: &str = "docs/monitoring/alerts_test.yml";
const DASHBOARD: &str = "docs/monitoring/grafana-dashboard.json";

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Labels every scraped series has in Prometheus (added by the scrape, not by the server).
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// Labels of the Raft families, which a single node does not export: every one is by `group`
/// (`spawn_raft_sampler` in gateway/src/metrics.rs), the commit lag also by `peer`, and the
/// forwarded calls only by `method` (gateway/src/forward.rs).
fn cluster_labels(name: &str) -> &'static [&'static str] {
    match name {
        "boxoffice_raft_commit_lag_entries" => &["group", "peer"],
        "boxoffice_cluster_forwarded_total" => &["method"],
        "boxoffice_cluster_forward_failures_total" => &["reason"],
        "boxoffice_cluster_peer_up" => &["peer"],
        _ => &["group"],
    }
}

/// A cluster node's only: checked against FAMILIES, not against a single node's scrape.
fn cluster_only(name: &str) -> bool {
    name.starts_with("boxoffice_raft_") || name.starts_with("boxoffice_cluster_")
}

/// What one scrape exports: each series name (a histogram's base name and its `_bucket`,
/// `_sum` and `_count`), and for each its label names and values.
#[derive(Default)]
struct Exported {
    labels: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl Exported {
    fn parse(text: &str) -> Exported {
        let mut out = Exported::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                out.labels.entry(name.to_owned()).or_default();
                if kind == "histogram" || kind == "summary" {
                    for suffix in ["_sum", "_count"] {
                        out.labels.entry(format!("{name}{suffix}")).or_default();
                    }
                }
                if kind == "histogram" {
                    out.labels.entry(format!("{name}_bucket")).or_default();
                }
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (series, _value) = line.rsplit_once(' ').unwrap();
            let (name, rest) = series.split_once('{').unwrap_or((series, ""));
            let labels = out.labels.entry(name.to_owned()).or_default();
            let mut rest = rest.strip_suffix('}').unwrap_or(rest);
            while !rest.is_empty() {
                let (key, after) = rest.split_once("=\"").unwrap();
                let end = after.find('"').unwrap();
                labels
                    .entry(key.to_owned())
                    .or_default()
                    .insert(after[..end].to_owned());
                rest = after[end + 1..].trim_start_matches(',');
            }
        }
        out
    }

    /// Every label name some series has.
    fn every_label(&self) -> BTreeSet<String> {
        self.labels
            .values()
            .flat_map(|l| l.keys().cloned())
            .collect()
    }
}

/// Whether `name` is a series of a family in FAMILIES (a histogram's with its suffixes).
fn in_families(name: &str) -> bool {
    FAMILIES.iter().any(|f| {
        name == f.name
            || (f.kind == Kind::Histogram
                && ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| name.strip_suffix(s) == Some(f.name)))
    })
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// One metric a query names: where its name ends, and the name.
struct Named {
    name: String,
    end: usize,
}

/// The metrics a PromQL expression names: identifiers that start with `boxoffice_` or
/// `process_` (an identifier's whole run of name characters, so a recording rule's name or a
/// misspelt one is caught whole).
fn metrics_named(expr: &str) -> Vec<Named> {
    let mut out = Vec::new();
    let mut prev: Option<char> = None;
    for (at, c) in expr.char_indices() {
        let starts = prev.is_none_or(|p| !ident_char(p))
            && (expr[at..].starts_with("boxoffice_") || expr[at..].starts_with("process_"));
        prev = Some(c);
        if !starts {
            continue;
        }
        let len = expr[at..]
            .find(|c: char| !ident_char(c))
            .unwrap_or(expr.len() - at);
        out.push(Named {
            name: expr[at..at + len].to_owned(),
            end: at + len,
        });
    }
    out
}

/// One label matcher of a selector: `key op "value"`.
struct Matcher {
    key: String,
    op: String,
    value: String,
}

/// The matchers of the selector that starts at `rest` (`{...}`, after a metric name), if any.
fn selector(rest: &str) -> Vec<Matcher> {
    let Some(mut rest) = rest.trim_start().strip_prefix('{') else {
        return Vec::new();
    };
    let mut out = Vec::new();
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
        if rest.starts_with('}') || rest.is_empty() {
            return out;
        }
        let key_len = rest.find(|c: char| !ident_char(c)).unwrap_or(rest.len());
        let key = rest[..key_len].to_owned();
        rest = rest[key_len..].trim_start();
        let op = ["=~", "!~", "!=", "="]
            .into_iter()
            .find(|op| rest.starts_with(op))
            .unwrap_or_else(|| panic!("a matcher operator after {key:?} in {rest:?}"));
        rest = rest[op.len()..].trim_start();
        let quote = rest.chars().next().unwrap();
        assert!(
            ['"', '\'', '`'].contains(&quote),
            "a quoted value after {key}{op} in {rest:?}"
        );
        let mut value = String::new();
        let mut chars = rest[1..].char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' if quote != '`' => value.extend(chars.next().map(|(_, c)| c)),
                c if c == quote => {
                    end = Some(1 + i + 1);
                    break;
                }
                c => value.push(c),
            }
        }
        rest = &rest[end.unwrap_or_else(|| panic!("an unclosed value in {rest:?}"))..];
        out.push(Matcher {
            key,
            op: op.to_owned(),
            value,
        });
    }
}

/// The labels named by the groupings and matchings of `expr`: `by (...)`, `without (...)`,
/// `on (...)`, `ignoring (...)`, `group_left (...)`, `group_right (...)`.
fn grouping_labels(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for word in [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ] {
        for (at, _) in expr.match_indices(word) {
            let before = expr[..at].chars().next_back();
            if before.is_some_and(ident_char) {
                continue;
            }
            let Some(list) = expr[at + word.len()..].trim_start().strip_prefix('(') else {
                continue;
            };
            let list = &list[..list.find(')').unwrap()];
            out.extend(
                list.split(',')
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned),
            );
        }
    }
    out
}

/// `label_values(metric{...}, label)` of a dashboard variable: (metric, label).
fn label_values(query: &str) -> Option<(String, String)> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    let (metric, label) = inner.rsplit_once(',')?;
    let metric = metric.split('{').next()?.trim();
    Some((metric.to_owned(), label.trim().to_owned()))
}

/// Every problem with the metrics and labels `expr` (from `what`) names, against `exported`.
fn problems(what: &str, expr: &str, exported: &Exported) -> Vec<String> {
    let mut out = Vec::new();
    let named = metrics_named(expr);
    // `up` is Prometheus's own (BoxofficeTargetDown): the only other metric a query may name.
    if named.is_empty() && !expr.trim_start().starts_with("up{") {
        out.push(format!(
            "{what}: names no boxoffice_ or process_ metric: {expr}"
        ));
    }
    for Named { name, end } in named {
        // The Raft families exist on cluster nodes only (a single node exports none of them):
        // they are checked against FAMILIES, and their labels against what the code sets.
        let labels: BTreeSet<String> = if cluster_only(&name) {
            if !in_families(&name) {
                out.push(format!("{what}: {name} is not in FAMILIES"));
                continue;
            }
            cluster_labels(&name)
                .iter()
                .map(|l| (*l).to_owned())
                .collect()
        } else {
            let Some(labels) = exported.labels.get(&name) else {
                out.push(format!("{what}: {name} is not exported"));
                continue;
            };
            labels.keys().cloned().collect()
        };
        for m in selector(&expr[end..]) {
            if TARGET_LABELS.contains(&m.key.as_str()) {
                continue;
            }
            if !labels.contains(&m.key) {
                out.push(format!(
                    "{what}: {name} has no label {} (it has {labels:?})",
                    m.key
                ));
            } else if m.op == "=" && !cluster_only(&name) {
                let values = &exported.labels[&name][&m.key];
                if !values.contains(&m.value) {
                    out.push(format!(
                        "{what}: no series {name}{{{}=\"{}\"}} (values: {values:?})",
                        m.key, m.value
                    ));
                }
            }
        }
    }
    let mut known = exported.every_label();
    known.extend(TARGET_LABELS.iter().map(|l| (*l).to_owned()));
    known.extend(["group", "peer"].map(str::to_owned));
    for label in grouping_labels(expr) {
        if !known.contains(&label) {
            out.push(format!("{what}: groups by {label}, a label no series has"));
        }
    }
    out
}

/// The rules of alerts.yml: (alert name, its lines), in order.
fn alert_blocks(rules: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in rules.lines() {
        if let Some(name) = line.trim_start().strip_prefix("- alert:") {
            out.push((name.trim().to_owned(), Vec::new()));
        } else if let Some((_, lines)) = out.last_mut() {
            lines.push(line.to_owned());
        }
    }
    out
}

/// The `expr` of one rule's lines: inline, or an `expr: |` (or `>`) block of the more indented
/// lines that follow.
fn expr_of(lines: &[String]) -> Option<String> {
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with("expr:"))?;
    let line = &lines[at];
    let indent = line.len() - line.trim_start().len();
    let inline = line.trim_start()["expr:".len()..].trim();
    if !inline.starts_with('|') && !inline.starts_with('>') {
        let unquoted = inline
            .strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .or_else(|| inline.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
            .unwrap_or(inline);
        return Some(unquoted.to_owned());
    }
    let block: Vec<&str> = lines[at + 1..]
        .iter()
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
        .map(|l| l.trim())
        .collect();
    Some(block.join("\n").trim().to_owned())
}

/// The value of `key:` among one rule's lines (the first, unquoted).
fn field<'a>(lines: &'a [String], key: &str) -> Option<&'a str> {
    lines.iter().find_map(|l| {
        let v = l.trim_start().strip_prefix(key)?.strip_prefix(':')?.trim();
        Some(v.trim_matches('"'))
    })
}

/// Every panel of a dashboard, those inside rows included.
fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// Every query of a dashboard: (where, expr) for each panel target, and each `label_values`
/// of its template variables.
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(dashboard) {
        let title = p["title"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or("");
            let id = t["refId"].as_str().unwrap_or("?");
            out.push((format!("panel {title:?} target {id}"), expr.to_owned()));
        }
    }
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if v["type"] != "query" {
            continue;
        }
        let query = v["query"]["query"]
            .as_str()
            .or_else(|| v["query"].as_str())
            .unwrap();
        out.push((format!("variable {}", v["name"]), query.to_owned()));
    }
    out
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_alerts_and_the_dashboard_query_is_exported() {
    let server = TestServer::start().await;
    // An event: its own series (waiting room, waitlist) and its sections' (places by state,
    // counters, rejections by reason) are registered at its creation.
    let mut admin = server.admin();
    admin
        .events
        .create_event(event(
            "mon",
            vec![ga("g", 10, 100), reserved("r", &[("A", 4)], 100)],
        ))
        .await
        .unwrap();
    let text = scrape(server.metrics_addr()).await;
    let exported = Exported::parse(&text);
    for name in [
        "boxoffice_section_places",
        "boxoffice_waiting_room_admit_rate",
        "boxoffice_sweeper_expiry_lag_seconds_bucket",
        "process_resident_memory_bytes",
    ] {
        assert!(exported.labels.contains_key(name), "{name} in\n{text}");
    }

    let mut found = Vec::new();
    let rules = read(ALERTS);
    let blocks = alert_blocks(&rules);
    assert!(blocks.len() >= 10, "alerts in {ALERTS}: {blocks:?}");
    for (alert, lines) in &blocks {
        let expr = expr_of(lines).unwrap_or_else(|| panic!("{alert} has no expr"));
        found.extend(problems(&format!("alert {alert}"), &expr, &exported));
    }

    let dashboard = dashboard();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() > 20, "queries in {DASHBOARD}: {queries:?}");
    for (what, expr) in &queries {
        found.extend(problems(what, expr, &exported));
        if let Some((metric, label)) = label_values(expr) {
            let has = exported
                .labels
                .get(&metric)
                .is_some_and(|l| l.contains_key(&label))
                || TARGET_LABELS.contains(&label.as_str());
            if !has {
                found.push(format!("{what}: {metric} has no label {label}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "unknown metrics or labels:\n{}\n--- the scrape:\n{text}",
        found.join("\n")
    );
    server.shutdown().await;
}

#[test]
fn the_dashboard_parses_and_every_panel_has_a_query() {
    let d = dashboard();
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36, "schemaVersion");
    assert!(!d["uid"].as_str().unwrap().is_empty(), "uid");
    assert!(!d["title"].as_str().unwrap().is_empty(), "title");
    let vars = d["templating"]["list"].as_array().unwrap();
    assert!(
        vars.iter().any(|v| v["type"] == "datasource"
            && v["name"] == "datasource"
            && v["query"] == "prometheus"),
        "a Prometheus data source variable named datasource"
    );
    let panels = panels(&d);
    let mut ids = BTreeSet::new();
    let mut queried = 0;
    for p in &panels {
        let title = p["title"].as_str().unwrap_or("");
        assert!(!title.is_empty(), "a panel without a title: {p}");
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "panel id twice: {title}"
        );
        for k in ["h", "w", "x", "y"] {
            assert!(p["gridPos"][k].is_u64(), "{title}: gridPos.{k}");
        }
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "{title}: queries the chosen data source"
        );
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no target");
        let mut refs = BTreeSet::new();
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or("");
            assert!(!expr.trim().is_empty(), "{title}: a target without expr");
            assert!(
                refs.insert(t["refId"].as_str().unwrap()),
                "{title}: refId twice"
            );
        }
        queried += 1;
    }
    for needed in [
        "boxoffice_section_places",
        "boxoffice_waiting_room_queue_length",
        "boxoffice_waiting_room_admitted_total",
        "boxoffice_waiting_room_admit_rate",
        "boxoffice_section_holds_total",
        "boxoffice_section_confirms_total",
        "boxoffice_section_expired_total",
        "boxoffice_section_releases_total",
        "boxoffice_sweeper_expiry_lag_seconds_bucket",
        "boxoffice_gateway_shed_total",
        "boxoffice_engine_shed_total",
        "boxoffice_reconcile_last_findings",
        "boxoffice_store_halted",
        "boxoffice_rpc_handled_total",
        "boxoffice_rpc_duration_seconds_bucket",
        "boxoffice_raft_leader_known",
        "boxoffice_raft_term",
        "boxoffice_raft_commit_lag_entries",
    ] {
        assert!(
            dashboard_queries(&d)
                .iter()
                .any(|(_, e)| metrics_named(e).iter().any(|n| n.name == needed)),
            "no panel shows {needed}"
        );
    }
    assert!(queried >= 15, "{queried} panels with queries");
}

#[test]
fn every_alert_has_a_severity_annotations_and_tests_both_ways() {
    let rules = read(ALERTS);
    let tests = read(ALERTS_TEST);
    // Each `alertname:` of the tests, and whether its `exp_alerts` expects it to fire.
    let mut tested: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let lines: Vec<&str> = tests.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line.trim_start().strip_prefix("alertname:") else {
            continue;
        };
        let exp = lines[i + 1..]
            .iter()
            .map(|l| l.trim())
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .unwrap();
        let fires = match exp {
            "exp_alerts: []" => false,
            "exp_alerts:" => true,
            other => panic!("{ALERTS_TEST}: {other:?} after alertname {name}"),
        };
        let entry = tested.entry(name.trim().to_owned()).or_default();
        if fires {
            entry.0 = true;
        } else {
            entry.1 = true;
        }
    }
    let blocks = alert_blocks(&rules);
    let mut names = BTreeSet::new();
    for (alert, lines) in &blocks {
        assert!(names.insert(alert.clone()), "{alert} twice");
        assert!(expr_of(lines).is_some(), "{alert}: expr");
        assert!(field(lines, "for").is_some(), "{alert}: for");
        let severity = field(lines, "severity").unwrap_or("");
        assert!(
            ["page", "ticket"].contains(&severity),
            "{alert}: severity {severity:?}"
        );
        for annotation in ["summary", "description", "runbook"] {
            assert!(
                field(lines, annotation).is_some_and(|v| !v.is_empty()),
                "{alert}: annotation {annotation}"
            );
        }
        assert_eq!(
            tested.get(alert),
            Some(&(true, true)),
            "{alert}: {ALERTS_TEST} has a case where it fires and one where it does not \
             (fires, does not)"
        );
    }
    for name in tested.keys() {
        assert!(
            names.contains(name),
            "{ALERTS_TEST} tests {name}, not in {ALERTS}"
        );
    }
}

/// The checker itself: it finds the names and labels of a query, and refuses what a scrape
/// does not have (so the test above cannot pass by finding nothing).
#[test]
fn the_checker_refuses_unknown_metrics_and_labels() {
    let exported = Exported::parse(
        "# TYPE boxoffice_x_seconds histogram\n\
         boxoffice_x_seconds_bucket{method=\"Hold\",le=\"10\"} 0\n\
         # TYPE boxoffice_places gauge\n\
         boxoffice_places{event=\"e\",state=\"available\"} 3\n",
    );
    let found = |expr: &str| problems("q", expr, &exported);
    let names: Vec<String> = metrics_named(
        "sum by (le) (rate(boxoffice_x_seconds_bucket[5m])) / boxoffice_y:rate5m + process_a",
    )
    .into_iter()
    .map(|n| n.name)
    .collect();
    assert_eq!(
        names,
        [
            "boxoffice_x_seconds_bucket",
            "boxoffice_y:rate5m",
            "process_a"
        ]
    );
    for fine in [
        "histogram_quantile(0.99, sum by (method, le) (rate(boxoffice_x_seconds_bucket{le=\"10\"}[5m])))",
        "boxoffice_places{job=~\"$job\", event=~\"$event\", state=\"available\"} > 0",
        "max by (group) (boxoffice_raft_term) unless on (instance) boxoffice_places",
        "boxoffice_raft_commit_lag_entries{peer=\"2\"}",
        "up{job=\"boxoffice\"} == 0",
    ] {
        assert_eq!(found(fine), Vec::<String>::new(), "{fine}");
    }
    for wrong in [
        "boxoffice_nope",
        "boxoffice_x_seconds_total",
        "boxoffice_places{state=\"avail\"}",
        "boxoffice_places{section=\"g\"}",
        "sum by (sectoin) (boxoffice_places)",
        "boxoffice_raft_nope",
        "boxoffice_raft_term{peer=\"2\"}",
        "rate(errors_total[5m])",
    ] {
        assert!(!found(wrong).is_empty(), "{wrong} passes");
    }
}

#[test]
fn promtool_checks_the_rules_and_runs_their_tests() {
    for args in [["check", "rules", ALERTS], ["test", "rules", ALERTS_TEST]] {
        let what = format!("`promtool {}` not run", args.join(" "));
        let Some((ok, printed)) =
            boxoffice_tests::promtool::run_or_skip(&args, Some(&root()), "", &what)
        else {
            return;
        };
        assert!(ok, "promtool {}:\n{printed}", args.join(" "));
    }
}
