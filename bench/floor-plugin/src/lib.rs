//! `floor`: a benchmark fixture, never shipped. It hands its input through untouched
//! (every message shared, nothing copied), so a chain of these costs only what the host
//! and the ABI cost per stage: the floor `cargo xtask bench` divides its figures by.
//! `cargo xtask bench` installs it into `target/bench-plugins` only, never `target/plugins`.
//! Built with the `as-default` feature it is named `default`, for `cargo xtask bench
//! serve`: a configured chain must start with `default`, so a `serve` whose chain does no
//! work runs this build under that name (`target/bench-plugins/serve-floor/`).

use plugin_api::{ConfigError, ConfigTable, Context, HistoryPlugin, LoadContext, Message, Output, RArc};

pub struct Floor;

impl HistoryPlugin for Floor {
    const NAME: &'static str = if cfg!(feature = "as-default") {
        "default"
    } else {
        "floor"
    };
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const SUMMARY: &'static str = "benchmark fixture: passes the history through, doing no work";

    fn new(load: &LoadContext) -> Result<Self, ConfigError> {
        // Still refuses unknown keys, like every plugin: a typo in a bench config shows.
        ConfigTable::parse(&load.config_json)?.finish()?;
        Ok(Floor)
    }

    fn process(&self, history: &[RArc<Message>], _ctx: &Context) -> Result<Output, String> {
        Ok(Output::unchanged(history))
    }
}

plugin_api::export_plugin!(Floor);
