//! `[ui]` (docs/configuration.md#ui): the inspector page's options.

use toml_edit::Table;

use super::Reader;
use crate::ConfigError;

/// `[ui] max_body_kb` when omitted.
pub const DEFAULT_UI_MAX_BODY_KB: u64 = 64;

/// `[ui]`, or its defaults when the file has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiConfig {
    /// Whether the proxy traffic the page shows keeps each request's bodies (what went
    /// upstream and the answer); never by default: they hold the conversations.
    pub keep_bodies: bool,
    /// The most of one body kept, in KiB: a longer one is kept cut, and said so.
    pub max_body_kb: u64,
}

impl Default for UiConfig {
    fn default() -> Self {
        UiConfig {
            keep_bodies: false,
            max_body_kb: DEFAULT_UI_MAX_BODY_KB,
        }
    }
}

const PLACE: &str = "[ui]";

/// Reads and checks the `[ui]` table.
pub(super) fn read(reader: &Reader<'_>, table: &Table) -> Result<UiConfig, ConfigError> {
    reader.refuse_unknown(table, PLACE, &["keep_bodies", "max_body_kb"])?;
    let defaults = UiConfig::default();
    Ok(UiConfig {
        keep_bodies: reader
            .boolean(table, "keep_bodies", PLACE)?
            .unwrap_or(defaults.keep_bodies),
        max_body_kb: reader
            .integer(table, "max_body_kb", PLACE, 1)?
            .unwrap_or(defaults.max_body_kb),
    })
}
