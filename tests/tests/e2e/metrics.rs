//! `/metrics` and `/healthz` of a real `serve` (docs/http-api.md#metrics): the scrape is
//! parsed by a Prometheus text-format parser, and its counters move as turns run.

use std::io::BufRead;

use e2e_tests::server::{shipped_config, Server};
use prometheus_parse::{Scrape, Value as Metric};
use serde_json::json as j;

fn scrape(server: &Server) -> Scrape {
    let answer = server.get("/metrics");
    assert_eq!(answer.status, 200, "{answer:?}");
    let text = answer.body.as_str().expect("text").to_string();
    Scrape::parse(text.as_bytes().lines()).unwrap_or_else(|e| panic!("not the text format ({e}):\n{text}"))
}

/// The value of `metric` with `labels` (a counter, gauge or untyped sample; a histogram's
/// or summary's `_count`).
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .unwrap_or_else(|| panic!("no {metric} {labels:?} in {:?}", scrape.samples));
    match &sample.value {
        Metric::Counter(v) | Metric::Gauge(v) | Metric::Untyped(v) => *v,
        Metric::Histogram(buckets) => buckets.iter().map(|b| b.count).fold(0.0, f64::max),
        Metric::Summary(_) => panic!("{metric}: a summary has no single value"),
    }
}

/// The families docs/http-api.md#metrics lists, by type.
const FAMILIES: [(&str, &str); 13] = [
    ("history_turns_total", "counter"),
    ("history_turn_seconds", "histogram"),
    ("history_plugin_seconds", "histogram"),
    ("history_plugin_errors_total", "counter"),
    ("history_tokens_total", "counter"),
    ("history_tokens_counted_bytes_total", "counter"),
    ("history_token_cache_lookups_total", "counter"),
    ("history_token_cache_entries", "gauge"),
    ("history_token_cache_capacity", "gauge"),
    ("history_sessions_live", "gauge"),
    ("history_reloads_total", "counter"),
    ("history_store_seconds", "histogram"),
    ("history_sessions_put_out_total", "counter"),
];

/// The type the parser read for `metric`'s samples (`None`: no sample yet).
fn kind(scrape: &Scrape, metric: &str) -> Option<&'static str> {
    let sample = scrape.samples.iter().find(|s| s.metric == metric)?;
    Some(match sample.value {
        Metric::Counter(_) => "counter",
        Metric::Gauge(_) => "gauge",
        Metric::Histogram(_) => "histogram",
        Metric::Summary(_) => "summary",
        Metric::Untyped(_) => "untyped",
    })
}

#[test]
fn metrics_parse_as_prometheus_text_and_count_turns() {
    let config = shipped_config("", &[]);
    let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
    let before = scrape(&server);
    // Every family is named with its help from the first scrape, before any turn.
    for (name, _) in FAMILIES {
        let doc = before.docs.get(name);
        assert!(doc.is_some_and(|d| !d.is_empty()), "{name}: no HELP");
    }
    assert_eq!(value(&before, "history_turns_total", &[("outcome", "ok")]), 0.0);
    assert_eq!(value(&before, "history_sessions_live", &[]), 0.0);
    assert_eq!(
        value(&before, "history_reloads_total", &[("outcome", "failed")]),
        0.0
    );

    let id = server.create("default");
    let turns = 3;
    for n in 0..turns {
        let answer = server.post(
            &format!("/v1/sessions/{id}/turns"),
            &j!({"messages": [{"role": "user", "content": format!("step {n}")}]}),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let missing = server.post(
        "/v1/sessions/nope/turns",
        &j!({"messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(missing.status, 404);

    let after = scrape(&server);
    assert_eq!(
        value(&after, "history_turns_total", &[("outcome", "ok")]),
        turns as f64
    );
    assert_eq!(
        value(&after, "history_turns_total", &[("outcome", "not_found")]),
        1.0
    );
    assert_eq!(
        value(&after, "history_turn_seconds", &[]),
        turns as f64 + 1.0,
        "the +Inf bucket counts every turn"
    );
    assert_eq!(
        value(&after, "history_turn_seconds_count", &[]),
        turns as f64 + 1.0
    );
    assert_eq!(
        value(&after, "history_plugin_seconds_count", &[("plugin", "default")]),
        turns as f64
    );
    assert!(value(&after, "history_tokens_total", &[("direction", "in")]) > 0.0);
    assert!(value(&after, "history_tokens_total", &[("direction", "out")]) > 0.0);
    assert_eq!(value(&after, "history_sessions_live", &[]), 1.0);
    assert!(value(&after, "history_store_seconds_count", &[]) >= turns as f64);
    // Each family's samples have the documented type (a plugin fault has none yet).
    for (name, expected) in FAMILIES {
        match kind(&after, name) {
            Some(found) => assert_eq!(found, expected, "{name}"),
            None => assert_eq!(name, "history_plugin_errors_total", "{name}: no sample"),
        }
    }

    assert_eq!(server.get("/healthz").status, 200);
    // The per-turn summary line names the session.
    let stderr = server.stderr();
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(&id) && l.contains("chain: ") && l.contains("messages")),
        "{stderr}"
    );
}
