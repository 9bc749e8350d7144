//! A session's lock on the shared store: a session-level advisory lock held on one pooled
//! connection for a whole operation, which loads and commits on it
//! (docs/scaling-out.md#how-a-turn-stays-serialized-across-hosts).

use std::sync::Arc;
use std::time::Duration;

use super::bounded::Shared;
use super::sql::{batch, lit, write_statement};
use super::{check_written, err, load_on, written_id, Connection};
use crate::store::{SessionLock, SessionWrite, StoreError, StoredSession};

/// The statements that wait for session `id`'s lock at most `lock_wait`: the connection's
/// `statement_timeout` is raised around them, so it bounds the wait for the lock and not
/// the lock wait the statement. Five statements (SET, SET, the lock, RESET, RESET).
pub(super) fn lock_statements(id: &str, lock_wait: Duration, statement_timeout: Duration) -> String {
    format!(
        "SET statement_timeout = {}; SET lock_timeout = {}; EXECUTE history_lock({}); \
         RESET lock_timeout; RESET statement_timeout",
        (lock_wait + statement_timeout).as_millis(),
        lock_wait.as_millis().max(1),
        lit(id)
    )
}
pub(super) const LOCK_STATEMENTS: usize = 5;

/// A session's lock: a session-level advisory lock held on one pooled connection.
pub(super) struct PgLock {
    /// `None` once lost: the database did not answer in time (it was poisoned, and the
    /// server releases the lock when the connection closes).
    pub(super) connection: Option<Connection>,
    pub(super) shared: Arc<Shared>,
    pub(super) id: String,
    pub(super) version: Option<u64>,
    /// The session as read with the lock, when its version was not the one the host knew.
    pub(super) read: Option<StoredSession>,
    /// Whether the lock was given back already (a commit gives it back in its round trip).
    pub(super) released: bool,
    pub(super) lock_wait: Duration,
}

impl PgLock {
    fn connection(&mut self) -> Result<Connection, StoreError> {
        self.connection
            .take()
            .ok_or_else(|| StoreError::unavailable("the session's connection to the database was lost"))
    }
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
        let id = self.id.clone();
        let limit = self.shared.limits.statement_timeout;
        let (c, result) = self.shared.on(c, limit, move |client| load_on(client, &id))?;
        self.connection = Some(c);
        result
    }

    /// The write, its commit and the lock's release in one round trip: the lock is given
    /// back after the commit (a later COMMIT statement in the same message), so the next
    /// host to take it reads this write. A second commit under the same lock takes it again
    /// first.
    fn commit(&mut self, write: &SessionWrite<'_>) -> Result<(), StoreError> {
        if write.row.is_some_and(|r| r.id != self.id) {
            return Err(StoreError::new("a session lock commits its own session only"));
        }
        let statement_timeout = self.shared.limits.statement_timeout;
        let id = lit(&self.id);
        let (relock, limit) = if self.released {
            (
                format!(
                    "{}; ",
                    lock_statements(&self.id, self.lock_wait, statement_timeout)
                ),
                self.lock_wait + statement_timeout,
            )
        } else {
            (String::new(), statement_timeout)
        };
        // The write's answer is the one after BEGIN's.
        let at = if relock.is_empty() { 1 } else { LOCK_STATEMENTS + 1 };
        let sql = format!(
            "{relock}BEGIN; {}; COMMIT; EXECUTE history_unlock({id})",
            write_statement(write)?
        );
        let c = self.connection()?;
        // Given back by the commit, or released by the server with a lost connection.
        self.released = true;
        let (c, result) = self.shared.on(c, limit, move |client| Ok(batch(client, &sql)))?;
        match result? {
            Ok(answers) => {
                self.connection = Some(c);
                check_written(&answers, at, &written_id(write))
            }
            Err(e) => {
                let e = err(e);
                self.shared.failed(&e);
                if e.unavailable {
                    c.poison();
                    return Err(e);
                }
                // The transaction is aborted: roll back and give the lock back.
                let rollback = format!("ROLLBACK; EXECUTE history_unlock({id})");
                if let Ok((c, _)) = self
                    .shared
                    .on(c, statement_timeout, move |client| Ok(batch(client, &rollback)))
                {
                    self.connection = Some(c);
                }
                Err(e)
            }
        }
    }
}

impl Drop for PgLock {
    fn drop(&mut self) {
        let Some(c) = self.connection.take().filter(|_| !self.released) else {
            return;
        };
        // On a lost connection the server has released the lock already.
        let unlock = format!("EXECUTE history_unlock({})", lit(&self.id));
        let _ = self
            .shared
            .on(c, self.shared.limits.statement_timeout, move |client| {
                batch(client, &unlock).map_err(err)
            });
    }
}
