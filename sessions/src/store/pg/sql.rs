//! The statements of the PostgreSQL store's turns, and how values go into them and
//! answers come out: prepared once per pooled connection, run by `EXECUTE` inside simple
//! queries (one round trip each), values written as escaped SQL literals.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use postgres::{SimpleQueryMessage, SimpleQueryRow};
use postgres_protocol::escape::escape_literal;

use crate::store::{
    decode_working, encode_working, resolve_sent, HostCopy, SessionRow, SessionWrite, StoreError,
    StoredMessage, StoredSession, TokenCounts, WorkingRef,
};

/// The advisory lock key of session `id`, computed by the server.
pub(super) const SESSION_KEY: &str = "hashtextextended('history-session:' || $1, 0)";

pub(super) const ROW_COLUMNS: &str = "id, model, effective_ctx, turn, transcript_len, cleared_at, \
     expiration_override, created_at, last_active, next_copy, working, version";

/// The statements a turn runs, prepared once on each pooled connection as it opens
/// (`bounded::Shared::connect`) and run by `EXECUTE` inside the turn's simple queries: the
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
pub(super) fn prepare_sql() -> &'static str {
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

/// PostgreSQL round trips this process made to its store (each message sent and its answer
/// waited for), for `history_store_round_trips_total` (docs/scaling-out.md#round-trips).
pub(super) static ROUND_TRIPS: AtomicU64 = AtomicU64::new(0);

/// The round trips made so far.
pub fn round_trips() -> u64 {
    ROUND_TRIPS.load(Ordering::Relaxed)
}

/// Counts `n` round trips. A statement given as text with parameters costs two (the
/// client prepares it, then runs it); a simple query, however many statements it holds,
/// one.
pub(super) fn trips(n: u64) {
    ROUND_TRIPS.fetch_add(n, Ordering::Relaxed);
}

/// Runs `sql` (one or several statements) as one simple query: one round trip. Returns
/// each statement's rows, in order.
pub(super) fn batch(
    c: &mut postgres::Client,
    sql: &str,
) -> Result<Vec<Vec<SimpleQueryRow>>, postgres::Error> {
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
pub(super) fn lit(text: &str) -> String {
    escape_literal(text)
}

pub(super) fn opt_lit(text: Option<&str>) -> String {
    text.map_or_else(|| "NULL".to_string(), lit)
}

/// Column `i` of a simple query's row as a number.
pub(super) fn num(row: &SimpleQueryRow, i: usize) -> Result<u64, StoreError> {
    row.get(i)
        .and_then(|v| v.parse::<i64>().ok())
        .map(|v| v as u64)
        .ok_or_else(|| StoreError::new(format!("the store answered a non-number in column {i}")))
}

pub(super) fn text(row: &SimpleQueryRow, i: usize) -> Result<String, StoreError> {
    row.get(i)
        .map(str::to_string)
        .ok_or_else(|| StoreError::new(format!("the store answered NULL in column {i}")))
}

/// One session write as one statement (`history_write`, [`prepare_sql`]): the row's
/// update, refused unless `row.version` follows the stored version, and the transcript
/// rows and copies added and dropped, each only if the update happened (they read its
/// result). It answers 1 when written, 0 when refused (then nothing is).
pub(super) fn write_statement(write: &SessionWrite<'_>) -> Result<String, StoreError> {
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
pub(super) fn numbers(values: impl Iterator<Item = Option<u64>>) -> String {
    let items: Vec<String> = values
        .map(|v| v.map_or_else(|| "NULL".to_string(), |v| (v as i64).to_string()))
        .collect();
    format!("'{{{}}}'::bigint[]", items.join(","))
}

/// Texts (NULL for `None`) as an SQL `text[]` value, each an escaped literal.
pub(super) fn texts<'a>(values: impl Iterator<Item = Option<&'a str>>) -> String {
    let items: Vec<String> = values.map(opt_lit).collect();
    format!("ARRAY[{}]::text[]", items.join(", "))
}

/// The statements that read session `id` (its row, then the transcript rows and copies
/// its working and sent histories reference) when its stored version is not the one the
/// host holds (`held`; `None`: always), leaving out the messages the host holds. The
/// references are expanded by the server from the row itself (`history_read_*`,
/// [`prepare_sql`]), so the row and its messages come back in one round trip.
pub(super) fn read_statements(id: &str, held: Option<&HostCopy>) -> String {
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
pub(super) fn seq_ranges(mut seqs: Vec<u64>) -> String {
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
pub(super) fn session_of(
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

#[cfg(test)]
mod tests {
    use super::seq_ranges;

    #[test]
    fn held_seqs_are_sent_as_runs() {
        assert_eq!(seq_ranges(vec![]), "'{}'::int8multirange");
        assert_eq!(
            seq_ranges(vec![7, 1, 2, 3, 9, 10, 2]),
            "'{[1,3],[7,7],[9,10]}'::int8multirange"
        );
    }
}
