//! Every wait for PostgreSQL bounded (docs/scaling-out.md#when-the-database-is-unreachable),
//! and the pool.
//!
//! Each operation is a future on the store's runtime (`super::PgStore::block`), bounded by
//! [`Shared::within`]: past its bound the caller gets a 503 and goes on, and the
//! connection it used is dropped, never given back to the pool ([`Pooled`]; its session
//! lock, if any, dies with it). Connecting is bounded the same way (the client's
//! `connect_timeout` covers only the TCP connection, not PostgreSQL's start-up), and TCP
//! keepalive and user timeout end a connection whose peer is gone.
//!
//! Once the database is found unreachable, operations fail at once instead of each
//! waiting its bound, and one attempt at a time reaches for it again, with backoff; the
//! connections pooled before the outage are dropped. The service logs the outage
//! (`service/outage.rs`).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool::managed::{self, Metrics, Object, RecycleError, RecycleResult};
use history_engine::StoreLimits;
use tokio_postgres::{Client, NoTls};

use super::err;
use super::sql::{prepare, trips, Statements};
use crate::store::StoreError;

/// The first wait before the database is tried again once it is found unreachable; it
/// doubles with each failed attempt up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often a waiting operation looks whether the store was found unreachable meanwhile.
const SLICE: Duration = Duration::from_millis(50);

/// A pooled connection: the client, its prepared statements, and the outage count when it
/// was made (one made before the last outage is not used again).
pub(super) struct Conn {
    pub(super) client: Client,
    pub(super) statements: Statements,
    generation: u64,
}

/// What the store, its pool's manager and its probes share.
pub(super) struct Shared {
    pub(super) limits: StoreLimits,
    config: tokio_postgres::Config,
    /// Counts the outages: connections of an earlier one are dropped.
    generation: AtomicU64,
    down: Mutex<Option<Down>>,
    /// A probe of the database runs ([`Shared::probe`]).
    probing: AtomicBool,
}

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
    pub(super) fn new(mut config: tokio_postgres::Config, limits: StoreLimits) -> Arc<Shared> {
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
            probing: AtomicBool::new(false),
        })
    }

    /// `job` within `limit`, or less once the database is found unreachable by another
    /// operation. A wait longer than a statement's (a session's lock, which the database
    /// may rightly take long to give) probes the database once it has waited that long: a
    /// database that does not answer the probe either is unreachable, and the wait ends.
    /// A job cut short is dropped (what it holds with it: see [`Pooled`]).
    pub(super) async fn within<T>(
        self: &Arc<Self>,
        limit: Duration,
        job: impl Future<Output = T>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let generation = self.generation.load(Ordering::SeqCst);
        let deadline = started + limit;
        let mut probed = limit <= self.limits.statement_timeout;
        tokio::pin!(job);
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::unavailable(format!(
                    "the database did not answer within {} ms ([store] statement_timeout_ms, connect_timeout_ms)",
                    limit.as_millis()
                )));
            }
            tokio::select! {
                value = &mut job => return Ok(value),
                () = tokio::time::sleep(SLICE.min(deadline - now)) => {
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
            }
        }
    }

    /// Asks the database `SELECT 1` on a new connection, within one statement's bound, on
    /// a task of its own; one that does not answer is unreachable ([`Shared::failed`]).
    /// One probe at a time.
    fn probe(self: &Arc<Self>) {
        if self.probing.swap(true, Ordering::SeqCst) {
            return;
        }
        let shared = self.clone();
        tokio::spawn(async move {
            let limit = shared.limits.statement_timeout;
            let config = shared.config.clone();
            let answered = shared
                .within(limit, async move {
                    let (client, connection) = config.connect(NoTls).await.map_err(err)?;
                    tokio::spawn(connection);
                    client.simple_query("SELECT 1").await.map_err(err)?;
                    Ok::<_, StoreError>(())
                })
                .await
                .and_then(|answered| answered);
            match answered {
                Err(e) if e.unavailable => shared.failed(&StoreError::unavailable(format!(
                    "the database did not answer a probe while an operation waited: {}",
                    e.message
                ))),
                _ => {}
            }
            shared.probing.store(false, Ordering::SeqCst);
        });
    }

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

    /// Whether `conn` may be used: not closed, not from before an outage.
    pub(super) fn usable(&self, conn: &Conn) -> bool {
        !conn.client.is_closed() && conn.generation == self.generation.load(Ordering::SeqCst)
    }

    /// A new connection within the connect timeout and one statement's. Its driver runs
    /// as a task on the store's runtime until the client is dropped.
    pub(super) async fn connect(self: &Arc<Self>) -> Result<Client, StoreError> {
        self.connecting(false).await.map(|(client, _)| client)
    }

    /// A connection for the pool: [`Shared::connect`] with its statements prepared (the
    /// schema must be there), in the same bound.
    async fn pooled(self: &Arc<Self>) -> Result<Conn, StoreError> {
        let generation = self.generation.load(Ordering::SeqCst);
        match self.connecting(true).await? {
            (client, Some(statements)) => Ok(Conn {
                client,
                statements,
                generation,
            }),
            (_, None) => Err(StoreError::new("a pooled connection without its statements")),
        }
    }

    async fn connecting(
        self: &Arc<Self>,
        prepare_statements: bool,
    ) -> Result<(Client, Option<Statements>), StoreError> {
        let config = self.config.clone();
        let limit = self.limits.connect_timeout + self.limits.statement_timeout;
        self.within(limit, async move {
            let (client, connection) = config.connect(NoTls).await.map_err(err)?;
            tokio::spawn(connection);
            let statements = if prepare_statements {
                // Every statement prepared in one round trip (pipelined).
                trips(1);
                Some(prepare(&client).await.map_err(err)?)
            } else {
                None
            };
            Ok::<_, StoreError>((client, statements))
        })
        .await
        .and_then(|connected| connected)
        .map_err(|e| StoreError::unavailable(format!("cannot connect to the database: {}", e.message)))
    }

    /// What an operation on `conn` came to, within its bound (`within`'s `Err`) or not:
    /// the connection back when it may serve again, `None` when it was dropped (the
    /// database did not answer, or `keep` says its state is unknown).
    pub(super) fn settle<T>(
        &self,
        mut conn: Pooled,
        result: Result<Result<T, StoreError>, StoreError>,
        keep: impl FnOnce(&StoreError) -> bool,
    ) -> (Option<Pooled>, Result<T, StoreError>) {
        let result = result.and_then(|answered| answered);
        match &result {
            Err(e) if e.unavailable => {
                self.failed(e);
                return (None, result);
            }
            Err(e) if !keep(e) => {
                self.answered_on(&conn);
                return (None, result);
            }
            _ => self.answered_on(&conn),
        }
        conn.busy = false;
        (Some(conn), result)
    }

    /// An answer on a connection from before the outage (sent before it began) says
    /// nothing of the database now.
    fn answered_on(&self, conn: &Conn) {
        if conn.generation == self.generation.load(Ordering::SeqCst) {
            self.answered();
        }
    }
}

/// The pool's manager: connections made by [`Shared::connect`]; one not
/// [`Shared::usable`] is dropped when next checked out, without a round trip.
pub(super) struct Manager(pub(super) Arc<Shared>);

impl managed::Manager for Manager {
    type Type = Conn;
    type Error = StoreError;

    async fn create(&self) -> Result<Conn, StoreError> {
        self.0.pooled().await
    }

    async fn recycle(&self, conn: &mut Conn, _: &Metrics) -> RecycleResult<StoreError> {
        if self.0.usable(conn) {
            Ok(())
        } else {
            Err(RecycleError::message("closed, or from before an outage"))
        }
    }
}

pub(super) type Pool = managed::Pool<Manager>;

/// A pooled connection checked out. While `busy` (an operation runs on it, or its state
/// is unknown) dropping it takes it out of the pool and closes it, so a connection whose
/// operation was cut short, or that may hold a session's lock, never serves again.
pub(super) struct Pooled {
    object: Option<Object<Manager>>,
    pub(super) busy: bool,
}

impl Pooled {
    pub(super) fn new(object: Object<Manager>) -> Pooled {
        Pooled {
            object: Some(object),
            busy: true,
        }
    }
}

impl std::ops::Deref for Pooled {
    type Target = Conn;

    fn deref(&self) -> &Conn {
        self.object.as_ref().expect("there until dropped")
    }
}

impl std::ops::DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Conn {
        self.object.as_mut().expect("there until dropped")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(object) = self.object.take().filter(|_| self.busy) {
            drop(Object::take(object));
        }
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

    #[tokio::test]
    async fn a_job_past_its_bound_is_a_503_at_the_bound() {
        let shared = shared(5_000);
        assert_eq!(
            shared.within(Duration::from_secs(1), async { 7 }).await.unwrap(),
            7
        );
        let started = Instant::now();
        let late = shared
            .within(
                Duration::from_millis(100),
                tokio::time::sleep(Duration::from_secs(1)),
            )
            .await;
        let took = started.elapsed();
        let e = late.unwrap_err();
        assert!(
            e.unavailable && e.message.contains("did not answer within 100 ms"),
            "{e}"
        );
        assert!(took < Duration::from_millis(600), "{took:?}");
    }

    #[tokio::test]
    async fn a_wait_ends_when_another_operation_finds_the_database_unreachable() {
        let shared = shared(5_000);
        let waiting = {
            let shared = shared.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let result = shared
                    .within(
                        Duration::from_secs(10),
                        tokio::time::sleep(Duration::from_secs(3)),
                    )
                    .await;
                (result, started.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        shared.failed(&StoreError::unavailable("cannot connect"));
        let (result, took) = waiting.await.unwrap();
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
