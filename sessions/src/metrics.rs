//! The service's metrics, on `prometheus-client` and served in the Prometheus text format
//! version 0.0.4 (docs/http-api.md#metrics says which crate and why).
//!
//! Recording is atomics and short per-metric locks: a counter is an atomic add, a
//! histogram's observation a few adds under its own mutex, a labelled family a read lock
//! on its map (a write lock only the first time a label set appears). No lock is held
//! across a turn, and none is shared by every metric.
//!
//! A new metric is one field of [`Metrics`] and one `register` line in [`Metrics::new`];
//! a figure computed at scrape time is a gauge set in [`Metrics::render`] or a line of
//! [`TokenizerFigures`].

use std::fmt;
use std::sync::atomic::AtomicU64;

use history_engine::ChainRun;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// What `GET /metrics` answers with: the text format version 0.0.4, the one every
/// Prometheus and the e2e test's parser read (`prometheus_text` writes it: the family name
/// of a counter carries its `_total`, and there is no OpenMetrics `# EOF`).
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Upper bounds of the turn-time histogram, in seconds.
const TURN_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];
/// Upper bounds of a plugin call's time, in seconds (`plugin_timeout_ms` is 2 s by default).
const PLUGIN_BUCKETS: [f64; 10] = [0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 2.0];
/// Upper bounds of a store transaction's time, in seconds.
const STORE_BUCKETS: [f64; 10] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0];

/// Every turn outcome, shown at 0 before the first of its kind.
const TURN_OUTCOMES: [&str; 6] = [
    "ok",
    "bad_input",
    "plugin_failed",
    "busy",
    "not_found",
    "store_failed",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Plugin {
    plugin: String,
}

/// `kind`: `skipped`, `failed`, or `quarantined` (a run in which the plugin was
/// quarantined, by a late call or an earlier one).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginError {
    plugin: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Direction {
    direction: &'static str,
}

type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

/// A plugin's calls and their seconds for `GET /v1/chain` (a histogram's count and sum
/// are not readable outside the crate's tests), not exported: `history_plugin_seconds`
/// carries the same figures.
#[derive(Debug, Default)]
struct PluginTime {
    calls: Counter,
    seconds: Counter<f64, AtomicU64>,
}

/// Per-plugin totals for `GET /v1/chain`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PluginTotals {
    pub calls: u64,
    pub seconds: f64,
    pub skipped: u64,
    pub failed: u64,
}

/// The service's metrics. The handles are shared with the registry (each is an `Arc`
/// inside), so recording goes straight to the metric.
pub struct Metrics {
    registry: Registry,
    turns: Family<Outcome, Counter>,
    turn_seconds: Histogram,
    plugin_seconds: HistogramFamily<Plugin>,
    plugin_time: Family<Plugin, PluginTime>,
    plugin_errors: Family<PluginError, Counter>,
    tokens: Family<Direction, Counter>,
    sessions_live: Gauge,
    reloads: Family<Outcome, Counter>,
    store_seconds: Histogram,
    sessions_put_out: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let metrics = Metrics {
            registry: Registry::default(),
            turns: Family::default(),
            turn_seconds: Histogram::new(TURN_BUCKETS),
            plugin_seconds: Family::new_with_constructor(|| Histogram::new(PLUGIN_BUCKETS)),
            plugin_time: Family::default(),
            plugin_errors: Family::default(),
            tokens: Family::default(),
            sessions_live: Gauge::default(),
            reloads: Family::default(),
            store_seconds: Histogram::new(STORE_BUCKETS),
            sessions_put_out: Counter::default(),
        };
        // The fixed label sets exist from the start, so a scrape shows them at 0.
        for outcome in TURN_OUTCOMES {
            let _ = metrics.turns.get_or_create(&Outcome { outcome });
        }
        for outcome in ["ok", "failed"] {
            let _ = metrics.reloads.get_or_create(&Outcome { outcome });
        }
        for direction in ["in", "out"] {
            let _ = metrics.tokens.get_or_create(&Direction { direction });
        }
        let mut registry = Registry::default();
        // A counter is registered without its `_total`, and a help without its final
        // period: the encoder adds both.
        let r = &mut registry;
        r.register("history_turns", "Turns by outcome", metrics.turns.clone());
        r.register(
            "history_turn_seconds",
            "Time of a turn, chain and store",
            metrics.turn_seconds.clone(),
        );
        r.register(
            "history_plugin_seconds",
            "Time of each plugin's calls",
            Listed(metrics.plugin_seconds.clone()),
        );
        r.register(
            "history_plugin_errors",
            "Plugin faults, skipped or failing the turn",
            Listed(metrics.plugin_errors.clone()),
        );
        r.register(
            "history_tokens",
            "Tokens into and out of the chain",
            metrics.tokens.clone(),
        );
        r.register_collector(Box::new(TokenizerFigures));
        r.register(
            "history_sessions_live",
            "Live sessions",
            metrics.sessions_live.clone(),
        );
        r.register(
            "history_reloads",
            "Chain reloads by outcome",
            metrics.reloads.clone(),
        );
        r.register(
            "history_store_seconds",
            "Time of store transactions",
            metrics.store_seconds.clone(),
        );
        r.register(
            "history_sessions_put_out",
            "Sessions put out of memory past session_memory_mb, read back from the store when used",
            metrics.sessions_put_out.clone(),
        );
        Metrics { registry, ..metrics }
    }

    /// `n` sessions were put out of memory (docs/sessions.md#memory).
    pub fn sessions_put_out(&self, n: u64) {
        self.sessions_put_out.inc_by(n);
    }

    /// A turn ended with `outcome` (`ok`, `bad_input`, `plugin_failed`, `busy`, …) after
    /// `seconds`.
    pub fn turn(&self, outcome: &'static str, seconds: f64) {
        self.turns.get_or_create(&Outcome { outcome }).inc();
        self.turn_seconds.observe(seconds);
    }

    /// What a chain run's stages did.
    pub fn run(&self, run: &ChainRun) {
        for stage in &run.stages {
            let plugin = Plugin {
                plugin: stage.plugin.clone(),
            };
            let seconds = stage.elapsed.as_secs_f64();
            self.plugin_seconds.get_or_create(&plugin).observe(seconds);
            {
                let time = self.plugin_time.get_or_create(&plugin);
                time.calls.inc();
                time.seconds.inc_by(seconds);
            }
            if stage.skipped.is_some() {
                self.plugin_error(plugin.plugin.clone(), "skipped");
            }
            if stage.quarantined {
                self.plugin_error(plugin.plugin, "quarantined");
            }
        }
        self.tokens
            .get_or_create(&Direction { direction: "in" })
            .inc_by(run.tokens_in);
        self.tokens
            .get_or_create(&Direction { direction: "out" })
            .inc_by(run.tokens_out);
    }

    fn plugin_error(&self, plugin: String, kind: &'static str) {
        self.plugin_errors
            .get_or_create(&PluginError { plugin, kind })
            .inc();
    }

    /// A plugin failed a turn.
    pub fn plugin_failed(&self, plugin: &str) {
        self.plugin_error(plugin.to_string(), "failed");
    }

    /// A chain reload was swapped in (`ok`) or refused.
    pub fn reload(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        self.reloads.get_or_create(&Outcome { outcome }).inc();
    }

    /// A store transaction took `seconds`.
    pub fn store(&self, seconds: f64) {
        self.store_seconds.observe(seconds);
    }

    /// Per-plugin totals.
    pub fn plugin_totals(&self, plugin: &str) -> PluginTotals {
        let (calls, seconds) = self
            .plugin_time
            .get(&Plugin {
                plugin: plugin.to_string(),
            })
            .map(|t| (t.calls.get(), t.seconds.get()))
            .unwrap_or_default();
        let errors = |kind| {
            self.plugin_errors
                .get(&PluginError {
                    plugin: plugin.to_string(),
                    kind,
                })
                .map(|c| c.get())
                .unwrap_or(0)
        };
        PluginTotals {
            calls,
            seconds,
            skipped: errors("skipped"),
            failed: errors("failed"),
        }
    }

    /// The Prometheus text format (version 0.0.4, [`CONTENT_TYPE`]), with the gauges only
    /// the caller knows set now.
    pub fn render(&self, sessions_live: usize) -> String {
        self.sessions_live
            .set(i64::try_from(sessions_live).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing into a String cannot fail; the encoder's only error is the writer's.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// A labelled family whose `# HELP` and `# TYPE` are shown before its first label set
/// (the registry leaves out an empty family otherwise), so a scrape names every family
/// from the start.
#[derive(Debug)]
struct Listed<M>(M);

impl<M: EncodeMetric> EncodeMetric for Listed<M> {
    fn encode(&self, encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// The process-wide figures (the tokenizer's, history_engine::tokens; the store's round
/// trips), read at each scrape.
#[derive(Debug)]
struct TokenizerFigures;

impl Collector for TokenizerFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let counted = ConstCounter::new(history_engine::tokens::bytes_tokenized());
        counted.encode(encoder.encode_descriptor(
            "history_tokens_counted_bytes",
            "Bytes handed to a tokenizer (not answered by a cache).",
            None,
            MetricType::Counter,
        )?)?;

        let cache = history_engine::tokens::cache_stats();
        let mut lookups = encoder.encode_descriptor(
            "history_token_cache_lookups",
            "Item token counts looked up by content, by result.",
            None,
            MetricType::Counter,
        )?;
        for (result, n) in [("hit", cache.hits), ("miss", cache.misses)] {
            ConstCounter::new(n).encode(lookups.encode_family(&[("result", result)])?)?;
        }

        ConstCounter::new(crate::store::round_trips()).encode(encoder.encode_descriptor(
            "history_store_round_trips",
            "PostgreSQL round trips (docs/scaling-out.md#round-trips).",
            None,
            MetricType::Counter,
        )?)?;

        let gauge = |n: u64| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        gauge(cache.entries).encode(encoder.encode_descriptor(
            "history_token_cache_entries",
            "Item token counts held by content (history_token_cache_capacity is the most).",
            None,
            MetricType::Gauge,
        )?)?;
        gauge(cache.capacity).encode(encoder.encode_descriptor(
            "history_token_cache_capacity",
            "The most item token counts held by content (token_cache_entries).",
            None,
            MetricType::Gauge,
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample line `name` (labels included) in `text`.
    fn sample(text: &str, name: &str) -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
            .to_string()
    }

    #[test]
    fn names_types_and_values_are_the_documented_ones() {
        let metrics = Metrics::new();
        let text = metrics.render(0);
        for (family, kind) in [
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
        ] {
            assert!(
                text.contains(&format!("\n# TYPE {family} {kind}\n")),
                "{family} {kind}:\n{text}"
            );
            assert!(text.contains(&format!("# HELP {family} ")), "{family}:\n{text}");
        }
        for outcome in TURN_OUTCOMES {
            assert_eq!(
                sample(&text, &format!("history_turns_total{{outcome=\"{outcome}\"}}")),
                "0"
            );
        }
        assert_eq!(sample(&text, "history_reloads_total{outcome=\"failed\"}"), "0");
        assert!(!text.contains("# EOF"), "the 0.0.4 format has no EOF line");

        metrics.turn("ok", 0.003);
        metrics.turn("ok", 7.0);
        metrics.turn("busy", 0.0);
        metrics.reload(true);
        metrics.store(0.002);
        metrics.plugin_failed("panicker");
        let text = metrics.render(2);
        assert_eq!(sample(&text, "history_turns_total{outcome=\"ok\"}"), "2");
        assert_eq!(sample(&text, "history_turns_total{outcome=\"busy\"}"), "1");
        assert_eq!(sample(&text, "history_turn_seconds_bucket{le=\"0.001\"}"), "1");
        assert_eq!(sample(&text, "history_turn_seconds_bucket{le=\"0.005\"}"), "2");
        assert_eq!(sample(&text, "history_turn_seconds_bucket{le=\"+Inf\"}"), "3");
        assert_eq!(sample(&text, "history_turn_seconds_count"), "3");
        assert_eq!(sample(&text, "history_turn_seconds_sum"), "7.003");
        assert_eq!(sample(&text, "history_reloads_total{outcome=\"ok\"}"), "1");
        assert_eq!(sample(&text, "history_store_seconds_count"), "1");
        assert_eq!(sample(&text, "history_sessions_live"), "2");
        assert_eq!(
            sample(
                &text,
                "history_plugin_errors_total{plugin=\"panicker\",kind=\"failed\"}"
            ),
            "1"
        );
        assert_eq!(
            metrics.plugin_totals("panicker"),
            PluginTotals {
                failed: 1,
                ..PluginTotals::default()
            }
        );
    }

    #[test]
    fn a_label_value_is_escaped() {
        let metrics = Metrics::new();
        metrics.plugin_failed("a\"b\\c\nd");
        let text = metrics.render(0);
        assert!(
            text.contains(r#"history_plugin_errors_total{plugin="a\"b\\c\nd",kind="failed"} 1"#),
            "{text}"
        );
    }
}
