//! The statements of the PostgreSQL store's turns, and how values go into them and
//! answers come out: prepared once per pooled connection (all in one round trip), every
//! value a typed parameter, a turn's statements pipelined (`super::lock`,
//! docs/scaling-out.md#round-trips).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{Client, Row, SimpleQueryMessage, Statement};

use crate::store::{
    decode_working, encode_working, resolve_sent, HostCopy, SessionRow, SessionWrite, StoreError,
    StoredMessage, StoredSession, TokenCounts, WorkingRef,
};

/// The advisory lock key of session `id`, computed by the server.
pub(super) const SESSION_KEY: &str = "hashtextextended('history-session:' || $1, 0)";

pub(super) const ROW_COLUMNS: &str = "id, model, effective_ctx, turn, transcript_len, cleared_at, \
     expiration_override, created_at, last_active, next_copy, working, version";

/// The statements a turn runs, prepared once on each pooled connection as it opens
/// (`bounded::Shared::pooled`): the server then parses and plans each once per
/// connection, not once per turn — most of its CPU otherwise
/// (docs/scaling-out.md#round-trips).
pub(super) struct Statements {
    /// Session `$1`'s advisory lock, taken and given back.
    pub(super) lock: Statement,
    pub(super) unlock: Statement,
    /// `statement_timeout` `$1` and `lock_timeout` `$2` (milliseconds, as text) for the
    /// lock's wait, and back to the connection's own.
    pub(super) set_timeouts: Statement,
    /// The connection's start-up `statement_timeout` and `lock_timeout`, what `RESET`
    /// would set them back to: read once as it opens, so a reset is `set_timeouts` with
    /// them (reading `pg_settings` on every lock cost the database a third of a turn).
    pub(super) reset_values: [String; 2],
    /// Session `$1`'s stored version.
    pub(super) version: Statement,
    /// The session's row, and the transcript rows and copies its histories reference,
    /// when its version is not `$2` (NULL: always), leaving out the transcript runs from
    /// `$3` to `$4` and the copies in `$3` (keys): [`Reads`].
    pub(super) read_row: Statement,
    pub(super) read_transcript: Statement,
    pub(super) read_copies: Statement,
    /// One change of a session: [`write`].
    pub(super) write: Statement,
}

const LOCK: &str = "SELECT pg_advisory_lock(hashtextextended('history-session:' || $1, 0))";
const UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended('history-session:' || $1, 0))";
const SET_TIMEOUTS: &str =
    "SELECT set_config('statement_timeout', $1, false), set_config('lock_timeout', $2, false)";
/// The connection's start-up timeouts, read as it opens.
const START_TIMEOUTS: &str = "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')";
const VERSION: &str = "SELECT version FROM sessions WHERE id = $1";
const READ_TRANSCRIPT: &str = "SELECT n.seq, t.message, t.tokens \
     FROM (SELECT range_agg(int8range(split_part(item, '-', 1)::bigint, \
               COALESCE(NULLIF(split_part(item, '-', 2), ''), split_part(item, '-', 1))::bigint, '[]')) \
           FROM sessions s, unnest(string_to_array( \
               s.working || ',' || COALESCE(split_part(s.sent, E'\\n', 1), ''), ',')) AS item \
           WHERE s.id = $1 AND s.version IS DISTINCT FROM $2 AND item ~ '^[0-9]') AS w(wanted), \
       LATERAL unnest(w.wanted - COALESCE((SELECT range_agg(int8range(h.low, h.high, '[]')) \
           FROM unnest($3::bigint[], $4::bigint[]) AS h(low, high)), '{}'::int8multirange)) AS r(run), \
       LATERAL generate_series(lower(r.run), upper(r.run) - 1) AS n(seq), \
       LATERAL (SELECT message, tokens FROM transcript \
                WHERE session_id = $1 AND seq = n.seq OFFSET 0) AS t";
const READ_COPIES: &str = "SELECT key, seq, message, tokens FROM working_copies \
     WHERE session_id = $1 AND key <> ALL($3) \
     AND EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND version IS DISTINCT FROM $2)";
const WRITE: &str = "WITH u AS (UPDATE sessions SET model = $2, effective_ctx = $3, turn = $4, \
         transcript_len = $5, cleared_at = $6, expiration_override = $7, last_active = $8, \
         next_copy = $9, working = $10, sent = $11, version = $12 \
         WHERE id = $1 AND version = $12 - 1 RETURNING id), \
       t AS (INSERT INTO transcript (session_id, seq, turn, message, tokens) \
         SELECT u.id, v.seq, v.turn, v.message, v.tokens \
         FROM u, unnest($13::bigint[], $14::bigint[], $15::text[], $16::text[]) AS v(seq, turn, message, tokens)), \
       c AS (INSERT INTO working_copies (session_id, key, seq, message, tokens) \
         SELECT u.id, v.key, v.seq, v.message, v.tokens \
         FROM u, unnest($17::bigint[], $18::bigint[], $19::text[], $20::text[]) AS v(key, seq, message, tokens)), \
       d AS (DELETE FROM working_copies WHERE session_id IN (SELECT id FROM u) AND key = ANY($21)) \
     SELECT count(*) FROM u";

/// The connection's settings and every statement of [`Statements`], pipelined: one round
/// trip (the caller counts it).
pub(super) async fn prepare(client: &Client) -> Result<Statements, tokio_postgres::Error> {
    use Type as T;
    let read_row =
        format!("SELECT {ROW_COLUMNS}, sent FROM sessions WHERE id = $1 AND version IS DISTINCT FROM $2");
    let write_types = [
        T::TEXT,
        T::TEXT,
        T::INT8,
        T::INT8,
        T::INT8,
        T::INT8,
        T::TEXT,
        T::INT8,
        T::INT8,
        T::TEXT,
        T::TEXT,
        T::INT8,
        T::INT8_ARRAY,
        T::INT8_ARRAY,
        T::TEXT_ARRAY,
        T::TEXT_ARRAY,
        T::INT8_ARRAY,
        T::INT8_ARRAY,
        T::TEXT_ARRAY,
        T::TEXT_ARRAY,
        T::INT8_ARRAY,
    ];
    let (
        settings,
        lock,
        unlock,
        set_timeouts,
        start_timeouts,
        version,
        read_row,
        read_transcript,
        read_copies,
        write,
    ) = tokio::join!(
        client.batch_execute("SET jit = off; SET plan_cache_mode = force_generic_plan"),
        client.prepare_typed(LOCK, &[T::TEXT]),
        client.prepare_typed(UNLOCK, &[T::TEXT]),
        client.prepare_typed(SET_TIMEOUTS, &[T::TEXT, T::TEXT]),
        client.simple_query(START_TIMEOUTS),
        client.prepare_typed(VERSION, &[T::TEXT]),
        client.prepare_typed(&read_row, &[T::TEXT, T::INT8]),
        client.prepare_typed(READ_TRANSCRIPT, &[T::TEXT, T::INT8, T::INT8_ARRAY, T::INT8_ARRAY]),
        client.prepare_typed(READ_COPIES, &[T::TEXT, T::INT8, T::INT8_ARRAY]),
        client.prepare_typed(WRITE, &write_types),
    );
    settings?;
    Ok(Statements {
        lock: lock?,
        unlock: unlock?,
        set_timeouts: set_timeouts?,
        reset_values: start_values(&start_timeouts?)?,
        version: version?,
        read_row: read_row?,
        read_transcript: read_transcript?,
        read_copies: read_copies?,
        write: write?,
    })
}

/// The two start-up timeouts from [`START_TIMEOUTS`]' answer.
fn start_values(answer: &[SimpleQueryMessage]) -> Result<[String; 2], tokio_postgres::Error> {
    // (A missing answer keeps the server's default, no timeout.)
    let row = answer.iter().find_map(|message| match message {
        SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    let value = |i: usize| {
        row.and_then(|row| row.get(i))
            .map(str::to_string)
            .unwrap_or_else(|| "0".to_string())
    };
    Ok([value(0), value(1)])
}

/// PostgreSQL round trips this process made to its store (each message sent and its answer
/// waited for), for `history_store_round_trips_total` (docs/scaling-out.md#round-trips).
pub(super) static ROUND_TRIPS: AtomicU64 = AtomicU64::new(0);

/// The round trips made so far.
pub fn round_trips() -> u64 {
    ROUND_TRIPS.load(Ordering::Relaxed)
}

/// Counts `n` round trips. A statement given as text with parameters costs two (the
/// client prepares it, then runs it); statements sent together and waited for together
/// (pipelined, or one simple query), one.
pub(super) fn trips(n: u64) {
    ROUND_TRIPS.fetch_add(n, Ordering::Relaxed);
}

/// A statement's typed parameters.
pub(super) type Params<'a, const N: usize> = [&'a (dyn ToSql + Sync); N];

/// Column `i` of `row`, or an error naming it (never a panic on what the database sent).
pub(super) fn col<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T, StoreError> {
    row.try_get(i)
        .map_err(|e| StoreError::new(format!("the store answered a bad value in column {i}: {e}")))
}

fn count(row: &Row, i: usize) -> Result<u64, StoreError> {
    col::<i64>(row, i).map(|v| v as u64)
}

/// Numbers as bigints (what the store keeps is below `i64::MAX`).
fn big(v: u64) -> i64 {
    v as i64
}

/// One session write's parameters, owned (the write runs on the store's runtime), for
/// [`Statements::write`]: the row's update, refused unless `row.version` follows the
/// stored version, and the transcript rows and copies added and dropped, each only if
/// the update happened (they read its result). It answers 1 when written, 0 when refused
/// (then nothing is).
pub(super) struct WriteParams {
    row: SessionRow,
    working: String,
    sent: Option<String>,
    t_seq: Vec<i64>,
    t_turn: Vec<i64>,
    t_message: Vec<String>,
    t_tokens: Vec<Option<String>>,
    c_key: Vec<i64>,
    c_seq: Vec<Option<i64>>,
    c_message: Vec<String>,
    c_tokens: Vec<Option<String>>,
    dropped: Vec<i64>,
}

impl WriteParams {
    pub(super) fn new(write: &SessionWrite<'_>) -> Result<WriteParams, StoreError> {
        let Some(row) = write.row else {
            return Err(StoreError::new("a session write needs its row"));
        };
        let (transcript, copies) = (write.transcript, write.new_copies);
        Ok(WriteParams {
            row: row.clone(),
            working: encode_working(write.working),
            sent: write.sent.map(str::to_string),
            t_seq: transcript.iter().map(|t| big(t.seq)).collect(),
            t_turn: transcript.iter().map(|t| big(t.turn)).collect(),
            t_message: transcript.iter().map(|t| t.message.clone()).collect(),
            t_tokens: transcript.iter().map(|t| t.tokens.0.clone()).collect(),
            c_key: copies.iter().map(|c| big(c.key)).collect(),
            c_seq: copies.iter().map(|c| c.seq.map(big)).collect(),
            c_message: copies.iter().map(|c| c.message.clone()).collect(),
            c_tokens: copies.iter().map(|c| c.tokens.0.clone()).collect(),
            dropped: write.dropped_copies.iter().copied().map(big).collect(),
        })
    }

    /// The write on `client` (the caller counts the round trip).
    pub(super) async fn run(
        &self,
        client: &Client,
        statements: &Statements,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let row = &self.row;
        client
            .query(
                &statements.write,
                &[
                    &row.id,
                    &row.model,
                    &big(row.effective_ctx),
                    &big(row.turn),
                    &big(row.transcript_len),
                    &big(row.cleared_at),
                    &row.expiration_override,
                    &big(row.last_active),
                    &big(row.next_copy),
                    &self.working,
                    &self.sent,
                    &big(row.version),
                    &self.t_seq,
                    &self.t_turn,
                    &self.t_message,
                    &self.t_tokens,
                    &self.c_key,
                    &self.c_seq,
                    &self.c_message,
                    &self.c_tokens,
                    &self.dropped,
                ],
            )
            .await
    }
}

/// Whether the write answered `rows` happened: [`write`] answers 1 when written and 0 when
/// refused (its version does not follow the stored one, or the session is gone). `id` is
/// the session's, for the message.
pub(super) fn check_written(rows: &[Row], id: &str) -> Result<(), StoreError> {
    let written = rows.first().map(|r| count(r, 0)).transpose()?;
    if written != Some(1) {
        return Err(StoreError::new(format!(
            "session {id} changed on another host, or is gone: nothing written"
        )));
    }
    Ok(())
}

/// The parameters that read session `id` (its row, then the transcript rows and copies
/// its working and sent histories reference) when its stored version is not the one the
/// host holds (`held`; `None`: always), leaving out the messages the host holds. The
/// references are expanded by the server from the row itself, so the row and its
/// messages come back in one round trip.
pub(super) struct Reads {
    id: String,
    version: Option<i64>,
    low: Vec<i64>,
    high: Vec<i64>,
    keys: Vec<i64>,
}

/// A session's three reads' rows: its row, transcript rows, copies.
pub(super) type ReadRows = (Vec<Row>, Vec<Row>, Vec<Row>);

impl Reads {
    pub(super) fn new(id: &str, held: Option<&HostCopy>) -> Reads {
        let (version, runs, keys) = match held {
            Some(held) => {
                let seqs = held.refs.iter().filter_map(|r| match r {
                    WorkingRef::Transcript(seq) => Some(*seq),
                    WorkingRef::Copy(_) => None,
                });
                let keys = held.refs.iter().filter_map(|r| match r {
                    WorkingRef::Copy(key) => Some(big(*key)),
                    WorkingRef::Transcript(_) => None,
                });
                (
                    Some(big(held.version)),
                    seq_ranges(seqs.collect()),
                    keys.collect(),
                )
            }
            None => (None, Vec::new(), Vec::new()),
        };
        Reads {
            id: id.to_string(),
            version,
            low: runs.iter().map(|r| r.0).collect(),
            high: runs.iter().map(|r| r.1).collect(),
            keys,
        }
    }

    /// The three reads, pipelined on `client` (the caller counts the round trip, with
    /// whatever else it sends alongside).
    pub(super) async fn run(
        &self,
        client: &Client,
        statements: &Statements,
    ) -> Result<ReadRows, tokio_postgres::Error> {
        let row: Params<2> = [&self.id, &self.version];
        let transcript: Params<4> = [&self.id, &self.version, &self.low, &self.high];
        let copies: Params<3> = [&self.id, &self.version, &self.keys];
        let (row, transcript, copies) = tokio::join!(
            client.query(&statements.read_row, &row),
            client.query(&statements.read_transcript, &transcript),
            client.query(&statements.read_copies, &copies),
        );
        Ok((row?, transcript?, copies?))
    }
}

/// Transcript seqs as runs of consecutive seqs, each `(first, last)`, so the server
/// subtracts what a host holds from what a session references in a few range
/// operations, however long the session.
pub(super) fn seq_ranges(mut seqs: Vec<u64>) -> Vec<(i64, i64)> {
    seqs.sort_unstable();
    seqs.dedup();
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < seqs.len() {
        let mut j = i;
        while j + 1 < seqs.len() && seqs[j + 1] == seqs[j] + 1 {
            j += 1;
        }
        ranges.push((big(seqs[i]), big(seqs[j])));
        i = j + 1;
    }
    ranges
}

/// A session row from `row` (the columns of [`ROW_COLUMNS`]) and its working history's
/// encoded references.
pub(super) fn session_row(r: &Row) -> Result<(SessionRow, String), StoreError> {
    Ok((
        SessionRow {
            id: col(r, 0)?,
            model: col(r, 1)?,
            effective_ctx: count(r, 2)?,
            turn: count(r, 3)?,
            transcript_len: count(r, 4)?,
            cleared_at: count(r, 5)?,
            expiration_override: col(r, 6)?,
            created_at: count(r, 7)?,
            last_active: count(r, 8)?,
            next_copy: count(r, 9)?,
            version: count(r, 11)?,
        },
        col(r, 10)?,
    ))
}

/// A session from the rows of [`Reads::run`]; `None` if its row is not there.
pub(super) fn session_of(
    id: &str,
    (rows, transcript_rows, copy_rows): &ReadRows,
    held: Option<&HostCopy>,
) -> Result<Option<StoredSession>, StoreError> {
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    let (row, working) = session_row(r)?;
    let refs = decode_working(&working)?;
    let sent: Option<String> = col(r, 12)?;
    // Each message read: its seq (a copy's may be none), text and token counts.
    let tokens = |row: &Row, i: usize| col::<Option<String>>(row, i).map(TokenCounts);
    let mut transcript = HashMap::new();
    for t in transcript_rows {
        let seq = count(t, 0)?;
        transcript.insert(seq, (Some(seq), col::<String>(t, 1)?, tokens(t, 2)?));
    }
    let mut copies = HashMap::new();
    for c in copy_rows {
        let seq = col::<Option<i64>>(c, 1)?.map(|v| v as u64);
        copies.insert(count(c, 0)?, (seq, col::<String>(c, 2)?, tokens(c, 3)?));
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

#[cfg(test)]
mod tests {
    use super::seq_ranges;

    #[test]
    fn held_seqs_are_sent_as_runs() {
        assert_eq!(seq_ranges(vec![]), vec![]);
        assert_eq!(
            seq_ranges(vec![7, 1, 2, 3, 9, 10, 2]),
            vec![(1, 3), (7, 7), (9, 10)]
        );
    }
}
