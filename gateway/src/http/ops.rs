//! The live operations page (`GET /ops`) and its figures (`GET /ops/stats`): per event, the
//! sale's state as an operator set it, seats left per section, the waiting room's length,
//! admissions against the cap, holds, confirms,
//! releases and expiries; the expiry lag, shedding, reconciliation findings and the store's
//! state. The figures are this process's own metrics (the recorder `/metrics` renders), read
//! at each request: the page polls them every second and shows rates from one poll to the next.
//! Like `/metrics`, it needs no API key and shows no ids but events' and sections'.

use std::collections::BTreeMap;

use axum::Json;
use axum::response::{Html, IntoResponse};
use serde::Serialize;

/// One sample of the exposition format: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series' name.
    pub name: String,
    /// Its labels, by name.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// The samples of a Prometheus text exposition (comments and malformed lines skipped).
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            let mut map = BTreeMap::new();
            for pair in split_labels(labels) {
                let (k, v) = pair.split_once('=')?;
                let v = v.strip_prefix('"')?.strip_suffix('"')?;
                map.insert(k.to_owned(), v.replace("\\\"", "\"").replace("\\\\", "\\"));
            }
            Some(Sample {
                name: name.to_owned(),
                labels: map,
                value,
            })
        })
        .collect()
}

/// `a="x",b="y,z"` split at the commas between pairs (not those inside quotes).
fn split_labels(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            '\\' if quoted => escaped = !escaped,
            '"' if !escaped => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => escaped = false,
        }
        if c != '\\' {
            escaped = false;
        }
    }
    if start < s.len() {
        parts.push(&s[start..]);
    }
    parts
}

/// A section's places now.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SectionFigures {
    /// The section.
    pub section_id: String,
    /// Free places (seats left).
    pub available: f64,
    /// Held places.
    pub held: f64,
    /// Sold places.
    pub sold: f64,
}

/// An event's figures.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventFigures {
    /// The event.
    pub event_id: String,
    /// Its sections.
    pub sections: Vec<SectionFigures>,
    /// Fans waiting in line.
    pub queue_length: f64,
    /// Fans admitted per second, as the room measures it while fans wait.
    pub admit_rate_measured: f64,
    /// Fans admitted so far (the page shows the rate).
    pub admitted_total: f64,
    /// Holds placed so far.
    pub holds_total: f64,
    /// Holds confirmed so far.
    pub confirms_total: f64,
    /// Holds released so far.
    pub releases_total: f64,
    /// Holds expired so far.
    pub expired_total: f64,
    /// The sale's state as an operator set it (`OPEN`, `PAUSED`, `QUEUE_ALL`, `ENDED`; empty
    /// if the server exports none).
    pub sale_state: String,
    /// The admission rate the sale is set to (its cap), per second.
    pub admit_rate_set: f64,
}

/// Everything the page shows.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OpsStats {
    /// When the figures were read, Unix ms.
    pub at_unix_ms: u64,
    /// Per event, in id order.
    pub events: Vec<EventFigures>,
    /// Calls shed (gate and sections), so far.
    pub shed_total: f64,
    /// Expiries swept so far, and the sum of their lags (the page shows the mean lag per poll).
    pub expiry_lag_count: f64,
    /// The sum of the swept holds' expiry lags, seconds.
    pub expiry_lag_sum_seconds: f64,
    /// Findings of the last reconciliation pass (0: clean).
    pub reconcile_findings: f64,
    /// 1 if the store halted (the engine refuses changes until restarted).
    pub store_halted: f64,
}

/// The figures of a scrape's samples.
pub fn stats_of(samples: &[Sample], at_unix_ms: u64) -> OpsStats {
    let mut events: BTreeMap<String, EventFigures> = BTreeMap::new();
    let mut out = OpsStats {
        at_unix_ms,
        ..OpsStats::default()
    };
    let label = |s: &Sample, k: &str| s.labels.get(k).cloned().unwrap_or_default();
    for s in samples {
        let event = label(s, "event");
        if !event.is_empty() {
            let ev = events.entry(event.clone()).or_insert_with(|| EventFigures {
                event_id: event.clone(),
                ..EventFigures::default()
            });
            match s.name.as_str() {
                "boxoffice_section_places" => {
                    let section = label(s, "section");
                    let i = match ev.sections.iter().position(|x| x.section_id == section) {
                        Some(i) => i,
                        None => {
                            ev.sections.push(SectionFigures {
                                section_id: section,
                                ..SectionFigures::default()
                            });
                            ev.sections.len() - 1
                        }
                    };
                    let f = &mut ev.sections[i];
                    match label(s, "state").as_str() {
                        "available" => f.available = s.value,
                        "held" => f.held = s.value,
                        "sold" => f.sold = s.value,
                        _ => {}
                    }
                }
                "boxoffice_waiting_room_queue_length" => ev.queue_length = s.value,
                "boxoffice_sale_state" if s.value > 0.0 => ev.sale_state = label(s, "state"),
                "boxoffice_sale_admit_rate_per_second" => ev.admit_rate_set = s.value,
                "boxoffice_waiting_room_admit_rate" => ev.admit_rate_measured = s.value,
                "boxoffice_waiting_room_admitted_total" => ev.admitted_total += s.value,
                "boxoffice_section_holds_total" => ev.holds_total += s.value,
                "boxoffice_section_confirms_total" => ev.confirms_total += s.value,
                "boxoffice_section_releases_total" => ev.releases_total += s.value,
                "boxoffice_section_expired_total" => ev.expired_total += s.value,
                _ => {}
            }
            continue;
        }
        match s.name.as_str() {
            "boxoffice_gateway_shed_total" | "boxoffice_engine_shed_total" => {
                out.shed_total += s.value
            }
            "boxoffice_sweeper_expiry_lag_seconds_count" => out.expiry_lag_count += s.value,
            "boxoffice_sweeper_expiry_lag_seconds_sum" => out.expiry_lag_sum_seconds += s.value,
            "boxoffice_reconcile_last_findings" => out.reconcile_findings += s.value,
            "boxoffice_store_halted" => out.store_halted = out.store_halted.max(s.value),
            _ => {}
        }
    }
    out.events = events.into_values().collect();
    out
}

/// `GET /ops/stats`: the figures now.
pub async fn stats() -> impl IntoResponse {
    let handle = crate::metrics::install();
    let text = handle.render();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut r = Json(stats_of(&parse_exposition(&text), now)).into_response();
    r.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    r
}

/// `GET /ops`: the page (self-contained: no script or style from elsewhere).
pub async fn page() -> Html<&'static str> {
    Html(include_str!("ops.html"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_scrape_becomes_figures_per_event_and_section() {
        let text = "# HELP x y\n\
            boxoffice_section_places{event=\"e1\",section=\"orch\",state=\"available\"} 7\n\
            boxoffice_section_places{event=\"e1\",section=\"orch\",state=\"held\"} 2\n\
            boxoffice_section_places{event=\"e1\",section=\"orch\",state=\"sold\"} 1\n\
            boxoffice_section_holds_total{event=\"e1\",section=\"orch\"} 3\n\
            boxoffice_section_holds_total{event=\"e1\",section=\"ga\"} 4\n\
            boxoffice_waiting_room_queue_length{event=\"e1\"} 42\n\
            boxoffice_waiting_room_admit_rate{event=\"e1\"} 500\n\
            boxoffice_sale_state{event=\"e1\",state=\"OPEN\"} 0\n\
            boxoffice_sale_state{event=\"e1\",state=\"PAUSED\"} 1\n\
            boxoffice_sale_admit_rate_per_second{event=\"e1\"} 600\n\
            boxoffice_gateway_shed_total{scope=\"gate\"} 5\n\
            boxoffice_engine_shed_total{scope=\"section\"} 1\n\
            boxoffice_sweeper_expiry_lag_seconds_sum 0.5\n\
            boxoffice_sweeper_expiry_lag_seconds_count 2\n\
            boxoffice_reconcile_last_findings 0\n\
            boxoffice_store_halted 0\n\
            garbage line\n";
        let s = stats_of(&parse_exposition(text), 9);
        assert_eq!(s.events.len(), 1);
        let e = &s.events[0];
        assert_eq!(e.event_id, "e1");
        assert_eq!(e.sections.len(), 1);
        let orch = &e.sections[0];
        assert_eq!((orch.available, orch.held, orch.sold), (7.0, 2.0, 1.0));
        assert_eq!(
            (e.holds_total, e.queue_length, e.admit_rate_measured),
            (7.0, 42.0, 500.0)
        );
        assert_eq!((e.sale_state.as_str(), e.admit_rate_set), ("PAUSED", 600.0));
        assert_eq!((s.shed_total, s.expiry_lag_count), (6.0, 2.0));
        assert_eq!(s.at_unix_ms, 9);
    }

    #[test]
    fn labels_with_commas_and_quotes_are_read_whole() {
        let s = parse_exposition("m{a=\"x,y\",b=\"q\\\"z\"} 1.5\n");
        assert_eq!(s[0].labels["a"], "x,y");
        assert_eq!(s[0].labels["b"], "q\"z");
        assert_eq!(s[0].value, 1.5);
    }
}
