//! The store: what a session keeps between turns and across restarts (docs/sessions.md).
//!
//! [`Store`] is what the session service needs from a store; [`SqliteStore`] is the
//! embedded implementation. A store never interprets messages: it keeps their JSON text.
//! The transcript is append-only; the working history is a list of [`WorkingRef`]s —
//! transcript rows, or copies for the messages whose bytes differ from their transcript
//! original — so a turn writes its new messages and changed copies, not the whole history.
//! Beside the sessions, a store keeps the summarizer's answers by key, for every session
//! and across restarts ([`Store::summary`]).

mod pg;
mod sqlite;

use std::path::Path;
use std::time::Duration;

use history_engine::StoreLimits;

pub use pg::{round_trips, shown, PgStore};
pub use sqlite::SqliteStore;

/// A store failure: the operation did not happen (a transaction is rolled back whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    pub message: String,
    /// The store cannot be reached now (a database server down or unreachable): the
    /// operation may succeed later.
    pub unavailable: bool,
}

impl StoreError {
    pub fn new(message: impl Into<String>) -> StoreError {
        StoreError {
            message: message.into(),
            unavailable: false,
        }
    }

    pub fn unavailable(message: impl Into<String>) -> StoreError {
        StoreError {
            message: message.into(),
            unavailable: true,
        }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.unavailable {
            write!(f, "store unavailable: {}", self.message)
        } else {
            write!(f, "store: {}", self.message)
        }
    }
}

/// Whether `location` (the configuration's `store`, or `--store`) names a PostgreSQL
/// database rather than a SQLite file.
pub fn is_postgres(location: &Path) -> bool {
    location
        .to_str()
        .is_some_and(|s| s.starts_with("postgres://") || s.starts_with("postgresql://"))
}

/// Opens the store `location` names: a `postgres://` URL, or a SQLite file. `lock_wait`
/// is how long a session's lock is waited for on a shared store; `limits` bound every
/// other wait (`[store]`, docs/configuration.md#store).
pub fn open(location: &Path, lock_wait: Duration, limits: StoreLimits) -> Result<Box<dyn Store>, StoreError> {
    if is_postgres(location) {
        let url = location.to_str().unwrap_or_default();
        Ok(Box::new(PgStore::open(url, lock_wait, limits)?))
    } else {
        Ok(Box::new(SqliteStore::open_waiting(
            location,
            limits.statement_timeout,
        )?))
    }
}

impl std::error::Error for StoreError {}

/// The summarizer's cache kept in a store (docs/plugins.md#the-summarizer): what the
/// session service installs, so a text is summarized once across sessions and restarts.
/// A store error is a log line and a miss: it costs a summarizer call, not a turn.
pub struct StoreSummaries(pub std::sync::Arc<dyn Store>);

impl history_engine::summarizer::SummaryCache for StoreSummaries {
    fn get(&self, key: &str) -> Option<String> {
        self.0.summary(key).unwrap_or_else(|e| {
            tracing::warn!("summarizer cache: cannot read a summary: {e}");
            None
        })
    }

    fn put(&self, key: &str, summary: &str) {
        if let Err(e) = self.0.put_summary(key, summary) {
            tracing::warn!("summarizer cache: cannot keep a summary: {e}");
        }
    }
}

/// One session's row: everything but its messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub id: String,
    pub model: String,
    pub effective_ctx: u64,
    /// The last turn run (0 before the first).
    pub turn: u64,
    /// Messages in the transcript; the next one entering is number `transcript_len + 1`.
    pub transcript_len: u64,
    /// The transcript's length at the last `/clear` (0: never cleared).
    pub cleared_at: u64,
    /// The session's expiration override as JSON (see docs/sessions.md), if any.
    pub expiration_override: Option<String>,
    /// Unix time in milliseconds.
    pub created_at: u64,
    pub last_active: u64,
    /// The next free key for a working copy.
    pub next_copy: u64,
    /// Counts the session's changes: a write carries its row with the version it makes,
    /// one more than the stored one. A shared store refuses a write whose version does
    /// not follow the stored one; the embedded store keeps none (always 0 when read).
    pub version: u64,
}

impl SessionRow {
    /// The row of a session just created at `now` on `model`: nothing entered yet, no
    /// override, version 0.
    pub fn new(id: String, model: String, effective_ctx: u64, now: u64) -> SessionRow {
        SessionRow {
            id,
            model,
            effective_ctx,
            turn: 0,
            transcript_len: 0,
            cleared_at: 0,
            expiration_override: None,
            created_at: now,
            last_active: now,
            next_copy: 1,
            version: 0,
        }
    }
}

/// One entry of a stored working history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkingRef {
    /// Transcript message `seq`, byte for byte.
    Transcript(u64),
    /// Working copy `key` (a changed copy of a transcript message, or a message a plugin
    /// made).
    Copy(u64),
}

/// A transcript row: message `seq` (from 1) of a session, which entered at `turn`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranscriptRow {
    pub seq: u64,
    pub turn: u64,
    /// The message's JSON text.
    pub message: String,
    /// The message's token counts, as far as they are known ([`TokenCounts`]).
    pub tokens: TokenCounts,
}

/// A working copy: a message of the working history whose bytes are not its transcript
/// original's. `seq` is the transcript message it is a copy of (none for a message a
/// plugin made).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyRow {
    pub key: u64,
    pub seq: Option<u64>,
    pub message: String,
    pub tokens: TokenCounts,
}

/// A stored message's token counts, one per tokenizer a host counted it with, kept beside
/// its text as `tokenizer:count` pairs (`o200k_base:812,chars4:1020`); `None` when none is
/// known. The store keeps the text as it keeps messages, uninterpreted; the session reads
/// and writes it (docs/sessions.md#the-store).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenCounts(pub Option<String>);

/// A message of a stored working history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub reference: WorkingRef,
    /// The transcript message it is, or is a copy of (none for a message a plugin made).
    pub seq: Option<u64>,
    /// Its JSON text; `None` where it was not read ([`StoredSession`]).
    pub text: Option<String>,
    pub tokens: TokenCounts,
}

/// What one change of a session writes, in one transaction: its row, the transcript rows
/// that entered, the working history (references) and the copies added and dropped.
#[derive(Debug, Clone, Default)]
pub struct SessionWrite<'a> {
    pub row: Option<&'a SessionRow>,
    pub transcript: &'a [TranscriptRow],
    pub working: &'a [WorkingRef],
    pub new_copies: &'a [CopyRow],
    pub dropped_copies: &'a [u64],
    /// The last sent history as [`encode_sent`] writes it (`None`: none, as after `/clear`).
    pub sent: Option<&'a str>,
}

/// A session as stored: its row, its working history with the messages it references,
/// in order, and its last sent history (one JSON text per message) with its encoding as
/// stored.
///
/// A text is `None` where it was not read: a working message whose reference the reader
/// said it holds already ([`HostCopy`]), and a sent message that is one of the working
/// history's or that the reader holds. A transcript message or a stored copy never
/// changes under its reference (the transcript is append-only; a changed copy gets a new
/// key), so what a host holds under a reference is what the store holds.
#[derive(Debug, Clone)]
pub struct StoredSession {
    pub row: SessionRow,
    pub working: Vec<StoredMessage>,
    pub sent: Option<StoredSent>,
}

/// A stored sent history: its encoding ([`encode_sent`]) and one text per message (see
/// [`StoredSession`]).
pub type StoredSent = (String, Vec<Option<String>>);

/// What a host holds of a session in memory, told to [`Store::lock`]: the version it
/// has, and the references of the messages it has parsed, which a read-back need not
/// send again (docs/scaling-out.md#what-is-shared-what-each-host-keeps).
#[derive(Debug, Clone, Default)]
pub struct HostCopy {
    pub version: u64,
    pub refs: Vec<WorkingRef>,
}

/// One session's lock on a shared store, held for one operation on it: no other host
/// runs an operation on that session meanwhile. Loads and commits go through the lock
/// (one connection, the lock's). Dropping it releases the lock.
pub trait SessionLock: Send {
    /// The session's version as stored when the lock was taken; `None`: no such session.
    fn version(&self) -> Option<u64>;
    /// The session as stored now.
    fn load(&mut self) -> Result<Option<StoredSession>, StoreError>;
    /// Writes one change of the locked session, in one transaction.
    fn commit(&mut self, write: &SessionWrite<'_>) -> Result<(), StoreError>;
}

/// What taking a session's lock gave.
pub enum Locked {
    /// Not a shared store: the host's own per-session lock is enough.
    NotShared,
    /// Another host held the lock longer than the wait.
    Busy,
    Held(Box<dyn SessionLock>),
}

/// What the session service needs from a store. Every method is one transaction: it
/// happens whole or not at all, and a method that returned `Ok` is durable.
pub trait Store: Send + Sync {
    /// Adds a new session (its row, an empty transcript and working history).
    fn create(&self, row: &SessionRow) -> Result<(), StoreError>;
    /// Writes one change of a session (a turn, a model switch, `/clear`, an expansion).
    fn commit(&self, write: &SessionWrite<'_>) -> Result<(), StoreError>;
    /// Sets `effective_ctx` of several sessions at once.
    fn set_effective_ctx(&self, sessions: &[(String, u64)]) -> Result<(), StoreError>;
    /// Deletes everything stored of a session; `false` if there was no such session.
    fn delete(&self, id: &str) -> Result<bool, StoreError>;
    /// Every stored session's row, with the size of its working history.
    fn sessions(&self) -> Result<Vec<(SessionRow, usize)>, StoreError>;
    /// A session with its working history, or `None`.
    fn load(&self, id: &str) -> Result<Option<StoredSession>, StoreError>;
    /// Up to `limit` transcript rows of a session from `from` (a seq, from 1).
    fn transcript(&self, id: &str, from: u64, limit: u64) -> Result<Vec<TranscriptRow>, StoreError>;
    /// Whether the store can take a write now (for health).
    fn check_writable(&self) -> Result<(), StoreError>;
    /// The summary kept under `key` (the summarizer's cache, docs/plugins.md#the-summarizer).
    fn summary(&self, key: &str) -> Result<Option<String>, StoreError>;
    /// Keeps `summary` under `key`; a summary already kept there stays.
    fn put_summary(&self, key: &str, summary: &str) -> Result<(), StoreError>;

    /// Whether several hosts may share the store: then what a host keeps in memory may
    /// be stale, and each operation takes the session's lock ([`Store::lock`]).
    fn shared(&self) -> bool {
        false
    }
    /// Takes session `id`'s lock across hosts, waiting at most the store's lock wait.
    /// `held` is what this host holds of the session in memory: a store may read the
    /// session with the lock when the stored version differs, leaving out the messages
    /// the host holds, for [`SessionLock::load`] to return.
    fn lock(&self, _id: &str, _held: Option<&HostCopy>) -> Result<Locked, StoreError> {
        Ok(Locked::NotShared)
    }
    /// Adds a new session unless `max_users` sessions are stored already (then
    /// `Ok(Err(count))`), counting and adding in one transaction. Only a shared store
    /// needs this: a host with the embedded store counts its sessions in memory.
    fn create_limited(&self, row: &SessionRow, _max_users: u64) -> Result<Result<(), u64>, StoreError> {
        self.create(row).map(Ok)
    }
    /// Deletes the sessions idle since before `cutoff_ms` (Unix ms) whose lock no host
    /// holds, and returns their ids: on a shared store every host reaps, none twice.
    fn reap(&self, _cutoff_ms: u64) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }
    /// The session's row and working history size, if stored.
    fn row(&self, id: &str) -> Result<Option<(SessionRow, usize)>, StoreError> {
        Ok(self.load(id)?.map(|s| (s.row, s.working.len())))
    }
}

/// A working history's references as text: runs of consecutive transcript rows as
/// `a-b`, single ones as `n`, copies as `cK`, comma-separated. A session's working history
/// is mostly a few runs of the transcript, so this stays short however long it is.
pub fn encode_working(refs: &[WorkingRef]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < refs.len() {
        if !out.is_empty() {
            out.push(',');
        }
        match refs[i] {
            WorkingRef::Copy(key) => {
                out.push('c');
                out.push_str(&key.to_string());
                i += 1;
            }
            WorkingRef::Transcript(first) => {
                let mut last = first;
                let mut j = i + 1;
                while j < refs.len() && refs[j] == WorkingRef::Transcript(last + 1) {
                    last += 1;
                    j += 1;
                }
                out.push_str(&first.to_string());
                if last > first {
                    out.push('-');
                    out.push_str(&last.to_string());
                }
                i = j;
            }
        }
    }
    out
}

/// One entry of a stored sent history (docs/sessions.md#the-store): a message of the
/// working history it was sent from, by its reference, or — a message only the view
/// stages or the turn's display context made — its JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SentEntry {
    Ref(WorkingRef),
    Inline(String),
}

/// A sent history as text: a first line of references as [`encode_working`] writes them,
/// with `mN` for the N-th message given whole, then those messages one a line (compact
/// JSON has no raw newline). Mostly references, so a turn writes a short line.
pub fn encode_sent(entries: &[SentEntry]) -> String {
    let mut refs = Vec::new();
    let mut items: Vec<String> = Vec::new();
    let mut inline: Vec<&str> = Vec::new();
    for entry in entries {
        match entry {
            SentEntry::Ref(r) => refs.push(*r),
            SentEntry::Inline(text) => {
                if !refs.is_empty() {
                    items.push(encode_working(&std::mem::take(&mut refs)));
                }
                items.push(format!("m{}", inline.len()));
                inline.push(text);
            }
        }
    }
    if !refs.is_empty() {
        items.push(encode_working(&refs));
    }
    let mut out = items.join(",");
    for text in inline {
        out.push('\n');
        out.push_str(text);
    }
    out
}

/// The inverse of [`encode_sent`].
pub fn decode_sent(text: &str) -> Result<Vec<SentEntry>, StoreError> {
    let bad = || StoreError::new("bad sent history in the store".to_string());
    let mut lines = text.split('\n');
    let refs = lines.next().unwrap_or_default();
    let inline: Vec<&str> = lines.collect();
    let mut entries = Vec::new();
    for item in refs.split(',').filter(|s| !s.is_empty()) {
        if let Some(index) = item.strip_prefix('m') {
            let index: usize = index.parse().map_err(|_| bad())?;
            entries.push(SentEntry::Inline(inline.get(index).ok_or_else(bad)?.to_string()));
        } else {
            entries.extend(decode_working(item)?.into_iter().map(SentEntry::Ref));
        }
    }
    Ok(entries)
}

/// A stored sent history's messages ([`StoredSession::sent`]): a reference the working
/// history has, or that the reader holds (`held`), is left unread (`None`); any other is
/// asked of `fetch` (a transcript row, or a copy kept for it).
pub(crate) fn resolve_sent(
    sent: Option<String>,
    working: &[StoredMessage],
    held: Option<&HostCopy>,
    mut fetch: impl FnMut(WorkingRef) -> Result<Option<String>, StoreError>,
) -> Result<Option<StoredSent>, StoreError> {
    let Some(sent) = sent else {
        return Ok(None);
    };
    let unread: std::collections::HashSet<WorkingRef> = working
        .iter()
        .map(|m| m.reference)
        .chain(held.into_iter().flat_map(|h| h.refs.iter().copied()))
        .collect();
    let mut messages = Vec::new();
    for entry in decode_sent(&sent)? {
        messages.push(match entry {
            SentEntry::Inline(text) => Some(text),
            SentEntry::Ref(r) if unread.contains(&r) => None,
            SentEntry::Ref(r) => Some(fetch(r)?.ok_or_else(|| {
                StoreError::new(format!("sent history entry {r:?} is missing from the store"))
            })?),
        });
    }
    Ok(Some((sent, messages)))
}

/// The inverse of [`encode_working`].
pub fn decode_working(text: &str) -> Result<Vec<WorkingRef>, StoreError> {
    let bad = || StoreError::new(format!("bad working history references {text:?}"));
    let mut refs = Vec::new();
    for item in text.split(',').filter(|s| !s.is_empty()) {
        if let Some(key) = item.strip_prefix('c') {
            refs.push(WorkingRef::Copy(key.parse().map_err(|_| bad())?));
        } else if let Some((a, b)) = item.split_once('-') {
            let (a, b): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            if b < a {
                return Err(bad());
            }
            refs.extend((a..=b).map(WorkingRef::Transcript));
        } else {
            refs.push(WorkingRef::Transcript(item.parse().map_err(|_| bad())?));
        }
    }
    Ok(refs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn working_references_encode_as_runs() {
        use WorkingRef::{Copy, Transcript};
        let refs = [
            Transcript(1),
            Transcript(2),
            Copy(4),
            Transcript(7),
            Transcript(9),
            Transcript(10),
            Transcript(11),
        ];
        assert_eq!(encode_working(&refs), "1-2,c4,7,9-11");
        assert_eq!(decode_working("1-2,c4,7,9-11").unwrap(), refs);
        assert_eq!(decode_working("").unwrap(), []);
        assert!(decode_working("3-1").is_err());
        assert!(decode_working("x").is_err());
    }

    #[test]
    fn a_sent_history_encodes_as_references_and_whole_messages() {
        use WorkingRef::{Copy, Transcript};
        let entries = [
            SentEntry::Ref(Transcript(1)),
            SentEntry::Ref(Transcript(2)),
            SentEntry::Inline(r#"{"role":"user","content":"a\nb"}"#.into()),
            SentEntry::Ref(Copy(3)),
            SentEntry::Ref(Transcript(4)),
            SentEntry::Inline("{}".into()),
        ];
        let text = encode_sent(&entries);
        assert_eq!(
            text,
            "1-2,m0,c3,4,m1\n{\"role\":\"user\",\"content\":\"a\\nb\"}\n{}"
        );
        assert_eq!(decode_sent(&text).unwrap(), entries);
        assert_eq!(decode_sent("").unwrap(), []);
        assert!(decode_sent("m0").is_err(), "a message the text lacks");
        assert!(decode_sent("1,q").is_err());
    }
}
