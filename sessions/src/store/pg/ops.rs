//! The PostgreSQL store's operations besides a session's lock (`super::lock`), each on
//! one pooled connection: statements with typed parameters, in a transaction where an
//! operation has several.

use std::time::Duration;

use tokio_postgres::GenericClient;

use super::bounded::Pooled;
use super::sql::{col, session_of, session_row, trips, Reads, ROW_COLUMNS, SESSION_KEY};
use super::{err, CREATE_LOCK};
use crate::store::{decode_working, SessionRow, StoreError, StoredSession};

/// A session row and its working history's length.
pub(super) fn row_and_len(r: &tokio_postgres::Row) -> Result<(SessionRow, usize), StoreError> {
    let (row, working) = session_row(r)?;
    Ok((row, decode_working(&working)?.len()))
}

pub(super) async fn insert(c: &impl GenericClient, row: &SessionRow) -> Result<(), StoreError> {
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
    .await
    .map_err(err)?;
    Ok(())
}

/// A session with its working and sent histories, read in one snapshot and one round
/// trip (pipelined: BEGIN, the reads, COMMIT).
pub(super) async fn load_on(c: &Pooled, id: &str) -> Result<Option<StoredSession>, StoreError> {
    let reads = Reads::new(id, None);
    trips(1);
    let (begin, read, commit) = tokio::join!(
        c.client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
        reads.run(&c.client, &c.statements),
        c.client.batch_execute("COMMIT"),
    );
    begin.map_err(err)?;
    let rows = read.map_err(err)?;
    commit.map_err(err)?;
    session_of(id, &rows, None)
}

pub(super) async fn delete_on(
    c: &mut Pooled,
    id: &str,
    lock_wait: Duration,
    statement_timeout: Duration,
) -> Result<bool, StoreError> {
    let tx = c.client.transaction().await.map_err(err)?;
    trips(12);
    // Not while an operation on the session runs on another host.
    tx.query(
        "SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true)",
        &[
            &(lock_wait + statement_timeout).as_millis().to_string(),
            &lock_wait.as_millis().max(1).to_string(),
        ],
    )
    .await
    .map_err(err)?;
    tx.execute(&format!("SELECT pg_advisory_xact_lock({SESSION_KEY})"), &[&id])
        .await
        .map_err(err)?;
    let deleted = tx
        .execute("DELETE FROM sessions WHERE id = $1", &[&id])
        .await
        .map_err(err)?;
    tx.execute("DELETE FROM transcript WHERE session_id = $1", &[&id])
        .await
        .map_err(err)?;
    tx.execute("DELETE FROM working_copies WHERE session_id = $1", &[&id])
        .await
        .map_err(err)?;
    tx.commit().await.map_err(err)?;
    Ok(deleted == 1)
}

pub(super) async fn set_effective_ctx_on(
    c: &mut Pooled,
    sessions: &[(String, u64)],
) -> Result<(), StoreError> {
    let tx = c.client.transaction().await.map_err(err)?;
    trips(2 + 2 * sessions.len() as u64);
    for (id, effective_ctx) in sessions {
        tx.execute(
            "UPDATE sessions SET effective_ctx = $2 WHERE id = $1",
            &[id, &(*effective_ctx as i64)],
        )
        .await
        .map_err(err)?;
    }
    tx.commit().await.map_err(err)
}

pub(super) async fn create_limited_on(
    c: &mut Pooled,
    row: &SessionRow,
    max_users: u64,
) -> Result<Result<(), u64>, StoreError> {
    let tx = c.client.transaction().await.map_err(err)?;
    // One creation at a time across hosts, so two cannot both take the last place.
    trips(6);
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK])
        .await
        .map_err(err)?;
    let live: i64 = col(
        &tx.query_one("SELECT count(*) FROM sessions", &[])
            .await
            .map_err(err)?,
        0,
    )?;
    if live as u64 >= max_users {
        return Ok(Err(live as u64));
    }
    insert(&tx, row).await?;
    tx.commit().await.map_err(err)?;
    Ok(Ok(()))
}

/// One pass of the idle reaper. Rows another host is reaping are skipped (SKIP LOCKED),
/// and so are sessions whose operation is running somewhere (their advisory lock is held).
pub(super) async fn reap_on(c: &mut Pooled, cutoff_ms: u64) -> Result<Vec<String>, StoreError> {
    let tx = c.client.transaction().await.map_err(err)?;
    let rows = tx
        .query(
            "SELECT id FROM sessions WHERE last_active < $1 FOR UPDATE SKIP LOCKED",
            &[&(cutoff_ms.min(i64::MAX as u64) as i64)],
        )
        .await
        .map_err(err)?;
    trips(4);
    let mut reaped = Vec::new();
    for r in rows {
        trips(2);
        let id: String = col(&r, 0)?;
        let free: bool = col(
            &tx.query_one(
                &format!("SELECT pg_try_advisory_xact_lock({SESSION_KEY})"),
                &[&id],
            )
            .await
            .map_err(err)?,
            0,
        )?;
        if !free {
            continue;
        }
        trips(6);
        tx.execute("DELETE FROM sessions WHERE id = $1", &[&id])
            .await
            .map_err(err)?;
        tx.execute("DELETE FROM transcript WHERE session_id = $1", &[&id])
            .await
            .map_err(err)?;
        tx.execute("DELETE FROM working_copies WHERE session_id = $1", &[&id])
            .await
            .map_err(err)?;
        reaped.push(id);
    }
    tx.commit().await.map_err(err)?;
    Ok(reaped)
}
