//! Which `Host` names `/mcp` answers (docs/mcp.md#the-server): the loopback ones always,
//! another only when `[server] mcp_allowed_hosts` lists it; rmcp refuses the rest (403),
//! its protection against DNS rebinding. Raw requests on loopback, each with its `Host`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use e2e_tests::server::Server;
use e2e_tests::TestConfig;

/// The status of an MCP `initialize` sent to `server` with `Host: host`.
fn initialize_status(server: &Server, host: &str) -> u16 {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}"#;
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).unwrap();
    let line = String::from_utf8_lossy(&head).to_string();
    line["HTTP/1.1 ".len()..]
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("a status line: {line:?}"))
}

#[test]
fn mcp_answers_loopback_hosts_and_the_configured_ones_only() {
    let plain = TestConfig::new("[history]\nagent_max_ctx = 50\nchain = [\"default\"]\n");
    let server = Server::start(&plain.path, &plain.dir.path().join("sessions.db"), &[]);
    assert_eq!(initialize_status(&server, &server.addr), 200);
    assert_eq!(initialize_status(&server, "agents.example.test"), 403);
    assert_eq!(server.stop().code(), Some(0));

    let listed = TestConfig::new(
        "[history]\nagent_max_ctx = 50\nchain = [\"default\"]\n\
         [server]\nmcp_allowed_hosts = [\"agents.example.test\"]\n",
    );
    let server = Server::start(&listed.path, &listed.dir.path().join("sessions.db"), &[]);
    assert_eq!(initialize_status(&server, "agents.example.test"), 200);
    assert_eq!(
        initialize_status(&server, &server.addr),
        200,
        "loopback still answered"
    );
    assert_eq!(initialize_status(&server, "other.example.test"), 403);
    assert_eq!(server.stop().code(), Some(0));

    let wrong = TestConfig::new("[server]\nmcp_allowed_hosts = \"agents.example.test\"\n");
    let output = wrong.process(&[], "[]");
    assert_eq!(
        output.status.code(),
        Some(3),
        "a configuration error: {}",
        e2e_tests::describe(&output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("`mcp_allowed_hosts` in [server] must be an array of strings"),
        "{stderr}"
    );
}
