//! What `GET /v1/chain` shows (docs/http-api.md): the running chain's stages with their
//! figures, the host-wide settings, the last reload. Typed here; the server renders it.

use super::Service;
use crate::metrics::PluginTotals;
use crate::reload::state::LastReload;

/// Where a stage runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StagePlace {
    Ingest,
    Chain,
    View,
}

/// One stage of the running chain.
#[derive(Debug, Clone)]
pub struct StageInfo {
    pub name: String,
    pub version: String,
    pub place: StagePlace,
    /// Its calls, time and faults since the host started.
    pub totals: PluginTotals,
    /// A call ran past `plugin_timeout_ms` (docs/chain.md#deadline).
    pub quarantined: bool,
    /// An isolated plugin's worker processes started so far (docs/chain.md#isolation).
    pub worker_starts: Option<u64>,
    /// A process plugin's program starts so far (docs/process-plugins.md#faults).
    pub program_starts: Option<u64>,
}

/// The running chain and the host-wide settings.
#[derive(Debug, Clone)]
pub struct ChainReport {
    pub stages: Vec<StageInfo>,
    pub on_plugin_error: &'static str,
    pub agent_max_ctx: u64,
    pub max_users: u64,
    pub session_idle_timeout_minutes: u64,
    pub last_reload: Option<LastReload>,
}

impl Service {
    /// The running chain, stage by stage in the order a turn runs them.
    pub fn chain_report(&self) -> ChainReport {
        let chain = self.chain();
        let config = self.config();
        let places = [
            (chain.ingest_stages(), StagePlace::Ingest),
            (chain.stages(), StagePlace::Chain),
            (chain.view_stages(), StagePlace::View),
        ];
        let stages = places
            .into_iter()
            .flat_map(|(stages, place)| stages.iter().map(move |stage| (stage, place)))
            .map(|(stage, place)| StageInfo {
                name: stage.name.clone(),
                version: stage.version.clone(),
                place,
                totals: self.metrics.plugin_totals(&stage.name),
                quarantined: stage.is_quarantined(),
                worker_starts: stage.worker_starts(),
                program_starts: stage.program_starts(),
            })
            .collect();
        ChainReport {
            stages,
            on_plugin_error: chain.on_error().as_str(),
            agent_max_ctx: config.agent_max_ctx,
            max_users: config.max_users,
            session_idle_timeout_minutes: config.session_idle_timeout_minutes,
            last_reload: self.last_reload(),
        }
    }

    /// The metrics in Prometheus' text format 0.0.4 (docs/http-api.md#metrics).
    pub fn metrics_text(&self) -> String {
        self.metrics.render(self.live_sessions())
    }
}
