//! The history chain engine: everything that runs a chain of history plugins, and
//! nothing that talks to a user — no command line, no HTTP, no rendering. The binaries
//! (`history-host`, `agentctl`) and the service crates build on this API.
//!
//! - [`Config`] (`plugins-enabled.toml`, validated with errors naming key and line);
//! - [`Catalog`] / [`PluginLibrary`]: discovery in `plugin_dir` (nothing mapped) and
//!   loading of what is needed, by [`compat`]'s version rule and layout check; [`probe`]:
//!   loading a library in a child process, for what looks at every file;
//! - [`Chain`]: the plugin instances and a run of them ([`Chain::run`]), every stage's
//!   output checked ([`check`]) and faults handled by `on_plugin_error`;
//! - [`turns`]: turns and message identities, derived once before the chain, and the
//!   stamp a session puts on what enters;
//! - [`tokens`]: the tokenizers offered to plugins, cached per message and by content;
//! - [`services`]: what plugins reach through their contexts (token counting, logging,
//!   summarizing); [`summarizer`]: the summarize service's client, cache and rules;
//! - [`document`]: the input document of a stateless call;
//! - [`expand`]: restoring a compacted or omitted message's original content;
//! - [`summary`]: the per-turn summary line; [`selfcheck`]: the self-check that
//!   `agentctl check` reports;
//! - [`isolate`]: plugins run in a worker process (`[history] isolate`), and the worker;
//! - [`logging`]: the callback plugins log through;
//! - [`shadow`] and [`reload`]: what a host that reloads its chain needs: libraries
//!   loaded from shadow copies, a new chain loaded and checked beside the running one,
//!   the watch of the configuration and `plugin_dir`;
//! - [`output`]: the binaries' stdout kept from plugins, write failures and exits a
//!   plugin makes turned into failures, one-line errors.
//!
//! `ARCHITECTURE.md` at the workspace root shows how a turn flows through these.

pub mod bounded;
mod bpe;
pub mod chain;
mod o200k_split;
/// The output check: plugin-api's, so a plugin's own tests run the same code.
pub use plugin_api::check;
pub mod compat;
/// `plugins-enabled.toml`, read by its own crate (config/): the engine re-exports it so
/// its callers have one name for it.
pub use history_config as config;
mod deadline;
pub mod document;
pub mod edit;
mod elf;
pub mod expand;
pub mod isolate;
mod library;
mod loader;
pub mod logging;
pub mod output;
pub mod probe;
pub mod process_plugin;
mod rank_table;
pub mod recall;
pub mod reload;
pub mod selfcheck;
pub mod services;
pub mod shadow;
pub mod summarizer;
pub mod summary;
pub mod tokens;
pub mod turns;
pub mod written;

pub use chain::{stateless_context, Call, Chain, ChainRun, PluginFailure, SharedChain, StageReport};
pub use config::{Config, ConfigError, OnPluginError, StoreLimits, UnknownModels};
/// Whether a file is a complete ELF shared library for this host, before anything maps it
/// (`agentctl install` checks a library with it before copying it).
pub use elf::check as check_elf_library;
pub use library::{host_api_version, PluginLibrary, Refusal};
pub use loader::{
    library_file_name, plugin_stem, Catalog, DiscoveryError, LibraryFile, ProgramFile, Unavailable,
};
pub use probe::Prober;

/// Echoing user- and plugin-supplied text in error and log lines: escaped, cut.
pub use plugin_api::echo;

/// Loads the configuration, discovers the plugins and builds the chain: what every
/// command that runs the chain does first. Only the libraries the configuration names are
/// mapped; the configuration's `[summarizer]` becomes the one plugins reach
/// ([`summarizer::connect`]) once everything loaded. Errors are configuration or
/// loading errors.
pub fn load_chain(config_file: &std::path::Path) -> Result<(Config, Catalog, Chain), ConfigError> {
    let config = Config::load(config_file)?;
    let summarizer = summarizer::connect(&config)?;
    let catalog = Catalog::discover(&config.plugin_dir).map_err(|e| config.error(None, e.0))?;
    let chain = Chain::load(&config, &catalog)?;
    summarizer.install();
    Ok((config, catalog, chain))
}
