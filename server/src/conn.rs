//! The clients' connections (docs/http-api.md#connections): the accept loop, the cap on
//! open connections, the header and body timeouts, and the bounded drain on SIGTERM.
//!
//! hyper's own `header_read_timeout` bounds a request's line and headers; it runs from the
//! moment hyper waits for a request, so it also closes a kept-alive connection left idle.
//! hyper closes on it without a word, so the socket is shared ([`Shared`]) and a
//! connection that had begun a request is answered 408 after hyper lets it go. The body's
//! deadline is ours (a body stream that gives up), since hyper has none.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::StreamExt;
use history_engine::config::ServerConfig;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// The connection settings in force: `[server]`, the cap resolved against the process's
/// descriptor limit.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_connections: usize,
    pub grace: Duration,
    /// `RLIMIT_NOFILE` (soft) at start, when known.
    pub nofile: Option<u64>,
}

/// Descriptors kept for everything but clients: the store, plugins, the upstream, logs.
fn reserved(nofile: u64) -> u64 {
    (nofile / 4).max(64)
}

impl Limits {
    pub fn new(config: &ServerConfig) -> Limits {
        let nofile = nofile_limit();
        // Under the descriptor limit, so a client past the cap can still be answered.
        let room = nofile.map(|n| n.saturating_sub(reserved(n)).max(1));
        let max_connections = match (config.max_connections, room) {
            (0, Some(room)) => room,
            (0, None) => 1024,
            (configured, Some(room)) if configured > room => {
                tracing::warn!(
                    "[server] max_connections {configured} is past what RLIMIT_NOFILE {} allows; \
                     using {room} (raise the limit: ulimit -n, or LimitNOFILE= under systemd)",
                    nofile.unwrap_or_default()
                );
                room
            }
            (configured, _) => configured,
        };
        Limits {
            header_timeout: Duration::from_secs(config.header_timeout_s),
            body_timeout: Duration::from_secs(config.body_timeout_s),
            max_connections: max_connections as usize,
            grace: Duration::from_secs(config.shutdown_grace_s),
            nofile,
        }
    }
}

#[cfg(unix)]
fn nofile_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given.
    let status = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    // rlim_t is not u64 on every platform.
    #[allow(clippy::unnecessary_cast)]
    let soft = limit.rlim_cur as u64;
    (status == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(soft)
}

#[cfg(not(unix))]
fn nofile_limit() -> Option<u64> {
    None
}

/// What every request watches: SIGTERM came (a body still being sent is cut), and the
/// drain's deadline passed (a request still running is answered 503).
#[derive(Clone)]
struct Phases {
    stopping: watch::Receiver<bool>,
    deadline: watch::Receiver<bool>,
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let mut response = (
        status,
        axum::Json(serde_json::json!({"error": {"code": code, "message": message}})),
    )
        .into_response();
    // hyper closes the connection after an answer that says so.
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Why a request's body stopped coming.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    Timeout,
    Stopping,
}

/// The body timeout and the drain, around every route.
async fn guard(phases: Phases, body_timeout: Duration, request: Request, next: Next) -> Response {
    if *phases.stopping.borrow() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the host is shutting down",
        );
    }
    let cut: Arc<std::sync::Mutex<Option<Cut>>> = Arc::default();
    let (parts, body) = request.into_parts();
    let deadline = tokio::time::Instant::now() + body_timeout;
    let mut stopping = phases.stopping.clone();
    let ends: std::pin::Pin<Box<dyn Future<Output = Cut> + Send>> = Box::pin(async move {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => Cut::Timeout,
            _ = stopping.wait_for(|s| *s) => Cut::Stopping,
        }
    });
    let seen = cut.clone();
    let stream = futures_util::stream::unfold(Some((body.into_data_stream(), ends)), move |state| {
        let seen = seen.clone();
        async move {
            let (mut data, mut ends) = state?;
            tokio::select! {
                biased;
                next = data.next() => next.map(|chunk| (chunk, Some((data, ends)))),
                why = &mut ends => {
                    *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                    let e = axum::Error::new(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the body did not arrive in time",
                    ));
                    Some((Err(e), None))
                }
            }
        }
    });
    let request = Request::from_parts(parts, Body::from_stream(stream));
    let mut deadline = phases.deadline.clone();
    let response = tokio::select! {
        biased;
        response = next.run(request) => response,
        _ = deadline.wait_for(|d| *d) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the host shut down before this request finished (shutdown_grace_s); nothing of it was stored unless it had finished",
            )
        }
    };
    let cut = *cut.lock().unwrap_or_else(|e| e.into_inner());
    match cut {
        Some(Cut::Timeout) => error(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            &format!(
                "the request body did not arrive within {} s ([server] body_timeout_s)",
                body_timeout.as_secs()
            ),
        ),
        Some(Cut::Stopping) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the host is shutting down",
        ),
        None => response,
    }
}

/// A client's socket, shared between hyper and the accept loop's task, which answers 408
/// on it after hyper gave up on a request's headers. `begun`: bytes came since the last
/// answer was written, so a request had begun (else the connection was idle).
struct Shared {
    tcp: Arc<TcpStream>,
    begun: Arc<AtomicBool>,
}

impl AsyncRead for Shared {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            ready!(self.tcp.poll_read_ready(cx))?;
            match self.tcp.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    if n > 0 {
                        self.begun.store(true, Ordering::Relaxed);
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for Shared {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        loop {
            ready!(self.tcp.poll_write_ready(cx))?;
            match self.tcp.try_write(data) {
                Ok(n) => {
                    self.begun.store(false, Ordering::Relaxed);
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // The write side only, as TcpStream's own shutdown; the socket closes when the
        // last holder lets it go.
        #[cfg(unix)]
        {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&*self.tcp);
            // SAFETY: a shutdown of a descriptor this socket owns and keeps open.
            if unsafe { libc::shutdown(fd, libc::SHUT_WR) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::NotConnected {
                    return Poll::Ready(Err(e));
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// A whole answer written straight to a socket, then the connection closed: the error
/// shape of every other answer.
fn canned(status: &str, code: &str, message: &str, extra: &str) -> String {
    let body = serde_json::json!({"error": {"code": code, "message": message}}).to_string();
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The answer to a connection past the cap: written at once, then the connection closed.
async fn refuse(mut tcp: TcpStream, max: usize) {
    let answer = canned(
        "503 Service Unavailable",
        "too_many_connections",
        &format!("the host has {max} connections open ([server] max_connections); try again later"),
        "retry-after: 1\r\n",
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = tcp.write_all(answer.as_bytes()).await;
        let _ = tcp.shutdown().await;
    })
    .await;
}

fn out_of_descriptors(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

/// Serves `app` on `listener` until `signal`; then stops accepting, calls `stopping`,
/// lets running requests finish within the grace period, answers the rest 503 and returns.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    signal: impl Future<Output = ()>,
    stopping: impl FnOnce(),
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (deadline_tx, deadline_rx) = watch::channel(false);
    let phases = Phases {
        stopping: stop_rx,
        deadline: deadline_rx,
    };
    let body_timeout = limits.body_timeout;
    let app = app.layer(axum::middleware::from_fn(move |request: Request, next: Next| {
        guard(phases.clone(), body_timeout, request, next)
    }));
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    // A descriptor kept spare: when the process runs out, it is let go for a moment so the
    // waiting client can be accepted and answered instead of left hanging.
    let mut spare = std::fs::File::open("/dev/null").ok();
    let exhausted = AtomicBool::new(false);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(signal);
    loop {
        let accepted = tokio::select! {
            _ = &mut signal => break,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => {
                if exhausted.swap(false, Ordering::Relaxed) {
                    tracing::info!("accepting connections again");
                }
                tcp
            }
            Err(e) if out_of_descriptors(&e) => {
                // Once per burst: the first refusal is logged, the rest until an accept works are not.
                if !exhausted.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        "out of file descriptors ({e}): RLIMIT_NOFILE is {}; raise it (ulimit -n, or \
                         LimitNOFILE= under systemd) or lower [server] max_connections (now {})",
                        limits.nofile.map_or("unknown".to_string(), |n| n.to_string()),
                        limits.max_connections
                    );
                }
                if spare.take().is_some() {
                    if let Ok((tcp, _)) = listener.accept().await {
                        refuse(tcp, limits.max_connections).await;
                    }
                    spare = std::fs::File::open("/dev/null").ok();
                } else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
            Err(e) => {
                tracing::debug!("accept failed: {e}");
                continue;
            }
        };
        // No Nagle delay: a proxied stream's chunks and a small answer after its headers
        // go out at once (docs/proxy.md#performance).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY on a connection: {e}");
        }
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tokio::spawn(refuse(tcp, limits.max_connections));
            continue;
        };
        let tcp = Arc::new(tcp);
        let begun = Arc::new(AtomicBool::new(false));
        let io = Shared {
            tcp: tcp.clone(),
            begun: begun.clone(),
        };
        let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let ended = connection.await;
            if let Err(e) = ended {
                // A request begun but its headers not all in: told why (an idle one is
                // just closed). Best effort: the answer fits any socket buffer.
                if e.is_timeout() && begun.load(Ordering::Relaxed) {
                    let answer = canned(
                        "408 Request Timeout",
                        "request_timeout",
                        "the request's headers did not arrive in time ([server] header_timeout_s)",
                        "",
                    );
                    let _ = tcp.try_write(answer.as_bytes());
                }
                tracing::debug!("connection ended: {e}");
            }
            drop(permit);
        });
    }
    drop(listener);
    tracing::info!(
        "shutting down: no new connections; running requests finish within {} s (shutdown_grace_s)",
        limits.grace.as_secs()
    );
    stopping();
    let _ = stop_tx.send(true);
    // Answered before the grace period ends, so the process is gone by then.
    let answer_at = limits.grace.saturating_sub(Duration::from_millis(500));
    let closed = graceful.shutdown();
    tokio::pin!(closed);
    tokio::select! {
        _ = &mut closed => return,
        _ = tokio::time::sleep(answer_at) => {}
    }
    tracing::warn!("shutdown_grace_s reached: requests still running are answered 503");
    let _ = deadline_tx.send(true);
    let _ = tokio::time::timeout(limits.grace - answer_at, closed).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_stays_under_the_descriptor_limit() {
        let nofile = nofile_limit();
        let config = |max_connections| ServerConfig {
            max_connections,
            ..ServerConfig::default()
        };
        let derived = Limits::new(&config(0));
        let asked = Limits::new(&config(u64::MAX / 2));
        match nofile {
            Some(nofile) => {
                assert_eq!(derived.nofile, Some(nofile));
                assert_eq!(
                    derived.max_connections as u64,
                    nofile.saturating_sub(reserved(nofile)).max(1)
                );
                assert!((derived.max_connections as u64) < nofile);
                // Asked for more than the limit allows: lowered to it.
                assert_eq!(asked.max_connections, derived.max_connections);
            }
            None => assert_eq!(derived.max_connections, 1024),
        }
        assert_eq!(Limits::new(&config(8)).max_connections, 8);
        assert_eq!((reserved(256), reserved(100_000)), (64, 25_000));
    }
}
