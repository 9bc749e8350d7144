//! The shared store: sessions in PostgreSQL, so several hosts serve the same sessions
//! (docs/scaling-out.md). The same tables and semantics as the embedded store, plus:
//!
//! - a session's operations are serialized across hosts by an advisory lock on the
//!   session, taken for the whole operation ([`PgStore::lock`]) on one pooled connection
//!   that also loads and commits;
//! - each session row has a version, one more per change: a host whose copy of a session
//!   is older than the stored one reloads it, and a write that does not follow the stored
//!   version is refused;
//! - the schema is versioned and migrated on start under an advisory lock, so hosts
//!   starting together migrate once.
//!
//! The client is `tokio-postgres` with a `deadpool` pool (docs/scaling-out.md#crate-choice).
//! The [`Store`] trait is synchronous and the service calls it on blocking threads: the
//! store owns a small runtime of its own, where its connections' drivers run, and each
//! call runs its operation there as a task and waits for the answer on a channel
//! ([`block`]). That works from any thread — `Handle::block_on` would panic on an async
//! one, where a session's lock may be dropped — and keeps the store's sockets off the
//! service's runtime. A turn's statements are pipelined on one client (futures polled
//! together, `lock`), every value a typed parameter (`sql`). Every wait for the database
//! is bounded (`bounded`, `[store]` in docs/configuration.md).

mod bounded;
mod lock;
mod ops;
mod schema;
mod sql;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use history_engine::StoreLimits;
use tokio::runtime::{Handle, Runtime};

use super::{
    HostCopy, Locked, SessionRow, SessionWrite, Store, StoreError, StoredSession, TokenCounts, TranscriptRow,
};
use bounded::{Manager, Pool, Pooled, Shared};
use ops::{create_limited_on, delete_on, insert, load_on, reap_on, row_and_len, set_effective_ctx_on};
use schema::{check_version, migrate};
pub use sql::round_trips;
use sql::{col, trips, ROW_COLUMNS};

/// The advisory lock key of session creation as a whole, so two hosts cannot both take
/// the last place under `max_users` (a session's key is a hash of its id).
const CREATE_LOCK: i64 = 0x6869_7374_6372_6561;

/// The largest pool of one host. Session operations hold one connection each for their
/// whole length; the service runs at most [`PgStore::MAX_OPERATIONS`] at once, and the
/// rest of the pool serves listings, transcript pages, health and the reaper.
const POOL_SIZE: usize = PgStore::MAX_OPERATIONS + 4;

/// The PostgreSQL store.
pub struct PgStore {
    pool: Pool,
    lock_wait: Duration,
    shared: Arc<Shared>,
    runtime: Handle,
    /// The store's own runtime: its connections' drivers and its operations run there.
    /// Always `Some` but while dropping.
    owned: Option<Runtime>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // The idle connections close (their drivers end), then the runtime stops, on a
        // thread of its own: stopping it blocks, which must not happen on an async thread
        // (the service is dropped on one).
        self.pool.close();
        if let Some(runtime) = self.owned.take() {
            let _ = std::thread::spawn(move || runtime.shutdown_timeout(Duration::from_millis(500))).join();
        }
    }
}

/// Runs `job` on the store's runtime and waits for it on this thread, whatever thread it
/// is: a blocking one of the service's (the usual caller), a plain one, or an async one
/// (a session's lock dropped there gives its lock back). `job` is bounded (`bounded`).
fn block<T: Send + 'static>(
    runtime: &Handle,
    job: impl Future<Output = T> + Send + 'static,
) -> Result<T, StoreError> {
    let (sender, answer) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = sender.send(job.await);
    });
    answer
        .recv()
        .map_err(|_| StoreError::unavailable("the store's runtime stopped"))
}

/// A PostgreSQL error as a store error: no answer from the server (a connection lost or
/// refused, the server shutting down) is [`StoreError::unavailable`].
fn err(e: tokio_postgres::Error) -> StoreError {
    let code = e.code().map(|c| c.code().to_string());
    let io = std::error::Error::source(&e).is_some_and(|source| source.is::<std::io::Error>());
    let unavailable = e.is_closed()
        || io
        // connection_exception, operator_intervention (shutdown, cannot connect now, and
        // query_canceled: statement_timeout, the database answering too slowly)
        || code
            .as_ref()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57"));
    let message = match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    };
    StoreError { message, unavailable }
}

/// A pooled connection, at once a 503 while the database is unreachable and not due for
/// another attempt (`bounded`). Connections from before an outage, or that the database
/// closed, are dropped by the pool's manager as they come out.
async fn connection(shared: &Arc<Shared>, pool: &Pool) -> Result<Pooled, StoreError> {
    shared.may_try()?;
    match pool.get().await {
        Ok(object) => Ok(Pooled::new(object)),
        Err(e) => {
            let e = match e {
                deadpool::managed::PoolError::Backend(e) => e,
                e => StoreError::unavailable(format!("cannot reach the database: {e}")),
            };
            shared.failed(&e);
            Err(e)
        }
    }
}

/// A store's location for messages: a URL without its password.
pub fn shown(location: &std::path::Path) -> String {
    let text = location.to_string_lossy();
    hide_password(&text)
}

fn hide_password(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

impl PgStore {
    /// How many session operations one host runs at once on this store.
    pub const MAX_OPERATIONS: usize = 16;

    /// Connects to `url` (a `postgres://` URL), migrating the schema if needed.
    /// `lock_wait` is how long an operation waits for a session another host holds;
    /// `limits` bound every other wait.
    pub fn open(url: &str, lock_wait: Duration, limits: StoreLimits) -> Result<PgStore, StoreError> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::new(format!("bad store URL {}: {e}", hide_password(url))))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("history-pg")
            .enable_all()
            .build()
            .map_err(|e| StoreError::new(format!("cannot start the store's runtime: {e}")))?;
        let shared = Shared::new(config, limits);
        let handle = runtime.handle().clone();
        let pool = Pool::builder(Manager(shared.clone()))
            .max_size(POOL_SIZE)
            .wait_timeout(Some(limits.connect_timeout))
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::new(format!("cannot make the store's pool: {e}")))?;
        // No check on checkout but the manager's own (closed, or from before an outage):
        // a check would cost a round trip per turn. A pooled connection the database
        // closed meanwhile fails its first use, is dropped, and a session's lock is asked
        // again on a fresh one (`PgStore::lock_session`).
        let store = PgStore {
            pool,
            lock_wait,
            shared: shared.clone(),
            runtime: handle.clone(),
            owned: Some(runtime),
        };
        let shown_url = hide_password(url);
        block(&handle, async move {
            // The schema first, on a connection of its own: the pool's connections prepare
            // their statements against it as they open. A migration may take longer than a
            // statement: no statement_timeout on it.
            let mut first = shared
                .connect()
                .await
                .map_err(|e| StoreError::unavailable(format!("{shown_url}: {e}")))?;
            first
                .batch_execute("SET statement_timeout = 0")
                .await
                .map_err(err)?;
            check_version(&first).await?;
            migrate(&mut first).await
        })??;
        Ok(store)
    }

    /// `f` on a pooled connection, waiting at most one statement's bound (and `extra`).
    /// `f` gives the connection back with its result; one it does not give back in time
    /// is dropped with the future (`bounded::Pooled`).
    fn run<T, F, Fut>(&self, extra: Duration, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Pooled) -> Fut + Send + 'static,
        Fut: Future<Output = (Pooled, Result<T, StoreError>)> + Send,
    {
        let (shared, pool) = (self.shared.clone(), self.pool.clone());
        let limit = self.shared.limits.statement_timeout + extra;
        block(&self.runtime, async move {
            let c = connection(&shared, &pool).await?;
            match shared.within(limit, f(c)).await {
                Ok((c, result)) => shared.settle(c, Ok(result), |_| true).1,
                Err(e) => {
                    shared.failed(&e);
                    Err(e)
                }
            }
        })?
    }
}

fn written_id(write: &SessionWrite<'_>) -> String {
    write.row.map_or("?", |r| r.id.as_str()).to_string()
}

impl Store for PgStore {
    fn create(&self, row: &SessionRow) -> Result<(), StoreError> {
        let row = row.clone();
        self.run(Duration::ZERO, move |c| async move {
            let r = insert(&c.client, &row).await;
            (c, r)
        })
    }

    fn commit(&self, write: &SessionWrite<'_>) -> Result<(), StoreError> {
        let params = sql::WriteParams::new(write)?;
        let id = written_id(write);
        self.run(Duration::ZERO, move |c| async move {
            trips(1);
            let r = match params.run(&c.client, &c.statements).await {
                Ok(rows) => sql::check_written(&rows, &id),
                Err(e) => Err(err(e)),
            };
            (c, r)
        })
    }

    fn set_effective_ctx(&self, sessions: &[(String, u64)]) -> Result<(), StoreError> {
        if sessions.is_empty() {
            return Ok(());
        }
        let sessions = sessions.to_vec();
        self.run(Duration::ZERO, move |mut c| async move {
            let r = set_effective_ctx_on(&mut c, &sessions).await;
            (c, r)
        })
    }

    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        let lock_wait = self.lock_wait;
        let statement_timeout = self.shared.limits.statement_timeout;
        self.run(lock_wait, move |mut c| async move {
            let r = delete_on(&mut c, &id, lock_wait, statement_timeout).await;
            (c, r)
        })
    }

    fn sessions(&self) -> Result<Vec<(SessionRow, usize)>, StoreError> {
        self.run(Duration::ZERO, |c| async move {
            trips(2);
            let r = match c
                .client
                .query(
                    &format!("SELECT {ROW_COLUMNS} FROM sessions ORDER BY created_at, id"),
                    &[],
                )
                .await
            {
                Ok(rows) => rows.iter().map(row_and_len).collect(),
                Err(e) => Err(err(e)),
            };
            (c, r)
        })
    }

    fn load(&self, id: &str) -> Result<Option<StoredSession>, StoreError> {
        let id = id.to_string();
        self.run(Duration::ZERO, move |c| async move {
            let r = load_on(&c, &id).await;
            (c, r)
        })
    }

    fn row(&self, id: &str) -> Result<Option<(SessionRow, usize)>, StoreError> {
        let id = id.to_string();
        self.run(Duration::ZERO, move |c| async move {
            trips(2);
            let r = match c
                .client
                .query_opt(
                    &format!("SELECT {ROW_COLUMNS} FROM sessions WHERE id = $1"),
                    &[&id],
                )
                .await
            {
                Ok(found) => found.as_ref().map(row_and_len).transpose(),
                Err(e) => Err(err(e)),
            };
            (c, r)
        })
    }

    fn transcript(&self, id: &str, from: u64, limit: u64) -> Result<Vec<TranscriptRow>, StoreError> {
        let id = id.to_string();
        self.run(Duration::ZERO, move |c| async move {
            trips(2);
            let rows = c
                .client
                .query(
                    "SELECT seq, turn, message, tokens FROM transcript WHERE session_id = $1 AND seq >= $2 \
                     ORDER BY seq LIMIT $3",
                    &[&id, &(from as i64), &(limit.min(i64::MAX as u64) as i64)],
                )
                .await;
            let r = match rows {
                Ok(rows) => rows
                    .iter()
                    .map(|r| {
                        Ok(TranscriptRow {
                            seq: col::<i64>(r, 0)? as u64,
                            turn: col::<i64>(r, 1)? as u64,
                            message: col(r, 2)?,
                            tokens: TokenCounts(col(r, 3)?),
                        })
                    })
                    .collect(),
                Err(e) => Err(err(e)),
            };
            (c, r)
        })
    }

    fn check_writable(&self) -> Result<(), StoreError> {
        self.run(Duration::ZERO, |c| async move {
            trips(2);
            let r = match c.client.query_one("SHOW transaction_read_only", &[]).await {
                Ok(row) => match col::<String>(&row, 0) {
                    Ok(on) if on == "on" => Err(StoreError::new("the database is read-only (a standby?)")),
                    Ok(_) => Ok(()),
                    Err(e) => Err(e),
                },
                Err(e) => Err(err(e)),
            };
            (c, r)
        })
    }

    fn summary(&self, key: &str) -> Result<Option<String>, StoreError> {
        let key = key.to_string();
        self.run(Duration::ZERO, move |c| async move {
            trips(2);
            let r = match c
                .client
                .query_opt("SELECT summary FROM summaries WHERE key = $1", &[&key])
                .await
            {
                Ok(row) => row.map(|r| col(&r, 0)).transpose(),
                Err(e) => Err(err(e)),
            };
            (c, r)
        })
    }

    fn put_summary(&self, key: &str, summary: &str) -> Result<(), StoreError> {
        let (key, summary) = (key.to_string(), summary.to_string());
        self.run(Duration::ZERO, move |c| async move {
            let now = crate::clock::now_ms() as i64;
            trips(2);
            let r = c
                .client
                .execute(
                    "INSERT INTO summaries (key, summary, created_at) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING",
                    &[&key, &summary, &now],
                )
                .await
                .map(drop)
                .map_err(err);
            (c, r)
        })
    }

    fn shared(&self) -> bool {
        true
    }

    fn lock(&self, id: &str, held: Option<&HostCopy>) -> Result<Locked, StoreError> {
        self.lock_session(id, held)
    }

    fn create_limited(&self, row: &SessionRow, max_users: u64) -> Result<Result<(), u64>, StoreError> {
        let row = row.clone();
        self.run(Duration::ZERO, move |mut c| async move {
            let r = create_limited_on(&mut c, &row, max_users).await;
            (c, r)
        })
    }

    /// Bounded by a few statements' time: a pass deletes many sessions.
    fn reap(&self, cutoff_ms: u64) -> Result<Vec<String>, StoreError> {
        let extra = self.shared.limits.statement_timeout * 3;
        self.run(extra, move |mut c| async move {
            let r = reap_on(&mut c, cutoff_ms).await;
            (c, r)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::hide_password as shown;

    #[test]
    fn a_url_is_shown_without_its_password() {
        assert_eq!(shown("postgres://u:pw@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(shown("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(shown("postgres://h/db"), "postgres://h/db");
    }
}
