//! The service's counters, rendered in the Prometheus text format (docs/http-api.md#metrics).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use history_engine::ChainRun;

/// Upper bounds of the turn-time histogram, in seconds.
const BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

#[derive(Default)]
struct Inner {
    turns: BTreeMap<&'static str, u64>,
    turn_buckets: [u64; BUCKETS.len()],
    turn_count: u64,
    turn_sum: f64,
    /// Per plugin: calls, seconds.
    plugin_time: BTreeMap<String, (u64, f64)>,
    /// Per (plugin, kind): errors (`skipped`, `failed`; `quarantined`: a run in which the
    /// plugin was quarantined, by a late call or an earlier one).
    plugin_errors: BTreeMap<(String, &'static str), u64>,
    tokens_in: u64,
    tokens_out: u64,
    store_count: u64,
    store_sum: f64,
    /// Chain reloads: swapped in, refused.
    reloads_ok: u64,
    reloads_failed: u64,
}

/// Per-plugin totals for `GET /v1/chain`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PluginTotals {
    pub calls: u64,
    pub seconds: f64,
    pub skipped: u64,
    pub failed: u64,
}

/// The service's metrics.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A turn ended with `outcome` (`ok`, `bad_input`, `plugin_failed`, `busy`, …) after
    /// `seconds`.
    pub fn turn(&self, outcome: &'static str, seconds: f64) {
        let mut m = self.lock();
        *m.turns.entry(outcome).or_default() += 1;
        m.turn_count += 1;
        m.turn_sum += seconds;
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                m.turn_buckets[i] += 1;
            }
        }
    }

    /// What a chain run's stages did.
    pub fn run(&self, run: &ChainRun) {
        let mut m = self.lock();
        for stage in &run.stages {
            let entry = m.plugin_time.entry(stage.plugin.clone()).or_default();
            entry.0 += 1;
            entry.1 += stage.elapsed.as_secs_f64();
            if stage.skipped.is_some() {
                *m.plugin_errors
                    .entry((stage.plugin.clone(), "skipped"))
                    .or_default() += 1;
            }
            if stage.quarantined {
                *m.plugin_errors
                    .entry((stage.plugin.clone(), "quarantined"))
                    .or_default() += 1;
            }
        }
        m.tokens_in += run.tokens_in;
        m.tokens_out += run.tokens_out;
    }

    /// A plugin failed a turn.
    pub fn plugin_failed(&self, plugin: &str) {
        *self
            .lock()
            .plugin_errors
            .entry((plugin.to_string(), "failed"))
            .or_default() += 1;
    }

    /// A chain reload was swapped in (`ok`) or refused.
    pub fn reload(&self, ok: bool) {
        let mut m = self.lock();
        if ok {
            m.reloads_ok += 1;
        } else {
            m.reloads_failed += 1;
        }
    }

    /// A store transaction took `seconds`.
    pub fn store(&self, seconds: f64) {
        let mut m = self.lock();
        m.store_count += 1;
        m.store_sum += seconds;
    }

    /// Per-plugin totals.
    pub fn plugin_totals(&self, plugin: &str) -> PluginTotals {
        let m = self.lock();
        let (calls, seconds) = m.plugin_time.get(plugin).copied().unwrap_or_default();
        let errors = |kind| {
            m.plugin_errors
                .get(&(plugin.to_string(), kind))
                .copied()
                .unwrap_or(0)
        };
        PluginTotals {
            calls,
            seconds,
            skipped: errors("skipped"),
            failed: errors("failed"),
        }
    }

    /// The Prometheus text format.
    pub fn render(&self, sessions_live: usize) -> String {
        let m = self.lock();
        let mut out = String::new();
        let _ = writeln!(out, "# HELP history_turns_total Turns by outcome.");
        let _ = writeln!(out, "# TYPE history_turns_total counter");
        for outcome in [
            "ok",
            "bad_input",
            "plugin_failed",
            "busy",
            "not_found",
            "store_failed",
        ] {
            let n = m.turns.get(outcome).copied().unwrap_or(0);
            let _ = writeln!(out, "history_turns_total{{outcome=\"{outcome}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP history_turn_seconds Time of a turn, chain and store."
        );
        let _ = writeln!(out, "# TYPE history_turn_seconds histogram");
        for (i, bound) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "history_turn_seconds_bucket{{le=\"{bound}\"}} {}",
                m.turn_buckets[i]
            );
        }
        let _ = writeln!(out, "history_turn_seconds_bucket{{le=\"+Inf\"}} {}", m.turn_count);
        let _ = writeln!(out, "history_turn_seconds_sum {}", m.turn_sum);
        let _ = writeln!(out, "history_turn_seconds_count {}", m.turn_count);
        let _ = writeln!(out, "# HELP history_plugin_seconds Time spent in each plugin.");
        let _ = writeln!(out, "# TYPE history_plugin_seconds summary");
        for (plugin, (calls, seconds)) in &m.plugin_time {
            let _ = writeln!(out, "history_plugin_seconds_sum{{plugin=\"{plugin}\"}} {seconds}");
            let _ = writeln!(out, "history_plugin_seconds_count{{plugin=\"{plugin}\"}} {calls}");
        }
        let _ = writeln!(
            out,
            "# HELP history_plugin_errors_total Plugin faults, skipped or failing the turn."
        );
        let _ = writeln!(out, "# TYPE history_plugin_errors_total counter");
        for ((plugin, kind), n) in &m.plugin_errors {
            let _ = writeln!(
                out,
                "history_plugin_errors_total{{plugin=\"{plugin}\",kind=\"{kind}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP history_tokens_total Tokens into and out of the chain."
        );
        let _ = writeln!(out, "# TYPE history_tokens_total counter");
        let _ = writeln!(out, "history_tokens_total{{direction=\"in\"}} {}", m.tokens_in);
        let _ = writeln!(out, "history_tokens_total{{direction=\"out\"}} {}", m.tokens_out);
        let cache = history_engine::tokens::cache_stats();
        let _ = writeln!(
            out,
            "# HELP history_tokens_counted_bytes_total Bytes handed to a tokenizer (not answered by a cache)."
        );
        let _ = writeln!(out, "# TYPE history_tokens_counted_bytes_total counter");
        let _ = writeln!(
            out,
            "history_tokens_counted_bytes_total {}",
            history_engine::tokens::bytes_tokenized()
        );
        let _ = writeln!(
            out,
            "# HELP history_token_cache_lookups_total Item token counts looked up by content, by result."
        );
        let _ = writeln!(out, "# TYPE history_token_cache_lookups_total counter");
        let _ = writeln!(
            out,
            "history_token_cache_lookups_total{{result=\"hit\"}} {}",
            cache.hits
        );
        let _ = writeln!(
            out,
            "history_token_cache_lookups_total{{result=\"miss\"}} {}",
            cache.misses
        );
        let _ = writeln!(
            out,
            "# HELP history_token_cache_entries Item token counts held by content (token_cache_entries is the most)."
        );
        let _ = writeln!(out, "# TYPE history_token_cache_entries gauge");
        let _ = writeln!(out, "history_token_cache_entries {}", cache.entries);
        let _ = writeln!(out, "history_token_cache_capacity {}", cache.capacity);
        let _ = writeln!(out, "# HELP history_sessions_live Live sessions.");
        let _ = writeln!(out, "# TYPE history_sessions_live gauge");
        let _ = writeln!(out, "history_sessions_live {sessions_live}");
        let _ = writeln!(out, "# HELP history_reloads_total Chain reloads by outcome.");
        let _ = writeln!(out, "# TYPE history_reloads_total counter");
        let _ = writeln!(out, "history_reloads_total{{outcome=\"ok\"}} {}", m.reloads_ok);
        let _ = writeln!(
            out,
            "history_reloads_total{{outcome=\"failed\"}} {}",
            m.reloads_failed
        );
        let _ = writeln!(out, "# HELP history_store_seconds Time of store transactions.");
        let _ = writeln!(out, "# TYPE history_store_seconds summary");
        let _ = writeln!(out, "history_store_seconds_sum {}", m.store_sum);
        let _ = writeln!(out, "history_store_seconds_count {}", m.store_count);
        let _ = writeln!(out, "# HELP history_store_round_trips_total PostgreSQL round trips (docs/scaling-out.md#round-trips).\n# TYPE history_store_round_trips_total counter\nhistory_store_round_trips_total {}", crate::store::round_trips());
        out
    }
}
