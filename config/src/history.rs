//! `[history]` (docs/configuration.md): the window, the chain and its view, ingest, what a
//! plugin's fault does, and which plugins are required or isolated; each list checked
//! against the others (a plugin runs in one place).

use plugin_api::echo;
use toml_edit::Table;

use super::{
    check_default_first, parse_plugin_list, Reader, DEFAULT_AGENT_MAX_CTX, DEFAULT_PLUGIN_TIMEOUT_MS,
};
use crate::{ConfigError, OnPluginError};

/// `[history]`, checked.
#[derive(Debug, Clone)]
pub(super) struct HistoryTable {
    pub agent_max_ctx: u64,
    pub chain: Vec<String>,
    pub view: Vec<String>,
    pub ingest: Vec<String>,
    pub on_plugin_error: OnPluginError,
    pub required: Vec<String>,
    pub isolate: Vec<String>,
    pub plugin_timeout_ms: u64,
}

impl Default for HistoryTable {
    /// A file without `[history]`: `default` alone.
    fn default() -> Self {
        HistoryTable {
            agent_max_ctx: DEFAULT_AGENT_MAX_CTX,
            chain: vec!["default".to_string()],
            view: Vec::new(),
            ingest: Vec::new(),
            on_plugin_error: OnPluginError::Skip,
            required: Vec::new(),
            isolate: Vec::new(),
            plugin_timeout_ms: DEFAULT_PLUGIN_TIMEOUT_MS,
        }
    }
}

/// Reads and checks `[history]` (`history`).
pub(super) fn read(reader: &Reader<'_>, history: &Table) -> Result<HistoryTable, ConfigError> {
    let defaults = HistoryTable::default();
    let (mut chain, mut view, mut ingest, mut required, mut isolate) =
        (defaults.chain, Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let place = "[history]";
    reader.refuse_unknown(
        history,
        place,
        &[
            "agent_max_ctx",
            "chain",
            "view",
            "on_plugin_error",
            "plugin_timeout_ms",
            "required",
            "isolate",
            "ingest",
        ],
    )?;
    let plugin_timeout_ms = reader
        .integer(history, "plugin_timeout_ms", place, 0)?
        .unwrap_or(DEFAULT_PLUGIN_TIMEOUT_MS);
    let agent_max_ctx = reader
        .integer(history, "agent_max_ctx", place, 1)?
        .unwrap_or(DEFAULT_AGENT_MAX_CTX);
    if let Some(item) = history.get("chain") {
        chain = parse_plugin_list(reader, history, "chain", item)?;
        check_default_first(reader, history, &chain)?;
    }
    if let Some(item) = history.get("view") {
        view = parse_plugin_list(reader, history, "view", item)?;
        for name in &view {
            let refuse = |message: String| Err(reader.key_error(history, "view", message));
            if name == "default" {
                return refuse(
                    "\"default\" cannot be in the view: it is the first stage of the chain".to_string(),
                );
            }
            if chain.contains(name) {
                return refuse(format!(
                    "plugin \"{name}\" is in both the chain and the view: a plugin runs in one of them"
                ));
            }
        }
    }
    if let Some(item) = history.get("ingest") {
        ingest = parse_plugin_list(reader, history, "ingest", item)?;
        for name in &ingest {
            let refuse = |message: String| Err(reader.key_error(history, "ingest", message));
            if name == "default" {
                return refuse(
                    "\"default\" cannot be in ingest: it is the first stage of the chain".to_string(),
                );
            }
            if chain.contains(name) || view.contains(name) {
                return refuse(format!(
                    "plugin \"{name}\" is in ingest and in the {}: a plugin runs in one of them",
                    if chain.contains(name) { "chain" } else { "view" }
                ));
            }
        }
    }
    let on_plugin_error = match reader.string(history, "on_plugin_error", place)? {
        None | Some("skip") => OnPluginError::Skip,
        Some("fail") => OnPluginError::Fail,
        Some(other) => {
            return Err(reader.key_error(
                history,
                "on_plugin_error",
                format!(
                    "`on_plugin_error` must be \"skip\" or \"fail\", found {}",
                    echo::quoted(other)
                ),
            ))
        }
    };
    if let Some(item) = history.get("required") {
        required = parse_plugin_list(reader, history, "required", item)?;
        if let Some(name) = required
            .iter()
            .find(|n| !chain.contains(n) && !view.contains(n) && !ingest.contains(n))
        {
            return Err(reader.key_error(
                history,
                "required",
                format!(
                    "plugin \"{name}\" in `required` is in neither the chain nor the view: a required plugin must run"
                ),
            ));
        }
    }
    if let Some(item) = history.get("isolate") {
        isolate = parse_plugin_list(reader, history, "isolate", item)?;
        if let Some(name) = isolate
            .iter()
            .find(|n| !chain.contains(n) && !view.contains(n) && !ingest.contains(n))
        {
            return Err(reader.key_error(
                history,
                "isolate",
                format!(
                    "plugin \"{name}\" in `isolate` is in neither the chain nor the view: only a plugin that runs can be isolated"
                ),
            ));
        }
    }
    Ok(HistoryTable {
        agent_max_ctx,
        chain,
        view,
        ingest,
        on_plugin_error,
        required,
        isolate,
        plugin_timeout_ms,
    })
}
