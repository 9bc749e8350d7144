//! The store as the service uses it: every transaction timed for the metrics and seen by
//! the outage's watch (`outage`), and, during an operation on a shared store, the
//! session's writes through its lock.

use std::sync::Mutex;
use std::time::Instant;

use super::outage::Outage;
use crate::metrics::Metrics;
use crate::store::{
    HostCopy, Locked, SessionLock, SessionRow, SessionWrite, Store, StoreError, StoredSession, TranscriptRow,
};

/// A store that times its transactions, and tells the outage's watch how each went.
pub(super) struct TimedStore {
    pub(super) inner: Box<dyn Store>,
    pub(super) metrics: std::sync::Arc<Metrics>,
    pub(super) outage: std::sync::Arc<Outage>,
}

impl TimedStore {
    /// A write, timed.
    fn timed<T>(&self, f: impl FnOnce(&dyn Store) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = self.seen(true, f);
        self.metrics.store(started.elapsed().as_secs_f64());
        result
    }

    /// `wrote`: whether the operation writes or takes a lock, so its success ends an outage.
    fn seen<T>(
        &self,
        wrote: bool,
        f: impl FnOnce(&dyn Store) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = f(&*self.inner);
        self.outage.saw(&result, wrote, started);
        result
    }
}

/// The store as an operation on a session of a shared store sees it: its writes go
/// through the session's lock (its connection), everything else to the store.
pub(super) struct LockedStore<'a> {
    pub(super) store: &'a dyn Store,
    pub(super) lock: Mutex<Box<dyn SessionLock>>,
    pub(super) metrics: &'a Metrics,
    pub(super) outage: &'a Outage,
}

impl Store for LockedStore<'_> {
    fn create(&self, row: &SessionRow) -> Result<(), StoreError> {
        self.store.create(row)
    }
    fn commit(&self, write: &SessionWrite<'_>) -> Result<(), StoreError> {
        let started = Instant::now();
        let result = self.lock.lock().unwrap_or_else(|e| e.into_inner()).commit(write);
        self.metrics.store(started.elapsed().as_secs_f64());
        self.outage.saw(&result, true, started);
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
        self.seen(false, |s| s.sessions())
    }
    fn load(&self, id: &str) -> Result<Option<StoredSession>, StoreError> {
        self.seen(false, |s| s.load(id))
    }
    fn transcript(&self, id: &str, from: u64, limit: u64) -> Result<Vec<TranscriptRow>, StoreError> {
        self.seen(false, |s| s.transcript(id, from, limit))
    }
    fn check_writable(&self) -> Result<(), StoreError> {
        self.seen(true, |s| s.check_writable())
    }
    fn summary(&self, key: &str) -> Result<Option<String>, StoreError> {
        let started = Instant::now();
        let result = self.seen(false, |s| s.summary(key));
        self.metrics.store(started.elapsed().as_secs_f64());
        result
    }
    fn put_summary(&self, key: &str, summary: &str) -> Result<(), StoreError> {
        self.timed(|s| s.put_summary(key, summary))
    }
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    fn lock(&self, id: &str, held: Option<&HostCopy>) -> Result<Locked, StoreError> {
        // On a store that is not shared, taking a lock touches no store.
        self.seen(self.inner.shared(), |s| s.lock(id, held))
    }
    fn create_limited(&self, row: &SessionRow, max_users: u64) -> Result<Result<(), u64>, StoreError> {
        self.timed(|s| s.create_limited(row, max_users))
    }
    fn reap(&self, cutoff_ms: u64) -> Result<Vec<String>, StoreError> {
        self.timed(|s| s.reap(cutoff_ms))
    }
    fn row(&self, id: &str) -> Result<Option<(SessionRow, usize)>, StoreError> {
        self.seen(false, |s| s.row(id))
    }
}
