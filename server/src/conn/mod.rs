//! The clients' connections (docs/http-api.md#connections): the accept loop, the cap on
//! open connections, running out of descriptors, and the bounded drain on SIGTERM.
//!
//! - `socket`: where a connection is between requests, each phase on its own clock (the
//!   header timeout, answered 408; the idle timeout), and the watchdog that ends it;
//! - `guard`: around every route, the body's deadline and the drain's 503.

mod guard;
mod socket;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::Router;
use history_engine::config::ServerConfig;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use guard::{guard, Phases};
use socket::{watchdog, Expired, Phase, Shared};

/// The connection settings in force: `[server]`, the cap resolved against the process's
/// descriptor limit.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
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
            idle_timeout: Duration::from_secs(config.idle_timeout_s),
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

/// Tells the connection's phase that its answer ended, when the answer's body is dropped.
struct Answered(Arc<Phase>);

impl Drop for Answered {
    fn drop(&mut self) {
        self.0.answered();
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

/// Running out of descriptors, told once per burst: the first failed accept is logged,
/// the rest until an accept works again are not (docs/http-api.md#connections).
#[derive(Default)]
struct Exhaustion {
    during: AtomicBool,
}

impl Exhaustion {
    /// An accept failed for want of descriptors: whether this starts a burst.
    fn failed(&self) -> bool {
        !self.during.swap(true, Ordering::Relaxed)
    }

    /// An accept worked: whether this ends a burst.
    fn recovered(&self) -> bool {
        self.during.swap(false, Ordering::Relaxed)
    }
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
        stopping: stop_rx.clone(),
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
    let exhausted = Exhaustion::default();
    let mut builder = hyper::server::conn::http1::Builder::new();
    // Our watchdog keeps the header and idle clocks (`socket`); hyper's one timer would
    // count an idle keep-alive connection as a slow head.
    builder.timer(TokioTimer::new()).header_read_timeout(None);
    tokio::pin!(signal);
    loop {
        let accepted = tokio::select! {
            _ = &mut signal => break,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => {
                if exhausted.recovered() {
                    tracing::info!("accepting connections again");
                }
                tcp
            }
            Err(e) if out_of_descriptors(&e) => {
                if exhausted.failed() {
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
        let phase = Phase::new();
        let io = Shared {
            tcp: tcp.clone(),
            phase: phase.clone(),
        };
        let routes = TowerToHyperService::new(app.clone());
        let service = {
            let phase = phase.clone();
            hyper::service::service_fn(move |request| {
                phase.busy();
                let answered = Answered(phase.clone());
                let call = hyper::service::Service::call(&routes, request);
                async move {
                    // Idle again once the answer's body is done with (written, or dropped).
                    let response = call.await?;
                    Ok::<_, std::convert::Infallible>(response.map(|body| {
                        body.map_frame(move |frame| {
                            let _ = &answered;
                            frame
                        })
                    }))
                }
            })
        };
        let connection = builder.serve_connection(TokioIo::new(io), service);
        let connection = graceful.watch(connection);
        let dog = watchdog(phase, limits.header_timeout, limits.idle_timeout, stop_rx.clone());
        tokio::spawn(async move {
            tokio::select! {
                ended = connection => {
                    if let Err(e) = ended {
                        tracing::debug!("connection ended: {e}");
                    }
                }
                expired = dog => {
                    // hyper's side is dropped here; the socket closes with the last holder.
                    if expired == Expired::SlowHead {
                        // Best effort: the answer fits any socket buffer.
                        let answer = canned(
                            "408 Request Timeout",
                            "request_timeout",
                            "the request's headers did not arrive in time ([server] header_timeout_s)",
                            "",
                        );
                        let _ = tcp.try_write(answer.as_bytes());
                    }
                }
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
    fn running_out_of_descriptors_is_told_once_per_burst() {
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert!(out_of_descriptors(&emfile));
        assert!(out_of_descriptors(&std::io::Error::from_raw_os_error(
            libc::ENFILE
        )));
        assert!(!out_of_descriptors(&std::io::Error::from_raw_os_error(
            libc::ECONNABORTED
        )));
        let exhaustion = Exhaustion::default();
        assert!(!exhaustion.recovered(), "no burst yet");
        assert!(exhaustion.failed(), "the first failure is logged");
        assert!(
            !exhaustion.failed() && !exhaustion.failed(),
            "the rest of the burst is not"
        );
        assert!(exhaustion.recovered(), "the end of the burst is");
        assert!(exhaustion.failed(), "a new burst is logged again");
    }

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
