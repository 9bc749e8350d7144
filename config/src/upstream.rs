//! `[upstream]` (docs/configuration.md#upstream): where the OpenAI-compatible proxy
//! forwards requests (docs/proxy.md), how long it waits, and the recall tools it may run
//! for the model (docs/mcp.md#the-proxy).

use std::path::{Path, PathBuf};

use toml_edit::Table;

use super::{check_ca_file, Reader};
use crate::ConfigError;

/// `[upstream] timeout_s` when omitted.
pub const DEFAULT_UPSTREAM_TIMEOUT_S: u64 = 600;
/// `[upstream] read_timeout_s` when omitted.
pub const DEFAULT_UPSTREAM_READ_TIMEOUT_S: u64 = 600;
/// `[upstream] max_connections` when omitted.
pub const DEFAULT_UPSTREAM_MAX_CONNECTIONS: u64 = 64;
/// `[upstream] max_recall_rounds` when omitted.
pub const DEFAULT_MAX_RECALL_ROUNDS: u64 = 2;

/// `[upstream]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// The upstream's base URL, as an OpenAI client's `base_url` (`http://host:port/v1`).
    pub url: String,
    /// The longest wait for the upstream's answer to start: a free slot, the connection,
    /// its status and headers.
    pub timeout_s: u64,
    /// `read_timeout_s`: the longest the upstream may stay silent once the request is
    /// sent: before its status and headers (a 504), and between two chunks of its body.
    pub read_timeout_s: u64,
    /// The most requests in flight to the upstream at once.
    pub max_connections: u64,
    /// `ca_file`: PEM certificates trusted for an `https://` upstream besides the usual
    /// roots (a private CA); resolved beside the configuration file.
    pub ca_file: Option<PathBuf>,
    /// `recall_tools`: on a session's chat request (`X-History-Session`), offer the model
    /// the recall tools and run the calls it makes of them.
    pub recall_tools: bool,
    /// `max_recall_rounds`: at most this many upstream calls answered with recall-tool
    /// results per request.
    pub max_recall_rounds: u64,
    /// `send_over_budget`: send a history still over the model's `context_tokens` after
    /// the chain instead of answering 400 `context_length_exceeded` (docs/proxy.md).
    pub send_over_budget: bool,
}

impl Default for UpstreamConfig {
    /// Every setting's default, with no URL.
    fn default() -> Self {
        UpstreamConfig {
            url: String::new(),
            timeout_s: DEFAULT_UPSTREAM_TIMEOUT_S,
            read_timeout_s: DEFAULT_UPSTREAM_READ_TIMEOUT_S,
            max_connections: DEFAULT_UPSTREAM_MAX_CONNECTIONS,
            ca_file: None,
            recall_tools: false,
            max_recall_rounds: DEFAULT_MAX_RECALL_ROUNDS,
            send_over_budget: false,
        }
    }
}

const PLACE: &str = "[upstream]";

/// Reads and checks the `[upstream]` table; `ca_file` is resolved beside the file (`base`).
pub(super) fn read(reader: &Reader<'_>, table: &Table, base: &Path) -> Result<UpstreamConfig, ConfigError> {
    reader.refuse_unknown(
        table,
        PLACE,
        &[
            "url",
            "timeout_s",
            "read_timeout_s",
            "max_connections",
            "ca_file",
            "recall_tools",
            "max_recall_rounds",
            "send_over_budget",
        ],
    )?;
    let Some(url) = reader.http_url(table, "url", PLACE)? else {
        return Err(reader.error(
            table.span(),
            format!("{PLACE} needs `url` (the upstream's base URL, e.g. http://127.0.0.1:8000/v1)"),
        ));
    };
    let defaults = UpstreamConfig::default();
    Ok(UpstreamConfig {
        url,
        timeout_s: reader
            .integer(table, "timeout_s", PLACE, 1)?
            .unwrap_or(defaults.timeout_s),
        read_timeout_s: reader
            .integer(table, "read_timeout_s", PLACE, 1)?
            .unwrap_or(defaults.read_timeout_s),
        max_connections: reader
            .integer(table, "max_connections", PLACE, 1)?
            .unwrap_or(defaults.max_connections),
        ca_file: match reader.string(table, "ca_file", PLACE)? {
            None => None,
            Some(path) => {
                let file = base.join(path);
                check_ca_file(&file).map_err(|why| {
                    reader.key_error(table, "ca_file", format!("`ca_file` in {PLACE}: {why}"))
                })?;
                Some(file)
            }
        },
        recall_tools: reader
            .boolean(table, "recall_tools", PLACE)?
            .unwrap_or(defaults.recall_tools),
        max_recall_rounds: reader
            .integer(table, "max_recall_rounds", PLACE, 1)?
            .unwrap_or(defaults.max_recall_rounds),
        send_over_budget: reader
            .boolean(table, "send_over_budget", PLACE)?
            .unwrap_or(defaults.send_over_budget),
    })
}
