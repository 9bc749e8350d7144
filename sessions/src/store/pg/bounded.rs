//! Every wait for PostgreSQL bounded (docs/scaling-out.md#when-the-database-is-unreachable).
//!
//! The synchronous client has no timeout of its own on an answer: a database that stops
//! answering (a partition whose packets go nowhere, a server that hangs) would hold the
//! calling thread, and with it the session, for as long as TCP takes to give up. So each
//! round trip runs on a helper thread while the caller waits at most its bound
//! ([`Shared::within`]); past it the caller gets a 503 and goes on, and the connection is
//! poisoned: never given back to the pool (its session lock, if any, dies with it).
//! Connecting is bounded the same way (the crate's `connect_timeout` covers only the TCP
//! connection, not PostgreSQL's start-up).
//!
//! Once the database is found unreachable, operations fail at once instead of each
//! waiting its bound, and one attempt at a time reaches for it again, with backoff; the
//! connections pooled before the outage are dropped. The service logs the outage
//! (`service/outage.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use history_engine::StoreLimits;
use postgres::NoTls;

use super::err;
use super::sql::{prepare_sql, trips};
use crate::store::StoreError;

/// The first wait before the database is tried again once it is found unreachable; it
/// doubles with each failed attempt up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often a waiting caller looks whether the store was found unreachable meanwhile.
const SLICE: Duration = Duration::from_millis(50);

/// A pooled connection: the client, whether it must not go back to the pool, and the
/// outage count when it was made (one made before the last outage is not used again).
pub(super) struct Conn {
    pub(super) client: postgres::Client,
    poisoned: Arc<AtomicBool>,
    generation: u64,
}

/// What the store, its pool's manager and its helpers share.
pub(super) struct Shared {
    pub(super) limits: StoreLimits,
    config: postgres::Config,
    /// Counts the outages: connections of an earlier one are dropped.
    generation: AtomicU64,
    down: Mutex<Option<Down>>,
    helpers: Mutex<Vec<Helper>>,
    /// A probe of the database runs ([`Shared::probe`]).
    probing: AtomicBool,
}

type Job = Box<dyn FnOnce() + Send>;

/// The database found unreachable.
struct Down {
    since: Instant,
    delay: Duration,
    next_try: Instant,
    /// An attempt to reach it runs now.
    trying: bool,
}

impl Shared {
    /// `config` with the bounds of `limits`: connecting, TCP keepalive and user timeout,
    /// and the connection's `statement_timeout`.
    pub(super) fn new(mut config: postgres::Config, limits: StoreLimits) -> Arc<Shared> {
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(limits.connect_timeout);
        }
        config
            .keepalives(true)
            .keepalives_idle(limits.keepalive)
            .keepalives_interval(Duration::from_secs(1))
            .keepalives_retries(3)
            // Data sent and not acknowledged that long: the peer is gone.
            .tcp_user_timeout(limits.statement_timeout.max(Duration::from_secs(1)));
        let statement_timeout = format!("-c statement_timeout={}", limits.statement_timeout.as_millis());
        let options = match config.get_options() {
            Some(options) if !options.is_empty() => format!("{options} {statement_timeout}"),
            _ => statement_timeout,
        };
        config.options(&options);
        Arc::new(Shared {
            limits,
            config,
            generation: AtomicU64::new(0),
            down: Mutex::new(None),
            helpers: Mutex::new(Vec::new()),
            probing: AtomicBool::new(false),
        })
    }

    /// Runs `job` on a helper thread and waits at most `limit` for it, or less once the
    /// database is found unreachable by another operation. A job that outlives its wait
    /// finishes on its helper, and what it returns is dropped there. A wait longer than a
    /// statement's (a session's lock, which the database may rightly take long to give)
    /// probes the database once it has waited that long: a database that does not answer
    /// the probe either is unreachable, and the wait ends.
    pub(super) fn within<T: Send + 'static>(
        self: &Arc<Self>,
        limit: Duration,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let generation = self.generation.load(Ordering::SeqCst);
        let (done, answer) = mpsc::sync_channel(1);
        self.run(Box::new(move || {
            let _ = done.send(job());
        }));
        let deadline = started + limit;
        let mut probed = limit <= self.limits.statement_timeout;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::unavailable(format!(
                    "the database did not answer within {} ms ([store] statement_timeout_ms, connect_timeout_ms)",
                    limit.as_millis()
                )));
            }
            match answer.recv_timeout(SLICE.min(deadline - now)) {
                Ok(value) => return Ok(value),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if !probed && started.elapsed() >= self.limits.statement_timeout {
                        probed = true;
                        self.probe();
                    }
                    if self.generation.load(Ordering::SeqCst) != generation {
                        return Err(StoreError::unavailable(
                            "the database stopped answering (found unreachable by another operation)",
                        ));
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(StoreError::new("a store helper thread failed"))
                }
            }
        }
    }

    /// Asks the database `SELECT 1` on a new connection, within one statement's bound, on
    /// a helper; one that does not answer is unreachable ([`Shared::failed`]). One probe
    /// at a time.
    fn probe(self: &Arc<Self>) {
        if self.probing.swap(true, Ordering::SeqCst) {
            return;
        }
        let shared = self.clone();
        self.run(Box::new(move || {
            let config = shared.config.clone();
            let limit = shared.limits.statement_timeout;
            let answered = shared
                .within(limit, move || {
                    let mut client = config.connect(NoTls).map_err(err)?;
                    client.simple_query("SELECT 1").map_err(err)?;
                    Ok::<_, StoreError>(())
                })
                .and_then(|answered| answered);
            match answered {
                Err(e) if e.unavailable => shared.failed(&StoreError::unavailable(format!(
                    "the database did not answer a probe while an operation waited: {}",
                    e.message
                ))),
                _ => {}
            }
            shared.probing.store(false, Ordering::SeqCst);
        }));
    }

    /// `job` on an idle helper, or a new one. A helper goes back to the idle ones when
    /// its job is done (a job that outlived its wait holds only its own helper), and ends
    /// when the store is gone.
    fn run(self: &Arc<Self>, job: Job) {
        let idle = self.helpers.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let job = match idle {
            Some(helper) => {
                let channel = helper.0.clone();
                match channel.send((job, helper)) {
                    Ok(()) => return,
                    Err(mpsc::SendError((job, _))) => job,
                }
            }
            None => job,
        };
        let (sender, jobs) = mpsc::channel::<(Job, Helper)>();
        let _ = sender.send((job, Helper(sender.clone())));
        drop(sender);
        let home = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("history-pg".into())
            .spawn(move || {
                while let Ok((job, helper)) = jobs.recv() {
                    job();
                    match home.upgrade() {
                        Some(shared) => shared
                            .helpers
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(helper),
                        None => break,
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start a store helper thread: {e}");
        }
    }
}

/// An idle helper thread: the way to send it a job (and itself, to come back with).
struct Helper(mpsc::Sender<(Job, Helper)>);

impl Shared {
    /// Whether an operation may reach for the database now: `Err` at once while it is
    /// unreachable and the next attempt is not due, or another attempt runs.
    pub(super) fn may_try(&self) -> Result<(), StoreError> {
        let mut down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        let Some(down) = down.as_mut() else {
            return Ok(());
        };
        let now = Instant::now();
        if down.trying || now < down.next_try {
            return Err(StoreError::unavailable(format!(
                "the database has not answered for {} s (tried again with backoff, now every {} ms)",
                down.since.elapsed().as_secs(),
                down.delay.as_millis()
            )));
        }
        down.trying = true;
        Ok(())
    }

    /// The database answered (an error of its own included).
    pub(super) fn answered(&self) {
        let mut down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        if down.is_some() {
            *down = None;
        }
    }

    /// An operation failed: when the database could not be reached, it is unreachable
    /// from now on until an attempt succeeds, and the next attempt waits longer.
    pub(super) fn failed(&self, e: &StoreError) {
        if !e.unavailable {
            return self.answered();
        }
        let mut down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match down.as_mut() {
            None => {
                // Every connection pooled before now is suspect: dropped when next seen,
                // and every operation still waiting on one gives up.
                self.generation.fetch_add(1, Ordering::SeqCst);
                *down = Some(Down {
                    since: now,
                    delay: FIRST_BACKOFF,
                    next_try: now + FIRST_BACKOFF,
                    trying: false,
                });
            }
            Some(down) if down.trying => {
                down.trying = false;
                down.delay = (down.delay * 2).min(MAX_BACKOFF);
                down.next_try = now + down.delay;
            }
            Some(_) => {}
        }
    }

    /// Whether `conn` may be used: not poisoned, not closed, not from before an outage.
    pub(super) fn usable(&self, conn: &Conn) -> bool {
        !conn.poisoned.load(Ordering::SeqCst)
            && !conn.client.is_closed()
            && conn.generation == self.generation.load(Ordering::SeqCst)
    }

    /// A new connection within the connect timeout and one statement's; with
    /// `prepare`, its statements prepared (the schema must be there).
    pub(super) fn connect(self: &Arc<Self>, prepare: bool) -> Result<Conn, StoreError> {
        let config = self.config.clone();
        let generation = self.generation.load(Ordering::SeqCst);
        let limit = self.limits.connect_timeout + self.limits.statement_timeout;
        let client = self
            .within(limit, move || {
                let mut client = config.connect(NoTls).map_err(err)?;
                if prepare {
                    trips(1);
                    client.batch_execute(prepare_sql()).map_err(err)?;
                }
                Ok::<_, StoreError>(client)
            })
            .and_then(|connected| connected)
            .map_err(|e| StoreError::unavailable(format!("cannot connect to the database: {}", e.message)))?;
        Ok(Conn {
            client,
            poisoned: Arc::new(AtomicBool::new(false)),
            generation,
        })
    }

    /// `f` on `conn` within `limit`: the connection back with `f`'s result, or a 503
    /// when the database did not answer in time (the connection is then poisoned, and
    /// stays with its helper until the call returns there).
    pub(super) fn on<C, T>(
        self: &Arc<Self>,
        mut conn: C,
        limit: Duration,
        f: impl FnOnce(&mut postgres::Client) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<(C, Result<T, StoreError>), StoreError>
    where
        C: std::ops::DerefMut<Target = Conn> + Send + 'static,
        T: Send + 'static,
    {
        let poisoned = conn.poisoned.clone();
        match self.within(limit, move || {
            let result = f(&mut conn.client);
            (conn, result)
        }) {
            Ok((conn, result)) => {
                // An answer on a connection from before the outage (sent before it began)
                // says nothing of the database now.
                let current = conn.generation == self.generation.load(Ordering::SeqCst);
                match &result {
                    Err(e) if e.unavailable => {
                        poisoned.store(true, Ordering::SeqCst);
                        self.failed(e);
                    }
                    _ if current => self.answered(),
                    _ => {}
                }
                Ok((conn, result))
            }
            Err(e) => {
                poisoned.store(true, Ordering::SeqCst);
                self.failed(&e);
                Err(e)
            }
        }
    }
}

impl Conn {
    /// Never given back to the pool.
    pub(super) fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
    }
}

/// The pool's manager: connections made by [`Shared::connect`].
pub(super) struct Manager(pub(super) Arc<Shared>);

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = StoreError;

    fn connect(&self) -> Result<Conn, StoreError> {
        self.0.connect(true)
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), StoreError> {
        conn.client.simple_query("").map(drop).map_err(err)
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        !self.0.usable(conn)
    }
}

/// The pool's failed connection attempts are the outage's, logged once by the service;
/// here only at debug level.
#[derive(Debug)]
pub(super) struct Quiet;

impl r2d2::HandleError<StoreError> for Quiet {
    fn handle_error(&self, error: StoreError) {
        tracing::debug!("the store's pool: {error}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(statement_ms: u64) -> Arc<Shared> {
        let limits = StoreLimits {
            statement_timeout: Duration::from_millis(statement_ms),
            ..StoreLimits::default()
        };
        Shared::new("postgres://nobody@127.0.0.1:1/none".parse().unwrap(), limits)
    }

    #[test]
    fn a_job_past_its_bound_is_a_503_at_the_bound_and_helpers_are_reused() {
        let shared = shared(5_000);
        assert_eq!(shared.within(Duration::from_secs(1), || 7).unwrap(), 7);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            shared.helpers.lock().unwrap().len(),
            1,
            "the helper is idle again"
        );
        let started = Instant::now();
        let late = shared.within(Duration::from_millis(100), || {
            std::thread::sleep(Duration::from_secs(1))
        });
        let took = started.elapsed();
        let e = late.unwrap_err();
        assert!(
            e.unavailable && e.message.contains("did not answer within 100 ms"),
            "{e}"
        );
        assert!(took < Duration::from_millis(600), "{took:?}");
        // The late job holds its own helper only: another call gets the idle one or a new one.
        assert_eq!(shared.within(Duration::from_secs(1), || 8).unwrap(), 8);
    }

    #[test]
    fn a_wait_ends_when_another_operation_finds_the_database_unreachable() {
        let shared = shared(5_000);
        let waiting = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let result = shared.within(Duration::from_secs(10), || {
                    std::thread::sleep(Duration::from_secs(3))
                });
                (result, started.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        shared.failed(&StoreError::unavailable("cannot connect"));
        let (result, took) = waiting.join().unwrap();
        assert!(result.unwrap_err().unavailable);
        assert!(took < Duration::from_secs(1), "{took:?}");
    }

    #[test]
    fn an_unreachable_database_is_tried_again_one_at_a_time_with_backoff() {
        let shared = shared(5_000);
        assert!(shared.may_try().is_ok(), "up: every operation tries");
        shared.failed(&StoreError::new("a refused write"));
        assert!(shared.may_try().is_ok(), "the database answered");
        shared.failed(&StoreError::unavailable("cannot connect"));
        let refused = shared.may_try().unwrap_err();
        assert!(
            refused.unavailable && refused.message.contains("now every 100 ms"),
            "{refused}"
        );
        std::thread::sleep(FIRST_BACKOFF);
        assert!(shared.may_try().is_ok(), "the attempt is due");
        assert!(shared.may_try().is_err(), "one attempt at a time");
        shared.failed(&StoreError::unavailable("cannot connect"));
        let refused = shared.may_try().unwrap_err();
        assert!(refused.message.contains("now every 200 ms"), "{refused}");
        shared.answered();
        assert!(shared.may_try().is_ok(), "back");
    }
}
