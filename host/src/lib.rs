//! The history host library: everything `history-host` and `agentctl` do, by concern.
//!
//! - [`config`]: `plugins-enabled.toml`, validated with errors naming key and line;
//! - [`loader`]: discovery in `plugin_dir` and loading of plugin libraries, with
//!   [`compat`]'s version rule and layout check;
//! - [`chain`]: the chain of plugin instances and a run of it, with the output check of
//!   [`check`] after every stage and `on_plugin_error` handling;
//! - [`turns`]: turns and message identities, derived once before the chain;
//! - [`tokens`]: the tokenizers offered to plugins, with per-message caching;
//!   [`o200k`] counts `o200k_base` exactly as tiktoken does, without fancy-regex;
//! - [`services`]: what plugins reach through their contexts (token counting, logging);
//! - [`document`]: the input document of `process`;
//! - [`report`]: the summary log line and `--explain`;
//! - [`expand`]: restoring a compacted or omitted message's original content (§5.6);
//! - [`logging`]: the plugin log callback and the CLI's log output;
//! - [`edit`]: `agentctl`'s edits of the configuration, validated by the host's own rules
//!   and written atomically;
//! - [`inspect`]: `agentctl`'s reports (`history-list`, `plugins`, `check`).
//!
//! See `ARCHITECTURE.md` at the workspace root for how a turn flows through these.

pub mod chain;
pub mod check;
pub mod compat;
pub mod config;
pub mod document;
pub mod edit;
pub mod expand;
pub mod inspect;
pub mod loader;
pub mod logging;
pub mod o200k;
pub mod report;
pub mod services;
pub mod tokens;
pub mod turns;

pub use chain::{Call, Chain, ChainRun, PluginFailure};
pub use config::{Config, ConfigError, OnPluginError};
pub use loader::{Catalog, PluginLibrary, Refusal};

/// Loads the configuration, discovers the plugins and builds the chain: what every
/// command that runs the chain does first. Errors are configuration or loading errors.
pub fn load_chain(config_file: &std::path::Path) -> Result<(Config, Catalog, Chain), ConfigError> {
    let config = Config::load(config_file)?;
    let catalog = Catalog::discover(&config.plugin_dir).map_err(|e| config.error(None, e.0))?;
    let chain = Chain::load(&config, &catalog)?;
    Ok((config, catalog, chain))
}
