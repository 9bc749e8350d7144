//! A session's lock on the shared store: a session-level advisory lock held on one pooled
//! connection for a whole operation, which loads and commits on it
//! (docs/scaling-out.md#how-a-turn-stays-serialized-across-hosts).
//!
//! The lock and the reads are one round trip, and so are the write and the unlock:
//! their statements are sent together on one client and their answers awaited together
//! (tokio-postgres pipelines the requests of futures polled at once). The server runs
//! them in order, each in its own implicit transaction, and runs the ones after a failed
//! one too: so a failed lock's wait is still reset, and a failed write is rolled back
//! alone and the lock still given back.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use tokio::runtime::Handle;

use super::bounded::{Pooled, Shared};
use super::sql::{check_written, session_of, trips, Params, ReadRows, Reads, WriteParams};
use super::{block, connection, err, load_on, written_id, PgStore};
use crate::store::{HostCopy, Locked, SessionLock, SessionWrite, StoreError, StoredSession};

/// Milliseconds as `set_config` takes them.
fn ms(d: Duration) -> String {
    d.as_millis().to_string()
}

/// The waits of a session's lock: the connection's `statement_timeout` is raised around
/// the lock, so it bounds the wait for the lock and not the lock wait the statement.
fn waits(lock_wait: Duration, statement_timeout: Duration) -> (String, String) {
    (
        ms(lock_wait + statement_timeout),
        ms(lock_wait.max(Duration::from_millis(1))),
    )
}

/// What the lock's round trip answered: the lock taken (or its error), the session's
/// version, and its reads.
type LockAnswer = Result<(Option<u64>, ReadRows), tokio_postgres::Error>;

/// Session `id`'s lock, its version and its reads, pipelined: one round trip.
async fn lock_and_read(c: &Pooled, id: &str, reads: &Reads, waits: &(String, String)) -> LockAnswer {
    let s = &c.statements;
    let (timeouts, session): (Params<2>, Params<1>) = ([&waits.0, &waits.1], [&id]);
    let reset: Params<2> = [&s.reset_values[0], &s.reset_values[1]];
    trips(1);
    let (set, lock, reset, version, read) = tokio::join!(
        c.client.query(&s.set_timeouts, &timeouts),
        c.client.query(&s.lock, &session),
        c.client.query(&s.set_timeouts, &reset),
        c.client.query(&s.version, &session),
        reads.run(&c.client, s),
    );
    set?;
    lock?;
    reset?;
    let version = version?
        .first()
        .map(|r| r.try_get::<_, i64>(0).map(|v| v as u64))
        .transpose()?;
    Ok((version, read?))
}

impl PgStore {
    /// The lock, the session's version and — when it is not the version this host knows —
    /// the session itself, in one round trip: the statements after the lock's each see
    /// what was committed before it was taken (each takes its own snapshot). A connection
    /// found closed (the database restarted since it was pooled) is dropped and the lock
    /// asked once more on a fresh one.
    pub(super) fn lock_session(&self, id: &str, held: Option<&HostCopy>) -> Result<Locked, StoreError> {
        let shared = self.shared.clone();
        let pool = self.pool.clone();
        let (id, reads, lock_wait) = (id.to_string(), Reads::new(id, held), self.lock_wait);
        let held = held.cloned();
        let runtime = self.runtime.clone();
        block(&self.runtime, async move {
            let waits = waits(lock_wait, shared.limits.statement_timeout);
            let limit = lock_wait + shared.limits.statement_timeout;
            for attempt in 0..2 {
                let c = connection(&shared, &pool).await?;
                let answered = shared.within(limit, lock_and_read(&c, &id, &reads, &waits)).await;
                let (c, answer) = match answered {
                    Ok(Err(e)) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                        // Not taken; the rest ran and reset the waits: the connection serves on.
                        let _ = shared.settle(c, Ok(Ok(())), |_| true);
                        return Ok(Locked::Busy);
                    }
                    Ok(Err(e)) if e.is_closed() && attempt == 0 => continue,
                    // Any other failure: the lock may be held, so the connection goes.
                    answered => shared.settle(c, answered.map(|a| a.map_err(err)), |_| false),
                };
                let (version, rows) = answer?;
                let read = session_of(&id, &rows, held.as_ref())?;
                return Ok(Locked::Held(Box::new(PgLock {
                    connection: c,
                    shared: shared.clone(),
                    runtime: runtime.clone(),
                    id: id.clone(),
                    version,
                    read,
                    released: false,
                    lock_wait,
                })));
            }
            Err(StoreError::unavailable(
                "the database closed two connections in a row",
            ))
        })?
    }
}

/// A session's lock: a session-level advisory lock held on one pooled connection.
pub(super) struct PgLock {
    /// `None` once lost: the database did not answer in time (the connection was
    /// dropped, and the server releases the lock when it closes).
    connection: Option<Pooled>,
    shared: Arc<Shared>,
    runtime: Handle,
    id: String,
    version: Option<u64>,
    /// The session as read with the lock, when its version was not the one the host knew.
    read: Option<StoredSession>,
    /// Whether the lock was given back already (a commit gives it back in its round trip).
    released: bool,
    lock_wait: Duration,
}

impl PgLock {
    fn connection(&mut self) -> Result<Pooled, StoreError> {
        let mut c = self
            .connection
            .take()
            .ok_or_else(|| StoreError::unavailable("the session's connection to the database was lost"))?;
        c.busy = true;
        Ok(c)
    }
}

/// The write and the unlock (after a taken lock: `relock`, the lock again first, all in
/// one transaction so a refused lock aborts the write), pipelined: one round trip. The
/// write's rows, or the first error.
async fn commit_on(
    c: &Pooled,
    id: &str,
    change: &WriteParams,
    relock: Option<&(String, String)>,
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let s = &c.statements;
    let session: Params<1> = [&id];
    trips(1);
    let Some(waits) = relock else {
        let (written, unlock) = tokio::join!(change.run(&c.client, s), c.client.query(&s.unlock, &session));
        return written.and_then(|rows| unlock.map(|_| rows));
    };
    let timeouts: Params<2> = [&waits.0, &waits.1];
    let reset: Params<2> = [&s.reset_values[0], &s.reset_values[1]];
    let (begin, set, lock, reset, written, commit, unlock) = tokio::join!(
        c.client.batch_execute("BEGIN"),
        c.client.query(&s.set_timeouts, &timeouts),
        c.client.query(&s.lock, &session),
        c.client.query(&s.set_timeouts, &reset),
        change.run(&c.client, s),
        c.client.batch_execute("COMMIT"),
        c.client.query(&s.unlock, &session),
    );
    begin?;
    set?;
    lock?;
    reset?;
    let rows = written?;
    commit?;
    unlock?;
    Ok(rows)
}

impl SessionLock for PgLock {
    fn version(&self) -> Option<u64> {
        self.version
    }

    fn load(&mut self) -> Result<Option<StoredSession>, StoreError> {
        if let Some(read) = self.read.take() {
            return Ok(Some(read));
        }
        let c = self.connection()?;
        let (shared, id) = (self.shared.clone(), self.id.clone());
        let (c, result) = block(&self.runtime, async move {
            let limit = shared.limits.statement_timeout;
            let answered = shared.within(limit, load_on(&c, &id)).await;
            shared.settle(c, answered, |_| true)
        })
        .unwrap_or_else(|e| (None, Err(e)));
        self.connection = c;
        result
    }

    /// The write, its commit and the lock's release in one round trip: the lock is given
    /// back after the write commits, so the next host to take it reads this write. A
    /// second commit under the same lock takes it again first.
    fn commit(&mut self, change: &SessionWrite<'_>) -> Result<(), StoreError> {
        if change.row.is_some_and(|r| r.id != self.id) {
            return Err(StoreError::new("a session lock commits its own session only"));
        }
        let statement_timeout = self.shared.limits.statement_timeout;
        let relock = self.released.then(|| waits(self.lock_wait, statement_timeout));
        let limit = match relock {
            Some(_) => self.lock_wait + statement_timeout,
            None => statement_timeout,
        };
        let params = WriteParams::new(change)?;
        let c = self.connection()?;
        // Given back by the commit, or released by the server with a lost connection.
        self.released = true;
        let (shared, id) = (self.shared.clone(), self.id.clone());
        let (c, result) = block(&self.runtime, async move {
            let answered = shared
                .within(limit, commit_on(&c, &id, &params, relock.as_ref()))
                .await
                .map(|a| a.map_err(err));
            // A refused write rolled back alone and the lock was given back: the
            // connection serves on.
            shared.settle(c, answered, |_| true)
        })
        .unwrap_or_else(|e| (None, Err(e)));
        self.connection = c;
        check_written(&result?, &written_id(change))
    }
}

impl Drop for PgLock {
    fn drop(&mut self) {
        let Some(c) = self.connection.take().filter(|_| !self.released) else {
            return;
        };
        let (shared, id) = (self.shared.clone(), self.id.clone());
        let mut c = c;
        c.busy = true;
        // On a lost connection the server has released the lock already.
        let _ = block(&self.runtime, async move {
            let limit = shared.limits.statement_timeout;
            let unlocked = shared
                .within(limit, async {
                    c.client.query(&c.statements.unlock, &[&id]).await
                })
                .await
                .map(|a| a.map(drop).map_err(err));
            drop(shared.settle(c, unlocked, |_| false));
        });
    }
}
