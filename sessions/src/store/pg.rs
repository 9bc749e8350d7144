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

use std::time::Duration;

use postgres::{GenericClient, NoTls};
use r2d2_postgres::{r2d2, PostgresConnectionManager};

use super::{
    decode_working, encode_working, Locked, SessionLock, SessionRow, SessionWrite, Store, StoreError,
    StoredSession, TranscriptRow, WorkingRef,
};

type Manager = PostgresConnectionManager<NoTls>;
type Pool = r2d2::Pool<Manager>;
type Connection = r2d2::PooledConnection<Manager>;

/// The schema, one entry per version; a host applies the ones the database lacks.
/// 1: sessions, transcripts, working copies; 2: `summaries`, the summarizer's answers.
const MIGRATIONS: &[&str] = &[
    "
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    effective_ctx BIGINT NOT NULL,
    turn BIGINT NOT NULL,
    transcript_len BIGINT NOT NULL,
    cleared_at BIGINT NOT NULL,
    expiration_override TEXT,
    created_at BIGINT NOT NULL,
    last_active BIGINT NOT NULL,
    next_copy BIGINT NOT NULL,
    working TEXT NOT NULL,
    version BIGINT NOT NULL
);
CREATE INDEX sessions_last_active ON sessions (last_active);
CREATE TABLE transcript (
    session_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    turn BIGINT NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE working_copies (
    session_id TEXT NOT NULL,
    key BIGINT NOT NULL,
    seq BIGINT,
    message TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
);
",
    "
CREATE TABLE summaries (
    key TEXT PRIMARY KEY,
    summary TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
",
];

/// Advisory lock keys of the store as a whole (a session's key is a hash of its id).
const MIGRATION_LOCK: i64 = 0x6869_7374_6d69_6772;
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

/// The advisory lock key of session `id`, computed by the server.
const SESSION_KEY: &str = "hashtextextended('history-session:' || $1, 0)";

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
        let config: postgres::Config = url
            .parse()
            .map_err(|e| StoreError::new(format!("bad store URL {}: {e}", hide_password(url))))?;
        let pool = r2d2::Pool::builder()
            .max_size(POOL_SIZE)
            .min_idle(Some(1))
            .connection_timeout(CONNECT_TIMEOUT)
            .build(PostgresConnectionManager::new(config, NoTls))
            .map_err(|e| StoreError::unavailable(format!("cannot connect to {}: {e}", hide_password(url))))?;
        let store = PgStore {
            pool: Some(pool),
            lock_wait,
        };
        store.migrate()?;
        Ok(store)
    }

    fn connection(&self) -> Result<Connection, StoreError> {
        self.pool
            .as_ref()
            .expect("the pool is there until the store is dropped")
            .get()
            .map_err(pool_err)
    }

    /// Applies the migrations the database lacks, one host at a time.
    fn migrate(&self) -> Result<(), StoreError> {
        let mut c = self.connection()?;
        c.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .map_err(err)?;
        let result = (|| {
            c.batch_execute(
                "CREATE TABLE IF NOT EXISTS history_schema (version BIGINT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            )
            .map_err(err)?;
            let current: i64 = c
                .query_one("SELECT COALESCE(max(version), 0) FROM history_schema", &[])
                .map_err(err)?
                .get(0);
            let known = MIGRATIONS.len() as i64;
            if current > known {
                return Err(StoreError::new(format!(
                    "the database was migrated by a newer history-host (schema {current}, this one knows {known})"
                )));
            }
            for (index, migration) in MIGRATIONS.iter().enumerate().skip(current as usize) {
                let version = index as i64 + 1;
                let mut tx = c.transaction().map_err(err)?;
                tx.batch_execute(migration).map_err(err)?;
                tx.execute("INSERT INTO history_schema (version) VALUES ($1)", &[&version])
                    .map_err(err)?;
                tx.commit().map_err(err)?;
                tracing::info!("store: schema migrated to version {version}");
            }
            Ok(())
        })();
        c.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .map_err(err)?;
        result
    }
}

const ROW_COLUMNS: &str = "id, model, effective_ctx, turn, transcript_len, cleared_at, \
     expiration_override, created_at, last_active, next_copy, working, version";

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

/// One session write in one transaction; refused unless `row.version` follows the stored
/// version.
fn commit_on(c: &mut impl GenericClient, write: &SessionWrite<'_>) -> Result<(), StoreError> {
    let Some(row) = write.row else {
        return Err(StoreError::new("a session write needs its row"));
    };
    let mut tx = c.transaction().map_err(err)?;
    let updated = tx
        .execute(
            "UPDATE sessions SET model = $2, effective_ctx = $3, turn = $4, transcript_len = $5, \
             cleared_at = $6, expiration_override = $7, last_active = $8, next_copy = $9, working = $10, \
             version = $11 WHERE id = $1 AND version = $12",
            &[
                &row.id,
                &row.model,
                &(row.effective_ctx as i64),
                &(row.turn as i64),
                &(row.transcript_len as i64),
                &(row.cleared_at as i64),
                &row.expiration_override,
                &(row.last_active as i64),
                &(row.next_copy as i64),
                &encode_working(write.working),
                &(row.version as i64),
                &(row.version as i64 - 1),
            ],
        )
        .map_err(err)?;
    if updated != 1 {
        return Err(StoreError::new(format!(
            "session {} changed on another host, or is gone: nothing written",
            row.id
        )));
    }
    let statement = tx
        .prepare("INSERT INTO transcript (session_id, seq, turn, message) VALUES ($1, $2, $3, $4)")
        .map_err(err)?;
    for t in write.transcript {
        tx.execute(
            &statement,
            &[&row.id, &(t.seq as i64), &(t.turn as i64), &t.message],
        )
        .map_err(err)?;
    }
    let statement = tx
        .prepare("INSERT INTO working_copies (session_id, key, seq, message) VALUES ($1, $2, $3, $4)")
        .map_err(err)?;
    for copy in write.new_copies {
        tx.execute(
            &statement,
            &[
                &row.id,
                &(copy.key as i64),
                &copy.seq.map(|s| s as i64),
                &copy.message,
            ],
        )
        .map_err(err)?;
    }
    if !write.dropped_copies.is_empty() {
        let keys: Vec<i64> = write.dropped_copies.iter().map(|k| *k as i64).collect();
        tx.execute(
            "DELETE FROM working_copies WHERE session_id = $1 AND key = ANY($2)",
            &[&row.id, &keys],
        )
        .map_err(err)?;
    }
    tx.commit().map_err(err)
}

/// A session with its working history, read in one snapshot.
fn load_on(c: &mut postgres::Client, id: &str) -> Result<Option<StoredSession>, StoreError> {
    let mut tx = c
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(err)?;
    let Some(found) = tx
        .query_opt(
            &format!("SELECT {ROW_COLUMNS} FROM sessions WHERE id = $1"),
            &[&id],
        )
        .map_err(err)?
    else {
        return Ok(None);
    };
    let (row, working) = row_of(&found);
    let refs = decode_working(&working)?;
    let seqs: Vec<i64> = refs
        .iter()
        .filter_map(|r| match r {
            WorkingRef::Transcript(seq) => Some(*seq as i64),
            WorkingRef::Copy(_) => None,
        })
        .collect();
    let mut transcript = std::collections::HashMap::new();
    for r in tx
        .query(
            "SELECT seq, message FROM transcript WHERE session_id = $1 AND seq = ANY($2)",
            &[&id, &seqs],
        )
        .map_err(err)?
    {
        transcript.insert(r.get::<_, i64>(0) as u64, r.get::<_, String>(1));
    }
    let mut copies = std::collections::HashMap::new();
    for r in tx
        .query(
            "SELECT key, seq, message FROM working_copies WHERE session_id = $1",
            &[&id],
        )
        .map_err(err)?
    {
        copies.insert(
            r.get::<_, i64>(0) as u64,
            (
                r.get::<_, Option<i64>>(1).map(|s| s as u64),
                r.get::<_, String>(2),
            ),
        );
    }
    tx.commit().map_err(err)?;
    let mut messages = Vec::with_capacity(refs.len());
    for r in refs {
        let found = match r {
            WorkingRef::Transcript(seq) => transcript.get(&seq).map(|m| (Some(seq), m.clone())),
            WorkingRef::Copy(key) => copies.get(&key).cloned(),
        };
        let Some((seq, message)) = found else {
            return Err(StoreError::new(format!(
                "session {id}: working history entry {r:?} is missing"
            )));
        };
        messages.push((r, seq, message));
    }
    Ok(Some(StoredSession {
        row,
        working: messages,
    }))
}

/// A session's lock: a session-level advisory lock held on one pooled connection.
struct PgLock {
    connection: Connection,
    id: String,
    version: Option<u64>,
}

impl SessionLock for PgLock {
    fn version(&self) -> Option<u64> {
        self.version
    }

    fn load(&mut self) -> Result<Option<StoredSession>, StoreError> {
        load_on(&mut self.connection, &self.id)
    }

    fn commit(&mut self, write: &SessionWrite<'_>) -> Result<(), StoreError> {
        if write.row.is_some_and(|r| r.id != self.id) {
            return Err(StoreError::new("a session lock commits its own session only"));
        }
        commit_on(&mut *self.connection, write)
    }
}

impl Drop for PgLock {
    fn drop(&mut self) {
        // On a lost connection the server has released the lock already.
        let _ = self
            .connection
            .execute(&format!("SELECT pg_advisory_unlock({SESSION_KEY})"), &[&self.id]);
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
        let rows = self
            .connection()?
            .query(
                "SELECT seq, turn, message FROM transcript WHERE session_id = $1 AND seq >= $2 \
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
            })
            .collect())
    }

    fn check_writable(&self) -> Result<(), StoreError> {
        let mut c = self.connection()?;
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
        let row = c
            .query_opt("SELECT summary FROM summaries WHERE key = $1", &[&key])
            .map_err(err)?;
        Ok(row.map(|r| r.get(0)))
    }

    fn put_summary(&self, key: &str, summary: &str) -> Result<(), StoreError> {
        let mut c = self.connection()?;
        let now = crate::clock::now_ms() as i64;
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

    fn lock(&self, id: &str) -> Result<Locked, StoreError> {
        let mut c = self.connection()?;
        c.batch_execute(&format!(
            "SET lock_timeout = {}",
            self.lock_wait.as_millis().max(1)
        ))
        .map_err(err)?;
        let taken = c.execute(&format!("SELECT pg_advisory_lock({SESSION_KEY})"), &[&id]);
        let _ = c.batch_execute("RESET lock_timeout");
        match taken {
            Ok(_) => {}
            Err(e) if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                return Ok(Locked::Busy)
            }
            Err(e) => return Err(err(e)),
        }
        let mut lock = PgLock {
            connection: c,
            id: id.to_string(),
            version: None,
        };
        lock.version = lock
            .connection
            .query_opt("SELECT version FROM sessions WHERE id = $1", &[&id])
            .map_err(err)?
            .map(|r| r.get::<_, i64>(0) as u64);
        Ok(Locked::Held(Box::new(lock)))
    }

    fn create_limited(&self, row: &SessionRow, max_users: u64) -> Result<Result<(), u64>, StoreError> {
        let mut c = self.connection()?;
        let mut tx = c.transaction().map_err(err)?;
        // One creation at a time across hosts, so two cannot both take the last place.
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
        let mut reaped = Vec::new();
        for r in rows {
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
