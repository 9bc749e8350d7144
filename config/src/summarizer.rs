//! `[summarizer]` (docs/configuration.md#summarizer): the OpenAI-compatible endpoint the
//! host's `summarize` service calls for plugins (docs/plugins.md#the-summarizer).

use toml_edit::Table;

use super::Reader;
use crate::ConfigError;
use plugin_api::echo;

/// `[summarizer] timeout_ms` when omitted.
pub const DEFAULT_SUMMARIZER_TIMEOUT_MS: u64 = 20_000;
/// `[summarizer] max_chars_in` when omitted: a longer text is cut to its first this many
/// characters before it is sent.
pub const DEFAULT_SUMMARIZER_MAX_CHARS_IN: u64 = 100_000;

/// `[summarizer]`: where and how the host asks for summaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummarizerConfig {
    /// The endpoint's base URL, as an OpenAI client's `base_url` (`http://host:port/v1`):
    /// requests go to `URL/chat/completions`, as the proxy's `[upstream] url`.
    pub url: String,
    /// The model asked for summaries.
    pub model: String,
    /// The environment variable holding the API key (sent as a bearer token); none: no
    /// `Authorization` header.
    pub api_key_env: Option<String>,
    /// The longest one call may take, connecting included.
    pub timeout_ms: u64,
    /// Texts longer than this many characters are cut to their first `max_chars_in`.
    pub max_chars_in: u64,
}

const PLACE: &str = "[summarizer]";

/// Whether `name` can name an environment variable: letters, digits and `_`, not
/// starting with a digit.
fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Reads and checks the `[summarizer]` table. Its `timeout_ms` is independent of
/// `[history] plugin_timeout_ms`: the time a plugin waits for summaries does not count
/// against its deadline (docs/chain.md#deadline).
pub(super) fn read(
    reader: &Reader<'_>,
    root: &Table,
    table: &Table,
) -> Result<SummarizerConfig, ConfigError> {
    // An error about the table as a whole points at its header.
    let at = table
        .span()
        .or_else(|| root.key("summarizer").and_then(|k| k.span()));
    reader.refuse_unknown(
        table,
        PLACE,
        &["url", "model", "api_key_env", "timeout_ms", "max_chars_in"],
    )?;
    let Some(url) = reader.http_url(table, "url", PLACE)? else {
        return Err(reader.error(
            at.clone(),
            format!("{PLACE} needs `url` (the endpoint's base URL, e.g. http://127.0.0.1:8000/v1)"),
        ));
    };
    let model = match reader.string(table, "model", PLACE)? {
        Some(model) if !model.trim().is_empty() => model.to_string(),
        Some(_) => {
            return Err(reader.key_error(table, "model", format!("`model` in {PLACE} must not be empty")))
        }
        None => {
            return Err(reader.error(
                at.clone(),
                format!("{PLACE} needs `model` (the model asked for summaries)"),
            ))
        }
    };
    let api_key_env = match reader.string(table, "api_key_env", PLACE)? {
        Some(name) if is_env_name(name) => Some(name.to_string()),
        Some(name) => {
            return Err(reader.key_error(
                table,
                "api_key_env",
                format!(
                "`api_key_env` in {PLACE} must name an environment variable (letters, digits, _), found {}",
                echo::quoted(name)
            ),
            ))
        }
        None => None,
    };
    let timeout_ms = reader
        .integer(table, "timeout_ms", PLACE, 1)?
        .unwrap_or(DEFAULT_SUMMARIZER_TIMEOUT_MS);
    let max_chars_in = reader
        .integer(table, "max_chars_in", PLACE, 1)?
        .unwrap_or(DEFAULT_SUMMARIZER_MAX_CHARS_IN);
    Ok(SummarizerConfig {
        url,
        model,
        api_key_env,
        timeout_ms,
        max_chars_in,
    })
}
