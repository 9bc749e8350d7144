//! A stateless call of the chain (the proxy without `X-History-Session`,
//! docs/proxy.md#stateless-by-default): nothing stored, every message entering. The
//! service runs it so the caller knows no chain, configuration or metrics: it gets the run
//! and what model it ran as.

use std::sync::Arc;

use history_engine::{stateless_context, ChainRun};
use plugin_api::{Message, RArc};

use super::Service;
use crate::error::{ErrorKind, SessionError};

/// What a stateless call gives.
pub struct StatelessRun {
    pub run: ChainRun,
    /// The model named by the call when the configuration does not list it: the call ran
    /// with `[models.default]` (docs/configuration.md#unknown-models).
    pub unknown_model: Option<String>,
}

impl Service {
    /// Runs the chain (ingest, chain, view) on `history`, its messages already parsed and
    /// prepared for `turn`, on a blocking thread; records the run's metrics and logs its
    /// summary line as `who`'s. A model the configuration does not list runs as `default`,
    /// never refused: a stateless caller's model names are the upstream's to judge.
    pub async fn run_stateless(
        self: &Arc<Self>,
        who: &'static str,
        history: Vec<RArc<Message>>,
        turn: u64,
        model: Option<String>,
    ) -> Result<StatelessRun, SessionError> {
        let service = self.clone();
        tokio::task::spawn_blocking(move || {
            let config = service.config();
            let chain = service.chain();
            let (name, unknown_model) = match model {
                Some(name) if !config.is_listed_model(&name) => {
                    service.warn_unknown_model(who, &config, &name);
                    ("default".to_string(), Some(name))
                }
                Some(name) => (name, None),
                None => ("default".to_string(), None),
            };
            let ctx = stateless_context(&config, config.model(&name), turn);
            match chain.run_entering(history, &ctx, None) {
                Ok(run) => {
                    service.metrics.run(&run);
                    tracing::info!("{who}: {}", history_engine::summary::summary_line(&run));
                    Ok(StatelessRun { run, unknown_model })
                }
                Err(failure) => {
                    service.metrics.plugin_failed(&failure.plugin);
                    tracing::warn!("{who}: request refused: {failure}");
                    Err(SessionError {
                        plugin: Some(failure.plugin.clone()),
                        ..SessionError::new(ErrorKind::PluginFailed, failure.to_string())
                    })
                }
            }
        })
        .await
        .unwrap_or_else(|e| {
            Err(SessionError::new(
                ErrorKind::Store,
                format!("the chain run failed: {e}"),
            ))
        })
    }
}

/// How many unknown model names the service remembers having warned about.
const MAX_WARNED_MODELS: usize = 256;

impl Service {
    /// Logs once per name (up to [`MAX_WARNED_MODELS`] names) that a stateless call named a
    /// model the configuration does not list: every request would flood the log.
    fn warn_unknown_model(&self, who: &str, config: &history_engine::Config, name: &str) {
        let mut warned = self.warned_models.lock().unwrap_or_else(|e| e.into_inner());
        if warned.len() < MAX_WARNED_MODELS && warned.insert(name.to_string()) {
            if let Some(warning) = config.unlisted_model(name) {
                tracing::warn!(
                    "{who}: {} (said once per model)",
                    history_engine::echo::line(&warning)
                );
            }
        }
    }
}
