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
//! The client is the synchronous `postgres` crate with an `r2d2` pool: the [`Store`] trait
//! is synchronous and the service calls it on blocking threads. Every wait for the
//! database is bounded (`bounded`, `[store]` in docs/configuration.md).

mod bounded;
mod lock;
mod schema;
mod sql;

use std::sync::Arc;
use std::time::Duration;

use history_engine::StoreLimits;
use postgres::{GenericClient, SimpleQueryRow};

use super::{
    decode_working, HostCopy, Locked, SessionRow, SessionWrite, Store, StoreError, StoredSession,
    TokenCounts, TranscriptRow,
};
use bounded::{Manager, Quiet, Shared};
use lock::{lock_statements, PgLock, LOCK_STATEMENTS};
use schema::{check_version, migrate};
pub use sql::round_trips;
use sql::{batch, lit, num, read_statements, session_of, trips, write_statement, ROW_COLUMNS, SESSION_KEY};

type Pool = r2d2::Pool<Manager>;
type Connection = r2d2::PooledConnection<Manager>;

/// The advisory lock key of session creation as a whole, so two hosts cannot both take
/// the last place under `max_users` (a session's key is a hash of its id).
const CREATE_LOCK: i64 = 0x6869_7374_6372_6561;

/// The largest pool of one host. Session operations hold one connection each for their
/// whole length; the service runs at most [`PgStore::MAX_OPERATIONS`] at once, and the
/// rest of the pool serves listings, transcript pages, health and the reaper.
const POOL_SIZE: u32 = PgStore::MAX_OPERATIONS as u32 + 4;

/// The PostgreSQL store.
pub struct PgStore {
    /// Always `Some` but while dropping.
    pool: Option<Pool>,
    lock_wait: Duration,
    shared: Arc<Shared>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Closing the synchronous client's connections blocks, which must not happen on an
        // async thread (the service is dropped on one): close them on a thread of their own.
        if let Some(pool) = self.pool.take() {
            let _ = std::thread::spawn(move || drop(pool)).join();
        }
    }
}

/// A PostgreSQL error as a store error: no answer from the server (a connection lost or
/// refused, the server shutting down) is [`StoreError::unavailable`].
fn err(e: postgres::Error) -> StoreError {
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

fn pool_err(e: r2d2::Error) -> StoreError {
    StoreError::unavailable(format!("cannot reach the database: {e}"))
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
        let config: postgres::Config = url
            .parse()
            .map_err(|e| StoreError::new(format!("bad store URL {}: {e}", hide_password(url))))?;
        let shared = Shared::new(config, limits);
        let unreachable =
            |e: &dyn std::fmt::Display| StoreError::unavailable(format!("{}: {e}", hide_password(url)));
        // The schema first, on a connection of its own: the pool's connections prepare
        // their statements against it as they open. A migration may take longer than a
        // statement: no statement_timeout on it.
        let mut first = shared.connect(false).map_err(|e| unreachable(&e))?;
        first
            .client
            .batch_execute("SET statement_timeout = 0")
            .map_err(err)?;
        check_version(&mut first.client)?;
        migrate(&mut first.client)?;
        drop(first);
        let pool = r2d2::Pool::builder()
            .max_size(POOL_SIZE)
            .min_idle(Some(1))
            // No check on every checkout: it would cost a round trip per turn. A pooled
            // connection the database closed meanwhile fails its first use, is dropped
            // (the manager's `has_broken` when it comes back), and a session's lock is
            // asked again on a fresh one (`PgStore::lock`).
            .test_on_check_out(false)
            .connection_timeout(limits.connect_timeout)
            .error_handler(Box::new(Quiet))
            .build(Manager(shared.clone()))
            .map_err(|e| unreachable(&e))?;
        Ok(PgStore {
            pool: Some(pool),
            lock_wait,
            shared,
        })
    }

    /// A pooled connection, at once a 503 while the database is unreachable and not due
    /// for another attempt (`bounded`).
    fn connection(&self) -> Result<Connection, StoreError> {
        self.shared.may_try()?;
        let pool = self
            .pool
            .as_ref()
            .expect("the pool is there until the store is dropped");
        // Connections from before an outage, or that the database closed, are dropped.
        for _ in 0..=POOL_SIZE {
            let c = pool.get().map_err(|e| {
                let e = pool_err(e);
                self.shared.failed(&e);
                e
            })?;
            if self.shared.usable(&c) {
                return Ok(c);
            }
            c.poison();
        }
        let e = StoreError::unavailable("no usable connection in the pool");
        self.shared.failed(&e);
        Err(e)
    }

    /// `f` on a pooled connection, waiting at most one statement's bound (and `extra`).
    fn run<T: Send + 'static>(
        &self,
        extra: Duration,
        f: impl FnOnce(&mut postgres::Client) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let c = self.connection()?;
        let (_c, result) = self
            .shared
            .on(c, self.shared.limits.statement_timeout + extra, f)?;
        result
    }
}

fn row_of(r: &postgres::Row) -> (SessionRow, String) {
    (
        SessionRow {
            id: r.get(0),
            model: r.get(1),
            effective_ctx: r.get::<_, i64>(2) as u64,
            turn: r.get::<_, i64>(3) as u64,
            transcript_len: r.get::<_, i64>(4) as u64,
            cleared_at: r.get::<_, i64>(5) as u64,
            expiration_override: r.get(6),
            created_at: r.get::<_, i64>(7) as u64,
            last_active: r.get::<_, i64>(8) as u64,
            next_copy: r.get::<_, i64>(9) as u64,
            version: r.get::<_, i64>(11) as u64,
        },
        r.get(10),
    )
}

fn insert(c: &mut impl GenericClient, row: &SessionRow) -> Result<(), StoreError> {
    trips(2);
    c.execute(
        &format!(
            "INSERT INTO sessions ({ROW_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, '', $11)"
        ),
        &[
            &row.id,
            &row.model,
            &(row.effective_ctx as i64),
            &(row.turn as i64),
            &(row.transcript_len as i64),
            &(row.cleared_at as i64),
            &row.expiration_override,
            &(row.created_at as i64),
            &(row.last_active as i64),
            &(row.next_copy as i64),
            &(row.version as i64),
        ],
    )
    .map_err(err)?;
    Ok(())
}

/// Whether the write answered at `answers[at]` happened: `history_write` answers 1 when
/// written and 0 when refused (its version does not follow the stored one, or the session
/// is gone). `id` is the session's, for the message.
fn check_written(answers: &[Vec<SimpleQueryRow>], at: usize, id: &str) -> Result<(), StoreError> {
    let written = answers
        .get(at)
        .and_then(|rows| rows.first())
        .map(|r| num(r, 0))
        .transpose()?;
    if written != Some(1) {
        return Err(StoreError::new(format!(
            "session {id} changed on another host, or is gone: nothing written"
        )));
    }
    Ok(())
}

fn written_id(write: &SessionWrite<'_>) -> String {
    write.row.map_or("?", |r| r.id.as_str()).to_string()
}

/// A session with its working and sent histories, read in one snapshot and one round trip.
fn load_on(c: &mut postgres::Client, id: &str) -> Result<Option<StoredSession>, StoreError> {
    let sql = format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; {}; COMMIT",
        read_statements(id, None)
    );
    let answers = batch(c, &sql).map_err(err)?;
    // BEGIN and COMMIT answer no rows: the reads are in between.
    session_of(
        id,
        answers
            .get(1..answers.len().saturating_sub(1))
            .unwrap_or_default(),
        None,
    )
}

impl Store for PgStore {
    fn create(&self, row: &SessionRow) -> Result<(), StoreError> {
        let row = row.clone();
        self.run(Duration::ZERO, move |c| insert(c, &row))
    }

    fn commit(&self, write: &SessionWrite<'_>) -> Result<(), StoreError> {
        let statement = write_statement(write)?;
        let id = written_id(write);
        self.run(Duration::ZERO, move |c| {
            let answers = batch(c, &statement).map_err(err)?;
            check_written(&answers, 0, &id)
        })
    }

    fn set_effective_ctx(&self, sessions: &[(String, u64)]) -> Result<(), StoreError> {
        if sessions.is_empty() {
            return Ok(());
        }
        let sessions = sessions.to_vec();
        self.run(Duration::ZERO, move |c| {
            let mut tx = c.transaction().map_err(err)?;
            trips(2 + 2 * sessions.len() as u64);
            for (id, effective_ctx) in &sessions {
                tx.execute(
                    "UPDATE sessions SET effective_ctx = $2 WHERE id = $1",
                    &[id, &(*effective_ctx as i64)],
                )
                .map_err(err)?;
            }
            tx.commit().map_err(err)
        })
    }

    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        let lock_wait = self.lock_wait;
        let statement_timeout = self.shared.limits.statement_timeout;
        self.run(lock_wait, move |c| {
            let mut tx = c.transaction().map_err(err)?;
            trips(11);
            // Not while an operation on the session runs on another host.
            tx.batch_execute(&format!(
                "SET LOCAL statement_timeout = {}; SET LOCAL lock_timeout = {}",
                (lock_wait + statement_timeout).as_millis(),
                lock_wait.as_millis().max(1)
            ))
            .map_err(err)?;
            tx.execute(&format!("SELECT pg_advisory_xact_lock({SESSION_KEY})"), &[&id])
                .map_err(err)?;
            let deleted = tx
                .execute("DELETE FROM sessions WHERE id = $1", &[&id])
                .map_err(err)?;
            tx.execute("DELETE FROM transcript WHERE session_id = $1", &[&id])
                .map_err(err)?;
            tx.execute("DELETE FROM working_copies WHERE session_id = $1", &[&id])
                .map_err(err)?;
            tx.commit().map_err(err)?;
            Ok(deleted == 1)
        })
    }

    fn sessions(&self) -> Result<Vec<(SessionRow, usize)>, StoreError> {
        self.run(Duration::ZERO, |c| {
            trips(2);
            let rows = c
                .query(
                    &format!("SELECT {ROW_COLUMNS} FROM sessions ORDER BY created_at, id"),
                    &[],
                )
                .map_err(err)?;
            rows.iter()
                .map(|r| {
                    let (row, working) = row_of(r);
                    Ok((row, decode_working(&working)?.len()))
                })
                .collect()
        })
    }

    fn load(&self, id: &str) -> Result<Option<StoredSession>, StoreError> {
        let id = id.to_string();
        self.run(Duration::ZERO, move |c| load_on(c, &id))
    }

    fn row(&self, id: &str) -> Result<Option<(SessionRow, usize)>, StoreError> {
        let id = id.to_string();
        self.run(Duration::ZERO, move |c| {
            trips(2);
            let found = c
                .query_opt(
                    &format!("SELECT {ROW_COLUMNS} FROM sessions WHERE id = $1"),
                    &[&id],
                )
                .map_err(err)?;
            found
                .map(|r| {
                    let (row, working) = row_of(&r);
                    Ok((row, decode_working(&working)?.len()))
                })
                .transpose()
        })
    }

    fn transcript(&self, id: &str, from: u64, limit: u64) -> Result<Vec<TranscriptRow>, StoreError> {
        let id = id.to_string();
        self.run(Duration::ZERO, move |c| {
            trips(2);
            let rows = c
                .query(
                    "SELECT seq, turn, message, tokens FROM transcript WHERE session_id = $1 AND seq >= $2 \
                     ORDER BY seq LIMIT $3",
                    &[&id, &(from as i64), &(limit.min(i64::MAX as u64) as i64)],
                )
                .map_err(err)?;
            Ok(rows
                .iter()
                .map(|r| TranscriptRow {
                    seq: r.get::<_, i64>(0) as u64,
                    turn: r.get::<_, i64>(1) as u64,
                    message: r.get(2),
                    tokens: TokenCounts(r.get(3)),
                })
                .collect())
        })
    }

    fn check_writable(&self) -> Result<(), StoreError> {
        self.run(Duration::ZERO, |c| {
            trips(2);
            let read_only: String = c
                .query_one("SHOW transaction_read_only", &[])
                .map_err(err)?
                .get(0);
            if read_only == "on" {
                return Err(StoreError::new("the database is read-only (a standby?)"));
            }
            Ok(())
        })
    }

    fn summary(&self, key: &str) -> Result<Option<String>, StoreError> {
        let key = key.to_string();
        self.run(Duration::ZERO, move |c| {
            trips(2);
            let row = c
                .query_opt("SELECT summary FROM summaries WHERE key = $1", &[&key])
                .map_err(err)?;
            Ok(row.map(|r| r.get(0)))
        })
    }

    fn put_summary(&self, key: &str, summary: &str) -> Result<(), StoreError> {
        let (key, summary) = (key.to_string(), summary.to_string());
        self.run(Duration::ZERO, move |c| {
            let now = crate::clock::now_ms() as i64;
            trips(2);
            c.execute(
                "INSERT INTO summaries (key, summary, created_at) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING",
                &[&key, &summary, &now],
            )
            .map_err(err)?;
            Ok(())
        })
    }

    fn shared(&self) -> bool {
        true
    }

    /// The lock, the session's version and — when it is not the version this host knows —
    /// the session itself, in one round trip: the statements after the lock's each see
    /// what was committed before it was taken (READ COMMITTED takes a snapshot per
    /// statement). A connection found closed (the database restarted since it was pooled)
    /// is dropped and the lock asked once more on a fresh one.
    fn lock(&self, id: &str, held: Option<&HostCopy>) -> Result<Locked, StoreError> {
        let statement_timeout = self.shared.limits.statement_timeout;
        let sql = format!(
            "{}; EXECUTE history_version({}); {}",
            lock_statements(id, self.lock_wait, statement_timeout),
            lit(id),
            read_statements(id, held),
        );
        let limit = self.lock_wait + statement_timeout;
        let mut attempt = 0;
        let (c, answers) = loop {
            let c = self.connection()?;
            let sql = sql.clone();
            let (c, result) = self.shared.on(c, limit, move |client| Ok(batch(client, &sql)))?;
            match result? {
                Ok(answers) => break (c, answers),
                Err(e) if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                    return Ok(Locked::Busy)
                }
                Err(e) if e.is_closed() && attempt == 0 => {
                    c.poison();
                    attempt += 1
                }
                Err(e) => {
                    let e = err(e);
                    self.shared.failed(&e);
                    if e.unavailable {
                        c.poison();
                    }
                    return Err(e);
                }
            }
        };
        // The lock's statements, the version, then the session's reads.
        let version = answers
            .get(LOCK_STATEMENTS)
            .and_then(|rows| rows.first())
            .map(|r| num(r, 0))
            .transpose()?;
        let read = match answers.get(LOCK_STATEMENTS + 1..) {
            Some(reads) => session_of(id, reads, held)?,
            None => return Err(StoreError::new("the store answered too few results")),
        };
        Ok(Locked::Held(Box::new(PgLock {
            connection: Some(c),
            shared: self.shared.clone(),
            id: id.to_string(),
            version,
            read,
            released: false,
            lock_wait: self.lock_wait,
        })))
    }

    fn create_limited(&self, row: &SessionRow, max_users: u64) -> Result<Result<(), u64>, StoreError> {
        let row = row.clone();
        self.run(Duration::ZERO, move |c| {
            let mut tx = c.transaction().map_err(err)?;
            // One creation at a time across hosts, so two cannot both take the last place.
            trips(6);
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK])
                .map_err(err)?;
            let live: i64 = tx
                .query_one("SELECT count(*) FROM sessions", &[])
                .map_err(err)?
                .get(0);
            if live as u64 >= max_users {
                return Ok(Err(live as u64));
            }
            insert(&mut tx, &row)?;
            tx.commit().map_err(err)?;
            Ok(Ok(()))
        })
    }

    /// Bounded by a few statements' time: a pass deletes many sessions.
    fn reap(&self, cutoff_ms: u64) -> Result<Vec<String>, StoreError> {
        let extra = self.shared.limits.statement_timeout * 3;
        self.run(extra, move |c| reap_on(c, cutoff_ms))
    }
}

/// One pass of the idle reaper. Rows another host is reaping are skipped (SKIP LOCKED),
/// and so are sessions whose operation is running somewhere (their advisory lock is held).
fn reap_on(c: &mut postgres::Client, cutoff_ms: u64) -> Result<Vec<String>, StoreError> {
    let mut tx = c.transaction().map_err(err)?;
    let rows = tx
        .query(
            "SELECT id FROM sessions WHERE last_active < $1 FOR UPDATE SKIP LOCKED",
            &[&(cutoff_ms.min(i64::MAX as u64) as i64)],
        )
        .map_err(err)?;
    trips(4);
    let mut reaped = Vec::new();
    for r in rows {
        trips(2);
        let id: String = r.get(0);
        let free: bool = tx
            .query_one(
                &format!("SELECT pg_try_advisory_xact_lock({SESSION_KEY})"),
                &[&id],
            )
            .map_err(err)?
            .get(0);
        if !free {
            continue;
        }
        trips(6);
        tx.execute("DELETE FROM sessions WHERE id = $1", &[&id])
            .map_err(err)?;
        tx.execute("DELETE FROM transcript WHERE session_id = $1", &[&id])
            .map_err(err)?;
        tx.execute("DELETE FROM working_copies WHERE session_id = $1", &[&id])
            .map_err(err)?;
        reaped.push(id);
    }
    tx.commit().map_err(err)?;
    Ok(reaped)
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
