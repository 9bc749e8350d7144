//! The embedded store: one SQLite database in WAL mode (docs/sessions.md says why these
//! settings, and what they guarantee).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use super::{
    decode_working, encode_working, resolve_sent, CopyRow, SessionRow, SessionWrite, Store, StoreError,
    StoredMessage, StoredSession, TokenCounts, TranscriptRow, WorkingRef,
};

/// 2: `summaries`, the summarizer's answers by key; 3: `sessions.sent`, the last sent
/// history (`super::encode_sent`).
const SCHEMA_VERSION: i64 = 4;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    effective_ctx INTEGER NOT NULL,
    turn INTEGER NOT NULL,
    transcript_len INTEGER NOT NULL,
    cleared_at INTEGER NOT NULL,
    expiration_override TEXT,
    created_at INTEGER NOT NULL,
    last_active INTEGER NOT NULL,
    next_copy INTEGER NOT NULL,
    working TEXT NOT NULL,
    sent TEXT
);
CREATE TABLE IF NOT EXISTS transcript (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    turn INTEGER NOT NULL,
    message TEXT NOT NULL,
    tokens TEXT,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE IF NOT EXISTS working_copies (
    session_id TEXT NOT NULL,
    key INTEGER NOT NULL,
    seq INTEGER,
    message TEXT NOT NULL,
    tokens TEXT,
    PRIMARY KEY (session_id, key)
);
CREATE TABLE IF NOT EXISTS write_probe (
    id INTEGER PRIMARY KEY,
    checked_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS summaries (
    key TEXT PRIMARY KEY,
    summary TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
";

/// The embedded SQLite store. One connection writes (SQLite has one writer at a time
/// anyway), another reads, so a transcript page does not wait for a commit's fsync.
///
/// Session writes are group-committed (docs/sessions.md#durability): a write queues
/// itself, then waits for the writer connection; whoever gets the connection with its own
/// write still undone takes every queued write and commits them in one transaction, one
/// fsync, each inside a savepoint of its own. So the writes that arrive while a commit is
/// in flight share the next one, and each caller returns only after the transaction that
/// holds its write has committed (the connection is released only then).
pub struct SqliteStore {
    writer: Mutex<Connection>,
    reader: Mutex<Connection>,
    /// Session writes waiting for the next group commit.
    queue: Mutex<Vec<Arc<Pending>>>,
    /// Group-commit transactions run (each one fsync).
    batches: AtomicU64,
}

/// A session write waiting in the group-commit queue, owned so the committing thread can
/// run it, and its outcome, set once by that thread before it releases the connection.
struct Pending {
    row: SessionRow,
    transcript: Vec<TranscriptRow>,
    working: String,
    /// The encoded last sent history (store/mod.rs `encode_sent`).
    sent: Option<String>,
    new_copies: Vec<CopyRow>,
    dropped_copies: Vec<u64>,
    result: OnceLock<Result<(), StoreError>>,
}

impl Pending {
    fn finish(&self, result: Result<(), StoreError>) {
        // Set once: a write is in exactly one batch.
        let _ = self.result.set(result);
    }
}

/// A SQLite error as a store error. A store that cannot take writes now — its disk full,
/// its file or file system read-only, an I/O error, the file locked by another process
/// past the busy timeout — is [`StoreError::unavailable`] (a 503): nothing was written,
/// and the same request succeeds once the operator has made room or made it writable.
fn err(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    let code = match &e {
        rusqlite::Error::SqliteFailure(failure, _) => Some(failure.code),
        _ => None,
    };
    let what = match code {
        Some(ErrorCode::DiskFull) => "the disk holding the store is full; free some space",
        Some(ErrorCode::ReadOnly) => "the store is read-only; make its file and folder writable",
        Some(ErrorCode::SystemIoFailure) => "an I/O error on the store's file",
        Some(ErrorCode::CannotOpen) => "the store's file cannot be opened",
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => "the store is locked by another process",
        _ => return StoreError::new(e.to_string()),
    };
    StoreError::unavailable(format!("{what} (SQLite: {e})"))
}

fn open(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    // SQLite says only "unable to open database file" when the file or its file system is
    // read-only; the operating system's answer names the cause.
    if path.exists() {
        if let Err(e) = std::fs::OpenOptions::new().append(true).open(path) {
            return Err(StoreError::unavailable(format!(
                "the store {} cannot be written: {e}",
                path.display()
            )));
        }
    }
    let connection = Connection::open(path)
        .map_err(|e| StoreError::new(format!("cannot open {}: {e}", path.display())))?;
    connection.busy_timeout(busy_timeout).map_err(err)?;
    // WAL: readers never block the writer. synchronous = FULL: every commit is fsynced
    // before it returns, so an acknowledged turn survives a killed process and a power
    // loss alike (docs/sessions.md, durability).
    let mode: String = connection
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::new(format!(
            "{}: cannot use WAL mode (got {mode})",
            path.display()
        )));
    }
    connection
        .execute_batch("PRAGMA synchronous = FULL;")
        .map_err(err)?;
    Ok(connection)
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`, waiting at most the default
    /// `[store] statement_timeout_ms` for a file another process has locked.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_waiting(path, history_engine::StoreLimits::default().statement_timeout)
    }

    /// Opens (creating if needed) the store at `path`; a file another process has locked
    /// is waited for at most `busy_timeout` (then a 503).
    pub fn open_waiting(path: &Path, busy_timeout: Duration) -> Result<SqliteStore, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| StoreError::new(format!("cannot create {}: {e}", parent.display())))?;
        }
        let writer = open(path, busy_timeout)?;
        let version: i64 = writer
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(err)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::new(format!(
                "{} was written by a newer history-host (schema {version}, this one knows {SCHEMA_VERSION})",
                path.display()
            )));
        }
        writer.execute_batch(SCHEMA).map_err(err)?;
        // Columns added since version 1, to a store made before them: version 3 added
        // `sessions.sent`, version 4 the messages' `tokens`.
        for (table, column) in [
            ("sessions", "sent"),
            ("transcript", "tokens"),
            ("working_copies", "tokens"),
        ] {
            let has = writer
                .prepare(&format!(
                    "SELECT 1 FROM pragma_table_info('{table}') WHERE name = '{column}'"
                ))
                .and_then(|mut s| s.exists([]))
                .map_err(err)?;
            if !has {
                writer
                    .execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} TEXT;"))
                    .map_err(err)?;
            }
        }
        writer
            .execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION};"))
            .map_err(err)?;
        let reader = open(path, busy_timeout)?;
        Ok(SqliteStore {
            writer: Mutex::new(writer),
            reader: Mutex::new(reader),
            queue: Mutex::new(Vec::new()),
            batches: AtomicU64::new(0),
        })
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Pending>>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commits `batch` in one transaction, a savepoint per write: a write that fails
    /// (no such session, a duplicate row) is rolled back alone and fails alone. Every
    /// write of the batch has its outcome set when this returns.
    fn commit_batch(&self, connection: &mut Connection, batch: &[Arc<Pending>]) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        let mut tx = match connection.transaction() {
            Ok(tx) => tx,
            Err(e) => {
                fail_all(batch, err(e));
                return;
            }
        };
        let mut written = Vec::with_capacity(batch.len());
        for (i, pending) in batch.iter().enumerate() {
            let savepoint = match tx.savepoint() {
                Ok(savepoint) => savepoint,
                Err(e) => {
                    fail_all(batch, err(e));
                    return;
                }
            };
            match write_one(&savepoint, pending) {
                Ok(()) => match savepoint.commit() {
                    Ok(()) => written.push(pending),
                    Err(e) => {
                        fail_all(batch, err(e));
                        return;
                    }
                },
                Err(e) => {
                    // Some errors (a full disk, an I/O error) make SQLite roll back the
                    // whole transaction, and the savepoint with it; an undo that fails
                    // leaves this write's part in. Either way the batch cannot commit:
                    // every write of it fails (dropping `tx` rolls back what is left).
                    let undone = savepoint.finish();
                    if undone.is_err() || tx.is_autocommit() {
                        for p in written.iter().copied().chain(&batch[i + 1..]) {
                            p.finish(Err(e.clone()));
                        }
                        pending.finish(Err(e));
                        return;
                    }
                    pending.finish(Err(e));
                }
            }
        }
        let committed = tx.commit().map_err(err);
        for pending in written {
            pending.finish(committed.clone());
        }
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reader(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.reader.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Fails every write of `batch` not failed already with `e`.
fn fail_all(batch: &[Arc<Pending>], e: StoreError) {
    batch.iter().for_each(|p| p.finish(Err(e.clone())));
}

/// One session write's statements, inside the caller's transaction or savepoint.
fn write_one(connection: &Connection, write: &Pending) -> Result<(), StoreError> {
    let row = &write.row;
    let updated = connection
        .prepare_cached(
            "UPDATE sessions SET model = ?2, effective_ctx = ?3, turn = ?4, transcript_len = ?5, \
             cleared_at = ?6, expiration_override = ?7, last_active = ?8, next_copy = ?9, working = ?10, \
             sent = ?11 WHERE id = ?1",
        )
        .and_then(|mut update| {
            update.execute(params![
                row.id,
                row.model,
                row.effective_ctx as i64,
                row.turn as i64,
                row.transcript_len as i64,
                row.cleared_at as i64,
                row.expiration_override,
                row.last_active as i64,
                row.next_copy as i64,
                write.working,
                write.sent,
            ])
        })
        .map_err(err)?;
    if updated != 1 {
        return Err(StoreError::new(format!("no session {}", row.id)));
    }
    let mut insert = connection
        .prepare_cached(
            "INSERT INTO transcript (session_id, seq, turn, message, tokens) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(err)?;
    for t in &write.transcript {
        insert
            .execute(params![
                row.id,
                t.seq as i64,
                t.turn as i64,
                t.message,
                t.tokens.0
            ])
            .map_err(err)?;
    }
    let mut insert = connection
        .prepare_cached(
            "INSERT INTO working_copies (session_id, key, seq, message, tokens) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(err)?;
    for c in &write.new_copies {
        insert
            .execute(params![
                row.id,
                c.key as i64,
                c.seq.map(|s| s as i64),
                c.message,
                c.tokens.0
            ])
            .map_err(err)?;
    }
    let mut delete = connection
        .prepare_cached("DELETE FROM working_copies WHERE session_id = ?1 AND key = ?2")
        .map_err(err)?;
    for key in &write.dropped_copies {
        delete.execute(params![row.id, *key as i64]).map_err(err)?;
    }
    Ok(())
}

fn row_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<(SessionRow, String)> {
    Ok((
        SessionRow {
            id: r.get(0)?,
            model: r.get(1)?,
            effective_ctx: r.get::<_, i64>(2)? as u64,
            turn: r.get::<_, i64>(3)? as u64,
            transcript_len: r.get::<_, i64>(4)? as u64,
            cleared_at: r.get::<_, i64>(5)? as u64,
            expiration_override: r.get(6)?,
            created_at: r.get::<_, i64>(7)? as u64,
            last_active: r.get::<_, i64>(8)? as u64,
            next_copy: r.get::<_, i64>(9)? as u64,
            version: 0,
        },
        r.get(10)?,
    ))
}

const ROW_COLUMNS: &str = "id, model, effective_ctx, turn, transcript_len, cleared_at, \
     expiration_override, created_at, last_active, next_copy, working";

impl Store for SqliteStore {
    fn create(&self, row: &SessionRow) -> Result<(), StoreError> {
        self.writer()
            .execute(
                &format!("INSERT INTO sessions ({ROW_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, '')"),
                params![
                    row.id,
                    row.model,
                    row.effective_ctx as i64,
                    row.turn as i64,
                    row.transcript_len as i64,
                    row.cleared_at as i64,
                    row.expiration_override,
                    row.created_at as i64,
                    row.last_active as i64,
                    row.next_copy as i64,
                ],
            )
            .map_err(err)?;
        Ok(())
    }

    fn commit(&self, write: &SessionWrite<'_>) -> Result<(), StoreError> {
        let Some(row) = write.row else {
            return Err(StoreError::new("a session write needs its row"));
        };
        let pending = Arc::new(Pending {
            row: row.clone(),
            transcript: write.transcript.to_vec(),
            working: encode_working(write.working),
            sent: write.sent.map(str::to_string),
            new_copies: write.new_copies.to_vec(),
            dropped_copies: write.dropped_copies.to_vec(),
            result: OnceLock::new(),
        });
        self.queue().push(Arc::clone(&pending));
        let mut connection = self.writer();
        if pending.result.get().is_none() {
            // Not taken by the thread that held the connection before: this thread commits
            // every write queued now, its own among them.
            let batch = std::mem::take(&mut *self.queue());
            self.commit_batch(&mut connection, &batch);
        }
        drop(connection);
        pending.result.get().cloned().unwrap_or_else(|| {
            // Only if the committing thread panicked part-way (its transaction rolled back).
            Err(StoreError::new(
                "the store's writer failed before this write was committed",
            ))
        })
    }

    fn set_effective_ctx(&self, sessions: &[(String, u64)]) -> Result<(), StoreError> {
        let mut connection = self.writer();
        let tx = connection.transaction().map_err(err)?;
        {
            let mut update = tx
                .prepare_cached("UPDATE sessions SET effective_ctx = ?2 WHERE id = ?1")
                .map_err(err)?;
            for (id, effective_ctx) in sessions {
                update.execute(params![id, *effective_ctx as i64]).map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let mut connection = self.writer();
        let tx = connection.transaction().map_err(err)?;
        let deleted = tx
            .execute("DELETE FROM sessions WHERE id = ?1", params![id])
            .map_err(err)?;
        tx.execute("DELETE FROM transcript WHERE session_id = ?1", params![id])
            .map_err(err)?;
        tx.execute("DELETE FROM working_copies WHERE session_id = ?1", params![id])
            .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(deleted == 1)
    }

    fn sessions(&self) -> Result<Vec<(SessionRow, usize)>, StoreError> {
        let connection = self.reader();
        let mut statement = connection
            .prepare(&format!(
                "SELECT {ROW_COLUMNS} FROM sessions ORDER BY created_at, id"
            ))
            .map_err(err)?;
        let rows = statement
            .query_map([], row_of)
            .map_err(err)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        rows.into_iter()
            .map(|(row, working)| Ok((row, decode_working(&working)?.len())))
            .collect()
    }

    fn load(&self, id: &str) -> Result<Option<StoredSession>, StoreError> {
        let mut connection = self.reader();
        // One snapshot for the row and the messages it references.
        let tx = connection.transaction().map_err(err)?;
        let Some(((row, working), sent)) = tx
            .query_row(
                &format!("SELECT {ROW_COLUMNS}, sent FROM sessions WHERE id = ?1"),
                params![id],
                |r| Ok((row_of(r)?, r.get::<_, Option<String>>(11)?)),
            )
            .optional()
            .map_err(err)?
        else {
            return Ok(None);
        };
        let refs = decode_working(&working)?;
        let mut messages = Vec::with_capacity(refs.len());
        {
            let mut transcript = tx
                .prepare_cached("SELECT message, tokens FROM transcript WHERE session_id = ?1 AND seq = ?2")
                .map_err(err)?;
            let mut copies = tx
                .prepare_cached(
                    "SELECT seq, message, tokens FROM working_copies WHERE session_id = ?1 AND key = ?2",
                )
                .map_err(err)?;
            for r in refs {
                let found = match r {
                    WorkingRef::Transcript(seq) => transcript
                        .query_row(params![id, seq as i64], |r| Ok((Some(seq), r.get(0)?, r.get(1)?)))
                        .optional()
                        .map_err(err)?,
                    WorkingRef::Copy(key) => copies
                        .query_row(params![id, key as i64], |r| {
                            Ok((
                                r.get::<_, Option<i64>>(0)?.map(|s| s as u64),
                                r.get(1)?,
                                r.get(2)?,
                            ))
                        })
                        .optional()
                        .map_err(err)?,
                };
                let Some((seq, text, tokens)) = found else {
                    return Err(StoreError::new(format!(
                        "session {id}: working history entry {r:?} is missing"
                    )));
                };
                messages.push(StoredMessage {
                    reference: r,
                    seq,
                    text: Some(text),
                    tokens: TokenCounts(tokens),
                });
            }
        }
        let sent = {
            let mut transcript = tx
                .prepare_cached("SELECT message FROM transcript WHERE session_id = ?1 AND seq = ?2")
                .map_err(err)?;
            let mut copies = tx
                .prepare_cached("SELECT message FROM working_copies WHERE session_id = ?1 AND key = ?2")
                .map_err(err)?;
            resolve_sent(sent, &messages, None, |r| {
                let (statement, n) = match r {
                    WorkingRef::Transcript(seq) => (&mut transcript, seq),
                    WorkingRef::Copy(key) => (&mut copies, key),
                };
                statement
                    .query_row(params![id, n as i64], |r| r.get::<_, String>(0))
                    .optional()
                    .map_err(err)
            })?
        };
        tx.finish().map_err(err)?;
        Ok(Some(StoredSession {
            row,
            working: messages,
            sent,
        }))
    }

    fn transcript(&self, id: &str, from: u64, limit: u64) -> Result<Vec<TranscriptRow>, StoreError> {
        let connection = self.reader();
        let mut statement = connection
            .prepare_cached(
                "SELECT seq, turn, message, tokens FROM transcript WHERE session_id = ?1 AND seq >= ?2 \
                 ORDER BY seq LIMIT ?3",
            )
            .map_err(err)?;
        let rows = statement
            .query_map(params![id, from as i64, limit.min(i64::MAX as u64) as i64], |r| {
                Ok(TranscriptRow {
                    seq: r.get::<_, i64>(0)? as u64,
                    turn: r.get::<_, i64>(1)? as u64,
                    message: r.get(2)?,
                    tokens: TokenCounts(r.get(3)?),
                })
            })
            .map_err(err)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        Ok(rows)
    }

    /// Commits a one-row write: taking the write lock alone succeeds on a full disk or a
    /// file system remounted read-only, where a turn's commit would fail.
    fn check_writable(&self) -> Result<(), StoreError> {
        let connection = self.writer();
        connection
            .execute(
                "INSERT OR REPLACE INTO write_probe (id, checked_at) VALUES (1, ?1)",
                [crate::clock::now_ms() as i64],
            )
            .map(drop)
            .map_err(err)
    }

    fn summary(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.reader()
            .query_row(
                "SELECT summary FROM summaries WHERE key = ?1",
                params![key],
                |r| r.get(0),
            )
            .optional()
            .map_err(err)
    }

    fn put_summary(&self, key: &str, summary: &str) -> Result<(), StoreError> {
        self.writer()
            .execute(
                "INSERT OR IGNORE INTO summaries (key, summary, created_at) VALUES (?1, ?2, ?3)",
                params![key, summary, crate::clock::now_ms() as i64],
            )
            .map(|_| ())
            .map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str) -> SessionRow {
        SessionRow::new(id.into(), "m".into(), 10, 1)
    }

    /// A store written by an older host (schema 2: no `sent`, no `tokens`) opens: the
    /// columns are added, its messages read back without counts; a newer one is refused.
    #[test]
    fn an_older_store_gains_the_new_columns_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            let old = Connection::open(&path).unwrap();
            old.execute_batch(
                "CREATE TABLE sessions (id TEXT PRIMARY KEY, model TEXT NOT NULL, \
                   effective_ctx INTEGER NOT NULL, turn INTEGER NOT NULL, transcript_len INTEGER NOT NULL, \
                   cleared_at INTEGER NOT NULL, expiration_override TEXT, created_at INTEGER NOT NULL, \
                   last_active INTEGER NOT NULL, next_copy INTEGER NOT NULL, working TEXT NOT NULL); \
                 CREATE TABLE transcript (session_id TEXT NOT NULL, seq INTEGER NOT NULL, \
                   turn INTEGER NOT NULL, message TEXT NOT NULL, PRIMARY KEY (session_id, seq)); \
                 CREATE TABLE working_copies (session_id TEXT NOT NULL, key INTEGER NOT NULL, seq INTEGER, \
                   message TEXT NOT NULL, PRIMARY KEY (session_id, key)); \
                 INSERT INTO sessions VALUES ('a', 'm', 10, 1, 1, 0, NULL, 1, 1, 1, '1'); \
                 INSERT INTO transcript VALUES ('a', 1, 1, '{\"role\":\"user\",\"content\":\"q\"}'); \
                 PRAGMA user_version = 2;",
            )
            .unwrap();
        }
        let store = SqliteStore::open(&path).unwrap();
        let loaded = store.load("a").unwrap().unwrap();
        assert_eq!(loaded.working.len(), 1);
        assert_eq!(
            loaded.working[0].tokens,
            TokenCounts(None),
            "stored before counts were"
        );
        assert_eq!(loaded.sent, None);
        let version: i64 = store
            .reader()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        drop(store);

        Connection::open(&path)
            .unwrap()
            .execute_batch(&format!("PRAGMA user_version = {};", SCHEMA_VERSION + 1))
            .unwrap();
        let refused = SqliteStore::open(&path).err().expect("a newer store is refused");
        assert!(
            refused.message.contains("newer history-host"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn a_committed_turn_is_there_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            let store = SqliteStore::open(&path).unwrap();
            store.create(&row("a")).unwrap();
            store.create(&row("b")).unwrap();
            let mut a = row("a");
            a.turn = 1;
            a.transcript_len = 2;
            a.next_copy = 2;
            let transcript = [
                TranscriptRow {
                    seq: 1,
                    turn: 1,
                    message: r#"{"role":"user","content":"q"}"#.into(),
                    tokens: TokenCounts(Some("o200k_base:1".into())),
                },
                TranscriptRow {
                    seq: 2,
                    turn: 1,
                    message: r#"{"role":"assistant","content":"a"}"#.into(),
                    tokens: TokenCounts::default(),
                },
            ];
            let copies = [super::super::CopyRow {
                key: 1,
                seq: Some(2),
                message: r#"{"role":"assistant","content":"[Omitted]"}"#.into(),
                tokens: TokenCounts(Some("o200k_base:3,chars4:3".into())),
            }];
            store
                .commit(&SessionWrite {
                    row: Some(&a),
                    transcript: &transcript,
                    working: &[WorkingRef::Transcript(1), WorkingRef::Copy(1)],
                    new_copies: &copies,
                    dropped_copies: &[],
                    sent: Some("1,m0\n{}"),
                })
                .unwrap();
            // A write that fails part-way changes nothing: seq 2 exists already.
            let mut again = a.clone();
            again.turn = 2;
            assert!(store
                .commit(&SessionWrite {
                    row: Some(&again),
                    transcript: &transcript[1..],
                    working: &[],
                    ..Default::default()
                })
                .is_err());
            assert!(store.delete("b").unwrap());
            assert!(!store.delete("b").unwrap());
        }
        let store = SqliteStore::open(&path).unwrap();
        let sessions = store.sessions().unwrap();
        assert_eq!(sessions.len(), 1);
        let loaded = store.load("a").unwrap().unwrap();
        assert_eq!(loaded.row.turn, 1, "the failed write left the session as it was");
        assert_eq!(
            loaded.working,
            [
                StoredMessage {
                    reference: WorkingRef::Transcript(1),
                    seq: Some(1),
                    text: Some(r#"{"role":"user","content":"q"}"#.into()),
                    tokens: TokenCounts(Some("o200k_base:1".into())),
                },
                StoredMessage {
                    reference: WorkingRef::Copy(1),
                    seq: Some(2),
                    text: Some(r#"{"role":"assistant","content":"[Omitted]"}"#.into()),
                    tokens: TokenCounts(Some("o200k_base:3,chars4:3".into())),
                },
            ]
        );
        assert_eq!(store.transcript("a", 2, 10).unwrap().len(), 1);
        assert!(store.load("b").unwrap().is_none());
        store.check_writable().unwrap();
        let mode: String = store
            .reader()
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    fn turn_of(id: &str, turn: u64) -> (SessionRow, Vec<TranscriptRow>) {
        let mut r = row(id);
        r.turn = turn;
        r.transcript_len = turn;
        let transcript = vec![TranscriptRow {
            seq: turn,
            turn,
            message: format!(r#"{{"role":"user","content":"{id} {turn}"}}"#),
            tokens: TokenCounts::default(),
        }];
        (r, transcript)
    }

    fn commit_turn(store: &SqliteStore, id: &str, turn: u64) -> Result<(), StoreError> {
        let (mut r, transcript) = turn_of(id, turn);
        // A write that fails must leave no part behind: the model shows its row update.
        r.model = format!("m{turn}");
        let working: Vec<WorkingRef> = (1..=turn).map(WorkingRef::Transcript).collect();
        store.commit(&SessionWrite {
            row: Some(&r),
            transcript: &transcript,
            working: &working,
            ..Default::default()
        })
    }

    /// Writes queued while the connection is busy are committed together, and a write
    /// that fails (its session unknown, a duplicate transcript row) fails alone.
    #[test]
    fn queued_writes_share_one_commit_and_a_failing_one_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = SqliteStore::open(&path).unwrap();
        for id in ["a", "b", "c", "d"] {
            store.create(&row(id)).unwrap();
        }
        commit_turn(&store, "d", 1).unwrap();
        store
            .writer()
            .execute("UPDATE sessions SET model = 'kept' WHERE id = 'd'", [])
            .unwrap();
        let before = store.batches.load(Ordering::Relaxed);
        let results = std::thread::scope(|scope| {
            // Holding the connection as a commit in flight would: every write queues.
            let busy = store.writer();
            let handles: Vec<_> = [("a", 1), ("ghost", 1), ("b", 1), ("d", 1), ("c", 1)]
                .into_iter()
                .map(|(id, turn)| {
                    let store = &store;
                    scope.spawn(move || (id, commit_turn(store, id, turn)))
                })
                .collect();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while store.queue().len() < handles.len() {
                assert!(std::time::Instant::now() < deadline, "the writes never queued");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            drop(busy);
            handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        });
        assert_eq!(
            store.batches.load(Ordering::Relaxed) - before,
            1,
            "one transaction for the five queued writes"
        );
        for (id, result) in results {
            match id {
                "ghost" => assert_eq!(result.unwrap_err().message, "no session ghost"),
                // Turn 1 of d is stored already: its transcript row 1 exists.
                "d" => assert!(result.unwrap_err().message.contains("UNIQUE"), "{id}"),
                _ => result.unwrap_or_else(|e| panic!("{id}: {e}")),
            }
        }
        drop(store);
        let store = SqliteStore::open(&path).unwrap();
        for id in ["a", "b", "c", "d"] {
            let loaded = store.load(id).unwrap().unwrap();
            assert_eq!(loaded.row.turn, 1, "{id}");
            assert_eq!(store.transcript(id, 1, 10).unwrap().len(), 1, "{id}");
        }
        assert_eq!(store.load("a").unwrap().unwrap().row.model, "m1");
        assert_eq!(
            store.load("d").unwrap().unwrap().row.model,
            "kept",
            "the failed write's row update was rolled back"
        );
        assert_eq!(
            store.transcript("d", 1, 1).unwrap()[0].message,
            r#"{"role":"user","content":"d 1"}"#
        );
        assert!(store.load("ghost").unwrap().is_none());
    }

    /// Many threads committing at once: every acknowledged write is there after reopening,
    /// in fewer transactions than writes.
    #[test]
    fn concurrent_commits_are_all_durable_in_fewer_transactions() {
        const THREADS: usize = 16;
        const TURNS: u64 = 25;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = SqliteStore::open(&path).unwrap();
        let ids: Vec<String> = (0..THREADS).map(|i| format!("s{i}")).collect();
        for id in &ids {
            store.create(&row(id)).unwrap();
        }
        let before = store.batches.load(Ordering::Relaxed);
        std::thread::scope(|scope| {
            // The first writes queue behind a busy connection, so at least that batch is
            // shared whatever the scheduling.
            let busy = store.writer();
            for id in &ids {
                let store = &store;
                scope.spawn(move || {
                    for turn in 1..=TURNS {
                        commit_turn(store, id, turn).unwrap_or_else(|e| panic!("{id} {turn}: {e}"));
                    }
                });
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while store.queue().len() < THREADS {
                assert!(std::time::Instant::now() < deadline, "the writes never queued");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            drop(busy);
        });
        let batches = store.batches.load(Ordering::Relaxed) - before;
        let writes = THREADS as u64 * TURNS;
        assert!(batches < writes, "{batches} transactions for {writes} writes");
        drop(store);
        let store = SqliteStore::open(&path).unwrap();
        for id in &ids {
            let loaded = store.load(id).unwrap().unwrap();
            assert_eq!(loaded.row.turn, TURNS, "{id}");
            assert_eq!(loaded.working.len(), TURNS as usize, "{id}");
            let transcript = store.transcript(id, 1, 100).unwrap();
            assert_eq!(transcript.len(), TURNS as usize, "{id}");
            for (t, r) in transcript.iter().enumerate() {
                assert_eq!(
                    r.message,
                    format!(r#"{{"role":"user","content":"{id} {}"}}"#, t + 1)
                );
            }
        }
    }
}
