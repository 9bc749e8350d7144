//! `[server]` (docs/configuration.md#server): the session service's connections — how
//! long a client may take to send a request, how many are open at once, and how long
//! SIGTERM waits for running requests; which `Host` names the MCP endpoint answers.

use toml_edit::Table;

use super::Reader;
use crate::ConfigError;

/// `[server] header_timeout_s` when omitted.
pub const DEFAULT_HEADER_TIMEOUT_S: u64 = 10;
/// `[server] idle_timeout_s` when omitted.
pub const DEFAULT_IDLE_TIMEOUT_S: u64 = 60;
/// `[server] body_timeout_s` when omitted.
pub const DEFAULT_BODY_TIMEOUT_S: u64 = 30;
/// `[server] shutdown_grace_s` when omitted.
pub const DEFAULT_SHUTDOWN_GRACE_S: u64 = 10;

/// `[server]`, or its defaults when the file has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The longest a client may take to send a request's line and headers: from its
    /// first byte, or on a new connection from the accept.
    pub header_timeout_s: u64,
    /// The longest a kept-alive connection may stay quiet after an answer.
    pub idle_timeout_s: u64,
    /// The longest a client may take to send a request's body, from its headers on.
    pub body_timeout_s: u64,
    /// The most client connections open at once; 0: from the descriptor limit at start.
    pub max_connections: u64,
    /// How long SIGTERM waits for running requests before answering them 503.
    pub shutdown_grace_s: u64,
    /// `Host` names (or `host:port`) `/mcp` answers besides the loopback ones
    /// (docs/mcp.md#the-server): DNS-rebinding protection stays on for every other name.
    pub mcp_allowed_hosts: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            header_timeout_s: DEFAULT_HEADER_TIMEOUT_S,
            idle_timeout_s: DEFAULT_IDLE_TIMEOUT_S,
            body_timeout_s: DEFAULT_BODY_TIMEOUT_S,
            max_connections: 0,
            shutdown_grace_s: DEFAULT_SHUTDOWN_GRACE_S,
            mcp_allowed_hosts: Vec::new(),
        }
    }
}

const PLACE: &str = "[server]";

/// Reads and checks the `[server]` table.
pub(super) fn read(reader: &Reader<'_>, table: &Table) -> Result<ServerConfig, ConfigError> {
    reader.refuse_unknown(
        table,
        PLACE,
        &[
            "header_timeout_s",
            "idle_timeout_s",
            "body_timeout_s",
            "max_connections",
            "shutdown_grace_s",
            "mcp_allowed_hosts",
        ],
    )?;
    let defaults = ServerConfig::default();
    Ok(ServerConfig {
        header_timeout_s: reader
            .integer(table, "header_timeout_s", PLACE, 1)?
            .unwrap_or(defaults.header_timeout_s),
        idle_timeout_s: reader
            .integer(table, "idle_timeout_s", PLACE, 1)?
            .unwrap_or(defaults.idle_timeout_s),
        body_timeout_s: reader
            .integer(table, "body_timeout_s", PLACE, 1)?
            .unwrap_or(defaults.body_timeout_s),
        max_connections: reader
            .integer(table, "max_connections", PLACE, 0)?
            .unwrap_or(defaults.max_connections),
        shutdown_grace_s: reader
            .integer(table, "shutdown_grace_s", PLACE, 0)?
            .unwrap_or(defaults.shutdown_grace_s),
        mcp_allowed_hosts: reader
            .strings(table, "mcp_allowed_hosts", PLACE)?
            .unwrap_or(defaults.mcp_allowed_hosts),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::Config;

    use super::*;

    #[test]
    fn the_server_table_is_read_with_its_defaults_and_checked() {
        let parse = |text: &str| Config::parse(Path::new("/x/plugins-enabled.toml"), text.to_string());
        assert_eq!(parse("").unwrap().server, ServerConfig::default());
        let server = parse("[server]\nheader_timeout_s = 2\nidle_timeout_s = 7\nbody_timeout_s = 3\nmax_connections = 40\nshutdown_grace_s = 0\nmcp_allowed_hosts = [\"a.test\", \"10.0.0.5:7878\"]\n")
            .unwrap()
            .server;
        assert_eq!(
            server,
            ServerConfig {
                header_timeout_s: 2,
                idle_timeout_s: 7,
                body_timeout_s: 3,
                max_connections: 40,
                shutdown_grace_s: 0,
                mcp_allowed_hosts: vec!["a.test".into(), "10.0.0.5:7878".into()],
            }
        );
        let err = parse("[server]\nheader_timeout_s = 0\n").unwrap_err();
        assert!(
            err.message
                .contains("`header_timeout_s` in [server] must be an integer ≥ 1"),
            "{err}"
        );
        let err = parse("[server]\nidle = 5\n").unwrap_err();
        assert!(err.message.contains("unknown key `idle` in [server]"), "{err}");
    }
}
