//! `store` (docs/configuration.md#store): where the session service keeps its sessions, as
//! a string, or as a `[store]` table with the bounds on every wait for the store.

use std::path::{Path, PathBuf};
use std::time::Duration;

use toml_edit::{Item, Table};

use super::{Reader, DEFAULT_STORE};
use crate::ConfigError;

/// `[store] connect_timeout_ms` when omitted.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;
/// `[store] statement_timeout_ms` when omitted.
pub const DEFAULT_STATEMENT_TIMEOUT_MS: u64 = 5_000;
/// `[store] keepalive_s` when omitted.
pub const DEFAULT_KEEPALIVE_S: u64 = 10;

/// How long the session service waits for its store (docs/configuration.md#store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Connecting to the database (the TCP connection and PostgreSQL's start-up), and
    /// waiting for a pooled connection.
    pub connect_timeout: Duration,
    /// The longest one round trip to the database may take (a lock wait added): the
    /// connection's `statement_timeout`, and how long the host waits for an answer.
    pub statement_timeout: Duration,
    /// An idle connection is probed (TCP keepalive) after this long without traffic.
    pub keepalive: Duration,
}

impl Default for StoreLimits {
    fn default() -> StoreLimits {
        StoreLimits {
            connect_timeout: Duration::from_millis(DEFAULT_CONNECT_TIMEOUT_MS),
            statement_timeout: Duration::from_millis(DEFAULT_STATEMENT_TIMEOUT_MS),
            keepalive: Duration::from_secs(DEFAULT_KEEPALIVE_S),
        }
    }
}

const PLACE: &str = "[store]";

/// Reads `store`: a string (the location) or a `[store]` table. Returns the location,
/// resolved against `base` unless a `postgres://` URL, and the limits.
pub(super) fn read(
    reader: &Reader<'_>,
    root: &Table,
    base: &Path,
) -> Result<(PathBuf, StoreLimits), ConfigError> {
    let (table, place, key) = match root.get("store") {
        Some(Item::Table(table)) => {
            reader.refuse_unknown(
                table,
                PLACE,
                &[
                    "location",
                    "connect_timeout_ms",
                    "statement_timeout_ms",
                    "keepalive_s",
                ],
            )?;
            (table, PLACE, "location")
        }
        _ => (root, "the top level", "store"),
    };
    let location = match reader.string(table, key, place)? {
        Some("") => return Err(reader.key_error(table, key, format!("`{key}` must not be empty"))),
        // PostgreSQL, for several hosts on one store (docs/scaling-out.md).
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => PathBuf::from(url),
        Some(url) if url.contains("://") => {
            return Err(reader.key_error(
                table,
                key,
                format!(
                "`{key}` = \"{url}\": expected a file path (the embedded SQLite store) or a postgres:// URL"
            ),
            ))
        }
        Some(path) => base.join(path),
        None => base.join(DEFAULT_STORE),
    };
    let mut limits = StoreLimits::default();
    if std::ptr::eq(table, root) {
        return Ok((location, limits));
    }
    if let Some(ms) = reader.integer(table, "connect_timeout_ms", PLACE, 1)? {
        limits.connect_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = reader.integer(table, "statement_timeout_ms", PLACE, 1)? {
        limits.statement_timeout = Duration::from_millis(ms);
    }
    if let Some(s) = reader.integer(table, "keepalive_s", PLACE, 1)? {
        limits.keepalive = Duration::from_secs(s);
    }
    Ok((location, limits))
}
