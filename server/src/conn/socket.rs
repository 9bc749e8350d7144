//! A client's socket and where its connection is between requests
//! (docs/http-api.md#connections): fresh, idle after an answer, reading a request's head,
//! or busy with a request. Each phase but the last has its own clock, and a watchdog task
//! ends the connection when it runs out — hyper's single `header_read_timeout` cannot tell
//! an idle keep-alive connection from a slow head (hyperium/hyper#3828).

use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// Accepted, nothing read yet: the header timeout, closed without an answer.
const FRESH: u8 = 0;
/// An answer was written and nothing of a next request has come: the idle timeout,
/// closed without an answer.
const IDLE: u8 = 1;
/// Bytes of a request came, its head is not all in: the header timeout, answered 408.
const HEAD: u8 = 2;
/// The request reached the routes; its body and run have clocks of their own
/// (`guard`), so the watchdog waits.
const BUSY: u8 = 3;

/// Where a connection is, shared by its socket (bytes in), its service (a request
/// reached the routes, its answer ended) and its watchdog.
pub(super) struct Phase {
    state: AtomicU8,
    since: Mutex<Instant>,
    changed: Notify,
}

impl Phase {
    pub(super) fn new() -> Arc<Phase> {
        Arc::new(Phase {
            state: AtomicU8::new(FRESH),
            since: Mutex::new(Instant::now()),
            changed: Notify::new(),
        })
    }

    fn set(&self, state: u8) {
        *self.since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.state.store(state, Ordering::SeqCst);
        self.changed.notify_one();
    }

    fn now(&self) -> (u8, Instant) {
        let since = *self.since.lock().unwrap_or_else(|e| e.into_inner());
        (self.state.load(Ordering::SeqCst), since)
    }

    /// A request's head was read whole: the routes have it.
    pub(super) fn busy(&self) {
        self.set(BUSY);
    }

    /// The answer ended (its body was written or dropped): idle until the next request.
    pub(super) fn answered(&self) {
        self.set(IDLE);
    }

    /// Bytes came: a request began, unless one already had.
    fn bytes_in(&self) {
        let state = self.state.load(Ordering::SeqCst);
        if state == FRESH || state == IDLE {
            self.set(HEAD);
        }
    }
}

/// What ended a connection from our side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expired {
    /// No request came within the header timeout (fresh) or the idle timeout (after an
    /// answer), or SIGTERM came while none was running: closed without a word.
    Quiet,
    /// A request's head did not arrive within the header timeout: answered 408.
    SlowHead,
}

/// Resolves when `stopping` changes; never once its sender is gone (the serve loop has
/// returned, and only the phase matters).
async fn stop_changed(stopping: &mut watch::Receiver<bool>) {
    if stopping.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Waits until the connection's phase outlives its clock, or SIGTERM finds it between
/// requests; never while a request is busy.
pub(super) async fn watchdog(
    phase: Arc<Phase>,
    header_timeout: Duration,
    idle_timeout: Duration,
    mut stopping: watch::Receiver<bool>,
) -> Expired {
    loop {
        let changed = phase.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let (state, since) = phase.now();
        if *stopping.borrow() && state != BUSY {
            return if state == HEAD {
                Expired::SlowHead
            } else {
                Expired::Quiet
            };
        }
        let limit = match state {
            FRESH | HEAD => header_timeout,
            IDLE => idle_timeout,
            _ => {
                tokio::select! {
                    _ = &mut changed => {}
                    _ = stop_changed(&mut stopping) => {}
                }
                continue;
            }
        };
        tokio::select! {
            _ = tokio::time::sleep_until(since + limit) => {
                if phase.now() == (state, since) {
                    return if state == HEAD { Expired::SlowHead } else { Expired::Quiet };
                }
            }
            _ = &mut changed => {}
            _ = stop_changed(&mut stopping) => {}
        }
    }
}

/// A client's socket, shared between hyper and the connection's task, which may still
/// write an answer on it (a 408) after hyper's side was dropped. Reads tell the phase
/// when a request begins.
pub(super) struct Shared {
    pub(super) tcp: Arc<TcpStream>,
    pub(super) phase: Arc<Phase>,
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
                        self.phase.bytes_in();
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
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Vectored, so hyper queues an answer's body beside its head instead of copying
    /// both into one buffer first (a turn's answer is hundreds of kilobytes,
    /// docs/sessions.md#answers).
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        loop {
            ready!(self.tcp.poll_write_ready(cx))?;
            match self.tcp.try_write_vectored(data) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
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

#[cfg(test)]
mod tests {
    use super::*;

    fn watch_of(phase: &Arc<Phase>, stop: &watch::Sender<bool>) -> tokio::task::JoinHandle<Expired> {
        tokio::spawn(watchdog(
            phase.clone(),
            Duration::from_secs(1),
            Duration::from_secs(3),
            stop.subscribe(),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn each_phase_runs_on_its_own_clock_and_a_busy_one_on_none() {
        let (stop, _) = watch::channel(false);
        // Fresh: the header timeout, quietly.
        let phase = Phase::new();
        let started = Instant::now();
        assert_eq!(watch_of(&phase, &stop).await.unwrap(), Expired::Quiet);
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        // Idle after an answer: the idle timeout, quietly.
        let phase = Phase::new();
        phase.answered();
        let started = Instant::now();
        assert_eq!(watch_of(&phase, &stop).await.unwrap(), Expired::Quiet);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        // A head begun: the header timeout, answered.
        let phase = Phase::new();
        phase.answered();
        let dog = watch_of(&phase, &stop);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let started = Instant::now();
        phase.bytes_in();
        assert_eq!(dog.await.unwrap(), Expired::SlowHead);
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        // Busy: never, however long; idle again once answered.
        let phase = Phase::new();
        phase.busy();
        let dog = watch_of(&phase, &stop);
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!dog.is_finished());
        let started = Instant::now();
        phase.answered();
        assert_eq!(dog.await.unwrap(), Expired::Quiet);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn sigterm_ends_every_connection_between_requests_at_once() {
        let (stop, _) = watch::channel(false);
        let idle = Phase::new();
        idle.answered();
        let head = Phase::new();
        head.bytes_in();
        let busy = Phase::new();
        busy.busy();
        let dogs = [
            watch_of(&idle, &stop),
            watch_of(&head, &stop),
            watch_of(&busy, &stop),
        ];
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.send(true).unwrap();
        let [idle_dog, head_dog, busy_dog] = dogs;
        assert_eq!(idle_dog.await.unwrap(), Expired::Quiet);
        assert_eq!(head_dog.await.unwrap(), Expired::SlowHead);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            !busy_dog.is_finished(),
            "a running request is the drain's, not the watchdog's"
        );
        busy.answered();
        assert_eq!(busy_dog.await.unwrap(), Expired::Quiet);
    }
}
