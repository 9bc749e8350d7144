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
//! is synchronous and the service calls it on blocking threads.

mod schema;
mod sql;

use std::time::Duration;

use postgres::{GenericClient, NoTls, SimpleQueryRow};
use r2d2_postgres::{r2d2, PostgresConnectionManager};

use super::{
    decode_working, HostCopy, Locked, SessionLock, SessionRow, SessionWrite, Store, StoreError,
    StoredSession, TokenCounts, TranscriptRow,
};
use schema::{check_version, migrate};
pub use sql::round_trips;
use sql::{
    batch, lit, num, read_statements, session_of, trips, write_statement, PrepareStatements, ROW_COLUMNS,
    SESSION_KEY,
};

type Manager = PostgresConnectionManager<NoTls>;
type Pool = r2d2::Pool<Manager>;
type Connection = r2d2::PooledConnection<Manager>;

/// The advisory lock key of session creation as a whole, so two hosts cannot both take
/// the last place under `max_users` (a session's key is a hash of its id).
const CREATE_LOCK: i64 = 0x6869_7374_6372_6561;

/// How long taking a connection from the pool may wait before the database counts as
/// unreachable (a 503).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest pool of one host. Session operations hold one connection each for their
/// whole length; the service runs at most [`PgStore::MAX_OPERATIONS`] at once, and the
/// rest of the pool serves listings, transcript pages, health and the reaper.
const POOL_SIZE: u32 = PgStore::MAX_OPERATIONS as u32 + 4;

/// The PostgreSQL store.
pub struct PgStore {
    /// Always `Some` but while dropping.
    pool: Option<Pool>,
    lock_wait: Duration,
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
        // connection_exception, operator_intervention (shutdown, cannot connect now)
        || code
            .as_ref()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57P"));
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
    /// `lock_wait` is how long an operation waits for a session another host holds.
    pub fn open(url: &str, lock_wait: Duration) -> Result<PgStore, StoreError> {
        let mut config: postgres::Config = url
            .parse()
            .map_err(|e| StoreError::new(format!("bad store URL {}: {e}", hide_password(url))))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let unreachable = |e: &dyn std::fmt::Display| {
            StoreError::unavailable(format!("cannot connect to {}: {e}", hide_password(url)))
        };
        // The schema first, on a connection of its own: the pool's connections prepare
        // their statements against it as they open.
        let mut first = config.connect(NoTls).map_err(|e| unreachable(&e))?;
        check_version(&mut first)?;
        migrate(&mut first)?;
        drop(first);
        let pool = r2d2::Pool::builder()
            .max_size(POOL_SIZE)
            .min_idle(Some(1))
            // No check on every checkout: it would cost a round trip per turn. A pooled
            // connection the database closed meanwhile fails its first use, is dropped
            // (r2d2 asks `is_closed` when it comes back), and a session's lock is asked
            // again on a fresh one (`PgStore::lock`).
            .test_on_check_out(false)
            .connection_timeout(CONNECT_TIMEOUT)
            .connection_customizer(Box::new(PrepareStatements))
            .build(PostgresConnectionManager::new(config, NoTls))
            .map_err(|e| unreachable(&e))?;
        Ok(PgStore {
            pool: Some(pool),
            lock_wait,
        })
    }

    fn connection(&self) -> Result<Connection, StoreError> {
        self.pool
            .as_ref()
            .expect("the pool is there until the store is dropped")
            .get()
            .map_err(pool_err)
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
/// is gone).
fn check_written(
    answers: &[Vec<SimpleQueryRow>],
    at: usize,
    write: &SessionWrite<'_>,
) -> Result<(), StoreError> {
    let written = answers
        .get(at)
        .and_then(|rows| rows.first())
        .map(|r| num(r, 0))
        .transpose()?;
    if written != Some(1) {
        return Err(StoreError::new(format!(
            "session {} changed on another host, or is gone: nothing written",
            write.row.map_or("?", |r| r.id.as_str())
        )));
    }
    Ok(())
}

/// One session write in one transaction and one round trip; refused unless `row.version`
/// follows the stored version.
fn commit_on(c: &mut postgres::Client, write: &SessionWrite<'_>) -> Result<(), StoreError> {
    let statement = write_statement(write)?;
    let answers = batch(c, &statement).map_err(err)?;
    check_written(&answers, 0, write)
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

/// A session's lock: a session-level advisory lock held on one pooled connection.
struct PgLock {
    connection: Connection,
    id: String,
    version: Option<u64>,
    /// The session as read with the lock, when its version was not the one the host knew.
    read: Option<StoredSession>,
    /// Whether the lock was given back already (a commit gives it back in its round trip).
    released: bool,
    lock_wait: Duration,
}

impl SessionLock for PgLock {
    fn version(&self) -> Option<u64> {
        self.version
    }

    fn load(&mut self) -> Result<Option<StoredSession>, StoreError> {
        match self.read.take() {
            Some(read) => Ok(Some(read)),
            None => load_on(&mut self.connection, &self.id),
        }
    }

    /// The write, its commit and the lock's release in one round trip: the lock is given
    /// back after the commit (a later COMMIT statement in the same message), so the next
    /// host to take it reads this write. A second commit under the same lock takes it again
    /// first.
    fn commit(&mut self, write: &SessionWrite<'_>) -> Result<(), StoreError> {
        if write.row.is_some_and(|r| r.id != self.id) {
            return Err(StoreError::new("a session lock commits its own session only"));
        }
        let id = lit(&self.id);
        let relock = if self.released {
            format!(
                "SET lock_timeout = {}; EXECUTE history_lock({id}); RESET lock_timeout; ",
                self.lock_wait.as_millis().max(1)
            )
        } else {
            String::new()
        };
        let sql = format!(
            "{relock}BEGIN; {}; COMMIT; EXECUTE history_unlock({id})",
            write_statement(write)?
        );
        match batch(&mut self.connection, &sql) {
            Ok(answers) => {
                self.released = true;
                // The write's answer is the one after BEGIN's.
                let skip = if relock.is_empty() { 1 } else { 4 };
                check_written(&answers, skip, write)
            }
            Err(e) => {
                // The transaction is aborted (or the connection lost, and the server has
                // released the lock): roll back and give the lock back.
                let _ = batch(
                    &mut self.connection,
                    &format!("ROLLBACK; EXECUTE history_unlock({id})"),
                );
                self.released = true;
                Err(err(e))
            }
        }
    }
}

impl Drop for PgLock {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // On a lost connection the server has released the lock already.
        let _ = batch(
            &mut self.connection,
            &format!("EXECUTE history_unlock({})", lit(&self.id)),
        );
    }
}

impl Store for PgStore {
    fn create(&self, row: &SessionRow) -> Result<(), StoreError> {
        insert(&mut *self.connection()?, row)
    }

    fn commit(&self, write: &SessionWrite<'_>) -> Result<(), StoreError> {
        commit_on(&mut *self.connection()?, write)
    }

    fn set_effective_ctx(&self, sessions: &[(String, u64)]) -> Result<(), StoreError> {
        if sessions.is_empty() {
            return Ok(());
        }
        let mut c = self.connection()?;
        let mut tx = c.transaction().map_err(err)?;
        trips(2 + 2 * sessions.len() as u64);
        for (id, effective_ctx) in sessions {
            tx.execute(
                "UPDATE sessions SET effective_ctx = $2 WHERE id = $1",
                &[id, &(*effective_ctx as i64)],
            )
            .map_err(err)?;
        }
        tx.commit().map_err(err)
    }

    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let mut c = self.connection()?;
        let mut tx = c.transaction().map_err(err)?;
        trips(11);
        // Not while an operation on the session runs on another host.
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = {}",
            self.lock_wait.as_millis().max(1)
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
    }

    fn sessions(&self) -> Result<Vec<(SessionRow, usize)>, StoreError> {
        trips(2);
        let rows = self
            .connection()?
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
    }

    fn load(&self, id: &str) -> Result<Option<StoredSession>, StoreError> {
        load_on(&mut *self.connection()?, id)
    }

    fn row(&self, id: &str) -> Result<Option<(SessionRow, usize)>, StoreError> {
        trips(2);
        let found = self
            .connection()?
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
    }

    fn transcript(&self, id: &str, from: u64, limit: u64) -> Result<Vec<TranscriptRow>, StoreError> {
        trips(2);
        let rows = self
            .connection()?
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
    }

    fn check_writable(&self) -> Result<(), StoreError> {
        let mut c = self.connection()?;
        trips(2);
        let read_only: String = c
            .query_one("SHOW transaction_read_only", &[])
            .map_err(err)?
            .get(0);
        if read_only == "on" {
            return Err(StoreError::new("the database is read-only (a standby?)"));
        }
        Ok(())
    }

    fn summary(&self, key: &str) -> Result<Option<String>, StoreError> {
        let mut c = self.connection()?;
        trips(2);
        let row = c
            .query_opt("SELECT summary FROM summaries WHERE key = $1", &[&key])
            .map_err(err)?;
        Ok(row.map(|r| r.get(0)))
    }

    fn put_summary(&self, key: &str, summary: &str) -> Result<(), StoreError> {
        let mut c = self.connection()?;
        let now = crate::clock::now_ms() as i64;
        trips(2);
        c.execute(
            "INSERT INTO summaries (key, summary, created_at) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING",
            &[&key, &summary, &now],
        )
        .map_err(err)?;
        Ok(())
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
        let sql = format!(
            "SET lock_timeout = {}; EXECUTE history_lock({}); RESET lock_timeout; \
             EXECUTE history_version({}); {}",
            self.lock_wait.as_millis().max(1),
            lit(id),
            lit(id),
            read_statements(id, held),
        );
        let mut attempt = 0;
        let (c, answers) = loop {
            let mut c = self.connection()?;
            match batch(&mut c, &sql) {
                Ok(answers) => break (c, answers),
                Err(e) if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                    return Ok(Locked::Busy)
                }
                Err(e) if e.is_closed() && attempt == 0 => attempt += 1,
                Err(e) => return Err(err(e)),
            }
        };
        // SET, the lock, RESET, the version, then the session's reads.
        let version = answers
            .get(3)
            .and_then(|rows| rows.first())
            .map(|r| num(r, 0))
            .transpose()?;
        let read = match answers.get(4..) {
            Some(reads) => session_of(id, reads, held)?,
            None => return Err(StoreError::new("the store answered too few results")),
        };
        Ok(Locked::Held(Box::new(PgLock {
            connection: c,
            id: id.to_string(),
            version,
            read,
            released: false,
            lock_wait: self.lock_wait,
        })))
    }

    fn create_limited(&self, row: &SessionRow, max_users: u64) -> Result<Result<(), u64>, StoreError> {
        let mut c = self.connection()?;
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
        insert(&mut tx, row)?;
        tx.commit().map_err(err)?;
        Ok(Ok(()))
    }

    fn reap(&self, cutoff_ms: u64) -> Result<Vec<String>, StoreError> {
        let mut c = self.connection()?;
        let mut tx = c.transaction().map_err(err)?;
        // Rows another host is reaping are skipped (SKIP LOCKED), and so are sessions
        // whose operation is running somewhere (their advisory lock is held).
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
