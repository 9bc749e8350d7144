//! The connection layer of `history-host serve` (docs/http-api.md#connections): slow
//! headers and slow bodies cut within their timeouts (each answered 408), idle
//! keep-alive connections closed after their own timeout, silent new ones after the
//! header timeout, a client past the connection cap answered 503 at once, SIGTERM
//! with slow connections open exiting 0 within `shutdown_grace_s`, and a stalled
//! upstream answered 504 after `[upstream] read_timeout_s`. Raw sockets on loopback; every
//! loop is bounded in count and time.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use e2e_tests::server::Server;
use e2e_tests::TestConfig;

fn start(config: &TestConfig) -> Server {
    Server::start(&config.path, &config.dir.path().join("sessions.db"), &[])
}

fn connect(server: &Server) -> TcpStream {
    let stream = TcpStream::connect(&server.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    stream
}

/// What a connection saw until the server closed it or `limit` passed: the bytes it
/// read, and when it was closed (None: still open at `limit`). With `drip`, one more
/// byte of the request is sent every 200 ms, as a slow client does.
fn watch(mut stream: TcpStream, drip: bool, limit: Duration) -> (String, Option<Duration>) {
    let started = Instant::now();
    let mut seen = Vec::new();
    let mut last_drip = Instant::now();
    let mut buffer = [0u8; 4096];
    while started.elapsed() < limit {
        if drip && last_drip.elapsed() >= Duration::from_millis(200) {
            last_drip = Instant::now();
            // A write to a connection the server closed fails, or is seen as EOF below.
            let _ = stream.write_all(b" ");
        }
        match stream.read(&mut buffer) {
            Ok(0) => {
                return (
                    String::from_utf8_lossy(&seen).into_owned(),
                    Some(started.elapsed()),
                )
            }
            Ok(n) => seen.extend_from_slice(&buffer[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => {
                return (
                    String::from_utf8_lossy(&seen).into_owned(),
                    Some(started.elapsed()),
                )
            }
        }
    }
    (String::from_utf8_lossy(&seen).into_owned(), None)
}

const SLOW_HEADER: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
const SLOW_BODY: &[u8] =
    b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{";

#[test]
fn slow_headers_slow_bodies_and_idle_connections_are_closed_in_time_while_others_are_served() {
    let config = TestConfig::new("[server]\nheader_timeout_s = 1\nidle_timeout_s = 3\nbody_timeout_s = 2\n");
    let server = start(&config);
    let mut clients = Vec::new();
    for i in 0..40 {
        let mut stream = connect(&server);
        let kind = match i % 4 {
            3 => "silent",
            0 => {
                stream.write_all(SLOW_HEADER).unwrap();
                "header"
            }
            1 => {
                stream.write_all(SLOW_BODY).unwrap();
                "body"
            }
            _ => {
                // One whole request, kept alive, then nothing.
                stream
                    .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    .unwrap();
                "idle"
            }
        };
        let drip = kind == "header" || kind == "body";
        clients.push((
            kind,
            std::thread::spawn(move || watch(stream, drip, Duration::from_secs(10))),
        ));
    }
    // Other clients are served throughout.
    let started = Instant::now();
    let mut served = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let answer = server.get("/healthz");
        assert_eq!(answer.status, 200, "{answer:?}");
        served += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(served >= 10, "{served}");
    for (kind, client) in clients {
        let (seen, closed) = client.join().unwrap();
        let closed =
            closed.unwrap_or_else(|| panic!("a {kind} connection was still open after 10 s: {seen:?}"));
        match kind {
            "header" => {
                assert!(closed < Duration::from_secs(3), "{kind}: {closed:?}");
                assert!(seen.starts_with("HTTP/1.1 408 "), "{kind}: {seen:?}");
                assert!(seen.contains("header_timeout_s"), "{kind}: {seen:?}");
            }
            "body" => {
                assert!(closed < Duration::from_secs(6), "{kind}: {closed:?}");
                assert!(seen.starts_with("HTTP/1.1 408 "), "{kind}: {seen:?}");
                assert!(seen.contains("\"request_timeout\""), "{kind}: {seen:?}");
                assert!(seen.contains("body_timeout_s"), "{kind}: {seen:?}");
            }
            "idle" => {
                // Its answer, then closed once idle past the idle timeout (not the shorter
                // header timeout), with no other answer.
                assert!(seen.starts_with("HTTP/1.1 200 "), "{kind}: {seen:?}");
                assert_eq!(seen.matches("HTTP/1.1").count(), 1, "{kind}: {seen:?}");
                assert!(
                    closed > Duration::from_millis(2500) && closed < Duration::from_secs(6),
                    "{kind}: {closed:?}"
                );
            }
            _ => {
                // Connected and said nothing: closed after the header timeout, no answer.
                assert_eq!(seen, "", "{kind}");
                assert!(closed < Duration::from_secs(3), "{kind}: {closed:?}");
            }
        }
    }
    assert_eq!(server.get("/healthz").status, 200);
}

#[test]
fn sigterm_with_100_slow_connections_exits_0_within_the_grace_period() {
    let config =
        TestConfig::new("[server]\nheader_timeout_s = 60\nbody_timeout_s = 60\nshutdown_grace_s = 3\n");
    let server = start(&config);
    let mut clients = Vec::new();
    for i in 0..100 {
        let mut stream = connect(&server);
        let slow_body = i % 2 == 1;
        stream
            .write_all(if slow_body { SLOW_BODY } else { SLOW_HEADER })
            .unwrap();
        clients.push((slow_body, stream));
    }
    // Every one accepted and in its request before the signal.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(server.get("/healthz").status, 200);
    let started = Instant::now();
    let status = server.stop();
    let took = started.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        took < Duration::from_millis(3500),
        "exited after {took:?}, grace 3 s"
    );
    // A slow body was told why: 503, the host shutting down.
    let mut told = 0;
    for (slow_body, stream) in clients {
        let (seen, closed) = watch(stream, false, Duration::from_secs(1));
        assert!(closed.is_some(), "a connection is open after the exit");
        if slow_body && seen.starts_with("HTTP/1.1 503 ") {
            assert!(seen.contains("shutting_down"), "{seen:?}");
            told += 1;
        }
    }
    assert!(told > 0, "no slow body was answered 503");
}

#[test]
fn at_the_connection_cap_a_new_client_is_answered_503_at_once() {
    let config = TestConfig::new("[server]\nmax_connections = 8\nheader_timeout_s = 30\n");
    let server = start(&config);
    let held: Vec<TcpStream> = (0..8).map(|_| connect(&server)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let mut extra = connect(&server);
    extra
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let (seen, closed) = watch(extra, false, Duration::from_secs(5));
    assert!(closed.is_some(), "the extra connection was left open: {seen:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(seen.starts_with("HTTP/1.1 503 "), "{seen:?}");
    assert!(seen.contains("too_many_connections"), "{seen:?}");
    // Once connections close, new clients are served again.
    drop(held);
    let started = Instant::now();
    loop {
        let mut stream = connect(&server);
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .unwrap();
        let (seen, _) = watch(stream, false, Duration::from_secs(2));
        if seen.starts_with("HTTP/1.1 200 ") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not served again: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(server.stderr().contains("at most 8 open"), "{}", server.stderr());
}

/// The case that once hung: `RLIMIT_NOFILE` 256 and 300 clients connected. The cap comes
/// from the limit read at start, so the clients past it are answered 503 at once and every
/// one gets an answer, while the first ones are still served.
#[test]
fn under_a_low_descriptor_limit_every_client_past_the_cap_is_answered_at_once() {
    let config = TestConfig::new("[server]\nheader_timeout_s = 30\nidle_timeout_s = 30\n");
    let server = Server::start_with_nofile(&config.path, &config.dir.path().join("sessions.db"), 256);
    // 256 less the 64 kept for the store, plugins, the upstream and logs.
    let started = Instant::now();
    while !server.stderr().contains("at most 192 open") {
        assert!(started.elapsed() < Duration::from_secs(5), "{}", server.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    let started = Instant::now();
    let clients: Vec<TcpStream> = (0..300).map(|_| connect(&server)).collect();
    let mut refused = 0;
    let mut open = Vec::new();
    for mut client in clients {
        client.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut buffer = [0u8; 512];
        match client.read(&mut buffer) {
            Ok(n) if n > 0 => {
                let seen = String::from_utf8_lossy(&buffer[..n]);
                assert!(seen.starts_with("HTTP/1.1 503 "), "{seen}");
                assert!(seen.contains("too_many_connections"), "{seen}");
                refused += 1;
            }
            _ => open.push(client),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!((open.len(), refused), (192, 108));
    // The ones let in are served.
    for client in open.iter_mut().take(5) {
        client
            .write_all(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .unwrap();
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buffer = [0u8; 512];
        let n = client.read(&mut buffer).unwrap();
        assert!(String::from_utf8_lossy(&buffer[..n]).starts_with("HTTP/1.1 200 "));
    }
    assert!(!server.stderr().contains("panicked"), "{}", server.stderr());
}

#[test]
fn a_stalled_upstream_is_answered_504_after_read_timeout() {
    // A stand-in upstream that takes the request and never answers (for at most 15 s).
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", upstream.local_addr().unwrap());
    std::thread::spawn(move || {
        upstream.set_nonblocking(true).unwrap();
        let started = Instant::now();
        let mut held = Vec::new();
        while started.elapsed() < Duration::from_secs(15) {
            if let Ok((stream, _)) = upstream.accept() {
                held.push(stream);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let config = TestConfig::new(&format!(
        "[upstream]\nurl = \"{url}\"\ntimeout_s = 30\nread_timeout_s = 1\n"
    ));
    let server = start(&config);
    let started = Instant::now();
    let answer = server.post(
        "/v1/chat/completions",
        &serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}),
    );
    let took = started.elapsed();
    assert_eq!(answer.status, 504, "{answer:?}");
    assert_eq!(answer.body["error"]["code"], "upstream_timeout", "{answer:?}");
    let message = answer.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("read_timeout_s"), "{message}");
    // After read_timeout_s (1 s), far before timeout_s (30 s).
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[test]
fn a_turn_still_running_at_the_end_of_the_grace_period_is_answered_503_and_not_stored() {
    // A chain whose turn takes 6 s (no plugin deadline), a grace period of 2 s.
    let dir = e2e_tests::fixtures::plugin_dir_with(&[&e2e_tests::fixtures::fixture_library("sleeper")]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[server]\nshutdown_grace_s = 2\n[history]\nchain = [\"default\", \"sleeper\"]\nplugin_timeout_ms = 0\n[models.default]\ntokenizer = \"chars4\"\n[plugin.sleeper]\nms = 6000\n",
        dir.path().display().to_string()
    ));
    let store = config.dir.path().join("sessions.db");
    let server = Server::start(&config.path, &store, &[]);
    let id = server.create("default");
    let mut stream = connect(&server);
    let body = serde_json::json!({"messages": [{"role": "user", "content": "a slow turn"}]}).to_string();
    let request = format!(
        "POST /v1/sessions/{id}/turns HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let turn = std::thread::spawn(move || watch(stream, false, Duration::from_secs(15)));
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let status = server.stop();
    let took = started.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        took < Duration::from_millis(2500),
        "exited after {took:?}, grace 2 s"
    );
    let (seen, closed) = turn.join().unwrap();
    assert!(closed.is_some(), "{seen:?}");
    assert!(seen.starts_with("HTTP/1.1 503 "), "{seen:?}");
    assert!(seen.contains("shutting_down"), "{seen:?}");
    // Nothing of it was stored: the session is there, its transcript empty.
    std::thread::sleep(Duration::from_secs(1));
    let server = Server::start(&config.path, &store, &[]);
    assert!(server.transcript(&id).is_empty());
    assert_eq!(server.stop().code(), Some(0));
}
