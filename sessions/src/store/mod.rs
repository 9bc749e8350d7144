//! The store: what a session keeps between turns and across restarts (docs/sessions.md).
//!
//! [`Store`] is what the session service needs from a store; [`SqliteStore`] is the
//! embedded implementation. A store never interprets messages: it keeps their JSON text.
//! The transcript is append-only; the working history is a list of [`WorkingRef`]s —
//! transcript rows, or copies for the messages whose bytes differ from their transcript
//! original — so a turn writes its new messages and changed copies, not the whole history.

mod sqlite;

pub use sqlite::SqliteStore;

/// A store failure: the operation did not happen (a transaction is rolled back whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "store: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

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
}

/// A working copy: a message of the working history whose bytes are not its transcript
/// original's. `seq` is the transcript message it is a copy of (none for a message a
/// plugin made).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyRow {
    pub key: u64,
    pub seq: Option<u64>,
    pub message: String,
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
}

/// A session as stored: its row, its working history with the messages it references
/// (`(reference, copy's seq, JSON text)` in order).
#[derive(Debug, Clone)]
pub struct StoredSession {
    pub row: SessionRow,
    pub working: Vec<(WorkingRef, Option<u64>, String)>,
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

/// The inverse of [`encode_working`].
pub fn decode_working(text: &str) -> Result<Vec<WorkingRef>, StoreError> {
    let bad = || StoreError(format!("bad working history references {text:?}"));
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
}
