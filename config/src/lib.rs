//! `plugins-enabled.toml` (docs/configuration.md): parsing and validation with errors that name the
//! key and the line. `agentctl` validates its edits with this same code before writing.

use std::path::{Path, PathBuf};

use plugin_api::echo;
use plugin_api::naming::is_plugin_name;
#[cfg(test)]
use plugin_api::parts::ImageTokens;
use plugin_api::parts::MediaRules;
use plugin_api::{ModelInfo, Tokenizer};
use toml_edit::{Document, Item, Table, Value};

pub mod edit;
mod history;
mod models;
use history::HistoryTable;
mod server;
mod store;
pub use models::{media_rules, ModelTable, UnknownModels};
pub use server::{ServerConfig, DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S, DEFAULT_SHUTDOWN_GRACE_S};
mod summarizer;
mod ui;
mod upstream;
pub mod write;
pub use store::{StoreLimits, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_KEEPALIVE_S, DEFAULT_STATEMENT_TIMEOUT_MS};
pub use summarizer::{SummarizerConfig, DEFAULT_SUMMARIZER_MAX_CHARS_IN, DEFAULT_SUMMARIZER_TIMEOUT_MS};
pub use ui::{UiConfig, DEFAULT_UI_MAX_BODY_KB};
pub use upstream::{
    UpstreamConfig, DEFAULT_MAX_RECALL_ROUNDS, DEFAULT_UPSTREAM_MAX_CONNECTIONS,
    DEFAULT_UPSTREAM_READ_TIMEOUT_S, DEFAULT_UPSTREAM_TIMEOUT_S,
};

/// Where the chain's plugins live when the file does not say.
pub(crate) const DEFAULT_PLUGIN_DIR: &str = "target/plugins";
pub(crate) const DEFAULT_MAX_USERS: u64 = 50;
pub(crate) const DEFAULT_IDLE_TIMEOUT_MINUTES: u64 = 60;
pub const DEFAULT_AGENT_MAX_CTX: u64 = 200;
pub(crate) const DEFAULT_CONTEXT_TOKENS: u64 = 128_000;
pub(crate) const DEFAULT_TOKENIZER: Tokenizer = Tokenizer::O200kBase;
/// The session store when the file does not say: beside the configuration.
pub const DEFAULT_STORE: &str = "sessions.db";
pub const DEFAULT_MAX_BODY_MB: u64 = 64;
/// `[history] plugin_timeout_ms` when the file does not say.
pub const DEFAULT_PLUGIN_TIMEOUT_MS: u64 = 2000;
/// `session_memory_mb` when omitted: no limit on the live sessions the session service
/// keeps in memory (docs/sessions.md#memory); `max_users` bounds them.
pub const DEFAULT_SESSION_MEMORY_MB: u64 = 0;
/// `token_cache_entries` when omitted: item token counts remembered by content.
pub const DEFAULT_TOKEN_CACHE_ENTRIES: u64 = 1 << 18;
/// `on_plugin_error` (docs/chain.md#faults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnPluginError {
    /// Pass the history on as the failing plugin received it, and log a warning.
    Skip,
    /// Fail the turn.
    Fail,
}

impl OnPluginError {
    /// As written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            OnPluginError::Skip => "skip",
            OnPluginError::Fail => "fail",
        }
    }
}

/// A `[plugin.NAME]` table, handed to the plugin as JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginTable {
    pub name: String,
    pub json: serde_json::Value,
}

/// A configuration error: the file, the line when known, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file.display(), self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The parsed configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from.
    pub file: PathBuf,
    /// `plugin_dir`, resolved against the file's folder.
    pub plugin_dir: PathBuf,
    pub max_users: u64,
    pub session_idle_timeout_minutes: u64,
    /// `store`: the session service's store, a path resolved against the file's folder
    /// (see docs/sessions.md).
    pub store: PathBuf,
    /// `[store]`'s bounds on the waits for the store (docs/configuration.md#store).
    pub store_limits: StoreLimits,
    /// `operator_token_file`, resolved against the file's folder: the file holding the
    /// operator's token for the session service (see docs/http-api.md).
    pub operator_token_file: Option<PathBuf>,
    /// `max_body_mb`: the largest HTTP request body the session service reads, in MiB.
    pub max_body_mb: u64,
    /// `token_cache_entries`: how many item token counts the process remembers by content.
    pub token_cache_entries: u64,
    /// `session_memory_mb`: how much of the live sessions the session service keeps in
    /// memory, in MiB; the least recently used past it are read back from the store when
    /// used again. 0: every live session stays in memory.
    pub session_memory_mb: u64,
    /// `[upstream]`: the proxy's upstream, if configured.
    pub upstream: Option<UpstreamConfig>,
    /// `[server]`: the session service's connections (its defaults when absent).
    pub server: ServerConfig,
    /// `[summarizer]`: the endpoint behind the plugins' `summarize` service, if configured.
    pub summarizer: Option<SummarizerConfig>,
    /// `[ui]`: the inspector page's options (its defaults when absent).
    pub ui: UiConfig,
    pub agent_max_ctx: u64,
    /// `[history] chain`: its output is the working history, kept from turn to turn.
    pub chain: Vec<String>,
    /// `[history] view`: run after the chain on what is sent this turn; never kept.
    pub view: Vec<String>,
    pub on_plugin_error: OnPluginError,
    /// `[history] plugin_timeout_ms`: how long one plugin call may run before it is that
    /// plugin's fault and the plugin is quarantined; 0 = no deadline (docs/chain.md#deadline).
    pub plugin_timeout_ms: u64,
    /// `[history] required`: plugins whose fault fails the turn even under
    /// `on_plugin_error = "skip"` (each one in the chain or the view).
    pub required: Vec<String>,
    /// `[history] isolate`: plugins that run in a worker process of their own, so an
    /// abort, an exit or a crash in them ends the worker, not the host (each one in the
    /// chain or the view; docs/chain.md#isolation).
    pub isolate: Vec<String>,
    /// `[history] ingest`: plugins run on a turn's new messages before anything is stored,
    /// their output stored as the transcript; required by nature (docs/chain.md#ingest).
    pub ingest: Vec<String>,
    /// `[models.*]` in file order.
    pub models: Vec<(String, ModelTable)>,
    /// `[models] unknown`: what a session, a command or the proxy naming a model the file
    /// does not list gets (docs/configuration.md#unknown-models).
    pub unknown_models: UnknownModels,
    /// `[plugin.*]` in file order.
    pub plugins: Vec<PluginTable>,
    source: String,
    document: Document<String>,
}

/// Where a plugin runs: its list (`chain` or `view`) and its position there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub view: bool,
    pub position: usize,
}

impl Place {
    /// `chain` or `view`.
    pub fn list(self) -> &'static str {
        if self.view {
            "view"
        } else {
            "chain"
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.view {
            write!(f, "view position {}", self.position)
        } else {
            write!(f, "position {}", self.position)
        }
    }
}

struct Reader<'a> {
    file: &'a Path,
    source: &'a str,
}

impl Reader<'_> {
    fn line_of(&self, offset: usize) -> usize {
        line_at(self.source, offset)
    }

    fn error(&self, span: Option<std::ops::Range<usize>>, message: String) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            line: span.map(|s| self.line_of(s.start)),
            message,
        }
    }

    fn key_error(&self, table: &Table, key: &str, message: String) -> ConfigError {
        self.error(table.key(key).and_then(|k| k.span()), message)
    }

    fn refuse_unknown(&self, table: &Table, place: &str, known: &[&str]) -> Result<(), ConfigError> {
        for (key, _) in table.iter() {
            if !known.contains(&key) {
                return Err(self.key_error(
                    table,
                    key,
                    format!(
                        "unknown key `{}` in {place} (known: {})",
                        echo::bare(key),
                        known.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    fn table<'t>(&self, parent: &'t Table, key: &str, place: &str) -> Result<Option<&'t Table>, ConfigError> {
        match parent.get(key) {
            None => Ok(None),
            Some(Item::Table(table)) => Ok(Some(table)),
            Some(_) => Err(self.key_error(parent, key, format!("`{key}` in {place} must be a table"))),
        }
    }

    fn integer(&self, table: &Table, key: &str, place: &str, min: u64) -> Result<Option<u64>, ConfigError> {
        match table.get(key) {
            None => Ok(None),
            Some(item) => match item.as_integer() {
                Some(n) if n >= 0 && n as u64 >= min => Ok(Some(n as u64)),
                _ => Err(self.key_error(
                    table,
                    key,
                    format!(
                        "`{key}` in {place} must be an integer ≥ {min}, found {}",
                        shown(item)
                    ),
                )),
            },
        }
    }

    fn boolean(&self, table: &Table, key: &str, place: &str) -> Result<Option<bool>, ConfigError> {
        match table.get(key) {
            None => Ok(None),
            Some(item) => match item.as_bool() {
                Some(b) => Ok(Some(b)),
                None => Err(self.key_error(
                    table,
                    key,
                    format!("`{key}` in {place} must be true or false, found {}", shown(item)),
                )),
            },
        }
    }

    /// An `http://` or `https://` base URL, its trailing `/` dropped; anything else an error
    /// naming the key. `None` when the key is missing.
    fn http_url(&self, table: &Table, key: &str, place: &str) -> Result<Option<String>, ConfigError> {
        match self.string(table, key, place)? {
            None => Ok(None),
            Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
                Ok(Some(url.trim_end_matches('/').to_string()))
            }
            Some(url) => Err(self.key_error(
                table,
                key,
                format!(
                    "`{key}` in {place} must be an http:// or https:// URL, found \"{}\"",
                    echo::bare(url)
                ),
            )),
        }
    }

    fn string<'t>(&self, table: &'t Table, key: &str, place: &str) -> Result<Option<&'t str>, ConfigError> {
        match table.get(key) {
            None => Ok(None),
            Some(item) => match item.as_str() {
                Some(s) => Ok(Some(s)),
                None => Err(self.key_error(
                    table,
                    key,
                    format!("`{key}` in {place} must be a string, found {}", shown(item)),
                )),
            },
        }
    }

    /// An array of strings.
    fn strings(&self, table: &Table, key: &str, place: &str) -> Result<Option<Vec<String>>, ConfigError> {
        let Some(item) = table.get(key) else {
            return Ok(None);
        };
        let strings = item
            .as_array()
            .and_then(|array| array.iter().map(|v| v.as_str().map(str::to_string)).collect());
        strings.map(Some).ok_or_else(|| {
            self.key_error(
                table,
                key,
                format!(
                    "`{key}` in {place} must be an array of strings, found {}",
                    shown(item)
                ),
            )
        })
    }
}

/// A `ca_file` must be readable and hold at least one PEM certificate: said at load, not
/// at the first request. The certificates themselves are parsed by the proxy's client.
fn check_ca_file(file: &Path) -> Result<(), String> {
    let text = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    if !text
        .windows(CERTIFICATE_PEM.len())
        .any(|w| w == CERTIFICATE_PEM.as_bytes())
    {
        return Err(format!(
            "{} holds no PEM certificate (a \"{CERTIFICATE_PEM}\" block)",
            file.display()
        ));
    }
    Ok(())
}

const CERTIFICATE_PEM: &str = "-----BEGIN CERTIFICATE-----";

fn shown(item: &Item) -> String {
    match item {
        Item::Value(value) => echo::bare(value.to_string().trim()),
        Item::Table(_) | Item::ArrayOfTables(_) => "a table".to_string(),
        Item::None => "nothing".to_string(),
    }
}

fn line_at(source: &str, offset: usize) -> usize {
    source.as_bytes()[..offset.min(source.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        let source = std::fs::read_to_string(file).map_err(|err| ConfigError {
            file: file.to_path_buf(),
            line: None,
            message: format!("cannot read the configuration: {err}"),
        })?;
        Config::parse(file, source)
    }

    /// Validates configuration text as if read from `file` (agentctl checks its edits so).
    pub fn parse(file: &Path, source: String) -> Result<Config, ConfigError> {
        let reader = Reader {
            file,
            source: &source,
        };
        let document = Document::parse(source.clone()).map_err(|err| {
            let line = err.span().map(|s| line_at(&source, s.start));
            let message = err.message().to_string();
            ConfigError {
                file: file.to_path_buf(),
                line,
                message: format!("not valid TOML: {message}"),
            }
        })?;
        let root = document.as_table();
        reader.refuse_unknown(
            root,
            "the top level",
            &[
                "plugin_dir",
                "max_users",
                "session_idle_timeout_minutes",
                "store",
                "operator_token_file",
                "max_body_mb",
                "token_cache_entries",
                "session_memory_mb",
                "upstream",
                "server",
                "summarizer",
                "ui",
                "history",
                "models",
                "plugin",
            ],
        )?;
        let base = file.parent().unwrap_or(Path::new("."));
        let plugin_dir = base.join(
            reader
                .string(root, "plugin_dir", "the top level")?
                .unwrap_or(DEFAULT_PLUGIN_DIR),
        );
        let max_users = reader
            .integer(root, "max_users", "the top level", 1)?
            .unwrap_or(DEFAULT_MAX_USERS);
        let session_idle_timeout_minutes = reader
            .integer(root, "session_idle_timeout_minutes", "the top level", 0)?
            .unwrap_or(DEFAULT_IDLE_TIMEOUT_MINUTES);
        let (store, store_limits) = store::read(&reader, root, base)?;
        let operator_token_file = match reader.string(root, "operator_token_file", "the top level")? {
            Some("") => {
                return Err(reader.key_error(
                    root,
                    "operator_token_file",
                    "`operator_token_file` must not be empty".to_string(),
                ))
            }
            Some(path) => Some(base.join(path)),
            None => None,
        };
        let max_body_mb = reader
            .integer(root, "max_body_mb", "the top level", 1)?
            .unwrap_or(DEFAULT_MAX_BODY_MB);
        let token_cache_entries = reader
            .integer(root, "token_cache_entries", "the top level", 0)?
            .unwrap_or(DEFAULT_TOKEN_CACHE_ENTRIES);
        let session_memory_mb = reader
            .integer(root, "session_memory_mb", "the top level", 0)?
            .unwrap_or(DEFAULT_SESSION_MEMORY_MB);
        let upstream = match reader.table(root, "upstream", "the top level")? {
            None => None,
            Some(table) => Some(upstream::read(&reader, table, base)?),
        };

        let HistoryTable {
            agent_max_ctx,
            chain,
            view,
            ingest,
            on_plugin_error,
            required,
            isolate,
            plugin_timeout_ms,
        } = match reader.table(root, "history", "the top level")? {
            Some(table) => history::read(&reader, table)?,
            None => HistoryTable::default(),
        };

        let server = match reader.table(root, "server", "the top level")? {
            Some(table) => server::read(&reader, table)?,
            None => ServerConfig::default(),
        };

        let summarizer = match reader.table(root, "summarizer", "the top level")? {
            Some(table) => Some(summarizer::read(&reader, root, table)?),
            None => None,
        };

        let ui = match reader.table(root, "ui", "the top level")? {
            Some(table) => ui::read(&reader, table)?,
            None => UiConfig::default(),
        };

        let (models, unknown_models) = match reader.table(root, "models", "the top level")? {
            None => (Vec::new(), UnknownModels::default()),
            Some(table) => models::read(&reader, table)?,
        };

        let mut plugins = Vec::new();
        if let Some(table) = reader.table(root, "plugin", "the top level")? {
            for (name, _) in table.iter() {
                if !is_plugin_name(name) {
                    return Err(reader.key_error(
                        table,
                        name,
                        format!("[plugin.{}]: not a plugin name", echo::bare(name)),
                    ));
                }
                let Some(plugin) = reader.table(table, name, "[plugin]")? else {
                    continue;
                };
                plugins.push(PluginTable {
                    name: name.to_string(),
                    json: table_to_json(plugin),
                });
            }
        }

        Ok(Config {
            file: file.to_path_buf(),
            plugin_dir,
            max_users,
            session_idle_timeout_minutes,
            store,
            store_limits,
            operator_token_file,
            max_body_mb,
            token_cache_entries,
            session_memory_mb,
            upstream,
            server,
            summarizer,
            ui,
            agent_max_ctx,
            chain,
            view,
            on_plugin_error,
            plugin_timeout_ms,
            required,
            isolate,
            ingest,
            models,
            unknown_models,
            plugins,
            source,
            document,
        })
    }

    /// Where plugin `name` runs, if it is in the chain or the view.
    pub fn place_of(&self, name: &str) -> Option<Place> {
        let find = |names: &[String], view| {
            names
                .iter()
                .position(|n| n == name)
                .map(|position| Place { view, position })
        };
        find(&self.chain, false).or_else(|| find(&self.view, true))
    }

    /// Whether plugin `name` is in `[history] required`: its fault fails the turn
    /// whatever `on_plugin_error` says.
    pub fn is_required(&self, name: &str) -> bool {
        self.required.iter().any(|n| n == name)
    }

    /// Whether plugin `name` is in `[history] isolate`: it runs in a worker process.
    pub fn is_isolated(&self, name: &str) -> bool {
        self.isolate.iter().any(|n| n == name)
    }

    /// The settings a call on model `name` gets: the listed table, keys it lacks from
    /// `[models.default]`, then the built-in defaults.
    pub fn model(&self, name: &str) -> ModelInfo {
        let table = |n: &str| self.models.iter().find(|(m, _)| m == n).map(|(_, t)| t);
        let listed = table(name);
        let fallback = table("default");
        let pick = |f: fn(&ModelTable) -> Option<u64>| listed.and_then(f).or_else(|| fallback.and_then(f));
        let max_context = pick(|t| t.max_context).unwrap_or(self.agent_max_ctx);
        ModelInfo {
            name: name.into(),
            max_context,
            context_tokens: pick(|t| t.context_tokens).unwrap_or(DEFAULT_CONTEXT_TOKENS),
            tokenizer: listed
                .and_then(|t| t.tokenizer)
                .or_else(|| fallback.and_then(|t| t.tokenizer))
                .unwrap_or(DEFAULT_TOKENIZER),
            effective_ctx: self.agent_max_ctx.min(max_context),
        }
    }

    /// The rules a call on model `name` counts images and documents by
    /// (docs/configuration.md#models): each key from the listed table, else from
    /// `[models.default]`, else the defaults of the name's provider family.
    pub fn media_rules(&self, name: &str) -> MediaRules {
        media_rules(&self.models, name)
    }

    /// Whether the file lists model `name` (`default` always counts: it is what a call
    /// naming no model gets).
    pub fn is_listed_model(&self, name: &str) -> bool {
        name == "default" || self.models.iter().any(|(n, _)| n == name)
    }

    /// Model `name` for a session or a command: its settings when it is listed or
    /// `[models] unknown = "default"` takes any name; else the refusal, naming the listed
    /// models and the way out.
    pub fn known_model(&self, name: &str) -> Result<ModelInfo, String> {
        if self.is_listed_model(name) || self.unknown_models == UnknownModels::Default {
            return Ok(self.model(name));
        }
        Err(format!(
            "unknown model {} (known: {}); list it as a [models.NAME] table in {}, or set \
             [models] unknown = \"default\" to give unknown names [models.default]",
            echo::quoted(name),
            self.listed_model_names().join(", "),
            self.file.display(),
        ))
    }

    /// The listed models' names, `default` among them.
    fn listed_model_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.models.iter().map(|(n, _)| n.as_str()).collect();
        if !names.contains(&"default") {
            names.insert(0, "default");
        }
        names
    }

    /// A warning when a call asks for model `name` and the file does not list it: which
    /// settings it gets instead. `None` for a listed model, and for `default` itself (what
    /// a call that names no model gets).
    pub fn unlisted_model(&self, name: &str) -> Option<String> {
        if name == "default" || self.models.iter().any(|(n, _)| n == name) {
            return None;
        }
        let fallback = if self.models.iter().any(|(n, _)| n == "default") {
            "[models.default]".to_string()
        } else {
            format!(
                "the built-in settings (max_context = agent_max_ctx = {}, context_tokens = {DEFAULT_CONTEXT_TOKENS}, tokenizer = {})",
                self.agent_max_ctx,
                DEFAULT_TOKENIZER.as_str()
            )
        };
        Some(format!(
            "model {} is not listed in {} (listed: {}): it gets {fallback}",
            echo::quoted(name),
            self.file.display(),
            if self.models.is_empty() {
                "none".to_string()
            } else {
                self.models
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ))
    }

    /// Every listed model plus `default` (what an unlisted model gets): what plugins
    /// check model-dependent values against at load.
    pub fn models_for_validation(&self) -> Vec<ModelInfo> {
        let mut names: Vec<&str> = self.models.iter().map(|(n, _)| n.as_str()).collect();
        if !names.contains(&"default") {
            names.push("default");
        }
        names.into_iter().map(|n| self.model(n)).collect()
    }

    /// The `[plugin.NAME]` table, if any.
    pub fn plugin_table(&self, name: &str) -> Option<&PluginTable> {
        self.plugins.iter().find(|p| p.name == name)
    }

    /// The line of `[plugin.NAME]`'s `key_path` (dotted), or of the table, if known.
    pub fn plugin_key_line(&self, name: &str, key_path: &str) -> Option<usize> {
        let plugins = self.document.as_table().get("plugin")?.as_table()?;
        let mut table = plugins.get(name)?.as_table()?;
        let mut span = plugins.key(name).and_then(|k| k.span());
        for part in key_path.split('.').filter(|p| !p.is_empty()) {
            // `patterns[1]`: an entry of an array value, named by a plugin.
            let (key, index) = match part.split_once('[') {
                Some((key, rest)) => (key, rest.strip_suffix(']').and_then(|i| i.parse::<usize>().ok())),
                None => (part, None),
            };
            span = table.key(key).and_then(|k| k.span()).or(span);
            if let Some(index) = index {
                // The entry's own line when the parser kept it, else the key's.
                let entry = table
                    .get(key)
                    .and_then(Item::as_array)
                    .and_then(|array| array.get(index))
                    .and_then(|value| value.span());
                span = entry.or(span);
                break;
            }
            match table.get(key).and_then(Item::as_table) {
                Some(inner) => table = inner,
                None => break,
            }
        }
        span.map(|s| line_at(&self.source, s.start))
    }

    /// The line of `key` in `[history]` (e.g. `chain`), if present.
    pub fn history_key_line(&self, key: &str) -> Option<usize> {
        let history = self.document.as_table().get("history")?.as_table()?;
        history
            .key(key)
            .and_then(|k| k.span())
            .map(|s| line_at(&self.source, s.start))
    }

    /// The line of `key` in `[summarizer]`, else of the table, if present.
    pub fn summarizer_key_line(&self, key: &str) -> Option<usize> {
        let root = self.document.as_table();
        let table = root.get("summarizer")?.as_table()?;
        table
            .key(key)
            .and_then(|k| k.span())
            .or_else(|| root.key("summarizer").and_then(|k| k.span()))
            .map(|s| line_at(&self.source, s.start))
    }

    /// The file's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// A [`ConfigError`] about this file.
    pub fn error(&self, line: Option<usize>, message: String) -> ConfigError {
        ConfigError {
            file: self.file.clone(),
            line,
            message,
        }
    }
}

/// A list of plugin names (`chain` or `view` in `[history]`): plain identifiers, each once.
fn parse_plugin_list(
    reader: &Reader<'_>,
    history: &Table,
    key: &str,
    item: &Item,
) -> Result<Vec<String>, ConfigError> {
    let error = |message: String| reader.key_error(history, key, message);
    let Some(array) = item.as_array() else {
        return Err(error(format!(
            "`{key}` in [history] must be an array of plugin names, found {}",
            shown(item)
        )));
    };
    let mut names: Vec<String> = Vec::new();
    for value in array.iter() {
        let Some(name) = value.as_str() else {
            return Err(error(format!(
                "`{key}` entries must be plugin names, found {}",
                echo::bare(value.to_string().trim())
            )));
        };
        if !is_plugin_name(name) {
            return Err(error(format!(
                "{key} entry {} is not a plugin name: names are plain identifiers (lowercase letters, digits, _), never paths",
                echo::quoted(name)
            )));
        }
        if names.iter().any(|n| n == name) {
            return Err(error(format!("plugin \"{name}\" is listed twice in the {key}")));
        }
        names.push(name.to_string());
    }
    Ok(names)
}

/// `default` is the chain's first stage, always: it can be neither moved nor removed.
fn check_default_first(reader: &Reader<'_>, history: &Table, chain: &[String]) -> Result<(), ConfigError> {
    let error = |message: String| reader.key_error(history, "chain", message);
    match chain.iter().position(|n| n == "default") {
        Some(0) => Ok(()),
        Some(at) => Err(error(format!(
            "\"default\" must be first in the chain (found at position {at}); it can be neither moved nor removed"
        ))),
        None => Err(error(
            "the chain must start with \"default\"; it can be neither moved nor removed".to_string(),
        )),
    }
}

/// A TOML table as JSON (dates and times become strings).
pub(crate) fn table_to_json(table: &Table) -> serde_json::Value {
    serde_json::Value::Object(
        table
            .iter()
            .filter_map(|(key, item)| item_to_json(item).map(|v| (key.to_string(), v)))
            .collect(),
    )
}

fn item_to_json(item: &Item) -> Option<serde_json::Value> {
    match item {
        Item::None => None,
        Item::Value(value) => Some(value_to_json(value)),
        Item::Table(table) => Some(table_to_json(table)),
        Item::ArrayOfTables(array) => Some(serde_json::Value::Array(
            array.iter().map(table_to_json).collect(),
        )),
    }
}

fn value_to_json(value: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        Value::String(s) => J::String(s.value().clone()),
        Value::Integer(i) => J::from(*i.value()),
        Value::Float(f) => serde_json::Number::from_f64(*f.value()).map_or(J::Null, J::Number),
        Value::Boolean(b) => J::Bool(*b.value()),
        Value::Datetime(d) => J::String(d.value().to_string()),
        Value::Array(a) => J::Array(a.iter().map(value_to_json).collect()),
        Value::InlineTable(t) => {
            J::Object(t.iter().map(|(k, v)| (k.to_string(), value_to_json(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/h/plugins-enabled.toml"), text.to_string())
    }

    #[test]
    fn omitted_keys_take_their_defaults() {
        let config = parse("").unwrap();
        assert_eq!(config.plugin_dir, Path::new("/etc/h/target/plugins"));
        assert_eq!(
            (
                config.max_users,
                config.session_idle_timeout_minutes,
                config.agent_max_ctx
            ),
            (50, 60, 200)
        );
        assert_eq!(config.chain, ["default"]);
        assert_eq!(config.on_plugin_error, OnPluginError::Skip);
        let model = config.model("gpt-x");
        assert_eq!(
            (model.max_context, model.context_tokens, model.effective_ctx),
            (200, 128_000, 200)
        );
    }

    #[test]
    fn service_keys_resolve_against_the_file_and_are_checked() {
        let config = parse("").unwrap();
        assert_eq!(config.store, Path::new("/etc/h/sessions.db"));
        assert_eq!(
            (config.operator_token_file.as_deref(), config.max_body_mb),
            (None, 64)
        );
        let config =
            parse("store = \"/var/lib/h.db\"\noperator_token_file = \"token\"\nmax_body_mb = 2\n").unwrap();
        assert_eq!(config.store, Path::new("/var/lib/h.db"));
        assert_eq!(
            config.operator_token_file.as_deref(),
            Some(Path::new("/etc/h/token"))
        );
        assert_eq!(config.max_body_mb, 2);
        let err = parse("max_users = 3\nmax_body_mb = 0\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(err.message.contains("`max_body_mb`"), "{err}");
        let err = parse("\nstore = 5\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(
            err.message.contains("`store` in the top level must be a string"),
            "{err}"
        );
        let config = parse("store = \"postgres://h/db\"\n").unwrap();
        assert_eq!(
            config.store,
            Path::new("postgres://h/db"),
            "a URL is kept as it is"
        );
        let err = parse("store = \"mysql://h/db\"\n").unwrap_err();
        assert!(err.message.contains("or a postgres:// URL"), "{err}");
    }

    #[test]
    fn store_as_a_table_carries_its_bounds_and_defaults_them() {
        use std::time::Duration;
        assert_eq!(parse("").unwrap().store_limits, StoreLimits::default());
        assert_eq!(
            StoreLimits::default().statement_timeout,
            Duration::from_millis(DEFAULT_STATEMENT_TIMEOUT_MS)
        );
        let config = parse(
            "[store]\nlocation = \"postgres://h/db\"\nconnect_timeout_ms = 700\nstatement_timeout_ms = 900\nkeepalive_s = 3\n",
        )
        .unwrap();
        assert_eq!(config.store, Path::new("postgres://h/db"));
        assert_eq!(
            config.store_limits,
            StoreLimits {
                connect_timeout: Duration::from_millis(700),
                statement_timeout: Duration::from_millis(900),
                keepalive: Duration::from_secs(3),
            }
        );
        let config = parse("[store]\nstatement_timeout_ms = 100\n").unwrap();
        assert_eq!(
            config.store,
            Path::new("/etc/h/sessions.db"),
            "the default location"
        );
        let err = parse("[store]\nstatement_timeout_ms = 0\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(
            err.message
                .contains("`statement_timeout_ms` in [store] must be an integer ≥ 1"),
            "{err}"
        );
        let err = parse("[store]\nlocaton = \"x.db\"\n").unwrap_err();
        assert!(err.message.contains("unknown key `locaton` in [store]"), "{err}");
    }

    #[test]
    fn plugin_timeout_ms_defaults_to_two_seconds_and_zero_turns_it_off() {
        assert_eq!(parse("").unwrap().plugin_timeout_ms, 2000);
        assert_eq!(
            parse("[history]\nplugin_timeout_ms = 0\n")
                .unwrap()
                .plugin_timeout_ms,
            0
        );
        assert_eq!(
            parse("[history]\nplugin_timeout_ms = 150\n")
                .unwrap()
                .plugin_timeout_ms,
            150
        );
        let err = parse("[history]\nchain = [\"default\"]\nplugin_timeout_ms = -1\n").unwrap_err();
        assert_eq!(err.line, Some(3));
        assert!(
            err.message
                .contains("`plugin_timeout_ms` in [history] must be an integer ≥ 0, found -1"),
            "{err}"
        );
        let err = parse("[history]\nplugin_timeout_ms = \"2s\"\n").unwrap_err();
        assert_eq!(err.line, Some(2));
    }

    #[test]
    fn the_upstream_and_the_token_cache_are_read_and_checked() {
        let config = parse("").unwrap();
        assert_eq!(config.upstream, None);
        assert_eq!(config.token_cache_entries, DEFAULT_TOKEN_CACHE_ENTRIES);
        assert_eq!(config.session_memory_mb, DEFAULT_SESSION_MEMORY_MB);
        let config =
            parse("token_cache_entries = 0\n[upstream]\nurl = \"http://127.0.0.1:8000/v1/\"\n").unwrap();
        assert_eq!(config.token_cache_entries, 0);
        assert_eq!(
            config.upstream,
            Some(UpstreamConfig {
                url: "http://127.0.0.1:8000/v1".to_string(),
                timeout_s: DEFAULT_UPSTREAM_TIMEOUT_S,
                read_timeout_s: DEFAULT_UPSTREAM_READ_TIMEOUT_S,
                max_connections: DEFAULT_UPSTREAM_MAX_CONNECTIONS,
                ..UpstreamConfig::default()
            })
        );
        let config =
            parse("[upstream]\nurl = \"http://u/v1\"\ntimeout_s = 5\nmax_connections = 8\n").unwrap();
        let upstream = config.upstream.unwrap();
        assert_eq!((upstream.timeout_s, upstream.max_connections), (5, 8));
        for (text, line, words) in [
            (
                "[upstream]\nurl = \"http://u\"\ntimeout = 5\n",
                3,
                "unknown key `timeout` in [upstream]",
            ),
            (
                "[upstream]\nurl = \"http://u\"\ntimeout_s = 0\n",
                3,
                "`timeout_s` in [upstream] must be an integer ≥ 1",
            ),
            (
                "\n[upstream]\nurl = \"ftp://u\"\n",
                3,
                "must be an http:// or https:// URL",
            ),
            (
                "[upstream]\nmax_connections = 0\nurl = \"http://u\"\n",
                2,
                "`max_connections`",
            ),
            ("token_cache_entries = -1\n", 1, "`token_cache_entries`"),
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.line, Some(line), "{text}: {err}");
            assert!(err.message.contains(words), "{text}: {err}");
        }
        let err = parse("[upstream]\ntimeout_s = 5\n").unwrap_err();
        assert!(err.message.contains("[upstream] needs `url`"), "{err}");
    }

    #[test]
    fn ui_keeps_no_bodies_unless_told_and_its_keys_are_checked() {
        assert_eq!(parse("").unwrap().ui, UiConfig::default());
        assert!(!UiConfig::default().keep_bodies);
        let config = parse("[ui]\nkeep_bodies = true\nmax_body_kb = 8\n").unwrap();
        assert_eq!(
            config.ui,
            UiConfig {
                keep_bodies: true,
                max_body_kb: 8
            }
        );
        for (text, line, words) in [
            (
                "[ui]\nkeep_bodies = \"yes\"\n",
                2,
                "`keep_bodies` in [ui] must be true or false",
            ),
            (
                "[ui]\nmax_body_kb = 0\n",
                2,
                "`max_body_kb` in [ui] must be an integer ≥ 1",
            ),
            ("[ui]\nkeep = true\n", 2, "keep"),
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.line, Some(line), "{text}: {err}");
            assert!(err.message.contains(words), "{text}: {err}");
        }
    }

    #[test]
    fn the_summarizer_is_read_and_checked() {
        assert_eq!(parse("").unwrap().summarizer, None);
        let config = parse(
            "[history]\nplugin_timeout_ms = 0\n[summarizer]\nurl = \"http://127.0.0.1:9/v1/\"\nmodel = \"small\"\n",
        )
        .unwrap();
        assert_eq!(
            config.summarizer,
            Some(SummarizerConfig {
                url: "http://127.0.0.1:9/v1".to_string(),
                model: "small".to_string(),
                api_key_env: None,
                timeout_ms: DEFAULT_SUMMARIZER_TIMEOUT_MS,
                max_chars_in: DEFAULT_SUMMARIZER_MAX_CHARS_IN,
            })
        );
        let config = parse(
            "[summarizer]\nurl = \"https://api.example/v1\"\nmodel = \"m\"\napi_key_env = \"OPENAI_API_KEY\"\ntimeout_ms = 1500\nmax_chars_in = 4000\n",
        )
        .unwrap();
        let summarizer = config.summarizer.as_ref().unwrap();
        assert_eq!(
            (
                summarizer.api_key_env.as_deref(),
                summarizer.timeout_ms,
                summarizer.max_chars_in
            ),
            (Some("OPENAI_API_KEY"), 1500, 4000)
        );
        assert_eq!(config.summarizer_key_line("api_key_env"), Some(4));
        assert_eq!(config.summarizer_key_line("nothing"), Some(1), "the table's line");
        let head = "[summarizer]\nurl = \"http://u/v1\"\nmodel = \"m\"\n";
        for (text, line, words) in [
            (
                format!("{head}timeout = 5\n"),
                4,
                "unknown key `timeout` in [summarizer]",
            ),
            (
                "[summarizer]\nmodel = \"m\"\nurl = \"ftp://u\"\n".to_string(),
                3,
                "`url` in [summarizer] must be an http:// or https:// URL",
            ),
            (
                "[summarizer]\nurl = \"http://u\"\nmodel = \" \"\n".to_string(),
                3,
                "`model` in [summarizer] must not be empty",
            ),
            (
                format!("{head}api_key_env = \"MY KEY\"\n"),
                4,
                "`api_key_env` in [summarizer] must name an environment variable",
            ),
            (
                format!("{head}api_key_env = 3\n"),
                4,
                "`api_key_env` in [summarizer] must be a string",
            ),
            (
                format!("{head}timeout_ms = 0\n"),
                4,
                "`timeout_ms` in [summarizer] must be an integer ≥ 1",
            ),
            (
                format!("{head}timeout_ms = 1999\nmax_chars_in = 0\n"),
                5,
                "`max_chars_in` in [summarizer] must be an integer ≥ 1",
            ),
            (
                "summarizer = 1\n".to_string(),
                1,
                "`summarizer` in the top level must be a table",
            ),
        ] {
            let err = parse(&text).unwrap_err();
            assert_eq!(err.line, Some(line), "{text}: {err}");
            assert!(err.message.contains(words), "{text}: {err}");
        }
        // The summarizer's timeout is its own, whatever the plugin deadline: both defaults
        // load (docs/chain.md#deadline).
        let config = parse(head).unwrap();
        let summarizer = config.summarizer.as_ref().unwrap();
        assert_eq!(summarizer.timeout_ms, 20000);
        assert_eq!(config.plugin_timeout_ms, 2000);
        assert_eq!(
            parse(&format!("{head}timeout_ms = 60000\n"))
                .unwrap()
                .summarizer
                .unwrap()
                .timeout_ms,
            60000
        );
        let err = parse("[summarizer]\nurl = \"http://u\"\n").unwrap_err();
        assert!(err.message.contains("[summarizer] needs `model`"), "{err}");
        let err = parse("[summarizer]\nmodel = \"m\"\n").unwrap_err();
        assert!(err.message.contains("[summarizer] needs `url`"), "{err}");
    }

    #[test]
    fn media_rules_fall_back_key_by_key_to_the_family() {
        let config = parse(
            "[models.default]\ndocument_tokens_per_page = 1000\n[models.gpt-4o]\nimage_tokens_unknown = 500\n\
             [models.claude-sonnet-4]\ncontext_tokens = 200000\n[models.local]\nimage_tokens = \"anthropic-area\"\n",
        )
        .unwrap();
        let gpt = config.media_rules("gpt-4o");
        assert_eq!(gpt.image_tokens, ImageTokens::OpenaiTiles);
        assert_eq!(
            (gpt.image_tokens_unknown, gpt.document_tokens_per_page),
            (500, 1000)
        );
        let claude = config.media_rules("claude-sonnet-4");
        assert_eq!(claude.image_tokens, ImageTokens::AnthropicArea);
        assert_eq!(
            claude.image_tokens_unknown,
            MediaRules::ANTHROPIC.image_tokens_unknown
        );
        assert_eq!(
            config.media_rules("local").image_tokens,
            ImageTokens::AnthropicArea
        );
        let err = parse("[models.x]\nmax_context = 5\nimage_tokens = \"tiles\"\n").unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert!(
            err.message.contains("`image_tokens` in [models.x] must be"),
            "{err}"
        );
        let err = parse("[models.x]\ndocument_tokens_per_page = -1\n").unwrap_err();
        assert!(
            err.message.contains("`document_tokens_per_page` in [models.x]"),
            "{err}"
        );
    }

    #[test]
    fn audio_rates_fall_back_to_the_default_model_then_the_family() {
        let config = parse(
            "[models.default]\naudio_tokens_per_second = 12\n[models.gpt-4o-audio]\naudio_tokens_per_second = 20\n\
             audio_tokens_unknown = 300\n",
        )
        .unwrap();
        let audio = config.media_rules("gpt-4o-audio");
        assert_eq!(
            (audio.audio_tokens_per_second, audio.audio_tokens_unknown),
            (20, Some(300))
        );
        let other = config.media_rules("gpt-4o");
        assert_eq!(
            (other.audio_tokens_per_second, other.audio_tokens_unknown),
            (12, None)
        );
        let family = parse("").unwrap().media_rules("gpt-4o");
        assert_eq!(
            family.audio_tokens_per_second,
            MediaRules::OPENAI.audio_tokens_per_second
        );
        let err = parse("[models.x]\naudio_tokens_per_second = \"fast\"\n").unwrap_err();
        assert!(
            err.message.contains("`audio_tokens_per_second` in [models.x]"),
            "{err}"
        );
    }

    #[test]
    fn an_upstream_ca_file_is_checked_at_load() {
        let dir = std::env::temp_dir().join(format!("history-ca-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("plugins-enabled.toml");
        let load = |ca: &str| {
            Config::parse(
                &file,
                format!("[upstream]\nurl = \"https://u/v1\"\nca_file = \"{ca}\"\n"),
            )
        };
        std::fs::write(
            dir.join("ca.pem"),
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let config = load("ca.pem").unwrap();
        assert_eq!(config.upstream.unwrap().ca_file, Some(dir.join("ca.pem")));
        let err = load("missing.pem").unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert!(
            err.message.contains("`ca_file` in [upstream]: cannot read")
                && err.message.contains("missing.pem"),
            "{err}"
        );
        std::fs::write(dir.join("key.pem"), "-----BEGIN PRIVATE KEY-----\n").unwrap();
        let err = load("key.pem").unwrap_err();
        assert!(err.message.contains("holds no PEM certificate"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn models_fall_back_key_by_key() {
        let config = parse(
            "[history]\nagent_max_ctx = 100\n[models.default]\ncontext_tokens = 5000\ntokenizer = \"chars4\"\n[models.big]\nmax_context = 300\n[models.small]\nmax_context = 10\ntokenizer = \"cl100k_base\"\n",
        )
        .unwrap();
        let big = config.model("big");
        assert_eq!(
            (big.effective_ctx, big.context_tokens, big.tokenizer),
            (100, 5000, Tokenizer::Chars4)
        );
        let small = config.model("small");
        assert_eq!(
            (small.effective_ctx, small.tokenizer),
            (10, Tokenizer::Cl100kBase)
        );
        assert_eq!(config.model("unlisted").context_tokens, 5000);
        assert_eq!(config.unlisted_model("big"), None);
        assert_eq!(config.unlisted_model("default"), None);
        let warning = config.unlisted_model("gpt-x").unwrap();
        assert!(
            warning.contains("model \"gpt-x\" is not listed")
                && warning.ends_with("it gets [models.default]"),
            "{warning}"
        );
        let bare = parse("").unwrap().unlisted_model("gpt-x").unwrap();
        assert!(
            bare.contains("listed: none): it gets the built-in settings"),
            "{bare}"
        );
    }

    #[test]
    fn errors_name_the_key_and_line() {
        let err = parse("max_users = 3\n\n[history]\nchian = []\n").unwrap_err();
        assert_eq!(err.line, Some(4));
        assert!(err.message.contains("unknown key `chian` in [history]"), "{err}");
        let err = parse("[models.m]\nmax_context = 0\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(err.to_string().contains("max_context"), "{err}");
        let err = parse("[history]\nchain = [\"default\", \"../x\"]\n").unwrap_err();
        assert!(err.message.contains("\"../x\" is not a plugin name"), "{err}");
        let err = parse("[history]\nchain = [\"role_pair\", \"default\"]\n").unwrap_err();
        assert!(err.message.contains("\"default\" must be first"), "{err}");
        let err = parse("[history]\nchain = [\"role_pair\"]\n").unwrap_err();
        assert!(err.message.contains("must start with \"default\""), "{err}");
        let err = parse("[history]\nchain = [\"default\", \"a\", \"a\"]\n").unwrap_err();
        assert!(err.message.contains("listed twice"), "{err}");
        let err = parse("[history\n").unwrap_err();
        assert!(err.message.starts_with("not valid TOML"), "{err}");
    }

    #[test]
    fn the_view_lists_plugins_run_after_the_chain() {
        let config = parse("[history]\nchain = [\"default\", \"a\"]\nview = [\"role_pair\"]\n").unwrap();
        assert_eq!(config.chain, ["default", "a"]);
        assert_eq!(config.view, ["role_pair"]);
        assert!(parse("").unwrap().view.is_empty());
        let refused = |text: &str| parse(text).unwrap_err();
        let err = refused("[history]\nview = [\"default\"]\n");
        assert_eq!(err.line, Some(2));
        assert!(err.message.contains("\"default\" cannot be in the view"), "{err}");
        let err = refused("[history]\nchain = [\"default\", \"a\"]\n\nview = [\"a\"]\n");
        assert_eq!(err.line, Some(4));
        assert!(
            err.message
                .contains("plugin \"a\" is in both the chain and the view"),
            "{err}"
        );
        let err = refused("[history]\nview = [\"a\", \"a\"]\n");
        assert!(err.message.contains("listed twice in the view"), "{err}");
        let err = refused("[history]\nview = \"role_pair\"\n");
        assert!(
            err.message.contains("`view` in [history] must be an array"),
            "{err}"
        );
    }

    #[test]
    fn required_plugins_must_run() {
        let config =
            parse("[history]\nchain = [\"default\", \"a\"]\nview = [\"v\"]\nrequired = [\"a\", \"v\"]\n")
                .unwrap();
        assert_eq!(config.required, ["a", "v"]);
        assert!(config.is_required("a") && !config.is_required("default"));
        assert!(parse("").unwrap().required.is_empty());
        let err = parse("[history]\nchain = [\"default\", \"a\"]\n\nrequired = [\"b\"]\n").unwrap_err();
        assert_eq!(err.line, Some(4));
        assert!(
            err.message
                .contains("plugin \"b\" in `required` is in neither the chain nor the view"),
            "{err}"
        );
        let err = parse("[history]\nrequired = [\"default\", \"default\"]\n").unwrap_err();
        assert!(err.message.contains("listed twice in the required"), "{err}");
        let err = parse("[history]\nrequired = \"default\"\n").unwrap_err();
        assert!(
            err.message.contains("`required` in [history] must be an array"),
            "{err}"
        );
    }

    #[test]
    fn isolated_plugins_must_run() {
        let config =
            parse("[history]\nchain = [\"default\", \"a\"]\nview = [\"v\"]\nisolate = [\"a\", \"v\"]\n")
                .unwrap();
        assert_eq!(config.isolate, ["a", "v"]);
        assert!(config.is_isolated("v") && !config.is_isolated("default"));
        assert!(parse("").unwrap().isolate.is_empty());
        let err = parse("[history]\nchain = [\"default\", \"a\"]\n\nisolate = [\"b\"]\n").unwrap_err();
        assert_eq!(err.line, Some(4));
        assert!(
            err.message
                .contains("plugin \"b\" in `isolate` is in neither the chain nor the view"),
            "{err}"
        );
        let err = parse("[history]\nisolate = [\"default\", \"default\"]\n").unwrap_err();
        assert!(err.message.contains("listed twice in the isolate"), "{err}");
        let err = parse("[history]\nisolate = [\"../x\"]\n").unwrap_err();
        assert!(err.message.contains("not a plugin name"), "{err}");
    }

    #[test]
    fn plugin_keys_are_located() {
        let config =
            parse("[plugin.retention]\nplaceholder = \"x\"\n\n[plugin.retention.tools.search]\nturns = 2\n")
                .unwrap();
        assert_eq!(config.plugin_key_line("retention", "placeholder"), Some(2));
        assert_eq!(config.plugin_key_line("retention", "tools.search.turns"), Some(5));
        // An entry of an array value: its own line, or the key's when on one line.
        let config =
            parse("[plugin.redactor]\nalso = [\n  \"TOKEN\",\n  \"\",\n]\none_line = [\"a\", \"\"]\n")
                .unwrap();
        assert_eq!(config.plugin_key_line("redactor", "also[1]"), Some(4));
        assert_eq!(config.plugin_key_line("redactor", "also[0]"), Some(3));
        assert_eq!(config.plugin_key_line("redactor", "also[9]"), Some(2));
        assert_eq!(config.plugin_key_line("redactor", "one_line[1]"), Some(6));
        let config =
            parse("[plugin.retention]\nplaceholder = \"x\"\n\n[plugin.retention.tools.search]\nturns = 2\n")
                .unwrap();
        assert_eq!(
            config.plugin_table("retention").unwrap().json,
            serde_json::json!({"placeholder": "x", "tools": {"search": {"turns": 2}}})
        );
    }
}
