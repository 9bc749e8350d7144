//! The store as the service uses it: every transaction timed for the metrics, and, during
//! an operation on a shared store, the session's writes through its lock.

use std::sync::Mutex;
use std::time::Instant;

use crate::metrics::Metrics;
use crate::store::{
    HostCopy, Locked, SessionLock, SessionRow, SessionWrite, Store, StoreError, StoredSession, TranscriptRow,
};

/// A store that times its transactions.
pub(super) struct TimedStore {
    pub(super) inner: Box<dyn Store>,
    pub(super) metrics: std::sync::Arc<Metrics>,
}

impl TimedStore {
    fn timed<T>(&self, f: impl FnOnce(&dyn Store) -> T) -> T {
        let started = Instant::now();
        let result = f(&*self.inner);
        self.metrics.store(started.elapsed().as_secs_f64());
        result
    }
}

/// The store as an operation on a session of a shared store sees it: its writes go
/// through the session's lock (its connection), everything else to the store.
pub(super) struct LockedStore<'a> {
    pub(super) store: &'a dyn Store,
    pub(super) lock: Mutex<Box<dyn SessionLock>>,
    pub(super) metrics: &'a Metrics,
}

impl Store for LockedStore<'_> {
    fn create(&self, row: &SessionRow) -> Result<(), StoreError> {
        self.store.create(row)
    }
    fn commit(&self, write: &SessionWrite<'_>) -> Result<(), StoreError> {
        let started = Instant::now();
        let result = self.lock.lock().unwrap_or_else(|e| e.into_inner()).commit(write);
        self.metrics.store(started.elapsed().as_secs_f64());
        result
    }
    fn set_effective_ctx(&self, sessions: &[(String, u64)]) -> Result<(), StoreError> {
        self.store.set_effective_ctx(sessions)
    }
    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        self.store.delete(id)
    }
    fn sessions(&self) -> Result<Vec<(SessionRow, usize)>, StoreError> {
        self.store.sessions()
    }
    fn load(&self, id: &str) -> Result<Option<StoredSession>, StoreError> {
        self.store.load(id)
    }
    fn transcript(&self, id: &str, from: u64, limit: u64) -> Result<Vec<TranscriptRow>, StoreError> {
        self.store.transcript(id, from, limit)
    }
    fn check_writable(&self) -> Result<(), StoreError> {
        self.store.check_writable()
    }
    fn summary(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.store.summary(key)
    }
    fn put_summary(&self, key: &str, summary: &str) -> Result<(), StoreError> {
        self.store.put_summary(key, summary)
    }
}

impl Store for TimedStore {
    fn create(&self, row: &SessionRow) -> Result<(), StoreError> {
        self.timed(|s| s.create(row))
    }
    fn commit(&self, write: &SessionWrite<'_>) -> Result<(), StoreError> {
        self.timed(|s| s.commit(write))
    }
    fn set_effective_ctx(&self, sessions: &[(String, u64)]) -> Result<(), StoreError> {
        self.timed(|s| s.set_effective_ctx(sessions))
    }
    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        self.timed(|s| s.delete(id))
    }
    fn sessions(&self) -> Result<Vec<(SessionRow, usize)>, StoreError> {
        self.inner.sessions()
    }
    fn load(&self, id: &str) -> Result<Option<StoredSession>, StoreError> {
        self.inner.load(id)
    }
    fn transcript(&self, id: &str, from: u64, limit: u64) -> Result<Vec<TranscriptRow>, StoreError> {
        self.inner.transcript(id, from, limit)
    }
    fn check_writable(&self) -> Result<(), StoreError> {
        self.inner.check_writable()
    }
    fn summary(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.timed(|s| s.summary(key))
    }
    fn put_summary(&self, key: &str, summary: &str) -> Result<(), StoreError> {
        self.timed(|s| s.put_summary(key, summary))
    }
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    fn lock(&self, id: &str, held: Option<&HostCopy>) -> Result<Locked, StoreError> {
        self.inner.lock(id, held)
    }
    fn create_limited(&self, row: &SessionRow, max_users: u64) -> Result<Result<(), u64>, StoreError> {
        self.timed(|s| s.create_limited(row, max_users))
    }
    fn reap(&self, cutoff_ms: u64) -> Result<Vec<String>, StoreError> {
        self.timed(|s| s.reap(cutoff_ms))
    }
    fn row(&self, id: &str) -> Result<Option<(SessionRow, usize)>, StoreError> {
        self.inner.row(id)
    }
}
