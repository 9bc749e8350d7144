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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use postgres::{GenericClient, NoTls, SimpleQueryMessage, SimpleQueryRow};
use postgres_protocol::escape::escape_literal;
use r2d2_postgres::{r2d2, PostgresConnectionManager};

use super::{
    decode_working, encode_working, resolve_sent, HostCopy, Locked, SessionLock, SessionRow, SessionWrite,
    Store, StoreError, StoredMessage, StoredSession, TokenCounts, TranscriptRow, WorkingRef,
};

type Manager = PostgresConnectionManager<NoTls>;
type Pool = r2d2::Pool<Manager>;
type Connection = r2d2::PooledConnection<Manager>;

/// The schema, one entry per version; a host applies the ones the database lacks.
/// 1: sessions, transcripts, working copies; 2: `summaries`, the summarizer's answers;
/// 3: `sessions.sent`, the last sent history (`super::encode_sent`); 4: lz4 compression of
/// the message texts; 5: the messages' `tokens` (`super::TokenCounts`).
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
    "
ALTER TABLE sessions ADD COLUMN sent TEXT;
",
    // Large texts compressed with lz4 where the server has it (PostgreSQL 14 and later,
    // built with it) rather than pglz, which cost about a tenth of the server's CPU under
    // the serve bench. Values stored before keep their compression; both read back.
    "
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression'
               AND 'lz4' = ANY(enumvals)) THEN
        ALTER TABLE transcript ALTER COLUMN message SET COMPRESSION lz4;
        ALTER TABLE working_copies ALTER COLUMN message SET COMPRESSION lz4;
        ALTER TABLE sessions ALTER COLUMN sent SET COMPRESSION lz4;
    END IF;
END
$$;
",
    "
ALTER TABLE transcript ADD COLUMN tokens TEXT;
ALTER TABLE working_copies ADD COLUMN tokens TEXT;
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

/// The oldest PostgreSQL the store runs on: its reads subtract multiranges (14).
const OLDEST_SERVER: u32 = 140_000;

/// Refuses a server older than [`OLDEST_SERVER`], naming both versions.
fn check_version(c: &mut postgres::Client) -> Result<(), StoreError> {
    let row = c.query_one("SHOW server_version_num", &[]).map_err(err)?;
    let version: String = row.get(0);
    match version.parse::<u32>() {
        Ok(number) if number < OLDEST_SERVER => Err(StoreError::new(format!(
            "PostgreSQL {}.{} is too old: the store needs PostgreSQL 14 or later",
            number / 10_000,
            number % 10_000
        ))),
        _ => Ok(()),
    }
}

/// Applies the migrations the database lacks, one host at a time.
fn migrate(c: &mut postgres::Client) -> Result<(), StoreError> {
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

const ROW_COLUMNS: &str = "id, model, effective_ctx, turn, transcript_len, cleared_at, \
     expiration_override, created_at, last_active, next_copy, working, version";

/// The statements a turn runs, prepared once on each pooled connection as it opens
/// ([`PrepareStatements`]) and run by `EXECUTE` inside the turn's simple queries: the
/// server then parses and plans each once per connection, not once per turn — most of
/// its CPU otherwise (docs/scaling-out.md#round-trips).
///
/// - `history_lock`, `history_unlock`: session `$1`'s advisory lock;
/// - `history_version`: its stored version;
/// - `history_read_row`, `history_read_transcript`, `history_read_copies`: the session's
///   row, and the transcript rows and copies its histories reference, when its version
///   is not `$2` (NULL: always), leaving out the transcript rows in `$3` (an
///   `int8multirange` of seqs, [`seq_ranges`]) and the copies in `$3` (keys) —
///   [`read_statements`];
/// - `history_write`: one change of a session — [`write_statement`].
fn prepare_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            "SET jit = off; SET plan_cache_mode = force_generic_plan; \
             PREPARE history_lock(text) AS SELECT pg_advisory_lock({SESSION_KEY}); \
             PREPARE history_unlock(text) AS SELECT pg_advisory_unlock({SESSION_KEY}); \
             PREPARE history_version(text) AS SELECT version FROM sessions WHERE id = $1; \
             PREPARE history_read_row(text, bigint) AS \
               SELECT {ROW_COLUMNS}, sent FROM sessions WHERE id = $1 AND version IS DISTINCT FROM $2; \
             PREPARE history_read_transcript(text, bigint, int8multirange) AS \
               SELECT n.seq, t.message, t.tokens \
               FROM (SELECT range_agg(int8range(split_part(item, '-', 1)::bigint, \
                         COALESCE(NULLIF(split_part(item, '-', 2), ''), split_part(item, '-', 1))::bigint, '[]')) \
                     FROM sessions s, unnest(string_to_array( \
                         s.working || ',' || COALESCE(split_part(s.sent, E'\\n', 1), ''), ',')) AS item \
                     WHERE s.id = $1 AND s.version IS DISTINCT FROM $2 AND item ~ '^[0-9]') AS w(wanted), \
                 LATERAL unnest(w.wanted - $3) AS r(run), \
                 LATERAL generate_series(lower(r.run), upper(r.run) - 1) AS n(seq), \
                 LATERAL (SELECT message, tokens FROM transcript \
                          WHERE session_id = $1 AND seq = n.seq OFFSET 0) AS t; \
             PREPARE history_read_copies(text, bigint, bigint[]) AS \
               SELECT key, seq, message, tokens FROM working_copies WHERE session_id = $1 AND key <> ALL($3) \
               AND EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND version IS DISTINCT FROM $2); \
             PREPARE history_write(text, text, bigint, bigint, bigint, bigint, text, bigint, bigint, \
                                   text, text, bigint, bigint[], bigint[], text[], text[], bigint[], \
                                   bigint[], text[], text[], bigint[]) AS \
               WITH u AS (UPDATE sessions SET model = $2, effective_ctx = $3, turn = $4, \
                   transcript_len = $5, cleared_at = $6, expiration_override = $7, last_active = $8, \
                   next_copy = $9, working = $10, sent = $11, version = $12 \
                   WHERE id = $1 AND version = $12 - 1 RETURNING id), \
                 t AS (INSERT INTO transcript (session_id, seq, turn, message, tokens) \
                   SELECT u.id, v.seq, v.turn, v.message, v.tokens \
                   FROM u, unnest($13, $14, $15, $16) AS v(seq, turn, message, tokens)), \
                 c AS (INSERT INTO working_copies (session_id, key, seq, message, tokens) \
                   SELECT u.id, v.key, v.seq, v.message, v.tokens \
                   FROM u, unnest($17, $18, $19, $20) AS v(key, seq, message, tokens)), \
                 d AS (DELETE FROM working_copies WHERE session_id IN (SELECT id FROM u) AND key = ANY($21)) \
               SELECT count(*) FROM u"
        )
    })
}

/// Prepares [`prepare_sql`]'s statements on each connection the pool opens.
#[derive(Debug)]
struct PrepareStatements;

impl r2d2::CustomizeConnection<postgres::Client, postgres::Error> for PrepareStatements {
    fn on_acquire(&self, c: &mut postgres::Client) -> Result<(), postgres::Error> {
        trips(1);
        c.batch_execute(prepare_sql())
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

/// PostgreSQL round trips this process made to its store (each message sent and its answer
/// waited for), for `history_store_round_trips_total` (docs/scaling-out.md#round-trips).
static ROUND_TRIPS: AtomicU64 = AtomicU64::new(0);

/// The round trips made so far.
pub fn round_trips() -> u64 {
    ROUND_TRIPS.load(Ordering::Relaxed)
}

/// Counts `n` round trips. A statement given as text with parameters costs two (the
/// client prepares it, then runs it); a simple query, however many statements it holds,
/// one.
fn trips(n: u64) {
    ROUND_TRIPS.fetch_add(n, Ordering::Relaxed);
}

/// Runs `sql` (one or several statements) as one simple query: one round trip. Returns
/// each statement's rows, in order.
fn batch(c: &mut postgres::Client, sql: &str) -> Result<Vec<Vec<SimpleQueryRow>>, postgres::Error> {
    trips(1);
    let mut statements = vec![Vec::new()];
    for message in c.simple_query(sql)? {
        match message {
            SimpleQueryMessage::Row(row) => statements.last_mut().expect("one at least").push(row),
            SimpleQueryMessage::CommandComplete(_) => statements.push(Vec::new()),
            _ => {}
        }
    }
    statements.pop();
    Ok(statements)
}

/// A text as an SQL literal (the only way values enter a simple query).
fn lit(text: &str) -> String {
    escape_literal(text)
}

fn opt_lit(text: Option<&str>) -> String {
    text.map_or_else(|| "NULL".to_string(), lit)
}

/// Column `i` of a simple query's row as a number.
fn num(row: &SimpleQueryRow, i: usize) -> Result<u64, StoreError> {
    row.get(i)
        .and_then(|v| v.parse::<i64>().ok())
        .map(|v| v as u64)
        .ok_or_else(|| StoreError::new(format!("the store answered a non-number in column {i}")))
}

fn text(row: &SimpleQueryRow, i: usize) -> Result<String, StoreError> {
    row.get(i)
        .map(str::to_string)
        .ok_or_else(|| StoreError::new(format!("the store answered NULL in column {i}")))
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

/// One session write as one statement (`history_write`, [`prepare_sql`]): the row's
/// update, refused unless `row.version` follows the stored version, and the transcript
/// rows and copies added and dropped, each only if the update happened (they read its
/// result). It answers 1 when written, 0 when refused (then nothing is).
fn write_statement(write: &SessionWrite<'_>) -> Result<String, StoreError> {
    let Some(row) = write.row else {
        return Err(StoreError::new("a session write needs its row"));
    };
    let transcript = write.transcript;
    let copies = write.new_copies;
    Ok(format!(
        "EXECUTE history_write({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {})",
        lit(&row.id),
        lit(&row.model),
        row.effective_ctx as i64,
        row.turn as i64,
        row.transcript_len as i64,
        row.cleared_at as i64,
        opt_lit(row.expiration_override.as_deref()),
        row.last_active as i64,
        row.next_copy as i64,
        lit(&encode_working(write.working)),
        opt_lit(write.sent),
        row.version as i64,
        numbers(transcript.iter().map(|t| Some(t.seq))),
        numbers(transcript.iter().map(|t| Some(t.turn))),
        texts(transcript.iter().map(|t| Some(t.message.as_str()))),
        texts(transcript.iter().map(|t| t.tokens.0.as_deref())),
        numbers(copies.iter().map(|c| Some(c.key))),
        numbers(copies.iter().map(|c| c.seq)),
        texts(copies.iter().map(|c| Some(c.message.as_str()))),
        texts(copies.iter().map(|c| c.tokens.0.as_deref())),
        numbers(write.dropped_copies.iter().copied().map(Some)),
    ))
}

/// Numbers (NULL for `None`) as an SQL `bigint[]` literal.
fn numbers(values: impl Iterator<Item = Option<u64>>) -> String {
    let items: Vec<String> = values
        .map(|v| v.map_or_else(|| "NULL".to_string(), |v| (v as i64).to_string()))
        .collect();
    format!("'{{{}}}'::bigint[]", items.join(","))
}

/// Texts (NULL for `None`) as an SQL `text[]` value, each an escaped literal.
fn texts<'a>(values: impl Iterator<Item = Option<&'a str>>) -> String {
    let items: Vec<String> = values.map(opt_lit).collect();
    format!("ARRAY[{}]::text[]", items.join(", "))
}

fn refused(write: &SessionWrite<'_>) -> StoreError {
    StoreError::new(format!(
        "session {} changed on another host, or is gone: nothing written",
        write.row.map_or("?", |r| r.id.as_str())
    ))
}

/// One session write in one transaction and one round trip; refused unless `row.version`
/// follows the stored version.
fn commit_on(c: &mut postgres::Client, write: &SessionWrite<'_>) -> Result<(), StoreError> {
    let statement = write_statement(write)?;
    let answers = batch(c, &statement).map_err(err)?;
    let written = answers
        .first()
        .and_then(|rows| rows.first())
        .map(|r| num(r, 0))
        .transpose()?;
    if written != Some(1) {
        return Err(refused(write));
    }
    Ok(())
}

/// The statements that read session `id` (its row, then the transcript rows and copies
/// its working and sent histories reference) when its stored version is not the one the
/// host holds (`held`; `None`: always), leaving out the messages the host holds. The
/// references are expanded by the server from the row itself (`history_read_*`,
/// [`prepare_sql`]), so the row and its messages come back in one round trip.
fn read_statements(id: &str, held: Option<&HostCopy>) -> String {
    let id = lit(id);
    let (version, seqs, keys) = match held {
        Some(held) => {
            let seqs = held.refs.iter().filter_map(|r| match r {
                WorkingRef::Transcript(seq) => Some(*seq),
                WorkingRef::Copy(_) => None,
            });
            let keys = held.refs.iter().filter_map(|r| match r {
                WorkingRef::Copy(key) => Some(Some(*key)),
                WorkingRef::Transcript(_) => None,
            });
            (
                (held.version as i64).to_string(),
                seq_ranges(seqs.collect()),
                numbers(keys),
            )
        }
        None => (
            "NULL".to_string(),
            seq_ranges(Vec::new()),
            numbers(std::iter::empty()),
        ),
    };
    format!(
        "EXECUTE history_read_row({id}, {version}); \
         EXECUTE history_read_transcript({id}, {version}, {seqs}); \
         EXECUTE history_read_copies({id}, {version}, {keys})"
    )
}

/// Transcript seqs as an SQL `int8multirange` literal: each run of consecutive seqs one
/// range, so the server subtracts what a host holds from what a session references in a
/// few range operations, however long the session.
fn seq_ranges(mut seqs: Vec<u64>) -> String {
    seqs.sort_unstable();
    seqs.dedup();
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < seqs.len() {
        let mut j = i;
        while j + 1 < seqs.len() && seqs[j + 1] == seqs[j] + 1 {
            j += 1;
        }
        ranges.push(format!("[{},{}]", seqs[i] as i64, seqs[j] as i64));
        i = j + 1;
    }
    format!("'{{{}}}'::int8multirange", ranges.join(","))
}

/// A session from the answers of [`read_statements`]; `None` if its row is not there.
fn session_of(
    id: &str,
    answers: &[Vec<SimpleQueryRow>],
    held: Option<&HostCopy>,
) -> Result<Option<StoredSession>, StoreError> {
    let [rows, transcript_rows, copy_rows] = answers else {
        return Err(StoreError::new(
            "the store answered an unexpected number of results",
        ));
    };
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    let row = SessionRow {
        id: text(r, 0)?,
        model: text(r, 1)?,
        effective_ctx: num(r, 2)?,
        turn: num(r, 3)?,
        transcript_len: num(r, 4)?,
        cleared_at: num(r, 5)?,
        expiration_override: r.get(6).map(str::to_string),
        created_at: num(r, 7)?,
        last_active: num(r, 8)?,
        next_copy: num(r, 9)?,
        version: num(r, 11)?,
    };
    let refs = decode_working(&text(r, 10)?)?;
    let sent = r.get(12).map(str::to_string);
    // Each message read: its seq (a copy's may be none), text and token counts.
    let tokens = |row: &SimpleQueryRow, i: usize| TokenCounts(row.get(i).map(str::to_string));
    let mut transcript = HashMap::new();
    for t in transcript_rows {
        let seq = num(t, 0)?;
        transcript.insert(seq, (Some(seq), text(t, 1)?, tokens(t, 2)));
    }
    let mut copies = HashMap::new();
    for c in copy_rows {
        let seq = match c.get(1) {
            Some(_) => Some(num(c, 1)?),
            None => None,
        };
        copies.insert(num(c, 0)?, (seq, text(c, 2)?, tokens(c, 3)));
    }
    let held_refs: std::collections::HashSet<WorkingRef> =
        held.map(|h| h.refs.iter().copied().collect()).unwrap_or_default();
    let mut working = Vec::with_capacity(refs.len());
    for reference in refs {
        let found = match reference {
            WorkingRef::Transcript(seq) => transcript.get(&seq),
            WorkingRef::Copy(key) => copies.get(&key),
        };
        let message = match found {
            Some((seq, text, tokens)) => StoredMessage {
                reference,
                seq: *seq,
                text: Some(text.clone()),
                tokens: tokens.clone(),
            },
            // Left out of the read: the host holds it.
            None if held_refs.contains(&reference) => StoredMessage {
                reference,
                seq: None,
                text: None,
                tokens: TokenCounts::default(),
            },
            None => {
                return Err(StoreError::new(format!(
                    "session {id}: working history entry {reference:?} is missing"
                )))
            }
        };
        working.push(message);
    }
    let sent = resolve_sent(sent, &working, held, |r| {
        let found = match r {
            WorkingRef::Transcript(seq) => transcript.get(&seq),
            WorkingRef::Copy(key) => copies.get(&key),
        };
        Ok(found.map(|(_, text, _)| text.clone()))
    })?;
    Ok(Some(StoredSession { row, working, sent }))
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
                let written = answers
                    .get(skip)
                    .and_then(|rows| rows.first())
                    .map(|r| num(r, 0))
                    .transpose()?;
                if written != Some(1) {
                    return Err(refused(write));
                }
                Ok(())
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
    fn held_seqs_are_sent_as_runs() {
        use super::seq_ranges;
        assert_eq!(seq_ranges(vec![]), "'{}'::int8multirange");
        assert_eq!(
            seq_ranges(vec![7, 1, 2, 3, 9, 10, 2]),
            "'{[1,3],[7,7],[9,10]}'::int8multirange"
        );
    }

    #[test]
    fn a_url_is_shown_without_its_password() {
        assert_eq!(shown("postgres://u:pw@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(shown("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(shown("postgres://h/db"), "postgres://h/db");
    }
}
